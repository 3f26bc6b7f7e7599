// Row normalisations: one block per row, f32 statistics, any mix of f32/bf16 input and output.
// Rows are at most a few thousand wide, so the second pass re-reads the row from L1/L2 instead of
// staging it in shared memory.
#include "common.cuh"

// `per`: 8 when the launcher gives each thread one group of 8 consecutive columns (a block of at
// least cols / 8 threads, rows and vectors 16-byte aligned): the row stays in registers between
// the passes and all of its loads are in flight at once, one memory round trip per row instead of
// one per strided step (the expert's 1024-wide rows: 4 steps at 256 threads). 1 otherwise:
// strided loops over the columns, re-reading the row from L1/L2.
template <typename T>
__device__ __forceinline__ void load8_or_zero(const T* p, float* v, bool mine) {
    if (mine) {
        load8(p, v);
    } else {
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
}

// out = (x - mean) / sqrt(var + eps) * gamma + beta  (two-pass variance, as the CPU reference).
template <typename Tin, typename Tout>
__device__ void layer_norm(Tout* out, int out_stride, const Tin* x, int x_stride, const float* gamma,
                           const float* beta, int cols, float eps, int per) {
    __shared__ float scratch[32];
    const Tin* xr = x + (long)blockIdx.x * x_stride;
    Tout* orow = out + (long)blockIdx.x * out_stride;
    if (per == 8) {
        const int c = threadIdx.x * 8;
        const bool mine = c < cols;
        float v[8], g[8], b[8];
        load8_or_zero(xr + c, v, mine);
        load8_or_zero(gamma + c, g, mine);
        load8_or_zero(beta + c, b, mine);
        float s = 0.0f;
        for (int i = 0; i < 8; ++i) s += v[i];
        const float mean = block_sum(s, scratch) / cols;
        float q = 0.0f;
        for (int i = 0; i < 8; ++i) q += mine ? (v[i] - mean) * (v[i] - mean) : 0.0f;
        const float inv = 1.0f / sqrtf(block_sum(q, scratch) / cols + eps);
        if (!mine) return;
        for (int i = 0; i < 8; ++i) v[i] = (v[i] - mean) * inv * g[i] + b[i];
        store8(orow + c, v);
        return;
    }
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += to_float(xr[c]);
    const float mean = block_sum(s, scratch) / cols;
    float v = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = to_float(xr[c]) - mean;
        v += d * d;
    }
    const float inv = 1.0f / sqrtf(block_sum(v, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        orow[c] = from_float<Tout>((to_float(xr[c]) - mean) * inv * gamma[c] + beta[c]);
    }
}

#define LAYER_NORM(NAME, TIN, TOUT)                                                               \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const TIN* x, int x_stride,       \
                                    const float* gamma, const float* beta, int cols, float eps,  \
                                    int per) {                                                    \
        layer_norm<TIN, TOUT>(out, out_stride, x, x_stride, gamma, beta, cols, eps, per);         \
    }
FOR_IN_OUT(LAYER_NORM, layer_norm)

// Normalises this thread's 8 values of a row (columns c … c + 7, `mine` whether they exist) by
// the row's RMS, then `* (1 + scale) + shift` when an adaRMS modulation `[scale | shift | gate]`
// (3 * cols floats) is given, and stores them. `ss` is the thread's sum of squares.
template <typename Tout>
__device__ __forceinline__ void rms_finish8(Tout* orow, int c, bool mine, float* v, float ss, const float* modulation,
                                            int cols, float eps, float* scratch) {
    float scale[8], shift[8];
    if (modulation) {
        load8_or_zero(modulation + c, scale, mine);
        load8_or_zero(modulation + cols + c, shift, mine);
    }
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / cols + eps);
    if (!mine) return;
    for (int i = 0; i < 8; ++i) {
        v[i] *= inv;
        if (modulation) v[i] = v[i] * (1.0f + scale[i]) + shift[i];
    }
    store8(orow + c, v);
}

// The strided form of the above: `ss` is this thread's partial sum of squares over its columns
// of `xr`, which is read again.
template <typename Tin, typename Tout>
__device__ void rms_finish(Tout* orow, const Tin* xr, float ss, const float* modulation, int cols, float eps,
                           float* scratch) {
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float o = to_float(xr[c]) * inv;
        if (modulation) o = o * (1.0f + modulation[c]) + modulation[cols + c];
        orow[c] = from_float<Tout>(o);
    }
}

