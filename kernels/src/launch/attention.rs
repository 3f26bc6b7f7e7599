//! Launchers of the attention kernels: the masked softmax of the general path (softmax.cu), the
//! few-query multi-query flash attention (attention_mq256.cu) and the per-head-dimension forms over
//! a few hundred keys (attention_heads.cu).

use super::*;

/// Arguments of [`Kernels::attention_mq256`] besides the stream: softmax attention of `heads`
/// query heads of dimension 256 over one shared K/V head.
#[derive(Clone, Copy, Debug)]
pub struct AttentionArgs {
    /// `[queries, heads · 256]` bf16.
    pub q: Mat,
    /// `[keys, 256]` bf16 each.
    pub k: Mat,
    pub v: Mat,
    /// `[queries, heads · 256]` bf16, or e4m3 (several splits only, sm_89 on): an FP8 product's
    /// input, the merge's output times `out_scale`.
    pub out: Mat,
    /// 1, or the inverse input scale of the FP8 product that reads an e4m3 `out`.
    pub out_scale: f32,
    pub heads: usize,
    /// f32 per key (0 masks the key out) and per query (0 gives a zero output row).
    pub key_valid: Option<DevPtr>,
    pub query_valid: Option<DevPtr>,
    /// How the keys are split over blocks, from [`Kernels::attention_split`].
    pub split: AttentionSplit,
    /// f32 scratch of `split.partial_lens`: partial outputs, and two values (running max, sum)
    /// per split and row.
    pub partial_o: DevPtr,
    pub partial_ml: DevPtr,
    /// `Some(n)`: the kernel before this launch on the stream writes `q` and no key or value
    /// before key `n`, and lets its dependents start at once (`rope_qkv`). The Hopper form is then
    /// launched as its programmatic dependent and loads keys it does not write while it runs; other forms launch plainly.
    pub keys_ready: Option<usize>,
}

/// Arguments of [`Kernels::attention_heads`] besides the stream.
#[derive(Clone, Copy, Debug)]
pub struct HeadsAttentionArgs {
    /// `[rows, heads · head_dim]` bf16, like `out`.
    pub q: Mat,
    /// `[keys, kv_heads · head_dim]` bf16 each.
    pub k: Mat,
    pub v: Mat,
    pub out: Mat,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Row blocks that see only their own block of keys (the cameras of a vision tower).
    pub groups: usize,
    /// f32 per key (0 masks the key out) and per query (0 gives a zero output row), over all
    /// groups' keys and rows.
    pub key_valid: Option<DevPtr>,
    pub query_valid: Option<DevPtr>,
    /// `Some(offset)`: row `r` of a group sees only its keys `0..=r + offset`.
    pub causal: Option<usize>,
    /// What the output is multiplied by before it is stored: 1, or for an e4m3 `out` (head
    /// dimensions in [`HEADS_ATTENTION_E4M3`]) the inverse input scale of the FP8 product after it.
    pub out_scale: f32,
}

/// How [`Kernels::attention_mq256`] splits the keys of one attention over blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSplit {
    pub splits: usize,
    pub keys_per_split: usize,
    /// f32 elements of the partial outputs and of the (max, sum) pairs the splits leave for the
    /// merge kernel (none for one split).
    pub partial_lens: (usize, usize),
}

impl TensorMap {
    /// A map the kernel never reads (the mma.sync attention's unused arguments).
    const UNUSED: TensorMap = TensorMap([0; 16]);

    /// A bf16 matrix `[rows, 256]` (row stride `m.stride` elements) read in 64 × 64 boxes that land
    /// in shared memory with the 128-byte swizzle wgmma reads; rows past the end arrive as zeros.
    fn bf16_rows_64x64(m: &Mat, what: &str) -> Result<TensorMap> {
        let row_bytes = (m.stride * 2) as u64;
        Self::encode_bf16_256(m.ptr, [m.rows as u64, 1], [row_bytes, row_bytes * m.rows as u64], [64, 1], what)
    }

    /// The query rows of `q` (`[queries, heads · 256]`, row stride `q.stride`) as (query, head)
    /// pairs, read 64 pairs at a time (64 / `heads` queries, every head) in the same boxes; `None`
    /// when `heads` does not divide 64 (no box then spans a 64-row tile).
    fn bf16_query_heads_64(q: &Mat, heads: usize, what: &str) -> Result<Option<TensorMap>> {
        if heads == 0 || 64 % heads != 0 {
            return Ok(None);
        }
        let dims = [heads as u64, q.rows as u64];
        let strides = [(ATTENTION_HEAD_DIM * 2) as u64, (q.stride * 2) as u64];
        Self::encode_bf16_256(q.ptr, dims, strides, [heads as u32, (64 / heads) as u32], what).map(Some)
    }

