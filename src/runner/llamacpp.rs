//! llama.cpp as a runner (issue #21): the user's own `llama-perplexity` (any build: CPU, CUDA,
//! Metal, Vulkan) runs both models, and cardproof reduces what they write.
//!
//! Three processes run at once, joined by named pipes in a private temporary directory:
//!
//! - the reference's base pass, `llama-perplexity -m REF -f TEXT -c L --kl-divergence-base
//!   ref.pipe`, and the candidate's, the same with `-m CAND` into `cand.pipe`: each writes its
//!   `--kl-divergence-base` stream (header, tokens, one uint16 row per scored position);
//! - llama.cpp's own KLD pass, `llama-perplexity -m CAND -c L --kl-divergence-base gate.pipe
//!   --kl-divergence`, which reads the reference's stream (forwarded by cardproof as it reads it)
//!   and prints llama.cpp's statistics block.
//!
//! cardproof reads the two base streams on a thread each, in batches of rows from a fixed pool
//! (`streams`: memory stays capped whatever either side's pace), reduces each pair of rows on
//! every core while the next batches are read, and forwards every reference byte to the gate
//! from a third thread; nothing is stored (a 100k-token base stream at a 248k vocabulary is
//! ~50 GB). The printed block must agree with cardproof's llama.cpp-compatible
//! reduction of the same rows within the candidate's uint16 rounding, or the run is an error
//! naming both numbers: the printout gate. A process that fails, or a pipe that no process opens,
//! is an error with that process's last log lines, never a hang.
//!
//! Every process runs under [`crate::runner::child`]: in a process group of its own, killed
//! whole on every error; its log read into memory with a cap ([`MAX_LOG_BYTES`]); `--version`
//! with a deadline ([`VERSION_TIMEOUT_VAR`]) and a run with a stall timeout
//! ([`STALL_TIMEOUT_VAR`]: no byte on the base streams for that long stops it). Nothing is
//! written to disk but the named pipes, in a private directory removed on every way out.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kld::llamacpp::{
    BaseRow, CompatAccumulator, CompatStats, PrintedStats, RowScore, clamped_reference_mass,
    score_row_log_probs,
};
use crate::runner::child::{self, Child, Output, Progressing, Watch};

mod streams;

/// The most one `llama-perplexity` process may write to its stdout and stderr. At `-lv 4` a run
/// logs its load report (kilobytes) and a line or an entry per chunk (a KLD pass's line is
/// ~130 bytes): 64 MiB is half a million chunks. More is a flood: the run is stopped, an error.
pub const MAX_LOG_BYTES: usize = 64 << 20;
/// What `--version` may print (llama.cpp prints two lines).
const MAX_VERSION_BYTES: usize = 64 << 10;
/// The environment variable that sets how long `--version` may take, in seconds.
pub const VERSION_TIMEOUT_VAR: &str = "CARDPROOF_LLAMACPP_VERSION_TIMEOUT_SECS";
/// `--version` answers at once; a minute covers a cold start from a slow disk.
const VERSION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a failed run waits for its processes to exit by themselves before killing them
/// (under load, llama.cpp's worker threads spin and an exiting process can take seconds).
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// Once one process has exited by itself, how long the others get to follow it.
const EXIT_FOLLOW: Duration = Duration::from_millis(500);
/// The environment variable that sets the stall timeout of a run, in seconds.
pub const STALL_TIMEOUT_VAR: &str = "CARDPROOF_LLAMACPP_STALL_SECS";
/// How long the base streams may go without a byte: the model's load and one batch of chunks
/// (`-b` tokens) per process, on the slowest setup cardproof expects. Raise it for larger.
const STALL_TIMEOUT: Duration = Duration::from_secs(300);

/// The settings a llama.cpp run is made with; each is a `llama-perplexity` flag, recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LlamacppSettings {
    /// `-t`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// `-b`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<u32>,
    /// `-ub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ubatch: Option<u32>,
    /// `-ngl` (a number, `auto` or `all`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_layers: Option<String>,
    /// `-dev` (`none`: no offloading at all, llama.cpp's CPU backend alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// `-fa`: `on`, `off` or `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_attn: Option<String>,
    /// `-ctk` and `-ctv` (llama.cpp's cache types: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl,
    /// q5_0, q5_1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type_k: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type_v: Option<String>,
    /// The Hadamard rotation of a quantized cache (llama.cpp's default since 2026-04); `false`
    /// sets `LLAMA_ATTN_ROT_DISABLE=1`.
    pub rotation: bool,
}

impl Default for LlamacppSettings {
    fn default() -> Self {
        LlamacppSettings {
            threads: None,
            batch: None,
            ubatch: None,
            gpu_layers: None,
            device: None,
            flash_attn: None,
            cache_type_k: None,
            cache_type_v: None,
            rotation: true,
        }
    }
}

/// llama.cpp's cache types, as `-ctk`/`-ctv` take them.
pub const CACHE_TYPES: [&str; 9] = [
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
];

impl LlamacppSettings {
    /// Why these settings cannot run, naming the flag.
    pub fn check(&self) -> std::result::Result<(), String> {
        for (flag, v) in [("-ctk", &self.cache_type_k), ("-ctv", &self.cache_type_v)] {
            if let Some(v) = v
                && !CACHE_TYPES.contains(&v.as_str())
            {
                return Err(format!(
                    "{flag} {v}: llama.cpp's cache types are {}",
                    CACHE_TYPES.join(", ")
                ));
            }
        }
        for (flag, v, most) in [
            ("-t", self.threads, 4096),
            ("-b", self.batch, 1 << 20),
            ("-ub", self.ubatch, 1 << 20),
        ] {
            if let Some(n) = v
                && !(1..=most).contains(&n)
            {
                return Err(format!("{flag} {n}: expected 1 to {most}"));
            }
        }
        if let Some(fa) = &self.flash_attn
            && !matches!(fa.as_str(), "on" | "off" | "auto")
        {
            return Err(format!("-fa {fa}: expected on, off or auto"));
        }
        if let Some(n) = &self.gpu_layers
            && !(n == "auto" || n == "all" || n.parse::<u32>().is_ok())
        {
            return Err(format!(
                "-ngl {n}: expected a number of layers, auto or all"
            ));
        }
        Ok(())
    }

    /// The flags, in `llama-perplexity`'s spelling.
    pub fn args(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut push = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push(flag.to_owned());
                out.push(v);
            }
        };
        push("-t", self.threads.map(|n| n.to_string()));
        push("-b", self.batch.map(|n| n.to_string()));
        push("-ub", self.ubatch.map(|n| n.to_string()));
        push("-ngl", self.gpu_layers.clone());
        push("-dev", self.device.clone());
        push("-fa", self.flash_attn.clone());
        push("-ctk", self.cache_type_k.clone());
        push("-ctv", self.cache_type_v.clone());
        out
    }
}

/// `--runner llamacpp` as the command line sets it up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LlamacppOptions {
    /// `--llamacpp-bin` (else `llama-perplexity` on `PATH`).
    pub binary: Option<PathBuf>,
    /// `--llamacpp-server`: the `llama-server` that generates turns (else the one beside
    /// `llama-perplexity`).
    pub server: Option<PathBuf>,
    /// The flags both models run with; the candidate's KV cache comes from the request's
    /// `kv_cache` (`--kv-cache`), the reference keeps llama.cpp's default cache.
    pub settings: LlamacppSettings,
    /// Skip llama.cpp's own KLD pass (the printout gate): one process fewer, and a rerun that is
    /// never `reproduced`.
    pub no_gate: bool,
    /// The reference's flags where a sweep runs it differently from the candidate (`None`: the
    /// same flags; its KV cache is the request's reference cache either way).
    pub reference: Option<LlamacppSettings>,
}

/// The settings knobs of `--sweep llamacpp.KNOB=A,B,...`, in llama.cpp's terms.
pub const SWEEP_KNOBS: [&str; 3] = ["llamacpp.kv", "llamacpp.flash_attn", "llamacpp.backend"];

