#!/usr/bin/env python3
"""Sanity-check tests/data/pi05_tiny (needs only numpy + safetensors; no torch).

    python3 tools/golden/check_fixture.py [tests/data/pi05_tiny]

Checks shapes, dtypes, finiteness, that the outputs are not degenerate, that prompts a and b give
different actions, that the checkpoint has the tiny shapes, and that the processor goldens agree
with the quantile formula / discretization written in specs/pi05.md.
"""

import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

d = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/pi05_tiny")
g = load_file(str(d / "golden.safetensors"))

EXPECT = {
    "input.image.base_0_rgb": (np.uint8, (224, 224, 3)),
    "input.image.left_wrist_0_rgb": (np.uint8, (180, 240, 3)),
    "input.noise": (np.float32, (50, 32)),
    "output.vision.base_0_rgb": (np.float32, (256, 144)),
    "output.vision.left_wrist_0_rgb": (np.float32, (256, 144)),
    "output.image_tokens.base_0_rgb": (np.float32, (256, 64)),
    "output.image_tokens.left_wrist_0_rgb": (np.float32, (256, 64)),
    "output.preprocessed.left_wrist_0_rgb": (np.float32, (3, 224, 224)),
}
for p in "ab":
    EXPECT[f"input.{p}.tokens"] = (np.int64, (200,))
    EXPECT[f"input.{p}.token_mask"] = (np.uint8, (200,))
    for li in (0, 1):
        EXPECT[f"output.{p}.prefix_k.layer{li}"] = (np.float32, (968, 16))
        EXPECT[f"output.{p}.prefix_v.layer{li}"] = (np.float32, (968, 16))
    EXPECT[f"output.{p}.velocity.step0"] = (np.float32, (50, 32))
    EXPECT[f"output.{p}.actions"] = (np.float32, (50, 32))

errors = []
if set(g) != set(EXPECT):
    errors.append(f"key mismatch: extra {sorted(set(g) - set(EXPECT))} missing {sorted(set(EXPECT) - set(g))}")
for k, (dt, shape) in EXPECT.items():
    if k not in g:
        continue
    v = g[k]
    if v.dtype != dt or v.shape != shape:
        errors.append(f"{k}: {v.dtype} {v.shape}, want {np.dtype(dt)} {shape}")
    if v.dtype.kind == "f" and not np.isfinite(v).all():
        errors.append(f"{k}: non-finite")
    if v.dtype.kind == "f" and np.ptp(v) == 0:
        errors.append(f"{k}: constant")

for p, n in (("a", 17), ("b", 61)):
    t, m = g[f"input.{p}.tokens"], g[f"input.{p}.token_mask"]
    ok = (m.sum() == n and m[:n].all() and t[0] == 2 and (t[1:n] >= 4).all() and (t[:n] < 1024).all()
          and (t[n:] == 0).all())
    if not ok:
        errors.append(f"prompt {p}: bad tokens/mask")
da = np.abs(g["output.a.actions"] - g["output.b.actions"]).max()
if da < 1e-3:
    errors.append(f"actions a and b almost equal ({da})")
# K/V of the 256 slots of the missing camera (last) and of prompt padding are computed but masked;
# image slots of the two present cameras must agree between prompts (same images, same positions).
for li in (0, 1):
    dk = np.abs(g[f"output.a.prefix_k.layer{li}"][:512] - g[f"output.b.prefix_k.layer{li}"][:512]).max()
    if li == 0 and dk > 1e-5:
        errors.append(f"layer0 image K differs between prompts ({dk})")
pre = g["output.preprocessed.left_wrist_0_rgb"]
if not (pre.min() >= -1 and pre.max() <= 1 and np.all(pre[:, :28] == -1) and np.all(pre[:, -28:] == -1)):
    errors.append("preprocessed left wrist: expected [-1,1] with 28 black (-1) rows top and bottom")

# checkpoint
ck = load_file(str(d / "model.safetensors"))
pref = "model." if all(k.startswith("model.") for k in ck) else ""
P = pref + "paligemma_with_expert.paligemma.model."
shapes = {
    P + "vision_tower.vision_model.embeddings.patch_embedding.weight": (144, 3, 14, 14),
    P + "multi_modal_projector.linear.weight": (64, 144),
    pref + "paligemma_with_expert.paligemma.lm_head.weight": (1024, 64),
    P + "language_model.layers.1.mlp.down_proj.weight": (64, 128),
    pref + "paligemma_with_expert.gemma_expert.model.norm.dense.weight": (96, 32),
    pref + "action_out_proj.weight": (32, 32),
}
for k, s in shapes.items():
    if k not in ck or ck[k].shape != s:
        errors.append(f"checkpoint {k}: {ck[k].shape if k in ck else 'missing'} want {s}")
for k, v in ck.items():
    if v.dtype != np.float32 or np.all(v == 0) or np.all(v == 1):
        errors.append(f"checkpoint {k}: dtype {v.dtype} or all 0/1")

# processor goldens vs the spec formulas
pj = json.load(open(d / "golden_processor.json"))
sq01 = np.array(pj["stats"]["observation.state"]["q01"], np.float32)
sq99 = np.array(pj["stats"]["observation.state"]["q99"], np.float32)
for st in pj["states"]:
    raw = np.array(st["raw"], np.float32)
    n = 2 * (raw - sq01) / (sq99 - sq01) - 1
    if np.abs(n - np.array(st["normalized"], np.float32)).max() > 1e-6:
        errors.append(f"state normalization mismatch for {st['raw']}")
    bins = np.digitize(np.array(st["normalized"], np.float32), np.linspace(-1, 1, 257)[:-1]) - 1
    cleaned = st["task"].strip().replace("_", " ").replace("\n", " ")
    want = f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "
    if want != st["prompt"] or list(bins) != st["bins"]:
        errors.append(f"prompt mismatch: {st['prompt']!r} vs {want!r}")
aq01 = np.array(pj["stats"]["action"]["q01"], np.float32)
aq99 = np.array(pj["stats"]["action"]["q99"], np.float32)
for ac in pj["actions"]:
    a = np.array(ac["normalized"], np.float32)
    u = (a + 1) * (aq99 - aq01) / 2 + aq01
    if np.abs(u - np.array(ac["unnormalized"], np.float32)).max() > 1e-5:
        errors.append("action unnormalization mismatch")

print(f"golden: {len(g)} tensors; checkpoint: {len(ck)} tensors (prefix {pref!r}); "
      f"|a-b| actions max {da:.3f}; action std a {g['output.a.actions'].std():.3f}")
for k in ("reference_max_abs_diff", "checkpoint_reload_max_abs_diff", "reload_max_abs_diff"):
    print(f"{k}: {pj.get(k)}")
total = sum(f.stat().st_size for f in d.iterdir())
print(f"fixture size: {total} bytes")
if total > 5 * 1024 * 1024:
    errors.append("fixture larger than 5 MiB")
if errors:
    print("FAILED:\n  " + "\n  ".join(errors))
    sys.exit(1)
print("fixture OK")
