#include "common.cuh"

// ---- Fused multi-query attention for head_dim 256 (the action expert's 50 tokens) ----------
//
// One kernel instead of QKᵀ product + softmax + PV product: every query head shares the one K/V
// head, so the rows (query, head) of a block all read the same K/V chunk. A block takes 64 rows
// (4 warps × 16) and a contiguous range of keys (a "split"), walks it in chunks of 32 keys with an
// online softmax (flash attention), and either writes the normalised output (one split) or its
// unnormalised partial output with the running max and sum, which `attention_mq256_combine_*`
// merges (several splits: 50 tokens × 8 heads are too few rows to fill the GPU otherwise).
// The Q rows and double-buffered K/V chunks come into shared memory with cp.async, so the next
// chunk's loads are in flight while the tensor cores (mma.sync m16n8k16, bf16 in, f32 accumulate)
// work on the current one. Scores in the log2 domain (exp2). Row r is query r / heads, head r % heads.
#define ATT_D 256
// Keys per chunk, a multiple of 16 dividing 64 (launch.rs mirrors it per architecture): from
// sm_90 on two 64-key chunks fit (178 KB of shared memory, -0.6 us per expert layer on the H200);
// Orin's 163 KB take 32-key ones (105 KB).
#ifndef ATT_KEYS
#if __CUDA_ARCH__ >= 900
#define ATT_KEYS 64
#else
#define ATT_KEYS 32
#endif
#endif
#ifndef ATT_ROWS
#define ATT_ROWS 64                  // rows per block (16 per warp; tools/device/benches/attention_bench.cu tries others)
#endif
#define ATT_QK_STRIDE (ATT_D + 32)   // Q/K rows 576 B apart: a quarter-warp's two rows use disjoint banks
#define ATT_V_STRIDE (ATT_D + 8)     // V rows 528 B apart: ldmatrix's eight rows use disjoint banks
// Dynamic shared memory, in bytes (launch.rs mirrors the total): Q tile, two K and two V chunks,
// two chunks of key validity.
#define ATT_Q_BYTES (ATT_ROWS * ATT_QK_STRIDE * 2)
#define ATT_K_BYTES (ATT_KEYS * ATT_QK_STRIDE * 2)
#define ATT_V_BYTES (ATT_KEYS * ATT_V_STRIDE * 2)
#define ATT_SHARED_BYTES (ATT_Q_BYTES + 2 * ATT_K_BYTES + 2 * ATT_V_BYTES + 2 * ATT_KEYS * 4)

// 1 for each key of the chunk at c0 that is inside the split and not masked, else 0.
__device__ __forceinline__ void att_load_validity(float* valid_tile, const float* key_valid, int c0, int key_end) {
    if (threadIdx.x < ATT_KEYS) {
        const int key = c0 + threadIdx.x;
        valid_tile[threadIdx.x] = key < key_end && (!key_valid || key_valid[key] != 0.0f) ? 1.0f : 0.0f;
    }
}

