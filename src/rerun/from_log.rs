//! `cardproof card --from-llamacpp LOG`: what publishers already have, a `llama-perplexity
//! --kl-divergence` log, turned into a measurement document whose claims are llama.cpp's printed
//! numbers and whose runtime is llama.cpp's, so `card` writes it like any measurement. With the
//! base file's header (`--base-file`), the token stream's count and digest are known too.
//!
//! A log cannot disclose everything a claim needs: the reference checkpoint (a base file holds
//! logits, not the model), the eval text (llama.cpp reads `-f` in the base pass, not in the KLD
//! pass whose log this is), the build where the log does not print it, the BOS policy where the
//! model file is not at hand, the token stream's digest without the base file. Those stay out
//! of the block, and lint names each.
//!
//! A log is text anyone can edit: every number read from it is range-checked before it becomes
//! a claim or sizes anything (a KLD is finite and at least 0, a share of rows lies in 0 to
//! 100 %, a perplexity is at least 1, the window and chunk counts are llama.cpp's), and a number
//! out of range is an error naming the log and its line.

use std::path::Path;

use crate::error::{Error, ErrorKind, Result};
use crate::kld::llamacpp::{BaseFile, PrintedLines, PrintedStats};
use crate::kld::protocol::{Bootstrap, Bos, Direction, Positions, VocabMode};
use crate::kld::stats::{Diagnostics, Summary, Uncertainty};
use crate::rerun::document::{
    Environment, EvalRecord, Measurement, ModelRecord, Padding, RunnerKind,
};
use crate::rerun::options::MeasureOptions;
use crate::rerun::score::{RunResult, Scoring};
use crate::runner::llamacpp::{
    LlamacppBuild, LlamacppObserved, LlamacppRecord, LlamacppSettings, observe,
};
use crate::span::LineCol;

/// The largest log read (a 100k-token run's log at `-lv 4` is well under this).
const MAX_LOG_BYTES: u64 = 64 * 1024 * 1024;

/// What the block says where the log does not tell: a word lint reports as vague, item by item.
const UNKNOWN: &str = "unknown";

/// A normal 95% interval from an i.i.d. standard error: llama.cpp prints `value ± SE`.
const Z95: f64 = 1.959_963_984_540_054;

/// What the log says, read.
struct Log {
    printed: PrintedStats,
    n_ctx: u32,
    n_chunk: u32,
    /// `build: 6590 (abcdef12)` or `main: build = 6590 (abcdef12)`, where printed.
    build: Option<(String, Option<String>)>,
    /// The candidate's GGUF as the log names it.
    model: Option<String>,
    text: String,
}

fn read_log(path: &Path) -> Result<Log> {
    let bytes = crate::files::read_capped(path, MAX_LOG_BYTES, "a llama-perplexity log")?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let (printed, lines) = crate::kld::llamacpp::parse_printed_located(&text);
    if printed.kld_mean.is_none() {
        return Err(Error::format(
            path,
            None,
            "holds no `====== KL divergence statistics ======` block with a `Mean    KLD` line: give the log of a `llama-perplexity --kl-divergence` run",
        ));
    }
    check_printed(path, &text, &printed, &lines)?;
    // `kl_divergence: computing over 43 chunks, n_ctx=256, batch_size=2048, n_seq=8`
    let (mut counts, mut build, mut model) = (None, None, None);
    for (i, line) in text.lines().enumerate() {
        if let Some((_, rest)) = line.split_once("computing over ") {
            counts = Some((i + 1, rest.to_owned()));
        }
        let b = line
            .split_once("build: ")
            .or_else(|| line.split_once("build = "))
            .map(|(_, r)| r.trim());
        if let Some(b) = b.filter(|_| build.is_none()) {
            let number = b.split_whitespace().next().unwrap_or("").to_owned();
            let commit = b
                .split_once('(')
                .and_then(|(_, r)| r.split_once(')'))
                .map(|(c, _)| c.to_owned());
            if number.chars().all(|c| c.is_ascii_digit()) && !number.is_empty() {
                build = Some((number, commit));
            }
        }
        if let Some((_, rest)) = line.split_once("loaded meta data with ") {
            model = rest
                .split_once(" from ")
                .map(|(_, r)| r.split(" (version").next().unwrap_or(r).trim().to_owned());
        }
    }
    let Some((line, rest)) = counts else {
        return Err(Error::format(
            path,
            None,
            "names no `computing over N chunks, n_ctx=L` line: the window and the number of scored rows are not known (pass the whole log of the run)",
        ));
    };
    let (n_chunk, n_ctx) = counts_of(&rest).map_err(|why| at_line(path, &text, line, why))?;
    Ok(Log {
        printed,
        n_ctx,
        n_chunk,
        build,
        model,
        text,
    })
}

