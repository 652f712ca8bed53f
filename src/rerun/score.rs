//! Scoring: both models over the tokenized eval text, window by window, every scored row
//! reduced with [`crate::kld`] into a record, and the records into each run's statistics.
//! Runners that reduce rows themselves (the transformers runner) hand their records in through
//! [`measure_records`]; everything after the rows is the same for every lane.

use std::collections::BTreeMap;
use std::path::Path;

use rayon::prelude::*;

use super::document::{EvalRecord, Padding, RunProtocol, RunRecord};
use super::options::MeasureOptions;
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::safetensors::serialize;
use crate::error::{Error, Result};
use crate::files::write_atomically;
use crate::kld::row::{self, RowRecord};
use crate::kld::stats::{self, Scored, Summary};
use crate::runner::Runner;
use crate::runner::tokens::{self, TokenStream};

/// A chunk of the output head's logit rows takes at most this many bytes per model and window in
/// flight. Each chunk is one product, and the product repacks the whole head weight (hundreds of
/// megabytes at a 150k vocabulary) whatever its row count, so a window's scored rows go in as
/// few chunks as this bound allows.
const CHUNK_BYTES: usize = 256 * 1024 * 1024;
/// The bound shrinks as windows in flight (one per thread) grow, down to this: the logit buffers
/// of all windows in flight stay within about 1 GiB, or 128 MiB per thread past 8 threads.
const MIN_CHUNK_BYTES: usize = 64 * 1024 * 1024;
const LOGIT_BUDGET_BYTES: usize = 1024 * 1024 * 1024;

/// [`CHUNK_BYTES`] shared out over the process's threads (two buffers per window in flight).
fn chunk_bytes() -> usize {
    (LOGIT_BUDGET_BYTES / (2 * rayon::current_num_threads().max(1)))
        .clamp(MIN_CHUNK_BYTES, CHUNK_BYTES)
}
/// A logit dump (for oracles and reanalysis) is refused beyond this size.
const MAX_DUMP_BYTES: usize = 2 * 1024 * 1024 * 1024;

/// One context length's results, rows included.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub context_length: usize,
    pub n_windows: usize,
    pub dropped_tokens: usize,
    pub n_positions: usize,
    pub n_nonfinite: usize,
    pub summary: Summary,
    pub rows: Vec<Scored>,
    /// For a conversation eval text: each row's predicted token's label (parallel to `rows`).
    pub labels: Vec<crate::conversation::eval::TokenLabel>,
    /// For a conversation eval text: each row's predicted token's index in the eval text's
    /// token stream (parallel to `rows`).
    pub tokens: Vec<u64>,
    /// For a conversation eval text: the statistics of each segment's and role's rows.
    pub spans: Vec<super::spans::SpanSummary>,
    pub bootstrap_block: String,
}

impl RunResult {
    /// The run's record in measurement.json (its rows go to positions.safetensors).
    pub fn record(&self) -> RunRecord {
        RunRecord {
            context_length: self.context_length,
            n_windows: self.n_windows,
            dropped_tokens: self.dropped_tokens,
            n_positions: self.n_positions,
            n_nonfinite: self.n_nonfinite,
            bootstrap_block: self.bootstrap_block.clone(),
            summary: self.summary.clone(),
            spans: self.spans.clone(),
        }
    }
}

/// The scored runs of one measurement, with the protocol they were scored under.
#[derive(Debug, Clone)]
pub struct Scoring {
    pub protocol: RunProtocol,
    pub eval: EvalRecord,
    pub runs: Vec<RunResult>,
    pub vocab_size: usize,
}

