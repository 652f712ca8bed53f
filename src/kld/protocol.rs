//! The measurement protocol: every setting that changes a KLD number, spelled out, and its digest.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which KL directions are computed and shown. `kld_*` is always KL(P_ref || P_cand) and
/// `kld_reverse_*` always KL(P_cand || P_ref); nothing is renamed.
// The one spelling of a KL direction: the card's `protocol.kl.direction` is this type too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "KlDirection")]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// What a token of a rendered conversation is.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Segment {
    /// A message's content (not a tool message's).
    Content,
    /// A message's reasoning (`reasoning_content`, `thinking`, `reasoning`).
    Reasoning,
    /// A tool call as the template writes it: markup, function name and arguments.
    ToolCall,
    /// A tool message's content (the result the model reads).
    ToolResult,
    /// Everything else the template writes: role headers, turn markers, tool declarations.
    Scaffolding,
}

impl Segment {
    pub const ALL: [Segment; 5] = [
        Segment::Content,
        Segment::Reasoning,
        Segment::ToolCall,
        Segment::ToolResult,
        Segment::Scaffolding,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Segment::Content => "content",
            Segment::Reasoning => "reasoning",
            Segment::ToolCall => "tool_call",
            Segment::ToolResult => "tool_result",
            Segment::Scaffolding => "scaffolding",
        }
    }

    /// The segment a name spells (snake or kebab case).
    pub fn parse(name: &str) -> Option<Segment> {
        Segment::ALL
            .into_iter()
            .find(|s| s.as_str() == name.replace('-', "_"))
    }
}

/// A message's role, as position policies and per-span metrics name it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    /// `tool`, and Llama 3.1's `ipython` (the role its template gives tool results).
    Tool,
    /// Any other role string.
    Other,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::System,
        Role::Developer,
        Role::User,
        Role::Assistant,
        Role::Tool,
        Role::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Other => "other",
        }
    }

    /// A message's `role` string as a role.
    pub fn of(role: &str) -> Role {
        match role {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" | "ipython" => Role::Tool,
            _ => Role::Other,
        }
    }

    /// The role a policy names (`other` only as itself).
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

/// Which rows of each window are scored. Row j predicts token j+1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Rows whose predicted token belongs to a message of `role` (conversation eval texts),
    /// and, with a stride, also j mod stride = offset.
    Role {
        role: Role,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
    /// Rows whose predicted token lies in `span` (conversation eval texts), and, with a
    /// stride, also j mod stride = offset.
    Span {
        span: Segment,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stride: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
    },
}

impl Positions {
    /// Whether row j of a window of `len` tokens is scored, for the policies that look at
    /// positions only (a role or span policy selects nothing here: see
    /// [`Positions::selects_token`]). The last row (j = len - 1) predicts a token outside the
    /// window and is never scored.
    pub fn selects(self, j: u64, len: u64) -> bool {
        self.selects_token(j, len, None)
    }

    /// Whether row j of a window of `len` tokens is scored, where `next` is what its predicted
    /// token (j + 1) is: its message's role (`None` for the generation prompt) and segment.
    pub fn selects_token(self, j: u64, len: u64, next: Option<(Option<Role>, Segment)>) -> bool {
        if j + 1 >= len {
            return false;
        }
        // A stride without its offset is refused by `check`; here it selects nothing.
        let every = |stride: Option<u64>, offset: Option<u64>| match (stride, offset) {
            (None, None) => true,
            (Some(s), Some(o)) => s > 0 && j % s == o,
            _ => false,
        };
        match self {
            Positions::All => true,
            Positions::Stride { stride, offset } => j % stride == offset,
            Positions::SecondHalf => j >= len / 2,
            Positions::From { from } => j >= from,
            Positions::Role {
                role,
                stride,
                offset,
            } => next.is_some_and(|(r, _)| r == Some(role)) && every(stride, offset),
            Positions::Span {
                span,
                stride,
                offset,
            } => next.is_some_and(|(_, s)| s == span) && every(stride, offset),
        }
    }

    /// Whether the policy needs each token's role and segment (a conversation eval text).
    pub fn needs_labels(self) -> bool {
        matches!(self, Positions::Role { .. } | Positions::Span { .. })
    }

    /// The policy as written on a command line and in text output: `all`, `stride:32:31`,
    /// `role:assistant`, `span:tool_call+stride:32:31`.
    pub fn spelling(self) -> String {
        let every = |stride: Option<u64>, offset: Option<u64>| match (stride, offset) {
            (Some(s), Some(o)) => format!("+stride:{s}:{o}"),
            _ => String::new(),
        };
        match self {
            Positions::All => "all".into(),
            Positions::Stride { stride, offset } => format!("stride:{stride}:{offset}"),
            Positions::SecondHalf => "second_half".into(),
            Positions::From { from } => format!("from:{from}"),
            Positions::Role {
                role,
                stride,
                offset,
            } => format!("role:{}{}", role.as_str(), every(stride, offset)),
            Positions::Span {
                span,
                stride,
                offset,
            } => format!("span:{}{}", span.as_str(), every(stride, offset)),
        }
    }
}

