// Experiment (bench/NOTES.md item 34): what one grid-wide barrier among a persistent kernel's
// blocks (one per SM, as in expert_stream_bench.cu) costs in each of several forms, against the
// kernel boundary it would replace (back-to-back launches in a graph). The plan for the denoise
// loop (NOTES, "Where the rest of the gap is") trades ~10 kernel boundaries per expert layer for
// grid barriers, so this number decides what it can save. Each round every block writes its own
// slot, meets the others, and reads another block's slot: a stale value counts as an error, so
// a barrier that does not order memory shows up. Forms:
//   counter        item 32's: fence, atomicAdd on one counter, spin until it reaches round · n
//   red_counter    the same arrival as one red.release.gpu (no returned value, no separate fence)
//   flags_packed   every block stores its round into its own word (st.release) of one packed
//                  array and one warp per block polls the whole array (a 16-byte load per lane)
//   flags_spread   the same with each block's word in its own 32-byte sector
//   flags_master   arrival words as flags_packed; block 0 alone polls them, then releases everyone
//                  through one word the others spin on (two hops, one poller of the array)
//   cluster2       clusters of 2: a cluster barrier, then one red.release per cluster on the
//                  counter (half the arrivals), spin, and a cluster barrier again
// Built and run on the GPU machine (tools/device/benches/grid_barrier_bench.sh):
//   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/benches/grid_barrier_bench.cu -o b && ./b
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench.cuh"

enum Kind { COUNTER, RED_COUNTER, FLAGS_PACKED, FLAGS_SPREAD, FLAGS_MASTER, CLUSTER2, KINDS };
static const char* kind_names[KINDS] = {"counter", "red_counter", "flags_packed", "flags_spread", "flags_master", "cluster2"};

constexpr int THREADS = 128, MAX_BLOCKS = 256, SPREAD = 8;  // words per 32-byte sector

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add(unsigned* p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_relaxed4(const unsigned* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// One warp: until every one of the n words at `words` (stride `stride`) has reached `round`.
__device__ __forceinline__ void poll_all(const unsigned* words, int n, int stride, unsigned round) {
    const int lane = threadIdx.x & 31;
    bool done;
    do {
        done = true;
        if (stride == 1) {
            for (int w = 4 * lane; w < n; w += 128) {
                const uint4 v = ld_relaxed4(words + w);
                done &= v.x >= round && (w + 1 >= n || v.y >= round) && (w + 2 >= n || v.z >= round) && (w + 3 >= n || v.w >= round);
            }
        } else {
            for (int b = lane; b < n; b += 32) {
                unsigned v;
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(words + b * stride) : "memory");
                done &= v >= round;
            }
        }
        done = __all_sync(0xffffffffu, done);
    } while (!done);
    __threadfence();  // what the other blocks wrote before arriving is visible after
}

// state: [0] the counter, [32] the release word, [64 …] the arrival words (all zero at launch).
template <int KIND>
__device__ __forceinline__ void grid_barrier(unsigned* state, unsigned round) {
    const int n = gridDim.x;
    __syncthreads();
    if (KIND == COUNTER) {
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(state, 1u);
            while (ld_acquire(state) < round * n) {
            }
        }
    } else if (KIND == RED_COUNTER) {
        if (threadIdx.x == 0) {
            red_release_add(state, 1u);
            while (ld_acquire(state) < round * n) {
            }
        }
    } else if (KIND == FLAGS_PACKED || KIND == FLAGS_SPREAD) {
        const int stride = KIND == FLAGS_SPREAD ? SPREAD : 1;
        if (threadIdx.x < 32) {
            if (threadIdx.x == 0) st_release(state + 64 + blockIdx.x * stride, round);
            poll_all(state + 64, n, stride, round);
        }
    } else if (KIND == FLAGS_MASTER) {
        if (blockIdx.x == 0) {
            if (threadIdx.x < 32) {
                if (threadIdx.x == 0) st_release(state + 64, round);
                poll_all(state + 64, n, 1, round);
                if (threadIdx.x == 0) st_release(state + 32, round);
            }
        } else if (threadIdx.x == 0) {
            st_release(state + 64 + blockIdx.x, round);
            while (ld_acquire(state + 32) < round) {
            }
        }
    } else if (KIND == CLUSTER2) {
        cluster_sync();
        unsigned rank;
        asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
        if (rank == 0 && threadIdx.x == 0) {
            red_release_add(state, 1u);
            while (ld_acquire(state) < round * (n / 2)) {
            }
        }
        cluster_sync();
    }
    __syncthreads();
}

template <int KIND>
__global__ void __launch_bounds__(THREADS, 1) persistent(unsigned* state, unsigned* slots, unsigned* errors, int rounds) {
    const int n = gridDim.x;
    for (int i = 1; i <= rounds; ++i) {
        if (threadIdx.x == 0) slots[(i & 1) * MAX_BLOCKS + blockIdx.x] = i;
        grid_barrier<KIND>(state, i);
        if (threadIdx.x == 0 && __ldcg(&slots[(i & 1) * MAX_BLOCKS + (blockIdx.x + i) % n]) != (unsigned)i) atomicAdd(errors, 1u);
    }
}

