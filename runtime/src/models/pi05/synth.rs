//! Random Pi0.5 checkpoints in the lerobot layout, so anyone can exercise the runtime without a
//! download: `model.safetensors` (tensor names and shapes from [`Config::expected`]), `config.json`,
//! lerobot normalization statistics and a `tokenizer.json`.
//!
//! Weights are uniform with std 0.02 (norm gains around 1), which keeps activations in range at
//! full size. The tensor data is streamed to disk, so a full-size bf16 checkpoint (7 GB) never has
//! to fit in memory twice.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Config;
use crate::error::{Error, Result};
use crate::models::synth::{RandomDtype, write_random_safetensors};

/// The committed test tokenizer (Gemma-structured BPE, 1024 ids): valid for any vocabulary ≥ 1024.
const TOKENIZER_JSON: &[u8] = include_bytes!("../../../../tests/data/tokenizer/tokenizer.json");
const CAMERAS: [&str; 3] = ["observation.images.base_0_rgb", "observation.images.left_wrist_0_rgb", "observation.images.right_wrist_0_rgb"];
const STATE_DIM: usize = 8;
const ACTION_DIM: usize = 7;
const STD: f32 = 0.02;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SynthSize {
    /// SigLIP 144×1, LM 64×2, expert 32×2, vocab 1024: about 0.6 M parameters, f32.
    Tiny,
    /// Tiny's widths and layers on 56×56 images (16 patches instead of 256): a step costs about a
    /// sixth of Tiny's, for the tests that run under valgrind or qemu, where a Tiny step costs
    /// seconds to tens of seconds. The code paths are Tiny's.
    Micro,
    /// pi05_base sizes (SigLIP So400m, Gemma 2B + 300M): 3.6 G parameters, bf16 (7.2 GB).
    Full,
}

impl SynthSize {
    pub fn config(self) -> Config {
        let embedding_tensor = "paligemma_with_expert.paligemma.lm_head.weight".to_string();
        let common = |c: Config| Config {
            cameras: CAMERAS.map(String::from).to_vec(),
            state_dim: Some(STATE_DIM),
            robot_action_dim: Some(ACTION_DIM),
            embedding_tensor,
            ..c
        };
        match self {
            SynthSize::Tiny => common(Config {
                vision_width: 144,
                vision_layers: 1,
                vision_heads: 2,
                vision_mlp: 64,
                patch: 14,
                image_size: 224,
                lm_width: 64,
                lm_layers: 2,
                heads: 8,
                head_dim: 16,
                lm_mlp: 128,
                vocab: 1024,
                expert_width: 32,
                expert_layers: 2,
                expert_mlp: 64,
                action_dim: 32,
                horizon: 50,
                denoise_steps: 10,
                prompt_len: 200,
                cameras: vec![],
                state_dim: None,
                robot_action_dim: None,
                embedding_tensor: String::new(),
            }),
            SynthSize::Micro => Config { image_size: 56, ..SynthSize::Tiny.config() },
            SynthSize::Full => common(Config {
                vision_width: 1152,
                vision_layers: 27,
                vision_heads: 16,
                vision_mlp: 4304,
                patch: 14,
                image_size: 224,
                lm_width: 2048,
                lm_layers: 18,
                heads: 8,
                head_dim: 256,
                lm_mlp: 16384,
                vocab: 257152,
                expert_width: 1024,
                expert_layers: 18,
                expert_mlp: 4096,
                action_dim: 32,
                horizon: 50,
                denoise_steps: 10,
                prompt_len: 200,
                cameras: vec![],
                state_dim: None,
                robot_action_dim: None,
                embedding_tensor: String::new(),
            }),
        }
    }

    /// Bytes of tensor data `synthesize` writes (for progress reporting).
    pub fn data_bytes(self) -> u64 {
        let values: usize = self.config().expected().tensors().map(|(_, s)| s.iter().product::<usize>()).sum();
        (values * self.dtype().1) as u64
    }

    fn dtype(self) -> (&'static str, usize) {
        match self {
            SynthSize::Tiny | SynthSize::Micro => ("F32", 4),
            SynthSize::Full => ("BF16", 2),
        }
    }
}

/// Writes a random checkpoint directory at `out` (created if missing). `progress` receives the
/// bytes written so far.
pub fn synthesize(out: &Path, size: SynthSize, seed: u64, progress: &dyn Fn(u64)) -> Result<()> {
    let io = |source| Error::Io { path: out.into(), source };
    std::fs::create_dir_all(out).map_err(io)?;
    let config = size.config();
    let tensors = config.expected().tensors().map(|(n, s)| (n.to_string(), s.to_vec())).collect::<Vec<_>>();
    write_weights(&out.join("model.safetensors"), &tensors, size, seed, progress)?;
    write_stats(out, seed)?;
    std::fs::write(out.join("tokenizer.json"), TOKENIZER_JSON).map_err(io)?;
    std::fs::write(out.join("config.json"), lerobot_config(&config)).map_err(io)?;
    Ok(())
}

/// How a tensor is initialised, from its role in the model.
fn init(name: &str) -> (f32, f32) {
    let gain = name.ends_with("norm1.weight") || name.ends_with("norm2.weight") || name.ends_with("post_layernorm.weight");
    if gain { (1.0, STD) } else { (0.0, STD) }
}

