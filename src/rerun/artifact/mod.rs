//! Compact reference artifacts (`cardproof reference export`): what a third party needs to
//! re-score a candidate against a reference without the reference's weights.
//!
//! Format: one safetensors file. `__metadata__["cardproof_artifact"]` holds the JSON header
//! ([`Header`]: kind, protocol and its digest, the reference's identity with its lm_head digest,
//! the eval text and token digests, and the layout); tensors are `tokens` (I32, the whole token
//! stream) and per context length L, one row per scored position in window order:
//! `ctx<L>.window` (I32), `ctx<L>.position` (I64), and either
//! - `hidden`: `ctx<L>.hidden` ([rows, hidden], F32 or BF16): the LM head's input (final norm
//!   applied). With the reference's lm_head tensor (identified by its SHA-256; usually the
//!   candidate's own, kept in high precision) the full-vocabulary logits are recomputed exactly;
//! - `top_k`: `ctx<L>.topk_ids` (I32 [rows, K]) and `ctx<L>.topk_logp` (F32 [rows, K]), the
//!   reference's K most likely tokens (ties by lowest id) and their log-probabilities,
//!   `ctx<L>.tail_logp` (F32, log of the remaining mass) and `ctx<L>.token_logp` (F32, the true
//!   next token's log-probability). From these the lumped-tail KL is computed, a guaranteed lower
//!   bound of the full KL (the data-processing inequality).
//!
//! The artifact's own digest is the SHA-256 of the file, written beside it as `<file>.sha256`.

pub mod llamacpp;
#[cfg(feature = "native")]
pub mod spot_check;
pub mod vouch;

pub use vouch::{ArtifactIdentity, ArtifactSource, SpotCheck, Vouch, Voucher};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::mmap::MappedFile;
use crate::checkpoint::safetensors::{self, SafetensorsFile};
use crate::digest::hex;
use crate::error::{Error, Result};
use crate::kld::protocol::{Tail, VocabMode};
use crate::rerun::document::RunProtocol;
use crate::runner::{Runner, WindowLogits};

/// The header's format tag.
pub const FORMAT: &str = "cardproof-reference/v1";
/// The metadata key of the JSON header.
pub const HEADER_KEY: &str = "cardproof_artifact";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Hidden,
    TopK,
}

/// One context length's rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunLayout {
    pub context_length: usize,
    pub windows: usize,
    pub rows: usize,
}

/// The reference an artifact was exported from, as its header states it (and its signer signs
/// it, inside [`Artifact::stated`]). Each field is optional so that a header is read back as it
/// was written, no key added; `extra` keeps what else the exporter stated (`repo`, `revision`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ArtifactReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lm_head_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_dtype: Option<String>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
}

/// The token stream an artifact was exported on: the eval text's and the tokens' digests, the
/// token count, the BOS policy and the tokenizer's digest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ArtifactEval {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer_sha256: Option<String>,
}

/// A stated digest as the messages print it: the JSON string, or `null` when not stated.
pub fn stated_text(value: &Option<String>) -> Value {
    value.clone().map_or(Value::Null, Value::String)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub kind: Kind,
    /// K for `top_k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// `f32` or `bf16` for `hidden`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_dtype: Option<String>,
    pub hidden_size: usize,
    /// Entries of a logit row (the model's vocabulary, padding included) and how many are used.
    pub logit_width: usize,
    pub vocab_size: usize,
    pub protocol: Value,
    pub protocol_sha256: String,
    /// The reference the artifact was exported from.
    pub reference: ArtifactReference,
    /// The token stream it was exported on.
    pub eval: ArtifactEval,
    pub runs: Vec<RunLayout>,
    /// What the artifact lets a verifier compute, in words (goes into reports).
    pub bound: String,
}

impl Header {
    /// The widths the header declares size every row the artifact serves: `1 <= k <= vocab_size
    /// <= logit_width <= MAX_VOCAB` (a top-k row is `logit_width` floats, its tail spread over
    /// `vocab_size - k` tokens).
    fn check_sizes(&self, path: &Path) -> Result<()> {
        let max = crate::kld::MAX_VOCAB;
        let bad = |field: &str, rule: String| Err(Error::format(path, Some(field), rule));
        if !(1..=max).contains(&self.logit_width) {
            return bad(
                "logit_width",
                format!("{} is outside 1..={max}", self.logit_width),
            );
        }
        if !(1..=self.logit_width).contains(&self.vocab_size) {
            return bad(
                "vocab_size",
                format!(
                    "{} is outside 1..={} (the logit width)",
                    self.vocab_size, self.logit_width
                ),
            );
        }
        if self.kind == Kind::TopK {
            match self.k {
                Some(k) if (1..=self.vocab_size).contains(&k) => {}
                Some(k) => {
                    return bad(
                        "k",
                        format!("{k} is outside 1..={} (the vocabulary)", self.vocab_size),
                    );
                }
                None => return bad("k", "missing for a top_k artifact".into()),
            }
        }
        Ok(())
    }
}

