// Shared device helpers. No CUDA toolkit header is included: NVRTC ships none, and a deployment
// box may have NVRTC without a toolkit. bf16 travels as raw bits (conversions by PTX instruction).
#pragma once

// A bf16 value as its 16 raw bits (the upper half of an IEEE f32).
struct bf16 {
    unsigned short bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(((unsigned)v.bits) << 16); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
// Round to nearest, ties to even, as PyTorch's float -> bfloat16 cast, in one conversion
// instruction (sm_80+); a NaN becomes the canonical quiet NaN.
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) {
    unsigned short bits;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(bits) : "f"(v));
    return bf16{bits};
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32); every thread gets the total.
// `scratch` holds 32 floats of shared memory; the leading barrier lets callers reuse it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// 2^x in one instruction (ex2.approx: ~2 ulp), denormal results flushed to zero; exp2(-inf) = 0.
// The softmaxes' exponentials: weights ≤ 1 that end as bf16 or in f32 sums.
__device__ __forceinline__ float exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
#define LOG2E 1.4426950408889634f

// 0.5 x (1 + tanh(u)) written as x / (1 + e^(-2u)): the same function with one fast exponential
// instead of tanhf (the prefix MLP applies it to 11.7 M values per step).
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608f;  // sqrt(2 / pi)
    return x / (1.0f + __expf(-2.0f * k * (x + 0.044715f * x * x * x)));
}

// Two f32 as bf16x2 (the lower index in the low half), as mma operands and vector stores take
// them, in one conversion instruction, rounding as from_float does.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// Eight bf16 packed in 16 bytes (the lower index in the low half of each word) as f32.
__device__ __forceinline__ void unpack8(uint4 u, float* v) {
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// Eight consecutive elements as f32, one 16-byte access per eight bf16 or four f32.
__device__ __forceinline__ void load8(const bf16* p, float* v) { unpack8(*(const uint4*)p, v); }
__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(bf16* p, const float* v) {
    *(uint4*)p = make_uint4(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]), pack_bf16x2(v[4], v[5]), pack_bf16x2(v[6], v[7]));
}
__device__ __forceinline__ void store8(float* p, const float* v) {
    ((float4*)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4*)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Instantiates `KERNEL(NAME, TIN, TOUT)` for the four f32/bf16 input/output combinations,
// named `<name>_<in>_<out>` (the Rust launchers build the same names).
#define FOR_IN_OUT(KERNEL, NAME)            \
    KERNEL(NAME##_f32_f32, float, float)    \
    KERNEL(NAME##_f32_bf16, float, bf16)    \
    KERNEL(NAME##_bf16_f32, bf16, float)    \
    KERNEL(NAME##_bf16_bf16, bf16, bf16)

// Instantiates `KERNEL(NAME, T)` for f32 and bf16, named `<name>_<t>`.
#define FOR_TYPE(KERNEL, NAME)  \
    KERNEL(NAME##_f32, float)   \
    KERNEL(NAME##_bf16, bf16)

// Programmatic dependent launch (sm_90 on; a no-op where the next kernel is not launched as a
// programmatic dependent): lets the next kernel's blocks start now. They wait for this grid
// with `griddepcontrol.wait` before reading what it writes.
__device__ __forceinline__ void launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The other side (sm_90 on): a kernel launched as a programmatic dependent waits here until the
// grid before it has finished and its writes are visible; elsewhere it returns at once.
__device__ __forceinline__ void wait_for_prior_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// All blocks of the (co-resident, cooperatively launched) grid meet, 128 threads of each (the
// first four warps, mlp.cu's consumers: named barrier 1); writes before it are visible after it.
// Self-resetting (cooperative groups' scheme): block 0 adds 2³¹ − (blocks − 1), the others 1, so
// the top bit flips once all have arrived and the low bits return to where they were; `word`
// needs no initial value and no reset between launches.
__device__ __forceinline__ void grid_barrier_128(unsigned* word) {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
    if (threadIdx.x == 0) {
        const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        __threadfence();
        const unsigned old = atomicAdd(word, add);
        unsigned now;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(now) : "l"(word) : "memory");
        } while (((old ^ now) & 0x80000000u) == 0);
    }
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
}

#if __CUDA_ARCH__ >= 890
// Two values into one e4m3 pair (round to nearest even, saturating to ±448, as CUDA's
// __nv_cvt_float_to_fp8(…, __NV_SATFINITE, __NV_E4M3) and the runtime's CPU emulation,
// runtime/src/fp8.rs): `first` in the low byte (the lower address), `second` above. The
// instruction exists from sm_89 on.
__device__ __forceinline__ unsigned short e4m3x2(float first, float second) {
    unsigned short pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(second), "f"(first));
    return pair;
}
#endif

// An e4m3 value as its 8 raw bits: an FP8 product's input, written in e4m3 by the kernel that
// produces it (a norm, a gated activation) with the product's inverse input scale applied
// (`out_scale`), instead of in bf16 and then quantized by a launch of its own. The `_e4m3`
// instantiations exist from sm_89 on, like the conversion.
struct e4m3 {
    unsigned char bits;
};
#if __CUDA_ARCH__ >= 890
template <> __device__ __forceinline__ e4m3 from_float<e4m3>(float v) { return e4m3{(unsigned char)e4m3x2(v, 0.0f)}; }
__device__ __forceinline__ void store8(e4m3* p, const float* v) {
    *(uint2*)p = make_uint2(e4m3x2(v[0], v[1]) | (unsigned)e4m3x2(v[2], v[3]) << 16,
                            e4m3x2(v[4], v[5]) | (unsigned)e4m3x2(v[6], v[7]) << 16);
}
// e4m3 codes as f32: two at a time through f16 (exact: every e4m3 value is an f16 value).
__device__ __forceinline__ void e4m3x2_to_float(unsigned short pair, float* v) {
    unsigned halves;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(pair));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(v[0]) : "h"((unsigned short)(halves & 0xffffu)));
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(v[1]) : "h"((unsigned short)(halves >> 16)));
}
__device__ __forceinline__ float to_float(e4m3 c) {
    float v[2];
    e4m3x2_to_float(c.bits, v);
    return v[0];
}
__device__ __forceinline__ void load8(const e4m3* p, float* v) {
    const uint2 u = *(const uint2*)p;
    e4m3x2_to_float(u.x & 0xffffu, v), e4m3x2_to_float(u.x >> 16, v + 2);
    e4m3x2_to_float(u.y & 0xffffu, v + 4), e4m3x2_to_float(u.y >> 16, v + 6);
}
// Instantiates `KERNEL(NAME, TIN, TOUT)` for f32 and bf16 inputs into e4m3, named
// `<name>_<in>_e4m3`.
#define FOR_IN_E4M3(KERNEL, NAME)         \
    KERNEL(NAME##_f32_e4m3, float, e4m3) \
    KERNEL(NAME##_bf16_e4m3, bf16, e4m3)
#else
#define FOR_IN_E4M3(KERNEL, NAME)
#endif

// ---- Hopper (sm_90a) building blocks: the warpgroup MMA kernels' (attention_mq256.cu, mlp.cu) --------
// Byte offset of 16-byte piece `piece` (0-7) of row `r` in a 64 × 64 bf16 tile in the 128-byte
// swizzle wgmma reads (and bulk tensor copies write): the piece index XOR the row within its 8.
// Plain arithmetic, for every architecture (mlp.cu's retile_weight prepares tiles anywhere).
__host__ __device__ __forceinline__ unsigned swizzle128(int r, int piece) { return r * 128 + ((piece ^ (r & 7)) << 4); }

// Transaction barriers (mbarrier) in shared memory (sm_80+): `count` arrivals complete a phase.
__device__ __forceinline__ void mbarrier_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// ---- Tensor-core helpers shared by the attention kernels (sm_80 instructions) ---------------

__device__ __forceinline__ void att_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared without registers; `valid` false writes zeros instead.
__device__ __forceinline__ void att_copy16(void* smem, const void* global, bool valid) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(valid ? 16 : 0));
}

// Four 8x8 bf16 matrices from shared memory (lanes 8i … 8i + 7 address matrix i's rows), as
// mma fragments; `_trans` transposes each matrix on the way.
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const unsigned short* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const unsigned short* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}

