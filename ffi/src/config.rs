//! `FrtPolicyConfig`: what `frt_policy_open` needs, filled with defaults by
//! `frt_policy_config_default`.

use std::ffi::{CStr, c_char, c_void};
use std::path::PathBuf;
use std::time::Duration;

use flashrt::{BackendKind, PolicyConfig, Precision, RtcConfig, RtcSchedule};

use crate::boundary::guard;
use crate::logging::{FrtLogCallback, FrtLogLevel, Sink};
use crate::status::{Failure, FrtStatus, finish_on_thread, struct_size};

/// Most camera slots a policy may have through the C ABI (`frt_policy_step` stages the frames in a
/// fixed array on the stack, so it never allocates).
pub const FRT_MAX_CAMERAS: usize = 16;

/// Which backend executes the policy (`FrtPolicyConfig.backend`, `FrtPolicyInfo.backend`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrtBackend {
    /// CUDA when a driver and GPU are present, else the CPU.
    Auto = 0,
    /// The f32 CPU reference backend.
    Cpu = 1,
    /// The CUDA backend.
    Cuda = 2,
}

/// Numeric precision of weights and activations (`FrtPolicyConfig.precision`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrtPrecision {
    /// The backend's best: f32 on the CPU, bf16 on CUDA.
    Auto = 0,
    F32 = 1,
    Bf16 = 2,
    Fp8 = 3,
}

/// Real-time chunking's prefix-weight schedule (`FrtPolicyConfig.rtc_schedule`; see
/// `frt_policy_step_continuing`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrtRtcSchedule {
    /// No real-time chunking (the default).
    Off = 0,
    /// Weight 1 for the rows executed during inference, 0 after.
    Zeros = 1,
    /// Weight 1 up to the execution horizon.
    Ones = 2,
    /// 1 for the rows executed during inference, falling linearly to 0 at the execution horizon.
    Linear = 3,
    /// As linear, each weight w shaped to w (e^w - 1) / (e - 1).
    Exp = 4,
    /// GR00T N1.7's real-time chunking (no guidance): the new chunk starts from the rest of the
    /// previous one up to the execution horizon, the rows executed during inference frozen, the
    /// velocity of the others ramped up (rate: the checkpoint's `rtc_ramp_rate`). GR00T takes only
    /// this one, Pi0.5 only the others.
    Ramp = 5,
}

/// Everything `frt_policy_open` needs. Fill it with `frt_policy_config_default` (after setting
/// `struct_size`), then set `checkpoint` and whatever else differs. Zero in an optional count
/// means "from the checkpoint". The library keeps no pointer from this struct after
/// `frt_policy_open` returns, except `log_callback` and `log_user_data`.
#[repr(C)]
pub struct FrtPolicyConfig {
    /// `sizeof(FrtPolicyConfig)`, set by the caller before any call that takes the struct.
    pub struct_size: usize,
    /// Checkpoint directory (lerobot layout) or `.safetensors` file; NUL-terminated. Required.
    pub checkpoint: *const c_char,
    /// `tokenizer.json`; NULL: the one beside the checkpoint, if any (without a tokenizer only
    /// `frt_policy_set_prompt_tokens` works).
    pub tokenizer: *const c_char,
    /// Where a GPU backend caches compiled kernels; NULL: `$XDG_CACHE_HOME/flashrt/kernels`.
    pub kernel_cache_dir: *const c_char,
    /// An `FrtBackend` value. Default `FRT_BACKEND_AUTO`.
    pub backend: u32,
    /// An `FrtPrecision` value. Default `FRT_PRECISION_AUTO`.
    pub precision: u32,
    /// GPU ordinal for the CUDA backend. Default 0.
    pub device: u32,
    /// Least severe `FrtLogLevel` delivered. Default `FRT_LOG_LEVEL_WARN`.
    pub log_level: u32,
    /// Camera slots; 0: the cameras named in the checkpoint's config.json. At most
    /// `FRT_MAX_CAMERAS`.
    pub cameras: usize,
    /// Largest frame `frt_policy_step` accepts, in pixels (staging buffers are sized for it).
    /// Default 1920 x 1080.
    pub max_frame_width: usize,
    pub max_frame_height: usize,
    /// Prompt token capacity; 0: from the checkpoint (config.json `tokenizer_max_length`).
    pub prompt_capacity: usize,
    /// Compute the prefix only for the smallest bucket of 32, 64, 128 slots or the capacity that
    /// holds the step's prompt, picked on the device (default true). false: every slot every
    /// step, so the step time never depends on the prompt's length (Pi0.5's state tokens make
    /// that length move from step to step).
    pub prompt_buckets: bool,
    /// Denoising steps; 0: from the checkpoint (config.json `num_inference_steps`).
    pub denoise_steps: usize,
    /// The robot's state width; 0: from the checkpoint. Needed only when the checkpoint states none;
    /// a value other than the checkpoint's is refused (`FRT_STATUS_INVALID_ARGUMENT`, naming it).
    pub state_dim: usize,
    /// Seed of the noise drawn when an observation carries no noise. Default 0.
    pub seed: u64,
    /// Steps slower than this many microseconds count as deadline misses in the statistics;
    /// 0: no deadline.
    pub deadline_us: u64,
    /// Receives the policy's log messages at or above `log_level`; NULL: they go to stderr.
    pub log_callback: FrtLogCallback,
    /// Passed unchanged to `log_callback`.
    pub log_user_data: *mut c_void,
    /// CPU backend: threads that split each step's GEMMs and attention, the calling one included
    /// (started at open, parked between steps); 0: the available parallelism. At most 64.
    pub threads: usize,
    /// GR00T: the embodiment tag (a key of the checkpoint's `embodiment_id.json` and
    /// `processor_config.json`), NUL-terminated; NULL: the checkpoint's only one. An unknown tag
    /// is refused, naming the known ones. Must be NULL for Pi0.5, which has none.
    pub embodiment: *const c_char,
    /// Real-time chunking: an `FrtRtcSchedule` value — zeros, ones, linear or exp for Pi0.5,
    /// ramp for GR00T N1.7 (each model refuses the other's); `FRT_RTC_SCHEDULE_OFF` (default)
    /// opens the policy without it. With it, `frt_policy_step_continuing` samples each chunk as a
    /// continuation of the previous one (lerobot 0.6.1's RTC for that model).
    pub rtc_schedule: u32,
    /// Real-time chunking: rows of a new chunk that continue the previous one at all. Default 10.
    pub rtc_execution_horizon: usize,
    /// Real-time chunking: upper bound of the guidance weight (positive). Default 10. Pi0.5's
    /// schedules only: ramp has no guidance and ignores it.
    pub rtc_max_guidance_weight: f32,
    /// With `FRT_PRECISION_FP8`: the calibration file (`flashrt calibrate`), NUL-terminated;
    /// NULL: `flashrt_fp8_calibration.json` beside the checkpoint. A missing file, or one made
    /// for another checkpoint, plan or runtime version, is refused with `FRT_STATUS_CALIBRATION`
    /// naming what differs.
    pub fp8_calibration: *const c_char,
}

