//! GR00T N1.7's image preprocessing for a CPU backend op on the hot path, bit for bit, computed
//! in a caller-owned scratch buffer: either lerobot's default transform (the host reference
//! `models::groot_n17::image`: optional letterbox, PyTorch's uint8 antialiased bicubic resize to
//! `edge²`, centre crop, resize to `target²`) or its albumentations path (OpenCV's `INTER_AREA`
//! shortest-edge resizes around a floored centre crop), then the Qwen2-VL patch order and
//! normalization.
//!
//! Allocation-free by construction: nothing here calls an allocating API (no Vec, Box, String or
//! format! outside panic messages); the weight tables and the intermediate planes are carved out
//! of `scratch`. The unit tests check the output against the reference but do not count
//! allocations: the crate's counting allocator is a global-allocator helper for integration tests.

use std::ops::Range;

use crate::image::PixelFormat;

/// Geometry of the transform (square target; all sizes in pixels).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QwenImage {
    /// Output side (256); a multiple of `2 * patch`.
    pub target: usize,
    /// Side of the first (square) resize (256).
    pub edge: usize,
    /// Centre crop of the `edge²` image (230/256); no crop unless `0 < crop_fraction < 1`.
    pub crop_fraction: f64,
    /// Zero-pad the frame to a square (centred, offsets floored) before the first resize.
    pub letterbox: bool,
    /// Qwen patch side (16).
    pub patch: usize,
    pub filter: Filter,
}

/// How frames are resampled: the two image paths of lerobot's N1.7 processor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    /// `_transform_n1_7_image_for_vlm_torch`: PyTorch's uint8 antialiased bicubic, square
    /// resizes, the crop side rounded.
    TorchBicubic,
    /// `_transform_n1_7_image_for_vlm_albumentations` (`use_albumentations`): OpenCV's
    /// `INTER_AREA`, the crop side floored. It resizes the shortest edge and keeps the aspect
    /// ratio, so only a square (or letterboxed) frame becomes the `target²` image the token grid
    /// is sized for, and `edge` must be the target.
    Cv2Area,
}

impl QwenImage {
    /// Scratch bytes `patches` needs for frames up to `max_width × max_height`.
    pub fn scratch_len(&self, max_width: usize, max_height: usize) -> usize {
        self.regions(max_width, max_height).iter().sum()
    }

    /// Rows of the output: `(target / patch)²`.
    pub fn patch_rows(&self) -> usize {
        (self.target / self.patch).pow(2)
    }

    /// Columns of the output: channel × temporal copy × patch².
    pub fn patch_cols(&self) -> usize {
        3 * 2 * self.patch * self.patch
    }

    /// Writes the `pixel_values` of one frame (`height` rows of `stride` bytes, pixels in
    /// `format`) into `out` (`patch_rows × patch_cols` f32, row-major, `out_stride` apart), using
    /// only `scratch` (at least `scratch_len` of the frame's size) as working memory.
    #[allow(clippy::too_many_arguments)] // the frame's fields, as the backend op holds them
    pub fn patches(
        &self,
        frame: &[u8],
        width: usize,
        height: usize,
        stride: usize,
        format: PixelFormat,
        scratch: &mut [u8],
        out: &mut [f32],
        out_stride: usize,
    ) {
        let (patch, target, edge) = (self.patch, self.target, self.edge);
        assert!(patch > 0 && target % (2 * patch) == 0 && edge > 0, "QwenImage: target {target} is not a multiple of 2 × patch {patch}");
        let bpp = format.bytes_per_pixel();
        assert!(width > 0 && height > 0 && stride >= width * bpp, "QwenImage: a {width}x{height} frame with stride {stride}");
        assert!(frame.len() >= (height - 1) * stride + width * bpp, "QwenImage: {} bytes hold no {width}x{height} frame", frame.len());
        let (rows, cols) = (self.patch_rows(), self.patch_cols());
        assert!(out_stride >= cols && out.len() >= (rows - 1) * out_stride + cols, "QwenImage: output too small");
        let [table_len, a_len, b_len] = self.regions(width, height);
        let need = table_len + a_len + b_len;
        assert!(scratch.len() >= need, "QwenImage: scratch has {} bytes, a {width}x{height} frame needs {need}", scratch.len());
        let (table, planes) = scratch.split_at_mut(table_len);
        let (a, b) = planes.split_at_mut(a_len);

        let (w0, h0) = self.letterboxed(width, height);
        let (left, top) = ((w0 - width) / 2, (h0 - height) / 2);
        let offsets = if format == PixelFormat::Bgr8 { [2, 1, 0] } else { [0, 1, 2] };
        let src = Layout { offsets, px: bpp, row: stride, width: w0, height: h0, xs: left..left + width, ys: top..top + height };
        let img = match self.filter {
            Filter::TorchBicubic => {
                // The reference skips a pass whose side does not change; here every pass runs,
                // since a pass to the same length is the identity (weights 0, 1, 0 at precision
                // 14, exactly).
                let img = resample(frame, src, edge, false, table, a);
                let img = resample(a, img, edge, true, table, b).centre_crop(self.crop_side());
                let img = resample(b, img, target, false, table, a);
                resample(a, img, target, true, table, b)
            }
            Filter::Cv2Area => {
                assert!(w0 == h0 && edge == target, "QwenImage: the area path makes a {w0}x{h0} frame no {target}² image");
                // As above, a resize to the same side runs too: it copies exactly.
                let img = cv2_area(frame, &src, edge, a).centre_crop(self.crop_side());
                cv2_area(a, &img, target, b)
            }
        };
        write_patches(b, &img, patch, out, out_stride);
    }