/// `settings` with a sweep knob set to `value`: `llamacpp.kv` a cache type for K and V
/// (`q8_0`) or `k:TYPE/v:TYPE`, with llama.cpp's default rotation of quantized types;
/// `llamacpp.flash_attn` `on`, `off` or `auto`; `llamacpp.backend` `cpu` (`-dev none -ngl 0`:
/// nothing offloaded) or a GPU backend (`cuda`, `metal`, `vulkan`, ...: `-ngl all` on the build's
/// devices). Which GPU backend runs is the binary's: the run records what its log says.
pub fn with_knob(
    settings: &LlamacppSettings,
    knob: &str,
    value: &str,
) -> std::result::Result<LlamacppSettings, String> {
    let mut s = settings.clone();
    match knob {
        "llamacpp.kv" => {
            let (k, v) = match value.split_once('/') {
                Some((k, v)) => (
                    k.strip_prefix("k:").unwrap_or(k),
                    v.strip_prefix("v:").unwrap_or(v),
                ),
                None => (value, value),
            };
            s.cache_type_k = Some(k.to_owned());
            s.cache_type_v = Some(v.to_owned());
            s.rotation = true;
        }
        "llamacpp.flash_attn" => s.flash_attn = Some(value.to_owned()),
        "llamacpp.backend" => {
            if value == "cpu" {
                s.device = Some("none".into());
                s.gpu_layers = Some("0".into());
            } else {
                s.device = None;
                s.gpu_layers = Some("all".into());
            }
        }
        other => {
            return Err(format!(
                "`{other}` is not a llama.cpp sweep knob ({})",
                SWEEP_KNOBS.join(", ")
            ));
        }
    }
    s.check()?;
    Ok(s)
}

/// llama.cpp's cache flags for a KV-cache setting: `-ctk`, `-ctv` and the rotation. llama.cpp
/// rotates a quantized side unless `LLAMA_ATTN_ROT_DISABLE` is set, so cardproof's `q8_0` (no
/// rotation) runs with it set and `q8_0+hadamard` without; an unrounded side is llama.cpp's
/// default f16 cache.
pub fn cache_flags(
    kv: Option<crate::runner::native::kv_cache::KvCacheSetting>,
) -> std::result::Result<(Option<String>, Option<String>, bool), String> {
    use crate::runner::native::kv_cache::KvScheme;
    let Some(kv) = kv else {
        return Ok((None, None, true));
    };
    if kv.computed_scales || kv.residual.is_some() {
        return Err(format!(
            "--kv-cache {}: llama.cpp's cache is write-then-read with per-block scales; computed scales and residual windows belong to vLLM and transformers",
            kv.name()
        ));
    }
    let flag = |s: KvScheme| -> std::result::Result<Option<String>, String> {
        match s {
            KvScheme::None => Ok(None),
            s if CACHE_TYPES.contains(&s.as_str()) => Ok(Some(s.as_str().to_owned())),
            s => Err(format!(
                "--kv-cache {}: `{s}` is not a llama.cpp cache type ({})",
                kv.name(),
                CACHE_TYPES.join(", ")
            )),
        }
    };
    let quantized = kv.k.is_blocked() || kv.v.is_blocked();
    Ok((flag(kv.k)?, flag(kv.v)?, kv.hadamard || !quantized))
}

/// What a `llama-perplexity` binary says it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LlamacppBuild {
    pub binary: String,
    /// The `--version` line as printed.
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// `built with ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiler: Option<String>,
}

impl LlamacppBuild {
    /// The version as cards write it: `b6590 (abcdef12)`, `b6590`, or the printed version.
    pub fn engine_version(&self) -> String {
        match (&self.build, &self.commit) {
            (Some(n), Some(c)) => format!("b{n} ({c})"),
            (Some(n), None) => format!("b{n}"),
            _ => self
                .version
                .trim_start_matches("version:")
                .trim()
                .to_owned(),
        }
    }
}

/// The binary to run: `given`, else `llama-perplexity` on `PATH`.
pub fn find_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        if p.is_file() {
            return Ok(p.to_owned());
        }
        return Err(Error::usage(
            p,
            "no such file: --llamacpp-bin names llama.cpp's llama-perplexity binary",
        ));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("llama-perplexity"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::usage(
                Path::new("--llamacpp-bin"),
                "no llama-perplexity on PATH: build llama.cpp's `llama-perplexity` (cmake --build build --target llama-perplexity) and name it with --llamacpp-bin PATH",
            )
        })
}

/// `binary --version`, parsed: `version: 6590 (abcdef12)` (upstream) or `version: 0.5.0-dev
/// (build 1, commit 0c1e570)` (a source release), then `built with ...`.
/// It runs in its own process group with a deadline ([`VERSION_TIMEOUT_VAR`], a minute by
/// default) and at most 64 KiB of output: a binary that never answers or prints forever is
/// stopped, with everything it started, and refused.
pub fn build_of(binary: &Path) -> Result<LlamacppBuild> {
    let limit = child::timeout_from_env(VERSION_TIMEOUT_VAR, VERSION_TIMEOUT)?;
    let watch = Watch::new();
    let mut command = Command::new(binary);
    command.arg("--version");
    let mut process = watch
        .spawn(
            "its `--version`",
            command,
            Output::Capture {
                cap: MAX_VERSION_BYTES,
            },
        )
        .map_err(|e| Error::runner(binary, format!("cannot start it: {e}")))?;
    let late = format!(
        "`--version` did not answer within {} ({VERSION_TIMEOUT_VAR}): stopped; is it llama-perplexity?",
        child::seconds(limit)
    );
    watch
        .wait(&mut process, Some((Instant::now() + limit, &late)))
        .map_err(|why| Error::runner(binary, why))?;
    let text = process.output();
    let line = text
        .lines()
        .find(|l| l.starts_with("version:"))
        .ok_or_else(|| {
            Error::runner(
                binary,
                format!(
                    "`--version` printed no `version:` line; is it llama-perplexity? ({})",
                    clip(text.trim(), 300)
                ),
            )
        })?
        .trim()
        .to_owned();
    let inside = line
        .split_once('(')
        .and_then(|(_, r)| r.split_once(')'))
        .map(|(i, _)| i.to_owned());
    let (mut build, mut commit) = (None, None);
    if let Some(inside) = &inside {
        for part in inside.split(',').map(str::trim) {
            if let Some(b) = part.strip_prefix("build ") {
                build = Some(b.to_owned());
            } else if let Some(c) = part.strip_prefix("commit ") {
                commit = Some(c.to_owned());
            } else if part.chars().all(|c| c.is_ascii_hexdigit()) && !part.is_empty() {
                commit = Some(part.to_owned());
            }
        }
    }
    if build.is_none() {
        // `version: 6590 (abcdef12)`: the number is the build.
        build = line
            .trim_start_matches("version:")
            .split_whitespace()
            .next()
            .filter(|n| n.chars().all(|c| c.is_ascii_digit()))
            .map(str::to_owned);
    }
    Ok(LlamacppBuild {
        binary: binary.display().to_string(),
        version: line,
        build,
        commit,
        compiler: text
            .lines()
            .find_map(|l| l.strip_prefix("built with "))
            .map(|s| s.trim().to_owned()),
    })
}

/// What a run's log (`-lv 4`) says it did: where it computed and with which numerics, as
/// llama.cpp resolved them (an `auto` flash attention, the rotation it chose, the batch sizes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LlamacppObserved {
    /// `cpu`, `cuda`, `metal`, `vulkan`, ...
    pub backend: String,
    pub device: String,
    /// `offloaded N/M layers to GPU`, when printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offloaded: Option<String>,
    /// Flash attention as resolved: `enabled` or `disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_attn: Option<String>,
    /// The KV cache's types as allocated (`K (q8_0)`, `V (f16)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type_k: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type_v: Option<String>,
    /// llama.cpp's Hadamard rotation of K and V as it decided them (`attn_rot_k`, `attn_rot_v`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_k: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation_v: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_batch: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_ubatch: Option<u32>,
    /// The model file's type (`Q4_0`, `BF16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_type: Option<String>,
    /// The CPU features ggml was built for and found (`system_info`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_info: Option<String>,
}

impl LlamacppObserved {
    /// The KV cache's types as a `kv_cache_dtype` label (`q8_0`, `k:q8_0/v:f16`), where the log
    /// showed both.
    pub fn kv_label(&self) -> Option<String> {
        match (&self.cache_type_k, &self.cache_type_v) {
            (Some(k), Some(v)) if k == v => Some(k.clone()),
            (Some(k), Some(v)) => Some(format!("k:{k}/v:{v}")),
            _ => None,
        }
    }
}

