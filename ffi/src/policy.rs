//! The policy handle and every call made on it.

use std::cell::UnsafeCell;
use std::ffi::{CString, c_char};
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicBool, Ordering};

use flashrt::observation_log::Recorder;
use flashrt::stream::StreamPolicy;
use flashrt::{Continuation, Frame, Observation, PixelFormat, Policy};

use crate::boundary::guard;
use crate::config::{self, FRT_MAX_CAMERAS, FrtBackend, FrtPolicyConfig};
use crate::logging::Sink;
use crate::status::copy_text;
use crate::status::{Failure, FrtStatus, finish_on_thread, struct_size};

/// An open policy: weights, plan, buffers, prompt, statistics and the last error. Opaque.
///
/// The documented rule is one thread at a time per policy. Misuse is made safe for the calls that
/// take `FrtPolicy*`: each holds `busy` while it runs, and a second one that finds it held
/// returns `FRT_STATUS_BUSY` without touching the policy (one atomic swap per call). The state sits
/// in an `UnsafeCell` so the flag can be read through a shared reference while another thread
/// holds the state mutably.
pub struct FrtPolicy {
    busy: AtomicBool,
    state: UnsafeCell<State>,
}

/// What an open policy holds; reached through [`with_policy`] (mutating calls) or
/// [`FrtPolicy::shared`] (the `const FrtPolicy*` calls).
struct State {
    policy: Policy,
    sink: Sink,
    /// Message of the last failing call; cleared (never shrunk) by each call that succeeds.
    last_error: String,
    /// Made at open so the `const FrtPolicy*` calls read plain data only (safe concurrently).
    info: Info,
    explain: String,
    /// The text of the last prompt set (`None` after `frt_policy_set_prompt_tokens`): a recording
    /// started later begins with it.
    prompt: Option<String>,
    /// The observation log of `frt_policy_record_start`.
    recording: Option<Recorder>,
}

struct Info {
    model: CString,
    device: CString,
    /// The names each embodiment the policy has run for gives its cameras and itself, kept until
    /// free (`FrtPolicyInfo` promises its strings and arrays that long, across switches), and
    /// which of them is the active one's.
    names: Vec<Names>,
    active: usize,
    raw: flashrt::PolicyInfo,
    max_frame: (usize, usize),
    actions_len: usize,
    noise_len: usize,
}

/// One embodiment's camera names and tag as C strings (`embodiment` NULL without one).
struct Names {
    /// Owns the strings `camera_ptrs` points into.
    _cameras: Vec<CString>,
    camera_ptrs: Vec<*const c_char>,
    embodiment: Option<CString>,
}

fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

impl Info {
    fn new(policy: &Policy, max_frame: (usize, usize)) -> Info {
        let raw = policy.info();
        let mut info = Info {
            model: cstring(raw.model),
            device: cstring(&raw.device),
            names: Vec::new(),
            active: 0,
            max_frame,
            actions_len: 0,
            noise_len: policy.noise_len(),
            raw,
        };
        info.refresh(policy);
        info
    }

    /// Follows the policy's embodiment: its widths and names.
    fn refresh(&mut self, policy: &Policy) {
        self.raw = policy.info();
        self.actions_len = policy.actions_len();
        let embodiment = self.raw.embodiment.as_deref().map(cstring);
        self.active = match self.names.iter().position(|n| n.embodiment == embodiment) {
            Some(i) => i,
            None => {
                let cameras: Vec<CString> = self.raw.cameras.iter().map(|c| cstring(c)).collect();
                let camera_ptrs = cameras.iter().map(|c| c.as_ptr()).collect();
                self.names.push(Names { _cameras: cameras, camera_ptrs, embodiment });
                self.names.len() - 1
            }
        };
    }

    fn camera_ptrs(&self) -> &[*const c_char] {
        &self.names[self.active].camera_ptrs
    }
}

/// Pixel layout of a frame: interleaved, 8 bits per channel (`FrtFrame.format`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrtPixelFormat {
    Rgb8 = 0,
    Bgr8 = 1,
    Rgba8 = 2,
}

/// One camera frame owned by the caller, read during `frt_policy_step` only.
#[repr(C)]
pub struct FrtFrame {
    /// Pixels: `height` rows of `stride` bytes. Must not be NULL when `present`.
    pub data: *const u8,
    /// Bytes readable at `data`.
    pub data_len: usize,
    /// In pixels; at most the configured `max_frame_width` x `max_frame_height`.
    pub width: usize,
    pub height: usize,
    /// Bytes from one row to the next; 0: tightly packed (`width` x bytes per pixel).
    pub stride: usize,
    /// An `FrtPixelFormat` value.
    pub format: u32,
    /// false: this camera is missing this tick (the other fields are ignored).
    pub present: bool,
}

/// One control tick's inputs.
#[repr(C)]
pub struct FrtObservation {
    /// `sizeof(FrtObservation)`.
    pub struct_size: usize,
    /// One frame per camera slot, in the policy's camera order (`FrtPolicyInfo.camera_names`);
    /// at least one present.
    pub cameras: *const FrtFrame,
    /// Must equal `FrtPolicyInfo.cameras`.
    pub cameras_len: usize,
    /// Raw (unnormalized) robot state; finite values.
    pub state: *const f32,
    /// Must equal `FrtPolicyInfo.state_dim`.
    pub state_len: usize,
    /// Optional initial noise, `FrtPolicyInfo.noise_len` finite values (for reproducible runs);
    /// NULL: drawn from the generator seeded by `FrtPolicyConfig.seed`.
    pub noise: *const f32,
    /// Must be `FrtPolicyInfo.noise_len` when `noise` is set, 0 when it is NULL.
    pub noise_len: usize,
}

