// Element-wise ops over strided row-major matrices. Launch shape: grid (ceil(cols / block), rows),
// one thread per element.
#include "common.cuh"

#define ELEMENT_INDEX                                              \
    const int c = blockIdx.x * blockDim.x + threadIdx.x;           \
    const int r = blockIdx.y;                                      \
    if (c >= cols || r >= rows) return;

template <typename Tin, typename Tout>
__device__ void copy(Tout* dst, int dst_stride, const Tin* src, int src_stride, int rows, int cols) {
    ELEMENT_INDEX
    dst[(long)r * dst_stride + c] = from_float<Tout>(to_float(src[(long)r * src_stride + c]));
}
#define COPY(NAME, TIN, TOUT)                                                                     \
    extern "C" __global__ void NAME(TOUT* dst, int dst_stride, const TIN* src, int src_stride,   \
                                    int rows, int cols) {                                         \
        copy<TIN, TOUT>(dst, dst_stride, src, src_stride, rows, cols);                            \
    }
FOR_IN_OUT(COPY, copy)

// The small host inputs (mapped pinned memory) into their device buffers: block b copies piece
// b of `pieces`, `count` × (destination, source, bytes; a multiple of 4). Kernels that many
// blocks read (token ids, frame geometry) then read device memory: reads of the same host lines
// from every block over the bus cost ~20-30 µs per launch. Each read
// crosses the bus (~1 µs), so the number of rounds, not the bytes, sets the time: 16-byte words,
// COPY_IN_FLIGHT of them per thread loaded before any is stored (item 66), 4-byte words for an
// unaligned piece and for the tail.
#define COPY_IN_FLIGHT 4
extern "C" __global__ void copy_host_inputs(const unsigned long long* pieces, int count) {
    if ((int)blockIdx.x >= count) return;
    const unsigned long long* piece = pieces + 3 * blockIdx.x;
    const unsigned long long dst = piece[0], src = piece[1], bytes = piece[2];
    long done = 0;
    if (((dst | src) & 15) == 0) {
        const long words = (long)(bytes / 16);
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (long base = 0; base < words; base += COPY_IN_FLIGHT * blockDim.x) {
            uint4 v[COPY_IN_FLIGHT];
#pragma unroll
            for (int i = 0; i < COPY_IN_FLIGHT; ++i) {
                const long at = base + i * blockDim.x + threadIdx.x;
                if (at < words) v[i] = s[at];
            }
#pragma unroll
            for (int i = 0; i < COPY_IN_FLIGHT; ++i) {
                const long at = base + i * blockDim.x + threadIdx.x;
                if (at < words) d[at] = v[i];
            }
        }
        done = words * 16;
    }
    const unsigned* s = (const unsigned*)(src + done);
    unsigned* d = (unsigned*)(dst + done);
    for (long i = threadIdx.x; i < (long)(bytes - done) / 4; i += blockDim.x) d[i] = s[i];
}

// The selected entry of stacked weights into the weights the products read (Op::SelectWeight):
// piece blockIdx.y of `pieces`, `count` × (destination, table, bytes per entry, entries), takes
// entry index[0] (clamped to the table) of its table; the x blocks of that row stride over its
// bytes. 16-byte words where the destination, the entry and its length allow, else 4- or
// 2-byte ones (every weight is whole bf16 or f32 values).
extern "C" __global__ void select_weights(const unsigned long long* pieces, int count, const int* index) {
    if ((int)blockIdx.y >= count) return;
    const unsigned long long* piece = pieces + 4 * blockIdx.y;
    const unsigned long long dst = piece[0], table = piece[1], bytes = piece[2], entries = piece[3];
    const long long asked = index[0];
    const unsigned long long entry = asked < 0 ? 0 : ((unsigned long long)asked >= entries ? entries - 1 : asked);
    const unsigned long long src = table + entry * bytes;
    const long first = (long)blockIdx.x * blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
    const unsigned long long aligned = dst | src | bytes;
    if ((aligned & 15) == 0) {
        for (long i = first; i < (long)(bytes / 16); i += stride) ((uint4*)dst)[i] = ((const uint4*)src)[i];
    } else if ((aligned & 3) == 0) {
        for (long i = first; i < (long)(bytes / 4); i += stride) ((unsigned*)dst)[i] = ((const unsigned*)src)[i];
    } else {
        for (long i = first; i < (long)(bytes / 2); i += stride) ((unsigned short*)dst)[i] = ((const unsigned short*)src)[i];
    }
}

