//! GR00T N1.7's image preprocessing for a CPU backend op on the hot path: the transform of the
//! host reference (`models::groot_n17::image`: optional letterbox, PyTorch's uint8 antialiased
//! bicubic resize to `edge²`, centre crop, resize to `target²`, the Qwen2-VL patch order and
//! normalization), bit for bit, computed in a caller-owned scratch buffer.
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
        // The reference skips a pass whose side does not change; here every pass runs, since a
        // pass to the same length is the identity (weights 0, 1, 0 at precision 14, exactly).
        let img = resample(frame, src, edge, false, table, a);
        let img = resample(a, img, edge, true, table, b).centre_crop(self.crop_side());
        let img = resample(b, img, target, false, table, a);
        let img = resample(a, img, target, true, table, b);
        write_patches(b, &img, patch, out, out_stride);
    }

    /// The frame's size after the letterbox.
    fn letterboxed(&self, width: usize, height: usize) -> (usize, usize) {
        if self.letterbox { (width.max(height), width.max(height)) } else { (width, height) }
    }

    /// Side of the centre crop of the `edge²` image: Python's round (half to even).
    fn crop_side(&self) -> usize {
        let f = self.crop_fraction;
        if 0.0 < f && f < 1.0 { ((self.edge as f64 * f).round_ties_even() as usize).max(1) } else { self.edge }
    }

    /// Scratch bytes of the weight table (one pass at a time), of the width passes' output planes
    /// and of the height passes' output planes, for a `width × height` frame. Each grows with the
    /// frame, so the largest frame's sizes bound all others.
    fn regions(&self, width: usize, height: usize) -> [usize; 3] {
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

    const N17: QwenImage = QwenImage { target: 256, edge: 256, crop_fraction: 230.0 / 256.0, letterbox: true, patch: 16 };

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
            QwenImage { target: 224, edge: 300, crop_fraction: 0.875, letterbox: true, patch: 14 },
            QwenImage { target: 32, edge: 40, crop_fraction: 0.9, letterbox: false, patch: 16 },
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
        let random = (0..24).map(|_| (rng.random_range(1..=700), rng.random_range(1..=700))).collect::<Vec<_>>();
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
