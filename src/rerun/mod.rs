//! One rerun path: a [`Request`] (a [`Lane`], the candidate, the eval text and the run options)
//! goes in, one [`Rerun`] comes out: the typed [`Measurement`] (`measurement.json`), the scored
//! rows, and the sanity gates when asked. `measure`, `verify`, the sweep and `reference export`
//! all run through here, so every lane records the same identity, environment and statistics
//! and every lane's gates come from [`gates`].
//!
//! Before any lane loads a model, [`preflight`] checks everything that needs no forward pass
//! (tokenizers, text, positions, bootstrap blocks, output paths, the reference's digest).
//!
//! Inside, the layers run one way: [`options`] (run options and the one conversion from and to
//! the card's protocol) → [`document`] (the measurement's types) → [`score`] (windows to rows
//! to statistics) → [`artifact`] (reference artifacts and llama.cpp base files as reference
//! runners) → [`lane`] (one engine: a reference source and candidate runners) → [`sweep`],
//! [`export`].

pub mod artifact;
pub mod document;
pub(crate) mod environment;
pub mod export;
pub mod from_log;
pub mod gates;
pub(crate) mod identity;
pub(crate) mod lane;
pub mod llamacpp;
pub mod options;
pub mod output;
pub mod preflight;
pub mod record;
pub mod score;
pub mod spans;
pub mod spec;
pub mod study;
pub mod sweep;
pub mod turns;

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use document::{HubPin, Measurement, Role};
pub use options::{MeasureOptions, Resolved};
pub use score::{Progress, RunResult};
pub use spec::{MeasureSpec, ReferenceSpec, RunnerSpec};

use crate::checkpoint::hash::Manifest;
use crate::error::Result;
use crate::runner::native::{ComputeDtype, Emulate, StateDtype};

/// Where the reference's logits come from, and how the candidate runs.
#[derive(Debug, Clone, Copy)]
pub enum Lane<'a> {
    /// Both models in pure Rust on the CPU.
    Native {
        reference: &'a Path,
        compute: ComputeDtype,
        emulate: Emulate,
    },
    /// Both models in transformers on the user's GPU (a Python subprocess).
    Transformers {
        reference: &'a Path,
        runner: &'a crate::runner::transformers::TransformersOptions,
    },
    /// A compact reference artifact (`cardproof reference export`) as the reference, vouched
    /// for by its signer; the candidate native.
    ReferenceArtifact {
        source: artifact::ArtifactSource<'a>,
        compute: ComputeDtype,
        emulate: Emulate,
    },
    /// Both models in the user's `llama-perplexity` (GGUF files).
    Llamacpp {
        reference: &'a Path,
        runner: &'a crate::runner::llamacpp::LlamacppOptions,
    },
    /// A llama.cpp `--kl-divergence-base` file as the reference, vouched for by its signer;
    /// the candidate native.
    LlamacppBase {
        source: artifact::ArtifactSource<'a>,
        compute: ComputeDtype,
        emulate: Emulate,
    },
}

impl<'a> Lane<'a> {
    /// The lane for a reference artifact file: a llama.cpp base file or cardproof's own.
    pub fn artifact(
        source: artifact::ArtifactSource<'a>,
        compute: ComputeDtype,
        emulate: Emulate,
    ) -> Lane<'a> {
        if crate::kld::source::is_llamacpp_base(source.file) {
            Lane::LlamacppBase {
                source,
                compute,
                emulate,
            }
        } else {
            Lane::ReferenceArtifact {
                source,
                compute,
                emulate,
            }
        }
    }
}

