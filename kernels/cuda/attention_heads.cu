#include "common.cuh"

// ---- Fused attention over at most a few hundred keys per group, by head dimension -------------
//
// One kernel instead of the QKᵀ product, the softmax and the PV product (per group and K/V
// head): SigLIP's (head dim 72, per camera), and GR00T's vision tower (64, per camera), VL
// self-attention (64, masked keys), DiT self- and cross-attention (48, masked keys) and Qwen3
// decoder (128, grouped-query, causal). A block takes 64 query rows of one head of one group and
// holds that head's whole K and V (at most AH_MAX_KEYS keys) in shared memory. AH_SPLIT warps
// share each 16-row tile, warp w taking rows 16·(w % 4) … + 15 over the keys' (w / 4)-th part,
// its scores in registers (no online softmax): each warp's chain of products is 1 / AH_SPLIT of
// the tile's. Each part's K and V arrive on their own barrier, so the first parts' warps compute
// while the last parts' keys are still on their way; at the end every thread merges the parts of
// eight output columns of a row. A head dimension that is not a multiple of 16 is padded with
// zeros to the next one. No branch on the key count inside the product loops: keys past the end
// are zeros, masked in the softmax, and straight-line loops let the compiler issue the
// shared-memory loads ahead of the products.
//
// The output, f32 or bf16, or (`attention_hd{48,64,72}_e4m3`, sm_89 on) e4m3 for the FP8 output
// projection after it: each value times `out_scale` (that product's inverse input scale; 1
// otherwise) before it is stored, rounded once from f32 as the CPU's FP8 emulation rounds it.
//
// Masks, as the general path's softmax (softmax.cu) applies them: keys with key_valid 0, keys
// past `row + causal_offset` (causal_offset >= 0), and past the group's key count weigh nothing;
// a row with no key left, or with query_valid 0, is written as zeros.
#define AH_ROWS 64  // query rows per block
#ifndef AH_SPLIT
#define AH_SPLIT 2  // warps per 16-row tile (vision_attention_bench.cu tries 4)
#endif
#define AH_THREADS (128 * AH_SPLIT)  // four 16-row tiles

template <int D, int MAX_KEYS>
struct AhShape {
    static constexpr int padded = (D + 15) / 16 * 16;  // Q and K pieces past D are zero
    // Shared-memory row stride in bf16: ldmatrix's eight rows hit distinct banks.
    static constexpr int stride = padded + 8;
    // f32 row stride of the parts' partial outputs: 8 banks apart (≡ 8 mod 32).
    static constexpr int partial_stride = (D + 23) / 32 * 32 + 8;
    static constexpr int part_keys = MAX_KEYS / AH_SPLIT;  // keys per warp
    // Dynamic shared memory in bytes (launch/mod.rs mirrors it): the Q tile, then all of K and V
    // (which hold the parts' partial outputs and (max, sum) pairs at the end).
    static constexpr int shared_bytes = (AH_ROWS + 2 * MAX_KEYS) * stride * 2;
    static_assert(D % 8 == 0 && padded - D <= 8, "rows copy in 16-byte pieces; padding is one piece");
    static_assert(part_keys % 16 == 0, "each warp's keys are whole k16 steps");
    static_assert(AH_SPLIT * AH_ROWS * (partial_stride * 4 + 8) <= 2 * MAX_KEYS * stride * 2, "partials fit where K and V were");
};

// A shared-memory barrier (mbarrier, set up by common.cuh's mbarrier_init) that the copies of
// its threads complete, as sm_80 has it (Orin runs this kernel too): an arrival when the calling
// thread's cp.async copies so far have landed, and a wait for the first phase.
__device__ __forceinline__ void ah_barrier_arrive_on_copies(unsigned long long* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
}
__device__ __forceinline__ void ah_barrier_wait(unsigned long long* bar) {
    asm volatile(
        "{\n.reg .pred done;\nah_wait:\n"
        "mbarrier.test_wait.parity.shared.b64 done, [%0], 0;\n"
        "@!done bra ah_wait;\n}\n" ::"r"((unsigned)__cvta_generic_to_shared(bar))
        : "memory");
}

