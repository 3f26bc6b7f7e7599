// The sequence around attention: validity and RoPE positions of every slot, the prompt bucket
// switch, and rotary embedding with the K/V-cache write.
#include "common.cuh"

// valid[slot] (1/0) and RoPE positions (cumsum(valid) - 1) of the prefix + suffix sequence:
// `cameras * tokens_per_image` image slots (valid when the camera is present, frame_info field 0),
// then `prompt_len` prompt slots (token_mask), then `suffix` always-valid action slots.
// One block of 1024 threads scans the sequence in chunks, carrying the running count.
extern "C" __global__ void positions_scan_1024(float* valid, int* positions, const int* frame_info, int cameras,
                                               int tokens_per_image, const int* token_mask, int prompt_len,
                                               int suffix) {
    __shared__ int warp_totals[32];
    __shared__ int carry;
    const int images = cameras * tokens_per_image, n = images + prompt_len + suffix;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (threadIdx.x == 0) carry = 0;
    __syncthreads();
    for (int base = 0; base < n; base += blockDim.x) {
        const int slot = base + threadIdx.x;
        int v = 0;
        if (slot < images) {
            v = frame_info[(slot / tokens_per_image) * 4] != 0;
        } else if (slot < images + prompt_len) {
            v = token_mask[slot - images] != 0;
        } else if (slot < n) {
            v = 1;
        }
        int s = v;  // inclusive scan inside the warp
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += t;
        }
        if (lane == 31) warp_totals[warp] = s;
        __syncthreads();
        if (warp == 0) {
            int t = lane < warps ? warp_totals[lane] : 0;
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(0xffffffffu, t, o);
                if (lane >= o) t += u;
            }
            warp_totals[lane] = t;
        }
        __syncthreads();
        const int count = carry + (warp > 0 ? warp_totals[warp - 1] : 0) + s;
        if (slot < n) {
            valid[slot] = v ? 1.0f : 0.0f;
            positions[slot] = count - 1;
        }
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1) carry = count;
        __syncthreads();
    }
}

// The device runtime's setter of a graph's conditional-node handle (a compiler builtin: no
// device-runtime library is linked).
extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle, unsigned int value);

// Picks this step's prompt bucket on the device: of `count` (at most 4) buckets of `bucket_i`
// prompt slots (ascending), the smallest that holds the last valid slot of `token_mask` (the
// last bucket when none does, the first when no slot is valid). Sets the IF-node handle of that
// bucket to 1 and the others to 0. One block of 256 threads.
extern "C" __global__ void prompt_bucket_256(const int* token_mask, int prompt_len, int count, int bucket_0,
                                             int bucket_1, int bucket_2, int bucket_3, unsigned long long handle_0,
                                             unsigned long long handle_1, unsigned long long handle_2,
                                             unsigned long long handle_3) {
    __shared__ int last;
    if (threadIdx.x == 0) last = -1;
    __syncthreads();
    int mine = -1;
    for (int i = threadIdx.x; i < prompt_len; i += blockDim.x) {
        if (token_mask[i] != 0) mine = i;
    }
    atomicMax(&last, mine);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int buckets[4] = {bucket_0, bucket_1, bucket_2, bucket_3};
        const unsigned long long handles[4] = {handle_0, handle_1, handle_2, handle_3};
        int pick = count - 1;
        for (int i = count - 1; i >= 0; --i) {
            if (buckets[i] >= last + 1) pick = i;
        }
        for (int i = 0; i < count; ++i) cudaGraphSetConditional(handles[i], i == pick ? 1u : 0u);
    }
}

