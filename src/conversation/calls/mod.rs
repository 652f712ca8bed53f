//! Tool calls in a generated assistant turn: whether it calls tools, which calls, whether each is
//! valid against the conversation's `tools`, and whether a reference's and a candidate's turns
//! make the same calls. A call whose markup opens but does not parse is an outcome
//! ([`ParsedCall::Malformed`]), never an error: a quantized model that breaks the syntax has
//! made a worse call, not stopped the run.
//!
//! The families as their chat templates write a call (what the model learnt to generate; `⏎` is
//! a newline), and the real templates of `tests/fixtures/chat_templates` that write each:
//!
//! - Hermes ([`CallFormat::Hermes`]), one block a call:
//!   `<tool_call>⏎{"name": N, "arguments": {…}}⏎</tool_call>`. Qwen2.5, QwQ, Qwen3 (0.6B),
//!   Hermes 2 Pro and 3, MiMo-VL, Bielik 11B v3, Granite 4.0 and 4.1, Reka Edge.
//! - Qwen3-Coder ([`CallFormat::Qwen3Coder`]), each value bare text:
//!   `<tool_call>⏎<function=N>⏎<parameter=K>⏎V⏎</parameter>⏎</function>⏎</tool_call>`.
//!   Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, Step 3.5 Flash.
//! - GLM ([`CallFormat::Glm`]), each value bare text, newlines between the parts or none:
//!   `<tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`. GLM-4.6,
//!   GLM-4.7-Flash, Spark 2.5, Ling 3.0 Flash, Laguna S 2.1, XS 2.1 and XS.2.
//! - Llama 3 ([`CallFormat::Llama3Json`]): the turn is `{"name": N, "parameters": {…}}` (or
//!   `"arguments"`), after `<|python_tag|>` or not, several separated by `;`. Llama 3.1, 3.2
//!   and 3.3 Instruct, whose templates write one call a turn. A built-in tool's
//!   `<|python_tag|>brave_search.call(query=…)` is not parsed: it is malformed here.
//! - Mistral ([`CallFormat::Mistral`]): `[TOOL_CALLS][{"name": N, "arguments": {…}}, …]`
//!   (Mistral Nemo), or `[TOOL_CALLS]N[ARGS]{…}` a call with an optional `[CALL_ID]id` before
//!   `[ARGS]` (Mistral Small 3.2, Devstral Small 2507, Ministral 3 Reasoning).
//! - DeepSeek ([`CallFormat::DeepSeek`]), inside `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`:
//!   `<｜tool▁call▁begin｜>function<｜tool▁sep｜>N⏎```json⏎{…}⏎```<｜tool▁call▁end｜>` (R1's
//!   distills, llama.cpp's R1 template) or V3.1's
//!   `<｜tool▁call▁begin｜>N<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`.
//! - Kimi ([`CallFormat::Kimi`]):
//!   `<|tool_call_begin|>functions.N:0<|tool_call_argument_begin|>{…}<|tool_call_end|>`.
//!   Kimi K2 (its first template; Instruct's and Thinking's call `list.append`, which
//!   transformers' sandbox refuses, so they render no call).
//!
//! The other templates of the corpus write no call cardproof parses ([`format_of`] is `None`):
//! gpt-oss's channels, Command R's, GigaChat's, Functionary's, Firefunction's, Granite 3.3's
//! `<|tool_call|>`, Apriel's and MiniMax M1's `<tool_calls>[…]`, MiniMax M2/M3's `<invoke>`,
//! Seed-OSS's `<seed:tool_call>`, DeepSeek V3.2/V4's and Gemma 4's own, and those that write none.
//!
//! Reasoning is stripped first (everything up to the first `</think>` or `[/THINK]`; a turn
//! whose reasoning never closes has nothing after it), and text outside calls is ignored. A call
//! ends at its closing marker even inside a JSON string, as the serving stacks' parsers read it.
//! The work is bounded: a turn is read up to [`MAX_TURN_BYTES`], at most [`MAX_CALLS`] calls are
//! parsed, and JSON nests no deeper than serde_json's recursion limit.

mod json_forms;
mod validation;
mod xml_forms;

