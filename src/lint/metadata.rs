//! Hub metadata that breaks quantized uploads, and YAML scalars that Python readers of cards
//! (PyYAML, YAML 1.1) read differently from YAML 1.2.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::Locator;
use crate::card::yaml::{Node, NodeKind, Scalar};
use crate::findings::{Code, Finding};

pub(super) fn hub(root: &Node, fidelity: &Value, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    let meta = root.to_json();
    let reference = fidelity.pointer("/reference/repo").and_then(Value::as_str);
    match meta.get("base_model") {
        None | Some(Value::Null) => {
            let hint = reference
                .map(|r| format!(" (`base_model: {r}`)"))
                .unwrap_or_default();
            out.push(locator.at_key(
                Finding::new(
                    Code::MissingBaseModel,
                    format!(
                        "`base_model` is missing: the Hub cannot place this quantization in its \
                         base model's tree; name the model it was quantized from{hint}"
                    ),
                ),
                "/base_model",
            ));
        }
        Some(base) => {
            let bases: Vec<&str> = match base {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if let Some(reference) = reference
                && !bases.is_empty()
                && !bases.contains(&reference)
            {
                out.push(locator.at_value(
                    Finding::new(
                        Code::ReferenceNotBaseModel,
                        format!(
                            "`fidelity.reference.repo` is `{reference}` but `base_model` is `{}`: \
                             the KLD was measured against another model than the one this \
                             quantizes",
                            bases.join(", ")
                        ),
                    ),
                    "/fidelity/reference/repo",
                ));
            }
        }
    }
    let relation = meta.get("base_model_relation");
    if relation.and_then(Value::as_str) != Some("quantized") {
        let found = match relation {
            None => "missing".to_owned(),
            Some(v) => format!(
                "`{}`",
                v.as_str().map_or_else(|| v.to_string(), str::to_owned)
            ),
        };
        let finding = Finding::new(
            Code::BaseModelRelation,
            format!(
                "`base_model_relation` is {found}; a quantized upload needs `base_model_relation: \
                 quantized` to appear under its base model's quantizations"
            ),
        );
        out.push(if relation.is_some() {
            locator.at_value(finding, "/base_model_relation")
        } else {
            locator.at_key(finding, "/base_model_relation")
        });
    }
}

/// Keys whose values are revisions or digests: they must be strings.
fn is_revision_key(key: &str) -> bool {
    key == "revision" || key.ends_with("_revision") || key == "sha256" || key.ends_with("_sha256")
}

pub(super) fn yaml_scalars(root: &Node, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    root.walk(&mut |pointer, _, node| {
        if let NodeKind::Map(entries) = &node.kind {
            for entry in entries {
                let entry_pointer = format!(
                    "{pointer}/{}",
                    crate::card::yaml::escape_pointer_token(&entry.key)
                );
                if entry.key_plain
                    && let Some(reading) = pyyaml_reading(&entry.key)
                    && reading != describe_12_text(&entry.key)
                {
                    out.push(locator.at_span(
                        ambiguous(&entry.key, &reading, &entry_pointer, "key"),
                        entry.key_span.clone(),
                    ));
                }
                let Some(scalar) = entry.value.as_scalar() else {
                    continue;
                };
                if !scalar.is_plain() {
                    continue;
                }
                if is_revision_key(&entry.key) && !scalar.value.is_string() {
                    let mut finding = Finding::new(
                        Code::UnquotedRevision,
                        format!(
                            "unquoted `{}: {}` is read as a number, not a string ({}); quote it: \
                             `{}: \"{}\"`",
                            entry.key,
                            scalar.text,
                            number_loss(scalar),
                            entry.key,
                            scalar.text
                        ),
                    );
                    finding.pointer = Some(entry_pointer.clone());
                    out.push(locator.at_span(finding, entry.value.span.clone()));
                } else if let Some(reading) = pyyaml_reading(&scalar.text)
                    && reading != describe_12(scalar)
                {
                    out.push(locator.at_span(
                        ambiguous(&scalar.text, &reading, &entry_pointer, "value"),
                        entry.value.span.clone(),
                    ));
                }
            }
        }
        if let NodeKind::Seq(items) = &node.kind {
            for (i, item) in items.iter().enumerate() {
                let Some(scalar) = item.as_scalar() else {
                    continue;
                };
                if scalar.is_plain()
                    && let Some(reading) = pyyaml_reading(&scalar.text)
                    && reading != describe_12(scalar)
                {
                    out.push(locator.at_span(
                        ambiguous(&scalar.text, &reading, &format!("{pointer}/{i}"), "value"),
                        item.span.clone(),
                    ));
                }
            }
        }
    });
}

fn ambiguous(text: &str, reading: &str, pointer: &str, what: &str) -> Finding {
    let mut finding = Finding::new(
        Code::Yaml11Ambiguous,
        format!(
            "unquoted {what} `{text}` is read as {} by YAML 1.2 but as {reading} by YAML 1.1 \
             readers such as PyYAML (which the Hub's Python tools use); quote it",
            describe_12_text(text)
        ),
    );
    finding.pointer = Some(pointer.to_owned());
    finding
}

fn number_loss(scalar: &Scalar) -> String {
    match &scalar.value {
        Value::Number(n) if n.is_f64() => {
            format!("a float, {n}, which loses digits")
        }
        Value::Number(n) if n.to_string() != scalar.text => {
            format!("the integer {n}, which drops the leading zeros")
        }
        Value::Number(n) => format!("the integer {n}"),
        other => format!("{other}"),
    }
}

/// How YAML 1.2 (core schema) reads a plain scalar, in words comparable to [`pyyaml_reading`].
fn describe_12(scalar: &Scalar) -> String {
    describe_value(&scalar.value, &scalar.text)
}

fn describe_12_text(text: &str) -> String {
    match crate::card::yaml::parse(text, 0, Default::default()) {
        Ok(Some(node)) => node.as_scalar().map_or_else(
            || format!("the string \"{text}\""),
            |s| describe_value(&s.value, text),
        ),
        _ => format!("the string \"{text}\""),
    }
}

fn describe_value(value: &Value, text: &str) -> String {
    match value {
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Null => "null".into(),
        Value::Number(n) if n.is_f64() => format!("the number {}", n.as_f64().unwrap_or(0.0)),
        Value::Number(n) => format!("the number {n}"),
        _ => format!("the string \"{text}\""),
    }
}

static PY_INT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$")
        .expect("valid")
});
static PY_FLOAT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
        .expect("valid")
});
static PY_TIMESTAMP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?)$")
        .expect("valid")
});

