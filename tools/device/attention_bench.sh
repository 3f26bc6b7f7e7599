#!/usr/bin/env bash
# On the GPU machine: tools/device/attention_bench.cu (attention_mq256 vs an f32 reference, and
# its time per launch on the Pi0.5 shapes) for several rows-per-block. Results under $OUT.
set -euo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
for rows in ${ROWS:-64}; do  # ROWS="64 32 16": 64 was fastest (bench/NOTES.md)
    nvcc -O3 -std=c++17 -arch=sm_90 -DATT_ROWS=$rows -I kernels/cuda tools/device/attention_bench.cu -o /tmp/attention_bench_$rows
    /tmp/attention_bench_$rows ${CASES:-denoise} | tee -a "$out/attention-bench.jsonl"
done
