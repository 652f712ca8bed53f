//! The card's `quantization` section against what the checkpoint's headers hold.

use serde_json::Value;

use super::Locator;
use crate::checkpoint::inspect::{Bucket, Inspection, Module, Status};
use crate::findings::{Code, Finding, Severity};

/// Inspect's own findings about the checkpoint beside a card, as errors.
pub(super) fn inspection_findings(inspections: &[Inspection], out: &mut Vec<Finding>) {
    for inspection in inspections {
        for finding in &inspection.findings {
            let mut f = finding.clone();
            f.severity = Severity::Error;
            if let Some(v) = &inspection.variant {
                f.message = format!("{} variant `{v}`: {}", inspection.format, f.message);
            }
            out.push(f);
        }
    }
}

/// Every place a `fidelity` block's (or one file's view's) `quantization` section disagrees with
/// the tensors of the checkpoint it describes.
pub(super) fn check(
    fidelity: &Value,
    inspections: &[&Inspection],
    locator: &Locator<'_>,
    out: &mut Vec<Finding>,
) {
    let Some(q) = fidelity.get("quantization") else {
        return;
    };
    for inspection in inspections {
        let prefix = inspection
            .variant
            .as_ref()
            .map(|v| format!("{} variant `{v}`: ", inspection.format))
            .unwrap_or_default();
        let mut push = |pointer: &str, message: String| {
            let finding = Finding::new(Code::QuantizationMismatch, format!("{prefix}{message}"));
            out.push(locator.at_value(finding, pointer));
        };
        high_precision(q, inspection, &mut push);
        group(q, inspection, &mut push);
        method(q, inspection, &mut push);
        activations(q, inspection, &mut push);
        targets(q, inspection, &mut push);
    }
}

type Push<'a> = dyn FnMut(&str, String) + 'a;

/// A card's module pattern: a glob (`model.layers.*.mlp.gate`) or a name that may be the tail of
/// the full module name (`lm_head`, `mlp.gate`).
pub(crate) fn pattern_matches(pattern: &str, name: &str) -> bool {
    if pattern.contains('*') || pattern.contains('?') {
        return glob(pattern, name)
            || name.split('.').enumerate().any(|(i, _)| {
                let tail: Vec<&str> = name.split('.').skip(i).collect();
                glob(pattern, &tail.join("."))
            });
    }
    name == pattern || name.ends_with(&format!(".{pattern}"))
}

fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn names(modules: &[&Module]) -> String {
    let shown: Vec<String> = modules
        .iter()
        .take(3)
        .map(|m| format!("`{}` ({})", m.name, m.scheme))
        .collect();
    let more = if modules.len() > 3 {
        format!(" and {} more", modules.len() - 3)
    } else {
        String::new()
    };
    format!("{}{more}", shown.join(", "))
}

fn high_precision(q: &Value, inspection: &Inspection, push: &mut Push<'_>) {
    let Some(patterns) = q.get("high_precision_modules").and_then(Value::as_array) else {
        return;
    };
    for (i, pattern) in patterns.iter().enumerate() {
        let Some(pattern) = pattern.as_str() else {
            continue;
        };
        let quantized: Vec<&Module> = inspection
            .modules
            .iter()
            .filter(|m| m.status == Status::Quantized && pattern_matches(pattern, &m.name))
            .collect();
        let embeddings_quantized = inspection
            .summary
            .embeddings
            .as_deref()
            .is_some_and(|s| !matches!(s, "bf16" | "f16" | "f32" | "f64"))
            && (pattern.contains("embed") || pattern == "token_embd");
        if !quantized.is_empty() {
            push(
                &format!("/fidelity/quantization/high_precision_modules/{i}"),
                format!(
                    "the card keeps `{pattern}` in high precision, but the checkpoint quantizes {} \
                     matching module{}: {}",
                    quantized.len(),
                    if quantized.len() == 1 { "" } else { "s" },
                    names(&quantized)
                ),
            );
        } else if embeddings_quantized {
            push(
                &format!("/fidelity/quantization/high_precision_modules/{i}"),
                format!(
                    "the card keeps `{pattern}` in high precision, but the embeddings are {}",
                    inspection.summary.embeddings.as_deref().unwrap_or_default()
                ),
            );
        }
    }
}

