//! The verification's files: report.md and report.html beside measurement.json and
//! positions.safetensors, then report.json (the predicate) listing every one of those files with
//! its SHA-256 (`set_files`), then report.dsse.json (the in-toto Statement, subjects = every
//! checkpoint file, in a DSSE envelope signed with Ed25519). So the signature binds every file
//! of the set: a not_reproduced set whose report.md is rewritten to "REPRODUCED" no longer
//! verifies. They are one [`OutputSet`]: written into its temporary directory, all carrying its
//! run id, and moved into `--out` together.

use std::path::PathBuf;

use ed25519_dalek::SigningKey;

use super::{VerifyOutcome, view};
use crate::attest;
use crate::error::{Error, Result};
use crate::outset::OutputSet;
use crate::report::RunRows;
use crate::rerun::output::positions_file;

/// Write every report file into `set`, with the set's run id in report.json (so in the signed
/// statement) and measurement.json, and move the set into place; returns the files' paths under
/// `--out`. `outcome.report` gets the run id and the set's files too (it is what the caller
/// prints).
pub fn write_outputs(
    set: OutputSet,
    outcome: &mut VerifyOutcome,
    key: &SigningKey,
) -> Result<Vec<PathBuf>> {
    outcome.report.run_id = Some(set.run_id().to_owned());
    if let Some(rerun) = &outcome.rerun {
        set.write(
            "positions.safetensors",
            &positions_file(&rerun.runs, &rerun.measurement.protocol_sha256),
        )?;
        set.write_json("measurement.json", &rerun.measurement.to_value())?;
    }
    // The renderings show the report as it is before the digests of the set are added (they
    // cannot list their own digests).
    let rows: &[RunRows] = &outcome.rows;
    set.write(
        "report.md",
        view::render_markdown(&outcome.report)?.as_bytes(),
    )?;
    set.write(
        "report.html",
        view::render_html(&outcome.report, rows)?.as_bytes(),
    )?;
    outcome.report.set_files = set.set_files()?;
    let report = outcome.report.to_value();
    set.write_json("report.json", &report)?;

    let statement = attest::statement(&attest::subjects(&outcome.manifest), report);
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::internal(set.out(), format!("cannot encode the statement: {e}")))?;
    let envelope = attest::sign_envelope(&payload, attest::PAYLOAD_TYPE, key);
    let mut text = serde_json::to_vec_pretty(&envelope)
        .map_err(|e| Error::internal(set.out(), format!("cannot encode the envelope: {e}")))?;
    text.push(b'\n');
    set.write("report.dsse.json", &text)?;
    set.commit()
}
