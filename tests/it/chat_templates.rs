//! Chat templates rendered by cardproof against transformers' own renderer (issue #19): every
//! template of tests/fixtures/chat_templates (the real public templates llama.cpp keeps under
//! models/templates) with each conversation of conversations.json. The comparison runs in
//! `transformers::torch` (it needs transformers, which CI installs).

use std::path::Path;

use cardproof::conversation::eval::{TokenizerContext, render_one};
use cardproof::conversation::file::Conversation;
use cardproof::conversation::spans::{Segment, TurnMarkers};
use cardproof::conversation::template::ChatTemplate;

use crate::support::*;

/// Every render compared: what differed, per (template, case), with the first differing byte and
/// both texts around it, or which side failed.
pub fn mismatches(expected: &Path) -> Corpus {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(expected).unwrap()).unwrap();
    let fixtures = repo_root().join("tests/fixtures/chat_templates");
    let conversations: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("conversations.json")).unwrap(),
    )
    .unwrap();
    let clock = doc["clock"].as_i64().unwrap();
    let tokenizer = corpus_tokenizer();
    let special = doc["special"].as_object().unwrap();
    let renders = doc["renders"].as_array().unwrap();
    let mut bad = Vec::new();
    let (mut refused, mut refused_renders, mut lenient) = (Vec::new(), 0, 0);
    for r in renders {
        let name = r["template"].as_str().unwrap();
        let case_name = r["case"].as_str().unwrap();
        let case = conversations["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == case_name)
            .unwrap();
        let source = std::fs::read_to_string(fixtures.join("templates").join(name)).unwrap();
        let conversation = case_conversation(&conversations, case);
        let context = TokenizerContext {
            special: special.clone(),
            markers: markers(),
        };
        let ours = ChatTemplate::new(&source, clock)
            .and_then(|t| render_one(&t, &conversation, &tokenizer, &context));
        let ours = ours.map(|(labelled, ids, _)| (labelled.text, ids));
        match (r.get("text").and_then(|t| t.as_str()), ours) {
            (Some(want), Ok((got, ids))) if want == got => {
                let want_ids: Vec<u32> = serde_json::from_value(r["ids"].clone()).unwrap();
                if ids != want_ids {
                    let at = ids.iter().zip(&want_ids).position(|(a, b)| a != b);
                    bad.push(format!(
                        "{name} / {case_name}: same text, other token ids (first difference at {at:?}: transformers {:?}, cardproof {:?})",
                        at.map(|i| want_ids.get(i)),
                        at.map(|i| ids.get(i))
                    ));
                }
            }
            (Some(want), Ok((got, _))) => {
                let at = want
                    .bytes()
                    .zip(got.bytes())
                    .position(|(a, b)| a != b)
                    .unwrap_or(want.len().min(got.len()));
                let around = |s: &str| {
                    let start = s.floor_char_boundary(at.saturating_sub(30));
                    let end = s.ceil_char_boundary((at + 30).min(s.len()));
                    format!("{:?}", &s[start..end])
                };
                bad.push(format!(
                    "{name} / {case_name}: differs at byte {at}: transformers {} cardproof {}",
                    around(want),
                    around(&got)
                ));
            }
            // A refusal that names the construct is the renderer's promise kept.
            (Some(_), Err(e)) if e.contains("cannot render this template as transformers does") => {
                refused.push(name.to_owned());
                refused_renders += 1
            }
            (Some(_), Err(e)) => bad.push(format!("{name} / {case_name}: cardproof failed: {e}")),
            // minijinja iterates None as empty and serializes a lazy `map` result, where jinja2
            // raises: the one leniency, limited to those two errors of transformers'.
            (None, Ok(_))
                if r["error"].as_str().is_some_and(|e| {
                    e.contains("'NoneType' object is not iterable")
                        || e.contains("Object of type generator is not JSON serializable")
                }) =>
            {
                lenient += 1
            }
            (None, Ok(_)) => bad.push(format!(
                "{name} / {case_name}: transformers failed ({}) and cardproof rendered",
                r["error"]
            )),
            (None, Err(_)) => {}
        }
    }
    refused.dedup();
    Corpus {
        renders: renders.len(),
        identical: renders.len() - bad.len() - refused_renders - lenient,
        refused,
        lenient,
        bad,
    }
}

