// Checks and times attention_hd72 (kernels/cuda/attention_heads.cu at head dim 72: SigLIP's fused attention) against
// a plain f32 reference on SigLIP's shape in the step: 2 cameras × 256 patches, 16 heads of 72,
// Q/K/V inside the fused QKV product's rows (stride 3456), written just before (L2-resident),
// and on a ragged case (50 queries over 79 keys per group: empty key parts, rows past the end).
// Then the floor its loads set: a kernel with the same grid that only copies each block's Q, K
// and V into shared memory as attention_hd72 does, and an empty kernel with that grid.
// Built on the GPU machine (variants by -D, e.g. -DAH_SPLIT=4; -I a directory holding another
// commit's attention_heads.cu first times that one):
//   nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda tools/device/benches/vision_attention_bench.cu -o va && ./va
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "attention_heads.cu"
#include "bench.cuh"

// The head-dim-72 form's shape (attention_heads.cu: AhShape<72, 256>).
using Va = AhShape<72, 256>;
#define VA_D 72
#define VA_ROWS AH_ROWS
#define VA_THREADS AH_THREADS
#define VA_MAX_KEYS 256
#define VA_STRIDE Va::stride
#define VA_SHARED_BYTES Va::shared_bytes

// One block per (group, row, head); scores in shared memory.
__global__ void reference(float* out, const bf16* q, const bf16* k, const bf16* v, int stride, int rows, int keys, int heads,
                          float scale) {
    __shared__ float sc[256];
    const int h = blockIdx.y, g = blockIdx.z, r = blockIdx.x;
    const bf16* qr = q + ((long)g * rows + r) * stride + h * VA_D;
    for (int j = threadIdx.x; j < keys; j += blockDim.x) {
        float s = 0.f;
        for (int d = 0; d < VA_D; ++d) s += to_float(qr[d]) * to_float(k[((long)g * keys + j) * stride + h * VA_D + d]);
        sc[j] = s * scale;
    }
    __syncthreads();
    float mx = -INFINITY, sum = 0.f;
    for (int j = 0; j < keys; ++j) mx = fmaxf(mx, sc[j]);
    for (int j = 0; j < keys; ++j) sum += expf(sc[j] - mx);
    for (int d = threadIdx.x; d < VA_D; d += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < keys; ++j) acc += expf(sc[j] - mx) * to_float(v[((long)g * keys + j) * stride + h * VA_D + d]);
        out[((long)g * rows + r) * heads * VA_D + h * VA_D + d] = acc / sum;
    }
}

