//! Random GR00T N1.7 checkpoints in the raw Hugging Face layout, so the runtime can be exercised
//! without a download: `model.safetensors` (names and shapes from [`Config::expected`]),
//! `config.json`, the sidecar files (by default one embodiment, `robot`, with relative end-effector
//! and joint action groups and an absolute gripper, and two cameras; see [`Options`]), and a
//! `tokenizer.json` (the tiny byte-level BPE of the
//! test fixture, with the Qwen-VL special tokens: valid for any vocabulary above 474 ids).
//!
//! Tiny has the test fixture's sizes (its backbone config is written beside it); Full has
//! `nvidia/GR00T-N1.7-3B`'s (Cosmos-Reason2-2B backbone, 32 DiT blocks), bf16, about 6.6 GB.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::model::{COSMOS_REASON2, Config};
use crate::error::{Error, Result};
use crate::models::synth::{RandomDtype, write_random_safetensors};

const TOKENIZER_JSON: &[u8] = include_bytes!("../../../../tests/data/groot_n17_tiny/tokenizer.json");
const TOKENIZER_CONFIG: &[u8] = include_bytes!("../../../../tests/data/groot_n17_tiny/tokenizer_config.json");
/// The tiny backbone's Qwen3-VL config (the fixture's; its token ids are the tokenizer's).
const TINY_BACKBONE: &[u8] = include_bytes!("../../../../tests/data/groot_n17_tiny/backbone/config.json");
pub const EMBODIMENT: &str = "robot";
const STD: f32 = 0.02;
/// A state group (name, width) and an action group (name, width, action config).
type StateGroup = (&'static str, usize);
type ActionGroup = (&'static str, usize, &'static str);
/// The groups of the first synthesized embodiment.
const STATE_GROUPS: [StateGroup; 2] = [("eef_pose", 9), ("joints", 6)];
const ACTION_GROUPS: [ActionGroup; 3] = [
    ("eef_pose", 9, r#"{"rep": "relative", "type": "eef", "format": "xyz+rot6d", "state_key": "eef_pose"}"#),
    ("joints", 6, r#"{"rep": "relative", "type": "non_eef", "format": "default", "state_key": "joints"}"#),
    ("gripper", 1, r#"{"rep": "absolute", "type": "non_eef", "format": "default"}"#),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Tiny,
    Full,
}

impl Size {
    pub fn config(self) -> Config {
        let tiny = Config {
            vision_width: 64,
            vision_layers: 4,
            vision_heads: 4,
            vision_mlp: 128,
            patch: 16,
            position_side: 8,
            deepstack: vec![0, 1, 3],
            merged_width: 64,
            lm_width: 64,
            lm_layers: 4,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            lm_mlp: 128,
            vocab: 1024,
            rope_theta: 5e6,
            mrope_sections: [6, 5, 5],
            rms_eps: 1e-6,
            vl_layers: 2,
            vl_heads: 4,
            dit_layers: 4,
            dit_heads: 4,
            dit_width: 64,
            dit_out: 48,
            state_width: 16,
            action_width: 16,
            horizon: 6,
            action_positions: 16,
            embodiments: 4,
            denoise_steps: 4,
            timestep_buckets: 1000,
            text_every: 2,
            rtc_ramp_rate: 6.0,
            embedding_in_lm_head: false,
        };
        match self {
            Size::Tiny => tiny,
            Size::Full => Config {
                vision_width: 1024,
                vision_layers: 24,
                vision_heads: 16,
                vision_mlp: 4096,
                position_side: 48,
                deepstack: vec![5, 11, 17],
                merged_width: 2048,
                lm_width: 2048,
                lm_layers: 16,
                heads: 16,
                kv_heads: 8,
                head_dim: 128,
                lm_mlp: 6144,
                vocab: 151_936,
                mrope_sections: [24, 20, 20],
                vl_layers: 4,
                vl_heads: 32,
                dit_layers: 32,
                dit_heads: 32,
                dit_width: 1536,
                dit_out: 1024,
                state_width: 132,
                action_width: 132,
                horizon: 40,
                action_positions: 1024,
                embodiments: 32,
                ..tiny
            },
        }
    }

    /// Bytes of tensor data `synthesize` writes.
    pub fn data_bytes(self) -> u64 {
        let values: usize = self.config().expected().tensors().map(|(_, s)| s.iter().product::<usize>()).sum();
        (values * if self == Size::Tiny { 4 } else { 2 }) as u64
    }
}

/// Norm gains start around 1, everything else around 0.
fn init(name: &str) -> (f32, f32) {
    let gain = ["norm1.weight", "norm2.weight", "norm3.weight", "norm.weight", "layernorm.weight", "vlln.weight"]
        .iter()
        .any(|n| name.ends_with(n));
    if gain { (1.0, STD) } else { (0.0, STD) }
}

/// What a synthesized checkpoint's sidecar files describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Cameras of every embodiment: `front`, `wrist`, then `camera_2`, ...
    pub cameras: usize,
    /// Embodiments with statistics: [`EMBODIMENT`] (slot 1) with end-effector and joint groups,
    /// then `robot_2`, `robot_3`, ... (slots 2, 3, ...) with joint groups of other widths.
    pub embodiments: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { cameras: 2, embodiments: 1 }
    }
}

/// Writes a random checkpoint directory at `out` (created if missing) with the default
/// [`Options`]: two cameras, one embodiment.
pub fn synthesize(out: &Path, size: Size, seed: u64, progress: &dyn Fn(u64)) -> Result<()> {
    synthesize_with(out, size, &Options::default(), seed, progress)
}

/// [`synthesize`] with the cameras and embodiments of `options`.
pub fn synthesize_with(out: &Path, size: Size, options: &Options, seed: u64, progress: &dyn Fn(u64)) -> Result<()> {
    let c = size.config();
    if options.cameras == 0 {
        return Err(Error::invalid("--cameras", "a GR00T checkpoint needs at least one camera"));
    }
    if !(1..=c.embodiments).contains(&options.embodiments) {
        return Err(Error::invalid("--embodiments", format!("{}: 1 to the model's {} slots", options.embodiments, c.embodiments)));
    }
    let io = |source| Error::Io { path: out.into(), source };
    std::fs::create_dir_all(out).map_err(io)?;
    let tensors: Vec<(String, Vec<usize>)> = c.expected().tensors().map(|(n, s)| (n.to_string(), s.to_vec())).collect();
    let dtype = if size == Size::Tiny { RandomDtype::F32 } else { RandomDtype::Bf16 };
    write_random_safetensors(&out.join("model.safetensors"), &tensors, dtype, seed, &init, progress)?;
    let model_name = match size {
        Size::Tiny => {
            std::fs::create_dir_all(out.join("backbone")).map_err(io)?;
            std::fs::write(out.join("backbone/config.json"), TINY_BACKBONE).map_err(io)?;
            "backbone"
        }
        Size::Full => COSMOS_REASON2,
    };
    let config = serde_json::json!({
        "model_type": "Gr00tN1d7",
        "architectures": ["Gr00tN1d7"],
        "model_name": model_name,
        "backbone_embedding_dim": c.lm_width,
        "hidden_size": c.dit_out,
        "input_embedding_dim": c.dit_width,
        "max_state_dim": c.state_width,
        "max_action_dim": c.action_width,
        "action_horizon": c.horizon,
        "max_seq_len": c.action_positions,
        "max_num_embodiments": c.embodiments,
        "num_inference_timesteps": c.denoise_steps,
        "select_layer": c.lm_layers,
        "use_alternate_vl_dit": true,
        "attend_text_every_n_blocks": c.text_every,
        "rtc_ramp_rate": c.rtc_ramp_rate,
        "diffusion_model_cfg": {"num_layers": c.dit_layers, "num_attention_heads": c.dit_heads, "attention_head_dim": c.dit_width / c.dit_heads,
                                "output_dim": c.dit_out, "norm_type": "ada_norm", "interleave_self_attention": true},
        "vl_self_attention_cfg": {"num_layers": c.vl_layers, "num_attention_heads": c.vl_heads, "attention_head_dim": c.lm_width / c.vl_heads},
    });
    let write_json = |name: &str, value: &serde_json::Value| {
        std::fs::write(out.join(name), serde_json::to_string_pretty(value).expect("json")).map_err(io)
    };
    write_json("config.json", &config)?;
    write_sidecars(c.horizon, c.embodiments, options, seed, &write_json)?;
    std::fs::write(out.join("tokenizer.json"), TOKENIZER_JSON).map_err(io)?;
    std::fs::write(out.join("tokenizer_config.json"), TOKENIZER_CONFIG).map_err(io)
}

/// The sidecar files for `options`: per embodiment its groups (with their action configs), the
/// modality config and statistics; every embodiment has the same cameras.
fn write_sidecars(
    horizon: usize,
    slots: usize,
    options: &Options,
    seed: u64,
    write_json: &dyn Fn(&str, &serde_json::Value) -> Result<()>,
) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(11));
    let mut stats = |width: usize, steps: Option<usize>| {
        let lo: Vec<f64> = (0..width).map(|_| rng.random_range(-2.0..-0.2)).collect();
        let hi: Vec<f64> = lo.iter().map(|l| l + rng.random_range(0.5..3.0)).collect();
        let at = |f: f64| -> Vec<f64> { lo.iter().zip(&hi).map(|(l, h)| l + f * (h - l)).collect() };
        let per_step = |v: Vec<f64>| match steps {
            Some(n) => {
                serde_json::json!((0..n).map(|t| v.iter().map(|x| x * (1.0 + 0.01 * t as f64)).collect::<Vec<_>>()).collect::<Vec<_>>())
            }
            None => serde_json::json!(v),
        };
        serde_json::json!({"min": per_step(at(0.0)), "max": per_step(at(1.0)), "q01": per_step(at(0.05)), "q99": per_step(at(0.95)),
                           "mean": per_step(at(0.5)), "std": per_step(at(0.25))})
    };
    let cameras: Vec<String> = (0..options.cameras).map(camera_name).collect();
    let (mut all_stats, mut modalities, mut ids) = (serde_json::Map::new(), serde_json::Map::new(), serde_json::Map::new());
    for k in 0..options.embodiments {
        // The first embodiment has an end-effector; the others only joints, each of its own width.
        let joints = 6 + k;
        let (state_groups, action_groups): (Vec<StateGroup>, Vec<ActionGroup>) = if k == 0 {
            (STATE_GROUPS.to_vec(), ACTION_GROUPS.to_vec())
        } else {
            (vec![("joints", joints)], vec![("joints", joints, ACTION_GROUPS[1].2), ACTION_GROUPS[2]])
        };
        let state: serde_json::Map<String, serde_json::Value> =
            state_groups.iter().map(|&(g, w)| (g.to_string(), stats(w, None))).collect();
        let action: serde_json::Map<String, serde_json::Value> =
            action_groups.iter().map(|&(g, w, _)| (g.to_string(), stats(w, None))).collect();
        let relative: serde_json::Map<String, serde_json::Value> = action_groups
            .iter()
            .filter(|(_, _, cfg)| cfg.contains("relative"))
            .map(|&(g, w, _)| (g.to_string(), stats(w, Some(horizon))))
            .collect();
        let configs: Vec<serde_json::Value> =
            action_groups.iter().map(|(_, _, cfg)| serde_json::from_str(cfg).expect("literal JSON")).collect();
        let tag = embodiment_tag(k);
        all_stats.insert(tag.clone(), serde_json::json!({"state": state, "action": action, "relative_action": relative}));
        modalities.insert(
            tag.clone(),
            serde_json::json!({
                "video": {"modality_keys": cameras, "delta_indices": [0]},
                "state": {"modality_keys": state_groups.iter().map(|g| g.0).collect::<Vec<_>>(), "delta_indices": [0]},
                "action": {"modality_keys": action_groups.iter().map(|g| g.0).collect::<Vec<_>>(),
                           "delta_indices": (0..horizon).collect::<Vec<_>>(), "action_configs": configs},
                "language": {"modality_keys": ["annotation.human.task_description"], "delta_indices": [0]},
            }),
        );
        ids.insert(tag, serde_json::json!((1 + k) % slots));
    }
    ids.insert("new_embodiment".into(), serde_json::json!(10));
    write_json("statistics.json", &serde_json::Value::Object(all_stats))?;
    let kwargs = serde_json::json!({
        "modality_configs": modalities,
        "use_percentiles": true, "use_relative_action": true, "clip_outliers": true, "formalize_language": true,
        "image_target_size": [256, 256], "image_crop_size": [230, 230], "use_albumentations": false, "letter_box_transform": false,
        "max_action_horizon": horizon,
    });
    write_json("processor_config.json", &serde_json::json!({"processor_kwargs": kwargs}))?;
    write_json("embodiment_id.json", &serde_json::Value::Object(ids))
}

