//! The precision a printed number states: half a unit in its last digit, judged against the
//! metric's scale. Shared by `verify` (the `imprecise` verdict) and `card` (which prints claims
//! fine enough never to be imprecise).

/// The widest printed precision, relative to the claim's scale, that can still be reproduced:
/// `0.02` (±0.005, 25%) says too little to be checked, `0.0166` (±0.3%) does not.
pub const IMPRECISE_RELATIVE: f64 = 0.05;

/// Decimals `card` prints a turn metric with: half a unit (5e-7) is under half of one turn's
/// share for any number of turns a run allows (1 / 100,000).
pub const TURN_DECIMALS: u32 = 6;

/// Relative numerical noise allowed on top of the printed precision (verify's tolerance, and
/// lint's when it compares a prose number with the block's claim).
pub const NOISE_RELATIVE: f64 = 1e-3;

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

/// The quantity a claim carries its information in: its distance from "no change". KL
/// divergences and `delta_p_rms` from 0, `ppl_ratio` from 1, agreements from 1 (`same_top_p` from
/// 100%); perplexities themselves have no "no change" value and count from 0. Both the `imprecise`
/// rule and the numerical noise of [`tolerance`] are judged on it: a top-1 agreement of `0.99`
/// says ±0.005 of a disagreement of 0.01; a PPL ratio of `1.00` says nothing about a change of
/// 0.2%, and 1e-3 of a ratio near 1 would be a flat slack of 0.1%.
pub fn precision_scale(metric: &str, value: f64) -> f64 {
    match metric {
        "top1_agreement" => (1.0 - value).max(0.0),
        "same_top_p" => (100.0 - value).max(0.0),
        "ppl_ratio" => (value - 1.0).abs(),
        _ => value.abs(),
    }
}

/// A claim of no change at all: a KL divergence or `delta_p_rms` of exactly 0, a
/// `top1_agreement` or `ppl_ratio` of exactly 1, a `same_top_p` of exactly 100 (a lossless file,
/// a BF16 GGUF of a BF16 model). It states that the two distributions are identical, which no
/// number of digits makes more precise: such a claim is precise as written (`0.0`, `0`, `1.0`),
/// and only a rerun of exactly that value reproduces it (tolerance 0). Perplexities have no such
/// value and turn metrics are shares of counts.
pub fn is_exact_no_change(metric: &str, value: f64) -> bool {
    match metric {
        "top1_agreement" | "ppl_ratio" => value == 1.0,
        "same_top_p" => value == 100.0,
        "ppl_ref" | "ppl_cand" => false,
        m if crate::disclosure::vocabulary::is_turn_metric(m) => false,
        _ => value == 0.0,
    }
}

/// How far a rerun may be from a claim and still reproduce it: half a unit in the claim's last
/// printed digit plus [`NOISE_RELATIVE`] of the claim's distance from "no change"
/// ([`precision_scale`]), `half_unit(text) + 1e-3 * scale(metric, claim)`; 0 for a claim of no
/// change at all ([`is_exact_no_change`]).
pub fn tolerance(metric: &str, text: &str, claim: f64) -> f64 {
    if is_exact_no_change(metric, claim) {
        return 0.0;
    }
    if crate::disclosure::vocabulary::is_turn_metric(metric) {
        // Shares of counts from a deterministic decode: no numerical noise to allow for.
        return half_unit(text);
    }
    half_unit(text) + NOISE_RELATIVE * precision_scale(metric, claim)
}

