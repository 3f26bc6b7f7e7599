//! `tokenizer.json` parsing and prompt tokenization on mutated files, with no checkpoint around
//! them: the `checkpoint` target reaches the same parser through a whole `Policy::open`, ~60
//! inputs a second over all its files; here each input is one tokenizer file. Pi0.5's prompt
//! tokenizer is built from it (which tokenizes and checks its bin pieces), given a task and asked
//! for a prompt; GR00T N1.7's is built and encodes a prompt with image pads. Each must return Ok
//! or Err, with every id it produces below the tokenizer's `vocab_size` (what `Policy::open`
//! checks against the token embedding's rows): a panic, abort, hang or runaway allocation, or an
//! id past it, is a finding.
//!
//! Input: the file's bytes.

#![no_main]

use flashrt::models::{groot_n17, pi05};
use libfuzzer_sys::fuzz_target;

/// The micro Pi0.5's prompt: 64 slots, 8 state bins.
const CAPACITY: usize = 64;
const BINS: [i32; 8] = [0, 255, 128, 7, 3, 200, 100, 50];

fuzz_target!(|data: &[u8]| {
    if let Ok(mut tokenizer) = pi05::prompt::PromptTokenizer::from_bytes(data, CAPACITY, BINS.len())
        && tokenizer.set_task("pick up the red block").is_ok()
    {
        let (mut tokens, mut mask) = ([0; CAPACITY], [false; CAPACITY]);
        if let Ok(n) = tokenizer.assemble(&BINS, &mut tokens, &mut mask) {
            assert!(n <= CAPACITY, "{n} tokens assembled into {CAPACITY} slots");
            assert!(tokens.iter().all(|&t| (0..tokenizer.vocab_size() as i32).contains(&t)), "a token id outside the vocabulary");
        }
    }
    if let Ok(tokenizer) = groot_n17::prompt::PromptTokenizer::from_bytes(data)
        && let Ok(ids) = tokenizer.encode("pick up the cup", 2, 4)
    {
        assert!(ids.iter().all(|&t| (0..tokenizer.vocab_size as i32).contains(&t)), "a token id outside the vocabulary");
    }
});
