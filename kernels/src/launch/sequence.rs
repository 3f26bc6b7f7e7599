//! Launchers of the sequence kernels (sequence.cu): validity and RoPE positions of every slot,
//! the prompt bucket switch, RoPE rows, and rotary embedding into the K/V cache.

use super::*;

/// Arguments of [`Kernels::rope_qkv`] besides the stream.
#[derive(Clone, Copy, Debug)]
pub struct RopeArgs {
    /// `[rows, (heads + 2 · kv_heads) · head_dim]`: q heads, then k heads, then v heads; the
    /// caches hold `kv_heads · head_dim` columns.
    pub qkv: Mat,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// i32 positions: row `r` uses table row `positions[position_offset + r]`; `None`: the tables
    /// hold the sequence's rows ([`Kernels::rope_rows_gather`]) and row `r` uses row
    /// `position_offset + r`.
    pub positions: Option<DevPtr>,
    pub position_offset: usize,
    pub k_cache: Mat,
    pub v_cache: Mat,
    pub cache_row: usize,
    /// f32 `[position][head_dim / 2]` tables (or `[slot][head_dim / 2]` rows, see `positions`).
    pub cos: DevPtr,
    pub sin: DevPtr,
    /// Launched as the programmatic dependent of the kernel before it on the stream (sm_90 on),
    /// which must not write the tables or positions: it loads them, then waits for that kernel.
    pub early: bool,
    /// Pairs that turn by different positions of their row ([`MultiAxis`]); `None`: one position
    /// per row.
    pub multi_axis: Option<MultiAxis>,
}

/// Which position of its row each rotation pair turns by (sequence.cu's `rope_qkv_axes`): the
/// positions hold one row of `slots` per axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MultiAxis {
    /// Qwen3-VL's interleaved M-RoPE with these height and width sections (t, h, w rows).
    Interleaved { slots: usize, height: usize, width: usize },
    /// Qwen3-VL's vision RoPE: the first half of the pairs by row 0, the rest by row 1.
    Rows2d { slots: usize },
}

/// Most prompt buckets one `prompt_bucket_256` launch picks among.
pub const MAX_PROMPT_BUCKETS: usize = 4;

impl Kernels {
    /// Sets the IF-node handle of the prompt bucket this step runs to 1 and the others to 0
    /// (`prompt_bucket_256`: the smallest of `buckets`, ascending slot counts, that holds the
    /// last valid slot of `token_mask`). Only meaningful in a captured graph that owns `handles`.
    ///
    /// # Safety
    /// `token_mask` must point to `prompt_len` i32 on the device; `handles` must belong to the
    /// graph under capture.
    pub unsafe fn prompt_bucket(
        &self,
        token_mask: DevPtr,
        prompt_len: usize,
        buckets: &[usize],
        handles: &[u64],
        stream: CUstream,
    ) -> Result<()> {
        let name = "prompt_bucket_256";
        if buckets.is_empty() || buckets.len() > MAX_PROMPT_BUCKETS || handles.len() != buckets.len() {
            return Err(shape_error(
                name,
                format!("{} buckets with {} handles (1 to {MAX_PROMPT_BUCKETS} each)", buckets.len(), handles.len()),
            ));
        }
        let (mut b, mut h) = ([0i32; MAX_PROMPT_BUCKETS], [0u64; MAX_PROMPT_BUCKETS]);
        for (i, (&bucket, &handle)) in buckets.iter().zip(handles).enumerate() {
            (b[i], h[i]) = (i32_of(bucket, name)?, handle);
        }
        let args = [
            Arg::P(token_mask),
            Arg::I(i32_of(prompt_len, name)?),
            Arg::I(buckets.len() as i32),
            Arg::I(b[0]),
            Arg::I(b[1]),
            Arg::I(b[2]),
            Arg::I(b[3]),
            Arg::P(h[0]),
            Arg::P(h[1]),
            Arg::P(h[2]),
            Arg::P(h[3]),
        ];
        // SAFETY: matches `prompt_bucket_256` in sequence.cu (one block of 256 threads).
        unsafe { self.launch(name, (1, 1, 1), 256, stream, args) }
    }

