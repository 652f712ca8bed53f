//! Findings: what lint (and later inspect and verify) report about a readable input.

use std::fmt;

use schemars::JsonSchema;
use serde::Serialize;

/// How bad a finding is. Any error makes `lint` exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// The nine disclosure items without which a KLD number cannot be interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Item {
    Reference,
    Runtime,
    EvalText,
    Calibration,
    ContextLengths,
    Positions,
    KlDirection,
    VocabTruncation,
    Aggregation,
}

impl Item {
    pub const ALL: [Item; 9] = [
        Item::Reference,
        Item::Runtime,
        Item::EvalText,
        Item::Calibration,
        Item::ContextLengths,
        Item::Positions,
        Item::KlDirection,
        Item::VocabTruncation,
        Item::Aggregation,
    ];

    pub fn id(self) -> &'static str {
        match self {
            Item::Reference => "reference",
            Item::Runtime => "runtime",
            Item::EvalText => "eval_text",
            Item::Calibration => "calibration",
            Item::ContextLengths => "context_lengths",
            Item::Positions => "positions",
            Item::KlDirection => "kl_direction",
            Item::VocabTruncation => "vocab_truncation",
            Item::Aggregation => "aggregation",
        }
    }

    /// Where the item lives in the front matter.
    pub fn pointer(self) -> &'static str {
        match self {
            Item::Reference => "/fidelity/reference",
            Item::Runtime => "/fidelity/runtime",
            Item::EvalText => "/fidelity/eval",
            Item::Calibration => "/fidelity/calibration",
            Item::ContextLengths => "/fidelity/protocol/context_lengths",
            Item::Positions => "/fidelity/protocol/positions",
            Item::KlDirection => "/fidelity/protocol/kl",
            Item::VocabTruncation => "/fidelity/protocol/vocab",
            Item::Aggregation => "/fidelity/protocol/aggregation",
        }
    }

    /// The item a front-matter pointer belongs to, if any.
    pub fn of_pointer(pointer: &str) -> Option<Item> {
        Item::ALL.into_iter().find(|item| {
            let p = item.pointer();
            pointer == p
                || pointer
                    .strip_prefix(p)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    /// Why a KLD number cannot be interpreted without this item.
    pub fn why(self) -> &'static str {
        match self {
            Item::Reference => {
                "KLD is a distance to a reference: without the exact checkpoint (repo, commit, \
                 format, dtype) the number has no baseline, and a GGUF or FP16 conversion of the \
                 same weights is a different reference"
            }
            Item::Runtime => {
                "the engine and its version, attention kernel, KV-cache dtype, compute dtype and \
                 device each move the logits: the same weights on another stack give another KLD"
            }
            Item::EvalText => {
                "KLD depends on the text scored: without the exact text (a digest) and how it \
                 became tokens (tokenizer, BOS policy) nobody can score the same tokens"
            }
            Item::Calibration => {
                "calibration data shapes the quantization error, and scoring on text the \
                 quantizer was calibrated on understates KLD; say which data, or `dataset: none`"
            }
            Item::ContextLengths => {
                "KLD grows with depth in the context: a number without its window length cannot \
                 be compared with another"
            }
            Item::Positions => {
                "which rows are scored (all, every Nth, the second half of each window as \
                 llama.cpp does) changes the mean"
            }
            Item::KlDirection => {
                "KL is asymmetric: KL(P_ref||P_cand) and KL(P_cand||P_ref) differ, and nats and \
                 bits differ by a factor ln 2"
            }
            Item::VocabTruncation => {
                "top-k or thresholded KL drops terms of the sum (llama.cpp drops reference terms \
                 with log p <= -16): a truncated KL is a different, smaller number"
            }
            Item::Aggregation => {
                "a mean over positions, a mean of window means and a median are different \
                 statistics, and an uncertainty means nothing without its method and level"
            }
        }
    }
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// Stable finding codes (used in `--json` and in docs; never renamed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Code {
    SchemaViolation,
    MissingDisclosure,
    VagueDisclosure,
    UnknownMetric,
    InconsistentClaim,
    ImpreciseClaim,
    InvalidClaim,
    MissingBaseModel,
    BaseModelRelation,
    ReferenceNotBaseModel,
    CandidateUnpinned,
    CalibrationOverlapsEval,
    UnquotedRevision,
    Yaml11Ambiguous,
    UndisclosedKldClaim,
    NoFidelityDisclosure,
    UnterminatedFrontMatter,
    MetadataNotMapping,
    ConfigTensorMismatch,
    UnknownScheme,
    QuantizationMismatch,
    ProseContradictsDisclosure,
    ProseNotInDisclosure,
    KvCacheMismatch,
    ConversationAllPositions,
    ModelIndexContradictsDisclosure,
    ListedFileMissing,
    UnlistedFile,
}

impl Code {
    pub const ALL: [Code; 28] = [
        Code::SchemaViolation,
        Code::MissingDisclosure,
        Code::VagueDisclosure,
        Code::UnknownMetric,
        Code::InconsistentClaim,
        Code::ImpreciseClaim,
        Code::InvalidClaim,
        Code::MissingBaseModel,
        Code::BaseModelRelation,
        Code::ReferenceNotBaseModel,
        Code::CandidateUnpinned,
        Code::CalibrationOverlapsEval,
        Code::UnquotedRevision,
        Code::Yaml11Ambiguous,
        Code::UndisclosedKldClaim,
        Code::NoFidelityDisclosure,
        Code::UnterminatedFrontMatter,
        Code::MetadataNotMapping,
        Code::ConfigTensorMismatch,
        Code::UnknownScheme,
        Code::QuantizationMismatch,
        Code::ProseContradictsDisclosure,
        Code::ProseNotInDisclosure,
        Code::KvCacheMismatch,
        Code::ConversationAllPositions,
        Code::ModelIndexContradictsDisclosure,
        Code::ListedFileMissing,
        Code::UnlistedFile,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::SchemaViolation => "schema-violation",
            Code::MissingDisclosure => "missing-disclosure",
            Code::VagueDisclosure => "vague-disclosure",
            Code::UnknownMetric => "unknown-metric",
            Code::InconsistentClaim => "inconsistent-claim",
            Code::ImpreciseClaim => "imprecise-claim",
            Code::InvalidClaim => "invalid-claim",
            Code::MissingBaseModel => "missing-base-model",
            Code::BaseModelRelation => "base-model-relation",
            Code::ReferenceNotBaseModel => "reference-not-base-model",
            Code::CandidateUnpinned => "candidate-unpinned",
            Code::CalibrationOverlapsEval => "calibration-overlaps-eval",
            Code::UnquotedRevision => "unquoted-revision",
            Code::Yaml11Ambiguous => "yaml11-ambiguous",
            Code::UndisclosedKldClaim => "undisclosed-kld-claim",
            Code::NoFidelityDisclosure => "no-fidelity-disclosure",
            Code::UnterminatedFrontMatter => "unterminated-front-matter",
            Code::MetadataNotMapping => "metadata-not-mapping",
            Code::ConfigTensorMismatch => "config-tensor-mismatch",
            Code::UnknownScheme => "unknown-scheme",
            Code::QuantizationMismatch => "quantization-mismatch",
            Code::ProseContradictsDisclosure => "prose-contradicts-disclosure",
            Code::ProseNotInDisclosure => "prose-not-in-disclosure",
            Code::KvCacheMismatch => "kv-cache-mismatch",
            Code::ConversationAllPositions => "conversation-all-positions",
            Code::ModelIndexContradictsDisclosure => "model-index-contradicts-disclosure",
            Code::ListedFileMissing => "listed-file-missing",
            Code::UnlistedFile => "unlisted-file",
        }
    }

    /// The severity every finding of this code has.
    pub fn severity(self) -> Severity {
        match self {
            Code::ReferenceNotBaseModel
            | Code::CandidateUnpinned
            | Code::CalibrationOverlapsEval
            | Code::ProseContradictsDisclosure
            | Code::ProseNotInDisclosure
            | Code::UnquotedRevision
            | Code::Yaml11Ambiguous
            | Code::NoFidelityDisclosure
            | Code::ConversationAllPositions
            | Code::UnlistedFile => Severity::Warning,
            _ => Severity::Error,
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem found in a card, with where it is.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Finding {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub item: Option<Item>,
    /// JSON pointer from the front-matter root.
    pub pointer: Option<String>,
    /// 1-based, from the start of the file.
    pub line: Option<usize>,
    /// 1-based, in characters.
    pub column: Option<usize>,
    /// Byte span the finding points at (for rendering the offending line; not in the JSON).
    #[serde(skip)]
    pub span: Option<std::ops::Range<usize>>,
}

impl Finding {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Finding {
            code,
            severity: code.severity(),
            message: message.into(),
            item: None,
            pointer: None,
            line: None,
            column: None,
            span: None,
        }
    }

    pub fn item(mut self, item: Option<Item>) -> Self {
        self.item = item;
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}
