#!/usr/bin/env python3
"""Generate golden test fixtures for a TINY randomly-initialised Pi0.5 from lerobot==0.6.1.

The Rust CPU implementation (runtime/) is checked against these at max-abs <= 1e-4.

How to run
----------
Needs Python >= 3.12, torch (CPU is enough), lerobot==0.6.1, transformers==5.5.4 (lerobot 0.6.1
needs transformers >=5.4,<5.6) and their small dependencies.  In this workplace that means the
device machine: see tools/device/checks/gen_golden.sh, which installs carried wheels and runs

    python3 tools/golden/gen_pi05.py --out $OUT/fixture [--reference PATH/pi05_reference.py]

Everything runs on the CPU in float32, eval mode, with fixed seeds; the output is deterministic
(up to CPU kernel differences between machines, far below 1e-6).

What it writes into --out (see tests/data/pi05_tiny/README.md for the full key list):
  model.safetensors, config.json                  policy.save_pretrained()  (lerobot's own writer)
  policy_preprocessor.json + *.safetensors        preprocessor.save_pretrained()
  policy_postprocessor.json + *.safetensors       postprocessor.save_pretrained()
  golden.safetensors                              inputs + lerobot intermediates/outputs
  golden_processor.json                           lerobot's state normalization / prompt / action unnormalization

Tiny architecture (the Rust side derives sizes from tensor shapes and expects exactly this):
  SigLIP: 224px, patch 14 (256 tokens), width 144, 1 layer, 2 heads (head_dim 72), MLP 64, LN eps 1e-6
  projector Linear(144 -> 64) with bias
  prefix LM (Gemma): width 64, 2 layers, 8 q heads, 1 kv head, head_dim 16, MLP 128, vocab 1024
  action expert (Gemma + adaRMS): width 32, 2 layers, 8 q heads, 1 kv head, head_dim 16, MLP 64
  chunk 50, max_action_dim 32, max_state_dim 32, 10 steps, 200 prompt tokens, 3 cameras, state 8, action 7

How lerobot is shrunk (lerobot 0.6.1 only knows the two full-size Gemma variants):
  * modeling_pi05.get_gemma_config (module level) is replaced by a tiny version;
  * the PaliGemma / expert HF configs that PaliGemmaWithExpertModel builds (with hard-coded SigLIP
    MLP 4304, projector 2048, vocab 257152) are edited just before the HF modules are constructed,
    by wrapping the two class names in modeling_pi05's namespace.  The result has exactly the
    module structure of the full model (same classes, same key names), only smaller: the
    projector is Linear(144, 64) and the embedding / lm_heads have 1024 rows.
  * every parameter is then re-randomised (fixed seed); nothing stays 0 or 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------
# Tiny sizes
# ---------------------------------------------------------------------------------------------
SIGLIP_WIDTH, SIGLIP_LAYERS, SIGLIP_HEADS, SIGLIP_MLP = 144, 1, 2, 64
LM_WIDTH, LM_LAYERS, LM_MLP = 64, 2, 128
EX_WIDTH, EX_LAYERS, EX_MLP = 32, 2, 64
N_HEADS, N_KV_HEADS, HEAD_DIM = 8, 1, 16
VOCAB = 1024
STATE_DIM, ACTION_DIM = 8, 7
CAMERAS = ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]  # config order
SEED = 1234

MATRIX_STD = 0.1  # every >=2-D weight (linear, conv, embeddings)
BIAS_STD = 0.1  # every bias
NORM_STD = 0.2  # LayerNorm weight = 1 + N(0, .2); LayerNorm bias / Gemma (1+w) RMSNorm w ~ N(0, .2)


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# Patching lerobot to build the tiny model
# ---------------------------------------------------------------------------------------------
def patch_lerobot_tiny():
    from lerobot.policies.pi05 import modeling_pi05 as m

    def tiny_gemma_config(variant: str):
        if variant == "gemma_2b":  # the prefix LM (paligemma_variant default)
            return m.GemmaConfig(LM_WIDTH, LM_LAYERS, LM_MLP, N_HEADS, N_KV_HEADS, HEAD_DIM)
        if variant == "gemma_300m":  # the action expert (action_expert_variant default)
            return m.GemmaConfig(EX_WIDTH, EX_LAYERS, EX_MLP, N_HEADS, N_KV_HEADS, HEAD_DIM)
        raise ValueError(variant)

    m.get_gemma_config = tiny_gemma_config

    orig_paligemma = m.PaliGemmaForConditionalGenerationWithPiGemma
    orig_expert = m.PiGemmaForCausalLM

    def tiny_paligemma(config):
        vc = config.vision_config
        vc.hidden_size = SIGLIP_WIDTH
        vc.num_hidden_layers = SIGLIP_LAYERS
        vc.num_attention_heads = SIGLIP_HEADS
        vc.intermediate_size = SIGLIP_MLP  # lerobot hard-codes 4304
        vc.projection_dim = LM_WIDTH  # lerobot hard-codes 2048 -> projector Linear(144, 64)
        vc.patch_size = 14
        vc.image_size = 224
        vc.layer_norm_eps = 1e-6
        config.projection_dim = LM_WIDTH
        config.hidden_size = LM_WIDTH
        config.vocab_size = VOCAB
        config.text_config.vocab_size = VOCAB  # embed_tokens and lm_head get 1024 rows
        return orig_paligemma(config=config)

    def tiny_expert(config):
        config.vocab_size = VOCAB  # the (unused) expert lm_head gets 1024 rows
        return orig_expert(config=config)

    m.PaliGemmaForConditionalGenerationWithPiGemma = tiny_paligemma
    m.PiGemmaForCausalLM = tiny_expert


def make_config():
    from lerobot.configs import FeatureType, PolicyFeature
    from lerobot.policies.pi05.configuration_pi05 import PI05Config

    input_features = {
        f"observation.images.{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224)) for c in CAMERAS
    }
    input_features["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    output_features = {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}
    return PI05Config(
        input_features=input_features,
        output_features=output_features,
        device="cpu",
        dtype="float32",
        chunk_size=50,
        n_action_steps=50,
        max_action_dim=32,
        max_state_dim=32,
        num_inference_steps=10,
        tokenizer_max_length=200,
    )


def randomize_(model: torch.nn.Module, seed: int):
    """Re-randomise every parameter, in sorted-name order, from a private generator."""
    g = torch.Generator().manual_seed(seed)
    named = dict(model.named_parameters(remove_duplicate=False))
    done = set()
    with torch.no_grad():
        for name in sorted(named):
            p = named[name]
            if id(p) in done:
                continue
            done.add(id(p))
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            leaf = name.rsplit(".", 1)[-1]
            is_norm = any(s in name for s in ("layer_norm", "layernorm", "post_layernorm")) or name.endswith(
                "norm.weight"
            )
            if p.ndim >= 2:  # linear / conv / embedding / adaRMS dense weights
                p.copy_(noise * MATRIX_STD)
            elif is_norm and leaf == "weight" and "vision_tower" in name:  # SigLIP LayerNorm: y = xn*w + b
                p.copy_(1.0 + noise * NORM_STD)
            elif is_norm:  # Gemma RMSNorm (1+w) weights, LayerNorm biases
                p.copy_(noise * NORM_STD)
            else:  # biases (incl. adaRMS dense biases, projector, time MLP, action projs)
                p.copy_(noise * BIAS_STD)
    # nothing may stay exactly zero or one
    for name, p in model.named_parameters():
        assert not torch.all(p == 0) and not torch.all(p == 1), name


# ---------------------------------------------------------------------------------------------
# Fake tokenizer (no internet on the generator machine; the tokenizer itself is not under test)
# ---------------------------------------------------------------------------------------------
class FakeTokenizer:
    """Stands in for google/paligemma-3b-pt-224: records the prompt strings it is given."""

    def __init__(self):
        self.seen: list[str] = []

    def __call__(self, text, max_length, truncation, padding, padding_side, return_tensors):
        texts = [text] if isinstance(text, str) else list(text)
        self.seen.extend(texts)
        ids = torch.zeros(len(texts), max_length, dtype=torch.long)
        ids[:, 0] = 2
        mask = torch.zeros(len(texts), max_length, dtype=torch.long)
        mask[:, 0] = 1
        return {"input_ids": ids, "attention_mask": mask}


FAKE_TOK = FakeTokenizer()


class FakeAutoTokenizer:
    @staticmethod
    def from_pretrained(name, *a, **k):
        log(f"[fake tokenizer] from_pretrained({name!r}) -> FakeTokenizer")
        return FAKE_TOK


def patch_tokenizer():
    import lerobot.processor.tokenizer_processor as tp

    tp.AutoTokenizer = FakeAutoTokenizer


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
def make_inputs(seed: int):
    rng = np.random.default_rng(seed)
    inputs = {
        "input.image.base_0_rgb": rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8),
        "input.image.left_wrist_0_rgb": rng.integers(0, 256, size=(180, 240, 3), dtype=np.uint8),
    }
    g = torch.Generator().manual_seed(seed + 1)
    inputs["input.noise"] = torch.randn(50, 32, generator=g, dtype=torch.float32).numpy()
    for p, n_valid in (("a", 17), ("b", 61)):
        tok = np.zeros(200, dtype=np.int64)
        tok[0] = 2  # BOS
        tok[1:n_valid] = rng.integers(4, VOCAB, size=n_valid - 1)
        mask = np.zeros(200, dtype=np.uint8)
        mask[:n_valid] = 1
        inputs[f"input.{p}.tokens"] = tok
        inputs[f"input.{p}.token_mask"] = mask
    return inputs


def u8_to_lerobot(img_hwc: np.ndarray) -> torch.Tensor:
    """HWC uint8 -> float32 [1,3,H,W] in [0,1], as lerobot datasets/envs deliver images."""
    return (torch.from_numpy(img_hwc).permute(2, 0, 1).contiguous().float() / 255.0)[None]


# ---------------------------------------------------------------------------------------------
# Running lerobot with recording hooks
# ---------------------------------------------------------------------------------------------
class Recorder:
    def __init__(self, model):
        self.model = model
        self.vision, self.proj, self.velocity, self.kv = [], [], [], None
        pg = model.paligemma_with_expert.paligemma.model
        pg.vision_tower.register_forward_hook(lambda mod, i, o: self.vision.append(o.last_hidden_state.detach().clone()))
        pg.multi_modal_projector.register_forward_hook(lambda mod, i, o: self.proj.append(o.detach().clone()))
        orig = model.denoise_step

        def rec(**kw):
            if self.kv is None:  # the prefix KV cache, as handed to the first denoise step
                self.kv = [(k.detach().clone(), v.detach().clone()) for k, v, *_ in kw["past_key_values"]]
            out = orig(**kw)
            self.velocity.append(out.detach().clone())
            return out

        model.denoise_step = rec

    def reset(self):
        self.vision, self.proj, self.velocity, self.kv = [], [], [], None


def lerobot_batch(inputs):
    # right_wrist_0_rgb is deliberately MISSING from the batch
    return {
        "observation.images.base_0_rgb": u8_to_lerobot(inputs["input.image.base_0_rgb"]),
        "observation.images.left_wrist_0_rgb": u8_to_lerobot(inputs["input.image.left_wrist_0_rgb"]),
    }


def run_policy(policy, inputs, p, recorder=None):
    images, img_masks = policy._preprocess_images(lerobot_batch(inputs))
    tokens = torch.from_numpy(inputs[f"input.{p}.tokens"])[None]
    masks = torch.from_numpy(inputs[f"input.{p}.token_mask"]).bool()[None]
    noise = torch.from_numpy(inputs["input.noise"])[None]
    if recorder is not None:
        recorder.reset()
    with torch.no_grad():
        actions = policy.model.sample_actions(images, img_masks, tokens, masks, noise=noise.clone())
    return images, img_masks, tokens, masks, noise, actions


# ---------------------------------------------------------------------------------------------
# Processor goldens
# ---------------------------------------------------------------------------------------------
def make_stats(seed: int):
    rng = np.random.default_rng(seed)

    def one(d):
        q01 = rng.uniform(-2.0, 0.5, size=d)
        q99 = q01 + rng.uniform(0.5, 3.0, size=d)
        return {
            "mean": ((q01 + q99) / 2 + rng.uniform(-0.1, 0.1, size=d)).astype(np.float32),
            "std": ((q99 - q01) / 4).astype(np.float32),
            "min": (q01 - rng.uniform(0.1, 1.0, size=d)).astype(np.float32),
            "max": (q99 + rng.uniform(0.1, 1.0, size=d)).astype(np.float32),
            "q01": q01.astype(np.float32),
            "q99": q99.astype(np.float32),
        }

    return {"observation.state": one(STATE_DIM), "action": one(ACTION_DIM)}


def f32list(t):
    return [float(x) for x in np.asarray(t, dtype=np.float32).reshape(-1)]


def processor_goldens(config, stats, out: Path, seed: int):
    from lerobot.policies.factory import make_pre_post_processors

    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    log("preprocessor steps:", [type(s).__name__ for s in pre.steps])
    log("postprocessor steps:", [type(s).__name__ for s in post.steps])
    pre.save_pretrained(out)
    post.save_pretrained(out)

    rng = np.random.default_rng(seed)
    q01, q99 = stats["observation.state"]["q01"], stats["observation.state"]["q99"]
    s0 = (q01 + (q99 - q01) * rng.uniform(0.05, 0.95, size=STATE_DIM)).astype(np.float32)  # inside
    s1 = (q01 + (q99 - q01) * rng.uniform(-0.4, 1.4, size=STATE_DIM)).astype(np.float32)
    s1[0] = q01[0] - 0.7  # below q01 -> normalized < -1 -> bin -1
    s1[1] = q99[1] + 0.9  # above q99 -> normalized > 1 -> bin 255
    s1[2] = q01[2]  # exactly q01 -> -1 -> bin 0
    s1[3] = q99[3]  # exactly q99 -> +1 -> bin 255
    s2 = rng.normal(0.0, 1.5, size=STATE_DIM).astype(np.float32)
    tasks = ["pick_up the red\ncube ", "  stack blocks", "Open_the top drawer\n"]

    states = []
    for s, task in zip((s0, s1, s2), tasks):
        FAKE_TOK.seen.clear()
        res = pre({"observation.state": torch.from_numpy(s.copy()), "task": task})
        assert len(FAKE_TOK.seen) == 1, FAKE_TOK.seen
        prompt = FAKE_TOK.seen[0]
        bins = [int(b) for b in prompt.split("State: ")[1].split(";")[0].split(" ")]
        norm = res["observation.state"].reshape(-1)
        states.append(
            {"raw": f32list(s), "task": task, "normalized": f32list(norm.numpy()), "bins": bins, "prompt": prompt}
        )
        log(f"prompt: {prompt!r}")

    acts = []
    g = torch.Generator().manual_seed(seed + 7)
    for scale in (0.6, 1.5):
        a = (torch.randn(1, 50, ACTION_DIM, generator=g) * scale).float()
        res = post(a.clone())
        acts.append(
            {
                "normalized": a[0].numpy().astype(np.float32).tolist(),
                "unnormalized": res.reshape(50, ACTION_DIM).numpy().astype(np.float32).tolist(),
            }
        )

    # reload the saved processors and check they reproduce the same numbers
    reload_ok = None
    try:
        pre2, post2 = make_pre_post_processors(config, pretrained_path=str(out))
        d = 0.0
        for st in states:
            FAKE_TOK.seen.clear()
            r = pre2({"observation.state": torch.tensor(st["raw"], dtype=torch.float32), "task": st["task"]})
            d = max(d, float((r["observation.state"].reshape(-1) - torch.tensor(st["normalized"])).abs().max()))
            assert FAKE_TOK.seen == [st["prompt"]]
        for ac in acts:
            r = post2(torch.tensor(ac["normalized"])[None])
            d = max(d, float((r.reshape(50, ACTION_DIM) - torch.tensor(ac["unnormalized"])).abs().max()))
        reload_ok = d
        log(f"processor reload check: max |diff| = {d:.3g}")
    except Exception as e:  # pragma: no cover - diagnostic only
        log(f"processor reload check FAILED: {type(e).__name__}: {e}")

    return {
        "description": "lerobot 0.6.1 Pi0.5 pre/post-processing goldens (see README.md)",
        "normalization": "QUANTILES: x_n = 2*(x-q01)/(q99-q01) - 1 (no eps unless q99==q01); inverse for actions",
        "stats": {k: {n: f32list(v) for n, v in d.items()} for k, d in stats.items()},
        "states": states,
        "actions": acts,
        "reload_max_abs_diff": reload_ok,
    }


# ---------------------------------------------------------------------------------------------
# Cross-check against the independent reference implementation (specs/pi05_reference.py)
# ---------------------------------------------------------------------------------------------
def reference_check(path, ckpt_file, images, img_masks, inputs, golden):
    from safetensors.torch import load_file

    spec = importlib.util.spec_from_file_location("pi05_reference", path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    ref.VL, ref.VH, ref.L, ref.NH, ref.HD, ref.W = SIGLIP_LAYERS, SIGLIP_HEADS, LM_LAYERS, N_HEADS, HEAD_DIM, LM_WIDTH
    raw = load_file(ckpt_file)  # the file as written, like the Rust loader reads it
    sd = {(k[len("model.") :] if k.startswith("model.") else k): v for k, v in raw.items()}
    emb = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    if emb not in sd:
        sd[emb] = sd["paligemma_with_expert.paligemma.lm_head.weight"]
    ref.sd = sd
    res = {}
    with torch.no_grad():
        for ci, cam in enumerate(CAMERAS[:2]):
            t = ref.siglip(images[ci])[0]
            res[f"image_tokens.{cam}"] = float((t - torch.from_numpy(golden[f"output.image_tokens.{cam}"])).abs().max())
        for p in ("a", "b"):
            tokens = torch.from_numpy(inputs[f"input.{p}.tokens"])[None]
            tmask = torch.from_numpy(inputs[f"input.{p}.token_mask"]).bool()[None]
            noise = torch.from_numpy(inputs["input.noise"])[None]
            a = ref.sample(images, img_masks, tokens, tmask, noise, steps=10)[0]
            res[f"actions.{p}"] = float((a - torch.from_numpy(golden[f"output.{p}.actions"])).abs().max())
    return res


# ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--reference", default=None, help="optional path to specs/pi05_reference.py for a cross-check")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(SEED)
    np.random.seed(SEED)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_default_dtype(torch.float32)

    import lerobot
    import transformers

    log(f"python {sys.version.split()[0]} torch {torch.__version__} lerobot {lerobot.__version__} "
        f"transformers {transformers.__version__}")

    patch_lerobot_tiny()
    patch_tokenizer()
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy

    config = make_config()
    policy = PI05Policy(config)
    policy.eval()
    randomize_(policy.model, SEED)
    # Tie the (unused-at-inference) lm_head to the embedding by value: real checkpoints carry the
    # embedding as lm_head.weight (lerobot copies it into embed_tokens on load); keep both equal.
    pg = policy.model.paligemma_with_expert.paligemma
    with torch.no_grad():
        pg.lm_head.weight.copy_(pg.model.language_model.embed_tokens.weight)
    log("vision attn impl:", pg.model.vision_tower.config._attn_implementation)

    # shape sanity: exactly the tiny architecture
    sd = policy.model.state_dict()
    P = "paligemma_with_expert.paligemma.model."
    expect = {
        P + "vision_tower.vision_model.embeddings.patch_embedding.weight": (144, 3, 14, 14),
        P + "vision_tower.vision_model.embeddings.position_embedding.weight": (256, 144),
        P + "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": (64, 144),
        P + "multi_modal_projector.linear.weight": (64, 144),
        P + "multi_modal_projector.linear.bias": (64,),
        P + "language_model.embed_tokens.weight": (VOCAB, 64),
        "paligemma_with_expert.paligemma.lm_head.weight": (VOCAB, 64),
        P + "language_model.layers.1.self_attn.q_proj.weight": (128, 64),
        P + "language_model.layers.1.self_attn.k_proj.weight": (16, 64),
        P + "language_model.layers.1.mlp.gate_proj.weight": (128, 64),
        "paligemma_with_expert.gemma_expert.model.layers.1.self_attn.q_proj.weight": (128, 32),
        "paligemma_with_expert.gemma_expert.model.layers.1.self_attn.o_proj.weight": (32, 128),
        "paligemma_with_expert.gemma_expert.model.layers.1.input_layernorm.dense.weight": (96, 32),
        "paligemma_with_expert.gemma_expert.model.norm.dense.weight": (96, 32),
        "paligemma_with_expert.gemma_expert.lm_head.weight": (VOCAB, 32),
        "action_in_proj.weight": (32, 32),
        "time_mlp_in.weight": (32, 32),
    }
    for k, s in expect.items():
        assert tuple(sd[k].shape) == s, (k, tuple(sd[k].shape), s)
    assert not any("vision_tower.vision_model.encoder.layers.1." in k for k in sd)
    n_params = sum(v.numel() for v in sd.values())
    log(f"state_dict: {len(sd)} tensors, {n_params} values")

    # ---- inputs and lerobot runs -----------------------------------------------------------
    inputs = make_inputs(SEED)
    rec = Recorder(policy.model)
    golden = {k: np.ascontiguousarray(v) for k, v in inputs.items()}
    ref_inputs = None
    for p in ("a", "b"):
        images, img_masks, tokens, masks, noise, actions = run_policy(policy, inputs, p, rec)
        assert len(rec.vision) == 3 and len(rec.proj) == 3 and len(rec.velocity) == 10, (
            len(rec.vision), len(rec.proj), len(rec.velocity))
        if p == "a":
            ref_inputs = (images, img_masks)
            assert [bool(m[0]) for m in img_masks] == [True, True, False]
            for ci, cam in enumerate(CAMERAS[:2]):  # present cameras come first (= config order here)
                golden[f"output.vision.{cam}"] = rec.vision[ci][0].numpy()
                golden[f"output.image_tokens.{cam}"] = rec.proj[ci][0].numpy()
            golden["output.preprocessed.left_wrist_0_rgb"] = images[1][0].numpy()
        for li, (k, v) in enumerate(rec.kv):
            assert k.shape == (1, 1, 3 * 256 + 200, 16), k.shape  # 968 slots: 3 cameras (missing one last) + 200
            golden[f"output.{p}.prefix_k.layer{li}"] = k[0, 0].numpy()
            golden[f"output.{p}.prefix_v.layer{li}"] = v[0, 0].numpy()
        golden[f"output.{p}.velocity.step0"] = rec.velocity[0][0].numpy()
        golden[f"output.{p}.actions"] = actions[0].numpy()
        log(f"prompt {p}: actions mean {actions.mean():.4f} std {actions.std():.4f} "
            f"|v0| max {rec.velocity[0].abs().max():.4f}")

    # ---- checkpoint + processors (lerobot's own writers) ---------------------------------
    policy.save_pretrained(out)
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    log(f"model.safetensors: {len(keys)} tensors; first {keys[0]}; last {keys[-1]}")
    log("  lm_head/embed keys:", [k for k in keys if "lm_head" in k or "embed_tokens" in k])

    stats = make_stats(SEED + 100)
    proc = processor_goldens(config, stats, out, SEED + 200)

    # ---- reload the checkpoint through lerobot and re-run prompt a -------------------------
    reload_diff = None
    try:
        pol2 = PI05Policy.from_pretrained(str(out), local_files_only=True)
        pol2.eval()
        a2 = run_policy(pol2, inputs, "a")[-1]
        reload_diff = float((a2[0] - torch.from_numpy(golden["output.a.actions"])).abs().max())
        log(f"checkpoint reload (PI05Policy.from_pretrained) actions a: max |diff| = {reload_diff:.3g}")
    except Exception as e:  # pragma: no cover - diagnostic only
        log(f"checkpoint reload FAILED: {type(e).__name__}: {e}")
    proc["checkpoint_reload_max_abs_diff"] = reload_diff

    # ---- optional independent cross-check ---------------------------------------------------
    if args.reference and os.path.exists(args.reference):
        res = reference_check(args.reference, str(out / "model.safetensors"), *ref_inputs, inputs, golden)
        log("reference (specs/pi05_reference.py) vs lerobot, max |diff|:", json.dumps(res))
        proc["reference_max_abs_diff"] = res
    else:
        log("reference cross-check skipped")

    # ---- write goldens ------------------------------------------------------------------------
    from safetensors.torch import save_file

    tens = {}
    for k, v in sorted(golden.items()):
        t = torch.from_numpy(np.ascontiguousarray(v)).contiguous()
        assert torch.isfinite(t.float()).all(), k
        tens[k] = t
    save_file(tens, str(out / "golden.safetensors"), metadata={"generator": "tools/golden/gen_pi05.py",
                                                                "lerobot": lerobot.__version__,
                                                                "torch": torch.__version__})
    proc["versions"] = {"lerobot": lerobot.__version__, "transformers": transformers.__version__,
                        "torch": torch.__version__, "python": sys.version.split()[0]}
    with open(out / "golden_processor.json", "w") as f:
        json.dump(proc, f, indent=1)
    for k, t in tens.items():
        log(f"  golden {k}: {t.dtype} {tuple(t.shape)}")
    for p in sorted(out.iterdir()):
        log(f"  file {p.name}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