/// Fills `*config` with the defaults; `config->struct_size` must be set first.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` when `config` is NULL;
/// `FRT_STATUS_INVALID_ARGUMENT` when `struct_size` is smaller than this library's
/// `FrtPolicyConfig` (a header older than the library); the struct is untouched then and
/// `frt_last_error` says which.
///
/// Thread safety: safe to call from any thread.
///
/// # Safety
/// `config` must point to a writable `FrtPolicyConfig`, or be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_config_default(config: *mut FrtPolicyConfig) -> FrtStatus {
    // SAFETY: the caller's promise on config.
    guard(FrtStatus::Panic, || finish_on_thread(unsafe { write_defaults(config) }))
}

/// # Safety
/// As `frt_policy_config_default`.
unsafe fn write_defaults(config: *mut FrtPolicyConfig) -> Result<(), Failure> {
    if config.is_null() {
        return Err(Failure::null("config"));
    }
    // SAFETY: non-NULL and points to a config (caller's promise).
    let size = unsafe { struct_size(config, "config")? };
    let d = PolicyConfig::new("");
    let defaults = FrtPolicyConfig {
        struct_size: size,
        checkpoint: std::ptr::null(),
        tokenizer: std::ptr::null(),
        kernel_cache_dir: std::ptr::null(),
        backend: FrtBackend::Auto as u32,
        precision: FrtPrecision::Auto as u32,
        device: d.device as u32,
        log_level: FrtLogLevel::Warn as u32,
        cameras: 0,
        max_frame_width: d.max_frame_width,
        max_frame_height: d.max_frame_height,
        prompt_capacity: 0,
        prompt_buckets: d.prompt_buckets,
        denoise_steps: 0,
        state_dim: 0,
        seed: d.seed,
        deadline_us: 0,
        log_callback: None,
        log_user_data: std::ptr::null_mut(),
        threads: 0,
        embodiment: std::ptr::null(),
        rtc_schedule: FrtRtcSchedule::Off as u32,
        rtc_execution_horizon: RtcConfig::default().execution_horizon,
        rtc_max_guidance_weight: RtcConfig::default().max_guidance_weight,
        fp8_calibration: std::ptr::null(),
    };
    // SAFETY: the caller's struct is at least as large as ours (checked above).
    unsafe { config.write(defaults) };
    Ok(())
}

fn path(p: *const c_char) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a non-NULL path field is a NUL-terminated string (documented contract).
    (!p.is_null()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(unsafe { CStr::from_ptr(p) }.to_bytes())))
}

fn optional(n: usize) -> Option<usize> {
    (n != 0).then_some(n)
}

fn log_level(n: u32) -> Option<log::LevelFilter> {
    Some(match n {
        0 => log::LevelFilter::Off,
        1 => log::LevelFilter::Error,
        2 => log::LevelFilter::Warn,
        3 => log::LevelFilter::Info,
        4 => log::LevelFilter::Debug,
        5 => log::LevelFilter::Trace,
        _ => return None,
    })
}

