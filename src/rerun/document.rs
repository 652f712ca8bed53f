//! `measurement.json` as types: what was measured (the two models' identities, the eval text,
//! the protocol with its digest), where and how (the environment), the per-run statistics, and
//! the ready `fidelity:` block for the card. The file is the serialization of [`Measurement`];
//! `card`, `verify` and the printer read it back into the same type. Its JSON Schema
//! (`schema/measurement-v1.schema.json`) is generated from these types.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::disclosure::{self, CheckpointFormat, ResultClaim, Sha256, WeightDtype};
use crate::error::{Error, Result};
use crate::kld::protocol::{Bootstrap, Bos, Direction, Positions, VocabMode, sha256_of};
use crate::kld::stats::Summary;

/// One measurement: `measurement.json`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "cardproof measurement v1")]
pub struct Measurement {
    /// Version of the document's shape (1); reading refuses another.
    pub schema_version: crate::schema::SchemaVersion,
    /// The output set this document belongs to (see `.cardproof-set.json`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub protocol: RunProtocol,
    /// SHA-256 of the protocol's canonical JSON (keys sorted, no whitespace).
    pub protocol_sha256: String,
    pub reference: ModelRecord,
    pub candidate: ModelRecord,
    pub eval: EvalRecord,
    pub environment: Environment,
    /// One per context length.
    pub runs: Vec<RunRecord>,
    /// Every statistic's definition, by name, in reading order.
    pub definitions: serde_json::Map<String, Value>,
    /// A ready `fidelity:` block for the card (`cardproof card` adds what a local run cannot
    /// know: repositories and revisions, quantization, calibration).
    pub fidelity: FidelityDraft,
}

/// Every setting that changes a number of this measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunProtocol {
    pub direction: Direction,
    pub units: String,
    pub vocab: VocabMode,
    /// Logit entries beyond the tokenizer's vocabulary: `excluded` (left out), `included`, or
    /// `none` (the rows have no padding).
    pub padding: Padding,
    /// Logit entries used per row.
    pub vocab_size: usize,
    pub positions: Positions,
    pub llamacpp_compat: bool,
    pub aggregation: String,
    pub bootstrap: Bootstrap,
    /// Bootstrap blocks: `window`, or `run:<rows>` inside one long window.
    pub bootstrap_block: String,
    pub top1: String,
    pub context_lengths: Vec<usize>,
    pub bos: Bos,
    pub windows: String,
}

impl RunProtocol {
    /// `protocol_sha256`: the digest of the canonical JSON of the protocol.
    pub fn sha256(&self) -> String {
        sha256_of(&self.to_value())
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a protocol serializes")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Padding {
    Excluded,
    Included,
    None,
}

impl Padding {
    /// The padding policy of `used` entries out of rows `width` wide, `known` of them tokens.
    pub fn of(used: usize, known: usize, width: usize) -> Padding {
        if used < width {
            Padding::Excluded
        } else if known < width {
            Padding::Included
        } else {
            Padding::None
        }
    }
}

/// Identity of one model as measured.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ModelRecord {
    pub path: String,
    pub format: String,
    /// Root digest of the checkpoint's files (`cardproof hash`); empty when not known.
    pub manifest_sha256: String,
    pub lm_head_sha256: String,
    pub stored_dtype: String,
    /// What the runner reports about the loaded model (its own record, kept as given).
    pub runner: Value,
    /// The Hub commit the files came from, for an `hf:` source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<HubPin>,
}

pub use crate::hub::HubPin;

/// The eval text and its tokens.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EvalRecord {
    /// The text file as given (`null`: the tokens came from a reference artifact alone).
    pub text_path: Option<String>,
    pub text_sha256: String,
    pub text_bytes: u64,
    pub tokens_sha256: String,
    pub token_count: usize,
    pub bos: Bos,
    /// For a conversation eval text: how it was rendered and what it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<crate::conversation::eval::ConversationRecord>,
}