/// What one step did.
#[repr(C)]
pub struct FrtStepInfo {
    /// `sizeof(FrtStepInfo)`, set by the caller.
    pub struct_size: usize,
    /// Wall time of the step inside the library.
    pub latency_ms: f64,
    /// Valid prompt tokens this step (state tokens included).
    pub prompt_tokens: usize,
    /// The step took longer than `FrtPolicyConfig.deadline_us`.
    pub deadline_missed: bool,
}

/// What an open policy is. Strings and arrays belong to the policy: valid until `frt_policy_free`.
#[repr(C)]
pub struct FrtPolicyInfo {
    /// `sizeof(FrtPolicyInfo)`, set by the caller.
    pub struct_size: usize,
    /// Model kind, e.g. "pi05".
    pub model: *const c_char,
    /// The backend in use (never `FRT_BACKEND_AUTO`).
    pub backend: FrtBackend,
    /// The device that runs the policy, e.g. "NVIDIA H200" or the CPU model.
    pub device_name: *const c_char,
    /// Action values per row of the chunk (the robot's action width).
    pub action_dim: usize,
    /// Rows of the action chunk.
    pub horizon: usize,
    /// `horizon * action_dim`: the `actions_len` that `frt_policy_step` expects.
    pub actions_len: usize,
    /// Values of the robot state (`FrtObservation.state_len`).
    pub state_dim: usize,
    /// Length of an optional `FrtObservation.noise`.
    pub noise_len: usize,
    /// Camera slots (`FrtObservation.cameras_len`).
    pub cameras: usize,
    /// `cameras` camera names (e.g. "observation.images.base_0_rgb"), in slot order.
    pub camera_names: *const *const c_char,
    /// Largest frame accepted.
    pub max_frame_width: usize,
    pub max_frame_height: usize,
    pub denoise_steps: usize,
    /// Prompt token capacity (task and state tokens).
    pub prompt_capacity: usize,
    /// Model parameters.
    pub parameters: u64,
    /// Bytes of weights and buffers held (device memory for a GPU backend).
    pub memory_bytes: u64,
    /// The embodiment the steps run for (GR00T's tag, `frt_policy_set_embodiment`); NULL for a
    /// model without embodiments (Pi0.5).
    pub embodiment: *const c_char,
}

/// Step latency statistics: percentiles over the most recent 8192 steps, count, maximum and
/// deadline misses over all steps since open or `frt_policy_reset_stats`.
#[repr(C)]
pub struct FrtLatencyStats {
    /// `sizeof(FrtLatencyStats)`, set by the caller.
    pub struct_size: usize,
    pub count: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub deadline_misses: u64,
}

/// Opens a checkpoint: loads and converts the weights, builds the plan and its buffers and warms
/// the backend. Slow (not for the control loop); call once.
///
/// On success `*out` receives the policy, to be released with `frt_policy_free`. On failure `*out`
/// is untouched and `frt_last_error` describes the problem; every failure is also logged at
/// `FRT_LOG_LEVEL_ERROR`, through the config's `log_level` and `log_callback`, or to stderr when
/// they cannot be read (`config` NULL, `struct_size` too small, `log_level` not a level).
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` (`config`, `out` or `config->checkpoint` is
/// NULL); `FRT_STATUS_INVALID_ARGUMENT` (a config field is wrong: `struct_size`, an enum value, a
/// zero frame size, more than `FRT_MAX_CAMERAS` cameras, a zero/unfit prompt capacity or denoise
/// count, ...); `FRT_STATUS_IO` (a file is missing or unreadable); `FRT_STATUS_CHECKPOINT` (the
/// checkpoint is corrupt or inconsistent); `FRT_STATUS_TOKENIZER` (the tokenizer is unusable);
/// `FRT_STATUS_BACKEND` (the backend or precision cannot run here); `FRT_STATUS_PANIC`.
///
/// Thread safety: safe to call from any thread; policies are independent of each other.
///
/// # Safety
/// `config` must point to a readable `FrtPolicyConfig` whose string fields are NUL-terminated or
/// NULL; `out` must be writable. Either may be NULL (reported as such).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_open(config: *const FrtPolicyConfig, out: *mut *mut FrtPolicy) -> FrtStatus {
    guard(FrtStatus::Panic, || {
        // SAFETY: the caller's promise on config.
        let sink = unsafe { config::open_sink(config) };
        let _scope = sink.enter();
        let opened = if out.is_null() { Err(Failure::null("out")) } else { unsafe { open(config, sink) } };
        if let Err(f) = &opened {
            log::error!("frt_policy_open: {}", f.message);
        }
        finish_on_thread(opened.map(|policy| {
            // SAFETY: non-NULL, writable by the caller's promise.
            unsafe { *out = Box::into_raw(Box::new(policy)) };
        }))
    })
}

/// # Safety
/// As `frt_policy_open`'s `config`.
unsafe fn open(config: *const FrtPolicyConfig, sink: Sink) -> Result<FrtPolicy, Failure> {
    // SAFETY: forwarded caller's promise.
    let config = unsafe { config::read(config)? };
    Policy::open(&config).map_err(Failure::from).and_then(|policy| {
        let raw = policy.info();
        if raw.cameras.len() > FRT_MAX_CAMERAS {
            let msg = format!("the checkpoint has {} cameras, more than FRT_MAX_CAMERAS = {FRT_MAX_CAMERAS}", raw.cameras.len());
            return Err(Failure::invalid("config.cameras", msg));
        }
        let info = Info::new(&policy, (config.max_frame_width, config.max_frame_height));
        // Room for typical messages, so a failing step need not allocate for its text.
        let last_error = String::with_capacity(1024);
        let state = State { explain: policy.explain(), policy, sink, last_error, info, prompt: None, recording: None };
        Ok(FrtPolicy { busy: AtomicBool::new(false), state: UnsafeCell::new(state) })
    })
}

/// Releases a policy and everything it holds. NULL is accepted and ignored.
///
/// Thread safety: no other call may use `policy` during or after this call.
///
/// # Safety
/// `policy` must come from `frt_policy_open` and not have been freed, or be NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_free(policy: *mut FrtPolicy) {
    guard((), || {
        if !policy.is_null() {
            // SAFETY: made by Box::into_raw in frt_policy_open, freed once (caller's promise).
            drop(unsafe { Box::from_raw(policy) });
        }
    })
}

/// Describes the policy: model, backend, device, sizes and camera names.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` when
/// `info->struct_size` is below `sizeof(FrtPolicyInfo)`. A failure's message is in
/// `frt_last_error` (a `const` call writes nothing to the policy).
///
/// Thread safety: `const`: may run concurrently with other `const FrtPolicy*` calls.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `info` writable or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_info(policy: *const FrtPolicy, info: *mut FrtPolicyInfo) -> FrtStatus {
    // SAFETY: the caller's promises.
    guard(FrtStatus::Panic, || finish_on_thread(unsafe { write_info(policy, info) }))
}

