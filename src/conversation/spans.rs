//! Which message, role and segment every byte of a rendered conversation belongs to, found from
//! the rendering itself (issue #19), never by pattern-matching the output.
//!
//! Three renders of the same conversation with the same template decide it:
//!
//! 1. **Fields, by sentinels.** Every string the conversation gives the template for a message
//!    (content and its text parts, reasoning, each tool call's function name and the string
//!    leaves of its arguments) is wrapped in private-use sentinels that carry the field's id,
//!    around its non-blank core so `trim`/`strip` keep them; the template renders the wrapped
//!    conversation, and removing the sentinels must give the plain render byte for byte (a
//!    template that slices, measures or re-encodes a field is refused, naming the message and
//!    field). Where a sentinel pair lands, that field's bytes are.
//! 2. **Turns.** Bytes between fields are template scaffolding. Scaffolding between two fields of
//!    one message is that message's; between two messages it is split after the first token
//!    generation stops at (the model's EOS tokens: `<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`,
//!    `<｜end▁of▁sentence｜>`, `</s>`), or failing one, after the first special (control) token
//!    (Mistral's `[/INST]`): up to and including it, the earlier message's, after it the later
//!    one's (with neither, all the later one's). Before the first field: the first field's
//!    message; after the last field's turn end: no message (the generation prompt).
//! 3. **Tool calls, by difference.** For each assistant message with tool calls the
//!    conversation is rendered once more without them; the bytes where the two renders differ
//!    (the minimal window between their common prefix and suffix), clipped to the message's
//!    turn, are the tool-call segment: `<tool_call>`, `<function=…>`, `[TOOL_CALLS]` and the JSON
//!    punctuation included, since the model generates those too. When that render fails, the
//!    segment runs from the first tool-call field to the last.

use serde_json::{Map, Value};

use super::file::Conversation;
use super::template::ChatTemplate;

pub use crate::kld::protocol::{Role, Segment};

/// A run of bytes of the render with one owner and one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: usize,
    pub end: usize,
    /// The message (index into the conversation's messages) that owns the bytes; `None` after
    /// the last message's end-of-turn marker (the generation prompt).
    pub message: Option<u32>,
    pub segment: Segment,
}

/// A conversation rendered, with every byte labelled.
#[derive(Debug, Clone)]
pub struct Labelled {
    /// The render, exactly as `apply_chat_template(tokenize=False)` writes it.
    pub text: String,
    /// Contiguous, sorted ranges covering `text`.
    pub ranges: Vec<Range>,
    /// Each message's role.
    pub roles: Vec<Role>,
    /// Assistant messages whose tool-call segment came from their fields only (the render
    /// without their tool calls failed).
    pub tool_calls_from_fields: Vec<u32>,
}

/// The sentinels: a field opens with `OPEN`, its id in hex digits `DIGIT0..`, `ID_END`, and
/// closes with `CLOSE`. All lie in Supplementary Private Use Area-A, which no template or
/// tokenizer gives meaning to; a conversation that holds any of them is refused.
const OPEN: char = '\u{F0000}';
const ID_END: char = '\u{F0001}';
const CLOSE: char = '\u{F0002}';
const DIGIT0: u32 = 0xF0010;
const SENTINELS: std::ops::RangeInclusive<char> = '\u{F0000}'..='\u{F001F}';

/// Whether `c` is one of the field markers (the `tojson` filter writes them raw even when asked
/// for ASCII, so a marked render strips back to the plain one).
pub(crate) fn is_marker(c: char) -> bool {
    SENTINELS.contains(&c)
}

/// One wrapped string of a message.
#[derive(Debug, Clone)]
struct Field {
    message: u32,
    segment: Segment,
    /// Where in the message it is, for errors (`content`, `tool_calls[0].function.name`).
    path: String,
}

/// The tokens that end a turn, from the tokenizer and the generation config.
#[derive(Debug, Clone, Default)]
pub struct TurnMarkers {
    /// Tokens generation stops at (`generation_config.json`'s `eos_token_id`, the tokenizer
    /// config's `eos_token`): an assistant's turn ends with one.
    pub stops: Vec<String>,
    /// The tokenizer's other special (control) tokens, for turns that end with none of the stops
    /// (Mistral's user turn ends at `[/INST]`).
    pub specials: Vec<String>,
}

