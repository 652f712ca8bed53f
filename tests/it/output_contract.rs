//! The one output contract (issue #15): every command with `--json` prints exactly one versioned
//! JSON document on stdout, errors included, and keeps diagnostics and progress on stderr.

use std::path::Path;

use serde_json::Value;

use crate::hub_server::HubServer;
use crate::support::{Cmd, Run, cardproof, model, repo_root, short_text};

/// stdout is exactly one JSON object with `"schema_version": 1` first; stderr holds no JSON.
#[track_caller]
fn one_document(what: &str, run: &Run, codes: &[i32]) -> Value {
    assert!(
        codes.contains(&run.code),
        "{what}: exit {} (expected one of {codes:?})\n{}\n{}",
        run.code,
        run.stdout,
        run.stderr
    );
    let documents: Vec<Value> = serde_json::Deserializer::from_str(&run.stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{what}: stdout is not JSON ({e}):\n{}", run.stdout));
    assert_eq!(
        documents.len(),
        1,
        "{what}: stdout holds {} JSON documents:\n{}",
        documents.len(),
        run.stdout
    );
    let doc = documents.into_iter().next().unwrap();
    let keys: Vec<&String> = doc
        .as_object()
        .unwrap_or_else(|| panic!("{what}: the document is not an object: {doc}"))
        .keys()
        .collect();
    assert_eq!(
        keys.first().map(|k| k.as_str()),
        Some("schema_version"),
        "{what}: {doc}"
    );
    assert_eq!(doc["schema_version"], 1, "{what}");
    assert!(run.stdout.ends_with("}\n"), "{what}: {:?}", run.stdout);
    assert!(
        !run.stderr.contains("\"schema_version\""),
        "{what}: a document on stderr:\n{}",
        run.stderr
    );
    for line in run.stderr.lines() {
        let line = line.trim_start();
        assert!(
            !(line.starts_with('{') || line.starts_with('[')),
            "{what}: JSON on stderr: {line}\n{}",
            run.stderr
        );
    }
    doc
}

/// [`one_document`], validated against the committed schema of the document `name` (or of the
/// error document, for exit 2).
#[track_caller]
fn checked(name: &str, what: &str, run: &Run, codes: &[i32]) -> Value {
    let doc = one_document(what, run, codes);
    let name = if run.code == 2 { "error" } else { name };
    crate::output_schemas::assert_valid(name, what, &doc);
    doc
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every command that takes `--json` (all but `schema`, whose document is the JSON Schema itself),
/// on the example models and cards, succeeding and failing.
#[test]
fn every_json_command_prints_one_versioned_document() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let reference = model("shakespeare-bf16");
    // A copy of an example candidate, whose card `card` updates.
    let candidate = t.join("candidate");
    std::fs::create_dir(&candidate).unwrap();
    for entry in std::fs::read_dir(model("shakespeare-w8a16")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), candidate.join(entry.file_name())).unwrap();
    }
    let text = short_text(t, 2500);
    let (m, logits, keys, report) = (t.join("m"), t.join("logits"), t.join("keys"), t.join("r"));

    // lint, on every example card.
    for entry in std::fs::read_dir(repo_root().join("examples/cards")).unwrap() {
        let card = entry.unwrap().path().join("README.md");
        let doc = checked(
            "lint",
            "lint",
            &cardproof(&["lint", s(&card), "--json"]),
            &[0, 1],
        );
        assert!(doc["findings"].is_array());
    }
    // inspect and hash, on every example model: one shape for safetensors and GGUF alike.
    for entry in std::fs::read_dir(repo_root().join("examples/models")).unwrap() {
        let dir = entry.unwrap().path();
        let doc = checked(
            "inspect",
            "inspect",
            &cardproof(&["inspect", s(&dir), "--json"]),
            &[0],
        );
        assert_eq!(doc["variants"].as_array().map(Vec::len), Some(1), "{doc}");
        let doc = checked(
            "hash",
            "hash",
            &cardproof(&["hash", s(&dir), "--json"]),
            &[0],
        );
        assert!(doc["root_sha256"].is_string());
        let run = cardproof(&["lint", s(&dir), "--json"]);
        checked("lint", "lint (model directory)", &run, &[0, 1, 2]);
    }
    // measure, and kld on the logits it dumped and on llama.cpp base files.
    let run = Cmd::measure()
        .reference(&reference)
        .candidate(&candidate)
        .eval_text(&text)
        .out(&m)
        .flag("--dump-logits", &logits)
        .context_length(128)
        .bootstrap(10)
        .arg("--json")
        .run();
    let doc = checked("measurement", "measure", &run, &[0]);
    assert!(doc["runs"].is_array());
    // Every vocabulary mode and position policy the protocol can state.
    let (r_logits, c_logits) = (
        logits.join("reference.logits.safetensors"),
        logits.join("candidate.logits.safetensors"),
    );
    for protocol in [
        &[][..],
        &["--vocab", "top-k", "--top-k", "8", "--tail", "renormalized"],
        &[
            "--vocab",
            "threshold",
            "--positions",
            "from",
            "--from",
            "64",
        ],
        &[
            "--direction",
            "reverse",
            "--positions",
            "stride",
            "--stride",
            "3",
            "--offset",
            "1",
        ],
        &["--positions", "second-half", "--context-length", "128"],
    ] {
        let run = Cmd::kld()
            .reference(&r_logits)
            .candidate(&c_logits)
            .bootstrap(10)
            .arg("--json")
            .args(protocol)
            .run();
        checked("kld", &format!("kld {protocol:?}"), &run, &[0]);
    }
    let fixtures = repo_root().join("tests/fixtures/llamacpp");
    let run = Cmd::kld()
        .reference(fixtures.join("ref.kld"))
        .candidate(fixtures.join("cand-q5_0.kld"))
        .args(["--llamacpp-compat", "--json"])
        .run();
    checked("kld-llamacpp-compat", "kld --llamacpp-compat", &run, &[0]);

    // card: updating the candidate's card, and creating a new one.
    let measurement = m.join("measurement.json");
    let card = candidate.join("README.md");
    let run = cardproof(&[
        "card",
        "--measurement",
        s(&measurement),
        "--into",
        s(&card),
        "--json",
    ]);
    let doc = checked("card", "card", &run, &[0]);
    assert_eq!(doc["card"], s(&card));
    assert_eq!(doc["action"], "updated");
    assert_eq!(doc["lint"]["errors"], 0, "{doc}");
    assert_eq!(
        doc["sha256"],
        cardproof::checkpoint::hash::hash_file(&card).unwrap()
    );
    let fresh = t.join("fresh.md");
    let run = cardproof(&[
        "card",
        "--measurement",
        s(&measurement),
        "--into",
        s(&fresh),
        "--json",
    ]);
    let doc = checked("card", "card (new)", &run, &[0, 1]);
    assert_eq!(doc["action"], "created");

    // keygen, sign, verify and verify-report.
    let doc = checked(
        "keygen",
        "keygen",
        &cardproof(&["keygen", "--out", s(&keys), "--json"]),
        &[0],
    );
    let keyid = doc["keyid"].clone();
    let key = keys.join("cardproof.key");
    let public = keys.join("cardproof.pub");
    let run = cardproof(&[
        "sign",
        s(&measurement),
        "--checkpoint",
        s(&candidate),
        "--key",
        s(&key),
        "--json",
    ]);
    let doc = checked("sign", "sign", &run, &[0]);
    let envelope = m.join("measurement.dsse.json");
    assert_eq!(doc["envelope"], s(&envelope));
    assert_eq!(doc["keyid"], keyid);
    assert_eq!(
        doc["predicate_type"],
        cardproof::attest::MEASUREMENT_PREDICATE_TYPE
    );
    assert!(doc["subjects"].as_u64().unwrap() > 0, "{doc}");
    let run = cardproof(&["verify-report", s(&envelope), "--pub", s(&public), "--json"]);
    assert_eq!(
        checked("verify-report", "verify-report (sign)", &run, &[0])["verified"],
        true
    );
    // A report that does not verify: another key.
    let other = t.join("other-keys");
    let run = cardproof(&["keygen", "--out", s(&other), "--json"]);
    checked("keygen", "keygen (other)", &run, &[0]);
    let other = other.join("cardproof.pub");
    let run = cardproof(&["verify-report", s(&envelope), "--pub", s(&other), "--json"]);
    let doc = checked("verify-report", "verify-report (other key)", &run, &[1]);
    assert_eq!(doc["verified"], false);
    assert!(doc["verdict"].is_null(), "{doc}");
    let run = Cmd::verify(&candidate)
        .reference(&reference)
        .eval_text(&text)
        .key(&key)
        .out(&report)
        .arg("--json")
        .run();
    assert_eq!(
        checked("report", "verify", &run, &[0])["verdict"],
        "reproduced"
    );
    let run = cardproof(&[
        "verify-report",
        s(&report.join("report.dsse.json")),
        "--pub",
        s(&public),
        "--checkpoint",
        s(&candidate),
        "--json",
    ]);
    assert_eq!(
        checked("verify-report", "verify-report", &run, &[0])["verified"],
        true
    );

    // reference export: a hidden-state artifact and a llama.cpp base file.
    for (kind, out) in [("hidden", "ref.safetensors"), ("llamacpp", "ref.kld")] {
        let out = t.join(out);
        let run = Cmd::reference_export()
            .flag("--model", &reference)
            .eval_text(&text)
            .flag("--kind", kind)
            .out(&out)
            .context_length(128)
            .bootstrap(10)
            .arg("--json")
            .run();
        let doc = checked("export", "reference export", &run, &[0]);
        assert_eq!(doc["artifact"], s(&out));
        assert_eq!(doc["kind"], kind);
        assert_eq!(doc["size"], std::fs::metadata(&out).unwrap().len());
        assert_eq!(
            doc["sha256"],
            cardproof::checkpoint::hash::hash_file(&out).unwrap()
        );
        assert!(doc["rows"].as_u64().unwrap() > 0, "{doc}");
    }

    // check, against the local Hub-compatible server holding the candidate and its card.
    let server = HubServer::start();
    let commit = "1111111111111111111111111111111111111111";
    server.publish("example-org/shakespeare-w8a16", "main", commit, &candidate);
    let cache = tempfile::tempdir().unwrap();
    let run = crate::hub::run(
        &server,
        cache.path(),
        &["check", "hf:example-org/shakespeare-w8a16", "--json"],
        &[],
    );
    assert_eq!(checked("check", "check", &run, &[0, 1])["commit"], commit);

    // Errors are one document too: bad input, and a usage error found after parsing.
    let missing = t.join("missing");
    for verb in ["lint", "inspect", "hash"] {
        let doc = checked(verb, verb, &cardproof(&[verb, s(&missing), "--json"]), &[2]);
        assert!(doc["error"]["message"].is_string(), "{doc}");
        assert_eq!(doc["error"]["kind"], "not_found", "{doc}");
    }
    let run = cardproof(&["sign", s(&missing), "--key", s(&key), "--json"]);
    assert!(checked("sign", "sign (missing)", &run, &[2])["error"].is_object());
    let run = cardproof(&["card", "--measurement", s(&missing), "--json"]);
    assert!(checked("card", "card (missing)", &run, &[2])["error"].is_object());
    let run = Cmd::reference_export()
        .flag("--model", &reference)
        .eval_text(&text)
        .flag("--kind", "llamacpp")
        .out(&missing)
        .context_length(64)
        .context_length(128)
        .arg("--json")
        .run();
    let doc = checked("error", "reference export (usage)", &run, &[2]);
    assert!(doc["error"]["message"].is_string(), "{doc}");
    let run = Cmd::kld()
        .reference("a")
        .candidate("b")
        .args(["--top-k", "3", "--json"])
        .run();
    let doc = checked("error", "kld (usage)", &run, &[2]);
    assert!(doc["error"]["file"].is_null(), "{doc}");
    assert_eq!(doc["error"]["kind"], "usage", "{doc}");
}

