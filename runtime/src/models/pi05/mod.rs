//! Pi0.5 (Physical Intelligence): SigLIP So400m/14 vision tower, Gemma 2B prefix LM, Gemma 300M
//! action expert with adaRMS time conditioning, flow-matching Euler sampling.
//!
//! - Paper: "π0.5: a Vision-Language-Action Model with Open-World Generalization" (2025).
//! - Reference code: openpi `src/openpi/models_pytorch/pi0_pytorch.py`; lerobot 0.6.1
//!   `lerobot/policies/pi05/modeling_pi05.py` (the golden reference of our tests).
//! - Checkpoint: `lerobot/pi05_base` (safetensors, PyTorch `[out, in]` layout).
//! - Specification: `shared/specs/pi05.md` in the steering repo.
//!
//! This module derives the [`Config`] from tensor shapes (plus lerobot's `config.json`), checks the
//! checkpoint against it, folds constants (merged Q/K/V, `(1 + w)` norms into the next GEMM, the
//! Euler step into `action_out_proj`, every time-dependent adaRMS modulation precomputed) and
//! describes the whole step once, as a [`Plan`]. Its pre- and post-processing live beside it:
//! the prompt format and state discretization ([`prompt`]), lerobot's normalization statistics
//! ([`norm`]) and random checkpoints in lerobot's layout for tests and demos ([`synth`]).

pub mod norm;
pub mod prompt;
pub mod spec;
pub mod synth;

use crate::checkpoint::{Checkpoint, Expected};
use crate::error::{Error, Result};
use crate::io::{IoSpec, Port, RtcPorts};
use crate::plan::{BufId, BufType, HostIo, Op, Plan, View, WeightId, WeightRole};
use crate::rtc::{RtcConfig, guidance_weight};
use crate::weights::WeightData;

use self::norm::{Mode, Modes};
use super::blocks::{gemma, siglip};
use super::loader::Loader;

/// Fewest rows a product needs to run in FP8 on the CUDA backend by default: the action expert's
/// 50-row products run in FP8 inside its streamed kernels (and the first denoise step's beside
/// them, from the same e4m3 weights); of the rest only each step's first QKV product is under 128
/// rows, and its quantizing launch would cost about what FP8 saves.
pub const FP8_MIN_ROWS: usize = 128;

/// FP8 calibration keeps part of the SigLIP vision tower in bf16 by default: its patch embedding,
/// its first seven blocks and every block's output projection. On the full-size model
/// (synthetic weights, H100, 3 camera slots, 32 observations on 1-3 cameras) the whole tower in
/// e4m3 moves the actions to a worst relative L2 of 5.96e-2 against bf16, on one-camera
/// observations, past issue 30's 5e-2; the tower in bf16 gives 3.2e-2. The early blocks' rounding
/// is what the actions carry. Blocks 7-26 read e4m3 without a quantizing launch: QKV and fc1
/// from their LayerNorms, fc2 from fc1's GELU epilogue (cuBLASLt writes it in e4m3). Their output
/// projections could read it from the attention (`attention_hd72`'s e4m3 form) but stay in bf16:
/// in FP8 they measured 0.02 ms faster, inside the noise, for a worse worst relative L2 (3.74e-2
/// against 3.47e-2; `bench/results/h100-norms-early-rows-vision-out-proj.json`). With
/// blocks 7-26's QKV and fc1 in FP8: pi05-2v 0.09 ms faster, worst relative L2 3.75e-2 (the whole
/// tower's QKV and fc1: 0.13 ms, 4.8e-2; `bench/results/h100-fp8-vision-qkv-fc1.json`); their fc2
/// too: 0.05 ms more, 3.47e-2 against 3.76e-2 in the same call
/// (`bench/results/h100-fp8-vision-fc2.json`). `--keep-bf16 vision.` keeps the whole tower.
pub const FP8_KEEP_BF16: &[&str] = &[
    "vision.patch_embedding",
    "vision.0.",
    "vision.1.",
    "vision.2.",
    "vision.3.",
    "vision.4.",
    "vision.5.",
    "vision.6.",
    "vision.*.out_proj",
];

const P: &str = "paligemma_with_expert.paligemma.model.";
const VT: &str = "paligemma_with_expert.paligemma.model.vision_tower.vision_model.";
const LM: &str = "paligemma_with_expert.paligemma.model.language_model.";
const EX: &str = "paligemma_with_expert.gemma_expert.";
/// SigLIP So400m uses 72-wide heads; the head count is not visible in the tensor shapes.
const SIGLIP_HEAD_DIM: usize = 72;
const EPS: f32 = 1e-6;

/// Sizes of one Pi0.5 checkpoint, derived from its tensors and its `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vision_width: usize,
    pub vision_layers: usize,
    pub vision_heads: usize,
    pub vision_mlp: usize,
    pub patch: usize,
    pub image_size: usize,
    pub lm_width: usize,
    pub lm_layers: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub lm_mlp: usize,
    pub vocab: usize,
    pub expert_width: usize,
    pub expert_layers: usize,
    pub expert_mlp: usize,
    /// Padded action width of the model (`max_action_dim`).
    pub action_dim: usize,
    pub horizon: usize,
    pub denoise_steps: usize,
    pub prompt_len: usize,
    /// Camera names in the order the model sees them.
    pub cameras: Vec<String>,
    /// The robot's real state / action dims (≤ the padded widths); `None` = not stated.
    pub state_dim: Option<usize>,
    pub robot_action_dim: Option<usize>,
    /// Which tensor holds the token embedding (`lm_head.weight` or `embed_tokens.weight`).
    pub embedding_tensor: String,
}

