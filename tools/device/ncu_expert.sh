#!/usr/bin/env bash
# Nsight Compute on the pi05-2v step (graph nodes profiled one at a time, clocks left alone): the
# duration of a window of ~200 consecutive kernels under each SETTINGS entry (default: the fused
# QKV + RoPE on and off), then the chosen kernels' speed-of-light, launch and warp-state sections.
# Built binaries as for cuda_checks.sh; `run` with carry [".device-carry"] and
#   bash tools/device/ncu_expert.sh
# Writes ncu_<setting>.csv and ncu_detail.txt to $OUT.
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
for setting in ${SETTINGS:-FRT_NO_FUSED_QKV=0 FRT_NO_FUSED_QKV=1}; do
    env ${setting//,/ } ncu --clock-control none --launch-skip "${SKIP:-4000}" --launch-count "${COUNT:-200}" \
        --section LaunchStats --metrics gpu__time_duration.sum --csv "${bench[@]}" >"$OUT/ncu_$setting.csv" 2>"$OUT/ncu_$setting.err" || echo "ncu failed under $setting"
done
ncu --clock-control none -k "regex:${KERNELS:-qkv_rope_stream|mlp_stream}" -c "${DETAIL_COUNT:-4}" --section SpeedOfLight --section LaunchStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis "${bench[@]}" >"$OUT/ncu_detail.txt" 2>&1 || echo "ncu detail failed"
