//! `hf:` sources and `check`, against the Hub-compatible server in `hub_server.rs` (never the
//! real Hub): header-only inspection, the cache layout, downloads with resume and verification,
//! network failures, offline mode, signed reports, SARIF.

use std::path::Path;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;

use crate::fixtures;
use crate::hub_server::{Faults, HubServer};
use crate::support::{Cmd, Run, compliant_card, compliant_with, repo_root};

const REPO: &str = "example-org/Qwen3-8B-FP8-block";
const C1: &str = "1111111111111111111111111111111111111111";
const C2: &str = "2222222222222222222222222222222222222222";

/// Run cardproof against `server` with `cache` as the hub cache and nothing from the user's
/// environment (no token, no real cache, short timeouts and backoff).
pub(crate) fn run(server: &HubServer, cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::cargo_bin("cardproof").expect("binary builds");
    cmd.current_dir(cache)
        .env("NO_COLOR", "1")
        .env("HF_ENDPOINT", &server.endpoint)
        .env("HF_HUB_CACHE", cache.join("hub"))
        .env("HF_HOME", cache.join("hf-home"))
        .env("CARDPROOF_HTTP_TIMEOUT_SECS", "2")
        .env("CARDPROOF_HTTP_BACKOFF_MS", "10")
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy");
    for (k, v) in env {
        cmd.env(k, v);
    }
    // A hang is a failure, not a stuck test run.
    let output = cmd
        .args(args)
        .timeout(Duration::from_secs(180))
        .output()
        .expect("binary runs");
    Run {
        code: output
            .status
            .code()
            .unwrap_or_else(|| panic!("cardproof {args:?} hung and was killed")),
        stdout: String::from_utf8(output.stdout).expect("UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8"),
    }
}

/// [`run`] of `cmd`'s arguments (its directory and environment are `run`'s).
fn run_cmd(server: &HubServer, cache: &Path, cmd: Cmd) -> Run {
    let args: Vec<&str> = cmd.argv().iter().map(String::as_str).collect();
    run(server, cache, &args, &[])
}

fn local(args: &[&str]) -> Run {
    crate::support::cardproof(args)
}

/// A sharded BF16 repo with a compliant card, published as `main` = C1.
fn sharded_repo() -> (HubServer, tempfile::TempDir, tempfile::TempDir) {
    let repo = tempfile::tempdir().unwrap();
    fixtures::sharded_bf16(repo.path());
    std::fs::write(repo.path().join("README.md"), compliant_card()).unwrap();
    std::fs::write(
        repo.path().join(".gitattributes"),
        "*.safetensors filter=lfs\n",
    )
    .unwrap();
    let server = HubServer::start();
    server.publish(REPO, "main", C1, repo.path());
    (server, repo, tempfile::tempdir().unwrap())
}

fn hf(rev: Option<&str>) -> String {
    match rev {
        Some(r) => format!("hf:{REPO}@{r}"),
        None => format!("hf:{REPO}"),
    }
}

#[test]
fn inspect_hf_reads_headers_only_and_matches_a_local_inspect() {
    let (server, repo, cache) = sharded_repo();
    let remote = run(
        &server,
        cache.path(),
        &["inspect", &hf(None), "--json"],
        &[],
    );
    assert_eq!(remote.code, 0, "{}", remote.stderr);
    let here = local(&["inspect", repo.path().to_str().unwrap(), "--json"]);
    assert_eq!(remote.json(), here.json());
    assert!(remote.stderr.contains(C1), "{}", remote.stderr);
    // Shards were read by Range only, through the redirect to the other origin.
    let log = server.log();
    let shard_reads: Vec<_> = log
        .iter()
        .filter(|l| l.listener == "cdn" && l.path.contains(".safetensors"))
        .collect();
    assert!(!shard_reads.is_empty());
    assert!(
        shard_reads
            .iter()
            .all(|l| l.range.is_some() && l.status == 206)
    );
    // Nothing was put into a snapshot: inspection does not download.
    assert!(
        !cache
            .path()
            .join("hub/models--example-org--Qwen3-8B-FP8-block/snapshots")
            .exists()
    );
}

#[test]
fn inspect_hf_gguf_matches_local() {
    let repo = tempfile::tempdir().unwrap();
    fixtures::gguf_q4_k(&repo.path().join("model-Q4_K_M.gguf"));
    let server = HubServer::start();
    server.publish(REPO, "main", C1, repo.path());
    let cache = tempfile::tempdir().unwrap();
    let remote = run(
        &server,
        cache.path(),
        &["inspect", &hf(None), "--json"],
        &[],
    );
    assert_eq!(remote.code, 0, "{}", remote.stderr);
    let here = local(&["inspect", repo.path().to_str().unwrap(), "--json"]);
    assert_eq!(remote.json(), here.json());
}

#[test]
fn inspect_survives_a_server_that_ignores_range() {
    let (server, repo, cache) = sharded_repo();
    server.set_faults(Faults {
        ignore_range: true,
        ..Faults::default()
    });
    let remote = run(
        &server,
        cache.path(),
        &["inspect", &hf(None), "--json"],
        &[],
    );
    assert_eq!(remote.code, 0, "{}", remote.stderr);
    let here = local(&["inspect", repo.path().to_str().unwrap(), "--json"]);
    assert_eq!(remote.json(), here.json());
}

/// Sparse shards of several GB: `check` fetches headers only (< 0.01% of the bytes) and its
/// inspection equals a local one.
#[test]
fn check_on_a_sparse_multi_gb_checkpoint_fetches_almost_nothing() {
    let repo = tempfile::tempdir().unwrap();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0u64;
    let shards = 3u64;
    for shard in 0..shards {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", shard + 1);
        // Two big BF16 projections per shard: 2 x 8192 x 65536 x 2 bytes = 2 GiB per shard.
        let mut header = serde_json::Map::new();
        let mut offset = 0u64;
        for (i, proj) in ["mlp.up_proj", "mlp.down_proj"].iter().enumerate() {
            let (rows, cols) = if i == 0 {
                (65536u64, 8192u64)
            } else {
                (8192, 65536)
            };
            let name = format!("model.layers.{shard}.{proj}.weight");
            let len = rows * cols * 2;
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": "BF16", "shape": [rows, cols], "data_offsets": [offset, offset + len]}),
            );
            offset += len;
            weight_map.insert(name, file.clone().into());
        }
        total += offset;
        let mut text = serde_json::to_string(&header).unwrap();
        while !text.len().is_multiple_of(8) {
            text.push(' ');
        }
        let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(text.as_bytes());
        let path = repo.path().join(&file);
        std::fs::write(&path, &bytes).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(bytes.len() as u64 + offset).unwrap();
    }
    fixtures::write_json(
        &repo.path().join("model.safetensors.index.json"),
        &serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
    );
    fixtures::write_json(
        &repo.path().join("config.json"),
        &fixtures::base_config(None),
    );
    std::fs::write(repo.path().join("README.md"), compliant_card()).unwrap();
    let server = HubServer::start();
    server.publish(REPO, "main", C1, repo.path());
    let cache = tempfile::tempdir().unwrap();

    let checked = run(&server, cache.path(), &["check", &hf(None), "--json"], &[]);
    assert_ne!(checked.code, 2, "{}", checked.stderr);
    let doc = checked.json();
    let fetched = doc["bytes_fetched"].as_u64().unwrap();
    let size = doc["total_bytes"].as_u64().unwrap();
    assert!(size > 6 << 30, "{size}");
    assert!(
        (fetched as f64) < size as f64 * 1e-4,
        "fetched {fetched} of {size} bytes"
    );
    assert_eq!(doc["commit"], C1);
    let here = local(&["inspect", repo.path().to_str().unwrap(), "--json"]).json();
    assert_eq!(doc["inspections"], here["variants"]);
}

