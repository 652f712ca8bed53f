//! The output of the rerun commands (`measure`, `measure --sweep`, `verify`, `reference export`),
//! moved here unchanged from the one printer file; their rewrite (issue #15) makes these typed.

use std::io::{self, Write};

use serde_json::json;

use super::{Printer, write_stdout};
use crate::config::Format;

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