#[cfg(test)]
mod real_templates;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use validation::{CallCheck, MAX_TOOLS, Tools, check};

/// The most bytes of a turn read: a greedy generation that long is runaway, and what lies past
/// the bound is not parsed (a call it cuts is unterminated, so malformed).
pub const MAX_TURN_BYTES: usize = 1 << 20;

/// The most calls parsed from one turn; a turn with more gets one more, malformed, entry saying
/// so, and the rest is not read.
pub const MAX_CALLS: usize = 64;

/// The most bytes of a malformed call's text kept: enough to show what went wrong.
pub const MAX_RAW_BYTES: usize = 4 << 10;

/// How a family of chat templates writes an assistant's tool calls (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallFormat {
    Hermes,
    Qwen3Coder,
    Glm,
    Llama3Json,
    Mistral,
    #[serde(rename = "deepseek")]
    DeepSeek,
    Kimi,
}

impl CallFormat {
    pub const ALL: [CallFormat; 7] = [
        CallFormat::Hermes,
        CallFormat::Qwen3Coder,
        CallFormat::Glm,
        CallFormat::Llama3Json,
        CallFormat::Mistral,
        CallFormat::DeepSeek,
        CallFormat::Kimi,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CallFormat::Hermes => "hermes",
            CallFormat::Qwen3Coder => "qwen3_coder",
            CallFormat::Glm => "glm",
            CallFormat::Llama3Json => "llama3_json",
            CallFormat::Mistral => "mistral",
            CallFormat::DeepSeek => "deepseek",
            CallFormat::Kimi => "kimi",
        }
    }

    /// Whether the format writes argument values as bare text rather than JSON, so a value's
    /// type is known only from the tool's schema ([`Tools::typed`]).
    pub fn text_values(self) -> bool {
        matches!(self, CallFormat::Qwen3Coder | CallFormat::Glm)
    }
}

/// One tool call as the model wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Call {
    pub name: String,
    /// As written: an object, or (OpenAI style) a string holding one, which [`check`] and
    /// [`same_call`] decode.
    pub arguments: Value,
    /// The format wrote every argument as bare text ([`CallFormat::text_values`]): `arguments`
    /// holds strings, which [`Tools::typed`] reads by the tool's schema (`"2"` is `2` where the
    /// parameter is an integer).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub text_values: bool,
}

/// A call the turn's markup opens: parsed, or not (bad JSON, never closed, no name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "parsed", rename_all = "snake_case")]
pub enum ParsedCall {
    Ok(Call),
    Malformed {
        /// The call's text from its opening marker, at most [`MAX_RAW_BYTES`].
        raw: String,
        reason: String,
    },
}

/// What one assistant turn does with tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "turn", content = "calls", rename_all = "snake_case")]
pub enum TurnCalls {
    NoCall,
    /// Never empty.
    Calls(Vec<ParsedCall>),
}

impl TurnCalls {
    /// Every call the turn opens, in order (none for [`TurnCalls::NoCall`]).
    pub fn calls(&self) -> &[ParsedCall] {
        match self {
            TurnCalls::NoCall => &[],
            TurnCalls::Calls(calls) => calls,
        }
    }

    /// The calls, when every one parsed: what [`same_calls`] compares.
    pub fn parsed(&self) -> Option<Vec<&Call>> {
        self.calls()
            .iter()
            .map(|c| match c {
                ParsedCall::Ok(call) => Some(call),
                ParsedCall::Malformed { .. } => None,
            })
            .collect()
    }
}

