//! `flashrt soak`: long runs that look for what short tests cannot see — memory or file
//! descriptors that grow slowly, latency that drifts, a policy that stops working after errors.
//!
//! [`steps`] runs a policy for a bounded number of steps (and seconds) on inputs that change every
//! step: frame sizes, pixel formats, row padding, missing cameras, states and prompts of different
//! lengths, with a bad observation (or a blank prompt) every `bad_every` steps that must be refused
//! by name while the next step succeeds. [`open_close`] opens and drops a policy many times in one
//! process. Both sample the process (RSS, open descriptors, device memory on a GPU) as they go.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::image::{Frame, PixelFormat};
use crate::policy::{Observation, Policy, PolicyConfig};
use crate::stats::summarize;

/// What the process holds at one moment.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ProcessSample {
    pub rss_mib: f64,
    pub open_fds: usize,
    /// Device memory in use (every process's, as the driver reports it); `None` on the CPU.
    pub device_mem_mib: Option<f64>,
}

impl ProcessSample {
    /// Reads `/proc/self/statm` and `/proc/self/fd`; device memory when `policy` runs on a GPU.
    pub fn now(policy: Option<&Policy>) -> ProcessSample {
        let pages = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
            .unwrap_or(0);
        // SAFETY: sysconf only reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
        // Less the descriptor of the listing itself.
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count().saturating_sub(1));
        ProcessSample {
            rss_mib: (pages * page) as f64 / (1 << 20) as f64,
            open_fds,
            device_mem_mib: policy.and_then(device_memory).map(|b| b as f64 / (1 << 20) as f64),
        }
    }
}

/// Device memory in use, asked only of a policy on the CUDA backend (its context is current on
/// this thread after a step; without a GPU the driver must not be called at all).
fn device_memory(policy: &Policy) -> Option<usize> {
    #[cfg(feature = "cuda")]
    if policy.info().backend == "cuda" {
        return crate::cuda::used_device_memory();
    }
    let _ = policy;
    None
}

/// Bounds and mix of a [`steps`] run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// Steps to run (bad ones included).
    pub steps: u64,
    /// Stop earlier when this much time has passed.
    pub max_duration: Duration,
    /// Steps per reported window.
    pub window: u64,
    /// Every this many steps an observation (or prompt) that must be refused; 0: none.
    pub bad_every: u64,
    /// A new prompt every this many steps (cycling through texts of different lengths); 0: one.
    pub prompt_every: u64,
    pub seed: u64,
}

/// One window of a [`steps`] run: its good steps' latency, its errors, and the process at its end.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    /// Steps run so far (the window ends here).
    pub steps: u64,
    pub elapsed_s: f64,
    pub good_steps: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Bad inputs refused by name in this window, as they must be.
    pub refused: u64,
    /// Anything else: a good step that failed or returned non-finite actions, a bad input that
    /// was accepted or refused for the wrong reason. Must stay 0.
    pub unexpected: u64,
    #[serde(flatten)]
    pub process: ProcessSample,
}

/// A whole [`steps`] run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SoakReport {
    pub windows: Vec<Window>,
    pub steps: u64,
    pub good_steps: u64,
    pub refused: u64,
    /// Refusals per kind of bad input, in [`BadInput::ALL`] order.
    pub refused_by_kind: Vec<(String, u64)>,
    pub unexpected: u64,
    /// The first few unexpected outcomes, described.
    pub unexpected_examples: Vec<String>,
    /// "steps" or "time": which bound ended the run.
    pub stopped_by: &'static str,
    pub prompt_changes: u64,
}

/// Inputs a step must refuse, and the field its error must name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadInput {
    NanState,
    ShortState,
    OversizeFrame,
    ShortFrameData,
    NoCamera,
    WrongCameraCount,
    NoiseLength,
    ActionsLength,
    BlankPrompt,
}

impl BadInput {
    pub const ALL: [BadInput; 9] = [
        BadInput::NanState,
        BadInput::ShortState,
        BadInput::OversizeFrame,
        BadInput::ShortFrameData,
        BadInput::NoCamera,
        BadInput::WrongCameraCount,
        BadInput::NoiseLength,
        BadInput::ActionsLength,
        BadInput::BlankPrompt,
    ];

