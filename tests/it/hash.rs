//! `cardproof hash`: a manifest anyone can recompute with coreutils.

use std::process::Command;

use crate::support::*;

fn sample_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::write(
        p.join("model-00001-of-00002.safetensors"),
        vec![7u8; 300_000],
    )
    .unwrap();
    std::fs::write(
        p.join("model-00002-of-00002.safetensors"),
        vec![9u8; 123_457],
    )
    .unwrap();
    std::fs::write(p.join("config.json"), b"{}\n").unwrap();
    std::fs::write(p.join("README.md"), b"---\nlicense: mit\n---\n").unwrap();
    std::fs::write(p.join(".gitattributes"), b"*.safetensors filter=lfs\n").unwrap();
    std::fs::create_dir_all(p.join(".git/objects")).unwrap();
    std::fs::write(p.join(".git/HEAD"), b"ref: refs/heads/main\n").unwrap();
    std::fs::create_dir(p.join("tokenizer")).unwrap();
    std::fs::write(p.join("tokenizer/tokenizer.json"), b"{\"model\": {}}").unwrap();
    dir
}

#[test]
fn manifest_is_sha256sum_format_and_checks_with_coreutils() {
    let dir = sample_dir();
    let run = cardproof_in(dir.path(), &["hash", "."]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l.split_once("  ").unwrap().1)
        .collect();
    assert_eq!(
        names,
        [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "tokenizer/tokenizer.json"
        ]
    );
    assert!(run.stdout.ends_with('\n'));
    std::fs::write(dir.path().join("manifest.sha256"), &run.stdout).unwrap();
    let check = Command::new("sha256sum")
        .args(["-c", "manifest.sha256"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let root = Command::new("sha256sum")
        .arg("manifest.sha256")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let root = String::from_utf8(root.stdout).unwrap();
    let root = root.split_whitespace().next().unwrap();
    assert!(
        run.stderr.contains(root),
        "root digest {root} not in: {}",
        run.stderr
    );
}

#[test]
fn json_lists_files_root_and_what_was_excluded() {
    let dir = sample_dir();
    let run = cardproof_in(dir.path(), &["hash", ".", "--json"]);
    assert_eq!(run.code, 0);
    let doc = run.json();
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(
        doc["excluded"],
        serde_json::json!([".git/", ".gitattributes", "README.md"])
    );
    let files = doc["files"].as_array().unwrap();
    assert_eq!(files.len(), 4);
    assert_eq!(files[1]["size"], 300_000);
    let keys: Vec<&str> = files[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["path", "size", "sha256"]);
    assert_eq!(doc["root_sha256"].as_str().unwrap().len(), 64);
}

#[test]
fn a_card_edit_does_not_change_the_root_but_a_weight_edit_does() {
    let dir = sample_dir();
    let root = |d: &std::path::Path| {
        cardproof_in(d, &["hash", ".", "--json"]).json()["root_sha256"].clone()
    };
    let before = root(dir.path());
    std::fs::write(
        dir.path().join("README.md"),
        b"---\nlicense: apache-2.0\n---\n",
    )
    .unwrap();
    assert_eq!(root(dir.path()), before);
    std::fs::write(dir.path().join("config.json"), b"{ }\n").unwrap();
    assert_ne!(root(dir.path()), before);
}

#[test]
fn one_thread_and_all_threads_agree() {
    let dir = sample_dir();
    let one = cardproof_in(dir.path(), &["hash", ".", "--threads", "1", "--json"]).json();
    let all = cardproof_in(dir.path(), &["hash", ".", "--json"]).json();
    assert_eq!(one, all);
}

#[test]
fn all_includes_the_card_and_plumbing() {
    let dir = sample_dir();
    let doc = cardproof_in(dir.path(), &["hash", ".", "--all", "--json"]).json();
    let names: Vec<&str> = doc["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"README.md") && names.contains(&".git/HEAD"),
        "{names:?}"
    );
}

#[test]
fn symlinks_inside_the_directory_are_followed_and_recorded() {
    let dir = sample_dir();
    std::fs::create_dir(dir.path().join("blobs")).unwrap();
    std::fs::write(dir.path().join("blobs/blob"), b"weights").unwrap();
    std::os::unix::fs::symlink("blobs/blob", dir.path().join("linked.bin")).unwrap();
    let doc = cardproof_in(dir.path(), &["hash", ".", "--json"]).json();
    let linked = doc["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "linked.bin")
        .unwrap()
        .clone();
    assert_eq!(linked["size"], 7);
    assert!(linked["link"].as_str().unwrap().ends_with("blob"));
}

/// `cardproof hash ARGS` in `dir`, killed after 20 s: a special file must be refused, not hang.
fn hash_in_time(dir: &std::path::Path, args: &[&str]) -> Run {
    let output = assert_cmd::Command::cargo_bin("cardproof")
        .unwrap()
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .arg("hash")
        .args(args)
        .timeout(std::time::Duration::from_secs(20))
        .output()
        .unwrap();
    Run {
        code: output
            .status
            .code()
            .unwrap_or_else(|| panic!("`cardproof hash {args:?}` hung and was killed")),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// Regression (#14): a link out of the checkpoint (`..`, an absolute path elsewhere) made `hash`
/// walk and digest files that are not the checkpoint's (`..` walked the parent tree).
#[test]
fn links_resolving_outside_the_directory_are_exit_2() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("blob"), b"not the checkpoint").unwrap();
    for (name, target) in [
        ("elsewhere.bin", outside.path().join("blob")),
        ("up", std::path::PathBuf::from("..")),
    ] {
        let dir = sample_dir();
        std::os::unix::fs::symlink(&target, dir.path().join(name)).unwrap();
        let run = hash_in_time(dir.path(), &["."]);
        assert_eq!(run.code, 2, "{name}: {}", run.stderr);
        assert!(
            run.stderr.contains(name) && run.stderr.contains("outside the checkpoint directory"),
            "{name}: {}",
            run.stderr
        );
    }
    // A dangling link is named too.
    let dir = sample_dir();
    std::os::unix::fs::symlink("missing.bin", dir.path().join("dangling.bin")).unwrap();
    let run = hash_in_time(dir.path(), &["."]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("dangling.bin"), "{}", run.stderr);
}

/// Regression (#14): a FIFO in the checkpoint blocked `hash` in `open` forever, and a link to
/// `/dev/zero` hashed an endless stream.
#[test]
#[allow(clippy::print_stderr)] // the visible skip when mkfifo is missing
fn fifos_and_devices_are_exit_2_without_hanging() {
    let dir = sample_dir();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.bin")).unwrap();
    let run = hash_in_time(dir.path(), &["zero.bin"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("zero.bin") && run.stderr.contains("character device"),
        "{}",
        run.stderr
    );
    let run = hash_in_time(dir.path(), &["."]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("zero.bin"), "{}", run.stderr);

    let dir = sample_dir();
    let fifo = dir.path().join("model-00003-of-00003.safetensors");
    match Command::new("mkfifo").arg(&fifo).status() {
        Ok(s) if s.success() => {}
        _ => {
            eprintln!("SKIPPED the FIFO cases: mkfifo is not available");
            return;
        }
    }
    let run = hash_in_time(dir.path(), &["."]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("model-00003-of-00003.safetensors") && run.stderr.contains("FIFO"),
        "{}",
        run.stderr
    );
    // `inspect` and `lint` of the directory never open it either.
    for verb in ["inspect", "lint"] {
        let output = assert_cmd::Command::cargo_bin("cardproof")
            .unwrap()
            .current_dir(dir.path())
            .args([verb, "model-00003-of-00003.safetensors"])
            .timeout(std::time::Duration::from_secs(20))
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{verb} hung or passed");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("FIFO"), "{verb}: {stderr}");
    }
}

#[test]
fn names_sha256sum_would_escape_are_exit_2() {
    let dir = sample_dir();
    std::fs::write(dir.path().join("bad\nname.bin"), b"x").unwrap();
    let run = cardproof_in(dir.path(), &["hash", ".", "--json"]);
    assert_eq!(run.code, 2);
    assert!(
        run.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad\\nname.bin"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_single_file_hashes_alone() {
    let dir = sample_dir();
    let run = cardproof_in(dir.path(), &["hash", "config.json"]);
    assert_eq!(run.code, 0);
    assert_eq!(
        run.stdout,
        "ca3d163bab055381827226140568f3bef7eaac187cebd76878e0b63e9e442356  config.json\n"
    );
}

#[test]
fn a_manifest_of_another_directory_checks_with_sha256sum_from_where_it_was_made() {
    // `cardproof hash DIR > manifest; sha256sum -c manifest` run where the user stands, not
    // inside DIR.
    let work = tempfile::tempdir().unwrap();
    let dir = sample_dir();
    let model = work.path().join("models/my-model");
    std::fs::create_dir_all(work.path().join("models")).unwrap();
    std::fs::rename(dir.path(), &model).unwrap();
    let run = cardproof_in(work.path(), &["hash", "models/my-model"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("  models/my-model/tokenizer/tokenizer.json\n"),
        "{}",
        run.stdout
    );
    std::fs::write(work.path().join("manifest.sha256"), &run.stdout).unwrap();
    let check = Command::new("sha256sum")
        .args(["-c", "manifest.sha256"])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // The root digest is still the one of the paths relative to the directory (what `--json`,
    // cards and reports carry): the same as hashing from inside it.
    let inside = cardproof_in(&model, &["hash", "."]);
    let root = |r: &Run| r.stderr.split_whitespace().nth(2).unwrap().to_owned();
    assert_eq!(root(&run), root(&inside));
    let json = cardproof_in(work.path(), &["hash", "models/my-model", "--json"]).json();
    assert_eq!(json["root_sha256"], root(&inside));
    assert_eq!(json["files"][0]["path"], "config.json");
    // A single file in another directory: its path as given.
    let one = cardproof_in(work.path(), &["hash", "models/my-model/config.json"]);
    assert!(
        one.stdout.ends_with("  models/my-model/config.json\n"),
        "{}",
        one.stdout
    );
    // A corrupted file is caught from there too.
    std::fs::write(model.join("config.json"), b"{}").unwrap();
    let check = Command::new("sha256sum")
        .args(["-c", "manifest.sha256"])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(!check.status.success());
}
