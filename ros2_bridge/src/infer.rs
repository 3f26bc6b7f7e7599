//! From the shared input slots to the policy. [`Observer`] takes the newest inputs (prompt, joint
//! state, frames), decides whether a tick can run and with which cameras, and counts and warns
//! about what it cannot use; both output modes feed the policy through it. [`Inference`] is chunk
//! mode's inference thread: every replan period, observe, step the policy and hand the chunk to
//! the publisher (stream mode's control thread is [`crate::control`]).
//!
//! On the steady path (prompt set, inputs valid) a tick does not allocate: the snapshot buffers,
//! the camera array and the action buffer are sized at start, and `Policy::step` does not
//! allocate after its first call, nor does handing the observation to the recorder
//! (`inputs.record_observations`) once its buffers hold the cameras' frame sizes. Allocation happens only off that path: when a new prompt is
//! tokenized, and when a rate-limited warning is formatted.

use std::thread;
use std::time::{Duration, Instant};

use flashrt::observation_log::Recorder;
use flashrt::{Continuation, Frame, Observation, Policy};

use crate::config::{Config, MissingCamera};
use crate::inputs::{FrameSlot, MAX_CAMERAS, StateSlot};
use crate::msg::Time;
use crate::shared::{Shared, Skip, lock};
use crate::warn::{Suppressed, Warnings};

/// Warning slots of the observer: one per skip reason, and per camera for the camera reasons (a
/// line about camera 0 must not count camera 1's skips among its suppressed), then prompt
/// rejection and masking.
const WARN_PROMPT: usize = Skip::COUNT + 2 * MAX_CAMERAS;
const WARN_MASKED: usize = WARN_PROMPT + 1;
const WARN_SLOTS: usize = WARN_MASKED + 1;

fn warn_slot(skip: Skip) -> usize {
    match skip {
        Skip::CameraMissing(i) => Skip::COUNT + i,
        Skip::CameraStale(i) => Skip::COUNT + MAX_CAMERAS + i,
        other => other.index(),
    }
}

/// The newest inputs, copied out of [`Shared`] into buffers sized at start, and the task in force.
pub struct Observer {
    frames: Vec<FrameSlot>,
    state: StateSlot,
    max_frame_age: Duration,
    max_state_age: Duration,
    missing_camera: MissingCamera,
    /// The task in force; `None` until one is set.
    prompt: Option<String>,
    warnings: Warnings,
}

impl Observer {
    /// `config.policy.prompt`, when set, is the task in force (the caller has handed it to the
    /// policy).
    pub fn new(config: &Config, cameras: usize, state_dim: usize) -> Observer {
        let max = (config.policy.max_frame_width as usize, config.policy.max_frame_height as usize);
        Observer {
            frames: (0..cameras).map(|_| FrameSlot::new(max.0, max.1)).collect(),
            state: StateSlot::new(state_dim),
            max_frame_age: Duration::from_secs_f64(config.inputs.max_frame_age_s),
            max_state_age: Duration::from_secs_f64(config.inputs.max_state_age_s),
            missing_camera: config.inputs.missing_camera,
            prompt: config.policy.prompt.clone(),
            warnings: Warnings::new(WARN_SLOTS, Duration::from_secs_f64(config.inputs.warn_interval_s)),
        }
    }

    /// Takes the newest inputs at `now`: hands a new prompt from the topic to `set_prompt`, then
    /// copies the joint state and the usable frames. Returns the number of cameras masked, or why
    /// the tick cannot run (counted in the health report and warned about, rate-limited).
    pub fn capture(
        &mut self,
        shared: &Shared,
        now: Instant,
        set_prompt: impl FnOnce(&str) -> Result<(), flashrt::Error>,
    ) -> Result<usize, Skip> {
        let outcome = self.snapshot(shared, now, set_prompt);
        match outcome {
            Ok(0) => {}
            Ok(masked) => {
                self.warnings.warn(WARN_MASKED, now, |n| {
                    log::warn!("running with {masked} camera(s) masked (missing_camera = mask){}", Suppressed(n))
                });
            }
            Err(skip) => self.skipped(shared, skip, now),
        }
        outcome
    }

    /// Counts a skipped tick and warns about it (rate-limited).
    fn skipped(&mut self, shared: &Shared, skip: Skip, now: Instant) {
        shared.health.record_skip(skip);
        let (max_frame_age, max_state_age) = (self.max_frame_age, self.max_state_age);
        self.warnings.warn(warn_slot(skip), now, |n| match skip {
            Skip::NoPrompt => {
                log::warn!("tick skipped: no prompt yet (set policy.prompt or publish on the prompt topic){}", Suppressed(n))
            }
            Skip::NoState => {
                log::warn!("tick skipped: no valid joint state (none received, or the latest was rejected){}", Suppressed(n))
            }
            Skip::StaleState => log::warn!("tick skipped: joint state older than {max_state_age:?}{}", Suppressed(n)),
            Skip::CameraMissing(i) => {
                log::warn!("tick skipped: camera {i} has no valid frame (none received, or the latest was rejected){}", Suppressed(n))
            }
            Skip::CameraStale(i) => log::warn!("tick skipped: camera {i} frame older than {max_frame_age:?}{}", Suppressed(n)),
            Skip::NoCamera => log::warn!("tick skipped: every camera is missing or stale{}", Suppressed(n)),
            Skip::PolicyError => {}
        });
    }

