// Whether L2 access policies keep the prefix MLP's gate/up output on chip for the GeGLU kernel.
// In the step the prefix's gate/up product (576 rows in the 64-slot bucket) writes 37.7 MB of bf16
// that `gelu_tanh_mul` reads back (14.8 µs per layer, ~3.8 TB/s: mostly from DRAM, the product's
// 134 MB of weights having streamed through the 50 MB L2 since), and down reads its 18.9 MB
// output. This replays the chain gate/up → GeGLU → down (f32 +=, as the runtime writes the
// residual) over `layers` distinct weight sets as one graph, µs per layer, in three forms:
//   none      no access policy;
//   stream    each product's weight matrix in an access policy window marked streaming (evicted
//             first), so the activations it writes stay;
//   persist   the gate/up output in a window marked persisting (L2 set aside for it, the most the
//             device allows; hitRatio scaled to fit), the GeGLU kernel's window over the same
//             bytes marked normal so its reads hand the lines back.
// The windows are set on the stream around each launch during capture (as the runtime would) and
// read back from the captured kernel nodes, so a form whose windows capture dropped says so.
// Each form also runs without the GeGLU kernel (its in-chain cost is the difference).
// Built on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/benches/l2_policy_bench.cu -lcublasLt -o l2p && ./l2p
#include <cublasLt.h>
#include <cuda_bf16.h>

#include "bench.cuh"

// common.cuh's form: 0.5 x (1 + tanh(u)) as x / (1 + e^(-2u)).
__device__ __forceinline__ float gelu_tanh(float x) {
    return x / (1.0f + __expf(-2.0f * 0.7978845608f * (x + 0.044715f * x * x * x)));
}

// The runtime's gelu_tanh_mul, eight columns per thread: out[r, c] = gelu(gu[r, c]) · gu[r, c + cols].
__global__ void geglu(__nv_bfloat16* out, const __nv_bfloat16* gu, int cols) {
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 8, r = blockIdx.y;
    if (c >= cols) return;
    const __nv_bfloat16* g = gu + (size_t)r * 2 * cols + c;
    uint4 gv = *(const uint4*)g, uv = *(const uint4*)(g + cols), ov;
    const __nv_bfloat16 *gh = (const __nv_bfloat16*)&gv, *uh = (const __nv_bfloat16*)&uv;
    __nv_bfloat16* oh = (__nv_bfloat16*)&ov;
    for (int i = 0; i < 8; ++i) oh[i] = __float2bfloat16(gelu_tanh(__bfloat162float(gh[i])) * __bfloat162float(uh[i]));
    *(uint4*)(out + (size_t)r * cols + c) = ov;
}

struct Product {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    float beta;
    // out [m, n] (`out_type`) (+)= a [m, k] · w [n, k]ᵀ; the heuristic's first algorithm.
    Product(cublasLtHandle_t lt, int m, int k, int n, cudaDataType_t out_type, float beta_, size_t ws_bytes) : beta(beta_) {
        CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t t = CUBLAS_OP_T;
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
        CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&ld, out_type, n, m, n));
        cublasLtMatmulPreference_t pref;
        CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
        CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
        cublasLtMatmulHeuristicResult_t r;
        int found = 0;
        CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &r, &found));
        if (found < 1) fprintf(stderr, "no algorithm for %d x %d (k %d)\n", m, n, k), exit(1);
        algo = r.algo;
        cublasLtMatmulPreferenceDestroy(pref);
    }
    void run(cublasLtHandle_t lt, const void* w, const void* a, void* out, void* ws, size_t ws_bytes, cudaStream_t st) const {
        const float one = 1.0f;
        CHECK_LT(cublasLtMatmul(lt, desc, &one, w, la, a, lb, &beta, out, ld, out, ld, &algo, ws, ws_bytes, st));
    }
};

static void set_window(cudaStream_t st, const void* base, size_t bytes, float hit_ratio, cudaAccessProperty hit) {
    cudaStreamAttrValue v = {};
    v.accessPolicyWindow.base_ptr = const_cast<void*>(base);
    v.accessPolicyWindow.num_bytes = bytes;
    v.accessPolicyWindow.hitRatio = hit_ratio;
    v.accessPolicyWindow.hitProp = hit;
    v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CHECK(cudaStreamSetAttribute(st, cudaStreamAttributeAccessPolicyWindow, &v));
}
static void clear_window(cudaStream_t st) { set_window(st, nullptr, 0, 0.0f, cudaAccessPropertyNormal); }

