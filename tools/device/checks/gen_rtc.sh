#!/usr/bin/env bash
# Device-side: lerobot 0.6.1's real-time chunking on the tiny Pi0.5 fixture (see
# tools/golden/gen_rtc.py). Wheels as for tools/device/checks/gen_golden.sh (carry [".whl"]).
# Copy back: cp <files_at>/golden_rtc.safetensors tests/data/pi05_tiny/
set -euo pipefail
cd "$(dirname "$0")/../../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site CUDA_VISIBLE_DEVICES="" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUTDIR="${OUT:-/tmp/gen_rtc_out}"
mkdir -p "$OUTDIR"
python3 tools/golden/gen_rtc.py --fixture tests/data/pi05_tiny --out "$OUTDIR/golden_rtc.safetensors" 2>&1 | tee "$OUTDIR/gen_rtc.log"
