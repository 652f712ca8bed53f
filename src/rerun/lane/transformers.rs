//! The transformers candidate runner: the reference checkpoint and every candidate in one run
//! of the Python program on the user's GPU. Alone, the pair runs as one measurement (with the
//! runner's gates when asked); in a study, the reference runs once per window with its hidden
//! states kept and each arm's candidate in turn against them (N arms cost N + 1 passes). Either
//! way each arm's rows are scored here exactly as a single measurement scores them. With
//! `--turns` the same program run also generates each model's turns after its scoring (the
//! reference's once), with the model objects the scoring used; they come back checked
//! ([`TurnSet`]) with how each model generated them.

use std::path::Path;

use super::{
    ArmProgress, Arms, CandidateRunner, EngineReference, Pass, ReferenceSource, Runs, Scored, Stage,
};
use crate::error::{Error, Result};
use crate::kld::protocol::VocabMode;
use crate::rerun::document::{Environment, ModelRecord};
use crate::rerun::environment::{
    gdn_kernel_ran, kv_cache_ran, recorded_kv, recurrent_state_ran, transformers_environment,
};
use crate::rerun::gates;
use crate::rerun::identity::checkpoint_identity;
use crate::rerun::score::{self, EvalInput};
use crate::rerun::turns::{TurnWork, TurnsGeneratedBy};
use crate::rerun::{NoiseFloor, Request};
use crate::runner::exchange::{GateNumbers, RunnerEnvironment, TurnAsk, TurnEngine};
use crate::runner::native;
use crate::runner::transformers::{self, ArmModel, RunWork, TransformersOptions, TurnSet};

pub(crate) struct TransformersCandidates<'a>(pub &'a TransformersOptions);

/// What the program answered for one arm.
struct ArmAnswer {
    records: score::PerRun,
    model: serde_json::Value,
    seconds: f64,
    turns: Option<TurnSet>,
}

/// What the program answered for the whole run.
struct Answers {
    arms: Vec<ArmAnswer>,
    environment: RunnerEnvironment,
    gates: Option<GateNumbers>,
    reference_turns: Option<TurnSet>,
    interrupted: Option<super::Interrupted>,
}

/// One program run's inputs: the reference, the windows and rows, the logit entries reduced,
/// the options (the turns asked for among them), and where progress goes.
struct Call<'a> {
    reference: &'a Path,
    work: &'a [RunWork<'a>],
    vocab_size: usize,
    options: TransformersOptions,
    stage: Stage<'a>,
    progress: ArmProgress<'a>,
}

