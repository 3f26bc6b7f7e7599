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
use flashrt_ros2::shared::{Shared, Skip, lock};
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
    Shared::new(3, (64, 64), STATE_DIM, 8, flashrt_ros2::config::OutputMode::Chunk)
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
        // Underscores and the separators Python's strip removes are blank to the prompt cleaning.
        for blank in ["", "   ", "\t\n", "__ _", "\u{1c}\u{1f}"] {
            intake.prompt(Ok::<_, String>(StringMsg { data: blank.into() }), now);
        }
    });
    let p = &shared.health.prompt;
    assert_eq!((p.received.load(Relaxed), p.rejected.load(Relaxed)), (5, 5));
    assert_eq!(*lock(&shared.prompt), None, "a blank prompt does not replace the task");
    assert_eq!(logged.len(), 1, "{logged:#?}");
    assert!(logged[0].contains("/prompt") && logged[0].contains("blank"), "{}", logged[0]);
    assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 }, "the task stays in force");
}

#[test]
fn joint_state_warnings_are_limited_per_reason() {
    let mut config = config(SKIP, Some("pick"));
    config.joint_states.names = (0..STATE_DIM).map(|i| format!("j{i}")).collect();
    let shared = shared();
    let mut intake = intake(&shared, &config);
    let mut missing = good_state(0);
    missing.name[5] = "elbow".into();
    let mut nan = good_state(0);
    nan.position[2] = f64::NAN;
    let mut huge = good_state(0);
    huge.position[3] = 1e300;
    let t0 = Instant::now();
    let ((), first) = warnings(|| {
        for _ in 0..300 {
            intake.joint_state(Ok::<_, String>(missing.clone()), t0);
        }
        intake.joint_state(Ok::<_, String>(nan.clone()), t0);
        for _ in 0..5 {
            intake.joint_state(Ok::<_, String>(huge.clone()), t0);
        }
    });
    assert_eq!(first.len(), 3, "one line per reason: {first:#?}");
    assert!(first[0].contains("/joint_states") && first[0].contains("missing"), "{}", first[0]);
    assert!(first[1].contains("NaN or infinite"), "{}", first[1]);
    // A finite 1e300 overflows f32: out of range, its own reason, not "NaN or infinite".
    assert!(first[2].contains("out of range") && !first[2].contains("NaN"), "{}", first[2]);
    let ((), next) = warnings(|| {
        for js in [&missing, &nan, &huge] {
            intake.joint_state(Ok::<_, String>(js.clone()), t0 + LATER);
        }
    });
    assert_eq!(next.len(), 3, "{next:#?}");
    assert!(next[0].contains("missing") && next[0].ends_with("(299 similar suppressed)"), "{}", next[0]);
    assert!(next[1].contains("NaN or infinite") && !next[1].contains("suppressed"), "{}", next[1]);
    assert!(next[2].contains("out of range") && next[2].ends_with("(4 similar suppressed)"), "{}", next[2]);
    assert_eq!(shared.health.state.rejected.load(Relaxed), 309);
}

#[test]
fn skip_warnings_are_limited_per_camera() {
    let config = config(SKIP, Some("wave"));
    let (mut inference, shared) = open(&config);
    let img = image("rgb8", WIDTH, HEIGHT, 1);
    let t0 = Instant::now();
    let ((), logged) = warnings(|| {
        feed(&shared, &config, &[(1, &img), (2, &img)], &good_state(0), t0);
        assert_eq!(inference.tick(&shared, t0), Tick::Skipped(Skip::CameraMissing(0)));
        feed(&shared, &config, &[(0, &img), (2, &img)], &good_state(0), t0);
        lock(&shared.frames[1]).clear();
        assert_eq!(inference.tick(&shared, t0), Tick::Skipped(Skip::CameraMissing(1)));
        assert_eq!(inference.tick(&shared, t0), Tick::Skipped(Skip::CameraMissing(1)));
    });
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert!(logged[0].contains("camera 0"), "{}", logged[0]);
    assert!(logged[1].contains("camera 1"), "camera 1's skip is not counted under camera 0's line: {}", logged[1]);
    let t1 = t0 + LATER;
    feed(&shared, &config, &[(0, &img), (2, &img)], &good_state(0), t1);
    let (tick, logged) = warnings(|| inference.tick(&shared, t1));
    assert_eq!(tick, Tick::Skipped(Skip::CameraMissing(1)));
    assert_eq!(logged.len(), 1, "{logged:#?}");
    assert!(logged[0].contains("camera 1") && logged[0].ends_with("(1 similar suppressed)"), "{}", logged[0]);
}
