//! The Pi0.5 prompt: `"Task: {task}, State: {b0} {b1} …;\nAction: "`, tokenized with BOS prepended,
//! right-padded with 0 and truncated at the prompt capacity (see `specs/pi05.md`, "Prompt text"
//! and "State").
//!
//! The state bins change every step, but tokenizing text allocates, so it cannot run on the hot
//! path. Instead the prompt is cut into pieces whose tokens are looked up per step:
//!
//! ```text
//! "Task: pick the cup, State:" | " 12" | " 7" | " 255;\nAction: "
//!  task prefix (set_task)        first  middle  last bin + tail
//! ```
//!
//! The cuts sit before each space: with Gemma-style vocabularies (SentencePiece with
//! `split_by_whitespace`, exported to HF JSON) no token holds an interior "▁", so no token crosses
//! a cut. No cut is made between the last bin and the tail, because vocabularies may merge digits
//! with what follows (the test vocabulary has "▁128;\nAction:"). Each piece's tokens are taken in
//! context, as the difference between tokenizing a prompt up to the piece and up to its end, and
//! the whole scheme is checked against tokenizing full prompts when loading and per task: a
//! tokenizer that breaks it is refused rather than silently producing different ids.

use std::path::Path;

use rand::{Rng, SeedableRng};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// Lowest and highest state bin; `discretize_state` maps every value into this range.
pub const BIN_MIN: i32 = -1;
pub const BIN_MAX: i32 = 255;
const NUM_BINS: usize = (BIN_MAX - BIN_MIN + 1) as usize;

/// Pi0.5's prompt capacity (`max_token_len`).
pub const DEFAULT_CAPACITY: usize = 200;

/// Id written after the last valid token (PaliGemma's `<pad>`, and what openpi pads with).
const PAD_ID: i32 = 0;
const BOS_TOKEN: &str = "<bos>";
const TAIL: &str = ";\nAction: ";

/// Pi0.5's state bin of one normalized state value, exactly
/// `np.digitize(x, np.linspace(-1, 1, 257)[:-1]) - 1`.
///
/// The bin edges are `-1 + k/128` (exact in binary), so the bin is `floor((x + 1) * 128)` clamped
/// to `-1..=255`. It is computed as `floor(x * 128) + 128` because `x * 128` is exact in f32
/// while `x + 1` rounds: `x = -1e-30` lies below the edge at 0 and must give 127, not 128. NaN is
/// rejected before discretization; it gives 255, as numpy (which sorts NaN last) does.
pub fn discretize_state(x: f32) -> i32 {
    if x.is_nan() {
        return BIN_MAX;
    }
    (x * 128.0).floor().clamp((BIN_MIN - 128) as f32, (BIN_MAX - 128) as f32) as i32 + 128
}

/// Writes caller-supplied token ids as the prompt, for callers that tokenize themselves: `tokens`
/// and `mask` (same length, the prompt capacity) get the ids, then padding. Returns the number of
/// valid tokens; at least one is required. Every id must index the embedding (`0..vocab_size`).
/// Nothing is written unless every id is valid. Does not allocate unless it fails.
pub fn raw_tokens(ids: &[i32], vocab_size: usize, tokens: &mut [i32], mask: &mut [bool]) -> Result<usize> {
    check_buffers(tokens.len(), tokens, mask)?;
    if ids.is_empty() || ids.len() > tokens.len() {
        return Err(Error::invalid("prompt_tokens", format!("{} tokens given; 1 to {} allowed", ids.len(), tokens.len())));
    }
    if let Some(i) = ids.iter().position(|&id| !usize::try_from(id).is_ok_and(|id| id < vocab_size)) {
        return Err(Error::invalid(
            format!("prompt_tokens[{i}]"),
            format!("token id {} is outside the vocabulary 0..{vocab_size}", ids[i]),
        ));
    }
    tokens[..ids.len()].copy_from_slice(ids);
    Ok(finish(tokens, mask, ids.len()))
}

