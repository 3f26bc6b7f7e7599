//! The inference thread's steady path does not touch the heap: a tick that snapshots fresh inputs,
//! steps the policy, hands the observation to the recorder and the chunk to the publisher
//! allocates nothing after the first one.
//! (Receiving and publishing allocate inside ros2-client; that happens on the other threads.)
//! Its own test binary, so that the counting allocator perturbs no other test.

mod common;

use std::time::{Duration, Instant};

use common::*;
use flashrt_ros2::config::MissingCamera;
use flashrt_ros2::infer::Tick;

#[path = "../../tests/support/counting_alloc.rs"]
mod counting_alloc;

#[test]
fn steady_ticks_do_not_allocate() {
    let (_, counted) = counting_alloc::count_this_thread(|| std::hint::black_box(Box::new(1u8)));
    assert_eq!(counted, 1, "the counting allocator counts");

    // Recording on: the recorder's writer thread allocates, the inference thread does not.
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(MissingCamera::Skip, Some("pick up the red cube"));
    config.inputs.record_observations = dir.path().join("obs.frtobs");
    let (mut inference, shared) = open(&config);
    // Inputs change every tick (sizes and formats too), as they would from real cameras.
    let frames: Vec<_> = (0..4).map(|s| [image("rgb8", WIDTH, HEIGHT, s), image("bgr8", 48, 40, s), image("rgba8", 64, 64, s)]).collect();
    let states: Vec<_> = (0..4).map(good_state).collect();
    let t0 = Instant::now();
    for tick in 0..12 {
        let now = t0 + Duration::from_millis(10 * tick);
        let f = &frames[tick as usize % 4];
        feed(&shared, &config, &[(0, &f[0]), (1, &f[1]), (2, &f[2])], &states[tick as usize % 4], now);
        let (outcome, allocated) = counting_alloc::count_this_thread(|| inference.tick(&shared, now));
        assert_eq!(outcome, Tick::Ran { masked: 0 });
        // The first step may allocate (warm-up); none after it.
        if tick > 0 {
            assert_eq!(allocated, 0, "tick {tick} allocated {allocated} times");
        }
    }
}
