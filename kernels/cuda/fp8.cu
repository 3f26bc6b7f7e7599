// Activations into e4m3, the input of the FP8 products (cuBLASLt reads both operands in e4m3 with
// per-tensor scales): dst = e4m3(src · inverse_scale), round to nearest even, saturating to ±448,
// as CUDA's __nv_cvt_float_to_fp8(…, __NV_SATFINITE, __NV_E4M3) and the runtime's CPU emulation
// (runtime/src/fp8.rs) round. The conversion instruction exists from sm_89 on (Ada, Hopper,
// Blackwell, Thor): GPUs before it have no FP8 tensor cores, and the runtime refuses FP8 there.
#include "common.cuh"

#if __CUDA_ARCH__ >= 890
// Four values per thread (cols and dst_stride multiples of 4), one 4-byte store. Launch shape:
// grid (ceil(cols / 4 / block), rows).
template <typename T>
__device__ void quantize_e4m3(unsigned* dst, int dst_stride, const T* src, int src_stride, int rows, int cols, float inverse_scale) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    const int r = blockIdx.y;
    if (c >= cols || r >= rows) return;
    const T* s = src + (long)r * src_stride + c;
    const unsigned low = e4m3x2(to_float(s[0]) * inverse_scale, to_float(s[1]) * inverse_scale);
    const unsigned high = e4m3x2(to_float(s[2]) * inverse_scale, to_float(s[3]) * inverse_scale);
    dst[((long)r * dst_stride + c) / 4] = low | (high << 16);
}
#define QUANTIZE(NAME, T)                                                                              \
    extern "C" __global__ void NAME(unsigned* dst, int dst_stride, const T* src, int src_stride, int rows, \
                                    int cols, float inverse_scale) {                                   \
        quantize_e4m3<T>(dst, dst_stride, src, src_stride, rows, cols, inverse_scale);                 \
    }
FOR_TYPE(QUANTIZE, quantize_e4m3)
#endif
