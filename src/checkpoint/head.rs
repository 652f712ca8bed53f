//! Where a causal language model's output head is, from config.json and the tensor names alone,
//! for any architecture: the transformers runner measures models the native runner cannot run
//! (hybrid Gated DeltaNet, MoE, vision-language checkpoints), so their identity cannot come from
//! the native runner's architecture list.
//!
//! Vision-language checkpoints (Qwen3.5 / Qwen3.6 ship as `Qwen3_5ForConditionalGeneration`)
//! nest the text model's settings under `text_config` and its weights under
//! `model.language_model.*`; the logits are the text model's either way.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// The widest vocabulary cardproof sizes a logit row for (as for base files).
pub const MAX_VOCAB: u64 = 1 << 22;

/// Names of the output head, most specific layout first.
const HEADS: [&str; 2] = ["lm_head.weight", "language_model.lm_head.weight"];

/// Names of the input embeddings: a text-only model, a Qwen3.5-style VLM, a LLaVA-style VLM.
const EMBEDDINGS: [&str; 3] = [
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
];

/// The output head of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadLayout {
    /// Entries of a logit row (`vocab_size`).
    pub vocab: usize,
    /// The tensor the logits are computed with: the head, or the embeddings when tied.
    pub head: String,
    /// The input embeddings' tensor, when the checkpoint has one.
    pub embeddings: Option<String>,
    /// Whether the head is the embeddings (no separate head tensor is used).
    pub tied: bool,
}

/// The text model's settings: `text_config` when the checkpoint nests them, else the top level.
pub fn text_config(config: &Value) -> &Value {
    match config.get("text_config") {
        Some(v) if v.is_object() => v,
        _ => config,
    }
}

/// The head layout of the checkpoint whose config.json (at `path`) is `config`; `has` says
/// whether a tensor name is in its files.
pub fn head_layout(path: &Path, config: &Value, has: &dyn Fn(&str) -> bool) -> Result<HeadLayout> {
    let text = text_config(config);
    let key = |k: &str| text.get(k).or_else(|| config.get(k));
    let vocab = match key("vocab_size").and_then(Value::as_u64) {
        Some(v) if (1..=MAX_VOCAB).contains(&v) => v as usize,
        Some(v) => {
            return Err(Error::format(
                path,
                Some("vocab_size"),
                format!("vocab_size {v} is outside 1 to {MAX_VOCAB}"),
            ));
        }
        None => {
            return Err(Error::format(
                path,
                Some("vocab_size"),
                "no vocab_size (at the top level or in text_config): the width of a logit row is unknown",
            ));
        }
    };
    // A stored head is the head (as the native runner reads it, so digests stay those recorded
    // before); without one the embeddings compute the logits, which only a tied head allows.
    // transformers ties unless the config says otherwise.
    let tie = key("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let embeddings = EMBEDDINGS.iter().find(|n| has(n)).map(|n| (*n).to_owned());
    let stored_head = HEADS.iter().find(|n| has(n)).map(|n| (*n).to_owned());
    let (head, tied) = match (stored_head, &embeddings, tie) {
        (Some(h), _, _) => (h, false),
        (None, Some(e), true) => (e.clone(), true),
        (None, _, false) => {
            return Err(Error::format(
                path,
                Some("tie_word_embeddings"),
                format!(
                    "the head is not tied to the embeddings, but no head tensor ({}) is in the checkpoint",
                    HEADS.join(", ")
                ),
            ));
        }
        (None, None, true) => {
            return Err(Error::format(
                path,
                None,
                format!(
                    "neither an output head ({}) nor embeddings ({}) are in the checkpoint",
                    HEADS.join(", "),
                    EMBEDDINGS.join(", ")
                ),
            ));
        }
    };
    Ok(HeadLayout {
        vocab,
        head,
        embeddings,
        tied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn layout(config: Value, names: &[&str]) -> Result<HeadLayout> {
        head_layout(Path::new("config.json"), &config, &|n| names.contains(&n))
    }

    #[test]
    fn a_qwen3_5_vlm_checkpoint_reads_its_text_model_head() {
        let config = json!({
            "model_type": "qwen3_5",
            "tie_word_embeddings": false,
            "text_config": {"model_type": "qwen3_5_text", "vocab_size": 248320},
        });
        let l = layout(
            config,
            &[
                "lm_head.weight",
                "model.language_model.embed_tokens.weight",
                "model.visual.x",
            ],
        )
        .unwrap();
        assert_eq!(l.vocab, 248320);
        assert_eq!(l.head, "lm_head.weight");
        assert_eq!(
            l.embeddings.as_deref(),
            Some("model.language_model.embed_tokens.weight")
        );
        assert!(!l.tied);
    }

    #[test]
    fn a_tied_head_is_the_embeddings_whatever_the_architecture() {
        let config =
            json!({"model_type": "qwen3_next", "vocab_size": 2048, "tie_word_embeddings": true});
        let l = layout(config, &["model.embed_tokens.weight"]).unwrap();
        assert_eq!(
            (l.head.as_str(), l.tied),
            ("model.embed_tokens.weight", true)
        );
        // Absent means tied, as transformers defaults it.
        let l = layout(json!({"vocab_size": 16}), &["model.embed_tokens.weight"]).unwrap();
        assert!(l.tied);
    }

    #[test]
    fn a_missing_or_absurd_vocabulary_or_head_is_a_format_error() {
        let e = layout(json!({"tie_word_embeddings": false}), &["lm_head.weight"]).unwrap_err();
        assert!(e.to_string().contains("no vocab_size"), "{e}");
        let e = layout(json!({"vocab_size": 1u64 << 40}), &["lm_head.weight"]).unwrap_err();
        assert!(e.to_string().contains("outside 1 to"), "{e}");
        let e = layout(
            json!({"vocab_size": 16, "tie_word_embeddings": false}),
            &["model.embed_tokens.weight"],
        )
        .unwrap_err();
        assert!(e.to_string().contains("no head tensor"), "{e}");
        let e = layout(json!({"vocab_size": 16}), &["model.norm.weight"]).unwrap_err();
        assert!(e.to_string().contains("neither an output head"), "{e}");
    }
}
