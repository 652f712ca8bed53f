//! From report.json to report.md and report.html: a view model with every field the templates
//! read (absent and null fields become `none`, so [`UndefinedBehavior::Strict`] catches template
//! typos instead of hiding them), the embedded templates, and their filters.
//!
//! Escaping. Card values and paths are untrusted. The HTML template is autoescaped (its name ends
//! in `.html.j2`). The Markdown template is autoescaped too, with a custom `md` mode whose formatter
//! runs [`escape_markdown`] over every printed value that is not marked safe; the `md` filter does
//! the same explicitly (and marks its result safe), `code` puts a value in a code span where that is
//! safe, and `num`/`exact` print numbers.

use std::path::Path;

use minijinja::value::{Value, ValueKind};
use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde_json::{Value as Json, json};

use super::RunRows;
use super::svg::{svg_histogram, svg_kld_along_conversation, svg_kld_along_position};
use crate::disclosure::precision;
use crate::error::{Error, Result};

const MD_NAME: &str = "report.md.j2";
const HTML_NAME: &str = "report.html.j2";
const MD_TEMPLATE: &str = include_str!("../../templates/report.md.j2");
const HTML_TEMPLATE: &str = include_str!("../../templates/report.html.j2");
/// The one report schema version these templates know.
const SCHEMA_VERSION: u64 = 1;
/// Disclosure leaves shown at most (a card has a size budget, but stay bounded anyway).
const MAX_DISCLOSURE_ROWS: usize = 400;

/// Render report.md from the report document.
pub fn render_markdown(report: &Json) -> Result<String> {
    let view = view_model(report, &[], false)?;
    render(MD_NAME, MD_TEMPLATE, &view)
}

/// Render the self-contained report.html (inline CSS and SVG, no script, nothing fetched) from the
/// report document and the per-row data of its runs (empty: no plots).
pub fn render_html(report: &Json, rows: &[RunRows]) -> Result<String> {
    let view = view_model(report, rows, true)?;
    render(HTML_NAME, HTML_TEMPLATE, &view)
}

const STUDY_MD_TEMPLATE: &str = include_str!("../../templates/study.md.j2");
const STUDY_HTML_TEMPLATE: &str = include_str!("../../templates/study.html.j2");

/// study.md (`html` false) or study.html from a study's view (the study document with its plots
/// as strings), with the report's environment, filters and escaping.
pub fn render_study(view: &Json, html: bool) -> Result<String> {
    if html {
        render("study.html.j2", STUDY_HTML_TEMPLATE, view)
    } else {
        render("study.md.j2", STUDY_MD_TEMPLATE, view)
    }
}

fn template_path(name: &str) -> std::path::PathBuf {
    Path::new("templates").join(name)
}

fn render(name: &str, source: &str, view: &Json) -> Result<String> {
    let fail = |e: minijinja::Error| Error::internal(&template_path(name), format!("{e:#}"));
    let env = environment().map_err(fail)?;
    let template = env.template_from_named_str(name, source).map_err(fail)?;
    let mut out = template
        .render(Value::from(minijinja::value::Serde(view)))
        .map_err(fail)?;
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// The template environment: strict undefined, HTML autoescape for `.html.j2`, Markdown
/// autoescape (`md`) for `.md.j2`, and the report's filters.
fn environment() -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // Bounds template work whatever the report holds (loops over claims, files, rows).
    env.set_fuel(Some(50_000_000));
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()?,
    );
    env.set_auto_escape_callback(|name| {
        let name = name.strip_suffix(".j2").unwrap_or(name);
        if name.ends_with(".html") {
            AutoEscape::Html
        } else if name.ends_with(".md") {
            AutoEscape::Custom("md".into())
        } else {
            AutoEscape::None
        }
    });
    env.set_formatter(|out, state, value| {
        if matches!(state.auto_escape(), AutoEscape::Custom(mode) if mode == "md") {
            if value.is_safe() {
                return out
                    .write_str(value.as_str().unwrap_or_default())
                    .map_err(minijinja::Error::from);
            }
            let text = if value.is_none() {
                "–".to_owned()
            } else {
                value.to_string()
            };
            return out
                .write_str(&super::escape_markdown(&text))
                .map_err(minijinja::Error::from);
        }
        minijinja::escape_formatter(out, state, value)
    });
    env.add_filter("md", md_filter);
    env.add_filter("code", code_filter);
    env.add_filter("num", num_filter);
    env.add_filter("exact", exact_filter);
    env.add_filter("signed", signed_filter);
    Ok(env)
}