// Query head blockIdx.y reads K/V head blockIdx.y / heads_per_kv; group blockIdx.z holds
// `rows_per_group` query rows and `keys` keys (their masks at the same offsets).
template <int D, int MAX_KEYS, typename Tout>
__device__ void attention_heads(Tout* out, int out_stride, const bf16* q, int q_stride, const bf16* k, int k_stride,
                                const bf16* v, int v_stride, int rows_per_group, int keys, int heads_per_kv,
                                const float* key_valid, const float* query_valid, int causal_offset, float scale_log2,
                                float out_scale) {
    using S = AhShape<D, MAX_KEYS>;
    constexpr int DP = S::padded, STRIDE = S::stride, PART_KEYS = S::part_keys;
    extern __shared__ __align__(16) unsigned char ah_shared[];
    __shared__ __align__(8) unsigned long long ah_arrived[AH_SPLIT];
    unsigned short* q_tile = (unsigned short*)ah_shared;
    unsigned short* k_tile = q_tile + AH_ROWS * STRIDE;
    unsigned short* v_tile = k_tile + MAX_KEYS * STRIDE;
    const int h = blockIdx.y, g = blockIdx.z, row0 = blockIdx.x * AH_ROWS, kv_head = h / heads_per_kv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, q4 = lane & 3;
    const int tile = warp & 3, part = warp >> 2, key0 = part * PART_KEYS;
    const float neg_inf = __int_as_float(0xff800000);
    constexpr int pieces = D / 8;  // 16-byte pieces per row

    // The padded dimensions of every Q and K row are zeros (plain stores, seen by all after the
    // barrier).
    if (DP > D) {
        for (int r = threadIdx.x; r < AH_ROWS + MAX_KEYS; r += AH_THREADS) *(uint4*)&q_tile[r * STRIDE + D] = make_uint4(0, 0, 0, 0);
    }
    if (threadIdx.x < AH_SPLIT) mbarrier_init((unsigned)__cvta_generic_to_shared(&ah_arrived[threadIdx.x]), AH_THREADS);
    __syncthreads();

    // Q rows, then each part's keys' K and V rows, each part on its own barrier (a thread's
    // arrival lands once all its copies so far have). Thread t copies pieces t, t + AH_THREADS, …
    // of each; rows past the end are zeros.
    const bf16* qg = q + (long)g * rows_per_group * q_stride + h * D;
    const bf16* kg = k + (long)g * keys * k_stride + kv_head * D;
    const bf16* vg = v + (long)g * keys * v_stride + kv_head * D;
#pragma unroll
    for (int i = threadIdx.x; i < AH_ROWS * pieces; i += AH_THREADS) {
        const int r = i / pieces, c = i % pieces;
        att_copy16(&q_tile[r * STRIDE + c * 8], qg + (long)min(row0 + r, rows_per_group - 1) * q_stride + c * 8,
                   row0 + r < rows_per_group);
    }
#pragma unroll
    for (int p = 0; p < AH_SPLIT; ++p) {
#pragma unroll
        for (int i = threadIdx.x; i < PART_KEYS * pieces; i += AH_THREADS) {
            const int j = p * PART_KEYS + i / pieces, c = i % pieces, key = min(j, keys - 1);
            att_copy16(&k_tile[j * STRIDE + c * 8], kg + (long)key * k_stride + c * 8, j < keys);
            att_copy16(&v_tile[j * STRIDE + c * 8], vg + (long)key * v_stride + c * 8, j < keys);
        }
        ah_barrier_arrive_on_copies(&ah_arrived[p]);
    }
    // This thread's keys are key0 + 8·nt + 2·q4 + (0, 1): whether each counts, read while the
    // copies land (causal limits apply per row below).
    const float* valid_g = key_valid ? key_valid + (long)g * keys : nullptr;
    unsigned key_ok[(PART_KEYS / 8 * 2 + 31) / 32] = {};
#pragma unroll
    for (int nt = 0; nt < PART_KEYS / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int j = key0 + nt * 8 + 2 * q4 + e;
            const bool ok = j < keys && (!valid_g || valid_g[j] != 0.0f);
            key_ok[(2 * nt + e) / 32] |= (unsigned)ok << ((2 * nt + e) % 32);
        }
    }
    ah_barrier_wait(&ah_arrived[part]);

    // S = Q Kᵀ over this warp's keys: column tiles of 8 keys, k16 steps over the padded head
    // dimension.
    float s[PART_KEYS / 8][4];
