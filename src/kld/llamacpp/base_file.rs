//! The `--kl-divergence-base` file: a 20-byte header, the token stream, then one uint16 row per
//! scored position. Read streaming (a real file is tens of gigabytes) and written atomically.
//!
//! Layout (little-endian, no version field): `_logits_`, int32 `n_ctx`, int32 `n_vocab`, int32
//! `n_chunk`, int32 tokens `[n_chunk * n_ctx]`, then for each chunk the rows of positions
//! `n_ctx/2 ..= n_ctx-2`, each `nv = 2*((n_vocab+1)/2) + 4` uint16: an f32 `scale`, an f32
//! `min_log_prob`, `n_vocab` codes and one padding code when `n_vocab` is odd.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The first eight bytes of every base file (no terminating NUL).
pub const MAGIC: &[u8; 8] = b"_logits_";

const HEADER_BYTES: u64 = 20;
/// Mainline llama.cpp stores at most 16 nats below each row's maximum (ik_llama.cpp widened its
/// window to 24 in its PR #325; the layout is the same, so its files read here too).
const WINDOW_NATS: f32 = 16.0;
/// Rows are read through a buffer this large: big enough for sequential throughput, small enough
/// that a 73 GB file costs a megabyte of memory plus one row.
const READ_BUFFER: usize = 1 << 20;

/// The geometry the header implies; every size is computed with checked arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub n_ctx: u64,
    pub n_vocab: u64,
    pub n_chunk: u64,
}

impl Layout {
    /// Scored positions per chunk: logits at `n_ctx/2 ..= n_ctx-2` score the next token.
    pub fn rows_per_chunk(self) -> u64 {
        self.n_ctx - 1 - self.n_ctx / 2
    }

    /// uint16 values per row: scale and minimum (two f32), the codes, padded to even.
    fn row_values(self) -> u64 {
        2 * self.n_vocab.div_ceil(2) + 4
    }

    pub fn row_bytes(self) -> u64 {
        2 * self.row_values()
    }

    fn n_tokens(self) -> Option<u64> {
        self.n_chunk.checked_mul(self.n_ctx)
    }

    pub fn n_rows(self) -> Option<u64> {
        self.n_chunk.checked_mul(self.rows_per_chunk())
    }

    fn data_offset(self) -> Option<u64> {
        self.n_tokens()?.checked_mul(4)?.checked_add(HEADER_BYTES)
    }

    /// `20 + 4·n_chunk·n_ctx + 2·n_chunk·rows_per_chunk·nv`, or `None` past `u64`.
    fn file_len(self) -> Option<u64> {
        self.n_rows()?
            .checked_mul(self.row_bytes())?
            .checked_add(self.data_offset()?)
    }

    pub fn row_position(self, r: u64) -> (u64, u64) {
        let rows = self.rows_per_chunk();
        (r / rows, self.n_ctx / 2 + r % rows)
    }

    /// "row 70 (chunk 1, position 71)": the position is the logit row within the chunk; it
    /// scores the token at position + 1.
    pub fn describe_row(self, r: u64) -> String {
        let (chunk, j) = self.row_position(r);
        format!("row {r} (chunk {chunk}, position {j})")
    }

    fn describe_token(self, i: u64) -> String {
        format!(
            "token {i} (chunk {}, position {})",
            i / self.n_ctx,
            i % self.n_ctx
        )
    }
}

/// An opened, validated base file: header and tokens in memory, rows read on demand.
pub struct BaseFile {
    pub path: PathBuf,
    pub n_ctx: u32,
    pub n_vocab: u32,
    pub n_chunk: u32,
    /// The original token stream, `n_chunk * n_ctx` ids (llama.cpp stores them before it swaps
    /// the first token of each chunk for BOS while decoding).
    pub tokens: Vec<i32>,
    file_len: u64,
    data_offset: u64,
}

