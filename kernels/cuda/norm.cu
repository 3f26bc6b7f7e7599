// Row normalisations: one block per row, f32 statistics, any mix of f32/bf16 input and output;
// the plain layer and RMS norms and the gated residual RMS norm also into e4m3 (an FP8 product's input), each value times
// `out_scale` (1 for f32 and bf16) before it is stored.
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

// One group of 8 columns per thread of `layer_norm` below. MODULATED (GR00T's AdaLN): the
// modulation's loads are issued with the row's; read in the last loop, after the row's statistics,
// they were a second memory round trip. Chosen at compile time so that the norms without a
// modulation (SigLIP's) compile as before: a runtime form that kept the modulation's registers
// live in every norm (with the RMS norms changed alike) measured gr00t-2v FP8 -0.065 ms but
// pi05-2v +0.04 ms on an H100 (bench/NOTES.md).
template <bool MODULATED, typename Tin, typename Tout>
__device__ __forceinline__ void layer_norm8(Tout* orow, const Tin* xr, const float* gamma, const float* beta,
                                            const float* modulation, int cols, float eps, float out_scale, float* scratch) {
    const int c = threadIdx.x * 8;
    const bool mine = c < cols;
    float v[8], g[8], b[8], scale[8], shift[8];
    load8_or_zero(xr + c, v, mine);
    load8_or_zero(gamma ? gamma + c : nullptr, g, mine && gamma);
    load8_or_zero(beta ? beta + c : nullptr, b, mine && beta);
    if (MODULATED) {
        load8_or_zero(modulation + c, scale, mine);
        load8_or_zero(modulation + cols + c, shift, mine);
    }
    float s = 0.0f;
    for (int i = 0; i < 8; ++i) s += v[i];
    const float mean = block_sum(s, scratch) / cols;
    float q = 0.0f;
    for (int i = 0; i < 8; ++i) q += mine ? (v[i] - mean) * (v[i] - mean) : 0.0f;
    const float inv = 1.0f / sqrtf(block_sum(q, scratch) / cols + eps);
    if (!mine) return;
    for (int i = 0; i < 8; ++i) {
        v[i] = (v[i] - mean) * inv;
        if (gamma) v[i] = v[i] * g[i] + b[i];
        if (MODULATED) v[i] = v[i] * (1.0f + scale[i]) + shift[i];
        v[i] *= out_scale;
    }
    store8(orow + c, v);
}

// out = (x - mean) / sqrt(var + eps) * gamma + beta  (two-pass variance, as the CPU reference);
// without gamma and beta (null) the plain normalisation, and with an adaptive `modulation`
// `[scale | shift | ...]` (2 * cols floats at least) then `* (1 + scale) + shift` (AdaLN).
template <typename Tin, typename Tout>
__device__ void layer_norm(Tout* out, int out_stride, const Tin* x, int x_stride, const float* gamma,
                           const float* beta, const float* modulation, int cols, float eps, int per, float out_scale) {
    __shared__ float scratch[32];
    const Tin* xr = x + (long)blockIdx.x * x_stride;
    Tout* orow = out + (long)blockIdx.x * out_stride;
    auto finish = [&](float y, int c) {
        if (gamma) y = y * gamma[c] + beta[c];
        if (modulation) y = y * (1.0f + modulation[c]) + modulation[cols + c];
        return y * out_scale;
    };
    if (per == 8) {
        if (modulation) layer_norm8<true>(orow, xr, gamma, beta, modulation, cols, eps, out_scale, scratch);
        else layer_norm8<false>(orow, xr, gamma, beta, nullptr, cols, eps, out_scale, scratch);
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
        orow[c] = from_float<Tout>(finish((to_float(xr[c]) - mean) * inv, c));
    }
}

#define LAYER_NORM(NAME, TIN, TOUT)                                                                    \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const TIN* x, int x_stride,            \
                                    const float* gamma, const float* beta, const float* modulation,   \
                                    int cols, float eps, int per, float out_scale) {                  \
        layer_norm<TIN, TOUT>(out, out_stride, x, x_stride, gamma, beta, modulation, cols, eps, per, out_scale); \
    }
