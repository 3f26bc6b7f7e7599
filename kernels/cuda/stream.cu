// Few-row products (at most 64 rows: the action expert's) streamed through one ring of shared-
// memory stages on Hopper, with the op after each product in its epilogue (bench/NOTES.md items
// 52, 53). cuBLASLt runs each few-row product as its own launch, each paying its start and tail,
// with an element-wise kernel after it; here a producer warp per block streams the block's share
// of the weights while one warpgroup multiplies, and the epilogue does that element-wise op.
//
// Weights are pre-tiled at load (`retile_weight`) into 64 × 64 tiles in the 128-byte swizzle the
// warpgroup MMA reads, each tile one 8 KB bulk copy. Where the epilogue combines two columns of
// the output (GeGLU's gate and up, RoPE's dimensions d and d + head_dim / 2), a tile pairs them:
// its rows 0-31 and 32-63 come from two row ranges of the weight, so one accumulator holds both.
//
// - `mlp_stream_wgmma`: the MLP (gate/up, GeGLU, down) in one cooperative launch. Gate/up's
//   epilogue writes the GeGLU output as bf16; after a grid barrier down splits K over blocks,
//   each adding its f32 partial sums into `out`, which the blocks zero before the barrier.
// - `qkv_rope_stream_wgmma`: the QKV product with RoPE and the K/V cache write in its epilogue.
//   A cluster of blocks splits K per tile and sums the partials in the first block's shared memory.
#include "common.cuh"

// Row-major w [n, k] (bf16) into 64 × 64 swizzled tiles, tile (nt, kc) at element
// (nt · k / 64 + kc) · 4096. Tiles over the first `paired_rows` rows pair rows `pair_span` apart
// in groups of 2 · pair_span rows: group g's tile j holds rows g · 2 · pair_span + 32 j + (0-31)
// and the rows pair_span further; the rows after are plain (tile nt: rows 64 nt + (0-63)). One
// thread per 16-byte piece. Compiled for every architecture (the module is never empty).
extern "C" __global__ void retile_weight(unsigned short* out, const unsigned short* w, int n, int k, int pair_span, int paired_rows) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n * k / 8) return;
    const int piece = i % 8, r = (i / 8) % 64;
    const long tile = i / 512;
    const int kc = tile % (k / 64), nt = tile / (k / 64);
    int row = nt * 64 + r;
    if (row < paired_rows) {
        const int per_group = pair_span / 32;
        row = nt / per_group * 2 * pair_span + nt % per_group * 32 + (r < 32 ? r : pair_span + r - 32);
    }
    *(uint4*)((char*)out + tile * 8192 + swizzle128(r, piece)) = *(const uint4*)(w + (long)row * k + kc * 64 + piece * 8);
}

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define STREAM_TILE_BYTES (64 * 128)  // one 64 × 64 bf16 tile
#define STREAM_STAGES 8               // weight tiles in flight per block
#define STREAM_A_CHUNKS 16            // 64-column chunks of A a block holds
// Dynamic shared memory (launch.rs mirrors it): 1024-byte alignment slack, the ring, A's chunks
// (the QKV kernel's partial accumulators, two chunks' worth each, take the place of A chunks).
#define STREAM_SHARED_BYTES (1024 + (STREAM_STAGES + STREAM_A_CHUNKS) * STREAM_TILE_BYTES)
#define STREAM_PARTIAL_BYTES (128 * 32 * 4)  // one warpgroup's 64 × 64 f32 accumulator

// The block's shared memory: the ring's stages and its full/empty barriers (full: one arrival
// plus the copy's bytes; empty: one arrival per consumer warp).
struct StreamRing {
    unsigned ring, full, empty;
};

__device__ __forceinline__ StreamRing stream_ring_init(unsigned base, unsigned long long* bars) {
    const StreamRing q{base, (unsigned)__cvta_generic_to_shared(bars), (unsigned)__cvta_generic_to_shared(bars) + 8 * STREAM_STAGES};
    if (threadIdx.x == 0) {
        for (int s = 0; s < STREAM_STAGES; ++s) mbarrier_init(q.full + 8 * s, 1), mbarrier_init(q.empty + 8 * s, 4);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    return q;
}

// Producer: the ring's g-th tile (counting from the launch's first) is `tile`.
__device__ __forceinline__ void stream_issue(const StreamRing& q, int g, const bf16* tile) {
    const int s = g % STREAM_STAGES;
    if (g >= STREAM_STAGES) mbarrier_wait(q.empty + 8 * s, (g / STREAM_STAGES - 1) & 1);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(q.full + 8 * s), "n"(STREAM_TILE_BYTES) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     q.ring + s * STREAM_TILE_BYTES),
                 "l"(tile), "n"(STREAM_TILE_BYTES), "r"(q.full + 8 * s)
                 : "memory");
}