/// Debug output names the token count, not the (often 300k-long) token stream.
impl std::fmt::Debug for BaseFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseFile")
            .field("path", &self.path)
            .field("n_ctx", &self.n_ctx)
            .field("n_vocab", &self.n_vocab)
            .field("n_chunk", &self.n_chunk)
            .field("tokens", &format_args!("[{} ids]", self.tokens.len()))
            .field("file_len", &self.file_len)
            .finish()
    }
}

impl BaseFile {
    /// Opens and validates `path` (a regular file): magic, positive header fields, `n_ctx >= 3`
    /// (smaller windows score no position), `n_vocab` at most [`crate::kld::MAX_VOCAB`], the
    /// exact file size the header implies (before anything is allocated), and every token id in
    /// `0..n_vocab`. Rows are not read; their scale and minimum are checked as they are read.
    pub fn open(path: &Path) -> Result<BaseFile> {
        let (file, meta) = crate::files::open_regular(path)?;
        let len = meta.len();
        let mut input = BufReader::with_capacity(buffer_for(len), file);

        let mut header = [0u8; HEADER_BYTES as usize];
        let got = read_up_to(&mut input, &mut header).map_err(|e| Error::io(path, e))?;
        let seen = got.min(MAGIC.len());
        if got == 0 {
            return Err(Error::format(
                path,
                None,
                "empty file, not a llama.cpp KLD base file",
            ));
        }
        if header[..seen] != MAGIC[..seen] {
            return Err(Error::format(
                path,
                None,
                format!(
                    "not a llama.cpp KLD base file: it starts with \"{}\", not \"_logits_\"",
                    header[..seen].escape_ascii()
                ),
            ));
        }
        if got < header.len() {
            return Err(Error::format(
                path,
                None,
                format!("truncated: {len} bytes, shorter than the 20-byte header"),
            ));
        }
        let field = |name: &str, at: usize| header_field(path, &header, name, at);
        let n_ctx = field("n_ctx", 8)?;
        let n_vocab = field("n_vocab", 12)?;
        let n_chunk = field("n_chunk", 16)?;
        if n_ctx < 3 {
            return Err(Error::format(
                path,
                Some("n_ctx"),
                format!("{n_ctx} leaves no scored position per chunk (at least 3 needed)"),
            ));
        }
        let layout = Layout {
            n_ctx: n_ctx.into(),
            n_vocab: n_vocab.into(),
            n_chunk: n_chunk.into(),
        };
        let describe = format!("n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}");
        let (Some(expected), Some(data_offset), Some(n_tokens)) =
            (layout.file_len(), layout.data_offset(), layout.n_tokens())
        else {
            return Err(Error::format(
                path,
                None,
                format!("the header ({describe}) implies a size past 2^64 bytes"),
            ));
        };
        // The size check holds for a sparse file of any size, so the row width is capped too:
        // every reader allocates a few rows of it.
        if n_vocab as usize > crate::kld::MAX_VOCAB {
            return Err(Error::unsupported(
                path,
                Some("n_vocab"),
                format!(
                    "{n_vocab} is over the {}-entry limit for a vocabulary",
                    crate::kld::MAX_VOCAB
                ),
            ));
        }
        check_size(path, layout, len, expected, &describe)?;

        // The size check bounds this allocation by the file's real size.
        let n_tokens = usize::try_from(n_tokens)
            .map_err(|_| Error::unsupported(path, None, "too many tokens for this platform"))?;
        let mut tokens = Vec::with_capacity(n_tokens);
        let mut buf = vec![0u8; 4 * n_tokens.min(16384)];
        while tokens.len() < n_tokens {
            let take = (n_tokens - tokens.len()).min(buf.len() / 4);
            let bytes = &mut buf[..4 * take];
            input.read_exact(bytes).map_err(|e| Error::io(path, e))?;
            for b in bytes.chunks_exact(4) {
                let t = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if t < 0 || t.unsigned_abs() >= n_vocab {
                    let i = tokens.len() as u64;
                    return Err(Error::format(
                        path,
                        Some(&layout.describe_token(i)),
                        format!("token id {t} is outside the vocabulary 0..{n_vocab}"),
                    ));
                }
                tokens.push(t);
            }
        }
        Ok(BaseFile {
            path: path.to_owned(),
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            file_len: len,
            data_offset,
        })
    }

