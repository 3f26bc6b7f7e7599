// The action expert's MLP (gate/up product, GeGLU, down product; at most 64 rows) as one launch
// on Hopper. cuBLASLt runs each few-row product as its own launch, each
// paying its start and tail, with the GeGLU kernel between them; here one block per SM streams its
// share of both weight matrices through one ring of shared-memory stages, so down's weights load
// while gate/up finishes and while the blocks meet at the grid barrier between the two products.
//
// Weights are pre-tiled at load (`retile_weight`) into 64-row tiles of 128 bytes per row in the
// 128-byte swizzle the warpgroup MMA reads, each tile one 8 KB bulk copy. Gate/up's tile t holds
// gate rows 32t … 32t+31 and the matching up rows, so a block's accumulator holds both halves of
// 32 GeGLU outputs and writes them (no gate/up output, no GeGLU launch). Down splits K over
// blocks; each adds its f32 partial sums into `out`, which the blocks zero before the grid
// barrier. Launched as a programmatic dependent of the norm before it, a block streams its first
// weight stages while that norm still runs.
//
// Two forms, one body: bf16 (a tile row holds 64 of k) and FP8 (`mlp_stream_wgmma_e4m3`, W8A8:
// e4m3 weights, so a tile row holds 128 of k and the kernel streams half the bytes; A quantized
// with its calibrated scale as it enters shared memory, the GeGLU output written in e4m3 with
// down's input scale, f32 accumulation, each product's two scales applied to its sums).
#include "common.cuh"

// Row-major w [n, k] (`k_bytes` bytes per row: bf16 or e4m3) into 64-row tiles of 128 bytes per
// row in the 128-byte swizzle the warpgroup MMA reads, tile (nt, kc) at byte
// (nt · k_bytes / 128 + kc) · 8192. With `paired_half` > 0 the rows of w pair up within blocks
// of 2 · paired_half rows, row j with row j + paired_half, and a tile's rows 0-31 are 32 rows of
// a block's first half, its rows 32-63 their partners: gate/up pairs (one block, paired_half
// the GeGLU width) or RoPE's rotation pairs (a block per head, paired_half half the head).
// One thread per 16-byte piece. Compiled for every architecture (the module is never empty);
// used where `mlp_stream_wgmma*` runs.
extern "C" __global__ void retile_weight(unsigned char* out, const unsigned char* w, int n, int k_bytes, int paired_half) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n * k_bytes / 16) return;
    const int piece = i % 8, r = (i / 8) % 64;
    const long tile = i / 512;
    const int kc = tile % (k_bytes / 128), nt = tile / (k_bytes / 128);
    int row = nt * 64 + r;
    if (paired_half > 0) {
        const int block = nt / (paired_half / 32), first = nt % (paired_half / 32) * 32;
        row = block * 2 * paired_half + (r < 32 ? first + r : paired_half + first + r - 32);
    }
    *(uint4*)(out + tile * 8192 + swizzle128(r, piece)) = *(const uint4*)(w + (long)row * k_bytes + kc * 128 + piece * 16);
}

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLP_TILE_BYTES (64 * 128)  // one tile: 64 rows × 128 bytes (64 of k in bf16, 128 in e4m3)
#define MLP_STAGES 8               // weight tiles in flight per block
#define MLP_A_CHUNKS 16            // 128-byte column chunks of A a block holds (width and down's K share)
// Dynamic shared memory (launch.rs mirrors it): 1024-byte alignment slack, the ring, A's chunks.
#define MLP_SHARED_BYTES (1024 + (MLP_STAGES + MLP_A_CHUNKS) * MLP_TILE_BYTES)

// The ring of weight stages and A's chunks in dynamic shared memory (1024-byte aligned, as the
// swizzle needs), and the ring's transaction barriers: `full` (one arrival, the producer's, plus
// the tile's bytes) and `empty` (the four consumer warps) per stage.
struct StreamRing {
    unsigned ring, a_tiles, full, empty;
};