/// # Safety
/// As `frt_policy_info`.
unsafe fn write_info(policy: *const FrtPolicy, info: *mut FrtPolicyInfo) -> Result<(), Failure> {
    // SAFETY: valid or NULL (caller's promise).
    let p = unsafe { policy.as_ref() }.ok_or_else(|| Failure::null("policy"))?.shared();
    if info.is_null() {
        return Err(Failure::null("info"));
    }
    // SAFETY: non-NULL and writable (caller's promise).
    let size = unsafe { struct_size(info, "info")? };
    let i = &p.info;
    let r = &i.raw;
    let out = FrtPolicyInfo {
        struct_size: size,
        model: i.model.as_ptr(),
        backend: if r.backend == "cuda" { FrtBackend::Cuda } else { FrtBackend::Cpu },
        device_name: i.device.as_ptr(),
        action_dim: r.action_dim,
        horizon: r.horizon,
        actions_len: i.actions_len,
        state_dim: r.state_dim,
        noise_len: i.noise_len,
        cameras: i.camera_ptrs().len(),
        camera_names: i.camera_ptrs().as_ptr(),
        max_frame_width: i.max_frame.0,
        max_frame_height: i.max_frame.1,
        denoise_steps: r.denoise_steps,
        prompt_capacity: r.prompt_capacity,
        parameters: r.parameters as u64,
        memory_bytes: r.memory_bytes as u64,
        embodiment: i.names[i.active].embodiment.as_ref().map_or(std::ptr::null(), |e| e.as_ptr()),
    };
    // SAFETY: the caller's struct holds at least ours.
    unsafe { info.write(out) };
    Ok(())
}

/// Sets the task text (UTF-8, `len` bytes, no NUL needed). It is tokenized once here; the state is
/// appended in every step (Pi0.5 prompt format). Needs a tokenizer. May allocate: not for the
/// control loop's hot path, but fine between chunks.
///
/// A prompt longer than the capacity is truncated, as lerobot does, and logged once as a warning
/// naming how many tokens may be dropped and whether the state tokens survive. A text that is
/// empty or only whitespace is refused (it would drop the instruction without a word).
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (not UTF-8,
/// empty or whitespace-only text);
/// `FRT_STATUS_TOKENIZER` (no tokenizer loaded, or it cannot encode the text); `FRT_STATUS_FAULTED`
/// (a step failed in the device before); `FRT_STATUS_PANIC`.
/// On failure the previous prompt stays in effect.
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `text` readable for `len` bytes or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_set_prompt(policy: *mut FrtPolicy, text: *const c_char, len: usize) -> FrtStatus {
    // SAFETY: valid or NULL (caller's promise).
    with_policy(policy, |p| {
        if text.is_null() {
            return p.fail(Failure::null("text"));
        }
        // SAFETY: len readable bytes (caller's promise).
        let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) };
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                let result = p.set_prompt(s);
                p.done(result)
            }
            Err(e) => p.fail(Failure::invalid("text", format_args!("not valid UTF-8 ({e})"))),
        }
    })
}

/// Sets the complete prompt as token ids (BOS, task, state and all), used unchanged in every
/// step; for callers that tokenize themselves.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (`len` is 0
/// or above the prompt capacity, or an id is outside the vocabulary); `FRT_STATUS_FAULTED` (a step
/// failed in the device before); `FRT_STATUS_PANIC`. On failure the previous prompt stays in effect.
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `tokens` readable for `len` values or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_set_prompt_tokens(policy: *mut FrtPolicy, tokens: *const i32, len: usize) -> FrtStatus {
    with_policy(policy, |p| {
        if tokens.is_null() {
            return p.fail(Failure::null("tokens"));
        }
        // SAFETY: len readable values (caller's promise).
        let ids = unsafe { std::slice::from_raw_parts(tokens, len) };
        let result = p.policy.set_prompt_tokens(ids);
        if result.is_ok() {
            p.prompt = None;
            if let Some(r) = &mut p.recording {
                r.set_prompt("");
            }
        }
        p.done(result)
    })
}

