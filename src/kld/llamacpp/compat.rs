//! `llama-perplexity --kl-divergence`'s statistics, recomputed with its own arithmetic.
//!
//! Every rounding step is llama.cpp's: per-row values in f32 (the candidate's max, `lse`, NLLs,
//! Δp, each KL term), sums in f64, percentiles over the sorted f32 arrays with an f32 index, and
//! the same uncertainty formulas. Rows are summed in file order; llama.cpp's worker threads merge
//! partial sums in a racy order, so its last bits can differ from run to run (and from ours).

use rayon::prelude::*;

use super::base_file::{BaseFile, BaseRow};
use crate::error::{Error, Result};

/// llama.cpp prints its statistics only from this many scored rows.
pub const MIN_ROWS: u64 = 100;
/// Reference log-probabilities at or below this do not enter the KL sum (plain truncation).
pub const KL_GATE: f32 = -16.0;

/// One scored row, as llama.cpp computes it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RowScore {
    /// KL(reference ‖ candidate) over the reference tokens above the gate; can be slightly
    /// negative because the reference is stored in uint16.
    pub kld: f64,
    /// The candidate's NLL of the true next token (f32).
    pub nll: f32,
    /// The reference's NLL of it, from the stored uint16 row (f32).
    pub nll_base: f32,
    /// `exp(-nll) - exp(-nll_base)` (f32).
    pub p_diff: f32,
    /// First-index argmax of the candidate, and of the decoded reference (llama.cpp's `Same
    /// top p` counts the rows where they are equal).
    pub top: u32,
    pub top_base: u32,
    /// Another entry of the candidate's row equals its maximum: from a stored (uint16) row, the
    /// full-precision argmax llama.cpp compared may be that other entry.
    pub top_tied: bool,
}

impl RowScore {
    /// The candidate's top-1 token is the reference's.
    pub fn same_top(&self) -> bool {
        self.top == self.top_base
    }
}

/// The candidate's first-index maximum (strict `>`, so the first of equal values wins).
fn first_max(logits: &[f32]) -> (f32, usize) {
    let (max_logit, imax, _) = first_max_tied(logits);
    (max_logit, imax)
}

/// [`first_max`], and whether another entry equals the maximum.
fn first_max_tied(logits: &[f32]) -> (f32, usize, bool) {
    let mut max_logit = logits[0];
    let mut imax = 0;
    let mut tied = false;
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > max_logit {
            max_logit = l;
            imax = i;
            tied = false;
        } else if l == max_logit {
            tied = true;
        }
    }
    (max_logit, imax, tied)
}

/// `lse` as llama.cpp computes it: the f32 of the double log of a double sum of f32 `exp`s.
fn log_sum_exp(logits: &[f32], max_logit: f32) -> f32 {
    let mut sum_exp = 0.0f64;
    for &l in logits {
        sum_exp += f64::from((l - max_logit).exp());
    }
    sum_exp.ln() as f32
}

/// The KL sum and the reference's first-index argmax; `log_z` is the candidate's `max + lse`.
fn kl_sum(reference: &BaseRow, logits: &[f32], log_z: f32) -> (f64, usize) {
    let (scale, min_log_prob) = (reference.scale, reference.min_log_prob);
    let mut sum = 0.0f64;
    let mut imax_base = 0;
    let mut best = 0.0f32;
    for (i, (&q, &l)) in reference.codes.iter().zip(logits).enumerate() {
        let log_p_base = scale * f32::from(q) + min_log_prob;
        if i == 0 || log_p_base > best {
            best = log_p_base;
            imax_base = i;
        }
        if log_p_base > KL_GATE {
            // f32 product of f32 terms, accumulated in f64.
            sum += f64::from(log_p_base.exp() * (log_p_base - l + log_z));
        }
    }
    (sum, imax_base)
}

