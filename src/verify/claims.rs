//! Claims on a card against a rerun: the verdicts of docs/DESIGN.md ("Verification"). A claim is
//! `reproduced` only in the same lane on the same token stream and the same sample, within the
//! claim's printed precision (half a unit in its last printed digit) plus 1e-3 relative numerical
//! noise, and only when that precision means something: a claim whose digits allow more than
//! [`IMPRECISE_RELATIVE`] of its value is `imprecise`. Every entry of `results` gets a verdict;
//! one that cannot be read as a claim is `invalid`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::disclosure::precision::{
    IMPRECISE_RELATIVE, decimals_for, half_unit, precision_scale, relative_precision,
};
pub use crate::disclosure::results::{Claim, claims};

pub use crate::disclosure::precision::NOISE_RELATIVE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Reproduced,
    /// The claim's printed precision is too coarse to be reproduced.
    Imprecise,
    /// The `results` entry cannot be read as a claim.
    Invalid,
    NotReproduced,
    NotComparable,
    Undisclosed,
}

impl Verdict {
    pub const ALL: [Verdict; 6] = [
        Verdict::Reproduced,
        Verdict::NotReproduced,
        Verdict::Imprecise,
        Verdict::Invalid,
        Verdict::NotComparable,
        Verdict::Undisclosed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Imprecise => "imprecise",
            Verdict::Invalid => "invalid",
            Verdict::NotReproduced => "not_reproduced",
            Verdict::NotComparable => "not_comparable",
            Verdict::Undisclosed => "undisclosed",
        }
    }
}

/// The comparison of one claim.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ClaimResult {
    /// Index of the entry in the card's `results`.
    pub index: usize,
    pub metric: String,
    pub context_length: Option<u64>,
    /// The claimed value (null for an invalid entry).
    pub claimed: Option<f64>,
    pub claimed_text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_uncertainty: Option<f64>,
    /// Half a unit in the claim's last printed digit over its scale ([`relative_precision`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_precision_relative: Option<f64>,
    pub rerun: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_ci95: Option<[f64; 2]>,
    pub tolerance: Option<f64>,
    pub verdict: Verdict,
    pub reason: String,
    pub differences: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

/// What the rerun gives for one metric at one context length, and the sample behind it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rerun {
    pub value: f64,
    pub ci95: Option<[f64; 2]>,
    /// Rows scored (finite ones).
    pub n_positions: u64,
    /// Rows excluded as non-finite.
    pub n_nonfinite: u64,
    /// For a turn metric: the turns generated and one count's share of the statistic.
    pub turns: Option<TurnSample>,
}

/// The sample behind a turn metric: every value it can take is a count over a denominator
/// (turns for `turn_match`, the reference's calling turns for `tool_call_match`, the
/// candidate's calls for `tool_call_valid`, 2tp + fp + fn for `tool_call_f1`), and `step` is
/// one over that denominator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnSample {
    pub turns: u64,
    pub step: f64,
}

/// A turn metric claim is `imprecise` when its printed half-unit exceeds half a count's share:
/// its digits then fit more than one count.
pub const TURN_IMPRECISE: f64 = 0.5;

/// Everything besides the numbers that decides a verdict.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Required disclosure items that are missing or too vague (each makes every claim undisclosed).
    pub undisclosed: Vec<String>,
    /// Lane or protocol differences between the card and the rerun (each makes a claim not comparable).
    pub differences: Vec<String>,
    /// Failed sanity gates (fail closed: nothing is reproduced).
    pub failed_gates: Vec<String>,
    /// Lint errors of the card (fail closed: nothing on an erroneous card is reproduced).
    pub lint_errors: Vec<String>,
    /// The rerun was not run because its pre-flight found the files given are not the ones the
    /// card names (`differences` says how); what the protocol would have computed.
    pub not_rerun: Option<NotRerun>,
    /// The card states `protocol.turns` (without it a turn metric is undisclosed).
    pub turns_disclosed: bool,
}

/// What a rerun stopped at its pre-flight would have computed: the directions of its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotRerun {
    pub forward: bool,
    pub reverse: bool,
}