/// A row-major f32 matrix of stored rows.
fn f32_rows(file: &SafetensorsFile, bytes: &[u8], name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let info = file
        .get(name)
        .ok_or_else(|| Error::format(&file.path, Some(name), "tensor missing from the artifact"))?;
    let data = &bytes[info.data.start as usize..info.data.end as usize];
    let shape: Vec<usize> = info.shape.iter().map(|&d| d as usize).collect();
    let values = crate::dequant::to_f32(crate::dequant::Stored {
        dtype: info.dtype,
        shape: &shape,
        bytes: data,
    })
    .map_err(|e| Error::format(&file.path, Some(name), e))?;
    Ok((shape, values))
}

/// A stored f32 vector widened to f64 (the log-probabilities a top-k run sums).
fn f64_rows(file: &SafetensorsFile, bytes: &[u8], name: &str) -> Result<Vec<f64>> {
    Ok(f32_rows(file, bytes, name)?
        .1
        .into_iter()
        .map(f64::from)
        .collect())
}

fn ints(file: &SafetensorsFile, bytes: &[u8], name: &str, dtype: Dtype) -> Result<Vec<i64>> {
    let info = file
        .get(name)
        .ok_or_else(|| Error::format(&file.path, Some(name), "tensor missing from the artifact"))?;
    if info.dtype != dtype {
        return Err(Error::format(
            &file.path,
            Some(name),
            format!("is {}, expected {}", info.dtype.name(), dtype.name()),
        ));
    }
    let data = &bytes[info.data.start as usize..info.data.end as usize];
    Ok(match dtype {
        Dtype::I64 => data
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
        _ => data
            .chunks_exact(4)
            .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4]))))
            .collect(),
    })
}

/// A loaded artifact.
pub struct Artifact {
    pub path: PathBuf,
    pub header: Header,
    pub sha256: String,
    pub tokens: Vec<u32>,
    runs: Vec<RunData>,
}

#[derive(Default)]
struct RunData {
    context_length: usize,
    /// (window, position) → row index.
    index: HashMap<(u32, u64), usize>,
    hidden: Vec<f32>,
    topk_ids: Vec<i64>,
    topk_logp: Vec<f32>,
    tail_logp: Vec<f64>,
    token_logp: Vec<f64>,
}

impl Artifact {
    /// Open and check an artifact; `expected_sha256` (from a card or `<file>.sha256`) must match.
    pub fn open(path: &Path) -> Result<Artifact> {
        let map = MappedFile::open(path)?;
        let bytes = map.bytes();
        let sha256 = hex(&Sha256::digest(bytes));
        check_sidecar_digest(path, &sha256)?;
        let file = safetensors::parse_header(path, bytes, bytes.len() as u64)?;
        let stored = Stored {
            path,
            file: &file,
            bytes,
        };
        let header = stored.header()?;
        let tokens = stored.tokens(&header)?;
        let runs = header
            .runs
            .iter()
            .map(|layout| stored.run(&header, layout))
            .collect::<Result<Vec<_>>>()?;
        Ok(Artifact {
            path: path.to_owned(),
            header,
            sha256,
            tokens,
            runs,
        })
    }

    /// What the file states about itself, the predicate its signer signs: kind, the reference's
    /// identity, the protocol's digest, the eval's digests and the rows' layout.
    pub fn stated(&self) -> Value {
        let h = &self.header;
        serde_json::json!({
            "kind": h.kind,
            "k": h.k,
            "hidden_dtype": h.hidden_dtype,
            "reference": h.reference,
            "protocol_sha256": h.protocol_sha256,
            "eval": h.eval,
            "runs": h.runs,
        })
    }

    /// What the artifact's KL is, from its kind (never the header's own words, which whoever
    /// made the file wrote).
    pub fn bound(&self) -> String {
        bound_text(
            self.header.kind,
            self.header.k,
            self.header.hidden_dtype.as_deref(),
        )
    }

