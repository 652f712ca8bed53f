//! Where logits come from: a safetensors logit dump, or a llama.cpp `--kl-divergence-base` file.
//! Both are memory-mapped and read a row at a time, so memory stays bounded whatever the size.

use std::path::{Path, PathBuf};

use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::mmap::MappedFile;
use crate::checkpoint::safetensors::{self, SafetensorsFile, TensorInfo};
use crate::error::{Error, Result};

/// Where a row sits: its window (also the bootstrap block), its position j in the window, the
/// window's length in tokens, and the true next token when known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowMeta {
    pub window: u32,
    pub position: u64,
    pub window_len: u64,
    pub token: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    F32,
    Bf16,
    F16,
    /// llama.cpp base-file row: f32 scale, f32 min log-prob, u16 codes.
    LlamaCppU16,
}

/// A file of logit rows.
pub struct LogitSource {
    pub path: PathBuf,
    /// `safetensors` or `llamacpp-base`.
    pub format: &'static str,
    pub rows: usize,
    /// Entries per row in the file.
    pub vocab: usize,
    /// `vocab_size` from the file's metadata (the tokenizer's size, without padding), if given.
    pub declared_vocab: Option<usize>,
    pub meta: Vec<RowMeta>,
    pub encoding: Encoding,
    map: MappedFile,
    /// Byte offset of row 0 and bytes per row.
    first_row: usize,
    stride: usize,
}

/// Identifies a llama.cpp base file by its magic.
pub fn is_llamacpp_base(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    crate::files::open_regular(path).is_ok_and(|(mut f, _)| f.read_exact(&mut magic).is_ok())
        && &magic == b"_logits_"
}

impl LogitSource {
    /// Open a logit file. `context_length` lays out a dump that carries no `positions` tensor.
    pub fn open(path: &Path, context_length: Option<u64>) -> Result<LogitSource> {
        if is_llamacpp_base(path) {
            Self::open_base(path)
        } else {
            Self::open_dump(path, context_length)
        }
    }

    fn open_base(path: &Path) -> Result<LogitSource> {
        let base = super::llamacpp::BaseFile::open(path)?;
        let n_ctx = u64::from(base.n_ctx);
        let n_vocab = base.n_vocab as usize;
        let rows = usize::try_from(base.n_rows())
            .map_err(|_| Error::unsupported(path, None, "too many rows for this machine"))?;
        let meta = (0..base.n_rows())
            .map(|r| {
                let (chunk, j) = base.row_position(r);
                RowMeta {
                    window: chunk as u32,
                    position: j,
                    window_len: n_ctx,
                    token: u32::try_from(base.next_token(r)).ok(),
                }
            })
            .collect();
        let nv = 2 * n_vocab.div_ceil(2) + 4;
        let first_row = 20 + 4 * base.tokens.len();
        Ok(LogitSource {
            path: path.to_path_buf(),
            format: "llamacpp-base",
            rows,
            vocab: n_vocab,
            declared_vocab: None,
            meta,
            encoding: Encoding::LlamaCppU16,
            map: mapped_for_reading(path)?,
            first_row,
            stride: nv * 2,
        })
    }

    fn open_dump(path: &Path, context_length: Option<u64>) -> Result<LogitSource> {
        let file = safetensors::read_file(path)?;
        let logits = file.get("logits").ok_or_else(|| {
            Error::format(
                path,
                Some("logits"),
                "a logit dump needs a `logits` tensor [rows, vocab]",
            )
        })?;
        let encoding = match logits.dtype {
            Dtype::F32 => Encoding::F32,
            Dtype::BF16 => Encoding::Bf16,
            Dtype::F16 => Encoding::F16,
            other => {
                return Err(Error::format(
                    path,
                    Some("logits"),
                    format!("dtype {other} is not a logit dtype (F32, BF16 or F16)"),
                ));
            }
        };
        let [rows, vocab] = logits.shape[..] else {
            return Err(Error::format(
                path,
                Some("logits"),
                format!("shape {:?} is not [rows, vocab]", logits.shape),
            ));
        };
        if rows == 0 || vocab == 0 {
            return Err(Error::format(path, Some("logits"), "holds no rows"));
        }
        let (rows, vocab) = (rows as usize, vocab as usize);
        let ints = |name: &str| read_ints(path, &file, name, rows);
        let tokens = ints("tokens")?;
        let positions = ints("positions")?;
        let windows = ints("window")?;
        if let Some(tokens) = &tokens
            && let Some((r, t)) = tokens
                .iter()
                .enumerate()
                .find(|(_, t)| **t < 0 || **t as usize >= vocab)
        {
            return Err(Error::format(
                path,
                Some("tokens"),
                format!("row {r}: token {t} is outside the vocabulary of {vocab}"),
            ));
        }
        let meta = layout(
            path,
            rows,
            positions.as_deref(),
            windows.as_deref(),
            tokens.as_deref(),
            context_length,
        )?;
        let declared_vocab = file
            .metadata
            .get("vocab_size")
            .map(|v| {
                v.parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0 && n <= vocab)
                    .ok_or_else(|| {
                        Error::format(
                            path,
                            Some("vocab_size"),
                            format!("metadata `{v}` is not a size within 1..={vocab}"),
                        )
                    })
            })
            .transpose()?;
        let width = (logits.dtype.bits() / 8) as usize;
        Ok(LogitSource {
            path: path.to_path_buf(),
            format: "safetensors",
            rows,
            vocab,
            declared_vocab,
            meta,
            encoding,
            map: mapped_for_reading(path)?,
            first_row: logits.data.start as usize,
            stride: vocab * width,
        })
    }

    /// Row `r` as f32: borrowed straight from the mapped file when it is f32 and aligned (no copy),
    /// else decoded into `buf`.
    pub fn row<'a>(&'a self, r: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        if self.encoding == Encoding::F32 && cfg!(target_endian = "little") {
            let start = self.first_row + r * self.stride;
            if let Ok(row) =
                bytemuck::try_cast_slice::<u8, f32>(&self.map.bytes()[start..start + self.stride])
            {
                return row;
            }
        }
        buf.resize(self.vocab, 0.0);
        self.read_row(r, buf);
        buf
    }

    /// Row `r`'s first `out.len()` entries as f32 (bf16 and f16 upcast exactly; a llama.cpp row
    /// decoded to its stored log-probs).
    pub fn read_row(&self, r: usize, out: &mut [f32]) {
        let start = self.first_row + r * self.stride;
        let bytes = &self.map.bytes()[start..start + self.stride];
        match self.encoding {
            Encoding::F32 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Encoding::Bf16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            Encoding::F16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            Encoding::LlamaCppU16 => {
                let scale = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                let min = f32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
                for (o, c) in out.iter_mut().zip(bytes[8..].chunks_exact(2)) {
                    *o = scale * f32::from(u16::from_le_bytes([c[0], c[1]])) + min;
                }
            }
        }
    }
}

