//! lerobot's own GR00T N1.7 fine-tune directories: what `GrootPolicy.save_pretrained` and its
//! processor pipelines' `save_pretrained` write (lerobot 0.6.1 `modeling_groot.py`,
//! `processor_groot.py`, `configuration_groot.py`):
//!
//! - `config.json`: `GrootConfig` (`type: groot`): the features, the chunk, `base_model_path`,
//!   the embodiment tag, the switches this module refuses when set (relative-action fallback,
//!   LIBERO decoding);
//! - `model.safetensors`: the weights under `_groot_model.`, f32, the tied token embedding kept
//!   only as the LM head;
//! - `policy_preprocessor.json` / `policy_postprocessor.json` and their steps' state files: the
//!   pack step (`groot_n1_7_pack_inputs_v1`: embodiment, cameras, state statistics in its state
//!   file, and the base's `raw_stats` / `modality_config`), the encode step (image transform,
//!   the tokenizer's repo) and the decode step (`groot_n1_7_action_decode_v1` with the grouped
//!   statistics, or `groot_action_unpack_unnormalize_v2` with dataset statistics in its state
//!   file).
//!
//! The directory has no backbone config and no tokenizer: lerobot takes the model config from
//! `base_model_path` and the tokenizer from the encode step's repo on the hub. They are looked
//! for in the base model's directory (a local path, relative ones against the fine-tune's
//! directory first and the working directory second), then in the Hugging Face cache.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::models::{ConfigJson, hf_cache};

use super::model::GrootJson;
use super::sidecar::{Bounds, ModalityConfig, ProcessorKwargs, Sidecars};
use super::spec::Source;

/// The base model lerobot fine-tunes by default; its config.json carries lerobot's N1.7 defaults.
const PUBLISHED_BASE: &str = "nvidia/GR00T-N1.7-3B";
const IMAGES: &str = "observation.images.";

/// Whether `config.json` is lerobot's `GrootConfig` (a fine-tune directory).
pub fn is_fine_tune(json: &ConfigJson) -> bool {
    json.value.get("type").and_then(Value::as_str) == Some("groot")
}

#[derive(Deserialize)]
struct Feature {
    #[serde(rename = "type")]
    kind: String,
    shape: Vec<usize>,
}

