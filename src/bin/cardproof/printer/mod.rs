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
            Format::Sarif => {
                let results = report
                    .findings
                    .iter()
                    .map(|f| sarif_result(card, f))
                    .collect();
                write_stdout(&(serde_json::to_string_pretty(&sarif(results))? + "\n"))?;
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

/// A JSON document on stdout with `"schema_version"` first.
fn write_versioned(value: &impl serde::Serialize) -> io::Result<()> {
    let mut value = serde_json::to_value(value)?;
    if let Some(map) = value.as_object_mut() {
        map.shift_insert(
            0,
            "schema_version".into(),
            cardproof::JSON_SCHEMA_VERSION.into(),
        );
    }
    write_stdout(&(serde_json::to_string_pretty(&value)? + "\n"))
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
/// Template of the hashing progress bar.
pub const HASH_PROGRESS: &str =
    "{spinner} hashing {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {wide_bar}";
/// Template of the measurement progress bar.
pub const MEASURE_PROGRESS: &str = "{spinner} {msg} {pos}/{len} windows ({eta} left) {wide_bar}";

pub fn progress_bar(template: &str) -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template(template).expect("valid progress template"),
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
            // One shape whatever the input: a single file or checkpoint is a one-element list.
            Format::Json => write_versioned(&json!({"variants": inspections})),
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

impl Printer {
    /// A usage error found after argument parsing.
    pub fn usage_error(&self, message: &str) -> io::Result<()> {
        if self.output.format == Format::Json {
            let doc = json!({
                "schema_version": cardproof::JSON_SCHEMA_VERSION,
                "error": {"message": message, "file": null, "line": null, "column": null}
            });
            write_stdout(&(serde_json::to_string_pretty(&doc)? + "\n"))?;
        }
        writeln!(
            io::stderr().lock(),
            "{}: {message}",
            self.style().severity(Severity::Error)
        )
    }

    pub fn measurement(&self, m: &cardproof::measure::Measurement) -> io::Result<()> {
        if m.n_nonfinite > 0 {
            writeln!(
                io::stderr().lock(),
                "{}: {} row{} with non-finite logits (NaN or +inf) excluded, not averaged in",
                self.style().severity(Severity::Warning),
                m.n_nonfinite,
                if m.n_nonfinite == 1 { "" } else { "s" }
            )?;
        }
        if self.output.format == Format::Json {
            return write_versioned(m);
        }
        write_stdout(&render_measurement(m))
    }

    pub fn compat(&self, m: &cardproof::measure::compat::CompatMeasurement) -> io::Result<()> {
        if self.output.format == Format::Json {
            return write_versioned(m);
        }
        let header = format!(
            "llama.cpp-compatible KLD: forward KL(P_base || P_cand) in nats, reference terms with \
             log p <= -16 dropped, second half of each {}-token window, {} rows; i.i.d. standard \
             errors\nprotocol_sha256: {}\n\n",
            m.protocol["context_length"], m.n_positions, m.protocol_sha256
        );
        write_stdout(&(header + &m.llamacpp.render()))
    }
}

/// Plain-words descriptions of a protocol's direction, vocabulary terms and scored rows.
fn describe_protocol(p: &serde_json::Value) -> (&'static str, String, String) {
    let direction = match p["direction"].as_str() {
        Some("forward") => "forward KL(P_ref || P_cand)",
        Some("reverse") => "reverse KL(P_cand || P_ref)",
        _ => "forward KL(P_ref || P_cand) and reverse KL(P_cand || P_ref)",
    };
    let vocab = match p["vocab"]["mode"].as_str() {
        Some("top_k") => format!(
            "reference top-{} ({} tail)",
            p["vocab"]["k"],
            p["vocab"]["tail"].as_str().unwrap_or("?")
        ),
        Some("threshold") => format!(
            "reference terms with log p <= {} dropped",
            p["vocab"]["log_p"]
        ),
        _ => "full vocabulary".to_owned(),
    };
    let positions = match p["positions"]["policy"].as_str() {
        Some("stride") => format!(
            "every row with j mod {} = {}",
            p["positions"]["stride"], p["positions"]["offset"]
        ),
        Some("second_half") => "second half of each window (llama.cpp)".to_owned(),
        Some("from") => format!("rows j >= {}", p["positions"]["from"]),
        _ => "all rows".to_owned(),
    };
    (direction, vocab, positions)
}

/// The metric table and diagnostics of one result (`metrics`, `uncertainty`, `low_support`,
/// `diagnostics` keys, as `kld --json` and measurement.json runs hold them).
fn render_results(out: &mut String, r: &serde_json::Value) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "\n{:<20} {:>12} {:>12}  95% CI",
        "metric", "value", "± sem"
    );
    let low: Vec<&str> = r["low_support"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    for name in cardproof::disclosure::vocabulary::METRICS {
        let Some(value) = r["metrics"][*name].as_f64() else {
            continue;
        };
        let u = &r["uncertainty"][*name];
        let sem = u["sem"]
            .as_f64()
            .map_or(String::new(), |s| format!("{s:.6}"));
        let ci = match (u["ci95"][0].as_f64(), u["ci95"][1].as_f64()) {
            (Some(a), Some(b)) => format!("[{a:.6}, {b:.6}]"),
            _ => String::new(),
        };
        let mark = if low.contains(name) { " *" } else { "" };
        let _ = writeln!(out, "{:<20} {:>12.6} {:>12}  {ci}{mark}", name, value, sem);
    }
    if !low.is_empty() {
        let _ = writeln!(
            out,
            "* low support: fewer than 100 rows beyond this percentile; its value is noise"
        );
    }
    let table = |out: &mut String, title: &str, buckets: &serde_json::Value| {
        let _ = writeln!(
            out,
            "\n{title:<20} {:>8} {:>12} {:>10} {:>10}",
            "rows", "kld_mean", "flips", "flip rate"
        );
        for b in buckets.as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "{:<20} {:>8} {:>12} {:>10} {:>10}",
                b["label"].as_str().unwrap_or("?"),
                b["n"],
                b["kld_mean"]
                    .as_f64()
                    .map_or("-".into(), |v| format!("{v:.6}")),
                b["top1_flips"],
                b["flip_rate"]
                    .as_f64()
                    .map_or("-".into(), |v| format!("{v:.4}"))
            );
        }
    };
    table(out, "by depth (j / L)", &r["diagnostics"]["by_depth"]);
    table(
        out,
        "by ref. confidence",
        &r["diagnostics"]["by_confidence"],
    );
}

