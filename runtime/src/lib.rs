//! FlashRT: a real-time inference runtime for vision-language-action robot policies.
//!
//! Open a checkpoint once with [`Policy::open`], set the task with [`Policy::set_prompt`], then
//! call [`Policy::step`] every control tick: camera frames and joint state in, an action chunk out,
//! with no heap allocation after the first step.

pub mod backend;
pub mod bench;
pub mod board;
pub mod byte_string;
pub mod calibration;
pub mod checkpoint;
pub mod compare;
pub mod config;
pub mod cpu;
pub mod cuda;
pub mod error;
pub mod fp8;
pub mod image;
pub mod io;
pub mod models;
pub mod observation_log;
pub mod plan;
pub mod policy;
pub mod qwen_image;
pub mod realtime;
pub mod rtc;
pub mod serve;
pub mod soak;
pub mod stats;
pub mod stream;
pub mod synthetic;
pub mod weights;

pub use backend::{BackendKind, Precision};
pub use error::{Error, Result};
pub use image::{Frame, PixelFormat};
pub use policy::{Observation, Policy, PolicyConfig, PolicyInfo, StepInfo};
pub use rtc::{Continuation, RtcConfig, RtcSchedule};
pub use stats::{LatencyStats, Summary};
pub use stream::{ActionStatus, ActionStream, ActionTick, Fallback, StreamConfig, StreamStats};
