//! The transformers candidate runner: the reference checkpoint and every candidate in one run
//! of the Python program on the user's GPU. Alone, the pair runs as one measurement (with the
//! runner's gates when asked); in a study, the reference runs once per window with its hidden
//! states kept and each arm's candidate in turn against them (N arms cost N + 1 passes). Either
//! way each arm's rows are scored here exactly as a single measurement scores them.

use std::path::Path;

use super::{
    ArmProgress, Arms, CandidateRunner, EngineReference, Pass, ReferenceSource, Runs, Scored, Stage,
};
use crate::error::{Error, Result};
use crate::kld::protocol::VocabMode;
use crate::rerun::document::{Environment, ModelRecord};
use crate::rerun::environment::{kv_cache_ran, recorded_kv, transformers_environment};
use crate::rerun::gates;
use crate::rerun::identity::checkpoint_identity;
use crate::rerun::score::{self, EvalInput};
use crate::rerun::{NoiseFloor, Request};
use crate::runner::exchange::{GateNumbers, RunnerEnvironment};
use crate::runner::native;
use crate::runner::transformers::{self, ArmModel, RunWork, TransformersOptions};

pub(crate) struct TransformersCandidates<'a>(pub &'a TransformersOptions);

/// What the program answered for one arm.
struct ArmAnswer {
    records: score::PerRun,
    model: serde_json::Value,
    seconds: f64,
}

impl CandidateRunner for TransformersCandidates<'_> {
    fn run(
        &self,
        reference: &dyn ReferenceSource,
        arms: &Arms,
        _turns: Option<&crate::rerun::turns::TurnWork>,
        stage: Stage,
        progress: ArmProgress,
    ) -> Result<Runs> {
        let first = arms.first()?;
        let engine = reference.engine().ok_or_else(|| {
            Error::internal(
                first.candidate,
                "the transformers runner without its reference checkpoint",
            )
        })?;
        check_runnable(first, engine.path, arms.requests)?;
        let eval = engine.eval()?;
        stage("hashing");
        let (reference_id, width) =
            checkpoint_identity(engine.path, first.threads, engine.manifest.as_ref())?;
        let ids = arm_identities(arms.requests, engine.path, &reference_id, width)?;
        let options = super::with_padding(first, width);
        let (plans, vocab_size) = score::plan_records(&eval, &options, width)?;
        let work: Vec<RunWork> = plans
            .iter()
            .map(|p| RunWork {
                context_length: p.windows.length,
                windows: &p.windows.windows,
                rows: &p.rows,
            })
            .collect();
        let started = std::time::Instant::now();
        let (answers, environment, gate_numbers) = match arms.pass {
            Pass::Streamed => {
                stage("running the transformers runner");
                let mut runner_options = self.0.clone();
                runner_options.gates = first.gates.is_some();
                runner_options.kv_cache = (first.reference_kv_cache, first.kv_cache);
                let report = |stage_name: &str, counts: Option<(usize, usize)>| match counts {
                    Some((done, total)) => progress(1, done, total),
                    None => stage(stage_name),
                };
                let out = transformers::run(
                    engine.path,
                    first.candidate,
                    &work,
                    vocab_size,
                    &runner_options,
                    &report,
                )?;
                let answer = ArmAnswer {
                    records: out.records,
                    model: out.environment.models.candidate.clone(),
                    seconds: started.elapsed().as_secs_f64(),
                };
                (vec![answer], out.environment, out.gates)
            }
            Pass::Kept => {
                stage(&format!(
                    "transformers runner: reference pass, then {} arms",
                    arms.requests.len()
                ));
                let mut runner_options = self.0.clone();
                runner_options.gates = false;
                runner_options.kv_cache = (first.reference_kv_cache, None);
                let models: Vec<ArmModel> = arms
                    .requests
                    .iter()
                    .zip(arms.attentions)
                    .map(|(r, attention)| ArmModel {
                        path: r.candidate,
                        attention: attention.clone(),
                        kv_cache: r.kv_cache,
                    })
                    .collect();
                let (outputs, environment) = transformers::run_arms(
                    engine.path,
                    &models,
                    &work,
                    vocab_size,
                    &runner_options,
                    &arms_progress(stage, progress),
                )?;
                let answers = outputs
                    .into_iter()
                    .map(|o| ArmAnswer {
                        records: o.records,
                        model: o.model,
                        seconds: o.seconds,
                    })
                    .collect();
                (answers, environment, None)
            }
        };
        let total_seconds = started.elapsed().as_secs_f64();
        let shared = Shared {
            eval: &eval,
            options: &options,
            width,
            engine,
            environment: &environment,
            reference: ModelRecord {
                runner: environment.models.reference.clone(),
                ..reference_id
            },
            pass: arms.pass,
        };
        let mut scored = Vec::with_capacity(answers.len());
        for ((r, id), answer) in arms.requests.iter().zip(ids).zip(answers) {
            scored.push(shared.arm(r, id, answer, gate_numbers.as_ref())?);
        }
        let arm_seconds: f64 = scored.iter().map(|s| s.seconds).sum();
        Ok(Runs {
            // The program's whole run less its arms': the reference's pass, loading and warm-up.
            reference_seconds: (arms.pass == Pass::Kept)
                .then(|| (total_seconds - arm_seconds).max(0.0)),
            arms: scored,
            reference_turns: None,
            reference_turns_timing: None,
        })
    }
}

