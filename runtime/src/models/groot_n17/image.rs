//! GR00T N1.7's images (lerobot `_transform_n1_7_image_for_vlm_torch`, spec 2a): optionally
//! letterboxed to a square, resized to `E × E` (aspect ratio not kept), centre-cropped by the crop
//! fraction (230/256) and resized to the target (256²), each resize bicubic with antialiasing as
//! PyTorch computes it for uint8 on the CPU (fixed-point weights, Pillow-SIMD style: the same
//! levels exactly); then the Qwen2-VL image processor's normalization `(x - 127.5) / 127.5` and
//! patch order.
//!
//! These are the host-side reference the plan's image op is checked against.

/// An RGB image, channel-major (`[3, height, width]`), as torchvision holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Chw {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// The transform's parameters (processor_config.json).
#[derive(Clone, Copy, Debug)]
pub struct Transform {
    pub target: (usize, usize),
    /// The first resize's edge (`shortest_image_edge`, default the target height).
    pub edge: usize,
    /// `crop_fraction`, or the crop size over the target height (230/256).
    pub crop_fraction: f64,
    pub letterbox: bool,
}

impl Chw {
    /// From packed HWC RGB rows.
    pub fn from_hwc(rgb: &[u8], width: usize, height: usize) -> Chw {
        let mut data = vec![0u8; 3 * width * height];
        for (i, px) in rgb.chunks_exact(3).enumerate() {
            for c in 0..3 {
                data[c * width * height + i] = px[c];
            }
        }
        Chw { width, height, data }
    }
}

/// Keys' bicubic kernel with a = -0.5 (Pillow's and PyTorch's antialiasing filter).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// One axis of PyTorch's uint8 antialiased resize (`_compute_indices_int16_weights_aa`): per
/// output index, the first input index and its window's weights, normalized in f64 and then
/// scaled to integers by `2^precision`, the largest precision that keeps the largest weight in
/// an i16.
struct Weights {
    windows: Vec<(usize, Vec<i32>)>,
    precision: u32,
}

impl Weights {
    fn new(input: usize, output: usize) -> Weights {
        let scale = input as f64 / output as f64;
        let support = if scale >= 1.0 { 2.0 * scale } else { 2.0 };
        let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
        let windows: Vec<(usize, Vec<f64>)> = (0..output)
            .map(|i| {
                let center = scale * (i as f64 + 0.5);
                let xmin = ((center - support + 0.5) as i64).max(0) as usize;
                let xmax = ((center + support + 0.5) as i64).min(input as i64) as usize;
                let mut w: Vec<f64> = (xmin..xmax).map(|j| bicubic((j as f64 - center + 0.5) * invscale)).collect();
                let total: f64 = w.iter().sum();
                if total != 0.0 {
                    w.iter_mut().for_each(|v| *v /= total);
                }
                (xmin, w)
            })
            .collect();
        let largest = windows.iter().flat_map(|(_, w)| w.iter().copied()).fold(f64::MIN, f64::max);
        let precision = (0..22).find(|p| (0.5 + largest * (1u32 << (p + 1)) as f64) as i64 >= 1 << 15).unwrap_or(22);
        let to_int = |v: f64| {
            let v = v * (1u32 << precision) as f64;
            (if v < 0.0 { -0.5 + v } else { 0.5 + v }) as i32
        };
        Weights { windows: windows.into_iter().map(|(start, w)| (start, w.into_iter().map(to_int).collect())).collect(), precision }
    }
}

