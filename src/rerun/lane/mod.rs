//! One lane engine. A rerun is a [`ReferenceSource`] (where the reference's rows come from: a
//! checkpoint the native runner loads, a signed reference artifact, a llama.cpp base file, or a
//! checkpoint an engine runs beside its candidates) and a [`CandidateRunner`] (what runs the
//! candidates: native, transformers, llama.cpp), both chosen once from the request's lane in
//! [`run`]. A study is N candidates against one reference pass; a single rerun is N = 1, its
//! reference's rows streamed beside the candidate's instead of kept ([`Pass`]).
//!
//! Every arm comes back from its runner as a [`Scored`] and is recorded here, the same way in
//! every lane: its measurement document, the finite-rows gate, its Hub pins.

mod artifact;
mod native;
mod reference;
mod transformers;

use std::path::Path;

use super::document::{ArtifactRecord, Environment, ModelRecord, TokenizerRecord};
use super::gates::{self, Gate, Measured};
use super::preflight::Preflight;
use super::score::{self, EvalInput, Scoring};
use super::{GateRequest, Lane, NoiseFloor, Request, Rerun, record};
use crate::error::{Error, Result};
use crate::runner::Runner;
use crate::runner::native::{ComputeDtype, NativeModel};

pub(crate) use reference::EngineReference;

pub(super) type Stage<'a> = &'a (dyn Fn(&str) + Sync);

/// `progress(arm, done, total)`: arm 0 is a kept reference pass, arm i the i-th candidate's.
pub(super) type ArmProgress<'a> = &'a (dyn Fn(usize, usize, usize) + Sync);

/// How the reference's rows reach the candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// One candidate; the reference's rows are computed beside its own and dropped (a single
    /// rerun: nothing held but the window in flight).
    Streamed,
    /// The reference once, kept; each candidate in turn against it (a study: N arms cost N + 1
    /// passes, where the engine allows).
    Kept,
}

/// What a lane runs: the arms' requests (sharing the first one's reference, eval text and
/// options), their names and attentions (a study's), and how the reference's rows are shared.
pub(crate) struct Arms<'r, 'a> {
    pub requests: &'r [Request<'a>],
    pub names: &'r [String],
    /// Each arm's attention (the transformers runner's study arms).
    pub attentions: &'r [String],
    /// The reference's compute dtype for a native checkpoint (`None`: the lane's).
    pub reference_compute: Option<ComputeDtype>,
    pub pass: Pass,
}

impl Arms<'_, '_> {
    pub(super) fn first(&self) -> Result<&Request<'_>> {
        self.requests
            .first()
            .ok_or_else(|| Error::internal(Path::new("study"), "a rerun without a candidate"))
    }

    /// The stage line of arm `i`'s turn: its name in a study, `single` alone otherwise.
    pub(super) fn stage(&self, i: usize, what: &str, single: &str) -> String {
        match self.pass {
            Pass::Streamed => single.to_owned(),
            Pass::Kept => {
                let name = self.names.get(i).map_or("?", String::as_str);
                format!("arm {}/{} {name}{what}", i + 1, self.requests.len())
            }
        }
    }
}

/// Where the reference's rows come from, prepared before any candidate runs (read, vouched
/// for, loaded, hashed). An in-process source gives a native candidate its rows through
/// [`ReferenceSource::bind`]; a checkpoint an engine runs itself is an [`EngineReference`].
pub(crate) trait ReferenceSource: Sync {
    /// This reference for a loaded native candidate: the checks that need the candidate (its
    /// width, an artifact's protocol and output head), then the rows and what the scoring
    /// reads. `None`: a kept pass before any candidate loads (a checkpoint reference only).
    fn bind<'s>(
        &'s self,
        candidate: Option<&'s NativeModel>,
        request: &Request,
        stage: Stage,
    ) -> Result<Bound<'s>>;

    /// The checkpoint an engine runs as the reference (transformers, llama.cpp).
    fn engine(&self) -> Option<&EngineReference<'_>> {
        None
    }

    /// The reference against itself, where this source has a measure of its own noise.
    fn noise_floor(&self, _bound: &Bound) -> Result<Option<NoiseFloor>> {
        Ok(None)
    }

    /// After every forward pass: the reference's weights are still the files that were hashed.
    fn check_unchanged(&self) -> Result<()> {
        Ok(())
    }
}