// Every thread: the ring's layout, its barriers initialised by thread 0.
__device__ __forceinline__ StreamRing stream_ring(unsigned char* shared, unsigned long long* bars) {
    const unsigned base = ((unsigned)__cvta_generic_to_shared(shared) + 1023) & ~1023u;
    const unsigned full = (unsigned)__cvta_generic_to_shared(bars);
    if (threadIdx.x == 0) {
        for (int s = 0; s < MLP_STAGES; ++s) mbarrier_init(full + 8 * s, 1), mbarrier_init(full + 8 * (MLP_STAGES + s), 4);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    return StreamRing{base, base + MLP_STAGES * MLP_TILE_BYTES, full, full + 8 * MLP_STAGES};
}

// The producer warp (lane 0): `tiles` weight tiles into the ring, tile g from `tile_at(g)`, each
// stage refilled once the consumers hand it back.
template <typename TileAt>
__device__ __forceinline__ void stream_tiles(const StreamRing& r, int tiles, TileAt tile_at) {
    if ((threadIdx.x & 31) != 0) return;
    for (int g = 0; g < tiles; ++g) {
        const int s = g % MLP_STAGES;
        if (g >= MLP_STAGES) mbarrier_wait(r.empty + 8 * s, (g / MLP_STAGES - 1) & 1);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(r.full + 8 * s), "n"(MLP_TILE_BYTES) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         r.ring + s * MLP_TILE_BYTES),
                     "l"(tile_at(g)), "n"(MLP_TILE_BYTES), "r"(r.full + 8 * s)
                     : "memory");
    }
}

// Consumers (128 threads): rows [0, 64) × 128-byte chunks [c0, c0 + chunks) of row-major A
// (`a_stride` bytes per row; rows past `rows` zero) into swizzled tiles.
__device__ __forceinline__ void mlp_load_a(unsigned a_tiles, const unsigned char* a, long a_stride, int rows, int c0, int chunks) {
    for (int i = threadIdx.x; i < chunks * 64 * 8; i += 128) {
        const int c = i / 512, r = (i / 8) % 64, piece = i % 8;
        cp_async16(a_tiles + c * MLP_TILE_BYTES + swizzle128(r, piece), a + min(r, rows - 1) * a_stride + (c0 + c) * 128 + piece * 16,
                   r < rows);
    }
    asm volatile("cp.async.wait_all;\nfence.proxy.async.shared::cta;\nbar.sync 1, 128;\n" ::: "memory");
}

#define MLP_E4M3_A_CHUNKS 8  // the FP8 forms' A chunks (K ≤ 1024 per block: their bf16 rows fill A's space)

// Consumers: 128-column chunks [c0, c0 + chunks) of bf16 A (`a_stride` elements per row; at most
// MLP_E4M3_A_CHUNKS) into e4m3 tiles, each value times `inverse_scale` (the FP8 product's
// calibrated input). The bf16 rows land by cp.async all at once in A's space (16 KB a chunk),
// then are converted in place, chunk by chunk: e4m3 tile c (8 KB at 8c KB) overwrites only bf16
// chunks up to c, so a barrier after each chunk's reads keeps every write behind them.
// Per-thread loads, one 32-byte piece at a time, left each block waiting on dozens of global
// latencies in a row (12 µs for the expert's QKV on an H100), and staging two chunks a round
// still four (8.7 µs).
__device__ __forceinline__ void mlp_load_a_e4m3(unsigned a_tiles, const bf16* a, int a_stride, int rows, int c0, int chunks,
                                                float inverse_scale) {
    for (int i = threadIdx.x; i < chunks * 64 * 16; i += 128) {
        const int c = i / 1024, row = (i / 16) % 64, piece = i % 16;
        cp_async16(a_tiles + (c * 64 + row) * 256 + piece * 16, a + (long)min(row, rows - 1) * a_stride + (c0 + c) * 128 + piece * 8,
                   row < rows);
    }
    asm volatile("cp.async.wait_all;\nbar.sync 1, 128;\n" ::: "memory");
    const auto pair = [inverse_scale](unsigned two) {
        return (unsigned)e4m3x2(__uint_as_float(two << 16) * inverse_scale, __uint_as_float(two & 0xffff0000u) * inverse_scale);
    };
    // Chunk c: 64 rows × 8 pieces of 16 e4m3 (32 bytes of bf16 each), four per thread.
    for (int c = 0; c < chunks; ++c) {
        uint4 q[4];
        for (int j = 0; j < 4; ++j) {
            const int i = threadIdx.x + 128 * j, row = i / 8, piece = i % 8;
            const unsigned from = a_tiles + (c * 64 + row) * 256 + piece * 32;
            uint4 lo, hi;
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(lo.x), "=r"(lo.y), "=r"(lo.z), "=r"(lo.w) : "r"(from) : "memory");
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(hi.x), "=r"(hi.y), "=r"(hi.z), "=r"(hi.w) : "r"(from + 16) : "memory");
            q[j] = make_uint4(pair(lo.x) | pair(lo.y) << 16, pair(lo.z) | pair(lo.w) << 16, pair(hi.x) | pair(hi.y) << 16,
                              pair(hi.z) | pair(hi.w) << 16);
        }
        asm volatile("bar.sync 1, 128;\n" ::: "memory");  // chunk c read by every thread before tile c overwrites any of it
        for (int j = 0; j < 4; ++j) {
            const int i = threadIdx.x + 128 * j, row = i / 8, piece = i % 8;
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a_tiles + c * MLP_TILE_BYTES + swizzle128(row, piece)),
                         "r"(q[j].x), "r"(q[j].y), "r"(q[j].z), "r"(q[j].w)
                         : "memory");
        }
    }
    asm volatile("fence.proxy.async.shared::cta;\nbar.sync 1, 128;\n" ::: "memory");
}

