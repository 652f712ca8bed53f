//! Rule selection: the finding codes a user chose not to see (`lint --ignore CODE`, or a
//! `.cardproof.yaml` in the working directory: `lint: {ignore: [CODE, ...]}`).
//!
//! The selection is the user's, never the card's: the settings file is read from the working
//! directory or `--config FILE`, never from the directory being linted (a repository could
//! otherwise ship a file that silences every rule about its own card).

use std::collections::BTreeSet;
use std::path::Path;

use crate::error::{Error, Result};
use crate::findings::Code;

use super::LintReport;

/// The settings file `lint` reads from the working directory when no `--config` is given.
pub const SETTINGS_FILE: &str = ".cardproof.yaml";
/// A settings file is a few lines.
const MAX_SETTINGS_BYTES: u64 = 64 * 1024;

/// The codes to leave out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub ignore: BTreeSet<Code>,
}

impl Selection {
    /// `codes` as given on the command line (`--ignore`), each a known code.
    pub fn from_codes(codes: &[String], flag: &Path) -> Result<Selection> {
        let mut ignore = BTreeSet::new();
        for c in codes {
            ignore.insert(code(c).map_err(|why| Error::usage(flag, why))?);
        }
        Ok(Selection { ignore })
    }

    /// A settings file's `lint.ignore` list (other top-level keys are for other commands and
    /// left alone; an unknown key under `lint` or an unknown code is an error naming it).
    pub fn read(path: &Path) -> Result<Selection> {
        let bytes = crate::files::read_capped(path, MAX_SETTINGS_BYTES, "a settings file")?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| Error::format(path, None, "a settings file must be UTF-8"))?;
        let node = crate::card::yaml::parse(text, 0, crate::card::yaml::Budget::default())
            .map_err(|e| crate::card::yaml_file_error(e, text, path))?;
        let value = node.map(|n| n.to_json()).unwrap_or_default();
        let Some(lint) = value.get("lint") else {
            return Ok(Selection::default());
        };
        let lint = lint
            .as_object()
            .ok_or_else(|| Error::format(path, Some("lint"), "must be a mapping"))?;
        if let Some(key) = lint.keys().find(|k| *k != "ignore") {
            return Err(Error::format(
                path,
                Some(&format!("lint.{key}")),
                "is not a lint setting (known: ignore)",
            ));
        }
        let mut ignore = BTreeSet::new();
        for (i, c) in lint
            .get("ignore")
            .map(|v| v.as_array().cloned().unwrap_or_else(|| vec![v.clone()]))
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let text = c.as_str().unwrap_or_default();
            ignore.insert(
                code(text)
                    .map_err(|why| Error::format(path, Some(&format!("lint.ignore[{i}]")), why))?,
            );
        }
        Ok(Selection { ignore })
    }

    /// The selection of both: a code ignored in either is ignored.
    pub fn and(mut self, other: Selection) -> Selection {
        self.ignore.extend(other.ignore);
        self
    }

    /// `report` without the ignored codes' findings; returns how many were left out.
    pub fn apply(&self, report: &mut LintReport) -> usize {
        let before = report.findings.len();
        report.findings.retain(|f| !self.ignore.contains(&f.code));
        before - report.findings.len()
    }
}

fn code(text: &str) -> std::result::Result<Code, String> {
    Code::ALL
        .iter()
        .copied()
        .find(|c| c.as_str() == text)
        .ok_or_else(|| {
            format!(
                "`{text}` is not a finding code (known: {})",
                Code::ALL.map(Code::as_str).join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_checked_and_the_settings_file_read() {
        let s = Selection::from_codes(&["yaml11-ambiguous".into()], Path::new("--ignore")).unwrap();
        assert!(s.ignore.contains(&Code::Yaml11Ambiguous));
        let e = Selection::from_codes(&["nope".into()], Path::new("--ignore")).unwrap_err();
        assert!(
            e.to_string().contains("`nope` is not a finding code"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SETTINGS_FILE);
        std::fs::write(
            &path,
            "lint:\n  ignore: [yaml11-ambiguous, candidate-unpinned]\nother: 1\n",
        )
        .unwrap();
        let s = Selection::read(&path).unwrap();
        assert_eq!(s.ignore.len(), 2);
        std::fs::write(&path, "lint:\n  ignore: [typo-code]\n").unwrap();
        let e = Selection::read(&path).unwrap_err().to_string();
        assert!(
            e.contains("lint.ignore[0]") && e.contains("typo-code"),
            "{e}"
        );
        std::fs::write(&path, "lint:\n  ignore: [a, b\n").unwrap();
        let e = Selection::read(&path).unwrap_err();
        assert_eq!(e.at.map(|a| (a.line, a.column)), Some((2, 11)), "{e}");
        assert!(
            e.to_string()
                .contains("YAML syntax error: unclosed bracket"),
            "{e}"
        );
        std::fs::write(&path, "lint:\n  select: [x]\n").unwrap();
        assert!(
            Selection::read(&path)
                .unwrap_err()
                .to_string()
                .contains("lint.select")
        );
    }
}
