//! `cardproof reference export`: the reference's side of a rerun, stored once so that a
//! candidate can be measured later without the reference model: a compact artifact (final hidden
//! states or top-k log-probabilities) or a llama.cpp `--kl-divergence-base` file.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::Digest as _;

use crate::schema::SchemaVersion;

use super::options::MeasureOptions;
use super::score::{EvalInput, Progress};
use crate::error::{Error, Result};
use crate::files::write_atomically;
use crate::runner::tokens;

/// What an export is doing now (its stage, for a progress display).
type Stage<'a> = &'a (dyn Fn(&str) + Sync);

/// What an export shows while it works: its stage, and windows done out of all.
#[derive(Clone, Copy)]
pub struct Shown<'a> {
    pub stage: Stage<'a>,
    pub progress: Progress<'a>,
}

/// The reference's tokenizer, the eval text tokenized with it, and the reference loaded in f32
/// with reference semantics (what every export stores).
fn load_reference(
    model: &Path,
    eval_text: &Path,
    stage: Stage,
) -> Result<(
    tokens::TokenizerFile,
    tokens::TokenStream,
    crate::runner::native::NativeModel,
)> {
    use crate::runner::native;
    stage("tokenizing");
    let tokenizer = tokens::load_tokenizer(&tokens::tokenizer_path(model))?;
    // A conversation file renders with the reference's own template.
    let stream = tokens::tokenize_eval_text(
        &tokenizer,
        eval_text,
        &tokens::ChatTemplateChoice::default(),
        model,
        model,
        stage,
    )?;
    stage("loading the reference");
    let reference = native::load(
        model,
        native::ComputeDtype::F32,
        native::Emulate::ReferenceSemantics,
        native::StateDtype::F32,
    )?;
    Ok((tokenizer, stream, reference))
}

/// `cardproof reference export`: a compact reference artifact from a native reference model
/// (the request's model, eval text, options, threads and `out`).
pub fn export_reference(
    r: &ExportRequest,
    spec: super::artifact::ExportSpec,
    identity_extra: Value,
    shown: Shown,
) -> Result<super::artifact::Header> {
    let Shown { stage, progress } = shown;
    let (model, eval_text, options, threads, out) =
        (r.model, r.eval_text, &r.options, r.threads, r.out);
    options.check()?;
    let (tokenizer, stream, reference) = load_reference(model, eval_text, stage)?;
    stage("hashing");
    let id = super::identity::identity(&reference, model, threads, None)?;
    stage("exporting");
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
            serde_json::from_value(reference).map_err(|e| {
                Error::internal(
                    model,
                    format!("the reference's identity does not read: {e}"),
                )
            })?
        },
        &tokenizer.sha256,
        progress,
    )?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::write(dir, e))?;
    }
    write_atomically(out, &bytes)?;
    let digest = crate::digest::hex(&sha2::Sha256::digest(&bytes));
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
/// Returns the rows written and the reference's identity (a base file holds none; its signed
/// statement names it).
pub fn export_llamacpp(
    model: &Path,
    eval_text: &Path,
    n_ctx: usize,
    bos: tokens::Bos,
    (out, threads): (&Path, usize),
    stage: Stage,
    progress: Progress,
) -> Result<(u64, Value)> {
    crate::kld::protocol::check_context_length(n_ctx as u64)
        .map_err(|rule| Error::usage(out, format!("n_ctx: {rule}")))?;
    let (tokenizer, stream, reference) = load_reference(model, eval_text, stage)?;
    stage("hashing");
    let id = super::identity::identity(&reference, model, threads, None)?;
    let identity = json!({
        "path": model.display().to_string(),
        "format": id.format,
        "manifest_sha256": id.manifest_sha256,
        "lm_head_sha256": id.lm_head_sha256,
        "stored_dtype": id.stored_dtype,
    });
    stage("exporting");
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::write(dir, e))?;
    }
    let windows = tokens::windows(&stream, eval_text, n_ctx, bos, tokenizer.bos_id)?;
    let rows =
        super::artifact::llamacpp::export_native(&reference, &stream, &windows, out, progress)?;
    Ok((rows, identity))
}

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportRequest<'a> {
    pub model: &'a Path,
    pub eval_text: &'a Path,
    pub options: MeasureOptions,
    pub kind: ExportKind,
    /// Tokens kept per row for `top_k`.
    pub k: usize,
    /// Hidden states stored in bf16 (half the size, no longer exact).
    pub hidden_bf16: bool,
    /// The reference's Hub repository and commit, recorded in the artifact.
    pub repo: Option<String>,
    pub revision: Option<String>,
    pub threads: usize,
    pub out: &'a Path,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportKind {
    Hidden,
    TopK,
    /// A llama.cpp `--kl-divergence-base` file.
    Llamacpp,
}