/// Switches a GR00T N1.7 policy to another embodiment (UTF-8 tag, `len` bytes, no NUL needed),
/// one of those whose statistics the checkpoint holds, with the cameras it was opened with: the
/// embodiment-specific weights are selected inside the same plan (and CUDA graph) by a value in
/// device memory, so nothing is reopened, recaptured or allocated on the device; the state
/// normalization and action decoding follow the tag. May allocate: not for the control loop.
/// The state width, action width, horizon and camera names become the embodiment's: call
/// `frt_policy_info` again (strings and arrays it returned earlier stay valid until free).
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (not UTF-8,
/// an unknown tag or one with other cameras: `frt_policy_last_error` names it and the tags the
/// policy switches between; a Pi0.5 policy, which has no embodiments); `FRT_STATUS_PANIC`. On
/// failure the previous embodiment stays in effect.
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `tag` readable for `len` bytes or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_set_embodiment(policy: *mut FrtPolicy, tag: *const c_char, len: usize) -> FrtStatus {
    with_policy(policy, |p| {
        if tag.is_null() {
            return p.fail(Failure::null("tag"));
        }
        // SAFETY: len readable bytes (caller's promise).
        let bytes = unsafe { std::slice::from_raw_parts(tag.cast::<u8>(), len) };
        let tag = match std::str::from_utf8(bytes) {
            Ok(tag) => tag,
            Err(e) => return p.fail(Failure::invalid("tag", format_args!("not valid UTF-8 ({e})"))),
        };
        let result = p.policy.set_embodiment(tag);
        if result.is_ok() {
            p.info.refresh(&p.policy);
            p.explain = p.policy.explain();
        }
        p.done(result)
    })
}

/// One control tick: frames and state in, the action chunk out. The hot path: no heap allocation
/// after the first call, no blocking other than the computation itself. The no-allocation promise
/// covers successful steps: a failing step may allocate (the runtime formats its error message;
/// the last-error buffer is reused, so a short message does not grow it).
///
/// `actions` receives `horizon x action_dim` floats, row-major (row = time step), unnormalized
/// (robot units); `actions_len` must be `FrtPolicyInfo.actions_len`. `step_info` may be NULL.
/// Needs a prompt (`frt_policy_set_prompt` or `frt_policy_set_prompt_tokens`).
///
/// The whole observation is checked before anything is touched: on failure `actions` and
/// `step_info` are untouched, the policy stays usable for the next step, and
/// `frt_policy_last_error` names the field ("observation.cameras[1]", "observation.state[3]", ...).
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` (`policy`, `observation`, `actions`,
/// `observation->cameras`, `observation->state`, or the data of a present frame is NULL);
/// `FRT_STATUS_INVALID_ARGUMENT` (a `struct_size` too small, wrong `cameras_len`, `state_len`,
/// `noise_len` or `actions_len`, no present frame, an unknown pixel format, a frame that is empty,
/// larger than the configured maximum, or whose `data_len` or `stride` does not cover its
/// geometry, a NaN or infinite state or noise value, no prompt set); `FRT_STATUS_FAULTED` (the
/// device failed during this or an earlier step: free the policy and open a new one);
/// `FRT_STATUS_PANIC`.
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `observation` readable with its arrays valid for the
/// lengths it states; `actions` writable for `actions_len` floats; `step_info` writable; any of
/// them may be NULL (reported as such, except `step_info`, which is optional).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_step(
    policy: *mut FrtPolicy,
    observation: *const FrtObservation,
    actions: *mut f32,
    actions_len: usize,
    step_info: *mut FrtStepInfo,
) -> FrtStatus {
    // SAFETY: forwarded caller's promises.
    with_policy(policy, |p| unsafe { p.step(observation, None, actions, actions_len, step_info) })
}

/// `frt_policy_step` for a policy opened with real-time chunking (`FrtPolicyConfig.rtc_schedule`):
/// the new chunk continues the one this policy's previous step returned. `executed` is how many
/// actions of that chunk the robot had executed when this observation was taken (what is left
/// starts there; at or past the horizon nothing is, and the chunk is sampled afresh);
/// `inference_delay` is how many more of them it executes while this step runs (the new chunk's
/// first rows are pinned to those: guided towards them for Pi0.5, frozen for GR00T N1.7). The
/// first step after open has nothing to continue.
///
/// Returns as `frt_policy_step`, and `FRT_STATUS_INVALID_ARGUMENT` ("continuation") when the
/// policy was opened without real-time chunking. No heap allocation after the first step.
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// As `frt_policy_step`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_step_continuing(
    policy: *mut FrtPolicy,
    observation: *const FrtObservation,
    executed: usize,
    inference_delay: usize,
    actions: *mut f32,
    actions_len: usize,
    step_info: *mut FrtStepInfo,
) -> FrtStatus {
    let continuation = Continuation { executed, inference_delay };
    // SAFETY: forwarded caller's promises.
    with_policy(policy, |p| unsafe { p.step(observation, Some(continuation), actions, actions_len, step_info) })
}

/// Starts recording every observation this policy steps on successfully — through
/// `frt_policy_step`, `frt_policy_step_continuing` or an action stream over it — with the prompt in
/// force, into an observation log at `path` (`path_len` bytes, no NUL needed), created or
/// truncated. `flashrt run --observations PATH` replays the log; it serves FP8 calibration and
/// regression tests on the robot's own data.
///
/// The steps stay on the hot path's terms: each observation is copied into one of a few buffers
/// reused from step to step and written by a thread of the library; when the disk falls behind,
/// observations are dropped (counted and logged once) instead of delaying the step. A step
/// allocates only when a camera's frame is larger than any it recorded before. A prompt set with
/// `frt_policy_set_prompt_tokens` is not text: the records after it carry an empty prompt. After
/// `frt_policy_set_embodiment` to an embodiment of another state width, observations are dropped:
/// record each embodiment into its own log.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (`path_len`
/// is 0, or the policy is already recording: stop that first); `FRT_STATUS_IO` (the file cannot
/// be created); `FRT_STATUS_PANIC`.
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `path` readable for `path_len` bytes or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_record_start(policy: *mut FrtPolicy, path: *const c_char, path_len: usize) -> FrtStatus {
    with_policy(policy, |p| {
        if path.is_null() {
            return p.fail(Failure::null("path"));
        }
        if path_len == 0 {
            return p.fail(Failure::invalid("path", "empty"));
        }
        if let Some(r) = &p.recording {
            let message = format!("already recording to {}: call frt_policy_record_stop first", r.path().display());
            return p.fail(Failure::invalid("path", message));
        }
        // SAFETY: path_len readable bytes (caller's promise).
        let path = unsafe { path_arg(path, path_len) };
        match Recorder::for_policy(path, &p.policy, "") {
            Ok(mut recorder) => {
                if let Some(text) = &p.prompt {
                    recorder.set_prompt(text);
                }
                p.recording = Some(recorder);
                p.done(Ok(()))
            }
            Err(e) => p.done::<()>(Err(e)),
        }
    })
}

/// A path passed as `len` bytes (no NUL needed; a Linux path is bytes, not UTF-8).
///
/// # Safety
/// `bytes` non-NULL and readable for `len` bytes.
unsafe fn path_arg<'a>(bytes: *const c_char, len: usize) -> &'a std::path::Path {
    // SAFETY: the caller's promise.
    let bytes = unsafe { std::slice::from_raw_parts(bytes.cast::<u8>(), len) };
    std::path::Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes))
}

/// FP8 calibration of this policy's plan, as `flashrt calibrate` makes it: steps the policy over
/// the first `steps` observations (0: 8; the first two of them measured again for each product's
/// FP8 error) of the observation log at `observations`
/// (`observations_len` bytes, no NUL needed; recorded with `frt_policy_record_start`, `flashrt
/// record` or the ROS 2 node), measures each product's input range and FP8 error, and writes the
/// calibration JSON to `out` (`out_len` bytes; NULL: `flashrt_fp8_calibration.json` beside the
/// checkpoint, where an FP8 open looks for it). With `observations` NULL it calibrates on
/// synthetic observations and logs a warning: the scales then fit random inputs, not the robot's.
///
/// Open the policy on the CPU backend in f32 with the options the deployment opens with (cameras,
/// prompt capacity, denoise steps, real-time chunking): the calibration is only accepted by a
/// policy with the same plan and checkpoint. Takes seconds (tiny models) to many minutes (full
/// size on the CPU): not for the control loop. Afterwards the policy's prompt is the text it had
/// (after `frt_policy_set_prompt_tokens`, the last calibration prompt: set it again); the
/// calibration's steps count in its latency statistics.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` (`policy`); `FRT_STATUS_INVALID_ARGUMENT`
/// (an empty log, a record without prompt text, an empty path); `FRT_STATUS_BACKEND` (the
/// policy is not on the CPU backend in f32); `FRT_STATUS_IO` (the log is unreadable, damaged or
/// recorded for another policy, or `out` cannot be written); `FRT_STATUS_PANIC`.
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `observations` and `out` readable for their lengths
/// or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_calibrate(
    policy: *mut FrtPolicy,
    observations: *const c_char,
    observations_len: usize,
    steps: u32,
    out: *const c_char,
    out_len: usize,
) -> FrtStatus {
    with_policy(policy, |p| {
        for (name, ptr, len) in [("observations", observations, observations_len), ("out", out, out_len)] {
            if !ptr.is_null() && len == 0 {
                return p.fail(Failure::invalid(name, "empty"));
            }
        }
        let defaults = flashrt::calibration::CalibrationSettings::default();
        let steps = if steps == 0 { defaults.steps } else { steps as usize };
        let measure_steps = defaults.measure_steps.min(steps);
        let settings = flashrt::calibration::CalibrationSettings { steps, measure_steps, ..defaults };
        // SAFETY: readable for their lengths when non-NULL (caller's promise).
        let (log, out) = unsafe {
            ((!observations.is_null()).then(|| path_arg(observations, observations_len)), (!out.is_null()).then(|| path_arg(out, out_len)))
        };
        let result = match log {
            Some(log) => flashrt::calibration::calibrate_log(&mut p.policy, &settings, log),
            None => flashrt::calibration::calibrate_synthetic(&mut p.policy, &settings, 0),
        };
        let restored = match &p.prompt {
            Some(text) => p.policy.set_prompt(text),
            None => Ok(()),
        };
        let written = result.and_then(|c| {
            restored?;
            c.save(&flashrt::calibration::file_for(out, p.policy.checkpoint_path()))
        });
        p.done(written)
    })
}