fn local_root_digest(dir: &Path) -> String {
    local(&["hash", dir.to_str().unwrap(), "--json"]).json()["root_sha256"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn check_compares_the_cards_digest_and_revision_with_the_hub() {
    let (server, repo, cache) = sharded_repo();
    let root = local_root_digest(repo.path());
    // Matching digest and the head revision: no hub finding.
    let card = compliant_with(
        r#"    files_sha256: "5d41402abc4b2a76b9719d911017c592e1b0f1f4c6fbb4cb8b2f3a9e6d7c8b9a""#,
        &format!("    files_sha256: \"{root}\""),
    )
    .replace("3f1d2a7b9c0e4d5f6a7b8c9d0e1f2a3b4c5d6e7f", C1);
    std::fs::write(repo.path().join("README.md"), &card).unwrap();
    server.publish(REPO, "main", C1, repo.path());
    let ok = run(&server, cache.path(), &["check", &hf(None), "--json"], &[]);
    assert_ne!(ok.code, 2, "{}", ok.stderr);
    assert_eq!(
        ok.json()["hub_findings"],
        serde_json::json!([]),
        "{}",
        ok.stdout
    );

    // The published weights change in a new commit; the card still names C1.
    let v2 = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo.path()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), v2.path().join(e.file_name())).unwrap();
    }
    let shard = v2.path().join("model-00002-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    server.publish(REPO, "main", C2, v2.path());
    let stale = run(&server, cache.path(), &["check", &hf(None), "--json"], &[]);
    assert_eq!(stale.code, 1, "{}", stale.stderr);
    let codes: Vec<String> = stale.json()["hub_findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        codes.contains(&"hub-files-digest-mismatch".to_owned()),
        "{codes:?}"
    );
    assert!(
        codes.contains(&"hub-candidate-revision-stale".to_owned()),
        "{codes:?}"
    );
    assert!(stale.stdout.contains("model-00002-of-00002.safetensors"));

    // Only the card changed in a new commit: not stale.
    let v3 = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(repo.path()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), v3.path().join(e.file_name())).unwrap();
    }
    std::fs::write(
        v3.path().join("README.md"),
        format!("{card}\nMore prose.\n"),
    )
    .unwrap();
    let c3 = "3333333333333333333333333333333333333333";
    server.publish(REPO, "main", c3, v3.path());
    let edited = run(&server, cache.path(), &["check", &hf(None), "--json"], &[]);
    assert_eq!(
        edited.json()["hub_findings"],
        serde_json::json!([]),
        "{}",
        edited.stdout
    );

    // A revision the repository never had.
    let unknown = card.replace(C1, "4444444444444444444444444444444444444444");
    std::fs::write(v3.path().join("README.md"), unknown).unwrap();
    let c5 = "5555555555555555555555555555555555555555";
    server.publish(REPO, "main", c5, v3.path());
    let gone = run(&server, cache.path(), &["check", &hf(None), "--json"], &[]);
    assert!(
        gone.stdout.contains("hub-candidate-revision-unknown"),
        "{}",
        gone.stdout
    );
}

/// A verification report for `repo`'s checkpoint and card as `verify` signs it (subjects, the
/// card's fidelity block and its digest), with any `predicate` fields added.
fn signed_report(
    repo: &Path,
    key: &ed25519_dalek::SigningKey,
    predicate: serde_json::Value,
) -> serde_json::Value {
    let manifest = cardproof::checkpoint::hash::hash_path(
        repo,
        &cardproof::checkpoint::hash::HashOptions::default(),
        &|_| {},
    )
    .unwrap();
    let card = cardproof::card::Card::open(&repo.join("README.md")).unwrap();
    let fidelity = cardproof::card::canonical::fidelity_json(&card);
    let mut predicate = predicate;
    predicate["card"] = serde_json::json!({
        "fidelity_sha256": cardproof::card::canonical::fidelity_sha256(&fidelity),
        "model_index_sha256": cardproof::card::canonical::fidelity_sha256(
            &cardproof::card::canonical::model_index_json(&card),
        ),
        "disclosure": fidelity,
    });
    let statement =
        cardproof::attest::statement(&cardproof::attest::subjects(&manifest), predicate);
    cardproof::attest::sign_envelope(
        &serde_json::to_vec(&statement).unwrap(),
        cardproof::attest::PAYLOAD_TYPE,
        key,
    )
}

