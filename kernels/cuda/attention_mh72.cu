#include "common.cuh"

// ---- Fused attention for SigLIP: head_dim 72, one K/V head per query head, per-camera groups --
//
// One kernel instead of the QKᵀ product, the softmax and the PV product per camera. A block
// takes 64 query rows of one head of one group and holds that head's whole K and V (at most 256
// keys) in shared memory. VA_SPLIT warps share each 16-row tile, warp w taking rows
// 16·(w % 4) … + 15 over the keys' (w / 4)-th part, its scores in registers (no online
// softmax): each warp's chain of products is 1 / VA_SPLIT of the tile's. Each part's K and V
// arrive on their own barrier, so the first parts' warps compute while the last parts' keys are
// still on their way; at the end every thread merges the parts of eight output columns of a row.
// The head dimension is padded with zeros to 80 (five k16 steps). No branch on the key count
// inside the product loops: keys past the end are zeros, masked in the softmax, and straight-line
// loops let the compiler issue the shared-memory loads ahead of the products.
#define VA_D 72
#define VA_DP 80                     // padded head dimension (Q and K pieces past 72 are zero)
#define VA_STRIDE 88                 // shared-memory row stride: ldmatrix's eight rows hit distinct banks
#define VA_ROWS 64                   // query rows per block
#define VA_MAX_KEYS 256              // keys per group held at once (SigLIP: 256 patches)
#ifndef VA_SPLIT
#define VA_SPLIT 2                   // warps per 16-row tile (vision_attention_bench.cu tries 4)
#endif
#define VA_THREADS (128 * VA_SPLIT)  // four 16-row tiles
#define VA_PART_KEYS (VA_MAX_KEYS / VA_SPLIT)  // keys per warp
// Dynamic shared memory in bytes (launch.rs mirrors it): the Q tile, then all of K and V (which
// hold the parts' partial outputs and (max, sum) pairs at the end).
#define VA_SHARED_BYTES ((VA_ROWS + 2 * VA_MAX_KEYS) * VA_STRIDE * 2)
static_assert(VA_SPLIT * VA_ROWS * (VA_D + 2) * 4 <= 2 * VA_MAX_KEYS * VA_STRIDE * 2, "partials fit where K and V were");

// A shared-memory barrier (mbarrier, set up by common.cuh's mbarrier_init) that the copies of
// its threads complete, as sm_80 has it (Orin runs this kernel too): an arrival when the calling
// thread's cp.async copies so far have landed, and a wait for the first phase.
__device__ __forceinline__ void va_barrier_arrive_on_copies(unsigned long long* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"((unsigned)__cvta_generic_to_shared(bar)) : "memory");
}
__device__ __forceinline__ void va_barrier_wait(unsigned long long* bar) {
    asm volatile(
        "{\n.reg .pred done;\nva_wait:\n"
        "mbarrier.test_wait.parity.shared.b64 done, [%0], 0;\n"
        "@!done bra va_wait;\n}\n" ::"r"((unsigned)__cvta_generic_to_shared(bar))
        : "memory");
}