/// The reference's probability on the entries llama.cpp's KL sum counts (log p above
/// [`KL_GATE`]) where the candidate's stored row is at its floor (code 0 of a full 16-nat window:
/// the log-prob lies 16 nats or more below the candidate's top, or rounds to the bottom). Those entries
/// read as the floor, so a reduction of the stored rows counts each one's KL term
/// `p·(log p − log q)` with `log q` raised to the floor: low by `p·(floor − log q)`, never high.
/// Zero when the candidate's window is narrower than 16 nats: its floor is then its lowest
/// entry, stored exactly, and nothing was clamped.
pub fn clamped_reference_mass(reference: &BaseRow, candidate: &BaseRow) -> f64 {
    // llama.cpp's window is `max(min, max - 16)..max` over 65535 steps; f32 rounding of
    // `max - 16` keeps a full window's scale within a hair of 16/65535.
    const FULL_WINDOW_SCALE: f32 = 15.99 / 65535.0;
    if candidate.scale < FULL_WINDOW_SCALE {
        return 0.0;
    }
    reference
        .codes
        .iter()
        .zip(&candidate.codes)
        .filter(|&(_, &c)| c == 0)
        .map(|(&q, _)| reference.scale * f32::from(q) + reference.min_log_prob)
        .filter(|&log_p| log_p > KL_GATE)
        .map(|log_p| f64::from(log_p.exp()))
        .sum()
}

fn check_row(reference: &BaseRow, candidate_logits: &[f32]) {
    assert!(
        !candidate_logits.is_empty() && candidate_logits.len() == reference.codes.len(),
        "candidate has {} logits, the reference row {} codes",
        candidate_logits.len(),
        reference.codes.len()
    );
}

/// The per-row KL(reference ‖ candidate) exactly as llama.cpp computes it (see [`RowScore`]).
/// Panics unless the candidate has as many logits as the reference row has codes (callers check
/// the vocabularies first; [`compare_base_files`] does).
pub fn row_kld(reference: &BaseRow, candidate_logits: &[f32]) -> f64 {
    check_row(reference, candidate_logits);
    let (max_logit, _) = first_max(candidate_logits);
    let lse = log_sum_exp(candidate_logits, max_logit);
    kl_sum(reference, candidate_logits, max_logit + lse).0
}

/// Everything llama.cpp derives from one row. `candidate_logits` are raw logits (any offset: only
/// their softmax matters), `token` the true next token. Panics if the lengths differ or `token`
/// is not an index into them.
pub fn score_row(reference: &BaseRow, candidate_logits: &[f32], token: i32) -> RowScore {
    score(reference, candidate_logits, token, false)
}

/// [`score_row`] for a candidate given as log-probabilities that are already normalized, such as
/// a decoded base-file row: they are used as they are (`log Z = 0`) instead of being normalized
/// again. Why: a stored row's normalization was computed by llama.cpp from the full-precision
/// logits, while the decoded row raises every clamped token (16 nats or more below the top) to
/// `e^-16`; normalizing the decoded row again would add that raised mass (up to
/// `n_vocab·1.1e-7`) to the candidate's partition function and bias every row's KL up by as much,
/// most visibly in the low percentiles.
pub fn score_row_log_probs(
    reference: &BaseRow,
    candidate_log_probs: &[f32],
    token: i32,
) -> RowScore {
    score(reference, candidate_log_probs, token, true)
}

fn score(reference: &BaseRow, candidate_logits: &[f32], token: i32, normalized: bool) -> RowScore {
    check_row(reference, candidate_logits);
    let tok = usize::try_from(token)
        .ok()
        .filter(|&t| t < candidate_logits.len())
        .unwrap_or_else(|| panic!("token {token} outside the vocabulary"));
    let (max_logit, imax, top_tied) = first_max_tied(candidate_logits);
    let lse = if normalized {
        // `max + lse` is then exactly 0: the log-probs are their own logits with log Z = 0.
        -max_logit
    } else {
        log_sum_exp(candidate_logits, max_logit)
    };
    let nll = max_logit + lse - candidate_logits[tok];
    let nll_base = -reference.log_prob(tok);
    let log_z = max_logit + lse;
    let (kld, imax_base) = kl_sum(reference, candidate_logits, log_z);
    let p_diff = (-nll).exp() - (-nll_base).exp();
    RowScore {
        kld,
        nll,
        nll_base,
        p_diff,
        top: imax as u32,
        top_base: imax_base as u32,
        top_tied,
    }
}