/// Every command with output flags, with arguments that parse (nothing has to exist: a refused
/// format stops it before any work).
fn every_command(t: &Path) -> Vec<(&'static str, Vec<String>)> {
    let p = |name: &str| t.join(name).to_str().unwrap().to_owned();
    let v = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        ("lint", v(&["lint", &p("card.md")])),
        ("check", v(&["check", &p("model")])),
        ("inspect", v(&["inspect", &p("model")])),
        ("hash", v(&["hash", &p("model")])),
        (
            "kld",
            v(&["kld", "--reference", &p("r"), "--candidate", &p("c")]),
        ),
        (
            "measure",
            Cmd::measure()
                .reference(p("r"))
                .candidate(p("c"))
                .eval_text(p("t"))
                .context_length(128)
                .out(p("out"))
                .argv()
                .to_vec(),
        ),
        ("verify", v(&["verify", &p("model"), "--out", &p("out")])),
        ("card", v(&["card", "--measurement", &p("m.json")])),
        ("keygen", v(&["keygen", "--out", &p("keys")])),
        ("sign", v(&["sign", &p("m.json")])),
        (
            "reference export",
            Cmd::reference_export()
                .flag("--model", p("r"))
                .eval_text(p("t"))
                .context_length(128)
                .out(p("a.safetensors"))
                .argv()
                .to_vec(),
        ),
        (
            "verify-report",
            v(&["verify-report", &p("e"), "--pub", &p("k")]),
        ),
    ]
}