    /// The protocol differences between this artifact and a requested run (empty: compatible).
    pub fn protocol_differences(&self, requested: &RunProtocol) -> Vec<String> {
        let stored: RunProtocol = match serde_json::from_value(self.header.protocol.clone()) {
            Ok(p) => p,
            Err(e) => {
                return vec![format!(
                    "protocol: the artifact's protocol record is unreadable: {e}"
                )];
            }
        };
        let json = |v: &dyn erased::Json| v.json();
        let mut out = Vec::new();
        for (key, exported, asked) in [
            (
                "context_lengths",
                json(&stored.context_lengths),
                json(&requested.context_lengths),
            ),
            (
                "positions",
                json(&stored.positions),
                json(&requested.positions),
            ),
            ("bos", json(&stored.bos), json(&requested.bos)),
            (
                "vocab_size",
                json(&stored.vocab_size),
                json(&requested.vocab_size),
            ),
        ] {
            if exported != asked {
                out.push(format!(
                    "{key}: the artifact was exported with {exported}, the run asks for {asked}"
                ));
            }
        }
        if self.header.kind == Kind::TopK {
            let k = self.header.k.unwrap_or(0);
            let want = VocabMode::TopK {
                k,
                tail: Tail::Lumped,
            };
            if requested.vocab != want {
                out.push(format!(
                    "vocab: a top-{k} artifact gives the lumped top-{k} KL (a lower bound of the full KL); run with --vocab top-k --top-k {k} --tail lumped, not {}",
                    json(&requested.vocab)
                ));
            }
        }
        out
    }
}

/// The file's SHA-256 must be what its `<file>.sha256` sidecar says, where there is one: a
/// mismatch means the artifact was changed after export.
fn check_sidecar_digest(path: &Path, sha256: &str) -> Result<()> {
    let sidecar = sidecar_path(path);
    if let Ok(text) = std::fs::read_to_string(&sidecar) {
        let expected = text.split_whitespace().next().unwrap_or_default();
        if expected != sha256 {
            return Err(Error::format(
                path,
                None,
                format!(
                    "digest mismatch: the file's SHA-256 is {sha256}, {} says {expected}; the artifact was changed after export",
                    sidecar.display()
                ),
            ));
        }
    }
    Ok(())
}

/// An artifact file as [`Artifact::open`] reads it: its path (errors name it), its parsed
/// safetensors header and its bytes. Each part is checked against the JSON header as it is read,
/// the header first (everything else is sized by it).
struct Stored<'a> {
    path: &'a Path,
    file: &'a SafetensorsFile,
    bytes: &'a [u8],
}

impl Stored<'_> {
    /// The JSON header: present, readable, of this format, its widths in range and its
    /// protocol hashing to the digest it records.
    fn header(&self) -> Result<Header> {
        let path = self.path;
        let header_text = self.file.metadata.get(HEADER_KEY).ok_or_else(|| {
            Error::format(
                path,
                Some(HEADER_KEY),
                "not a cardproof reference artifact (no header)",
            )
        })?;
        let header: Header = serde_json::from_str(header_text).map_err(|e| {
            Error::format(path, Some(HEADER_KEY), format!("unreadable header: {e}"))
        })?;
        if header.format != FORMAT {
            return Err(Error::format(
                path,
                Some("format"),
                format!("`{}` is not {FORMAT}", header.format),
            ));
        }
        header.check_sizes(path)?;
        let protocol_digest = crate::kld::protocol::sha256_of(&header.protocol);
        if protocol_digest != header.protocol_sha256 {
            return Err(Error::format(
                path,
                Some("protocol_sha256"),
                format!(
                    "the header's protocol hashes to {protocol_digest}, not the recorded {}",
                    header.protocol_sha256
                ),
            ));
        }
        Ok(header)
    }

    /// The whole token stream, which must hash to the header's `eval.tokens_sha256`.
    fn tokens(&self, header: &Header) -> Result<Vec<u32>> {
        let tokens: Vec<u32> = ints(self.file, self.bytes, "tokens", Dtype::I32)?
            .into_iter()
            .map(|t| t as u32)
            .collect();
        let digest = crate::runner::tokens::tokens_sha256(&tokens);
        if header.eval.tokens_sha256.as_deref() != Some(digest.as_str()) {
            return Err(Error::format(
                self.path,
                Some("tokens"),
                format!(
                    "the token stream hashes to {digest}, not the header's {}",
                    stated_text(&header.eval.tokens_sha256)
                ),
            ));
        }
        Ok(tokens)
    }

    /// One context length's rows: where each (window, position) row is, and the kind's data,
    /// each tensor checked against the header's layout.
    fn run(&self, header: &Header, layout: &RunLayout) -> Result<RunData> {
        let p = format!("ctx{}", layout.context_length);
        let window = ints(self.file, self.bytes, &format!("{p}.window"), Dtype::I32)?;
        let position = ints(self.file, self.bytes, &format!("{p}.position"), Dtype::I64)?;
        if window.len() != layout.rows || position.len() != layout.rows {
            return Err(Error::format(
                self.path,
                Some(&p),
                "row count disagrees with the header",
            ));
        }
        let index = window
            .iter()
            .zip(&position)
            .enumerate()
            .map(|(i, (&w, &j))| ((w as u32, j as u64), i))
            .collect();
        let mut run = RunData {
            context_length: layout.context_length,
            index,
            ..RunData::default()
        };
        match header.kind {
            Kind::Hidden => run.hidden = self.hidden_rows(header, layout, &p)?,
            Kind::TopK => self.top_k_rows(header, layout, &p, &mut run)?,
        }
        Ok(run)
    }

    /// A hidden-state run's LM-head inputs, `[rows, hidden_size]`.
    fn hidden_rows(&self, header: &Header, layout: &RunLayout, p: &str) -> Result<Vec<f32>> {
        let (shape, values) = f32_rows(self.file, self.bytes, &format!("{p}.hidden"))?;
        if shape != [layout.rows, header.hidden_size] {
            return Err(Error::format(
                self.path,
                Some(&format!("{p}.hidden")),
                format!(
                    "has shape {shape:?}, expected [{}, {}]",
                    layout.rows, header.hidden_size
                ),
            ));
        }
        Ok(values)
    }

    /// A top-k run's tensors into `run`: K ids and log-probabilities per row (every id inside
    /// the vocabulary), the tail's and the true next token's log-probabilities.
    fn top_k_rows(
        &self,
        header: &Header,
        layout: &RunLayout,
        p: &str,
        run: &mut RunData,
    ) -> Result<()> {
        let k = header.k.unwrap_or(0);
        run.topk_ids = ints(self.file, self.bytes, &format!("{p}.topk_ids"), Dtype::I32)?;
        run.topk_logp = f32_rows(self.file, self.bytes, &format!("{p}.topk_logp"))?.1;
        run.tail_logp = f64_rows(self.file, self.bytes, &format!("{p}.tail_logp"))?;
        run.token_logp = f64_rows(self.file, self.bytes, &format!("{p}.token_logp"))?;
        if run.topk_ids.len() != layout.rows * k || run.topk_logp.len() != layout.rows * k {
            return Err(Error::format(
                self.path,
                Some(p),
                format!("top-k tensors do not hold {} rows of {k}", layout.rows),
            ));
        }
        if run
            .topk_ids
            .iter()
            .any(|&t| t < 0 || t as usize >= header.vocab_size)
        {
            return Err(Error::format(
                self.path,
                Some(&format!("{p}.topk_ids")),
                "a token id is outside the vocabulary",
            ));
        }
        Ok(())
    }
}

