//! `cardproof verify`, `card`, `keygen`, `sign` and `verify-report` through the CLI on the
//! example models, each with a card written by `card` from a short measurement.

use std::path::{Path, PathBuf};

use crate::support::{Cmd, Run, cardproof, model, repo_root, without_direction};

/// A copy of an example candidate with its card rewritten from a measurement on a short text.
pub(crate) struct Verified {
    pub(crate) dir: tempfile::TempDir,
}

impl Verified {
    pub(crate) fn candidate(&self) -> PathBuf {
        self.dir.path().join("candidate")
    }
    pub(crate) fn text(&self) -> PathBuf {
        self.dir.path().join("eval.txt")
    }
    pub(crate) fn key(&self) -> PathBuf {
        self.dir.path().join("keys/cardproof.key")
    }
    pub(crate) fn public(&self) -> PathBuf {
        self.dir.path().join("keys/cardproof.pub")
    }
    pub(crate) fn out(&self) -> PathBuf {
        self.dir.path().join("report")
    }
    pub(crate) fn card(&self) -> PathBuf {
        self.candidate().join("README.md")
    }

    pub(crate) fn new(example: &str, extra: &[&str]) -> Verified {
        Verified::new_with(example, extra, &|_| {})
    }

    /// As [`Verified::new`], with the candidate's copy changed by `alter` before it is measured.
    pub(crate) fn new_with(example: &str, extra: &[&str], alter: &dyn Fn(&Path)) -> Verified {
        let dir = tempfile::tempdir().unwrap();
        let v = Verified { dir };
        crate::support::copy_model(example, &v.candidate());
        alter(&v.candidate());
        crate::support::short_text(v.dir.path(), 2500);
        let m = v.dir.path().join("m");
        let r = crate::support::measure_short(&v.candidate(), &v.text(), &m, "100", extra);
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

    /// The card's claim line of `metric` and its value as written there.
    pub(crate) fn claim_line(&self, metric: &str) -> (String, String) {
        let card = std::fs::read_to_string(self.card()).unwrap();
        let line = card
            .lines()
            .find(|l| l.contains(&format!("metric: {metric},")) && l.contains("value: "))
            .unwrap_or_else(|| panic!("a {metric} claim"))
            .to_owned();
        let value = line
            .split("value: ")
            .nth(1)
            .unwrap()
            .split([',', '}'])
            .next()
            .unwrap()
            .trim()
            .to_owned();
        (line, value)
    }

    /// `verify` of the candidate against the bf16 reference with the test key into
    /// [`Verified::out`]; no eval text, no `--json`.
    pub(crate) fn verify_cmd(&self) -> Cmd {
        Cmd::verify(self.candidate())
            .reference(model("shakespeare-bf16"))
            .key(self.key())
            .out(self.out())
    }

    pub(crate) fn verify(&self) -> Run {
        self.verify_cmd().arg("--json").eval_text(self.text()).run()
    }

    /// `verify --json` of the candidate against the bf16 reference, with `extra` flags.
    pub(crate) fn verify_with(&self, extra: &[&str]) -> Run {
        self.verify_cmd().arg("--json").args(extra).run()
    }

    /// `sign FILE` over the candidate's files with the test key.
    pub(crate) fn sign(&self, file: &Path) -> Run {
        cardproof(&[
            "sign",
            file.to_str().unwrap(),
            "--checkpoint",
            self.candidate().to_str().unwrap(),
            "--key",
            self.key().to_str().unwrap(),
        ])
    }

    pub(crate) fn verify_report(&self, envelope: &Path, checkpoint: Option<&Path>) -> Run {
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

/// Publishing the signed report beside the weights (the recipe) once made the next `verify`
/// find another checkpoint (`not_comparable`: report.json, positions.safetensors, ... counted as
/// its files): a report set is never part of a checkpoint, for `hash`, `inspect`, `check` and
/// `verify` alike.
#[test]
fn a_report_published_beside_the_weights_leaves_the_checkpoint_as_it_was() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let root = |dir: &Path| -> serde_json::Value {
        let r = cardproof(&["hash", dir.to_str().unwrap(), "--json"]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        r.json()["root_sha256"].clone()
    };
    let before = root(&v.candidate());
    let r = v.verify();
    assert_eq!(r.code, 0, "{}{}", r.stderr, r.stdout);
    for f in std::fs::read_dir(v.out()).unwrap() {
        let f = f.unwrap();
        if f.file_type().unwrap().is_file() {
            std::fs::copy(f.path(), v.candidate().join(f.file_name())).unwrap();
        }
    }
    assert!(v.candidate().join("positions.safetensors").exists());
    assert_eq!(root(&v.candidate()), before);
    let inspect = cardproof(&["inspect", v.candidate().to_str().unwrap(), "--json"]);
    assert_eq!(inspect.code, 0, "{}", inspect.stderr);
    assert!(
        !inspect.stdout.contains("positions.safetensors"),
        "{}",
        inspect.stdout
    );
    let check = cardproof(&["check", v.candidate().to_str().unwrap()]);
    assert_eq!(check.code, 0, "{}{}", check.stderr, check.stdout);
    std::fs::remove_dir_all(v.out()).unwrap();
    let again = v.verify();
    assert_eq!(again.code, 0, "{}{}", again.stderr, again.stdout);
    assert_eq!(again.json()["verdict"], "reproduced");
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
    std::fs::write(v.card(), without_direction(&card)).unwrap();
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
fn a_llama_cpp_same_top_p_claim_is_verified_against_top1_agreement() {
    // `same_top_p` is llama.cpp's `Same top p`: the top-1 agreement as a percentage.
    let v = Verified::new("shakespeare-w8a16", &[]);
    let card = std::fs::read_to_string(v.card()).unwrap();
    let (line, text) = v.claim_line("top1_agreement");
    let text = text.as_str();
    let decimals = text.split_once('.').map_or(0, |(_, f)| f.len());
    assert!(
        decimals > 2,
        "top1_agreement printed with {decimals} decimals"
    );
    let fraction: f64 = text.parse().unwrap();
    let with = |percent: f64| {
        let entry = line.replacen("top1_agreement", "same_top_p", 1).replacen(
            &format!("value: {text}"),
            &format!("value: {percent:.*}", decimals - 2),
            1,
        );
        card.replacen(&line, &format!("{line}\n{entry}"), 1)
    };
    let claim = |r: &Run| {
        r.json()["claims"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["metric"] == "same_top_p")
            .expect("the same_top_p claim is judged")
            .clone()
    };
    std::fs::write(v.card(), with(100.0 * fraction)).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(claim(&r)["verdict"], "reproduced", "{}", r.stdout);
    std::fs::write(v.card(), with(100.0 * fraction - 2.0)).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1);
    assert_eq!(claim(&r)["verdict"], "not_reproduced", "{}", r.stdout);
}

#[test]
fn undisclosed_items_are_listed_once_and_wrapped_for_a_terminal() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let card = std::fs::read_to_string(v.card()).unwrap();
    let card = without_direction(&card).replacen(
        "    engine_version: ",
        "    engine_version: latest\n    x-was: ",
        1,
    );
    std::fs::write(v.card(), card).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    let report = r.json();
    assert_eq!(report["verdict"], "undisclosed");
    let items = report["undisclosed"].as_array().unwrap();
    assert!(items.len() >= 2, "{items:?}");
    assert!(items.iter().all(|i| i.is_string()));
    for c in report["claims"].as_array().unwrap() {
        let reason = c["reason"].as_str().unwrap();
        assert!(
            reason.len() < 200 && reason.contains(&format!("{} disclosure items", items.len())),
            "{reason}"
        );
    }
    let md = std::fs::read_to_string(v.out().join("report.md")).unwrap();
    assert!(md.contains("What the card leaves out"), "{md}");

    let text = v.verify_cmd().eval_text(v.text()).run();
    assert_eq!(text.code, 1, "{}", text.stderr);
    let section: Vec<&str> = text
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("undisclosed ("))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(
        section.iter().filter(|l| l.starts_with("  - ")).count(),
        items.len(),
        "{}",
        text.stdout
    );
    assert!(
        section.iter().all(|l| l.chars().count() <= 100),
        "{}",
        text.stdout
    );
}

#[test]
fn sign_wraps_a_measurement_and_verify_report_accepts_it() {
    let v = Verified::new("shakespeare-awq-int4", &[]);
    let m = v.dir.path().join("m/measurement.json");
    let r = v.sign(&m);
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

/// A signed artifact reproduces the card, and the report says who vouches for the reference
/// (never "exact"). Regression (#41): the same artifact with its statement removed is refused,
/// and with --trust-unsigned-artifact it is self-asserted, so no claim is reproduced (exit 1).
#[test]
fn verify_against_a_reference_artifact_reproduces_only_when_a_trusted_key_signed_it() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let config = v.dir.path().join("config");
    std::fs::create_dir(&config).unwrap();
    let art = v.dir.path().join("reference.safetensors");
    let r = Cmd::reference_export()
        .flag("--model", model("shakespeare-bf16"))
        .eval_text(v.text())
        .context_length(128)
        .key(v.key())
        .out(&art)
        .env("CARDPROOF_CONFIG_DIR", &config)
        .run();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stderr.contains("signed"), "{}", r.stderr);
    let verify = |extra: &[&str], out: &str| {
        Cmd::verify(v.candidate())
            .flag("--reference-artifact", &art)
            .eval_text(v.text())
            .key(v.key())
            .out(v.dir.path().join(out))
            .arg("--json")
            .args(extra)
            .env("CARDPROOF_CONFIG_DIR", &config)
            .run()
    };
    let public = v.public();
    let r = verify(&["--artifact-pub", public.to_str().unwrap()], "signed");
    assert_eq!(r.code, 0, "{}\n{}", r.stderr, r.stdout);
    let report = r.json();
    assert_eq!(report["verdict"], "reproduced");
    assert_eq!(
        report["measurement"]["environment"]["reference_artifact"]["kind"],
        "hidden"
    );
    let source = report["reference_source"].as_str().unwrap();
    assert!(source.contains("artifact signed by"), "{source}");
    assert!(source.contains("claiming manifest"), "{source}");
    assert!(!source.contains("exact"), "{source}");
    let md = std::fs::read_to_string(v.dir.path().join("signed/report.md")).unwrap();
    assert!(md.contains("artifact signed by"), "{md}");
    // The statement removed: refused before any work, naming the file.
    std::fs::remove_file(v.dir.path().join("reference.safetensors.dsse.json")).unwrap();
    let r = verify(&["--artifact-pub", public.to_str().unwrap()], "unsigned");
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(r.message().contains("not vouched for"), "{}", r.message());
    // Self-asserted with consent: the rerun's numbers shown, nothing reproduced.
    let r = verify(&["--trust-unsigned-artifact"], "self-asserted");
    assert_eq!(r.code, 1, "{}\n{}", r.stderr, r.stdout);
    let report = r.json();
    assert_eq!(report["verdict"], "not_comparable");
    for claim in report["claims"].as_array().unwrap() {
        assert_eq!(claim["verdict"], "not_comparable", "{claim}");
        assert!(claim["rerun"].is_number(), "{claim}");
        assert!(
            claim["differences"].to_string().contains("self-asserted"),
            "{claim}"
        );
    }
}

