//! Chat templates rendered by cardproof against transformers' own renderer (issues #19, #41):
//! every template of tests/fixtures/chat_templates (the real public templates llama.cpp keeps
//! under models/templates) with each conversation of conversations.json, and every probe of
//! probes.txt (one jinja2 rule each). The comparison runs in `transformers::torch` (it needs
//! transformers, which CI installs).

use std::path::Path;

use cardproof::conversation::eval::{TokenizerContext, render_one};
use cardproof::conversation::file::Conversation;
use cardproof::conversation::spans::{Segment, TurnMarkers};
use cardproof::conversation::template::ChatTemplate;
use cardproof::conversation::template::python::REFUSAL;

use crate::support::*;

/// Every render and probe compared: what differed, per (template, case) or probe, with the
/// first differing byte and both texts around it, or which side failed and how.
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
    let mut corpus = Corpus {
        renders: renders.len(),
        ..Corpus::default()
    };
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
        let at = format!("{name} / {case_name}");
        match (r.get("text").and_then(|t| t.as_str()), ours) {
            (Some(want), Ok((got, ids))) if want == got => {
                let want_ids: Vec<u32> = serde_json::from_value(r["ids"].clone()).unwrap();
                if ids == want_ids {
                    corpus.identical += 1;
                } else {
                    let first = ids.iter().zip(&want_ids).position(|(a, b)| a != b);
                    corpus.bad.push(format!(
                        "{at}: same text, other token ids (first difference at {first:?}: transformers {:?}, cardproof {:?})",
                        first.map(|i| want_ids.get(i)),
                        first.map(|i| ids.get(i))
                    ));
                }
            }
            (Some(want), Ok((got, _))) => corpus.bad.push(format!("{at}: {}", differ(want, &got))),
            // A refusal that names the construct is the renderer's promise kept.
            (Some(_), Err(e)) if e.contains(REFUSAL) => corpus.refused.push(format!("{at}: {e}")),
            (Some(_), Err(e)) => corpus.bad.push(format!("{at}: cardproof failed: {e}")),
            (None, Ok(_)) => corpus.bad.push(format!(
                "{at}: transformers failed ({}) and cardproof rendered",
                r["error"]
            )),
            (None, Err(e)) => match same_error(r["error"].as_str().unwrap_or_default(), &e) {
                true => corpus.both_fail += 1,
                false => corpus.bad.push(format!(
                    "{at}: both failed, cardproof with another error: transformers {}, cardproof {e}",
                    r["error"]
                )),
            },
        }
    }
    compare_probes(&doc, clock, &mut corpus);
    corpus
}

/// The probes of probes.txt (one jinja2 rule each): the same text, or both failing with the
/// same Python error; a jinja2 text holding a memory address must be refused by cardproof.
fn compare_probes(doc: &serde_json::Value, clock: i64, corpus: &mut Corpus) {
    let (context, probes) = read_probes();
    let results = doc["probes"].as_array().unwrap();
    assert_eq!(
        results.len(),
        probes.len(),
        "every probe rendered by transformers"
    );
    corpus.probes = probes.len();
    for ((name, source), r) in probes.iter().zip(results) {
        assert_eq!(r["name"], name.as_str());
        let ours = ChatTemplate::new(source, clock).and_then(|t| t.render(&context));
        match (r.get("text").and_then(|t| t.as_str()), ours) {
            (Some(want), Ok(got)) if want == got && !want.contains(" at 0x") => {
                corpus.probes_identical += 1
            }
            (Some(want), Err(e)) if want.contains(" at 0x") && e.contains(REFUSAL) => {
                corpus.probes_identical += 1
            }
            (Some(want), Ok(got)) => corpus
                .bad
                .push(format!("probe {name}: {}", differ(want, &got))),
            (Some(_), Err(e)) if e.contains(REFUSAL) => {
                corpus.probes_refused.push(format!("{name}: {e}"))
            }
            (Some(_), Err(e)) => corpus
                .bad
                .push(format!("probe {name}: cardproof failed: {e}")),
            (None, Ok(got)) => corpus.bad.push(format!(
                "probe {name}: transformers failed ({}) and cardproof rendered {got:?}",
                r["error"]
            )),
            (None, Err(e)) => match same_error(r["error"].as_str().unwrap_or_default(), &e) {
                true => corpus.probes_identical += 1,
                false => corpus.probes_other_error.push(format!(
                    "{name}: transformers {}, cardproof {e}",
                    r["error"]
                )),
            },
        }
    }
}