/// What a run's log says it did.
pub fn observe(log: &str) -> LlamacppObserved {
    let mut d = LlamacppObserved {
        backend: "cpu".into(),
        device: "cpu".into(),
        ..Default::default()
    };
    let after = |l: &str, key: &str| -> Option<String> {
        let (_, rest) = l.split_once(key)?;
        Some(rest.trim().trim_start_matches('=').trim().to_owned())
    };
    for line in log.lines() {
        let l = line.trim();
        for (needle, backend) in [
            ("ggml_cuda_init", "cuda"),
            ("ggml_metal", "metal"),
            ("ggml_vulkan", "vulkan"),
            ("ggml_sycl", "sycl"),
            ("ggml_hip", "hip"),
        ] {
            if l.contains(needle) {
                d.backend = backend.into();
            }
        }
        if let Some((_, rest)) = l.split_once("Device 0: ") {
            d.device = rest.split(',').next().unwrap_or(rest).trim().to_owned();
        }
        if let Some(rest) = after(l, "offloaded ") {
            d.offloaded = Some(rest);
        }
        if let Some(v) = after(l, "llama_context: flash_attn") {
            d.flash_attn = Some(v);
        }
        if l.contains("Flash Attention enabled") {
            d.flash_attn = Some("enabled".into());
        } else if l.contains("Flash Attention not supported")
            || l.contains("Flash Attention disabled")
        {
            d.flash_attn = Some("disabled".into());
        }
        if l.contains("llama_kv_cache: size =") {
            let ty = |side: &str| {
                let (_, rest) = l.split_once(&format!("{side} ("))?;
                Some(rest.split(')').next()?.to_owned())
            };
            d.cache_type_k = ty("K").or(d.cache_type_k.take());
            d.cache_type_v = ty("V").or(d.cache_type_v.take());
        }
        let flag = |v: Option<String>| v.and_then(|v| v.split(',').next().map(|n| n.trim() == "1"));
        if let Some(v) = flag(after(l, "attn_rot_k =")) {
            d.rotation_k = Some(v);
        }
        if let Some(v) = flag(after(l, "attn_rot_v =")) {
            d.rotation_v = Some(v);
        }
        if let Some(v) = after(l, "llama_context: n_batch") {
            d.n_batch = v.parse().ok();
        }
        if let Some(v) = after(l, "llama_context: n_ubatch") {
            d.n_ubatch = v.parse().ok();
        }
        if let Some(v) = after(l, "print_info: file type") {
            d.file_type = Some(v);
        }
        if let Some((_, rest)) = l.split_once("system_info: ") {
            d.system_info = Some(rest.trim().to_owned());
        }
    }
    if d.offloaded.as_deref().is_some_and(|o| o.starts_with("0/")) {
        d.backend = "cpu".into();
        d.device = "cpu".into();
    }
    d
}

/// A pair run's results.
pub struct PairRun {
    pub n_ctx: u32,
    pub n_vocab: u32,
    pub n_chunk: u32,
    /// The token stream llama.cpp scored (from the reference's base stream).
    pub tokens: Vec<i32>,
    /// cardproof's llama.cpp-compatible statistics of the rows (the candidate from its stored
    /// rows).
    pub compat: CompatStats,
    /// Rows whose true next token lies below the candidate's stored 16-nat window: their
    /// candidate NLL (and so PPL(Q)) reads as the floor, a lower bound (llama.cpp's own pass
    /// reads the candidate's full logits).
    pub clamped_candidate_tokens: u64,
    /// The reference's probability, summed over the rows, on entries llama.cpp's KL counts
    /// where the candidate's stored row is at its floor ([`clamped_reference_mass`]).
    pub clamped_reference_mass: f64,
    /// What llama.cpp's own KLD pass printed (absent without the gate).
    pub printed: Option<Printed>,
    /// What the reference's and the candidate's runs did, from their logs.
    pub reference_observed: LlamacppObserved,
    pub candidate_observed: LlamacppObserved,
    /// Each process's log, last lines.
    pub logs: Vec<(String, String)>,
    /// Seconds from the start to the last row.
    pub seconds: f64,
}

/// What a pair run runs: the binary, the two GGUF files, the text, the window, each side's
/// settings (a sweep changes the candidate's only), and whether llama.cpp's own KLD pass runs
/// beside it as the printout gate.
pub struct PairSpec<'a> {
    pub binary: &'a Path,
    pub reference: &'a Path,
    pub candidate: &'a Path,
    pub text: &'a Path,
    pub n_ctx: usize,
    pub reference_settings: &'a LlamacppSettings,
    pub candidate_settings: &'a LlamacppSettings,
    pub gate: bool,
}

/// The processes of a run: each one's role (`reference`, `candidate`, `gate`) and its child.
type Children<'a> = Vec<(&'a str, Child)>;

/// A private directory for a run's pipes, deleted when dropped.
fn run_dir() -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("cardproof-llamacpp-")
        .tempdir()
        .map_err(|e| Error::io(&std::env::temp_dir(), e))
}

fn make_pipe(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &p,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
    )
    .map_err(|e| Error::io(&p, e.into()))?;
    Ok(p)
}

/// How one `llama-perplexity` process runs: which model, which text (none in KLD mode, where
/// the base stream carries the tokens), its window, chunks and settings.
struct Launch<'a> {
    model: &'a Path,
    text: Option<&'a Path>,
    base: &'a Path,
    kld: bool,
    n_ctx: usize,
    chunks: Option<u32>,
    settings: &'a LlamacppSettings,
}

/// Starts one process as `role` under `watch`, its stdout and stderr read into memory (at most
/// [`MAX_LOG_BYTES`]).
fn spawn(watch: &Watch, binary: &Path, role: &str, l: &Launch) -> Result<Child> {
    let mut c = Command::new(binary);
    // `-lv 4`: llama.cpp's informational lines (the resolved flash attention, the cache types,
    // the rotation), without its debug lines.
    c.arg("-m")
        .arg(l.model)
        .args(["-c", &l.n_ctx.to_string(), "-lv", "4"]);
    if let Some(text) = l.text {
        c.arg("-f").arg(text);
    }
    if let Some(n) = l.chunks {
        c.args(["--chunks", &n.to_string()]);
    }
    c.arg("--kl-divergence-base").arg(l.base);
    if l.kld {
        c.arg("--kl-divergence");
    }
    c.args(l.settings.args());
    if !l.settings.rotation {
        c.env("LLAMA_ATTN_ROT_DISABLE", "1");
    }
    // Three processes share the cores: OpenMP workers that spin after each graph starve the
    // others (and llama.cpp's own log thread, which then loses its last lines at exit). Passive
    // waiting changes no number.
    if std::env::var_os("OMP_WAIT_POLICY").is_none() {
        c.env("OMP_WAIT_POLICY", "PASSIVE");
    }
    watch
        .spawn(
            &format!("the {role} process"),
            c,
            Output::Capture { cap: MAX_LOG_BYTES },
        )
        .map_err(|e| Error::runner(binary, format!("cannot start it: {e}")))
}

/// What receives each pair of rows, in order: the reference's row, the candidate's, their
/// score, the row's index and its true next token.
pub type RowSink<'a> = dyn FnMut(&BaseRow, &BaseRow, &ScoredRow, u64, i32) -> Result<()> + 'a;

/// Rows scored at once, as bytes of their decoded f32 rows: a batch of one stream's stored rows
/// is half that (uint16 codes), and `streams` holds at most three batches of each stream and
/// three of the gate's bytes, 144 MiB whatever the vocabulary (a 248k vocabulary's batch is 33
/// rows).
const BATCH_BYTES: usize = 32 << 20;

/// One pair of rows scored with llama.cpp's arithmetic ([`score_row_log_probs`]: the KL over
/// the reference's entries above its gate, the candidate's stored log-probs as they are, each
/// NLL from its stored row, both first-index top-1 tokens).
#[derive(Debug, Clone, Copy)]
pub struct ScoredRow {
    pub score: RowScore,
    /// The true token lies below the candidate's stored 16-nat window: its NLL reads as the
    /// floor, a lower bound.
    pub clamped: bool,
    /// The reference's probability on the entries the candidate's window clamps
    /// ([`clamped_reference_mass`]).
    pub clamped_mass: f64,
}

fn score_pair(a: &BaseRow, b: &BaseRow, token: i32, buf: &mut [f32]) -> ScoredRow {
    b.decode_into(buf);
    ScoredRow {
        score: score_row_log_probs(a, buf, token),
        clamped: b.scale > 0.0 && b.codes.get(token as usize) == Some(&0),
        clamped_mass: clamped_reference_mass(a, b),
    }
}

/// Starts a pair run's processes under `watch`: the reference's and the candidate's base
/// passes, and llama.cpp's own KLD pass when there is a gate pipe.
fn start_pair<'a>(
    spec: &PairSpec,
    watch: &Watch,
    ref_pipe: &Path,
    cand_pipe: &Path,
    gate_pipe: Option<&Path>,
) -> Result<Children<'a>> {
    let launch = |model, base, kld: bool, settings| Launch {
        model,
        text: (!kld).then_some(spec.text),
        base,
        kld,
        n_ctx: spec.n_ctx,
        chunks: None,
        settings,
    };
    let mut children: Children = Vec::new();
    for (role, model, base, kld, settings) in [
        (
            "reference",
            spec.reference,
            ref_pipe,
            false,
            spec.reference_settings,
        ),
        (
            "candidate",
            spec.candidate,
            cand_pipe,
            false,
            spec.candidate_settings,
        ),
    ] {
        let c = spawn(
            watch,
            spec.binary,
            role,
            &launch(model, base, kld, settings),
        )?;
        children.push((role, c));
    }
    if let Some(g) = gate_pipe {
        let l = launch(spec.candidate, g, true, spec.candidate_settings);
        children.push(("gate", spawn(watch, spec.binary, "gate", &l)?));
    }
    Ok(children)
}

