//! The asynchronous action stream (`flashrt::stream`): chunk alignment and continuity, the
//! late-chunk fallbacks, the counters, zero allocation on the control thread, errors and panics
//! in the policy, shutdown.
//!
//! Two kinds of policy: a scripted one whose chunk is a known function of the observation (so
//! every action the stream gives can be checked exactly, and a gate makes "late" deterministic),
//! and the synthesized micro Pi0.5 on the CPU backend made slow by a wrapper that sleeps after
//! each step, run in a real-time 50 Hz loop.

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use counting_alloc::count_this_thread;
use flashrt::image::{Frame, PixelFormat};
use flashrt::models::pi05::synth::{SynthSize, synthesize};
use flashrt::stream::{Continuation, StreamDims, StreamPolicy};
use flashrt::{ActionStatus, ActionStream, Error, Fallback, Observation, Policy, PolicyConfig, StepInfo, StreamConfig};

/// The scripted trajectory: action dimension `d` at tick `x`.
fn target(x: f32, d: usize) -> f32 {
    (0.07 * x + d as f32).sin() * (1.0 + d as f32)
}

/// Chunk row `i` is `target(state[0] + i)`: the state carries the tick the observation was taken
/// at, so a correctly aligned stream gives `target(tick)` on every fresh tick.
struct Scripted {
    horizon: usize,
    /// When set, each step waits for a token first (the test decides when a chunk is computed).
    gate: Option<mpsc::Receiver<()>>,
    delay: Duration,
    /// Step numbers (0-based) that fail, one that panics, and one from which the policy is faulted.
    fail: Vec<usize>,
    panic_at: Option<usize>,
    fault_from: Option<usize>,
    steps: usize,
    continuations: mpsc::Sender<Option<Continuation>>,
}

impl Scripted {
    fn new(horizon: usize) -> (Scripted, mpsc::Receiver<Option<Continuation>>) {
        let (tx, rx) = mpsc::channel();
        (
            Scripted {
                horizon,
                gate: None,
                delay: Duration::ZERO,
                fail: vec![],
                panic_at: None,
                fault_from: None,
                steps: 0,
                continuations: tx,
            },
            rx,
        )
    }
}

const DIM: usize = 2;

impl StreamPolicy for Scripted {
    fn dims(&self) -> StreamDims {
        StreamDims { horizon: self.horizon, action_dim: DIM, state_dim: 1, cameras: 1, max_frame: (8, 8) }
    }
    fn step_chunk(&mut self, obs: &Observation, continuation: Option<Continuation>, actions: &mut [f32]) -> flashrt::Result<StepInfo> {
        if let Some(gate) = &self.gate {
            gate.recv().map_err(|_| Error::Backend("gate closed".into()))?;
        }
        std::thread::sleep(self.delay);
        let step = self.steps;
        self.steps += 1;
        if self.panic_at == Some(step) {
            panic!("scripted panic at step {step}");
        }
        if self.fail.contains(&step) {
            return Err(Error::Backend(format!("scripted failure at step {step}")));
        }
        if self.fault_from.is_some_and(|from| step >= from) {
            return Err(Error::Faulted(format!("scripted device failure at step {from}", from = self.fault_from.unwrap())));
        }
        let _ = self.continuations.send(continuation);
        for (i, row) in actions.chunks_mut(DIM).enumerate() {
            for (d, a) in row.iter_mut().enumerate() {
                *a = target(obs.state[0] + i as f32, d);
            }
        }
        Ok(StepInfo { latency: self.delay, backend_time: self.delay, prompt_tokens: 0, deadline_missed: false })
    }
    fn set_prompt(&mut self, _text: &str) -> flashrt::Result<()> {
        Ok(())
    }
}

const PIXELS: [u8; 8 * 8 * 3] = [128; 8 * 8 * 3];

fn push_tick(stream: &mut ActionStream<Scripted>, tick: u64) {
    let cams = [Some(Frame::packed(&PIXELS, 8, 8, PixelFormat::Rgb8))];
    stream.push_observation(&Observation { cameras: &cams, state: &[tick as f32], noise: None }).unwrap();
}