impl TurnMarkers {
    /// Where the turn that `run` closes ends: after its first stop token, else after its first
    /// special token; `None` when it holds neither.
    fn turn_end(&self, run: &str) -> Option<usize> {
        first_end(run, &self.stops).or_else(|| first_end(run, &self.specials))
    }
}

/// Labels `conversation` as `template` renders it with `special` (the template's special-token
/// kwargs); `markers` end turns. The error says which message and field could not be placed,
/// and why.
pub fn label(
    template: &ChatTemplate,
    conversation: &Conversation,
    special: &Map<String, Value>,
    markers: &TurnMarkers,
) -> Result<Labelled, String> {
    let text = super::render(template, conversation, special)?;
    let roles: Vec<Role> = conversation
        .messages
        .iter()
        .map(|m| Role::of(m["role"].as_str().unwrap_or_default()))
        .collect();
    if text.chars().any(|c| SENTINELS.contains(&c))
        || conversation
            .tools
            .as_ref()
            .is_some_and(|t| t.to_string().chars().any(|c| SENTINELS.contains(&c)))
    {
        return Err("the rendered conversation holds characters U+F0000..U+F001F, which cardproof uses to find each message's text; remove them".into());
    }

    // 1. Fields.
    let mut fields = Vec::new();
    let wrapped = Conversation {
        messages: conversation
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| wrap_message(i as u32, m, &mut fields))
            .collect(),
        ..conversation.clone()
    };
    let sentinel_text = super::render(template, &wrapped, special).map_err(|e| {
        format!(
            "the template renders the conversation but not with its messages' text marked ({e}); {}",
            culprit(template, conversation, special, &text)
        )
    })?;
    let spans = field_spans(&sentinel_text, &text)
        .map_err(|why| format!("{why}; {}", culprit(template, conversation, special, &text)))?;
    let mut owned: Vec<(usize, usize, u32, Segment)> = spans
        .iter()
        .filter(|s| s.start < s.end)
        .map(|s| {
            let f = &fields[s.field];
            (s.start, s.end, f.message, f.segment)
        })
        .collect();
    owned.sort_by_key(|&(start, end, ..)| (start, end));

    // 2. Turns: every byte gets an owner and a segment.
    let mut ranges = Vec::new();
    let turn_end = |run: &str| markers.turn_end(run);
    let mut at = 0usize;
    let mut previous: Option<u32> = None;
    for &(start, end, message, segment) in &owned {
        if start < at {
            // A field inside one already placed (a template that writes a string twice,
            // overlapping): the first placement stands.
            if end > at {
                ranges.push(Range {
                    start: at,
                    end,
                    message: Some(message),
                    segment,
                });
                at = end;
            }
            continue;
        }
        if start > at {
            let run = &text[at..start];
            match previous {
                Some(p) if p != message => {
                    let split = at + turn_end(run).unwrap_or(0);
                    push(&mut ranges, at, split, Some(p), Segment::Scaffolding);
                    push(
                        &mut ranges,
                        split,
                        start,
                        Some(message),
                        Segment::Scaffolding,
                    );
                }
                Some(p) => push(&mut ranges, at, start, Some(p), Segment::Scaffolding),
                None => push(&mut ranges, at, start, Some(message), Segment::Scaffolding),
            }
        }
        push(&mut ranges, start, end, Some(message), segment);
        at = end;
        previous = Some(message);
    }
    if at < text.len() {
        let run = &text[at..];
        let split = at + previous.map_or(0, |_| turn_end(run).unwrap_or(0));
        push(&mut ranges, at, split, previous, Segment::Scaffolding);
        push(&mut ranges, split, text.len(), None, Segment::Scaffolding);
    }

    // 3. Tool calls.
    let mut tool_calls_from_fields = Vec::new();
    for (k, m) in conversation.messages.iter().enumerate() {
        let has_calls = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        if !has_calls {
            continue;
        }
        let k = k as u32;
        let region = match without_tool_calls(template, conversation, special, k as usize) {
            Some(other) => Some(differing_window(&text, &other)),
            None => {
                tool_calls_from_fields.push(k);
                let calls: Vec<&(usize, usize, u32, Segment)> = owned
                    .iter()
                    .filter(|o| o.2 == k && o.3 == Segment::ToolCall)
                    .collect();
                calls
                    .first()
                    .zip(calls.last())
                    .map(|(first, last)| (first.0, last.1))
            }
        };
        if let Some((start, end)) = region {
            ranges = mark_tool_call(ranges, start, end, k);
        }
    }
    Ok(Labelled {
        text,
        ranges,
        roles,
        tool_calls_from_fields,
    })
}

