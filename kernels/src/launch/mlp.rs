//! Launchers of the streamed MLP (mlp.cu, sm_90a): the action expert's gate/up, GeGLU and down
//! in one persistent launch, and the weight retiling it reads.

use super::*;

impl Kernels {
    /// The K split of the down product when [`Kernels::mlp_stream`] runs an MLP of `rows` rows,
    /// `width` features and `hidden` GeGLU features on this device (`multiprocessors` SMs), or
    /// `None` when it cannot: not sm_90a, more than 64 rows, widths not whole 64-column tiles, A
    /// chunks past what a block holds, or more blocks (hidden / 32, one per SM) than SMs. The
    /// split is the largest that gives down no more units than there are blocks.
    pub fn mlp_stream_splits(&self, rows: usize, width: usize, hidden: usize, multiprocessors: usize) -> Option<usize> {
        let (width_chunks, hidden_chunks, blocks) = (width / 64, hidden / 64, hidden / 32);
        if !self.mlp_stream
            || !(1..=64).contains(&rows)
            || width % 64 != 0
            || hidden % 64 != 0
            || !(1..=MLP_A_CHUNKS).contains(&width_chunks)
            || blocks > multiprocessors
        {
            return None;
        }
        (1..=hidden_chunks).rev().find(|&s| hidden_chunks % s == 0 && width_chunks * s <= blocks && hidden_chunks / s <= MLP_A_CHUNKS)
    }

    /// The few-row MLP `out = (gelu(a · w_gateᵀ) ⊙ (a · w_upᵀ)) · w_downᵀ` in one cooperative
    /// launch (mlp.cu), `hidden` receiving the GeGLU output (bf16) and `out` (f32) overwritten.
    /// The weights must be tiled by [`Kernels::retile_weight`] (gate/up paired); `barrier` is a
    /// device word no concurrent launch uses. `programmatic`: launched as a programmatic dependent
    /// of the kernel before it on the stream, which must be the RMS norm writing `a` (it lets the
    /// MLP start early; the MLP waits for it before reading `a`).
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // the op's operands and shape, one to one
    pub unsafe fn mlp_stream(
        &self,
        out: Mat,
        hidden: Mat,
        a: Mat,
        w_gate_up: DevPtr,
        w_down: DevPtr,
        barrier: DevPtr,
        multiprocessors: usize,
        programmatic: bool,
        stream: CUstream,
    ) -> Result<()> {
        let what = "mlp_stream_wgmma";
        let (rows, width, hid) = (a.rows, a.cols, hidden.cols);
        let splits = self.mlp_stream_splits(rows, width, hid, multiprocessors);
        let aligned = |m: &Mat, bytes: u64| m.ptr % 16 == 0 && (m.stride as u64 * m.dtype.size() as u64) % bytes == 0;
        let Some(splits) = splits.filter(|_| {
            (a.dtype, hidden.dtype, out.dtype) == (Dtype::Bf16, Dtype::Bf16, Dtype::F32)
                && (hidden.rows, out.rows, out.cols) == (rows, rows, width)
                && aligned(&a, 16)
                && aligned(&hidden, 16)
                && aligned(&out, 16)
                && barrier % 4 == 0
        }) else {
            return Err(shape_error(
                what,
                format!(
                    "needs bf16 a [1-64 rows, 64·(1-16)], bf16 hidden [rows, 64·n], f32 out [rows, a's width], 16-byte aligned rows, \
                     sm_90a with hidden / 32 ≤ {multiprocessors} SMs; got a {}x{} {:?}, hidden {}x{} {:?}, out {}x{} {:?}",
                    a.rows, a.cols, a.dtype, hidden.rows, hidden.cols, hidden.dtype, out.rows, out.cols, out.dtype
                ),
            ));
        };
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, what)?),
            Arg::P(hidden.ptr),
            Arg::I(i32_of(hidden.stride, what)?),
            Arg::P(a.ptr),
            Arg::I(i32_of(a.stride, what)?),
            Arg::P(w_gate_up),
            Arg::P(w_down),
            Arg::I(rows as i32),
            Arg::I(width as i32),
            Arg::I(i32_of(hid, what)?),
            Arg::I(splits as i32),
            Arg::P(barrier),
        ];
        // Cooperative: the blocks meet at a grid barrier, so all must be resident at once.
        // SAFETY: the attribute value is a plain C union; all-zero bytes are a valid value.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.cooperative = 1;
        let cooperative = sys::CUlaunchAttribute { id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, pad: [0; 4], value };
        let mut attrs = [cooperative, programmatic_attribute()];
        let attrs = if programmatic { &mut attrs[..] } else { &mut attrs[..1] };
        // SAFETY: the arguments match `mlp_stream_wgmma`'s signature: 160 threads, one block per 32
        // GeGLU columns; it waits for the norm before it (programmatic) before reading `a`.
        unsafe { self.launch_with_attributes(what, ((hid / 32) as u32, 1, 1), 160, MLP_SHARED_BYTES, stream, args, attrs) }
    }

    /// Copies the row-major bf16 weight `src` (`[n, k]`) into `out` as [`Kernels::mlp_stream`]
    /// reads it: 64 × 64 swizzled tiles, with `paired_half` > 0 each tile's rows 32-63 the rows
    /// `paired_half` below its rows 0-31 (gate/up).
    ///
    /// # Safety
    /// `out` and `src` must be live, disjoint device memory of `n · k` bf16.
    pub unsafe fn retile_weight(&self, out: DevPtr, src: DevPtr, n: usize, k: usize, paired_half: usize, stream: CUstream) -> Result<()> {
        let what = "retile_weight";
        let rows_ok = if paired_half > 0 { n == 2 * paired_half && paired_half % 32 == 0 } else { n % 64 == 0 };
        if !rows_ok || k == 0 || k % 64 != 0 || out % 16 != 0 || src % 16 != 0 {
            return Err(shape_error(what, format!("{n}x{k} (paired half {paired_half}) is not whole 64 x 64 tiles")));
        }
        let pieces = n * k / 8;
        let args = [Arg::P(out), Arg::P(src), Arg::I(i32_of(n, what)?), Arg::I(i32_of(k, what)?), Arg::I(i32_of(paired_half, what)?)];
        // SAFETY: matches `retile_weight` in mlp.cu: one thread per 16-byte piece.
        unsafe { self.launch(what, (pieces.div_ceil(256) as u32, 1, 1), 256, stream, args) }
    }
}
