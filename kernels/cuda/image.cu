// SigLIP preprocessing straight from the caller's u8 frame: resize-with-pad to size x size
// (bilinear, align_corners=False, no antialias, as lerobot's torch path), map to [-1, 1] and write
// patches in (channel, y, x) order, the flattened conv-weight layout, so the patch embedding is
// one GEMM. The arithmetic follows the CPU reference (runtime/src/image.rs) operation by operation;
// __fmul_rn/__fadd_rn keep the compiler from contracting the source-index math into FMAs, which
// could move a sample across a pixel boundary.
#include "common.cuh"

// Bytes of one staged source row in shared memory (a 2048-pixel RGBA row); wider rows are read
// from the frame pixel by pixel.
#define IMG_ROW_BYTES 8192

// Source bytes [first, first + count) of the camera's frame (which spans [lo, hi)) into `row`, in
// 16-byte pieces aligned as in memory: the frame lives in mapped host memory, where every load
// is a bus transaction, so a block reads each row once in few large pieces. Returns the offset of
// byte `first` in `row`. Pieces past either end of the frame are read byte by byte.
__device__ int image_stage_row(unsigned char* row, const unsigned char* first, long count, const unsigned char* lo,
                               const unsigned char* hi) {
    const unsigned char* base = (const unsigned char*)((unsigned long)first & ~15ul);
    const int pieces = (int)((first + count - base + 15) / 16);
    for (int i = threadIdx.x; i < pieces; i += blockDim.x) {
        const unsigned char* at = base + 16 * i;
        if (at >= lo && at + 16 <= hi) {
            *(uint4*)(row + 16 * i) = *(const uint4*)at;
        } else {
            for (int b = 0; b < 16; ++b)
                if (at + b >= lo && at + b < hi) row[16 * i + b] = at[b];
        }
    }
    return (int)(first - base);
}

// frame_info per camera: [present, width, height, pixel format (0 RGB, 1 BGR, 2 RGBA)]. Grid
// (size, cameras): block (y, c) writes output row y of camera `camera + c`, whose (size / patch)²
// patch rows follow those of the camera before it in `out`. The two source rows it samples are
// staged in shared memory first.
template <typename Tout>
__device__ void image_patches(Tout* out, int out_stride, const unsigned char* frames, long frame_stride,
                              const int* frame_info, int camera, int size, int patch) {
    __shared__ int info[4];
    __shared__ __align__(16) unsigned char rows[2][IMG_ROW_BYTES + 32];
    __shared__ int row_at[2];
    const int y = blockIdx.x, per_side = size / patch, pp = patch * patch;
    camera += blockIdx.y;
    out += (long)blockIdx.y * per_side * per_side * out_stride;
    if (threadIdx.x < 4) info[threadIdx.x] = frame_info[camera * 4 + threadIdx.x];
    __syncthreads();
    const int width = info[1], height = info[2], format = info[3];
    const int bpp = format == 2 ? 4 : 3;
    const unsigned char* data = frames + camera * frame_stride;
    bool inside_rows = false, staged = false;
    int rw = 0, left = 0, y0 = 0, y1 = 0;
    float ly = 0.0f, scale_w = 1.0f;
    if (info[0] != 0 && width > 0 && height > 0) {
        // Python: ratio = max(w / size, h / size); int(h / ratio), in f64.
        const double ratio = fmax((double)width / size, (double)height / size);
        const int rh = min(max((int)(height / ratio), 1), size);
        rw = min(max((int)(width / ratio), 1), size);
        const int top = (size - rh) / 2;
        left = (size - rw) / 2;
        inside_rows = y >= top && y < top + rh;
        if (inside_rows) {
            const float scale_h = (float)height / (float)rh;
            scale_w = (float)width / (float)rw;
            const float sy = fmaxf(__fadd_rn(__fmul_rn(scale_h, (float)(y - top) + 0.5f), -0.5f), 0.0f);
            y0 = min((int)sy, height - 1);
            y1 = y0 < height - 1 ? y0 + 1 : y0;
            ly = sy - y0;
            const long row_bytes = (long)width * bpp;
            staged = row_bytes <= IMG_ROW_BYTES;
            if (staged) {
                for (int r = 0; r < 2; ++r) {
                    const int at = image_stage_row(rows[r], data + (long)(r ? y1 : y0) * row_bytes, row_bytes, data, data + frame_stride);
                    if (threadIdx.x == 0) row_at[r] = at;
                }
            }
        }
    }
    __syncthreads();
    for (int x = threadIdx.x; x < size; x += blockDim.x) {
        Tout* o = out + (long)((y / patch) * per_side + x / patch) * out_stride + (y % patch) * patch + x % patch;
        float rgb[3] = {-1.0f, -1.0f, -1.0f};
        if (inside_rows && x >= left && x < left + rw) {
            const float sx = fmaxf(__fadd_rn(__fmul_rn(scale_w, (float)(x - left) + 0.5f), -0.5f), 0.0f);
            const int x0 = min((int)sx, width - 1);
            const int x1 = x0 < width - 1 ? x0 + 1 : x0;
            const float lx = sx - x0;
            // Byte `channel` of pixel `px` of source row r (0: y0, 1: y1).
            auto pixel = [&](int r, int px, int channel) {
                const long i = (long)px * bpp + channel;
                return (staged ? rows[r][row_at[r] + i] : data[(long)(r ? y1 : y0) * width * bpp + i]) / 255.0f;
            };
            for (int c = 0; c < 3; c++) {
                const int off = format == 1 ? 2 - c : c;
                const float p00 = pixel(0, x0, off), p01 = pixel(0, x1, off);
                const float p10 = pixel(1, x0, off), p11 = pixel(1, x1, off);
                const float v = (1.0f - ly) * ((1.0f - lx) * p00 + lx * p01) + ly * ((1.0f - lx) * p10 + lx * p11);
                rgb[c] = fminf(fmaxf(v, 0.0f), 1.0f) * 2.0f - 1.0f;
            }
        }
        for (int c = 0; c < 3; c++) o[c * pp] = from_float<Tout>(rgb[c]);
    }
}
#define IMAGE_PATCHES(NAME, TOUT)                                                                     \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const unsigned char* frames,           \
                                    long frame_stride, const int* frame_info, int camera, int size,   \
                                    int patch) {                                                      \
        image_patches<TOUT>(out, out_stride, frames, frame_stride, frame_info, camera, size, patch);  \
    }
FOR_TYPE(IMAGE_PATCHES, image_patches_u8)
