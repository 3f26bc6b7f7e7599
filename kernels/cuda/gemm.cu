// Matrix products with few rows: out[r, n] (+)= Σ_k a[r, k] · w[n, k] (+ bias[n]) for r < rows ≤ 64
// (the action expert's 50 tokens). Their cost is streaming the weights once; cuBLASLt's kernels
// reach 1-2.5 TB/s on these shapes (bench/NOTES.md), this one aims at the memory's bandwidth:
//  - a block owns 64 output columns and a slice of K ("split"); the splits of a column tile are
//    summed in a fixed order by whichever of them finishes last (a counter per tile, reset by that
//    block, so graph replays start from zero), which fills the GPU without atomics on the output;
//  - A and W stream through a six-stage pipeline in 128-wide K chunks, each row piece (256 bytes)
//    one bulk copy of the tensor-memory-access engine completing on the stage's mbarrier: per-thread
//    cp.async kept too few bytes in flight per SM (Nsight Compute: 1.25 TB/s);
//  - 8 warps = two column halves × four K-groups, each a 64 × 32 accumulator of mma.sync m16n8k16
//    tiles, summed over the K-groups through shared memory at the end;
//  - launched with programmatic stream serialization, the first stages of the weights load before
//    `pdl_wait`, while the previous kernel (which wrote A) still runs.
// sm_90 and later (bulk copies, mbarrier transaction counts); the launcher runs it only where the
// device grants its shared memory.
#include "common.cuh"