/// Protocol fields as their JSON, for messages that quote both sides.
mod erased {
    pub trait Json {
        fn json(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or_default()
        }
    }
}

/// What an artifact of this kind lets a verifier compute. It says nothing of whether the rows
/// are the reference's: that is what the artifact's signer vouches for.
pub fn bound_text(kind: Kind, k: Option<usize>, hidden_dtype: Option<&str>) -> String {
    match kind {
        Kind::Hidden if hidden_dtype == Some("bf16") => "full vocabulary: the reference's logits recomputed with its lm_head from final hidden states stored in bf16 (rounded)".to_owned(),
        Kind::Hidden => "full vocabulary: the reference's logits recomputed with its lm_head from the stored final hidden states".to_owned(),
        Kind::TopK => format!("lower bound: the KL over the reference's top-{} tokens with the rest lumped into one bucket is never above the full KL", k.unwrap_or(0)),
    }
}

/// `<file>.dsse.json`, the signed statement about an artifact (`reference export` writes it).
pub fn envelope_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".dsse.json");
    path.with_file_name(name)
}

/// `<file>.sha256`, the artifact's digest in `sha256sum` format.
pub fn sidecar_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".sha256");
    path.with_file_name(name)
}

/// The reference side of a measurement, served from an artifact. Windows are found by their
/// token ids; the LM head (hidden kind) comes from a model holding the same lm_head tensor.
/// Logits from a window's LM-head inputs (the candidate's head, checked to be the reference's).
pub type Head<'a> = Box<dyn Fn(Vec<f32>) -> Result<Vec<f32>> + Sync + 'a>;

pub struct ArtifactRunner<'a> {
    pub artifact: &'a Artifact,
    /// For `hidden` artifacts: computes logits from LM-head inputs.
    pub head: Option<Head<'a>>,
    windows: HashMap<Vec<u32>, (usize, u32)>,
}

impl<'a> ArtifactRunner<'a> {
    /// `windows[r]` are the windows of run r as the measurement cuts them.
    pub fn new(
        artifact: &'a Artifact,
        windows: &[crate::runner::tokens::Windows],
        head: Option<Head<'a>>,
    ) -> Result<Self> {
        let mut map = HashMap::new();
        for w in windows {
            let Some(r) = artifact
                .runs
                .iter()
                .position(|run| run.context_length == w.length)
            else {
                return Err(Error::format(
                    &artifact.path,
                    None,
                    format!("holds no rows for context length {}", w.length),
                ));
            };
            for (i, ids) in w.windows.iter().enumerate() {
                map.entry(ids.clone()).or_insert((r, i as u32));
            }
        }
        if artifact.header.kind == Kind::Hidden && head.is_none() {
            return Err(Error::format(
                &artifact.path,
                None,
                "a hidden-state artifact needs the reference's lm_head",
            ));
        }
        Ok(ArtifactRunner {
            artifact,
            head,
            windows: map,
        })
    }
}

