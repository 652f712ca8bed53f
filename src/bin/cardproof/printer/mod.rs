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

use cardproof::card::Card;
use cardproof::findings::{Finding, Severity};
use cardproof::span::LineIndex;

use crate::config::{Format, Output};

pub struct Printer {
    output: Output,
}

struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
    fn severity(&self, s: Severity) -> String {
        match s {
            Severity::Error => self.paint("1;31", "error"),
            Severity::Warning => self.paint("1;33", "warning"),
        }
    }
    fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }
    fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }
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

    /// Print an input error: one message naming the file and place (and, with JSON, a document).
    pub fn error(&self, error: &cardproof::Error) -> io::Result<()> {
        if self.json() {
            write_json(&cardproof::output::ErrorDocument::new(error))?;
        }
        let style = self.style();
        let mut err = io::stderr().lock();
        writeln!(err, "{}: {error}", style.severity(Severity::Error))?;
        if let Some(at) = error.at
            && let Some(text) = readable_text(&error.file)
        {
            let lines = LineIndex::new(&text);
            let line = &text[lines.line_range(&text, at.line)];
            writeln!(err, "{}", snippet(line, at.line, at.column, 1, &style))?;
        }
        Ok(())
    }

    /// A usage error found after argument parsing.
    pub fn usage_error(&self, message: &str) -> io::Result<()> {
        if self.json() {
            write_json(&cardproof::output::ErrorDocument::usage(message))?;
        }
        writeln!(
            io::stderr().lock(),
            "{}: {message}",
            self.style().severity(Severity::Error)
        )
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

/// A lint finding with its place and the offending line (lint and check).
fn render_finding(card: &Card, finding: &Finding, style: &Style) -> String {
    let mut out = format!(
        "{}[{}]: {}",
        style.severity(finding.severity),
        finding.code,
        style.bold(&finding.message)
    );
    if let (Some(line), Some(column)) = (finding.line, finding.column) {
        out.push_str(&format!(
            "\n  {} {}:{line}:{column}",
            style.dim("-->"),
            card.path.display()
        ));
        let range = card.lines.line_range(&card.text, line);
        let text = &card.text[range.clone()];
        let width = finding.span.as_ref().map_or(1, |span| {
            let start = range.start + text.char_indices().nth(column - 1).map_or(0, |(i, _)| i);
            let end = span.end.min(range.end).max(start);
            card.text[start..end].chars().count().max(1)
        });
        out.push('\n');
        out.push_str(&snippet(text, line, column, width, style));
    } else {
        out.push_str(&format!("\n  {} {}", style.dim("-->"), card.path.display()));
    }
    if let Some(pointer) = &finding.pointer {
        out.push_str(&format!("\n   {} at {pointer}", style.dim("=")));
    }
    if let Some(item) = finding.item {
        out.push_str(&format!("\n   {} item: {item}", style.dim("=")));
    }
    out.push('\n');
    out
}

fn snippet(line_text: &str, line: usize, column: usize, width: usize, style: &Style) -> String {
    let number = line.to_string();
    let pad = " ".repeat(number.len());
    let shown: String = line_text.chars().take(200).collect();
    let caret = format!("{}{}", " ".repeat(column - 1), "^".repeat(width.min(120)));
    format!(
        "{pad} {bar}\n{} {bar} {shown}\n{pad} {bar} {}",
        style.dim(&number),
        style.paint("1;31", &caret),
        bar = style.dim("|"),
    )
}

/// Template of the hashing progress bar.
pub const HASH_PROGRESS: &str =
    "{spinner} hashing {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {wide_bar}";
/// Template of the measurement progress bar.
pub const MEASURE_PROGRESS: &str = "{spinner} {msg} {pos}/{len} windows ({eta} left) {wide_bar}";
/// Template of the download progress bar (`hf:` sources).
pub const DOWNLOAD_PROGRESS: &str =
    "{spinner} downloading {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {wide_bar}";

/// A progress bar on stderr (only created when stderr is a terminal).
pub fn progress_bar(template: &str) -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(template).expect("valid progress template"),
    );
    bar
}