// The kernel boundary as the barrier: launch i checks launch i - 1's slots and writes its own.
__global__ void __launch_bounds__(THREADS, 1) one_round(unsigned* slots, unsigned* errors, int i) {
    const int n = gridDim.x;
    if (threadIdx.x == 0) {
        if (i > 1 && slots[((i - 1) & 1) * MAX_BLOCKS + (blockIdx.x + i) % n] != (unsigned)(i - 1)) atomicAdd(errors, 1u);
        slots[(i & 1) * MAX_BLOCKS + blockIdx.x] = i;
    }
}

int main() {
    const int rounds = 2000, runs = 5;
    // One block per SM, as the persistent expert kernel would hold its weight ring.
    const size_t smem = 160 * 1024;
    int sms;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    unsigned *state, *slots, *errors;
    const size_t state_bytes = (64 + MAX_BLOCKS * SPREAD) * 4;
    CHECK(cudaMalloc(&state, state_bytes));
    CHECK(cudaMalloc(&slots, 2 * MAX_BLOCKS * 4));
    CHECK(cudaMalloc(&errors, 4));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void (*kernels[KINDS])(unsigned*, unsigned*, unsigned*, int) = {persistent<COUNTER>, persistent<RED_COUNTER>, persistent<FLAGS_PACKED>,
                                                                     persistent<FLAGS_SPREAD>, persistent<FLAGS_MASTER>, persistent<CLUSTER2>};
    for (auto k : kernels) CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CHECK(cudaFuncSetAttribute(persistent<CLUSTER2>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK(cudaFuncSetAttribute(one_round, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));

    for (int blocks : {128, sms}) {
        for (int kind = 0; kind < KINDS; ++kind) {
            std::vector<float> us;
            unsigned errs = 0;
            cudaError_t launched = cudaSuccess;
            for (int run = 0; run < runs && launched == cudaSuccess; ++run) {
                CHECK(cudaMemsetAsync(state, 0, state_bytes, st));
                CHECK(cudaMemsetAsync(slots, 0, 2 * MAX_BLOCKS * 4, st));
                CHECK(cudaMemsetAsync(errors, 0, 4, st));
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(blocks);
                cfg.blockDim = dim3(THREADS);
                cfg.dynamicSmemBytes = smem;
                cfg.stream = st;
                cudaLaunchAttribute attr[1];
                // Co-residency: the cooperative attribute guarantees it; clusters launch without it
                // (the bench is alone on the GPU and asks for at most one block per SM).
                if (kind == CLUSTER2) {
                    attr[0].id = cudaLaunchAttributeClusterDimension;
                    attr[0].val.clusterDim.x = 2, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
                } else {
                    attr[0].id = cudaLaunchAttributeCooperative;
                    attr[0].val.cooperative = 1;
                }
                cfg.attrs = attr;
                cfg.numAttrs = 1;
                const float ms = elapsed_ms(st, [&] { launched = cudaLaunchKernelEx(&cfg, kernels[kind], state, slots, errors, rounds); });
                if (launched != cudaSuccess) break;
                CHECK(cudaGetLastError());
                us.push_back(ms * 1000.0f / rounds);
                unsigned e;
                CHECK(cudaMemcpy(&e, errors, 4, cudaMemcpyDeviceToHost));
                errs += e;
            }
            if (launched != cudaSuccess) {
                printf("{\"kind\": \"%s\", \"blocks\": %d, \"error\": \"%s\"}\n", kind_names[kind], blocks, cudaGetErrorString(launched));
                cudaGetLastError();
                continue;
            }
            std::sort(us.begin(), us.end());
            printf("{\"kind\": \"%s\", \"blocks\": %d, \"rounds\": %d, \"us_per_barrier\": {\"min\": %.3f, \"median\": %.3f}, \"errors\": %u}\n",
                   kind_names[kind], blocks, rounds, us[0], us[runs / 2], errs);
            fflush(stdout);
        }

        // The kernel boundary: the same rounds as separate launches, captured in one graph.
        const int launches = 1000;
        CHECK(cudaMemsetAsync(slots, 0, 2 * MAX_BLOCKS * 4, st));
        CHECK(cudaMemsetAsync(errors, 0, 4, st));
        std::vector<float> us = graph_replay_ms(st, runs, [&] {
            for (int i = 1; i <= launches; ++i) one_round<<<blocks, THREADS, smem, st>>>(slots, errors, i);
        });
        for (float& t : us) t *= 1000.0f / launches;
        unsigned errs;
        CHECK(cudaMemcpy(&errs, errors, 4, cudaMemcpyDeviceToHost));
        printf("{\"kind\": \"kernel_boundary\", \"blocks\": %d, \"launches\": %d, \"us_per_barrier\": {\"min\": %.3f, \"median\": %.3f}, \"errors\": %u}\n",
               blocks, launches, us[0], us[runs / 2], errs);
        fflush(stdout);
    }
    return 0;
}