/// `GrootConfig` as config.json holds it. Every field lerobot writes is named: what inference
/// reads, and (as `IgnoredAny`) what only training, devices or the hub use. A field not listed is
/// refused by name.
// Fields lerobot writes and inference does not use are named (`IgnoredAny`) so that any other
// field is refused by name.
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyJson {
    #[serde(rename = "type")]
    _kind: String,
    n_obs_steps: usize,
    input_features: BTreeMap<String, Feature>,
    output_features: BTreeMap<String, Feature>,
    chunk_size: usize,
    n_action_steps: usize,
    base_model_path: Option<String>,
    action_decode_transform: Option<String>,
    num_inference_timesteps: Option<usize>,
    use_relative_actions: bool,
    embodiment_tag: String,
    #[serde(default)]
    tokenizer_assets_repo: Option<String>,
    max_state_dim: IgnoredAny,
    max_action_dim: IgnoredAny,
    device: IgnoredAny,
    use_amp: IgnoredAny,
    use_peft: IgnoredAny,
    push_to_hub: IgnoredAny,
    repo_id: IgnoredAny,
    private: IgnoredAny,
    tags: IgnoredAny,
    license: IgnoredAny,
    pretrained_path: IgnoredAny,
    pretrained_revision: IgnoredAny,
    normalization_mapping: IgnoredAny,
    tune_llm: IgnoredAny,
    tune_visual: IgnoredAny,
    tune_projector: IgnoredAny,
    tune_diffusion_model: IgnoredAny,
    tune_vlln: IgnoredAny,
    tune_top_llm_layers: IgnoredAny,
    /// Overrides the base model's when set (lerobot's inference-time knob).
    rtc_ramp_rate: Option<f32>,
    use_flash_attention: IgnoredAny,
    relative_exclude_joints: IgnoredAny,
    optimizer_lr: IgnoredAny,
    optimizer_betas: IgnoredAny,
    optimizer_eps: IgnoredAny,
    optimizer_weight_decay: IgnoredAny,
    warmup_ratio: IgnoredAny,
    /// bf16 autocast in lerobot; the backend picks the precision here.
    use_bf16: IgnoredAny,
    model_params_fp32: IgnoredAny,
    image_size: IgnoredAny,
    lora_rank: IgnoredAny,
    lora_alpha: IgnoredAny,
    lora_dropout: IgnoredAny,
    lora_full_model: IgnoredAny,
    video_backend: IgnoredAny,
    balance_dataset_weights: IgnoredAny,
    balance_trajectory_weights: IgnoredAny,
    dataset_paths: IgnoredAny,
    output_dir: IgnoredAny,
    save_steps: IgnoredAny,
    max_steps: IgnoredAny,
    batch_size: IgnoredAny,
    dataloader_num_workers: IgnoredAny,
    report_to: IgnoredAny,
    resume: IgnoredAny,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Pipeline {
    #[allow(dead_code)]
    name: String,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    registry_name: String,
    #[serde(default)]
    config: Value,
    state_file: Option<String>,
}

/// `groot_n1_7_pack_inputs_v1`.
// Fields lerobot writes and inference does not use are named (`IgnoredAny`) so that any other
// field is refused by name.
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PackStep {
    state_horizon: usize,
    action_horizon: usize,
    valid_action_horizon: usize,
    video_horizon: Option<usize>,
    max_state_dim: usize,
    max_action_dim: usize,
    language_key: IgnoredAny,
    formalize_language: bool,
    embodiment_tag: String,
    embodiment_mapping: BTreeMap<String, usize>,
    normalize_min_max: bool,
    /// Training only.
    state_dropout_prob: IgnoredAny,
    clip_outliers: bool,
    use_percentiles: IgnoredAny,
    video_modality_keys: Option<Vec<String>>,
    raw_stats: Option<Value>,
    modality_config: Option<Value>,
}

/// `groot_n1_7_vlm_encode_v1`.
// Fields lerobot writes and inference does not use are named (`IgnoredAny`) so that any other
// field is refused by name.
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EncodeStep {
    model_name: String,
    image_crop_size: Option<[usize; 2]>,
    image_target_size: Option<[usize; 2]>,
    shortest_image_edge: Option<usize>,
    crop_fraction: Option<f64>,
    use_albumentations: bool,
    letter_box_transform: bool,
    device: IgnoredAny,
}

/// `groot_n1_7_action_decode_v1`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodeStep {
    env_action_dim: usize,
    raw_stats: Option<Value>,
    modality_config: Option<Value>,
    use_percentiles: bool,
    use_relative_action: bool,
    action_decode_transform: Option<String>,
}

/// `groot_action_unpack_unnormalize_v2`.
// Fields lerobot writes and inference does not use are named (`IgnoredAny`) so that any other
// field is refused by name.
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UnpackStep {
    env_action_dim: usize,
    normalize_min_max: bool,
    clip_normalized_action: bool,
    libero_gripper_action: bool,
    libero_gripper_binarize: IgnoredAny,
}

// Fields lerobot writes and inference does not use are named (`IgnoredAny`) so that any other
// field is refused by name.
#[allow(dead_code)]
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceStep {
    device: IgnoredAny,
    float_dtype: Option<String>,
}

/// One processor file read: its path and the steps that matter, each with its state file.
struct Steps {
    path: PathBuf,
    pack: Option<(PackStep, Option<PathBuf>)>,
    encode: Option<EncodeStep>,
    decode: Option<DecodeStep>,
    unpack: Option<(UnpackStep, Option<PathBuf>)>,
}

fn step_config<T: DeserializeOwned>(path: &Path, i: usize, step: &Step) -> Result<T> {
    T::deserialize(&step.config)
        .map_err(|e| Error::checkpoint(path, format!("step {i} ({}): {e} (a field FlashRT does not know)", step.registry_name)))
}

fn refuse(path: &Path, i: usize, step: &Step, what: String) -> Error {
    Error::checkpoint(path, format!("step {i} ({}): {what}", step.registry_name))
}

