//! Model definitions: one folder per model. Each derives its configuration from the checkpoint and
//! describes its forward pass once, as a [`crate::plan::Plan`]; [`ModelKind::detect`] picks the
//! model a checkpoint holds.

use std::path::Path;

use crate::error::{Error, Result};

pub mod blocks;
pub mod pi05;

/// The models FlashRT runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    Pi05,
}

impl ModelKind {
    pub const ALL: [ModelKind; 1] = [ModelKind::Pi05];

    /// The name `config.json` gives the model (and `PolicyInfo::model` reports).
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Pi05 => "pi05",
        }
    }

    /// The model of the checkpoint whose `config.json` is `config_json`: its `type` (lerobot) or
    /// `model_type` (Hugging Face). Without a config.json (a lone `.safetensors` file) or a
    /// model field it is Pi0.5, whose loader then checks every tensor name.
    pub fn detect(config_json: &Path) -> Result<ModelKind> {
        if !config_json.exists() {
            return Ok(ModelKind::Pi05);
        }
        let text = std::fs::read_to_string(config_json).map_err(|source| Error::Io { path: config_json.into(), source })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::checkpoint(config_json, format!("bad config.json: {e}")))?;
        let named = ["type", "model_type"].iter().find_map(|field| json.get(field).map(|v| (field, v)));
        let Some((field, value)) = named else { return Ok(ModelKind::Pi05) };
        let name = value.as_str().unwrap_or_default();
        Self::ALL.into_iter().find(|kind| kind.name() == name).ok_or_else(|| {
            let supported: Vec<&str> = Self::ALL.iter().map(|kind| kind.name()).collect();
            Error::checkpoint(
                config_json,
                format!("config.json `{field}` is {value}, a model FlashRT does not run; supported: {}", supported.join(", ")),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_comes_from_config_json_and_an_unknown_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        assert_eq!(ModelKind::detect(&path).unwrap(), ModelKind::Pi05, "no config.json");
        for json in [r#"{"type": "pi05"}"#, r#"{"chunk_size": 50}"#] {
            std::fs::write(&path, json).unwrap();
            assert_eq!(ModelKind::detect(&path).unwrap(), ModelKind::Pi05, "{json}");
        }
        for (json, named) in
            [(r#"{"type": "groot"}"#, r#"`type` is "groot""#), (r#"{"model_type": "Gr00tN1d7"}"#, r#"`model_type` is "Gr00tN1d7""#)]
        {
            std::fs::write(&path, json).unwrap();
            let e = ModelKind::detect(&path).unwrap_err().to_string();
            assert!(e.contains(named) && e.contains("supported: pi05") && e.contains("config.json"), "{e}");
        }
        std::fs::write(&path, "{not json").unwrap();
        assert!(ModelKind::detect(&path).unwrap_err().to_string().contains("bad config.json"));
    }
}