/// The verdict rule in words, with its formula (README, report.json's `definitions`).
pub const TOLERANCE_RULE: &str = "reproduced when |rerun - claim| <= half_unit(claim as printed) + 1e-3 * scale(claim), where scale is the claim's distance from no change: |value| for KL metrics, delta_p_rms and perplexities, |value - 1| for ppl_ratio, 1 - value for top1_agreement, 100 - value for same_top_p; imprecise (never reproduced) when half_unit / scale > 0.05. A claim of no change at all (a KL metric or delta_p_rms of exactly 0, top1_agreement or ppl_ratio of exactly 1, same_top_p of exactly 100) states identical distributions: precise as written, reproduced only by a rerun of exactly that value. Turn metrics (tool_call_f1, tool_call_valid, tool_call_match, turn_match), shares of counts: reproduced when |rerun - claim| <= half_unit(claim as printed); imprecise when half_unit exceeds half of one count's share (1 / the statistic's denominator: turns, calling turns, calls, or 2tp + fp + fn)";

/// The printed precision relative to the claim's scale (infinite for a value at its bound, 0 for
/// a claim of no change at all, which is exact as written: [`is_exact_no_change`]).
pub fn relative_precision(metric: &str, text: &str, value: f64) -> f64 {
    if is_exact_no_change(metric, value) {
        return 0.0;
    }
    let scale = precision_scale(metric, value);
    if scale > 0.0 {
        half_unit(text) / scale
    } else {
        f64::INFINITY
    }
}

/// Decimal places to print a metric with so that its precision is 4 significant digits of its
/// scale (what `card` writes: always far finer than [`IMPRECISE_RELATIVE`]).
pub fn decimals_for(metric: &str, value: f64) -> Option<u32> {
    if crate::disclosure::vocabulary::is_turn_metric(metric) {
        // A share of at most 100,000 turns or calls: 6 decimals tell every count apart.
        return Some(TURN_DECIMALS);
    }
    let scale = precision_scale(metric, value);
    if !(scale.is_finite() && scale > 0.0) {
        return None;
    }
    let digits = 3 - scale.log10().floor() as i32;
    Some(digits.clamp(0, 17) as u32)
}

/// A claim's value as `card` prints it: rounded to [`decimals_for`] places, trailing zeros kept
/// (they are part of the stated precision).
pub fn claim_text(metric: &str, value: f64) -> Option<String> {
    let d = decimals_for(metric, value)?.max(1) as usize;
    Some(format!("{value:.d$}"))
}

/// A claim's value rounded as `card` prints it.
pub fn round_claim(metric: &str, value: f64) -> f64 {
    claim_text(metric, value)
        .and_then(|t| t.parse().ok())
        .unwrap_or(value)
}