fn render_measurement(m: &cardproof::measure::Measurement) -> String {
    use std::fmt::Write as _;
    let doc = serde_json::to_value(m).unwrap_or_default();
    let p = &m.protocol;
    let mut out = String::new();
    let (direction, vocab, positions) = describe_protocol(p);
    let _ = writeln!(
        out,
        "reference: {} ({}, {} rows × {})",
        m.reference.path, m.reference.format, m.reference.rows, m.reference.vocab
    );
    let _ = writeln!(
        out,
        "candidate: {} ({}, {} rows × {})",
        m.candidate.path, m.candidate.format, m.candidate.rows, m.candidate.vocab
    );
    let _ = writeln!(
        out,
        "protocol: {direction} in nats; {vocab} ({} entries, padding {}); {positions}; {} rows in {} window{}; mean over positions; {:.0}% block bootstrap ({} resamples, seed {}, blocks {})",
        p["vocab_size"],
        p["padding"].as_str().unwrap_or("?"),
        m.n_positions,
        m.n_windows,
        if m.n_windows == 1 { "" } else { "s" },
        p["bootstrap"]["level"].as_f64().unwrap_or(0.95) * 100.0,
        p["bootstrap"]["resamples"],
        p["bootstrap"]["seed"],
        p["bootstrap_block"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(out, "protocol_sha256: {}", m.protocol_sha256);
    if m.n_nonfinite > 0 {
        let _ = writeln!(
            out,
            "excluded: {} rows with non-finite logits",
            m.n_nonfinite
        );
    }
    render_results(&mut out, &doc);
    out
}

/// `measure`'s human output: what was run, then one table per context length.
fn render_model_measurement(doc: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let p = &doc["protocol"];
    let e = &doc["environment"];
    let mut out = String::new();
    let (direction, vocab, positions) = describe_protocol(p);
    for side in ["reference", "candidate"] {
        let m = &doc[side];
        let weights: Vec<String> = m["runner"]["weights"]
            .as_object()
            .map(|w| w.iter().map(|(k, v)| format!("{k} ×{v}")).collect())
            .unwrap_or_default();
        // Native runs list the weight schemes; transformers runs what the engine loaded.
        let detail = if weights.is_empty() {
            let r = &m["runner"];
            let mut parts = vec![format!(
                "{} weights, attention {}",
                r["param_dtype"].as_str().unwrap_or("?"),
                r["attention"].as_str().unwrap_or("?")
            )];
            if let Some(q) = r["quant_method"].as_str() {
                parts.push(format!("quantization {q}"));
            }
            parts.join(", ")
        } else {
            weights.join(", ")
        };
        let _ = writeln!(
            out,
            "{side}: {} ({}; {detail})",
            m["path"].as_str().unwrap_or("?"),
            m["runner"]["architecture"].as_str().unwrap_or("?"),
        );
        if let Some(a) = m["runner"]["activation_emulation"].as_object()
            && !a.is_empty()
        {
            let acts: Vec<String> = a.iter().map(|(k, v)| format!("{k} ×{v}")).collect();
            let _ = writeln!(
                out,
                "  emulated activation quantization: {}",
                acts.join(", ")
            );
        }
    }
    let ev = &doc["eval"];
    let _ = writeln!(
        out,
        "eval: {} ({} tokens, tokens_sha256 {}, BOS {})",
        ev["text_path"].as_str().unwrap_or("?"),
        ev["token_count"],
        ev["tokens_sha256"].as_str().unwrap_or("?"),
        ev["bos"].as_str().unwrap_or("?")
    );
    let where_ = match e["threads"].as_u64() {
        Some(t) => format!("{t} threads, {}", e["device"].as_str().unwrap_or("?")),
        None => e["device"].as_str().unwrap_or("?").to_owned(),
    };
    let _ = writeln!(
        out,
        "runner: {} ({} {}), {} compute, {where_}",
        e["runner"].as_str().unwrap_or("?"),
        e["engine"].as_str().unwrap_or("?"),
        e["engine_version"].as_str().unwrap_or("?"),
        e["compute_dtype"].as_str().unwrap_or("?"),
    );
    if let Some(t) = e["transformers_runner"]["timings_s"].as_object() {
        let secs = |k: &str| t.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        let _ = writeln!(
            out,
            "  attention {}, prefill chunk {}, reduction {}; load {:.1} s, prefill {:.1} s, head and reduction {:.1} s",
            e["attention"].as_str().unwrap_or("?"),
            e["transformers_runner"]["chunk_size"],
            e["transformers_runner"]["reduction_kernel"]
                .as_str()
                .unwrap_or("?"),
            secs("load"),
            secs("prefill"),
            secs("head_and_reduce"),
        );
    }
    let _ = writeln!(
        out,
        "protocol: {direction} in nats; {vocab} ({} entries, padding {}); {positions}; mean over positions; {:.0}% block bootstrap ({} resamples, seed {})",
        p["vocab_size"],
        p["padding"].as_str().unwrap_or("?"),
        p["bootstrap"]["level"].as_f64().unwrap_or(0.95) * 100.0,
        p["bootstrap"]["resamples"],
        p["bootstrap"]["seed"],
    );
    let _ = writeln!(
        out,
        "protocol_sha256: {}",
        doc["protocol_sha256"].as_str().unwrap_or("?")
    );
    for run in doc["runs"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "\n== context length {}: {} rows in {} windows (blocks {}){}",
            run["context_length"],
            run["n_positions"],
            run["n_windows"],
            run["bootstrap_block"].as_str().unwrap_or("?"),
            if run["n_nonfinite"].as_u64().unwrap_or(0) > 0 {
                format!(
                    "; {} rows with non-finite logits excluded",
                    run["n_nonfinite"]
                )
            } else {
                String::new()
            }
        );
        render_results(&mut out, run);
    }
    out
}

impl Printer {
    pub fn model_measurement(
        &self,
        doc: &serde_json::Value,
        out_dir: &std::path::Path,
    ) -> io::Result<()> {
        if self.output.format == Format::Json {
            let text = serde_json::to_string_pretty(doc).map_err(io::Error::other)?;
            write_stdout(&format!("{text}\n"))?;
        } else {
            write_stdout(&render_model_measurement(doc))?;
        }
        writeln!(
            io::stderr().lock(),
            "wrote {} and {}",
            out_dir.join("measurement.json").display(),
            out_dir.join("positions.safetensors").display()
        )
    }
}

impl Printer {
    /// `measure --sweep`: the sweep document (`--json`) or one line per compared setting.
    pub fn sweep(&self, doc: &serde_json::Value, out_dir: &std::path::Path) -> io::Result<()> {
        if self.output.format == Format::Json {
            let text = serde_json::to_string_pretty(doc).map_err(io::Error::other)?;
            write_stdout(&format!("{text}\n"))?;
        } else {
            write_stdout(&render_sweep(doc))?;
        }
        writeln!(
            io::stderr().lock(),
            "wrote {}",
            out_dir.join("sweep.json").display()
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

    /// `verify`'s output: the report document (`--json`) or a verdict table, then the files.
    pub fn verification(
        &self,
        report: &serde_json::Value,
        written: &[std::path::PathBuf],
    ) -> io::Result<()> {
        if self.output.format == Format::Json {
            let text = serde_json::to_string_pretty(report).map_err(io::Error::other)?;
            write_stdout(&format!("{text}\n"))?;
        } else {
            write_stdout(&render_verification(report))?;
        }
        let mut err = io::stderr().lock();
        for path in written {
            writeln!(err, "wrote {}", path.display())?;
        }
        Ok(())
    }
}

fn render_verification(r: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "verdict: {}  ({})",
        r["verdict"].as_str().unwrap_or("?"),
        r["summary"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, n)| k.as_str() == "reproduced" || n.as_u64().is_some_and(|n| n > 0))
            .map(|(k, n)| format!("{n} {}", k.replace('_', " ")))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let _ = writeln!(out, "card: {}", r["card"]["path"].as_str().unwrap_or("?"));
    let _ = writeln!(
        out,
        "checkpoint: {} (root sha256 {})",
        r["checkpoint"]["path"].as_str().unwrap_or("?"),
        r["checkpoint"]["root_sha256"].as_str().unwrap_or("?")
    );
    let _ = writeln!(
        out,
        "\n{:<18} {:>6} {:>12} {:>12} {:>10}  verdict",
        "metric", "ctx", "claimed", "rerun", "tolerance"
    );
    for c in r["claims"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{:<18} {:>6} {:>12} {:>12} {:>10}  {}",
            c["metric"].as_str().unwrap_or("?"),
            c["context_length"]
                .as_u64()
                .map_or("-".into(), |l| l.to_string()),
            c["claimed_text"].as_str().unwrap_or("?"),
            c["rerun"]
                .as_f64()
                .map_or("-".into(), |v| format!("{v:.6}")),
            c["tolerance"]
                .as_f64()
                .map_or("-".into(), |v| format!("{v:.1e}")),
            c["verdict"].as_str().unwrap_or("?"),
        );
        if c["verdict"] != "reproduced" {
            let _ = writeln!(out, "    {}", c["reason"].as_str().unwrap_or(""));
            for d in c["differences"].as_array().into_iter().flatten() {
                let _ = writeln!(out, "    - {}", d.as_str().unwrap_or(""));
            }
        }
    }
    let gates: Vec<String> = r["sanity"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            format!(
                "{} {}",
                g["gate"].as_str().unwrap_or("?"),
                if g["passed"] == true {
                    "passed"
                } else {
                    "FAILED"
                }
            )
        })
        .collect();
    if !gates.is_empty() {
        let _ = writeln!(out, "\nsanity gates: {}", gates.join(", "));
    }
    if let Some(runs) = r["noise_floor"]["runs"].as_array() {
        for run in runs {
            let _ = writeln!(
                out,
                "noise floor ({}), context {}: kld_mean {:.3e}, top1_agreement {:.4}",
                r["noise_floor"]["what"].as_str().unwrap_or(""),
                run["context_length"],
                run["metrics"]["kld_mean"].as_f64().unwrap_or(f64::NAN),
                run["metrics"]["top1_agreement"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            );
        }
    }
    out
}

impl Printer {
    pub fn keys(
        &self,
        private: &std::path::Path,
        public: &std::path::Path,
        keyid: &str,
    ) -> io::Result<()> {
        if self.output.format == Format::Json {
            return write_versioned(&serde_json::json!({
                "private_key": private.display().to_string(),
                "public_key": public.display().to_string(),
                "keyid": keyid,
            }));
        }
        write_stdout(&format!(
            "private key: {} (keep it secret)\npublic key:  {}\nkeyid:       {keyid}\n",
            private.display(),
            public.display()
        ))
    }

    pub fn report_check(
        &self,
        envelope: &std::path::Path,
        keyid: &str,
        statement: &serde_json::Value,
        mismatches: &[cardproof::attest::Mismatch],
        checkpoint: Option<&std::path::Path>,
        card: Option<&std::path::Path>,
    ) -> io::Result<()> {
        if self.output.format == Format::Json {
            return write_versioned(&serde_json::json!({
                "envelope": envelope.display().to_string(),
                "keyid": keyid,
                "verified": mismatches.is_empty(),
                "subjects_checked": checkpoint.map(|c| c.display().to_string()),
                "card_checked": card.map(|c| c.display().to_string()),
                "run_id": statement["predicate"]["run_id"],
                "mismatches": mismatches,
                "predicate_type": statement["predicateType"],
                "verdict": statement["predicate"]["verdict"],
            }));
        }
        let mut out = String::new();
        if mismatches.is_empty() {
            out.push_str(&format!(
                "{}: signature by keyid {keyid} verifies",
                envelope.display()
            ));
            if let Some(c) = checkpoint {
                out.push_str(&format!(
                    "; every subject matches the files in {}",
                    c.display()
                ));
            }
            if let Some(c) = card {
                out.push_str(&format!(
                    "; the fidelity block of {} is the one it signed",
                    c.display()
                ));
            }
            out.push('\n');
            if let Some(id) = statement["predicate"]["run_id"].as_str() {
                out.push_str(&format!("run id: {id}\n"));
            }
            if let Some(v) = statement["predicate"]["verdict"].as_str() {
                out.push_str(&format!("report verdict: {v}\n"));
            }
        } else {
            out.push_str(&format!("{}: NOT verified\n", envelope.display()));
            for m in mismatches {
                out.push_str(&format!("  {}: {}\n", m.what, m.detail));
            }
        }
        write_stdout(&out)
    }
}

/// Template of the download progress bar (`hf:` sources).
pub const DOWNLOAD_PROGRESS: &str =
    "{spinner} downloading {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {wide_bar}";

/// SARIF's artifact URI for a card: a relative path with forward slashes (what code scanning
/// resolves against the repository root), a `file://` URI for an absolute path, or the `hf:`
/// name as it is.
fn sarif_uri(path: &std::path::Path) -> String {
    let text = path.to_string_lossy().replace('\\', "/");
    if path.is_absolute() {
        format!("file://{text}")
    } else {
        text.strip_prefix("./").unwrap_or(&text).to_owned()
    }
}

fn sarif_level(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

/// One SARIF result for a lint finding, with a region from its span (1-based lines, columns in
/// Unicode code points, as the run's `columnKind` says).
fn sarif_result(card: &Card, f: &Finding) -> serde_json::Value {
    let mut location = json!({
        "physicalLocation": {"artifactLocation": {"uri": sarif_uri(&card.path)}}
    });
    if let (Some(line), Some(column)) = (f.line, f.column) {
        let mut region = json!({"startLine": line, "startColumn": column});
        if let Some(span) = &f.span {
            let end = card.line_col(span.end.min(card.text.len()));
            if (end.line, end.column) > (line, column) {
                region["endLine"] = json!(end.line);
                region["endColumn"] = json!(end.column);
            }
        }
        location["physicalLocation"]["region"] = region;
    }
    let mut message = f.message.clone();
    if let Some(pointer) = &f.pointer {
        message.push_str(&format!(" (at {pointer})"));
    }
    json!({
        "ruleId": f.code.as_str(),
        "ruleIndex": cardproof::findings::Code::ALL.iter().position(|c| *c == f.code),
        "level": sarif_level(f.severity),
        "message": {"text": message},
        "locations": [location],
    })
}

/// A SARIF 2.1.0 log with one run of cardproof; the rules are every lint finding code (so a
/// result's `ruleIndex` is stable across runs).
fn sarif(results: Vec<serde_json::Value>) -> serde_json::Value {
    let rules: Vec<serde_json::Value> = cardproof::findings::Code::ALL
        .iter()
        .map(|c| {
            json!({
                "id": c.as_str(),
                "name": c.as_str(),
                "shortDescription": {"text": format!("cardproof lint finding `{}`", c.as_str())},
                "helpUri": "https://github.com/cardproof/cardproof#finding-codes",
                "defaultConfiguration": {"level": sarif_level(c.severity())},
            })
        })
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "cardproof",
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": "https://github.com/cardproof/cardproof",
                "rules": rules,
            }},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }]
    })
}

