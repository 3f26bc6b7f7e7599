//! The action stream: inference on a library thread, one action per control tick on the caller's
//! (`flashrt::stream`).

use std::ffi::c_char;
use std::fmt::{self, Write as _};
use std::time::Duration;

use flashrt::stream::{Continuation, StreamDims, StreamPolicy};
use flashrt::{ActionStatus, ActionStream, Fallback, Frame, Observation, StepInfo, StreamConfig};

use crate::boundary::guard;
use crate::config::FRT_MAX_CAMERAS;
use crate::policy::{FrtObservation, FrtPolicy, Lent, read_observation};
use crate::status::{Failure, FrtStatus, copy_text, finish_on_thread, struct_size};

/// What the stream does when a chunk is late (`FrtStreamConfig.fallback`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrtFallback {
    /// Repeat the last action.
    Hold = 0,
    /// Continue the last action's change per tick, scaled down linearly to zero over
    /// `FrtStreamConfig.decelerate_ticks` ticks, then hold.
    Decelerate = 1,
}

/// How a tick's action was made (`FrtActionTick.status`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrtActionStatus {
    /// No chunk yet and no earlier action: the action buffer was not written.
    Waiting = 0,
    /// A row of the current chunk.
    Fresh = 1,
    /// The chunk ran out: the last action repeated.
    Held = 2,
    /// The chunk ran out: the last action moved on by its decaying velocity.
    Decelerating = 3,
}

/// How a stream runs. Fill it with `frt_stream_config_default` (after setting `struct_size`).
#[repr(C)]
pub struct FrtStreamConfig {
    /// `sizeof(FrtStreamConfig)`, set by the caller.
    pub struct_size: usize,
    /// The caller's control period in microseconds (one `frt_stream_next_action` per period).
    /// Default 20000 (50 Hz).
    pub control_period_us: u64,
    /// Request the next chunk when this many actions or fewer are left; 0: half the horizon.
    /// Must be below the horizon.
    pub refill_at: usize,
    /// An `FrtFallback` value. Default `FRT_FALLBACK_HOLD`.
    pub fallback: u32,
    /// Ticks over which `FRT_FALLBACK_DECELERATE` brings the velocity to zero. Default 10.
    pub decelerate_ticks: usize,
    /// CPUs the inference thread is pinned to (read during `frt_stream_create` only); NULL with
    /// `cpus_len` 0: not pinned.
    pub cpus: *const usize,
    pub cpus_len: usize,
    /// SCHED_FIFO priority of the inference thread (1-99); 0: the default policy. A setting the
    /// system refuses (no CAP_SYS_NICE / RLIMIT_RTPRIO, CPUs outside the cpuset) is logged and
    /// skipped; `FrtStreamStats.realtime` says whether all took.
    pub fifo_priority: i32,
    /// Stop the inference thread after this many failed steps in a row; 0: never. Default 10.
    pub max_consecutive_errors: u32,
}

/// One tick's report (`frt_stream_next_action`).
#[repr(C)]
pub struct FrtActionTick {
    /// `sizeof(FrtActionTick)`, set by the caller.
    pub struct_size: usize,
    pub status: FrtActionStatus,
    /// This tick's number (0 for the first call).
    pub tick: u64,
    /// Sequence number of the chunk in use (1 for the first), 0 before the first.
    pub chunk: u64,
    /// Ticks since the chunk in use was observed (the row taken when fresh).
    pub chunk_age: usize,
    /// Actions left in the chunk after this one.
    pub remaining: usize,
    /// This tick switched to a new chunk.
    pub new_chunk: bool,
    /// Rows of the new chunk skipped because their ticks passed during inference.
    pub skipped: usize,
}

