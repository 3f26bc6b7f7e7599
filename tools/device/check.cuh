// CUDA runtime error check shared by the device benches (attention_bench.cu,
// grid_barrier_bench.cu, and through wgmma_common.cuh the wgmma experiments): a failed call
// prints where and why, and exits.
#pragma once
#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                                  \
    do {                                                                                          \
        cudaError_t err_ = (x);                                                                   \
        if (err_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