struct ArtifactWindow<'a> {
    runner: &'a ArtifactRunner<'a>,
    run: usize,
    window: u32,
}

impl ArtifactWindow<'_> {
    fn row(&self, j: usize) -> Result<usize> {
        let run = &self.runner.artifact.runs[self.run];
        run.index.get(&(self.window, j as u64)).copied().ok_or_else(|| {
            Error::mismatch(
                &self.runner.artifact.path,
                None,
                format!(
                    "holds no row for window {} position {j} at context length {} (the run asks for rows the artifact's protocol does not score)",
                    self.window, run.context_length
                ),
            )
        })
    }
}

impl WindowLogits for ArtifactWindow<'_> {
    fn logits(&self, rows: &[usize]) -> Result<Vec<f32>> {
        let a = self.runner.artifact;
        let h = &a.header;
        let run = &a.runs[self.run];
        match h.kind {
            Kind::Hidden => {
                let mut x = Vec::with_capacity(rows.len() * h.hidden_size);
                for &j in rows {
                    let r = self.row(j)?;
                    x.extend_from_slice(&run.hidden[r * h.hidden_size..(r + 1) * h.hidden_size]);
                }
                let head = self
                    .runner
                    .head
                    .as_ref()
                    .ok_or_else(|| Error::internal(&a.path, "no lm_head"))?;
                head(x)
            }
            Kind::TopK => {
                // Log-probabilities as logits: the K stored entries exactly, the tail's mass spread
                // evenly over the other tokens (each strictly below the K-th, so the reference's
                // top-K set is the stored one). Lumped over the set, this is the artifact's KL.
                let k = h.k.unwrap_or(0);
                let width = h.logit_width;
                let rest = (h.vocab_size - k).max(1) as f64;
                let mut out = vec![f32::NEG_INFINITY; rows.len() * width];
                for (n, &j) in rows.iter().enumerate() {
                    let r = self.row(j)?;
                    let row = &mut out[n * width..(n + 1) * width];
                    let lowest = run.topk_logp[r * k + k - 1];
                    let spread = (run.tail_logp[r] - rest.ln()) as f32;
                    let spread = if spread >= lowest {
                        lowest.next_down()
                    } else {
                        spread
                    };
                    row[..h.vocab_size].fill(spread);
                    for i in 0..k {
                        row[run.topk_ids[r * k + i] as usize] = run.topk_logp[r * k + i];
                    }
                }
                Ok(out)
            }
        }
    }

    fn token_nll(&self, row: usize) -> Option<f64> {
        let run = &self.runner.artifact.runs[self.run];
        match self.runner.artifact.header.kind {
            Kind::TopK => self.row(row).ok().map(|r| -run.token_logp[r]),
            Kind::Hidden => None,
        }
    }
}

impl Runner for ArtifactRunner<'_> {
    fn vocab(&self) -> usize {
        self.artifact.header.logit_width
    }

    fn window<'b>(&'b self, ids: &[u32]) -> Result<Box<dyn WindowLogits + 'b>> {
        let &(run, window) = self.windows.get(ids).ok_or_else(|| {
            Error::mismatch(
                &self.artifact.path,
                None,
                "a window of the run is not in the artifact's token stream",
            )
        })?;
        Ok(Box::new(ArtifactWindow {
            runner: self,
            run,
            window,
        }))
    }

    fn environment(&self) -> Value {
        serde_json::json!({
            "artifact": self.artifact.path.display().to_string(),
            "artifact_sha256": self.artifact.sha256,
            "kind": self.artifact.header.kind,
            "k": self.artifact.header.k,
            "bound": self.artifact.bound(),
        })
    }
}

/// Build an artifact file's bytes. `rows[r]` are run r's (window, position) pairs; `hidden[r]`
/// its LM-head inputs (hidden kind) or `topk[r]` its top-K data.
pub struct ExportRun {
    pub context_length: usize,
    pub windows: usize,
    pub rows: Vec<(u32, u64)>,
    pub hidden: Vec<f32>,
    pub topk_ids: Vec<i32>,
    pub topk_logp: Vec<f32>,
    pub tail_logp: Vec<f32>,
    pub token_logp: Vec<f32>,
}