/// Where an open with this config logs, before the rest of it is checked: its level and callback,
/// or the defaults (warnings and errors to stderr) when the struct or its level cannot be read, so
/// that every failed open is logged (NULL config and wrong `struct_size` included).
///
/// # Safety
/// As [`read`].
pub(crate) unsafe fn open_sink(config: *const FrtPolicyConfig) -> Sink {
    let default = Sink::new(log::LevelFilter::Warn, None, std::ptr::null_mut());
    // SAFETY: non-NULL configs are readable; struct_size is the first field of any version.
    if config.is_null() || unsafe { (*config).struct_size } < size_of::<FrtPolicyConfig>() {
        return default;
    }
    // SAFETY: at least our version of the struct is readable (checked above).
    let c = unsafe { &*config };
    log_level(c.log_level).map_or(default, |level| Sink::new(level, c.log_callback, c.log_user_data))
}

/// Reads and checks a caller's config into the runtime's config (its log sink is [`open_sink`]'s).
///
/// # Safety
/// `config` points to a readable `FrtPolicyConfig` whose string fields are NUL-terminated or NULL.
pub(crate) unsafe fn read(config: *const FrtPolicyConfig) -> Result<PolicyConfig, Failure> {
    if config.is_null() {
        return Err(Failure::null("config"));
    }
    // SAFETY: non-NULL and readable (caller's promise).
    unsafe { struct_size(config, "config")? };
    // SAFETY: at least our version of the struct is readable (checked above).
    let c = unsafe { &*config };
    let checkpoint = path(c.checkpoint).ok_or_else(|| Failure::null("config.checkpoint"))?;
    let mut out = PolicyConfig::new(checkpoint);
    out.tokenizer = path(c.tokenizer);
    out.kernel_cache_dir = path(c.kernel_cache_dir);
    out.fp8_calibration = path(c.fp8_calibration);
    out.backend = match c.backend {
        0 => BackendKind::Auto,
        1 => BackendKind::Cpu,
        2 => BackendKind::Cuda,
        n => return Err(Failure::invalid("config.backend", format!("{n} is not an FrtBackend value"))),
    };
    out.precision = match c.precision {
        0 => Precision::Auto,
        1 => Precision::F32,
        2 => Precision::Bf16,
        3 => Precision::Fp8,
        n => return Err(Failure::invalid("config.precision", format!("{n} is not an FrtPrecision value"))),
    };
    if log_level(c.log_level).is_none() {
        return Err(Failure::invalid("config.log_level", format!("{} is not an FrtLogLevel value", c.log_level)));
    }
    if c.cameras > FRT_MAX_CAMERAS {
        return Err(Failure::invalid("config.cameras", format!("{} exceeds FRT_MAX_CAMERAS = {FRT_MAX_CAMERAS}", c.cameras)));
    }
    for (field, n) in [("config.max_frame_width", c.max_frame_width), ("config.max_frame_height", c.max_frame_height)] {
        if n == 0 {
            return Err(Failure::invalid(field, "must be positive"));
        }
    }
    out.device = c.device as usize;
    out.cameras = optional(c.cameras);
    out.max_frame_width = c.max_frame_width;
    out.max_frame_height = c.max_frame_height;
    out.prompt_len = optional(c.prompt_capacity);
    out.prompt_buckets = c.prompt_buckets;
    out.denoise_steps = optional(c.denoise_steps);
    out.state_dim = optional(c.state_dim);
    out.seed = c.seed;
    out.threads = optional(c.threads);
    if !c.embodiment.is_null() {
        // SAFETY: a non-NULL string field is NUL-terminated (documented contract).
        let tag = unsafe { CStr::from_ptr(c.embodiment) }.to_str();
        out.embodiment = Some(tag.map_err(|_| Failure::invalid("config.embodiment", "not UTF-8"))?.to_string());
    }
    out.deadline = (c.deadline_us != 0).then(|| Duration::from_micros(c.deadline_us));
    let schedule = match c.rtc_schedule {
        0 => None,
        1 => Some(RtcSchedule::Zeros),
        2 => Some(RtcSchedule::Ones),
        3 => Some(RtcSchedule::Linear),
        4 => Some(RtcSchedule::Exp),
        5 => Some(RtcSchedule::Ramp),
        n => return Err(Failure::invalid("config.rtc_schedule", format!("{n} is not an FrtRtcSchedule value"))),
    };
    if let Some(schedule) = schedule {
        if schedule.guided() && !(c.rtc_max_guidance_weight > 0.0 && c.rtc_max_guidance_weight.is_finite()) {
            return Err(Failure::invalid("config.rtc_max_guidance_weight", format!("{} must be positive", c.rtc_max_guidance_weight)));
        }
        out.rtc = Some(RtcConfig { schedule, max_guidance_weight: c.rtc_max_guidance_weight, execution_horizon: c.rtc_execution_horizon });
    }
    Ok(out)
}