impl Printer {
    /// `check`'s output: the document (`--json`), SARIF, or the inspection on stdout and the
    /// findings and a summary on stderr.
    pub fn check(&self, report: &cardproof::hub::check::CheckReport) -> io::Result<()> {
        match self.output.format {
            Format::Json => write_versioned(report)?,
            Format::Sarif => {
                let mut results: Vec<serde_json::Value> = Vec::new();
                if let (Some(card), Some(lint)) = (&report.card_text, &report.card) {
                    results.extend(lint.findings.iter().map(|f| sarif_result(card, f)));
                }
                for f in &report.hub_findings {
                    results.push(json!({
                        "ruleId": f.code,
                        "level": sarif_level(f.severity),
                        "message": {"text": f.message},
                        "locations": [{"physicalLocation": {"artifactLocation": {
                            "uri": format!("{}/README.md", report.source)
                        }}}],
                    }));
                }
                write_stdout(&(serde_json::to_string_pretty(&sarif(results))? + "\n"))?;
            }
            Format::Human | Format::Markdown => {
                let text: String = report
                    .inspections
                    .iter()
                    .map(|i| render_inspection(i, false, &self.style()))
                    .collect::<Vec<_>>()
                    .join("\n");
                write_stdout(&text)?;
            }
        }
        let style = self.style();
        if let (Some(card), Some(lint)) = (&report.card_text, &report.card) {
            let mut err = io::stderr().lock();
            for finding in &lint.findings {
                writeln!(err, "{}", render_finding(card, finding, &style))?;
            }
        }
        let mut err = io::stderr().lock();
        for f in &report.hub_findings {
            writeln!(
                err,
                "{}[{}]: {}\n  {} hf:{}@{}\n",
                style.severity(f.severity),
                f.code,
                style.bold(&f.message),
                style.dim("-->"),
                report.repo,
                report.commit
            )?;
        }
        if let Some(r) = &report.report {
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
        let summary = format!(
            "{} (commit {}): {} {}, {} {}; {} files, {} bytes; fetched {} bytes ({share:.4}%)",
            report.source,
            report.commit,
            errors,
            plural(errors, "error"),
            warnings,
            plural(warnings, "warning"),
            report.files,
            report.total_bytes,
            report.bytes_fetched,
        );
        writeln!(err, "{}", style.bold(&summary))
    }
}

/// The sweep as a table: per compared setting and context length, the KL and where top-1 flips.
fn render_sweep(doc: &serde_json::Value) -> String {
    let mut out = format!(
        "sweep of {} over {} (the same weights; baseline {}): KL in nats, forward KL(P_baseline || P_other), mean over positions\n\n",
        doc["knob"].as_str().unwrap_or("?"),
        doc["model"].as_str().unwrap_or("?"),
        doc["values"][0].as_str().unwrap_or("?"),
    );
    out.push_str("| other | context | positions | kld_mean | kld_p99 | kld_max | top-1 agreement | flips | first flips (block:position) |\n|---|---|---|---|---|---|---|---|---|\n");
    for pair in doc["pairs"].as_array().into_iter().flatten() {
        for run in pair["runs"].as_array().into_iter().flatten() {
            let first: Vec<String> = run["flips"]
                .as_array()
                .into_iter()
                .flatten()
                .take(5)
                .map(|f| format!("{}:{}", f["block"], f["position"]))
                .collect();
            let num = |k: &str| run[k].as_f64().map_or("-".into(), |v| format!("{v:.6}"));
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                pair["other"].as_str().unwrap_or("?"),
                run["context_length"],
                run["n_positions"],
                num("kld_mean"),
                num("kld_p99"),
                num("kld_max"),
                num("top1_agreement"),
                run["n_flips"],
                if first.is_empty() {
                    "none".into()
                } else {
                    first.join(", ")
                },
            ));
        }
    }
    if let Some(f) = doc["noise_floor_kld_mean"].as_f64() {
        out.push_str(&format!(
            "\ncross-kernel noise floor (largest kld_mean above): {f:.6} nats\n"
        ));
    }
    out
}