/// Where two texts first differ, with both around it.
fn differ(want: &str, got: &str) -> String {
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
    format!(
        "differs at byte {at}: transformers {} cardproof {}",
        around(want),
        around(got)
    )
}

/// Whether cardproof's error names the error transformers raised: its Python class
/// (`TypeError: ...`), or for a template's own `raise_exception` its message.
fn same_error(transformers: &str, cardproof: &str) -> bool {
    let class = transformers.split(':').next().unwrap_or_default();
    cardproof.contains(&format!("{class}:")) || cardproof.contains(transformers)
}

/// probes.txt: `=== name` lines, each followed by its template; the first block, `context`, is
/// the JSON every probe renders with (as tests/chat_template_check.py reads it).
pub fn read_probes() -> (serde_json::Value, Vec<(String, String)>) {
    let text =
        std::fs::read_to_string(repo_root().join("tests/fixtures/chat_templates/probes.txt"))
            .unwrap();
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in text.split('\n') {
        match line.strip_prefix("=== ") {
            Some(name) => blocks.push((name.trim().to_owned(), String::new())),
            None => {
                let body = &mut blocks.last_mut().expect("a probe name first").1;
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    let mut blocks: Vec<(String, String)> = blocks
        .into_iter()
        .map(|(n, b)| (n, b.trim_end_matches('\n').to_owned()))
        .collect();
    let (name, context) = blocks.remove(0);
    assert_eq!(name, "context");
    (serde_json::from_str(&context).unwrap(), blocks)
}

/// The comparison's outcome.
#[derive(Default)]
pub struct Corpus {
    pub renders: usize,
    /// Byte-identical texts and token ids.
    pub identical: usize,
    /// Failing on both sides with the same Python error.
    pub both_fail: usize,
    /// Renders cardproof refuses, naming the construct.
    pub refused: Vec<String>,
    pub probes: usize,
    /// Probes identical, failing alike, or refused where jinja2 writes an address.
    pub probes_identical: usize,
    /// Probes of constructs cardproof refuses by name (jinja2 renders them).
    pub probes_refused: Vec<String>,
    /// Probes failing on both sides with different errors.
    pub probes_other_error: Vec<String>,
    /// Everything that differs: texts, ids, a render on one side only, an unnamed failure.
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
        // `"tools": true` is the file's shared list; a case may carry its own.
        tools: match &case["tools"] {
            serde_json::Value::Bool(true) => Some(conversations["tools"].clone()),
            serde_json::Value::Array(_) => Some(case["tools"].clone()),
            _ => None,
        },
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
        let compiled = template.compiled().unwrap();
        for case in conversations["cases"].as_array().unwrap() {
            let c = case_conversation(&conversations, case);
            if cardproof::conversation::render(&compiled, &c, &special).is_err() {
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

    assert!(labelled >= 505, "{labelled} labelled");
    assert!(refused.is_empty(), "refused: {refused:?}");
}

/// A template of `bomb` (after a line that writes the BOS token) written as `name.jinja` in
/// `dir`.
fn bomb_template(dir: &Path, name: &str, bomb: &str) -> std::path::PathBuf {
    let template = dir.join(format!("{name}.jinja"));
    std::fs::write(&template, format!("{{{{- bos_token }}}}\n{bomb}")).unwrap();
    template
}

/// The memory bombs of issue #41 in a chat template given to `measure`: an indent of 10¹², a
/// format width of 5·10⁹, a string doubled through a namespace, a list doubled, a value nested
/// without end. Each aborted the process (exit 134) or grew to 3–4 GB first; each is refused
/// (exit 2) naming the template's file and the line, before it grows (a doubling runs out of
/// fuel, which counts the bytes it creates, at 256 MiB), and nothing is written.
#[test]
fn a_chat_template_memory_bomb_is_refused_naming_the_template_and_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let (conversation, _) = crate::conversation::short_conversation(dir.path(), 4);
    for (name, bomb, why) in [
        (
            "indent",
            "{{ messages | tojson(indent=10**12) }}",
            "MemoryError: tojson's indent",
        ),
        (
            "width",
            r#"{{ "{:>5000000000}".format("x") }}"#,
            "MemoryError: a format width",
        ),
        (
            "doubling",
            "{%- set ns = namespace(s='x') %}\n{%- for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            // Its fuel runs out (cumulative bytes count as work) before its value reaches
            // the bound on one value: either is the refusal.
            "units of work on one render",
        ),
        (
            "list",
            "{%- set ns = namespace(l=[1]) %}\n{%- for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
            "units of work on one render",
        ),
        (
            "nesting",
            "{%- set ns = namespace(x=[]) %}\n{%- for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}",
            "RecursionError",
        ),
    ] {
        let template = bomb_template(dir.path(), name, bomb);
        let out = dir.path().join(format!("out-{name}"));
        let r = measure_short(
            std::path::Path::new(&model("shakespeare-fp8-block")),
            &conversation,
            &out,
            "200",
            &["--chat-template", template.to_str().unwrap()],
        );
        assert_eq!(r.code, 2, "{name}: {}", r.stderr);
        let line = if name == "indent" || name == "width" {
            2
        } else {
            3
        };
        for wanted in [
            template.display().to_string(),
            format!("(line {line})"),
            why.to_owned(),
        ] {
            assert!(r.stderr.contains(&wanted), "{name}: {wanted}: {}", r.stderr);
        }
        assert!(!out.join("measurement.json").exists(), "{name}");
    }
}

/// A card's own template that doubles a string through a namespace, its digest recomputed into
/// the card (a hostile card author controls both): `verify` refuses it before any forward
/// pass, exit 2, naming the card's template file and its line (its fuel, which counts the bytes
/// it creates, runs out at 256 MiB), where it aborted at 3–4 GB.
#[test]
fn a_cards_own_template_memory_bomb_is_refused_by_verify_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let candidate = dir.path().join("candidate");
    copy_model("shakespeare-fp8-block", &candidate);
    let (conversation, template) = crate::conversation::short_conversation(&candidate, 16);
    let m = dir.path().join("m");
    let r = measure_short(
        &candidate,
        &conversation,
        &m,
        "200",
        &["--chat-template", template.to_str().unwrap()],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let measurement = m.join("measurement.json");
    let r = cardproof(&["card", "--measurement", measurement.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);

    let digest = |path: &Path| cardproof::checkpoint::hash::hash_file(path).unwrap();
    let before = digest(&template);
    let source = std::fs::read_to_string(&template).unwrap();
    std::fs::write(
        &template,
        format!(
            "{{%- set ns = namespace(s='x') %}}\n{{%- for i in range(40) %}}{{% set ns.s = ns.s + ns.s %}}{{% endfor %}}\n{source}"
        ),
    )
    .unwrap();
    let card_path = candidate.join("README.md");
    let card = std::fs::read_to_string(&card_path).unwrap();
    assert!(
        card.contains(&before),
        "the card names its template's digest"
    );
    std::fs::write(&card_path, card.replace(&before, &digest(&template))).unwrap();

    let reference = model("shakespeare-bf16");
    let out = dir.path().join("report");
    let r = cardproof(&[
        "verify",
        candidate.to_str().unwrap(),
        "--reference",
        &reference,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "{}\n{}", r.stderr, r.stdout);
    for wanted in [
        "chat_template.jinja",
        "(line 2)",
        "units of work on one render",
    ] {
        assert!(r.stderr.contains(wanted), "{wanted}: {}", r.stderr);
    }
}
