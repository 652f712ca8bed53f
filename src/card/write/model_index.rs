//! The Hub `model-index` that mirrors the headline claims.
//!
//! The Hub reads evaluation results from `model-index`; cardproof writes a single entry, one
//! result per context length, each naming cardproof as its source so that a later run can tell
//! its own `model-index` (replaced) from one somebody else wrote (left alone). It is a separate
//! document shape from the `fidelity:` block, hence a separate module.

use std::path::Path;

use serde_json::{Value, json};

use super::{MODEL_INDEX_SOURCE, MODEL_INDEX_URL, Measured, str_at};

pub(super) fn model_name(fidelity: &Value, m: &Measured, path: &Path) -> String {
    if let Some(repo) = str_at(fidelity, "/candidate/repo") {
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
            other => other.to_owned(),
        };
    };
    let stat = match stat {
        "p999" => "p99.9".to_owned(),
        s => s.to_owned(),
    };
    format!("{stat} KLD ({direction}, {units})")
}

pub(super) fn model_index(fidelity: &Value, m: &Measured, name: &str) -> Value {
    let source = str_at(fidelity, "/eval/text/source").unwrap_or("eval text");
    let direction = str_at(fidelity, "/protocol/kl/direction").unwrap_or("forward");
    let units = str_at(fidelity, "/protocol/kl/units").unwrap_or("nats");
    let claims = fidelity
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let lengths = context_lengths(fidelity, m);
    let mut results = Vec::new();
    for &length in &lengths {
        let metrics: Vec<Value> = claims
            .iter()
            .filter(|c| {
                c.get("context_length").and_then(Value::as_u64) == Some(length)
                    || (lengths.len() == 1 && c.get("context_length").is_none())
            })
            .filter_map(|c| {
                let metric = c.get("metric")?.as_str()?;
                let value = c.get("value")?.clone();
                Some(json!({"type": metric, "value": value, "name": metric_label(metric, units)}))
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

pub(super) fn context_lengths(fidelity: &Value, m: &Measured) -> Vec<u64> {
    let listed: Vec<u64> = fidelity
        .pointer("/protocol/context_lengths")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
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
