//! `hash`: the manifest in `sha256sum` format on stdout (paths as the user can open them from
//! where they stand, so `sha256sum -c` checks it there) and the root digest on stderr, or the
//! document.

use std::io::{self, Write};

use cardproof::checkpoint::hash::manifest_text;
use cardproof::output::HashDocument;

use super::{Printer, write_json, write_stdout};
use crate::commands::hash::Hashed;

impl Printer {
    pub fn manifest(&self, hashed: &Hashed) -> io::Result<()> {
        let manifest = &hashed.manifest;
        if self.json() {
            return write_json(&HashDocument::new(manifest));
        }
        let base = hashed.base.to_string_lossy().replace('\\', "/");
        let prefix = if base.is_empty() {
            String::new()
        } else {
            format!("{}/", base.trim_end_matches('/'))
        };
        let mut shown = manifest.files.clone();
        for f in &mut shown {
            f.path = format!("{prefix}{}", f.path);
        }
        write_stdout(&manifest_text(&shown))?;
        let style = self.style();
        let mut err = io::stderr().lock();
        let of = if prefix.is_empty() {
            "the SHA-256 of the manifest above".to_owned()
        } else {
            format!(
                "the SHA-256 of the manifest with paths relative to {base}, as `cardproof hash .` \
                 prints it there"
            )
        };
        writeln!(
            err,
            "{} {}  ({} files, {} bytes; {of})",
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