pub fn serialize(header: &Header, tokens: &[u32], runs: &[ExportRun]) -> Result<Vec<u8>> {
    let mut owned: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = Vec::new();
    owned.push((
        "tokens".into(),
        Dtype::I32,
        vec![tokens.len() as u64],
        tokens
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect(),
    ));
    let bf16 = header.hidden_dtype.as_deref() == Some("bf16");
    for run in runs {
        let p = format!("ctx{}", run.context_length);
        let n = run.rows.len() as u64;
        owned.push((
            format!("{p}.window"),
            Dtype::I32,
            vec![n],
            run.rows
                .iter()
                .flat_map(|r| (r.0 as i32).to_le_bytes())
                .collect(),
        ));
        owned.push((
            format!("{p}.position"),
            Dtype::I64,
            vec![n],
            run.rows
                .iter()
                .flat_map(|r| (r.1 as i64).to_le_bytes())
                .collect(),
        ));
        match header.kind {
            Kind::Hidden => {
                let shape = vec![n, header.hidden_size as u64];
                if bf16 {
                    owned.push((
                        format!("{p}.hidden"),
                        Dtype::BF16,
                        shape,
                        run.hidden
                            .iter()
                            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                            .collect(),
                    ));
                } else {
                    owned.push((
                        format!("{p}.hidden"),
                        Dtype::F32,
                        shape,
                        bytemuck::cast_slice(&run.hidden).to_vec(),
                    ));
                }
            }
            Kind::TopK => {
                let k = header.k.unwrap_or(0) as u64;
                owned.push((
                    format!("{p}.topk_ids"),
                    Dtype::I32,
                    vec![n, k],
                    run.topk_ids.iter().flat_map(|v| v.to_le_bytes()).collect(),
                ));
                owned.push((
                    format!("{p}.topk_logp"),
                    Dtype::F32,
                    vec![n, k],
                    bytemuck::cast_slice(&run.topk_logp).to_vec(),
                ));
                owned.push((
                    format!("{p}.tail_logp"),
                    Dtype::F32,
                    vec![n],
                    bytemuck::cast_slice(&run.tail_logp).to_vec(),
                ));
                owned.push((
                    format!("{p}.token_logp"),
                    Dtype::F32,
                    vec![n],
                    bytemuck::cast_slice(&run.token_logp).to_vec(),
                ));
            }
        }
    }
    let text = serde_json::to_string(header).map_err(|e| {
        Error::format(
            Path::new("artifact"),
            None,
            format!("cannot encode the header: {e}"),
        )
    })?;
    let mut metadata = BTreeMap::new();
    metadata.insert(HEADER_KEY.to_owned(), text);
    let tensors: Vec<(&str, Dtype, &[u64], &[u8])> = owned
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    Ok(safetensors::serialize(&tensors, &metadata))
}

/// What an export stores per scored position.
#[derive(Debug, Clone, Copy)]
pub struct ExportSpec {
    pub kind: Kind,
    /// K for `top_k`.
    pub k: usize,
    /// Hidden states in bf16 (half the size, no longer exact).
    pub hidden_bf16: bool,
}

/// Export an artifact from a native reference model over the windows `o` defines.
#[cfg(feature = "native")]
pub fn export_native(
    model: &crate::runner::native::NativeModel,
    eval: &crate::rerun::score::EvalInput,
    o: &crate::rerun::options::MeasureOptions,
    spec: ExportSpec,
    reference: ArtifactReference,
    tokenizer_sha256: &str,
    progress: crate::rerun::score::Progress,
) -> Result<(Header, Vec<u8>)> {
    let ExportSpec {
        kind,
        k,
        hidden_bf16,
    } = spec;
    let d = &model.decoder;
    let width = d.config.vocab;
    let vocab_size = o.vocab_size.unwrap_or(eval.tokenizer_vocab).min(width);
    if kind == Kind::TopK && (k == 0 || k >= vocab_size) {
        return Err(Error::format(
            &model.path,
            None,
            format!(
                "--top-k {k} must be between 1 and the vocabulary size {vocab_size} (exclusive)"
            ),
        ));
    }
    let rows = RowSpec {
        kind,
        k,
        vocab_size,
        width,
    };
    let runs = export_runs(model, eval, o, rows, progress)?;
    let protocol = export_protocol(o, rows);
    let hidden_dtype =
        (kind == Kind::Hidden).then(|| if hidden_bf16 { "bf16" } else { "f32" }.to_owned());
    let bound = bound_text(kind, Some(k), hidden_dtype.as_deref());
    let header = Header {
        format: FORMAT.into(),
        kind,
        k: (kind == Kind::TopK).then_some(k),
        hidden_dtype,
        hidden_size: d.config.hidden,
        logit_width: width,
        vocab_size,
        protocol_sha256: crate::kld::protocol::sha256_of(&protocol),
        protocol,
        reference,
        eval: ArtifactEval {
            text_sha256: Some(eval.stream.text_sha256.clone()),
            tokens_sha256: Some(crate::runner::tokens::tokens_sha256(&eval.stream.ids)),
            token_count: Some(eval.stream.ids.len() as u64),
            bos: Some(o.bos.as_str().to_owned()),
            tokenizer_sha256: Some(tokenizer_sha256.to_owned()),
        },
        runs: runs
            .iter()
            .map(|r| RunLayout {
                context_length: r.context_length,
                windows: r.windows,
                rows: r.rows.len(),
            })
            .collect(),
        bound,
    };
    let bytes = serialize(&header, &eval.stream.ids, &runs)?;
    Ok((header, bytes))
}