/// `{{ x | md }}`: Markdown-escape any value (none prints as "–"); the result is marked safe.
fn md_filter(value: Value) -> Value {
    if value.is_safe() {
        return value;
    }
    let text = if value.is_none() || value.is_undefined() {
        "–".to_owned()
    } else {
        value.to_string()
    };
    Value::from_safe_string(super::escape_markdown(&text))
}

/// `{{ x | code }}`: a Markdown code span when the text can sit in one safely (no backtick, pipe
/// or control character), else the escaped text. Marked safe.
fn code_filter(value: Value) -> Value {
    if value.is_none() || value.is_undefined() {
        return Value::from_safe_string("–".to_owned());
    }
    let text = value.to_string();
    let plain = !text.is_empty()
        && !text.starts_with(' ')
        && !text.ends_with(' ')
        && !text
            .chars()
            .any(|c| c == '`' || c == '|' || c.is_control() || crate::markdown::is_bidi_control(c));
    if plain {
        Value::from_safe_string(format!("`{text}`"))
    } else {
        Value::from_safe_string(super::escape_markdown(&text))
    }
}

/// `{{ x | num }}` / `{{ x | num(6) }}`: a number to `digits` significant digits (default 4);
/// integers print whole, none prints "–", anything else passes through (and is escaped).
fn num_filter(value: Value, digits: Option<usize>) -> Value {
    match number(&value) {
        Some(x) => Value::from_safe_string(format_number(x, digits.unwrap_or(4))),
        None if value.is_none() || value.is_undefined() => Value::from_safe_string("–".into()),
        None => value,
    }
}

/// `{{ x | exact }}`: the shortest decimal that reads back as the same number (a claim as the
/// card printed it).
fn exact_filter(value: Value) -> Value {
    match number(&value) {
        Some(x) if x.is_finite() => Value::from_safe_string(format!("{x}")),
        Some(x) => Value::from_safe_string(format_number(x, 4)),
        None if value.is_none() || value.is_undefined() => Value::from_safe_string("–".into()),
        None => value,
    }
}

/// `{{ x | signed }}`: like `num` with an explicit sign ("+0.0012", "−0.0004").
fn signed_filter(value: Value, digits: Option<usize>) -> Value {
    match number(&value) {
        Some(x) if x.is_finite() && x > 0.0 => {
            Value::from_safe_string(format!("+{}", format_number(x, digits.unwrap_or(2))))
        }
        _ => num_filter(value, digits.or(Some(2))),
    }
}

fn number(value: &Value) -> Option<f64> {
    (value.kind() == ValueKind::Number)
        .then(|| f64::try_from(value.clone()).ok())
        .flatten()
}

/// A number for people: integral values whole, others to `sig` significant digits (trailing zeros
/// dropped), scientific notation outside [1e-4, 1e7).
pub fn format_number(x: f64, sig: usize) -> String {
    let sig = sig.clamp(1, 17);
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return "0".into();
    }
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{}", x as i64);
    }
    let e = x.abs().log10().floor() as i32;
    if (-4..7).contains(&e) {
        let decimals = (sig as i32 - 1 - e).max(0) as usize;
        let s = format!("{x:.decimals$}");
        trim_zeros(&s).to_owned()
    } else {
        let s = format!("{:.*e}", sig - 1, x);
        match s.split_once('e') {
            Some((mantissa, exp)) => format!("{}e{exp}", trim_zeros(mantissa)),
            None => s,
        }
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------------------
// The view model.

static NULL: Json = Json::Null;

fn at<'a>(v: &'a Json, pointer: &str) -> &'a Json {
    v.pointer(pointer).unwrap_or(&NULL)
}

