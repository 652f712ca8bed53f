//! What a rerun is asked to do, resolved once: [`RunnerSpec`] (which runner runs the models,
//! from the flags and, in `verify`, the card's runtime) and [`MeasureSpec`] (a whole `measure`).
//! The lane is chosen here and only here ([`RunnerSpec::lane`]); `measure`, `verify`, the sweep
//! and `study` each resolve a spec and ask it for their lanes, and a [`Request`] starts from
//! [`Request::new`]'s defaults, so no caller assembles one field by field.

use std::path::{Path, PathBuf};

use super::artifact::ArtifactSource;
use super::options::MeasureOptions;
use super::{HubPin, Lane, Measurement, Progress, Request, Role};
use crate::error::{Error, Result};
use crate::runner::llamacpp::LlamacppOptions;
use crate::runner::native::kv_cache::KvCacheSetting;
use crate::runner::native::{ComputeDtype, Emulate, StateDtype};
use crate::runner::tokens::ChatTemplateChoice;
use crate::runner::transformers::TransformersOptions;

/// Which runner runs the models: the candidate always, and the reference when it is a
/// checkpoint (a reference artifact or llama.cpp base file brings its own logits, and its
/// candidate runs natively).
#[derive(Debug, Clone)]
pub enum RunnerSpec {
    /// Pure Rust on the CPU, in `compute` and the `emulate` lane.
    Native {
        compute: ComputeDtype,
        emulate: Emulate,
    },
    /// transformers on the user's GPU (a Python subprocess).
    Transformers(TransformersOptions),
    /// The user's `llama-perplexity` (GGUF files).
    Llamacpp(LlamacppOptions),
}

/// Where the reference's logits come from.
#[derive(Clone, Copy)]
pub enum ReferenceSpec<'a> {
    /// A checkpoint, run by the spec's runner.
    Checkpoint(&'a Path),
    /// A reference artifact or llama.cpp base file, vouched for by its signer.
    Artifact(ArtifactSource<'a>),
}

impl RunnerSpec {
    /// The runner the flags ask for: llama.cpp, else transformers, else native (the binary's
    /// config has refused asking for both).
    pub fn from_flags(
        transformers: Option<TransformersOptions>,
        llamacpp: Option<LlamacppOptions>,
        compute: ComputeDtype,
        emulate: Emulate,
    ) -> RunnerSpec {
        match (llamacpp, transformers) {
            (Some(l), _) => RunnerSpec::Llamacpp(l),
            (None, Some(t)) => RunnerSpec::Transformers(t),
            (None, None) => RunnerSpec::Native { compute, emulate },
        }
    }

    /// The lane: this runner against `reference`. An artifact's candidate runs natively, so an
    /// artifact with another runner is refused (the binary's config refuses it first).
    pub fn lane<'a>(&'a self, reference: ReferenceSpec<'a>) -> Result<Lane<'a>> {
        match (reference, self) {
            (ReferenceSpec::Checkpoint(reference), _) => Ok(self.checkpoint_lane(reference)),
            (ReferenceSpec::Artifact(source), RunnerSpec::Native { compute, emulate }) => {
                Ok(Lane::artifact(source, *compute, *emulate))
            }
            (ReferenceSpec::Artifact(source), _) => Err(Error::usage(
                source.file,
                "a reference artifact's candidate runs in the native runner; leave --runner out",
            )),
        }
    }

    /// The lane: this runner on both the `reference` checkpoint and the candidate.
    pub fn checkpoint_lane<'a>(&'a self, reference: &'a Path) -> Lane<'a> {
        match self {
            RunnerSpec::Native { compute, emulate } => Lane::Native {
                reference,
                compute: *compute,
                emulate: *emulate,
            },
            RunnerSpec::Transformers(runner) => Lane::Transformers { reference, runner },
            RunnerSpec::Llamacpp(runner) => Lane::Llamacpp { reference, runner },
        }
    }

    pub fn transformers(&self) -> Option<&TransformersOptions> {
        match self {
            RunnerSpec::Transformers(t) => Some(t),
            _ => None,
        }
    }

    pub fn llamacpp(&self) -> Option<&LlamacppOptions> {
        match self {
            RunnerSpec::Llamacpp(l) => Some(l),
            _ => None,
        }
    }

    /// The native runner's compute dtype (f32 for the other runners, which keep their own).
    pub fn compute(&self) -> ComputeDtype {
        match self {
            RunnerSpec::Native { compute, .. } => *compute,
            _ => ComputeDtype::F32,
        }
    }
}

impl<'a> Request<'a> {
    /// A request for `candidate` in `lane` with nothing else asked: no gates, no noise floor,
    /// no pins, the checkpoints' own KV caches and an f32 recurrent state, the tokenizer and
    /// chat template of the reference. Callers set what they ask for on top.
    pub fn new(
        lane: Lane<'a>,
        candidate: &'a Path,
        eval_text: Option<&'a Path>,
        options: MeasureOptions,
        threads: usize,
    ) -> Request<'a> {
        Request {
            lane,
            candidate,
            eval_text,
            tokenizer: None,
            chat_template: ChatTemplateChoice::default(),
            options,
            padding_included: false,
            threads,
            candidate_manifest: None,
            reference_manifest: None,
            gates: None,
            noise_floor: false,
            pins: Vec::new(),
            recurrent_state: StateDtype::F32,
            kv_cache: None,
            reference_kv_cache: None,
            turns: None,
            turns_conversation: None,
        }
    }
}