/// Appends a range, merged with the last one when they carry the same label.
fn push(ranges: &mut Vec<Range>, start: usize, end: usize, message: Option<u32>, segment: Segment) {
    if start >= end {
        return;
    }
    if let Some(last) = ranges.last_mut()
        && last.end == start
        && last.message == message
        && last.segment == segment
    {
        last.end = end;
        return;
    }
    ranges.push(Range {
        start,
        end,
        message,
        segment,
    });
}

/// Where the first of `tokens` in `run` ends, if it holds one (the leftmost, longest).
fn first_end(run: &str, tokens: &[String]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for s in tokens.iter().filter(|s| !s.is_empty()) {
        if let Some(i) = run.find(s.as_str()) {
            let candidate = (i, i + s.len());
            best = match best {
                Some(b) if b.0 < i || (b.0 == i && b.1 >= candidate.1) => Some(b),
                _ => Some(candidate),
            };
        }
    }
    best.map(|b| b.1)
}

/// Scaffolding bytes of message `k` inside `[start, end)` become its tool-call segment; fields
/// keep theirs.
fn mark_tool_call(ranges: Vec<Range>, start: usize, end: usize, k: u32) -> Vec<Range> {
    let mut out = Vec::with_capacity(ranges.len() + 2);
    for r in ranges {
        let inside = r.message == Some(k) && r.segment == Segment::Scaffolding;
        let (a, b) = (r.start.max(start), r.end.min(end));
        if !inside || a >= b {
            push(&mut out, r.start, r.end, r.message, r.segment);
            continue;
        }
        push(&mut out, r.start, a, r.message, r.segment);
        push(&mut out, a, b, r.message, Segment::ToolCall);
        push(&mut out, b, r.end, r.message, r.segment);
    }
    out
}

/// The conversation rendered with message `k`'s tool calls removed, if the template renders it.
fn without_tool_calls(
    template: &ChatTemplate,
    conversation: &Conversation,
    special: &Map<String, Value>,
    k: usize,
) -> Option<String> {
    let mut c = conversation.clone();
    c.messages[k].as_object_mut()?.remove("tool_calls");
    super::render(template, &c, special).ok()
}

/// The smallest window of `a` outside which `a` and `b` agree (their common prefix and suffix),
/// widened to whole characters.
fn differing_window(a: &str, b: &str) -> (usize, usize) {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let prefix = x.iter().zip(y).take_while(|(p, q)| p == q).count();
    let room = x.len().min(y.len()) - prefix;
    let suffix = x
        .iter()
        .rev()
        .zip(y.iter().rev())
        .take(room)
        .take_while(|(p, q)| p == q)
        .count();
    let start = a.floor_char_boundary(prefix);
    let end = a.ceil_char_boundary(x.len() - suffix);
    (start, end.max(start))
}