/// What an export stores per scored row: the kind (and K), and the logit row's used entries
/// (`vocab_size`) within its full width.
#[cfg(feature = "native")]
#[derive(Debug, Clone, Copy)]
struct RowSpec {
    kind: Kind,
    k: usize,
    vocab_size: usize,
    width: usize,
}

/// One window's exported rows: the kind's fields filled, the others empty.
#[cfg(feature = "native")]
#[derive(Default)]
struct WindowRows {
    hidden: Vec<f32>,
    topk_ids: Vec<i32>,
    topk_logp: Vec<f32>,
    tail_logp: Vec<f32>,
    token_logp: Vec<f32>,
}

/// Every context length's rows, its windows run in parallel; `progress` counts windows over
/// all lengths, each as its forward pass finishes.
#[cfg(feature = "native")]
fn export_runs(
    model: &crate::runner::native::NativeModel,
    eval: &crate::rerun::score::EvalInput,
    o: &crate::rerun::options::MeasureOptions,
    spec: RowSpec,
    progress: crate::rerun::score::Progress,
) -> Result<Vec<ExportRun>> {
    use rayon::prelude::*;

    use crate::runner::tokens;
    let mut runs = Vec::new();
    let all = o
        .context_lengths
        .iter()
        .map(|&l| tokens::windows(eval.stream, eval.text_path, l, o.bos, eval.bos_id))
        .collect::<Result<Vec<_>>>()?;
    let total: usize = all.iter().map(|w| w.windows.len()).sum();
    let done = std::sync::atomic::AtomicUsize::new(0);
    progress(0, total);
    for (&l, windows) in o.context_lengths.iter().zip(all) {
        let rows: Vec<usize> = (0..l)
            .filter(|&j| o.positions.selects(j as u64, l as u64))
            .collect();
        let parts: Vec<WindowRows> = windows
            .windows
            .par_iter()
            .map(|ids| -> Result<WindowRows> {
                let hidden = model.decoder.hidden(ids).map_err(forward_failed(model))?;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(n, total);
                window_rows(model, &hidden, ids, &rows, spec)
            })
            .collect::<Result<_>>()?;
        runs.push(export_run(l, windows.windows.len(), &rows, parts));
    }
    Ok(runs)
}

/// A forward pass's error as the runner's, naming the model.
#[cfg(feature = "native")]
fn forward_failed(
    model: &crate::runner::native::NativeModel,
) -> impl Fn(candle_core::Error) -> Error + '_ {
    |e| Error::runner(&model.path, format!("forward pass failed: {e}"))
}