/// The `--version` deadline and the stall timeout, from their environment variables (checked
/// before any work, so a mistyped one is refused at once).
pub fn timeouts() -> Result<(Duration, Duration)> {
    Ok((
        child::timeout_from_env(VERSION_TIMEOUT_VAR, VERSION_TIMEOUT)?,
        child::timeout_from_env(STALL_TIMEOUT_VAR, STALL_TIMEOUT)?,
    ))
}

/// What a run stopped for stalling says.
fn stall_message(limit: Duration) -> String {
    format!(
        "no byte moved on llama.cpp's base streams for {}: stopped as stalled (a model slower than that to load or to compute one batch needs a longer {STALL_TIMEOUT_VAR})",
        child::seconds(limit)
    )
}

/// Run the reference and the candidate (GGUF files) over the text in windows of `n_ctx`, every
/// pair of rows handed to `row` (reference row, candidate row, row index, true next token) as
/// it arrives; with `gate`, llama.cpp's own KLD pass reads the reference's rows too and its
/// printout is returned beside cardproof's reduction. `progress(done, total)` counts chunks.
pub fn run_pair(
    spec: &PairSpec,
    row: &mut RowSink,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<PairRun> {
    let started = Instant::now();
    let binary = spec.binary;
    let stall = child::timeout_from_env(STALL_TIMEOUT_VAR, STALL_TIMEOUT)?;
    let dir = run_dir()?;
    let (ref_pipe, cand_pipe) = (
        make_pipe(dir.path(), "ref.pipe")?,
        make_pipe(dir.path(), "cand.pipe")?,
    );
    let gate_pipe = if spec.gate {
        Some(make_pipe(dir.path(), "gate.pipe")?)
    } else {
        None
    };
    let watch = Watch::new();
    let mut children = start_pair(spec, &watch, &ref_pipe, &cand_pipe, gate_pipe.as_deref())?;
    let stalled = watch
        .stall_timeout(stall, stall_message(stall))
        .map_err(|e| Error::runner(binary, format!("cannot watch the run: {e}")))?;
    // The streams' threads outlive a failed run's closure: they are joined once its processes
    // are killed (each thread then meets the end of its pipe).
    let mut reading: Option<streams::PairStreams> = None;
    let result = (|| -> Result<(PairRun, Vec<(String, String)>)> {
        let (a, b, gate_writer) = open_pair_streams(
            spec,
            &watch,
            &mut children,
            &ref_pipe,
            &cand_pipe,
            gate_pipe.as_deref(),
        )?;
        let mut head = StreamHead {
            n_ctx: a.n_ctx,
            n_vocab: a.n_vocab,
            n_chunk: a.n_chunk,
            tokens: a.tokens,
        };
        let per_chunk = u64::from(head.n_ctx - 1 - head.n_ctx / 2);
        // The gate's stream is the reference's, padded (see [`gate_padding`]).
        let pad = gate_padding(head.n_chunk, head.n_ctx, spec.candidate_settings.batch);
        let gate = gate_writer.map(|writer| streams::GateFeed {
            writer,
            head: padded_head(&head.tokens, head.n_ctx, head.n_vocab, head.n_chunk, pad),
            pad_rows: u64::from(pad) * per_chunk,
        });
        let width = head.n_vocab as usize;
        let batch_rows = (BATCH_BYTES / (4 * width).max(1)).clamp(1, 256);
        let pair = reading.insert(streams::start(binary, a.rows, b.rows, gate, batch_rows)?);
        let tally = score_rows(pair, &head, row, progress)?;
        let r = tally.rows;
        if r != per_chunk * u64::from(head.n_chunk) {
            return Err(Error::runner(
                binary,
                format!(
                    "the base streams ended after {r} rows; {} chunks of {per_chunk} were announced",
                    head.n_chunk
                ),
            ));
        }
        // The gate's stream written whole (its padding too), every thread joined.
        if let Some(pair) = reading.take() {
            pair.finish()?;
        }
        let seconds = started.elapsed().as_secs_f64();
        pair_result(spec, &mut head, tally, &mut children, &watch, seconds)
    })();
    drop(stalled);
    let finished = finish_run(result, &mut children, &watch, binary);
    if let Some(pair) = reading {
        pair.abandon();
    }
    finished.map(|(mut run, logs)| {
        run.logs = logs.into_iter().map(|(n, l)| (n, tail(&l, 40))).collect();
        run
    })
}

/// A pair run's geometry and tokens, from the reference's base stream (the candidate's is
/// checked equal).
struct StreamHead {
    n_ctx: u32,
    n_vocab: u32,
    n_chunk: u32,
    tokens: Vec<i32>,
}

/// A model's base stream as a pair run reads it: from its pipe through a 1 MiB buffer, every
/// read counted as progress by the stall watch.
type PipeStream = crate::kld::llamacpp::BaseStream<std::io::BufReader<Progressing<std::fs::File>>>;

/// The gate's pipe, written through a 1 MiB buffer, every write counted as progress.
type GateWriter = std::io::BufWriter<Progressing<std::fs::File>>;

/// Opens a pair run's pipes as their processes open the other ends, reads both base streams'
/// headers and tokens, and refuses a candidate that llama.cpp tokenized or cut differently.
fn open_pair_streams(
    spec: &PairSpec,
    watch: &Watch,
    children: &mut Children,
    ref_pipe: &Path,
    cand_pipe: &Path,
    gate_pipe: Option<&Path>,
) -> Result<(PipeStream, PipeStream, Option<GateWriter>)> {
    let binary = spec.binary;
    let reader = |end: std::fs::File| {
        std::io::BufReader::with_capacity(1 << 20, Progressing::new(end, watch))
    };
    let ref_in = open_pipe(ref_pipe, false, children, 0, watch, binary)?;
    let cand_in = open_pipe(cand_pipe, false, children, 1, watch, binary)?;
    let gate_out = match gate_pipe {
        Some(g) => Some(open_pipe(g, true, children, 2, watch, binary)?),
        None => None,
    };
    for f in [Some(&ref_in), Some(&cand_in), gate_out.as_ref()]
        .into_iter()
        .flatten()
    {
        widen_pipe(f);
    }
    let a = crate::kld::llamacpp::BaseStream::open(ref_pipe, reader(ref_in))?;
    let b = crate::kld::llamacpp::BaseStream::open(cand_pipe, reader(cand_in))?;
    if (a.n_ctx, a.n_vocab, a.n_chunk) != (b.n_ctx, b.n_vocab, b.n_chunk) || a.tokens != b.tokens {
        return Err(Error::mismatch(
            spec.candidate,
            None,
            format!(
                "llama.cpp tokenized or cut the text differently for the candidate (n_ctx {}, n_vocab {}, {} chunks) than for the reference (n_ctx {}, n_vocab {}, {} chunks), or to other tokens: not the same vocabulary",
                b.n_ctx, b.n_vocab, b.n_chunk, a.n_ctx, a.n_vocab, a.n_chunk
            ),
        ));
    }
    let gate_writer =
        gate_out.map(|g| std::io::BufWriter::with_capacity(1 << 20, Progressing::new(g, watch)));
    Ok((a, b, gate_writer))
}

/// Raises a named pipe's buffer from Linux's 64 KiB to 1 MiB (the most an unprivileged process
/// may ask for, `/proc/sys/fs/pipe-max-size`'s default): llama-perplexity writes
/// a chunk's rows (megabytes) in one call, and each 64 KiB moved would wake both sides. Best
/// effort: a pipe left at its size only moves in smaller steps.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn widen_pipe(f: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl(2) with F_SETPIPE_SZ reads no memory of ours; the descriptor is open.
    unsafe {
        libc::fcntl(f.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20);
    }
}

#[cfg(not(target_os = "linux"))]
fn widen_pipe(_: &std::fs::File) {}

/// What scoring a pair run's rows adds up: llama.cpp's statistics, the rows, and the clamped
/// candidate tokens with the reference's mass on clamped entries.
struct RowTally {
    acc: CompatAccumulator,
    rows: u64,
    clamped: u64,
    clamped_mass: f64,
}