/// A message with each of its strings wrapped in sentinels (fields recorded in `fields`).
fn wrap_message(message: u32, m: &Value, fields: &mut Vec<Field>) -> Value {
    let Some(object) = m.as_object() else {
        return m.clone();
    };
    let tool = Role::of(
        object
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    ) == Role::Tool;
    let content_segment = if tool {
        Segment::ToolResult
    } else {
        Segment::Content
    };
    let mut out = object.clone();
    let mut wrap = |value: &mut Value, segment: Segment, path: String| {
        if let Value::String(s) = value {
            *s = wrapped(s, fields.len());
            if s.chars().any(|c| c == OPEN) {
                fields.push(Field {
                    message,
                    segment,
                    path,
                });
            }
        }
    };
    if let Some(content) = out.get_mut("content") {
        match content {
            Value::Array(parts) => {
                for (i, part) in parts.iter_mut().enumerate() {
                    if let Some(text) = part.get_mut("text") {
                        wrap(text, content_segment, format!("content[{i}].text"));
                    }
                }
            }
            other => wrap(other, content_segment, "content".into()),
        }
    }
    for key in super::REASONING_FIELDS {
        if let Some(v) = out.get_mut(key) {
            wrap(v, Segment::Reasoning, key.into());
        }
    }
    if let Some(Value::Array(calls)) = out.get_mut("tool_calls") {
        for (i, call) in calls.iter_mut().enumerate() {
            // OpenAI's shape (`function: {name, arguments}`) or the flat one.
            let (prefix, target) = match call.get("function").is_some() {
                true => (
                    format!("tool_calls[{i}].function"),
                    call.get_mut("function"),
                ),
                false => (format!("tool_calls[{i}]"), Some(call)),
            };
            let Some(Value::Object(function)) = target else {
                continue;
            };
            if let Some(name) = function.get_mut("name") {
                wrap(name, Segment::ToolCall, format!("{prefix}.name"));
            }
            if let Some(arguments) = function.get_mut("arguments") {
                wrap_leaves(arguments, &format!("{prefix}.arguments"), &mut wrap);
            }
        }
    }
    Value::Object(out)
}

/// Every string leaf of an arguments value (or the value itself, a JSON string).
fn wrap_leaves(value: &mut Value, path: &str, wrap: &mut impl FnMut(&mut Value, Segment, String)) {
    match value {
        Value::String(_) => wrap(value, Segment::ToolCall, path.to_owned()),
        Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                wrap_leaves(v, &format!("{path}[{i}]"), wrap);
            }
        }
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                wrap_leaves(v, &format!("{path}.{k}"), wrap);
            }
        }
        _ => {}
    }
}

/// `s` with its non-blank core between sentinels for field `id` (blank strings stay as they are:
/// a template may test them for emptiness).
fn wrapped(s: &str, id: usize) -> String {
    let core = s.trim();
    if core.is_empty() {
        return s.to_owned();
    }
    let lead = &s[..s.len() - s.trim_start().len()];
    let trail = &s[s.trim_end().len()..];
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(lead);
    out.push(OPEN);
    for digit in format!("{id:x}").chars() {
        let d = digit.to_digit(16).expect("a hex digit");
        out.push(char::from_u32(DIGIT0 + d).expect("a private-use character"));
    }
    out.push(ID_END);
    out.push_str(core);
    out.push(CLOSE);
    out.push_str(trail);
    out
}

/// One placed field: its id and its bytes in the plain render.
struct Span {
    field: usize,
    start: usize,
    end: usize,
}

