//! The asynchronous action stream: inference on its own thread, one action per control tick on
//! the caller's.
//!
//! The caller's control thread, at its own fixed rate, hands in the latest observation
//! ([`ActionStream::push_observation`], copied into preallocated buffers) and takes exactly one
//! action ([`ActionStream::next_action`]). Neither call allocates, locks or waits: observations
//! and chunks cross between the threads through triple buffers ([`triple`]), requests and
//! counters through atomics, and the inference thread is woken by an unpark.
//!
//! Timeline. Ticks are counted by `next_action` calls. An observation pushed when `t` actions had
//! been taken is stamped `t`; the chunk computed from it has its row `i` meant for tick `t + i`.
//! A chunk that arrives at tick `T` therefore starts at row `T - t` (the rows for ticks that
//! passed during inference are skipped, lerobot's `ActionQueue` semantics `new_chunk[delay:]`),
//! and the delay `T - t` is what the stream measures. A new chunk is requested when the current
//! one has `refill_at` actions or fewer left after the one just taken; the request carries the
//! measured delay and how far the previous chunk had been executed when its observation was taken
//! ([`Continuation`]), for real-time chunking.
//!
//! When the current chunk runs out before the next one arrives, the [`Fallback`] decides the
//! action: hold the last one, or continue its last velocity decaying linearly to zero. Each such
//! tick is reported in its [`ActionTick`] and counted.
//!
//! Errors of the policy on the inference thread are counted, the last one's text is kept
//! ([`ActionStream::last_error`]), and the chunk is requested again at the next tick; after
//! `max_consecutive_errors` failures in a row (or at once after a panic inside the policy, whose
//! state is then unknown, or a step that faulted the policy: [`Error::Faulted`]) the inference
//! thread stops, the stream keeps answering with its
//! fallback, and [`StreamStats::running`] turns false. Dropping the stream stops and joins the
//! thread.

pub mod triple;

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use crossbeam_utils::sync::{Parker, Unparker};

use crate::error::{Error, Result};
use crate::image::{Frame, PixelFormat};
use crate::policy::{Observation, Policy, StepInfo};
use crate::realtime::{self, RealtimeConfig};
use triple::{Reader, Writer, triple};

/// Most camera slots a stream stages (the inference thread builds its camera array on the stack).
pub const MAX_CAMERAS: usize = 16;

pub use crate::rtc::Continuation;

/// What the stream does on a tick when the current chunk is used up and the next has not arrived.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fallback {
    /// Repeat the last action.
    Hold,
    /// Continue the last action's velocity (its change over the last tick), scaled down linearly
    /// to zero over `ticks` ticks, then hold: a position-controlled arm slows down instead of
    /// stopping dead.
    Decelerate { ticks: usize },
}

/// How a stream runs. [`StreamConfig::new`] gives the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamConfig {
    /// The caller's control period (one `next_action` per period); converts inference latency
    /// into ticks. Default 20 ms (50 Hz).
    pub control_period: Duration,
    /// Request the next chunk when this many actions or fewer are left in the current one after
    /// the action just taken. `None`: half the horizon.
    pub refill_at: Option<usize>,
    pub fallback: Fallback,
    /// CPUs and SCHED_FIFO priority of the inference thread (and `mlockall` if asked). A setting
    /// the system refuses is logged and skipped: the stream runs without it
    /// ([`StreamStats::realtime`] says whether all took).
    pub realtime: RealtimeConfig,
    /// Stop the inference thread after this many failed steps in a row; 0: never stop.
    pub max_consecutive_errors: u32,
}

impl StreamConfig {
    pub fn new() -> Self {
        StreamConfig {
            control_period: Duration::from_millis(20),
            refill_at: None,
            fallback: Fallback::Hold,
            realtime: RealtimeConfig::default(),
            max_consecutive_errors: 10,
        }
    }
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The sizes a stream is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamDims {
    pub horizon: usize,
    pub action_dim: usize,
    pub state_dim: usize,
    pub cameras: usize,
    /// Largest frame accepted (the stream's staging buffers are sized for it).
    pub max_frame: (usize, usize),
}

/// What the stream's inference thread needs from a policy. [`Policy`] implements it; tests wrap
/// one to slow it down or make it fail.
pub trait StreamPolicy: Send + 'static {
    fn dims(&self) -> StreamDims;
    /// One chunk: `actions` gets `horizon × action_dim` values. `continuation` is `None` for the
    /// first chunk and when the previous one had run out.
    fn step_chunk(&mut self, obs: &Observation, continuation: Option<Continuation>, actions: &mut [f32]) -> Result<StepInfo>;
    fn set_prompt(&mut self, text: &str) -> Result<()>;
}

