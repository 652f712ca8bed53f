//! Each lane of [`super::run`]: load what the lane needs, check the inputs belong together,
//! score, record the identities and the environment, and run the lane's sanity gates.

use std::path::Path;

use sha2::Digest as _;

use super::document::{ArtifactRecord, Environment, ModelRecord};
use super::environment::{kv_cache_ran, native_environment, recorded_kv, transformers_environment};
use super::gates::{self, Gate, Measured};
use super::identity::{checkpoint_identity, identity, identity_of, root_digest, tokenizer_record};
use super::preflight::Preflight;
use super::score::{self, EvalInput, Progress, Scoring};
use super::{GateRequest, Lane, NoiseFloor, NoiseFloorRun, Request, Rerun, record};
use crate::error::{Error, Result};
use crate::kld::protocol::VocabMode;
use crate::runner::Runner;
use crate::runner::native::{self, ComputeDtype, Emulate, NativeModel, StateDtype};
use crate::runner::tokens::{self, TokenStream};

type Stage<'a> = &'a (dyn Fn(&str) + Sync);

/// The eval text, tokenizer and tokens a lane that tokenizes needs, from its pre-flight.
fn tokenized<'a>(
    r: &Request<'a>,
    pre: &mut Preflight,
) -> Result<(&'a Path, tokens::TokenizerFile, TokenStream)> {
    match (r.eval_text, pre.tokenized.take()) {
        (Some(text), Some((tokenizer, stream))) => Ok((text, tokenizer, stream)),
        _ => Err(Error::internal(
            r.candidate,
            "the lane was started without its pre-flight's eval text and tokens",
        )),
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

/// Whether the loaded candidate holds quantized weights.
fn quantized(m: &NativeModel) -> bool {
    m.decoder.report.schemes.keys().any(|s| {
        !matches!(
            s.as_str(),
            "bf16" | "f16" | "f32" | "f64" | "gguf F32" | "gguf F16" | "gguf BF16"
        )
    })
}

/// The gates' view of a scoring's first run.
fn measured(s: &Scoring, quantized: bool, g: &GateRequest) -> Measured {
    Measured::of_metrics(
        s.runs.first().map(|r| &r.summary.metrics),
        quantized,
        g.declared.clone(),
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

/// The vocabulary size to use: every logit entry when the card includes padding.
fn with_padding(r: &Request, width: usize) -> super::MeasureOptions {
    let mut o = r.options.clone();
    if r.padding_included {
        o.vocab_size = Some(width);
    }
    o
}

/// The rerun of a finished scoring: its measurement document and rows, the gates and the floor.
fn finished(
    scoring: Scoring,
    options: &super::MeasureOptions,
    (reference, candidate, environment): (ModelRecord, ModelRecord, Environment),
    gates: Vec<Gate>,
    noise_floor: Option<NoiseFloor>,
) -> Rerun {
    Rerun {
        measurement: record::measurement(&scoring, options, reference, candidate, environment),
        runs: scoring.runs,
        gates,
        noise_floor,
    }
}

/// Both models native.
pub(super) fn native(
    r: &Request,
    mut pre: Preflight,
    reference_path: &Path,
    compute: ComputeDtype,
    emulate: Emulate,
    stage: Stage,
    progress: Progress,
) -> Result<Rerun> {
    let (text, tokenizer, stream) = tokenized(r, &mut pre)?;
    stage("loading and hashing the models");
    // The models load (read, dequantize; each tensor in parallel) one after the other, so that
    // one file's mapping is released before the next is read, while both checkpoints are hashed
    // beside them. Errors are taken in a fixed order (the reference's first), whatever finished
    // first.
    let (models, digests) = rayon::join(
        || -> Result<(NativeModel, NativeModel)> {
            // The reference keeps the exact f32 state (the reference semantics); the knob
            // emulates the candidate's engine.
            let mut reference = native::load(reference_path, compute, emulate, StateDtype::F32)?;
            if let Some(setting) = r.reference_kv_cache {
                reference.decoder.set_kv_cache(setting).map_err(|e| {
                    Error::usage(reference_path, format!("KV cache {}: {e}", setting.name()))
                })?;
            }
            Ok((reference, load_candidate(r, compute, emulate)?))
        },
        || {
            rayon::join(
                || root_digest(reference_path, r.threads, pre.reference_manifest.as_ref()),
                || root_digest(r.candidate, r.threads, r.candidate_manifest),
            )
        },
    );
    let (reference, candidate) = models?;
    let reference_id = identity_of(&reference, reference_path, digests.0?);
    let candidate_id = identity_of(&candidate, r.candidate, digests.1?);
    let options = with_padding(r, candidate.vocab());
    let eval = EvalInput {
        stream: &stream,
        text_path: text,
        bos_id: tokenizer.bos_id,
        tokenizer_vocab: tokenizer.vocab_size,
    };
    stage("measuring");
    let scoring = score::measure_models(&reference, &candidate, &eval, &options, progress)?;
    let mut gates_out = Vec::new();
    let mut noise_floor = None;
    if let Some(g) = &r.gates {
        stage("sanity gates");
        let first_length = options.context_lengths.first().copied().unwrap_or(2);
        let window: Vec<u32> =
            tokens::windows(&stream, text, first_length, options.bos, tokenizer.bos_id)?
                .windows
                .into_iter()
                .nth(gate_window(&scoring))
                .unwrap_or_default();
        let scored: Vec<usize> = (0..window.len()).collect();
        gates_out = gates::run(
            &reference,
            &candidate,
            &window,
            &scored,
            scoring.vocab_size,
            measured(&scoring, quantized(&candidate), g),
        )?;
    }
    if r.noise_floor {
        stage("noise floor");
        noise_floor = Some(self_noise_floor(
            reference_path,
            &reference,
            &eval,
            &options,
            compute,
        )?);
    }
    // After every forward pass (measurement, gates, floor): the weights read in place are still
    // the files that were hashed.
    reference.check_unchanged()?;
    candidate.check_unchanged()?;
    let mut environment = native_environment(&candidate, compute, emulate, r.threads);
    environment.tokenizer = Some(tokenizer_record(&tokenizer));
    Ok(finished(
        scoring,
        &options,
        (reference_id, candidate_id, environment),
        gates_out,
        noise_floor,
    ))
}

/// One arm of a study, measured against the study's reference pass: its rerun, each row's
/// record (for paired comparisons), and the seconds its pass took.
pub struct ArmOutcome {
    pub rerun: Rerun,
    pub records: score::PerRun,
    pub seconds: f64,
}

/// Several candidates against one native reference pass (a study): every request shares the
/// first one's reference, eval text, tokenizer and options; each has its own candidate and
/// settings, and its `Native` lane's compute dtype is the candidate's (the reference runs in
/// `reference_compute`). The reference runs once per window and its windows are kept; each
/// candidate is loaded, measured against them, and dropped, so N arms cost N + 1 passes and
/// hold one candidate at a time. Each arm's numbers are what a single `measure` of that pair
/// gives (the same planning, reduction and statistics). `progress(arm, done, total)`: arm 0 is
/// the reference's pass.
pub(super) fn native_arms(
    requests: &[Request],
    names: &[String],
    mut pre: Preflight,
    reference_path: &Path,
    reference_compute: ComputeDtype,
    stage: Stage,
    progress: &(dyn Fn(usize, usize, usize) + Sync),
) -> Result<ArmsOutcome> {
    let first = requests
        .first()
        .ok_or_else(|| Error::internal(reference_path, "a study without arms"))?;
    let (text, tokenizer, stream) = tokenized(first, &mut pre)?;
    stage("loading the reference");
    let emulate = match first.lane {
        Lane::Native { emulate, .. } => emulate,
        _ => Emulate::ReferenceSemantics,
    };
    let mut reference = native::load(reference_path, reference_compute, emulate, StateDtype::F32)?;
    if let Some(setting) = first.reference_kv_cache {
        reference.decoder.set_kv_cache(setting).map_err(|e| {
            Error::usage(reference_path, format!("KV cache {}: {e}", setting.name()))
        })?;
    }
    let reference_id = identity(
        &reference,
        reference_path,
        first.threads,
        pre.reference_manifest.as_ref(),
    )?;
    let options = with_padding(first, reference.vocab());
    let eval = EvalInput {
        stream: &stream,
        text_path: text,
        bos_id: tokenizer.bos_id,
        tokenizer_vocab: tokenizer.vocab_size,
    };
    stage(&format!(
        "reference pass ({} arms to follow)",
        requests.len()
    ));
    let started = std::time::Instant::now();
    let mut pass = score::reference_pass(&reference, &eval, &options, &|d, t| progress(0, d, t))?;
    let reference_seconds = started.elapsed().as_secs_f64();
    let mut out = Vec::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        let Lane::Native {
            compute, emulate, ..
        } = r.lane
        else {
            return Err(Error::internal(
                r.candidate,
                "a native study arm outside the native lane",
            ));
        };
        let name = names.get(i).map_or("?", String::as_str);
        stage(&format!("arm {}/{} {name}: loading", i + 1, requests.len()));
        let candidate = load_candidate(r, compute, emulate)?;
        stage(&format!("arm {}/{} {name}", i + 1, requests.len()));
        let candidate_id = identity(&candidate, r.candidate, r.threads, r.candidate_manifest)?;
        let started = std::time::Instant::now();
        let (scoring, records) =
            score::measure_against(&mut pass, &candidate, &eval, &options, &|d, t| {
                progress(i + 1, d, t)
            })?;
        let seconds = started.elapsed().as_secs_f64();
        reference.check_unchanged()?;
        candidate.check_unchanged()?;
        let mut environment = native_environment(&candidate, compute, emulate, r.threads);
        environment.tokenizer = Some(tokenizer_record(&tokenizer));
        let mut rerun = finished(
            scoring,
            &options,
            (reference_id.clone(), candidate_id, environment),
            Vec::new(),
            None,
        );
        for (role, pin) in &r.pins {
            rerun.measurement.pin(*role, pin);
        }
        out.push(ArmOutcome {
            rerun,
            records,
            seconds,
        });
    }
    Ok(ArmsOutcome {
        reference: reference_id,
        reference_seconds: Some(reference_seconds),
        arms: out,
    })
}

/// A study's runs: the reference's identity and pass time, and each arm's outcome.
pub struct ArmsOutcome {
    pub reference: ModelRecord,
    /// `None`: the reference ran beside each arm.
    pub reference_seconds: Option<f64>,
    pub arms: Vec<ArmOutcome>,
}

/// The reference against itself in a second compute dtype.
fn self_noise_floor(
    path: &Path,
    reference: &NativeModel,
    eval: &EvalInput,
    options: &super::MeasureOptions,
    compute: ComputeDtype,
) -> Result<NoiseFloor> {
    let other = if compute == ComputeDtype::F64 {
        ComputeDtype::F32
    } else {
        ComputeDtype::F64
    };
    let twin = native::load(path, other, Emulate::ReferenceSemantics, StateDtype::F32)?;
    let mut floor_options = options.clone();
    floor_options.bootstrap.resamples = floor_options.bootstrap.resamples.min(200);
    let f = score::measure_models(reference, &twin, eval, &floor_options, &|_, _| {})?;
    Ok(NoiseFloor::Measured {
        what: format!(
            "the reference against itself, computed in {} vs {}",
            compute.as_str(),
            other.as_str()
        ),
        runs: f
            .runs
            .iter()
            .map(|run| NoiseFloorRun {
                context_length: run.context_length,
                metrics: run.summary.metrics.clone(),
            })
            .collect(),
    })
}

/// Both models in transformers (a Python subprocess on the user's GPU).
pub(super) fn transformers(
    r: &Request,
    mut pre: Preflight,
    reference_path: &Path,
    runner_options: &crate::runner::transformers::TransformersOptions,
    stage: Stage,
    progress: Progress,
) -> Result<Rerun> {
    use crate::runner::transformers::{self, RunWork};
    if !matches!(r.options.vocab, VocabMode::Full) {
        return Err(Error::unsupported(
            r.candidate,
            None,
            "the transformers runner computes full-vocabulary KL only; use --runner native for top-k or threshold modes",
        ));
    }
    for model in [reference_path, r.candidate] {
        if native::resolve(model)?.1 != "safetensors" {
            return Err(Error::unsupported(
                model,
                None,
                "the transformers runner loads safetensors checkpoint directories; GGUF runs with --runner native",
            ));
        }
    }
    let (text, tokenizer, stream) = tokenized(r, &mut pre)?;
    stage("hashing");
    let (reference_id, width) =
        checkpoint_identity(reference_path, r.threads, pre.reference_manifest.as_ref())?;
    // The same weights on both sides (a sweep): hashed once.
    let (candidate_id, cand_width) = if r.candidate == reference_path {
        (reference_id.clone(), width)
    } else {
        checkpoint_identity(r.candidate, r.threads, r.candidate_manifest)?
    };
    if cand_width != width {
        return Err(Error::mismatch(
            r.candidate,
            Some("config.json vocab_size"),
            format!(
                "vocabulary mismatch: the candidate's logit rows have {cand_width} entries, the reference's {width}"
            ),
        ));
    }
    let options = with_padding(r, width);
    let mut runner_options = runner_options.clone();
    runner_options.gates = r.gates.is_some();
    runner_options.kv_cache = (r.reference_kv_cache, r.kv_cache);
    let eval = EvalInput {
        stream: &stream,
        text_path: text,
        bos_id: tokenizer.bos_id,
        tokenizer_vocab: tokenizer.vocab_size,
    };
    stage("running the transformers runner");
    let mut output = None;
    let scoring = score::measure_records(&eval, &options, width, |plans, vocab_size| {
        let work: Vec<RunWork> = plans
            .iter()
            .map(|p| RunWork {
                context_length: p.windows.length,
                windows: &p.windows.windows,
                rows: &p.rows,
            })
            .collect();
        let report = |stage_name: &str, counts: Option<(usize, usize)>| match counts {
            Some((done, total)) => progress(done, total),
            None => stage(stage_name),
        };
        let out = transformers::run(
            reference_path,
            r.candidate,
            &work,
            vocab_size,
            &runner_options,
            &report,
        )?;
        Ok(std::mem::take(&mut output.insert(out).records))
    })?;
    let output = output
        .ok_or_else(|| Error::runner(r.candidate, "the transformers runner produced no output"))?;
    let gates_out = match &r.gates {
        Some(g) => gates::from_runner(
            output.gates.as_ref(),
            measured(&scoring, g.checkpoint_quantized, g),
        ),
        None => Vec::new(),
    };
    let reference_id = ModelRecord {
        runner: output.environment.models.reference.clone(),
        ..reference_id
    };
    let candidate_id = ModelRecord {
        runner: output.environment.models.candidate.clone(),
        ..candidate_id
    };
    let environment = Environment {
        // The runner's cache rounds write-then-read, rotated as asked, per-tensor scales 1.0 (it
        // refuses checkpoint scales); that the scheme ran is checked below.
        kv_cache: r
            .kv_cache
            .filter(|s| s.changes_anything())
            .map(|s| crate::disclosure::kv_cache::KvCache::as_run(s, false)),
        kv_scales: recorded_kv(r.candidate, &output.environment.models.candidate)?.kv_scales,
        ..transformers_environment(&output.environment, &tokenizer)
    };
    // The runner says which KV cache each side ran with: a scheme asked for and not applied
    // (a runner program older than the request) is an error, not a silently plain run.
    kv_cache_ran(
        r.candidate,
        &[
            (
                "reference",
                r.reference_kv_cache,
                &output.environment.models.reference,
            ),
            (
                "candidate",
                r.kv_cache,
                &output.environment.models.candidate,
            ),
        ],
    )?;
    let floor = r.noise_floor.then(|| NoiseFloor::Skipped {
        skipped: "the noise floor of the transformers runner is its kernel sweep: `cardproof measure --runner transformers --sweep attention=sdpa,eager`".into(),
    });
    Ok(finished(
        scoring,
        &options,
        (reference_id, candidate_id, environment),
        gates_out,
        floor,
    ))
}

/// A study's arms in the transformers runner: the reference (with `runner_options`' reference
/// attention and KV cache) once per window, its hidden states kept, each arm's candidate in
/// turn against them (one program run: N arms cost N + 1 passes). Each arm's request gives its
/// candidate, attention (`attentions[i]`) and KV cache; they share the first request's
/// reference, text and options. Each arm's numbers are those of a single `measure --runner
/// transformers` of the pair.
pub(super) fn transformers_arms(
    requests: &[Request],
    attentions: &[String],
    mut pre: Preflight,
    reference_path: &Path,
    runner_options: &crate::runner::transformers::TransformersOptions,
    stage: Stage,
    progress: &(dyn Fn(usize, usize, usize) + Sync),
) -> Result<ArmsOutcome> {
    use crate::runner::transformers;
    let first = check_transformers_arms(requests, reference_path)?;
    let (text, tokenizer, stream) = tokenized(first, &mut pre)?;
    stage("hashing");
    let (reference_id, width) = checkpoint_identity(
        reference_path,
        first.threads,
        pre.reference_manifest.as_ref(),
    )?;
    let ids = arm_identities(requests, width)?;
    let options = with_padding(first, width);
    let mut runner_options = runner_options.clone();
    runner_options.gates = false;
    runner_options.kv_cache = (first.reference_kv_cache, None);
    let eval = EvalInput {
        stream: &stream,
        text_path: text,
        bos_id: tokenizer.bos_id,
        tokenizer_vocab: tokenizer.vocab_size,
    };
    stage(&format!(
        "transformers runner: reference pass, then {} arms",
        requests.len()
    ));
    let plans = score::plan_runs(&eval, &options)?;
    let vocab_size = score::used_vocab(&eval, width, &options)?;
    let work = run_work(&plans);
    let arms = arm_models(requests, attentions);
    let report = arms_progress(stage, progress);
    let started = std::time::Instant::now();
    let (outputs, environment) = transformers::run_arms(
        reference_path,
        &arms,
        &work,
        vocab_size,
        &runner_options,
        &report,
    )?;
    let total_seconds = started.elapsed().as_secs_f64();
    let arm_seconds: f64 = outputs.iter().map(|o| o.seconds).sum();
    let reference_id = ModelRecord {
        runner: environment.models.reference.clone(),
        ..reference_id
    };
    let study = StudyArms {
        eval: &eval,
        options: &options,
        width,
        tokenizer: &tokenizer,
        environment: &environment,
        reference_id: &reference_id,
    };
    let out = requests
        .iter()
        .zip(ids)
        .zip(outputs)
        .map(|((r, id), output)| study.arm_outcome(r, id, output))
        .collect::<Result<Vec<_>>>()?;
    Ok(ArmsOutcome {
        reference: reference_id,
        // The program's whole run less its arms': the reference's pass, loading and warm-up.
        reference_seconds: Some((total_seconds - arm_seconds).max(0.0)),
        arms: out,
    })
}

/// A study's first request, once every arm can run in the transformers runner: it computes
/// full-vocabulary KL only, and loads safetensors checkpoints (the reference's checked first,
/// then each arm's), so what it cannot run is refused before anything is hashed.
fn check_transformers_arms<'r, 'a>(
    requests: &'r [Request<'a>],
    reference_path: &Path,
) -> Result<&'r Request<'a>> {
    let first = requests
        .first()
        .ok_or_else(|| Error::internal(reference_path, "a study without arms"))?;
    if !matches!(first.options.vocab, VocabMode::Full) {
        return Err(Error::unsupported(
            first.candidate,
            None,
            "the transformers runner computes full-vocabulary KL only",
        ));
    }
    for model in std::iter::once(reference_path).chain(requests.iter().map(|r| r.candidate)) {
        if native::resolve(model)?.1 != "safetensors" {
            return Err(Error::unsupported(
                model,
                None,
                "the transformers runner loads safetensors checkpoint directories; a GGUF arm runs in runner: native",
            ));
        }
    }
    Ok(first)
}

/// Each arm's checkpoint identity, in the arms' order: an arm whose logit rows are not the
/// reference's `width` cannot be scored against the reference's pass.
fn arm_identities(requests: &[Request], width: usize) -> Result<Vec<ModelRecord>> {
    let mut ids = Vec::with_capacity(requests.len());
    for r in requests {
        let (id, w) = checkpoint_identity(r.candidate, r.threads, r.candidate_manifest)?;
        if w != width {
            return Err(Error::mismatch(
                r.candidate,
                Some("config.json vocab_size"),
                format!(
                    "vocabulary mismatch: the arm's logit rows have {w} entries, the reference's {width}"
                ),
            ));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// The planned runs as the transformers runner's work: each context length's windows and the
/// rows scored in each.
fn run_work(plans: &[score::RunPlan]) -> Vec<crate::runner::transformers::RunWork<'_>> {
    plans
        .iter()
        .map(|p| crate::runner::transformers::RunWork {
            context_length: p.windows.length,
            windows: &p.windows.windows,
            rows: &p.rows,
        })
        .collect()
}

/// A study's arms as the transformers runner takes them: each request's candidate and KV
/// cache, with its attention.
fn arm_models<'a>(
    requests: &[Request<'a>],
    attentions: &[String],
) -> Vec<crate::runner::transformers::ArmModel<'a>> {
    requests
        .iter()
        .zip(attentions)
        .map(|(r, attention)| crate::runner::transformers::ArmModel {
            path: r.candidate,
            attention: attention.clone(),
            kv_cache: r.kv_cache,
        })
        .collect()
}

/// The transformers runner's progress for a study, as `progress(arm, done, total)`: the runner
/// reports no arm, but "loading <path>" marks a model's turn (the reference first, then each
/// arm), so the stages are counted to know whose pass the counts are.
fn arms_progress<'a>(
    stage: Stage<'a>,
    progress: &'a (dyn Fn(usize, usize, usize) + Sync),
) -> impl Fn(&str, Option<(usize, usize)>) + Sync + 'a {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let arm_index = AtomicUsize::new(0);
    move |stage_name: &str, counts: Option<(usize, usize)>| match counts {
        Some((done, total)) => progress(arm_index.load(Ordering::Relaxed), done, total),
        None => {
            // "loading <path>" marks a model's turn: the reference first, then each arm.
            if stage_name.starts_with("loading") {
                arm_index.fetch_add(1, Ordering::Relaxed);
            }
            stage(stage_name)
        }
    }
}

/// What every arm of a transformers study shares: the text and options it is scored with, the
/// logit width, the tokenizer, the program's environment and the reference's identity.
struct StudyArms<'a> {
    eval: &'a EvalInput<'a>,
    options: &'a super::MeasureOptions,
    width: usize,
    tokenizer: &'a tokens::TokenizerFile,
    environment: &'a crate::runner::exchange::RunnerEnvironment,
    reference_id: &'a ModelRecord,
}

