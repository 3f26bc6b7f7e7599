#!/usr/bin/env bash
# On the GPU machine: tools/device/benches/launch_cost_bench.cu (what a streamed launch's skeleton costs:
# shared memory, mbarriers, clusters and their barriers, the partial exchange, cooperative launch
# and grid barrier; bench/NOTES.md item 55). One JSON line per variant under $OUT. Needs nvcc and
# an sm_90a GPU.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels/cuda tools/device/benches/launch_cost_bench.cu -o /tmp/launch_cost_bench
/tmp/launch_cost_bench | tee -a "$out/launch-cost-bench.jsonl"
