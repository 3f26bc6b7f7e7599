//! What the fuzz targets share: the micro Pi0.5 checkpoint, synthesized once per process, and
//! policies opened on it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use flashrt::models::pi05::synth::{SynthSize, synthesize};
use flashrt::{BackendKind, Policy, PolicyConfig, RtcConfig};

/// A scratch directory for the whole process, `flashrt-fuzz-<pid>`: on tmpfs when there is one
/// (the checkpoint target rewrites a file per input). libFuzzer ends the process with `exit`,
/// which runs no destructors, so each process removes the directories of earlier ones that are
/// gone (a few MB each, in memory on tmpfs).
pub fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        for entry in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let pid = entry.file_name().to_str().and_then(|n| n.strip_prefix("flashrt-fuzz-")).and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = base.join(format!("flashrt-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    })
}

/// The micro Pi0.5 (tiny widths, 56x56 images, 3 cameras, state 8, actions 7) with its statistics,
/// tokenizer and config.json, written once.
pub fn micro_pi05() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch_dir().join("pi05_micro");
        synthesize(&dir, SynthSize::Micro, 7, &|_| {}).expect("synthesize the micro Pi0.5");
        dir
    })
}

/// Frames larger than this are refused by the policies below: keeps every input's buffers small.
pub const MAX_FRAME: usize = 96;

/// The open configuration every target uses: CPU, one thread (libFuzzer runs one input at a time;
/// worker threads would only add scheduling noise), small frames.
pub fn cpu_config(checkpoint: &Path) -> PolicyConfig {
    let mut config = PolicyConfig::new(checkpoint);
    config.backend = BackendKind::Cpu;
    config.threads = Some(1);
    config.progress = false;
    config.max_frame_width = MAX_FRAME;
    config.max_frame_height = MAX_FRAME;
    config
}

/// Denoising steps and prompt capacity of the stepping targets: the code paths of the defaults
/// (10 and 200) at a fraction of the cost per step, so more inputs run per second.
pub const DENOISE_STEPS: usize = 2;
pub const PROMPT_CAPACITY: usize = 64;

/// A micro Pi0.5 policy with a text prompt set; with real-time chunking when `rtc`.
pub fn open_micro(rtc: bool) -> Policy {
    let mut config = cpu_config(micro_pi05());
    config.denoise_steps = Some(DENOISE_STEPS);
    config.prompt_len = Some(PROMPT_CAPACITY);
    if rtc {
        config.rtc = Some(RtcConfig::default());
    }
    let mut policy = Policy::open(&config).expect("open the micro Pi0.5");
    policy.set_prompt("pick up the red block").expect("set the prompt");
    policy
}

/// A valid observation for `policy`: every camera present (packed RGB, a gradient), a state
/// inside the statistics' range, no noise. The targets step it after a refused input to prove the
/// policy is still usable.
pub struct ValidInput {
    pub frames: Vec<Vec<u8>>,
    pub state: Vec<f32>,
    pub actions: Vec<f32>,
    pub side: usize,
}

impl ValidInput {
    pub fn new(policy: &Policy) -> ValidInput {
        let info = policy.info();
        let side = 32;
        let frames = (0..info.cameras.len()).map(|c| (0..side * side * 3).map(|i| (i * 7 + c * 31) as u8).collect()).collect();
        let state = (0..info.state_dim).map(|i| 0.1 * i as f32 - 0.3).collect();
        ValidInput { frames, state, actions: vec![0.0; policy.actions_len()], side }
    }

    /// Steps `policy` with this input; panics (a fuzz finding) unless the step succeeds and every
    /// action is finite.
    pub fn step_must_succeed(&mut self, policy: &mut Policy, after: &str) {
        let cams: Vec<Option<flashrt::Frame>> =
            self.frames.iter().map(|f| Some(flashrt::Frame::packed(f, self.side, self.side, flashrt::PixelFormat::Rgb8))).collect();
        let obs = flashrt::Observation { cameras: &cams, state: &self.state, noise: None };
        if let Err(e) = policy.step(&obs, &mut self.actions) {
            panic!("a valid step failed after {after}: {e}");
        }
        assert!(self.actions.iter().all(|a| a.is_finite()), "non-finite actions after {after}");
    }
}
