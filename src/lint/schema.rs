//! Validation of the `fidelity` block against the generated JSON Schema, with every violation
//! turned into a finding at its place in the card.

use std::sync::LazyLock;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{ValidationError, Validator};
use serde_json::Value;

use super::Locator;
use crate::card::yaml::escape_pointer_token;
use crate::disclosure::{self, vocabulary};
use crate::findings::{Code, Finding, Item};

static SCHEMA: LazyLock<Value> = LazyLock::new(disclosure::json_schema);
static VALIDATOR: LazyLock<Validator> = LazyLock::new(|| {
    jsonschema::validator_for(&SCHEMA).expect("the generated disclosure schema is valid")
});

const PREFIX: &str = "/fidelity";

pub(super) fn validate(fidelity: &Value, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    for error in VALIDATOR.iter_errors(fidelity) {
        let base = format!("{PREFIX}{}", error.instance_path().as_str());
        match error.kind() {
            ValidationErrorKind::Required { property } => {
                let name = property.as_str().unwrap_or_default();
                let pointer = format!("{base}/{}", escape_pointer_token(name));
                out.extend(missing(&pointer, locator));
            }
            ValidationErrorKind::AdditionalProperties { unexpected } => {
                let allowed = allowed_properties(&error);
                for name in unexpected {
                    let pointer = format!("{base}/{}", escape_pointer_token(name));
                    let hint = closest(name, &allowed)
                        .map(|c| format!("; did you mean `{c}`?"))
                        .unwrap_or_else(|| {
                            if allowed.is_empty() {
                                String::new()
                            } else {
                                format!(" (known fields: {})", allowed.join(", "))
                            }
                        });
                    let finding = Finding::new(
                        Code::SchemaViolation,
                        format!("unknown field `{name}` in `{}`{hint}", dotted(&base)),
                    )
                    .item(Item::of_pointer(&pointer));
                    out.push(locator.at_key(finding, &pointer));
                }
            }
            ValidationErrorKind::Enum { .. } if is_metric_pointer(&base) => {
                let name = value_text(error.instance());
                let hint = vocabulary::closest(&name)
                    .map(|c| format!(" Did you mean `{c}`?"))
                    .unwrap_or_default();
                let finding = Finding::new(
                    Code::UnknownMetric,
                    format!(
                        "metric `{name}` is not in the metric vocabulary ({}).{hint} Other names \
                         cannot be compared across cards or rerun",
                        vocabulary::METRICS.join(", ")
                    ),
                );
                out.push(locator.at_value(finding, &base));
            }
            ValidationErrorKind::OneOfNotValid { .. } | ValidationErrorKind::AnyOf { .. }
                if !alternatives(&error).is_empty() =>
            {
                let finding = Finding::new(
                    Code::SchemaViolation,
                    one_of(&dotted(&base), error.instance(), &alternatives(&error)),
                )
                .item(Item::of_pointer(&base));
                out.push(locator.at_value(finding, &base));
            }
            _ => {
                let finding = Finding::new(Code::SchemaViolation, describe(&error, &base))
                    .item(Item::of_pointer(&base));
                out.push(locator.at_value(finding, &base));
            }
        }
    }
}

/// Findings for a required field that is absent: a missing disclosure item when it belongs to one
/// (or holds some: a missing `protocol` hides five), else a plain schema violation.
fn missing(pointer: &str, locator: &Locator<'_>) -> Vec<Finding> {
    let covered: Vec<Item> = Item::ALL
        .into_iter()
        .filter(|item| {
            let p = item.pointer();
            p == pointer
                || p.strip_prefix(pointer).is_some_and(|r| r.starts_with('/'))
                || pointer.strip_prefix(p).is_some_and(|r| r.starts_with('/'))
        })
        .collect();
    if covered.is_empty() {
        let finding = Finding::new(
            Code::SchemaViolation,
            format!("required field `{}` is missing", dotted(pointer)),
        );
        return vec![locator.at_key(finding, pointer)];
    }
    covered
        .into_iter()
        .map(|item| {
            let what = if item.pointer().len() >= pointer.len() {
                format!("`{}` is not disclosed", dotted(item.pointer()))
            } else {
                format!("`{}` is missing", dotted(pointer))
            };
            let finding = Finding::new(
                Code::MissingDisclosure,
                format!("disclosure item `{item}`: {what}; {}", item.why()),
            )
            .item(Some(item));
            let at = if item.pointer().len() >= pointer.len() {
                item.pointer()
            } else {
                pointer
            };
            locator.at_key(finding, at)
        })
        .collect()
}

