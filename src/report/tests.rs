use serde_json::{Value, json};

use super::*;

/// report.md of a report document (the tests write reports as JSON and read them as `verify`'s
/// typed report, as `verify-report` readers do).
fn render_markdown(report: &Value) -> crate::error::Result<String> {
    crate::verify::view::render_markdown(&typed(report))
}

fn render_html(report: &Value, rows: &[RunRows]) -> crate::error::Result<String> {
    crate::verify::view::render_html(&typed(report), rows)
}

fn typed(report: &Value) -> crate::verify::Report {
    serde_path_to_error::deserialize(report.clone())
        .unwrap_or_else(|e| panic!("the test's report is not a report: {e}"))
}

const ROOT: &str = "5f1c0a1e9d2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5";
const PROTO: &str = "0d8e2f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e";
const TOKENS: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
const MODEL_FILE: &str = "9999888877776666555544443333222211110000aaaabbbbccccddddeeeeffff";

/// A full report as `verify` writes it: one reproduced, one not reproduced and one
/// not-comparable claim.
fn sample() -> Value {
    json!({
        "schema_version": 1,
        "run_id": "5f0c2a9e-3b1d-4c7a-9e2f-8d6b1a4c3e70",
        "tool": {"name": "cardproof", "version": "0.1.0"},
        "verdict": "not_reproduced",
        "summary": {"reproduced": 1, "not_reproduced": 1, "not_comparable": 1, "undisclosed": 0},
        "checkpoint": {
            "path": "examples/models/tiny-fp8",
            "root_sha256": ROOT,
            "files": [
                {"path": "config.json", "size": 612, "sha256": "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"},
                {"path": "model.safetensors", "size": 16_777_344u64, "sha256": MODEL_FILE}
            ]
        },
        "card": {
            "path": "examples/models/tiny-fp8/README.md",
            "fidelity_sha256": "9d".repeat(32),
            "disclosure": {
                "schema": "cardproof/v1",
                "runtime": {"engine": "vllm", "engine_version": "0.11.1", "device": "NVIDIA RTX PRO 6000"},
                "protocol": {"context_lengths": [256], "kl": {"direction": "forward", "units": "nats"}},
                "results": [{"metric": "kld_mean", "value": 0.01648, "uncertainty": 0.00091, "context_length": 256}]
            },
            "lint": {"errors": 0, "warnings": 1, "findings": [
                {"code": "calibration-undisclosed", "severity": "warning", "message": "`calibration` is missing: the calibration data cannot be checked for overlap", "line": 12}
            ]}
        },
        "reference": model_record("examples/models/tiny-bf16"),
        "measurement": {
            "schema_version": 1,
            "protocol": {"direction": "both", "units": "nats", "vocab": {"mode": "full"}, "padding": "none",
                         "vocab_size": 2048, "positions": {"policy": "all"}, "context_lengths": [256],
                         "aggregation": "mean_over_positions", "llamacpp_compat": false,
                         "bos": "none", "bootstrap": {"resamples": 1000, "seed": 0, "level": 0.95},
                         "bootstrap_block": "window", "top1": "first index of the maximum",
                         "windows": "non-overlapping"},
            "protocol_sha256": PROTO,
            "reference": model_record("examples/models/tiny-bf16"),
            "candidate": model_record("examples/models/tiny-fp8"),
            "eval": {"text_path": "examples/eval/wiki.txt", "text_sha256": "ef".repeat(32), "text_bytes": 40_000,
                     "tokens_sha256": TOKENS, "token_count": 11033, "bos": "none"},
            "environment": {"runner": "native", "runner_version": "0.1.0", "engine": "candle", "engine_version": "0.11",
                            "device": "cpu: AMD EPYC", "compute_dtype": "f32", "attention": "eager", "kv_cache_dtype": null,
                            "threads": 2, "lane": "reference semantics: the quantization error without any engine's kernels"},
            "runs": [{
                "context_length": 256, "n_windows": 43, "n_positions": 10965, "n_nonfinite": 0, "dropped_tokens": 25,
                "bootstrap_block": "window",
                "metrics": {"kld_mean": 0.016476123456789, "kld_p99": 0.0960012, "kld_p999": 0.31, "kld_max": 1.2345678,
                            "kld_reverse_mean": 0.0171, "top1_agreement": 0.93, "ppl_ref": 412.3456, "ppl_cand": 420.9, "ppl_ratio": 1.0207},
                "uncertainty": {"kld_mean": {"sem": 0.000_213_4, "ci95": [0.0156, 0.0174]},
                                "kld_p99": {"ci95": [0.09, 0.1]},
                                "top1_agreement": {"sem": 0.0024, "ci95": [0.925, 0.935]}},
                "low_support": ["kld_p999"],
                "diagnostics": {
                    "by_depth": [{"label": "0/8–1/8", "n": 1376, "kld_mean": 0.0213, "top1_flips": 80, "flip_rate": 0.05814},
                                 {"label": "1/8–2/8", "n": 1376, "kld_mean": 0.0151, "top1_flips": 70, "flip_rate": 0.0509}],
                    "by_confidence": [{"label": "[0.00, 0.25)", "n": 3000, "kld_mean": 0.03, "top1_flips": 500, "flip_rate": 0.1667},
                                      {"label": "[0.95, 1.00]", "n": 0, "kld_mean": null, "top1_flips": 0, "flip_rate": null}]
                }
            }],
            "definitions": {"kld": "forward KL(P_ref || P_cand) = sum_i p_ref(i) (log p_ref(i) - log p_cand(i)), nats, per row",
                            "ci95": "percentile interval of the block bootstrap"},
            "fidelity": fidelity_draft(),
        },
        "claims": [
            {"index": 0, "metric": "kld_mean", "context_length": 256, "claimed": 0.01648, "claimed_text": "0.01648", "claimed_uncertainty": 0.00091,
             "rerun": 0.016476123456789, "rerun_ci95": [0.0156, 0.0174], "tolerance": 2.2e-5,
             "verdict": "reproduced", "reason": "equal within the claim's printed precision", "differences": []},
            {"index": 1, "metric": "top1_agreement", "context_length": 256, "claimed": 0.9810, "claimed_text": "0.9810", "claimed_uncertainty": null,
             "rerun": 0.93, "rerun_ci95": [0.925, 0.935], "tolerance": 0.00098,
             "verdict": "not_reproduced", "reason": "outside the claim's printed precision: |rerun - claim| = 0.051 <= 0.00098 fails (±5.0e-5)",
             "differences": []},
            {"index": 2, "metric": "kld_p99", "context_length": 256, "claimed": 0.09, "claimed_text": "", "rerun": 0.0960012, "rerun_ci95": [0.09, 0.1],
             "tolerance": 0.005, "verdict": "not_comparable", "reason": "a different lane",
             "differences": ["engine: card says vllm 0.11.1, rerun is cardproof native", "device: card says NVIDIA RTX PRO 6000, rerun is cpu"]}
        ],
        "sanity": [
            {"gate": "self_compare", "passed": true, "detail": "reference against itself: KLD exactly 0"},
            {"gate": "shifted", "passed": true, "detail": "one-row shift: KLD 7.9 nats"}
        ],
        "noise_floor": null,
        "undisclosed": [],
        "lane_differences": []
    })
}

