//! `PromptTokenizer::assemble` is on the hot path: it must not touch the heap. This is its own
//! test binary so that the counting global allocator does not slow down or perturb other tests.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use flashrt::prompt::{PromptTokenizer, discretize_state};

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

#[test]
fn assemble_does_not_allocate() {
    const STATE_DIM: usize = 14;
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tokenizer/tokenizer.json"));
    let mut prompt = PromptTokenizer::from_file(path, 200, STATE_DIM).unwrap();
    prompt.set_task("pick the café cup").unwrap();
    let mut tokens = [0i32; 200];
    let mut mask = [false; 200];
    let mut bins = [0i32; STATE_DIM];
    let mut total = 0;

    let before = ALLOCATIONS.with(Cell::get);
    for step in 0..1000u32 {
        for (i, bin) in bins.iter_mut().enumerate() {
            // A state sweeping -1.1..1.1 so every bin, both clamps and all digit counts occur.
            let phase = (step as usize * 7 + i * 31) % 221;
            *bin = discretize_state(phase as f32 / 100.0 - 1.1);
        }
        total += prompt.assemble(&bins, &mut tokens, &mut mask).unwrap();
    }
    let allocations = ALLOCATIONS.with(Cell::get) - before;

    assert_eq!(allocations, 0, "assemble allocated {allocations} times in 1000 calls");
    assert!(total > 1000 * 20, "prompts unexpectedly short: {total} tokens in total");
}