/// Sums and per-row arrays for [`CompatStats`], fed one scored row at a time in file order.
#[derive(Debug, Clone, Default)]
pub struct CompatAccumulator {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    n_same_top: u64,
    n_top_tied: u64,
    count: u64,
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

impl CompatAccumulator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Scores and adds one row: the reference's stored row, the candidate's logits over the full
    /// vocabulary, the true next token. Panics as [`score_row`] does. For a candidate that is
    /// itself a base file, use [`Self::push_log_probs`] with its decoded rows.
    pub fn push(&mut self, reference: &BaseRow, candidate_logits: &[f32], token: i32) {
        self.push_score(score_row(reference, candidate_logits, token));
    }

    /// [`Self::push`] for a candidate given as normalized log-probabilities (a decoded base-file
    /// row); see [`score_row_log_probs`].
    pub fn push_log_probs(&mut self, reference: &BaseRow, candidate_log_probs: &[f32], token: i32) {
        self.push_score(score_row_log_probs(reference, candidate_log_probs, token));
    }

    /// Adds a row scored elsewhere (e.g. in parallel); push in file order to sum as llama.cpp's
    /// single-threaded order would.
    pub fn push_score(&mut self, s: RowScore) {
        // Squares and products are taken in f32 before widening, as llama.cpp does.
        self.sum_nll += f64::from(s.nll);
        self.sum_nll2 += f64::from(s.nll * s.nll);
        self.sum_nll_base += f64::from(s.nll_base);
        self.sum_nll_base2 += f64::from(s.nll_base * s.nll_base);
        self.sum_nll_nll_base += f64::from(s.nll * s.nll_base);
        self.sum_kld += s.kld;
        self.sum_kld2 += s.kld * s.kld;
        self.count += 1;
        self.n_same_top += u64::from(s.same_top());
        self.n_top_tied += u64::from(s.top_tied);
        self.sum_p_diff += f64::from(s.p_diff);
        let p_diff2 = f64::from(s.p_diff * s.p_diff);
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.kld_values.push(s.kld as f32);
        self.p_diff_values.push(s.p_diff);
    }

    /// Rows added so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The statistics, or `None` below [`MIN_ROWS`] rows, where llama.cpp prints none.
    pub fn finish(mut self) -> Option<CompatStats> {
        if self.count < MIN_ROWS {
            return None;
        }
        let n = self.count;
        self.kld_values.sort_by(f32::total_cmp);
        self.p_diff_values.sort_by(f32::total_cmp);
        let (kv, pv) = (&self.kld_values, &self.p_diff_values);

        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, n);
        let ppl = log_ppl.0.exp();
        let ppl_unc = ppl * log_ppl.1;
        let log_ppl_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, n);
        let ppl_base = log_ppl_base.0.exp();
        let ppl_base_unc = ppl_base * log_ppl_base.1;
        let cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let cor = cov / (log_ppl.1 * log_ppl_base.1);
        let ln_ratio = log_ppl.0 - log_ppl_base.0;
        let ln_ratio_unc =
            (log_ppl.1 * log_ppl.1 + log_ppl_base.1 * log_ppl_base.1 - 2.0 * cov).sqrt();
        let ratio = ln_ratio.exp();
        let ppl_cov = ppl * ppl_base * cov;
        let diff_unc = (ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl_cov).sqrt();

        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, n);
        let rms = mse.0.sqrt();
        let same = self.n_same_top as f64 / n as f64;
        let p = |v: &[f32], f: f32| f64::from(percentile(v, f));

        Some(CompatStats {
            n,
            ppl_q: (ppl, ppl_unc),
            ppl_base: (ppl_base, ppl_base_unc),
            cor,
            ln_ratio: (ln_ratio, ln_ratio_unc),
            ratio: (ratio, ratio * ln_ratio_unc),
            diff: (ppl - ppl_base, diff_unc),
            kld_mean: mean_and_uncertainty(self.sum_kld, self.sum_kld2, n),
            kld_max: p(kv, 1.0),
            kld_p999: p(kv, 0.999),
            kld_p99: p(kv, 0.990),
            kld_p95: p(kv, 0.950),
            kld_p90: p(kv, 0.900),
            kld_median: f64::from(median(kv)),
            kld_p10: p(kv, 0.100),
            kld_p5: p(kv, 0.050),
            kld_p1: p(kv, 0.010),
            kld_p01: p(kv, 0.001),
            kld_min: p(kv, 0.0),
            dp_mean: mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, n),
            dp_max: p(pv, 1.0),
            dp_p999: p(pv, 0.999),
            dp_p99: p(pv, 0.990),
            dp_p95: p(pv, 0.950),
            dp_p90: p(pv, 0.900),
            dp_p75: p(pv, 0.750),
            dp_median: f64::from(median(pv)),
            dp_p25: p(pv, 0.250),
            dp_p10: p(pv, 0.100),
            dp_p5: p(pv, 0.050),
            dp_p1: p(pv, 0.010),
            dp_p01: p(pv, 0.001),
            dp_min: p(pv, 0.0),
            rms_dp: (rms, 0.5 / rms * mse.1),
            same_top: (same, (same * (1.0 - same) / (n - 1) as f64).sqrt()),
            top_tied: self.n_top_tied,
        })
    }
}

