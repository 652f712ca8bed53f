//! `report.json` as types: the verdict, the checkpoint's files, the card as judged (its
//! disclosure, digest and lint), the measurement, every claim's verdict, the gates, and what was
//! undisclosed or differed. It is the in-toto predicate that is signed; its JSON Schema
//! (`schema/report-v1.schema.json`) is generated from these types.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::claims::{ClaimResult, Verdict};
use super::differences::Difference;
use crate::rerun::gates::Gate;
use crate::rerun::{HubPin, Measurement, NoiseFloor, Role};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "cardproof verification report v1")]
pub struct Report {
    pub schema_version: crate::schema::SchemaVersion,
    /// The output set this report belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub tool: Tool,
    pub verdict: Verdict,
    /// Claims per verdict.
    pub summary: BTreeMap<String, usize>,
    pub checkpoint: Checkpoint,
    pub card: CardRecord,
    /// The reference as measured (`null`: nothing was rerun).
    pub reference: Option<crate::rerun::document::ModelRecord>,
    /// The rerun's measurement (`null`: nothing was rerun).
    pub measurement: Option<Measurement>,
    pub claims: Vec<ClaimResult>,
    /// The sanity gates.
    pub sanity: Vec<Gate>,
    pub noise_floor: Option<NoiseFloor>,
    /// Disclosure items missing or too vague to rerun.
    pub undisclosed: Vec<String>,
    pub lane_differences: Vec<Difference>,
    /// The Hub commits the verified files came from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hub_sources: Vec<HubSource>,
    /// Who vouches for the reference the claims were judged against: its weights rerun here,
    /// or an artifact and its signer, and whether its rows were recomputed from the weights
    /// (`null`: nothing was rerun).
    #[serde(default)]
    pub reference_source: Option<String>,
    /// How every verdict is decided, in words with their formulas ([`verdict_definitions`]).
    #[serde(default)]
    pub definitions: BTreeMap<String, String>,
    /// Every other file of the report's set (report.md, report.html, measurement.json,
    /// positions.safetensors) and its SHA-256: signed with this report, so none of them can be
    /// rewritten after signing (`verify-report` checks them). Empty until the set is written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set_files: Vec<crate::outset::SetFile>,
}

/// The verdict rules a reader of report.json needs to check a verdict by hand.
pub fn verdict_definitions() -> BTreeMap<String, String> {
    use crate::disclosure::precision::{IMPRECISE_RELATIVE, NOISE_RELATIVE, TOLERANCE_RULE};
    BTreeMap::from([
        ("tolerance".to_owned(), TOLERANCE_RULE.to_owned()),
        (
            "half_unit".to_owned(),
            "half a unit in the claim's last printed digit (0.0123 -> 5e-5, 1.5e-3 -> 5e-5)".to_owned(),
        ),
        (
            "scale".to_owned(),
            format!(
                "the claim's distance from no change: |value| (KL metrics, delta_p_rms, ppl_ref, ppl_cand), |value - 1| (ppl_ratio), 1 - value (top1_agreement), 100 - value (same_top_p); the noise allowance is {NOISE_RELATIVE:e} of it and a claim whose half_unit exceeds {IMPRECISE_RELATIVE} of it is imprecise"
            ),
        ),
        (
            "reproduced".to_owned(),
            "same lane, same token stream and sample, a clean lint, passing sanity gates, a reference that is the weights or an artifact signed by a trusted key, and |rerun - claim| within the tolerance".to_owned(),
        ),
    ])
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Tool {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Checkpoint {
    pub path: String,
    pub root_sha256: String,
    pub files: Vec<CheckpointFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CheckpointFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CardRecord {
    pub path: String,
    /// Canonical digest of the card's `fidelity` block (binds the report to the card judged).
    pub fidelity_sha256: Option<String>,
    /// Canonical digest of the card's whole `model-index` (`null`: it has none), the numbers the
    /// Hub shows beside the claims, bound like the fidelity block.
    #[serde(default)]
    pub model_index_sha256: Option<String>,
    /// The card's `fidelity` block as read (any shape: a card that breaks the schema is judged
    /// too).
    pub disclosure: Value,
    pub lint: LintRecord,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct LintRecord {
    pub errors: usize,
    pub warnings: usize,
    pub findings: Vec<FindingRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FindingRecord {
    pub code: String,
    pub severity: String,
    pub message: String,
    pub line: Option<usize>,
}

/// A Hub source of the verification and its commit.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HubSource {
    pub role: Role,
    pub repo: String,
    pub revision: String,
    pub commit: String,
}

impl HubSource {
    pub fn of(role: Role, pin: &HubPin) -> HubSource {
        HubSource {
            role,
            repo: pin.repo.clone(),
            revision: pin.revision.clone(),
            commit: pin.commit.clone(),
        }
    }
}

impl Report {
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a report serializes")
    }
}

/// `verify` of a card that lists many files (`fidelity.files`), as `--json` prints it: each
/// file's verdict and where its report set is (one set per file, `--out/<file>/`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[schemars(title = "cardproof verification of a card's files v1")]
pub struct FilesSummary {
    pub schema_version: crate::schema::SchemaVersion,
    /// `reproduced` only when every file's verdict is (else the worst, as for claims).
    pub verdict: Verdict,
    pub files: Vec<FileOutcome>,
}

/// One listed file's verification.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileOutcome {
    /// The file, as `fidelity.files` names it.
    pub file: String,
    pub verdict: Verdict,
    /// Claims per verdict.
    pub summary: BTreeMap<String, usize>,
    /// The verified file's root digest (`cardproof hash FILE`).
    pub root_sha256: String,
    /// The report set's directory.
    pub out: String,
}

impl FilesSummary {
    pub fn of<'r>(
        files: impl IntoIterator<Item = (String, &'r Report, std::path::PathBuf)>,
    ) -> Self {
        let files: Vec<FileOutcome> = files
            .into_iter()
            .map(|(file, r, out)| FileOutcome {
                file,
                verdict: r.verdict,
                summary: r.summary.clone(),
                root_sha256: r.checkpoint.root_sha256.clone(),
                out: out.display().to_string(),
            })
            .collect();
        FilesSummary {
            schema_version: crate::schema::SchemaVersion,
            verdict: super::claims::worst(files.iter().map(|f| f.verdict)),
            files,
        }
    }
}
