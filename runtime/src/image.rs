//! Camera frames: pixel formats and the resize-with-pad + patchify step of SigLIP preprocessing.
//!
//! Bit-for-bit intent: lerobot feeds `u8 / 255` floats through `F.interpolate(mode="bilinear",
//! align_corners=False)` (no antialias), clamps to [0, 1], pads centred with 0 and maps to [-1, 1].
//! The arithmetic below follows PyTorch's CPU kernel (`upsample_bilinear2d`, f32 scale).

use std::ops::Range;

use crate::error::{Error, Result};

/// Pixel layout of a host frame (interleaved, 8 bits per channel). The numbers are stable: they
/// travel through the C ABI and the plan's frame-info buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PixelFormat {
    Rgb8 = 0,
    Bgr8 = 1,
    Rgba8 = 2,
}

impl PixelFormat {
    pub fn bytes_per_pixel(self) -> usize {
        match self {
            PixelFormat::Rgb8 | PixelFormat::Bgr8 => 3,
            PixelFormat::Rgba8 => 4,
        }
    }

    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(PixelFormat::Rgb8),
            1 => Some(PixelFormat::Bgr8),
            2 => Some(PixelFormat::Rgba8),
            _ => None,
        }
    }

    /// Byte offset of red, green and blue inside one pixel.
    fn rgb_offsets(self) -> [usize; 3] {
        match self {
            PixelFormat::Rgb8 | PixelFormat::Rgba8 => [0, 1, 2],
            PixelFormat::Bgr8 => [2, 1, 0],
        }
    }
}

/// One camera frame owned by the caller: `height` rows of `stride` bytes each.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    pub data: &'a [u8],
    pub width: usize,
    pub height: usize,
    /// Bytes from one row to the next (≥ width × bytes per pixel).
    pub stride: usize,
    pub format: PixelFormat,
}

impl<'a> Frame<'a> {
    /// A tightly packed frame (stride = width × bytes per pixel; a width too large for that
    /// product saturates, and `validate` refuses the frame).
    pub fn packed(data: &'a [u8], width: usize, height: usize, format: PixelFormat) -> Self {
        Frame { data, width, height, stride: width.saturating_mul(format.bytes_per_pixel()), format }
    }

    /// Checks the geometry against the data and the configured largest frame. `field` names the
    /// camera in errors (e.g. `observation.cameras[1]`).
    /// Every size is computed with checked arithmetic: geometry from a caller is refused, never
    /// overflowed.
    pub fn validate(&self, field: &str, max_width: usize, max_height: usize) -> Result<()> {
        if self.width == 0 || self.height == 0 {
            return Err(Error::invalid(field, format!("frame is {}x{}: empty", self.width, self.height)));
        }
        if self.width > max_width || self.height > max_height {
            return Err(Error::invalid(
                field,
                format!("frame {}x{} exceeds the configured maximum {max_width}x{max_height}", self.width, self.height),
            ));
        }
        let row = self.width.checked_mul(self.format.bytes_per_pixel());
        let Some(row) = row.filter(|&row| self.stride >= row) else {
            return Err(Error::invalid(
                field,
                format!("stride {} is below width {} x {} bytes per pixel", self.stride, self.width, self.format.bytes_per_pixel()),
            ));
        };
        let Some(needed) = (self.height - 1).checked_mul(self.stride).and_then(|n| n.checked_add(row)) else {
            return Err(Error::invalid(field, format!("stride {} x height {} overflows the address space", self.stride, self.height)));
        };
        if self.data.len() < needed {
            return Err(Error::invalid(
                field,
                format!(
                    "{} bytes given, {}x{} {:?} with stride {} needs {needed}",
                    self.data.len(),
                    self.width,
                    self.height,
                    self.format,
                    self.stride
                ),
            ));
        }
        Ok(())
    }
}

/// Resize-with-pad geometry: the resized size and the top/left padding (extra pixel bottom/right).
fn fit(width: usize, height: usize, size: usize) -> (usize, usize, usize, usize) {
    // Python: ratio = max(w / size, h / size); int(h / ratio) — in f64.
    let ratio = (width as f64 / size as f64).max(height as f64 / size as f64);
    let rh = ((height as f64 / ratio) as usize).clamp(1, size);
    let rw = ((width as f64 / ratio) as usize).clamp(1, size);
    (rw, rh, (size - rw) / 2, (size - rh) / 2)
}