    /// A tick skipped because the policy refused the observation: counted, and warned about with
    /// the policy's message.
    pub fn policy_error(&mut self, shared: &Shared, e: &flashrt::Error, now: Instant) {
        shared.health.record_skip(Skip::PolicyError);
        self.warnings.warn(warn_slot(Skip::PolicyError), now, |n| {
            log::warn!("tick skipped: the policy rejected the observation: {e}{}", Suppressed(n))
        });
    }

    fn snapshot(
        &mut self,
        shared: &Shared,
        now: Instant,
        set_prompt: impl FnOnce(&str) -> Result<(), flashrt::Error>,
    ) -> Result<usize, Skip> {
        // Prompt publishers often repeat the task (latched topics, `ros2 topic pub -r`): only a
        // different text is handed on again.
        let new_prompt = lock(&shared.prompt).take().filter(|text| self.prompt.as_ref() != Some(text));
        if let Some(text) = new_prompt {
            match set_prompt(&text) {
                Ok(()) => {
                    log::info!("prompt set: {text:?}");
                    self.prompt = Some(text);
                }
                Err(e) => {
                    shared.health.prompt.rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.warnings
                        .warn(WARN_PROMPT, now, |n| log::warn!("prompt {text:?} rejected, keeping the previous one: {e}{}", Suppressed(n)));
                }
            }
        }
        if self.prompt.is_none() {
            return Err(Skip::NoPrompt);
        }

        self.state.copy_from(&lock(&shared.state));
        match self.state.age(now) {
            None => return Err(Skip::NoState),
            Some(age) if age > self.max_state_age => return Err(Skip::StaleState),
            Some(_) => {}
        }

        let mut masked = 0;
        for (i, (local, slot)) in self.frames.iter_mut().zip(&shared.frames).enumerate() {
            let slot = lock(slot);
            // Only fresh frames are worth copying.
            let skip = match slot.age(now) {
                None => Some(Skip::CameraMissing(i)),
                Some(age) if age > self.max_frame_age => Some(Skip::CameraStale(i)),
                Some(_) => None,
            };
            match skip {
                None => local.copy_from(&slot),
                Some(skip) if self.missing_camera == MissingCamera::Skip => return Err(skip),
                Some(_) => {
                    local.clear();
                    masked += 1;
                }
            }
        }
        if masked == self.frames.len() {
            return Err(Skip::NoCamera);
        }
        Ok(masked)
    }

    /// Calls `f` with the last captured observation (masked cameras as `None`).
    pub fn with_observation<R>(&self, f: impl FnOnce(&Observation) -> R) -> R {
        let mut cameras: [Option<Frame>; MAX_CAMERAS] = [None; MAX_CAMERAS];
        for (c, slot) in cameras.iter_mut().zip(&self.frames) {
            *c = slot.frame();
        }
        f(&Observation { cameras: &cameras[..self.frames.len()], state: self.state.values(), noise: None })
    }
}

/// What a tick did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tick {
    /// A chunk was computed and handed to the publisher; `masked` cameras were left out.
    Ran {
        masked: usize,
    },
    Skipped(Skip),
}

/// Chunk mode with real-time chunking: where the robot is in the last published chunk.
struct Rtc {
    /// Time between the chunk's rows (`timing.control_rate_hz`): row `i` is reached `(i + 1)`
    /// periods after its observation.
    period: Duration,
    horizon: usize,
    /// When the last published chunk's inputs were taken.
    last_chunk: Option<Instant>,
    /// Latency of the last step: how long the robot goes on with the old chunk after an
    /// observation.
    last_latency: Duration,
}

impl Rtc {
    /// The continuation of the last published chunk for a step observing at `now`: rows of it
    /// reached since its observation (time over the period, to the nearest row, as a
    /// `joint_trajectory_controller` executing it has reached them), and the rows still to be
    /// executed while this step runs (the last step's latency in periods, rounded up). `None`
    /// before the first chunk and once the last one is used up.
    fn continuation(&self, now: Instant) -> Option<Continuation> {
        let since = now.saturating_duration_since(self.last_chunk?);
        let executed = (since.as_secs_f64() / self.period.as_secs_f64()).round() as usize;
        let inference_delay = self.last_latency.as_nanos().div_ceil(self.period.as_nanos().max(1)) as usize;
        (executed < self.horizon).then(|| Continuation { executed, inference_delay: inference_delay.min(self.horizon - executed) })
    }
}

