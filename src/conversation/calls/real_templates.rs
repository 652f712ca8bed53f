//! The real templates of `tests/fixtures/chat_templates`: which family each writes, and the
//! oracle that a call a template renders parses back to the call it was given.
//!
//! The oracle renders a conversation up to a user message with the generation prompt, and again
//! with the assistant's tool-call message after it; what the second render adds past the two
//! renders' common prefix is the assistant's turn as the model would have generated it.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::*;
use crate::conversation::file::Conversation;
use crate::conversation::template::ChatTemplate;

use CallFormat::*;

/// Every template of the corpus and the family [`format_of`] must find in it, read from what
/// each template writes for an assistant's `tool_calls`.
const EXPECTED: &[(&str, Option<CallFormat>)] = &[
    ("Apertus-8B-Instruct", None),
    ("Apriel-1.6-15b-Thinker-fixed", None),
    ("Bielik-11B-v3.0-Instruct", Some(Hermes)),
    ("ByteDance-Seed-OSS", None),
    ("Cohere2MoE", None),
    ("CohereForAI-c4ai-command-r-plus-tool_use", None),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", None),
    ("GLM-4.6", Some(Glm)),
    ("GLM-4.7-Flash", Some(Glm)),
    ("GigaChat3-10B-A1.8B", None),
    ("GigaChat3.1-10B-A1.8B", None),
    ("HuggingFaceTB-SmolLM3-3B", None),
    ("Kimi-K2-Instruct", Some(Kimi)),
    ("Kimi-K2-Thinking", Some(Kimi)),
    ("Kimi-K3", None),
    ("LFM2-8B-A1B", None),
    ("LFM2.5-8B-A1B", None),
    ("LFM2.5-Instruct", None),
    ("MiMo-VL", Some(Hermes)),
    ("MiniMax-M1", None),
    ("MiniMax-M2", None),
    ("MiniMax-M3", None),
    ("Mistral-Small-3.2-24B-Instruct-2506", Some(Mistral)),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", Some(Qwen3Coder)),
    ("NVIDIA-Nemotron-Nano-v2", None),
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        Some(Hermes),
    ),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", Some(Hermes)),
    ("Qwen-QwQ-32B", Some(Hermes)),
    ("Qwen-Qwen2.5-7B-Instruct", Some(Hermes)),
    ("Qwen-Qwen3-0.6B", Some(Hermes)),
    ("Qwen3-Coder", Some(Qwen3Coder)),
    ("Qwen3.5-4B", Some(Qwen3Coder)),
    ("Reka-Edge", Some(Hermes)),
    ("Spark2.5", Some(Glm)),
    ("StepFun3.5-Flash", Some(Qwen3Coder)),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", Some(DeepSeek)),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", Some(DeepSeek)),
    ("deepseek-ai-DeepSeek-V3.1", Some(DeepSeek)),
    ("deepseek-ai-DeepSeek-V3.2", None),
    ("deepseek-ai-DeepSeek-V4-Flash-0731", None),
    ("deepseek-ai-DeepSeek-V4", None),
    ("fireworks-ai-llama-3-firefunction-v2", None),
    ("google-gemma-2-2b-it", None),
    ("google-gemma-4-31B-it-interleaved", None),
    ("google-gemma-4-31B-it", None),
    ("ibm-granite-granite-3.3-2B-Instruct", None),
    ("ibm-granite-granite-4.0", Some(Hermes)),
    ("ibm-granite-granite-4.1", Some(Hermes)),
    ("inclusionai-ling-3.0-flash", Some(Glm)),
    ("llama-cpp-deepseek-r1", Some(DeepSeek)),
    ("llama-cpp-rwkv-world", None),
    ("meetkai-functionary-medium-v3.1", None),
    ("meetkai-functionary-medium-v3.2", None),
    ("meta-llama-Llama-3.1-8B-Instruct", Some(Llama3Json)),
    ("meta-llama-Llama-3.2-3B-Instruct", Some(Llama3Json)),
    ("meta-llama-Llama-3.3-70B-Instruct", Some(Llama3Json)),
    ("microsoft-Phi-3.5-mini-instruct", None),
    ("mistralai-Ministral-3-14B-Reasoning-2512", Some(Mistral)),
    ("mistralai-Mistral-Nemo-Instruct-2407", Some(Mistral)),
    ("moonshotai-Kimi-K2", Some(Kimi)),
    ("muse-glimmer", None),
    ("openai-gpt-oss-120b", None),
    ("openbmb-MiniCPM5-1B", None),
    ("poolside-Laguna-S-2.1", Some(Glm)),
    ("poolside-Laguna-XS-2.1", Some(Glm)),
    ("poolside-Laguna-XS.2", Some(Glm)),
    ("tencent-Hy3", None),
    ("unsloth-Apriel-1.5", None),
    ("unsloth-mistral-Devstral-Small-2507", Some(Mistral)),
    ("upstage-Solar-Open-100B", None),
];

