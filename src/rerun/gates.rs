//! Sanity gates, one source for every lane (docs/DESIGN.md, "Verification"): a model against itself gives
//! exactly 0; the candidate shifted by one row gives a large KL; a quantized candidate does not
//! give an all-zero KL (quantization never engaged).

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::kld::protocol::VocabMode;
use crate::kld::row::{Scratch, reduce};
use crate::runner::Runner;

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Gate {
    pub gate: String,
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
    let (mut sum, mut sum_rev, mut top1_equal, mut finite) = (0.0, 0.0, true, 0usize);
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
        finite += 1;
    }
    // No finite row: NaN, which fails every gate (nothing was shown).
    let n = finite as f64;
    Ok((sum / n, sum_rev / n, top1_equal && finite > 0))
}

/// What the measurement found, as the gates need it.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The largest per-row KL the rerun computed, forward or reverse (`None`: neither was).
    pub kld_max: Option<f64>,
    /// The mean KL the shift gate compares against (forward, else reverse).
    pub kld_mean: f64,
    /// The candidate holds quantized weights.
    pub quantized: bool,
    /// The quantization method the card declares (`None`: it declares none).
    pub declared: Option<String>,
}

impl Measured {
    /// The gates' view of a measurement's first run: forward KL when computed, else reverse.
    pub fn of_metrics(
        metrics: Option<&std::collections::BTreeMap<String, f64>>,
        quantized: bool,
        declared: Option<String>,
    ) -> Measured {
        let get = |name: &str| metrics.and_then(|m| m.get(name)).copied();
        let kld_max = match (get("kld_max"), get("kld_reverse_max")) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Measured {
            kld_max,
            kld_mean: get("kld_mean").or(get("kld_reverse_mean")).unwrap_or(0.0),
            quantized,
            declared,
        }
    }
}

/// Run the gates on the first window (`scored`: its rows to compare).
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
    let SelfCompare {
        forward: self_kl,
        reverse: self_rev,
        same_top1,
    } = self_compare;
    let mut gates = Vec::new();
    gates.push(Gate {
        gate: "self_compare".into(),
        passed: self_kl == 0.0 && self_rev == 0.0 && same_top1,
        detail: format!(
            "the reference against itself on one window: mean KL {self_kl:e} forward, {self_rev:e} reverse (must be exactly 0), top-1 {}",
            if same_top1 { "identical" } else { "differs" }
        ),
    });
    let floor = (10.0 * measured.kld_mean).max(0.05);
    gates.push(Gate {
        gate: "one_row_shift".into(),
        passed: shift_kl > floor,
        detail: format!(
            "the candidate shifted by one row: mean KL {shift_kl:.4} nats (must exceed {floor:.4}: 10x the measured mean, at least 0.05), so rows are aligned"
        ),
    });
    gates.push(quantization_engaged(&measured));
    gates
}

/// A candidate that is quantized, by its tensors or by what its card declares, must not give an
/// all-zero KL: that means the quantization never engaged (the same weights loaded twice).
fn quantization_engaged(m: &Measured) -> Gate {
    let what = match (&m.declared, m.quantized) {
        (Some(method), true) => {
            format!("the card declares `{method}` and the candidate holds quantized weights")
        }
        (Some(method), false) => format!(
            "the card declares `{method}` but the candidate's tensors hold no quantized weights"
        ),
        (None, true) => "the candidate holds quantized weights".to_owned(),
        (None, false) => {
            return Gate {
                gate: "quantization_engaged".into(),
                passed: true,
                detail: "neither the card nor the tensors declare quantization; an all-zero KLD is possible".into(),
            };
        }
    };
    let (passed, detail) = match m.kld_max {
        Some(max) if max > 0.0 => (
            true,
            format!(
                "{what}; its largest per-row KL is {} (above 0)",
                readable(max)
            ),
        ),
        Some(max) => (
            false,
            format!(
                "{what}, yet its largest per-row KL is {}: quantization never engaged (the same weights loaded twice?)",
                readable(max)
            ),
        ),
        None => (
            false,
            format!(
                "{what}, and the rerun computed no per-row KL maximum to show that quantization engaged"
            ),
        ),
    };
    Gate {
        gate: "quantization_engaged".into(),
        passed,
        detail,
    }
}

/// Rows the rerun left out as non-finite must be rows the card says it left out: a candidate
/// that turns rows into NaN cannot pass by shrinking the sample.
pub fn finite_rows(runs: &[(u64, u64, Option<u64>)]) -> Gate {
    let bad: Vec<String> = runs
        .iter()
        .filter(|(_, rerun, card)| *rerun > 0 && card.is_none_or(|c| c != *rerun))
        .map(|(length, rerun, card)| match card {
            Some(c) => format!(
                "context length {length}: {rerun} rows non-finite in the rerun, {c} disclosed"
            ),
            None => format!(
                "context length {length}: {rerun} rows non-finite in the rerun, none disclosed"
            ),
        })
        .collect();
    Gate {
        gate: "finite_rows".into(),
        passed: bad.is_empty(),
        detail: if bad.is_empty() {
            "every scored row the card does not disclose as excluded has finite logits in both models".into()
        } else {
            format!(
                "rows left out as non-finite that the card does not disclose: {}",
                bad.join("; ")
            )
        },
    }
}

/// The gates from the transformers runner's raw numbers; gates it could not run fail (closed).
pub fn from_runner(
    raw: Option<&crate::runner::exchange::GateNumbers>,
    measured: Measured,
) -> Vec<Gate> {
    let raw = raw.cloned().unwrap_or_default();
    match (
        raw.self_forward_mean,
        raw.self_reverse_mean,
        raw.self_top1_identical,
        raw.shift_forward_mean,
    ) {
        (Some(forward), Some(reverse), Some(same_top1), Some(shift)) => judge(
            SelfCompare {
                forward,
                reverse,
                same_top1,
            },
            shift,
            measured,
        ),
        _ => vec![Gate {
            gate: "self_compare".into(),
            passed: false,
            detail: format!(
                "the transformers runner did not run the gates ({}); a rerun without them is never reproduced",
                raw.skipped
                    .as_deref()
                    .unwrap_or("no gate numbers in its record")
            ),
        }],
    }
}

/// A KL value in a gate's detail, for people: four decimals from 0.001 up, else four
/// significant digits in scientific notation (Rust's `{:e}` printed `7.405002677752102e-1`).
fn readable(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || x.abs() >= 1e-3 {
        format!("{x:.4}")
    } else {
        format!("{x:.3e}")
    }
}