/// One rerun.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub lane: Lane<'a>,
    pub candidate: &'a Path,
    /// The eval text (optional with a reference artifact, which carries its tokens; checked
    /// against it when given).
    pub eval_text: Option<&'a Path>,
    /// A tokenizer to use instead of the reference's.
    pub tokenizer: Option<&'a Path>,
    /// Where a conversation eval text's chat template comes from (plain text ignores it).
    pub chat_template: crate::runner::tokens::ChatTemplateChoice,
    pub options: MeasureOptions,
    /// Score every logit entry, padding included (the card says `padding: included`): the
    /// vocabulary size is the models' logit width, known once they are loaded.
    pub padding_included: bool,
    /// Threads for hashing the checkpoints.
    pub threads: usize,
    /// The candidate's manifest when the caller has hashed it already.
    pub candidate_manifest: Option<&'a Manifest>,
    /// The reference's manifest when the caller has hashed it already (a study's plan): the
    /// pre-flight takes it instead of hashing the reference again.
    pub reference_manifest: Option<&'a Manifest>,
    /// Run the sanity gates, with what they need from the card.
    pub gates: Option<GateRequest>,
    /// Also measure the reference against itself in a second compute dtype (native lane).
    pub noise_floor: bool,
    /// The Hub commits the models came from, recorded in the measurement.
    pub pins: Vec<(Role, HubPin)>,
    /// The dtype the candidate's recurrent (Gated DeltaNet) state is kept in, emulating an
    /// engine's SSM-state dtype (native lanes; the reference keeps f32; dense models have no
    /// such state). The transformers lane runs its own state (fp32) and refuses another.
    pub recurrent_state: StateDtype,
    /// The candidate's KV-cache schemes (`--kv-cache`; native lanes, write-then-read), replacing
    /// what its checkpoint declares; `None`: as declared. The reference keeps its own.
    pub kv_cache: Option<crate::runner::native::kv_cache::KvCacheSetting>,
    /// The reference's KV-cache schemes: set only by a `kv_cache` sweep, whose baseline is the
    /// reference (native lanes); `None`: as its checkpoint declares.
    pub reference_kv_cache: Option<crate::runner::native::kv_cache::KvCacheSetting>,
    /// Also generate every assistant turn of the conversation eval text with both models and
    /// judge their tool calls ([`turns`]); `None`: the scored rows only.
    pub turns: Option<turns::TurnProtocol>,
    /// The conversation file the turns come from, where it is not the eval text (the llama.cpp
    /// runner scores a plain-text eval text).
    pub turns_conversation: Option<&'a Path>,
}

/// What the sanity gates need from outside the run.
#[derive(Debug, Clone, Default)]
pub struct GateRequest {
    /// The quantization method the card declares (`None`: it declares none).
    pub declared: Option<String>,
    /// The candidate's headers say it holds quantized tensors (for lanes that do not load it).
    pub checkpoint_quantized: bool,
    /// Per context length, the rows the card says were left out as non-finite.
    pub disclosed_nonfinite: Vec<(u64, Option<u64>)>,
}

/// A finished rerun.
#[derive(Debug, Clone)]
pub struct Rerun {
    pub measurement: Measurement,
    /// Every run with its scored rows (positions.safetensors, the report's plots).
    pub runs: Vec<RunResult>,
    /// The sanity gates (empty when not asked for).
    pub gates: Vec<gates::Gate>,
    /// The reference against itself, when asked for.
    pub noise_floor: Option<NoiseFloor>,
}

/// The reference against itself: the smallest KL this lane can show.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum NoiseFloor {
    Measured {
        what: String,
        runs: Vec<NoiseFloorRun>,
    },
    Skipped {
        skipped: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NoiseFloorRun {
    pub context_length: usize,
    #[serde(deserialize_with = "crate::json_f64::map")]
    #[schemars(with = "std::collections::BTreeMap<String, Option<f64>>")]
    pub metrics: std::collections::BTreeMap<String, f64>,
}

/// Run one rerun in its lane, its [`preflight`] first. Fails closed: any problem is an `Err`,
/// never a partial result.
pub fn run(r: &Request, stage: &(dyn Fn(&str) + Sync), progress: Progress) -> Result<Rerun> {
    let pre = preflight::check_deferring_digest(r, stage)?;
    run_checked(r, pre, stage, progress)
}

/// Run one rerun whose [`preflight::check`] the caller has run (to print its warnings or
/// compare its identities first); `pre` must be that request's.
pub fn run_checked(
    r: &Request,
    pre: preflight::Preflight,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<Rerun> {
    r.options.check()?;
    let arms = lane::Arms {
        requests: std::slice::from_ref(r),
        names: &[],
        kernels: &[],
        reference_compute: None,
        pass: lane::Pass::Streamed,
        carry: None,
    };
    let outcome = lane::run(&arms, pre, stage, &|_, done, total| progress(done, total))?;
    outcome
        .arms
        .into_iter()
        .next()
        .map(|arm| arm.rerun)
        .ok_or_else(|| crate::Error::internal(r.candidate, "a rerun scored no arm"))
}