// x += table, the table's rows repeating every `table_rows` rows (position embeddings per camera).
extern "C" __global__ void add_table_f32(float* x, int x_stride, const float* table, int table_rows, int rows,
                                         int cols) {
    ELEMENT_INDEX
    x[(long)r * x_stride + c] += table[(long)(r % table_rows) * cols + c];
}

// Activation codes (the launcher's): the tanh GELU, the exact (erf) GELU, SiLU, ReLU.
#define ACT_GELU_TANH 0
#define ACT_GELU_ERF 1
#define ACT_SILU 2
#define ACT_RELU 3
template <int KIND>
__device__ __forceinline__ float activate(float x) {
    if (KIND == ACT_GELU_TANH) return gelu_tanh(x);
    if (KIND == ACT_GELU_ERF) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    if (KIND == ACT_SILU) return x / (1.0f + __expf(-x));
    return fmaxf(x, 0.0f);
}
// One body per activation, chosen once per thread from the uniform `kind`.
#define FOR_ACTIVATION(BODY)                  \
    switch (kind) {                           \
    case ACT_GELU_TANH: BODY(ACT_GELU_TANH); break; \
    case ACT_GELU_ERF: BODY(ACT_GELU_ERF); break;   \
    case ACT_SILU: BODY(ACT_SILU); break;           \
    default: BODY(ACT_RELU); break;                 \
    }

// The activation passes run `per` (1 or 8, chosen by the launcher from the alignment of the rows)
// consecutive columns per thread: grid (ceil(cols / per / 256), rows).
template <int KIND, typename T>
__device__ void activation_inplace(T* x, int stride, int rows, int cols, int per) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * per, r = blockIdx.y;
    if (c >= cols || r >= rows) return;
    T* p = x + (long)r * stride + c;
    if (per == 8) {
        float v[8];
        load8(p, v);
        for (int i = 0; i < 8; ++i) v[i] = activate<KIND>(v[i]);
        store8(p, v);
    } else {
        *p = from_float<T>(activate<KIND>(to_float(*p)));
    }
}
#define ACTIVATION_BODY(K) activation_inplace<K>(x, stride, rows, cols, per)  // T deduced from x
#define ACTIVATION(NAME, T)                                                                    \
    extern "C" __global__ void NAME(T* x, int stride, int rows, int cols, int per, int kind) { \
        FOR_ACTIVATION(ACTIVATION_BODY)                                                        \
    }
FOR_TYPE(ACTIVATION, activation)

// out = act(gate) * up · out_scale, with gate_up = [gate | up] column halves of `cols` each (GeGLU,
// SwiGLU), each read value times `in_scale` (an e4m3 gate_up's scale; 1 otherwise); also into e4m3
// (an FP8 product's input: out_scale its inverse input scale, else 1).
template <int KIND, typename Tin, typename Tout>
__device__ void gated_activation(Tout* out, int out_stride, const Tin* gate_up, int gu_stride, int rows, int cols, int per,
                                 float in_scale, float out_scale) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * per, r = blockIdx.y;
    if (c >= cols || r >= rows) return;
    const Tin* g = gate_up + (long)r * gu_stride + c;
    Tout* o = out + (long)r * out_stride + c;
    if (per == 8) {
        float gate[8], up[8];
        load8(g, gate);
        load8(g + cols, up);
        for (int i = 0; i < 8; ++i) gate[i] = activate<KIND>(gate[i] * in_scale) * (up[i] * in_scale) * out_scale;
        store8(o, gate);
    } else {
        *o = from_float<Tout>(activate<KIND>(to_float(g[0]) * in_scale) * (to_float(g[cols]) * in_scale) * out_scale);
    }
}
#define GATED_ACTIVATION_BODY(K) gated_activation<K>(out, out_stride, gate_up, gu_stride, rows, cols, per, in_scale, out_scale)
#define GATED_ACTIVATION(NAME, TIN, TOUT)                                                                       \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const TIN* gate_up, int gu_stride, int rows,     \
                                    int cols, int per, int kind, float in_scale, float out_scale) {             \
        FOR_ACTIVATION(GATED_ACTIVATION_BODY)                                                                   \
    }
FOR_IN_OUT(GATED_ACTIVATION, gated_activation)
FOR_IN_E4M3(GATED_ACTIVATION, gated_activation)
#if __CUDA_ARCH__ >= 890
// From an FP8 product's e4m3 output (a prefix gate/up product) into the next one's e4m3 input.
GATED_ACTIVATION(gated_activation_e4m3_e4m3, e4m3, e4m3)
#endif

