//! Compact reference artifacts: `reference export` and `measure --reference-artifact`.

use std::path::{Path, PathBuf};

use crate::support::{Cmd, LLAMACPP_PROTOCOL, cardproof, model, repo_root, short_text};

fn export(dir: &Path, text: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let r = Cmd::reference_export()
        .flag("--model", model("shakespeare-bf16"))
        .eval_text(text)
        .context_length(128)
        .out(&out)
        .args(extra)
        .run();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(crate::support::repo_root().exists());
    out
}

/// `measure --json` of `candidate` against `reference` (a `measure` with its reference flags:
/// [`full_reference`] or [`artifact_reference`]), with `extra` flags.
fn measure(dir: &Path, reference: Cmd, candidate: &str, extra: &[&str]) -> crate::support::Run {
    let out = dir.join(format!("m-{}", rand_name()));
    reference
        .candidate(candidate)
        .context_length(128)
        .bootstrap(50)
        .out(out)
        .arg("--json")
        .args(extra)
        .run()
}

/// `measure` against the bf16 example itself, on `text`.
fn full_reference(text: &Path) -> Cmd {
    Cmd::measure()
        .reference(model("shakespeare-bf16"))
        .eval_text(text)
}

/// `measure` against the reference artifact `art`.
fn artifact_reference(art: &Path) -> Cmd {
    Cmd::measure().flag("--reference-artifact", art)
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
            full_reference(&text),
            &model(candidate),
            &[],
        ));
        let via = measure(dir.path(), artifact_reference(&art), &model(candidate), &[]);
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
    let full = metrics(&measure(dir.path(), full_reference(&text), &candidate, &[]))["kld_mean"]
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
            artifact_reference(&art),
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
    let reference = artifact_reference(&art);
    // Another protocol.
    let r = reference
        .clone()
        .candidate(model("shakespeare-w8a16"))
        .context_length(64)
        .out(dir.path().join("x"))
        .run();
    assert_eq!(r.code, 2);
    assert!(r.message().contains("context_lengths"), "{}", r.stderr);
    // Another lm_head (the GGUF candidate's output matrix is Q8_0).
    let r = measure(
        dir.path(),
        reference.clone(),
        &model("shakespeare-q4_0-gguf"),
        &[],
    );
    assert_eq!(r.code, 2);
    assert!(r.message().contains("lm_head"), "{}", r.stderr);
    // Another eval text.
    let other = dir.path().join("other.txt");
    std::fs::write(&other, "some other text\n").unwrap();
    let r = measure(
        dir.path(),
        reference.clone().eval_text(&other),
        &model("shakespeare-w8a16"),
        &[],
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
    let r = measure(dir.path(), reference, &model("shakespeare-w8a16"), &[]);
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
        full_reference(&text),
        &candidate,
        &protocol,
    ))["kld_mean"]
        .as_f64()
        .unwrap();
    let via = measure(dir.path(), artifact_reference(&base), &candidate, &protocol);
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
        artifact_reference(&base),
        &candidate,
        &["--positions", "second-half", "--bos", "per-window"],
    );
    assert_eq!(r.code, 2);
    assert!(r.message().contains("--direction forward"), "{}", r.stderr);
}

/// A real llama.cpp base file as the reference: PPL(base) read from it matches what llama.cpp
/// printed, and the candidate's KLD lands in reference semantics (below llama.cpp's number,
/// which includes its Q8 activation rounding). llama.cpp signs nothing: the file is used only
/// with --trust-unsigned-artifact, and recorded as self-asserted.
#[test]
fn a_real_llamacpp_base_file_is_a_reference() {
    let fixtures = repo_root().join("tests/fixtures/llamacpp");
    let dir = tempfile::tempdir().unwrap();
    let run = measure(
        dir.path(),
        artifact_reference(&fixtures.join("ref.kld")).arg("--trust-unsigned-artifact"),
        fixtures.join("cand-q5_0.gguf").to_str().unwrap(),
        &LLAMACPP_PROTOCOL,
    );
    assert_eq!(
        run.json()["environment"]["reference_artifact"]["vouch"]["by"],
        "self_asserted"
    );
    let m = metrics(&run);
    let ppl_ref = m["ppl_ref"].as_f64().unwrap();
    assert!((ppl_ref / 5.550659 - 1.0).abs() < 1e-5, "{ppl_ref}");
    let kld = m["kld_mean"].as_f64().unwrap();
    assert!(kld < 0.003708 && kld > 0.85 * 0.003708, "{kld}");
}

/// A key pair made with `keygen` in `dir/name`: (private, public).
fn keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let keys = dir.join(name);
    let r = cardproof(&["keygen", "--out", keys.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    (keys.join("cardproof.key"), keys.join("cardproof.pub"))
}

/// Rewrite the artifact's JSON header (in `__metadata__`) with `edit`, keeping the tensors, and
/// recompute its `.sha256` sidecar: what a forger with a text editor does.
fn rewrite_header(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut outer: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let meta = &mut outer["__metadata__"]["cardproof_artifact"];
    let mut header: serde_json::Value = serde_json::from_str(meta.as_str().unwrap()).unwrap();
    edit(&mut header);
    *meta = header.to_string().into();
    let mut text = outer.to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, &out).unwrap();
    let digest: String = sha2::Sha256::digest(&out)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = path.file_name().unwrap().to_str().unwrap();
    std::fs::write(
        path.with_file_name(format!("{name}.sha256")),
        format!("{digest}  {name}\n"),
    )
    .unwrap();
}

