#!/usr/bin/env bash
# On the GPU machine: Nsight Compute sections for the fused attention kernels as the real step
# launches them (the eager warm-up at open), on the full-size pi05-2v workload. Binaries from
# tools/device/build_carry.sh; clocks left as they are (--clock-control none). Output in $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/flashrt_device_out}"
mkdir -p "$OUT"
for d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "cuda_nvrtc")))' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
BIN="$PWD/.device-carry/flashrt"
[ -f /tmp/flashrt_full/model.safetensors ] || "$BIN" synth --size full --seed 1 --out /tmp/flashrt_full > /dev/null
ncu --clock-control none --target-processes all -k "regex:${KERNELS:-attention_mh72|attention_mq256}" --launch-count "${COUNT:-3}" \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
    "$BIN" bench --checkpoint /tmp/flashrt_full --backend cuda --cameras 2 --iterations 1 --warmup 0 --views 2 --workload ncu \
    --out /tmp/ncu_bench.json 2>&1 | grep -v "^==PROF==" | tee "$OUT/ncu_step.txt" | head -400