    pub(super) fn layout(&self) -> Layout {
        Layout {
            n_ctx: self.n_ctx.into(),
            n_vocab: self.n_vocab.into(),
            n_chunk: self.n_chunk.into(),
        }
    }

    /// Scored rows per chunk, `n_ctx - 1 - n_ctx/2` (63 for `-c 128`, 255 for `-c 512`).
    pub fn rows_per_chunk(&self) -> u64 {
        self.layout().rows_per_chunk()
    }

    /// All scored rows in the file.
    pub fn n_rows(&self) -> u64 {
        // Cannot overflow: `open` computed the file size from this product.
        u64::from(self.n_chunk) * self.rows_per_chunk()
    }

    /// `(chunk, j)`: row `r` holds the logits at position `j` of chunk `chunk`, which score the
    /// token at `j + 1`; `j` runs over `n_ctx/2 ..= n_ctx-2`.
    pub fn row_position(&self, r: u64) -> (u64, u64) {
        self.layout().row_position(r)
    }

    /// "row 70 (chunk 1, position 71)", as errors name rows.
    pub fn describe_row(&self, r: u64) -> String {
        self.layout().describe_row(r)
    }

    /// The true next token row `r` scores: `tokens[chunk*n_ctx + j + 1]`. Panics if `r` is not
    /// below [`Self::n_rows`].
    pub fn next_token(&self, r: u64) -> i32 {
        let (chunk, j) = self.row_position(r);
        self.tokens[(chunk * u64::from(self.n_ctx) + j + 1) as usize]
    }

    /// A sequential reader of the rows from the first. It opens the file anew (so two readers of
    /// one file do not share a position) and refuses a file whose size changed since `open`.
    pub fn reader(&self) -> Result<RowReader> {
        let path = &self.path;
        let (file, meta) = crate::files::open_regular(path)?;
        let len = meta.len();
        if len != self.file_len {
            return Err(Error::format(
                path,
                None,
                format!(
                    "changed since it was opened: {len} bytes now, {} before",
                    self.file_len
                ),
            ));
        }
        let mut inner = BufReader::with_capacity(buffer_for(len), file);
        inner
            .seek(SeekFrom::Start(self.data_offset))
            .map_err(|e| Error::io(path, e))?;
        let layout = self.layout();
        Ok(RowReader {
            path: path.clone(),
            inner,
            layout,
            n_rows: self.n_rows(),
            next: 0,
            bytes: vec![0; layout.row_bytes() as usize],
        })
    }
}

/// A base file read as a stream, from its first byte: a named pipe that llama-perplexity's base
/// pass writes into (a 100k-token base file at a 248k vocabulary is ~50 GB: it is read once and
/// never kept). Header and tokens are read and checked at once; rows then arrive in order, and a
/// stream that ends early is an error naming the row.
pub struct BaseStream<R: Read> {
    pub path: PathBuf,
    pub n_ctx: u32,
    pub n_vocab: u32,
    pub n_chunk: u32,
    pub tokens: Vec<i32>,
    /// The header and the tokens as read (a tee forwards them first).
    pub head: Vec<u8>,
    pub rows: RowReader<R>,
}

/// A stream may hold at most this many tokens (a file is bounded by its size; a stream is not).
pub const MAX_STREAM_TOKENS: u64 = 1 << 28;

