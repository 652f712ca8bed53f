//! The recomputed statistics: against llama.cpp's printed ones, and on crafted rows.

use super::*;
use crate::kld::llamacpp::compat::{covariance, mean_and_uncertainty, median, percentile};

/// Half a unit of the last printed digit: `%10.6f`, and `%6.3f` of a percentage as a fraction.
const HALF6: f64 = 5e-7;
const HALF3_PCT: f64 = 5e-6;
/// The largest rounding error of a stored log-prob: half a step of a 16-nat window in 65535.
const STEP: f64 = 16.0 / 65535.0 / 2.0;

/// CompatStats from a printed block (every field printed), to test the format alone.
fn stats_from_printed(p: &PrintedStats) -> CompatStats {
    CompatStats {
        n: 0,
        ppl_q: p.ppl_q.unwrap(),
        ppl_base: p.ppl_base.unwrap(),
        cor: p.cor.unwrap(),
        ln_ratio: p.ln_ratio.unwrap(),
        ratio: p.ratio.unwrap(),
        diff: p.diff.unwrap(),
        kld_mean: p.kld_mean.unwrap(),
        kld_max: p.kld_max.unwrap(),
        kld_p999: p.kld_p999.unwrap(),
        kld_p99: p.kld_p99.unwrap(),
        kld_p95: p.kld_p95.unwrap(),
        kld_p90: p.kld_p90.unwrap(),
        kld_median: p.kld_median.unwrap(),
        kld_p10: p.kld_p10.unwrap(),
        kld_p5: p.kld_p5.unwrap(),
        kld_p1: p.kld_p1.unwrap(),
        kld_p01: p.kld_p01.unwrap(),
        kld_min: p.kld_min.unwrap(),
        dp_mean: p.dp_mean.unwrap(),
        dp_max: p.dp_max.unwrap(),
        dp_p999: p.dp_p999.unwrap(),
        dp_p99: p.dp_p99.unwrap(),
        dp_p95: p.dp_p95.unwrap(),
        dp_p90: p.dp_p90.unwrap(),
        dp_p75: p.dp_p75.unwrap(),
        dp_median: p.dp_median.unwrap(),
        dp_p25: p.dp_p25.unwrap(),
        dp_p10: p.dp_p10.unwrap(),
        dp_p5: p.dp_p5.unwrap(),
        dp_p1: p.dp_p1.unwrap(),
        dp_p01: p.dp_p01.unwrap(),
        dp_min: p.dp_min.unwrap(),
        rms_dp: p.rms_dp.unwrap(),
        same_top: p.same_top.unwrap(),
        top_tied: 0,
    }
}

const CANDIDATES: [(&str, &str); 2] = [
    ("cand-q5_0.kld", "kld-q5_0.txt"),
    ("cand-q6_k.kld", "kld-q6_k.txt"),
];