    /// The frame's size after the letterbox.
    fn letterboxed(&self, width: usize, height: usize) -> (usize, usize) {
        if self.letterbox { (width.max(height), width.max(height)) } else { (width, height) }
    }

    /// Side of the centre crop of the `edge²` image: Python's round (half to even) on the torch
    /// path, `int()` on the albumentations path.
    fn crop_side(&self) -> usize {
        let (f, side) = (self.crop_fraction, self.edge as f64 * self.crop_fraction);
        let side = match self.filter {
            Filter::TorchBicubic => side.round_ties_even(),
            Filter::Cv2Area => side.trunc(),
        };
        if 0.0 < f && f < 1.0 { (side as usize).max(1) } else { self.edge }
    }

    /// Scratch bytes of the weight table (one pass at a time), of the width passes' output planes
    /// and of the height passes' output planes, for a `width × height` frame. Each grows with the
    /// frame, so the largest frame's sizes bound all others.
    fn regions(&self, width: usize, height: usize) -> [usize; 3] {
        if self.filter == Filter::Cv2Area {
            return [0, 3 * self.edge * self.edge, 3 * self.target * self.target];
        }
        let (w0, h0) = self.letterboxed(width, height);
        let crop = self.crop_side();
        let passes = [(w0, self.edge), (h0, self.edge), (crop, self.target)];
        let table = passes.iter().map(|&(input, output)| output * Axis::new(input, output).taps() * 4).fold(0, usize::max);
        let across = 3 * (self.edge * h0).max(self.target * crop);
        let down = 3 * (self.edge * self.edge).max(self.target * self.target);
        [table, across, down]
    }
}

/// Where a three-channel u8 image lies in a byte slice: sample (c, x, y) of the stored rectangle
/// `xs × ys` at `offsets[c] + (x - xs.start) * px + (y - ys.start) * row`. The image is
/// `width × height`; outside the stored rectangle (the letterbox) it is zero.
#[derive(Clone, Debug)]
struct Layout {
    offsets: [usize; 3],
    px: usize,
    row: usize,
    width: usize,
    height: usize,
    xs: Range<usize>,
    ys: Range<usize>,
}

impl Layout {
    /// Channel-major planes, as the passes write them.
    fn planar(width: usize, height: usize) -> Layout {
        let plane = width * height;
        Layout { offsets: [0, plane, 2 * plane], px: 1, row: width, width, height, xs: 0..width, ys: 0..height }
    }

    /// The same samples with x and y swapped: a height pass is a width pass of the transpose.
    fn transposed(self) -> Layout {
        Layout { px: self.row, row: self.px, width: self.height, height: self.width, xs: self.ys, ys: self.xs, ..self }
    }

    /// The centred `side²` square of a fully stored image (offsets floored).
    fn centre_crop(self, side: usize) -> Layout {
        let (left, top) = ((self.width - side) / 2, (self.height - side) / 2);
        let offsets = self.offsets.map(|o| o + top * self.row + left * self.px);
        Layout { offsets, width: side, height: side, xs: 0..side, ys: 0..side, ..self }
    }
}

