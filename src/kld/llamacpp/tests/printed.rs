//! Parsing llama.cpp's printed block, in every version and state it reaches users.

use super::*;

/// Exactly the numbers `kld-q5_0.txt` prints, percentages as fractions.
fn q5_0_expected() -> PrintedStats {
    PrintedStats {
        ppl_q: Some((5.568794, 0.142597)),
        ppl_base: Some((5.550659, 0.141780)),
        cor: Some(0.9975),
        ln_ratio: Some((0.003262, 0.001822)),
        ratio: Some((1.003267, 0.001828)),
        diff: Some((0.018135, 0.010159)),
        kld_mean: Some((0.003708, 0.000067)),
        kld_max: Some(0.025002),
        kld_p999: Some(0.021714),
        kld_p99: Some(0.013032),
        kld_p95: Some(0.010249),
        kld_p90: Some(0.008876),
        kld_median: Some(0.002907),
        kld_p10: Some(0.000208),
        kld_p5: Some(0.000088),
        kld_p1: Some(0.000009),
        kld_p01: Some(0.000001),
        kld_min: Some(0.000001),
        dp_mean: Some((-0.00059, 0.00034)),
        dp_max: Some(0.07678),
        dp_p999: Some(0.06822),
        dp_p99: Some(0.05019),
        dp_p95: Some(0.02881),
        dp_p90: Some(0.01636),
        dp_p75: Some(0.00560),
        dp_median: Some(-0.00024),
        dp_p25: Some(-0.00667),
        dp_p10: Some(-0.01988),
        dp_p5: Some(-0.02972),
        dp_p1: Some(-0.05039),
        dp_p01: Some(-0.07055),
        dp_min: Some(-0.08823),
        rms_dp: Some((0.01698, 0.00039)),
        same_top: Some((0.94261, 0.00469)),
        duplicate_p99: false,
        legacy: false,
        truncated: false,
    }
}

fn q6_k_expected() -> PrintedStats {
    PrintedStats {
        ppl_q: Some((5.555974, 0.142135)),
        ppl_base: Some((5.550659, 0.141780)),
        cor: Some(0.9992),
        ln_ratio: Some((0.000957, 0.000994)),
        ratio: Some((1.000958, 0.000995)),
        diff: Some((0.005315, 0.005527)),
        kld_mean: Some((0.001159, 0.000021)),
        kld_max: Some(0.006431),
        kld_p999: Some(0.005767),
        kld_p99: Some(0.003827),
        kld_p95: Some(0.003069),
        kld_p90: Some(0.002709),
        kld_median: Some(0.000916),
        kld_p10: Some(0.000054),
        kld_p5: Some(0.000023),
        kld_p1: Some(0.000003),
        kld_p01: Some(-0.000001),
        kld_min: Some(-0.000001),
        dp_mean: Some((0.00007, 0.00019)),
        dp_max: Some(0.05443),
        dp_p999: Some(0.04080),
        dp_p99: Some(0.02951),
        dp_p95: Some(0.01648),
        dp_p90: Some(0.01052),
        dp_p75: Some(0.00320),
        dp_median: Some(-0.00007),
        dp_p25: Some(-0.00361),
        dp_p10: Some(-0.01004),
        dp_p5: Some(-0.01518),
        dp_p1: Some(-0.02660),
        dp_p01: Some(-0.04955),
        dp_min: Some(-0.05590),
        rms_dp: Some((0.00949, 0.00024)),
        same_top: Some((0.96459, 0.00373)),
        duplicate_p99: false,
        legacy: false,
        truncated: false,
    }
}

fn q5_0() -> String {
    fixture_text("kld-q5_0.txt")
}

#[test]
fn fixture_texts_parse_to_exactly_the_printed_numbers() {
    assert_eq!(parse_printed(&q5_0()), q5_0_expected());
    assert_eq!(
        parse_printed(&fixture_text("kld-q6_k.txt")),
        q6_k_expected()
    );
    assert_eq!(parse_printed_blocks(&q5_0()).len(), 1);
}

