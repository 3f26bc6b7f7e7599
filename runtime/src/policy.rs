//! The policy API: open a checkpoint once, set a prompt, call [`Policy::step`] every control tick.
//!
//! `step` validates the whole observation before touching any state (a bad observation returns an
//! error and leaves the policy usable), then stages inputs into the plan's buffers, runs the plan
//! and copies the action chunk out. After the first call it performs no heap allocation.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::backend::{Backend, BackendKind, Precision};
use crate::checkpoint::Checkpoint;
use crate::cpu::{self, CpuBackend};
use crate::error::{Error, Result};
use crate::image::Frame;
use crate::models::ModelKind;
use crate::models::pi05::norm::{FeatureStats, Modes, NormStats};
use crate::models::pi05::prompt::{PromptTokenizer, discretize_state};
use crate::models::pi05::{self, BuildOptions, Config, LerobotConfig, Model};
use crate::plan::FRAME_INFO_FIELDS;
use crate::stats::LatencyStats;

/// Everything `Policy::open` needs. `PolicyConfig::new(path)` fills sensible defaults.
#[derive(Clone, Debug)]
pub struct PolicyConfig {
    /// A `.safetensors` file or a checkpoint directory (lerobot layout).
    pub checkpoint: PathBuf,
    pub backend: BackendKind,
    pub device: usize,
    pub precision: Precision,
    /// Where a GPU backend caches compiled kernels (default `$XDG_CACHE_HOME/flashrt/kernels`).
    pub kernel_cache_dir: Option<PathBuf>,
    /// Number of camera slots; default: the cameras named in config.json (else 3).
    pub cameras: Option<usize>,
    /// Largest frame accepted by `step` (staging buffers are sized for it).
    pub max_frame_width: usize,
    pub max_frame_height: usize,
    /// Prompt token capacity; default: config.json `tokenizer_max_length` (else 200).
    pub prompt_len: Option<usize>,
    /// Compute the prefix only for the prompt slots a step uses, rounded up to a bucket of 32,
    /// 64, 128 or the capacity, chosen on the device each step (default on; off computes every
    /// slot every step, the A/B for the saving).
    pub prompt_buckets: bool,
    /// Denoise steps; default: config.json `num_inference_steps` (else 10).
    pub denoise_steps: Option<usize>,
    /// `tokenizer.json`; default: `tokenizer.json` in the checkpoint directory, if present.
    pub tokenizer: Option<PathBuf>,
    /// The robot's state width when neither config.json nor the statistics state it; a value
    /// other than the checkpoint's is refused.
    pub state_dim: Option<usize>,
    /// Seed of the noise generator used when an observation carries no noise.
    pub seed: u64,
    /// Steps slower than this count as deadline misses in the statistics.
    pub deadline: Option<Duration>,
    /// Show a progress bar while loading.
    pub progress: bool,
    /// CPU backend: threads that split each GEMM and attention (this one included, at most 64);
    /// default: the available parallelism. Spawned at open and parked between steps.
    pub threads: Option<usize>,
}

impl PolicyConfig {
    pub fn new(checkpoint: impl Into<PathBuf>) -> Self {
        PolicyConfig {
            checkpoint: checkpoint.into(),
            backend: BackendKind::Auto,
            device: 0,
            precision: Precision::Auto,
            kernel_cache_dir: None,
            cameras: None,
            max_frame_width: 1920,
            max_frame_height: 1080,
            prompt_len: None,
            prompt_buckets: true,
            denoise_steps: None,
            tokenizer: None,
            state_dim: None,
            seed: 0,
            deadline: None,
            progress: false,
            threads: None,
        }
    }
}

/// One control tick's inputs. `cameras[i]` is the i-th camera in the policy's order
/// ([`PolicyInfo::cameras`]); `None` marks a missing camera.
#[derive(Clone, Copy, Debug)]
pub struct Observation<'a> {
    pub cameras: &'a [Option<Frame<'a>>],
    /// Raw (unnormalized) robot state, `state_dim` values.
    pub state: &'a [f32],
    /// Optional initial noise `[horizon × model action width]`; drawn from the seeded RNG if absent.
    pub noise: Option<&'a [f32]>,
}

#[derive(Clone, Copy, Debug)]
pub struct StepInfo {
    pub latency: Duration,
    /// The part of `latency` spent in the backend's run (on a GPU: graph launch to completion);
    /// the rest is host work (validation, prompt, staging frames and noise, copying actions).
    pub backend_time: Duration,
    /// Valid prompt tokens this step (state bins included).
    pub prompt_tokens: usize,
    pub deadline_missed: bool,
}