/// The chunk count and the window of a `computing over N chunks, n_ctx=L` line (what follows
/// `computing over `), each in llama.cpp's range: a window of 3 to 2^20 tokens (one scored
/// row at least), one chunk at least, and a stream of at most llama.cpp's largest.
fn counts_of(rest: &str) -> std::result::Result<(u32, u32), String> {
    let number = |s: Option<&str>, what: &str| {
        s.and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| format!("{what} is not a whole number"))
    };
    let n_chunk = number(rest.split_whitespace().next(), "the chunk count")?;
    let n_ctx = number(
        rest.split_once("n_ctx=")
            .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next()),
        "n_ctx",
    )?;
    crate::kld::protocol::check_context_length(n_ctx).map_err(|e| format!("n_ctx: {e}"))?;
    if n_ctx < 3 {
        return Err(format!(
            "n_ctx={n_ctx} scores no rows (llama.cpp scores the second half of each window, less its last token)"
        ));
    }
    let most = crate::kld::llamacpp::MAX_STREAM_TOKENS;
    if n_chunk == 0 || n_chunk.saturating_mul(n_ctx) > most {
        return Err(format!(
            "{n_chunk} chunks of {n_ctx} tokens: expected 1 chunk at least and at most {most} tokens in all"
        ));
    }
    Ok((n_chunk as u32, n_ctx as u32))
}

/// The range a printed statistic must lie in.
#[derive(Clone, Copy)]
enum Range {
    /// A divergence: finite, at least 0.
    Kld,
    /// A share of rows, printed as a percentage: 0 to 100 %.
    Share,
    /// A perplexity: finite, at least 1 (the exponential of a mean NLL).
    Perplexity,
    /// A ratio of perplexities: finite, over 0.
    Ratio,
}

impl Range {
    fn holds(self, v: f64) -> bool {
        match self {
            Range::Kld => v.is_finite() && v >= 0.0,
            Range::Share => (0.0..=1.0).contains(&v),
            Range::Perplexity => v.is_finite() && v >= 1.0,
            Range::Ratio => v.is_finite() && v > 0.0,
        }
    }

    fn says(self) -> &'static str {
        match self {
            Range::Kld => "a KL divergence is a finite number, at least 0",
            Range::Share => "a share of rows lies in 0 to 100 %",
            Range::Perplexity => "a perplexity is a finite number, at least 1",
            Range::Ratio => "a ratio of perplexities is a finite number over 0",
        }
    }
}

/// Every printed number the card is made of, in its range (their ± too: finite, at least 0,
/// a share's at most 100 %), and the KLD's percentiles in order (median ≤ 90 % ≤ 95 % ≤ 99 % ≤
/// 99.9 % ≤ maximum, the mean at most the maximum): else the log is refused at the line.
fn check_printed(path: &Path, text: &str, p: &PrintedStats, lines: &PrintedLines) -> Result<()> {
    let fail = |field: &str, label: &str, why: String| match lines.of(field) {
        Some(line) => at_line(path, text, line, why),
        None => Error::format(path, Some(label), why),
    };
    for (field, label, v, range) in [
        ("kld_mean", "Mean KLD", p.kld_mean, Range::Kld),
        ("same_top", "Same top p", p.same_top, Range::Share),
        ("ratio", "Mean PPL(Q)/PPL(base)", p.ratio, Range::Ratio),
        ("ppl_base", "Mean PPL(base)", p.ppl_base, Range::Perplexity),
        ("ppl_q", "Mean PPL(Q)", p.ppl_q, Range::Perplexity),
    ] {
        let Some((v, se)) = v else { continue };
        if !range.holds(v) {
            return Err(fail(field, label, range.says().into()));
        }
        let se_max = if matches!(range, Range::Share) {
            1.0
        } else {
            f64::INFINITY
        };
        if !(se.is_finite() && (0.0..=se_max).contains(&se)) {
            return Err(fail(
                field,
                label,
                "its ± (a standard error) is a finite number, at least 0".into(),
            ));
        }
    }
    let ordered = [
        ("kld_median", "Median KLD", p.kld_median),
        ("kld_p90", "90.0% KLD", p.kld_p90),
        ("kld_p95", "95.0% KLD", p.kld_p95),
        ("kld_p99", "99.0% KLD", p.kld_p99),
        ("kld_p999", "99.9% KLD", p.kld_p999),
        ("kld_max", "Maximum KLD", p.kld_max),
    ];
    let mut below: Option<(&str, f64)> = None;
    for (field, label, v) in ordered {
        let Some(v) = v else { continue };
        if !Range::Kld.holds(v) {
            return Err(fail(field, label, Range::Kld.says().into()));
        }
        if let Some((lower, at)) = below
            && v < at
        {
            return Err(fail(
                field,
                label,
                format!(
                    "{v} is below the {lower} printed before it ({at}): the percentiles are out of order"
                ),
            ));
        }
        below = Some((label, v));
    }
    if let (Some((mean, _)), Some(max)) = (p.kld_mean, p.kld_max)
        && mean > max
    {
        return Err(fail(
            "kld_mean",
            "Mean KLD",
            format!("{mean} is over the maximum KLD printed ({max})"),
        ));
    }
    Ok(())
}

