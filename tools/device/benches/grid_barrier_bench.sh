#!/usr/bin/env bash
# On the GPU machine: tools/device/benches/grid_barrier_bench.cu (the cost of one grid-wide barrier among
# one block per SM, in several forms, against a kernel boundary). Results (one JSON line per form
# and grid size) under $OUT. Needs nvcc and an sm_90 GPU.
set -euo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvcc -O3 -std=c++17 -arch=sm_90 tools/device/benches/grid_barrier_bench.cu -o /tmp/grid_barrier_bench
/tmp/grid_barrier_bench | tee -a "$out/grid-barrier-bench.jsonl"
