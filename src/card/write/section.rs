//! The human-readable fidelity section of the card body.
//!
//! The Markdown kept between the two HTML comment markers: what was compared with what, on which
//! text and lane, and the claims in a table. It is prose for people, rebuilt from the same merged
//! block as the metadata, and shares nothing with the YAML side but the values it reads.

use crate::disclosure::precision::round_sig;
use serde_json::Value;

use super::model_index::{context_lengths, lane, metric_label};
use super::{Measured, SECTION_END, SECTION_START, f64_at, str_at, u64_at};
pub use crate::markdown::escape_all as markdown;

fn show(x: f64) -> String {
    format!("{}", round_sig(x, 4))
}

/// `11033` -> `11,033`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(super) fn section(f: &Value, m: &Measured, name: &str, comparison: Option<&str>) -> String {
    let doc = &m.doc;
    let lengths = context_lengths(f, m);
    let units = str_at(f, "/protocol/kl/units").unwrap_or("nats");
    let level = f64_at(f, "/protocol/aggregation/uncertainty/level").unwrap_or(0.95);
    let level_words = format!("{}%", show(level * 100.0));
    let mut p = String::new();
    p.push_str(&what_was_compared(f, m, name));
    p.push_str(&the_text(f, &lengths));
    p.push_str(&rows_direction_vocabulary(f, units));
    p.push_str(&aggregation(f, m, &level_words));

    let mut s = String::new();
    s.push_str(SECTION_START);
    s.push_str("\n## Fidelity (cardproof)\n\n");
    s.push_str(&p);
    s.push_str("\n\n");

    let claims = f
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for run in &doc.runs {
        s.push_str(&run_table(f, run, &claims, &lengths, &level_words, units));
    }
    if let Some(table) = comparison {
        s.push_str(table);
        if !table.ends_with('\n') {
            s.push('\n');
        }
        s.push('\n');
    }
    s.push_str(
        "The complete protocol and the claims are in this card's `fidelity:` metadata \
         (schema `cardproof/v1`); this section is rewritten by `cardproof card`.\n",
    );
    s.push_str(SECTION_END);
    s.push('\n');
    s
}

/// The first sentence: what was compared with what, by which runner, set up how, in which lane.
fn what_was_compared(f: &Value, m: &Measured, name: &str) -> String {
    let doc = &m.doc;
    let env = &doc.environment;
    let mut p = String::new();
    let candidate = markdown(name);
    let reference = str_at(f, "/reference/repo")
        .or(Some(doc.reference.path.as_str()).filter(|p| !p.is_empty()))
        .map_or_else(|| "the reference".to_owned(), markdown);
    let ref_detail: Vec<&str> = [
        str_at(f, "/reference/dtype"),
        str_at(f, "/reference/format"),
    ]
    .into_iter()
    .flatten()
    .collect();
    p.push_str(&format!(
        "**{candidate}** was compared with the reference **{reference}**"
    ));
    if !ref_detail.is_empty() {
        p.push_str(&format!(" ({})", markdown(&ref_detail.join(", "))));
    }
    let runner = match env.runner {
        crate::rerun::document::RunnerKind::Native => "cardproof's native CPU runner".to_owned(),
        crate::rerun::document::RunnerKind::Transformers => {
            format!("cardproof's {} runner", markdown("transformers"))
        }
        crate::rerun::document::RunnerKind::Llamacpp
            if env
                .llamacpp
                .as_ref()
                .is_some_and(|l| l.imported_from.is_some()) =>
        {
            format!(
                "llama.cpp's {} (its printed statistics, imported from its log; not rerun by cardproof)",
                markdown("llama-perplexity --kl-divergence")
            )
        }
        crate::rerun::document::RunnerKind::Llamacpp => format!(
            "llama.cpp's {} (both models; each pair of rows read and reduced by cardproof, llama.cpp's printout checked against it)",
            markdown("llama-perplexity")
        ),
    };
    p.push_str(&format!(" by {runner}"));
    let mut setup = Vec::new();
    if let Some(version) = &env.engine_version {
        setup.push(format!("{} {}", markdown(&env.engine), markdown(version)));
    }
    if let Some(c) = str_at(f, "/runtime/compute_dtype") {
        setup.push(format!("{} compute", markdown(c)));
    }
    if let Some(kv) = str_at(f, "/runtime/kv_cache_dtype") {
        setup.push(format!("{} KV cache", markdown(kv)));
    }
    if let Some(state) = str_at(f, "/runtime/recurrent_state_dtype") {
        setup.push(format!("{} recurrent state", markdown(state)));
    }
    if let Some(d) = str_at(f, "/runtime/device") {
        setup.push(format!("on {}", markdown(d)));
    }
    if !setup.is_empty() {
        p.push_str(&format!(" ({})", setup.join(", ")));
    }
    let lane_name = lane(m);
    p.push_str(&format!(
        ", lane `{lane_name}` ({})",
        markdown(env.lane.trim_end_matches('.'))
    ));
    p.push_str(". ");

    p
}

