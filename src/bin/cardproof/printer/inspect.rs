//! `inspect`: what a checkpoint really holds, as a document or a summary with tables.

use std::io;

use cardproof::checkpoint::inspect::Inspection;
use cardproof::output::InspectDocument;

use super::{Printer, write_json, write_stdout};

impl Printer {
    pub fn inspection(&self, inspections: &[Inspection], list_modules: bool) -> io::Result<()> {
        if self.json() {
            // One shape whatever the input: a single file or checkpoint is a one-element list.
            return write_json(&InspectDocument::new(inspections));
        }
        write_stdout(&cardproof::output::text::inspections(
            inspections,
            list_modules,
            &self.style(),
        ))
    }
}
