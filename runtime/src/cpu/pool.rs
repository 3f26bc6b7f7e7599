//! The CPU backend's worker pool: `threads - 1` workers spawned at open and parked between steps;
//! the calling thread takes part 0 of every job itself. A job is published without allocation: a
//! pointer to the caller's closure behind an epoch counter. Parts are assigned statically (worker
//! `w` runs part `w`), so which thread computes a row never changes its arithmetic: results are
//! bit-identical for any thread count.
//!
//! Waiting spins for up to [`SPIN`] and then parks: the ops of one step follow each other within
//! microseconds, and waking a parked thread costs tens of microseconds (more in a VM), which would
//! eat the gain of splitting small ops; between steps the threads park and cost no CPU.

use std::marker::PhantomData;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::sync::{Parker, Unparker};
use crossbeam_utils::{Backoff, CachePadded};

/// Upper bound on threads (and so on the parts of one job).
pub const MAX_THREADS: usize = 64;
/// How long a waiting thread spins before it parks.
const SPIN: Duration = Duration::from_micros(200);

type Task<'a> = dyn Fn(usize) + Sync + 'a;

struct Shared {
    /// Bumped once per job; workers compare it with the last one they ran.
    epoch: CachePadded<AtomicUsize>,
    /// Workers still running the current job.
    running: CachePadded<AtomicUsize>,
    /// Points at a `&Task` on the caller's stack, valid until `running` reaches zero.
    job: AtomicPtr<()>,
    parts: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Wakes the caller when the last worker finishes.
    caller: Unparker,
}

pub struct Pool {
    shared: Arc<Shared>,
    caller: Parker,
    workers: Vec<(JoinHandle<()>, Unparker)>,
}

impl Pool {
    /// A pool of `threads` (clamped to `1..=MAX_THREADS`), the calling thread included.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let caller = Parker::new();
        let shared = Arc::new(Shared {
            epoch: CachePadded::new(AtomicUsize::new(0)),
            running: CachePadded::new(AtomicUsize::new(0)),
            job: AtomicPtr::new(std::ptr::null_mut()),
            parts: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            caller: caller.unparker().clone(),
        });
        let mut pool = Pool { shared, caller, workers: Vec::new() };
        for part in 1..threads.clamp(1, MAX_THREADS) {
            let parker = Parker::new();
            let unparker = parker.unparker().clone();
            let shared = Arc::clone(&pool.shared);
            // On error `pool` drops here and stops the workers already started.
            let handle = std::thread::Builder::new().name(format!("flashrt-cpu-{part}")).spawn(move || work(&shared, &parker, part))?;
            pool.workers.push((handle, unparker));
        }
        Ok(pool)
    }

    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `task(part)` for every `part < parts` (at most [`Pool::threads`]) and returns when all
    /// are done. A panic in any part is re-raised here.
    pub fn run(&self, parts: usize, task: &Task) {
        assert!(parts <= self.threads(), "{parts} parts for {} threads", self.threads());
        if parts <= 1 {
            if parts == 1 {
                task(0);
            }
            return;
        }
        let s = &*self.shared;
        let task_ref: &Task = task;
        s.job.store(&task_ref as *const &Task as *mut (), Ordering::Relaxed);
        s.parts.store(parts, Ordering::Relaxed);
        s.running.store(self.workers.len(), Ordering::Relaxed);
        // Release: a worker that sees the new epoch sees the job above.
        s.epoch.fetch_add(1, Ordering::Release);
        for (_, unparker) in &self.workers {
            unparker.unpark();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| task(0)));
        // The closure lives on this stack: wait for every worker even if part 0 panicked.
        wait_until(&self.caller, || s.running.load(Ordering::Acquire) == 0);
        if let Err(payload) = mine {
            std::panic::resume_unwind(payload);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a CPU worker thread panicked");
        }
    }
}

fn work(s: &Shared, parker: &Parker, part: usize) {
    let mut seen = 0;
    loop {
        wait_until(parker, || s.stop.load(Ordering::Acquire) || s.epoch.load(Ordering::Acquire) != seen);
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        seen = s.epoch.load(Ordering::Acquire);
        if part < s.parts.load(Ordering::Relaxed) {
            // SAFETY: `job` points at the caller's `&Task`, which outlives this job: `Pool::run`
            // returns only after `running` reaches zero, which this worker's decrement below is
            // part of.
            let task = unsafe { *(s.job.load(Ordering::Relaxed) as *const &Task) };
            if catch_unwind(AssertUnwindSafe(|| task(part))).is_err() {
                s.panicked.store(true, Ordering::Relaxed);
            }
        }
        if s.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            s.caller.unpark();
        }
    }
}