fn group(q: &Value, inspection: &Inspection, push: &mut Push<'_>) {
    let Some(declared) = q.get("group") else {
        return;
    };
    let quantized: Vec<&Module> = inspection
        .modules
        .iter()
        .filter(|m| m.status == Status::Quantized)
        .collect();
    let differing: Vec<&Module> = quantized
        .iter()
        .copied()
        .filter(|m| match (&m.group_size, declared) {
            (Some(found), Value::Number(_)) if found.is_number() => found != declared,
            (Some(found @ Value::Array(_)), Value::Array(_)) => found != declared,
            _ => false,
        })
        .collect();
    if !differing.is_empty() {
        let found: Vec<String> = {
            let mut g: Vec<String> = differing
                .iter()
                .filter_map(|m| m.group_size.as_ref())
                .map(Value::to_string)
                .collect();
            g.sort();
            g.dedup();
            g
        };
        push(
            "/fidelity/quantization/group",
            format!(
                "the card says group {declared}, but the scales of {} module{} give {}: {}",
                differing.len(),
                if differing.len() == 1 { "" } else { "s" },
                found.join(", "),
                names(&differing)
            ),
        );
    }
}

fn method(q: &Value, inspection: &Inspection, push: &mut Push<'_>) {
    let Some(method) = q.get("method").and_then(Value::as_str) else {
        return;
    };
    let method = method.to_ascii_lowercase();
    let schemes: Vec<&String> = inspection
        .summary
        .schemes
        .keys()
        .filter(|s| !matches!(s.as_str(), "bf16" | "f16" | "f32" | "f64"))
        .collect();
    // `none`: the weights are the reference's dtype (a KV-cache-only or runtime-only study).
    if method == "none" {
        if !schemes.is_empty() {
            push(
                "/fidelity/quantization/method",
                format!(
                    "the card says `none`, but the checkpoint holds quantized linear modules ({})",
                    schemes
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        return;
    }
    // A GGUF's method may be llama.cpp's file type, what llama-quantize was asked for (`q3_k_m`
    // on a model whose rows fall back to other types holds no `q3_k` tensor).
    if inspection.file_type.as_deref() == Some(method.as_str()) {
        return;
    }
    // A float conversion (`f16`, `bf16`, `f32`): no linear module is quantized, as it says.
    if schemes.is_empty() && matches!(method.as_str(), "bf16" | "f16" | "f32" | "f64") {
        return;
    }
    if schemes.is_empty() {
        push(
            "/fidelity/quantization/method",
            format!(
                "the card says `{method}`, but no linear module of the checkpoint is quantized"
            ),
        );
        return;
    }
    // GGUF mixes (`q4_k_m`) name their dominant type plus a size suffix.
    let base = method
        .trim_end_matches("_xl")
        .trim_end_matches("_s")
        .trim_end_matches("_m")
        .trim_end_matches("_l");
    let known = schemes
        .iter()
        .any(|s| *s == &method || s.as_str() == base || family(s) == family(&method));
    if !known {
        push(
            "/fidelity/quantization/method",
            format!(
                "the card says `{method}`, but the checkpoint's quantized modules are {}",
                schemes
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
}

/// Scheme family for loose comparisons (`int4-awq` and `awq`, `fp8-block` and `fp8`).
fn family(scheme: &str) -> String {
    let s = scheme.to_ascii_lowercase();
    for family in [
        "awq", "gptq", "nvfp4", "mxfp4", "bnb-nf4", "bnb-fp4", "bnb-int8",
    ] {
        if s.contains(family) {
            return family.to_owned();
        }
    }
    s
}

/// Whether a module is stored in a scheme as the card names it: the exact scheme, a scheme of
/// that family (`fp8` for `fp8-tensor`, `fp8-block`), or the same loose family (`awq`).
fn in_scheme(card: &str, module: &str) -> bool {
    let (card, module) = (card.to_ascii_lowercase(), module.to_ascii_lowercase());
    module == card || module.starts_with(&format!("{card}-")) || family(&module) == family(&card)
}

/// A card's `targets` entry covers a module by bucket name or by module name / glob.
fn covers(entry: &[&str], m: &Module) -> bool {
    entry.iter().any(|t| {
        Bucket::from_name(t).map_or_else(|| pattern_matches(t, &m.name), |b| b == m.bucket)
    })
}

/// A mixed build's `targets`: every module stored in an entry's scheme lies in the entry's
/// buckets or patterns, and the count is the count of such modules.
fn targets(q: &Value, inspection: &Inspection, push: &mut Push<'_>) {
    let Some(entries) = q.get("targets").and_then(Value::as_array) else {
        return;
    };
    for (i, entry) in entries.iter().enumerate() {
        let (Some(scheme), Some(modules)) = (
            entry.get("scheme").and_then(Value::as_str),
            entry.get("modules").and_then(Value::as_array),
        ) else {
            continue;
        };
        let modules: Vec<&str> = modules.iter().filter_map(Value::as_str).collect();
        let shown = modules
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let stored: Vec<&Module> = inspection
            .modules
            .iter()
            .filter(|m| m.status == Status::Quantized && in_scheme(scheme, &m.scheme))
            .collect();
        let outside: Vec<&Module> = stored
            .iter()
            .copied()
            .filter(|m| !covers(&modules, m))
            .collect();
        if !outside.is_empty() {
            let mut buckets: Vec<&str> = outside.iter().map(|m| m.bucket.as_str()).collect();
            buckets.dedup();
            buckets.sort_unstable();
            buckets.dedup();
            push(
                &format!("/fidelity/quantization/targets/{i}/modules"),
                format!(
                    "the card says `{scheme}` covers {shown}, but {} module{} outside them {} stored as {scheme} (bucket{} {}): {}",
                    outside.len(),
                    if outside.len() == 1 { "" } else { "s" },
                    if outside.len() == 1 { "is" } else { "are" },
                    if buckets.len() == 1 { "" } else { "s" },
                    buckets.join(", "),
                    names(&outside)
                ),
            );
        } else if stored.is_empty() {
            push(
                &format!("/fidelity/quantization/targets/{i}/scheme"),
                format!(
                    "the card says `{scheme}` covers {shown}, but no module is stored as {scheme}"
                ),
            );
        }
        let covered = stored.len() - outside.len();
        if let Some(count) = entry.get("count").and_then(Value::as_u64)
            && count != covered as u64
        {
            push(
                &format!("/fidelity/quantization/targets/{i}/count"),
                format!(
                    "the card says {count} `{scheme}` modules over {shown}, but the checkpoint stores {covered} there"
                ),
            );
        }
    }
}

fn activations(q: &Value, inspection: &Inspection, push: &mut Push<'_>) {
    let Some(card) = q.get("activations").and_then(Value::as_str) else {
        return;
    };
    let card = card.to_ascii_lowercase();
    let static_modules: Vec<&Module> = inspection
        .modules
        .iter()
        .filter(|m| {
            m.activations
                .as_deref()
                .is_some_and(|a| a.ends_with("-static"))
        })
        .collect();
    let weight_only = matches!(
        card.as_str(),
        "none" | "bf16" | "f16" | "weight-only" | "a16"
    );
    // A weight-only claim on a checkpoint that quantizes activations at run time (dynamic FP8,
    // compressed-tensors `input_activations` with `dynamic: true`, NVFP4 activations): the
    // numbers were measured with quantized activations the card does not disclose.
    let quantized_inputs: Vec<&Module> = inspection
        .modules
        .iter()
        .filter(|m| {
            m.activations
                .as_deref()
                .is_some_and(|a| a != "none" && !a.ends_with("-static"))
        })
        .collect();
    if weight_only && !quantized_inputs.is_empty() {
        let mut kinds: Vec<&str> = quantized_inputs
            .iter()
            .filter_map(|m| m.activations.as_deref())
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        push(
            "/fidelity/quantization/activations",
            format!(
                "the card says activations are `{card}` (weight-only), but the checkpoint's \
                 quantization config quantizes the input activations of {} module{} at run time \
                 ({}): {}",
                quantized_inputs.len(),
                if quantized_inputs.len() == 1 { "" } else { "s" },
                kinds.join(", "),
                names(&quantized_inputs)
            ),
        );
    }
    if (weight_only || card.contains("dynamic")) && !static_modules.is_empty() {
        push(
            "/fidelity/quantization/activations",
            format!(
                "the card says activations are `{card}`, but {} module{} carry static input scales: {}",
                static_modules.len(),
                if static_modules.len() == 1 { "" } else { "s" },
                names(&static_modules)
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_patterns_match_globs_and_name_tails() {
        assert!(pattern_matches("lm_head", "lm_head"));
        assert!(pattern_matches("mlp.gate", "model.layers.3.mlp.gate"));
        assert!(!pattern_matches("mlp.gate", "model.layers.3.mlp.gate_proj"));
        assert!(pattern_matches(
            "model.layers.*.linear_attn.*",
            "model.layers.0.linear_attn.in_proj_qkvz"
        ));
        assert!(pattern_matches(
            "*.linear_attn.*",
            "model.layers.10.linear_attn.out_proj"
        ));
        assert!(!pattern_matches(
            "model.layers.*.linear_attn.*",
            "model.layers.0.self_attn.q_proj"
        ));
    }
}