#[derive(Clone, Debug)]
pub struct PolicyInfo {
    pub model: &'static str,
    pub backend: &'static str,
    pub device: String,
    pub cameras: Vec<String>,
    pub state_dim: usize,
    /// Action columns returned per row (the robot's action width).
    pub action_dim: usize,
    pub horizon: usize,
    pub denoise_steps: usize,
    pub prompt_capacity: usize,
    pub parameters: usize,
    pub memory_bytes: usize,
    pub config: Config,
}

enum Prompt {
    None,
    /// Text: the task part is tokenized; state bins are assembled in every step.
    Text,
    /// Raw token ids given by the caller, used as they are.
    Tokens {
        len: usize,
    },
}

pub struct Policy {
    model: ModelKind,
    model_config: Config,
    io: pi05::IoBuffers,
    cameras: usize,
    out_action_dim: usize,
    state_dim: usize,
    max_frame: (usize, usize),
    backend: Box<dyn Backend>,
    tokenizer: Option<PromptTokenizer>,
    state_stats: Option<FeatureStats>,
    prompt: Prompt,
    rng: ChaCha8Rng,
    stats: LatencyStats,
    deadline: Option<Duration>,
    // Scratch sized at open so `step` never allocates.
    bins: Vec<i32>,
    tokens: Vec<i32>,
    token_mask: Vec<bool>,
}