/// Builds Pi0.5 prompts for one tokenizer, prompt capacity and number of state dims: the task is
/// tokenized once per `set_task`, the state bins are spliced in per step by `assemble`.
pub struct PromptTokenizer {
    tokenizer: Tokenizer,
    capacity: usize,
    state_dim: usize,
    vocab_size: usize,
    bos: i32,
    /// BOS and the tokens of `"Task: {task}, State:"` for the current task.
    task_ids: Vec<i32>,
    /// The length of `task_ids` for the empty task: what every prompt holds before the state.
    label_len: usize,
    /// Pieces of bin 0 (" {b}", or " {b};\nAction: " when it is also the last bin).
    first: BinPieces,
    /// Pieces of bins 1..state_dim-1 (" {b}"); empty when `state_dim < 3`.
    middle: BinPieces,
    /// Pieces of the last bin and the tail (" {b};\nAction: "); empty when `state_dim == 1`.
    last: BinPieces,
}

impl PromptTokenizer {
    /// Loads a Hugging Face `tokenizer.json`, pre-tokenizes the per-bin pieces and checks that
    /// assembling them reproduces the tokenizer on full prompts (see the module docs); the task
    /// is empty until `set_task`. Every tokenizer error names `path`.
    pub fn from_file(path: &Path, capacity: usize, state_dim: usize) -> Result<Self> {
        let json = std::fs::read(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Self::from_bytes(&json, capacity, state_dim).map_err(|e| match e {
            Error::Tokenizer(message) => Error::Tokenizer(format!("{}: {message}", path.display())),
            other => other,
        })
    }

    /// `from_file` for the file's contents.
    pub fn from_bytes(json: &[u8], capacity: usize, state_dim: usize) -> Result<Self> {
        if capacity == 0 {
            return Err(Error::invalid("prompt_capacity", "must be at least 1"));
        }
        if state_dim == 0 {
            return Err(Error::invalid("state_dim", "Pi0.5 prompts need at least one state dim"));
        }
        let mut tokenizer =
            crate::models::parse_tokenizer(json).map_err(|e| Error::Tokenizer(format!("cannot parse tokenizer JSON: {e}")))?;
        // A tokenizer.json may carry truncation or padding settings; pieces must be tokenized
        // whole, and the prompt is truncated and padded here.
        tokenizer.with_truncation(None).map_err(|e| Error::Tokenizer(format!("cannot disable truncation: {e}")))?;
        tokenizer.with_padding(None);

        let vocab_size = crate::models::id_end(&tokenizer).map_err(Error::Tokenizer)?;
        let bos =
            tokenizer.token_to_id(BOS_TOKEN).ok_or_else(|| Error::Tokenizer(format!("no {BOS_TOKEN} token in the vocabulary")))? as i32;

        // Pieces are taken in the context of a real prompt (the empty task, as set below); the
        // previous bin is "0" for positions after the first.
        let after_label = prompt_text("", &[]);
        let after_bin = prompt_text("", &[0]);
        let (first, middle, last) = if state_dim == 1 {
            (BinPieces::build(&tokenizer, &after_label, TAIL)?, BinPieces::default(), BinPieces::default())
        } else {
            let middle = if state_dim >= 3 { BinPieces::build(&tokenizer, &after_bin, "")? } else { BinPieces::default() };
            (BinPieces::build(&tokenizer, &after_label, "")?, middle, BinPieces::build(&tokenizer, &after_bin, TAIL)?)
        };

        let mut this =
            PromptTokenizer { tokenizer, capacity, state_dim, vocab_size, bos, task_ids: Vec::new(), label_len: 0, first, middle, last };
        this.task_ids = this.tokenize_task("")?;
        this.label_len = this.task_ids.len();
        for bins in verification_states(state_dim) {
            this.verify(&this.task_ids, "", &bins)?;
        }
        let needed = this.capacity_needed();
        if capacity < needed {
            return Err(Error::invalid(
                "prompt_capacity",
                format!(
                    "{capacity} tokens cannot hold BOS, \"Task: , State:\" and {state_dim} state bins with their tail \
                     (at least {needed} tokens with this tokenizer; Pi0.5 uses {DEFAULT_CAPACITY})"
                ),
            ));
        }
        Ok(this)
    }

    /// The number of token slots `assemble` fills.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The number of state bins `assemble` expects.
    pub fn state_dim(&self) -> usize {
        self.state_dim
    }

    /// One past the largest id, added tokens included; every id produced is below it.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Sets the task text (cleaned as the reference does: trimmed, `_` and newlines become
    /// spaces). Allocates; not for the hot path. Checks the assembly for this task against full
    /// tokenization on a few states; on error the previous task stays. The empty task is valid (the
    /// reference prompts `"Task: , State: …"`; `Policy::set_prompt` refuses it from users). A task
    /// longer than the capacity is accepted with a warning: the prompt is truncated, as the
    /// reference does.
    pub fn set_task(&mut self, task: &str) -> Result<()> {
        let cleaned = clean_task(task);
        let task_ids = self.tokenize_task(&cleaned)?;
        let n = self.state_dim;
        let spread: Vec<i32> = (0..n).map(|i| spread_bin(0, i)).collect();
        for bins in [vec![BIN_MIN; n], vec![BIN_MAX; n], spread] {
            self.verify(&task_ids, &cleaned, &bins)?;
        }
        let state = self.max_state_tokens();
        let longest = task_ids.len() + state;
        if longest > self.capacity {
            let survives = if task_ids.len() >= self.capacity { "no state token survives" } else { "the state tokens are cut too" };
            log::warn!(
                "prompt truncated: BOS + task {cleaned:?} take {} tokens and the state up to {state} more, over the prompt \
                 capacity {}; up to {} tokens are dropped and {survives} (raise prompt_capacity or shorten the task)",
                task_ids.len(),
                self.capacity,
                longest - self.capacity,
            );
        }
        self.task_ids = task_ids;
        Ok(())
    }

    /// The smallest prompt capacity this tokenizer accepts: BOS, `"Task: , State:"` and the
    /// longest state tokens, so that no state token is ever cut with an empty task.
    pub fn capacity_needed(&self) -> usize {
        self.label_len + self.max_state_tokens()
    }

    /// The most tokens the state bins and the tail take, over every bin value.
    fn max_state_tokens(&self) -> usize {
        let tables = std::iter::once(&self.first)
            .chain(std::iter::repeat_n(&self.middle, self.state_dim.saturating_sub(2)))
            .chain((self.state_dim > 1).then_some(&self.last));
        tables.map(BinPieces::max_len).sum()
    }

    /// Hot path, allocation-free unless it fails: writes the prompt for the current task and
    /// these state bins (`state_dim` of them, each in `-1..=255`) into `tokens` and `mask` (both
    /// `capacity` long): token ids then `PAD_ID`, `true` on valid tokens. Returns the number of
    /// valid tokens; the prompt is truncated at the capacity. Nothing is written on error.
    pub fn assemble(&self, bins: &[i32], tokens: &mut [i32], mask: &mut [bool]) -> Result<usize> {
        self.check_bins(bins)?;
        check_buffers(self.capacity, tokens, mask)?;
        let mut len = 0;
        for piece in self.pieces(&self.task_ids, bins) {
            let take = piece.len().min(self.capacity - len);
            tokens[len..len + take].copy_from_slice(&piece[..take]);
            len += take;
            if len == self.capacity {
                break;
            }
        }
        Ok(finish(tokens, mask, len))
    }

    fn check_bins(&self, bins: &[i32]) -> Result<()> {
        if bins.len() != self.state_dim {
            return Err(Error::invalid("state_bins", format!("{} bins given, the prompt has {} state dims", bins.len(), self.state_dim)));
        }
        if let Some(i) = bins.iter().position(|b| !(BIN_MIN..=BIN_MAX).contains(b)) {
            return Err(Error::invalid(format!("state_bins[{i}]"), format!("{} is outside {BIN_MIN}..={BIN_MAX}", bins[i])));
        }
        Ok(())
    }

    /// The prompt's pieces in order: BOS and task prefix, then one piece per bin.
    fn pieces<'a>(&'a self, task_ids: &'a [i32], bins: &'a [i32]) -> impl Iterator<Item = &'a [i32]> {
        let n = bins.len();
        std::iter::once(task_ids).chain(bins.iter().enumerate().map(move |(i, &bin)| {
            let table = if i == 0 {
                &self.first
            } else if i + 1 == n {
                &self.last
            } else {
                &self.middle
            };
            table.get(bin)
        }))
    }

    /// BOS and the tokens of the prompt up to the first bin.
    fn tokenize_task(&self, cleaned: &str) -> Result<Vec<i32>> {
        let mut ids = vec![self.bos];
        ids.extend(encode(&self.tokenizer, &prompt_text(cleaned, &[]))?);
        Ok(ids)
    }

    /// Checks that the assembled pieces equal BOS + the tokens of the full prompt.
    fn verify(&self, task_ids: &[i32], cleaned: &str, bins: &[i32]) -> Result<()> {
        let text = format!("{}{TAIL}", prompt_text(cleaned, bins));
        let mut expected = vec![self.bos];
        expected.extend(encode(&self.tokenizer, &text)?);
        let got: Vec<i32> = self.pieces(task_ids, bins).flatten().copied().collect();
        if got == expected {
            return Ok(());
        }
        let at = expected.iter().zip(&got).take_while(|(e, g)| e == g).count();
        Err(Error::Tokenizer(format!(
            "the prompt cannot be assembled piecewise for task {cleaned:?} and state bins {bins:?}: \
             tokenizing the full prompt {text:?} gives ids {expected:?}, the pieces give {got:?} \
             (first difference at token {at}); the tokenizer merges across a piece boundary (the \
             space before a state bin)"
        )))
    }
}

