//! `--runner llamacpp`: refusals that need no llama.cpp (every `cargo test`), a stand-in binary
//! that fails, and (ignored unless asked for: `.ci/run` builds llama.cpp's `llama-perplexity`
//! with runners/llamacpp/build.sh and sets CARDPROOF_LLAMACPP_BIN) the real llama.cpp against
//! the example GGUF pair.

use std::path::{Path, PathBuf};

use crate::support::{Cmd, Run, repo_root};

const BF16_GGUF: &str = "examples/models/shakespeare-bf16-gguf";
const Q4_0_GGUF: &str = "examples/models/shakespeare-q4_0-gguf";
/// The example card measured by llama.cpp (`measure --runner llamacpp`, then `card`).
const LLAMACPP_CARD: &str = "examples/models/shakespeare-q4_0-gguf-llamacpp";

fn run(args: &[&str]) -> Run {
    crate::support::cardproof(args)
}

/// `measure --runner llamacpp` with `bin`, llama.cpp's protocol on the example pair, into `out`.
fn measure_cmd(bin: impl AsRef<Path>, out: impl AsRef<Path>) -> Cmd {
    Cmd::measure()
        .args(["--runner", "llamacpp"])
        .flag("--llamacpp-bin", bin)
        .reference(BF16_GGUF)
        .candidate(Q4_0_GGUF)
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .args(["--positions", "second-half", "--vocab", "threshold"])
        .args(["--threads", "2"])
        .out(out)
        .arg("--force")
}

/// An executable shell script in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    path
}

/// A `llama-perplexity` in `dir` that runs `bin` but prints its KLD pass's running mean KLD
/// column times `factor`: a doctored printout over true rows.
pub(crate) fn raised_printout(dir: &Path, bin: &str, factor: f64) -> PathBuf {
    script(
        dir,
        "llama-perplexity",
        &format!(
            r#"case "$*" in
  *--kl-divergence\ *|*--kl-divergence) "{bin}" "$@" 2>&1 | awk '{{ if ($1 ~ /^[0-9]+$/ && NF >= 15) {{ $8 = sprintf("%.5f", $8 * {factor}) }} print }}' ;;
  *) exec "{bin}" "$@" ;;
esac"#
        ),
    )
}

/// llama.cpp's protocol is `--runner llamacpp`'s default, as in a study (it had refused unless
/// given llama.cpp's flags), said on stderr; a protocol llama.cpp does not compute, asked for, is
/// refused naming the flags.
#[test]
fn the_llamacpp_runner_defaults_to_llama_cpps_protocol_and_refuses_another() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = measure_cmd("/nonexistent/llama-perplexity", &out)
        .without(&["--positions", "second-half", "--vocab", "threshold"])
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(
        r.stderr
            .contains("llama.cpp's protocol (--positions second-half --vocab threshold)"),
        "{}",
        r.transcript()
    );
    assert!(
        r.message().contains("/nonexistent/llama-perplexity"),
        "{}",
        r.message()
    );
    // Every position and the full vocabulary, asked for: refused before any work.
    let r = measure_cmd("/nonexistent/llama-perplexity", &out)
        .without(&["--positions", "second-half", "--vocab", "threshold"])
        .args(["--positions", "all", "--vocab", "full"])
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    let m = r.message();
    assert!(m.contains("--positions second-half"), "{m}");
    assert!(m.contains("--vocab threshold"), "{m}");
    assert!(!out.exists(), "a refused run writes nothing");
}

#[test]
fn the_llamacpp_runner_refuses_a_safetensors_reference_saying_how_to_convert() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = measure_cmd("/nonexistent/llama-perplexity", &out)
        .replace(BF16_GGUF, "examples/models/shakespeare-bf16")
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(
        r.message().contains("convert_hf_to_gguf.py"),
        "{}",
        r.message()
    );
}

#[test]
fn the_llamacpp_runner_refuses_a_conversation_eval_text() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = measure_cmd("/nonexistent/llama-perplexity", &out)
        .replace(
            "examples/data/eval.txt",
            "examples/data/tool-conversation.json",
        )
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(r.message().contains("plain text"), "{}", r.message());
}

#[test]
fn a_bos_policy_the_gguf_contradicts_is_refused_before_llama_cpp_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = measure_cmd("/nonexistent/llama-perplexity", &out)
        .args(["--bos", "per-window"])
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    let m = r.message();
    assert!(m.contains("puts no BOS") && m.contains("--bos none"), "{m}");
    assert!(m.contains("shakespeare-bf16-gguf/model.gguf"), "{m}");
    assert!(!out.exists());
}

#[test]
fn a_missing_llama_perplexity_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = measure_cmd("/nonexistent/llama-perplexity", &out).run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(r.message().contains("--llamacpp-bin"), "{}", r.message());
    assert!(!out.exists());
}

#[test]
fn a_llama_perplexity_that_fails_is_an_error_with_its_own_words_and_no_output() {
    let dir = tempfile::tempdir().unwrap();
    // Answers --version, then fails as llama.cpp does on a model it cannot load.
    let bin = script(
        dir.path(),
        "llama-perplexity",
        r#"if [ "$1" = "--version" ]; then echo 'version: 6590 (abcdef12)' >&2; exit 0; fi
echo 'llama_model_load: error loading model: tensor data is not within the file bounds' >&2
exit 1"#,
    );
    let out = dir.path().join("out");
    let r = measure_cmd(&bin, &out).run();
    assert_ne!(r.code, 0, "{}", r.transcript());
    let m = r.message();
    assert!(m.contains("exited"), "{m}");
    assert!(
        m.contains("tensor data is not within the file bounds"),
        "{m}"
    );
    assert!(
        !out.join("measurement.json").exists(),
        "no result after a failed run"
    );
}

/// A stand-in `llama-perplexity` that misbehaves: every invocation records its process group
/// (its pid: cardproof starts each in a group of its own) in `pgids` and leaves a process behind
/// in that group holding its output pipe; `--version` runs `version`, a run `run` (with `$base`
/// the `--kl-divergence-base` path and `$kld` set in the KLD pass).
fn hostile(dir: &Path, version: &str, run: &str) -> PathBuf {
    let pgids = dir.join("pgids");
    script(
        dir,
        "llama-perplexity",
        &format!(
            r#"if [ "$1" = linger ]; then while :; do sleep 1; done; fi
echo $$ >> '{}'
"$0" linger &
prev=; base=; kld=
for a in "$@"; do
  [ "$prev" = --kl-divergence-base ] && base=$a
  [ "$a" = --kl-divergence ] && kld=1
  prev=$a
done
if [ "$1" = --version ]; then
{version}
exit 0
fi
{run}"#,
            pgids.display()
        ),
    )
}

const VERSION_OK: &str = "echo 'version: 6590 (abcdef12)' >&2";