impl NotRerun {
    /// Whether the rerun would have had this metric (the KL metrics of its directions, and the
    /// rest always).
    fn computes(self, metric: &str) -> bool {
        use crate::disclosure::vocabulary::{is_forward_kl, is_reverse_kl};
        if is_reverse_kl(metric) {
            self.reverse
        } else if is_forward_kl(metric) {
            self.forward
        } else {
            true
        }
    }
}

/// Where the card's sample and the rerun's differ for one claim.
fn sample_differences(claim: &Claim, r: &Rerun) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(t) = r.turns {
        if let Some(n) = claim.n_turns
            && n != t.turns
        {
            out.push(format!("turns generated: card {n}, rerun {}", t.turns));
        }
        return out;
    }
    if let Some(n) = claim.n_positions
        && n != r.n_positions
    {
        out.push(format!("rows scored: card {n}, rerun {}", r.n_positions));
    }
    let disclosed = claim.n_nonfinite.unwrap_or(0);
    if disclosed != r.n_nonfinite {
        out.push(format!(
            "rows excluded as non-finite: card {}, rerun {}",
            claim
                .n_nonfinite
                .map_or("none disclosed".to_owned(), |n| n.to_string()),
            r.n_nonfinite
        ));
    }
    out
}

/// Judge one claim. `rerun` looks a metric up at a context length (`None` for a turn metric,
/// which is measured once over the generated turns).
pub fn judge(
    claim: &Claim,
    context_lengths: &[u64],
    ctx: &Context,
    rerun: &dyn Fn(&str, Option<u64>) -> Option<Rerun>,
) -> ClaimResult {
    let mut result = unjudged(claim);
    if let Some(why) = &claim.invalid {
        result.verdict = Verdict::Invalid;
        result.reason = format!("results[{}] cannot be read as a claim: {why}", claim.index);
        return result;
    }
    let tolerance =
        crate::disclosure::precision::tolerance(&claim.metric, &claim.text, claim.value);
    let precision = relative_precision(&claim.metric, &claim.text, claim.value);
    result.tolerance = Some(tolerance);
    result.claimed_precision_relative = precision.is_finite().then_some(precision);
    if !ctx.undisclosed.is_empty() {
        // The items themselves are the report's `undisclosed` list (one entry each), not
        // repeated in every claim's reason as one long line.
        let n = ctx.undisclosed.len();
        result.reason = format!(
            "the number cannot be interpreted: {n} disclosure item{} missing or too vague (listed \
             under `undisclosed`)",
            if n == 1 { " is" } else { "s are" }
        );
        return result;
    }
    let turn = crate::disclosure::vocabulary::is_turn_metric(&claim.metric);
    let length = match (turn, claim.context_length, context_lengths) {
        (true, _, _) => None,
        (false, Some(l), _) => Some(l),
        (false, None, [only]) => Some(*only),
        (false, None, _) => {
            result.reason = "the claim names no context_length and the protocol has several".into();
            return result;
        }
    };
    result.context_length = length;
    let r = match rerun(&claim.metric, length) {
        Some(r) => Some(r),
        // Not rerun: judged as far as the card alone allows, never reproduced.
        None if ctx.not_rerun.is_some_and(|n| n.computes(&claim.metric))
            && (turn || length.is_some_and(|l| context_lengths.contains(&l))) =>
        {
            None
        }
        None => return missing_number(claim, length, ctx, result),
    };
    if let Some(r) = r {
        result.rerun = Some(r.value);
        result.rerun_ci95 = r.ci95;
    }
    if let Some(t) = r.and_then(|r| r.turns) {
        // A share of counts: its digits must single out one count.
        let per_count = half_unit(&claim.text) / t.step;
        result.claimed_precision_relative = Some(per_count);
        if per_count > TURN_IMPRECISE {
            result.verdict = Verdict::Imprecise;
            result.reason = format!(
                "printed as {}, the claim only says ±{:.1e}, more than half of one count's share \
                 of {} ({:.3e}): its digits fit more than one count; print it to within half a \
                 count (`card` prints 6 decimals)",
                claim.text,
                half_unit(&claim.text),
                claim.metric,
                t.step
            );
            return result;
        }
    } else if !turn && precision > IMPRECISE_RELATIVE {
        result.verdict = Verdict::Imprecise;
        result.reason = imprecise_reason(claim, precision, r);
        return result;
    }
    if let Some((verdict, reason, differences)) = blocked_by_context(claim, ctx, r) {
        result.verdict = verdict;
        result.reason = reason;
        result.differences = differences;
        return result;
    }
    // Fail closed: a claim that was not rerun is never judged on numbers.
    let Some(r) = r else {
        result.verdict = Verdict::NotComparable;
        result.reason = "not rerun, so not compared".into();
        return result;
    };
    let sample = sample_differences(claim, &r);
    if !sample.is_empty() {
        result.verdict = Verdict::NotReproduced;
        result.reason = format!(
            "the rerun's sample is not the card's: {}",
            sample.join("; ")
        );
        result.differences = sample;
        return result;
    }
    (result.verdict, result.reason) = compare(claim, &r, tolerance);
    result
}