/// Scores both base streams' rows to their end, as their threads read them, and hands each
/// pair to `row`, counting chunks with `progress`.
fn score_rows(
    pair: &mut streams::PairStreams,
    head: &StreamHead,
    row: &mut RowSink,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<RowTally> {
    let per_chunk = u64::from(head.n_ctx - 1 - head.n_ctx / 2);
    let total_chunks = head.n_chunk as usize;
    let mut acc = CompatAccumulator::new();
    let mut r = 0u64;
    let mut clamped = 0u64;
    let mut clamped_mass = 0f64;
    progress(0, total_chunks);
    // Each batch's rows are scored on every worker thread while the streams' threads read the
    // next batches; its rows then reach the accumulator and `row` in order, so the result is
    // the same as one row at a time.
    let width = head.n_vocab as usize;
    let token_of = |at: u64| {
        let (chunk, j) = (at / per_chunk, u64::from(head.n_ctx / 2) + at % per_chunk);
        head.tokens[(chunk * u64::from(head.n_ctx) + j + 1) as usize]
    };
    while let Some(batch) = pair.next()? {
        let n = batch.len();
        let (rows_a, rows_b) = (&batch.a.rows[..n], &batch.b.rows[..n]);
        let scored: Vec<ScoredRow> = {
            use rayon::prelude::*;
            rows_a
                .par_iter()
                .zip(rows_b)
                .enumerate()
                .map_init(
                    || vec![0f32; width],
                    |buf, (i, (ra, rb))| score_pair(ra, rb, token_of(r + i as u64), buf),
                )
                .collect()
        };
        for ((ra, rb), s) in rows_a.iter().zip(rows_b).zip(&scored) {
            acc.push_score(s.score);
            clamped += u64::from(s.clamped);
            clamped_mass += s.clamped_mass;
            row(ra, rb, s, r, token_of(r))?;
            r += 1;
            if r.is_multiple_of(per_chunk) {
                progress((r / per_chunk) as usize, total_chunks);
            }
        }
        pair.recycle(batch);
    }
    Ok(RowTally {
        acc,
        rows: r,
        clamped,
        clamped_mass,
    })
}

/// A pair run once its rows are read: llama.cpp's statistics, the processes waited for, the
/// gate's printout checked, and what each model's log says about where it ran.
fn pair_result(
    spec: &PairSpec,
    a: &mut StreamHead,
    tally: RowTally,
    children: &mut Children,
    watch: &Watch,
    seconds: f64,
) -> Result<(PairRun, Vec<(String, String)>)> {
    let binary = spec.binary;
    let n = tally.acc.count();
    let compat = tally.acc.finish().ok_or_else(|| {
        Error::usage(
            spec.text,
            format!(
                "llama.cpp scored {n} rows; its statistics need {} (a longer text, or a shorter context)",
                crate::kld::llamacpp::MIN_ROWS
            ),
        )
    })?;
    let logs = wait_all(children, watch, binary)?;
    let log_of = |name: &str| {
        logs.iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| l.clone())
            .unwrap_or_default()
    };
    let printed = spec.gate.then(|| printed_of(&log_of("gate"), a.n_chunk));
    if printed.as_ref().is_some_and(|p| p.stats.kld_mean.is_none()) {
        return Err(Error::runner(
            binary,
            format!(
                "llama.cpp's own KLD pass (the printout gate) printed no line for chunk {} of its table; its log ends:\n{}",
                a.n_chunk,
                tail(&log_of("gate"), 8)
            ),
        ));
    }
    Ok((
        PairRun {
            n_ctx: a.n_ctx,
            n_vocab: a.n_vocab,
            n_chunk: a.n_chunk,
            tokens: std::mem::take(&mut a.tokens),
            compat,
            clamped_candidate_tokens: tally.clamped,
            clamped_reference_mass: tally.clamped_mass,
            printed,
            reference_observed: observe(&log_of("reference")),
            candidate_observed: observe(&log_of("candidate")),
            logs: Vec::new(),
            seconds,
        },
        logs,
    ))
}

/// One model's base stream alone, `chunks` chunks of it: each row to `row` (the row, its
/// index). The reference run a second time for the self-compare gate.
#[allow(clippy::too_many_arguments)]
pub fn run_single(
    binary: &Path,
    model: &Path,
    text: &Path,
    n_ctx: usize,
    chunks: Option<u32>,
    settings: &LlamacppSettings,
    row: &mut dyn FnMut(&BaseRow, u64) -> Result<()>,
) -> Result<u64> {
    let stall = child::timeout_from_env(STALL_TIMEOUT_VAR, STALL_TIMEOUT)?;
    let dir = run_dir()?;
    let pipe = make_pipe(dir.path(), "single.pipe")?;
    let watch = Watch::new();
    let launch = Launch {
        model,
        text: Some(text),
        base: &pipe,
        kld: false,
        n_ctx,
        chunks,
        settings,
    };
    let mut children: Children = vec![(
        "reference (again)",
        spawn(&watch, binary, "reference (again)", &launch)?,
    )];
    let stalled = watch
        .stall_timeout(stall, stall_message(stall))
        .map_err(|e| Error::runner(binary, format!("cannot watch the run: {e}")))?;
    let result = (|| -> Result<(u64, Vec<(String, String)>)> {
        let input = open_pipe(&pipe, false, &mut children, 0, &watch, binary)?;
        let mut s = crate::kld::llamacpp::BaseStream::open(
            &pipe,
            std::io::BufReader::with_capacity(1 << 20, Progressing::new(input, &watch)),
        )?;
        let mut r = 0u64;
        let mut buf = BaseRow::default();
        while s.rows.next_row(&mut buf)? {
            row(&buf, r)?;
            r += 1;
        }
        Ok((r, wait_all(&mut children, &watch, binary)?))
    })();
    drop(stalled);
    finish_run(result, &mut children, &watch, binary).map(|(n, _)| n)
}

/// A run's result, or its error with what each process said last (every process stopped). When
/// the watch stopped the run (a stall, a flood), that is the error: the broken stream it left
/// behind is only its consequence.
fn finish_run<T>(
    result: Result<T>,
    children: &mut Children,
    watch: &Watch,
    binary: &Path,
) -> Result<T> {
    let e = match result {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    // A process that is failing by itself (a text too short for its window) prints its reason
    // through llama.cpp's asynchronous log as it exits, after its stream has ended: it is given
    // a moment to finish before the group is killed. A run the watch stopped (a stall, a
    // flood) is killed at once.
    if watch.failure().is_none() {
        let mut until = Instant::now() + EXIT_GRACE;
        loop {
            let running = children
                .iter_mut()
                .map(|(_, c)| c.exited().is_none())
                .filter(|&still| still)
                .count();
            if running == 0 || Instant::now() >= until {
                break;
            }
            if running < children.len() {
                until = until.min(Instant::now() + EXIT_FOLLOW);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for (_, child) in children.iter_mut() {
        child.kill();
    }
    let mut said = String::new();
    for (role, child) in children.iter_mut() {
        let output = child.output();
        // Its one error line may lie far above the last lines (the teardown prints more): the
        // text is too short for its window (llama-perplexity needs two windows' tokens).
        if let Some(line) = output.lines().find(|l| l.contains("you need at least")) {
            said.push_str(&format!(
                "
  {role}: {}",
                line.trim()
            ));
            continue;
        }
        let t = tail(&output, 6);
        if !t.trim().is_empty() {
            said.push_str(&format!("\n  {role}: {}", t.trim().replace('\n', "\n    ")));
        }
    }
    let what = match watch.failure() {
        Some(why) => why,
        None if e.file == binary => e.message(),
        None => e.to_string(),
    };
    if said.is_empty() && watch.failure().is_none() {
        Err(e)
    } else if said.is_empty() {
        Err(Error::runner(binary, what))
    } else {
        Err(Error::runner(
            binary,
            format!("{what}; llama-perplexity said:{said}"),
        ))
    }
}

fn gate_error(e: &std::io::Error) -> Error {
    Error::runner(
        Path::new("llama-perplexity --kl-divergence"),
        format!("its base stream broke while cardproof forwarded it: {e}"),
    )
}

/// The last `n` lines of `text`, each cut at 300 characters: a log of one endless line does not
/// become an endless message.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| clip(l, 300))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` cut at `chars` characters, marked when cut.
fn clip(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Opens `pipe` for reading (or writing) once its process, `children[owner]`, opens the other
/// end. The open blocks, so it runs on a thread while this one watches: if the owner exits
/// first (whatever its status), another process fails, or the watch stops the run, cardproof
/// opens the other end itself to release the thread and reports why.
fn open_pipe(
    pipe: &Path,
    write: bool,
    children: &mut Children,
    owner: usize,
    watch: &Watch,
    binary: &Path,
) -> Result<std::fs::File> {
    let (tx, rx) = mpsc::channel();
    let path = pipe.to_owned();
    std::thread::spawn(move || {
        let f = if write {
            std::fs::OpenOptions::new().write(true).open(&path)
        } else {
            std::fs::File::open(&path)
        };
        let _ = tx.send(f);
    });
    loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(f) => return f.map_err(|e| Error::io(pipe, e)),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Error::internal(pipe, "the pipe's opener stopped"));
            }
        }
        let mut why = watch.failure();
        let mut owner_ended_well = false;
        for (i, (_, child)) in children.iter_mut().enumerate() {
            let Some(status) = child.exited() else {
                continue;
            };
            if why.is_none() && (i == owner || !status.success()) {
                owner_ended_well = status.success();
                why = Some(format!(
                    "{} exited ({status}) before opening its stream",
                    child.name()
                ));
            }
        }
        let Some(why) = why else { continue };
        // A stream that fits in the pipe's buffer can be written whole, and its writer gone,
        // before this thread sees the open: it is then read, not refused.
        if owner_ended_well && let Ok(Ok(f)) = rx.recv_timeout(Duration::from_millis(200)) {
            return Ok(f);
        }
        release(pipe, write);
        return Err(Error::runner(binary, why));
    }
}

/// Opens the other end of `pipe` without blocking, so a thread blocked opening it returns.
fn release(pipe: &Path, write: bool) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    // The blocked thread reads, so open for writing (a reader is waiting: it succeeds), and
    // the other way round.
    let _ = if write { o.read(true) } else { o.write(true) }.open(pipe);
}

