//! The metric vocabulary: the only metric names allowed in claims, JSON output and reports.

/// Every metric name, in reporting order.
pub const METRICS: &[&str] = &[
    "kld_mean",
    "kld_median",
    "kld_p90",
    "kld_p95",
    "kld_p99",
    "kld_p999",
    "kld_max",
    "kld_reverse_mean",
    "kld_reverse_median",
    "kld_reverse_p90",
    "kld_reverse_p95",
    "kld_reverse_p99",
    "kld_reverse_p999",
    "kld_reverse_max",
    "top1_agreement",
    "same_top_p",
    "ppl_ref",
    "ppl_cand",
    "ppl_ratio",
    "delta_p_rms",
    "tool_call_f1",
    "tool_call_valid",
    "tool_call_match",
    "turn_match",
];

/// The turn metrics: shares over generated assistant turns (`protocol.turns`), measured once
/// over the conversation, not at a context length.
pub const TURN_METRICS: &[&str] = &[
    "tool_call_f1",
    "tool_call_valid",
    "tool_call_match",
    "turn_match",
];

pub fn is_turn_metric(name: &str) -> bool {
    TURN_METRICS.contains(&name)
}

/// A metric that is another one on another scale: `same_top_p`, llama.cpp's `Same top p`, is
/// `top1_agreement` (the share of scored rows whose most likely token is the same for both
/// models) as a percentage, so it is verified against `100 × top1_agreement`.
pub fn derived(name: &str) -> Option<(&'static str, f64)> {
    match name {
        "same_top_p" => Some(("top1_agreement", 100.0)),
        _ => None,
    }
}

pub fn is_metric(name: &str) -> bool {
    METRICS.contains(&name)
}

/// Metrics that measure reverse KL, KL(P_cand || P_ref).
pub fn is_reverse_kl(name: &str) -> bool {
    name.starts_with("kld_reverse_")
}

/// Metrics that measure forward KL, KL(P_ref || P_cand).
pub fn is_forward_kl(name: &str) -> bool {
    name.starts_with("kld_") && !is_reverse_kl(name)
}

/// The closest vocabulary name, for "did you mean" hints.
pub fn closest(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase().replace(['-', ' ', '.'], "_");
    if let Some(exact) = METRICS.iter().find(|m| **m == lower) {
        return Some(exact);
    }
    // Names other tools print for the same statistics.
    let synonyms = [
        ("same_top", "top1_agreement"),
        ("top1", "top1_agreement"),
        ("top_1", "top1_agreement"),
        ("rms_dp", "delta_p_rms"),
        ("rms_delta_p", "delta_p_rms"),
        ("avg", "mean"),
        ("average", "mean"),
    ];
    let lower = synonyms.iter().fold(lower, |acc, (from, to)| {
        if acc.contains(to) {
            acc
        } else {
            acc.replace(from, to)
        }
    });
    if let Some(exact) = METRICS.iter().find(|m| **m == lower) {
        return Some(exact);
    }
    METRICS
        .iter()
        .map(|m| (edit_distance(&lower, m), *m))
        .filter(|(d, m)| *d <= 3.max(m.len() / 4))
        .min()
        .map(|(_, m)| m)
}

/// Levenshtein distance, for suggestions.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_the_nearest_metric() {
        assert_eq!(closest("kld_avg"), Some("kld_mean"));
        assert_eq!(closest("KLD-p99"), Some("kld_p99"));
        assert_eq!(closest("Same top p"), Some("same_top_p"));
        assert_eq!(closest("same_top"), Some("top1_agreement"));
        assert_eq!(derived("same_top_p"), Some(("top1_agreement", 100.0)));
        assert_eq!(closest("perplexity_of_something_else"), None);
    }
}