/// The stream's counters (`frt_stream_stats`); see `flashrt::StreamStats`.
#[repr(C)]
pub struct FrtStreamStats {
    /// `sizeof(FrtStreamStats)`, set by the caller.
    pub struct_size: usize,
    /// `frt_stream_next_action` calls.
    pub ticks: u64,
    /// Chunks produced by the inference thread.
    pub chunks: u64,
    /// Ticks answered by the fallback because a chunk was late.
    pub late_ticks: u64,
    /// Of `late_ticks`, the decelerating ones.
    pub decelerating_ticks: u64,
    /// Ticks before the first chunk.
    pub waiting_ticks: u64,
    /// Chunk rows skipped because their ticks passed during inference.
    pub skipped_actions: u64,
    /// Chunks that arrived entirely in the past and were dropped.
    pub stale_chunks: u64,
    /// Delay of the last chunk taken, in ticks (observation to first use).
    pub delay_ticks: u64,
    /// The delay passed to the policy with the next request, in ticks.
    pub delay_estimate: u64,
    /// Inference latency over the last 32 chunks, microseconds.
    pub latency_p50_us: u64,
    pub latency_max_us: u64,
    /// Failed policy steps on the inference thread (`frt_stream_inference_error` has the last).
    pub errors: u64,
    /// The inference thread runs (false after too many errors in a row or a panic).
    pub running: bool,
    /// Every real-time setting asked for was applied.
    pub realtime: bool,
}

/// The policy an `FrtStream` borrows from its `FrtPolicy`, whose in-use flag it holds.
struct Borrowed(Lent);

// SAFETY: the FrtPolicy outlives the stream (documented on frt_stream_create) and its in-use flag
// is held while the stream exists, so every other mutating call on it returns FRT_STATUS_BUSY:
// the inference thread is the only user of the policy.
unsafe impl Send for Borrowed {}

impl StreamPolicy for Borrowed {
    fn dims(&self) -> StreamDims {
        self.0.dims()
    }
    fn step_chunk(&mut self, obs: &Observation, continuation: Option<Continuation>, actions: &mut [f32]) -> flashrt::Result<StepInfo> {
        self.0.step_chunk(obs, continuation, actions)
    }
    fn set_prompt(&mut self, text: &str) -> flashrt::Result<()> {
        self.0.set_prompt(text)
    }
}

/// A running action stream over a policy. Opaque.
pub struct FrtStream {
    stream: ActionStream<Borrowed>,
    cameras: usize,
    /// Message of the last failing call on the stream; cleared (never shrunk) by each success.
    last_error: String,
}

/// Fills `*config` with the defaults; `config->struct_size` must be set first.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` when
/// `struct_size` is below `sizeof(FrtStreamConfig)` (message in `frt_last_error`).
///
/// Thread safety: safe to call from any thread.
///
/// # Safety
/// `config` writable or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_config_default(config: *mut FrtStreamConfig) -> FrtStatus {
    guard(FrtStatus::Panic, || {
        finish_on_thread((|| {
            if config.is_null() {
                return Err(Failure::null("config"));
            }
            // SAFETY: non-NULL (caller's promise).
            let size = unsafe { struct_size(config, "config")? };
            let d = StreamConfig::new();
            let out = FrtStreamConfig {
                struct_size: size,
                control_period_us: d.control_period.as_micros() as u64,
                refill_at: 0,
                fallback: FrtFallback::Hold as u32,
                decelerate_ticks: 10,
                cpus: std::ptr::null(),
                cpus_len: 0,
                fifo_priority: 0,
                max_consecutive_errors: d.max_consecutive_errors,
            };
            // SAFETY: the caller's struct holds at least ours.
            unsafe { config.write(out) };
            Ok(())
        })())
    })
}

/// Starts a stream over an open policy: a library thread (pinned and SCHED_FIFO as configured)
/// runs the policy's steps; the caller then pushes observations and takes one action per tick.
/// The policy needs its prompt set (or set one with `frt_stream_set_prompt`).
///
/// The stream borrows `policy` until `frt_stream_free`: meanwhile the policy must not be freed,
/// every call taking `FrtPolicy*` returns `FRT_STATUS_BUSY` (as does a second stream over it), and
/// of the `const FrtPolicy*` calls only `frt_policy_info` and `frt_policy_explain` may be made
/// (they read data made at open). After `frt_stream_free` the policy is usable again — unless
/// `frt_stream_inference_error` reports a panic, after which it must be freed.
///
/// On success `*out` receives the stream. Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`
/// (`policy`, `config`, `out`, or `cpus` with `cpus_len > 0`); `FRT_STATUS_INVALID_ARGUMENT`
/// (`struct_size`, `control_period_us` 0, `refill_at` not below the horizon, an unknown
/// `fallback`, `fifo_priority` outside 0-99); `FRT_STATUS_BUSY` (another call or stream holds
/// `policy`); `FRT_STATUS_BACKEND` (the thread cannot start);
/// `FRT_STATUS_PANIC`. Failures leave their message in `frt_last_error`.
///
/// Thread safety: not concurrently with any call on `policy`.
///
/// # Safety
/// `policy` from `frt_policy_open` (not freed) or NULL; `config` readable with `cpus` valid for
/// `cpus_len` values, or NULL; `out` writable or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_create(policy: *mut FrtPolicy, config: *const FrtStreamConfig, out: *mut *mut FrtStream) -> FrtStatus {
    // SAFETY: the caller's promises.
    guard(FrtStatus::Panic, || finish_on_thread(unsafe { create(policy, config, out) }))
}