/// The fields' spans, in plain-render bytes, from the sentinel render; the sentinel render with
/// its sentinels removed must be the plain render.
fn field_spans(sentinel_text: &str, plain: &str) -> Result<Vec<Span>, String> {
    let mut stripped = String::with_capacity(plain.len());
    let mut spans = Vec::new();
    let mut open: Vec<(usize, usize)> = Vec::new();
    let mut chars = sentinel_text.chars();
    while let Some(c) = chars.next() {
        match c {
            OPEN => {
                let mut id = 0usize;
                loop {
                    match chars.next() {
                        Some(ID_END) => break,
                        Some(d) if (DIGIT0..DIGIT0 + 16).contains(&(d as u32)) => {
                            id = id
                                .checked_mul(16)
                                .and_then(|i| i.checked_add((d as u32 - DIGIT0) as usize))
                                .ok_or("a field marker was garbled by the template")?;
                        }
                        _ => return Err("a field marker was cut by the template".into()),
                    }
                }
                open.push((id, stripped.len()));
            }
            CLOSE => {
                let (field, start) = open
                    .pop()
                    .ok_or("the template wrote the end of a field whose start it dropped")?;
                spans.push(Span {
                    field,
                    start,
                    end: stripped.len(),
                });
            }
            c if SENTINELS.contains(&c) => {
                return Err("a field marker was cut by the template".into());
            }
            c => stripped.push(c),
        }
    }
    if !open.is_empty() {
        return Err("the template wrote the start of a field and dropped its end".into());
    }
    if stripped != plain {
        let at = stripped
            .bytes()
            .zip(plain.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(stripped.len().min(plain.len()));
        return Err(format!(
            "with its messages' text marked, the template writes other text (from byte {at})"
        ));
    }
    Ok(spans)
}

/// Which single field the template cannot carry a marker through, for the error: each field is
/// tried alone (a few renders; only on the error path).
fn culprit(
    template: &ChatTemplate,
    conversation: &Conversation,
    special: &Map<String, Value>,
    plain: &str,
) -> String {
    let mut fields = Vec::new();
    let wrapped: Vec<Value> = conversation
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| wrap_message(i as u32, m, &mut fields))
        .collect();
    for (id, field) in fields.iter().enumerate().take(256) {
        let k = field.message as usize;
        let mut c = conversation.clone();
        c.messages[k] = keep_one_marker(&wrapped[k], id);
        let ok = super::render(template, &c, special)
            .ok()
            .and_then(|t| field_spans(&t, plain).ok())
            .is_some();
        if !ok {
            return format!(
                "the template changes message {} ({}): its `{}` (cardproof cannot tell which tokens are that message's; a template that slices, measures or re-encodes a message's text is not supported)",
                k + 1,
                conversation.messages[k]["role"].as_str().unwrap_or("?"),
                field.path
            );
        }
    }
    "no single field is to blame: the template writes other text when several are marked".into()
}

/// The field id a wrapped string carries.
fn marker_id(s: &str) -> Option<usize> {
    let after = s.split_once(OPEN)?.1;
    let digits = after.split_once(ID_END)?.0;
    digits.chars().try_fold(0usize, |id, d| {
        let d = (d as u32).checked_sub(DIGIT0).filter(|&d| d < 16)?;
        id.checked_mul(16)?.checked_add(d as usize)
    })
}

