//! The native candidate runner: each candidate loaded in pure Rust on the CPU (its KV cache and
//! recurrent state as asked), scored against a reference source's rows in this process.
//! Streamed, the reference's rows are computed beside the candidate's; kept, the reference runs
//! once over every window and each candidate in turn is measured against what it kept, so N
//! candidates cost N + 1 passes and one candidate is held at a time.

use super::{
    ArmProgress, Arms, Bound, CandidateRunner, Pass, ReferenceRecord, ReferenceSource, Runs,
    Scored, Stage,
};
use crate::error::{Error, Result};
use crate::rerun::document::ModelRecord;
use crate::rerun::environment::native_environment;
use crate::rerun::gates::{self, Gate};
use crate::rerun::identity::{identity_of, root_digest};
use crate::rerun::score::{self, Scoring};
use crate::rerun::{GateRequest, Lane, MeasureOptions, Request};
use crate::runner::native::{self, ComputeDtype, Emulate, NativeModel, StateDtype};
use crate::runner::tokens;

pub(crate) struct NativeCandidates;

impl CandidateRunner for NativeCandidates {
    fn run(
        &self,
        reference: &dyn ReferenceSource,
        arms: &Arms,
        stage: Stage,
        progress: ArmProgress,
    ) -> Result<Runs> {
        match arms.pass {
            Pass::Streamed => {
                let r = arms.first()?;
                let arm = Candidate::load(r, stage, "loading the candidate")?;
                Ok(Runs {
                    reference_seconds: None,
                    arms: vec![streamed(reference, r, arm, stage, &|d, t| {
                        progress(1, d, t)
                    })?],
                })
            }
            Pass::Kept => kept(reference, arms, stage, progress),
        }
    }
}

/// A loaded candidate with its identity, and the native lane's settings it ran in.
struct Candidate {
    model: NativeModel,
    record: ModelRecord,
    compute: ComputeDtype,
    emulate: Emulate,
}

impl Candidate {
    /// The candidate of a native-lane request (its recurrent state in the request's dtype, its
    /// KV cache as asked), hashed while it loads.
    fn load(r: &Request, stage: Stage, what: &str) -> Result<Candidate> {
        let (Lane::Native {
            compute, emulate, ..
        }
        | Lane::ReferenceArtifact {
            compute, emulate, ..
        }
        | Lane::LlamacppBase {
            compute, emulate, ..
        }) = r.lane
        else {
            return Err(Error::internal(
                r.candidate,
                "a native candidate outside a native lane",
            ));
        };
        stage(what);
        let (model, digest) = rayon::join(
            || load_candidate(r, compute, emulate),
            || root_digest(r.candidate, r.threads, r.candidate_manifest),
        );
        let model = model?;
        let record = identity_of(&model, r.candidate, digest?);
        Ok(Candidate {
            model,
            record,
            compute,
            emulate,
        })
    }

    /// The arm as scored: its environment records where and how the candidate ran, and what
    /// the reference's binding recorded (the tokenizer, the artifact).
    fn scored(
        &self,
        reference: ReferenceRecord,
        options: MeasureOptions,
        scoring: Scoring,
        threads: usize,
    ) -> Scored {
        let mut environment = native_environment(&self.model, self.compute, self.emulate, threads);
        environment.tokenizer = reference.tokenizer;
        environment.reference_artifact = reference.artifact;
        Scored {
            scoring,
            options,
            reference: reference.model,
            candidate: self.record.clone(),
            environment,
            gates: Vec::new(),
            noise_floor: None,
            records: Vec::new(),
            seconds: 0.0,
        }
    }
}

/// The candidate for a native lane, its recurrent state in the request's dtype. A knob that
/// would change nothing (a model without recurrent layers) is refused, not recorded.
fn load_candidate(r: &Request, compute: ComputeDtype, emulate: Emulate) -> Result<NativeModel> {
    let mut candidate = native::load(r.candidate, compute, emulate, r.recurrent_state)?;
    if let Some(setting) = r.kv_cache {
        candidate.decoder.set_kv_cache(setting).map_err(|e| {
            Error::usage(r.candidate, format!("--kv-cache {}: {e}", setting.name()))
        })?;
    }
    if r.recurrent_state != StateDtype::F32 && !candidate.decoder.has_recurrent_state() {
        return Err(Error::usage(
            r.candidate,
            format!(
                "--recurrent-state-dtype {}: the candidate ({}) has no recurrent (linear-attention) layers, so there is no state to keep in it",
                r.recurrent_state,
                candidate.decoder.config.arch.as_str()
            ),
        ));
    }
    Ok(candidate)
}

