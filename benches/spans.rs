//! Labelling and tokenizing a long agent conversation (src/conversation/spans.rs, issue #41 item
//! 8): a conversation of N tool calls (each an assistant turn that calls a tool, and the tool's
//! result), rendered with the example models' chat template (examples/data/chat_template.jinja),
//! labelled and tokenized with the example tokenizer, as `measure` does. The time per tool call at
//! 20,000 against 2,000 shows whether the cost is linear in the calls.
//!
//! `cargo bench --bench spans [-- N ...]` (default 2000 4000 20000); `-- --write DIR N` writes the
//! conversation file and the template to DIR instead, for `cardproof measure --eval-text`.

#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::time::Instant;

use cardproof::conversation::eval::{TokenizerContext, label_tokens};
use cardproof::conversation::file::Conversation;
use cardproof::conversation::spans;
use cardproof::conversation::template::ChatTemplate;
use serde_json::{Map, Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An agent conversation: a system prompt, a request, `calls` rounds of (assistant reasoning and
/// one tool call, the tool's result), and the answer.
fn conversation(calls: usize) -> Conversation {
    let mut messages = vec![
        json!({"role": "system", "content": "You are the stage manager's assistant. Use the tools to look up the text; quote it exactly."}),
        json!({"role": "user", "content": "Find every line where Juliet speaks of names, and read the passage around each."}),
    ];
    for i in 0..calls {
        messages.push(json!({
            "role": "assistant",
            "reasoning_content": format!("Hit {i} needs its passage; read forty lines from it."),
            "content": null,
            "tool_calls": [{"id": format!("call_{i}"), "type": "function", "function": {
                "name": "get_passage",
                "arguments": {"start_line": 16_897 + i, "n_lines": 40, "play": "Romeo and Juliet"}
            }}]
        }));
        messages.push(json!({
            "role": "tool",
            "tool_call_id": format!("call_{i}"),
            "content": format!("JULIET:\nWhat's in a name? That which we call a rose ({i})\nBy any other name would smell as sweet;")
        }));
    }
    messages.push(json!({"role": "assistant", "content": "Those are all of her lines on names."}));
    let mut kwargs = Map::new();
    kwargs.insert("enable_thinking".into(), Value::Bool(true));
    Conversation {
        messages,
        tools: Some(
            json!([{"type": "function", "function": {"name": "get_passage", "description": "Lines of a play from a line number.", "parameters": {"type": "object", "properties": {"start_line": {"type": "integer"}, "n_lines": {"type": "integer"}, "play": {"type": "string"}}}}}]),
        ),
        add_generation_prompt: false,
        kwargs,
    }
}

/// The conversation file and the template beside it, for `measure`.
fn write(dir: &Path, calls: usize) {
    let c = conversation(calls);
    let doc = json!({"messages": c.messages, "tools": c.tools, "kwargs": c.kwargs});
    std::fs::create_dir_all(dir).expect("the directory");
    let file = dir.join(format!("conversation-{calls}.json"));
    std::fs::write(&file, serde_json::to_vec(&doc).expect("JSON")).expect("written");
    std::fs::copy(
        root().join("examples/data/chat_template.jinja"),
        dir.join("chat_template.jinja"),
    )
    .expect("copied");
    println!("{}", file.display());
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().is_some_and(|a| a == "--write") {
        let dir = PathBuf::from(&args[1]);
        for n in &args[2..] {
            write(&dir, n.parse().expect("a number of tool calls"));
        }
        return;
    }
    let sizes: Vec<usize> = if args.is_empty() {
        vec![2_000, 4_000, 20_000]
    } else {
        args.iter()
            .map(|a| a.parse().expect("a number of tool calls"))
            .collect()
    };
    let model = root().join("examples/models/shakespeare-bf16");
    let tokenizer =
        tokenizers::Tokenizer::from_file(model.join("tokenizer.json")).expect("the tokenizer");
    let context = TokenizerContext::read(&model, &tokenizer).expect("the tokenizer's context");
    let source = std::fs::read_to_string(root().join("examples/data/chat_template.jinja"))
        .expect("the template");
    let template = ChatTemplate::new(&source, 0).expect("the template compiles");
    println!(
        "tool calls   messages   rendered     tokens  renders  labelling  tokenizing  µs per call"
    );
    for calls in sizes {
        let c = conversation(calls);
        let start = Instant::now();
        let labelled =
            spans::label(&template, &c, &context.special, &context.markers).expect("labelled");
        let labelling = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let encoding = tokenizer
            .encode(labelled.text.as_str(), false)
            .expect("tokenized");
        let labels = label_tokens(&labelled, encoding.get_offsets(), 0);
        let tokenizing = start.elapsed().as_secs_f64();
        assert_eq!(labels.len(), encoding.get_ids().len());
        println!(
            "{calls:>10} {:>10} {:>10} {:>10} {:>8} {labelling:>9.2}s {tokenizing:>10.2}s {:>12.1}",
            c.messages.len(),
            labelled.text.len(),
            labels.len(),
            labelled.renders,
            (labelling + tokenizing) * 1e6 / calls as f64
        );
    }
}
