//! Hugging Face `tokenizer.json` parsing, around three faults of tokenizers 0.23 that the
//! `checkpoint` fuzz target found (the first two kept in tests/data/fuzz/, the third in
//! tests/fuzz_regressions.rs's memory test):
//! - it panics instead of failing when the `decoder` value is not well-formed JSON (a file cut
//!   off after `"decoder":`, a lone surrogate escape): the text is checked as JSON first, and
//!   well-formed JSON cannot reach that panic (the decoder helper takes any JSON value);
//! - its BPE builder copies each merge's two parts into a buffer as long as the longest vocabulary
//!   token, and panics when a merge is longer (or its second part shorter than the
//!   `continuing_subword_prefix` it strips): [`check_bpe_merges`] refuses those merges by name.
//!   Its typed parse cannot stand in for the well-formedness check: serde_json skips the fields
//!   it ignores without checking their escapes. The two checks are two parses at open before
//!   tokenizers' own (tens of ms each for an 11 MB Qwen tokenizer), none on the hot path;
//! - a BPE model caches the words it merged in a thread-local map that outlives the model: every
//!   open leaked the words tokenized at load and by `set_prompt` (1.6 MB per open of the micro
//!   Pi0.5, without bound over opens). The cache is switched off: prompts are tokenized once per
//!   task, never on the hot path.

use std::collections::HashMap;

use serde::Deserialize;

/// Parses `tokenizer.json` text; the error names what is wrong.
pub(crate) fn parse_tokenizer(json: &[u8]) -> Result<tokenizers::Tokenizer, String> {
    serde_json::from_slice::<serde_json::Value>(json).map_err(|e| format!("not well-formed JSON: {e}"))?;
    check_bpe_merges(json)?;
    let mut tokenizer = tokenizers::Tokenizer::from_bytes(json).map_err(|e| e.to_string())?;
    let mut model = tokenizer.get_model().clone();
    model.resize_cache(0);
    tokenizer.with_model(model);
    Ok(tokenizer)
}

/// One past the largest id `tokenizer` can produce, added tokens included: not the count of
/// tokens, since a vocabulary may skip ids (the tokenizer fuzz target found one that did).
pub(crate) fn id_end(tokenizer: &tokenizers::Tokenizer) -> Result<usize, String> {
    let end = tokenizer.get_vocab(true).into_values().max().map_or(0, |id| id as usize + 1);
    if i32::try_from(end).is_err() {
        return Err(format!("token ids up to {} do not fit i32", end - 1));
    }
    Ok(end)
}

/// Refuses a tokenizer whose ids reach past the checkpoint's token embedding: it belongs to
/// another model, and its prompts would read rows that do not exist (the embedding op clamps an
/// id to the last row rather than read out of bounds, so nothing would say so).
pub(crate) fn check_ids_fit_embedding(path: &std::path::Path, id_end: usize, embedding: &str, rows: usize) -> crate::error::Result<()> {
    if id_end > rows {
        return Err(crate::error::Error::Tokenizer(format!(
            "{}: its token ids go up to {}, but the checkpoint's token embedding {embedding} has {rows} rows \
             (a tokenizer of another model?)",
            path.display(),
            id_end - 1
        )));
    }
    Ok(())
}

/// The part of `tokenizer.json` the merge check reads. Typed (not a `serde_json::Value`) so that
/// a repeated key is refused: tokenizers keeps a repeated key's last non-null value, a `Value`
/// its last value, and the check must see what the builder sees.
#[derive(Deserialize)]
struct TokenizerFile {
    model: Option<ModelFields>,
}

#[derive(Deserialize)]
struct ModelFields {
    #[serde(rename = "type")]
    kind: Option<String>,
    vocab: Option<serde_json::Value>,
    merges: Option<serde_json::Value>,
    continuing_subword_prefix: Option<String>,
}

/// The two forms tokenizers reads `merges` in: pairs, or "a b" lines.
#[derive(Deserialize)]
#[serde(untagged)]
enum Merges {
    Pairs(Vec<(String, String)>),
    Lines(Vec<String>),
}

