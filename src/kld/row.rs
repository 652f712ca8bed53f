//! One scored row: reference and candidate logits in, KL both ways, top-1, NLL and Δp out.
//!
//! Numerics. KL(P||Q) is computed as `log1p(E_p[g(c - m)])` with `c_i = a_i - b_i` (the logit
//! difference, exact in f64 for f32 inputs), `m = E_p[c]` and `g(x) = expm1(-x) + x >= 0`. This
//! is the exact identity `KL = E_p[c] + ln E_p[e^-c]` rearranged so that every summand is
//! non-negative: no cancellation however close the two distributions are, and an error in the
//! weights `p` (or in their normalizer) moves the result only in proportion to the KL itself.
//! Sums are f64.

use super::protocol::{Tail, VocabMode};

/// Per-row results. KL values are in nats.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowRecord {
    pub forward: f64,
    pub reverse: f64,
    pub ref_top1: u32,
    pub cand_top1: u32,
    /// The reference's probability of its own top-1 token (full vocabulary).
    pub ref_top1_prob: f64,
    /// NLL of the true next token under each model (full vocabulary), when tokens are known.
    pub nll_ref: Option<f64>,
    pub nll_cand: Option<f64>,
}

impl RowRecord {
    pub fn delta_p(&self) -> Option<f64> {
        Some((-self.nll_cand?).exp() - (-self.nll_ref?).exp())
    }
}

/// Scratch space reused across rows (one per worker thread).
#[derive(Debug, Default)]
pub struct Scratch {
    idx: Vec<u32>,
    a: Vec<f64>,
    b: Vec<f64>,
    kernel: super::kernel::Buffers,
}

/// Reduce one row. Returns `None` when a logit is NaN or +inf (the row is excluded and counted);
/// -inf logits are masked tokens (probability zero).
pub fn reduce(
    reference: &[f32],
    candidate: &[f32],
    token: Option<u32>,
    mode: VocabMode,
    want_reverse: bool,
    scratch: &mut Scratch,
) -> Option<RowRecord> {
    debug_assert_eq!(reference.len(), candidate.len());
    if mode == VocabMode::Full {
        let super::kernel::Outcome::Row { a, b, row } =
            super::kernel::full(reference, candidate, want_reverse, &mut scratch.kernel)
        else {
            return None;
        };
        let nll = |logits: &[f32], lse: f64| {
            token
                .and_then(|t| logits.get(t as usize))
                .map(|&l| lse - f64::from(l))
        };
        return Some(RowRecord {
            forward: row.forward,
            reverse: row.reverse,
            ref_top1: a.argmax,
            cand_top1: b.argmax,
            ref_top1_prob: (f64::from(a.max) - row.lse_a).exp(),
            nll_ref: nll(reference, row.lse_a),
            nll_cand: nll(candidate, row.lse_b),
        });
    }
    let scan_ref = super::kernel::scan(reference);
    let scan_cand = super::kernel::scan(candidate);
    if scan_ref.non_finite || scan_cand.non_finite {
        return None;
    }
    let (ref_max, ref_top1) = (scan_ref.max, scan_ref.argmax);
    let (cand_max, cand_top1) = (scan_cand.max, scan_cand.argmax);
    if ref_max == f32::NEG_INFINITY || cand_max == f32::NEG_INFINITY {
        return None; // every token masked: no distribution
    }
    let lse_ref = log_sum_exp(reference, ref_max);
    let lse_cand = log_sum_exp(candidate, cand_max);
    let nll = |logits: &[f32], lse: f64| {
        token
            .and_then(|t| logits.get(t as usize))
            .map(|&l| lse - f64::from(l))
    };
    let (forward, reverse) = match mode {
        VocabMode::Full => unreachable!("handled by the full-vocabulary kernel above"),
        VocabMode::TopK { k, tail } => {
            top_k_set(reference, k, &mut scratch.idx);
            match tail {
                Tail::Renormalized | Tail::Lumped => {
                    scratch.a.clear();
                    scratch.b.clear();
                    for &i in &scratch.idx {
                        scratch.a.push(f64::from(reference[i as usize]));
                        scratch.b.push(f64::from(candidate[i as usize]));
                    }
                    if tail == Tail::Lumped {
                        // One extra "token": the tail's log-mass relative to the same max, so
                        // that the (k+1)-vectors normalize to the lumped distributions.
                        scratch.a.push(tail_logit(reference, &scratch.idx, ref_max));
                        scratch
                            .b
                            .push(tail_logit(candidate, &scratch.idx, cand_max));
                    }
                    let (a, b) = (&scratch.a, &scratch.b);
                    let a_max = a.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let b_max = b.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    (
                        kl_f64(a, b, a_max),
                        if want_reverse {
                            kl_f64(b, a, b_max)
                        } else {
                            f64::NAN
                        },
                    )
                }
                Tail::Dropped => partial_both(
                    reference,
                    candidate,
                    lse_ref,
                    lse_cand,
                    &scratch.idx,
                    want_reverse,
                ),
            }
        }
        VocabMode::Threshold { log_p } => {
            scratch.idx.clear();
            for (i, &l) in reference.iter().enumerate() {
                if f64::from(l) - lse_ref > log_p {
                    scratch.idx.push(i as u32);
                }
            }
            partial_both(
                reference,
                candidate,
                lse_ref,
                lse_cand,
                &scratch.idx,
                want_reverse,
            )
        }
    };
    Some(RowRecord {
        forward,
        reverse,
        ref_top1,
        cand_top1,
        ref_top1_prob: (f64::from(ref_max) - lse_ref).exp(),
        nll_ref: nll(reference, lse_ref),
        nll_cand: nll(candidate, lse_cand),
    })
}

