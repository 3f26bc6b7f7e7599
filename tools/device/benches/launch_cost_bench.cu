// Experiment (bench/NOTES.md items 53, 55): what the skeleton of a streamed launch costs before
// it does any work. Item 53 timed the fused QKV + RoPE kernel with its loads and epilogue left
// out at ~4.6 µs under Nsight Compute, about what cuBLASLt's whole few-row product takes; this
// splits that into its parts, each as 200 back-to-back launches in one CUDA graph (the step's
// form), median of 10 replays, µs per launch:
//   plain          1 block per SM's worth of 160-thread blocks doing nothing (80 and 132 blocks)
//   smem           the same with the streamed kernels' dynamic shared memory (148 / 197 KB)
//   mbar           + 24 mbarriers initialised and fenced (the ring's and A's), one __syncthreads
//   cluster2       + clusters of 2 and the QKV kernel's two cluster barriers
//   dsmem          + each block's 64 × 64 f32 accumulator stored into the first block's shared
//                  memory between them (the partial exchange)
//   coop           a cooperative launch of 128 blocks with 197 KB (the MLP's), without and with
//                  one grid barrier (the MLP kernel's self-resetting form)
//   alternating    plain and smem launches alternating (whether a change of the shared-memory
//                  configuration between kernels costs anything beyond the two launches)
// Built and run on the GPU machine (tools/device/benches/launch_cost_bench.sh):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels/cuda tools/device/benches/launch_cost_bench.cu -o b && ./b
#include <cstdio>
#include <vector>

#include "bench.cuh"
#include "common.cuh"  // grid_barrier_128, as mlp.cu meets

constexpr int THREADS = 160, LAUNCHES = 200, RUNS = 10;

__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }

enum Stage { MBAR = 1, CLUSTER = 2, DSMEM = 4, GRID_BARRIER = 8 };

template <int STAGES>
__global__ void __launch_bounds__(THREADS, 1) skeleton(float* sink, unsigned* word) {
    extern __shared__ __align__(16) unsigned char shared[];
    __shared__ __align__(8) unsigned long long bars[24];
    if (STAGES & MBAR) {
        if (threadIdx.x == 0) {
            for (int i = 0; i < 24; ++i)
                asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"((unsigned)__cvta_generic_to_shared(&bars[i])), "r"(1) : "memory");
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
    }
    if (STAGES & CLUSTER) {
        cluster_arrive_relaxed();
        unsigned rank;
        asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
        float* remote;
        asm("mapa.u64 %0, %1, 0;\n" : "=l"(remote) : "l"(shared + rank * 16384));
        cluster_wait();
        if ((STAGES & DSMEM) && threadIdx.x < 128)
            for (int i = 0; i < 32; ++i) remote[i * 128 + threadIdx.x] = (float)(i + threadIdx.x);
        cluster_arrive();
        cluster_wait();
    }
    if ((STAGES & GRID_BARRIER) && threadIdx.x < 128) grid_barrier_128(word);  // the MLP's consumers
    if (blockIdx.x == 0 && threadIdx.x == 0) sink[0] += 1.0f;
}

struct Variant {
    const char* name;
    void (*kernel)(float*, unsigned*);
    int blocks, shared_kb, cluster;
    bool cooperative;
};

static void launch(const Variant& v, float* sink, unsigned* word, cudaStream_t st) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(v.blocks);
    config.blockDim = dim3(THREADS);
    config.dynamicSmemBytes = v.shared_kb * 1024;
    config.stream = st;
    cudaLaunchAttribute attrs[1];
    if (v.cluster > 1) {
        attrs[0].id = cudaLaunchAttributeClusterDimension;
        attrs[0].val.clusterDim.x = v.cluster;
        attrs[0].val.clusterDim.y = 1;
        attrs[0].val.clusterDim.z = 1;
        config.attrs = attrs;
        config.numAttrs = 1;
    } else if (v.cooperative) {
        attrs[0].id = cudaLaunchAttributeCooperative;
        attrs[0].val.cooperative = 1;
        config.attrs = attrs;
        config.numAttrs = 1;
    }
    CHECK(cudaLaunchKernelEx(&config, v.kernel, sink, word));
}

int main() {
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float* sink;
    unsigned* word;
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMalloc(&word, 4));
    CHECK(cudaMemset(sink, 0, 4));
    CHECK(cudaMemset(word, 0, 4));
    const std::vector<Variant> variants = {
        {"plain", skeleton<0>, 80, 0, 1, false},
        {"plain", skeleton<0>, 132, 0, 1, false},
        {"smem", skeleton<0>, 80, 148, 1, false},
        {"smem", skeleton<0>, 128, 197, 1, false},
        {"mbar", skeleton<MBAR>, 80, 148, 1, false},
        {"cluster2", skeleton<MBAR | CLUSTER>, 80, 148, 2, false},
        {"dsmem", skeleton<MBAR | CLUSTER | DSMEM>, 80, 148, 2, false},
        {"coop", skeleton<MBAR>, 128, 197, 1, true},
        {"coop_grid_barrier", skeleton<MBAR | GRID_BARRIER>, 128, 197, 1, true},
    };
    for (auto kernel : {skeleton<0>, skeleton<MBAR>, skeleton<MBAR | CLUSTER>, skeleton<MBAR | CLUSTER | DSMEM>, skeleton<MBAR | GRID_BARRIER>})
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 197 * 1024));
    auto per_launch_us = [&](auto enqueue, int launches) {
        const std::vector<float> ms = graph_replay_ms(st, RUNS, enqueue);
        return ms[RUNS / 2] * 1e3f / launches;
    };
    for (const Variant& v : variants) {
        const float us = per_launch_us([&] { for (int i = 0; i < LAUNCHES; ++i) launch(v, sink, word, st); }, LAUNCHES);
        printf("{\"bench\": \"launch_cost\", \"variant\": \"%s\", \"blocks\": %d, \"shared_kb\": %d, \"cluster\": %d, \"cooperative\": %s, \"us_per_launch\": %.3f}\n",
               v.name, v.blocks, v.shared_kb, v.cluster, v.cooperative ? "true" : "false", us);
    }
    // plain (no shared memory) and smem (148 KB) alternating: per pair.
    const float pair_us = per_launch_us([&] {
        for (int i = 0; i < LAUNCHES / 2; ++i) {
            launch(variants[0], sink, word, st);
            launch(variants[2], sink, word, st);
        }
    }, LAUNCHES / 2);
    printf("{\"bench\": \"launch_cost\", \"variant\": \"alternating plain 80 / smem 148 KB 80\", \"us_per_pair\": %.3f}\n", pair_us);
    CHECK(cudaDeviceSynchronize());
    return 0;
}