fn model_record(path: &str) -> Value {
    json!({"path": path, "format": "safetensors", "manifest_sha256": "ab".repeat(32),
           "lm_head_sha256": "cd".repeat(32), "stored_dtype": "bf16", "runner": {"dtype": "bf16"}})
}

/// A measurement's ready `fidelity` block (not shown in the report; the document needs it).
fn fidelity_draft() -> Value {
    json!({"schema": "cardproof/v1",
        "reference": {"format": "safetensors", "dtype": "bf16", "files_sha256": "ab".repeat(32)},
        "candidate": {"files_sha256": ROOT},
        "runtime": {"engine": "cardproof", "engine_version": "0.1.0", "attention_backend": "eager",
                    "kv_cache_dtype": "f32", "compute_dtype": "f32", "device": "cpu: AMD EPYC", "device_count": 1},
        "eval": {"text": {"source": "wiki.txt", "sha256": "ef".repeat(32)},
                 "tokens": {"count": 11033, "sha256": TOKENS}, "bos": "none"},
        "protocol": {"context_lengths": [256], "positions": {"policy": "all"},
                     "kl": {"direction": "both", "units": "nats"}, "vocab": {"mode": "full", "padding": "excluded"},
                     "aggregation": {"statistic": "mean_over_positions", "uncertainty": {"method": "block_bootstrap",
                         "level": 0.95, "resamples": 1000, "seed": 0, "block": "window"}}},
        "results": []})
}

fn sample_rows() -> Vec<RunRows> {
    let mut position = Vec::new();
    let mut kld = Vec::new();
    let mut flip = Vec::new();
    for w in 0..3u64 {
        for j in 0..255u64 {
            position.push(j);
            kld.push(0.01 + 0.001 * ((j * 7 + w) % 13) as f64);
            flip.push(j % 50 == 3 && (w == 0 || j == 53));
        }
    }
    vec![RunRows {
        context_length: 256,
        position,
        kld,
        flip,
        ..RunRows::default()
    }]
}