/// # Safety
/// As `frt_stream_create`.
unsafe fn create(policy: *mut FrtPolicy, config: *const FrtStreamConfig, out: *mut *mut FrtStream) -> Result<(), Failure> {
    if policy.is_null() {
        return Err(Failure::null("policy"));
    }
    if config.is_null() {
        return Err(Failure::null("config"));
    }
    if out.is_null() {
        return Err(Failure::null("out"));
    }
    // SAFETY: non-NULL and readable (caller's promise).
    unsafe { struct_size(config, "config")? };
    // SAFETY: at least our version is readable.
    let c = unsafe { &*config };
    if c.cpus.is_null() && c.cpus_len != 0 {
        return Err(Failure::null("config.cpus"));
    }
    if c.control_period_us == 0 {
        return Err(Failure::invalid("config.control_period_us", "must be positive"));
    }
    let fallback = match c.fallback {
        0 => Fallback::Hold,
        1 => Fallback::Decelerate { ticks: c.decelerate_ticks },
        n => return Err(Failure::invalid("config.fallback", format!("{n} is not an FrtFallback value"))),
    };
    if !(0..=99).contains(&c.fifo_priority) {
        return Err(Failure::invalid("config.fifo_priority", format!("{} is outside 0 (none) to 99", c.fifo_priority)));
    }
    // SAFETY: cpus_len values (caller's promise).
    let cpus = if c.cpus_len == 0 { vec![] } else { unsafe { std::slice::from_raw_parts(c.cpus, c.cpus_len) }.to_vec() };
    let rt =
        flashrt::realtime::RealtimeConfig { cpus, fifo_priority: (c.fifo_priority != 0).then_some(c.fifo_priority), lock_memory: false };
    let config = StreamConfig {
        control_period: Duration::from_micros(c.control_period_us),
        refill_at: (c.refill_at != 0).then_some(c.refill_at),
        fallback,
        realtime: rt,
        max_consecutive_errors: c.max_consecutive_errors,
    };
    // SAFETY: a live FrtPolicy that outlives the stream (caller's promise).
    let lent = unsafe { FrtPolicy::lend(policy)? };
    let cameras = lent.dims().cameras;
    let stream = ActionStream::start(Borrowed(lent), &config)?;
    // SAFETY: non-NULL, writable (caller's promise).
    unsafe { *out = Box::into_raw(Box::new(FrtStream { stream, cameras, last_error: String::with_capacity(1024) })) };
    Ok(())
}

/// Stops the stream: the inference thread finishes its step in progress and is joined. The
/// policy is the caller's again. NULL is accepted and ignored.
///
/// Thread safety: no other call may use `stream` during or after this call.
///
/// # Safety
/// `stream` from `frt_stream_create`, not freed, or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_free(stream: *mut FrtStream) {
    guard((), || {
        if !stream.is_null() {
            // SAFETY: made by Box::into_raw in frt_stream_create, freed once (caller's promise).
            drop(unsafe { Box::from_raw(stream) });
        }
    })
}

/// Hands in the latest observation (frames and state are copied; `noise` must be NULL). Call it
/// each tick before `frt_stream_next_action`, or whenever new sensor data is there. No heap
/// allocation, lock or wait when it succeeds.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (as for
/// `frt_policy_step`'s observation, and a non-NULL `noise`). On failure the previous observation
/// stays in force and `frt_stream_last_error` names the field.
///
/// Thread safety: the stream's control thread: not concurrently with other non-const calls on it.
///
/// # Safety
/// `stream` from `frt_stream_create` or NULL; `observation` as for `frt_policy_step`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_push_observation(stream: *mut FrtStream, observation: *const FrtObservation) -> FrtStatus {
    with_stream(stream, |s| {
        let mut frames: [Option<Frame>; FRT_MAX_CAMERAS] = [None; FRT_MAX_CAMERAS];
        // SAFETY: the caller's promise on observation.
        let (state, noise) = match unsafe { read_observation(observation, s.cameras, &mut frames) } {
            Ok(v) => v,
            Err(e) => return s.record(e.status(), format_args!("{e}")),
        };
        if noise.is_some() {
            return s
                .record(FrtStatus::InvalidArgument, format_args!("invalid observation.noise: a stream draws its own noise (pass NULL)"));
        }
        match s.stream.push_observation(&Observation { cameras: &frames[..s.cameras], state, noise: None }) {
            Ok(()) => s.ok(),
            Err(e) => s.record((&e).into(), format_args!("{e}")),
        }
    })
}

