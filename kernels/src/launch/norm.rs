//! Launchers of the normalisation kernels (norm.cu): LayerNorm, RMSNorm and adaRMS, the gated
//! residual, and their fusions with it and with the narrow products at the step boundary.

use super::*;

impl Kernels {
    /// Row-wise LayerNorm, with f32 `(gamma, beta)` of `x.cols` when `affine`, and with an
    /// adaptive `modulation` (`[scale | shift | ...]`, f32) `· (1 + scale) + shift` after it.
    /// `out` may be e4m3 (an FP8 product's input, `out_scale` its inverse input scale; 1 for f32
    /// and bf16).
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // two matrices, two optional vectors, the output scale
    pub unsafe fn layer_norm(
        &self,
        out: Mat,
        out_scale: f32,
        x: Mat,
        affine: Option<(DevPtr, DevPtr)>,
        modulation: Option<DevPtr>,
        eps: f32,
        stream: CUstream,
    ) -> Result<()> {
        Self::same_shape("layer_norm", &out, &x)?;
        let name = format!("layer_norm_{}_{}", x.dtype.suffix(), out.dtype.suffix());
        let (gamma, beta) = affine.unwrap_or((0, 0));
        let (per, threads) = Self::row_launch(&[(out, 0), (x, 0)], &[gamma, beta], x.cols);
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(gamma),
            Arg::P(beta),
            Arg::P(modulation.unwrap_or(0)),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
            Arg::I(per),
            Arg::F(out_scale),
        ];
        // SAFETY: matches `layer_norm_*` in norm.cu.
        unsafe { self.launch(&name, (x.rows as u32, 1, 1), threads, stream, args) }
    }

    /// RMS norm of each row's `heads` equal column slices (1: the whole row), times `weight`
    /// (one slice wide, f32) when given; with `modulation` (`[scale | shift | gate]`, 3 · cols
    /// f32) the adaRMS form `rms(x) · (1 + scale) + shift`. `out` may be e4m3 (an FP8 product's
    /// input, `out_scale` its inverse input scale; 1 for f32 and bf16).
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // two matrices, the slicing, two optional vectors, the output scale
    pub unsafe fn rms_norm(
        &self,
        out: Mat,
        out_scale: f32,
        x: Mat,
        heads: usize,
        weight: Option<DevPtr>,
        modulation: Option<DevPtr>,
        eps: f32,
        stream: CUstream,
    ) -> Result<()> {
        Self::same_shape("rms_norm", &out, &x)?;
        let name = format!("rms_norm_{}_{}", x.dtype.suffix(), out.dtype.suffix());
        if heads == 0 || x.cols % heads != 0 || (heads > 1 && modulation.is_some()) {
            return Err(shape_error(&name, format!("{} columns in {heads} heads (with a modulation: {})", x.cols, modulation.is_some())));
        }
        let cols = x.cols / heads;
        // Each slice starts `cols` elements after the last: its alignment is that of `cols`.
        let (per, threads) = if cols % 8 == 0 {
            Self::row_launch(&[(out, cols), (x, cols)], &[weight.unwrap_or(0), modulation.unwrap_or(0)], cols)
        } else {
            (1, Self::row_block(cols))
        };
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(weight.unwrap_or(0)),
            Arg::P(modulation.unwrap_or(0)),
            Arg::I(i32_of(cols, &name)?),
            Arg::I(i32_of(heads, &name)?),
            Arg::F(eps),
            Arg::I(per),
            Arg::F(out_scale),
        ];
        let blocks = u32::try_from(x.rows * heads).map_err(|_| shape_error(&name, format!("{} rows x {heads} heads", x.rows)))?;
        // SAFETY: matches `rms_norm_*` in norm.cu (a null weight or modulation is left out): one
        // block per (row, head) slice.
        unsafe { self.launch(&name, (blocks, 1, 1), threads, stream, args) }
    }

    /// `x += y ⊙ gate`, gate = the third third of `modulation` (3 · cols f32); `x` is f32.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn gated_residual(&self, x: Mat, y: Mat, modulation: DevPtr, stream: CUstream) -> Result<()> {
        Self::same_shape("gated_residual", &x, &y)?;
        if x.dtype != Dtype::F32 {
            return Err(shape_error("gated_residual", "the residual stream must be f32".into()));
        }
        let name = format!("gated_residual_{}", y.dtype.suffix());
        let grid = Self::elementwise_grid(x.rows, x.cols, &name)?;
        let args = [
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(y.ptr),
            Arg::I(i32_of(y.stride, &name)?),
            Arg::P(modulation),
            Arg::I(x.rows as i32),
            Arg::I(i32_of(x.cols, &name)?),
        ];
        // SAFETY: matches `gated_residual_*` in norm.cu.
        unsafe { self.launch(&name, grid, 256, stream, args) }
    }

    /// `x += y ⊙ gate(gate_modulation)`, then `out = rms(x) · (1 + scale) + shift` with
    /// `norm_modulation`, in one pass per row; each output value times `out_scale` (an FP8
    /// product's inverse input scale when `out` is e4m3, 1 otherwise). With `zero_y`, `y` is left
    /// zero once read (for a [`Kernels::product_stream`] that adds into it next).
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's signature: two matrices in, two modulations
    pub unsafe fn gated_residual_rms_norm(
        &self,
        out: Mat,
        x: Mat,
        y: Mat,
        gate_modulation: DevPtr,
        norm_modulation: DevPtr,
        eps: f32,
        out_scale: f32,
        zero_y: bool,
        early: bool,
        stream: CUstream,
    ) -> Result<()> {
        Self::same_shape("gated_residual_rms_norm", &x, &y)?;
        Self::same_shape("gated_residual_rms_norm", &x, &out)?;
        if x.dtype != Dtype::F32 {
            return Err(shape_error("gated_residual_rms_norm", "the residual stream must be f32".into()));
        }
        let name = format!("gated_residual_rms_norm_{}_{}", y.dtype.suffix(), out.dtype.suffix());
        let (per, threads) = Self::row_launch(&[(out, 0), (x, 0), (y, 0)], &[gate_modulation, norm_modulation], x.cols);
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(y.ptr),
            Arg::I(i32_of(y.stride, &name)?),
            Arg::P(gate_modulation),
            Arg::P(norm_modulation),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
            Arg::I(per),
            Arg::F(out_scale),
            Arg::I(zero_y as i32),
        ];
        // SAFETY: matches `gated_residual_rms_norm_*` in norm.cu, which waits for the kernel
        // before it first.
        unsafe { self.launch_maybe_early(early, &name, (x.rows as u32, 1, 1), threads, 0, stream, args) }
    }

    /// The step-boundary row kernels' rows (all of one width) and vectors: one group of 8 columns
    /// per thread in 16-byte pieces (aligned rows and vectors, at most 8192 columns).
    fn row_pieces(rows: &[Mat], vectors: &[DevPtr]) -> bool {
        let pieces = |m: &Mat| m.ptr % 16 == 0 && (m.stride * m.dtype.size()) % 16 == 0 && m.cols % 8 == 0;
        rows.iter().all(|m| pieces(m) && m.cols == rows[0].cols && m.cols / 8 <= 1024) && vectors.iter().all(|p| p % 16 == 0)
    }

    /// Whether [`Kernels::gated_residual_rms_norm_product`] takes these operands (`vectors`: the
    /// two modulations and the weight): an f32 residual and an f32 product over the same rows
    /// of at most [`ROW_PRODUCT_MAX`] columns.
    pub fn gated_residual_rms_norm_product_fits(out: &Mat, x: &Mat, y: &Mat, vectors: &[DevPtr], acc: &Mat) -> bool {
        [x.dtype, acc.dtype] == [Dtype::F32; 2]
            && acc.rows == x.rows
            && (1..=ROW_PRODUCT_MAX).contains(&acc.cols)
            && Self::row_pieces(&[*x, *y, *out], vectors)
    }

    /// Whether [`Kernels::product_rms_norm`] takes these operands (`vectors`: the weight, bias
    /// and modulation, null where absent): f32 rows from an f32 input of [`ROW_PRODUCT_MAX`]
    /// columns in 16-byte aligned rows.
    pub fn product_rms_norm_fits(out: &Mat, x: &Mat, a: &Mat, vectors: &[DevPtr]) -> bool {
        [x.dtype, a.dtype] == [Dtype::F32; 2]
            && a.rows == x.rows
            && a.cols == ROW_PRODUCT_MAX
            && a.ptr % 16 == 0
            && (a.stride * 4) % 16 == 0
            && Self::row_pieces(&[*x, *out], vectors)
    }

    /// `x += y ⊙ gate(gate_modulation)`, `out = rms(x) · (1 + scale) + shift` with
    /// `norm_modulation`, then `acc (+)= bf16(out) · wᵀ + bias` (w bf16 `[acc.cols, x.cols]`,
    /// bias f32 `acc.cols`), one launch of one block per row: the end of an Euler step.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's signature: the norm's and the product's operands
    pub unsafe fn gated_residual_rms_norm_product(
        &self,
        norm: (Mat, Mat, Mat),
        gate_modulation: DevPtr,
        norm_modulation: DevPtr,
        eps: f32,
        w: DevPtr,
        bias: Option<DevPtr>,
        (acc, accumulate): (Mat, bool),
        stream: CUstream,
    ) -> Result<()> {
        let (out, x, y) = norm;
        let what = "gated_residual_rms_norm_product";
        Self::same_shape(what, &x, &y)?;
        Self::same_shape(what, &x, &out)?;
        if !Self::gated_residual_rms_norm_product_fits(&out, &x, &y, &[gate_modulation, norm_modulation, w], &acc) {
            return Err(shape_error(
                what,
                format!(
                    "needs an f32 residual {}x{} (16-byte aligned rows and vectors) and an f32 product of at most \
                     {ROW_PRODUCT_MAX} columns over its rows, got {:?} and {:?} {}x{}",
                    x.rows, x.cols, x.dtype, acc.dtype, acc.rows, acc.cols
                ),
            ));
        }
        let threads = Self::row_threads(x.cols);
        let name = format!("{what}_{}_{}", y.dtype.suffix(), out.dtype.suffix());
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(y.ptr),
            Arg::I(i32_of(y.stride, &name)?),
            Arg::P(gate_modulation),
            Arg::P(norm_modulation),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
            Arg::P(w),
            Arg::P(bias.unwrap_or(0)),
            Arg::P(acc.ptr),
            Arg::I(i32_of(acc.stride, &name)?),
            Arg::I(acc.cols as i32),
            Arg::I(accumulate as i32),
        ];
        // SAFETY: matches `gated_residual_rms_norm_product_*` in norm.cu (null bias: none).
        unsafe { self.launch(&name, (x.rows as u32, 1, 1), threads, stream, args) }
    }

    /// `x = bf16(a) · wᵀ + bias` (a f32 `[rows, 32]`, w bf16 `[x.cols, 32]`, bias f32 `x.cols`),
    /// then `out = rms(x)`, `· (1 + scale) + shift` with `modulation`, one launch of one block
    /// per row: the start of an Euler step.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // mirrors the kernel's signature
    pub unsafe fn product_rms_norm(
        &self,
        out: Mat,
        x: Mat,
        a: Mat,
        w: DevPtr,
        bias: Option<DevPtr>,
        modulation: Option<DevPtr>,
        eps: f32,
        stream: CUstream,
    ) -> Result<()> {
        let what = "product_rms_norm";
        Self::same_shape(what, &x, &out)?;
        if !Self::product_rms_norm_fits(&out, &x, &a, &[w, bias.unwrap_or(0), modulation.unwrap_or(0)]) {
            return Err(shape_error(
                what,
                format!(
                    "needs f32 rows {}x{} (16-byte aligned rows and vectors) from an f32 input of {ROW_PRODUCT_MAX} columns in \
                     16-byte aligned rows, got {:?} from {:?} {}x{}",
                    x.rows, x.cols, x.dtype, a.dtype, a.rows, a.cols
                ),
            ));
        }
        let threads = Self::row_threads(x.cols);
        let name = format!("{what}_{}", out.dtype.suffix());
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(x.ptr),
            Arg::I(i32_of(x.stride, &name)?),
            Arg::P(a.ptr),
            Arg::I(i32_of(a.stride, &name)?),
            Arg::P(w),
            Arg::P(bias.unwrap_or(0)),
            Arg::P(modulation.unwrap_or(0)),
            Arg::I(i32_of(x.cols, &name)?),
            Arg::F(eps),
        ];
        // SAFETY: matches `product_rms_norm_*` in norm.cu (null bias or modulation: none).
        unsafe { self.launch(&name, (x.rows as u32, 1, 1), threads, stream, args) }
    }
}
