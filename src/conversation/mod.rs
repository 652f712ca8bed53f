//! Conversations as evaluation text (issue #19): chat templates rendered exactly as transformers
//! renders them ([`template`]), from the context [`template_context`] builds as transformers'
//! `render_jinja_template` builds it.

pub mod template;

use serde_json::{Map, Value};

/// The names transformers reads a message's reasoning under, in its order
/// (`_REASONING_FIELDS`).
pub const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// What a template sees, as `render_jinja_template` hands it over: `messages` with the reasoning
/// aliased (a message's first non-null reasoning field also becomes `thinking`, first among its
/// keys unless it has one, and `reasoning_content`, last: gpt-oss templates read the one, Qwen's
/// the other), `tools`, `documents` (none), `add_generation_prompt`, then the template kwargs
/// (`enable_thinking`, special tokens), which may shadow nothing of the above.
pub fn template_context(
    messages: &[Value],
    tools: Option<&Value>,
    add_generation_prompt: bool,
    kwargs: &Map<String, Value>,
) -> Value {
    let messages: Vec<Value> = messages.iter().map(alias_reasoning).collect();
    let mut context = Map::new();
    context.insert("messages".into(), Value::Array(messages));
    context.insert("tools".into(), tools.cloned().unwrap_or(Value::Null));
    context.insert("documents".into(), Value::Null);
    context.insert(
        "add_generation_prompt".into(),
        Value::Bool(add_generation_prompt),
    );
    for (k, v) in kwargs {
        context.insert(k.clone(), v.clone());
    }
    Value::Object(context)
}

/// transformers' `_alias_reasoning_fields` for one message: `{"thinking": r, **message,
/// "reasoning_content": r}`.
fn alias_reasoning(message: &Value) -> Value {
    let Some(fields) = message.as_object() else {
        return message.clone();
    };
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| fields.get(*k).filter(|v| !v.is_null()));
    let Some(reasoning) = reasoning else {
        return message.clone();
    };
    let mut out = Map::new();
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in fields {
        out.insert(k.clone(), v.clone());
    }
    // A key already present keeps its place when set again; transformers' dict literal puts
    // `reasoning_content` where the message had it, or last.
    out.insert("reasoning_content".into(), reasoning.clone());
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_is_aliased_as_transformers_aliases_it() {
        let m = serde_json::json!({"role": "assistant", "content": "x", "reasoning": "r"});
        let out = alias_reasoning(&m);
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "thinking",
                "role",
                "content",
                "reasoning",
                "reasoning_content"
            ]
        );
        assert_eq!(out["thinking"], "r");
        let plain = serde_json::json!({"role": "user", "content": "hi"});
        assert_eq!(alias_reasoning(&plain), plain);
    }
}
