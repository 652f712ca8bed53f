//! Regression tests for verdicts that cannot be fooled (issue #14): each test plays a card author
//! who wants a `reproduced` they did not earn, or an input that used to slip past a check.

use std::path::Path;

use crate::support::{Run, cardproof, model, rewrite_safetensors};
use crate::verify::Verified;

/// Replace the first line of the card containing `needle` with `with`.
fn edit_card_line(v: &Verified, needle: &str, with: &dyn Fn(&str) -> String) {
    let card = std::fs::read_to_string(v.card()).unwrap();
    let line = card
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{card}"))
        .to_owned();
    let new = with(&line);
    std::fs::write(v.card(), card.replacen(&line, &new, 1)).unwrap();
}

fn claim<'a>(report: &'a serde_json::Value, metric: &str) -> &'a serde_json::Value {
    report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["metric"] == metric)
        .unwrap_or_else(|| panic!("no {metric} claim in {report}"))
}

fn gate<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["sanity"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gate"] == name)
        .unwrap_or_else(|| panic!("no {name} gate in {}", report["sanity"]))
}

/// The kld_mean claim's value text in a card written by `card` (flow style).
fn kld_mean_line(v: &Verified) -> String {
    std::fs::read_to_string(v.card())
        .unwrap()
        .lines()
        .find(|l| l.contains("metric: kld_mean,"))
        .unwrap()
        .to_owned()
}

fn set_value(line: &str, value: &str) -> String {
    let start = line.find("value: ").unwrap() + "value: ".len();
    let end = start + line[start..].find(',').unwrap();
    format!("{}{value}{}", &line[..start], &line[end..])
}

#[test]
fn coarse_and_unreadable_claims_fail_verification() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let original = std::fs::read_to_string(v.card()).unwrap();
    // Too coarse to mean anything: used to be `reproduced`, exit 0. A zero in any spelling is
    // a claim of identical distributions instead: exact, and this quant's rerun is not zero.
    // (`0e0` is not even a number to YAML 1.1 readers: `invalid`, below.)
    for (written, verdict) in [
        ("0.002", "imprecise"),
        ("0", "not_reproduced"),
        ("0.0", "not_reproduced"),
        ("0.0e+00", "not_reproduced"),
    ] {
        std::fs::write(v.card(), &original).unwrap();
        edit_card_line(&v, "metric: kld_mean,", &|l| set_value(l, written));
        let r = v.verify();
        assert_eq!(r.code, 1, "kld_mean {written}: {}", r.stderr);
        let report = r.json();
        let c = claim(&report, "kld_mean");
        assert_eq!(c["verdict"], verdict, "{written}: {c}");
        if verdict == "not_reproduced" {
            // Exact as written (the edit also left the card's model-index contradicting it).
            assert_eq!(c["claimed_precision_relative"], 0.0, "{c}");
            assert_eq!(c["tolerance"], 0.0, "{c}");
        }
        assert_ne!(report["verdict"], "reproduced");
    }
    // Quoted, text, non-finite, negative and misspelt entries each get an `invalid` verdict.
    for (what, edit) in [
        (
            "quoted",
            &(|l: &str| set_value(l, "\"0.001\"")) as &dyn Fn(&str) -> String,
        ),
        ("text", &|l: &str| set_value(l, "about 0.001")),
        ("inf", &|l: &str| set_value(l, ".inf")),
        ("nan", &|l: &str| set_value(l, ".nan")),
        ("no dot before the exponent", &|l: &str| set_value(l, "0e0")),
        ("negative", &|l: &str| set_value(l, "-0.001")),
        ("misspelt key", &|l: &str| {
            l.replacen("context_length", "contex_length", 1)
        }),
    ] {
        std::fs::write(v.card(), &original).unwrap();
        edit_card_line(&v, "metric: kld_mean,", edit);
        let r = v.verify();
        assert_eq!(r.code, 1, "{what}: {}", r.stderr);
        let report = r.json();
        let claims = report["claims"].as_array().unwrap();
        let invalid: Vec<_> = claims
            .iter()
            .filter(|c| c["verdict"] == "invalid")
            .collect();
        assert_eq!(invalid.len(), 1, "{what}: {claims:?}");
        assert!(
            invalid[0]["reason"]
                .as_str()
                .unwrap()
                .starts_with("results["),
            "{what}"
        );
        assert!(
            ["invalid", "not_reproduced"].contains(&report["verdict"].as_str().unwrap()),
            "{what}: {}",
            report["verdict"]
        );
    }
    std::fs::write(v.card(), &original).unwrap();
    let r = v.verify();
    assert_eq!(
        r.code, 0,
        "the untouched card still reproduces: {}",
        r.stderr
    );
}

