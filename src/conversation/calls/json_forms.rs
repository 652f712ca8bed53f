//! The families whose arguments are JSON: Hermes, Llama 3.x, Mistral, DeepSeek and Kimi.

use serde_json::{Map, Value};

use super::{Call, Sink, bare_name, each_block, malformed};

/// Hermes / Qwen2.5 / Qwen3: a JSON call object in each `<tool_call>` block.
pub(super) fn hermes(text: &str, sink: &mut Sink) {
    each_block(text, "<tool_call>", "</tool_call>", sink, |inner| {
        call_object(json(inner.trim())?)
    });
}

/// DeepSeek: `type<｜tool▁sep｜>NAME\n```json\n{…}\n```` (V3, R1) or `NAME<｜tool▁sep｜>{…}`
/// (V3.1) in each `<｜tool▁call▁begin｜>` block.
pub(super) fn deepseek(text: &str, sink: &mut Sink) {
    const SEP: &str = "<｜tool▁sep｜>";
    each_block(
        text,
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        sink,
        |inner| {
            let (head, body) = inner
                .split_once(SEP)
                .ok_or_else(|| format!("the call has no `{SEP}`"))?;
            // V3.1 writes the JSON right after the separator; R1 the name on its own line, then
            // a fenced block (`head` is then the call's type).
            let json_first = body.trim_start().starts_with(['{', '[', '"']);
            match body.split_once("```").filter(|_| !json_first) {
                Some((name, fenced)) => {
                    let fenced = fenced.strip_prefix("json").unwrap_or(fenced);
                    let (arguments, _) = fenced
                        .rsplit_once("```")
                        .ok_or("the arguments' ``` block is never closed")?;
                    named(bare_name(name)?, json(arguments.trim())?)
                }
                None => named(bare_name(head)?, json(body.trim())?),
            }
        },
    );
}

/// Kimi K2: `functions.NAME:INDEX<|tool_call_argument_begin|>{…}` in each `<|tool_call_begin|>`
/// block.
pub(super) fn kimi(text: &str, sink: &mut Sink) {
    const ARGS: &str = "<|tool_call_argument_begin|>";
    each_block(
        text,
        "<|tool_call_begin|>",
        "<|tool_call_end|>",
        sink,
        |inner| {
            let (id, arguments) = inner
                .split_once(ARGS)
                .ok_or_else(|| format!("the call has no `{ARGS}`"))?;
            let id = id.trim();
            let id = id.strip_prefix("functions.").unwrap_or(id);
            let name = match id.rsplit_once(':') {
                Some((name, index)) if index.bytes().all(|b| b.is_ascii_digit()) => name,
                _ => id,
            };
            named(bare_name(name)?, json(arguments.trim())?)
        },
    );
}

/// Mistral: after each `[TOOL_CALLS]`, a JSON list of call objects (Nemo), or
/// `NAME[CALL_ID]id[ARGS]{…}` with the `[CALL_ID]` part optional (Small 3.2, Devstral).
pub(super) fn mistral(text: &str, sink: &mut Sink) {
    const MARK: &str = "[TOOL_CALLS]";
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let from = &rest[at..];
        let body = &from[MARK.len()..];
        // A call's text runs to the next marker.
        let end = body.find(MARK).unwrap_or(body.len());
        let segment = &body[..end];
        let raw = &from[..MARK.len() + end];
        let go_on = match segment.trim_start().strip_prefix('[') {
            Some(list) => mistral_list(list, raw, sink),
            None => sink.push_parsed(mistral_named(segment), raw),
        };
        if !go_on {
            return;
        }
        rest = &body[end..];
    }
}

fn mistral_named(segment: &str) -> Result<Call, String> {
    let (head, arguments) = segment
        .split_once("[ARGS]")
        .ok_or("`[TOOL_CALLS]` is followed by neither a list nor `NAME[ARGS]`")?;
    let name = head.split_once("[CALL_ID]").map_or(head, |(name, _)| name);
    let (arguments, _) = first_json(arguments)?;
    named(bare_name(name)?, arguments)
}

