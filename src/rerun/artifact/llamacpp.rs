//! Interop with llama.cpp's `--kl-divergence-base` files: export a reference's second-half rows
//! in that format (so llama.cpp users can score their own builds against it), and import one as
//! a reference for `measure`/`verify`. A base file stores each row's log-probabilities in a
//! 16-nat window below the maximum, as uint16 codes; entries below the window read as the
//! window's floor, so KL terms from tokens more than 16 nats below the top are approximate.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::kld::llamacpp::{BaseFile, BaseRow, RowReader};
use crate::kld::protocol::{Direction, Positions};
use crate::rerun::document::RunProtocol;
use crate::runner::tokens::Windows;
use crate::runner::{Runner, WindowLogits};

/// What a base file says about itself, stated wherever it is used as a reference.
pub const WINDOW_NOTE: &str = "llama.cpp base file: reference log-probabilities stored as uint16 codes in a 16-nat window below each row's maximum (entries further down read as the floor)";

/// What a base file states about itself, the predicate its signer signs (a base file names no
/// reference: who made it says which, in the signed statement's `reference`).
pub fn stated(base: &BaseFile) -> Value {
    let tokens: Vec<u32> = base.tokens.iter().map(|&t| t as u32).collect();
    json!({
        "kind": "llamacpp_base",
        "n_ctx": base.n_ctx,
        "n_vocab": base.n_vocab,
        "n_chunk": base.n_chunk,
        "tokens_sha256": crate::runner::tokens::tokens_sha256(&tokens),
    })
}

/// A base file as the reference side of a measurement.
pub struct BaseFileRunner<'a> {
    pub base: &'a BaseFile,
    windows: HashMap<Vec<u32>, u64>,
}

impl<'a> BaseFileRunner<'a> {
    /// `windows` must be the base file's own: context length `n_ctx`, the file's token stream.
    pub fn new(base: &'a BaseFile, windows: &Windows) -> Result<Self> {
        if windows.length as u64 != u64::from(base.n_ctx) {
            return Err(Error::mismatch(
                &base.path,
                None,
                format!(
                    "holds windows of {} tokens; the run asks for {}",
                    base.n_ctx, windows.length
                ),
            ));
        }
        let map = windows
            .windows
            .iter()
            .enumerate()
            .take(base.n_chunk as usize)
            .map(|(i, ids)| (ids.clone(), i as u64))
            .collect();
        Ok(BaseFileRunner { base, windows: map })
    }

    /// The protocol the file implies: its `n_ctx`, llama.cpp's second-half rows, per-window BOS.
    pub fn protocol_differences(&self, requested: &RunProtocol) -> Vec<String> {
        let mut out = Vec::new();
        if requested.context_lengths != [self.base.n_ctx as usize] {
            out.push(format!(
                "context_lengths: the base file holds windows of {}, the run asks for {}",
                self.base.n_ctx,
                json!(requested.context_lengths)
            ));
        }
        if requested.direction != Direction::Forward {
            out.push(format!(
                "direction: a base file drops each row's entries below its 16-nat window, so only the forward KL is defined; run with --direction forward, not {}",
                json!(requested.direction)
            ));
        }
        if requested.positions != Positions::SecondHalf {
            out.push(format!(
                "positions: a base file holds llama.cpp's second-half rows; run with --positions second-half, not {}",
                json!(requested.positions)
            ));
        }
        out
    }
}

struct BaseWindow<'a> {
    runner: &'a BaseFileRunner<'a>,
    chunk: u64,
    reader: RefCell<Option<RowReader>>,
    /// The true next token's stored log-probability per row read (at the floor when the token
    /// lies below the window, as llama.cpp's own PPL(base) reads it).
    token_logp: RefCell<HashMap<usize, f64>>,
}