/// What `card` did: the card written, whether it was created or updated, and its lint counts.
pub struct CardWritten<'a> {
    pub card: &'a std::path::Path,
    pub created: bool,
    pub sha256: &'a str,
    pub measurement: &'a std::path::Path,
    pub lint: &'a LintReport,
    pub warnings: &'a [String],
}

/// What `sign` did: the envelope written and what it signs.
pub struct Signed<'a> {
    pub envelope: &'a std::path::Path,
    pub sha256: &'a str,
    pub file: &'a std::path::Path,
    pub keyid: &'a str,
    pub predicate_type: &'a str,
    pub subjects: usize,
}

/// What `reference export` did: the artifact written, its kind, digest and size.
pub struct Exported<'a> {
    pub artifact: &'a std::path::Path,
    /// `hidden`, `top_k` or `llamacpp`.
    pub kind: &'a str,
    pub sha256: &'a str,
    pub size: u64,
    /// `FILE.sha256` (absent for a llama.cpp base file, which has none).
    pub sidecar: Option<&'a std::path::Path>,
    /// Scored positions stored.
    pub rows: usize,
    /// What the artifact lets a verifier compute, in words (absent for a llama.cpp base file).
    pub bound: Option<&'a str>,
    /// The human line (on stderr).
    pub note: String,
}