/// The token ids of one piece for every bin value, flat so that lookups only slice.
#[derive(Default)]
struct BinPieces {
    ids: Vec<i32>,
    /// The piece of bin `b` is `ids[starts[k]..starts[k + 1]]` with `k = b - BIN_MIN`.
    starts: Vec<usize>,
}

impl BinPieces {
    /// Tokenizes `" {bin}{suffix}"` for every bin, each as the continuation of `context`.
    fn build(tokenizer: &Tokenizer, context: &str, suffix: &str) -> Result<Self> {
        let context_ids = encode(tokenizer, context)?;
        let mut pieces = BinPieces { ids: Vec::new(), starts: Vec::with_capacity(NUM_BINS + 1) };
        pieces.starts.push(0);
        for bin in BIN_MIN..=BIN_MAX {
            let text = format!("{context} {bin}{suffix}");
            let ids = encode(tokenizer, &text)?;
            let piece = ids.strip_prefix(context_ids.as_slice()).ok_or_else(|| {
                Error::Tokenizer(format!(
                    "the prompt cannot be assembled piecewise: the tokens of {context:?} \
                     ({context_ids:?}) are not a prefix of the tokens of {text:?} ({ids:?}); the \
                     tokenizer merges across the space before a state bin"
                ))
            })?;
            pieces.ids.extend_from_slice(piece);
            pieces.starts.push(pieces.ids.len());
        }
        Ok(pieces)
    }

