//! `cardproof study` through the CLI (issue #20): a study of the examples on a short text, every
//! arm's numbers equal to the single `measure` of that pair, the controls, the comparisons, the
//! signed documents, and the refusals.

use std::path::{Path, PathBuf};

use crate::support::*;

/// A study file in `dir` over the example models and a short text, with `arms` (YAML flow
/// mappings) and `extra` top-level YAML.
fn study_file(dir: &Path, arms: &[&str], extra: &str) -> PathBuf {
    short_text(dir, 3000);
    let models = repo_root().join("examples/models");
    let mut yaml = format!(
        "study: cardproof/study-v1\nname: test\nreference: {}\neval: {{text: eval.txt}}\nprotocol: {{context_lengths: [128], resamples: 200}}\n{extra}arms:\n",
        models.join("shakespeare-bf16").display(),
    );
    for a in arms {
        yaml.push_str(&format!("  - {a}\n"));
    }
    let path = dir.join("study.yaml");
    std::fs::write(&path, yaml.replace("MODELS", &models.display().to_string())).unwrap();
    path
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn every_arm_equals_the_single_measure_of_its_pair() {
    let dir = tempfile::tempdir().unwrap();
    let study = study_file(
        dir.path(),
        &[
            "{name: w8a16, candidate: MODELS/shakespeare-w8a16, changes: weights}",
            "{name: q4_0-gguf, candidate: MODELS/shakespeare-q4_0-gguf, changes: weights}",
            "{name: kv-q8_0, kv_cache: q8_0, changes: kv_cache}",
        ],
        "",
    );
    let keys = dir.path().join("keys");
    cardproof(&["keygen", "--out", keys.to_str().unwrap()]);
    let out = dir.path().join("out");
    let r = cardproof(&[
        "study",
        study.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--key",
        keys.join("cardproof.key").to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc = r.json();
    assert_eq!(doc, json(&out.join("study.json")));
    crate::output_schemas::assert_valid("study", "study.json", &doc);
    let names: Vec<&str> = doc["arms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "w8a16",
            "q4_0-gguf",
            "kv-q8_0",
            "control-repeat",
            "control-kernel"
        ]
    );

    // Each arm's numbers are the single measurement's, exactly.
    let models = repo_root().join("examples/models");
    let text = dir.path().join("eval.txt");
    for (arm, candidate, extra) in [
        ("w8a16", "shakespeare-w8a16", &[][..]),
        ("q4_0-gguf", "shakespeare-q4_0-gguf", &[][..]),
        ("kv-q8_0", "shakespeare-bf16", &["--kv-cache", "q8_0"][..]),
    ] {
        let single = dir.path().join(format!("single-{arm}"));
        let r = measure_short(&models.join(candidate), &text, &single, "200", extra);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let m = json(&single.join("measurement.json"));
        let a = json(&out.join(format!("arms/{arm}/measurement.json")));
        assert_eq!(a["protocol_sha256"], m["protocol_sha256"], "{arm}");
        assert_eq!(a["eval"]["tokens_sha256"], m["eval"]["tokens_sha256"]);
        for key in ["metrics", "uncertainty", "diagnostics", "n_positions"] {
            assert_eq!(a["runs"][0][key], m["runs"][0][key], "{arm}: {key}");
        }
        let listed = doc["arms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == arm)
            .unwrap();
        assert_eq!(
            listed["runs"][0]["metrics"], m["runs"][0]["metrics"],
            "{arm}"
        );
        // The rows too: the arm's positions file is the single run's.
        assert_eq!(
            std::fs::read(out.join(format!("arms/{arm}/positions.safetensors"))).unwrap(),
            std::fs::read(single.join("positions.safetensors")).unwrap(),
            "{arm}"
        );
    }

    // The controls: the baseline again is exactly 0; f64 compute is a floor far below every arm.
    let arm = |name: &str| {
        doc["arms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(arm("control-repeat")["runs"][0]["metrics"]["kld_mean"], 0.0);
    assert_eq!(arm("control-repeat")["kind"], "repeatability");
    let floor = arm("control-kernel")["runs"][0]["metrics"]["kld_mean"]
        .as_f64()
        .unwrap();
    assert!(floor < 1e-8, "{floor}");
    assert_eq!(arm("control-kernel")["settings"]["compute_dtype"], "f64");
    // Bits per weight from the headers: the quants below the reference's 16.
    let bits = |name: &str| arm(name)["bits_per_weight"].as_f64().unwrap();
    assert!(bits("q4_0-gguf") < bits("w8a16") && bits("w8a16") < 16.0);

    // Comparisons between the study's own arms, every pair, with the verdict the interval gives.
    let pairs = doc["comparisons"].as_array().unwrap();
    assert_eq!(pairs.len(), 3);
    for p in pairs {
        let (lo, hi) = (
            p["ci95"][0].as_f64().unwrap(),
            p["ci95"][1].as_f64().unwrap(),
        );
        let want = if hi < 0.0 {
            "closer"
        } else if lo > 0.0 {
            "farther"
        } else {
            "not_distinguishable"
        };
        assert_eq!(p["verdict"], want, "{p}");
        assert!(p["mde"].as_f64().unwrap() > 0.0);
    }
    let w_vs_q = pairs
        .iter()
        .find(|p| p["a"] == "w8a16" && p["b"] == "q4_0-gguf")
        .unwrap();
    assert_eq!(w_vs_q["verdict"], "closer");

    // The documents: the page has its four plots and no script; the envelope verifies.
    let html = std::fs::read_to_string(out.join("study.html")).unwrap();
    assert_eq!(html.matches("<svg").count(), 4, "four plots");
    assert!(!html.contains("<script") && !html.contains("src=\"http"));
    let md = std::fs::read_to_string(out.join("study.md")).unwrap();
    assert!(md.contains("| `w8a16` |") && md.contains("closer"), "{md}");
    let r = cardproof(&[
        "verify-report",
        out.join("study.dsse.json").to_str().unwrap(),
        "--pub",
        keys.join("cardproof.pub").to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);

    // A card from the study: the arm's claims, the study's table of arms in the section; it
    // lints clean and verify reproduces it (the arm's numbers are its single measurement's).
    let candidate = dir.path().join("candidate");
    copy_model("shakespeare-w8a16", &candidate);
    let r = cardproof(&[
        "card",
        "--study",
        out.join("study.json").to_str().unwrap(),
        "--arm",
        "w8a16",
        "--into",
        candidate.join("README.md").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let card = std::fs::read_to_string(candidate.join("README.md")).unwrap();
    assert!(card.contains("**Among the study's arms**"), "{card}");
    assert!(card.contains("| **w8a16** | weights |"), "{card}");
    let lint = cardproof(&["lint", candidate.to_str().unwrap()]);
    assert_eq!(lint.code, 0, "{}", lint.stderr);
    let r = Cmd::verify(&candidate)
        .reference(models.join("shakespeare-bf16"))
        .eval_text(&text)
        .key(keys.join("cardproof.key"))
        .out(dir.path().join("verified"))
        .arg("--json")
        .run();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.json()["verdict"], "reproduced");
    // An arm the study does not have is named with the ones it has.
    let r = cardproof(&[
        "card",
        "--study",
        out.join("study.json").to_str().unwrap(),
        "--arm",
        "nope",
        "--into",
        candidate.join("README.md").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("it has: w8a16, q4_0-gguf"),
        "{}",
        r.stderr
    );
}

#[test]
fn an_arm_that_changes_more_than_it_says_is_refused_or_marked_mixed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = |study: &Path| {
        cardproof(&[
            "study",
            study.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
    };
    let study = study_file(
        dir.path(),
        &["{name: both, candidate: MODELS/shakespeare-w8a16, kv_cache: q8_0, changes: weights}"],
        "controls: {repeatability: false, noise_floor: false}\n",
    );
    let r = run(&study);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("arm `both` says it changes weights but changes weights and kv_cache"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("arms[0].changes"), "{}", r.stderr);
    assert!(!out.exists(), "nothing written");
    let study = study_file(
        dir.path(),
        &["{name: nothing, candidate: MODELS/shakespeare-bf16, changes: kv_cache}"],
        "",
    );
    let r = run(&study);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("changes nothing"), "{}", r.stderr);

    // Bad files: one error naming the file, the field and its line.
    for (yaml, needle) in [
        (
            "study: cardproof/study-v9\n",
            "study: is `cardproof/study-v9`",
        ),
        (
            "study: cardproof/study-v1\nreference: x\neval: {text: t}\nprotocol: {context_lengths: [128]}\narms:\n  - {name: a, changes: weights, colour: red}\n",
            "unknown field `colour`",
        ),
        (
            "study: cardproof/study-v1\nreference: x\neval: {text: t}\nprotocol: {context_lengths: [1]}\narms:\n  - {name: a, changes: none}\n",
            "protocol.context_lengths[0]",
        ),
        (
            "study: cardproof/study-v1\nreference: x\neval: {text: t}\nprotocol: {context_lengths: [128]}\narms:\n  - {name: ../up, changes: none}\n",
            "is not a name",
        ),
        (
            "study: cardproof/study-v1\nreference: x\neval: {text: t}\nprotocol: {context_lengths: [128]}\narms:\n  - {name: a, changes: none}\n  - {name: a, changes: none}\n",
            "`a` names two arms",
        ),
        ("study: [\n", "not a YAML study file"),
    ] {
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, yaml).unwrap();
        let r = run(&path);
        assert_eq!(r.code, 2, "{yaml}: {}", r.stderr);
        assert!(
            r.stderr.contains(needle) && r.stderr.contains("bad.yaml"),
            "{needle}: {}",
            r.stderr
        );
    }
    // The unknown field is placed at its line.
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "study: cardproof/study-v1\nreference: x\neval: {text: t}\nprotocol: {context_lengths: [128]}\narms:\n  - {name: a, changes: weights, colour: red}\n",
    )
    .unwrap();
    let r = run(&path);
    assert!(r.stderr.contains("bad.yaml:6:"), "{}", r.stderr);
}

/// The study file's committed schema is the type's, and the example studies validate against it
/// and plan (rerun with CARDPROOF_BLESS=1 after changing the type).
#[test]
fn the_study_file_schema_is_committed_and_the_examples_follow_it() {
    let path = repo_root().join("schema/study-file-v1.schema.json");
    let schema = cardproof::study::file::json_schema();
    let text = cardproof::schema::text(&schema);
    if std::env::var_os("CARDPROOF_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&path).ok().as_deref(),
        Some(text.as_str()),
        "schema/study-file-v1.schema.json is out of date; rerun with CARDPROOF_BLESS=1"
    );
    let validator = jsonschema::validator_for(&schema).unwrap();
    for name in [
        "shakespeare.yaml",
        "shakespeare-llamacpp.yaml",
        "stagehand.yaml",
        "stagehand-llamacpp.yaml",
    ] {
        let example = repo_root().join("examples/studies").join(name);
        let study = cardproof::study::file::Study::read(&example).unwrap();
        let value = serde_json::to_value(&study.file).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
        cardproof::study::plan::plan(&study, Some(1)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// `study` with `args` (the study file first), from the repository root.
fn study_run(args: &[&str]) -> Run {
    let mut all = vec!["study"];
    all.extend_from_slice(args);
    cardproof(&all)
}

/// The signed statement inside an envelope (not verified here: the CLI verifies).
fn statement(envelope: &Path) -> serde_json::Value {
    use base64::Engine as _;
    let e = json(envelope);
    let payload = base64::engine::general_purpose::STANDARD
        .decode(e["payload"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&payload).unwrap()
}

/// A study's envelope carried the verification report's predicate type, `verify-report
/// --checkpoint` on it said something misleading, and nothing checked its subjects. It is a
/// study's statement now (`https://cardproof.dev/study/v1`), its subjects the study file and
/// every file of the reference and of each arm's own candidate, which `verify-report --study
/// FILE` compares; `--checkpoint` on it is refused, saying how to check it; and its set's files
/// (study.md, study.html, each arm's measurement) are bound like a report's.
#[test]
fn a_signed_study_binds_its_subjects_and_every_file_of_its_set() {
    let dir = tempfile::tempdir().unwrap();
    let candidate = dir.path().join("w8");
    copy_model("shakespeare-w8a16", &candidate);
    let study = study_file(
        dir.path(),
        &[
            &format!(
                "{{name: w8, candidate: {}, changes: weights}}",
                candidate.display()
            ),
            "{name: kv, kv_cache: q8_0, changes: kv_cache}",
        ],
        "controls: {repeatability: false, noise_floor: false}\n",
    );
    let keys = dir.path().join("keys");
    cardproof(&["keygen", "--out", keys.to_str().unwrap()]);
    let public = keys.join("cardproof.pub");
    let out = dir.path().join("out");
    let r = study_run(&[
        study.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--key",
        keys.join("cardproof.key").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let envelope = out.join("study.dsse.json");
    let s = statement(&envelope);
    assert_eq!(s["predicateType"], "https://cardproof.dev/study/v1");
    let names: Vec<&str> = s["subject"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "study:study.yaml");
    for name in [
        "reference:model.safetensors",
        "reference:config.json",
        "arm:w8:model.safetensors",
        "arm:w8:tokenizer.json",
    ] {
        assert!(names.contains(&name), "{name}: {names:?}");
    }
    assert!(
        !names.iter().any(|n| n.starts_with("arm:kv:")),
        "an arm on the reference's weights has no files of its own: {names:?}"
    );
    let study_json = json(&out.join("study.json"));
    assert_eq!(s["predicate"], study_json);
    let listed: Vec<&str> = study_json["set_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            "arms/kv/measurement.json",
            "arms/kv/positions.safetensors",
            "arms/w8/measurement.json",
            "arms/w8/positions.safetensors",
            "study.html",
            "study.md"
        ]
    );

    let check = |extra: &[&str]| {
        let mut args = vec![
            "verify-report",
            envelope.to_str().unwrap(),
            "--pub",
            public.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        cardproof(&args)
    };
    let ok = check(&["--study", study.to_str().unwrap()]);
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    assert!(
        ok.stdout.contains(&format!(
            "every subject matches {} and the checkpoints it names",
            study.display()
        )),
        "{}",
        ok.stdout
    );
    // --checkpoint on a study: one clear refusal, saying how to check it.
    let r = check(&["--checkpoint", candidate.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("is a signed study") && r.stderr.contains("--study STUDY_FILE"),
        "{}",
        r.stderr
    );
    // An arm's checkpoint changed after the study: named by its subject.
    std::fs::write(candidate.join("generation_config.json"), "{}").unwrap();
    let r = check(&["--study", study.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout.contains("`arm:w8:generation_config.json` changed"),
        "{}",
        r.stdout
    );
    copy_model("shakespeare-w8a16", &candidate);
    // The study file edited after the study.
    let text = std::fs::read_to_string(&study).unwrap();
    std::fs::write(&study, format!("{text}# edited\n")).unwrap();
    let r = check(&["--study", study.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout.contains("`study:study.yaml` changed"),
        "{}",
        r.stdout
    );
    std::fs::write(&study, &text).unwrap();
    // A rendering rewritten after signing (the marker recomputed or not): caught by name.
    let md = out.join("study.md");
    let page = std::fs::read_to_string(&md).unwrap();
    std::fs::write(&md, page.replace("closer", "farther")).unwrap();
    let r = check(&["--study", study.to_str().unwrap()]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout
            .contains(&format!("set: {} changed after signing", md.display())),
        "{}",
        r.stdout
    );
    std::fs::write(&md, &page).unwrap();
    assert_eq!(check(&["--study", study.to_str().unwrap()]).code, 0);
    // --study with another statement (an arm's measurement, signed) is refused, saying so.
    let m = dir.path().join("m.json");
    std::fs::copy(out.join("arms/w8/measurement.json"), &m).unwrap();
    let r = cardproof(&[
        "sign",
        m.to_str().unwrap(),
        "--checkpoint",
        candidate.to_str().unwrap(),
        "--key",
        keys.join("cardproof.key").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cardproof(&[
        "verify-report",
        dir.path().join("m.dsse.json").to_str().unwrap(),
        "--pub",
        public.to_str().unwrap(),
        "--study",
        study.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("is not a signed study"), "{}", r.stderr);
}

/// An arm whose candidate is a byte-identical copy of the reference was accepted as a `weights`
/// arm (paths compared) and compared as "closer": checkpoints are compared by digest, so it
/// changes nothing and is refused, naming its line.
#[test]
fn an_arm_on_a_copy_of_the_reference_changes_no_weights() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("copy");
    copy_model("shakespeare-bf16", &copy);
    let study = study_file(
        dir.path(),
        &[&format!(
            "{{name: copy, candidate: {}, changes: weights}}",
            copy.display()
        )],
        "",
    );
    let out = dir.path().join("out");
    let r = study_run(&[study.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!("{}:7:", study.display()))
            && r.stderr.contains(
                "arms[0].changes: arm `copy` says it changes weights but changes nothing against \
                 the baseline (its candidate's files are the reference's, byte for byte)"
            ),
        "{}",
        r.stderr
    );
    assert!(!out.exists());
}

/// `llamacpp: {binary: ./evil.sh}` or `transformers: {python: /abs/evil.sh}` in a study file ran
/// that program when the study was planned. A study file is data: it never names a program (the
/// field is refused, naming it, its line and the flag to use), and nothing runs.
#[cfg(unix)]
#[test]
fn a_study_file_never_chooses_the_program_that_runs() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let evil = dir.path().join("evil.sh");
    std::fs::write(
        &evil,
        format!(
            "#!/bin/sh\ntouch {}\necho 'version: 1 (x)'\n",
            ran.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = dir.path().join("out");
    for (block, field, flag) in [
        (
            "runner: llamacpp\nllamacpp: {binary: ./evil.sh}\n",
            "llamacpp.binary",
            "--llamacpp-bin PATH or CARDPROOF_LLAMACPP_BIN",
        ),
        (
            "runner: llamacpp\nllamacpp: {server: ./evil.sh}\n",
            "llamacpp.server",
            "--llamacpp-server PATH",
        ),
        (
            &*format!(
                "runner: transformers\ntransformers: {{python: {}}}\n",
                evil.display()
            ),
            "transformers.python",
            "--python PATH or CARDPROOF_PYTHON",
        ),
    ] {
        let study = study_file(
            dir.path(),
            &["{name: kv, kv_cache: q8_0, changes: kv_cache}"],
            block,
        );
        let r = study_run(&[study.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert_eq!(r.code, 2, "{field}: {}", r.stderr);
        assert!(
            r.stderr.contains(&format!("{}:7:", study.display()))
                && r.stderr.contains(&format!(
                    "{field}: a study file does not choose the program"
                ))
                && r.stderr.contains(flag),
            "{field}: {}",
            r.stderr
        );
        assert!(!ran.exists(), "{field}: the file's program ran");
        assert!(!out.exists());
    }
}

/// `study --llamacpp-bin` given a relative path resolved it against the study file's directory,
/// so a program beside a downloaded study file ran instead of the user's: it is resolved against
/// the working directory, where the user typed it.
#[cfg(unix)]
#[test]
fn a_relative_llamacpp_bin_is_the_working_directory_s() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let studies = dir.path().join("studies");
    std::fs::create_dir_all(studies.join("bin")).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let ran = dir.path().join("ran");
    let planted = studies.join("bin/llama-perplexity");
    std::fs::write(&planted, format!("#!/bin/sh\ntouch {}\n", ran.display())).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(
        repo_root().join("examples/data/eval.txt"),
        studies.join("eval.txt"),
    )
    .unwrap();
    let models = repo_root().join("examples/models");
    let study = studies.join("s.yaml");
    std::fs::write(
        &study,
        format!(
            "study: cardproof/study-v1\nreference: {m}/shakespeare-bf16-gguf\neval: {{text: eval.txt}}\nprotocol: {{context_lengths: [256]}}\nrunner: llamacpp\narms:\n  - {{name: q4, candidate: {m}/shakespeare-q4_0-gguf-llamacpp, changes: weights}}\n",
            m = models.display()
        ),
    )
    .unwrap();
    let r = crate::support::cardproof_in(
        &work,
        &[
            "study",
            study.to_str().unwrap(),
            "--llamacpp-bin",
            "bin/llama-perplexity",
            "--out",
            dir.path().join("out").to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "{}: no such file",
            work.join("bin/llama-perplexity").display()
        )),
        "{}",
        r.stderr
    );
    assert!(!ran.exists(), "the program beside the study file ran");
}

/// A study's eval text could be `/proc/self/environ`: read, digested, signed, and recoverable
/// from the rows each arm writes. What a study file makes cardproof read as data (its eval text
/// and chat template) must be inside its directory (no absolute path, `..` or link out of it),
/// as for a card, unless the user names it with `--eval-text`/`--chat-template`; a checkpoint it
/// names may be anywhere, but must be a checkpoint. Each refusal names the field and its line.
#[test]
fn a_study_file_cannot_make_cardproof_read_files_outside_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let study = study_file(
        dir.path(),
        &["{name: kv, kv_cache: q8_0, changes: kv_cache}"],
        "",
    );
    let base = std::fs::read_to_string(&study).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "a secret").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        dir.path().join("link.txt"),
    )
    .unwrap();
    let mut cases = vec![
        (
            base.replace("{text: eval.txt}", "{text: /proc/self/environ}"),
            "4:",
            "eval.text: `/proc/self/environ` is not a path inside the study file's directory",
        ),
        (
            base.replace(
                "{text: eval.txt}",
                &format!(
                    "{{text: ../{}/secret.txt}}",
                    outside.path().file_name().unwrap().to_string_lossy()
                ),
            ),
            "4:",
            "is not a path inside the study file's directory",
        ),
        (
            base.replace(
                "{text: eval.txt}",
                "{text: eval.txt, chat_template: /etc/passwd}",
            ),
            "4:",
            "eval.chat_template: `/etc/passwd` is not a path inside",
        ),
        (
            base.replace(
                &format!(
                    "reference: {}",
                    repo_root()
                        .join("examples/models/shakespeare-bf16")
                        .display()
                ),
                "reference: /proc/self/environ",
            ),
            "3:",
            "reference: `/proc/self/environ` is not a checkpoint",
        ),
    ];
    if cfg!(unix) {
        cases.push((
            base.replace("{text: eval.txt}", "{text: link.txt}"),
            "4:",
            "resolves (through a link) outside the study file's directory",
        ));
    }
    for (yaml, line, needle) in cases {
        std::fs::write(&study, &yaml).unwrap();
        let r = study_run(&[study.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert_eq!(r.code, 2, "{needle}: {}", r.stderr);
        assert!(
            r.stderr.contains(&format!("{}:{line}", study.display())) && r.stderr.contains(needle),
            "{needle}: {}",
            r.stderr
        );
        assert!(!out.exists());
    }
    // The user's own flag names a text anywhere: the study goes past it (to its refused arm).
    std::fs::write(
        &study,
        base.replace("{text: eval.txt}", "{text: /proc/self/environ}")
            .replace(
                "kv_cache: q8_0, changes: kv_cache",
                "kv_cache: q8_0, changes: weights",
            ),
    )
    .unwrap();
    let elsewhere = outside.path().join("eval.txt");
    std::fs::copy(dir.path().join("eval.txt"), &elsewhere).unwrap();
    let r = study_run(&[
        study.to_str().unwrap(),
        "--eval-text",
        elsewhere.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("arms[0].changes"), "{}", r.stderr);
}

/// Rerunning a study into its own output was refused ("holds `arms`") unless `--force`, which
/// deletes whatever is there: a study's set (study.json and its renderings and envelope, the
/// arms' measurement directories) is recognized and replaced as a unit, as `measure`'s is;
/// anything else in it is still refused without `--force`.
#[test]
fn a_study_rerun_into_its_own_output_replaces_it_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let study = study_file(
        dir.path(),
        &["{name: kv, kv_cache: q8_0, changes: kv_cache}"],
        "controls: {repeatability: false, noise_floor: false}\n",
    );
    let out = dir.path().join("out");
    let run = || study_run(&[study.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let r = run();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let first = json(&out.join("study.json"))["run_id"].clone();
    let r = run();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let second = json(&out.join("study.json"))["run_id"].clone();
    assert_ne!(first, second, "replaced by the new run");
    assert_eq!(
        json(&out.join("arms/kv/measurement.json"))["run_id"],
        second
    );
    // Something that is not the study's is still the user's.
    std::fs::write(out.join("arms/kv/notes.txt"), "mine").unwrap();
    let r = run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("holds `arms/kv/notes.txt`") && r.stderr.contains("--force"),
        "{}",
        r.stderr
    );
    assert!(out.join("arms/kv/notes.txt").exists());
}

/// `--resume` takes only an interrupted study's incomplete set: nothing there, or a complete
/// set, is refused before any work and leaves `--out` as it was; a native study has no carried
/// arms to take.
#[test]
fn resume_is_refused_where_no_interrupted_study_is() {
    let dir = tempfile::tempdir().unwrap();
    let study = study_file(
        dir.path(),
        &["{name: kv, kv_cache: q8_0, changes: kv_cache}"],
        "controls: {repeatability: false, noise_floor: false}\n",
    );
    let out = dir.path().join("out");
    let resume = || {
        study_run(&[
            study.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--resume",
        ])
    };
    let r = resume();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("there is nothing to resume"),
        "{}",
        r.stderr
    );
    assert!(!out.exists());
    let r = study_run(&[study.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let before = std::fs::read(out.join("study.json")).unwrap();
    let r = resume();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("holds a complete set"), "{}", r.stderr);
    assert_eq!(std::fs::read(out.join("study.json")).unwrap(), before);
    let r = study_run(&[study.to_str().unwrap(), "--resume", "--force"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
}

/// A study's refusal of an arm that changes more than it says gave `line: null`: every error
/// about the study file names its line, in the JSON error document too.
#[test]
fn every_study_error_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let study = study_file(
        dir.path(),
        &[
            "{name: ok, kv_cache: q8_0, changes: kv_cache}",
            "{name: both, candidate: MODELS/shakespeare-w8a16, kv_cache: q8_0, changes: weights}",
        ],
        "",
    );
    let r = study_run(&[
        study.to_str().unwrap(),
        "--out",
        dir.path().join("out").to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    let e = &r.json()["error"];
    assert_eq!(e["line"], 8, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("arms[1].changes: arm `both` says it changes weights"),
        "{e}"
    );
    // A field that is absent is placed at what holds it; a bad setting at its own line.
    for (arms, line, needle) in [
        (
            &["{name: a, kv_cache: q9_9, changes: kv_cache}"][..],
            7,
            "arms[0].kv_cache",
        ),
        (
            &["{name: a, candidate: nowhere, changes: weights}"][..],
            7,
            "arms[0].candidate",
        ),
        (
            &["{name: a, gdn_kernel: torch, changes: kernel}"][..],
            7,
            "arms[0].gdn_kernel: the Gated DeltaNet kernel is the transformers runner's setting",
        ),
    ] {
        let study = study_file(dir.path(), arms, "");
        let r = study_run(&[
            study.to_str().unwrap(),
            "--out",
            dir.path().join("out").to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(r.code, 2, "{}", r.stdout);
        let e = &r.json()["error"];
        assert_eq!(e["line"], line, "{needle}: {e}");
        assert!(e["message"].as_str().unwrap().contains(needle), "{e}");
    }
}

/// The example studies name copies of the examples' data beside them (a study file's data is
/// inside its directory): the eval text, the tool-calling conversations and the chat template;
/// each copy stays the original, byte for byte.
#[test]
fn the_example_studies_eval_text_is_the_examples() {
    for name in ["eval.txt", "tool-calls.jsonl", "chat_template.jinja"] {
        assert_eq!(
            std::fs::read(repo_root().join("examples/studies").join(name)).unwrap(),
            std::fs::read(repo_root().join("examples/data").join(name)).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn a_recurrent_state_arm_is_refused_on_one_pass_windows_and_measured_at_prefill_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let hybrid = repo_root().join("tests/fixtures/hybrid");
    std::fs::copy(hybrid.join("eval.txt"), dir.path().join("eval.txt")).unwrap();
    let write = |protocol: &str| {
        let yaml = format!(
            "study: cardproof/study-v1\nname: state\nreference: {}\neval: {{text: eval.txt}}\nprotocol: {{context_lengths: [128], resamples: 100{protocol}}}\ncontrols: {{repeatability: false, noise_floor: false}}\narms:\n  - {{name: state-bf16, recurrent_state: bf16, changes: recurrent_state}}\n",
            hybrid.join("qwen3_5_text").display()
        );
        let path = dir.path().join("study.yaml");
        std::fs::write(&path, yaml).unwrap();
        path
    };
    let out = dir.path().join("out");
    let study = write("");
    let r = study_run(&[study.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("arms[0].recurrent_state"), "{}", r.stderr);
    assert!(r.stderr.contains("would change nothing"), "{}", r.stderr);
    assert!(!out.join("study.json").exists());
    // A chunk out of range is the study file's error at its place, before any work.
    let study = write(", prefill_chunk: 0");
    let r = study_run(&[study.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("protocol.prefill_chunk: prefill chunk 0 is not 1 to 1048576 tokens"),
        "{}",
        r.stderr
    );
    assert!(!out.exists());
    let study = write(", prefill_chunk: 32");
    let r = study_run(&[study.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let doc = json(&out.join("study.json"));
    assert_eq!(doc["protocol"]["prefill_chunk"], 32, "{}", doc["protocol"]);
    let arm = &doc["arms"][0];
    assert_eq!(arm["settings"]["recurrent_state"], "bf16");
    let kld = arm["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap();
    assert!(kld > 0.0, "the bf16 state moves the arm: {kld}");
}