impl<R: Read> BaseStream<R> {
    /// Reads and checks the header and the tokens of `input`, named `path` in errors.
    pub fn open(path: &Path, mut input: R) -> Result<BaseStream<R>> {
        let mut header = [0u8; HEADER_BYTES as usize];
        let got = read_up_to(&mut input, &mut header).map_err(|e| Error::io(path, e))?;
        if got == 12 && &header[..8] == MAGIC {
            // llama-perplexity writes the magic and n_ctx, tokenizes, and returns when the text
            // is shorter than two windows; its log line saying so is written by a thread that
            // dies with it and is often lost, so the stream's shape is the evidence.
            let n_ctx = header_field(path, &header, "n_ctx", 8)?;
            return Err(Error::format(
                path,
                None,
                format!(
                    "llama-perplexity ended the stream after its header (n_ctx {n_ctx}), before the \
                     vocabulary and the tokens: llama.cpp stops there when the text tokenizes to \
                     fewer than two windows (you need at least {} tokens with a context of \
                     {n_ctx})",
                    2 * u64::from(n_ctx)
                ),
            ));
        }
        if got < header.len() || &header[..8] != MAGIC {
            return Err(Error::format(
                path,
                None,
                format!(
                    "not a llama.cpp KLD base stream: {got} bytes before it ended, starting \"{}\"",
                    header[..got.min(8)].escape_ascii()
                ),
            ));
        }
        let field = |name: &str, at: usize| header_field(path, &header, name, at);
        let (n_ctx, n_vocab, n_chunk) = (
            field("n_ctx", 8)?,
            field("n_vocab", 12)?,
            field("n_chunk", 16)?,
        );
        let layout = Layout {
            n_ctx: n_ctx.into(),
            n_vocab: n_vocab.into(),
            n_chunk: n_chunk.into(),
        };
        if n_ctx < 3 || n_vocab as usize > crate::kld::MAX_VOCAB {
            return Err(Error::format(
                path,
                None,
                format!(
                    "n_ctx {n_ctx} (at least 3) or n_vocab {n_vocab} (at most {}) is out of range",
                    crate::kld::MAX_VOCAB
                ),
            ));
        }
        let n_tokens = layout
            .n_tokens()
            .filter(|&n| n <= MAX_STREAM_TOKENS)
            .ok_or_else(|| {
                Error::format(
                    path,
                    None,
                    format!("n_ctx {n_ctx} x n_chunk {n_chunk} is over {MAX_STREAM_TOKENS} tokens"),
                )
            })? as usize;
        let mut head = header.to_vec();
        let mut bytes = vec![0u8; 4 * n_tokens];
        input.read_exact(&mut bytes).map_err(|e| {
            Error::format(
                path,
                None,
                format!("the stream ended inside the token ids: {e}"),
            )
        })?;
        let mut tokens = Vec::with_capacity(n_tokens);
        for (i, b) in bytes.chunks_exact(4).enumerate() {
            let t = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if t < 0 || t.unsigned_abs() >= n_vocab {
                return Err(Error::format(
                    path,
                    Some(&layout.describe_token(i as u64)),
                    format!("token id {t} is outside the vocabulary 0..{n_vocab}"),
                ));
            }
            tokens.push(t);
        }
        head.extend_from_slice(&bytes);
        let n_rows = layout.n_rows().unwrap_or(0);
        Ok(BaseStream {
            path: path.to_owned(),
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            head,
            rows: RowReader {
                path: path.to_owned(),
                inner: input,
                layout,
                n_rows,
                next: 0,
                bytes: vec![0; layout.row_bytes() as usize],
            },
        })
    }
}

/// The read buffer for a file of `len` bytes: [`READ_BUFFER`], or less for a small file.
fn buffer_for(len: u64) -> usize {
    usize::try_from(len).map_or(READ_BUFFER, |len| len.clamp(64, READ_BUFFER))
}