// Consumers (128 threads): rows [0, 64) × chunks [c0, c0 + chunks) of row-major A (rows past
// `rows` zero) into swizzled tiles.
__device__ __forceinline__ void stream_load_a(unsigned a_tiles, const bf16* a, int a_stride, int rows, int c0, int chunks) {
    for (int i = threadIdx.x; i < chunks * 64 * 8; i += 128) {
        const int c = i / 512, r = (i / 8) % 64, piece = i % 8;
        cp_async16(a_tiles + c * STREAM_TILE_BYTES + swizzle128(r, piece), a + (long)min(r, rows - 1) * a_stride + (c0 + c) * 64 + piece * 8,
                   r < rows);
    }
    asm volatile("cp.async.wait_all;\nfence.proxy.async.shared::cta;\nbar.sync 1, 128;\n" ::: "memory");
}

// Consumers: acc (64 × 64) = A · the next `chunks` weight tiles of the ring; `g` counts the
// ring's tiles consumed so far (stage and parity), and the stages are handed back as they empty.
__device__ __forceinline__ void stream_product(float* acc, unsigned a_tiles, const StreamRing& q, int chunks, int& g) {
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    const int lane = threadIdx.x & 31;
    for (int c = 0; c < chunks; ++c, ++g) {
        const int s = g % STREAM_STAGES;
        mbarrier_wait(q.full + 8 * s, (g / STREAM_STAGES) & 1);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        for (int kk = 0; kk < 4; ++kk)
            wg_mma_ss(acc, wg_desc(a_tiles + c * STREAM_TILE_BYTES + kk * 32, 16, 1024), wg_desc(q.ring + s * STREAM_TILE_BYTES + kk * 32, 16, 1024));
        asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (c > 0 && lane == 0) mbarrier_arrive(q.empty + 8 * ((g - 1) % STREAM_STAGES));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (lane == 0) mbarrier_arrive(q.empty + 8 * ((g - 1) % STREAM_STAGES));
}

// All blocks of the (co-resident, cooperatively launched) grid meet; writes before it are
// visible after it. Self-resetting (cooperative groups' scheme): block 0 adds 2³¹ − (blocks − 1),
// the others 1, so the top bit flips once all have arrived and the low bits return to where they
// were; `word` needs no initial value and no reset between launches.
__device__ __forceinline__ void mlp_grid_barrier(unsigned* word) {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
    if (threadIdx.x == 0) {
        const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        __threadfence();
        const unsigned old = atomicAdd(word, add);
        unsigned now;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(now) : "l"(word) : "memory");
        } while (((old ^ now) & 0x80000000u) == 0);
    }
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
}

