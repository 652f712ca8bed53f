//! The in-toto Statement v1 a report is: what it is about (subjects) and what it says (predicate).
//!
//! Subjects are the checkpoint's files, one each, named by their path relative to the checkpoint
//! (forward slashes, as in the manifest) with their SHA-256. One subject per file, rather than a
//! single root digest, lets any in-toto consumer match a single downloaded file against the report
//! by digest, which is how in-toto matches subjects.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{PREDICATE_TYPE, STATEMENT_TYPE};
use crate::checkpoint::hash::Manifest;
use crate::error::{Error, Result};

/// One statement subject: a file and its SHA-256 (lowercase hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subject {
    pub name: String,
    pub sha256: String,
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

/// An in-toto Statement v1, as cardproof writes it and reads it back once its signature
/// verified: the envelope typed, fields in the order the spec lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub statement_type: String,
    pub subject: Vec<ResourceDescriptor>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    /// What the statement says. Kept as JSON: its reader types it by `predicate_type`, and reads
    /// a verification report's card binding field by field, because a report from an older
    /// cardproof or a hostile signer gets a verdict per missing or malformed field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicate: Option<Value>,
    /// Fields the spec lets a producer add; kept, so the statement shown is the one signed.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

impl Statement {
    /// The predicate, or `null` when the statement has none.
    pub fn predicate(&self) -> &Value {
        self.predicate.as_ref().unwrap_or(&Value::Null)
    }

    /// The statement as JSON (for the documents that show it).
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A statement's subject: a file's name and its digests by algorithm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceDescriptor {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub digest: std::collections::BTreeMap<String, String>,
    /// Fields the spec allows beside them (`uri`, `annotations`, ...), kept.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

impl From<&Subject> for ResourceDescriptor {
    fn from(s: &Subject) -> ResourceDescriptor {
        ResourceDescriptor {
            name: Some(s.name.clone()),
            digest: [("sha256".to_owned(), s.sha256.clone())].into(),
            other: serde_json::Map::new(),
        }
    }
}

/// The statement `{"_type", "subject", "predicateType", "predicate"}` of a verification report.
pub fn statement(subjects: &[Subject], predicate: Value) -> Statement {
    statement_of(PREDICATE_TYPE, subjects, predicate)
}

/// [`statement`] with another predicate type (a measurement's, a study's, an artifact's).
pub fn statement_of(predicate_type: &str, subjects: &[Subject], predicate: Value) -> Statement {
    Statement {
        statement_type: STATEMENT_TYPE.to_owned(),
        subject: subjects.iter().map(ResourceDescriptor::from).collect(),
        predicate_type: predicate_type.to_owned(),
        predicate: Some(predicate),
        other: serde_json::Map::new(),
    }
}

/// Parse and check a verified payload as an in-toto Statement v1.
///
/// The checks are the spec's: a JSON object, `_type` exactly [`STATEMENT_TYPE`] (the URI carries
/// the major version), a non-empty `subject` array whose entries each have a `digest` object of
/// string values, a string `predicateType`, and `predicate` (when present) an object. Unknown
/// fields are allowed, as the spec requires of consumers. Any predicate type is accepted here: the
/// caller decides what it trusts a statement about.
pub fn parse_statement(file: &Path, payload: &[u8]) -> Result<Statement> {
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
        if subject.get("name").is_some_and(|n| !n.is_string()) {
            return Err(bad(&format!("subject[{i}].name"), "must be a string"));
        }
    }
    if !object.get("predicateType").is_some_and(Value::is_string) {
        return Err(bad("predicateType", "missing or not a string"));
    }
    if object.get("predicate").is_some_and(|p| !p.is_object()) {
        return Err(bad("predicate", "must be an object"));
    }
    serde_json::from_value(value).map_err(|e| {
        Error::format(
            file,
            Some("payload"),
            format!("does not read as an in-toto Statement v1: {e}"),
        )
    })
}