impl Call<'_> {
    /// A single rerun: the pair in one program run (with the runner's gates when asked).
    fn streamed(mut self, first: &Request) -> Result<Answers> {
        (self.stage)("running the transformers runner");
        self.options.gates = first.gates.is_some();
        self.options.kv_cache = (first.reference_kv_cache, first.kv_cache);
        self.options.recurrent_state = first.recurrent_state;
        let (stage, progress) = (self.stage, self.progress);
        let report = |stage_name: &str, counts: Option<(usize, usize)>| match counts {
            Some((done, total)) => progress(1, done, total),
            None => stage(stage_name),
        };
        let started = std::time::Instant::now();
        let out = transformers::run(
            self.reference,
            first.candidate,
            self.work,
            self.vocab_size,
            &self.options,
            &report,
        )?;
        let (reference_turns, turns) = out.turns.map_or((None, None), |(r, c)| (Some(r), Some(c)));
        let answer = ArmAnswer {
            records: out.records,
            model: out.environment.models.candidate.clone(),
            seconds: started.elapsed().as_secs_f64(),
            turns,
        };
        Ok(Answers {
            arms: vec![answer],
            environment: out.environment,
            gates: out.gates,
            reference_turns,
            interrupted: None,
        })
    }

    /// A study: the reference once, every arm against its kept hidden states.
    fn kept(mut self, arms: &Arms) -> Result<Answers> {
        let first = arms.first()?;
        (self.stage)(&format!(
            "transformers runner: reference pass, then {} arms",
            arms.requests.len()
        ));
        self.options.gates = false;
        self.options.kv_cache = (first.reference_kv_cache, None);
        let models: Vec<ArmModel> = arms
            .requests
            .iter()
            .zip(arms.kernels)
            .enumerate()
            .map(|(i, (r, kernel))| ArmModel {
                name: arms
                    .names
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| (i + 1).to_string()),
                path: r.candidate,
                attention: kernel.attention.clone(),
                gdn_kernel: kernel.gdn_kernel.clone(),
                kv_cache: r.kv_cache,
                recurrent_state: r.recurrent_state,
            })
            .collect();
        let out = transformers::run_arms(
            self.reference,
            &models,
            arms.carry,
            self.work,
            self.vocab_size,
            &self.options,
            &arms_progress(self.stage, self.progress),
        )?;
        let answers = out
            .arms
            .into_iter()
            .map(|o| ArmAnswer {
                records: o.records,
                model: o.model,
                seconds: o.seconds,
                turns: o.turns,
            })
            .collect();
        Ok(Answers {
            arms: answers,
            environment: out.environment,
            gates: None,
            reference_turns: out.reference_turns,
            interrupted: out
                .failure
                .zip(out.carry)
                .map(|(error, carry)| super::Interrupted { error, carry }),
        })
    }
}

impl CandidateRunner for TransformersCandidates<'_> {
    fn run(
        &self,
        reference: &dyn ReferenceSource,
        arms: &Arms,
        turns: Option<&TurnWork>,
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
        // The logit widths from the headers now; the digests (every file, and the output head)
        // beside the program, which spends that time loading and compiling (joined after it).
        let width = logit_widths(arms.requests, engine.path)?;
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
        let mut runner_options = self.0.clone();
        runner_options.turns = turns.map(turn_ask);
        // The protocol's prefill chunk is the chunk the runner prefills in (its memory plan then
        // refuses what does not fit at it, rather than choosing another).
        if let Some(chunk) = options.prefill_chunk {
            if runner_options.chunk_size != 0 && runner_options.chunk_size != chunk {
                return Err(Error::usage(
                    Path::new("--chunk-size"),
                    format!(
                        "{}: the protocol prefills in chunks of {chunk} tokens (--prefill-chunk); the runner's chunk is the protocol's",
                        runner_options.chunk_size
                    ),
                ));
            }
            runner_options.chunk_size = chunk;
        }
        let call = Call {
            reference: engine.path,
            work: &work,
            vocab_size,
            options: runner_options,
            stage,
            progress,
        };
        let started = std::time::Instant::now();
        let (answers, digests) = std::thread::scope(|s| {
            let digests = s.spawn(|| -> Result<_> {
                let (reference_id, width) =
                    checkpoint_identity(engine.path, first.threads, engine.manifest.as_ref())?;
                let ids = arm_identities(arms.requests, engine.path, &reference_id, width)?;
                Ok((reference_id, ids))
            });
            let answers = match arms.pass {
                Pass::Streamed => call.streamed(first),
                Pass::Kept => call.kept(arms),
            };
            let digests = digests.join().unwrap_or_else(|_| {
                Err(Error::internal(
                    engine.path,
                    "hashing the checkpoints panicked",
                ))
            });
            (answers, digests)
        });
        // Either failure fails the run; the program's error first (it says more).
        let answers = answers?;
        let (reference_id, ids) = digests?;
        let total_seconds = started.elapsed().as_secs_f64();
        // Generation is timed apart from the arms' passes, so it is not the reference's either.
        let turn_seconds: f64 = answers
            .reference_turns
            .iter()
            .chain(answers.arms.iter().filter_map(|a| a.turns.as_ref()))
            .map(|t| t.seconds)
            .sum();
        let shared = Shared {
            eval: &eval,
            options: &options,
            width,
            engine,
            environment: &answers.environment,
            reference: ModelRecord {
                runner: answers.environment.models.reference.clone(),
                ..reference_id
            },
            reference_turns: answers.reference_turns.as_ref().map(|t| &t.engine),
            pass: arms.pass,
        };
        let mut scored = Vec::with_capacity(answers.arms.len());
        for (i, ((r, id), answer)) in arms.requests.iter().zip(ids).zip(answers.arms).enumerate() {
            // The GDN kernel asked of this arm's candidate (a study arm's own, else the run's).
            let gdn = match arms.kernels.get(i) {
                Some(k) => k.gdn_kernel.as_deref(),
                None => self.0.gdn_kernel.1.as_deref(),
            };
            gdn_kernel_ran(r.candidate, gdn, &answer.model)?;
            scored.push(shared.arm(r, id, answer, answers.gates.as_ref())?);
        }
        let arm_seconds: f64 = scored.iter().map(|s| s.seconds).sum();
        Ok(Runs {
            // The program's whole run less its arms' and the turns': the reference's pass,
            // loading and warm-up.
            reference_seconds: (arms.pass == Pass::Kept)
                .then(|| (total_seconds - arm_seconds - turn_seconds).max(0.0)),
            arms: scored,
            reference_turns_timing: answers.reference_turns.as_ref().and_then(|t| t.timing),
            reference_turns: answers.reference_turns.map(|t| t.generated),
            interrupted: answers.interrupted,
        })
    }
}

