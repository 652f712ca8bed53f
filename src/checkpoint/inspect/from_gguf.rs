//! The GGUF inspection.
//!
//! GGUF states each tensor's type outright, so the module, scheme and bits per weight are read
//! from the tensor table rather than recognised from a layout; split files (`-00001-of-00003`)
//! are read as one checkpoint. It shares only the report types and the summary with the
//! safetensors inspection.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::naming::gguf_bucket;
use super::{Bucket, FileSummary, Inspection, Module, Status, Summary, finish, relative};
use crate::checkpoint::gguf::{self, GgufFile};
use crate::error::{Error, Result};

pub(super) fn inspect_gguf(paths: &[PathBuf], variant: Option<String>) -> Result<Inspection> {
    let files: Vec<GgufFile> = paths
        .iter()
        .map(|p| gguf::read_file(p))
        .collect::<Result<_>>()?;
    let mut modules = Vec::new();
    let mut embeddings = Vec::new();
    let mut other_parameters = 0u64;
    let mut tensor_count = 0;
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for file in &files {
        for t in &file.tensors {
            if let Some(first) = seen.insert(&t.name, &file.path) {
                return Err(Error::format(
                    &file.path,
                    Some(&t.name),
                    format!("tensor also appears in {}", first.display()),
                ));
            }
        }
    }
    // The architecture and MTP blocks are stated in the first file (a split repeats them).
    let architecture = files
        .first()
        .and_then(GgufFile::architecture)
        .unwrap_or_default()
        .to_owned();
    let meta = |k: &str| {
        files
            .first()
            .and_then(|f| f.get(&format!("{architecture}.{k}")))
            .and_then(gguf::GgufValue::as_u64)
    };
    let mtp_from = match (meta("block_count"), meta("nextn_predict_layers")) {
        (Some(blocks), Some(n)) if n > 0 => blocks.checked_sub(n),
        _ => None,
    };
    for file in &files {
        tensor_count += file.tensors.len();
        for t in &file.tensors {
            let name = t.name.strip_suffix(".weight").unwrap_or(&t.name);
            if t.dims.len() < 2 || t.name.ends_with(".bias") {
                other_parameters += t.numel();
                continue;
            }
            let bucket = gguf_bucket(name, &architecture, mtp_from);
            let parameters = t.numel();
            let module = Module {
                name: name.to_owned(),
                status: if t.ty.is_quantized() {
                    Status::Quantized
                } else {
                    Status::HighPrecision
                },
                scheme: t.ty.name().to_owned(),
                bits_per_weight: if parameters == 0 {
                    0.0
                } else {
                    t.n_bytes as f64 * 8.0 / parameters as f64
                },
                bucket,
                // GGUF lists dims innermost first; report [out, in] like safetensors.
                shape: t.dims.iter().rev().copied().collect(),
                parameters,
                group_size: t.ty.is_quantized().then(|| Value::from(t.ty.block_size())),
                symmetric: None,
                activations: None,
            };
            if bucket == Bucket::Embeddings {
                embeddings.push(module);
            } else {
                modules.push(module);
            }
        }
    }
    let root = paths
        .first()
        .and_then(|p| p.parent())
        .unwrap_or(Path::new(""));
    // No output tensor means the head shares the token embeddings, when there are any; a file
    // without them (a vocabulary-only GGUF, tokenizer metadata and no tensors) has no head at
    // all. An output tensor present is counted by `finish`.
    let tied = !embeddings.is_empty();
    let summary = Summary {
        quantized: 0,
        high_precision: 0,
        schemes: BTreeMap::new(),
        lm_head: if tied { "tied".into() } else { "absent".into() },
        embeddings: embeddings.first().map(|e| e.scheme.clone()),
        kv_cache: None,
    };
    Ok(finish(
        Inspection {
            format: "gguf",
            variant,
            files: files
                .iter()
                .map(|f| FileSummary {
                    path: relative(&f.path, root),
                    size: f.file_size,
                    tensors: f.tensors.len(),
                })
                .collect(),
            tensor_count,
            parameter_count: other_parameters,
            declared: None,
            file_type: files
                .first()
                .and_then(|f| f.get("general.file_type"))
                .and_then(gguf::GgufValue::as_u64)
                .and_then(gguf::file_type_name)
                .map(str::to_owned),
            modules,
            buckets: BTreeMap::new(),
            summary,
            findings: Vec::new(),
        },
        &embeddings,
    ))
}