/// One pass of the resize: `img` (in `data`) resampled to `len` samples along x, or along y with
/// `along_y`, written as channel-major planes into `dst`; returns their layout. The sums are the
/// reference's: i32 with a rounding term, shifted by the precision, clamped to u8.
fn resample(data: &[u8], img: Layout, len: usize, along_y: bool, table: &mut [u8], dst: &mut [u8]) -> Layout {
    let img = if along_y { img.transposed() } else { img };
    let axis = Axis::new(img.width, len);
    let taps = axis.taps();
    let precision = axis.fill(len, taps, table);
    let round = 1i32 << (precision - 1);
    let lines = img.height;
    let plane = len * lines;
    // Output sample i of line y, transposed back for a height pass.
    let (step, line_step) = if along_y { (lines, 1) } else { (1, len) };
    let mut put = |i: usize, y: usize| {
        let at = i * step + y * line_step;
        if !img.ys.contains(&y) {
            // A letterbox line: the reference's sum is the rounding term alone, which shifts to 0.
            (0..3).for_each(|c| dst[c * plane + at] = 0);
            return;
        }
        // The table row is zero past the window, and the letterbox's zeros add nothing: only the
        // stored part of the row's `taps` samples is summed.
        let start = axis.window(i).start;
        let hi = (start + taps).clamp(img.xs.start, img.xs.end);
        let lo = start.clamp(img.xs.start, hi);
        let weights = &table[4 * (i * taps + lo - start)..4 * (i * taps + hi - start)];
        let first = (y - img.ys.start) * img.row + (lo - img.xs.start) * img.px;
        for c in 0..3 {
            let base = img.offsets[c] + first;
            let tap = |(k, w): (usize, &[u8])| i32::from_ne_bytes(w.try_into().unwrap()) * data[base + k * img.px] as i32;
            let sum = round + weights.chunks_exact(4).enumerate().map(tap).sum::<i32>();
            dst[c * plane + at] = (sum >> precision).clamp(0, 255) as u8;
        }
    };
    // Consecutive samples read neighbouring source bytes: along a row for a width pass, across
    // the rows for a height pass.
    if along_y {
        (0..len).for_each(|i| (0..lines).for_each(|y| put(i, y)));
        Layout::planar(lines, len)
    } else {
        (0..lines).for_each(|y| (0..len).for_each(|i| put(i, y)));
        Layout::planar(len, lines)
    }
}

impl Layout {
    /// Sample (c, x, y); zero in the letterbox.
    fn at(&self, data: &[u8], c: usize, x: usize, y: usize) -> u8 {
        if self.xs.contains(&x) && self.ys.contains(&y) {
            data[self.offsets[c] + (x - self.xs.start) * self.px + (y - self.ys.start) * self.row]
        } else {
            0
        }
    }
}

/// OpenCV's `cv2.resize(img, (side, side), interpolation=INTER_AREA)` of a u8 image, as its
/// x86-64 build computes it (resize.cpp), written as channel-major planes into `dst`:
/// - shrinking by an integer factor: the block mean, `(sum + 2) >> 2` for 2 (its SIMD kernel),
///   else `sum · (1/area)` in f32, rounded half to even;
/// - shrinking otherwise: each output the f32 sum over the rows it covers of the row's weight
///   times the f32 sum over the columns of the column's weight times the sample, accumulated in
///   OpenCV's order (the row's sum first), rounded half to even;
/// - growing: OpenCV's "area" variant of bilinear, with 11-bit fixed-point weights; the vertical
///   blend as its SIMD kernel rounds it, for rows that are a multiple of 16 bytes long, which a
///   square of a side that holds 2 × 16-pixel patches always is.
fn cv2_area(data: &[u8], img: &Layout, side: usize, dst: &mut [u8]) -> Layout {
    let (sw, sh) = (img.width, img.height);
    let (inv_x, inv_y) = (side as f64 / sw as f64, side as f64 / sh as f64);
    let (scale_x, scale_y) = (1.0 / inv_x, 1.0 / inv_y);
    let plane = side * side;
    let out = |dst: &mut [u8], c: usize, x: usize, y: usize, v: u8| dst[c * plane + y * side + x] = v;
    if scale_x >= 1.0 && scale_y >= 1.0 {
        let (ix, iy) = (scale_x.round() as usize, scale_y.round() as usize);
        let integer = (scale_x - ix as f64).abs() < f64::EPSILON && (scale_y - iy as f64).abs() < f64::EPSILON;
        let inv_area = 1.0f32 / (ix * iy) as f32;
        for c in 0..3 {
            for y in 0..side {
                for x in 0..side {
                    let v = if integer {
                        let block = (0..iy).flat_map(|j| (0..ix).map(move |i| (x * ix + i, y * iy + j)));
                        let sum: u32 = block.map(|(sx, sy)| img.at(data, c, sx, sy) as u32).sum();
                        if ix == 2 && iy == 2 { ((sum + 2) >> 2) as u8 } else { round_u8(sum as f32 * inv_area) }
                    } else {
                        let mut sum = 0f32;
                        for (sy, beta) in area_weights(sh, scale_y, y) {
                            let mut row = 0f32;
                            for (sx, alpha) in area_weights(sw, scale_x, x) {
                                row += img.at(data, c, sx, sy) as f32 * alpha;
                            }
                            sum += beta * row;
                        }
                        round_u8(sum)
                    };
                    out(dst, c, x, y, v);
                }
            }
        }
    } else {
        for c in 0..3 {
            for y in 0..side {
                let (sy, [b0, b1]) = linear_area_weights(inv_y, y);
                let rows = [sy.min(sh - 1), (sy + 1).min(sh - 1)];
                for x in 0..side {
                    let (sx, [a0, a1]) = linear_area_weights(inv_x, x);
                    // The horizontal blend of one row (the last column alone at full weight).
                    let across = |sy: usize| -> i32 {
                        if sx >= sw - 1 {
                            img.at(data, c, sw - 1, sy) as i32 * 2048
                        } else {
                            img.at(data, c, sx, sy) as i32 * a0 + img.at(data, c, sx + 1, sy) as i32 * a1
                        }
                    };
                    let hi = |v: i32, b: i32| ((v >> 4) * b) >> 16;
                    let v = (hi(across(rows[0]), b0) + hi(across(rows[1]), b1) + 2) >> 2;
                    out(dst, c, x, y, v.clamp(0, 255) as u8);
                }
            }
        }
    }
    Layout::planar(side, side)
}

