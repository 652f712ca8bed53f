//! Chat templates rendered by cardproof against transformers' own renderer (issue #19): every
//! template of tests/fixtures/chat_templates (the real public templates llama.cpp keeps under
//! models/templates) with each conversation of conversations.json. The comparison runs in
//! `transformers::torch` (it needs transformers, which CI installs).

use std::path::Path;

use cardproof::conversation::render;
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
        let conversation = cardproof::conversation::file::Conversation {
            messages: case["messages"].as_array().unwrap().clone(),
            tools: (case["tools"] == true).then(|| conversations["tools"].clone()),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            kwargs: case["kwargs"].as_object().unwrap().clone(),
        };
        let ours =
            ChatTemplate::new(&source, clock).and_then(|t| render(&t, &conversation, special));
        match (r.get("text").and_then(|t| t.as_str()), ours) {
            (Some(want), Ok(got)) if want == got => {}
            (Some(want), Ok(got)) => {
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
