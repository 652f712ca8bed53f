//! The `native` runner: pure Rust on CPU (candle), the embedded default. Its lane is "reference
//! semantics": weights dequantized exactly as their format defines, declared activation and
//! KV-cache quantization emulated, compute in f32 (or a chosen dtype), exact softmax attention.

pub mod attention;
pub mod config;
pub mod decoder;
pub mod delta_rule;
pub mod fused;
pub mod generate;
mod ggml_quants;
mod ggml_tables;
pub mod gguf;
pub mod gguf_family;
pub mod hybrid;
pub mod kv_cache;
pub mod llamacpp_cpu;
pub mod matmul;
pub mod moe;
pub mod packed;
mod row_product;
pub mod weights;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
pub use decoder::{ComputeDtype, Decoder, DecoderCache};
pub use delta_rule::StateDtype;
pub use gguf::Emulate;
use weights::{SafetensorsStore, WeightStore};

/// The candle release the runner is built on (recorded in every measurement's environment).
pub const CANDLE_VERSION: &str = "0.11";

/// A model loaded for the native runner.
pub struct NativeModel {
    pub path: PathBuf,
    /// `safetensors` or `gguf`.
    pub format: &'static str,
    pub decoder: Decoder,
    /// SHA-256 of the output projection's stored bytes (the tied embedding's when tied).
    pub lm_head_sha256: String,
    /// The weight dtype of unquantized matrices as stored (`bf16`, `f16`, `f32`), for the card.
    pub stored_dtype: String,
    /// BOS token id from the checkpoint's own metadata (GGUF `tokenizer.ggml.bos_token_id`,
    /// config.json `bos_token_id`), for inputs that carry no tokenizer.json.
    pub bos_id: Option<u32>,
    /// A GGUF file's size and modification time when it was opened: its f32 tensors are read in
    /// place for the whole run ([`NativeModel::check_unchanged`]).
    opened: Option<(u64, Option<std::time::SystemTime>)>,
}

impl NativeModel {
    /// Refuses a GGUF file whose size or modification time changed since it was opened: its F32
    /// tensors are read in place from the file's map while the windows run, so a file rewritten
    /// meanwhile would have been measured as something other than what was hashed. (Truncating
    /// it under the run ends the process with SIGBUS, as for any mapped reader.)
    pub fn check_unchanged(&self) -> Result<()> {
        let Some(opened) = self.opened else {
            return Ok(());
        };
        if stamp(&self.path)? != opened {
            return Err(Error::format(
                &self.path,
                None,
                "the file changed while it was being measured (its weights are read in place from it): measure a file nothing writes to",
            ));
        }
        Ok(())
    }
}

/// A file's size and modification time: what [`NativeModel::check_unchanged`] compares.
fn stamp(path: &Path) -> Result<(u64, Option<std::time::SystemTime>)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    Ok((meta.len(), meta.modified().ok()))
}

/// Where a model's weights are: a directory with config.json and safetensors, a `.gguf` file, or a
/// directory holding exactly one `.gguf` file.
pub fn resolve(path: &Path) -> Result<(PathBuf, &'static str)> {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "gguf") {
            return Ok((path.to_owned(), "gguf"));
        }
        return Err(Error::usage(
            path,
            "not a model: give a directory with config.json and safetensors, or a .gguf file",
        ));
    }
    let entries = std::fs::read_dir(path).map_err(|e| Error::io(path, e))?;
    let mut ggufs = Vec::new();
    let mut safetensors = false;
    for entry in entries.flatten() {
        let p = entry.path();
        // A report set beside the weights (positions.safetensors) is not the checkpoint.
        if crate::checkpoint::members::excluded(&entry.file_name().to_string_lossy()) {
            continue;
        }
        match p.extension().and_then(|e| e.to_str()) {
            Some("gguf") => ggufs.push(p),
            Some("safetensors") => safetensors = true,
            _ => {}
        }
    }
    if safetensors {
        return Ok((path.to_owned(), "safetensors"));
    }
    match ggufs.len() {
        1 => Ok((ggufs.remove(0), "gguf")),
        0 => Err(Error::usage(path, "holds no .safetensors or .gguf file")),
        n => Err(Error::usage(
            path,
            format!("holds {n} .gguf files; name the one to run"),
        )),
    }
}

/// Loads a model for the native runner: `compute` is the forward pass's precision, `emulate`
/// whose numerics to follow, `recurrent_state` the dtype a hybrid model's carried recurrent
/// state is kept in (dense models have none and ignore it).
pub fn load(
    path: &Path,
    compute: ComputeDtype,
    emulate: Emulate,
    recurrent_state: StateDtype,
) -> Result<NativeModel> {
    let (path, format) = resolve(path)?;
    let bos_id;
    let mut opened_as = None;
    let (store, config): (Box<dyn WeightStore>, config::ModelConfig) = if format == "gguf" {
        opened_as = Some(stamp(&path)?);
        let (store, config) = gguf::GgufStore::open(&path, emulate)?;
        bos_id = store.bos_id();
        (Box::new(store), config)
    } else {
        let config_path = path.join("config.json");
        let json: Value = crate::files::read_config(&config_path)?;
        let config = config::ModelConfig::from_hf(&config_path, &json)?;
        bos_id = json
            .get("bos_token_id")
            .and_then(Value::as_u64)
            .and_then(|b| u32::try_from(b).ok());
        if emulate != Emulate::ReferenceSemantics {
            return Err(Error::usage(
                &path,
                format!(
                    "--emulate {} applies to GGUF models only",
                    emulate.flag_name()
                ),
            ));
        }
        let store = SafetensorsStore::open(&path, json)?;
        store.refuse_unknown_method()?;
        (Box::new(store), config)
    };
    // Tied embeddings: the output layer is the embedding (as transformers loads it).
    let embed = format!("{}.embed_tokens.weight", config.prefix);
    let head = if config.tie_embeddings {
        embed.as_str()
    } else {
        "lm_head.weight"
    };
    let lm_head_sha256 = store.tensor_sha256(head)?.unwrap_or_default();
    let stored_dtype = store.stored_dtype(&embed);
    let decoder = Decoder::load(store.as_ref(), config, compute, recurrent_state)?;
    Ok(NativeModel {
        path,
        format,
        decoder,
        lm_head_sha256,
        stored_dtype,
        bos_id,
        opened: opened_as,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gguf_file_changed_while_measured_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/models/shakespeare-q4_0-gguf/model.gguf"),
            &path,
        )
        .unwrap();
        let model = load(
            &path,
            ComputeDtype::F32,
            Emulate::ReferenceSemantics,
            StateDtype::F32,
        )
        .unwrap();
        model.check_unchanged().unwrap();
        // Rewritten in place, same size, a later time.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let later = std::fs::metadata(&path).unwrap().modified().unwrap()
            + std::time::Duration::from_secs(5);
        file.set_modified(later).unwrap();
        let e = model.check_unchanged().unwrap_err().to_string();
        assert!(e.contains("changed while it was being measured"), "{e}");
    }
}
