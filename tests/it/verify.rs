//! `cardproof verify`, `card`, `keygen`, `sign` and `verify-report` through the CLI on the
//! example models, each with a card written by `card` from a short measurement.

use std::path::{Path, PathBuf};

use crate::support::{Run, cardproof, repo_root};

fn model(name: &str) -> PathBuf {
    repo_root().join("examples/models").join(name)
}

/// A copy of an example candidate with its card rewritten from a measurement on a short text.
struct Verified {
    dir: tempfile::TempDir,
}

impl Verified {
    fn candidate(&self) -> PathBuf {
        self.dir.path().join("candidate")
    }
    fn text(&self) -> PathBuf {
        self.dir.path().join("eval.txt")
    }
    fn key(&self) -> PathBuf {
        self.dir.path().join("keys/cardproof.key")
    }
    fn public(&self) -> PathBuf {
        self.dir.path().join("keys/cardproof.pub")
    }
    fn out(&self) -> PathBuf {
        self.dir.path().join("report")
    }
    fn card(&self) -> PathBuf {
        self.candidate().join("README.md")
    }

    fn new(example: &str, extra: &[&str]) -> Verified {
        let dir = tempfile::tempdir().unwrap();
        let v = Verified { dir };
        std::fs::create_dir_all(v.candidate()).unwrap();
        for entry in std::fs::read_dir(model(example)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), v.candidate().join(entry.file_name())).unwrap();
        }
        let text = std::fs::read_to_string(repo_root().join("examples/data/eval.txt")).unwrap();
        let end = text[2500..].find('\n').unwrap() + 2501;
        std::fs::write(v.text(), &text[..end]).unwrap();
        let m = v.dir.path().join("m");
        let mut args = vec![
            "measure",
            "--reference",
            model("shakespeare-bf16")
                .to_str()
                .unwrap()
                .to_owned()
                .leak(),
            "--candidate",
            v.candidate().to_str().unwrap().to_owned().leak(),
            "--eval-text",
            v.text().to_str().unwrap().to_owned().leak(),
            "--context-length",
            "128",
            "--bootstrap",
            "100",
            "--out",
            m.to_str().unwrap().to_owned().leak(),
        ];
        args.extend_from_slice(extra);
        let r = cardproof(&args);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let r = cardproof(&[
            "card",
            "--measurement",
            m.join("measurement.json").to_str().unwrap(),
            "--into",
            v.card().to_str().unwrap(),
        ]);
        assert_eq!(r.code, 0, "card: {}", r.stderr);
        let lint = cardproof(&["lint", v.candidate().to_str().unwrap()]);
        assert_eq!(
            lint.code, 0,
            "the written card lints clean: {}",
            lint.stderr
        );
        let r = cardproof(&[
            "keygen",
            "--out",
            v.dir.path().join("keys").to_str().unwrap(),
        ]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        v
    }

    fn verify(&self) -> Run {
        cardproof(&[
            "verify",
            self.candidate().to_str().unwrap(),
            "--reference",
            model("shakespeare-bf16").to_str().unwrap(),
            "--eval-text",
            self.text().to_str().unwrap(),
            "--key",
            self.key().to_str().unwrap(),
            "--out",
            self.out().to_str().unwrap(),
            "--json",
        ])
    }

    fn verify_report(&self, envelope: &Path, checkpoint: Option<&Path>) -> Run {
        let mut args = vec![
            "verify-report".to_owned(),
            envelope.display().to_string(),
            "--pub".into(),
            self.public().display().to_string(),
        ];
        if let Some(c) = checkpoint {
            args.push("--checkpoint".into());
            args.push(c.display().to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cardproof(&args)
    }
}

#[test]
fn card_then_verify_reproduces_every_example() {
    for (example, extra) in [
        ("shakespeare-w8a16", &[][..]),
        ("shakespeare-fp8-block", &["--compute-dtype", "f64"][..]),
        ("shakespeare-awq-int4", &[][..]),
        ("shakespeare-q4_0-gguf", &[][..]),
    ] {
        let v = Verified::new(example, extra);
        let r = v.verify();
        assert_eq!(r.code, 0, "{example}: {}\n{}", r.stderr, r.stdout);
        let report = r.json();
        assert_eq!(report["verdict"], "reproduced", "{example}");
        assert!(report["claims"].as_array().unwrap().len() >= 3);
        assert!(
            report["sanity"]
                .as_array()
                .unwrap()
                .iter()
                .all(|g| g["passed"] == true)
        );
        for f in [
            "report.json",
            "report.dsse.json",
            "report.md",
            "report.html",
            "measurement.json",
            "positions.safetensors",
        ] {
            assert!(v.out().join(f).exists(), "{example}: {f}");
        }
        let html = std::fs::read_to_string(v.out().join("report.html")).unwrap();
        assert!(html.contains("<svg") && !html.contains("<script") && !html.contains("src=\"http"));
        let ok = v.verify_report(&v.out().join("report.dsse.json"), Some(&v.candidate()));
        assert_eq!(ok.code, 0, "{example}: {}{}", ok.stdout, ok.stderr);
    }
}

#[test]
fn edited_claims_missing_items_and_tampering_are_caught() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let card = std::fs::read_to_string(v.card()).unwrap();

    // A claim edited by 20% is not reproduced (exit 1).
    let line = card
        .lines()
        .find(|l| l.contains("metric: kld_mean,") && l.contains("value: "))
        .expect("a kld_mean claim")
        .to_owned();
    let value: f64 = line
        .split("value: ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let edited = line.replace(
        &format!("value: {value}"),
        &format!("value: {}", value * 1.2),
    );
    std::fs::write(v.card(), card.replacen(&line, &edited, 1)).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    let report = r.json();
    assert_eq!(report["verdict"], "not_reproduced");
    let claim = report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["metric"] == "kld_mean")
        .unwrap();
    assert_eq!(claim["verdict"], "not_reproduced");

    // A card missing the KL direction is undisclosed.
    let without: String = card
        .lines()
        .filter(|l| !l.trim_start().starts_with("direction:"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(without, card, "the card states a direction to remove");
    std::fs::write(v.card(), &without).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.json()["verdict"], "undisclosed");

    // A verified report, then tampering with each part.
    std::fs::write(v.card(), &card).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let envelope_path = v.out().join("report.dsse.json");
    let envelope: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&envelope_path).unwrap()).unwrap();
    let tampered = v.dir.path().join("tampered.json");
    let check = |e: &serde_json::Value, checkpoint: Option<&Path>| {
        std::fs::write(&tampered, e.to_string()).unwrap();
        v.verify_report(&tampered, checkpoint)
    };
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    // The payload: flip the verdict inside the signed statement.
    let mut e = envelope.clone();
    let payload = String::from_utf8(b64.decode(e["payload"].as_str().unwrap()).unwrap()).unwrap();
    let forged = payload.replacen("\"reproduced\"", "\"not_reproduced\"", 1);
    e["payload"] = b64.encode(forged).into();
    let r = check(&e, None);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stdout.contains("signature"), "{}", r.stdout);
    // The signature.
    let mut e = envelope.clone();
    let mut sig = b64
        .decode(e["signatures"][0]["sig"].as_str().unwrap())
        .unwrap();
    sig[0] ^= 1;
    e["signatures"][0]["sig"] = b64.encode(sig).into();
    assert_eq!(check(&e, None).code, 1);
    // The keyid.
    let mut e = envelope.clone();
    e["signatures"][0]["keyid"] = "0".repeat(64).into();
    let r = check(&e, None);
    assert_eq!(r.code, 1);
    assert!(r.stdout.contains("keyid"), "{}", r.stdout);
    // A subject file changed after signing.
    std::fs::write(v.candidate().join("generation_config.json"), "{}").unwrap();
    let r = v.verify_report(&envelope_path, Some(&v.candidate()));
    assert_eq!(r.code, 1);
    assert!(r.stdout.contains("generation_config.json"), "{}", r.stdout);
    // Malformed inputs are exit 2.
    std::fs::write(&tampered, "not json").unwrap();
    assert_eq!(v.verify_report(&tampered, None).code, 2);
    let r = cardproof(&[
        "verify-report",
        envelope_path.to_str().unwrap(),
        "--pub",
        v.card().to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "a card is not a key: {}", r.stderr);
}

