//! `cardproof verify-report`: every check of a signed report in one call: the key, the envelope's
//! signature and statement, the subjects against a checkpoint (a study's against its study file
//! and the checkpoints it names), the card's fidelity block, and the output set beside the
//! envelope.

use std::path::{Path, PathBuf};

use super::verify::{Mismatch, Outcome};
use crate::error::{Error, Result};

/// What to check: the envelope, the public key, and optionally the checkpoint and the card.
#[derive(Debug, Clone, Copy)]
pub struct ReportRequest<'a> {
    pub envelope: &'a Path,
    pub public_key: &'a Path,
    /// Compare every subject with the files in this directory.
    pub checkpoint: Option<&'a Path>,
    /// Compare the card's fidelity block with the one signed (default: the checkpoint's card, if
    /// the report signs one).
    pub card: Option<&'a Path>,
    /// A signed study: compare its subjects with this study file and the checkpoints it names.
    pub study: Option<&'a Path>,
}

/// What [`check_report`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedReport {
    pub envelope: PathBuf,
    /// The keyid of the public key checked against.
    pub keyid: String,
    /// Every reason the report does not verify; empty when it does.
    pub mismatches: Vec<Mismatch>,
    /// The checkpoint the subjects were compared with, when one was given.
    pub subjects_checked: Option<PathBuf>,
    /// The card whose fidelity block was compared, when one was.
    pub card_checked: Option<PathBuf>,
    /// The study file whose subjects (it, its reference's and arms' files) were compared.
    pub study_checked: Option<PathBuf>,
    /// The directory beside the envelope whose files were checked against the signed set;
    /// `None` when the envelope stands alone (nothing beside it is vouched for).
    pub set_checked: Option<PathBuf>,
    /// From the signed statement (absent when the signature does not verify).
    pub predicate_type: Option<String>,
    pub run_id: Option<String>,
    /// The report's verdict (a signed measurement has none).
    pub verdict: Option<String>,
}

impl CheckedReport {
    pub fn verified(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Check a signed report offline. A signature that does not verify is a mismatch, not an error;
/// errors are inputs that cannot be read.
pub fn check_report(request: &ReportRequest<'_>) -> Result<CheckedReport> {
    let key = super::read_verifying_key(request.public_key)?;
    let mut mismatches = Vec::new();
    let mut statement: Option<super::Statement> = None;
    let mut card_checked = None;
    let mut set_checked = None;
    match super::verify_envelope(request.envelope, &key)? {
        Outcome::Verified(v) => {
            let is_study = v.statement.predicate_type == super::STUDY_PREDICATE_TYPE;
            if is_study && request.checkpoint.is_some() {
                return Err(Error::usage(
                    request.envelope,
                    format!(
                        "is a signed study (predicate type {}), not a verification report: its subjects are the study file and the files of the reference and of each arm's candidate, so there is no one checkpoint to compare; check them with --study STUDY_FILE",
                        super::STUDY_PREDICATE_TYPE
                    ),
                ));
            }
            if let Some(file) = request.study {
                if !is_study {
                    return Err(Error::usage(
                        request.envelope,
                        format!(
                            "is not a signed study (its predicate type is {}); --study checks a study's study.dsse.json, --checkpoint a report's checkpoint",
                            v.statement.predicate_type
                        ),
                    ));
                }
                mismatches.extend(crate::study::check_subjects(&v.statement, file)?);
            }
            if let Some(dir) = request.checkpoint {
                mismatches.extend(super::check_subjects(&v.statement, dir)?);
            }
            if let Some((path, m)) =
                super::check_card(&v.statement, request.card, request.checkpoint)?
            {
                mismatches.extend(m);
                card_checked = Some(path);
            }
            let set = crate::attest::set::check_set(request.envelope, &v.statement)?;
            mismatches.extend(set.mismatches);
            set_checked = set.checked;
            statement = Some(v.statement);
        }
        Outcome::Failed(m) => mismatches.extend(m),
    }
    let predicate = statement.as_ref().map(super::Statement::predicate);
    let text = |field: &str| predicate.and_then(|p| p[field].as_str().map(str::to_owned));
    Ok(CheckedReport {
        envelope: request.envelope.to_owned(),
        keyid: super::keyid(&key),
        mismatches,
        subjects_checked: request.checkpoint.map(Path::to_owned),
        card_checked,
        study_checked: request.study.map(Path::to_owned),
        set_checked,
        predicate_type: statement.as_ref().map(|s| s.predicate_type.clone()),
        run_id: text("run_id"),
        verdict: text("verdict"),
    })
}
