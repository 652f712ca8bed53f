//! A signed set checked beside its envelope: the files an in-toto statement binds
//! (`set_files`) against what lies beside the envelope. The set itself is written by
//! [`crate::outset`]; this module only reads it.

use std::fs;
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use crate::attest::Mismatch;
use crate::attest::verify::what;
use crate::error::{Error, Result};
use crate::outset::{MARKER, MAX_SET_ENTRIES, SetFile, read_document};

/// What [`check_set`] found.
#[derive(Debug, Clone, Default)]
pub struct SetCheck {
    /// The directory whose files were checked against the signed statement; `None` when the
    /// envelope stands alone (no file of its set beside it), so nothing beside it is vouched for.
    pub checked: Option<PathBuf>,
    /// Every file beside the envelope that is not the signed set's, or changed ([`what::SET`]).
    pub mismatches: Vec<Mismatch>,
}

/// Check the files beside a verified envelope against what its statement signed. The
/// statement's predicate is the set's own document (`report.json` beside `report.dsse.json`,
/// `study.json`, `measurement.json`), and its `set_files` binds every other file of the set by
/// SHA-256 (report.md and report.html, positions, the arms' measurements). When the envelope
/// sits in its set (its document, its marker or a file it binds is beside it): the document
/// must be the predicate; every bound file must be there, a regular file, with its digest; and
/// every other file beside it (recursively) is a mismatch, but other envelopes (`sign`'s, each
/// checked on its own) and the marker. A statement that binds no files (from an older
/// cardproof, or a document signed outside a set) vouches for nothing beside it, so any other
/// file there is a mismatch too. The unsigned marker is only asked which run it names. Nothing
/// beside the envelope: nothing checked ([`SetCheck::checked`] is `None`). Unreadable files are
/// errors.
pub fn check_set(envelope: &Path, statement: &super::Statement) -> Result<SetCheck> {
    let dir = match envelope.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let predicate = statement.predicate();
    let run_id = predicate.get("run_id").and_then(Value::as_str);
    let run = |id: Option<&str>| id.map_or_else(|| "no run id".to_owned(), |i| format!("run {i}"));
    let predicate_type = statement.predicate_type.as_str();
    let what_document = match predicate_type {
        crate::attest::PREDICATE_TYPE => "report",
        crate::attest::MEASUREMENT_PREDICATE_TYPE => "measurement",
        crate::attest::STUDY_PREDICATE_TYPE => "study",
        _ => return Ok(SetCheck::default()),
    };
    let envelope_name = envelope
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let own_name = match envelope_name.strip_suffix(".dsse.json") {
        Some(stem) => format!("{stem}.json"),
        None => format!("{what_document}.json"),
    };
    let mut mismatches = Vec::new();
    let mut set = |detail: String| mismatches.push(Mismatch::new(what::SET, detail));
    let signed: Option<Vec<SetFile>> = predicate.get("set_files").map(|v| {
        serde_json::from_value(v.clone()).unwrap_or_else(|e| {
            set(format!(
                "the signed `set_files` is not a list of {{path, sha256}} ({e}): no file beside the envelope can be vouched for"
            ));
            Vec::new()
        })
    });
    let exists = |rel: &str| plain(rel) && fs::symlink_metadata(dir.join(rel)).is_ok();
    let in_set =
        exists(MARKER) || exists(&own_name) || signed.iter().flatten().any(|f| exists(&f.path));
    if !in_set {
        return Ok(SetCheck {
            checked: None,
            mismatches,
        });
    }
    // A member of the set written by another run than the envelope's.
    let other_run = |path: &Path, doc: &Value| -> Option<String> {
        let theirs = doc.get("run_id").and_then(Value::as_str);
        (theirs != run_id).then(|| {
            format!(
                "{} is from {}, the envelope from {}: the set mixes two runs",
                path.display(),
                run(theirs),
                run(run_id)
            )
        })
    };

    // The signed document: the predicate itself (`sign` adds `set_files` to the predicate of a
    // document that has none).
    let own = dir.join(&own_name);
    match read_document(&own, &mut set)? {
        Some(doc) => {
            let mut expected = predicate.clone();
            if doc.get("set_files").is_none()
                && let Some(o) = expected.as_object_mut()
            {
                o.remove("set_files");
            }
            if doc != expected {
                set(other_run(&own, &doc).unwrap_or_else(|| {
                    format!(
                        "{} is not the signed {what_document}: it was changed after signing",
                        own.display()
                    )
                }));
            }
        }
        None if !exists(&own_name) => set(format!(
            "{} is missing: it is the signed {what_document} of this set",
            own.display()
        )),
        None => {}
    }
    let marker_path = dir.join(MARKER);
    if let Some(marker) = read_document(&marker_path, &mut set)? {
        if let Some(other) = other_run(&marker_path, &marker) {
            set(other);
        }
        if marker["complete"] != true {
            set(format!(
                "the set's marker {} says the run never completed",
                marker_path.display()
            ));
        }
    }

    let signer = run(run_id);
    let bound = check_bound(dir, signed.iter().flatten(), &signer, &mut set)?;
    let (beside, cut) = entries_below(dir, MAX_SET_ENTRIES).map_err(|e| Error::io(dir, e))?;
    if cut {
        set(format!(
            "{} holds more than {MAX_SET_ENTRIES} entries: not a report set",
            dir.display()
        ));
    }
    for rel in beside {
        let ignored = rel == envelope_name
            || rel == MARKER
            || rel == own_name
            || bound.contains(rel.as_str())
            || (!rel.contains('/') && rel.ends_with(".dsse.json"));
        if ignored {
            continue;
        }
        let path = dir.join(&rel);
        set(if signed.is_some() {
            format!(
                "{} is not a file of the set the statement of {signer} signed: added after signing, or another run's",
                path.display()
            )
        } else {
            format!(
                "{} is beside the envelope, but the statement binds no file of its set (signed by an older cardproof, or outside its set), so nothing vouches for it: rerun, or sign the document in its set",
                path.display()
            )
        });
    }
    Ok(SetCheck {
        checked: Some(dir.to_owned()),
        mismatches,
    })
}

