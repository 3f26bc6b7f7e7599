#!/usr/bin/env bash
# On the GPU machine: tools/device/attention_bench.cu (attention_mq256 vs an f32 reference, and
# its time per launch on the Pi0.5 shapes). Results under $OUT.
set -euo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda tools/device/attention_bench.cu -o /tmp/attention_bench
/tmp/attention_bench | tee "$out/attention-bench.jsonl"