/// PyTorch `area_pixel_compute_source_index` for bilinear, align_corners=False: the two source
/// indices and the weight of the second.
fn source_index(dst: usize, scale: f32, len: usize) -> (usize, usize, f32) {
    let src = (scale * (dst as f32 + 0.5) - 0.5).max(0.0);
    let i0 = (src as usize).min(len - 1);
    let i1 = if i0 < len - 1 { i0 + 1 } else { i0 };
    (i0, i1, src - i0 as f32)
}

/// Writes patch rows `patch_rows` of the `size`×`size` preprocessed image of a packed frame
/// (`width × bpp` bytes per row): `out[patch][c·p² + ky·p + kx]`, patches in row-major order from
/// the first patch of `patch_rows.start`, values in [-1, 1]. `frame == None` writes a black image
/// (-1 everywhere), as lerobot does for a missing camera. Patch rows are independent, so threads
/// can each write their own.
pub fn patchify(
    frame: Option<(&[u8], usize, usize, PixelFormat)>,
    size: usize,
    patch: usize,
    patch_rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    let (per_side, plane) = (size / patch, patch * patch);
    let frame = frame.map(|(data, width, height, format)| {
        let (rw, rh, left, top) = fit(width, height, size);
        Placed { data, width, height, format, columns: left..left + rw, rows: top..top + rh }
    });
    for y in patch_rows.start * patch..patch_rows.end * patch {
        // Output pixel (y, x) lands in patch (y / p, x / p) at offset (y % p)·p + x % p.
        let row = &mut out[(y / patch - patch_rows.start) * per_side * out_stride + y % patch * patch..];
        let source = frame.as_ref().filter(|f| f.rows.contains(&y)).map(|f| f.source_rows(y));
        // x's patch and offset are counted along the row, not divided out per pixel.
        let (mut at, mut kx) = (0, 0);
        for x in 0..size {
            let rgb = source.as_ref().map_or([-1.0; 3], |s| s.value(x));
            for (c, v) in rgb.into_iter().enumerate() {
                row[at + c * plane] = v;
            }
            (at, kx) = if kx + 1 == patch { (at + out_stride - kx, 0) } else { (at + 1, kx + 1) };
        }
    }
}

/// A frame and where its resized copy lies in the padded square.
struct Placed<'a> {
    data: &'a [u8],
    width: usize,
    height: usize,
    format: PixelFormat,
    columns: Range<usize>,
    rows: Range<usize>,
}

impl<'a> Placed<'a> {
    /// The two source rows that output row `y` (inside `rows`) interpolates between.
    fn source_rows(&'a self, y: usize) -> SourceRows<'a> {
        let (y0, y1, ly) = source_index(y - self.rows.start, self.height as f32 / self.rows.len() as f32, self.height);
        let line = self.width * self.format.bytes_per_pixel();
        SourceRows { frame: self, row0: &self.data[y0 * line..][..line], row1: &self.data[y1 * line..][..line], ly }
    }
}

struct SourceRows<'a> {
    frame: &'a Placed<'a>,
    row0: &'a [u8],
    row1: &'a [u8],
    ly: f32,
}

