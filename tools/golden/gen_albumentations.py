#!/usr/bin/env python3
"""Golden outputs of GR00T N1.7's albumentations image path (cv2 INTER_AREA) for shapes the
lerobot-made processing fixture lacks: integer shrink factors 2 and 3 (OpenCV's block-mean
kernels), a fractional shrink, a grow, a letterboxed frame, and the crop fraction 0.95 that
N1.7 checkpoints trained with albumentations carry.

Runs lerobot 0.6.1's own `_transform_n1_7_image_for_vlm_albumentations`, taken from the wheel's
source (it needs only numpy and cv2; importing its module would pull in torch), with the OpenCV
that lerobot 0.6.1 allows (opencv-python-headless < 4.14):

  python3 -m venv /tmp/v && /tmp/v/bin/pip install "opencv-python-headless<4.14,>=4.9" \\
      "numpy<2.3,>=2" safetensors && /tmp/v/bin/pip download --no-deps lerobot==0.6.1 -d /tmp/w
  /tmp/v/bin/python tools/golden/gen_albumentations.py --wheel /tmp/w/lerobot-0.6.1-py3-none-any.whl \\
      --out tests/data/groot_n17_processing/albumentations.safetensors

Frames are not stored: frame value i (HWC order) is ((i * 2654435761) mod 2^32) >> 24, which
the test computes again. Writes `out_{k}` (HWC u8) per case and the cases as metadata.
"""

import argparse
import ast
import json
import zipfile

import cv2
import numpy as np
from safetensors.numpy import save_file

CASES = [  # (width, height, target, crop_fraction, letterbox)
    (128, 128, 64, 0.95, False),
    (192, 192, 64, 0.95, False),
    (100, 100, 64, 0.95, False),
    (50, 50, 64, 0.95, False),
    (80, 60, 64, 0.95, True),
    (61, 90, 96, None, True),
    (300, 300, 256, 0.95, False),
]


def lerobot_transform(wheel):
    source = zipfile.ZipFile(wheel).read("lerobot/policies/groot/processor_groot.py").decode()
    name = "_transform_n1_7_image_for_vlm_albumentations"
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope = {"np": np, "cv2": cv2}
    exec(compile(ast.Module([node], []), "processor_groot.py", "exec"), scope)
    return scope[name]


def frame(width, height):
    i = np.arange(height * width * 3, dtype=np.uint64)
    return (((i * 2654435761) % (1 << 32)) >> 24).astype(np.uint8).reshape(height, width, 3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--wheel", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    transform = lerobot_transform(a.wheel)
    tensors, cases = {}, []
    for k, (w, h, target, crop, letterbox) in enumerate(CASES):
        # crop_fraction None: the crop comes from image_crop_size (230/256 of the target).
        out = transform(frame(w, h), image_crop_size=[target * 230 // 256] * 2, image_target_size=[target, target],
                        shortest_image_edge=None, crop_fraction=crop, letter_box_transform=letterbox)
        assert out.shape == (target, target, 3), out.shape
        tensors[f"out_{k}"] = np.ascontiguousarray(out)
        cases.append({"width": w, "height": h, "target": target, "crop_fraction": crop if crop is not None else (target * 230 // 256) / target,
                      "letterbox": letterbox})
    save_file(tensors, a.out, metadata={"cases": json.dumps(cases), "opencv": cv2.__version__, "lerobot": "0.6.1"})


if __name__ == "__main__":
    main()
