// Experiment (bench/NOTES.md item 31): a few-row product out[r, n] = Σ_k a[r, k] · w[n, k] for the
// action expert's 50 rows, in the form cuBLAS's own Hopper kernels take (warp-specialised: one
// producer warp streams the weights by bulk copies into a ring of shared-memory stages, one
// warpgroup multiplies with wgmma), plus what a runtime that owns its weights can do and cuBLAS
// cannot: the weights pre-tiled at load into 64 × 64 blocks already in wgmma's 128-byte-swizzled
// layout, so each stage is one 8 KB bulk copy. K may be split over blocks, the splits summed in a
// fixed order by the last to finish. Checked against cuBLASLt and timed against every algorithm
// of cuBLASLt's heuristic on the same rotation of weights (more than L2 holds), both as CUDA
// graphs of back-to-back products. sm_90a only (wgmma). Built and run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a tools/device/benches/gemm_wgmma_bench.cu -lcublasLt -o g && ./g
// Diagnostic variants: -DNO_MMA (stream the weights and A, no products), -DNO_W (no weight
// stream: products on whatever the stages hold), -DNO_A (no A load).
#include "wgmma_common.cuh"

constexpr int BN = 64;            // output columns per block (wgmma n)
constexpr int BK = 64;            // K per tile: one 128-byte swizzle row of bf16
constexpr int TILE_BYTES = BN * BK * 2;
#ifndef STAGES
#define STAGES 8
#endif
constexpr int THREADS = 160;      // warps 0-3: the wgmma warpgroup; warp 4: the producer

// Grid (n / 64, splits); block y takes K chunks [y · chunks / splits, (y + 1) · chunks / splits).
// `wt`: tile (nt, kc) of 64 × 64 at element offset (nt · k / 64 + kc) · 4096, 128B-swizzled.
// PDL: launched as a programmatic dependent of the kernel that writes A: the first STAGES weight
// tiles (which no kernel writes) load before `griddepcontrol.wait`, during that kernel.
template <bool PDL>
__global__ void __launch_bounds__(THREADS) gemm_wgmma(__nv_bfloat16* out, int out_stride, const __nv_bfloat16* a, int a_stride,
                                                     const __nv_bfloat16* wt, int k, int rows, float* partial, int* counters) {
    extern __shared__ __align__(1024) unsigned char shared[];
    __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
    __shared__ int last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tile = blockIdx.x, splits = gridDim.y, split = blockIdx.y;
    const int k_chunks = k / BK, c0 = split * k_chunks / splits, c1 = (split + 1) * k_chunks / splits, chunks = c1 - c0;
    // 1024-aligned: the swizzle pattern is a function of the address bits.
    const unsigned base = (smem_addr(shared) + 1023) & ~1023u;
    const unsigned w_stages = base, a_tiles = base + STAGES * TILE_BYTES;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            bar_init(smem_addr(&full[s]), 1);
            bar_init(smem_addr(&empty[s]), 4);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == 4) {  // producer
        if (lane == 0) {
            const __nv_bfloat16* w = wt + ((long)tile * k_chunks + c0) * (BN * BK);
            for (int c = 0; c < chunks; ++c) {
                const int s = c % STAGES;
#ifndef NO_W
                if (c >= STAGES) bar_wait(smem_addr(&empty[s]), ((c / STAGES) - 1) & 1);
                if (PDL && c == STAGES) asm volatile("griddepcontrol.wait;\n" ::: "memory");
                bar_expect(smem_addr(&full[s]), TILE_BYTES);
                bulk_copy(w_stages + s * TILE_BYTES, w + (long)c * BN * BK, TILE_BYTES, smem_addr(&full[s]));
#endif
            }
        }
        return;
    }

    // The warpgroup: this split's A (64 rows × chunks · 64) into swizzled tiles; rows past `rows` zero.
    if (PDL) asm volatile("griddepcontrol.wait;\n" ::: "memory");  // A is the previous kernel's output
