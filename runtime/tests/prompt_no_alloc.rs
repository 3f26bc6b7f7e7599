//! `PromptTokenizer::assemble` is on the hot path: it must not touch the heap. This is its own
//! test binary so that the counting global allocator does not slow down or perturb other tests.

use std::path::Path;

use flashrt::models::pi05::prompt::{PromptTokenizer, discretize_state};

#[path = "../../tests/support/counting_alloc.rs"]
mod counting_alloc;

#[test]
fn assemble_does_not_allocate() {
    let (_, counted) = counting_alloc::count_this_thread(|| std::hint::black_box(Box::new(1u8)));
    assert_eq!(counted, 1, "the counting allocator counts");
    const STATE_DIM: usize = 14;
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tokenizer/tokenizer.json"));
    let mut prompt = PromptTokenizer::from_file(path, 200, STATE_DIM).unwrap();
    prompt.set_task("pick the café cup").unwrap();
    let mut tokens = [0i32; 200];
    let mut mask = [false; 200];
    let mut bins = [0i32; STATE_DIM];
    let mut total = 0;

    let ((), allocations) = counting_alloc::count_this_thread(|| {
        for step in 0..1000u32 {
            for (i, bin) in bins.iter_mut().enumerate() {
                // A state sweeping -1.1..1.1 so every bin, both clamps and all digit counts occur.
                let phase = (step as usize * 7 + i * 31) % 221;
                *bin = discretize_state(phase as f32 / 100.0 - 1.1);
            }
            total += prompt.assemble(&bins, &mut tokens, &mut mask).unwrap();
        }
    });

    assert_eq!(allocations, 0, "assemble allocated {allocations} times in 1000 calls");
    assert!(total > 1000 * 20, "prompts unexpectedly short: {total} tokens in total");
}
