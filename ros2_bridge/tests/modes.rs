//! The two output modes without DDS: chunk mode with real-time chunking passes each step where
//! the robot is in the previous chunk (seen through the health report's `rtc` counters), and
//! stream mode's control thread publishes one action per tick from an action stream and reports
//! the stream's counters.

mod common;

use std::time::{Duration, Instant};

use common::*;
use flashrt_ros2::config::{MissingCamera, OutputMode};
use flashrt_ros2::control::Control;
use flashrt_ros2::infer::Tick;
use flashrt_ros2::shared::{Shared, lock};
use serde_json::Value;

fn report(shared: &Shared) -> Value {
    let outputs: Vec<String> = flashrt_ros2::shared::outputs(shared.health_mode()).iter().map(|o| format!("/{o}")).collect();
    shared.health.report("/flashrt", &["/a".into(), "/b".into(), "/c".into()], &outputs, &[None, None, None])
}

fn feed_all(shared: &Shared, config: &flashrt_ros2::config::Config, seed: u32, now: Instant) {
    let img = image("rgb8", WIDTH, HEIGHT, seed);
    assert_eq!(feed(shared, config, &[(0, &img), (1, &img), (2, &img)], &good_state(seed), now), (vec![true; 3], true));
}

#[test]
fn chunk_mode_with_rtc_continues_the_published_chunk() {
    let mut config = config(MissingCamera::Skip, Some("pick up the red cube"));
    config.policy.rtc = Some("linear".into());
    config.timing.control_rate_hz = 50.0;
    let (mut inference, shared) = open(&config);
    assert!(inference.policy().rtc_enabled());
    let horizon = inference.policy().info().horizon;
    let t0 = Instant::now();
    feed_all(&shared, &config, 0, t0);
    assert_eq!(inference.tick(&shared, t0), Tick::Ran { masked: 0 });
    let rtc = &report(&shared)["rtc"];
    assert_eq!((rtc["steps"].as_u64(), rtc["continued"].as_u64()), (Some(1), Some(0)), "nothing to continue yet: {rtc}");

    // 100 ms later at 50 Hz the robot has reached 5 rows of the published chunk.
    let t1 = t0 + Duration::from_millis(100);
    feed_all(&shared, &config, 1, t1);
    assert_eq!(inference.tick(&shared, t1), Tick::Ran { masked: 0 });
    let rtc = report(&shared)["rtc"].clone();
    assert_eq!((rtc["steps"].as_u64(), rtc["continued"].as_u64(), rtc["executed"].as_u64()), (Some(2), Some(1), Some(5)), "{rtc}");
    // The step's latency, in control periods rounded up: at least one row, at most what is left.
    let delay = rtc["inference_delay"].as_u64().unwrap();
    assert!((1..=(horizon as u64 - 5)).contains(&delay), "{rtc}");

    // Past the chunk's horizon nothing is left to continue: an unguided chunk.
    let t2 = t1 + Duration::from_millis(20 * horizon as u64);
    feed_all(&shared, &config, 2, t2);
    assert_eq!(inference.tick(&shared, t2), Tick::Ran { masked: 0 });
    let rtc = &report(&shared)["rtc"];
    assert_eq!((rtc["steps"].as_u64(), rtc["continued"].as_u64()), (Some(3), Some(1)), "{rtc}");

    // Without policy.rtc the report has no rtc section.
    let config = common::config(MissingCamera::Skip, Some("pick up the red cube"));
    let (mut inference, shared) = open(&config);
    feed_all(&shared, &config, 0, t0);
    assert_eq!(inference.tick(&shared, t0), Tick::Ran { masked: 0 });
    assert!(report(&shared)["rtc"].is_null());
}

#[test]
fn stream_mode_publishes_one_action_per_tick_and_reports_the_stream() {
    let mut config = config(MissingCamera::Skip, None);
    config.output.mode = OutputMode::Stream;
    config.stream.rate_hz = Some(50.0);
    config.stream.refill_at = Some(40);
    config.policy.rtc = Some("linear".into());
    config.check().unwrap();
    let policy = flashrt::Policy::open(&config.policy_config().unwrap()).unwrap();
    config.check_policy(&policy.info()).unwrap();
    let (action_dim, horizon) = (policy.info().action_dim, policy.info().horizon);
    let shared = Shared::new(3, (64, 64), STATE_DIM, policy.actions_len(), OutputMode::Stream);
    let mut control = Control::start(policy, &config).unwrap();

    let mut published: Vec<Vec<f32>> = Vec::new();
    fn into(published: &mut Vec<Vec<f32>>) -> impl FnOnce(&[f32]) -> Result<(), String> + '_ {
        |a| {
            published.push(a.to_vec());
            Ok(())
        }
    }
    // No prompt yet: nothing is pushed, nothing published, and the report says why.
    let t0 = Instant::now();
    feed_all(&shared, &config, 0, t0);
    let tick = control.tick(&shared, t0, into(&mut published)).expect("the stream gives an action every tick");
    assert_eq!(tick.status, flashrt::ActionStatus::Waiting);
    let r = report(&shared);
    assert_eq!((r["mode"].as_str(), r["status"].as_str(), r["last_skip"].as_str()), (Some("stream"), Some("waiting"), Some("no_prompt")));
    assert_eq!((r["stream"]["ticks"].as_u64(), r["stream"]["tick_status"].as_str()), (Some(1), Some("waiting")));

    // The prompt arrives; ticks at 50 Hz until two chunks have been used (bounded).
    *lock(&shared.prompt) = Some("pick up the red cube".into());
    let mut ticks = 1;
    let deadline = t0 + Duration::from_secs(20);
    while control.stream().stats().chunks < 2 || published.len() < horizon {
        assert!(Instant::now() < deadline, "{}", report(&shared));
        std::thread::sleep(Duration::from_millis(20));
        let now = Instant::now();
        feed_all(&shared, &config, ticks, now);
        control.tick(&shared, now, into(&mut published)).expect("the stream gives an action every tick");
        ticks += 1;
    }
    let stats = control.stream().stats();
    // One action per tick once the first chunk is in, each of the action's width and finite.
    assert_eq!(published.len() as u64, stats.ticks - stats.waiting_ticks);
    assert!(published.iter().all(|a| a.len() == action_dim && a.iter().all(|v| v.is_finite())));
    let r = report(&shared);
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["published"].as_u64(), Some(published.len() as u64));
    let s = &r["stream"];
    assert_eq!((s["ticks"].as_u64(), s["chunks"].as_u64()), (Some(stats.ticks), Some(stats.chunks)), "{r}");
    assert_eq!(s["fresh_ticks"].as_u64(), Some(stats.ticks - stats.late_ticks - stats.waiting_ticks));
    assert!(s["running"].as_bool().unwrap() && s["errors"] == 0, "{r}");
    assert_eq!(r["steps"].as_u64(), Some(stats.chunks));
    assert!(r["latency_ms"]["max"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["outputs"].as_object().unwrap().keys().collect::<Vec<_>>(), ["action", "health"]);
    assert!(r["skipped"]["no_prompt"].as_u64().unwrap() >= 1);
}
