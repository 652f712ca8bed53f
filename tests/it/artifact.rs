//! Compact reference artifacts: `reference export` and `measure --reference-artifact`.

use std::path::{Path, PathBuf};

use crate::support::{LLAMACPP_PROTOCOL, cardproof, model, repo_root, short_text};

fn export(dir: &Path, text: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut args = vec![
        "reference",
        "export",
        "--model",
        model("shakespeare-bf16").leak(),
        "--eval-text",
        text.to_str().unwrap(),
        "--context-length",
        "128",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let r = cardproof(&args);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(crate::support::repo_root().exists());
    out
}

fn measure(dir: &Path, reference: &[&str], candidate: &str, extra: &[&str]) -> crate::support::Run {
    let out = dir.join(format!("m-{}", rand_name()));
    let mut args = vec!["measure"];
    args.extend_from_slice(reference);
    args.extend_from_slice(&[
        "--candidate",
        candidate,
        "--context-length",
        "128",
        "--bootstrap",
        "50",
        "--out",
        out.to_str().unwrap().to_owned().leak(),
        "--json",
    ]);
    args.extend_from_slice(extra);
    cardproof(&args)
}

fn rand_name() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}

fn metrics(run: &crate::support::Run) -> serde_json::Value {
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.json()["runs"][0]["metrics"].clone()
}

#[test]
fn hidden_state_artifact_reproduces_the_full_reference() {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 2500);
    let art = export(dir.path(), &text, "hidden.safetensors", &[]);
    for candidate in [
        "shakespeare-w8a16",
        "shakespeare-fp8-block",
        "shakespeare-awq-int4",
    ] {
        let full = metrics(&measure(
            dir.path(),
            &[
                "--reference",
                &model("shakespeare-bf16"),
                "--eval-text",
                text.to_str().unwrap(),
            ],
            &model(candidate),
            &[],
        ));
        let via = measure(
            dir.path(),
            &["--reference-artifact", art.to_str().unwrap()],
            &model(candidate),
            &[],
        );
        let doc = via.json();
        assert_eq!(doc["environment"]["reference_artifact"]["kind"], "hidden");
        let via = metrics(&via);
        for (name, value) in full.as_object().unwrap() {
            let a = value.as_f64().unwrap();
            let b = via[name]
                .as_f64()
                .unwrap_or_else(|| panic!("{candidate}: no {name}"));
            assert!(
                (a - b).abs() <= 1e-6 * a.abs().max(1e-12),
                "{candidate} {name}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn top_k_artifact_is_a_lower_bound_that_converges() {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 2500);
    let candidate = model("shakespeare-fp8-block");
    let full = metrics(&measure(
        dir.path(),
        &[
            "--reference",
            &model("shakespeare-bf16"),
            "--eval-text",
            text.to_str().unwrap(),
        ],
        &candidate,
        &[],
    ))["kld_mean"]
        .as_f64()
        .unwrap();
    let mut previous = 0.0;
    for k in ["4", "32", "256", "1536"] {
        let art = export(
            dir.path(),
            &text,
            &format!("top{k}.safetensors"),
            &["--kind", "top-k", "--artifact-top-k", k],
        );
        let m = metrics(&measure(
            dir.path(),
            &["--reference-artifact", art.to_str().unwrap()],
            &candidate,
            &["--vocab", "top-k", "--top-k", k],
        ));
        let kld = m["kld_mean"].as_f64().unwrap();
        assert!(
            kld <= full * (1.0 + 1e-9),
            "top-{k}: {kld} above the full KL {full}"
        );
        assert!(
            kld >= previous * (1.0 - 1e-9),
            "top-{k}: {kld} below top-smaller {previous}"
        );
        previous = kld;
    }
    assert!(
        previous > 0.97 * full,
        "top-1536 {previous} should be close to the full {full}"
    );
}

#[test]
fn tampered_or_mismatched_artifacts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 2500);
    let art = export(dir.path(), &text, "hidden.safetensors", &[]);
    let reference = ["--reference-artifact", art.to_str().unwrap()];
    // Another protocol.
    let r = cardproof(&[
        "measure",
        "--reference-artifact",
        art.to_str().unwrap(),
        "--candidate",
        &model("shakespeare-w8a16"),
        "--context-length",
        "64",
        "--out",
        dir.path().join("x").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2);
    assert!(r.message().contains("context_lengths"), "{}", r.stderr);
    // Another lm_head (the GGUF candidate's output matrix is Q8_0).
    let r = measure(dir.path(), &reference, &model("shakespeare-q4_0-gguf"), &[]);
    assert_eq!(r.code, 2);
    assert!(r.message().contains("lm_head"), "{}", r.stderr);
    // Another eval text.
    let other = dir.path().join("other.txt");
    std::fs::write(&other, "some other text\n").unwrap();
    let r = measure(
        dir.path(),
        &reference,
        &model("shakespeare-w8a16"),
        &["--eval-text", other.to_str().unwrap()],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.message().contains("not the artifact's eval text"),
        "{}",
        r.stderr
    );
    // A changed byte: the digest beside it no longer matches.
    let mut bytes = std::fs::read(&art).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&art, &bytes).unwrap();
    let r = measure(dir.path(), &reference, &model("shakespeare-w8a16"), &[]);
    assert_eq!(r.code, 2);
    assert!(r.message().contains("digest mismatch"), "{}", r.stderr);
}

