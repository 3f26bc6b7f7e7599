#!/usr/bin/env bash
# On the GPU machine: tools/device/benches/vision_attention_bench.cu (attention_hd72 vs an f32 reference,
# its time per launch on SigLIP's shape, and the floor of its loads and launch) for each
# compile-time variant in VARIANTS (';'-separated sets of nvcc flags, e.g. "-DAH_SPLIT=4" or
# "-I dir" with another commit's attention_heads.cu in dir). Results under $OUT.
set -euo pipefail
out="${OUT:-/tmp/out}"
mkdir -p "$out"
IFS=';' read -ra variants <<<"${VARIANTS:-}"
[ ${#variants[@]} -gt 0 ] || variants=("")
for i in "${!variants[@]}"; do
    flags=${variants[$i]}
    # shellcheck disable=SC2086  # the flags are words
    nvcc -O3 -std=c++17 -arch=sm_90 $flags -I kernels/cuda tools/device/benches/vision_attention_bench.cu -o "/tmp/vision_attention_bench_$i"
    "/tmp/vision_attention_bench_$i" | sed "s|^{|{\"flags\": \"$flags\", |" | tee -a "$out/vision-attention-bench.jsonl"
done
