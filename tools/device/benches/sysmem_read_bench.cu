// What does a kernel pay to read mapped pinned host memory, per byte or per page? The camera
// frames are read by the preprocessing kernel straight from the pinned staging buffer
// (bench/NOTES.md item 63); in the step that read cost ~0.4 µs per 4 KB page touched, whatever
// the launch shape. This times, in graphs of 20 back-to-back launches:
//   - a kernel reading the first N pages (16-byte loads, every byte once) of
//       a) cuMemHostAlloc(DEVICEMAP) memory (the runtime's `Pinned`),
//       b) an mmap'd 2 MB-aligned region advised MADV_HUGEPAGE, then cudaHostRegister'ed (mapped),
//   - cudaMemcpyAsync host → device of the same bytes from each,
// each warm (the same pages read by every launch) and cold (each read after a kernel that reads
// 512 MB of device memory, as the step's weights do between two frames; that kernel's own time
// subtracted), and prints one JSON line per (source, pages). Then the step's case: the host writes
// two 224 × 224 RGB frames (301 KB) into the staging memory right before the kernel reads them,
// by memcpy or by non-temporal stores, into cuMemHostAlloc memory with and without
// write-combining: host write µs and kernel µs (events around the kernel alone), medians of 200.
// Built on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 tools/device/benches/sysmem_read_bench.cu -o sr && ./sr
#include <emmintrin.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>

#include "bench.cuh"

// Sums every 16-byte piece of [src, src + bytes) into one word per block (so the loads stay).
__global__ void read_pieces(const uint4* src, long pieces, unsigned* sink) {
    unsigned acc = 0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < pieces; i += (long)gridDim.x * blockDim.x) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