/// The reference's rows: a model the source holds, or a runner built for one candidate.
pub(crate) enum Rows<'s> {
    Held(&'s dyn Runner),
    Built(Box<dyn Runner + 's>),
}

impl Rows<'_> {
    pub fn get(&self) -> &dyn Runner {
        match self {
            Rows::Held(r) => *r,
            Rows::Built(r) => r.as_ref(),
        }
    }
}

/// An in-process reference bound to its candidate.
pub(crate) struct Bound<'s> {
    pub rows: Rows<'s>,
    pub eval: EvalInput<'s>,
    /// The run's options, the vocabulary padded to the logit width when the card says so.
    pub options: super::MeasureOptions,
    /// The reference holds every row of a window (a checkpoint), not only the scored ones (an
    /// artifact): the gates compare every row.
    pub every_row: bool,
    /// What the measurement names as the eval text, where not the scoring's text path: the
    /// text given beside an artifact, or none for a base file's tokens.
    pub text_path: Option<Option<String>>,
    pub recorded: ReferenceRecord,
}

/// What the measurement records of a bound reference.
pub(crate) struct ReferenceRecord {
    /// The reference's model record.
    pub model: ModelRecord,
    /// The tokenizer the tokens came from, for the environment record.
    pub tokenizer: Option<TokenizerRecord>,
    /// The artifact or base file the rows came from, for the environment record.
    pub artifact: Option<ArtifactRecord>,
}

/// What runs the candidates.
pub(crate) trait CandidateRunner {
    /// Score every arm against `reference`, in the arms' order.
    fn run(
        &self,
        reference: &dyn ReferenceSource,
        arms: &Arms,
        stage: Stage,
        progress: ArmProgress,
    ) -> Result<Runs>;
}

/// One arm scored by its runner, before it is recorded.
pub(crate) struct Scored {
    pub scoring: Scoring,
    pub options: super::MeasureOptions,
    pub reference: ModelRecord,
    pub candidate: ModelRecord,
    pub environment: Environment,
    pub gates: Vec<Gate>,
    pub noise_floor: Option<NoiseFloor>,
    /// Per run, per window, each scored row's record (a study pairs its arms on them; empty
    /// for a streamed pass).
    pub records: score::PerRun,
    pub seconds: f64,
}

/// Every arm scored, and the seconds of a kept reference pass (`None`: the reference ran
/// beside each arm).
pub(crate) struct Runs {
    pub reference_seconds: Option<f64>,
    pub arms: Vec<Scored>,
}

/// One arm of a study, measured against the study's reference pass: its rerun, each row's
/// record (for paired comparisons), and the seconds its pass took.
pub struct ArmOutcome {
    pub rerun: Rerun,
    pub records: score::PerRun,
    pub seconds: f64,
}

/// A lane's runs: the reference's identity and pass time, and each arm's outcome.
pub struct ArmsOutcome {
    pub reference: ModelRecord,
    /// `None`: the reference ran beside each arm.
    pub reference_seconds: Option<f64>,
    pub arms: Vec<ArmOutcome>,
}

