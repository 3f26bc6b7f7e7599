#!/usr/bin/env bash
# Device-side: lerobot 0.6.1's post-processed actions for the tiny fixture (see
# tools/golden/gen_postprocessed.py). Wheels as for tools/device/checks/gen_golden.sh (carry [".whl"]).
# Copy back: cp <files_at>/golden_postprocessed.safetensors tests/data/pi05_tiny/
set -euo pipefail
cd "$(dirname "$0")/../../.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site CUDA_VISIBLE_DEVICES="" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUTDIR="${OUT:-/tmp/gen_postprocessed_out}"
mkdir -p "$OUTDIR"
python3 tools/golden/gen_postprocessed.py --fixture tests/data/pi05_tiny --out "$OUTDIR/golden_postprocessed.safetensors" 2>&1 | tee "$OUTDIR/gen_postprocessed.log"