// out[r, c] = x[r, c] * scale[c] + offset[c] (action unnormalisation), out f32.
template <typename Tin>
__device__ void affine(float* out, int out_stride, const Tin* x, int x_stride, const float* scale,
                       const float* offset, int rows, int cols) {
    ELEMENT_INDEX
    out[(long)r * out_stride + c] = to_float(x[(long)r * x_stride + c]) * scale[c] + offset[c];
}
#define AFFINE(NAME, TIN)                                                                          \
    extern "C" __global__ void NAME(float* out, int out_stride, const TIN* x, int x_stride,        \
                                    const float* scale, const float* offset, int rows, int cols) { \
        affine<TIN>(out, out_stride, x, x_stride, scale, offset, rows, cols);                      \
    }
FOR_TYPE(AFFINE, affine)

// One Euler step under real-time chunking guidance (runtime/src/rtc.rs), f32 throughout: with
// v = step / dt, x += dt * (v - guidance * weights[r] * (p - (x - t * v))), p the previous
// chunk's row r + shift[0] (0 past its rows or from column prefix_cols on).
extern "C" __global__ void rtc_guide_f32(float* x, int x_stride, const float* step, int step_stride,
                                         const float* prev, int prev_stride, int prev_rows,
                                         const float* weights, const int* shift, int prefix_cols,
                                         float t, float dt, float guidance, int rows, int cols) {
    ELEMENT_INDEX
    const float v = step[(long)r * step_stride + c] / dt;
    const int pr = r + shift[0];
    const float target = (pr < prev_rows && c < prefix_cols) ? prev[(long)pr * prev_stride + c] : 0.f;
    float* xp = x + (long)r * x_stride + c;
    const float correction = (target - (*xp - t * v)) * weights[r];
    *xp += dt * (v - guidance * correction);
}

// GR00T's real-time chunking (runtime/src/rtc.rs): rows r < prefix[1] of x start as the previous
// chunk's row prefix[0] + r, its first prefix_cols columns, 0 in the others; other rows stay.
extern "C" __global__ void rtc_prefix_f32(float* x, int x_stride, const float* prev, int prev_stride, int prev_rows,
                                          const int* prefix, int prefix_cols, int rows, int cols) {
    ELEMENT_INDEX
    const int pr = prefix[0] + r;
    if (r >= prefix[1] || pr < 0 || pr >= prev_rows) return;
    x[(long)r * x_stride + c] = c < prefix_cols ? prev[(long)pr * prev_stride + c] : 0.f;
}

// An Euler step with a velocity strength per row (GR00T's real-time chunking): x += strength[r] * step,
// step holding dt * v; f32 throughout.
extern "C" __global__ void rtc_euler_f32(float* x, int x_stride, const float* step, int step_stride,
                                              const float* strength, int rows, int cols) {
    ELEMENT_INDEX
    x[(long)r * x_stride + c] += strength[r] * step[(long)r * step_stride + c];
}

// out[r] = table[clamp(tokens[r], 0, vocab - 1)] * scale, table bf16 [vocab, cols].
template <typename Tout>
__device__ void embed(Tout* out, int out_stride, const int* tokens, const bf16* table, int vocab, float scale,
                      int rows, int cols) {
    ELEMENT_INDEX
    const int id = min(max(tokens[r], 0), vocab - 1);
    out[(long)r * out_stride + c] = from_float<Tout>(to_float(table[(long)id * cols + c]) * scale);
}
#define EMBED(NAME, TOUT)                                                                           \
    extern "C" __global__ void NAME(TOUT* out, int out_stride, const int* tokens, const bf16* table, \
                                    int vocab, float scale, int rows, int cols) {                   \
        embed<TOUT>(out, out_stride, tokens, table, vocab, scale, rows, cols);                      \
    }
FOR_TYPE(EMBED, embed_bf16)

// Row i of `src` into row index[i] of `dst`, added to it when `accumulate` (image embeddings into
// the prompt's image slots, in f32 math). One block per source row.
template <typename Tin, typename Tout>
__device__ void scatter_rows(Tout* dst, int dst_stride, const Tin* src, int src_stride, const int* index, int cols,
                             int accumulate) {
    const long from = (long)blockIdx.x * src_stride, to = (long)index[blockIdx.x] * dst_stride;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = to_float(src[from + c]);
        dst[to + c] = from_float<Tout>(accumulate ? to_float(dst[to + c]) + v : v);
    }
}
#define SCATTER_ROWS(NAME, TIN, TOUT)                                                                  \
    extern "C" __global__ void NAME(TOUT* dst, int dst_stride, const TIN* src, int src_stride,         \
                                    const int* index, int cols, int accumulate) {                      \
        scatter_rows<TIN, TOUT>(dst, dst_stride, src, src_stride, index, cols, accumulate);            \
    }
FOR_IN_OUT(SCATTER_ROWS, scatter_rows)