/// Waits for every process (the watch may stop them); each must exit 0. Returns each one's
/// whole log.
fn wait_all(
    children: &mut Children,
    watch: &Watch,
    binary: &Path,
) -> Result<Vec<(String, String)>> {
    let mut logs = Vec::new();
    for (role, child) in children.iter_mut() {
        let status = watch
            .wait(child, None)
            .map_err(|why| Error::runner(binary, why))?;
        let text = child.output();
        if !status.success() {
            return Err(Error::runner(
                binary,
                format!("{} exited with {status}: {}", child.name(), tail(&text, 8)),
            ));
        }
        logs.push(((*role).to_owned(), text));
    }
    Ok(logs)
}

/// What llama.cpp's KLD pass printed, and where it was read.
#[derive(Debug, Clone)]
pub struct Printed {
    pub stats: PrintedStats,
    /// Which printed line the numbers come from.
    pub source: &'static str,
    /// Half a unit of the printed mean KLD's last digit.
    pub half_unit: f64,
}

/// Padding chunks after the real ones in the gate's stream. llama.cpp's logger is a worker
/// thread the program does not join at exit (common/log.cpp: "logs may be lost if not flushed
/// before the program exits", llama.cpp issue 22142): on a busy machine the lines printed last,
/// the statistics block and the final chunks' lines, are sometimes never written. So the gate's
/// stream carries the reference's chunks and then enough copies of its last row to make
/// llama.cpp start one more batch (of `n_seq = max(1, n_batch / n_ctx)` chunks) after the
/// batch holding the last real chunk: the running line printed for that chunk, the mean KLD
/// and same-top rate of every real row, is then written while llama.cpp still computes a
/// forward pass.
pub fn gate_padding(n_chunk: u32, n_ctx: u32, batch: Option<u32>) -> u32 {
    let n_seq = (batch.unwrap_or(2048) / n_ctx.max(1)).max(1);
    let last_batch = n_chunk.saturating_sub(1) / n_seq;
    (last_batch + 1) * n_seq + 1 - n_chunk
}

/// A base stream's header for `n_chunk + pad` chunks: the tokens, then the last chunk's tokens
/// again for each padding chunk.
fn padded_head(tokens: &[i32], n_ctx: u32, n_vocab: u32, n_chunk: u32, pad: u32) -> Vec<u8> {
    let mut head = Vec::with_capacity(20 + 4 * (tokens.len() + (pad * n_ctx) as usize));
    head.extend_from_slice(crate::kld::llamacpp::MAGIC);
    for v in [n_ctx, n_vocab, n_chunk + pad] {
        head.extend_from_slice(&v.to_le_bytes());
    }
    let last = &tokens[tokens.len().saturating_sub(n_ctx as usize)..];
    for t in tokens.iter().chain((0..pad).flat_map(|_| last.iter())) {
        head.extend_from_slice(&t.to_le_bytes());
    }
    head
}

/// The KLD pass's printout for the real rows: the running line of chunk `n_chunk` in its table
/// (`43  4.0349 ± 0.0939  0.12852 ± 0.00450  0.08710 ± 0.00154  9.959 ± 0.204 %  86.816 ±
/// 0.458 %`: PPL(Q), ln(PPL(Q)/PPL(base)), mean KLD, RMS Δp, same top p, each ± its error).
/// The statistics block after it covers the padding chunks too and is not read.
pub fn printed_of(log: &str, n_chunk: u32) -> Printed {
    let mut stats = PrintedStats::default();
    for line in log.lines().rev() {
        let mut fields = line.split_whitespace();
        if fields.next().and_then(|c| c.parse::<u32>().ok()) != Some(n_chunk) {
            continue;
        }
        let numbers: Vec<f64> = fields
            .filter(|f| *f != "±" && *f != "%")
            .map_while(|f| f.parse::<f64>().ok())
            .collect();
        if numbers.len() == 10 {
            stats.ppl_q = Some((numbers[0], numbers[1]));
            stats.ln_ratio = Some((numbers[2], numbers[3]));
            stats.kld_mean = Some((numbers[4], numbers[5]));
            stats.same_top = Some((numbers[8] / 100.0, numbers[9] / 100.0));
            break;
        }
    }
    Printed {
        stats,
        source: "the running line of the last chunk",
        half_unit: 5e-6,
    }
}

/// The printout gate's numbers: llama.cpp's printout beside cardproof's reduction of the same
/// rows, and what the gate allowed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PrintoutGate {
    /// Which printed line the numbers come from.
    pub source: String,
    pub rows: u64,
    pub printed_kld_mean: f64,
    /// The ± llama.cpp printed beside it: the standard error of the mean over its rows.
    #[serde(default)]
    pub printed_kld_mean_se: f64,
    pub cardproof_kld_mean: f64,
    /// The largest difference of mean KLD the gate allows either way: the candidate's uint16
    /// rounding (six standard deviations of its mean) and half a unit of the printed digit.
    pub allowed: f64,
    /// The reference's probability per row, on average, on entries llama.cpp's KL counts where
    /// the candidate's stored row is at its floor: those terms read low in cardproof's reduction.
    #[serde(default)]
    pub clamped_reference_mass: f64,
    /// How much further below the printout cardproof's mean KLD may lie: `clamped_reference_mass`
    /// times [`CLAMP_DEPTH`] nats.
    #[serde(default)]
    pub clamp_allowance: f64,
    pub printed_ppl_q: f64,
    /// A lower bound of llama.cpp's where `clamped_candidate_tokens` is not 0.
    pub cardproof_ppl_q: f64,
    /// Rows whose true token lay below the candidate's stored 16-nat window (their NLL reads as
    /// the floor).
    pub clamped_candidate_tokens: u64,
    pub printed_same_top: f64,
    pub cardproof_same_top: f64,
}

/// How far below the candidate's floor a clamped entry is taken to lie, in nats: the clamp
/// allowance is this times the reference's probability on clamped entries. (Measured on the real
/// model, runners/llamacpp/real_model.sh: see docs/DESIGN.md, "The printout gate".)
pub const CLAMP_DEPTH: f64 = 16.0;

