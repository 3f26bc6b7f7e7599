// How fast can one block pull an attention kernel's operands from global memory into shared
// memory? The expert's attention (bench/NOTES.md items 38-39) spends ~2.4 us of its ~7.4 us split
// kernel loading a 32 KB Q tile and a 64 KB K/V chunk per block (~40 GB/s per SM), and walking
// 12 chunks costs ~3.5 us each. Three ways to load the same bytes into the same 128-byte-swizzled
// 64 x 64 bf16 tiles wgmma reads:
//   cp_async  128 threads issue 16-byte cp.async (what attention_mq256_wgmma does), wait_all;
//   tma       one thread issues 2D tensor copies (64 x 64 boxes, SWIZZLE_128B) on an mbarrier;
//   bulk      one thread issues 1D bulk copies of whole rows (512 B) on an mbarrier (no swizzle:
//             timing only, a layout wgmma could not read as is).
// Each case: `blocks` blocks (one per SM), each loading a Q tile and `chunks` K/V chunks of 64
// keys x 256 (K and V: 64 KB per chunk), the blocks of a split reading the same chunks as the
// attention's row tiles do; K/V either resident in L2 (one copy) or rotated over copies > L2.
// Time per launch from graphs of 64 launches. Built on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a tools/device/benches/ingest_bench.cu -lcuda -o ib && ./ib
#include <cuda.h>
#include <cuda_bf16.h>

#include <cstring>

#include "bench.cuh"

constexpr int ROWS = 64, D = 256, TILE = 64 * 128, OPERAND = 4 * TILE;  // 64 rows x 256 bf16 = four swizzled tiles
constexpr int MAX_CHUNKS = 12;

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void wait_parity(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

enum Method { CP_ASYNC, TMA, BULK };

// Q rows [q0, q0 + 64) of q (row stride 256); K/V chunk c of split s: rows (s·chunks + c)·64 … of
// k/v. Two buffers of K/V: chunk c lands in buffer c % 2 after chunk c - 2 was "used".
template <Method M>
__global__ void __launch_bounds__(128) ingest(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                                              const __grid_constant__ CUtensorMap v_map, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                              const __nv_bfloat16* v, int row_tiles, int chunks, float* sink) {
    extern __shared__ __align__(1024) unsigned char shared[];
    __shared__ __align__(8) unsigned long long bars[1 + MAX_CHUNKS];
    const unsigned base = (smem_u32(shared) + 1023) & ~1023u;
    const int tile = blockIdx.x % row_tiles, split = blockIdx.x / row_tiles;
    const int q0 = tile * ROWS, k0 = split * chunks * ROWS;
    auto buffer = [&](int c) { return base + OPERAND + (c % 2) * 2 * OPERAND; };
    if (M == CP_ASYNC) {
        auto copy_rows = [&](unsigned dst, const __nv_bfloat16* src) {
            for (int i = threadIdx.x; i < ROWS * (D / 8); i += 128) {
                const int r = i / 32, c = i % 32;
                const unsigned at = dst + (c >> 3) * TILE + r * 128 + (((c & 7) ^ (r & 7)) << 4);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(at), "l"(src + (long)r * D + c * 8) : "memory");
            }
        };
        copy_rows(base, q + (long)q0 * D);
        for (int c = 0; c < chunks; ++c) {
            copy_rows(buffer(c), k + (long)(k0 + c * ROWS) * D);
            copy_rows(buffer(c) + OPERAND, v + (long)(k0 + c * ROWS) * D);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
            if (c >= 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            __syncthreads();
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncthreads();
    } else {
        if (threadIdx.x == 0) {
            for (int i = 0; i <= chunks; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&bars[i])) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
        // Issues operand rows [row, row + 64) of `map` / `src` into `dst` on barrier `bar`.
        auto load = [&](unsigned dst, const CUtensorMap& map, const __nv_bfloat16* src, int row, unsigned bar) {
            if (M == TMA) {
                for (int kb = 0; kb < 4; ++kb)
                    asm volatile(
                        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                            dst + kb * TILE),
                        "l"(&map), "r"(kb * 64), "r"(row), "r"(bar)
                        : "memory");
            } else {
                for (int r = 0; r < ROWS; ++r)
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst + r * 512),
                                 "l"(src + (long)(row + r) * D), "r"(512), "r"(bar)
                                 : "memory");
            }
        };
        auto expect = [&](unsigned bar, unsigned bytes) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
        };
        if (threadIdx.x == 0) {
            expect(smem_u32(&bars[0]), OPERAND);
            load(base, q_map, q, q0, smem_u32(&bars[0]));
        }
        for (int c = 0; c < chunks; ++c) {
            // Chunk c's buffer is free once chunk c - 2 was waited for (the barrier below).
            if (threadIdx.x == 0) {
                const unsigned bar = smem_u32(&bars[1 + c]);
                expect(bar, 2 * OPERAND);
                load(buffer(c), k_map, k, k0 + c * ROWS, bar);
                load(buffer(c) + OPERAND, v_map, v, k0 + c * ROWS, bar);
            }
            if (c >= 1) wait_parity(smem_u32(&bars[c]), 0);
            __syncthreads();
        }
        wait_parity(smem_u32(&bars[0]), 0);
        wait_parity(smem_u32(&bars[chunks]), 0);
        __syncthreads();
    }
    if (threadIdx.x == 0) sink[blockIdx.x] = __bfloat162float(*(const __nv_bfloat16*)(shared + (base - smem_u32(shared)) + OPERAND));
}

