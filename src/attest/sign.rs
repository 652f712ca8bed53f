//! `cardproof sign FILE`: a measurement.json or report.json signed as the predicate of an in-toto
//! statement whose subjects are the checkpoint's files.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;

use crate::error::{Error, Result};

/// The most a measurement.json or report.json may weigh (they hold summaries, not rows).
const MAX_DOCUMENT_BYTES: u64 = 256 << 20;

/// `cardproof sign FILE`: a measurement.json or report.json as the predicate of an in-toto
/// statement whose subjects are the checkpoint's files (`checkpoint`, else the path the document
/// names), in a DSSE envelope signed with `key`.
pub fn sign_document(
    file: &Path,
    checkpoint: Option<&Path>,
    key: &SigningKey,
) -> Result<serde_json::Value> {
    use crate::checkpoint::hash::{HashOptions, hash_path};
    let bytes = crate::files::read_capped(file, MAX_DOCUMENT_BYTES, "a measurement or report")?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::format(file, None, format!("not JSON: {e}")))?;
    let (predicate_type, named) = if doc.get("claims").is_some() && doc.get("verdict").is_some() {
        (super::PREDICATE_TYPE, doc["checkpoint"]["path"].as_str())
    } else if doc.get("runs").is_some() && doc.get("protocol").is_some() {
        (
            super::MEASUREMENT_PREDICATE_TYPE,
            doc["candidate"]["path"].as_str(),
        )
    } else {
        return Err(Error::format(
            file,
            None,
            "not a cardproof measurement.json or report.json (no `runs`/`protocol` or `claims`/`verdict`)",
        ));
    };
    let dir = match (checkpoint, named) {
        (Some(c), _) => c.to_owned(),
        (None, Some(n)) if Path::new(n).exists() => PathBuf::from(n),
        _ => {
            return Err(Error::usage(
                file,
                "the checkpoint it describes is not here; pass --checkpoint DIR (its files become the statement's subjects)",
            ));
        }
    };
    // In its output set, the document is signed with the set's other files (positions,
    // renderings), so that none of them can be rewritten after signing.
    let mut predicate = doc;
    if predicate.get("set_files").is_none()
        && let Some(files) = crate::outset::set_files_beside(file, &predicate)?
        && let Some(o) = predicate.as_object_mut()
    {
        o.insert(
            "set_files".into(),
            serde_json::to_value(files)
                .map_err(|e| Error::internal(file, format!("cannot encode: {e}")))?,
        );
    }
    let manifest = hash_path(&dir, &HashOptions::default(), &|_| {})?;
    let statement = super::statement_of(predicate_type, &super::subjects(&manifest), predicate);
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::internal(file, format!("cannot encode the statement: {e}")))?;
    Ok(super::sign_envelope(&payload, super::PAYLOAD_TYPE, key))
}

/// What [`sign_file`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The envelope written.
    pub envelope: PathBuf,
    /// SHA-256 of the envelope file (lowercase hex).
    pub sha256: String,
    /// The document signed.
    pub file: PathBuf,
    /// The signing key's keyid.
    pub keyid: String,
    /// The statement's `predicateType`, read back from the envelope's payload.
    pub predicate_type: String,
    /// How many subjects (checkpoint files) the statement lists.
    pub subjects: usize,
}

/// Where `cardproof sign FILE` writes without `--out`: `NAME.dsse.json` beside `NAME.json`.
pub fn default_envelope_path(file: &Path) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".json").unwrap_or(&name);
    file.with_file_name(format!("{stem}.dsse.json"))
}

/// `cardproof sign`: [`sign_document`], the envelope written atomically to `out` (default
/// [`default_envelope_path`]), and what was signed read back from the envelope's payload.
pub fn sign_file(
    file: &Path,
    checkpoint: Option<&Path>,
    key: &SigningKey,
    out: Option<&Path>,
) -> Result<Signed> {
    let out = out.map_or_else(|| default_envelope_path(file), Path::to_owned);
    let envelope = sign_document(file, checkpoint, key)?;
    let text = serde_json::to_vec_pretty(&envelope)
        .map_err(|e| Error::internal(&out, format!("cannot encode: {e}")))?;
    crate::files::write_atomically(&out, &text)?;
    let parts = super::dsse::EnvelopeParts::from_value(&out, &envelope)?;
    let statement: super::Statement = serde_json::from_slice(&parts.payload)
        .map_err(|e| Error::internal(&out, format!("payload: {e}")))?;
    Ok(Signed {
        sha256: crate::checkpoint::hash::hash_file(&out)?,
        envelope: out,
        file: file.to_owned(),
        keyid: super::keyid(&key.verifying_key()),
        predicate_type: statement.predicate_type,
        subjects: statement.subject.len(),
    })
}
