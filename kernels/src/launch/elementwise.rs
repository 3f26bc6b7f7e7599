//! Launchers of the element-wise and input kernels (elementwise.cu, image.cu, fp8.cu): copies, the
//! FP8 quantization of product inputs, the host-input copy, table adds, GELU and GeGLU, the affine
//! output, the token embedding and the image patches.

use super::*;

impl Kernels {
    /// `dst = src` (same shape), converting the element type.
    ///
    /// # Safety
    /// Both matrices must lie in live device memory of this context.
    pub unsafe fn copy(&self, dst: Mat, src: Mat, stream: CUstream) -> Result<()> {
        Self::same_shape("copy", &dst, &src)?;
        let name = format!("copy_{}_{}", src.dtype.suffix(), dst.dtype.suffix());
        let grid = Self::elementwise_grid(dst.rows, dst.cols, &name)?;
        let args = [
            Arg::P(dst.ptr),
            Arg::I(i32_of(dst.stride, "copy")?),
            Arg::P(src.ptr),
            Arg::I(i32_of(src.stride, "copy")?),
            Arg::I(dst.rows as i32),
            Arg::I(i32_of(dst.cols, "copy")?),
        ];
        // SAFETY: matches `copy_*` in elementwise.cu; memory validity is the caller's contract.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// `dst = e4m3(src · inverse_scale)` (round to nearest even, saturating to ±448): the input
    /// of an FP8 product, whose per-tensor scale is `1 / inverse_scale`. `dst`'s width, stride
    /// and address must be multiples of 4 (four values per thread, one 4-byte store).
    ///
    /// # Safety
    /// Both matrices must lie in live device memory of this context.
    pub unsafe fn quantize_e4m3(&self, dst: Mat, src: Mat, inverse_scale: f32, stream: CUstream) -> Result<()> {
        const NAME: &str = "quantize_e4m3";
        Self::same_shape(NAME, &dst, &src)?;
        if dst.dtype != Dtype::E4m3 || src.dtype == Dtype::E4m3 {
            return Err(shape_error(NAME, format!("{:?} into {:?}: needs f32 or bf16 into e4m3", src.dtype, dst.dtype)));
        }
        if dst.cols % 4 != 0 || dst.stride % 4 != 0 || dst.ptr % 4 != 0 {
            return Err(shape_error(NAME, format!("e4m3 {dst:?}: width, stride and address must be multiples of 4")));
        }
        let name = format!("{NAME}_{}", src.dtype.suffix());
        let grid = Self::elementwise_grid(dst.rows, dst.cols / 4, &name)?;
        let args = [
            Arg::P(dst.ptr),
            Arg::I(i32_of(dst.stride, &name)?),
            Arg::P(src.ptr),
            Arg::I(i32_of(src.stride, &name)?),
            Arg::I(dst.rows as i32),
            Arg::I(i32_of(dst.cols, &name)?),
            Arg::F(inverse_scale),
        ];
        // SAFETY: matches `quantize_e4m3_*` in fp8.cu; memory validity is the caller's contract.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// Row `i` of `src` into row `index[i]` of `dst` (`src.rows` i32 indices), added to it when
    /// `accumulate`.
    ///
    /// # Safety
    /// `dst`, `src` and `index` must be live device memory; every index must be a row of `dst`.
    pub unsafe fn scatter_rows(&self, dst: Mat, src: Mat, index: DevPtr, accumulate: bool, stream: CUstream) -> Result<()> {
        let name = format!("scatter_rows_{}_{}", src.dtype.suffix(), dst.dtype.suffix());
        if src.cols != dst.cols {
            return Err(shape_error(&name, format!("src {src:?} and dst {dst:?} differ in width")));
        }
        let args = [
            Arg::P(dst.ptr),
            Arg::I(i32_of(dst.stride, &name)?),
            Arg::P(src.ptr),
            Arg::I(i32_of(src.stride, &name)?),
            Arg::P(index),
            Arg::I(i32_of(dst.cols, &name)?),
            Arg::I(accumulate as i32),
        ];
        let threads = (dst.cols.div_ceil(32) as u32 * 32).clamp(32, 256);
        // SAFETY: matches `scatter_rows_*` in elementwise.cu (one block per source row).
        unsafe { self.launch(&name, (src.rows.max(1) as u32, 1, 1), threads, stream, args) }
    }

    /// Copies `count` pieces, each `(destination, source, bytes)` of the u64 table `pieces` in
    /// device memory (bytes a multiple of 4), in one launch: the host inputs from mapped pinned
    /// memory into device buffers.
    ///
    /// # Safety
    /// `pieces` must hold `count` triples of live, device-accessible, 4-byte aligned ranges.
    pub unsafe fn copy_host_inputs(&self, pieces: DevPtr, count: usize, stream: CUstream) -> Result<()> {
        let args = [Arg::P(pieces), Arg::I(i32_of(count, "copy_host_inputs")?)];
        // SAFETY: matches `copy_host_inputs` in elementwise.cu: one block per piece.
        unsafe { self.launch("copy_host_inputs", (count.max(1) as u32, 1, 1), 256, stream, args) }
    }

    /// Copies the entry `index[0]` (i32, clamped to each table) of every piece's stacked weights
    /// into its destination: `pieces` holds `count` × (destination, table, bytes per entry,
    /// entries) u64 values in device memory, each piece copied by `blocks_per_piece` blocks.
    ///
    /// # Safety
    /// `pieces` must hold `count` quadruples of live device ranges (each table `entries` entries
    /// of the destination's bytes, a multiple of 2); `index` one live i32.
    pub unsafe fn select_weights(
        &self,
        pieces: DevPtr,
        count: usize,
        blocks_per_piece: usize,
        index: DevPtr,
        stream: CUstream,
    ) -> Result<()> {
        if count == 0 || count > 65_535 {
            return Err(shape_error("select_weights", format!("{count} pieces: one grid row each, 1 to 65535")));
        }
        let grid = (blocks_per_piece.clamp(1, 1024) as u32, count as u32, 1);
        let args = [Arg::P(pieces), Arg::I(i32_of(count, "select_weights")?), Arg::P(index)];
        // SAFETY: matches `select_weights` in elementwise.cu.
        unsafe { self.launch("select_weights", grid, 256, stream, args) }
    }

    /// `x += table`, the f32 table's rows repeating every `table_rows` rows.
    ///
    /// # Safety
    /// `x` (f32) and `table` (`table_rows × x.cols` f32) must be live device memory.
    pub unsafe fn add_table(&self, x: Mat, table: DevPtr, table_rows: usize, stream: CUstream) -> Result<()> {
        if x.dtype != Dtype::F32 || table_rows == 0 {
            return Err(shape_error("add_table", format!("needs an f32 residual and table rows > 0, got {:?} and {table_rows}", x.dtype)));
        }
        let grid = Self::elementwise_grid(x.rows, x.cols, "add_table")?;
        let args = [
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, "add_table")?),
            Arg::P(table),
            Arg::I(i32_of(table_rows, "add_table")?),
            Arg::I(x.rows as i32),
            Arg::I(i32_of(x.cols, "add_table")?),
        ];
        // SAFETY: matches `add_table_f32`.
        unsafe { self.launch("add_table_f32", grid, 256, stream, args) }
    }