// attention_hd72's copies alone: the nine 16-byte pieces of each Q, K and V row into the same
// shared memory (all on one wait), then one store.
__global__ void __launch_bounds__(VA_THREADS) loads_only(bf16* out, const bf16* q, const bf16* k, const bf16* v, int stride,
                                                         int rows, int keys) {
    extern __shared__ __align__(16) unsigned char shared[];
    unsigned short* tile = (unsigned short*)shared;
    const int h = blockIdx.y, g = blockIdx.z, row0 = blockIdx.x * VA_ROWS;
    constexpr int pieces = VA_D / 8;
    for (int i = threadIdx.x; i < VA_ROWS * pieces; i += VA_THREADS) {
        const int r = i / pieces, c = i % pieces;
        att_copy16(&tile[r * VA_STRIDE + c * 8], q + ((long)g * rows + min(row0 + r, rows - 1)) * stride + h * VA_D + c * 8, true);
    }
    for (int i = threadIdx.x; i < VA_MAX_KEYS * pieces; i += VA_THREADS) {
        const int j = i / pieces, c = i % pieces;
        const long at = ((long)g * keys + min(j, keys - 1)) * stride + h * VA_D + c * 8;
        att_copy16(&tile[(VA_ROWS + j) * VA_STRIDE + c * 8], k + at, j < keys);
        att_copy16(&tile[(VA_ROWS + VA_MAX_KEYS + j) * VA_STRIDE + c * 8], v + at, j < keys);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    if (threadIdx.x < VA_D) out[((long)g * rows + row0) * 16 * VA_D + h * VA_D + threadIdx.x] = *(const bf16*)&tile[threadIdx.x * 41 % (VA_SHARED_BYTES / 2)];
}
__global__ void __launch_bounds__(VA_THREADS) empty(bf16*) {}

int main() {
    struct Case { const char* name; int rows, keys; };
    const Case cases[] = {{"siglip 2 cameras", 256, 256}, {"ragged 50 x 79", 50, 79}};
    const int groups = 2, heads = 16, stride = 3 * heads * VA_D;
    srand(5);
    CHECK(cudaFuncSetAttribute(attention_hd72_bf16, cudaFuncAttributeMaxDynamicSharedMemorySize, VA_SHARED_BYTES));
    CHECK(cudaFuncSetAttribute(loads_only, cudaFuncAttributeMaxDynamicSharedMemorySize, VA_SHARED_BYTES));
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    for (const Case& c : cases) {
        // One QKV buffer: rows of [q | k | v]; k and v rows are the keys' (keys ≤ rows here or not).
        const int qkv_rows = groups * std::max(c.rows, c.keys);
        std::vector<unsigned short> hqkv((size_t)qkv_rows * stride);
        for (auto& x : hqkv) x = bits((rand() / (float)RAND_MAX - 0.5f) * 6.f);
        bf16 *qkv, *out;
        float* ref;
        CHECK(cudaMalloc(&qkv, hqkv.size() * 2));
        CHECK(cudaMalloc(&out, (size_t)groups * c.rows * heads * VA_D * 2));
        CHECK(cudaMalloc(&ref, (size_t)groups * c.rows * heads * VA_D * 4));
        CHECK(cudaMemcpy(qkv, hqkv.data(), hqkv.size() * 2, cudaMemcpyHostToDevice));
        const bf16 *q = qkv, *k = qkv + heads * VA_D, *v = qkv + 2 * heads * VA_D;
        const float scale = 1.f / sqrtf((float)VA_D);
        const dim3 grid((c.rows + VA_ROWS - 1) / VA_ROWS, heads, groups);
        auto attention = [&] {
            attention_hd72_bf16<<<grid, VA_THREADS, VA_SHARED_BYTES, st>>>(out, heads * VA_D, q, stride, k, stride, v, stride, c.rows, c.keys,
                                                                         1, nullptr, nullptr, -1, scale * 1.4426950408889634f, 1.0f);
        };
        attention();
        reference<<<dim3(c.rows, heads, groups), 128, 0, st>>>(ref, q, k, v, stride, c.rows, c.keys, heads, scale);
        CHECK(cudaStreamSynchronize(st));
        std::vector<unsigned short> got((size_t)groups * c.rows * heads * VA_D);
        std::vector<float> want(got.size());
        CHECK(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(want.data(), ref, want.size() * 4, cudaMemcpyDeviceToHost));
        double max_err = 0, se = 0, sr = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            const double e = unbits(got[i]) - want[i];
            max_err = std::max(max_err, fabs(e));
            se += e * e;
            sr += (double)want[i] * want[i];
        }
        // µs per launch: graphs of 64 launches, 5 replays back to back, best of 3 runs.
        const auto per_launch = [&](auto launch) {
            return graph_replay_ms(st, 3, [&] { for (int i = 0; i < 64; ++i) launch(); }, 5)[0] * 1000 / 320;
        };
        const float us = per_launch(attention);
        const float loads_us = per_launch([&] { loads_only<<<grid, VA_THREADS, VA_SHARED_BYTES, st>>>(out, q, k, v, stride, c.rows, c.keys); });
        const float empty_us = per_launch([&] { empty<<<grid, VA_THREADS, 0, st>>>(out); });
        printf("{\"case\": \"%s\", \"threads\": %d, \"blocks\": %d, \"us\": %.2f, \"loads_only_us\": %.2f, \"empty_us\": %.2f, "
               "\"max_abs_err\": %.3g, \"nmse\": %.3g}\n",
               c.name, VA_THREADS, grid.x * grid.y * grid.z, us, loads_us, empty_us, max_err, se / sr);
        fflush(stdout);
        if (!(se / sr < 1e-4)) {
            fprintf(stderr, "%s: attention_hd72 disagrees with the reference (nmse %.3g)\n", c.name, se / sr);
            return 1;
        }
        CHECK(cudaFree(qkv));
        CHECK(cudaFree(out));
        CHECK(cudaFree(ref));
    }
    return 0;
}
