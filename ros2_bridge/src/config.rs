//! Node configuration: a TOML file (see `ros2_bridge/examples/flashrt_ros2.toml`) with command-line
//! flags layered on top. Every field has a default except the checkpoint and the camera topics;
//! [`Config::check`] rejects inconsistent settings before any DDS entity exists.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use flashrt::observation_log::Recorder;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("invalid {field}: {message}")]
    Invalid { field: &'static str, message: String },
}

fn invalid(field: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field, message: message.into() }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub node: NodeConfig,
    pub policy: PolicySection,
    /// One entry per policy camera, in the policy's camera order (`flashrt inspect` lists it).
    pub cameras: Vec<CameraConfig>,
    pub joint_states: JointStatesConfig,
    pub prompt: PromptConfig,
    pub output: OutputConfig,
    pub timing: TimingConfig,
    pub inputs: InputChecks,
    pub qos: QosConfig,
    pub realtime: RealtimeSection,
    /// `output.mode = "stream"`: the action stream's settings.
    pub stream: StreamSection,
}

/// What the node publishes (`output.mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// One inference per replan period, each chunk published whole (trajectory + array).
    #[default]
    Chunk,
    /// An action stream (`flashrt::ActionStream`): one action per control tick, inference on its
    /// own thread whenever the current chunk runs low.
    Stream,
}

/// `stream.fallback`: what a control tick publishes when the next chunk is late.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackKind {
    /// Repeat the last action.
    #[default]
    Hold,
    /// Continue the last action's velocity, decaying to zero over `stream.decelerate_ticks`.
    Decelerate,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamSection {
    /// Control rate: one action published per tick. Default: `timing.control_rate_hz` (the rate
    /// the policy's chunks are meant to be executed at).
    pub rate_hz: Option<f64>,
    /// Request the next chunk when this many actions or fewer are left; default half the horizon.
    pub refill_at: Option<usize>,
    pub fallback: FallbackKind,
    /// `fallback = "decelerate"`: ticks over which the velocity decays to zero.
    pub decelerate_ticks: usize,
}

impl Default for StreamSection {
    fn default() -> Self {
        StreamSection { rate_hz: None, refill_at: None, fallback: FallbackKind::Hold, decelerate_ticks: 10 }
    }
}

/// Real-time setup of the inference thread (`flashrt::realtime`), applied once the policy is
/// open. Each refusal (missing capability or limit) stops the node with the reason.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RealtimeSection {
    /// `mlockall`: keep every page of the process in RAM (CAP_IPC_LOCK or RLIMIT_MEMLOCK).
    pub lock_memory: bool,
    /// SCHED_FIFO priority 1-99 of the inference thread (CAP_SYS_NICE or RLIMIT_RTPRIO).
    pub fifo_priority: Option<i32>,
    /// CPUs the inference thread may run on (e.g. cores isolated with `isolcpus`).
    pub cpus: Vec<usize>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    pub name: String,
    /// Namespace for relative topic names (`/` or `/robot1`).
    pub namespace: String,
    /// DDS domain; default `$ROS_DOMAIN_ID`, else 0.
    pub domain_id: Option<u16>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig { name: "flashrt".into(), namespace: "/".into(), domain_id: None }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicySection {
    /// Checkpoint directory (lerobot layout) or `.safetensors` file.
    pub checkpoint: PathBuf,
    /// `tokenizer.json`; default: the one beside the checkpoint.
    pub tokenizer: Option<PathBuf>,
    /// `auto`, `cpu` or `cuda`.
    pub backend: String,
    pub device: usize,
    pub seed: u64,
    pub denoise_steps: Option<usize>,
    /// GR00T: the embodiment tag; default: the checkpoint's only one.
    pub embodiment: Option<String>,
    /// Largest accepted frame; the node's frame buffers are sized for it at start.
    pub max_frame_width: u32,
    pub max_frame_height: u32,
    /// Task text used until one arrives on the prompt topic.
    pub prompt: Option<String>,
    /// Real-time chunking: Pi0.5's prefix-weight schedule (`linear`, `exp`, `ones`, `zeros`) or
    /// GR00T N1.7's `ramp`; unset: off. Each chunk is then sampled to continue the previous one.
    pub rtc: Option<String>,
    /// RTC: rows of the new chunk that continue the previous one at all.
    pub rtc_execution_horizon: usize,
    /// RTC: upper bound of the guidance weight (Pi0.5's schedules; `ramp` has no guidance).
    pub rtc_max_guidance_weight: f32,
}

