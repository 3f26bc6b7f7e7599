// The non-GEMM parts of attention: validity/positions of the sequence, rotary embedding with the
// K/V-cache write, and the masked softmax between the two cuBLASLt products (QK^T and PV).
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

// Split-half rotary embedding of the q heads (in place) and of k, written with v into row
// `cache_row + r` of the layer's K/V cache. qkv row: [heads q | k | v], each head_dim wide.
// cos/sin tables are [position][head_dim / 2], computed once at open like the CPU reference.
template <typename T>
__device__ void rope_qkv(T* qkv, int qkv_stride, int heads, int head_dim, const int* positions,
                         int position_offset, T* k_cache, int k_stride, T* v_cache, int v_stride, int cache_row,
                         const float* cos_table, const float* sin_table) {
    const int r = blockIdx.x, half = head_dim / 2;
    const int pos = max(positions[position_offset + r], 0);
    const float* cs = cos_table + (long)pos * half;
    const float* sn = sin_table + (long)pos * half;
    T* row = qkv + (long)r * qkv_stride;
    T* k = k_cache + (long)(cache_row + r) * k_stride;
    T* v = v_cache + (long)(cache_row + r) * v_stride;
    for (int i = threadIdx.x; i < (heads + 1) * half; i += blockDim.x) {
        const int h = i / half, j = i % half;
        const T* src = row + h * head_dim;  // h == heads: the k part
        const float a = to_float(src[j]), b = to_float(src[j + half]);
        T* dst = h < heads ? row + h * head_dim : k;
        dst[j] = from_float<T>(a * cs[j] - b * sn[j]);
        dst[j + half] = from_float<T>(b * cs[j] + a * sn[j]);
    }
    for (int j = threadIdx.x; j < head_dim; j += blockDim.x) v[j] = row[(heads + 1) * head_dim + j];
}
#define ROPE_QKV(NAME, T)                                                                                \
    extern "C" __global__ void NAME(T* qkv, int qkv_stride, int heads, int head_dim, const int* positions, \
                                    int position_offset, T* k_cache, int k_stride, T* v_cache,            \
                                    int v_stride, int cache_row, const float* cos_table,                  \
                                    const float* sin_table) {                                             \
        rope_qkv<T>(qkv, qkv_stride, heads, head_dim, positions, position_offset, k_cache, k_stride,      \
                    v_cache, v_stride, cache_row, cos_table, sin_table);                                  \
    }
FOR_TYPE(ROPE_QKV, rope_qkv)

// p[r, :] = softmax(s[r, :]) over the keys with key_valid[j] != 0 (f32 math, bf16 probabilities
// for the PV product); masked keys get 0 and a row with no valid key is all 0, as the CPU
// reference. Rows are [heads][queries]; a query with query_valid[q] == 0 gets an all-0 row (its
// output is never read; zeros keep it equal to the reference). One warp per row of `keys` scores;
// `s` and `p` are dense [rows, keys]. Either mask may be null.
extern "C" __global__ void softmax_rows_masked_f32_bf16(bf16* p, const float* s, int rows, int queries, int keys,
                                                        const float* key_valid, const float* query_valid) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* sr = s + (long)row * keys;
    bf16* pr = p + (long)row * keys;
    if (query_valid && query_valid[row % queries] == 0.0f) {
        for (int j = lane; j < keys; j += 32) pr[j] = from_float<bf16>(0.0f);
        return;
    }
    float m = __int_as_float(0xff800000);  // -inf
    for (int j = lane; j < keys; j += 32) {
        if (!key_valid || key_valid[j] != 0.0f) m = fmaxf(m, sr[j]);
    }
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < keys; j += 32) {
        if (!key_valid || key_valid[j] != 0.0f) sum += expf(sr[j] - m);
    }
    sum = warp_sum(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = lane; j < keys; j += 32) {
        const bool ok = !key_valid || key_valid[j] != 0.0f;
        pr[j] = from_float<bf16>(ok ? expf(sr[j] - m) * inv : 0.0f);
    }
}