/// One pass over the three planes: `along_rows` resamples each row (width), else each column.
fn pass(img: &Chw, out_len: usize, along_rows: bool) -> Chw {
    let (w, h) = (img.width, img.height);
    let (ow, oh) = if along_rows { (out_len, h) } else { (w, out_len) };
    let table = Weights::new(if along_rows { w } else { h }, out_len);
    let round = 1i32 << (table.precision - 1);
    let mut data = vec![0u8; 3 * ow * oh];
    for c in 0..3 {
        let plane = &img.data[c * w * h..][..w * h];
        for y in 0..oh {
            for x in 0..ow {
                let (start, wts) = &table.windows[if along_rows { x } else { y }];
                let at = |j: usize| if along_rows { plane[y * w + start + j] } else { plane[(start + j) * w + x] } as i32;
                let sum: i32 = round + wts.iter().enumerate().map(|(j, &wt)| at(j) * wt).sum::<i32>();
                data[c * ow * oh + y * ow + x] = (sum >> table.precision).clamp(0, 255) as u8;
            }
        }
    }
    Chw { width: ow, height: oh, data }
}

/// `tvF.resize(img, [height, width], BICUBIC, antialias=True)` of a uint8 image on the CPU: the
/// width pass, then the height pass, each rounded to uint8 (a side that does not change is
/// not resampled).
pub fn resize_bicubic(img: &Chw, width: usize, height: usize) -> Chw {
    let img = if width != img.width { pass(img, width, true) } else { img.clone() };
    if height != img.height { pass(&img, height, false) } else { img }
}

impl Transform {
    /// lerobot's transform of one frame.
    pub fn apply(&self, img: &Chw) -> Chw {
        let mut img = if self.letterbox { letterbox(img) } else { img.clone() };
        if (img.width, img.height) != (self.edge, self.edge) {
            img = resize_bicubic(&img, self.edge, self.edge);
        }
        if 0.0 < self.crop_fraction && self.crop_fraction < 1.0 {
            // Python's round (half to even) of the crop size, floor of the offset.
            let crop = |side: usize| ((side as f64 * self.crop_fraction).round_ties_even() as usize).max(1);
            let (ch, cw) = (crop(img.height), crop(img.width));
            let (top, left) = ((img.height - ch) / 2, (img.width - cw) / 2);
            let mut data = Vec::with_capacity(3 * ch * cw);
            for c in 0..3 {
                for y in top..top + ch {
                    data.extend_from_slice(&img.data[c * img.width * img.height + y * img.width + left..][..cw]);
                }
            }
            img = Chw { width: cw, height: ch, data };
        }
        let (tw, th) = (self.target.1, self.target.0);
        if (img.width, img.height) != (tw, th) { resize_bicubic(&img, tw, th) } else { img }
    }
}

/// Zero-padded to a square, the image centred (left/top padding floored).
fn letterbox(img: &Chw) -> Chw {
    let edge = img.width.max(img.height);
    let (left, top) = ((edge - img.width) / 2, (edge - img.height) / 2);
    let mut data = vec![0u8; 3 * edge * edge];
    for c in 0..3 {
        for y in 0..img.height {
            let src = &img.data[c * img.width * img.height + y * img.width..][..img.width];
            data[c * edge * edge + (top + y) * edge + left..][..img.width].copy_from_slice(src);
        }
    }
    Chw { width: edge, height: edge, data }
}

/// The Qwen2-VL image processor's `pixel_values` of one image whose sides are multiples of
/// `2 · patch` (temporal patch 2, merge 2): rows in (block row, block col, sub row, sub col)
/// order, each `[channel, temporal copy, y, x]`, normalized as `(x - 127.5) / 127.5`.
pub fn qwen_patches(img: &Chw, patch: usize) -> Vec<f32> {
    let (gh, gw) = (img.height / patch, img.width / patch);
    let cols = 3 * 2 * patch * patch;
    let mut out = Vec::with_capacity(gh * gw * cols);
    for br in 0..gh / 2 {
        for bc in 0..gw / 2 {
            for (sr, sc) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let (py, px) = ((2 * br + sr) * patch, (2 * bc + sc) * patch);
                for c in 0..3 {
                    for _temporal in 0..2 {
                        for y in 0..patch {
                            let row = &img.data[c * img.width * img.height + (py + y) * img.width + px..][..patch];
                            out.extend(row.iter().map(|&v| (v as f32 - 127.5) / 127.5));
                        }
                    }
                }
            }
        }
    }
    out
}