FOR_IN_OUT(LAYER_NORM, layer_norm)
FOR_IN_E4M3(LAYER_NORM, layer_norm)

// Normalises this thread's 8 values of a row (columns c … c + 7, `mine` whether they exist) by
// the row's RMS, times `weight` when given (Qwen3's RMSNorm), then `* (1 + scale) + shift` when an
// adaRMS modulation `[scale | shift | gate]` (3 * cols floats) is given, and stores them times
// `out_scale`. `ss` is the thread's sum of squares.
template <typename Tout>
__device__ __forceinline__ void rms_finish8(Tout* orow, int c, bool mine, float* v, float ss, const float* modulation,
                                            int cols, float eps, float* scratch, const float* weight = nullptr,
                                            float out_scale = 1.0f) {
    float scale[8], shift[8], w[8];
    if (modulation) {
        load8_or_zero(modulation + c, scale, mine);
        load8_or_zero(modulation + cols + c, shift, mine);
    }
    if (weight) load8_or_zero(weight + c, w, mine);
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / cols + eps);
    if (!mine) return;
    for (int i = 0; i < 8; ++i) {
        v[i] *= inv;
        if (weight) v[i] *= w[i];
        if (modulation) v[i] = v[i] * (1.0f + scale[i]) + shift[i];
        v[i] *= out_scale;
    }
    store8(orow + c, v);
}

// The strided form of the above: `ss` is this thread's partial sum of squares over its columns
// of `xr`, which is read again.
template <typename Tin, typename Tout>
__device__ void rms_finish(Tout* orow, const Tin* xr, float ss, const float* modulation, int cols, float eps,
                           float* scratch, const float* weight = nullptr, float out_scale = 1.0f) {
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float o = to_float(xr[c]) * inv;
        if (weight) o *= weight[c];
        if (modulation) o = o * (1.0f + modulation[c]) + modulation[cols + c];
        orow[c] = from_float<Tout>(o * out_scale);
    }
}

// One block per (row, head): each row's `heads` slices of `cols` are normalised separately
// (heads = 1: the whole row), sharing `weight`.
template <typename Tin, typename Tout>
__device__ void rms_norm(Tout* out, int out_stride, const Tin* x, int x_stride, const float* weight, const float* modulation,
                         int cols, int heads, float eps, int per, float out_scale) {
    __shared__ float scratch[32];
    const long r = blockIdx.x / heads, h = blockIdx.x % heads;
    const Tin* xr = x + r * x_stride + h * cols;
    Tout* orow = out + r * out_stride + h * cols;
    float ss = 0.0f;
    if (per == 8) {
        const int c = threadIdx.x * 8;
        const bool mine = c < cols;
        float v[8];
        load8_or_zero(xr + c, v, mine);
        for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
        rms_finish8<Tout>(orow, c, mine, v, ss, modulation, cols, eps, scratch, weight, out_scale);
        return;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = to_float(xr[c]);
        ss += v * v;
    }
    rms_finish<Tin, Tout>(orow, xr, ss, modulation, cols, eps, scratch, weight, out_scale);
}

// The RMS norms let a programmatic dependent start at once (`launch_dependents`): the streamed
// MLP after the expert's norms loads its weights meanwhile. The gated
// residual norm may itself be launched as one (after a cuBLASLt product): it waits first.
#define RMS_NORM(NAME, TIN, TOUT)                                                                   \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const TIN* x, int x_stride,         \
                                    const float* weight, const float* modulation, int cols, int heads, \
                                    float eps, int per, float out_scale) {                          \
        launch_dependents();                                                                        \
        rms_norm<TIN, TOUT>(out, out_stride, x, x_stride, weight, modulation, cols, heads, eps, per, out_scale); \
    }
FOR_IN_OUT(RMS_NORM, rms_norm)
FOR_IN_E4M3(RMS_NORM, rms_norm)

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

