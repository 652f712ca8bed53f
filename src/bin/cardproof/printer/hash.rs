//! `hash`: the manifest in `sha256sum` format on stdout and the root digest on stderr, or the
//! document.

use std::io::{self, Write};

use cardproof::checkpoint::hash::Manifest;
use cardproof::output::HashDocument;

use super::{Printer, write_json, write_stdout};

impl Printer {
    pub fn manifest(&self, manifest: &Manifest) -> io::Result<()> {
        if self.json() {
            return write_json(&HashDocument::new(manifest));
        }
        write_stdout(&manifest.text())?;
        let style = self.style();
        let mut err = io::stderr().lock();
        writeln!(
            err,
            "{} {}  ({} files, {} bytes; the SHA-256 of the manifest above)",
            style.bold("root sha256:"),
            manifest.root_sha256,
            manifest.files.len(),
            manifest.total_bytes()
        )?;
        if !manifest.excluded.is_empty() {
            writeln!(
                err,
                "{} {}",
                style.dim("excluded:"),
                manifest.excluded.join(", ")
            )?;
        }
        Ok(())
    }
}