// Consumers: A's chunks [c0, c0 + chunks) into the ring's A tiles, from bf16 A as it is or (E4M3)
// quantized with `inverse_scale`.
template <bool E4M3>
__device__ __forceinline__ void load_a(const StreamRing& r, const bf16* a, int a_stride, int rows, int c0, int chunks, float inverse_scale) {
    if (E4M3) mlp_load_a_e4m3(r.a_tiles, a, a_stride, rows, c0, chunks, inverse_scale);
    else mlp_load_a(r.a_tiles, (const unsigned char*)a, 2l * a_stride, rows, c0, chunks);
}

// Consumers: acc (64 × 64) = A · the next `chunks` weight tiles of the ring; `g` counts the
// ring's tiles consumed so far (stage and parity), and the stages are handed back as they empty.
// Hopper's FP8 warpgroup MMA keeps fewer accumulator bits than f32 (DeepSeek-V3 measured ~14).
// By default the FP8 form sums all of K in its accumulator, as the bf16 form does and as
// cuBLASLt's FP8 products run with fast accumulation (a 1024-deep product then drifts enough to
// flip e4m3 roundings of the GeGLU output: 7e-5 nmse against the CPU emulation on the H100).
// With `promote` it sums each chunk (128 of k) in its own registers and adds it into `acc` in
// f32, as the emulation does and cuBLASLt without fast accumulation, waiting for each chunk's
// MMAs before the next: an H100 step 0.13 ms slower (bench/NOTES.md). Alternating two sets of
// chunk registers instead makes ptxas serialize every MMA (C7514), 0.45 ms slower still.
template <bool E4M3, bool PROMOTE>
__device__ __forceinline__ void mlp_product_as(float* acc, const StreamRing& r, int chunks, int& g) {
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    float part[32] = {};
    const int lane = threadIdx.x & 31;
    for (int c = 0; c < chunks; ++c, ++g) {
        const int s = g % MLP_STAGES;
        mbarrier_wait(r.full + 8 * s, (g / MLP_STAGES) & 1);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        for (int kk = 0; kk < 4; ++kk) {
            const unsigned long long a = wg_desc(r.a_tiles + c * MLP_TILE_BYTES + kk * 32, 16, 1024);
            const unsigned long long b = wg_desc(r.ring + s * MLP_TILE_BYTES + kk * 32, 16, 1024);
            if (!E4M3) wg_mma_ss(acc, a, b);
            else if (PROMOTE) wg_mma_ss_e4m3(part, a, b, kk > 0);
            else wg_mma_ss_e4m3(acc, a, b, true);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        if (PROMOTE) {
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            for (int i = 0; i < 32; ++i) acc[i] += part[i];
            if (lane == 0) mbarrier_arrive(r.empty + 8 * s);
        } else {
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            if (c > 0 && lane == 0) mbarrier_arrive(r.empty + 8 * ((g - 1) % MLP_STAGES));
        }
    }
    if (!PROMOTE) {
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        if (lane == 0) mbarrier_arrive(r.empty + 8 * ((g - 1) % MLP_STAGES));
    }
}
template <bool E4M3>
__device__ __forceinline__ void mlp_product(float* acc, const StreamRing& r, int chunks, int& g, bool promote) {
    if (E4M3 && promote) mlp_product_as<E4M3, true>(acc, r, chunks, g);
    else mlp_product_as<E4M3, false>(acc, r, chunks, g);
}

// Consumers: `out` [rows, width] (f32) zeroed by the whole grid, before the grid barrier after
// which the K splits' partial sums are added into it.
__device__ __forceinline__ void zero_rows(float* out, int out_stride, int rows, int width) {
    for (int i = blockIdx.x * 128 + threadIdx.x; i < rows * (width / 4); i += gridDim.x * 128)
        *(float4*)(out + (long)(i / (width / 4)) * out_stride + 4 * (i % (width / 4))) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// Consumers: the accumulator (rows × 64 columns from `col`) times `scale` into f32 `out`, added
// (one of several K splits) or stored.
template <bool ADD>
__device__ __forceinline__ void write_tile(float* out, int out_stride, int rows, int col, const float* acc, float scale) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
    for (int j = 0; j < 8; ++j)
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + 8 * h;
            if (r >= rows) continue;
            float* o = out + (long)r * out_stride + col + 8 * j + col0;
            const float v0 = acc[4 * j + 2 * h] * scale, v1 = acc[4 * j + 2 * h + 1] * scale;
            if (ADD) asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(o), "f"(v0), "f"(v1) : "memory");
            else *(float2*)o = make_float2(v0, v1);
        }
}

