#!/usr/bin/env bash
# CUDA backend checks and benchmark on a GPU machine (issue #3, checks 5a-5d and the pi05-2v
# benchmark). Binaries are built on the x86_64 build host by tools/device/build_carry.sh into
# .device-carry/ (gitignored); this script only runs them.
#
#   bash tools/device/cuda_checks.sh tests        # 5a tiny parity, 5b every op, 5d no-alloc
#   bash tools/device/cuda_checks.sh full         # synth full size, lerobot f32 reference, 5c
#   bash tools/device/cuda_checks.sh bench        # pi05-2v (+ 1 and 3 views), cold and warm cache
#   bash tools/device/cuda_checks.sh tests full bench
#
# On this workplace's device tool: `run` with carry [".device-carry", ".whl"] and the command
#   bash tools/device/cuda_checks.sh tests full bench
# Results (JSON) and the log land in $OUT; commit them under bench/results/.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/flashrt_device_out}"
mkdir -p "$OUT"
BIN="$PWD/.device-carry"
FULL=/tmp/flashrt_full
LOG="$OUT/device.log"
exec > >(tee -a "$LOG") 2>&1

# cuBLASLt and NVRTC: the toolkit's and/or the Python wheels' copies (cudarc loads them by name).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "cuda_nvrtc")))' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export FRT_COMMIT="$(cat "$BIN/COMMIT")" FRT_REQUIRE_GPU=1 FRT_RESULTS_DIR="$OUT" FRT_FIXTURE_DIR="$PWD/tests/data/pi05_tiny"
export RUST_LOG="${RUST_LOG:-info}" RUST_BACKTRACE=1
echo "== commit $FRT_COMMIT; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
ls "$LD_LIBRARY_PATH" >/dev/null 2>&1 || true

for phase in "$@"; do
    case "$phase" in
    tests)
        echo "== tests: every op vs CPU, tiny fixture vs CPU, no allocation"
        "$BIN/cuda_pi05" --test-threads=1 --nocapture every_op tiny_fixture step_allocates
        ;;
    full)
        echo "== full size: synth, lerobot f32 reference, CUDA parity"
        [ -f "$FULL/model.safetensors" ] || { time "$BIN/flashrt" synth --size full --seed 1 --out "$FULL"; }
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 \
            python3 tools/device/full_parity.py --ckpt "$FULL" --timing-json "$OUT/lerobot_eager_bf16.json"
        FRT_FULL_PARITY_DIR="$FULL" "$BIN/cuda_pi05" --test-threads=1 --nocapture full_size
        ;;
    bench)
        echo "== bench pi05-2v (cold kernel cache, then warm), 1 and 3 views"
        [ -f "$FULL/model.safetensors" ] || { time "$BIN/flashrt" synth --size full --seed 1 --out "$FULL"; }
        # Page cache: the checkpoint was just written or read; cold start measures open, not disk.
        rm -rf /tmp/kcache
        XDG_CACHE_HOME=/tmp/kcache "$BIN/flashrt" bench --checkpoint "$FULL" --backend cuda --iterations 1000 --views 2 --workload pi05-2v-cold-kernel-cache --out "$OUT/bench.json"
        XDG_CACHE_HOME=/tmp/kcache "$BIN/flashrt" bench --checkpoint "$FULL" --backend cuda --iterations 1000 --views 2 --workload pi05-2v --out "$OUT/bench.json"
        XDG_CACHE_HOME=/tmp/kcache "$BIN/flashrt" bench --checkpoint "$FULL" --backend cuda --iterations 1000 --views 1 --workload pi05-1v --out "$OUT/bench.json"
        XDG_CACHE_HOME=/tmp/kcache "$BIN/flashrt" bench --checkpoint "$FULL" --backend cuda --iterations 1000 --views 3 --workload pi05-3v --out "$OUT/bench.json"
        ;;
    *)
        echo "unknown phase $phase (tests | full | bench)"
        exit 2
        ;;
    esac
done
echo "== done"