/// An error at `line` of the log, quoting it.
fn at_line(path: &Path, text: &str, line: usize, why: String) -> Error {
    let shown = text.lines().nth(line.saturating_sub(1)).unwrap_or("");
    let column = 1 + shown.chars().take_while(|c| c.is_whitespace()).count();
    let shown: String = shown.trim().chars().take(200).collect();
    Error::at(
        path,
        LineCol { line, column },
        ErrorKind::Format {
            subject: None,
            rule: format!("`{shown}`: {why}"),
        },
    )
}

/// The metrics a printed block gives, as cardproof names them, with llama.cpp's standard error
/// where it prints one (it prints none for percentiles).
fn metrics(p: &PrintedStats) -> Vec<(&'static str, f64, Option<f64>)> {
    let mut out = Vec::new();
    for (name, v) in [
        ("kld_mean", p.kld_mean),
        ("top1_agreement", p.same_top),
        ("ppl_ratio", p.ratio),
        ("ppl_ref", p.ppl_base),
        ("ppl_cand", p.ppl_q),
    ] {
        if let Some((v, se)) = v {
            out.push((name, v, Some(se)));
        }
    }
    for (name, v) in [
        ("kld_p99", p.kld_p99),
        ("kld_p999", p.kld_p999),
        ("kld_p95", p.kld_p95),
        ("kld_p90", p.kld_p90),
        ("kld_median", p.kld_median),
        ("kld_max", p.kld_max),
    ] {
        if let Some(v) = v {
            out.push((name, v, None));
        }
    }
    out
}

/// The measurement document of a llama.cpp KLD log (and its base file's header).
pub fn measurement_from_log(
    log_path: &Path,
    base_file: Option<&Path>,
    candidate_dir: &Path,
    threads: usize,
) -> Result<(Measurement, Vec<String>)> {
    let log = read_log(log_path)?;
    let mut warnings = Vec::new();
    let stream = base_stream(&log, base_file, &mut warnings)?;
    let bos = log_bos(&log, candidate_dir, &mut warnings)?;
    let options = log_options(&log, bos);
    let scoring = log_scoring(&log, &options, stream);
    let observed = observe(&log.text);
    // The file the log measured, beside the card: the candidate is that file (a repository of
    // many quant files gets one entry per file), else the directory.
    let model_file = log_model_file(&log, candidate_dir);
    let measured = model_file.as_deref().unwrap_or(candidate_dir);
    let candidate_root = super::identity::root_digest(measured, threads, None)?;
    let environment = log_environment(&log, log_path, &observed, &mut warnings);
    let (reference, candidate) = log_models(measured, candidate_root, &observed);
    let mut m =
        crate::rerun::record::measurement(&scoring, &options, reference, candidate, environment);
    // llama.cpp's ± is an i.i.d. per-token standard error, not a bootstrap: the claims' 95%
    // half-widths are 1.96 of them.
    m.fidelity.protocol.aggregation.uncertainty = crate::disclosure::Uncertainty {
        method: crate::disclosure::UncertaintyMethod::IidStderr,
        level: Some(0.95),
        resamples: None,
        seed: None,
        block: None,
    };
    m.fidelity.eval.text.source = UNKNOWN.into();
    if base_file.is_none() {
        // No digest is known: the item is left out (lint names it), never written empty.
        m.fidelity.eval.tokens = None;
    }
    warnings.push("the reference checkpoint and the eval text are not in a --kl-divergence log: fill fidelity.reference and eval.text (lint names each)".into());
    Ok((m, warnings))
}