/// A value as display text: strings as they are, other scalars as JSON, containers compact JSON.
fn text(v: &Json) -> Json {
    match v {
        Json::Null => Json::Null,
        Json::String(s) => Json::String(s.clone()),
        Json::Number(_) | Json::Bool(_) => Json::String(v.to_string()),
        other => Json::String(other.to_string()),
    }
}

/// A number when it is one (templates format it), else its text.
fn num_or_text(v: &Json) -> Json {
    if v.is_number() { v.clone() } else { text(v) }
}

const VERDICTS: &[(&str, &str, &str)] = &[
    ("reproduced", "Reproduced", "✅"),
    ("not_reproduced", "Not reproduced", "❌"),
    ("imprecise", "Imprecise", "❌"),
    ("invalid", "Invalid", "❌"),
    ("not_comparable", "Not comparable", "⚠️"),
    ("undisclosed", "Undisclosed", "❔"),
];

fn verdict(v: &Json) -> Json {
    let key = v.as_str().unwrap_or("");
    match VERDICTS.iter().find(|(k, _, _)| *k == key) {
        Some((k, label, symbol)) => json!({"key": k, "label": label, "symbol": symbol}),
        None => json!({
            "key": "unknown",
            "label": if key.is_empty() { "No verdict".to_owned() } else { format!("Unknown verdict {key:?}") },
            "symbol": "❔",
        }),
    }
}

fn overall_explanation(key: &str) -> &'static str {
    match key {
        "reproduced" => {
            "Every claim was rerun in the card's lane on the same token stream and matched within its printed precision."
        }
        "not_reproduced" => {
            "At least one claim was rerun in the card's lane on the same token stream and did not match."
        }
        "imprecise" => {
            "At least one claim is printed too coarsely to be checked: its digits allow more than 5% of its value, so no rerun can reproduce it."
        }
        "invalid" => {
            "At least one entry of the card's results cannot be read as a claim (a quoted or non-finite value, an unknown key or metric), so the card cannot be verified."
        }
        "not_comparable" => {
            "The rerun differs from the card's lane or protocol; its numbers stand beside the claims and are not a reproduction."
        }
        "undisclosed" => {
            "The card leaves out an item its claims need, so the numbers cannot be interpreted."
        }
        _ => "The report carries no known verdict; treat the claims as unverified.",
    }
}