// The FP8 form's calibrated scales (per tensor, as the CPU emulation's products): A into e4m3
// times `a_inverse`, gate/up's sums times `gate_up` (its input's scale × its weight's), the GeGLU
// output into e4m3 times `hidden_inverse`, down's sums times `down`. The bf16 form reads none.
struct MlpScales {
    float a_inverse, gate_up, hidden_inverse, down;
};

// out[rows, width] (f32, zeroed here) = (gelu(a · w_gateᵀ) ⊙ (a · w_upᵀ)) · w_downᵀ, with
// hidden[rows, hidden_width] (`hidden_stride` bytes per row) the GeGLU output, bf16 or (E4M3) its
// e4m3 codes. Weights tiled by retile_weight in the same element type; the FP8 form's A chunks
// and tiles hold 128 of k, the bf16 form's 64. With `a_e4m3` (FP8 form only) `a` holds e4m3 codes
// already divided by its scale (its norm wrote them so; `a_stride` in bytes) and loads as it is. Grid: hidden_width / 32 blocks (gate/up's tiles);
// down's (width / 64) × down_splits units go to the first blocks. 160 threads: one warpgroup of
// consumers and a producer warp.
template <bool E4M3>
__device__ void mlp_stream(float* out, int out_stride, unsigned char* hidden, int hidden_stride, const bf16* a, int a_stride,
                           const unsigned char* w_gate_up, const unsigned char* w_down, int rows, int width, int hidden_width,
                           int down_splits, unsigned* barrier, MlpScales scales, bool a_e4m3, bool promote) {
    extern __shared__ __align__(16) unsigned char mlp_shared[];
    __shared__ __align__(8) unsigned long long bars[2 * MLP_STAGES];
    constexpr int chunk_k = E4M3 ? 128 : 64;
    const StreamRing ring = stream_ring(mlp_shared, bars);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int width_chunks = width / chunk_k, hidden_chunks = hidden_width / chunk_k, down_chunks = hidden_chunks / down_splits;
    const int out_tiles = width / 64, down_tile = blockIdx.x % out_tiles, down_c0 = blockIdx.x / out_tiles * down_chunks;
    const bool down_active = blockIdx.x < out_tiles * down_splits;

    if (warp == 4) {  // producer: this block's gate/up tiles, then its down tiles, one stream
        stream_tiles(ring, width_chunks + (down_active ? down_chunks : 0), [&](int g) {
            return g < width_chunks ? w_gate_up + ((long)blockIdx.x * width_chunks + g) * MLP_TILE_BYTES
                                    : w_down + ((long)down_tile * hidden_chunks + down_c0 + g - width_chunks) * MLP_TILE_BYTES;
        });
        return;
    }

    // Launched as a programmatic dependent of the norm that writes `a`, the weights (above) start
    // streaming under it; A and the zeroing of `out` wait for it (a no-op in a plain launch): that
    // norm may still read `out` (the expert's gated residual norm reads the branch buffer that
    // down writes again).
    wait_for_prior_grid();
    zero_rows(out, out_stride, rows, width);

    float acc[32];
    int g = 0;
    const int row0 = warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
    if (E4M3 && a_e4m3) mlp_load_a(ring.a_tiles, (const unsigned char*)a, a_stride, rows, 0, width_chunks);
    else load_a<E4M3>(ring, a, a_stride, rows, 0, width_chunks, scales.a_inverse);
    mlp_product<E4M3>(acc, ring, width_chunks, g, promote);
    // Accumulator columns 8j + col0 (+1) of j < 4 are gate columns, those of j + 4 the matching up.
    const float gate_up_scale = E4M3 ? scales.gate_up : 1.0f;
    for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + 8 * h;
            if (r >= rows) continue;
            float v[2];
            for (int e = 0; e < 2; ++e)
                v[e] = gelu_tanh(acc[4 * j + 2 * h + e] * gate_up_scale) * (acc[4 * (j + 4) + 2 * h + e] * gate_up_scale);
            const int col = blockIdx.x * 32 + 8 * j + col0;
            if (E4M3) *(unsigned short*)(hidden + (long)r * hidden_stride + col) = e4m3x2(v[0] * scales.hidden_inverse, v[1] * scales.hidden_inverse);
            else *(unsigned*)(hidden + (long)r * hidden_stride + 2 * col) = pack_bf16x2(v[0], v[1]);
        }

    grid_barrier_128(barrier);
    if (!down_active) return;
    mlp_load_a(ring.a_tiles, hidden, hidden_stride, rows, down_c0, down_chunks);
    mlp_product<E4M3>(acc, ring, down_chunks, g, promote);
    write_tile<true>(out, out_stride, rows, down_tile * 64, acc, E4M3 ? scales.down : 1.0f);
}

