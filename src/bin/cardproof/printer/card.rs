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
