//! `cardproof measure`: run reference and candidate over the tokenized eval text, reduce every
//! scored row with [`crate::measure`], and write `measurement.json` (the shape design.md gives,
//! read by `card` and `verify`) and `positions.safetensors` (per-row arrays for plots).

use crate::disclosure::precision::round_sig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde_json::{Value, json};
use sha2::Digest as _;
#[cfg(feature = "native")]
use sha2::Sha256 as Sha256Digest;

use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::hash::Manifest;
use crate::checkpoint::safetensors::serialize;
use crate::error::{Error, Result};
use crate::measure::protocol::{Bootstrap, Direction, Positions, Protocol, VocabMode, sha256_of};
use crate::measure::row::{self, RowRecord};
use crate::measure::stats::{self, Scored, Summary};
use crate::runner::Runner;
use crate::runner::tokens::{self, Bos, TokenStream};

/// Logit rows per chunk of the output head: bounds memory at about 64 MiB per model and thread.
const CHUNK_BYTES: usize = 64 * 1024 * 1024;
/// A logit dump (for oracles and reanalysis) is refused beyond this size.
const MAX_DUMP_BYTES: usize = 2 * 1024 * 1024 * 1024;

/// Everything that defines a measurement besides the two models and the text.
#[derive(Debug, Clone)]
pub struct MeasureOptions {
    pub direction: Direction,
    pub vocab: VocabMode,
    pub positions: Positions,
    pub bootstrap: Bootstrap,
    pub context_lengths: Vec<usize>,
    pub bos: Bos,
    /// Logit entries to use; default: the tokenizer's vocabulary (padding excluded).
    pub vocab_size: Option<usize>,
    /// Write both models' logits at the scored rows here (one context length only).
    pub dump_logits: Option<PathBuf>,
}

impl MeasureOptions {
    /// Every number that sizes a loop or an allocation, in range (context lengths, bootstrap
    /// resamples and level, stride, k, threshold) before any work starts; the binary and
    /// `verify` check earlier with their own wording, this guards every library caller.
    pub fn check(&self) -> Result<()> {
        let bad = |rule: String| Error::malformed(Path::new("measurement protocol"), None, rule);
        if self.context_lengths.is_empty() {
            return Err(bad("no context length given".into()));
        }
        for &l in &self.context_lengths {
            crate::measure::protocol::check_context_length(l as u64).map_err(bad)?;
        }
        self.bootstrap.check().map_err(bad)?;
        self.positions.check().map_err(bad)?;
        self.vocab.check().map_err(bad)
    }
}

/// Identity of one model as measured.
#[derive(Debug, Clone)]
pub struct ModelIdentity {
    pub path: PathBuf,
    pub format: String,
    pub manifest_sha256: String,
    pub lm_head_sha256: String,
    pub stored_dtype: String,
    pub environment: Value,
}

/// One context length's results.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub context_length: usize,
    pub n_windows: usize,
    pub dropped_tokens: usize,
    pub n_positions: usize,
    pub n_nonfinite: usize,
    pub summary: Summary,
    pub rows: Vec<Scored>,
    pub bootstrap_block: String,
}

/// A finished measurement.
pub struct ModelMeasurement {
    pub protocol: Value,
    pub protocol_sha256: String,
    pub eval: Value,
    pub runs: Vec<RunResult>,
    pub vocab_size: usize,
}

/// Progress: windows done out of all windows of all context lengths.
pub type Progress<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// The measurement protocol as JSON: every setting that changes a number.
/// `padding`: `excluded` (rows beyond the tokenizer's vocabulary left out), `included`, or `none`
/// (the logit rows have no padding).
pub fn protocol_json(o: &MeasureOptions, vocab_size: usize, padding: &'static str) -> Value {
    let base = Protocol {
        direction: o.direction,
        units: "nats",
        vocab: o.vocab,
        padding,
        vocab_size,
        positions: o.positions,
        context_length: None,
        aggregation: "mean_over_positions",
        bootstrap: o.bootstrap,
        bootstrap_block: "window".into(),
        top1: "first index of the maximum",
        llamacpp_compat: false,
    };
    let mut p = base.to_json();
    if let Some(map) = p.as_object_mut() {
        map.remove("context_length");
        map.insert("context_lengths".into(), json!(o.context_lengths));
        map.insert("bos".into(), json!(o.bos.as_str()));
        map.insert(
            "windows".into(),
            json!("non_overlapping; trailing partial window dropped"),
        );
    }
    p
}

/// The tokenized eval text and what the tokenizer says about it.
pub struct EvalInput<'a> {
    pub stream: &'a TokenStream,
    pub text_path: &'a Path,
    pub bos_id: Option<u32>,
    /// Tokens the tokenizer knows: logit entries beyond are padding.
    pub tokenizer_vocab: usize,
}

/// One context length's windows and the rows scored in each.
pub struct RunPlan {
    pub windows: tokens::Windows,
    pub rows: Vec<usize>,
}

/// The logit entries to use: the requested size, else the tokenizer's (padding excluded).
fn used_vocab(eval: &EvalInput, width: usize, o: &MeasureOptions) -> Result<usize> {
    if eval.tokenizer_vocab > width {
        return Err(Error::malformed(
            eval.text_path,
            None,
            format!(
                "the tokenizer knows {} tokens but the models' logit rows have only {width}",
                eval.tokenizer_vocab
            ),
        ));
    }
    let vocab_size = o.vocab_size.unwrap_or(eval.tokenizer_vocab.max(1));
    if vocab_size == 0 || vocab_size > width {
        return Err(Error::malformed(
            eval.text_path,
            None,
            format!("vocabulary size {vocab_size} is outside 1..={width} (the logit rows' width)"),
        ));
    }
    Ok(vocab_size)
}

/// The windows of every context length and the rows the position policy scores in them.
pub fn plan_runs(eval: &EvalInput, o: &MeasureOptions) -> Result<Vec<RunPlan>> {
    o.check()?;
    o.context_lengths
        .iter()
        .map(|&l| {
            let windows = tokens::windows(eval.stream, eval.text_path, l, o.bos, eval.bos_id)?;
            let rows: Vec<usize> = (0..l)
                .filter(|&j| o.positions.selects(j as u64, l as u64))
                .collect();
            if rows.is_empty() {
                return Err(Error::malformed(
                    eval.text_path,
                    None,
                    format!(
                        "the position policy {:?} selects no row of a {l}-token window",
                        o.positions
                    ),
                ));
            }
            Ok(RunPlan { windows, rows })
        })
        .collect()
}

/// Each window's records (one per scored row, `None` for a non-finite row) as scored rows with
/// their bootstrap blocks: windows, or runs of rows inside a single window.
fn scored_rows(plan: &RunPlan, per_window: Vec<Vec<Option<RowRecord>>>) -> (Vec<Scored>, usize) {
    let l = plan.windows.length;
    let single = plan.windows.windows.len() == 1;
    let run_len = (plan.rows.len() / 100).clamp(1, crate::measure::BOOTSTRAP_MAX_RUN);
    let mut scored = Vec::new();
    let mut n_nonfinite = 0;
    for (w, records) in per_window.into_iter().enumerate() {
        for (rank, (record, &j)) in records.into_iter().zip(&plan.rows).enumerate() {
            match record {
                Some(record) => scored.push(Scored {
                    record,
                    block: if single {
                        (rank / run_len) as u32
                    } else {
                        w as u32
                    },
                    position: j as u64,
                    window_len: l as u64,
                }),
                None => n_nonfinite += 1,
            }
        }
    }
    (scored, n_nonfinite)
}

