//! Digests and what they are taken over: the one lowercase-hex encoder every SHA-256 and blob id
//! goes through, and the two canonical JSON forms. [`canonical_json`] (RFC 8785) is what a
//! signed report binds of a card; [`protocol_json`] is the older form `protocol_sha256` has
//! always been taken over, kept byte for byte so published digests stay valid. Nothing else
//! serializes JSON for a digest.

use std::fmt::Write as _;

use serde_json::{Number, Value};
use sha2::{Digest, Sha256};

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// The lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// `value` in RFC 8785 canonical form (JSON Canonicalization Scheme): no whitespace; object
/// members sorted by their keys' UTF-16 code units; strings with only `"`, `\\` and the control
/// characters escaped (`\\b \\t \\n \\f \\r` by name, the rest as `\\u00xx`); numbers as
/// ECMAScript prints them. One deliberate difference: integers are written exactly (RFC 8785
/// would round those above 2^53 to a double), so two different integers never hash alike.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(n)),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn number(n: &Number) -> String {
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    // serde_json holds no NaN or infinity.
    ecmascript(n.as_f64().unwrap_or(0.0))
}

/// ECMAScript's Number::toString for a finite double (ECMA-262 Number::toString, radix 10), as
/// RFC 8785 prescribes: Rust's `{:e}` gives the shortest digits that round-trip, placed here.
pub(crate) fn ecmascript(f: f64) -> String {
    if f == 0.0 || !f.is_finite() {
        return "0".into();
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let k = digits.len() as i32;
    // The value is 0.DIGITS × 10^n.
    let n = exponent + 1;
    let mut s = String::new();
    if f < 0.0 {
        s.push('-');
    }
    if k <= n && n <= 21 {
        s.push_str(&digits);
        s.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        s.push_str(&digits[..n as usize]);
        s.push('.');
        s.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        s.push_str("0.");
        s.extend(std::iter::repeat_n('0', (-n) as usize));
        s.push_str(&digits);
    } else {
        s.push_str(&digits[..1]);
        if k > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let e = n - 1;
        let _ = write!(s, "e{}{}", if e < 0 { '-' } else { '+' }, e.abs());
    }
    s
}

/// The protocol's canonical JSON, frozen because `protocol_sha256` values are published on cards
/// and in signed artifacts: object keys sorted by bytes, no whitespace, strings and numbers as
/// serde_json writes them (`1.0`, `1e-6`), unlike [`canonical_json`]'s RFC 8785 numbers.
pub fn protocol_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), protocol_json(&map[k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(items) => {
            format!(
                "[{}]",
                items
                    .iter()
                    .map(protocol_json)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        }
        other => other.to_string(),
    }
}