/// The token stream's digest, its count and the vocabulary, from the run's base file when one
/// is given (it must be this run's: the same chunks of the same length); without it, only the
/// count the log implies.
fn base_stream(
    log: &Log,
    base_file: Option<&Path>,
    warnings: &mut Vec<String>,
) -> Result<(String, usize, usize)> {
    Ok(match base_file {
        Some(b) => {
            let base = BaseFile::open(b)?;
            if (base.n_ctx, base.n_chunk) != (log.n_ctx, log.n_chunk) {
                return Err(Error::mismatch(
                    b,
                    None,
                    format!(
                        "holds {} chunks of {} tokens; the log's run scored {} chunks of {}: not this run's base file",
                        base.n_chunk, base.n_ctx, log.n_chunk, log.n_ctx
                    ),
                ));
            }
            let ids: Vec<u32> = base.tokens.iter().map(|&t| t as u32).collect();
            (
                crate::runner::tokens::tokens_sha256(&ids),
                ids.len(),
                base.n_vocab as usize,
            )
        }
        None => {
            warnings.push(
                "no --base-file: the token stream is not known, so the card has no eval.tokens (its count and digest); give the base file of the run to disclose them".into(),
            );
            (
                String::new(),
                (u64::from(log.n_chunk) * u64::from(log.n_ctx)) as usize,
                0,
            )
        }
    })
}

/// The BOS policy of the model the log names, read from the GGUF of that name beside the card.
/// The model the log measured: the GGUF of the file name it prints, beside the card (`--into`),
/// inside its directory. A log is data: the path it names is never followed.
fn log_model_file(log: &Log, candidate_dir: &Path) -> Option<std::path::PathBuf> {
    log.model
        .as_deref()
        .and_then(|m| Path::new(m).file_name())
        .and_then(|name| crate::files::inside_dir(candidate_dir, &name.to_string_lossy()).ok())
        .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
}

fn log_bos(log: &Log, candidate_dir: &Path, warnings: &mut Vec<String>) -> Result<Bos> {
    let model_file = log_model_file(log, candidate_dir);
    Ok(match model_file.as_deref() {
        Some(f) => {
            use crate::checkpoint::gguf::GgufValue;
            let file = crate::checkpoint::gguf::read_file(f)?;
            match file.get("tokenizer.ggml.add_bos_token") {
                Some(GgufValue::Bool(true)) => Bos::PerWindow,
                _ => Bos::None,
            }
        }
        None => {
            warnings.push(format!("the model file the log names ({}) is not beside the card in {}: eval.bos is written as `none`; check it (llama.cpp adds a BOS when the GGUF's tokenizer.ggml.add_bos_token is true)", log.model.as_deref().unwrap_or("none"), candidate_dir.display()));
            Bos::None
        }
    })
}

/// llama.cpp's protocol as a KLD pass runs it: forward KL over its threshold vocabulary, the
/// second half of each chunk.
fn log_options(log: &Log, bos: Bos) -> MeasureOptions {
    MeasureOptions {
        direction: Direction::Forward,
        vocab: VocabMode::Threshold {
            log_p: f64::from(crate::kld::llamacpp::KL_GATE),
        },
        positions: Positions::SecondHalf,
        bootstrap: Bootstrap {
            resamples: 1,
            seed: 0,
            level: 0.95,
        },
        context_lengths: vec![log.n_ctx as usize],
        bos,
        vocab_size: None,
        dump_logits: None,
        prefill_chunk: None,
    }
}

/// The printed statistics as one run's summary (no rows: a log has none).
fn log_scoring(
    log: &Log,
    options: &MeasureOptions,
    (tokens_sha256, token_count, n_vocab): (String, usize, usize),
) -> Scoring {
    let bos = options.bos;
    let values = metrics(&log.printed);
    let mut summary = Summary {
        metrics: Default::default(),
        uncertainty: Default::default(),
        low_support: Vec::new(),
        diagnostics: Diagnostics {
            by_depth: Vec::new(),
            by_confidence: Vec::new(),
        },
    };
    for (name, v, se) in values {
        summary.metrics.insert(name.into(), v);
        if let Some(se) = se {
            summary.uncertainty.insert(
                name.into(),
                Uncertainty {
                    sem: Some(se),
                    ci95: [v - Z95 * se, v + Z95 * se],
                },
            );
        }
    }
    let per_chunk = (log.n_ctx - 1 - log.n_ctx / 2) as usize;
    let run = RunResult {
        context_length: log.n_ctx as usize,
        n_windows: log.n_chunk as usize,
        dropped_tokens: 0,
        n_positions: per_chunk * log.n_chunk as usize,
        n_nonfinite: 0,
        summary,
        rows: Vec::new(),
        labels: Vec::new(),
        tokens: Vec::new(),
        spans: Vec::new(),
        bootstrap_block: "window".into(),
    };
    let mut protocol =
        crate::rerun::score::run_protocol(options, n_vocab, Padding::of(n_vocab, n_vocab, n_vocab));
    protocol.llamacpp_compat = true;
    Scoring {
        protocol,
        eval: EvalRecord {
            text_path: None,
            text_sha256: String::new(),
            text_bytes: 0,
            tokens_sha256,
            token_count,
            bos,
            conversation: None,
        },
        runs: vec![run],
        vocab_size: n_vocab,
    }
}