/// A whole `measure`: the models, the text, the protocol and the runner, as the flags gave them.
#[derive(Debug, Clone)]
pub struct MeasureSpec {
    pub reference: Option<PathBuf>,
    /// `--reference-artifact`: a reference artifact or llama.cpp base file.
    pub reference_artifact: Option<PathBuf>,
    pub candidate: PathBuf,
    pub eval_text: Option<PathBuf>,
    pub tokenizer: Option<PathBuf>,
    pub chat_template: ChatTemplateChoice,
    pub options: MeasureOptions,
    pub runner: RunnerSpec,
    /// `--recurrent-state-dtype`.
    pub recurrent_state: StateDtype,
    /// `--kv-cache`, `--kv-cache-k`, `--kv-cache-v`.
    pub kv_cache: Option<KvCacheSetting>,
    /// `--turns`, `--max-new-tokens`: generate every selected assistant turn too.
    pub turns: Option<super::turns::TurnProtocol>,
    /// `--turns-conversation`: the conversation the turns come from (`None`: the eval text).
    pub turns_conversation: Option<PathBuf>,
    pub threads: usize,
}

impl MeasureSpec {
    /// The one rerun request of this spec; `voucher` vouches for a reference artifact.
    pub fn request<'a>(
        &'a self,
        voucher: &'a dyn super::artifact::Voucher,
        pins: Vec<(Role, HubPin)>,
    ) -> Result<Request<'a>> {
        let reference = match &self.reference_artifact {
            Some(file) => ReferenceSpec::Artifact(ArtifactSource {
                file,
                voucher,
                reference: self.reference.as_deref(),
            }),
            None => ReferenceSpec::Checkpoint(self.reference.as_deref().unwrap_or(Path::new("."))),
        };
        let lane = self.runner.lane(reference)?;
        Ok(Request {
            tokenizer: self.tokenizer.as_deref(),
            chat_template: self.chat_template.clone(),
            pins,
            recurrent_state: self.recurrent_state,
            kv_cache: self.kv_cache,
            turns: self.turns,
            turns_conversation: self.turns_conversation.as_deref(),
            ..Request::new(
                lane,
                &self.candidate,
                self.eval_text.as_deref(),
                self.options.clone(),
                self.threads,
            )
        })
    }
}

/// What `measure` asks of the rerun beyond its spec: the voucher for an artifact, the Hub pins,
/// and the hooks the caller watches the run through.
pub struct MeasureHooks<'a> {
    pub voucher: &'a dyn super::artifact::Voucher,
    pub pins: Vec<(Role, HubPin)>,
    /// Told each pre-flight warning.
    pub on_warning: &'a (dyn Fn(&super::preflight::Warning) + Sync),
    pub stage: &'a (dyn Fn(&str) + Sync),
    pub progress: Progress<'a>,
}

/// One `measure` into `set`: the pre-flight (its warnings told), the set's free space checked, the rerun in
/// its lane, the files committed as one unit. Returns the measurement as written.
pub fn measure(
    spec: &MeasureSpec,
    set: crate::outset::OutputSet,
    hooks: MeasureHooks,
) -> Result<Measurement> {
    let request = spec.request(hooks.voucher, hooks.pins)?;
    // Everything that needs no forward pass, before the first one (the native lane's reference
    // digest is taken while the models load: nothing here compares it first).
    let pre = super::preflight::check_deferring_digest(&request, hooks.stage)?;
    for w in &pre.warnings {
        (hooks.on_warning)(w);
    }
    set.check_space(super::output::size_estimate(&request, &pre.identity))?;
    let done = super::run_checked(&request, pre, hooks.stage, hooks.progress)?;
    super::output::commit_into(set, done)
}