/// Reads into `buf` until it is full or the input ends; returns the bytes read.
fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The size must be exactly what the header implies; a short file is named by where it ends.
fn check_size(path: &Path, layout: Layout, len: u64, expected: u64, describe: &str) -> Result<()> {
    if len == expected {
        return Ok(());
    }
    let head = format!("expected {expected} bytes for {describe}, found {len}");
    if len > expected {
        return Err(Error::format(
            path,
            None,
            format!(
                "size mismatch: {head} ({} bytes after the last row)",
                len - expected
            ),
        ));
    }
    let data_offset = layout.data_offset().unwrap_or(u64::MAX);
    if len < data_offset {
        let i = (len - HEADER_BYTES) / 4;
        return Err(Error::format(
            path,
            Some(&layout.describe_token(i)),
            format!("truncated: {head}; the file ends inside the token ids"),
        ));
    }
    let row_bytes = layout.row_bytes();
    let r = (len - data_offset) / row_bytes;
    let inside = !(len - data_offset).is_multiple_of(row_bytes);
    let n_rows = layout.n_rows().unwrap_or(u64::MAX);
    let where_ = if inside { "inside" } else { "before" };
    Err(Error::format(
        path,
        Some(&layout.describe_row(r)),
        format!(
            "truncated: {head}; the file ends {where_} this row ({r} of {n_rows} rows complete)"
        ),
    ))
}

/// One stored row: `log p(i) = scale * codes[i] + min_log_prob`, in f32 as llama.cpp decodes it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BaseRow {
    pub scale: f32,
    pub min_log_prob: f32,
    /// `n_vocab` codes (the padding code is not kept).
    pub codes: Vec<u16>,
}

impl BaseRow {
    /// The decoded log-probability of token `i`: an f32 multiply then add, never fused, as
    /// llama.cpp's build computes it. Panics if `i` is out of range.
    pub fn log_prob(&self, i: usize) -> f32 {
        self.scale * f32::from(self.codes[i]) + self.min_log_prob
    }

    /// Decodes every code into `out`. Panics unless `out.len() == self.codes.len()`.
    pub fn decode_into(&self, out: &mut [f32]) {
        assert_eq!(out.len(), self.codes.len(), "decode_into: length mismatch");
        for (o, &q) in out.iter_mut().zip(&self.codes) {
            *o = self.scale * f32::from(q) + self.min_log_prob;
        }
    }

    /// The decoded row as a new vector.
    pub fn decode(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.codes.len()];
        self.decode_into(&mut out);
        out
    }
}

/// Sequential reads of a base file's rows, through a bounded buffer (a file's, or a stream's:
/// the named pipe llama-perplexity writes into).
#[derive(Debug)]
pub struct RowReader<R = BufReader<File>> {
    path: PathBuf,
    inner: R,
    layout: Layout,
    n_rows: u64,
    next: u64,
    bytes: Vec<u8>,
}

impl<R: Read> RowReader<R> {
    /// The bytes of the row last read, as stored (scale, minimum, codes, padding): what a tee
    /// forwards to another reader.
    pub fn last_row_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Rows in the file or stream.
    pub fn n_rows(&self) -> u64 {
        self.n_rows
    }

    /// The index of the row the next call reads.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Reads the next row into `row` (reusing its buffer); `false` after the last row. A row
    /// whose scale or minimum is not finite is an error naming the row.
    pub fn next_row(&mut self, row: &mut BaseRow) -> Result<bool> {
        if self.next >= self.n_rows {
            return Ok(false);
        }
        let r = self.next;
        if let Err(e) = self.inner.read_exact(&mut self.bytes) {
            return Err(if e.kind() == io::ErrorKind::UnexpectedEof {
                Error::format(
                    &self.path,
                    Some(&self.layout.describe_row(r)),
                    "the file ended inside or before this row (it shrank after it was opened, or its writer stopped)",
                )
            } else {
                Error::io(&self.path, e)
            });
        }
        let b = &self.bytes;
        let scale = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let min_log_prob = f32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for (name, v) in [("scale", scale), ("min_log_prob", min_log_prob)] {
            if !v.is_finite() {
                return Err(Error::format(
                    &self.path,
                    Some(&self.layout.describe_row(r)),
                    format!("{name} is {v}, not a finite number"),
                ));
            }
        }
        let n_vocab = self.layout.n_vocab as usize;
        row.scale = scale;
        row.min_log_prob = min_log_prob;
        row.codes.clear();
        row.codes.extend(
            b[8..8 + 2 * n_vocab]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        );
        self.next += 1;
        Ok(true)
    }
}

