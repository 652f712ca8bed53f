//! A repository of many quant files under one card (`fidelity.files`): written file by file with
//! `card --measurement`, linted and verified per file, checked with each file's signed report.

use std::path::Path;

use crate::support::{Cmd, Run, cardproof, model};

fn ok(r: &Run, what: &str) {
    assert_eq!(r.code, 0, "{what}: {}\n{}", r.stderr, r.stdout);
}

/// Measure `file` of `repo` and write it into the card beside it.
fn measure_into_card(repo: &Path, file: &str, text: &Path, work: &Path, extra: &[&str]) {
    let m = work.join(format!("m-{file}"));
    let r = crate::support::measure_short(&repo.join(file), text, &m, "100", extra);
    ok(&r, &format!("measure {file}"));
    let method = file
        .trim_start_matches("shakespeare-")
        .trim_end_matches(".gguf")
        .to_ascii_lowercase();
    let method = method.trim_end_matches("-copy");
    let r = cardproof(&[
        "card",
        "--measurement",
        m.join("measurement.json").to_str().unwrap(),
        "--quantization",
        method,
        "--calibration",
        "none",
        "--reference-repo",
        "org/shakespeare",
        "--reference-revision",
        "1111111111111111111111111111111111111111",
        "--candidate-repo",
        "org/shakespeare-GGUF",
    ]);
    ok(&r, &format!("card {file}"));
}

