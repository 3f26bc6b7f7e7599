// What the residual products pay for accumulating into the f32 residual stream. The step's
// products that add into a residual (the prefix's O and down, SigLIP's O and fc2 with their bias)
// write f32 with beta = 1 (out += a · wᵀ); in the step's profile the prefix's down took 70.6 µs,
// against 58 µs for the same shape written as bf16 with beta = 0 in item 41's bench. This times,
// per shape, the three ways the runtime could write such a product: f32 += (now), f32 = (beta 0,
// into scratch the next norm would add) and bf16 = (the same in bf16), each the fastest of the
// heuristic's 8 candidates for that output, as graphs of 32 products over rotating weight copies
// (≥ 200 MB, more than L2 holds), µs per product, best of 3. One JSON line per shape and output.
// Built on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/benches/gemm_output_bench.cu -lcublasLt -o go && ./go
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstring>

#include "bench.cuh"

struct Shape {
    const char* name;
    int m, k, n, count;  // count: products of this shape per step
    bool bias;
};

struct Output {
    const char* name;
    cudaDataType_t type;
    float beta;
};

int main(int argc, char** argv) {
    const Shape shapes[] = {
        {"pre_down", 576, 16384, 2048, 17, false}, {"pre_down_32", 544, 16384, 2048, 17, false},
        {"pre_down_128", 640, 16384, 2048, 17, false}, {"pre_down_200", 712, 16384, 2048, 17, false},
        {"pre_o", 576, 2048, 2048, 17, false},     {"vis_fc2", 512, 4304, 1152, 27, true},
        {"vis_o", 512, 1152, 1152, 27, true},
    };
    const Output outputs[] = {{"f32 +=", CUDA_R_32F, 1.0f}, {"f32 =", CUDA_R_32F, 0.0f}, {"bf16 =", CUDA_R_16BF, 0.0f}};
    const int rounds = 32;
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t ws_bytes = 32 << 20;  // the runtime's WORKSPACE_BYTES
    void* ws;
    CHECK(cudaMalloc(&ws, ws_bytes));
    srand(1);
    for (const Shape& s : shapes) {
        if (argc > 1 && !strstr(s.name, argv[1])) continue;
        const GemmOperands ops(s.m, s.k, s.n);
        void* out;
        CHECK(cudaMalloc(&out, (size_t)s.m * s.n * 4));
        CHECK(cudaMemset(out, 0, (size_t)s.m * s.n * 4));
        void* bias;
        CHECK(cudaMalloc(&bias, (size_t)s.n * 4));
        CHECK(cudaMemset(bias, 0, (size_t)s.n * 4));
        for (const Output& o : outputs) {
            cublasLtMatmulDesc_t desc;
            CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
            const cublasOperation_t t = CUBLAS_OP_T;
            CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
            if (s.bias) {
                const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
                CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
                CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
            }
            cublasLtMatrixLayout_t la, lb, ld;
            CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k));
            CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, s.m, s.k));
            CHECK_LT(cublasLtMatrixLayoutCreate(&ld, o.type, s.n, s.m, s.n));
            cublasLtMatmulPreference_t pref;
            CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
            CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
            cublasLtMatmulHeuristicResult_t results[8];
            int found = 0;
            if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, results, &found) != CUBLAS_STATUS_SUCCESS) found = 0;
            const float one = 1.0f;
            float best = INFINITY, first = INFINITY;
            int best_j = -1;
            for (int j = 0; j < found; ++j) {
                if (results[j].state != CUBLAS_STATUS_SUCCESS || results[j].workspaceSize > ws_bytes) continue;
                auto run = [&](int copy) {
                    return cublasLtMatmul(lt, desc, &one, ops.w + (size_t)copy * ops.w_elems, la, ops.a, lb, &o.beta, out, ld, out, ld,
                                          &results[j].algo, ws, ws_bytes, st);
                };
                if (run(0) != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(st) != cudaSuccess) continue;
                const float us = graph_replay_ms(st, 3, [&] {
                                     for (int r = 0; r < rounds; ++r) CHECK_LT(run(r % ops.copies));
                                 })[0] *
                                 1000.0f / rounds;
                if (j == 0) first = us;
                if (us < best) best = us, best_j = j;
            }
            const double flop = 2.0 * s.m * s.k * s.n;
            printf("{\"shape\": \"%s\", \"m\": %d, \"k\": %d, \"n\": %d, \"per_step\": %d, \"bias\": %s, \"output\": \"%s\", "
                   "\"candidates\": %d, \"first_us\": %.2f, \"best_us\": %.2f, \"best\": %d, \"tflops\": %.0f}\n",
                   s.name, s.m, s.k, s.n, s.count, s.bias ? "true" : "false", o.name, found, first, best, best_j, flop / best / 1e6);
            fflush(stdout);
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(ld);
            cublasLtMatmulDescDestroy(desc);
        }
        CHECK(cudaFree(out));
        CHECK(cudaFree(bias));
    }
    return 0;
}