/// Progress: windows done out of all windows of all context lengths.
pub type Progress<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// The measurement protocol: every setting that changes a number.
pub fn run_protocol(o: &MeasureOptions, vocab_size: usize, padding: Padding) -> RunProtocol {
    RunProtocol {
        direction: o.direction,
        units: "nats".into(),
        vocab: o.vocab,
        padding,
        vocab_size,
        positions: o.positions,
        llamacpp_compat: false,
        aggregation: "mean_over_positions".into(),
        bootstrap: o.bootstrap,
        bootstrap_block: "window".into(),
        top1: "first index of the maximum".into(),
        context_lengths: o.context_lengths.clone(),
        bos: o.bos,
        windows: "non_overlapping; trailing partial window dropped".into(),
        prefill_chunk: o.prefill_chunk,
    }
}

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
    /// Per window, the rows scored (increasing). The same for every window unless the policy
    /// selects by what each token is (a role or span of a conversation).
    pub rows: Vec<Vec<usize>>,
    /// The conversation's labels, and where window 0's first token sits in them (-1 when a
    /// `per_document` BOS was put before the stream).
    labels: Option<(std::sync::Arc<tokens::ConversationTokens>, isize)>,
}

impl RunPlan {
    /// What the token row `j` of window `w` predicts (token j + 1) is, for a conversation.
    pub fn label(&self, w: usize, j: usize) -> Option<crate::conversation::eval::TokenLabel> {
        let (conversation, _) = self.labels.as_ref()?;
        self.token(w, j)
            .and_then(|i| conversation.labels.get(i as usize).copied())
    }

    /// The index in the eval text's token stream of the token row `j` of window `w` predicts,
    /// for a conversation (`None` for a BOS put before the stream).
    pub fn token(&self, w: usize, j: usize) -> Option<u64> {
        let (_, start) = self.labels.as_ref()?;
        let at = *start + (w * self.windows.length + j + 1) as isize;
        u64::try_from(at).ok()
    }

    /// Every scored row of every window.
    pub fn n_rows(&self) -> usize {
        self.rows.iter().map(Vec::len).sum()
    }

    /// Whether every window scores the same rows.
    pub fn uniform(&self) -> bool {
        self.rows.windows(2).all(|p| p[0] == p[1])
    }
}

