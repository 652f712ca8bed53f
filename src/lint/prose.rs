//! Prose KLD numbers (found by [`crate::card::prose`]) against the fidelity block's claims.

use crate::card::prose::ProseClaim;

/// KLD numbers in the prose, outside the section `cardproof card` writes, that no claim of the
/// `fidelity:` block with the same statistic agrees with (within the prose number's printed
/// precision): a hand-written table or sentence left stale by a new measurement
/// (`prose-contradicts-disclosure`), or a statistic the block does not claim at all
/// (`prose-not-in-disclosure`).
pub(super) fn contradictions(
    card: &crate::card::Card,
    claims: &[ProseClaim],
    fidelity: &serde_json::Value,
    locator: &super::Locator<'_>,
    out: &mut Vec<crate::findings::Finding>,
) {
    use crate::card::{SECTION_END, SECTION_START};
    use crate::findings::{Code, Finding};
    let body = card.body_range();
    let text = &card.text[body.clone()];
    let generated = match text.find(SECTION_START) {
        Some(s) => {
            let end = text[s..].find(SECTION_END).map_or(text.len(), |e| s + e);
            body.start + s..body.start + end
        }
        None => 0..0,
    };
    let results = fidelity
        .get("results")
        .and_then(serde_json::Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for claim in claims {
        if generated.contains(&claim.span.start) {
            continue;
        }
        let (Some(metric), Ok(value)) = (claim.statistic.metric(), claim.text.parse::<f64>())
        else {
            continue;
        };
        let disclosed: Vec<f64> = results
            .iter()
            .filter(|r| r.get("metric").and_then(serde_json::Value::as_str) == Some(metric))
            .filter_map(|r| r.get("value").and_then(serde_json::Value::as_f64))
            .collect();
        if disclosed.is_empty() {
            // A number the block does not claim at all: nothing to contradict, and nothing
            // `verify` will rerun, so a reader cannot tell it from a verified one.
            out.push(locator.at_span(
                Finding::new(
                    Code::ProseNotInDisclosure,
                    format!(
                        "the prose states {} ({metric}), which the `fidelity:` block does not \
                         claim: it is not disclosed, so `verify` cannot check it; add it to \
                         `fidelity.results` or remove it",
                        claim.excerpt
                    ),
                ),
                claim.span.clone(),
            ));
            continue;
        }
        let tolerance = |v: f64| crate::disclosure::precision::tolerance(metric, &claim.text, v);
        if disclosed.iter().any(|v| (value - v).abs() <= tolerance(*v)) {
            continue;
        }
        let listed: Vec<String> = disclosed.iter().map(|v| v.to_string()).collect();
        out.push(locator.at_span(
            Finding::new(
                Code::ProseContradictsDisclosure,
                format!(
                    "the prose states {} ({metric}), but the `fidelity:` block claims {metric} = \
                     {}: update or remove the prose number (`cardproof card` rewrites only its \
                     own section)",
                    claim.excerpt,
                    listed.join(" or ")
                ),
            ),
            claim.span.clone(),
        ));
    }
}
