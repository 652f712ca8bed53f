//! `kld`: the measurement of two logit files, as a document or as the protocol in words and the
//! metric table; `--llamacpp-compat`, llama.cpp's own statistics.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write as _};

use cardproof::findings::Severity;
use cardproof::measure::Measurement;
use cardproof::measure::compat::CompatMeasurement;
use cardproof::measure::protocol::{Direction, Positions, Tail, VocabMode};
use cardproof::measure::stats::{Bucket, Diagnostics, Uncertainty};
use cardproof::output::measure::{CompatProtocol, Protocol};
use cardproof::output::{KldCompatDocument, KldDocument};

use super::{Printer, write_json, write_stdout};
use crate::commands::kld::Kld;

impl Printer {
    pub fn kld(&self, kld: &Kld) -> io::Result<()> {
        match kld {
            Kld::Measurement(m) => self.measurement(m),
            Kld::Compat(m) => self.compat(m),
        }
    }

    fn measurement(&self, m: &Measurement) -> io::Result<()> {
        if m.n_nonfinite > 0 {
            writeln!(
                io::stderr().lock(),
                "{}: {} row{} with non-finite logits (NaN or +inf) excluded, not averaged in",
                self.style().severity(Severity::Warning),
                m.n_nonfinite,
                if m.n_nonfinite == 1 { "" } else { "s" }
            )?;
        }
        if self.json() {
            return write_json(&KldDocument::new(m));
        }
        write_stdout(&render_measurement(m))
    }

    fn compat(&self, m: &CompatMeasurement) -> io::Result<()> {
        if self.json() {
            return write_json(&KldCompatDocument::new(m));
        }
        let protocol = CompatProtocol::of(&m.protocol).expect("llama.cpp's protocol reads back");
        let header = format!(
            "llama.cpp-compatible KLD: forward KL(P_base || P_cand) in nats, reference terms with \
             log p <= -16 dropped, second half of each {}-token window, {} rows; i.i.d. standard \
             errors\nprotocol_sha256: {}\n\n",
            protocol.context_length, m.n_positions, m.protocol_sha256
        );
        write_stdout(&(header + &m.llamacpp.render()))
    }
}

/// Plain-words descriptions of a protocol's direction, vocabulary terms and scored rows.
fn describe_protocol(
    direction: Direction,
    vocab: VocabMode,
    positions: Positions,
) -> (&'static str, String, String) {
    let direction = match direction {
        Direction::Forward => "forward KL(P_ref || P_cand)",
        Direction::Reverse => "reverse KL(P_cand || P_ref)",
        Direction::Both => "forward KL(P_ref || P_cand) and reverse KL(P_cand || P_ref)",
    };
    let vocab = match vocab {
        VocabMode::TopK { k, tail } => {
            let tail = match tail {
                Tail::Lumped => "lumped",
                Tail::Dropped => "dropped",
                Tail::Renormalized => "renormalized",
            };
            format!("reference top-{k} ({tail} tail)")
        }
        // As JSON writes the number (`-16.0`).
        VocabMode::Threshold { log_p } => format!(
            "reference terms with log p <= {} dropped",
            serde_json::Number::from_f64(log_p).map_or("null".into(), |n| n.to_string())
        ),
        VocabMode::Full => "full vocabulary".to_owned(),
    };
    let positions = match positions {
        Positions::Stride { stride, offset } => {
            format!("every row with j mod {stride} = {offset}")
        }
        Positions::SecondHalf => "second half of each window (llama.cpp)".to_owned(),
        Positions::From { from } => format!("rows j >= {from}"),
        Positions::All => "all rows".to_owned(),
    };
    (direction, vocab, positions)
}

fn render_measurement(m: &Measurement) -> String {
    let p = Protocol::of(&m.protocol).expect("a measurement's protocol reads back");
    let mut out = String::new();
    let (direction, vocab, positions) = describe_protocol(p.direction, p.vocab, p.positions);
    for (side, input) in [("reference", &m.reference), ("candidate", &m.candidate)] {
        let _ = writeln!(
            out,
            "{side}: {} ({}, {} rows × {})",
            input.path, input.format, input.rows, input.vocab
        );
    }
    let _ = writeln!(
        out,
        "protocol: {direction} in nats; {vocab} ({} entries, padding {}); {positions}; {} rows in {} window{}; mean over positions; {:.0}% block bootstrap ({} resamples, seed {}, blocks {})",
        p.vocab_size,
        p.padding,
        m.n_positions,
        m.n_windows,
        if m.n_windows == 1 { "" } else { "s" },
        p.bootstrap.level * 100.0,
        p.bootstrap.resamples,
        p.bootstrap.seed,
        p.bootstrap_block,
    );
    let _ = writeln!(out, "protocol_sha256: {}", m.protocol_sha256);
    if m.n_nonfinite > 0 {
        let _ = writeln!(
            out,
            "excluded: {} rows with non-finite logits",
            m.n_nonfinite
        );
    }
    render_results(
        &mut out,
        &m.metrics,
        &m.uncertainty,
        &m.low_support,
        &m.diagnostics,
    );
    out
}

/// A number that JSON can hold (a non-finite one is printed as `null`, and shown as missing).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The metric table and diagnostics of one result.
fn render_results(
    out: &mut String,
    metrics: &BTreeMap<String, f64>,
    uncertainty: &BTreeMap<String, Uncertainty>,
    low_support: &[String],
    diagnostics: &Diagnostics,
) {
    let _ = writeln!(
        out,
        "\n{:<20} {:>12} {:>12}  95% CI",
        "metric", "value", "± sem"
    );
    for name in cardproof::disclosure::vocabulary::METRICS {
        let Some(value) = metrics.get(*name).copied().and_then(finite) else {
            continue;
        };
        let u = uncertainty.get(*name);
        let sem = u
            .and_then(|u| u.sem)
            .and_then(finite)
            .map_or(String::new(), |s| format!("{s:.6}"));
        let ci = match u.map(|u| u.ci95.map(finite)) {
            Some([Some(a), Some(b)]) => format!("[{a:.6}, {b:.6}]"),
            _ => String::new(),
        };
        let mark = if low_support.iter().any(|l| l == name) {
            " *"
        } else {
            ""
        };
        let _ = writeln!(out, "{:<20} {:>12.6} {:>12}  {ci}{mark}", name, value, sem);
    }
    if !low_support.is_empty() {
        let _ = writeln!(
            out,
            "* low support: fewer than 100 rows beyond this percentile; its value is noise"
        );
    }
    let table = |out: &mut String, title: &str, buckets: &[Bucket]| {
        let _ = writeln!(
            out,
            "\n{title:<20} {:>8} {:>12} {:>10} {:>10}",
            "rows", "kld_mean", "flips", "flip rate"
        );
        for b in buckets {
            // The row and flip counts unpadded, as this table has always printed them.
            let _ = writeln!(
                out,
                "{:<20} {} {:>12} {} {:>10}",
                b.label,
                b.n,
                b.kld_mean
                    .and_then(finite)
                    .map_or("-".into(), |v| format!("{v:.6}")),
                b.top1_flips,
                b.flip_rate
                    .and_then(finite)
                    .map_or("-".into(), |v| format!("{v:.4}"))
            );
        }
    };
    table(out, "by depth (j / L)", &diagnostics.by_depth);
    table(out, "by ref. confidence", &diagnostics.by_confidence);
}
