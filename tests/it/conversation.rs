//! Conversations as eval text through the CLI (issue #19): measure, card, lint and verify on the
//! example tool-calling conversation (examples/data/tool-conversation.json, rendered with
//! examples/data/chat_template.jinja), positions by role and span, and the refusals.

use std::path::{Path, PathBuf};

use crate::support::*;

/// The example conversation cut to its first `messages` messages (a whole tool exchange: the
/// cut ends after an assistant's answer), written into `dir` with the example template beside
/// it. Returns (conversation, template).
pub(crate) fn short_conversation(dir: &Path, messages: usize) -> (PathBuf, PathBuf) {
    let data = repo_root().join("examples/data");
    let mut doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data.join("tool-conversation.json")).unwrap(),
    )
    .unwrap();
    doc["messages"].as_array_mut().unwrap().truncate(messages);
    let conversation = dir.join("conversation.json");
    std::fs::write(&conversation, serde_json::to_vec(&doc).unwrap()).unwrap();
    let template = dir.join("chat_template.jinja");
    std::fs::copy(data.join("chat_template.jinja"), &template).unwrap();
    (conversation, template)
}

/// `measure` of the fp8 example against the bf16 one on `conversation` at context length 128,
/// with `extra` flags; the measurement document.
fn measure(
    conversation: &Path,
    template: &Path,
    out: &Path,
    extra: &[&str],
) -> (Run, serde_json::Value) {
    let r = measure_short(
        Path::new(&model("shakespeare-fp8-block")),
        conversation,
        out,
        "200",
        &[&["--chat-template", template.to_str().unwrap()], extra].concat(),
    );
    let doc = if r.code == 0 {
        serde_json::from_str(&std::fs::read_to_string(out.join("measurement.json")).unwrap())
            .unwrap()
    } else {
        serde_json::Value::Null
    };
    (r, doc)
}

fn span<'a>(run: &'a serde_json::Value, by: &str, name: &str) -> &'a serde_json::Value {
    run["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["by"] == by && s["name"] == name)
        .unwrap_or_else(|| panic!("no {by}/{name} span in {:#}", run["spans"]))
}

