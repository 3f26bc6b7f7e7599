#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on the expert's attention kernel in
# tools/device/benches/attention_bench.cu. FLAGS picks the form (default -DBENCH_WGMMA: the warpgroup-MMA
# kernel; "" for the mma.sync one), CASE the bench case (default "denoise 12": the step's 12
# splits; "denoise 1 split": one block walking all 12 chunks). Default: the main sections of the
# first launch; STALLS=1: instructions executed and the stall reasons per issued instruction of
# the sixth launch (warm caches). ncu runs with --clock-control none: the GPU clocks are left as
# they are.
set -euo pipefail
flags=${FLAGS--DBENCH_WGMMA}
# shellcheck disable=SC2086  # the flags are words
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a $flags -I kernels/cuda tools/device/benches/attention_bench.cu -lcuda -o /tmp/attention_bench_ncu
kernel=(-k regex:'attention_mq256(_wgmma)?_bf16')
if [ "${STALLS:-0}" = 1 ]; then
    what=(--launch-skip 5 --launch-count 1 --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__cycles_active.avg,sm__cycles_elapsed.max')
else
    what=(--launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats
        --section LaunchStats --section MemoryWorkloadAnalysis)
fi
ncu --clock-control none --target-processes all "${kernel[@]}" "${what[@]}" /tmp/attention_bench_ncu "${CASE:-denoise 12}" 2>&1 |
    grep -v "^==PROF==" | head -200