/// Waits (bounded) until the stream has produced `n` chunks.
fn wait_chunks<P: StreamPolicy>(stream: &ActionStream<P>, n: u64) {
    let until = Instant::now() + Duration::from_secs(10);
    while stream.stats().chunks < n {
        assert!(Instant::now() < until, "no chunk {n} within 10 s: {:?}", stream.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every fresh action is exactly the scripted trajectory at its tick: each chunk was entered at
/// the row of the tick it arrived at (`new_chunk[delay:]`), across many chunks with a real delay,
/// and the chunk boundaries are as smooth as the rows inside a chunk.
#[test]
fn fresh_actions_follow_the_trajectory_across_chunk_switches() {
    let (mut policy, continuations) = Scripted::new(20);
    policy.delay = Duration::from_millis(25);
    let config = StreamConfig { control_period: Duration::from_millis(10), refill_at: Some(8), ..StreamConfig::new() };
    let mut stream = ActionStream::start(policy, &config).unwrap();
    let mut out = [0.0; DIM];
    let (mut fresh, mut switches, mut skipped) = (0, 0, 0);
    let mut last: Option<[f32; DIM]> = None;
    let (mut max_boundary_jump, mut max_inner_jump) = (0.0f32, 0.0f32);
    let mut next = Instant::now();
    for t in 0..150u64 {
        push_tick(&mut stream, t);
        let tick = stream.next_action(&mut out).unwrap();
        assert_eq!(tick.tick, t);
        if tick.status == ActionStatus::Fresh {
            fresh += 1;
            for (d, a) in out.iter().enumerate() {
                assert_eq!(*a, target(t as f32, d), "tick {t} dim {d}: {tick:?}");
            }
            if let Some(prev) = last {
                let jump = out.iter().zip(prev).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                if tick.new_chunk { max_boundary_jump = max_boundary_jump.max(jump) } else { max_inner_jump = max_inner_jump.max(jump) }
            }
            last = Some(out);
        }
        if tick.new_chunk {
            switches += 1;
            skipped += tick.skipped;
            assert_eq!(tick.chunk_age, tick.skipped, "a new chunk starts at the row of its delay");
        }
        next += config.control_period;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let s = stream.stats();
    println!("scripted: {s:?}, boundary jump {max_boundary_jump}, inner {max_inner_jump}");
    assert!(switches >= 5, "{switches} chunk switches");
    assert!(s.delay_ticks >= 2 && s.skipped_actions >= 2 * switches as u64 - 2, "{s:?}");
    assert_eq!(s.skipped_actions, skipped as u64 + s.stale_chunks * 20);
    assert_eq!(s.ticks, 150);
    assert_eq!(s.ticks, fresh + s.late_ticks + s.waiting_ticks);
    assert!(s.latency_p50_us >= 25_000 && s.latency_max_us >= s.latency_p50_us, "{s:?}");
    assert!(s.errors == 0 && s.running, "{s:?}");
    assert!(max_boundary_jump <= max_inner_jump * 1.0001, "boundary {max_boundary_jump} vs inside {max_inner_jump}");
    // The continuation: none for the first chunk, then how far the previous chunk had run.
    let first = continuations.recv().unwrap();
    assert_eq!(first, None);
    let second = continuations.recv().unwrap().expect("the second chunk continues the first");
    assert!(second.executed >= 20 - 8 - 1 && second.executed < 20, "{second:?}");
    assert!(second.inference_delay >= 2 && second.inference_delay <= 20 - second.executed, "{second:?}");
    let policy = stream.stop().expect("the policy comes back");
    assert!(policy.steps >= 5);
}

/// A chunk that is late: the stream holds the last action (Hold), or continues its velocity
/// decaying to zero over N ticks and then holds (Decelerate); every such tick is reported and
/// counted, and the next chunk is entered at the row of its arrival tick.
#[test]
fn late_chunks_hold_or_decelerate_and_are_counted() {
    for fallback in [Fallback::Hold, Fallback::Decelerate { ticks: 4 }] {
        let (mut policy, _continuations) = Scripted::new(16);
        let (gate, gate_rx) = mpsc::channel();
        policy.gate = Some(gate_rx);
        let config = StreamConfig { refill_at: Some(3), fallback, ..StreamConfig::new() };
        let mut stream = ActionStream::start(policy, &config).unwrap();
        let mut out = [0.0; DIM];
        push_tick(&mut stream, 0);
        // No chunk yet: waiting, output untouched.
        out.fill(f32::NAN);
        assert_eq!(stream.next_action(&mut out).unwrap().status, ActionStatus::Waiting);
        assert!(out[0].is_nan());
        gate.send(()).unwrap();
        wait_chunks(&stream, 1);
        // Chunk 1 (observed at tick 0) covers ticks 0..16; tick 0 passed while waiting. The next
        // is requested at tick 12 (3 left) and held back by the gate until after tick 25.
        let mut statuses = vec![];
        let mut outs = vec![];
        for t in 1..26u64 {
            push_tick(&mut stream, t);
            let tick = stream.next_action(&mut out).unwrap();
            statuses.push(tick.status);
            outs.push(out);
            if t == 1 {
                assert!(tick.new_chunk && tick.skipped == 1, "{tick:?}");
            }
        }
        // Ticks 1..=15 fresh, 16..=25 late.
        assert!(statuses[..15].iter().all(|s| *s == ActionStatus::Fresh), "{statuses:?}");
        let last_fresh = outs[14];
        let v: Vec<f32> = (0..DIM).map(|d| target(15.0, d) - target(14.0, d)).collect();
        let late = &outs[15..];
        match fallback {
            Fallback::Hold => {
                assert!(statuses[15..].iter().all(|s| *s == ActionStatus::Held), "{statuses:?}");
                assert!(late.iter().all(|o| *o == last_fresh));
            }
            Fallback::Decelerate { ticks } => {
                let mut expect = last_fresh;
                for (k, (o, s)) in late.iter().zip(&statuses[15..]).enumerate() {
                    if k < ticks {
                        assert_eq!(*s, ActionStatus::Decelerating);
                        let scale = (ticks - k) as f32 / (ticks + 1) as f32;
                        (0..DIM).for_each(|d| expect[d] += v[d] * scale);
                    } else {
                        assert_eq!(*s, ActionStatus::Held);
                    }
                    for d in 0..DIM {
                        assert!((o[d] - expect[d]).abs() <= 1e-6, "late tick {k} dim {d}: {} vs {}", o[d], expect[d]);
                    }
                }
                assert_eq!(stream.stats().decelerating_ticks, ticks as u64);
            }
        }
        let s = stream.stats();
        assert_eq!((s.late_ticks, s.waiting_ticks, s.chunks), (10, 1, 1), "{s:?}");
        // The late chunk (observed at some tick from 12 on, when its request was served) arrives
        // and is entered at the row of the current tick.
        gate.send(()).unwrap();
        wait_chunks(&stream, 2);
        push_tick(&mut stream, 26);
        let tick = stream.next_action(&mut out).unwrap();
        assert_eq!(tick.status, ActionStatus::Fresh, "{tick:?}");
        assert!(tick.new_chunk && tick.skipped == tick.chunk_age && (1..=14).contains(&tick.skipped), "{tick:?}");
        assert_eq!(out, [target(26.0, 0), target(26.0, 1)], "{tick:?}");
        drop(gate); // the inference thread is parked, not in the gate: drop must still join
        drop(stream);
    }
}

/// Failures of the policy are counted, the last one is kept, the stream keeps going (the chunk is
/// requested again); too many in a row stop the inference thread and the stream falls back.
#[test]
fn policy_errors_are_reported_and_the_stop_rule_holds() {
    let (mut policy, _c) = Scripted::new(6);
    policy.fail = vec![1, 3, 4, 5];
    let config = StreamConfig { refill_at: Some(4), max_consecutive_errors: 3, ..StreamConfig::new() };
    let mut stream = ActionStream::start(policy, &config).unwrap();
    let mut out = [0.0; DIM];
    let until = Instant::now() + Duration::from_secs(10);
    let mut t = 0;
    while stream.stats().running {
        assert!(Instant::now() < until, "{:?}", stream.stats());
        push_tick(&mut stream, t);
        stream.next_action(&mut out).unwrap();
        t += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    let s = stream.stats();
    // Steps: 0 ok, 1 fails, 2 ok (it kept going), 3, 4, 5 fail: three in a row stop it.
    assert_eq!((s.chunks, s.errors, s.running), (2, 4, false), "{s:?}");
    let error = stream.last_error().unwrap();
    assert!(error.contains("scripted failure at step 5"), "{error}");
    // After the stop: the fallback answers, nothing more is requested.
    for _ in 0..10 {
        push_tick(&mut stream, t);
        let tick = stream.next_action(&mut out).unwrap();
        assert!(matches!(tick.status, ActionStatus::Held | ActionStatus::Fresh), "{tick:?}");
        t += 1;
    }
    assert!(stream.stop().is_some(), "the policy survives errors");
}

/// A faulted policy fails every later step the same way: the stream stops at its first such
/// error instead of retrying up to `max_consecutive_errors`, and hands the policy back.
#[test]
fn a_faulted_policy_stops_the_stream_at_once() {
    let (mut policy, _c) = Scripted::new(6);
    policy.fault_from = Some(1);
    let config = StreamConfig { refill_at: Some(4), max_consecutive_errors: 50, ..StreamConfig::new() };
    let mut stream = ActionStream::start(policy, &config).unwrap();
    let mut out = [0.0; DIM];
    let until = Instant::now() + Duration::from_secs(10);
    let mut t = 0;
    while stream.stats().running {
        assert!(Instant::now() < until, "{:?}", stream.stats());
        push_tick(&mut stream, t);
        stream.next_action(&mut out).unwrap();
        t += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    let s = stream.stats();
    assert_eq!((s.chunks, s.errors), (1, 1), "{s:?}");
    let error = stream.last_error().unwrap();
    assert!(error.contains("scripted device failure at step 1") && error.contains("stream stops"), "{error}");
    let policy = stream.stop().expect("a faulted policy is handed back (to be dropped by its owner)");
    assert_eq!(policy.steps, 2, "no step after the fault");
}

/// A panic inside the policy is caught on the inference thread: reported, the stream stopped, no
/// panic reaches the caller (not at next_action, not at drop).
#[test]
fn a_panicking_policy_stops_the_stream_without_unwinding_into_the_caller() {
    let (mut policy, _c) = Scripted::new(6);
    policy.panic_at = Some(0);
    let mut stream = ActionStream::start(policy, &StreamConfig { refill_at: Some(2), ..StreamConfig::new() }).unwrap();
    let mut out = [0.0; DIM];
    push_tick(&mut stream, 0);
    let until = Instant::now() + Duration::from_secs(10);
    while stream.stats().running {
        assert!(Instant::now() < until);
        assert_eq!(stream.next_action(&mut out).unwrap().status, ActionStatus::Waiting);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(stream.last_error().unwrap().contains("scripted panic at step 0"));
    assert_eq!(stream.stats().errors, 1);
    assert!(stream.stop().is_none(), "a panicked policy is not handed back");
}

/// Refused observations name the field and leave the previous one in force; a wrong output length
/// is refused too.
#[test]
fn bad_inputs_are_refused() {
    let (policy, _c) = Scripted::new(6);
    let mut stream = ActionStream::start(policy, &StreamConfig::new()).unwrap();
    let cams = [Some(Frame::packed(&PIXELS, 8, 8, PixelFormat::Rgb8))];
    let err = stream.push_observation(&Observation { cameras: &cams, state: &[f32::NAN], noise: None }).unwrap_err();
    assert!(err.to_string().contains("observation.state[0]"), "{err}");
    let big = [Some(Frame::packed(&[0; 16 * 8 * 3], 16, 8, PixelFormat::Rgb8))];
    let err = stream.push_observation(&Observation { cameras: &big, state: &[0.0], noise: None }).unwrap_err();
    assert!(err.to_string().contains("observation.cameras[0]") && err.to_string().contains("exceeds"), "{err}");
    assert!(stream.next_action(&mut [0.0; 3]).unwrap_err().to_string().contains("invalid out"));
    // Nothing valid was pushed: no request was made.
    let mut out = [0.0; DIM];
    assert_eq!(stream.next_action(&mut out).unwrap().status, ActionStatus::Waiting);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(stream.stats().chunks, 0);
    let (p, _c) = Scripted::new(6);
    let err = ActionStream::start(p, &StreamConfig { refill_at: Some(6), ..StreamConfig::new() }).err().unwrap();
    assert!(err.to_string().contains("stream.refill_at"), "{err}");
}

/// The micro Pi0.5 on the CPU backend, slowed by a sleep after each step; it keeps every chunk
/// with the continuation the stream asked for (on the inference thread: not counted).
struct Slow {
    policy: Policy,
    extra: Duration,
    chunks: Vec<(Option<Continuation>, Vec<f32>)>,
}

impl StreamPolicy for Slow {
    fn dims(&self) -> StreamDims {
        self.policy.dims()
    }
    fn step_chunk(&mut self, obs: &Observation, c: Option<Continuation>, actions: &mut [f32]) -> flashrt::Result<StepInfo> {
        let info = self.policy.step_chunk(obs, c, actions)?;
        self.chunks.push((c, actions.to_vec()));
        std::thread::sleep(self.extra);
        Ok(info)
    }
    fn set_prompt(&mut self, text: &str) -> flashrt::Result<()> {
        self.policy.set_prompt(text)
    }
}

/// A real-time 50 Hz loop against the CPU backend with a slow step (~50 ms more): chunks keep
/// coming, each entered at the row of its measured delay, the control thread makes no heap
/// allocation per tick after warm-up, the real-time settings fall back when refused, and the
/// stream shuts down cleanly, handing the policy back usable.
#[test]
fn micro_pi05_at_50_hz_with_a_slow_step() {
    let plain = micro_pi05_run(None);
    let rtc = micro_pi05_run(Some(flashrt::RtcConfig::default()));
    println!("new chunks vs the actions they replace during the inference delay: mean gap {plain:.4} without RTC, {rtc:.4} with RTC");
    // RTC pins a chunk's first rows (those the robot executes while it is computed) to the
    // previous chunk (measured: 3.29 apart without RTC, 0.0005 with it); a plain chunk is
    // unrelated to the one it replaces.
    assert!(rtc < 0.2 * plain, "RTC should continue the previous chunk: gap {rtc} vs {plain} without it");
}

/// One 150-tick run; returns the mean gap, over the rows executed during each inference delay,
/// between a new chunk and the previous one at the same control ticks.
fn micro_pi05_run(rtc: Option<flashrt::RtcConfig>) -> f32 {
    let dir = tempfile::tempdir().unwrap();
    synthesize(dir.path(), SynthSize::Micro, 5, &|_| {}).unwrap();
    let mut config = PolicyConfig::new(dir.path());
    (config.max_frame_width, config.max_frame_height, config.threads) = (64, 64, Some(1));
    config.backend = flashrt::BackendKind::Cpu;
    config.rtc = rtc;
    let mut policy = Policy::open(&config).unwrap();
    policy.set_prompt("pick up the cube").unwrap();
    let (horizon, action_dim, state_dim) = (policy.info().horizon, policy.info().action_dim, policy.info().state_dim);
    // SCHED_FIFO 1 on CPU 0: applied as root (CI), refused and logged otherwise.
    let realtime = flashrt::realtime::RealtimeConfig { cpus: vec![0], fifo_priority: Some(1), lock_memory: false };
    let expect_rt = {
        let rt = realtime.clone();
        std::thread::spawn(move || flashrt::realtime::apply(&rt).is_ok()).join().unwrap()
    };
    let stream_config = StreamConfig { refill_at: Some(horizon - 10), realtime, ..StreamConfig::new() };
    let period = stream_config.control_period;
    let mut stream = ActionStream::start(Slow { policy, extra: Duration::from_millis(50), chunks: Vec::new() }, &stream_config).unwrap();

    let pixels: Vec<u8> = (0..56 * 56 * 3).map(|i| (i * 13 % 251) as u8).collect();
    let mut state = vec![0.0f32; state_dim];
    let mut out = vec![0.0f32; action_dim];
    let mut prev = vec![0.0f32; action_dim];
    let (mut allocations, mut measured) = (0, 0);
    let (mut boundary, mut inner) = (vec![], vec![]);
    let mut next = Instant::now();
    for t in 0..150u64 {
        state.iter_mut().enumerate().for_each(|(i, s)| *s = (0.02 * t as f32 + i as f32).sin());
        let cams = [Some(Frame::packed(&pixels, 56, 56, PixelFormat::Rgb8)), None, Some(Frame::packed(&pixels, 56, 56, PixelFormat::Bgr8))];
        let obs = Observation { cameras: &cams, state: &state, noise: None };
        let ((pushed, tick), n) = count_this_thread(|| {
            let pushed = stream.push_observation(&obs);
            (pushed, stream.next_action(&mut out))
        });
        pushed.unwrap();
        let tick = tick.unwrap();
        // Warm-up: the first chunk (and the stream's own first use of each path) may allocate.
        if stream.stats().chunks >= 1 && t >= 20 {
            allocations += n;
            measured += 1;
        }
        if tick.status == ActionStatus::Fresh && t > 0 {
            let jump = out.iter().zip(&prev).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            if tick.new_chunk {
                boundary.push(jump)
            } else {
                inner.push(jump)
            }
            if tick.new_chunk {
                assert_eq!(tick.chunk_age, tick.skipped);
            }
        }
        prev.copy_from_slice(&out);
        next += period;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let s = stream.stats();
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len().max(1) as f32;
    println!(
        "micro pi05 stream (rtc {}): {s:?}; jump at chunk boundaries mean {:.4} max {:.4} ({} switches), inside chunks mean {:.4}",
        rtc.is_some(),
        mean(&boundary),
        boundary.iter().copied().fold(0.0, f32::max),
        boundary.len(),
        mean(&inner)
    );
    assert_eq!(allocations, 0, "the control thread allocated {allocations} times over {measured} ticks");
    assert!(measured >= 100, "{measured} ticks measured");
    assert!(s.chunks >= 3 && boundary.len() >= 2, "{s:?}");
    assert!(s.delay_ticks >= 3 && s.delay_estimate >= 3, "a step of >= 50 ms is >= 3 ticks at 50 Hz: {s:?}");
    assert!(s.latency_p50_us >= 50_000, "{s:?}");
    assert!(s.skipped_actions >= 3 * (boundary.len() as u64), "{s:?}");
    assert_eq!(s.ticks, 150);
    assert!(s.errors == 0 && s.running, "{s:?}");
    assert_eq!(s.realtime, expect_rt, "{s:?}");
    assert!(boundary.iter().chain(&inner).all(|j| j.is_finite()));
    let started = Instant::now();
    let Slow { mut policy, chunks, .. } = stream.stop().expect("clean stop hands the policy back");
    assert!(started.elapsed() < Duration::from_secs(2), "shutdown took {:?}", started.elapsed());
    let mut chunk = vec![0.0; horizon * action_dim];
    let cams = [Some(Frame::packed(&pixels, 56, 56, PixelFormat::Rgb8)), None, None];
    policy.step(&Observation { cameras: &cams, state: &state, noise: None }, &mut chunk).unwrap();
    // Row i of a new chunk is meant for the tick of row executed + i of the previous one.
    let mut gaps = Vec::new();
    for pair in chunks.windows(2) {
        let [(_, previous), (Some(c), new)] = pair else { continue };
        for i in 0..c.inference_delay.min(horizon.saturating_sub(c.executed)) {
            let (a, b) = (&new[i * action_dim..][..action_dim], &previous[(c.executed + i) * action_dim..][..action_dim]);
            gaps.push(a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max));
        }
    }
    assert!(gaps.len() >= 3, "{} overlapping rows", gaps.len());
    mean(&gaps)
}