    fn max_len(&self) -> usize {
        self.starts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
    }

    fn get(&self, bin: i32) -> &[i32] {
        let k = (bin - BIN_MIN) as usize;
        &self.ids[self.starts[k]..self.starts[k + 1]]
    }
}

/// The full Pi0.5 prompt text for a task and state bins (what the tokenizer sees), e.g.
/// `"Task: pick up the cup, State: 12 7;\nAction: "`.
pub fn format_prompt(task: &str, bins: &[i32]) -> String {
    prompt_text(&clean_task(task), bins) + TAIL
}

/// Whether `task` holds no instruction once cleaned as the reference cleans it (empty, whitespace,
/// `_`, newlines and the separators Python's `strip` removes).
pub fn is_blank_task(task: &str) -> bool {
    clean_task(task).trim().is_empty()
}

/// The reference's `text.strip().replace("_", " ").replace("\n", " ")`. Python's `str.strip`
/// also strips U+001C..U+001F (information separators), which Rust's `trim` keeps.
fn clean_task(task: &str) -> String {
    task.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)).replace(['_', '\n'], " ")
}

/// The prompt up to the tail: `"Task: {cleaned}, State: {b0} {b1} …"`.
fn prompt_text(cleaned: &str, bins: &[i32]) -> String {
    let mut text = format!("Task: {cleaned}, State:");
    for bin in bins {
        text.push_str(&format!(" {bin}"));
    }
    text
}

/// Token ids of `text` without special tokens.
fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<i32>> {
    let encoding = tokenizer.encode_fast(text, false).map_err(|e| Error::Tokenizer(format!("cannot tokenize {text:?}: {e}")))?;
    // Ids fit i32: the vocabulary size was checked at load.
    Ok(encoding.get_ids().iter().map(|&id| id as i32).collect())
}

