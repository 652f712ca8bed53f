//! The KLD measurement: per-row records from reference and candidate logits, and the statistics
//! every runner and verdict relies on. Definitions (also in every JSON output under
//! `definitions`):
//!
//! - row j of a window predicts token j+1; KL per row in nats, forward = KL(P_ref || P_cand),
//!   reverse = KL(P_cand || P_ref), over the vocabulary mode's terms;
//! - `kld_mean` is the mean over scored rows; percentiles interpolate linearly at q·(n-1);
//! - `top1_agreement` is the fraction of rows whose first-index argmax agree;
//! - `ppl_*` = exp(mean NLL of the true next token), `ppl_ratio` = ppl_cand / ppl_ref;
//! - `delta_p_rms` = sqrt(mean (p_cand(t) - p_ref(t))²) for the true next token t.

pub mod compat;
pub mod kernel;
pub mod llamacpp;
pub mod protocol;
pub mod row;
mod simd;
pub mod source;
pub mod stats;
pub mod turns;

use std::path::Path;

use rayon::prelude::*;
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::{Error, Result};
use protocol::{Bootstrap, Direction, Positions, Protocol, VocabMode};
use source::LogitSource;
use stats::{Scored, Summary};

/// Rows of one window are one bootstrap block. With a single long window, runs of consecutive
/// scored rows are: `n / 100` rows (so there are about 100 blocks), at most this many.
pub const BOOTSTRAP_MAX_RUN: usize = 128;

/// Logit rows wider than this are refused wherever a file declares the width (a llama.cpp base
/// file's `n_vocab`, an artifact's `logit_width`): 16 times the largest vocabulary in use
/// (262,144 entries), and few enough that a row's buffers stay in megabytes.
pub const MAX_VOCAB: usize = 1 << 22;

/// What the caller asks for.
#[derive(Debug, Clone)]
pub struct Options {
    pub direction: Direction,
    pub vocab: VocabMode,
    pub positions: Positions,
    pub context_length: Option<u64>,
    /// Use only the first `vocab_size` entries (the tokenizer's vocabulary; the rest is padding).
    pub vocab_size: Option<usize>,
    pub bootstrap: Bootstrap,
}

