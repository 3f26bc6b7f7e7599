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

// ---- GR00T N1.7's image, as the Qwen2-VL processor's pixel values (runtime/src/qwen_image.rs is
// the CPU form; both equal PyTorch's uint8 kernel to the level): optional letterbox, a square
// resize to `edge`, a centre crop, a resize to `target`, each bicubic with antialiasing in two
// separable passes (width, then height) with integer weights — normalized in f64, scaled by
// 2^precision (the largest precision keeping the pass's largest weight within an i16), summed in
// i32 with a rounding term, u8 between passes — then (x - 127.5) / 127.5 in merge-ordered
// patches. Four passes; `qwen_image_weights` makes their tables on the device each step (the
// frame's size is data), `qwen_image_resample` runs one pass, `qwen_image_patchify` writes rows.

struct QwenGeometry {
    int present, width, height, bpp, format;
    int w0, h0, left, top;        // the letterboxed frame and the frame's place in it
    int crop, crop_origin;        // the centre crop of the edge² image
};

__device__ QwenGeometry qwen_geometry(const int* info, int edge, double crop_fraction, int letterbox) {
    QwenGeometry g;
    g.present = info[0] != 0 && info[1] > 0 && info[2] > 0;
    g.width = info[1];
    g.height = info[2];
    g.format = info[3];
    g.bpp = g.format == 2 ? 4 : 3;
    const int side = max(g.width, g.height);
    g.w0 = letterbox ? side : g.width;
    g.h0 = letterbox ? side : g.height;
    g.left = (g.w0 - g.width) / 2;
    g.top = (g.h0 - g.height) / 2;
    // Python's round (half to even) of the crop side, a floored offset.
    g.crop = crop_fraction > 0.0 && crop_fraction < 1.0 ? max(1, (int)rint(edge * crop_fraction)) : edge;
    g.crop_origin = (edge - g.crop) / 2;
    return g;
}

// Input and output lengths of pass p: width then height to `edge`, then the crop's to `target`.
__device__ void qwen_pass_lengths(const QwenGeometry& g, int p, int edge, int target, int* in, int* out) {
    *in = p == 0 ? g.w0 : p == 1 ? g.h0 : g.crop;
    *out = p < 2 ? edge : target;
}

__device__ double qwen_bicubic(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

// Output i's window over `in` inputs (first index, length) and its normalized weight j.
__device__ void qwen_window(int in, int out, int i, int* start, int* count) {
    const double scale = (double)in / out, support = scale >= 1.0 ? 2.0 * scale : 2.0;
    const double center = scale * (i + 0.5);
    *start = max((int)(center - support + 0.5), 0);
    *count = min((int)(center + support + 0.5), in) - *start;
}
__device__ double qwen_weight(int in, int out, int i, int start, int count, int j) {
    const double scale = (double)in / out, invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    const double center = scale * (i + 0.5);
    double total = 0.0;
    for (int k = 0; k < count; ++k) total += qwen_bicubic((start + k - center + 0.5) * invscale);
    const double w = qwen_bicubic((start + j - center + 0.5) * invscale);
    return total != 0.0 ? w / total : w;
}

// Tables: per pass, `table_ints` ints: [precision, then per output: start, count, `taps` weights].
// One block of 256 threads per pass.
extern "C" __global__ void qwen_image_weights(int* tables, int table_ints, int taps, const int* frame_info, int camera,
                                              int edge, int target, double crop_fraction, int letterbox) {
    __shared__ double largest[256];
    const QwenGeometry g = qwen_geometry(frame_info + camera * 4, edge, crop_fraction, letterbox);
    if (!g.present) return;
    const int p = blockIdx.x;
    int in, out;
    qwen_pass_lengths(g, p, edge, target, &in, &out);
    double mine = -1e300;
    for (int i = threadIdx.x; i < out; i += blockDim.x) {
        int start, count;
        qwen_window(in, out, i, &start, &count);
        for (int j = 0; j < count; ++j) mine = fmax(mine, qwen_weight(in, out, i, start, count, j));
    }
    largest[threadIdx.x] = mine;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) largest[threadIdx.x] = fmax(largest[threadIdx.x], largest[threadIdx.x + s]);
        __syncthreads();
    }
    int precision = 22;
    for (int q = 0; q < 22; ++q) {
        if ((long long)(0.5 + largest[0] * (double)(1 << (q + 1))) >= (1 << 15)) {
            precision = q;
            break;
        }
    }
    int* t = tables + (long)p * table_ints;
    if (threadIdx.x == 0) t[0] = precision;
    for (int i = threadIdx.x; i < out; i += blockDim.x) {
        int start, count;
        qwen_window(in, out, i, &start, &count);
        int* row = t + 1 + (long)i * (2 + taps);
        row[0] = start;
        row[1] = min(count, taps);
        for (int j = 0; j < min(count, taps); ++j) {
            const double v = qwen_weight(in, out, i, start, count, j) * (double)(1 << precision);
            row[2 + j] = (int)(v < 0.0 ? -0.5 + v : 0.5 + v);
        }
    }
}

