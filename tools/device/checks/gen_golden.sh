#!/usr/bin/env bash
# Device-side wrapper: generate the Pi0.5 tiny golden fixtures (tests/data/pi05_tiny/) with
# lerobot==0.6.1 on the device machine (Python 3.12 + torch there; this project's dev machine has
# Python 3.11, too old for lerobot 0.6.1).  Everything runs on the CPU in float32.
#
# Local steps (in the repo root, once):
#   echo /.whl/ >> .git/info/exclude          # .whl/ is also in .gitignore
#   mkdir -p .whl
#   P="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
#   for w in lerobot==0.6.1 transformers==5.5.4 tokenizers==0.22.2 draccus==0.11.6 mergedeep==1.3.4 \
#            toml==0.10.2 gymnasium==1.4.0 farama_notifications==0.0.6 termcolor==3.3.0; do
#     python3 -m pip download --no-deps --only-binary=:all: $P -d .whl "$w"
#   done
#   # optional independent cross-check against the executable spec:
#   cp ../shared/specs/pi05_reference.py .whl/      # (or /work/shared/specs/pi05_reference.py)
#
# Then the device call (tool `run`, kind nvidia-h200, carry [".whl"]):
#   bash tools/device/checks/gen_golden.sh
# and copy back:
#   mkdir -p tests/data/pi05_tiny && tar -xf <files_at>/pi05_tiny.tar -C tests/data/pi05_tiny
#   python3 tools/golden/check_fixture.py tests/data/pi05_tiny
#
# $OUT returns at most 8 files (16 MiB each), so the fixture directory comes back as one tar
# (pi05_tiny.tar, ~4 MB) plus the log (gen.log).
set -euo pipefail
cd "$(dirname "$0")/../../.."

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
export CUDA_VISIBLE_DEVICES=""            # CPU float32 only
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

OUTDIR="${OUT:-/tmp/gen_golden_out}"
mkdir -p "$OUTDIR"
work="$(mktemp -d)"
ref=()
if [ -f .whl/pi05_reference.py ]; then ref=(--reference .whl/pi05_reference.py); fi

python3 tools/golden/gen_pi05.py --out "$work/pi05_tiny" "${ref[@]}" 2>&1 | tee "$OUTDIR/gen.log"
tar -C "$work/pi05_tiny" -cf "$OUTDIR/pi05_tiny.tar" .
ls -la "$work/pi05_tiny" "$OUTDIR"
