//! The config/tensor cross-checks.
//!
//! What a checkpoint's quantization config declares (excluded modules, bits, group size, method)
//! is compared with what the tensors were found to hold, and the disagreements grouped into one
//! finding per kind. It judges the classification rather than doing it, hence its own module.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Module, Status};
use crate::checkpoint::quant_config::{self, Declared, Expectation};
use crate::findings::{Code, Finding};

/// Group disagreements so a 600-module checkpoint gives one finding per kind, with examples.
pub(super) fn cross_check(declared: &Declared, modules: &[Module]) -> Vec<Finding> {
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for m in modules {
        let what = match (declared.expectation(&m.name), m.status) {
            (Expectation::Excluded, Status::Quantized) => Some(format!(
                "{} excludes them from quantization, but the tensors are {}",
                declared.source, m.scheme
            )),
            (Expectation::Quantized(w), Status::HighPrecision) => Some(format!(
                "{} declares them quantized ({}-bit {}), but the tensors are {}",
                declared.source,
                w.bits.map_or("?".into(), |b| b.to_string()),
                w.kind.as_deref().unwrap_or("?"),
                m.scheme
            )),
            (Expectation::Quantized(w), Status::Quantized) => {
                let detected_group = m.group_size.as_ref().and_then(Value::as_u64);
                let declared_group = w
                    .group_size
                    .filter(|_| w.strategy.as_deref() != Some("channel"));
                match (declared_group, detected_group) {
                    (Some(d), Some(t)) if d != t => Some(format!(
                        "{} declares group size {d}, but the scales give {t}",
                        declared.source
                    )),
                    _ => family_mismatch(declared, &w, m),
                }
            }
            _ => None,
        };
        if let Some(what) = what {
            groups.entry(what).or_default().push(&m.name);
        }
    }
    groups
        .into_iter()
        .map(|(what, names)| {
            let shown: Vec<String> = names.iter().take(3).map(|n| format!("`{n}`")).collect();
            let more = if names.len() > 3 {
                format!(" and {} more", names.len() - 3)
            } else {
                String::new()
            };
            Finding::new(
                Code::ConfigTensorMismatch,
                format!(
                    "{} module{} ({}{more}): {what}",
                    names.len(),
                    if names.len() == 1 { "" } else { "s" },
                    shown.join(", ")
                ),
            )
        })
        .collect()
}

fn family_mismatch(
    declared: &Declared,
    w: &quant_config::WeightDecl,
    m: &Module,
) -> Option<String> {
    let scheme = m.scheme.as_str();
    let expected_family = match declared.method.as_str() {
        "awq" => Some("awq"),
        "gptq" => Some("gptq"),
        "fp8" => Some("fp8"),
        "bitsandbytes" => Some("bnb"),
        _ => None,
    };
    if let Some(family) = expected_family
        && !scheme.contains(family)
    {
        return Some(format!(
            "{} declares {}, but the tensors are {scheme}",
            declared.source, declared.method
        ));
    }
    if let Some(bits) = w.bits
        && let Some(digits) = scheme.strip_prefix("int").and_then(|s| s.split('-').next())
        && digits.parse::<u64>().is_ok_and(|b| b != bits)
    {
        return Some(format!(
            "{} declares {bits}-bit weights, but the tensors are {scheme}",
            declared.source
        ));
    }
    None
}
