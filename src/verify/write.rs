//! The verification's files: report.json (the predicate), report.dsse.json (the in-toto
//! Statement, subjects = every checkpoint file, in a DSSE envelope signed with Ed25519), report.md
//! and report.html, beside measurement.json and positions.safetensors. They are one
//! [`OutputSet`]: written into its temporary directory, all carrying its run id, and moved into
//! `--out` together.

use std::path::PathBuf;

use ed25519_dalek::SigningKey;

use super::VerifyOutcome;
use crate::attest;
use crate::error::{Error, Result};
use crate::outset::OutputSet;
use crate::report::{self, RunRows};
use crate::rerun::output::positions_file;

/// Write every report file into `set`, with the set's run id in report.json (so in the signed
/// statement) and measurement.json, and move the set into place; returns the files' paths under
/// `--out`. `outcome.report` gets the run id too (it is what the caller prints).
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
    let report = outcome.report.to_value();
    set.write_json("report.json", &report)?;

    let statement = attest::statement(&attest::subjects(&outcome.manifest), report.clone());
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::internal(set.out(), format!("cannot encode the statement: {e}")))?;
    let envelope = attest::sign_envelope(&payload, attest::PAYLOAD_TYPE, key);
    let mut text = serde_json::to_vec_pretty(&envelope)
        .map_err(|e| Error::internal(set.out(), format!("cannot encode the envelope: {e}")))?;
    text.push(b'\n');
    set.write("report.dsse.json", &text)?;

    let rows: &[RunRows] = &outcome.rows;
    set.write("report.md", report::render_markdown(&report)?.as_bytes())?;
    set.write(
        "report.html",
        report::render_html(&report, rows)?.as_bytes(),
    )?;
    set.commit()
}