#ifndef NO_A
    for (int i = threadIdx.x; i < chunks * 64 * 8; i += 128) {
        const int c = i / 512, r = (i / 8) % 64, piece = i % 8;
        const unsigned dst = a_tiles + c * TILE_BYTES + swizzled(r, piece);
        const __nv_bfloat16* src = a + (long)min(r, rows - 1) * a_stride + (c0 + c) * BK + piece * 8;
        const int bytes = r < rows ? 16 : 0;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
    }
#endif
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes, read by wgmma
    asm volatile("bar.sync 1, 128;\n" ::: "memory");

    float acc[32];
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    for (int c = 0; c < chunks; ++c) {
        const int s = c % STAGES;
#ifndef NO_W
        bar_wait(smem_addr(&full[s]), (c / STAGES) & 1);
#endif
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#ifndef NO_MMA
        for (int kk = 0; kk < BK / 16; ++kk)
            wgmma_64x64(acc, desc(a_tiles + c * TILE_BYTES + kk * 32), desc(w_stages + s * TILE_BYTES + kk * 32));
#endif
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        // The previous chunk's products are done: its stage may be refilled.
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (c > 0 && lane == 0) bar_arrive(smem_addr(&empty[(c - 1) % STAGES]));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

    // Fragment: warp w, rows 16w + lane/4 (+8); column group j: columns 8j + 2(lane%4) (+1).
    const int row0 = warp * 16 + (lane >> 2), col0 = 2 * (lane & 3);
    if (splits > 1) {
        float* mine = partial + ((long)tile * splits + split) * 64 * 64;
        for (int j = 0; j < 8; ++j)
            for (int h = 0; h < 2; ++h) *(float2*)(mine + (row0 + 8 * h) * 64 + 8 * j + col0) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        __threadfence();
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
        if (threadIdx.x == 0) last = atomicAdd(&counters[tile], 1) == splits - 1;
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
        if (!last) return;
        __threadfence();
        for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
        for (int sp = 0; sp < splits; ++sp) {
            const float* p = partial + ((long)tile * splits + sp) * 64 * 64;
            for (int j = 0; j < 8; ++j)
                for (int h = 0; h < 2; ++h) {
                    float2 v = __ldcg((const float2*)(p + (row0 + 8 * h) * 64 + 8 * j + col0));
                    acc[4 * j + 2 * h] += v.x, acc[4 * j + 2 * h + 1] += v.y;
                }
        }
        if (threadIdx.x == 0) counters[tile] = 0;
    }
    for (int j = 0; j < 8; ++j)
        for (int h = 0; h < 2; ++h) {
            const int r = row0 + 8 * h;
            if (r < rows)
                *(__nv_bfloat162*)(out + (long)r * out_stride + tile * BN + 8 * j + col0) =
                    __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
}

// Stand-in for the kernel before a product in the step (the expert's norms): one block per row
// of 1024 f32, RMS-normalised into A's bf16 row (its first 1024 columns). Lets its dependents
// launch at once (programmatic dependent launch); they wait for its completion themselves.
__global__ void __launch_bounds__(128) norm_rows(__nv_bfloat16* a, int a_stride, const float* x) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    __shared__ float part[4];
    const float* row = x + blockIdx.x * 1024;
    float v[8], ss = 0.0f;
    for (int i = 0; i < 8; ++i) v[i] = row[threadIdx.x * 8 + i], ss += v[i] * v[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    const float scale = rsqrtf((part[0] + part[1] + part[2] + part[3]) / 1024.0f + 1e-6f);
    for (int i = 0; i < 8; ++i) a[(long)blockIdx.x * a_stride + threadIdx.x * 8 + i] = __float2bfloat16(v[i] * scale);
}

static size_t shared_bytes(int k, int splits) { return 1024 + (STAGES + (k / BK + splits - 1) / splits) * TILE_BYTES; }

int main() {
    struct Shape { const char* name; int n, k; std::vector<int> splits; };
    // The first split count of each is the one timed after the norm.
    const Shape shapes[] = {{"qkv", 2560, 1024, {1, 2}},
                            {"o", 1024, 2048, {4, 8}},
                            {"gate_up", 8192, 1024, {1}},
                            {"down", 1024, 4096, {4, 8}}};
    const int rows = 50, copies = 32, replays = 20;
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    void* workspace;
    CHECK(cudaMalloc(&workspace, 32 << 20));
    CHECK(cudaFuncSetAttribute(gemm_wgmma<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes(1024, 1)));
    CHECK(cudaFuncSetAttribute(gemm_wgmma<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes(1024, 1)));
    float* x;
    CHECK(cudaMalloc(&x, 64 * 1024 * 4));
    CHECK(cudaMemset(x, 0, 64 * 1024 * 4));
    srand(1);
    auto rnd = [] { return (float)rand() / RAND_MAX * 2.0f - 1.0f; };

    for (const Shape& sh : shapes) {
        const int n = sh.n, k = sh.k;
        std::vector<__nv_bfloat16> ha((size_t)rows * k), hw((size_t)n * k);
        for (auto& v : ha) v = __float2bfloat16(rnd());
        __nv_bfloat16 *a, *w_plain, *w_tiled, *out_lt, *out_mine;
        CHECK(cudaMalloc(&a, ha.size() * 2));
        CHECK(cudaMemcpy(a, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMalloc(&w_plain, hw.size() * 2 * copies));
        CHECK(cudaMalloc(&w_tiled, hw.size() * 2 * copies));
        for (int c = 0; c < copies; ++c) {
            for (auto& v : hw) v = __float2bfloat16(rnd() * 0.05f);
            const auto t = pretile(hw, n, k);
            CHECK(cudaMemcpy(w_plain + c * hw.size(), hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(w_tiled + c * hw.size(), t.data(), t.size() * 2, cudaMemcpyHostToDevice));
        }
        CHECK(cudaMalloc(&out_lt, (size_t)rows * n * 2));
        CHECK(cudaMalloc(&out_mine, (size_t)rows * n * 2));
        float* partial;
        int* counters;
        CHECK(cudaMalloc(&partial, (size_t)n / BN * 16 * 64 * 64 * 4));
        CHECK(cudaMalloc(&counters, n / BN * 4));
        CHECK(cudaMemset(counters, 0, n / BN * 4));

        // cuBLASLt as the runtime calls it: outᵀ (n × rows) = op_T(W: k × n) · aᵀ (k × rows).
        cublasLtMatmulDesc_t op;
        CHECK_LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t t = CUBLAS_OP_T;
        CHECK_LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
        cublasLtMatrixLayout_t la, lb, ld;
        CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, rows, k));
        CHECK_LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, rows, n));
        cublasLtMatmulPreference_t pref;
        CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
        size_t ws = 32 << 20;
        CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        cublasLtMatmulHeuristicResult_t heur[8];
        int found = 0;
        CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 8, heur, &found));
        const float one = 1.0f, zero = 0.0f;

        auto time_graph = [&](auto&& launch_all) { return graph_replay_ms(st, 1, launch_all, replays)[0] * 1000.0f / (replays * copies); };

        float best_lt = 1e9f;
        int best_algo = -1;
        for (int h = 0; h < found; ++h) {
            const float us = time_graph([&] {
                for (int c = 0; c < copies; ++c)
                    CHECK_LT(cublasLtMatmul(lt, op, &one, w_plain + c * hw.size(), la, a, lb, &zero, out_lt, ld, out_lt, ld, &heur[h].algo,
                                            workspace, ws, st));
            });
            if (us < best_lt) best_lt = us, best_algo = h;
        }
        // Reference output: weight copy 0 through the fastest algorithm.
        CHECK_LT(cublasLtMatmul(lt, op, &one, w_plain, la, a, lb, &zero, out_lt, ld, out_lt, ld, &heur[best_algo].algo, workspace, ws, st));
        CHECK(cudaStreamSynchronize(st));
        std::vector<__nv_bfloat16> ref((size_t)rows * n), mine((size_t)rows * n);
        CHECK(cudaMemcpy(ref.data(), out_lt, ref.size() * 2, cudaMemcpyDeviceToHost));
        printf("{\"shape\": \"%s\", \"n\": %d, \"k\": %d, \"rows\": %d, \"cublaslt_us\": %.2f, \"cublaslt_algos\": %d", sh.name, n, k, rows, best_lt,
               found);

        for (int splits : sh.splits) {
            const dim3 grid(n / BN, splits);
            const size_t smem = shared_bytes(k, splits);
            CHECK(cudaMemset(out_mine, 0, mine.size() * 2));
            gemm_wgmma<false><<<grid, THREADS, smem, st>>>(out_mine, n, a, k, w_tiled, k, rows, partial, counters);
            CHECK(cudaGetLastError());
            CHECK(cudaStreamSynchronize(st));
            CHECK(cudaMemcpy(mine.data(), out_mine, mine.size() * 2, cudaMemcpyDeviceToHost));
            double err = 0, norm = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
                const double r = __bfloat162float(ref[i]), m = __bfloat162float(mine[i]);
                err += (r - m) * (r - m), norm += r * r;
            }
            const float us = time_graph([&] {
                for (int c = 0; c < copies; ++c)
                    gemm_wgmma<false><<<grid, THREADS, smem, st>>>(out_mine, n, a, k, w_tiled + c * hw.size(), k, rows, partial, counters);
            });
            printf(", \"splits_%d\": {\"us\": %.2f, \"nmse\": %.2e, \"blocks\": %d, \"smem\": %zu}", splits, us, err / norm, grid.x * grid.y, smem);
        }
        // In sequence after the kernel that writes A, as in a step: norm + cuBLASLt, norm + this
        // kernel, norm + this kernel as a programmatic dependent (weights prefetched meanwhile).
        {
            const int splits = sh.splits[0];
            const dim3 grid(n / BN, splits);
            const size_t smem = shared_bytes(k, splits);
            auto norm = [&] { norm_rows<<<rows, 128, 0, st>>>(a, k, x); };
            const float norm_us = time_graph([&] {
                for (int c = 0; c < copies; ++c) norm();
            });
            const float with_lt = time_graph([&] {
                for (int c = 0; c < copies; ++c) {
                    norm();
                    CHECK_LT(cublasLtMatmul(lt, op, &one, w_plain + c * hw.size(), la, a, lb, &zero, out_lt, ld, out_lt, ld, &heur[best_algo].algo,
                                            workspace, ws, st));
                }
            });
            const float with_mine = time_graph([&] {
                for (int c = 0; c < copies; ++c) {
                    norm();
                    gemm_wgmma<false><<<grid, THREADS, smem, st>>>(out_mine, n, a, k, w_tiled + c * hw.size(), k, rows, partial, counters);
                }
            });
            const float with_pdl = time_graph([&] {
                for (int c = 0; c < copies; ++c) {
                    norm();
                    cudaLaunchConfig_t cfg = {};
                    cfg.gridDim = grid, cfg.blockDim = dim3(THREADS), cfg.dynamicSmemBytes = smem, cfg.stream = st;
                    cudaLaunchAttribute attr[1];
                    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    attr[0].val.programmaticStreamSerializationAllowed = 1;
                    cfg.attrs = attr, cfg.numAttrs = 1;
                    CHECK(cudaLaunchKernelEx(&cfg, gemm_wgmma<true>, out_mine, n, (const __nv_bfloat16*)a, k, (const __nv_bfloat16*)(w_tiled + c * hw.size()), k,
                                             rows, partial, counters));
                }
            });
            printf(", \"after_norm\": {\"splits\": %d, \"norm_alone_us\": %.2f, \"norm_cublaslt_us\": %.2f, \"norm_mine_us\": %.2f, \"norm_mine_pdl_us\": %.2f}",
                   splits, norm_us, with_lt, with_mine, with_pdl);
        }
        printf(", \"weight_mb\": %.2f}\n", hw.size() * 2 / 1e6);
        fflush(stdout);
        cudaFree(a), cudaFree(w_plain), cudaFree(w_tiled), cudaFree(out_lt), cudaFree(out_mine), cudaFree(partial), cudaFree(counters);
    }
    return 0;
}