/// `reference export --json`: the artifact written, read back from disk.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Exported {
    pub schema_version: SchemaVersion,
    pub artifact: String,
    /// `hidden`, `top_k` or `llamacpp`.
    pub kind: String,
    pub sha256: String,
    pub size: u64,
    /// `FILE.sha256` (null for a llama.cpp base file, which has none).
    pub sidecar: Option<String>,
    /// Scored positions stored.
    pub rows: usize,
    /// What the artifact lets a verifier compute, in words (null for a llama.cpp base file).
    pub bound: Option<String>,
    /// What was written, in words (the human line).
    #[serde(skip)]
    pub note: String,
    /// The pre-flight's warnings about the protocol exported (printed on stderr).
    #[serde(skip)]
    pub warnings: Vec<super::preflight::Warning>,
    /// `FILE.dsse.json`, the signed statement about the artifact (set once it is signed).
    pub envelope: Option<String>,
    /// The keyid that signed it.
    pub signed_by: Option<String>,
    /// What the file states about itself (the statement's predicate).
    #[serde(skip)]
    pub stated: Value,
    /// The reference it was made from (the predicate's `reference`).
    #[serde(skip)]
    pub reference: Value,
}

/// Export the reference's side and describe what was written (its digest and size read back).
/// `stage` names what it is doing; `progress` counts windows done out of all windows.
pub fn export(r: &ExportRequest, stage: Stage, progress: Progress) -> Result<Exported> {
    use super::artifact::{ExportSpec, Kind};
    let warnings = super::preflight::check_export(r, stage)?;
    let (kind, sidecar, rows, bound, note, stated, reference) = match r.kind {
        ExportKind::Llamacpp => {
            let [n_ctx] = r.options.context_lengths[..] else {
                return Err(Error::usage(
                    r.out,
                    "--kind llamacpp takes exactly one --context-length (a base file has one n_ctx)",
                ));
            };
            let (rows, reference) = export_llamacpp(
                r.model,
                r.eval_text,
                n_ctx,
                r.options.bos,
                (r.out, r.threads),
                stage,
                progress,
            )?;
            let stated =
                super::artifact::llamacpp::stated(&crate::kld::llamacpp::BaseFile::open(r.out)?);
            let note = format!(
                "wrote {} ({rows} rows: the second half of each {n_ctx}-token window, as llama-perplexity --kl-divergence-base writes them)",
                r.out.display(),
            );
            (
                "llamacpp",
                None,
                rows as usize,
                None,
                note,
                stated,
                reference,
            )
        }
        ExportKind::Hidden | ExportKind::TopK => {
            let mut extra = serde_json::Map::new();
            if let Some(repo) = &r.repo {
                extra.insert("repo".into(), repo.clone().into());
            }
            if let Some(rev) = &r.revision {
                extra.insert("revision".into(), rev.clone().into());
            }
            let header = export_reference(
                r,
                ExportSpec {
                    kind: if r.kind == ExportKind::TopK {
                        Kind::TopK
                    } else {
                        Kind::Hidden
                    },
                    k: r.k,
                    hidden_bf16: r.hidden_bf16,
                },
                Value::Object(extra),
                Shown { stage, progress },
            )?;
            let size = std::fs::metadata(r.out).map(|m| m.len()).unwrap_or(0);
            let rows: usize = header.runs.iter().map(|run| run.rows).sum();
            let sidecar = super::artifact::sidecar_path(r.out);
            let note = format!(
                "wrote {} ({size} bytes, {rows} scored positions, {:.0} bytes each; digest in {}): {}",
                r.out.display(),
                size as f64 / rows.max(1) as f64,
                sidecar.display(),
                header.bound
            );
            let kind = match header.kind {
                Kind::Hidden => "hidden",
                Kind::TopK => "top_k",
            };
            let written = super::artifact::Artifact::open(r.out)?;
            (
                kind,
                Some(sidecar),
                rows,
                Some(written.bound()),
                note,
                written.stated(),
                serde_json::to_value(&header.reference).unwrap_or_default(),
            )
        }
    };
    let sha256 = crate::checkpoint::hash::hash_file(r.out)?;
    let size = std::fs::metadata(r.out)
        .map_err(|e| Error::io(r.out, e))?
        .len();
    Ok(Exported {
        schema_version: SchemaVersion,
        artifact: r.out.display().to_string(),
        kind: kind.into(),
        sha256,
        size,
        sidecar: sidecar.map(|p: PathBuf| p.display().to_string()),
        rows,
        bound,
        note,
        warnings,
        envelope: None,
        signed_by: None,
        stated,
        reference,
    })
}
