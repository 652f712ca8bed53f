//! Sanity gates, run on every verification (design.md, "Verdicts"): a model against itself gives
//! exactly 0; the candidate shifted by one row gives a large KL; a quantized candidate does not
//! give an all-zero KL (quantization never engaged).

use serde::Serialize;

use crate::error::Result;
use crate::measure::protocol::VocabMode;
use crate::measure::row::{Scratch, reduce};
use crate::runner::Runner;

#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    pub gate: &'static str,
    pub passed: bool,
    pub detail: String,
}

/// Mean forward KL of reference row j against candidate row j + `shift` over one window, for the
/// scored rows `scored` (those a reference artifact holds).
fn mean_kl(
    reference: &dyn Runner,
    candidate: &dyn Runner,
    ids: &[u32],
    scored: &[usize],
    shift: usize,
    vocab: usize,
) -> Result<(f64, f64, bool)> {
    let n = ids.len();
    let rows: Vec<usize> = scored
        .iter()
        .copied()
        .filter(|&j| j + shift + 1 < n)
        .collect();
    let shifted: Vec<usize> = rows.iter().map(|r| r + shift).collect();
    let a = reference.window(ids)?.logits(&rows)?;
    let b = candidate.window(ids)?.logits(&shifted)?;
    let w = reference.vocab();
    let mut scratch = Scratch::default();
    let (mut sum, mut sum_rev, mut top1_equal) = (0.0, 0.0, true);
    for k in 0..rows.len() {
        let Some(r) = reduce(
            &a[k * w..k * w + vocab],
            &b[k * w..k * w + vocab],
            None,
            VocabMode::Full,
            true,
            &mut scratch,
        ) else {
            continue;
        };
        sum += r.forward;
        sum_rev += r.reverse;
        top1_equal &= r.ref_top1 == r.cand_top1;
    }
    let n = rows.len().max(1) as f64;
    Ok((sum / n, sum_rev / n, top1_equal))
}

/// Run the gates on the first window; `rerun_kld_mean` is the measured mean KLD and
/// `quantized` whether the candidate holds quantized weights.
/// What the measurement found, as the gates need it.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub kld_max: f64,
    pub kld_mean: f64,
    /// The candidate holds quantized weights.
    pub quantized: bool,
}

pub fn run(
    reference: &dyn Runner,
    candidate: &dyn Runner,
    window: &[u32],
    scored: &[usize],
    vocab: usize,
    measured: Measured,
) -> Result<Vec<Gate>> {
    let (self_kl, self_rev, same_top1) = mean_kl(reference, reference, window, scored, 0, vocab)?;
    let (shift_kl, _, _) = mean_kl(reference, candidate, window, scored, 1, vocab)?;
    Ok(judge(
        SelfCompare {
            forward: self_kl,
            reverse: self_rev,
            same_top1,
        },
        shift_kl,
        measured,
    ))
}

/// The reference run twice on one window, compared row by row.
#[derive(Debug, Clone, Copy)]
pub struct SelfCompare {
    pub forward: f64,
    pub reverse: f64,
    pub same_top1: bool,
}

/// The gates from their raw numbers: the self-compare, the mean KL of the one-row shift, and
/// what the measurement found. Runners that reduce rows themselves (transformers) report the
/// raw numbers; the thresholds are the same.
pub fn judge(self_compare: SelfCompare, shift_kl: f64, measured: Measured) -> Vec<Gate> {
    let Measured {
        kld_max: rerun_kld_max,
        kld_mean: rerun_kld_mean,
        quantized,
    } = measured;
    let SelfCompare {
        forward: self_kl,
        reverse: self_rev,
        same_top1,
    } = self_compare;
    let mut gates = Vec::new();
    gates.push(Gate {
        gate: "self_compare",
        passed: self_kl == 0.0 && self_rev == 0.0 && same_top1,
        detail: format!(
            "the reference against itself on one window: mean KL {self_kl:e} forward, {self_rev:e} reverse (must be exactly 0), top-1 {}",
            if same_top1 { "identical" } else { "differs" }
        ),
    });
    let floor = (10.0 * rerun_kld_mean).max(0.05);
    gates.push(Gate {
        gate: "one_row_shift",
        passed: shift_kl > floor,
        detail: format!(
            "the candidate shifted by one row: mean KL {shift_kl:.4} nats (must exceed {floor:.4}: 10x the measured mean, at least 0.05), so rows are aligned"
        ),
    });
    gates.push(Gate {
        gate: "quantization_engaged",
        passed: !quantized || rerun_kld_max > 0.0,
        detail: if quantized {
            format!("the candidate holds quantized weights and its largest per-row KLD is {rerun_kld_max:e} (must be above 0)")
        } else {
            "the candidate holds no quantized weights; an all-zero KLD is possible".into()
        },
    });
    gates
}
