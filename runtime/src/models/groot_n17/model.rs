//! GR00T N1.7's sizes ([`Config`], from tensor shapes, `config.json` and the backbone's Qwen3-VL
//! config) and its step as one [`Plan`] ([`build`]).
//!
//! Folded at load: every resident embodiment's slice of each category-specific weight, transposed
//! to a product's layout and stacked into a table from which each step selects the active one
//! (`Op::SelectWeight`, by the `embodiment` input); the ViT position table interpolated to the 256²
//! grid and permuted to merge order; Q/K/V and gate/up merged; the timestep embedding of every
//! denoise step and every AdaLN modulation it drives; the action encoder's time features folded
//! into a per-step bias; the Euler step `dt` folded into the action decoder's last product.
//!
//! Under real-time chunking (the `ramp` schedule, [`crate::rtc`]) the sampler starts from the
//! previous chunk — the plan's own output, which it keeps between steps — and each Euler step
//! scales the velocity per row.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::checkpoint::{Checkpoint, Expected};
use crate::error::{Error, Result};
use crate::io::{IoSpec, Port, Ramp, RtcPorts};
use crate::models::ConfigJson;
use crate::models::blocks::{dit, qwen3_vl};
use crate::models::hf_cache;
use crate::models::loader::Loader;
use crate::plan::{Activation, BufId, BufType, HostIo, Op, Plan, View, WeightId, WeightRole};
use crate::qwen_image::{Filter, QwenImage};
use crate::rtc::RtcConfig;
use crate::weights::WeightData;

const VT: &str = "backbone.model.model.visual.";
const LM: &str = "backbone.model.model.language_model.";
const AH: &str = "action_head.";
/// The LM head: unused, tied to the embedding — and the only copy of it lerobot's
/// `save_pretrained` keeps (safetensors stores one name of a shared tensor).
const LM_HEAD: &str = "backbone.model.lm_head.weight";
/// The backbone the published checkpoints name; lerobot hard-codes its config.
pub const COSMOS_REASON2: &str = "nvidia/Cosmos-Reason2-2B";

/// The parts of GR00T's `config.json` the runtime reads (defaults: lerobot's N1.7 defaults).
#[derive(Clone, Debug, Deserialize)]
pub struct GrootJson {
    #[serde(default = "cosmos")]
    pub model_name: String,
    pub action_horizon: Option<usize>,
    pub num_inference_timesteps: Option<usize>,
    #[serde(default)]
    pub diffusion_model_cfg: Value,
    #[serde(default)]
    pub vl_self_attention_cfg: Value,
    pub attend_text_every_n_blocks: Option<usize>,
    pub use_alternate_vl_dit: Option<bool>,
    pub num_timestep_buckets: Option<usize>,
    pub rtc_ramp_rate: Option<f32>,
}

fn cosmos() -> String {
    COSMOS_REASON2.into()
}

/// Sizes of one GR00T N1.7 checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vision_width: usize,
    pub vision_layers: usize,
    pub vision_heads: usize,
    pub vision_mlp: usize,
    pub patch: usize,
    /// Side of the ViT's learned position grid.
    pub position_side: usize,
    pub deepstack: Vec<usize>,
    pub merged_width: usize,
    pub lm_width: usize,
    pub lm_layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub lm_mlp: usize,
    pub vocab: usize,
    pub rope_theta: f32,
    pub mrope_sections: [usize; 3],
    pub rms_eps: f32,
    pub vl_layers: usize,
    pub vl_heads: usize,
    pub dit_layers: usize,
    pub dit_heads: usize,
    /// DiT width (`input_embedding_dim`) and output width (`hidden_size`).
    pub dit_width: usize,
    pub dit_out: usize,
    pub state_width: usize,
    pub action_width: usize,
    pub horizon: usize,
    /// Rows of the action tokens' position table (`max_seq_len`).
    pub action_positions: usize,
    pub embodiments: usize,
    pub denoise_steps: usize,
    pub timestep_buckets: usize,
    pub text_every: usize,
    /// The velocity ramp's rate under real-time chunking ([`crate::rtc::ramp_strength`]).
    pub rtc_ramp_rate: f32,
    /// The token embedding is stored only as the tied LM head (a lerobot fine-tune).
    pub embedding_in_lm_head: bool,
}

/// The backbone config fields that tensor shapes do not show.
struct Backbone {
    vision_heads: usize,
    deepstack: Vec<usize>,
    theta: f32,
    sections: [usize; 3],
    eps: f32,
}

impl Backbone {
    /// From `<dir>/<model_name>/config.json` (a local backbone, as tiny test checkpoints have),
    /// Cosmos-Reason2-2B's values when the checkpoint names it, else the named model's config in
    /// the Hugging Face cache.
    fn read(dir: &Path, model_name: &str, vision_width: usize) -> Result<Backbone> {
        let local = dir.join(model_name).join("config.json");
        let cached = || hf_cache::snapshot(model_name).map(|s| s.join("config.json")).filter(|p| p.exists());
        let path = if local.exists() || model_name == COSMOS_REASON2 { local } else { cached().unwrap_or(local) };
        if model_name == COSMOS_REASON2 && !path.exists() {
            return Ok(Backbone {
                vision_heads: vision_width / 64,
                deepstack: vec![5, 11, 17],
                theta: 5e6,
                sections: [24, 20, 20],
                eps: 1e-6,
            });
        }
        let json = ConfigJson::read(&path)?.ok_or_else(|| {
            Error::checkpoint(
                dir,
                format!(
                    "config.json names backbone {model_name:?}: expected its Qwen3-VL config at {} or in the Hugging Face cache ({})",
                    path.display(),
                    hf_cache::describe_roots()
                ),
            )
        })?;
        let v = &json.value;
        let bad = |what: &str| Error::checkpoint(&path, format!("missing or bad {what}"));
        let vision = &v["vision_config"];
        let text = &v["text_config"];
        let rope = if text["rope_parameters"].is_object() { &text["rope_parameters"] } else { &text["rope_scaling"] };
        let sections: Vec<usize> = rope["mrope_section"]
            .as_array()
            .ok_or_else(|| bad("text_config mrope_section"))?
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as usize))
            .collect();
        let theta = rope["rope_theta"].as_f64().or(text["rope_theta"].as_f64()).ok_or_else(|| bad("text_config rope_theta"))?;
        Ok(Backbone {
            vision_heads: vision["num_heads"].as_u64().ok_or_else(|| bad("vision_config num_heads"))? as usize,
            deepstack: vision["deepstack_visual_indexes"]
                .as_array()
                .ok_or_else(|| bad("vision_config deepstack_visual_indexes"))?
                .iter()
                .filter_map(|x| x.as_u64().map(|x| x as usize))
                .collect(),
            theta: theta as f32,
            sections: sections.try_into().map_err(|_| bad("text_config mrope_section (3 values)"))?,
            eps: text["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
        })
    }
}

