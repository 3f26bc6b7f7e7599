#!/usr/bin/env bash
# On the GPU machine: tools/device/benches/attention_bench.cu (attention_mq256 vs an f32 reference, and
# its time per launch on the Pi0.5 shapes) for each compile-time variant in VARIANTS (';'-separated
# sets of -D flags, e.g. "-DATT_ROWS=32;-DBENCH_WGMMA"; the harness's own: -DBENCH_NO_COMBINE times
# the split kernel without its merge, -DBENCH_KV_COPIES=1 keeps K/V resident in L2). Results under $OUT.
set -euo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
IFS=';' read -ra variants <<<"${VARIANTS:--DATT_ROWS=64}"
for i in "${!variants[@]}"; do
    flags=${variants[$i]}
    # shellcheck disable=SC2086  # the flags are words
    nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a $flags -I kernels/cuda tools/device/benches/attention_bench.cu -lcuda -o "/tmp/attention_bench_$i"
    "/tmp/attention_bench_$i" "${CASES:-denoise}" | sed "s|^{|{\"flags\": \"$flags\", |" | tee -a "$out/attention-bench.jsonl"
done