/// The done criterion of a card for a GGUF repository: ten quant files, each measured and added
/// to one card by `card --measurement` (the first makes a card for one file, the second turns it
/// into a card listing both, the rest are appended); the card lints clean against the ten
/// files, `verify` of the directory reruns each file into its own signed set and reproduces
/// every claim, `verify --file` reruns one; the report sets published beside the weights check
/// clean, and a file measured later leaves the earlier files' reports standing.
#[test]
fn a_ten_file_gguf_repo_card_lints_and_verifies_per_file() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let repo = w.join("repo");
    let files = crate::fixtures::gguf_quant_repo(&repo);
    assert_eq!(files.len(), 10);
    let text = crate::support::short_text(w, 1500);
    for file in &files {
        measure_into_card(&repo, file, &text, w, &[]);
    }
    let card = std::fs::read_to_string(repo.join("README.md")).unwrap();
    assert_eq!(card.matches("  - file: shakespeare-").count(), 10, "{card}");
    assert!(!card.contains("model-index"), "{card}");
    // The readable section has one row per file.
    for file in &files {
        assert!(
            card.contains(&format!("| {} |", file.replace('_', "\\_"))),
            "{file}\n{card}"
        );
    }

    let lint = cardproof(&["lint", repo.to_str().unwrap(), "--json"]);
    assert_eq!(lint.code, 0, "{}", lint.stdout);
    assert_eq!(errors(&lint), 0, "{}", lint.stdout);

    let keys = w.join("keys");
    ok(
        &cardproof(&["keygen", "--out", keys.to_str().unwrap()]),
        "keygen",
    );
    let key = keys.join("cardproof.key");
    let verify = |out: &Path| {
        Cmd::verify(&repo)
            .reference(model("shakespeare-bf16"))
            .eval_text(&text)
            .key(&key)
            .out(out)
    };
    let out = w.join("reports");
    let r = verify(&out).arg("--json").run();
    let summary = r.json();
    let listed = summary["files"].as_array().unwrap();
    assert_eq!(listed.len(), 10);
    for (entry, file) in listed.iter().zip(&files) {
        assert_eq!(entry["file"], file.as_str());
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(file).join("report.json")).unwrap())
                .unwrap();
        assert_eq!(
            entry["verdict"], "reproduced",
            "{file}: {:#}",
            report["claims"]
        );
        assert_eq!(report["checkpoint"]["files"][0]["path"], file.as_str());
        assert_eq!(
            report["card"]["disclosure"]["candidate"]["file"],
            file.as_str()
        );
        assert!(out.join(file).join("report.dsse.json").is_file());
    }
    assert_eq!(summary["verdict"], "reproduced", "{summary:#}");
    assert_eq!(r.code, 0, "{}", r.stderr);

    // One file by name.
    let one = w.join("one");
    let r = verify(&one)
        .arg("--file")
        .arg(&files[7])
        .arg("--json")
        .run();
    ok(&r, "verify --file");
    assert_eq!(r.json()["verdict"], "reproduced");
    assert_eq!(
        r.json()["card"]["disclosure"]["candidate"]["file"],
        files[7].as_str()
    );
    let r = verify(&w.join("none"))
        .arg("--file")
        .arg("absent.gguf")
        .run();
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.message().contains("lists no file `absent.gguf`"),
        "{}",
        r.message()
    );

    // Published beside the weights: every report judged against its own file and card entry.
    crate::support::copy_tree(&out, &repo.join("reports"));
    let public = keys.join("cardproof.pub");
    let check = || {
        cardproof(&[
            "check",
            repo.to_str().unwrap(),
            "--json",
            "--pub",
            public.to_str().unwrap(),
        ])
    };
    let r = check();
    ok(&r, "check");
    let doc = r.json();
    let reports: Vec<&serde_json::Value> = doc["report"]
        .as_object()
        .into_iter()
        .map(|_| &doc["report"])
        .chain(doc["other_reports"].as_array().unwrap())
        .collect();
    assert_eq!(reports.len(), 10, "{doc:#}");
    for report in reports {
        assert_eq!(report["signature"], "verified", "{report:#}");
        assert_eq!(report["mismatches"], serde_json::json!([]), "{report:#}");
    }

    // The same repository on the Hub: each entry's digest against the Hub's per-file SHA-256,
    // every report judged against its own file.
    let server = crate::hub_server::HubServer::start();
    let cache = tempfile::tempdir().unwrap();
    server.publish(
        "org/shakespeare-GGUF",
        "main",
        "5555555555555555555555555555555555555555",
        &repo,
    );
    let r = crate::hub::run(
        &server,
        cache.path(),
        &[
            "check",
            "hf:org/shakespeare-GGUF",
            "--json",
            "--pub",
            public.to_str().unwrap(),
        ],
        &[],
    );
    ok(&r, "check hf:");
    let doc = r.json();
    assert_eq!(doc["other_reports"].as_array().unwrap().len(), 9, "{doc:#}");
    assert!(
        doc["other_reports"]
            .as_array()
            .unwrap()
            .iter()
            .chain([&doc["report"]])
            .all(|r| r["signature"] == "verified" && r["mismatches"] == serde_json::json!([])),
        "{doc:#}"
    );

    // A file measured later joins the card; the reports of the others still stand.
    let extra = "shakespeare-Q8_0-copy.gguf";
    std::fs::copy(repo.join(&files[0]), repo.join(extra)).unwrap();
    measure_into_card(&repo, extra, &text, w, &[]);
    let r = check();
    ok(&r, "check after an eleventh file");

    // A claim edited after signing: its file's report, and only its, no longer matches.
    let card = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let edited = edit_first_claim_of(&card, &files[5]);
    std::fs::write(repo.join("README.md"), &edited).unwrap();
    let r = check();
    assert_eq!(r.code, 1, "{}", r.stdout);
    let mismatched: Vec<String> = r.json()["hub_findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "hub-report-mismatch")
        .map(|f| f["message"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(mismatched.len(), 1, "{mismatched:#?}");
    assert!(mismatched[0].contains(&files[5]), "{}", mismatched[0]);
    let r = verify(&w.join("edited")).arg("--file").arg(&files[5]).run();
    assert_eq!(r.code, 1, "{}", r.stdout);
}

fn errors(lint: &Run) -> usize {
    lint.json()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] == "error")
        .count()
}

/// The ten-file repository in `w/repo` with the first two files measured into its card; the
/// files' names and the eval text.
fn two_files_carded(w: &Path) -> (std::path::PathBuf, Vec<String>, std::path::PathBuf) {
    let repo = w.join("repo");
    let files = crate::fixtures::gguf_quant_repo(&repo);
    let text = crate::support::short_text(w, 1500);
    for file in &files[..2] {
        measure_into_card(&repo, file, &text, w, &[]);
    }
    (repo, files, text)
}