impl Config {
    /// Every size from the checkpoint's tensors, its config.json and the backbone's config, whose
    /// `model_name` is resolved against `base` (the checkpoint's directory, or a lerobot
    /// fine-tune's base model).
    pub fn from_checkpoint(ckpt: &Checkpoint, json: &GrootJson, base: &Path) -> Result<Config> {
        let dim = |name: &str, axis: usize| -> Result<usize> {
            let shape = ckpt
                .shape(name)
                .ok_or_else(|| Error::checkpoint(ckpt.path(), format!("missing tensor {name} (needed to derive the model size)")))?;
            shape.get(axis).copied().ok_or_else(|| {
                Error::checkpoint(ckpt.path(), format!("tensor {name} has shape {shape:?}, expected at least {} dims", axis + 1))
            })
        };
        let count = |prefix: &str, leaf: &str| (0..).take_while(|i| ckpt.shape(&format!("{prefix}{i}.{leaf}")).is_some()).count();
        let vision_width = dim(&format!("{VT}patch_embed.proj.weight"), 0)?;
        let positions = dim(&format!("{VT}pos_embed.weight"), 0)?;
        let position_side = (positions as f64).sqrt() as usize;
        if position_side * position_side != positions {
            return Err(Error::checkpoint(ckpt.path(), format!("pos_embed has {positions} rows, not a square grid")));
        }
        let backbone = Backbone::read(base, &json.model_name, vision_width)?;
        let embedding_in_lm_head = ckpt.shape(&format!("{LM}embed_tokens.weight")).is_none() && ckpt.shape(LM_HEAD).is_some();
        let embedding = if embedding_in_lm_head { LM_HEAD.to_string() } else { format!("{LM}embed_tokens.weight") };
        let head_dim = dim(&format!("{LM}layers.0.self_attn.q_norm.weight"), 0)?;
        let cfg = |v: &Value, key: &str, default: usize| v.get(key).and_then(Value::as_u64).map_or(default, |x| x as usize);
        let dit_heads = cfg(&json.diffusion_model_cfg, "num_attention_heads", 32);
        let config = Config {
            vision_width,
            vision_layers: count(&format!("{VT}blocks."), "norm1.weight"),
            vision_heads: backbone.vision_heads,
            vision_mlp: dim(&format!("{VT}blocks.0.mlp.linear_fc1.weight"), 0)?,
            patch: dim(&format!("{VT}patch_embed.proj.weight"), 3)?,
            position_side,
            deepstack: backbone.deepstack,
            merged_width: dim(&format!("{VT}merger.linear_fc2.weight"), 0)?,
            lm_width: dim(&embedding, 1)?,
            lm_layers: count(&format!("{LM}layers."), "input_layernorm.weight"),
            heads: dim(&format!("{LM}layers.0.self_attn.q_proj.weight"), 0)? / head_dim.max(1),
            kv_heads: dim(&format!("{LM}layers.0.self_attn.k_proj.weight"), 0)? / head_dim.max(1),
            head_dim,
            lm_mlp: dim(&format!("{LM}layers.0.mlp.gate_proj.weight"), 0)?,
            vocab: dim(&embedding, 0)?,
            rope_theta: backbone.theta,
            mrope_sections: backbone.sections,
            rms_eps: backbone.eps,
            vl_layers: count(&format!("{AH}vl_self_attention.transformer_blocks."), "norm1.weight"),
            vl_heads: cfg(&json.vl_self_attention_cfg, "num_attention_heads", 32),
            dit_layers: count(&format!("{AH}model.transformer_blocks."), "norm1.linear.weight"),
            dit_heads,
            dit_width: dim(&format!("{AH}model.proj_out_2.weight"), 1)?,
            dit_out: dim(&format!("{AH}model.proj_out_2.weight"), 0)?,
            state_width: dim(&format!("{AH}state_encoder.layer1.W"), 1)?,
            action_width: dim(&format!("{AH}action_encoder.W1.W"), 1)?,
            horizon: json.action_horizon.unwrap_or(40),
            action_positions: dim(&format!("{AH}position_embedding.weight"), 0)?,
            embodiments: dim(&format!("{AH}state_encoder.layer1.W"), 0)?,
            denoise_steps: json.num_inference_timesteps.unwrap_or(4),
            timestep_buckets: json.num_timestep_buckets.unwrap_or(1000),
            text_every: json.attend_text_every_n_blocks.unwrap_or(2),
            rtc_ramp_rate: json.rtc_ramp_rate.unwrap_or(6.0),
            embedding_in_lm_head,
        };
        let problem = if json.use_alternate_vl_dit == Some(false) {
            Some("use_alternate_vl_dit is false: only the N1.7 AlternateVLDiT is supported".to_string())
        } else if config.heads * config.head_dim == 0 || config.kv_heads == 0 || config.heads % config.kv_heads != 0 {
            Some(format!("{} query heads over {} K/V heads of {}", config.heads, config.kv_heads, config.head_dim))
        } else if config.mrope_sections.iter().sum::<usize>() != config.head_dim / 2 {
            Some(format!("M-RoPE sections {:?} do not add up to half the head dim {}", config.mrope_sections, config.head_dim))
        } else if [config.vision_heads, config.dit_heads, config.vl_heads].contains(&0)
            || config.vision_width % config.vision_heads != 0
            || config.dit_width % config.dit_heads != 0
            || config.lm_width % config.vl_heads != 0
        {
            Some(format!("inconsistent head counts: {config:?}"))
        } else if config.text_every == 0 {
            Some("attend_text_every_n_blocks is 0: the DiT's cross-attention alternates text and image every n ≥ 1 blocks".to_string())
        } else if config.horizon > config.action_positions {
            Some(format!("action_horizon {} exceeds the {} action position rows", config.horizon, config.action_positions))
        } else if config.deepstack.iter().any(|&i| i >= config.vision_layers) || config.deepstack.len() > config.lm_layers {
            Some(format!(
                "DeepStack layers {:?} outside the {}-block ViT / {}-layer LLM",
                config.deepstack, config.vision_layers, config.lm_layers
            ))
        } else {
            None
        };
        match problem {
            Some(p) => Err(Error::checkpoint(ckpt.path(), p)),
            None => Ok(config),
        }
    }

    /// The merged tokens of one 256² image.
    pub fn tokens_per_image(&self, image: usize) -> usize {
        (image / self.patch / 2).pow(2)
    }