fn tensor<'a>(file: &'a SafetensorsFile, name: &str) -> Option<&'a TensorInfo> {
    file.get(name)
}

/// An optional integer tensor of `rows` entries (I32 or I64).
fn read_ints(
    path: &Path,
    file: &SafetensorsFile,
    name: &str,
    rows: usize,
) -> Result<Option<Vec<i64>>> {
    let Some(t) = tensor(file, name) else {
        return Ok(None);
    };
    if t.shape != [rows as u64] {
        return Err(Error::format(
            path,
            Some(name),
            format!("shape {:?} does not match the {rows} logit rows", t.shape),
        ));
    }
    let bytes = safetensors::read_tensor_bytes(file, name, 64 * rows as u64 + 64)?;
    let values = match t.dtype {
        Dtype::I32 => bytes
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        other => {
            return Err(Error::format(
                path,
                Some(name),
                format!("dtype {other} is not I32 or I64"),
            ));
        }
    };
    Ok(Some(values))
}

/// Windows and positions of a dump's rows.
///
/// - `positions` (and optionally `window`): rows say where they are; without `window`, a position
///   that does not increase starts a new window. A window's length is its largest position + 2
///   (every row listed has a next token), or `context_length` when given.
/// - neither, with `context_length` L: the dump holds L rows per window (one per token, as a
///   forward pass returns them); the last row of each window has no next token in it.
/// - neither, without L: one window whose every row is scored (a dump of N rows has N+1 tokens).
fn layout(
    path: &Path,
    rows: usize,
    positions: Option<&[i64]>,
    windows: Option<&[i64]>,
    tokens: Option<&[i64]>,
    context_length: Option<u64>,
) -> Result<Vec<RowMeta>> {
    let token = |r: usize| tokens.map(|t| t[r] as u32);
    if let Some(positions) = positions {
        if let Some((r, p)) = positions.iter().enumerate().find(|(_, p)| **p < 0) {
            return Err(Error::format(
                path,
                Some("positions"),
                format!("row {r}: negative position {p}"),
            ));
        }
        let mut window_ids = Vec::with_capacity(rows);
        let mut current = 0u32;
        for r in 0..rows {
            let w = match windows {
                Some(w) => u32::try_from(w[r]).map_err(|_| {
                    Error::format(
                        path,
                        Some("window"),
                        format!("row {r}: window {} is not a window index", w[r]),
                    )
                })?,
                None => {
                    if r > 0 && positions[r] <= positions[r - 1] {
                        current += 1;
                    }
                    current
                }
            };
            window_ids.push(w);
        }
        let mut max_pos: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        for r in 0..rows {
            let e = max_pos.entry(window_ids[r]).or_default();
            *e = (*e).max(positions[r] as u64);
        }
        return (0..rows)
            .map(|r| {
                let len = context_length.unwrap_or(max_pos[&window_ids[r]] + 2);
                // Only a --context-length shorter than the file's windows gets here.
                if positions[r] as u64 >= len {
                    return Err(Error::usage(
                        path,
                        format!(
                            "positions: row {r}: position {} is outside a {len}-token window",
                            positions[r]
                        ),
                    ));
                }
                Ok(RowMeta {
                    window: window_ids[r],
                    position: positions[r] as u64,
                    window_len: len,
                    token: token(r),
                })
            })
            .collect();
    }
    match context_length {
        Some(l) => {
            if !(rows as u64).is_multiple_of(l) {
                return Err(Error::usage(
                    path,
                    format!(
                        "logits: {rows} rows are not whole windows of --context-length {l} (one row per token)"
                    ),
                ));
            }
            Ok((0..rows)
                .map(|r| RowMeta {
                    window: (r as u64 / l) as u32,
                    position: r as u64 % l,
                    window_len: l,
                    token: token(r),
                })
                .collect())
        }
        None => Ok((0..rows)
            .map(|r| RowMeta {
                window: 0,
                position: r as u64,
                window_len: rows as u64 + 1,
                token: token(r),
            })
            .collect()),
    }
}

/// Logit files are read end to end: map them with that advice.
fn mapped_for_reading(path: &Path) -> Result<MappedFile> {
    let map = MappedFile::open(path)?;
    map.will_need();
    Ok(map)
}