fn view_model(report: &Json, rows: &[RunRows], html: bool) -> Result<Json> {
    if let Some(version) = report.get("schema_version").filter(|v| !v.is_null())
        && version.as_u64() != Some(SCHEMA_VERSION)
    {
        return Err(Error::unsupported(
            Path::new("report.json"),
            Some("schema_version"),
            format!(
                "unsupported report schema_version {version} (this cardproof renders version {SCHEMA_VERSION})"
            ),
        ));
    }
    let overall = verdict(at(report, "/verdict"));
    let key = overall["key"].as_str().unwrap_or("unknown").to_owned();
    let summary: Vec<Json> = VERDICTS
        .iter()
        .map(|(k, label, symbol)| {
            json!({
                "key": k,
                "label": label.to_lowercase(),
                "symbol": symbol,
                "count": at(report, &format!("/summary/{k}")).as_u64().unwrap_or(0),
            })
        })
        .collect();
    let measurement = at(report, "/measurement");
    let runs: Vec<Json> = at(measurement, "/runs")
        .as_array()
        .map(|runs| runs.iter().map(|r| run_view(r, rows, html)).collect())
        .unwrap_or_default();
    let histogram = (html && !rows.is_empty()).then(|| svg_histogram(rows));
    Ok(json!({
        "tool": {
            "name": text(at(report, "/tool/name")).as_str().map_or("cardproof".into(), str::to_owned),
            "version": text(at(report, "/tool/version")),
        },
        "generated_at": text(at(report, "/generated_at")),
        "run_id": text(at(report, "/run_id")),
        "card_fidelity_sha256": text(at(report, "/card/fidelity_sha256")),
        "reference_source": text(at(report, "/reference_source")),
        "verdict": overall,
        "explanation": overall_explanation(&key),
        "summary": summary,
        "claims": at(report, "/claims").as_array().map(|c| c.iter().map(claim_view).collect::<Vec<_>>()).unwrap_or_default(),
        "undisclosed": at(report, "/undisclosed").as_array().map(|u| u.iter().filter_map(Json::as_str).map(str::to_owned).collect::<Vec<_>>()).unwrap_or_default(),
        "protocol": protocol_view(measurement),
        "environment": environment_view(at(measurement, "/environment")),
        "eval": items(at(measurement, "/eval"), EVAL_LABELS),
        "reference": items(at(report, "/reference"), REFERENCE_LABELS),
        "sanity": at(report, "/sanity").as_array().map(|s| s.iter().map(|g| json!({
            "gate": text(at(g, "/gate")),
            "passed": at(g, "/passed").as_bool(),
            "detail": text(at(g, "/detail")),
        })).collect::<Vec<_>>()).unwrap_or_default(),
        "noise_floor": noise_floor_view(at(report, "/noise_floor")),
        "runs": runs,
        "any_low_support": at(measurement, "/runs").as_array().is_some_and(|r| r.iter().any(|r| at(r, "/low_support").as_array().is_some_and(|l| !l.is_empty()))),
        "histogram": histogram,
        "checkpoint": checkpoint_view(at(report, "/checkpoint")),
        "card": card_view(at(report, "/card")),
        "definitions": at(measurement, "/definitions").as_object().map(|d| d.iter().map(|(k, v)| json!({"name": k, "text": text(v)})).collect::<Vec<_>>()).unwrap_or_default(),
    }))
}

fn claim_view(c: &Json) -> Json {
    let claimed = at(c, "/claimed");
    let rerun = at(c, "/rerun");
    let (delta, delta_rel) = match (claimed.as_f64(), rerun.as_f64()) {
        (Some(a), Some(b)) if a.is_finite() && b.is_finite() => {
            let d = b - a;
            (
                json!(d),
                if a != 0.0 {
                    json!(d / a.abs())
                } else {
                    Json::Null
                },
            )
        }
        _ => (Json::Null, Json::Null),
    };
    let ci = at(c, "/rerun_ci95");
    let ci = match (at(ci, "/0").as_f64(), at(ci, "/1").as_f64()) {
        (Some(lo), Some(hi)) => json!([lo, hi]),
        _ => Json::Null,
    };
    // The claim as the card wrote it (0.0120 keeps its zero) when that is a plain decimal, and
    // the rerun one digit finer; both are digits, a sign, a point and an exponent only.
    let claimed_text = at(c, "/claimed_text")
        .as_str()
        .filter(|t| precision::written_digits(t).is_some())
        .map(|t| t.trim().to_owned());
    let rerun_text = match (&claimed_text, rerun.as_f64()) {
        (Some(t), Some(r)) => precision::rerun_text(t, r),
        _ => None,
    };
    let rel_text = match (claimed.as_f64(), rerun.as_f64()) {
        (Some(a), Some(b)) => precision::relative_difference(a, b).map(precision::percent_text),
        _ => None,
    };
    json!({
        "metric": text(at(c, "/metric")),
        "context_length": num_or_text(at(c, "/context_length")),
        "claimed": num_or_text(claimed),
        "claimed_text": claimed_text,
        "rerun_text": rerun_text,
        "rel_text": rel_text,
        "claimed_uncertainty": num_or_text(at(c, "/claimed_uncertainty")),
        "rerun": num_or_text(rerun),
        "rerun_ci95": ci,
        "delta": delta,
        "delta_rel": delta_rel,
        "tolerance": num_or_text(at(c, "/tolerance")),
        "verdict": verdict(at(c, "/verdict")),
        "reason": text(at(c, "/reason")),
        "differences": at(c, "/differences").as_array().map(|d| d.iter().map(text).collect::<Vec<_>>()).unwrap_or_default(),
    })
}