impl Default for PolicySection {
    fn default() -> Self {
        PolicySection {
            checkpoint: PathBuf::new(),
            tokenizer: None,
            backend: "auto".into(),
            device: 0,
            seed: 0,
            denoise_steps: None,
            embodiment: None,
            max_frame_width: 640,
            max_frame_height: 480,
            prompt: None,
            rtc: None,
            rtc_execution_horizon: flashrt::RtcConfig::default().execution_horizon,
            rtc_max_guidance_weight: flashrt::RtcConfig::default().max_guidance_weight,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CameraConfig {
    pub topic: String,
    /// When set, frames of any other size are rejected.
    pub width: Option<u32>,
    pub height: Option<u32>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct JointStatesConfig {
    pub topic: String,
    /// Joint names in the policy's state order. When set, state values are picked from
    /// `JointState` by name (any order, extra joints ignored) and a missing name rejects the
    /// message; when empty, `position` is taken in order and must have the policy's state width.
    pub names: Vec<String>,
}

impl Default for JointStatesConfig {
    fn default() -> Self {
        JointStatesConfig { topic: "joint_states".into(), names: Vec::new() }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromptConfig {
    pub topic: String,
}

impl Default for PromptConfig {
    fn default() -> Self {
        PromptConfig { topic: "prompt".into() }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputConfig {
    pub mode: OutputMode,
    /// Stream mode: one `std_msgs/Float64MultiArray` per control tick (the action, one value per
    /// action column).
    pub action_topic: String,
    pub trajectory_topic: String,
    pub action_chunk_topic: String,
    pub health_topic: String,
    /// `JointTrajectory.joint_names`, one per action column; default `joint_0`, `joint_1`, ...
    pub joint_names: Vec<String>,
    /// `header.frame_id` of the trajectory.
    pub frame_id: String,
}

impl Default for OutputConfig {
    fn default() -> Self {
        OutputConfig {
            mode: OutputMode::Chunk,
            action_topic: "action".into(),
            trajectory_topic: "joint_trajectory".into(),
            action_chunk_topic: "action_chunk".into(),
            health_topic: "~/health".into(),
            joint_names: Vec::new(),
            frame_id: String::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingConfig {
    /// Rate at which the robot executes actions: trajectory points are `1 / control_rate_hz` apart.
    pub control_rate_hz: f64,
    /// Time between inferences (each publishes a fresh chunk).
    pub replan_period_s: f64,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig { control_rate_hz: 50.0, replan_period_s: 0.5 }
    }
}

/// What a tick does when a camera has no usable frame (never published, too old, or its latest
/// frame was rejected).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum MissingCamera {
    /// Skip the tick: no action chunk is published.
    #[default]
    Skip,
    /// Run with that camera masked (the policy sees it as absent, as lerobot does).
    Mask,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InputChecks {
    /// Frames received longer ago than this are not used.
    pub max_frame_age_s: f64,
    /// A joint state received longer ago than this skips the tick.
    pub max_state_age_s: f64,
    pub missing_camera: MissingCamera,
    /// Each kind of warning is logged at most once per interval (with a count of the suppressed).
    pub warn_interval_s: f64,
    /// Record every observation the policy steps on, with its prompt, into this observation log
    /// (`flashrt run --observations FILE` replays it); empty: off. Written by a thread of its own:
    /// the inference thread neither blocks nor allocates for it, and drops an observation
    /// (counted, logged once) when the disk falls behind.
    pub record_observations: PathBuf,
}

impl Default for InputChecks {
    fn default() -> Self {
        InputChecks {
            max_frame_age_s: 0.5,
            max_state_age_s: 0.5,
            missing_camera: MissingCamera::Skip,
            warn_interval_s: 5.0,
            record_observations: PathBuf::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Reliability {
    BestEffort,
    Reliable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    Volatile,
    TransientLocal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Qos {
    pub reliability: Reliability,
    pub durability: Durability,
    /// Keep-last depth.
    pub depth: usize,
}

impl Qos {
    /// ROS 2's `SensorDataQoS`: best effort, volatile, keep last (depth 1 here: only the latest
    /// frame matters). A best-effort reader also matches reliable writers.
    pub const SENSOR_DATA: Qos = Qos { reliability: Reliability::BestEffort, durability: Durability::Volatile, depth: 1 };
    /// ROS 2's default QoS: reliable, volatile, keep last 10.
    pub const RELIABLE: Qos = Qos { reliability: Reliability::Reliable, durability: Durability::Volatile, depth: 10 };

    pub fn profile(self) -> ros2_client::QosProfile {
        use ros2_client::qos::{Durability as D, History, WhenFull};
        let p = ros2_client::QosProfile::subscription_default().history(History::KeepLast { depth: self.depth.max(1) });
        let p = match self.reliability {
            Reliability::BestEffort => p.reliability_best_effort(),
            // A full send window drops the sample rather than stall the publisher thread: the next
            // chunk supersedes it anyway.
            Reliability::Reliable => p.reliability_reliable(WhenFull::Fail),
        };
        p.durability(match self.durability {
            Durability::Volatile => D::Volatile,
            Durability::TransientLocal => D::TransientLocal,
        })
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct QosConfig {
    pub images: Qos,
    pub joint_states: Qos,
    pub prompt: Qos,
    pub outputs: Qos,
}

impl Default for QosConfig {
    fn default() -> Self {
        QosConfig { images: Qos::SENSOR_DATA, joint_states: Qos::SENSOR_DATA, prompt: Qos::RELIABLE, outputs: Qos::RELIABLE }
    }
}

/// Command line. Flags override the file.
#[derive(Debug, Default, Parser)]
#[command(name = "flashrt-ros2", version, about = "FlashRT policy as a ROS 2 node: cameras + joint states in, action trajectories out")]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Checkpoint directory or .safetensors file.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// auto, cpu or cuda.
    #[arg(long)]
    pub backend: Option<String>,
    /// Camera image topics in the policy's camera order (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub camera_topics: Option<Vec<String>>,
    #[arg(long)]
    pub joint_states_topic: Option<String>,
    #[arg(long)]
    pub prompt_topic: Option<String>,
    /// Initial task text.
    #[arg(long)]
    pub prompt: Option<String>,
    /// chunk (a trajectory per inference) or stream (an action per control tick).
    #[arg(long)]
    pub output_mode: Option<OutputMode>,
    /// Stream mode: the per-tick action topic.
    #[arg(long)]
    pub action_topic: Option<String>,
    /// Real-time chunking schedule: linear, exp, ones or zeros (Pi0.5), ramp (GR00T N1.7).
    #[arg(long)]
    pub rtc: Option<String>,
    #[arg(long)]
    pub trajectory_topic: Option<String>,
    #[arg(long)]
    pub action_chunk_topic: Option<String>,
    #[arg(long)]
    pub health_topic: Option<String>,
    /// Published joint names, one per action column (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub joint_names: Option<Vec<String>>,
    #[arg(long)]
    pub control_rate: Option<f64>,
    /// Seconds between inferences.
    #[arg(long)]
    pub replan_period: Option<f64>,
    #[arg(long)]
    pub missing_camera: Option<MissingCamera>,
    /// Record the observations stepped on into this observation log.
    #[arg(long)]
    pub record_observations: Option<PathBuf>,
    /// Reliability of the image subscriptions.
    #[arg(long)]
    pub image_qos: Option<Reliability>,
    #[arg(long)]
    pub domain_id: Option<u16>,
    #[arg(long)]
    pub namespace: Option<String>,
    #[arg(long)]
    pub node_name: Option<String>,
    /// Lock the process's memory (mlockall).
    #[arg(long)]
    pub mlock: bool,
    /// SCHED_FIFO priority (1-99) of the inference thread.
    #[arg(long)]
    pub fifo_priority: Option<i32>,
    /// Pin the inference thread to these CPUs (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub cpus: Option<Vec<usize>>,
    /// Stop after this many seconds (0: run until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0.0)]
    pub run_for: f64,
    /// Print the effective configuration (file + flags) as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
}

impl Config {
    /// The configuration as a TOML file that `from_toml` reads back.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("every config value has a TOML form")
    }

    pub fn from_toml(text: &str, path: &std::path::Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::File { path: path.into(), message: e.to_string() })
    }

    /// The file named by `--config` (if any) with the flags applied.
    pub fn load(cli: &Cli) -> Result<Config, ConfigError> {
        let mut config = match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File { path: path.clone(), message: e.to_string() })?;
                Config::from_toml(&text, path)?
            }
            None => Config::default(),
        };
        config.apply(cli);
        Ok(config)
    }

    fn apply(&mut self, cli: &Cli) {
        fn set<T: Clone>(field: &mut T, value: &Option<T>) {
            if let Some(v) = value {
                *field = v.clone();
            }
        }
        set(&mut self.policy.checkpoint, &cli.checkpoint);
        if cli.tokenizer.is_some() {
            self.policy.tokenizer = cli.tokenizer.clone();
        }
        set(&mut self.policy.backend, &cli.backend);
        if cli.prompt.is_some() {
            self.policy.prompt = cli.prompt.clone();
        }
        if let Some(topics) = &cli.camera_topics {
            // Keep per-camera size checks from the file when only the topics are remapped.
            self.cameras.resize_with(topics.len(), CameraConfig::default);
            for (camera, topic) in self.cameras.iter_mut().zip(topics) {
                camera.topic = topic.clone();
            }
        }
        set(&mut self.joint_states.topic, &cli.joint_states_topic);
        set(&mut self.prompt.topic, &cli.prompt_topic);
        set(&mut self.output.mode, &cli.output_mode);
        set(&mut self.output.action_topic, &cli.action_topic);
        if cli.rtc.is_some() {
            self.policy.rtc = cli.rtc.clone();
        }
        set(&mut self.output.trajectory_topic, &cli.trajectory_topic);
        set(&mut self.output.action_chunk_topic, &cli.action_chunk_topic);
        set(&mut self.output.health_topic, &cli.health_topic);
        set(&mut self.output.joint_names, &cli.joint_names);
        set(&mut self.timing.control_rate_hz, &cli.control_rate);
        set(&mut self.timing.replan_period_s, &cli.replan_period);
        set(&mut self.inputs.missing_camera, &cli.missing_camera);
        set(&mut self.inputs.record_observations, &cli.record_observations);
        if let Some(r) = cli.image_qos {
            self.qos.images.reliability = r;
        }
        if cli.domain_id.is_some() {
            self.node.domain_id = cli.domain_id;
        }
        set(&mut self.node.namespace, &cli.namespace);
        set(&mut self.node.name, &cli.node_name);
        self.realtime.lock_memory |= cli.mlock;
        if cli.fifo_priority.is_some() {
            self.realtime.fifo_priority = cli.fifo_priority;
        }
        set(&mut self.realtime.cpus, &cli.cpus);
    }

    /// The DDS domain: configured, else `$ROS_DOMAIN_ID` (as every ROS 2 node reads it), else 0.
    pub fn domain_id(&self) -> Result<u16, ConfigError> {
        if let Some(d) = self.node.domain_id {
            return Ok(d);
        }
        match std::env::var("ROS_DOMAIN_ID") {
            Ok(v) if !v.trim().is_empty() => v.trim().parse().map_err(|_| invalid("ROS_DOMAIN_ID", format!("{v:?} is not a domain id"))),
            _ => Ok(0),
        }
    }

    /// Checks that need no policy: timing, sizes, names.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.policy.checkpoint.as_os_str().is_empty() {
            return Err(invalid("policy.checkpoint", "not set (config file or --checkpoint)"));
        }
        let positive =
            |field, v: f64| if v.is_finite() && v > 0.0 { Ok(()) } else { Err(invalid(field, format!("{v} must be a positive number"))) };
        positive("timing.control_rate_hz", self.timing.control_rate_hz)?;
        positive("timing.replan_period_s", self.timing.replan_period_s)?;
        positive("inputs.max_frame_age_s", self.inputs.max_frame_age_s)?;
        positive("inputs.max_state_age_s", self.inputs.max_state_age_s)?;
        positive("inputs.warn_interval_s", self.inputs.warn_interval_s)?;
        if let Some(rate) = self.stream.rate_hz {
            positive("stream.rate_hz", rate)?;
        }
        if self.stream.fallback == FallbackKind::Decelerate && self.stream.decelerate_ticks == 0 {
            return Err(invalid("stream.decelerate_ticks", "must be at least 1 with fallback = \"decelerate\" (or use \"hold\")"));
        }
        self.rtc()?;
        if self.policy.max_frame_width == 0 || self.policy.max_frame_height == 0 {
            return Err(invalid("policy.max_frame_width/height", "must be positive"));
        }
        if self.cameras.is_empty() {
            return Err(invalid("cameras", "no camera topics configured ([[cameras]] in the file or --camera-topics)"));
        }
        for c in &self.cameras {
            if c.topic.is_empty() {
                return Err(invalid("cameras.topic", "empty topic name"));
            }
            if c.width.is_some() != c.height.is_some() {
                return Err(invalid("cameras.width/height", format!("{}: give both or neither", c.topic)));
            }
            if c.width.is_some_and(|w| w > self.policy.max_frame_width) || c.height.is_some_and(|h| h > self.policy.max_frame_height) {
                return Err(invalid("cameras.width/height", format!("{}: larger than policy.max_frame_width/height", c.topic)));
            }
        }
        if self.qos.outputs.durability == Durability::TransientLocal {
            return Err(invalid(
                "qos.outputs.durability",
                "transient_local is refused: a subscriber that joins late would be sent old action chunks, more of them than \
                 `depth` (RustDDS keeps every sample until each matched reader has acknowledged it, all of them while none is \
                 matched) and seconds old, and a controller would execute a stale trajectory; use volatile",
            ));
        }
        if self.policy.prompt.as_deref().is_some_and(|p| crate::inputs::check_prompt(p).is_err()) {
            return Err(invalid("policy.prompt", "empty or blank: leave it unset to wait for one on the prompt topic"));
        }
        let mut names = self.joint_states.names.clone();
        names.sort();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("joint_states.names", "a name appears twice"));
        }
        Ok(())
    }

    /// The observation log of `inputs.record_observations`, started for `policy` (with its initial
    /// prompt, `policy.prompt`); `None` when the parameter is empty.
    pub fn recorder(&self, policy: &flashrt::Policy) -> Result<Option<Recorder>, flashrt::Error> {
        let path = &self.inputs.record_observations;
        if path.as_os_str().is_empty() {
            return Ok(None);
        }
        let mut recorder = Recorder::for_policy(path, policy, &format!("flashrt-ros2 node {}", self.node.name))?;
        if let Some(text) = &self.policy.prompt {
            recorder.set_prompt(text);
        }
        Ok(Some(recorder))
    }

    /// Checks against the opened policy: camera count, state and action widths.
    pub fn check_policy(&self, info: &flashrt::PolicyInfo) -> Result<(), ConfigError> {
        if self.cameras.len() != info.cameras.len() {
            return Err(invalid(
                "cameras",
                format!(
                    "{} topics configured, the policy has {} cameras in this order: {}",
                    self.cameras.len(),
                    info.cameras.len(),
                    info.cameras.join(", ")
                ),
            ));
        }
        if self.cameras.len() > crate::inputs::MAX_CAMERAS {
            return Err(invalid("cameras", format!("at most {} cameras are supported", crate::inputs::MAX_CAMERAS)));
        }
        if !self.joint_states.names.is_empty() && self.joint_states.names.len() != info.state_dim {
            return Err(invalid(
                "joint_states.names",
                format!("{} names for a policy state of {} values", self.joint_states.names.len(), info.state_dim),
            ));
        }
        if let Some(refill_at) = self.stream.refill_at
            && refill_at >= info.horizon
        {
            return Err(invalid("stream.refill_at", format!("{refill_at} must be below the policy's horizon {}", info.horizon)));
        }
        if !self.output.joint_names.is_empty() && self.output.joint_names.len() != info.action_dim {
            return Err(invalid(
                "output.joint_names",
                format!("{} names for {} action columns", self.output.joint_names.len(), info.action_dim),
            ));
        }
        Ok(())
    }

    /// Published joint names: configured, else `joint_0 .. joint_{n-1}`.
    pub fn joint_names(&self, action_dim: usize) -> Vec<String> {
        if self.output.joint_names.is_empty() {
            (0..action_dim).map(|i| format!("joint_{i}")).collect()
        } else {
            self.output.joint_names.clone()
        }
    }

    pub fn control_period(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.timing.control_rate_hz)
    }

    pub fn replan_period(&self) -> Duration {
        Duration::from_secs_f64(self.timing.replan_period_s)
    }

    /// Stream mode's control rate: `stream.rate_hz`, else `timing.control_rate_hz`.
    pub fn stream_rate_hz(&self) -> f64 {
        self.stream.rate_hz.unwrap_or(self.timing.control_rate_hz)
    }

    /// The action stream's settings (stream mode). Its inference thread gets the `realtime`
    /// settings.
    pub fn stream_config(&self) -> flashrt::StreamConfig {
        let s = &self.stream;
        flashrt::StreamConfig {
            control_period: Duration::from_secs_f64(1.0 / self.stream_rate_hz()),
            refill_at: s.refill_at,
            fallback: match s.fallback {
                FallbackKind::Hold => flashrt::Fallback::Hold,
                FallbackKind::Decelerate => flashrt::Fallback::Decelerate { ticks: s.decelerate_ticks },
            },
            realtime: self.realtime(),
            ..flashrt::StreamConfig::new()
        }
    }

    /// `policy.rtc*` as the runtime's setting; `None` when `policy.rtc` is unset.
    pub fn rtc(&self) -> Result<Option<flashrt::RtcConfig>, ConfigError> {
        let p = &self.policy;
        let Some(name) = &p.rtc else { return Ok(None) };
        let schedule = flashrt::RtcSchedule::parse(name).ok_or_else(|| {
            invalid("policy.rtc", format!("{name:?}: expected linear, exp, ones or zeros (Pi0.5), ramp (GR00T N1.7), or leave it unset"))
        })?;
        if p.rtc_execution_horizon == 0 {
            return Err(invalid("policy.rtc_execution_horizon", "must be at least 1"));
        }
        let w = p.rtc_max_guidance_weight;
        if schedule.guided() && !(w.is_finite() && w > 0.0) {
            return Err(invalid("policy.rtc_max_guidance_weight", format!("{w} must be a positive number")));
        }
        Ok(Some(flashrt::RtcConfig { schedule, max_guidance_weight: w, execution_horizon: p.rtc_execution_horizon }))
    }

    pub fn realtime(&self) -> flashrt::realtime::RealtimeConfig {
        let r = &self.realtime;
        flashrt::realtime::RealtimeConfig { lock_memory: r.lock_memory, fifo_priority: r.fifo_priority, cpus: r.cpus.clone() }
    }

    pub fn backend(&self) -> Result<flashrt::BackendKind, ConfigError> {
        match self.policy.backend.as_str() {
            "auto" => Ok(flashrt::BackendKind::Auto),
            "cpu" => Ok(flashrt::BackendKind::Cpu),
            "cuda" => Ok(flashrt::BackendKind::Cuda),
            other => Err(invalid("policy.backend", format!("{other:?}: expected auto, cpu or cuda"))),
        }
    }

    pub fn policy_config(&self) -> Result<flashrt::PolicyConfig, ConfigError> {
        let mut c = flashrt::PolicyConfig::new(&self.policy.checkpoint);
        c.backend = self.backend()?;
        c.device = self.policy.device;
        c.seed = self.policy.seed;
        c.tokenizer = self.policy.tokenizer.clone();
        c.denoise_steps = self.policy.denoise_steps;
        c.embodiment = self.policy.embodiment.clone();
        c.max_frame_width = self.policy.max_frame_width as usize;
        c.max_frame_height = self.policy.max_frame_height as usize;
        c.deadline = Some(self.replan_period());
        c.rtc = self.rtc()?;
        Ok(c)
    }
}

/// Resolves a topic name the way rcl does for the forms used here: absolute (`/a/b`) as given,
/// private (`~/x`) under the node's name, relative (`a/b`) under the namespace.
pub fn resolve_topic(namespace: &str, node: &str, topic: &str) -> String {
    let ns = namespace.trim_end_matches('/');
    if topic.starts_with('/') {
        topic.to_string()
    } else if let Some(private) = topic.strip_prefix("~/") {
        format!("{ns}/{node}/{private}")
    } else {
        format!("{ns}/{topic}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_resolution() {
        assert_eq!(resolve_topic("/", "flashrt", "joint_states"), "/joint_states");
        assert_eq!(resolve_topic("/robot1", "flashrt", "joint_states"), "/robot1/joint_states");
        assert_eq!(resolve_topic("/robot1", "flashrt", "/joint_states"), "/joint_states");
        assert_eq!(resolve_topic("/robot1", "flashrt", "~/health"), "/robot1/flashrt/health");
        assert_eq!(resolve_topic("/", "flashrt", "~/health"), "/flashrt/health");
    }

    #[test]
    fn example_config_parses_and_flags_override() {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/flashrt_ros2.toml"));
        let mut config = Config::from_toml(&std::fs::read_to_string(path).unwrap(), path).unwrap();
        config.check().unwrap();
        assert_eq!(config.cameras.len(), 3);
        let cli = Cli::parse_from([
            "flashrt-ros2",
            "--camera-topics",
            "/a/image,/b/image,/c/image",
            "--domain-id",
            "7",
            "--missing-camera",
            "mask",
            "--image-qos",
            "reliable",
            "--fifo-priority",
            "80",
            "--cpus",
            "2,3",
            "--output-mode",
            "stream",
            "--rtc",
            "linear",
        ]);
        config.apply(&cli);
        let again = Config::from_toml(&config.to_toml(), path).unwrap();
        assert_eq!(again.to_toml(), config.to_toml(), "TOML round trip");
        assert_eq!(config.cameras.iter().map(|c| c.topic.as_str()).collect::<Vec<_>>(), ["/a/image", "/b/image", "/c/image"]);
        assert_eq!(config.domain_id().unwrap(), 7);
        assert_eq!(config.inputs.missing_camera, MissingCamera::Mask);
        assert_eq!(config.qos.images.reliability, Reliability::Reliable);
        assert_eq!(config.realtime(), flashrt::realtime::RealtimeConfig { lock_memory: false, fifo_priority: Some(80), cpus: vec![2, 3] });
        assert_eq!(
            (config.output.mode, config.rtc().unwrap().map(|r| r.schedule)),
            (OutputMode::Stream, Some(flashrt::RtcSchedule::Linear))
        );
        config.check().unwrap();
    }

    #[test]
    fn bad_settings_are_named() {
        let path = std::path::Path::new("x.toml");
        let e = Config::from_toml("[timing]\ncontrol_rate = 5\n", path).unwrap_err().to_string();
        assert!(e.contains("control_rate"), "{e}");
        let mut c = Config::from_toml("[policy]\ncheckpoint = \"x\"\n[[cameras]]\ntopic = \"a\"\n", path).unwrap();
        c.check().unwrap();
        c.timing.replan_period_s = 0.0;
        assert!(c.check().unwrap_err().to_string().contains("timing.replan_period_s"));
        c.timing.replan_period_s = 0.1;
        c.cameras[0].width = Some(10);
        assert!(c.check().unwrap_err().to_string().contains("both or neither"));
        c.cameras[0].width = None;
        c.policy.prompt = Some(" \t".into());
        assert!(c.check().unwrap_err().to_string().contains("policy.prompt"));
        c.policy.prompt = None;
        // Late joiners of a transient-local output would be sent stale trajectories.
        c.qos.outputs.durability = Durability::TransientLocal;
        assert!(c.check().unwrap_err().to_string().contains("qos.outputs.durability"));
        let e =
            Config::from_toml("[qos.outputs]\nreliability = \"reliable\"\ndurability = \"transient_local\"\ndepth = 1\n", path).unwrap();
        assert!(e.qos.outputs.durability == Durability::TransientLocal, "parsed, refused by check");
        c.qos.outputs.durability = Durability::Volatile;
        // Inputs may ask for it (a latched prompt is a common ROS 2 pattern).
        c.qos.prompt.durability = Durability::TransientLocal;
        c.check().unwrap();
    }

    #[test]
    fn stream_and_rtc_settings_map_and_bad_ones_are_named() {
        let path = std::path::Path::new("x.toml");
        let base = "[policy]\ncheckpoint = \"x\"\n[[cameras]]\ntopic = \"a\"\n";
        // Defaults: chunk mode, no RTC, the stream at the trajectory's control rate.
        let c = Config::from_toml(base, path).unwrap();
        c.check().unwrap();
        assert_eq!((c.output.mode, c.rtc().unwrap(), c.policy_config().unwrap().rtc), (OutputMode::Chunk, None, None));
        assert_eq!(c.stream_config().control_period, Duration::from_millis(20));
        assert_eq!(c.stream_config().fallback, flashrt::Fallback::Hold);

        let text = format!(
            "{base}[output]\nmode = \"stream\"\naction_topic = \"/arm/commands\"\n\
             [stream]\nrate_hz = 25.0\nrefill_at = 12\nfallback = \"decelerate\"\ndecelerate_ticks = 4\n"
        );
        let mut c = Config::from_toml(&text.replace("[[cameras]]", "rtc = \"exp\"\nrtc_execution_horizon = 8\n[[cameras]]"), path).unwrap();
        c.check().unwrap();
        assert_eq!(c.output.mode, OutputMode::Stream);
        let stream = c.stream_config();
        assert_eq!((stream.control_period, stream.refill_at), (Duration::from_millis(40), Some(12)));
        assert_eq!(stream.fallback, flashrt::Fallback::Decelerate { ticks: 4 });
        let rtc = flashrt::RtcConfig { schedule: flashrt::RtcSchedule::Exp, max_guidance_weight: 10.0, execution_horizon: 8 };
        assert_eq!(c.policy_config().unwrap().rtc, Some(rtc));
        let again = Config::from_toml(&c.to_toml(), path).unwrap();
        assert_eq!(again.to_toml(), c.to_toml(), "TOML round trip");

        // Refused, each by its key.
        let refused = |c: &Config, key: &str| {
            let e = c.check().unwrap_err().to_string();
            assert!(e.contains(key), "{key}: {e}");
        };
        c.policy.rtc = Some("cosine".into());
        refused(&c, "policy.rtc");
        c.policy.rtc = Some("linear".into());
        c.policy.rtc_execution_horizon = 0;
        refused(&c, "policy.rtc_execution_horizon");
        c.policy.rtc_execution_horizon = 10;
        for w in [0.0, -1.0, f32::NAN] {
            c.policy.rtc_max_guidance_weight = w;
            refused(&c, "policy.rtc_max_guidance_weight");
        }
        c.policy.rtc_max_guidance_weight = 5.0;
        c.stream.rate_hz = Some(0.0);
        refused(&c, "stream.rate_hz");
        c.stream.rate_hz = None;
        c.stream.decelerate_ticks = 0;
        refused(&c, "stream.decelerate_ticks");
        c.stream.fallback = FallbackKind::Hold;
        c.check().unwrap();
        // Unknown values of the enumerated keys are refused when the file is read, on their line.
        for (bad, key) in [("[output]\nmode = \"burst\"\n", "mode"), ("[stream]\nfallback = \"stop\"\n", "fallback")] {
            let e = Config::from_toml(bad, path).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("unknown variant"), "{e}");
        }
        // The refill threshold is checked against the opened policy's horizon.
        let checkpoint = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/pi05_tiny"));
        let policy =
            flashrt::Policy::open(&flashrt::PolicyConfig { backend: flashrt::BackendKind::Cpu, ..flashrt::PolicyConfig::new(checkpoint) })
                .unwrap();
        let mut info = policy.info();
        info.cameras.truncate(1);
        c.stream.refill_at = Some(info.horizon);
        let e = c.check_policy(&info).unwrap_err().to_string();
        assert!(e.contains("stream.refill_at"), "{e}");
        c.stream.refill_at = Some(info.horizon - 1);
        c.check_policy(&info).unwrap();
    }
}