impl Config {
    pub fn tokens_per_image(&self) -> usize {
        (self.image_size / self.patch).pow(2)
    }

    pub fn prefix_len(&self, cameras: usize) -> usize {
        cameras * self.tokens_per_image() + self.prompt_len
    }

    /// Parameters the runtime reads (the unused expert `lm_head` and final LM norm excluded).
    pub fn parameter_count(&self) -> usize {
        self.expected().tensors().map(|(_, shape)| shape.iter().product::<usize>()).sum()
    }

    /// Derives every size from the checkpoint's tensors; `json` is lerobot's `config.json` if any.
    pub fn from_checkpoint(ckpt: &Checkpoint, json: Option<&LerobotConfig>) -> Result<Config> {
        let shape = |name: &str| -> Result<&[usize]> {
            ckpt.shape(name)
                .ok_or_else(|| Error::checkpoint(ckpt.path(), format!("missing tensor {name} (needed to derive the model size)")))
        };
        let dim = |name: &str, axis: usize| -> Result<usize> {
            let s = shape(name)?;
            s.get(axis).copied().ok_or_else(|| {
                Error::checkpoint(ckpt.path(), format!("tensor {name} has shape {s:?}, expected at least {} dims", axis + 1))
            })
        };
        let count_layers = |prefix: &str| {
            (0..)
                .take_while(|i| {
                    ckpt.shape(&format!("{prefix}{i}.input_layernorm.weight")).is_some()
                        || ckpt.shape(&format!("{prefix}{i}.layer_norm1.weight")).is_some()
                        || ckpt.shape(&format!("{prefix}{i}.input_layernorm.dense.weight")).is_some()
                })
                .count()
        };

        let patch_w = format!("{VT}embeddings.patch_embedding.weight");
        let vision_width = dim(&patch_w, 0)?;
        let patch = dim(&patch_w, 2)?;
        let positions = dim(&format!("{VT}embeddings.position_embedding.weight"), 0)?;
        let side = (positions as f64).sqrt() as usize;
        if side * side != positions {
            return Err(Error::checkpoint(ckpt.path(), format!("position_embedding has {positions} rows, not a square number of patches")));
        }
        let vision_heads = match json.and_then(|j| j.vision_num_heads) {
            Some(h) => h,
            None if vision_width % SIGLIP_HEAD_DIM == 0 => vision_width / SIGLIP_HEAD_DIM,
            None => {
                return Err(Error::checkpoint(
                    ckpt.path(),
                    format!(
                        "cannot derive the SigLIP head count from width {vision_width} (not a multiple of {SIGLIP_HEAD_DIM}); set vision_num_heads in config.json"
                    ),
                ));
            }
        };

        let embedding_tensor =
            [format!("{P}language_model.embed_tokens.weight"), "paligemma_with_expert.paligemma.lm_head.weight".to_string()]
                .into_iter()
                .find(|n| ckpt.shape(n).is_some())
                .ok_or_else(|| {
                    Error::checkpoint(
                        ckpt.path(),
                        "missing token embedding: neither paligemma.lm_head.weight nor language_model.embed_tokens.weight",
                    )
                })?;

        let lm_q = format!("{LM}layers.0.self_attn.q_proj.weight");
        let lm_width = dim(&lm_q, 1)?;
        // One shared K/V head (multi-query attention), so k_proj's rows are the head dim.
        let head_dim = dim(&format!("{LM}layers.0.self_attn.k_proj.weight"), 0)?;
        let heads = dim(&lm_q, 0)? / head_dim.max(1);
        let ex_q = format!("{EX}model.layers.0.self_attn.q_proj.weight");
        let action_dim = dim("action_in_proj.weight", 1)?;

        let cameras = json.map(|j| j.camera_names()).filter(|c| !c.is_empty()).unwrap_or_else(|| {
            ["observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb", "observation.images.right_wrist_0_rgb"]
                .map(String::from)
                .to_vec()
        });

        let config = Config {
            vision_width,
            vision_layers: count_layers(&format!("{VT}encoder.layers.")),
            vision_heads,
            vision_mlp: dim(&format!("{VT}encoder.layers.0.mlp.fc1.weight"), 0)?,
            patch,
            image_size: side * patch,
            lm_width,
            lm_layers: count_layers(&format!("{LM}layers.")),
            heads,
            head_dim,
            lm_mlp: dim(&format!("{LM}layers.0.mlp.gate_proj.weight"), 0)?,
            vocab: dim(&embedding_tensor, 0)?,
            expert_width: dim(&ex_q, 1)?,
            expert_layers: count_layers(&format!("{EX}model.layers.")),
            expert_mlp: dim(&format!("{EX}model.layers.0.mlp.gate_proj.weight"), 0)?,
            action_dim,
            horizon: json.and_then(|j| j.chunk_size).unwrap_or(50),
            denoise_steps: json.and_then(|j| j.num_inference_steps).unwrap_or(10),
            prompt_len: json.and_then(|j| j.tokenizer_max_length).unwrap_or(200),
            cameras,
            state_dim: json.and_then(|j| j.feature_dim("STATE")),
            robot_action_dim: json.and_then(|j| j.feature_dim("ACTION")),
            embedding_tensor,
        };
        if config.lm_layers != config.expert_layers {
            return Err(Error::checkpoint(
                ckpt.path(),
                format!(
                    "the prefix LM has {} layers and the expert {}; Pi0.5 pairs them one to one",
                    config.lm_layers, config.expert_layers
                ),
            ));
        }
        if config.heads * config.head_dim == 0 || config.vision_width % config.vision_heads != 0 {
            return Err(Error::checkpoint(ckpt.path(), format!("inconsistent attention sizes: {config:?}")));
        }
        if let Some(a) = config.robot_action_dim.filter(|&a| a > action_dim) {
            return Err(Error::checkpoint(
                ckpt.path(),
                format!("config.json action dim {a} exceeds the model's action width {action_dim}"),
            ));
        }
        Ok(config)
    }

