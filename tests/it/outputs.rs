//! `--out` as one unit, through `measure` (the cheapest run that writes a set): where it may be,
//! what it may already hold, two runs at once, and write errors before any work. The verify
//! report set's own tests (a killed run, mixed sets) are in verify.rs.

use std::path::{Path, PathBuf};

use crate::support::{Cmd, Run, cardproof, model, short_text};

/// `measure` of the int8 example against its reference into `out`, with `extra` arguments.
fn measure_into(dir: &Path, out: &Path, extra: &[&str]) -> Run {
    let text = short_text(dir, 2500);
    Cmd::measure()
        .reference(model("shakespeare-bf16"))
        .candidate(model("shakespeare-w8a16"))
        .eval_text(&text)
        .context_length(128)
        .bootstrap(20)
        .out(out)
        .args(extra)
        .run()
}

/// A measure whose eval text does not exist: it fails at its first read, so an error about
/// `--out` shows that `--out` was checked before any work.
fn measure_nothing_into(out: &Path) -> Run {
    let bf16 = model("shakespeare-bf16");
    Cmd::measure()
        .reference(&bf16)
        .candidate(&bf16)
        .eval_text("/nonexistent/eval.txt")
        .context_length(128)
        .out(out)
        .run()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn out_through_a_link_or_dot_dot_into_a_checkpoint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cand = dir.path().join("cand");
    std::fs::create_dir(&cand).unwrap();
    for f in std::fs::read_dir(model("shakespeare-w8a16")).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), cand.join(f.file_name())).unwrap();
    }
    let bf16 = model("shakespeare-bf16");
    let link = dir.path().join("link");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&cand, &link).unwrap();
    let mut outs: Vec<PathBuf> = vec![
        dir.path().join("x/../cand"),
        dir.path().join("x/y/../../cand/out"),
        // A directory holding the checkpoint: replacing it as a set would delete the checkpoint.
        dir.path().to_owned(),
    ];
    if cfg!(unix) {
        outs.push(link.join("sub"));
        outs.push(dir.path().join("x/../link/sub"));
    }
    for out in outs {
        let r = Cmd::measure()
            .reference(&bf16)
            .candidate(&cand)
            .eval_text("/nonexistent/eval.txt")
            .context_length(128)
            .out(&out)
            .run();
        assert_eq!(r.code, 2, "{}: {}", out.display(), r.stderr);
        assert!(
            r.stderr.contains("is inside the checkpoint")
                || r.stderr.contains("holds the checkpoint"),
            "{}: {}",
            out.display(),
            r.stderr
        );
    }
    assert_eq!(
        entries(&cand),
        entries(Path::new(&model("shakespeare-w8a16"))),
        "nothing was written into the checkpoint"
    );
}

#[test]
fn an_unwritable_out_fails_before_any_work_worded_as_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let r = measure_nothing_into(&file);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("a-file: is a file, not a directory"),
        "{}",
        r.stderr
    );
    let r = measure_nothing_into(&file.join("sub"));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("a-file/sub: cannot write:")
            && r.stderr.contains("a-file is a file, not a directory"),
        "{}",
        r.stderr
    );
    for r in [
        measure_nothing_into(&file),
        measure_nothing_into(&file.join("sub")),
    ] {
        assert!(
            !r.stderr.contains("cannot read") && !r.stderr.contains(".partial"),
            "{}",
            r.stderr
        );
    }
    assert_eq!(entries(dir.path()), ["a-file"], "no lock or temporary left");
}

#[test]
fn a_measure_set_carries_one_run_id_and_replaces_an_earlier_set_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = measure_into(dir.path(), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let marker = json(&out.join(".cardproof-set.json"));
    let id = marker["run_id"].as_str().unwrap().to_owned();
    assert_eq!(json(&out.join("measurement.json"))["run_id"], id.as_str());
    assert_eq!(marker["complete"], true);
    let listed: Vec<&str> = marker["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["measurement.json", "positions.safetensors"]);

    // An earlier set from an older cardproof (no marker, a temporary left behind) is replaced
    // as a whole: nothing of it stays beside the new set.
    std::fs::remove_file(out.join(".cardproof-set.json")).unwrap();
    std::fs::write(out.join("report.partial"), b"{}").unwrap();
    std::fs::write(out.join("report.json"), b"{\"verdict\": \"reproduced\"}").unwrap();
    let r = measure_into(dir.path(), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        entries(&out),
        [
            ".cardproof-set.json",
            "measurement.json",
            "positions.safetensors"
        ]
    );
    let again = json(&out.join("measurement.json"))["run_id"].clone();
    assert_ne!(again, id.as_str(), "a new run, a new id");
    assert_eq!(json(&out.join(".cardproof-set.json"))["run_id"], again);
    assert_eq!(
        entries(dir.path()),
        ["eval.txt", "out"],
        "no temporary directory or lock left beside --out"
    );
}

#[test]
fn an_out_holding_other_files_is_refused_unless_forced() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("notes");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("todo.txt"), b"mine").unwrap();
    let r = measure_into(dir.path(), &out, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("holds `todo.txt`") && r.stderr.contains("--force"),
        "{}",
        r.stderr
    );
    assert_eq!(entries(&out), ["todo.txt"]);
    let r = measure_into(dir.path(), &out, &["--force"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        entries(&out),
        [
            ".cardproof-set.json",
            "measurement.json",
            "positions.safetensors"
        ]
    );
}