/// A copy of `model` whose embedding row for `token` is NaN.
fn with_nan_embedding_row(dir: &Path, token: usize) {
    rewrite_safetensors(&dir.join("model.safetensors"), |tensors| {
        let embed = tensors
            .iter_mut()
            .find(|t| t.0 == "model.embed_tokens.weight")
            .unwrap();
        assert_eq!(embed.1, safetensors::Dtype::BF16);
        let hidden = embed.2[1];
        for k in 0..hidden {
            let at = 2 * (token * hidden + k);
            embed.3[at..at + 2].copy_from_slice(&half::bf16::NAN.to_le_bytes());
        }
    });
}

/// A token of `text` that occurs in exactly one of its 128-token windows (so a NaN embedding
/// row for it spoils some rows, not all).
fn token_in_one_window(model_dir: &Path, text: &str) -> usize {
    let tokenizer = tokenizers::Tokenizer::from_file(model_dir.join("tokenizer.json")).unwrap();
    let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    let windows: Vec<&[u32]> = ids.chunks_exact(128).collect();
    assert!(windows.len() >= 3, "{} windows", windows.len());
    let mut seen: std::collections::BTreeMap<u32, std::collections::BTreeSet<usize>> =
        Default::default();
    for (w, window) in windows.iter().enumerate() {
        for &id in window.iter() {
            seen.entry(id).or_default().insert(w);
        }
    }
    *seen
        .iter()
        .find(|(_, w)| w.len() == 1)
        .expect("a token in one window only")
        .0 as usize
}

#[test]
fn rows_dropped_as_non_finite_must_be_disclosed() {
    // A candidate that turns rows into NaN, measured and carded: the card discloses the rows it
    // left out, and that disclosed sample verifies.
    let v = Verified::new_with("shakespeare-w8a16", &[], &|dir| {
        let token = token_in_one_window(dir, &crate::support::short_text_content(2500));
        with_nan_embedding_row(dir, token);
    });
    let card = std::fs::read_to_string(v.card()).unwrap();
    assert!(
        card.contains("n_nonfinite: "),
        "card writes the excluded rows:\n{card}"
    );
    let r = v.verify();
    assert_eq!(r.code, 0, "disclosed exclusions reproduce: {}", r.stdout);
    // The author removes the exclusions from the card (and claims the full sample): fails.
    let scrubbed: String = card
        .lines()
        .map(|l| match l.find(", n_nonfinite: ") {
            Some(i) => format!("{}}}\n", &l[..i]),
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(v.card(), scrubbed).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    let report = r.json();
    assert_eq!(report["verdict"], "not_reproduced");
    assert_eq!(gate(&report, "finite_rows")["passed"], false);
    assert!(
        claim(&report, "kld_mean")["reason"]
            .as_str()
            .unwrap()
            .contains("non-finite"),
        "{}",
        claim(&report, "kld_mean")
    );
}

#[test]
fn a_changed_sample_size_is_not_reproduced() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let line = kld_mean_line(&v);
    let n: u64 = line
        .split("n_positions: ")
        .nth(1)
        .unwrap()
        .trim_end_matches('}')
        .parse()
        .unwrap();
    edit_card_line(&v, "metric: kld_mean,", &|l| {
        l.replace(
            &format!("n_positions: {n}"),
            &format!("n_positions: {}", n * 4),
        )
    });
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    let c = claim(&r.json(), "kld_mean").clone();
    assert_eq!(c["verdict"], "not_reproduced");
    assert!(c["reason"].as_str().unwrap().contains("rows scored"), "{c}");
}

#[test]
fn lint_errors_and_a_declared_but_absent_quantization_fail_verify() {
    // The reference's own weights under the FP8 example's card: `quantization-mismatch` used to
    // be recorded and ignored, and the gate passed because nothing was quantized.
    let v = Verified::new("shakespeare-fp8-block", &["--compute-dtype", "f64"]);
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(
            Path::new(&model("shakespeare-bf16")).join(f),
            v.candidate().join(f),
        )
        .unwrap();
    }
    let lint = cardproof(&["lint", v.candidate().to_str().unwrap(), "--json"]);
    assert_eq!(lint.code, 1, "lint flags it: {}", lint.stdout);
    assert!(
        lint.stdout.contains("quantization-mismatch"),
        "{}",
        lint.stdout
    );
    // The card pins the candidate's files, which are no longer those: caught before the rerun,
    // and the lint error decides.
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    let report = r.json();
    assert_eq!(report["verdict"], "not_reproduced", "{report}");
    assert_eq!(
        report["lane_differences"][0]["field"], "fidelity.candidate.files_sha256",
        "{report}"
    );
    assert_eq!(report["sanity"], serde_json::json!([]), "not rerun");
    for c in report["claims"].as_array().unwrap() {
        assert_eq!(c["verdict"], "not_reproduced", "{c}");
        assert!(c["reason"].as_str().unwrap().contains("lint errors"), "{c}");
    }
    // Without that pin the rerun runs, and the gate fails too.
    let card = std::fs::read_to_string(v.card()).unwrap();
    let (before, after) = card.split_once("  candidate:\n").unwrap();
    let (pinned, rest) = after.split_once("files_sha256: ").unwrap();
    let rest = rest.split_once('\n').unwrap().1;
    let unpinned = format!(
        "{before}  candidate:\n{}{rest}",
        pinned.trim_end_matches(' ')
    );
    std::fs::write(v.card(), unpinned).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    let report = r.json();
    assert_ne!(report["verdict"], "reproduced");
    assert!(report["card"]["lint"]["errors"].as_u64().unwrap() >= 1);
    let engaged = gate(&report, "quantization_engaged");
    assert_eq!(engaged["passed"], false, "{engaged}");
    assert!(
        engaged["detail"].as_str().unwrap().contains("fp8-block"),
        "{engaged}"
    );
    for c in report["claims"].as_array().unwrap() {
        assert_eq!(c["verdict"], "not_reproduced", "{c}");
        assert!(c["reason"].as_str().unwrap().contains("sanity gate"), "{c}");
    }
}

