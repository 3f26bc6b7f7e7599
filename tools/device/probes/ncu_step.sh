#!/usr/bin/env bash
# On the GPU machine: Nsight Compute on the kernels as the real step launches them, on the
# full-size pi05-2v workload (binaries from tools/device/checks/build_carry.sh; clocks left as they are,
# --clock-control none; caches flushed between kernels, ncu's default). Output in $OUT.
#   bash tools/device/probes/ncu_step.sh
#       sections (speed of light, occupancy, warp states, ...) of the first COUNT (3) launches of
#       the kernels matching KERNELS (regex; default the fused attention kernels) -> ncu_step.txt
#   SETTINGS="FRT_X=1 - FRT_Y=2,FRT_Z=1" KERNELS=... COUNT=10 bash tools/device/probes/ncu_step.sh
#       the duration of those launches under each setting (environment assignments joined by
#       commas, "-" for none) -> ncu_<i>.csv, the i-th setting listed in ncu_settings.txt (the
#       device tool returns no file names with '=')
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT="${OUT:-/tmp/flashrt_device_out}"
mkdir -p "$OUT"
for d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "cuda_nvrtc")))' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
BIN="$PWD/.device-carry/flashrt"
[ -f /tmp/flashrt_full/model.safetensors ] || "$BIN" synth --size full --seed 1 --out /tmp/flashrt_full > /dev/null
bench=("$BIN" bench --checkpoint /tmp/flashrt_full --backend cuda --cameras 2 --iterations 1 --warmup 0 --views 2 --workload ncu --out /tmp/ncu_bench.json)
kernels=(-k "regex:${KERNELS:-attention_hd72|attention_mq256}" --launch-count "${COUNT:-3}")
if [ -z "${SETTINGS:-}" ]; then
    ncu --clock-control none --target-processes all "${kernels[@]}" \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \
        "${bench[@]}" 2>&1 | grep -v "^==PROF==" | tee "$OUT/ncu_step.txt" | head -400
    exit 0
fi
"${bench[@]}" > /dev/null # the kernel cache, so that each profiled process opens alike
i=0
: > "$OUT/ncu_settings.txt"
for setting in $SETTINGS; do
    echo "$i $setting" >> "$OUT/ncu_settings.txt"
    assignments=()
    [ "$setting" != "-" ] && IFS=, read -ra assignments <<< "$setting"
    env "${assignments[@]}" ncu --clock-control none "${kernels[@]}" --section LaunchStats --metrics gpu__time_duration.sum,sm__cycles_active.avg \
        --csv "${bench[@]}" > "$OUT/ncu_$i.csv" 2> "$OUT/ncu_$i.err" || echo "ncu failed under $setting"
    i=$((i + 1))
done