template <typename Tin, typename Tout>
__device__ void rms_norm(Tout* out, int out_stride, const Tin* x, int x_stride, const float* modulation,
                         int cols, float eps, int per) {
    __shared__ float scratch[32];
    const Tin* xr = x + (long)blockIdx.x * x_stride;
    Tout* orow = out + (long)blockIdx.x * out_stride;
    float ss = 0.0f;
    if (per == 8) {
        const int c = threadIdx.x * 8;
        const bool mine = c < cols;
        float v[8];
        load8_or_zero(xr + c, v, mine);
        for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
        rms_finish8<Tout>(orow, c, mine, v, ss, modulation, cols, eps, scratch);
        return;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = to_float(xr[c]);
        ss += v * v;
    }
    rms_finish<Tin, Tout>(orow, xr, ss, modulation, cols, eps, scratch);
}

// The RMS norms let a programmatic dependent start at once (`launch_dependents`): the streamed
// MLP after the expert's norms loads its weights meanwhile (bench/NOTES.md item 56).
#define RMS_NORM(NAME, TIN, TOUT)                                                                   \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const TIN* x, int x_stride,         \
                                    const float* modulation, int cols, float eps, int per) {        \
        launch_dependents();                                                                        \
        rms_norm<TIN, TOUT>(out, out_stride, x, x_stride, modulation, cols, eps, per);              \
    }
FOR_IN_OUT(RMS_NORM, rms_norm)

// x += y * gate elementwise (x f32), gate = the third part of an adaRMS modulation vector.
template <typename Ty>
__device__ void gated_residual(float* x, int x_stride, const Ty* y, int y_stride, const float* modulation,
                               int rows, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= cols || r >= rows) return;
    x[(long)r * x_stride + c] += to_float(y[(long)r * y_stride + c]) * modulation[2 * cols + c];
}

#define GATED_RESIDUAL(NAME, TY)                                                                    \
    extern "C" __global__ void NAME(float* x, int x_stride, const TY* y, int y_stride,             \
                                    const float* modulation, int rows, int cols) {                  \
        gated_residual<TY>(x, x_stride, y, y_stride, modulation, rows, cols);                       \
    }
FOR_TYPE(GATED_RESIDUAL, gated_residual)

// The expert's "residual, then the next adaRMS norm" pair in one pass over the row:
// x += y * gate(gate_modulation); out = rms(x) * (1 + scale) + shift with norm_modulation.
// Saves one launch and one read of x per pair, 36 launches per denoise step at 18 layers.
template <typename Ty, typename Tout>
__device__ void gated_residual_rms_norm(Tout* out, int out_stride, float* x, int x_stride, const Ty* y,
                                        int y_stride, const float* gate_modulation,
                                        const float* norm_modulation, int cols, float eps, int per) {
    __shared__ float scratch[32];
    float* xr = x + (long)blockIdx.x * x_stride;
    const Ty* yr = y + (long)blockIdx.x * y_stride;
    Tout* orow = out + (long)blockIdx.x * out_stride;
    const float* gate = gate_modulation + 2 * cols;
    float ss = 0.0f;
    if (per == 8) {
        const int c = threadIdx.x * 8;
        const bool mine = c < cols;
        float v[8], yv[8], g[8];
        load8_or_zero(xr + c, v, mine);
        load8_or_zero(yr + c, yv, mine);
        load8_or_zero(gate + c, g, mine);
        for (int i = 0; i < 8; ++i) {
            v[i] += yv[i] * g[i];
            ss += v[i] * v[i];
        }
        if (mine) store8(xr + c, v);
        rms_finish8<Tout>(orow, c, mine, v, ss, norm_modulation, cols, eps, scratch);
        return;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = xr[c] + to_float(yr[c]) * gate[c];
        xr[c] = v;
        ss += v * v;
    }
    // Each thread reads back only the elements it wrote itself: no barrier needed for x.
    rms_finish<float, Tout>(orow, xr, ss, norm_modulation, cols, eps, scratch);
}

#define GATED_RESIDUAL_RMS_NORM(NAME, TY, TOUT)                                                     \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, float* x, int x_stride, const TY* y, \
                                    int y_stride, const float* gate_modulation,                     \
                                    const float* norm_modulation, int cols, float eps, int per) {   \
        launch_dependents();                                                                        \
        gated_residual_rms_norm<TY, TOUT>(out, out_stride, x, x_stride, y, y_stride,                \
                                          gate_modulation, norm_modulation, cols, eps, per);        \
    }
FOR_IN_OUT(GATED_RESIDUAL_RMS_NORM, gated_residual_rms_norm)