    /// Every tensor the checkpoint must hold, with its shape.
    pub fn expected(&self) -> Expected {
        let mut e = Expected::default();
        let (v, l, d, mw) = (self.vision_width, self.lm_width, self.dit_width, self.merged_width);
        let linear = |e: &mut Expected, name: String, out: usize, inp: usize| {
            e.tensor(format!("{name}.weight"), &[out, inp]);
            e.tensor(format!("{name}.bias"), &[out]);
        };
        let norm = |e: &mut Expected, name: String, width: usize| {
            e.tensor(format!("{name}.weight"), &[width]);
            e.tensor(format!("{name}.bias"), &[width]);
        };
        e.tensor(format!("{VT}patch_embed.proj.weight"), &[v, 3, 2, self.patch, self.patch]);
        e.tensor(format!("{VT}patch_embed.proj.bias"), &[v]);
        e.tensor(format!("{VT}pos_embed.weight"), &[self.position_side.pow(2), v]);
        for i in 0..self.vision_layers {
            let p = format!("{VT}blocks.{i}.");
            norm(&mut e, format!("{p}norm1"), v);
            norm(&mut e, format!("{p}norm2"), v);
            linear(&mut e, format!("{p}attn.qkv"), 3 * v, v);
            linear(&mut e, format!("{p}attn.proj"), v, v);
            linear(&mut e, format!("{p}mlp.linear_fc1"), self.vision_mlp, v);
            linear(&mut e, format!("{p}mlp.linear_fc2"), v, self.vision_mlp);
        }
        for (name, norm_width) in std::iter::once((format!("{VT}merger"), v))
            .chain((0..self.deepstack.len()).map(|i| (format!("{VT}deepstack_merger_list.{i}"), 4 * v)))
        {
            norm(&mut e, format!("{name}.norm"), norm_width);
            linear(&mut e, format!("{name}.linear_fc1"), 4 * v, 4 * v);
            linear(&mut e, format!("{name}.linear_fc2"), mw, 4 * v);
        }
        e.tensor(self.embedding(), &[self.vocab, l]);
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        for i in 0..self.lm_layers {
            let p = format!("{LM}layers.{i}.");
            for (n, shape) in [
                ("self_attn.q_proj", [q, l]),
                ("self_attn.k_proj", [kv, l]),
                ("self_attn.v_proj", [kv, l]),
                ("self_attn.o_proj", [l, q]),
                ("mlp.gate_proj", [self.lm_mlp, l]),
                ("mlp.up_proj", [self.lm_mlp, l]),
                ("mlp.down_proj", [l, self.lm_mlp]),
            ] {
                e.tensor(format!("{p}{n}.weight"), &shape);
            }
            for n in ["input_layernorm", "post_attention_layernorm"] {
                e.tensor(format!("{p}{n}.weight"), &[l]);
            }
            e.tensor(format!("{p}self_attn.q_norm.weight"), &[self.head_dim]);
            e.tensor(format!("{p}self_attn.k_norm.weight"), &[self.head_dim]);
        }
        // Unused at inference: the LM head (tied to the embedding) and the final norm (GR00T
        // reads the last layer's output before it).
        e.ignore(LM_HEAD);
        e.ignore(format!("{LM}norm.weight"));
        norm(&mut e, format!("{AH}vlln"), l);
        for i in 0..self.vl_layers {
            let p = format!("{AH}vl_self_attention.transformer_blocks.{i}.");
            norm(&mut e, format!("{p}norm1"), l);
            norm(&mut e, format!("{p}norm3"), l);
            for n in ["to_q", "to_k", "to_v", "to_out.0"] {
                linear(&mut e, format!("{p}attn1.{n}"), l, l);
            }
            linear(&mut e, format!("{p}ff.net.0.proj"), 4 * l, l);
            linear(&mut e, format!("{p}ff.net.2"), l, 4 * l);
        }
        let m = format!("{AH}model.");
        linear(&mut e, format!("{m}timestep_encoder.timestep_embedder.linear_1"), d, 256);
        linear(&mut e, format!("{m}timestep_encoder.timestep_embedder.linear_2"), d, d);
        for i in 0..self.dit_layers {
            let p = format!("{m}transformer_blocks.{i}.");
            let kv_in = if i % 2 == 1 { d } else { l };
            linear(&mut e, format!("{p}norm1.linear"), 2 * d, d);
            linear(&mut e, format!("{p}attn1.to_q"), d, d);
            linear(&mut e, format!("{p}attn1.to_k"), d, kv_in);
            linear(&mut e, format!("{p}attn1.to_v"), d, kv_in);
            linear(&mut e, format!("{p}attn1.to_out.0"), d, d);
            linear(&mut e, format!("{p}ff.net.0.proj"), 4 * d, d);
            linear(&mut e, format!("{p}ff.net.2"), d, 4 * d);
        }
        linear(&mut e, format!("{m}proj_out_1"), 2 * d, d);
        linear(&mut e, format!("{m}proj_out_2"), self.dit_out, d);
        let category = |e: &mut Expected, name: String, inp: usize, out: usize| {
            e.tensor(format!("{name}.W"), &[self.embodiments, inp, out]);
            e.tensor(format!("{name}.b"), &[self.embodiments, out]);
        };
        category(&mut e, format!("{AH}state_encoder.layer1"), self.state_width, self.dit_out);
        category(&mut e, format!("{AH}state_encoder.layer2"), self.dit_out, d);
        category(&mut e, format!("{AH}action_encoder.W1"), self.action_width, d);
        category(&mut e, format!("{AH}action_encoder.W2"), 2 * d, d);
        category(&mut e, format!("{AH}action_encoder.W3"), d, d);
        category(&mut e, format!("{AH}action_decoder.layer1"), self.dit_out, self.dit_out);
        category(&mut e, format!("{AH}action_decoder.layer2"), self.dit_out, self.action_width);
        e.tensor(format!("{AH}position_embedding.weight"), &[self.action_positions, d]);
        e
    }

    /// The checkpoint name of the token embedding.
    pub(crate) fn embedding(&self) -> String {
        if self.embedding_in_lm_head { LM_HEAD.to_string() } else { format!("{LM}embed_tokens.weight") }
    }

    /// Parameters the runtime reads.
    pub fn parameter_count(&self) -> usize {
        self.expected().tensors().map(|(_, shape)| shape.iter().product::<usize>()).sum()
    }
}

/// Open-time choices that shape the plan.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    pub cameras: usize,
    pub max_frame_width: usize,
    pub max_frame_height: usize,
    /// Sequence slots: the prompt's fixed tokens, the image tokens and the text capacity.
    pub slots: usize,
    pub image: QwenImage,
    /// The checkpoint slots of the embodiments whose weights stay resident, in the order the
    /// `embodiment` input (an i32 the processing writes every step) indexes them.
    pub embodiment_slots: Vec<usize>,
    /// Real-time chunking (the `ramp` schedule), for chunks of `chunk_rows` rows (what a step
    /// returns) of `robot_action_dim` columns.
    pub rtc: Option<RtcConfig>,
    pub chunk_rows: usize,
    pub robot_action_dim: usize,
}

/// The plan's inputs the GR00T processing writes each step.
#[derive(Clone, Copy, Debug)]
pub struct ModelInputs {
    pub tokens: BufId,
    pub valid: BufId,
    pub text_valid: BufId,
    pub image_valid: BufId,
    pub mrope: BufId,
    pub image_slots: BufId,
    pub vision_positions: BufId,
    pub state: BufId,
    /// Which entry of `BuildOptions::embodiment_slots` the step runs for.
    pub embodiment: BufId,
}

/// A GR00T plan ready for a backend.
pub struct Built {
    pub plan: Plan,
    pub weights: Vec<WeightData>,
    pub io: IoSpec,
    pub inputs: ModelInputs,
}