/// Mean and the i.i.d. standard error of the mean; 0 when the variance is not positive or there
/// are 10 rows or fewer.
pub(super) fn mean_and_uncertainty(sum: f64, sum2: f64, n: u64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let count = n as f64;
    let f = sum / count;
    let v = sum2 / count - f * f;
    let u = if v > 0.0 && n > 10 {
        (v / (count - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, u)
}

/// Covariance of two means; 0 below 10 rows.
pub(super) fn covariance(sum_a: f64, sum_b: f64, sum_ab: f64, n: u64) -> f64 {
    if n < 10 {
        return 0.0;
    }
    let count = n as f64;
    (sum_ab / count - (sum_a / count) * (sum_b / count)) / (count - 1.0)
}

/// llama.cpp's percentile of a sorted non-empty array: index `fraction·(n-1)` in f32, truncated,
/// and a linear interpolation in f32; `fraction <= 0` is the minimum, `>= 1` the maximum.
pub(super) fn percentile(sorted: &[f32], fraction: f32) -> f32 {
    let last = sorted.len() - 1;
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return sorted[last];
    }
    let mut p = fraction * last as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * sorted[ip] + p * sorted[(ip + 1).min(last)]
}

/// The middle value, or the f32 mean of the two middle values for an even count.
pub(super) fn median(sorted: &[f32]) -> f32 {
    let n = sorted.len();
    if n.is_multiple_of(2) {
        0.5 * (sorted[n / 2] + sorted[n / 2 - 1])
    } else {
        sorted[n / 2]
    }
}

/// The statistics llama.cpp prints, as `(value, uncertainty)` where it prints both. Percentages
/// are fractions (`same_top.0 == 0.94261` is printed as `94.261 %`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompatStats {
    /// Scored rows.
    pub n: u64,
    pub ppl_q: (f64, f64),
    /// From the uint16 reference, so slightly off the base pass's own `Final estimate`.
    pub ppl_base: (f64, f64),
    /// Pearson correlation of the per-token NLLs (a fraction; printed as a percentage).
    pub cor: f64,
    pub ln_ratio: (f64, f64),
    pub ratio: (f64, f64),
    pub diff: (f64, f64),
    pub kld_mean: (f64, f64),
    pub kld_max: f64,
    pub kld_p999: f64,
    pub kld_p99: f64,
    pub kld_p95: f64,
    pub kld_p90: f64,
    pub kld_median: f64,
    pub kld_p10: f64,
    pub kld_p5: f64,
    pub kld_p1: f64,
    pub kld_p01: f64,
    pub kld_min: f64,
    /// Mean Δp of the true next token, a fraction.
    pub dp_mean: (f64, f64),
    pub dp_max: f64,
    pub dp_p999: f64,
    pub dp_p99: f64,
    pub dp_p95: f64,
    pub dp_p90: f64,
    pub dp_p75: f64,
    pub dp_median: f64,
    pub dp_p25: f64,
    pub dp_p10: f64,
    pub dp_p5: f64,
    pub dp_p1: f64,
    pub dp_p01: f64,
    pub dp_min: f64,
    pub rms_dp: (f64, f64),
    pub same_top: (f64, f64),
    /// Rows whose candidate maximum is tied in the row read (not printed by llama.cpp): on
    /// those, llama.cpp's full-precision argmax may differ from the first index.
    #[serde(skip)]
    pub top_tied: u64,
}