impl StudyArms<'_> {
    /// One arm's outcome from the program's answer: its KV cache checked against what was asked,
    /// its rows scored as a single `measure` of the pair scores them, and its environment the
    /// program's with the arm's own model record.
    fn arm_outcome(
        &self,
        r: &Request,
        id: ModelRecord,
        output: crate::runner::transformers::ArmOutput,
    ) -> Result<ArmOutcome> {
        kv_cache_ran(
            r.candidate,
            &[
                (
                    "reference",
                    r.reference_kv_cache,
                    &self.environment.models.reference,
                ),
                ("candidate", r.kv_cache, &output.model),
            ],
        )?;
        let records = output.records;
        let scoring = score::measure_records(self.eval, self.options, self.width, |_, _| {
            Ok(records.clone())
        })?;
        let mut env = self.environment.clone();
        env.models.candidate = output.model.clone();
        let arm_environment = Environment {
            kv_cache: r
                .kv_cache
                .filter(|s| s.changes_anything())
                .map(|s| crate::disclosure::kv_cache::KvCache::as_run(s, false)),
            kv_scales: recorded_kv(r.candidate, &output.model)?.kv_scales,
            ..transformers_environment(&env, self.tokenizer)
        };
        let candidate_id = ModelRecord {
            runner: output.model,
            ..id
        };
        let mut rerun = finished(
            scoring,
            self.options,
            (self.reference_id.clone(), candidate_id, arm_environment),
            Vec::new(),
            None,
        );
        for (role, pin) in &r.pins {
            rerun.measurement.pin(*role, pin);
        }
        Ok(ArmOutcome {
            rerun,
            records,
            seconds: output.seconds,
        })
    }
}