fn describe(error: &ValidationError<'_>, pointer: &str) -> String {
    let field = dotted(pointer);
    let value = error.instance();
    match error.kind() {
        ValidationErrorKind::Pattern { pattern } if pattern.contains("{40}") => format!(
            "`{field}` must be a full 40-hex commit hash, quoted (found {}); a branch or tag \
             name moves, so it does not pin the files measured",
            show(value)
        ),
        ValidationErrorKind::Pattern { pattern } if pattern.contains("{64}") => format!(
            "`{field}` must be a SHA-256 digest: 64 lowercase hex digits, quoted (found {})",
            show(value)
        ),
        ValidationErrorKind::Constant { expected_value } if field == "fidelity.schema" => format!(
            "unsupported schema {}: this cardproof reads {}",
            show(value),
            expected_value
        ),
        // Ranges: the protocol's numbers size loops and allocations when a card is rerun.
        ValidationErrorKind::Minimum { limit } => {
            format!("`{field}` must be at least {limit} (found {})", show(value))
        }
        ValidationErrorKind::Maximum { limit } => {
            format!("`{field}` must be at most {limit} (found {})", show(value))
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            format!("`{field}` must be above {limit} (found {})", show(value))
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            format!("`{field}` must be below {limit} (found {})", show(value))
        }
        ValidationErrorKind::Type { kind } => {
            format!(
                "`{field}` must be {} (found {})",
                type_name(kind),
                show(value)
            )
        }
        ValidationErrorKind::Enum { options } => {
            let allowed: Vec<String> = options
                .as_array()
                .map(|a| a.iter().map(value_text).collect())
                .unwrap_or_default();
            one_of(&field, value, &allowed)
        }
        _ => format!("`{field}`: {error}"),
    }
}

fn type_name(kind: &TypeKind) -> String {
    let name = |t: &jsonschema::JsonType| match t.to_string().as_str() {
        "object" => "a mapping".to_owned(),
        "array" => "a list".to_owned(),
        "integer" => "an integer".to_owned(),
        other => format!("a {other}"),
    };
    match kind {
        TypeKind::Single(t) => name(t),
        TypeKind::Multiple(set) => set
            .iter()
            .map(|t| name(&t))
            .collect::<Vec<_>>()
            .join(" or "),
    }
}

fn show(value: &Value) -> String {
    match value {
        Value::Null => "nothing (null)".into(),
        Value::String(s) => format!("\"{s}\""),
        Value::Object(_) => "a mapping".into(),
        Value::Array(_) => "a list".into(),
        other => other.to_string(),
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn is_metric_pointer(pointer: &str) -> bool {
    pointer
        .strip_prefix("/fidelity/results/")
        .and_then(|r| r.split_once('/'))
        .is_some_and(|(index, field)| index.parse::<usize>().is_ok() && field == "metric")
}

/// `/fidelity/protocol/kl` -> `fidelity.protocol.kl`.
pub(super) fn dotted(pointer: &str) -> String {
    pointer
        .trim_start_matches('/')
        .replace('/', ".")
        .replace("~1", "/")
        .replace("~0", "~")
}

/// "must be one of ..." with the closest allowed value as a hint.
fn one_of(field: &str, value: &Value, allowed: &[String]) -> String {
    let hint = value
        .as_str()
        .and_then(|v| closest(v, allowed))
        .map(|c| format!("; did you mean `{c}`?"))
        .unwrap_or_default();
    format!(
        "`{field}` must be one of {} (found {}){hint}",
        allowed.join(", "),
        show(value)
    )
}

/// The values a `oneOf`/`anyOf` of string alternatives allows (each branch's `enum` and `const`),
/// empty when a branch is anything else (a mapping, a number), so the generic message stays.
fn alternatives(error: &ValidationError<'_>) -> Vec<String> {
    let Some(fragment) = error
        .absolute_keyword_location()
        .and_then(|uri| uri.fragment().map(|f| f.as_str().to_owned()))
    else {
        return Vec::new();
    };
    let Some(branches) = SCHEMA.pointer(&fragment).and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for branch in branches {
        let branch = resolve(branch);
        if let Some(c) = branch.get("const").and_then(Value::as_str) {
            out.push(c.to_owned());
        } else if let Some(values) = branch.get("enum").and_then(Value::as_array) {
            out.extend(values.iter().filter_map(Value::as_str).map(str::to_owned));
        } else {
            return Vec::new();
        }
    }
    out
}

fn resolve(node: &Value) -> &Value {
    node.get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix('#'))
        .and_then(|p| SCHEMA.pointer(p))
        .unwrap_or(node)
}

/// The property names the failing object's schema knows, for "did you mean" hints.
fn allowed_properties(error: &ValidationError<'_>) -> Vec<String> {
    let Some(uri) = error.absolute_keyword_location() else {
        return Vec::new();
    };
    let Some(fragment) = uri.fragment() else {
        return Vec::new();
    };
    let pointer = fragment.as_str().trim_end_matches("/additionalProperties");
    SCHEMA
        .pointer(pointer)
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

fn closest<'a>(name: &str, candidates: &'a [String]) -> Option<&'a str> {
    let lower = name.to_ascii_lowercase().replace(['-', '.', ' '], "_");
    candidates
        .iter()
        .filter(|c| {
            c.starts_with(&lower)
                || lower.starts_with(c.as_str())
                || vocabulary::edit_distance(&lower, c) <= 2
        })
        .min_by_key(|c| vocabulary::edit_distance(&lower, c))
        .map(String::as_str)
}