/// States checked at load: every bin value at every position (neighbours varying), the extremes,
/// and seeded random states for more neighbour pairs.
fn verification_states(state_dim: usize) -> Vec<Vec<i32>> {
    let mut states: Vec<Vec<i32>> = (0..NUM_BINS).map(|k| (0..state_dim).map(|i| spread_bin(k, i)).collect()).collect();
    states.push(vec![BIN_MIN; state_dim]);
    states.push(vec![BIN_MAX; state_dim]);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed);
    states.extend((0..64).map(|_| (0..state_dim).map(|_| rng.random_range(BIN_MIN..=BIN_MAX)).collect()));
    states
}

/// Bin at position `i` of the `k`-th state of a set where, over `k` in `0..NUM_BINS`, each position
/// takes every bin value once. The stride (coprime to 257) makes neighbouring bins differ.
fn spread_bin(k: usize, i: usize) -> i32 {
    ((k + 37 * i) % NUM_BINS) as i32 + BIN_MIN
}

fn check_buffers(capacity: usize, tokens: &[i32], mask: &[bool]) -> Result<()> {
    for (field, len) in [("token_buffer", tokens.len()), ("mask_buffer", mask.len())] {
        if len != capacity {
            return Err(Error::invalid(field, format!("length {len}, expected the prompt capacity {capacity}")));
        }
    }
    Ok(())
}

