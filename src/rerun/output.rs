//! The files of a measurement: `measurement.json` (the [`Measurement`] document) and
//! `positions.safetensors` (per-row arrays for plots and reanalysis).

use std::collections::BTreeMap;
use std::path::Path;

use super::document::Measurement;
use super::score::RunResult;
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::safetensors::serialize;
use crate::error::{Error, Result};
use crate::files::write_atomically;
use crate::kld::stats::Scored;

/// `positions.safetensors`: per scored row of each context length, tensors `ctx<L>.<name>`.
pub fn positions_file(runs: &[RunResult], protocol_sha256: &str) -> Vec<u8> {
    let mut owned: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = Vec::new();
    for run in runs {
        let n = run.rows.len() as u64;
        let p = format!("ctx{}", run.context_length);
        let f64s = |f: &dyn Fn(&Scored) -> f64| -> Vec<u8> {
            run.rows.iter().flat_map(|r| f(r).to_le_bytes()).collect()
        };
        let i32s = |f: &dyn Fn(&Scored) -> i32| -> Vec<u8> {
            run.rows.iter().flat_map(|r| f(r).to_le_bytes()).collect()
        };
        owned.push((
            format!("{p}.window"),
            Dtype::I32,
            vec![n],
            i32s(&|r| r.block as i32),
        ));
        owned.push((
            format!("{p}.position"),
            Dtype::I64,
            vec![n],
            run.rows
                .iter()
                .flat_map(|r| (r.position as i64).to_le_bytes())
                .collect(),
        ));
        owned.push((
            format!("{p}.kld"),
            Dtype::F64,
            vec![n],
            f64s(&|r| r.record.forward),
        ));
        owned.push((
            format!("{p}.kld_reverse"),
            Dtype::F64,
            vec![n],
            f64s(&|r| r.record.reverse),
        ));
        owned.push((
            format!("{p}.ref_top1"),
            Dtype::I32,
            vec![n],
            i32s(&|r| r.record.ref_top1 as i32),
        ));
        owned.push((
            format!("{p}.cand_top1"),
            Dtype::I32,
            vec![n],
            i32s(&|r| r.record.cand_top1 as i32),
        ));
        owned.push((
            format!("{p}.ref_top1_prob"),
            Dtype::F64,
            vec![n],
            f64s(&|r| r.record.ref_top1_prob),
        ));
        owned.push((
            format!("{p}.nll_ref"),
            Dtype::F64,
            vec![n],
            f64s(&|r| r.record.nll_ref.unwrap_or(f64::NAN)),
        ));
        owned.push((
            format!("{p}.nll_cand"),
            Dtype::F64,
            vec![n],
            f64s(&|r| r.record.nll_cand.unwrap_or(f64::NAN)),
        ));
        if run.labels.len() == run.rows.len() && !run.labels.is_empty() {
            // A conversation's rows: where each predicted token sits and what it is.
            owned.push((
                format!("{p}.token"),
                Dtype::I64,
                vec![n],
                run.tokens
                    .iter()
                    .flat_map(|&t| (t as i64).to_le_bytes())
                    .collect(),
            ));
            let codes = |f: &dyn Fn(&crate::conversation::eval::TokenLabel) -> u8| -> Vec<u8> {
                run.labels.iter().map(f).collect()
            };
            owned.push((
                format!("{p}.segment"),
                Dtype::U8,
                vec![n],
                codes(&|l| segment_code(l.segment)),
            ));
            owned.push((
                format!("{p}.role"),
                Dtype::U8,
                vec![n],
                codes(&|l| l.role.map_or(255, role_code)),
            ));
            owned.push((
                format!("{p}.message"),
                Dtype::I32,
                vec![n],
                run.labels
                    .iter()
                    .flat_map(|l| l.message.map_or(-1, |m| m as i32).to_le_bytes())
                    .collect(),
            ));
            owned.push((
                format!("{p}.conversation"),
                Dtype::I32,
                vec![n],
                run.labels
                    .iter()
                    .flat_map(|l| (l.conversation as i32).to_le_bytes())
                    .collect(),
            ));
        }
    }
    let tensors: Vec<(&str, Dtype, &[u64], &[u8])> = owned
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    let mut metadata = BTreeMap::new();
    metadata.insert("protocol_sha256".to_owned(), protocol_sha256.to_owned());
    metadata.insert(
        "definitions".to_owned(),
        "per scored row: window index (or bootstrap run in a single window), position j (row j predicts token j+1), forward and reverse KL in nats, first-index argmax of each model, the reference's top-1 probability, NLL of the true next token (NaN when unknown); for a conversation eval text also the predicted token's index in the token stream, its segment (0 content, 1 reasoning, 2 tool_call, 3 tool_result, 4 scaffolding), its message's role (0 system, 1 developer, 2 user, 3 assistant, 4 tool, 5 other, 255 none), its message (-1 none) and conversation".to_owned(),
    );
    serialize(&tensors, &metadata)
}