/// The printout gate: llama.cpp's printout against cardproof's llama.cpp-compatible reduction of
/// the same rows. The candidate's rows reach cardproof as uint16 codes while llama.cpp's pass
/// uses its full-precision logits, which the streams lose two ways:
///
/// - rounding: at most `scale/2 <= 1.22e-4` nats per log-prob, so each row's KL and NLL differ
///   by at most 1.22e-4 and their means by a sum of independent roundings (sd <=
///   1.22e-4/√(3n)): six of those standard deviations plus half a unit of the printed last
///   digit, either way (`allowed`);
/// - the clamp: an entry 16 nats or more below the candidate's top is stored at the floor, so
///   its KL term reads low by `p·(floor − log q)`, never high. From the rows themselves: the
///   reference's probability on such entries, times [`CLAMP_DEPTH`] nats, is how much further
///   below the printout cardproof's mean may lie (`clamp_allowance`), never above it.
///
/// Top-1 agreement may differ where the candidate's two best entries round to one code: one row
/// in a thousand, plus the half-unit.
pub fn gate(
    compat: &CompatStats,
    p: &Printed,
    clamped: u64,
    clamped_mass: f64,
) -> std::result::Result<PrintoutGate, String> {
    const STEP: f64 = 1.22e-4;
    let printed = &p.stats;
    let n = compat.n.max(1) as f64;
    let spread = 6.0 * STEP / (3.0 * n).sqrt();
    let (Some((kld, kld_se)), Some((ppl_q, _)), Some((top, _))) =
        (printed.kld_mean, printed.ppl_q, printed.same_top)
    else {
        return Err(format!(
            "llama.cpp's printout ({}) lacks its mean KLD, PPL(Q) or same-top value",
            p.source
        ));
    };
    let allowed = spread + p.half_unit;
    let clamped_reference_mass = clamped_mass / n;
    let clamp_allowance = CLAMP_DEPTH * clamped_reference_mass;
    let d = compat.kld_mean.0 - kld;
    if d > allowed || d < -(allowed + clamp_allowance) || !d.is_finite() {
        return Err(format!(
            "mean KLD: llama.cpp printed {kld}, cardproof's reduction of the same rows gives {:.7} (difference {d:+.2e}, allowed +{allowed:.1e} / -{:.1e}: rounding, and {clamped_reference_mass:.1e} of the reference's probability per row on entries the candidate's window clamps)",
            compat.kld_mean.0,
            allowed + clamp_allowance
        ));
    }
    // PPL(Q) is printed with 4 decimals. Where the candidate's true token fell below its stored
    // window on some rows, cardproof's PPL(Q) is a lower bound of llama.cpp's: it may be
    // smaller, never larger.
    let d = compat.ppl_q.0 - ppl_q;
    let tol = 5e-5 + compat.ppl_q.0 * spread;
    let off = if clamped > 0 { d > tol } else { d.abs() > tol };
    if off || !d.is_finite() {
        return Err(format!(
            "PPL(Q): llama.cpp printed {ppl_q}, cardproof's reduction gives {:.5} (allowed {}{tol:.1e}{})",
            compat.ppl_q.0,
            if clamped > 0 { "at most +" } else { "±" },
            if clamped > 0 {
                format!(", {clamped} rows' candidate NLL at the window's floor")
            } else {
                String::new()
            }
        ));
    }
    // Same top p is printed with 3 decimals of a percentage. On a row whose candidate maximum
    // is tied in the stored row, llama.cpp's full-precision argmax may be the other entry: each
    // such row may move the share by one row.
    let d = compat.same_top.0 - top;
    let tied = compat.top_tied as f64 / n;
    if d.abs() > 1e-3 + 5e-6 + tied || !d.is_finite() {
        return Err(format!(
            "same top p: llama.cpp printed {:.3} %, cardproof's reduction gives {:.3} % (allowed ±{:.3} %, {} rows' candidate maximum tied in its stored row)",
            100.0 * top,
            100.0 * compat.same_top.0,
            100.0 * (1e-3 + 5e-6 + tied),
            compat.top_tied
        ));
    }
    Ok(PrintoutGate {
        source: p.source.into(),
        rows: compat.n,
        printed_kld_mean: kld,
        printed_kld_mean_se: kld_se,
        cardproof_kld_mean: compat.kld_mean.0,
        allowed,
        clamped_reference_mass,
        clamp_allowance,
        printed_ppl_q: ppl_q,
        cardproof_ppl_q: compat.ppl_q.0,
        clamped_candidate_tokens: clamped,
        printed_same_top: top,
        cardproof_same_top: compat.same_top.0,
    })
}

/// How a measurement ran in llama.cpp: the binary, each side's flags and what its log says it
/// did, the window and chunks, and the printout gate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LlamacppRecord {
    pub build: LlamacppBuild,
    pub reference_settings: LlamacppSettings,
    pub candidate_settings: LlamacppSettings,
    pub reference: LlamacppObserved,
    pub candidate: LlamacppObserved,
    /// `-c`.
    pub n_ctx: u32,
    /// Chunks scored (every whole window of the text; `--chunks` is not set).
    pub chunks: u32,
    /// `--ppl-stride` (0: llama.cpp's non-overlapping windows; the only mode its base streams
    /// support).
    pub ppl_stride: u32,
    /// `null` when the gate was skipped (`--llamacpp-no-gate`).
    pub gate: Option<PrintoutGate>,
    /// Seconds from the processes' start to the last row.
    pub seconds: f64,
    /// Not rerun: llama.cpp's own printout, imported from this log (`card --from-llamacpp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_from: Option<String>,
    /// Variables of cardproof's environment that llama.cpp reads as settings and the processes
    /// inherited (`LLAMA_ARG_*`, llama.cpp's argument defaults; `GGML_*`), recorded because they
    /// change the lane behind the flags cardproof passes ([`inherited_settings`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub inherited_environment: std::collections::BTreeMap<String, String>,
    /// How the generated turns ran (`--turns`): llama.cpp's own server, each model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<crate::runner::llamacpp_server::LlamacppTurnsRecord>,
}

