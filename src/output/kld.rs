//! The shape of the documents `src/kld` serializes ([`crate::kld::Measurement`],
//! [`crate::kld::compat::CompatMeasurement`]), for their schemas: those types hold their
//! protocol as a `serde_json::Value` and derive no schema, so these types say what they hold,
//! with `src/kld`'s own types where those have a schema. They are used for nothing but the
//! schemas and reading a protocol back ([`Protocol::of`]); the test that validates every
//! command's output against its committed schema, with undeclared fields refused, fails when
//! the two drift. A non-finite number serializes as `null`, so every measured value is a number
//! or `null`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use crate::kld::protocol::{Bootstrap, Direction, Positions, VocabMode};
use crate::kld::stats::{Diagnostics, Uncertainty};

/// A measured value; `null` when it is not finite.
type Number = Option<f64>;

/// [`crate::kld::Measurement`].
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct Measurement {
    /// Rows scored.
    pub n_positions: u64,
    pub n_windows: u64,
    /// Rows with non-finite logits, excluded.
    pub n_nonfinite: u64,
    pub protocol: Protocol,
    /// SHA-256 of the protocol's canonical JSON.
    pub protocol_sha256: String,
    /// The metric values, by metric name.
    pub metrics: BTreeMap<String, Number>,
    pub uncertainty: BTreeMap<String, Uncertainty>,
    /// Percentiles with fewer than 100 rows beyond them.
    pub low_support: Vec<String>,
    pub diagnostics: Diagnostics,
    pub reference: InputSummary,
    pub candidate: InputSummary,
    /// Every statistic's definition, in words.
    pub definitions: BTreeMap<String, String>,
}

/// [`crate::kld::protocol::Protocol`]: everything that defines what the numbers mean.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct Protocol {
    pub direction: Direction,
    pub units: String,
    pub vocab: VocabMode,
    /// `excluded` or `included`: logit entries beyond the tokenizer's vocabulary.
    pub padding: String,
    pub vocab_size: u64,
    pub positions: Positions,
    /// Window length in tokens; `null` when rows carry their own windows.
    pub context_length: Option<u64>,
    pub aggregation: String,
    pub bootstrap: Bootstrap,
    /// `window`, or `run:<rows>` inside one long window.
    pub bootstrap_block: String,
    pub top1: String,
    pub llamacpp_compat: bool,
}

impl Protocol {
    /// The protocol a measurement's `protocol` value holds.
    pub fn of(value: &Value) -> Option<Protocol> {
        Protocol::deserialize(value).ok()
    }
}

/// [`crate::kld::InputSummary`].
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct InputSummary {
    pub path: String,
    pub format: String,
    pub rows: u64,
    pub vocab: u64,
}

/// [`crate::kld::compat::CompatMeasurement`].
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct CompatMeasurement {
    pub n_positions: u64,
    pub protocol: CompatProtocol,
    pub protocol_sha256: String,
    /// llama.cpp's statistics on the metric vocabulary (fractions, not percent).
    pub metrics: BTreeMap<String, Number>,
    pub uncertainty: BTreeMap<String, CompatUncertainty>,
    pub llamacpp: CompatStats,
    pub definitions: BTreeMap<String, String>,
}

/// The protocol llama.cpp's KLD pass implies.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct CompatProtocol {
    pub direction: Direction,
    pub units: String,
    pub vocab: VocabMode,
    pub reference_storage: String,
    pub padding: String,
    pub vocab_size: u64,
    pub positions: Positions,
    pub context_length: u64,
    pub aggregation: String,
    pub uncertainty: String,
    pub top1: String,
    pub llamacpp_compat: bool,
}

impl CompatProtocol {
    /// The protocol a compat measurement's `protocol` value holds.
    pub fn of(value: &Value) -> Option<CompatProtocol> {
        CompatProtocol::deserialize(value).ok()
    }
}

/// llama.cpp's standard error of a metric.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct CompatUncertainty {
    pub sem: Number,
}

/// A statistic and its uncertainty, as llama.cpp prints both.
type Pair = (Number, Number);

/// [`crate::kld::llamacpp::compat::CompatStats`]: every statistic llama.cpp prints
/// (percentages as fractions).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct CompatStats {
    pub n: u64,
    pub ppl_q: Pair,
    pub ppl_base: Pair,
    pub cor: Number,
    pub ln_ratio: Pair,
    pub ratio: Pair,
    pub diff: Pair,
    pub kld_mean: Pair,
    pub kld_max: Number,
    pub kld_p999: Number,
    pub kld_p99: Number,
    pub kld_p95: Number,
    pub kld_p90: Number,
    pub kld_median: Number,
    pub kld_p10: Number,
    pub kld_p5: Number,
    pub kld_p1: Number,
    pub kld_p01: Number,
    pub kld_min: Number,
    pub dp_mean: Pair,
    pub dp_max: Number,
    pub dp_p999: Number,
    pub dp_p99: Number,
    pub dp_p95: Number,
    pub dp_p90: Number,
    pub dp_p75: Number,
    pub dp_median: Number,
    pub dp_p25: Number,
    pub dp_p10: Number,
    pub dp_p5: Number,
    pub dp_p1: Number,
    pub dp_p01: Number,
    pub dp_min: Number,
    pub rms_dp: Pair,
    pub same_top: Pair,
}