/// Statistics of every run and the measurement's protocol and eval records.
fn finish_measurement(
    eval: &EvalInput,
    o: &MeasureOptions,
    plans: &[RunPlan],
    per_run: Vec<Vec<Vec<Option<RowRecord>>>>,
    vocab_size: usize,
    width: usize,
) -> Result<ModelMeasurement> {
    let want_reverse = o.direction.reverse();
    let mut runs = Vec::new();
    for (plan, per_window) in plans.iter().zip(per_run) {
        let l = plan.windows.length;
        let (scored, n_nonfinite) = scored_rows(plan, per_window);
        if scored.is_empty() {
            return Err(Error::malformed(
                eval.text_path,
                None,
                format!("every scored row at context length {l} has non-finite logits"),
            ));
        }
        let summary = stats::summarize(
            &scored,
            o.direction.forward(),
            want_reverse,
            o.bootstrap.resamples,
            o.bootstrap.seed,
            o.bootstrap.level,
        );
        let single = plan.windows.windows.len() == 1;
        let run_len = (plan.rows.len() / 100).clamp(1, crate::measure::BOOTSTRAP_MAX_RUN);
        runs.push(RunResult {
            context_length: l,
            n_windows: plan.windows.windows.len(),
            dropped_tokens: plan.windows.dropped_tokens,
            n_positions: scored.len(),
            n_nonfinite,
            summary,
            rows: scored,
            bootstrap_block: if single {
                format!("run:{run_len}")
            } else {
                "window".into()
            },
        });
    }
    let padding = if vocab_size < width {
        "excluded"
    } else if eval.tokenizer_vocab < width {
        "included"
    } else {
        "none"
    };
    let protocol = protocol_json(o, vocab_size, padding);
    let stream = eval.stream;
    let eval = json!({
        "text_path": eval.text_path.display().to_string(),
        "text_sha256": stream.text_sha256,
        "text_bytes": stream.text_bytes,
        "tokens_sha256": tokens::tokens_sha256(&stream.ids),
        "token_count": stream.ids.len(),
        "bos": o.bos.as_str(),
    });
    Ok(ModelMeasurement {
        protocol_sha256: sha256_of(&protocol),
        protocol,
        eval,
        runs,
        vocab_size,
    })
}

/// Measure with a runner that reduces rows itself (the transformers runner): `records` gets the
/// plans and the vocabulary size and returns, per run, per window, one record per scored row.
pub fn measure_records(
    eval: &EvalInput,
    o: &MeasureOptions,
    width: usize,
    records: impl FnOnce(&[RunPlan], usize) -> Result<Vec<Vec<Vec<Option<RowRecord>>>>>,
) -> Result<ModelMeasurement> {
    let vocab_size = used_vocab(eval, width, o)?;
    if o.dump_logits.is_some() {
        return Err(Error::malformed(
            eval.text_path,
            None,
            "--dump-logits needs a runner that returns logits (--runner native)",
        ));
    }
    let plans = plan_runs(eval, o)?;
    let per_run = records(&plans, vocab_size)?;
    finish_measurement(eval, o, &plans, per_run, vocab_size, width)
}

/// Run both models over the eval text for every context length.
pub fn measure_models(
    reference: &dyn Runner,
    candidate: &dyn Runner,
    eval: &EvalInput,
    o: &MeasureOptions,
    progress: Progress,
) -> Result<ModelMeasurement> {
    let text_path = eval.text_path;
    let width = reference.vocab();
    if candidate.vocab() != width {
        return Err(Error::malformed(
            text_path,
            None,
            format!(
                "vocabulary mismatch: the reference's logit rows have {width} entries, the candidate's {}",
                candidate.vocab()
            ),
        ));
    }
    let vocab_size = used_vocab(eval, width, o)?;
    if o.dump_logits.is_some() && o.context_lengths.len() != 1 {
        return Err(Error::malformed(
            text_path,
            None,
            "--dump-logits takes exactly one --context-length",
        ));
    }
    let plans = plan_runs(eval, o)?;
    let total: usize = plans.iter().map(|p| p.windows.windows.len()).sum();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let chunk = (CHUNK_BYTES / 4 / width).max(1);
    let want_reverse = o.direction.reverse();

    let mut per_run = Vec::new();
    for plan in &plans {
        let (windows, rows) = (&plan.windows, &plan.rows);
        let dump = o.dump_logits.is_some();
        if dump && windows.windows.len() * rows.len() * vocab_size * 4 * 2 > MAX_DUMP_BYTES {
            return Err(Error::malformed(
                text_path,
                None,
                format!(
                    "--dump-logits would write over {MAX_DUMP_BYTES} bytes; use a shorter eval text"
                ),
            ));
        }
        type WindowOut = (Vec<Option<RowRecord>>, Vec<f32>, Vec<f32>);
        let results: Vec<WindowOut> = windows
            .windows
            .par_iter()
            .map(|ids| -> Result<WindowOut> {
                let a = reference.window(ids)?;
                let b = candidate.window(ids)?;
                let mut scratch = row::Scratch::default();
                let mut out = Vec::with_capacity(rows.len());
                let (mut dump_a, mut dump_b) = (Vec::new(), Vec::new());
                for part in rows.chunks(chunk) {
                    let la = a.logits(part)?;
                    let lb = b.logits(part)?;
                    for (k, &j) in part.iter().enumerate() {
                        let ra = &la[k * width..k * width + vocab_size];
                        let rb = &lb[k * width..k * width + vocab_size];
                        let token = Some(ids[j + 1]).filter(|&t| (t as usize) < vocab_size);
                        let exact_nll = a.token_nll(j);
                        out.push(
                            row::reduce(ra, rb, token, o.vocab, want_reverse, &mut scratch).map(
                                |mut record: RowRecord| {
                                    if let Some(n) = exact_nll.filter(|_| record.nll_ref.is_some())
                                    {
                                        record.nll_ref = Some(n);
                                    }
                                    record
                                },
                            ),
                        );
                        if dump {
                            dump_a.extend_from_slice(ra);
                            dump_b.extend_from_slice(rb);
                        }
                    }
                }
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(n, total);
                Ok((out, dump_a, dump_b))
            })
            .collect::<Result<_>>()?;
        let (mut dump_a, mut dump_b) = (Vec::new(), Vec::new());
        let mut dump_meta: Vec<(u32, u64, u32)> = Vec::new();
        let mut per_window = Vec::with_capacity(results.len());
        for (w, (records, da, db)) in results.into_iter().enumerate() {
            if dump {
                for &j in rows {
                    dump_meta.push((w as u32, j as u64, windows.windows[w][j + 1]));
                }
            }
            per_window.push(records);
            dump_a.extend(da);
            dump_b.extend(db);
        }
        if let Some(dir) = &o.dump_logits {
            write_dump(dir, "reference", &dump_a, &dump_meta, windows, vocab_size)?;
            write_dump(dir, "candidate", &dump_b, &dump_meta, windows, vocab_size)?;
        }
        per_run.push(per_window);
    }
    finish_measurement(eval, o, &plans, per_run, vocab_size, width)
}

