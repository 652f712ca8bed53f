//! Claims on a card against a rerun: the verdicts of design.md ("Verdicts"). A claim is
//! `reproduced` only in the same lane on the same token stream, within the claim's printed
//! precision (half a unit in its last printed digit) plus 1e-3 relative numerical noise.

use serde::Serialize;
use serde_json::Value;

use crate::card::yaml::{Node, NodeKind};

/// Relative numerical noise allowed on top of the printed precision.
pub const NOISE_RELATIVE: f64 = 1e-3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Reproduced,
    NotReproduced,
    NotComparable,
    Undisclosed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::NotReproduced => "not_reproduced",
            Verdict::NotComparable => "not_comparable",
            Verdict::Undisclosed => "undisclosed",
        }
    }
}

/// One entry of the card's `fidelity.results`, with the value as printed.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub metric: String,
    pub value: f64,
    /// The value's text in the card, which fixes its printed precision.
    pub text: String,
    pub uncertainty: Option<f64>,
    pub context_length: Option<u64>,
    /// 1-based line of the claim in the card.
    pub line: Option<usize>,
}

/// Read `results` from the card's `fidelity` node (as parsed, with scalar text).
pub fn claims(fidelity: &Node, line_of: &dyn Fn(usize) -> usize) -> Vec<Claim> {
    let Some(results) = fidelity.get("results") else {
        return Vec::new();
    };
    let NodeKind::Seq(items) = &results.value.kind else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let metric = item.get("metric")?.value.as_scalar()?.text.clone();
            let v = item.get("value")?.value.as_scalar()?;
            let value = v.value.as_f64()?;
            Some(Claim {
                metric,
                value,
                text: v.text.clone(),
                uncertainty: item
                    .get("uncertainty")
                    .and_then(|u| u.value.as_scalar())
                    .and_then(|s| s.value.as_f64()),
                context_length: item
                    .get("context_length")
                    .and_then(|u| u.value.as_scalar())
                    .and_then(|s| s.value.as_u64()),
                line: Some(line_of(item.span.start)),
            })
        })
        .collect()
}

/// Half a unit in the last printed digit of a number as written (`0.0123` → 5e-5, `1.5e-3` →
/// 5e-5, `3` → 0.5).
pub fn half_unit(text: &str) -> f64 {
    let t = text.trim().trim_start_matches(['+', '-']);
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().unwrap_or(0)),
        None => (t, 0),
    };
    let decimals = mantissa
        .split_once('.')
        .map_or(0, |(_, frac)| frac.len() as i32);
    0.5 * 10f64.powi(exponent - decimals)
}

/// The comparison of one claim.
#[derive(Debug, Clone, Serialize)]
pub struct ClaimResult {
    pub metric: String,
    pub context_length: Option<u64>,
    pub claimed: f64,
    pub claimed_text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_uncertainty: Option<f64>,
    pub rerun: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun_ci95: Option<[f64; 2]>,
    pub tolerance: f64,
    pub verdict: Verdict,
    pub reason: String,
    pub differences: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

/// What the rerun gives for one metric at one context length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rerun {
    pub value: f64,
    pub ci95: Option<[f64; 2]>,
}

/// Everything besides the numbers that decides a verdict.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Required disclosure items that are missing or too vague (each makes every claim undisclosed).
    pub undisclosed: Vec<String>,
    /// Lane or protocol differences between the card and the rerun (each makes a claim not comparable).
    pub differences: Vec<String>,
    /// Failed sanity gates (fail closed: nothing is reproduced).
    pub failed_gates: Vec<String>,
}

/// Judge one claim. `rerun` looks a metric up at a context length.
pub fn judge(
    claim: &Claim,
    context_lengths: &[u64],
    ctx: &Context,
    rerun: &dyn Fn(&str, u64) -> Option<Rerun>,
) -> ClaimResult {
    let tolerance = half_unit(&claim.text) + NOISE_RELATIVE * claim.value.abs();
    let mut result = ClaimResult {
        metric: claim.metric.clone(),
        context_length: claim.context_length,
        claimed: claim.value,
        claimed_text: claim.text.clone(),
        claimed_uncertainty: claim.uncertainty,
        rerun: None,
        rerun_ci95: None,
        tolerance,
        verdict: Verdict::Undisclosed,
        reason: String::new(),
        differences: Vec::new(),
        line: claim.line,
    };
    if !ctx.undisclosed.is_empty() {
        result.reason = format!(
            "the number cannot be interpreted: {}",
            ctx.undisclosed.join("; ")
        );
        return result;
    }
    let length = match (claim.context_length, context_lengths) {
        (Some(l), _) => l,
        (None, [only]) => *only,
        (None, _) => {
            result.reason = "the claim names no context_length and the protocol has several".into();
            return result;
        }
    };
    result.context_length = Some(length);
    let Some(r) = rerun(&claim.metric, length) else {
        result.reason = format!(
            "the rerun has no {} at context length {length} (not in the disclosed protocol, or not computed)",
            claim.metric
        );
        return result;
    };
    result.rerun = Some(r.value);
    result.rerun_ci95 = r.ci95;
    let diff = (r.value - claim.value).abs();
    if !ctx.failed_gates.is_empty() {
        result.verdict = Verdict::NotReproduced;
        result.reason = format!(
            "a sanity gate failed, so no claim can be reproduced: {}",
            ctx.failed_gates.join("; ")
        );
        return result;
    }
    if !ctx.differences.is_empty() {
        result.verdict = Verdict::NotComparable;
        result.differences = ctx.differences.clone();
        result.reason = format!(
            "measured in another lane or protocol; the rerun's number is shown beside the claim (difference {:.3e})",
            r.value - claim.value
        );
        return result;
    }
    if diff <= tolerance {
        result.verdict = Verdict::Reproduced;
        result.reason = format!(
            "equal within the claim's printed precision (±{:.1e}) plus {NOISE_RELATIVE:e} relative: |rerun - claim| = {diff:.2e} <= {tolerance:.2e}",
            half_unit(&claim.text)
        );
    } else {
        result.verdict = Verdict::NotReproduced;
        result.reason = format!(
            "|rerun - claim| = {diff:.3e} exceeds the tolerance {tolerance:.2e} ({:+.2}% of the claim)",
            100.0 * (r.value - claim.value) / claim.value.abs().max(f64::MIN_POSITIVE)
        );
    }
    result
}

