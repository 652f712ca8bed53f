//! The human-readable fidelity section of the card body.
//!
//! The Markdown kept between the two HTML comment markers: what was compared with what, on which
//! text and lane, and the claims in a table. It is prose for people, written from the
//! measurement's typed draft block (the protocol, runtime, eval text and claims the metadata
//! holds too) and the names the merged block gives (the reference repository, the eval text's
//! wording kept from the card).

use super::model_index::{claims_at, context_lengths, lane, metric_label};
use super::{Measured, Names, SECTION_END, SECTION_START, word};
use crate::disclosure::precision::round_sig;
use crate::disclosure::{
    Aggregation, AggregationStatistic, BosPolicy, Eval, KlDirection, PaddingRows, PositionPolicy,
    Positions, Protocol, UncertaintyMethod, VocabMode,
};
pub use crate::markdown::escape_all as markdown;
use crate::rerun::document::RunnerKind;

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

pub(super) fn section(
    names: &Names<'_>,
    m: &Measured,
    name: &str,
    comparison: Option<&str>,
    files: Option<&serde_json::Value>,
) -> String {
    let doc = &m.doc;
    let draft = &doc.fidelity;
    let lengths = context_lengths(m);
    let units = word(&draft.protocol.kl.units);
    let level = draft.protocol.aggregation.uncertainty.level.unwrap_or(0.95);
    let level_words = format!("{}%", show(level * 100.0));
    let mut p = String::new();
    let subject = match files {
        Some(_) => "Each file in the table below".to_owned(),
        None => format!("**{}**", markdown(name)),
    };
    p.push_str(&what_was_compared(names, m, &subject));
    p.push_str(&the_text(names, &draft.eval, &lengths));
    p.push_str(&rows_direction_vocabulary(&draft.protocol, &units));
    p.push_str(&aggregation(&draft.protocol.aggregation, m, &level_words));

    let mut s = String::new();
    s.push_str(SECTION_START);
    s.push_str("\n## Fidelity (cardproof)\n\n");
    s.push_str(&p);
    s.push_str("\n\n");

    match files {
        Some(block) => s.push_str(&files_table(block, &lengths, &level_words, &units)),
        None => {
            for run in &doc.runs {
                s.push_str(&run_table(m, run, &lengths, &level_words, &units));
            }
            if let Some(turns) = &doc.turns {
                s.push_str(&turns_table(turns, &level_words));
            }
        }
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

/// The first sentence: what (`subject`, Markdown) was compared with what, by which runner, set up
/// how, in which lane.
fn what_was_compared(names: &Names<'_>, m: &Measured, subject: &str) -> String {
    let doc = &m.doc;
    let env = &doc.environment;
    let runtime = &doc.fidelity.runtime;
    let mut p = String::new();
    let reference = names
        .reference_repo
        .or(Some(doc.reference.path.as_str()).filter(|p| !p.is_empty()))
        .map_or_else(|| "the reference".to_owned(), markdown);
    let ref_detail = [
        word(&doc.fidelity.reference.dtype),
        word(&doc.fidelity.reference.format),
    ];
    p.push_str(&format!(
        "{subject} was compared with the reference **{reference}** ({})",
        markdown(&ref_detail.join(", "))
    ));
    let runner = match env.runner {
        RunnerKind::Native => "cardproof's native CPU runner".to_owned(),
        RunnerKind::Transformers => format!("cardproof's {} runner", markdown("transformers")),
        RunnerKind::Llamacpp
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
        RunnerKind::Llamacpp => format!(
            "llama.cpp's {} (both models; each pair of rows read and reduced by cardproof, llama.cpp's printout checked against it)",
            markdown("llama-perplexity")
        ),
    };
    p.push_str(&format!(" by {runner}"));
    let mut setup = Vec::new();
    if let Some(version) = &env.engine_version {
        setup.push(format!("{} {}", markdown(&env.engine), markdown(version)));
    }
    setup.push(format!("{} compute", markdown(&runtime.compute_dtype)));
    setup.push(format!("{} KV cache", markdown(&runtime.kv_cache_dtype)));
    if let Some(state) = &runtime.recurrent_state_dtype {
        setup.push(format!("{} recurrent state", markdown(state)));
    }
    setup.push(format!("on {}", markdown(&runtime.device)));
    p.push_str(&format!(" ({})", setup.join(", ")));
    let lane_name = lane(m);
    p.push_str(&format!(
        ", lane `{lane_name}` ({})",
        markdown(env.lane.trim_end_matches('.'))
    ));
    p.push_str(". ");

    p
}

/// The eval text: its source, tokens, BOS policy and digest, and the windows it is cut into.
fn the_text(names: &Names<'_>, eval: &Eval, lengths: &[u64]) -> String {
    let mut p = String::new();
    let source = names.eval_source.unwrap_or("the eval text");
    p.push_str(&format!("The eval text is {}", markdown(source)));
    let mut text_detail = Vec::new();
    if let Some(tokens) = &eval.tokens {
        text_detail.push(format!("{} tokens", grouped(tokens.count)));
    }
    text_detail.push(
        match eval.bos {
            BosPolicy::None => "no BOS token",
            BosPolicy::PerWindow => "a BOS token starting each window",
            BosPolicy::PerDocument => "a BOS token per document",
        }
        .to_owned(),
    );
    if let Some(sha) = &eval.text.sha256 {
        text_detail.push(format!(
            "SHA-256 `{}…`",
            sha.0.chars().take(12).collect::<String>()
        ));
    }
    p.push_str(&format!(" ({})", text_detail.join(", ")));
    let lengths_words: Vec<String> = lengths.iter().map(|l| grouped(*l)).collect();
    p.push_str(&format!(
        ", cut into non-overlapping windows of {} tokens (a trailing partial window is dropped). ",
        lengths_words.join(" and ")
    ));

    p
}

/// The scored rows, the divergence's direction and units, and the vocabulary it sums over.
fn rows_direction_vocabulary(protocol: &Protocol, units: &str) -> String {
    let mut p = String::new();
    p.push_str(&positions_sentence(&protocol.positions));
    p.push_str(". ");
    let forward =
        "forward KL, `KL(P_ref ‖ P_cand) = Σ_i p_ref(i) · (log p_ref(i) − log p_cand(i))`";
    let reverse =
        "reverse KL, `KL(P_cand ‖ P_ref) = Σ_i p_cand(i) · (log p_cand(i) − log p_ref(i))`";
    let direction = match protocol.kl.direction {
        KlDirection::Forward => forward.to_owned(),
        KlDirection::Reverse => reverse.to_owned(),
        KlDirection::Both => format!("{forward}, and {reverse}"),
    };
    p.push_str(&format!(
        "The divergence is {direction}, in {}",
        markdown(units)
    ));
    let vocab = &protocol.vocab;
    let padding = match vocab.padding {
        Some(PaddingRows::Excluded) => {
            "; logit rows beyond the tokenizer's vocabulary are excluded"
        }
        Some(PaddingRows::Included) => {
            "; logit rows beyond the tokenizer's vocabulary, if any, are included"
        }
        None => "",
    };
    let terms = match vocab.mode {
        VocabMode::Full => "summed over the full vocabulary".to_owned(),
        VocabMode::TopK => format!(
            "summed over the reference's top {} tokens (tail {})",
            vocab.k.unwrap_or(0),
            markdown(
                &vocab
                    .tail
                    .map_or_else(|| "unstated".to_owned(), |t| word(&t))
            )
        ),
        VocabMode::Threshold => format!(
            "dropping reference terms with log p ≤ {}",
            vocab.log_p.unwrap_or(0.0)
        ),
    };
    p.push_str(&format!(", {terms}{padding}. "));

    p
}

/// Which rows are scored, in words.
fn positions_sentence(positions: &Positions) -> String {
    let every = match (positions.stride, positions.offset) {
        (Some(n), Some(k)) => format!(" with j mod {n} = {k}"),
        _ => String::new(),
    };
    let conversation = |what: &str, kind: &str| {
        format!(
            "Rows predicting a token of the conversation's {} {kind}{every} are scored (row j predicts token j+1)",
            markdown(what)
        )
    };
    match positions.policy {
        PositionPolicy::All => {
            "Every row of each window is scored (row j predicts token j+1)".to_owned()
        }
        PositionPolicy::Stride => format!(
            "Rows j with j mod {} = {} are scored (row j predicts token j+1)",
            positions.stride.unwrap_or(1),
            positions.offset.unwrap_or(0)
        ),
        PositionPolicy::SecondHalf => {
            "Rows from L/2 to L-2 of each window of L tokens are scored, as llama.cpp scores"
                .to_owned()
        }
        PositionPolicy::From => format!(
            "Rows j ≥ {} of each window are scored (row j predicts token j+1)",
            positions.from.unwrap_or(0)
        ),
        PositionPolicy::Role => {
            conversation(positions.role.map_or("?", |r| r.as_str()), "messages")
        }
        PositionPolicy::Span => conversation(positions.span.map_or("?", |s| s.as_str()), "spans"),
    }
}

/// How the rows are aggregated and how the intervals are made.
fn aggregation(a: &Aggregation, m: &Measured, level_words: &str) -> String {
    let doc = &m.doc;
    let mut p = String::new();
    let statistic = match a.statistic {
        AggregationStatistic::MeanOverPositions => "the mean over all scored rows",
        AggregationStatistic::MeanOfWindowMeans => "the mean of the windows' means",
        AggregationStatistic::MeanOfDocumentMeans => "the mean of the documents' means",
    };
    p.push_str(&format!(
        "Means are {statistic}; percentiles interpolate linearly over the sorted rows. "
    ));
    match a.uncertainty.method {
        UncertaintyMethod::BlockBootstrap | UncertaintyMethod::Bootstrap => {
            let blocks = match doc.runs.first().map(|r| r.bootstrap_block.as_str()) {
                Some(b) if b.starts_with("run:") => {
                    format!("runs of {} consecutive rows", markdown(&b[4..]))
                }
                _ => "whole windows".to_owned(),
            };
            let mut detail = Vec::new();
            if let Some(r) = a.uncertainty.resamples {
                detail.push(format!("{} resamples", grouped(r)));
            }
            if let Some(s) = a.uncertainty.seed {
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
        UncertaintyMethod::IidStderr => p.push_str(&format!(
            "Intervals are {level_words} normal intervals from llama.cpp's i.i.d. per-token standard errors (±1.96 of them; the rows of a window are not independent, so they are narrower than a block bootstrap's); llama.cpp prints none for percentiles."
        )),
        UncertaintyMethod::None => p.push_str("No uncertainty is stated."),
    }

    p
}

/// A card listing files: one row per file and context length with its claims, as the block
/// gives them (`value ± uncertainty`, the half-width of the stated interval).
fn files_table(
    block: &serde_json::Value,
    lengths: &[u64],
    level_words: &str,
    units: &str,
) -> String {
    use serde_json::Value;
    const METRICS: [&str; 5] = [
        "kld_mean",
        "kld_reverse_mean",
        "kld_p99",
        "top1_agreement",
        "ppl_ratio",
    ];
    let entries = block
        .get("files")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let claimed = |entry: &Value, metric: &str, length: u64| -> Option<String> {
        let only = lengths.len() == 1;
        let c = entry.get("results")?.as_array()?.iter().find(|c| {
            c.get("metric").and_then(Value::as_str) == Some(metric)
                && match c.get("context_length").and_then(Value::as_u64) {
                    Some(l) => l == length,
                    None => only,
                }
        })?;
        let value = c.get("value")?.as_f64()?;
        Some(match c.get("uncertainty").and_then(Value::as_f64) {
            Some(u) => format!("{value} ± {u}"),
            None => value.to_string(),
        })
    };
    let shown: Vec<&str> = METRICS
        .into_iter()
        .filter(|m| {
            entries
                .iter()
                .any(|e| lengths.iter().any(|&l| claimed(e, m, l).is_some()))
        })
        .collect();
    let mut s = format!(
        "| file | quantization | context |{}\n|---|---|---|{}\n",
        shown
            .iter()
            .map(|m| format!(" {} |", metric_label(m, units)))
            .collect::<String>(),
        "---|".repeat(shown.len())
    );
    for entry in &entries {
        let file = entry
            .get("file")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let method = entry
            .pointer("/quantization/method")
            .and_then(Value::as_str)
            .unwrap_or("–");
        for &length in lengths {
            let cells: String = shown
                .iter()
                .map(|m| {
                    format!(
                        " {} |",
                        claimed(entry, m, length).unwrap_or_else(|| "–".into())
                    )
                })
                .collect();
            s.push_str(&format!(
                "| {} | {} | {} |{cells}\n",
                markdown(file),
                markdown(method),
                grouped(length)
            ));
        }
    }
    s.push_str(&format!(
        "\n± is the half-width of each claim's {level_words} interval.\n\n"
    ));
    s
}

/// One context length's table: the measurement's claim for each headline metric where it has
/// one, else the measured value, with the measured interval.
fn run_table(
    m: &Measured,
    run: &crate::rerun::document::RunRecord,
    lengths: &[u64],
    level_words: &str,
    units: &str,
) -> String {
    let draft = &m.doc.fidelity;
    let mut s = String::new();
    let length = run.context_length as u64;
    s.push_str(&format!(
        "**Context length {}** ({} windows, {} scored rows)",
        grouped(length),
        grouped(run.n_windows as u64),
        grouped(run.n_positions as u64)
    ));
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
        let claimed = claims_at(draft, length, lengths)
            .find(|c| c.metric == metric)
            .map(|c| c.value);
        let measured = run
            .summary
            .metrics
            .get(metric)
            .copied()
            .filter(|v| v.is_finite());
        let Some(value) = claimed.or(measured.map(|v| round_sig(v, 4))) else {
            continue;
        };
        if metric == "kld_reverse_mean" && draft.protocol.kl.direction == KlDirection::Forward {
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

/// The generated turns: how they were generated, then each turn metric with the counts behind
/// it and its interval.
fn turns_table(t: &crate::rerun::turns::TurnsRecord, level_words: &str) -> String {
    use crate::conversation::turns::TurnSelection;
    let sm = &t.summary;
    let which = match t.protocol.turns {
        TurnSelection::All => "every assistant turn",
        TurnSelection::ToolCalls => "the assistant turns that call tools",
    };
    let stops: Vec<String> = t.stop_ids.iter().map(u32::to_string).collect();
    let mut s = format!(
        "**Generated turns** ({} turns of {} conversation{}: {which}). Each turn is generated by \
         both models from the conversation's true history, greedily (the first index of the \
         maximum on ties), at most {} tokens, stopping at token ids [{}]; calls are read in the \
         template's `{}` format and checked against the conversation's tool declarations.\n\n\
         | metric | value | counts | {level_words} interval |\n|---|---|---|---|\n",
        grouped(sm.turns),
        grouped(sm.conversations),
        if sm.conversations == 1 { "" } else { "s" },
        t.protocol.max_new_tokens,
        stops.join(", "),
        t.call_format_name(),
    );
    for row in t.metric_rows() {
        let value = row
            .value
            .and_then(|v| crate::disclosure::precision::claim_text(row.metric, v))
            .unwrap_or_else(|| "–".into());
        let interval = row.ci95.map_or("–".into(), |[lo, hi]| {
            format!("[{}, {}]", show(lo), show(hi))
        });
        let label = metric_label(row.metric, "");
        s.push_str(&format!(
            "| {label} | {value} | {} | {interval} |\n",
            row.counts
        ));
    }
    let r = &sm.recovery;
    s.push_str(&format!(
        "\nFailing turns (calls not the reference's, or a call where it made none): {}; \
         recovered later in their conversation: {}; not recovered: {}.\n\n",
        r.failures, r.recoveries, r.unrecovered
    ));
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