#pragma unroll
    for (int nt = 0; nt < PART_KEYS / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
        unsigned a[4];
        ldmatrix_x4(a, &q_tile[(tile * 16 + (lane & 15)) * STRIDE + kk * 16 + (lane >> 4) * 8]);
#pragma unroll
        for (int nt = 0; nt < PART_KEYS / 8; nt += 2) {
            // Matrices: keys nt·8 … +7 at dims kk·16 + 0 / + 8, then the next eight keys.
            unsigned b[4];
            ldmatrix_x4(b, &k_tile[(key0 + nt * 8 + (lane >> 4) * 8 + (lane & 7)) * STRIDE + kk * 16 + ((lane >> 3) & 1) * 8]);
            att_mma(s[nt], a, b[0], b[1]);
            att_mma(s[nt + 1], a, b[2], b[3]);
        }
    }

    // Softmax over the warp's keys of rows gq (e < 2) and gq + 8 (e >= 2), in the log2 domain:
    // one fused multiply-add and one exp2 per score. A part with no key keeps max -inf and sum 0
    // (its scores are all -inf, so it subtracts 0 instead of its max) and weighs nothing below.
    const int row_in_group = row0 + tile * 16 + gq;
    float m[2] = {neg_inf, neg_inf}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < PART_KEYS / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int j = key0 + nt * 8 + 2 * q4 + (e & 1);
            const int bit = 2 * nt + (e & 1);
            const bool ok = (key_ok[bit / 32] >> (bit % 32)) & 1;
            if (!ok || (causal_offset >= 0 && j > row_in_group + 8 * (e >> 1) + causal_offset)) s[nt][e] = neg_inf;
            m[e >> 1] = fmaxf(m[e >> 1], s[nt][e]);
        }
    }
    float base[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        m[i] = quad_max(m[i]) * scale_log2;
        base[i] = m[i] == neg_inf ? 0.0f : m[i];
    }
#pragma unroll
    for (int nt = 0; nt < PART_KEYS / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[nt][e] = exp2_fast(fmaf(s[nt][e], scale_log2, -base[e >> 1]));
            l[e >> 1] += s[nt][e];
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = quad_sum(l[i]);

    // O = P V: P's k16 step kt is column tiles 2kt and 2kt + 1; V's B fragments transposed out
    // of shared memory, two dimension tiles per ldmatrix.x4 (an odd last tile alone).
    float o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < PART_KEYS / 16; ++kt) {
        const unsigned p[4] = {pack_bf16x2(s[2 * kt][0], s[2 * kt][1]), pack_bf16x2(s[2 * kt][2], s[2 * kt][3]),
                               pack_bf16x2(s[2 * kt + 1][0], s[2 * kt + 1][1]),
                               pack_bf16x2(s[2 * kt + 1][2], s[2 * kt + 1][3])};
#pragma unroll
        for (int dt = 0; dt < D / 8; dt += 2) {
            const int dtile = min(dt + (lane >> 4), D / 8 - 1);
            unsigned b[4];
            ldmatrix_x4_trans(b, &v_tile[(key0 + kt * 16 + (lane & 15)) * STRIDE + dtile * 8]);
            att_mma(o[dt], p, b[0], b[1]);
            if (dt + 1 < D / 8) att_mma(o[dt + 1], p, b[2], b[3]);
        }
    }

    // Merge: every warp leaves its rows' partial output and (max, sum) where K and V were (all
    // warps are done with them after the barrier; rows 8 banks apart, so each half-warp's stores
    // hit distinct banks), then each thread combines the parts of eight output columns of a row.
    constexpr int PO = S::partial_stride;
    float* partial_o = (float*)k_tile;                                       // [part][row][PO]
    float2* partial_ml = (float2*)(partial_o + AH_SPLIT * AH_ROWS * PO);     // [part][row]
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int rr = part * AH_ROWS + tile * 16 + gq + 8 * i;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
            *(float2*)&partial_o[rr * PO + dt * 8 + 2 * q4] = make_float2(o[dt][2 * i], o[dt][2 * i + 1]);
        if (q4 == 0) partial_ml[rr] = make_float2(m[i], l[i]);
    }
    __syncthreads();
