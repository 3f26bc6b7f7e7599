// The masked softmax between the two cuBLASLt products (QK^T and PV) of the general attention
// path: every attention shape the fused kernels do not take.
#include "common.cuh"

#define SOFTMAX_HELD 32
// Row `row` holds query `row % queries` of one head. `causal_offset` >= 0 masks the keys past
// `query + causal_offset` (decoder self-attention); -1: none.
extern "C" __global__ void softmax_rows_masked_f32_bf16(bf16* p, const float* s, int rows, int queries, int keys,
                                                        const float* key_valid, const float* query_valid,
                                                        int causal_offset) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (row >= rows) return;
    // Keys at or past `seen` are masked: those past the causal limit.
    const int seen = causal_offset < 0 ? keys : min(keys, row % queries + causal_offset + 1);
    const float* sr = s + (long)row * keys;
    bf16* pr = p + (long)row * keys;
    if (query_valid && query_valid[row % queries] == 0.0f) {
        for (int j = lane; j < keys; j += 32) pr[j] = from_float<bf16>(0.0f);
        return;
    }
    const float neg_inf = __int_as_float(0xff800000);
    if (keys % 4 == 0 && keys <= 32 * SOFTMAX_HELD) {
        // Four consecutive keys per lane and load: a quarter of the loads and stores.
        float4 v[SOFTMAX_HELD / 4];
        float m = neg_inf;
#pragma unroll
        for (int i = 0; i < SOFTMAX_HELD / 4; ++i) {
            const int j = 4 * (lane + 32 * i);
            if (j < keys) {
                const float4 score = *(const float4*)&sr[j];
                const float4 ok = key_valid ? *(const float4*)&key_valid[j] : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
                v[i] = make_float4(ok.x != 0.0f && j < seen ? score.x : neg_inf, ok.y != 0.0f && j + 1 < seen ? score.y : neg_inf,
                                   ok.z != 0.0f && j + 2 < seen ? score.z : neg_inf, ok.w != 0.0f && j + 3 < seen ? score.w : neg_inf);
            } else {
                v[i] = make_float4(neg_inf, neg_inf, neg_inf, neg_inf);
            }
            m = fmaxf(m, fmaxf(fmaxf(v[i].x, v[i].y), fmaxf(v[i].z, v[i].w)));
        }
        m = warp_max(m);
        float sum = 0.0f;
        auto e = [&](float x) { return x == neg_inf ? 0.0f : exp2_fast((x - m) * LOG2E); };
#pragma unroll
        for (int i = 0; i < SOFTMAX_HELD / 4; ++i) {
            v[i] = make_float4(e(v[i].x), e(v[i].y), e(v[i].z), e(v[i].w));
            sum += (v[i].x + v[i].y) + (v[i].z + v[i].w);
        }
        sum = warp_sum(sum);
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
        for (int i = 0; i < SOFTMAX_HELD / 4; ++i) {
            const int j = 4 * (lane + 32 * i);
            if (j < keys) *(uint2*)&pr[j] = make_uint2(pack_bf16x2(v[i].x * inv, v[i].y * inv), pack_bf16x2(v[i].z * inv, v[i].w * inv));
        }
        return;
    }
    if (keys <= 32 * SOFTMAX_HELD) {
        float v[SOFTMAX_HELD];
        float m = neg_inf;
#pragma unroll
        for (int i = 0; i < SOFTMAX_HELD; ++i) {
            const int j = lane + 32 * i;
            // Both loads issued before either is tested: one round trip, not a mask then a score.
            const float score = j < keys ? sr[j] : neg_inf;
            v[i] = j < seen && (!key_valid || key_valid[j] != 0.0f) ? score : neg_inf;
            m = fmaxf(m, v[i]);
        }
        m = warp_max(m);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < SOFTMAX_HELD; ++i) {
            v[i] = v[i] == neg_inf ? 0.0f : exp2_fast((v[i] - m) * LOG2E);
            sum += v[i];
        }
        sum = warp_sum(sum);
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
        for (int i = 0; i < SOFTMAX_HELD; ++i) {
            if (lane + 32 * i < keys) pr[lane + 32 * i] = from_float<bf16>(v[i] * inv);
        }
        return;
    }
    float m = neg_inf;
    for (int j = lane; j < seen; j += 32) {
        if (!key_valid || key_valid[j] != 0.0f) m = fmaxf(m, sr[j]);
    }
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < seen; j += 32) {
        if (!key_valid || key_valid[j] != 0.0f) sum += exp2_fast((sr[j] - m) * LOG2E);
    }
    sum = warp_sum(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = lane; j < keys; j += 32) {
        const bool ok = j < seen && (!key_valid || key_valid[j] != 0.0f);
        pr[j] = from_float<bf16>(ok ? exp2_fast((sr[j] - m) * LOG2E) * inv : 0.0f);
    }
}
