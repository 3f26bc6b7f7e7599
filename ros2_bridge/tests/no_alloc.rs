//! The inference thread's steady path does not touch the heap: a tick that snapshots fresh inputs,
//! steps the policy and hands the chunk to the publisher allocates nothing after the first one.
//! (Receiving and publishing allocate inside ros2-client; that happens on the other threads.)
//! Its own test binary, so that the counting allocator perturbs no other test.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::{Duration, Instant};

use common::*;
use flashrt_ros2::config::MissingCamera;
use flashrt_ros2::infer::Tick;

struct CountingAlloc;

thread_local! {
    /// Allocations made by this thread; const-initialized so reading it never allocates.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|n| n.set(n.get() + 1));
        // SAFETY: `ptr` came from the system allocator; arguments forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn steady_ticks_do_not_allocate() {
    let before = allocations();
    drop(std::hint::black_box(Box::new(1u8)));
    assert_eq!(allocations(), before + 1, "the counting allocator counts");

    let config = config(MissingCamera::Skip, Some("pick up the red cube"));
    let (mut inference, shared) = open(&config);
    // Inputs change every tick (sizes and formats too), as they would from real cameras.
    let frames: Vec<_> = (0..4).map(|s| [image("rgb8", WIDTH, HEIGHT, s), image("bgr8", 48, 40, s), image("rgba8", 64, 64, s)]).collect();
    let states: Vec<_> = (0..4).map(good_state).collect();
    let t0 = Instant::now();
    for tick in 0..12 {
        let now = t0 + Duration::from_millis(10 * tick);
        let f = &frames[tick as usize % 4];
        feed(&shared, &config, &[(0, &f[0]), (1, &f[1]), (2, &f[2])], &states[tick as usize % 4], now);
        let before = allocations();
        let outcome = inference.tick(&shared, now);
        let allocated = allocations() - before;
        assert_eq!(outcome, Tick::Ran { masked: 0 });
        // The first step may allocate (warm-up); none after it.
        if tick > 0 {
            assert_eq!(allocated, 0, "tick {tick} allocated {allocated} times");
        }
    }
}
