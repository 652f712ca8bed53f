//! `card`: the document, and on stderr the writer's warnings and what was written.

use std::io;

use cardproof::output::CardDocument;

use super::{Printer, write_json};
use crate::commands::card::Written;

impl Printer {
    pub fn card_written(&self, c: &Written) -> io::Result<()> {
        if self.json() {
            // The document holds the warnings and what was written.
            return write_json(&CardDocument::new(&c.update, &c.measurement, &c.lint));
        }
        for w in &c.update.warnings {
            self.note(w);
        }
        if !c.lint.findings.is_empty() {
            self.human_findings(&c.update.card, &c.lint)?;
            let flags = filling_flags(&c.lint);
            if !flags.is_empty() {
                self.note(&format!(
                    "a measurement cannot know these; give them to `card`: {}",
                    flags.join(", ")
                ));
            }
        }
        self.note(&format!(
            "wrote {} (lint: {} errors, {} warnings)",
            c.update.path.display(),
            c.lint.errors(),
            c.lint.warnings()
        ));
        Ok(())
    }
}

/// The `card` flags that fill what the findings say is missing or wrong, by the field each
/// finding points at (what a local measurement cannot know: repositories, revisions, the
/// quantization method, the calibration data).
fn filling_flags(lint: &cardproof::lint::LintReport) -> Vec<&'static str> {
    const FLAGS: &[(&str, &str)] = &[
        ("/fidelity/reference/repo", "--reference-repo ORG/NAME"),
        ("/fidelity/reference/revision", "--reference-revision SHA"),
        ("/fidelity/candidate/repo", "--candidate-repo ORG/NAME"),
        ("/fidelity/candidate/revision", "--candidate-revision SHA"),
        ("/fidelity/quantization", "--quantization METHOD"),
        ("/fidelity/calibration", "--calibration DATASET (or none)"),
    ];
    let mut out = Vec::new();
    for (pointer, flag) in FLAGS {
        let hit = lint.findings.iter().any(|f| {
            f.severity == cardproof::findings::Severity::Error
                && f.pointer.as_deref().is_some_and(|p| p.starts_with(pointer))
        });
        if hit && !out.contains(flag) {
            out.push(*flag);
        }
    }
    out
}
