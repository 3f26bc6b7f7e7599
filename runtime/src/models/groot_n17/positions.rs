//! M-RoPE position ids of a prompt (Qwen3-VL `get_rope_index`): each token gets a temporal, a
//! height and a width position. Text tokens take the running position on all three axes; an
//! image's tokens (its merged grid, row-major) take `p` temporally and `p + row`, `p + col`
//! spatially, and the text after it resumes at `p + max(rows, cols)`.

use crate::error::{Error, Result};

/// The (t, h, w) positions of `ids`, whose runs of `image_pad` are the images of `grids` (merged
/// rows, cols) in order.
pub fn mrope_positions(ids: &[i32], image_pad: i32, grids: &[(usize, usize)]) -> Result<[Vec<i32>; 3]> {
    let mut rows: [Vec<i32>; 3] = std::array::from_fn(|_| Vec::with_capacity(ids.len()));
    let (mut p, mut i, mut images) = (0usize, 0usize, grids.iter());
    while i < ids.len() {
        if ids[i] != image_pad {
            rows.iter_mut().for_each(|r| r.push(p as i32));
            (p, i) = (p + 1, i + 1);
            continue;
        }
        let &(h, w) =
            images.next().ok_or_else(|| Error::invalid("prompt", format!("more images in the prompt than the {} given", grids.len())))?;
        let run = ids[i..].iter().take_while(|&&id| id == image_pad).count();
        if run != h * w {
            return Err(Error::invalid("prompt", format!("an image run of {run} tokens at {i}, its grid is {h}x{w}")));
        }
        for r in 0..h {
            for c in 0..w {
                rows[0].push(p as i32);
                rows[1].push((p + r) as i32);
                rows[2].push((p + c) as i32);
            }
        }
        (p, i) = (p + h.max(w), i + run);
    }
    if images.next().is_some() {
        return Err(Error::invalid("prompt", format!("fewer images in the prompt than the {} given", grids.len())));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_example_and_bad_runs() {
        // 4 text tokens, one 8x8 image, `<|vision_end|>` and text: the example of the spec (2c).
        let pad = 9;
        let ids: Vec<i32> = [1, 2, 3, 4].into_iter().chain(std::iter::repeat_n(pad, 64)).chain([5, 6]).collect();
        let [t, h, w] = mrope_positions(&ids, pad, &[(8, 8)]).unwrap();
        assert_eq!((&t[..4], &h[..4]), (&[0, 1, 2, 3][..], &[0, 1, 2, 3][..]));
        assert_eq!((t[4], h[4], w[4], h[4 + 63], w[4 + 63], w[4 + 7], h[4 + 8]), (4, 4, 4, 11, 11, 11, 5));
        assert_eq!((&t[68..], &h[68..], &w[68..]), (&[12, 13][..], &[12, 13][..], &[12, 13][..]));
        // A 2x4 grid resumes at p + 4.
        let ids: Vec<i32> = std::iter::repeat_n(pad, 8).chain([5]).collect();
        assert_eq!(mrope_positions(&ids, pad, &[(2, 4)]).unwrap()[0][8], 4);
        assert!(mrope_positions(&ids, pad, &[(2, 3)]).unwrap_err().to_string().contains("grid is 2x3"));
        assert!(mrope_positions(&ids, pad, &[]).unwrap_err().to_string().contains("more images"));
        assert!(mrope_positions(&ids, pad, &[(2, 4), (1, 1)]).unwrap_err().to_string().contains("fewer images"));
    }
}
