#!/usr/bin/env python3
"""lerobot 0.6.1's real-time chunking (RTC) for GR00T N1.7 on the committed tiny fixture
(tests/data/groot_n17_tiny/).

GR00T's RTC is not lerobot's guidance (RTCProcessor) but its own scheme:
GrootPolicy._prepare_n1_7_rtc_inputs turns the previous chunk's leftover and the inference delay
into options (overlap = min(leftover rows, execution horizon), frozen = min(delay, overlap)), and
GR00TN17ActionHead.get_action_with_features starts the sampler's first `overlap` rows from the
*last* `overlap` rows of the leftover (its robot columns, zero-padded to the model's width) and
scales each Euler step's velocity per row: 0 on the frozen rows, a ramp 1 - exp(-rate t)
(normalised) on the rest of the overlap, 1 after.

This script runs, on the CPU in float32, lerobot's own GrootPolicy (built on the fixture as
gen_groot_lerobot_dir.py builds it, use_bf16=False, with the fixture's f32 weights: lerobot loads
the base in bfloat16) through predict_action_chunk with the model
inputs of golden.safetensors (pixel values recomputed from its transformed images):
  - chunk A: case 0's inputs and noise, no RTC (checked against golden.safetensors case0);
  - chunk B: case 1's inputs and noise, no RTC (checked against case1: what RTC must change);
  - chunk B under RTC for each case below, RTCConfig(execution_horizon) on the policy config and
    prev_chunk_left_over = A[executed:] (predict_action_chunk's output: the normalized chunk cut to
    the robot's 13 action columns, as lerobot's ActionQueue.get_left_over hands it).
It writes golden_rtc.safetensors: `output.rtc.{i}` [6, 16], the model's whole normalized chunk
(GR00TN17.get_action's action_pred, read where predict_action_chunk calls it), and as JSON
metadata the cases with the options lerobot derived (`cases`).

Run with lerobot 0.6.1 (Python 3.12 + torch, CPU), e.g. the venv of tools/golden/lerobot_env.sh:
  CUDA_VISIBLE_DEVICES="" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \\
    python tools/golden/gen_groot_rtc.py --fixture tests/data/groot_n17_tiny \\
    --out tests/data/groot_n17_tiny/golden_rtc.safetensors
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gen_groot_n17 import TAG, encode, processor  # noqa: E402
from gen_groot_lerobot_dir import CAMERAS, groot_config  # noqa: E402

CASES = [
    # executed rows of chunk A, inference delay, execution horizon (chunk A has 6 rows)
    {"executed": 1, "inference_delay": 2, "execution_horizon": 4},  # overlap 4 of 5 left, 2 frozen, 2 ramped
    {"executed": 2, "inference_delay": 1, "execution_horizon": 10},  # the horizon past what is left: overlap 4
    {"executed": 0, "inference_delay": 0, "execution_horizon": 3},  # the last 3 of 6 left, nothing frozen
    {"executed": 3, "inference_delay": 5, "execution_horizon": 2},  # a delay past the overlap: all of it frozen
    {"executed": 6, "inference_delay": 1, "execution_horizon": 4},  # nothing left: plain sampling
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", type=pathlib.Path, required=True)
    ap.add_argument("--out", type=pathlib.Path, required=True)
    args = ap.parse_args()
    fixture, out_path = args.fixture.resolve(), args.out.resolve()
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)

    from lerobot.policies.groot.modeling_groot import GrootPolicy
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from safetensors.numpy import save_file
    from safetensors.torch import load_file

    assert fixture.name == "groot_n17_tiny", "groot_config names the base ../groot_n17_tiny"
    os.chdir(fixture)  # lerobot resolves base_model_path and the base's model_name against it
    golden = load_file(str(fixture / "golden.safetensors"))
    meta = json.loads((fixture / "golden.json").read_text())
    proc = processor(fixture)

    torch.manual_seed(0)
    policy = GrootPolicy(groot_config(TAG, CAMERAS))
    policy.eval()
    policy._groot_model.backbone.model.set_attn_implementation("eager")
    model = policy._groot_model
    # GR00TN17.from_pretrained loads the base in its config's dtype (bfloat16) before the policy
    # casts it to f32: put the fixture's own f32 weights back.
    model.load_state_dict(load_file(str(fixture / "model.safetensors")), strict=True)

    def model_inputs(c: int) -> dict:
        p = f"case{c}."
        frames = [golden[p + f"image_{i}"] for i in range(2)]
        enc, _ = encode(proc, frames, meta["cases"][c]["language"])
        assert torch.equal(enc["input_ids"], golden[p + "input_ids"]), "the prompt's tokens differ from golden.safetensors"
        inputs = {k: golden[p + k] for k in ("input_ids", "attention_mask", "image_grid_thw", "mm_token_type_ids", "state", "embodiment_id")}
        inputs["pixel_values"] = enc["pixel_values"]
        return inputs

    def predict(c: int, **rtc) -> tuple[torch.Tensor, torch.Tensor, dict | None]:
        """predict_action_chunk with case c's inputs and noise: its output, and the whole
        normalized chunk and options of the GR00TN17.get_action call it makes."""
        seen = {}
        real_get_action, real_randn = model.get_action, torch.randn

        def get_action(inputs, options=None):
            result = real_get_action(inputs, options) if options is not None else real_get_action(inputs)
            seen.update(chunk=result["action_pred"].detach().clone(), options=options)
            return result

        noise = golden[f"case{c}.noise"]
        model.get_action = get_action
        torch.randn = lambda *a, **k: noise.clone()  # get_action's only randn: the initial noise
        try:
            with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
                returned = policy.predict_action_chunk(model_inputs(c), **rtc)
        finally:
            model.get_action, torch.randn = real_get_action, real_randn
        return returned[0], seen["chunk"][0], seen["options"]

    returned_a, chunk_a, _ = predict(0)
    returned_b, plain, _ = predict(1)
    for name, got, c in [("chunk A", chunk_a, 0), ("plain chunk B", plain, 1)]:
        drift = float((got - golden[f"case{c}.action_pred"][0]).abs().max())
        print(f"{name} vs golden.safetensors case{c}.action_pred: max |diff| = {drift:.3g}")
        assert drift < 1e-5, drift
    print("predict_action_chunk returns", tuple(returned_a.shape), "of the chunk's", tuple(chunk_a.shape))

    out = {}
    for i, case in enumerate(CASES):
        policy.config.rtc_config = RTCConfig(enabled=True, execution_horizon=case["execution_horizon"])
        left_over = returned_a[case["executed"]:]  # as ActionQueue.get_left_over hands it
        _, chunk, options = predict(1, inference_delay=case["inference_delay"], prev_chunk_left_over=left_over)
        case["options"] = {k: v for k, v in options.items()} if options else None
        out[f"output.rtc.{i}"] = chunk.numpy()
        changed = float((chunk - plain).abs().max())
        print(f"case {i} {case}: max |chunk - plain| = {changed:.4g}")
    policy.config.rtc_config = None
    again = predict(1)[1]
    assert torch.equal(again, plain), "RTC state leaked into a plain run"
    out = {k: np.ascontiguousarray(v.astype(np.float32)) for k, v in out.items()}
    save_file(out, str(out_path), metadata={
        "generator": "tools/golden/gen_groot_rtc.py",
        "reference": "lerobot-0.6.1 GrootPolicy.predict_action_chunk (GR00T N1.7 RTC), f32 CPU",
        "chunk_a": "golden.safetensors case0 (inputs, noise, action_pred)",
        "chunk_b": "golden.safetensors case1 (inputs, noise; action_pred is the plain chunk)",
        "cases": json.dumps(CASES),
    })
    print("wrote", out_path)


if __name__ == "__main__":
    main()