    /// In place `x = act(x)`; `kind` is the kernel's code of the activation (`ACT_*` in
    /// elementwise.cu: 0 tanh GELU, 1 erf GELU, 2 SiLU, 3 ReLU).
    ///
    /// # Safety
    /// `x` must be live device memory.
    pub unsafe fn activation(&self, x: Mat, kind: i32, stream: CUstream) -> Result<()> {
        let name = format!("activation_{}", x.dtype.suffix());
        let per = Self::columns_per_thread(&[(x, x.cols)]);
        let grid = Self::elementwise_grid(x.rows, x.cols.div_ceil(per), &name)?;
        let args = [
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::I(x.rows as i32),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::I(per as i32),
            Arg::I(kind),
        ];
        // SAFETY: matches `activation_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// `out = act(gate) ⊙ up · out_scale` with `gate_up = [gate | up]`, each `out.cols` wide,
    /// read times `in_scale`; `kind` as in [`Kernels::activation`]. `out` may be e4m3 (an FP8
    /// product's input, `out_scale` its inverse input scale; 1 for f32 and bf16), and `gate_up`
    /// too when `out` is (an FP8 product's output, `in_scale` its scale; 1 otherwise).
    ///
    /// # Safety
    /// Both matrices must be live device memory.
    pub unsafe fn gated_activation(
        &self,
        out: Mat,
        out_scale: f32,
        gate_up: Mat,
        in_scale: f32,
        kind: i32,
        stream: CUstream,
    ) -> Result<()> {
        if gate_up.rows != out.rows || gate_up.cols != 2 * out.cols {
            return Err(shape_error(
                "gated_activation",
                format!("gate_up {}x{} for out {}x{}", gate_up.rows, gate_up.cols, out.rows, out.cols),
            ));
        }
        let name = format!("gated_activation_{}_{}", gate_up.dtype.suffix(), out.dtype.suffix());
        // The up half starts `out.cols` into each gate_up row: it must be aligned too.
        let per = Self::columns_per_thread(&[(out, out.cols), (gate_up, out.cols)]);
        let grid = Self::elementwise_grid(out.rows, out.cols.div_ceil(per), &name)?;
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(gate_up.ptr),
            Arg::I(i32_of(gate_up.stride, &name)?),
            Arg::I(out.rows as i32),
            Arg::I(i32_of(out.cols, &name)?),
            Arg::I(per as i32),
            Arg::I(kind),
            Arg::F(in_scale),
            Arg::F(out_scale),
        ];
        // SAFETY: matches `gated_activation_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// One Euler step of `x` under real-time chunking guidance (`rtc_guide_f32` in
    /// elementwise.cu): `step` holds `dt · v`; `prev` is the previous chunk, read from row
    /// `*shift` on (an i32 on the device) in its first `prefix_cols` columns; `weights` holds
    /// `x.rows` f32 row weights. Every matrix is f32.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rtc_guide(
        &self,
        x: Mat,
        step: Mat,
        prev: Mat,
        weights: DevPtr,
        shift: DevPtr,
        prefix_cols: usize,
        (t, dt, guidance): (f32, f32, f32),
        stream: CUstream,
    ) -> Result<()> {
        Self::same_shape("rtc_guide", &x, &step)?;
        if prev.cols != x.cols || prefix_cols > x.cols {
            return Err(shape_error(
                "rtc_guide",
                format!("previous chunk {}x{}, {prefix_cols} prefix columns for x {}x{}", prev.rows, prev.cols, x.rows, x.cols),
            ));
        }
        if [x.dtype, step.dtype, prev.dtype].iter().any(|&d| d != Dtype::F32) {
            return Err(shape_error("rtc_guide", "x, step and the previous chunk must be f32".into()));
        }
        let name = "rtc_guide_f32";
        let grid = Self::elementwise_grid(x.rows, x.cols, name)?;
        let args = [
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, name)?),
            Arg::P(step.ptr),
            Arg::I(i32_of(step.stride, name)?),
            Arg::P(prev.ptr),
            Arg::I(i32_of(prev.stride, name)?),
            Arg::I(i32_of(prev.rows, name)?),
            Arg::P(weights),
            Arg::P(shift),
            Arg::I(i32_of(prefix_cols, name)?),
            Arg::F(t),
            Arg::F(dt),
            Arg::F(guidance),
            Arg::I(i32_of(x.rows, name)?),
            Arg::I(i32_of(x.cols, name)?),
        ];
        // SAFETY: matches `rtc_guide_f32` in elementwise.cu.
        unsafe { self.launch(name, grid, 256, stream, args) }
    }

    /// The start of GR00T's real-time chunking (`rtc_prefix_f32` in elementwise.cu): rows
    /// `r < prefix[1]` of `x` become row `prefix[0] + r` of `prev` in their first `prefix_cols`
    /// columns and 0 in the others (`prefix`: two i32 on the device). Both matrices are f32.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn rtc_prefix(&self, x: Mat, prev: Mat, prefix: DevPtr, prefix_cols: usize, stream: CUstream) -> Result<()> {
        if prev.cols < prefix_cols || x.cols < prefix_cols {
            return Err(shape_error(
                "rtc_prefix",
                format!("{prefix_cols} prefix columns of a {}x{} previous chunk into x {}x{}", prev.rows, prev.cols, x.rows, x.cols),
            ));
        }
        if x.dtype != Dtype::F32 || prev.dtype != Dtype::F32 {
            return Err(shape_error("rtc_prefix", "x and the previous chunk must be f32".into()));
        }
        let name = "rtc_prefix_f32";
        let grid = Self::elementwise_grid(x.rows, x.cols, name)?;
        let args = [
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, name)?),
            Arg::P(prev.ptr),
            Arg::I(i32_of(prev.stride, name)?),
            Arg::I(i32_of(prev.rows, name)?),
            Arg::P(prefix),
            Arg::I(i32_of(prefix_cols, name)?),
            Arg::I(i32_of(x.rows, name)?),
            Arg::I(i32_of(x.cols, name)?),
        ];
        // SAFETY: matches `rtc_prefix_f32` in elementwise.cu.
        unsafe { self.launch(name, grid, 256, stream, args) }
    }

    /// `x += strength[r] · step` row by row (`rtc_euler_f32` in elementwise.cu): an Euler
    /// step with `step = dt · v` and a velocity strength per row (`x.rows` f32 on the device).
    /// Both matrices are f32.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn rtc_euler(&self, x: Mat, step: Mat, strength: DevPtr, stream: CUstream) -> Result<()> {
        Self::same_shape("rtc_euler", &x, &step)?;
        if x.dtype != Dtype::F32 || step.dtype != Dtype::F32 {
            return Err(shape_error("rtc_euler", "x and the step must be f32".into()));
        }
        let name = "rtc_euler_f32";
        let grid = Self::elementwise_grid(x.rows, x.cols, name)?;
        let args = [
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, name)?),
            Arg::P(step.ptr),
            Arg::I(i32_of(step.stride, name)?),
            Arg::P(strength),
            Arg::I(i32_of(x.rows, name)?),
            Arg::I(i32_of(x.cols, name)?),
        ];
        // SAFETY: matches `rtc_euler_f32` in elementwise.cu.
        unsafe { self.launch(name, grid, 256, stream, args) }
    }

    /// `out = x ⊙ scale + offset` per column (f32 vectors of `out.cols`); `out` is f32.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn affine(&self, out: Mat, x: Mat, scale: DevPtr, offset: DevPtr, stream: CUstream) -> Result<()> {
        Self::same_shape("affine", &out, &x)?;
        if out.dtype != Dtype::F32 {
            return Err(shape_error("affine", "the output must be f32".into()));
        }
        let name = format!("affine_{}", x.dtype.suffix());
        let grid = Self::elementwise_grid(out.rows, out.cols, &name)?;
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(scale),
            Arg::P(offset),
            Arg::I(out.rows as i32),
            Arg::I(i32_of(out.cols, &name)?),
        ];
        // SAFETY: matches `affine_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// `out[r] = table[clamp(tokens[r])] · scale` from a bf16 `[vocab, out.cols]` table.
    ///
    /// # Safety
    /// `tokens` (`out.rows` i32) and the table must be live device memory.
    pub unsafe fn embed(&self, out: Mat, tokens: DevPtr, table: DevPtr, vocab: usize, scale: f32, stream: CUstream) -> Result<()> {
        let name = format!("embed_bf16_{}", out.dtype.suffix());
        let grid = Self::elementwise_grid(out.rows, out.cols, &name)?;
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(tokens),
            Arg::P(table),
            Arg::I(i32_of(vocab, &name)?),
            Arg::F(scale),
            Arg::I(out.rows as i32),
            Arg::I(i32_of(out.cols, &name)?),
        ];
        // SAFETY: matches `embed_bf16_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// Resize-with-pad, normalise and patchify camera `camera` of the staged u8 frames into `out`
    /// (`[(size / patch)², 3 · patch²]`).
    ///
    /// # Safety
    /// `frames` must be device-accessible (device or mapped pinned host memory) holding
    /// `frame_stride` bytes per camera; `frame_info` 4 i32 per camera.
    #[allow(clippy::too_many_arguments)] // the op's own fields, one to one
    pub unsafe fn image_patches(
        &self,
        out: Mat,
        frames: DevPtr,
        frame_stride: usize,
        frame_info: DevPtr,
        camera: usize,
        size: usize,
        patch: usize,
        stream: CUstream,
    ) -> Result<()> {
        let name = format!("image_patches_u8_{}", out.dtype.suffix());
        if patch == 0 || size % patch != 0 || out.rows != (size / patch).pow(2) || out.cols != 3 * patch * patch {
            return Err(shape_error(&name, format!("{}x{} output for size {size}, patch {patch}", out.rows, out.cols)));
        }
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(frames),
            Arg::L(frame_stride as i64),
            Arg::P(frame_info),
            Arg::I(i32_of(camera, &name)?),
            Arg::I(i32_of(size, &name)?),
            Arg::I(i32_of(patch, &name)?),
        ];
        // SAFETY: matches `image_patches_u8_*` in image.cu (one thread per output pixel).
        unsafe { self.launch(&name, ((size * size).div_ceil(256) as u32, 1, 1), 256, stream, args) }
    }

    /// GR00T N1.7's image of camera `a.camera` as pixel values into `a.out` (image.cu's
    /// `qwen_image_*`: the weight tables, four resample passes, the patch rows), in `a.scratch`.
    ///
    /// # Safety
    /// All pointers must be live device memory, `a.scratch` at least
    /// [`QwenImageSizes::scratch_bytes`]; the staged frame no larger than the maximum.
    pub unsafe fn qwen_image_patches(&self, a: &QwenImageArgs, stream: CUstream) -> Result<()> {
        let name = format!("qwen_image_patchify_{}", a.out.dtype.suffix());
        let (grid, cols) = (a.target / a.patch.max(1), 6 * a.patch * a.patch);
        if a.patch == 0 || a.target % (2 * a.patch) != 0 || a.out.rows != grid * grid || a.out.cols != cols {
            return Err(shape_error(&name, format!("{:?} for target {} patch {}", a.out, a.target, a.patch)));
        }
        let sizes = a.sizes();
        if a.area {
            let (plane_a, plane_b) = (a.scratch, a.scratch + (4 * sizes.tables().0 * 4 + sizes.plane_a_bytes()) as u64);
            let c = |v: usize| i32_of(v, "qwen_image_patches");
            if a.edge != a.target {
                return Err(shape_error(&name, format!("the area path resizes to edge {} = target {}", a.edge, a.target)));
            }
            // SAFETY: the signatures of image.cu's qwen_image_area and qwen_image_patchify_*; one
            // thread per output value; both planes hold 3 · edge² bytes (edge = target).
            unsafe {
                for p in 0..2 {
                    let args = [
                        Arg::P(plane_a),
                        Arg::P(plane_b),
                        Arg::P(a.frames),
                        Arg::L(a.frame_stride as i64),
                        Arg::P(a.frame_info),
                        Arg::I(c(a.camera)?),
                        Arg::I(c(a.edge)?),
                        Arg::D(a.crop_fraction),
                        Arg::I(a.letterbox as i32),
                        Arg::I(p),
                    ];
                    self.launch("qwen_image_area", ((3 * a.edge * a.edge).div_ceil(256) as u32, 1, 1), 256, stream, args)?;
                }
                return self.qwen_image_patchify(&name, a, plane_b, grid, cols, stream);
            }
        }
        let (table_ints, taps) = sizes.tables();
        let tables = a.scratch;
        let plane_a = tables + (4 * table_ints * 4) as u64;
        let plane_b = plane_a + sizes.plane_a_bytes() as u64;
        let c = |v: usize| i32_of(v, "qwen_image_patches");
        let common = |p: i32| -> Result<[Arg; 14]> {
            Ok([
                Arg::P(plane_a),
                Arg::P(plane_b),
                Arg::P(a.frames),
                Arg::L(a.frame_stride as i64),
                Arg::P(tables),
                Arg::I(c(table_ints)?),
                Arg::I(c(taps)?),
                Arg::P(a.frame_info),
                Arg::I(c(a.camera)?),
                Arg::I(c(a.edge)?),
                Arg::I(c(a.target)?),
                Arg::D(a.crop_fraction),
                Arg::I(a.letterbox as i32),
                Arg::I(p),
            ])
        };
        let weights = [
            Arg::P(tables),
            Arg::I(c(table_ints)?),
            Arg::I(c(taps)?),
            Arg::P(a.frame_info),
            Arg::I(c(a.camera)?),
            Arg::I(c(a.edge)?),
            Arg::I(c(a.target)?),
            Arg::D(a.crop_fraction),
            Arg::I(a.letterbox as i32),
        ];
        // SAFETY: the signatures of image.cu's qwen_image_* kernels; one block per pass for the
        // tables, one thread per output value of each pass (sized for the largest frame).
        unsafe {
            self.launch("qwen_image_weights", (4, 1, 1), 256, stream, weights)?;
            let (side, e, t) = (sizes.largest_side(), a.edge, a.target);
            for (p, values) in [(0, 3 * side * e), (1, 3 * e * e), (2, 3 * e * t), (3, 3 * t * t)] {
                self.launch("qwen_image_resample", (values.div_ceil(256) as u32, 1, 1), 256, stream, common(p)?)?;
            }
            self.qwen_image_patchify(&name, a, plane_b, grid, cols, stream)
        }
    }

    /// The `target²` image in `plane` as `a.out`'s patch rows.
    ///
    /// # Safety
    /// As [`Kernels::qwen_image_patches`]; `plane` holds `3 · target²` bytes.
    unsafe fn qwen_image_patchify(
        &self,
        name: &str,
        a: &QwenImageArgs,
        plane: DevPtr,
        grid: usize,
        cols: usize,
        stream: CUstream,
    ) -> Result<()> {
        let c = |v: usize| i32_of(v, "qwen_image_patches");
        let args = [
            Arg::P(a.out.ptr),
            Arg::I(c(a.out.stride)?),
            Arg::P(plane),
            Arg::P(a.frame_info),
            Arg::I(c(a.camera)?),
            Arg::I(c(a.target)?),
            Arg::I(c(a.patch)?),
        ];
        // SAFETY: the signature of image.cu's qwen_image_patchify_*; one thread per value.
        unsafe { self.launch(name, ((grid * grid * cols).div_ceil(256) as u32, 1, 1), 256, stream, args) }
    }
}

