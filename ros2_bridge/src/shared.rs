//! State shared by the node's threads: the input slots, the pending prompt, the latest action
//! chunk, and the health counters. Locks are held only for a copy.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use flashrt::{ActionStatus, Continuation, LatencyStats, StreamStats};
use serde_json::{Value, json};

use crate::config::OutputMode;
use crate::inputs::{FrameSlot, StateSlot};
use crate::msg::Time;

/// Why a tick published nothing. The order is the health report's; never reorder silently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// No prompt set yet (config or prompt topic).
    NoPrompt,
    /// No valid joint state held (never received, or the latest was rejected).
    NoState,
    StaleState,
    /// A camera has no valid frame and `missing_camera = skip`.
    CameraMissing(usize),
    CameraStale(usize),
    /// Every camera masked: the policy needs at least one frame.
    NoCamera,
    /// The policy rejected the observation (logged with its message).
    PolicyError,
}

impl Skip {
    pub const COUNT: usize = 7;
    const NAMES: [&'static str; Skip::COUNT] =
        ["no_prompt", "no_state", "stale_state", "camera_missing", "camera_stale", "no_camera", "policy_error"];

    pub fn index(self) -> usize {
        match self {
            Skip::NoPrompt => 0,
            Skip::NoState => 1,
            Skip::StaleState => 2,
            Skip::CameraMissing(_) => 3,
            Skip::CameraStale(_) => 4,
            Skip::NoCamera => 5,
            Skip::PolicyError => 6,
        }
    }

    pub fn name(self) -> &'static str {
        Skip::NAMES[self.index()]
    }
}

/// Remote endpoints on a topic that DDS did not match with the node's because their QoS is
/// incompatible (a best-effort publisher for a reliable subscription, a subscriber asking for
/// transient-local from a volatile publisher, ...): nothing flows between them.
#[derive(Default)]
pub struct QosCounters {
    pub incompatible: AtomicU64,
    /// The last mismatch, in words (`reliability: offered best_effort, requested reliable`).
    pub last: Mutex<Option<String>>,
}

impl QosCounters {
    pub fn record(&self, mismatch: String) {
        self.incompatible.fetch_add(1, Relaxed);
        *lock(&self.last) = Some(mismatch);
    }

    fn report(&self, v: &mut Value) {
        v["incompatible_qos"] = json!(self.incompatible.load(Relaxed));
        v["qos_mismatch"] = json!(*lock(&self.last));
    }
}

/// Messages seen on one input topic.
#[derive(Default)]
pub struct InputCounters {
    pub received: AtomicU64,
    /// Decoded, but failed validation (encoding, size, NaN, names, ...).
    pub rejected: AtomicU64,
    /// Could not be decoded as the topic's type.
    pub malformed: AtomicU64,
    /// Publishers on the topic that cannot be matched.
    pub qos: QosCounters,
}

impl InputCounters {
    fn report(&self) -> Value {
        let mut v = json!({ "received": self.received.load(Relaxed), "rejected": self.rejected.load(Relaxed), "malformed": self.malformed.load(Relaxed) });
        self.qos.report(&mut v);
        v
    }
}

/// The outputs of each mode, in the order of the health report's `outputs` (and of
/// [`crate::qos_watch::Endpoint::Output`]).
pub fn outputs(mode: OutputMode) -> &'static [&'static str] {
    match mode {
        OutputMode::Chunk => &["trajectory", "action_chunk", "health"],
        OutputMode::Stream => &["action", "health"],
    }
}

/// Stream mode: the action stream's counters and the last tick, as the control thread saw them.
#[derive(Clone, Copy, Debug)]
pub struct StreamHealth {
    pub stats: StreamStats,
    pub last: ActionStatus,
    pub rate_hz: f64,
}

impl StreamHealth {
    fn report(&self) -> Value {
        let s = &self.stats;
        let status = match self.last {
            ActionStatus::Waiting => "waiting",
            ActionStatus::Fresh => "fresh",
            ActionStatus::Held => "held",
            ActionStatus::Decelerating => "decelerating",
        };
        json!({
            "rate_hz": self.rate_hz,
            "tick_status": status,
            "ticks": s.ticks,
            "chunks": s.chunks,
            "fresh_ticks": s.ticks - s.late_ticks - s.waiting_ticks,
            "late_ticks": s.late_ticks,
            "decelerating_ticks": s.decelerating_ticks,
            "waiting_ticks": s.waiting_ticks,
            "skipped_actions": s.skipped_actions,
            "stale_chunks": s.stale_chunks,
            "delay_ticks": s.delay_ticks,
            "delay_estimate": s.delay_estimate,
            "errors": s.errors,
            "running": s.running,
            "realtime": s.realtime,
        })
    }
}