/// The action for this tick: `action_dim` floats into `action` unless `tick->status` is
/// `FRT_ACTION_STATUS_WAITING` (no chunk yet), and the tick's report into `*tick`. Call exactly
/// once per control tick. No heap allocation, lock or wait.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT` (`stream`, `action`, `tick`);
/// `FRT_STATUS_INVALID_ARGUMENT` (`action_len` is not the policy's `action_dim`, or
/// `tick->struct_size` too small); nothing is written then.
///
/// Thread safety: the stream's control thread.
///
/// # Safety
/// `stream` from `frt_stream_create` or NULL; `action` writable for `action_len` floats; `tick`
/// writable; or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_next_action(
    stream: *mut FrtStream,
    action: *mut f32,
    action_len: usize,
    tick: *mut FrtActionTick,
) -> FrtStatus {
    with_stream(stream, |s| {
        if action.is_null() {
            return s.record(FrtStatus::NullArgument, format_args!("action is NULL"));
        }
        if tick.is_null() {
            return s.record(FrtStatus::NullArgument, format_args!("tick is NULL"));
        }
        // SAFETY: non-NULL; struct_size is the first field.
        let size = unsafe { (*tick).struct_size };
        if size < size_of::<FrtActionTick>() {
            return s.record(
                FrtStatus::InvalidArgument,
                format_args!("invalid tick.struct_size: {size} is below sizeof(FrtActionTick) = {}", size_of::<FrtActionTick>()),
            );
        }
        if action_len != s.stream.action_dim() {
            return s.record(
                FrtStatus::InvalidArgument,
                format_args!("invalid action_len: {action_len}, the policy's action_dim is {}", s.stream.action_dim()),
            );
        }
        // SAFETY: action_len writable floats (caller's promise).
        let out = unsafe { std::slice::from_raw_parts_mut(action, action_len) };
        match s.stream.next_action(out) {
            Ok(t) => {
                let status = match t.status {
                    ActionStatus::Waiting => FrtActionStatus::Waiting,
                    ActionStatus::Fresh => FrtActionStatus::Fresh,
                    ActionStatus::Held => FrtActionStatus::Held,
                    ActionStatus::Decelerating => FrtActionStatus::Decelerating,
                };
                let report = FrtActionTick {
                    struct_size: size,
                    status,
                    tick: t.tick,
                    chunk: t.chunk,
                    chunk_age: t.chunk_age,
                    remaining: t.remaining,
                    new_chunk: t.new_chunk,
                    skipped: t.skipped,
                };
                // SAFETY: writable, at least our size (checked above).
                unsafe { tick.write(report) };
                s.ok()
            }
            Err(e) => s.record((&e).into(), format_args!("{e}")),
        }
    })
}

