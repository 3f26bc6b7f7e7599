//! A triple buffer: one writer publishes whole values, one reader takes the latest, neither waits
//! for the other and nothing is allocated after construction.
//!
//! The stream hands observations and chunks between two threads where only the newest one
//! matters: a queue would deliver stale observations first, and a full queue would make the
//! writer wait or drop. Three preallocated slots: the writer owns one (back), the reader owns one
//! (front), the third (middle) is exchanged through one atomic byte that also carries a "new
//! value" flag.

use std::cell::UnsafeCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crossbeam_utils::CachePadded;

const INDEX: u8 = 0b11;
const FRESH: u8 = 0b100;

struct Shared<T> {
    slots: [UnsafeCell<T>; 3],
    /// Index of the middle slot, with `FRESH` set when the writer published into it since the
    /// reader last took it.
    middle: CachePadded<AtomicU8>,
}

// SAFETY: each slot is accessed by one side at a time: the writer only its back slot, the reader
// only its front slot, and a slot changes hands only through the AcqRel swaps on `middle`, which
// order the previous owner's accesses before the next owner's.
unsafe impl<T: Send> Sync for Shared<T> {}

/// The writing half. Not `Clone`: there is exactly one writer.
pub struct Writer<T> {
    shared: Arc<Shared<T>>,
    back: u8,
}

/// The reading half. Not `Clone`: there is exactly one reader.
pub struct Reader<T> {
    shared: Arc<Shared<T>>,
    front: u8,
}

/// A triple buffer whose three slots start as `make()`; slot 0 is the writer's, 1 the middle, 2
/// the reader's (nothing fresh yet).
pub fn triple<T>(mut make: impl FnMut() -> T) -> (Writer<T>, Reader<T>) {
    let shared = Arc::new(Shared {
        slots: [UnsafeCell::new(make()), UnsafeCell::new(make()), UnsafeCell::new(make())],
        middle: CachePadded::new(AtomicU8::new(1)),
    });
    (Writer { shared: Arc::clone(&shared), back: 0 }, Reader { shared, front: 2 })
}

impl<T> Writer<T> {
    /// The slot the next `publish` hands over. Its content is whatever an earlier round left.
    pub fn back(&mut self) -> &mut T {
        // SAFETY: the back slot belongs to the writer alone until `publish` (see `Shared`).
        unsafe { &mut *self.shared.slots[self.back as usize].get() }
    }

    /// Makes the back slot the latest value and takes the old middle slot as the new back.
    pub fn publish(&mut self) {
        let old = self.shared.middle.swap(self.back | FRESH, Ordering::AcqRel);
        self.back = old & INDEX;
    }
}

impl<T> Reader<T> {
    /// Takes the latest published value if one arrived since the last call; returns whether it did.
    pub fn update(&mut self) -> bool {
        if self.shared.middle.load(Ordering::Relaxed) & FRESH == 0 {
            return false;
        }
        let old = self.shared.middle.swap(self.front, Ordering::AcqRel);
        self.front = old & INDEX;
        true
    }

    /// The value taken by the last successful `update` (or the initial one).
    pub fn front(&self) -> &T {
        // SAFETY: the front slot belongs to the reader alone (see `Shared`).
        unsafe { &*self.shared.slots[self.front as usize].get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_sees_only_the_latest_and_nothing_twice() {
        let (mut w, mut r) = triple(|| 0u64);
        assert!(!r.update());
        *w.back() = 1;
        w.publish();
        *w.back() = 2;
        w.publish();
        assert!(r.update());
        assert_eq!(*r.front(), 2);
        assert!(!r.update());
        assert_eq!(*r.front(), 2);
    }

    #[test]
    fn values_cross_threads_whole_and_in_order() {
        // Each value is a block whose every element equals its sequence number: a torn read or a
        // reordering would show as mixed or decreasing numbers.
        let (mut w, mut r) = triple(|| [0u64; 64]);
        let writer = std::thread::spawn(move || {
            for i in 1..=20_000u64 {
                w.back().fill(i);
                w.publish();
            }
        });
        let mut last = 0;
        while last < 20_000 {
            if r.update() {
                let v = r.front();
                assert!(v.iter().all(|&x| x == v[0]), "torn value");
                assert!(v[0] > last, "went back from {last} to {}", v[0]);
                last = v[0];
            }
        }
        writer.join().unwrap();
    }
}