/// The tag of synthesized embodiment `k`: [`EMBODIMENT`], then `robot_2`, `robot_3`, ...
pub fn embodiment_tag(k: usize) -> String {
    if k == 0 { EMBODIMENT.to_string() } else { format!("{EMBODIMENT}_{}", k + 1) }
}

/// Camera `i`'s name: `front`, `wrist`, then `camera_2`, ...
fn camera_name(i: usize) -> String {
    match i {
        0 => "front".into(),
        1 => "wrist".into(),
        _ => format!("camera_{i}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::models::ConfigJson;

    #[test]
    fn a_synthesized_tiny_checkpoint_derives_the_config_it_was_written_from() {
        let dir = tempfile::tempdir().unwrap();
        synthesize(dir.path(), Size::Tiny, 3, &|_| {}).unwrap();
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let json = ConfigJson::read(&dir.path().join("config.json")).unwrap().unwrap();
        let derived = Config::from_checkpoint(&ckpt, &json.parse().unwrap(), dir.path()).unwrap();
        assert_eq!(derived, Size::Tiny.config());
        derived.expected().check(&ckpt).unwrap();
        // The published model's parameters without the unused LM head (spec section 3: 3,144 M).
        assert_eq!(Size::Full.config().parameter_count() / 1_000_000, 3_144, "{}", Size::Full.config().parameter_count());
    }
}
