//! What a checkpoint really holds, from headers alone: every linear module, whether it is
//! quantized or kept in high precision, its scheme and effective bits per weight, the buckets that
//! matter for fidelity, and where the configuration disagrees with the tensors.
//!
//! This module holds the report's types, the entry point that finds the checkpoints under a path,
//! and the summary both formats share. The work itself is split by concept: [`naming`] reads
//! module names and tensor suffixes, [`from_safetensors`] classifies safetensors tensors into
//! modules and schemes, [`from_gguf`] reads GGUF tensor types, and [`cross_check`] compares a
//! quantization config with what the tensors hold.

mod cross_check;
mod from_gguf;
mod from_safetensors;
mod naming;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use self::from_gguf::inspect_gguf;
use self::from_safetensors::{Configs, inspect_safetensors};
use super::safetensors;
use crate::error::{Error, Result};
use crate::findings::Finding;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Quantized,
    HighPrecision,
}

/// Where a module sits, for the fidelity questions people ask ("is lm_head quantized?").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Bucket {
    LmHead,
    Embeddings,
    Attention,
    LinearAttention,
    Mlp,
    MoeExperts,
    MoeRouter,
    // A shared expert's projections and its gate (`shared_expert.*`, `shared_expert_gate`, GGUF
    // `ffn_*_shexp`, `ffn_gate_inp_shexp`).
    MoeSharedExpert,
    Mtp,
    Vision,
    Other,
}

impl Bucket {
    /// Every bucket, in report order.
    pub const ALL: [Bucket; 11] = [
        Bucket::LmHead,
        Bucket::Embeddings,
        Bucket::Attention,
        Bucket::LinearAttention,
        Bucket::Mlp,
        Bucket::MoeExperts,
        Bucket::MoeRouter,
        Bucket::MoeSharedExpert,
        Bucket::Mtp,
        Bucket::Vision,
        Bucket::Other,
    ];

    /// The bucket a name (`linear_attention`) stands for.
    pub fn from_name(name: &str) -> Option<Bucket> {
        Bucket::ALL.into_iter().find(|b| b.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::LmHead => "lm_head",
            Bucket::Embeddings => "embeddings",
            Bucket::Attention => "attention",
            Bucket::LinearAttention => "linear_attention",
            Bucket::Mlp => "mlp",
            Bucket::MoeExperts => "moe_experts",
            Bucket::MoeRouter => "moe_router",
            Bucket::MoeSharedExpert => "moe_shared_expert",
            Bucket::Mtp => "mtp",
            Bucket::Vision => "vision",
            Bucket::Other => "other",
        }
    }
}

/// One linear module (or the embeddings, reported apart).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Module {
    pub name: String,
    pub status: Status,
    pub scheme: String,
    /// Stored bytes of the weight with its scales, zero points and indexes, × 8 ÷ logical weights.
    pub bits_per_weight: f64,
    pub bucket: Bucket,
    /// Logical (dequantized) shape.
    pub shape: Vec<u64>,
    pub parameters: u64,
    /// Group size, or `[rows, cols]` for 2-D blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_size: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symmetric: Option<bool>,
    /// Activation handling: `none` (weight-only), `fp8-static`, `fp8-dynamic`, `int8-dynamic`,
    /// `nvfp4`; absent when the files do not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activations: Option<String>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileSummary {
    pub path: String,
    pub size: u64,
    pub tensors: usize,
}

