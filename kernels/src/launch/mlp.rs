//! Launchers of the streamed kernels (mlp.cu, sm_90a): the action expert's MLP (gate/up, GeGLU
//! and down in one persistent launch, bf16 or e4m3), its single few-row FP8 products (the QKV
//! one with its RoPE), and the weight retiling they read.

use super::*;
use crate::RopeArgs;

/// The calibrated per-tensor scales of an MLP that [`Kernels::mlp_stream`] runs in FP8 (W8A8, as
/// the CPU emulation's products): its input into e4m3 times `1 / gate_up.activation`, gate/up's
/// sums times `gate_up.activation · gate_up.weight`, the GeGLU output into e4m3 times
/// `1 / down.activation`, down's sums times `down.activation · down.weight`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlpFp8Scales {
    /// Gate/up's (activation, weight) scales.
    pub gate_up: (f32, f32),
    /// Down's (activation, weight) scales.
    pub down: (f32, f32),
}

/// A chunk's columns of A and the most chunks a block holds: 64 bf16 columns, up to
/// MLP_A_CHUNKS; 128 e4m3 ones, up to MLP_E4M3_A_CHUNKS (mlp.cu: the rest of A's space stages
/// the bf16 rows being quantized).
fn a_chunks(fp8: bool) -> (usize, usize) {
    if fp8 { (128, MLP_E4M3_A_CHUNKS) } else { (64, MLP_A_CHUNKS) }
}

/// The largest split of `k_chunks` chunks of K over the blocks (a divisor) that gives
/// `out_tiles` × split units no more than `blocks` and each unit at most `most_chunks` chunks:
/// how the streamed down product and the streamed products share K out.
fn k_split(k_chunks: usize, out_tiles: usize, blocks: usize, most_chunks: usize) -> Option<usize> {
    (1..=k_chunks).rev().find(|&s| k_chunks % s == 0 && out_tiles * s <= blocks && k_chunks / s <= most_chunks)
}

/// Most e4m3 chunks of A a block of the FP8 forms holds (mlp.cu's MLP_E4M3_A_CHUNKS).
const MLP_E4M3_A_CHUNKS: usize = 8;

impl Kernels {
    /// The K split of the down product when [`Kernels::mlp_stream`] runs an MLP of `rows` rows,
    /// `width` features and `hidden` GeGLU features on this device (`multiprocessors` SMs), in
    /// bf16 or (`fp8`) e4m3, or `None` when it cannot: not sm_90a, more than 64 rows, widths not
    /// whole tiles (64 columns; K chunks of 64 in bf16, 128 in e4m3), A chunks past what a block
    /// holds, or more blocks (hidden / 32, one per SM) than SMs. The split is the largest that
    /// gives down no more units than there are blocks.
    pub fn mlp_stream_splits(&self, rows: usize, width: usize, hidden: usize, multiprocessors: usize, fp8: bool) -> Option<usize> {
        let (chunk_k, most_chunks) = a_chunks(fp8);
        let (width_chunks, hidden_chunks, out_tiles, blocks) = (width / chunk_k, hidden / chunk_k, width / 64, hidden / 32);
        if !self.mlp_stream
            || !(1..=64).contains(&rows)
            || width % chunk_k != 0
            || hidden % chunk_k != 0
            || !(1..=most_chunks).contains(&width_chunks)
            || blocks > multiprocessors
        {
            return None;
        }
        k_split(hidden_chunks, out_tiles, blocks, most_chunks)
    }