/// Slots `slots` of a category-specific weight `[embodiments, in, out]`, each transposed to a
/// product's `[out, in]`, with its bias.
fn category(ld: &Loader, name: &str, slots: &[usize]) -> Vec<(Vec<f32>, Vec<f32>)> {
    let (w, b) = (ld.get(&format!("{name}.W")), ld.get(&format!("{name}.b")));
    let shape = ld.ckpt.shape(&format!("{name}.W")).expect("checked").to_vec();
    let (inp, out) = (shape[1], shape[2]);
    slots
        .iter()
        .map(|&slot| {
            let w = &w[slot * inp * out..][..inp * out];
            let transposed = (0..out).flat_map(|o| (0..inp).map(move |i| w[i * out + o])).collect();
            (transposed, b[slot * out..][..out].to_vec())
        })
        .collect()
}

/// The embodiment-specific weights the action head's products read: each is rewritten at the
/// start of every step with the active embodiment's entry of a table of all resident ones
/// (`Op::SelectWeight`), so switching the embodiment changes an input, not the plan.
struct EmbodimentWeights {
    state1: (WeightId, WeightId),
    state2: (WeightId, WeightId),
    action1: (WeightId, WeightId),
    /// W2's half over the W1 output; its time-feature half is folded into `time_bias`.
    action2: WeightId,
    /// Per denoise step: W2's bias plus its product with that step's time features.
    time_bias: Vec<WeightId>,
    action3: WeightId,
    /// W3's bias plus the action tokens' position rows, `[horizon, width]`.
    positions_b3: WeightId,
    decoder1: (WeightId, WeightId),
    /// Scaled by the Euler step `dt`.
    decoder2: (WeightId, WeightId),
}

/// The flow time of denoise step `step` in timestep buckets, as GR00T discretizes it.
fn timestep(c: &Config, step: usize) -> f64 {
    (step as f64 / c.denoise_steps as f64 * c.timestep_buckets as f64) as usize as f64
}

/// Declares every entry of the embodiment tables (one per checkpoint slot in `slots`), the
/// weights the products read, and the ops that select entry `index[0]` into them (consecutive,
/// at the start of the state phase: one launch on the GPU).
fn embodiment_weights(
    plan: &mut Plan,
    add: &mut dyn FnMut(&mut Plan, String, WeightRole, WeightData) -> WeightId,
    ld: &Loader,
    c: &Config,
    slots: &[usize],
    index: BufId,
) -> EmbodimentWeights {
    let (dw, h) = (c.dit_width, c.horizon);
    let mut selector = Selector { index, entries: slots.len(), values: 0 };
    let mut linear =
        |plan: &mut Plan, add: &mut dyn FnMut(&mut Plan, String, WeightRole, WeightData) -> WeightId, name: &str, scale: f32| {
            let per_slot = category(ld, &format!("{AH}{name}"), slots);
            let (out, inp) = (per_slot[0].1.len(), per_slot[0].0.len() / per_slot[0].1.len());
            let scaled = |v: &[f32]| v.iter().map(|x| x * scale).collect::<Vec<f32>>();
            let weights = per_slot.iter().map(|(w, _)| scaled(w)).collect();
            let w = selector.select(plan, add, format!("{name}.slot"), Some((out, inp)), weights);
            let b = selector.select(plan, add, format!("{name}.slot.bias"), None, per_slot.iter().map(|(_, b)| scaled(b)).collect());
            (w, b)
        };
    let state1 = linear(plan, add, "state_encoder.layer1", 1.0);
    let state2 = linear(plan, add, "state_encoder.layer2", 1.0);
    let action1 = linear(plan, add, "action_encoder.W1", 1.0);
    let decoder1 = linear(plan, add, "action_decoder.layer1", 1.0);
    let decoder2 = linear(plan, add, "action_decoder.layer2", 1.0 / c.denoise_steps as f32);
    // W2 over [a | time features]: the product with `a`, and the time part in a per-step bias.
    let w2 = category(ld, &format!("{AH}action_encoder.W2"), slots);
    let w2a = w2.iter().map(|(w, _)| (0..dw).flat_map(|o| w[o * 2 * dw..][..dw].to_vec()).collect()).collect();
    let action2 = selector.select(plan, add, "action_encoder.W2.slot.actions".into(), Some((dw, dw)), w2a);
    let time_bias = (0..c.denoise_steps)
        .map(|step| {
            let tau = action_time_features(timestep(c, step), dw);
            let per_slot = w2
                .iter()
                .map(|(w, b)| {
                    (0..dw).map(|o| (b[o] as f64 + (0..dw).map(|i| tau[i] * w[o * 2 * dw + dw + i] as f64).sum::<f64>()) as f32).collect()
                })
                .collect();
            selector.select(plan, add, format!("action_encoder.time_bias.{step}"), None, per_slot)
        })
        .collect();
    let w3 = category(ld, &format!("{AH}action_encoder.W3"), slots);
    let action3 = selector.select(plan, add, "action_encoder.W3.slot".into(), Some((dw, dw)), w3.iter().map(|(w, _)| w.clone()).collect());
    // W3's bias and the action tokens' position rows, added together.
    let positions = ld.get(&format!("{AH}position_embedding.weight"));
    let positions_b3 = w3.iter().map(|(_, b)| (0..h * dw).map(|i| positions[i] + b[i % dw]).collect()).collect();
    let positions_b3 = selector.select(plan, add, "action_positions".into(), None, positions_b3);
    let values = selector.values;
    if slots.len() == 1 {
        plan.notes.push(format!(
            "embodiments: 1 resident (checkpoint slot {}), its {:.2} M embodiment-specific values read in place (no selection)",
            slots[0],
            values as f64 / 1e6
        ));
    } else {
        plan.notes.push(format!(
            "embodiments: {} resident (checkpoint slots {slots:?}), {:.2} M embodiment-specific values each, kept as a table of \
         all of them beside the copy the products read ({:.1} MiB in bf16); select_weight copies the active one's into that \
         copy at the start of every step ({:.1} MiB in bf16, {:.1} in f32)",
            slots.len(),
            values as f64 / 1e6,
            ((slots.len() + 1) * values * 2) as f64 / (1 << 20) as f64,
            (values * 2) as f64 / (1 << 20) as f64,
            (values * 4) as f64 / (1 << 20) as f64,
        ));
    }
    EmbodimentWeights { state1, state2, action1, action2, time_bias, action3, positions_b3, decoder1, decoder2 }
}

/// Declares embodiment tables and the weights their entries are selected into.
struct Selector {
    index: BufId,
    entries: usize,
    /// Values of one entry of every table so far.
    values: usize,
}