/// One candidate, the reference's rows computed beside it: the measurement, then the gates
/// and the noise floor when asked.
fn streamed(
    reference: &dyn ReferenceSource,
    r: &Request,
    arm: Candidate,
    stage: Stage,
    progress: score::Progress,
) -> Result<Scored> {
    let bound = reference.bind(Some(&arm.model), r, stage)?;
    stage("measuring");
    let started = std::time::Instant::now();
    let mut scoring = score::measure_models(
        bound.rows.get(),
        &arm.model,
        &bound.eval,
        &bound.options,
        progress,
    )?;
    if let Some(text_path) = &bound.text_path {
        scoring.eval.text_path = text_path.clone();
    }
    let seconds = started.elapsed().as_secs_f64();
    let gates_out = match &r.gates {
        Some(g) => {
            stage("sanity gates");
            in_process_gates(&bound, &arm.model, &scoring, g)?
        }
        None => Vec::new(),
    };
    let noise_floor = if r.noise_floor {
        stage("noise floor");
        reference.noise_floor(&bound)?
    } else {
        None
    };
    // After every forward pass (measurement, gates, floor): the weights read in place are
    // still the files that were hashed.
    reference.check_unchanged()?;
    arm.model.check_unchanged()?;
    let Bound {
        options, recorded, ..
    } = bound;
    let mut scored = arm.scored(recorded, options, scoring, r.threads);
    scored.gates = gates_out;
    scored.noise_floor = noise_floor;
    scored.seconds = seconds;
    Ok(scored)
}

/// The reference once over every window, kept; then each candidate in turn, loaded, measured
/// against it and dropped. Each arm's numbers are what a streamed rerun of the pair gives (the
/// same planning, reduction and statistics).
fn kept(
    reference: &dyn ReferenceSource,
    arms: &Arms,
    stage: Stage,
    progress: ArmProgress,
) -> Result<Runs> {
    let first = arms.first()?;
    let bound = reference.bind(None, first, stage)?;
    stage(&format!(
        "reference pass ({} arms to follow)",
        arms.requests.len()
    ));
    let started = std::time::Instant::now();
    let mut pass =
        score::reference_pass(bound.rows.get(), &bound.eval, &bound.options, &|d, t| {
            progress(0, d, t)
        })?;
    let reference_seconds = started.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(arms.requests.len());
    for (i, r) in arms.requests.iter().enumerate() {
        let arm = Candidate::load(
            r,
            stage,
            &arms.stage(i, ": loading", "loading the candidate"),
        )?;
        stage(&arms.stage(i, "", "measuring"));
        let started = std::time::Instant::now();
        let (scoring, records) = score::measure_against(
            &mut pass,
            &arm.model,
            &bound.eval,
            &bound.options,
            &|d, t| progress(i + 1, d, t),
        )?;
        let seconds = started.elapsed().as_secs_f64();
        reference.check_unchanged()?;
        arm.model.check_unchanged()?;
        let recorded = ReferenceRecord {
            model: bound.recorded.model.clone(),
            tokenizer: bound.recorded.tokenizer.clone(),
            artifact: bound.recorded.artifact.clone(),
        };
        let mut scored = arm.scored(recorded, bound.options.clone(), scoring, r.threads);
        scored.records = records;
        scored.seconds = seconds;
        out.push(scored);
    }
    Ok(Runs {
        reference_seconds: Some(reference_seconds),
        arms: out,
    })
}

/// The gates on one window (the first of the first run whose scored rows are all finite): the
/// reference against itself and against the candidate shifted by one row, on every row of the
/// window, or on the scored rows where the reference holds only those (an artifact).
fn in_process_gates(
    bound: &Bound,
    candidate: &NativeModel,
    scoring: &Scoring,
    g: &GateRequest,
) -> Result<Vec<Gate>> {
    let o = &bound.options;
    let first_length = o.context_lengths.first().copied().unwrap_or(2);
    let window: Vec<u32> = tokens::windows(
        bound.eval.stream,
        bound.eval.text_path,
        first_length,
        o.bos,
        bound.eval.bos_id,
    )?
    .windows
    .into_iter()
    .nth(gate_window(scoring))
    .unwrap_or_default();
    let l = window.len();
    let scored: Vec<usize> = (0..l)
        .filter(|&j| bound.every_row || o.positions.selects(j as u64, l as u64))
        .collect();
    gates::run(
        bound.rows.get(),
        candidate,
        &window,
        &scored,
        scoring.vocab_size,
        super::measured(scoring, quantized(candidate), g),
    )
}

/// The window the gates run on: the first of the first run whose scored rows are all finite (a
/// window spoilt by non-finite logits would make the one-row shift look like no change).
fn gate_window(s: &Scoring) -> usize {
    let Some(run) = s.runs.first() else {
        return 0;
    };
    if run.n_windows <= 1 {
        return 0;
    }
    let mut per_window = vec![0usize; run.n_windows];
    for row in &run.rows {
        if let Some(n) = per_window.get_mut(row.block as usize) {
            *n += 1;
        }
    }
    let full = per_window.iter().copied().max().unwrap_or(0);
    per_window.iter().position(|&n| n == full).unwrap_or(0)
}

/// Whether the loaded candidate holds quantized weights.
fn quantized(m: &NativeModel) -> bool {
    m.decoder.report.schemes.keys().any(|s| {
        !matches!(
            s.as_str(),
            "bf16" | "f16" | "f32" | "f64" | "gguf F32" | "gguf F16" | "gguf BF16"
        )
    })
}
