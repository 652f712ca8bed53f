//! The human-readable pages: report.md and a self-contained report.html for a verification,
//! study.md and study.html for a study, and sweep.html, rendered with minijinja from views their
//! owners build from typed documents, with plots drawn from the per-row data of
//! `positions.safetensors`.
//!
//! Card values and paths are untrusted: report.md escapes every printed value with
//! [`escape_markdown`] (the template's autoescape mode; only what Markdown would read as markup,
//! so the file reads well raw), report.html entity-escapes them. The
//! HTML has no script and references nothing outside itself: CSS in a `<style>` block, plots as
//! inline SVG.

mod render;
mod study_svg;
mod svg;
#[cfg(test)]
mod tests;

use std::path::Path;

use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::safetensors::{self as st, SafetensorsFile};
use crate::error::{Error, Result};

pub use render::{format_number, render_report, render_study};
pub use study_svg::{
    ArmPoint, FlipSeries, svg_cumulative_flips, svg_forest, svg_kld_vs_bits, svg_turn_strip,
};
pub use svg::{
    MAX_POINTS, SWEEP_BINS, escape_xml, svg_histogram, svg_kld_along_conversation,
    svg_kld_along_position, svg_sweep,
};

/// One row of a sweep page's table: a setting against the baseline at one context length.
pub struct SweepRow<'a> {
    pub setting: &'a str,
    pub context_length: usize,
    pub kld_mean: Option<f64>,
    pub kld_p99: Option<f64>,
    pub top1_agreement: Option<f64>,
    pub n_flips: usize,
    pub n_positions: usize,
}

/// sweep.html: a self-contained page (no script, nothing fetched) with the sweep's table and a
/// plot per context length ([`svg_sweep`]). Every value from the run is escaped.
pub fn render_sweep_html(
    knob: &str,
    baseline: &str,
    definition: &str,
    rows: &[SweepRow<'_>],
    plots: &[String],
) -> String {
    let num = |x: Option<f64>| x.map_or("–".to_owned(), |v| format_number(v, 3));
    let mut table = String::new();
    for r in rows {
        table.push_str(&format!(
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} of {}</td></tr>\n",
            escape_xml(r.setting),
            r.context_length,
            num(r.kld_mean),
            num(r.kld_p99),
            num(r.top1_agreement),
            r.n_flips,
            r.n_positions
        ));
    }
    format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>cardproof sweep: {knob}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:760px;margin:2em auto;color:#24292f}}table{{border-collapse:collapse}}td,th{{border:1px solid #d0d7de;padding:4px 8px;text-align:right}}td:first-child,th:first-child{{text-align:left}}.plot{{max-width:100%;height:auto}}</style>
</head><body>
<h1>Sweep of <code>{knob}</code> against <code>{baseline}</code></h1>
<p>{definition}</p>
<p>KLD: forward KL(P<sub>{baseline}</sub> ‖ P<sub>setting</sub>) per scored row, nats; mean and 99th percentile over rows. A flip: the two settings' top-1 tokens differ at a row.</p>
<table><thead><tr><th>setting</th><th>context</th><th>kld_mean</th><th>kld_p99</th><th>top-1 agreement</th><th>top-1 flips</th></tr></thead><tbody>
{table}</tbody></table>
{plots}
</body></html>
"#,
        knob = escape_xml(knob),
        baseline = escape_xml(baseline),
        definition = escape_xml(definition),
        plots = plots.join("\n"),
    )
}

/// Per scored row of one context length, for the plots (from positions.safetensors).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRows {
    pub context_length: usize,
    /// Row position j in its window (row j predicts token j+1).
    pub position: Vec<u64>,
    /// Forward KL of the row, nats.
    pub kld: Vec<f64>,
    /// Whether the two models' top-1 tokens differ at the row.
    pub flip: Vec<bool>,
    /// For a conversation eval text: the predicted token's index in the token stream (empty
    /// for plain text).
    pub token: Vec<u64>,
    /// For a conversation eval text: the predicted token's segment (empty for plain text).
    pub segment: Vec<crate::kld::protocol::Segment>,
    /// The window of each row (empty when not known: rows read back from a positions file).
    pub window: Vec<u32>,
}