/// Where and how the numbers were computed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Environment {
    /// `native`, `transformers` or `llamacpp`.
    pub runner: RunnerKind,
    pub runner_version: String,
    pub engine: String,
    pub engine_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    pub device: String,
    pub compute_dtype: String,
    pub attention: String,
    pub kv_cache_dtype: Option<String>,
    /// How the candidate's KV cache was rounded, when a scheme was set (K and V, granularity,
    /// scale source, rotation, semantics); absent: the model dtype, or a record that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<crate::disclosure::kv_cache::KvCache>,
    /// The candidate's computed per-tensor KV-cache scales, where `kv_cache.scale_source` is
    /// `computed`: the tokens they came from and each attention layer's pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_scales: Option<crate::disclosure::kv_cache::ComputedKvScales>,
    /// The dtype the candidate's carried recurrent (Gated DeltaNet) state was kept in (`f32`,
    /// `bf16`, `f16`; native runner; absent in records that predate it and for transformers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recurrent_state_dtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulate: Option<crate::runner::native::Emulate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tf32: Option<bool>,
    /// The lane in words: what the numbers' numerics are.
    pub lane: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<TokenizerRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_artifact: Option<ArtifactRecord>,
    /// The kernels and state dtypes of the candidate's linear-attention (Gated DeltaNet)
    /// layers as the transformers runner observed them (absent: no such layers, or another
    /// runner); the reference's when the candidate has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_attention: Option<crate::runner::exchange::LinearAttentionKernels>,
    /// The reference's, where they differ from `linear_attention`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_linear_attention: Option<crate::runner::exchange::LinearAttentionKernels>,
    /// The transformers runner's own report (versions, GPUs, models), kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformers_runner: Option<crate::runner::exchange::RunnerEnvironment>,
    /// How both models ran in llama.cpp (`runner: llamacpp`): the build, each side's flags and
    /// what its log says it did, and the printout gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llamacpp: Option<crate::runner::llamacpp::LlamacppRecord>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunnerKind {
    Native,
    Transformers,
    /// The user's `llama-perplexity`, both models.
    Llamacpp,
}

impl RunnerKind {
    /// The name, as `--runner` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerKind::Native => "native",
            RunnerKind::Transformers => "transformers",
            RunnerKind::Llamacpp => "llamacpp",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TokenizerRecord {
    pub path: String,
    pub sha256: String,
    pub vocab_size: usize,
}

/// The reference artifact or llama.cpp base file that stood in for the reference model.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ArtifactRecord {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// `hidden`, `top_k` or `llamacpp_base`.
    pub kind: String,
    /// What the artifact's KL is: full vocabulary, a lower bound, or llama.cpp's 16-nat window.
    pub bound: String,
    /// Who vouches for the artifact (a trusted signer, or nobody: self-asserted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vouch: Option<super::artifact::Vouch>,
    /// A seeded sample of its rows recomputed from the reference's weights, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot_check: Option<super::artifact::SpotCheck>,
}

/// One context length's statistics.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RunRecord {
    pub context_length: usize,
    pub n_windows: usize,
    pub dropped_tokens: usize,
    pub n_positions: usize,
    pub n_nonfinite: usize,
    pub bootstrap_block: String,
    #[serde(flatten)]
    pub summary: Summary,
    /// For a conversation eval text: the rows by segment, by role and inside/outside tool
    /// calls, each summarized as the run is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spans: Vec<super::spans::SpanSummary>,
}

/// The ready `fidelity:` block: the disclosure's own types for every section a measurement
/// knows; the reference and candidate only with what a local run knows (their Hub repository and
/// commit when they came from the Hub).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FidelityDraft {
    pub schema: String,
    pub reference: DraftReference,
    pub candidate: DraftCandidate,
    pub runtime: disclosure::Runtime,
    pub eval: disclosure::Eval,
    pub protocol: disclosure::Protocol,
    pub results: Vec<ResultClaim>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DraftReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    pub format: CheckpointFormat,
    pub dtype: WeightDtype,
    /// Absent when the reference's files were not measured (a llama.cpp base file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_sha256: Option<Sha256>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DraftCandidate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    pub files_sha256: Sha256,
    /// The measured file's name when the candidate was one file (a GGUF), not a directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

impl Measurement {
    /// Read `measurement.json` (as `cardproof measure` or `verify` wrote it).
    pub fn read(path: &Path) -> Result<Measurement> {
        let bytes = crate::files::read_capped(path, MAX_MEASUREMENT_BYTES, "a measurement")?;
        Measurement::from_slice(path, &bytes)
    }

    pub fn from_slice(path: &Path, bytes: &[u8]) -> Result<Measurement> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let at = e.path().to_string();
            Error::format(
                path,
                (at != ".").then_some(at.as_str()),
                format!(
                    "is not a measurement.json that this cardproof writes: {}",
                    e.into_inner()
                ),
            )
        })
    }

    /// The document as JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a measurement serializes")
    }

    /// The run at a context length.
    pub fn run(&self, context_length: usize) -> Option<&RunRecord> {
        self.runs
            .iter()
            .find(|r| r.context_length == context_length)
    }

    /// Record the Hub commits the models came from: beside each identity and as the draft's
    /// repository and revision.
    pub fn pin(&mut self, role: Role, pin: &HubPin) {
        match role {
            Role::Reference => {
                self.reference.hub = Some(pin.clone());
                self.fidelity.reference.repo = Some(pin.repo.clone());
                self.fidelity.reference.revision = Some(pin.commit.clone());
            }
            Role::Candidate => {
                self.candidate.hub = Some(pin.clone());
                self.fidelity.candidate.repo = Some(pin.repo.clone());
                self.fidelity.candidate.revision = Some(pin.commit.clone());
            }
        }
    }
}

/// Which model of a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Reference,
    Candidate,
}

/// A measurement.json is refused beyond this size (its rows live in positions.safetensors).
pub const MAX_MEASUREMENT_BYTES: u64 = 64 * 1024 * 1024;