fn write_weights(path: &Path, tensors: &[(String, Vec<usize>)], size: SynthSize, seed: u64, progress: &dyn Fn(u64)) -> Result<()> {
    let dtype = match size {
        SynthSize::Tiny | SynthSize::Micro => RandomDtype::F32,
        SynthSize::Full => RandomDtype::Bf16,
    };
    write_random_safetensors(path, tensors, dtype, seed, &init, progress)
}

/// lerobot's processor state files: per feature mean/std/min/max/q01/q99.
fn write_stats(out: &Path, seed: u64) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(7));
    let mut tensors: Vec<(String, Vec<u8>, usize)> = Vec::new();
    for (feature, dim) in [("observation.state", STATE_DIM), ("action", ACTION_DIM)] {
        let center: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        let spread: Vec<f32> = (0..dim).map(|_| rng.random_range(0.2..1.0)).collect();
        let stats = [
            ("mean", center.clone()),
            ("std", spread.clone()),
            ("q01", center.iter().zip(&spread).map(|(c, s)| c - 2.0 * s).collect()),
            ("q99", center.iter().zip(&spread).map(|(c, s)| c + 2.0 * s).collect()),
            ("min", center.iter().zip(&spread).map(|(c, s)| c - 3.0 * s).collect()),
            ("max", center.iter().zip(&spread).map(|(c, s)| c + 3.0 * s).collect::<Vec<f32>>()),
        ];
        for (stat, values) in stats {
            tensors.push((format!("{feature}.{stat}"), values.iter().flat_map(|v| v.to_le_bytes()).collect(), dim));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, dim)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![*dim], d).expect("sizes match")))
        .collect();
    for file in
        ["policy_preprocessor_step_3_normalizer_processor.safetensors", "policy_postprocessor_step_0_unnormalizer_processor.safetensors"]
    {
        let path = out.join(file);
        safetensors::serialize_to_file(views.iter().map(|(n, v)| (n.as_str(), v)), None, &path)
            .map_err(|e| Error::checkpoint(&path, format!("writing statistics: {e}")))?;
    }
    Ok(())
}

fn lerobot_config(c: &Config) -> String {
    let mut inputs = serde_json::Map::new();
    for cam in &c.cameras {
        inputs.insert(cam.clone(), serde_json::json!({"type": "VISUAL", "shape": [3, c.image_size, c.image_size]}));
    }
    inputs.insert("observation.state".into(), serde_json::json!({"type": "STATE", "shape": [STATE_DIM]}));
    let config = serde_json::json!({
        "type": "pi05",
        "n_obs_steps": 1,
        "input_features": inputs,
        "output_features": {"action": {"type": "ACTION", "shape": [ACTION_DIM]}},
        "chunk_size": c.horizon,
        "n_action_steps": c.horizon,
        "max_state_dim": 32,
        "max_action_dim": c.action_dim,
        "num_inference_steps": c.denoise_steps,
        "tokenizer_max_length": c.prompt_len,
        "image_resolution": [c.image_size, c.image_size],
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"},
        "vision_num_heads": c.vision_heads,
    });
    serde_json::to_string_pretty(&config).expect("config serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;

    fn derived_config(dir: &Path) -> Config {
        let ckpt = Checkpoint::open(dir).unwrap();
        let json = crate::models::ConfigJson::read(&dir.join("config.json")).unwrap().expect("synth writes config.json");
        let derived = Config::from_checkpoint(&ckpt, Some(&json.parse().unwrap())).unwrap();
        derived.expected().check(&ckpt).unwrap();
        derived
    }

    #[test]
    fn tiny_checkpoint_round_trips_through_the_loader() {
        let dir = tempfile::tempdir().unwrap();
        synthesize(dir.path(), SynthSize::Tiny, 3, &|_| {}).unwrap();
        assert_eq!(derived_config(dir.path()), SynthSize::Tiny.config());
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let w = ckpt.get("action_in_proj.weight").unwrap().to_f32();
        let std = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
        assert!((std - STD).abs() < 0.002, "std {std}");
        // Same seed, same bytes; another seed, other bytes.
        let again = tempfile::tempdir().unwrap();
        synthesize(again.path(), SynthSize::Tiny, 3, &|_| {}).unwrap();
        let read = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
        assert_eq!(read(dir.path()), read(again.path()));
        synthesize(again.path(), SynthSize::Tiny, 4, &|_| {}).unwrap();
        assert_ne!(read(dir.path()), read(again.path()));
    }

    #[test]
    fn micro_checkpoint_has_smaller_images_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        synthesize(dir.path(), SynthSize::Micro, 3, &|_| {}).unwrap();
        let micro = derived_config(dir.path());
        assert_eq!(micro, SynthSize::Micro.config());
        assert_eq!((micro.image_size, micro.tokens_per_image()), (56, 16));
        assert_eq!(Config { image_size: 224, ..micro }, SynthSize::Tiny.config());
    }

    #[test]
    fn full_size_config_matches_pi05_base() {
        // 3,616,757,520 parameters in lerobot/pi05_base, less the expert's unused lm_head
        // (257152 × 1024) and the unused final LM norm (2048), which synth does not write.
        let c = SynthSize::Full.config();
        let written: usize = c.expected().tensors().map(|(_, s)| s.iter().product::<usize>()).sum();
        assert_eq!(written, 3_616_757_520 - 257_152 * 1024 - 2048);
    }
}
