#!/usr/bin/env python3
"""Golden fixtures for lerobot's own GR00T N1.7 fine-tune directories, written by lerobot==0.6.1.

Runs where lerobot 0.6.1 runs (Python 3.12, torch): the device machine, through
tools/device/checks/gen_golden_groot_lerobot.sh. Float32 on the CPU (use_bf16=False: no autocast),
eval mode, eager / math attention, the noise passed in.

The base is the committed raw fixture (tests/data/groot_n17_tiny, made by gen_groot_n17.py). As
`lerobot-train` would, this builds `GrootPolicy(GrootConfig(base_model_path=...))` — lerobot loads
the base through `GR00TN17.from_pretrained`, which falls back to a local path for it — and its
processors with `make_groot_pre_post_processors`, then writes what `save_pretrained` writes for
the policy and both pipelines. Two fine-tunes of the same base:

  groot_n17_lerobot/                   embodiment `tiny_robot`, which the base's sidecar files
                                       describe: the pack step carries their statistics, modality
                                       config and embodiment table; groot_n1_7_action_decode_v1
                                       decodes (relative eef and joint groups, absolute gripper)
  groot_n17_lerobot_new_embodiment/    embodiment `new_embodiment`, which the base has no
                                       statistics for: dataset statistics (float64, as a
                                       LeRobotDataset's meta.stats are) normalize the state and
                                       groot_action_unpack_unnormalize_v2 decodes; cameras in
                                       alphabetical order. Its model.safetensors is byte-identical
                                       to the other one's (same base, no training), so it is
                                       left out and the check below proves it.

`base_model_path` is written as `../groot_n17_tiny`: relative, so the fixtures work wherever the
repository is. lerobot resolves it against its working directory, so this runs from the base's
directory (where `../groot_n17_tiny` is the base itself and the base's `model_name` "backbone"
names its tiny Qwen3-VL config).

Each directory also gets golden_lerobot.safetensors: per case c (the two cases of the base's
golden.safetensors, whose raw state and noise are the inputs, and whose two frames, cut to their
top-left 200x240 because lerobot stacks the cameras, are the `front` and `wrist` images) `case{c}.state` (the
preprocessor's normalized state), `case{c}.input_ids`, `case{c}.action_pred` (what
`predict_action_chunk` returns) and `case{c}.actions` (the postprocessor's output), all from the
pipeline as lerobot reloads it from the written directory (`GrootPolicy.from_pretrained` and
`make_groot_pre_post_processors_from_pretrained`); golden_lerobot.json records that the
freshly built pipeline gives the same numbers, the saved key names and the versions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import sys
import traceback

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gen_groot_n17 import ACTION_DIM, ACTION_GROUPS, HORIZON, STATE_DIM, STATE_GROUPS, TAG, processor  # noqa: E402

BASE_NAME = "groot_n17_tiny"
STATE_WIDTH = sum(w for _, w in STATE_GROUPS)
ACTION_WIDTH = sum(w for _, w, _ in ACTION_GROUPS)
CAMERAS = ["front", "wrist"]
# lerobot's pack step stacks the cameras, so they must share a size: each case's two base frames
# (320x240 and 200x300) cut to their top-left 200x240 (width x height).
FRAME_W, FRAME_H = 200, 240
VARIANTS = {
    "groot_n17_lerobot": {"tag": TAG, "camera_order": CAMERAS},
    # Declared wrist first: with no modality config lerobot sorts the cameras by name.
    "groot_n17_lerobot_new_embodiment": {"tag": "new_embodiment", "camera_order": ["wrist", "front"]},
}


def dataset_stats() -> dict:
    """Per-feature statistics as LeRobotDataset.meta.stats holds them (float64 numpy arrays)."""
    g = np.random.default_rng(77)

    def entry(width: int) -> dict:
        lo = g.uniform(-3, -0.5, size=width)
        hi = lo + g.uniform(1, 5, size=width)
        hi[2] = lo[2]  # a constant dimension: normalized to 0, decoded to min
        return {"min": lo, "max": hi, "mean": (lo + hi) / 2, "std": (hi - lo) / 4, "q01": lo + 0.05 * (hi - lo), "q99": hi - 0.05 * (hi - lo)}

    return {"observation.state": entry(STATE_WIDTH), "action": entry(ACTION_WIDTH)}


def groot_config(tag: str, camera_order: list[str]):
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.groot.configuration_groot import GrootConfig

    inputs = {f"observation.images.{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, FRAME_H, FRAME_W)) for c in camera_order}
    inputs["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_WIDTH,))
    return GrootConfig(
        base_model_path=f"../{BASE_NAME}",
        embodiment_tag=tag,
        max_state_dim=STATE_DIM,
        max_action_dim=ACTION_DIM,
        chunk_size=HORIZON,
        n_action_steps=HORIZON,
        use_bf16=False,
        device="cpu",
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_WIDTH,))},
    )


def prepare(policy, preprocessor, base: pathlib.Path) -> None:
    """Eager attention, and the encode step's processor built from the base's tiny tokenizer (the
    step otherwise loads nvidia/Cosmos-Reason2-2B from the hub)."""
    from lerobot.policies.groot.processor_groot import GrootN17VLMEncodeStep

    policy.eval()
    policy._groot_model.backbone.model.set_attn_implementation("eager")
    steps = [s for s in preprocessor.steps if isinstance(s, GrootN17VLMEncodeStep)]
    assert len(steps) == 1, preprocessor.steps
    steps[0]._proc = processor(base)


def run_case(policy, preprocessor, postprocessor, inputs: dict, prompt: str) -> dict:
    batch = {
        f"observation.images.{c}": torch.from_numpy(inputs[f"frame_{i}"][:FRAME_H, :FRAME_W]).permute(2, 0, 1)[None].contiguous()
        for i, c in enumerate(CAMERAS)
    }
    batch["observation.state"] = torch.from_numpy(inputs["raw_state"])[None]
    batch["task"] = prompt
    processed = preprocessor(batch)
    noise = torch.from_numpy(inputs["noise"]).reshape(1, HORIZON, ACTION_DIM)
    real_randn = torch.randn
    torch.randn = lambda *a, **k: noise.clone()  # get_action's only randn: the initial noise
    try:
        with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
            action_pred = policy.predict_action_chunk(processed)
    finally:
        torch.randn = real_randn
    actions = postprocessor(action_pred.clone())
    return {
        "state": processed["state"].float().contiguous(),
        "input_ids": processed["input_ids"].contiguous(),
        "action_pred": action_pred.float().contiguous(),
        "actions": torch.as_tensor(actions).float().contiguous(),
    }


def safetensors_listing(path: pathlib.Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return {k: {"dtype": str(f.get_slice(k).get_dtype()), "shape": list(f.get_slice(k).get_shape())} for k in f.keys()}


def variant(out: pathlib.Path, base: pathlib.Path, name: str, tag: str, camera_order: list[str], cases: list[dict]) -> dict:
    from lerobot.policies.groot.modeling_groot import GrootPolicy
    from lerobot.policies.groot.processor_groot import make_groot_pre_post_processors, make_groot_pre_post_processors_from_pretrained

    target = out / name
    target.mkdir(parents=True, exist_ok=True)
    config = groot_config(tag, camera_order)
    torch.manual_seed(0)
    policy = GrootPolicy(config)
    pre, post = make_groot_pre_post_processors(config, dataset_stats=dataset_stats())
    prepare(policy, pre, base)
    buffers = {n: str(b.dtype) for n, b in policy.named_buffers() if b.is_floating_point() and b.dtype != torch.float32}
    fresh = [run_case(policy, pre, post, c, c["prompt"]) for c in cases]
    policy.save_pretrained(target)
    pre.save_pretrained(target)
    post.save_pretrained(target)

    # What lerobot does with the written directory: its own loaders, then the same cases.
    reloaded = GrootPolicy.from_pretrained(str(target))
    pre2, post2 = make_groot_pre_post_processors_from_pretrained(reloaded.config, str(target))
    prepare(reloaded, pre2, base)
    again = [run_case(reloaded, pre2, post2, c, c["prompt"]) for c in cases]
    reload_diff = max(float((a[k].float() - b[k].float()).abs().max()) for a, b in zip(fresh, again) for k in a)

    tensors = {f"case{i}.{k}": v for i, r in enumerate(again) for k, v in r.items()}
    save_file(tensors, str(target / "golden_lerobot.safetensors"))
    weights = safetensors_listing(target / "model.safetensors")
    meta = {
        "base_model_path": config.base_model_path,
        "embodiment_tag": tag,
        "camera_order_declared": camera_order,
        "cases": [{"prompt": c["prompt"], "from": f"../{BASE_NAME}/golden.safetensors case{i}"} for i, c in enumerate(cases)],
        "reload_max_abs_diff": reload_diff,
        "non_f32_float_buffers": buffers,
        "weights": {"count": len(weights), "dtypes": sorted({v["dtype"] for v in weights.values()}),
                    "lm_head_or_embedding": {k: v for k, v in weights.items() if "lm_head" in k or "embed_tokens" in k}},
        "keys": {k: list(v.shape) for k, v in sorted(tensors.items())},
        "versions": versions(),
    }
    for i, r in enumerate(again):
        print(f"{name} case {i}: actions {tuple(r['actions'].shape)} max|a| {r['actions'].abs().max():.3f}; reload diff {reload_diff:.3e}")
    (target / "golden_lerobot.json").write_text(json.dumps(meta, indent=1))
    return meta


def versions() -> dict:
    import lerobot
    import transformers

    return {"lerobot": lerobot.__version__, "transformers": transformers.__version__, "torch": torch.__version__, "python": sys.version.split()[0]}


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, type=pathlib.Path, help="the raw tiny fixture (tests/data/groot_n17_tiny)")
    ap.add_argument("--out", required=True, type=pathlib.Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / BASE_NAME
    shutil.copytree(args.base, base, dirs_exist_ok=True)
    golden = load_file(str(base / "golden.safetensors"))
    meta = json.loads((base / "golden.json").read_text())
    cases = []
    for i, case in enumerate(meta["cases"]):
        c = {k: golden[f"case{i}.{k}"].numpy() for k in ("frame_0", "frame_1", "raw_state", "noise")}
        c["prompt"] = case["prompt"]
        cases.append(c)
    os.chdir(base)  # lerobot resolves base_model_path and the base's model_name against it
    torch.set_num_threads(1)
    failed = 0
    for name, v in VARIANTS.items():
        try:
            variant(args.out, base, name, v["tag"], v["camera_order"], cases)
        except Exception:
            failed += 1
            print(f"!! {name} failed")
            traceback.print_exc()
    a, b = (args.out / n / "model.safetensors" for n in VARIANTS)
    if a.exists() and b.exists():
        same = sha256(a) == sha256(b)
        print("new_embodiment weights identical to the tiny_robot fine-tune's:", same)
        if same:
            b.unlink()
        else:
            failed += 1
    print("base weights identical to the fine-tune's:", sha256(a) == sha256(base / "model.safetensors") if a.exists() else None)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