/// How PyYAML's YAML 1.1 resolver reads a plain scalar, when that is not the string itself.
fn pyyaml_reading(text: &str) -> Option<String> {
    match text {
        "yes" | "Yes" | "YES" | "on" | "On" | "ON" => return Some("the boolean true".into()),
        "no" | "No" | "NO" | "off" | "Off" | "OFF" => return Some("the boolean false".into()),
        "y" | "Y" => return Some("the boolean true (YAML 1.1 spec; PyYAML keeps a string)".into()),
        "n" | "N" => {
            return Some("the boolean false (YAML 1.1 spec; PyYAML keeps a string)".into());
        }
        "true" | "True" | "TRUE" => return Some("the boolean true".into()),
        "false" | "False" | "FALSE" => return Some("the boolean false".into()),
        "" | "~" | "null" | "Null" | "NULL" => return Some("null".into()),
        "=" => return Some("a `value` tag (PyYAML refuses it)".into()),
        _ => {}
    }
    if PY_INT.is_match(text) {
        return py_int(text).map(|n| format!("the number {n}"));
    }
    if PY_FLOAT.is_match(text) {
        let cleaned = text.replace('_', "");
        if cleaned.contains(':') {
            return Some("a sexagesimal (base 60) number".into());
        }
        return Some(match cleaned.parse::<f64>() {
            Ok(f) if f.is_finite() => format!("the number {f}"),
            _ => "a non-finite number".into(),
        });
    }
    if PY_TIMESTAMP.is_match(text) {
        return Some("a date/time".into());
    }
    if text.parse::<f64>().is_ok() || text.starts_with("0o") {
        // YAML 1.2 reads this as a number but PyYAML keeps the string.
        return Some(format!("the string \"{text}\""));
    }
    None
}

