//! Who took part in a rerun: each model's record (path, format, the manifest's root digest, the
//! output head's digest, the stored dtype, the runner's own record) and the tokenizer's.

use std::path::Path;

use serde_json::Value;

use super::document::{ModelRecord, TokenizerRecord};
use crate::checkpoint::hash::Manifest;
use crate::error::{Error, Result};
use crate::runner::Runner;
use crate::runner::native::NativeModel;
use crate::runner::tokens;

/// The root digest of a checkpoint's manifest, from a manifest the caller already has (verify
/// hashes the candidate for its report: the files are not read twice) or by hashing.
pub(super) fn root_digest(path: &Path, threads: usize, known: Option<&Manifest>) -> Result<String> {
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

/// Identity of a loaded native model.
pub(super) fn identity(
    m: &NativeModel,
    given: &Path,
    threads: usize,
    known: Option<&Manifest>,
) -> Result<ModelRecord> {
    Ok(identity_of(m, given, root_digest(given, threads, known)?))
}

/// Identity of a loaded native model whose files' root digest is known.
pub(super) fn identity_of(m: &NativeModel, given: &Path, manifest_sha256: String) -> ModelRecord {
    ModelRecord {
        path: given.display().to_string(),
        format: m.format.to_owned(),
        manifest_sha256,
        lm_head_sha256: m.lm_head_sha256.clone(),
        stored_dtype: m.stored_dtype.clone(),
        runner: Runner::environment(m),
        hub: None,
    }
}

/// Identity of a safetensors checkpoint without loading it: manifest and output-head digests,
/// and the logit rows' width. Read from config.json and the tensor names for any architecture
/// ([`crate::checkpoint::head`]): the transformers runner measures what the native runner
/// cannot run.
pub(super) fn checkpoint_identity(
    path: &Path,
    threads: usize,
    known: Option<&Manifest>,
) -> Result<(ModelRecord, usize)> {
    use crate::runner::native::weights::{SafetensorsStore, WeightStore};
    let config_path = path.join("config.json");
    let json: Value = crate::files::read_config(&config_path)?;
    let store = SafetensorsStore::open(path, json.clone())?;
    let layout = crate::checkpoint::head::head_layout(&config_path, &json, &|n| store.has(n))?;
    let lm_head_sha256 = store.tensor_sha256(&layout.head)?.ok_or_else(|| {
        Error::format(
            path,
            Some(&layout.head),
            "the output head's tensor could not be read for its digest",
        )
    })?;
    Ok((
        ModelRecord {
            path: path.display().to_string(),
            format: "safetensors".into(),
            manifest_sha256: root_digest(path, threads, known)?,
            lm_head_sha256,
            stored_dtype: store.stored_dtype(layout.embeddings.as_deref().unwrap_or(&layout.head)),
            runner: Value::Null,
            hub: None,
        },
        layout.vocab,
    ))
}

/// A safetensors checkpoint's logit width (its output head's rows), from its headers and
/// config alone: what the run needs before its digests, which can then be taken beside it.
pub(super) fn logit_width(path: &Path) -> Result<usize> {
    use crate::runner::native::weights::{SafetensorsStore, WeightStore};
    let config_path = path.join("config.json");
    let json: Value = crate::files::read_config(&config_path)?;
    let store = SafetensorsStore::open(path, json.clone())?;
    Ok(crate::checkpoint::head::head_layout(&config_path, &json, &|n| store.has(n))?.vocab)
}

pub(super) fn tokenizer_record(t: &tokens::TokenizerFile) -> TokenizerRecord {
    TokenizerRecord {
        path: t.path.display().to_string(),
        sha256: t.sha256.clone(),
        vocab_size: t.vocab_size,
    }
}