/// Spins (backing off) until `done` or [`SPIN`] has passed, then parks until `done`. Whoever
/// makes `done` true unparks this parker afterwards, so no wake-up is lost.
fn wait_until(parker: &Parker, done: impl Fn() -> bool) {
    let (backoff, started) = (Backoff::new(), Instant::now());
    while !done() {
        if !backoff.is_completed() {
            backoff.snooze();
        } else if started.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            parker.park();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for (handle, unparker) in self.workers.drain(..) {
            unparker.unpark();
            let _ = handle.join();
        }
    }
}

/// A mutable slice cut into disjoint ranges that the parts of one job take, each at most once:
/// how a job's parts write their own rows of one output buffer.
pub struct Parts<'a, T> {
    data: *mut T,
    ranges: [Range<usize>; MAX_THREADS],
    count: usize,
    taken: [AtomicBool; MAX_THREADS],
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: `take` hands each range out at most once, and the ranges are disjoint (checked in
// `new`), so sharing `Parts` moves `&mut [T]`s between threads: sound for `T: Send`.
unsafe impl<T: Send> Sync for Parts<'_, T> {}

impl<'a, T> Parts<'a, T> {
    /// `ranges` must be ascending, non-overlapping and inside `data` (checked), at most
    /// [`MAX_THREADS`] of them.
    pub fn new(data: &'a mut [T], ranges: impl IntoIterator<Item = Range<usize>>) -> Self {
        let mut parts = Parts {
            data: data.as_mut_ptr(),
            ranges: [const { 0..0 }; MAX_THREADS],
            count: 0,
            taken: [const { AtomicBool::new(false) }; MAX_THREADS],
            _borrow: PhantomData,
        };
        let mut end = 0;
        for range in ranges {
            assert!(parts.count < MAX_THREADS, "more than {MAX_THREADS} parts");
            assert!(
                end <= range.start && range.start <= range.end && range.end <= data.len(),
                "part {range:?} overlaps or is outside 0..{}",
                data.len()
            );
            end = range.end;
            parts.ranges[parts.count] = range;
            parts.count += 1;
        }
        parts
    }

    /// Part `i`'s range; panics when `i` is out of range or already taken.
    #[allow(clippy::mut_from_ref)] // each range is handed out once (the `taken` flags)
    pub fn take(&self, i: usize) -> &'a mut [T] {
        assert!(i < self.count, "part {i} of {}", self.count);
        assert!(!self.taken[i].swap(true, Ordering::AcqRel), "part {i} taken twice");
        let r = &self.ranges[i];
        // SAFETY: the range lies inside the borrowed slice, is disjoint from every other part and
        // is handed out only once (checked above).
        unsafe { std::slice::from_raw_parts_mut(self.data.add(r.start), r.len()) }
    }
}

/// Splits `rows` into `parts` contiguous blocks of whole multiples of `align` rows (the last takes
/// the rest), as even as that allows; entries past `parts` are empty.
pub fn row_blocks(rows: Range<usize>, parts: usize, align: usize) -> [Range<usize>; MAX_THREADS] {
    let units = rows.len().div_ceil(align);
    let at = |i: usize| rows.start + ((units * i / parts) * align).min(rows.len());
    std::array::from_fn(|i| if i < parts { at(i)..at(i + 1) } else { 0..0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_once_per_job_over_many_jobs() {
        let pool = Pool::new(4).unwrap();
        assert_eq!(pool.threads(), 4);
        let counts: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
        for job in 0..2000 {
            let parts = 1 + job % 4;
            pool.run(parts, &|i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        let got: Vec<usize> = counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(got, [2000, 1500, 1000, 500]);
    }

    #[test]
    fn parts_write_disjoint_ranges() {
        let pool = Pool::new(3).unwrap();
        let mut data = vec![0usize; 100];
        {
            let parts = Parts::new(&mut data, row_blocks(0..100, 3, 8).into_iter().take(3));
            pool.run(3, &|i| parts.take(i).iter_mut().for_each(|v| *v = i + 1));
        }
        // 13 units of 8: 0..32, 32..64, 64..100.
        assert!(data[..32].iter().all(|&v| v == 1) && data[32..64].iter().all(|&v| v == 2) && data[64..].iter().all(|&v| v == 3));
    }

    #[test]
    #[should_panic(expected = "taken twice")]
    fn a_part_cannot_be_taken_twice() {
        let mut data = [0u8; 4];
        let parts = Parts::new(&mut data, [0..2, 2..4]);
        parts.take(1);
        parts.take(1);
    }

    #[test]
    #[should_panic(expected = "overlaps")]
    fn overlapping_parts_are_refused() {
        let mut data = [0u8; 4];
        Parts::new(&mut data, [0..3, 2..4]);
    }

    #[test]
    fn a_panicking_part_is_reraised_and_the_pool_stays_usable() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| pool.run(2, &|i| assert!(i != 1, "part 1 fails"))));
        assert!(r.is_err());
        let hits = AtomicUsize::new(0);
        pool.run(2, &|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }
}
