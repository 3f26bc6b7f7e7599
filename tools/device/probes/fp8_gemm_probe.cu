// Which cuBLASLt FP8 product configurations does this GPU's cuBLASLt accept at launch? The
// runtime's FP8 products (runtime/src/cuda/gemm.rs) got algorithms from the heuristic but
// CUBLAS_STATUS_NOT_SUPPORTED from every cublasLtMatmul on an H100 (bench/NOTES.md, issue 30).
// This builds the runtime's product (out[M,N] = a[M,K] · w[N,K]ᵀ in column-major TN form: A = w,
// op T; B = a, op N; C = D = out) and varies one thing at a time around it:
//   output type (f32, bf16), C in place or separate, beta (0, 1), bias (bf16), scale pointers
//   (none, 16 or 4 bytes apart), fast accumulation (off, on, unset), alignment preferences
//   (the runtime's or none), and the shape.
// For each it prints the heuristic's count and how many of those algorithms launched and synced.
//   nvcc -O2 -std=c++17 -arch=sm_90 tools/device/probes/fp8_gemm_probe.cu -lcublasLt -o probe && ./probe
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

#define CHECK_CUDA(x)                                                                  \
    do {                                                                               \
        cudaError_t e = (x);                                                           \
        if (e != cudaSuccess) {                                                        \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

struct Variant {
    int m, n, k;
    cudaDataType_t out;
    bool separate_c;
    float beta;
    bool bias;
    int scale_gap;  // 0: no scale pointers
    int fast;       // -1: attribute unset
    bool prefs;
};

static const char* type_name(cudaDataType_t t) { return t == CUDA_R_32F ? "f32" : "bf16"; }

static void* A;
static void* B;
static void* C;
static void* D;
static void* bias_buf;
static char* scales;
static void* workspace;
static const size_t WS = 32 << 20;

static int run(cublasLtHandle_t h, const Variant& v) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, 4);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, 4);
    if (v.bias) {
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, 4);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_buf, 8);
        int bt = CUDA_R_16BF;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, 4);
    }
    if (v.scale_gap) {
        void* a_scale = scales;
        void* b_scale = scales + v.scale_gap;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, 8);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, 8);
    }
    if (v.fast >= 0) {
        int8_t f = (int8_t)v.fast;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, 1);
    }
    // Column-major: A = w stored K×N (ld K), B = a stored K×M (ld K), D = out stored N×M (ld N).
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, v.k, v.n, v.k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, v.k, v.m, v.k);
    cublasLtMatrixLayoutCreate(&lc, v.out, v.n, v.m, v.n);
    cublasLtMatrixLayoutCreate(&ld, v.out, v.n, v.m, v.n);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t ws = WS;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, 8);
    if (v.prefs) {
        uint32_t al = 256;
        for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
            cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, 4);
    }
    cublasLtMatmulHeuristicResult_t res[8];
    int count = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 8, res, &count);
    int ok = 0, first_error = 0;
    float alpha = 1.0f;
    for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && i < count; i++) {
        cublasStatus_t s = cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &v.beta, v.separate_c ? C : D, lc, D, ld,
                                          &res[i].algo, workspace, WS, 0);
        cudaError_t e = cudaDeviceSynchronize();
        if (s == CUBLAS_STATUS_SUCCESS && e == cudaSuccess)
            ok++;
        else if (!first_error)
            first_error = s != CUBLAS_STATUS_SUCCESS ? (int)s : 1000 + (int)e;
    }
    printf("%4dx%4dx%4d out=%-4s C=%-8s beta=%g bias=%d scales=%-4s fast=%-5s prefs=%d | heuristic %2d (status %d) launched %d/%d first_error %d\n",
           v.m, v.n, v.k, type_name(v.out), v.separate_c ? "separate" : "in-place", v.beta, v.bias,
           v.scale_gap == 0 ? "none" : v.scale_gap == 16 ? "16B" : "4B",
           v.fast < 0 ? "unset" : v.fast ? "on" : "off", v.prefs, count, (int)hs, ok, count, first_error);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    return ok;
}

int main() {
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("device %s sm_%d%d, cuBLASLt %zu (cudart %zu)\n", prop.name, prop.major, prop.minor, cublasLtGetVersion(),
           cublasLtGetCudartVersion());
    const size_t big = 1 << 24;
    CHECK_CUDA(cudaMalloc(&A, big));
    CHECK_CUDA(cudaMalloc(&B, big));
    CHECK_CUDA(cudaMalloc(&C, 4 * big));
    CHECK_CUDA(cudaMalloc(&D, 4 * big));
    CHECK_CUDA(cudaMalloc(&bias_buf, big));
    CHECK_CUDA(cudaMalloc(&scales, 256));
    CHECK_CUDA(cudaMalloc(&workspace, WS));
    CHECK_CUDA(cudaMemset(A, 0x38, big));  // e4m3 1.0
    CHECK_CUDA(cudaMemset(B, 0x38, big));
    CHECK_CUDA(cudaMemset(C, 0, 4 * big));
    CHECK_CUDA(cudaMemset(D, 0, 4 * big));
    CHECK_CUDA(cudaMemset(bias_buf, 0, big));
    float ones[64];
    for (float& o : ones) o = 1.0f;
    CHECK_CUDA(cudaMemcpy(scales, ones, sizeof ones, cudaMemcpyHostToDevice));
    cublasLtHandle_t h;
    cublasLtCreate(&h);
    const int shapes[][3] = {{79, 64, 64}, {80, 64, 64}, {144, 768, 640}};
    int total = 0, ok = 0;
    for (auto& s : shapes)
        for (cudaDataType_t out : {CUDA_R_32F, CUDA_R_16BF})
            for (bool separate_c : {false, true})
                for (float beta : {0.0f, 1.0f})
                    for (bool bias : {false, true})
                        for (int gap : {16, 4, 0})
                            for (int fast : {0, 1, -1})
                                for (bool prefs : {true, false}) {
                                    Variant v{s[0], s[1], s[2], out, separate_c, beta, bias, gap, fast, prefs};
                                    total++;
                                    ok += run(h, v) > 0;
                                }
    printf("%d of %d variants launched with at least one algorithm\n", ok, total);
    cublasLtDestroy(h);
    return 0;
}