/// Stops the recording `frt_policy_record_start` began: writes the observations still queued and
/// closes the log (waits for the disk: not for the control loop). Logs how many observations were
/// written and dropped. Without a recording, does nothing and returns `FRT_STATUS_OK`.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_IO` (writing the log failed:
/// `frt_policy_last_error` names the file and the error; the log holds the records before it);
/// `FRT_STATUS_PANIC`. `frt_policy_free` stops a recording too (and only logs such an error).
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_record_stop(policy: *mut FrtPolicy) -> FrtStatus {
    with_policy(policy, |p| {
        let result = p.recording.take().map(Recorder::finish).transpose();
        p.done(result)
    })
}

/// Copies the latency statistics of the steps so far into `*stats`.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` when
/// `stats->struct_size` is below `sizeof(FrtLatencyStats)`; a failure's message is in
/// `frt_last_error`. Computes percentiles (allocates): call it between chunks or at the end, not
/// every tick.
///
/// Thread safety: `const`: may run concurrently with other `const FrtPolicy*` calls.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `stats` writable or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_stats(policy: *const FrtPolicy, stats: *mut FrtLatencyStats) -> FrtStatus {
    // SAFETY: the caller's promises.
    guard(FrtStatus::Panic, || finish_on_thread(unsafe { write_stats(policy, stats) }))
}