/// The reference identity an artifact's header names.
fn reference_of(artifact: &Path) -> serde_json::Value {
    serde_json::to_value(
        cardproof::rerun::artifact::Artifact::open(artifact)
            .unwrap()
            .header
            .reference,
    )
    .unwrap()
}

/// An isolated config directory: no key of the user's own is trusted or created.
struct Isolated {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Isolated {
    fn new() -> Isolated {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        std::fs::create_dir(&config).unwrap();
        Isolated { dir, config }
    }

    fn run(&self, args: &[&str]) -> crate::support::Run {
        self.run_cmd(Cmd::new(args[0]).args(&args[1..]))
    }

    fn run_cmd(&self, cmd: Cmd) -> crate::support::Run {
        cmd.env("CARDPROOF_CONFIG_DIR", &self.config).run()
    }

    fn export(&self, model_name: &str, text: &Path, name: &str, key: &Path) -> PathBuf {
        let out = self.dir.path().join(name);
        let r = self.run_cmd(
            Cmd::reference_export()
                .flag("--model", model(model_name))
                .eval_text(text)
                .context_length(128)
                .key(key)
                .out(&out),
        );
        assert_eq!(r.code, 0, "{}", r.stderr);
        out
    }

    fn measure(&self, artifact: &Path, extra: &[&str]) -> crate::support::Run {
        let out = self.dir.path().join(format!("m-{}", rand_name()));
        self.run_cmd(
            artifact_reference(artifact)
                .candidate(model("shakespeare-fp8-block"))
                .context_length(128)
                .bootstrap(10)
                .out(out)
                .arg("--json")
                .args(extra),
        )
    }
}

/// Regression (#41): an artifact exported from another model, its header given the real
/// reference's identity and its `.sha256` recomputed, was accepted as the reference (and a card
/// claiming its number was `reproduced`). An artifact is now used only when a key the user
/// trusts signed what it states; anything else is refused (exit 2) or, with
/// --trust-unsigned-artifact, recorded as self-asserted.
#[test]
fn a_forged_reference_artifact_is_refused_unless_a_trusted_key_signed_it() {
    let iso = Isolated::new();
    let text = short_text(iso.dir.path(), 2500);
    let (exporter, exporter_pub) = keypair(iso.dir.path(), "exporter");
    let (forger, forger_pub) = keypair(iso.dir.path(), "forger");
    let real = iso.export("shakespeare-bf16", &text, "real.safetensors", &exporter);
    let real_reference = reference_of(&real);
    // The genuine artifact, with its exporter's key: accepted and recorded as signed.
    let ok = iso.measure(&real, &["--artifact-pub", exporter_pub.to_str().unwrap()]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    let vouch = &ok.json()["environment"]["reference_artifact"]["vouch"];
    assert_eq!(vouch["by"], "signed", "{vouch}");
    assert_eq!(
        vouch["reference"]["manifest_sha256"],
        real_reference["manifest_sha256"]
    );
    // The forger's artifact: another model's hidden states under the real reference's name,
    // sidecar recomputed, signed with the forger's own key.
    let forged = iso.export("shakespeare-w8a16", &text, "forged.safetensors", &forger);
    rewrite_header(&forged, |h| h["reference"] = real_reference.clone());
    std::fs::remove_file(forged.with_file_name("forged.safetensors.dsse.json")).unwrap();
    // No signature at all.
    let r = iso.measure(&forged, &[]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.message().contains("no signed statement beside it"),
        "{}",
        r.message()
    );
    // Signed by the forger, whom the user does not trust.
    let resigned = iso.export("shakespeare-w8a16", &text, "resigned.safetensors", &forger);
    rewrite_header(&resigned, |h| h["reference"] = real_reference.clone());
    let r = iso.measure(
        &resigned,
        &["--artifact-pub", exporter_pub.to_str().unwrap()],
    );
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.message().contains("not vouched for") || r.message().contains("signed about"),
        "{}",
        r.message()
    );
    // Even with the forger's key: the statement it signed was about the file before the edit.
    let r = iso.measure(&resigned, &["--artifact-pub", forger_pub.to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(r.message().contains("signed about"), "{}", r.message());
    // With consent: measured, and recorded as self-asserted.
    let r = iso.measure(&forged, &["--trust-unsigned-artifact"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.json()["environment"]["reference_artifact"]["vouch"]["by"],
        "self_asserted"
    );
    // The trust flags belong with an artifact.
    let r = iso.run_cmd(
        full_reference(&text)
            .candidate(model("shakespeare-fp8-block"))
            .context_length(128)
            .arg("--trust-unsigned-artifact"),
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
}

/// Regression (#41): with the reference's weights at hand too, a seeded sample of the
/// artifact's rows is recomputed and must match: a forged artifact signed by a trusted key (a
/// careless or compromised signer) is refused naming the window, and a true one passes, its
/// check recorded.
#[test]
fn the_reference_weights_spot_check_an_artifacts_rows() {
    let iso = Isolated::new();
    let text = short_text(iso.dir.path(), 2500);
    let (key, public) = keypair(iso.dir.path(), "signer");
    let trusted = ["--artifact-pub", public.to_str().unwrap()];
    let real = iso.export("shakespeare-bf16", &text, "real.safetensors", &key);
    let reference = model("shakespeare-bf16");
    let with_weights = [&trusted[..], &["--reference", reference.as_str()]].concat();
    let r = iso.measure(&real, &with_weights);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let check = &r.json()["environment"]["reference_artifact"]["spot_check"];
    assert!(check["rows"].as_u64().unwrap() > 0, "{check}");
    // The export's own path: the same rows up to the products' rounding (0 or ~1e-11 nats).
    assert!(check["max_row_kld"].as_f64().unwrap() < 1e-9, "{check}");
    // Another model's rows, signed (the signer vouched for the wrong file).
    let forged_plain = iso.export("shakespeare-w8a16", &text, "f.safetensors", &key);
    let real_reference = reference_of(&real);
    rewrite_header(&forged_plain, |h| h["reference"] = real_reference.clone());
    // Re-signed after the edit by the trusted key: the signature holds, the rows do not.
    resign(&forged_plain, &key);
    let r = iso.measure(&forged_plain, &trusted);
    assert_eq!(
        r.code, 0,
        "a signed forgery without the weights is measured: {}",
        r.stderr
    );
    let r = iso.measure(&forged_plain, &with_weights);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert!(
        r.message().contains("is not the reference's"),
        "{}",
        r.message()
    );
}

/// Sign an artifact as `reference export` does, with the library: a signer vouching for
/// whatever the file now states.
fn resign(path: &Path, key: &Path) {
    let artifact = cardproof::rerun::artifact::Artifact::open(path).unwrap();
    let key = cardproof::attest::read_signing_key(key).unwrap();
    cardproof::attest::artifact::sign(path, &artifact.sha256, &artifact.stated(), None, &key)
        .unwrap();
}

/// A llama.cpp base file made by llama.cpp signs nothing; its maker vouches for it with
/// `reference sign`, naming the model it was made from, and others then use it with the public
/// key (recorded as signed, with that model's root digest).
#[test]
fn reference_sign_vouches_for_a_llamacpp_base_file() {
    let iso = Isolated::new();
    let fixtures = repo_root().join("tests/fixtures/llamacpp");
    let base = iso.dir.path().join("ref.kld");
    std::fs::copy(fixtures.join("ref.kld"), &base).unwrap();
    let (key, public) = keypair(iso.dir.path(), "maker");
    let r = iso.run(&[
        "reference",
        "sign",
        base.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.message().contains("--reference MODEL"), "{}", r.message());
    let reference = fixtures.join("ref-f32.gguf");
    let r = iso.run(&[
        "reference",
        "sign",
        base.to_str().unwrap(),
        "--reference",
        reference.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.json()["predicate_type"],
        "https://cardproof.dev/reference-artifact/v1"
    );
    let out = iso.dir.path().join("m");
    let r = iso.run_cmd(
        artifact_reference(&base)
            .flag("--artifact-pub", &public)
            .candidate(fixtures.join("cand-q5_0.gguf"))
            .context_length(128)
            .bootstrap(10)
            .out(&out)
            .arg("--json")
            .args(LLAMACPP_PROTOCOL),
    );
    assert_eq!(r.code, 0, "{}", r.message());
    let vouch = &r.json()["environment"]["reference_artifact"]["vouch"];
    assert_eq!(vouch["by"], "signed", "{vouch}");
    assert!(vouch["reference"]["manifest_sha256"].is_string(), "{vouch}");
}

/// The config directory's trusted keys are read only by a run that uses an artifact: a stray
/// file in `trusted/` fails that run naming the file (exit 2), never a run without one.
#[test]
fn trusted_keys_are_read_only_when_an_artifact_is_used() {
    let iso = Isolated::new();
    let text = short_text(iso.dir.path(), 2500);
    let trusted = iso.config.join("trusted");
    std::fs::create_dir(&trusted).unwrap();
    std::fs::write(trusted.join("stray.pub"), "not a key\n").unwrap();
    let out = iso.dir.path().join("plain");
    let r = iso.run_cmd(
        full_reference(&text)
            .candidate(model("shakespeare-w8a16"))
            .context_length(128)
            .bootstrap(10)
            .out(&out),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let (key, _) = keypair(iso.dir.path(), "k");
    let art = iso.export("shakespeare-bf16", &text, "a.safetensors", &key);
    let r = iso.measure(&art, &[]);
    assert_eq!(r.code, 2, "{}", r.stdout);
    assert_eq!(
        r.json()["error"]["file"]
            .as_str()
            .map(|f| f.ends_with("stray.pub")),
        Some(true),
        "{}",
        r.stdout
    );
}