// Queues the copies of keys [c0, c0 + ATT_KEYS) ∩ [.., key_end) of K and V, and their validity.
__device__ __forceinline__ void att_load_chunk(unsigned short* k_tile, unsigned short* v_tile, float* valid_tile,
                                               const bf16* k, int k_stride, const bf16* v, int v_stride,
                                               const float* key_valid, int c0, int key_end) {
    for (int i = threadIdx.x; i < ATT_KEYS * (ATT_D / 8); i += blockDim.x) {
        const int r = i / (ATT_D / 8), c = i % (ATT_D / 8), key = min(c0 + r, key_end - 1);
        att_copy16(&k_tile[r * ATT_QK_STRIDE + c * 8], k + (long)key * k_stride + c * 8, c0 + r < key_end);
        att_copy16(&v_tile[r * ATT_V_STRIDE + c * 8], v + (long)key * v_stride + c * 8, c0 + r < key_end);
    }
    att_load_validity(valid_tile, key_valid, c0, key_end);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// One chunk's online softmax, shared by both forms of the kernel: the scores s[j][e] (row g for
// e < 2, g + 8 for e >= 2; key 8j + 2·q4 + (e & 1): mma.sync's and wgmma's accumulator layout)
// masked by `valid`, the running max `m` and sum `l` updated, the factor `correction` for the
// output so far, and P as the bf16 A operand of the k16 steps of P V (keys 0-15, 16-31, ...).
__device__ __forceinline__ void att_chunk_softmax(float (&s)[ATT_KEYS / 8][4], const float* valid, float scale_log2,
                                                  float (&m)[2], float (&l)[2], float (&correction)[2],
                                                  unsigned (&p)[ATT_KEYS / 16][4]) {
    const float neg_inf = __int_as_float(0xff800000);
    const int q4 = threadIdx.x & 3;
    float chunk_max[2] = {neg_inf, neg_inf};
#pragma unroll
    for (int j = 0; j < ATT_KEYS / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[j][e] = valid[j * 8 + 2 * q4 + (e & 1)] != 0.0f ? s[j][e] * scale_log2 : neg_inf;
            chunk_max[e >> 1] = fmaxf(chunk_max[e >> 1], s[j][e]);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        chunk_max[i] = quad_max(chunk_max[i]);
        const float new_max = fmaxf(m[i], chunk_max[i]);
        // While every key so far is masked the max stays -inf: nothing to rescale.
        correction[i] = new_max == neg_inf ? 1.0f : exp2_fast(m[i] - new_max);
        m[i] = new_max;
        l[i] *= correction[i];
    }
#pragma unroll
    for (int j = 0; j < ATT_KEYS / 8; ++j) {
        float e4[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float mx = m[e >> 1];
            e4[e] = mx == neg_inf ? 0.0f : exp2_fast(s[j][e] - mx);
            l[e >> 1] += e4[e];
        }
        // A fragment: reg 0 row g keys 2q4.., reg 1 row g+8, reg 2 row g keys 8+2q4.., reg 3 row g+8.
        p[j >> 1][(j & 1) * 2 + 0] = pack_bf16x2(e4[0], e4[1]);
        p[j >> 1][(j & 1) * 2 + 1] = pack_bf16x2(e4[2], e4[3]);
    }
}

__device__ __forceinline__ void att_rescale(float (&o)[ATT_D / 8][4], const float (&correction)[2]) {
#pragma unroll
    for (int j = 0; j < ATT_D / 8; ++j) {
        o[j][0] *= correction[0];
        o[j][1] *= correction[0];
        o[j][2] *= correction[1];
        o[j][3] *= correction[1];
    }
}

// The block's rows out of the accumulators: normalised (one split) or the unnormalised partial
// with its (max, sum) for the merge kernel.
template <typename Tout>
__device__ __forceinline__ void att_write_rows(const float (&o)[ATT_D / 8][4], const float (&m)[2], float (&l)[2],
                                               Tout* out, int out_stride, const float* query_valid, int rows,
                                               int heads, float* partial_o, float* partial_ml) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
    // Row sums: each lane of a quad summed its own keys.
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = quad_sum(l[i]);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int row = blockIdx.x * ATT_ROWS + warp * 16 + g + 8 * i;
        if (row >= rows) continue;
        const int t = row / heads, h = row % heads;
        if (gridDim.y == 1) {
            const bool dead = (query_valid && query_valid[t] == 0.0f) || l[i] == 0.0f;
            const float inv = dead ? 0.0f : 1.0f / l[i];
            Tout* dst = out + (long)t * out_stride + h * ATT_D;
            for (int j = 0; j < ATT_D / 8; ++j) {
                const int d = j * 8 + 2 * q4;
                dst[d] = from_float<Tout>(o[j][2 * i] * inv);
                dst[d + 1] = from_float<Tout>(o[j][2 * i + 1] * inv);
            }
        } else {
            const long at = (long)blockIdx.y * rows + row;
            float* dst = partial_o + at * ATT_D;
            for (int j = 0; j < ATT_D / 8; ++j) {
                const int d = j * 8 + 2 * q4;
                *(float2*)&dst[d] = make_float2(o[j][2 * i], o[j][2 * i + 1]);
            }
            if (q4 == 0) *(float2*)&partial_ml[at * 2] = make_float2(m[i], l[i]);
        }
    }
}