/// The gates of a lane whose reference is a stored artifact: the artifact's rows against
/// themselves and against the candidate shifted by one row, on the rows the artifact holds.
fn artifact_gates(
    reference: &dyn Runner,
    candidate: &NativeModel,
    windows: &[tokens::Windows],
    scoring: &Scoring,
    r: &Request,
    options: &super::MeasureOptions,
) -> Result<Vec<Gate>> {
    let Some(g) = &r.gates else {
        return Ok(Vec::new());
    };
    let window = windows
        .first()
        .and_then(|w| w.windows.get(gate_window(scoring)))
        .cloned()
        .unwrap_or_default();
    let l = window.len();
    let scored: Vec<usize> = (0..l)
        .filter(|&j| options.positions.selects(j as u64, l as u64))
        .collect();
    gates::run(
        reference,
        candidate,
        &window,
        &scored,
        scoring.vocab_size,
        measured(scoring, quantized(candidate), g),
    )
}

/// The candidate native against a compact reference artifact, whose tokenizer, eval text,
/// vocabulary and protocol are enforced.
pub(super) fn reference_artifact(
    r: &Request,
    pre: Preflight,
    source: super::artifact::ArtifactSource,
    compute: ComputeDtype,
    emulate: Emulate,
    stage: Stage,
    progress: Progress,
) -> Result<Rerun> {
    use super::artifact::{ArtifactRunner, Kind};
    let path = source.file;
    let (Some(artifact), Some(vouch)) = (pre.artifact, pre.vouch) else {
        return Err(Error::internal(
            path,
            "the artifact's lane was started without its pre-flight (the artifact read and vouched for)",
        ));
    };
    let h = &artifact.header;
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(r.candidate))?;
    check_artifact_tokenizer(h, &tokenizer)?;
    if let Some(text) = r.eval_text {
        check_artifact_eval_text(h, text)?;
    }
    let stream = TokenStream::of_ids(
        artifact.tokens.clone(),
        h.eval.text_sha256.clone().unwrap_or_default(),
    );
    stage("loading the candidate");
    let candidate = load_candidate(r, compute, emulate)?;
    let width = candidate.decoder.config.vocab;
    check_artifact_width(h, r.candidate, width)?;
    let options = with_padding(r, width);
    let vocab_size = options.vocab_size.unwrap_or(tokenizer.vocab_size);
    check_artifact_protocol(&artifact, path, &options, vocab_size, width)?;
    if h.kind == Kind::Hidden {
        check_artifact_lm_head(h, r.candidate, &candidate)?;
    }
    let windows: Vec<tokens::Windows> = options
        .context_lengths
        .iter()
        .map(|&l| tokens::windows(&stream, path, l, options.bos, tokenizer.bos_id))
        .collect::<Result<_>>()?;
    let candidate_id = identity(&candidate, r.candidate, r.threads, r.candidate_manifest)?;
    // The reference's LM head, for a hidden-state artifact, is the candidate's (whose digest
    // was just checked to be the reference's).
    let head = |x: Vec<f32>| -> Result<Vec<f32>> {
        candidate
            .decoder
            .head_from_rows(x)
            .map_err(|e| Error::runner(&candidate.path, format!("lm_head failed: {e}")))
    };
    let head_ref: &(dyn Fn(Vec<f32>) -> Result<Vec<f32>> + Sync) = &head;
    let runner = ArtifactRunner::new(
        &artifact,
        &windows,
        (h.kind == Kind::Hidden).then_some(head_ref),
    )?;
    let spot_check = match source.reference {
        Some(reference) => Some(spot_check(
            &runner, &windows, reference, &options, vocab_size, r.threads, stage,
        )?),
        None => None,
    };
    stage("measuring");
    let eval = EvalInput {
        stream: &stream,
        text_path: path,
        bos_id: tokenizer.bos_id,
        tokenizer_vocab: tokenizer.vocab_size,
    };
    let mut scoring = score::measure_models(&runner, &candidate, &eval, &options, progress)?;
    scoring.eval.text_path = r.eval_text.map(|t| t.display().to_string());
    if r.gates.is_some() {
        stage("sanity gates");
    }
    let gates_out = artifact_gates(&runner, &candidate, &windows, &scoring, r, &options)?;
    candidate.check_unchanged()?;
    let reference_id = artifact_reference_id(&runner);
    let mut environment = native_environment(&candidate, compute, emulate, r.threads);
    environment.reference_artifact = Some(artifact_record(path, &artifact, vouch, spot_check));
    Ok(finished(
        scoring,
        &options,
        (reference_id, candidate_id, environment),
        gates_out,
        None,
    ))
}