impl RowReader<BufReader<File>> {
    /// Skips `n` rows without decoding them (to start at a later chunk, or to sample).
    pub fn skip_rows(&mut self, n: u64) -> Result<()> {
        let target = self.next.checked_add(n).filter(|&t| t <= self.n_rows);
        let Some(target) = target else {
            return Err(Error::usage(
                &self.path,
                format!(
                    "cannot skip {n} rows from row {}: the file has {} rows",
                    self.next, self.n_rows
                ),
            ));
        };
        let offset = n
            .checked_mul(self.layout.row_bytes())
            .and_then(|o| i64::try_from(o).ok())
            .ok_or_else(|| Error::usage(&self.path, "skip offset overflows"))?;
        self.inner
            .seek_relative(offset)
            .map_err(|e| Error::io(&self.path, e))?;
        self.next = target;
        Ok(())
    }
}

/// llama.cpp's float rounding trick: adding 1.5·2^23 leaves the integer in the low mantissa
/// bits, rounded to nearest with ties to even; valid for |x| < 2^22, which every in-window code
/// satisfies. Outside that range it wraps exactly as llama.cpp's does.
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Encodes one row of logits exactly as llama.cpp's base pass: the window is clamped to 16 nats
/// below the maximum; `lse` is the f32 of the double log of a double sum of f32 `exp`s; codes are
/// `nearest_int((1/scale)·(l - min))` above the window and 0 at or below it; a flat row (scale
/// 0) is all zeros. An empty slice gives an empty row with scale 0 and minimum 0.
pub fn encode_row(logits: &[f32]) -> BaseRow {
    let mut row = BaseRow::default();
    encode_row_into(logits, &mut row);
    row
}

pub(super) fn encode_row_into(logits: &[f32], row: &mut BaseRow) {
    row.codes.clear();
    let Some(&first) = logits.first() else {
        row.scale = 0.0;
        row.min_log_prob = 0.0;
        return;
    };
    // `std::max(a, b)` is `a < b ? b : a` and `std::min(a, b)` is `b < a ? b : a`; kept literally
    // so NaNs propagate as in llama.cpp.
    let (mut max_logit, mut min_logit) = (first, first);
    for &l in &logits[1..] {
        if max_logit < l {
            max_logit = l;
        }
        if l < min_logit {
            min_logit = l;
        }
    }
    let floor = max_logit - WINDOW_NATS;
    if min_logit < floor {
        min_logit = floor;
    }
    let mut sum_exp = 0.0f64;
    for &l in logits {
        sum_exp += f64::from((l - max_logit).exp());
    }
    let log_sum_exp = sum_exp.ln() as f32;
    row.min_log_prob = min_logit - max_logit - log_sum_exp;
    row.scale = (max_logit - min_logit) / 65535.0;
    if row.scale != 0.0 {
        let inv_scale = 1.0 / row.scale;
        row.codes.extend(logits.iter().map(|&l| {
            if l > min_logit {
                // C's int-to-uint16 conversion is modular, as is `as u16`.
                nearest_int(inv_scale * (l - min_logit)) as u16
            } else {
                0
            }
        }));
    } else {
        row.codes.resize(logits.len(), 0);
    }
}