/// `compare_base_files` reproduces what llama.cpp printed, to within the candidate's uint16
/// rounding (llama.cpp used the candidate's full-precision logits; we have its stored rows).
///
/// Tolerances, each the printed half-unit plus:
/// - KLD and Δp order statistics (max, percentiles, median, min): `STEP` = 1.22e-4. Each row's
///   KL moves by at most `Σ p·|error| <= STEP`, each Δp by at most `p·STEP`, and an order
///   statistic of values each moved by at most δ moves by at most δ.
/// - Means (KLD, Δp, the NLLs behind the PPLs): the per-row errors are sums of independent
///   zero-mean roundings (sd <= STEP/√3 = 7e-5 per row), so over 2457 rows the mean's sd is
///   <= 1.4e-6; we allow 3e-6 (PPLs: relative 3e-6).
/// - PPL(base), Cor, Same top p, RMS Δp: the same reference rows and arithmetic (or a count
///   that no rounding flipped), so the printed line itself must match.
#[test]
#[allow(clippy::print_stderr)] // the measured differences, for `--nocapture`
fn fixtures_reproduce_the_printed_statistics() {
    let reference = BaseFile::open(&fixture("ref.kld")).unwrap();
    let mut report = String::new();
    for (cand, text) in CANDIDATES {
        let candidate = BaseFile::open(&fixture(cand)).unwrap();
        let s = compare_base_files(&reference, &candidate).unwrap();
        let p = parse_printed(&fixture_text(text));
        assert!(!p.truncated);
        assert_eq!(s.n, 2457);

        let mut check = |name: &str, ours: f64, printed: Option<f64>, tol: f64| {
            let printed = printed.unwrap_or_else(|| panic!("{text}: {name} not printed"));
            let d = ours - printed;
            report.push_str(&format!(
                "{cand} {name:<12} ours {ours:>13.8} printed {printed:>11.6} Δ {d:+.2e}\n"
            ));
            assert!(
                d.abs() <= tol,
                "{cand}: {name} {ours} vs printed {printed} (Δ {d:e} > {tol:e})"
            );
        };
        let ppl_tol = s.ppl_q.0 * 3e-6 + HALF6;
        check("ppl_q", s.ppl_q.0, p.ppl_q.map(|v| v.0), ppl_tol);
        check("ppl_q±", s.ppl_q.1, p.ppl_q.map(|v| v.1), 1e-6 + HALF6);
        check(
            "ln_ratio",
            s.ln_ratio.0,
            p.ln_ratio.map(|v| v.0),
            3e-6 + HALF6,
        );
        check(
            "ln_ratio±",
            s.ln_ratio.1,
            p.ln_ratio.map(|v| v.1),
            1e-6 + HALF6,
        );
        check("ratio", s.ratio.0, p.ratio.map(|v| v.0), 3e-6 + HALF6);
        check("ratio±", s.ratio.1, p.ratio.map(|v| v.1), 1e-6 + HALF6);
        check("diff", s.diff.0, p.diff.map(|v| v.0), ppl_tol);
        check("diff±", s.diff.1, p.diff.map(|v| v.1), 1e-6 + HALF6);
        check(
            "kld_mean",
            s.kld_mean.0,
            p.kld_mean.map(|v| v.0),
            3e-6 + HALF6,
        );
        check(
            "kld_mean±",
            s.kld_mean.1,
            p.kld_mean.map(|v| v.1),
            1e-6 + HALF6,
        );
        for (name, ours, printed) in [
            ("kld_max", s.kld_max, p.kld_max),
            ("kld_p99.9", s.kld_p999, p.kld_p999),
            ("kld_p99", s.kld_p99, p.kld_p99),
            ("kld_p95", s.kld_p95, p.kld_p95),
            ("kld_p90", s.kld_p90, p.kld_p90),
            ("kld_median", s.kld_median, p.kld_median),
            ("kld_p10", s.kld_p10, p.kld_p10),
            ("kld_p5", s.kld_p5, p.kld_p5),
            ("kld_p1", s.kld_p1, p.kld_p1),
            ("kld_p0.1", s.kld_p01, p.kld_p01),
            ("kld_min", s.kld_min, p.kld_min),
        ] {
            check(name, ours, printed, STEP + HALF6);
        }
        check(
            "dp_mean",
            s.dp_mean.0,
            p.dp_mean.map(|v| v.0),
            3e-6 + HALF3_PCT,
        );
        check(
            "dp_mean±",
            s.dp_mean.1,
            p.dp_mean.map(|v| v.1),
            1e-6 + HALF3_PCT,
        );
        for (name, ours, printed) in [
            ("dp_max", s.dp_max, p.dp_max),
            ("dp_p99.9", s.dp_p999, p.dp_p999),
            ("dp_p99", s.dp_p99, p.dp_p99),
            ("dp_p95", s.dp_p95, p.dp_p95),
            ("dp_p90", s.dp_p90, p.dp_p90),
            ("dp_p75", s.dp_p75, p.dp_p75),
            ("dp_median", s.dp_median, p.dp_median),
            ("dp_p25", s.dp_p25, p.dp_p25),
            ("dp_p10", s.dp_p10, p.dp_p10),
            ("dp_p5", s.dp_p5, p.dp_p5),
            ("dp_p1", s.dp_p1, p.dp_p1),
            ("dp_p0.1", s.dp_p01, p.dp_p01),
            ("dp_min", s.dp_min, p.dp_min),
        ] {
            check(name, ours, printed, STEP + HALF3_PCT);
        }
        check("rms_dp", s.rms_dp.0, p.rms_dp.map(|v| v.0), HALF3_PCT);
        check("same_top", s.same_top.0, p.same_top.map(|v| v.0), HALF3_PCT);

        // Lines computed identically print identically.
        let ours = s.render();
        let printed = fixture_text(text);
        for label in [
            "====== ",
            "Mean PPL(base)",
            "Cor(ln(PPL(Q)), ln(PPL(base)))",
            "RMS Δp",
            "Same top p",
        ] {
            let pick = |t: &str| -> Vec<String> {
                t.lines()
                    .filter(|l| l.starts_with(label))
                    .map(str::to_owned)
                    .collect()
            };
            assert_eq!(pick(&ours), pick(&printed), "{cand}: `{label}` lines");
        }
        // Every line has llama.cpp's label and width.
        for (a, b) in ours.lines().zip(printed.lines()) {
            let label = |l: &str| l.split(':').next().unwrap_or_default().to_owned();
            assert_eq!(label(a), label(b));
            assert_eq!(a.chars().count(), b.chars().count(), "`{a}` vs `{b}`");
        }
        assert_eq!(ours.lines().count(), printed.trim_end().lines().count());
    }
    eprintln!("{report}");
}

