#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on attention_hd72 (SigLIP's attention) in
# tools/device/benches/vision_attention_bench.cu, FLAGS its variant: the main sections of the fourth
# launch (warm caches) into $OUT/ncu-vision-attention.txt, and the SASS with each instruction's
# executions and stall samples into $OUT/ncu-vision-attention-sass.csv. ncu runs with
# --clock-control none: the GPU clocks are left as they are.
set -euo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
# shellcheck disable=SC2086  # the flags are words
nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo ${FLAGS:-} -I kernels/cuda tools/device/benches/vision_attention_bench.cu -o /tmp/vision_attention_ncu
ncu --clock-control none --target-processes all -k regex:attention_hd72 --launch-skip 3 --launch-count 1 --set full \
    --import-source yes -f -o /tmp/vision_attention /tmp/vision_attention_ncu >/dev/null
ncu -i /tmp/vision_attention.ncu-rep --print-details all >"$out/ncu-vision-attention.txt" 2>&1 || true
ncu -i /tmp/vision_attention.ncu-rep --page source --csv --print-source sass >"$out/ncu-vision-attention-sass.csv" 2>&1 || true
grep -E "Duration|Elapsed Cycles|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Stall" "$out/ncu-vision-attention.txt" | head -40
