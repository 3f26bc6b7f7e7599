#!/usr/bin/env python3
"""lerobot 0.6.1 f32 reference for the full-size CUDA parity check (issue #3, check 5c), and the
lerobot eager bf16 latency that the benchmark compares against (DESIGN.md section 8).

Input: a random full-size checkpoint written by `flashrt synth --size full` (bf16, std 0.02).
lerobot's PI05Policy is built at pi05_base sizes directly on the GPU in float32 and gets exactly
those weights (bf16 -> f32, so both sides compute with identical values). On random inputs
(cameras 0 and 1 present as 224x224 u8 frames, the third missing; 64 valid prompt tokens; noise)
it runs `sample_actions` and writes CKPT/golden.safetensors:

  input.image0, input.image1   u8 [224, 224, 3]
  input.p.tokens               i64 [200]    input.p.token_mask  u8 [200]
  input.noise                  f32 [50, 32]
  output.actions               f32 [50, 32] (normalized x0, what the Rust test compares)

tests/cuda_pi05.rs (full_size_matches_lerobot) reads it. Then the same model in bf16 is timed
(eager `sample_actions`, inputs already on the GPU) and the numbers go to --timing-json.

Runs on the device machine (tools/device/checks/cuda_checks.sh): Python 3.12, torch, and the lerobot
wheels carried in .whl/ (see tools/device/checks/gen_golden.sh).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

TOKENS, VALID_TOKENS, HORIZON, ACTION_DIM = 200, 64, 50, 32
VOCAB = 257152


def log(*a):
    print(*a, flush=True)


def build_policy(ckpt: Path):
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi05.configuration_pi05 import PI05Config
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy

    cfg = json.loads((ckpt / "config.json").read_text())
    cameras = [k for k, v in cfg["input_features"].items() if v["type"] == "VISUAL"]
    state_dim = next(v["shape"][-1] for v in cfg["input_features"].values() if v["type"] == "STATE")
    action_dim = cfg["output_features"]["action"]["shape"][-1]
    features = {k: PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224)) for k in cameras}
    features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(state_dim,))
    config = PI05Config(
        input_features=features,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))},
        device="cuda",
        dtype="float32",
        chunk_size=HORIZON,
        n_action_steps=HORIZON,
        max_action_dim=ACTION_DIM,
        max_state_dim=32,
        num_inference_steps=10,
        tokenizer_max_length=TOKENS,
    )
    with torch.device("cuda"):
        policy = PI05Policy(config)
    policy.eval()
    return policy, cameras


@torch.no_grad()
def load_weights(model: torch.nn.Module, ckpt: Path):
    from safetensors import safe_open

    sd = model.state_dict()
    loaded = set()
    emb = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    with safe_open(str(ckpt / "model.safetensors"), "pt", device="cuda") as f:
        for key in f.keys():
            name = key[len("model."):] if key.startswith("model.") else key
            targets = [name] + ([emb] if name == "paligemma_with_expert.paligemma.lm_head.weight" else [])
            t = f.get_tensor(key)
            for target in targets:
                if target in sd:
                    assert tuple(sd[target].shape) == tuple(t.shape), (target, sd[target].shape, t.shape)
                    sd[target].copy_(t.to(torch.float32))
                    loaded.add(target)
    missing = sorted(k for k in sd if k not in loaded)
    # Unused at inference and not written by `flashrt synth`.
    assert all("gemma_expert.lm_head" in k or k.endswith("language_model.norm.weight") for k in missing), missing
    log(f"loaded {len(loaded)} tensors; left at init (unused): {missing}")


def u8_to_lerobot(img_hwc: np.ndarray) -> torch.Tensor:
    """HWC uint8 -> float32 [1,3,H,W] in [0,1], as lerobot datasets/envs deliver images."""
    return (torch.from_numpy(img_hwc).permute(2, 0, 1).contiguous().float() / 255.0)[None].cuda()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True, type=Path, help="checkpoint dir from `flashrt synth --size full`")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--timing-iters", type=int, default=10)
    ap.add_argument("--timing-json", type=Path, default=None)
    args = ap.parse_args()

    # A true f32 reference: no TF32 anywhere (cuDNN convs default to TF32).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    import lerobot
    import transformers

    log(f"python {sys.version.split()[0]} torch {torch.__version__} lerobot {lerobot.__version__} "
        f"transformers {transformers.__version__} on {torch.cuda.get_device_name()}")
    t0 = time.time()
    policy, cameras = build_policy(args.ckpt)
    load_weights(policy.model, args.ckpt)
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    log(f"lerobot policy ready in {time.time() - t0:.1f} s")

    rng = np.random.default_rng(args.seed)
    images = [rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8) for _ in range(2)]
    tokens = np.zeros(TOKENS, dtype=np.int64)
    tokens[0] = 2
    tokens[1:VALID_TOKENS] = rng.integers(4, VOCAB, size=VALID_TOKENS - 1)
    mask = np.zeros(TOKENS, dtype=np.uint8)
    mask[:VALID_TOKENS] = 1
    noise = torch.randn(HORIZON, ACTION_DIM, generator=torch.Generator().manual_seed(args.seed), dtype=torch.float32)

    batch = {cameras[i]: u8_to_lerobot(images[i]) for i in range(2)}  # the third camera is missing
    imgs, img_masks = policy._preprocess_images(batch)
    assert [bool(m[0]) for m in img_masks] == [True, True] + [False] * (len(cameras) - 2), img_masks
    tok = torch.from_numpy(tokens)[None].cuda()
    tmask = torch.from_numpy(mask).bool()[None].cuda()
    with torch.no_grad():
        actions = policy.model.sample_actions(imgs, img_masks, tok, tmask, noise=noise[None].cuda().clone())
    actions = actions[0].float().cpu()
    log(f"f32 actions: mean {actions.mean():.4f} std {actions.std():.4f} max|a| {actions.abs().max():.4f}")

    from safetensors.torch import save_file

    save_file(
        {
            "input.image0": torch.from_numpy(images[0]),
            "input.image1": torch.from_numpy(images[1]),
            "input.p.tokens": torch.from_numpy(tokens),
            "input.p.token_mask": torch.from_numpy(mask),
            "input.noise": noise,
            "output.actions": actions.contiguous(),
        },
        str(args.ckpt / "golden.safetensors"),
        metadata={"generator": "tools/device/checks/full_parity.py", "lerobot": lerobot.__version__, "torch": torch.__version__},
    )
    log(f"wrote {args.ckpt / 'golden.safetensors'}")

    if args.timing_iters <= 0:
        return
    # lerobot eager bf16 as lerobot runs it with `dtype="bfloat16"`: PaliGemma + expert in bf16
    # (vision tower, projector and norms kept f32 by lerobot), the small heads in f32.
    mode = 'PaliGemmaWithExpertModel.to_bfloat16_for_selected_params("bfloat16")'
    policy.model.paligemma_with_expert.to_bfloat16_for_selected_params("bfloat16")

    def step():
        with torch.no_grad():
            return policy.model.sample_actions(imgs, img_masks, tok, tmask, noise=noise[None].cuda().clone())

    times = []
    for _ in range(args.timing_iters + 2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    times = sorted(times[2:])
    p50 = statistics.median(times)
    log(f"lerobot eager bf16 ({mode}): p50 {p50:.1f} ms over {len(times)} (min {times[0]:.1f}, max {times[-1]:.1f})")
    if args.timing_json:
        args.timing_json.write_text(json.dumps({
            "workload": "pi05-2v",
            "model": "pi05",
            "device": torch.cuda.get_device_name(),
            "backend": "lerobot-0.6.1 eager",
            "precision": "bf16",
            "mode": mode,
            "views": 2,
            "prompt_tokens": VALID_TOKENS,
            "steps": 10,
            "horizon": HORIZON,
            "iterations": len(times),
            "p50_ms": p50,
            "max_ms": times[-1],
            "note": "sample_actions only, inputs already on the GPU",
            "torch": torch.__version__,
        }, indent=1))


if __name__ == "__main__":
    main()