/// The elements of a JSON list of calls after its `[`, one at a time (so a long list stops at
/// the bound without being built); `false` when the sink is full.
fn mistral_list(list: &str, raw: &str, sink: &mut Sink) -> bool {
    let mut rest = list.trim_start();
    if rest.starts_with(']') {
        let reason = "`[TOOL_CALLS]` opens an empty list".to_owned();
        return sink.push(malformed(raw, reason), raw);
    }
    loop {
        // JSON that does not parse ends the list; an element that is no call does not.
        let (value, used) = match first_json(rest) {
            Ok(found) => found,
            Err(reason) => return sink.push(malformed(raw, reason), raw),
        };
        rest = rest[used..].trim_start();
        if !sink.push_parsed(call_object(value), raw) {
            return false;
        }
        match rest.as_bytes().first() {
            Some(b',') => rest = rest[1..].trim_start(),
            Some(b']') => return true,
            _ => {
                let reason = "the list of calls is not closed by `]`".to_owned();
                return sink.push(malformed(raw, reason), raw);
            }
        }
    }
}

/// Llama 3.x: the turn is a JSON call object (after `<|python_tag|>`, if written), or several
/// separated by `;`. A turn that is not a call (prose, or JSON content without a `name`) is none.
pub(super) fn llama(text: &str, sink: &mut Sink) {
    const TAG: &str = "<|python_tag|>";
    let text = text.trim_start();
    let (tagged, mut rest) = match text.strip_prefix(TAG) {
        Some(after) => (true, after.trim_start()),
        None => (false, text),
    };
    if !rest.starts_with('{') {
        if tagged {
            let reason = "`<|python_tag|>` is not followed by a JSON call (a built-in tool's \
                          `name.call(…)` or code, which cardproof does not parse)";
            sink.push(malformed(text, reason.into()), text);
        }
        return;
    }
    // Untagged, the first object decides whether the turn is a call at all.
    let mut decided = tagged;
    while rest.starts_with('{') {
        let start = rest;
        let parsed = match first_json(rest) {
            Ok((value, used)) => {
                rest = rest[used..].trim_start();
                if !decided && !names_a_call(&value) {
                    return;
                }
                call_object(value)
            }
            Err(_) if !decided && !opens_call(start) => return,
            Err(reason) => {
                sink.push(malformed(start, reason), start);
                return;
            }
        };
        if !sink.push_parsed(parsed, start) {
            return;
        }
        decided = true;
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
}

/// Whether a JSON object is a call rather than content: it has a string `name`, or OpenAI's
/// `function` object.
fn names_a_call(value: &Value) -> bool {
    value.get("name").is_some_and(Value::is_string)
        || value.get("function").is_some_and(Value::is_object)
}

/// Whether JSON that does not parse begins as a call does: `{` then the key `"name"`, `"type"`
/// or `"function"`.
fn opens_call(text: &str) -> bool {
    let after = text.strip_prefix('{').unwrap_or(text).trim_start();
    ["\"name\"", "\"type\"", "\"function\""]
        .iter()
        .any(|key| after.starts_with(key))
}

/// A call object: `{"name": N, "arguments": A}` (or `"parameters"`), or OpenAI's
/// `{"type": "function", "function": {…}}`; arguments left out are `{}`.
fn call_object(value: Value) -> Result<Call, String> {
    let Value::Object(mut object) = value else {
        return Err("the call is not a JSON object".into());
    };
    if !object.contains_key("name")
        && let Some(Value::Object(function)) = object.remove("function")
    {
        object = function;
    }
    let name = match object.remove("name") {
        Some(Value::String(name)) if !name.is_empty() => name,
        Some(Value::String(_)) => return Err("the call's `name` is empty".into()),
        Some(_) => return Err("the call's `name` is not a string".into()),
        None => return Err("the call has no `name`".into()),
    };
    let arguments = object
        .remove("arguments")
        .or_else(|| object.remove("parameters"))
        .unwrap_or_else(|| Value::Object(Map::new()));
    named(name, arguments)
}

fn named(name: String, arguments: Value) -> Result<Call, String> {
    Ok(Call {
        name,
        arguments,
        text_values: false,
    })
}

fn json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("the call is not valid JSON: {e}"))
}

/// The JSON value at the start of `text` (after whitespace) and the bytes it took; what follows
/// it is the caller's.
fn first_json(text: &str) -> Result<(Value, usize), String> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match stream.next() {
        Some(Ok(value)) => Ok((value, stream.byte_offset())),
        Some(Err(e)) => Err(format!("the call is not valid JSON: {e}")),
        None => Err("the call's JSON is missing".into()),
    }
}
