//! The embedded templates (report.md, report.html, study.md, study.html), their environment and
//! filters. Each page is rendered from a view: a JSON value with every field its template reads
//! (absent fields are `none`, so [`UndefinedBehavior::Strict`] catches template typos instead of
//! hiding them), built by the page's owner from its typed document (`verify::view`,
//! `study::render`).
//!
//! Escaping. Card values and paths are untrusted. The HTML template is autoescaped (its name ends
//! in `.html.j2`). The Markdown template is autoescaped too, with a custom `md` mode whose formatter
//! runs [`escape_markdown`] over every printed value that is not marked safe; the `md` filter does
//! the same explicitly (and marks its result safe), `code` puts a value in a code span where that is
//! safe, and `num`/`exact` print numbers.

use std::path::Path;

use minijinja::value::{Value, ValueKind};
use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde_json::Value as Json;

use crate::error::{Error, Result};

const MD_NAME: &str = "report.md.j2";
const HTML_NAME: &str = "report.html.j2";
const MD_TEMPLATE: &str = include_str!("../../templates/report.md.j2");
const HTML_TEMPLATE: &str = include_str!("../../templates/report.html.j2");

/// report.md (`html` false) or the self-contained report.html (inline CSS and SVG, no script,
/// nothing fetched) from a verification report's view (`verify`'s typed report made into the
/// fields the templates read).
pub fn render_report(view: &Json, html: bool) -> Result<String> {
    if html {
        render(HTML_NAME, HTML_TEMPLATE, view)
    } else {
        render(MD_NAME, MD_TEMPLATE, view)
    }
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