int main() {
    const int m = 576, width = 2048, hidden = 16384, layers = 4, runs = 5;
    int max_window = 0, max_persist = 0;
    CHECK(cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, 0));
    CHECK(cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, 0));
    printf("{\"max_window_bytes\": %d, \"max_persisting_l2_bytes\": %d}\n", max_window, max_persist);
    CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, max_persist));

    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t ws_bytes = 32 << 20;
    void* ws;
    CHECK(cudaMalloc(&ws, ws_bytes));
    const size_t gu_w = (size_t)2 * hidden * width, down_w = (size_t)width * hidden;
    __nv_bfloat16 *w_gu, *w_down, *a, *gu, *h;
    float* x;
    CHECK(cudaMalloc(&w_gu, gu_w * 2 * layers));
    CHECK(cudaMalloc(&w_down, down_w * 2 * layers));
    CHECK(cudaMalloc(&a, (size_t)m * width * 2));
    CHECK(cudaMalloc(&gu, (size_t)m * 2 * hidden * 2));
    CHECK(cudaMalloc(&h, (size_t)m * hidden * 2));
    CHECK(cudaMalloc(&x, (size_t)m * width * 4));
    // Small values (the products' speed does not depend on them, the GeGLU's tanh only a little).
    std::vector<__nv_bfloat16> host(1 << 24);
    srand(1);
    for (auto& v : host) v = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f) * 0.1f);
    auto fill = [&](__nv_bfloat16* p, size_t n) {
        for (size_t o = 0; o < n; o += host.size())
            CHECK(cudaMemcpy(p + o, host.data(), std::min(host.size(), n - o) * 2, cudaMemcpyHostToDevice));
    };
    fill(w_gu, gu_w * layers);
    fill(w_down, down_w * layers);
    fill(a, (size_t)m * width);
    CHECK(cudaMemset(x, 0, (size_t)m * width * 4));
    const Product gate_up(lt, m, width, 2 * hidden, CUDA_R_16BF, 0.0f, ws_bytes);
    const Product down(lt, m, hidden, width, CUDA_R_32F, 1.0f, ws_bytes);

    const size_t gu_bytes = (size_t)m * 2 * hidden * 2;
    const float persist_ratio = std::min(1.0f, (float)max_persist / (float)gu_bytes);
    const char* forms[] = {"none", "stream", "persist"};
    for (int f = 0; f < 3; ++f) {
        const bool stream = f == 1, persist = f == 2;
        for (int with_geglu = 1; with_geglu >= 0; --with_geglu) {
            auto enqueue = [&] {
                for (int l = 0; l < layers; ++l) {
                    const __nv_bfloat16 *wg = w_gu + gu_w * l, *wd = w_down + down_w * l;
                    if (stream) set_window(st, wg, std::min(gu_w * 2, (size_t)max_window), 1.0f, cudaAccessPropertyStreaming);
                    else if (persist) set_window(st, gu, std::min(gu_bytes, (size_t)max_window), persist_ratio, cudaAccessPropertyPersisting);
                    gate_up.run(lt, wg, a, gu, ws, ws_bytes, st);
                    if (with_geglu) {
                        if (persist) set_window(st, gu, std::min(gu_bytes, (size_t)max_window), 1.0f, cudaAccessPropertyNormal);
                        else clear_window(st);
                        geglu<<<dim3(hidden / 8 / 256, m), 256, 0, st>>>(h, gu, hidden);
                        CHECK(cudaGetLastError());
                    }
                    if (stream) set_window(st, wd, std::min(down_w * 2, (size_t)max_window), 1.0f, cudaAccessPropertyStreaming);
                    else clear_window(st);
                    down.run(lt, wd, h, x, ws, ws_bytes, st);
                }
                clear_window(st);
            };
            // What capture kept: the windows of the first layer's kernel nodes.
            cudaGraph_t g;
            CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            enqueue();
            CHECK(cudaStreamEndCapture(st, &g));
            size_t count = 0;
            CHECK(cudaGraphGetNodes(g, nullptr, &count));
            std::vector<cudaGraphNode_t> nodes(count);
            CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
            printf("{\"form\": \"%s\", \"geglu\": %d, \"nodes\": %zu, \"windows\": [", forms[f], with_geglu, count);
            for (size_t i = 0; i < count && i < 4; ++i) {
                cudaGraphNodeType type;
                CHECK(cudaGraphNodeGetType(nodes[i], &type));
                cudaKernelNodeAttrValue v = {};
                if (type == cudaGraphNodeTypeKernel)
                    CHECK(cudaGraphKernelNodeGetAttribute(nodes[i], cudaKernelNodeAttributeAccessPolicyWindow, &v));
                printf("%s{\"type\": %d, \"bytes\": %zu, \"hit\": %d, \"ratio\": %.2f}", i ? ", " : "", (int)type,
                       v.accessPolicyWindow.num_bytes, (int)v.accessPolicyWindow.hitProp, v.accessPolicyWindow.hitRatio);
            }
            printf("]}\n");
            CHECK(cudaGraphDestroy(g));
            const std::vector<float> ms = graph_replay_ms(st, runs, enqueue, 4);
            CHECK(cudaCtxResetPersistingL2Cache());
            printf("{\"form\": \"%s\", \"geglu\": %d, \"us_per_layer_best\": %.2f, \"us_per_layer_median\": %.2f}\n", forms[f],
                   with_geglu, ms[0] * 1000.0f / (4 * layers), ms[runs / 2] * 1000.0f / (4 * layers));
            fflush(stdout);
        }
    }
    return 0;
}
