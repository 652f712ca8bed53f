//! The eval text as the models see it: tokenized once with the reference's `tokenizer.json`, BOS
//! applied as disclosed, cut into non-overlapping windows (a trailing partial window is dropped
//! and counted; `per_window` BOS replaces each window's first token, as llama.cpp does).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::digest::hex;
use crate::error::{Error, Result};

/// Eval texts above this size are refused rather than tokenized into memory.
pub const MAX_EVAL_TEXT_BYTES: u64 = 512 * 1024 * 1024;

pub use crate::kld::protocol::Bos;

/// A loaded `tokenizer.json` and what identifies it.
pub struct TokenizerFile {
    pub path: PathBuf,
    pub tokenizer: tokenizers::Tokenizer,
    pub sha256: String,
    /// Tokens the tokenizer knows, added tokens included: logit entries beyond are padding.
    pub vocab_size: usize,
    pub bos_id: Option<u32>,
    /// SHA-256 of each part that decides how text becomes ids ([`TOKENIZING_PARTS`]), in
    /// canonical JSON: two files that differ only in formatting or unused parts agree here.
    pub parts_sha256: Vec<(&'static str, String)>,
}

/// The parts of a `tokenizer.json` that decide the ids of a text tokenized without special
/// tokens (the post-processor and decoder do not).
pub const TOKENIZING_PARTS: &[&str] = &["normalizer", "pre_tokenizer", "model", "added_tokens"];

/// Digests of [`TOKENIZING_PARTS`]: canonical JSON, merges in one spelling (`["a", "b"]`; the
/// older `"a b"` splits at its one space), added tokens ordered by id.
fn parts_sha256(path: &Path, bytes: &[u8]) -> Result<Vec<(&'static str, String)>> {
    let mut json: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::tokenizer(path, None, format!("not valid JSON: {e}")))?;
    if let Some(merges) = json
        .pointer_mut("/model/merges")
        .and_then(serde_json::Value::as_array_mut)
    {
        for m in merges.iter_mut() {
            if let Some((a, b)) = m.as_str().and_then(|t| t.split_once(' ')) {
                *m = serde_json::json!([a, b]);
            }
        }
    }
    if let Some(added) = json
        .get_mut("added_tokens")
        .and_then(serde_json::Value::as_array_mut)
    {
        added.sort_by_key(|t| t.get("id").and_then(serde_json::Value::as_u64));
    }
    Ok(TOKENIZING_PARTS
        .iter()
        .map(|&part| {
            let value = json.get(part).unwrap_or(&serde_json::Value::Null);
            (part, crate::kld::protocol::sha256_of(value))
        })
        .collect())
}

/// Where a model's tokenizer lives: `tokenizer.json` in the model directory (or beside a GGUF file).
pub fn tokenizer_path(model: &Path) -> PathBuf {
    let dir = if model.is_file() {
        model.parent().unwrap_or(Path::new("."))
    } else {
        model
    };
    dir.join("tokenizer.json")
}

/// Load a tokenizer; the BOS token comes from `tokenizer_config.json` (`bos_token`) or
/// `config.json` (`bos_token_id`) beside it.
pub fn load_tokenizer(path: &Path) -> Result<TokenizerFile> {
    let bytes =
        crate::files::read_capped(path, crate::files::MAX_TOKENIZER_BYTES, "a tokenizer.json")?;
    let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
        Error::tokenizer(
            path,
            None,
            format!("not a Hugging Face tokenizer.json: {e}"),
        )
    })?;
    let sha256 = hex(&Sha256::digest(&bytes));
    let parts_sha256 = parts_sha256(path, &bytes)?;
    let vocab_size = tokenizer.get_vocab_size(true);
    let dir = path.parent().unwrap_or(Path::new("."));
    let bos_id = bos_from_configs(dir, &tokenizer)?;
    Ok(TokenizerFile {
        path: path.to_owned(),
        tokenizer,
        sha256,
        vocab_size,
        bos_id,
        parts_sha256,
    })
}

/// A config that cannot be read (over the cap, a FIFO) is an error; one that is not JSON says
/// nothing about BOS, as before.
fn bos_from_configs(dir: &Path, tokenizer: &tokenizers::Tokenizer) -> Result<Option<u32>> {
    let read = |name: &str| -> Result<Option<serde_json::Value>> {
        let bytes = crate::files::read_capped_if_present(
            &dir.join(name),
            crate::files::MAX_CONFIG_BYTES,
            "a config",
        )?;
        Ok(bytes.and_then(|b| serde_json::from_slice(&b).ok()))
    };
    if let Some(cfg) = read("tokenizer_config.json")? {
        let token = match cfg.get("bos_token") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Object(o)) => {
                o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
            }
            _ => None,
        };
        if let Some(token) = token
            && let Some(id) = tokenizer.token_to_id(&token)
        {
            return Ok(Some(id));
        }
    }
    Ok(read("config.json")?
        .and_then(|c| c.get("bos_token_id")?.as_u64())
        .and_then(|id| u32::try_from(id).ok()))
}