#define FR_ROWS 64      // rows of A (and of the output) a block covers: all of them
#define FR_COLS 64      // output columns per block
#define FR_KC 128       // K elements per pipeline stage
#define FR_STAGES 6
#define FR_THREADS 256
// Shared-memory row pitch in bytes: 256 bytes of data + 16, so ldmatrix's eight rows fall in
// eight distinct bank groups (bulk copies cannot swizzle).
#define FR_PITCH (FR_KC * 2 + 16)
#define FR_TILE_BYTES (64 * FR_PITCH)
#define FR_STAGE_BYTES (2 * FR_TILE_BYTES)  // A tile, then W tile
// Dynamic shared memory in bytes (launch.rs mirrors it): the stages (208,896 bytes), later
// reused for the K-groups' partial sums (4 × 64 rows of FR_RED_STRIDE floats, 73,728 bytes).
#define FR_SHARED_BYTES (FR_STAGES * FR_STAGE_BYTES)
#define FR_RED_STRIDE (FR_COLS + 8)

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void fr_barrier_init(unsigned bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
// Arms the barrier's current phase for `bytes` of bulk copies (and this thread's arrival).
__device__ __forceinline__ void fr_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// `bytes` (a multiple of 16) from global to shared memory, counted on `bar`.
__device__ __forceinline__ void fr_bulk_copy(unsigned smem, const void* global, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem),
                 "l"(global), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void fr_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
#endif

// Four f32 from global memory through L2 only: another block of this launch wrote them.
__device__ __forceinline__ float4 fr_load_l2(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

// Grid (n / 64 column tiles, splits); K / splits a multiple of FR_KC; `partial` holds
// 64 × 64 f32 per block and `counters` one zeroed int per column tile when splits > 1.
template <typename Tout>
__device__ void gemm_rows64(Tout* out, int out_stride, const bf16* a, int a_stride, const bf16* w, int w_stride,
                            const Tout* bias, int rows, int k, int accumulate, float* partial, int* counters) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char fr_shared[];
    __shared__ __align__(8) unsigned long long stage_full[FR_STAGES];
    __shared__ int last_split;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, half = warp & 1, kgroup = warp >> 1;
    const int tile = blockIdx.x, splits = gridDim.y, n0 = tile * FR_COLS;
    const int k_len = k / splits, k_begin = blockIdx.y * k_len, chunks = k_len / FR_KC;
    const unsigned tiles = (unsigned)__cvta_generic_to_shared(fr_shared);
    const unsigned bars = (unsigned)__cvta_generic_to_shared(stage_full);

    // Threads 0-63 copy W rows n0 + t, threads 64-127 A rows t - 64 (those below `rows`: what the
    // tile holds past them only reaches output rows that are never written); thread 0 arms the
    // stage's barrier for all of them. Blocks walk their chunks from different starting points,
    // so at any moment they read different pieces of A, which every block reads.
    const int rotation = blockIdx.x % max(chunks, 1);
    const unsigned stage_bytes = (FR_COLS + rows) * FR_KC * 2;
    const bool copies_w = threadIdx.x < FR_COLS, copies_a = threadIdx.x >= 64 && threadIdx.x < 64 + rows;
    const int copy_row = threadIdx.x & 63;
    const bf16* w_from = w + (long)(n0 + copy_row) * w_stride + k_begin;
    const bf16* a_from = a + (long)copy_row * a_stride + k_begin;
    const unsigned copy_to = copy_row * FR_PITCH;
    auto k0_of = [&](int chunk) { return (chunk + rotation) % chunks * FR_KC; };
    // A refill is a bulk (async-proxy) write after ldmatrix (generic-proxy) reads of the stage.
    auto order_after_reads = [&](int chunk) {
        if (chunk >= FR_STAGES) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    };
    auto load_w = [&](int chunk) {
        const int stage = chunk % FR_STAGES;
        if (threadIdx.x == 0) fr_expect(bars + 8 * stage, stage_bytes);
        if (copies_w) {
            order_after_reads(chunk);
            fr_bulk_copy(tiles + stage * FR_STAGE_BYTES + FR_TILE_BYTES + copy_to, w_from + k0_of(chunk), FR_KC * 2, bars + 8 * stage);
        }
    };
    auto load_a = [&](int chunk) {
        const int stage = chunk % FR_STAGES;
        if (copies_a) {
            order_after_reads(chunk);
            fr_bulk_copy(tiles + stage * FR_STAGE_BYTES + copy_to, a_from + k0_of(chunk), FR_KC * 2, bars + 8 * stage);
        }
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < FR_STAGES; ++s) fr_barrier_init(bars + 8 * s);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    pdl_launch_dependents();
    for (int c = 0; c < min(chunks, FR_STAGES); ++c) load_w(c);
    pdl_wait();
    for (int c = 0; c < min(chunks, FR_STAGES); ++c) load_a(c);

    // ldmatrix addresses (stage 0, first k-step of this warp's K-group): A rows mt · 16 + lane % 16
    // at 16-byte column 2 · kgroup + lane / 16; W rows half · 32 + j · 16 + (lane / 16) · 8 +
    // lane % 8 at column 2 · kgroup + (lane / 8) % 2. The second k-step (kgroup + 4) is 128 bytes on.
    const unsigned a_frag = tiles + (lane & 15) * FR_PITCH + (2 * kgroup + (lane >> 4)) * 16;
    const unsigned w_frag =
        tiles + FR_TILE_BYTES + (half * 32 + (lane >> 4) * 8 + (lane & 7)) * FR_PITCH + (2 * kgroup + ((lane >> 3) & 1)) * 16;

    float acc[4][4][4];  // [16-row tile][8-column tile of this warp's 32 columns][mma fragment]
    for (int mt = 0; mt < 4; ++mt)
        for (int nt = 0; nt < 4; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    for (int chunk = 0; chunk < chunks; ++chunk) {
        const int stage_index = chunk % FR_STAGES;
        fr_wait(bars + 8 * stage_index, (chunk / FR_STAGES) & 1);
        const unsigned stage = stage_index * FR_STAGE_BYTES;
        for (int s = 0; s < 2; ++s) {
            // b[j]: both k-halves of 8-column tiles 2j and 2j + 1.
            unsigned b[2][4];
            for (int j = 0; j < 2; ++j) ldmatrix_x4_at(b[j], w_frag + stage + j * 16 * FR_PITCH + s * 128);
            for (int mt = 0; mt < 4; ++mt) {
                unsigned af[4];
                ldmatrix_x4_at(af, a_frag + stage + mt * 16 * FR_PITCH + s * 128);
                for (int nt = 0; nt < 4; ++nt) mma_16816(acc[mt][nt], af, b[nt >> 1][(nt & 1) * 2], b[nt >> 1][(nt & 1) * 2 + 1]);
            }
        }
        // Every warp is done reading this stage: refill it with chunk + FR_STAGES (the chunks in
        // between are in flight in the other stages).
        __syncthreads();
        if (chunk + FR_STAGES < chunks) {
            load_w(chunk + FR_STAGES);
            load_a(chunk + FR_STAGES);
        }
    }

    // The four K-groups' sums through shared memory; then thread t owns row t / 4, columns
    // (t % 4) · 16 … + 15 of the block.
    float* red = (float*)fr_shared;
    const int g = lane >> 2, q4 = lane & 3;
    for (int mt = 0; mt < 4; ++mt) {
        for (int nt = 0; nt < 4; ++nt) {
            float* p = red + (kgroup * FR_ROWS + mt * 16 + g) * FR_RED_STRIDE + half * 32 + nt * 8 + q4 * 2;
            *(float2*)p = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
            *(float2*)(p + 8 * FR_RED_STRIDE) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
        }
    }
    __syncthreads();
    const int row = threadIdx.x >> 2, c0 = (threadIdx.x & 3) * 16;
    float v[16];
    for (int i = 0; i < 16; ++i) v[i] = 0.0f;
    for (int kg = 0; kg < 4; ++kg) {
        for (int i = 0; i < 16; i += 4) {
            const float4 x = *(const float4*)(red + (kg * FR_ROWS + row) * FR_RED_STRIDE + c0 + i);
            v[i] += x.x, v[i + 1] += x.y, v[i + 2] += x.z, v[i + 3] += x.w;
        }
    }

    if (splits > 1) {
        float* mine = partial + ((long)(tile * splits + blockIdx.y) * FR_ROWS + row) * FR_COLS + c0;
        for (int i = 0; i < 16; i += 4) *(float4*)(mine + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) last_split = atomicAdd(&counters[tile], 1) == splits - 1;
        __syncthreads();
        if (!last_split) return;
        __threadfence();
        for (int i = 0; i < 16; ++i) v[i] = 0.0f;
#pragma unroll 4
        for (int s = 0; s < splits; ++s) {
            const float* p = partial + ((long)(tile * splits + s) * FR_ROWS + row) * FR_COLS + c0;
            for (int i = 0; i < 16; i += 4) {
                const float4 x = fr_load_l2(p + i);
                v[i] += x.x, v[i + 1] += x.y, v[i + 2] += x.z, v[i + 3] += x.w;
            }
        }
        if (threadIdx.x == 0) counters[tile] = 0;
    }
    if (row >= rows) return;
    Tout* o = out + (long)row * out_stride + n0 + c0;
    for (int h = 0; h < 16; h += 8) {
        float x[8];
        if (bias) {
            load8(bias + n0 + c0 + h, x);
            for (int i = 0; i < 8; ++i) v[h + i] += x[i];
        }
        if (accumulate) {
            load8(o + h, x);
            for (int i = 0; i < 8; ++i) v[h + i] += x[i];
        }
        store8(o + h, v + h);
    }
#else
    __trap();  // sm_90 and later only; the launcher never runs it elsewhere
#endif
}
#define GEMM_ROWS64(NAME, T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(FR_THREADS) NAME(T* out, int out_stride, const bf16* a,         \
                                                                  int a_stride, const bf16* w, int w_stride,     \
                                                                  const T* bias, int rows, int k, int accumulate, \
                                                                  float* partial, int* counters) {               \
        gemm_rows64<T>(out, out_stride, a, a_stride, w, w_stride, bias, rows, k, accumulate, partial, counters); \
    }
FOR_TYPE(GEMM_ROWS64, gemm_rows64)