impl StreamPolicy for Policy {
    fn dims(&self) -> StreamDims {
        let info = self.info();
        StreamDims {
            horizon: info.horizon,
            action_dim: info.action_dim,
            state_dim: info.state_dim,
            cameras: info.cameras.len(),
            max_frame: self.max_frame(),
        }
    }
    // Guidance only when the policy was opened with `PolicyConfig::rtc`; without it a
    // continuation is refused, so the stream samples plain chunks.
    fn step_chunk(&mut self, obs: &Observation, continuation: Option<Continuation>, actions: &mut [f32]) -> Result<StepInfo> {
        let continuation = continuation.filter(|_| self.rtc_enabled());
        self.step_continuing(obs, continuation, actions)
    }
    fn set_prompt(&mut self, text: &str) -> Result<()> {
        Policy::set_prompt(self, text)
    }
}

/// How a tick's action was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActionStatus {
    /// No chunk has arrived yet and there is no previous action: the output was not written.
    Waiting,
    /// A row of the current chunk.
    Fresh,
    /// The chunk ran out: the last action repeated ([`Fallback::Hold`], or the end of a
    /// deceleration).
    Held,
    /// The chunk ran out: the last action moved on by its decaying velocity.
    Decelerating,
}

/// One tick's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActionTick {
    pub status: ActionStatus,
    /// This tick's number (0 for the first `next_action`).
    pub tick: u64,
    /// Sequence number of the chunk in use (1 for the first chunk), 0 before the first.
    pub chunk: u64,
    /// Ticks since the chunk in use was observed: the row taken when `Fresh`.
    pub chunk_age: usize,
    /// Actions left in the chunk after this one.
    pub remaining: usize,
    /// This tick switched to a new chunk.
    pub new_chunk: bool,
    /// Rows of the new chunk skipped because their ticks passed during inference (on a switch).
    pub skipped: usize,
}

/// Counters, readable at any time without a lock (each field is one atomic load).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamStats {
    /// `next_action` calls.
    pub ticks: u64,
    /// Chunks the inference thread produced.
    pub chunks: u64,
    /// Ticks answered by the fallback (held or decelerating) because a chunk was late.
    pub late_ticks: u64,
    /// Of `late_ticks`, the decelerating ones.
    pub decelerating_ticks: u64,
    /// Ticks before the first chunk (no action given).
    pub waiting_ticks: u64,
    /// Rows skipped at chunk switches because their ticks passed during inference.
    pub skipped_actions: u64,
    /// Chunks that arrived entirely in the past (delay ≥ horizon) and were dropped.
    pub stale_chunks: u64,
    /// Delay of the last chunk taken, in ticks (observation to first use).
    pub delay_ticks: u64,
    /// The delay passed to the policy with the next request: the larger of the highest delay of
    /// the last 8 chunks and the highest recent latency in ticks.
    pub delay_estimate: u64,
    /// Inference latency over the last 32 chunks, in microseconds.
    pub latency_p50_us: u64,
    pub latency_max_us: u64,
    /// Failed policy steps (and a caught panic).
    pub errors: u64,
    /// The inference thread is running (false after too many errors, a panic, or stop).
    pub running: bool,
    /// Every real-time setting asked for was applied to the inference thread.
    pub realtime: bool,
}

#[derive(Default)]
struct Counters {
    ticks: AtomicU64,
    chunks: AtomicU64,
    late: AtomicU64,
    decelerating: AtomicU64,
    waiting: AtomicU64,
    skipped: AtomicU64,
    stale: AtomicU64,
    delay: AtomicU64,
    delay_estimate: AtomicU64,
    latency_p50_us: AtomicU64,
    latency_max_us: AtomicU64,
    errors: AtomicU64,
    running: AtomicBool,
    realtime: AtomicBool,
}

