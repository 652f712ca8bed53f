//! Arms against each other on the same rows: the paired difference of their forward KL, row by
//! row, with a block-bootstrap interval over the same blocks every run's interval uses (windows,
//! or runs of rows inside one window), the verdict it supports, and the smallest difference this
//! sample could have told apart.
//!
//! Definitions (also in study.json's `definitions`): for arms A and B scored on rows i of the
//! same windows, d_i = KL_A,i − KL_B,i (forward, nats), over the rows finite in both. The
//! difference is mean(d). Its interval is the percentile interval of mean(d) over `resamples`
//! block-bootstrap resamples (seeded; blocks drawn with replacement, all of a block's rows
//! together). A is `closer` to the reference than B when the whole interval is below 0,
//! `farther` when above, else `not_distinguishable`. The minimum detectable difference is
//! (z₀.₉₇₅ + z₀.₈₀)·se = 2.80·se, se the standard deviation of the resampled means: a true
//! difference that large is found (at the 5% level) four times in five.

use serde::{Deserialize, Serialize};

use crate::kld::row::RowRecord;
use crate::kld::stats::SplitMix64;

/// z₀.₉₇₅ + z₀.₈₀: a two-sided 5% test with 80% power.
pub const MDE_FACTOR: f64 = 1.959_963_984_540_054 + 0.841_621_233_572_914;

/// One pair of arms at one context length.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Paired {
    pub a: String,
    pub b: String,
    pub context_length: usize,
    /// Rows finite in both arms.
    pub n_rows: usize,
    /// mean(KL_A − KL_B), nats.
    #[serde(deserialize_with = "crate::json_f64::number")]
    #[schemars(with = "Option<f64>")]
    pub difference: f64,
    /// Its block-bootstrap interval at the protocol's level.
    #[serde(deserialize_with = "crate::json_f64::pair")]
    #[schemars(with = "[Option<f64>; 2]")]
    pub ci95: [f64; 2],
    /// The smallest true difference this sample detects four times in five (2.80 × the
    /// bootstrap standard error).
    #[serde(deserialize_with = "crate::json_f64::number")]
    #[schemars(with = "Option<f64>")]
    pub mde: f64,
    /// `closer` (A's KL is smaller), `farther`, or `not_distinguishable`.
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Closer,
    Farther,
    NotDistinguishable,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Closer => "closer",
            Verdict::Farther => "farther",
            Verdict::NotDistinguishable => "not distinguishable",
        }
    }
}