/// The candidate's tokenizer must be the one the artifact was made with: the artifact's token
/// stream is what that tokenizer made of the eval text.
fn check_artifact_tokenizer(
    h: &super::artifact::Header,
    tokenizer: &tokens::TokenizerFile,
) -> Result<()> {
    if h.eval.tokenizer_sha256.as_deref() != Some(tokenizer.sha256.as_str()) {
        return Err(Error::mismatch(
            &tokenizer.path,
            None,
            format!(
                "differs from the tokenizer the artifact was made with (sha256 {} vs {})",
                tokenizer.sha256,
                super::artifact::stated_text(&h.eval.tokenizer_sha256)
            ),
        ));
    }
    Ok(())
}

/// An eval text given beside an artifact (which carries its own tokens) must be the text the
/// artifact was exported from, byte for byte.
fn check_artifact_eval_text(h: &super::artifact::Header, text: &Path) -> Result<()> {
    let bytes = crate::files::read_capped(text, tokens::MAX_EVAL_TEXT_BYTES, "an eval text")?;
    let digest = crate::digest::hex(&sha2::Sha256::digest(&bytes));
    if h.eval.text_sha256.as_deref() != Some(digest.as_str()) {
        return Err(Error::mismatch(
            text,
            None,
            format!(
                "is not the artifact's eval text (sha256 {digest} vs {})",
                super::artifact::stated_text(&h.eval.text_sha256)
            ),
        ));
    }
    Ok(())
}

