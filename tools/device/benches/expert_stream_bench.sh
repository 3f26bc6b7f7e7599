#!/usr/bin/env bash
# On the GPU machine: tools/device/benches/expert_stream_bench.cu (the expert's products as a persistent
# weight stream, bench/NOTES.md items 32 and 52) for each compile-time variant in VARIANTS
# (';'-separated -D flag sets, e.g. "-DPHASES;-DPHASES -DMLP"), compiled in parallel, run one
# after another. Results (one JSON line per variant) under $OUT. Needs nvcc and an sm_90 GPU.
set -euo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
IFS=';' read -ra variants <<<"${VARIANTS:--DPHASES -DMLP}"
for i in "${!variants[@]}"; do
    # shellcheck disable=SC2086  # the flags are words
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a ${variants[$i]} tools/device/benches/expert_stream_bench.cu -lcublasLt \
        -o "/tmp/expert_stream_bench_$i" &
done
wait
for i in "${!variants[@]}"; do
    "/tmp/expert_stream_bench_$i" | sed "s|^{|{\"flags\": \"${variants[$i]}\", |" | tee -a "$out/expert-stream-bench.jsonl"
done