// Max and sum over the four lanes of an mma quad (the lanes holding one row's columns).
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}


#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Shared-memory matrix descriptor with the 128-byte swizzle: start, leading and stride byte offsets.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

#define WG_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_D32_OPERANDS(d)                                                                                            \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),       \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),        \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),       \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

// d (64 × 64 f32, accumulated) += A B over 16 of k: A and B K-major in shared memory.
__device__ __forceinline__ void wg_mma_ss(float* d, unsigned long long a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_D32_OPERANDS(d)
                 : "l"(a), "l"(b));
}

// The same over 32 of k with e4m3 operands (FP8 has no transposed form: both K-major), into d
// (`accumulate`) or overwriting it. A 64-row tile of 128 bytes per row holds 64 of k in bf16 or
// 128 in e4m3, so one instruction steps 32 bytes along k in either, and the descriptors are the
// same.
__device__ __forceinline__ void wg_mma_ss_e4m3(float* d, unsigned long long a, unsigned long long b, bool accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " WG_D32 ", %32, %33, p, 1, 1;\n}\n"
                 : WG_D32_OPERANDS(d)
                 : "l"(a), "l"(b), "r"((int)accumulate));
}

// 16 bytes global → shared, asynchronous; zeros when `valid` is false.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* global, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global), "r"(valid ? 16 : 0));
}

// One arrival on the barrier's current phase.
__device__ __forceinline__ void mbarrier_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\nwait:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
#endif
