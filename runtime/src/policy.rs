//! The policy API: open a checkpoint once, set a prompt, call [`Policy::step`] every control tick.
//!
//! `step` validates the whole observation before touching any state (a bad observation returns an
//! error and leaves the policy usable), then stages inputs through the model's io spec, runs the
//! plan and copies the action chunk out. After the first call it performs no heap allocation.
//! The policy knows no model by name: [`crate::models`] picks the model and builds its spec.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::backend::{Backend, BackendKind, Precision};
use crate::calibration::{self, Calibration, CalibrationKey, ProductProbe};
use crate::checkpoint::Checkpoint;
pub use crate::config::PolicyConfig;
use crate::cpu::{self, CpuBackend};
use crate::error::{Error, Result};
use crate::image::Frame;
use crate::io::IoSpec;
use crate::models::{ConfigJson, ModelConfig, ModelInfo, ModelKind, ModelSpec, Processing};
use crate::rtc::Continuation;
use crate::stats::LatencyStats;

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
    /// What the products compute in: "f32" (CPU), "bf16" (CUDA), "fp8-emulated" (CPU, FP8),
    /// "fp8" (CUDA: the calibrated products that qualify in e4m3, the rest in bf16; `explain()`
    /// lists which).
    pub precision: &'static str,
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
    /// The sizes the model derived from its checkpoint.
    pub config: ModelConfig,
    /// The embodiment the steps run for (GR00T's tag; `None` for Pi0.5), and those
    /// [`Policy::set_embodiment`] switches between.
    pub embodiment: Option<String>,
    pub embodiments: Vec<String>,
}

pub struct Policy {
    model: ModelInfo,
    io: IoSpec,
    processing: Box<dyn Processing>,
    max_frame: (usize, usize),
    backend: Box<dyn Backend>,
    rng: ChaCha8Rng,
    stats: LatencyStats,
    deadline: Option<Duration>,
    /// A step has produced a chunk (that a continuation can continue).
    has_chunk: bool,
    /// Why the policy is unusable: the first backend failure of a step (see [`Error::Faulted`]).
    fault: Option<String>,
    /// The checkpoint path it was opened from (calibration keys on its contents).
    checkpoint: PathBuf,
    /// FP8: the calibration in use and where it was read from.
    calibration: Option<(PathBuf, Calibration)>,
}

impl Policy {
    pub fn open(config: &PolicyConfig) -> Result<Policy> {
        let started = Instant::now();
        let ckpt = Arc::new(Checkpoint::open(&config.checkpoint)?);
        let json = ConfigJson::read(&ckpt.dir().join("config.json"))?;
        let kind = ModelKind::detect(json.as_ref())?;

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
            (_, Precision::Auto) | (false, Precision::F32) | (true, Precision::Bf16) | (false, Precision::Fp8) => {}
            (true, Precision::Fp8) => crate::cuda::fp8_support(config.device)?,
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
        let bar = if config.progress { indicatif::ProgressBar::new(ckpt.data_bytes() as u64) } else { indicatif::ProgressBar::hidden() };
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} ({eta})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let ModelSpec { plan, weights, io, processing, info } = kind.open(&ckpt, json.as_ref(), config, &|n| bar.inc(n as u64))?;
        bar.finish_and_clear();
        let calibration = match config.precision {
            Precision::Fp8 => {
                let path = calibration::file_for(config.fp8_calibration.as_deref(), &config.checkpoint);
                let calibration = Calibration::load(&path).map_err(|e| match e {
                    Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Error::Calibration {
                        path: path.clone(),
                        message: "not found: FP8 needs activation scales measured on observations; make them with `flashrt \
                                  calibrate --checkpoint ... --observations LOG` (or set config.fp8_calibration)"
                            .into(),
                    },
                    e => e,
                })?;
                calibration.check(&path, &CalibrationKey::of(&ckpt, &plan, &info)?)?;
                if calibration.synthetic {
                    log::warn!(
                        "{}: calibrated on synthetic observations; activations of real inputs outside their ranges clip",
                        path.display()
                    );
                }
                Some((path, calibration))
            }
            _ => None,
        };
        let fp8_scales = match &calibration {
            Some((path, c)) => c.product_scales(path, &plan)?,
            None => Vec::new(),
        };
        let backend: Box<dyn Backend> = if use_cuda {
            crate::cuda::open(
                plan,
                weights,
                Arc::clone(&ckpt),
                config.device,
                config.kernel_cache_dir.clone(),
                fp8_scales,
                kind.fp8_min_rows(),
            )?
        } else {
            let threads = match config.threads {
                Some(n @ 1..=cpu::MAX_THREADS) => n,
                Some(n) => return Err(Error::invalid("config.threads", format!("{n} threads: must be 1 to {}", cpu::MAX_THREADS))),
                None => std::thread::available_parallelism().map_or(1, |n| n.get()).min(cpu::MAX_THREADS),
            };
            let cpu = CpuBackend::new(plan, weights, &ckpt, threads)?;
            if fp8_scales.is_empty() { Box::new(cpu) } else { Box::new(cpu.with_fp8(&fp8_scales)) }
        };
        // Every weight is in the backend now; refuse what a file that changed under us gave.
        ckpt.reads_ok()?;
        log::info!("opened {} in {:.2?}", config.checkpoint.display(), started.elapsed());

