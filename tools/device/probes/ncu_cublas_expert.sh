#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on the cuBLAS kernels torch picks for the action expert's four
# products (50 rows), one process per shape, the fourth launch of each (after warm-up). What a
# few-row GEMM kernel of ours has to beat (bench/NOTES.md item 16). Output in $OUT/ncu_cublas.txt.
set -euo pipefail
OUT="${OUT:-/tmp/flashrt_device_out}"
mkdir -p "$OUT"
for shape in "2560 1024" "1024 2048" "8192 1024" "1024 4096"; do
    set -- $shape
    echo "== 50 x $2 · [$1, $2]ᵀ"
    ncu --clock-control none --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section LaunchStats --section Occupancy \
        python3 -c "
import torch
a = torch.randn(50, $2, device='cuda', dtype=torch.bfloat16)
w = torch.randn($1, $2, device='cuda', dtype=torch.bfloat16)
for _ in range(4):
    torch.nn.functional.linear(a, w)
torch.cuda.synchronize()
" 2>&1 | grep -v "^==PROF==" | grep -E "^  [a-zA-Z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|Grid Size|Block Size|Registers|Shared Memory Per|Achieved Occupancy|L2 Cache Throughput"
done | tee "$OUT/ncu_cublas.txt"
