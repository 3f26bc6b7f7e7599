//! The receive side, without DDS: each message taken from a subscription (or the decode error
//! that took its place) is validated, copied into its slot, counted in the health report and,
//! when dropped, warned about (rate-limited per input and per reason). The node's receive thread
//! feeds it from the subscriptions; tests feed it directly.

use std::fmt::Display;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::inputs::{Reject, check_prompt};
use crate::msg::{Image, JointState, StringMsg};
use crate::shared::{InputCounters, Shared, lock};
use crate::warn::{Suppressed, Warnings};

/// Warning slots per input: one per rejection reason, then one for undecodable messages.
const REASONS: usize = 4;
const MALFORMED: usize = REASONS;
const PER_INPUT: usize = REASONS + 1;

pub struct Intake<'a> {
    shared: &'a Shared,
    config: &'a Config,
    /// Resolved input topics, indexed like the inputs: cameras, joint states, prompt.
    topics: Vec<String>,
    warnings: Warnings,
}

impl<'a> Intake<'a> {
    /// `topics` are the resolved input topics, in input order (cameras, joint states, prompt):
    /// warnings name them.
    pub fn new(shared: &'a Shared, config: &'a Config, topics: Vec<String>) -> Intake<'a> {
        assert_eq!(topics.len(), config.cameras.len() + 2, "one topic per camera, then joint states and prompt");
        let warnings = Warnings::new(PER_INPUT * topics.len(), Duration::from_secs_f64(config.inputs.warn_interval_s));
        Intake { shared, config, topics, warnings }
    }

    /// A message (or decode error) from camera `i`'s topic.
    pub fn camera<E: Display>(&mut self, i: usize, msg: Result<Image, E>, now: Instant) {
        let (shared, camera) = (self.shared, &self.config.cameras[i]);
        let expected = camera.width.zip(camera.height);
        self.handle(
            i,
            &shared.health.cameras[i],
            msg,
            now,
            |img| lock(&shared.frames[i]).store(img, expected, now),
            |r, img| {
                format!(
                    "camera {i}: frame dropped ({}x{} {:?}, step {}, {} bytes): {}",
                    img.width,
                    img.height,
                    img.encoding,
                    img.step,
                    img.data.len(),
                    r.describe()
                )
            },
        );
    }

    /// A message (or decode error) from the joint-state topic.
    pub fn joint_state<E: Display>(&mut self, msg: Result<JointState, E>, now: Instant) {
        let (shared, config) = (self.shared, self.config);
        let names = &config.joint_states.names;
        self.handle(
            config.cameras.len(),
            &shared.health.state,
            msg,
            now,
            |js| lock(&shared.state).store(js, names, now),
            |r, js| format!("joint state dropped ({} names, {} positions): {}", js.name.len(), js.position.len(), r.describe()),
        );
    }

    /// A message (or decode error) from the prompt topic.
    pub fn prompt<E: Display>(&mut self, msg: Result<StringMsg, E>, now: Instant) {
        let shared = self.shared;
        let accepted = self.handle(
            self.config.cameras.len() + 1,
            &shared.health.prompt,
            msg,
            now,
            |msg| check_prompt(&msg.data),
            |r, msg| format!("prompt dropped ({} bytes): {}", msg.data.len(), r.describe()),
        );
        if let Some(msg) = accepted {
            *lock(&shared.prompt) = Some(msg.data);
        }
    }

    /// Counts `msg`, stores it with `store`, and warns (rate-limited) when it is dropped;
    /// `describe` words a rejection, only when the rate limit lets it be logged. Returns the
    /// message when `store` accepted it.
    fn handle<M, R: Reject, E: Display>(
        &mut self,
        input: usize,
        counters: &InputCounters,
        msg: Result<M, E>,
        now: Instant,
        store: impl FnOnce(&M) -> Result<(), R>,
        describe: impl FnOnce(R, &M) -> String,
    ) -> Option<M> {
        const { assert!(R::COUNT <= REASONS) };
        let topic = &self.topics[input];
        let base = input * PER_INPUT;
        match msg {
            Ok(msg) => {
                counters.received.fetch_add(1, Relaxed);
                match store(&msg) {
                    Ok(()) => Some(msg),
                    Err(r) => {
                        counters.rejected.fetch_add(1, Relaxed);
                        self.warnings.warn(base + r.index(), now, |n| log::warn!("{topic}: {}{}", describe(r, &msg), Suppressed(n)));
                        None
                    }
                }
            }
            Err(e) => {
                counters.malformed.fetch_add(1, Relaxed);
                self.warnings.warn(base + MALFORMED, now, |n| log::warn!("{topic}: undecodable message dropped: {e}{}", Suppressed(n)));
                None
            }
        }
    }
}
