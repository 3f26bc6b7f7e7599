// How much do the runtime's GEMMs leave on the table by choosing among cuBLASLt's heuristic
// candidates only (runtime/src/cuda/gemm.rs asks for 8 and times them at open)? For every GEMM
// shape of one pi05-2v step, in the runtime's orientation (out[M, N] = a[M, K] · w[N, K]ᵀ, bf16,
// f32 accumulate; SigLIP's products with their bias / GELU epilogues), this times
//   1. the plain heuristic's candidates (what the tuner picks among today),
//   2. the heuristic limited to each algorithm id in turn (CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID),
//   3. every tile of every algorithm id with the default stages and cluster shape, checked by
//      cublasLtMatmulAlgoCheck, and for the three best tiles every stage count and cluster shape,
// each as graphs of 32 back-to-back products over rotating weight copies (≥ 200 MB, so L2 does
// not hold them, as in a step), and prints one JSON line per shape with the best of each and the
// best configuration's output against the heuristic's first (nmse). Built on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/benches/gemm_algos_bench.cu -lcublasLt -o ga && ./ga [name filter]
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstring>
#include <string>

#include "bench.cuh"

struct Shape {
    const char* name;
    int m, k, n, count;  // count: products of this shape per step
    cublasLtEpilogue_t epilogue;
};

struct Config {
    cublasLtMatmulAlgo_t algo;
    float us;
};

// "id/tile/stages/cluster/splitk" of an algorithm's configuration.
static std::string describe(const cublasLtMatmulAlgo_t& algo) {
    int id = 0, splitk = 0;
    unsigned tile = 0, stages = 0;
    unsigned short cluster = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    char s[96];
    snprintf(s, sizeof s, "%d/%u/%u/%u/%d", id, tile, stages, (unsigned)cluster, splitk);
    return s;
}

// An algorithm capability that is an array of ids (tiles, stages, cluster shapes); {0} (the
// default) when the algorithm lists none.
template <typename T>
static std::vector<T> cap_ids(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoCapAttributes_t attr) {
    size_t bytes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) return {0};
    std::vector<T> ids(bytes / sizeof(T));
    cublasLtMatmulAlgoCapGetAttribute(&algo, attr, ids.data(), bytes, &bytes);
    return ids.empty() ? std::vector<T>{0} : ids;
}

