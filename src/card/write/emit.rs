//! The YAML emitter for the blocks cardproof writes.
//!
//! Block style, keys in the disclosure schema's order, flow sequences where they fit, numbers that
//! read back with their type, and every string quoted that a YAML 1.2 or a YAML 1.1 reader such
//! as PyYAML would read as anything but itself. It turns JSON values into text and knows nothing
//! of the card around them.

use std::sync::LazyLock;

use serde_json::{Map, Number, Value, json};

use super::is_hex;
use crate::card::yaml;

/// Flow sequences (`[256, 512]`) are used when the line stays within this many columns.
const FLOW_WIDTH: usize = 100;

static SCHEMA: LazyLock<Value> = LazyLock::new(crate::disclosure::json_schema);

/// A schema for `{fidelity: <disclosure>}`, so the top-level call can be schema-guided.
pub(super) static SCHEMA_ROOT: LazyLock<Value> =
    LazyLock::new(|| json!({"properties": {"fidelity": {"$ref": "#/$defs/__root"}}}));

fn resolve(node: &Value) -> &Value {
    let Some(reference) = node.get("$ref").and_then(Value::as_str) else {
        return node;
    };
    if reference == "#/$defs/__root" {
        return &SCHEMA;
    }
    reference
        .strip_prefix("#/$defs/")
        .and_then(|name| SCHEMA.get("$defs").and_then(|d| d.get(name)))
        .unwrap_or(node)
}

fn child_schema<'s>(schema: Option<&'s Value>, key: &str) -> Option<&'s Value> {
    let schema = resolve(schema?);
    schema.get("properties").and_then(|p| p.get(key))
}

fn item_schema(schema: Option<&Value>) -> Option<&Value> {
    resolve(schema?).get("items")
}