/// A logit dump in the layout `cardproof kld` reads, plus the windows' input ids.
fn write_dump(
    dir: &Path,
    side: &str,
    logits: &[f32],
    meta: &[(u32, u64, u32)],
    windows: &tokens::Windows,
    vocab: usize,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::write(dir, e))?;
    let n = meta.len() as u64;
    let window: Vec<u8> = meta
        .iter()
        .flat_map(|m| (m.0 as i32).to_le_bytes())
        .collect();
    let position: Vec<u8> = meta
        .iter()
        .flat_map(|m| (m.1 as i64).to_le_bytes())
        .collect();
    let token: Vec<u8> = meta
        .iter()
        .flat_map(|m| (m.2 as i32).to_le_bytes())
        .collect();
    let ids: Vec<u8> = windows
        .windows
        .iter()
        .flatten()
        .flat_map(|&t| (t as i32).to_le_bytes())
        .collect();
    let logit_bytes: &[u8] = bytemuck::cast_slice(logits);
    let mut metadata = BTreeMap::new();
    metadata.insert("vocab_size".to_owned(), vocab.to_string());
    metadata.insert("context_length".to_owned(), windows.length.to_string());
    let bytes = serialize(
        &[
            ("logits", Dtype::F32, &[n, vocab as u64], logit_bytes),
            ("tokens", Dtype::I32, &[n], &token),
            ("positions", Dtype::I64, &[n], &position),
            ("window", Dtype::I32, &[n], &window),
            (
                "input_ids",
                Dtype::I32,
                &[windows.windows.len() as u64, windows.length as u64],
                &ids,
            ),
        ],
        &metadata,
    );
    write_atomically(&dir.join(format!("{side}.logits.safetensors")), &bytes)
}

/// Write to a fresh temporary file beside `path` (`.NAME.cardproof-tmp-XXXXXX`, unique, so two
/// writers never share one), then rename: a reader never sees a partial file. Errors name `path`
/// and are worded as writes. A set of files that belong together is written as one
/// [`crate::outset::OutputSet`] instead.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".cardproof-tmp-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder
        .tempfile_in(dir)
        .map_err(|e| Error::write(path, e))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| Error::write(path, e))?;
    tmp.persist(path).map_err(|e| Error::write(path, e.error))?;
    Ok(())
}

/// `positions.safetensors`: per scored row of each context length, tensors `ctx<L>.<name>`.
pub fn positions_file(m: &ModelMeasurement) -> Vec<u8> {
    let mut owned: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = Vec::new();
    for run in &m.runs {
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
    }
    let tensors: Vec<(&str, Dtype, &[u64], &[u8])> = owned
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    let mut metadata = BTreeMap::new();
    metadata.insert("protocol_sha256".to_owned(), m.protocol_sha256.clone());
    metadata.insert(
        "definitions".to_owned(),
        "per scored row: window index (or bootstrap run in a single window), position j (row j predicts token j+1), forward and reverse KL in nats, first-index argmax of each model, the reference's top-1 probability, NLL of the true next token (NaN when unknown)".to_owned(),
    );
    serialize(&tensors, &metadata)
}

/// One run's JSON record.
pub fn run_json(run: &RunResult) -> Value {
    json!({
        "context_length": run.context_length,
        "n_windows": run.n_windows,
        "dropped_tokens": run.dropped_tokens,
        "n_positions": run.n_positions,
        "n_nonfinite": run.n_nonfinite,
        "bootstrap_block": run.bootstrap_block,
        "metrics": run.summary.metrics,
        "uncertainty": run.summary.uncertainty,
        "low_support": run.summary.low_support,
        "diagnostics": run.summary.diagnostics,
    })
}

/// The `measurement.json` document (without `schema_version`, which the writer adds).
pub fn measurement_json(
    m: &ModelMeasurement,
    o: &MeasureOptions,
    reference: &ModelIdentity,
    candidate: &ModelIdentity,
    environment: Value,
) -> Value {
    let identity = |id: &ModelIdentity| {
        json!({
            "path": id.path.display().to_string(),
            "format": id.format,
            "manifest_sha256": id.manifest_sha256,
            "lm_head_sha256": id.lm_head_sha256,
            "stored_dtype": id.stored_dtype,
            "runner": id.environment,
        })
    };
    json!({
        "protocol": m.protocol,
        "protocol_sha256": m.protocol_sha256,
        "reference": identity(reference),
        "candidate": identity(candidate),
        "eval": m.eval,
        "environment": environment,
        "runs": m.runs.iter().map(run_json).collect::<Vec<_>>(),
        "definitions": crate::measure::definitions(),
        "fidelity": fidelity_block(m, o, reference, candidate, &environment),
    })
}

/// Metrics a card's `results` carry by default.
const CLAIMED: &[&str] = &[
    "kld_mean",
    "kld_p99",
    "kld_reverse_mean",
    "top1_agreement",
    "ppl_ratio",
];

/// A ready `fidelity:` block for the card. The repositories and revisions are not known to a
/// local measurement; `cardproof card` adds them.
pub fn fidelity_block(
    m: &ModelMeasurement,
    o: &MeasureOptions,
    reference: &ModelIdentity,
    candidate: &ModelIdentity,
    environment: &Value,
) -> Value {
    let positions = match o.positions {
        Positions::All => json!({"policy": "all"}),
        Positions::Stride { stride, offset } => {
            json!({"policy": "stride", "stride": stride, "offset": offset})
        }
        Positions::SecondHalf => json!({"policy": "second_half"}),
        Positions::From { from } => json!({"policy": "from", "from": from}),
    };
    // No padding rows at all reads as the default policy, `excluded`.
    let padding = if m.protocol["padding"] == "included" {
        "included"
    } else {
        "excluded"
    };
    let vocab = match o.vocab {
        VocabMode::Full => json!({"mode": "full", "padding": padding}),
        VocabMode::TopK { k, tail } => {
            json!({"mode": "top_k", "k": k, "tail": tail, "padding": padding})
        }
        VocabMode::Threshold { log_p } => {
            json!({"mode": "threshold", "log_p": log_p, "padding": padding})
        }
    };
    let mut results = Vec::new();
    for run in &m.runs {
        for name in CLAIMED {
            let Some(value) = run.summary.metrics.get(*name) else {
                continue;
            };
            let mut claim = json!({"metric": name, "value": crate::disclosure::precision::round_claim(name, *value)});
            if let Some(u) = run.summary.uncertainty.get(*name)
                && u.ci95.iter().all(|v| v.is_finite())
            {
                let half = (u.ci95[1] - u.ci95[0]) / 2.0;
                claim["uncertainty"] = json!(round_sig(half, 2));
            }
            claim["context_length"] = json!(run.context_length);
            claim["n_positions"] = json!(run.n_positions);
            if run.n_nonfinite > 0 {
                claim["n_nonfinite"] = json!(run.n_nonfinite);
            }
            results.push(claim);
        }
    }
    let dtype = match reference.stored_dtype.as_str() {
        d @ ("bf16" | "f16" | "f32") => d,
        _ => "other",
    };
    json!({
        "schema": "cardproof/v1",
        "reference": {
            "format": if reference.format == "gguf" { "gguf" } else { "safetensors" },
            "dtype": dtype,
            "files_sha256": reference.manifest_sha256,
        },
        "candidate": {"files_sha256": candidate.manifest_sha256},
        "runtime": runtime_block(environment),
        "eval": {
            "text": {
                "source": Path::new(m.eval["text_path"].as_str().unwrap_or_default())
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                "sha256": m.eval["text_sha256"],
            },
            "tokens": {"count": m.eval["token_count"], "sha256": m.eval["tokens_sha256"]},
            "bos": o.bos.as_str(),
        },
        "protocol": {
            "context_lengths": o.context_lengths,
            "positions": positions,
            "kl": {"direction": o.direction, "units": "nats"},
            "vocab": vocab,
            "aggregation": {
                "statistic": "mean_over_positions",
                "uncertainty": {
                    "method": "block_bootstrap",
                    "level": o.bootstrap.level,
                    "resamples": o.bootstrap.resamples,
                    "seed": o.bootstrap.seed,
                    "block": "window",
                },
            },
        },
        "results": results,
    })
}

