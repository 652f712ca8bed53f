//! A conversation eval text: conversations in the shape transformers' `apply_chat_template`
//! takes, read from JSON (one conversation object, or a list of them) or JSONL (one per line).
//!
//! A conversation is `{"messages": [...], "tools": [...]?, "add_generation_prompt": bool?,
//! "kwargs": {...}?}` or a bare list of messages. A message has a string `role` and a `content`
//! that is a string, a list of content parts, or null (an assistant turn that only calls tools);
//! `tool_calls`, `reasoning_content`, `name`, `tool_call_id` pass through to the template as they
//! are. Everything is range-checked before it sizes anything: the file, the number of
//! conversations and of messages.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The most bytes a conversation file may hold.
pub const MAX_CONVERSATION_BYTES: u64 = 256 << 20;
/// The most conversations one file may hold.
pub const MAX_CONVERSATIONS: usize = 100_000;
/// The most messages one conversation may hold.
pub const MAX_MESSAGES: usize = 100_000;

/// One conversation, as the template will see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    pub add_generation_prompt: bool,
    /// Template kwargs (`enable_thinking`, ...).
    pub kwargs: Map<String, Value>,
}

/// Reads `path` (JSON or JSONL, told apart by content: a JSONL file has more than one top-level
/// value).
pub fn read(path: &Path) -> Result<Vec<Conversation>> {
    let bytes = crate::files::read_capped(path, MAX_CONVERSATION_BYTES, "a conversation file")?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| Error::format(path, None, "a conversation file must be UTF-8 JSON"))?;
    let mut values = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    loop {
        let offset = stream.byte_offset();
        match stream.next() {
            None => break,
            Some(Ok(v)) => values.push((line_of(text, offset), v)),
            Some(Err(e)) => {
                return Err(Error::format(
                    path,
                    None,
                    format!("not valid JSON at line {}: {e}", e.line()),
                ));
            }
        }
        if values.len() > MAX_CONVERSATIONS {
            return Err(too_many(path));
        }
    }
    let items: Vec<(usize, Value)> = match values.as_slice() {
        [] => return Err(Error::format(path, None, "holds no conversation")),
        // One JSON document: a conversation, a list of messages, or a list of conversations.
        [(line, Value::Array(list))] if list.first().is_some_and(is_conversation) => {
            list.iter().map(|v| (*line, v.clone())).collect()
        }
        _ => values,
    };
    if items.len() > MAX_CONVERSATIONS {
        return Err(too_many(path));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, (line, v))| {
            conversation(v).map_err(|rule| {
                Error::format(
                    path,
                    Some(&format!("conversation {} (line {line})", i + 1)),
                    rule,
                )
            })
        })
        .collect()
}

fn too_many(path: &Path) -> Error {
    Error::format(
        path,
        None,
        format!("holds more than {MAX_CONVERSATIONS} conversations"),
    )
}

fn line_of(text: &str, offset: usize) -> usize {
    let start = text[offset..]
        .find(|c: char| !c.is_whitespace())
        .map_or(offset, |skip| offset + skip);
    text[..start].matches('\n').count() + 1
}

/// A conversation object, or a list of messages (whose first element has a `role`).
fn is_conversation(v: &Value) -> bool {
    v.get("messages").is_some()
        || v.as_array()
            .is_some_and(|m| m.first().is_some_and(|x| x.get("role").is_some()))
}