// Pass p: 0 frame -> a [3][h0][edge], 1 a -> b [3][edge][edge], 2 b's crop -> a [3][crop][target],
// 3 a -> b [3][target][target]. One thread per output value (grid sized for the largest frame).
extern "C" __global__ void qwen_image_resample(unsigned char* a, unsigned char* b, const unsigned char* frames,
                                               long frame_stride, const int* tables, int table_ints, int taps,
                                               const int* frame_info, int camera, int edge, int target,
                                               double crop_fraction, int letterbox, int p) {
    const QwenGeometry g = qwen_geometry(frame_info + camera * 4, edge, crop_fraction, letterbox);
    if (!g.present) return;
    int in, out;
    qwen_pass_lengths(g, p, edge, target, &in, &out);
    // The output plane: rows x cols per channel.
    const int rows = p == 0 ? g.h0 : p == 1 ? edge : p == 2 ? g.crop : target;
    const int cols = p == 1 || p == 3 ? (p == 1 ? edge : target) : out;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= 3L * rows * cols) return;
    const int c = idx / ((long)rows * cols), y = (idx / cols) % rows, x = idx % cols;
    const bool horizontal = p == 0 || p == 2;
    const int i = horizontal ? x : y;
    const int* t = tables + (long)p * table_ints;
    const int* row = t + 1 + (long)i * (2 + taps);
    const int start = row[0], count = row[1], precision = t[0];
    const unsigned char* data = frames + camera * frame_stride;
    const int off = g.format == 1 ? 2 - c : c;
    int sum = 1 << (precision - 1);
    for (int j = 0; j < count; ++j) {
        int v;
        if (p == 0) {
            // Letterboxed coordinates: outside the frame is the zero padding.
            const int fx = start + j - g.left, fy = y - g.top;
            v = fx >= 0 && fx < g.width && fy >= 0 && fy < g.height ? data[((long)fy * g.width + fx) * g.bpp + off] : 0;
        } else if (p == 1) {
            v = a[((long)c * g.h0 + start + j) * edge + x];
        } else if (p == 2) {
            v = b[((long)c * edge + g.crop_origin + y) * edge + g.crop_origin + start + j];
        } else {
            v = a[((long)c * g.crop + start + j) * target + x];
        }
        sum += v * row[2 + j];
    }
    const unsigned char level = (unsigned char)min(max(sum >> precision, 0), 255);
    unsigned char* dst = p == 0 || p == 2 ? a : b;
    // Pass 2 writes `a` while pass 1's output (b) is its input; pass 0's `a` was read by pass 1.
    dst[((long)c * rows + y) * cols + x] = level;
}

