#!/usr/bin/env python3
"""lerobot 0.6.1's real-time chunking (RTC) on the committed tiny Pi0.5 fixture (tests/data/pi05_tiny/).

RTC (lerobot.policies.rtc.modeling_rtc.RTCProcessor.denoise_step) guides every Euler step of the
next chunk towards what is left of the previous one: v' = v - w_guide(t) * W_r * (prev - (x - t v)),
with prefix weights W_r from a schedule (ZEROS, ONES, LINEAR, EXP), the inference delay and the
execution horizon. The previous chunk is what PI05Policy.predict_action_chunk returned (the model's
normalized x_0 cut to the robot's action width), from the first action not yet executed on.

This script runs, on the CPU in float32, with lerobot's own PI05Policy loaded from the fixture:
  - chunk A: prompt a, the fixture's noise, no RTC (checked against golden.safetensors);
  - chunk B: prompt b, a second noise, no RTC (what RTC must change);
  - chunk B under RTC for each case below: prev_chunk_left_over = A[executed:, :action_dim].
and writes golden_rtc.safetensors: `input.rtc.noise` [50, 32], `output.rtc.plain` and
`output.rtc.{i}` [50, 32] (normalized x_0), and the cases as JSON metadata (`cases`).

Run with lerobot 0.6.1 (Python 3.12 + torch, CPU): here with the venv of tools/golden/lerobot_env.sh
(how golden_rtc.safetensors was made), or on the device machine: tools/device/checks/gen_rtc.sh.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_pi05  # noqa: E402  (the fixture's tiny-model patches and input conventions)

CASES = [
    # schedule, inference delay, executed actions of chunk A, execution horizon, max guidance weight
    {"schedule": "LINEAR", "inference_delay": 3, "executed": 10, "execution_horizon": 20, "max_guidance_weight": 10.0},
    {"schedule": "EXP", "inference_delay": 5, "executed": 25, "execution_horizon": 30, "max_guidance_weight": 10.0},
    {"schedule": "ZEROS", "inference_delay": 4, "executed": 5, "execution_horizon": 10, "max_guidance_weight": 5.0},
    {"schedule": "ONES", "inference_delay": 2, "executed": 40, "execution_horizon": 15, "max_guidance_weight": 10.0},
    {"schedule": "LINEAR", "inference_delay": 0, "executed": 0, "execution_horizon": 50, "max_guidance_weight": 1.5},
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True, warn_only=True)

    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from safetensors.numpy import load_file, save_file

    gen_pi05.patch_lerobot_tiny()
    gen_pi05.patch_tokenizer()
    policy = PI05Policy.from_pretrained(str(args.fixture), local_files_only=True)
    policy.eval()
    action_dim = policy.config.output_features["action"].shape[0]
    golden = load_file(str(args.fixture / "golden.safetensors"))
    inputs = {k: v for k, v in golden.items() if k.startswith("input.")}
    images, img_masks = policy._preprocess_images(gen_pi05.lerobot_batch(inputs))

    def sample(p, noise, **rtc):
        tokens = torch.from_numpy(inputs[f"input.{p}.tokens"])[None]
        masks = torch.from_numpy(inputs[f"input.{p}.token_mask"]).bool()[None]
        with torch.no_grad():
            return policy.model.sample_actions(images, img_masks, tokens, masks, noise=noise.clone()[None], **rtc)[0]

    chunk_a = sample("a", torch.from_numpy(inputs["input.noise"]))
    drift = float((chunk_a - torch.from_numpy(golden["output.a.actions"])).abs().max())
    print(f"chunk A vs golden.safetensors output.a.actions: max |diff| = {drift:.3g}")
    assert drift < 1e-5, drift

    noise_b = torch.randn(50, 32, generator=torch.Generator().manual_seed(4321), dtype=torch.float32)
    plain = sample("b", noise_b)
    out = {"input.rtc.noise": noise_b.numpy(), "output.rtc.plain": plain.numpy()}
    for i, case in enumerate(CASES):
        policy.config.rtc_config = RTCConfig(
            prefix_attention_schedule=RTCAttentionSchedule(case["schedule"]),
            max_guidance_weight=case["max_guidance_weight"],
            execution_horizon=case["execution_horizon"],
        )
        policy.init_rtc_processor()
        prev = chunk_a[case["executed"]:, :action_dim][None]  # as ActionQueue.get_left_over hands it
        guided = sample("b", noise_b, inference_delay=case["inference_delay"], prev_chunk_left_over=prev,
                        execution_horizon=case["execution_horizon"])
        out[f"output.rtc.{i}"] = guided.numpy()
        changed = float((guided - plain).abs().max())
        to_prev = float((guided[: case["inference_delay"], :action_dim] - chunk_a[case["executed"]:][: case["inference_delay"], :action_dim]).abs().max()) if case["inference_delay"] else float("nan")
        print(f"case {i} {case}: max |guided - plain| = {changed:.4g}; frozen rows vs prev: {to_prev:.4g}")
    policy.config.rtc_config = None
    policy.init_rtc_processor()
    again = sample("b", noise_b)
    assert torch.equal(again, plain), "RTC state leaked into a plain run"
    out = {k: np.ascontiguousarray(v.astype(np.float32)) for k, v in out.items()}
    save_file(out, str(args.out), metadata={"generator": "tools/golden/gen_rtc.py", "reference": "lerobot-0.6.1 RTCProcessor, f32 CPU",
                                            "action_dim": json.dumps(action_dim), "cases": json.dumps(CASES)})
    print("wrote", args.out)


if __name__ == "__main__":
    main()
