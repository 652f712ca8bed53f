//! Running a study: its plan's arms as rerun requests against one reference pass, each arm's
//! measurement written as `measure` writes it, the arms summarized and paired, and study.json,
//! study.md and study.html written beside them.

use std::path::Path;

use super::compare::{self, Paired};
use super::document::{
    ArmRun, ArmSettings, ArmSummary, DEFINITIONS, ReferenceRecord, StudyDocument, StudyFileRecord,
    Timings, TurnComparison,
};
use super::file::{Study, StudyRunner};
use super::plan::{ArmKind, Plan, PlannedArm};
use crate::error::{Error, Result};
use crate::kld::protocol::Segment;
use crate::rerun::{self, Request, RunnerSpec};

/// How a study run ended: finished, or interrupted with its completed arms written into the
/// set for `study --resume` (see [`super::resume`]).
pub enum Ran {
    Complete(Box<StudyOutcome>),
    Interrupted {
        error: Error,
        completed: Vec<String>,
        remaining: Vec<String>,
    },
}

/// A finished study: its document and, per arm, the rows the plots draw.
pub struct StudyOutcome {
    pub document: StudyDocument,
    /// Per arm (the document's order), each context length's rows.
    pub rows: Vec<Vec<crate::report::RunRows>>,
}

/// Run `study` as `plan` (its [`super::plan::plan`]) says and write every arm's measurement into `out`
/// (the output set's directory). `room` is asked whether the arms' outputs fit before the first
/// forward pass (see [`rerun::study::run_arms`]). `progress(done, total)` counts windows of the
/// current pass; `stage` names each pass (`arm 3/7 fp8-block`). `resume`: the completed arms of
/// an interrupted run of this study, replayed instead of run.
#[allow(clippy::too_many_arguments)]
pub fn run(
    study: &Study,
    plan: &Plan,
    out: &Path,
    run_id: Option<&str>,
    threads: usize,
    resume: Option<&super::resume::Resume>,
    room: &(dyn Fn(&Request, &rerun::preflight::Identity) -> Result<()> + Sync),
    stage: &(dyn Fn(&str) + Sync),
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Ran> {
    let started = std::time::Instant::now();
    let runners: Vec<RunnerSpec> = plan.arms.iter().map(|a| runner_of(plan, a)).collect();
    let requests: Vec<Request> = plan
        .arms
        .iter()
        .zip(&runners)
        .map(|(a, runner)| request(plan, a, runner, threads))
        .collect();
    let names: Vec<String> = plan.arms.iter().map(|a| a.name.clone()).collect();
    let kernels: Vec<crate::runner::transformers::ArmKernel> = plan
        .arms
        .iter()
        .map(|a| crate::runner::transformers::ArmKernel {
            attention: a.settings.attention.clone(),
            gdn_kernel: a.settings.gdn_kernel.clone(),
        })
        .collect();
    let outcome = rerun::study::run_arms(
        &requests,
        &names,
        &kernels,
        resume.map(|r| &r.carry),
        plan.baseline.compute,
        room,
        stage,
        &|_, done, total| progress(done, total),
    )?;
    if let Some(r) = resume {
        super::resume::check_replay(r, &outcome.arms)?;
    }
    if let Some(interrupted) = outcome.interrupted {
        for (arm, result) in plan.arms.iter().zip(&outcome.arms) {
            arm_summary(plan, arm, result, run_id, out)?;
        }
        let c = &interrupted.carry;
        super::resume::write_incomplete(out, study, plan, c, &interrupted.error, run_id)?;
        let names = |arms: &[PlannedArm]| arms.iter().map(|a| a.name.clone()).collect();
        return Ok(Ran::Interrupted {
            error: interrupted.error,
            completed: names(&plan.arms[..c.arms.len()]),
            remaining: names(&plan.arms[c.arms.len()..]),
        });
    }
    stage("comparing the arms");
    let o = &plan.options;
    let mut arms = Vec::with_capacity(plan.arms.len());
    let mut rows = Vec::with_capacity(plan.arms.len());
    for (arm, result) in plan.arms.iter().zip(&outcome.arms) {
        arms.push(arm_summary(plan, arm, result, run_id, out)?);
        rows.push(
            result
                .rerun
                .runs
                .iter()
                .map(crate::report::RunRows::from)
                .collect(),
        );
    }
    let comparisons = comparisons(plan, &outcome, o);
    let turn_comparisons = turn_comparisons(plan, &outcome, o)
        .map_err(|why| Error::internal(&study.path, format!("comparing the arms' turns: {why}")))?;
    let first = &outcome
        .arms
        .first()
        .ok_or_else(|| Error::internal(&study.path, "a study ran no arm"))?
        .rerun
        .measurement;
    let (reference_bits, reference_size) = footprint(&plan.reference);
    let document = StudyDocument {
        schema_version: crate::schema::SchemaVersion,
        run_id: run_id.map(str::to_owned),
        kind: "study".into(),
        name: study.name(),
        study_file: StudyFileRecord {
            path: study.path.display().to_string(),
            sha256: study.sha256.clone(),
        },
        reference: ReferenceRecord {
            path: plan.reference.display().to_string(),
            manifest_sha256: outcome.reference.manifest_sha256.clone(),
            bits_per_weight: reference_bits,
            size_bytes: reference_size,
        },
        eval: first.eval.clone(),
        protocol: first.protocol.clone(),
        protocol_sha256: first.protocol_sha256.clone(),
        turns: first
            .turns
            .as_ref()
            .map(super::document::StudyTurnsRecord::of),
        runner: plan.runner.as_str().into(),
        device: first.environment.device.clone(),
        definitions: DEFINITIONS.into(),
        arms,
        comparisons,
        turn_comparisons,
        timings: Timings {
            reference_seconds: outcome.reference_seconds,
            total_seconds: started.elapsed().as_secs_f64(),
        },
        set_files: Vec::new(),
        resumed: resume.map(|r| r.resumed.clone()),
    };
    Ok(Ran::Complete(Box::new(StudyOutcome { document, rows })))
}

/// One arm's summary for study.json, its measurement written into `out` as `measure` writes it.
fn arm_summary(
    plan: &Plan,
    arm: &PlannedArm,
    result: &rerun::study::ArmOutcome,
    run_id: Option<&str>,
    out: &Path,
) -> Result<ArmSummary> {
    let m = &result.rerun.measurement;
    let (bits_per_weight, size_bytes) = footprint(&arm.candidate);
    let dir = format!("arms/{}", arm.name);
    let mut measurement = m.clone();
    measurement.run_id = run_id.map(str::to_owned);
    rerun::output::write_measurement(&out.join(&dir), &measurement, &result.rerun.runs)?;
    Ok(ArmSummary {
        name: arm.name.clone(),
        kind: arm.kind,
        changes: arm.declared,
        changed: arm.changed.clone(),
        mixed: arm.mixed,
        candidate: arm.candidate.display().to_string(),
        manifest_sha256: m.candidate.manifest_sha256.clone(),
        settings: ArmSettings {
            kv_cache: arm.settings.kv_cache.map_or("none".into(), |s| s.name()),
            compute_dtype: match plan.runner {
                StudyRunner::Llamacpp => "llama.cpp's".into(),
                _ => arm.settings.compute.as_str().into(),
            },
            attention: arm.settings.attention.clone(),
            gdn_kernel: arm.settings.gdn_kernel.clone(),
            recurrent_state: arm.settings.recurrent_state.as_str().into(),
            emulate: format!("{:?}", arm.settings.emulate),
        },
        bits_per_weight,
        size_bytes,
        measurement: format!("{dir}/measurement.json"),
        runs: result
            .rerun
            .runs
            .iter()
            .map(|run| ArmRun {
                context_length: run.context_length,
                n_positions: run.n_positions,
                top1_flips: run
                    .rows
                    .iter()
                    .filter(|r| r.record.ref_top1 != r.record.cand_top1)
                    .count(),
                tool_call_flips: (!run.labels.is_empty()).then(|| {
                    run.rows
                        .iter()
                        .zip(&run.labels)
                        .filter(|(r, l)| {
                            l.segment == Segment::ToolCall
                                && r.record.ref_top1 != r.record.cand_top1
                        })
                        .count()
                }),
                metrics: run.summary.metrics.clone(),
                uncertainty: run.summary.uncertainty.clone(),
                by_depth: run.summary.diagnostics.by_depth.clone(),
            })
            .collect(),
        seconds: result.seconds,
        turns: m.turns.as_ref().map(|t| t.summary.clone()),
        first_diverging_turn: m.turns.as_ref().and_then(first_diverging_turn),
        turn_outcomes: m.turns.as_ref().map_or_else(Vec::new, |t| {
            t.pairs.iter().map(crate::kld::turns::outcome).collect()
        }),
    })
}

/// The runner of an arm: the study's llama.cpp flags with the arm's `-fa`, the study's
/// transformers settings, or the native runner in the arm's compute dtype and emulation.
fn runner_of(plan: &Plan, arm: &PlannedArm) -> RunnerSpec {
    if let Some(o) = &plan.llamacpp {
        let mut o = o.clone();
        o.settings.flash_attn = Some(arm.settings.attention.clone());
        return RunnerSpec::Llamacpp(o);
    }
    match &plan.transformers {
        Some(t) => RunnerSpec::Transformers(t.clone()),
        None => RunnerSpec::Native {
            compute: arm.settings.compute,
            emulate: arm.settings.emulate,
        },
    }
}

/// An arm as a rerun request: the study's reference, text, template and options, the arm's
/// checkpoint, runner and settings.
fn request<'a>(
    plan: &'a Plan,
    arm: &'a PlannedArm,
    runner: &'a RunnerSpec,
    threads: usize,
) -> Request<'a> {
    let lane = runner.checkpoint_lane(&plan.reference);
    Request {
        candidate_manifest: Some(&arm.manifest),
        reference_manifest: Some(&plan.reference_manifest),
        chat_template: plan.chat_template.clone(),
        recurrent_state: arm.settings.recurrent_state,
        kv_cache: arm.settings.kv_cache,
        reference_kv_cache: plan.baseline.kv_cache,
        turns: plan.turns,
        turns_conversation: plan.turns_conversation.as_deref(),
        ..Request::new(
            lane,
            &arm.candidate,
            Some(&plan.eval_text),
            plan.options.clone(),
            threads,
        )
    }
}

