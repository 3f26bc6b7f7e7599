//! One error type for the whole runtime. Every message names what was wrong: which file, which
//! tensor, which field, expected vs found.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint (weights, config.json, normalization statistics) is unusable.
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
    /// The tokenizer file is unusable or cannot assemble the prompt piecewise.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A caller-supplied value is wrong; `field` names it (e.g. `observation.state[3]`).
    #[error("invalid {field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// The requested backend cannot run here (no GPU, no driver, ...).
    #[error("backend: {0}")]
    Backend(String),
    /// An FP8 calibration file is unusable or was made for another checkpoint or plan.
    #[error("FP8 calibration {path}: {message}")]
    Calibration { path: PathBuf, message: String },
    /// A step failed inside the backend (a device error): what it left in its buffers is
    /// unknown, so the policy refuses every later call with this error. Drop it and open a new
    /// one. Holds the first failure's text.
    #[error("policy faulted and unusable: {0}; drop it and open a new one")]
    Faulted(String),
}

impl Error {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument { field: field.into(), message: message.into() }
    }
    pub fn checkpoint(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Checkpoint { path: path.into(), message: message.into() }
    }
}