#pragma unroll
    for (int i = threadIdx.x; i < AH_ROWS * pieces; i += AH_THREADS) {
        const int rr = i / pieces, c = i % pieces;
        const int row = row0 + rr;
        if (row >= rows_per_group) continue;
        float mx = neg_inf;
#pragma unroll
        for (int p = 0; p < AH_SPLIT; ++p) mx = fmaxf(mx, partial_ml[p * AH_ROWS + rr].x);
        float acc[8] = {};
        // No key left (every part's max is -inf), or a query row marked invalid: zeros.
        if (mx != neg_inf && !(query_valid && query_valid[(long)g * rows_per_group + row] == 0.0f)) {
            float sum = 0.0f;
#pragma unroll
            for (int p = 0; p < AH_SPLIT; ++p) {
                // An empty part's max is -inf: its weight is 0.
                const float2 ml = partial_ml[p * AH_ROWS + rr];
                const float w = exp2_fast(ml.x - mx);
                float part_o[8];
                load8(&partial_o[(p * AH_ROWS + rr) * PO + c * 8], part_o);
                sum += ml.y * w;
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] += w * part_o[e];
            }
            const float inv = out_scale / sum;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] *= inv;
        }
        store8(out + ((long)g * rows_per_group + row) * out_stride + h * D + c * 8, acc);
    }
}

// attention_hd{D}_{f32,bf16}: head dimension D over at most MAX_KEYS keys per group
// (launch/mod.rs: HEADS_ATTENTION lists the same pairs); attention_hd{48,64,72}_e4m3 from sm_89 on
// (HEADS_ATTENTION_E4M3).
#define ATTENTION_HEADS(NAME, TOUT, D, MAX_KEYS)                                                             \
    extern "C" __global__ void __launch_bounds__(AH_THREADS)                                                 \
        NAME(TOUT* out, int out_stride, const bf16* q, int q_stride, const bf16* k, int k_stride,            \
             const bf16* v, int v_stride, int rows_per_group, int keys, int heads_per_kv,                    \
             const float* key_valid, const float* query_valid, int causal_offset, float scale_log2,          \
             float out_scale) {                                                                              \
        attention_heads<D, MAX_KEYS, TOUT>(out, out_stride, q, q_stride, k, k_stride, v, v_stride,           \
                                           rows_per_group, keys, heads_per_kv, key_valid, query_valid,       \
                                           causal_offset, scale_log2, out_scale);                            \
    }
#define ATTENTION_HD48(NAME, TOUT) ATTENTION_HEADS(NAME, TOUT, 48, 320)
#define ATTENTION_HD64(NAME, TOUT) ATTENTION_HEADS(NAME, TOUT, 64, 320)
#define ATTENTION_HD72(NAME, TOUT) ATTENTION_HEADS(NAME, TOUT, 72, 256)
#define ATTENTION_HD128(NAME, TOUT) ATTENTION_HEADS(NAME, TOUT, 128, 256)
FOR_TYPE(ATTENTION_HD48, attention_hd48)
FOR_TYPE(ATTENTION_HD64, attention_hd64)
FOR_TYPE(ATTENTION_HD72, attention_hd72)
FOR_TYPE(ATTENTION_HD128, attention_hd128)
#if __CUDA_ARCH__ >= 890
// GR00T's DiT (48) and vision tower (64), and SigLIP (72): their output projections run in FP8.
ATTENTION_HD48(attention_hd48_e4m3, e4m3)
ATTENTION_HD64(attention_hd64_e4m3, e4m3)
ATTENTION_HD72(attention_hd72_e4m3, e4m3)
#endif