fn conversation(v: &Value) -> std::result::Result<Conversation, String> {
    let (messages, object) = match v {
        Value::Array(messages) => (messages, None),
        Value::Object(o) => match o.get("messages") {
            Some(Value::Array(messages)) => (messages, Some(o)),
            Some(_) => return Err("`messages` must be a list of messages".into()),
            None => return Err("has no `messages`".into()),
        },
        _ => return Err("must be an object with `messages`, or a list of messages".into()),
    };
    if messages.is_empty() {
        return Err("has no messages".into());
    }
    if messages.len() > MAX_MESSAGES {
        return Err(format!("has more than {MAX_MESSAGES} messages"));
    }
    for (i, m) in messages.iter().enumerate() {
        let at = |rule: &str| format!("message {}: {rule}", i + 1);
        let Some(fields) = m.as_object() else {
            return Err(at("must be an object"));
        };
        match fields.get("role") {
            Some(Value::String(r)) if !r.is_empty() => {}
            _ => return Err(at("needs a non-empty string `role`")),
        }
        match fields.get("content") {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
            Some(_) => return Err(at("`content` must be a string, a list of parts, or null")),
        }
        if let Some(calls) = fields.get("tool_calls")
            && !calls.is_array()
        {
            return Err(at("`tool_calls` must be a list"));
        }
    }
    let mut out = Conversation {
        messages: messages.clone(),
        tools: None,
        add_generation_prompt: false,
        kwargs: Map::new(),
    };
    if let Some(o) = object {
        for key in o.keys() {
            if !matches!(
                key.as_str(),
                "messages" | "tools" | "add_generation_prompt" | "kwargs"
            ) {
                return Err(format!(
                    "unknown field `{key}` (the fields are messages, tools, add_generation_prompt, kwargs)"
                ));
            }
        }
        match o.get("tools") {
            None | Some(Value::Null) => {}
            Some(t @ Value::Array(_)) => out.tools = Some(t.clone()),
            Some(_) => {
                return Err("`tools` must be a list of JSON Schema function definitions".into());
            }
        }
        match o.get("add_generation_prompt") {
            None => {}
            Some(Value::Bool(b)) => out.add_generation_prompt = *b,
            Some(_) => return Err("`add_generation_prompt` must be true or false".into()),
        }
        match o.get("kwargs") {
            None => {}
            Some(Value::Object(k)) => {
                for reserved in ["messages", "tools", "documents", "add_generation_prompt"] {
                    if k.contains_key(reserved) {
                        return Err(format!("`kwargs` may not set `{reserved}`"));
                    }
                }
                out.kwargs = k.clone();
            }
            Some(_) => return Err("`kwargs` must be an object".into()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn json_jsonl_and_bare_message_lists_are_read() {
        let one = file(
            r#"{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true, "kwargs": {"enable_thinking": false}}"#,
        );
        let c = read(one.path()).unwrap();
        assert_eq!(c.len(), 1);
        assert!(c[0].add_generation_prompt);
        assert_eq!(c[0].kwargs["enable_thinking"], false);
        let list = file(
            r#"[{"messages": [{"role": "user", "content": "a"}]}, [{"role": "user", "content": "b"}]]"#,
        );
        assert_eq!(read(list.path()).unwrap().len(), 2);
        let bare = file(
            r#"[{"role": "user", "content": "a"}, {"role": "assistant", "content": null, "tool_calls": []}]"#,
        );
        let c = read(bare.path()).unwrap();
        assert_eq!((c.len(), c[0].messages.len()), (1, 2));
        let jsonl = file(
            "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"b\"}]}\n",
        );
        assert_eq!(read(jsonl.path()).unwrap().len(), 2);
    }

    #[test]
    fn bad_conversations_name_the_conversation_line_and_message() {
        for (text, message) in [
            ("", "holds no conversation"),
            ("{", "not valid JSON"),
            (
                r#"{"messages": []}"#,
                "conversation 1 (line 1): has no messages",
            ),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n{\"messages\": [{\"content\": \"b\"}]}",
                "conversation 2 (line 2): message 1: needs a non-empty string `role`",
            ),
            (
                r#"{"messages": [{"role": "user", "content": 3}]}"#,
                "`content` must be",
            ),
            (
                r#"{"messages": [{"role": "user"}], "tool": []}"#,
                "unknown field `tool`",
            ),
            (
                r#"{"messages": [{"role": "user"}], "kwargs": {"messages": 1}}"#,
                "may not set `messages`",
            ),
            (
                r#"{"messages": [{"role": "user"}], "tools": {}}"#,
                "`tools` must be a list",
            ),
        ] {
            let f = file(text);
            let e = read(f.path()).unwrap_err().to_string();
            assert!(
                e.contains(message) && e.contains(&f.path().display().to_string()),
                "{text}: {e}"
            );
        }
    }
}