/// A claim the rerun has no number for: a context length outside the protocol, a metric not
/// computed, turns not disclosed (undisclosed), or a turn metric undefined on the rerun's turns
/// (a share of no calls: the claim's number is not reproduced).
fn missing_number(
    claim: &Claim,
    length: Option<u64>,
    ctx: &Context,
    mut result: ClaimResult,
) -> ClaimResult {
    result.reason = match length {
        Some(length) => format!(
            "the rerun has no {} at context length {length} (not in the disclosed protocol, or not computed)",
            claim.metric
        ),
        None if !ctx.turns_disclosed => format!(
            "{} is a turn metric and the card does not state `protocol.turns` (how its turns were generated)",
            claim.metric
        ),
        None => {
            result.verdict = Verdict::NotReproduced;
            format!(
                "{} is undefined on the rerun's turns (a share of no calls), so no number reproduces it",
                claim.metric
            )
        }
    };
    result
}

/// A claim's result before any judgement: what it says, verdict `undisclosed`.
fn unjudged(claim: &Claim) -> ClaimResult {
    ClaimResult {
        index: claim.index,
        metric: claim.metric.clone(),
        context_length: claim.context_length,
        claimed: claim.value.is_finite().then_some(claim.value),
        claimed_text: claim.text.clone(),
        claimed_uncertainty: claim.uncertainty,
        claimed_precision_relative: None,
        rerun: None,
        rerun_ci95: None,
        tolerance: None,
        verdict: Verdict::Undisclosed,
        reason: String::new(),
        differences: Vec::new(),
        line: claim.line,
    }
}

/// Why a claim printed too coarsely (or at its metric's bound) is `imprecise`.
fn imprecise_reason(claim: &Claim, precision: f64, r: Option<Rerun>) -> String {
    if precision.is_finite() {
        format!(
            "printed as {}, the claim only says ±{:.1e}, {:.1}% of its {}; a claim must be printed to within {}% to be reproduced",
            claim.text,
            half_unit(&claim.text),
            100.0 * precision,
            scale_name(&claim.metric),
            100.0 * IMPRECISE_RELATIVE
        )
    } else {
        match r {
            Some(r) => format!(
                "printed as {}, a value at the metric's bound: its digits say nothing about the distance from it (print the measured value, e.g. {:.4e})",
                claim.text, r.value
            ),
            None => format!(
                "printed as {}, a value at the metric's bound: its digits say nothing about the distance from it (print the measured value)",
                claim.text
            ),
        }
    }
}

/// The verdict the run's context forces on every claim, whatever its number: a failed sanity
/// gate or a lint error (not reproduced), or a lane or protocol the card does not state (not
/// comparable, with the differences).
fn blocked_by_context(
    claim: &Claim,
    ctx: &Context,
    r: Option<Rerun>,
) -> Option<(Verdict, String, Vec<String>)> {
    if !ctx.failed_gates.is_empty() {
        return Some((
            Verdict::NotReproduced,
            format!(
                "a sanity gate failed, so no claim can be reproduced: {}",
                ctx.failed_gates.join("; ")
            ),
            Vec::new(),
        ));
    }
    if !ctx.lint_errors.is_empty() {
        return Some((
            Verdict::NotReproduced,
            format!(
                "the card has lint errors, so no claim on it is reproduced: {}",
                ctx.lint_errors.join("; ")
            ),
            Vec::new(),
        ));
    }
    if !ctx.differences.is_empty() {
        let reason = match r {
            Some(r) => format!(
                "measured in another lane or protocol; the rerun's number is shown beside the claim (difference {:.3e})",
                r.value - claim.value
            ),
            // The differences themselves are the claim's `differences`, listed once.
            None => "not rerun: the files given are not the ones the card names (listed under differences), so no rerun of them could be compared with the claim".into(),
        };
        return Some((Verdict::NotComparable, reason, ctx.differences.clone()));
    }
    None
}