/// Reference and candidate must tokenize alike: the same file, or files whose every tokenizing
/// part ([`TOKENIZING_PARTS`]) is the same. The same vocabulary is not enough: another
/// normalizer or other merges give other ids for the same text.
pub fn check_same_tokenizer(reference: &TokenizerFile, candidate: &TokenizerFile) -> Result<()> {
    let differs = |what: String| {
        Error::mismatch(
            &candidate.path,
            None,
            format!(
                "tokenizer differs from the reference's {}: {what}",
                reference.path.display()
            ),
        )
    };
    if reference.sha256 != candidate.sha256 {
        let a = reference.tokenizer.get_vocab(true);
        let b = candidate.tokenizer.get_vocab(true);
        if a.len() != b.len() {
            return Err(differs(format!("{} tokens vs {}", b.len(), a.len())));
        }
        let mut differing: Vec<(&String, &u32)> = a
            .iter()
            .filter(|(token, id)| b.get(*token) != Some(id))
            .collect();
        differing.sort_by_key(|(_, id)| **id);
        if let Some((token, id)) = differing.first() {
            return Err(differs(format!(
                "{} of {} tokens have other ids (first: {token:?}, id {id} in the reference, {} here)",
                differing.len(),
                a.len(),
                b.get(*token).map_or("absent".to_owned(), u32::to_string)
            )));
        }
        let other: Vec<&str> = reference
            .parts_sha256
            .iter()
            .zip(&candidate.parts_sha256)
            .filter(|(r, c)| r.1 != c.1)
            .map(|(r, _)| r.0)
            .collect();
        if !other.is_empty() {
            return Err(differs(format!(
                "the same vocabulary, but another {} (the same text could become other ids)",
                other.join(", ")
            )));
        }
    }
    if reference.bos_id != candidate.bos_id {
        return Err(Error::mismatch(
            &candidate.path,
            None,
            format!(
                "BOS token id {:?} differs from the reference's {:?}",
                candidate.bos_id, reference.bos_id
            ),
        ));
    }
    Ok(())
}

/// The tokenized eval text and its digests.
#[derive(Debug, Clone)]
pub struct TokenStream {
    pub ids: Vec<u32>,
    pub text_sha256: String,
    pub text_bytes: u64,
    /// For a conversation eval text: each token's label and how the text was rendered.
    pub conversation: Option<std::sync::Arc<ConversationTokens>>,
}

/// What a conversation eval text adds to its token stream.
#[derive(Debug, Clone)]
pub struct ConversationTokens {
    /// One per token of the stream.
    pub labels: Vec<crate::conversation::eval::TokenLabel>,
    pub record: crate::conversation::eval::ConversationRecord,
}

impl TokenStream {
    /// A stream of ids with nothing known of the text they came from.
    pub fn of_ids(ids: Vec<u32>, text_sha256: String) -> TokenStream {
        TokenStream {
            ids,
            text_sha256,
            text_bytes: 0,
            conversation: None,
        }
    }
}

/// How a conversation eval text is rendered: where its chat template comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplateChoice {
    pub from: crate::conversation::eval::TemplateFrom,
    /// The file, for `TemplateFrom::File`.
    pub file: Option<PathBuf>,
    /// A named template of a `tokenizer_config.json` list.
    pub name: Option<String>,
    /// What `strftime_now` reads (seconds since the epoch, UTC); `None`: the default,
    /// [`crate::conversation::eval::DEFAULT_CLOCK`] (for `verify`: the card's).
    pub clock: Option<i64>,
}

impl Default for ChatTemplateChoice {
    fn default() -> Self {
        ChatTemplateChoice {
            from: crate::conversation::eval::TemplateFrom::Reference,
            file: None,
            name: None,
            clock: None,
        }
    }
}

/// The eval text tokenized: a conversation file (`.json`/`.jsonl`) rendered with `choice`'s
/// template and labelled ([`tokenize_conversations`], telling `progress` which conversation it
/// is on), anything else as plain text ([`tokenize`]).
pub fn tokenize_eval_text(
    tokenizer: &TokenizerFile,
    text_path: &Path,
    choice: &ChatTemplateChoice,
    reference: &Path,
    candidate: &Path,
    progress: &dyn Fn(&str),
) -> Result<TokenStream> {
    if crate::conversation::eval::is_conversation_file(text_path) {
        tokenize_conversations(tokenizer, text_path, choice, reference, candidate, progress)
    } else {
        tokenize(tokenizer, text_path)
    }
}