/// The overall verdict: reproduced only when every claim is.
pub fn overall(results: &[ClaimResult]) -> Verdict {
    if results.is_empty() {
        return Verdict::Undisclosed;
    }
    for v in [
        Verdict::NotReproduced,
        Verdict::Undisclosed,
        Verdict::NotComparable,
    ] {
        if results.iter().any(|r| r.verdict == v) {
            return v;
        }
    }
    Verdict::Reproduced
}

/// Counts per verdict, for the report's summary.
pub fn summary(results: &[ClaimResult]) -> Value {
    let count = |v: Verdict| results.iter().filter(|r| r.verdict == v).count();
    serde_json::json!({
        "reproduced": count(Verdict::Reproduced),
        "not_reproduced": count(Verdict::NotReproduced),
        "not_comparable": count(Verdict::NotComparable),
        "undisclosed": count(Verdict::Undisclosed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(text: &str) -> Claim {
        Claim {
            metric: "kld_mean".into(),
            value: text.parse().unwrap(),
            text: text.into(),
            uncertainty: None,
            context_length: Some(256),
            line: None,
        }
    }

    fn run(value: f64) -> impl Fn(&str, u64) -> Option<Rerun> {
        move |m, l| (m == "kld_mean" && l == 256).then_some(Rerun { value, ci95: None })
    }

    #[test]
    fn printed_precision_is_half_a_unit_in_the_last_digit() {
        assert_eq!(half_unit("0.0123"), 0.5e-4);
        assert_eq!(half_unit("0.01230"), 0.5e-5);
        assert_eq!(half_unit("1.5e-3"), 0.5e-4);
        assert_eq!(half_unit("3"), 0.5);
        assert_eq!(half_unit("-2.50"), 0.005);
    }

    #[test]
    fn within_precision_plus_noise_is_reproduced() {
        let c = claim("0.01648");
        let ctx = Context::default();
        // Half unit 5e-6 plus 1e-3 relative (1.6e-5): 2.1e-5.
        assert_eq!(
            judge(&c, &[256], &ctx, &run(0.016476)).verdict,
            Verdict::Reproduced
        );
        assert_eq!(
            judge(&c, &[256], &ctx, &run(0.01650)).verdict,
            Verdict::Reproduced
        );
        assert_eq!(
            judge(&c, &[256], &ctx, &run(0.01651)).verdict,
            Verdict::NotReproduced
        );
    }

    #[test]
    fn a_claim_edited_by_twenty_percent_is_not_reproduced() {
        let r = judge(&claim("0.0198"), &[256], &Context::default(), &run(0.01648));
        assert_eq!(r.verdict, Verdict::NotReproduced);
        assert!(r.reason.contains("exceeds the tolerance"), "{}", r.reason);
    }

    #[test]
    fn lane_differences_make_claims_not_comparable_and_missing_items_undisclosed() {
        let c = claim("0.01648");
        let ctx = Context {
            differences: vec!["engine: card says vllm".into()],
            ..Default::default()
        };
        let r = judge(&c, &[256], &ctx, &run(0.01648));
        assert_eq!(r.verdict, Verdict::NotComparable);
        assert_eq!(r.rerun, Some(0.01648));
        let ctx = Context {
            undisclosed: vec!["kl_direction missing".into()],
            ..Default::default()
        };
        assert_eq!(
            judge(&c, &[256], &ctx, &run(0.01648)).verdict,
            Verdict::Undisclosed
        );
        let ctx = Context {
            failed_gates: vec!["self-compare".into()],
            ..Default::default()
        };
        assert_eq!(
            judge(&c, &[256], &ctx, &run(0.01648)).verdict,
            Verdict::NotReproduced
        );
    }

    #[test]
    fn overall_is_reproduced_only_when_every_claim_is() {
        let c = claim("0.01648");
        let ok = judge(&c, &[256], &Context::default(), &run(0.01648));
        let bad = judge(&c, &[256], &Context::default(), &run(0.03));
        assert_eq!(overall(std::slice::from_ref(&ok)), Verdict::Reproduced);
        assert_eq!(overall(&[ok, bad]), Verdict::NotReproduced);
        assert_eq!(overall(&[]), Verdict::Undisclosed);
    }
}