// A driver tensor map (CUtensorMap: 128 opaque bytes, made on the host by cuTensorMapEncodeTiled),
// passed by value, aligned as CUDA 13 declares it; no toolkit header is included (common.cuh).
struct __align__(128) TensorMap {
    unsigned long long opaque[16];
};

template <typename Tout>
__device__ void attention_mq256(Tout* out, int out_stride, const bf16* q, int q_stride, const bf16* k, int k_stride,
                                const bf16* v, int v_stride, const float* key_valid, const float* query_valid,
                                int queries, int heads, int keys, int keys_per_split, float scale_log2,
                                float* partial_o, float* partial_ml, int, int, const TensorMap*, const TensorMap*,
                                const TensorMap*) {
    extern __shared__ __align__(16) unsigned char att_shared[];
    unsigned short* q_tile = (unsigned short*)att_shared;
    unsigned short* k_tiles = (unsigned short*)(att_shared + ATT_Q_BYTES);
    unsigned short* v_tiles = (unsigned short*)(att_shared + ATT_Q_BYTES + 2 * ATT_K_BYTES);
    float* valid_tiles = (float*)(att_shared + ATT_Q_BYTES + 2 * ATT_K_BYTES + 2 * ATT_V_BYTES);
    const float neg_inf = __int_as_float(0xff800000);
    const int rows = queries * heads;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q4 = lane & 3;
    const int key_begin = blockIdx.y * keys_per_split, key_end = min(keys, key_begin + keys_per_split);

    // Prologue: the block's Q rows and the first chunk, one copy group.
    for (int i = threadIdx.x; i < ATT_ROWS * (ATT_D / 8); i += blockDim.x) {
        const int r = i / (ATT_D / 8), c = i % (ATT_D / 8), row = min(blockIdx.x * ATT_ROWS + r, rows - 1);
        const bf16* src = q + (long)(row / heads) * q_stride + (row % heads) * ATT_D + c * 8;
        att_copy16(&q_tile[r * ATT_QK_STRIDE + c * 8], src, blockIdx.x * ATT_ROWS + r < rows);
    }
    att_load_chunk(k_tiles, v_tiles, valid_tiles, k, k_stride, v, v_stride, key_valid, key_begin, key_end);

    float o[ATT_D / 8][4];
    for (int j = 0; j < ATT_D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {neg_inf, neg_inf}, l[2] = {0.0f, 0.0f};
    const unsigned short* q_rows[2] = {&q_tile[(warp * 16 + g) * ATT_QK_STRIDE], &q_tile[(warp * 16 + g + 8) * ATT_QK_STRIDE]};

    for (int c0 = key_begin, buf = 0; c0 < key_end; c0 += ATT_KEYS, buf ^= 1) {
        if (c0 + ATT_KEYS < key_end) {
            // The other buffer was released by the barrier at the end of the previous chunk.
            att_load_chunk(k_tiles + (buf ^ 1) * (ATT_K_BYTES / 2), v_tiles + (buf ^ 1) * (ATT_V_BYTES / 2),
                           valid_tiles + (buf ^ 1) * ATT_KEYS, k, k_stride, v, v_stride, key_valid, c0 + ATT_KEYS,
                           key_end);
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        }
        __syncthreads();
        const unsigned short* k_tile = k_tiles + buf * (ATT_K_BYTES / 2);
        const unsigned short* v_tile = v_tiles + buf * (ATT_V_BYTES / 2);

        // S = Q Kᵀ over the chunk's keys (ATT_KEYS / 8 mma column tiles). Within each 32-wide block
        // of the head dimension, lane group q4 holds d = 8·q4 … 8·q4 + 7 for both operands (one
        // 16-byte load); the same permutation on both sides leaves the dot products unchanged.
        float s[ATT_KEYS / 8][4] = {};
#pragma unroll
        for (int b = 0; b < ATT_D / 32; ++b) {
            const uint4 qa = *(const uint4*)(q_rows[0] + b * 32 + q4 * 8);
            const uint4 qb = *(const uint4*)(q_rows[1] + b * 32 + q4 * 8);
            const unsigned lo[4] = {qa.x, qb.x, qa.y, qb.y}, hi[4] = {qa.z, qb.z, qa.w, qb.w};
#pragma unroll
            for (int j = 0; j < ATT_KEYS / 8; ++j) {
                const uint4 kf = *(const uint4*)&k_tile[(j * 8 + g) * ATT_QK_STRIDE + b * 32 + q4 * 8];
                att_mma(s[j], lo, kf.x, kf.y);
                att_mma(s[j], hi, kf.z, kf.w);
            }
        }
        float correction[2];
        unsigned p[ATT_KEYS / 16][4];
        att_chunk_softmax(s, valid_tiles + buf * ATT_KEYS, scale_log2, m, l, correction, p);
        att_rescale(o, correction);
        // O += P V: V's 16x8 B fragments transposed out of shared memory, two column tiles per
        // ldmatrix.x4 (lanes 0-15 address keys 0-15 of tile dt, lanes 16-31 those of tile dt + 1).
#pragma unroll
        for (int kk = 0; kk < ATT_KEYS / 16; ++kk) {
#pragma unroll
            for (int dt = 0; dt < ATT_D / 8; dt += 2) {
                unsigned b[4];
                ldmatrix_x4_trans(b, &v_tile[(kk * 16 + (lane & 15)) * ATT_V_STRIDE + (dt + (lane >> 4)) * 8]);
                att_mma(o[dt], p[kk], b[0], b[1]);
                att_mma(o[dt + 1], p[kk], b[2], b[3]);
            }
        }
        __syncthreads();  // this chunk's buffers may be refilled
    }
    att_write_rows(o, m, l, out, out_stride, query_valid, rows, heads, partial_o, partial_ml);
}
// The kernel entry of either form (`FORM`): both take the same arguments, so launch.rs launches
// whichever the loaded architecture has under one signature. `k_map` and `v_map` describe K and V
// for the Hopper form's bulk tensor copies, and `q_map` Q's rows when `q_by_map` (the head count
// divides 64); the mma.sync form ignores them. `keys_ready`: the Hopper form's leading keys that
// the kernel before it does not write (see there); the mma.sync form is never launched early.
#define ATTENTION_MQ256_ENTRY(NAME, TOUT, FORM)                                                                 \
    extern "C" __global__ void __launch_bounds__(128)                                                         \
        NAME(TOUT* out, int out_stride, const bf16* q, int q_stride, const bf16* k, int k_stride, const bf16* v, \
             int v_stride, const float* key_valid, const float* query_valid, int queries, int heads, int keys, \
             int keys_per_split, float scale_log2, float* partial_o, float* partial_ml, int keys_ready,       \
             int q_by_map, const __grid_constant__ TensorMap q_map, const __grid_constant__ TensorMap k_map, \
             const __grid_constant__ TensorMap v_map) {                                                       \
        FORM<TOUT>(out, out_stride, q, q_stride, k, k_stride, v, v_stride, key_valid, query_valid, queries,   \
                   heads, keys, keys_per_split, scale_log2, partial_o, partial_ml, keys_ready, q_by_map,      \
                   &q_map, &k_map, &v_map);                                                                   \
    }
#define ATTENTION_MQ256(NAME, TOUT) ATTENTION_MQ256_ENTRY(NAME, TOUT, attention_mq256)
FOR_TYPE(ATTENTION_MQ256, attention_mq256)

// The same attention on Hopper's warpgroup MMA (sm_90a only; mma.sync's form above elsewhere).
// One warpgroup per block, the same rows, splits, chunks (64 keys) and outputs. Q, K and V sit in
// shared memory as 64-row tiles of 64 bf16 in the 128-byte swizzle wgmma reads (four tiles along
// the head dimension each); S = Q Kᵀ is 16 asynchronous m64n64k16 products with both operands in
// shared memory (K as the K-major B), and O += P V takes P from registers, where the softmax
// leaves it, and V as the N-major B (keys × d, d contiguous) of 16 more: 32 instructions per chunk
// where mma.sync takes 256 per warp plus their operand loads. K and V
// arrive by bulk tensor copies (TMA: one thread issues a chunk's eight 64 × 64 boxes onto two
// transaction barriers) instead of 48 cp.async per thread, and so does
// Q when its (query, head) rows tile by whole queries (the head count divides 64; item 51),
// else by cp.async.
#if ATT_KEYS == 64 && ATT_ROWS == 64 && (!defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define ATTW_TILE_BYTES (64 * 128)                  // 64 rows × 64 bf16, swizzled
#define ATTW_OPERAND_BYTES (4 * ATTW_TILE_BYTES)    // 64 rows × 256: four tiles along d
// Dynamic shared memory (launch.rs mirrors it): 1024-byte alignment slack, the Q tile, two
// chunks each of K and V, two chunks of key validity, and the K and V copies' barriers per chunk.
#define ATTW_SHARED_BYTES (1024 + 5 * ATTW_OPERAND_BYTES + 2 * 64 * 4 + 4 * 8)
#ifndef ATTW_V_LBO
#define ATTW_V_LBO ATTW_TILE_BYTES   // N-major V: from one 64-wide block of d to the next
#define ATTW_V_SBO 1024              // and from one group of 8 keys to the next
#endif

// Byte offset of 16-byte piece `c` (0-31 along the 256 of d) of row `r` of a 64-row operand.
__device__ __forceinline__ unsigned attw_offset(int r, int c) {
    return (c >> 3) * ATTW_TILE_BYTES + swizzle128(r, c & 7);
}

// The same with A from registers (mma.sync's A fragment per warp) and B N-major in shared memory.
__device__ __forceinline__ void attw_mma_rs(float* d, const unsigned* a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_D32_OPERANDS(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// Queues the copy of one 64-row operand (64 rows × 256 bf16) into its swizzled tiles: row r comes
// from `row_of(r)`, or is zeros where `valid_row(r)` is false. Each thread copies the 16-byte
// pieces c and c + 16 (c = threadIdx.x % 16) of eight consecutive rows, so each copy instruction
// of a warp moves 256 contiguous bytes of each of two rows, all sixteen in flight at once: faster
// than one piece per thread striding over the tile.
template <typename RowOf, typename ValidRow>
__device__ __forceinline__ void attw_copy_operand(unsigned tile, RowOf row_of, ValidRow valid_row) {
    const int c = threadIdx.x & 15;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        const int r = (threadIdx.x >> 4) * 8 + n;
        const bf16* src = row_of(r);
        const bool valid = valid_row(r);
#pragma unroll
        for (int half = 0; half < 32; half += 16) cp_async16(tile + attw_offset(r, c + half), src + (c + half) * 8, valid);
    }
}

// One thread queues the bulk tensor copies of one 64-row operand of 256 (four boxes of 64 columns
// at outer coordinates (y, z) of the map, landing in wgmma's 128-byte swizzle: the map says so)
// onto barrier `bar`, adding their bytes to what its phase waits for; with `arrive` it is also
// the phase's one arrival, so every other operand on that barrier is queued before it. Rows past
// the tensor's end arrive as zeros.
__device__ __forceinline__ void attw_expect_operand(unsigned bar, bool arrive) {
    if (arrive) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "n"(ATTW_OPERAND_BYTES) : "memory");
    } else {
        asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "n"(ATTW_OPERAND_BYTES) : "memory");
    }
}
__device__ __forceinline__ void attw_copy_boxes(unsigned tile, const TensorMap* map, int y, int z, unsigned bar) {
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
        asm volatile(
            "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
                tile + kb * ATTW_TILE_BYTES),
            "l"(map), "r"(kb * 64), "r"(y), "r"(z), "r"(bar)
            : "memory");
}
__device__ __forceinline__ void attw_load_operand(unsigned tile, const TensorMap* map, int y, int z, unsigned bar,
                                                  bool arrive) {
    attw_expect_operand(bar, arrive);
    attw_copy_boxes(tile, map, y, z, bar);
}