// x[c … c + 7] += y * gate (gate = the third part of an adaRMS modulation, 3 * cols floats),
// stored back; v gets the new values (zeros where !mine) and the result is their sum of squares.
template <typename Ty>
__device__ __forceinline__ float gated_residual8(float* xr, const Ty* yr, const float* gate_modulation, int cols, int c,
                                                 bool mine, float* v) {
    float yv[8], g[8];
    load8_or_zero(xr + c, v, mine);
    load8_or_zero(yr + c, yv, mine);
    load8_or_zero(gate_modulation + 2 * cols + c, g, mine);
    float ss = 0.0f;
    for (int i = 0; i < 8; ++i) {
        v[i] += yv[i] * g[i];
        ss += v[i] * v[i];
    }
    if (mine) store8(xr + c, v);
    return ss;
}

// The expert's "residual, then the next adaRMS norm" pair in one pass over the row:
// x += y * gate(gate_modulation); out = rms(x) * (1 + scale) + shift with norm_modulation.
// Saves one launch and one read of x per pair, 36 launches per denoise step at 18 layers. With
// `zero_y` the row of y is left zero once read: the streamed product that writes y next adds its
// K splits' sums into it without zeroing it first (and without the grid barrier that orders the
// zeroing before the sums; `product_stream` in mlp.cu).
template <typename Ty, typename Tout>
__device__ void gated_residual_rms_norm(Tout* out, int out_stride, float* x, int x_stride, Ty* y,
                                        int y_stride, const float* gate_modulation,
                                        const float* norm_modulation, int cols, float eps, int per, float out_scale,
                                        bool zero_y) {
    __shared__ float scratch[32];
    float* xr = x + (long)blockIdx.x * x_stride;
    Ty* yr = y + (long)blockIdx.x * y_stride;
    Tout* orow = out + (long)blockIdx.x * out_stride;
    const float* gate = gate_modulation + 2 * cols;
    float ss = 0.0f;
    if (per == 8) {
        const int c = threadIdx.x * 8;
        const bool mine = c < cols;
        float v[8];
        ss = gated_residual8(xr, yr, gate_modulation, cols, c, mine, v);
        if (zero_y && mine) {
            const float zeros[8] = {};
            store8(yr + c, zeros);
        }
        rms_finish8<Tout>(orow, c, mine, v, ss, norm_modulation, cols, eps, scratch, nullptr, out_scale);
        return;
    }
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = xr[c] + to_float(yr[c]) * gate[c];
        if (zero_y) yr[c] = from_float<Ty>(0.0f);
        xr[c] = v;
        ss += v * v;
    }
    // Each thread reads back only the elements it wrote itself: no barrier needed for x.
    rms_finish<float, Tout>(orow, xr, ss, norm_modulation, cols, eps, scratch, nullptr, out_scale);
}

#define GATED_RESIDUAL_RMS_NORM(NAME, TY, TOUT)                                                     \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, float* x, int x_stride, TY* y,       \
                                    int y_stride, const float* gate_modulation,                     \
                                    const float* norm_modulation, int cols, float eps, int per,     \
                                    float out_scale, int zero_y) {                                  \
        launch_dependents();                                                                        \
        wait_for_prior_grid();                                                                      \
        gated_residual_rms_norm<TY, TOUT>(out, out_stride, x, x_stride, y, y_stride, gate_modulation, \
                                          norm_modulation, cols, eps, per, out_scale, zero_y != 0); \
    }
FOR_IN_OUT(GATED_RESIDUAL_RMS_NORM, gated_residual_rms_norm)
FOR_IN_E4M3(GATED_RESIDUAL_RMS_NORM, gated_residual_rms_norm)

// ---- The denoise loop's step boundary: the narrow action products fused with their norms -------
//
// An Euler step ends with the gated residual, the final adaRMS norm and the action-out product
// accumulated into x_t (32 columns), and the next begins with the action-in product (K = 32) and
// the first layer's adaRMS norm: five launches of 1-4 µs around products far too small to fill
// the GPU. Their rows are independent, so one block per row does each end in one launch.
// The products as cuBLASLt computes them: bf16 operands, f32 sums.
// One group of 8 columns per thread (cols / 8 threads, rounded up to whole warps); each thread's
// slice of the weights is loaded with its row (the weights stay in L2: every step reads them).
#define ROW_PRODUCT_MAX 32  // most columns of the narrow side (launch.rs mirrors it)