impl Positions {
    /// Why this policy cannot run: a stride of 0 (no residue exists) or an offset not below it.
    pub fn check(self) -> Result<(), String> {
        let bad = |stride: u64, offset: u64| {
            Err(format!(
                "positions: offset {offset} must be below stride {stride} (and the stride at least 1)"
            ))
        };
        match self {
            Positions::Stride { stride, offset } if stride == 0 || offset >= stride => {
                bad(stride, offset)
            }
            Positions::Role { stride, offset, .. } | Positions::Span { stride, offset, .. } => {
                match (stride, offset) {
                    (None, None) => Ok(()),
                    (Some(s), Some(o)) if s > 0 && o < s => Ok(()),
                    (Some(s), Some(o)) => bad(s, o),
                    _ => {
                        Err("positions: a stride needs its offset, and an offset its stride".into())
                    }
                }
            }
            _ => Ok(()),
        }
    }
}

impl VocabMode {
    /// Why this mode cannot run: `k` of 0, a threshold that is not a log-probability.
    pub fn check(self) -> Result<(), String> {
        match self {
            VocabMode::TopK { k: 0, .. } => Err("vocab: top_k needs k of at least 1".into()),
            VocabMode::Threshold { log_p } if !(log_p.is_finite() && log_p <= 0.0) => Err(format!(
                "vocab: threshold log_p {log_p} is not a log-probability (finite, <= 0)"
            )),
            _ => Ok(()),
        }
    }
}

/// BOS policy: `none` (the token stream as is), `per_window` (the first token of every window
/// replaced by BOS, as llama.cpp's perplexity tool does) or `per_document` (BOS prepended to each
/// document before windowing; the eval text is one document).
// The one spelling: the card's `eval.bos` (the disclosure's `BosPolicy`) is this type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "BosPolicy")]
pub enum Bos {
    None,
    PerWindow,
    PerDocument,
}

impl Bos {
    pub fn as_str(self) -> &'static str {
        match self {
            Bos::None => "none",
            Bos::PerWindow => "per_window",
            Bos::PerDocument => "per_document",
        }
    }
}

/// Most bootstrap resamples a protocol may ask for. Each resample is a pass over every scored row
/// whose metrics are kept to the end, so a card's `resamples: 1000000000` would allocate tens of
/// gigabytes and never finish; 100,000 is 100 times the default, far past where a percentile
/// interval stops moving.
pub const MAX_RESAMPLES: usize = 100_000;

/// Longest window a protocol may ask for, in tokens (2^20, beyond any model's context today):
/// runners size per-window buffers and loops by it.
pub const MAX_CONTEXT_LENGTH: usize = 1 << 20;

/// Why a window length cannot run: at least 2 (one row predicts the next token), at most
/// [`MAX_CONTEXT_LENGTH`].
pub fn check_context_length(length: u64) -> Result<(), String> {
    if (2..=MAX_CONTEXT_LENGTH as u64).contains(&length) {
        Ok(())
    } else {
        Err(format!(
            "context length {length} is outside 2..={MAX_CONTEXT_LENGTH} tokens"
        ))
    }
}

/// The seeded block bootstrap behind every `ci95`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Bootstrap {
    pub resamples: usize,
    pub seed: u64,
    /// Coverage of the interval, strictly between 0 and 1.
    pub level: f64,
}

impl Bootstrap {
    /// Why this bootstrap cannot run: resamples outside `1..=MAX_RESAMPLES`, or a level not
    /// strictly inside (0, 1) (a level of 1 asks for the whole range, 0 for an empty interval).
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_RESAMPLES).contains(&self.resamples) {
            return Err(format!(
                "bootstrap resamples {} is outside 1..={MAX_RESAMPLES}",
                self.resamples
            ));
        }
        if !(self.level > 0.0 && self.level < 1.0) {
            return Err(format!(
                "bootstrap level {} is not strictly between 0 and 1",
                self.level
            ));
        }
        Ok(())
    }
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
    crate::digest::sha256_hex(crate::digest::protocol_json(value).as_bytes())
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
    fn settings_outside_their_ranges_say_why() {
        let b = |resamples, level| Bootstrap {
            resamples,
            seed: 0,
            level,
        };
        assert!(b(1000, 0.95).check().is_ok());
        assert!(b(MAX_RESAMPLES, 0.5).check().is_ok());
        for (bad, needle) in [
            (b(0, 0.95), "resamples 0"),
            (
                b(1_000_000_000, 0.95),
                "resamples 1000000000 is outside 1..=100000",
            ),
            (b(1000, 2.0), "level 2 is not strictly between 0 and 1"),
            (b(1000, 1.0), "level 1"),
            (b(1000, 0.0), "level 0"),
            (b(1000, f64::NAN), "level NaN"),
        ] {
            let e = bad.check().unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        assert!(check_context_length(2).is_ok());
        assert!(check_context_length(1 << 20).is_ok());
        assert!(check_context_length(1).is_err());
        assert!(check_context_length((1 << 20) + 1).is_err());
        let stride = |stride, offset| Positions::Stride { stride, offset };
        assert!(stride(32, 31).check().is_ok());
        assert!(stride(0, 0).check().is_err() && stride(4, 4).check().is_err());
        assert!(
            VocabMode::TopK {
                k: 0,
                tail: Tail::Lumped
            }
            .check()
            .is_err()
        );
        assert!(VocabMode::Threshold { log_p: 1.0 }.check().is_err());
        assert!(VocabMode::Threshold { log_p: -16.0 }.check().is_ok());
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let v = serde_json::json!({"b": 1, "a": {"d": [1, 2], "c": "x"}});
        assert_eq!(
            crate::digest::protocol_json(&v),
            r#"{"a":{"c":"x","d":[1,2]},"b":1}"#
        );
    }
}