/// What both threads share besides the triple buffers.
struct Shared {
    /// Requests issued by the control thread (a sequence number) and finished by the inference
    /// thread, successfully or not; a request is in flight while they differ.
    requested: CachePadded<AtomicU64>,
    finished: CachePadded<AtomicU64>,
    /// The delay in ticks measured by the control thread (max over recent chunks).
    measured_delay: AtomicUsize,
    stop: AtomicBool,
    counters: Counters,
    /// Read and written off the control path only: by the inference thread on a failure, by
    /// `last_error` and `set_prompt`.
    last_error: Mutex<String>,
    prompt: Mutex<Option<String>>,
}

struct FrameBuf {
    data: Vec<u8>,
    width: usize,
    height: usize,
    format: PixelFormat,
    present: bool,
}

struct ObsSlot {
    frames: Vec<FrameBuf>,
    state: Vec<f32>,
    /// Tick at which it was pushed (`next_action` calls before it).
    tick: u64,
    /// 0: never written.
    seq: u64,
}

struct ChunkSlot {
    actions: Vec<f32>,
    obs_tick: u64,
    seq: u64,
}

/// The inference thread's side.
struct Worker<P> {
    policy: P,
    shared: Arc<Shared>,
    obs: Reader<ObsSlot>,
    chunks: Writer<ChunkSlot>,
    parker: Parker,
    horizon: usize,
    period: Duration,
    max_errors: u32,
}

/// An action stream over a policy `P` (default [`Policy`]). See the module docs.
pub struct ActionStream<P: StreamPolicy = Policy> {
    shared: Arc<Shared>,
    obs: Writer<ObsSlot>,
    chunks: Reader<ChunkSlot>,
    unparker: Unparker,
    thread: Option<JoinHandle<Option<P>>>,
    horizon: usize,
    action_dim: usize,
    state_dim: usize,
    cameras: usize,
    max_frame: (usize, usize),
    refill_at: usize,
    fallback: Fallback,
    // Control-thread state.
    tick: u64,
    obs_seq: u64,
    /// Sequence and observation tick of the chunk in use.
    current: Option<(u64, u64)>,
    last: Vec<f32>,
    velocity: Vec<f32>,
    have_last: bool,
    /// Late ticks in the current run of them (for the deceleration's ramp).
    late_run: usize,
    delays: [usize; 8],
    delays_seen: usize,
}

impl<P: StreamPolicy> ActionStream<P> {
    /// Starts the inference thread over `policy` (which the stream owns until [`Self::stop`]).
    /// The first chunk is requested at the first `next_action` after an observation.
    pub fn start(policy: P, config: &StreamConfig) -> Result<Self> {
        let info = policy.dims();
        let (horizon, action_dim) = (info.horizon, info.action_dim);
        if info.cameras > MAX_CAMERAS {
            return Err(Error::invalid("policy.cameras", format!("{} cameras, the stream stages at most {MAX_CAMERAS}", info.cameras)));
        }
        if config.control_period.is_zero() {
            return Err(Error::invalid("stream.control_period", "must be positive"));
        }
        let refill_at = config.refill_at.unwrap_or(horizon / 2);
        if refill_at >= horizon {
            return Err(Error::invalid("stream.refill_at", format!("{refill_at} must be below the horizon {horizon}")));
        }
        let max_frame = info.max_frame;
        let bytes = max_frame.0.saturating_mul(max_frame.1).saturating_mul(4);
        let (obs_writer, obs_reader) = triple(|| ObsSlot {
            frames: (0..info.cameras)
                .map(|_| FrameBuf { data: Vec::with_capacity(bytes), width: 0, height: 0, format: PixelFormat::Rgb8, present: false })
                .collect(),
            state: vec![0.0; info.state_dim],
            tick: 0,
            seq: 0,
        });
        let (chunk_writer, chunk_reader) = triple(|| ChunkSlot { actions: vec![0.0; horizon * action_dim], obs_tick: 0, seq: 0 });
        let shared = Arc::new(Shared {
            requested: CachePadded::new(AtomicU64::new(0)),
            finished: CachePadded::new(AtomicU64::new(0)),
            measured_delay: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            counters: Counters::default(),
            last_error: Mutex::new(String::new()),
            prompt: Mutex::new(None),
        });
        shared.counters.running.store(true, Relaxed);
        let parker = Parker::new();
        let unparker = parker.unparker().clone();
        let worker = Worker {
            policy,
            shared: Arc::clone(&shared),
            obs: obs_reader,
            chunks: chunk_writer,
            parker,
            horizon,
            period: config.control_period,
            max_errors: config.max_consecutive_errors,
        };
        let rt = config.realtime.clone();
        let thread = std::thread::Builder::new()
            .name("flashrt-stream".into())
            .spawn(move || worker.run(&rt))
            .map_err(|e| Error::Backend(format!("cannot start the stream's inference thread: {e}")))?;
        Ok(ActionStream {
            shared,
            obs: obs_writer,
            chunks: chunk_reader,
            unparker,
            thread: Some(thread),
            horizon,
            action_dim,
            state_dim: info.state_dim,
            cameras: info.cameras,
            max_frame,
            refill_at,
            fallback: config.fallback,
            tick: 0,
            obs_seq: 0,
            current: None,
            last: vec![0.0; action_dim],
            velocity: vec![0.0; action_dim],
            have_last: false,
            late_run: 0,
            delays: [0; 8],
            delays_seen: 0,
        })
    }

