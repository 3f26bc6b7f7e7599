#!/usr/bin/env bash
# On the GPU machine: Nsight Compute sections for attention_mq256 on the denoise shape (12 splits).
# ncu runs with --clock-control none: the GPU clocks are left as they are.
set -e
nvcc -O3 -std=c++17 -arch=sm_90 -I kernels/cuda tools/device/attention_bench.cu -o /tmp/attention_bench 2>/dev/null
ncu --clock-control none --target-processes all -k regex:attention_mq256_bf16 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats /tmp/attention_bench "denoise 12" 2>&1 | grep -v "^==PROF==" | head -150