#[test]
fn verify_without_a_reference_says_how_to_give_one() {
    let out = tempfile::tempdir().unwrap();
    let keys = out.path().join("keys");
    let k = cardproof(&["keygen", "--out", keys.to_str().unwrap()]);
    assert_eq!(k.code, 0, "{}", k.stderr);
    for runner in ["native", "transformers"] {
        let r = Cmd::verify(model("shakespeare-fp8-block"))
            .flag("--runner", runner)
            .key(keys.join("cardproof.key"))
            .out(out.path().join(runner))
            .run();
        assert_eq!(r.code, 2, "{}", r.stderr);
        assert!(
            r.stderr.contains("fidelity.reference: verify needs the reference: pass --reference PATH or hf:ORG/NAME@REVISION"),
            "{}",
            r.stderr
        );
        assert!(!out.path().join(runner).exists(), "nothing written");
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The signed statement inside an envelope (not verified: the tests verify with the CLI).
fn statement(envelope: &Path) -> serde_json::Value {
    use base64::Engine as _;
    let e = read_json(envelope);
    let payload = base64::engine::general_purpose::STANDARD
        .decode(e["payload"].as_str().unwrap())
        .unwrap();
    serde_json::from_slice(&payload).unwrap()
}

/// Every file of a directory (recursively) with its bytes.
fn files(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    out
}

/// The entries beside `--out` whose names start with `prefix`.
fn beside(out: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// The run id every file of the report set in `out` carries; panics if they disagree.
fn set_run_id(out: &Path) -> String {
    let report = read_json(&out.join("report.json"));
    let id = report["run_id"]
        .as_str()
        .expect("report.json has a run id")
        .to_owned();
    assert_eq!(
        statement(&out.join("report.dsse.json"))["predicate"],
        report
    );
    assert_eq!(
        read_json(&out.join("measurement.json"))["run_id"],
        id.as_str()
    );
    assert_eq!(
        read_json(&out.join(".cardproof-set.json"))["run_id"],
        id.as_str()
    );
    for f in ["report.md", "report.html"] {
        let text = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(text.contains(&id), "{f} shows the run id");
    }
    id
}

/// Regression (#41): the card's `model-index` (what the Hub page and leaderboards show) could
/// be edited after signing, kld_mean 0.000165 → 0.0000165, with lint clean and verify-report
/// saying the card is the one it signed. Now a model-index metric that disagrees with the claim
/// it mirrors is a lint error, and the report binds the whole model-index.
#[test]
fn the_hubs_model_index_is_bound_by_the_signature_and_linted_against_the_claims() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.json()["card"]["model_index_sha256"].is_string());
    let envelope = v.out().join("report.dsse.json");
    let ok = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    let original = std::fs::read_to_string(v.card()).unwrap();
    let line = original
        .lines()
        .find(|l| l.contains("{type: kld_mean, value: "))
        .expect("card writes model-index")
        .to_owned();
    let value = line
        .split("value: ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    let shrunk = format!("0.0{}", value.trim_start_matches("0."));
    let edited = original.replacen(&line, &line.replacen(value, &shrunk, 1), 1);
    std::fs::write(v.card(), &edited).unwrap();
    let lint = cardproof(&["lint", v.candidate().to_str().unwrap(), "--json"]);
    assert_eq!(lint.code, 1, "{}", lint.stdout);
    let finding = lint.finding("model-index-contradicts-disclosure");
    assert_eq!(finding["severity"], "error");
    assert!(
        finding["message"].as_str().unwrap().contains(&shrunk),
        "{finding}"
    );
    assert!(finding["line"].as_u64().is_some(), "{finding}");
    let r = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("`model-index`"), "{}", r.stdout);
    assert!(r.stdout.contains("edited after signing"), "{}", r.stdout);
    // A number of another name, beside the claims: lint cannot know it mirrors one, the
    // signature still covers it.
    let added = original.replacen(
        "          - {type: kld_p99,",
        "          - {type: kld, value: 0.0000001, name: \"KLD\"}\n          - {type: kld_p99,",
        1,
    );
    assert_ne!(added, original);
    std::fs::write(v.card(), &added).unwrap();
    let r = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("`model-index`"), "{}", r.stdout);
}