/// `measure --runner llamacpp` with the stand-in, `env` set and TMPDIR a fresh directory: the run
/// must fail (exit 2) within `seconds`, and leave no process of the stand-in's groups, no
/// temporary file and no measurement behind. Returns the error message.
fn refused_and_clean(dir: &Path, bin: &Path, env: &[(&str, &str)], seconds: u64) -> String {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = dir.join("out");
    let started = std::time::Instant::now();
    let r = measure_cmd(bin, &out).env("TMPDIR", &tmp).envs(env).run();
    let took = started.elapsed();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(
        took < std::time::Duration::from_secs(seconds),
        "took {took:?}: {}",
        r.transcript()
    );
    let pgids: Vec<u32> = std::fs::read_to_string(dir.join("pgids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(
        !pgids.is_empty(),
        "the stand-in never ran: {}",
        r.transcript()
    );
    let left = crate::support::alive_in_groups(&pgids);
    assert!(left.is_empty(), "processes left running: {left:?}");
    let files = crate::support::entries(&tmp);
    assert!(files.is_empty(), "temporary files left: {files:?}");
    assert!(!out.join("measurement.json").exists());
    r.message()
}

#[test]
#[cfg(target_os = "linux")]
fn a_version_that_never_answers_is_stopped_at_its_deadline_with_everything_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let bin = hostile(dir.path(), "sleep 1000", "exit 1");
    let m = refused_and_clean(
        dir.path(),
        &bin,
        &[("CARDPROOF_LLAMACPP_VERSION_TIMEOUT_SECS", "1")],
        60,
    );
    assert!(
        m.contains("`--version` did not answer within 1 s")
            && m.contains("CARDPROOF_LLAMACPP_VERSION_TIMEOUT_SECS"),
        "{m}"
    );
}

#[test]
#[cfg(target_os = "linux")]
fn a_version_that_prints_forever_is_capped_and_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let bin = hostile(dir.path(), "yes 'version: 6590 (abcdef12)'", "exit 1");
    let m = refused_and_clean(dir.path(), &bin, &[], 60);
    assert!(
        m.contains("its `--version` wrote more than 64 KiB of output"),
        "{m}"
    );
}

#[test]
#[cfg(target_os = "linux")]
fn a_run_whose_streams_stall_is_stopped_by_the_stall_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // The base passes write the magic and stop; the KLD pass opens its stream and reads nothing.
    let bin = hostile(
        dir.path(),
        VERSION_OK,
        r#"if [ -n "$kld" ]; then exec 3<"$base"; else exec 3>"$base"; printf _logits_ >&3; fi
sleep 1000"#,
    );
    let m = refused_and_clean(
        dir.path(),
        &bin,
        &[("CARDPROOF_LLAMACPP_STALL_SECS", "1")],
        60,
    );
    assert!(
        m.contains("no byte moved on llama.cpp's base streams for 1 s: stopped as stalled")
            && m.contains("CARDPROOF_LLAMACPP_STALL_SECS")
            && m.matches("no byte moved").count() == 1,
        "{m}"
    );
}

#[test]
#[cfg(target_os = "linux")]
fn a_run_that_never_opens_its_stream_is_stopped_by_the_stall_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let bin = hostile(dir.path(), VERSION_OK, "sleep 1000");
    let m = refused_and_clean(
        dir.path(),
        &bin,
        &[("CARDPROOF_LLAMACPP_STALL_SECS", "1")],
        60,
    );
    assert!(m.contains("stopped as stalled"), "{m}");
}

#[test]
#[cfg(target_os = "linux")]
fn a_run_that_floods_its_log_is_stopped_at_the_cap_leaving_no_log() {
    let dir = tempfile::tempdir().unwrap();
    let bin = hostile(
        dir.path(),
        VERSION_OK,
        "yes 'llama_log: the same line again' >&2",
    );
    let m = refused_and_clean(dir.path(), &bin, &[], 120);
    assert!(
        m.contains("process wrote more than 64 MiB of output: stopped"),
        "{m}"
    );
    // The tail quoted is a few lines, not the flood.
    assert!(m.len() < 4096, "{} bytes of message", m.len());
}

#[test]
#[cfg(target_os = "linux")]
fn a_llama_perplexity_that_exits_0_without_opening_its_stream_is_an_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let bin = hostile(dir.path(), VERSION_OK, "exit 0");
    let m = refused_and_clean(dir.path(), &bin, &[], 60);
    assert!(
        m.contains("the reference process exited (exit status: 0) before opening its stream"),
        "{m}"
    );
}

/// The processes run in groups of their own, out of the terminal's reach: Ctrl-C (SIGINT) to
/// cardproof kills them, and cardproof still dies of the signal. cardproof handles SIGINT only
/// where it is not ignored (a shell's background job starts with it ignored, and an ignored
/// signal stays ignored), so the test starts cardproof with the default action whatever the
/// test runner was started with.
#[test]
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn an_interrupt_to_cardproof_kills_the_llama_cpp_processes_too() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = hostile(dir.path(), VERSION_OK, "sleep 1000");
    let out = dir.path().join("out");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cardproof"));
    command
        .current_dir(repo_root())
        .env("TMPDIR", dir.path())
        .args(measure_cmd(&bin, &out).argv())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: signal(2) is async-signal-safe, and nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    // `--version`, then the three processes of the run.
    let pgids = || -> Vec<u32> {
        std::fs::read_to_string(dir.path().join("pgids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while pgids().len() < 4 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(pgids().len(), 4, "the run did not start");
    assert!(!crate::support::alive_in_groups(&pgids()[1..]).is_empty());
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(2), "{status}");
    let left = crate::support::alive_in_groups(&pgids());
    assert!(left.is_empty(), "left running: {left:?}");
}

#[test]
fn a_timeout_that_is_not_seconds_is_refused_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let bin = hostile(dir.path(), VERSION_OK, "exit 1");
    let out = dir.path().join("out");
    let r = measure_cmd(&bin, &out)
        .env("TMPDIR", dir.path())
        .env("CARDPROOF_LLAMACPP_STALL_SECS", "forever")
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    let m = r.message();
    assert!(
        r.stderr.contains("CARDPROOF_LLAMACPP_STALL_SECS")
            && m.contains("`forever` is not a timeout"),
        "{}",
        r.transcript()
    );
}

#[test]
fn a_sweep_of_llama_cpp_settings_needs_the_llamacpp_runner() {
    let r = Cmd::measure()
        .candidate(Q4_0_GGUF)
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .flag("--sweep", "llamacpp.kv=f16,q8_0")
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(r.message().contains("--runner llamacpp"), "{}", r.message());
    let r = Cmd::measure()
        .args(["--runner", "llamacpp"])
        .candidate(Q4_0_GGUF)
        .eval_text("examples/data/eval.txt")
        .context_length(256)
        .flag("--sweep", "llamacpp.kv=f16,q3_k")
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(r.message().contains("q3_k"), "{}", r.message());
}