#[derive(Debug, Clone, Default, Serialize, JsonSchema)]
pub struct BucketSummary {
    pub modules: usize,
    pub quantized: usize,
    pub high_precision: usize,
    pub parameters: u64,
    pub schemes: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Summary {
    pub quantized: usize,
    pub high_precision: usize,
    /// Histogram over all counted modules, high-precision ones included.
    pub schemes: BTreeMap<String, usize>,
    /// `quantized`, `high_precision`, `tied` (shares the embeddings) or `absent`.
    pub lm_head: String,
    /// Scheme of the token embeddings, if present.
    pub embeddings: Option<String>,
    /// KV-cache quantization the checkpoint carries (scales or a declaration).
    pub kv_cache: Option<String>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DeclaredSummary {
    pub source: String,
    pub method: String,
    pub ignore: Vec<String>,
}

/// One checkpoint (or one GGUF variant of a directory).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Inspection {
    pub format: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub files: Vec<FileSummary>,
    pub tensor_count: usize,
    pub parameter_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared: Option<DeclaredSummary>,
    /// GGUF: llama.cpp's file type from `general.file_type` (`q4_k_m`), what `llama-quantize`
    /// was asked for; tensors that do not divide into its blocks are stored in a fallback type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_type: Option<String>,
    pub modules: Vec<Module>,
    pub buckets: BTreeMap<&'static str, BucketSummary>,
    pub summary: Summary,
    pub findings: Vec<Finding>,
}

/// Inspect a path: a `.safetensors` file, a `.gguf` file, or a directory (which may hold several
/// GGUF variants, each reported on its own).
pub fn inspect_path(path: &Path) -> Result<Vec<Inspection>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() && !meta.is_dir() {
        return Err(crate::files::not_regular(path, &meta));
    }
    if meta.is_file() {
        return match extension(path).as_deref() {
            Some("gguf") => {
                // One file of a split GGUF stands for all of its parts.
                let dir = path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let mut siblings = Vec::new();
                for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
                    let p = entry.map_err(|e| Error::io(dir, e))?.path();
                    if extension(&p).as_deref() == Some("gguf") {
                        siblings.push(p);
                    }
                }
                siblings.sort();
                let name = path
                    .file_name()
                    .map(|n| dir.join(n))
                    .unwrap_or_else(|| path.to_path_buf());
                let files = gguf_variants(&siblings)
                    .into_iter()
                    .find(|(_, files)| files.len() > 1 && files.contains(&name))
                    .map_or_else(|| vec![path.to_path_buf()], |(_, files)| files);
                Ok(vec![inspect_gguf(&files, None)?])
            }
            Some("safetensors") => {
                let dir = path.parent().unwrap_or(Path::new("."));
                let configs = Configs::read(dir)?;
                Ok(vec![inspect_safetensors(
                    safetensors::open_file(path)?,
                    &configs,
                    dir,
                )?])
            }
            _ => Err(Error::usage(
                path,
                "not a checkpoint: expected a .safetensors or .gguf file, or a directory",
            )),
        };
    }
    let mut ggufs = Vec::new();
    let mut has_safetensors = false;
    for entry in std::fs::read_dir(path).map_err(|e| Error::io(path, e))? {
        let p = entry.map_err(|e| Error::io(path, e))?.path();
        if p.file_name()
            .is_some_and(|n| crate::checkpoint::members::excluded(&n.to_string_lossy()))
        {
            continue;
        }
        match extension(&p).as_deref() {
            Some("gguf") => ggufs.push(p),
            Some("safetensors") => has_safetensors = true,
            _ => {}
        }
    }
    let mut out = Vec::new();
    if has_safetensors || path.join("model.safetensors.index.json").exists() {
        let configs = Configs::read(path)?;
        out.push(inspect_safetensors(
            safetensors::open_dir(path)?,
            &configs,
            path,
        )?);
    }
    ggufs.sort();
    for (variant, files) in gguf_variants(&ggufs) {
        out.push(inspect_gguf(&files, Some(variant))?);
    }
    if out.is_empty() {
        return Err(Error::usage(
            path,
            "no .safetensors or .gguf files in this directory",
        ));
    }
    Ok(out)
}

fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
}

/// Split GGUF files (`name-00001-of-00003.gguf`) form one variant.
fn gguf_variants(files: &[PathBuf]) -> Vec<(String, Vec<PathBuf>)> {
    let split = regex::Regex::new(r"^(.*)-\d{5}-of-\d{5}\.gguf$").expect("valid");
    let mut variants: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let key = split.captures(name).and_then(|c| c.get(1)).map_or_else(
            || name.trim_end_matches(".gguf").to_owned(),
            |m| m.as_str().to_owned(),
        );
        variants.entry(key).or_default().push(f.clone());
    }
    variants.into_iter().collect()
}

fn relative(path: &Path, root: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// Fill in the summary, bucket histograms and parameter count (which so far holds the
/// parameters outside modules: norms, biases) from the modules.
fn finish(mut inspection: Inspection, embeddings: &[Module]) -> Inspection {
    inspection.parameter_count += inspection
        .modules
        .iter()
        .chain(embeddings)
        .map(|m| m.parameters)
        .sum::<u64>();
    let mut summary = inspection.summary.clone();
    for m in &inspection.modules {
        match m.status {
            Status::Quantized => summary.quantized += 1,
            Status::HighPrecision => summary.high_precision += 1,
        }
        *summary.schemes.entry(m.scheme.clone()).or_default() += 1;
        if m.bucket == Bucket::LmHead {
            summary.lm_head = match m.status {
                Status::Quantized => "quantized".into(),
                Status::HighPrecision => "high_precision".into(),
            };
        }
    }
    for m in inspection.modules.iter().chain(embeddings) {
        let b = inspection.buckets.entry(m.bucket.as_str()).or_default();
        b.modules += 1;
        b.parameters += m.parameters;
        match m.status {
            Status::Quantized => b.quantized += 1,
            Status::HighPrecision => b.high_precision += 1,
        }
        *b.schemes.entry(m.scheme.clone()).or_default() += 1;
    }
    inspection.summary = summary;
    inspection
}