template <typename Tout>
__device__ void attention_mh72(Tout* out, int out_stride, const bf16* q, int q_stride, const bf16* k, int k_stride,
                               const bf16* v, int v_stride, int rows_per_group, int keys, float scale_log2) {
    extern __shared__ __align__(16) unsigned char va_shared[];
    __shared__ __align__(8) unsigned long long va_arrived[VA_SPLIT];
    unsigned short* q_tile = (unsigned short*)va_shared;
    unsigned short* k_tile = q_tile + VA_ROWS * VA_STRIDE;
    unsigned short* v_tile = k_tile + VA_MAX_KEYS * VA_STRIDE;
    const int h = blockIdx.y, g = blockIdx.z, row0 = blockIdx.x * VA_ROWS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gq = lane >> 2, q4 = lane & 3;
    const int tile = warp & 3, part = warp >> 2, key0 = part * VA_PART_KEYS;
    const float neg_inf = __int_as_float(0xff800000);
    constexpr int pieces = VA_D / 8;  // 16-byte pieces per row

    // Dims 72-79 of every Q and K row are zeros (plain stores, seen by all after the barrier).
    for (int r = threadIdx.x; r < VA_ROWS + VA_MAX_KEYS; r += VA_THREADS) *(uint4*)&q_tile[r * VA_STRIDE + VA_D] = make_uint4(0, 0, 0, 0);
    if (threadIdx.x < VA_SPLIT) mbarrier_init((unsigned)__cvta_generic_to_shared(&va_arrived[threadIdx.x]), VA_THREADS);
    __syncthreads();

    // Q rows, then each part's keys' K and V rows, each part on its own barrier (a thread's
    // arrival lands once all its copies so far have). Thread t copies pieces t, t + VA_THREADS, …
    // of each; rows past the end are zeros.
    const bf16* qg = q + (long)g * rows_per_group * q_stride + h * VA_D;
    const bf16* kg = k + (long)g * keys * k_stride + h * VA_D;
    const bf16* vg = v + (long)g * keys * v_stride + h * VA_D;
#pragma unroll
    for (int i = threadIdx.x; i < VA_ROWS * pieces; i += VA_THREADS) {
        const int r = i / pieces, c = i % pieces;
        att_copy16(&q_tile[r * VA_STRIDE + c * 8], qg + (long)min(row0 + r, rows_per_group - 1) * q_stride + c * 8,
                   row0 + r < rows_per_group);
    }
#pragma unroll
    for (int p = 0; p < VA_SPLIT; ++p) {
#pragma unroll
        for (int i = threadIdx.x; i < VA_PART_KEYS * pieces; i += VA_THREADS) {
            const int j = p * VA_PART_KEYS + i / pieces, c = i % pieces, key = min(j, keys - 1);
            att_copy16(&k_tile[j * VA_STRIDE + c * 8], kg + (long)key * k_stride + c * 8, j < keys);
            att_copy16(&v_tile[j * VA_STRIDE + c * 8], vg + (long)key * v_stride + c * 8, j < keys);
        }
        va_barrier_arrive_on_copies(&va_arrived[p]);
    }
    va_barrier_wait(&va_arrived[part]);

    // S = Q Kᵀ over this warp's keys: column tiles of 8 keys, five k16 steps over the padded
    // head dimension.
    float s[VA_PART_KEYS / 8][4];
#pragma unroll
    for (int nt = 0; nt < VA_PART_KEYS / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < VA_DP / 16; ++kk) {
        unsigned a[4];
        ldmatrix_x4(a, &q_tile[(tile * 16 + (lane & 15)) * VA_STRIDE + kk * 16 + (lane >> 4) * 8]);
#pragma unroll
        for (int nt = 0; nt < VA_PART_KEYS / 8; nt += 2) {
            // Matrices: keys nt·8 … +7 at dims kk·16 + 0 / + 8, then the next eight keys.
            unsigned b[4];
            ldmatrix_x4(b, &k_tile[(key0 + nt * 8 + (lane >> 4) * 8 + (lane & 7)) * VA_STRIDE + kk * 16 + ((lane >> 3) & 1) * 8]);
            att_mma(s[nt], a, b[0], b[1]);
            att_mma(s[nt + 1], a, b[2], b[3]);
        }
    }

    // Softmax over the warp's keys of rows gq (e < 2) and gq + 8 (e >= 2), in the log2 domain:
    // one fused multiply-add and one exp2 per score. A part with no key keeps max -inf and sum 0
    // (its scores are all -inf, so it subtracts 0 instead of its max) and weighs nothing below.
    float m[2] = {neg_inf, neg_inf}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < VA_PART_KEYS / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (key0 + nt * 8 + 2 * q4 + (e & 1) >= keys) s[nt][e] = neg_inf;
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
    for (int nt = 0; nt < VA_PART_KEYS / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[nt][e] = exp2_fast(fmaf(s[nt][e], scale_log2, -base[e >> 1]));
            l[e >> 1] += s[nt][e];
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = quad_sum(l[i]);

    // O = P V: P's k16 step kt is column tiles 2kt and 2kt + 1; V's B fragments transposed out
    // of shared memory, two dimension tiles per ldmatrix.x4 (nine tiles: the last one alone).
    float o[VA_D / 8][4];
#pragma unroll
    for (int dt = 0; dt < VA_D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
#pragma unroll
    for (int kt = 0; kt < VA_PART_KEYS / 16; ++kt) {
        const unsigned p[4] = {pack_bf16x2(s[2 * kt][0], s[2 * kt][1]), pack_bf16x2(s[2 * kt][2], s[2 * kt][3]),
                               pack_bf16x2(s[2 * kt + 1][0], s[2 * kt + 1][1]),
                               pack_bf16x2(s[2 * kt + 1][2], s[2 * kt + 1][3])};
#pragma unroll
        for (int dt = 0; dt < VA_D / 8; dt += 2) {
            const int dtile = min(dt + (lane >> 4), VA_D / 8 - 1);
            unsigned b[4];
            ldmatrix_x4_trans(b, &v_tile[(key0 + kt * 16 + (lane & 15)) * VA_STRIDE + dtile * 8]);
            att_mma(o[dt], p, b[0], b[1]);
            if (dt + 1 < VA_D / 8) att_mma(o[dt + 1], p, b[2], b[3]);
        }
    }

    // Merge: every warp leaves its rows' partial output and (max, sum) where K and V were (all
    // warps are done with them after the barrier; rows of 72 floats, 8 banks apart, so each
    // half-warp's stores hit distinct banks), then each thread combines the parts of eight
    // output columns of a row.
    float* partial_o = (float*)k_tile;                                          // [part][row][VA_D]
    float2* partial_ml = (float2*)(partial_o + VA_SPLIT * VA_ROWS * VA_D);      // [part][row]
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int rr = part * VA_ROWS + tile * 16 + gq + 8 * i;
#pragma unroll
        for (int dt = 0; dt < VA_D / 8; ++dt)
            *(float2*)&partial_o[rr * VA_D + dt * 8 + 2 * q4] = make_float2(o[dt][2 * i], o[dt][2 * i + 1]);
        if (q4 == 0) partial_ml[rr] = make_float2(m[i], l[i]);
    }
    __syncthreads();
#pragma unroll
    for (int i = threadIdx.x; i < VA_ROWS * pieces; i += VA_THREADS) {
        const int rr = i / pieces, c = i % pieces;
        if (row0 + rr >= rows_per_group) continue;
        // Part 0 always has key 0, so mx is finite; an empty part's max is -inf, its weight 0.
        float mx = neg_inf;
#pragma unroll
        for (int p = 0; p < VA_SPLIT; ++p) mx = fmaxf(mx, partial_ml[p * VA_ROWS + rr].x);
        float acc[8] = {}, sum = 0.0f;
#pragma unroll
        for (int p = 0; p < VA_SPLIT; ++p) {
            const float2 ml = partial_ml[p * VA_ROWS + rr];
            const float w = exp2_fast(ml.x - mx);
            float part_o[8];
            load8(&partial_o[(p * VA_ROWS + rr) * VA_D + c * 8], part_o);
            sum += ml.y * w;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] += w * part_o[e];
        }
        const float inv = 1.0f / sum;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] *= inv;
        store8(out + ((long)g * rows_per_group + row0 + rr) * out_stride + h * VA_D + c * 8, acc);
    }
}
#define ATTENTION_MH72(NAME, TOUT)                                                                          \
    extern "C" __global__ void __launch_bounds__(VA_THREADS)                                                \
        NAME(TOUT* out, int out_stride, const bf16* q, int q_stride, const bf16* k, int k_stride,           \
             const bf16* v, int v_stride, int rows_per_group, int keys, float scale_log2) {                  \
        attention_mh72<TOUT>(out, out_stride, q, q_stride, k, k_stride, v, v_stride, rows_per_group, keys,  \
                             scale_log2);                                                                   \
    }
FOR_TYPE(ATTENTION_MH72, attention_mh72)