#[test]
fn sign_wraps_a_measurement_and_verify_report_accepts_it() {
    let v = Verified::new("shakespeare-awq-int4", &[]);
    let m = v.dir.path().join("m/measurement.json");
    let r = cardproof(&[
        "sign",
        m.to_str().unwrap(),
        "--checkpoint",
        v.candidate().to_str().unwrap(),
        "--key",
        v.key().to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let envelope = v.dir.path().join("m/measurement.dsse.json");
    let ok = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    // keygen never overwrites a key.
    let again = cardproof(&[
        "keygen",
        "--out",
        v.dir.path().join("keys").to_str().unwrap(),
    ]);
    assert_eq!(again.code, 2, "{}", again.stderr);
}

/// `--pub` given the private key (`cardproof.key`, beside `cardproof.pub`) was read and its public
/// key derived, silently; it is exit 2 naming the file and what to pass instead, for
/// `verify-report` and `check` alike, and before any other work.
#[test]
fn a_private_key_passed_as_pub_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let k = cardproof(&["keygen", "--out", keys.to_str().unwrap()]);
    assert_eq!(k.code, 0, "{}", k.stderr);
    let (private, public) = (keys.join("cardproof.key"), keys.join("cardproof.pub"));
    let key = cardproof::attest::read_signing_key(&private).unwrap();
    let subject = dir.path().join("model");
    std::fs::create_dir(&subject).unwrap();
    std::fs::write(subject.join("config.json"), "{}").unwrap();
    let manifest = cardproof::checkpoint::hash::hash_path(
        &subject,
        &cardproof::checkpoint::hash::HashOptions::default(),
        &|_| {},
    )
    .unwrap();
    let statement = cardproof::attest::statement(
        &cardproof::attest::subjects(&manifest),
        serde_json::json!({"verdict": "reproduced"}),
    );
    let envelope = cardproof::attest::sign_envelope(
        &serde_json::to_vec(&statement).unwrap(),
        cardproof::attest::PAYLOAD_TYPE,
        &key,
    );
    let envelope_path = dir.path().join("report.dsse.json");
    std::fs::write(&envelope_path, serde_json::to_vec(&envelope).unwrap()).unwrap();
    let verify = |key: &Path| {
        cardproof(&[
            "verify-report",
            envelope_path.to_str().unwrap(),
            "--pub",
            key.to_str().unwrap(),
        ])
    };
    // The same envelope verifies with the public key.
    let ok = verify(&public);
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    let message = format!(
        "error: {}: is a private key; pass the public key (cardproof.pub",
        private.display()
    );
    let refused = verify(&private);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    assert!(refused.stderr.starts_with(&message), "{}", refused.stderr);
    assert_eq!(refused.stderr.lines().count(), 1, "{}", refused.stderr);
    // check refuses it before asking the Hub anything (the endpoint answers nothing).
    let check = assert_cmd::Command::cargo_bin("cardproof")
        .unwrap()
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HF_HUB_OFFLINE", "1")
        .args(["check", "hf:org/name", "--pub", private.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8(check.stderr).unwrap();
    assert_eq!(check.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with(&message), "{stderr}");
}

#[test]
fn verify_against_a_reference_artifact_reproduces() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let art = v.dir.path().join("reference.safetensors");
    let r = cardproof(&[
        "reference",
        "export",
        "--model",
        model("shakespeare-bf16").to_str().unwrap(),
        "--eval-text",
        v.text().to_str().unwrap(),
        "--context-length",
        "128",
        "--out",
        art.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cardproof(&[
        "verify",
        v.candidate().to_str().unwrap(),
        "--reference-artifact",
        art.to_str().unwrap(),
        "--eval-text",
        v.text().to_str().unwrap(),
        "--key",
        v.key().to_str().unwrap(),
        "--out",
        v.out().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, r.stdout);
    let report = r.json();
    assert_eq!(report["verdict"], "reproduced");
    assert_eq!(
        report["measurement"]["environment"]["reference_artifact"]["kind"],
        "hidden"
    );
}

#[test]
fn verify_without_a_reference_says_how_to_give_one() {
    let out = tempfile::tempdir().unwrap();
    let keys = out.path().join("keys");
    let k = cardproof(&["keygen", "--out", keys.to_str().unwrap()]);
    assert_eq!(k.code, 0, "{}", k.stderr);
    for runner in ["native", "transformers"] {
        let r = cardproof(&[
            "verify",
            model("shakespeare-fp8-block").to_str().unwrap(),
            "--runner",
            runner,
            "--key",
            keys.join("cardproof.key").to_str().unwrap(),
            "--out",
            out.path().join(runner).to_str().unwrap(),
        ]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr.contains("fidelity.reference: verify needs the reference: pass --reference PATH or hf:ORG/NAME@REVISION"),
            "{}",
            r.stderr
        );
        assert!(!out.path().join(runner).exists(), "nothing written");
    }
}