/// `saturate_cast<uchar>(float)`: round half to even, clamp.
fn round_u8(v: f32) -> u8 {
    v.round_ties_even().clamp(0.0, 255.0) as u8
}

/// OpenCV's `computeResizeAreaTab` for output `d`: the input indices it covers and their f32
/// weights (a partial cell at either end).
fn area_weights(input: usize, scale: f64, d: usize) -> impl Iterator<Item = (usize, f32)> {
    let fsx1 = d as f64 * scale;
    let fsx2 = fsx1 + scale;
    let cell = scale.min(input as f64 - fsx1);
    let sx2 = (fsx2.floor() as usize).min(input - 1);
    let sx1 = (fsx1.ceil() as usize).min(sx2);
    let head = (sx1 as f64 - fsx1 > 1e-3).then(|| (sx1 - 1, ((sx1 as f64 - fsx1) / cell) as f32));
    let whole = (sx1..sx2).map(move |sx| (sx, (1.0 / cell) as f32));
    let tail = (fsx2 - sx2 as f64 > 1e-3).then(|| (sx2, ((fsx2 - sx2 as f64).min(1.0).min(cell) / cell) as f32));
    head.into_iter().chain(whole).chain(tail)
}

/// OpenCV's growing `INTER_AREA` for output `d`: the first input index and the 11-bit weights
/// of it and the next (`inv`: output over input size). Past the last input the caller clamps:
/// a column to the last one alone, a row to a repeat of the last row (weights kept, as OpenCV).
fn linear_area_weights(inv: f64, d: usize) -> (usize, [i32; 2]) {
    let s = (d as f64 * (1.0 / inv)).floor() as usize;
    let f = ((d + 1) as f64 - (s + 1) as f64 * inv) as f32;
    let f = if f <= 0.0 { 0.0 } else { f - f.floor() };
    let fixed = |w: f32| (w * 2048.0).round_ties_even() as i32;
    (s, [fixed(1.0 - f), fixed(f)])
}