/// # Safety
/// As `frt_policy_stats`.
unsafe fn write_stats(policy: *const FrtPolicy, stats: *mut FrtLatencyStats) -> Result<(), Failure> {
    // SAFETY: valid or NULL (caller's promise).
    let p = unsafe { policy.as_ref() }.ok_or_else(|| Failure::null("policy"))?.shared();
    if stats.is_null() {
        return Err(Failure::null("stats"));
    }
    // SAFETY: non-NULL and writable (caller's promise).
    let size = unsafe { struct_size(stats, "stats")? };
    let s = p.policy.stats().summary();
    let out = FrtLatencyStats {
        struct_size: size,
        count: s.count,
        p50_ms: s.p50_ms,
        p90_ms: s.p90_ms,
        p99_ms: s.p99_ms,
        max_ms: s.max_ms,
        deadline_misses: s.deadline_misses,
    };
    // SAFETY: the caller's struct holds at least ours.
    unsafe { stats.write(out) };
    Ok(())
}

/// Forgets the latency statistics (count, percentiles, maximum, deadline misses), e.g. after
/// warm-up.
///
/// Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_PANIC`.
///
/// Thread safety: not concurrently with any other call on `policy`; one that finds another call
/// taking `FrtPolicy*` running on it returns `FRT_STATUS_BUSY` and does nothing.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_reset_stats(policy: *mut FrtPolicy) -> FrtStatus {
    with_policy(policy, |p| {
        p.policy.reset_stats();
        p.done(Ok(()))
    })
}

/// Copies the execution plan as text: every op with its shapes, and which ops were fused or folded
/// and why. Text rule as in `frt_status_message` (query the length with `buf = NULL, len = 0`).
///
/// Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
///
/// Thread safety: `const`: may run concurrently with other `const FrtPolicy*` calls.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `buf` writable for `len` bytes and `written` for one
/// `size_t`, or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_explain(policy: *const FrtPolicy, buf: *mut c_char, len: usize, written: *mut usize) -> FrtStatus {
    // SAFETY: the caller's promises.
    guard(FrtStatus::Panic, || match unsafe { policy.as_ref() } {
        Some(p) => unsafe { copy_text(&p.shared().explain, buf, len, written) },
        None => FrtStatus::NullArgument,
    })
}

/// Copies the message of the most recent failed call on `policy` that takes a non-const
/// `FrtPolicy*` (empty after a call that succeeded), naming the field at fault, e.g. "invalid
/// observation.state[3]: value NaN is not finite". Text rule as in `frt_status_message`.
///
/// Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
///
/// Thread safety: `const`: may run concurrently with other `const FrtPolicy*` calls.
///
/// # Safety
/// `policy` from `frt_policy_open` or NULL; `buf` writable for `len` bytes and `written` for one
/// `size_t`, or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_policy_last_error(policy: *const FrtPolicy, buf: *mut c_char, len: usize, written: *mut usize) -> FrtStatus {
    // SAFETY: the caller's promises.
    guard(FrtStatus::Panic, || match unsafe { policy.as_ref() } {
        Some(p) => unsafe { copy_text(&p.shared().last_error, buf, len, written) },
        None => FrtStatus::NullArgument,
    })
}

/// The boundary of a mutating call: NULL check, panic guard, the in-use flag, the policy's log
/// sink. A call that finds the policy in use by another returns `FRT_STATUS_BUSY` and leaves
/// everything (the last error included) to that call.
fn with_policy(policy: *mut FrtPolicy, body: impl FnOnce(&mut State) -> FrtStatus) -> FrtStatus {
    guard(FrtStatus::Panic, || {
        // SAFETY: from frt_policy_open (not freed) or NULL; only `busy` is read before it is held.
        let Some(p) = (unsafe { policy.as_ref() }) else { return FrtStatus::NullArgument };
        if p.busy.swap(true, Ordering::Acquire) {
            return FrtStatus::Busy;
        }
        // Released on every way out, a caught panic included.
        struct Release<'a>(&'a AtomicBool);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _release = Release(&p.busy);
        // SAFETY: `busy` is held: no other mutating call reaches the state until it is released.
        // `const FrtPolicy*` calls must not run concurrently with this one (documented contract).
        let state = unsafe { &mut *p.state.get() };
        let _scope = state.sink.enter();
        body(state)
    })
}

/// Arms `flashrt::Policy::inject_fault` on `policy` (the debug hook `frt_debug_fault_next_step`).
///
/// # Safety
/// `policy` from `frt_policy_open` (not freed) or NULL.
#[cfg(debug_assertions)]
pub(crate) unsafe fn inject_fault(policy: *mut FrtPolicy) -> FrtStatus {
    with_policy(policy, |p| {
        p.policy.inject_fault();
        p.done(Ok(()))
    })
}