fn read_steps(dir: &Path, file: &str) -> Result<Steps> {
    let path = dir.join(file);
    let json = ConfigJson::read(&path)?.ok_or_else(|| {
        Error::checkpoint(
            dir,
            format!("missing {file}: a lerobot GR00T fine-tune keeps its processing there (`save_pretrained` of its pipeline)"),
        )
    })?;
    let pipeline: Pipeline = json.parse()?;
    let mut steps = Steps { path: path.clone(), pack: None, encode: None, decode: None, unpack: None };
    for (i, step) in pipeline.steps.iter().enumerate() {
        let state = step.state_file.as_ref().map(|f| dir.join(f));
        match step.registry_name.as_str() {
            // The caller's observation keys are renamed before the pack step; cameras are taken
            // by position here, so a rename changes nothing.
            "rename_observations_processor" | "to_batch_processor" => {}
            "device_processor" => {
                let device: DeviceStep = step_config(&path, i, step)?;
                if let Some(dtype) = device.float_dtype {
                    return Err(refuse(&path, i, step, format!("float_dtype {dtype:?} is not supported (null keeps float32)")));
                }
            }
            "relative_actions_processor" | "absolute_actions_processor" => {
                if step.config.get("enabled").and_then(Value::as_bool) != Some(false) {
                    return Err(refuse(&path, i, step, "enabled: the generic relative-action fallback is not supported".into()));
                }
            }
            "groot_n1_7_pack_inputs_v1" => steps.pack = Some((step_config(&path, i, step)?, state)),
            "groot_n1_7_vlm_encode_v1" => steps.encode = Some(step_config(&path, i, step)?),
            "groot_n1_7_action_decode_v1" => steps.decode = Some(step_config(&path, i, step)?),
            "groot_action_unpack_unnormalize_v2" => steps.unpack = Some((step_config(&path, i, step)?, state)),
            other => {
                return Err(Error::checkpoint(
                    &path,
                    format!("step {i}: processor step {other:?} is not one FlashRT runs for GR00T N1.7 (lerobot 0.6.1's steps are)"),
                ));
            }
        }
    }
    Ok(steps)
}

/// `<feature>.min` / `<feature>.max` of a step's state file.
fn bounds(steps: &Path, state_file: Option<&PathBuf>, feature: &str) -> Result<Bounds> {
    let file =
        state_file.ok_or_else(|| Error::checkpoint(steps, format!("the step holding the {feature} statistics names no state_file")))?;
    let ckpt = Checkpoint::open(file)?;
    let get = |stat: &str| {
        ckpt.get(&format!("{feature}.{stat}"))
            .map(|t| t.to_f32())
            .ok_or_else(|| Error::checkpoint(file, format!("missing {feature}.{stat} (the step's statistics)")))
    };
    let (min, max) = (get("min")?, get("max")?);
    ckpt.reads_ok()?;
    if min.len() != max.len() || min.iter().chain(&max).any(|v| !v.is_finite()) {
        return Err(Error::checkpoint(file, format!("{feature}.min / .max: {} and {} values, or not finite", min.len(), max.len())));
    }
    Ok((min, max))
}

/// The base model's directory: `base_model_path` as a local directory (a relative one against
/// the fine-tune's directory, then the working directory), else its snapshot in the Hugging Face
/// cache.
fn find_base(dir: &Path, base: &str) -> Option<PathBuf> {
    let path = Path::new(base);
    let local = if path.is_absolute() { vec![path.to_path_buf()] } else { vec![dir.join(path), path.to_path_buf()] };
    local.into_iter().find(|p| p.join("config.json").is_file()).or_else(|| hf_cache::snapshot(base))
}

