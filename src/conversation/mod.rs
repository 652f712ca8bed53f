//! Conversations as evaluation text (issue #19): chat templates rendered exactly as transformers
//! renders them ([`template`]), from the context [`template_context`] builds as transformers'
//! `render_jinja_template` builds it.

pub mod calls;
pub mod eval;
pub mod file;
pub mod source;
pub mod spans;
pub mod template;
pub mod turns;

use serde_json::{Map, Value};

/// The names transformers reads a message's reasoning under, in its order
/// (`_REASONING_FIELDS`).
pub const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// What a template sees, as `apply_chat_template` hands it over: `messages` without their
/// null-valued keys (`_normalize_chat_messages`: `"content": null` is no `content` at all, so a
/// template sees it undefined, not `None`) and with the reasoning aliased (a message's first
/// non-null reasoning field also becomes `thinking`, first among its keys unless it has one, and
/// `reasoning_content`, last: gpt-oss templates read the one, Qwen's the other), `tools`,
/// `documents` (none), `add_generation_prompt`, then the template kwargs (`enable_thinking`,
/// special tokens), which may shadow nothing of the above.
pub fn template_context(
    messages: &[Value],
    tools: Option<&Value>,
    add_generation_prompt: bool,
    kwargs: &Map<String, Value>,
) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|m| alias_reasoning(&drop_nulls(m)))
        .collect();
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

/// The special tokens transformers hands every template (`special_tokens_map`: `bos_token`,
/// `eos_token`, ... as strings), from a `tokenizer_config.json`, where each is a string or an
/// added-token object with `content`.
pub fn special_tokens(tokenizer_config: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    for key in [
        "bos_token",
        "eos_token",
        "unk_token",
        "sep_token",
        "pad_token",
        "cls_token",
        "mask_token",
    ] {
        let token = match &tokenizer_config[key] {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        };
        if let Some(token) = token {
            out.insert(key.into(), Value::String(token));
        }
    }
    out
}

/// One conversation rendered by `template` as `apply_chat_template(tokenize=False)` renders it:
/// the special tokens first, the conversation's own kwargs over them.
pub fn render(
    template: &template::Compiled,
    conversation: &file::Conversation,
    special: &Map<String, Value>,
) -> Result<String, String> {
    let mut kwargs = special.clone();
    for (k, v) in &conversation.kwargs {
        kwargs.insert(k.clone(), v.clone());
    }
    template.render(&template_context(
        &conversation.messages,
        conversation.tools.as_ref(),
        conversation.add_generation_prompt,
        &kwargs,
    ))
}

/// transformers' `_normalize_chat_messages` for one message: its keys whose value is null
/// dropped (nested values are kept as they are).
fn drop_nulls(message: &Value) -> Value {
    match message.as_object() {
        Some(fields) => Value::Object(
            fields
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        None => message.clone(),
    }
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
    fn special_tokens_and_kwargs_reach_the_template() {
        let special = special_tokens(&serde_json::json!({
            "bos_token": {"content": "<s>", "special": true},
            "eos_token": "</s>",
            "pad_token": null
        }));
        assert_eq!(special.len(), 2);
        let t = template::ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if enable_thinking %}<think>{% endif %}{{ eos_token }}",
            0,
        )
        .unwrap();
        let c = file::Conversation {
            messages: vec![serde_json::json!({"role": "user", "content": "hi"})],
            tools: None,
            add_generation_prompt: true,
            kwargs: serde_json::from_value(serde_json::json!({"enable_thinking": true})).unwrap(),
        };
        assert_eq!(
            render(&t.compiled().unwrap(), &c, &special).unwrap(),
            "<s>[user]hi<think></s>"
        );
    }

    #[test]
    fn a_null_message_field_is_left_out_as_apply_chat_template_leaves_it_out() {
        let context = template_context(
            &[
                serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": null}}]}),
            ],
            None,
            false,
            &Map::new(),
        );
        let message = &context["messages"][0];
        assert_eq!(message.as_object().unwrap().len(), 2, "{message}");
        assert!(message.get("content").is_none());
        // Only the message's own keys: a nested null stays.
        assert!(message["tool_calls"][0]["function"]["arguments"].is_null());
        let t = template::ChatTemplate::new(
            "{% for m in messages %}{{ m.content is defined }}{{ '</think>' in m.content }}{% endfor %}",
            0,
        )
        .unwrap();
        assert_eq!(t.render(&context).unwrap(), "FalseFalse");
    }

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