#[test]
fn lint_errors_alone_fail_verify() {
    // A card that reproduces numerically but carries a lint error (an unquoted revision that
    // YAML reads as a number) is not verified.
    let v = Verified::new("shakespeare-w8a16", &[]);
    let card = std::fs::read_to_string(v.card()).unwrap();
    let broken = card.replacen("  calibration:", "  x-note: 1\n  calibration:", 1);
    let broken = broken.replacen(
        "schema: cardproof/v1",
        "schema: cardproof/v1\n  unknown_section: 1",
        1,
    );
    std::fs::write(v.card(), broken).unwrap();
    let lint = cardproof(&["lint", v.candidate().to_str().unwrap()]);
    assert_eq!(lint.code, 1, "{}", lint.stderr);
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    let report = r.json();
    assert_eq!(report["verdict"], "not_reproduced");
    let c = claim(&report, "kld_mean");
    assert!(c["reason"].as_str().unwrap().contains("lint errors"), "{c}");
    assert!(c["rerun"].is_number(), "the rerun's number is still shown");
}

#[test]
fn reverse_only_cards_pass_the_quantization_gate() {
    // The gate read an uncomputed forward KL as 0 and said quantization never engaged.
    let v = Verified::new("shakespeare-w8a16", &["--direction", "reverse"]);
    let r = v.verify();
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, r.stdout);
    let report = r.json();
    assert_eq!(gate(&report, "quantization_engaged")["passed"], true);
    assert!(claim(&report, "kld_reverse_mean")["verdict"] == "reproduced");
}

fn measure(candidate: &Path, dir: &Path) -> Run {
    measure_with(candidate, dir, &[])
}

/// A short `measure` of `candidate` against the bf16 reference into `dir/out`.
fn measure_with(candidate: &Path, dir: &Path, extra: &[&str]) -> Run {
    let text = crate::support::short_text(dir, 3000);
    crate::support::measure_short(candidate, &text, &dir.join("out"), "10", extra)
}