        Ok(Policy {
            model: info,
            io,
            processing,
            max_frame: (config.max_frame_width, config.max_frame_height),
            backend,
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            stats: LatencyStats::new(),
            deadline: config.deadline,
            has_chunk: false,
            fault: None,
            checkpoint: config.checkpoint.clone(),
            calibration,
        })
    }

    pub fn info(&self) -> PolicyInfo {
        let m = &self.model;
        PolicyInfo {
            model: m.kind.name(),
            backend: self.backend.name(),
            precision: match (self.backend.name(), &self.calibration) {
                ("cpu", None) => "f32",
                ("cpu", Some(_)) => "fp8-emulated",
                (_, None) => "bf16",
                (_, Some(_)) => "fp8",
            },
            device: self.backend.device_name(),
            cameras: m.cameras.clone(),
            state_dim: m.state_dim,
            action_dim: m.action_dim,
            horizon: m.horizon,
            denoise_steps: m.denoise_steps,
            prompt_capacity: m.prompt_capacity,
            parameters: m.parameters,
            memory_bytes: self.backend.memory_bytes(),
            config: m.config.clone(),
            embodiment: m.embodiment.clone(),
            embodiments: m.embodiments.clone(),
        }
    }

    /// Length of the action buffer `step` fills: `horizon × action_dim`.
    pub fn actions_len(&self) -> usize {
        self.model.horizon * self.model.action_dim
    }

    /// Length of an observation's optional noise: `horizon × model action width`.
    pub fn noise_len(&self) -> usize {
        self.io.noise.len()
    }

    /// Whether the policy was opened with real-time chunking (`PolicyConfig::rtc`), i.e. whether
    /// `step_continuing` accepts a continuation.
    pub fn rtc_enabled(&self) -> bool {
        self.io.rtc.is_some()
    }

    /// Largest frame `step` accepts (`PolicyConfig::max_frame_width` × `max_frame_height`).
    pub fn max_frame(&self) -> (usize, usize) {
        self.max_frame
    }

    /// The checkpoint path the policy was opened from.
    pub fn checkpoint_path(&self) -> &std::path::Path {
        &self.checkpoint
    }

    /// What the model derived from its checkpoint (for calibration keys).
    pub(crate) fn model(&self) -> &ModelInfo {
        &self.model
    }

    /// See [`Backend::swap_product_probe`].
    pub(crate) fn swap_product_probe(&mut self, probe: Option<ProductProbe>) -> Result<Option<ProductProbe>> {
        self.backend.swap_product_probe(probe)
    }

    /// The FP8 calibration in use (opened with [`Precision::Fp8`]) and its file.
    pub fn calibration(&self) -> Option<(&std::path::Path, &Calibration)> {
        self.calibration.as_ref().map(|(path, c)| (path.as_path(), c))
    }

    /// The execution plan (ops, buffers, FLOP count).
    pub fn plan(&self) -> &crate::plan::Plan {
        self.backend.plan()
    }

    /// The plan as text: every op with its shapes and the folding decisions, then how the backend
    /// runs it (fusions, fallbacks, switches).
    pub fn explain(&self) -> String {
        let embodiments = match &self.model.embodiment {
            Some(tag) => format!("embodiment: {tag} (set_embodiment switches between {})\n", self.model.embodiments.join(", ")),
            None => String::new(),
        };
        let calibration = match &self.calibration {
            Some((path, c)) => format!("calibration {}:\n{}", path.display(), c.describe()),
            None => String::new(),
        };
        format!(
            "{}{embodiments}{}{calibration}{} backend on {}:\n{}",
            self.backend.plan().explain(),
            self.io.describe(),
            self.backend.name(),
            self.backend.device_name(),
            self.backend.lowering()
        )
    }

    /// Sets the task text (Pi0.5 appends the state to it in every step). A text that is empty or
    /// only whitespace is refused; one longer than the prompt capacity is truncated with a warning.
    pub fn set_prompt(&mut self, text: &str) -> Result<()> {
        self.usable()?;
        self.processing.set_prompt(text)
    }

    /// Switches the embodiment (GR00T's tag) the next steps run for: the embodiment-specific
    /// weights the plan selects by a value in a host input (no reopening, recapture or device
    /// allocation) and the statistics that normalize the state and decode the actions. Not the
    /// hot path. The cameras, state and action widths and the horizon become the new
    /// embodiment's: read [`Policy::info`] again. An unknown tag (or Pi0.5, which has no
    /// embodiments) is refused with the known ones named, and the previous embodiment stays.
    pub fn set_embodiment(&mut self, tag: &str) -> Result<()> {
        let e = self.processing.set_embodiment(tag)?;
        let m = &mut self.model;
        (m.cameras, m.state_dim, m.action_dim, m.horizon, m.embodiment) = (e.cameras, e.state_dim, e.action_dim, e.horizon, Some(e.tag));
        // A chunk of another embodiment is nothing to continue.
        self.has_chunk = false;
        Ok(())
    }

    /// Sets the full prompt as token ids (Pi0.5: BOS, task, state and all); used as given in
    /// every step.
    pub fn set_prompt_tokens(&mut self, ids: &[i32]) -> Result<()> {
        self.usable()?;
        self.processing.set_prompt_tokens(ids)
    }

    /// Why the policy is unusable, if a step failed inside its backend: every call that steps or
    /// sets a prompt then returns [`Error::Faulted`] with this text. `None` while it works.
    pub fn fault(&self) -> Option<&str> {
        self.fault.as_deref()
    }

    /// Fault injection, for testing what a controller does when the device fails: the next step
    /// that passes validation runs and then fails as a device error would (on a GPU: after
    /// launching its graph), which marks the policy faulted like a real failure.
    #[doc(hidden)]
    pub fn inject_fault(&mut self) {
        self.backend.fail_next_run();
    }

    /// Marks the policy unusable after `e`, a backend failure in a step.
    fn faulted(&mut self, e: Error) -> Error {
        let cause = e.to_string();
        log::error!("step failed in the {} backend, the policy is unusable from now on: {cause}", self.backend.name());
        self.fault = Some(cause.clone());
        Error::Faulted(cause)
    }

    fn usable(&self) -> Result<()> {
        match &self.fault {
            None => Ok(()),
            Some(cause) => Err(Error::Faulted(cause.clone())),
        }
    }

    /// One control tick: `actions` receives `[horizon × action_dim]` row-major, unnormalized.
    /// Under real-time chunking (`PolicyConfig::rtc`) the chunk starts afresh, unguided.
    pub fn step(&mut self, obs: &Observation, actions: &mut [f32]) -> Result<StepInfo> {
        self.step_continuing(obs, None, actions)
    }

    /// [`Policy::step`] that continues the chunk this policy's previous step returned, by
    /// real-time chunking ([`crate::rtc`]): `continuation` says where the robot is in that chunk.
    /// Needs a policy opened with `PolicyConfig::rtc`; `None` (or a previous chunk that is used
    /// up) samples an unguided chunk.
    pub fn step_continuing(&mut self, obs: &Observation, continuation: Option<Continuation>, actions: &mut [f32]) -> Result<StepInfo> {
        self.usable()?;
        self.stage_continuation(continuation)?;
        self.step_with(obs, actions, |backend| backend.run())
    }

    /// Validates a continuation and writes the RTC inputs (before the observation is staged:
    /// a refused continuation changes nothing). Does not allocate.
    fn stage_continuation(&mut self, continuation: Option<Continuation>) -> Result<()> {
        let Some(ports) = &self.io.rtc else {
            return match continuation {
                Some(_) => Err(Error::invalid("continuation", "the policy was opened without real-time chunking (PolicyConfig::rtc)")),
                None => Ok(()),
            };
        };
        // Before any chunk there is nothing to continue.
        ports.stage(continuation.filter(|_| self.has_chunk), self.backend.as_mut());
        Ok(())
    }

    /// [`Policy::step`], stopping after each phase of the plan to call `after_phase` with its
    /// name and a reader of the plan's f32 buffers by name: what later phases overwrite — each
    /// denoise step's action chunk, say — can be compared against a reference. CPU backend only;
    /// allocates (for parity checks and debugging, not the control loop).
    pub fn step_traced(
        &mut self,
        obs: &Observation,
        actions: &mut [f32],
        mut after_phase: impl FnMut(&str, &dyn Fn(&str) -> Option<Vec<f32>>),
    ) -> Result<StepInfo> {
        self.step_with(obs, actions, |backend| {
            backend.run_traced(&mut |phase, backend| after_phase(phase, &|name| backend.read_buffer(name)))
        })
    }

    fn step_with(&mut self, obs: &Observation, actions: &mut [f32], run: impl FnOnce(&mut dyn Backend) -> Result<()>) -> Result<StepInfo> {
        let started = Instant::now();
        self.usable()?;
        self.validate(obs, actions)?;
        let prompt_tokens = self.processing.stage(obs.state, self.backend.as_mut())?;
        self.io.stage_frames(obs.cameras, self.backend.as_mut());
        let noise = self.backend.input_f32(self.io.noise.buf);
        match obs.noise {
            Some(n) => noise.copy_from_slice(n),
            None => noise.iter_mut().for_each(|v| *v = StandardNormal.sample(&mut self.rng)),
        }

        let run_started = Instant::now();
        match run(self.backend.as_mut()) {
            Ok(()) => {}
            // A request the backend cannot serve (a traced step of a captured graph): nothing ran.
            Err(e @ Error::InvalidArgument { .. }) => return Err(e),
            // The device failed mid-step: its buffers (and on a GPU its context) are in an unknown
            // state, and nothing here can prove otherwise. Refuse from now on rather than guess.
            Err(e) => return Err(self.faulted(e)),
        }
        self.has_chunk = true;
        let backend_time = run_started.elapsed();
        self.processing.finish(obs.state, self.backend.output_f32(self.io.actions.buf), actions);

        let latency = started.elapsed();
        let deadline_missed = self.deadline.is_some_and(|d| latency > d);
        self.stats.record(latency, deadline_missed);
        Ok(StepInfo { latency, backend_time, prompt_tokens, deadline_missed })
    }

    fn validate(&self, obs: &Observation, actions: &[f32]) -> Result<()> {
        let cameras = self.io.cameras();
        if obs.cameras.len() != cameras {
            return Err(Error::invalid(
                "observation.cameras",
                format!("{} given, the policy has {cameras} camera slots (use None for a missing camera)", obs.cameras.len()),
            ));
        }
        if obs.cameras.iter().all(Option::is_none) {
            return Err(Error::invalid("observation.cameras", "every camera is missing; at least one frame is required"));
        }
        for (i, frame) in obs.cameras.iter().enumerate() {
            if let Some(f) = frame {
                f.validate(camera_field(i), self.max_frame.0, self.max_frame.1)?;
                if self.io.square_frames && f.width != f.height {
                    return Err(Error::invalid(
                        camera_field(i),
                        format!(
                            "a {}x{} frame: this checkpoint's image transform (albumentations, without letterbox) keeps the \
                             aspect ratio, and only a square frame gives the square image its token grid is sized for; \
                             crop or pad the frame to a square",
                            f.width, f.height
                        ),
                    ));
                }
            }
        }
        if obs.state.len() != self.model.state_dim {
            return Err(Error::invalid(
                "observation.state",
                format!("{} values given, the policy expects {}", obs.state.len(), self.model.state_dim),
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
            let (horizon, action_dim) = (self.model.horizon, self.model.action_dim);
            return Err(Error::invalid(
                "actions",
                format!(
                    "buffer holds {} values, expected horizon {horizon} x action dim {action_dim} = {}",
                    actions.len(),
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