pub use crate::markdown::escape_inline as escape_markdown;

/// Largest tensor [`read_positions`] reads whole (a 131k-token window scored at every row is
/// about 1 MiB per f64 array).
const MAX_POSITION_TENSOR_BYTES: u64 = 1 << 30;

/// Read the plots' rows from a `positions.safetensors` written by `measure` (tensors
/// `ctx<L>.position`, `ctx<L>.kld`, `ctx<L>.ref_top1`, `ctx<L>.cand_top1`), in the file's order
/// of context lengths.
pub fn read_positions(path: &Path) -> Result<Vec<RunRows>> {
    let file = st::read_file(path)?;
    let mut lengths: Vec<usize> = Vec::new();
    for t in &file.tensors {
        if let Some(l) = t
            .name
            .strip_prefix("ctx")
            .and_then(|r| r.strip_suffix(".position"))
        {
            let l = l.parse().map_err(|_| {
                Error::format(path, Some(&t.name), "context length is not a number")
            })?;
            lengths.push(l);
        }
    }
    lengths
        .into_iter()
        .map(|l| {
            let p = format!("ctx{l}");
            let position: Vec<u64> = read_array(&file, &format!("{p}.position"), Dtype::I64)?
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()).max(0) as u64)
                .collect();
            let kld: Vec<f64> = read_array(&file, &format!("{p}.kld"), Dtype::F64)?
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default()))
                .collect();
            let i32s = |name: &str| -> Result<Vec<i32>> {
                Ok(read_array(&file, name, Dtype::I32)?
                    .chunks_exact(4)
                    .map(|b| i32::from_le_bytes(b.try_into().unwrap_or_default()))
                    .collect())
            };
            let a = i32s(&format!("{p}.ref_top1"))?;
            let b = i32s(&format!("{p}.cand_top1"))?;
            let n = position.len();
            if kld.len() != n || a.len() != n || b.len() != n {
                return Err(Error::format(
                    path,
                    Some(&p),
                    "position, kld, ref_top1 and cand_top1 differ in length",
                ));
            }
            // A conversation's rows also say where each token sits and what it is.
            let (token, segment) = match (
                file.get(&format!("{p}.token")),
                file.get(&format!("{p}.segment")),
            ) {
                (Some(_), Some(_)) => {
                    let token: Vec<u64> = read_array(&file, &format!("{p}.token"), Dtype::I64)?
                        .chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()).max(0) as u64)
                        .collect();
                    let segment = read_array(&file, &format!("{p}.segment"), Dtype::U8)?
                        .iter()
                        .map(|&c| {
                            crate::kld::protocol::Segment::ALL
                                .get(c as usize)
                                .copied()
                                .ok_or_else(|| {
                                    Error::format(
                                        path,
                                        Some(&format!("{p}.segment")),
                                        format!("{c} is not a segment code (0..=4)"),
                                    )
                                })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    (token, segment)
                }
                _ => (Vec::new(), Vec::new()),
            };
            if (!token.is_empty() || !segment.is_empty())
                && (token.len() != n || segment.len() != n)
            {
                return Err(Error::format(
                    path,
                    Some(&p),
                    "token and segment differ in length from position",
                ));
            }
            Ok(RunRows {
                context_length: l,
                position,
                kld,
                flip: a.iter().zip(&b).map(|(a, b)| a != b).collect(),
                token,
                segment,
                window: Vec::new(),
            })
        })
        .collect()
}

fn read_array(file: &SafetensorsFile, name: &str, dtype: Dtype) -> Result<Vec<u8>> {
    match file.get(name) {
        Some(t) if t.dtype == dtype && t.shape.len() == 1 => {}
        Some(t) => {
            return Err(Error::format(
                &file.path,
                Some(name),
                format!(
                    "expected a 1-D {dtype:?} array, found {:?} of shape {:?}",
                    t.dtype, t.shape
                ),
            ));
        }
        None => {
            return Err(Error::format(
                &file.path,
                Some(name),
                "missing from positions.safetensors",
            ));
        }
    }
    st::read_tensor_bytes(file, name, MAX_POSITION_TENSOR_BYTES)
}