/// One camera's GR00T image op (see [`Kernels::qwen_image_patches`]).
#[derive(Clone, Copy, Debug)]
pub struct QwenImageArgs {
    pub out: Mat,
    pub frames: DevPtr,
    pub frame_stride: usize,
    pub frame_info: DevPtr,
    pub camera: usize,
    pub max_width: usize,
    pub max_height: usize,
    pub edge: usize,
    pub target: usize,
    pub crop_fraction: f64,
    pub letterbox: bool,
    pub patch: usize,
    /// The albumentations path (OpenCV INTER_AREA) instead of the bicubic one.
    pub area: bool,
    pub scratch: DevPtr,
}

impl QwenImageArgs {
    fn sizes(&self) -> QwenImageSizes {
        QwenImageSizes {
            max_width: self.max_width,
            max_height: self.max_height,
            edge: self.edge,
            target: self.target,
            letterbox: self.letterbox,
        }
    }
}

/// The sizes the GR00T image op's scratch follows from.
#[derive(Clone, Copy, Debug)]
pub struct QwenImageSizes {
    pub max_width: usize,
    pub max_height: usize,
    pub edge: usize,
    pub target: usize,
    pub letterbox: bool,
}

impl QwenImageSizes {
    /// The longest side a letterboxed frame can have, the rows of the first pass.
    fn largest_side(&self) -> usize {
        if self.letterbox { self.max_width.max(self.max_height) } else { self.max_height }
    }

    /// Ints per pass table and the taps of its windows: an output's window spans at most
    /// 4 · scale + 2 inputs when downscaling by `scale`, 5 when upscaling.
    fn tables(&self) -> (usize, usize) {
        let side = self.max_width.max(self.max_height).max(self.edge);
        let taps = (4 * side.div_ceil(self.edge.min(self.target)) + 3).max(5);
        (1 + self.edge.max(self.target) * (2 + taps), taps)
    }

    fn plane_a_bytes(&self) -> usize {
        (3 * (self.largest_side() * self.edge).max(self.edge * self.target)).next_multiple_of(16)
    }

    /// Device scratch the op needs: the four tables and two planes.
    pub fn scratch_bytes(&self) -> usize {
        4 * self.tables().0 * 4 + self.plane_a_bytes() + 3 * self.edge.max(self.target).pow(2)
    }
}