/// An arm's first failing turn, else its first turn whose tokens differ from the reference's.
fn first_diverging_turn(t: &rerun::turns::TurnsRecord) -> Option<super::document::DivergingTurn> {
    let show = |(i, fails): (usize, bool)| {
        let turn = &t.turns[i];
        super::document::DivergingTurn {
            conversation: turn.conversation,
            message: turn.message,
            fails,
            reference: turn.reference.text.clone(),
            arm: turn.candidate.text.clone(),
        }
    };
    let failing = t
        .pairs
        .iter()
        .position(|p| !crate::kld::turns::turn_holds(p))
        .map(|i| (i, true));
    let differing = t
        .turns
        .iter()
        .position(|turn| turn.first_divergence.is_some())
        .map(|i| (i, false));
    failing.or(differing).map(show)
}

/// Every pair of the study's own arms (not the controls) on their generated turns.
fn turn_comparisons(
    plan: &Plan,
    outcome: &rerun::study::ArmsOutcome,
    o: &rerun::MeasureOptions,
) -> std::result::Result<Vec<TurnComparison>, String> {
    let own: Vec<usize> = (0..plan.arms.len())
        .filter(|&i| plan.arms[i].kind == ArmKind::Study)
        .collect();
    let turns = |i: usize| outcome.arms[i].rerun.measurement.turns.as_ref();
    let mut out = Vec::new();
    for (x, &i) in own.iter().enumerate() {
        for &j in &own[x + 1..] {
            let (Some(a), Some(b)) = (turns(i), turns(j)) else {
                continue;
            };
            out.push(TurnComparison {
                a: plan.arms[i].name.clone(),
                b: plan.arms[j].name.clone(),
                comparison: crate::kld::turns::compare(&a.pairs, &b.pairs, &o.bootstrap)?,
            });
        }
    }
    Ok(out)
}

