//! Stream mode's control thread: every control period (`stream.rate_hz`) it hands the newest
//! complete observation to a [`flashrt::ActionStream`] (which runs inference on its own thread,
//! with the `realtime` settings, whenever the current chunk runs low) and publishes the one action
//! the stream gives for this tick.
//!
//! Inputs go through the same [`Observer`] as in chunk mode: a tick whose inputs are unusable
//! (stale state, missing camera, no prompt, ...) pushes nothing, is counted and warned about
//! alike, and still publishes the stream's action: the rest of the chunk in hand, then the
//! fallback. Nothing is published while the stream waits for its first chunk.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use flashrt::stream::StreamPolicy;
use flashrt::{ActionStatus, ActionStream, ActionTick, Policy};

use crate::config::Config;
use crate::infer::Observer;
use crate::shared::{Shared, StreamHealth, lock};
use crate::warn::{Suppressed, Warnings};

pub struct Control<P: StreamPolicy = Policy> {
    stream: ActionStream<P>,
    observer: Observer,
    action: Vec<f32>,
    rate_hz: f64,
    /// Publishing failures, at most one line per `warn_interval_s`.
    warnings: Warnings,
}

impl<P: StreamPolicy> Control<P> {
    /// Starts the stream over `policy` (its initial prompt already set) with `config`'s stream
    /// settings.
    pub fn start(policy: P, config: &Config) -> Result<Control<P>, flashrt::Error> {
        let dims = policy.dims();
        let stream = ActionStream::start(policy, &config.stream_config())?;
        Ok(Control {
            observer: Observer::new(config, dims.cameras, dims.state_dim),
            action: vec![0.0; stream.action_dim()],
            stream,
            rate_hz: config.stream_rate_hz(),
            warnings: Warnings::new(2, Duration::from_secs_f64(config.inputs.warn_interval_s)),
        })
    }

    pub fn stream(&self) -> &ActionStream<P> {
        &self.stream
    }

    /// One control tick at `now`: push the newest usable observation, take this tick's action and
    /// hand it to `publish` (unless the stream is still waiting for its first chunk), then copy
    /// the stream's counters into the health report. `None`: the stream gave no action this tick.
    pub fn tick<E: std::fmt::Display>(
        &mut self,
        shared: &Shared,
        now: Instant,
        publish: impl FnOnce(&[f32]) -> Result<(), E>,
    ) -> Option<ActionTick> {
        let stream = &mut self.stream;
        // A new task reaches the stream's inference thread before its next step.
        if let Ok(masked) = self.observer.capture(shared, now, |text| {
            stream.set_prompt(text);
            Ok(())
        }) {
            match self.observer.with_observation(|obs| stream.push_observation(obs)) {
                Ok(()) => shared.health.record_observation(masked > 0),
                Err(e) => self.observer.policy_error(shared, &e, now),
            }
        }
        // `action` has the stream's width, so `next_action` does not refuse it; were it to, the
        // tick publishes nothing rather than stop the node.
        let tick = match self.stream.next_action(&mut self.action) {
            Ok(tick) => tick,
            Err(e) => {
                self.warnings.warn(1, now, |n| log::warn!("taking the tick's action failed: {e}{}", Suppressed(n)));
                return None;
            }
        };
        if tick.status != ActionStatus::Waiting {
            match publish(&self.action) {
                Ok(()) => _ = shared.health.published.fetch_add(1, Relaxed),
                Err(e) => _ = self.warnings.warn(0, now, |n| log::warn!("publishing the action failed: {e}{}", Suppressed(n))),
            }
        }
        *lock(&shared.health.stream) = Some(StreamHealth { stats: self.stream.stats(), last: tick.status, rate_hz: self.rate_hz });
        Some(tick)
    }
}
