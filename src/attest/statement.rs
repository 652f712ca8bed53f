//! The in-toto Statement v1 a report is: what it is about (subjects) and what it says (predicate).
//!
//! Subjects are the checkpoint's files, one each, named by their path relative to the checkpoint
//! (forward slashes, as in the manifest) with their SHA-256. One subject per file, rather than a
//! single root digest, lets any in-toto consumer match a single downloaded file against the report
//! by digest, which is how in-toto matches subjects.

use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use super::{PREDICATE_TYPE, STATEMENT_TYPE};
use crate::checkpoint::hash::Manifest;
use crate::error::{Error, Result};

/// One statement subject: a file and its SHA-256 (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subject {
    pub name: String,
    pub sha256: String,
}

impl Subject {
    /// The in-toto ResourceDescriptor: `{"name": …, "digest": {"sha256": …}}`.
    pub fn to_json(&self) -> Value {
        json!({ "name": self.name, "digest": { "sha256": self.sha256 } })
    }
}

/// One subject per manifest file, in manifest order (sorted by path), so that equal checkpoints
/// give byte-identical statements.
pub fn subjects(manifest: &Manifest) -> Vec<Subject> {
    manifest
        .files
        .iter()
        .map(|f| Subject {
            name: f.path.clone(),
            sha256: f.sha256.clone(),
        })
        .collect()
}

/// The statement `{"_type", "subject", "predicateType", "predicate"}` of a verification report,
/// fields in the order the in-toto spec lists them (serde_json keeps insertion order here).
pub fn statement(subjects: &[Subject], predicate: Value) -> Value {
    statement_of(PREDICATE_TYPE, subjects, predicate)
}

/// [`statement`] with another predicate type (a measurement's, a study's).
pub fn statement_of(predicate_type: &str, subjects: &[Subject], predicate: Value) -> Value {
    json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects.iter().map(Subject::to_json).collect::<Vec<_>>(),
        "predicateType": predicate_type,
        "predicate": predicate,
    })
}

/// Parse and check a verified payload as an in-toto Statement v1.
///
/// The checks are the spec's: a JSON object, `_type` exactly [`STATEMENT_TYPE`] (the URI carries
/// the major version), a non-empty `subject` array whose entries each have a `digest` object of
/// string values, a string `predicateType`, and `predicate` (when present) an object. Unknown
/// fields are allowed, as the spec requires of consumers. Any predicate type is accepted here: the
/// caller decides what it trusts a statement about.
pub fn parse_statement(file: &Path, payload: &[u8]) -> Result<Value> {
    let value: Value = serde_json::from_slice(payload).map_err(|e| {
        Error::format(
            file,
            Some("payload"),
            format!("not JSON, so not an in-toto statement: {e}"),
        )
    })?;
    let bad = |field: &str, rule: &str| {
        Error::format(
            file,
            Some(&format!("payload.{field}")),
            format!("{rule} (not an in-toto Statement v1)"),
        )
    };
    let object = value.as_object().ok_or_else(|| {
        Error::format(
            file,
            Some("payload"),
            "not a JSON object, so not an in-toto statement",
        )
    })?;
    match object.get("_type").and_then(Value::as_str) {
        Some(STATEMENT_TYPE) => {}
        Some(other) => {
            return Err(bad(
                "_type",
                &format!("is `{other}`, expected `{STATEMENT_TYPE}`"),
            ));
        }
        None => return Err(bad("_type", "missing or not a string")),
    }
    let subjects = object
        .get("subject")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("subject", "missing or not an array"))?;
    if subjects.is_empty() {
        return Err(bad(
            "subject",
            "is empty; a statement must be about something",
        ));
    }
    for (i, subject) in subjects.iter().enumerate() {
        let digest = subject
            .get("digest")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(&format!("subject[{i}].digest"), "missing or not an object"))?;
        if let Some((alg, _)) = digest.iter().find(|(_, v)| !v.is_string()) {
            return Err(bad(
                &format!("subject[{i}].digest.{alg}"),
                "must be a hex string",
            ));
        }
    }
    if !object.get("predicateType").is_some_and(Value::is_string) {
        return Err(bad("predicateType", "missing or not a string"));
    }
    if object.get("predicate").is_some_and(|p| !p.is_object()) {
        return Err(bad("predicate", "must be an object"));
    }
    Ok(value)
}
