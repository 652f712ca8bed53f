//! The card's `fidelity` block in canonical form, and its SHA-256: what a signed report binds.
//!
//! A verification report is about a card's claims, but the card (README.md) is not a statement
//! subject, and a card edited after signing must not keep the report's verdict. So the report
//! carries `card.fidelity_sha256`: the SHA-256 of the card's `fidelity` front-matter block as read
//! (the same JSON as the report's `card.disclosure`), serialized canonically. `verify-report`
//! and `check` recompute it from the card they are given and compare.
//!
//! The canonical form follows RFC 8785 (JSON Canonicalization Scheme): no whitespace; object
//! members sorted by their keys' UTF-16 code units; strings with only `"`, `\` and the control
//! characters escaped (`\b \t \n \f \r` by name, the rest as `\u00xx`), everything else as raw
//! UTF-8; floating-point numbers as ECMAScript prints them (shortest round-trip digits, `1e+21`
//! from 1e21 up, `1e-7` from below 1e-6, `-0` as `0`, an integral value with no fraction). One
//! deliberate difference: integers that the YAML parser kept as integers are written exactly
//! (RFC 8785 would round those above 2^53 to a double), so two different integers never hash
//! alike. So key order, quoting style, comments and number spelling (`0.0166`, `1.66e-2`,
//! `0.016600`) do not change the digest; any change of a value, key or list order does.

use serde_json::Value;

use super::Card;
use crate::digest::canonical_json;

/// The card's `fidelity` block as JSON (`null` when the card has none), exactly as `verify`
/// reads it for the report's `card.disclosure`.
pub fn fidelity_json(card: &Card) -> Value {
    card.metadata()
        .and_then(|m| m.get("fidelity"))
        .map_or(Value::Null, |e| e.value.to_json())
}

/// The lowercase hex SHA-256 of `fidelity`'s canonical form; `None` for `null` (no block).
pub fn fidelity_sha256(fidelity: &Value) -> Option<String> {
    if fidelity.is_null() {
        return None;
    }
    Some(crate::digest::sha256_hex(
        canonical_json(fidelity).as_bytes(),
    ))
}

/// The card's `model-index` as JSON (`null` when it has none): what the Hub's model page and
/// leaderboards show, `card`'s mirror of the claims among it. A report binds it whole beside the
/// fidelity block (`card.model_index_sha256`), so no number a reader sees beside the claims can
/// change after signing.
pub fn model_index_json(card: &Card) -> Value {
    card.metadata()
        .and_then(|m| m.get("model-index"))
        .map_or(Value::Null, |e| e.value.to_json())
}

/// The places where `card` differs from `signed`, one line each, as
/// `fidelity.results[0].value: signed 0.01661, card 0.0198` (`absent` for a missing key or item).
/// Values are compared in canonical form, so a number spelled differently is no difference.
pub fn differences(signed: &Value, card: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff("fidelity", Some(signed), Some(card), &mut out);
    out
}

fn diff(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<String>) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            for (key, value) in x {
                diff(&format!("{path}.{key}"), Some(value), y.get(key), out);
            }
            for (key, value) in y.iter().filter(|(k, _)| !x.contains_key(*k)) {
                diff(&format!("{path}.{key}"), None, Some(value), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            for i in 0..x.len().max(y.len()) {
                diff(&format!("{path}[{i}]"), x.get(i), y.get(i), out);
            }
        }
        (Some(x), Some(y)) if canonical_json(x) == canonical_json(y) => {}
        _ => out.push(format!("{path}: signed {}, card {}", shown(a), shown(b))),
    }
}

fn shown(v: Option<&Value>) -> String {
    const LIMIT: usize = 80;
    match v {
        None => "absent".into(),
        Some(v) => {
            let text = canonical_json(v);
            match text.char_indices().nth(LIMIT) {
                Some((end, _)) => format!("{}…", &text[..end]),
                None => text,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_print_as_ecmascript_does() {
        // RFC 8785 appendix B and section 3.2.2.3 examples.
        for (value, text) in [
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (4.5, "4.5"),
            (0.002, "0.002"),
            (0.000001, "0.000001"),
            (1e-7, "1e-7"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e30, "1e+30"),
            (1e-27, "1e-27"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-1.7976931348623157e308, "-1.7976931348623157e+308"),
            (333333333.3333333, "333333333.3333333"),
            (4294967295.0, "4294967295"),
            (9007199254740992.0, "9007199254740992"),
            (295147905179352830000.0, "295147905179352830000"),
            (0.01661, "0.01661"),
            (-0.1017, "-0.1017"),
            (123.456e-10, "1.23456e-8"),
        ] {
            assert_eq!(crate::digest::ecmascript(value), text, "{value:e}");
        }
    }

    #[test]
    fn canonical_form_sorts_keys_by_utf16_and_escapes_minimally() {
        let v = json!({"b": [1, 2.50, true, null], "a": {"\u{20ac}": 1, "\r": 2, "1": 3, "\u{1f600}": 4, "\u{fb33}": 5}, "s": "\"\\\u{1}\u{7f}é\n"});
        assert_eq!(
            canonical_json(&v),
            "{\"a\":{\"\\r\":2,\"1\":3,\"\u{20ac}\":1,\"\u{1f600}\":4,\"\u{fb33}\":5},\"b\":[1,2.5,true,null],\"s\":\"\\\"\\\\\\u0001\u{7f}é\\n\"}"
        );
        // Integers stay exact beyond 2^53.
        assert_eq!(
            canonical_json(&json!([9007199254740993u64, -9007199254740993i64])),
            "[9007199254740993,-9007199254740993]"
        );
    }

    #[test]
    fn the_digest_ignores_spelling_and_order_but_not_values() {
        let a = json!({"results": [{"metric": "kld_mean", "value": 0.01661}], "schema": "cardproof/v1"});
        let b = json!({"schema": "cardproof/v1", "results": [{"value": 1.661e-2, "metric": "kld_mean"}]});
        let c =
            json!({"schema": "cardproof/v1", "results": [{"value": 0.0198, "metric": "kld_mean"}]});
        assert_eq!(fidelity_sha256(&a), fidelity_sha256(&b));
        assert_ne!(fidelity_sha256(&a), fidelity_sha256(&c));
        assert_eq!(fidelity_sha256(&Value::Null), None);
        assert_eq!(
            fidelity_sha256(&json!({})).unwrap(),
            // sha256("{}")
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(
            differences(&a, &c),
            ["fidelity.results[0].value: signed 0.01661, card 0.0198"]
        );
        let mut d = c.clone();
        d["results"]
            .as_array_mut()
            .unwrap()
            .push(json!({"metric": "kld_max"}));
        d.as_object_mut().unwrap().remove("schema");
        assert_eq!(
            differences(&a, &d),
            [
                "fidelity.results[0].value: signed 0.01661, card 0.0198",
                "fidelity.results[1]: signed absent, card {\"metric\":\"kld_max\"}",
                "fidelity.schema: signed \"cardproof/v1\", card absent",
            ]
        );
    }
}
