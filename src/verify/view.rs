//! report.md and report.html from the typed [`Report`]: the view model the templates read, built
//! from the report's own types (so a field the report does not have cannot be shown, and every
//! verdict, KL direction, vocabulary mode and position policy has its words here by an
//! exhaustive match). The templates, their escaping and filters are [`crate::report`]'s.
//!
//! Three parts are shown as the records they are, one row per field: the card's disclosure (any
//! shape: a card that breaks the schema is judged and shown too), the reference's and the eval
//! text's records, and the environment (the runners' own reports nest inside it).

use serde::Serialize;
use serde_json::{Value as Json, json};

use super::Report;
use super::claims::{ClaimResult, Verdict};
use crate::disclosure::precision;
use crate::disclosure::vocabulary::METRICS;
use crate::error::Result;
use crate::kld::protocol::{Bos, Direction, Positions, Tail, VocabMode};
use crate::kld::stats::Bucket;
use crate::report::{self, RunRows, format_number, svg_histogram};
use crate::rerun::NoiseFloor;
use crate::rerun::document::{Measurement, Padding, RunProtocol, RunRecord};

/// Disclosure leaves shown at most (a card has a size budget, but stay bounded anyway).
const MAX_DISCLOSURE_ROWS: usize = 400;

/// report.md.
pub fn render_markdown(report: &Report) -> Result<String> {
    report::render_report(&view_model(report, &[], false), false)
}

/// The self-contained report.html (inline CSS and SVG, no script, nothing fetched), with the
/// plots of `rows` (empty: no plots).
pub fn render_html(report: &Report, rows: &[RunRows]) -> Result<String> {
    report::render_report(&view_model(report, rows, true), true)
}

/// Any serializable value as JSON (a value that cannot serialize shows as nothing).
fn json_of(v: &impl Serialize) -> Json {
    serde_json::to_value(v).unwrap_or(Json::Null)
}

