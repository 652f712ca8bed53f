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
