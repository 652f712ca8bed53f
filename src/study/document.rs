//! `study.json`: a study's arms, their numbers and the comparisons between them, typed
//! (`schema/study-v1.schema.json`). Each arm's full measurement is beside it
//! (`arms/<name>/measurement.json`, the document `measure` writes, which `card` reads).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::compare::Paired;
use super::file::Variable;
use super::plan::ArmKind;
use crate::kld::stats::{Bucket, Uncertainty};

/// The definitions every study document carries.
pub const DEFINITIONS: &str = "Every arm is measured against the same reference pass (the reference with the baseline's settings), on the same tokens and rows: KL in nats, forward KL(P_ref || P_arm) and reverse KL(P_arm || P_ref) per row, means over rows, 95% intervals by the seeded block bootstrap (blocks: windows, or runs of rows in a single window). top1_flips: rows whose first-index argmax differs between the reference and the arm. tool_call_flips: of those, rows predicting a token of a tool call (conversation eval texts). bits_per_weight: stored bytes of the linear weights with their scales x 8 / logical weights (inspect). Comparisons: for arms A and B, d_i = KL_A,i - KL_B,i (forward) over the rows finite in both; difference = mean(d); ci95 its block-bootstrap percentile interval; verdict closer (interval below 0: A is nearer the reference), farther (above 0) or not_distinguishable; mde = 2.80 x the bootstrap standard error (z_0.975 + z_0.80): the smallest true difference this sample detects four times in five. Controls: control-repeat is the baseline measured against itself again (0 in a deterministic lane); control-kernel is the reference's weights with another kernel (native: the other compute dtype; transformers: another attention implementation), the lane's noise floor.";

/// study.json.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(title = "cardproof study v1")]
pub struct StudyDocument {
    pub schema_version: crate::schema::SchemaVersion,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Always `study`.
    pub kind: String,
    pub name: String,
    pub study_file: StudyFileRecord,
    pub reference: ReferenceRecord,
    /// The eval text, as every arm's measurement records it.
    pub eval: crate::rerun::document::EvalRecord,
    /// The protocol every arm was scored under, and its digest.
    pub protocol: crate::rerun::document::RunProtocol,
    pub protocol_sha256: String,
    /// How every arm's turns were generated (`protocol.turns`), the same for every arm: the
    /// protocol and the conversation they came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<StudyTurnsRecord>,
    /// `native`, `transformers` or `llamacpp`.
    pub runner: String,
    pub device: String,
    pub definitions: String,
    pub arms: Vec<ArmSummary>,
    /// Every pair of the study's own arms, per context length.
    pub comparisons: Vec<Paired>,
    /// Every pair of the study's own arms on their generated turns (`protocol.turns`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_comparisons: Vec<TurnComparison>,
    pub timings: Timings,
    /// Every other file of the study's set (study.md, study.html, each arm's measurement.json
    /// and positions.safetensors) and its SHA-256: signed with this document, so none of them
    /// can be rewritten after signing (`verify-report` checks them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_files: Vec<crate::outset::SetFile>,
    /// A study finished by `study --resume`: the interrupted run its first arms were measured
    /// in (replayed here from that run's rows, checked to give the measurements it recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<super::resume::Resumed>,
}

/// What every arm's turns share (each arm's measurement records it under `turns` beside that
/// arm's own turns): the protocol, the conversation, the call family and the stop ids, here in
/// the signed document itself, so a reader of study.json sees which conversation the turn
/// metrics are about without opening an arm's measurement.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StudyTurnsRecord {
    pub protocol: crate::rerun::turns::TurnProtocol,
    /// The conversation file the turns came from (its path and SHA-256), where it is not the
    /// eval text (`eval`): `protocol.turns.conversation` or `--turns-conversation`, always in a
    /// llama.cpp study, whose eval text is plain text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<crate::rerun::turns::ConversationFile>,
    /// The template family the calls were read in (`null`: the template writes no call
    /// cardproof reads).
    pub call_format: Option<crate::conversation::calls::CallFormat>,
    /// The token ids a turn stopped at.
    pub stop_ids: Vec<u32>,
}

impl StudyTurnsRecord {
    /// The shared part of an arm's turns record.
    pub fn of(t: &crate::rerun::turns::TurnsRecord) -> StudyTurnsRecord {
        StudyTurnsRecord {
            protocol: t.protocol,
            conversation: t.conversation.clone(),
            call_format: t.call_format,
            stop_ids: t.stop_ids.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StudyFileRecord {
    pub path: String,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReferenceRecord {
    pub path: String,
    pub manifest_sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_weight: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

/// One arm: what it is, what it changes, and its numbers per context length.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ArmSummary {
    pub name: String,
    pub kind: ArmKind,
    /// What the study file says the arm changes.
    pub changes: Variable,
    /// What it changes against the baseline, found by cardproof.
    pub changed: Vec<Variable>,
    /// It changes other or more variables than it says (the study file allowed it).
    pub mixed: bool,
    pub candidate: String,
    pub manifest_sha256: String,
    pub settings: ArmSettings,
    /// Bits per weight and stored size of the checkpoint's files (inspect).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_weight: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// The arm's measurement, relative to study.json.
    pub measurement: String,
    pub runs: Vec<ArmRun>,
    /// Seconds the arm's pass took (its model's forward passes and the reduction).
    pub seconds: f64,
    /// The arm's generated turns against the reference's (`protocol.turns`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<crate::kld::turns::TurnSummary>,
    /// The arm's first turn that fails (its calls differ from the reference's, or it calls
    /// where the reference does not), else its first turn whose tokens differ, beside the
    /// reference's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_diverging_turn: Option<DivergingTurn>,
    /// Each turn's outcome in conversation order (the same turns for every arm).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_outcomes: Vec<crate::kld::turns::TurnOutcome>,
}

/// One turn as the reference and an arm generated it (texts capped as measurement.json keeps
/// them).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DivergingTurn {
    pub conversation: u32,
    pub message: u32,
    /// Whether the turn fails (its calls), not only differs in tokens.
    pub fails: bool,
    pub reference: String,
    pub arm: String,
}

/// Two of the study's own arms on the same generated turns: which turns each holds that the
/// other does not, with an exact McNemar test and the paired difference.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TurnComparison {
    pub a: String,
    pub b: String,
    #[serde(flatten)]
    pub comparison: crate::kld::turns::PairedComparison,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ArmSettings {
    pub kv_cache: String,
    pub compute_dtype: String,
    pub attention: String,
    /// The transformers runner's Gated DeltaNet kernel (absent: transformers' choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdn_kernel: Option<String>,
    pub recurrent_state: String,
    pub emulate: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ArmRun {
    pub context_length: usize,
    pub n_positions: usize,
    pub top1_flips: usize,
    /// Flips at rows predicting a tool-call token (conversation eval texts only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_flips: Option<usize>,
    #[serde(deserialize_with = "crate::json_f64::map")]
    #[schemars(with = "BTreeMap<String, Option<f64>>")]
    pub metrics: BTreeMap<String, f64>,
    pub uncertainty: BTreeMap<String, Uncertainty>,
    /// Mean KL and flips by depth in the window.
    pub by_depth: Vec<Bucket>,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Timings {
    /// The reference's one pass; absent where the reference runs beside each arm (llama.cpp,
    /// whose base stream is never kept), its time then inside each arm's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_seconds: Option<f64>,
    /// Every pass, the reference's and each arm's, and the comparisons.
    pub total_seconds: f64,
}

impl StudyDocument {
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a study document serializes")
    }
}