/// The variables of this process's environment that llama.cpp reads as settings: `LLAMA_ARG_*`
/// (the default of each command-line argument: `LLAMA_ARG_REPACK=0` is `--no-repack`) and
/// `GGML_*`. The processes inherit them, so they are part of the lane and recorded.
pub fn inherited_settings() -> std::collections::BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("LLAMA_ARG_") || k.starts_with("GGML_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kld::llamacpp::encode_row;

    /// Reference and candidate logits over 64 entries for `rows` rows: the candidate is the
    /// reference slightly moved, and on every fourth row drops entries the reference gives
    /// e^-6..e^-9 to `depth` nats below its top (past its stored 16-nat window). Returns
    /// llama.cpp's own statistics (the candidate's full logits), cardproof's reduction of the
    /// stored rows, and the clamped reference mass summed over the rows.
    fn clamped_run(rows: usize, depth: f32) -> (CompatStats, CompatStats, f64) {
        let (mut truth, mut stream, mut mass) =
            (CompatAccumulator::new(), CompatAccumulator::new(), 0f64);
        for r in 0..rows {
            let reference: Vec<f32> = (0..64)
                .map(|i| {
                    if i == 0 {
                        4.0
                    } else {
                        -((i % 9) as f32) - 0.37 * (r % 5) as f32
                    }
                })
                .collect();
            let mut candidate: Vec<f32> = reference
                .iter()
                .enumerate()
                .map(|(i, l)| l + 0.01 * ((i * 7 + r) % 11) as f32 - 0.05)
                .collect();
            if r % 4 == 0 {
                for i in [6, 7, 8] {
                    candidate[i] = candidate[0] - depth;
                }
            }
            let ref_row = encode_row(&reference);
            let cand_row = encode_row(&candidate);
            truth.push(&ref_row, &candidate, 0);
            stream.push_score(score_row_log_probs(&ref_row, &cand_row.decode(), 0));
            mass += clamped_reference_mass(&ref_row, &cand_row);
        }
        (truth.finish().unwrap(), stream.finish().unwrap(), mass)
    }

    fn printed_of_stats(s: &CompatStats, kld_scale: f64) -> Printed {
        Printed {
            stats: PrintedStats {
                ppl_q: Some((s.ppl_q.0, s.ppl_q.1)),
                kld_mean: Some((s.kld_mean.0 * kld_scale, s.kld_mean.1)),
                same_top: Some((s.same_top.0, s.same_top.1)),
                ..PrintedStats::default()
            },
            source: "test",
            half_unit: 5e-6,
        }
    }

    #[test]
    fn the_gate_allows_the_windows_clamp_below_the_printout_and_nothing_above_it() {
        let (truth, stream, mass) = clamped_run(400, 24.0);
        assert!(mass > 0.0);
        let bias = truth.kld_mean.0 - stream.kld_mean.0;
        // The clamp reads every clamped term low: far more than the rounding allows.
        let rounding = 6.0 * 1.22e-4 / (3.0 * stream.n as f64).sqrt() + 5e-6;
        assert!(bias > rounding, "bias {bias} vs rounding {rounding}");
        // Honest both ways: llama.cpp's own printout passes ...
        let g = gate(&stream, &printed_of_stats(&truth, 1.0), 0, mass).unwrap();
        assert!(g.clamp_allowance >= bias - g.allowed, "{g:?}");
        assert!((g.clamped_reference_mass - mass / stream.n as f64).abs() < 1e-15);
        // ... a printout raised past the clamp's allowance, or lowered past the rounding's,
        // does not.
        let high = (stream.kld_mean.0 + 2.0 * (g.allowed + g.clamp_allowance)) / truth.kld_mean.0;
        let e = gate(&stream, &printed_of_stats(&truth, high), 0, mass).unwrap_err();
        assert!(e.contains("mean KLD") && e.contains("clamps"), "{e}");
        let low = (stream.kld_mean.0 - 3.0 * g.allowed) / truth.kld_mean.0;
        assert!(gate(&stream, &printed_of_stats(&truth, low), 0, mass).is_err());
    }

    #[test]
    fn a_candidate_top_tied_in_its_stored_row_allows_that_row_in_same_top() {
        // Two candidate entries 1e-6 apart share a uint16 code: read back they tie, and the first
        // index wins, while llama.cpp's full-precision argmax takes the second. Rows where the
        // reference's top is the second entry then count as the same top for llama.cpp only.
        let (mut truth, mut stream) = (CompatAccumulator::new(), CompatAccumulator::new());
        for r in 0..400 {
            let mut reference: Vec<f32> = (0..64).map(|i| -((i % 9) as f32) - 1.0).collect();
            reference[1] = 3.0;
            let mut candidate = reference.clone();
            let tied = r % 50 == 0;
            if tied {
                candidate[0] = 3.0;
                candidate[1] = 3.0 + 1e-6;
            }
            let (ref_row, cand_row) = (encode_row(&reference), encode_row(&candidate));
            truth.push(&ref_row, &candidate, 1);
            let s = score_row_log_probs(&ref_row, &cand_row.decode(), 1);
            assert_eq!(s.top_tied, tied, "row {r}");
            stream.push_score(s);
        }
        let (truth, stream) = (truth.finish().unwrap(), stream.finish().unwrap());
        assert_eq!(stream.top_tied, 8);
        assert!(
            truth.same_top.0 - stream.same_top.0 > 1e-3 + 5e-6,
            "{} vs {}",
            truth.same_top.0,
            stream.same_top.0
        );
        // llama.cpp's printout passes with the tied rows allowed ...
        assert!(gate(&stream, &printed_of_stats(&truth, 1.0), 0, 0.0).is_ok());
        // ... and a printout off by more than those rows does not.
        let mut off = printed_of_stats(&truth, 1.0);
        off.stats.same_top = Some((truth.same_top.0 + 9.0 / 400.0, truth.same_top.1));
        let e = gate(&stream, &off, 0, 0.0).unwrap_err();
        assert!(e.contains("same top p") && e.contains("8 rows"), "{e}");
    }

    #[test]
    fn without_clamped_entries_the_gate_is_symmetric() {
        let (truth, stream, mass) = clamped_run(400, 10.0);
        assert_eq!(mass, 0.0);
        let g = gate(&stream, &printed_of_stats(&truth, 1.0), 0, mass).unwrap();
        assert_eq!(g.clamp_allowance, 0.0);
        assert!((truth.kld_mean.0 - stream.kld_mean.0).abs() <= g.allowed);
        let scale = 1.0 + 3.0 * g.allowed / truth.kld_mean.0;
        assert!(gate(&stream, &printed_of_stats(&truth, scale), 0, mass).is_err());
    }

    #[test]
    fn versions_of_upstream_and_source_releases_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("llama-perplexity");
        for (printed, build, commit) in [
            (
                "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64",
                Some("1"),
                Some("0c1e570"),
            ),
            (
                "version: 6590 (abcdef12)\nbuilt with cc",
                Some("6590"),
                Some("abcdef12"),
            ),
        ] {
            std::fs::write(&bin, format!("#!/bin/sh\necho '{printed}' >&2\n")).unwrap();
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            let b = build_of(&bin).unwrap();
            assert_eq!(b.build.as_deref(), build);
            assert_eq!(b.commit.as_deref(), commit);
            assert!(b.compiler.is_some());
        }
    }

    #[test]
    fn the_device_and_the_numerics_come_from_the_log() {
        let cuda = "ggml_cuda_init: found 1 CUDA devices:\n  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes\nload_tensors: offloaded 37/37 layers to GPU";
        let d = observe(cuda);
        assert_eq!(
            (d.backend.as_str(), d.device.as_str()),
            ("cuda", "NVIDIA H200")
        );
        assert_eq!(
            observe("load_tensors: CPU_Mapped model buffer").backend,
            "cpu"
        );
        // As llama-perplexity b0c1e570 prints them at -lv 4.
        let cpu = "0.00.012.890 I llama_context: n_batch               = 2048\n0.00.012.890 I llama_context: n_ubatch              = 512\n0.00.012.890 I llama_context: flash_attn            = auto\n0.00.015.059 I llama_kv_cache: size =    4.00 MiB (   256 cells,   4 layers,  8/8 seqs), K (q8_0):    2.00 MiB, V (f16):    2.00 MiB\n0.00.015.076 I llama_kv_cache: attn_rot_k = 1, n_embd_head_k_all = 64\n0.00.015.077 I llama_kv_cache: attn_rot_v = 0, n_embd_head_k_all = 64\n0.00.015.709 I resolve_fused_ops: Flash Attention enabled\n0.00.011.285 I print_info: file type   = Q4_0";
        let d = observe(cpu);
        assert_eq!(d.flash_attn.as_deref(), Some("enabled"));
        assert_eq!(
            (d.cache_type_k.as_deref(), d.cache_type_v.as_deref()),
            (Some("q8_0"), Some("f16"))
        );
        assert_eq!((d.rotation_k, d.rotation_v), (Some(true), Some(false)));
        assert_eq!((d.n_batch, d.n_ubatch), (Some(2048), Some(512)));
        assert_eq!(d.file_type.as_deref(), Some("Q4_0"));
    }

    #[test]
    fn the_gate_stream_always_starts_one_more_batch_after_the_last_real_chunk() {
        // 43 chunks of 256 at n_batch 2048: batches of 8, the last real one is chunks 41..43 of
        // batch [40, 48); 6 padding chunks make batch [48, 49) start after it.
        assert_eq!(gate_padding(43, 256, None), 6);
        for (n_chunk, n_ctx, batch) in [
            (1, 256, None),
            (8, 256, None),
            (9, 256, None),
            (5, 4096, None),
            (7, 512, Some(1024)),
        ] {
            let pad = gate_padding(n_chunk, n_ctx, batch);
            let n_seq = (batch.unwrap_or(2048) / n_ctx).max(1);
            let last_batch = (n_chunk - 1) / n_seq;
            assert!(
                n_chunk + pad > (last_batch + 1) * n_seq,
                "{n_chunk} {n_ctx} {batch:?}"
            );
            assert!(pad <= n_seq, "at most one batch of padding");
        }
        let head = padded_head(&[1, 2, 3, 4, 5, 6], 3, 10, 2, 1);
        assert_eq!(head.len(), 20 + 4 * 9);
        assert_eq!(&head[16..20], &3u32.to_le_bytes());
        assert_eq!(&head[20 + 4 * 6..], &[4, 0, 0, 0, 5, 0, 0, 0, 6, 0, 0, 0]);
    }

    #[test]
    fn the_running_line_of_the_last_chunk_is_read() {
        let log = "  42       4.0549 ±    0.0958       0.12843 ±    0.00458       0.08750 ±    0.00157     9.994 ±  0.207 %    86.783 ±  0.464 %\n  43       4.0349 ±    0.0939       0.12852 ±    0.00450       0.08710 ±    0.00154     9.959 ±  0.204 %    86.816 ±  0.458 %\n  44       4.1 ±    0.09       0.1 ±    0.004       0.09 ±    0.001     9.9 ±  0.2 %    86.0 ±  0.4 %";
        let p = printed_of(log, 43);
        assert_eq!(p.stats.kld_mean, Some((0.0871, 0.00154)));
        assert_eq!(p.stats.ppl_q, Some((4.0349, 0.0939)));
        assert_eq!(p.stats.same_top, Some((0.86816, 0.00458)));
        assert!(printed_of(log, 45).stats.kld_mean.is_none());
    }

    #[test]
    fn settings_are_checked_and_spelled_as_llama_cpp_takes_them() {
        let s = LlamacppSettings {
            threads: Some(2),
            cache_type_k: Some("q8_0".into()),
            flash_attn: Some("on".into()),
            ..Default::default()
        };
        assert!(s.check().is_ok());
        assert_eq!(s.args(), ["-t", "2", "-fa", "on", "-ctk", "q8_0"]);
        let bad = LlamacppSettings {
            cache_type_v: Some("q3_k".into()),
            ..Default::default()
        };
        assert!(bad.check().unwrap_err().contains("-ctv q3_k"));
        let zero = LlamacppSettings {
            ubatch: Some(0),
            ..Default::default()
        };
        assert!(zero.check().unwrap_err().contains("-ub 0"));
    }
}