// One step of a warp's reduce-scatter: of the 2·HALF values p[0 … 2·HALF), a lane keeps the
// half its lane bit HALF selects, summed with its partner's same half, in p[0 … HALF).
template <int HALF>
__device__ __forceinline__ void butterfly_step(float* p, int lane) {
    const bool upper = lane & HALF;
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
        const float send = upper ? p[i] : p[i + HALF], keep = upper ? p[i + HALF] : p[i];
        p[i] = keep + __shfl_xor_sync(0xffffffffu, send, HALF);
    }
}

// x += y * gate(gate_modulation); out = rms(x) * (1 + scale) + shift with norm_modulation; then
// acc[r, j] (+)= bf16(out[r, :]) · w[j, :] + bias[j] for j < n (w bf16 [n, cols], bias optional).
template <typename Ty, typename Tout>
__device__ void gated_residual_rms_norm_product(Tout* out, int out_stride, float* x, int x_stride, const Ty* y,
                                                int y_stride, const float* gate_modulation,
                                                const float* norm_modulation, int cols, float eps, const bf16* w,
                                                const float* bias, float* acc, int acc_stride, int n, int accumulate) {
    __shared__ float scratch[32];
    __shared__ float partial[32][ROW_PRODUCT_MAX];  // per warp, per product column
    const int c = threadIdx.x * 8, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool mine = c < cols;
    float v[8];
    const float ss =
        gated_residual8(x + (long)blockIdx.x * x_stride, y + (long)blockIdx.x * y_stride, gate_modulation, cols, c, mine, v);
    uint4 wv[ROW_PRODUCT_MAX];
#pragma unroll
    for (int j = 0; j < ROW_PRODUCT_MAX; ++j) wv[j] = j < n && mine ? *(const uint4*)(w + (long)j * cols + c) : make_uint4(0, 0, 0, 0);
    // Leaves v normalised (or zero where !mine: it was loaded as zeros).
    rms_finish8<Tout>(out + (long)blockIdx.x * out_stride, c, mine, v, ss, norm_modulation, cols, eps, scratch);
    for (int i = 0; i < 8; ++i) v[i] = to_float(from_float<bf16>(v[i]));
    // This thread's share of every product column (zero past n), then a butterfly that leaves
    // lane j with the warp's sum for column j: 31 shuffles instead of 32 reductions of 5.
    float p[ROW_PRODUCT_MAX];
#pragma unroll
    for (int j = 0; j < ROW_PRODUCT_MAX; ++j) {
        float wf[8];
        unpack8(wv[j], wf);
        p[j] = 0.0f;
        for (int i = 0; i < 8; ++i) p[j] += v[i] * wf[i];
    }
    static_assert(ROW_PRODUCT_MAX == 32, "the butterfly reduces 32 columns, one per lane");
    butterfly_step<16>(p, lane);
    butterfly_step<8>(p, lane);
    butterfly_step<4>(p, lane);
    butterfly_step<2>(p, lane);
    butterfly_step<1>(p, lane);
    if (lane < n) partial[warp][lane] = p[0];
    __syncthreads();
    if ((int)threadIdx.x < n) {
        const int j = threadIdx.x;
        float s = 0.0f;
        for (int k = 0; k < (int)(blockDim.x >> 5); ++k) s += partial[k][j];
        if (bias) s += bias[j];
        float* a = acc + (long)blockIdx.x * acc_stride + j;
        *a = accumulate ? *a + s : s;
    }
}

#define GATED_RESIDUAL_RMS_NORM_PRODUCT(NAME, TY, TOUT)                                                  \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, float* x, int x_stride, const TY* y,      \
                                    int y_stride, const float* gate_modulation,                          \
                                    const float* norm_modulation, int cols, float eps, const bf16* w,    \
                                    const float* bias, float* acc, int acc_stride, int n, int accumulate) { \
        gated_residual_rms_norm_product<TY, TOUT>(out, out_stride, x, x_stride, y, y_stride,             \
                                                  gate_modulation, norm_modulation, cols, eps, w, bias,  \
                                                  acc, acc_stride, n, accumulate);                       \
    }