/// A policy lent to an action stream: its `busy` flag stays held from [`FrtPolicy::lend`] until
/// this is dropped, so every mutating call on the policy meanwhile returns `FRT_STATUS_BUSY`.
pub(crate) struct Lent {
    busy: *const AtomicBool,
    state: *mut State,
}

impl Drop for Lent {
    fn drop(&mut self) {
        // SAFETY: the FrtPolicy outlives its stream (documented on frt_stream_create).
        unsafe { &*self.busy }.store(false, Ordering::Release);
    }
}

/// What the stream's inference thread does with the policy (`StreamPolicy`, through the stream's
/// wrapper): steps recorded and prompts followed as `frt_policy_step` and `frt_policy_set_prompt`
/// do.
impl Lent {
    fn state(&mut self) -> &mut State {
        // SAFETY: the FrtPolicy outlives its stream and its `busy` flag is held: nothing else
        // reaches the state.
        unsafe { &mut *self.state }
    }

    pub(crate) fn dims(&self) -> flashrt::stream::StreamDims {
        // SAFETY: as in `state`.
        unsafe { &*self.state }.policy.dims()
    }

    pub(crate) fn step_chunk(
        &mut self,
        obs: &Observation,
        continuation: Option<Continuation>,
        actions: &mut [f32],
    ) -> flashrt::Result<flashrt::StepInfo> {
        let s = self.state();
        let info = s.policy.step_chunk(obs, continuation, actions)?;
        if let Some(r) = &mut s.recording {
            r.record(obs);
        }
        Ok(info)
    }

    pub(crate) fn set_prompt(&mut self, text: &str) -> flashrt::Result<()> {
        self.state().set_prompt(text)
    }
}

impl FrtPolicy {
    /// Takes the policy for an action stream's inference thread; refused with `FRT_STATUS_BUSY`
    /// while another call or stream holds it.
    ///
    /// # Safety
    /// `policy` is from `frt_policy_open`, not freed, and outlives the returned [`Lent`].
    pub(crate) unsafe fn lend(policy: *mut FrtPolicy) -> Result<Lent, Failure> {
        // SAFETY: the caller's promise; only `busy` is read before it is held.
        let p = unsafe { &*policy };
        if p.busy.swap(true, Ordering::Acquire) {
            return Err(Failure { status: FrtStatus::Busy, message: "policy is in use by another call or stream".into() });
        }
        // SAFETY: `busy` is held: no mutating call reaches the state until the Lent is dropped.
        Ok(Lent { busy: &p.busy, state: p.state.get() })
    }

    /// The state for a `const FrtPolicy*` call, which by contract runs concurrently with other
    /// const calls only.
    fn shared(&self) -> &State {
        // SAFETY: no mutating call runs now (the caller's promise), so nothing writes the state.
        unsafe { &*self.state.get() }
    }
}

impl State {
    /// Sets the prompt; a recording follows it.
    fn set_prompt(&mut self, text: &str) -> flashrt::Result<()> {
        self.policy.set_prompt(text)?;
        self.prompt = Some(text.to_owned());
        if let Some(r) = &mut self.recording {
            r.set_prompt(text);
        }
        Ok(())
    }

    /// Records a failure as the last error. Reuses the buffer: a short message does not allocate.
    fn fail(&mut self, f: Failure) -> FrtStatus {
        self.record(f.status, format_args!("{}", f.message))
    }

    fn record(&mut self, status: FrtStatus, message: fmt::Arguments) -> FrtStatus {
        self.last_error.clear();
        let _ = self.last_error.write_fmt(message);
        status
    }

    /// Ends a call with the runtime's result; success clears the last error without allocating.
    fn done<T>(&mut self, result: flashrt::Result<T>) -> FrtStatus {
        match result {
            Ok(_) => {
                self.last_error.clear();
                FrtStatus::Ok
            }
            Err(e) => self.record((&e).into(), format_args!("{e}")),
        }
    }

    /// # Safety
    /// As `frt_policy_step`.
    unsafe fn step(
        &mut self,
        observation: *const FrtObservation,
        continuation: Option<Continuation>,
        actions: *mut f32,
        actions_len: usize,
        step_info: *mut FrtStepInfo,
    ) -> FrtStatus {
        if observation.is_null() {
            return self.record(FrtStatus::NullArgument, format_args!("observation is NULL"));
        }
        if actions.is_null() {
            return self.record(FrtStatus::NullArgument, format_args!("actions is NULL"));
        }
        // SAFETY: non-NULL; struct_size is the first field.
        if !step_info.is_null() && unsafe { (*step_info).struct_size } < size_of::<FrtStepInfo>() {
            return self.record(
                FrtStatus::InvalidArgument,
                format_args!("invalid step_info.struct_size: below sizeof(FrtStepInfo) = {}", size_of::<FrtStepInfo>()),
            );
        }
        let mut frames: [Option<Frame>; FRT_MAX_CAMERAS] = [None; FRT_MAX_CAMERAS];
        // SAFETY: the caller's promise on observation.
        let (state, noise) = match unsafe { read_observation(observation, self.info.camera_ptrs().len(), &mut frames) } {
            Ok(v) => v,
            Err(e) => return self.record(e.status(), format_args!("{e}")),
        };
        // SAFETY: actions_len writable floats (caller's promise).
        let actions = unsafe { std::slice::from_raw_parts_mut(actions, actions_len) };
        let obs = Observation { cameras: &frames[..self.info.camera_ptrs().len()], state, noise };
        match self.policy.step_continuing(&obs, continuation, actions) {
            Ok(s) => {
                if let Some(r) = &mut self.recording {
                    r.record(&obs);
                }
                if !step_info.is_null() {
                    // SAFETY: writable, at least our size (checked above).
                    unsafe {
                        step_info.write(FrtStepInfo {
                            struct_size: (*step_info).struct_size,
                            latency_ms: s.latency.as_secs_f64() * 1e3,
                            prompt_tokens: s.prompt_tokens,
                            deadline_missed: s.deadline_missed,
                        })
                    };
                }
                self.done(Ok(()))
            }
            Err(e) => self.done::<()>(Err(e)),
        }
    }
}

