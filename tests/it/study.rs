//! `cardproof study` through the CLI (issue #20): a study of the examples on a short text, every
//! arm's numbers equal to the single `measure` of that pair, the controls, the comparisons, the
//! signed documents, and the refusals.

use std::path::{Path, PathBuf};

use crate::support::*;

/// A study file in `dir` over the example models and a short text, with `arms` (YAML flow
/// mappings) and `extra` top-level YAML.
fn study_file(dir: &Path, arms: &[&str], extra: &str) -> PathBuf {
    let text = short_text(dir, 3000);
    let models = repo_root().join("examples/models");
    let mut yaml = format!(
        "study: cardproof/study-v1\nname: test\nreference: {}\neval: {{text: {}}}\nprotocol: {{context_lengths: [128], resamples: 200}}\n{extra}arms:\n",
        models.join("shakespeare-bf16").display(),
        text.display()
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
    let r = cardproof(&[
        "verify",
        candidate.to_str().unwrap(),
        "--reference",
        models.join("shakespeare-bf16").to_str().unwrap(),
        "--eval-text",
        text.to_str().unwrap(),
        "--key",
        keys.join("cardproof.key").to_str().unwrap(),
        "--out",
        dir.path().join("verified").to_str().unwrap(),
        "--json",
    ]);
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

/// The study file's committed schema is the type's, and the example study validates against it
/// (rerun with CARDPROOF_BLESS=1 after changing the type).
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
    for name in ["shakespeare.yaml", "shakespeare-llamacpp.yaml"] {
        let example = repo_root().join("examples/studies").join(name);
        let study = cardproof::study::file::Study::read(&example).unwrap();
        let value = serde_json::to_value(&study.file).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}");
        cardproof::study::plan::plan(&study).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