const LAST_NONE: usize = 0;
const LAST_RAN: usize = 1;
const LAST_MASKED: usize = 2;
const LAST_SKIPPED: usize = 3;

pub struct Health {
    started: Instant,
    mode: OutputMode,
    pub cameras: Vec<InputCounters>,
    pub state: InputCounters,
    pub prompt: InputCounters,
    /// Subscribers that cannot be matched, per output ([`outputs`] of the mode).
    pub outputs: Vec<QosCounters>,
    pub steps: AtomicU64,
    /// Steps run (stream mode: observations handed to the stream) with at least one camera
    /// masked.
    pub masked_steps: AtomicU64,
    pub skipped: [AtomicU64; Skip::COUNT],
    /// Ticks that started later than a replan period after the previous one.
    pub overruns: AtomicU64,
    pub published: AtomicU64,
    last: AtomicUsize,
    last_latency_ns: AtomicU64,
    latency: Mutex<LatencyStats>,
    /// Chunk mode with RTC: steps run, steps that continued the previous chunk, and the last
    /// continuation's rows executed and inference delay.
    rtc_steps: AtomicU64,
    rtc_continued: AtomicU64,
    rtc_executed: AtomicU64,
    rtc_delay: AtomicU64,
    /// Stream mode, updated every control tick.
    pub stream: Mutex<Option<StreamHealth>>,
}

impl Health {
    pub fn new(cameras: usize, mode: OutputMode) -> Health {
        Health {
            started: Instant::now(),
            mode,
            cameras: (0..cameras).map(|_| InputCounters::default()).collect(),
            state: InputCounters::default(),
            prompt: InputCounters::default(),
            outputs: outputs(mode).iter().map(|_| QosCounters::default()).collect(),
            steps: AtomicU64::new(0),
            masked_steps: AtomicU64::new(0),
            skipped: Default::default(),
            overruns: AtomicU64::new(0),
            published: AtomicU64::new(0),
            last: AtomicUsize::new(LAST_NONE),
            last_latency_ns: AtomicU64::new(0),
            latency: Mutex::new(LatencyStats::new()),
            rtc_steps: AtomicU64::new(0),
            rtc_continued: AtomicU64::new(0),
            rtc_executed: AtomicU64::new(0),
            rtc_delay: AtomicU64::new(0),
            stream: Mutex::new(None),
        }
    }

    /// An input's counters, numbered like the receive side's inputs: cameras, joint states,
    /// prompt.
    pub fn input(&self, i: usize) -> &InputCounters {
        match i.checked_sub(self.cameras.len()) {
            None => &self.cameras[i],
            Some(0) => &self.state,
            Some(_) => &self.prompt,
        }
    }

    pub fn record_step(&self, latency: Duration, deadline_missed: bool, masked: bool) {
        self.steps.fetch_add(1, Relaxed);
        self.masked_steps.fetch_add(masked as u64, Relaxed);
        self.last.store(if masked { LAST_MASKED } else { LAST_RAN }, Relaxed);
        self.last_latency_ns.store(latency.as_nanos() as u64, Relaxed);
        lock(&self.latency).record(latency, deadline_missed);
    }

    /// Chunk mode with RTC: a step ran with `continuation` (`None`: nothing left to continue).
    pub fn record_continuation(&self, continuation: Option<Continuation>) {
        self.rtc_steps.fetch_add(1, Relaxed);
        if let Some(c) = continuation {
            self.rtc_continued.fetch_add(1, Relaxed);
            self.rtc_executed.store(c.executed as u64, Relaxed);
            self.rtc_delay.store(c.inference_delay as u64, Relaxed);
        }
    }

    /// Stream mode: an observation was handed to the stream.
    pub fn record_observation(&self, masked: bool) {
        self.masked_steps.fetch_add(masked as u64, Relaxed);
        self.last.store(if masked { LAST_MASKED } else { LAST_RAN }, Relaxed);
    }

    pub fn record_skip(&self, skip: Skip) {
        self.skipped[skip.index()].fetch_add(1, Relaxed);
        self.last.store(LAST_SKIPPED + skip.index(), Relaxed);
    }

