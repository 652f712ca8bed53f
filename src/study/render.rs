//! study.md and study.html: the arms' table, the comparisons and the plots, from study.json and
//! each arm's rows (through the report's templates and escaping).

use serde_json::{Value as Json, json};

use super::document::StudyDocument;
use super::run::StudyOutcome;
use crate::error::Result;
use crate::report::{
    ArmPoint, FlipSeries, RunRows, svg_cumulative_flips, svg_forest, svg_kld_vs_bits, svg_sweep,
};

/// study.md (`html` false) or study.html.
pub fn render(outcome: &StudyOutcome, html: bool) -> Result<String> {
    let view = view(&outcome.document, &outcome.rows, html);
    crate::report::render_study(&view, html)
}

fn view(d: &StudyDocument, rows: &[Vec<RunRows>], html: bool) -> Json {
    let p = &d.protocol;
    let protocol_words = format!(
        "{} KL, {}, positions {}, BOS {}, {} resamples (seed {})",
        match p.direction {
            crate::kld::protocol::Direction::Forward => "forward",
            crate::kld::protocol::Direction::Reverse => "reverse",
            crate::kld::protocol::Direction::Both => "forward and reverse",
        },
        match p.vocab {
            crate::kld::protocol::VocabMode::Full => "full vocabulary".to_owned(),
            other => format!("{other:?}"),
        },
        p.positions.spelling(),
        p.bos.as_str(),
        p.bootstrap.resamples,
        p.bootstrap.seed
    );
    let arm_seconds: f64 = d.arms.iter().map(|a| a.seconds).sum();
    let reference = d.timings.reference_seconds.map_or_else(
        || "The reference ran beside each arm (its time is in the arm's)".to_owned(),
        |s| format!("The reference's pass took {s:.1} s"),
    );
    let timings = format!(
        "{reference}, the {} arms' {:.1} s, the whole study {:.1} s.",
        d.arms.len(),
        arm_seconds,
        d.timings.total_seconds
    );
    let mut tables = Vec::new();
    for (run_index, &length) in p.context_lengths.iter().enumerate() {
        let tool_calls = d.arms.iter().any(|a| {
            a.runs
                .get(run_index)
                .is_some_and(|r| r.tool_call_flips.is_some())
        });
        let mut depth_labels: Vec<String> = Vec::new();
        let arms: Vec<Json> = d
            .arms
            .iter()
            .filter_map(|a| {
                let r = a.runs.get(run_index)?;
                let m = |k: &str| r.metrics.get(k).copied().filter(|v| v.is_finite());
                let ci = r.uncertainty.get("kld_mean").map(|u| u.ci95);
                if depth_labels.is_empty() {
                    depth_labels = r.by_depth.iter().map(|b| b.label.clone()).collect();
                }
                Some(json!({
                    "name": a.name,
                    "changes": a.changes.as_str(),
                    "changed": a.changed.iter().map(|v| v.as_str()).collect::<Vec<_>>().join("+"),
                    "mixed": a.mixed,
                    "bits": a.bits_per_weight,
                    "size": a.size_bytes.map_or("–".to_owned(), human_bytes),
                    "kld_mean": m("kld_mean"),
                    "ci_lo": ci.map(|c| c[0]).filter(|v| v.is_finite()),
                    "ci_hi": ci.map(|c| c[1]).filter(|v| v.is_finite()),
                    "kld_p99": m("kld_p99"),
                    "top1_agreement": m("top1_agreement"),
                    "flips": r.top1_flips,
                    "tool_call_flips": r.tool_call_flips,
                    "ppl_ratio": m("ppl_ratio"),
                    "seconds": a.seconds,
                    "by_depth": r.by_depth.iter().map(|b| b.kld_mean).collect::<Vec<_>>(),
                }))
            })
            .collect();
        let pairs: Vec<Json> = d
            .comparisons
            .iter()
            .filter(|c| c.context_length == length)
            .map(|c| {
                json!({
                    "a": c.a, "b": c.b, "difference": c.difference,
                    "ci_lo": c.ci95[0], "ci_hi": c.ci95[1], "mde": c.mde,
                    "verdict": c.verdict.as_str(),
                    "verdict_key": match c.verdict {
                        super::compare::Verdict::Closer => "closer",
                        super::compare::Verdict::Farther => "farther",
                        super::compare::Verdict::NotDistinguishable => "nd",
                    },
                })
            })
            .collect();
        let plots = if html {
            plots(d, rows, run_index, length)
        } else {
            Vec::new()
        };
        tables.push(json!({
            "context_length": length,
            "tool_calls": tool_calls,
            "arms": arms,
            "pairs": pairs,
            "depth_labels": depth_labels,
            "plots": plots,
        }));
    }
    json!({
        "name": d.name,
        "run_id": d.run_id,
        "reference": {"path": d.reference.path, "manifest_sha256": d.reference.manifest_sha256},
        "eval_text": d.eval.text_path.clone().unwrap_or_default(),
        "token_count": d.eval.token_count,
        "tokens_sha256": d.eval.tokens_sha256,
        "runner": d.runner,
        "device": d.device,
        "protocol_sha256": d.protocol_sha256,
        "protocol_words": protocol_words,
        "timings": timings,
        "tables": tables,
        "turns": turns_view(d),
        "definitions": d.definitions,
        "study_file": {"path": d.study_file.path, "sha256": d.study_file.sha256},
    })
}