#[test]
fn a_format_a_command_does_not_print_is_a_usage_error_naming_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    let commands = every_command(tmp.path());
    assert_eq!(commands.len(), 12, "every command with output flags");
    for (name, args) in commands {
        let supported: &[&str] = match name {
            "lint" => &["human", "json", "markdown", "sarif"],
            "check" => &["human", "json", "sarif"],
            _ => &["human", "json"],
        };
        for format in ["markdown", "sarif"] {
            if supported.contains(&format) {
                continue;
            }
            let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
            a.extend(["--format", format]);
            let run = cardproof(&a);
            assert_eq!(run.code, 2, "{name} --format {format}: {}", run.stderr);
            assert!(run.stdout.is_empty(), "{name}: {}", run.stdout);
            let want = format!(
                "`{name}` does not print --format {format}; it prints {}",
                supported.join(", ")
            );
            assert!(
                run.stderr.contains(&want),
                "{name}: {want:?} not in {}",
                run.stderr
            );
        }
    }
    // Refused before any work: keygen wrote no keys.
    assert!(!tmp.path().join("keys").exists());
    // The formats a command prints are honoured: lint's Markdown table, check's SARIF.
    let card = repo_root().join("examples/cards/compliant-fp8/README.md");
    let md = cardproof(&["lint", s(&card), "--format", "markdown"]);
    assert_eq!(md.code, 0, "{}", md.stderr);
    assert!(md.stdout.starts_with("### cardproof lint"), "{}", md.stdout);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&card, dir.path().join("README.md")).unwrap();
    let sarif = cardproof(&["check", s(dir.path()), "--format", "sarif"]);
    assert_ne!(sarif.code, 2, "{}", sarif.stderr);
    assert_eq!(
        serde_json::from_str::<Value>(&sarif.stdout).unwrap()["version"],
        "2.1.0"
    );
}