#[test]
fn a_card_edited_after_signing_no_longer_verifies() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let report = r.json();
    let original = std::fs::read_to_string(v.card()).unwrap();
    // The report binds the card: the SHA-256 of its fidelity block in canonical form.
    let card = cardproof::card::Card::open(&v.card()).unwrap();
    let fidelity = cardproof::card::canonical::fidelity_json(&card);
    assert_eq!(
        report["card"]["fidelity_sha256"],
        cardproof::card::canonical::fidelity_sha256(&fidelity)
            .unwrap()
            .as_str()
    );
    let envelope = v.out().join("report.dsse.json");
    let ok = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("is the one it signed"), "{}", ok.stdout);

    // A claimed value raised after signing: the subjects still match, the card does not.
    let line = original
        .lines()
        .find(|l| l.contains("metric: kld_mean,") && l.contains("value: "))
        .expect("a kld_mean claim")
        .to_owned();
    let value = line
        .split("value: ")
        .nth(1)
        .and_then(|v| v.split(',').next())
        .unwrap()
        .trim()
        .to_owned();
    let edited_line = line.replacen(&format!("value: {value}"), "value: 0.0198", 1);
    std::fs::write(v.card(), original.replacen(&line, &edited_line, 1)).unwrap();
    let r = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("edited after signing"), "{}", r.stdout);
    assert!(
        r.stdout
            .contains(&format!("].value: signed {value}, card 0.0198")),
        "{}",
        r.stdout
    );
    // The same number reprinted with more digits claims a precision that was never judged.
    let finer = format!("{value}000");
    let reprinted = line.replacen(&format!("value: {value}"), &format!("value: {finer}"), 1);
    std::fs::write(v.card(), original.replacen(&line, &reprinted, 1)).unwrap();
    let r = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains(&format!("signed `{value}`")) && r.stdout.contains(&finer),
        "{}",
        r.stdout
    );
    std::fs::write(v.card(), original.replacen(&line, &edited_line, 1)).unwrap();
    // --card compares another copy of the card; the signed one verifies.
    let signed_card = v.dir.path().join("signed-card.md");
    std::fs::write(&signed_card, &original).unwrap();
    let args = vec![
        "verify-report".to_owned(),
        envelope.display().to_string(),
        "--pub".into(),
        v.public().display().to_string(),
        "--card".into(),
    ];
    let with_card = |card: &Path, checkpoint: bool| {
        let mut a = args.clone();
        a.push(card.display().to_string());
        if checkpoint {
            a.push("--checkpoint".into());
            a.push(v.candidate().display().to_string());
        }
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        cardproof(&a)
    };
    let r = with_card(&signed_card, true);
    assert_eq!(
        r.code, 0,
        "--card overrides the checkpoint's card: {}",
        r.stdout
    );
    let r = with_card(&v.card(), false);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stdout.contains("edited after signing"), "{}", r.stdout);

    // A card without its fidelity block, and no card at all.
    let (front, _) = original.split_once("fidelity:").unwrap();
    let body = original.split("\n---").nth(1).unwrap();
    std::fs::write(v.card(), format!("{front}---{body}")).unwrap();
    let r = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout
            .contains("has no `fidelity` block, but the report signed one"),
        "{}",
        r.stdout
    );
    std::fs::remove_file(v.card()).unwrap();
    let r = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stdout.contains("there is no card"), "{}", r.stdout);
    std::fs::write(v.card(), &original).unwrap();

    // A report signed without the binding (as older versions wrote them) vouches for no card.
    let mut legacy = report.clone();
    legacy["card"]
        .as_object_mut()
        .unwrap()
        .remove("fidelity_sha256");
    let legacy_path = v.dir.path().join("legacy.json");
    std::fs::write(&legacy_path, legacy.to_string()).unwrap();
    let r = v.sign(&legacy_path);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = v.verify_report(&v.dir.path().join("legacy.dsse.json"), Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stdout.contains("does not bind the card"), "{}", r.stdout);
}