/// The card with the first claimed value of `file`'s entry changed.
fn edit_first_claim_of(card: &str, file: &str) -> String {
    let at = card.find(&format!("- file: {file}")).expect("entry listed");
    let value = at + card[at..].find("value: ").expect("a claim") + "value: ".len();
    let end = value + card[value..].find([',', '}', '\n']).unwrap();
    format!("{}0.5{}", &card[..value], &card[end..])
}

/// A card listing files is refused where it names paths, names a file that is not there, or
/// leaves a GGUF beside it unlisted; `verify` of such an entry never follows the path.
#[test]
fn a_listed_file_that_is_a_path_or_absent_is_a_finding_and_never_read() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (repo, files, text) = two_files_carded(w);
    let lint = cardproof(&["lint", repo.to_str().unwrap(), "--json"]);
    let unlisted = lint.finding("unlisted-file");
    assert_eq!(unlisted["severity"], "warning");
    assert_eq!(errors(&lint), 0, "{}", lint.stdout);

    // A measurement of a whole directory does not go into a card listing files.
    let dir_m = w.join("m-dir");
    let q4 = model("shakespeare-q4_0-gguf");
    ok(
        &crate::support::measure_short(Path::new(&q4), &text, &dir_m, "100", &[]),
        "measure a directory",
    );
    let before = std::fs::read(repo.join("README.md")).unwrap();
    let r = cardproof(&[
        "card",
        "--measurement",
        dir_m.join("measurement.json").to_str().unwrap(),
        "--into",
        repo.join("README.md").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.message().contains("measure one file"), "{}", r.message());
    assert_eq!(std::fs::read(repo.join("README.md")).unwrap(), before);

    let card = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let pathy = card.replacen(
        &format!("- file: {}", files[1]),
        &format!("- file: ../repo/{}", files[1]),
        1,
    );
    std::fs::write(repo.join("README.md"), &pathy).unwrap();
    let lint = cardproof(&["lint", repo.to_str().unwrap(), "--json"]);
    assert_eq!(lint.code, 1);
    assert!(
        lint.finding("schema-violation")["message"]
            .as_str()
            .unwrap()
            .contains("not a bare file name"),
        "{}",
        lint.stdout
    );
    let r = Cmd::verify(&repo)
        .reference(model("shakespeare-bf16"))
        .eval_text(&text)
        .out(w.join("out"))
        .arg("--file")
        .arg(format!("../repo/{}", files[1]))
        .run();
    assert_eq!(r.code, 2, "{}", r.stdout);

    let absent = card.replacen(
        &format!("- file: {}", files[1]),
        "- file: shakespeare-Q2_K.gguf",
        1,
    );
    std::fs::write(repo.join("README.md"), &absent).unwrap();
    let lint = cardproof(&["lint", repo.to_str().unwrap(), "--json"]);
    assert_eq!(lint.code, 1);
    let missing = lint.finding("listed-file-missing");
    assert_eq!(missing["pointer"], "/fidelity/files/1/file");
    // `verify` of the directory refuses before the first file is rerun, naming the entry, and
    // writes nothing.
    let out = w.join("absent-out");
    let r = Cmd::verify(&repo)
        .reference(model("shakespeare-bf16"))
        .eval_text(&text)
        .out(&out)
        .run();
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.message().contains(
            "fidelity.files[1].file names `shakespeare-Q2_K.gguf`, which is not a regular file"
        ),
        "{}",
        r.message()
    );
    assert!(!r.stderr.contains("progress: measuring"), "{}", r.stderr);
    assert!(!out.exists());
}

