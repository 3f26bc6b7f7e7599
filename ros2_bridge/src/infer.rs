//! The inference thread: every replan period, snapshot the latest inputs, decide whether the tick
//! can run (and with which cameras), step the policy and hand the chunk to the publisher.
//!
//! On the steady path (prompt set, inputs valid) a tick does not allocate: the snapshot buffers,
//! the camera array and the action buffer are sized in [`Inference::new`], and `Policy::step`
//! does not allocate after its first call. Allocation happens only off that path: when a new
//! prompt is tokenized, and when a rate-limited warning is formatted.

use std::thread;
use std::time::{Duration, Instant};

use flashrt::{Frame, Observation, Policy};

use crate::config::{Config, MissingCamera};
use crate::inputs::{FrameSlot, MAX_CAMERAS, StateSlot};
use crate::msg::Time;
use crate::shared::{Shared, Skip, lock};
use crate::warn::{Suppressed, Warnings};

/// Warning slots of this thread: one per skip reason, and per camera for the camera reasons (a
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

/// What a tick did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tick {
    /// A chunk was computed and handed to the publisher; `masked` cameras were left out.
    Ran {
        masked: usize,
    },
    Skipped(Skip),
}

pub struct Inference {
    policy: Policy,
    frames: Vec<FrameSlot>,
    state: StateSlot,
    actions: Vec<f32>,
    max_frame_age: Duration,
    max_state_age: Duration,
    missing_camera: MissingCamera,
    /// The task in force; `None` until one is set.
    prompt: Option<String>,
    warnings: Warnings,
}

impl Inference {
    /// Takes the opened policy; `config.policy.prompt`, when set, is the initial task.
    pub fn new(mut policy: Policy, config: &Config) -> Result<Inference, flashrt::Error> {
        let info = policy.info();
        if let Some(text) = &config.policy.prompt {
            policy.set_prompt(text)?;
        }
        let max = (config.policy.max_frame_width as usize, config.policy.max_frame_height as usize);
        Ok(Inference {
            frames: (0..info.cameras.len()).map(|_| FrameSlot::new(max.0, max.1)).collect(),
            state: StateSlot::new(info.state_dim),
            actions: vec![0.0; policy.actions_len()],
            max_frame_age: Duration::from_secs_f64(config.inputs.max_frame_age_s),
            max_state_age: Duration::from_secs_f64(config.inputs.max_state_age_s),
            missing_camera: config.inputs.missing_camera,
            prompt: config.policy.prompt.clone(),
            warnings: Warnings::new(WARN_SLOTS, Duration::from_secs_f64(config.inputs.warn_interval_s)),
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
        let outcome = self.run(shared, now);
        match outcome {
            Tick::Ran { masked } => {
                let mut out = lock(&shared.output);
                out.actions.copy_from_slice(&self.actions);
                out.stamp = stamp;
                out.seq += 1;
                drop(out);
                shared.output_ready.notify_one();
                if masked > 0 {
                    self.warnings.warn(WARN_MASKED, now, |n| {
                        log::warn!("running with {masked} camera(s) masked (missing_camera = mask){}", Suppressed(n))
                    });
                }
            }
            Tick::Skipped(skip) => {
                shared.health.record_skip(skip);
                let (max_frame_age, max_state_age) = (self.max_frame_age, self.max_state_age);
                // A policy error was warned about in `run`, where its message is known.
                if skip == Skip::PolicyError {
                    return outcome;
                }
                self.warnings.warn(warn_slot(skip), now, |n| match skip {
                    Skip::NoPrompt => {
                        log::warn!("tick skipped: no prompt yet (set policy.prompt or publish on the prompt topic){}", Suppressed(n))
                    }
                    Skip::NoState => {
                        log::warn!("tick skipped: no valid joint state (none received, or the latest was rejected){}", Suppressed(n))
                    }
                    Skip::StaleState => log::warn!("tick skipped: joint state older than {max_state_age:?}{}", Suppressed(n)),
                    Skip::CameraMissing(i) => log::warn!(
                        "tick skipped: camera {i} has no valid frame (none received, or the latest was rejected){}",
                        Suppressed(n)
                    ),
                    Skip::CameraStale(i) => log::warn!("tick skipped: camera {i} frame older than {max_frame_age:?}{}", Suppressed(n)),
                    Skip::NoCamera => log::warn!("tick skipped: every camera is missing or stale{}", Suppressed(n)),
                    Skip::PolicyError => {}
                });
            }
        }
        outcome
    }

    fn run(&mut self, shared: &Shared, now: Instant) -> Tick {
        // Prompt publishers often repeat the task (latched topics, `ros2 topic pub -r`): only a
        // different text is tokenized again.
        let new_prompt = lock(&shared.prompt).take().filter(|text| self.prompt.as_ref() != Some(text));
        if let Some(text) = new_prompt {
            match self.policy.set_prompt(&text) {
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
            return Tick::Skipped(Skip::NoPrompt);
        }

        self.state.copy_from(&lock(&shared.state));
        match self.state.age(now) {
            None => return Tick::Skipped(Skip::NoState),
            Some(age) if age > self.max_state_age => return Tick::Skipped(Skip::StaleState),
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
                Some(skip) if self.missing_camera == MissingCamera::Skip => return Tick::Skipped(skip),
                Some(_) => {
                    local.clear();
                    masked += 1;
                }
            }
        }
        if masked == self.frames.len() {
            return Tick::Skipped(Skip::NoCamera);
        }

        let mut cameras: [Option<Frame>; MAX_CAMERAS] = [None; MAX_CAMERAS];
        for (c, f) in cameras.iter_mut().zip(&self.frames) {
            *c = f.frame();
        }
        let obs = Observation { cameras: &cameras[..self.frames.len()], state: self.state.values(), noise: None };
        match self.policy.step(&obs, &mut self.actions) {
            Ok(info) => {
                shared.health.record_step(info.latency, info.deadline_missed, masked > 0);
                Tick::Ran { masked }
            }
            Err(e) => {
                self.warnings.warn(warn_slot(Skip::PolicyError), now, |n| {
                    log::warn!("tick skipped: the policy rejected the observation: {e}{}", Suppressed(n))
                });
                Tick::Skipped(Skip::PolicyError)
            }
        }
    }

    /// Ticks every `period` until `shared` is stopped. A tick that overruns its period starts the
    /// next one at once (counted as an overrun) instead of queueing a burst of late ticks.
    pub fn run_loop(mut self, shared: &Shared, period: Duration) {
        let mut next = Instant::now();
        while !shared.stopping() {
            let now = Instant::now();
            if now < next {
                // Short sleeps so that a stop request is seen within 50 ms.
                thread::sleep((next - now).min(Duration::from_millis(50)));
                continue;
            }
            self.tick(shared, now);
            next += period;
            let after = Instant::now();
            if next < after {
                shared.health.overruns.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                next = after;
            }
        }
    }
}