/// A study file in `dir` with `runner: llamacpp` over the example GGUF pair, `protocol` and
/// `arms` as YAML flow text; the eval text copied beside it (a study file's data is inside its
/// directory), the binary left to `--llamacpp-bin`.
fn llamacpp_study(dir: &Path, protocol: &str, arms: &[&str]) -> PathBuf {
    let root = repo_root();
    std::fs::copy(root.join("examples/data/eval.txt"), dir.join("eval.txt")).unwrap();
    let mut yaml = format!(
        "study: cardproof/study-v1\nname: lcp\nreference: {}\neval: {{text: eval.txt}}\nprotocol: {protocol}\nrunner: llamacpp\nllamacpp: {{threads: 2}}\narms:\n",
        root.join(BF16_GGUF).display(),
    );
    for a in arms {
        yaml.push_str(&format!(
            "  - {}\n",
            a.replace("ROOT", &root.display().to_string())
        ));
    }
    let path = dir.join("study.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

#[test]
fn a_llamacpp_study_refuses_what_llama_perplexity_has_no_flag_for_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for (arm, protocol, field, says) in [
        (
            "{name: f64, compute_dtype: f64, changes: kernel}",
            "{context_lengths: [256]}",
            "arms[0].compute_dtype",
            "no `compute_dtype` setting",
        ),
        (
            "{name: eager, attention: eager, changes: kernel}",
            "{context_lengths: [256]}",
            "arms[0].attention",
            "on, off or auto",
        ),
        (
            "{name: kv, kv_cache: q8_0, changes: kv_cache}",
            "{context_lengths: [256], positions: {policy: all}}",
            "protocol",
            "--positions second-half",
        ),
        (
            "{name: kv, kv_cache: q8_0, changes: kv_cache}",
            "{context_lengths: [128, 256]}",
            "protocol",
            "one --context-length",
        ),
        (
            "{name: st, candidate: ROOT/examples/models/shakespeare-w8a16, changes: weights}",
            "{context_lengths: [256]}",
            "shakespeare-w8a16",
            "GGUF",
        ),
    ] {
        let study = llamacpp_study(dir.path(), protocol, &[arm]);
        let r = run(&[
            "study",
            study.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(r.code, 2, "{arm}: {}", r.transcript());
        let m = r.message();
        assert!(m.contains(field) && m.contains(says), "{arm}: {m}");
        assert!(!out.exists(), "a refused study writes nothing");
    }
}

#[test]
fn a_llamacpp_bin_for_a_study_in_another_runner_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let study = repo_root().join("examples/studies/shakespeare.yaml");
    let r = run(&[
        "study",
        study.to_str().unwrap(),
        "--llamacpp-bin",
        "/usr/bin/true",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "{}", r.transcript());
    let m = r.message();
    assert!(
        m.contains("--llamacpp-bin") && m.contains("runner native"),
        "{m}"
    );
    assert!(!out.exists());
}

/// A llama.cpp study's turns come from a conversation file the study file names
/// (`protocol.turns.conversation`): its eval text is the plain text llama-perplexity scores.
/// Without one, or with one the study file may not make cardproof read (outside its directory,
/// absolute, not a conversation), the plan refuses it naming the file, the field, its line and
/// what is wrong, before any llama.cpp process runs or anything is written. The user's own
/// `--turns-conversation` names a file anywhere: the study goes past the plan (to the missing
/// llama-server, which `--llamacpp-server` names).
#[test]
fn a_llamacpp_study_s_turns_need_a_conversation_inside_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let studies = dir.path().join("studies");
    std::fs::create_dir(&studies).unwrap();
    let (conversation, _) = compact_conversation(dir.path(), 11);
    let ran = dir.path().join("ran");
    let bin = script(
        dir.path(),
        "llama-perplexity",
        &format!("echo \"$@\" >> '{}'\nexit 1", ran.display()),
    );
    let out = dir.path().join("out");
    let arm = "{name: kv, kv_cache: q8_0+hadamard, changes: kv_cache}";
    let turns = |more: &str| format!("{{context_lengths: [256], turns: {{select: all{more}}}}}");
    let study_with = |protocol: &str| llamacpp_study(&studies, protocol, &[arm]);
    let run_study = |study: &Path, extra: &[&str]| {
        let mut args = vec![
            "study",
            study.to_str().unwrap(),
            "--llamacpp-bin",
            bin.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let absolute = format!(", conversation: {}", conversation.display());
    for (more, says) in [
        (
            "",
            "is missing: a llama.cpp study's turns come from a conversation file",
        ),
        (
            ", conversation: ../conversation.json",
            "`../conversation.json` is not a path inside the study file's directory",
        ),
        (
            absolute.as_str(),
            "is not a path inside the study file's directory",
        ),
        (
            ", conversation: eval.txt",
            "`eval.txt` is not a conversation file (.json or .jsonl)",
        ),
    ] {
        let study = study_with(&turns(more));
        let r = run_study(&study, &[]);
        assert_eq!(r.code, 2, "{more}: {}", r.transcript());
        let m = r.message();
        assert!(
            m.contains(&format!("{}:5:", study.display()))
                && m.contains("protocol.turns.conversation")
                && m.contains(says)
                && (more.contains("eval.txt") || m.contains("--turns-conversation FILE")),
            "{more}: {m}"
        );
        assert!(!out.exists(), "a refused study writes nothing");
    }
    // The user's flag names the conversation anywhere; the plan takes it, and the turns then
    // need llama.cpp's server.
    let study = study_with(&turns(", conversation: ../conversation.json"));
    let given = ["--turns-conversation", conversation.to_str().unwrap()];
    let r = run_study(&study, &given);
    assert_eq!(r.code, 2, "{}", r.transcript());
    let m = r.message();
    assert!(
        m.contains("llama-server") && m.contains("--llamacpp-server PATH"),
        "{m}"
    );
    let missing = dir.path().join("no-server");
    let r = run_study(
        &study,
        &[
            given[0],
            given[1],
            "--llamacpp-server",
            missing.to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(
        r.message().contains("no such file: --llamacpp-server"),
        "{}",
        r.message()
    );
    // A conversation for a study that generates no turns would change nothing.
    let study = study_with("{context_lengths: [256]}");
    let r = run_study(&study, &given);
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(
        r.message().contains("--turns-conversation") && r.message().contains("no `protocol.turns`"),
        "{}",
        r.message()
    );
    assert!(
        !ran.exists(),
        "llama.cpp ran: {}",
        std::fs::read_to_string(&ran).unwrap_or_default()
    );
    assert!(!out.exists());
}

/// The real llama.cpp: built by runners/llamacpp/build.sh, named by CARDPROOF_LLAMACPP_BIN.
/// `.ci/run` runs these with `--ignored`, where a missing binary fails them.
/// The example conversation's first `messages` messages made compact (shorter texts, the
/// called tools without descriptions), so that every prompt with a 12-token turn fits the
/// example models' 1024 trained positions: llama-server caps a slot's window there. Returns
/// the conversation and the example template, copied into `dir`.
pub(crate) fn compact_conversation(dir: &Path, messages: usize) -> (PathBuf, PathBuf) {
    let data = repo_root().join("examples/data");
    let mut doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data.join("tool-conversation.json")).unwrap(),
    )
    .unwrap();
    let cut = |v: &mut serde_json::Value, chars: usize| {
        if let Some(t) = v.as_str() {
            *v = t.chars().take(chars).collect::<String>().into();
        }
    };
    let list = doc["messages"].as_array_mut().unwrap();
    list.truncate(messages);
    for m in list.iter_mut() {
        let chars = match m["role"].as_str() {
            Some("user") => 80,
            _ => 40,
        };
        cut(&mut m["content"], chars);
        m.as_object_mut().unwrap().remove("reasoning_content");
    }
    list[0]["content"] = "You are the stage manager's assistant.".into();
    doc["tools"].as_array_mut().unwrap().retain(|t| {
        ["search_lines", "get_passage", "count_speeches"]
            .contains(&t["function"]["name"].as_str().unwrap())
    });
    for t in doc["tools"].as_array_mut().unwrap() {
        let f = t["function"].as_object_mut().unwrap();
        f.remove("description");
        for p in f["parameters"]["properties"]
            .as_object_mut()
            .unwrap()
            .values_mut()
        {
            p.as_object_mut().unwrap().remove("description");
        }
    }
    let conversation = dir.join("conversation.json");
    std::fs::write(&conversation, serde_json::to_vec(&doc).unwrap()).unwrap();
    let template = dir.join("chat_template.jinja");
    std::fs::copy(data.join("chat_template.jinja"), &template).unwrap();
    (conversation, template)
}

/// `measure_cmd` with `--turns all` of at most 12 tokens from `conversation` (the eval text stays
/// the plain text llama-perplexity scores).
fn measure_turns_cmd(
    bin: impl AsRef<Path>,
    out: impl AsRef<Path>,
    conversation: &Path,
    template: &Path,
) -> Cmd {
    measure_cmd(bin, out)
        .args(["--turns", "all", "--max-new-tokens", "12"])
        .flag("--turns-conversation", conversation)
        .flag("--chat-template", template)
}

/// Turns in the llama.cpp runner need a conversation file, llama.cpp's own server and prompts
/// that fit the model's trained positions; each is refused before any llama.cpp process runs,
/// naming what is missing.
#[test]
fn llama_cpp_turns_are_refused_before_any_work_without_what_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let bin = script(
        dir.path(),
        "llama-perplexity",
        &format!("echo \"$@\" >> '{}'\nexit 1", ran.display()),
    );
    let (conversation, template) = compact_conversation(dir.path(), 11);
    let out = dir.path().join("out");
    let r = measure_cmd(&bin, &out)
        .args(["--turns", "all"])
        .flag("--chat-template", &template)
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(
        r.message().contains("--turns-conversation"),
        "{}",
        r.message()
    );

    let r = measure_turns_cmd(&bin, &out, &conversation, &template).run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(r.message().contains("--llamacpp-server"), "{}", r.message());

    // The whole example conversation: its first prompt alone is over 1024 tokens.
    let server = script(
        dir.path(),
        "llama-server",
        &format!("echo server \"$@\" >> '{}'\nexit 1", ran.display()),
    );
    let r = measure_turns_cmd(
        &bin,
        &out,
        &repo_root().join("examples/data/tool-conversation.json"),
        &template,
    )
    .flag("--llamacpp-server", &server)
    .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    let m = r.message();
    assert!(
        m.contains("trained positions") && m.contains("context_length = 1024"),
        "{m}"
    );
    // A tokenizer whose ids are not the GGUF's: two tokens' ids swapped.
    let mut tokenizer: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo_root().join(BF16_GGUF).join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = (vocab["a"].clone(), vocab["b"].clone());
    vocab.insert("a".into(), b);
    vocab.insert("b".into(), a);
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    for f in ["generation_config.json", "tokenizer_config.json"] {
        std::fs::copy(repo_root().join(BF16_GGUF).join(f), other.join(f)).unwrap();
    }
    let swapped = other.join("tokenizer.json");
    std::fs::write(&swapped, serde_json::to_vec(&tokenizer).unwrap()).unwrap();
    let r = measure_turns_cmd(&bin, &out, &conversation, &template)
        .flag("--llamacpp-server", &server)
        .flag("--tokenizer", &swapped)
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    let m = r.message();
    assert!(
        m.contains("vocabulary, which differs") && m.contains("id 65"),
        "{m}"
    );
    assert!(
        !ran.exists(),
        "llama.cpp ran: {}",
        std::fs::read_to_string(&ran).unwrap_or_default()
    );
    assert!(!out.join("measurement.json").exists());
}

/// A llama-server that never loads its model is stopped at the start deadline, with every
/// process it started, and the run fails naming the deadline's variable.
#[test]
#[cfg(target_os = "linux")]
fn a_llama_server_that_never_loads_is_stopped_at_its_deadline_with_everything_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let bin = script(dir.path(), "llama-perplexity", "exit 1");
    let pgids = dir.path().join("pgids");
    script(
        dir.path(),
        "llama-server",
        &format!(
            r#"if [ "$1" = linger ]; then while :; do sleep 1; done; fi
if [ "$1" = --version ]; then echo 'version: 6590 (abcdef12)' >&2; exit 0; fi
echo $$ >> '{}'
"$0" linger &
while :; do sleep 1; done"#,
            pgids.display()
        ),
    );
    let (conversation, template) = compact_conversation(dir.path(), 11);
    let out = dir.path().join("out");
    let started = std::time::Instant::now();
    let r = measure_turns_cmd(&bin, &out, &conversation, &template)
        .env("CARDPROOF_LLAMACPP_SERVER_START_SECS", "1")
        .run();
    assert_eq!(r.code, 2, "{}", r.transcript());
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let m = r.message();
    assert!(
        m.contains("not loaded within 1 s") && m.contains("CARDPROOF_LLAMACPP_SERVER_START_SECS"),
        "{m}"
    );
    let groups: Vec<u32> = std::fs::read_to_string(&pgids)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert_eq!(groups.len(), 1, "one server started: {}", r.transcript());
    let left = crate::support::alive_in_groups(&groups);
    assert!(left.is_empty(), "processes left running: {left:?}");
    assert!(!out.join("measurement.json").exists());
}

mod real {
    use super::*;

    fn bin() -> String {
        std::env::var("CARDPROOF_LLAMACPP_BIN").expect(
            "CARDPROOF_LLAMACPP_BIN names llama-perplexity (runners/llamacpp/build.sh builds it)",
        )
    }

    fn measurement(dir: &Path) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.join("measurement.json")).unwrap()).unwrap()
    }

    /// `verify --runner llamacpp` of `card` against the BF16 GGUF reference, `--json`.
    fn verify_llamacpp(bin: &str, card: &str, out: &Path) -> Run {
        Cmd::verify(card)
            .args(["--runner", "llamacpp"])
            .flag("--llamacpp-bin", bin)
            .reference(BF16_GGUF)
            .eval_text("examples/data/eval.txt")
            .args(["--threads", "2"])
            .out(out)
            .arg("--json")
            .run()
    }

    /// A card llama.cpp measured reproduces in the same lane: measured here (`measure --runner
    /// llamacpp`, then `card`), verified here. The committed example card was measured on one
    /// CPU; a native llama.cpp build runs other kernels on another (AVX2, AVX-512, AMX), so on a
    /// machine whose device (or inherited llama.cpp settings) differ from the card's it is not
    /// comparable, naming the difference, and never reproduced or not reproduced.
    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity (CARDPROOF_LLAMACPP_BIN; .ci/run builds it)"]
    fn verify_reproduces_the_card_llama_cpp_measured() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let card = dir.path().join("card");
        crate::support::copy_dir(&repo_root().join(LLAMACPP_CARD), &card);
        let m = dir.path().join("m");
        let card_arg = card.to_str().unwrap().to_owned();
        let r = measure_cmd(&bin, &m).replace(Q4_0_GGUF, &card).run();
        assert_eq!(r.code, 0, "{}", r.transcript());
        let r = run(&[
            "card",
            "--measurement",
            m.join("measurement.json").to_str().unwrap(),
            "--into",
            card.join("README.md").to_str().unwrap(),
        ]);
        assert_eq!(r.code, 0, "{}", r.transcript());
        let r = verify_llamacpp(&bin, &card_arg, &dir.path().join("report"));
        assert_eq!(r.code, 0, "{}", r.transcript());
        let report = r.json();
        assert_eq!(report["verdict"], "reproduced", "{}", r.stdout);
        let gates = report["sanity"].as_array().unwrap();
        for name in ["self_compare", "one_row_shift", "llamacpp_printout"] {
            assert!(
                gates
                    .iter()
                    .any(|g| g["gate"] == name && g["passed"] == true),
                "{name}: {gates:?}"
            );
        }
        // The committed card: its own lane reproduces it; another device is another lane.
        let r = verify_llamacpp(&bin, LLAMACPP_CARD, &dir.path().join("committed"));
        let report = r.json();
        let runtime = &report["measurement"]["fidelity"]["runtime"];
        let committed =
            std::fs::read_to_string(repo_root().join(LLAMACPP_CARD).join("README.md")).unwrap();
        let same_lane = committed.contains(&format!("device: {}", runtime["device"]))
            && !runtime["flags"]
                .as_object()
                .unwrap()
                .keys()
                .any(|k| k.starts_with("env."));
        if same_lane {
            assert_eq!(report["verdict"], "reproduced", "{}", r.stdout);
        } else {
            assert_eq!(r.code, 1, "{}", r.transcript());
            assert_eq!(report["verdict"], "not_comparable", "{}", r.stdout);
            let differences = report["lane_differences"].to_string();
            assert!(
                differences.contains("runtime.device")
                    || differences.contains("runtime.flags.env."),
                "{differences}"
            );
        }
    }

    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity (CARDPROOF_LLAMACPP_BIN; .ci/run builds it)"]
    fn llama_cpps_printout_agrees_with_cardproofs_reduction_and_the_lane_is_recorded() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m");
        let r = measure_cmd(&bin, &out).run();
        assert_eq!(r.code, 0, "{}", r.transcript());
        let m = measurement(&out);
        let env = &m["environment"];
        assert_eq!(env["runner"], "llamacpp");
        let gate = &env["llamacpp"]["gate"];
        let printed = gate["printed_kld_mean"].as_f64().unwrap();
        let ours = gate["cardproof_kld_mean"].as_f64().unwrap();
        // cardproof's reduction may lie below the printout by the clamp's allowance too.
        let (allowed, clamp) = (
            gate["allowed"].as_f64().unwrap(),
            gate["clamp_allowance"].as_f64().unwrap(),
        );
        assert!(
            ours - printed <= allowed && printed - ours <= allowed + clamp,
            "{gate}"
        );
        // The measurement's own mean is the same rows' llama.cpp arithmetic.
        let kld = m["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap();
        assert!((kld - ours).abs() < 1e-9 * ours.max(1.0), "{kld} vs {ours}");
        assert_eq!(m["protocol"]["llamacpp_compat"], true);
        let flags = &m["fidelity"]["runtime"]["flags"];
        assert_eq!(flags["backend"], "cpu");
        assert_eq!(flags["cache_type_k"], "f16");
        assert_eq!(m["fidelity"]["runtime"]["engine"], "llama_cpp");
        // 43 windows of 256 tokens, rows 128..=254 of each.
        assert_eq!(m["runs"][0]["n_positions"], 43 * 127);
        // Regression: the eval text's size was 0 in this lane (its tokens are llama.cpp's).
        let size = std::fs::metadata("examples/data/eval.txt").unwrap().len();
        assert_eq!(m["eval"]["text_bytes"], size);
    }

    /// llama-perplexity needs two windows' tokens; its one error line is named, not the
    /// teardown lines after it.
    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity (CARDPROOF_LLAMACPP_BIN; .ci/run builds it)"]
    fn a_text_shorter_than_two_windows_names_llama_cpps_reason() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let text = crate::support::short_text(dir.path(), 600);
        let out = dir.path().join("m");
        let r = measure_cmd(&bin, &out)
            .replace("examples/data/eval.txt", &text)
            .run();
        assert_eq!(r.code, 2, "{}", r.transcript());
        assert!(
            r.message().contains("you need at least 512 tokens"),
            "{}",
            r.message()
        );
        assert!(!out.join("measurement.json").exists());
    }

    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity (CARDPROOF_LLAMACPP_BIN; .ci/run builds it)"]
    fn a_printout_that_disagrees_with_the_rows_fails_the_gate() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        // llama.cpp's own KLD pass with its running mean KLD column raised by 1%.
        let liar = raised_printout(dir.path(), &bin, 1.01);
        let out = dir.path().join("m");
        let r = measure_cmd(&liar, &out).run();
        assert_ne!(r.code, 0, "{}", r.transcript());
        let m = r.message();
        assert!(m.contains("printout gate"), "{m}");
        assert!(m.contains("mean KLD"), "{m}");
        assert!(!out.join("measurement.json").exists());
    }

    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity (CARDPROOF_LLAMACPP_BIN; .ci/run builds it)"]
    fn a_rerun_with_another_kv_cache_is_not_comparable_naming_each_flag() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let r = Cmd::verify(LLAMACPP_CARD)
            .args(["--runner", "llamacpp"])
            .flag("--llamacpp-bin", &bin)
            .reference(BF16_GGUF)
            .eval_text("examples/data/eval.txt")
            .flag("--kv-cache", "q8_0+hadamard")
            .args(["--threads", "2"])
            .out(dir.path().join("r"))
            .run();
        assert_eq!(r.code, 1, "{}", r.transcript());
        assert!(r.stdout.contains("not_comparable"), "{}", r.stdout);
        for named in [
            "cache_type_k: card f16, rerun q8_0",
            "attn_rotation: card false, rerun true",
        ] {
            assert!(r.stdout.contains(named), "{named}: {}", r.stdout);
        }
    }

    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity (CARDPROOF_LLAMACPP_BIN; .ci/run builds it)"]
    fn a_kv_sweep_runs_in_llama_cpp_and_grows_with_fewer_bits() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("s");
        let r = Cmd::measure()
            .args(["--runner", "llamacpp"])
            .flag("--llamacpp-bin", &bin)
            .candidate(Q4_0_GGUF)
            .eval_text("examples/data/eval.txt")
            .context_length(256)
            .args(["--positions", "second-half", "--vocab", "threshold"])
            .args(["--threads", "2"])
            .flag("--sweep", "llamacpp.kv=f16,q8_0,q4_0")
            .out(&out)
            .run();
        assert_eq!(r.code, 0, "{}", r.transcript());
        let sweep: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
        let kld = |i: usize| sweep["pairs"][i]["runs"][0]["kld_mean"].as_f64().unwrap();
        assert!(
            kld(0) > 0.0 && kld(1) > 10.0 * kld(0),
            "{} {}",
            kld(0),
            kld(1)
        );
        let env = &sweep["pairs"][1]["environment"]["llamacpp"];
        assert_eq!(env["candidate"]["cache_type_k"], "q4_0");
        assert_eq!(env["reference"]["cache_type_k"], "f16");
    }
    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity (CARDPROOF_LLAMACPP_BIN; .ci/run builds it)"]
    fn a_llamacpp_study_arm_equals_the_single_measure_of_its_pair_and_repeats_to_zero() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let study = llamacpp_study(
            dir.path(),
            "{context_lengths: [256]}",
            &[
                "{name: q4_0, candidate: ROOT/examples/models/shakespeare-q4_0-gguf, changes: weights}",
                "{name: kv-q8_0, kv_cache: q8_0+hadamard, changes: kv_cache}",
            ],
        );
        let out = dir.path().join("study");
        let r = run(&[
            "study",
            study.to_str().unwrap(),
            "--llamacpp-bin",
            &bin,
            "--out",
            out.to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(r.code, 0, "{}", r.transcript());
        let doc = r.json();
        assert_eq!(doc["runner"], "llamacpp");
        assert!(
            doc["timings"].get("reference_seconds").is_none(),
            "{}",
            doc["timings"]
        );
        let arm = |name: &str| {
            doc["arms"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["name"] == name)
                .unwrap_or_else(|| panic!("{name}: {}", doc["arms"]))
                .clone()
        };
        let kld = |a: &serde_json::Value| a["runs"][0]["metrics"]["kld_mean"].as_f64().unwrap();
        // llama.cpp is deterministic on one machine: the baseline against itself is 0.
        assert_eq!(kld(&arm("control-repeat")), 0.0);
        assert!(
            kld(&arm("control-kernel")) > 0.0,
            "flash attention off moves the rows"
        );
        assert!(kld(&arm("kv-q8_0")) > 0.0);
        // The q4_0 arm is what `measure --runner llamacpp` of the pair records, to the bit.
        let single = dir.path().join("single");
        let m = measure_cmd(&bin, &single).run();
        assert_eq!(m.code, 0, "{}", m.transcript());
        let single = measurement(&single);
        let arm_m = measurement(&out.join("arms/q4_0"));
        assert_eq!(
            arm_m["runs"][0]["metrics"], single["runs"][0]["metrics"],
            "the study arm and the single measure"
        );
        let gates = arm_m["environment"]["llamacpp"]["gate"].clone();
        assert!(gates["printed_kld_mean"].is_number(), "{gates}");
    }

    /// `measure --runner llamacpp --turns all` on the example GGUF pair: llama.cpp's own
    /// llama-server generates both models' turns (greedy, from the ids cardproof rendered), its
    /// build, request and each model's server are recorded, and the turns agree with the native
    /// lane's on the same pair for most turns. Exact agreement is not expected across engines:
    /// llama.cpp rounds activations its own way (the BF16 reference's products, the Q4_0
    /// candidate's q8_0 activations), so a greedy turn may take another token where two are
    /// nearly tied, and every token after it then differs.
    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity and llama-server (CARDPROOF_LLAMACPP_BIN; .ci/run builds them)"]
    fn llama_cpp_generates_the_turns_and_agrees_with_the_native_lane_on_most() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let (conversation, template) = compact_conversation(dir.path(), 11);
        let out = dir.path().join("l");
        let r = measure_turns_cmd(&bin, &out, &conversation, &template).run();
        assert_eq!(r.code, 0, "{}", r.transcript());
        let m = measurement(&out);
        let t = &m["turns"];
        assert_eq!(t["conversation"]["path"], conversation.to_str().unwrap());
        let env = &m["environment"]["llamacpp"]["turns"];
        assert_eq!(env["request"]["top_k"], 1, "{env}");
        assert_eq!(env["request"]["samplers"], serde_json::json!(["top_k"]));
        for side in ["reference", "candidate"] {
            assert!(env[side]["requests"].as_u64() >= Some(4), "{env}");
            assert!(
                t["timings"][side]["decode_seconds"].as_f64() > Some(0.0),
                "{t}"
            );
        }
        assert!(env["server"]["version"].is_string(), "{env}");
        // The native lane on the same pair and conversation (the conversation as its eval text).
        let native = dir.path().join("n");
        let r = Cmd::measure()
            .reference(BF16_GGUF)
            .candidate(Q4_0_GGUF)
            .eval_text(&conversation)
            .flag("--chat-template", &template)
            .context_length(128)
            .args(["--turns", "all", "--max-new-tokens", "12", "--threads", "2"])
            .out(&native)
            .run();
        assert_eq!(r.code, 0, "{}", r.transcript());
        let n = measurement(&native);
        let (ours, theirs) = (
            t["turns"].as_array().unwrap(),
            n["turns"]["turns"].as_array().unwrap(),
        );
        assert_eq!(ours.len(), 4);
        assert_eq!(ours.len(), theirs.len());
        let mut equal = 0;
        let mut shown = Vec::new();
        for (a, b) in ours.iter().zip(theirs) {
            assert_eq!(a["prompt_tokens"], b["prompt_tokens"], "the same prompts");
            for side in ["reference", "candidate"] {
                let same = a[side]["ids"] == b[side]["ids"];
                equal += usize::from(same);
                shown.push(format!("{side} {}: {same}", a["message"]));
            }
        }
        // On this machine 7 of the 8 model-turns are equal token for token (the one that differs
        // agrees on its first five tokens).
        assert!(
            equal * 2 > ours.len() * 2,
            "{equal} of {} equal: {shown:?}",
            ours.len() * 2
        );
    }

    /// A llama.cpp study with `protocol.turns`: the tool-calling example's GGUFs in llama.cpp,
    /// the turns from its first held-out conversation (six calls) beside the plain eval text
    /// llama-perplexity scores. The reference's turns come from its own llama-server once, each
    /// arm's from its own: Q2_0 weights break every call and Q4_0 keeps them all (as in the
    /// native study of examples/studies/stagehand.yaml), the repeat control generates the
    /// reference's turns token for token, and study.json names the conversation and its digest.
    /// About 40 s in a debug build on 2 cores.
    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity and llama-server (CARDPROOF_LLAMACPP_BIN; .ci/run builds them)"]
    fn a_llamacpp_study_generates_every_arms_turns_in_llama_server() {
        use sha2::Digest as _;
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let (root, d) = (repo_root(), dir.path());
        let data = root.join("examples/data");
        std::fs::copy(data.join("eval.txt"), d.join("eval.txt")).unwrap();
        std::fs::copy(
            data.join("chat_template.jinja"),
            d.join("chat_template.jinja"),
        )
        .unwrap();
        let all = std::fs::read_to_string(data.join("tool-calls.jsonl")).unwrap();
        let first = format!("{}\n", all.lines().next().unwrap());
        std::fs::write(d.join("calls.jsonl"), &first).unwrap();
        let models = root.join("examples/models");
        let study = d.join("study.yaml");
        std::fs::write(
            &study,
            format!(
                "study: cardproof/study-v1\nname: stagehand-llamacpp\nreference: {m}/stagehand-bf16-gguf\neval: {{text: eval.txt, chat_template: chat_template.jinja}}\nprotocol:\n  context_lengths: [256]\n  resamples: 50\n  turns: {{select: tool_calls, max_new_tokens: 128, conversation: calls.jsonl}}\nrunner: llamacpp\nllamacpp: {{threads: 2}}\narms:\n  - {{name: q2_0, candidate: {m}/stagehand-q2_0-gguf, changes: weights}}\n  - {{name: q4_0, candidate: {m}/stagehand-q4_0-gguf, changes: weights}}\n",
                m = models.display()
            ),
        )
        .unwrap();
        let out = d.join("out");
        let r = run(&[
            "study",
            study.to_str().unwrap(),
            "--llamacpp-bin",
            &bin,
            "--out",
            out.to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(r.code, 0, "{}", r.transcript());
        let doc = r.json();
        let t = &doc["turns"];
        let conversation = d.join("calls.jsonl").canonicalize().unwrap();
        assert_eq!(t["conversation"]["path"], conversation.to_str().unwrap());
        assert_eq!(
            t["conversation"]["sha256"],
            cardproof::digest::hex(&sha2::Sha256::digest(first.as_bytes()))
        );
        assert_eq!(t["protocol"]["max_new_tokens"], 128, "{t}");
        assert_eq!(t["call_format"], "qwen3_coder", "{t}");
        let arm = |name: &str| {
            doc["arms"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["name"] == name)
                .unwrap_or_else(|| panic!("{name}: {}", doc["arms"]))
                .clone()
        };
        for name in ["q2_0", "q4_0", "control-repeat", "control-kernel"] {
            assert_eq!(arm(name)["turns"]["turns"], 6, "{name}: {}", arm(name));
        }
        let (q2, q4, repeat) = (arm("q2_0"), arm("q4_0"), arm("control-repeat"));
        assert_eq!(q2["turns"]["tool_call_match"]["value"], 0.0, "{q2}");
        assert_eq!(q2["turns"]["recovery"]["failures"], 6, "{q2}");
        assert_eq!(q4["turns"]["tool_call_match"]["value"], 1.0, "{q4}");
        assert_eq!(q4["turns"]["tool_call_valid"]["value"], 1.0, "{q4}");
        assert_eq!(repeat["turns"]["turn_match"]["value"], 1.0, "{repeat}");
        assert_eq!(repeat["turns"]["first_divergence"]["turns"], 0, "{repeat}");
        assert!(
            repeat["turn_outcomes"]
                .as_array()
                .is_some_and(|o| o.len() == 6 && o.iter().all(|x| x == "same")),
            "{repeat}"
        );
        let c = &doc["turn_comparisons"][0];
        assert_eq!(
            (c["a"].as_str(), c["b"].as_str()),
            (Some("q2_0"), Some("q4_0"))
        );
        assert_eq!(c["tool_call_match"]["b_only"], 6, "{c}");
        // Each arm's measurement: its turns from the same conversation, its server recorded.
        let m = measurement(&out.join("arms/q2_0"));
        assert_eq!(m["turns"]["conversation"], t["conversation"]);
        let env = &m["environment"]["llamacpp"]["turns"];
        assert!(env["candidate"]["requests"].as_u64() >= Some(6), "{env}");
        let md = std::fs::read_to_string(out.join("study.md")).unwrap();
        assert!(
            md.contains("the conversation file") && md.contains(conversation.to_str().unwrap()),
            "{md}"
        );
    }

    /// The reference against itself in llama.cpp: two servers of the same model and flags give
    /// the same turns (the repeat control holds in this lane too).
    #[test]
    #[ignore = "needs llama.cpp's llama-perplexity and llama-server (CARDPROOF_LLAMACPP_BIN; .ci/run builds them)"]
    fn the_reference_against_itself_in_llama_cpp_generates_the_same_turns() {
        let bin = bin();
        let dir = tempfile::tempdir().unwrap();
        let (conversation, template) = compact_conversation(dir.path(), 11);
        let out = dir.path().join("l");
        let r = measure_turns_cmd(&bin, &out, &conversation, &template)
            .replace(Q4_0_GGUF, BF16_GGUF)
            .run();
        assert_eq!(r.code, 0, "{}", r.transcript());
        let s = &measurement(&out)["turns"]["summary"];
        assert_eq!(s["turn_match"]["value"], 1.0, "{s}");
        assert_eq!(s["first_divergence"]["turns"], 0, "{s}");
    }
}

/// `card --from-llamacpp`: a real `--kl-divergence` log (tests/fixtures/llamacpp) written as a
/// card whose claims are llama.cpp's printed numbers and whose gaps lint names.
mod import {
    use super::*;

    const LOG: &str = "tests/fixtures/llamacpp/q4_0-kld-c256-chunks2.log";
    const BASE: &str = "tests/fixtures/llamacpp/bf16-c256-chunks2.base";

    fn candidate_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            repo_root().join(Q4_0_GGUF).join("model.gguf"),
            dir.path().join("model.gguf"),
        )
        .unwrap();
        dir
    }

    #[test]
    fn a_llama_cpp_log_becomes_a_card_with_its_printed_numbers_and_lint_names_the_gaps() {
        let dir = candidate_dir();
        let card = dir.path().join("README.md");
        let r = run(&[
            "card",
            "--from-llamacpp",
            LOG,
            "--base-file",
            BASE,
            "--into",
            card.to_str().unwrap(),
        ]);
        // Written, with lint errors: a log cannot disclose the reference or the text.
        assert_eq!(r.code, 1, "{}", r.transcript());
        let text = std::fs::read_to_string(&card).unwrap();
        for line in [
            "engine: llama_cpp",
            "method: iid_stderr",
            "policy: second_half",
            "mode: threshold",
            // Mean KLD: 0.094644 ± 0.006676 as printed; 1.96 standard errors as the half-width.
            "{metric: kld_mean, value: 0.09464, uncertainty: 0.013, context_length: 256, n_positions: 254}",
            "count: 512",
            "flash_attn=enabled",
        ] {
            assert!(text.contains(line), "{line}:\n{text}");
        }
        let m = r.stderr.clone();
        for gap in [
            "`runtime.engine_version` is `unknown`",
            "`eval.text.source` is `unknown`",
            "fidelity.reference.revision",
        ] {
            assert!(m.contains(gap), "{gap}: {m}");
        }
    }

    #[test]
    fn a_base_file_of_another_run_is_refused() {
        let dir = candidate_dir();
        let log = dir.path().join("other.log");
        let text = std::fs::read_to_string(repo_root().join(LOG)).unwrap();
        std::fs::write(
            &log,
            text.replace("computing over 2 chunks", "computing over 3 chunks"),
        )
        .unwrap();
        let card = dir.path().join("README.md");
        let r = run(&[
            "card",
            "--from-llamacpp",
            log.to_str().unwrap(),
            "--base-file",
            BASE,
            "--into",
            card.to_str().unwrap(),
        ]);
        assert_eq!(r.code, 2, "{}", r.transcript());
        assert!(
            r.message().contains("not this run's base file"),
            "{}",
            r.message()
        );
        assert!(!card.exists());
    }

    /// `card --from-llamacpp` of the fixture log with `from` replaced by `to`, `--json`.
    fn import_edited(dir: &Path, from: &str, to: &str) -> (Run, PathBuf) {
        let text = std::fs::read_to_string(repo_root().join(LOG)).unwrap();
        assert_eq!(text.matches(from).count(), 1, "{from}");
        let log = dir.join("edited.log");
        std::fs::write(&log, text.replacen(from, to, 1)).unwrap();
        let r = run(&[
            "card",
            "--from-llamacpp",
            log.to_str().unwrap(),
            "--into",
            dir.join("README.md").to_str().unwrap(),
            "--json",
        ]);
        (r, log)
    }

    /// A log is data: the model path it names is never followed (a hostile log could make
    /// cardproof parse any file as a GGUF); the GGUF of that file name beside the card is read.
    #[test]
    fn the_model_path_a_log_names_is_never_followed_outside_the_cards_directory() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = repo_root().join(Q4_0_GGUF).join("model.gguf");
        let (r, _) = import_edited(
            dir.path(),
            "from examples/models/shakespeare-q4_0-gguf/model.gguf",
            &format!("from {}", elsewhere.display()),
        );
        assert!(
            r.stdout.contains("is not beside the card"),
            "{}\n{}",
            r.stdout,
            r.transcript()
        );
        let card = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
        assert!(card.contains("bos: none"), "{card}");
        // The same name beside the card: read (its add_bos_token decides the BOS policy).
        std::fs::copy(&elsewhere, dir.path().join("model.gguf")).unwrap();
        std::fs::remove_file(dir.path().join("README.md")).unwrap();
        let (r, _) = import_edited(
            dir.path(),
            "from examples/models/shakespeare-q4_0-gguf/model.gguf",
            "from /somewhere/else/model.gguf",
        );
        assert!(!r.stdout.contains("is not beside the card"), "{}", r.stdout);
    }

    #[test]
    fn every_number_read_from_a_log_is_range_checked_at_its_line() {
        for (from, to, line, says) in [
            (
                "KLD:   0.094644 ±   0.006676",
                "KLD:  -0.094644 ±   0.006676",
                155,
                "a KL divergence is a finite number, at least 0",
            ),
            (
                "KLD:   0.094644 ±   0.006676",
                "KLD:   0.094644 ±  -0.006676",
                155,
                "its ± (a standard error)",
            ),
            (
                "Same top p: 82.677 ± 2.379 %",
                "Same top p: 182.677 ± 2.379 %",
                184,
                "a share of rows lies in 0 to 100 %",
            ),
            (
                "Mean PPL(base)                :   3.449310",
                "Mean PPL(base)                :   0.449310",
                148,
                "a perplexity is a finite number, at least 1",
            ),
            (
                "99.0%   KLD:   0.495551",
                "99.0%   KLD:   0.995551",
                157,
                "below the 99.0% KLD printed before it",
            ),
            (
                "Maximum KLD:   0.763323",
                "Maximum KLD:   inf",
                156,
                "a KL divergence is a finite number",
            ),
            (
                "computing over 2 chunks",
                "computing over 4294967296 chunks",
                139,
                "4294967296 chunks of 256 tokens",
            ),
            (
                "n_ctx=256, batch_size",
                "n_ctx=99999999999, batch_size",
                139,
                "context length 99999999999 is outside",
            ),
        ] {
            let dir = candidate_dir();
            let (r, log) = import_edited(dir.path(), from, to);
            assert_eq!(r.code, 2, "{to}: {}", r.transcript());
            let e = &r.json()["error"];
            assert_eq!(e["file"], log.to_str().unwrap(), "{to}: {e}");
            assert_eq!(e["line"], line, "{to}: {e}");
            assert_eq!(e["kind"], "format", "{to}: {e}");
            let m = e["message"].as_str().unwrap();
            assert!(m.contains(says), "{to}: {m}");
            assert!(
                !dir.path().join("README.md").exists(),
                "{to}: no card written"
            );
        }
    }

    #[test]
    fn a_nan_in_a_log_is_the_logs_error_at_its_line_not_the_measurements() {
        let dir = candidate_dir();
        let (r, log) = import_edited(
            dir.path(),
            "Mean PPL(Q)                   :   4.164579 ±   0.427395",
            "Mean PPL(Q)                   :        nan ±        nan",
        );
        assert_eq!(r.code, 2, "{}", r.transcript());
        let e = &r.json()["error"];
        assert_eq!(e["file"], log.to_str().unwrap(), "{e}");
        assert_eq!(e["line"], 147, "{e}");
        let m = e["message"].as_str().unwrap();
        assert!(
            m.contains("Mean PPL(Q)") && !m.contains("measurement.json"),
            "{m}"
        );
    }

    #[test]
    fn without_a_base_file_the_card_has_no_empty_token_digest_and_passes_the_schema() {
        let dir = candidate_dir();
        let card = dir.path().join("README.md");
        // What the publisher gives by flag is given, so the schema's required fields are there.
        let r = run(&[
            "card",
            "--from-llamacpp",
            LOG,
            "--into",
            card.to_str().unwrap(),
            "--candidate-repo",
            "org/model-q4_0-gguf",
            "--quantization",
            "q4_0",
        ]);
        // Written, with lint errors for what a log cannot disclose.
        assert_eq!(r.code, 1, "{}", r.transcript());
        let text = std::fs::read_to_string(&card).unwrap();
        assert!(!text.contains("sha256: \"\""), "{text}");
        assert!(
            !text.contains("tokens:"),
            "no token stream is claimed: {text}"
        );
        assert!(r.stderr.contains("no --base-file"), "{}", r.stderr);
        let lint = run(&["lint", card.to_str().unwrap(), "--json"]);
        assert_eq!(lint.code, 1, "{}", lint.transcript());
        let codes = lint.codes();
        assert!(
            !codes.iter().any(|c| c == "schema-violation"),
            "{codes:?}\n{}",
            lint.stdout
        );
    }

    #[test]
    fn a_log_without_a_kld_block_is_refused_naming_it() {
        let dir = candidate_dir();
        let log = dir.path().join("ppl.log");
        std::fs::write(&log, "perplexity: calculating perplexity over 43 chunks\nFinal estimate: PPL = 4.0349 +/- 0.09385\n").unwrap();
        let r = run(&[
            "card",
            "--from-llamacpp",
            log.to_str().unwrap(),
            "--into",
            dir.path().join("README.md").to_str().unwrap(),
        ]);
        assert_eq!(r.code, 2, "{}", r.transcript());
        assert!(
            r.message().contains("KL divergence statistics"),
            "{}",
            r.message()
        );
    }
}