// The bf16 form: hidden_stride in bf16 elements.
extern "C" __global__ void __launch_bounds__(160, 1)
    mlp_stream_wgmma(float* out, int out_stride, bf16* hidden, int hidden_stride, const bf16* a, int a_stride,
                     const bf16* w_gate_up, const bf16* w_down, int rows, int width, int hidden_width, int down_splits,
                     unsigned* barrier) {
    mlp_stream<false>(out, out_stride, (unsigned char*)hidden, 2 * hidden_stride, a, a_stride, (const unsigned char*)w_gate_up,
                      (const unsigned char*)w_down, rows, width, hidden_width, down_splits, barrier, MlpScales{}, false, false);
}

// The FP8 form (W8A8): e4m3 weights, A quantized on its way into shared memory (or, `a_e4m3`,
// already e4m3), the GeGLU output written in e4m3 (hidden_stride in bytes), f32 accumulation.
extern "C" __global__ void __launch_bounds__(160, 1)
    mlp_stream_wgmma_e4m3(float* out, int out_stride, unsigned char* hidden, int hidden_stride, const bf16* a, int a_stride,
                          const unsigned char* w_gate_up, const unsigned char* w_down, int rows, int width, int hidden_width,
                          int down_splits, unsigned* barrier, float a_inverse_scale, float gate_up_scale,
                          float hidden_inverse_scale, float down_scale, int a_e4m3, int promote) {
    mlp_stream<true>(out, out_stride, hidden, hidden_stride, a, a_stride, w_gate_up, w_down, rows, width, hidden_width, down_splits,
                     barrier, MlpScales{a_inverse_scale, gate_up_scale, hidden_inverse_scale, down_scale}, a_e4m3 != 0, promote != 0);
}