    /// Every tensor the checkpoint must hold, with its shape.
    pub fn expected(&self) -> Expected {
        let mut e = Expected::default();
        let (v, l, x, hd, nh) = (self.vision_width, self.lm_width, self.expert_width, self.head_dim, self.heads);
        e.tensor(format!("{VT}embeddings.patch_embedding.weight"), &[v, 3, self.patch, self.patch]);
        e.tensor(format!("{VT}embeddings.patch_embedding.bias"), &[v]);
        e.tensor(format!("{VT}embeddings.position_embedding.weight"), &[self.tokens_per_image(), v]);
        for i in 0..self.vision_layers {
            let p = format!("{VT}encoder.layers.{i}.");
            for n in ["layer_norm1", "layer_norm2"] {
                e.tensor(format!("{p}{n}.weight"), &[v]);
                e.tensor(format!("{p}{n}.bias"), &[v]);
            }
            for n in ["q", "k", "v", "out"] {
                e.tensor(format!("{p}self_attn.{n}_proj.weight"), &[v, v]);
                e.tensor(format!("{p}self_attn.{n}_proj.bias"), &[v]);
            }
            e.tensor(format!("{p}mlp.fc1.weight"), &[self.vision_mlp, v]);
            e.tensor(format!("{p}mlp.fc1.bias"), &[self.vision_mlp]);
            e.tensor(format!("{p}mlp.fc2.weight"), &[v, self.vision_mlp]);
            e.tensor(format!("{p}mlp.fc2.bias"), &[v]);
        }
        e.tensor(format!("{VT}post_layernorm.weight"), &[v]);
        e.tensor(format!("{VT}post_layernorm.bias"), &[v]);
        e.tensor(format!("{P}multi_modal_projector.linear.weight"), &[l, v]);
        e.tensor(format!("{P}multi_modal_projector.linear.bias"), &[l]);
        e.tensor(self.embedding_tensor.clone(), &[self.vocab, l]);
        // The tied copy of the embedding may be present too; the final LM norm is unused at inference.
        for name in [
            format!("{P}language_model.embed_tokens.weight"),
            "paligemma_with_expert.paligemma.lm_head.weight".into(),
            format!("{LM}norm.weight"),
            format!("{EX}lm_head.weight"),
        ] {
            if name != self.embedding_tensor {
                e.ignore(name);
            }
        }
        let decoder = |e: &mut Expected, p: String, w: usize, mlp: usize, ada: bool| {
            e.tensor(format!("{p}self_attn.q_proj.weight"), &[nh * hd, w]);
            e.tensor(format!("{p}self_attn.k_proj.weight"), &[hd, w]);
            e.tensor(format!("{p}self_attn.v_proj.weight"), &[hd, w]);
            e.tensor(format!("{p}self_attn.o_proj.weight"), &[w, nh * hd]);
            e.tensor(format!("{p}mlp.gate_proj.weight"), &[mlp, w]);
            e.tensor(format!("{p}mlp.up_proj.weight"), &[mlp, w]);
            e.tensor(format!("{p}mlp.down_proj.weight"), &[w, mlp]);
            for n in ["input_layernorm", "post_attention_layernorm"] {
                if ada {
                    e.tensor(format!("{p}{n}.dense.weight"), &[3 * w, w]);
                    e.tensor(format!("{p}{n}.dense.bias"), &[3 * w]);
                } else {
                    e.tensor(format!("{p}{n}.weight"), &[w]);
                }
            }
        };
        for i in 0..self.lm_layers {
            decoder(&mut e, format!("{LM}layers.{i}."), l, self.lm_mlp, false);
        }
        for i in 0..self.expert_layers {
            decoder(&mut e, format!("{EX}model.layers.{i}."), x, self.expert_mlp, true);
        }
        e.tensor(format!("{EX}model.norm.dense.weight"), &[3 * x, x]);
        e.tensor(format!("{EX}model.norm.dense.bias"), &[3 * x]);
        e.tensor("action_in_proj.weight", &[x, self.action_dim]);
        e.tensor("action_in_proj.bias", &[x]);
        e.tensor("action_out_proj.weight", &[self.action_dim, x]);
        e.tensor("action_out_proj.bias", &[self.action_dim]);
        for n in ["time_mlp_in", "time_mlp_out"] {
            e.tensor(format!("{n}.weight"), &[x, x]);
            e.tensor(format!("{n}.bias"), &[x]);
        }
        e
    }
}

/// The parts of lerobot's `config.json` the runtime reads. Unknown fields are ignored.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct LerobotConfig {
    pub chunk_size: Option<usize>,
    pub n_action_steps: Option<usize>,
    pub num_inference_steps: Option<usize>,
    pub max_state_dim: Option<usize>,
    pub max_action_dim: Option<usize>,
    pub tokenizer_max_length: Option<usize>,
    /// FlashRT extension for checkpoints whose SigLIP heads are not 72 wide.
    pub vision_num_heads: Option<usize>,
    #[serde(default)]
    pub normalization_mapping: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub input_features: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub output_features: serde_json::Map<String, serde_json::Value>,
}

