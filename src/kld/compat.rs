//! `kld --llamacpp-compat`: llama.cpp's own statistics, with its formulas, from its base files.

use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use super::llamacpp::{BaseFile, CompatAccumulator, CompatStats, compare_base_files};
use super::source::{LogitSource, is_llamacpp_base};
use crate::error::{Error, Result};

#[derive(Debug, Clone, Serialize)]
pub struct CompatMeasurement {
    pub n_positions: u64,
    pub protocol: Value,
    pub protocol_sha256: String,
    /// The llama.cpp statistics mapped onto the metric vocabulary (fractions, not percent).
    pub metrics: std::collections::BTreeMap<String, f64>,
    pub uncertainty: std::collections::BTreeMap<String, Value>,
    /// Every statistic llama.cpp prints, as it computes it.
    pub llamacpp: CompatStats,
    pub definitions: Value,
}

/// The protocol llama.cpp's KLD pass implies, spelled out.
fn protocol(base: &BaseFile) -> Value {
    json!({
        "direction": "forward",
        "units": "nats",
        "vocab": {"mode": "threshold", "log_p": -16.0},
        "reference_storage": "llama.cpp uint16 log-probs per row (16-nat window)",
        "padding": "none",
        "vocab_size": base.n_vocab,
        "positions": {"policy": "second_half"},
        "context_length": base.n_ctx,
        "aggregation": "mean_over_positions",
        "uncertainty": "llama.cpp i.i.d. standard error",
        "top1": "first index of the maximum",
        "llamacpp_compat": true
    })
}

/// Reference: a llama.cpp base file. Candidate: its own base file, or a logit dump of the same rows.
pub fn compat_measure(reference: &Path, candidate: &Path) -> Result<CompatMeasurement> {
    if !is_llamacpp_base(reference) {
        return Err(Error::usage(
            reference,
            "--llamacpp-compat needs the reference as a llama.cpp --kl-divergence-base file",
        ));
    }
    let base = BaseFile::open(reference)?;
    let stats = if is_llamacpp_base(candidate) {
        compare_base_files(&base, &BaseFile::open(candidate)?)?
    } else {
        let cand = LogitSource::open(candidate, None)?;
        if cand.rows as u64 != base.n_rows() || cand.vocab != base.n_vocab as usize {
            return Err(Error::mismatch(
                candidate,
                None,
                format!(
                    "holds {} rows × {} entries; the base file {} has {} scored rows × {}",
                    cand.rows,
                    cand.vocab,
                    reference.display(),
                    base.n_rows(),
                    base.n_vocab
                ),
            ));
        }
        let mut acc = CompatAccumulator::new();
        let mut reader = base.reader()?;
        let mut row = super::llamacpp::BaseRow::default();
        let mut logits = vec![0f32; cand.vocab];
        let mut r = 0usize;
        while reader.next_row(&mut row)? {
            cand.read_row(r, &mut logits);
            acc.push(&row, &logits, base.next_token(r as u64));
            r += 1;
        }
        acc.finish().ok_or_else(|| {
            Error::usage(
                reference,
                "llama.cpp prints statistics only from 100 rows; these files hold fewer",
            )
        })?
    };
    let protocol = protocol(&base);
    let sha = super::protocol::sha256_of(&protocol);
    let mut metrics = std::collections::BTreeMap::new();
    let mut uncertainty = std::collections::BTreeMap::new();
    let mut put = |name: &str, value: f64, sem: Option<f64>| {
        metrics.insert(name.to_owned(), value);
        if let Some(sem) = sem {
            uncertainty.insert(name.to_owned(), json!({"sem": sem}));
        }
    };
    put("kld_mean", stats.kld_mean.0, Some(stats.kld_mean.1));
    put("kld_median", stats.kld_median, None);
    put("kld_p90", stats.kld_p90, None);
    put("kld_p95", stats.kld_p95, None);
    put("kld_p99", stats.kld_p99, None);
    put("kld_p999", stats.kld_p999, None);
    put("kld_max", stats.kld_max, None);
    put("top1_agreement", stats.same_top.0, Some(stats.same_top.1));
    put("ppl_ref", stats.ppl_base.0, Some(stats.ppl_base.1));
    put("ppl_cand", stats.ppl_q.0, Some(stats.ppl_q.1));
    put("ppl_ratio", stats.ratio.0, Some(stats.ratio.1));
    put("delta_p_rms", stats.rms_dp.0, Some(stats.rms_dp.1));
    Ok(CompatMeasurement {
        n_positions: stats.n,
        protocol,
        protocol_sha256: sha,
        metrics,
        uncertainty,
        llamacpp: stats,
        definitions: super::definitions(),
    })
}
