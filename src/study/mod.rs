//! `cardproof study` (issue #20): the seed study's comparison as one reproducible, signed run.
//! One reference, one eval text, one protocol, and arms that each change one variable
//! (weights, KV cache, kernel, recurrent state, emulation): [`file`] reads and checks the study
//! file, [`plan`] turns its arms into rerun requests and checks each changes what it says,
//! [`crate::rerun::study`] runs them against one reference pass, [`compare`] pairs them on the
//! same rows, and [`document`] and [`render`] write study.json, study.md and study.html.

pub mod compare;
pub mod document;
pub mod file;
pub mod plan;
pub mod render;
pub mod run;

use std::path::Path;

use crate::error::{Error, Result};

/// Write study.json, study.md, study.html and study.dsse.json into `dir` (the output set's
/// directory, where [`run::run`] wrote the arms): the statement's subjects are the study file,
/// the reference's root digest and each arm's checkpoint's, the predicate study.json. study.json
/// is written last of the documents: it says the study is complete.
pub fn write_documents(
    dir: &Path,
    outcome: &run::StudyOutcome,
    key: &ed25519_dalek::SigningKey,
) -> Result<()> {
    use crate::attest::{self, Subject};
    let document = outcome.document.to_value();
    let mut subjects = vec![
        Subject {
            name: format!("study:{}", outcome.document.study_file.path),
            sha256: outcome.document.study_file.sha256.clone(),
        },
        Subject {
            name: format!("reference:{}", outcome.document.reference.path),
            sha256: outcome.document.reference.manifest_sha256.clone(),
        },
    ];
    for arm in &outcome.document.arms {
        subjects.push(Subject {
            name: format!("arm:{}:{}", arm.name, arm.candidate),
            sha256: arm.manifest_sha256.clone(),
        });
    }
    let statement = attest::statement(&subjects, document.clone());
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::internal(dir, format!("cannot encode the statement: {e}")))?;
    let envelope = attest::sign_envelope(&payload, attest::PAYLOAD_TYPE, key);
    let pretty = |v: &serde_json::Value| -> Result<Vec<u8>> {
        let mut text = serde_json::to_vec_pretty(v)
            .map_err(|e| Error::internal(dir, format!("cannot encode: {e}")))?;
        text.push(b'\n');
        Ok(text)
    };
    let write = |name: &str, bytes: &[u8]| crate::files::write_atomically(&dir.join(name), bytes);
    write("study.dsse.json", &pretty(&envelope)?)?;
    write("study.md", render::render(outcome, false)?.as_bytes())?;
    write("study.html", render::render(outcome, true)?.as_bytes())?;
    write("study.json", &pretty(&document)?)
}
