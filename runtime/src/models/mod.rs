//! Model definitions: one folder per model. A model turns a checkpoint and the caller's choices
//! into a [`ModelSpec`] — the plan (its forward pass, described once), the weights, the io spec
//! the policy stages observations through, the model's own pre-processing and what it tells the
//! caller — so the policy and the backends run any model without naming it. [`ModelKind::detect`]
//! picks the model a checkpoint holds.

use std::path::{Path, PathBuf};

use crate::backend::Backend;
use crate::checkpoint::Checkpoint;
use crate::config::PolicyConfig;
use crate::error::{Error, Result};
use crate::io::IoSpec;
use crate::plan::Plan;
use crate::weights::WeightData;

pub mod blocks;
pub mod groot_n17;
pub mod hf_cache;
mod loader;
pub mod pi05;
pub mod synth;
mod tokenizer_json;

pub(crate) use tokenizer_json::{check_ids_fit_embedding, id_end, parse_tokenizer};

/// What a model module returns: everything a backend and the policy need to run it.
pub struct ModelSpec {
    pub plan: Plan,
    pub weights: Vec<WeightData>,
    pub io: IoSpec,
    pub processing: Box<dyn Processing>,
    pub info: ModelInfo,
}

/// What a model tells the caller about itself.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub kind: ModelKind,
    /// Camera names in the order the model sees them, one per slot.
    pub cameras: Vec<String>,
    /// Raw state values an observation carries.
    pub state_dim: usize,
    /// The action chunk `step` returns: rows and robot action columns.
    pub horizon: usize,
    pub action_dim: usize,
    pub denoise_steps: usize,
    pub prompt_capacity: usize,
    /// Parameters the runtime reads.
    pub parameters: usize,
    pub config: ModelConfig,
    /// The embodiment the steps run for (GR00T's tag), and those `set_embodiment` switches
    /// between (empty for a model without embodiments).
    pub embodiment: Option<String>,
    pub embodiments: Vec<String>,
}

/// What an embodiment switch changes of [`ModelInfo`].
#[derive(Clone, Debug)]
pub struct EmbodimentInfo {
    pub tag: String,
    pub cameras: Vec<String>,
    pub state_dim: usize,
    pub action_dim: usize,
    pub horizon: usize,
}

/// The sizes a model derived from its checkpoint, per model.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelConfig {
    Pi05(pi05::Config),
    GrootN17(groot_n17::model::Config),
}

/// A model's own work around the plan: the prompt it keeps, and the inputs it writes each step
/// from the prompt and the raw state. The policy has validated the observation before `stage`.
pub trait Processing: Send {
    /// Sets the task text; an empty or blank text is refused and the previous prompt stays.
    fn set_prompt(&mut self, text: &str) -> Result<()>;
    /// Sets the whole prompt as token ids, used as given in every step.
    fn set_prompt_tokens(&mut self, ids: &[i32]) -> Result<()>;
    /// Writes this step's model inputs (see [`IoSpec::model_inputs`]) and returns the number of
    /// valid prompt tokens. Fails before writing anything when no prompt is set. Must not allocate.
    fn stage(&mut self, state: &[f32], backend: &mut dyn Backend) -> Result<usize>;
    /// The robot's action chunk (`horizon × action_dim`) from the plan's output (`IoSpec::actions`)
    /// and the step's raw state. Must not allocate.
    fn finish(&mut self, state: &[f32], output: &[f32], actions: &mut [f32]);
    /// Switches the embodiment the next steps run for (the weights the plan selects, the
    /// statistics): not the hot path. An unknown tag is refused, naming the known ones, and the
    /// previous embodiment stays.
    fn set_embodiment(&mut self, tag: &str) -> Result<EmbodimentInfo>;
}

/// A JSON file of a checkpoint (`config.json`, a model's sidecar files), read once and parsed by
/// whoever needs it.
pub struct ConfigJson {
    pub path: PathBuf,
    pub value: serde_json::Value,
}

impl ConfigJson {
    /// `None` when there is no such file (e.g. no config.json beside a lone `.safetensors` file).
    pub fn read(path: &Path) -> Result<Option<ConfigJson>> {
        if !path.exists() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.into(), source })?;
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let value = serde_json::from_str(&text).map_err(|e| Error::checkpoint(path, format!("bad {name}: {e}")))?;
        Ok(Some(ConfigJson { path: path.into(), value }))
    }

    /// The fields a model reads, as its own struct.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(&self.value).map_err(|e| Error::checkpoint(&self.path, format!("bad config.json: {e}")))
    }
}