// Queues keys [c0, c0 + 64) of K and V (thread 0, on their own barriers, so that S = Q Kᵀ and its
// softmax run while V lands) and writes their validity (keys past key_end count as masked, so
// the next split's rows a chunk may carry weigh nothing).
__device__ __forceinline__ void attw_load_chunk(unsigned k_tile, unsigned v_tile, float* valid_tile, const TensorMap* k_map,
                                                const TensorMap* v_map, unsigned k_bar, unsigned v_bar,
                                                const float* key_valid, int c0, int key_end) {
    if (threadIdx.x == 0) {
        attw_load_operand(k_tile, k_map, c0, 0, k_bar, true);
        attw_load_operand(v_tile, v_map, c0, 0, v_bar, true);
    }
    att_load_validity(valid_tile, key_valid, c0, key_end);
}

template <typename Tout>
__device__ void attention_mq256_wgmma(Tout* out, int out_stride, const bf16* q, int q_stride, const bf16*, int,
                                      const bf16*, int, const float* key_valid, const float* query_valid, int queries,
                                      int heads, int keys, int keys_per_split, float scale_log2, float* partial_o,
                                      float* partial_ml, int keys_ready, int q_by_map, const TensorMap* q_map, const TensorMap* k_map,
                                      const TensorMap* v_map) {
    extern __shared__ __align__(16) unsigned char att_shared[];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(att_shared) + 1023) & ~1023u;
    const unsigned q_tile = base, k_tiles = base + ATTW_OPERAND_BYTES, v_tiles = base + 3 * ATTW_OPERAND_BYTES;
    float* valid_tiles = (float*)(att_shared + (base + 5 * ATTW_OPERAND_BYTES - (unsigned)__cvta_generic_to_shared(att_shared)));
    // Barriers: K of chunk buffer 0 and 1, then V of buffer 0 and 1.
    const unsigned bars = base + 5 * ATTW_OPERAND_BYTES + 2 * 64 * 4;
    const float neg_inf = __int_as_float(0xff800000);
    const int rows = queries * heads;
    const int key_begin = blockIdx.y * keys_per_split, key_end = min(keys, key_begin + keys_per_split);

    if (threadIdx.x == 0) {
        for (int i = 0; i < 4; ++i) mbarrier_init(bars + 8 * i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    // Prologue: the block's Q rows, by a bulk copy onto the first chunk's K barrier (expected
    // before K's copy arrives there) when a box spans them (the head count divides 64: 64 / heads
    // queries, every head), else by cp.async; and the first chunk. Launched as the programmatic
    // dependent of the RoPE kernel that writes Q and the keys from `keys_ready` on, a block whose
    // first chunk lies wholly before them queues that chunk before waiting for RoPE, Q after it
    // (the K barrier's phase counts Q's bytes from the start, so it still waits for them).
    const int row0 = blockIdx.x * ATT_ROWS;
    const bool chunk_first = q_by_map && key_begin + ATT_KEYS <= keys_ready;
    if (chunk_first) {
        if (threadIdx.x == 0) attw_expect_operand(bars, false);
        attw_load_chunk(k_tiles, v_tiles, valid_tiles, k_map, v_map, bars, bars + 16, key_valid, key_begin, key_end);
    }
    wait_for_prior_grid();
    if (q_by_map) {
        if (threadIdx.x == 0) {
            if (chunk_first) attw_copy_boxes(q_tile, q_map, 0, row0 / heads, bars);
            else attw_load_operand(q_tile, q_map, 0, row0 / heads, bars, false);
        }
    } else {
        attw_copy_operand(
            q_tile,
            [&](int r) {
                const int row = min(row0 + r, rows - 1);
                return q + (long)(row / heads) * q_stride + (row % heads) * ATT_D;
            },
            [&](int r) { return row0 + r < rows; });
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    if (!chunk_first) attw_load_chunk(k_tiles, v_tiles, valid_tiles, k_map, v_map, bars, bars + 16, key_valid, key_begin, key_end);
    // cp.async Q rows (if any) land while the chunk's bulk copies are already queued; they are
    // generic-proxy writes, and wgmma reads through the async proxy.
    asm volatile("cp.async.wait_group 0;\nfence.proxy.async.shared::cta;\n" ::: "memory");

    float o[ATT_D / 8][4];
#pragma unroll
    for (int j = 0; j < ATT_D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {neg_inf, neg_inf}, l[2] = {0.0f, 0.0f};

    for (int c0 = key_begin, chunk = 0; c0 < key_end; c0 += ATT_KEYS, ++chunk) {
        const int buf = chunk & 1;
        const unsigned parity = (chunk >> 1) & 1;  // each buffer's barriers complete once per use
        if (c0 + ATT_KEYS < key_end) {
            // The other buffer was released by the barrier at the end of the previous chunk.
            attw_load_chunk(k_tiles + (buf ^ 1) * ATTW_OPERAND_BYTES, v_tiles + (buf ^ 1) * ATTW_OPERAND_BYTES,
                            valid_tiles + (buf ^ 1) * ATT_KEYS, k_map, v_map, bars + 8 * (buf ^ 1),
                            bars + 16 + 8 * (buf ^ 1), key_valid, c0 + ATT_KEYS, key_end);
        }
        __syncthreads();  // every thread's cp.async Q rows (first chunk) and validity writes are visible
        mbarrier_wait(bars + 8 * buf, parity);
        const unsigned k_tile = k_tiles + buf * ATTW_OPERAND_BYTES, v_tile = v_tiles + buf * ATTW_OPERAND_BYTES;

        float s[ATT_KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < ATT_KEYS / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kb = 0; kb < 4; ++kb)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                const unsigned at = kb * ATTW_TILE_BYTES + kk * 32;
                wg_mma_ss(&s[0][0], wg_desc(q_tile + at, 16, 1024), wg_desc(k_tile + at, 16, 1024));
            }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

        float correction[2];
        unsigned p[ATT_KEYS / 16][4];
        att_chunk_softmax(s, valid_tiles + buf * ATT_KEYS, scale_log2, m, l, correction, p);
        att_rescale(o, correction);
        mbarrier_wait(bars + 16 + 8 * buf, parity);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < ATT_KEYS / 16; ++kk)
#pragma unroll
            for (int nb = 0; nb < 4; ++nb)
                attw_mma_rs(&o[8 * nb][0], p[kk], wg_desc(v_tile + nb * ATTW_TILE_BYTES + kk * 2048, ATTW_V_LBO, ATTW_V_SBO));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncthreads();  // this chunk's buffers may be refilled
    }
    att_write_rows(o, m, l, out, out_stride, query_valid, rows, heads, partial_o, partial_ml);
}
#define ATTENTION_MQ256_WGMMA(NAME, TOUT) ATTENTION_MQ256_ENTRY(NAME, TOUT, attention_mq256_wgmma)
FOR_TYPE(ATTENTION_MQ256_WGMMA, attention_mq256_wgmma)
#endif

// Merges the splits of `attention_mq256_*`: out = out_scale · Σ_s 2^(m_s - M) o_s / Σ_s 2^(m_s - M) l_s
// (`out_scale` 1, or an FP8 product's inverse input scale for the e4m3 form, which writes that
// product's input: the expert's output projection, `product_stream` in mlp.cu). It lets the
// launch after it start at once: that product streams its weights while the merge runs.
// ATT_MERGE_DIMS head dimensions per thread in 16-byte loads, so 256 / ATT_MERGE_DIMS threads per
// row and ATT_MERGE_ROWS rows per block of 256 threads (one thread per dimension, a block per
// row, cost 0.7 us more per expert layer). Lane s of each warp holds
// split s's (max, sum) (32 splits per round), so the statistics cost one load per lane and a
// warp reduction. The first ATT_MERGE_HELD splits' partial outputs are loaded before the
// statistics (they do not depend on them), so for the expert's 12 splits a row waits for one
// round of loads, not two; later splits are read in unrolled runs.
#define ATT_MERGE_HELD 16
#ifndef ATT_MERGE_DIMS
#define ATT_MERGE_DIMS 4
#endif
#define ATT_MERGE_ROWS (ATT_MERGE_DIMS)  // 256 threads / (ATT_D / ATT_MERGE_DIMS) per row
__device__ __forceinline__ void store4(float* p, float4 v) { *(float4*)p = v; }
__device__ __forceinline__ void store4(bf16* p, float4 v) { *(uint2*)p = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w)); }
#if __CUDA_ARCH__ >= 890
__device__ __forceinline__ void store4(e4m3* p, float4 v) { *(unsigned*)p = e4m3x2(v.x, v.y) | (unsigned)e4m3x2(v.z, v.w) << 16; }
#endif
__device__ __forceinline__ void fma4(float4& acc, float w, float4 x) {
    acc.x += w * x.x, acc.y += w * x.y, acc.z += w * x.z, acc.w += w * x.w;
}
template <typename Tout>
__device__ void attention_mq256_combine(Tout* out, int out_stride, const float* partial_o, const float* partial_ml,
                                        const float* query_valid, int queries, int heads, int splits, float out_scale) {
    launch_dependents();
    constexpr int per_row = ATT_D / ATT_MERGE_DIMS, vecs = ATT_MERGE_DIMS / 4;
    const int rows = queries * heads, r = blockIdx.x * ATT_MERGE_ROWS + threadIdx.x / per_row, lane = threadIdx.x & 31;
    const int d = (threadIdx.x % per_row) * ATT_MERGE_DIMS;
    if (r >= rows) return;  // whole warps: a row's threads are whole warps
    const int t = r / heads, h = r % heads;
    const float neg_inf = __int_as_float(0xff800000), zero4[4] = {};
    float4 held[ATT_MERGE_HELD][vecs];
#pragma unroll
    for (int s = 0; s < ATT_MERGE_HELD; ++s)
#pragma unroll
        for (int v = 0; v < vecs; ++v)
            held[s][v] = s < splits ? *(const float4*)&partial_o[((long)s * rows + r) * ATT_D + d + 4 * v] : *(const float4*)zero4;
    // The first 32 splits' (max, sum) stay in their lanes' registers for the weights below.
    const float2 ml = lane < splits ? *(const float2*)&partial_ml[((long)lane * rows + r) * 2] : make_float2(neg_inf, 0.0f);
    float mx = ml.x;
    for (int s = lane + 32; s < splits; s += 32) mx = fmaxf(mx, partial_ml[((long)s * rows + r) * 2]);
    mx = warp_max(mx);
    float4 num[vecs];
#pragma unroll
    for (int v = 0; v < vecs; ++v) num[v] = *(const float4*)zero4;
    float den = 0.0f;
    if (mx != neg_inf && !(query_valid && query_valid[t] == 0.0f)) {
        for (int first = 0; first < splits; first += 32) {
            const int s = first + lane, n = min(32, splits - first);
            float w = 0.0f;
            if (s < splits) {
                const float2 ms = first == 0 ? ml : *(const float2*)&partial_ml[((long)s * rows + r) * 2];
                w = exp2_fast(ms.x - mx);
                den += w * ms.y;
            }
            if (first == 0) {
#pragma unroll
                for (int i = 0; i < ATT_MERGE_HELD; ++i) {
                    const float wi = __shfl_sync(0xffffffffu, w, i);
#pragma unroll
                    for (int v = 0; v < vecs; ++v) fma4(num[v], wi, held[i][v]);
                }
            }
#pragma unroll 4
            for (int i = first == 0 ? ATT_MERGE_HELD : 0; i < n; ++i) {
                const float wi = __shfl_sync(0xffffffffu, w, i);
#pragma unroll
                for (int v = 0; v < vecs; ++v)
                    fma4(num[v], wi, *(const float4*)&partial_o[((long)(first + i) * rows + r) * ATT_D + d + 4 * v]);
            }
        }
        den = warp_sum(den);
    }
    const float inv = den > 0.0f ? out_scale / den : 0.0f;
#pragma unroll
    for (int v = 0; v < vecs; ++v)
        store4(out + (long)t * out_stride + h * ATT_D + d + 4 * v,
               make_float4(num[v].x * inv, num[v].y * inv, num[v].z * inv, num[v].w * inv));
}
#define ATTENTION_MQ256_COMBINE(NAME, TOUT)                                                                 \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const float* partial_o, const float* partial_ml, \
                                    const float* query_valid, int queries, int heads, int splits,            \
                                    float out_scale) {                                                       \
        attention_mq256_combine<TOUT>(out, out_stride, partial_o, partial_ml, query_valid, queries, heads,  \
                                      splits, out_scale);                                                   \
    }
FOR_TYPE(ATTENTION_MQ256_COMBINE, attention_mq256_combine)
#if __CUDA_ARCH__ >= 890
ATTENTION_MQ256_COMBINE(attention_mq256_combine_e4m3, e4m3)
#endif
