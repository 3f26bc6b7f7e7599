//! What the receive side and the inference thread drop is counted and warned about, and the
//! warnings are rate-limited per input and per reason: a line names one reason, and its
//! "(N similar suppressed)" counts only drops of that reason on that input.

#[path = "common/capture.rs"]
mod capture;
mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use capture::warnings;
use common::*;
use flashrt_ros2::config::{Config, MissingCamera};
use flashrt_ros2::infer::Tick;
use flashrt_ros2::intake::Intake;
use flashrt_ros2::msg::StringMsg;
use flashrt_ros2::shared::{Shared, lock};
use ros2_client::dds::rustdds::RepresentationIdentifier;
use ros2_client::dds::rustdds::serialization::deserialize_from_cdr_with_rep_id;
use serde::de::DeserializeOwned;

const SKIP: MissingCamera = MissingCamera::Skip;
/// Past the default `warn_interval_s` (5 s).
const LATER: Duration = Duration::from_secs(6);

fn decode<M: DeserializeOwned>(bytes: &[u8]) -> Result<M, String> {
    deserialize_from_cdr_with_rep_id::<M>(bytes, RepresentationIdentifier::CDR_LE).map(|(m, _)| m).map_err(|e| e.to_string())
}

/// The receive side alone (no policy): slots sized like `open`'s.
fn shared() -> Shared {
    Shared::new(3, (64, 64), STATE_DIM, 8)
}

fn intake<'a>(shared: &'a Shared, config: &'a Config) -> Intake<'a> {
    let mut topics: Vec<String> = config.cameras.iter().map(|c| c.topic.clone()).collect();
    topics.extend(["/joint_states".to_string(), "/prompt".to_string()]);
    Intake::new(shared, config, topics)
}

#[test]
fn a_prompt_string_without_its_nul_is_malformed_counted_and_rate_limited() {
    let config = config(SKIP, None);
    let shared = shared();
    let mut intake = intake(&shared, &config);
    // std_msgs/String "abc" whose length (3) leaves out the terminating NUL.
    let no_nul = [3, 0, 0, 0, b'a', b'b', b'c'];
    let t0 = Instant::now();
    let ((), logged) = warnings(|| {
        for k in 0..10 {
            intake.prompt(decode::<StringMsg>(&no_nul), t0 + Duration::from_millis(k));
        }
    });
    let p = &shared.health.prompt;
    assert_eq!((p.received.load(Relaxed), p.malformed.load(Relaxed)), (0, 10), "dropped and counted as malformed");
    assert_eq!(*lock(&shared.prompt), None, "no truncated task handed to the policy");
    assert_eq!(logged.len(), 1, "one warning per interval: {logged:#?}");
    assert!(logged[0].contains("/prompt") && logged[0].contains("NUL terminator"), "{}", logged[0]);
    let ((), logged) = warnings(|| intake.prompt(decode::<StringMsg>(&no_nul), t0 + LATER));
    assert_eq!(logged.len(), 1);
    assert!(logged[0].ends_with("(9 similar suppressed)"), "{}", logged[0]);
    // The same string with its NUL is the task.
    intake.prompt(decode::<StringMsg>(&[4, 0, 0, 0, b'a', b'b', b'c', 0]), t0 + LATER);
    assert_eq!(lock(&shared.prompt).as_deref(), Some("abc"));
}

#[test]
fn a_blank_prompt_is_rejected_and_the_task_stays() {
    let config = config(SKIP, Some("pick up the red cube"));
    let (mut inference, shared) = open(&config);
    let img = image("rgb8", WIDTH, HEIGHT, 1);
    let now = Instant::now();
    feed(&shared, &config, &[(0, &img), (1, &img), (2, &img)], &good_state(0), now);
    assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 });
    let mut intake = intake(&shared, &config);
    let ((), logged) = warnings(|| {
        for blank in ["", "   ", "\t\n"] {
            intake.prompt(Ok::<_, String>(StringMsg { data: blank.into() }), now);
        }
    });
    let p = &shared.health.prompt;
    assert_eq!((p.received.load(Relaxed), p.rejected.load(Relaxed)), (3, 3));
    assert_eq!(*lock(&shared.prompt), None, "a blank prompt does not replace the task");
    assert_eq!(logged.len(), 1, "{logged:#?}");
    assert!(logged[0].contains("/prompt") && logged[0].contains("blank"), "{}", logged[0]);
    assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 }, "the task stays in force");
}
