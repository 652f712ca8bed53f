//! The measurement protocol: every setting that changes a KLD number, spelled out, and its digest.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Which KL directions are computed and shown. `kld_*` is always KL(P_ref || P_cand) and
/// `kld_reverse_*` always KL(P_cand || P_ref); nothing is renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Forward,
    Reverse,
    Both,
}

impl Direction {
    pub fn forward(self) -> bool {
        matches!(self, Direction::Forward | Direction::Both)
    }
    pub fn reverse(self) -> bool {
        matches!(self, Direction::Reverse | Direction::Both)
    }
}

/// Why a KL direction cannot be measured under a vocabulary mode, if it cannot. llama.cpp's
/// threshold keeps the *reference's* terms with log p above it; the reverse KL, weighted by the
/// candidate, over that set is a partial sum, not a divergence (it goes negative when the
/// candidate moves mass onto the dropped terms), so it is refused rather than reported.
pub fn unmeasurable(direction: Direction, vocab: VocabMode) -> Option<String> {
    match vocab {
        VocabMode::Threshold { log_p } if direction.reverse() => Some(format!(
            "the reverse KL under vocab mode threshold (reference log p > {log_p}) is a partial sum over the reference's kept terms, not a divergence (it can be negative); measure the forward KL only (llama.cpp's method), or the reverse KL with vocab full or top_k lumped"
        )),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tail {
    /// The tail beyond the top k is one bucket: a guaranteed lower bound on the full KL.
    Lumped,
    /// The tail is ignored (terms of the full-vocabulary sum over the top k only).
    Dropped,
    /// Both distributions renormalized over the top k.
    Renormalized,
}

/// Which terms of the KL sum are kept. Sets are the reference's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum VocabMode {
    Full,
    TopK {
        k: usize,
        tail: Tail,
    },
    /// Reference terms with log p <= `log_p` dropped (llama.cpp: -16).
    Threshold {
        log_p: f64,
    },
}

/// Which rows of each window are scored. Row j predicts token j+1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum Positions {
    All,
    Stride {
        stride: u64,
        offset: u64,
    },
    /// j from L/2 to L-2, as llama.cpp scores.
    SecondHalf,
    From {
        from: u64,
    },
}

impl Positions {
    /// Whether row j of a window of `len` tokens is scored. The last row (j = len - 1) predicts a
    /// token outside the window and is never scored.
    pub fn selects(self, j: u64, len: u64) -> bool {
        if j + 1 >= len {
            return false;
        }
        match self {
            Positions::All => true,
            Positions::Stride { stride, offset } => j % stride == offset,
            Positions::SecondHalf => j >= len / 2,
            Positions::From { from } => j >= from,
        }
    }
}

/// The seeded block bootstrap behind every `ci95`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bootstrap {
    pub resamples: usize,
    pub seed: u64,
    pub level: f64,
}

/// Everything that defines what a measurement's numbers mean.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Protocol {
    pub direction: Direction,
    pub units: &'static str,
    pub vocab: VocabMode,
    /// Logit entries beyond the tokenizer's vocabulary (padding) are `excluded` (the default) or
    /// `included`; `vocab_size` is how many entries were used.
    pub padding: &'static str,
    pub vocab_size: usize,
    pub positions: Positions,
    /// Window length in tokens; `None` when rows carry their own windows and positions.
    pub context_length: Option<u64>,
    pub aggregation: &'static str,
    pub bootstrap: Bootstrap,
    /// Bootstrap blocks: `window`, or `run:<rows>` inside one long window.
    pub bootstrap_block: String,
    pub top1: &'static str,
    pub llamacpp_compat: bool,
}

impl Protocol {
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("protocol serializes")
    }

    /// SHA-256 of the protocol's canonical JSON (keys sorted, no whitespace).
    pub fn sha256(&self) -> String {
        sha256_of(&self.to_json())
    }
}

/// SHA-256 of a value's canonical JSON: `protocol_sha256` for any protocol document.
pub fn sha256_of(value: &Value) -> String {
    crate::checkpoint::hash::hex(&Sha256::digest(canonical_json(value).as_bytes()))
}

/// JSON with object keys sorted and no whitespace, so equal values have equal bytes.
pub fn canonical_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&map[k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(items) => {
            format!(
                "[{}]",
                items
                    .iter()
                    .map(canonical_json)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_policies_follow_the_design() {
        let rows =
            |p: Positions, len: u64| (0..len).filter(|&j| p.selects(j, len)).collect::<Vec<_>>();
        assert_eq!(rows(Positions::All, 4), [0, 1, 2]);
        assert_eq!(rows(Positions::SecondHalf, 8), [4, 5, 6]);
        assert_eq!(
            rows(
                Positions::Stride {
                    stride: 4,
                    offset: 3
                },
                12
            ),
            [3, 7]
        );
        assert_eq!(rows(Positions::From { from: 5 }, 8), [5, 6]);
        // llama.cpp: n_ctx - 1 - n_ctx/2 rows per chunk.
        assert_eq!(rows(Positions::SecondHalf, 128).len(), 63);
        assert_eq!(rows(Positions::SecondHalf, 512).len(), 255);
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let v = serde_json::json!({"b": 1, "a": {"d": [1, 2], "c": "x"}});
        assert_eq!(canonical_json(&v), r#"{"a":{"c":"x","d":[1,2]},"b":1}"#);
    }
}