/// Run `arms` in their lane (the first request's; every request's is the same kind): the
/// reference source and candidate runner chosen, every arm scored and recorded.
pub(super) fn run(
    arms: &Arms,
    mut pre: Preflight,
    stage: Stage,
    progress: ArmProgress,
) -> Result<ArmsOutcome> {
    let first = arms.first()?;
    let (reference, runner): (Box<dyn ReferenceSource + '_>, Box<dyn CandidateRunner + '_>) =
        match first.lane {
            Lane::Native {
                reference,
                compute,
                emulate,
            } => (
                Box::new(reference::CheckpointReference::load(
                    first,
                    &mut pre,
                    reference,
                    (arms.reference_compute.unwrap_or(compute), emulate),
                    arms.pass,
                    stage,
                )?),
                Box::new(native::NativeCandidates),
            ),
            Lane::ReferenceArtifact { source, .. } => (
                Box::new(artifact::ArtifactReference::open(first, &mut pre, source)?),
                Box::new(native::NativeCandidates),
            ),
            Lane::LlamacppBase { source, .. } => (
                Box::new(artifact::BaseFileReference::open(first, &mut pre, source)?),
                Box::new(native::NativeCandidates),
            ),
            Lane::Transformers { reference, runner } => (
                Box::new(EngineReference::new(first, pre, reference)),
                Box::new(transformers::TransformersCandidates(runner)),
            ),
            Lane::Llamacpp { reference, .. } => (
                Box::new(EngineReference::new(first, pre, reference)),
                Box::new(super::llamacpp::LlamacppCandidates),
            ),
        };
    let runs = runner.run(reference.as_ref(), arms, stage, progress)?;
    if runs.arms.len() != arms.requests.len() {
        return Err(Error::internal(
            first.candidate,
            format!(
                "the runner scored {} arms of {}",
                runs.arms.len(),
                arms.requests.len()
            ),
        ));
    }
    let reference_record = runs
        .arms
        .first()
        .map(|a| a.reference.clone())
        .ok_or_else(|| Error::internal(first.candidate, "a rerun scored no arm"))?;
    Ok(ArmsOutcome {
        reference: reference_record,
        reference_seconds: runs.reference_seconds,
        arms: arms
            .requests
            .iter()
            .zip(runs.arms)
            .map(|(r, scored)| recorded(r, scored))
            .collect(),
    })
}

/// An arm's outcome as every lane records it: the measurement document of its scoring, its
/// runner's gates then the finite-rows gate (when asked), its Hub pins.
fn recorded(r: &Request, s: Scored) -> ArmOutcome {
    let mut rerun = Rerun {
        measurement: record::measurement(
            &s.scoring,
            &s.options,
            s.reference,
            s.candidate,
            s.environment,
        ),
        runs: s.scoring.runs,
        gates: s.gates,
        noise_floor: s.noise_floor,
    };
    if let Some(g) = &r.gates {
        rerun.gates.push(finite_rows(&rerun, g));
    }
    for (role, pin) in &r.pins {
        rerun.measurement.pin(*role, pin);
    }
    ArmOutcome {
        rerun,
        records: s.records,
        seconds: s.seconds,
    }
}

/// Non-finite rows in the rerun against what the card disclosed, per context length.
fn finite_rows(rerun: &Rerun, g: &GateRequest) -> Gate {
    gates::finite_rows(
        &rerun
            .runs
            .iter()
            .map(|run| {
                let length = run.context_length as u64;
                let disclosed = g
                    .disclosed_nonfinite
                    .iter()
                    .find(|(l, _)| *l == length)
                    .and_then(|(_, n)| *n);
                (length, run.n_nonfinite as u64, disclosed)
            })
            .collect::<Vec<_>>(),
    )
}

/// The eval text, tokenizer and tokens a lane that tokenizes needs, from its pre-flight.
fn tokenized<'a>(
    r: &Request<'a>,
    pre: &mut Preflight,
) -> Result<(
    &'a Path,
    crate::runner::tokens::TokenizerFile,
    crate::runner::tokens::TokenStream,
)> {
    match (r.eval_text, pre.tokenized.take()) {
        (Some(text), Some((tokenizer, stream))) => Ok((text, tokenizer, stream)),
        _ => Err(Error::internal(
            r.candidate,
            "the lane was started without its pre-flight's eval text and tokens",
        )),
    }
}

/// The run's options with the vocabulary as wide as the logit rows when the card includes
/// padding.
fn with_padding(r: &Request, width: usize) -> super::MeasureOptions {
    let mut o = r.options.clone();
    if r.padding_included {
        o.vocab_size = Some(width);
    }
    o
}

/// The gates' view of a scoring's first run.
fn measured(s: &Scoring, quantized: bool, g: &GateRequest) -> Measured {
    Measured::of_metrics(
        s.runs.first().map(|r| &r.summary.metrics),
        quantized,
        g.declared.clone(),
    )
}