// ---- The albumentations path (`use_albumentations`; runtime/src/qwen_image.rs `cv2_area` is the
// CPU form, and both equal OpenCV's x86-64 INTER_AREA to the level): a square (letterboxed) frame
// resized to `edge`, its floored centre crop resized back to `edge`, the patch rows as above.
// Pass 0: frame -> a [3][edge][edge]; pass 1: a's crop -> b [3][edge][edge]; one thread per
// output value. OpenCV's order and precision of every operation, through the _rn intrinsics so
// that no multiply-add is contracted into an FMA.

__device__ int cv_crop_side(int edge, double crop_fraction) {
    return crop_fraction > 0.0 && crop_fraction < 1.0 ? max(1, (int)__dmul_rn((double)edge, crop_fraction)) : edge;
}

// computeResizeAreaTab for output d: a partial cell at either end, whole cells between.
struct CvCells {
    double fsx1, fsx2, cell;
    int sx1, sx2;
};
__device__ CvCells cv_cells(int input, double scale, int d) {
    CvCells k;
    k.fsx1 = __dmul_rn((double)d, scale);
    k.fsx2 = __dadd_rn(k.fsx1, scale);
    k.cell = fmin(scale, __dsub_rn((double)input, k.fsx1));
    k.sx2 = min((int)floor(k.fsx2), input - 1);
    k.sx1 = min((int)ceil(k.fsx1), k.sx2);
    return k;
}
// Its j-th (index, weight), j < cv_cell_count.
__device__ int cv_cell_count(const CvCells& k) {
    return (k.sx1 - k.fsx1 > 1e-3) + (k.sx2 - k.sx1) + (k.fsx2 - k.sx2 > 1e-3);
}
__device__ void cv_cell(const CvCells& k, int j, int* index, float* weight) {
    const bool head = k.sx1 - k.fsx1 > 1e-3;
    if (head && j == 0) {
        *index = k.sx1 - 1;
        *weight = (float)((k.sx1 - k.fsx1) / k.cell);
        return;
    }
    const int w = j - head;
    if (w < k.sx2 - k.sx1) {
        *index = k.sx1 + w;
        *weight = (float)(1.0 / k.cell);
        return;
    }
    *index = k.sx2;
    *weight = (float)(fmin(fmin(k.fsx2 - k.sx2, 1.0), k.cell) / k.cell);
}

// Growing: the first input index and the 11-bit weights of it and the next.
__device__ int cv_linear(double inv, int d, int* w0, int* w1) {
    const int s = (int)floor(__dmul_rn((double)d, 1.0 / inv));
    float f = (float)__dsub_rn((double)(d + 1), __dmul_rn((double)(s + 1), inv));
    f = f <= 0.0f ? 0.0f : f - floorf(f);
    *w0 = (int)rintf(__fmul_rn(1.0f - f, 2048.0f));
    *w1 = (int)rintf(__fmul_rn(f, 2048.0f));
    return s;
}