    /// Validity flags (f32) and RoPE positions (i32) of the `cameras · tokens_per_image +
    /// prompt_len + suffix` slots, from the frame info and the prompt token mask.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated lengths.
    #[allow(clippy::too_many_arguments)] // the op's own fields, one to one
    pub unsafe fn positions(
        &self,
        valid: DevPtr,
        positions: DevPtr,
        frame_info: DevPtr,
        cameras: usize,
        tokens_per_image: usize,
        token_mask: DevPtr,
        prompt_len: usize,
        suffix: usize,
        stream: CUstream,
    ) -> Result<()> {
        let name = "positions_scan_1024";
        let args = [
            Arg::P(valid),
            Arg::P(positions),
            Arg::P(frame_info),
            Arg::I(i32_of(cameras, name)?),
            Arg::I(i32_of(tokens_per_image, name)?),
            Arg::P(token_mask),
            Arg::I(i32_of(prompt_len, name)?),
            Arg::I(i32_of(suffix, name)?),
        ];
        // SAFETY: matches `positions_scan_1024` in sequence.cu (one block of 1024 threads).
        unsafe { self.launch(name, (1, 1, 1), 1024, stream, args) }
    }

    /// The RoPE table rows of the sequence's `slots` slots: `cos_rows[s] = cos[positions[s]]` (and
    /// sin), `half` f32 each, for [`RopeArgs`] without positions.
    ///
    /// # Safety
    /// All pointers must be live device memory: `slots` positions, tables with a row for each of
    /// them, and `slots · half` f32 for each output.
    #[allow(clippy::too_many_arguments)] // two outputs, the positions and two tables, one to one
    pub unsafe fn rope_rows_gather(
        &self,
        cos_rows: DevPtr,
        sin_rows: DevPtr,
        positions: DevPtr,
        slots: usize,
        cos: DevPtr,
        sin: DevPtr,
        half: usize,
        stream: CUstream,
    ) -> Result<()> {
        let name = "rope_rows_gather";
        if half % 4 != 0 || [cos_rows, sin_rows, cos, sin].iter().any(|p| p % 16 != 0) || slots == 0 {
            return Err(shape_error(name, format!("needs 16-byte aligned tables of a multiple of 4 columns, got {half} columns")));
        }
        let args = [Arg::P(cos_rows), Arg::P(sin_rows), Arg::P(positions), Arg::P(cos), Arg::P(sin), Arg::I(i32_of(half, name)?)];
        let threads = (half / 4).div_ceil(32).clamp(1, 8) as u32 * 32;
        // SAFETY: matches `rope_rows_gather` in sequence.cu: one block per slot.
        unsafe { self.launch(name, (i32_of(slots, name)? as u32, 1, 1), threads, stream, args) }
    }