    /// Action values per tick (`next_action`'s `out` length).
    pub fn action_dim(&self) -> usize {
        self.action_dim
    }

    pub fn horizon(&self) -> usize {
        self.horizon
    }

    /// Actions left after which the next chunk is requested.
    pub fn refill_at(&self) -> usize {
        self.refill_at
    }

    /// Hands in the latest observation: frames and state are copied (packed) into the stream's
    /// buffers, and the copy is stamped with the current tick. Checked first; a bad observation
    /// is refused (naming the field) and the previous one stays. Does not allocate or block when
    /// it succeeds. The observation's noise is not used (the policy draws its own).
    pub fn push_observation(&mut self, obs: &Observation) -> Result<()> {
        if obs.cameras.len() != self.cameras {
            return Err(Error::invalid(
                "observation.cameras",
                format!("{} given, the policy has {} camera slots", obs.cameras.len(), self.cameras),
            ));
        }
        if obs.cameras.iter().all(Option::is_none) {
            return Err(Error::invalid("observation.cameras", "every camera is missing; at least one frame is required"));
        }
        for (i, f) in obs.cameras.iter().enumerate() {
            if let Some(f) = f {
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
            return Err(Error::invalid(format!("observation.state[{i}]"), format!("value {} is not finite", obs.state[i])));
        }
        self.obs_seq += 1;
        let slot = self.obs.back();
        for (buf, f) in slot.frames.iter_mut().zip(obs.cameras) {
            buf.present = f.is_some();
            let Some(f) = f else { continue };
            let row = f.width * f.format.bytes_per_pixel();
            buf.data.clear();
            // Within the capacity reserved at start (validated against the same maximum).
            for y in 0..f.height {
                buf.data.extend_from_slice(&f.data[y * f.stride..y * f.stride + row]);
            }
            (buf.width, buf.height, buf.format) = (f.width, f.height, f.format);
        }
        slot.state.copy_from_slice(obs.state);
        slot.tick = self.tick;
        slot.seq = self.obs_seq;
        self.obs.publish();
        // The inference thread may be waiting for a first observation.
        if self.requested() > self.shared.finished.load(Acquire) {
            self.unparker.unpark();
        }
        Ok(())
    }

    fn requested(&self) -> u64 {
        self.shared.requested.load(Relaxed)
    }

    /// The action for this tick into `out` (`action_dim` values, unless the status is `Waiting`),
    /// and how it was made. Call exactly once per control tick. Does not allocate, lock or wait.
    pub fn next_action(&mut self, out: &mut [f32]) -> Result<ActionTick> {
        if out.len() != self.action_dim {
            return Err(Error::invalid("out", format!("{} values, the action has {}", out.len(), self.action_dim)));
        }
        let t = self.tick;
        let c = &self.shared.counters;
        let (mut new_chunk, mut skipped) = (false, 0);
        if self.chunks.update() {
            let chunk = self.chunks.front();
            let delay = (t - chunk.obs_tick) as usize;
            if delay >= self.horizon {
                c.stale.fetch_add(1, Relaxed);
                c.skipped.fetch_add(self.horizon as u64, Relaxed);
                self.current = None;
            } else {
                self.current = Some((chunk.seq, chunk.obs_tick));
                (new_chunk, skipped) = (true, delay);
                c.skipped.fetch_add(delay as u64, Relaxed);
            }
            c.delay.store(delay as u64, Relaxed);
            self.delays[self.delays_seen % self.delays.len()] = delay;
            self.delays_seen += 1;
            let n = self.delays_seen.min(self.delays.len());
            self.shared.measured_delay.store(self.delays[..n].iter().copied().max().unwrap_or(0), Relaxed);
        }
        let row = self.current.map(|(_, obs_tick)| (t - obs_tick) as usize).filter(|&r| r < self.horizon);
        let mut tick = ActionTick {
            status: ActionStatus::Fresh,
            tick: t,
            chunk: self.current.map_or(0, |(seq, _)| seq),
            chunk_age: self.current.map_or(0, |(_, obs_tick)| (t - obs_tick) as usize),
            remaining: 0,
            new_chunk,
            skipped,
        };
        match row {
            Some(r) => {
                let a = &self.chunks.front().actions[r * self.action_dim..(r + 1) * self.action_dim];
                out.copy_from_slice(a);
                if self.have_last {
                    self.velocity.iter_mut().zip(a.iter().zip(&self.last)).for_each(|(v, (a, l))| *v = a - l);
                } else {
                    self.velocity.fill(0.0);
                }
                self.last.copy_from_slice(a);
                self.have_last = true;
                self.late_run = 0;
                tick.remaining = self.horizon - 1 - r;
            }
            None if !self.have_last => {
                tick.status = ActionStatus::Waiting;
                c.waiting.fetch_add(1, Relaxed);
            }
            None => {
                self.late_run += 1;
                tick.status = match self.fallback {
                    Fallback::Decelerate { ticks } if self.late_run <= ticks => {
                        // Velocity scaled by (ticks + 1 - k) / (ticks + 1) on the k-th late tick.
                        let scale = (ticks + 1 - self.late_run) as f32 / (ticks + 1) as f32;
                        self.last.iter_mut().zip(&self.velocity).for_each(|(l, v)| *l += v * scale);
                        c.decelerating.fetch_add(1, Relaxed);
                        ActionStatus::Decelerating
                    }
                    _ => ActionStatus::Held,
                };
                out.copy_from_slice(&self.last);
                c.late.fetch_add(1, Relaxed);
            }
        }
        // Request the next chunk when this one is nearly done (or missing), unless one is coming.
        let in_flight = self.requested() > self.shared.finished.load(Acquire);
        let running = c.running.load(Relaxed);
        if running && !in_flight && (row.is_none() || tick.remaining <= self.refill_at) && self.obs_seq > 0 {
            self.shared.requested.fetch_add(1, Release);
            self.unparker.unpark();
        }
        self.tick += 1;
        c.ticks.store(self.tick, Relaxed);
        Ok(tick)
    }

    /// The counters so far (atomic loads; callable every tick).
    pub fn stats(&self) -> StreamStats {
        stats(&self.shared)
    }

    /// The message of the last failed policy step on the inference thread, if any. Takes a lock
    /// the inference thread holds briefly after a failure: not for the control loop.
    pub fn last_error(&self) -> Option<String> {
        let e = self.shared.last_error.lock().unwrap_or_else(|e| e.into_inner());
        (!e.is_empty()).then(|| e.clone())
    }

    /// Sets the task text; the inference thread applies it before its next step (an error there
    /// is counted and kept as the last error). Allocates: not for the control loop.
    pub fn set_prompt(&self, text: &str) {
        *self.shared.prompt.lock().unwrap_or_else(|e| e.into_inner()) = Some(text.to_owned());
    }

    /// Stops and joins the inference thread, returning the policy (`None` if a panic inside the
    /// policy consumed it).
    pub fn stop(mut self) -> Option<P> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Option<P> {
        self.shared.stop.store(true, Release);
        self.unparker.unpark();
        let policy = self.thread.take().and_then(|t| t.join().ok().flatten());
        self.shared.counters.running.store(false, Relaxed);
        policy
    }
}

impl<P: StreamPolicy> Drop for ActionStream<P> {
    fn drop(&mut self) {
        drop(self.shutdown());
    }
}

fn stats(shared: &Shared) -> StreamStats {
    let c = &shared.counters;
    StreamStats {
        ticks: c.ticks.load(Relaxed),
        chunks: c.chunks.load(Relaxed),
        late_ticks: c.late.load(Relaxed),
        decelerating_ticks: c.decelerating.load(Relaxed),
        waiting_ticks: c.waiting.load(Relaxed),
        skipped_actions: c.skipped.load(Relaxed),
        stale_chunks: c.stale.load(Relaxed),
        delay_ticks: c.delay.load(Relaxed),
        delay_estimate: c.delay_estimate.load(Relaxed),
        latency_p50_us: c.latency_p50_us.load(Relaxed),
        latency_max_us: c.latency_max_us.load(Relaxed),
        errors: c.errors.load(Relaxed),
        running: c.running.load(Acquire),
        realtime: c.realtime.load(Relaxed),
    }
}

/// Recent latencies kept by the inference thread for p50/max.
const LATENCY_WINDOW: usize = 32;

impl<P: StreamPolicy> Worker<P> {
    /// The thread's body. Returns the policy, or `None` after a panic inside it.
    fn run(mut self, rt: &RealtimeConfig) -> Option<P> {
        let shared = Arc::clone(&self.shared);
        shared.counters.realtime.store(apply_realtime(rt), Relaxed);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
        let policy = match outcome {
            Ok(()) => Some(self.policy),
            Err(panic) => {
                let what =
                    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("?");
                let message = format!("the policy panicked on the stream's inference thread (stream stopped): {what}");
                log::error!("{message}");
                shared.counters.errors.fetch_add(1, Relaxed);
                *shared.last_error.lock().unwrap_or_else(|e| e.into_inner()) = message;
                // Its state is unknown: it is dropped here rather than handed back.
                None
            }
        };
        // Last, and released: whoever sees `running` false also sees the error and count above.
        shared.counters.running.store(false, Release);
        policy
    }