/// Copies the stream's counters (atomic loads: cheap, fine every tick).
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` when
/// `stats->struct_size` is too small (message in `frt_last_error`).
///
/// Thread safety: `const`: from any thread, concurrently with every other stream call.
///
/// # Safety
/// `stream` from `frt_stream_create` or NULL; `stats` writable or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_stats(stream: *const FrtStream, stats: *mut FrtStreamStats) -> FrtStatus {
    guard(FrtStatus::Panic, || {
        finish_on_thread((|| {
            // SAFETY: valid or NULL (caller's promise).
            let s = unsafe { stream.as_ref() }.ok_or_else(|| Failure::null("stream"))?;
            if stats.is_null() {
                return Err(Failure::null("stats"));
            }
            // SAFETY: non-NULL (caller's promise).
            let size = unsafe { struct_size(stats, "stats")? };
            let t = s.stream.stats();
            let out = FrtStreamStats {
                struct_size: size,
                ticks: t.ticks,
                chunks: t.chunks,
                late_ticks: t.late_ticks,
                decelerating_ticks: t.decelerating_ticks,
                waiting_ticks: t.waiting_ticks,
                skipped_actions: t.skipped_actions,
                stale_chunks: t.stale_chunks,
                delay_ticks: t.delay_ticks,
                delay_estimate: t.delay_estimate,
                latency_p50_us: t.latency_p50_us,
                latency_max_us: t.latency_max_us,
                errors: t.errors,
                running: t.running,
                realtime: t.realtime,
            };
            // SAFETY: the caller's struct holds at least ours.
            unsafe { stats.write(out) };
            Ok(())
        })())
    })
}

/// Sets the task text; the inference thread tokenizes it before its next step (a refusal there
/// counts as an inference error). Allocates: not for the control loop.
///
/// Returns `FRT_STATUS_OK`; `FRT_STATUS_NULL_ARGUMENT`; `FRT_STATUS_INVALID_ARGUMENT` (not UTF-8).
///
/// Thread safety: not concurrently with other non-const calls on `stream`.
///
/// # Safety
/// `stream` from `frt_stream_create` or NULL; `text` readable for `len` bytes or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_set_prompt(stream: *mut FrtStream, text: *const c_char, len: usize) -> FrtStatus {
    with_stream(stream, |s| {
        if text.is_null() {
            return s.record(FrtStatus::NullArgument, format_args!("text is NULL"));
        }
        // SAFETY: len readable bytes (caller's promise).
        match std::str::from_utf8(unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) }) {
            Ok(t) => {
                s.stream.set_prompt(t);
                s.ok()
            }
            Err(e) => s.record(FrtStatus::InvalidArgument, format_args!("invalid text: not valid UTF-8 ({e})")),
        }
    })
}

/// Copies the message of the last failed call on `stream` (`frt_stream_push_observation`,
/// `frt_stream_next_action`, `frt_stream_set_prompt`); empty after one succeeded. Text rule as in
/// `frt_status_message`.
///
/// Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
///
/// Thread safety: `const`; not concurrently with a non-const call on `stream`.
///
/// # Safety
/// `stream` from `frt_stream_create` or NULL; `buf` writable for `len` bytes and `written` for
/// one `size_t`, or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_last_error(stream: *const FrtStream, buf: *mut c_char, len: usize, written: *mut usize) -> FrtStatus {
    // SAFETY: the caller's promises.
    guard(FrtStatus::Panic, || match unsafe { stream.as_ref() } {
        Some(s) => unsafe { copy_text(&s.last_error, buf, len, written) },
        None => FrtStatus::NullArgument,
    })
}

/// Copies the message of the last failure on the inference thread (a failed step, a refused
/// prompt, a caught panic), empty if none; `FrtStreamStats.errors` counts them. Takes a lock the
/// inference thread holds briefly after a failure: not for the control loop. Text rule as in
/// `frt_status_message`.
///
/// Returns `FRT_STATUS_OK`, `FRT_STATUS_NULL_ARGUMENT`, `FRT_STATUS_BUFFER_TOO_SMALL`.
///
/// Thread safety: `const`: from any thread.
///
/// # Safety
/// As `frt_stream_last_error`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn frt_stream_inference_error(
    stream: *const FrtStream,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> FrtStatus {
    // SAFETY: the caller's promises.
    guard(FrtStatus::Panic, || match unsafe { stream.as_ref() } {
        Some(s) => unsafe { copy_text(&s.stream.last_error().unwrap_or_default(), buf, len, written) },
        None => FrtStatus::NullArgument,
    })
}

/// The boundary of a mutating call: NULL check and panic guard.
fn with_stream(stream: *mut FrtStream, body: impl FnOnce(&mut FrtStream) -> FrtStatus) -> FrtStatus {
    guard(FrtStatus::Panic, || {
        // SAFETY: from frt_stream_create or NULL, used by one thread at a time (documented).
        let Some(s) = (unsafe { stream.as_mut() }) else { return FrtStatus::NullArgument };
        body(s)
    })
}

impl FrtStream {
    fn record(&mut self, status: FrtStatus, message: fmt::Arguments) -> FrtStatus {
        self.last_error.clear();
        let _ = self.last_error.write_fmt(message);
        status
    }

    fn ok(&mut self) -> FrtStatus {
        self.last_error.clear();
        FrtStatus::Ok
    }
}