/// The call family a chat template writes, from the markers in its source; `None` when it
/// writes none cardproof parses. The source decides, not a render: a template that writes
/// calls only for some conversations still names its family.
pub fn format_of(template: &str) -> Option<CallFormat> {
    let writes = |marker: &str| template.contains(marker);
    if writes("<｜tool▁call▁begin｜>") && writes("<｜tool▁sep｜>") {
        return Some(CallFormat::DeepSeek);
    }
    if writes("<|tool_call_begin|>") && writes("<|tool_call_argument_begin|>") {
        return Some(CallFormat::Kimi);
    }
    if writes("[TOOL_CALLS]") {
        return Some(CallFormat::Mistral);
    }
    // `<tool_calls>[…]` (Apriel, MiniMax M1) is a list format of its own, though Apriel's
    // prompt also names `<tool_call>`.
    if writes("<tool_call>") && !writes("<tool_calls>") {
        if writes("<function=") && writes("<parameter=") {
            return Some(CallFormat::Qwen3Coder);
        }
        if writes("<arg_key>") && writes("<arg_value>") {
            return Some(CallFormat::Glm);
        }
        // The call's JSON written as template text: `{"name": "` or, inside a
        // double-quoted Jinja string, `{\"name\": \"`.
        if writes(r#""name": ""#) || writes(r#"\"name\": \""#) {
            return Some(CallFormat::Hermes);
        }
        return None;
    }
    // Llama 3.x writes `{{- '{"name": "' + … }}` and `{{- '"parameters": ' }}` as Jinja
    // literals; Command R's `"parameters": ` is template text after `"tool_name"`.
    if writes(r#"'{"name": "'"#) && writes(r#"'"parameters": '"#) {
        return Some(CallFormat::Llama3Json);
    }
    None
}

/// The calls of one generated assistant turn written in `format`.
pub fn parse(format: CallFormat, text: &str) -> TurnCalls {
    let text = after_reasoning(bounded(text));
    let mut sink = Sink::default();
    match format {
        CallFormat::Hermes => json_forms::hermes(text, &mut sink),
        CallFormat::Llama3Json => json_forms::llama(text, &mut sink),
        CallFormat::Mistral => json_forms::mistral(text, &mut sink),
        CallFormat::DeepSeek => json_forms::deepseek(text, &mut sink),
        CallFormat::Kimi => json_forms::kimi(text, &mut sink),
        CallFormat::Qwen3Coder => xml_forms::qwen3_coder(text, &mut sink),
        CallFormat::Glm => xml_forms::glm(text, &mut sink),
    }
    match sink.calls.is_empty() {
        true => TurnCalls::NoCall,
        false => TurnCalls::Calls(sink.calls),
    }
}

/// Whether two calls are the same: the same name, and arguments equal as RFC 8785 canonical
/// JSON ([`crate::digest::canonical_json`]): object key order is ignored and numbers compare by
/// value as ECMAScript prints them, so `1` and `1.0` are the same argument (JSON has one number
/// type; a model writing `5.0` where the reference wrote `5` passed the tool the same value).
/// Arguments given as a string holding JSON are decoded first. Text-valued calls
/// ([`Call::text_values`]) compare as the text the model wrote; to compare one with a JSON
/// call, type it first ([`Tools::typed`]).
pub fn same_call(a: &Call, b: &Call) -> bool {
    a.name == b.name
        && crate::digest::canonical_json(&decoded_arguments(&a.arguments))
            == crate::digest::canonical_json(&decoded_arguments(&b.arguments))
}

/// Whether two turns make the same calls in the same order.
pub fn same_calls(a: &[Call], b: &[Call]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_call(a, b))
}

/// Arguments given as a string holding JSON (OpenAI's wire form) as that JSON; anything else
/// as it is.
fn decoded_arguments(arguments: &Value) -> std::borrow::Cow<'_, Value> {
    match arguments {
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v) => std::borrow::Cow::Owned(v),
            Err(_) => std::borrow::Cow::Borrowed(arguments),
        },
        _ => std::borrow::Cow::Borrowed(arguments),
    }
}

/// The calls parsed so far, never more than [`MAX_CALLS`] and the one entry past it.
#[derive(Default)]
struct Sink {
    calls: Vec<ParsedCall>,
}

impl Sink {
    /// Adds a call found at the start of `rest`; `false` (the family stops scanning) once the
    /// bound is reached, with the entry that says so in place of the call.
    fn push(&mut self, call: ParsedCall, rest: &str) -> bool {
        if self.calls.len() >= MAX_CALLS {
            self.calls.push(malformed(
                rest,
                format!(
                    "the turn opens more than {MAX_CALLS} calls, cardproof's bound; the rest is not parsed"
                ),
            ));
            return false;
        }
        self.calls.push(call);
        true
    }