impl Options {
    /// The settings that size loops and allocations, in range (see
    /// [`crate::rerun::MeasureOptions::check`]).
    pub fn check(&self) -> Result<()> {
        let bad = |rule: String| Error::usage(Path::new("measurement protocol"), rule);
        if let Some(l) = self.context_length {
            protocol::check_context_length(l).map_err(bad)?;
        }
        self.bootstrap.check().map_err(bad)?;
        self.positions.check().map_err(bad)?;
        self.vocab.check().map_err(bad)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct InputSummary {
    pub path: String,
    pub format: &'static str,
    pub rows: usize,
    pub vocab: usize,
}

/// A finished measurement (the JSON document `kld --json` prints, less `schema_version`).
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub n_positions: usize,
    pub n_windows: usize,
    pub n_nonfinite: usize,
    pub protocol: Value,
    pub protocol_sha256: String,
    pub metrics: std::collections::BTreeMap<String, f64>,
    pub uncertainty: std::collections::BTreeMap<String, stats::Uncertainty>,
    pub low_support: Vec<String>,
    pub diagnostics: stats::Diagnostics,
    pub reference: InputSummary,
    pub candidate: InputSummary,
    pub definitions: Value,
}

/// Written-out definitions of every statistic, carried in every output.
pub fn definitions() -> Value {
    json!({
        "row": "row j of a window of L tokens is the prediction at position j of token j+1 (0 <= j <= L-2)",
        "kld": "forward KL(P_ref || P_cand) = sum_i p_ref(i) (log p_ref(i) - log p_cand(i)), nats, per row",
        "kld_reverse": "reverse KL(P_cand || P_ref), nats, per row, over the same vocabulary terms",
        "kld_mean": "mean over scored rows",
        "percentiles": "linear interpolation at q*(n-1) over the sorted per-row values (numpy default); low_support lists those with fewer than 100 rows beyond them",
        "top1_agreement": "fraction of rows whose first-index argmax (lowest token id on ties) agree",
        "same_top_p": "llama.cpp's `Same top p`: 100 * top1_agreement, a percentage (accepted in claims; verified against top1_agreement)",
        "ppl_ref": "exp(mean NLL of the true next token under the reference, full vocabulary)",
        "ppl_cand": "exp(mean NLL of the true next token under the candidate, full vocabulary)",
        "ppl_ratio": "ppl_cand / ppl_ref",
        "delta_p_rms": "sqrt(mean (p_cand(t) - p_ref(t))^2), t the true next token, as a fraction",
        "sem": "i.i.d. per-row standard error as llama.cpp computes it",
        "ci95": "percentile interval of the block bootstrap (blocks = windows, or runs of rows in one long window) at the protocol's level"
    })
}

/// Measure `candidate` against `reference`.
pub fn measure(reference: &Path, candidate: &Path, options: &Options) -> Result<Measurement> {
    options.check()?;
    if options.positions.needs_labels() {
        return Err(Error::usage(
            reference,
            format!(
                "--positions {}: logit files say nothing of which token is whose; a role or span policy needs a conversation eval text (measure --eval-text FILE.json)",
                options.positions.spelling()
            ),
        ));
    }
    let r = LogitSource::open(reference, options.context_length)?;
    let c = LogitSource::open(candidate, options.context_length)?;
    check_pair(&r, &c)?;
    let vocab = vocab_size(&r, &c, options.vocab_size)?;

    // A llama.cpp base file holds only the second half of each window: say so in the protocol
    // rather than "all" (the rows selected are the same).
    let mut options = options.clone();
    if r.format == "llamacpp-base" && options.positions == Positions::All {
        options.positions = Positions::SecondHalf;
    }
    let options = &options;
    let windows: std::collections::BTreeSet<u32> = r.meta.iter().map(|m| m.window).collect();
    let one_window = windows.len() == 1;
    let selected: Vec<usize> = (0..r.rows)
        .filter(|&i| {
            options
                .positions
                .selects(r.meta[i].position, r.meta[i].window_len)
        })
        .collect();
    if selected.is_empty() {
        return Err(Error::usage(
            reference,
            format!(
                "the position policy {:?} selects no row of these windows",
                options.positions
            ),
        ));
    }
    let want_reverse = options.direction.reverse();
    let run = (selected.len() / 100).clamp(1, BOOTSTRAP_MAX_RUN);
    let results: Vec<Option<Scored>> = selected
        .par_iter()
        .enumerate()
        .map_init(
            || (Vec::new(), Vec::new(), row::Scratch::default()),
            |(a, b, scratch), (rank, &i)| {
                let a = &r.row(i, a)[..vocab];
                let b = &c.row(i, b)[..vocab];
                let meta = r.meta[i];
                let token = meta
                    .token
                    .or(c.meta[i].token)
                    .filter(|&t| (t as usize) < vocab);
                row::reduce(a, b, token, options.vocab, want_reverse, scratch).map(|record| {
                    Scored {
                        record,
                        block: if one_window {
                            (rank / run) as u32
                        } else {
                            meta.window
                        },
                        position: meta.position,
                        window_len: meta.window_len,
                    }
                })
            },
        )
        .collect();
    let n_nonfinite = results.iter().filter(|s| s.is_none()).count();
    let scored: Vec<Scored> = results.into_iter().flatten().collect();
    if scored.is_empty() {
        return Err(Error::format(
            reference,
            None,
            "every selected row has non-finite logits",
        ));
    }
    let protocol = Protocol {
        direction: options.direction,
        units: "nats",
        vocab: options.vocab,
        padding: if vocab < r.vocab { "excluded" } else { "none" },
        vocab_size: vocab,
        positions: options.positions,
        context_length: options.context_length,
        aggregation: "mean_over_positions",
        bootstrap: options.bootstrap,
        bootstrap_block: if one_window {
            format!("run:{run}")
        } else {
            "window".into()
        },
        top1: "first index of the maximum",
        llamacpp_compat: false,
    };
    let Summary {
        metrics,
        uncertainty,
        low_support,
        diagnostics,
    } = stats::summarize(
        &scored,
        options.direction.forward(),
        want_reverse,
        options.bootstrap.resamples,
        options.bootstrap.seed,
        options.bootstrap.level,
    );
    let windows_scored: std::collections::BTreeSet<u32> =
        selected.iter().map(|&i| r.meta[i].window).collect();
    Ok(Measurement {
        n_positions: scored.len(),
        n_windows: windows_scored.len(),
        n_nonfinite,
        protocol_sha256: protocol.sha256(),
        protocol: protocol.to_json(),
        metrics,
        uncertainty,
        low_support,
        diagnostics,
        reference: summary(&r),
        candidate: summary(&c),
        definitions: definitions(),
    })
}

fn summary(s: &LogitSource) -> InputSummary {
    InputSummary {
        path: s.path.display().to_string(),
        format: s.format,
        rows: s.rows,
        vocab: s.vocab,
    }
}

/// The two files must describe the same rows of the same token stream.
fn check_pair(r: &LogitSource, c: &LogitSource) -> Result<()> {
    if r.rows != c.rows {
        return Err(Error::mismatch(
            &c.path,
            None,
            format!(
                "has {} rows but the reference {} has {}",
                c.rows,
                r.path.display(),
                r.rows
            ),
        ));
    }
    if r.vocab != c.vocab {
        return Err(Error::mismatch(
            &c.path,
            None,
            format!(
                "vocabulary mismatch: {} entries per row, the reference {} has {}",
                c.vocab,
                r.path.display(),
                r.vocab
            ),
        ));
    }
    for (i, (a, b)) in r.meta.iter().zip(&c.meta).enumerate() {
        if a.window != b.window || a.position != b.position {
            return Err(Error::mismatch(
                &c.path,
                None,
                format!(
                    "row {i} is window {} position {}, the reference's is window {} position {}",
                    b.window, b.position, a.window, a.position
                ),
            ));
        }
        if let (Some(x), Some(y)) = (a.token, b.token)
            && x != y
        {
            return Err(Error::mismatch(
                &c.path,
                None,
                format!("token stream differs from the reference at row {i} (token {y} vs {x})"),
            ));
        }
    }
    Ok(())
}

fn vocab_size(r: &LogitSource, c: &LogitSource, requested: Option<usize>) -> Result<usize> {
    let size = requested
        .or(r.declared_vocab)
        .or(c.declared_vocab)
        .unwrap_or(r.vocab);
    if size == 0 || size > r.vocab {
        return Err(Error::usage(
            &r.path,
            format!(
                "vocabulary size {size} is outside 1..={} (the logit rows' width)",
                r.vocab
            ),
        ));
    }
    Ok(size)
}

#[cfg(test)]
mod tests;