fn templates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/templates")
}

fn source(name: &str) -> String {
    std::fs::read_to_string(templates().join(format!("{name}.jinja"))).unwrap()
}

#[test]
fn every_corpus_template_maps_to_the_family_it_writes() {
    let mut on_disk: Vec<String> = std::fs::read_dir(templates())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter_map(|f| f.strip_suffix(".jinja").map(str::to_owned))
        .collect();
    on_disk.sort();
    let mut listed: Vec<&str> = EXPECTED.iter().map(|(name, _)| *name).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "the table lists every corpus template");
    let wrong: Vec<String> = EXPECTED
        .iter()
        .filter(|(name, want)| format_of(&source(name)) != *want)
        .map(|(name, want)| {
            format!(
                "{name}: want {want:?}, found {:?}",
                format_of(&source(name))
            )
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The tools the oracle's calls use: a string, an enum, an integer, a number, a boolean, a list
/// and a nested object with a null.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            }, "required": ["city"]}}},
        {"type": "function", "function": {"name": "search_files", "description": "Search files.",
            "parameters": {"type": "object", "properties": {
                "pattern": {"type": "string"},
                "max_results": {"type": "integer"},
                "threshold": {"type": "number"}
            }, "required": ["pattern"]}}},
        {"type": "function", "function": {"name": "create_event", "description": "Add an event.",
            "parameters": {"type": "object", "properties": {
                "title": {"type": "string"},
                "attendees": {"type": "array", "items": {"type": "string"}},
                "duration_minutes": {"type": "integer"},
                "all_day": {"type": "boolean"},
                "options": {"type": "object"}
            }, "required": ["title"]}}}
    ])
}