    fn name(self) -> &'static str {
        match self {
            BadInput::NanState => "nan_state",
            BadInput::ShortState => "short_state",
            BadInput::OversizeFrame => "oversize_frame",
            BadInput::ShortFrameData => "short_frame_data",
            BadInput::NoCamera => "no_camera",
            BadInput::WrongCameraCount => "wrong_camera_count",
            BadInput::NoiseLength => "noise_length",
            BadInput::ActionsLength => "actions_length",
            BadInput::BlankPrompt => "blank_prompt",
        }
    }

    /// The start of the field its refusal must name.
    fn field(self) -> &'static str {
        match self {
            BadInput::NanState | BadInput::ShortState => "observation.state",
            BadInput::OversizeFrame | BadInput::ShortFrameData | BadInput::NoCamera | BadInput::WrongCameraCount => "observation.cameras",
            BadInput::NoiseLength => "observation.noise",
            BadInput::ActionsLength => "actions",
            BadInput::BlankPrompt => "prompt",
        }
    }
}

/// Task texts of different lengths (one to ~40 tokens), cycled through by `prompt_every`.
const PROMPTS: [&str; 4] = [
    "pick up the red block and put it in the bowl",
    "stop",
    "open the top drawer of the cabinet on the left, take out the blue towel, fold it twice and lay it flat \
     next to the sink before closing the drawer again",
    "move the cup",
];

/// Frame sizes cycled through (all within the default maximum frame), and row padding in bytes.
const SIZES: [(usize, usize); 4] = [(56, 56), (64, 48), (40, 40), (96, 72)];
const PADDING: [usize; 2] = [0, 12];
const FORMATS: [PixelFormat; 3] = [PixelFormat::Rgb8, PixelFormat::Bgr8, PixelFormat::Rgba8];
/// Camera slots a run varies (frames live in fixed arrays: the loop allocates nothing).
const MAX_CAMERAS: usize = 8;
/// Random pixel buffers per size and format (so frames change between steps).
const VARIANTS: usize = 3;

/// Pixels for every (variant, size, format), each large enough for the widest padding.
struct Pixels {
    buffers: Vec<Vec<u8>>,
}

impl Pixels {
    fn new(rng: &mut ChaCha8Rng) -> Pixels {
        let mut buffers = Vec::new();
        for _ in 0..VARIANTS {
            for (w, h) in SIZES {
                for format in FORMATS {
                    let stride = w * format.bytes_per_pixel() + PADDING[PADDING.len() - 1];
                    buffers.push((0..stride * h).map(|_| rng.random()).collect());
                }
            }
        }
        Pixels { buffers }
    }

    /// Camera `camera`'s frame at step `i`.
    fn frame(&self, i: u64, camera: usize) -> Frame<'_> {
        let (i, c) = (i as usize, camera);
        let (size, format, padding) = ((i + c) % SIZES.len(), (i / 3 + c) % FORMATS.len(), (i / 5 + c) % PADDING.len());
        let variant = (i / 7) % VARIANTS;
        let data = &self.buffers[(variant * SIZES.len() + size) * FORMATS.len() + format];
        let (width, height) = SIZES[size];
        let format = FORMATS[format];
        Frame { data, width, height, stride: width * format.bytes_per_pixel() + PADDING[padding], format }
    }
}