    /// A rank-3 map `[outer[1], outer[0], 256]` of bf16 (byte strides `strides` of the two outer
    /// dimensions) in boxes of 64 × `boxes`, 128-byte swizzled; reads past any dimension's end
    /// arrive as zeros.
    fn encode_bf16_256(ptr: DevPtr, outer: [u64; 2], strides: [u64; 2], boxes: [u32; 2], what: &str) -> Result<TensorMap> {
        let mut map = TensorMap::UNUSED;
        let dims = [ATTENTION_HEAD_DIM as u64, outer[0], outer[1]];
        let (boxes, element_strides) = ([64, boxes[0], boxes[1]], [1u32; 3]);
        // SAFETY: the out-pointer is a 128-byte-aligned, 128-byte map; the arrays are as long as
        // the rank (3) asks (strides: rank - 1); the driver only encodes, it reads no memory.
        let status = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map as *mut TensorMap as *mut sys::CUtensorMap,
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                3,
                ptr as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        status.result().map_err(|e| KernelError::cuda(format!("{what}: tensor map of {dims:?} (strides {strides:?})"), e))?;
        Ok(map)
    }
}

impl Kernels {
    /// `p = softmax(s)` per row over valid keys: `s` f32 and `p` bf16, both dense
    /// `[heads · queries, keys]` (`shape = (rows, queries, keys)`); `key_valid` (f32 flags of the
    /// keys) masks keys, `query_valid` (f32 flags of the queries) zeroes the rows of invalid
    /// queries, and `causal: Some(offset)` masks the keys past `query + offset` of each row.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    #[allow(clippy::too_many_arguments)] // two matrices, their shape and three optional masks
    pub unsafe fn softmax_rows(
        &self,
        p: DevPtr,
        s: DevPtr,
        (rows, queries, keys): (usize, usize, usize),
        key_valid: Option<DevPtr>,
        query_valid: Option<DevPtr>,
        causal: Option<usize>,
        stream: CUstream,
    ) -> Result<()> {
        let name = "softmax_rows_masked_f32_bf16";
        if queries == 0 || rows % queries != 0 {
            return Err(shape_error(name, format!("{rows} rows are not whole heads of {queries} queries")));
        }
        let args = [
            Arg::P(p),
            Arg::P(s),
            Arg::I(i32_of(rows, name)?),
            Arg::I(i32_of(queries, name)?),
            Arg::I(i32_of(keys, name)?),
            Arg::P(key_valid.unwrap_or(0)),
            Arg::P(query_valid.unwrap_or(0)),
            Arg::I(causal.map_or(Ok(-1), |offset| i32_of(offset, name))?),
        ];
        // SAFETY: matches the kernel in softmax.cu: one warp per row, 8 rows per block.
        unsafe { self.launch(name, (rows.div_ceil(8) as u32, 1, 1), 256, stream, args) }
    }

    /// Whether [`Kernels::attention_mq256`] and [`Kernels::attention_heads`] can run on this
    /// device: the device granted each its shared memory per block (up to 178 KB from sm_90 on,
    /// 153 KB for `attention_hd128`; not sm_86/sm_89/sm_120, 99 KB).
    pub fn has_fused_attention(&self) -> bool {
        self.fused_attention
    }

    /// How to split `keys` for `rows` (query × head) rows so that about `target_blocks` blocks
    /// run; few rows (the action tokens) take several splits. Scratch sizing at open and the
    /// lowering both ask here.
    pub fn attention_split(rows: usize, keys: usize, target_blocks: usize) -> AttentionSplit {
        let (row_tiles, chunks) = (rows.div_ceil(ATTENTION_ROWS).max(1), keys.div_ceil(ATTENTION_SPLIT_KEYS).max(1));
        let wanted = target_blocks.div_ceil(row_tiles).clamp(1, chunks);
        let keys_per_split = chunks.div_ceil(wanted) * ATTENTION_SPLIT_KEYS;
        let splits = keys.div_ceil(keys_per_split).max(1);
        let partial_lens = if splits > 1 { (splits * rows * ATTENTION_HEAD_DIM, splits * rows * 2) } else { (0, 0) };
        AttentionSplit { splits, keys_per_split, partial_lens }
    }