/// Reads a lerobot fine-tune directory: the model config and backbone from its base, the
/// processing from its pipelines.
pub fn read(dir: &Path, json: &ConfigJson, embodiment: Option<&str>) -> Result<Source> {
    let policy: PolicyJson = json.parse()?;
    let refuse = |what: String| Err(Error::checkpoint(&json.path, what));
    if let Some(repo) = &policy.tokenizer_assets_repo {
        return refuse(format!("tokenizer_assets_repo {repo:?}: a GR00T N1.5 setting (N1.5 is not supported)"));
    }
    if policy.use_relative_actions {
        return refuse("use_relative_actions: lerobot's generic relative-action fallback is not supported".into());
    }
    if let Some(t) = &policy.action_decode_transform {
        return refuse(format!("action_decode_transform {t:?} is not supported (null decodes as the checkpoint says)"));
    }
    if policy.n_obs_steps != 1 {
        return refuse(format!("n_obs_steps {}: only 1 is supported", policy.n_obs_steps));
    }

    let base_name = policy.base_model_path.clone().unwrap_or_else(|| PUBLISHED_BASE.into());
    let base = find_base(dir, &base_name);
    let mut groot: GrootJson = match &base {
        Some(b) => ConfigJson::read(&b.join("config.json"))?.expect("found by its config.json").parse()?,
        // The published base's config.json is lerobot's N1.7 defaults, and its backbone's config
        // is built in.
        None if base_name == PUBLISHED_BASE => serde_json::from_value(serde_json::json!({})).expect("defaults"),
        None => {
            return refuse(format!(
                "base_model_path {base_name:?}: the base model (its config.json names the backbone and the DiT sizes) is neither a \
                 local directory (looked beside {} and in the working directory) nor in the Hugging Face cache ({}); download it \
                 (`huggingface-cli download {base_name}`) or set base_model_path to its directory",
                dir.display(),
                hf_cache::describe_roots()
            ));
        }
    };

    groot.rtc_ramp_rate = policy.rtc_ramp_rate.or(groot.rtc_ramp_rate);
    let pre = read_steps(dir, "policy_preprocessor.json")?;
    let post = read_steps(dir, "policy_postprocessor.json")?;
    let (pack, pack_state) = pre.pack.ok_or_else(|| Error::checkpoint(&pre.path, "no groot_n1_7_pack_inputs_v1 step"))?;
    let encode = pre.encode.ok_or_else(|| Error::checkpoint(&pre.path, "no groot_n1_7_vlm_encode_v1 step"))?;
    let bad = |what: String| Err(Error::checkpoint(&pre.path, format!("groot_n1_7_pack_inputs_v1: {what}")));
    if pack.state_horizon != 1 || pack.video_horizon.is_some_and(|h| h != 1) {
        return bad(format!("state_horizon {} / video_horizon {:?}: only 1 is supported", pack.state_horizon, pack.video_horizon));
    }
    if !pack.normalize_min_max {
        return bad("normalize_min_max false is not supported".into());
    }
    let tag = pack.embodiment_tag.as_str();
    if policy.embodiment_tag != tag {
        return refuse(format!(
            "embodiment_tag {:?} differs from the pack step's {tag:?} (policy_preprocessor.json)",
            policy.embodiment_tag
        ));
    }
    if let Some(asked) = embodiment.filter(|&e| e != tag) {
        return Err(Error::invalid("config.embodiment", format!("{asked:?}: this lerobot fine-tune was trained for embodiment {tag:?}")));
    }
    let slot = *pack.embodiment_mapping.get(tag).ok_or_else(|| {
        let known: Vec<&str> = pack.embodiment_mapping.keys().map(String::as_str).collect();
        Error::invalid(
            "config.embodiment",
            format!("embodiment {tag:?} has no slot in the pack step's embodiment_mapping ({})", known.join(", ")),
        )
    })?;
    let steps = pack.valid_action_horizon.min(pack.action_horizon).min(policy.chunk_size).min(policy.n_action_steps);
    let cameras: Vec<String> = match &pack.video_modality_keys {
        Some(keys) => keys.clone(),
        // lerobot feeds the cameras it has in name order when the checkpoint names none.
        None => policy
            .input_features
            .iter()
            .filter(|(_, f)| f.kind == "VISUAL")
            .filter_map(|(k, _)| k.strip_prefix(IMAGES))
            .map(String::from)
            .collect(),
    };
    let state = bounds(&pre.path, pack_state.as_ref(), "observation.state")?;
    let env_action_dim = policy.output_features.get("action").map_or(0, |f| f.shape.iter().product());

    let non_empty = |v: &Option<Value>| v.as_ref().filter(|v| v.as_object().is_some_and(|o| !o.is_empty())).cloned();
    let mut kwargs = ProcessorKwargs {
        modality_configs: BTreeMap::new(),
        use_percentiles: false,
        use_relative_action: false,
        clip_outliers: pack.clip_outliers,
        formalize_language: pack.formalize_language,
        image_target_size: encode.image_target_size,
        image_crop_size: encode.image_crop_size,
        shortest_image_edge: encode.shortest_image_edge,
        crop_fraction: encode.crop_fraction,
        use_albumentations: encode.use_albumentations,
        letter_box_transform: encode.letter_box_transform,
        max_action_horizon: Some(pack.action_horizon),
    };
    let mut sidecars = match (post.decode, post.unpack) {
        (Some(decode), None) => {
            let bad = |what: String| Err(Error::checkpoint(&post.path, format!("groot_n1_7_action_decode_v1: {what}")));
            if let Some(t) = decode.action_decode_transform {
                return bad(format!("action_decode_transform {t:?} is not supported"));
            }
            let (Some(stats), Some(modality)) = (non_empty(&decode.raw_stats), non_empty(&decode.modality_config)) else {
                return bad("no raw_stats / modality_config to decode with".into());
            };
            if non_empty(&pack.raw_stats).as_ref() != Some(&stats) || non_empty(&pack.modality_config).as_ref() != Some(&modality) {
                return bad("raw_stats / modality_config differ from the pack step's (policy_preprocessor.json)".into());
            }
            let modality: ModalityConfig =
                serde_json::from_value(modality).map_err(|e| Error::checkpoint(&post.path, format!("bad modality_config: {e}")))?;
            kwargs.use_percentiles = decode.use_percentiles;
            kwargs.use_relative_action = decode.use_relative_action;
            kwargs.modality_configs.insert(tag.to_string(), modality.clone());
            let mut sidecars = Sidecars::from_stats(tag, slot, kwargs, modality, &stats, &post.path, &post.path)?;
            if sidecars.action_dim() != decode.env_action_dim {
                return bad(format!("env_action_dim {} differs from the {} decoded columns", decode.env_action_dim, sidecars.action_dim()));
            }
            sidecars.set_state_bounds(state).map_err(|e| Error::checkpoint(pack_state.as_ref().unwrap_or(&pre.path), e))?;
            sidecars.action_steps = sidecars.action_steps.min(steps);
            sidecars
        }
        (None, Some((unpack, unpack_state))) => {
            let bad = |what: String| Err(Error::checkpoint(&post.path, format!("groot_action_unpack_unnormalize_v2: {what}")));
            if !unpack.normalize_min_max || !unpack.clip_normalized_action || unpack.libero_gripper_action {
                return bad("only normalize_min_max and clip_normalized_action true, libero_gripper_action false are supported".into());
            }
            let action = bounds(&post.path, unpack_state.as_ref(), "action")?;
            if action.0.len() != unpack.env_action_dim || unpack.env_action_dim != env_action_dim {
                return bad(format!(
                    "env_action_dim {} with {} action statistics for a {env_action_dim}-wide action feature",
                    unpack.env_action_dim,
                    action.0.len()
                ));
            }
            Sidecars::flat(tag, slot, kwargs, cameras.clone(), state, action, steps)
        }
        _ => {
            return Err(Error::checkpoint(
                &post.path,
                "expected one decode step: groot_n1_7_action_decode_v1 or groot_action_unpack_unnormalize_v2",
            ));
        }
    };
    sidecars.modality.video.modality_keys = cameras;

    let mut tokenizers = vec![dir.join("tokenizer.json")];
    tokenizers.extend(base.iter().map(|b| b.join("tokenizer.json")));
    tokenizers.extend(hf_cache::snapshot(&encode.model_name).map(|s| s.join("tokenizer.json")));
    Ok(Source {
        backbone_dir: base.unwrap_or_else(|| dir.to_path_buf()),
        groot,
        // A fine-tune is trained for one embodiment.
        embodiments: vec![sidecars],
        active: 0,
        denoise_steps: policy.num_inference_timesteps,
        widths: Some((pack.max_state_dim, pack.max_action_dim)),
        tokenizers,
        tokenizer_hint: format!(
            "lerobot loads it from {:?} on the hub: put that repo in the Hugging Face cache, a tokenizer.json beside the checkpoint \
             or its base, or set PolicyConfig::tokenizer",
            encode.model_name
        ),
    })
}
