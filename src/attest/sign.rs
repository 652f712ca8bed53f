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
    let manifest = hash_path(&dir, &HashOptions::default(), &|_| {})?;
    let mut statement = super::statement(&super::subjects(&manifest), doc);
    statement["predicateType"] = predicate_type.into();
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::internal(file, format!("cannot encode the statement: {e}")))?;
    Ok(super::sign_envelope(&payload, super::PAYLOAD_TYPE, key))
}
