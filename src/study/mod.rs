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
pub mod resume;
pub mod run;

use std::collections::BTreeMap;
use std::path::Path;

use crate::attest::Subject;
use crate::checkpoint::hash::Manifest;
use crate::error::{Error, Result};

/// The signed study's subjects, what its statement is about: the study file (`study:NAME`, its
/// bytes' SHA-256), every file of the reference (`reference:PATH`, relative to the checkpoint)
/// and of each arm's own candidate (`arm:ARM:PATH`; arms on the reference's weights have none).
/// The prefixes keep two checkpoints' files apart (arm names hold no `:`).
pub fn subjects(
    study_file: &str,
    study_sha256: &str,
    reference: &Manifest,
    arms: &[(&str, &Manifest)],
) -> Vec<Subject> {
    let mut subjects = vec![Subject {
        name: format!("study:{study_file}"),
        sha256: study_sha256.to_owned(),
    }];
    let files = |prefix: String, m: &Manifest| {
        m.files
            .iter()
            .map(move |f| Subject {
                name: format!("{prefix}{}", f.path),
                sha256: f.sha256.clone(),
            })
            .collect::<Vec<_>>()
    };
    subjects.extend(files("reference:".into(), reference));
    for (name, m) in arms {
        subjects.extend(files(format!("arm:{name}:"), m));
    }
    subjects
}

/// The study file's name as a subject names it.
fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// `verify-report --study FILE`: a signed study's subjects against the study file and the
/// checkpoints it names now, both ways ([`crate::attest::verify::compare_subjects_in`]).
pub fn check_subjects(
    statement: &crate::attest::Statement,
    study_file: &Path,
) -> Result<Vec<crate::attest::Mismatch>> {
    use crate::checkpoint::hash::{HashOptions, hash_path};
    let study = file::Study::read(study_file)?;
    let (reference, named) = plan::checkpoints(&study)?;
    let hash = |p: &Path| hash_path(p, &HashOptions::default(), &|_| {});
    let reference = hash(&reference)?;
    let mut arms = Vec::new();
    for (i, path) in &named {
        arms.push((study.file.arms[*i].name.as_str(), hash(path)?));
    }
    let arms: Vec<(&str, &Manifest)> = arms.iter().map(|(n, m)| (*n, m)).collect();
    let expected = subjects(&file_name(study_file), &study.sha256, &reference, &arms);
    let on_disk: BTreeMap<&str, &str> = expected
        .iter()
        .map(|s| (s.name.as_str(), s.sha256.as_str()))
        .collect();
    Ok(crate::attest::verify::compare_subjects_in(
        statement,
        on_disk,
        "the study file and its checkpoints",
    ))
}

/// Write study.md and study.html into the set (where [`run::run`] wrote the arms), then
/// study.json with `set_files` (every other file of the set and its SHA-256), then
/// study.dsse.json: the in-toto statement of predicate type
/// [`crate::attest::STUDY_PREDICATE_TYPE`] over study.json, its subjects [`subjects`]. So the
/// signature binds every file of the set; study.json is written last of the documents: it says
/// the study is complete.
pub fn write_documents(
    set: &crate::outset::OutputSet,
    study: &file::Study,
    plan: &plan::Plan,
    outcome: &mut run::StudyOutcome,
    key: &ed25519_dalek::SigningKey,
) -> Result<()> {
    use crate::attest;
    let dir = set.dir();
    let pretty = |v: &serde_json::Value| -> Result<Vec<u8>> {
        let mut text = serde_json::to_vec_pretty(v)
            .map_err(|e| Error::internal(dir, format!("cannot encode: {e}")))?;
        text.push(b'\n');
        Ok(text)
    };
    set.write("study.md", render::render(outcome, false)?.as_bytes())?;
    set.write("study.html", render::render(outcome, true)?.as_bytes())?;
    outcome.document.set_files = set.set_files()?;
    let document = outcome.document.to_value();
    set.write("study.json", &pretty(&document)?)?;
    let arms: Vec<(&str, &Manifest)> = plan
        .arms
        .iter()
        .filter(|a| a.named_candidate)
        .map(|a| (a.name.as_str(), a.manifest.as_ref()))
        .collect();
    let subjects = subjects(
        &file_name(&study.path),
        &study.sha256,
        &plan.reference_manifest,
        &arms,
    );
    let statement = attest::statement_of(attest::STUDY_PREDICATE_TYPE, &subjects, document);
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::internal(dir, format!("cannot encode the statement: {e}")))?;
    let envelope = attest::sign_envelope(&payload, attest::PAYLOAD_TYPE, key);
    set.write("study.dsse.json", &pretty(&envelope)?)
}