/// The numbers compared: reproduced when the rerun is within the claim's tolerance.
fn compare(claim: &Claim, r: &Rerun, tolerance: f64) -> (Verdict, String) {
    let diff = (r.value - claim.value).abs();
    if r.turns.is_some() && diff <= tolerance {
        return (
            Verdict::Reproduced,
            format!(
                "equal within the claim's printed precision (±{:.1e}; a share of counts has no numerical noise): |rerun - claim| = {diff:.2e} <= {tolerance:.2e}",
                half_unit(&claim.text),
            ),
        );
    }
    if crate::disclosure::precision::is_exact_no_change(&claim.metric, claim.value) {
        return if r.value == claim.value {
            (
                Verdict::Reproduced,
                format!(
                    "the claim states no change at all ({} exactly {}: identical distributions), and the rerun measured exactly that",
                    claim.metric, claim.text
                ),
            )
        } else {
            (
                Verdict::NotReproduced,
                format!(
                    "the claim states no change at all ({} exactly {}: identical distributions), but the rerun measured {:e}",
                    claim.metric, claim.text, r.value
                ),
            )
        };
    }
    if diff <= tolerance {
        (
            Verdict::Reproduced,
            format!(
                "equal within the claim's printed precision (±{:.1e}) plus {NOISE_RELATIVE:e} of its {}: |rerun - claim| = {diff:.2e} <= {tolerance:.2e}",
                half_unit(&claim.text),
                scale_name(&claim.metric)
            ),
        )
    } else {
        (
            Verdict::NotReproduced,
            format!(
                "|rerun - claim| = {diff:.3e} exceeds the tolerance {tolerance:.2e} ({:+.2}% of the claim)",
                100.0 * (r.value - claim.value) / claim.value.abs().max(f64::MIN_POSITIVE)
            ),
        )
    }
}

fn scale_name(metric: &str) -> &'static str {
    match metric {
        "top1_agreement" => "distance from agreement 1",
        "same_top_p" => "distance from 100%",
        "ppl_ratio" => "distance from a ratio of 1",
        _ => "value",
    }
}

/// The overall verdict: reproduced only when there are claims and every one is.
pub fn overall(results: &[ClaimResult]) -> Verdict {
    worst(results.iter().map(|r| r.verdict))
}

/// The verdict that speaks for several (claims, or the files of a card): `reproduced` only when
/// every one is, `undisclosed` for none; else the first present of not reproduced, invalid,
/// imprecise, undisclosed, not comparable.
pub fn worst(verdicts: impl IntoIterator<Item = Verdict>) -> Verdict {
    let verdicts: Vec<Verdict> = verdicts.into_iter().collect();
    if verdicts.is_empty() {
        return Verdict::Undisclosed;
    }
    for v in [
        Verdict::NotReproduced,
        Verdict::Invalid,
        Verdict::Imprecise,
        Verdict::Undisclosed,
        Verdict::NotComparable,
    ] {
        if verdicts.contains(&v) {
            return v;
        }
    }
    Verdict::Reproduced
}