impl Selector {
    /// A weight named `name` (a `[n, k]` matrix, or a vector) rewritten each step with entry
    /// `index[0]` of a table of `per_slot`; with one embodiment resident, that entry itself (there
    /// is nothing to select, and copying it every step would cost bandwidth for nothing).
    fn select(
        &mut self,
        plan: &mut Plan,
        add: &mut dyn FnMut(&mut Plan, String, WeightRole, WeightData) -> WeightId,
        name: String,
        matrix: Option<(usize, usize)>,
        per_slot: Vec<Vec<f32>>,
    ) -> WeightId {
        let (role, table_role) = match matrix {
            Some((n, k)) => (WeightRole::Matrix { n, k }, WeightRole::MatrixStack { entries: self.entries, n, k }),
            None => (WeightRole::Vector, WeightRole::Vector),
        };
        let len = per_slot[0].len();
        self.values += len;
        if let [only] = &per_slot[..] {
            return add(plan, name, role, WeightData::Dense(only.clone()));
        }
        let table = add(plan, format!("{name}.table"), table_role, WeightData::Dense(per_slot.concat()));
        // Zero until the selection writes it, before any op reads it.
        let dst = add(plan, name, role, WeightData::Dense(vec![0.0; len]));
        plan.push(Op::SelectWeight { index: self.index, entries: self.entries, table, dst });
        dst
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `y = W x + b` for one vector, in f64 (load-time precomputation).
fn linear(w: &[f32], b: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len()).zip(b).map(|(row, &b)| row.iter().zip(x).map(|(&w, x)| w as f64 * x).sum::<f64>() + b as f64).collect()
}

/// torch.linspace(0, end, steps) in f32: the first half from the start, the rest from the end.
fn linspace(end: f32, steps: usize) -> Vec<f32> {
    let step = if steps > 1 { end / (steps - 1) as f32 } else { 0.0 };
    (0..steps).map(|i| if i < steps / 2 { step * i as f32 } else { end - step * (steps - 1 - i) as f32 }).collect()
}

/// The ViT's learned positions bilinearly resampled to a `grid × grid` patch grid
/// (`fast_pos_embed_interpolate`) and permuted into 2×2 merge order: `[grid², width]`.
fn interpolated_positions(table: &[f32], side: usize, width: usize, grid: usize) -> Vec<f32> {
    let idx = linspace((side - 1) as f32, grid);
    let mut raster = vec![0f32; grid * grid * width];
    for (r, &h) in idx.iter().enumerate() {
        for (c, &w) in idx.iter().enumerate() {
            let (hf, wf) = (h as i64 as usize, w as i64 as usize);
            let (hc, wc) = ((hf + 1).min(side - 1), (wf + 1).min(side - 1));
            let (dh, dw) = (h - hf as f32, w - wf as f32);
            let corners = [(hf, wf, (1.0 - dh) * (1.0 - dw)), (hf, wc, (1.0 - dh) * dw), (hc, wf, dh * (1.0 - dw)), (hc, wc, dh * dw)];
            let out = &mut raster[(r * grid + c) * width..][..width];
            for (k, (y, x, wt)) in corners.into_iter().enumerate() {
                for (o, &t) in out.iter_mut().zip(&table[(y * side + x) * width..][..width]) {
                    *o = if k == 0 { t * wt } else { *o + t * wt };
                }
            }
        }
    }
    merge_order(&raster, grid, width)
}

/// Raster rows of a `grid × grid` patch grid into merge order (block row, block col, sub row,
/// sub col), as the Qwen processor orders patches.
fn merge_order(raster: &[f32], grid: usize, width: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(raster.len());
    for br in 0..grid / 2 {
        for bc in 0..grid / 2 {
            for (sr, sc) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                out.extend_from_slice(&raster[((2 * br + sr) * grid + 2 * bc + sc) * width..][..width]);
            }
        }
    }
    out
}

/// diffusers `Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1)` of `t`: `[cos | sin]`.
fn timestep_features(t: f64) -> Vec<f64> {
    let half = 128;
    let freqs: Vec<f64> = (0..half).map(|i| t * (-(10_000f64.ln()) * i as f64 / (half - 1) as f64).exp()).collect();
    freqs.iter().map(|f| f.cos()).chain(freqs.iter().map(|f| f.sin())).collect()
}

/// GR00T's action-encoder time features (`SinusoidalPositionalEncoding`) of `t`: `[sin | cos]`.
fn action_time_features(t: f64, width: usize) -> Vec<f64> {
    let half = width / 2;
    let freqs: Vec<f64> = (0..half).map(|i| t * (-(10_000f64.ln()) * i as f64 / half as f64).exp()).collect();
    freqs.iter().map(|f| f.sin()).chain(freqs.iter().map(|f| f.cos())).collect()
}