#[test]
fn render_is_llama_cpps_format_exactly() {
    for (_, text) in CANDIDATES {
        let printed = fixture_text(text);
        let rendered = stats_from_printed(&parse_printed(&printed)).render();
        assert_eq!(rendered, format!("{}\n", printed.trim_end_matches('\n')));
    }
}

#[test]
fn non_finite_values_render_as_glibc_does() {
    let p = parse_printed(&fixture_text("kld-q5_0.txt"));
    let mut s = stats_from_printed(&p);
    s.cor = f64::NAN;
    s.ln_ratio.1 = -f64::NAN;
    s.kld_max = f64::INFINITY;
    let r = s.render();
    assert!(r.contains("Cor(ln(PPL(Q)), ln(PPL(base))):    nan%"), "{r}");
    assert!(
        r.contains("Mean ln(PPL(Q)/PPL(base))     :   0.003262 ±       -nan"),
        "{r}"
    );
    assert!(r.contains("Maximum KLD:        inf"), "{r}");
}

#[test]
fn statistics_need_100_rows() {
    let row = BaseRow {
        scale: 0.001,
        min_log_prob: -30.0,
        codes: vec![30000, 0, 65535],
    };
    let logits = [1.0, -3.0, 2.0];
    let mut acc = CompatAccumulator::new();
    for _ in 0..99 {
        acc.push(&row, &logits, 2);
    }
    assert_eq!(acc.count(), 99);
    assert!(acc.clone().finish().is_none());
    acc.push(&row, &logits, 0);
    let s = acc.finish().unwrap();
    assert_eq!(s.n, 100);
    assert_eq!(s.same_top.0, 1.0);
}