/// The keys of `map` in the schema's order, then the others in the map's order.
fn ordered<'m>(
    map: &'m Map<String, Value>,
    schema: Option<&Value>,
) -> Vec<(&'m String, &'m Value)> {
    let known: Vec<&str> = schema
        .map(resolve)
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let mut out: Vec<(&String, &Value)> = Vec::with_capacity(map.len());
    for key in &known {
        if let Some((k, v)) = map.get_key_value(*key) {
            out.push((k, v));
        }
    }
    for (k, v) in map {
        if !known.contains(&k.as_str()) {
            out.push((k, v));
        }
    }
    out
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

/// A block mapping at `indent`, one `key: value` per line (nested mappings 2 columns deeper).
pub(super) fn emit_mapping(
    out: &mut String,
    indent: usize,
    map: &Map<String, Value>,
    schema: Option<&Value>,
) {
    let pad = " ".repeat(indent);
    for (key, value) in ordered(map, schema) {
        let k = key_text(key);
        let child = child_schema(schema, key);
        match value {
            Value::Object(o) if o.is_empty() => out.push_str(&format!("{pad}{k}: {{}}\n")),
            Value::Object(o) => {
                out.push_str(&format!("{pad}{k}:\n"));
                emit_mapping(out, indent + 2, o, child);
            }
            Value::Array(a) if a.is_empty() => out.push_str(&format!("{pad}{k}: []\n")),
            Value::Array(a) => {
                let flow = flow_text(value, child, None);
                if a.iter().all(is_scalar) && indent + k.len() + 2 + flow.len() <= FLOW_WIDTH {
                    out.push_str(&format!("{pad}{k}: {flow}\n"));
                } else {
                    out.push_str(&format!("{pad}{k}:\n"));
                    emit_sequence(out, indent + 2, a, item_schema(child));
                }
            }
            scalar => {
                let text = claim_value_text(map, key, scalar)
                    .unwrap_or_else(|| scalar_text(scalar, Some(key)));
                out.push_str(&format!("{pad}{k}: {text}\n"));
            }
        }
    }
}

/// A claim's `value` with the digits its precision needs, trailing zeros kept: `1.002100`, not
/// `1.0021` (which would state less precision than was measured).
fn claim_value_text(map: &Map<String, Value>, key: &str, value: &Value) -> Option<String> {
    if key != "value" {
        return None;
    }
    let metric = map.get("metric")?.as_str()?;
    crate::disclosure::precision::claim_text(metric, value.as_f64()?)
}

/// A block sequence at `indent`: mappings of scalars as flow mappings, other mappings in block
/// style after the `- `, everything else in flow style.
fn emit_sequence(out: &mut String, indent: usize, items: &[Value], schema: Option<&Value>) {
    let pad = " ".repeat(indent);
    for item in items {
        match item {
            Value::Object(o) if !o.is_empty() && !o.values().all(is_scalar) => {
                let mut inner = String::new();
                emit_mapping(&mut inner, indent + 2, o, schema);
                let inner = &inner[indent + 2..];
                out.push_str(&format!("{pad}- {inner}"));
            }
            _ => out.push_str(&format!("{pad}- {}\n", flow_text(item, schema, None))),
        }
    }
}

/// A value in flow style (`[a, b]`, `{k: v}`).
fn flow_text(value: &Value, schema: Option<&Value>, key: Option<&str>) -> String {
    match value {
        Value::Array(items) => {
            let inner = item_schema(schema);
            let parts: Vec<String> = items.iter().map(|i| flow_text(i, inner, None)).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Object(map) => {
            let parts: Vec<String> = ordered(map, schema)
                .into_iter()
                .map(|(k, v)| {
                    let text = claim_value_text(map, k, v)
                        .unwrap_or_else(|| flow_text(v, child_schema(schema, k), Some(k)));
                    format!("{}: {text}", key_text(k))
                })
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        scalar => scalar_text(scalar, key),
    }
}

/// Keys whose values are revisions or digests, always quoted.
fn is_revision_key(key: &str) -> bool {
    key == "revision" || key.ends_with("_revision") || key == "sha256" || key.ends_with("_sha256")
}

fn scalar_text(value: &Value, key: Option<&str>) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => number_text(n),
        Value::String(s) => {
            let force = key.is_some_and(is_revision_key) || is_hex(s, 40) || is_hex(s, 64);
            string_text(s, force)
        }
        Value::Array(_) | Value::Object(_) => flow_text(value, None, key),
    }
}

fn key_text(key: &str) -> String {
    string_text(key, false)
}

/// A number that reads back as the same value and type in YAML 1.2 and PyYAML: integers as
/// integers, floats always with a `.` (and a signed exponent when very small or large).
pub(crate) fn number_text(n: &Number) -> String {
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    float_text(n.as_f64().unwrap_or(0.0))
}

fn float_text(f: f64) -> String {
    let a = f.abs();
    if a != 0.0 && !(1e-5..1e16).contains(&a) {
        let s = format!("{f:e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = if mantissa.contains('.') {
            mantissa.to_owned()
        } else {
            format!("{mantissa}.0")
        };
        let exponent = if exponent.starts_with('-') {
            exponent.to_owned()
        } else {
            format!("+{exponent}")
        };
        return format!("{mantissa}e{exponent}");
    }
    let s = format!("{f}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// A string as a plain scalar when every reader reads it back as that string, else double-quoted.
pub(crate) fn string_text(s: &str, force_quotes: bool) -> String {
    if force_quotes || needs_quotes(s) {
        quoted(s)
    } else {
        s.to_owned()
    }
}

fn needs_quotes(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return true;
    };
    if s.trim() != s
        || s.chars().any(|c| {
            c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                )
        })
        || "-?:,[]{}#&*!|>'\"%@`".contains(first)
        || s.contains([':', '#', ',', '[', ']', '{', '}'])
    {
        return true;
    }
    // YAML 1.1 (PyYAML) and 1.2 booleans and nulls, in any case.
    let lower = s.to_ascii_lowercase();
    if matches!(
        lower.as_str(),
        "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null" | "~" | "=" | "<<"
    ) {
        return true;
    }
    // Numbers, dates, times, leading zeros, octal, hex, binary, sexagesimal, .inf/.nan.
    let bytes = s.as_bytes();
    let starts_numeric = first.is_ascii_digit()
        || first == '.'
        || (matches!(first, '+' | '-')
            && bytes
                .get(1)
                .is_some_and(|b| b.is_ascii_digit() || *b == b'.'));
    if starts_numeric || s.parse::<f64>().is_ok() {
        return true;
    }
    // Last line of defence: our own YAML 1.2 reader must give the string back.
    let probe = format!("k: {s}\n");
    let read = yaml::parse(&probe, 0, yaml::Budget::default())
        .ok()
        .flatten()
        .and_then(|root| root.get("k").map(|e| e.value.to_json()));
    read.as_ref().and_then(Value::as_str) != Some(s)
}

fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                ) =>
            {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_back(text: &str) -> Value {
        let doc = format!("k: {text}\n");
        yaml::parse(&doc, 0, yaml::Budget::default())
            .unwrap()
            .unwrap()
            .get("k")
            .unwrap()
            .value
            .to_json()
    }

    #[test]
    fn ambiguous_strings_are_quoted_and_read_back() {
        for s in [
            "no",
            "No",
            "off",
            "y",
            "n",
            "yes",
            "true",
            "null",
            "~",
            "1e5",
            "0123",
            "a: b",
            "#x",
            "",
            " lead",
            "trail ",
            "0x1f",
            "0o17",
            "1_000",
            "1:30",
            "2024-01-31",
            ".inf",
            ".5",
            "-1",
            "+1",
            "=",
            "<<",
            "- x",
            "[a]",
            "{a}",
            "a, b",
            "*x",
            "&x",
            "!x",
            "|",
            ">",
            "%x",
            "@x",
            "`x",
            "'x",
            "\"x",
            "tab\there",
            "line\nbreak",
            "nan",
            "inf",
            "\u{2028}",
        ] {
            let text = string_text(s, false);
            assert!(text.starts_with('"'), "{s:?} must be quoted, got {text}");
            assert_eq!(
                read_back(&text),
                Value::String(s.into()),
                "{s:?} via {text}"
            );
        }
        for s in [
            "bf16",
            "safetensors",
            "Qwen/Qwen3-8B",
            "eval.txt",
            "a b",
            "x-y",
            "é",
        ] {
            assert_eq!(string_text(s, false), s);
        }
        let hex = "aebc08a6edbab4465a99260c28646dfe1034e3b9";
        assert_eq!(scalar_text(&json!(hex), None), format!("\"{hex}\""));
        assert_eq!(scalar_text(&json!("main"), Some("revision")), "\"main\"");
    }

    #[test]
    fn generated_strings_round_trip() {
        let alphabet: Vec<char> = " abyn01.:-#,'\"\\[]{}!&*|>%@`\t\n\u{7f}é~=<xeEoO_+?"
            .chars()
            .collect();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..5000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 6) as usize;
            let s: String = (0..len)
                .map(|i| alphabet[((seed >> (8 + 5 * i)) as usize) % alphabet.len()])
                .collect();
            let text = string_text(&s, false);
            assert_eq!(
                read_back(&text),
                Value::String(s.clone()),
                "{s:?} via {text}"
            );
            let flow = read_back(&format!("[{text}]"));
            assert_eq!(flow, json!([s]), "{s:?} in a flow sequence via {text}");
        }
    }

    #[test]
    fn numbers_round_trip_with_their_type() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut values = vec![
            0.0, -0.0, 1.0, 0.95, 1e-5, 9.99e-6, 1e16, 1e300, 5e-324, -2.5e-7,
        ];
        for _ in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let f = f64::from_bits(seed);
            if f.is_finite() {
                values.push(f);
            }
        }
        for f in values {
            let n = Number::from_f64(f).unwrap();
            let text = number_text(&n);
            let back = read_back(&text);
            assert!(back.is_f64(), "{f} printed as {text} reads back as {back}");
            assert_eq!(
                back.as_f64().unwrap().to_bits(),
                f.to_bits(),
                "{f} via {text}"
            );
        }
        assert_eq!(number_text(&Number::from(128u64)), "128");
        assert_eq!(number_text(&Number::from(-3i64)), "-3");
        assert_eq!(read_back("128"), json!(128));
    }
}