/// Counts per verdict, for the report's summary.
pub fn summary(results: &[ClaimResult]) -> std::collections::BTreeMap<String, usize> {
    Verdict::ALL
        .iter()
        .map(|&v| {
            let n = results.iter().filter(|r| r.verdict == v).count();
            (v.as_str().to_owned(), n)
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    fn claim(text: &str) -> Claim {
        Claim {
            index: 0,
            metric: "kld_mean".into(),
            value: text.parse().unwrap(),
            text: text.into(),
            uncertainty: None,
            context_length: Some(256),
            n_positions: None,
            n_nonfinite: None,
            n_turns: None,
            line: None,
            invalid: None,
        }
    }

    fn rerun_of(value: f64) -> Rerun {
        Rerun {
            value,
            ci95: None,
            n_positions: 10965,
            n_nonfinite: 0,
            turns: None,
        }
    }

    fn run(value: f64) -> impl Fn(&str, Option<u64>) -> Option<Rerun> {
        move |_, l| (l == Some(256)).then_some(rerun_of(value))
    }

    /// The claims of a `results:` list written in YAML.
    fn parsed(results_yaml: &str) -> Vec<Claim> {
        let text = format!("results:\n{results_yaml}");
        let node = crate::card::yaml::parse(&text, 0, Default::default())
            .unwrap()
            .unwrap();
        claims(&node, &|_| 1)
    }

    fn verdict_of(results_yaml: &str, value: f64) -> Vec<(Verdict, String)> {
        parsed(results_yaml)
            .iter()
            .map(|c| {
                let r = judge(c, &[256], &Context::default(), &run(value));
                (r.verdict, r.reason)
            })
            .collect()
    }

    #[test]
    fn a_claim_not_rerun_is_never_reproduced_and_keeps_the_cards_own_verdicts() {
        let not_rerun = Context {
            differences: vec!["reference files (root sha256): card a, given files b".into()],
            not_rerun: Some(NotRerun {
                forward: true,
                reverse: false,
            }),
            ..Context::default()
        };
        let none = |_: &str, _: Option<u64>| None;
        let r = judge(&claim("0.01648"), &[256], &not_rerun, &none);
        assert_eq!(r.verdict, Verdict::NotComparable);
        assert!(r.reason.starts_with("not rerun:"), "{}", r.reason);
        assert_eq!(r.rerun, None);
        assert_eq!(
            r.differences,
            ["reference files (root sha256): card a, given files b"]
        );
        // What the card alone decides is decided as with a rerun.
        assert_eq!(
            judge(&claim("0.002"), &[256], &not_rerun, &none).verdict,
            Verdict::Imprecise
        );
        let mut reverse = claim("0.01648");
        reverse.metric = "kld_reverse_mean".into();
        assert_eq!(
            judge(&reverse, &[256], &not_rerun, &none).verdict,
            Verdict::Undisclosed,
            "a direction the protocol does not compute"
        );
        assert_eq!(
            judge(&claim("0.01648"), &[512], &not_rerun, &none).verdict,
            Verdict::Undisclosed,
            "a context length the protocol does not run"
        );
        let lint = Context {
            lint_errors: vec!["schema: broken".into()],
            ..not_rerun.clone()
        };
        assert_eq!(
            judge(&claim("0.01648"), &[256], &lint, &none).verdict,
            Verdict::NotReproduced
        );
        // Fail closed: not rerun and no difference recorded is still no reproduction.
        let bare = Context {
            differences: Vec::new(),
            ..not_rerun
        };
        assert_eq!(
            judge(&claim("0.01648"), &[256], &bare, &none).verdict,
            Verdict::NotComparable
        );
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

    /// Regression (#41): the noise allowance was 1e-3 of the value, a flat 0.1% slack on a
    /// ratio or agreement near 1, so a KV-only card claiming a perplexity change 335× too small
    /// was reproduced. Judged on the distance from "no change", each is not reproduced, and a
    /// claim printed as `card` prints it still is.
    #[test]
    fn bounded_metrics_are_judged_on_their_distance_from_no_change() {
        use Verdict::{NotReproduced, Reproduced};
        for (metric, text, rerun, expected) in [
            ("ppl_ratio", "1.00000100", 1.000335, NotReproduced),
            ("ppl_ratio", "1.00012", 1.001122, NotReproduced),
            ("top1_agreement", "0.9899", 0.98887, NotReproduced),
            ("same_top_p", "98.99", 98.887, NotReproduced),
            ("ppl_ratio", "1.0003350", 1.00033504, Reproduced),
            ("ppl_ratio", "0.9996650", 0.99966496, Reproduced),
            ("top1_agreement", "0.98887", 0.988871, Reproduced),
            ("kld_mean", "0.004185", 0.0041851, Reproduced),
        ] {
            let c = Claim {
                metric: metric.into(),
                ..claim(text)
            };
            let r = judge(&c, &[256], &Context::default(), &run(rerun));
            assert_eq!(
                r.verdict, expected,
                "{metric} {text} vs {rerun}: {}",
                r.reason
            );
            let scale = precision_scale(metric, c.value);
            assert_eq!(
                r.tolerance,
                Some(half_unit(text) + NOISE_RELATIVE * scale),
                "{metric} {text}"
            );
        }
    }

    #[test]
    fn a_claim_edited_by_twenty_percent_is_not_reproduced() {
        let r = judge(&claim("0.0198"), &[256], &Context::default(), &run(0.01648));
        assert_eq!(r.verdict, Verdict::NotReproduced);
        assert!(r.reason.contains("exceeds the tolerance"), "{}", r.reason);
    }

    #[test]
    fn coarse_precision_is_imprecise_never_reproduced() {
        // Imprecise: each was `reproduced` when the tolerance was half a unit of the last digit.
        // Reproduced: fine enough (0.3%, 0.08% of the disagreement, 2.3% of the PPL change).
        use Verdict::{Imprecise, NotReproduced, Reproduced};
        for (metric, text, rerun, expected) in [
            // No change at all is an exact claim: only identical distributions reproduce it.
            ("kld_mean", "0", 0.0166, NotReproduced),
            ("kld_mean", "0.0", 0.0166, NotReproduced),
            ("kld_mean", "0e0", 1e-12, NotReproduced),
            ("kld_mean", "0.0", 0.0, Reproduced),
            ("top1_agreement", "1", 0.9342, NotReproduced),
            ("top1_agreement", "1.0", 0.9987, NotReproduced),
            ("top1_agreement", "1.0", 1.0, Reproduced),
            ("ppl_ratio", "1.00", 1.0021, NotReproduced),
            ("kld_mean", "0.02", 0.0166, Imprecise),
            ("top1_agreement", "0.99", 0.9912, Imprecise),
            ("ppl_ratio", "1.002", 1.0021, Imprecise),
            ("kld_mean", "0.0166", 0.0166, Reproduced),
            ("top1_agreement", "0.9342", 0.9342, Reproduced),
            ("ppl_ratio", "1.022", 1.022, Reproduced),
        ] {
            let c = Claim {
                metric: metric.into(),
                ..claim(text)
            };
            let r = judge(&c, &[256], &Context::default(), &run(rerun));
            assert_eq!(r.verdict, expected, "{metric} {text}: {}", r.reason);
            assert_eq!(r.rerun, Some(rerun), "the rerun's number is shown");
        }
        let r = judge(&claim("0.02"), &[256], &Context::default(), &run(0.0166));
        assert!(r.reason.contains("25.0%"), "{}", r.reason);
        assert_eq!(overall(&[r]), Verdict::Imprecise);
    }

    #[test]
    fn decimals_for_keeps_four_significant_digits_of_the_scale() {
        assert_eq!(decimals_for("kld_mean", 0.016612), Some(5));
        assert_eq!(decimals_for("ppl_ratio", 1.0021), Some(6));
        assert_eq!(decimals_for("top1_agreement", 0.9342), Some(5));
        assert_eq!(decimals_for("top1_agreement", 1.0), None);
        for (metric, v) in [
            ("ppl_ratio", 1.00213),
            ("top1_agreement", 0.99871),
            ("kld_p999", 3.1),
        ] {
            let d = decimals_for(metric, v).unwrap() as usize;
            let text = format!("{v:.d$}");
            assert!(
                relative_precision(metric, &text, text.parse().unwrap()) <= 0.001,
                "{text}"
            );
        }
    }

    #[test]
    fn unreadable_results_entries_are_invalid_not_dropped() {
        let yaml = r#"- {metric: kld_mean, value: 0.01648, context_length: 256}
- {metric: kld_mean, value: "0.01648", context_length: 256}
- {metric: kld_mean, value: about 0.016, context_length: 256}
- {metric: kld_mean, value: .inf, context_length: 256}
- {metric: kld_mean, value: .nan, context_length: 256}
- {metric: kld_mean, value: -0.01, context_length: 256}
- {metric: top1_agreement, value: 1.5, context_length: 256}
- {metric: kld_mean, value: 0x1F, context_length: 256}
- {metric: kld_mean, value: .0165, context_length: 256}
- {metric: kld_mean, value: 1648e-5, context_length: 256}
- {metric: kld_mean, value: 16e-3, context_length: 256}
- {metric: kld_mean, valeu: 0.01648, context_length: 256}
- {metric: kld_mean, value: 0.01648, contex_length: 256}
- {metric: kld_meen, value: 0.01648, context_length: 256}
- {value: 0.01648, context_length: 256}
- {metric: kld_mean, value: 0.01648, context_length: 1.5}
- {metric: kld_mean, value: 0.01648, context_length: 256, level: 2.0}
- {metric: kld_mean, value: [0.01648], context_length: 256}
- just text
"#;
        let verdicts = verdict_of(yaml, 0.01648);
        assert_eq!(verdicts.len(), 19, "every entry gets a verdict");
        assert_eq!(verdicts[0].0, Verdict::Reproduced, "{}", verdicts[0].1);
        for (i, (v, reason)) in verdicts.iter().enumerate().skip(1) {
            assert_eq!(*v, Verdict::Invalid, "entry {i}: {reason}");
            assert!(reason.starts_with(&format!("results[{i}]")), "{reason}");
        }
        assert!(verdicts[1].1.contains("quoted"), "{}", verdicts[1].1);
        // A signed exponent after a `.` is a number to every reader.
        let ok = verdict_of(
            "- {metric: kld_mean, value: 1.648e-02, context_length: 256}\n",
            0.01648,
        );
        assert_eq!(ok[0].0, Verdict::Reproduced, "{}", ok[0].1);
        assert!(
            verdicts[12].1.contains("did you mean `context_length`"),
            "{}",
            verdicts[12].1
        );
        assert!(
            verdicts[13].1.contains("did you mean `kld_mean`"),
            "{}",
            verdicts[13].1
        );
        let results: Vec<ClaimResult> = parsed(yaml)
            .iter()
            .map(|c| judge(c, &[256], &Context::default(), &run(0.01648)))
            .collect();
        assert_eq!(overall(&results), Verdict::Invalid);
        assert_eq!(summary(&results)["invalid"], 18);
        // A `results` that is not a list is one invalid verdict, not none.
        let node = crate::card::yaml::parse("results: {metric: kld_mean}\n", 0, Default::default())
            .unwrap()
            .unwrap();
        let c = claims(&node, &|_| 1);
        assert_eq!(c.len(), 1);
        assert!(c[0].invalid.is_some());
    }

    #[test]
    fn a_sample_other_than_the_cards_is_not_reproduced() {
        let mut c = claim("0.01648");
        c.n_positions = Some(10965);
        let ctx = Context::default();
        let same = |_: &str, _: Option<u64>| Some(rerun_of(0.01648));
        assert_eq!(judge(&c, &[256], &ctx, &same).verdict, Verdict::Reproduced);
        // 255 rows dropped as non-finite, not disclosed: the sample differs.
        let dropped = |_: &str, _: Option<u64>| {
            Some(Rerun {
                n_positions: 10710,
                n_nonfinite: 255,
                ..rerun_of(0.01648)
            })
        };
        let r = judge(&c, &[256], &ctx, &dropped);
        assert_eq!(r.verdict, Verdict::NotReproduced, "{}", r.reason);
        assert!(
            r.reason.contains("rows scored: card 10965, rerun 10710"),
            "{}",
            r.reason
        );
        assert!(
            r.reason
                .contains("non-finite: card none disclosed, rerun 255"),
            "{}",
            r.reason
        );
        // Disclosed exactly: the sample is the card's.
        c.n_positions = Some(10710);
        c.n_nonfinite = Some(255);
        assert_eq!(
            judge(&c, &[256], &ctx, &dropped).verdict,
            Verdict::Reproduced
        );
    }

    #[test]
    fn lint_errors_fail_every_claim() {
        let ctx = Context {
            lint_errors: vec!["quantization-mismatch (line 20)".into()],
            ..Default::default()
        };
        let r = judge(&claim("0.01648"), &[256], &ctx, &run(0.01648));
        assert_eq!(r.verdict, Verdict::NotReproduced);
        assert!(r.reason.contains("quantization-mismatch"), "{}", r.reason);
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

    /// A turn metric's rerun: `hits` of `of` over `turns` turns.
    fn turn_rerun(hits: u64, of: u64, turns: u64) -> impl Fn(&str, Option<u64>) -> Option<Rerun> {
        move |_, l| {
            (l.is_none()).then_some(Rerun {
                value: hits as f64 / of as f64,
                ci95: None,
                n_positions: 0,
                n_nonfinite: 0,
                turns: Some(TurnSample {
                    turns,
                    step: 1.0 / of as f64,
                }),
            })
        }
    }

    fn turns_ctx() -> Context {
        Context {
            turns_disclosed: true,
            ..Context::default()
        }
    }

    #[test]
    fn turn_claims_are_judged_on_counts_not_context_lengths() {
        let judged = |yaml: &str, hits, of| {
            let c = &parsed(yaml)[0];
            let r = judge(c, &[256, 1024], &turns_ctx(), &turn_rerun(hits, of, 36));
            (r.verdict, r.reason)
        };
        // 30 of 36 turns: 0.833333...; six decimals, four, and the exact value all single out 30.
        for text in ["0.833333", "0.8333", "0.83"] {
            let y = format!("- {{metric: turn_match, value: {text}, n_turns: 36}}\n");
            assert_eq!(judged(&y, 30, 36).0, Verdict::Reproduced, "{text}");
        }
        // 0.8 says ±0.05, which fits 29, 30 and 31 of 36 turns: imprecise, whatever the count.
        let (v, why) = judged("- {metric: turn_match, value: 0.8, n_turns: 36}\n", 30, 36);
        assert_eq!(v, Verdict::Imprecise, "{why}");
        assert!(why.contains("more than one count"), "{why}");
        // One turn off is not reproduced.
        let y = "- {metric: turn_match, value: 0.805556, n_turns: 36}\n";
        assert_eq!(judged(y, 30, 36).0, Verdict::NotReproduced);
        // A perfect share printed as `1` says nothing; `1.000` with 36 turns does.
        assert_eq!(
            judged(
                "- {metric: tool_call_valid, value: 1, n_turns: 36}\n",
                12,
                12
            )
            .0,
            Verdict::Imprecise
        );
        assert_eq!(
            judged(
                "- {metric: tool_call_valid, value: 1.000, n_turns: 36}\n",
                12,
                12
            )
            .0,
            Verdict::Reproduced
        );
        // Another number of turns is another sample.
        let (v, why) = judged(
            "- {metric: turn_match, value: 0.833333, n_turns: 30}\n",
            30,
            36,
        );
        assert_eq!(v, Verdict::NotReproduced, "{why}");
        assert!(why.contains("turns generated: card 30, rerun 36"), "{why}");
    }

    #[test]
    fn turn_claims_without_turns_are_undisclosed_and_undefined_shares_not_reproduced() {
        let c = &parsed("- {metric: tool_call_match, value: 0.5, n_turns: 4}\n")[0];
        let none = |_: &str, _: Option<u64>| None;
        let r = judge(c, &[256], &Context::default(), &none);
        assert_eq!(r.verdict, Verdict::Undisclosed, "{}", r.reason);
        assert!(r.reason.contains("protocol.turns"), "{}", r.reason);
        let r = judge(c, &[256], &turns_ctx(), &none);
        assert_eq!(r.verdict, Verdict::NotReproduced, "{}", r.reason);
        assert!(r.reason.contains("undefined"), "{}", r.reason);
    }

    #[test]
    fn turn_claims_refuse_row_keys_and_row_claims_refuse_n_turns() {
        let c = &parsed("- {metric: turn_match, value: 0.5, context_length: 256}\n")[0];
        assert!(
            c.invalid
                .as_deref()
                .unwrap()
                .contains("`context_length` on a turn metric")
        );
        let c = &parsed("- {metric: kld_mean, value: 0.5, n_turns: 3}\n")[0];
        assert!(
            c.invalid
                .as_deref()
                .unwrap()
                .contains("`n_turns` on kld_mean")
        );
        let c = &parsed("- {metric: tool_call_f1, value: 1.5}\n")[0];
        assert!(c.invalid.as_deref().unwrap().contains("out of range"));
    }
}