/// A value as display text: strings as they are, other scalars as JSON, a flat mapping as
/// `key: value` pairs and a flat list as its items (a report showed `{"bf16":29}`), anything
/// deeper as compact JSON.
fn text(v: &Json) -> Json {
    let scalar = |v: &Json| match v {
        Json::String(s) => Some(s.clone()),
        Json::Number(_) | Json::Bool(_) => Some(v.to_string()),
        _ => None,
    };
    match v {
        Json::Null => Json::Null,
        Json::String(s) => Json::String(s.clone()),
        Json::Object(m) if m.values().all(|x| scalar(x).is_some()) => Json::String(
            m.iter()
                .map(|(k, x)| format!("{k}: {}", scalar(x).unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Json::Array(a) if a.iter().all(|x| scalar(x).is_some()) => Json::String(
            a.iter()
                .map(|x| scalar(x).unwrap_or_default())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        other => Json::String(other.to_string()),
    }
}

/// A verdict's label, its emoji (report.md: GitHub renders them) and its mark (report.html: a
/// text glyph every font has; emoji render as boxes without an emoji font).
fn verdict(v: Verdict) -> Json {
    let (label, symbol, mark) = match v {
        Verdict::Reproduced => ("Reproduced", "✅", "✓"),
        Verdict::NotReproduced => ("Not reproduced", "❌", "✗"),
        Verdict::Imprecise => ("Imprecise", "❌", "✗"),
        Verdict::Invalid => ("Invalid", "❌", "✗"),
        Verdict::NotComparable => ("Not comparable", "⚠️", "!"),
        Verdict::Undisclosed => ("Undisclosed", "❔", "?"),
    };
    json!({"key": v.as_str(), "label": label, "symbol": symbol, "mark": mark})
}

fn overall_explanation(v: Verdict) -> &'static str {
    match v {
        Verdict::Reproduced => {
            "Every claim was rerun in the card's lane on the same token stream and matched within its printed precision."
        }
        Verdict::NotReproduced => {
            "At least one claim was rerun in the card's lane on the same token stream and did not match."
        }
        Verdict::Imprecise => {
            "At least one claim is printed too coarsely to be checked: its digits allow more than 5% of its value, so no rerun can reproduce it."
        }
        Verdict::Invalid => {
            "At least one entry of the card's results cannot be read as a claim (a quoted or non-finite value, an unknown key or metric), so the card cannot be verified."
        }
        Verdict::NotComparable => {
            "The rerun differs from the card's lane or protocol; its numbers stand beside the claims and are not a reproduction."
        }
        Verdict::Undisclosed => {
            "The card leaves out an item its claims need, so the numbers cannot be interpreted."
        }
    }
}

fn view_model(report: &Report, rows: &[RunRows], html: bool) -> Json {
    let summary: Vec<Json> = Verdict::ALL
        .iter()
        .map(|&v| {
            let mut row = verdict(v);
            row["label"] = json!(row["label"].as_str().unwrap_or_default().to_lowercase());
            row["count"] = json!(report.summary.get(v.as_str()).copied().unwrap_or(0));
            row
        })
        .collect();
    let measurement = report.measurement.as_ref();
    let runs: Vec<&RunRecord> = measurement
        .map(|m| m.runs.iter().collect())
        .unwrap_or_default();
    let histogram = (html && !rows.is_empty()).then(|| svg_histogram(rows));
    json!({
        "tool": {"name": report.tool.name, "version": report.tool.version},
        "run_id": report.run_id,
        "card_fidelity_sha256": report.card.fidelity_sha256,
        "reference_source": report.reference_source,
        "verdict": verdict(report.verdict),
        "explanation": overall_explanation(report.verdict),
        "summary": summary,
        "claims": report.claims.iter().map(claim_view).collect::<Vec<_>>(),
        "undisclosed": report.undisclosed,
        "protocol": measurement.map_or(Json::Null, protocol_view),
        "environment": measurement.map_or(Json::Null, |m| environment_view(&m.environment)),
        "eval": measurement.map(|m| items(&json_of(&m.eval), EVAL_LABELS)).unwrap_or_default(),
        "reference": items(&json_of(&report.reference), REFERENCE_LABELS),
        "sanity": report.sanity.iter().map(|g| json!({
            "gate": g.gate,
            "passed": g.passed,
            "detail": g.detail,
        })).collect::<Vec<_>>(),
        "noise_floor": report.noise_floor.as_ref().map_or(Json::Null, noise_floor_view),
        "runs": runs.iter().map(|r| run_view(r, rows, html)).collect::<Vec<_>>(),
        "turns": measurement.and_then(|m| m.turns.as_ref()).map_or(Json::Null, turns_view),
        "any_low_support": runs.iter().any(|r| !r.summary.low_support.is_empty()),
        "histogram": histogram,
        "checkpoint": checkpoint_view(report),
        "card": card_view(report),
        "definitions": measurement.map(|m| m.definitions.iter().map(|(k, v)| json!({"name": k, "text": text(v)})).collect::<Vec<_>>()).unwrap_or_default(),
    })
}

/// Turns shown where they first differ, at most.
const SHOWN_DIVERGING_TURNS: usize = 5;
/// Characters of a turn's text shown in a report.
const SHOWN_TURN_CHARS: usize = 160;

/// The generated turns: how they were generated, each turn metric with its counts, recovery,
/// and the first turns where the two models' outputs differ (their texts on one line each).
fn turns_view(t: &crate::rerun::turns::TurnsRecord) -> Json {
    let one_line = |text: &str| -> String {
        let flat: String = text
            .chars()
            .map(|c| if c == '\n' { '⏎' } else { c })
            .filter(|c| !c.is_control())
            .take(SHOWN_TURN_CHARS)
            .collect();
        if text.chars().count() > SHOWN_TURN_CHARS {
            format!("{flat}…")
        } else {
            flat
        }
    };
    let s = &t.summary;
    json!({
        "turns": s.turns,
        "conversations": s.conversations,
        "select": json_of(&t.protocol.turns),
        "max_new_tokens": t.protocol.max_new_tokens,
        "stop_ids": t.stop_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        "call_format": t.call_format_name(),
        "rows": t.metric_rows().iter().map(|r| json!({
            "metric": r.metric,
            "value": r.value.and_then(|v| crate::disclosure::precision::claim_text(r.metric, v)),
            "counts": r.counts,
            "ci95": r.ci95,
        })).collect::<Vec<_>>(),
        "recovery": json_of(&s.recovery),
        "diverging": t.turns.iter().filter_map(|turn| {
            let at = turn.first_divergence?;
            Some(json!({
                "conversation": turn.conversation,
                "message": turn.message,
                "at": at,
                "reference": one_line(&turn.reference.text),
                "candidate": one_line(&turn.candidate.text),
            }))
        }).take(SHOWN_DIVERGING_TURNS).collect::<Vec<_>>(),
        "diverging_total": s.first_divergence.turns,
    })
}

/// A finite number, else nothing (JSON has no NaN or infinity).
fn finite(x: Option<f64>) -> Option<f64> {
    x.filter(|x| x.is_finite())
}

fn claim_view(c: &ClaimResult) -> Json {
    let (delta, delta_rel) = match (finite(c.claimed), finite(c.rerun)) {
        (Some(a), Some(b)) => {
            let d = b - a;
            (Some(d), (a != 0.0).then(|| d / a.abs()))
        }
        _ => (None, None),
    };
    let ci = c
        .rerun_ci95
        .filter(|[lo, hi]| lo.is_finite() && hi.is_finite());
    // The claim as the card wrote it (0.0120 keeps its zero) when that is a plain decimal, and
    // the rerun one digit finer; both are digits, a sign, a point and an exponent only.
    let claimed_text = Some(c.claimed_text.as_str())
        .filter(|t| precision::written_digits(t).is_some())
        .map(|t| t.trim().to_owned());
    let rerun_text = match (&claimed_text, finite(c.rerun)) {
        (Some(t), Some(r)) => precision::rerun_text(t, r),
        _ => None,
    };
    let rel_text = match (finite(c.claimed), finite(c.rerun)) {
        (Some(a), Some(b)) => precision::relative_difference(a, b).map(precision::percent_text),
        _ => None,
    };
    json!({
        "metric": c.metric,
        "context_length": c.context_length,
        "turn": crate::disclosure::vocabulary::is_turn_metric(&c.metric),
        "claimed": finite(c.claimed),
        "claimed_text": claimed_text,
        "rerun_text": rerun_text,
        "rel_text": rel_text,
        "claimed_uncertainty": finite(c.claimed_uncertainty),
        "rerun": finite(c.rerun),
        "rerun_ci95": ci,
        "delta": delta,
        "delta_rel": delta_rel,
        "tolerance": finite(c.tolerance),
        "verdict": verdict(c.verdict),
        "reason": c.reason,
        "differences": c.differences,
    })
}

/// The protocol in plain words: one `{label, text, formula}` per setting.
fn protocol_view(m: &Measurement) -> Json {
    let p = &m.protocol;
    let mut out = Vec::new();
    let mut item = |label: &str, text: String, formula: Option<&str>| {
        out.push(json!({"label": label, "text": text, "formula": formula}));
    };
    for (label, text, formula) in direction_items(p.direction) {
        item(label, text, formula);
    }
    item("Units", p.units.clone(), None);
    item("Vocabulary", vocabulary_text(p), None);
    item("Positions", positions_text(p.positions), None);
    item("Context lengths", context_lengths_text(p), None);
    let bos = match p.bos {
        Bos::None => "none: windows start with the text's own tokens",
        Bos::PerWindow => {
            "per window: the first token of each window replaced by BOS (as llama.cpp)"
        }
        Bos::PerDocument => "per document: BOS prepended at each document start before windowing",
    };
    item("BOS", bos.to_owned(), None);
    item("Aggregation", aggregation_text(p), None);
    item("Top-1", format!("argmax = {}", p.top1), None);
    if p.llamacpp_compat {
        item("Compatibility", "llama.cpp statistics".to_owned(), None);
    }
    json!({"items": out, "sha256": m.protocol_sha256})
}

/// The KL direction's rows (label, text, formula): one, or two when both directions were
/// measured.
fn direction_items(d: Direction) -> Vec<(&'static str, String, Option<&'static str>)> {
    const FORWARD: &str = "KL(P_ref ‖ P_cand) = Σ_i p_ref(i) · (log p_ref(i) − log p_cand(i))";
    const REVERSE: &str = "KL(P_cand ‖ P_ref) = Σ_i p_cand(i) · (log p_cand(i) − log p_ref(i))";
    let forward = ("KL direction", "forward (kld_*)".to_owned(), Some(FORWARD));
    match d {
        Direction::Forward => vec![forward],
        Direction::Reverse => vec![(
            "KL direction",
            "reverse (kld_reverse_*)".into(),
            Some(REVERSE),
        )],
        Direction::Both => vec![
            forward,
            ("…and", "reverse (kld_reverse_*)".into(), Some(REVERSE)),
        ],
    }
}

/// Which vocabulary terms the KL sums, how many logit entries, and what became of padding.
fn vocabulary_text(p: &RunProtocol) -> String {
    let terms = match p.vocab {
        VocabMode::Full => "full vocabulary: every term of the sum".to_owned(),
        VocabMode::TopK { k, tail } => match tail {
            Tail::Lumped => format!(
                "the reference's top {k} tokens, the rest lumped into one bucket (a lower bound on the full KL)"
            ),
            Tail::Dropped => format!("the reference's top {k} tokens only; the tail dropped"),
            Tail::Renormalized => {
                format!("the reference's top {k} tokens, both distributions renormalized over them")
            }
        },
        VocabMode::Threshold { log_p } => format!(
            "reference terms with log p ≤ {} dropped (as llama.cpp)",
            json!(log_p)
        ),
    };
    let padding = match p.padding {
        Padding::Excluded => "padding entries beyond the tokenizer's vocabulary excluded",
        Padding::None => "no padding entries",
        Padding::Included => "padding entries included",
    };
    format!("{terms}; {} logit entries used; {padding}", p.vocab_size)
}

/// Which rows of each window are scored.
fn positions_text(pos: Positions) -> String {
    let every = |stride: Option<u64>, offset: Option<u64>| match (stride, offset) {
        (Some(s), Some(o)) => format!(", at rows with j mod {s} = {o}"),
        _ => String::new(),
    };
    match pos {
        Positions::All => "every row j = 0 … L−2 (row j predicts token j+1)".to_owned(),
        Positions::Stride { stride, offset } => {
            format!("rows with j mod {stride} = {offset} (row j predicts token j+1)")
        }
        Positions::SecondHalf => {
            "rows j = L/2 … L−2, the second half of each window (as llama.cpp)".to_owned()
        }
        Positions::From { from } => format!("rows j ≥ {from} (row j predicts token j+1)"),
        Positions::Role {
            role,
            stride,
            offset,
        } => format!(
            "rows whose predicted token is in a message of role {}{} (row j predicts token j+1)",
            role.as_str(),
            every(stride, offset)
        ),
        Positions::Span {
            span,
            stride,
            offset,
        } => format!(
            "rows whose predicted token is in a {} span{} (row j predicts token j+1)",
            span.as_str(),
            every(stride, offset)
        ),
    }
}

/// The context lengths and how the windows were cut.
fn context_lengths_text(p: &RunProtocol) -> String {
    let lengths: Vec<String> = p.context_lengths.iter().map(usize::to_string).collect();
    let lengths = if lengths.is_empty() {
        "not recorded".to_owned()
    } else {
        format!("{} tokens", lengths.join(", "))
    };
    format!("{lengths}; windows {}", p.windows)
}

/// How rows are pooled, and the bootstrap behind the intervals.
fn aggregation_text(p: &RunProtocol) -> String {
    let pooled = match p.aggregation.as_str() {
        "mean_over_positions" => "mean over all scored rows of all windows",
        other => other,
    };
    let b = &p.bootstrap;
    let blocks = match p.bootstrap_block.as_str() {
        "window" => ", blocks = whole windows".to_owned(),
        block => format!(", blocks = {block}"),
    };
    format!(
        "{pooled}; uncertainty: {}% block-bootstrap interval, {} resamples, seed {}{blocks}; sem \
         is the i.i.d. per-row standard error (as llama.cpp prints)",
        format_number(b.level * 100.0, 4),
        b.resamples,
        b.seed
    )
}

/// The environment, one row per field; its nested records (the tokenizer, a runner's report)
/// one row per field of theirs, `tokenizer.sha256`.
fn environment_view(env: &crate::rerun::document::Environment) -> Json {
    let mut items = Vec::new();
    if let Json::Object(map) = json_of(env) {
        for (k, v) in map.iter().filter(|(k, _)| *k != "lane") {
            match v {
                Json::Object(inner) if !inner.is_empty() => {
                    for (ik, iv) in inner {
                        items.push(row(ik, &format!("{k}.{ik}"), iv));
                    }
                }
                _ => items.push(row(k, k, v)),
            }
        }
    }
    json!({"lane": env.lane, "items": items})
}

const EVAL_LABELS: &[(&str, &str)] = &[
    ("text_path", "eval text"),
    ("text_sha256", "text SHA-256"),
    ("text_bytes", "text bytes"),
    ("tokens_sha256", "tokens SHA-256"),
    ("token_count", "tokens"),
    ("bos", "BOS"),
];

const REFERENCE_LABELS: &[(&str, &str)] = &[
    ("path", "reference"),
    ("repo", "repository"),
    ("revision", "revision"),
    ("manifest_sha256", "manifest SHA-256"),
    ("lm_head_sha256", "lm_head SHA-256"),
];

/// One record row; hashes and revisions are shown as code.
fn row(key: &str, label: &str, value: &Json) -> Json {
    json!({
        "label": label,
        "value": text(value),
        "digest": key.ends_with("sha256") || key == "revision",
    })
}

/// A record's rows: the known keys first with their labels, then any others under their own
/// names (a nested record one row per field, `runner.format`); nulls left out.
fn items(v: &Json, labels: &[(&str, &str)]) -> Vec<Json> {
    let Some(map) = v.as_object() else {
        return Vec::new();
    };
    let mut out: Vec<Json> = labels
        .iter()
        .filter_map(|(k, label)| {
            map.get(*k)
                .filter(|v| !v.is_null())
                .map(|v| row(k, label, v))
        })
        .collect();
    for (k, v) in map
        .iter()
        .filter(|(k, v)| !v.is_null() && !labels.iter().any(|(l, _)| *l == k.as_str()))
    {
        match v {
            Json::Object(inner) if !inner.is_empty() => {
                for (ik, iv) in inner.iter().filter(|(_, v)| !v.is_null()) {
                    out.push(row(ik, &format!("{k}.{ik}"), iv));
                }
            }
            _ => out.push(row(k, k, v)),
        }
    }
    out
}

/// Metric names in the vocabulary's order, then any others.
fn metric_names<'a>(present: impl Iterator<Item = &'a String> + Clone) -> Vec<&'a str> {
    let mut names: Vec<&str> = METRICS
        .iter()
        .copied()
        .filter(|n| present.clone().any(|k| k == n))
        .collect();
    for k in present {
        if !names.contains(&k.as_str()) {
            names.push(k);
        }
    }
    names
}

/// The noise floor: what was compared (or why it was skipped), and a table of metric × context
/// length.
fn noise_floor_view(v: &NoiseFloor) -> Json {
    match v {
        NoiseFloor::Measured { what, runs } => {
            let names = metric_names(runs.iter().flat_map(|r| r.metrics.keys()));
            let rows: Vec<Json> = names
                .iter()
                .map(|n| {
                    let values: Vec<Option<f64>> = runs
                        .iter()
                        .map(|r| finite(r.metrics.get(*n).copied()))
                        .collect();
                    json!({"name": n, "values": values})
                })
                .collect();
            let lengths: Vec<usize> = runs.iter().map(|r| r.context_length).collect();
            json!({"what": what, "skipped": null, "lengths": lengths, "rows": rows})
        }
        NoiseFloor::Skipped { skipped } => {
            json!({"what": null, "skipped": skipped, "lengths": [], "rows": []})
        }
    }
}

fn run_view(r: &RunRecord, rows: &[RunRows], html: bool) -> Json {
    let s = &r.summary;
    let metric_rows: Vec<Json> = metric_names(s.metrics.keys())
        .iter()
        .map(|name| {
            let u = s.uncertainty.get(*name);
            let ci = u.map(|u| u.ci95);
            json!({
                "name": name,
                "value": finite(s.metrics.get(*name).copied()),
                "sem": finite(u.and_then(|u| u.sem)),
                "ci_lo": finite(ci.map(|c| c[0])),
                "ci_hi": finite(ci.map(|c| c[1])),
                "low_support": s.low_support.iter().any(|l| l == name),
            })
        })
        .collect();
    let buckets = |b: &[Bucket]| -> Vec<Json> {
        b.iter()
            .map(|b| {
                json!({
                    "label": b.label,
                    "n": b.n,
                    "kld_mean": finite(b.kld_mean),
                    "top1_flips": b.top1_flips,
                    "flip_rate": finite(b.flip_rate),
                })
            })
            .collect()
    };
    let run_rows = rows
        .iter()
        .find(|x| x.context_length == r.context_length)
        .filter(|_| html);
    let plot = run_rows.map(report::svg_kld_along_position);
    let conversation_plot = run_rows.and_then(report::svg_kld_along_conversation);
    // A conversation's rows by segment, role and inside/outside tool calls.
    let spans: Vec<Json> = r
        .spans
        .iter()
        .map(|p| {
            let ci = p.uncertainty.get("kld_mean").map(|u| u.ci95);
            json!({
                "by": p.by.replace('_', "-"),
                "name": p.name,
                "n": p.n_positions,
                "kld_mean": finite(p.metrics.get("kld_mean").copied()),
                "ci_lo": finite(ci.map(|c| c[0])),
                "ci_hi": finite(ci.map(|c| c[1])),
                "top1_agreement": finite(p.metrics.get("top1_agreement").copied()),
                "top1_flips": p.top1_flips,
            })
        })
        .collect();
    json!({
        "context_length": r.context_length,
        "n_windows": r.n_windows,
        "n_positions": r.n_positions,
        "n_nonfinite": r.n_nonfinite,
        "dropped_tokens": r.dropped_tokens,
        "bootstrap_block": r.bootstrap_block,
        "metrics": metric_rows,
        "low_support": !s.low_support.is_empty(),
        "by_depth": buckets(&s.diagnostics.by_depth),
        "by_confidence": buckets(&s.diagnostics.by_confidence),
        "plot": plot,
        "conversation_plot": conversation_plot,
        "spans": spans,
    })
}

fn checkpoint_view(report: &Report) -> Json {
    let c = &report.checkpoint;
    let files: Vec<Json> = c
        .files
        .iter()
        .map(|f| json!({"path": f.path, "size": f.size, "sha256": f.sha256}))
        .collect();
    json!({"path": c.path, "root_sha256": c.root_sha256, "files": files})
}

fn card_view(report: &Report) -> Json {
    let c = &report.card;
    let findings: Vec<Json> = c
        .lint
        .findings
        .iter()
        .map(|f| json!({"code": f.code, "severity": f.severity, "message": f.message, "line": f.line}))
        .collect();
    let mut leaves = Vec::new();
    flatten(&c.disclosure, &mut String::new(), &mut leaves);
    let hidden = leaves.len().saturating_sub(MAX_DISCLOSURE_ROWS);
    leaves.truncate(MAX_DISCLOSURE_ROWS);
    json!({
        "path": c.path,
        "lint": {"errors": c.lint.errors, "warnings": c.lint.warnings, "findings": findings},
        "disclosure": leaves,
        "disclosure_hidden": hidden,
    })
}

/// Every leaf of the card's disclosure as `{pointer, value}` (JSON-pointer paths, RFC 6901
/// escaping).
fn flatten(v: &Json, pointer: &mut String, out: &mut Vec<Json>) {
    let child = |key: &str, v: &Json, pointer: &mut String, out: &mut Vec<Json>| {
        let len = pointer.len();
        pointer.push('/');
        pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
        flatten(v, pointer, out);
        pointer.truncate(len);
    };
    match v {
        Json::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                child(k, v, pointer, out);
            }
        }
        Json::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                child(&i.to_string(), v, pointer, out);
            }
        }
        Json::Null if pointer.is_empty() => {}
        leaf => out.push(json!({
            "pointer": if pointer.is_empty() { "/".to_owned() } else { pointer.clone() },
            "value": match leaf { Json::Null => Json::String("null".into()), other => text(other) },
        })),
    }
}