// Split-half rotary embedding of the q heads (in place) and of k, written with v into row
// `cache_row + r` of the layer's K/V cache. qkv row: [heads q | k | v], each head_dim wide.
// cos/sin tables are [position][head_dim / 2], computed once at open like the CPU reference, row
// positions[position_offset + r] for row r; or, with `positions` null, the sequence's own rows
// gathered by `rope_rows_gather`, row position_offset + r.
// `per` 8 (head_dim a multiple of 16, rows 16-byte aligned, a block of at least
// (heads + 1) · head_dim / 16 + head_dim / 8 threads): each thread rotates 8 pairs of one head, or
// copies 8 values of v, with all its loads in flight at once. 1: strided single pairs.
// A programmatic dependent (the action tokens' attention) may start at once: it waits for this
// grid before reading what it writes. Launched as one itself (after the QKV product), RoPE loads
// its table rows before it waits for that product.
// `qkv` rows are [q heads | k heads | v heads]; the caches take `kv_heads * head_dim` columns.
template <typename T>
__device__ void rope_qkv(T* qkv, int qkv_stride, int heads, int kv_heads, int head_dim, const int* positions,
                         int position_offset, T* k_cache, int k_stride, T* v_cache, int v_stride, int cache_row,
                         const float* cos_table, const float* sin_table, int per) {
    const int r = blockIdx.x, half = head_dim / 2;
    // Without positions the tables are already the sequence's rows (`rope_rows_gather`): no load
    // waits for another here.
    const long at = positions ? max(positions[position_offset + r], 0) : position_offset + r;
    const float* cs = cos_table + at * half;
    const float* sn = sin_table + at * half;
    T* row = qkv + (long)r * qkv_stride;
    T* k = k_cache + (long)(cache_row + r) * k_stride;
    T* v = v_cache + (long)(cache_row + r) * v_stride;
    if (per == 8) {
        const int groups = half / 8, rotations = (heads + kv_heads) * groups, t = threadIdx.x;
        if (t < rotations) {
            const int h = t / groups, j = (t % groups) * 8;
            const T* src = row + h * head_dim;  // h >= heads: k head h - heads
            float a[8], b[8], c[8], s[8];
            load8(cs + j, c);
            load8(sn + j, s);
            wait_for_prior_grid();  // the product writing qkv, when launched as its dependent
            load8(src + j, a);
            load8(src + j + half, b);
            float lo[8], hi[8];
            for (int i = 0; i < 8; ++i) {
                lo[i] = a[i] * c[i] - b[i] * s[i];
                hi[i] = b[i] * c[i] + a[i] * s[i];
            }
            T* dst = h < heads ? row + h * head_dim : k + (h - heads) * head_dim;
            store8(dst + j, lo);
            store8(dst + j + half, hi);
        } else if (t < rotations + kv_heads * head_dim / 8) {
            const int j = (t - rotations) * 8;
            wait_for_prior_grid();
            float x[8];
            load8(row + (heads + kv_heads) * head_dim + j, x);
            store8(v + j, x);
        }
        return;
    }
    wait_for_prior_grid();
    for (int i = threadIdx.x; i < (heads + kv_heads) * half; i += blockDim.x) {
        const int h = i / half, j = i % half;
        const T* src = row + h * head_dim;  // h >= heads: k head h - heads
        const float a = to_float(src[j]), b = to_float(src[j + half]);
        T* dst = h < heads ? row + h * head_dim : k + (h - heads) * head_dim;
        dst[j] = from_float<T>(a * cs[j] - b * sn[j]);
        dst[j + half] = from_float<T>(b * cs[j] + a * sn[j]);
    }
    for (int j = threadIdx.x; j < kv_heads * head_dim; j += blockDim.x) v[j] = row[(heads + kv_heads) * head_dim + j];
}
#define ROPE_QKV(NAME, T)                                                                                \
    extern "C" __global__ void NAME(T* qkv, int qkv_stride, int heads, int kv_heads, int head_dim,        \
                                    const int* positions, int position_offset, T* k_cache, int k_stride,  \
                                    T* v_cache, int v_stride, int cache_row, const float* cos_table,      \
                                    const float* sin_table, int per) {                                    \
        launch_dependents();                                                                              \
        rope_qkv<T>(qkv, qkv_stride, heads, kv_heads, head_dim, positions, position_offset, k_cache,      \
                    k_stride, v_cache, v_stride, cache_row, cos_table, sin_table, per);                   \
    }
FOR_TYPE(ROPE_QKV, rope_qkv)