#[test]
fn check_verifies_a_signed_report_against_the_hubs_digests() {
    let (server, repo, cache) = sharded_repo();
    let key = cardproof::attest::generate_key().unwrap();
    let envelope = signed_report(
        repo.path(),
        &key,
        serde_json::json!({"verdict": "reproduced"}),
    );
    let keys = tempfile::tempdir().unwrap();
    let public = keys.path().join("cardproof.pub");
    std::fs::write(
        &public,
        cardproof::attest::public_key_pem(&key.verifying_key()),
    )
    .unwrap();
    std::fs::write(
        repo.path().join("report.dsse.json"),
        serde_json::to_vec(&envelope).unwrap(),
    )
    .unwrap();
    std::fs::write(repo.path().join("report.json"), b"{}").unwrap();
    server.publish(REPO, "main", C1, repo.path());
    let ok = run(
        &server,
        cache.path(),
        &[
            "check",
            &hf(None),
            "--json",
            "--pub",
            public.to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(ok.code, 2, "{}", ok.stderr);
    let doc = ok.json();
    assert_eq!(doc["report"]["signature"], "verified", "{}", ok.stdout);
    assert_eq!(doc["report"]["mismatches"], serde_json::json!([]));
    // Verified without downloading a weight: no shard body beyond its header was read.
    assert!(
        server
            .log()
            .iter()
            .filter(|l| l.path.contains(".safetensors"))
            .all(|l| l.range.is_some())
    );

    // A report that does not bind the card (no `card.fidelity_sha256`) vouches for no card.
    let statement = cardproof::attest::statement(
        &[cardproof::attest::Subject {
            name: "config.json".into(),
            sha256: "0".repeat(64),
        }],
        serde_json::json!({"verdict": "reproduced"}),
    );
    let unbound = cardproof::attest::sign_envelope(
        &serde_json::to_vec(&statement).unwrap(),
        cardproof::attest::PAYLOAD_TYPE,
        &key,
    );
    let bound = std::fs::read(repo.path().join("report.dsse.json")).unwrap();
    std::fs::write(
        repo.path().join("report.dsse.json"),
        serde_json::to_vec(&unbound).unwrap(),
    )
    .unwrap();
    server.publish(
        REPO,
        "main",
        "4444444444444444444444444444444444444444",
        repo.path(),
    );
    let r = run(&server, cache.path(), &["check", &hf(None), "--json"], &[]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.contains("does not bind the card"), "{}", r.stdout);
    std::fs::write(repo.path().join("report.dsse.json"), bound).unwrap();

    // A shard changes after signing.
    let shard = repo.path().join("model-00001-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    server.publish(REPO, "main", C2, repo.path());
    let bad = run(&server, cache.path(), &["check", &hf(None), "--json"], &[]);
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    assert!(bad.stdout.contains("hub-report-mismatch"));
    assert!(bad.stdout.contains("model-00001-of-00002.safetensors"));
}

#[test]
fn check_refuses_a_report_whose_card_was_edited_after_signing() {
    let (server, repo, cache) = sharded_repo();
    let key = cardproof::attest::generate_key().unwrap();
    let envelope = signed_report(
        repo.path(),
        &key,
        serde_json::json!({"verdict": "reproduced"}),
    );
    std::fs::write(
        repo.path().join("report.dsse.json"),
        serde_json::to_vec(&envelope).unwrap(),
    )
    .unwrap();
    let keys = tempfile::tempdir().unwrap();
    let public = keys.path().join("cardproof.pub");
    std::fs::write(
        &public,
        cardproof::attest::public_key_pem(&key.verifying_key()),
    )
    .unwrap();
    let check = |commit: &str| {
        server.publish(REPO, "main", commit, repo.path());
        run(
            &server,
            cache.path(),
            &[
                "check",
                &hf(None),
                "--json",
                "--pub",
                public.to_str().unwrap(),
            ],
            &[],
        )
    };
    let ok = check(C1);
    assert_eq!(
        ok.json()["report"]["mismatches"],
        serde_json::json!([]),
        "{}",
        ok.stdout
    );

    // The claimed value changed after signing (a card-only commit: the subjects still match).
    let card = compliant_card();
    let line = card
        .lines()
        .find(|l| l.contains("value: "))
        .expect("a claimed value")
        .to_owned();
    let old_value = line
        .split("value: ")
        .nth(1)
        .and_then(|v| v.split(',').next())
        .unwrap()
        .trim()
        .to_owned();
    let edited = card.replacen(&line, &line.replace(&old_value, "0.0198"), 1);
    std::fs::write(repo.path().join("README.md"), &edited).unwrap();
    let r = check(C2);
    assert_eq!(r.code, 1, "{}\n{}", r.stderr, r.stdout);
    let doc = r.json();
    assert_eq!(doc["report"]["signature"], "verified");
    let details: Vec<&str> = doc["report"]["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["detail"].as_str().unwrap())
        .collect();
    assert!(
        details.iter().any(|d| d.contains("edited after signing")),
        "{details:?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.ends_with(&format!("value: signed {old_value}, card 0.0198"))),
        "{details:?}"
    );
    assert!(r.stdout.contains("hub-report-mismatch"), "{}", r.stdout);

    // The card lost its fidelity block.
    let (front, _) = card.split_once("fidelity:").unwrap();
    let body = card.split("\n---").nth(1).unwrap_or("\n");
    std::fs::write(repo.path().join("README.md"), format!("{front}---{body}")).unwrap();
    let r = check("3333333333333333333333333333333333333333");
    assert_eq!(r.code, 1, "{}\n{}", r.stderr, r.stdout);
    assert!(
        r.stdout
            .contains("has no `fidelity` block, but the report signed one"),
        "{}",
        r.stdout
    );
}

fn snapshot(cache: &Path, commit: &str) -> std::path::PathBuf {
    cache
        .join("hub/models--example-org--Qwen3-8B-FP8-block/snapshots")
        .join(commit)
}

#[test]
fn hash_downloads_into_the_hf_cache_verifies_and_reuses() {
    let (server, repo, cache) = sharded_repo();
    let remote = run(&server, cache.path(), &["hash", &hf(None), "--json"], &[]);
    assert_eq!(remote.code, 0, "{}", remote.stderr);
    assert_eq!(
        remote.json()["root_sha256"].as_str().unwrap(),
        local_root_digest(repo.path())
    );
    assert!(remote.stderr.contains(C1), "{}", remote.stderr);
    let models = cache
        .path()
        .join("hub/models--example-org--Qwen3-8B-FP8-block");
    assert_eq!(
        std::fs::read_to_string(models.join("refs/main")).unwrap(),
        C1
    );
    let link = std::fs::read_link(snapshot(cache.path(), C1).join("config.json")).unwrap();
    assert!(link.starts_with("../../blobs"), "{}", link.display());
    let shard =
        std::fs::read_link(snapshot(cache.path(), C1).join("model-00001-of-00002.safetensors"))
            .unwrap();
    let sha = cardproof::checkpoint::hash::hash_file(
        &repo.path().join("model-00001-of-00002.safetensors"),
    )
    .unwrap();
    assert!(
        shard.ends_with(&sha),
        "blobs are named by SHA-256: {}",
        shard.display()
    );

    // Second run: everything from the cache, no file requests.
    server.clear_log();
    let again = run(&server, cache.path(), &["hash", &hf(None), "--json"], &[]);
    assert_eq!(again.code, 0);
    assert!(server.log().iter().all(|l| l.path.starts_with("/api/")));

    // Offline: the cache alone.
    let offline = run(
        &server,
        cache.path(),
        &["hash", &hf(None), "--json"],
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert_eq!(offline.code, 0, "{}", offline.stderr);
    assert_eq!(offline.json()["root_sha256"], remote.json()["root_sha256"]);
}

#[test]
fn offline_without_the_cache_names_repo_revision_and_file() {
    let (server, _repo, cache) = sharded_repo();
    let r = run(
        &server,
        cache.path(),
        &["hash", &hf(Some("v1.0"))],
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains(REPO) && r.stderr.contains("v1.0"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("HF_HUB_OFFLINE"), "{}", r.stderr);
    assert!(server.log().is_empty(), "offline mode made requests");

    // The revision is cached but not the card.
    let refs = cache
        .path()
        .join("hub/models--example-org--Qwen3-8B-FP8-block/refs");
    std::fs::create_dir_all(&refs).unwrap();
    std::fs::write(refs.join("main"), C1).unwrap();
    std::fs::create_dir_all(snapshot(cache.path(), C1)).unwrap();
    let r = run(
        &server,
        cache.path(),
        &["lint", &hf(None)],
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("README.md") && r.stderr.contains(C1),
        "{}",
        r.stderr
    );

    // check needs the Hub.
    let r = run(
        &server,
        cache.path(),
        &["check", &hf(None)],
        &[("HF_HUB_OFFLINE", "1")],
    );
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains(REPO), "{}", r.stderr);
}

#[test]
fn a_partial_download_is_resumed_with_range() {
    let (server, repo, cache) = sharded_repo();
    let name = "model-00002-of-00002.safetensors";
    let bytes = std::fs::read(repo.path().join(name)).unwrap();
    let sha = cardproof::checkpoint::hash::hash_file(&repo.path().join(name)).unwrap();
    let blobs = cache
        .path()
        .join("hub/models--example-org--Qwen3-8B-FP8-block/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let half = bytes.len() / 2;
    std::fs::write(blobs.join(format!("{sha}.incomplete")), &bytes[..half]).unwrap();
    let r = run(&server, cache.path(), &["hash", &hf(None), "--json"], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let resumed = server
        .log()
        .into_iter()
        .find(|l| l.listener == "cdn" && l.path.ends_with(name))
        .unwrap();
    assert_eq!(resumed.range.as_deref(), Some(&*format!("bytes={half}-")));
    assert_eq!(std::fs::read(blobs.join(&sha)).unwrap(), bytes);
    assert!(!blobs.join(format!("{sha}.incomplete")).exists());

    // A server that ignores Range on a resume sends the whole file: it is started over.
    let cache = tempfile::tempdir().unwrap();
    let blobs = cache
        .path()
        .join("hub/models--example-org--Qwen3-8B-FP8-block/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{sha}.incomplete")), &bytes[..half]).unwrap();
    server.set_faults(Faults {
        ignore_range: true,
        ..Faults::default()
    });
    let r = run(&server, cache.path(), &["hash", &hf(None), "--json"], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(std::fs::read(blobs.join(&sha)).unwrap(), bytes);
}

#[test]
fn a_corrupted_download_is_rejected_and_never_kept() {
    let (server, _repo, cache) = sharded_repo();
    server.set_faults(Faults {
        corrupt: true,
        ..Faults::default()
    });
    let r = run(&server, cache.path(), &["hash", &hf(None)], &[]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("do not match the Hub's"), "{}", r.stderr);
    assert!(r.stderr.contains(REPO), "{}", r.stderr);
    let blobs = cache
        .path()
        .join("hub/models--example-org--Qwen3-8B-FP8-block/blobs");
    for e in std::fs::read_dir(&blobs).unwrap() {
        let e = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!e.ends_with(".incomplete"), "{e} kept");
    }
    assert!(
        !snapshot(cache.path(), C1)
            .join("model-00001-of-00002.safetensors")
            .exists()
    );
}

#[test]
fn files_already_in_the_cache_are_reused() {
    let (server, repo, cache) = sharded_repo();
    // Lay the files out as another tool would have: blobs + relative links + refs.
    let models = cache
        .path()
        .join("hub/models--example-org--Qwen3-8B-FP8-block");
    std::fs::create_dir_all(models.join("blobs")).unwrap();
    std::fs::create_dir_all(snapshot(cache.path(), C1)).unwrap();
    for e in std::fs::read_dir(repo.path()).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let blob = format!("blob-{name}");
        std::fs::copy(e.path(), models.join("blobs").join(&blob)).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            snapshot(cache.path(), C1).join(&name),
        )
        .unwrap();
    }
    let r = run(&server, cache.path(), &["hash", &hf(None)], &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        server.log().iter().all(|l| l.path.starts_with("/api/")),
        "{:?}",
        server.log()
    );
    // inspect uses the cached shards too.
    server.clear_log();
    let r = run(
        &server,
        cache.path(),
        &["inspect", &hf(None), "--json"],
        &[],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(server.log().iter().all(|l| l.path.starts_with("/api/")));
}

#[test]
fn transient_failures_are_retried() {
    for faults in [
        Faults {
            fail_500: 2,
            ..Faults::default()
        },
        Faults {
            rate_limit: 1,
            ..Faults::default()
        },
        Faults {
            truncate: 1,
            ..Faults::default()
        },
        Faults {
            slow: 1,
            slow_for: Duration::from_secs(4),
            ..Faults::default()
        },
    ] {
        let (server, repo, cache) = sharded_repo();
        server.set_faults(faults.clone());
        let r = run(&server, cache.path(), &["hash", &hf(None), "--json"], &[]);
        assert_eq!(r.code, 0, "{faults:?}: {}", r.stderr);
        assert_eq!(
            r.json()["root_sha256"].as_str().unwrap(),
            local_root_digest(repo.path())
        );
        // The fault did happen: a failed status, or one file requested twice (a truncated
        // download resumes with `Range: bytes=N-`).
        let log = server.log();
        let repeated = log.iter().enumerate().any(|(i, a)| {
            log[i + 1..]
                .iter()
                .any(|b| (a.listener, &a.path) == (b.listener, &b.path))
        });
        assert!(
            log.iter().any(|l| matches!(l.status, 0 | 500 | 429)) || repeated,
            "{faults:?}: {log:?}"
        );
        server.clear_log();
        // Header reads (Range) recover the same way.
        let fresh = tempfile::tempdir().unwrap();
        server.set_faults(faults.clone());
        let r = run(
            &server,
            fresh.path(),
            &["inspect", &hf(None), "--json"],
            &[],
        );
        assert_eq!(r.code, 0, "{faults:?}: {}", r.stderr);
        let here = local(&["inspect", repo.path().to_str().unwrap(), "--json"]);
        assert_eq!(r.json(), here.json(), "{faults:?}");
    }
}

/// The blobs folder of the test repository in `cache`, and its `.incomplete` files.
fn incomplete_blobs(cache: &Path) -> Vec<(String, u64)> {
    let blobs = cache.join("hub/models--example-org--Qwen3-8B-FP8-block/blobs");
    let Ok(entries) = std::fs::read_dir(&blobs) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .filter(|(n, _)| n.ends_with(".incomplete"))
        .collect()
}

/// Regression (#14): the timeout was per read, so a server sending one byte every half second
/// held a download forever. The minimum-speed rule aborts it; what arrived is kept and the
/// retry resumes it with Range.
#[test]
fn a_trickling_server_is_aborted_by_the_minimum_speed_rule() {
    let (server, _repo, cache) = sharded_repo();
    server.set_faults(Faults {
        trickle: Some(Duration::from_millis(500)),
        ..Faults::default()
    });
    let started = std::time::Instant::now();
    let r = run(
        &server,
        cache.path(),
        &["hash", &hf(None)],
        &[
            ("CARDPROOF_HTTP_SPEED_WINDOW_SECS", "2"),
            ("CARDPROOF_HTTP_RETRIES", "1"),
        ],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("slowed to") && r.stderr.contains("CARDPROOF_HTTP_MIN_BYTES_PER_SEC"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains(REPO), "{}", r.stderr);
    assert!(started.elapsed() < Duration::from_secs(60));
    // The second attempt resumed the first one's bytes.
    assert!(
        server
            .log()
            .iter()
            .any(|l| l.range.as_deref().is_some_and(|r| r.starts_with("bytes="))),
        "{:?}",
        server.log()
    );
    assert!(
        incomplete_blobs(cache.path())
            .iter()
            .any(|(_, len)| *len > 0),
        "the partial download is kept for a resume"
    );
}

/// Regression (#14): model info claiming files of 10^15 bytes made `hash` download until the
/// disk was full. The free space is checked against the declared sizes before the first byte.
#[test]
fn declared_sizes_beyond_the_free_space_are_refused_before_downloading() {
    let (server, _repo, cache) = sharded_repo();
    server.set_faults(Faults {
        claim_size: Some(1_000_000_000_000_000),
        ..Faults::default()
    });
    let r = run(&server, cache.path(), &["hash", &hf(None)], &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("not enough free disk space")
            && r.stderr.contains("the download needs 20000000000"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains(REPO), "{}", r.stderr);
    assert!(
        server.log().iter().all(|l| l.path.starts_with("/api/")),
        "nothing is downloaded: {:?}",
        server.log()
    );
    assert!(incomplete_blobs(cache.path()).is_empty());
}

/// Regression (#14): a body whose Content-Length disagreed with the listing was read up to the
/// listed size and the rest ignored; now it is refused and its partial file deleted.
#[test]
fn a_body_longer_than_the_listing_is_refused_and_not_kept() {
    let (server, _repo, cache) = sharded_repo();
    server.set_faults(Faults {
        extra_bytes: 100,
        ..Faults::default()
    });
    let r = run(&server, cache.path(), &["hash", &hf(None)], &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("the server sends") && r.stderr.contains("the Hub lists"),
        "{}",
        r.stderr
    );
    assert!(incomplete_blobs(cache.path()).is_empty());
}

#[test]
fn persistent_failures_give_one_clear_message() {
    let (server, _repo, cache) = sharded_repo();
    server.set_faults(Faults {
        fail_500: 100,
        ..Faults::default()
    });
    let r = run(
        &server,
        cache.path(),
        &["inspect", &hf(None)],
        &[("CARDPROOF_HTTP_RETRIES", "2")],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("HTTP 500") && r.stderr.contains("3 attempt"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains(REPO), "{}", r.stderr);
    assert_eq!(server.log().len(), 3);
}

#[test]
fn missing_repo_revision_and_file_are_exit_2_naming_them() {
    let (server, _repo, cache) = sharded_repo();
    let r = run(
        &server,
        cache.path(),
        &["inspect", "hf:nobody/nothing"],
        &[],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("repository `nobody/nothing` not found"),
        "{}",
        r.stderr
    );
    let r = run(
        &server,
        cache.path(),
        &["check", &hf(Some("no-such-branch")), "--json"],
        &[],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.message().contains("revision `no-such-branch` not found"),
        "{}",
        r.stderr
    );
    assert!(r.json()["error"]["file"].as_str().unwrap().contains(REPO));
    // A repository without a card: lint names the file.
    let bare = tempfile::tempdir().unwrap();
    std::fs::write(bare.path().join("config.json"), "{}").unwrap();
    server.publish("example-org/bare", "main", C2, bare.path());
    let r = run(&server, cache.path(), &["lint", "hf:example-org/bare"], &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("README.md") && r.stderr.contains(C2),
        "{}",
        r.stderr
    );
    // Bad source syntax never reaches the network.
    for bad in [
        "hf:",
        "hf:a/b/c",
        "hf:org/na me",
        "hf:org/--x",
        "hf:org/x@",
        "hf:org/x@a..b",
    ] {
        let r = run(&server, cache.path(), &["inspect", bad], &[]);
        assert_eq!(r.code, 2, "{bad}");
        assert!(
            r.stderr.contains("not a valid Hub source"),
            "{bad}: {}",
            r.stderr
        );
    }
}

#[test]
fn gated_repo_needs_a_token_that_never_leaves_the_endpoint() {
    let (server, _repo, cache) = sharded_repo();
    server.set_faults(Faults {
        token: Some("hf_secret".into()),
        ..Faults::default()
    });
    let r = run(&server, cache.path(), &["inspect", &hf(None)], &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("HF_TOKEN") && r.stderr.contains("gated"),
        "{}",
        r.stderr
    );
    let r = run(
        &server,
        cache.path(),
        &["hash", &hf(None)],
        &[("HF_TOKEN", "hf_secret")],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let log = server.log();
    assert!(log.iter().any(|l| l.listener == "cdn"));
    assert!(
        log.iter()
            .filter(|l| l.listener == "cdn")
            .all(|l| !l.authorization)
    );
    assert!(
        log.iter()
            .filter(|l| l.listener == "hub" && l.status != 401)
            .all(|l| l.authorization)
    );
}

#[test]
fn lint_hf_fetches_only_the_card() {
    let (server, _repo, cache) = sharded_repo();
    let r = run(&server, cache.path(), &["lint", &hf(None), "--json"], &[]);
    assert_ne!(r.code, 2, "{}", r.stderr);
    assert_eq!(
        r.json()["file"].as_str().unwrap(),
        format!("hf:{REPO}@{C1}/README.md")
    );
    let paths: Vec<String> = server.log().into_iter().map(|l| l.path).collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(paths[1].ends_with("/resolve/1111111111111111111111111111111111111111/README.md"));
}

#[test]
fn lint_prints_sarif() {
    let card = repo_root().join("examples/cards/vague-disclosure/README.md");
    let r = local(&["lint", card.to_str().unwrap(), "--format", "sarif"]);
    assert_eq!(r.code, 1);
    let doc: Value = r.json();
    assert_eq!(doc["version"], "2.1.0");
    let run = &doc["runs"][0];
    assert_eq!(run["tool"]["driver"]["name"], "cardproof");
    let result = run["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ruleId"] == "vague-disclosure")
        .unwrap();
    assert_eq!(result["level"], "error");
    let region = &result["locations"][0]["physicalLocation"]["region"];
    assert!(region["startLine"].as_u64().unwrap() > 1);
    assert!(region["startColumn"].as_u64().is_some());
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    let index = result["ruleIndex"].as_u64().unwrap() as usize;
    assert_eq!(rules[index]["id"], "vague-disclosure");
    // Other verbs refuse it.
    let r = local(&["inspect", ".", "--format", "sarif"]);
    assert_eq!(r.code, 2);
}

#[test]
fn measure_on_hf_sources_records_the_pinned_commits() {
    let server = HubServer::start();
    let models = repo_root().join("examples/models");
    server.publish(
        "example-org/shakespeare-bf16",
        "main",
        C1,
        &models.join("shakespeare-bf16"),
    );
    server.publish(
        "example-org/shakespeare-fp8-block",
        "v1",
        C2,
        &models.join("shakespeare-fp8-block"),
    );
    let cache = tempfile::tempdir().unwrap();
    let text: String = std::fs::read_to_string(repo_root().join("examples/data/eval.txt"))
        .unwrap()
        .chars()
        .take(1500)
        .collect();
    std::fs::write(cache.path().join("eval.txt"), text).unwrap();
    let r = run_cmd(
        &server,
        cache.path(),
        Cmd::measure()
            .reference("hf:example-org/shakespeare-bf16")
            .candidate("hf:example-org/shakespeare-fp8-block@v1")
            .eval_text("eval.txt")
            .context_length(64)
            .bootstrap(10)
            .out("out")
            .arg("--json"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let written: Value = serde_json::from_str(
        &std::fs::read_to_string(cache.path().join("out/measurement.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(written, r.json());
    assert_eq!(written["candidate"]["hub"]["commit"], C2);
    assert_eq!(written["candidate"]["hub"]["revision"], "v1");
    assert_eq!(written["fidelity"]["candidate"]["revision"], C2);
    assert_eq!(
        written["fidelity"]["candidate"]["repo"],
        "example-org/shakespeare-fp8-block"
    );
    assert_eq!(written["fidelity"]["reference"]["revision"], C1);
    // The measured files are the Hub's: same manifest digest as the local copy.
    let local_root = local_root_digest(&models.join("shakespeare-fp8-block"));
    assert_eq!(written["fidelity"]["candidate"]["files_sha256"], local_root);
    // `card` never writes into the Hugging Face cache.
    let r = run(
        &server,
        cache.path(),
        &["card", "--measurement", "out/measurement.json"],
        &[],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("never writes into the Hugging Face cache"),
        "{}",
        r.stderr
    );
}

/// The whole path: measure a Hub candidate, write its card, publish the card, `check` it,
/// `verify` it from the Hub, publish the signed report, and `check` the report without
/// downloading anything.
#[test]
fn measure_card_publish_check_verify_and_check_the_report() {
    let server = HubServer::start();
    let models = repo_root().join("examples/models");
    let repo = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(models.join("shakespeare-fp8-block")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), repo.path().join(e.file_name())).unwrap();
    }
    server.publish(REPO, "main", C1, repo.path());
    let work = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo_root().join("examples/data/eval.txt")).unwrap();
    let end = text[2500..].find('\n').unwrap() + 2501;
    std::fs::write(work.path().join("eval.txt"), &text[..end]).unwrap();
    let bf16 = models.join("shakespeare-bf16");
    let m = run_cmd(
        &server,
        work.path(),
        Cmd::measure()
            .reference(&bf16)
            .candidate(hf(None))
            .eval_text("eval.txt")
            .context_length(128)
            .bootstrap(100)
            .out("m"),
    );
    assert_eq!(m.code, 0, "{}", m.stderr);
    let card = repo.path().join("README.md");
    let c = run(
        &server,
        work.path(),
        &[
            "card",
            "--measurement",
            "m/measurement.json",
            "--into",
            card.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(c.code, 0, "{}", c.stderr);
    assert!(std::fs::read_to_string(&card).unwrap().contains(C1));
    // Publishing the card makes a new commit; the weights are unchanged.
    server.publish(REPO, "main", C2, repo.path());
    let checked = run(&server, work.path(), &["check", &hf(None), "--json"], &[]);
    assert_eq!(checked.code, 0, "{}\n{}", checked.stderr, checked.stdout);
    assert_eq!(checked.json()["hub_findings"], serde_json::json!([]));

    let keys = work.path().join("keys");
    assert_eq!(
        run(&server, work.path(), &["keygen", "--out", "keys"], &[]).code,
        0
    );
    let v = run_cmd(
        &server,
        work.path(),
        Cmd::verify(hf(None))
            .reference(&bf16)
            .eval_text("eval.txt")
            .key("keys/cardproof.key")
            .out("report")
            .arg("--json"),
    );
    assert_eq!(v.code, 0, "{}", v.stderr);
    assert_eq!(v.json()["hub_sources"][0]["commit"], C2);
    for f in ["report.json", "report.dsse.json"] {
        std::fs::copy(work.path().join("report").join(f), repo.path().join(f)).unwrap();
    }
    server.publish(
        REPO,
        "main",
        "3333333333333333333333333333333333333333",
        repo.path(),
    );
    let checked = run(
        &server,
        work.path(),
        &[
            "check",
            &hf(None),
            "--json",
            "--pub",
            keys.join("cardproof.pub").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(checked.code, 0, "{}\n{}", checked.stderr, checked.stdout);
    let doc = checked.json();
    assert_eq!(doc["report"]["signature"], "verified");
    assert_eq!(doc["report"]["mismatches"], serde_json::json!([]));
}

#[test]
fn a_wrong_file_already_in_the_cache_is_refused() {
    let (server, _repo, cache) = sharded_repo();
    assert_eq!(
        run(&server, cache.path(), &["hash", &hf(None)], &[]).code,
        0
    );
    // Someone rewrote a cached blob in place.
    let config = snapshot(cache.path(), C1).join("config.json");
    let target = config.canonicalize().unwrap();
    std::fs::remove_file(&target).unwrap();
    std::fs::write(&target, b"{\"tampered\": true}").unwrap();
    let r = run(&server, cache.path(), &["hash", &hf(None)], &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("cached copy") && r.stderr.contains("config.json"),
        "{}",
        r.stderr
    );
}

#[test]
fn check_takes_a_local_directory_and_runs_the_pre_upload_checks() {
    // The same checks as for `hf:` before the upload: no Hub server at all (offline, no network).
    let repo = tempfile::tempdir().unwrap();
    fixtures::sharded_bf16(repo.path());
    let root = local_root_digest(repo.path());
    let card = compliant_with(
        r#"    files_sha256: "5d41402abc4b2a76b9719d911017c592e1b0f1f4c6fbb4cb8b2f3a9e6d7c8b9a""#,
        &format!("    files_sha256: \"{root}\""),
    );
    std::fs::write(repo.path().join("README.md"), &card).unwrap();
    let dir = repo.path().to_str().unwrap();
    let ok = local(&["check", dir, "--json"]);
    // The FP8 example card on BF16 tensors is a lint error (the card was linted against the
    // checkpoint's headers); the directory checks themselves find nothing.
    assert_eq!(ok.code, 1, "{}\n{}", ok.stdout, ok.stderr);
    let doc = ok.json();
    assert!(ok.stdout.contains("quantization-mismatch"), "{}", ok.stdout);
    assert_eq!(doc["hub_findings"], serde_json::json!([]), "{}", ok.stdout);
    assert_eq!(doc["commit"], Value::Null);
    assert_eq!(doc["bytes_fetched"], 0);
    assert_eq!(doc["source"], dir);
    // The checkpoint was inspected from its headers, as `inspect` reads it.
    let here = local(&["inspect", dir, "--json"]).json();
    assert_eq!(doc["inspections"], here["variants"]);

    // A signed report in the directory is checked against the local files and card.
    let key = cardproof::attest::generate_key().unwrap();
    let envelope = signed_report(
        repo.path(),
        &key,
        serde_json::json!({"verdict": "reproduced"}),
    );
    let keys = tempfile::tempdir().unwrap();
    let public = keys.path().join("cardproof.pub");
    std::fs::write(
        &public,
        cardproof::attest::public_key_pem(&key.verifying_key()),
    )
    .unwrap();
    std::fs::write(
        repo.path().join("report.dsse.json"),
        serde_json::to_vec(&envelope).unwrap(),
    )
    .unwrap();
    let signed = local(&["check", dir, "--json", "--pub", public.to_str().unwrap()]);
    assert_eq!(signed.code, 1, "{}\n{}", signed.stdout, signed.stderr);
    assert_eq!(signed.json()["report"]["signature"], "verified");
    assert_eq!(signed.json()["hub_findings"], serde_json::json!([]));

    // A weight changed after the measurement and the signature: both are errors, exit 1.
    let shard = repo.path().join("model-00002-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let bad = local(&["check", dir, "--json"]);
    assert_eq!(bad.code, 1, "{}", bad.stderr);
    let codes: Vec<String> = bad.json()["hub_findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        codes,
        ["hub-files-digest-mismatch", "hub-report-mismatch"],
        "{}",
        bad.stdout
    );
    assert!(bad.stdout.contains("model-00002-of-00002.safetensors"));
    let human = local(&["check", dir]);
    assert_eq!(human.code, 1);
    assert!(
        human.stderr.contains("(local, before upload): 3 errors")
            && human.stderr.contains("error[hub-files-digest-mismatch]"),
        "{}",
        human.stderr
    );

    // A file is not a directory to upload: a usage error.
    let file = local(&["check", &format!("{dir}/config.json")]);
    assert_eq!(file.code, 2, "{}", file.stderr);
    assert!(file.stderr.contains("model directory"), "{}", file.stderr);
}

/// The publishing loop against the Hub stand-in, in the recipe's commit order: measure a quant
/// against the reference on the Hub, upload the weights (commit 1), write the card pinning that
/// commit and upload it (commit 2), `verify` the weights' commit (it holds no card: the head's
/// card pins it; no `--reference`: the one the card pins), upload the signed report beside the
/// weights (commit 3), then `check` and `verify` the head. The report set is never part of the
/// checkpoint, so the digest, the signature and the rerun all agree.
#[test]
fn publish_measure_card_upload_check_and_verify_close_the_loop() {
    const R1: &str = "3333333333333333333333333333333333333333";
    let server = HubServer::start();
    let cache = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let reference = w.join("reference");
    crate::support::copy_model("shakespeare-bf16", &reference);
    server.publish("org/shakespeare-bf16", "main", R1, &reference);
    let candidate = w.join("candidate");
    crate::support::copy_model("shakespeare-w8a16", &candidate);
    std::fs::remove_file(candidate.join("README.md")).unwrap();
    let text = crate::support::short_text(w, 2500);
    let keys = w.join("keys");
    assert_eq!(local(&["keygen", "--out", keys.to_str().unwrap()]).code, 0);
    let key = keys.join("cardproof.key");
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let ok = |r: &Run| assert_eq!(r.code, 0, "{}{}", r.stderr, r.stdout);
    // The stand-in serves a commit from a directory: each commit its own copy.
    let commit = |name: &str| {
        let dir = w.join(name);
        crate::support::copy_dir(&candidate, &dir);
        dir
    };

    // Measured against the reference on the Hub; the card written from the measurement.
    let m = w.join("m");
    let measure = run(
        &server,
        cache.path(),
        &[
            "measure",
            "--reference",
            &format!("hf:org/shakespeare-bf16@{R1}"),
            "--candidate",
            &s(&candidate),
            "--eval-text",
            &s(&text),
            "--context-length",
            "128",
            "--bootstrap",
            "100",
            "--out",
            &s(&m),
        ],
        &[],
    );
    ok(&measure);
    let card = local(&[
        "card",
        "--measurement",
        &s(&m.join("measurement.json")),
        "--candidate-repo",
        "org/shakespeare-w8a16",
        "--candidate-revision",
        C1,
        "--quantization",
        "int8-channel",
        "--calibration",
        "none",
        "--into",
        &s(&candidate.join("README.md")),
    ]);
    ok(&card);
    let readme = std::fs::read(candidate.join("README.md")).unwrap();
    std::fs::remove_file(candidate.join("README.md")).unwrap();
    server.publish("org/shakespeare-w8a16", "main", C1, &commit("c1"));
    std::fs::write(candidate.join("README.md"), &readme).unwrap();
    server.publish("org/shakespeare-w8a16", "main", C2, &commit("c2"));

    // The upload verified, against the reference the card pins.
    let verify = |rev: &str, out: &Path| {
        run(
            &server,
            cache.path(),
            &[
                "verify",
                &format!("hf:org/shakespeare-w8a16@{rev}"),
                "--eval-text",
                &s(&text),
                "--key",
                &s(&key),
                "--out",
                &s(out),
                "--json",
            ],
            &[],
        )
    };
    let first = verify(C1, &w.join("report"));
    ok(&first);
    for note in [
        "using the reference the card pins",
        "holds no card: reading the card at the repository's head",
    ] {
        assert!(first.stderr.contains(note), "{}", first.stderr);
    }
    assert_eq!(first.json()["verdict"], "reproduced");

    // The report set published beside the weights.
    for f in std::fs::read_dir(w.join("report")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), candidate.join(f.file_name())).unwrap();
    }
    const C3: &str = "4444444444444444444444444444444444444444";
    server.publish("org/shakespeare-w8a16", "main", C3, &commit("c3"));
    let check = run(
        &server,
        cache.path(),
        &[
            "check",
            "hf:org/shakespeare-w8a16",
            "--pub",
            &s(&keys.join("cardproof.pub")),
            "--json",
        ],
        &[],
    );
    ok(&check);
    let doc = check.json();
    assert_eq!(doc["report"]["signature"], "verified", "{doc:#}");
    assert_eq!(
        doc["report"]["mismatches"],
        serde_json::json!([]),
        "{doc:#}"
    );
    let again = verify(C3, &w.join("again"));
    ok(&again);
    assert_eq!(again.json()["verdict"], "reproduced");
    // A weights commit the head's card does not pin is refused, naming both commits.
    std::fs::remove_file(candidate.join("README.md")).unwrap();
    const C5: &str = "5555555555555555555555555555555555555555";
    server.publish("org/shakespeare-w8a16", "other", C5, &commit("c5"));
    let stray = verify(C5, &w.join("stray"));
    assert_eq!(stray.code, 2, "{}", stray.stdout);
    assert!(
        stray.stdout.contains("holds no card") && stray.stdout.contains(C1),
        "{}",
        stray.stdout
    );
}

/// `ORG/NAME`, as `huggingface-cli` users type it, is read as `hf:ORG/NAME` when no such local
/// path exists (said on stderr); a path that exists stays a path.
#[test]
fn a_bare_repo_id_reads_as_hf_when_no_such_path_exists() {
    let (server, _repo, cache) = sharded_repo();
    let bare = run(&server, cache.path(), &["hash", REPO, "--json"], &[]);
    assert_eq!(bare.code, 0, "{}", bare.stderr);
    assert!(
        bare.stderr
            .contains(&format!("reading it as the Hub repository hf:{REPO}")),
        "{}",
        bare.stderr
    );
    let hf = run(&server, cache.path(), &["hash", &hf(None), "--json"], &[]);
    assert_eq!(hf.code, 0, "{}", hf.stderr);
    assert_eq!(bare.json()["root_sha256"], hf.json()["root_sha256"]);
    // Every command that takes `hf:` reads it so (they had said "no such file").
    for cmd in ["inspect", "lint", "check"] {
        let r = run(&server, cache.path(), &[cmd, REPO, "--json"], &[]);
        assert_ne!(r.code, 2, "{cmd}: {}{}", r.stderr, r.stdout);
        assert!(
            r.stderr.contains("reading it as the Hub repository"),
            "{cmd}: {}",
            r.stderr
        );
    }
    // A local directory of that name is the user's, not the Hub's.
    std::fs::create_dir_all(cache.path().join(REPO)).unwrap();
    let local_dir = run(&server, cache.path(), &["hash", REPO, "--json"], &[]);
    assert!(
        !local_dir.stderr.contains("reading it as the Hub"),
        "{}",
        local_dir.stderr
    );
}

/// `check` of a directory holding only a card once reported a digest mismatch against the empty
/// manifest: it says there is no checkpoint to check the card against.
#[test]
fn check_of_a_card_only_directory_says_there_is_no_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), compliant_card()).unwrap();
    let r = local(&["check", dir.path().to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 1, "{}{}", r.stderr, r.stdout);
    let codes: Vec<String> = r.json()["hub_findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(codes, ["hub-no-checkpoint"], "{}", r.stdout);
}

/// A published layout (`layouts/<file>.tensor-types.txt`, the per-tensor types given to
/// llama-quantize) is checked against the GGUF's header tensor by tensor: one that describes the
/// file passes, one line changed is `hub-layout-mismatch` naming the tensor; a tensor whose row
/// does not divide into the asked type's blocks takes llama.cpp's fallback and is no mismatch.
#[test]
fn a_published_layout_is_checked_against_the_gguf_tensor_by_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    crate::support::copy_model("shakespeare-q4_0-gguf", &model);
    let gguf = cardproof::checkpoint::gguf::read_file(&model.join("model.gguf")).unwrap();
    std::fs::create_dir_all(model.join("layouts")).unwrap();
    let write = |f: &dyn Fn(&str, &str) -> String| {
        let text: String = gguf
            .tensors
            .iter()
            .map(|t| {
                format!(
                    "^{}$={}\n",
                    t.name.replace('.', "\\."),
                    f(&t.name, t.ty.name())
                )
            })
            .collect();
        std::fs::write(model.join("layouts/model.gguf.tensor-types.txt"), text).unwrap();
    };
    let layout_codes = || -> Vec<String> {
        let r = local(&["check", model.to_str().unwrap(), "--json"]);
        assert_ne!(r.code, 2, "{}{}", r.stderr, r.stdout);
        r.json()["hub_findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["code"] == "hub-layout-mismatch")
            .map(|f| f["message"].as_str().unwrap().to_owned())
            .collect()
    };
    write(&|_, ty| ty.to_owned());
    assert_eq!(layout_codes(), Vec::<String>::new());
    let target = gguf
        .tensors
        .iter()
        .find(|t| t.ty.name() == "q4_0")
        .expect("a q4_0 tensor")
        .name
        .clone();
    write(&|name, ty| {
        if name == target {
            "q8_0".into()
        } else {
            ty.to_owned()
        }
    });
    let found = layout_codes();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(&format!("{target}: layout q8_0, file q4_0")),
        "{found:?}"
    );
    // The same repository on the Hub: `check hf:` fetches the layout and says the same.
    let server = HubServer::start();
    let cache = tempfile::tempdir().unwrap();
    server.publish(
        "org/m-GGUF",
        "main",
        "4444444444444444444444444444444444444444",
        &model,
    );
    let r = run(
        &server,
        cache.path(),
        &["check", "hf:org/m-GGUF", "--json"],
        &[],
    );
    assert_ne!(r.code, 2, "{}{}", r.stderr, r.stdout);
    let remote: Vec<String> = r.json()["hub_findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "hub-layout-mismatch")
        .map(|f| f["message"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(remote, found);
    // A k-quant asked of rows that do not divide into 256: llama.cpp's fallback, not a mismatch.
    write(&|name, ty| {
        if name == target {
            "q4_k".into()
        } else {
            ty.to_owned()
        }
    });
    let row = gguf.tensors.iter().find(|t| t.name == target).unwrap().dims[0];
    assert_eq!(layout_codes().is_empty(), row % 256 != 0, "row {row}");
}