/// Where the log's run ran, as far as the log says: its build, backend, flash attention and
/// KV-cache types.
fn log_environment(
    log: &Log,
    log_path: &Path,
    observed: &LlamacppObserved,
    warnings: &mut Vec<String>,
) -> Environment {
    let build = LlamacppBuild {
        binary: String::new(),
        version: log
            .build
            .as_ref()
            .map_or_else(|| UNKNOWN.into(), |(b, _)| format!("version: {b}")),
        build: log.build.as_ref().map(|(b, _)| b.clone()),
        commit: log.build.as_ref().and_then(|(_, c)| c.clone()),
        compiler: None,
    };
    if log.build.is_none() {
        warnings.push("the log prints no `build:` line: runtime.engine_version is not known; write the build llama.cpp's `--version` gives".into());
    }
    let settings = LlamacppSettings::default();
    let record = LlamacppRecord {
        build: build.clone(),
        reference_settings: settings.clone(),
        candidate_settings: settings,
        reference: Default::default(),
        candidate: observed.clone(),
        n_ctx: log.n_ctx,
        chunks: log.n_chunk,
        ppl_stride: 0,
        gate: None,
        seconds: 0.0,
        imported_from: Some(log_path.display().to_string()),
        inherited_environment: Default::default(),
        turns: None,
    };
    // The CPU's model is not in a llama.cpp log (its instruction sets are: system_info).
    let device = if observed.backend == "cpu" {
        UNKNOWN.to_owned()
    } else {
        observed.device.clone()
    };
    let environment = Environment {
        runner: RunnerKind::Llamacpp,
        runner_version: env!("CARGO_PKG_VERSION").into(),
        engine: "llama.cpp".into(),
        engine_version: Some(build.engine_version()),
        torch_version: None,
        cuda_version: None,
        device,
        compute_dtype: "f32".into(),
        attention: observed
            .flash_attn
            .as_ref()
            .map_or_else(|| UNKNOWN.into(), |fa| format!("flash_attn={fa}")),
        kv_cache_dtype: Some(observed.kv_label().unwrap_or_else(|| UNKNOWN.into())),
        kv_cache: None,
        kv_scales: None,
        recurrent_state_dtype: None,
        emulate: None,
        threads: None,
        tf32: None,
        lane: format!(
            "llama.cpp's own --kl-divergence printout, imported from {} by cardproof card --from-llamacpp (not rerun)",
            log_path.display()
        ),
        tokenizer: None,
        reference_artifact: None,
        linear_attention: None,
        reference_linear_attention: None,
        transformers_runner: None,
        llamacpp: Some(record),
    };
    if observed.flash_attn.is_none() || observed.cache_type_k.is_none() {
        warnings.push("the log does not show flash attention or the KV-cache types (llama.cpp prints them at `-lv 4`): runtime.attention_backend and kv_cache_dtype say `unknown`".into());
    }
    environment
}

/// The models' records: the reference is not in a log; the candidate is the file the log
/// measured (or the directory beside the card), with the file type the log prints.
fn log_models(
    candidate_dir: &Path,
    manifest_sha256: String,
    observed: &LlamacppObserved,
) -> (ModelRecord, ModelRecord) {
    let reference = ModelRecord {
        path: String::new(),
        format: "gguf".into(),
        manifest_sha256: String::new(),
        lm_head_sha256: String::new(),
        stored_dtype: String::new(),
        runner: serde_json::Value::Null,
        hub: None,
    };
    let candidate = ModelRecord {
        path: candidate_dir.display().to_string(),
        format: "gguf".into(),
        manifest_sha256,
        lm_head_sha256: String::new(),
        stored_dtype: observed
            .file_type
            .as_deref()
            .map_or_else(String::new, str::to_ascii_lowercase),
        runner: serde_json::Value::Null,
        hub: None,
    };
    (reference, candidate)
}