impl Printer {
    /// `card`: the document (`--json`), and on stderr its warnings and what was written.
    pub fn card_written(&self, c: &CardWritten<'_>) -> io::Result<()> {
        if self.output.format == Format::Json {
            write_versioned(&json!({
                "card": c.card.display().to_string(),
                "action": if c.created { "created" } else { "updated" },
                "sha256": c.sha256,
                "measurement": c.measurement.display().to_string(),
                "lint": {"errors": c.lint.errors(), "warnings": c.lint.warnings()},
                "warnings": c.warnings,
            }))?;
        }
        for w in c.warnings {
            self.note(w);
        }
        self.note(&format!(
            "wrote {} (lint: {} errors, {} warnings)",
            c.card.display(),
            c.lint.errors(),
            c.lint.warnings()
        ));
        Ok(())
    }

    /// `sign`: the document (`--json`), and on stderr what was written.
    pub fn signed(&self, s: &Signed<'_>) -> io::Result<()> {
        if self.output.format == Format::Json {
            write_versioned(&json!({
                "envelope": s.envelope.display().to_string(),
                "sha256": s.sha256,
                "signed": s.file.display().to_string(),
                "keyid": s.keyid,
                "predicate_type": s.predicate_type,
                "subjects": s.subjects,
            }))?;
        }
        self.note(&format!(
            "wrote {} ({} subjects, keyid {})",
            s.envelope.display(),
            s.subjects,
            s.keyid
        ));
        Ok(())
    }

    /// `reference export`: the document (`--json`), and on stderr what was written.
    pub fn exported(&self, e: &Exported<'_>) -> io::Result<()> {
        if self.output.format == Format::Json {
            write_versioned(&json!({
                "artifact": e.artifact.display().to_string(),
                "kind": e.kind,
                "sha256": e.sha256,
                "size": e.size,
                "sidecar": e.sidecar.map(|p| p.display().to_string()),
                "rows": e.rows,
                "bound": e.bound,
            }))?;
        }
        self.note(&e.note);
        Ok(())
    }
}