#[test]
fn each_statistic_is_located_at_the_line_it_was_printed_on() {
    let text = q5_0();
    let (stats, lines) = parse_printed_located(&text);
    assert_eq!(stats, q5_0_expected());
    let line_of = |label: &str| 1 + text.lines().position(|l| l.contains(label)).unwrap();
    for (field, label) in [
        ("ppl_q", "Mean PPL(Q)  "),
        ("kld_mean", "Mean    KLD"),
        ("kld_max", "Maximum KLD"),
        ("kld_p99", "99.0%   KLD"),
        ("kld_median", "Median  KLD"),
        ("same_top", "Same top p"),
        ("rms_dp", "RMS"),
    ] {
        assert_eq!(lines.of(field), Some(line_of(label)), "{field}");
    }
    // A statistic not printed has no line; a value dropped as cut short has none either.
    let cut = &text[..text.find("Same top p").unwrap() + "Same top p: 9".len()];
    let (stats, lines) = parse_printed_located(cut);
    assert!(stats.same_top.is_none() && lines.of("same_top").is_none());
    assert!(lines.of("no_such_field").is_none());
}

/// The text without the lines containing any of `labels`.
fn without(text: &str, labels: &[&str]) -> String {
    text.lines()
        .filter(|l| !labels.iter().any(|x| l.contains(x)))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn before_pr_15999_the_99_line_is_doubled_and_90_missing() {
    // llama.cpp printed percentile(0.99) twice where 90 % belonged, and had no 95 %/0.1 %.
    let text = q5_0()
        .replace("90.0%   KLD:   0.008876", "99.0%   KLD:   0.013032")
        .replace("95.0%   KLD:   0.010249\n", "")
        .replace(" 0.1%   KLD:   0.000001\n", "");
    let p = parse_printed(&text);
    let want = PrintedStats {
        kld_p90: None,
        kld_p95: None,
        kld_p01: None,
        duplicate_p99: true,
        ..q5_0_expected()
    };
    assert_eq!(p, want);
    assert_eq!(
        parse_printed_blocks(&text).len(),
        1,
        "the duplicate starts no new block"
    );
}

#[test]
fn before_pr_16321_there_are_no_95_and_0_1_lines() {
    let text = without(&q5_0(), &["95.0%   KLD", " 0.1%   KLD"]);
    let p = parse_printed(&text);
    assert_eq!(
        p,
        PrintedStats {
            kld_p95: None,
            kld_p01: None,
            ..q5_0_expected()
        }
    );
}

#[test]
fn mangled_plus_minus_and_delta_still_parse() {
    let original = q5_0();
    for (pm, delta) in [
        ("_", "_"),
        ("Â±", "Î”"),
        ("?", "?"),
        ("+/-", "Delta "),
        ("�", "�"),
    ] {
        let text = original.replace('±', pm).replace('Δ', delta);
        assert_eq!(
            parse_printed(&text),
            q5_0_expected(),
            "± as {pm:?}, Δ as {delta:?}"
        );
    }
}

#[test]
fn crlf_ansi_and_log_noise_are_ignored() {
    let crlf = q5_0().replace('\n', "\r\n");
    assert_eq!(parse_printed(&crlf), q5_0_expected());

    let noisy = format!(
        "llama_model_loader: loaded meta data with 23 key-value pairs\n\
         kl_divergence: 0.51 seconds per pass - ETA 0.33 minutes\n\n\
         chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p\n   \
         1       5.5688 ±     0.1426       0.00326 ±    0.00182       0.00371 ±    0.00007     1.698 ±  0.039 %    94.261 ±  0.469 %\n\n\
         \x1b[32m{}\x1b[0m\n\
         llama_perf_context_print:        load time =      11.63 ms\n\
         llama_perf_context_print:       total time =     521.23 ms /  4993 tokens\n",
        q5_0().trim_end()
    );
    assert_eq!(parse_printed(&noisy), q5_0_expected());
    assert_eq!(parse_printed(""), PrintedStats::default());
    assert_eq!(
        parse_printed("no statistics here\n"),
        PrintedStats::default()
    );
}

#[test]
fn a_cut_block_marks_itself_truncated() {
    let text = q5_0();
    let end = text.find("RMS Δp").unwrap();
    // Cut at a line boundary: the missing lines are absent.
    let p = parse_printed(&text[..end]);
    assert!(p.truncated);
    assert_eq!(
        p,
        PrintedStats {
            rms_dp: None,
            same_top: None,
            truncated: true,
            ..q5_0_expected()
        }
    );
    // Cut inside the last number: the short number is not read as a smaller value.
    let cut = text.find("Same top p: 94.26").unwrap() + "Same top p: 94.26".len();
    let p = parse_printed(&text[..cut]);
    assert!(p.truncated && p.same_top.is_none());
    assert_eq!(p.rms_dp, Some((0.01698, 0.00039)));
    let cut = text.find("Maximum KLD:   0.02").unwrap() + "Maximum KLD:   0.02".len();
    let p = parse_printed(&text[..cut]);
    assert!(p.truncated && p.kld_max.is_none());
    assert_eq!(p.kld_mean, Some((0.003708, 0.000067)));
    // ...even when other output runs on after it, on the same line or the next.
    let joined = format!(
        "{}llama_perf_context_print: load time = 1 ms\n",
        &text[..cut]
    );
    assert!(parse_printed(&joined).kld_max.is_none());
    let next_line = format!(
        "{}\nllama_perf_context_print: load time = 1 ms\n",
        &text[..cut]
    );
    assert!(parse_printed(&next_line).kld_max.is_none());
    // A percentage line missing its `%` at the cut is dropped too.
    let cut = text.find("Maximum Δp:  7.678").unwrap() + "Maximum Δp:  7.678".len();
    let p = parse_printed(&text[..cut]);
    assert!(p.dp_max.is_none() && p.dp_mean.is_some());
    // Only the header printed.
    let p = parse_printed("====== Perplexity statistics ======\n");
    assert!(p.truncated && p.ppl_q.is_none());
}

#[test]
fn several_blocks_are_kept_apart() {
    let two = format!("{}\n{}", q5_0(), fixture_text("kld-q6_k.txt"));
    let blocks = parse_printed_blocks(&two);
    assert_eq!(blocks, vec![q5_0_expected(), q6_k_expected()]);
    assert_eq!(parse_printed(&two), q5_0_expected());
    // Without headers, a repeated statistic starts the next block.
    let bare = without(&two, &["======"]);
    assert_eq!(parse_printed_blocks(&bare).len(), 2);
}

#[test]
fn early_2024_format_parses() {
    let text = "\
===== KL-divergence statistics
Average:   0.003708 ±  0.000067
Median :   0.002907
Maximum:   0.025002
KLD_99 :   0.013032
KLD_95 :   0.010249
KLD_90 :   0.008876
Minimum:   0.000001
KLD_01 :   0.000009
KLD_05 :   0.000088
KLD_10 :   0.000208
";
    let p = parse_printed(text);
    assert_eq!(
        p,
        PrintedStats {
            kld_mean: Some((0.003708, 0.000067)),
            kld_median: Some(0.002907),
            kld_max: Some(0.025002),
            kld_p99: Some(0.013032),
            kld_p95: Some(0.010249),
            kld_p90: Some(0.008876),
            kld_min: Some(0.000001),
            kld_p1: Some(0.000009),
            kld_p5: Some(0.000088),
            kld_p10: Some(0.000208),
            legacy: true,
            ..PrintedStats::default()
        }
    );
    let cut = &text[..text.find("KLD_10").unwrap()];
    assert!(parse_printed(cut).truncated);
    // Its generic labels mean nothing outside that block.
    assert_eq!(
        parse_printed("Average: 1.000000 ± 0.1\nMedian : 2\n"),
        PrintedStats::default()
    );
}

#[test]
fn nan_and_inf_are_read() {
    let text = q5_0()
        .replace(
            "Cor(ln(PPL(Q)), ln(PPL(base))):  99.75%",
            "Cor(ln(PPL(Q)), ln(PPL(base))):    nan%",
        )
        .replace("Maximum KLD:   0.025002", "Maximum KLD:        inf")
        .replace("0.018135 ±   0.010159", "0.018135 ±       -nan");
    let p = parse_printed(&text);
    assert!(p.cor.unwrap().is_nan());
    assert_eq!(p.kld_max, Some(f64::INFINITY));
    assert!(p.diff.unwrap().1.is_nan());
    assert!(!p.truncated);
}