/// Why an `FrtObservation` cannot be read; its text is the last error. Formatted only on failure,
/// so reading a good observation does not allocate.
pub(crate) enum ObservationError {
    StructSize,
    Null(&'static str),
    CamerasLen { given: usize, slots: usize },
    NoiseLen(usize),
    FrameData(usize),
    Format(usize, u32),
    Stride(usize, usize, usize),
}

impl ObservationError {
    pub(crate) fn status(&self) -> FrtStatus {
        match self {
            ObservationError::Null(_) | ObservationError::FrameData(_) => FrtStatus::NullArgument,
            _ => FrtStatus::InvalidArgument,
        }
    }
}

impl fmt::Display for ObservationError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match *self {
            ObservationError::StructSize => {
                write!(f, "invalid observation.struct_size: below sizeof(FrtObservation) = {}", size_of::<FrtObservation>())
            }
            ObservationError::Null(what) => write!(f, "{what} is NULL"),
            ObservationError::CamerasLen { given, slots } => write!(
                f,
                "invalid observation.cameras_len: {given} given, the policy has {slots} camera slots (mark missing cameras not present)"
            ),
            ObservationError::NoiseLen(n) => write!(f, "invalid observation.noise_len: {n} while noise is NULL"),
            ObservationError::FrameData(i) => write!(f, "observation.cameras[{i}].data is NULL"),
            ObservationError::Format(i, n) => write!(f, "invalid observation.cameras[{i}].format: {n} is not an FrtPixelFormat value"),
            ObservationError::Stride(i, stride, height) => {
                write!(f, "invalid observation.cameras[{i}].stride: {stride} x height {height} overflows")
            }
        }
    }
}

/// Reads a caller's observation into `frames` (the first `cameras` slots) and returns its state
/// and noise. The runtime checks the rest (frame geometry against the data, values).
///
/// # Safety
/// `observation` is NULL or readable with its arrays valid for the lengths it states.
pub(crate) unsafe fn read_observation<'a>(
    observation: *const FrtObservation,
    cameras: usize,
    frames: &mut [Option<Frame<'a>>; FRT_MAX_CAMERAS],
) -> Result<(&'a [f32], Option<&'a [f32]>), ObservationError> {
    if observation.is_null() {
        return Err(ObservationError::Null("observation"));
    }
    // SAFETY: non-NULL and readable (caller's promise); struct_size is the first field.
    if unsafe { (*observation).struct_size } < size_of::<FrtObservation>() {
        return Err(ObservationError::StructSize);
    }
    // SAFETY: at least our version of the struct is readable (checked above).
    let o = unsafe { &*observation };
    if o.cameras.is_null() {
        return Err(ObservationError::Null("observation.cameras"));
    }
    if o.state.is_null() {
        return Err(ObservationError::Null("observation.state"));
    }
    if o.cameras_len != cameras {
        return Err(ObservationError::CamerasLen { given: o.cameras_len, slots: cameras });
    }
    if o.noise.is_null() && o.noise_len != 0 {
        return Err(ObservationError::NoiseLen(o.noise_len));
    }
    // SAFETY: the caller's arrays, valid for the lengths stated.
    let (raw, state) = unsafe { (std::slice::from_raw_parts(o.cameras, o.cameras_len), std::slice::from_raw_parts(o.state, o.state_len)) };
    // SAFETY: as above.
    let noise = (!o.noise.is_null()).then(|| unsafe { std::slice::from_raw_parts(o.noise, o.noise_len) });
    // cameras_len <= FRT_MAX_CAMERAS (open checks the policy's count).
    for (i, (slot, f)) in frames.iter_mut().zip(raw).enumerate() {
        *slot = None;
        if !f.present {
            continue;
        }
        if f.data.is_null() {
            return Err(ObservationError::FrameData(i));
        }
        let Some(format) = PixelFormat::from_code(f.format) else {
            return Err(ObservationError::Format(i, f.format));
        };
        let stride = if f.stride == 0 { f.width.saturating_mul(format.bytes_per_pixel()) } else { f.stride };
        // The runtime computes (height - 1) * stride: keep that from overflowing.
        if f.height.saturating_sub(1).checked_mul(stride).is_none() {
            return Err(ObservationError::Stride(i, stride, f.height));
        }
        // SAFETY: data_len readable bytes (caller's promise); the runtime checks the geometry
        // against them before reading.
        let data = unsafe { std::slice::from_raw_parts(f.data, f.data_len) };
        *slot = Some(Frame { data, width: f.width, height: f.height, stride, format });
    }
    Ok((state, noise))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixel_format_numbers_match_the_runtime() {
        for (ours, theirs) in [
            (FrtPixelFormat::Rgb8, PixelFormat::Rgb8),
            (FrtPixelFormat::Bgr8, PixelFormat::Bgr8),
            (FrtPixelFormat::Rgba8, PixelFormat::Rgba8),
        ] {
            assert_eq!(PixelFormat::from_code(ours as u32), Some(theirs));
        }
        assert_eq!(PixelFormat::from_code(3), None);
    }
}