impl LerobotConfig {
    /// Normalization modes from `normalization_mapping` (pi05 default: quantiles for both).
    pub fn modes(&self) -> Modes {
        let mode = |key: &str, default: Mode| match self.normalization_mapping.get(key).and_then(|v| v.as_str()) {
            Some("MEAN_STD") => Mode::MeanStd,
            Some("QUANTILES") => Mode::Quantile,
            _ => default,
        };
        let d = Modes::default();
        Modes { state: mode("STATE", d.state), action: mode("ACTION", d.action) }
    }

    /// Camera feature names (type VISUAL) in the order config.json lists them.
    pub fn camera_names(&self) -> Vec<String> {
        self.features().filter(|(_, t, _)| *t == "VISUAL").map(|(n, _, _)| n.to_string()).collect()
    }

    fn features(&self) -> impl Iterator<Item = (&str, &str, Option<usize>)> {
        self.input_features.iter().chain(&self.output_features).map(|(name, f)| {
            let ty = f.get("type").and_then(|t| t.as_str()).unwrap_or("");
            let last_dim = f.get("shape").and_then(|s| s.as_array()).and_then(|s| s.last()).and_then(|d| d.as_u64()).map(|d| d as usize);
            (name.as_str(), ty, last_dim)
        })
    }

    /// Width of the first feature of this type (`STATE`, `ACTION`).
    pub fn feature_dim(&self, ty: &str) -> Option<usize> {
        self.features().find(|(_, t, _)| *t == ty).and_then(|(_, _, d)| d)
    }
}

/// The plan's prompt inputs, which [`spec::Pi05Processing`] writes each step.
#[derive(Clone, Copy, Debug)]
pub struct PromptInputs {
    pub tokens: BufId,
    pub token_mask: BufId,
}

/// A Pi0.5 plan ready for a backend: the plan, its weights and its host inputs and outputs.
pub struct Built {
    pub plan: Plan,
    pub weights: Vec<WeightData>,
    pub io: IoSpec,
    pub prompt: PromptInputs,
}

/// Open-time choices that shape the plan.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    pub cameras: usize,
    pub max_frame_width: usize,
    pub max_frame_height: usize,
    pub out_action_dim: usize,
    /// Action unnormalization as `x · scale + offset` per action column.
    pub action_scale: Vec<f32>,
    pub action_offset: Vec<f32>,
    /// Build the prefix once per prompt bucket ([`PROMPT_BUCKETS`] below the prompt capacity, and
    /// the capacity), so a step costs what its prompt needs (see `Plan::prompt_buckets`).
    pub prompt_buckets: bool,
    /// Guide the sampler by real-time chunking ([`crate::rtc`]).
    pub rtc: Option<RtcConfig>,
}

/// The flow time of denoise step `s` of `steps`; lerobot: `1 + step·dt` in f64, cast to f32.
fn flow_time(s: usize, steps: usize) -> f32 {
    (1.0 + s as f64 * (-1.0 / steps as f64)) as f32
}

/// The smaller prompt buckets (slot counts) a plan gets when they are below its prompt capacity.
pub const PROMPT_BUCKETS: [usize; 3] = [32, 64, 128];