// RoPE whose rotation pairs turn by different positions of their row (the plan's RopeAxes):
// `mode` 1, Qwen3-VL's interleaved M-RoPE: pair j by row 1 of `positions` when j % 3 == 1 and
// j < 3 · s1, by row 2 when j % 3 == 2 and j < 3 · s2, else by row 0; `mode` 2, its vision RoPE:
// the first half of the pairs by row 0, the rest by row 1. Rows of `positions` are `slots` apart;
// the tables are the op's spec's. Otherwise as `rope_qkv`'s strided form: one thread per pair.
template <typename T>
__device__ void rope_qkv_axes(T* qkv, int qkv_stride, int heads, int kv_heads, int head_dim, const int* positions,
                              int position_offset, int slots, int mode, int s1, int s2, T* k_cache, int k_stride,
                              T* v_cache, int v_stride, int cache_row, const float* cos_table, const float* sin_table) {
    const int r = blockIdx.x, half = head_dim / 2;
    T* row = qkv + (long)r * qkv_stride;
    T* k = k_cache + (long)(cache_row + r) * k_stride;
    T* v = v_cache + (long)(cache_row + r) * v_stride;
    for (int i = threadIdx.x; i < (heads + kv_heads) * half; i += blockDim.x) {
        const int h = i / half, j = i % half;
        const int axis = mode == 1 ? ((j % 3 == 1 && j < 3 * s1) ? 1 : (j % 3 == 2 && j < 3 * s2) ? 2 : 0) : (j >= half / 2);
        const long at = (long)max(positions[(long)axis * slots + position_offset + r], 0) * half + j;
        const float c = cos_table[at], s = sin_table[at];
        const T* src = row + h * head_dim;  // h >= heads: k head h - heads
        const float a = to_float(src[j]), b = to_float(src[j + half]);
        T* dst = h < heads ? row + h * head_dim : k + (h - heads) * head_dim;
        dst[j] = from_float<T>(a * c - b * s);
        dst[j + half] = from_float<T>(b * c + a * s);
    }
    for (int j = threadIdx.x; j < kv_heads * head_dim; j += blockDim.x) v[j] = row[(heads + kv_heads) * head_dim + j];
}
#define ROPE_QKV_AXES(NAME, T)                                                                          \
    extern "C" __global__ void NAME(T* qkv, int qkv_stride, int heads, int kv_heads, int head_dim,         \
                                    const int* positions, int position_offset, int slots, int mode, int s1, \
                                    int s2, T* k_cache, int k_stride, T* v_cache, int v_stride,             \
                                    int cache_row, const float* cos_table, const float* sin_table) {        \
        rope_qkv_axes<T>(qkv, qkv_stride, heads, kv_heads, head_dim, positions, position_offset, slots,     \
                         mode, s1, s2, k_cache, k_stride, v_cache, v_stride, cache_row, cos_table,          \
                         sin_table);                                                                        \
    }
FOR_TYPE(ROPE_QKV_AXES, rope_qkv_axes)

// The RoPE table rows of every slot of the sequence, once per step after `positions_scan_1024`:
// cos_rows[s] = cos_table[positions[s]] (and sin), so that the step's many `rope_qkv` launches
// read their rows directly instead of waiting for a position first.
// One block per slot, one thread per 4 of the `half` columns.
extern "C" __global__ void rope_rows_gather(float* cos_rows, float* sin_rows, const int* positions, const float* cos_table,
                                            const float* sin_table, int half) {
    const long from = (long)max(positions[blockIdx.x], 0) * half, to = (long)blockIdx.x * half;
    for (int j = threadIdx.x * 4; j < half; j += blockDim.x * 4) {
        *(float4*)&cos_rows[to + j] = *(const float4*)&cos_table[from + j];
        *(float4*)&sin_rows[to + j] = *(const float4*)&sin_table[from + j];
    }
}

// p[r, :] = softmax(s[r, :]) over the keys with key_valid[j] != 0 (f32 math, bf16 probabilities
// for the PV product); masked keys get 0 and a row with no valid key is all 0, as the CPU
// reference. Rows are [heads][queries]; a query with query_valid[q] == 0 gets an all-0 row (its
// output is never read; zeros keep it equal to the reference). One warp per row of `keys` scores;
// `s` and `p` are dense [rows, keys]. Either mask may be null. A row of at most
// 32 · SOFTMAX_HELD keys stays in registers (lane l holds keys 4l … 4l + 3, 4l + 128 … when the
// row is a whole number of 16-byte pieces, else keys l, l + 32, ...), so its scores are read
// once; longer rows are read three times. All give the same exponentials; only the order of
// the sum differs between the held forms.
