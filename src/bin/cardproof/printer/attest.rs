//! `keygen`, `sign` and `verify-report`: the keys written, the envelope written, and whether a
//! signed report verifies.

use std::io;

use cardproof::attest::{CheckedReport, KeyPair, Signed};
use cardproof::output::{KeygenDocument, SignDocument, VerifyReportDocument};

use super::{Printer, write_json, write_stdout};

impl Printer {
    pub fn keys(&self, keys: &KeyPair) -> io::Result<()> {
        if self.json() {
            return write_json(&KeygenDocument::new(keys));
        }
        write_stdout(&format!(
            "private key: {} (keep it secret)\npublic key:  {}\nkeyid:       {}\n",
            keys.private.display(),
            keys.public.display(),
            keys.keyid
        ))
    }

    /// `sign`: the document (`--json`), and on stderr what was written.
    pub fn signed(&self, s: &Signed) -> io::Result<()> {
        if self.json() {
            return write_json(&SignDocument::new(s));
        }
        self.note(&format!(
            "wrote {} ({} subjects, keyid {})",
            s.envelope.display(),
            s.subjects,
            s.keyid
        ));
        Ok(())
    }

    pub fn report_check(&self, r: &CheckedReport) -> io::Result<()> {
        if self.json() {
            return write_json(&VerifyReportDocument::new(r));
        }
        let mut out = String::new();
        if r.verified() {
            out.push_str(&format!(
                "{}: signature by keyid {} verifies",
                r.envelope.display(),
                r.keyid
            ));
            if let Some(c) = &r.subjects_checked {
                out.push_str(&format!(
                    "; every subject matches the files in {}",
                    c.display()
                ));
            }
            if let Some(c) = &r.study_checked {
                out.push_str(&format!(
                    "; every subject matches {} and the checkpoints it names",
                    c.display()
                ));
            }
            if let Some(c) = &r.card_checked {
                out.push_str(&format!(
                    "; the fidelity block of {} is the one it signed",
                    c.display()
                ));
            }
            match &r.set_checked {
                Some(dir) => out.push_str(&format!(
                    "; every file of its set in {} is one it signed",
                    dir.display()
                )),
                None => out.push_str(
                    "; it stands alone (no file of its set beside it, so none is vouched for)",
                ),
            }
            out.push('\n');
            if let Some(id) = &r.run_id {
                out.push_str(&format!("run id: {id}\n"));
            }
            if let Some(v) = &r.verdict {
                out.push_str(&format!("report verdict: {v}\n"));
            }
        } else {
            out.push_str(&format!("{}: NOT verified\n", r.envelope.display()));
            for m in &r.mismatches {
                out.push_str(&format!("  {}: {}\n", m.what, m.detail));
            }
        }
        write_stdout(&out)
    }
}