/// What the `--chat-template*` flags name, each over what a run would otherwise use (the
/// defaults for `measure`, the card's `eval.conversation` for `verify`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChatTemplateFlags {
    /// `--chat-template FILE` (`TemplateFrom::File`) or `--chat-template-from`.
    pub from: Option<crate::conversation::eval::TemplateFrom>,
    pub file: Option<PathBuf>,
    pub name: Option<String>,
    pub clock: Option<i64>,
}

impl ChatTemplateFlags {
    /// `base` with what the flags name in its place.
    pub fn over(&self, base: ChatTemplateChoice) -> ChatTemplateChoice {
        let (from, file) = match self.from {
            Some(from) => (from, self.file.clone()),
            None => (base.from, base.file),
        };
        ChatTemplateChoice {
            from,
            file,
            name: self.name.clone().or(base.name),
            clock: self.clock.or(base.clock),
        }
    }
}

/// The chat template `choice` names: a file, or the reference's or candidate's own (`reference`
/// and `candidate` are the model paths; a GGUF file's is its directory's).
pub fn chat_template(
    choice: &ChatTemplateChoice,
    text_path: &Path,
    reference: &Path,
    candidate: &Path,
) -> Result<crate::conversation::source::TemplateSource> {
    use crate::conversation::eval::TemplateFrom;
    use crate::conversation::source::TemplateSource;
    let model_dir = |model: &Path| {
        if model.is_file() {
            model.parent().unwrap_or(Path::new(".")).to_owned()
        } else {
            model.to_owned()
        }
    };
    match (choice.from, &choice.file) {
        (TemplateFrom::File, Some(file)) => TemplateSource::from_file(file),
        (TemplateFrom::File, None) => Err(Error::usage(
            text_path,
            "a template from a file needs the file (--chat-template FILE)",
        )),
        (TemplateFrom::Reference, _) => {
            TemplateSource::from_model_dir(&model_dir(reference), choice.name.as_deref())
        }
        (TemplateFrom::Candidate, _) => {
            TemplateSource::from_model_dir(&model_dir(candidate), choice.name.as_deref())
        }
    }
}

/// A conversation eval text (`.json`/`.jsonl`) rendered with the chosen template, labelled and
/// tokenized with `tokenizer` (its directory's `tokenizer_config.json` and
/// `generation_config.json` give the template's special tokens and the turn ends). `reference`
/// and `candidate` are the model paths a template is taken from; `progress` hears which
/// conversation is being labelled and tokenized.
pub fn tokenize_conversations(
    tokenizer: &TokenizerFile,
    text_path: &Path,
    choice: &ChatTemplateChoice,
    reference: &Path,
    candidate: &Path,
    progress: &dyn Fn(&str),
) -> Result<TokenStream> {
    use crate::conversation::eval;
    let bytes = crate::files::read_capped(
        text_path,
        crate::conversation::file::MAX_CONVERSATION_BYTES,
        "a conversation file",
    )?;
    let template = chat_template(choice, text_path, reference, candidate)?;
    let dir = tokenizer.path.parent().unwrap_or(Path::new("."));
    let context = eval::TokenizerContext::read(dir, &tokenizer.tokenizer)?;
    let rendered = eval::render_file(
        text_path,
        &template,
        choice.from,
        &tokenizer.tokenizer,
        &context,
        choice.clock.unwrap_or(eval::DEFAULT_CLOCK),
        progress,
    )?;
    Ok(TokenStream {
        ids: rendered.ids,
        text_sha256: hex(&Sha256::digest(&bytes)),
        text_bytes: bytes.len() as u64,
        conversation: Some(std::sync::Arc::new(ConversationTokens {
            labels: rendered.labels,
            record: rendered.record,
        })),
    })
}

/// Tokenize the eval text (no special tokens added; BOS is the window policy's business).
pub fn tokenize(tokenizer: &TokenizerFile, text_path: &Path) -> Result<TokenStream> {
    let bytes = crate::files::read_capped(text_path, MAX_EVAL_TEXT_BYTES, "an eval text")?;
    let size = bytes.len() as u64;
    let text_sha256 = hex(&Sha256::digest(&bytes));
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::format(
            text_path,
            None,
            format!(
                "eval text is not UTF-8 (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    let encoding = tokenizer.tokenizer.encode(text, false).map_err(|e| {
        Error::tokenizer(
            &tokenizer.path,
            None,
            format!("tokenizing {} failed: {e}", text_path.display()),
        )
    })?;
    Ok(TokenStream {
        ids: encoding.get_ids().to_vec(),
        text_sha256,
        text_bytes: size,
        conversation: None,
    })
}