fn edit_json(path: &Path, edit: &dyn Fn(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn config_and_tokenizer_must_match_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cand = dir.path().join("cand");
    crate::support::copy_model("shakespeare-w8a16", &cand);
    let ok = measure(&cand, dir.path());
    assert_eq!(ok.code, 0, "{}", ok.stderr);

    // Qwen3 weights declared as llama: q_norm/k_norm are tensors llama does not have.
    edit_json(&cand.join("config.json"), &|c| {
        c["model_type"] = "llama".into()
    });
    let r = measure(&cand, dir.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("q_norm"), "{}", r.stderr);
    assert!(r.stderr.contains("does not use"), "{}", r.stderr);
    edit_json(&cand.join("config.json"), &|c| {
        c["model_type"] = "qwen3".into()
    });

    // Tied embeddings with a different lm_head stored: transformers would use embed_tokens.
    edit_json(&cand.join("config.json"), &|c| {
        c["tie_word_embeddings"] = true.into()
    });
    let r = measure(&cand, dir.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("ties the word embeddings"),
        "{}",
        r.stderr
    );
    edit_json(&cand.join("config.json"), &|c| {
        c["tie_word_embeddings"] = false.into()
    });

    // Qwen3 with attention_bias but no bias tensors.
    edit_json(&cand.join("config.json"), &|c| {
        c["attention_bias"] = true.into()
    });
    let r = measure(&cand, dir.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("q_proj.bias: missing"), "{}", r.stderr);
    edit_json(&cand.join("config.json"), &|c| {
        c["attention_bias"] = false.into()
    });

    // Same vocabulary, another normalizer: the same text can become other ids.
    edit_json(&cand.join("tokenizer.json"), &|t| {
        t["normalizer"] = serde_json::json!({"type": "Lowercase"});
    });
    let r = measure(&cand, dir.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("another normalizer"), "{}", r.stderr);

    // Re-serialized but equal (other key order and merges spelling) is the same tokenizer.
    std::fs::copy(
        Path::new(&model("shakespeare-w8a16")).join("tokenizer.json"),
        cand.join("tokenizer.json"),
    )
    .unwrap();
    edit_json(&cand.join("tokenizer.json"), &|t| {
        if let Some(merges) = t
            .pointer_mut("/model/merges")
            .and_then(|m| m.as_array_mut())
        {
            for m in merges.iter_mut() {
                if let Some(pair) = m.as_array() {
                    let joined = format!(
                        "{} {}",
                        pair[0].as_str().unwrap(),
                        pair[1].as_str().unwrap()
                    );
                    *m = joined.into();
                } else if let Some((a, b)) = m.as_str().and_then(|s| s.split_once(' ')) {
                    *m = serde_json::json!([a, b]);
                }
            }
        }
    });
    let r = measure(&cand, dir.path());
    assert_eq!(r.code, 0, "equal tokenizers agree: {}", r.stderr);
}

#[test]
fn threshold_mode_refuses_the_reverse_kl() {
    let dir = tempfile::tempdir().unwrap();
    let cand = model("shakespeare-w8a16");
    let base = |extra: &[&str]| {
        let mut args = vec!["--vocab", "threshold"];
        args.extend_from_slice(extra);
        measure_with(Path::new(&cand), dir.path(), &args)
    };
    for direction in ["both", "reverse"] {
        let r = base(&["--direction", direction]);
        assert_eq!(r.code, 2, "{direction}: {}", r.stderr);
        assert!(r.stderr.contains("partial sum"), "{}", r.stderr);
    }
    // Without a direction, threshold mode measures the forward KL (llama.cpp's).
    let r = base(&[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let m: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/measurement.json")).unwrap(),
    )
    .unwrap();
    let metrics = &m["runs"][0]["metrics"];
    assert!(metrics["kld_mean"].is_number());
    assert!(metrics.get("kld_reverse_mean").is_none(), "{metrics}");
}

#[test]
fn eval_text_sources_stay_inside_the_card_directory() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let secret = v.dir.path().join("secret.txt");
    std::fs::copy(v.text(), &secret).unwrap();
    for source in [
        "/etc/hostname".to_owned(),
        secret.display().to_string(),
        "../secret.txt".to_owned(),
        "linked.txt".to_owned(),
    ] {
        edit_card_line(&v, "source:", &|l| {
            format!("{}source: {source:?}", &l[..l.find("source:").unwrap()])
        });
        let link = v.candidate().join("linked.txt");
        if source == "linked.txt" {
            std::os::unix::fs::symlink(&secret, &link).unwrap();
        }
        let r = v.verify_with(&[]);
        assert_eq!(r.code, 2, "{source}: {}", r.stderr);
        assert!(
            r.message().contains("--eval-text") || r.message().contains("outside the checkpoint"),
            "{source}: {}",
            r.stderr
        );
        let _ = std::fs::remove_file(&link);
        assert!(
            !v.out().join("report.json").exists(),
            "{source}: nothing signed"
        );
    }
    // Inside the directory it is read (the file is then one of the checkpoint's, so the card's
    // files digest no longer matches: not comparable, but the text is the card's).
    std::fs::copy(v.text(), v.candidate().join("eval.txt")).unwrap();
    edit_card_line(&v, "source:", &|l| {
        format!("{}source: eval.txt", &l[..l.find("source:").unwrap()])
    });
    let r = v.verify_with(&[]);
    assert_ne!(r.code, 2, "{}", r.stderr);
    let differences = r.json()["lane_differences"].to_string();
    assert!(!differences.contains("eval text"), "{differences}");
    assert!(differences.contains("candidate files"), "{differences}");
}

#[test]
fn lint_flags_imprecise_claims_at_their_value() {
    use crate::support::{compliant_with, lint_text};
    assert!(
        !lint_text(crate::support::compliant_card())
            .codes()
            .contains(&"imprecise-claim".to_owned())
    );
    for (old, new) in [
        ("value: 0.0123,", "value: 0.01,"),
        ("value: 0.981,", "value: 0.98,"),
    ] {
        let r = lint_text(compliant_with(old, new));
        assert_eq!(r.code, 1, "{new}");
        let f = r.finding("imprecise-claim");
        assert_eq!(f["severity"], "error");
        assert_eq!(
            f["line"],
            if old.contains("0.981") { 65 } else { 63 },
            "{new}"
        );
        assert!(f["pointer"].as_str().unwrap().ends_with("/value"), "{f}");
    }
    // Exactly "no change" (a lossless file) is an exact claim, not an imprecise one.
    for (old, new) in [
        ("value: 0.0123,", "value: 0,"),
        ("value: 0.981,", "value: 1,"),
    ] {
        let r = lint_text(compliant_with(old, new));
        assert!(
            !r.codes().contains(&"imprecise-claim".to_owned()),
            "{new}: {}",
            r.stdout
        );
    }
}

#[test]
fn a_fifo_passed_as_a_key_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("cardproof.pub");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "mkfifo (coreutils) is needed"
    );
    let envelope = dir.path().join("report.dsse.json");
    std::fs::write(&envelope, "{}").unwrap();
    let output = assert_cmd::Command::cargo_bin("cardproof")
        .unwrap()
        .args(["verify-report", envelope.to_str().unwrap(), "--pub"])
        .arg(&fifo)
        .timeout(std::time::Duration::from_secs(20))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "hung or passed");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("FIFO"), "{stderr}");
}