#[test]
fn a_failed_or_killed_verify_leaves_the_previous_set_whole() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let first = set_run_id(&v.out());
    assert_eq!(
        r.json()["run_id"],
        first.as_str(),
        "stdout is the set's report"
    );
    let before = files(&v.out());

    // A verify that fails into the same --out (no reference): the set is untouched.
    let r = Cmd::verify(v.candidate())
        .eval_text(v.text())
        .key(v.key())
        .out(v.out())
        .run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(files(&v.out()), before);

    // A verify killed mid-run (SIGKILL: nothing of it runs after the signal) leaves the set
    // untouched and only its hidden temporary directory beside it.
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("cardproof"))
        .args(v.verify_cmd().eval_text(v.text()).argv())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while beside(&v.out(), ".cardproof-tmp.").is_empty() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the run never made its temporary directory"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended first");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(files(&v.out()), before, "the killed run touched the set");
    assert_eq!(beside(&v.out(), ".cardproof-tmp.").len(), 1);
    let ok = v.verify_report(&v.out().join("report.dsse.json"), Some(&v.candidate()));
    assert_eq!(ok.code, 0, "{}", ok.stdout);

    // The next run removes what the killed one left and replaces the set whole.
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let second = set_run_id(&v.out());
    assert_ne!(second, first);
    assert!(beside(&v.out(), ".cardproof-").is_empty());
    assert!(beside(&v.out(), ".report.cardproof-lock").is_empty());
    let names = |m: &std::collections::BTreeMap<PathBuf, Vec<u8>>| -> Vec<PathBuf> {
        m.keys().cloned().collect()
    };
    assert_eq!(names(&files(&v.out())), names(&before));
}