/// The candidate's logit rows must be as wide as the artifact's reference's, entry for entry.
fn check_artifact_width(h: &super::artifact::Header, candidate: &Path, width: usize) -> Result<()> {
    if width != h.logit_width {
        return Err(Error::mismatch(
            candidate,
            None,
            format!(
                "vocabulary mismatch: {width} logit entries, the artifact's reference has {}",
                h.logit_width
            ),
        ));
    }
    Ok(())
}

/// The run's protocol must be the one the artifact was exported for: it holds rows for those
/// windows, positions and vocabulary only.
fn check_artifact_protocol(
    artifact: &super::artifact::Artifact,
    path: &Path,
    options: &super::MeasureOptions,
    vocab_size: usize,
    width: usize,
) -> Result<()> {
    let requested = score::run_protocol(
        options,
        vocab_size,
        super::document::Padding::of(vocab_size, width, width),
    );
    let differences = artifact.protocol_differences(&requested);
    if !differences.is_empty() {
        return Err(Error::mismatch(
            path,
            None,
            format!(
                "was exported for another protocol: {}",
                differences.join("; ")
            ),
        ));
    }
    Ok(())
}

/// A hidden-state artifact's logits are recomputed with the candidate's lm_head, which must
/// therefore be the reference's (by digest).
fn check_artifact_lm_head(
    h: &super::artifact::Header,
    path: &Path,
    candidate: &NativeModel,
) -> Result<()> {
    if h.reference.lm_head_sha256.as_deref() != Some(candidate.lm_head_sha256.as_str()) {
        return Err(Error::mismatch(
            path,
            Some("lm_head"),
            format!(
                "is not the reference's (sha256 {} vs {}); a hidden-state artifact needs the reference's lm_head",
                candidate.lm_head_sha256,
                super::artifact::stated_text(&h.reference.lm_head_sha256)
            ),
        ));
    }
    Ok(())
}