    /// The few-row MLP `out = (gelu(a · w_gateᵀ) ⊙ (a · w_upᵀ)) · w_downᵀ` in one cooperative
    /// launch (mlp.cu), `hidden` receiving the GeGLU output and `out` (f32) overwritten. In bf16,
    /// or with `fp8` in e4m3 with those scales: the weights then e4m3, `a` bf16 (quantized as it
    /// loads) or e4m3 (already divided by its scale), and `hidden` (a bf16 buffer) holding the
    /// GeGLU output's e4m3 codes in the first `cols` bytes of each row.
    /// The weights must be tiled by [`Kernels::retile_weight`] (gate/up paired); `barrier` is a
    /// device word no concurrent launch uses. `programmatic`: launched as a programmatic dependent
    /// of the kernel before it on the stream, which must be the RMS norm writing `a` (it lets the
    /// MLP start early; the MLP waits for it before reading `a`). `fast_accumulation` (FP8 only):
    /// the products sum all of K in the MMA's accumulator, else each 128-deep chunk apart and
    /// added in f32 (as the CPU emulation; slower).
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
        fp8: Option<MlpFp8Scales>,
        fast_accumulation: bool,
        multiprocessors: usize,
        programmatic: bool,
        stream: CUstream,
    ) -> Result<()> {
        let what = if fp8.is_some() { "mlp_stream_wgmma_e4m3" } else { "mlp_stream_wgmma" };
        let (rows, width, hid) = (a.rows, a.cols, hidden.cols);
        let splits = self.mlp_stream_splits(rows, width, hid, multiprocessors, fp8.is_some());
        let aligned = |m: &Mat, bytes: u64| m.ptr % 16 == 0 && (m.stride as u64 * m.dtype.size() as u64) % bytes == 0;
        let a_e4m3 = a.dtype == Dtype::E4m3 && fp8.is_some();
        let Some(splits) = splits.filter(|_| {
            (a.dtype == Dtype::Bf16 || a_e4m3)
                && (hidden.dtype, out.dtype) == (Dtype::Bf16, Dtype::F32)
                && (hidden.rows, out.rows, out.cols) == (rows, rows, width)
                && aligned(&a, 16)
                && aligned(&hidden, 16)
                && aligned(&out, 16)
                && barrier % 4 == 0
        }) else {
            let chunk = if fp8.is_some() { "128·(1-16)" } else { "64·(1-16)" };
            return Err(shape_error(
                what,
                format!(
                    "needs bf16 (FP8: or e4m3) a [1-64 rows, {chunk}], bf16 hidden [rows, {chunk}], f32 out [rows, a's width], 16-byte aligned \
                     rows, sm_90a with hidden / 32 ≤ {multiprocessors} SMs; got a {}x{} {:?}, hidden {}x{} {:?}, out {}x{} {:?}",
                    a.rows, a.cols, a.dtype, hidden.rows, hidden.cols, hidden.dtype, out.rows, out.cols, out.dtype
                ),
            ));
        };
        let hidden_stride = if fp8.is_some() { 2 * hidden.stride } else { hidden.stride };
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, what)?),
            Arg::P(hidden.ptr),
            Arg::I(i32_of(hidden_stride, what)?),
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
        let mut attrs = [cooperative_attribute(), programmatic_attribute()];
        let attrs = if programmatic { &mut attrs[..] } else { &mut attrs[..1] };
        let grid = ((hid / 32) as u32, 1, 1);
        // SAFETY: the arguments match the kernel's signature (the FP8 form's four scales, its A
        // flag and its promotion flag after the bf16 form's arguments, its hidden stride in
        // bytes): 160 threads, one block per 32 GeGLU columns; it waits for the norm before it
        // (programmatic) before reading `a`.
        unsafe {
            match fp8 {
                None => self.launch_with_attributes(what, grid, 160, MLP_SHARED_BYTES, stream, args, attrs),
                Some(MlpFp8Scales { gate_up: (a_scale, w_scale), down: (h_scale, d_scale) }) => {
                    let scales = [
                        Arg::F(1.0 / a_scale),
                        Arg::F(a_scale * w_scale),
                        Arg::F(1.0 / h_scale),
                        Arg::F(h_scale * d_scale),
                        Arg::I(a_e4m3 as i32),
                        Arg::I(!fast_accumulation as i32),
                    ];
                    let mut all = [Arg::I(0); 19];
                    all[..13].copy_from_slice(&args);
                    all[13..].copy_from_slice(&scales);
                    self.launch_with_attributes(what, grid, 160, MLP_SHARED_BYTES, stream, all, attrs)
                }
            }
        }
    }

    /// The K split when [`Kernels::product_stream`] runs a product of `rows` rows, `n` outputs
    /// and depth `k` on this device, or `None` when it cannot: not sm_90a, more than 64 rows, `n`
    /// not whole 64-column tiles, `k` not whole 128-column chunks or no split whose chunks a
    /// block holds. The split is the largest that keeps one block per SM.
    pub fn product_stream_splits(&self, rows: usize, n: usize, k: usize, multiprocessors: usize) -> Option<usize> {
        let (chunk_k, most_chunks) = a_chunks(true);
        let (out_tiles, k_chunks) = (n / 64, k / chunk_k);
        if !self.mlp_stream || !(1..=64).contains(&rows) || n % 64 != 0 || k % chunk_k != 0 || k == 0 || out_tiles > multiprocessors {
            return None;
        }
        k_split(k_chunks, out_tiles, multiprocessors, most_chunks)
    }

    /// The few-row FP8 product `out = a · wᵀ` (f32, no bias, overwritten) streamed as the MLP's
    /// down is (mlp.cu's `product_stream_wgmma_e4m3`), `scales` = (input scale, weight scale),
    /// `a` bf16 (quantized as it loads) or e4m3 (already divided by its scale). `w` must be tiled in e4m3 by [`Kernels::retile_weight`]
    /// (unpaired); `barrier` is a device word no concurrent launch uses. `programmatic`: launched
    /// as a programmatic dependent of the kernel before it on the stream, which writes `a` (the
    /// product waits for it before reading `a` or writing `out`). `out_zeroed`: `out` holds zeros
    /// when the product starts (the kernel that read it last left them,
    /// [`Kernels::gated_residual_rms_norm`]'s `zero_y`), so the K splits add into it at once, with
    /// no zeroing and no grid barrier. `fast_accumulation` as [`Kernels::mlp_stream`]'s.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // the op's operands and shape, one to one
    pub unsafe fn product_stream(
        &self,
        out: Mat,
        a: Mat,
        w: DevPtr,
        barrier: DevPtr,
        (a_scale, w_scale): (f32, f32),
        fast_accumulation: bool,
        multiprocessors: usize,
        programmatic: bool,
        out_zeroed: bool,
        stream: CUstream,
    ) -> Result<()> {
        let (rows, n, k) = (a.rows, out.cols, a.cols);
        let what = "product_stream_wgmma_e4m3";
        let aligned = |m: &Mat| m.ptr % 16 == 0 && (m.stride * m.dtype.size()) % 16 == 0;
        let splits = self.product_stream_splits(rows, n, k, multiprocessors);
        let Some(splits) = splits.filter(|_| {
            matches!(a.dtype, Dtype::Bf16 | Dtype::E4m3)
                && out.dtype == Dtype::F32
                && out.rows == rows
                && aligned(&a)
                && aligned(&out)
                && barrier % 4 == 0
        }) else {
            return Err(shape_error(
                what,
                format!(
                    "needs bf16 or e4m3 a [1-64 rows, 128·n], f32 out [rows, 64·n], 16-byte aligned rows, sm_90a with n / 64 ≤ \
                     {multiprocessors} SMs; got a {}x{} {:?}, out {}x{} {:?}",
                    a.rows, a.cols, a.dtype, out.rows, out.cols, out.dtype
                ),
            ));
        };
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, what)?),
            Arg::P(a.ptr),
            Arg::I(i32_of(a.stride, what)?),
            Arg::P(w),
            Arg::I(rows as i32),
            Arg::I(i32_of(n, what)?),
            Arg::I(i32_of(k, what)?),
            Arg::I(splits as i32),
            Arg::P(barrier),
            Arg::F(1.0 / a_scale),
            Arg::F(a_scale * w_scale),
            Arg::I((a.dtype == Dtype::E4m3) as i32),
            Arg::I(!fast_accumulation as i32),
            Arg::I(out_zeroed as i32),
        ];
        // Splits that zero `out` meet at a grid barrier: cooperative, so all blocks are resident
        // at once.
        let mut attrs = [cooperative_attribute(), programmatic_attribute()];
        let attrs = match (splits > 1 && !out_zeroed, programmatic) {
            (true, true) => &mut attrs[..],
            (true, false) => &mut attrs[..1],
            (false, true) => &mut attrs[1..],
            (false, false) => &mut attrs[..0],
        };
        // SAFETY: the arguments match `product_stream_wgmma_e4m3`'s signature (its A, promotion
        // and zeroed-output flags last): 160 threads, one block per output tile and split.
        unsafe { self.launch_with_attributes(what, ((n / 64 * splits) as u32, 1, 1), 160, MLP_SHARED_BYTES, stream, args, attrs) }
    }

    /// Whether [`Kernels::qkv_rope_stream`] runs a QKV product of `rows` rows, `n` outputs and
    /// depth `k` with RoPE over heads of `head_dim` on this device: sm_90a, at most 64 rows,
    /// heads of whole 64-column tiles, `k` whole 128-column chunks a block holds (at most 16),
    /// one block per tile within `multiprocessors` SMs.
    pub fn qkv_rope_stream_fits(&self, rows: usize, n: usize, k: usize, head_dim: usize, multiprocessors: usize) -> bool {
        self.mlp_stream
            && (1..=64).contains(&rows)
            && head_dim > 0
            && head_dim % 64 == 0
            && n % head_dim == 0
            && n / 64 <= multiprocessors
            && k % 128 == 0
            && (1..=MLP_A_CHUNKS).contains(&(k / 128))
    }

    /// The few-row QKV product `qkv = (a · wᵀ) · a_scale · w_scale` and its RoPE (`rope`, whose
    /// `qkv` it writes) in one FP8 launch (mlp.cu's `qkv_rope_stream_wgmma_e4m3`): `a` in e4m3,
    /// already divided by its scale (its norm writes it so), `w` tiled in e4m3 by
    /// [`Kernels::retile_weight`] with `paired_half` = head_dim / 2. It leaves what
    /// [`Kernels::rope_qkv`] after the product would (the q heads rotated in place, the k heads
    /// rotated and the v heads into the caches, the k and v heads unrotated in `qkv`), rotating
    /// the f32 sums. `programmatic`: launched as a programmatic dependent of the kernel before it
    /// on the stream, which writes `a` (it waits for it before reading `a`) and must not write the
    /// positions or the tables (it loads their entries before it waits, as [`RopeArgs::early`]
    /// RoPE does). `fast_accumulation` as [`Kernels::mlp_stream`]'s.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes; the caches must have
    /// `cache_row + a.rows` rows and the tables a row for every position the positions hold.
    #[allow(clippy::too_many_arguments)] // the product's operands and the RoPE it ends with
    pub unsafe fn qkv_rope_stream(
        &self,
        a: Mat,
        w: DevPtr,
        (a_scale, w_scale): (f32, f32),
        fast_accumulation: bool,
        rope: &RopeArgs,
        multiprocessors: usize,
        programmatic: bool,
        stream: CUstream,
    ) -> Result<()> {
        let what = "qkv_rope_stream_wgmma_e4m3";
        let (rows, n, k) = (a.rows, (rope.heads + 2 * rope.kv_heads) * rope.head_dim, a.cols);
        let aligned = |m: &Mat| m.ptr % 16 == 0 && (m.stride * m.dtype.size()) % 16 == 0;
        let even = |m: &Mat| m.ptr % 4 == 0 && m.stride % 2 == 0;
        let fits = self.qkv_rope_stream_fits(rows, n, k, rope.head_dim, multiprocessors)
            && a.dtype == Dtype::E4m3
            && aligned(&a)
            && [rope.qkv.dtype, rope.k_cache.dtype, rope.v_cache.dtype] == [Dtype::Bf16; 3]
            && (rope.qkv.rows, rope.qkv.cols) == (rows, n)
            && rope.k_cache.cols >= rope.kv_heads * rope.head_dim
            && rope.v_cache.cols >= rope.kv_heads * rope.head_dim
            && rope.kv_heads > 0
            && [&rope.qkv, &rope.k_cache, &rope.v_cache].into_iter().all(even)
            && rope.cos % 8 == 0
            && rope.sin % 8 == 0
            && rope.multi_axis.is_none();
        if !fits {
            return Err(shape_error(
                what,
                format!(
                    "needs e4m3 a [1-64 rows, 128·(1-16)] (16-byte aligned rows), bf16 qkv [rows, (heads + 2·kv_heads)·head_dim] \
                     and caches, head_dim a multiple of 64, one position per row, 8-byte aligned tables, sm_90a with n / 64 ≤ {multiprocessors} SMs; got \
                     a {}x{} {:?}, qkv {}x{} {:?}, {} + 2·{} heads of {}",
                    a.rows, a.cols, a.dtype, rope.qkv.rows, rope.qkv.cols, rope.qkv.dtype, rope.heads, rope.kv_heads, rope.head_dim
                ),
            ));
        }
        let args = [
            Arg::P(rope.qkv.ptr),
            Arg::I(i32_of(rope.qkv.stride, what)?),
            Arg::P(a.ptr),
            Arg::I(i32_of(a.stride, what)?),
            Arg::P(w),
            Arg::I(rows as i32),
            Arg::I(i32_of(k, what)?),
            Arg::F(a_scale * w_scale),
            Arg::I(i32_of(rope.heads, what)?),
            Arg::I(i32_of(rope.kv_heads, what)?),
            Arg::I(i32_of(rope.head_dim, what)?),
            Arg::P(rope.positions.unwrap_or(0)),
            Arg::I(i32_of(rope.position_offset, what)?),
            Arg::P(rope.k_cache.ptr),
            Arg::I(i32_of(rope.k_cache.stride, what)?),
            Arg::P(rope.v_cache.ptr),
            Arg::I(i32_of(rope.v_cache.stride, what)?),
            Arg::I(i32_of(rope.cache_row, what)?),
            Arg::P(rope.cos),
            Arg::P(rope.sin),
            Arg::I(!fast_accumulation as i32),
        ];
        let mut attrs = [programmatic_attribute()];
        let attrs = if programmatic { &mut attrs[..] } else { &mut attrs[..0] };
        // SAFETY: the arguments match `qkv_rope_stream_wgmma_e4m3`'s signature: 160 threads, one
        // block per 64 output columns.
        unsafe { self.launch_with_attributes(what, ((n / 64) as u32, 1, 1), 160, MLP_SHARED_BYTES, stream, args, attrs) }
    }

    /// Copies the row-major weight `src` (`n` rows of `row_bytes` bytes: bf16 or e4m3 values)
    /// into `out` as [`Kernels::mlp_stream`] reads it: 64-row tiles of 128 bytes per row,
    /// swizzled. With `paired_half` > 0 rows pair up within blocks of `2 · paired_half` rows
    /// (row j with row j + `paired_half`), each tile's rows 32-63 the partners of its rows 0-31:
    /// gate/up (one block) or the rotation pairs of RoPE's heads (a block per head).
    ///
    /// # Safety
    /// `out` and `src` must be live, disjoint device memory of `n · row_bytes` bytes.
    pub unsafe fn retile_weight(
        &self,
        out: DevPtr,
        src: DevPtr,
        n: usize,
        row_bytes: usize,
        paired_half: usize,
        stream: CUstream,
    ) -> Result<()> {
        let what = "retile_weight";
        let rows_ok = if paired_half > 0 { paired_half % 32 == 0 && n % (2 * paired_half) == 0 } else { n % 64 == 0 };
        if !rows_ok || row_bytes == 0 || row_bytes % 128 != 0 || out % 16 != 0 || src % 16 != 0 {
            return Err(shape_error(
                what,
                format!("{n} rows of {row_bytes} bytes (paired half {paired_half}) are not whole 64-row tiles of 128 bytes"),
            ));
        }
        let pieces = n * row_bytes / 16;
        let args =
            [Arg::P(out), Arg::P(src), Arg::I(i32_of(n, what)?), Arg::I(i32_of(row_bytes, what)?), Arg::I(i32_of(paired_half, what)?)];
        // SAFETY: matches `retile_weight` in mlp.cu: one thread per 16-byte piece.
        unsafe { self.launch(what, (pieces.div_ceil(256) as u32, 1, 1), 256, stream, args) }
    }
}