const HOSTILE: &str = "<script>alert(1)</script> [x](javascript:alert(1)) ![i](http://e.x/i.png) | a | b |\n# heading\r\nhttps://evil.example www.evil.example";

fn hostile() -> Value {
    let mut r = sample();
    r["checkpoint"]["path"] = json!(HOSTILE);
    r["card"]["path"] = json!(HOSTILE);
    r["card"]["disclosure"]["runtime"]["engine"] = json!(HOSTILE);
    r["card"]["disclosure"][HOSTILE] = json!(HOSTILE);
    r["claims"][0]["metric"] = json!(HOSTILE);
    r["claims"][0]["reason"] = json!(HOSTILE);
    r["claims"][2]["differences"][0] = json!(HOSTILE);
    r["card"]["lint"]["findings"][0]["message"] = json!(HOSTILE);
    r["measurement"]["environment"]["device"] = json!(HOSTILE);
    r["checkpoint"]["files"][0]["path"] = json!(HOSTILE);
    r
}

#[test]
fn markdown_has_the_key_content() {
    let md = render_markdown(&sample()).unwrap();
    assert!(md.contains("Verdict: NOT REPRODUCED"), "{md}");
    assert!(md.contains("**1** reproduced"));
    assert!(md.contains("**1** not reproduced"));
    // Each claim row, with the claim as printed and the rerun with its interval.
    // The claim as the card wrote it (its trailing zero kept), the rerun one digit finer, the
    // relative difference.
    assert!(md.contains(
        "| `kld_mean` | 256 | 0.01648 ± 0.00091 | 0.016476 | -0.024% | [0.0156, 0.0174] |"
    ));
    assert!(md.contains("| `top1_agreement` | 256 | 0.9810 | 0.93000 | -5.2% | [0.925, 0.935] |"));
    // Without the claim's text (an older report.json): the number, six significant digits.
    assert!(md.contains("| `kld_p99` | 256 | 0.09 | 0.0960012 | +6.7% | [0.09, 0.1] |"));
    assert!(md.contains("Relative difference = (rerun − claimed) / |claimed|."));
    // Reasons read raw: no entity, no backslash before plain punctuation; only the pipes (which
    // would end nothing outside a table, but stay escaped) carry one.
    assert!(
        md.contains("outside the claim's printed precision: \\|rerun - claim\\| = 0.051 <= 0.00098 fails (±5.0e-5)"),
        "{md}"
    );
    assert!(!md.contains("&lt;"), "{md}");
    assert!(!md.contains("\\("), "{md}");
    assert!(md.contains("✅ reproduced"));
    assert!(md.contains("❌ not reproduced"));
    assert!(md.contains("⚠️ not comparable"));
    assert!(md.contains("  - engine: card says vllm 0.11.1, rerun is cardproof native"));
    // Protocol words and digests.
    for word in [
        "forward",
        "reverse",
        "KL(P_ref ‖ P_cand)",
        "full vocabulary",
        "2048 logit entries",
        "every row j",
        "256 tokens",
        "BOS",
        "1000 resamples, seed 0",
        PROTO,
        TOKENS,
        ROOT,
        MODEL_FILE,
        "reference semantics",
        "`self_compare`",
    ] {
        assert!(md.contains(word), "missing {word:?} in\n{md}");
    }
    // Metric table with low support marked, diagnostics, definitions.
    assert!(md.contains("| `kld_p999` [^low] | 0.31 |"));
    assert!(md.contains("[^low]: Low support"));
    assert!(md.contains("| `kld_mean` | 0.01648 | 0.00021 | [0.0156, 0.0174] |"));
    assert!(md.contains("| 0/8–1/8 | 1376 | 0.0213 | 80 | 0.0581 |"));
    assert!(md.contains("| \\[0.95, 1.00\\] | 0 | – | 0 | – |"));
    // The noise floor, when measured, is a table of named metrics, not a JSON blob.
    let mut r = sample();
    r["noise_floor"] = json!({"what": "the reference against itself, computed in f64 vs f32",
        "runs": [{"context_length": 256, "metrics": {"kld_mean": 3.616e-12, "top1_agreement": 1.0, "zz_extra": 2.5}}]});
    let nf = render_markdown(&r).unwrap();
    assert!(
        nf.contains("**Compared:** the reference against itself, computed in f64 vs f32"),
        "{nf}"
    );
    assert!(nf.contains("| metric | context 256 |"), "{nf}");
    assert!(nf.contains("| `kld_mean` | 3.62e-12 |"), "{nf}");
    assert!(nf.contains("| `top1_agreement` | 1 |"), "{nf}");
    assert!(nf.contains("| `zz_extra` | 2.5 |"), "{nf}");
    assert!(!nf.contains("{"), "a JSON blob in\n{nf}");
    let html = render_html(&r, &[]).unwrap();
    assert!(
        html.contains(
            "<tr><td><code class=\"metric\">kld_mean</code></td><td class=\"n\">3.62e-12</td></tr>"
        ),
        "{html}"
    );
    r["noise_floor"] = json!({"skipped": "not asked for"});
    assert!(
        render_markdown(&r)
            .unwrap()
            .contains("**Skipped:** not asked for")
    );
    assert!(md.contains("## Definitions"));
    assert!(
        !md.contains("0.016476123456789"),
        "17-digit floats leak:\n{md}"
    );
}

