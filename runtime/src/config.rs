//! What a caller chooses when opening a policy. Its own module so that the model modules, which
//! read the choices that shape their plans, need not import the policy that holds them.

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::{BackendKind, Precision};
use crate::rtc::RtcConfig;

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
    /// Prompt token capacity; default: config.json `tokenizer_max_length` (else 200) for Pi0.5,
    /// 64 text tokens for GR00T.
    pub prompt_len: Option<usize>,
    /// GR00T: the embodiment tag (`embodiment_id.json` / processor_config.json); default: the
    /// checkpoint's only one. Pi0.5 has none.
    pub embodiment: Option<String>,
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
    /// Real-time chunking ([`crate::rtc`]): the plan continues the previous chunk when a step says
    /// where the robot is in it ([`crate::Policy::step_continuing`]). Pi0.5 takes a guidance
    /// schedule, GR00T N1.7 the `ramp` schedule; each refuses the other's (`config.rtc.schedule`).
    pub rtc: Option<RtcConfig>,
    /// With [`Precision::Fp8`]: the calibration file (`flashrt calibrate`); default:
    /// [`crate::calibration::DEFAULT_FILE`] beside the checkpoint. One made for another
    /// checkpoint, plan or runtime version is refused.
    pub fp8_calibration: Option<PathBuf>,
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
            embodiment: None,
            prompt_buckets: true,
            denoise_steps: None,
            tokenizer: None,
            state_dim: None,
            seed: 0,
            deadline: None,
            progress: false,
            threads: None,
            rtc: None,
            fp8_calibration: None,
        }
    }
}