/// One window's rows from its final hidden states: the LM head's inputs (hidden kind), or each
/// row's top K, tail and true next token (top-k kind).
#[cfg(feature = "native")]
fn window_rows(
    model: &crate::runner::native::NativeModel,
    hidden: &candle_core::Tensor,
    ids: &[u32],
    rows: &[usize],
    spec: RowSpec,
) -> Result<WindowRows> {
    let d = &model.decoder;
    let normed = d.normed_at(hidden, rows).map_err(forward_failed(model))?;
    if spec.kind == Kind::Hidden {
        let h = normed
            .to_dtype(candle_core::DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(forward_failed(model))?;
        return Ok(WindowRows {
            hidden: h,
            ..WindowRows::default()
        });
    }
    let logits = d.head(&normed).map_err(forward_failed(model))?;
    let RowSpec {
        k,
        vocab_size,
        width,
        ..
    } = spec;
    let mut out = WindowRows::default();
    let mut order: Vec<u32> = Vec::with_capacity(vocab_size);
    for (n, &j) in rows.iter().enumerate() {
        let row = &logits[n * width..n * width + vocab_size];
        top_k_row(row, ids[j + 1] as usize, k, &mut order, &mut out);
    }
    Ok(out)
}

/// One row's top-k data into `out`: the K most likely tokens (descending logit, ties by lowest
/// id: the design's top-k rule) with their log-probabilities, the log of the remaining mass,
/// and the log-probability of `next` (the true next token). `order` is scratch.
#[cfg(feature = "native")]
fn top_k_row(row: &[f32], next: usize, k: usize, order: &mut Vec<u32>, out: &mut WindowRows) {
    let vocab_size = row.len();
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = crate::kld::row::log_sum_exp(row, max);
    order.clear();
    order.extend(0..vocab_size as u32);
    // Descending logit, ties by lowest token id (the design's top-k rule).
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    order.select_nth_unstable_by(k - 1, cmp);
    order[..k].sort_unstable_by(cmp);
    let mut in_set = vec![false; vocab_size];
    for &i in &order[..k] {
        in_set[i as usize] = true;
        out.topk_ids.push(i as i32);
        out.topk_logp
            .push((f64::from(row[i as usize]) - lse) as f32);
    }
    let rest: f64 = row
        .iter()
        .enumerate()
        .filter(|(i, _)| !in_set[*i])
        .map(|(_, &v)| (f64::from(v) - f64::from(max)).exp())
        .sum();
    out.tail_logp
        .push((rest.ln() + f64::from(max) - lse) as f32);
    out.token_logp
        .push((f64::from(row[next.min(vocab_size - 1)]) - lse) as f32);
}

/// One context length's export from its windows' rows, in window order: `rows` are the
/// positions scored in every window.
#[cfg(feature = "native")]
fn export_run(
    context_length: usize,
    windows: usize,
    rows: &[usize],
    parts: Vec<WindowRows>,
) -> ExportRun {
    let mut run = ExportRun {
        context_length,
        windows,
        rows: Vec::new(),
        hidden: Vec::new(),
        topk_ids: Vec::new(),
        topk_logp: Vec::new(),
        tail_logp: Vec::new(),
        token_logp: Vec::new(),
    };
    for (w, part) in parts.into_iter().enumerate() {
        run.rows.extend(rows.iter().map(|&j| (w as u32, j as u64)));
        run.hidden.extend(part.hidden);
        run.topk_ids.extend(part.topk_ids);
        run.topk_logp.extend(part.topk_logp);
        run.tail_logp.extend(part.tail_logp);
        run.token_logp.extend(part.token_logp);
    }
    run
}

/// The protocol the export's rows were made under, as the header records it: a top-k export's
/// vocabulary mode is the lumped top-K the rows give.
#[cfg(feature = "native")]
fn export_protocol(o: &crate::rerun::options::MeasureOptions, spec: RowSpec) -> Value {
    let mut options = o.clone();
    if spec.kind == Kind::TopK {
        options.vocab = crate::kld::protocol::VocabMode::TopK {
            k: spec.k,
            tail: crate::kld::protocol::Tail::Lumped,
        };
    }
    let padding = crate::rerun::document::Padding::of(spec.vocab_size, spec.width, spec.width);
    crate::rerun::score::run_protocol(&options, spec.vocab_size, padding).to_value()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An artifact whose header is `header`, with a three-token stream and no runs: everything
    /// `open` checked before the widths were, so only the widths can make it refuse.
    fn with_header(dir: &Path, header: &Value) -> PathBuf {
        let path = dir.join("a.safetensors");
        let metadata = BTreeMap::from([(HEADER_KEY.to_owned(), header.to_string())]);
        let tokens: Vec<u8> = [1i32, 2, 3].iter().flat_map(|t| t.to_le_bytes()).collect();
        let bytes = safetensors::serialize(&[("tokens", Dtype::I32, &[3], &tokens)], &metadata);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Regression (#14): `logit_width`, `vocab_size` and `k` from the header sized each row's
    /// buffer unchecked (`vocab_size - k` underflowed, a width of 2^40 allocated terabytes).
    #[test]
    fn header_widths_are_range_checked_before_anything_is_sized() {
        let dir = tempfile::tempdir().unwrap();
        let base = serde_json::json!({
            "format": FORMAT, "kind": "top_k", "k": 4, "hidden_size": 8,
            "logit_width": 16, "vocab_size": 12, "protocol": {},
            "protocol_sha256": crate::kld::protocol::sha256_of(&serde_json::json!({})),
            "reference": {},
            "eval": {"tokens_sha256": crate::runner::tokens::tokens_sha256(&[1, 2, 3])},
            "runs": [], "bound": "",
        });
        assert!(Artifact::open(&with_header(dir.path(), &base)).is_ok());
        for (field, value, needle) in [
            (
                "logit_width",
                serde_json::json!(1u64 << 40),
                "logit_width: 1099511627776",
            ),
            ("logit_width", serde_json::json!(0), "logit_width: 0"),
            (
                "vocab_size",
                serde_json::json!(17),
                "vocab_size: 17 is outside 1..=16",
            ),
            ("k", serde_json::json!(13), "k: 13 is outside 1..=12"),
            ("k", serde_json::json!(0), "k: 0"),
            ("k", Value::Null, "k: missing"),
        ] {
            let mut header = base.clone();
            header[field] = value;
            let path = with_header(dir.path(), &header);
            let err = Artifact::open(&path).err().expect("refused").to_string();
            assert!(err.contains(needle), "{field}: {err}");
        }
    }
}