    /// The 1 Hz report (allocates; runs on the publisher thread). `topics` are the camera topics,
    /// `output_topics` those of the mode's [`outputs`]; `camera_ages` are the held frames' ages,
    /// `None` for an empty slot.
    pub fn report(&self, node: &str, topics: &[String], output_topics: &[String], camera_ages: &[Option<Duration>]) -> Value {
        let s = lock(&self.latency).summary();
        let stream = *lock(&self.stream);
        let last = self.last.load(Relaxed);
        // Stream mode: the stream's inference thread steps the policy.
        let steps = stream.map_or(self.steps.load(Relaxed), |s| s.stats.chunks);
        // `waiting` until the first step has run, whatever the ticks before it skipped on
        // (`last_skip` says what is missing): a node that never ran is not a degraded one.
        let status = match last {
            _ if steps == 0 => "waiting",
            LAST_RAN => "ok",
            _ => "degraded",
        };
        let last_skip = last.checked_sub(LAST_SKIPPED).and_then(|i| Skip::NAMES.get(i).copied());
        // Two decimals: ten microseconds is below anything the report is read for.
        let round = |ms: f64| (ms * 100.0).round() / 100.0;
        let ms = |d: Option<Duration>| d.map(|d| round(d.as_secs_f64() * 1e3));
        let latency = match stream {
            // The stream keeps the p50 and max of its last 32 steps.
            Some(st) => json!({ "p50": round(st.stats.latency_p50_us as f64 / 1e3), "max": round(st.stats.latency_max_us as f64 / 1e3) }),
            None => json!({
                "last": ms(Some(Duration::from_nanos(self.last_latency_ns.load(Relaxed)))),
                "p50": round(s.p50_ms), "p90": round(s.p90_ms), "p99": round(s.p99_ms), "max": round(s.max_ms),
                "deadline_misses": s.deadline_misses,
            }),
        };
        let rtc_steps = self.rtc_steps.load(Relaxed);
        let rtc = (rtc_steps > 0).then(|| {
            json!({
                "steps": rtc_steps,
                "continued": self.rtc_continued.load(Relaxed),
                "executed": self.rtc_executed.load(Relaxed),
                "inference_delay": self.rtc_delay.load(Relaxed),
            })
        });
        let cameras: Vec<Value> = self
            .cameras
            .iter()
            .zip(topics)
            .zip(camera_ages)
            .map(|((c, topic), age)| {
                let mut v = c.report();
                v["topic"] = json!(topic);
                v["age_ms"] = json!(ms(*age));
                v
            })
            .collect();
        let outputs: serde_json::Map<String, Value> = outputs(self.mode)
            .iter()
            .zip(&self.outputs)
            .zip(output_topics)
            .map(|((name, q), topic)| {
                let mut v = json!({ "topic": topic });
                q.report(&mut v);
                (name.to_string(), v)
            })
            .collect();
        let skipped: serde_json::Map<String, Value> =
            Skip::NAMES.iter().zip(&self.skipped).map(|(n, c)| (n.to_string(), json!(c.load(Relaxed)))).collect();
        let mode = match self.mode {
            OutputMode::Chunk => "chunk",
            OutputMode::Stream => "stream",
        };
        json!({
            "node": node,
            "mode": mode,
            "status": status,
            "last_skip": last_skip,
            "uptime_s": (self.started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            "steps": steps,
            "masked_steps": self.masked_steps.load(Relaxed),
            "published": self.published.load(Relaxed),
            "overruns": self.overruns.load(Relaxed),
            "skipped": skipped,
            "latency_ms": latency,
            "rtc": rtc,
            "stream": stream.map(|s| s.report()),
            "cameras": cameras,
            "joint_states": self.state.report(),
            "prompt": self.prompt.report(),
            "outputs": outputs,
        })
    }
}

/// The newest action chunk, handed from the inference thread to the publisher thread.
pub struct Output {
    pub actions: Vec<f32>,
    /// Wall-clock time of the observation the chunk was computed from.
    pub stamp: Time,
    /// Incremented per chunk; the publisher publishes each sequence number once.
    pub seq: u64,
}

pub struct Shared {
    pub frames: Vec<Mutex<FrameSlot>>,
    pub state: Mutex<StateSlot>,
    /// A prompt received on the topic and not yet handed to the policy.
    pub prompt: Mutex<Option<String>>,
    pub output: Mutex<Output>,
    pub output_ready: Condvar,
    pub health: Health,
    stop: AtomicBool,
}

impl Shared {
    pub fn new(cameras: usize, max_frame: (usize, usize), state_dim: usize, actions_len: usize, mode: OutputMode) -> Shared {
        Shared {
            frames: (0..cameras).map(|_| Mutex::new(FrameSlot::new(max_frame.0, max_frame.1))).collect(),
            state: Mutex::new(StateSlot::new(state_dim)),
            prompt: Mutex::new(None),
            output: Mutex::new(Output { actions: vec![0.0; actions_len], stamp: Time::default(), seq: 0 }),
            output_ready: Condvar::new(),
            health: Health::new(cameras, mode),
            stop: AtomicBool::new(false),
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        // Taking the lock orders the flag before the publisher's next check of it.
        drop(lock(&self.output));
        self.output_ready.notify_all();
    }

    /// The output mode the health report is laid out for.
    pub fn health_mode(&self) -> OutputMode {
        self.health.mode
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Relaxed)
    }