// One few-row FP8 product out[rows, n] = (a · wᵀ) · scale into f32 (the action expert's output
// projection, into the branch its gated residual reads) streamed as the MLP's down is: (n / 64)
// output tiles × `splits` ranges of K over the blocks, each block streaming its e4m3 tiles of w
// (retile_weight, unpaired) through the ring, A quantized with `a_inverse` as it loads (`scale`:
// the input's scale × the weight's). With one split a block stores its tile; with several the
// blocks add their sums into `out`: into zeros left there by the kernel that read `out` last
// (`out_zeroed`: the gated residual norm reading the branch, `zero_y`), or else (cooperative
// launch) the blocks zero it and meet at the grid barrier before adding (1.3 µs on an H100).
// With `a_e4m3`, `a` holds e4m3 codes already divided by its scale (the attention merge before it
// wrote them so; `a_stride` in bytes) and loads as it is. cuBLASLt would need a quantizing launch before the product; here the
// quantization rides on the load and the weight bytes are half of bf16's (5.1 against 5.7 µs
// for the expert's on the H200). A bf16 output would take one split, every block quantizing all
// of A: the expert's QKV took 8.0 µs so, against cuBLASLt's 4.6 in bf16, and is left to it.
__device__ void product_stream(float* out, int out_stride, const bf16* a, int a_stride, const unsigned char* w, int rows, int n, int k,
                               int splits, unsigned* barrier, float a_inverse, float scale, bool a_e4m3, bool promote,
                               bool out_zeroed) {
    extern __shared__ __align__(16) unsigned char mlp_shared[];
    __shared__ __align__(8) unsigned long long bars[2 * MLP_STAGES];
    const StreamRing ring = stream_ring(mlp_shared, bars);
    const int out_tiles = n / 64, k_chunks = k / 128, chunks = k_chunks / splits;
    const int tile = blockIdx.x % out_tiles, c0 = blockIdx.x / out_tiles * chunks;
    if (threadIdx.x >> 5 == 4) {
        stream_tiles(ring, chunks, [&](int g) { return w + ((long)tile * k_chunks + c0 + g) * MLP_TILE_BYTES; });
        return;
    }
    wait_for_prior_grid();  // as the MLP's: before reading A or writing `out`
    if (splits > 1 && !out_zeroed) zero_rows(out, out_stride, rows, n);
    float acc[32];
    int g = 0;
    if (a_e4m3) mlp_load_a(ring.a_tiles, (const unsigned char*)a, a_stride, rows, c0, chunks);
    else load_a<true>(ring, a, a_stride, rows, c0, chunks, a_inverse);
    mlp_product<true>(acc, ring, chunks, g, promote);
    if (splits > 1) {
        if (!out_zeroed) grid_barrier_128(barrier);
        write_tile<true>(out, out_stride, rows, tile * 64, acc, scale);
    } else {
        write_tile<false>(out, out_stride, rows, tile * 64, acc, scale);
    }
}
extern "C" __global__ void __launch_bounds__(160, 1)
    product_stream_wgmma_e4m3(float* out, int out_stride, const bf16* a, int a_stride, const unsigned char* w, int rows, int n, int k,
                              int splits, unsigned* barrier, float a_inverse_scale, float scale, int a_e4m3, int promote,
                              int out_zeroed) {
    product_stream(out, out_stride, a, a_stride, w, rows, n, k, splits, barrier, a_inverse_scale, scale, a_e4m3 != 0, promote != 0,
                   out_zeroed != 0);
}