/// What the runner program is asked to generate: the plan's prompts, stop ids, budget and the
/// logit entries that are tokens.
fn turn_ask(w: &TurnWork) -> TurnAsk {
    TurnAsk {
        prompts: w.plan.prompts.iter().map(|p| p.prompt.clone()).collect(),
        stops: w.plan.stops.clone(),
        max_new_tokens: w.protocol.max_new_tokens,
        used: w.used,
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

/// A candidate whose logit rows are `w` wide against the reference's `width`.
fn width_mismatch(candidate: &Path, w: usize, width: usize) -> Error {
    Error::mismatch(
        candidate,
        Some("config.json vocab_size"),
        format!(
            "vocabulary mismatch: the candidate's logit rows have {w} entries, the reference's {width}"
        ),
    )
}

/// The logit width every model of the run shares (the reference's), from headers: a candidate
/// whose rows have another width cannot be scored against it, refused before anything runs.
fn logit_widths(requests: &[Request], reference: &Path) -> Result<usize> {
    let width = crate::rerun::identity::logit_width(reference)?;
    for r in requests.iter().filter(|r| r.candidate != reference) {
        let w = crate::rerun::identity::logit_width(r.candidate)?;
        if w != width {
            return Err(width_mismatch(r.candidate, w, width));
        }
    }
    Ok(width)
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
            return Err(width_mismatch(r.candidate, w, width));
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
    /// How the reference generated its turns (with `--turns`).
    reference_turns: Option<&'a TurnEngine>,
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
            recurrent_state_dtype: recurrent_state_ran(
                r.candidate,
                r.recurrent_state,
                &answer.model,
            )?,
            ..transformers_environment(&env, tokenizer)
        };
        let gates_out = match &r.gates {
            Some(g) => gates::from_runner(
                gate_numbers,
                super::measured(&scoring, g.checkpoint_quantized, g),
            ),
            None => Vec::new(),
        };
        let turns_generated_by = match (self.reference_turns, &answer.turns) {
            (Some(reference), Some(candidate)) => Some(TurnsGeneratedBy {
                runner: crate::rerun::document::RunnerKind::Transformers,
                reference: reference.clone(),
                candidate: candidate.engine.clone(),
            }),
            _ => None,
        };
        Ok(Scored {
            turns_timing: answer.turns.as_ref().and_then(|t| t.timing),
            turns: answer.turns.map(|t| t.generated),
            turns_generated_by,
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