/// A and B on one run's rows: per window, one record per scored row of the same plan.
pub fn paired(
    (a_name, a): (&str, &[Vec<Option<RowRecord>>]),
    (b_name, b): (&str, &[Vec<Option<RowRecord>>]),
    context_length: usize,
    resamples: usize,
    seed: u64,
    level: f64,
) -> Paired {
    // Blocks as the run's statistics form them: windows, or runs of rows in a single window.
    let single = a.len() == 1;
    let n_rows: usize = a.iter().map(Vec::len).sum();
    let run = (n_rows / 100).clamp(1, crate::kld::BOOTSTRAP_MAX_RUN);
    let mut blocks: Vec<(f64, usize)> = Vec::new();
    for (w, (ra, rb)) in a.iter().zip(b).enumerate() {
        for (k, (x, y)) in ra.iter().zip(rb).enumerate() {
            let (Some(x), Some(y)) = (x, y) else { continue };
            let block = if single { k / run } else { w };
            if blocks.len() <= block {
                blocks.resize(block + 1, (0.0, 0));
            }
            blocks[block].0 += x.forward - y.forward;
            blocks[block].1 += 1;
        }
    }
    blocks.retain(|b| b.1 > 0);
    let (sum, n) = blocks
        .iter()
        .fold((0.0, 0usize), |(s, n), b| (s + b.0, n + b.1));
    let difference = if n > 0 { sum / n as f64 } else { f64::NAN };
    let mut means: Vec<f64> = (0..resamples)
        .map(|i| {
            let mut rng = SplitMix64::for_stream(seed, i as u64);
            let (mut s, mut m) = (0.0, 0usize);
            for _ in 0..blocks.len() {
                let b = blocks[rng.below(blocks.len() as u64) as usize];
                s += b.0;
                m += b.1;
            }
            if m > 0 { s / m as f64 } else { f64::NAN }
        })
        .filter(|v| v.is_finite())
        .collect();
    means.sort_by(f64::total_cmp);
    let alpha = (1.0 - level) / 2.0;
    let quantile = |q: f64| -> f64 {
        if means.is_empty() {
            return f64::NAN;
        }
        let pos = q * (means.len() - 1) as f64;
        let lo = pos.floor() as usize;
        let hi = (lo + 1).min(means.len() - 1);
        means[lo] + (means[hi] - means[lo]) * (pos - lo as f64)
    };
    let ci95 = [quantile(alpha), quantile(1.0 - alpha)];
    let mean_of = means.iter().sum::<f64>() / means.len().max(1) as f64;
    let se = (means.iter().map(|v| (v - mean_of).powi(2)).sum::<f64>()
        / (means.len().max(2) - 1) as f64)
        .sqrt();
    let verdict = if ci95[1] < 0.0 {
        Verdict::Closer
    } else if ci95[0] > 0.0 {
        Verdict::Farther
    } else {
        Verdict::NotDistinguishable
    };
    Paired {
        a: a_name.into(),
        b: b_name.into(),
        context_length,
        n_rows: n,
        difference,
        ci95,
        mde: MDE_FACTOR * se,
        verdict,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(forward: f64) -> Option<RowRecord> {
        Some(RowRecord {
            forward,
            reverse: forward,
            ref_top1: 0,
            cand_top1: 0,
            ref_top1_prob: 0.5,
            nll_ref: None,
            nll_cand: None,
        })
    }

    #[test]
    fn a_consistent_difference_is_found_and_a_null_one_is_not() {
        // 40 windows of 10 rows; B = A + 0.01 + noise that averages out per window.
        let a: Vec<Vec<Option<RowRecord>>> = (0..40)
            .map(|w| {
                (0..10)
                    .map(|j| record(0.05 + 0.001 * ((w * 7 + j) % 5) as f64))
                    .collect()
            })
            .collect();
        let b: Vec<Vec<Option<RowRecord>>> = a
            .iter()
            .map(|rows| {
                rows.iter()
                    .enumerate()
                    .map(|(j, r)| {
                        record(r.unwrap().forward + 0.01 + if j % 2 == 0 { 0.002 } else { -0.002 })
                    })
                    .collect()
            })
            .collect();
        let p = paired(("a", &a), ("b", &b), 16, 500, 0, 0.95);
        assert_eq!(p.n_rows, 400);
        assert!((p.difference + 0.01).abs() < 1e-12, "{}", p.difference);
        assert_eq!(p.verdict, Verdict::Closer);
        assert!(p.ci95[0] < -0.01 + 1e-9 && p.ci95[1] > -0.01 - 1e-9);
        let q = paired(("b", &b), ("a", &a), 16, 500, 0, 0.95);
        assert_eq!(q.verdict, Verdict::Farther);
        // An arm against itself: zero, not distinguishable, no detectable difference.
        let same = paired(("a", &a), ("a2", &a), 16, 500, 0, 0.95);
        assert_eq!(same.difference, 0.0);
        assert_eq!(same.verdict, Verdict::NotDistinguishable);
        assert_eq!(same.mde, 0.0);
        // Rows non-finite in either arm are left out of both.
        let mut holes = b.clone();
        holes[0][0] = None;
        assert_eq!(
            paired(("a", &a), ("b", &holes), 16, 10, 0, 0.95).n_rows,
            399
        );
    }
}
