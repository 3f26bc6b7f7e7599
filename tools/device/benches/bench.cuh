// Shared by the device benches (attention, grid-barrier, ingest and GEMM-algorithm benches, and
// through wgmma_common.cuh the wgmma experiments): CUDA runtime and cuBLAS error checks that print
// where and why and exit, host-side bf16 bits, and the GPU-side timing of work enqueued on a
// stream, alone or as a replayed graph.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t err_ = (x);                                                                   \
        if (err_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

// The same for a cuBLAS(Lt) status (for benches that include cublasLt.h).
#define CHECK_LT(x)                                                                     \
    do {                                                                                \
        cublasStatus_t st_ = (x);                                                       \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                             \
            fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #x, st_); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

// Host-side bf16 as raw bits (the kernels' `struct bf16`): f32 -> bf16 rounding to nearest even
// (finite inputs), and back.
static unsigned short bits(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float unbits(unsigned short b) {
    unsigned u = (unsigned)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Milliseconds the work `enqueue` puts on `st` takes on the GPU, between two events.
template <typename F>
float elapsed_ms(cudaStream_t st, F enqueue) {
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventRecord(e0, st));
    enqueue();
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return ms;
}

// Captures what `enqueue` launches on `st` as one graph, replays it once to warm up, then times
// `runs` runs of `replays` back-to-back replays each: each run's milliseconds, ascending.
template <typename F>
std::vector<float> graph_replay_ms(cudaStream_t st, int runs, F enqueue, int replays = 1) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    enqueue();
    CHECK(cudaStreamEndCapture(st, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaStreamSynchronize(st));
    std::vector<float> ms;
    for (int run = 0; run < runs; ++run)
        ms.push_back(elapsed_ms(st, [&] {
            for (int i = 0; i < replays; ++i) CHECK(cudaGraphLaunch(ge, st));
        }));
    std::sort(ms.begin(), ms.end());
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    return ms;
}

// A GEMM bench's operands in the runtime's orientation (out = a · wᵀ): `copies` device copies of
// one bf16 weight [n, k], together more than L2 holds (≥ 200 MB, so products over them stream
// their weights as in a step), and an activation a [m, k]; the values uniform in ±0.05 from
// rand() (seeded by the caller), kept in `host` (at least n · k and m · k of them).
struct GemmOperands {
    __nv_bfloat16 *w, *a;
    size_t w_elems;
    int copies;
    std::vector<__nv_bfloat16> host;

    GemmOperands(int m, int k, int n) : w_elems((size_t)n * k), host(std::max(w_elems, (size_t)m * k)) {
        copies = std::max(2, std::min(64, (int)((200 << 20) / (w_elems * 2)) + 1));
        for (auto& x : host) x = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f) * 0.1f);
        CHECK(cudaMalloc(&w, w_elems * 2 * copies));
        for (int c = 0; c < copies; ++c) CHECK(cudaMemcpy(w + c * w_elems, host.data(), w_elems * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&a, (size_t)m * k * 2));
        CHECK(cudaMemcpy(a, host.data(), (size_t)m * k * 2, cudaMemcpyHostToDevice));
    }
    ~GemmOperands() {
        CHECK(cudaFree(w));
        CHECK(cudaFree(a));
    }
    GemmOperands(const GemmOperands&) = delete;
    GemmOperands& operator=(const GemmOperands&) = delete;
};