#[test]
fn verify_report_refuses_a_set_that_mixes_two_runs() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let earlier = files(&v.out());
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stderr);
    let envelope = v.out().join("report.dsse.json");
    assert_eq!(v.verify_report(&envelope, None).code, 0);
    // Any file of the earlier run beside this run's envelope is caught, each by name
    // (positions.safetensors is the same bytes in both: the same computation).
    for name in [
        "report.json",
        "measurement.json",
        "report.md",
        "report.html",
    ] {
        let path = v.out().join(name);
        let now = std::fs::read(&path).unwrap();
        std::fs::write(&path, &earlier[&path]).unwrap();
        let r = v.verify_report(&envelope, None);
        assert_eq!(r.code, 1, "{name}: {}", r.stdout);
        assert!(
            r.stdout.contains(&format!("set: {}", path.display())),
            "{name}: {}",
            r.stdout
        );
        std::fs::write(&path, now).unwrap();
    }
    // The earlier run's envelope beside this run's report.json.
    std::fs::write(&envelope, &earlier[&envelope]).unwrap();
    let r = v.verify_report(&envelope, None);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(r.stdout.contains("mixes two runs"), "{}", r.stdout);
}

/// Verifies `v`'s card against another reference: the bf16 example's files with its weights cut
/// short. It hashes to another digest and cannot be loaded, so a verdict (not a load error)
/// shows no model ran. Returns that reference's directory and the run.
fn verify_with_a_wrong_reference(v: &Verified, extra: &[&str]) -> (PathBuf, Run) {
    let wrong = crate::support::unloadable_copy("shakespeare-bf16", &v.dir.path().join("wrong"));
    let run = Cmd::verify(v.candidate())
        .reference(&wrong)
        .eval_text(v.text())
        .key(v.key())
        .out(v.out())
        .args(extra)
        .run();
    (wrong, run)
}

#[test]
fn a_wrong_reference_is_caught_before_any_forward_pass() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let (wrong, r) = verify_with_a_wrong_reference(&v, &["--json"]);
    assert_eq!(r.code, 1, "not_comparable is findings: {}", r.stderr);
    assert!(!r.stderr.contains("model.safetensors"), "{}", r.stderr);
    let report = r.json();
    assert_eq!(report["verdict"], "not_comparable", "{report}");
    assert!(report["measurement"].is_null(), "{report}");
    let card_digest = report["card"]["disclosure"]["reference"]["files_sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let given = cardproof(&["hash", wrong.to_str().unwrap(), "--json"]).json()["root_sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(card_digest, given);
    let differences = report["lane_differences"].as_array().unwrap();
    assert_eq!(differences.len(), 1, "{report}");
    assert_eq!(differences[0]["field"], "fidelity.reference.files_sha256");
    let claims = report["claims"].as_array().unwrap();
    assert!(!claims.is_empty());
    for claim in claims {
        assert_eq!(claim["verdict"], "not_comparable", "{claim}");
        let reason = claim["reason"].as_str().unwrap();
        assert!(
            reason.starts_with("not rerun: the files given are not the ones the card names"),
            "{reason}"
        );
        let expected =
            format!("reference files (root sha256): card {card_digest}, given files {given}");
        assert!(
            claim["differences"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d.as_str() == Some(expected.as_str())),
            "{claim}"
        );
        assert!(claim["rerun"].is_null(), "{claim}");
    }
    // Written and signed as usual: the envelope verifies and holds the same report.
    let envelope = v.out().join("report.dsse.json");
    let checked = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(checked.code, 0, "{}", checked.stderr);
    assert_eq!(statement(&envelope)["predicate"], report);
}