impl SourceRows<'_> {
    /// Output pixel `x` of this row in [-1, 1] (padding is -1).
    fn value(&self, x: usize) -> [f32; 3] {
        let f = self.frame;
        if !f.columns.contains(&x) {
            return [-1.0; 3];
        }
        let (x0, x1, lx) = source_index(x - f.columns.start, f.width as f32 / f.columns.len() as f32, f.width);
        let (bpp, ly) = (f.format.bytes_per_pixel(), self.ly);
        let (p00, p01) = (&self.row0[x0 * bpp..][..bpp], &self.row0[x1 * bpp..][..bpp]);
        let (p10, p11) = (&self.row1[x0 * bpp..][..bpp], &self.row1[x1 * bpp..][..bpp]);
        // A loop rather than `array::map`, whose closure was not inlined here.
        let mut rgb = [0.0; 3];
        for (v, o) in rgb.iter_mut().zip(f.format.rgb_offsets()) {
            let [a, b, c, d] = [p00[o], p01[o], p10[o], p11[o]].map(|p| p as f32 / 255.0);
            let mixed = (1.0 - ly) * ((1.0 - lx) * a + lx * b) + ly * ((1.0 - lx) * c + lx * d);
            *v = mixed.clamp(0.0, 1.0) * 2.0 - 1.0;
        }
        rgb
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_matches_python_rounding() {
        assert_eq!(fit(224, 224, 224), (224, 224, 0, 0));
        // 240x180: ratio 240/224, h = int(180 / 1.0714…) = 168, padding 28 top, 28 bottom.
        assert_eq!(fit(240, 180, 224), (224, 168, 0, 28));
        assert_eq!(fit(640, 480, 224), (224, 168, 0, 28));
        assert_eq!(fit(100, 300, 224), (74, 224, 75, 0));
    }

    #[test]
    fn identity_size_is_exact_and_formats_agree() {
        let (w, h) = (28, 28);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
        let bgr: Vec<u8> = rgb.chunks(3).flat_map(|p| [p[2], p[1], p[0]]).collect();
        let rgba: Vec<u8> = rgb.chunks(3).flat_map(|p| [p[0], p[1], p[2], 9]).collect();
        let run = |d: &[u8], f| {
            let mut out = vec![f32::NAN; 4 * 588];
            patchify(Some((d, w, h, f)), 28, 14, 0..2, &mut out, 588);
            out
        };
        let a = run(&rgb, PixelFormat::Rgb8);
        assert_eq!(a, run(&bgr, PixelFormat::Bgr8));
        assert_eq!(a, run(&rgba, PixelFormat::Rgba8));
        // pixel (y=15, x=2), green → patch (1, 0), channel 1, ky 1, kx 2.
        let expected = rgb[(15 * w + 2) * 3 + 1] as f32 / 255.0 * 2.0 - 1.0;
        assert_eq!(a[2 * 588 + 196 + 14 + 2], expected);
    }

    #[test]
    fn patch_rows_written_apart_equal_the_whole_image() {
        // A resized, padded frame (40x30 into 28: 28x21, rows 3..24) in 7-pixel patches.
        let (w, h, size, patch) = (40, 30, 28, 7);
        let data: Vec<u8> = (0..w * h * 3).map(|i| (i * 13 % 253) as u8).collect();
        let frame = Some((data.as_slice(), w, h, PixelFormat::Rgb8));
        let stride = 3 * patch * patch + 1;
        let mut whole = vec![f32::NAN; 16 * stride];
        patchify(frame, size, patch, 0..4, &mut whole, stride);
        let mut apart = vec![f32::NAN; 16 * stride];
        for rows in [0..1, 1..3, 3..4] {
            patchify(frame, size, patch, rows.clone(), &mut apart[rows.start * 4 * stride..], stride);
        }
        assert_eq!(whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), apart.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        // Padding rows are black; the column past each patch is never written.
        assert!(whole[..3 * patch * patch].iter().step_by(patch).take(3).all(|&v| v == -1.0));
        assert!(whole.chunks(stride).all(|p| p[stride - 1].is_nan()));
    }

    #[test]
    fn missing_frame_is_black() {
        let mut out = vec![0.0; 256 * 588];
        patchify(None, 224, 14, 0..16, &mut out, 588);
        assert!(out.iter().all(|&v| v == -1.0));
    }

    #[test]
    fn validate_names_the_problem() {
        let data = vec![0u8; 10];
        let f = Frame::packed(&data, 4, 4, PixelFormat::Rgb8);
        let e = f.validate("cameras[0]", 64, 64).unwrap_err().to_string();
        assert!(e.contains("cameras[0]") && e.contains("needs 48"), "{e}");
        let e = Frame::packed(&data, 100, 1, PixelFormat::Rgb8).validate("cameras[1]", 64, 64).unwrap_err().to_string();
        assert!(e.contains("exceeds"), "{e}");
    }
}