/// C's `%W.Pf`: Rust's formatting rounds finite values the same way (exact decimal expansion,
/// ties to even); glibc spells non-finite values `nan`, `-nan`, `inf`, `-inf`.
pub(super) fn c_fixed(x: f64, width: usize, prec: usize) -> String {
    if x.is_finite() {
        return format!("{x:width$.prec$}");
    }
    let s = match (x.is_nan(), x.is_sign_negative()) {
        (true, false) => "nan",
        (true, true) => "-nan",
        (false, false) => "inf",
        (false, true) => "-inf",
    };
    format!("{s:>width$}")
}

impl CompatStats {
    /// The three sections as current mainline llama.cpp prints them (after its PRs #15999 and
    /// #16321: 90 %, 95 % and 0.1 % KLD lines present), one line per statistic, each section
    /// followed by an empty line except the last.
    pub fn render(&self) -> String {
        let f6 = |x: f64| c_fixed(x, 10, 6);
        let pair6 = |(v, u): (f64, f64)| format!("{} ± {}", f6(v), f6(u));
        let pct = |x: f64| c_fixed(100.0 * x, 6, 3);
        let pct_pair = |(v, u): (f64, f64)| {
            format!(
                "{} ± {} %",
                c_fixed(100.0 * v, 6, 3),
                c_fixed(100.0 * u, 5, 3)
            )
        };
        let mut lines = vec![
            "====== Perplexity statistics ======".to_owned(),
            format!("Mean PPL(Q)                   : {}", pair6(self.ppl_q)),
            format!("Mean PPL(base)                : {}", pair6(self.ppl_base)),
            format!(
                "Cor(ln(PPL(Q)), ln(PPL(base))): {}%",
                c_fixed(100.0 * self.cor, 6, 2)
            ),
            format!("Mean ln(PPL(Q)/PPL(base))     : {}", pair6(self.ln_ratio)),
            format!("Mean PPL(Q)/PPL(base)         : {}", pair6(self.ratio)),
            format!("Mean PPL(Q)-PPL(base)         : {}", pair6(self.diff)),
            String::new(),
            "====== KL divergence statistics ======".to_owned(),
            format!("Mean    KLD: {}", pair6(self.kld_mean)),
        ];
        for (label, v) in [
            ("Maximum", self.kld_max),
            ("99.9%  ", self.kld_p999),
            ("99.0%  ", self.kld_p99),
            ("95.0%  ", self.kld_p95),
            ("90.0%  ", self.kld_p90),
            ("Median ", self.kld_median),
            ("10.0%  ", self.kld_p10),
            (" 5.0%  ", self.kld_p5),
            (" 1.0%  ", self.kld_p1),
            (" 0.1%  ", self.kld_p01),
            ("Minimum", self.kld_min),
        ] {
            lines.push(format!("{label} KLD: {}", f6(v)));
        }
        lines.push(String::new());
        lines.push("====== Token probability statistics ======".to_owned());
        lines.push(format!("Mean    Δp: {}", pct_pair(self.dp_mean)));
        for (label, v) in [
            ("Maximum", self.dp_max),
            ("99.9%  ", self.dp_p999),
            ("99.0%  ", self.dp_p99),
            ("95.0%  ", self.dp_p95),
            ("90.0%  ", self.dp_p90),
            ("75.0%  ", self.dp_p75),
            ("Median ", self.dp_median),
            ("25.0%  ", self.dp_p25),
            ("10.0%  ", self.dp_p10),
            (" 5.0%  ", self.dp_p5),
            (" 1.0%  ", self.dp_p1),
            (" 0.1%  ", self.dp_p01),
            ("Minimum", self.dp_min),
        ] {
            lines.push(format!("{label} Δp: {}%", pct(v)));
        }
        lines.push(format!("RMS Δp    : {}", pct_pair(self.rms_dp)));
        lines.push(format!("Same top p: {}", pct_pair(self.same_top)));
        let mut out = lines.join("\n");
        out.push('\n');
        out
    }
}