/// Each file the statement binds (`set_files`) must be beside the envelope, a regular file,
/// with its signed digest; each failure is reported through `set`. Returns the bound paths.
fn check_bound<'a>(
    dir: &Path,
    signed: impl Iterator<Item = &'a SetFile>,
    signer: &str,
    set: &mut impl FnMut(String),
) -> Result<std::collections::BTreeSet<&'a str>> {
    let mut bound = std::collections::BTreeSet::new();
    for f in signed {
        if !plain(&f.path) {
            set(format!(
                "the statement binds `{}`, which is not a path inside the set",
                f.path
            ));
            continue;
        }
        bound.insert(f.path.as_str());
        let path = dir.join(&f.path);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => set(format!(
                "{} is missing: the statement of {signer} signed it",
                path.display()
            )),
            Err(e) => return Err(Error::io(&path, e)),
            Ok(m) if !m.is_file() => set(format!(
                "{} is {}, not the file the statement signed",
                path.display(),
                crate::files::kind_name(&m)
            )),
            Ok(_) => {
                let actual = crate::checkpoint::hash::hash_file(&path)?;
                if !actual.eq_ignore_ascii_case(&f.sha256) {
                    set(format!(
                        "{} changed after signing (sha256 {} signed, {actual} now): edited, or another run's",
                        path.display(),
                        f.sha256
                    ));
                }
            }
        }
    }
    Ok(bound)
}

