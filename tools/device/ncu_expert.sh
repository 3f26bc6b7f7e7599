#!/usr/bin/env bash
# Nsight Compute on the pi05-2v step (graph nodes profiled one at a time, caches flushed between
# kernels, clocks left alone): each kernel's duration and launch shape under each SETTINGS entry
# (environment assignments joined by commas; "-" for none). With KERNELS (a regex) only the first
# COUNT (10) kernels of those names are profiled; without, a window of COUNT (200) consecutive
# kernels after SKIP (4000) launches. Then, with DETAIL set (a regex), those kernels' speed-of-light,
# memory and warp-state sections under the default settings.
# Built binaries as for cuda_checks.sh; `run` with carry [".device-carry"] and e.g.
#   SETTINGS="FRT_NO_FUSED_QKV=1 -" KERNELS="qkv_rope_stream|rope_qkv|gemm|nvjet" bash tools/device/ncu_expert.sh
# Writes ncu_<i>.csv (the i-th setting, listed in ncu_settings.txt) and ncu_detail.txt to $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/flashrt_device_out}"
mkdir -p "$OUT"
BIN="$PWD/.device-carry"
FULL=/tmp/flashrt_full
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "cuda_nvrtc")))' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export XDG_CACHE_HOME=/tmp/kcache RUST_LOG=warn
[ -f "$FULL/model.safetensors" ] || "$BIN/flashrt" synth --size full --seed 1 --out "$FULL" >/dev/null
bench=("$BIN/flashrt" bench --checkpoint "$FULL" --backend cuda --cameras 2 --iterations 3 --views 2 --workload pi05-2v --out /tmp/ncu_bench.json)
"${bench[@]}" >/dev/null # warms the kernel cache
if [ -n "${KERNELS:-}" ]; then
    select=(-k "regex:$KERNELS" -c "${COUNT:-10}")
else
    select=(--launch-skip "${SKIP:-4000}" --launch-count "${COUNT:-200}")
fi
i=0
: >"$OUT/ncu_settings.txt"
for setting in ${SETTINGS:--}; do
    echo "$i $setting" >>"$OUT/ncu_settings.txt"
    assignments=()
    [ "$setting" != "-" ] && IFS=, read -ra assignments <<<"$setting"
    env "${assignments[@]}" ncu --clock-control none "${select[@]}" --section LaunchStats --metrics gpu__time_duration.sum,sm__cycles_active.avg \
        --csv "${bench[@]}" >"$OUT/ncu_$i.csv" 2>"$OUT/ncu_$i.err" || echo "ncu failed under $setting"
    i=$((i + 1))
done
if [ -n "${DETAIL:-}" ]; then
    ncu --clock-control none -k "regex:$DETAIL" -c 2 --section SpeedOfLight --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis "${bench[@]}" >"$OUT/ncu_detail.txt" 2>&1 || echo "ncu detail failed"
fi