/// Regression (#41): `rms_norm_eps: -1` (config.json or GGUF) was accepted and the failure
/// blamed the eval text; a number of the wrong type fell back to the default. Every config
/// number is range-checked at load, the error naming the file and the key.
#[test]
fn config_numbers_out_of_range_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (key, value, needle) in [
        (
            "rms_norm_eps",
            serde_json::json!(-1.0),
            "rms_norm_eps: -1 is outside (0, 1)",
        ),
        (
            "rms_norm_eps",
            serde_json::json!(1.5),
            "rms_norm_eps: 1.5 is outside (0, 1)",
        ),
        (
            "rms_norm_eps",
            serde_json::json!("1e-6"),
            "rms_norm_eps: must be a number",
        ),
        (
            "rope_theta",
            serde_json::json!(0.0),
            "rope_theta: 0 is not a positive",
        ),
        (
            "rope_theta",
            serde_json::json!("big"),
            "rope_theta: must be a number",
        ),
    ] {
        let cand = dir.path().join(format!("cand-{key}-{value}"));
        crate::support::copy_model("shakespeare-w8a16", &cand);
        edit_json(&cand.join("config.json"), &|c| c[key] = value.clone());
        let r = measure(&cand, dir.path());
        assert_eq!(r.code, 2, "{key} {value}: {}", r.stderr);
        let error = r.stderr.lines().find(|l| l.starts_with("error:")).unwrap();
        assert!(error.contains("config.json"), "{error}");
        assert!(error.contains(needle), "{key} {value}: {error}");
    }
    // The same in GGUF metadata: the F32 value after the key, patched in place.
    let gguf = dir.path().join("gguf");
    crate::support::copy_model("shakespeare-q4_0-gguf", &gguf);
    let path = gguf.join("model.gguf");
    let mut bytes = std::fs::read(&path).unwrap();
    let key = b"qwen3.attention.layer_norm_rms_epsilon";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the key in the example GGUF")
        + key.len();
    assert_eq!(&bytes[at..at + 4], &6u32.to_le_bytes(), "an F32 value");
    bytes[at + 4..at + 8].copy_from_slice(&(-1.0f32).to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let r = measure(&path, dir.path());
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("qwen3.attention.layer_norm_rms_epsilon: -1 is outside (0, 1)"),
        "{}",
        r.stderr
    );
}