#[test]
fn two_runs_into_one_out_cannot_interleave() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // Another run holds the lock on this --out.
    let lock = std::fs::File::create(dir.path().join(".out.cardproof-lock")).unwrap();
    lock.try_lock().unwrap();
    let r = measure_into(dir.path(), &out, &[]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("another cardproof run is writing this --out"),
        "{}",
        r.stderr
    );
    assert!(!out.exists());
    drop(lock);
    let r = measure_into(dir.path(), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
}

#[test]
fn a_killed_run_leaves_only_a_hidden_temporary_that_the_next_run_removes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // What a killed run leaves: its temporary set (with an incomplete marker) and its lock file.
    let stale = dir
        .path()
        .join(".cardproof-tmp.0b6e2c1a-9f3d-4e5b-8a7c-6d1e2f3a4b5c.out");
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("measurement.json"), b"{}").unwrap();
    std::fs::write(dir.path().join(".out.cardproof-lock"), b"").unwrap();
    // Another --out's temporary in the same parent is not this run's to remove.
    let other = dir
        .path()
        .join(".cardproof-tmp.0b6e2c1a-9f3d-4e5b-8a7c-6d1e2f3a4b5c.out-2");
    std::fs::create_dir(&other).unwrap();
    let r = measure_into(dir.path(), &out, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(!stale.exists(), "the stale temporary is removed");
    assert!(other.exists(), "another --out's temporary is left alone");
    assert_eq!(
        entries(dir.path()),
        [
            ".cardproof-tmp.0b6e2c1a-9f3d-4e5b-8a7c-6d1e2f3a4b5c.out-2",
            "eval.txt",
            "out"
        ]
    );
}

#[test]
fn every_output_path_is_checked_before_any_forward_pass() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    // An unloadable model: a write error rather than a load error shows no model ran.
    let model = crate::support::unloadable_copy("shakespeare-bf16", &dir.path().join("model"));
    let text = crate::support::short_text(dir.path(), 10_000);
    let below_a_file = file.join("sub");
    let r = Cmd::measure()
        .reference(&model)
        .candidate(&model)
        .eval_text(&text)
        .context_length(128)
        .out(dir.path().join("out"))
        .flag("--dump-logits", &below_a_file)
        .run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains(&format!("{}: cannot write:", below_a_file.display())),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("model.safetensors"), "{}", r.stderr);
    let artifact = below_a_file.join("ref.cpref");
    let r = Cmd::reference_export()
        .flag("--model", &model)
        .eval_text(&text)
        .context_length(128)
        .out(&artifact)
        .run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains(&format!("{}: cannot write:", artifact.display())),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("model.safetensors"), "{}", r.stderr);
    assert!(!dir.path().join("out").exists(), "nothing written");
}

/// A symbolic link planted as the lock of `--out` (`.out.cardproof-lock`) used to be followed and
/// its target created wherever it pointed: the run refuses it, naming the lock, and creates
/// nothing.
#[cfg(unix)]
#[test]
fn a_link_planted_as_the_out_lock_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let target = elsewhere.join("created-through-the-link");
    let lock = dir.path().join(".out.cardproof-lock");
    std::os::unix::fs::symlink(&target, &lock).unwrap();
    let r = measure_nothing_into(&out);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains(&format!("its lock {} is a symbolic link", lock.display())),
        "{}",
        r.stderr
    );
    assert!(!target.exists(), "the link's target was created");
    assert!(!out.exists());
    assert!(
        std::fs::symlink_metadata(&lock)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link is left as it was"
    );
}