#[test]
fn llamacpp_base_files_export_and_import() {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 2500);
    let base = export(
        dir.path(),
        &text,
        "ref.kld",
        &["--kind", "llamacpp", "--bos", "per-window"],
    );
    let protocol = LLAMACPP_PROTOCOL;
    let candidate = model("shakespeare-w8a16");
    let full = metrics(&measure(
        dir.path(),
        &[
            "--reference",
            &model("shakespeare-bf16"),
            "--eval-text",
            text.to_str().unwrap(),
        ],
        &candidate,
        &protocol,
    ))["kld_mean"]
        .as_f64()
        .unwrap();
    let via = measure(
        dir.path(),
        &["--reference-artifact", base.to_str().unwrap()],
        &candidate,
        &protocol,
    );
    assert_eq!(
        via.json()["environment"]["reference_artifact"]["kind"],
        "llamacpp_base"
    );
    let via = metrics(&via)["kld_mean"].as_f64().unwrap();
    // The reference's log-probabilities are uint16 codes in a 16-nat window.
    assert!((via / full - 1.0).abs() < 0.03, "{via} vs {full}");
    // Only the forward KL is defined with a base file.
    let r = measure(
        dir.path(),
        &["--reference-artifact", base.to_str().unwrap()],
        &candidate,
        &["--positions", "second-half", "--bos", "per-window"],
    );
    assert_eq!(r.code, 2);
    assert!(r.message().contains("--direction forward"), "{}", r.stderr);
}

/// A real llama.cpp base file as the reference: PPL(base) read from it matches what llama.cpp
/// printed, and the candidate's KLD lands in reference semantics (below llama.cpp's number,
/// which includes its Q8 activation rounding).
#[test]
fn a_real_llamacpp_base_file_is_a_reference() {
    let fixtures = repo_root().join("tests/fixtures/llamacpp");
    let dir = tempfile::tempdir().unwrap();
    let run = measure(
        dir.path(),
        &[
            "--reference-artifact",
            fixtures.join("ref.kld").to_str().unwrap(),
        ],
        fixtures.join("cand-q5_0.gguf").to_str().unwrap(),
        &[
            "--positions",
            "second-half",
            "--bos",
            "per-window",
            "--direction",
            "forward",
            "--vocab",
            "threshold",
        ],
    );
    let m = metrics(&run);
    let ppl_ref = m["ppl_ref"].as_f64().unwrap();
    assert!((ppl_ref / 5.550659 - 1.0).abs() < 1e-5, "{ppl_ref}");
    let kld = m["kld_mean"].as_f64().unwrap();
    assert!(kld < 0.003708 && kld > 0.85 * 0.003708, "{kld}");
}