#[test]
fn verify_shows_the_rerun_to_the_claims_digits_and_the_relative_difference() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let card = std::fs::read_to_string(v.card()).unwrap();
    let (line, value) = v.claim_line("kld_mean");
    let x: f64 = value.parse().unwrap();
    // The claim written with a trailing zero: four significant digits and a fifth that is 0.
    let decimals = (3 - x.log10().floor() as i32) as usize;
    let written = format!("{:.decimals$}0", x);
    assert!(
        written.ends_with('0') && written.parse::<f64>().is_ok(),
        "{written}"
    );
    std::fs::write(
        v.card(),
        card.replacen(
            &line,
            &line.replace(&format!("value: {value}"), &format!("value: {written}")),
            1,
        ),
    )
    .unwrap();
    let r = v.verify_cmd().eval_text(v.text()).run();
    assert!(r.code == 0 || r.code == 1, "{}", r.stderr);
    let report = read_json(&v.out().join("report.json"));
    let claim = report["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["metric"] == "kld_mean")
        .unwrap();
    assert_eq!(claim["claimed_text"], written.as_str());
    let rerun = claim["rerun"].as_f64().unwrap();
    let claimed: f64 = written.parse().unwrap();
    // One digit finer than the claim's last written digit, and (rerun − claimed) / |claimed|.
    let d = decimals + 2;
    let rerun_text = format!("{rerun:.d$}");
    let rel = cardproof::disclosure::precision::percent_text((rerun - claimed) / claimed);
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("kld_mean "))
        .unwrap_or_else(|| panic!("no kld_mean row in\n{}", r.stdout));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[2..5],
        [written.as_str(), rerun_text.as_str(), rel.as_str()],
        "{row}"
    );
    assert!(
        r.stdout
            .contains("rel. diff = (rerun - claimed) / |claimed|"),
        "{}",
        r.stdout
    );
    let html = std::fs::read_to_string(v.out().join("report.html")).unwrap();
    assert!(
        html.contains(&format!(r#"data-label="claimed">{written} ± "#))
            || html.contains(&format!(r#"data-label="claimed">{written}<"#)),
        "the claim as written in report.html"
    );
    assert!(html.contains(&format!(r#"data-label="rerun">{rerun_text}<"#)));
    assert!(html.contains(&format!(r#"data-label="relative difference">{rel}<"#)));
    let md = std::fs::read_to_string(v.out().join("report.md")).unwrap();
    assert!(md.contains(&format!("| {rerun_text} | {rel} |")), "{md}");
    assert!(
        !md.contains("&lt;") && !md.contains("\\("),
        "report.md reads raw:\n{md}"
    );
}

#[test]
fn a_reason_shared_by_consecutive_claims_is_printed_once() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let (_, r) = verify_with_a_wrong_reference(&v, &[]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    let claims = r
        .stdout
        .lines()
        .filter(|l| l.ends_with(" not_comparable"))
        .count();
    assert!(claims >= 2, "{}", r.stdout);
    assert_eq!(
        r.stdout.matches("reference files (root sha256)").count(),
        1,
        "{}",
        r.stdout
    );
    assert_eq!(
        r.stdout.matches("not rerun: the files given").count(),
        1,
        "{}",
        r.stdout
    );
    assert_eq!(
        r.stdout.matches("(the same reason as above)").count(),
        claims - 1,
        "{}",
        r.stdout
    );
}

#[test]
fn a_card_whose_recurrent_state_dtype_differs_from_the_rerun_is_not_reproduced() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let card = std::fs::read_to_string(v.card()).unwrap();
    let kv = card
        .lines()
        .find(|l| l.trim_start().starts_with("kv_cache_dtype:"))
        .expect("the written card's runtime names its KV-cache dtype")
        .to_owned();
    let indent = &kv[..kv.len() - kv.trim_start().len()];
    let with_state = |dtype: &str| {
        card.replacen(
            &kv,
            &format!("{kv}\n{indent}recurrent_state_dtype: {dtype}"),
            1,
        )
    };

    // The card says its numbers were measured with a bf16 state; the rerun keeps f32: another
    // lane, as with a KV-cache dtype mismatch, so no claim is reproduced (exit 1).
    std::fs::write(v.card(), with_state("bf16")).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    let report = r.json();
    assert_eq!(report["verdict"], "not_comparable", "{report}");
    assert_eq!(
        report["lane_differences"],
        serde_json::json!([{
            "field": "fidelity.runtime.recurrent_state_dtype",
            "card": "bf16",
            "rerun": "f32",
            "message": "recurrent-state dtype: card bf16, rerun f32",
        }])
    );
    for claim in report["claims"].as_array().unwrap() {
        assert_eq!(claim["verdict"], "not_comparable", "{claim}");
    }

    // The same dtype in torch's spelling is the same dtype.
    std::fs::write(v.card(), with_state("torch.float32")).unwrap();
    let r = v.verify();
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert_eq!(r.json()["verdict"], "reproduced");

    // A bad flag value is exit 2 naming the flag, before any work.
    let r = v
        .verify_cmd()
        .arg("--json")
        .eval_text(v.text())
        .flag("--recurrent-state-dtype", "half")
        .run();
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.message().contains("--recurrent-state-dtype: `half`"),
        "{}",
        r.stdout
    );
}

/// The committed cards of the hybrid (Gated DeltaNet) examples reproduce on CPU as they stand:
/// their own reference, the whole eval text, the cards' protocol. Also guards that a
/// compressed-tensors `targets: [Linear]` config is not read as covering the GDN layers'
/// depthwise `conv1d` (an `nn.Conv1d`), which would be a lint error and block `reproduced`.
#[test]
fn the_hybrid_example_cards_reproduce_as_committed() {
    for example in ["shakespeare-hybrid-w8a16", "shakespeare-hybrid-fp8-block"] {
        let out = tempfile::tempdir().unwrap();
        let lint = cardproof(&["lint", &model(example)]);
        assert_eq!(lint.code, 0, "{example}: {}{}", lint.stdout, lint.stderr);
        let r = Cmd::verify(model(example))
            .reference(model("shakespeare-hybrid-bf16"))
            .eval_text(repo_root().join("examples/data/eval.txt"))
            .out(out.path())
            .arg("--json")
            .run();
        assert_eq!(r.code, 0, "{example}: {}\n{}", r.stderr, r.stdout);
        let report = r.json();
        assert_eq!(report["verdict"], "reproduced", "{example}: {report}");
        assert_eq!(report["claims"].as_array().unwrap().len(), 5, "{example}");
        let environment = &report["measurement"]["environment"];
        assert_eq!(
            environment["recurrent_state_dtype"], "f32",
            "{example}: {environment}"
        );
    }
}

/// Rewrites `rel` in the set `out` with `edit`, and recomputes the set's unsigned marker as a
/// forger would (every file's size and SHA-256).
fn forge(out: &Path, rel: &str, edit: impl FnOnce(String) -> String) {
    let path = out.join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit(text)).unwrap();
    let marker_path = out.join(".cardproof-set.json");
    let mut marker = read_json(&marker_path);
    for f in marker["files"].as_array_mut().unwrap() {
        let p = out.join(f["path"].as_str().unwrap());
        let bytes = std::fs::read(&p).unwrap();
        f["size"] = bytes.len().into();
        f["sha256"] = cardproof::checkpoint::hash::hash_file(&p).unwrap().into();
    }
    std::fs::write(&marker_path, marker.to_string()).unwrap();
}

/// A not_reproduced set whose report.md and report.html were rewritten to "REPRODUCED", with the
/// unsigned marker recomputed, used to pass `verify-report --checkpoint`: the marker was all that
/// knew their digests. The signed report lists every other file of its set with its SHA-256
/// (`set_files`), and verify-report checks each, and refuses files it does not list.
#[test]
fn renderings_rewritten_after_signing_no_longer_verify() {
    let v = Verified::new("shakespeare-w8a16", &[]);
    let (line, value) = v.claim_line("kld_mean");
    let card = std::fs::read_to_string(v.card()).unwrap();
    let raised: f64 = value.parse::<f64>().unwrap() * 1.2;
    std::fs::write(
        v.card(),
        card.replacen(
            &line,
            &line.replacen(
                &format!("value: {value}"),
                &format!("value: {raised:.6}"),
                1,
            ),
            1,
        ),
    )
    .unwrap();
    let r = v.verify();
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(r.json()["verdict"], "not_reproduced");
    let out = v.out();
    let envelope = out.join("report.dsse.json");
    let signed = statement(&envelope)["predicate"]["set_files"].clone();
    let listed: Vec<&str> = signed
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [
            "measurement.json",
            "positions.safetensors",
            "report.html",
            "report.md"
        ]
    );
    assert_eq!(read_json(&out.join("report.json"))["set_files"], signed);
    // As written, the set verifies: an authentic not_reproduced report.
    let before = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(before.code, 0, "{}", before.stdout);
    assert!(
        before.stdout.contains(&format!(
            "every file of its set in {} is one it signed",
            out.display()
        )),
        "{}",
        before.stdout
    );
    assert!(
        before.stdout.contains("report verdict: not_reproduced"),
        "{}",
        before.stdout
    );

    // The forgery: both renderings say REPRODUCED, the marker agrees with them.
    for rel in ["report.md", "report.html"] {
        forge(&out, rel, |t| {
            let forged = t
                .replace("NOT REPRODUCED", "REPRODUCED")
                .replace("not reproduced", "reproduced")
                .replace("not_reproduced", "reproduced");
            assert!(forged != t, "{rel} shows the verdict");
            forged
        });
    }
    let r = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}", r.stdout);
    for rel in ["report.md", "report.html"] {
        assert!(
            r.stdout.contains(&format!(
                "set: {} changed after signing",
                out.join(rel).display()
            )),
            "{rel}: {}",
            r.stdout
        );
    }
    // A signed file removed, and a file the statement does not list, are caught by name too.
    std::fs::remove_file(out.join("report.html")).unwrap();
    std::fs::write(out.join("SUMMARY.md"), "# REPRODUCED\n").unwrap();
    let r = v.verify_report(&envelope, None);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout.contains(&format!(
            "set: {} is missing",
            out.join("report.html").display()
        )),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!(
            "set: {} is not a file of the set",
            out.join("SUMMARY.md").display()
        )),
        "{}",
        r.stdout
    );
}

/// `sign` of a measurement in its `measure` set binds the set's other file (positions.safetensors)
/// with it, so the rows cannot be rewritten after signing either; and it refuses to sign a set
/// whose files changed since the run wrote them.
#[test]
fn a_signed_measurement_binds_the_rows_of_its_set() {
    let v = Verified::new("shakespeare-awq-int4", &[]);
    let m = v.dir.path().join("m");
    let positions = m.join("positions.safetensors");
    let original = std::fs::read(&positions).unwrap();
    // Changed before signing: refused, naming the file.
    let mut edited = original.clone();
    let last = edited.len() - 1;
    edited[last] ^= 1;
    std::fs::write(&positions, &edited).unwrap();
    let r = v.sign(&m.join("measurement.json"));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "{} changed after its run wrote it",
            positions.display()
        )),
        "{}",
        r.stderr
    );
    assert!(!m.join("measurement.dsse.json").exists());
    std::fs::write(&positions, &original).unwrap();
    let r = v.sign(&m.join("measurement.json"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    let envelope = m.join("measurement.dsse.json");
    let predicate = statement(&envelope)["predicate"].clone();
    assert_eq!(predicate["set_files"][0]["path"], "positions.safetensors");
    assert_eq!(predicate["set_files"].as_array().unwrap().len(), 1);
    let ok = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(ok.code, 0, "{}", ok.stdout);
    // Changed after signing: a mismatch naming it.
    std::fs::write(&positions, &edited).unwrap();
    let r = v.verify_report(&envelope, Some(&v.candidate()));
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout.contains(&format!(
            "set: {} changed after signing",
            positions.display()
        )),
        "{}",
        r.stdout
    );
}

