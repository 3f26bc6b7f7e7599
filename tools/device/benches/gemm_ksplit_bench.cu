// Do the step's under-filled products (few output tiles over a deep K: the prefix's down and O,
// SigLIP's fc2 and O) gain from running as S products over slices of K at once, on S streams,
// each with its own output (the first accumulating into the residual, the rest into scratch that
// the next norm would add)? cuBLASLt's own split-K candidates lost (bench/NOTES.md items 17, 30),
// but those sum their slices in a separate pass; here the slices' products overlap and the sum
// would ride on the norm that reads the residual anyway. For each shape, in the runtime's
// orientation (out[M, N] f32 (+)= a[M, K] · w[N, K]ᵀ, bf16 in), this times S = 1 (the whole
// product), 2, 3 and 4: each slice's algorithm is the fastest of the heuristic's 8 alone, then
// graphs of 32 forked-and-joined rounds over rotating weight copies (≥ 200 MB, more than L2
// holds) give µs per round, best of 3. One JSON line per shape and S. Built on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/benches/gemm_ksplit_bench.cu -lcublasLt -o gk && ./gk
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstring>

#include "bench.cuh"

struct Shape {
    const char* name;
    int m, k, n, count;  // count: products of this shape per step
};

int main(int argc, char** argv) {
    const Shape shapes[] = {
        {"pre_down", 576, 16384, 2048, 17}, {"pre_down_200", 712, 16384, 2048, 17}, {"pre_o", 576, 2048, 2048, 17},
        {"pre_qkv", 576, 2048, 2560, 17},   {"vis_fc2", 512, 4304, 1152, 27},       {"vis_o", 512, 1152, 1152, 27},
        {"vis_qkv", 512, 1152, 3456, 27},
    };
    const int rounds = 32, max_split = 4;
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    cudaStream_t streams[max_split];
    for (auto& s : streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t fork, joins[max_split];
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    for (auto& e : joins) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const size_t ws_bytes = 32 << 20;  // the runtime's WORKSPACE_BYTES, one per stream
    void* ws[max_split];
    for (auto& w : ws) CHECK(cudaMalloc(&w, ws_bytes));
    srand(1);
    for (const Shape& s : shapes) {
        if (argc > 1 && !strstr(s.name, argv[1])) continue;
        const GemmOperands ops(s.m, s.k, s.n);
        __nv_bfloat16 *const w = ops.w, *const a = ops.a;
        const size_t w_elems = ops.w_elems;
        const int copies = ops.copies;
        float* outs[max_split];
        for (auto& o : outs) {
            CHECK(cudaMalloc(&o, (size_t)s.m * s.n * 4));
            CHECK(cudaMemset(o, 0, (size_t)s.m * s.n * 4));
        }
        float whole_us = 0;
        for (int split = 1; split <= max_split; ++split) {
            // Slices of K in multiples of 64, the last taking the rest.
            const int slice = (s.k / split + 63) / 64 * 64;
            int k0[max_split], kn[max_split];
            for (int i = 0; i < split; ++i) k0[i] = i * slice, kn[i] = std::min(slice, s.k - i * slice);
            cublasLtMatmulDesc_t desc;
            CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t t = CUBLAS_OP_T;
            CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
            cublasLtMatrixLayout_t la[max_split], lb[max_split], ld;
            for (int i = 0; i < split; ++i) {
                CHECK_LT(cublasLtMatrixLayoutCreate(&la[i], CUDA_R_16BF, kn[i], s.n, s.k));
                CHECK_LT(cublasLtMatrixLayoutCreate(&lb[i], CUDA_R_16BF, kn[i], s.m, s.k));
            }
            CHECK_LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, s.n, s.m, s.n));
            const float one = 1.0f, zero = 0.0f;
            cublasLtMatmulAlgo_t algo[max_split];
            auto run = [&](int i, int copy, cudaStream_t st) {
                return cublasLtMatmul(lt, desc, &one, w + (size_t)copy * w_elems + k0[i], la[i], a + k0[i], lb[i], i == 0 ? &one : &zero,
                                      outs[i], ld, outs[i], ld, &algo[i], ws[i], ws_bytes, st);
            };
            cublasLtMatmulPreference_t pref;
            CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
            CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
            bool ok = true;
            for (int i = 0; i < split && ok; ++i) {
                cublasLtMatmulHeuristicResult_t results[8];
                int found = 0;
                if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la[i], lb[i], ld, ld, pref, 8, results, &found) != CUBLAS_STATUS_SUCCESS)
                    found = 0;
                float best = INFINITY;
                cublasLtMatmulAlgo_t best_algo{};
                for (int j = 0; j < found; ++j) {
                    if (results[j].state != CUBLAS_STATUS_SUCCESS || results[j].workspaceSize > ws_bytes) continue;
                    algo[i] = results[j].algo;
                    if (run(i, 0, streams[0]) != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(streams[0]) != cudaSuccess) continue;
                    const float us = graph_replay_ms(streams[0], 3, [&] {
                                         for (int r = 0; r < rounds; ++r) CHECK_LT(run(i, r % copies, streams[0]));
                                     })[0] * 1000.0f / rounds;
                    if (us < best) best = us, best_algo = results[j].algo;
                }
                ok = best < INFINITY;
                algo[i] = best_algo;
            }
            if (!ok) {
                fprintf(stderr, "%s: split %d: no algorithm\n", s.name, split);
                continue;
            }
            // Rounds of: fork, one slice per stream, join.
            const float us = graph_replay_ms(streams[0], 3, [&] {
                                 for (int r = 0; r < rounds; ++r) {
                                     CHECK(cudaEventRecord(fork, streams[0]));
                                     for (int i = 1; i < split; ++i) CHECK(cudaStreamWaitEvent(streams[i], fork, 0));
                                     for (int i = 0; i < split; ++i) CHECK_LT(run(i, r % copies, streams[i]));
                                     for (int i = 1; i < split; ++i) {
                                         CHECK(cudaEventRecord(joins[i], streams[i]));
                                         CHECK(cudaStreamWaitEvent(streams[0], joins[i], 0));
                                     }
                                 }
                             })[0] *
                             1000.0f / rounds;
            if (split == 1) whole_us = us;
            const double flop = 2.0 * s.m * s.k * s.n;
            printf("{\"shape\": \"%s\", \"m\": %d, \"k\": %d, \"n\": %d, \"per_step\": %d, \"split\": %d, \"us\": %.2f, \"tflops\": %.0f, "
                   "\"saved_ms_per_step\": %.3f}\n",
                   s.name, s.m, s.k, s.n, s.count, split, us, flop / us / 1e6, (whole_us - us) * s.count / 1000.0);
            fflush(stdout);
            cublasLtMatmulPreferenceDestroy(pref);
            for (int i = 0; i < split; ++i) cublasLtMatrixLayoutDestroy(la[i]), cublasLtMatrixLayoutDestroy(lb[i]);
            cublasLtMatrixLayoutDestroy(ld);
            cublasLtMatmulDescDestroy(desc);
        }
        for (auto* o : outs) CHECK(cudaFree(o));
    }
    return 0;
}
