//! The Hub `model-index` that mirrors the headline claims.
//!
//! The Hub reads evaluation results from `model-index`; cardproof writes a single entry, one
//! result per context length, each naming cardproof as its source so that a later run can tell
//! its own `model-index` (replaced) from one somebody else wrote (left alone). It is a separate
//! document shape from the `fidelity:` block, hence a separate module.

use std::path::Path;

use serde_json::{Value, json};

use super::{MODEL_INDEX_SOURCE, MODEL_INDEX_URL, Measured, Names, str_at, word};
use crate::disclosure::ResultClaim;
use crate::rerun::document::FidelityDraft;

pub(super) fn model_name(names: &Names<'_>, m: &Measured, path: &Path) -> String {
    if let Some(repo) = names.candidate_repo {
        return repo.to_owned();
    }
    let dir = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty() && n != "." && n != "..")
    };
    dir(Path::new(&m.doc.candidate.path))
        .or_else(|| path.parent().and_then(dir))
        .unwrap_or_else(|| "model".to_owned())
}

/// The lane the numbers were measured in, e.g. `cardproof-native`.
pub(super) fn lane(m: &Measured) -> String {
    use crate::runner::native::Emulate;
    let runner = m.doc.environment.runner.as_str();
    let mut lane = format!("cardproof-{runner}");
    match m.doc.environment.emulate {
        Some(Emulate::LlamacppCpu) => lane.push_str("-llamacpp-cpu"),
        Some(Emulate::LlamacppCpuNoFa) => lane.push_str("-llamacpp-cpu-no-fa"),
        _ => {}
    }
    lane
}

pub(super) fn metric_label(metric: &str, units: &str) -> String {
    let (direction, stat) = if let Some(stat) = metric.strip_prefix("kld_reverse_") {
        ("reverse", stat)
    } else if let Some(stat) = metric.strip_prefix("kld_") {
        ("forward", stat)
    } else {
        return match metric {
            "top1_agreement" => "top-1 agreement".into(),
            "same_top_p" => "same top token (%)".into(),
            "ppl_ref" => "reference perplexity".into(),
            "ppl_cand" => "candidate perplexity".into(),
            "ppl_ratio" => "PPL ratio (candidate / reference)".into(),
            "delta_p_rms" => "RMS change in the true token's probability".into(),
            "tool_call_f1" => "tool-call F1 (greedy turns)".into(),
            "tool_call_valid" => "valid tool calls (greedy turns)".into(),
            "tool_call_match" => "tool calls equal to the reference's (greedy turns)".into(),
            "turn_match" => "turns equal to the reference's (greedy turns)".into(),
            other => other.to_owned(),
        };
    };
    let stat = match stat {
        "p999" => "p99.9".to_owned(),
        s => s.to_owned(),
    };
    format!("{stat} KLD ({direction}, {units})")
}

pub(super) fn model_index(names: &Names<'_>, m: &Measured, name: &str) -> Value {
    let draft = &m.doc.fidelity;
    let source = names.eval_source.unwrap_or("eval text");
    let direction = word(&draft.protocol.kl.direction);
    let units = word(&draft.protocol.kl.units);
    let lengths = context_lengths(m);
    let mut results = Vec::new();
    for &length in &lengths {
        let metrics: Vec<Value> = claims_at(draft, length, &lengths)
            .map(|c| {
                json!({"type": c.metric, "value": c.value, "name": metric_label(&c.metric, &units)})
            })
            .collect();
        if metrics.is_empty() {
            continue;
        }
        results.push(json!({
            "task": {"type": "text-generation"},
            "dataset": {
                "name": source,
                "type": source,
                "config": format!("ctx{length}-{direction}"),
                "split": lane(m),
            },
            "metrics": metrics,
            "source": {"name": MODEL_INDEX_SOURCE, "url": MODEL_INDEX_URL},
        }));
    }
    json!([{"name": name, "results": results}])
}

/// The draft's claims at one context length (a claim without one belongs to the only length).
pub(super) fn claims_at<'a>(
    draft: &'a FidelityDraft,
    length: u64,
    lengths: &[u64],
) -> impl Iterator<Item = &'a ResultClaim> {
    let only = lengths.len() == 1;
    draft
        .results
        .iter()
        .filter(move |c| c.context_length == Some(length) || (only && c.context_length.is_none()))
}

/// The protocol's context lengths, else the runs'.
pub(super) fn context_lengths(m: &Measured) -> Vec<u64> {
    let listed: Vec<u64> = m
        .doc
        .fidelity
        .protocol
        .context_lengths
        .iter()
        .map(|l| l.0)
        .collect();
    if listed.is_empty() {
        m.doc.runs.iter().map(|r| r.context_length as u64).collect()
    } else {
        listed
    }
}

/// A `model-index` cardproof wrote: one entry whose results all name cardproof as their source.
pub(super) fn is_ours(model_index: &Value) -> bool {
    let Some([entry]) = model_index.as_array().map(Vec::as_slice) else {
        return false;
    };
    let Some(results) = entry.get("results").and_then(Value::as_array) else {
        return false;
    };
    !results.is_empty()
        && results
            .iter()
            .all(|r| str_at(r, "/source/name") == Some(MODEL_INDEX_SOURCE))
}
