// Shared by the wgmma experiments (gemm_wgmma_bench.cu, expert_stream_bench.cu): bench.cuh's error
// checks, mbarrier and bulk-copy helpers, the wgmma m64n64k16 product on 128-byte-swizzled K-major
// shared-memory tiles, and the host-side pre-tiling of weights into those tiles. sm_90a only.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench.cuh"

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void bar_expect(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}

// Byte offset of 16-byte piece `piece` (0-7) of row `r` in a 64 × 64 bf16 tile in the 128-byte
// swizzle that wgmma reads through `desc` (and that the tensor-memory engine writes): the piece
// index XOR the row within its group of 8. The one statement of the layout, for the kernels'
// shared-memory tiles and `pretile`'s global ones.
__host__ __device__ __forceinline__ unsigned swizzled(int r, int piece) { return r * 128 + ((piece ^ (r & 7)) << 4); }

// Eight f32 (x, then y) as eight bf16, round to nearest even, in one 16-byte vector.
__device__ __forceinline__ uint4 pack8_bf16(float4 x, float4 y) {
    __nv_bfloat162 h[4] = {__floats2bfloat162_rn(x.x, x.y), __floats2bfloat162_rn(x.z, x.w), __floats2bfloat162_rn(y.x, y.y),
                           __floats2bfloat162_rn(y.z, y.w)};
    uint4 packed;
    memcpy(&packed, h, 16);
    return packed;
}

// wgmma shared-memory descriptor: K-major operand, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_64x64(float* d, unsigned long long da, unsigned long long db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db));
}

// Row-major w[n, k] into the pre-tiled, swizzled layout the kernel streams.
static std::vector<__nv_bfloat16> pretile(const std::vector<__nv_bfloat16>& w, int n, int k) {
    constexpr int BN = 64, BK = 64;
    std::vector<__nv_bfloat16> t(w.size());
    for (int nt = 0; nt < n / BN; ++nt)
        for (int kc = 0; kc < k / BK; ++kc) {
            __nv_bfloat16* dst = t.data() + ((long)nt * (k / BK) + kc) * BN * BK;
            for (int r = 0; r < BN; ++r)
                for (int piece = 0; piece < 8; ++piece)
                    memcpy((char*)dst + swizzled(r, piece), w.data() + (long)(nt * BN + r) * k + kc * BK + piece * 8, 16);
        }
    return t;
}
