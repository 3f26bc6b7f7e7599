//! GR00T N1.7's prompt: one user turn of the Qwen3-VL chat template, the images first,
//!
//! ```text
//! <|im_start|>user\n (<|vision_start|> <|image_pad|>×n <|vision_end|>)×images {language}<|im_end|>\n
//! ```
//!
//! with `n` the image's tokens after the 2×2 merge (64 for 256²). The language is the task text
//! "formalized" as lerobot does (`prepare_n1_7_language_batch`). No state enters the prompt, so
//! it is tokenized once per task, off the hot path.

use std::path::Path;

use tokenizers::Tokenizer;

use crate::error::{Error, Result};

pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";
pub const VISION_START: &str = "<|vision_start|>";
pub const VISION_END: &str = "<|vision_end|>";
pub const IMAGE_PAD: &str = "<|image_pad|>";
/// What lerobot substitutes for an empty task.
pub const DEFAULT_TASK: &str = "Perform the task.";

/// The task text as the model was trained on it: empty becomes [`DEFAULT_TASK`]; when
/// `formalize` (processor_config.json `formalize_language`, default on), lowercased with only
/// letters, digits, whitespace and `_` kept (Python's `isalnum`/`isspace`, which also count
/// U+001C..U+001F as space).
pub fn language(task: &str, formalize: bool) -> String {
    let text = if task.is_empty() { DEFAULT_TASK } else { task };
    if !formalize {
        return text.to_string();
    }
    let space = |c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c);
    text.to_lowercase().chars().filter(|&c| c.is_alphanumeric() || space(c) || c == '_').collect()
}

/// The chat text of one user turn: `images` image blocks of `tokens_per_image` pads, then the
/// language.
pub fn chat_text(language: &str, images: usize, tokens_per_image: usize) -> String {
    let block = format!("{VISION_START}{}{VISION_END}", IMAGE_PAD.repeat(tokens_per_image));
    format!("{IM_START}user\n{}{language}{IM_END}\n", block.repeat(images))
}

/// A Qwen tokenizer with the Qwen-VL special tokens.
pub struct PromptTokenizer {
    tokenizer: Tokenizer,
    /// Id of `<|image_pad|>`, the slots the image embeddings are written into.
    pub image_pad: i32,
    /// One past the largest id, added tokens included; every id `encode` produces is below it.
    pub vocab_size: usize,
}

impl PromptTokenizer {
    /// Loads a Hugging Face `tokenizer.json`; one without the vision tokens is refused, naming them.
    /// Every tokenizer error names `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let json = std::fs::read(path).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        Self::from_bytes(&json).map_err(|e| match e {
            Error::Tokenizer(message) => Error::Tokenizer(format!("{}: {message}", path.display())),
            other => other,
        })
    }

    /// `from_file` for the file's contents.
    pub fn from_bytes(json: &[u8]) -> Result<Self> {
        let tokenizer = crate::models::parse_tokenizer(json).map_err(Error::Tokenizer)?;
        let missing: Vec<&str> =
            [IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD].into_iter().filter(|t| tokenizer.token_to_id(t).is_none()).collect();
        if !missing.is_empty() {
            return Err(Error::Tokenizer(format!(
                "not a Qwen-VL tokenizer, it lacks {} (GR00T N1.7 needs the vision tokens)",
                missing.join(", ")
            )));
        }
        let image_pad = tokenizer.token_to_id(IMAGE_PAD).expect("checked above") as i32;
        let vocab_size = crate::models::id_end(&tokenizer).map_err(Error::Tokenizer)?;
        Ok(PromptTokenizer { tokenizer, image_pad, vocab_size })
    }

    /// The token ids of the prompt for `language` and `images` images of `tokens_per_image`
    /// tokens each. Fails if the tokenizer does not keep each pad a single token.
    pub fn encode(&self, language: &str, images: usize, tokens_per_image: usize) -> Result<Vec<i32>> {
        let text = chat_text(language, images, tokens_per_image);
        let encoding = self.tokenizer.encode(text.as_str(), false).map_err(|e| Error::Tokenizer(format!("tokenizing the prompt: {e}")))?;
        let ids: Vec<i32> = encoding.get_ids().iter().map(|&id| id as i32).collect();
        let pads = ids.iter().filter(|&&id| id == self.image_pad).count();
        if pads != images * tokens_per_image {
            return Err(Error::Tokenizer(format!(
                "the prompt holds {pads} {IMAGE_PAD} tokens, expected {images} images x {tokens_per_image}"
            )));
        }
        Ok(ids)
    }
}