/// One case of the oracle: the assistant's calls (name, arguments) and its reasoning.
struct Case {
    name: &'static str,
    calls: Vec<(&'static str, Value)>,
    reasoning: Option<&'static str>,
}

/// Reasoning that writes calls in every family's syntax: the templates that render reasoning
/// put it in `<think>` or `[THINK]`, where no call counts.
const DECOY_REASONING: &str = "Not <tool_call>\n{\"name\": \"decoy\", \"arguments\": {}}\n</tool_call>, \
    nor [TOOL_CALLS]decoy[ARGS]{}, nor <｜tool▁call▁begin｜>decoy<｜tool▁sep｜>{}<｜tool▁call▁end｜>, \
    nor <|tool_call_begin|>functions.decoy:0<|tool_call_argument_begin|>{}<|tool_call_end|>: \
    get_weather.";

fn cases() -> Vec<Case> {
    let case = |name, calls, reasoning| Case {
        name,
        calls,
        reasoning,
    };
    vec![
        case(
            "one call",
            vec![("get_weather", json!({"city": "Zürich", "unit": "celsius"}))],
            None,
        ),
        case(
            "two calls",
            vec![
                ("get_weather", json!({"city": "Paris"})),
                (
                    "search_files",
                    json!({"pattern": "TODO|FIXME", "max_results": 5, "threshold": 0.5}),
                ),
            ],
            None,
        ),
        case(
            "typed and escaped values",
            vec![(
                "create_event",
                json!({
                    "title": "Café ☕ \"quoted\" <b> & 会議\\n",
                    "attendees": ["ana@example.com", "bo@example.com"],
                    "duration_minutes": 45,
                    "all_day": false,
                    "options": {"remind": [5, 10], "note": null}
                }),
            )],
            None,
        ),
        case(
            STRING_ARGUMENTS,
            vec![("get_weather", json!("{\"city\": \"Zürich\"}"))],
            None,
        ),
        case(
            "decoys in the reasoning",
            vec![("get_weather", json!({"city": "Zürich"}))],
            Some(DECOY_REASONING),
        ),
    ]
}

/// The conversation: a user's question, then (`with_calls`) the assistant's calls, with
/// content `content` (`None`: no content key), declaring the tools or not.
fn conversation(
    case: &Case,
    variant: Variant,
    with_calls: bool,
    generation_prompt: bool,
) -> Conversation {
    let mut messages = vec![json!({"role": "user", "content": "Weather in Zürich? And TODOs?"})];
    if with_calls {
        let tool_calls: Vec<Value> = case
            .calls
            .iter()
            .enumerate()
            .map(|(i, (name, arguments))| {
                json!({"id": format!("call0000{i}"), "type": "function",
                       "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        let mut assistant = json!({"role": "assistant", "tool_calls": tool_calls});
        if let Some(content) = variant.content {
            assistant["content"] = json!(content);
        }
        if let Some(reasoning) = case.reasoning {
            assistant["reasoning_content"] = json!(reasoning);
        }
        messages.push(assistant);
    }
    Conversation {
        messages,
        tools: variant.tools.then(tools),
        add_generation_prompt: generation_prompt,
        kwargs: Map::new(),
    }
}

/// How the assistant's message and the conversation are written: templates differ in what they
/// accept (an empty content or none; llama.cpp's R1 template cannot render `tools` at all).
#[derive(Debug, Clone, Copy)]
struct Variant {
    content: Option<&'static str>,
    tools: bool,
}

const VARIANTS: [Variant; 4] = [
    Variant {
        content: Some(""),
        tools: true,
    },
    Variant {
        content: None,
        tools: true,
    },
    Variant {
        content: Some(""),
        tools: false,
    },
    Variant {
        content: None,
        tools: false,
    },
];

/// What one case gave with one template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    RoundTrips,
    /// The template refuses the conversation in every variant (its own rule).
    NotRendered,
    /// Rendered, and the turn parsed to something else in a variant.
    Differs,
}

/// The case rendered and parsed back in every variant, with the turn (or what went wrong).
fn run_case(template: &str, format: CallFormat, case: &Case) -> (Outcome, String) {
    let template = ChatTemplate::named(&source(template), 0, template).unwrap();
    let compiled = template.compiled().unwrap();
    let special: Map<String, Value> =
        serde_json::from_value(json!({"bos_token": "<s>", "eos_token": "</s>"})).unwrap();
    let tools = Tools::from_declarations(&tools()).unwrap();
    let want: Vec<Call> = case
        .calls
        .iter()
        .map(|(name, arguments)| Call {
            name: (*name).to_owned(),
            arguments: arguments.clone(),
            text_values: false,
        })
        .collect();
    // Every variant the template renders must round-trip.
    let (mut round_trips, mut refusal) = (None, String::new());
    for variant in VARIANTS {
        let render = |with_calls, prompt| {
            let c = conversation(case, variant, with_calls, prompt);
            crate::conversation::render(&compiled, &c, &special)
        };
        let (prompt, history, full) = match (
            render(false, true),
            render(false, false),
            render(true, false),
        ) {
            (Ok(prompt), Ok(history), Ok(full)) => (prompt, history, full),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                refusal = e;
                continue;
            }
        };
        let turn = assistant_turn(&prompt, &history, &full);
        let parsed = parse(format, turn);
        let got: Option<Vec<Call>> = parsed
            .parsed()
            .map(|calls| calls.into_iter().map(|c| tools.typed(c)).collect());
        if !got.is_some_and(|got| same_calls(&got, &want)) {
            let detail = format!("{variant:?}: {turn:?} parsed as {parsed:?}");
            return (Outcome::Differs, detail);
        }
        round_trips.get_or_insert_with(|| turn.to_owned());
    }
    match round_trips {
        Some(turn) => (Outcome::RoundTrips, turn),
        None => (Outcome::NotRendered, refusal),
    }
}

/// The assistant's turn: what the render with its message adds after the generation prompt, or,
/// where the prompt writes what the history does not (`<think>\n`), after the history without
/// the prompt (the role header then comes with the turn).
fn assistant_turn<'a>(prompt: &str, history: &str, full: &'a str) -> &'a str {
    if let Some(turn) = full.strip_prefix(prompt) {
        return turn;
    }
    let mut n = history
        .bytes()
        .zip(full.bytes())
        .take_while(|(x, y)| x == y)
        .count();
    while !full.is_char_boundary(n) {
        n -= 1;
    }
    &full[n..]
}

/// Every (template, case) that does not round-trip, and how; everything else does.
///
/// - The text-valued families' templates iterate the arguments (`arguments|items`), so they
///   refuse OpenAI's string arguments, as transformers does: "arguments as a JSON string".
/// - Llama 3.x's templates write one call a turn and raise on two.
/// - Kimi K2 Instruct's and Thinking's templates call `list.append`, which jinja2's sandbox (and
///   so transformers) refuses: they render no call at all. Their format is moonshotai-Kimi-K2's,
///   which round-trips.
/// - DeepSeek-R1-Distill-Llama-8B's template writes calls only for a message whose `content`
///   is none, and transformers drops a null `content` (the template then sees it undefined,
///   which is not none): the call is never written, only an empty assistant turn.
const NOT_ROUND_TRIPPED: &[(&str, &str, Outcome)] = &[
    ("GLM-4.6", STRING_ARGUMENTS, Outcome::NotRendered),
    ("GLM-4.7-Flash", STRING_ARGUMENTS, Outcome::NotRendered),
    (
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        STRING_ARGUMENTS,
        Outcome::NotRendered,
    ),
    ("Qwen3-Coder", STRING_ARGUMENTS, Outcome::NotRendered),
    ("Qwen3.5-4B", STRING_ARGUMENTS, Outcome::NotRendered),
    ("Spark2.5", STRING_ARGUMENTS, Outcome::NotRendered),
    ("StepFun3.5-Flash", STRING_ARGUMENTS, Outcome::NotRendered),
    (
        "inclusionai-ling-3.0-flash",
        STRING_ARGUMENTS,
        Outcome::NotRendered,
    ),
    (
        "meta-llama-Llama-3.1-8B-Instruct",
        "two calls",
        Outcome::NotRendered,
    ),
    (
        "meta-llama-Llama-3.2-3B-Instruct",
        "two calls",
        Outcome::NotRendered,
    ),
    (
        "meta-llama-Llama-3.3-70B-Instruct",
        "two calls",
        Outcome::NotRendered,
    ),
    (
        "poolside-Laguna-S-2.1",
        STRING_ARGUMENTS,
        Outcome::NotRendered,
    ),
    (
        "poolside-Laguna-XS-2.1",
        STRING_ARGUMENTS,
        Outcome::NotRendered,
    ),
    (
        "poolside-Laguna-XS.2",
        STRING_ARGUMENTS,
        Outcome::NotRendered,
    ),
];

/// Templates that write no call for any case (see [`NOT_ROUND_TRIPPED`]).
const NO_CALL_RENDERED: &[(&str, Outcome)] = &[
    ("Kimi-K2-Instruct", Outcome::NotRendered),
    ("Kimi-K2-Thinking", Outcome::NotRendered),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B", Outcome::Differs),
];

const STRING_ARGUMENTS: &str = "arguments as a JSON string";

/// The oracle: every case with every template of a family cardproof parses (rendered as
/// transformers renders it) parses back to the calls given, but for [`NOT_ROUND_TRIPPED`].
#[test]
fn calls_the_real_templates_render_parse_back_to_the_calls_given() {
    let mut unexpected = Vec::new();
    let (mut round_trips, mut decoys_rendered) = (0, Vec::new());
    for (name, format) in EXPECTED {
        let Some(format) = format else { continue };
        for case in cases() {
            let (outcome, detail) = run_case(name, *format, &case);
            let case = case.name;
            let known = NOT_ROUND_TRIPPED
                .iter()
                .find(|(t, c, _)| t == name && *c == case)
                .map(|(_, _, o)| *o)
                .or_else(|| {
                    NO_CALL_RENDERED
                        .iter()
                        .find(|(t, _)| t == name)
                        .map(|(_, o)| *o)
                });
            match (outcome, known) {
                (Outcome::RoundTrips, None) => {
                    round_trips += 1;
                    if detail.contains("decoy") {
                        decoys_rendered.push(*name);
                    }
                }
                (outcome, known) if Some(outcome) == known => {}
                (outcome, known) => unexpected.push(format!(
                    "{name} / {case}: {outcome:?} (listed: {known:?}) {detail}"
                )),
            }
        }
    }
    assert!(unexpected.is_empty(), "{unexpected:#?}");
    // 35 templates × 5 cases, less the listed.
    let dead = NO_CALL_RENDERED.len() * cases().len();
    assert_eq!(
        round_trips,
        35 * cases().len() - NOT_ROUND_TRIPPED.len() - dead
    );
    // The decoys were in the turns of the templates that render reasoning, and ignored there.
    assert_eq!(
        decoys_rendered,
        [
            "Bielik-11B-v3.0-Instruct",
            "GLM-4.6",
            "GLM-4.7-Flash",
            "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
            "Qwen-Qwen3-0.6B",
            "Qwen3.5-4B",
            "Spark2.5",
            "StepFun3.5-Flash",
            "inclusionai-ling-3.0-flash",
            "poolside-Laguna-S-2.1",
            "poolside-Laguna-XS-2.1",
            "poolside-Laguna-XS.2",
        ]
    );
}
