//! The documents as text for people: what the binary's printer writes when `--json` is not
//! given. Each function renders one typed document; none reads JSON by key except the runners'
//! own model records, which are kept as the runners give them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::card::Card;
use crate::checkpoint::inspect::Inspection;
use crate::findings::{Finding, Severity};

use crate::kld::Measurement;
use crate::kld::protocol::{Direction, Positions, Tail, VocabMode};
use crate::kld::stats::{Bucket, Diagnostics, Uncertainty};
use crate::output::kld::Protocol;

/// Plain-words descriptions of a protocol's direction, vocabulary terms and scored rows.
pub fn describe_protocol(
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
        Positions::Role { role, .. } => {
            let every = match positions {
                Positions::Role {
                    stride: Some(s),
                    offset: Some(o),
                    ..
                } => format!(" with j mod {s} = {o}"),
                _ => String::new(),
            };
            format!(
                "rows predicting a token of a {} message{every}",
                role.as_str()
            )
        }
        Positions::Span { span, .. } => {
            let every = match positions {
                Positions::Span {
                    stride: Some(s),
                    offset: Some(o),
                    ..
                } => format!(" with j mod {s} = {o}"),
                _ => String::new(),
            };
            format!("rows predicting tokens of {} spans{every}", span.as_str())
        }
    };
    (direction, vocab, positions)
}

/// `kld`'s human output: the inputs, the protocol in words and the metric table.
pub fn kld_measurement(m: &Measurement) -> String {
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
    results(
        &mut out,
        &m.metrics,
        &m.uncertainty,
        &m.low_support,
        &m.diagnostics,
    );
    out
}