    /// Fused multi-query attention, head dimension 256: `softmax(q kᵀ / 16) v` per head with the
    /// masks of [`AttentionArgs`], in one launch (plus a merge of the splits when there are
    /// several).
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes; the partial buffers must
    /// not be in use by a concurrent launch.
    pub unsafe fn attention_mq256(&self, args: &AttentionArgs, stream: CUstream) -> Result<()> {
        let what = "attention_mq256";
        let AttentionArgs { q, k, v, out, heads, split, .. } = *args;
        let d = ATTENTION_HEAD_DIM;
        if !self.fused_attention {
            return Err(shape_error(
                what,
                format!("the device does not grant {} bytes of shared memory per block", self.attention_shared_bytes),
            ));
        }
        if [q.dtype, k.dtype, v.dtype] != [Dtype::Bf16; 3]
            || heads == 0
            || q.cols != heads * d
            || (out.rows, out.cols) != (q.rows, q.cols)
            || k.cols != d
            || (v.rows, v.cols) != (k.rows, k.cols)
        {
            return Err(shape_error(
                what,
                format!(
                    "needs bf16 q [queries, {heads}·{d}] and k/v [keys, {d}], out like q, got q {}x{} {:?}, k {}x{}, v {}x{}, out {}x{}",
                    q.rows, q.cols, q.dtype, k.rows, k.cols, v.rows, v.cols, out.rows, out.cols
                ),
            ));
        }
        if k.rows == 0 {
            return Err(shape_error(what, "no keys".into()));
        }
        // (The e4m3 merge exists from sm_89 on; elsewhere its lookup fails by name.)
        if out.dtype == Dtype::E4m3 && split.splits < 2 {
            return Err(shape_error(what, format!("writes e4m3 only through its split merge, got {split:?}")));
        }
        if [q, k, v, out].iter().any(|m| m.ptr % 16 != 0 || m.stride % 8 != 0) || args.partial_o % 16 != 0 {
            return Err(shape_error(what, "q, k, v, out and the partial outputs must be 16-byte aligned".into()));
        }
        let (rows, keys) = (q.rows * heads, k.rows);
        if split.splits == 0 || split.keys_per_split % ATTENTION_SPLIT_KEYS != 0 || split.splits * split.keys_per_split < keys {
            return Err(shape_error(what, format!("{split:?} does not cover {keys} keys in whole chunks")));
        }
        // The Hopper form reads K and V (and Q, when its heads tile 64 rows) by bulk tensor
        // copies; the maps are encoded here, at capture, and travel in the graph's launch
        // parameters.
        let hopper = self.attention_kernel == "attention_mq256_wgmma";
        let (early, keys_ready) = match args.keys_ready {
            Some(n) if hopper => (true, n.min(keys)),
            _ => (false, 0),
        };
        let (q_map, k_map, v_map) = if hopper {
            (TensorMap::bf16_query_heads_64(&q, heads, what)?, TensorMap::bf16_rows_64x64(&k, what)?, TensorMap::bf16_rows_64x64(&v, what)?)
        } else {
            (None, TensorMap::UNUSED, TensorMap::UNUSED)
        };
        let args_list = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, what)?),
            Arg::P(q.ptr),
            Arg::I(i32_of(q.stride, what)?),
            Arg::P(k.ptr),
            Arg::I(i32_of(k.stride, what)?),
            Arg::P(v.ptr),
            Arg::I(i32_of(v.stride, what)?),
            Arg::P(args.key_valid.unwrap_or(0)),
            Arg::P(args.query_valid.unwrap_or(0)),
            Arg::I(i32_of(q.rows, what)?),
            Arg::I(i32_of(heads, what)?),
            Arg::I(i32_of(keys, what)?),
            Arg::I(i32_of(split.keys_per_split, what)?),
            Arg::F(std::f32::consts::LOG2_E / (d as f32).sqrt()),
            Arg::P(args.partial_o),
            Arg::P(args.partial_ml),
            Arg::I(i32_of(keys_ready, what)?),
            Arg::I(q_map.is_some() as i32),
            Arg::M(q_map.unwrap_or(TensorMap::UNUSED)),
            Arg::M(k_map),
            Arg::M(v_map),
        ];
        let grid = (rows.div_ceil(ATTENTION_ROWS) as u32, split.splits as u32, 1);
        // With several splits the split kernel writes only its partials: an e4m3 `out` is the merge's.
        let split_out = if out.dtype == Dtype::E4m3 { Dtype::Bf16 } else { out.dtype };
        let name = format!("{}_{}", self.attention_kernel, split_out.suffix());
        // SAFETY: matches `attention_mq256_*` and `attention_mq256_wgmma_*` (the same signature):
        // 128 threads, grid (row tiles, splits), the shared memory granted at load; the Hopper
        // form waits for the kernel before it before reading Q or keys from `keys_ready` on.
        unsafe { self.launch_maybe_early(early, &name, grid, 128, self.attention_shared_bytes, stream, args_list)? };
        if split.splits == 1 {
            return Ok(());
        }
        let name = &format!("attention_mq256_combine_{}", out.dtype.suffix());
        let combine = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, name)?),
            Arg::P(args.partial_o),
            Arg::P(args.partial_ml),
            Arg::P(args.query_valid.unwrap_or(0)),
            Arg::I(i32_of(q.rows, name)?),
            Arg::I(i32_of(heads, name)?),
            Arg::I(split.splits as i32),
            Arg::F(args.out_scale),
        ];
        // SAFETY: matches `attention_mq256_combine`: blocks of 256 threads, ATTENTION_MERGE_ROWS rows each.
        unsafe { self.launch(name, (rows.div_ceil(ATTENTION_MERGE_ROWS) as u32, 1, 1), 256, stream, combine) }
    }

    /// Fused attention of `heads` query heads of dimension `head_dim` (one of
    /// [`HEADS_ATTENTION`]) over `kv_heads` K/V heads, per group of `q.rows / groups` queries over
    /// `k.rows / groups` keys (at most the form's), with the masks of [`HeadsAttentionArgs`]:
    /// `softmax(q kᵀ / √head_dim) v` in one launch.
    ///
    /// # Safety
    /// All pointers must be live device memory of the stated shapes.
    pub unsafe fn attention_heads(&self, args: &HeadsAttentionArgs, stream: CUstream) -> Result<()> {
        let HeadsAttentionArgs { out, q, k, v, heads, kv_heads, head_dim: d, groups, key_valid, query_valid, causal, out_scale } = *args;
        let name = format!("attention_hd{d}_{}", out.dtype.suffix());
        let Some(max_keys) = heads_attention_max_keys(d) else {
            return Err(shape_error(&name, format!("no form for head dimension {d} (forms: {HEADS_ATTENTION:?})")));
        };
        if out.dtype == Dtype::E4m3 && !HEADS_ATTENTION_E4M3.contains(&d) {
            return Err(shape_error(&name, format!("no e4m3 form for head dimension {d} (forms: {HEADS_ATTENTION_E4M3:?})")));
        }
        if !self.fused_attention {
            return Err(shape_error(
                &name,
                format!("the device does not grant {} bytes of shared memory per block", heads_shared_bytes(d, max_keys)),
            ));
        }
        let (rows, keys) = (q.rows / groups.max(1), k.rows / groups.max(1));
        if [q.dtype, k.dtype, v.dtype] != [Dtype::Bf16; 3]
            || heads == 0
            || groups == 0
            || kv_heads == 0
            || heads % kv_heads != 0
            || q.cols != heads * d
            || [k.cols, v.cols] != [kv_heads * d; 2]
            || (out.rows, out.cols) != (q.rows, q.cols)
            || v.rows != k.rows
            || rows * groups != q.rows
            || keys * groups != k.rows
            || !(1..=max_keys).contains(&keys)
        {
            return Err(shape_error(
                &name,
                format!(
                    "needs bf16 q [{groups} groups of rows, {heads}·{d}], k and v [{groups} groups of 1 to {max_keys} keys, {kv_heads}·{d}] with {kv_heads} dividing {heads}, out like q; got q {}x{} {:?}, k {}x{}, v {}x{}, out {}x{}",
                    q.rows, q.cols, q.dtype, k.rows, k.cols, v.rows, v.cols, out.rows, out.cols
                ),
            ));
        }
        if [q, k, v, out].iter().any(|m| m.ptr % 16 != 0 || m.stride % 8 != 0) {
            return Err(shape_error(&name, "q, k, v and out rows must be 16-byte aligned (8-element strides)".into()));
        }
        let causal_offset = match causal {
            Some(offset) => i32_of(offset, &name)?,
            None => -1,
        };
        let args = [
            Arg::P(out.ptr),
            Arg::I(i32_of(out.stride, &name)?),
            Arg::P(q.ptr),
            Arg::I(i32_of(q.stride, &name)?),
            Arg::P(k.ptr),
            Arg::I(i32_of(k.stride, &name)?),
            Arg::P(v.ptr),
            Arg::I(i32_of(v.stride, &name)?),
            Arg::I(i32_of(rows, &name)?),
            Arg::I(i32_of(keys, &name)?),
            Arg::I(i32_of(heads / kv_heads, &name)?),
            Arg::P(key_valid.unwrap_or(0)),
            Arg::P(query_valid.unwrap_or(0)),
            Arg::I(causal_offset),
            Arg::F(std::f32::consts::LOG2_E / (d as f32).sqrt()),
            Arg::F(out_scale),
        ];
        let grid = (rows.div_ceil(HEADS_ROWS) as u32, i32_of(heads, &name)? as u32, i32_of(groups, &name)? as u32);
        // SAFETY: matches `attention_hd{d}_*`: its threads, grid (query tiles, heads, groups), the
        // shared memory granted at load.
        unsafe { self.launch_with_shared(&name, grid, HEADS_THREADS, heads_shared_bytes(d, max_keys), stream, args) }
    }
}