/// Refuses a BPE model's merge that tokenizers' builder would panic on rather than report.
/// A model that is not BPE, or fields of a type tokenizers refuses itself, pass through to its
/// own error.
fn check_bpe_merges(json: &[u8]) -> Result<(), String> {
    let file: TokenizerFile = serde_json::from_slice(json).map_err(|e| format!("bad model: {e}"))?;
    let Some(ModelFields { kind, vocab: Some(vocab), merges: Some(merges), continuing_subword_prefix }) = file.model else {
        return Ok(());
    };
    if kind.is_some_and(|kind| kind != "BPE") {
        return Ok(());
    }
    let (Ok(vocab), Ok(merges)) = (HashMap::<String, u32>::deserialize(vocab), Merges::deserialize(merges)) else {
        return Ok(());
    };
    let pairs: Vec<(&str, &str)> = match &merges {
        Merges::Pairs(pairs) => pairs.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect(),
        Merges::Lines(lines) => lines.iter().filter(|l| !l.starts_with("#version")).filter_map(|l| l.split_once(' ')).collect(),
    };
    let longest = vocab.keys().map(String::len).max().unwrap_or(0);
    let prefix = continuing_subword_prefix.as_deref().unwrap_or("");
    for (rank, (a, b)) in pairs.into_iter().enumerate() {
        if !vocab.contains_key(a) || !vocab.contains_key(b) {
            continue; // tokenizers reports a part missing from the vocabulary
        }
        if !b.is_char_boundary(prefix.len()) {
            return Err(format!(
                "BPE merge {rank} ({a:?} {b:?}): its second part does not begin with a whole continuing_subword_prefix {prefix:?}"
            ));
        }
        if a.len() + b.len() - prefix.len() > longest {
            return Err(format!("BPE merge {rank} ({a:?} {b:?}) makes a token longer than any in the vocabulary ({longest} bytes)"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<tokenizers::Tokenizer, String> {
        parse_tokenizer(json.as_bytes())
    }

    #[test]
    fn merges_the_builder_would_panic_on_are_refused_by_name() {
        let too_long = r#"{"model":{"type":"BPE","vocab":{"bb":0},"merges":[["bb","bb"]]}}"#;
        assert!(parse(too_long).unwrap_err().contains(r#"merge 0 ("bb" "bb") makes a token longer"#));
        let as_lines = r##"{"model":{"vocab":{"a":0,"bb":1},"merges":["#version 0.2","a a","a bb"]}}"##;
        assert!(parse(as_lines).unwrap_err().contains(r#"merge 1 ("a" "bb")"#));
        let short_of_prefix =
            r####"{"model":{"type":"BPE","continuing_subword_prefix":"###","vocab":{"a":0,"bb":1,"abbb":2},"merges":[["a","bb"]]}}"####;
        assert!(parse(short_of_prefix).unwrap_err().contains("continuing_subword_prefix"));
        let splits_a_character =
            r##"{"model":{"type":"BPE","continuing_subword_prefix":"#","vocab":{"a":0,"é":1,"aé":2},"merges":[["a","é"]]}}"##;
        assert!(parse(splits_a_character).unwrap_err().contains("continuing_subword_prefix"));
        let repeated_key = r#"{"model":{"type":"BPE","vocab":{"ab":0},"vocab":{"a":0},"merges":[]}}"#;
        assert!(parse(repeated_key).unwrap_err().contains("duplicate field `vocab`"));
    }

    #[test]
    fn well_formed_merges_build() {
        let tokenizer = parse(r#"{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}"#).unwrap();
        assert_eq!(tokenizer.encode("ab", false).unwrap().get_ids(), [2]);
        let prefixed =
            r###"{"model":{"type":"BPE","continuing_subword_prefix":"##","vocab":{"a":0,"##b":1,"ab":2},"merges":[["a","##b"]]}}"###;
        parse(prefixed).unwrap();
        let missing_part = r#"{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","zz"]]}}"#;
        assert!(parse(missing_part).unwrap_err().contains("zz"), "tokenizers' own error");
    }
}