/// A positive i32 header field at byte `at` (`n_ctx`, `n_vocab`, `n_chunk`).
fn header_field(path: &Path, header: &[u8], name: &str, at: usize) -> Result<u32> {
    let v = i32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
    u32::try_from(v)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| Error::format(path, Some(name), format!("{v} is not positive")))
}

/// Writes a base file llama.cpp's `--kl-divergence` reads, so cardproof's references can be
/// handed to llama.cpp users. Everything goes to a temporary file beside the target, renamed by
/// [`Self::finish`]; dropping the writer unfinished removes it, so no half-written file remains.
#[derive(Debug)]
pub struct BaseFileWriter {
    path: PathBuf,
    tmp_path: PathBuf,
    out: Option<BufWriter<File>>,
    layout: Layout,
    n_rows: u64,
    rows_written: u64,
    row: BaseRow,
    bytes: Vec<u8>,
}

impl BaseFileWriter {
    /// Starts a file for `tokens.len() / n_ctx` chunks (the length must be an exact, non-zero
    /// multiple of `n_ctx`); writes the header and tokens at once.
    pub fn create(path: &Path, n_ctx: u32, n_vocab: u32, tokens: &[i32]) -> Result<Self> {
        // The shape asked for: a context length or token count no base file can hold is the
        // request's fault; a vocabulary past the cap is a model cardproof does not handle.
        if !(3..=i32::MAX as u32).contains(&n_ctx) {
            return Err(Error::usage(
                path,
                format!("n_ctx: {n_ctx} is outside 3..=2^31-1 (at least 3 to score a position)"),
            ));
        }
        // Never write what `open` refuses.
        if !(1..=crate::kld::MAX_VOCAB as u32).contains(&n_vocab) {
            return Err(Error::unsupported(
                path,
                Some("n_vocab"),
                format!("{n_vocab} is outside 1..={}", crate::kld::MAX_VOCAB),
            ));
        }
        let n = tokens.len() as u64;
        let n_chunk = n / u64::from(n_ctx);
        if n == 0 || !n.is_multiple_of(u64::from(n_ctx)) || n_chunk > i32::MAX as u64 {
            return Err(Error::usage(
                path,
                format!(
                    "tokens: {n} tokens is not a positive whole number of {n_ctx}-token chunks"
                ),
            ));
        }
        let layout = Layout {
            n_ctx: n_ctx.into(),
            n_vocab: n_vocab.into(),
            n_chunk,
        };
        if let Some(i) = tokens
            .iter()
            .position(|&t| t < 0 || t.unsigned_abs() >= n_vocab)
        {
            // Token ids the vocabulary does not hold: the tokens and the model do not belong
            // together.
            return Err(Error::mismatch(
                path,
                Some(&layout.describe_token(i as u64)),
                format!(
                    "token id {} is outside the vocabulary 0..{n_vocab}",
                    tokens[i]
                ),
            ));
        }
        let (Some(n_rows), Some(_)) = (layout.n_rows(), layout.file_len()) else {
            return Err(Error::usage(path, "the file would exceed 2^64 bytes"));
        };

        let (tmp_path, file) = create_temp_beside(path)?;
        let mut writer = BaseFileWriter {
            path: path.to_owned(),
            tmp_path,
            out: Some(BufWriter::with_capacity(READ_BUFFER, file)),
            layout,
            n_rows,
            rows_written: 0,
            row: BaseRow::default(),
            bytes: Vec::with_capacity(layout.row_bytes() as usize),
        };
        let mut head = Vec::with_capacity(HEADER_BYTES as usize + 4 * tokens.len());
        head.extend_from_slice(MAGIC);
        for v in [n_ctx, n_vocab, n_chunk as u32] {
            head.extend_from_slice(&v.to_le_bytes());
        }
        for t in tokens {
            head.extend_from_slice(&t.to_le_bytes());
        }
        writer.write_bytes_of(&head)?;
        Ok(writer)
    }