    fn serve(&mut self) {
        let shared = Arc::clone(&self.shared);
        let mut latencies = [0u64; LATENCY_WINDOW];
        let mut steps = 0usize;
        let mut seq = 0u64;
        let mut prev_obs_tick: Option<u64> = None;
        let mut failures_in_row = 0u32;
        loop {
            if shared.stop.load(Acquire) {
                return;
            }
            let request = shared.requested.load(Acquire);
            if request == shared.finished.load(Relaxed) {
                self.parker.park_timeout(Duration::from_millis(100));
                continue;
            }
            let pending = shared.prompt.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(text) = pending
                && let Err(e) = self.policy.set_prompt(&text)
            {
                self.fail(&format!("prompt {text:?} refused, keeping the previous one: {e}"), &mut failures_in_row);
            }
            self.obs.update();
            if self.obs.front().seq == 0 {
                // Requested before any observation: wait for the first push.
                self.parker.park_timeout(Duration::from_millis(100));
                continue;
            }
            let obs = self.obs.front();
            let mut cameras: [Option<Frame>; MAX_CAMERAS] = [None; MAX_CAMERAS];
            for (slot, f) in cameras.iter_mut().zip(&obs.frames) {
                *slot = f.present.then(|| Frame::packed(&f.data, f.width, f.height, f.format));
            }
            let estimate = shared.measured_delay.load(Relaxed).max(self.latency_ticks(&latencies, steps));
            shared.counters.delay_estimate.store(estimate as u64, Relaxed);
            let continuation = prev_obs_tick
                .map(|p| (obs.tick - p) as usize)
                .filter(|&executed| executed < self.horizon)
                .map(|executed| Continuation { executed, inference_delay: estimate.min(self.horizon - executed) });
            let observation = Observation { cameras: &cameras[..obs.frames.len()], state: &obs.state, noise: None };
            let started = Instant::now();
            let slot = self.chunks.back();
            let result = self.policy.step_chunk(&observation, continuation, &mut slot.actions);
            let obs_tick = obs.tick;
            match result {
                Ok(_) => {
                    let elapsed = started.elapsed().as_micros() as u64;
                    latencies[steps % LATENCY_WINDOW] = elapsed;
                    steps += 1;
                    let n = steps.min(LATENCY_WINDOW);
                    let mut sorted = latencies;
                    sorted[..n].sort_unstable();
                    shared.counters.latency_p50_us.store(sorted[(n - 1) / 2], Relaxed);
                    shared.counters.latency_max_us.store(sorted[n - 1], Relaxed);
                    seq += 1;
                    let slot = self.chunks.back();
                    (slot.obs_tick, slot.seq) = (obs_tick, seq);
                    self.chunks.publish();
                    shared.counters.chunks.fetch_add(1, Relaxed);
                    prev_obs_tick = Some(obs_tick);
                    failures_in_row = 0;
                }
                Err(e @ Error::Faulted(_)) => {
                    // Every later step would fail the same way: stop now, as after a panic.
                    self.fail(&format!("policy step failed, the stream stops: {e}"), &mut failures_in_row);
                    shared.finished.store(request, Release);
                    return;
                }
                Err(e) => self.fail(&format!("policy step failed: {e}"), &mut failures_in_row),
            }
            shared.finished.store(request, Release);
            if self.max_errors > 0 && failures_in_row >= self.max_errors {
                log::error!("action stream: {failures_in_row} failed steps in a row, the inference thread stops");
                return;
            }
        }
    }