/// The card's `runtime` item from a measurement's environment record.
fn runtime_block(environment: &Value) -> Value {
    if environment["runner"] != "transformers" {
        return json!({
            "engine": "cardproof",
            "engine_version": env!("CARGO_PKG_VERSION"),
            "attention_backend": environment["attention"],
            "kv_cache_dtype": environment["kv_cache_dtype"],
            "compute_dtype": environment["compute_dtype"],
            "device": environment["device"],
            "device_count": 1,
        });
    }
    let reported = &environment["transformers_runner"];
    let short = |v: &Value| match v.as_str() {
        Some("bfloat16") => "bf16".to_owned(),
        Some("float16") => "f16".to_owned(),
        Some("float32") => "f32".to_owned(),
        Some(other) => other.to_owned(),
        None => "?".to_owned(),
    };
    let gpus = reported["gpus"].as_array().map_or(0, Vec::len);
    json!({
        "engine": "transformers",
        "engine_version": environment["engine_version"],
        "attention_backend": environment["attention"],
        "kv_cache_dtype": short(&environment["kv_cache_dtype"]),
        "compute_dtype": short(&environment["compute_dtype"]),
        "device": environment["device"],
        "device_count": gpus.max(1),
        "flags": {
            "torch": reported["torch"],
            "cuda": reported["cuda"].as_str().unwrap_or("none"),
            "tf32": reported["tf32"],
            "prefill_chunk": reported["chunk_size"],
            "reduction": "cardproof transformers runner (float64)",
        },
    })
}

/// The CPU's model name, from /proc/cpuinfo where there is one.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

/// A `measure` run with the native runner.
#[cfg(feature = "native")]
pub struct NativeRequest<'a> {
    pub reference: &'a Path,
    pub candidate: &'a Path,
    pub eval_text: &'a Path,
    pub tokenizer: Option<&'a Path>,
    pub options: &'a MeasureOptions,
    pub compute: crate::runner::native::ComputeDtype,
    pub emulate: crate::runner::native::Emulate,
    pub threads: usize,
    pub out: &'a Path,
    /// The candidate's manifest when the caller has hashed it already.
    pub candidate_manifest: Option<&'a Manifest>,
}

/// Everything loaded for a native run: the tokenized text, both models and their identities.
#[cfg(feature = "native")]
pub struct Prepared {
    pub tokenizer: tokens::TokenizerFile,
    pub stream: TokenStream,
    pub reference: crate::runner::native::NativeModel,
    pub candidate: crate::runner::native::NativeModel,
    pub reference_id: ModelIdentity,
    pub candidate_id: ModelIdentity,
}

/// The reference's tokenizer (or the one given), checked against the candidate's when it has
/// one, and the eval text tokenized once with it.
#[cfg(feature = "native")]
fn tokenize_eval(
    reference: &Path,
    candidate: &Path,
    tokenizer: Option<&Path>,
    eval_text: &Path,
) -> Result<(tokens::TokenizerFile, TokenStream)> {
    let tokenizer_path = tokenizer
        .map(Path::to_owned)
        .unwrap_or_else(|| tokens::tokenizer_path(reference));
    let loaded = tokens::load_tokenizer(&tokenizer_path)?;
    let candidate_tokenizer = tokens::tokenizer_path(candidate);
    if tokenizer.is_none() && candidate_tokenizer.exists() {
        tokens::check_same_tokenizer(&loaded, &tokens::load_tokenizer(&candidate_tokenizer)?)?;
    }
    let stream = tokens::tokenize(&loaded, eval_text)?;
    Ok((loaded, stream))
}

/// The root digest of a checkpoint's manifest, from a manifest the caller already has (verify
/// hashes the candidate for its report: the files are not read twice) or by hashing.
#[cfg(feature = "native")]
fn root_digest(path: &Path, threads: usize, known: Option<&Manifest>) -> Result<String> {
    use crate::checkpoint::hash::{HashOptions, hash_path};
    if let Some(m) = known {
        return Ok(m.root_sha256.clone());
    }
    let options = HashOptions {
        threads: Some(threads),
        include_all: false,
    };
    Ok(hash_path(path, &options, &|_| {})?.root_sha256)
}

/// Tokenize the eval text, load both models and hash their files.
#[cfg(feature = "native")]
pub fn prepare_native(r: &NativeRequest, stage: &(dyn Fn(&str) + Sync)) -> Result<Prepared> {
    use crate::runner::native;
    r.options.check()?;

    stage("tokenizing");
    let (tokenizer, stream) = tokenize_eval(r.reference, r.candidate, r.tokenizer, r.eval_text)?;

    stage("loading models");
    let reference = native::load(r.reference, r.compute, r.emulate)?;
    let candidate = native::load(r.candidate, r.compute, r.emulate)?;
    stage("hashing");
    let reference_id = identity(&reference, r.reference, r.threads, None)?;
    let candidate_id = identity(&candidate, r.candidate, r.threads, r.candidate_manifest)?;
    Ok(Prepared {
        tokenizer,
        stream,
        reference,
        candidate,
        reference_id,
        candidate_id,
    })
}

#[cfg(feature = "native")]
fn identity(
    m: &crate::runner::native::NativeModel,
    given: &Path,
    threads: usize,
    known: Option<&Manifest>,
) -> Result<ModelIdentity> {
    Ok(ModelIdentity {
        path: given.to_owned(),
        format: m.format.to_owned(),
        manifest_sha256: root_digest(given, threads, known)?,
        lm_head_sha256: m.lm_head_sha256.clone(),
        stored_dtype: m.stored_dtype.clone(),
        environment: Runner::environment(m),
    })
}

/// What every native run records about where and how it ran.
#[cfg(feature = "native")]
fn runtime_environment(
    candidate: &crate::runner::native::NativeModel,
    compute: crate::runner::native::ComputeDtype,
    emulate: crate::runner::native::Emulate,
    threads: usize,
) -> Value {
    use crate::runner::native;
    json!({
        "runner": "native",
        "runner_version": env!("CARGO_PKG_VERSION"),
        "engine": "candle",
        "engine_version": native::CANDLE_VERSION,
        "device": format!("cpu: {}", cpu_name()),
        "compute_dtype": compute.as_str(),
        "attention": "eager",
        "kv_cache_dtype": reference_kv(candidate, compute),
        "emulate": emulate,
        "threads": threads,
        "lane": match emulate {
            native::Emulate::ReferenceSemantics => "reference semantics: weights dequantized exactly as their format defines, declared activation and KV-cache quantization emulated (fake-quant), exact softmax attention",
            native::Emulate::LlamacppCpu => "llama.cpp cpu emulation: weights dequantized exactly, activations quantized to each weight type's ggml dot-product partner (q8_0, q8_K, f16, bf16), f16 KV cache",
        },
    })
}

