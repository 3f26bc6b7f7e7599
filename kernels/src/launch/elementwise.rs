//! Launchers of the element-wise and input kernels (elementwise.cu, image.cu): copies, the
//! host-input copy, table adds, GELU and GeGLU, the affine output, the token embedding and the
//! image patches.

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

    /// `out = act(gate) ⊙ up` with `gate_up = [gate | up]`, each `out.cols` wide; `kind` as in
    /// [`Kernels::activation`].
    ///
    /// # Safety
    /// Both matrices must be live device memory.
    pub unsafe fn gated_activation(&self, out: Mat, gate_up: Mat, kind: i32, stream: CUstream) -> Result<()> {
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
        ];
        // SAFETY: matches `gated_activation_*` in elementwise.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
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
}