/// `card --from-llamacpp` of the log of each file: the file the log names (beside the card) is
/// the candidate, so a second file's log adds a second entry under the one protocol.
#[test]
fn llama_cpp_logs_of_two_files_become_two_entries_of_one_card() {
    const LOG: &str = "tests/fixtures/llamacpp/q4_0-kld-c256-chunks2.log";
    const BASE: &str = "tests/fixtures/llamacpp/bf16-c256-chunks2.base";
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let repo = w.join("repo");
    let files = crate::fixtures::gguf_quant_repo(&repo);
    let log = std::fs::read_to_string(crate::support::repo_root().join(LOG)).unwrap();
    let card = repo.join("README.md");
    for file in &files[..2] {
        let named = w.join(format!("{file}.log"));
        let text = log.replace("examples/models/shakespeare-q4_0-gguf/model.gguf", file);
        assert_ne!(text, log);
        std::fs::write(&named, text).unwrap();
        let r = cardproof(&[
            "card",
            "--from-llamacpp",
            named.to_str().unwrap(),
            "--base-file",
            BASE,
            "--into",
            card.to_str().unwrap(),
        ]);
        // Written; lint names what a log cannot disclose (the reference, the text).
        assert_eq!(r.code, 1, "{}\n{}", r.stderr, r.stdout);
    }
    let text = std::fs::read_to_string(&card).unwrap();
    assert_eq!(text.matches("  - file: shakespeare-").count(), 2, "{text}");
    let sha = |f: &str| {
        let r = cardproof(&["hash", repo.join(f).to_str().unwrap(), "--json"]);
        r.json()["root_sha256"].as_str().unwrap().to_owned()
    };
    for file in &files[..2] {
        assert!(text.contains(&sha(file)), "{file}: {text}");
    }
    assert_eq!(
        text.matches("{metric: kld_mean, value: 0.09464, uncertainty: 0.013, context_length: 256")
            .count(),
        2,
        "{text}"
    );
}

/// A card listing files is stale on the Hub only when one of its files changed after the commit
/// it measured: a quant uploaded beside them later is not theirs (lint says it is unlisted).
#[test]
fn only_a_listed_file_changed_after_the_measured_commit_makes_the_card_stale() {
    const C1: &str = "6666666666666666666666666666666666666666";
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let (repo, files, _) = two_files_carded(w);
    for file in &files[2..] {
        std::fs::remove_file(repo.join(file)).unwrap();
    }
    let card = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let pinned = card.replacen(
        "    repo: org/shakespeare-GGUF\n",
        &format!("    repo: org/shakespeare-GGUF\n    revision: \"{C1}\"\n"),
        1,
    );
    assert_ne!(pinned, card);
    std::fs::write(repo.join("README.md"), pinned).unwrap();
    let server = crate::hub_server::HubServer::start();
    server.publish("org/shakespeare-GGUF", "measured", C1, &repo);
    let commit = |name: &str, change: &dyn Fn(&Path)| {
        let dir = w.join(name);
        crate::support::copy_dir(&repo, &dir);
        change(&dir);
        dir
    };
    let stale = |dir: &Path, commit: &str| -> Vec<String> {
        server.publish("org/shakespeare-GGUF", "main", commit, dir);
        let cache = tempfile::tempdir().unwrap();
        let r = crate::hub::run(
            &server,
            cache.path(),
            &["check", "hf:org/shakespeare-GGUF", "--json"],
            &[],
        );
        assert_ne!(r.code, 2, "{}{}", r.stderr, r.stdout);
        r.json()["hub_findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["code"] == "hub-candidate-revision-stale")
            .map(|f| f["message"].as_str().unwrap().to_owned())
            .collect()
    };
    let beside = commit("beside", &|d| {
        std::fs::copy(d.join(&files[0]), d.join("shakespeare-extra.gguf")).unwrap();
    });
    assert_eq!(
        stale(&beside, "7777777777777777777777777777777777777777"),
        Vec::<String>::new()
    );
    let changed = commit("changed", &|d| {
        std::fs::copy(d.join(&files[0]), d.join(&files[1])).unwrap();
    });
    let found = stale(&changed, "8888888888888888888888888888888888888888");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(&format!("`{}` changed", files[1])),
        "{found:?}"
    );
}