/// Runs `config.steps` steps (or until `config.max_duration`) on `policy`; `on_window` sees the
/// report after every window (to print it, or write it so a stopped run leaves its windows).
pub fn steps(policy: &mut Policy, config: &SoakConfig, mut on_window: impl FnMut(&SoakReport)) -> Result<SoakReport> {
    let info = policy.info();
    let cameras = info.cameras.len();
    if !(1..=MAX_CAMERAS).contains(&cameras) {
        return Err(Error::invalid("policy.cameras", format!("{cameras} camera slots: the soak varies 1 to {MAX_CAMERAS}")));
    }
    if info.state_dim == 0 {
        return Err(Error::invalid("policy.state_dim", "the soak's bad inputs need a state"));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let pixels = Pixels::new(&mut rng);
    let (mut state, mut nan_state) = (vec![0.0f32; info.state_dim], vec![0.0f32; info.state_dim]);
    let mut actions = vec![0.0f32; policy.actions_len()];
    let mut short_actions = vec![0.0f32; policy.actions_len().saturating_sub(1)];
    let bad_noise = vec![0.0f32; policy.noise_len() + 1];
    let (max_width, max_height) = policy.max_frame();
    let oversize = Frame::packed(&[], max_width + 1, max_height, PixelFormat::Rgb8);

    let mut report =
        SoakReport { refused_by_kind: BadInput::ALL.iter().map(|b| (b.name().to_string(), 0)).collect(), ..Default::default() };
    let mut latencies = Vec::with_capacity(config.window as usize);
    let (mut refused, mut unexpected, mut bad_count) = (0, 0, 0usize);
    let note = |report: &mut SoakReport, what: String| {
        if report.unexpected_examples.len() < 10 {
            log::warn!("soak: {what}");
            report.unexpected_examples.push(what);
        }
    };
    policy.set_prompt(PROMPTS[0])?;
    let started = Instant::now();
    let mut i = 0;
    report.stopped_by = "steps";
    while i < config.steps {
        if started.elapsed() >= config.max_duration {
            report.stopped_by = "time";
            break;
        }
        if config.prompt_every > 0 && i > 0 && i % config.prompt_every == 0 {
            policy.set_prompt(PROMPTS[(i / config.prompt_every) as usize % PROMPTS.len()])?;
            report.prompt_changes += 1;
        }
        for (j, s) in state.iter_mut().enumerate() {
            *s = (i as f32 * 0.013 + j as f32 * 0.7).sin();
        }
        // Cameras present: every non-empty subset in turn.
        let mask = 1 + (i as usize % ((1 << cameras) - 1));
        let frames: [Option<Frame>; MAX_CAMERAS + 1] =
            std::array::from_fn(|c| (c < cameras && mask >> c & 1 == 1).then(|| pixels.frame(i, c)));
        let good = Observation { cameras: &frames[..cameras], state: &state, noise: None };

        if config.bad_every > 0 && i % config.bad_every == config.bad_every - 1 {
            let k = bad_count % BadInput::ALL.len();
            let kind = BadInput::ALL[k];
            bad_count += 1;
            nan_state.copy_from_slice(&state);
            nan_state[i as usize % state.len()] = f32::NAN;
            let no_frames = [None; MAX_CAMERAS + 1];
            let (mut oversize_frames, mut short_frames) = (frames, frames);
            oversize_frames[0] = Some(oversize);
            short_frames[0] = Some(Frame { data: &[0; 16], ..pixels.frame(i, 0) });
            let step = |policy: &mut Policy, obs: Observation, actions: &mut [f32]| policy.step(&obs, actions).map(drop);
            let result = match kind {
                BadInput::NanState => step(policy, Observation { state: &nan_state, ..good }, &mut actions),
                BadInput::ShortState => step(policy, Observation { state: &state[..state.len() - 1], ..good }, &mut actions),
                BadInput::OversizeFrame => step(policy, Observation { cameras: &oversize_frames[..cameras], ..good }, &mut actions),
                BadInput::ShortFrameData => step(policy, Observation { cameras: &short_frames[..cameras], ..good }, &mut actions),
                BadInput::NoCamera => step(policy, Observation { cameras: &no_frames[..cameras], ..good }, &mut actions),
                BadInput::WrongCameraCount => step(policy, Observation { cameras: &frames[..cameras + 1], ..good }, &mut actions),
                BadInput::NoiseLength => step(policy, Observation { noise: Some(&bad_noise), ..good }, &mut actions),
                BadInput::ActionsLength => step(policy, good, &mut short_actions),
                BadInput::BlankPrompt => policy.set_prompt(" \t "),
            };
            match result {
                Err(Error::InvalidArgument { field, .. }) if field.starts_with(kind.field()) => {
                    refused += 1;
                    report.refused_by_kind[k].1 += 1;
                }
                Err(e) => {
                    unexpected += 1;
                    note(&mut report, format!("step {i}: {} refused for another reason: {e}", kind.name()));
                }
                Ok(_) => {
                    unexpected += 1;
                    note(&mut report, format!("step {i}: {} was accepted", kind.name()));
                }
            }
        } else {
            let t = Instant::now();
            match policy.step(&good, &mut actions) {
                Ok(_) if actions.iter().all(|a| a.is_finite()) => latencies.push(t.elapsed().as_secs_f64()),
                Ok(_) => {
                    unexpected += 1;
                    note(&mut report, format!("step {i}: non-finite actions"));
                }
                Err(e) => {
                    unexpected += 1;
                    note(&mut report, format!("step {i}: a good observation failed: {e}"));
                }
            }
        }
        i += 1;
        let last = i == config.steps || started.elapsed() >= config.max_duration;
        if i % config.window.max(1) == 0 || last {
            let s = summarize(&latencies);
            report.windows.push(Window {
                steps: i,
                elapsed_s: started.elapsed().as_secs_f64(),
                good_steps: latencies.len() as u64,
                p50_ms: s.p50_ms,
                p99_ms: s.p99_ms,
                max_ms: s.max_ms,
                refused,
                unexpected,
                process: ProcessSample::now(Some(policy)),
            });
            report.steps = i;
            report.good_steps += latencies.len() as u64;
            report.refused += refused;
            report.unexpected += unexpected;
            (refused, unexpected) = (0, 0);
            latencies.clear();
            on_window(&report);
        }
    }
    Ok(report)
}

/// One sample of an [`open_close`] run, taken while the policy of that cycle is open.
#[derive(Clone, Debug, Serialize)]
pub struct CycleSample {
    /// Cycles completed before this one (0: the first open).
    pub cycle: u64,
    pub elapsed_s: f64,
    pub open_ms: f64,
    #[serde(flatten)]
    pub process: ProcessSample,
}

/// A whole [`open_close`] run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpenCloseReport {
    pub cycles: u64,
    pub samples: Vec<CycleSample>,
    /// Cycles whose first step's actions differed from the first cycle's (same seed, same
    /// inputs: must be 0).
    pub mismatched_actions: u64,
    pub stopped_by: &'static str,
    /// The process after the last policy was dropped.
    pub after_last: Option<ProcessSample>,
}