/// `max + ln Σ exp(x - max)`, in f64.
pub fn log_sum_exp(x: &[f32], max: f32) -> f64 {
    let max64 = f64::from(max);
    let sum: f64 = x.iter().map(|&v| (f64::from(v) - max64).exp()).sum();
    max64 + sum.ln()
}

/// KL(P||Q) for logits `a` (P) and `b` (Q) over the same entries; `a_max` is max(a).
pub(crate) fn kl_f64<T: Copy + Into<f64>>(a: &[T], b: &[T], a_max: f64) -> f64 {
    // Pass 1: unnormalized weights, their sum, and the weighted mean of c = a - b. Entries where P
    // is zero but Q is not carry Q mass that E_p never sees; it is added back as `extra`.
    let mut s = 0.0f64;
    let mut mc = 0.0f64;
    let mut lost: Vec<f64> = Vec::new();
    for (&x, &y) in a.iter().zip(b) {
        let (x, y): (f64, f64) = (x.into(), y.into());
        if x == f64::NEG_INFINITY {
            if y != f64::NEG_INFINITY {
                lost.push(y);
            }
            continue;
        }
        if y == f64::NEG_INFINITY {
            return f64::INFINITY; // P puts mass where Q puts none
        }
        let w = (x - a_max).exp();
        s += w;
        mc += w * (x - y);
    }
    let m = mc / s;
    // Pass 2: the non-negative summands.
    let mut k = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        let (x, y): (f64, f64) = (x.into(), y.into());
        if x == f64::NEG_INFINITY {
            continue;
        }
        let w = (x - a_max).exp();
        k += w * g((x - y) - m);
    }
    k /= s;
    if !lost.is_empty() {
        // E_p[e^-(c-m)] gains Σ_{p=0} e^{b_i} / Σ e^{a_i} · e^m.
        let log_extra = lost.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = lost.iter().map(|&y| (y - log_extra).exp()).sum();
        k += (log_extra + sum.ln() - a_max - s.ln() + m).exp();
    }
    k.ln_1p()
}

/// `expm1(-x) + x`, accurate near zero where it is about x²/2.
fn g(x: f64) -> f64 {
    if x.abs() < 1e-3 {
        // Taylor: x²/2 - x³/6 + x⁴/24 (error below x⁵/120 ≈ 1e-17 relative to x²/2).
        let x2 = x * x;
        x2 * (0.5 - x / 6.0 + x2 / 24.0)
    } else {
        (-x).exp_m1() + x
    }
}

/// The set's full-vocabulary terms, forward and (when wanted) reverse.
fn partial_both(
    a: &[f32],
    b: &[f32],
    lse_a: f64,
    lse_b: f64,
    set: &[u32],
    want_reverse: bool,
) -> (f64, f64) {
    let forward = partial_kl(a, b, lse_a, lse_b, set.iter().copied());
    let reverse = if want_reverse {
        partial_kl(b, a, lse_b, lse_a, set.iter().copied())
    } else {
        f64::NAN
    };
    (forward, reverse)
}

/// Σ_{i in set} p_i (log p_i - log q_i), with full-vocabulary normalization (terms dropped, not
/// renormalized).
fn partial_kl(a: &[f32], b: &[f32], lse_a: f64, lse_b: f64, set: impl Iterator<Item = u32>) -> f64 {
    let mut total = 0.0f64;
    for i in set {
        let (x, y) = (f64::from(a[i as usize]), f64::from(b[i as usize]));
        if x == f64::NEG_INFINITY {
            continue;
        }
        if y == f64::NEG_INFINITY {
            return f64::INFINITY;
        }
        let lp = x - lse_a;
        total += lp.exp() * (lp - (y - lse_b));
    }
    total
}

/// The reference's top k entries, ties broken by lowest token id.
fn top_k_set(x: &[f32], k: usize, out: &mut Vec<u32>) {
    out.clear();
    out.extend(0..x.len() as u32);
    let k = k.min(x.len());
    let order = |&i: &u32, &j: &u32| {
        x[j as usize]
            .partial_cmp(&x[i as usize])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(i.cmp(&j))
    };
    if k < out.len() {
        out.select_nth_unstable_by(k, order);
        out.truncate(k);
    }
    out.sort_unstable();
}

/// Log of the tail mass beyond `set`, as a logit on the same scale as the entries (so the
/// (k+1)-vector normalizes to the lumped distribution), summed from the tail's own entries rather
/// than as `1 - Σ_set p` (no cancellation). An empty tail is -inf (zero mass).
fn tail_logit(x: &[f32], set: &[u32], max: f32) -> f64 {
    let max64 = f64::from(max);
    let mut in_set = set.iter().peekable();
    let mut sum = 0.0f64;
    for (i, &v) in x.iter().enumerate() {
        if in_set.peek().is_some_and(|&&s| s as usize == i) {
            in_set.next();
            continue;
        }
        sum += (f64::from(v) - max64).exp();
    }
    max64 + sum.ln()
}
