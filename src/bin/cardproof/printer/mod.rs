//! The one place that writes: data documents on stdout, diagnostics on stderr.
//!
//! `--json` documents are the typed documents of [`cardproof::output`], serialized; human output
//! is rendered here, one module per command family.

mod attest;
mod card;
mod check;
mod hash;
mod inspect;
mod kld;
mod lint;
mod rerun;

use std::io::{self, Write};

use cardproof::findings::Severity;
use cardproof::span::LineIndex;

use cardproof::output::text::Style;

use crate::config::{Format, Output};

pub struct Printer {
    output: Output,
}

impl Printer {
    pub fn new(output: Output) -> Self {
        Printer { output }
    }

    fn style(&self) -> Style {
        Style {
            on: self.output.color,
        }
    }

    fn json(&self) -> bool {
        self.output.format == Format::Json
    }

    /// Whether diagnostics go to stderr: not with `--json`, whose one document already holds
    /// them (findings, warnings, errors, what was written). Progress and notes about what the
    /// document does not hold (downloads, a key created) stay on stderr. SARIF and Markdown are
    /// renderings for another reader, so the person running the command still sees the findings.
    fn diagnostics(&self) -> bool {
        !self.json()
    }

    /// Print an input error: one message naming the file and place (with JSON, the error
    /// document alone).
    pub fn error(&self, error: &cardproof::Error) -> io::Result<()> {
        if self.json() {
            return write_json(&cardproof::output::ErrorDocument::new(error));
        }
        let style = self.style();
        let mut err = io::stderr().lock();
        writeln!(err, "{}: {error}", style.severity(Severity::Error))?;
        if let Some(at) = error.at
            && let Some(text) = readable_text(&error.file)
        {
            let lines = LineIndex::new(&text);
            let line = &text[lines.line_range(&text, at.line)];
            writeln!(
                err,
                "{}",
                cardproof::output::text::snippet(line, at.line, at.column, 1, &style)
            )?;
        }
        Ok(())
    }

    /// A usage error found after argument parsing.
    pub fn usage_error(&self, message: &str) -> io::Result<()> {
        if self.json() {
            return write_json(&cardproof::output::ErrorDocument::usage(message));
        }
        writeln!(
            io::stderr().lock(),
            "{}: {message}",
            self.style().severity(Severity::Error)
        )
    }

    /// A one-line warning on stderr: the run goes on, its numbers weaker for it.
    pub fn warning(&self, message: &str) {
        let _ = writeln!(
            io::stderr().lock(),
            "{}: {message}",
            self.style().severity(Severity::Warning)
        );
    }

    /// A one-line note on stderr (not an error).
    pub fn note(&self, message: &str) {
        let _ = writeln!(
            io::stderr().lock(),
            "{}: {message}",
            self.style().dim("note")
        );
    }

    /// Print a plain document on stdout (e.g. the schema).
    pub fn document(&self, text: &str) -> io::Result<()> {
        write_stdout(text)
    }
}

/// A typed document on stdout: pretty JSON and a newline.
fn write_json(document: &impl serde::Serialize) -> io::Result<()> {
    write_stdout(&(serde_json::to_string_pretty(document)? + "\n"))
}

fn write_stdout(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        word.to_owned()
    } else {
        format!("{word}s")
    }
}

/// The file's text for showing an offending line, when it is small and UTF-8.
fn readable_text(path: &std::path::Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > cardproof::card::MAX_CARD_BYTES {
        return None;
    }
    String::from_utf8(std::fs::read(path).ok()?).ok()
}

/// Template of the hashing progress bar.
pub const HASH_PROGRESS: &str =
    "{spinner} hashing {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {wide_bar}";
/// Template of the measurement progress bar, while windows are counted.
pub const MEASURE_PROGRESS: &str = "{spinner} {msg} {pos}/{len} windows ({eta} left) {wide_bar}";
/// Template of a stage that counts nothing (tokenizing, loading, linting): its name alone.
pub const STAGE_PROGRESS: &str = "{spinner} {msg}";
/// Template of the download progress bar (`hf:` sources).
pub const DOWNLOAD_PROGRESS: &str =
    "{spinner} downloading {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {wide_bar}";

/// A progress bar on stderr (only created when stderr is a terminal).
pub fn progress_bar(template: &str) -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(progress_style(template));
    bar
}

/// A progress bar's style from one of the templates above.
pub fn progress_style(template: &str) -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(template).expect("valid progress template")
}