/// `x` rounded to `digits` significant digits (0 and non-finite values as they are).
pub fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(digits - 1 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

/// How a plain decimal is written: the digits after its point and its exponent (`0.0120` →
/// (4, 0), `1.50e-3` → (2, -3), `3` → (0, 0)); `None` for anything that is not a plain decimal
/// (a card's text is untrusted: `.inf`, `0x1F` and `1_000` are not shown as digits).
pub fn written_digits(text: &str) -> Option<(usize, i32)> {
    let t = text.trim();
    let t = t.strip_prefix(['+', '-']).unwrap_or(t);
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => {
            let e = &t[i + 1..];
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            (&t[..i], e.parse::<i32>().ok()?)
        }
        None => (t, 0),
    };
    let (whole, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let plain = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !plain(whole) || !plain(frac) || frac.len() > 17 {
        return None;
    }
    Some((frac.len(), exponent))
}

/// A rerun value printed beside a claim: one digit finer than the claim's last written digit, in
/// the claim's notation, trailing zeros kept (claim `0.0120`, rerun 0.011993 → `0.01199`; claim
/// `5.934e-4` → `5.9341e-4`). Every digit the claim states is shown, and the next one, which is
/// what decides whether the rerun rounds to the claim. `None` when the claim is not a plain
/// decimal or the value is not finite.
pub fn rerun_text(claim_text: &str, rerun: f64) -> Option<String> {
    let (decimals, exponent) = written_digits(claim_text)?;
    if !rerun.is_finite() {
        return None;
    }
    let d = decimals + 1;
    if exponent == 0 && !claim_text.contains(['e', 'E']) {
        return Some(format!("{rerun:.d$}"));
    }
    let mantissa = rerun / 10f64.powi(exponent);
    Some(format!("{mantissa:.d$}e{exponent}"))
}

/// The relative difference of a rerun from its claim, `(rerun − claimed) / |claimed|` (`None`
/// for a claim of 0 or a non-finite value).
pub fn relative_difference(claimed: f64, rerun: f64) -> Option<f64> {
    let r = (rerun - claimed) / claimed.abs();
    (claimed != 0.0 && r.is_finite()).then_some(r)
}

/// A relative difference as a signed percentage to two significant digits (`+0.011%`, `-5.2%`,
/// `0%`).
pub fn percent_text(relative: f64) -> String {
    let p = relative * 100.0;
    if p == 0.0 {
        return "0%".to_owned();
    }
    let e = p.abs().log10().floor() as i32;
    let d = (1 - e).max(0) as usize;
    format!("{p:+.d$}%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rerun_is_shown_one_digit_finer_than_the_claim() {
        assert_eq!(rerun_text("0.0005934", 0.000593412).unwrap(), "0.00059341");
        assert_eq!(rerun_text("0.0120", 0.011993).unwrap(), "0.01199");
        assert_eq!(rerun_text("0.0120", 0.0120001).unwrap(), "0.01200");
        assert_eq!(rerun_text("0.01661", 0.016611812).unwrap(), "0.016612");
        assert_eq!(rerun_text("1.022", 1.022162).unwrap(), "1.0222");
        assert_eq!(rerun_text("5.934e-4", 0.000593412).unwrap(), "5.9341e-4");
        assert_eq!(rerun_text("1.50E-3", 0.00150049).unwrap(), "1.500e-3");
        assert_eq!(rerun_text("3", 3.04).unwrap(), "3.0");
        assert_eq!(rerun_text("-0.5", -0.52).unwrap(), "-0.52");
        for bad in [
            ".inf", "0x1F", "1_000", "", "e5", "1e", "1e99999", "nan", "1.2.3",
        ] {
            assert_eq!(rerun_text(bad, 1.0), None, "{bad:?}");
        }
        assert_eq!(rerun_text("0.5", f64::NAN), None);
    }

    #[test]
    fn a_claim_of_no_change_at_all_is_exact_as_written() {
        for (metric, value, text) in [
            ("kld_mean", 0.0, "0.0"),
            ("kld_reverse_p99", 0.0, "0"),
            ("delta_p_rms", 0.0, "0.00"),
            ("top1_agreement", 1.0, "1.0"),
            ("ppl_ratio", 1.0, "1"),
            ("same_top_p", 100.0, "100.0"),
        ] {
            assert!(is_exact_no_change(metric, value), "{metric}");
            assert_eq!(relative_precision(metric, text, value), 0.0, "{metric}");
            assert_eq!(tolerance(metric, text, value), 0.0, "{metric}");
        }
        // Near the point is not at it: the digits' precision rules, as before.
        assert!(relative_precision("kld_mean", "0.001", 0.001) > IMPRECISE_RELATIVE);
        assert!(!is_exact_no_change("top1_agreement", 0.999));
        assert!(!is_exact_no_change("ppl_cand", 0.0));
        assert!(relative_precision("ppl_cand", "0", 0.0).is_infinite());
        assert!(!is_exact_no_change("tool_call_f1", 1.0));
    }

    #[test]
    fn relative_difference_is_against_the_claim() {
        assert_eq!(relative_difference(0.02, 0.021), Some(0.021 / 0.02 - 1.0));
        assert!((relative_difference(-2.0, -1.0).unwrap() - 0.5).abs() < 1e-15);
        assert_eq!(relative_difference(0.0, 1.0), None);
        assert_eq!(percent_text(0.000109), "+0.011%");
        assert_eq!(percent_text(-0.0519), "-5.2%");
        assert_eq!(percent_text(0.25), "+25%");
        assert_eq!(percent_text(0.0), "0%");
    }
}