impl Policy {
    pub fn open(config: &PolicyConfig) -> Result<Policy> {
        let started = Instant::now();
        let dir: PathBuf = if config.checkpoint.is_dir() {
            config.checkpoint.clone()
        } else {
            config.checkpoint.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
        };
        let config_json = dir.join("config.json");
        // Pi0.5 is the only model yet; GR00T N1.7 joins as a second arm here.
        let model = ModelKind::detect(&config_json)?;
        let ModelKind::Pi05 = model;
        let ckpt = Arc::new(Checkpoint::open(&config.checkpoint)?);
        let json = if config_json.exists() { Some(LerobotConfig::read(&config_json)?) } else { None };
        let mut model_config = Config::from_checkpoint(&ckpt, json.as_ref())?;
        if let Some(n) = config.prompt_len {
            model_config.prompt_len = n;
        }
        if let Some(n) = config.denoise_steps {
            model_config.denoise_steps = n;
        }
        if model_config.denoise_steps == 0 || model_config.prompt_len == 0 || model_config.horizon == 0 {
            return Err(Error::invalid("config", "denoise_steps, prompt length and horizon must be positive"));
        }
        let cameras = config.cameras.unwrap_or(model_config.cameras.len());
        if cameras == 0 {
            return Err(Error::invalid("config.cameras", "at least one camera is required"));
        }
        // Pi0.5's weights do not fix the number of views; slots beyond the checkpoint's named
        // cameras get distinct names, so explain() and error messages can tell them apart.
        let named = model_config.cameras.len();
        model_config.cameras.extend((named..cameras).map(|i| format!("observation.images.extra_{}", i - named)));
        model_config.cameras.truncate(cameras);

        let norm = NormStats::find(&dir, json.as_ref().map(|j| j.modes()).unwrap_or_default())?;
        let checkpoint_state_dim = model_config.state_dim.or(norm.state.as_ref().map(FeatureStats::dim));
        let state_dim = match (checkpoint_state_dim, config.state_dim) {
            (Some(ours), Some(asked)) if asked != ours => {
                return Err(Error::invalid(
                    "config.state_dim",
                    format!("{asked} differs from the checkpoint's {ours} (config.json / statistics); leave it unset or give {ours}"),
                ));
            }
            (Some(dim), _) | (None, Some(dim)) => dim,
            (None, None) => {
                return Err(Error::invalid(
                    "config.state_dim",
                    "the checkpoint states no state dimension (config.json / statistics); set it",
                ));
            }
        };
        let out_action_dim =
            model_config.robot_action_dim.or(norm.action.as_ref().map(FeatureStats::dim)).unwrap_or(model_config.action_dim);
        for (what, stats, dim) in [("state", &norm.state, state_dim), ("action", &norm.action, out_action_dim)] {
            if let Some(s) = stats.as_ref().filter(|s| s.dim() != dim) {
                return Err(Error::checkpoint(&dir, format!("{what} statistics have {} dims, the policy uses {dim}", s.dim())));
            }
        }
        if out_action_dim > model_config.action_dim {
            return Err(Error::checkpoint(
                &dir,
                format!("action dim {out_action_dim} exceeds the model's action width {}", model_config.action_dim),
            ));
        }
        let (action_scale, action_offset) = match &norm.action {
            Some(s) => s.unnormalize_affine(),
            None => (vec![1.0; out_action_dim], vec![0.0; out_action_dim]),
        };

        let tokenizer_path = config.tokenizer.clone().or_else(|| Some(dir.join("tokenizer.json")).filter(|p| p.exists()));
        let tokenizer = match tokenizer_path {
            Some(p) => Some(PromptTokenizer::from_file(&p, model_config.prompt_len, state_dim)?),
            None => {
                log::warn!("no tokenizer.json beside the checkpoint: only raw token prompts (set_prompt_tokens) are accepted");
                None
            }
        };

        // Probe before building anything: asking for CUDA where it cannot run fails fast, with why.
        let use_cuda = match config.backend {
            BackendKind::Cpu => false,
            BackendKind::Cuda => {
                crate::cuda::probe(config.device)
                    .map_err(|why| Error::Backend(format!("CUDA backend requested but unavailable: {why}")))?;
                true
            }
            BackendKind::Auto => match crate::cuda::probe(config.device) {
                Ok(name) => {
                    log::info!("backend auto: CUDA on {name}");
                    true
                }
                Err(why) => {
                    log::info!("backend auto: CPU ({why})");
                    false
                }
            },
        };
        match (use_cuda, config.precision) {
            (_, Precision::Auto) | (false, Precision::F32) | (true, Precision::Bf16) => {}
            // A valid value this backend cannot compute in: a backend limit, not a bad argument.
            (true, p) => {
                return Err(Error::Backend(format!(
                    "config.precision {p:?} is not available on the CUDA backend (it computes in bf16; use Auto or Bf16)"
                )));
            }
            (false, p) => {
                return Err(Error::Backend(format!(
                    "config.precision {p:?} needs the CUDA backend; the CPU backend computes in f32 (use Auto or F32)"
                )));
            }
        }

        let opts = BuildOptions {
            cameras,
            max_frame_width: config.max_frame_width,
            max_frame_height: config.max_frame_height,
            out_action_dim,
            action_scale,
            action_offset,
            prompt_buckets: config.prompt_buckets,
        };
        let bar = if config.progress { indicatif::ProgressBar::new(ckpt.data_bytes() as u64) } else { indicatif::ProgressBar::hidden() };
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} ({eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let Model { config: model_config, plan, weights, io, cameras, out_action_dim } =
            pi05::build(&ckpt, model_config, &opts, &|n| bar.inc(n as u64))?;
        bar.finish_and_clear();
        let backend: Box<dyn Backend> = if use_cuda {
            crate::cuda::open(plan, weights, ckpt, config.device, config.kernel_cache_dir.clone())?
        } else {
            let threads = match config.threads {
                Some(n @ 1..=cpu::MAX_THREADS) => n,
                Some(n) => return Err(Error::invalid("config.threads", format!("{n} threads: must be 1 to {}", cpu::MAX_THREADS))),
                None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(cpu::MAX_THREADS),
            };
            Box::new(CpuBackend::new(plan, weights, &ckpt, threads)?)
        };
        log::info!("opened {} in {:.2?}", config.checkpoint.display(), started.elapsed());

        Ok(Policy {
            model,
            io,
            cameras,
            out_action_dim,
            state_dim,
            max_frame: (config.max_frame_width, config.max_frame_height),
            backend,
            tokenizer,
            state_stats: norm.state,
            prompt: Prompt::None,
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            stats: LatencyStats::new(),
            deadline: config.deadline,
            bins: vec![0; state_dim],
            tokens: vec![0; model_config.prompt_len],
            token_mask: vec![false; model_config.prompt_len],
            model_config,
        })
    }

    pub fn info(&self) -> PolicyInfo {
        let c = &self.model_config;
        PolicyInfo {
            model: self.model.name(),
            backend: self.backend.name(),
            device: self.backend.device_name(),
            cameras: c.cameras.clone(),
            state_dim: self.state_dim,
            action_dim: self.out_action_dim,
            horizon: c.horizon,
            denoise_steps: c.denoise_steps,
            prompt_capacity: c.prompt_len,
            parameters: c.parameter_count(),
            memory_bytes: self.backend.memory_bytes(),
            config: c.clone(),
        }
    }

    /// Length of the action buffer `step` fills: `horizon × action_dim`.
    pub fn actions_len(&self) -> usize {
        self.model_config.horizon * self.out_action_dim
    }

    /// Length of an observation's optional noise: `horizon × model action width`.
    pub fn noise_len(&self) -> usize {
        self.model_config.horizon * self.model_config.action_dim
    }

    /// The execution plan (ops, buffers, FLOP count).
    pub fn plan(&self) -> &crate::plan::Plan {
        self.backend.plan()
    }

    /// The plan as text: every op with its shapes and the folding decisions, then how the backend
    /// runs it (fusions, fallbacks, switches).
    pub fn explain(&self) -> String {
        format!(
            "{}{} backend on {}:\n{}",
            self.backend.plan().explain(),
            self.backend.name(),
            self.backend.device_name(),
            self.backend.lowering()
        )
    }

    /// Sets the task text. The state is appended in every step (pi05 prompt format). A text that
    /// is empty or only whitespace is refused; one longer than the prompt capacity is truncated
    /// with a warning.
    pub fn set_prompt(&mut self, text: &str) -> Result<()> {
        let tok = self
            .tokenizer
            .as_mut()
            .ok_or_else(|| Error::Tokenizer("no tokenizer loaded: pass tokenizer.json or use raw prompt tokens".into()))?;
        if crate::models::pi05::prompt::is_blank_task(text) {
            return Err(Error::invalid("prompt", "the task text is empty or only whitespace; the previous prompt stays"));
        }
        tok.set_task(text)?;
        self.prompt = Prompt::Text;
        Ok(())
    }

    /// Sets the full prompt as token ids (BOS, task, state and all); used as given in every step.
    pub fn set_prompt_tokens(&mut self, ids: &[i32]) -> Result<()> {
        let cap = self.model_config.prompt_len;
        if ids.is_empty() || ids.len() > cap {
            return Err(Error::invalid("prompt_tokens", format!("{} tokens given; 1 to {cap} allowed", ids.len())));
        }
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, id)| **id < 0 || **id as usize >= self.model_config.vocab) {
            return Err(Error::invalid(
                format!("prompt_tokens[{i}]"),
                format!("id {id} outside the vocabulary 0..{}", self.model_config.vocab),
            ));
        }
        self.tokens.fill(0);
        self.tokens[..ids.len()].copy_from_slice(ids);
        self.prompt = Prompt::Tokens { len: ids.len() };
        Ok(())
    }

    /// One control tick: `actions` receives `[horizon × action_dim]` row-major, unnormalized.
    pub fn step(&mut self, obs: &Observation, actions: &mut [f32]) -> Result<StepInfo> {
        let started = Instant::now();
        self.validate(obs, actions)?;

        // Prompt tokens (state bins inside for text prompts).
        let prompt_tokens = match self.prompt {
            Prompt::None => return Err(Error::invalid("prompt", "no prompt set: call set_prompt or set_prompt_tokens first")),
            Prompt::Tokens { len } => {
                self.token_mask.iter_mut().enumerate().for_each(|(i, m)| *m = i < len);
                len
            }
            Prompt::Text => {
                for (i, (bin, &x)) in self.bins.iter_mut().zip(obs.state).enumerate() {
                    let x = self.state_stats.as_ref().map_or(x, |s| s.normalize(i, x));
                    *bin = discretize_state(x);
                }
                let tok = self.tokenizer.as_ref().expect("text prompt implies a tokenizer");
                tok.assemble(&self.bins, &mut self.tokens, &mut self.token_mask)?
            }
        };
        self.backend.input_i32(self.io.tokens).copy_from_slice(&self.tokens);
        for (dst, &m) in self.backend.input_i32(self.io.token_mask).iter_mut().zip(&self.token_mask) {
            *dst = m as i32;
        }

        // Frames: packed rows into the staging buffer, geometry into frame_info.
        let stride = self.io.frame_stride;
        for (cam, frame) in obs.cameras.iter().enumerate() {
            let info = match frame {
                Some(f) => {
                    let row = f.width * f.format.bytes_per_pixel();
                    let staged = &mut self.backend.input_u8(self.io.frames)[cam * stride..];
                    if f.stride == row {
                        staged[..row * f.height].copy_from_slice(&f.data[..row * f.height]);
                    } else {
                        for y in 0..f.height {
                            staged[y * row..][..row].copy_from_slice(&f.data[y * f.stride..][..row]);
                        }
                    }
                    [1, f.width as i32, f.height as i32, f.format as i32]
                }
                None => [0; FRAME_INFO_FIELDS],
            };
            self.backend.input_i32(self.io.frame_info)[cam * FRAME_INFO_FIELDS..][..FRAME_INFO_FIELDS].copy_from_slice(&info);
        }

        let noise = self.backend.input_f32(self.io.noise);
        match obs.noise {
            Some(n) => noise.copy_from_slice(n),
            None => noise.iter_mut().for_each(|v| *v = StandardNormal.sample(&mut self.rng)),
        }

        let run_started = Instant::now();
        self.backend.run()?;
        let backend_time = run_started.elapsed();
        actions.copy_from_slice(self.backend.output_f32(self.io.actions));

        let latency = started.elapsed();
        let deadline_missed = self.deadline.is_some_and(|d| latency > d);
        self.stats.record(latency, deadline_missed);
        Ok(StepInfo { latency, backend_time, prompt_tokens, deadline_missed })
    }

    fn validate(&self, obs: &Observation, actions: &[f32]) -> Result<()> {
        if obs.cameras.len() != self.cameras {
            return Err(Error::invalid(
                "observation.cameras",
                format!("{} given, the policy has {} camera slots (use None for a missing camera)", obs.cameras.len(), self.cameras),
            ));
        }
        if obs.cameras.iter().all(Option::is_none) {
            return Err(Error::invalid("observation.cameras", "every camera is missing; at least one frame is required"));
        }
        for (i, frame) in obs.cameras.iter().enumerate() {
            if let Some(f) = frame {
                f.validate(camera_field(i), self.max_frame.0, self.max_frame.1)?;
            }
        }
        if obs.state.len() != self.state_dim {
            return Err(Error::invalid(
                "observation.state",
                format!("{} values given, the policy expects {}", obs.state.len(), self.state_dim),
            ));
        }
        if let Some(i) = obs.state.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(state_field(i), format!("value {} is not finite", obs.state[i])));
        }
        if let Some(noise) = obs.noise {
            if noise.len() != self.noise_len() {
                return Err(Error::invalid("observation.noise", format!("{} values given, expected {}", noise.len(), self.noise_len())));
            }
            if let Some(i) = noise.iter().position(|v| !v.is_finite()) {
                return Err(Error::invalid(format!("observation.noise[{i}]"), format!("value {} is not finite", noise[i])));
            }
        }
        if actions.len() != self.actions_len() {
            return Err(Error::invalid(
                "actions",
                format!(
                    "buffer holds {} values, expected horizon {} x action dim {} = {}",
                    actions.len(),
                    self.model_config.horizon,
                    self.out_action_dim,
                    self.actions_len()
                ),
            ));
        }
        Ok(())
    }

    pub fn stats(&self) -> &LatencyStats {
        &self.stats
    }

    pub fn reset_stats(&mut self) {
        self.stats.reset();
    }

    /// A copy of a named f32 plan buffer after the last step (for tests and debugging; allocates).
    pub fn buffer(&self, name: &str) -> Option<Vec<f32>> {
        self.backend.read_buffer(name)
    }
}

/// Static field names, so a validation error on the hot path does not format (allocate) a name
/// for the common indices.
fn camera_field(i: usize) -> &'static str {
    ["observation.cameras[0]", "observation.cameras[1]", "observation.cameras[2]", "observation.cameras[3]"]
        .get(i)
        .copied()
        .unwrap_or("observation.cameras[>3]")
}

fn state_field(i: usize) -> String {
    format!("observation.state[{i}]")
}

impl LerobotConfig {
    /// Normalization modes from `normalization_mapping` (pi05 default: quantiles for both).
    pub fn modes(&self) -> Modes {
        use crate::models::pi05::norm::Mode;
        let mode = |key: &str, default: Mode| match self.normalization_mapping.get(key).and_then(|v| v.as_str()) {
            Some("MEAN_STD") => Mode::MeanStd,
            Some("QUANTILES") => Mode::Quantile,
            _ => default,
        };
        let d = Modes::default();
        Modes { state: mode("STATE", d.state), action: mode("ACTION", d.action) }
    }
}