    pub fn camera_ages(&self, now: Instant) -> Vec<Option<Duration>> {
        self.frames.iter().map(|f| lock(f).age(now)).collect()
    }
}

/// Locks, ignoring poisoning: every critical section here is a plain copy that leaves the data
/// consistent, so a panic elsewhere must not take the node's other threads down with it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_status_and_counts() {
        let h = Health::new(2, OutputMode::Chunk);
        let topics = ["/a".to_string(), "/b".to_string()];
        let outputs = ["/t".to_string(), "/c".to_string(), "/h".to_string()];
        let r = h.report("/flashrt", &topics, &outputs, &[None, Some(Duration::from_millis(12))]);
        assert_eq!(r["status"], "waiting");
        assert_eq!(r["cameras"][1]["age_ms"], 12.0);
        assert!(r["cameras"][0]["age_ms"].is_null());
        // Ticks skipped before the first step: still waiting, and the report says for what.
        h.record_skip(Skip::NoPrompt);
        h.record_skip(Skip::CameraStale(1));
        let r = h.report("/flashrt", &topics, &outputs, &[None, None]);
        assert_eq!((r["status"].as_str(), r["last_skip"].as_str()), (Some("waiting"), Some("camera_stale")));
        assert_eq!((r["steps"].as_u64(), r["skipped"]["no_prompt"].as_u64()), (Some(0), Some(1)));
        h.record_step(Duration::from_millis(3), false, false);
        let r = h.report("/flashrt", &topics, &outputs, &[None, None]);
        assert_eq!(r["status"], "ok");
        assert!(r["last_skip"].is_null());
        assert_eq!(r["steps"], 1);
        assert_eq!(r["latency_ms"]["last"], 3.0);
        // Once it has run, a skipped tick is degraded.
        h.record_skip(Skip::CameraStale(0));
        let r = h.report("/flashrt", &topics, &outputs, &[None, None]);
        assert_eq!((r["status"].as_str(), r["last_skip"].as_str()), (Some("degraded"), Some("camera_stale")));
        assert_eq!(r["skipped"]["camera_stale"], 2);
        h.record_step(Duration::from_millis(3), false, true);
        assert_eq!(h.report("/flashrt", &topics, &outputs, &[None, None])["status"], "degraded", "masked");
    }

    #[test]
    fn report_names_incompatible_qos_per_topic() {
        let h = Health::new(1, OutputMode::Chunk);
        let (topics, outputs) = (["/a".to_string()], ["/t".to_string(), "/c".to_string(), "/h".to_string()]);
        let r = h.report("/flashrt", &topics, &outputs, &[None]);
        assert_eq!((r["prompt"]["incompatible_qos"].as_u64(), r["outputs"]["trajectory"]["incompatible_qos"].as_u64()), (Some(0), Some(0)));
        assert!(r["prompt"]["qos_mismatch"].is_null());
        h.input(2).qos.record("reliability: offered best_effort, requested reliable".into());
        h.input(0).qos.record("x".into());
        h.outputs[0].record("durability: offered volatile, requested transient_local".into());
        let r = h.report("/flashrt", &topics, &outputs, &[None]);
        assert_eq!(r["prompt"]["incompatible_qos"], 1);
        assert_eq!(r["prompt"]["qos_mismatch"], "reliability: offered best_effort, requested reliable");
        assert_eq!(r["cameras"][0]["incompatible_qos"], 1);
        assert_eq!(r["joint_states"]["incompatible_qos"], 0);
        assert_eq!(r["outputs"]["trajectory"]["topic"], "/t");
        assert_eq!(r["outputs"]["trajectory"]["incompatible_qos"], 1);
        assert_eq!(r["outputs"]["health"]["incompatible_qos"], 0);
    }
}
