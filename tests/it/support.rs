//! Running the binary and writing fixture cards.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// stderr less the `progress:` lines a run off a terminal prints for each stage: what it
    /// said about the inputs and the outcome.
    pub fn diagnostics(&self) -> String {
        self.stderr
            .lines()
            .filter(|l| !l.starts_with("progress: "))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }

    /// What the run said about its error: the error document's message with `--json` (which
    /// stderr does not repeat), else stderr.
    pub fn message(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.stdout)
            .ok()
            .and_then(|doc| doc["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| self.stderr.clone())
    }

    /// Exit code and stderr, for readable snapshots.
    pub fn transcript(&self) -> String {
        format!("exit: {}\n--- stderr\n{}", self.code, self.stderr)
    }

    /// The finding codes in the JSON output, in order.
    pub fn codes(&self) -> Vec<String> {
        self.json()["findings"]
            .as_array()
            .expect("findings array")
            .iter()
            .map(|f| f["code"].as_str().unwrap().to_owned())
            .collect()
    }

    pub fn finding(&self, code: &str) -> serde_json::Value {
        self.json()["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["code"] == code)
            .unwrap_or_else(|| panic!("no `{code}` finding in:\n{}", self.stdout))
            .clone()
    }
}

pub fn cardproof(args: &[&str]) -> Run {
    cardproof_in(&repo_root(), args)
}

pub fn cardproof_in(dir: &Path, args: &[&str]) -> Run {
    cardproof_with(dir, &[], args)
}

/// The binary run in `dir` with `env` set (e.g. `CARDPROOF_CONFIG_DIR`, so that no key of the
/// user's own config directory is trusted or created).
pub fn cardproof_with(dir: &Path, env: &[(&str, &Path)], args: &[&str]) -> Run {
    let mut command = Command::cargo_bin("cardproof").expect("binary builds");
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .args(args)
        .output()
        .expect("binary runs");
    Run {
        code: output.status.code().expect("exited normally"),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}

/// A `cardproof` command line built flag by flag, for the `measure`, `verify`, `kld` and
/// `reference export` lines the tests would otherwise spell out in full:
///
/// ```ignore
/// Cmd::measure().reference(&bf16).candidate(&fp8).eval_text(&text)
///     .context_length(128).bootstrap(10).out(&out).arg("--json").run();
/// Cmd::verify(&candidate).reference(&bf16).eval_text(&text).key(&key).out(&out).run();
/// ```
///
/// Arguments come out in the order the methods are called; [`Cmd::flag`], [`Cmd::arg`] and
/// [`Cmd::args`] add any the named methods do not. Path arguments take anything `AsRef<Path>`
/// (`&str`, `String`, `&Path`, `PathBuf`). [`Cmd::run`] goes through [`cardproof_with`]: in the
/// repository root unless [`Cmd::in_dir`], with the variables of [`Cmd::env`]. A `Cmd` is
/// `Clone`, so one base line can be run with several endings.
#[must_use]
#[derive(Clone)]
pub struct Cmd {
    args: Vec<String>,
    dir: PathBuf,
    env: Vec<(String, PathBuf)>,
}

impl Cmd {
    /// `cardproof SUBCOMMAND`, with no flags yet.
    pub fn new(subcommand: &str) -> Cmd {
        Cmd {
            args: vec![subcommand.to_owned()],
            dir: repo_root(),
            env: Vec::new(),
        }
    }

    pub fn measure() -> Cmd {
        Cmd::new("measure")
    }

    pub fn kld() -> Cmd {
        Cmd::new("kld")
    }

    /// `cardproof reference export`.
    pub fn reference_export() -> Cmd {
        Cmd::new("reference").arg("export")
    }

    /// `cardproof verify MODEL`.
    pub fn verify(model: impl AsRef<Path>) -> Cmd {
        Cmd::new("verify").path(model)
    }

    /// One argument as is.
    pub fn arg(mut self, arg: impl AsRef<str>) -> Cmd {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Arguments as they are.
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Cmd {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// A path as one argument.
    pub fn path(self, path: impl AsRef<Path>) -> Cmd {
        let arg = utf8(path.as_ref());
        self.arg(arg)
    }

    /// `FLAG VALUE`, the value a path or plain text (`"64"`, `"second-half"`).
    pub fn flag(self, flag: &str, value: impl AsRef<Path>) -> Cmd {
        self.arg(flag).path(value)
    }

    pub fn reference(self, path: impl AsRef<Path>) -> Cmd {
        self.flag("--reference", path)
    }

    pub fn candidate(self, path: impl AsRef<Path>) -> Cmd {
        self.flag("--candidate", path)
    }

    pub fn eval_text(self, path: impl AsRef<Path>) -> Cmd {
        self.flag("--eval-text", path)
    }

    pub fn out(self, path: impl AsRef<Path>) -> Cmd {
        self.flag("--out", path)
    }

    pub fn key(self, path: impl AsRef<Path>) -> Cmd {
        self.flag("--key", path)
    }

    pub fn context_length(self, tokens: usize) -> Cmd {
        self.arg("--context-length").arg(tokens.to_string())
    }

    pub fn bootstrap(self, resamples: impl std::fmt::Display) -> Cmd {
        self.arg("--bootstrap").arg(resamples.to_string())
    }

    /// The argument `old` (which must occur once) replaced by `new`: a shared command line with
    /// one of its inputs changed.
    pub fn replace(mut self, old: &str, new: impl AsRef<Path>) -> Cmd {
        let count = self.args.iter().filter(|a| *a == old).count();
        assert_eq!(count, 1, "`{old}` must occur once in {:?}", self.args);
        let at = self.args.iter().position(|a| a == old).unwrap();
        self.args[at] = utf8(new.as_ref());
        self
    }

    /// The consecutive arguments `run` removed (they must be there).
    pub fn without(mut self, run: &[&str]) -> Cmd {
        let at = self
            .args
            .windows(run.len())
            .position(|w| w == run)
            .unwrap_or_else(|| panic!("{run:?} not in {:?}", self.args));
        self.args.drain(at..at + run.len());
        self
    }

    /// Run in `dir` instead of the repository root.
    pub fn in_dir(mut self, dir: impl AsRef<Path>) -> Cmd {
        self.dir = dir.as_ref().to_owned();
        self
    }

    /// Run with the environment variable `key` set to `value`.
    pub fn env(mut self, key: &str, value: impl AsRef<Path>) -> Cmd {
        self.env.push((key.to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Run with each of `vars` set.
    pub fn envs<V: AsRef<Path>>(self, vars: &[(&str, V)]) -> Cmd {
        vars.iter().fold(self, |cmd, (k, v)| cmd.env(k, v))
    }

    /// The arguments so far, after the binary's name.
    pub fn argv(&self) -> &[String] {
        &self.args
    }

    pub fn run(&self) -> Run {
        let env: Vec<(&str, &Path)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_path()))
            .collect();
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        cardproof_with(&self.dir, &env, &args)
    }
}

fn utf8(path: &Path) -> String {
    path.to_str()
        .unwrap_or_else(|| panic!("{} is not UTF-8", path.display()))
        .to_owned()
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A temporary directory with `README.md` holding `text`.
pub fn card_dir(text: impl AsRef<[u8]>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("README.md"), text).expect("write card");
    dir
}

/// Lint `text` as README.md with `--json`, run from inside its directory.
pub fn lint_text(text: impl AsRef<[u8]>) -> Run {
    let dir = card_dir(text);
    cardproof_in(dir.path(), &["lint", "README.md", "--json"])
}

/// The compliant example card's text, the base most fixtures edit.
pub fn compliant_card() -> String {
    std::fs::read_to_string(repo_root().join("examples/cards/compliant-fp8/README.md"))
        .expect("compliant example exists")
}

/// The compliant card with one line replaced (the old line must exist exactly once).
pub fn compliant_with(old: &str, new: &str) -> String {
    let card = compliant_card();
    assert_eq!(
        card.matches(old).count(),
        1,
        "`{old}` must occur once in the compliant card"
    );
    card.replacen(old, new, 1)
}

/// An example model's path, as the tests pass it on the command line.
pub fn model(name: &str) -> String {
    repo_root()
        .join("examples/models")
        .join(name)
        .display()
        .to_string()
}

/// The first `chars` characters of the example eval text, cut at a line end.
pub fn short_text_content(chars: usize) -> String {
    let mut text = std::fs::read_to_string(repo_root().join("examples/data/eval.txt")).unwrap();
    let end = text[chars..]
        .find('\n')
        .map_or(text.len(), |i| chars + i + 1);
    text.truncate(end);
    text
}

/// [`short_text_content`] written to `dir/eval.txt`.
pub fn short_text(dir: &Path, chars: usize) -> PathBuf {
    let path = dir.join("eval.txt");
    std::fs::write(&path, short_text_content(chars)).unwrap();
    path
}

/// A copy of an example model's files in `to`.
pub fn copy_model(name: &str, to: &Path) {
    copy_dir(Path::new(&model(name)), to);
}

/// A copy of the files of the model directory `from` in `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A copy of the directory tree `from` in `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// Rewrite `dir/config.json` with `f`.
pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(&mut c);
    std::fs::write(path, c.to_string()).unwrap();
}

/// A short `measure` of `candidate` against the bf16 example on `text` (windows of 128 tokens,
/// `resamples` bootstrap resamples) into `out`, with `extra` flags.
pub fn measure_short(
    candidate: &Path,
    text: &Path,
    out: &Path,
    resamples: &str,
    extra: &[&str],
) -> Run {
    Cmd::measure()
        .reference(model("shakespeare-bf16"))
        .candidate(candidate)
        .eval_text(text)
        .context_length(128)
        .bootstrap(resamples)
        .out(out)
        .args(extra)
        .run()
}

/// The measure flags of llama.cpp's protocol, which a llama.cpp base file fixes.
pub const LLAMACPP_PROTOCOL: [&str; 8] = [
    "--positions",
    "second-half",
    "--bos",
    "per-window",
    "--direction",
    "forward",
    "--vocab",
    "threshold",
];

/// A card's text without its `kl.direction` line (a required disclosure item removed).
pub fn without_direction(card: &str) -> String {
    let without: String = card
        .lines()
        .filter(|l| !l.trim_start().starts_with("direction:"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(without, card, "the card states a direction to remove");
    without
}

/// A copy of an example model in `to` whose weights cannot be loaded (model.safetensors cut to
/// a few bytes) but whose config, tokenizer and files hash as usual: a command that fails on it
/// with anything but a load error never reached a forward pass.
pub fn unloadable_copy(name: &str, to: &Path) -> PathBuf {
    copy_model(name, to);
    std::fs::write(to.join("model.safetensors"), b"cut short").unwrap();
    to.to_owned()
}

/// One tensor of a safetensors file, owned: name, dtype, shape, bytes.
pub type OwnedTensor = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// Rewrites the safetensors file at `path` with `edit` applied to its tensors (to change, add
/// or drop some), keeping the rest byte for byte.
pub fn rewrite_safetensors(path: &Path, edit: impl FnOnce(&mut Vec<OwnedTensor>)) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<OwnedTensor> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The processes still alive (zombies are not) in any of the process groups `pgids`, waiting up
/// to five seconds for killed ones to go. Linux (`/proc`).
pub fn alive_in_groups(pgids: &[u32]) -> Vec<String> {
    let members = || -> Vec<String> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| {
                let stat = std::fs::read_to_string(e.ok()?.path().join("stat")).ok()?;
                let (head, rest) = stat.rsplit_once(')')?;
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let (state, pgrp) = (fields.first()?, fields.get(2)?.parse::<u32>().ok()?);
                (pgids.contains(&pgrp) && !matches!(*state, "Z" | "X"))
                    .then(|| format!("{head}) {state} pgrp {pgrp}"))
            })
            .collect()
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let alive = members();
        if alive.is_empty() || std::time::Instant::now() > until {
            return alive;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Every entry under `dir`, for a test that expects nothing left there.
pub fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path().display().to_string()))
                .collect()
        })
        .unwrap_or_default()
}