extern "C" __global__ void qwen_image_area(unsigned char* a, unsigned char* b, const unsigned char* frames, long frame_stride,
                                           const int* frame_info, int camera, int edge, double crop_fraction, int letterbox,
                                           int p) {
    const QwenGeometry g = qwen_geometry(frame_info + camera * 4, edge, crop_fraction, letterbox);
    if (!g.present) return;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= 3L * edge * edge) return;
    const int c = idx / ((long)edge * edge), y = (idx / edge) % edge, x = idx % edge;
    const int crop = cv_crop_side(edge, crop_fraction), origin = (edge - crop) / 2;
    const int sw = p == 0 ? g.w0 : crop, sh = p == 0 ? g.h0 : crop;
    const unsigned char* frame = frames + camera * frame_stride;
    const int off = g.format == 1 ? 2 - c : c;
    auto at = [&](int sx, int sy) -> int {
        if (p == 1) return a[((long)c * edge + origin + sy) * edge + origin + sx];
        const int fx = sx - g.left, fy = sy - g.top;
        return fx >= 0 && fx < g.width && fy >= 0 && fy < g.height ? frame[((long)fy * g.width + fx) * g.bpp + off] : 0;
    };
    const double inv_x = (double)edge / sw, inv_y = (double)edge / sh;
    const double scale_x = 1.0 / inv_x, scale_y = 1.0 / inv_y;
    int level;
    if (scale_x >= 1.0 && scale_y >= 1.0) {
        const int ix = (int)round(scale_x), iy = (int)round(scale_y);
        if (fabs(scale_x - ix) < 2.220446049250313e-16 && fabs(scale_y - iy) < 2.220446049250313e-16) {
            int sum = 0;
            for (int j = 0; j < iy; ++j)
                for (int i = 0; i < ix; ++i) sum += at(x * ix + i, y * iy + j);
            level = ix == 2 && iy == 2 ? (sum + 2) >> 2 : (int)rintf(__fmul_rn((float)sum, 1.0f / (float)(ix * iy)));
        } else {
            const CvCells kx = cv_cells(sw, scale_x, x), ky = cv_cells(sh, scale_y, y);
            const int nx = cv_cell_count(kx), ny = cv_cell_count(ky);
            float sum = 0.0f;
            for (int j = 0; j < ny; ++j) {
                int sy;
                float beta;
                cv_cell(ky, j, &sy, &beta);
                float row = 0.0f;
                for (int i = 0; i < nx; ++i) {
                    int sx;
                    float alpha;
                    cv_cell(kx, i, &sx, &alpha);
                    row = __fadd_rn(row, __fmul_rn((float)at(sx, sy), alpha));
                }
                sum = __fadd_rn(sum, __fmul_rn(beta, row));
            }
            level = (int)rintf(sum);
        }
    } else {
        int a0, a1, b0, b1;
        const int sx = cv_linear(inv_x, x, &a0, &a1), sy = cv_linear(inv_y, y, &b0, &b1);
        // The horizontal blend of a row (the last column alone at full weight), then OpenCV's SIMD
        // vertical blend.
        auto across = [&](int row) -> int {
            return sx >= sw - 1 ? at(sw - 1, row) * 2048 : at(sx, row) * a0 + at(sx + 1, row) * a1;
        };
        const int r0 = min(sy, sh - 1), r1 = min(sy + 1, sh - 1);
        level = ((((across(r0) >> 4) * b0) >> 16) + (((across(r1) >> 4) * b1) >> 16) + 2) >> 2;
    }
    unsigned char* dst = p == 0 ? a : b;
    dst[((long)c * edge + y) * edge + x] = (unsigned char)min(max(level, 0), 255);
}

// The target² image (b) as pixel values: patch rows in (block row, block col, sub row, sub col)
// order, each [channel][temporal copy][y][x]; a camera marked absent gives -1 everywhere.
template <typename Tout>
__device__ void qwen_image_patchify(Tout* out, int out_stride, const unsigned char* b, const int* frame_info, int camera,
                                    int target, int patch) {
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const int per = 6 * patch * patch, grid = target / patch;
    if (idx >= (long)grid * grid * per) return;
    const int r = idx / per, col = idx % per;
    const int block = r / 4, sub = r % 4;
    const int py = (2 * (block / (grid / 2)) + sub / 2) * patch, px = (2 * (block % (grid / 2)) + sub % 2) * patch;
    const int c = col / (2 * patch * patch), y = (col / patch) % patch, x = col % patch;
    float v = -1.0f;
    if (frame_info[camera * 4] != 0) v = ((float)b[((long)c * target + py + y) * target + px + x] - 127.5f) / 127.5f;
    out[(long)r * out_stride + col] = from_float<Tout>(v);
}
#define QWEN_IMAGE_PATCHIFY(NAME, TOUT)                                                                 \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const unsigned char* b, const int* frame_info, \
                                    int camera, int target, int patch) {                                \
        qwen_image_patchify<TOUT>(out, out_stride, b, frame_info, camera, target, patch);              \
    }
FOR_TYPE(QWEN_IMAGE_PATCHIFY, qwen_image_patchify)
