//! The precision a printed number states: half a unit in its last digit, judged against the
//! metric's scale. Shared by `verify` (the `imprecise` verdict) and `card` (which prints claims
//! fine enough never to be imprecise).

/// The widest printed precision, relative to the claim's scale, that can still be reproduced:
/// `0.02` (±0.005, 25%) says too little to be checked, `0.0166` (±0.3%) does not.
pub const IMPRECISE_RELATIVE: f64 = 0.05;

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

/// What a claim's printed precision is measured against: the value itself, or for a metric that
/// lives near a bound, its distance from that bound (a top-1 agreement of `0.99` says ±0.005 of
/// a disagreement of 0.01; a PPL ratio of `1.00` says nothing about a change of 0.2%).
pub fn precision_scale(metric: &str, value: f64) -> f64 {
    match metric {
        "top1_agreement" => value.min(1.0 - value).max(0.0),
        "same_top_p" => value.min(100.0 - value).max(0.0),
        "ppl_ratio" => (value - 1.0).abs(),
        _ => value.abs(),
    }
}

/// The printed precision relative to the claim's scale (infinite for a value at its bound).
pub fn relative_precision(metric: &str, text: &str, value: f64) -> f64 {
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