/// Chunk mode's inference thread.
pub struct Inference {
    policy: Policy,
    observer: Observer,
    actions: Vec<f32>,
    /// Set when the policy was opened with `policy.rtc`.
    rtc: Option<Rtc>,
    /// `inputs.record_observations`: every observation stepped on.
    recorder: Option<Recorder>,
}

impl Inference {
    /// Takes the opened policy; `config.policy.prompt`, when set, is the initial task.
    pub fn new(mut policy: Policy, config: &Config) -> Result<Inference, flashrt::Error> {
        let info = policy.info();
        if let Some(text) = &config.policy.prompt {
            policy.set_prompt(text)?;
        }
        let rtc = policy.rtc_enabled().then(|| Rtc {
            period: config.control_period(),
            horizon: info.horizon,
            last_chunk: None,
            last_latency: Duration::ZERO,
        });
        Ok(Inference {
            observer: Observer::new(config, info.cameras.len(), info.state_dim),
            actions: vec![0.0; policy.actions_len()],
            rtc,
            recorder: config.recorder(&policy)?,
            policy,
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// One tick at `now`: see the module docs. Never panics on bad input; every skip is counted
    /// in the health report and warned about (rate-limited).
    pub fn tick(&mut self, shared: &Shared, now: Instant) -> Tick {
        let stamp = Time::now();
        let (policy, recorder) = (&mut self.policy, &mut self.recorder);
        let set_prompt = |text: &str| {
            policy.set_prompt(text)?;
            if let Some(r) = recorder.as_mut() {
                r.set_prompt(text);
            }
            Ok(())
        };
        let masked = match self.observer.capture(shared, now, set_prompt) {
            Ok(masked) => masked,
            Err(skip) => return Tick::Skipped(skip),
        };
        let continuation = self.rtc.as_ref().and_then(|rtc| rtc.continuation(now));
        let actions = &mut self.actions;
        let step = |obs: &Observation| {
            let info = policy.step_continuing(obs, continuation, actions)?;
            if let Some(r) = recorder {
                r.record(obs);
            }
            Ok::<_, flashrt::Error>(info)
        };
        match self.observer.with_observation(step) {
            Ok(info) => {
                shared.health.record_step(info.latency, info.deadline_missed, masked > 0);
                if let Some(rtc) = &mut self.rtc {
                    (rtc.last_chunk, rtc.last_latency) = (Some(now), info.latency);
                    shared.health.record_continuation(continuation);
                }
                let mut out = lock(&shared.output);
                out.actions.copy_from_slice(&self.actions);
                out.stamp = stamp;
                out.seq += 1;
                drop(out);
                shared.output_ready.notify_one();
                Tick::Ran { masked }
            }
            Err(e) => {
                self.observer.policy_error(shared, &e, now);
                Tick::Skipped(Skip::PolicyError)
            }
        }
    }

    /// Ticks every `period` until `shared` is stopped ([`run_every`]).
    pub fn run_loop(mut self, shared: &Shared, period: Duration) {
        run_every(shared, period, |now| {
            self.tick(shared, now);
        });
    }
}

/// Calls `tick` every `period` until `shared` is stopped. A tick that overruns its period starts
/// the next one at once (counted as an overrun) instead of queueing a burst of late ticks.
pub fn run_every(shared: &Shared, period: Duration, mut tick: impl FnMut(Instant)) {
    let mut next = Instant::now();
    while !shared.stopping() {
        let now = Instant::now();
        if now < next {
            // Short sleeps so that a stop request is seen within 50 ms.
            thread::sleep((next - now).min(Duration::from_millis(50)));
            continue;
        }
        tick(now);
        next += period;
        let after = Instant::now();
        if next < after {
            shared.health.overruns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            next = after;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_from_time_and_latency() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut rtc = Rtc { period: ms(20), horizon: 10, last_chunk: None, last_latency: ms(5) };
        assert_eq!(rtc.continuation(t0), None, "no chunk yet");
        rtc.last_chunk = Some(t0);
        let at = |rtc: &Rtc, after: u64| rtc.continuation(t0 + ms(after)).map(|c| (c.executed, c.inference_delay));
        // Rows reached, to the nearest; the latency in periods, rounded up.
        assert_eq!(at(&rtc, 109), Some((5, 1)));
        assert_eq!(at(&rtc, 111), Some((6, 1)));
        rtc.last_latency = ms(41);
        assert_eq!(at(&rtc, 100), Some((5, 3)));
        // The delay never reaches past what is left; nothing is left at the horizon.
        assert_eq!(at(&rtc, 160), Some((8, 2)));
        assert_eq!(at(&rtc, 195), None);
    }
}