/// The Qwen2-VL image processor's rows, in (block row, block col, sub row, sub col) order, each
/// `[channel, temporal copy, y, x]` of `(v - 127.5) / 127.5`, from channel-major planes.
fn write_patches(data: &[u8], img: &Layout, patch: usize, out: &mut [f32], out_stride: usize) {
    let blocks = img.width / (2 * patch);
    let cols = 3 * 2 * patch * patch;
    for (r, (br, bc, sub)) in (0..blocks).flat_map(|br| (0..blocks).flat_map(move |bc| (0..4).map(move |sub| (br, bc, sub)))).enumerate() {
        let (py, px) = ((2 * br + sub / 2) * patch, (2 * bc + sub % 2) * patch);
        // k runs over (channel, temporal copy, y); both temporal copies are the one frame.
        for (k, dst) in out[r * out_stride..][..cols].chunks_exact_mut(patch).enumerate() {
            let (c, y) = (k / (2 * patch), k % patch);
            let src = &data[img.offsets[c] + (py + y) * img.row + px..][..patch];
            dst.iter_mut().zip(src).for_each(|(d, &v)| *d = (v as f32 - 127.5) / 127.5);
        }
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

/// One axis of PyTorch's uint8 antialiased resize (`_compute_indices_int16_weights_aa`), in the
/// reference's f64 arithmetic, operation for operation.
#[derive(Clone, Copy)]
struct Axis {
    input: usize,
    scale: f64,
    support: f64,
    invscale: f64,
}

impl Axis {
    fn new(input: usize, output: usize) -> Axis {
        let scale = input as f64 / output as f64;
        let (support, invscale) = if scale >= 1.0 { (2.0 * scale, 1.0 / scale) } else { (2.0, 1.0) };
        Axis { input, scale, support, invscale }
    }

    /// Length of a table row: no window is longer (its ends, `2 * support` apart, are truncated).
    fn taps(self) -> usize {
        ((2.0 * self.support).ceil() as usize + 1).min(self.input)
    }

    /// Input indices of output `i`'s window.
    fn window(self, i: usize) -> Range<usize> {
        let center = self.scale * (i as f64 + 0.5);
        let start = ((center - self.support + 0.5) as i64).max(0) as usize;
        let end = ((center + self.support + 0.5) as i64).min(self.input as i64) as usize;
        start..end
    }

    /// Output `i`'s window weights, normalized by their sum (a zero sum leaves them as they are).
    fn weights(self, i: usize) -> impl Iterator<Item = f64> {
        let center = self.scale * (i as f64 + 0.5);
        let raw = move |j: usize| bicubic((j as f64 - center + 0.5) * self.invscale);
        let total: f64 = self.window(i).map(raw).sum();
        let total = if total != 0.0 { total } else { 1.0 };
        self.window(i).map(move |j| raw(j) / total)
    }

    /// Writes each output index's integer weights into `table` (`taps` i32 per index, zero past
    /// its window) and returns their precision. As in PyTorch, the largest weight of the whole
    /// pass picks the precision (the most bits that keep it an i16), hence the first sweep.
    fn fill(self, output: usize, taps: usize, table: &mut [u8]) -> u32 {
        let largest = (0..output).flat_map(|i| self.weights(i)).fold(f64::MIN, f64::max);
        let precision = (0..22).find(|p| (0.5 + largest * (1u32 << (p + 1)) as f64) as i64 >= 1 << 15).unwrap_or(22);
        let one = (1u32 << precision) as f64;
        for (i, row) in table[..4 * output * taps].chunks_exact_mut(4 * taps).enumerate() {
            row.fill(0);
            for (k, w) in self.weights(i).enumerate() {
                let v = w * one;
                let q = (if v < 0.0 { -0.5 + v } else { 0.5 + v }) as i32;
                row[4 * k..4 * k + 4].copy_from_slice(&q.to_ne_bytes());
            }
        }
        precision
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::models::groot_n17::image::{Chw, Transform, qwen_patches};

    const N17: QwenImage =
        QwenImage { target: 256, edge: 256, crop_fraction: 230.0 / 256.0, letterbox: true, patch: 16, filter: Filter::TorchBicubic };

    /// A random frame with `pad` random bytes after each row, and its packed RGB.
    fn frame(rng: &mut ChaCha8Rng, width: usize, height: usize, format: PixelFormat, pad: usize) -> (Vec<u8>, usize, Vec<u8>) {
        let bpp = format.bytes_per_pixel();
        let stride = width * bpp + pad;
        let data: Vec<u8> = (0..stride * height).map(|_| rng.random()).collect();
        let order = if format == PixelFormat::Bgr8 { [2, 1, 0] } else { [0, 1, 2] };
        let rgb =
            (0..height).flat_map(|y| (0..width).flat_map(move |x| order.map(|c| y * stride + x * bpp + c))).map(|i| data[i]).collect();
        (data, stride, rgb)
    }

    fn reference(q: &QwenImage, rgb: &[u8], width: usize, height: usize) -> Vec<f32> {
        let t = Transform { target: (q.target, q.target), edge: q.edge, crop_fraction: q.crop_fraction, letterbox: q.letterbox };
        qwen_patches(&t.apply(&Chw::from_hwc(rgb, width, height)), q.patch)
    }

    /// `patches` with an output row stride wider than a row, whose gaps must stay untouched.
    fn patches(
        q: &QwenImage,
        data: &[u8],
        width: usize,
        height: usize,
        stride: usize,
        format: PixelFormat,
        scratch: &mut [u8],
    ) -> Vec<f32> {
        let (rows, cols) = (q.patch_rows(), q.patch_cols());
        let out_stride = cols + 5;
        let mut out = vec![f32::NAN; rows * out_stride];
        q.patches(data, width, height, stride, format, scratch, &mut out, out_stride);
        let (packed, gaps): (Vec<_>, Vec<_>) = out.chunks(out_stride).map(|r| r.split_at(cols)).unzip();
        assert!(gaps.iter().all(|g| g.iter().all(|v| v.is_nan())), "patches wrote between rows");
        packed.concat()
    }

    fn assert_same(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            panic!("{what}: element {i} is {} but the reference has {}", got[i], want[i]);
        }
    }

    #[test]
    fn matches_the_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        let geometries = [
            N17,
            QwenImage { letterbox: false, ..N17 },
            QwenImage { crop_fraction: 1.0, ..N17 },
            QwenImage { crop_fraction: 0.5, letterbox: false, ..N17 },
            QwenImage { crop_fraction: 0.999, ..N17 },
            QwenImage { crop_fraction: 0.001, ..N17 },
            QwenImage { target: 224, edge: 300, crop_fraction: 0.875, letterbox: true, patch: 14, ..N17 },
            QwenImage { target: 32, edge: 40, crop_fraction: 0.9, letterbox: false, ..N17 },
        ];
        let fixed = [
            (1, 1),
            (1, 700),
            (700, 1),
            (2, 3),
            (16, 16),
            (230, 230),
            (255, 257),
            (256, 256),
            (256, 100),
            (100, 256),
            (300, 300),
            (512, 512),
            (640, 480),
            (480, 640),
            (699, 700),
        ];
        let random = (0..8).map(|_| (rng.random_range(1..=700), rng.random_range(1..=700))).collect::<Vec<_>>();
        let formats = [PixelFormat::Rgb8, PixelFormat::Bgr8, PixelFormat::Rgba8];
        for (n, &(width, height)) in fixed.iter().chain(&random).enumerate() {
            for (g, q) in geometries.iter().enumerate() {
                // Every size and geometry once, in turn through the formats and row paddings.
                let format = formats[(n + g) % 3];
                let pad = [0, 1, 13][(n + 2 * g) % 3];
                let (data, stride, rgb) = frame(&mut rng, width, height, format, pad);
                let mut scratch = vec![0u8; q.scratch_len(width, height)];
                let got = patches(q, &data, width, height, stride, format, &mut scratch);
                assert_same(&got, &reference(q, &rgb, width, height), &format!("{width}x{height} {format:?} pad {pad} {q:?}"));
            }
        }
    }

    #[test]
    fn the_largest_frames_scratch_serves_every_smaller_frame() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for q in [N17, QwenImage { letterbox: false, ..N17 }] {
            let (max_width, max_height) = (700, 450);
            let mut scratch = vec![0u8; q.scratch_len(max_width, max_height)];
            for (width, height) in [(max_width, max_height), (1, 1), (1, max_height), (max_width, 1), (333, 449)] {
                let (data, stride, rgb) = frame(&mut rng, width, height, PixelFormat::Rgb8, 0);
                let got = patches(&q, &data, width, height, stride, PixelFormat::Rgb8, &mut scratch);
                assert_same(&got, &reference(&q, &rgb, width, height), &format!("{width}x{height} {q:?}"));
            }
            for width in 1..=max_width {
                for height in [1, max_height / 2, max_height] {
                    assert!(q.scratch_len(width, height) <= scratch.len(), "{width}x{height}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "QwenImage: scratch has")]
    fn too_small_a_scratch_panics() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (data, stride, _) = frame(&mut rng, 320, 240, PixelFormat::Rgb8, 0);
        let mut scratch = vec![0u8; N17.scratch_len(320, 240) - 1];
        patches(&N17, &data, 320, 240, stride, PixelFormat::Rgb8, &mut scratch);
    }

    #[test]
    fn no_window_is_longer_than_its_table_row() {
        for input in 1..=1500 {
            for output in [1, 2, 3, 16, 17, 230, 256, 257, 1000] {
                let axis = Axis::new(input, output);
                assert!((0..output).all(|i| axis.window(i).len() <= axis.taps()), "{input} -> {output}");
            }
        }
    }
}