/// The environment's record of the artifact the reference came from: its file and digest, its
/// kind and bound, who vouches for it and the spot check's result.
fn artifact_record(
    path: &Path,
    artifact: &super::artifact::Artifact,
    vouch: super::artifact::Vouch,
    spot_check: Option<super::artifact::SpotCheck>,
) -> ArtifactRecord {
    ArtifactRecord {
        path: path.display().to_string(),
        sha256: Some(artifact.sha256.clone()),
        kind: serde_json::to_value(artifact.header.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        bound: artifact.bound(),
        vouch: Some(vouch),
        spot_check,
    }
}

/// The reference's identity as the artifact's header states it (its weights are not here to
/// hash), with the artifact runner's environment.
fn artifact_reference_id(runner: &super::artifact::ArtifactRunner) -> ModelRecord {
    let reference = &runner.artifact.header.reference;
    let text = |v: &Option<String>, default: &str| v.as_deref().unwrap_or(default).to_owned();
    ModelRecord {
        path: text(&reference.path, ""),
        format: text(&reference.format, "artifact"),
        manifest_sha256: text(&reference.manifest_sha256, ""),
        lm_head_sha256: text(&reference.lm_head_sha256, ""),
        stored_dtype: text(&reference.stored_dtype, "unknown"),
        runner: Runner::environment(runner),
        hub: None,
    }
}

/// The artifact's rows recomputed, for a seeded sample of windows, from the reference's own
/// weights (loaded as `reference export` loads them), which must be the reference the artifact
/// names.
#[allow(clippy::too_many_arguments)]
fn spot_check(
    runner: &super::artifact::ArtifactRunner,
    windows: &[tokens::Windows],
    reference: &Path,
    options: &super::MeasureOptions,
    vocab_size: usize,
    threads: usize,
    stage: Stage,
) -> Result<super::artifact::SpotCheck> {
    use super::artifact::spot_check::{Scoring, spot_check};
    stage("loading the reference for a spot check");
    let model = native::load(
        reference,
        ComputeDtype::F32,
        Emulate::ReferenceSemantics,
        StateDtype::F32,
    )?;
    let named = runner
        .artifact
        .header
        .reference
        .manifest_sha256
        .as_deref()
        .unwrap_or_default();
    let id = identity(&model, reference, threads, None)?;
    if id.manifest_sha256 != named {
        return Err(Error::mismatch(
            reference,
            None,
            format!(
                "is not the reference {} names (root sha256 {}, the artifact names {named:?}): the spot check recomputes the artifact's rows from its reference's weights",
                runner.artifact.path.display(),
                id.manifest_sha256
            ),
        ));
    }
    let mut seed = [0u8; 8];
    getrandom::fill(&mut seed).map_err(|e| {
        Error::internal(reference, format!("no randomness for the spot check: {e}"))
    })?;
    stage("spot-checking the artifact");
    let checked = spot_check(
        runner,
        windows,
        &model,
        &id.manifest_sha256,
        &Scoring {
            positions: options.positions,
            mode: options.vocab,
            vocab_size,
        },
        u64::from_le_bytes(seed),
    )?;
    model.check_unchanged()?;
    Ok(checked)
}

/// The candidate native against a llama.cpp `--kl-divergence-base` file: the file's token
/// stream and rows are the reference (its 16-nat window stated in the output).
pub(super) fn llamacpp_base(
    r: &Request,
    pre: Preflight,
    source: super::artifact::ArtifactSource,
    compute: ComputeDtype,
    emulate: Emulate,
    stage: Stage,
    progress: Progress,
) -> Result<Rerun> {
    use super::artifact::llamacpp::{BaseFileRunner, WINDOW_NOTE};
    let path = source.file;
    let (Some(base), Some(vouch)) = (pre.base_file, pre.vouch) else {
        return Err(Error::internal(
            path,
            "the base file's lane was started without its pre-flight (the file read and vouched for)",
        ));
    };
    if source.reference.is_some() {
        return Err(Error::usage(
            path,
            "a llama.cpp base file cannot be spot-checked against the reference's weights (its rows are uint16 codes of llama.cpp's own pass); drop --reference, or export a cardproof artifact",
        ));
    }
    let stream = TokenStream::of_ids(
        base.tokens.iter().map(|&t| t as u32).collect(),
        String::new(),
    );
    stage("loading the candidate");
    let candidate = load_candidate(r, compute, emulate)?;
    let width = base.n_vocab as usize;
    if candidate.decoder.config.vocab != width {
        return Err(Error::mismatch(
            r.candidate,
            None,
            format!(
                "vocabulary mismatch: {} logit entries, the base file has {}",
                candidate.decoder.config.vocab, base.n_vocab
            ),
        ));
    }
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(r.candidate)).ok();
    let bos_id = tokenizer
        .as_ref()
        .and_then(|t| t.bos_id)
        .or(candidate.bos_id);
    let tokenizer_vocab = tokenizer.as_ref().map_or(width, |t| t.vocab_size);
    let options = with_padding(r, width);
    let vocab_size = options.vocab_size.unwrap_or(tokenizer_vocab);
    let requested = score::run_protocol(
        &options,
        vocab_size,
        super::document::Padding::of(vocab_size, width, width),
    );
    let windows = tokens::windows(&stream, path, base.n_ctx as usize, options.bos, bos_id)?;
    let runner = BaseFileRunner::new(base, &windows)?;
    let differences = runner.protocol_differences(&requested);
    if !differences.is_empty() {
        return Err(Error::mismatch(
            path,
            None,
            format!("holds another protocol: {}", differences.join("; ")),
        ));
    }
    let candidate_id = identity(&candidate, r.candidate, r.threads, r.candidate_manifest)?;
    stage("measuring");
    let eval = EvalInput {
        stream: &stream,
        text_path: path,
        bos_id,
        tokenizer_vocab,
    };
    let mut scoring = score::measure_models(&runner, &candidate, &eval, &options, progress)?;
    // A base file holds tokens, not text: no eval text was read.
    scoring.eval.text_path = None;
    if r.gates.is_some() {
        stage("sanity gates");
    }
    let gates_out = artifact_gates(
        &runner,
        &candidate,
        std::slice::from_ref(&windows),
        &scoring,
        r,
        &options,
    )?;
    candidate.check_unchanged()?;
    let reference_id = ModelRecord {
        path: path.display().to_string(),
        format: "llamacpp-base".into(),
        manifest_sha256: String::new(),
        lm_head_sha256: String::new(),
        stored_dtype: "uint16 log-probabilities".into(),
        runner: Runner::environment(&runner),
        hub: None,
    };
    let mut environment = native_environment(&candidate, compute, emulate, r.threads);
    environment.reference_artifact = Some(ArtifactRecord {
        path: path.display().to_string(),
        sha256: None,
        kind: "llamacpp_base".into(),
        bound: WINDOW_NOTE.into(),
        vouch: Some(vouch),
        spot_check: None,
    });
    Ok(finished(
        scoring,
        &options,
        (reference_id, candidate_id, environment),
        gates_out,
        None,
    ))
}