#[test]
fn json_diagnostics_are_not_repeated_on_stderr() {
    // A card with findings: the document holds them; stderr stays empty. Without --json they
    // are on stderr with their lines.
    let card = repo_root().join("examples/cards/vague-disclosure/README.md");
    let json = cardproof(&["lint", s(&card), "--json"]);
    assert_eq!(json.code, 1, "{}", json.stderr);
    assert!(!json.json()["findings"].as_array().unwrap().is_empty());
    assert_eq!(json.stderr, "", "lint --json repeated its findings");
    let human = cardproof(&["lint", s(&card)]);
    assert!(human.stderr.contains("error"), "{}", human.stderr);
    // An error: the error document alone.
    let missing = cardproof(&["inspect", "/nonexistent/model", "--json"]);
    assert_eq!(missing.code, 2);
    assert_eq!(
        missing.json()["error"]["kind"],
        "not_found",
        "{}",
        missing.stdout
    );
    assert_eq!(missing.stderr, "", "the error was repeated on stderr");
    let said = cardproof(&["inspect", "/nonexistent/model"]);
    assert!(
        said.stderr.contains("/nonexistent/model"),
        "{}",
        said.stderr
    );
    // A usage error found after parsing, and `check`'s findings and summary.
    let usage = Cmd::kld()
        .reference("r")
        .candidate("c")
        .args(["--vocab", "top-k", "--json"])
        .run();
    assert_eq!(usage.code, 2, "{}", usage.stderr);
    assert_eq!(usage.json()["error"]["kind"], "usage", "{}", usage.stdout);
    assert_eq!(usage.stderr, "", "the usage error was repeated on stderr");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&card, dir.path().join("README.md")).unwrap();
    let check = cardproof(&["check", s(dir.path()), "--json"]);
    assert_eq!(check.code, 1, "{}", check.stderr);
    assert_eq!(check.stderr, "", "check --json repeated its findings");
    let check = cardproof(&["check", s(dir.path())]);
    assert!(
        check.stderr.contains("(local, before upload)"),
        "{}",
        check.stderr
    );
}