    fn write_bytes_of(&mut self, bytes: &[u8]) -> Result<()> {
        match self.out.as_mut() {
            Some(out) => out.write_all(bytes).map_err(|e| Error::io(&self.path, e)),
            None => Err(Error::internal(&self.path, "writer already closed")),
        }
    }

    /// Encodes and appends the next scored row (rows go chunk by chunk, position by position).
    /// The logits must number `n_vocab`; NaN or +∞ is refused (llama.cpp would store a row no
    /// reader can use), −∞ (a masked token) is fine while one logit is finite.
    pub fn write_row_logits(&mut self, logits: &[f32]) -> Result<()> {
        let r = self.rows_written;
        let subject = || self.layout.describe_row(r);
        if r >= self.n_rows {
            return Err(Error::usage(
                &self.path,
                format!("all {} rows are already written", self.n_rows),
            ));
        }
        if logits.len() as u64 != self.layout.n_vocab {
            return Err(Error::usage(
                &self.path,
                format!(
                    "{}: {} logits for a vocabulary of {}",
                    subject(),
                    logits.len(),
                    self.layout.n_vocab
                ),
            ));
        }
        if let Some(i) = logits
            .iter()
            .position(|l| l.is_nan() || *l == f32::INFINITY)
        {
            return Err(Error::format(
                &self.path,
                Some(&subject()),
                format!("logit {i} is {}", logits[i]),
            ));
        }
        if !logits.iter().any(|l| l.is_finite()) {
            return Err(Error::format(
                &self.path,
                Some(&subject()),
                "every logit is -inf",
            ));
        }
        encode_row_into(logits, &mut self.row);
        let mut bytes = std::mem::take(&mut self.bytes);
        bytes.clear();
        bytes.extend_from_slice(&self.row.scale.to_le_bytes());
        bytes.extend_from_slice(&self.row.min_log_prob.to_le_bytes());
        for q in &self.row.codes {
            bytes.extend_from_slice(&q.to_le_bytes());
        }
        if self.layout.n_vocab % 2 == 1 {
            bytes.extend_from_slice(&[0, 0]);
        }
        let written = self.write_bytes_of(&bytes);
        self.bytes = bytes;
        written?;
        self.rows_written += 1;
        Ok(())
    }

    /// Rows written so far.
    pub fn rows_written(&self) -> u64 {
        self.rows_written
    }

    /// Checks that every row was written, syncs the data and renames the file into place.
    pub fn finish(mut self) -> Result<()> {
        if self.rows_written != self.n_rows {
            return Err(Error::usage(
                &self.path,
                format!(
                    "{} of {} rows written ({} chunks of {})",
                    self.rows_written,
                    self.n_rows,
                    self.layout.n_chunk,
                    self.layout.rows_per_chunk()
                ),
            ));
        }
        let Some(out) = self.out.take() else {
            return Err(Error::internal(&self.path, "writer already closed"));
        };
        let file = out
            .into_inner()
            .map_err(|e| Error::io(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.path, e))?;
        drop(file);
        fs::rename(&self.tmp_path, &self.path).map_err(|e| Error::io(&self.path, e))?;
        // Renamed: nothing left for `Drop` to remove.
        self.tmp_path = PathBuf::new();
        Ok(())
    }
}

impl Drop for BaseFileWriter {
    fn drop(&mut self) {
        // Close before removing (Windows cannot remove an open file).
        drop(self.out.take());
        if !self.tmp_path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.tmp_path);
        }
    }
}

/// A new file `.NAME.PID.N.tmp` beside `path` (same directory, so the final rename is atomic).
fn create_temp_beside(path: &Path) -> Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| Error::usage(path, "the output path names no file"))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // Another process's leftovers can hold a name; a bounded number of fresh names is plenty.
    for _ in 0..1000 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(
            ".{}.{}.{n}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Error::io(path, e)),
        }
    }
    Err(Error::internal(
        path,
        "no free temporary file name beside it",
    ))
}
