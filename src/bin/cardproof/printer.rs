//! The one place that writes: data documents on stdout, diagnostics on stderr.

use std::io::{self, Write};

use cardproof::card::Card;
use cardproof::findings::{Finding, Severity};
use cardproof::lint::LintReport;
use cardproof::span::LineIndex;
use serde_json::json;

use crate::config::{Format, Output};

const LINT_MARKDOWN: &str = include_str!("../../../templates/lint-report.md.j2");

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

    /// Print a lint report in the chosen format.
    pub fn lint(&self, card: &Card, report: &LintReport) -> io::Result<()> {
        match self.output.format {
            Format::Json => {
                let doc = json!({
                    "schema_version": cardproof::JSON_SCHEMA_VERSION,
                    "file": card.path.display().to_string(),
                    "findings": report.findings,
                });
                write_stdout(&(serde_json::to_string_pretty(&doc)? + "\n"))?;
                self.human_findings(card, report)
            }
            Format::Markdown => {
                write_stdout(&render_markdown(card, report))?;
                self.human_findings(card, report)
            }
            Format::Human => self.human_findings(card, report),
        }
    }

    fn human_findings(&self, card: &Card, report: &LintReport) -> io::Result<()> {
        let style = self.style();
        let mut err = io::stderr().lock();
        for finding in &report.findings {
            writeln!(err, "{}", render_finding(card, finding, &style))?;
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

    /// Print an input error: one message naming the file and place (and, with JSON, a document).
    pub fn error(&self, error: &cardproof::Error) -> io::Result<()> {
        if self.output.format == Format::Json {
            let doc = json!({
                "schema_version": cardproof::JSON_SCHEMA_VERSION,
                "error": {
                    "message": error.message(),
                    "file": error.file.display().to_string(),
                    "line": error.at.map(|a| a.line),
                    "column": error.at.map(|a| a.column),
                }
            });
            write_stdout(&(serde_json::to_string_pretty(&doc)? + "\n"))?;
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

    /// Print a plain document on stdout (e.g. the schema).
    pub fn document(&self, text: &str) -> io::Result<()> {
        write_stdout(text)
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        word.to_owned()
    } else {
        format!("{word}s")
    }
}

fn write_stdout(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// The file's text for showing an offending line, when it is small and UTF-8.
fn readable_text(path: &std::path::Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > cardproof::card::MAX_CARD_BYTES {
        return None;
    }
    String::from_utf8(std::fs::read(path).ok()?).ok()
}

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

/// A byte progress bar on stderr (only created when stderr is a terminal).
pub fn progress_bar() -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} hashing {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {wide_bar}",
        )
        .expect("valid progress template"),
    );
    bar
}

impl Printer {
    pub fn manifest(&self, manifest: &cardproof::checkpoint::hash::Manifest) -> io::Result<()> {
        if self.output.format == Format::Json {
            let doc = json!({
                "schema_version": cardproof::JSON_SCHEMA_VERSION,
                "files": manifest.files,
                "root_sha256": manifest.root_sha256,
                "excluded": manifest.excluded,
            });
            return write_stdout(&(serde_json::to_string_pretty(&doc)? + "\n"));
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

    pub fn inspection(
        &self,
        inspections: &[cardproof::checkpoint::inspect::Inspection],
        list_modules: bool,
    ) -> io::Result<()> {
        match self.output.format {
            Format::Json => {
                let doc = if let [only] = inspections {
                    let mut value = serde_json::to_value(only)?;
                    if let Some(map) = value.as_object_mut() {
                        map.shift_insert(
                            0,
                            "schema_version".into(),
                            cardproof::JSON_SCHEMA_VERSION.into(),
                        );
                    }
                    value
                } else {
                    json!({"schema_version": cardproof::JSON_SCHEMA_VERSION, "variants": inspections})
                };
                write_stdout(&(serde_json::to_string_pretty(&doc)? + "\n"))
            }
            _ => {
                let text: String = inspections
                    .iter()
                    .map(|i| render_inspection(i, list_modules, &self.style()))
                    .collect::<Vec<_>>()
                    .join("\n");
                write_stdout(&text)
            }
        }
    }
}

fn render_inspection(
    i: &cardproof::checkpoint::inspect::Inspection,
    list_modules: bool,
    style: &Style,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let bytes: u64 = i.files.iter().map(|f| f.size).sum();
    let title = match &i.variant {
        Some(v) => format!("{} variant `{v}`", i.format),
        None => i.format.to_owned(),
    };
    let _ = writeln!(
        out,
        "{}: {} file{}, {} bytes, {} tensors, {} parameters",
        style.bold(&title),
        i.files.len(),
        if i.files.len() == 1 { "" } else { "s" },
        bytes,
        i.tensor_count,
        i.parameter_count
    );
    for f in &i.files {
        let _ = writeln!(out, "  {}  {} bytes, {} tensors", f.path, f.size, f.tensors);
    }
    if let Some(d) = &i.declared {
        let ignore = if d.ignore.is_empty() {
            String::new()
        } else {
            format!("; excludes {}", d.ignore.join(", "))
        };
        let _ = writeln!(out, "declared: {} ({}){ignore}", d.method, d.source);
    }
    let _ = writeln!(
        out,
        "linear modules: {} quantized, {} high precision; lm_head {}; embeddings {}{}",
        i.summary.quantized,
        i.summary.high_precision,
        i.summary.lm_head.replace('_', " "),
        i.summary.embeddings.as_deref().unwrap_or("absent"),
        i.summary
            .kv_cache
            .as_ref()
            .map(|k| format!("; kv cache {k}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "  {:<18} {:>8} {:>12}",
        "scheme", "modules", "bits/weight"
    );
    for (scheme, count) in &i.summary.schemes {
        let (sum, n) = i
            .modules
            .iter()
            .filter(|m| &m.scheme == scheme)
            .fold((0.0, 0usize), |(s, n), m| (s + m.bits_per_weight, n + 1));
        let _ = writeln!(
            out,
            "  {scheme:<18} {count:>8} {:>12.4}",
            sum / n.max(1) as f64
        );
    }
    let _ = writeln!(
        out,
        "  {:<18} {:>8} {:>10} {:>14}  schemes",
        "bucket", "modules", "quantized", "parameters"
    );
    for (bucket, b) in &i.buckets {
        let schemes: Vec<String> = b.schemes.iter().map(|(s, n)| format!("{s}×{n}")).collect();
        let _ = writeln!(
            out,
            "  {bucket:<18} {:>8} {:>10} {:>14}  {}",
            b.modules,
            b.quantized,
            b.parameters,
            schemes.join(" ")
        );
    }
    if list_modules {
        let _ = writeln!(
            out,
            "  {:<56} {:<14} {:<14} {:>8}  group  activations",
            "module", "status", "scheme", "bits"
        );
        for m in &i.modules {
            let status = match m.status {
                cardproof::checkpoint::inspect::Status::Quantized => "quantized",
                cardproof::checkpoint::inspect::Status::HighPrecision => "high_precision",
            };
            let _ = writeln!(
                out,
                "  {:<56} {:<14} {:<14} {:>8.4}  {}  {}",
                m.name,
                status,
                m.scheme,
                m.bits_per_weight,
                m.group_size
                    .as_ref()
                    .map_or("-".to_owned(), |g| g.to_string()),
                m.activations.as_deref().unwrap_or("-")
            );
        }
    }
    for f in &i.findings {
        let _ = writeln!(
            out,
            "{}[{}]: {}",
            style.severity(f.severity),
            f.code,
            f.message
        );
    }
    out
}
