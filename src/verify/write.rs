//! The verification's files: report.json (the predicate), report.dsse.json (the in-toto
//! Statement, subjects = every checkpoint file, in a DSSE envelope signed with Ed25519), report.md
//! and report.html, beside measurement.json and positions.safetensors. They are one
//! [`OutputSet`]: written into its temporary directory, all carrying its run id, and moved into
//! `--out` together.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;

use super::VerifyOutcome;
use crate::attest;
use crate::error::{Error, Result};
use crate::measurement::positions_file;
use crate::outset::{OutputSet, with_run_id};
use crate::report::{self, RunRows};

/// Write every report file into `set`, with the set's run id in report.json (so in the signed
/// statement) and measurement.json, and move the set into place; returns the files' paths under
/// `--out`. `outcome.report` gets the run id too (it is what the caller prints).
pub fn write_outputs(
    set: OutputSet,
    outcome: &mut VerifyOutcome,
    key: &SigningKey,
) -> Result<Vec<PathBuf>> {
    outcome.report = with_run_id(&outcome.report, set.run_id());
    if let Some((m, doc)) = &outcome.measurement {
        set.write("positions.safetensors", &positions_file(m))?;
        set.write_json("measurement.json", doc)?;
    }
    set.write_json("report.json", &outcome.report)?;

    let statement = attest::statement(&attest::subjects(&outcome.manifest), outcome.report.clone());
    let payload = serde_json::to_vec(&statement).map_err(|e| {
        Error::malformed(set.out(), None, format!("cannot encode the statement: {e}"))
    })?;
    let envelope = attest::sign_envelope(&payload, attest::PAYLOAD_TYPE, key);
    let mut text = serde_json::to_vec_pretty(&envelope).map_err(|e| {
        Error::malformed(set.out(), None, format!("cannot encode the envelope: {e}"))
    })?;
    text.push(b'\n');
    set.write("report.dsse.json", &text)?;

    let rows: Vec<RunRows> = outcome
        .rows
        .iter()
        .map(|r| RunRows {
            context_length: r.context_length,
            position: r.position.clone(),
            kld: r.kld.clone(),
            flip: r.flip.clone(),
        })
        .collect();
    set.write(
        "report.md",
        report::render_markdown(&outcome.report)?.as_bytes(),
    )?;
    set.write(
        "report.html",
        report::render_html(&outcome.report, &rows)?.as_bytes(),
    )?;
    set.commit()
}

/// Predicate type of a signed measurement.json.
pub use crate::attest::MEASUREMENT_PREDICATE_TYPE;

/// `cardproof sign FILE`: a measurement.json or report.json as the predicate of an in-toto
/// statement whose subjects are the checkpoint's files (`checkpoint`, else the path the document
/// names), in a DSSE envelope signed with `key`.
pub fn sign_document(
    file: &Path,
    checkpoint: Option<&Path>,
    key: &SigningKey,
) -> Result<serde_json::Value> {
    use crate::checkpoint::hash::{HashOptions, hash_path};
    let text = std::fs::read_to_string(file).map_err(|e| Error::io(file, e))?;
    let doc: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::malformed(file, None, format!("not JSON: {e}")))?;
    let (predicate_type, named) = if doc.get("claims").is_some() && doc.get("verdict").is_some() {
        (attest::PREDICATE_TYPE, doc["checkpoint"]["path"].as_str())
    } else if doc.get("runs").is_some() && doc.get("protocol").is_some() {
        (
            MEASUREMENT_PREDICATE_TYPE,
            doc["candidate"]["path"].as_str(),
        )
    } else {
        return Err(Error::malformed(
            file,
            None,
            "not a cardproof measurement.json or report.json (no `runs`/`protocol` or `claims`/`verdict`)",
        ));
    };
    let dir = match (checkpoint, named) {
        (Some(c), _) => c.to_owned(),
        (None, Some(n)) if Path::new(n).exists() => PathBuf::from(n),
        _ => {
            return Err(Error::malformed(
                file,
                None,
                "the checkpoint it describes is not here; pass --checkpoint DIR (its files become the statement's subjects)",
            ));
        }
    };
    let manifest = hash_path(&dir, &HashOptions::default(), &|_| {})?;
    let mut statement = attest::statement(&attest::subjects(&manifest), doc);
    statement["predicateType"] = predicate_type.into();
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::malformed(file, None, format!("cannot encode the statement: {e}")))?;
    Ok(attest::sign_envelope(&payload, attest::PAYLOAD_TYPE, key))
}