/// What the transformers runner cannot run is refused before anything is hashed: it computes
/// full-vocabulary KL only, and loads safetensors checkpoints (the reference's checked first,
/// then each candidate's).
fn check_runnable(first: &Request, reference: &Path, requests: &[Request]) -> Result<()> {
    if !matches!(first.options.vocab, VocabMode::Full) {
        return Err(Error::unsupported(
            first.candidate,
            None,
            "the transformers runner computes full-vocabulary KL only; use --runner native for top-k or threshold modes",
        ));
    }
    for model in std::iter::once(reference).chain(requests.iter().map(|r| r.candidate)) {
        if native::resolve(model)?.1 != "safetensors" {
            return Err(Error::unsupported(
                model,
                None,
                "the transformers runner loads safetensors checkpoint directories; GGUF runs with --runner native (in a study, runner: native)",
            ));
        }
    }
    Ok(())
}

/// Each candidate's checkpoint identity, in the arms' order (the reference's own when it is the
/// same checkpoint, as in a sweep: hashed once): a candidate whose logit rows are not the
/// reference's `width` cannot be scored against it.
fn arm_identities(
    requests: &[Request],
    reference: &Path,
    reference_id: &ModelRecord,
    width: usize,
) -> Result<Vec<ModelRecord>> {
    let mut ids = Vec::with_capacity(requests.len());
    for r in requests {
        let (id, w) = if r.candidate == reference {
            (reference_id.clone(), width)
        } else {
            checkpoint_identity(r.candidate, r.threads, r.candidate_manifest)?
        };
        if w != width {
            return Err(Error::mismatch(
                r.candidate,
                Some("config.json vocab_size"),
                format!(
                    "vocabulary mismatch: the candidate's logit rows have {w} entries, the reference's {width}"
                ),
            ));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// The transformers runner's progress for a study, as `progress(arm, done, total)`: the runner
/// reports no arm, but "loading <path>" marks a model's turn (the reference first, then each
/// arm), so the stages are counted to know whose pass the counts are.
fn arms_progress<'a>(
    stage: Stage<'a>,
    progress: ArmProgress<'a>,
) -> impl Fn(&str, Option<(usize, usize)>) + Sync + 'a {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let arm_index = AtomicUsize::new(0);
    move |stage_name: &str, counts: Option<(usize, usize)>| match counts {
        Some((done, total)) => progress(arm_index.load(Ordering::Relaxed), done, total),
        None => {
            if stage_name.starts_with("loading") {
                arm_index.fetch_add(1, Ordering::Relaxed);
            }
            stage(stage_name)
        }
    }
}

/// What every arm of one program run shares: the text and options it is scored with, the
/// logit width, the reference, the program's environment.
struct Shared<'a> {
    eval: &'a EvalInput<'a>,
    options: &'a crate::rerun::MeasureOptions,
    width: usize,
    engine: &'a EngineReference<'a>,
    environment: &'a RunnerEnvironment,
    reference: ModelRecord,
    pass: Pass,
}

impl Shared<'_> {
    /// One arm from the program's answer: its KV cache checked against what was asked, its rows
    /// scored as a single measurement scores them, its environment the program's with the
    /// arm's own model record.
    fn arm(
        &self,
        r: &Request,
        id: ModelRecord,
        answer: ArmAnswer,
        gate_numbers: Option<&GateNumbers>,
    ) -> Result<Scored> {
        // The runner says which KV cache each side ran with: a scheme asked for and not applied
        // (a runner program older than the request) is an error, not a silently plain run.
        kv_cache_ran(
            r.candidate,
            &[
                (
                    "reference",
                    r.reference_kv_cache,
                    &self.environment.models.reference,
                ),
                ("candidate", r.kv_cache, &answer.model),
            ],
        )?;
        // A kept pass's arms are paired on their records afterwards; a streamed rerun's are not.
        let (records, kept) = match self.pass {
            Pass::Kept => (answer.records.clone(), answer.records),
            Pass::Streamed => (answer.records, Vec::new()),
        };
        let scoring =
            score::measure_records(self.eval, self.options, self.width, |_, _| Ok(records))?;
        let mut env = self.environment.clone();
        env.models.candidate = answer.model.clone();
        let tokenizer = self
            .engine
            .tokenized
            .as_ref()
            .map(|(t, _)| t)
            .ok_or_else(|| {
                Error::internal(r.candidate, "the transformers lane without its tokenizer")
            })?;
        let environment = Environment {
            // The runner's cache rounds write-then-read, rotated as asked, per-tensor scales
            // 1.0 (it refuses checkpoint scales).
            kv_cache: r
                .kv_cache
                .filter(|s| s.changes_anything())
                .map(|s| crate::disclosure::kv_cache::KvCache::as_run(s, false)),
            kv_scales: recorded_kv(r.candidate, &answer.model)?.kv_scales,
            ..transformers_environment(&env, tokenizer)
        };
        let gates_out = match &r.gates {
            Some(g) => gates::from_runner(
                gate_numbers,
                super::measured(&scoring, g.checkpoint_quantized, g),
            ),
            None => Vec::new(),
        };
        Ok(Scored {
            turns: None,
            turns_timing: None,
            scoring,
            options: self.options.clone(),
            reference: self.reference.clone(),
            candidate: ModelRecord {
                runner: answer.model,
                ..id
            },
            environment,
            gates: gates_out,
            noise_floor: r.noise_floor.then(|| NoiseFloor::Skipped {
                skipped: "the noise floor of the transformers runner is its kernel sweep: `cardproof measure --runner transformers --sweep attention=sdpa,eager`".into(),
            }),
            records: kept,
            seconds: answer.seconds,
        })
    }
}
