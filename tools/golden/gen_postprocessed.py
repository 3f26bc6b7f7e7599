#!/usr/bin/env python3
"""lerobot's post-processed actions for the committed tiny Pi0.5 fixture (tests/data/pi05_tiny/).

golden.safetensors holds the model's normalized x_0 per prompt (`output.{p}.actions`, [50, 32]),
as PI05Pytorch.sample_actions returns it. What a robot gets from lerobot is that chunk cut to the
robot's action width (PI05Policy.predict_action_chunk; this script logs the source lines that do
it) and un-normalized by the postprocessor pipeline. This script runs lerobot 0.6.1's own
postprocessor on the stored x_0:

  - the fixture's saved postprocessor (QUANTILES, as its config.json maps ACTION), and
  - one built by make_pre_post_processors from the same statistics with ACTION mapped to MEAN_STD,

and writes golden_postprocessed.safetensors with `output.{p}.actions.quantiles` and
`output.{p}.actions.mean_std` ([50, action_dim] f32). tests/golden_pi05.rs compares what
Policy::step returns (and tests/c/abi_test.c what frt_policy_step returns) with them.

Run on the device machine (Python 3.12 + torch): tools/device/checks/gen_postprocessed.sh.
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.configs.types import NormalizationMode
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.pi05 import modeling_pi05
    from safetensors.numpy import load_file, save_file
    import lerobot.processor.tokenizer_processor as tokenizer_processor

    # make_pre_post_processors also builds the preprocessor, whose tokenizer step would fetch
    # PaliGemma's tokenizer from the hub (offline here); only the postprocessor is used.
    class OfflineTokenizer:
        @staticmethod
        def from_pretrained(name, *a, **k):
            print(f"tokenizer {name!r} not loaded (offline; the preprocessor is unused)")
            return object()

    tokenizer_processor.AutoTokenizer = OfflineTokenizer

    # Evidence for the cut: the lines of predict_action_chunk that slice the model's output.
    src = inspect.getsource(modeling_pi05.PI05Policy.predict_action_chunk)
    print("PI05Policy.predict_action_chunk slices:", [l.strip() for l in src.splitlines() if "action_dim" in l or "[:, :, :" in l])

    config = PreTrainedConfig.from_pretrained(args.fixture)
    action_dim = config.output_features["action"].shape[0]
    golden = load_file(args.fixture / "golden.safetensors")
    stats_file = next(args.fixture.glob("policy_postprocessor_step_*_unnormalizer_processor.safetensors"))
    flat = load_file(stats_file)
    stats = {}
    for key, value in flat.items():
        feature, stat = key.rsplit(".", 1)
        stats.setdefault(feature, {})[stat] = torch.from_numpy(value)

    _, post_quantiles = make_pre_post_processors(config, pretrained_path=str(args.fixture))
    config.normalization_mapping["ACTION"] = NormalizationMode.MEAN_STD
    _, post_mean_std = make_pre_post_processors(config, dataset_stats=stats)
    print("postprocessors:", [type(s).__name__ for s in post_quantiles.steps], [type(s).__name__ for s in post_mean_std.steps])

    out = {}
    for p in ("a", "b"):
        x0 = torch.from_numpy(golden[f"output.{p}.actions"]).float()[None]  # [1, 50, 32]
        cut = x0[:, :, :action_dim]
        for name, post in (("quantiles", post_quantiles), ("mean_std", post_mean_std)):
            actions = post(cut.clone()).reshape(x0.shape[1], action_dim).numpy().astype(np.float32)
            out[f"output.{p}.actions.{name}"] = actions
            print(f"prompt {p} {name}: first row {actions[0].tolist()}")
    save_file(out, str(args.out), metadata={"reference": "lerobot-0.6.1 postprocessor", "action_dim": json.dumps(action_dim)})
    print("wrote", args.out)


if __name__ == "__main__":
    main()