    fn fail(&self, message: &str, failures_in_row: &mut u32) {
        *failures_in_row += 1;
        let n = self.shared.counters.errors.fetch_add(1, Relaxed) + 1;
        // Every error is counted; the first and then every 100th is logged (a failing policy at
        // 50 Hz would flood the log).
        if n == 1 || n % 100 == 0 {
            log::warn!("action stream (error {n}): {message}");
        }
        let mut last = self.shared.last_error.lock().unwrap_or_else(|e| e.into_inner());
        last.clear();
        last.push_str(message);
    }

    /// The highest recent latency in control ticks, rounded up.
    fn latency_ticks(&self, latencies: &[u64; LATENCY_WINDOW], steps: usize) -> usize {
        let max = latencies[..steps.min(LATENCY_WINDOW)].iter().copied().max().unwrap_or(0);
        (max as u128 * 1000).div_ceil(self.period.as_nanos().max(1)) as usize
    }
}

/// Applies each real-time setting on its own; one the system refuses is logged and skipped.
/// Returns whether all took.
fn apply_realtime(rt: &RealtimeConfig) -> bool {
    let parts = [
        RealtimeConfig { cpus: rt.cpus.clone(), ..Default::default() },
        RealtimeConfig { fifo_priority: rt.fifo_priority, ..Default::default() },
        RealtimeConfig { lock_memory: rt.lock_memory, ..Default::default() },
    ];
    let mut all = true;
    for part in parts.iter().filter(|p| !p.is_empty()) {
        if let Err(e) = realtime::apply(part) {
            log::warn!("action stream: the inference thread runs without this setting: {e}");
            all = false;
        }
    }
    all
}

fn camera_field(i: usize) -> &'static str {
    const NAMES: [&str; MAX_CAMERAS] = [
        "observation.cameras[0]",
        "observation.cameras[1]",
        "observation.cameras[2]",
        "observation.cameras[3]",
        "observation.cameras[4]",
        "observation.cameras[5]",
        "observation.cameras[6]",
        "observation.cameras[7]",
        "observation.cameras[8]",
        "observation.cameras[9]",
        "observation.cameras[10]",
        "observation.cameras[11]",
        "observation.cameras[12]",
        "observation.cameras[13]",
        "observation.cameras[14]",
        "observation.cameras[15]",
    ];
    NAMES[i.min(MAX_CAMERAS - 1)]
}