/// Pads after the first `len` tokens and writes the mask; returns `len`.
fn finish(tokens: &mut [i32], mask: &mut [bool], len: usize) -> usize {
    tokens[len..].fill(PAD_ID);
    mask[..len].fill(true);
    mask[len..].fill(false);
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use serde_json::Value;

    const TOKENIZER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tokenizer/tokenizer.json");
    const EXPECTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/tokenizer/expected.json");

    fn load(capacity: usize, state_dim: usize) -> PromptTokenizer {
        PromptTokenizer::from_file(Path::new(TOKENIZER), capacity, state_dim).unwrap()
    }

    /// Runs `assemble` into fresh buffers of the tokenizer's capacity.
    fn assemble(prompt: &PromptTokenizer, bins: &[i32]) -> (Vec<i32>, Vec<bool>, usize) {
        let mut tokens = vec![-7; prompt.capacity()];
        let mut mask = vec![false; prompt.capacity()];
        let len = prompt.assemble(bins, &mut tokens, &mut mask).unwrap();
        (tokens, mask, len)
    }

    fn ids(value: &Value) -> Vec<i32> {
        value.as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect()
    }

    fn tokenizer_json() -> Value {
        serde_json::from_slice(&std::fs::read(TOKENIZER).unwrap()).unwrap()
    }

    fn expect_tokenizer_error<T>(result: Result<T>) -> String {
        match result {
            Err(Error::Tokenizer(message)) => message,
            Err(other) => panic!("expected Error::Tokenizer, got {other}"),
            Ok(_) => panic!("expected Error::Tokenizer, got Ok"),
        }
    }

    fn expect_invalid<T>(result: Result<T>, expected_field: &str) {
        match result {
            Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, expected_field),
            Err(other) => panic!("expected InvalidArgument({expected_field}), got {other}"),
            Ok(_) => panic!("expected InvalidArgument({expected_field}), got Ok"),
        }
    }

    #[test]
    fn discretize_matches_numpy() {
        // (f32 bits, bin) from numpy 2.4 on float32 inputs:
        //   np.digitize(x, np.linspace(-1, 1, 257)[:-1]) - 1
        // Edges, their f32 neighbours, signed zeros, subnormals, infinities and NaN.
        let table: [(u32, i32); 29] = [
            (0xff800000, -1),  // -inf
            (0xff7fc99e, -1),  // -3.4e38
            (0xc0000000, -1),  // -2.0
            (0xbf800001, -1),  // -1.0000001
            (0xbf800000, 0),   // -1.0
            (0xbf7fffff, 0),   // -0.99999994
            (0xbf7e0000, 1),   // -0.9921875 (edge 1)
            (0xbf7e0001, 0),   // -0.99218756
            (0xbf000000, 64),  // -0.5
            (0xbc000000, 127), // -0.0078125 (edge 127)
            (0xbc000001, 126), // -0.007812501
            (0x8da24260, 127), // -1e-30
            (0x80000001, 127), // -1e-45 (subnormal)
            (0x80000000, 128), // -0.0
            (0x00000000, 128), // 0.0
            (0x00000001, 128), // 1e-45 (subnormal)
            (0x0da24260, 128), // 1e-30
            (0x3c000000, 129), // 0.0078125 (edge 129)
            (0x3bffffff, 128), // 0.0078124995
            (0x3f000000, 192), // 0.5
            (0x3f7e0000, 255), // 0.9921875 (edge 255)
            (0x3f7dffff, 254), // 0.99218744
            (0x3f7fffff, 255), // 0.99999994
            (0x3f800000, 255), // 1.0
            (0x3f800001, 255), // 1.0000001
            (0x40000000, 255), // 2.0
            (0x7f7fc99e, 255), // 3.4e38
            (0x7f800000, 255), // inf
            (0x7fc00000, 255), // NaN
        ];
        for (bits, bin) in table {
            let x = f32::from_bits(bits);
            assert_eq!(discretize_state(x), bin, "x = {x:e} ({bits:#010x})");
        }
        // Every edge -1 + k/128 starts bin k.
        for k in 0..256 {
            let edge = -1.0 + k as f32 / 128.0;
            assert_eq!(discretize_state(edge), k, "edge {k}");
            // The next f32 below the edge (`f32::next_down` is newer than the MSRV).
            let below = match edge {
                0.0 => -f32::from_bits(1),
                e if e > 0.0 => f32::from_bits(e.to_bits() - 1),
                e => f32::from_bits(e.to_bits() + 1),
            };
            assert_eq!(discretize_state(below), k - 1, "below edge {k}");
        }
    }

    #[test]
    fn matches_python_goldens() {
        let expected: Value = serde_json::from_slice(&std::fs::read(EXPECTED).unwrap()).unwrap();
        assert_eq!(expected["prompt_len"], DEFAULT_CAPACITY);
        let cases = expected["cases"].as_array().unwrap();
        assert!(cases.len() >= 8);
        for case in cases {
            let task = case["task"].as_str().unwrap();
            let bins = ids(&case["state_bins"]);
            let full = ids(&case["ids"]);
            let text = format_prompt(task, &bins);
            assert_eq!(text, case["prompt"].as_str().unwrap(), "prompt text of task {task:?}");

            // Padded and truncated to 200, as lerobot's tokenizer step does.
            let mut prompt = load(DEFAULT_CAPACITY, bins.len());
            prompt.set_task(task).unwrap();
            let (tokens, mask, len) = assemble(&prompt, &bins);
            let padded_mask: Vec<bool> = case["padded_mask"].as_array().unwrap().iter().map(|m| m.as_i64() == Some(1)).collect();
            assert_eq!(tokens, ids(&case["padded_ids"]), "ids of {text:?}");
            assert_eq!(mask, padded_mask, "mask of {text:?}");
            assert_eq!(len, full.len().min(DEFAULT_CAPACITY), "length of {text:?}");

            // Untruncated.
            let mut prompt = load(full.len() + 3, bins.len());
            prompt.set_task(task).unwrap();
            let (tokens, _, len) = assemble(&prompt, &bins);
            assert_eq!((&tokens[..len], len), (full.as_slice(), full.len()), "ids of {text:?}");
        }
    }

    #[test]
    fn assembly_matches_full_tokenization() {
        let reference = Tokenizer::from_file(TOKENIZER).unwrap();
        let words = [
            "pick",
            "up",
            "the",
            "red",
            "block",
            "café",
            "Zoë",
            "🤖",
            "put_it",
            "in",
            "sink",
            "12",
            "7;",
            "\n",
            "State:",
            "Action:",
            "-1",
            "",
            "  ",
            "drawer,",
            "ünïcödé",
            "x",
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for state_dim in [1, 2, 3, 8, 32] {
            let mut prompt = load(512, state_dim);
            for _ in 0..12 {
                let n_words = rng.random_range(0..12);
                let task: Vec<&str> = (0..n_words).map(|_| words[rng.random_range(0..words.len())]).collect();
                let task = task.join(" ");
                prompt.set_task(&task).unwrap();
                for _ in 0..30 {
                    let bins: Vec<i32> = (0..state_dim)
                        .map(|_| match rng.random_range(0..4) {
                            0 => discretize_state(rng.random_range(-1.2..1.2)),
                            1 => [BIN_MIN, 0, 9, 10, 99, 100, BIN_MAX][rng.random_range(0..7)],
                            _ => rng.random_range(BIN_MIN..=BIN_MAX),
                        })
                        .collect();
                    let text = format_prompt(&task, &bins);
                    let full: Vec<i32> = reference.encode(text.as_str(), true).unwrap().get_ids().iter().map(|&id| id as i32).collect();
                    let (tokens, mask, len) = assemble(&prompt, &bins);
                    assert_eq!(&tokens[..len], full.as_slice(), "{text:?}");
                    assert!(tokens[len..].iter().all(|&t| t == PAD_ID));
                    assert!(mask[..len].iter().all(|&m| m) && !mask[len..].iter().any(|&m| m));
                }
            }
        }
    }

    #[test]
    fn truncates_at_capacity() {
        let task = "pick up the red block and put it in the drawer, then close the drawer";
        let bins = [3, 200, -1];
        let mut full_prompt = load(256, bins.len());
        full_prompt.set_task(task).unwrap();
        let (full, _, full_len) = assemble(&full_prompt, &bins);
        let smallest = load(256, bins.len()).capacity_needed();
        assert!(full_len > smallest + 4);

        // Cut inside the task, and exactly at the end of the prompt.
        for capacity in [smallest + 4, full_len] {
            let mut prompt = load(capacity, bins.len());
            prompt.set_task(task).unwrap();
            let (tokens, mask, len) = assemble(&prompt, &bins);
            assert_eq!(len, capacity);
            assert_eq!(tokens, &full[..capacity]);
            assert!(mask.iter().all(|&m| m));
        }
    }

    #[test]
    fn bad_tokenizer_files_name_the_path() {
        let missing = Path::new("/nonexistent/tokenizer.json");
        let Err(error @ Error::Io { .. }) = PromptTokenizer::from_file(missing, 200, 8) else {
            panic!("an unreadable file is an I/O error");
        };
        assert!(error.to_string().contains("/nonexistent/tokenizer.json"), "{error}");

        let dir = tempfile::tempdir().unwrap();
        let corrupt = dir.path().join("tokenizer.json");
        std::fs::write(&corrupt, b"{\"model\": ").unwrap();
        let message = expect_tokenizer_error(PromptTokenizer::from_file(&corrupt, 200, 8));
        assert!(message.contains(&corrupt.display().to_string()), "{message}");

        expect_tokenizer_error(PromptTokenizer::from_bytes(b"not json", 200, 8));
        let no_bos = std::fs::read_to_string(TOKENIZER).unwrap().replace("<bos>", "<start>");
        let message = expect_tokenizer_error(PromptTokenizer::from_bytes(no_bos.as_bytes(), 200, 8));
        assert!(message.contains("<bos>"), "{message}");
    }

    #[test]
    fn rejects_bad_sizes_and_bins() {
        let json = std::fs::read(TOKENIZER).unwrap();
        expect_invalid(PromptTokenizer::from_bytes(&json, 0, 8), "prompt_capacity");
        // "Fits" means BOS, the label and the longest state tokens with an empty task.
        let needed = load(256, 8).capacity_needed();
        assert!(needed > 1 + 8, "BOS, label and at least one token per bin: {needed}");
        expect_invalid(PromptTokenizer::from_bytes(&json, needed - 1, 8), "prompt_capacity");
        PromptTokenizer::from_bytes(&json, needed, 8).unwrap();
        expect_invalid(PromptTokenizer::from_bytes(&json, 200, 0), "state_dim");

        let prompt = load(32, 3);
        let mut tokens = [5; 32];
        let mut mask = [true; 32];
        expect_invalid(prompt.assemble(&[1, 2], &mut tokens, &mut mask), "state_bins");
        expect_invalid(prompt.assemble(&[1, 256, 2], &mut tokens, &mut mask), "state_bins[1]");
        expect_invalid(prompt.assemble(&[-2, 0, 2], &mut tokens, &mut mask), "state_bins[0]");
        expect_invalid(prompt.assemble(&[1, 2, 3], &mut tokens[..31], &mut mask), "token_buffer");
        expect_invalid(prompt.assemble(&[1, 2, 3], &mut tokens, &mut [false; 33]), "mask_buffer");
        assert_eq!((tokens, mask), ([5; 32], [true; 32]), "outputs written on error");
    }

    #[test]
    fn can_be_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<PromptTokenizer>();
    }

    #[test]
    fn raw_token_ids_are_validated() {
        let mut tokens = [9; 6];
        let mut mask = [false; 6];
        assert_eq!(raw_tokens(&[2, 17, 1023], 1024, &mut tokens, &mut mask).unwrap(), 3);
        assert_eq!(tokens, [2, 17, 1023, PAD_ID, PAD_ID, PAD_ID]);
        assert_eq!(mask, [true, true, true, false, false, false]);

        expect_invalid(raw_tokens(&[2, 1024], 1024, &mut tokens, &mut mask), "prompt_tokens[1]");
        expect_invalid(raw_tokens(&[-1], 1024, &mut tokens, &mut mask), "prompt_tokens[0]");
        expect_invalid(raw_tokens(&[1; 7], 1024, &mut tokens, &mut mask), "prompt_tokens");
        expect_invalid(raw_tokens(&[1], 1024, &mut tokens, &mut [false; 5]), "mask_buffer");
    }

    /// Puts `left + right` first in the merge list (applied before any other merge) and adds the
    /// merged token to the vocabulary.
    fn with_merge(left: &str, right: &str) -> Vec<u8> {
        let mut json = tokenizer_json();
        let model = &mut json["model"];
        let merged = format!("{left}{right}");
        let next_id = model["vocab"].as_object().unwrap().len();
        model["vocab"][merged.as_str()] = next_id.into();
        model["merges"].as_array_mut().unwrap().insert(0, serde_json::json!([left, right]));
        serde_json::to_vec(&json).unwrap()
    }

    #[test]
    fn vocab_size_is_one_past_the_largest_id_when_ids_skip_numbers() {
        let mut json = tokenizer_json();
        let vocab = json["model"]["vocab"].as_object_mut().unwrap();
        let dropped: Vec<String> =
            vocab.iter().filter(|(_, id)| (600..1000).contains(&id.as_u64().unwrap())).map(|(t, _)| t.clone()).collect();
        for token in &dropped {
            vocab.remove(token);
        }
        assert_eq!(vocab.len(), 624);
        json["model"]["merges"] = serde_json::json!([]);
        let mut prompt = PromptTokenizer::from_bytes(&serde_json::to_vec(&json).unwrap(), 64, 8).unwrap();
        assert_eq!(prompt.vocab_size(), 1024);
        prompt.set_task("pick up the red block").unwrap();
        let (tokens, _, _) = assemble(&prompt, &[0, 255, 128, 7, 3, 200, 100, 50]);
        assert!(tokens.iter().all(|&id| (0..1024).contains(&id)), "{tokens:?}");
    }

    #[test]
    fn refuses_tokenizers_that_merge_across_pieces() {
        // "7▁" joins a bin ending in 7 with the space before the next bin: pieces derive fine
        // (their context's previous bin is 0), but full prompts differ. With one state dim no
        // space follows a bin, so the same tokenizer is fine.
        let json = with_merge("7", "▁");
        let message = expect_tokenizer_error(PromptTokenizer::from_bytes(&json, 200, 4));
        assert!(message.contains("state bins [") && message.contains("first difference"), "{message}");
        let single = PromptTokenizer::from_bytes(&json, 200, 1).unwrap();
        let (tokens, _, len) = assemble(&single, &[17]);
        let reference = Tokenizer::from_bytes(&json).unwrap();
        let full = reference.encode("Task: , State: 17;\nAction: ", true).unwrap();
        assert_eq!(&tokens[..len], full.get_ids().iter().map(|&id| id as i32).collect::<Vec<_>>());

        // ":▁" joins the "State:" label with the space before the first bin: no piece boundary.
        let json = with_merge(":", "▁");
        let message = expect_tokenizer_error(PromptTokenizer::from_bytes(&json, 200, 4));
        assert!(message.contains("not a prefix"), "{message}");
    }
}