/// The eval text: its source, tokens, BOS policy and digest, and the windows it is cut into.
fn the_text(f: &Value, lengths: &[u64]) -> String {
    let mut p = String::new();
    let source = str_at(f, "/eval/text/source").unwrap_or("the eval text");
    p.push_str(&format!("The eval text is {}", markdown(source)));
    let mut text_detail = Vec::new();
    if let Some(count) = u64_at(f, "/eval/tokens/count") {
        text_detail.push(format!("{} tokens", grouped(count)));
    }
    match str_at(f, "/eval/bos") {
        Some("none") => text_detail.push("no BOS token".into()),
        Some("per_window") => text_detail.push("a BOS token starting each window".into()),
        Some("per_document") => text_detail.push("a BOS token per document".into()),
        _ => {}
    }
    if let Some(sha) = str_at(f, "/eval/text/sha256") {
        text_detail.push(format!(
            "SHA-256 `{}…`",
            sha.chars().take(12).collect::<String>()
        ));
    }
    if !text_detail.is_empty() {
        p.push_str(&format!(" ({})", text_detail.join(", ")));
    }
    let lengths_words: Vec<String> = lengths.iter().map(|l| grouped(*l)).collect();
    p.push_str(&format!(
        ", cut into non-overlapping windows of {} tokens (a trailing partial window is dropped). ",
        lengths_words.join(" and ")
    ));

    p
}

/// The scored rows, the divergence's direction and units, and the vocabulary it sums over.
fn rows_direction_vocabulary(f: &Value, units: &str) -> String {
    let mut p = String::new();
    p.push_str(&positions_sentence(f));
    p.push_str(". ");
    let forward =
        "forward KL, `KL(P_ref ‖ P_cand) = Σ_i p_ref(i) · (log p_ref(i) − log p_cand(i))`";
    let reverse =
        "reverse KL, `KL(P_cand ‖ P_ref) = Σ_i p_cand(i) · (log p_cand(i) − log p_ref(i))`";
    let direction = match str_at(f, "/protocol/kl/direction") {
        Some("reverse") => reverse.to_owned(),
        Some("both") => format!("{forward}, and {reverse}"),
        _ => forward.to_owned(),
    };
    p.push_str(&format!(
        "The divergence is {direction}, in {}",
        markdown(units)
    ));
    let padding = match str_at(f, "/protocol/vocab/padding") {
        Some("excluded") => "; logit rows beyond the tokenizer's vocabulary are excluded",
        Some("included") => "; logit rows beyond the tokenizer's vocabulary, if any, are included",
        _ => "",
    };
    let vocab = match str_at(f, "/protocol/vocab/mode") {
        Some("full") => "summed over the full vocabulary".to_owned(),
        Some("top_k") => format!(
            "summed over the reference's top {} tokens (tail {})",
            u64_at(f, "/protocol/vocab/k").unwrap_or(0),
            markdown(str_at(f, "/protocol/vocab/tail").unwrap_or("unstated"))
        ),
        Some("threshold") => format!(
            "dropping reference terms with log p ≤ {}",
            f64_at(f, "/protocol/vocab/log_p").unwrap_or(0.0)
        ),
        _ => "over the vocabulary the metadata states".to_owned(),
    };
    p.push_str(&format!(", {vocab}{padding}. "));

    p
}

/// Which rows are scored, in words.
fn positions_sentence(f: &Value) -> String {
    match str_at(f, "/protocol/positions/policy") {
        Some("all") => "Every row of each window is scored (row j predicts token j+1)".to_owned(),
        Some("stride") => format!(
            "Rows j with j mod {} = {} are scored (row j predicts token j+1)",
            u64_at(f, "/protocol/positions/stride").unwrap_or(1),
            u64_at(f, "/protocol/positions/offset").unwrap_or(0)
        ),
        Some("second_half") => {
            "Rows from L/2 to L-2 of each window of L tokens are scored, as llama.cpp scores"
                .to_owned()
        }
        Some("from") => format!(
            "Rows j ≥ {} of each window are scored (row j predicts token j+1)",
            u64_at(f, "/protocol/positions/from").unwrap_or(0)
        ),
        Some(policy @ ("role" | "span")) => {
            let what = str_at(f, &format!("/protocol/positions/{policy}")).unwrap_or("?");
            let every = match (
                u64_at(f, "/protocol/positions/stride"),
                u64_at(f, "/protocol/positions/offset"),
            ) {
                (Some(n), Some(k)) => format!(" with j mod {n} = {k}"),
                _ => String::new(),
            };
            format!(
                "Rows predicting a token of the conversation's {} {}{every} are scored (row j predicts token j+1)",
                markdown(what),
                if policy == "role" {
                    "messages"
                } else {
                    "spans"
                }
            )
        }
        _ => "Rows are scored as the `fidelity.protocol.positions` metadata says".to_owned(),
    }
}