/// One layout rule for files and directories: a GGUF measured as a file gets a card beside it
/// naming the file (`candidate.file`), and that card verifies with the manifest it was measured
/// with whether `verify` is given the file or the directory; a card beside a file naming another
/// is refused, and so is a `candidate.file` that is a path.
#[test]
fn a_card_for_one_gguf_file_verifies_by_file_and_by_directory() {
    let dir = tempfile::tempdir().unwrap();
    let candidate = dir.path().join("candidate");
    // The example's card (measured on the directory) is rewritten from the file's measurement.
    crate::support::copy_model("shakespeare-q4_0-gguf", &candidate);
    let file = candidate.join("model.gguf");
    let text = crate::support::short_text(dir.path(), 2500);
    let m = dir.path().join("m");
    let r = crate::support::measure_short(&file, &text, &m, "100", &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = cardproof(&[
        "card",
        "--measurement",
        m.join("measurement.json").to_str().unwrap(),
    ]);
    assert_eq!(r.code, 0, "card: {}", r.stderr);
    let card = std::fs::read_to_string(candidate.join("README.md")).unwrap();
    assert!(card.contains("file: model.gguf"), "{card}");
    let reference = model("shakespeare-bf16");
    let verify = |target: &Path, out: &str| {
        Cmd::verify(target)
            .reference(&reference)
            .eval_text(&text)
            .out(dir.path().join(out))
            .arg("--json")
            .run()
    };
    for (target, out) in [(&file, "by-file"), (&candidate, "by-dir")] {
        let r = verify(target, out);
        assert_eq!(r.code, 0, "{out}: {}\n{}", r.stderr, r.stdout);
        let report = r.json();
        assert_eq!(report["verdict"], "reproduced", "{out}");
        let files = &report["checkpoint"]["files"];
        assert_eq!(files.as_array().unwrap().len(), 1, "{out}: {files}");
    }

    // A second GGUF beside the card is not what the card describes.
    let other = candidate.join("other.gguf");
    std::fs::copy(&file, &other).unwrap();
    let r = verify(&other, "other");
    assert_eq!(r.code, 2, "{}", r.stdout);
    let msg = r.message();
    assert!(
        msg.contains("describes `model.gguf`") && msg.contains("not `other.gguf`"),
        "{msg}"
    );
    // A card whose candidate.file is a path is refused, never followed.
    std::fs::write(
        candidate.join("README.md"),
        card.replace("file: model.gguf", "file: ../candidate/model.gguf"),
    )
    .unwrap();
    let r = verify(&candidate, "path");
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.message().contains("not a bare file name"),
        "{}",
        r.message()
    );
    // A file with no card beside it says so, naming the card it looked for.
    std::fs::remove_file(candidate.join("README.md")).unwrap();
    let r = verify(&file, "no-card");
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.message().contains("has no card beside it"),
        "{}",
        r.message()
    );
    assert!(!dir.path().join("no-card").exists());
}