/// SHA-256 of a token stream as int32 little-endian, the digest cards disclose.
pub fn tokens_sha256(ids: &[u32]) -> String {
    let mut hasher = Sha256::new();
    for chunk in ids.chunks(4096) {
        let bytes: Vec<u8> = chunk
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        hasher.update(&bytes);
    }
    hex(&hasher.finalize())
}

/// The windows one context length gives.
#[derive(Debug, Clone)]
pub struct Windows {
    pub length: usize,
    /// Each window's token ids as fed to the model (BOS applied).
    pub windows: Vec<Vec<u32>>,
    /// Tokens of the trailing partial window, dropped.
    pub dropped_tokens: usize,
}

/// Cut the stream into non-overlapping windows of `length` tokens.
pub fn windows(
    stream: &TokenStream,
    text_path: &Path,
    length: usize,
    bos: Bos,
    bos_id: Option<u32>,
) -> Result<Windows> {
    if length < 2 {
        return Err(Error::usage(
            text_path,
            format!("context length {length} is too short: a window needs at least 2 tokens"),
        ));
    }
    let bos_token = || {
        bos_id.ok_or_else(|| {
            Error::mismatch(
                text_path,
                None,
                format!(
                    "BOS policy {} needs a BOS token, and the tokenizer declares none (bos_token in tokenizer_config.json or bos_token_id in config.json)",
                    bos.as_str()
                ),
            )
        })
    };
    let mut ids: Vec<u32> = Vec::with_capacity(stream.ids.len() + 1);
    if bos == Bos::PerDocument {
        ids.push(bos_token()?);
    }
    ids.extend_from_slice(&stream.ids);
    let n = ids.len() / length;
    if n == 0 {
        return Err(Error::usage(
            text_path,
            format!(
                "eval text gives {} tokens, shorter than one window of {length}",
                ids.len()
            ),
        ));
    }
    let first = if bos == Bos::PerWindow {
        Some(bos_token()?)
    } else {
        None
    };
    let windows = ids
        .chunks_exact(length)
        .map(|w| {
            let mut w = w.to_vec();
            if let Some(b) = first {
                w[0] = b;
            }
            w
        })
        .collect();
    Ok(Windows {
        length,
        windows,
        dropped_tokens: ids.len() - n * length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (#14): a 550 MB tokenizer.json was read whole before parsing.
    #[test]
    fn an_oversized_tokenizer_json_is_refused_from_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(550 << 20).unwrap();
        drop(file);
        let err = load_tokenizer(&path).err().expect("refused").to_string();
        assert!(
            err.contains("tokenizer.json") && err.contains("limit for a tokenizer.json"),
            "{err}"
        );
    }

    fn stream(n: u32) -> TokenStream {
        TokenStream::of_ids((10..10 + n).collect(), String::new())
    }

    #[test]
    fn windows_drop_the_trailing_partial_window() {
        let w = windows(&stream(10), Path::new("t"), 4, Bos::None, None).unwrap();
        assert_eq!(w.windows, vec![vec![10, 11, 12, 13], vec![14, 15, 16, 17]]);
        assert_eq!(w.dropped_tokens, 2);
    }

    #[test]
    fn per_window_bos_replaces_the_first_token_as_llamacpp_does() {
        let w = windows(&stream(8), Path::new("t"), 4, Bos::PerWindow, Some(1)).unwrap();
        assert_eq!(w.windows, vec![vec![1, 11, 12, 13], vec![1, 15, 16, 17]]);
    }

    #[test]
    fn per_document_bos_is_prepended_before_windowing() {
        let w = windows(&stream(8), Path::new("t"), 4, Bos::PerDocument, Some(1)).unwrap();
        assert_eq!(w.windows, vec![vec![1, 10, 11, 12], vec![13, 14, 15, 16]]);
        assert_eq!(w.dropped_tokens, 1);
    }

    #[test]
    fn text_shorter_than_a_window_is_an_error() {
        let e = windows(&stream(3), Path::new("t"), 4, Bos::None, None).unwrap_err();
        assert!(
            e.to_string().contains("shorter than one window of 4"),
            "{e}"
        );
        let e = windows(&stream(9), Path::new("t"), 4, Bos::PerWindow, None).unwrap_err();
        assert!(e.to_string().contains("needs a BOS token"), "{e}");
    }

    #[test]
    fn token_digest_is_of_int32_little_endian() {
        let d = tokens_sha256(&[1, 2]);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&1i32.to_le_bytes());
        bytes.extend_from_slice(&2i32.to_le_bytes());
        assert_eq!(d, hex(&Sha256::digest(&bytes)));
    }
}