/// Every pair of the study's own arms (not the controls), per context length.
fn comparisons(
    plan: &Plan,
    outcome: &rerun::study::ArmsOutcome,
    o: &rerun::MeasureOptions,
) -> Vec<Paired> {
    let own: Vec<usize> = (0..plan.arms.len())
        .filter(|&i| plan.arms[i].kind == ArmKind::Study)
        .collect();
    let mut out = Vec::new();
    for (run, &length) in o.context_lengths.iter().enumerate() {
        for (x, &i) in own.iter().enumerate() {
            for &j in &own[x + 1..] {
                let (a, b) = (&outcome.arms[i].records, &outcome.arms[j].records);
                let (Some(a), Some(b)) = (a.get(run), b.get(run)) else {
                    continue;
                };
                out.push(compare::paired(
                    (&plan.arms[i].name, a),
                    (&plan.arms[j].name, b),
                    length,
                    o.bootstrap.resamples,
                    o.bootstrap.seed,
                    o.bootstrap.level,
                ));
            }
        }
    }
    out
}

/// A checkpoint's bits per weight (over its linear modules, weighted by parameters) and the
/// stored size of its files, from its headers; `None` where inspect cannot say.
fn footprint(path: &Path) -> (Option<f64>, Option<u64>) {
    let Ok(inspections) = crate::checkpoint::inspect::inspect_path(path) else {
        return (None, None);
    };
    let Some(i) = inspections.first() else {
        return (None, None);
    };
    let (bits, params) = i.modules.iter().fold((0.0, 0u64), |(b, p), m| {
        (
            b + m.bits_per_weight * m.parameters as f64,
            p + m.parameters,
        )
    });
    let size = i.files.iter().map(|f| f.size).sum();
    ((params > 0).then(|| bits / params as f64), Some(size))
}
