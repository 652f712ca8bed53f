//! `check`: a Hub upload checked from its headers: the document, SARIF, or the checkpoint in a
//! line per variant on stdout, and the findings and a summary on stderr.

use std::io::{self, Write};

use cardproof::findings::Severity;
use cardproof::hub::check::CheckReport;
use cardproof::output::{CheckDocument, sarif};

use super::{Printer, plural, write_json, write_stdout};
use crate::config::Format;

impl Printer {
    /// `check`'s output: the document (`--json`), SARIF, or the inspection on stdout and the
    /// findings and a summary on stderr.
    pub fn check(&self, report: &CheckReport) -> io::Result<()> {
        match self.output.format {
            Format::Json => write_json(&CheckDocument::new(report))?,
            Format::Sarif => write_json(&sarif::check_log(report))?,
            // The checkpoint in a line per variant (`cardproof inspect` shows the tables).
            Format::Human | Format::Markdown => write_stdout(
                &cardproof::output::text::inspection_summaries(&report.inspections, &self.style()),
            )?,
        }
        if !self.diagnostics() {
            return Ok(());
        }
        let style = self.style();
        if let (Some(card), Some(lint)) = (&report.card_text, &report.card) {
            let mut err = io::stderr().lock();
            for finding in &lint.findings {
                writeln!(
                    err,
                    "{}",
                    cardproof::output::text::finding(card, finding, &style)
                )?;
            }
        }
        let mut err = io::stderr().lock();
        let place = match (&report.repo, &report.commit) {
            (Some(repo), Some(commit)) => format!("hf:{repo}@{commit}"),
            _ => report.source.clone(),
        };
        for f in &report.hub_findings {
            writeln!(
                err,
                "{}[{}]: {}\n  {} {place}\n",
                style.severity(f.severity),
                f.code,
                style.bold(&f.message),
                style.dim("-->"),
            )?;
        }
        for r in report.report.iter().chain(&report.other_reports) {
            let signature = match r.signature {
                "verified" => "signature verified".to_owned(),
                "failed" => "signature FAILED".to_owned(),
                _ => "signature not checked (pass --pub KEY)".to_owned(),
            };
            writeln!(
                err,
                "report {}: {} subjects, keyid(s) {}, {signature}, {}",
                r.file,
                r.subjects,
                r.keyids.join(", "),
                if r.mismatches.is_empty() {
                    "subjects match the Hub's digests and the card is the one it signed".to_owned()
                } else {
                    format!("{} mismatch(es)", r.mismatches.len())
                }
            )?;
        }
        let errors = report.errors();
        let warnings = report.card.as_ref().map_or(0, |c| c.warnings())
            + report
                .hub_findings
                .iter()
                .filter(|f| f.severity == Severity::Warning)
                .count();
        let share = if report.total_bytes > 0 {
            report.bytes_fetched as f64 / report.total_bytes as f64 * 100.0
        } else {
            0.0
        };
        let counts = format!(
            "{} {}, {} {}; {} files, {} bytes",
            errors,
            plural(errors, "error"),
            warnings,
            plural(warnings, "warning"),
            report.files,
            report.total_bytes,
        );
        let summary = match &report.commit {
            Some(commit) => format!(
                "{} (commit {commit}): {counts}; fetched {} bytes ({share:.4}%)",
                report.source, report.bytes_fetched,
            ),
            None => format!("{} (local, before upload): {counts}", report.source),
        };
        writeln!(err, "{}", style.bold(&summary))
    }
}
