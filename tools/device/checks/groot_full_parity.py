#!/usr/bin/env python3
"""GR00T N1.7 at full size: lerobot 0.6.1's GR00TN17 (the published sizes, Cosmos-Reason2-2B's
config as lerobot hard-codes it) with the weights of a `flashrt synth --model groot-n17 --size
full` checkpoint, run in float32 on the GPU (eager / math attention), on two synthetic frames, a
20-word instruction, a raw state and fixed noise, all processed by lerobot's own steps (image
transform, Qwen3-VL processor with the checkpoint's tokenizer, state normalization from the
sidecar files; the backbone config's special-token ids set to the checkpoint tokenizer's). Writes <ckpt>/groot_golden.safetensors (the raw inputs and lerobot's normalized
action chunk) for tests/cuda_pi05.rs `groot_full_size_matches_lerobot`.

With --timing-json it then times lerobot's step as `GrootPolicy.predict_action_chunk` runs it:
f32 parameters under bf16 autocast, SDPA attention (lerobot's default without flash-attn),
`get_action` on inputs already on the GPU (lerobot's CPU-side processing not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "golden"))
import gen_groot_n17 as g  # noqa: E402

PROMPT = "pick up the red cup from the left side of the table and place it carefully inside the blue bowl near the robot"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True, type=pathlib.Path)
    ap.add_argument("--timing-iters", type=int, default=20)
    ap.add_argument("--timing-json", type=pathlib.Path, default=None)
    args = ap.parse_args()
    from lerobot.lerobot_types import TransitionKey
    from lerobot.policies.groot.groot_n1_7 import GR00TN17, GR00TN17Config

    config = json.loads((args.ckpt / "config.json").read_text())
    cfg = GR00TN17Config(use_flash_attention=False, load_bf16=False, **{k: config[k] for k in (
        "model_name", "backbone_embedding_dim", "hidden_size", "input_embedding_dim", "max_state_dim", "max_action_dim",
        "action_horizon", "max_seq_len", "max_num_embodiments", "num_inference_timesteps", "select_layer")})
    started = time.time()
    model = GR00TN17(cfg, load_backbone_weights=False)
    weights = load_file(str(args.ckpt / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    print("not in the checkpoint (left at init):", missing, "unexpected:", unexpected)
    assert set(missing) <= {"backbone.model.lm_head.weight", "backbone.model.model.language_model.norm.weight"}, missing
    assert not unexpected, unexpected
    model = model.float().cuda().eval()
    model.backbone.model.set_attn_implementation("eager")
    print(f"lerobot GR00TN17 full size ready in {time.time() - started:.1f} s")

    state_dim = sum(w for _, w in [("eef_pose", 9), ("joints", 6)])
    # The synthesized checkpoint's tokenizer (a tiny byte-level BPE) holds the Qwen-VL special
    # tokens at its own ids, not Cosmos-Reason2's: the backbone finds image tokens by this config.
    proc = g.processor(args.ckpt)
    qwen = model.backbone.model.config
    for field, token in [("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"), ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]:
        setattr(qwen, field, proc.tokenizer.convert_tokens_to_ids(token))
    pack, _ = g.pack_and_decode_steps(args.ckpt, tag="robot", state_dim=cfg.max_state_dim, action_dim=cfg.max_action_dim, env_action_dim=16)
    rng = np.random.default_rng(3)
    state = np.concatenate([rng.uniform(-0.5, 0.5, 3), g.rot6d(3), rng.uniform(-1, 1, state_dim - 9)]).astype(np.float32)
    packed = pack({TransitionKey.OBSERVATION: {"observation.state": torch.from_numpy(state)[None]}, TransitionKey.COMPLEMENTARY_DATA: {"task": PROMPT}})
    comp, obs = packed[TransitionKey.COMPLEMENTARY_DATA], packed[TransitionKey.OBSERVATION]
    raw = [g.frame(320, 240, 70), g.frame(224, 224, 71)]
    frames = [g.transform(f) for f in raw]
    enc, _ = g.encode(proc, frames, comp["language"][0])
    inp = {k: enc[k].cuda() for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids")}
    inp.update(state=obs["state"].float().cuda(), embodiment_id=comp["embodiment_id"].cuda())
    noise = torch.randn(1, cfg.action_horizon, cfg.max_action_dim, generator=torch.Generator().manual_seed(5))
    real_randn = torch.randn
    torch.randn = lambda *a, **k: noise.clone().to(k.get("device", "cpu"), dtype=k.get("dtype", torch.float32))
    try:
        with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
            result = model.get_action(dict(inp))
    finally:
        torch.randn = real_randn
    chunk = result["action_pred"].float().cpu()
    print(f"{inp['input_ids'].shape[1]} tokens; normalized chunk {tuple(chunk.shape)} mean {chunk.mean():.4f} std {chunk.std():.4f}")
    tensors = {f"frame_{i}": torch.from_numpy(f) for i, f in enumerate(raw)}
    tensors.update(state=torch.from_numpy(state), noise=noise.contiguous(), action_pred=chunk.contiguous())
    save_file(tensors, str(args.ckpt / "groot_golden.safetensors"), metadata={"prompt": PROMPT, "embodiment": "robot"})
    if args.timing_json:
        time_lerobot(model, inp, args.timing_iters, args.timing_json)
    return 0


def time_lerobot(model, inp: dict, iters: int, out: pathlib.Path) -> None:
    """lerobot's GR00T step as lerobot runs it: f32 parameters, bf16 autocast, SDPA attention."""
    import statistics

    model.backbone.model.set_attn_implementation("sdpa")

    def step():
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            return model.get_action(dict(inp))

    times = []
    for _ in range(iters + 3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    times = sorted(times[3:])
    p50 = statistics.median(times)
    print(f"lerobot GR00T N1.7 bf16 autocast: p50 {p50:.1f} ms over {len(times)} (min {times[0]:.1f}, max {times[-1]:.1f})")
    import lerobot

    out.write_text(json.dumps({
        "workload": "gr00t-2v",
        "model": "groot-n17",
        "device": torch.cuda.get_device_name(),
        "backend": f"lerobot-{lerobot.__version__} GR00TN17.get_action",
        "precision": "bf16 autocast, f32 parameters",
        "attention": "sdpa",
        "views": 2,
        "prompt_tokens": int(inp["input_ids"].shape[1]),
        "steps": 4,
        "iterations": len(times),
        "p50_ms": p50,
        "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))],
        "min_ms": times[0],
        "max_ms": times[-1],
        "note": "get_action only, inputs already on the GPU (lerobot's processor steps not counted)",
        "torch": torch.__version__,
    }, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