    /// [`Sink::push`] of a parse result: a reason becomes a malformed call with `raw`.
    fn push_parsed(&mut self, parsed: Result<Call, String>, raw: &str) -> bool {
        let call = match parsed {
            Ok(call) => ParsedCall::Ok(call),
            Err(reason) => malformed(raw, reason),
        };
        self.push(call, raw)
    }
}

fn malformed(raw: &str, reason: String) -> ParsedCall {
    ParsedCall::Malformed {
        raw: prefix(raw, MAX_RAW_BYTES).to_owned(),
        reason,
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn bounded(text: &str) -> &str {
    prefix(text, MAX_TURN_BYTES)
}

/// Reasoning markers: an opener and its closer. A reasoning model's generation prompt often
/// opens the block itself, so the closer alone ends it.
const REASONING: [(&str, &str); 2] = [("<think>", "</think>"), ("[THINK]", "[/THINK]")];

/// The turn after its reasoning: past the first closer, or, where none closes, up to the first
/// opener (a generation that never closed its reasoning made no call after it).
fn after_reasoning(text: &str) -> &str {
    let closed = REASONING
        .iter()
        .filter_map(|(_, close)| text.find(close).map(|at| at + close.len()))
        .min();
    if let Some(end) = closed {
        return &text[end..];
    }
    let opened = REASONING
        .iter()
        .filter_map(|(open, _)| text.find(open))
        .min();
    match opened {
        Some(start) => &text[..start],
        None => text,
    }
}

/// A function name written as bare text between markers: trimmed, and neither empty nor holding
/// whitespace, control characters or markup (which mean the markup around it is broken).
fn bare_name(text: &str) -> Result<String, String> {
    const MAX_NAME_BYTES: usize = 256;
    let name = text.trim();
    if name.is_empty() {
        return Err("the call names no function".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "the function name is {} bytes, over cardproof's bound of {MAX_NAME_BYTES}",
            name.len()
        ));
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | '[' | ']'))
    {
        return Err(format!(
            "the function name {:?} holds whitespace, a control character or markup",
            name
        ));
    }
    Ok(name.to_owned())
}

/// Each `open … close` block of `text` in order, with the text from `open` on; a block never
/// closed runs to the end of the text and ends the scan.
struct Blocks<'a> {
    text: &'a str,
    at: usize,
    open: &'static str,
    close: &'static str,
}

/// One block of [`Blocks`].
struct Block<'a> {
    /// From the opening marker to past the closing one (or to the end of the text).
    raw: &'a str,
    /// Between the markers; `None` when the block is never closed.
    inner: Option<&'a str>,
}

fn blocks<'a>(text: &'a str, open: &'static str, close: &'static str) -> Blocks<'a> {
    Blocks {
        text,
        at: 0,
        open,
        close,
    }
}

impl<'a> Iterator for Blocks<'a> {
    type Item = Block<'a>;

    fn next(&mut self) -> Option<Block<'a>> {
        let rest = &self.text[self.at..];
        let start = rest.find(self.open)?;
        let body = &rest[start + self.open.len()..];
        match body.find(self.close) {
            Some(end) => {
                let stop = start + self.open.len() + end + self.close.len();
                self.at += stop;
                Some(Block {
                    raw: &rest[start..stop],
                    inner: Some(&body[..end]),
                })
            }
            None => {
                self.at = self.text.len();
                Some(Block {
                    raw: &rest[start..],
                    inner: None,
                })
            }
        }
    }
}

/// Each block of `text` parsed by `call`, a never-closed one malformed, into `sink`.
fn each_block(
    text: &str,
    open: &'static str,
    close: &'static str,
    sink: &mut Sink,
    call: impl Fn(&str) -> Result<Call, String>,
) {
    for block in blocks(text, open, close) {
        let parsed = match block.inner {
            Some(inner) => call(inner),
            None => Err(format!("`{open}` is never closed by `{close}`")),
        };
        if !sink.push_parsed(parsed, block.raw) {
            return;
        }
    }
}