/// Opens `config`, steps once and drops the policy, `cycles` times (or until `max_duration`),
/// sampling the process every `every` cycles; `on_sample` sees the report after each sample.
pub fn open_close(
    config: &PolicyConfig,
    cycles: u64,
    every: u64,
    max_duration: Duration,
    mut on_sample: impl FnMut(&OpenCloseReport),
) -> Result<OpenCloseReport> {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let pixels = Pixels::new(&mut rng);
    let mut report = OpenCloseReport { stopped_by: "cycles", ..Default::default() };
    let mut first: Option<Vec<f32>> = None;
    let started = Instant::now();
    for cycle in 0..cycles {
        if started.elapsed() >= max_duration {
            report.stopped_by = "time";
            break;
        }
        let t = Instant::now();
        let mut policy = Policy::open(config)?;
        let open_ms = t.elapsed().as_secs_f64() * 1e3;
        policy.set_prompt(PROMPTS[0])?;
        let info = policy.info();
        let frames: Vec<Option<Frame>> = (0..info.cameras.len()).map(|c| Some(pixels.frame(0, c))).collect();
        let state = vec![0.25f32; info.state_dim];
        let mut actions = vec![0.0f32; policy.actions_len()];
        policy.step(&Observation { cameras: &frames, state: &state, noise: None }, &mut actions)?;
        match &first {
            None => first = Some(actions),
            Some(expected) => report.mismatched_actions += (*expected != actions) as u64,
        }
        report.cycles = cycle + 1;
        if cycle % every.max(1) == 0 || cycle + 1 == cycles {
            let process = ProcessSample::now(Some(&policy));
            report.samples.push(CycleSample { cycle, elapsed_s: started.elapsed().as_secs_f64(), open_ms, process });
            on_sample(&report);
        }
    }
    report.after_last = Some(ProcessSample::now(None));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::pi05::synth::{SynthSize, synthesize};

    /// The CI smoke of the soak driver: a few hundred steps of the micro policy with every kind of
    /// bad input mixed in. Every bad input is refused by name, every good step succeeds, and the
    /// descriptors stay where they were.
    #[test]
    fn soak_refuses_every_bad_input_and_keeps_descriptors_flat() {
        let dir = tempfile::tempdir().unwrap();
        synthesize(dir.path(), SynthSize::Micro, 5, &|_| {}).unwrap();
        let mut config = PolicyConfig::new(dir.path());
        config.backend = crate::BackendKind::Cpu;
        config.threads = Some(1);
        let mut policy = Policy::open(&config).unwrap();
        // Few steps: every kind of bad input twice, three windows, seven prompts (a step of the
        // micro model costs ~0.5 s under qemu, where the Jetson check runs this test too).
        let soak = SoakConfig { steps: 72, max_duration: Duration::from_secs(120), window: 24, bad_every: 4, prompt_every: 10, seed: 3 };
        let report = steps(&mut policy, &soak, |_| {}).unwrap();
        assert_eq!(report.unexpected, 0, "{:?}", report.unexpected_examples);
        assert_eq!((report.steps, report.refused, report.good_steps), (72, 18, 54));
        assert!(report.refused_by_kind.iter().all(|(_, n)| *n == 2), "{:?}", report.refused_by_kind);
        assert_eq!(report.windows.len(), 3);
        assert_eq!(report.prompt_changes, 7);
        let fds: Vec<usize> = report.windows.iter().map(|w| w.process.open_fds).collect();
        assert!(fds.iter().all(|&n| n == fds[0] && n > 0), "open descriptors changed: {fds:?}");
        assert!(report.windows.iter().all(|w| w.process.rss_mib > 0.0 && w.p99_ms > 0.0));

        let cycles = open_close(&config, 3, 1, Duration::from_secs(120), |_| {}).unwrap();
        assert_eq!((cycles.cycles, cycles.samples.len(), cycles.mismatched_actions), (3, 3, 0));
    }
}