/// `cmd` run with plain progress lines on stderr (`CARDPROOF_PROGRESS=plain`).
fn with_plain_progress(cmd: Cmd) -> Run {
    cmd.env("CARDPROOF_PROGRESS", "plain").run()
}

#[test]
fn progress_names_each_stage_and_counts_windows_only_where_there_are_some() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let text = short_text(t, 2500);
    let reference = model("shakespeare-bf16");
    let m = with_plain_progress(
        Cmd::measure()
            .reference(&reference)
            .candidate(model("shakespeare-w8a16"))
            .eval_text(&text)
            .context_length(128)
            .bootstrap(10)
            .out(t.join("m"))
            .arg("--json"),
    );
    assert_eq!(m.code, 0, "{}", m.stderr);
    let windows = m.json()["runs"][0]["n_windows"].clone();
    assert!(m.stderr.contains("progress: tokenizing\n"), "{}", m.stderr);
    assert!(
        m.stderr.contains(&format!(
            "progress: measuring {windows}/{windows} windows\n"
        )),
        "{windows}: {}",
        m.stderr
    );
    assert!(!m.stderr.contains(" 0/0 "), "{}", m.stderr);
    // `reference export` shows its progress too, like measure.
    let e = with_plain_progress(
        Cmd::reference_export()
            .flag("--model", &reference)
            .eval_text(&text)
            .context_length(128)
            .out(t.join("ref.safetensors")),
    );
    assert_eq!(e.code, 0, "{}", e.stderr);
    assert!(
        e.stderr.contains("progress: loading the reference\n"),
        "{}",
        e.stderr
    );
    assert!(
        e.stderr.contains(&format!(
            "progress: exporting {windows}/{windows} windows\n"
        )),
        "{}",
        e.stderr
    );
    let l = with_plain_progress(
        Cmd::reference_export()
            .flag("--model", &reference)
            .eval_text(&text)
            .context_length(128)
            .flag("--kind", "llamacpp")
            .out(t.join("ref.kld")),
    );
    assert_eq!(l.code, 0, "{}", l.stderr);
    assert!(
        l.stderr.contains(&format!(
            "progress: exporting {windows}/{windows} windows\n"
        )),
        "{}",
        l.stderr
    );
}
