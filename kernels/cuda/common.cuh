// Shared device helpers. No CUDA toolkit header is included: NVRTC ships none, and a deployment
// box may have NVRTC without a toolkit. bf16 travels as raw bits and is converted by hand.
#pragma once

// A bf16 value as its 16 raw bits (the upper half of an IEEE f32).
struct bf16 {
    unsigned short bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(((unsigned)v.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
// Round to nearest, ties to even, as PyTorch's float -> bfloat16 cast; NaN stays a quiet NaN.
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) {
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return bf16{(unsigned short)((u >> 16) | 0x40u)};
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16{(unsigned short)(u >> 16)};
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32); every thread gets the total.
// `scratch` holds 32 floats of shared memory; the leading barrier lets callers reuse it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// 0.5 x (1 + tanh(u)) written as x / (1 + e^(-2u)): the same function with one fast exponential
// instead of tanhf (the prefix MLP applies it to 11.7 M values per step).
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608f;  // sqrt(2 / pi)
    return x / (1.0f + __expf(-2.0f * k * (x + 0.044715f * x * x * x)));
}

// Two f32 as bf16x2 (the lower index in the low half), as mma operands and vector stores take them.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    return (unsigned)from_float<bf16>(lo).bits | ((unsigned)from_float<bf16>(hi).bits << 16);
}

// Eight consecutive elements as f32, one 16-byte access per eight bf16 or four f32.
__device__ __forceinline__ void load8(const bf16* p, float* v) {
    const uint4 u = *(const uint4*)p;
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(bf16* p, const float* v) {
    *(uint4*)p = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}
__device__ __forceinline__ void store8(float* p, const float* v) {
    ((float4*)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4*)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Instantiates `KERNEL(NAME, TIN, TOUT)` for the four f32/bf16 input/output combinations,
// named `<name>_<in>_<out>` (the Rust launchers build the same names).
#define FOR_IN_OUT(KERNEL, NAME)            \
    KERNEL(NAME##_f32_f32, float, float)    \
    KERNEL(NAME##_f32_bf16, float, bf16)    \
    KERNEL(NAME##_bf16_f32, bf16, float)    \
    KERNEL(NAME##_bf16_bf16, bf16, bf16)

// Instantiates `KERNEL(NAME, T)` for f32 and bf16, named `<name>_<t>`.
#define FOR_TYPE(KERNEL, NAME)  \
    KERNEL(NAME##_f32, float)   \
    KERNEL(NAME##_bf16, bf16)