int main() {
    const size_t region = 8 << 20;
    unsigned char* pinned;
    CHECK(cudaHostAlloc(&pinned, region, cudaHostAllocMapped));
    // 2 MB-aligned anonymous memory, transparent huge pages asked for, then pinned and mapped.
    void* raw = mmap(nullptr, region + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return 1;
    unsigned char* huge = (unsigned char*)(((unsigned long)raw + (2 << 20) - 1) & ~((2ul << 20) - 1));
    const int advised = madvise(huge, region, MADV_HUGEPAGE);
    memset(huge, 1, region);
    memset(pinned, 1, region);
    CHECK(cudaHostRegister(huge, region, cudaHostRegisterMapped));
    unsigned char *d_pinned, *d_huge, *dst;
    CHECK(cudaHostGetDevicePointer((void**)&d_pinned, pinned, 0));
    CHECK(cudaHostGetDevicePointer((void**)&d_huge, huge, 0));
    CHECK(cudaMalloc(&dst, region));
    const size_t evict_bytes = 512ul << 20;
    unsigned char* evict;
    CHECK(cudaMalloc(&evict, evict_bytes));
    CHECK(cudaMemset(evict, 1, evict_bytes));
    unsigned* sink;
    CHECK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    FILE* thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char thp_mode[128] = "?";
    if (thp && fgets(thp_mode, sizeof thp_mode, thp)) thp_mode[strcspn(thp_mode, "\n")] = 0;
    printf("{\"thp\": \"%s\", \"madvise\": %d}\n", thp_mode, advised);
    const int launches = 20;
    for (int pages : {1, 8, 37, 74, 148, 512}) {
        const size_t bytes = (size_t)pages * 4096;
        struct Source {
            const char* name;
            unsigned char *host, *device;
        } sources[] = {{"cuMemHostAlloc", pinned, d_pinned}, {"thp_registered", huge, d_huge}};
        for (const Source& s : sources) {
            const int blocks = (int)std::min<size_t>(1024, (bytes / 16 + 255) / 256);
            const float kernel_us = graph_replay_ms(st, 5, [&] {
                                        for (int i = 0; i < launches; ++i)
                                            read_pieces<<<blocks, 256, 0, st>>>((const uint4*)s.device, bytes / 16, sink);
                                    })[2] *
                                    1000.0f / launches;
            const float copy_us = graph_replay_ms(st, 5, [&] {
                                      for (int i = 0; i < launches; ++i) CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, st));
                                  })[2] *
                                  1000.0f / launches;
            auto evicting = [&](bool copy) {
                return graph_replay_ms(st, 5, [&] {
                           for (int i = 0; i < launches; ++i) {
                               read_pieces<<<1024, 256, 0, st>>>((const uint4*)evict, evict_bytes / 16, sink);
                               if (copy) CHECK(cudaMemcpyAsync(dst, s.host, bytes, cudaMemcpyHostToDevice, st));
                               else read_pieces<<<blocks, 256, 0, st>>>((const uint4*)s.device, bytes / 16, sink);
                           }
                       })[2] *
                       1000.0f / launches;
            };
            const float evict_us = graph_replay_ms(st, 5, [&] {
                                       for (int i = 0; i < launches; ++i)
                                           read_pieces<<<1024, 256, 0, st>>>((const uint4*)evict, evict_bytes / 16, sink);
                                   })[2] *
                                   1000.0f / launches;
            const float cold_kernel_us = evicting(false) - evict_us, cold_copy_us = evicting(true) - evict_us;
            printf("{\"source\": \"%s\", \"pages\": %d, \"kernel_read_us\": %.2f, \"memcpy_us\": %.2f, \"cold_kernel_read_us\": %.2f, "
                   "\"cold_memcpy_us\": %.2f}\n",
                   s.name, pages, kernel_us, copy_us, cold_kernel_us, cold_copy_us);
            fflush(stdout);
        }
    }
    const size_t frame_bytes = 2 * 224 * 224 * 3;
    unsigned char* wc;
    CHECK(cudaHostAlloc(&wc, region, cudaHostAllocMapped | cudaHostAllocWriteCombined));
    unsigned char* d_wc;
    CHECK(cudaHostGetDevicePointer((void**)&d_wc, wc, 0));
    std::vector<unsigned char> source(8 * frame_bytes);
    for (size_t i = 0; i < source.size(); ++i) source[i] = (unsigned char)(i * 2654435761u >> 13);
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    struct Case {
        const char* name;
        unsigned char *host, *device;
        bool streaming;
    } cases[] = {{"cuMemHostAlloc memcpy", pinned, d_pinned, false},
                 {"cuMemHostAlloc non-temporal", pinned, d_pinned, true},
                 {"write-combined memcpy", wc, d_wc, false},
                 {"write-combined non-temporal", wc, d_wc, true}};
    for (const Case& c : cases) {
        std::vector<float> write_us, kernel_us;
        for (int it = 0; it < 220; ++it) {
            const unsigned char* src = source.data() + (it % 8) * frame_bytes;
            const auto t0 = std::chrono::steady_clock::now();
            if (c.streaming) {
                for (size_t i = 0; i < frame_bytes / 16; ++i) _mm_stream_si128((__m128i*)c.host + i, _mm_loadu_si128((const __m128i*)src + i));
                _mm_sfence();
            } else {
                memcpy(c.host, src, frame_bytes);
            }
            const auto t1 = std::chrono::steady_clock::now();
            CHECK(cudaEventRecord(e0, st));
            read_pieces<<<(int)((frame_bytes / 16 + 255) / 256), 256, 0, st>>>((const uint4*)c.device, frame_bytes / 16, sink);
            CHECK(cudaEventRecord(e1, st));
            CHECK(cudaEventSynchronize(e1));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (it >= 20) write_us.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count()), kernel_us.push_back(ms * 1000.0f);
        }
        std::sort(write_us.begin(), write_us.end());
        std::sort(kernel_us.begin(), kernel_us.end());
        printf("{\"frames\": \"%s\", \"bytes\": %zu, \"host_write_us\": %.2f, \"kernel_read_us\": %.2f}\n", c.name, frame_bytes,
               write_us[write_us.size() / 2], kernel_us[kernel_us.size() / 2]);
        fflush(stdout);
    }
    return 0;
}
