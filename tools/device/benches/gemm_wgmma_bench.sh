#!/usr/bin/env bash
# On the GPU machine: tools/device/benches/gemm_wgmma_bench.cu (a warp-specialised wgmma product for the
# action expert's 50-row GEMMs against cuBLASLt's heuristic algorithms, same weight rotation) for
# each compile-time variant in VARIANTS (';'-separated -D flag sets, e.g. "-DSTAGES=4;-DSTAGES=8").
# Results (one JSON line per shape and variant) under $OUT. Needs nvcc and an sm_90 GPU.
set -euo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
IFS=';' read -ra variants <<<"${VARIANTS:--DSTAGES=8}"
for i in "${!variants[@]}"; do
    flags=${variants[$i]}
    # shellcheck disable=SC2086  # the flags are words
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a $flags tools/device/benches/gemm_wgmma_bench.cu -lcublasLt -lcuda -o "/tmp/gemm_wgmma_bench_$i"
    "/tmp/gemm_wgmma_bench_$i" | sed "s|^{|{\"flags\": \"$flags\", |" | tee -a "$out/gemm-wgmma-bench.jsonl"
done