/// The protocol in plain words: one `{label, text, formula}` per setting.
fn protocol_view(m: &Json) -> Json {
    let p = at(m, "/protocol");
    if !p.is_object() {
        return Json::Null;
    }
    let mut out = Vec::new();
    let mut item = |label: &str, text: String, formula: Option<&str>| {
        out.push(json!({"label": label, "text": text, "formula": formula}));
    };
    for (label, text, formula) in direction_items(p) {
        item(label, text, formula);
    }
    item(
        "Units",
        at(p, "/units")
            .as_str()
            .unwrap_or("not recorded")
            .to_owned(),
        None,
    );
    item("Vocabulary", vocabulary_text(p), None);
    item("Positions", positions_text(at(p, "/positions")), None);
    item("Context lengths", context_lengths_text(p), None);
    let bos = at(p, "/bos")
        .as_str()
        .or_else(|| at(m, "/eval/bos").as_str());
    item(
        "BOS",
        match bos {
            Some("none") => "none: windows start with the text's own tokens".to_owned(),
            Some("per_window") => {
                "per window: the first token of each window replaced by BOS (as llama.cpp)"
                    .to_owned()
            }
            Some("per_document") => {
                "per document: BOS prepended at each document start before windowing".to_owned()
            }
            Some(other) => other.to_owned(),
            None => "not recorded".to_owned(),
        },
        None,
    );
    item("Aggregation", aggregation_text(p), None);
    if let Some(top1) = at(p, "/top1").as_str() {
        item("Top-1", format!("argmax = {top1}"), None);
    }
    if at(p, "/llamacpp_compat").as_bool() == Some(true) {
        item("Compatibility", "llama.cpp statistics".to_owned(), None);
    }
    json!({"items": out, "sha256": text(at(m, "/protocol_sha256"))})
}

/// A protocol number (or whatever stands there) as text, `?` when absent.
fn num(v: &Json) -> String {
    text(v).as_str().unwrap_or("?").to_owned()
}

/// The KL direction's rows (label, text, formula): one, or two when both directions were
/// measured.
fn direction_items(p: &Json) -> Vec<(&'static str, String, Option<&'static str>)> {
    const FORWARD: &str = "KL(P_ref ‖ P_cand) = Σ_i p_ref(i) · (log p_ref(i) − log p_cand(i))";
    const REVERSE: &str = "KL(P_cand ‖ P_ref) = Σ_i p_cand(i) · (log p_cand(i) − log p_ref(i))";
    match at(p, "/direction").as_str() {
        Some("forward") => vec![("KL direction", "forward (kld_*)".into(), Some(FORWARD))],
        Some("reverse") => vec![(
            "KL direction",
            "reverse (kld_reverse_*)".into(),
            Some(REVERSE),
        )],
        Some("both") => vec![
            ("KL direction", "forward (kld_*)".into(), Some(FORWARD)),
            ("…and", "reverse (kld_reverse_*)".into(), Some(REVERSE)),
        ],
        Some(other) => vec![("KL direction", other.to_owned(), None)],
        None => vec![("KL direction", "not recorded".into(), None)],
    }
}