#[test]
fn html_has_the_key_content() {
    let html = render_html(&sample(), &sample_rows()).unwrap();
    assert!(html.contains(r#"<header class="verdict v-not_reproduced">"#));
    assert!(html.contains("NOT REPRODUCED"));
    assert!(html.contains(r#"<span class="badge v-reproduced">"#));
    assert!(html.contains(r#"<span class="badge v-not_comparable">"#));
    assert!(html.contains(r#"<code class="metric">kld_mean</code>"#));
    assert!(html.contains(r#"<code class="metric">top1_agreement</code>"#));
    assert!(html.contains("<li>engine: card says vllm 0.11.1, rerun is cardproof native</li>"));
    // Claimed as written (0.9810, not 0.981), rerun one digit finer, relative difference.
    assert!(
        html.contains(r#"<td class="n" data-label="claimed">0.9810</td>"#),
        "{html}"
    );
    assert!(html.contains(r#"<td class="n" data-label="rerun">0.93000</td>"#));
    assert!(html.contains(r#"<td class="n" data-label="relative difference">-5.2%</td>"#));
    assert!(html.contains("Relative difference = (rerun − claimed) / |claimed|."));
    // The reason in its own full-width row, not a squeezed column.
    assert!(html.contains(r#"<tr class="reason"><td colspan="8">equal within the claim&#x27;s printed precision</td></tr>"#), "{html}");
    for word in [
        PROTO,
        TOKENS,
        ROOT,
        MODEL_FILE,
        "full vocabulary",
        "1000 resamples",
    ] {
        assert!(html.contains(word), "missing {word:?}");
    }
    assert!(html.contains("<details>"));
    assert_eq!(
        html.matches("<svg").count(),
        2,
        "one plot per run and the histogram"
    );
    assert!(!html.contains("0.016476123456789"));
    check_self_contained(&html);
    check_balanced(&html);
}

#[test]
fn every_verdict_has_its_colour_class() {
    for (verdict, css) in [
        ("reproduced", "--green"),
        ("not_reproduced", "--red"),
        ("not_comparable", "--amber"),
        ("undisclosed", "--grey"),
    ] {
        let mut r = sample();
        r["verdict"] = json!(verdict);
        let html = render_html(&r, &[]).unwrap();
        assert!(html.contains(&format!(r#"class="verdict v-{verdict}""#)));
        assert!(html.contains(&format!(".v-{verdict}")));
        assert!(html.contains(&format!("background: var({css})")));
        let md = render_markdown(&r).unwrap();
        assert!(md.contains(&format!(
            "Verdict: {}",
            verdict.replace('_', " ").to_uppercase()
        )));
    }
    // An unknown verdict is not a report: it cannot reach the templates.
    let mut r = sample();
    r["verdict"] = json!("totally_fine");
    assert!(serde_json::from_value::<crate::verify::Report>(r).is_err());
}

#[test]
fn a_report_with_nothing_rerun_renders() {
    // What verify writes when nothing could be rerun: no reference, no measurement, no gates;
    // every optional section is left out and nothing fails under strict undefined.
    let mut r = sample();
    r["verdict"] = json!("undisclosed");
    r["reference"] = Value::Null;
    r["measurement"] = Value::Null;
    r["sanity"] = json!([]);
    r["undisclosed"] = json!(["eval"]);
    r["claims"] = json!([{"index": 0, "metric": "kld_mean", "claimed": 0.01, "claimed_text": "0.01",
        "rerun": null, "tolerance": null, "verdict": "undisclosed", "reason": "no eval text",
        "differences": []}]);
    let md = render_markdown(&r).unwrap();
    assert!(md.contains("Verdict: UNDISCLOSED"));
    assert!(
        md.contains("| `kld_mean` | – | 0.01 | – | – | – | – | ❔ undisclosed |")
            && md.contains("- `kld_mean` at – tokens, undisclosed: no eval text"),
        "{md}"
    );
    let html = render_html(&r, &[]).unwrap();
    check_balanced(&html);
    // A future schema is not a report this cardproof renders.
    r["schema_version"] = json!(2);
    let err = serde_json::from_value::<crate::verify::Report>(r).unwrap_err();
    assert!(err.to_string().contains("schema_version"), "{err}");
}

#[test]
fn hostile_card_values_render_harmlessly_in_markdown() {
    let md = render_markdown(&hostile()).unwrap();
    // Every `<` that could open a tag, and every `&` that could open an entity, is escaped.
    for (i, _) in md.match_indices(['<', '&']) {
        let next = md[i + 1..].chars().next();
        if next.is_some_and(|n| n.is_ascii_alphanumeric() || "/!?#".contains(n)) {
            assert!(
                i > 0 && &md[i - 1..i] == "\\",
                "unescaped markup at {i}: {}",
                &md[i.saturating_sub(20)..(i + 20).min(md.len())]
            );
        }
    }
    assert!(!md.contains("](javascript"));
    assert!(!md.contains("](http"));
    assert!(!md.contains("https://"));
    assert!(!md.contains("www.evil"));
    assert!(!md.contains("](javascript") && !md.contains("]("));
    assert!(md.contains("\\<script>alert(1)\\</script>"), "{md}");
    // No line starts a heading other than ours, and every table row keeps its cell count.
    for line in md.lines() {
        if line.starts_with('#') {
            assert!(
                line.starts_with("# cardproof") || line.starts_with("## "),
                "injected heading: {line}"
            );
            assert!(!line.contains("heading"), "{line}");
        }
    }
    let mut columns = None;
    for line in md.lines() {
        if line.starts_with('|') {
            let cells = cells(line);
            match columns {
                None => columns = Some(cells),
                Some(n) => assert_eq!(cells, n, "cell break in {line}"),
            }
        } else {
            columns = None;
        }
    }
}

/// Cells of a GFM table row: pipes not escaped by a backslash.
fn cells(line: &str) -> usize {
    let mut n = 0;
    let mut escaped = false;
    for c in line.chars() {
        match c {
            '\\' if !escaped => escaped = true,
            '|' if !escaped => n += 1,
            _ => escaped = false,
        }
        if c != '\\' {
            escaped = false;
        }
    }
    n
}

#[test]
fn hostile_card_values_render_harmlessly_in_html() {
    let html = render_html(&hostile(), &sample_rows()).unwrap();
    assert!(!html.contains("<script"));
    assert!(html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"));
    check_self_contained(&html);
    check_balanced(&html);
}

#[test]
fn escape_markdown_neutralizes_markup() {
    let e = escape_markdown;
    assert_eq!(e("plain text 42"), "plain text 42");
    // Plain text stays plain: what Markdown does not read as markup gets no backslash.
    assert_eq!(
        e("kld_mean (±5.0e-6) <= 2.16e-5 & more!"),
        "kld_mean (±5.0e-6) <= 2.16e-5 & more!"
    );
    assert_eq!(e("a * b, {x} ^y"), "a * b, {x} ^y");
    assert_eq!(e("a_b*c _d_ e_"), "a_b\\*c \\_d\\_ e\\_");
    assert_eq!(
        e("[x](javascript:alert(1))"),
        "\\[x\\]\\(javascript:alert(1))"
    );
    assert_eq!(e("![i](u)"), "!\\[i\\]\\(u)");
    assert_eq!(e("| a | b |"), "\\| a \\| b \\|");
    assert_eq!(e("# h"), "\\# h");
    assert_eq!(e("> q"), "\\> q");
    assert_eq!(e("a > b"), "a > b");
    assert_eq!(
        e("<b>&amp;</b> <!-- x --> <?p"),
        "\\<b>\\&amp;\\</b> \\<!-- x --> \\<?p"
    );
    assert_eq!(e("&#60; &x"), "\\&#60; \\&x");
    assert_eq!(e("`code`"), "\\`code\\`");
    assert_eq!(e("a\nb\r\nc\rd"), "a b c d");
    assert_eq!(e("~y~ $z$ \\ a@b"), "\\~y\\~ \\$z\\$ \\\\ a\\@b");
    assert_eq!(e("**b**"), "\\*\\*b\\*\\*");
    assert_eq!(e("- item"), "\\- item");
    assert_eq!(e("  + item"), "  \\+ item");
    assert_eq!(e("a-b+c#d"), "a-b+c#d");
    assert_eq!(e("1. item"), "1\\. item");
    assert_eq!(e("12."), "12\\.");
    assert_eq!(e("3) item"), "3\\) item");
    assert_eq!(e("f(3) x"), "f(3) x");
    assert_eq!(e("0.1.0 v1.2"), "0.1.0 v1.2");
    assert_eq!(e("https://x.y"), "https\\://x.y");
    assert_eq!(e("WWW.x.y"), "WWW\\.x.y");
    assert_eq!(e("a\u{202E}b"), "a\u{FFFD}b");
    assert_eq!(e("==="), "\\===");
}

#[test]
fn numbers_are_formatted_for_people() {
    assert_eq!(format_number(0.016476123456789, 4), "0.01648");
    assert_eq!(format_number(2.2e-5, 4), "2.2e-5");
    assert_eq!(format_number(1.0207, 4), "1.021");
    assert_eq!(format_number(0.93, 4), "0.93");
    assert_eq!(format_number(11033.0, 4), "11033");
    assert_eq!(format_number(412.3456, 4), "412.3");
    assert_eq!(format_number(0.0, 4), "0");
    assert_eq!(format_number(-0.051, 2), "-0.051");
    assert_eq!(format_number(f64::NAN, 4), "NaN");
    assert_eq!(format_number(f64::INFINITY, 4), "inf");
    assert_eq!(format_number(1.5e9, 3), "1500000000");
    assert_eq!(format_number(1.5e20, 3), "1.5e20");
    assert_eq!(format_number(12345678.9, 3), "1.23e7");
    assert_eq!(format_number(9.99996, 4), "10");
}

#[test]
fn kld_plot_bins_the_flips() {
    let rows = &sample_rows()[0];
    let svg = svg_kld_along_position(rows);
    check_svg(&svg);
    // 255 positions in 32 bins of 8: a bar for each bin with a flip (j = 3, 53, 103, 153, 203,
    // 253), its height the bin's flip rate.
    assert_eq!(svg.matches(r#"class="flip""#).count(), 6);
    // j = 53 flipped in all three windows: 3 of the 24 rows of bin 48–55.
    assert!(
        svg.contains("j = 48–55: top-1 flip rate 0.125 (3 of 24 rows)"),
        "{svg}"
    );
    assert!(svg.contains("j = 0–7: top-1 flip rate 0.0417 (1 of 24 rows)"));
    // The last bin ends at the window's last row, j = L − 2.
    assert!(svg.contains("j = 248–254: top-1 flip rate 0.0476 (1 of 21 rows)"));
    assert!(
        svg.contains(
            "top-1 flip rate per bin of 8 positions: 8 flips of 765 rows, in 6 of 32 bins"
        )
    );
    assert!(svg.contains("position j in the window"));
    assert!(svg.contains("mean KLD (nats)"));
    assert!(svg.contains(">flip rate</text>"));
}

#[test]
fn kld_plot_bars_carry_information_when_nearly_every_position_flips() {
    // A long eval text: some window flips at almost every position, so one marker per flipped
    // position would cover the axis. The bins' heights still differ: flips rise along the window.
    let mut run = RunRows {
        context_length: 256,
        ..RunRows::default()
    };
    for w in 0..40u64 {
        for j in 0..255u64 {
            run.position.push(j);
            run.kld.push(0.01);
            run.flip.push((j * 7 + w * 13) % 255 < 10 + j / 4);
        }
    }
    let svg = svg_kld_along_position(&run);
    check_svg(&svg);
    assert_eq!(svg.matches(r#"class="flip""#).count(), 32);
    let heights: Vec<f64> = svg
        .split(r#"<rect class="flip""#)
        .skip(1)
        .map(|r| {
            let h = r.split("height=\"").nth(1).unwrap();
            h[..h.find('"').unwrap()].parse().unwrap()
        })
        .collect();
    assert!(heights.last().unwrap() > &(heights[0] * 2.0), "{heights:?}");
}

#[test]
fn plots_survive_degenerate_input() {
    let empty = RunRows {
        context_length: 128,
        ..RunRows::default()
    };
    let zero = RunRows {
        context_length: 64,
        position: vec![0, 1, 2, 0, 1, 2],
        kld: vec![0.0; 6],
        flip: vec![false; 6],
        ..RunRows::default()
    };
    let single = RunRows {
        context_length: 16,
        position: vec![7],
        kld: vec![0.25],
        flip: vec![true],
        ..RunRows::default()
    };
    let nonfinite = RunRows {
        context_length: 8,
        position: vec![0, 1, 2],
        kld: vec![f64::NAN, f64::INFINITY, 1e-300],
        flip: vec![true, false, false],
        ..RunRows::default()
    };
    for run in [&empty, &zero, &single, &nonfinite] {
        let svg = svg_kld_along_position(run);
        check_svg(&svg);
        let flips = run.flip.iter().filter(|f| **f).count();
        assert_eq!(svg.matches(r#"class="flip""#).count(), flips);
    }
    for set in [
        vec![],
        vec![empty.clone()],
        vec![zero.clone()],
        vec![single.clone()],
        vec![nonfinite.clone()],
        vec![zero.clone(), single.clone(), nonfinite.clone()],
    ] {
        check_svg(&svg_histogram(&set));
    }
    let h = svg_histogram(std::slice::from_ref(&zero));
    assert!(
        h.contains("6 rows with KLD = 0, not on the log axis"),
        "{h}"
    );
    let h = svg_histogram(std::slice::from_ref(&single));
    assert!(h.contains("no rows with KLD = 0"));
    assert_eq!(h.matches(r#"class="bar""#).count(), 1);
    let h = svg_histogram(std::slice::from_ref(&nonfinite));
    assert!(h.contains("2 non-finite, not shown"));
}

#[test]
fn histogram_counts_every_positive_row_once() {
    let rows = sample_rows();
    let h = svg_histogram(&rows);
    check_svg(&h);
    let total: usize = h
        .split("): ")
        .skip(1)
        .map(|s| s.split(' ').next().unwrap().parse::<usize>().unwrap())
        .sum();
    assert_eq!(total, rows[0].kld.len());
}

#[test]
fn long_windows_are_pooled() {
    let n = 20_000u64;
    let run = RunRows {
        context_length: n as usize + 1,
        position: (0..n).collect(),
        kld: (0..n).map(|j| 1.0 / (j + 1) as f64).collect(),
        flip: (0..n).map(|j| j % 997 == 0).collect(),
        ..RunRows::default()
    };
    let svg = svg_kld_along_position(&run);
    check_svg(&svg);
    assert!(svg.contains("positions pooled in bins of"));
    let points = svg
        .split(r#"points=""#)
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .split(' ')
        .count();
    assert!(points <= MAX_POINTS + 1, "{points} points");
    assert!(svg.len() < 200_000, "{} bytes", svg.len());
}

#[test]
fn positions_file_round_trips() {
    use crate::checkpoint::dtype::Dtype;
    use crate::checkpoint::safetensors::serialize;
    let pos: Vec<u8> = [0i64, 1, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let kld: Vec<u8> = [0.5f64, 0.0, 0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let a: Vec<u8> = [3i32, 4, 5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let b: Vec<u8> = [3i32, 9, 5].iter().flat_map(|v| v.to_le_bytes()).collect();
    let bytes = serialize(
        &[
            ("ctx4.position", Dtype::I64, &[3], &pos),
            ("ctx4.kld", Dtype::F64, &[3], &kld),
            ("ctx4.ref_top1", Dtype::I32, &[3], &a),
            ("ctx4.cand_top1", Dtype::I32, &[3], &b),
        ],
        &Default::default(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("positions.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let rows = read_positions(&path).unwrap();
    assert_eq!(
        rows,
        vec![RunRows {
            context_length: 4,
            position: vec![0, 1, 2],
            kld: vec![0.5, 0.0, 0.25],
            flip: vec![false, true, false],
            ..RunRows::default()
        }]
    );
    // A missing array is an error naming it.
    let bytes = serialize(
        &[("ctx4.position", Dtype::I64, &[3], &pos)],
        &Default::default(),
    );
    std::fs::write(&path, bytes).unwrap();
    let err = read_positions(&path).unwrap_err();
    assert!(err.to_string().contains("ctx4.kld"), "{err}");
}

#[test]
fn markdown_snapshot() {
    insta::assert_snapshot!("sample_report_md", render_markdown(&sample()).unwrap());
}

fn check_svg(svg: &str) {
    assert!(svg.starts_with("<svg "), "{svg}");
    assert!(svg.ends_with("</svg>"));
    for bad in ["NaN", "inf", "Infinity"] {
        assert!(!svg.contains(bad), "{bad} in {svg}");
    }
    check_balanced(svg);
    // Every numeric attribute parses as a finite number.
    for attr in [
        " x=\"",
        " y=\"",
        " cx=\"",
        " cy=\"",
        " r=\"",
        " width=\"",
        " height=\"",
    ] {
        for part in svg.split(attr).skip(1) {
            let v = part.split('"').next().unwrap();
            let v: f64 = v.parse().unwrap_or_else(|_| panic!("{attr}{v}"));
            assert!(v.is_finite());
        }
    }
}

/// No script, and nothing that loads from elsewhere: every `src`/`href` is local, no `@import`,
/// no `url(` with a scheme or a protocol-relative address.
fn check_self_contained(html: &str) {
    let lower = html.to_ascii_lowercase();
    assert!(!lower.contains("<script"));
    assert!(!lower.contains("@import"));
    for (i, _) in lower.match_indices("url(") {
        let rest = lower[i + 4..].trim_start_matches(['"', '\'', ' ']);
        assert!(
            !rest.starts_with("//") && !rest.contains("://"),
            "external url( at {i}"
        );
    }
    for tag in tags(html) {
        for attr in ["src=", "href=", "xlink:href=", "action=", "srcset="] {
            if let Some(at) = tag.to_ascii_lowercase().find(attr) {
                let value = tag[at + attr.len()..].trim_start_matches(['"', '\'']);
                assert!(
                    !value.starts_with("http")
                        && !value.starts_with("//")
                        && !value.starts_with("javascript"),
                    "external reference in {tag}"
                );
            }
        }
    }
}

/// The text of every tag (`<...>`), in order.
fn tags(html: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(start) = rest.find('<') {
        let end = rest[start..].find('>').expect("unclosed tag") + start;
        out.push(&rest[start + 1..end]);
        rest = &rest[end + 1..];
    }
    out
}

/// Tags open and close in a balanced, properly nested way (void elements and `/>` aside).
fn check_balanced(html: &str) {
    const VOID: &[&str] = &["meta", "br", "hr", "img", "input", "link", "wbr"];
    let mut stack: Vec<String> = Vec::new();
    for tag in tags(html) {
        if tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let name = name.trim().to_ascii_lowercase();
            let open = stack
                .pop()
                .unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(open, name, "<{open}> closed by </{name}>");
            continue;
        }
        let name = tag
            .split(|c: char| c.is_whitespace() || c == '/')
            .next()
            .unwrap()
            .to_ascii_lowercase();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric()),
            "odd tag <{tag}>"
        );
        if tag.ends_with('/') || VOID.contains(&name.as_str()) {
            continue;
        }
        stack.push(name);
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

/// A sweep plot: one KLD line and one flip line per setting, a bin of zero KLD breaks the log
/// line instead of drawing at -inf, names are escaped, and every coordinate is finite.
#[test]
fn sweep_plot_draws_each_setting_on_a_log_axis_and_breaks_at_zero() {
    let rows = |scale: f64, zero_from: u64| RunRows {
        context_length: 100,
        position: (0..99).collect(),
        kld: (0..99u64)
            .map(|j| {
                if j >= zero_from {
                    0.0
                } else {
                    scale * (1.0 + j as f64 / 99.0)
                }
            })
            .collect(),
        flip: (0..99u64).map(|j| j % 7 == 0).collect(),
        ..RunRows::default()
    };
    let svg = svg_sweep(
        100,
        "bf16",
        &[
            ("q8_0".to_owned(), rows(1e-4, 99)),
            ("<q4_0>".to_owned(), rows(3e-2, 50)),
        ],
    );
    assert!(svg.contains("<title>q8_0: mean KLD</title>"), "{svg}");
    assert!(
        svg.contains("&lt;q4_0&gt;: mean KLD") && !svg.contains("<q4_0>"),
        "{svg}"
    );
    // Decades from 1e-4 (q8_0's floor) to 1e-1 (q4_0's top).
    for d in ["1e-4", "1e-1"] {
        assert!(svg.contains(&format!(">{d}</text>")), "{d} in {svg}");
    }
    // q4_0 is zero from position 50 on: its KLD line stops there (one line, not two), while
    // its flip line runs on; q8_0 has one of each.
    assert_eq!(svg.matches("&lt;q4_0&gt;: mean KLD").count(), 1);
    assert_eq!(svg.matches(": top-1 flip rate").count(), 2);
    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    let page = render_sweep_html(
        "kv_cache",
        "bf16",
        "def",
        &[SweepRow {
            setting: "<q4_0>",
            context_length: 100,
            kld_mean: Some(0.03),
            kld_p99: None,
            top1_agreement: Some(0.9),
            n_flips: 3,
            n_positions: 99,
        }],
        &[svg],
    );
    assert!(
        page.contains("<td><code>&lt;q4_0&gt;</code></td><td>100</td><td>0.03</td><td>–</td>"),
        "{page}"
    );
}
