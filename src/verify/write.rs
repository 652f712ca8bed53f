//! The verification's files: report.json (the predicate), report.dsse.json (the in-toto
//! Statement, subjects = every checkpoint file, in a DSSE envelope signed with Ed25519), report.md
//! and report.html, beside measurement.json and positions.safetensors. Each file is written whole
//! and renamed into place.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;

use super::VerifyOutcome;
use crate::attest;
use crate::error::{Error, Result};
use crate::measurement::{write_atomically, write_measurement};
use crate::report::{self, RunRows};

/// Write every report file into `out`; returns their paths.
pub fn write_outputs(
    out: &Path,
    outcome: &VerifyOutcome,
    key: &SigningKey,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut written = Vec::new();
    if let Some((m, doc)) = &outcome.measurement {
        write_measurement(out, m, doc)?;
        written.push(out.join("measurement.json"));
        written.push(out.join("positions.safetensors"));
    }
    let encode = |v: &serde_json::Value, path: &Path| -> Result<Vec<u8>> {
        serde_json::to_vec_pretty(v)
            .map(|mut b| {
                b.push(b'\n');
                b
            })
            .map_err(|e| Error::malformed(path, None, format!("cannot encode: {e}")))
    };
    let report_path = out.join("report.json");
    write_atomically(&report_path, &encode(&outcome.report, &report_path)?)?;
    written.push(report_path);

    let statement = attest::statement(&attest::subjects(&outcome.manifest), outcome.report.clone());
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::malformed(out, None, format!("cannot encode the statement: {e}")))?;
    let envelope = attest::sign_envelope(&payload, attest::PAYLOAD_TYPE, key);
    let envelope_path = out.join("report.dsse.json");
    write_atomically(&envelope_path, &encode(&envelope, &envelope_path)?)?;
    written.push(envelope_path);

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
    let md = out.join("report.md");
    write_atomically(&md, report::render_markdown(&outcome.report)?.as_bytes())?;
    written.push(md);
    let html = out.join("report.html");
    write_atomically(
        &html,
        report::render_html(&outcome.report, &rows)?.as_bytes(),
    )?;
    written.push(html);
    Ok(written)
}

/// Predicate type of a signed measurement.json.
pub const MEASUREMENT_PREDICATE_TYPE: &str = "https://cardproof.dev/measurement/v1";

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