impl WindowLogits for BaseWindow<'_> {
    fn logits(&self, rows: &[usize]) -> Result<Vec<f32>> {
        let base = self.runner.base;
        let n_ctx = u64::from(base.n_ctx);
        let half = n_ctx / 2;
        let per_chunk = base.rows_per_chunk();
        let width = base.n_vocab as usize;
        let mut out = vec![0f32; rows.len() * width];
        let mut row = BaseRow::default();
        let mut reader = self.reader.borrow_mut();
        for (n, &j) in rows.iter().enumerate() {
            let j = j as u64;
            if j < half || j + 1 >= n_ctx {
                return Err(Error::format(
                    &base.path,
                    None,
                    format!(
                        "holds rows {half}..={} of each window, not row {j}",
                        n_ctx - 2
                    ),
                ));
            }
            let target = self.chunk * per_chunk + (j - half);
            if reader.as_ref().is_none_or(|r| r.position() > target) {
                *reader = Some(base.reader()?);
            }
            let r = reader
                .as_mut()
                .ok_or_else(|| Error::internal(&base.path, "no reader"))?;
            let skip = target - r.position();
            r.skip_rows(skip)?;
            if !r.next_row(&mut row)? {
                return Err(Error::format(
                    &base.path,
                    None,
                    format!("ends before row {target}"),
                ));
            }
            // Codes of 0 are the window's floor: the token's log-probability is somewhere below
            // it, not at it. Spread at the floor they would add e^-16 of mass per token (2.3e-4
            // over a 2,048-token vocabulary, biasing the KL by several percent); as masked
            // entries they drop out, as llama.cpp's -16 gate drops them.
            let dst = &mut out[n * width..(n + 1) * width];
            row.decode_into(dst);
            let token = base.next_token(target) as usize;
            if token < width {
                self.token_logp
                    .borrow_mut()
                    .insert(j as usize, f64::from(row.log_prob(token)));
            }
            for (v, &c) in dst.iter_mut().zip(&row.codes) {
                if c == 0 && row.scale > 0.0 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        Ok(out)
    }

    fn token_nll(&self, row: usize) -> Option<f64> {
        self.token_logp.borrow().get(&row).map(|lp| -lp)
    }
}

impl Runner for BaseFileRunner<'_> {
    fn vocab(&self) -> usize {
        self.base.n_vocab as usize
    }

    fn window<'a>(&'a self, ids: &[u32]) -> Result<Box<dyn WindowLogits + 'a>> {
        let &chunk = self.windows.get(ids).ok_or_else(|| {
            Error::mismatch(
                &self.base.path,
                None,
                "a window of the run is not in the base file's token stream",
            )
        })?;
        Ok(Box::new(BaseWindow {
            runner: self,
            chunk,
            reader: RefCell::new(None),
            token_logp: RefCell::new(HashMap::new()),
        }))
    }

    fn environment(&self) -> Value {
        json!({
            "artifact": self.base.path.display().to_string(),
            "kind": "llamacpp_base",
            "bound": WINDOW_NOTE,
            "n_ctx": self.base.n_ctx,
            "n_vocab": self.base.n_vocab,
            "n_chunk": self.base.n_chunk,
        })
    }
}

/// Export the reference's second-half rows of every window (the eval text's `n_ctx`-token
/// windows, as llama.cpp cuts them) as a llama.cpp base file.
#[cfg(feature = "native")]
pub fn export_native(
    model: &crate::runner::native::NativeModel,
    stream: &crate::runner::tokens::TokenStream,
    windows: &crate::runner::tokens::Windows,
    out: &Path,
    progress: crate::rerun::score::Progress,
) -> Result<u64> {
    use crate::kld::llamacpp::BaseFileWriter;
    let n_ctx = windows.length;
    let n = windows.windows.len();
    // llama.cpp stores the token stream as tokenized (before the per-chunk BOS swap).
    let tokens: Vec<i32> = stream.ids[..n * n_ctx].iter().map(|&t| t as i32).collect();
    let mut writer = BaseFileWriter::create(
        out,
        n_ctx as u32,
        model.decoder.config.vocab as u32,
        &tokens,
    )?;
    let rows: Vec<usize> = (n_ctx / 2..n_ctx - 1).collect();
    let width = model.decoder.config.vocab;
    let err =
        |e: candle_core::Error| Error::runner(&model.path, format!("forward pass failed: {e}"));
    progress(0, n);
    for (w, ids) in windows.windows.iter().enumerate() {
        let hidden = model.decoder.hidden(ids).map_err(err)?;
        let logits = model.decoder.logits_at(&hidden, &rows).map_err(err)?;
        for r in 0..rows.len() {
            writer.write_row_logits(&logits[r * width..(r + 1) * width])?;
        }
        progress(w + 1, n);
    }
    writer.finish()?;
    Ok((n * rows.len()) as u64)
}