fn py_int(text: &str) -> Option<i128> {
    let t = text.replace('_', "");
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest.to_owned()),
        None => (false, t.strip_prefix('+').unwrap_or(&t).to_owned()),
    };
    let magnitude = if let Some(b) = t.strip_prefix("0b") {
        i128::from_str_radix(b, 2).ok()?
    } else if let Some(h) = t.strip_prefix("0x") {
        i128::from_str_radix(h, 16).ok()?
    } else if t.contains(':') {
        t.split(':').try_fold(0i128, |acc, part| {
            Some(acc * 60 + part.parse::<i128>().ok()?)
        })?
    } else if t.len() > 1 && t.starts_with('0') {
        i128::from_str_radix(&t[1..], 8).ok()?
    } else {
        t.parse::<i128>().ok()?
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// The Hub's `model-index` (what the model page and leaderboards show) against the `fidelity`
/// block: every metric there named like a fidelity metric must be a claim of the block, the same
/// number at the same context length (`dataset.config` `ctx<L>-...`, as `card` writes it), or
/// the page shows a number `verify` never checks.
pub(super) fn model_index(
    root: &Node,
    fidelity: &Value,
    locator: &Locator<'_>,
    out: &mut Vec<Finding>,
) {
    use crate::disclosure::vocabulary::is_metric;
    let Some(index) = root.get("model-index").map(|e| e.value.to_json()) else {
        return;
    };
    let claims: Vec<(&str, Option<u64>, Option<f64>)> = fidelity
        .get("results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let metric = c.get("metric")?.as_str()?;
            let length = c.get("context_length").and_then(Value::as_u64);
            Some((metric, length, c.get("value").and_then(Value::as_f64)))
        })
        .collect();
    let lengths = fidelity
        .pointer("/protocol/context_lengths")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    for (i, entry) in index.as_array().into_iter().flatten().enumerate() {
        for (j, result) in entry["results"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let length = result["dataset"]["config"]
                .as_str()
                .and_then(|c| c.strip_prefix("ctx"))
                .and_then(|c| c.split('-').next())
                .and_then(|n| n.parse::<u64>().ok());
            for (k, metric) in result["metrics"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let Some(name) = metric["type"].as_str().filter(|n| is_metric(n)) else {
                    continue;
                };
                let value = metric["value"].as_f64();
                let at = |l: Option<u64>| {
                    length.is_none() || l == length || (l.is_none() && lengths <= 1)
                };
                let same: Vec<f64> = claims
                    .iter()
                    .filter(|(m, l, _)| *m == name && at(*l))
                    .filter_map(|(_, _, v)| *v)
                    .collect();
                if value.is_some_and(|v| same.contains(&v)) {
                    continue;
                }
                let shown = value.map_or_else(|| metric["value"].to_string(), |v| v.to_string());
                let place = length.map_or(String::new(), |l| format!(" at context length {l}"));
                let claimed = if same.is_empty() {
                    format!("claims no {name}{place}")
                } else {
                    let listed: Vec<String> = same.iter().map(f64::to_string).collect();
                    format!("claims {name} = {}{place}", listed.join(" or "))
                };
                out.push(locator.at_value(
                    Finding::new(
                        Code::ModelIndexContradictsDisclosure,
                        format!(
                            "`model-index` shows {name} = {shown}{place}, but the `fidelity:` block {claimed}: the Hub page and leaderboards would show a number `verify` never checks; rerun `cardproof card` (it writes `model-index` from the block) or make them agree"
                        ),
                    ),
                    &format!("/model-index/{i}/results/{j}/metrics/{k}/value"),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pyyaml_readings_match_pyyaml() {
        assert_eq!(pyyaml_reading("no").as_deref(), Some("the boolean false"));
        assert_eq!(pyyaml_reading("0755").as_deref(), Some("the number 493"));
        assert_eq!(pyyaml_reading("1_000").as_deref(), Some("the number 1000"));
        assert_eq!(pyyaml_reading("1:30").as_deref(), Some("the number 90"));
        assert_eq!(pyyaml_reading("1e3").as_deref(), Some("the string \"1e3\""));
        assert_eq!(
            pyyaml_reading("0o17").as_deref(),
            Some("the string \"0o17\"")
        );
        assert_eq!(pyyaml_reading("2024-01-31").as_deref(), Some("a date/time"));
        assert_eq!(pyyaml_reading("apache-2.0"), None);
        assert_eq!(pyyaml_reading("12").as_deref(), Some("the number 12"));
    }
}