/// The document with `schema_version` first.
fn versioned(mut doc: Value) -> Value {
    let mut out = json!({"schema_version": crate::JSON_SCHEMA_VERSION});
    if let (Some(v), Some(d)) = (out.as_object_mut(), doc.as_object_mut()) {
        v.append(d);
    }
    out
}

/// The environment record of a native run.
#[cfg(feature = "native")]
pub fn native_environment(r: &NativeRequest, p: &Prepared) -> Value {
    let mut env = runtime_environment(&p.candidate, r.compute, r.emulate, r.threads);
    env["tokenizer"] = json!({"path": p.tokenizer.path.display().to_string(), "sha256": p.tokenizer.sha256, "vocab_size": p.tokenizer.vocab_size});
    env
}

/// Measure a prepared pair; returns the measurement and its versioned document.
#[cfg(feature = "native")]
pub fn measure_prepared(
    r: &NativeRequest,
    p: &Prepared,
    progress: Progress,
) -> Result<(ModelMeasurement, Value)> {
    let m = measure_models(
        &p.reference,
        &p.candidate,
        &EvalInput {
            stream: &p.stream,
            text_path: r.eval_text,
            bos_id: p.tokenizer.bos_id,
            tokenizer_vocab: p.tokenizer.vocab_size,
        },
        r.options,
        progress,
    )?;
    let doc = measurement_json(
        &m,
        r.options,
        &p.reference_id,
        &p.candidate_id,
        native_environment(r, p),
    );
    Ok((m, versioned(doc)))
}

/// Write `measurement.json` and `positions.safetensors` into `out`.
pub fn write_measurement(out: &Path, m: &ModelMeasurement, document: &Value) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::write(out, e))?;
    write_atomically(&out.join("positions.safetensors"), &positions_file(m))?;
    let text = serde_json::to_string_pretty(document)
        .map_err(|e| Error::malformed(out, None, format!("cannot encode measurement.json: {e}")))?;
    write_atomically(
        &out.join("measurement.json"),
        format!("{text}\n").as_bytes(),
    )
}

/// Load both models, tokenize, measure, and write `measurement.json` and `positions.safetensors`
/// into `out` (each written whole under a temporary name and renamed, so a failed run leaves no
/// file that looks complete). Returns the versioned document.
#[cfg(feature = "native")]
pub fn run_native(
    r: &NativeRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<Value> {
    let prepared = prepare_native(r, stage)?;
    stage("measuring");
    let (m, document) = measure_prepared(r, &prepared, progress)?;
    write_measurement(r.out, &m, &document)?;
    Ok(document)
}

#[cfg(feature = "native")]
fn reference_kv(
    candidate: &crate::runner::native::NativeModel,
    compute: crate::runner::native::ComputeDtype,
) -> String {
    match &candidate.decoder.report.kv_cache {
        Some(kv) if kv.starts_with("f16") => "f16".to_owned(),
        Some(_) => "fp8_e4m3".to_owned(),
        None => compute.as_str().to_owned(),
    }
}

/// A `measure` run with the transformers runner (a Python subprocess on the user's GPU).
#[cfg(feature = "native")]
pub struct TransformersRequest<'a> {
    pub reference: &'a Path,
    pub candidate: &'a Path,
    pub eval_text: &'a Path,
    pub tokenizer: Option<&'a Path>,
    pub options: &'a MeasureOptions,
    pub runner: &'a crate::runner::transformers::TransformersOptions,
    /// Threads for hashing the checkpoints.
    pub threads: usize,
    pub out: &'a Path,
    /// The candidate's manifest when the caller has hashed it already.
    pub candidate_manifest: Option<&'a Manifest>,
}

/// What a transformers run produced besides the measurement: the runner's gate numbers.
#[cfg(feature = "native")]
pub struct TransformersRun {
    pub measurement: ModelMeasurement,
    pub document: Value,
    pub gates: Value,
    /// The first window of the first run and its scored rows (the gates ran there).
    pub first_window: Vec<u32>,
}

/// Identity of a safetensors checkpoint without loading it: manifest and output-head digests.
#[cfg(feature = "native")]
fn checkpoint_identity(
    path: &Path,
    threads: usize,
    environment: Value,
    known: Option<&Manifest>,
) -> Result<(ModelIdentity, usize)> {
    use crate::runner::native::weights::{SafetensorsStore, WeightStore};
    let config_path = path.join("config.json");
    let json: Value = crate::files::read_config(&config_path)?;
    let config = crate::runner::native::config::ModelConfig::from_hf(&config_path, &json)?;
    let store = SafetensorsStore::open(path, json)?;
    let head = if store.has("lm_head.weight") || !config.tie_embeddings {
        "lm_head.weight"
    } else {
        "model.embed_tokens.weight"
    };
    Ok((
        ModelIdentity {
            path: path.to_owned(),
            format: "safetensors".into(),
            manifest_sha256: root_digest(path, threads, known)?,
            lm_head_sha256: store.tensor_sha256(head)?.unwrap_or_default(),
            stored_dtype: store.stored_dtype("model.embed_tokens.weight"),
            environment,
        },
        config.vocab,
    ))
}

/// The environment record of a transformers run: what the runner reported, in the fields every
/// measurement has.
#[cfg(feature = "native")]
fn transformers_environment(reported: &Value, tokenizer: &tokens::TokenizerFile) -> Value {
    let gpus = reported["gpus"].as_array().cloned().unwrap_or_default();
    let device = match gpus.first() {
        Some(g) => format!(
            "{} (compute capability {}){}",
            g["name"].as_str().unwrap_or("?"),
            g["compute_capability"].as_str().unwrap_or("?"),
            if gpus.len() > 1 {
                format!(" x{}", gpus.len())
            } else {
                String::new()
            }
        ),
        None => format!("cpu: {}", cpu_name()),
    };
    let models = &reported["models"];
    let attention = |side: &str| models[side]["attention"].as_str().unwrap_or("?").to_owned();
    let attention = if attention("reference") == attention("candidate") {
        attention("reference")
    } else {
        format!(
            "{} (reference), {} (candidate)",
            attention("reference"),
            attention("candidate")
        )
    };
    json!({
        "runner": "transformers",
        "runner_version": env!("CARGO_PKG_VERSION"),
        "engine": "transformers",
        "engine_version": reported["transformers"],
        "torch_version": reported["torch"],
        "cuda_version": reported["cuda"],
        "device": device,
        "compute_dtype": reported["dtype"],
        "attention": attention,
        "kv_cache_dtype": models["candidate"]["kv_cache_dtype"],
        "tf32": reported["tf32"],
        "lane": format!("transformers {} on {}: the engine's own kernels (attention {}), weights as transformers loads them, reduction in float64 on the device", reported["transformers"].as_str().unwrap_or("?"), device, attention),
        "tokenizer": {"path": tokenizer.path.display().to_string(), "sha256": tokenizer.sha256, "vocab_size": tokenizer.vocab_size},
        "transformers_runner": reported,
    })
}