/// A full disk used to be found only after the whole rerun, when the set was written. The set's
/// size is estimated once the pre-flight knows the tokens, and a file system without room for it
/// is refused before any forward pass (exit 2, naming --out, the estimate and the free space).
/// The free space is injected (`CARDPROOF_FREE_SPACE_BYTES`): a full disk cannot be made here.
#[test]
fn a_set_that_cannot_fit_on_the_disk_is_refused_before_the_rerun() {
    let dir = tempfile::tempdir().unwrap();
    // An unloadable candidate: a refusal about space, not a load error, shows no model ran.
    let cand = crate::support::unloadable_copy("shakespeare-w8a16", &dir.path().join("cand"));
    let text = short_text(dir.path(), 2500);
    let out = dir.path().join("out");
    let bf16 = model("shakespeare-bf16");
    let measure = Cmd::measure()
        .reference(&bf16)
        .candidate(&cand)
        .eval_text(&text)
        .context_length(128)
        .out(&out);
    let run = |free: &str| {
        let r = measure
            .clone()
            .env("CARDPROOF_FREE_SPACE_BYTES", free)
            .run();
        (r.code, r.stderr)
    };
    let (code, stderr) = run("1000");
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("{}: cannot write:", out.display()))
            && stderr.contains("its file system has 1000 bytes (0.0 MiB) free")
            && stderr.contains("needs about"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("model.safetensors"),
        "no model ran: {stderr}"
    );
    assert!(!out.exists());
    assert_eq!(entries(dir.path()), ["cand", "eval.txt"], "nothing left");
    // With room, the same run goes on to load the models (and fails on the cut weights).
    let (code, stderr) = run("1000000000000");
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("model.safetensors"), "{stderr}");
}

/// The same estimate guards `verify` (after its pre-flight, before the rerun) and `study` (after
/// the first arm's pre-flight, before any arm runs): with no room, each is refused naming --out,
/// and nothing is written.
#[test]
fn a_verify_or_study_that_cannot_fit_on_the_disk_is_refused_before_the_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    assert_eq!(
        cardproof(&["keygen", "--out", keys.to_str().unwrap()]).code,
        0
    );
    let run = |cmd: Cmd| {
        let r = cmd
            .env("CARDPROOF_PROGRESS", "plain")
            .env("CARDPROOF_FREE_SPACE_BYTES", "1000")
            .run();
        (r.code, r.stderr)
    };
    let out = dir.path().join("report");
    let bf16 = model("shakespeare-bf16");
    let fp8 = model("shakespeare-fp8-block");
    let (code, stderr) = run(Cmd::verify(&fp8)
        .reference(&bf16)
        .eval_text("examples/data/eval.txt")
        .key(keys.join("cardproof.key"))
        .out(&out));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: cannot write: its file system has 1000 bytes",
            out.display()
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains("progress: loading"),
        "no model loaded: {stderr}"
    );
    assert!(!out.exists());

    std::fs::copy(
        crate::support::repo_root().join("examples/data/eval.txt"),
        dir.path().join("eval.txt"),
    )
    .unwrap();
    let study = dir.path().join("s.yaml");
    std::fs::write(
        &study,
        format!(
            "study: cardproof/study-v1\nreference: {bf16}\neval: {{text: eval.txt}}\nprotocol: {{context_lengths: [128]}}\narms:\n  - {{name: kv, kv_cache: q8_0, changes: kv_cache}}\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("study");
    let (code, stderr) = run(Cmd::new("study").path(&study).out(&out));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: cannot write: its file system has 1000 bytes",
            out.display()
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("progress: arm"), "no arm ran: {stderr}");
    assert!(!out.exists());
}

/// A run without `--out` once replaced the previous run's set in `cardproof-out/<name>/`
/// silently: the default now goes to the first free `<name>-2`, `-3`, ..., and off a terminal
/// each stage is a line on stderr (with `CARDPROOF_PROGRESS=plain`, the counts too).
#[test]
fn the_default_output_never_replaces_an_earlier_run_and_stages_show_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 2500);
    let measure = |plain: bool| {
        let cmd = Cmd::measure()
            .reference(model("shakespeare-bf16"))
            .candidate(model("shakespeare-w8a16"))
            .eval_text(&text)
            .context_length(128)
            .bootstrap(50)
            .in_dir(dir.path());
        match plain {
            true => cmd.env("CARDPROOF_PROGRESS", "plain").run(),
            false => cmd.run(),
        }
    };
    let first = measure(false);
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(
        first.stderr.contains("progress: tokenizing"),
        "{}",
        first.stderr
    );
    let counts = |stderr: &str| {
        stderr
            .lines()
            .filter(|l| l.starts_with("progress: ") && l.ends_with(" windows"))
            .count()
    };
    assert_eq!(counts(&first.stderr), 0, "{}", first.stderr);
    let second = measure(true);
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert!(counts(&second.stderr) > 0, "{}", second.stderr);
    let out = dir.path().join("cardproof-out");
    for name in ["shakespeare-w8a16", "shakespeare-w8a16-2"] {
        assert!(out.join(name).join("measurement.json").exists(), "{name}");
    }
    let id = |name: &str| -> serde_json::Value {
        let bytes = std::fs::read(out.join(name).join("measurement.json")).unwrap();
        serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()["run_id"].clone()
    };
    assert_ne!(id("shakespeare-w8a16"), id("shakespeare-w8a16-2"));
}