/// The KL sum restated for the tests: the f32 terms llama.cpp adds for tokens in `keep`.
fn kl_over(row: &BaseRow, logits: &[f32], keep: &[usize]) -> f64 {
    let max = logits.iter().copied().fold(f32::MIN, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let log_z = max + sum.ln() as f32;
    keep.iter()
        .map(|&i| {
            let lp = row.log_prob(i);
            f64::from(lp.exp() * (lp - logits[i] + log_z))
        })
        .sum()
}

#[test]
fn the_gate_drops_reference_log_probs_at_or_below_minus_16() {
    // scale 2^-12 and minimum -16: code 0 decodes to exactly -16 (dropped), code 1 to
    // -16 + 2^-12 (kept).
    let mut row = BaseRow {
        scale: 1.0 / 4096.0,
        min_log_prob: -16.0,
        codes: vec![65535, 0, 1, 2],
    };
    assert_eq!(row.log_prob(1), -16.0);
    assert!(row.log_prob(2) > -16.0);
    let logits = [0.0, -5.0, -20.0, -20.0];
    let kl = row_kld(&row, &logits);
    assert_eq!(kl, kl_over(&row, &logits, &[0, 2, 3]));
    assert_ne!(kl, kl_over(&row, &logits, &[0, 1, 2, 3]));
    // One ulp above -16 and token 1 counts.
    row.min_log_prob = f32::from_bits((-16.0f32).to_bits() - 1);
    assert!(row.log_prob(1) > KL_GATE);
    assert_eq!(
        row_kld(&row, &logits),
        kl_over(&row, &logits, &[0, 1, 2, 3])
    );
}

#[test]
fn negative_row_kl_is_kept() {
    // A flat reference stored slightly below the candidate's log-probs: KL < 0, as llama.cpp
    // reports for near-identical models.
    let row = BaseRow {
        scale: 0.0,
        min_log_prob: -0.6935,
        codes: vec![0, 0],
    };
    let logits = [0.25, 0.25];
    let kl = row_kld(&row, &logits);
    assert!(kl < 0.0 && kl > -1e-3, "{kl}");
    let mut acc = CompatAccumulator::new();
    for _ in 0..100 {
        acc.push(&row, &logits, 1);
    }
    let s = acc.finish().unwrap();
    assert!(s.kld_mean.0 < 0.0 && s.kld_min < 0.0 && s.kld_max < 0.0);
    assert_eq!(s.kld_min, f64::from(kl as f32));
    assert_eq!(s.same_top, (1.0, 0.0));
}

#[test]
fn argmax_ties_go_to_the_first_index() {
    let row = |codes: Vec<u16>| BaseRow {
        scale: 0.01,
        min_log_prob: -5.0,
        codes,
    };
    let cases = [
        // candidate top tie at 1 and 2 -> 1
        (vec![1.0, 3.0, 3.0, 0.0], vec![0, 100, 100, 5], true),
        (vec![1.0, 3.0, 3.0, 0.0], vec![0, 99, 100, 100], false),
        (vec![0.0, 1.0, 5.0, 5.0], vec![0, 0, 7, 7], true),
        (vec![0.0, 1.0, 5.0, 5.0], vec![0, 0, 6, 7], false),
        // all equal: index 0 on both sides
        (vec![2.0; 4], vec![3; 4], true),
    ];
    for (logits, codes, same) in cases {
        let s = score_row(&row(codes.clone()), &logits, 0);
        assert_eq!(s.same_top(), same, "{logits:?} vs {codes:?}");
    }
}

#[test]
fn normalized_log_probs_score_like_their_logits() {
    let mut rng = Rng(42);
    for _ in 0..50 {
        let logits = rng.logits(64);
        let reference = encode_row(&rng.logits(64));
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        let lse = logits
            .iter()
            .map(|&l| f64::from((l - max).exp()))
            .sum::<f64>()
            .ln();
        let log_probs: Vec<f32> = logits
            .iter()
            .map(|&l| (f64::from(l - max) - lse) as f32)
            .collect();
        let a = score_row(&reference, &logits, 3);
        let b = score_row_log_probs(&reference, &log_probs, 3);
        assert!((a.kld - b.kld).abs() < 1e-5, "{a:?} {b:?}");
        assert!((a.nll - b.nll).abs() < 1e-5);
        assert_eq!(a.same_top(), b.same_top());
    }
}

#[test]
fn helpers_follow_llama_cpps_formulas() {
    let v: Vec<f32> = (0..10).map(|i| i as f32).collect();
    assert_eq!(percentile(&v, 0.0), 0.0);
    assert_eq!(percentile(&v, -1.0), 0.0);
    assert_eq!(percentile(&v, 1.0), 9.0);
    assert_eq!(percentile(&v, 0.5), 4.5);
    // The index is an f32 product; the weight its f32 fraction.
    let p = 0.999f32 * 9.0;
    let w = p - 8.0;
    assert_eq!(percentile(&v, 0.999), (1.0 - w) * 8.0 + w * 9.0);
    assert_eq!(percentile(&[3.0], 0.3), 3.0);
    assert_eq!(median(&[1.0, 2.0, 3.0, 4.0]), 2.5);
    assert_eq!(median(&[1.0, 2.0, 7.0]), 2.0);

    // No uncertainty at 10 rows or fewer, nor without variance.
    assert_eq!(mean_and_uncertainty(10.0, 30.0, 10), (1.0, 0.0));
    assert_eq!(mean_and_uncertainty(11.0, 11.0, 11), (1.0, 0.0));
    let (m, u) = mean_and_uncertainty(11.0, 22.0, 11);
    assert_eq!(m, 1.0);
    assert_eq!(u, (1.0f64 / 10.0).sqrt());
    assert_eq!(mean_and_uncertainty(0.0, 0.0, 0), (0.0, 0.0));
    // Covariance of the means; 0 below 10 rows.
    assert_eq!(covariance(9.0, 9.0, 20.0, 9), 0.0);
    assert_eq!(covariance(10.0, 20.0, 30.0, 10), (3.0 - 2.0) / 9.0);
}

#[test]
fn incompatible_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, n_vocab: u32, tokens: &[i32]| {
        let path = dir.path().join(name);
        let mut w = BaseFileWriter::create(&path, 8, n_vocab, tokens).unwrap();
        for _ in 0..tokens.len() / 8 * 3 {
            w.write_row_logits(&vec![0.5; n_vocab as usize]).unwrap();
        }
        w.finish().unwrap();
        BaseFile::open(&path).unwrap()
    };
    let tokens = vec![1; 8 * 40];
    let a = write("a.kld", 5, &tokens);
    let b = write("b.kld", 6, &tokens);
    let err = compare_base_files(&a, &b).unwrap_err();
    assert_kind(
        err,
        "mismatch",
        &b.path,
        &["n_vocab", "6 here but 5 in the reference", "a.kld"],
    );
    let mut other = tokens.clone();
    other[13] = 4;
    let c = write("c.kld", 5, &other);
    let err = compare_base_files(&a, &c).unwrap_err();
    assert_kind(
        err,
        "mismatch",
        &c.path,
        &[
            "token 13 (chunk 1, position 5)",
            "id 4 here but 1 in the reference",
        ],
    );
    let d = write("d.kld", 5, &tokens[..16]);
    let err = compare_base_files(&d, &d).unwrap_err();
    assert_kind(
        err,
        "usage",
        &d.path,
        &["only 6 scored rows", "from 100 rows"],
    );
    let e = write("e.kld", 5, &tokens[..16]);
    let err = compare_base_files(&a, &e).unwrap_err();
    assert_kind(err, "mismatch", &e.path, &["n_chunk", "2 here but 40"]);
}