/// A number that JSON can hold (a non-finite one is printed as `null`, and shown as missing).
/// `text` broken at spaces into lines of at most `width` columns (a longer word stays whole), the
/// first line after `first`, the others after `rest`; each line ends with a newline.
pub fn wrap(text: &str, width: usize, first: &str, rest: &str) -> String {
    let mut out = String::new();
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split_whitespace() {
        let used = line.chars().count();
        if !empty && used + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_owned();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The metric table and diagnostics of one result.
pub fn results(
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
    for name in crate::disclosure::vocabulary::METRICS {
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

/// `measure`'s human output: what was run, then one table per context length.
#[cfg(feature = "native")]
pub fn measurement(doc: &crate::rerun::Measurement) -> String {
    let p = &doc.protocol;
    let mut out = String::new();
    let (direction, vocab, positions) = describe_protocol(p.direction, p.vocab, p.positions);
    for (side, m) in [("reference", &doc.reference), ("candidate", &doc.candidate)] {
        measured_model(&mut out, side, m);
    }
    measured_eval(&mut out, doc);
    measured_environment(&mut out, &doc.environment);
    let padding = match p.padding {
        crate::rerun::document::Padding::Excluded => "excluded",
        crate::rerun::document::Padding::Included => "included",
        crate::rerun::document::Padding::None => "none",
    };
    let _ = writeln!(
        out,
        "protocol: {direction} in nats; {vocab} ({} entries, padding {padding}); {positions}; {}; mean over positions; {:.0}% block bootstrap ({} resamples, seed {})",
        p.vocab_size,
        p.prefill_chunk.map_or_else(
            || "each window prefilled in one pass".to_owned(),
            |c| format!("prefilled in chunks of {c} tokens")
        ),
        p.bootstrap.level * 100.0,
        p.bootstrap.resamples,
        p.bootstrap.seed,
    );
    let _ = writeln!(out, "protocol_sha256: {}", doc.protocol_sha256);
    for run in &doc.runs {
        let _ = writeln!(
            out,
            "\n== context length {}: {} rows in {} windows (blocks {}){}",
            run.context_length,
            run.n_positions,
            run.n_windows,
            run.bootstrap_block,
            if run.n_nonfinite > 0 {
                format!("; {} rows with non-finite logits excluded", run.n_nonfinite)
            } else {
                String::new()
            }
        );
        let s = &run.summary;
        results(
            &mut out,
            &s.metrics,
            &s.uncertainty,
            &s.low_support,
            &s.diagnostics,
        );
        spans(&mut out, &run.spans);
    }
    if let Some(t) = &doc.turns {
        turns(&mut out, t);
    }
    out
}

/// The generated turns' statistics: one line per statistic with its interval and counts, the
/// recovery along the conversations.
pub fn turns(out: &mut String, t: &crate::rerun::turns::TurnsRecord) {
    let s = &t.summary;
    let interval = |u: &crate::kld::stats::Uncertainty| match u.ci95.map(finite) {
        [Some(a), Some(b)] => format!("[{a:.3}, {b:.3}]"),
        _ => "–".to_owned(),
    };
    let value = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.3}"));
    let _ = writeln!(
        out,
        "\n== turns: {} generated greedily by both models ({}, at most {} tokens each; calls read as {}; {} bootstrap blocks of one {})",
        s.turns,
        match t.protocol.turns {
            crate::conversation::turns::TurnSelection::All => "every assistant turn",
            crate::conversation::turns::TurnSelection::ToolCalls =>
                "the assistant turns that call tools",
        },
        t.protocol.max_new_tokens,
        t.call_format.map_or(
            "nothing (the template writes no call cardproof reads)",
            |f| f.as_str()
        ),
        s.bootstrap.blocks,
        match s.bootstrap.block {
            crate::kld::turns::Block::Conversation => "conversation",
            crate::kld::turns::Block::Turn => "turn",
        },
    );
    let f1 = &s.tool_call_f1;
    let valid = &s.tool_call_valid;
    let rows = [
        (
            "tool_call_f1",
            value(Some(f1.value)),
            interval(&f1.uncertainty),
            format!("tp {} fp {} fn {} tn {}", f1.tp, f1.fp, f1.fn_, f1.tn),
        ),
        (
            "tool_call_valid",
            value(valid.value),
            interval(&valid.uncertainty),
            format!(
                "{} of {} calls; invalid JSON {}, unknown name {}, schema mismatch {}",
                valid.valid,
                valid.calls,
                valid.invalid_json,
                valid.unknown_name,
                valid.schema_mismatch
            ),
        ),
        (
            "tool_call_match",
            value(s.tool_call_match.value),
            interval(&s.tool_call_match.uncertainty),
            format!(
                "{} of {} turns the reference called in",
                s.tool_call_match.hits, s.tool_call_match.of
            ),
        ),
        (
            "turn_match",
            value(s.turn_match.value),
            interval(&s.turn_match.uncertainty),
            format!(
                "{} of {} turns equal token for token",
                s.turn_match.hits, s.turn_match.of
            ),
        ),
    ];
    for (name, v, ci, counts) in rows {
        let _ = writeln!(out, "{name:<17} {v:>6}  {ci:<16} {counts}");
    }
    let d = &s.first_divergence;
    if d.turns > 0 {
        let _ = writeln!(
            out,
            "first divergence  {} turns differ: token {} (min) / {} (median) / {} (max)",
            d.turns,
            d.min.map_or("–".into(), |v| v.to_string()),
            value(d.median),
            d.max.map_or("–".into(), |v| v.to_string()),
        );
    }
    let r = &s.recovery;
    let _ = writeln!(
        out,
        "recovery          {} failing turns, {} recovered, {} not{}",
        r.failures,
        r.recoveries,
        r.unrecovered,
        r.last_unrecovered.map_or(String::new(), |at| format!(
            " (the last: conversation {}, message {})",
            at.conversation + 1,
            at.turn + 1
        )),
    );
}

/// One measured model's line: its path, architecture and weights (the schemes a native run
/// lists, or what the transformers engine loaded), then any emulated activation quantization.
#[cfg(feature = "native")]
fn measured_model(out: &mut String, side: &str, m: &crate::rerun::document::ModelRecord) {
    let runner = &m.runner;
    let counts = |key: &str| -> Vec<String> {
        runner[key]
            .as_object()
            .map(|w| w.iter().map(|(k, v)| format!("{k} ×{v}")).collect())
            .unwrap_or_default()
    };
    let weights = counts("weights");
    // Native runs list the weight schemes; transformers runs what the engine loaded.
    let detail = if weights.is_empty() {
        let mut parts = vec![format!(
            "{} weights, attention {}",
            runner["param_dtype"].as_str().unwrap_or("?"),
            runner["attention"].as_str().unwrap_or("?")
        )];
        if let Some(q) = runner["quant_method"].as_str() {
            parts.push(format!("quantization {q}"));
        }
        parts.join(", ")
    } else {
        weights.join(", ")
    };
    let _ = writeln!(
        out,
        "{side}: {} ({}; {detail})",
        m.path,
        runner["architecture"].as_str().unwrap_or("?"),
    );
    let acts = counts("activation_emulation");
    if !acts.is_empty() {
        let _ = writeln!(
            out,
            "  emulated activation quantization: {}",
            acts.join(", ")
        );
    }
}

/// The eval text's line, and the conversations' line when the eval was rendered from them.
#[cfg(feature = "native")]
fn measured_eval(out: &mut String, doc: &crate::rerun::Measurement) {
    let ev = &doc.eval;
    let _ = writeln!(
        out,
        "eval: {} ({} tokens, tokens_sha256 {}, BOS {})",
        ev.text_path
            .as_deref()
            .unwrap_or(&doc.fidelity.eval.text.source),
        ev.token_count,
        ev.tokens_sha256,
        ev.bos.as_str()
    );
    if let Some(c) = &ev.conversation {
        let t = &c.template;
        let _ = writeln!(
            out,
            "  {} conversation{}, {} messages, rendered with chat template {}{} ({}; sha256 {}; rendered_sha256 {}); tokens: {}",
            c.conversations,
            if c.conversations == 1 { "" } else { "s" },
            c.messages,
            t.path,
            t.name
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default(),
            match t.from {
                crate::conversation::eval::TemplateFrom::File => "a file",
                crate::conversation::eval::TemplateFrom::Reference => "the reference's",
                crate::conversation::eval::TemplateFrom::Candidate => "the candidate's",
            },
            t.sha256,
            c.rendered_sha256,
            c.segment_tokens
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The runner's line (engine, dtypes, KV cache, device), then the transformers runner's timings
/// and the linear-attention settings where there are any.
#[cfg(feature = "native")]
fn measured_environment(out: &mut String, e: &crate::rerun::document::Environment) {
    let where_ = match e.threads {
        Some(t) => format!("{t} threads, {}", e.device),
        None => e.device.clone(),
    };
    let _ = writeln!(
        out,
        "runner: {} ({} {}), {} compute{}{}, {where_}",
        e.runner.as_str(),
        e.engine,
        e.engine_version.as_deref().unwrap_or("?"),
        e.compute_dtype,
        e.recurrent_state_dtype
            .as_ref()
            .map(|d| format!(", {d} recurrent state"))
            .unwrap_or_default(),
        kv_cache_detail(e),
    );
    if let Some(t) = e.transformers_runner.as_ref().and_then(|r| {
        r.other
            .get("timings_s")
            .and_then(|t| t.as_object())
            .map(|t| (r, t))
    }) {
        let (r, t) = t;
        let secs = |k: &str| t.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        let _ = writeln!(
            out,
            "  attention {}, prefill chunk {}, reduction {}; load {:.1} s, warm-up {:.1} s, prefill {:.1} s, head and reduction {:.1} s, gates {:.1} s",
            e.attention,
            r.chunk_size.map_or("null".into(), |c| c.to_string()),
            r.other
                .get("reduction_kernel")
                .and_then(|k| k.as_str())
                .unwrap_or("?"),
            secs("load"),
            secs("warmup"),
            secs("prefill"),
            secs("head_and_reduce"),
            secs("gates"),
        );
    }
    if let Some(la) = &e.linear_attention {
        let _ = writeln!(out, "  linear attention: {}", la.summary());
    }
    if let Some(la) = &e.reference_linear_attention {
        let _ = writeln!(out, "  reference's linear attention: {}", la.summary());
    }
}

/// The KV cache, where it is not simply the compute dtype: `, KV cache …` with its rotation and
/// computed scales, else empty.
#[cfg(feature = "native")]
fn kv_cache_detail(e: &crate::rerun::document::Environment) -> String {
    e.kv_cache_dtype
        .as_ref()
        .filter(|k| **k != e.compute_dtype)
        .map(|k| {
            let rotated = e.kv_cache.as_ref().and_then(|c| c.rotation)
                == Some(crate::disclosure::kv_cache::KvRotation::Hadamard);
            let rotated = if rotated {
                " (Hadamard-rotated, llama.cpp's)"
            } else {
                ""
            };
            let computed = e
                .kv_scales
                .as_ref()
                .map(|s| {
                    format!(
                        " (scales computed from the first {} tokens, vLLM's calculate_kv_scales)",
                        s.tokens
                    )
                })
                .unwrap_or_default();
            format!(", KV cache {k}{rotated}{computed}")
        })
        .unwrap_or_default()
}

/// The per-span table of a conversation run: each segment's, role's and inside/outside
/// tool-call rows with their mean KL (and its interval), top-1 agreement and flips.
#[cfg(feature = "native")]
pub fn spans(out: &mut String, spans: &[crate::rerun::spans::SpanSummary]) {
    if spans.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n{:<22} {:>8} {:>10}  {:<22} {:>9} {:>7}",
        "by span", "rows", "kld_mean", "95% CI", "top1_agr", "flips"
    );
    for s in spans {
        let metric = |k: &str| s.metrics.get(k).copied().and_then(finite);
        let ci = match s.uncertainty.get("kld_mean").map(|u| u.ci95.map(finite)) {
            Some([Some(a), Some(b)]) => format!("[{a:.6}, {b:.6}]"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<22} {:>8} {:>10} {:<22} {:>9} {:>7}",
            format!("{} {}", s.by.replace('_', "-"), s.name),
            s.n_positions,
            metric("kld_mean").map_or("-".into(), |v| format!("{v:.6}")),
            format!(" {ci}"),
            metric("top1_agreement").map_or("-".into(), |v| format!("{v:.4}")),
            s.top1_flips
        );
    }
}

/// A study's generated turns: per arm, how its turns compare with the reference's, and the
/// arms against each other on the same turns.
fn study_turns(out: &mut String, d: &crate::study::document::StudyDocument) {
    if d.arms.iter().all(|a| a.turns.is_none()) {
        return;
    }
    let share = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.3}"));
    let interval = |u: &crate::kld::stats::Uncertainty| {
        if u.ci95.iter().all(|x| x.is_finite()) {
            format!("[{:.3}, {:.3}]", u.ci95[0], u.ci95[1])
        } else {
            "-".to_owned()
        }
    };
    // A conversation beside the eval text is named (the eval text is named on the first line).
    let source = d
        .turns
        .as_ref()
        .and_then(|t| t.conversation.as_ref())
        .map_or(String::new(), |c| {
            format!(" (the conversation file {}, sha256 {})", c.path, c.sha256)
        });
    let _ = writeln!(
        out,
        "\n== turns generated greedily against the reference's{source}\n{:<18} {:>6} {:>10} {:>16} {:<14} {:>15} {:>12} {:>9} {:>10} {:>11}",
        "arm",
        "turns",
        "turn_match",
        "tool_call_match",
        "95% CI",
        "tool_call_valid",
        "tool_call_f1",
        "failures",
        "recovered",
        "unrecovered"
    );
    for a in &d.arms {
        let Some(t) = &a.turns else { continue };
        let _ = writeln!(
            out,
            "{:<18} {:>6} {:>10} {:>16} {:<14} {:>15} {:>12} {:>9} {:>10} {:>11}",
            a.name,
            t.turns,
            share(t.turn_match.value),
            share(t.tool_call_match.value),
            interval(&t.tool_call_match.uncertainty),
            share(t.tool_call_valid.value),
            share(Some(t.tool_call_f1.value)),
            t.recovery.failures,
            t.recovery.recoveries,
            t.recovery.unrecovered,
        );
    }
    if !d.turn_comparisons.is_empty() {
        let _ = writeln!(
            out,
            "\npaired on the same turns: turns only A holds / only B holds, exact McNemar p (turn match; tool-call match)"
        );
        for c in &d.turn_comparisons {
            let (t, m) = (&c.comparison.turn_match, &c.comparison.tool_call_match);
            let _ = writeln!(
                out,
                "  {:<16} vs {:<16} {:>4} / {:<4} p {:<8.4} {:>4} / {:<4} p {:.4}",
                c.a, c.b, t.a_only, t.b_only, t.mcnemar_p, m.a_only, m.b_only, m.mcnemar_p
            );
        }
    }
}

/// `study`'s human output: per context length, the arms' table and the paired comparisons.
#[cfg(feature = "native")]
pub fn study(d: &crate::study::document::StudyDocument) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "study {}: {} arms against {} ({} tokens, {} runner; protocol_sha256 {})",
        d.name,
        d.arms.len(),
        d.reference.path,
        d.eval.token_count,
        d.runner,
        d.protocol_sha256
    );
    let arm_seconds: f64 = d.arms.iter().map(|a| a.seconds).sum();
    let reference = d
        .timings
        .reference_seconds
        .map_or_else(|| "run beside each arm".to_owned(), |s| format!("{s:.1} s"));
    let _ = writeln!(
        out,
        "time: reference pass {reference}, arms {arm_seconds:.1} s, total {:.1} s",
        d.timings.total_seconds
    );
    let num = |v: Option<f64>, digits: usize| {
        v.filter(|x| x.is_finite())
            .map_or("-".to_owned(), |x| format!("{x:.digits$}"))
    };
    for (run_index, &length) in d.protocol.context_lengths.iter().enumerate() {
        let tool_calls = d.arms.iter().any(|a| {
            a.runs
                .get(run_index)
                .is_some_and(|r| r.tool_call_flips.is_some())
        });
        let _ = writeln!(
            out,
            "\n== context length {length}\n{:<18} {:<16} {:>7} {:>10}  {:<22} {:>9} {:>8} {:>7}{} {:>9} {:>7}",
            "arm",
            "changes",
            "bits/w",
            "kld_mean",
            "95% CI",
            "kld_p99",
            "top1_agr",
            "flips",
            if tool_calls { "  in calls" } else { "" },
            "ppl_ratio",
            "seconds"
        );
        for a in &d.arms {
            let Some(r) = a.runs.get(run_index) else {
                continue;
            };
            let m = |k: &str| r.metrics.get(k).copied();
            let ci = match r.uncertainty.get("kld_mean").map(|u| u.ci95) {
                Some([lo, hi]) if lo.is_finite() && hi.is_finite() => {
                    format!("[{lo:.6}, {hi:.6}]")
                }
                _ => String::new(),
            };
            let changes = if a.mixed {
                format!(
                    "{} (mixed)",
                    a.changed
                        .iter()
                        .map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join("+")
                )
            } else {
                a.changes.as_str().to_owned()
            };
            let _ = writeln!(
                out,
                "{:<18} {:<16} {:>7} {:>10}  {:<22} {:>9} {:>8} {:>7}{} {:>9} {:>7}",
                a.name,
                changes,
                num(a.bits_per_weight, 2),
                num(m("kld_mean"), 6),
                ci,
                num(m("kld_p99"), 5),
                num(m("top1_agreement"), 4),
                r.top1_flips,
                if tool_calls {
                    format!(
                        "{:>10}",
                        r.tool_call_flips.map_or("-".into(), |n| n.to_string())
                    )
                } else {
                    String::new()
                },
                num(m("ppl_ratio"), 5),
                format!("{:.1}", a.seconds)
            );
        }
        let pairs: Vec<_> = d
            .comparisons
            .iter()
            .filter(|c| c.context_length == length)
            .collect();
        if !pairs.is_empty() {
            let _ = writeln!(
                out,
                "\npaired on the same rows: mean(KL_A - KL_B), 95% CI, and the smallest difference this sample detects"
            );
            for c in pairs {
                let _ = writeln!(
                    out,
                    "  {:<16} vs {:<16} {:>+11.6} [{:+.6}, {:+.6}]  A is {:<20} mde {:.2e}",
                    c.a,
                    c.b,
                    c.difference,
                    c.ci95[0],
                    c.ci95[1],
                    c.verdict.as_str(),
                    c.mde
                );
            }
        }
    }
    study_turns(&mut out, d);
    out
}

/// `verify`'s human output: the verdict, what was verified, one line per claim (with the reason
/// when it is not reproduced), the gates and the noise floor.
#[cfg(feature = "native")]
/// `verify` of a card's listed files: one line per file.
pub fn files_summary(s: &crate::verify::FilesSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "verdict: {}  ({} files)",
        s.verdict.as_str(),
        s.files.len()
    );
    let width = s
        .files
        .iter()
        .map(|f| f.file.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(out, "{:<width$}  {:<14}  report set", "file", "verdict");
    for f in &s.files {
        let _ = writeln!(
            out,
            "{:<width$}  {:<14}  {}",
            f.file,
            f.verdict.as_str(),
            f.out
        );
    }
    out
}

pub fn verification(r: &crate::verify::Report) -> String {
    use crate::verify::claims::Verdict;
    let mut out = String::new();
    let counts: Vec<String> = Verdict::ALL
        .iter()
        .map(|v| (v.as_str(), r.summary.get(v.as_str()).copied().unwrap_or(0)))
        .filter(|(k, n)| *k == "reproduced" || *n > 0)
        .map(|(k, n)| format!("{n} {}", k.replace('_', " ")))
        .collect();
    let _ = writeln!(
        out,
        "verdict: {}  ({})",
        r.verdict.as_str(),
        counts.join(", ")
    );
    let _ = writeln!(out, "card: {}", r.card.path);
    let _ = writeln!(
        out,
        "checkpoint: {} (root sha256 {})",
        r.checkpoint.path, r.checkpoint.root_sha256
    );
    if let Some(source) = &r.reference_source {
        let _ = writeln!(out, "reference: {source}");
    }
    let _ = writeln!(
        out,
        "\n{:<18} {:>6} {:>12} {:>13} {:>10} {:>10}  verdict",
        "metric", "ctx", "claimed", "rerun", "rel. diff", "tolerance"
    );
    use crate::disclosure::precision::{percent_text, relative_difference, rerun_text};
    let mut previous = None;
    for c in &r.claims {
        let rerun = c.rerun.filter(|v| v.is_finite());
        let _ = writeln!(
            out,
            "{:<18} {:>6} {:>12} {:>13} {:>10} {:>10}  {}",
            c.metric,
            c.context_length.map_or("-".into(), |l| l.to_string()),
            c.claimed_text,
            rerun.map_or("-".into(), |v| rerun_text(&c.claimed_text, v)
                .unwrap_or_else(|| crate::report::format_number(v, 6))),
            match (c.claimed, rerun) {
                (Some(a), Some(b)) => relative_difference(a, b).map_or("-".into(), percent_text),
                _ => "-".into(),
            },
            c.tolerance
                .filter(|v| v.is_finite())
                .map_or("-".into(), |v| format!("{v:.1e}")),
            c.verdict.as_str(),
        );
        if c.verdict != Verdict::Reproduced {
            // One explanation per run of claims that share it, not the same lines per claim.
            let explained = previous.is_some_and(|p: &crate::verify::claims::ClaimResult| {
                p.verdict == c.verdict && p.reason == c.reason && p.differences == c.differences
            });
            if explained {
                let _ = writeln!(out, "    (the same reason as above)");
            } else {
                let _ = writeln!(out, "    {}", c.reason);
                for d in &c.differences {
                    let _ = writeln!(out, "    - {d}");
                }
            }
        }
        previous = Some(c);
    }
    if !r.claims.is_empty() {
        let _ = writeln!(
            out,
            "(rerun: one digit finer than the claim as written; rel. diff = (rerun - claimed) / |claimed|)"
        );
    }
    if !r.undisclosed.is_empty() {
        let _ = writeln!(
            out,
            "\nundisclosed ({} item{}; every claim is undisclosed until the card gives them):",
            r.undisclosed.len(),
            if r.undisclosed.len() == 1 { "" } else { "s" }
        );
        for item in &r.undisclosed {
            out.push_str(&wrap(item, 100, "  - ", "    "));
        }
    }
    let gates: Vec<String> = r
        .sanity
        .iter()
        .map(|g| format!("{} {}", g.gate, if g.passed { "passed" } else { "FAILED" }))
        .collect();
    if !gates.is_empty() {
        let _ = writeln!(out, "\nsanity gates: {}", gates.join(", "));
    }
    if let Some(e) = r.measurement.as_ref().map(|m| &m.environment) {
        if let Some(la) = &e.linear_attention {
            let _ = writeln!(out, "rerun's linear attention: {}", la.summary());
        }
        if let Some(la) = &e.reference_linear_attention {
            let _ = writeln!(out, "rerun's reference linear attention: {}", la.summary());
        }
    }
    if let Some(crate::rerun::NoiseFloor::Measured { what, runs }) = &r.noise_floor {
        for run in runs {
            let metric = |k: &str| run.metrics.get(k).copied().unwrap_or(f64::NAN);
            let _ = writeln!(
                out,
                "noise floor ({what}), context {}: kld_mean {:.3e}, top1_agreement {:.4}",
                run.context_length,
                metric("kld_mean"),
                metric("top1_agreement"),
            );
        }
    }
    out
}

/// The sweep as a table: per compared setting and context length, the KL and where top-1 flips.
#[cfg(feature = "native")]
pub fn sweep(doc: &crate::rerun::sweep::Sweep) -> String {
    let mut out = format!(
        "sweep of {} over {} (the same weights; baseline {}): KL in nats, forward KL(P_baseline || P_other), mean over positions\n\n",
        doc.knob,
        doc.model,
        doc.values.first().map_or("?", String::as_str),
    );
    out.push_str("| other | context | positions | kld_mean | kld_p99 | kld_max | top-1 agreement | flips | first flips (block:position) |\n|---|---|---|---|---|---|---|---|---|\n");
    let num = |v: Option<f64>| {
        v.filter(|v| v.is_finite())
            .map_or("-".into(), |v| format!("{v:.6}"))
    };
    for pair in &doc.pairs {
        for run in &pair.runs {
            let first: Vec<String> = run
                .flips
                .iter()
                .take(5)
                .map(|f| format!("{}:{}", f.block, f.position))
                .collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                pair.other,
                run.context_length,
                run.n_positions,
                num(run.kld_mean),
                num(run.kld_p99),
                num(run.kld_max),
                num(run.top1_agreement),
                run.n_flips,
                if first.is_empty() {
                    "none".into()
                } else {
                    first.join(", ")
                },
            );
        }
    }
    if let Some(f) = doc.noise_floor_kld_mean.filter(|f| f.is_finite()) {
        let _ = writeln!(
            out,
            "\ncross-kernel noise floor (largest kld_mean above): {f:.6} nats"
        );
    } else if let Some(f) = doc.largest_kld_mean.filter(|f| f.is_finite()) {
        let _ = writeln!(
            out,
            "\nlargest {} effect (largest kld_mean above): {f:.6} nats; not a noise floor (that is the lane's repeat or kernel control)",
            if doc.knob == "kv_cache" || doc.knob == "llamacpp.kv" {
                "KV-cache"
            } else {
                "setting's"
            }
        );
    }
    out
}

/// ANSI styling for text on a terminal (`on: false`: plain text, for `NO_COLOR` and pipes).
pub struct Style {
    pub on: bool,
}

impl Style {
    pub fn paint(&self, code: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
    pub fn severity(&self, s: Severity) -> String {
        match s {
            Severity::Error => self.paint("1;31", "error"),
            Severity::Warning => self.paint("1;33", "warning"),
        }
    }
    pub fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }
    pub fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }
}

