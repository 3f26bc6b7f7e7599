#!/usr/bin/env bash
# A Python 3.12 venv with lerobot 0.6.1 and torch on the CPU, for the fixture generators of
# tools/golden/ on a machine without a GPU (lerobot 0.6.1 needs Python >= 3.12; pyenv provides it
# on the dev machines). The generators run everything on the CPU in float32, as on the GPU host.
#
#   bash tools/golden/lerobot_env.sh [VENV]          # default target/lerobot-venv
#   CUDA_VISIBLE_DEVICES="" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
#     target/lerobot-venv/bin/python tools/golden/gen_rtc.py --fixture tests/data/pi05_tiny --out ...
#
# ~3 GB (torch's PyPI wheel brings its CUDA libraries, unused here); ~1 minute with a fast mirror.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${1:-target/lerobot-venv}"
# A Python >= 3.12: $PYTHON312, pyenv's own build (its shim may not select it), or python3.12.
python=""
for candidate in ${PYTHON312:-} "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3 python3.12; do
  if "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' 2> /dev/null; then python="$candidate"; break; fi
done
[ -n "$python" ] || { echo "lerobot 0.6.1 needs Python >= 3.12: set PYTHON312" >&2; exit 1; }
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q torch==2.11.0 torchvision==0.26.0 numpy==2.2.6 safetensors==0.8.0 \
  transformers==5.5.4 tokenizers==0.22.2 huggingface_hub==1.33.0 draccus==0.11.6 mergedeep==1.3.4 \
  toml==0.10.2 einops==0.8.2 "opencv-python-headless<4.14" pillow==12.3.0 gymnasium==1.4.0 \
  termcolor==3.3.0 diffusers==0.39.0 dm-tree==0.1.10 timm==1.0.31 peft==0.21.2 accelerate==1.16.0 \
  importlib_metadata "packaging<26" requests tqdm jsonlines
# lerobot's own pins would pull its optional stacks; the policies need only the packages above.
"$venv/bin/pip" install -q --no-deps lerobot==0.6.1
"$venv/bin/python" -c 'import torch, lerobot; print("torch", torch.__version__, "lerobot", lerobot.__version__)'
