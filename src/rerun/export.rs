//! `cardproof reference export`: the reference's side of a rerun, stored once so that a
//! candidate can be measured later without the reference model: a compact artifact (final hidden
//! states or top-k log-probabilities) or a llama.cpp `--kl-divergence-base` file.

use std::path::Path;

use serde_json::{Value, json};
use sha2::Digest as _;

use super::options::MeasureOptions;
use super::score::EvalInput;
use crate::error::{Error, Result};
use crate::files::write_atomically;
use crate::runner::tokens;

/// `cardproof reference export`: a compact reference artifact from a native reference model.
pub fn export_reference(
    model: &Path,
    eval_text: &Path,
    options: &MeasureOptions,
    spec: super::artifact::ExportSpec,
    identity_extra: Value,
    threads: usize,
    out: &Path,
) -> Result<super::artifact::Header> {
    use crate::runner::native;
    options.check()?;
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(model))?;
    let stream = tokens::tokenize(&tokenizer, eval_text)?;
    let reference = native::load(
        model,
        native::ComputeDtype::F32,
        native::Emulate::ReferenceSemantics,
    )?;
    let id = super::lanes::identity(&reference, model, threads, None)?;
    let (header, bytes) = super::artifact::export_native(
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
    let digest = crate::checkpoint::hash::hex(&sha2::Sha256::digest(&bytes));
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    write_atomically(
        &super::artifact::sidecar_path(out),
        format!("{digest}  {name}\n").as_bytes(),
    )?;
    Ok(header)
}

/// `cardproof reference export --kind llamacpp`: the reference's rows as a llama.cpp base file.
pub fn export_llamacpp(
    model: &Path,
    eval_text: &Path,
    n_ctx: usize,
    bos: tokens::Bos,
    out: &Path,
) -> Result<u64> {
    use crate::runner::native;
    crate::measure::protocol::check_context_length(n_ctx as u64)
        .map_err(|rule| Error::usage(out, format!("n_ctx: {rule}")))?;
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
    super::artifact::llamacpp::export_native(
        &reference,
        &stream,
        eval_text,
        n_ctx,
        bos,
        tokenizer.bos_id,
        out,
    )
}
