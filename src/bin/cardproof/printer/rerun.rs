//! The output of the rerun commands (`measure`, `measure --sweep`, `verify`, `reference export`):
//! the typed document (`--json`) or its text, then on stderr what was written.

use std::io::{self, Write};

use super::{Printer, write_json, write_stdout};
use crate::commands::rerun::{Measured, Verified};

impl Printer {
    /// `measure`: the measurement or the sweep, and the files written under `out`.
    pub fn measured(&self, m: &Measured, out: &std::path::Path) -> io::Result<()> {
        let written = match m {
            Measured::Measurement(m) => {
                if self.json() {
                    write_json(m.as_ref())?;
                } else {
                    write_stdout(&cardproof::output::text::measurement(m))?;
                }
                format!(
                    "{} and {}",
                    out.join("measurement.json").display(),
                    out.join("positions.safetensors").display()
                )
            }
            Measured::Sweep(s) => {
                if self.json() {
                    write_json(s)?;
                } else {
                    write_stdout(&cardproof::output::text::sweep(s))?;
                }
                out.join("sweep.json").display().to_string()
            }
        };
        writeln!(io::stderr().lock(), "wrote {written}")
    }

    /// `study`: study.json (`--json`) or the arms' table, then the files.
    pub fn studied(&self, s: &crate::commands::rerun::Studied) -> io::Result<()> {
        if self.json() {
            write_json(&s.document)?;
        } else {
            write_stdout(&cardproof::output::text::study(&s.document))?;
        }
        let mut err = io::stderr().lock();
        for path in s.written.iter().filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("study"))
        }) {
            writeln!(err, "wrote {}", path.display())?;
        }
        Ok(())
    }

    /// `verify`: the report document (`--json`) or a verdict table, then the files; for a card
    /// listing many files, each file's table and a summary (`--json`: the summary document).
    pub fn verification(&self, v: &Verified) -> io::Result<()> {
        if v.listed {
            return self.file_verifications(v);
        }
        let Some(one) = v.files.first() else {
            return Ok(());
        };
        if self.json() {
            write_json(&one.report)?;
        } else {
            write_stdout(&cardproof::output::text::verification(&one.report))?;
        }
        let mut err = io::stderr().lock();
        for path in &one.written {
            writeln!(err, "wrote {}", path.display())?;
        }
        Ok(())
    }

    fn file_verifications(&self, v: &Verified) -> io::Result<()> {
        let summary = cardproof::verify::FilesSummary::of(v.files.iter().map(|f| {
            (
                f.file.clone().unwrap_or_default(),
                &f.report,
                v.out.join(f.file.as_deref().unwrap_or_default()),
            )
        }));
        if self.json() {
            return write_json(&summary);
        }
        let mut text = String::new();
        for f in &v.files {
            text.push_str(&format!(
                "== {} ==\n",
                f.file.as_deref().unwrap_or_default()
            ));
            text.push_str(&cardproof::output::text::verification(&f.report));
            text.push('\n');
        }
        text.push_str(&cardproof::output::text::files_summary(&summary));
        write_stdout(&text)?;
        let mut err = io::stderr().lock();
        for f in &v.files {
            writeln!(
                err,
                "wrote {} files in {}",
                f.written.len(),
                v.out.join(f.file.as_deref().unwrap_or_default()).display()
            )?;
        }
        Ok(())
    }

    /// `reference export`: the document (`--json`), and on stderr what was written.
    pub fn exported(&self, e: &cardproof::rerun::export::Exported) -> io::Result<()> {
        if self.json() {
            return write_json(e);
        }
        for w in &e.warnings {
            self.warning(&w.to_string());
        }
        self.note(&e.note);
        if let (Some(envelope), Some(keyid)) = (&e.envelope, &e.signed_by) {
            self.note(&format!(
                "signed {envelope} with keyid {keyid}: others use the artifact with --artifact-pub and your public key"
            ));
        }
        Ok(())
    }
}