    /// Rotary embedding of q (in place) and k, k and v written into the caches.
    ///
    /// # Safety
    /// All pointers must be live device memory; the caches must have `cache_row + qkv.rows` rows
    /// and the tables a row for every position the buffer holds.
    pub unsafe fn rope_qkv(&self, a: &RopeArgs, stream: CUstream) -> Result<()> {
        let base = if a.multi_axis.is_some() { "rope_qkv_axes" } else { "rope_qkv" };
        let name = format!("{base}_{}", a.qkv.dtype.suffix());
        if a.k_cache.dtype != a.qkv.dtype
            || a.v_cache.dtype != a.qkv.dtype
            || a.kv_heads == 0
            || a.qkv.cols < (a.heads + 2 * a.kv_heads) * a.head_dim
            || a.k_cache.cols < a.kv_heads * a.head_dim
            || a.v_cache.cols < a.kv_heads * a.head_dim
            || a.head_dim % 2 != 0
        {
            return Err(shape_error(
                &name,
                format!(
                    "qkv {:?} / caches {:?} {:?} do not fit {} query and {} K/V heads of {}",
                    a.qkv, a.k_cache, a.v_cache, a.heads, a.kv_heads, a.head_dim
                ),
            ));
        }
        if let Some(axes) = a.multi_axis {
            let Some(positions) = a.positions else { return Err(shape_error(&name, "multi-axis RoPE reads its positions".into())) };
            let (mode, slots, height, width) = match axes {
                MultiAxis::Interleaved { slots, height, width } => (1, slots, height, width),
                MultiAxis::Rows2d { slots } => (2, slots, 0, 0),
            };
            let args = [
                Arg::P(a.qkv.ptr),
                Arg::I(i32_of(a.qkv.stride, &name)?),
                Arg::I(i32_of(a.heads, &name)?),
                Arg::I(i32_of(a.kv_heads, &name)?),
                Arg::I(i32_of(a.head_dim, &name)?),
                Arg::P(positions),
                Arg::I(i32_of(a.position_offset, &name)?),
                Arg::I(i32_of(slots, &name)?),
                Arg::I(mode),
                Arg::I(i32_of(height, &name)?),
                Arg::I(i32_of(width, &name)?),
                Arg::P(a.k_cache.ptr),
                Arg::I(i32_of(a.k_cache.stride, &name)?),
                Arg::P(a.v_cache.ptr),
                Arg::I(i32_of(a.v_cache.stride, &name)?),
                Arg::I(i32_of(a.cache_row, &name)?),
                Arg::P(a.cos),
                Arg::P(a.sin),
            ];
            let threads = ((a.heads + a.kv_heads) * a.head_dim / 2).max(a.kv_heads * a.head_dim).div_ceil(32).clamp(1, 8) as u32 * 32;
            // SAFETY: matches `rope_qkv_axes_*` in sequence.cu (a plain launch: it waits for nothing).
            return unsafe { self.launch(&name, (a.qkv.rows as u32, 1, 1), threads, stream, args) };
        }
        // 8 pairs (or 8 values of v) per thread when every piece is 16-byte aligned, the tables'
        // rows included (head_dim / 2 f32 apart).
        let vectors = a.head_dim % 16 == 0
            && Self::columns_per_thread(&[(a.qkv, a.head_dim / 2), (a.k_cache, a.head_dim / 2), (a.v_cache, 0)]) == 8
            && [a.cos, a.sin].iter().all(|p| p % 16 == 0);
        let (rotated, kv_width) = (a.heads + a.kv_heads, a.kv_heads * a.head_dim);
        let vector_threads = rotated * a.head_dim / 16 + kv_width / 8;
        let (per, threads) = if vectors && vector_threads <= 1024 {
            (8, vector_threads.div_ceil(32) as u32 * 32)
        } else {
            (1, (rotated * a.head_dim / 2).max(kv_width).div_ceil(32).clamp(1, 8) as u32 * 32)
        };
        let args = [
            Arg::P(a.qkv.ptr),
            Arg::I(i32_of(a.qkv.stride, &name)?),
            Arg::I(i32_of(a.heads, &name)?),
            Arg::I(i32_of(a.kv_heads, &name)?),
            Arg::I(i32_of(a.head_dim, &name)?),
            Arg::P(a.positions.unwrap_or(0)),
            Arg::I(i32_of(a.position_offset, &name)?),
            Arg::P(a.k_cache.ptr),
            Arg::I(i32_of(a.k_cache.stride, &name)?),
            Arg::P(a.v_cache.ptr),
            Arg::I(i32_of(a.v_cache.stride, &name)?),
            Arg::I(i32_of(a.cache_row, &name)?),
            Arg::P(a.cos),
            Arg::P(a.sin),
            Arg::I(per),
        ];
        // SAFETY: matches `rope_qkv_*` in sequence.cu, which reads qkv only after waiting for the
        // kernel before it.
        unsafe { self.launch_maybe_early(a.early, &name, (a.qkv.rows as u32, 1, 1), threads, 0, stream, args) }
    }
}