/// Which vocabulary terms the KL sums, how many logit entries, and what became of padding.
fn vocabulary_text(p: &Json) -> String {
    let vocab = at(p, "/vocab");
    let mut vocab_text = match at(vocab, "/mode").as_str() {
        Some("full") => "full vocabulary: every term of the sum".to_owned(),
        Some("top_k") => {
            let k = text(at(vocab, "/k"));
            let k = k.as_str().unwrap_or("?");
            match at(vocab, "/tail").as_str() {
                Some("lumped") => format!(
                    "the reference's top {k} tokens, the rest lumped into one bucket (a lower bound on the full KL)"
                ),
                Some("dropped") => format!("the reference's top {k} tokens only; the tail dropped"),
                Some("renormalized") => format!(
                    "the reference's top {k} tokens, both distributions renormalized over them"
                ),
                other => format!(
                    "the reference's top {k} tokens, tail {}",
                    other.unwrap_or("?")
                ),
            }
        }
        Some("threshold") => format!(
            "reference terms with log p ≤ {} dropped (as llama.cpp)",
            text(at(vocab, "/log_p")).as_str().unwrap_or("?")
        ),
        Some(other) => other.to_owned(),
        None => "not recorded".to_owned(),
    };
    if let Some(n) = at(p, "/vocab_size").as_u64() {
        vocab_text.push_str(&format!("; {n} logit entries used"));
    }
    match at(p, "/padding").as_str() {
        Some("excluded") => {
            vocab_text.push_str("; padding entries beyond the tokenizer's vocabulary excluded")
        }
        Some("none") => vocab_text.push_str("; no padding entries"),
        Some("included") => vocab_text.push_str("; padding entries included"),
        Some(other) => vocab_text.push_str(&format!("; padding: {other}")),
        None => {}
    }
    vocab_text
}

/// Which rows of each window are scored (`pos` is the protocol's `positions`).
fn positions_text(pos: &Json) -> String {
    match at(pos, "/policy").as_str() {
        Some("all") => "every row j = 0 … L−2 (row j predicts token j+1)".to_owned(),
        Some("stride") => format!(
            "rows with j mod {} = {} (row j predicts token j+1)",
            num(at(pos, "/stride")),
            num(at(pos, "/offset"))
        ),
        Some("second_half") => {
            "rows j = L/2 … L−2, the second half of each window (as llama.cpp)".to_owned()
        }
        Some("from") => format!(
            "rows j ≥ {} (row j predicts token j+1)",
            num(at(pos, "/from"))
        ),
        Some(other) => other.to_owned(),
        None => "not recorded".to_owned(),
    }
}

/// The context lengths (a list, or the older single length) and how the windows were cut.
fn context_lengths_text(p: &Json) -> String {
    let lengths: Vec<String> = at(p, "/context_lengths")
        .as_array()
        .map(|a| a.iter().map(num).collect())
        .or_else(|| {
            at(p, "/context_length")
                .as_u64()
                .map(|l| vec![l.to_string()])
        })
        .unwrap_or_default();
    let mut windows = if lengths.is_empty() {
        "not recorded".to_owned()
    } else {
        format!("{} tokens", lengths.join(", "))
    };
    if let Some(w) = at(p, "/windows").as_str() {
        windows.push_str(&format!("; windows {w}"));
    }
    windows
}

/// How rows are pooled, and the bootstrap behind the intervals when there is one.
fn aggregation_text(p: &Json) -> String {
    let mut aggregation = match at(p, "/aggregation").as_str() {
        Some("mean_over_positions") => "mean over all scored rows of all windows".to_owned(),
        Some(other) => other.to_owned(),
        None => "not recorded".to_owned(),
    };
    let b = at(p, "/bootstrap");
    if b.is_object() {
        let level = at(b, "/level")
            .as_f64()
            .map_or("?".to_owned(), |l| format_number(l * 100.0, 4));
        aggregation.push_str(&format!(
            "; uncertainty: {level}% block-bootstrap interval, {} resamples, seed {}",
            num(at(b, "/resamples")),
            num(at(b, "/seed"))
        ));
        match at(p, "/bootstrap_block").as_str() {
            Some("window") => aggregation.push_str(", blocks = whole windows"),
            Some(block) => aggregation.push_str(&format!(", blocks = {block}")),
            None => {}
        }
        aggregation.push_str("; sem is the i.i.d. per-row standard error (as llama.cpp prints)");
    }
    aggregation
}