/// Rows scored per parallel batch: enough to keep the cores busy, few enough that two batches of
/// a 248k vocabulary stay near 64 MB.
const BATCH_ROWS: usize = 64;

/// Recomputes llama.cpp's `--kl-divergence` statistics from two base files of the same text: the
/// reference's stored rows against the candidate's decoded log-probs, taken as already normalized
/// ([`score_row_log_probs`]). llama.cpp's own pass uses the candidate's full-precision logits, so
/// the two agree to within the candidate's uint16 rounding (at most `scale/2 <= 1.22e-4` nats per
/// log-prob). The files must have the same `n_ctx`, `n_vocab`, `n_chunk` and tokens; both are
/// streamed, rows scored in parallel and summed in file order.
pub fn compare_base_files(reference: &BaseFile, candidate: &BaseFile) -> Result<CompatStats> {
    check_compatible(reference, candidate)?;
    let mut acc = CompatAccumulator::new();
    let mut ref_reader = reference.reader()?;
    let mut cand_reader = candidate.reader()?;
    let mut ref_rows = vec![BaseRow::default(); BATCH_ROWS];
    let mut cand_rows = vec![BaseRow::default(); BATCH_ROWS];
    let mut row = 0u64;
    loop {
        let mut filled = 0;
        while filled < BATCH_ROWS {
            let a = ref_reader.next_row(&mut ref_rows[filled])?;
            let b = cand_reader.next_row(&mut cand_rows[filled])?;
            if !(a && b) {
                break;
            }
            filled += 1;
        }
        if filled == 0 {
            break;
        }
        let scores: Vec<RowScore> = (0..filled)
            .into_par_iter()
            .map_init(Vec::new, |logits, k| {
                logits.resize(cand_rows[k].codes.len(), 0.0);
                cand_rows[k].decode_into(logits);
                score_row_log_probs(&ref_rows[k], logits, reference.next_token(row + k as u64))
            })
            .collect();
        scores.into_iter().for_each(|s| acc.push_score(s));
        row += filled as u64;
    }
    let n = acc.count();
    acc.finish().ok_or_else(|| {
        Error::usage(
            &reference.path,
            format!("only {n} scored rows; llama.cpp prints statistics from {MIN_ROWS} rows"),
        )
    })
}

/// The two files must describe the same evaluation; the first difference is named.
fn check_compatible(reference: &BaseFile, candidate: &BaseFile) -> Result<()> {
    let ref_path = reference.path.display();
    for (name, a, b) in [
        ("n_ctx", reference.n_ctx, candidate.n_ctx),
        ("n_vocab", reference.n_vocab, candidate.n_vocab),
        ("n_chunk", reference.n_chunk, candidate.n_chunk),
    ] {
        if a != b {
            return Err(Error::mismatch(
                &candidate.path,
                Some(name),
                format!("{b} here but {a} in the reference {ref_path}"),
            ));
        }
    }
    if let Some(i) = (reference.tokens.iter().zip(&candidate.tokens)).position(|(a, b)| a != b) {
        let n_ctx = reference.n_ctx as usize;
        return Err(Error::mismatch(
            &candidate.path,
            Some(&format!(
                "token {i} (chunk {}, position {})",
                i / n_ctx,
                i % n_ctx
            )),
            format!(
                "id {} here but {} in the reference {ref_path}: the token streams differ",
                candidate.tokens[i], reference.tokens[i]
            ),
        ));
    }
    Ok(())
}
