//! `lint`: the findings as a document, a Markdown table or SARIF on stdout, and as diagnostics
//! with the offending lines on stderr (except with `--json`, whose document holds them).

use std::io::{self, Write};

use cardproof::card::Card;
use cardproof::lint::LintReport;
use cardproof::output::{LintDocument, sarif};

use super::{Printer, plural, write_json, write_stdout};
use crate::config::Format;

const LINT_MARKDOWN: &str = include_str!("../../../../templates/lint-report.md.j2");

impl Printer {
    /// Every card's lint: one card prints as [`Printer::lint`]; several print each one's
    /// findings, one SARIF log (a run with every card's results) or one Markdown page, and a
    /// total; `--json` takes one path (its document is one card's).
    pub fn lints(&self, all: &[crate::commands::lint::Linted]) -> io::Result<()> {
        let ignored: usize = all.iter().map(|l| l.ignored).sum();
        if let [one] = all {
            self.lint(&one.card, &one.report)?;
        } else {
            match self.output.format {
                // Refused before any work (`LintConfig::from_args`): a document is one card's.
                Format::Json => {}
                Format::Markdown => write_stdout(
                    &all.iter()
                        .map(|l| render_markdown(&l.card, &l.report))
                        .collect::<Vec<_>>()
                        .join("\n"),
                )?,
                Format::Sarif => write_json(&sarif::lint_logs(
                    &all.iter().map(|l| (&l.card, &l.report)).collect::<Vec<_>>(),
                ))?,
                Format::Human => {}
            }
            if self.diagnostics() {
                for l in all {
                    self.human_findings(&l.card, &l.report)?;
                }
                let (e, w): (usize, usize) = all.iter().fold((0, 0), |(e, w), l| {
                    (e + l.report.errors(), w + l.report.warnings())
                });
                let summary = format!(
                    "{} cards: {e} {}, {w} {}",
                    all.len(),
                    plural(e, "error"),
                    plural(w, "warning")
                );
                writeln!(io::stderr().lock(), "{}", self.style().bold(&summary))?;
            }
        }
        if ignored > 0 && self.diagnostics() {
            self.note(&format!(
                "{ignored} {} left out by the rule selection (--ignore, .cardproof.yaml)",
                plural(ignored, "finding")
            ));
        }
        Ok(())
    }

    /// Print a lint report in the chosen format.
    pub fn lint(&self, card: &Card, report: &LintReport) -> io::Result<()> {
        match self.output.format {
            Format::Json => write_json(&LintDocument::new(&card.path, report))?,
            Format::Markdown => write_stdout(&render_markdown(card, report))?,
            Format::Sarif => write_json(&sarif::lint_log(card, report))?,
            Format::Human => {}
        }
        if !self.diagnostics() {
            return Ok(());
        }
        self.human_findings(card, report)
    }

    pub(super) fn human_findings(&self, card: &Card, report: &LintReport) -> io::Result<()> {
        let style = self.style();
        let mut err = io::stderr().lock();
        for finding in &report.findings {
            writeln!(
                err,
                "{}",
                cardproof::output::text::finding(card, finding, &style)
            )?;
        }
        let (e, w) = (report.errors(), report.warnings());
        let summary = format!(
            "{}: {} {}, {} {}",
            card.path.display(),
            e,
            plural(e, "error"),
            w,
            plural(w, "warning")
        );
        writeln!(err, "{}", style.bold(&summary))
    }
}

fn render_markdown(card: &Card, report: &LintReport) -> String {
    let mut env = minijinja::Environment::new();
    env.add_template("lint", LINT_MARKDOWN)
        .expect("the lint template parses");
    env.add_filter("md", |s: String| {
        s.replace('\\', "\\\\")
            .replace('|', "\\|")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    });
    env.get_template("lint")
        .and_then(|t| {
            t.render(minijinja::context! {
                file => card.path.display().to_string(),
                findings => minijinja::value::Serde(&report.findings),
                errors => report.errors(),
                warnings => report.warnings(),
            })
        })
        .expect("the lint template renders")
}