/// How the rows are aggregated and how the intervals are made.
fn aggregation(f: &Value, m: &Measured, level_words: &str) -> String {
    let doc = &m.doc;
    let mut p = String::new();
    let statistic = match str_at(f, "/protocol/aggregation/statistic") {
        Some("mean_over_positions") => "the mean over all scored rows",
        Some("mean_of_window_means") => "the mean of the windows' means",
        Some("mean_of_document_means") => "the mean of the documents' means",
        _ => "aggregated as the metadata states",
    };
    p.push_str(&format!(
        "Means are {statistic}; percentiles interpolate linearly over the sorted rows. "
    ));
    match str_at(f, "/protocol/aggregation/uncertainty/method") {
        Some("block_bootstrap") | Some("bootstrap") => {
            let blocks = match doc.runs.first().map(|r| r.bootstrap_block.as_str()) {
                Some(b) if b.starts_with("run:") => {
                    format!("runs of {} consecutive rows", markdown(&b[4..]))
                }
                _ => "whole windows".to_owned(),
            };
            let mut detail = Vec::new();
            if let Some(r) = u64_at(f, "/protocol/aggregation/uncertainty/resamples") {
                detail.push(format!("{} resamples", grouped(r)));
            }
            if let Some(s) = u64_at(f, "/protocol/aggregation/uncertainty/seed") {
                detail.push(format!("seed {s}"));
            }
            p.push_str(&format!(
                "Intervals are {level_words} percentile intervals of a bootstrap resampling {blocks}"
            ));
            if !detail.is_empty() {
                p.push_str(&format!(" ({})", detail.join(", ")));
            }
            p.push('.');
        }
        Some("iid_stderr") => p.push_str(&format!(
            "Intervals are {level_words} normal intervals from llama.cpp's i.i.d. per-token standard errors (±1.96 of them; the rows of a window are not independent, so they are narrower than a block bootstrap's); llama.cpp prints none for percentiles."
        )),
        _ => p.push_str("No uncertainty is stated."),
    }

    p
}

/// One context length's table: the card's claim for each headline metric where it has one,
/// else the measured value, with the measured interval.
fn run_table(
    f: &Value,
    run: &crate::rerun::document::RunRecord,
    claims: &[Value],
    lengths: &[u64],
    level_words: &str,
    units: &str,
) -> String {
    let mut s = String::new();
    let length = run.context_length as u64;
    let mut heading = format!("**Context length {}**", grouped(length));
    let mut detail = Vec::new();
    detail.push(format!("{} windows", grouped(run.n_windows as u64)));
    detail.push(format!("{} scored rows", grouped(run.n_positions as u64)));
    if !detail.is_empty() {
        heading.push_str(&format!(" ({})", detail.join(", ")));
    }
    s.push_str(&heading);
    s.push_str(&format!(
        "\n\n| metric | value | {level_words} interval |\n|---|---|---|\n"
    ));
    for metric in [
        "kld_mean",
        "kld_reverse_mean",
        "kld_p99",
        "top1_agreement",
        "ppl_ratio",
    ] {
        let claimed = claims
            .iter()
            .find(|c| {
                c.get("metric").and_then(Value::as_str) == Some(metric)
                    && (c.get("context_length").and_then(Value::as_u64) == Some(length)
                        || (lengths.len() == 1 && c.get("context_length").is_none()))
            })
            .and_then(|c| c.get("value").and_then(Value::as_f64));
        let measured = run
            .summary
            .metrics
            .get(metric)
            .copied()
            .filter(|v| v.is_finite());
        let Some(value) = claimed.or(measured.map(|v| round_sig(v, 4))) else {
            continue;
        };
        if metric == "kld_reverse_mean" && str_at(f, "/protocol/kl/direction") == Some("forward") {
            continue;
        }
        let interval = run
            .summary
            .uncertainty
            .get(metric)
            .map(|u| (u.ci95[0], u.ci95[1]))
            .filter(|(lo, hi)| lo.is_finite() && hi.is_finite())
            .map_or_else(
                || "–".to_owned(),
                |(lo, hi)| format!("[{}, {}]", show(lo), show(hi)),
            );
        let label = metric_label(metric, units);
        s.push_str(&format!("| {label} | {value} | {interval} |\n"));
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_escapes_card_text() {
        assert_eq!(markdown("a_b*c|d<e>"), "a\\_b\\*c\\|d\\<e\\>");
    }
}
