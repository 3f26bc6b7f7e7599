//! A counting global allocator for the zero-allocation tests, shared by the test binaries that
//! include it (`#[path = ".../tests/support/counting_alloc.rs"] mod counting_alloc;`).
//! [`count`] counts every thread's allocations while armed, so a binary using it runs one
//! measured loop at a time (own `main`, or one test); [`count_this_thread`] counts only the
//! calling thread's, for code whose other threads allocate by design (the ROS 2 node's DDS
//! threads, libtest's harness).
// Each test binary uses one of the two counters.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Allocations made by this thread; const-initialized so counting never allocates.
    static THREAD_ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn counted() {
    if ARMED.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
    // `try_with`: the slot is gone while a thread's locals are being destroyed.
    let _ = THREAD_ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f` with the counter armed; returns its result and how many allocations it made.
pub fn count<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    let r = f();
    ARMED.store(false, Ordering::SeqCst);
    (r, ALLOCATIONS.load(Ordering::SeqCst) - before)
}

/// Runs `f`; returns its result and how many allocations the calling thread made in it.
pub fn count_this_thread<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = THREAD_ALLOCATIONS.with(Cell::get);
    let r = f();
    (r, THREAD_ALLOCATIONS.with(Cell::get) - before)
}