FOR_IN_OUT(GATED_RESIDUAL_RMS_NORM_PRODUCT, gated_residual_rms_norm_product)

// x = bf16(a) · wᵀ + bias (a f32 [rows, 32] with 16-byte aligned rows, w bf16 [cols, 32], bias
// optional, cols ≤ PRODUCT_MAX_COLS); then out = rms(x), · (1 + scale) + shift with a modulation.
// The weight's rows are 64 bytes: a warp reads 32 of them (2 KB) by four coalesced 16-byte loads
// per lane, lane l holding piece l % 4 of rows 8i + l / 4 (a thread owning whole rows would read
// them 512 bytes apart, 32 lines per load). The four lanes of a row meet by shuffles, the row's
// values in shared memory, and the bias and the norm follow in groups of 8 columns per thread.
// Every global load is issued before the first product: a load under a branch in the unrolled
// loop (a per-row bias) made each iteration wait for its own.
#define PRODUCT_MAX_COLS 8192
#define PRODUCT_GROUPS 8  // groups of 32 weight rows whose loads a warp has in flight at once
template <typename Tout>
__device__ void product_rms_norm(Tout* out, int out_stride, float* x, int x_stride, const float* a, int a_stride,
                                 const bf16* w, const float* bias, const float* modulation, int cols, float eps) {
    static_assert(ROW_PRODUCT_MAX == 32, "a weight row is four 16-byte pieces, one per lane of a quad");
    __shared__ float scratch[32];
    __shared__ __align__(16) float xs[PRODUCT_MAX_COLS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5, q = lane & 3;
    // This lane's 8 inputs (piece q of the row), rounded as the product's bf16 operand.
    float av[8], bv[8];
    load8(a + (long)blockIdx.x * a_stride + 8 * q, av);
    const int c = threadIdx.x * 8;
    const bool mine = c < cols;
    // The bias of this thread's norm columns, loaded now so that no load waits in the loop.
    load8_or_zero(bias ? bias + c : nullptr, bv, mine && bias);
    for (int i = 0; i < 8; ++i) av[i] = to_float(from_float<bf16>(av[i]));
    for (int base = warp * 32; base < cols; base += warps * 32 * PRODUCT_GROUPS) {
        uint4 wv[PRODUCT_GROUPS][4];
#pragma unroll
        for (int g = 0; g < PRODUCT_GROUPS; ++g)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = min(base + g * warps * 32 + 8 * i + (lane >> 2), cols - 1);  // clamped: all in flight
                wv[g][i] = *(const uint4*)(w + (long)row * ROW_PRODUCT_MAX + 8 * q);
            }
#pragma unroll
        for (int g = 0; g < PRODUCT_GROUPS; ++g)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float wf[8], p = 0.0f;
                unpack8(wv[g][i], wf);
                for (int e = 0; e < 8; ++e) p += av[e] * wf[e];
                p += __shfl_xor_sync(0xffffffffu, p, 1);
                p += __shfl_xor_sync(0xffffffffu, p, 2);
                const int row = base + g * warps * 32 + 8 * i + (lane >> 2);
                if (q == 0 && row < cols) xs[row] = p;
            }
    }
    __syncthreads();
    float v[8], ss = 0.0f;
    for (int i = 0; i < 8; ++i) {
        v[i] = mine ? xs[c + i] + bv[i] : 0.0f;
        ss += v[i] * v[i];
    }
    if (mine) store8(x + (long)blockIdx.x * x_stride + c, v);
    rms_finish8<Tout>(out + (long)blockIdx.x * out_stride, c, mine, v, ss, modulation, cols, eps, scratch);
}

#define PRODUCT_RMS_NORM(NAME, TOUT)                                                                   \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, float* x, int x_stride, const float* a, \
                                    int a_stride, const bf16* w, const float* bias,                    \
                                    const float* modulation, int cols, float eps) {                    \
        product_rms_norm<TOUT>(out, out_stride, x, x_stride, a, a_stride, w, bias, modulation, cols, eps); \
    }
FOR_TYPE(PRODUCT_RMS_NORM, product_rms_norm)
