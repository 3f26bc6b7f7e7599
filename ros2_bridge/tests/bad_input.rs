//! Every kind of bad input has a defined outcome (skip the tick, or run with the camera masked)
//! and leaves the node working: the next good input runs again.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::*;
use flashrt_ros2::config::MissingCamera;
use flashrt_ros2::infer::Tick;
use flashrt_ros2::shared::{Skip, lock};

const SKIP: MissingCamera = MissingCamera::Skip;
const MASK: MissingCamera = MissingCamera::Mask;

#[test]
fn good_input_publishes_a_finite_chunk() {
    let config = config(SKIP, Some("pick up the red cube"));
    let (mut inference, shared) = open(&config);
    let (rgb, bgr, rgba) = (image("rgb8", WIDTH, HEIGHT, 1), image("bgr8", WIDTH, HEIGHT, 2), image("rgba8", WIDTH, HEIGHT, 3));
    let now = Instant::now();
    assert_eq!(feed(&shared, &config, &[(0, &rgb), (1, &bgr), (2, &rgba)], &good_state(0), now), (vec![true; 3], true));
    assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 });
    let out = lock(&shared.output);
    assert_eq!(out.seq, 1);
    assert_eq!(out.actions.len(), inference.policy().actions_len());
    assert!(out.actions.iter().all(|a| a.is_finite()));
    assert!(out.stamp.sec > 0);
}

#[test]
fn wrong_encoding_or_size_drops_the_frame_then_skips_or_masks() {
    for (missing, expected) in [(SKIP, Tick::Skipped(Skip::CameraMissing(1))), (MASK, Tick::Ran { masked: 1 })] {
        let config = config(missing, Some("stack the blocks"));
        let (mut inference, shared) = open(&config);
        let good = image("rgb8", WIDTH, HEIGHT, 1);
        let now = Instant::now();
        for bad in [image("mono8", WIDTH, HEIGHT, 1), image("rgb8", 65, 8, 1), image("bgra8", WIDTH, HEIGHT, 1)] {
            // A good frame first: the bad one must replace it, not leave it in place.
            let (accepted, _) = feed(&shared, &config, &[(0, &good), (1, &good), (2, &good)], &good_state(0), now);
            assert_eq!(accepted, [true; 3]);
            let (accepted, _) = feed(&shared, &config, &[(1, &bad)], &good_state(0), now);
            assert_eq!(accepted, [false], "{} {}x{} accepted", bad.encoding, bad.width, bad.height);
            assert_eq!(inference.tick(&shared, now), expected);
        }
        // A good frame on the same camera brings it back.
        feed(&shared, &config, &[(1, &good)], &good_state(0), now);
        assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 });
    }
}

#[test]
fn old_frames_are_not_used() {
    for (missing, expected) in [(SKIP, Tick::Skipped(Skip::CameraStale(2))), (MASK, Tick::Ran { masked: 1 })] {
        let config = config(missing, Some("open the drawer"));
        let (mut inference, shared) = open(&config);
        let img = image("rgb8", WIDTH, HEIGHT, 1);
        let t0 = Instant::now();
        feed(&shared, &config, &[(2, &img)], &good_state(0), t0);
        let t1 = t0 + Duration::from_millis(800);
        feed(&shared, &config, &[(0, &img), (1, &img)], &good_state(0), t1);
        assert_eq!(inference.tick(&shared, t1), expected);
        assert_eq!(shared.health.skipped[Skip::CameraStale(0).index()].load(Relaxed), (missing == SKIP) as u64);
    }
}

#[test]
fn a_camera_that_never_publishes() {
    for (missing, expected) in [(SKIP, Tick::Skipped(Skip::CameraMissing(2))), (MASK, Tick::Ran { masked: 1 })] {
        let config = config(missing, Some("wave"));
        let (mut inference, shared) = open(&config);
        let img = image("rgb8", WIDTH, HEIGHT, 1);
        let now = Instant::now();
        feed(&shared, &config, &[(0, &img), (1, &img)], &good_state(0), now);
        assert_eq!(inference.tick(&shared, now), expected);
    }
    // With every camera silent there is nothing to run on, even when masking.
    let config = config(MASK, Some("wave"));
    let (mut inference, shared) = open(&config);
    let now = Instant::now();
    feed(&shared, &config, &[], &good_state(0), now);
    assert_eq!(inference.tick(&shared, now), Tick::Skipped(Skip::NoCamera));
}

#[test]
fn bad_joint_states_skip_the_tick() {
    let mut named = config(SKIP, Some("pick"));
    named.joint_states.names = (0..STATE_DIM).rev().map(|i| format!("j{i}")).collect();
    let img = image("rgb8", WIDTH, HEIGHT, 1);
    let cams = [(0, &img), (1, &img), (2, &img)];
    let mut nan = good_state(0);
    nan.position[3] = f64::NAN;
    let mut inf = good_state(0);
    inf.position[0] = f64::INFINITY;
    let mut renamed = good_state(0);
    renamed.name[5] = "elbow".into();
    let short = joints(&[0.0; STATE_DIM - 1]);
    for (config, bad) in [
        (config(SKIP, Some("pick")), &nan),
        (config(SKIP, Some("pick")), &inf),
        (config(SKIP, Some("pick")), &short),
        (named.clone(), &renamed),
    ] {
        let (mut inference, shared) = open(&config);
        let now = Instant::now();
        assert!(feed(&shared, &config, &cams, &good_state(0), now).1);
        assert!(!feed(&shared, &config, &cams, bad, now).1);
        assert_eq!(inference.tick(&shared, now), Tick::Skipped(Skip::NoState));
        feed(&shared, &config, &cams, &good_state(1), now);
        assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 });
    }
    // An old joint state.
    let config = config(SKIP, Some("pick"));
    let (mut inference, shared) = open(&config);
    let t0 = Instant::now();
    feed(&shared, &config, &cams, &good_state(0), t0);
    let t1 = t0 + Duration::from_secs(1);
    feed(&shared, &config, &cams, &nan, t1);
    assert_eq!(inference.tick(&shared, t1), Tick::Skipped(Skip::NoState));
    lock(&shared.state).store(&good_state(0), &[], t0).unwrap();
    assert_eq!(inference.tick(&shared, t1), Tick::Skipped(Skip::StaleState));
}

#[test]
fn no_prompt_waits_for_one_from_the_topic() {
    let config = config(SKIP, None);
    let (mut inference, shared) = open(&config);
    let img = image("rgb8", WIDTH, HEIGHT, 1);
    let now = Instant::now();
    feed(&shared, &config, &[(0, &img), (1, &img), (2, &img)], &good_state(0), now);
    assert_eq!(inference.tick(&shared, now), Tick::Skipped(Skip::NoPrompt));
    assert_eq!(inference.tick(&shared, now), Tick::Skipped(Skip::NoPrompt));
    assert_eq!(shared.health.skipped[Skip::NoPrompt.index()].load(Relaxed), 2);
    *lock(&shared.prompt) = Some("put the cup on the plate".into());
    assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 });
    assert!(lock(&shared.prompt).is_none(), "the prompt was taken");
    assert_eq!(inference.tick(&shared, now), Tick::Ran { masked: 0 }, "and stays in force");
}
