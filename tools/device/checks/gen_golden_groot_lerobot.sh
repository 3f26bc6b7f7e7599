#!/usr/bin/env bash
# Device-side wrapper: write lerobot==0.6.1's own GR00T N1.7 fine-tune directories
# (tests/data/groot_n17_lerobot/, tests/data/groot_n17_lerobot_new_embodiment/) from the committed
# tiny raw fixture, with their golden actions (tools/golden/gen_groot_lerobot_dir.py says what).
# Everything runs on the CPU in float32.
#
# Local steps (in the repo root, once): the wheels listed in gen_golden_groot.sh in .whl/.
# Then the device call (tool `run`, carry [".whl"]):
#   bash tools/device/checks/gen_golden_groot_lerobot.sh
# and copy back:
#   tar -xf <files_at>/groot_n17_lerobot.tar -C tests/data
set -euo pipefail
cd "$(dirname "$0")/../../.."

site=/tmp/site_groot
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
export PYTHONPATH="$site" CUDA_VISIBLE_DEVICES="" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

OUTDIR="${OUT:-/tmp/gen_golden_groot_lerobot_out}"
mkdir -p "$OUTDIR"
work="$(mktemp -d)"
status=0
python3 tools/golden/gen_groot_lerobot_dir.py --base "$PWD/tests/data/groot_n17_tiny" --out "$work" \
    2>&1 | tee "$OUTDIR/gen_groot_lerobot.log" || status=1
tar -C "$work" -cf "$OUTDIR/groot_n17_lerobot.tar" $(cd "$work" && ls -d groot_n17_lerobot* 2>/dev/null) || status=1
ls -laR "$work" | grep -v "^$" | head -80 || true
exit $status