#[test]
fn a_conversation_is_rendered_labelled_and_scored_by_span() {
    let dir = tempfile::tempdir().unwrap();
    let (conversation, template) = short_conversation(dir.path(), 16);
    let (r, m) = measure(&conversation, &template, &dir.path().join("all"), &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let c = &m["eval"]["conversation"];
    assert_eq!(c["conversations"], 1);
    assert_eq!(c["messages"], 16);
    assert_eq!(c["template"]["from"], "file");
    assert_eq!(c["kwargs"], serde_json::json!([{"enable_thinking": true}]));
    assert_eq!(c["clock"], 1_767_225_600);
    let template_sha = cardproof::digest::hex(&<sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(&template).unwrap(),
    ));
    assert_eq!(c["template"]["sha256"], template_sha.as_str());
    let counted: u64 = c["segment_tokens"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(counted, m["eval"]["token_count"].as_u64().unwrap());
    for segment in [
        "content",
        "reasoning",
        "tool_call",
        "tool_result",
        "scaffolding",
    ] {
        assert!(
            c["segment_tokens"][segment].as_u64().unwrap() > 0,
            "{segment}"
        );
    }
    // The text output says how it was rendered and prints the spans.
    assert!(
        r.stdout.contains("rendered with chat template"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("tool-call inside"), "{}", r.stdout);

    // Every row is in exactly one segment, one role, and inside or outside a tool call.
    let run = &m["runs"][0];
    let n = run["n_positions"].as_u64().unwrap();
    let sum = |by: &str| -> u64 {
        run["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["by"] == by)
            .map(|s| s["n_positions"].as_u64().unwrap())
            .sum()
    };
    assert_eq!((sum("segment"), sum("role"), sum("tool_call")), (n, n, n));
    let inside = span(run, "tool_call", "inside");
    assert_eq!(
        inside["metrics"],
        span(run, "segment", "tool_call")["metrics"]
    );
    let flips: u64 = ["inside", "outside"]
        .iter()
        .map(|p| span(run, "tool_call", p)["top1_flips"].as_u64().unwrap())
        .sum();
    let agreement = run["metrics"]["top1_agreement"].as_f64().unwrap();
    assert_eq!(flips, ((1.0 - agreement) * n as f64).round() as u64);

    // Scoring only the tool calls gives the same rows and numbers as the tool-call span of the
    // run over every row: the policy selects, it does not change what is computed.
    let (r, calls) = measure(
        &conversation,
        &template,
        &dir.path().join("calls"),
        &["--positions", "span:tool-call"],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let only = &calls["runs"][0];
    assert_eq!(only["n_positions"], inside["n_positions"]);
    for metric in ["kld_mean", "kld_reverse_mean", "top1_agreement", "kld_max"] {
        assert_eq!(
            only["metrics"][metric], inside["metrics"][metric],
            "{metric}"
        );
    }
    assert_eq!(
        calls["protocol"]["positions"],
        serde_json::json!({"policy": "span", "span": "tool_call"})
    );

    // A role policy combined with a stride: the assistant's rows with j mod 4 = 3.
    let (r, every) = measure(
        &conversation,
        &template,
        &dir.path().join("every"),
        &[
            "--positions",
            "role:assistant",
            "--stride",
            "4",
            "--offset",
            "3",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let assistant = span(run, "role", "assistant")["n_positions"]
        .as_u64()
        .unwrap();
    let strided = every["runs"][0]["n_positions"].as_u64().unwrap();
    assert!(
        strided > assistant / 6 && strided < assistant / 3,
        "{strided} of {assistant}"
    );
    let positions = std::fs::read(dir.path().join("every/positions.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&positions).unwrap();
    let j = file.tensor("ctx128.position").unwrap();
    assert!(
        j.data()
            .chunks_exact(8)
            .all(|b| i64::from_le_bytes(b.try_into().unwrap()) % 4 == 3)
    );
    let roles = file.tensor("ctx128.role").unwrap();
    // Role code 3 is the assistant (Role::ALL's order).
    assert!(roles.data().iter().all(|&r| r == 3));
}

#[test]
fn role_and_span_policies_and_conversation_files_refuse_what_they_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let (conversation, template) = short_conversation(dir.path(), 16);
    let text = short_text(dir.path(), 4000);
    // A role or span policy on plain text: nothing says which token is whose.
    let r = measure_short(
        Path::new(&model("shakespeare-fp8-block")),
        &text,
        &dir.path().join("x"),
        "10",
        &["--positions", "role:assistant"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("only a conversation eval text"),
        "{}",
        r.stderr
    );
    assert!(!dir.path().join("x/measurement.json").exists());
    for (flags, needle) in [
        (
            &["--positions", "role:wizard"][..],
            "unknown role `wizard` (system, developer, user, assistant, tool, other)",
        ),
        (&["--positions", "span"][..], "span:tool-call"),
        (
            &["--positions", "span:tool-call", "--stride", "4"][..],
            "--stride and --offset go together",
        ),
        (
            &[
                "--positions",
                "span:content",
                "--stride",
                "4",
                "--offset",
                "4",
            ][..],
            "offset 4 must be below stride 4",
        ),
        (
            &["--chat-template-from", "candidate"][..],
            "cannot be used with",
        ),
    ] {
        let (r, _) = measure(&conversation, &template, &dir.path().join("y"), flags);
        assert_eq!(r.code, 2, "{flags:?}: {}", r.stderr);
        assert!(r.stderr.contains(needle), "{flags:?}: {}", r.stderr);
    }

    // Lanes without labels: logit files, reference artifacts.
    let r = Cmd::kld()
        .reference("a.safetensors")
        .candidate("b.safetensors")
        .flag("--positions", "role:user")
        .run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("logit files say nothing"), "{}", r.stderr);
    let reference = model("shakespeare-bf16");
    let artifact = dir.path().join("a.artifact");
    let r = Cmd::reference_export()
        .flag("--model", &reference)
        .eval_text(&conversation)
        .context_length(128)
        .flag("--positions", "span:tool-call")
        .out(&artifact)
        .run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("an artifact scores the same rows"),
        "{}",
        r.stderr
    );
    assert!(!artifact.exists());

    // Bad files: each one error naming the file and the place, exit 2, nothing written.
    let broken = dir.path().join("broken.json");
    std::fs::write(
        &broken,
        r#"{"messages": [{"role": "user", "content": "hi"}, {"content": "no role"}]}"#,
    )
    .unwrap();
    let slicing = dir.path().join("slicing.jinja");
    std::fs::write(
        &slicing,
        // `or ''`: a tool-calling turn has no content (null is left out, as transformers leaves
        // it out), and slicing an undefined value is jinja2's UndefinedError.
        "{% for m in messages %}{{ m.role }}: {{ (m.content or '')[:3] }}<|endoftext|>{% endfor %}",
    )
    .unwrap();
    let raising = dir.path().join("raising.jinja");
    std::fs::write(&raising, "{{ raise_exception('roles must alternate') }}").unwrap();
    for (file, template, needles) in [
        (
            &broken,
            &template,
            &[
                "broken.json",
                "conversation 1 (line 1)",
                "message 2",
                "role",
            ][..],
        ),
        (
            &conversation,
            &slicing,
            &[
                "conversation.json",
                "conversation 1",
                "the template changes message 1 (system)",
                "`content`",
            ][..],
        ),
        (
            &conversation,
            &raising,
            &["conversation.json", "roles must alternate"][..],
        ),
        (
            &conversation,
            &dir.path().join("missing.jinja"),
            &["missing.jinja"][..],
        ),
    ] {
        let out = dir.path().join("z");
        let (r, _) = measure(file, template, &out, &[]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        for n in needles {
            assert!(r.stderr.contains(n), "{n}: {}", r.stderr);
        }
        assert!(!out.join("measurement.json").exists());
    }
    // The reference has no chat template of its own: the error says where it looked and how to
    // name one.
    let r = measure_short(
        Path::new(&model("shakespeare-fp8-block")),
        &conversation,
        &dir.path().join("w"),
        "10",
        &[],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("tokenizer_config.json") && r.stderr.contains("--chat-template FILE"),
        "{}",
        r.stderr
    );
}

/// A copy of the fp8 example whose card is rewritten from a measurement on the short
/// conversation (the conversation and template beside the card), with `extra` measure flags.
pub(crate) fn conversation_card(dir: &Path, extra: &[&str]) -> PathBuf {
    let candidate = dir.join("candidate");
    copy_model("shakespeare-fp8-block", &candidate);
    let (conversation, template) = short_conversation(&candidate, 16);
    let m = dir.join("m");
    let r = measure_short(
        &candidate,
        &conversation,
        &m,
        "200",
        &[&["--chat-template", template.to_str().unwrap()], extra].concat(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cardproof(&[
        "card",
        "--measurement",
        m.join("measurement.json").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    candidate
}

#[test]
fn a_conversation_card_discloses_its_render_and_verify_reproduces_it() {
    let dir = tempfile::tempdir().unwrap();
    let candidate = conversation_card(dir.path(), &["--positions", "role:assistant"]);
    let card = std::fs::read_to_string(candidate.join("README.md")).unwrap();
    for line in [
        "kind: conversation",
        "from: file",
        "path: chat_template.jinja",
        "clock: 1767225600",
        "rendered_sha256:",
        "policy: role",
        "role: assistant",
    ] {
        assert!(card.contains(line), "{line}:\n{card}");
    }
    let lint = cardproof(&["lint", candidate.to_str().unwrap(), "--json"]);
    assert_eq!(lint.code, 0, "{}", lint.stdout);
    assert!(lint.codes().is_empty(), "{:?}", lint.codes());

    let keys = dir.path().join("keys");
    cardproof(&["keygen", "--out", keys.to_str().unwrap()]);
    let key = keys.join("cardproof.key");
    let verify = |out: &str, extra: &[&str]| {
        Cmd::verify(&candidate)
            .reference(model("shakespeare-bf16"))
            .key(&key)
            .out(dir.path().join(out))
            .arg("--json")
            .args(extra)
            .run()
    };
    // The card names its text and template by file name, found beside it.
    let r = verify("report", &[]);
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, r.stdout);
    let report = r.json();
    assert_eq!(report["verdict"], "reproduced");
    let html = std::fs::read_to_string(dir.path().join("report/report.html")).unwrap();
    assert!(
        html.contains("By span of the conversation") && html.contains("along the conversation")
    );
    let md = std::fs::read_to_string(dir.path().join("report/report.md")).unwrap();
    assert!(md.contains("| role `assistant` |"), "{md}");

    // Another template (one word changed): not comparable, before any forward pass, naming the
    // template's digest and the render's.
    let other = dir.path().join("other.jinja");
    std::fs::write(
        &other,
        std::fs::read_to_string(candidate.join("chat_template.jinja"))
            .unwrap()
            .replace(
                "You may call these functions",
                "You may call those functions",
            ),
    )
    .unwrap();
    let r = verify("other", &["--chat-template", other.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}\n{}", r.stderr, r.stdout);
    let report = r.json();
    assert_eq!(report["verdict"], "not_comparable");
    let differences = report["lane_differences"].to_string();
    for field in [
        "chat template sha256",
        "rendered text sha256",
        "tokens sha256",
    ] {
        assert!(differences.contains(field), "{field}: {differences}");
    }
    // Another clock only: the template is the same, the clock is named (the render of this
    // template does not read it, so the tokens agree).
    let r = verify("clock", &["--chat-template-clock", "0"]);
    assert_eq!(r.code, 1, "{}\n{}", r.stderr, r.stdout);
    assert!(
        r.json()["lane_differences"]
            .to_string()
            .contains("strftime_now clock: card 1767225600, given files 0"),
        "{}",
        r.stdout
    );
}

#[test]
fn lint_says_what_a_conversation_card_leaves_out() {
    let dir = tempfile::tempdir().unwrap();
    let candidate = conversation_card(dir.path(), &[]);
    let card = std::fs::read_to_string(candidate.join("README.md")).unwrap();
    // Scored at every position: said, as a warning (exit 0).
    let r = cardproof(&["lint", candidate.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 0, "{}", r.stdout);
    let f = r.finding("conversation-all-positions");
    assert_eq!(f["severity"], "warning");
    assert!(
        f["message"].as_str().unwrap().contains("role: assistant"),
        "{f}"
    );
    // Without the template's digest: vague (an error).
    let line = card
        .lines()
        .find(|l| l.trim_start().starts_with("sha256:") && card.find(l) > card.find("template:"))
        .unwrap()
        .to_owned();
    std::fs::write(
        candidate.join("README.md"),
        card.replace(&format!("{line}\n"), ""),
    )
    .unwrap();
    let r = cardproof(&["lint", candidate.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let f = r.finding("vague-disclosure");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("no `eval.conversation.template.sha256`"),
        "{f}"
    );
    assert_eq!(f["pointer"], "/fidelity/eval/conversation/template");

    // A role policy that names no role, and a span policy on plain text: vague.
    std::fs::write(
        candidate.join("README.md"),
        card.replace("policy: all", "policy: role"),
    )
    .unwrap();
    let r = cardproof(&["lint", candidate.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.finding("vague-disclosure")["message"]
            .as_str()
            .unwrap()
            .contains("policy `role` does not say which role it scores"),
        "{}",
        r.stdout
    );
    let plain = std::fs::read_to_string(model("shakespeare-fp8-block") + "/README.md").unwrap();
    assert!(plain.contains("policy: all"));
    let r = lint_text(plain.replace("policy: all", "policy: span\n      span: tool_call"));
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout
            .contains("the eval text is not said to be conversations"),
        "{}",
        r.stdout
    );
}

#[test]
fn a_kv_cache_sweep_runs_on_a_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let (conversation, template) = short_conversation(dir.path(), 16);
    let out = dir.path().join("sweep");
    let reference = model("shakespeare-bf16");
    let r = Cmd::measure()
        .candidate(&reference)
        .eval_text(&conversation)
        .flag("--chat-template", &template)
        .context_length(128)
        .flag("--positions", "span:tool-call")
        .bootstrap(50)
        .flag("--sweep", "kv_cache=none,q8_0,q4_0")
        .out(&out)
        .run();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let sweep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("sweep.json")).unwrap()).unwrap();
    let pairs = sweep["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2);
    let kld: Vec<f64> = pairs
        .iter()
        .map(|p| p["runs"][0]["kld_mean"].as_f64().unwrap())
        .collect();
    assert!(kld[0] > 0.0 && kld[1] > kld[0], "{kld:?}");
}

/// An agent conversation of `calls` rounds (an assistant turn calling a tool, the tool's result)
/// after a request, written to `dir` with a terse template (one short line per message, so the
/// measurement stays small).
fn agent_conversation(dir: &Path, calls: usize) -> (PathBuf, PathBuf) {
    let mut messages = vec![serde_json::json!({"role": "user", "content": "Go."})];
    for i in 0..calls {
        messages.push(
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"type": "function", "function": {"name": "get_passage", "arguments": {"start": i}}}
            ]}),
        );
        messages.push(serde_json::json!({"role": "tool", "content": format!("line {i}")}));
    }
    let path = dir.join(format!("agent-{calls}.json"));
    std::fs::write(
        &path,
        serde_json::to_vec(&serde_json::json!({"messages": messages})).unwrap(),
    )
    .unwrap();
    let template = dir.join("terse.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}{% endfor %}{{ m.content or '' }}<|endoftext|>\n{% endfor %}",
    )
    .unwrap();
    (path, template)
}

/// Regression (#41): labelling a long conversation sat silent (4,000 tool calls, still
/// tokenizing after 600 s with no progress shown). A long conversation shows each step of its
/// labelling and tokenizing, with its size, and `measure` goes on to score it.
#[test]
fn a_long_conversation_shows_its_labelling_and_tokenizing_as_progress() {
    let dir = tempfile::tempdir().unwrap();
    let (conversation, template) = agent_conversation(dir.path(), 600);
    let r = Cmd::measure()
        .reference(model("shakespeare-bf16"))
        .candidate(model("shakespeare-fp8-block"))
        .eval_text(&conversation)
        .flag("--chat-template", &template)
        .context_length(128)
        .bootstrap(10)
        .out(dir.path().join("m"))
        .env("CARDPROOF_PROGRESS", "plain")
        .run();
    let stderr = r.stderr;
    assert_eq!(r.code, 0, "{stderr}");
    let steps: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("progress: tokenizing"))
        .collect();
    assert_eq!(
        steps,
        [
            "progress: tokenizing",
            "progress: tokenizing conversation 1/1 (1201 messages, 600 tool calls): labelling",
            "progress: tokenizing conversation 1/1: tokenizing its render (28107 bytes)",
        ],
        "{stderr}"
    );
    assert!(stderr.contains("progress: measuring"), "{stderr}");
}

/// Regression (#41): the size caps bounded the file, not the work: a small file whose template
/// writes each message many times renders past what one conversation may render to, and is
/// refused (exit 2) naming the file, the conversation and the limit, before it is labelled or
/// tokenized.
#[test]
fn a_conversation_rendering_past_the_limit_is_refused_naming_the_file_and_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let (conversation, _) = short_conversation(dir.path(), 2);
    let template = dir.path().join("echo.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{% for i in range(400) %}{% for j in range(250) %}{{ m.content }}{% endfor %}{% endfor %}<|endoftext|>{% endfor %}",
    )
    .unwrap();
    let r = measure_short(
        Path::new(&model("shakespeare-fp8-block")),
        &conversation,
        &dir.path().join("m"),
        "10",
        &["--chat-template", template.to_str().unwrap(), "--json"],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    let error = &r.json()["error"];
    assert_eq!(error["kind"], "format", "{error}");
    assert!(
        error["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("conversation.json")),
        "{error}"
    );
    let message = error["message"].as_str().unwrap();
    assert!(
        message.starts_with("conversation 1: it renders to 37200026 bytes, over the 16 MiB one conversation may render to"),
        "{message}"
    );
    // The file is 2 KB: its size is not what is over.
    assert!(std::fs::metadata(&conversation).unwrap().len() < 4096);
}
