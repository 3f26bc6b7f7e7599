//! The two output modes without DDS: chunk mode with real-time chunking passes each step where
//! the robot is in the previous chunk (seen through the health report's `rtc` counters), and
//! stream mode's control thread publishes one action per tick from an action stream and reports
//! the stream's counters; both record what they step on with `inputs.record_observations`.

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

/// `inputs.record_observations` in chunk mode: every observation stepped on is in the log, with
/// the prompt in force (the configured one, then the topic's); a skipped tick records nothing.
#[test]
fn chunk_mode_records_the_observations_it_steps_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(MissingCamera::Skip, Some("pick up the red cube"));
    config.inputs.record_observations = dir.path().join("node.frtobs");
    let (mut inference, shared) = open(&config);
    let t0 = Instant::now();
    for tick in 0..3u32 {
        let now = t0 + Duration::from_millis(100 * tick as u64);
        if tick == 2 {
            *lock(&shared.prompt) = Some("place it in the bowl".into());
        }
        feed_all(&shared, &config, tick, now);
        assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 });
    }
    // A stale joint state: skipped, not recorded.
    assert!(matches!(inference.tick(&shared, t0 + Duration::from_secs(5)), Tick::Skipped(_)));
    drop(inference); // finishes the log

    let reader = flashrt::observation_log::ObservationLogReader::open(&config.inputs.record_observations).unwrap();
    assert_eq!((reader.header().cameras, reader.header().state_dim), (3, STATE_DIM as u32));
    let records: Vec<_> = reader.map(Result::unwrap).collect();
    assert_eq!(records.len(), 3);
    for (tick, rec) in records.iter().enumerate() {
        assert_eq!(rec.prompt, if tick < 2 { "pick up the red cube" } else { "place it in the bowl" });
        let state: Vec<f32> = good_state(tick as u32).position.iter().map(|&p| p as f32).collect();
        assert_eq!(rec.state, state);
        let img = image("rgb8", WIDTH, HEIGHT, tick as u32);
        for camera in &rec.cameras {
            let f = camera.as_ref().unwrap();
            assert_eq!((f.width, f.height, f.format, &f.data), (WIDTH, HEIGHT, 0, &img.data));
        }
    }
}

#[test]
fn stream_mode_publishes_one_action_per_tick_and_reports_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(MissingCamera::Skip, None);
    // The stream's chunks are recorded on its inference thread (checked at the end).
    config.inputs.record_observations = dir.path().join("stream.frtobs");
    config.output.mode = OutputMode::Stream;
    config.stream.rate_hz = Some(50.0);
    config.stream.refill_at = Some(40);
    config.policy.rtc = Some("linear".into());
    config.check().unwrap();
    let policy = flashrt::Policy::open(&config.policy_config().unwrap()).unwrap();
    config.check_policy(&policy.info()).unwrap();
    let (action_dim, horizon) = (policy.info().action_dim, policy.info().horizon);
    let shared = Shared::new(3, (64, 64), STATE_DIM, policy.actions_len(), OutputMode::Stream);
    let recorder = config.recorder(&policy).unwrap();
    let mut control = Control::start(flashrt::observation_log::RecordingPolicy { policy, recorder }, &config).unwrap();

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

    // Every chunk's observation, with the prompt the topic gave (stopping joins the stream's
    // thread, which finishes the log; a chunk may have started meanwhile).
    drop(control);
    let records: Vec<_> =
        flashrt::observation_log::ObservationLogReader::open(&config.inputs.record_observations).unwrap().map(Result::unwrap).collect();
    assert!(records.len() as u64 >= stats.chunks, "{} records of {} chunks", records.len(), stats.chunks);
    assert!(records.iter().all(|rec| rec.prompt == "pick up the red cube" && rec.cameras.iter().all(Option::is_some)));
}