// The action expert's QKV product and its RoPE (`rope_qkv` in sequence.cu) as one FP8 launch:
// (a · wᵀ) · scale with `a` already in e4m3 (its norm wrote it so, with the product's calibrated
// input scale; `a_stride` in bytes) and w tiled by retile_weight with each head's rotation pairs
// paired (paired_half = head_dim / 2), so a block's accumulator holds 32 columns of one head's
// first half and their partners. One block per 64 output columns, K whole (no split, no barrier).
// The block rotates its pairs in f32 and writes what the product and rope_qkv together leave:
// the q heads rotated in place in `qkv`, the k heads rotated and the v heads as they are into
// rows cache_row.. of the K/V caches, and the k and v heads unrotated in `qkv`. Against cuBLASLt
// in bf16 and RoPE's launch: half the weight bytes, A a quarter of the bf16 rows a quantizing
// load stages (each block needs all of A), and no launch for RoPE.
__device__ void qkv_rope_stream(bf16* qkv, int qkv_stride, const unsigned char* a, int a_stride, const unsigned char* w, int rows,
                                int k, float scale, int heads, int kv_heads, int head_dim, const int* positions,
                                int position_offset, bf16* k_cache, int k_stride, bf16* v_cache, int v_stride, int cache_row,
                                const float* cos_table, const float* sin_table, bool promote) {
    extern __shared__ __align__(16) unsigned char mlp_shared[];
    __shared__ __align__(8) unsigned long long bars[2 * MLP_STAGES];
    const StreamRing ring = stream_ring(mlp_shared, bars);
    const int k_chunks = k / 128, tile = blockIdx.x;
    // The attention after it may start its own loads (of keys no launch here writes) meanwhile.
    launch_dependents();
    if (threadIdx.x >> 5 == 4) {
        stream_tiles(ring, k_chunks, [&](int g) { return w + ((long)tile * k_chunks + g) * MLP_TILE_BYTES; });
        return;
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row0 = warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
    const int half = head_dim / 2, head = tile / (head_dim / 64), first = tile % (head_dim / 64) * 32;
    // The rotation's table entries of this thread's two rows, loaded before the wait (the kernel
    // before it writes neither the positions nor the tables, as for `rope_qkv`): after the
    // product they would add two dependent round trips, position then table, to the launch's end.
    float2 cos_at[2][4], sin_at[2][4];
    for (int h = 0; h < 2; ++h) {
        const int r = min(row0 + 8 * h, rows - 1);
        const long at = (positions ? max(positions[position_offset + r], 0) : position_offset + r) * (long)half;
        for (int j = 0; j < 4; ++j) {
            cos_at[h][j] = *(const float2*)&cos_table[at + first + 8 * j + col0];
            sin_at[h][j] = *(const float2*)&sin_table[at + first + 8 * j + col0];
        }
    }
    wait_for_prior_grid();  // the norm writing `a`, when launched as its programmatic dependent
    float acc[32];
    int g = 0;
    mlp_load_a(ring.a_tiles, a, a_stride, rows, 0, k_chunks);
    mlp_product<true>(acc, ring, k_chunks, g, promote);
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        if (r >= rows) continue;
        bf16* row = qkv + (long)r * qkv_stride + head * head_dim;
        const bool is_k = head >= heads && head < heads + kv_heads;
        bf16* cache = is_k ? k_cache + (long)(cache_row + r) * k_stride + (head - heads) * head_dim
                           : v_cache + (long)(cache_row + r) * v_stride + (head - heads - kv_heads) * head_dim;
        for (int j = 0; j < 4; ++j) {
            const int d = first + 8 * j + col0;  // pair (d, d + 1) of the head's first half, and d + half …
            float x[2], y[2], lo[2], hi[2];
            for (int e = 0; e < 2; ++e) {
                x[e] = acc[4 * j + 2 * h + e] * scale;
                y[e] = acc[4 * (j + 4) + 2 * h + e] * scale;
                const float c = e == 0 ? cos_at[h][j].x : cos_at[h][j].y, s = e == 0 ? sin_at[h][j].x : sin_at[h][j].y;
                lo[e] = x[e] * c - y[e] * s;
                hi[e] = y[e] * c + x[e] * s;
            }
            if (head < heads) {
                *(unsigned*)&row[d] = pack_bf16x2(lo[0], lo[1]);
                *(unsigned*)&row[d + half] = pack_bf16x2(hi[0], hi[1]);
                continue;
            }
            *(unsigned*)&row[d] = pack_bf16x2(x[0], x[1]);
            *(unsigned*)&row[d + half] = pack_bf16x2(y[0], y[1]);
            *(unsigned*)&cache[d] = is_k ? pack_bf16x2(lo[0], lo[1]) : pack_bf16x2(x[0], x[1]);
            *(unsigned*)&cache[d + half] = is_k ? pack_bf16x2(hi[0], hi[1]) : pack_bf16x2(y[0], y[1]);
        }
    }
}
extern "C" __global__ void __launch_bounds__(160, 1)
    qkv_rope_stream_wgmma_e4m3(bf16* qkv, int qkv_stride, const unsigned char* a, int a_stride, const unsigned char* w, int rows,
                               int k, float scale, int heads, int kv_heads, int head_dim, const int* positions, int position_offset,
                               bf16* k_cache, int k_stride, bf16* v_cache, int v_stride, int cache_row, const float* cos_table,
                               const float* sin_table, int promote) {
    qkv_rope_stream(qkv, qkv_stride, a, a_stride, w, rows, k, scale, heads, kv_heads, head_dim, positions, position_offset, k_cache,
                    k_stride, v_cache, v_stride, cache_row, cos_table, sin_table, promote != 0);
}
#endif