/// Tokenize, run the transformers runner, and measure (nothing written).
#[cfg(feature = "native")]
pub fn measure_transformers(
    r: &TransformersRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<TransformersRun> {
    use crate::runner::transformers::{self, RunWork};
    r.options.check()?;
    stage("tokenizing");
    if !matches!(r.options.vocab, VocabMode::Full) {
        return Err(Error::malformed(
            r.candidate,
            None,
            "the transformers runner computes full-vocabulary KL only; use --runner native for top-k or threshold modes",
        ));
    }
    for model in [r.reference, r.candidate] {
        if crate::runner::native::resolve(model)?.1 != "safetensors" {
            return Err(Error::malformed(
                model,
                None,
                "the transformers runner loads safetensors checkpoint directories; GGUF runs with --runner native",
            ));
        }
    }
    let (tokenizer, stream) = tokenize_eval(r.reference, r.candidate, r.tokenizer, r.eval_text)?;
    stage("hashing");
    let (reference_id, width) = checkpoint_identity(r.reference, r.threads, Value::Null, None)?;
    // The same weights on both sides (a sweep): hashed once.
    let (candidate_id, cand_width) = if r.candidate == r.reference {
        (reference_id.clone(), width)
    } else {
        checkpoint_identity(r.candidate, r.threads, Value::Null, r.candidate_manifest)?
    };
    if cand_width != width {
        return Err(Error::malformed(
            r.candidate,
            Some("config.json vocab_size"),
            format!(
                "vocabulary mismatch: the candidate's logit rows have {cand_width} entries, the reference's {width}"
            ),
        ));
    }
    let eval = EvalInput {
        stream: &stream,
        text_path: r.eval_text,
        bos_id: tokenizer.bos_id,
        tokenizer_vocab: tokenizer.vocab_size,
    };
    stage("running the transformers runner");
    let mut output = None;
    let mut first_window = Vec::new();
    let measurement = measure_records(&eval, r.options, width, |plans, vocab_size| {
        let work: Vec<RunWork> = plans
            .iter()
            .map(|p| RunWork {
                context_length: p.windows.length,
                windows: &p.windows.windows,
                rows: &p.rows,
            })
            .collect();
        first_window = plans
            .first()
            .and_then(|p| p.windows.windows.first())
            .cloned()
            .unwrap_or_default();
        let report = |stage_name: &str, counts: Option<(usize, usize)>| match counts {
            Some((done, total)) => progress(done, total),
            None => stage(stage_name),
        };
        let out = transformers::run(
            r.reference,
            r.candidate,
            &work,
            vocab_size,
            r.runner,
            &report,
        )?;
        let records = std::mem::take(&mut output.insert(out).records);
        Ok(records)
    })?;
    let output = output
        .ok_or_else(|| Error::runner(r.candidate, "the transformers runner produced no output"))?;
    let environment = transformers_environment(&output.environment, &tokenizer);
    let reference_id = ModelIdentity {
        environment: output.environment["models"]["reference"].clone(),
        ..reference_id
    };
    let candidate_id = ModelIdentity {
        environment: output.environment["models"]["candidate"].clone(),
        ..candidate_id
    };
    let document = versioned(measurement_json(
        &measurement,
        r.options,
        &reference_id,
        &candidate_id,
        environment,
    ));
    Ok(TransformersRun {
        measurement,
        document,
        gates: output.gates,
        first_window,
    })
}

/// `measure --runner transformers`: measure and write `measurement.json` and
/// `positions.safetensors` into `out`. Returns the versioned document.
#[cfg(feature = "native")]
pub fn run_transformers(
    r: &TransformersRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<Value> {
    let run = measure_transformers(r, stage, progress)?;
    write_measurement(r.out, &run.measurement, &run.document)?;
    Ok(run.document)
}

/// `measure --runner transformers --sweep attention=A,B,...`: one model's weights against
/// themselves under each setting, the first the baseline (design.md's backend-only test).
#[cfg(feature = "native")]
pub struct SweepRequest<'a> {
    pub model: &'a Path,
    pub eval_text: &'a Path,
    pub tokenizer: Option<&'a Path>,
    pub options: &'a MeasureOptions,
    pub runner: &'a crate::runner::transformers::TransformersOptions,
    pub knob: &'a str,
    pub values: &'a [String],
    pub threads: usize,
    pub out: &'a Path,
    /// The run id every document of the sweep carries (see [`crate::outset`]).
    pub run_id: Option<&'a str>,
}

/// Flips of the top-1 token along position: how many rows flip, where the first flips are, and
/// the flip rate by depth.
fn flips_json(run: &RunResult) -> Value {
    let flips: Vec<Value> = run
        .rows
        .iter()
        .filter(|s| s.record.ref_top1 != s.record.cand_top1)
        .map(|s| json!({"block": s.block, "position": s.position}))
        .collect();
    let shown: Vec<Value> = flips.iter().take(1000).cloned().collect();
    json!({
        "context_length": run.context_length,
        "n_positions": run.n_positions,
        "kld_mean": run.summary.metrics.get("kld_mean"),
        "kld_max": run.summary.metrics.get("kld_max"),
        "kld_p99": run.summary.metrics.get("kld_p99"),
        "top1_agreement": run.summary.metrics.get("top1_agreement"),
        "n_flips": flips.len(),
        "flip_location": if run.n_windows == 1 { "block = run of rows in the one window" } else { "block = window" },
        "flips": shown,
        "flips_listed": shown.len(),
        "by_depth": run.summary.diagnostics.by_depth,
    })
}

/// Run the sweep and write `sweep.json` plus one measurement directory per compared setting.
/// Returns the versioned `sweep.json` document.
#[cfg(feature = "native")]
pub fn run_sweep(
    r: &SweepRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<Value> {
    let baseline = &r.values[0];
    let mut pairs = Vec::new();
    // Written only when every pair has run: a failed sweep leaves no partial results.
    let mut outputs = Vec::new();
    let mut floor: Option<f64> = None;
    for other in &r.values[1..] {
        let mut runner = r.runner.clone();
        runner.attention = (baseline.clone(), other.clone());
        let pair_dir = format!("{}-{baseline}-vs-{other}", r.knob);
        let out = r.out.join(&pair_dir);
        let request = TransformersRequest {
            reference: r.model,
            candidate: r.model,
            eval_text: r.eval_text,
            tokenizer: r.tokenizer,
            options: r.options,
            runner: &runner,
            threads: r.threads,
            out: &out,
            candidate_manifest: None,
        };
        let run = measure_transformers(&request, stage, progress)?;
        for m in &run.measurement.runs {
            if let Some(&k) = m.summary.metrics.get("kld_mean") {
                floor = Some(floor.map_or(k, |f: f64| f.max(k)));
            }
        }
        pairs.push(json!({
            "baseline": baseline,
            "other": other,
            // Relative to sweep.json: the sweep is written as one set and moved into place.
            "measurement": format!("{pair_dir}/measurement.json"),
            "runs": run.measurement.runs.iter().map(flips_json).collect::<Vec<_>>(),
            "environment": run.document["environment"],
        }));
        outputs.push((out, run));
    }
    let stamp = |doc: &Value| match r.run_id {
        Some(id) => crate::outset::with_run_id(doc, id),
        None => doc.clone(),
    };
    for (out, run) in &outputs {
        write_measurement(out, &run.measurement, &stamp(&run.document))?;
    }
    let document = stamp(&versioned(json!({
        "kind": "sweep",
        "knob": r.knob,
        "values": r.values,
        "model": r.model.display().to_string(),
        "definition": "each pair measures the same weights under the baseline setting (as reference) and the other setting (as candidate), same tokens and rows: any KL is the kernel's, not the weights'",
        "noise_floor_kld_mean": floor,
        "pairs": pairs,
    })));
    std::fs::create_dir_all(r.out).map_err(|e| Error::write(r.out, e))?;
    let text = serde_json::to_string_pretty(&document).unwrap_or_default();
    write_atomically(&r.out.join("sweep.json"), format!("{text}\n").as_bytes())?;
    Ok(document)
}

/// A `measure` run against a compact reference artifact instead of a reference model.
#[cfg(feature = "native")]
pub struct ArtifactRequest<'a> {
    pub artifact: &'a Path,
    pub candidate: &'a Path,
    /// Optional: checked against the artifact's eval text digest.
    pub eval_text: Option<&'a Path>,
    pub options: &'a MeasureOptions,
    pub compute: crate::runner::native::ComputeDtype,
    pub emulate: crate::runner::native::Emulate,
    pub threads: usize,
    pub out: &'a Path,
    /// The candidate's manifest when the caller has hashed it already.
    pub candidate_manifest: Option<&'a Manifest>,
}

/// A candidate and a reference artifact, checked against each other and the requested protocol.
#[cfg(feature = "native")]
pub struct ArtifactRun {
    pub artifact: crate::artifact::Artifact,
    pub candidate: crate::runner::native::NativeModel,
    pub tokenizer: tokens::TokenizerFile,
    pub stream: TokenStream,
    pub windows: Vec<tokens::Windows>,
}

/// Open the artifact, load the candidate, and enforce the artifact's tokenizer, eval text,
/// vocabulary and protocol.
#[cfg(feature = "native")]
pub fn prepare_artifact(r: &ArtifactRequest, stage: &(dyn Fn(&str) + Sync)) -> Result<ArtifactRun> {
    use crate::artifact::Artifact;
    use crate::runner::native;

    r.options.check()?;
    stage("reading the artifact");
    let artifact = Artifact::open(r.artifact)?;
    let h = &artifact.header;
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(r.candidate))?;
    if h.eval["tokenizer_sha256"].as_str() != Some(tokenizer.sha256.as_str()) {
        return Err(Error::malformed(
            &tokenizer.path,
            None,
            format!(
                "differs from the tokenizer the artifact was made with (sha256 {} vs {})",
                tokenizer.sha256, h.eval["tokenizer_sha256"]
            ),
        ));
    }
    if let Some(text) = r.eval_text {
        let bytes = crate::files::read_capped(text, tokens::MAX_EVAL_TEXT_BYTES, "an eval text")?;
        let digest = crate::checkpoint::hash::hex(&Sha256Digest::digest(&bytes));
        if h.eval["text_sha256"].as_str() != Some(digest.as_str()) {
            return Err(Error::malformed(
                text,
                None,
                format!(
                    "is not the artifact's eval text (sha256 {digest} vs {})",
                    h.eval["text_sha256"]
                ),
            ));
        }
    }
    let stream = TokenStream {
        ids: artifact.tokens.clone(),
        text_sha256: h.eval["text_sha256"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        text_bytes: 0,
    };
    stage("loading the candidate");
    let candidate = native::load(r.candidate, r.compute, r.emulate)?;
    let width = candidate.decoder.config.vocab;
    if width != h.logit_width {
        return Err(Error::malformed(
            r.candidate,
            None,
            format!(
                "vocabulary mismatch: {width} logit entries, the artifact's reference has {}",
                h.logit_width
            ),
        ));
    }
    let vocab_size = r.options.vocab_size.unwrap_or(tokenizer.vocab_size);
    let padding = if vocab_size < width {
        "excluded"
    } else {
        "none"
    };
    let requested = protocol_json(r.options, vocab_size, padding);
    let differences = artifact.protocol_differences(&requested);
    if !differences.is_empty() {
        return Err(Error::malformed(
            r.artifact,
            None,
            format!(
                "was exported for another protocol: {}",
                differences.join("; ")
            ),
        ));
    }
    if h.kind == crate::artifact::Kind::Hidden
        && h.reference["lm_head_sha256"].as_str() != Some(candidate.lm_head_sha256.as_str())
    {
        return Err(Error::malformed(
            r.candidate,
            Some("lm_head"),
            format!(
                "is not the reference's (sha256 {} vs {}); a hidden-state artifact needs the reference's lm_head",
                candidate.lm_head_sha256, h.reference["lm_head_sha256"]
            ),
        ));
    }
    let windows: Vec<tokens::Windows> = r
        .options
        .context_lengths
        .iter()
        .map(|&l| tokens::windows(&stream, r.artifact, l, r.options.bos, tokenizer.bos_id))
        .collect::<Result<_>>()?;
    Ok(ArtifactRun {
        artifact,
        candidate,
        tokenizer,
        stream,
        windows,
    })
}

/// Run `f` with the artifact's reference runner (its LM head served by the candidate's, whose
/// digest `prepare_artifact` checked).
#[cfg(feature = "native")]
pub fn with_artifact_runner<T>(
    p: &ArtifactRun,
    f: impl FnOnce(&crate::artifact::ArtifactRunner) -> Result<T>,
) -> Result<T> {
    let head = |x: Vec<f32>| -> Result<Vec<f32>> {
        p.candidate
            .decoder
            .head_from_rows(x)
            .map_err(|e| Error::malformed(&p.candidate.path, None, format!("lm_head failed: {e}")))
    };
    let head_ref: &(dyn Fn(Vec<f32>) -> Result<Vec<f32>> + Sync) = &head;
    let head_opt = (p.artifact.header.kind == crate::artifact::Kind::Hidden).then_some(head_ref);
    let runner = crate::artifact::ArtifactRunner::new(&p.artifact, &p.windows, head_opt)?;
    f(&runner)
}

/// Measure a prepared candidate against its artifact; returns the measurement and its document.
#[cfg(feature = "native")]
pub fn measure_artifact(
    r: &ArtifactRequest,
    p: &ArtifactRun,
    progress: Progress,
) -> Result<(ModelMeasurement, Value)> {
    let h = &p.artifact.header;
    let candidate_id = identity(&p.candidate, r.candidate, r.threads, r.candidate_manifest)?;
    let (mut m, reference_env) = with_artifact_runner(p, |runner| {
        let m = measure_models(
            runner,
            &p.candidate,
            &EvalInput {
                stream: &p.stream,
                text_path: r.artifact,
                bos_id: p.tokenizer.bos_id,
                tokenizer_vocab: p.tokenizer.vocab_size,
            },
            r.options,
            progress,
        )?;
        Ok((m, Runner::environment(runner)))
    })?;
    m.eval["text_path"] = r
        .eval_text
        .map_or(Value::Null, |t| t.display().to_string().into());
    let reference_id = ModelIdentity {
        path: PathBuf::from(h.reference["path"].as_str().unwrap_or_default()),
        format: h.reference["format"]
            .as_str()
            .unwrap_or("artifact")
            .to_owned(),
        manifest_sha256: h.reference["manifest_sha256"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        lm_head_sha256: h.reference["lm_head_sha256"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        stored_dtype: h.reference["stored_dtype"]
            .as_str()
            .unwrap_or("unknown")
            .to_owned(),
        environment: reference_env,
    };
    let mut environment = runtime_environment(&p.candidate, r.compute, r.emulate, r.threads);
    environment["reference_artifact"] = json!({"path": r.artifact.display().to_string(), "sha256": p.artifact.sha256, "kind": h.kind, "bound": h.bound});
    let doc = measurement_json(&m, r.options, &reference_id, &candidate_id, environment);
    Ok((m, versioned(doc)))
}

/// Measure a candidate against a reference artifact and write the measurement files.
#[cfg(feature = "native")]
pub fn run_with_artifact(
    r: &ArtifactRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<Value> {
    let prepared = prepare_artifact(r, stage)?;
    stage("measuring");
    let (m, doc) = measure_artifact(r, &prepared, progress)?;
    write_measurement(r.out, &m, &doc)?;
    Ok(doc)
}

/// `cardproof reference export`: a compact reference artifact from a native reference model.
#[cfg(feature = "native")]
pub fn export_reference(
    model: &Path,
    eval_text: &Path,
    options: &MeasureOptions,
    spec: crate::artifact::ExportSpec,
    identity_extra: Value,
    threads: usize,
    out: &Path,
) -> Result<crate::artifact::Header> {
    use crate::runner::native;
    options.check()?;
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(model))?;
    let stream = tokens::tokenize(&tokenizer, eval_text)?;
    let reference = native::load(
        model,
        native::ComputeDtype::F32,
        native::Emulate::ReferenceSemantics,
    )?;
    let id = identity(&reference, model, threads, None)?;
    let (header, bytes) = crate::artifact::export_native(
        &reference,
        &EvalInput {
            stream: &stream,
            text_path: eval_text,
            bos_id: tokenizer.bos_id,
            tokenizer_vocab: tokenizer.vocab_size,
        },
        options,
        spec,
        {
            let mut reference = json!({
                "path": model.display().to_string(),
                "format": id.format,
                "manifest_sha256": id.manifest_sha256,
                "lm_head_sha256": id.lm_head_sha256,
                "stored_dtype": id.stored_dtype,
            });
            if let (Some(r), Some(extra)) = (reference.as_object_mut(), identity_extra.as_object())
            {
                r.extend(extra.clone());
            }
            reference
        },
        &tokenizer.sha256,
    )?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::write(dir, e))?;
    }
    write_atomically(out, &bytes)?;
    let digest = crate::checkpoint::hash::hex(&Sha256Digest::digest(&bytes));
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    write_atomically(
        &crate::artifact::sidecar_path(out),
        format!("{digest}  {name}\n").as_bytes(),
    )?;
    Ok(header)
}

/// `measure --reference-artifact FILE` where FILE is a llama.cpp `--kl-divergence-base` file: the
/// file's token stream and rows are the reference (its 16-nat window stated in the output).
#[cfg(feature = "native")]
pub fn run_with_base_file(
    r: &ArtifactRequest,
    stage: &(dyn Fn(&str) + Sync),
    progress: Progress,
) -> Result<Value> {
    use crate::artifact::llamacpp::{BaseFileRunner, WINDOW_NOTE};
    use crate::measure::llamacpp::BaseFile;
    use crate::runner::native;

    r.options.check()?;
    stage("reading the base file");
    let base = BaseFile::open(r.artifact)?;
    let stream = TokenStream {
        ids: base.tokens.iter().map(|&t| t as u32).collect(),
        text_sha256: String::new(),
        text_bytes: 0,
    };
    stage("loading the candidate");
    let candidate = native::load(r.candidate, r.compute, r.emulate)?;
    if candidate.decoder.config.vocab != base.n_vocab as usize {
        return Err(Error::malformed(
            r.candidate,
            None,
            format!(
                "vocabulary mismatch: {} logit entries, the base file has {}",
                candidate.decoder.config.vocab, base.n_vocab
            ),
        ));
    }
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(r.candidate)).ok();
    let bos_id = tokenizer
        .as_ref()
        .and_then(|t| t.bos_id)
        .or(candidate.bos_id);
    let tokenizer_vocab = tokenizer
        .as_ref()
        .map_or(base.n_vocab as usize, |t| t.vocab_size);
    let vocab_size = r.options.vocab_size.unwrap_or(tokenizer_vocab);
    let padding = if vocab_size < base.n_vocab as usize {
        "excluded"
    } else {
        "none"
    };
    let requested = protocol_json(r.options, vocab_size, padding);
    let windows = tokens::windows(
        &stream,
        r.artifact,
        base.n_ctx as usize,
        r.options.bos,
        bos_id,
    )?;
    let runner = BaseFileRunner::new(base, &windows)?;
    let differences = runner.protocol_differences(&requested);
    if !differences.is_empty() {
        return Err(Error::malformed(
            r.artifact,
            None,
            format!("holds another protocol: {}", differences.join("; ")),
        ));
    }
    let candidate_id = identity(&candidate, r.candidate, r.threads, r.candidate_manifest)?;
    stage("measuring");
    let m = measure_models(
        &runner,
        &candidate,
        &EvalInput {
            stream: &stream,
            text_path: r.artifact,
            bos_id,
            tokenizer_vocab,
        },
        r.options,
        progress,
    )?;
    let reference_id = ModelIdentity {
        path: r.artifact.to_owned(),
        format: "llamacpp-base".into(),
        manifest_sha256: String::new(),
        lm_head_sha256: String::new(),
        stored_dtype: "uint16 log-probabilities".into(),
        environment: Runner::environment(&runner),
    };
    let mut environment = runtime_environment(&candidate, r.compute, r.emulate, r.threads);
    environment["reference_artifact"] = json!({"path": r.artifact.display().to_string(), "kind": "llamacpp_base", "bound": WINDOW_NOTE});
    let doc = versioned(measurement_json(
        &m,
        r.options,
        &reference_id,
        &candidate_id,
        environment,
    ));
    write_measurement(r.out, &m, &doc)?;
    Ok(doc)
}

/// `cardproof reference export --kind llamacpp`: the reference's rows as a llama.cpp base file.
#[cfg(feature = "native")]
pub fn export_llamacpp(
    model: &Path,
    eval_text: &Path,
    n_ctx: usize,
    bos: tokens::Bos,
    out: &Path,
) -> Result<u64> {
    use crate::runner::native;
    crate::measure::protocol::check_context_length(n_ctx as u64)
        .map_err(|rule| Error::malformed(out, Some("n_ctx"), rule))?;
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(model))?;
    let stream = tokens::tokenize(&tokenizer, eval_text)?;
    let reference = native::load(
        model,
        native::ComputeDtype::F32,
        native::Emulate::ReferenceSemantics,
    )?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::write(dir, e))?;
    }
    crate::artifact::llamacpp::export_native(
        &reference,
        &stream,
        eval_text,
        n_ctx,
        bos,
        tokenizer.bos_id,
        out,
    )
}