static CUtensorMap tensor_map(const __nv_bfloat16* p, int rows) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)D, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)D * 2};
    const cuuint32_t box[2] = {64, 64}, elem[2] = {1, 1};
    const CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)p, dims, strides, box, elem,
                                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", r);
        exit(1);
    }
    return map;
}

int main() {
    struct Case { const char* name; int row_tiles, splits, chunks; };
    // The expert: 7 row tiles x 12 splits of one chunk; one split walking all 12 chunks; the prefix
    // (89 row tiles) walking 12 chunks.
    const Case cases[] = {{"expert 12 splits", 7, 12, 1}, {"expert 1 split", 7, 1, 12}, {"prefix 1 split", 89, 1, 12}};
    const int keys = MAX_CHUNKS * ROWS, q_rows = 89 * ROWS, copies_dram = 96;
    __nv_bfloat16 *q, *kv;
    CHECK(cudaMalloc(&q, (size_t)q_rows * D * 2));
    CHECK(cudaMemset(q, 0, (size_t)q_rows * D * 2));
    CHECK(cudaMalloc(&kv, (size_t)keys * D * 2 * 2 * copies_dram));
    CHECK(cudaMemset(kv, 0, (size_t)keys * D * 2 * 2 * copies_dram));
    float* sink;
    CHECK(cudaMalloc(&sink, 4096 * 4));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const int shared_bytes = 1024 + 5 * OPERAND;
    for (auto f : {ingest<CP_ASYNC>, ingest<TMA>, ingest<BULK>})
        CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    const CUtensorMap q_map = tensor_map(q, q_rows);
    std::vector<CUtensorMap> k_maps, v_maps;
    for (int c = 0; c < copies_dram; ++c) {
        const __nv_bfloat16* k = kv + (size_t)c * 2 * keys * D;
        k_maps.push_back(tensor_map(k, keys));
        v_maps.push_back(tensor_map(k + (size_t)keys * D, keys));
    }
    const char* names[3] = {"cp_async", "tma", "bulk"};
    for (const Case& c : cases)
        for (int copies : {1, copies_dram})
            for (int m = 0; m < 3; ++m) {
                const auto kernel = m == 0 ? ingest<CP_ASYNC> : m == 1 ? ingest<TMA> : ingest<BULK>;
                const int blocks = c.row_tiles * c.splits;
                const float ms = graph_replay_ms(
                    st, 3,
                    [&] {
                        for (int i = 0; i < 64; ++i) {
                            const int at = i % copies;
                            const __nv_bfloat16* k = kv + (size_t)at * 2 * keys * D;
                            kernel<<<blocks, 128, shared_bytes, st>>>(q_map, k_maps[at], v_maps[at], q, k, k + (size_t)keys * D, c.row_tiles,
                                                                       c.chunks, sink);
                        }
                    },
                    1)[0];
                CHECK(cudaGetLastError());
                const double us = ms * 1000 / 64, bytes = (double)OPERAND * (1 + 2 * c.chunks);
                printf("{\"case\": \"%s\", \"kv\": \"%s\", \"method\": \"%s\", \"blocks\": %d, \"kb_per_block\": %.0f, \"us\": %.2f, "
                       "\"gb_per_s_per_block\": %.1f}\n",
                       c.name, copies == 1 ? "L2" : "DRAM", names[m], blocks, bytes / 1024, us, bytes / us / 1000);
                fflush(stdout);
            }
    return 0;
}