/// The models FlashRT runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    Pi05,
    GrootN17,
}

impl ModelKind {
    pub const ALL: [ModelKind; 2] = [ModelKind::Pi05, ModelKind::GrootN17];

    /// The model's short name (`PolicyInfo::model`, `flashrt synth --model`).
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Pi05 => "pi05",
            ModelKind::GrootN17 => "groot-n17",
        }
    }

    /// The names `config.json` gives the model: lerobot's `type`, Hugging Face's `model_type`.
    fn config_names(self) -> &'static [&'static str] {
        match self {
            ModelKind::Pi05 => &["pi05"],
            ModelKind::GrootN17 => &["Gr00tN1d7", "groot"],
        }
    }

    /// The model of a checkpoint with this `config.json`: its `type` (lerobot) or `model_type`
    /// (Hugging Face). Without a config.json (a lone `.safetensors` file) or a model field it is
    /// Pi0.5, whose loader then checks every tensor name.
    pub fn detect(json: Option<&ConfigJson>) -> Result<ModelKind> {
        let Some(json) = json else { return Ok(ModelKind::Pi05) };
        let named = ["type", "model_type"].iter().find_map(|field| json.value.get(field).map(|v| (field, v)));
        let Some((field, value)) = named else { return Ok(ModelKind::Pi05) };
        let name = value.as_str().unwrap_or_default();
        Self::ALL.into_iter().find(|kind| kind.config_names().contains(&name)).ok_or_else(|| {
            let supported: Vec<&str> = Self::ALL.iter().flat_map(|kind| kind.config_names()).copied().collect();
            Error::checkpoint(
                &json.path,
                format!("config.json `{field}` is {value}, a model FlashRT does not run; supported: {}", supported.join(", ")),
            )
        })
    }

    /// Weight-name prefixes whose products an FP8 calibration keeps in bf16 unless told
    /// otherwise: parts where FP8's error, small product by product, compounds into the actions.
    pub fn fp8_keep_bf16(self) -> &'static [&'static str] {
        match self {
            ModelKind::Pi05 => pi05::FP8_KEEP_BF16,
            ModelKind::GrootN17 => groot_n17::FP8_KEEP_BF16,
        }
    }

    /// Fewest rows a product needs to run in FP8 on the CUDA backend unless `FRT_FP8_MIN_ROWS`
    /// says otherwise: below it a quantizing launch can cost what FP8 saves; each model's bound
    /// is measured.
    pub fn fp8_min_rows(self) -> usize {
        match self {
            ModelKind::Pi05 => pi05::FP8_MIN_ROWS,
            ModelKind::GrootN17 => groot_n17::FP8_MIN_ROWS,
        }
    }

    /// Checks the checkpoint against this model, loads its weights and builds its spec.
    /// `progress` receives the bytes read as loading goes.
    pub fn open(self, ckpt: &Checkpoint, json: Option<&ConfigJson>, config: &PolicyConfig, progress: &dyn Fn(usize)) -> Result<ModelSpec> {
        match self {
            ModelKind::Pi05 => pi05::spec::open(ckpt, json, config, progress),
            ModelKind::GrootN17 => groot_n17::spec::open(ckpt, json, config, progress),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_comes_from_config_json_and_an_unknown_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        assert!(ConfigJson::read(&path).unwrap().is_none());
        assert_eq!(ModelKind::detect(None).unwrap(), ModelKind::Pi05, "no config.json");
        let detect = |json: &str| {
            std::fs::write(&path, json).unwrap();
            ModelKind::detect(ConfigJson::read(&path).unwrap().as_ref())
        };
        for json in [r#"{"type": "pi05"}"#, r#"{"chunk_size": 50}"#] {
            assert_eq!(detect(json).unwrap(), ModelKind::Pi05, "{json}");
        }
        for json in [r#"{"model_type": "Gr00tN1d7"}"#, r#"{"type": "groot"}"#] {
            assert_eq!(detect(json).unwrap(), ModelKind::GrootN17, "{json}");
        }
        for (json, named) in
            [(r#"{"type": "smolvla"}"#, r#"`type` is "smolvla""#), (r#"{"model_type": "Gr00tN1d5"}"#, r#"`model_type` is "Gr00tN1d5""#)]
        {
            let e = detect(json).unwrap_err().to_string();
            assert!(e.contains(named) && e.contains("supported: pi05, Gr00tN1d7, groot") && e.contains("config.json"), "{e}");
        }
        std::fs::write(&path, "{not json").unwrap();
        assert!(ConfigJson::read(&path).err().unwrap().to_string().contains("bad config.json"));
    }
}