/// The arms' generated turns against the reference's, and the own arms compared on the same
/// turns (`null`: the study generated none). Each arm's first diverging call is its measurement's.
fn turns_view(d: &StudyDocument) -> Json {
    if d.arms.iter().all(|a| a.turns.is_none()) {
        return Json::Null;
    }
    let arms: Vec<Json> = d
        .arms
        .iter()
        .filter_map(|a| {
            let t = a.turns.as_ref()?;
            Some(json!({
                "name": a.name,
                "turns": t.turns,
                "turn_match": t.turn_match.value,
                "tool_call_match": t.tool_call_match.value,
                "tool_call_valid": t.tool_call_valid.value,
                "invalid": t.tool_call_valid.invalid_json + t.tool_call_valid.unknown_name + t.tool_call_valid.schema_mismatch,
                "tool_call_f1": t.tool_call_f1.value,
                "failures": t.recovery.failures,
                "recoveries": t.recovery.recoveries,
                "unrecovered": t.recovery.unrecovered,
                "diverging": a.first_diverging_turn.as_ref().map(|d| json!({
                    "where": format!("conversation {}, message {}", d.conversation + 1, d.message + 1),
                    "fails": d.fails,
                    "reference": d.reference,
                    "arm": d.arm,
                })),
            }))
        })
        .collect();
    let pairs: Vec<Json> = d
        .turn_comparisons
        .iter()
        .map(|c| {
            let (t, m) = (&c.comparison.turn_match, &c.comparison.tool_call_match);
            json!({
                "a": c.a, "b": c.b,
                "turn_a": t.a_only, "turn_b": t.b_only, "turn_p": t.mcnemar_p,
                "call_a": m.a_only, "call_b": m.b_only, "call_p": m.mcnemar_p,
            })
        })
        .collect();
    let strips: Vec<(String, Vec<crate::kld::turns::TurnOutcome>)> = d
        .arms
        .iter()
        .filter(|a| !a.turn_outcomes.is_empty())
        .map(|a| (a.name.clone(), a.turn_outcomes.clone()))
        .collect();
    let strip = (!strips.is_empty()).then(|| crate::report::svg_turn_strip(&strips));
    // Where the turns came from: the conversation file beside the eval text, or the eval text.
    let source = d.turns.as_ref().map(|t| {
        json!({
            "select": t.protocol.turns,
            "max_new_tokens": t.protocol.max_new_tokens,
            "conversation": t.conversation,
        })
    });
    json!({"arms": arms, "pairs": pairs, "strip": strip, "source": source})
}

/// The four plots of one context length.
fn plots(d: &StudyDocument, rows: &[Vec<RunRows>], run_index: usize, length: usize) -> Vec<Json> {
    let runs: Vec<(&str, &RunRows)> = d
        .arms
        .iter()
        .zip(rows)
        .filter_map(|(a, r)| Some((a.name.as_str(), r.get(run_index)?)))
        .collect();
    let flips: Vec<FlipSeries> = runs
        .iter()
        .map(|(name, r)| FlipSeries {
            name: (*name).to_owned(),
            rows: stream_positions(r, length)
                .into_iter()
                .zip(&r.flip)
                .map(|(x, &f)| (x, f))
                .collect(),
        })
        .collect();
    let along: Vec<(String, RunRows)> = runs
        .iter()
        .map(|(name, r)| ((*name).to_owned(), (*r).clone()))
        .collect();
    let points: Vec<ArmPoint> = d
        .arms
        .iter()
        .filter_map(|a| {
            let r = a.runs.get(run_index)?;
            Some(ArmPoint {
                name: a.name.clone(),
                kld_mean: r.metrics.get("kld_mean").copied().unwrap_or(f64::NAN),
                ci: r
                    .uncertainty
                    .get("kld_mean")
                    .map_or([f64::NAN; 2], |u| u.ci95),
                // Only an arm that changes the weights sits on the bits-per-weight axis (a KV
                // cache or kernel arm has the reference's weights, and its point there misled).
                bits_per_weight: a
                    .changed
                    .contains(&super::file::Variable::Weights)
                    .then_some(a.bits_per_weight)
                    .flatten(),
            })
        })
        .collect();
    // The controls are no quantization: they stay off the size chart.
    let own: Vec<ArmPoint> = points
        .iter()
        .zip(&d.arms)
        .filter(|(_, a)| a.kind == super::plan::ArmKind::Study)
        .map(|(p, _)| p.clone())
        .collect();
    vec![
        json!({"svg": svg_cumulative_flips(length, &flips),
               "caption": "Top-1 flips counted along the eval text, one line per arm: where the flips pile up."}),
        json!({"svg": svg_sweep(length, "the reference", &along),
               "caption": "Mean KLD by position in the window (log axis, bins of positions) and, below, the top-1 flip rate, per arm."}),
        json!({"svg": svg_kld_vs_bits(length, &own),
               "caption": "Mean KLD against bits per weight, each arm's 95% interval as a bar: the size a closer quant costs."}),
        json!({"svg": svg_forest(length, &points),
               "caption": "Each arm's mean KLD and 95% block-bootstrap interval."}),
    ]
}

/// Where each row sits in the text: the predicted token's index for a conversation, else the
/// window's start plus j (the rows' windows are their bootstrap blocks when there are several;
/// one window is window 0).
fn stream_positions(r: &RunRows, length: usize) -> Vec<u64> {
    if r.token.len() == r.position.len() && !r.token.is_empty() {
        return r.token.clone();
    }
    if r.window.len() != r.position.len() {
        return r.position.clone();
    }
    r.position
        .iter()
        .zip(&r.window)
        .map(|(&j, &w)| w as u64 * length as u64 + j)
        .collect()
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