// out[rows, width] (f32, zeroed here) = (gelu(a · w_gateᵀ) ⊙ (a · w_upᵀ)) · w_downᵀ, with
// hidden[rows, hidden_width] (bf16) the GeGLU output. Grid: hidden_width / 32 blocks (gate/up's
// tiles); down's (width / 64) × down_splits units go to the first blocks. 160 threads: one
// warpgroup of consumers and a producer warp.
extern "C" __global__ void __launch_bounds__(160, 1)
    mlp_stream_wgmma(float* out, int out_stride, bf16* hidden, int hidden_stride, const bf16* a, int a_stride,
                     const bf16* w_gate_up, const bf16* w_down, int rows, int width, int hidden_width, int down_splits,
                     unsigned* barrier) {
    extern __shared__ __align__(16) unsigned char stream_shared[];
    __shared__ __align__(8) unsigned long long bars[2 * STREAM_STAGES];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(stream_shared) + 1023) & ~1023u;
    const StreamRing q = stream_ring_init(base, bars);
    const unsigned a_tiles = base + STREAM_STAGES * STREAM_TILE_BYTES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int width_chunks = width / 64, hidden_chunks = hidden_width / 64, down_chunks = hidden_chunks / down_splits;
    const int down_tile = blockIdx.x % width_chunks, down_c0 = blockIdx.x / width_chunks * down_chunks;
    const bool down_active = blockIdx.x < width_chunks * down_splits;

    if (warp == 4) {  // producer: this block's gate/up tiles, then its down tiles, one stream
        if (lane == 0) {
            const int tiles = width_chunks + (down_active ? down_chunks : 0);
            for (int g = 0; g < tiles; ++g)
                stream_issue(q, g,
                             g < width_chunks ? w_gate_up + ((long)blockIdx.x * width_chunks + g) * 4096
                                              : w_down + ((long)down_tile * hidden_chunks + down_c0 + g - width_chunks) * 4096);
        }
        return;
    }

    // Zero `out` for down's sums (before the barrier, after which they are added).
    for (int i = blockIdx.x * 128 + threadIdx.x; i < rows * (width / 4); i += gridDim.x * 128)
        *(float4*)(out + (long)(i / (width / 4)) * out_stride + 4 * (i % (width / 4))) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    float acc[32];
    int g = 0;
    const int row0 = warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
    stream_load_a(a_tiles, a, a_stride, rows, 0, width_chunks);
    stream_product(acc, a_tiles, q, width_chunks, g);
    // Accumulator columns 8j + col0 (+1) of j < 4 are gate columns, those of j + 4 the matching up.
    for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + 8 * h;
            if (r >= rows) continue;
            const float* gate = &acc[4 * j + 2 * h];
            const float* up = &acc[4 * (j + 4) + 2 * h];
            *(unsigned*)(hidden + (long)r * hidden_stride + blockIdx.x * 32 + 8 * j + col0) =
                pack_bf16x2(gelu_tanh(gate[0]) * up[0], gelu_tanh(gate[1]) * up[1]);
        }

    mlp_grid_barrier(barrier);
    if (!down_active) return;
    stream_load_a(a_tiles, hidden, hidden_stride, rows, down_c0, down_chunks);
    stream_product(acc, a_tiles, q, down_chunks, g);
    for (int j = 0; j < 8; ++j)
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + 8 * h;
            if (r >= rows) continue;
            float* o = out + (long)r * out_stride + down_tile * 64 + 8 * j + col0;
            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(o), "f"(acc[4 * j + 2 * h]), "f"(acc[4 * j + 2 * h + 1]) : "memory");
        }
}

// Cluster-wide barrier halves (every thread of every block of the cluster takes part).
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }

// qkv[rows, (heads + 2) · head_dim] (bf16) = a · wᵀ, then as `rope_qkv` (attention.cu): the q
// heads rotated in place, k rotated into row cache_row + r of k_cache and v copied into v_cache
// (qkv's k and v columns keep the unrotated product, as the product alone leaves them). Grid:
// one cluster of `splits` blocks per 64-column tile of w ((heads + 2) · head_dim / 64 tiles; the
// tiles of the q heads and k pair dimensions d and d + head_dim / 2, see `retile_weight`), each
// block of a cluster a 1/splits share of K; each stores its partial accumulator into the first
// block's shared memory, and the first sums them and does the epilogue. 160 threads, as above.
extern "C" __global__ void __launch_bounds__(160, 1)
    qkv_rope_stream_wgmma(bf16* qkv, int qkv_stride, bf16* k_cache, int k_stride, bf16* v_cache, int v_stride, int cache_row,
                          const bf16* a, int a_stride, const bf16* w, int rows, int width, int heads, int head_dim,
                          const int* positions, int position_offset, const float* cos_table, const float* sin_table) {
    extern __shared__ __align__(16) unsigned char stream_shared[];
    __shared__ __align__(8) unsigned long long bars[2 * STREAM_STAGES];
    const unsigned base = ((unsigned)__cvta_generic_to_shared(stream_shared) + 1023) & ~1023u;
    const StreamRing q = stream_ring_init(base, bars);
    unsigned rank, splits;
    asm("mov.u32 %0, %%cluster_ctarank;\nmov.u32 %1, %%cluster_nctarank;\n" : "=r"(rank), "=r"(splits));
    const unsigned partials = base + STREAM_STAGES * STREAM_TILE_BYTES, a_tiles = partials + splits * STREAM_PARTIAL_BYTES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int width_chunks = width / 64, chunks = width_chunks / splits, c0 = rank * chunks;
    const int tile = blockIdx.x / splits;
    // Every block has started before any stores into another's shared memory (waited below).
    cluster_arrive_relaxed();

    if (warp == 4) {  // producer: this block's share of its tile's K
        if (lane == 0)
            for (int g = 0; g < chunks; ++g) stream_issue(q, g, w + ((long)tile * width_chunks + c0 + g) * 4096);
        cluster_wait();
        cluster_arrive();
        cluster_wait();
        return;
    }
    float acc[32];
    int g = 0;
    stream_load_a(a_tiles, a, a_stride, rows, c0, chunks);
    stream_product(acc, a_tiles, q, chunks, g);
    // Every block stores its accumulator into its slot of the first block's shared memory (the
    // first's own slot included: read at one place only, the wgmma pipeline stays unserialised).
    const unsigned char* slot = stream_shared + (partials + rank * STREAM_PARTIAL_BYTES - (unsigned)__cvta_generic_to_shared(stream_shared));
    float* remote;
    asm("mapa.u64 %0, %1, 0;\n" : "=l"(remote) : "l"(slot));
    cluster_wait();
    for (int i = 0; i < 32; ++i) remote[i * 128 + threadIdx.x] = acc[i];
    cluster_arrive();
    cluster_wait();
    if (rank > 0) return;
    const float* partial = (const float*)(stream_shared + (partials - (unsigned)__cvta_generic_to_shared(stream_shared)));
    float sum[32];
    for (int i = 0; i < 32; ++i) sum[i] = partial[i * 128 + threadIdx.x];
    for (unsigned p = 1; p < splits; ++p)
        for (int i = 0; i < 32; ++i) sum[i] += partial[(p * 32 + i) * 128 + threadIdx.x];

    const int tiles_per_head = head_dim / 64, head = tile / tiles_per_head, part = tile % tiles_per_head, half = head_dim / 2;
    const int row0 = warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
    for (int h = 0; h < 2; ++h) {
        const int r = row0 + 8 * h;
        if (r >= rows) continue;
        bf16* row = qkv + (long)r * qkv_stride;
        if (head > heads) {  // v: plain columns, into qkv and the cache
            bf16* cached = v_cache + (long)(cache_row + r) * v_stride;
            for (int j = 0; j < 8; ++j) {
                const int d = part * 64 + 8 * j + col0;
                const unsigned v = pack_bf16x2(sum[4 * j + 2 * h], sum[4 * j + 2 * h + 1]);
                *(unsigned*)(row + (heads + 1) * head_dim + d) = v;
                *(unsigned*)(cached + d) = v;
            }
            continue;
        }
        // Accumulator columns 8j + col0 (+1) of j < 4 are dimensions d (+1) of the head's first
        // half, those of j + 4 the same dimensions of its second half.
        const long at = positions ? max(positions[position_offset + r], 0) : position_offset + r;
        bf16* dst = head < heads ? row + head * head_dim : k_cache + (long)(cache_row + r) * k_stride;
        for (int j = 0; j < 4; ++j) {
            const int d = part * 32 + 8 * j + col0;
            const float2 c = *(const float2*)(cos_table + at * half + d), s = *(const float2*)(sin_table + at * half + d);
            const float* lo = &sum[4 * j + 2 * h];
            const float* hi = &sum[4 * (j + 4) + 2 * h];
            if (head == heads) {  // k: qkv keeps the unrotated product
                *(unsigned*)(row + heads * head_dim + d) = pack_bf16x2(lo[0], lo[1]);
                *(unsigned*)(row + heads * head_dim + half + d) = pack_bf16x2(hi[0], hi[1]);
            }
            *(unsigned*)(dst + d) = pack_bf16x2(lo[0] * c.x - hi[0] * s.x, lo[1] * c.y - hi[1] * s.y);
            *(unsigned*)(dst + half + d) = pack_bf16x2(hi[0] * c.x + lo[0] * s.x, hi[1] * c.y + lo[1] * s.y);
        }
    }
}
#endif
