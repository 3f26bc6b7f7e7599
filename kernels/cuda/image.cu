// SigLIP preprocessing straight from the caller's u8 frame: resize-with-pad to size x size
// (bilinear, align_corners=False, no antialias, as lerobot's torch path), map to [-1, 1] and write
// patches in (channel, y, x) order, the flattened conv-weight layout, so the patch embedding is
// one GEMM. The arithmetic follows the CPU reference (runtime/src/image.rs) operation by operation;
// __fmul_rn/__fadd_rn keep the compiler from contracting the source-index math into FMAs, which
// could move a sample across a pixel boundary.
#include "common.cuh"

// frame_info per camera: [present, width, height, pixel format (0 RGB, 1 BGR, 2 RGBA)]. The
// frames and `frame_info` live in mapped host memory: a block reads the camera's info once.
template <typename Tout>
__device__ void image_patches(Tout* out, int out_stride, const unsigned char* frames, long frame_stride,
                              const int* frame_info, int camera, int size, int patch) {
    __shared__ int info[4];
    if (threadIdx.x < 4) info[threadIdx.x] = frame_info[camera * 4 + threadIdx.x];
    __syncthreads();
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= size * size) return;
    const int y = idx / size, x = idx % size;
    const int per_side = size / patch;
    Tout* o = out + (long)((y / patch) * per_side + x / patch) * out_stride + (y % patch) * patch + x % patch;
    const int pp = patch * patch;
    const int width = info[1], height = info[2];
    float rgb[3] = {-1.0f, -1.0f, -1.0f};
    if (info[0] != 0 && width > 0 && height > 0) {
        // Python: ratio = max(w / size, h / size); int(h / ratio), in f64.
        const double ratio = fmax((double)width / size, (double)height / size);
        const int rh = min(max((int)(height / ratio), 1), size);
        const int rw = min(max((int)(width / ratio), 1), size);
        const int top = (size - rh) / 2, left = (size - rw) / 2;
        if (y >= top && y < top + rh && x >= left && x < left + rw) {
            const float scale_h = (float)height / (float)rh, scale_w = (float)width / (float)rw;
            const float sy = fmaxf(__fadd_rn(__fmul_rn(scale_h, (float)(y - top) + 0.5f), -0.5f), 0.0f);
            const float sx = fmaxf(__fadd_rn(__fmul_rn(scale_w, (float)(x - left) + 0.5f), -0.5f), 0.0f);
            const int y0 = min((int)sy, height - 1), x0 = min((int)sx, width - 1);
            const int y1 = y0 < height - 1 ? y0 + 1 : y0, x1 = x0 < width - 1 ? x0 + 1 : x0;
            const float ly = sy - y0, lx = sx - x0;
            const int format = info[3];
            const int bpp = format == 2 ? 4 : 3;
            const unsigned char* data = frames + camera * frame_stride;
            for (int c = 0; c < 3; c++) {
                const int off = format == 1 ? 2 - c : c;
                const float p00 = data[((long)y0 * width + x0) * bpp + off] / 255.0f;
                const float p01 = data[((long)y0 * width + x1) * bpp + off] / 255.0f;
                const float p10 = data[((long)y1 * width + x0) * bpp + off] / 255.0f;
                const float p11 = data[((long)y1 * width + x1) * bpp + off] / 255.0f;
                const float v = (1.0f - ly) * ((1.0f - lx) * p00 + lx * p01) + ly * ((1.0f - lx) * p10 + lx * p11);
                rgb[c] = fminf(fmaxf(v, 0.0f), 1.0f) * 2.0f - 1.0f;
            }
        }
    }
    for (int c = 0; c < 3; c++) o[c * pp] = from_float<Tout>(rgb[c]);
}
#define IMAGE_PATCHES(NAME, TOUT)                                                                     \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const unsigned char* frames,           \
                                    long frame_stride, const int* frame_info, int camera, int size,   \
                                    int patch) {                                                      \
        image_patches<TOUT>(out, out_stride, frames, frame_stride, frame_info, camera, size, patch);  \
    }
FOR_TYPE(IMAGE_PATCHES, image_patches_u8)