fn environment_view(env: &Json) -> Json {
    let Some(map) = env.as_object() else {
        return Json::Null;
    };
    let mut items = Vec::new();
    environment_items(map, "", &mut items);
    json!({"lane": text(at(env, "/lane")), "items": items})
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

/// Known keys first with their labels, then any others under their own names. `digest` marks
/// values shown as code (hashes and revisions).
fn items(v: &Json, labels: &[(&str, &str)]) -> Vec<Json> {
    let Some(map) = v.as_object() else {
        return Vec::new();
    };
    let row = |key: &str, label: &str, value: &Json| {
        json!({
            "label": label,
            "value": text(value),
            "digest": key.ends_with("sha256") || key == "revision",
        })
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
            // A nested object (the reference's runner) one row per field, `runner.format`.
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

/// The noise floor as named fields: what was compared (or why it was skipped), and a table of
/// metric × context length (metrics in the vocabulary's order, then any others).
fn noise_floor_view(v: &Json) -> Json {
    match v {
        Json::Null => Json::Null,
        Json::Object(_) => {
            let runs: Vec<&Json> = at(v, "/runs")
                .as_array()
                .map(|r| r.iter().collect())
                .unwrap_or_default();
            let mut names: Vec<String> = crate::disclosure::vocabulary::METRICS
                .iter()
                .filter(|n| runs.iter().any(|r| at(r, "/metrics").get(**n).is_some()))
                .map(|n| (*n).to_owned())
                .collect();
            for r in &runs {
                if let Some(m) = at(r, "/metrics").as_object() {
                    for k in m.keys() {
                        if !names.contains(k) {
                            names.push(k.clone());
                        }
                    }
                }
            }
            let rows: Vec<Json> = names
                .iter()
                .map(|n| {
                    let values: Vec<Json> = runs
                        .iter()
                        .map(|r| num_or_text(at(r, "/metrics").get(n).unwrap_or(&NULL)))
                        .collect();
                    json!({"name": n, "values": values})
                })
                .collect();
            let lengths: Vec<Json> = runs
                .iter()
                .map(|r| num_or_text(at(r, "/context_length")))
                .collect();
            json!({
                "what": text(at(v, "/what")),
                "skipped": text(at(v, "/skipped")),
                "lengths": lengths,
                "rows": rows,
            })
        }
        other => json!({"what": Json::Null, "skipped": text(other), "lengths": [], "rows": []}),
    }
}

/// The environment's nested objects (the tokenizer) as one row per field, `tokenizer.sha256`.
fn environment_items(map: &serde_json::Map<String, Json>, prefix: &str, out: &mut Vec<Json>) {
    for (k, v) in map {
        if prefix.is_empty() && k == "lane" {
            continue;
        }
        let label = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Json::Object(inner) if !inner.is_empty() && prefix.is_empty() => {
                environment_items(inner, &label, out)
            }
            _ => out.push(json!({
                "label": label,
                "value": text(v),
                "digest": k.ends_with("sha256") || k == "revision",
            })),
        }
    }
}

fn run_view(r: &Json, rows: &[RunRows], html: bool) -> Json {
    let low: Vec<&str> = at(r, "/low_support")
        .as_array()
        .map(|a| a.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let metrics = at(r, "/metrics").as_object();
    let mut names: Vec<&str> = crate::disclosure::vocabulary::METRICS
        .iter()
        .copied()
        .filter(|n| metrics.is_some_and(|m| m.contains_key(*n)))
        .collect();
    if let Some(m) = metrics {
        names.extend(
            m.keys()
                .map(String::as_str)
                .filter(|k| !crate::disclosure::vocabulary::METRICS.contains(k)),
        );
    }
    let metric_rows: Vec<Json> = names
        .iter()
        .map(|name| {
            let u = at(r, "/uncertainty").get(*name).unwrap_or(&NULL);
            let ci = at(u, "/ci95");
            json!({
                "name": name,
                "value": num_or_text(metrics.and_then(|m| m.get(*name)).unwrap_or(&NULL)),
                "sem": num_or_text(at(u, "/sem")),
                "ci_lo": num_or_text(at(ci, "/0")),
                "ci_hi": num_or_text(at(ci, "/1")),
                "low_support": low.contains(name),
            })
        })
        .collect();
    let buckets = |pointer: &str| -> Vec<Json> {
        at(r, pointer)
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|b| {
                        json!({
                            "label": text(at(b, "/label")),
                            "n": num_or_text(at(b, "/n")),
                            "kld_mean": num_or_text(at(b, "/kld_mean")),
                            "top1_flips": num_or_text(at(b, "/top1_flips")),
                            "flip_rate": num_or_text(at(b, "/flip_rate")),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let length = at(r, "/context_length");
    let run_rows = length
        .as_u64()
        .and_then(|l| rows.iter().find(|x| x.context_length as u64 == l))
        .filter(|_| html);
    let plot = run_rows
        .map(|x| Json::String(svg_kld_along_position(x)))
        .unwrap_or(Json::Null);
    let conversation_plot = run_rows
        .and_then(svg_kld_along_conversation)
        .map_or(Json::Null, Json::String);
    // A conversation's rows by segment, role and inside/outside tool calls.
    let spans: Vec<Json> = at(r, "/spans")
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let ci = at(p, "/uncertainty/kld_mean/ci95");
                    json!({
                        "by": at(p, "/by").as_str().unwrap_or_default().replace('_', "-"),
                        "name": text(at(p, "/name")),
                        "n": num_or_text(at(p, "/n_positions")),
                        "kld_mean": num_or_text(at(p, "/metrics/kld_mean")),
                        "ci_lo": num_or_text(at(ci, "/0")),
                        "ci_hi": num_or_text(at(ci, "/1")),
                        "top1_agreement": num_or_text(at(p, "/metrics/top1_agreement")),
                        "top1_flips": num_or_text(at(p, "/top1_flips")),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "context_length": num_or_text(length),
        "n_windows": num_or_text(at(r, "/n_windows")),
        "n_positions": num_or_text(at(r, "/n_positions")),
        "n_nonfinite": num_or_text(at(r, "/n_nonfinite")),
        "dropped_tokens": num_or_text(at(r, "/dropped_tokens")),
        "bootstrap_block": text(at(r, "/bootstrap_block")),
        "metrics": metric_rows,
        "low_support": !low.is_empty(),
        "by_depth": buckets("/diagnostics/by_depth"),
        "by_confidence": buckets("/diagnostics/by_confidence"),
        "plot": plot,
        "conversation_plot": conversation_plot,
        "spans": spans,
    })
}

fn checkpoint_view(c: &Json) -> Json {
    if !c.is_object() {
        return Json::Null;
    }
    let files: Vec<Json> = at(c, "/files")
        .as_array()
        .map(|f| {
            f.iter()
                .map(|f| {
                    json!({
                        "path": text(at(f, "/path")),
                        "size": num_or_text(at(f, "/size")),
                        "sha256": text(at(f, "/sha256")),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "path": text(at(c, "/path")),
        "root_sha256": text(at(c, "/root_sha256")),
        "files": files,
    })
}

fn card_view(c: &Json) -> Json {
    if !c.is_object() {
        return Json::Null;
    }
    let lint = at(c, "/lint");
    let lint = if lint.is_object() {
        json!({
            "errors": at(lint, "/errors").as_u64().unwrap_or(0),
            "warnings": at(lint, "/warnings").as_u64().unwrap_or(0),
            "findings": at(lint, "/findings").as_array().map(|f| f.iter().map(|f| json!({
                "code": text(at(f, "/code")),
                "severity": text(at(f, "/severity")),
                "message": text(at(f, "/message")),
                "line": num_or_text(at(f, "/line")),
            })).collect::<Vec<_>>()).unwrap_or_default(),
        })
    } else {
        Json::Null
    };
    let mut leaves = Vec::new();
    flatten(at(c, "/disclosure"), &mut String::new(), &mut leaves);
    let hidden = leaves.len().saturating_sub(MAX_DISCLOSURE_ROWS);
    leaves.truncate(MAX_DISCLOSURE_ROWS);
    json!({
        "path": text(at(c, "/path")),
        "lint": lint,
        "disclosure": leaves,
        "disclosure_hidden": hidden,
    })
}

/// Every leaf of a JSON value as `{pointer, value}` (JSON-pointer paths, RFC 6901 escaping).
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