/// Checks the checkpoint, loads and folds the weights, and builds the plan.
pub fn build(ckpt: &Checkpoint, c: &Config, opts: &BuildOptions, progress: &dyn Fn(usize)) -> Result<Built> {
    c.expected().check(ckpt)?;
    if let Some(slot) = opts.embodiment_slots.iter().find(|&&s| s >= c.embodiments) {
        return Err(Error::invalid("config.embodiment", format!("slot {slot} beyond the checkpoint's {} embodiments", c.embodiments)));
    }
    if opts.embodiment_slots.is_empty() {
        return Err(Error::invalid("config.embodiment", "no embodiment to run"));
    }
    let ld = Loader { ckpt, progress };
    let cams = opts.cameras;
    let grid = opts.image.target / c.patch;
    let (patches_per_image, tpi) = (grid * grid, grid * grid / 4);
    let (n, s, h, a) = (cams * patches_per_image, opts.slots, c.horizon, c.action_width);
    let (vw, lw, dw) = (c.vision_width, c.lm_width, c.dit_width);

    let mut plan = Plan::default();
    let mut weights: Vec<WeightData> = Vec::new();
    let mut add = |plan: &mut Plan, name: String, role: WeightRole, data: WeightData| -> WeightId {
        weights.push(data);
        plan.weight(name, role)
    };
    let matrix = |n: usize, k: usize| WeightRole::Matrix { n, k };
    let vector = WeightRole::Vector;
    // A checkpoint linear layer: `(weight, bias)`.
    let linear_layer = |plan: &mut Plan,
                        add: &mut dyn FnMut(&mut Plan, String, WeightRole, WeightData) -> WeightId,
                        name: &str,
                        out: usize,
                        inp: usize| {
        let w = add(plan, format!("{name}.weight"), matrix(out, inp), ld.rows(&[format!("{name}.weight")], None));
        let b = add(plan, format!("{name}.bias"), vector, WeightData::Dense(ld.get(&format!("{name}.bias"))));
        (w, b)
    };
    // A checkpoint norm's `(weight, bias)` vectors.
    let affine = |plan: &mut Plan, add: &mut dyn FnMut(&mut Plan, String, WeightRole, WeightData) -> WeightId, name: &str| {
        (
            add(plan, format!("{name}.weight"), vector, WeightData::Dense(ld.get(&format!("{name}.weight")))),
            add(plan, format!("{name}.bias"), vector, WeightData::Dense(ld.get(&format!("{name}.bias")))),
        )
    };

    // Host inputs and outputs.
    let (frames, frame_info) = IoSpec::frame_ports(&mut plan, cams, opts.max_frame_width, opts.max_frame_height);
    let frame_stride = frames.len() / cams;
    let ports = [
        ("tokens", BufType::I32, vec![s]),
        ("valid", BufType::F32, vec![s]),
        ("text_valid", BufType::F32, vec![s]),
        ("image_valid", BufType::F32, vec![s]),
        ("mrope_positions", BufType::I32, vec![3, s]),
        ("image_slots", BufType::I32, vec![cams * tpi]),
        ("vision_positions", BufType::I32, vec![2, n]),
        ("state", BufType::F32, vec![c.state_width]),
        ("embodiment", BufType::I32, vec![1]),
    ];
    let model_inputs: Vec<Port> = ports.iter().map(|(name, ty, shape)| Port::declare(&mut plan, name, *ty, shape, HostIo::Input)).collect();
    let inputs = ModelInputs {
        tokens: model_inputs[0].buf,
        valid: model_inputs[1].buf,
        text_valid: model_inputs[2].buf,
        image_valid: model_inputs[3].buf,
        mrope: model_inputs[4].buf,
        image_slots: model_inputs[5].buf,
        vision_positions: model_inputs[6].buf,
        state: model_inputs[7].buf,
        embodiment: model_inputs[8].buf,
    };
    let io = IoSpec {
        noise: Port::declare(&mut plan, "noise", BufType::F32, &[h, a], HostIo::Input),
        actions: Port::declare(&mut plan, "actions", BufType::F32, &[h, a], HostIo::Output),
        frames,
        frame_info,
        model_inputs,
        square_frames: opts.image.filter == Filter::Cv2Area && !opts.image.letterbox,
        rtc: opts
            .rtc
            .map(|config| RtcPorts::declare(&mut plan, config, h, Some(Ramp { rate: c.rtc_ramp_rate, chunk_rows: opts.chunk_rows }))),
    };

    // ---- Vision: every camera's patches, one tower over all of them (attention per image).
    plan.phase("vision");
    let patches = plan.matrix("patches", n, opts.image.patch_cols());
    for cam in 0..cams {
        plan.push(Op::QwenImagePatches {
            camera: cam,
            frames: io.frames.buf,
            frame_stride,
            frame_info: io.frame_info.buf,
            max_width: opts.max_frame_width,
            max_height: opts.max_frame_height,
            image: opts.image,
            out: patches.rows(cam * patches_per_image, patches_per_image),
        });
    }
    let vx = plan.matrix("vision_x", n, vw);
    let patch_w =
        add(&mut plan, "patch_embed".into(), matrix(vw, opts.image.patch_cols()), ld.rows(&[format!("{VT}patch_embed.proj.weight")], None));
    plan.push(Op::Gemm { a: patches, w: patch_w, bias: None, out: vx, accumulate: false });
    // The conv bias folded into the interpolated position table.
    let bias = ld.get(&format!("{VT}patch_embed.proj.bias"));
    let mut table = interpolated_positions(&ld.get(&format!("{VT}pos_embed.weight")), c.position_side, vw, grid);
    table.chunks_mut(vw).for_each(|row| row.iter_mut().zip(&bias).for_each(|(t, b)| *t += b));
    let table = add(&mut plan, "vision_positions_table".into(), vector, WeightData::Dense(table));
    plan.push(Op::AddTable { x: vx, table, table_rows: patches_per_image });

    let vision = qwen3_vl::VisionActivations {
        x: vx,
        h: plan.matrix("vision_h", n, vw),
        qkv: plan.matrix("vision_qkv", n, 3 * vw),
        k: plan.matrix("vision_k", n, vw),
        v: plan.matrix("vision_v", n, vw),
        attn: plan.matrix("vision_attn", n, vw),
        mlp: plan.matrix("vision_mlp", n, c.vision_mlp),
        positions: inputs.vision_positions,
    };
    let merged = cams * tpi;
    let merger_hidden = plan.matrix("merger_hidden", merged, 4 * vw);
    let deepstack: Vec<View> = (0..c.deepstack.len()).map(|i| plan.matrix(format!("deepstack_{i}"), merged, c.merged_width)).collect();
    let merger =
        |plan: &mut Plan, add: &mut dyn FnMut(&mut Plan, String, WeightRole, WeightData) -> WeightId, name: &str, postshuffle: bool| {
            let norm = affine(plan, add, &format!("{name}.norm"));
            let fc1 = linear_layer(plan, add, &format!("{name}.linear_fc1"), 4 * vw, 4 * vw);
            let fc2 = linear_layer(plan, add, &format!("{name}.linear_fc2"), c.merged_width, 4 * vw);
            qwen3_vl::Merger { norm, postshuffle, fc1, fc2 }
        };
    for i in 0..c.vision_layers {
        let p = format!("{VT}blocks.{i}.");
        let block = qwen3_vl::VisionBlock {
            norm1: affine(&mut plan, &mut add, &format!("{p}norm1")),
            qkv: linear_layer(&mut plan, &mut add, &format!("{p}attn.qkv"), 3 * vw, vw),
            proj: linear_layer(&mut plan, &mut add, &format!("{p}attn.proj"), vw, vw),
            norm2: affine(&mut plan, &mut add, &format!("{p}norm2")),
            fc1: linear_layer(&mut plan, &mut add, &format!("{p}mlp.linear_fc1"), c.vision_mlp, vw),
            fc2: linear_layer(&mut plan, &mut add, &format!("{p}mlp.linear_fc2"), vw, c.vision_mlp),
        };
        qwen3_vl::vision_block(&mut plan, &block, &vision, c.vision_heads, cams, 1e-6);
        if let Some(k) = c.deepstack.iter().position(|&d| d == i) {
            let m = merger(&mut plan, &mut add, &format!("{VT}deepstack_merger_list.{k}"), true);
            qwen3_vl::merger(&mut plan, &m, vx, vision.h, merger_hidden, deepstack[k], 1e-6);
        }
    }
    let image_embeds = plan.matrix("image_embeds", merged, c.merged_width);
    let m = merger(&mut plan, &mut add, &format!("{VT}merger"), false);
    qwen3_vl::merger(&mut plan, &m, vx, vision.h, merger_hidden, image_embeds, 1e-6);

    // ---- Language model over the prompt, the image embeddings in its image slots.
    plan.phase("language");
    let lx = plan.matrix("lm_x", s, lw);
    let emb =
        add(&mut plan, "embed_tokens".into(), WeightRole::Embedding { vocab: c.vocab, width: lw }, WeightData::Checkpoint(c.embedding()));
    plan.push(Op::Embed { tokens: inputs.tokens, table: emb, scale: 1.0, out: lx });
    plan.push(Op::ScatterRows { src: image_embeds, index: inputs.image_slots, dst: lx, accumulate: false });
    let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let lm = qwen3_vl::DecoderActivations {
        x: lx,
        h: plan.matrix("lm_h", s, lw),
        qkv: plan.matrix("lm_qkv", s, q + 2 * kv),
        k: plan.matrix("lm_k", s, kv),
        v: plan.matrix("lm_v", s, kv),
        attn: plan.matrix("lm_attn", s, q),
        gate_up: plan.matrix("lm_gate_up", s, 2 * c.lm_mlp),
        mlp: plan.matrix("lm_mlp", s, c.lm_mlp),
    };
    let attention = qwen3_vl::DecoderAttention {
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        theta: c.rope_theta,
        sections: c.mrope_sections,
        positions: inputs.mrope,
        valid: inputs.valid,
    };
    for i in 0..c.lm_layers {
        let p = format!("{LM}layers.{i}.");
        let dense = |plan: &mut Plan, add: &mut dyn FnMut(&mut Plan, String, WeightRole, WeightData) -> WeightId, n: &str| {
            add(plan, format!("{p}{n}"), vector, WeightData::Dense(ld.get(&format!("{p}{n}"))))
        };
        let names = |ns: &[&str]| ns.iter().map(|n| format!("{p}{n}.weight")).collect::<Vec<_>>();
        let layer = qwen3_vl::DecoderLayer {
            input_norm: dense(&mut plan, &mut add, "input_layernorm.weight"),
            qkv: add(
                &mut plan,
                format!("{p}qkv"),
                matrix(q + 2 * kv, lw),
                ld.rows(&names(&["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]), None),
            ),
            q_norm: dense(&mut plan, &mut add, "self_attn.q_norm.weight"),
            k_norm: dense(&mut plan, &mut add, "self_attn.k_norm.weight"),
            o: add(&mut plan, format!("{p}o"), matrix(lw, q), ld.rows(&names(&["self_attn.o_proj"]), None)),
            post_norm: dense(&mut plan, &mut add, "post_attention_layernorm.weight"),
            gate_up: add(
                &mut plan,
                format!("{p}gate_up"),
                matrix(2 * c.lm_mlp, lw),
                ld.rows(&names(&["mlp.gate_proj", "mlp.up_proj"]), None),
            ),
            down: add(&mut plan, format!("{p}down"), matrix(lw, c.lm_mlp), ld.rows(&names(&["mlp.down_proj"]), None)),
        };
        qwen3_vl::decoder_layer(&mut plan, &layer, &lm, &attention, c.rms_eps);
        if let Some(&ds) = deepstack.get(i) {
            plan.push(Op::ScatterRows { src: ds, index: inputs.image_slots, dst: lx, accumulate: true });
        }
    }

    // ---- VL adapter: LayerNorm, then self-attention over the valid tokens.
    plan.phase("vl adapter");
    let vl = plan.matrix("vl_embeds", s, lw);
    let vlln = affine(&mut plan, &mut add, &format!("{AH}vlln"));
    plan.push(Op::LayerNorm { x: lx, out: vl, affine: Some(vlln), modulation: None, eps: 1e-5 });
    let (vl_h, vl_qkv, vl_attn, vl_ff) =
        (plan.matrix("vl_h", s, lw), plan.matrix("vl_qkv", s, 3 * lw), plan.matrix("vl_attn", s, lw), plan.matrix("vl_ff", s, 4 * lw));
    // Merged Q/K/V of a diffusers attention: weights stacked by rows, biases end to end.
    let qkv_of =
        |plan: &mut Plan, add: &mut dyn FnMut(&mut Plan, String, WeightRole, WeightData) -> WeightId, p: &str, width: usize, inp: usize| {
            let names = |part: &str| ["to_q", "to_k", "to_v"].map(|n| format!("{p}attn1.{n}.{part}"));
            let w = add(plan, format!("{p}attn1.qkv"), matrix(3 * width, inp), ld.rows(&names("weight"), None));
            (w, add(plan, format!("{p}attn1.qkv.bias"), vector, WeightData::Dense(ld.stacked(&names("bias")))))
        };
    for i in 0..c.vl_layers {
        let p = format!("{AH}vl_self_attention.transformer_blocks.{i}.");
        let block = dit::Block {
            norm1: {
                let (g, b) = affine(&mut plan, &mut add, &format!("{p}norm1"));
                dit::Norm::Affine(g, b)
            },
            keys: dit::Keys::Own { qkv_weights: qkv_of(&mut plan, &mut add, &p, lw, lw), qkv: vl_qkv, valid: Some(inputs.valid) },
            out: linear_layer(&mut plan, &mut add, &format!("{p}attn1.to_out.0"), lw, lw),
            norm3: Some(affine(&mut plan, &mut add, &format!("{p}norm3"))),
            ff1: linear_layer(&mut plan, &mut add, &format!("{p}ff.net.0.proj"), 4 * lw, lw),
            ff2: linear_layer(&mut plan, &mut add, &format!("{p}ff.net.2"), lw, 4 * lw),
        };
        dit::block(&mut plan, &block, vl, vl_h, vl_attn, vl_ff, c.vl_heads, 1e-5);
    }
    // The cross-attention blocks' keys and values of the VL embeddings: once per step, not per
    // denoise step, and as one product (every block's K and V weights stacked by rows).
    let m = format!("{AH}model.");
    let cross_blocks: Vec<usize> = (0..c.dit_layers).step_by(2).collect();
    let kv_names = |part: &str| -> Vec<String> {
        cross_blocks.iter().flat_map(|i| ["to_k", "to_v"].map(|n| format!("{m}transformer_blocks.{i}.attn1.{n}.{part}"))).collect()
    };
    let kv_width = 2 * cross_blocks.len() * dw;
    let kv_w = add(&mut plan, "dit_cross_kv".into(), matrix(kv_width, lw), ld.rows(&kv_names("weight"), None));
    let kv_b = add(&mut plan, "dit_cross_kv.bias".into(), vector, WeightData::Dense(ld.stacked(&kv_names("bias"))));
    let cross_kv = plan.matrix("dit_cross_kv", s, kv_width);
    plan.push(Op::Gemm { a: vl, w: kv_w, bias: Some(kv_b), out: cross_kv, accumulate: false });
    let cross: Vec<(View, View, BufId)> = cross_blocks
        .iter()
        .enumerate()
        .map(|(j, &i)| {
            // Text and special tokens every `2 · text_every` blocks, image tokens in the others.
            let valid = if i % (2 * c.text_every) == 0 { inputs.text_valid } else { inputs.image_valid };
            (cross_kv.cols(2 * j * dw, dw), cross_kv.cols((2 * j + 1) * dw, dw), valid)
        })
        .collect();

    // ---- Action head: the state token, then the denoise steps.
    plan.phase("state");
    let rows = 1 + h;
    let sa = plan.matrix("dit_x", rows, dw);
    let state_in = View { buf: inputs.state, offset: 0, rows: 1, cols: c.state_width, stride: c.state_width };
    let EmbodimentWeights {
        state1: (s1, s1b),
        state2: (s2, s2b),
        action1: (ae_w1, ae_b1w),
        action2: ae_w2a,
        time_bias,
        action3: ae_w3,
        positions_b3,
        decoder1: (dec1, dec1b),
        decoder2: (dec2, dec2b),
    } = embodiment_weights(&mut plan, &mut add, &ld, c, &opts.embodiment_slots, inputs.embodiment);
    let state_h = plan.matrix("state_h", 1, c.dit_out);
    plan.push(Op::Gemm { a: state_in, w: s1, bias: Some(s1b), out: state_h, accumulate: false });
    plan.push(Op::Activation { x: state_h, kind: Activation::Relu });
    let state_features = plan.matrix("state_features", 1, dw);
    plan.push(Op::Gemm { a: state_h, w: s2, bias: Some(s2b), out: state_features, accumulate: false });
    let xt = plan.matrix("x_t", h, a);
    let chunk = View { buf: io.actions.buf, offset: 0, rows: h, cols: a, stride: a };
    plan.push(Op::Copy { src: View { buf: io.noise.buf, offset: 0, rows: h, cols: a, stride: a }, dst: xt });
    // Real-time chunking: the first rows start from the previous chunk (the output, which only
    // the last op writes), and the decoder's product goes to its own buffer for the Euler step.
    let rtc = io.rtc.as_ref().map(|ports| {
        plan.push(Op::RtcPrefix { x: xt, prev: chunk, prefix: ports.shift.buf, cols: opts.robot_action_dim });
        plan.notes.push(format!(
            "real-time chunking (ramp, execution horizon {}, rate {}): the sampler starts from the previous chunk \
             (rtc_prefix), each Euler step scales the velocity per row (rtc_euler)",
            ports.config.execution_horizon, c.rtc_ramp_rate
        ));
        (ports.weights.buf, plan.matrix("rtc_step", h, a))
    });

    // Per-step constants: the timestep embedding and what it drives.
    let (w1, b1) = (
        ld.get(&format!("{m}timestep_encoder.timestep_embedder.linear_1.weight")),
        ld.get(&format!("{m}timestep_encoder.timestep_embedder.linear_1.bias")),
    );
    let (w2, b2) = (
        ld.get(&format!("{m}timestep_encoder.timestep_embedder.linear_2.weight")),
        ld.get(&format!("{m}timestep_encoder.timestep_embedder.linear_2.bias")),
    );
    let block_mods: Vec<(Vec<f32>, Vec<f32>)> = (0..c.dit_layers)
        .map(|i| {
            (
                ld.get(&format!("{m}transformer_blocks.{i}.norm1.linear.weight")),
                ld.get(&format!("{m}transformer_blocks.{i}.norm1.linear.bias")),
            )
        })
        .collect();
    let (po1w, po1b) = (ld.get(&format!("{m}proj_out_1.weight")), ld.get(&format!("{m}proj_out_1.bias")));

    let (ae1, ae2) = (plan.matrix("action_enc_1", h, dw), plan.matrix("action_enc_2", h, dw));
    let (d_h, d_qkv, d_q, d_attn, d_ff) = (
        plan.matrix("dit_h", rows, dw),
        plan.matrix("dit_qkv", rows, 3 * dw),
        plan.matrix("dit_q", rows, dw),
        plan.matrix("dit_attn", rows, dw),
        plan.matrix("dit_ff", rows, 4 * dw),
    );
    let (d_out, dec_h) = (plan.matrix("dit_out", rows, c.dit_out), plan.matrix("decoder_h", h, c.dit_out));
    let out2 = linear_layer(&mut plan, &mut add, &format!("{m}proj_out_2"), c.dit_out, dw);
    // Each DiT block's attention (its own rows, or the VL embeddings' keys and values) and its
    // output and feed-forward products; the modulation is per step.
    let dit_blocks: Vec<(dit::Keys, [(WeightId, WeightId); 3])> = (0..c.dit_layers)
        .map(|i| {
            let p = format!("{m}transformer_blocks.{i}.");
            let keys = if i % 2 == 1 {
                dit::Keys::Own { qkv_weights: qkv_of(&mut plan, &mut add, &p, dw, dw), qkv: d_qkv, valid: None }
            } else {
                let (k, v, valid) = cross[i / 2];
                dit::Keys::Cross { q_weights: linear_layer(&mut plan, &mut add, &format!("{p}attn1.to_q"), dw, dw), q: d_q, k, v, valid }
            };
            let products = [
                linear_layer(&mut plan, &mut add, &format!("{p}attn1.to_out.0"), dw, dw),
                linear_layer(&mut plan, &mut add, &format!("{p}ff.net.0.proj"), 4 * dw, dw),
                linear_layer(&mut plan, &mut add, &format!("{p}ff.net.2"), dw, 4 * dw),
            ];
            (keys, products)
        })
        .collect();

    for (step, &time_bias) in time_bias.iter().enumerate() {
        plan.phase(format!("denoise step {step}"));
        let t = timestep(c, step);
        let temb = linear(&w2, &b2, &linear(&w1, &b1, &timestep_features(t)).into_iter().map(silu).collect::<Vec<_>>());
        let temb_silu: Vec<f64> = temb.iter().copied().map(silu).collect();
        // Action encoder: W1, then W2 with this step's time features as a bias, swish, W3.
        // The DiT's rows: the state token, then the action tokens (its residual stream is rebuilt
        // every step).
        plan.push(Op::Copy { src: state_features, dst: sa.rows(0, 1) });
        plan.push(Op::Gemm { a: xt, w: ae_w1, bias: Some(ae_b1w), out: ae1, accumulate: false });
        plan.push(Op::Gemm { a: ae1, w: ae_w2a, bias: Some(time_bias), out: ae2, accumulate: false });
        plan.push(Op::Activation { x: ae2, kind: Activation::Silu });
        plan.push(Op::Gemm { a: ae2, w: ae_w3, bias: None, out: sa.rows(1, h), accumulate: false });
        plan.push(Op::AddTable { x: sa.rows(1, h), table: positions_b3, table_rows: h });
        for (i, &(keys, [out, ff1, ff2])) in dit_blocks.iter().enumerate() {
            let (mw, mb) = &block_mods[i];
            let modulation: Vec<f32> = linear(mw, mb, &temb_silu).into_iter().map(|v| v as f32).collect();
            let modulation = add(&mut plan, format!("dit_{i}.modulation.{step}"), vector, WeightData::Dense(modulation));
            let block = dit::Block { norm1: dit::Norm::Modulated(modulation), keys, out, norm3: None, ff1, ff2 };
            dit::block(&mut plan, &block, sa, d_h, d_attn, d_ff, c.dit_heads, 1e-5);
        }
        // Output: (shift, scale) from the timestep, as [scale | shift] for the LayerNorm.
        let shift_scale = linear(&po1w, &po1b, &temb_silu);
        let modulation: Vec<f32> = shift_scale[dw..].iter().chain(&shift_scale[..dw]).map(|&v| v as f32).collect();
        let modulation = add(&mut plan, format!("dit_out.modulation.{step}"), vector, WeightData::Dense(modulation));
        plan.push(Op::LayerNorm { x: sa, out: d_h, affine: None, modulation: Some(modulation), eps: 1e-6 });
        plan.push(Op::Gemm { a: d_h, w: out2.0, bias: Some(out2.1), out: d_out, accumulate: false });
        // The decoder on the action rows; its last product (scaled by dt) is the Euler step.
        plan.push(Op::Gemm { a: d_out.rows(1, h), w: dec1, bias: Some(dec1b), out: dec_h, accumulate: false });
        plan.push(Op::Activation { x: dec_h, kind: Activation::Relu });
        match rtc {
            None => plan.push(Op::Gemm { a: dec_h, w: dec2, bias: Some(dec2b), out: xt, accumulate: true }),
            Some((strength, step)) => {
                plan.push(Op::Gemm { a: dec_h, w: dec2, bias: Some(dec2b), out: step, accumulate: false });
                plan.push(Op::RtcEuler { x: xt, step, strength });
            }
        }
    }
    plan.phase("outputs");
    plan.push(Op::Copy { src: xt, dst: chunk });
    Ok(Built { plan, weights, io, inputs })
}