/// The logit entries to use: the requested size, else the tokenizer's (padding excluded).
pub(super) fn used_vocab(eval: &EvalInput, width: usize, o: &MeasureOptions) -> Result<usize> {
    if eval.tokenizer_vocab > width {
        return Err(Error::mismatch(
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
        return Err(Error::usage(
            eval.text_path,
            format!("vocabulary size {vocab_size} is outside 1..={width} (the logit rows' width)"),
        ));
    }
    Ok(vocab_size)
}

/// The windows of every context length and the rows the position policy scores in them.
pub fn plan_runs(eval: &EvalInput, o: &MeasureOptions) -> Result<Vec<RunPlan>> {
    o.check()?;
    let conversation = eval.stream.conversation.clone();
    if o.positions.needs_labels() && conversation.is_none() {
        return Err(Error::usage(
            eval.text_path,
            format!(
                "--positions {} selects tokens by role or span, which only a conversation eval text (.json or .jsonl) has",
                o.positions.spelling()
            ),
        ));
    }
    let start = if o.bos == tokens::Bos::PerDocument {
        -1
    } else {
        0
    };
    o.context_lengths
        .iter()
        .map(|&l| {
            let windows = tokens::windows(eval.stream, eval.text_path, l, o.bos, eval.bos_id)?;
            let mut plan = RunPlan {
                windows,
                rows: Vec::new(),
                labels: conversation.clone().map(|c| (c, start)),
            };
            let rows: Vec<Vec<usize>> = (0..plan.windows.windows.len())
                .map(|w| {
                    (0..l)
                        .filter(|&j| {
                            let next = plan.label(w, j).map(|t| (t.role, t.segment));
                            o.positions.selects_token(j as u64, l as u64, next)
                        })
                        .collect()
                })
                .collect();
            plan.rows = rows;
            if plan.n_rows() == 0 {
                return Err(Error::usage(
                    eval.text_path,
                    format!(
                        "the position policy {} selects no row of the {l}-token windows",
                        o.positions.spelling()
                    ),
                ));
            }
            Ok(plan)
        })
        .collect()
}

/// The rows of a single window are cut into runs of this many for the bootstrap.
fn single_window_run(plan: &RunPlan) -> usize {
    (plan.n_rows() / 100).clamp(1, crate::kld::BOOTSTRAP_MAX_RUN)
}

/// Each window's records (one per scored row, `None` for a non-finite row) as scored rows with
/// their bootstrap blocks (windows, or runs of rows inside a single window) and, for a
/// conversation, each row's label.
/// A run's scored rows, their labels and stream indices (conversations), and the non-finite rows
/// left out.
type ScoredRows = (
    Vec<Scored>,
    Vec<crate::conversation::eval::TokenLabel>,
    Vec<u64>,
    usize,
);

fn scored_rows(plan: &RunPlan, per_window: Vec<Vec<Option<RowRecord>>>) -> ScoredRows {
    let l = plan.windows.length;
    let single = plan.windows.windows.len() == 1;
    let run_len = single_window_run(plan);
    let mut scored = Vec::new();
    let mut labels = Vec::new();
    let mut tokens = Vec::new();
    let mut n_nonfinite = 0;
    for (w, records) in per_window.into_iter().enumerate() {
        for (rank, (record, &j)) in records.into_iter().zip(&plan.rows[w]).enumerate() {
            match record {
                Some(record) => {
                    scored.push(Scored {
                        record,
                        block: if single {
                            (rank / run_len) as u32
                        } else {
                            w as u32
                        },
                        position: j as u64,
                        window_len: l as u64,
                    });
                    if let (Some(label), Some(token)) = (plan.label(w, j), plan.token(w, j)) {
                        labels.push(label);
                        tokens.push(token);
                    }
                }
                None => n_nonfinite += 1,
            }
        }
    }
    (scored, labels, tokens, n_nonfinite)
}

/// Statistics of every run and the measurement's protocol and eval records.
fn finish_measurement(
    eval: &EvalInput,
    o: &MeasureOptions,
    plans: &[RunPlan],
    per_run: Vec<Vec<Vec<Option<RowRecord>>>>,
    vocab_size: usize,
    width: usize,
) -> Result<Scoring> {
    let want_reverse = o.direction.reverse();
    let mut runs = Vec::new();
    for (plan, per_window) in plans.iter().zip(per_run) {
        let l = plan.windows.length;
        let (scored, labels, tokens, n_nonfinite) = scored_rows(plan, per_window);
        if scored.is_empty() {
            return Err(Error::runner(
                eval.text_path,
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
        let run_len = single_window_run(plan);
        let spans = super::spans::summarize(&scored, &labels, o);
        runs.push(RunResult {
            context_length: l,
            n_windows: plan.windows.windows.len(),
            dropped_tokens: plan.windows.dropped_tokens,
            n_positions: scored.len(),
            n_nonfinite,
            summary,
            rows: scored,
            labels,
            tokens,
            spans,
            bootstrap_block: if single {
                format!("run:{run_len}")
            } else {
                "window".into()
            },
        });
    }
    let padding = Padding::of(vocab_size, eval.tokenizer_vocab, width);
    let stream = eval.stream;
    Ok(Scoring {
        protocol: run_protocol(o, vocab_size, padding),
        eval: EvalRecord {
            text_path: Some(eval.text_path.display().to_string()),
            text_sha256: stream.text_sha256.clone(),
            text_bytes: stream.text_bytes,
            tokens_sha256: tokens::tokens_sha256(&stream.ids),
            token_count: stream.ids.len(),
            bos: o.bos,
            conversation: stream.conversation.as_ref().map(|c| c.record.clone()),
        },
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
) -> Result<Scoring> {
    let (plans, vocab_size) = plan_records(eval, o, width)?;
    let per_run = records(&plans, vocab_size)?;
    finish_measurement(eval, o, &plans, per_run, vocab_size, width)
}

/// The runs a runner that reduces rows itself is asked for, and the vocabulary it reduces over.
pub fn plan_records(
    eval: &EvalInput,
    o: &MeasureOptions,
    width: usize,
) -> Result<(Vec<RunPlan>, usize)> {
    let vocab_size = used_vocab(eval, width, o)?;
    if o.dump_logits.is_some() {
        return Err(Error::usage(
            eval.text_path,
            "--dump-logits needs a runner that returns logits (--runner native)",
        ));
    }
    Ok((plan_runs(eval, o)?, vocab_size))
}

/// Run both models over the eval text for every context length.
pub fn measure_models(
    reference: &dyn Runner,
    candidate: &dyn Runner,
    eval: &EvalInput,
    o: &MeasureOptions,
    progress: Progress,
) -> Result<Scoring> {
    let text_path = eval.text_path;
    let width = reference.vocab();
    if candidate.vocab() != width {
        return Err(Error::mismatch(
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
        return Err(Error::usage(
            text_path,
            "--dump-logits takes exactly one --context-length",
        ));
    }
    let plans = plan_runs(eval, o)?;
    // What a run computes from its first forward pass, on the measurement's first window.
    if let Some(first) = plans.iter().find_map(|p| p.windows.windows.first()) {
        reference.calibrate(first)?;
        candidate.calibrate(first)?;
    }
    let total: usize = plans.iter().map(|p| p.windows.windows.len()).sum();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let buffers = Buffers::default();

    let mut per_run = Vec::new();
    for plan in &plans {
        let windows = &plan.windows;
        let dump = o.dump_logits.is_some();
        if dump && plan.n_rows() * vocab_size * 4 * 2 > MAX_DUMP_BYTES {
            return Err(Error::usage(
                text_path,
                format!(
                    "--dump-logits would write over {MAX_DUMP_BYTES} bytes; use a shorter eval text"
                ),
            ));
        }
        let shape = Shape {
            width,
            vocab_size,
            dump,
            buffers: &buffers,
        };
        let results: Vec<WindowOut> = windows
            .windows
            .par_iter()
            .zip(&plan.rows)
            .map(|(ids, rows)| -> Result<WindowOut> {
                let out = if rows.is_empty() {
                    // A window with no token the policy selects: nothing to run.
                    (Vec::new(), Vec::new(), Vec::new())
                } else {
                    let a = reference.window(ids)?;
                    let b = candidate.window(ids)?;
                    reduce_window(a.as_ref(), b.as_ref(), ids, rows, &shape, o)?
                };
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(n, total);
                Ok(out)
            })
            .collect::<Result<_>>()?;
        let (mut dump_a, mut dump_b) = (Vec::new(), Vec::new());
        let mut dump_meta: Vec<(u32, u64, u32)> = Vec::new();
        let mut per_window = Vec::with_capacity(results.len());
        for (w, (records, da, db)) in results.into_iter().enumerate() {
            if dump {
                for &j in &plan.rows[w] {
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

/// One window's records, and its dumped logits when asked for.
type WindowOut = (Vec<Option<RowRecord>>, Vec<f32>, Vec<f32>);

/// The logit rows' geometry: entries per row, entries used, whether the rows are dumped; and the
/// logit buffers that windows reuse.
struct Shape<'a> {
    width: usize,
    vocab_size: usize,
    dump: bool,
    buffers: &'a Buffers,
}

/// A window's scored `rows` cut into chunks of the output head, for rows of `width` logits: as
/// few chunks as [`chunk_bytes`] allows, their sizes at most one apart (a short last chunk would
/// cost a whole repacking of the head for a few rows). Every lane and a study's kept logits chunk
/// the same way. The head's bits do not depend on the chunking, which depends on the thread
/// count: each output is one depth-ordered chain over the hidden size, whatever the chunk's row
/// count, except in a one-row product (`gemm` takes its matrix-vector kernel, which sums in
/// another order). Sizes one apart keep every chunk at over half the bound's rows, so a chunk is
/// one row only where the window scores one row, or where one row alone fills the bound.
fn head_chunks(rows: &[usize], width: usize) -> impl Iterator<Item = &[usize]> {
    let most = (chunk_bytes() / 4 / width.max(1)).max(1);
    let chunks = rows.len().div_ceil(most);
    (0..chunks).map(move |i| &rows[i * rows.len() / chunks..(i + 1) * rows.len() / chunks])
}

/// Logit buffers handed from window to window: a chunk's rows are a large allocation, which the
/// allocator would otherwise return to the kernel and fault in, zeroed, for the next window.
#[derive(Default)]
struct Buffers(std::sync::Mutex<Vec<Vec<f32>>>);

impl Buffers {
    fn take(&self) -> Vec<f32> {
        self.0
            .lock()
            .map(|mut kept| kept.pop())
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    fn give(&self, buffer: Vec<f32>) {
        if let Ok(mut kept) = self.0.lock() {
            kept.push(buffer);
        }
    }
}

/// One window's scored rows reduced: the reference's and the candidate's logits at `rows`, a
/// chunk of rows at a time, into one record per row (`None`: non-finite). Every lane that runs
/// models reduces here, so a study's arm and a single `measure` compute the same numbers.
fn reduce_window(
    a: &dyn crate::runner::WindowLogits,
    b: &dyn crate::runner::WindowLogits,
    ids: &[u32],
    rows: &[usize],
    shape: &Shape,
    o: &MeasureOptions,
) -> Result<WindowOut> {
    reduce_window_with(
        &|part, _, out| a.logits_into(part, out),
        a,
        b,
        ids,
        rows,
        shape,
        o,
    )
}

/// The reference's logits of a chunk of rows, given the rows and the chunk's index.
type ReferenceLogits<'a> = dyn Fn(&[usize], usize, &mut Vec<f32>) -> Result<()> + 'a;

/// [`reduce_window`] with the reference's logits of each chunk (`k`-th) from `reference`: the
/// window's head, or a study's kept logits of the same chunk.
#[allow(clippy::too_many_arguments)]
fn reduce_window_with(
    reference: &ReferenceLogits,
    a: &dyn crate::runner::WindowLogits,
    b: &dyn crate::runner::WindowLogits,
    ids: &[u32],
    rows: &[usize],
    shape: &Shape,
    o: &MeasureOptions,
) -> Result<WindowOut> {
    let (width, vocab_size) = (shape.width, shape.vocab_size);
    let want_reverse = o.direction.reverse();
    let mut scratch = row::Scratch::default();
    let mut out = Vec::with_capacity(rows.len());
    let (mut dump_a, mut dump_b) = (Vec::new(), Vec::new());
    // Two buffers for the whole window, refilled chunk by chunk, and handed on to the next.
    let (mut la, mut lb) = (shape.buffers.take(), shape.buffers.take());
    for (k, part) in head_chunks(rows, width).enumerate() {
        reference(part, k, &mut la)?;
        b.logits_into(part, &mut lb)?;
        for (k, &j) in part.iter().enumerate() {
            let ra = &la[k * width..k * width + vocab_size];
            let rb = &lb[k * width..k * width + vocab_size];
            let token = Some(ids[j + 1]).filter(|&t| (t as usize) < vocab_size);
            let exact_nll = a.token_nll(j);
            out.push(
                row::reduce(ra, rb, token, o.vocab, want_reverse, &mut scratch).map(
                    |mut record: RowRecord| {
                        if let Some(n) = exact_nll.filter(|_| record.nll_ref.is_some()) {
                            record.nll_ref = Some(n);
                        }
                        record
                    },
                ),
            );
            if shape.dump {
                dump_a.extend_from_slice(ra);
                dump_b.extend_from_slice(rb);
            }
        }
    }
    shape.buffers.give(la);
    shape.buffers.give(lb);
    Ok((out, dump_a, dump_b))
}

/// The reference's forward pass over every window of every run, kept (each window's final
/// hidden states) so that several candidates are measured against one pass: a study of N arms
/// costs N + 1 passes, not 2N.
pub struct ReferencePass<'a> {
    pub plans: Vec<RunPlan>,
    /// Per run, per window: the reference's kept window (`None`: no scored row, not run).
    windows: Vec<Vec<Option<Box<dyn crate::runner::WindowLogits + 'a>>>>,
    /// Per run, per window, per chunk of rows: the reference's logits, kept when every scored
    /// row's fit in [`KEPT_LOGITS_BYTES`] (each arm then skips the reference's head); computed
    /// in the same chunks as a single measurement's, so the values are the same bits.
    logits: Option<Vec<Vec<Vec<Vec<f32>>>>>,
    width: usize,
    vocab_size: usize,
}

/// A study keeps the reference's logits of every scored row when they take at most this many
/// bytes; above it, each arm recomputes them from the kept windows (the reference's head only).
pub const KEPT_LOGITS_BYTES: usize = 1 << 30;

/// Run the reference once over `eval` under `o` and keep its windows.
pub fn reference_pass<'a>(
    reference: &'a dyn Runner,
    eval: &EvalInput,
    o: &MeasureOptions,
    progress: Progress,
) -> Result<ReferencePass<'a>> {
    let width = reference.vocab();
    let vocab_size = used_vocab(eval, width, o)?;
    if o.dump_logits.is_some() {
        return Err(Error::usage(
            eval.text_path,
            "--dump-logits dumps one pair; a study keeps its rows in each arm's positions.safetensors",
        ));
    }
    let plans = plan_runs(eval, o)?;
    if let Some(first) = plans.iter().find_map(|p| p.windows.windows.first()) {
        reference.calibrate(first)?;
    }
    let total: usize = plans.iter().map(|p| p.windows.windows.len()).sum();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let mut windows = Vec::with_capacity(plans.len());
    for plan in &plans {
        let kept = plan
            .windows
            .windows
            .par_iter()
            .zip(&plan.rows)
            .map(|(ids, rows)| {
                let w = if rows.is_empty() {
                    None
                } else {
                    Some(reference.window(ids)?)
                };
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(n, total);
                Ok(w)
            })
            .collect::<Result<Vec<_>>>()?;
        windows.push(kept);
    }
    let rows: usize = plans.iter().map(RunPlan::n_rows).sum();
    let logits = if rows.saturating_mul(width).saturating_mul(4) <= KEPT_LOGITS_BYTES {
        let mut all = Vec::with_capacity(plans.len());
        for (plan, kept) in plans.iter().zip(&mut windows) {
            let per_window = kept
                .par_iter_mut()
                .zip(plan.rows.par_iter())
                .map(|(a, rows)| match a {
                    Some(a) => head_chunks(rows, width)
                        .map(|part| a.logits(part))
                        .collect(),
                    None => Ok(Vec::new()),
                })
                .collect::<Result<Vec<_>>>()?;
            all.push(per_window);
        }
        Some(all)
    } else {
        None
    };
    Ok(ReferencePass {
        plans,
        windows,
        logits,
        width,
        vocab_size,
    })
}

/// One candidate against a kept reference pass: the same scoring as [`measure_models`], the
/// reference's logits recomputed from its kept windows. Also returns, per run, per window, the
/// rows' records (for paired comparisons between candidates).
pub fn measure_against(
    pass: &mut ReferencePass,
    candidate: &dyn Runner,
    eval: &EvalInput,
    o: &MeasureOptions,
    progress: Progress,
) -> Result<(Scoring, PerRun)> {
    if candidate.vocab() != pass.width {
        return Err(Error::mismatch(
            eval.text_path,
            None,
            format!(
                "vocabulary mismatch: the reference's logit rows have {} entries, the candidate's {}",
                pass.width,
                candidate.vocab()
            ),
        ));
    }
    if let Some(first) = pass.plans.iter().find_map(|p| p.windows.windows.first()) {
        candidate.calibrate(first)?;
    }
    let buffers = Buffers::default();
    let shape = Shape {
        width: pass.width,
        vocab_size: pass.vocab_size,
        dump: false,
        buffers: &buffers,
    };
    let total: usize = pass.plans.iter().map(|p| p.windows.windows.len()).sum();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let mut per_run = Vec::with_capacity(pass.plans.len());
    for (run, (plan, kept)) in pass.plans.iter().zip(pass.windows.iter_mut()).enumerate() {
        let logits = pass.logits.as_ref().map(|l| &l[run]);
        let per_window = kept
            .par_iter_mut()
            .enumerate()
            .zip(plan.windows.windows.par_iter())
            .zip(plan.rows.par_iter())
            .map(|(((w, a), ids), rows)| {
                let out = match a {
                    Some(a) => {
                        let b = candidate.window(ids)?;
                        let a = a.as_ref();
                        let kept = |part: &[usize], k: usize, out: &mut Vec<f32>| match logits {
                            Some(l) => {
                                out.clone_from(&l[w][k]);
                                Ok(())
                            }
                            None => a.logits_into(part, out),
                        };
                        reduce_window_with(&kept, a, b.as_ref(), ids, rows, &shape, o)?.0
                    }
                    None => Vec::new(),
                };
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(n, total);
                Ok(out)
            })
            .collect::<Result<Vec<_>>>()?;
        per_run.push(per_window);
    }
    let scoring = finish_measurement(
        eval,
        o,
        &pass.plans,
        per_run.clone(),
        pass.vocab_size,
        pass.width,
    )?;
    Ok((scoring, per_run))
}

/// Per run, per window, one record per scored row (`None`: non-finite).
pub type PerRun = Vec<Vec<Vec<Option<RowRecord>>>>;

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

/// A run's rows as the report's plots take them: position, forward KL, top-1 flip.
impl From<&RunResult> for crate::report::RunRows {
    fn from(run: &RunResult) -> crate::report::RunRows {
        crate::report::RunRows {
            context_length: run.context_length,
            position: run.rows.iter().map(|s| s.position).collect(),
            kld: run.rows.iter().map(|s| s.record.forward).collect(),
            flip: run
                .rows
                .iter()
                .map(|s| s.record.ref_top1 != s.record.cand_top1)
                .collect(),
            token: run.tokens.clone(),
            segment: run.labels.iter().map(|l| l.segment).collect(),
            // A single window's blocks are runs of rows, not windows.
            window: run
                .rows
                .iter()
                .map(|s| if run.n_windows == 1 { 0 } else { s.block })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_chunks_are_as_few_and_as_even_as_the_bound_allows() {
        // Chunk sizes of `rows` rows of a 152k vocabulary at `threads` threads (441 rows fit the
        // bound at 2 threads, 220 at 4, 110 from 8).
        let sizes = |threads: usize, rows: usize| -> Vec<usize> {
            let rows: Vec<usize> = (0..rows).collect();
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| {
                    let parts: Vec<&[usize]> = head_chunks(&rows, 151_936).collect();
                    // The chunks cover the rows once, in order.
                    assert_eq!(parts.concat(), rows);
                    parts.iter().map(|p| p.len()).collect()
                })
        };
        assert_eq!(sizes(2, 256), [256]);
        assert_eq!(sizes(2, 441), [441]);
        assert_eq!(sizes(2, 442), [221, 221]);
        assert_eq!(sizes(2, 1000), [333, 333, 334]);
        assert_eq!(sizes(4, 256), [128, 128]);
        assert_eq!(sizes(16, 256), [85, 85, 86]);
        // Regression: 11,991 rows in chunks of at most 110 rows once ended in a one-row chunk,
        // which gemm sums in another order than the same row at 2 threads.
        let many = sizes(16, 11_991);
        assert_eq!(many.len(), 110);
        assert!(many.iter().all(|&n| n == 109 || n == 110), "{many:?}");
        // Within the bound at every thread count; degenerate sizes still chunk.
        for threads in [1, 2, 3, 8, 16] {
            assert!(
                sizes(threads, 5000)
                    .iter()
                    .all(|&n| n * 151_936 * 4 <= CHUNK_BYTES)
            );
        }
        assert_eq!(sizes(1, 0), Vec::<usize>::new());
        assert_eq!(head_chunks(&[7, 8, 9], usize::MAX).count(), 3);
    }

    #[test]
    fn logit_buffers_are_handed_on() {
        let buffers = Buffers::default();
        let mut a = buffers.take();
        a.resize(1000, 1.0);
        let at = a.as_ptr();
        buffers.give(a);
        let b = buffers.take();
        assert_eq!((b.as_ptr(), b.capacity() >= 1000), (at, true));
        assert!(buffers.take().is_empty());
    }
}