/// The corpus comparison's outcome.
pub struct Corpus {
    pub renders: usize,
    /// Byte-identical, or failing on both sides.
    pub identical: usize,
    /// Templates cardproof refuses, naming the construct.
    pub refused: Vec<String>,
    /// Renders where transformers raised on None iteration or a generator and cardproof did not.
    pub lenient: usize,
    pub bad: Vec<String>,
}

/// The corpus tokenizer (make_tokenizer.py): the examples' BPE plus the corpus's control tokens.
pub fn corpus_tokenizer() -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(
        repo_root().join("tests/fixtures/chat_templates/tokenizer.json"),
    )
    .unwrap()
}

/// The corpus's turn markers (make_tokenizer.py's markers.json).
pub fn markers() -> TurnMarkers {
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("tests/fixtures/chat_templates/markers.json"))
            .unwrap(),
    )
    .unwrap();
    let list = |k: &str| serde_json::from_value(m[k].clone()).unwrap();
    TurnMarkers {
        stops: list("stops"),
        specials: list("specials"),
    }
}

/// One case of conversations.json as a conversation.
pub fn case_conversation(
    conversations: &serde_json::Value,
    case: &serde_json::Value,
) -> Conversation {
    Conversation {
        messages: case["messages"].as_array().unwrap().clone(),
        tools: (case["tools"] == true).then(|| conversations["tools"].clone()),
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
        kwargs: case["kwargs"].as_object().unwrap().clone(),
    }
}

/// Every corpus template labels every conversation it renders, or names the message and field
/// it cannot place; where it labels, the labels say what the conversation holds: each message's
/// text lies in its own content (or tool result, or reasoning) ranges, and every tool call's
/// function name in a tool-call range of its message.
#[test]
fn every_corpus_render_is_labelled_from_the_rendering() {
    let fixtures = repo_root().join("tests/fixtures/chat_templates");
    let conversations: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("conversations.json")).unwrap(),
    )
    .unwrap();
    let mut names: Vec<String> = std::fs::read_dir(fixtures.join("templates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let special: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(serde_json::json!({"bos_token": "<s>", "eos_token": "</s>"}))
            .unwrap();
    let context = TokenizerContext {
        special: special.clone(),
        markers: markers(),
    };
    let (mut labelled, mut refused, mut wrong) = (0, Vec::new(), Vec::new());
    for name in &names {
        let source = std::fs::read_to_string(fixtures.join("templates").join(name)).unwrap();
        let Ok(template) = ChatTemplate::new(&source, 0) else {
            continue;
        };
        for case in conversations["cases"].as_array().unwrap() {
            let c = case_conversation(&conversations, case);
            if cardproof::conversation::render(&template, &c, &special).is_err() {
                continue;
            }
            let l = match cardproof::conversation::spans::label(
                &template,
                &c,
                &special,
                &context.markers,
            ) {
                Ok(l) => l,
                Err(e) => {
                    refused.push(format!("{name} / {}: {e}", case["name"]));
                    continue;
                }
            };
            labelled += 1;
            let text_of = |k: u32, segment: Segment| -> String {
                l.ranges
                    .iter()
                    .filter(|r| r.message == Some(k) && r.segment == segment)
                    .map(|r| &l.text[r.start..r.end])
                    .collect()
            };
            let owned = |k: u32| -> String {
                l.ranges
                    .iter()
                    .filter(|r| r.message == Some(k))
                    .map(|r| &l.text[r.start..r.end])
                    .collect()
            };
            for (k, m) in c.messages.iter().enumerate() {
                let k = k as u32;
                if let Some(content) = m["content"]
                    .as_str()
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                {
                    let segment = if m["role"] == "tool" {
                        Segment::ToolResult
                    } else {
                        Segment::Content
                    };
                    let got = text_of(k, segment);
                    // A template may leave a message out (earlier reasoning, a system prompt
                    // folded elsewhere); what it writes must be the message's own text.
                    if l.text.contains(content) && !got.contains(content) {
                        wrong.push(format!("{name} / {}: message {k}'s text is not in its {segment:?} ranges ({got:?})", case["name"]));
                    }
                }
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    let function = call["function"]["name"].as_str().unwrap();
                    // Templates that write no call, or only the first, are fine; a call written
                    // in the message's turn must be in its tool-call ranges.
                    if owned(k).contains(function)
                        && !text_of(k, Segment::ToolCall).contains(function)
                    {
                        wrong.push(format!("{name} / {}: message {k}'s call of {function} is not in its tool-call ranges", case["name"]));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    assert!(labelled >= 329, "{labelled} labelled");
    assert!(refused.is_empty(), "refused: {refused:?}");
}
