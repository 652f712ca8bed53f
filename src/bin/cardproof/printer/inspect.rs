//! `inspect`: what a checkpoint really holds, as a document or a summary with tables.

use std::io;

use cardproof::checkpoint::inspect::Inspection;
use cardproof::output::InspectDocument;

use super::{Printer, Style, write_json, write_stdout};

impl Printer {
    pub fn inspection(&self, inspections: &[Inspection], list_modules: bool) -> io::Result<()> {
        if self.json() {
            // One shape whatever the input: a single file or checkpoint is a one-element list.
            return write_json(&InspectDocument::new(inspections));
        }
        write_stdout(&render_inspections(
            inspections,
            list_modules,
            &self.style(),
        ))
    }
}

/// The human summary of every inspection (`inspect`, and `check` on stdout).
pub(super) fn render_inspections(
    inspections: &[Inspection],
    list_modules: bool,
    style: &Style,
) -> String {
    inspections
        .iter()
        .map(|i| render_inspection(i, list_modules, style))
        .collect::<Vec<_>>()
        .join("\n")
}

fn render_inspection(i: &Inspection, list_modules: bool, style: &Style) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let bytes: u64 = i.files.iter().map(|f| f.size).sum();
    let title = match &i.variant {
        Some(v) => format!("{} variant `{v}`", i.format),
        None => i.format.to_owned(),
    };
    let _ = writeln!(
        out,
        "{}: {} file{}, {} bytes, {} tensors, {} parameters",
        style.bold(&title),
        i.files.len(),
        if i.files.len() == 1 { "" } else { "s" },
        bytes,
        i.tensor_count,
        i.parameter_count
    );
    for f in &i.files {
        let _ = writeln!(out, "  {}  {} bytes, {} tensors", f.path, f.size, f.tensors);
    }
    if let Some(d) = &i.declared {
        let ignore = if d.ignore.is_empty() {
            String::new()
        } else {
            format!("; excludes {}", d.ignore.join(", "))
        };
        let _ = writeln!(out, "declared: {} ({}){ignore}", d.method, d.source);
    }
    let _ = writeln!(
        out,
        "linear modules: {} quantized, {} high precision; lm_head {}; embeddings {}{}",
        i.summary.quantized,
        i.summary.high_precision,
        i.summary.lm_head.replace('_', " "),
        i.summary.embeddings.as_deref().unwrap_or("absent"),
        i.summary
            .kv_cache
            .as_ref()
            .map(|k| format!("; kv cache {k}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "  {:<18} {:>8} {:>12}",
        "scheme", "modules", "bits/weight"
    );
    for (scheme, count) in &i.summary.schemes {
        let (sum, n) = i
            .modules
            .iter()
            .filter(|m| &m.scheme == scheme)
            .fold((0.0, 0usize), |(s, n), m| (s + m.bits_per_weight, n + 1));
        let _ = writeln!(
            out,
            "  {scheme:<18} {count:>8} {:>12.4}",
            sum / n.max(1) as f64
        );
    }
    let _ = writeln!(
        out,
        "  {:<18} {:>8} {:>10} {:>14}  schemes",
        "bucket", "modules", "quantized", "parameters"
    );
    for (bucket, b) in &i.buckets {
        let schemes: Vec<String> = b.schemes.iter().map(|(s, n)| format!("{s}×{n}")).collect();
        let _ = writeln!(
            out,
            "  {bucket:<18} {:>8} {:>10} {:>14}  {}",
            b.modules,
            b.quantized,
            b.parameters,
            schemes.join(" ")
        );
    }
    if list_modules {
        let _ = writeln!(
            out,
            "  {:<56} {:<14} {:<14} {:>8}  group  activations",
            "module", "status", "scheme", "bits"
        );
        for m in &i.modules {
            let status = match m.status {
                cardproof::checkpoint::inspect::Status::Quantized => "quantized",
                cardproof::checkpoint::inspect::Status::HighPrecision => "high_precision",
            };
            let _ = writeln!(
                out,
                "  {:<56} {:<14} {:<14} {:>8.4}  {}  {}",
                m.name,
                status,
                m.scheme,
                m.bits_per_weight,
                m.group_size
                    .as_ref()
                    .map_or("-".to_owned(), |g| g.to_string()),
                m.activations.as_deref().unwrap_or("-")
            );
        }
    }
    for f in &i.findings {
        let _ = writeln!(
            out,
            "{}[{}]: {}",
            style.severity(f.severity),
            f.code,
            f.message
        );
    }
    out
}