/// A lint finding with its place and the offending line (lint and check).
pub fn finding(card: &Card, finding: &Finding, style: &Style) -> String {
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

pub fn snippet(line_text: &str, line: usize, column: usize, width: usize, style: &Style) -> String {
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

/// The human summary of every inspection (`inspect`, and `check` on stdout).
pub fn inspections(inspections: &[Inspection], list_modules: bool, style: &Style) -> String {
    inspections
        .iter()
        .map(|i| inspection(i, list_modules, style))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each inspection in one or two lines (what `check` shows on success): its format, files,
/// tensors and parameters, and the quantization its config declares.
pub fn inspection_summaries(inspections: &[Inspection], style: &Style) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for i in inspections {
        let title = match &i.variant {
            Some(v) => format!("{} variant `{v}`", i.format),
            None => i.format.to_owned(),
        };
        let bytes: u64 = i.files.iter().map(|f| f.size).sum();
        let _ = write!(
            out,
            "{}: {} file{}, {bytes} bytes, {} tensors, {} parameters",
            style.bold(&title),
            i.files.len(),
            if i.files.len() == 1 { "" } else { "s" },
            i.tensor_count,
            i.parameter_count
        );
        match &i.declared {
            Some(d) => {
                let _ = writeln!(out, "; declared {} ({})", d.method, d.source);
            }
            None => {
                let _ = writeln!(out);
            }
        }
    }
    out
}

fn inspection(i: &Inspection, list_modules: bool, style: &Style) -> String {
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
                crate::checkpoint::inspect::Status::Quantized => "quantized",
                crate::checkpoint::inspect::Status::HighPrecision => "high_precision",
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