/// A relative path with only plain components (no `..`, no root).
fn plain(rel: &str) -> bool {
    !rel.is_empty()
        && Path::new(rel)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Every entry under `dir` that is not a directory (files, links, special files), relative
/// with forward slashes, sorted; links are not followed. At most `limit` entries are read
/// (`true`: there were more).
fn entries_below(dir: &Path, limit: usize) -> std::io::Result<(Vec<String>, bool)> {
    fn go(
        dir: &Path,
        prefix: &str,
        out: &mut Vec<String>,
        seen: &mut usize,
        limit: usize,
    ) -> std::io::Result<bool> {
        for entry in fs::read_dir(dir)? {
            *seen += 1;
            if *seen > limit {
                return Ok(true);
            }
            let entry = entry?;
            let rel = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.file_type()?.is_dir() {
                if go(&entry.path(), &format!("{rel}/"), out, seen, limit)? {
                    return Ok(true);
                }
            } else {
                out.push(rel);
            }
        }
        Ok(false)
    }
    let mut out = Vec::new();
    let cut = go(dir, "", &mut out, &mut 0, limit)?;
    out.sort();
    Ok((out, cut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A statement binding `report.md`, and what lies beside its envelope.
    fn bound(dir: &Path, set_files: Option<Value>) -> (PathBuf, crate::attest::Statement) {
        let mut predicate = json!({"run_id": "r1", "verdict": "not_reproduced"});
        if let Some(f) = set_files {
            predicate["set_files"] = f;
        }
        let statement = crate::attest::statement(&[], predicate);
        let envelope = dir.join("report.dsse.json");
        fs::write(&envelope, b"{}").unwrap();
        (envelope, statement)
    }

    #[test]
    fn the_files_beside_an_envelope_are_checked_against_the_signed_list() {
        let dir = tempfile::tempdir().unwrap();
        let md = dir.path().join("report.md");
        fs::write(&md, b"# not reproduced").unwrap();
        let sha = crate::checkpoint::hash::hash_file(&md).unwrap();
        let listed = json!([{"path": "report.md", "sha256": sha}]);
        let (envelope, statement) = bound(dir.path(), Some(listed.clone()));
        fs::write(
            dir.path().join("report.json"),
            statement.predicate().to_string(),
        )
        .unwrap();
        let ok = check_set(&envelope, &statement).unwrap();
        assert_eq!(ok.checked.as_deref(), Some(dir.path()));
        assert!(ok.mismatches.is_empty(), "{:?}", ok.mismatches);
        // Other envelopes and the marker may be there; anything else may not.
        fs::write(dir.path().join("measurement.dsse.json"), b"{}").unwrap();
        assert!(
            check_set(&envelope, &statement)
                .unwrap()
                .mismatches
                .is_empty()
        );
        fs::create_dir(dir.path().join("extra")).unwrap();
        fs::write(dir.path().join("extra/summary.md"), b"REPRODUCED").unwrap();
        let m = check_set(&envelope, &statement).unwrap().mismatches;
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(
            m[0].detail
                .contains("extra/summary.md is not a file of the set"),
            "{m:?}"
        );
        fs::remove_dir_all(dir.path().join("extra")).unwrap();
        fs::write(&md, b"# REPRODUCED").unwrap();
        let m = check_set(&envelope, &statement).unwrap().mismatches;
        assert!(
            m[0].detail.contains("report.md changed after signing"),
            "{m:?}"
        );
        // A statement that binds no files vouches for nothing beside it.
        let (envelope, legacy) = bound(dir.path(), None);
        fs::write(
            dir.path().join("report.json"),
            legacy.predicate().to_string(),
        )
        .unwrap();
        let m = check_set(&envelope, &legacy).unwrap().mismatches;
        assert!(
            m.iter().any(|m| m
                .detail
                .contains("report.md is beside the envelope, but the statement binds no file")),
            "{m:?}"
        );
        // An envelope alone: nothing of its set beside it, nothing checked.
        let alone = tempfile::tempdir().unwrap();
        fs::write(alone.path().join("notes.txt"), b"unrelated").unwrap();
        let (envelope, statement) = bound(alone.path(), Some(listed));
        let check = check_set(&envelope, &statement).unwrap();
        assert_eq!(check.checked, None);
        assert!(check.mismatches.is_empty());
    }
}
