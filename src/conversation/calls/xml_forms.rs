//! The families that write each argument as bare text between tags: Qwen3-Coder's
//! `<function=…><parameter=…>` and GLM's `<arg_key>…<arg_value>`. Values are kept as the text
//! written ([`super::Call::text_values`]): `2` may be the integer or the string, which only the
//! tool's schema tells ([`super::Tools::typed`]). A key given twice keeps its last value, as a
//! JSON object's does.

use serde_json::{Map, Value};

use super::{Call, Sink, bare_name, each_block};

/// Qwen3-Coder, Qwen3.5: `<function=NAME>` and its `<parameter=KEY>\nVALUE\n</parameter>`s in
/// each `<tool_call>` block. The newline the template writes on each side of a value is not the
/// value's.
pub(super) fn qwen3_coder(text: &str, sink: &mut Sink) {
    each_block(text, "<tool_call>", "</tool_call>", sink, function_block);
}

fn function_block(inner: &str) -> Result<Call, String> {
    const OPEN: &str = "<function=";
    const CLOSE: &str = "</function>";
    let inner = inner.trim();
    let after = inner
        .strip_prefix(OPEN)
        .ok_or_else(|| format!("the `<tool_call>` block does not start with `{OPEN}`"))?;
    let (name, body) = after
        .split_once('>')
        .ok_or_else(|| format!("`{OPEN}` is never closed by `>`"))?;
    let body = body
        .strip_suffix(CLOSE)
        .ok_or_else(|| format!("the function is not closed by `{CLOSE}` at the block's end"))?;
    let mut arguments = Map::new();
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let after = rest
            .strip_prefix("<parameter=")
            .ok_or("text outside a `<parameter=…>` in the function")?;
        let (key, value_on) = after
            .split_once('>')
            .ok_or("`<parameter=` is never closed by `>`")?;
        let (value, next) = value_on
            .split_once("</parameter>")
            .ok_or("`<parameter=…>` is never closed by `</parameter>`")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        arguments.insert(key_name(key)?, Value::String(value.to_owned()));
        rest = next.trim_start();
    }
    Ok(text_call(bare_name(name)?, arguments))
}

/// GLM-4.x and its kin: `NAME` then `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` pairs
/// (whitespace between the parts) in each `<tool_call>` block.
pub(super) fn glm(text: &str, sink: &mut Sink) {
    each_block(text, "<tool_call>", "</tool_call>", sink, arg_pairs);
}

fn arg_pairs(inner: &str) -> Result<Call, String> {
    let (name, mut rest) = match inner.find("<arg_key>") {
        Some(at) => inner.split_at(at),
        None => (inner, ""),
    };
    let mut arguments = Map::new();
    while !rest.is_empty() {
        let key = tagged(&mut rest, "arg_key")?;
        rest = rest.trim_start();
        let value = tagged(&mut rest, "arg_value")?;
        arguments.insert(key_name(key)?, Value::String(value.to_owned()));
        rest = rest.trim_start();
    }
    Ok(text_call(bare_name(name)?, arguments))
}

/// The text of the `<tag>…</tag>` at the start of `rest`, which moves past it.
fn tagged<'a>(rest: &mut &'a str, tag: &str) -> Result<&'a str, String> {
    let after = rest
        .strip_prefix(&format!("<{tag}>"))
        .ok_or_else(|| format!("expected `<{tag}>` in the call"))?;
    let close = format!("</{tag}>");
    let (text, next) = after
        .split_once(&close)
        .ok_or_else(|| format!("`<{tag}>` is never closed by `{close}`"))?;
    *rest = next;
    Ok(text)
}

/// A parameter's name: trimmed and not empty.
fn key_name(key: &str) -> Result<String, String> {
    let key = key.trim();
    match key.is_empty() {
        true => Err("a parameter has no name".into()),
        false => Ok(key.to_owned()),
    }
}

fn text_call(name: String, arguments: Map<String, Value>) -> Call {
    Call {
        name,
        arguments: Value::Object(arguments),
        text_values: true,
    }
}