/// `y = W x + b` for one vector (load-time precomputation only).
fn linear(w: &[f32], b: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks(x.len()).zip(b).map(|(row, b)| row.iter().zip(x).map(|(w, x)| w * x).sum::<f32>() + b).collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The adaRMS conditioning vector for flow time `t` (lerobot `embed_suffix` + time MLP):
/// sin/cos features over periods 4e-3 … 4 computed in f64 then cast, two SiLU-activated layers.
fn time_condition(t: f32, width: usize, w_in: (&[f32], &[f32]), w_out: (&[f32], &[f32])) -> Vec<f32> {
    let half = width / 2;
    let mut emb = vec![0.0f32; width];
    for i in 0..half {
        let fraction = if half > 1 { i as f64 / (half - 1) as f64 } else { 0.0 };
        let period = 4e-3 * (4.0f64 / 4e-3).powf(fraction);
        let arg = 1.0 / period * 2.0 * std::f64::consts::PI * t as f64;
        emb[i] = arg.sin() as f32;
        emb[half + i] = arg.cos() as f32;
    }
    let hidden: Vec<f32> = linear(w_in.0, w_in.1, &emb).into_iter().map(silu).collect();
    linear(w_out.0, w_out.1, &hidden).into_iter().map(silu).collect()
}

/// Checks the checkpoint, loads and folds the weights, and builds the plan.
pub fn build(ckpt: &Checkpoint, c: &Config, opts: &BuildOptions, progress: &dyn Fn(usize)) -> Result<Built> {
    c.expected().check(ckpt)?;
    let ld = Loader { ckpt, progress };
    let (cams, tpi) = (opts.cameras, c.tokens_per_image());
    let (vw, lw, ew, hd, nh) = (c.vision_width, c.lm_width, c.expert_width, c.head_dim, c.heads);
    let (horizon, ad) = (c.horizon, c.action_dim);
    let prefix = c.prefix_len(cams);
    let kv_rows = prefix + horizon;
    let vrows = cams * tpi;
    let patch_dim = 3 * c.patch * c.patch;

    let mut plan = Plan::default();
    let mut weights: Vec<WeightData> = Vec::new();
    let mut add = |plan: &mut Plan, name: String, role: WeightRole, data: WeightData| -> WeightId {
        weights.push(data);
        plan.weight(name, role)
    };
    let matrix = |n: usize, k: usize| WeightRole::Matrix { n, k };

    // Host inputs and outputs, declared in the order the backends lay them out.
    let (frames, frame_info) = IoSpec::frame_ports(&mut plan, cams, opts.max_frame_width, opts.max_frame_height);
    let frame_stride = frames.len() / cams;
    let tokens = Port::declare(&mut plan, "tokens", BufType::I32, &[c.prompt_len], HostIo::Input);
    let token_mask = Port::declare(&mut plan, "token_mask", BufType::I32, &[c.prompt_len], HostIo::Input);
    let prompt = PromptInputs { tokens: tokens.buf, token_mask: token_mask.buf };
    let io = IoSpec {
        noise: Port::declare(&mut plan, "noise", BufType::F32, &[horizon, ad], HostIo::Input),
        actions: Port::declare(&mut plan, "actions", BufType::F32, &[horizon, opts.out_action_dim], HostIo::Output),
        frames,
        frame_info,
        model_inputs: vec![tokens, token_mask],
        square_frames: false,
        rtc: opts.rtc.map(|config| RtcPorts::declare(&mut plan, config, horizon, None)),
    };
    let noise = View { buf: io.noise.buf, offset: 0, rows: horizon, cols: ad, stride: ad };
    let valid = plan.buffer("valid", BufType::F32, kv_rows);
    let positions = plan.buffer("positions", BufType::I32, kv_rows);
    let xt = plan.matrix("x_t", horizon, ad);

    // Prompt buckets: powers of two from 32 below the capacity, then the capacity.
    let buckets: Vec<usize> = if opts.prompt_buckets {
        PROMPT_BUCKETS.iter().copied().filter(|&b| b < c.prompt_len).chain([c.prompt_len]).collect()
    } else {
        vec![c.prompt_len]
    };
    if buckets.len() > 1 {
        plan.prompt_buckets = buckets.clone();
    }

    plan.phase("inputs");
    plan.push(Op::Copy { src: noise, dst: xt });
    plan.push(Op::Positions {
        frame_info: io.frame_info.buf,
        cameras: cams,
        tokens_per_image: tpi,
        token_mask: prompt.token_mask,
        prompt_len: c.prompt_len,
        suffix: horizon,
        valid,
        positions,
    });
    if !plan.prompt_buckets.is_empty() {
        plan.push(Op::PromptBucket { token_mask: prompt.token_mask });
    }

    // ---- Vision tower, all cameras batched: [cams · 256, width].
    plan.phase("vision");
    // Patch rows padded with zero columns (never written) to a multiple of 64: 588 = 3·14·14
    // bf16 values make rows that are not 16-byte aligned, and cuBLASLt then picks a kernel 4×
    // slower for the patch embedding.
    let patch_cols = patch_dim.next_multiple_of(64);
    let patches = plan.matrix("patches", vrows, patch_cols);
    let vx = plan.matrix("vision_x", vrows, vw);
    let vh = plan.matrix("vision_h", vrows, vw);
    let vqkv = plan.matrix("vision_qkv", vrows, 3 * vw);
    let vatt = plan.matrix("vision_attn", vrows, vw);
    let vmlp = plan.matrix("vision_mlp", vrows, c.vision_mlp);
    let vout = plan.matrix("vision_features", vrows, vw);
    let vision = siglip::Activations { x: vx, h: vh, qkv: vqkv, attn: vatt, mlp: vmlp };
    for cam in 0..cams {
        plan.push(Op::ImagePatches {
            camera: cam,
            frames: io.frames.buf,
            frame_stride,
            frame_info: io.frame_info.buf,
            size: c.image_size,
            patch: c.patch,
            out: patches.rows(cam * tpi, tpi).cols(0, patch_dim),
        });
    }
    let conv_w = ld.get(&format!("{VT}embeddings.patch_embedding.weight"));
    let padded_w =
        conv_w.chunks(patch_dim).flat_map(|row| row.iter().copied().chain(std::iter::repeat_n(0.0, patch_cols - patch_dim))).collect();
    let patch_w = add(&mut plan, "vision.patch_embedding".into(), matrix(vw, patch_cols), WeightData::Dense(padded_w));
    // The conv bias is folded into the position table: one add instead of two.
    let mut table = ld.get(&format!("{VT}embeddings.position_embedding.weight"));
    let conv_bias = ld.get(&format!("{VT}embeddings.patch_embedding.bias"));
    for row in table.chunks_mut(vw) {
        row.iter_mut().zip(&conv_bias).for_each(|(t, b)| *t += b);
    }
    let pos_table = add(&mut plan, "vision.position_embedding+bias".into(), WeightRole::Vector, WeightData::Dense(table));
    plan.push(Op::Gemm { a: patches, w: patch_w, bias: None, out: vx, accumulate: false });
    plan.push(Op::AddTable { x: vx, table: pos_table, table_rows: tpi });
    for i in 0..c.vision_layers {
        let p = format!("{VT}encoder.layers.{i}.");
        let mut vec = |plan: &mut Plan, name: &str| {
            add(plan, format!("vision.{i}.{name}"), WeightRole::Vector, WeightData::Dense(ld.get(&format!("{p}{name}"))))
        };
        let ln1 = (vec(&mut plan, "layer_norm1.weight"), vec(&mut plan, "layer_norm1.bias"));
        let ln2 = (vec(&mut plan, "layer_norm2.weight"), vec(&mut plan, "layer_norm2.bias"));
        let o_b = vec(&mut plan, "self_attn.out_proj.bias");
        let fc1_b = vec(&mut plan, "mlp.fc1.bias");
        let fc2_b = vec(&mut plan, "mlp.fc2.bias");
        let qkv_names: Vec<String> = ["q", "k", "v"].iter().map(|n| format!("{p}self_attn.{n}_proj.weight")).collect();
        let qkv_w = add(&mut plan, format!("vision.{i}.qkv"), matrix(3 * vw, vw), ld.rows(&qkv_names, None));
        let qkv_bias: Vec<String> = ["q", "k", "v"].iter().map(|n| format!("{p}self_attn.{n}_proj.bias")).collect();
        let qkv_b = add(&mut plan, format!("vision.{i}.qkv_bias"), WeightRole::Vector, WeightData::Dense(ld.stacked(&qkv_bias)));
        let o_w = add(&mut plan, format!("vision.{i}.out_proj"), matrix(vw, vw), ld.rows(&[format!("{p}self_attn.out_proj.weight")], None));
        let fc1 = add(&mut plan, format!("vision.{i}.fc1"), matrix(c.vision_mlp, vw), ld.rows(&[format!("{p}mlp.fc1.weight")], None));
        let fc2 = add(&mut plan, format!("vision.{i}.fc2"), matrix(vw, c.vision_mlp), ld.rows(&[format!("{p}mlp.fc2.weight")], None));
        let layer =
            siglip::EncoderLayer { norm1: ln1, qkv: (qkv_w, qkv_b), out: (o_w, o_b), norm2: ln2, fc1: (fc1, fc1_b), fc2: (fc2, fc2_b) };
        siglip::encoder_layer(&mut plan, &layer, &vision, c.vision_heads, cams, EPS);
    }
    let post = (
        add(
            &mut plan,
            "vision.post_layernorm.weight".into(),
            WeightRole::Vector,
            WeightData::Dense(ld.get(&format!("{VT}post_layernorm.weight"))),
        ),
        add(
            &mut plan,
            "vision.post_layernorm.bias".into(),
            WeightRole::Vector,
            WeightData::Dense(ld.get(&format!("{VT}post_layernorm.bias"))),
        ),
    );
    plan.push(Op::LayerNorm { x: vx, out: vout, affine: Some(post), modulation: None, eps: EPS });

    // ---- Prefix: projected image tokens, then scaled prompt embeddings; the LM fills the K/V cache.
    let embed = plan.matrix("prefix_embed", prefix, lw);
    let x = plan.matrix("prefix_x", prefix, lw);
    let h = plan.matrix("prefix_h", prefix, lw);
    let qkv = plan.matrix("prefix_qkv", prefix, (nh + 2) * hd);
    let att = plan.matrix("prefix_attn", prefix, nh * hd);
    let gate_up = plan.matrix("prefix_gate_up", prefix, 2 * c.lm_mlp);
    let mlp = plan.matrix("prefix_mlp", prefix, c.lm_mlp);
    let caches: Vec<(View, View)> = (0..c.lm_layers.max(c.expert_layers))
        .map(|i| (plan.matrix(format!("k_cache.{i}"), kv_rows, hd), plan.matrix(format!("v_cache.{i}"), kv_rows, hd)))
        .collect();
    let proj_w = add(&mut plan, "projector".into(), matrix(lw, vw), ld.rows(&[format!("{P}multi_modal_projector.linear.weight")], None));
    let proj_b = add(
        &mut plan,
        "projector.bias".into(),
        WeightRole::Vector,
        WeightData::Dense(ld.get(&format!("{P}multi_modal_projector.linear.bias"))),
    );
    let emb = add(
        &mut plan,
        "embed_tokens".into(),
        WeightRole::Embedding { vocab: c.vocab, width: lw },
        WeightData::Checkpoint(c.embedding_tensor.clone()),
    );
    // Per LM layer: the Q/K/V weight, and (all but the last layer) O, gate/up and down.
    let mut lm_w = Vec::with_capacity(c.lm_layers);
    for i in 0..c.lm_layers {
        let p = format!("{LM}layers.{i}.");
        let in_norm: Vec<f32> = ld.get(&format!("{p}input_layernorm.weight")).iter().map(|w| 1.0 + w).collect();
        // The last layer only feeds the K/V cache: its queries, attention and MLP are never used.
        let last = i + 1 == c.lm_layers;
        let proj: &[&str] = if last { &["k", "v"] } else { &["q", "k", "v"] };
        let names: Vec<String> = proj.iter().map(|n| format!("{p}self_attn.{n}_proj.weight")).collect();
        let q_heads = if last { 0 } else { nh };
        let qkv_w = add(&mut plan, format!("lm.{i}.qkv*(1+input_norm)"), matrix((q_heads + 2) * hd, lw), ld.rows(&names, Some(in_norm)));
        let rest = (!last).then(|| {
            let post_norm: Vec<f32> = ld.get(&format!("{p}post_attention_layernorm.weight")).iter().map(|w| 1.0 + w).collect();
            let o_w =
                add(&mut plan, format!("lm.{i}.o_proj"), matrix(lw, nh * hd), ld.rows(&[format!("{p}self_attn.o_proj.weight")], None));
            let gu_names = [format!("{p}mlp.gate_proj.weight"), format!("{p}mlp.up_proj.weight")];
            let gu_w =
                add(&mut plan, format!("lm.{i}.gate_up*(1+post_norm)"), matrix(2 * c.lm_mlp, lw), ld.rows(&gu_names, Some(post_norm)));
            let down =
                add(&mut plan, format!("lm.{i}.down_proj"), matrix(lw, c.lm_mlp), ld.rows(&[format!("{p}mlp.down_proj.weight")], None));
            (o_w, gu_w, down)
        });
        lm_w.push(gemma::DecoderLayer { qkv: qkv_w, q_heads, rest });
    }
    // The prefix for the first `slots` prompt slots (the prompt buckets below): every later slot
    // is masked, so leaving its rows out changes no valid row.
    let emit_prefix = |plan: &mut Plan, slots: usize| {
        let rows = vrows + slots;
        let (x, h, att, gate_up, mlp) = (x.rows(0, rows), h.rows(0, rows), att.rows(0, rows), gate_up.rows(0, rows), mlp.rows(0, rows));
        plan.push(Op::Gemm { a: vout, w: proj_w, bias: Some(proj_b), out: embed.rows(0, vrows), accumulate: false });
        plan.push(Op::Embed { tokens: prompt.tokens, table: emb, scale: (lw as f32).sqrt(), out: embed.rows(vrows, slots) });
        plan.push(Op::Copy { src: embed.rows(0, rows), dst: x });
        let acts = gemma::Activations { x, h, qkv: qkv.rows(0, rows), attn: att, gate_up, mlp };
        for (layer, &(k, v)) in lm_w.iter().zip(&caches) {
            let cache =
                gemma::CacheAttention { heads: nh, head_dim: hd, k, v, positions, valid, first_row: 0, keys: rows, mask_queries: true };
            gemma::decoder_layer(plan, layer, &acts, &cache, gemma::Conditioning::Plain, EPS);
        }
    };

    // ---- Action expert: N Euler steps over the cached prefix.
    let eh = plan.matrix("expert_x", horizon, ew);
    let en = plan.matrix("expert_h", horizon, ew);
    let eqkv = plan.matrix("expert_qkv", horizon, (nh + 2) * hd);
    let eatt = plan.matrix("expert_attn", horizon, nh * hd);
    let etmp = plan.matrix("expert_branch", horizon, ew);
    let egu = plan.matrix("expert_gate_up", horizon, 2 * c.expert_mlp);
    let emlp = plan.matrix("expert_mlp", horizon, c.expert_mlp);
    let in_w = add(&mut plan, "action_in_proj".into(), matrix(ew, ad), WeightData::Dense(ld.get("action_in_proj.weight")));
    let in_b = add(&mut plan, "action_in_proj.bias".into(), WeightRole::Vector, WeightData::Dense(ld.get("action_in_proj.bias")));
    let steps = c.denoise_steps;
    let dt = -1.0 / steps as f32;
    // x ← x + dt·(W h + b) is one accumulating GEMM with dt folded into W and b.
    let out_w = add(
        &mut plan,
        "action_out_proj*dt".into(),
        matrix(ad, ew),
        WeightData::Dense(ld.get("action_out_proj.weight").iter().map(|w| w * dt).collect()),
    );
    let out_b = add(
        &mut plan,
        "action_out_proj.bias*dt".into(),
        WeightRole::Vector,
        WeightData::Dense(ld.get("action_out_proj.bias").iter().map(|b| b * dt).collect()),
    );
    let mut layer_w = Vec::with_capacity(c.expert_layers);
    let mut dense = Vec::with_capacity(c.expert_layers);
    for i in 0..c.expert_layers {
        let p = format!("{EX}model.layers.{i}.");
        let qkv_names: Vec<String> = ["q", "k", "v"].iter().map(|n| format!("{p}self_attn.{n}_proj.weight")).collect();
        let gu_names = [format!("{p}mlp.gate_proj.weight"), format!("{p}mlp.up_proj.weight")];
        let qkv = add(&mut plan, format!("expert.{i}.qkv"), matrix((nh + 2) * hd, ew), ld.rows(&qkv_names, None));
        let rest = (
            add(&mut plan, format!("expert.{i}.o_proj"), matrix(ew, nh * hd), ld.rows(&[format!("{p}self_attn.o_proj.weight")], None)),
            add(&mut plan, format!("expert.{i}.gate_up"), matrix(2 * c.expert_mlp, ew), ld.rows(&gu_names, None)),
            add(&mut plan, format!("expert.{i}.down_proj"), matrix(ew, c.expert_mlp), ld.rows(&[format!("{p}mlp.down_proj.weight")], None)),
        );
        layer_w.push(gemma::DecoderLayer { qkv, q_heads: nh, rest: Some(rest) });
        let norm = |n: &str| (ld.get(&format!("{p}{n}.dense.weight")), ld.get(&format!("{p}{n}.dense.bias")));
        dense.push([norm("input_layernorm"), norm("post_attention_layernorm")]);
    }
    let final_dense = (ld.get(&format!("{EX}model.norm.dense.weight")), ld.get(&format!("{EX}model.norm.dense.bias")));
    let time_in = (ld.get("time_mlp_in.weight"), ld.get("time_mlp_in.bias"));
    let time_out = (ld.get("time_mlp_out.weight"), ld.get("time_mlp_out.bias"));
    // Per step: each layer's (attention, MLP) adaRMS modulation and the final norm's.
    let mut step_mods = Vec::with_capacity(steps);
    for s in 0..steps {
        let t = flow_time(s, steps);
        let cond = time_condition(t, ew, (&time_in.0, &time_in.1), (&time_out.0, &time_out.1));
        let layers: Vec<[WeightId; 2]> = (0..c.expert_layers)
            .map(|i| {
                [0, 1].map(|n| {
                    let (w, b) = &dense[i][n];
                    add(
                        &mut plan,
                        format!("expert.{i}.{}_mod@t={t}", ["attn", "mlp"][n]),
                        WeightRole::Vector,
                        WeightData::Dense(linear(w, b, &cond)),
                    )
                })
            })
            .collect();
        let final_mod = add(
            &mut plan,
            format!("expert.norm_mod@t={t}"),
            WeightRole::Vector,
            WeightData::Dense(linear(&final_dense.0, &final_dense.1, &cond)),
        );
        step_mods.push((layers, final_mod));
    }
    plan.notes.push(format!(
        "folded at load: Q/K/V and gate/up merged; (1+w) RMSNorm weights into the following GEMM; conv bias into the position table; \
         dt = {dt} into action_out_proj; time MLP and all {} adaRMS modulations precomputed for {steps} steps",
        steps * (2 * c.expert_layers + 1)
    ));
    plan.notes.push("last prefix layer computes only K/V (its queries, attention and MLP would be unused)".into());
    // Real-time chunking: the Euler step's product goes to its own buffer, the guided update
    // follows; the chunk of each step is kept for the next one to continue.
    let guide = io.rtc.clone().map(|ports| {
        let step = plan.matrix("rtc_step", horizon, ad);
        let prev = plan.matrix("rtc_previous_chunk", horizon, ad);
        plan.notes.push(format!(
            "real-time chunking ({} schedule, guidance <= {}, execution horizon {}): each Euler step guided towards \
             the previous chunk (rtc_guide), which the plan keeps",
            ports.config.schedule.name(),
            ports.config.max_guidance_weight,
            ports.config.execution_horizon
        ));
        (ports, step, prev)
    });
    let emit_step = |plan: &mut Plan, s: usize| {
        let (layer_mods, final_mod) = &step_mods[s];
        plan.push(Op::Gemm { a: xt, w: in_w, bias: Some(in_b), out: eh, accumulate: false });
        let acts = gemma::Activations { x: eh, h: en, qkv: eqkv, attn: eatt, gate_up: egu, mlp: emlp };
        for ((layer, &[attention, mlp]), &(k, v)) in layer_w.iter().zip(layer_mods).zip(&caches) {
            let cache = gemma::CacheAttention {
                heads: nh,
                head_dim: hd,
                k,
                v,
                positions,
                valid,
                first_row: prefix,
                keys: kv_rows,
                mask_queries: false,
            };
            let conditioning = gemma::Conditioning::Adaptive { attention, mlp, branch: etmp };
            gemma::decoder_layer(plan, layer, &acts, &cache, conditioning, EPS);
        }
        plan.push(Op::AdaRmsNorm { x: eh, out: en, modulation: *final_mod, eps: EPS });
        match &guide {
            None => plan.push(Op::Gemm { a: en, w: out_w, bias: Some(out_b), out: xt, accumulate: true }),
            Some((ports, step, prev)) => {
                plan.push(Op::Gemm { a: en, w: out_w, bias: Some(out_b), out: *step, accumulate: false });
                let t = flow_time(s, steps);
                plan.push(Op::RtcGuide {
                    x: xt,
                    step: *step,
                    prev: *prev,
                    weights: ports.weights.buf,
                    shift: ports.shift.buf,
                    cols: opts.out_action_dim,
                    t,
                    dt,
                    guidance: guidance_weight(t, ports.config.max_guidance_weight),
                });
            }
        }
    };

    // The prefix, and the first denoise step, once per prompt bucket (once when the plan has
    // none). The first step reads the prefix only through each layer's K/V cache, so it may run
    // beside the prefix (a GPU backend gives it a second stream), each layer as soon as that
    // layer's cache rows are filled. It is part of each bucket because a GPU backend runs a bucket
    // as one conditional body, which nothing outside can wait on layer by layer. The later steps
    // each need the one before.
    for &slots in &buckets {
        let bucket = (!plan.prompt_buckets.is_empty()).then_some(slots);
        plan.bucket_phase("prefix", false, bucket);
        emit_prefix(&mut plan, slots);
        if steps > 0 {
            plan.bucket_phase("denoise step 0", true, bucket);
            emit_step(&mut plan, 0);
        }
    }
    for s in 1..steps {
        plan.phase(format!("denoise step {s}"));
        emit_step(&mut plan, s);
    }
    if let Some((_, _, prev)) = guide {
        plan.push(Op::Copy { src: xt, dst: prev });
    }

    plan.phase("outputs");
    let scale = add(&mut plan, "action_unnorm.scale".into(), WeightRole::Vector, WeightData::Dense(opts.action_scale.clone()));
    let offset = add(&mut plan, "action_unnorm.offset".into(), WeightRole::Vector, WeightData::Dense(opts.action_offset.clone()));
    let out = View { buf: io.actions.buf, offset: 0, rows: horizon, cols: opts.out_action_dim, stride: opts.out_action_dim };
    plan.push(Op::Affine { x: xt.cols(0, opts.out_action_dim), scale, offset, out });

    Ok(Built { plan, weights, io, prompt })
}