/// `message` with every field marker removed but field `keep`'s.
fn keep_one_marker(message: &Value, keep: usize) -> Value {
    match message {
        Value::String(s) if s.contains(OPEN) && marker_id(s) != Some(keep) => {
            Value::String(s.chars().filter(|c| !SENTINELS.contains(c)).collect())
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| keep_one_marker(i, keep)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, x)| (k.clone(), keep_one_marker(x, keep)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A ChatML template with Qwen3.5's XML tool calls (the shape of the real one, short).
    const CHATML: &str = r#"{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.reasoning_content %}<think>
{{ m.reasoning_content | trim }}
</think>

{% endif %}{{ m.content | trim if m.content is string else '' }}{% if m.tool_calls %}{% for c in m.tool_calls %}

<tool_call>
<function={{ c.function.name }}>
{% for k, v in c.function.arguments | items %}<parameter={{ k }}>
{{ v | tojson if v is mapping else v }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

    fn conversation(messages: Value) -> Conversation {
        Conversation {
            messages: messages.as_array().unwrap().clone(),
            tools: None,
            add_generation_prompt: true,
            kwargs: Map::new(),
        }
    }

    fn specials() -> TurnMarkers {
        TurnMarkers {
            stops: vec!["<|im_end|>".into()],
            specials: vec!["<|im_start|>".into()],
        }
    }

    /// The text of each range, with its message and segment.
    fn pieces(l: &Labelled) -> Vec<(Option<u32>, &'static str, &str)> {
        l.ranges
            .iter()
            .map(|r| (r.message, r.segment.as_str(), &l.text[r.start..r.end]))
            .collect()
    }

    #[test]
    fn fields_turns_and_tool_calls_are_labelled_from_the_render() {
        let t = ChatTemplate::new(CHATML, 0).unwrap();
        let c = conversation(json!([
            {"role": "user", "content": " Weather? "},
            {"role": "assistant", "reasoning_content": "Ask the tool.", "content": "Checking.",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]},
            {"role": "tool", "content": "3 °C"},
            {"role": "assistant", "content": "It is 3 °C."}
        ]));
        let l = label(&t, &c, &Map::new(), &specials()).unwrap();
        // trim_blocks takes the newline after `{% for %}`: one newline before <tool_call>.
        assert_eq!(
            pieces(&l),
            vec![
                (Some(0), "scaffolding", "<|im_start|>user\n"),
                (Some(0), "content", "Weather?"),
                (Some(0), "scaffolding", "<|im_end|>"),
                (Some(1), "scaffolding", "\n<|im_start|>assistant\n<think>\n"),
                (Some(1), "reasoning", "Ask the tool."),
                (Some(1), "scaffolding", "\n</think>\n\n"),
                (Some(1), "content", "Checking."),
                (
                    Some(1),
                    "tool_call",
                    "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
                ),
                (Some(1), "scaffolding", "<|im_end|>"),
                (Some(2), "scaffolding", "\n<|im_start|>tool\n"),
                (Some(2), "tool_result", "3 °C"),
                (Some(2), "scaffolding", "<|im_end|>"),
                (Some(3), "scaffolding", "\n<|im_start|>assistant\n"),
                (Some(3), "content", "It is 3 °C."),
                (Some(3), "scaffolding", "<|im_end|>"),
                (None, "scaffolding", "\n<|im_start|>assistant\n"),
            ]
        );
        assert_eq!(l.roles[2], Role::Tool);
        assert!(l.tool_calls_from_fields.is_empty());
    }

    #[test]
    fn a_template_that_slices_a_message_is_refused_naming_it() {
        let t = ChatTemplate::new(
            "{% for m in messages %}[{{ m.role }}]{{ m.content[:4] }}{% endfor %}",
            0,
        )
        .unwrap();
        let c = conversation(json!([
            {"role": "user", "content": "hello there"}
        ]));
        let e = label(&t, &c, &Map::new(), &specials()).unwrap_err();
        assert!(
            e.contains("message 1 (user)") && e.contains("`content`"),
            "{e}"
        );
    }

    #[test]
    fn sentinel_characters_in_the_conversation_are_refused() {
        let t = ChatTemplate::new(CHATML, 0).unwrap();
        let c = conversation(json!([{"role": "user", "content": "a\u{F0001}b"}]));
        assert!(
            label(&t, &c, &Map::new(), &specials())
                .unwrap_err()
                .contains("U+F0000")
        );
    }

    #[test]
    fn without_a_special_token_the_run_goes_to_the_later_message() {
        let t = ChatTemplate::new(
            "{% for m in messages %}### {{ m.role }}:\n{{ m.content }}\n\n{% endfor %}",
            0,
        )
        .unwrap();
        let c = conversation(json!([
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"}
        ]));
        let l = label(&t, &c, &Map::new(), &TurnMarkers::default()).unwrap();
        assert_eq!(
            pieces(&l),
            vec![
                (Some(0), "scaffolding", "### user:\n"),
                (Some(0), "content", "a"),
                (Some(1), "scaffolding", "\n\n### assistant:\n"),
                (Some(1), "content", "b"),
                (None, "scaffolding", "\n\n"),
            ]
        );
    }

    #[test]
    fn the_differing_window_is_the_inserted_text() {
        assert_eq!(differing_window("abXYcd", "abcd"), (2, 4));
        assert_eq!(differing_window("abcd", "abcd"), (4, 4));
        // Repeated characters: the window is one of the minimal ones.
        let (s, e) = differing_window("aaXaa", "aaaa");
        assert_eq!(e - s, 1);
        // Never inside a character.
        let (s, e) = differing_window("aé", "aè");
        assert_eq!((s, e), (1, 3));
    }
}