/// Bytes per scored row in positions.safetensors: window and both top-1 ids (i32), position
/// (i64), forward and reverse KL, the reference's top-1 probability and both NLLs (f64).
const ROW_BYTES: u64 = 4 + 8 + 8 + 8 + 4 + 4 + 8 + 8 + 8;
/// What a conversation's row adds: its token (i64), segment and role (u8), message and
/// conversation (i32).
const CONVERSATION_ROW_BYTES: u64 = 8 + 1 + 1 + 4 + 4;
/// Room for one measurement's documents beside its rows: measurement.json, and for `verify`
/// report.json, its renderings and the envelope (a few hundred KiB on the examples; their size
/// grows with context lengths, spans and claims, not with rows).
pub const DOCUMENTS_BYTES: u64 = 4 << 20;

/// The size of one measurement's files when the eval text makes `tokens` tokens: every scored
/// row of each context length (at most the tokens, plus a BOS per window) in
/// positions.safetensors, and [`DOCUMENTS_BYTES`].
pub fn size_estimate_of(options: &super::MeasureOptions, tokens: u64, conversation: bool) -> u64 {
    let per_row = ROW_BYTES
        + if conversation {
            CONVERSATION_ROW_BYTES
        } else {
            0
        };
    let rows: u64 = options
        .context_lengths
        .iter()
        .map(|&l| {
            let l = (l as u64).max(2);
            tokens.saturating_add(tokens / (l - 1)).saturating_add(l)
        })
        .fold(0, u64::saturating_add);
    rows.saturating_mul(per_row).saturating_add(DOCUMENTS_BYTES)
}

/// [`size_estimate_of`] for a request its pre-flight found `identity` for: its token count, else
/// the eval text's size in bytes (a token holds at least one; the llama.cpp lane tokenizes when
/// it runs).
pub fn size_estimate(r: &super::Request, identity: &super::preflight::Identity) -> u64 {
    let tokens = identity
        .token_count
        .map(|n| n as u64)
        .or_else(|| {
            r.eval_text
                .and_then(|t| std::fs::metadata(t).ok())
                .map(|m| m.len())
        })
        .unwrap_or(0);
    size_estimate_of(&r.options, tokens, identity.conversation.is_some())
}

/// A segment's code in positions.safetensors (its place in [`Segment::ALL`]).
pub fn segment_code(s: crate::kld::protocol::Segment) -> u8 {
    crate::kld::protocol::Segment::ALL
        .iter()
        .position(|&x| x == s)
        .unwrap_or(4) as u8
}

/// A role's code in positions.safetensors (its place in [`Role::ALL`]).
pub fn role_code(r: crate::kld::protocol::Role) -> u8 {
    crate::kld::protocol::Role::ALL
        .iter()
        .position(|&x| x == r)
        .unwrap_or(5) as u8
}

/// The document as written: pretty JSON and a trailing newline.
pub fn measurement_bytes(out: &Path, m: &Measurement) -> Result<Vec<u8>> {
    let mut text = serde_json::to_vec_pretty(m)
        .map_err(|e| Error::internal(out, format!("cannot encode measurement.json: {e}")))?;
    text.push(b'\n');
    Ok(text)
}

/// Write `measurement.json` and `positions.safetensors` into `out` (each written whole under a
/// temporary name and renamed). A run that is part of an output set writes through the set.
pub fn write_measurement(out: &Path, m: &Measurement, runs: &[RunResult]) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::write(out, e))?;
    write_atomically(
        &out.join("positions.safetensors"),
        &positions_file(runs, &m.protocol_sha256),
    )?;
    write_atomically(&out.join("measurement.json"), &measurement_bytes(out, m)?)
}

/// Write a rerun's files into its output set (with the set's run id in measurement.json) and
/// move the set into place as one unit; returns the measurement as written.
pub fn commit_into(set: crate::outset::OutputSet, rerun: super::Rerun) -> Result<Measurement> {
    let mut measurement = rerun.measurement;
    measurement.run_id = Some(set.run_id().to_owned());
    set.write(
        "positions.safetensors",
        &positions_file(&rerun.runs, &measurement.protocol_sha256),
    )?;
    set.write_json("measurement.json", &measurement.to_value())?;
    set.commit()?;
    Ok(measurement)
}
