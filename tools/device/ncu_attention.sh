#!/usr/bin/env bash
# On the GPU machine: Nsight Compute sections for the expert's attention kernel in
# tools/device/attention_bench.cu. FLAGS picks the form (default -DBENCH_WGMMA: the warpgroup-MMA
# kernel; "" for the mma.sync one), CASE the bench case (default "denoise 12": the step's 12
# splits; "denoise 1 split": one block walking all 12 chunks). ncu runs with --clock-control none:
# the GPU clocks are left as they are.
set -euo pipefail
flags=${FLAGS--DBENCH_WGMMA}
# shellcheck disable=SC2086  # the flags are words
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a $flags -I kernels/cuda tools/device/attention_bench.cu -o /tmp/attention_bench_ncu
ncu --clock-control none --target-processes all -k regex:'attention_mq256(_wgmma)?_bf16' --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --section MemoryWorkloadAnalysis /tmp/attention_bench_ncu "${CASE:-denoise 12}" 2>&1 | grep -v "^==PROF==" | head -200