int main(int argc, char** argv) {
    const Shape shapes[] = {
        {"vis_qkv", 512, 1152, 3456, 27, CUBLASLT_EPILOGUE_BIAS},      {"vis_o", 512, 1152, 1152, 27, CUBLASLT_EPILOGUE_BIAS},
        {"vis_fc1", 512, 1152, 4304, 27, CUBLASLT_EPILOGUE_GELU_BIAS}, {"vis_fc2", 512, 4304, 1152, 27, CUBLASLT_EPILOGUE_BIAS},
        {"pre_qkv", 576, 2048, 2560, 18, CUBLASLT_EPILOGUE_DEFAULT},   {"pre_o", 576, 2048, 2048, 18, CUBLASLT_EPILOGUE_DEFAULT},
        {"pre_gateup", 576, 2048, 32768, 18, CUBLASLT_EPILOGUE_DEFAULT}, {"pre_down", 576, 16384, 2048, 18, CUBLASLT_EPILOGUE_DEFAULT},
        {"dec_qkv", 50, 1024, 2560, 180, CUBLASLT_EPILOGUE_DEFAULT},   {"dec_o", 50, 2048, 1024, 180, CUBLASLT_EPILOGUE_DEFAULT},
        {"dec_gateup", 50, 1024, 8192, 180, CUBLASLT_EPILOGUE_DEFAULT}, {"dec_down", 50, 4096, 1024, 180, CUBLASLT_EPILOGUE_DEFAULT},
    };
    const int products = 32;
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    const size_t ws_bytes = 32 << 20;  // the runtime's WORKSPACE_BYTES
    void* ws;
    CHECK(cudaMalloc(&ws, ws_bytes));
    srand(1);
    double total_heuristic = 0, total_best = 0;
    for (const Shape& s : shapes) {
        if (argc > 1 && !strstr(s.name, argv[1])) continue;
        const GemmOperands ops(s.m, s.k, s.n);
        __nv_bfloat16 *const w = ops.w, *const a = ops.a;
        const size_t w_elems = ops.w_elems;
        const int copies = ops.copies;
        __nv_bfloat16 *d, *d_ref, *bias;
        CHECK(cudaMalloc(&d, (size_t)s.m * s.n * 2));
        CHECK(cudaMalloc(&d_ref, (size_t)s.m * s.n * 2));
        CHECK(cudaMalloc(&bias, (size_t)s.n * 2));
        CHECK(cudaMemcpy(bias, ops.host.data(), (size_t)s.n * 2, cudaMemcpyHostToDevice));

        cublasLtMatmulDesc_t desc;
        CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t t = CUBLAS_OP_T;
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &s.epilogue, sizeof s.epilogue));
        if (s.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
            CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        cublasLtMatrixLayout_t la, lb, ld;
        CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, s.m, s.k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, s.n, s.m, s.n));
        const float one = 1.0f, zero = 0.0f;
        auto run = [&](const cublasLtMatmulAlgo_t& algo, __nv_bfloat16* out, int i) {
            return cublasLtMatmul(lt, desc, &one, w + (size_t)(i % copies) * w_elems, la, a, lb, &zero, out, ld, out, ld, &algo,
                                  ws, ws_bytes, st);
        };
        // µs per product, best of 3 runs of a 32-product graph; a failing launch gives infinity.
        auto time_algo = [&](const cublasLtMatmulAlgo_t& algo) -> float {
            if (run(algo, d, 0) != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(st) != cudaSuccess) return INFINITY;
            return graph_replay_ms(st, 3, [&] {
                       for (int i = 0; i < products; ++i) CHECK_LT(run(algo, d, i));
                   })[0] * 1000.0f / products;
        };
        cublasLtMatmulPreference_t pref;
        CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
        CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
        auto heuristic = [&](cublasLtMatmulHeuristicResult_t* results, int want) {
            int found = 0;
            if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, want, results, &found) != CUBLAS_STATUS_SUCCESS) return 0;
            return found;
        };

        // 1. The plain heuristic's first 8 (the runtime's CANDIDATES).
        cublasLtMatmulHeuristicResult_t results[64];
        const int found = heuristic(results, 8);
        std::vector<Config> plain;
        for (int i = 0; i < found; ++i)
            if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= ws_bytes)
                plain.push_back({results[i].algo, time_algo(results[i].algo)});
        if (plain.empty()) {
            fprintf(stderr, "%s: no heuristic algorithm\n", s.name);
            continue;
        }
        CHECK_LT(run(plain[0].algo, d_ref, 0));

        // 2. The heuristic per algorithm id; 3. every tile with default stages and cluster shape.
        int ids[256], id_count = 0;
        CHECK_LT(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, 256,
                                          ids, &id_count));
        std::vector<Config> by_id, enumerated;
        const uint32_t limited = CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID;
        int checked = 0;
        for (int i = 0; i < id_count; ++i) {
            cublasLtMatmulAlgo_t algo;
            if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, ids[i],
                                       &algo) != CUBLAS_STATUS_SUCCESS)
                continue;
            cublasLtMatmulPreference_t by;
            CHECK_LT(cublasLtMatmulPreferenceCreate(&by));
            CHECK_LT(cublasLtMatmulPreferenceSetAttribute(by, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
            if (cublasLtMatmulPreferenceSetAttribute(by, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &limited, sizeof limited) == CUBLAS_STATUS_SUCCESS) {
                cublasLtMatmulHeuristicResult_t r[16];
                for (auto& x : r) x.algo = algo;
                int n = 0;
                if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, by, 16, r, &n) == CUBLAS_STATUS_SUCCESS)
                    for (int j = 0; j < n; ++j)
                        if (r[j].state == CUBLAS_STATUS_SUCCESS && r[j].workspaceSize <= ws_bytes) by_id.push_back({r[j].algo, time_algo(r[j].algo)});
            }
            cublasLtMatmulPreferenceDestroy(by);
            for (unsigned tile : cap_ids<unsigned>(algo, CUBLASLT_ALGO_CAP_TILE_IDS)) {
                cublasLtMatmulAlgo_t c = algo;
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
                cublasLtMatmulHeuristicResult_t r;
                ++checked;
                if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &c, &r) == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws_bytes)
                    enumerated.push_back({c, time_algo(c)});
            }
        }
        auto by_time = [](const Config& x, const Config& y) { return x.us < y.us; };
        std::sort(enumerated.begin(), enumerated.end(), by_time);
        // The three best tiles with every stage count and cluster shape.
        const size_t top = std::min<size_t>(3, enumerated.size());
        for (size_t i = 0; i < top; ++i) {
            const cublasLtMatmulAlgo_t base = enumerated[i].algo;
            for (unsigned stages : cap_ids<unsigned>(base, CUBLASLT_ALGO_CAP_STAGES_IDS))
                for (unsigned short cluster : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}) {
                    if (stages == 0 && cluster == 0) continue;
                    cublasLtMatmulAlgo_t c = base;
                    cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages);
                    if (cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster) !=
                        CUBLAS_STATUS_SUCCESS)
                        continue;
                    cublasLtMatmulHeuristicResult_t r;
                    ++checked;
                    if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &c, &r) == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws_bytes)
                        enumerated.push_back({c, time_algo(c)});
                }
        }
        std::sort(plain.begin(), plain.end(), by_time);
        std::sort(by_id.begin(), by_id.end(), by_time);
        std::sort(enumerated.begin(), enumerated.end(), by_time);
        Config best = plain[0];
        for (const auto* v : {&by_id, &enumerated})
            if (!v->empty() && (*v)[0].us < best.us) best = (*v)[0];
        // The best configuration's output against the heuristic's first.
        CHECK_LT(run(best.algo, d, 0));
        CHECK(cudaStreamSynchronize(st));
        std::vector<__nv_bfloat16> got((size_t)s.m * s.n), want((size_t)s.m * s.n);
        CHECK(cudaMemcpy(got.data(), d, got.size() * 2, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(want.data(), d_ref, want.size() * 2, cudaMemcpyDeviceToHost));
        double se = 0, sr = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const double r = __bfloat162float(want[i]), e = __bfloat162float(got[i]) - r;
            se += e * e, sr += r * r;
        }
        const double flop = 2.0 * s.m * s.k * s.n;
        total_heuristic += plain[0].us * s.count, total_best += best.us * s.count;
        printf("{\"shape\": \"%s\", \"m\": %d, \"k\": %d, \"n\": %d, \"per_step\": %d, \"heuristic_candidates\": %zu, "
               "\"heuristic_best_us\": %.2f, \"heuristic_best\": \"%s\", \"by_id_candidates\": %zu, \"by_id_best_us\": %.2f, "
               "\"enumerated\": %zu, \"checked\": %d, \"enumerated_best_us\": %.2f, \"enumerated_best\": \"%s\", "
               "\"best_tflops\": %.0f, \"saved_ms_per_step\": %.3f, \"nmse_vs_heuristic_first\": %.2e}\n",
               s.name, s.m, s.k, s.n, s.count, plain.size(), plain[0].us, describe(plain[0].algo).c_str(), by_id.size(),
               by_id.empty() ? INFINITY : by_id[0].us, enumerated.size(), checked, enumerated.empty() ? INFINITY : enumerated[0].us,
               enumerated.empty() ? "" : describe(enumerated[0].algo).c_str(), flop / best.us / 1e6,
               (plain[0].us - best.us) * s.count / 1000.0, sr > 0 ? se / sr : 0.0);
        fflush(stdout);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(desc);
        for (void* p : {(void*)d, (void*)d_ref, (void*)bias}) CHECK(cudaFree(p));
    }
    printf("{\"gemm_ms_per_step\": {\"heuristic_best\": %.3f, \"best_found\": %.3f}}\n", total_heuristic / 1000, total_best / 1000);
    return 0;
}
