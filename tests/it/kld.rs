//! `cardproof kld`: two logit files in, the metric vocabulary out.

use std::collections::BTreeMap;
use std::path::Path;

use cardproof::checkpoint::dtype::Dtype;
use cardproof::checkpoint::safetensors;
use cardproof::kld::stats::SplitMix64;

use crate::support::*;

fn normal(rng: &mut SplitMix64) -> f32 {
    let u = ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64).max(1e-300);
    let v = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

/// Reference and candidate logits (candidate = reference + noise), rows × vocab, and tokens.
fn logits(rows: usize, vocab: usize, noise: f32, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
    let mut rng = SplitMix64::new(seed);
    let a: Vec<f32> = (0..rows * vocab).map(|_| 3.0 * normal(&mut rng)).collect();
    let b: Vec<f32> = a.iter().map(|&x| x + noise * normal(&mut rng)).collect();
    let tokens = (0..rows).map(|_| rng.below(vocab as u64) as i32).collect();
    (a, b, tokens)
}

fn write_dump(
    path: &Path,
    logits: &[f32],
    rows: usize,
    vocab: usize,
    tokens: Option<&[i32]>,
    dtype: Dtype,
) {
    let data: Vec<u8> = match dtype {
        Dtype::F32 => logits.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::BF16 => logits
            .iter()
            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
            .collect(),
        Dtype::F16 => logits
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect(),
        _ => unreachable!(),
    };
    let shape = [rows as u64, vocab as u64];
    let token_bytes: Vec<u8> = tokens
        .unwrap_or_default()
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    let token_shape = [rows as u64];
    let mut tensors: Vec<(&str, Dtype, &[u64], &[u8])> = vec![("logits", dtype, &shape, &data)];
    if tokens.is_some() {
        tensors.push(("tokens", Dtype::I32, &token_shape, &token_bytes));
    }
    std::fs::write(path, safetensors::serialize(&tensors, &BTreeMap::new())).unwrap();
}

/// `kld --reference R --candidate C --json --bootstrap 10 EXTRA...` in `dir`.
fn kld_json_run(dir: &Path, reference: &str, candidate: &str, extra: &[&str]) -> Run {
    Cmd::kld()
        .reference(reference)
        .candidate(candidate)
        .arg("--json")
        .bootstrap(10)
        .args(extra)
        .in_dir(dir)
        .run()
}

/// [`kld_json_run`], which must succeed, as JSON.
fn kld_json(dir: &Path, reference: &str, candidate: &str, extra: &[&str]) -> serde_json::Value {
    let run = kld_json_run(dir, reference, candidate, extra);
    assert_eq!(run.code, 0, "{}", run.stderr);
    run.json()
}

struct Pair {
    dir: tempfile::TempDir,
}

impl Pair {
    fn new(rows: usize, vocab: usize, noise: f32) -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, t) = logits(rows, vocab, noise, 11);
        write_dump(
            &dir.path().join("ref.safetensors"),
            &a,
            rows,
            vocab,
            Some(&t),
            Dtype::F32,
        );
        write_dump(
            &dir.path().join("cand.safetensors"),
            &b,
            rows,
            vocab,
            Some(&t),
            Dtype::F32,
        );
        Pair { dir }
    }

    fn kld(&self, extra: &[&str]) -> Run {
        Cmd::kld()
            .reference("ref.safetensors")
            .candidate("cand.safetensors")
            .args(extra)
            .in_dir(self.dir.path())
            .run()
    }
}

#[test]
fn json_has_the_documented_shape() {
    let pair = Pair::new(300, 500, 0.3);
    let run = pair.kld(&["--json", "--bootstrap", "200"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = run.json();
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["n_positions"], 300);
    assert_eq!(doc["n_nonfinite"], 0);
    assert_eq!(doc["protocol"]["direction"], "both");
    assert_eq!(doc["protocol"]["units"], "nats");
    assert_eq!(doc["protocol"]["vocab"]["mode"], "full");
    assert_eq!(doc["protocol"]["positions"]["policy"], "all");
    assert_eq!(doc["protocol"]["bootstrap"]["resamples"], 200);
    assert_eq!(doc["protocol_sha256"].as_str().unwrap().len(), 64);
    let metrics = doc["metrics"].as_object().unwrap();
    for name in metrics.keys() {
        assert!(
            cardproof::disclosure::vocabulary::is_metric(name),
            "{name} is not in the vocabulary"
        );
    }
    for name in [
        "kld_mean",
        "kld_median",
        "kld_p99",
        "kld_max",
        "kld_reverse_mean",
        "top1_agreement",
        "ppl_ref",
        "ppl_cand",
        "ppl_ratio",
        "delta_p_rms",
    ] {
        assert!(metrics.contains_key(name), "missing {name}");
        let ci = doc["uncertainty"][name]["ci95"].as_array().unwrap();
        assert!(ci[0].as_f64().unwrap() <= ci[1].as_f64().unwrap());
    }
    assert!(doc["uncertainty"]["kld_mean"]["sem"].as_f64().unwrap() > 0.0);
    let ratio = metrics["ppl_ratio"].as_f64().unwrap();
    assert!(
        (ratio - metrics["ppl_cand"].as_f64().unwrap() / metrics["ppl_ref"].as_f64().unwrap())
            .abs()
            < 1e-12
    );
    // 300 rows: p999 and p99 have fewer than 100 rows beyond them.
    let low: Vec<&str> = doc["low_support"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        low.contains(&"kld_p999") && low.contains(&"kld_p99") && !low.contains(&"kld_median"),
        "{low:?}"
    );
    assert_eq!(doc["diagnostics"]["by_depth"].as_array().unwrap().len(), 8);
    assert_eq!(
        doc["diagnostics"]["by_confidence"]
            .as_array()
            .unwrap()
            .len(),
        5
    );
    assert!(
        doc["definitions"]["kld"]
            .as_str()
            .unwrap()
            .contains("KL(P_ref || P_cand)")
    );
}

/// Regression: one long window of 200 rows once made two 128-row blocks, and every seed gave the
/// same degenerate interval.
#[test]
fn the_same_seed_gives_the_same_intervals_and_another_does_not() {
    let pair = Pair::new(200, 300, 0.3);
    let a = pair
        .kld(&["--json", "--bootstrap", "100", "--seed", "5"])
        .json();
    let b = pair
        .kld(&["--json", "--bootstrap", "100", "--seed", "5"])
        .json();
    let c = pair
        .kld(&["--json", "--bootstrap", "100", "--seed", "6"])
        .json();
    assert_eq!(a["uncertainty"], b["uncertainty"]);
    assert_ne!(a["uncertainty"], c["uncertainty"]);
    assert_ne!(a["protocol_sha256"], c["protocol_sha256"]);
    assert_eq!(a["protocol"]["bootstrap_block"], "run:2");
}

#[test]
fn a_file_against_itself_is_exactly_zero() {
    let pair = Pair::new(120, 200, 0.3);
    let run = kld_json_run(pair.dir.path(), "ref.safetensors", "ref.safetensors", &[]);
    let m = &run.json()["metrics"];
    assert_eq!(m["kld_mean"], 0.0);
    assert_eq!(m["kld_max"], 0.0);
    assert_eq!(m["top1_agreement"], 1.0);
    assert_eq!(m["ppl_ratio"], 1.0);
}

#[test]
fn bf16_and_f16_dumps_read_as_their_exact_f32_values() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, t) = logits(50, 100, 0.5, 3);
    for dtype in [Dtype::BF16, Dtype::F16] {
        let round = |x: &[f32]| -> Vec<f32> {
            x.iter()
                .map(|v| {
                    if dtype == Dtype::BF16 {
                        half::bf16::from_f32(*v).to_f32()
                    } else {
                        half::f16::from_f32(*v).to_f32()
                    }
                })
                .collect()
        };
        write_dump(&dir.path().join("r16.st"), &a, 50, 100, Some(&t), dtype);
        write_dump(&dir.path().join("c16.st"), &b, 50, 100, Some(&t), dtype);
        write_dump(
            &dir.path().join("r32.st"),
            &round(&a),
            50,
            100,
            Some(&t),
            Dtype::F32,
        );
        write_dump(
            &dir.path().join("c32.st"),
            &round(&b),
            50,
            100,
            Some(&t),
            Dtype::F32,
        );
        let m16 = kld_json(dir.path(), "r16.st", "c16.st", &[]);
        let m32 = kld_json(dir.path(), "r32.st", "c32.st", &[]);
        assert_eq!(m16["metrics"], m32["metrics"], "{dtype}");
    }
}

#[test]
fn position_policies_select_rows_by_window_position() {
    let pair = Pair::new(64, 50, 0.3);
    let n = |extra: &[&str]| {
        let mut args = vec!["--json", "--bootstrap", "10", "--context-length", "16"];
        args.extend_from_slice(extra);
        let run = pair.kld(&args);
        assert_eq!(run.code, 0, "{}", run.stderr);
        run.json()["n_positions"].as_u64().unwrap()
    };
    assert_eq!(n(&[]), 4 * 15);
    assert_eq!(n(&["--positions", "second-half"]), 4 * 7);
    assert_eq!(
        n(&["--positions", "stride", "--stride", "4", "--offset", "3"]),
        4 * 3
    );
    assert_eq!(n(&["--positions", "from", "--from", "10"]), 4 * 5);
    let doc = pair
        .kld(&["--json", "--bootstrap", "10", "--context-length", "16"])
        .json();
    assert_eq!(doc["n_windows"], 4);
    assert_eq!(doc["protocol"]["bootstrap_block"], "window");
}

#[test]
fn metrics_that_need_tokens_are_omitted_without_them() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, _) = logits(40, 60, 0.3, 9);
    write_dump(&dir.path().join("r.st"), &a, 40, 60, None, Dtype::F32);
    write_dump(&dir.path().join("c.st"), &b, 40, 60, None, Dtype::F32);
    let doc = kld_json(dir.path(), "r.st", "c.st", &[]);
    let m = doc["metrics"].as_object().unwrap();
    assert!(m.contains_key("kld_mean") && m.contains_key("top1_agreement"));
    assert!(
        !m.contains_key("ppl_ref") && !m.contains_key("delta_p_rms"),
        "{m:?}"
    );
}

#[test]
fn padding_beyond_the_vocabulary_size_is_excluded() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, t) = logits(30, 100, 0.3, 4);
    let pad = |x: &[f32], fill: f32| -> Vec<f32> {
        x.chunks(100)
            .flat_map(|row| row.iter().copied().chain(std::iter::repeat_n(fill, 28)))
            .collect()
    };
    write_dump(&dir.path().join("r.st"), &a, 30, 100, Some(&t), Dtype::F32);
    write_dump(&dir.path().join("c.st"), &b, 30, 100, Some(&t), Dtype::F32);
    write_dump(
        &dir.path().join("rp.st"),
        &pad(&a, 5.0),
        30,
        128,
        Some(&t),
        Dtype::F32,
    );
    write_dump(
        &dir.path().join("cp.st"),
        &pad(&b, -5.0),
        30,
        128,
        Some(&t),
        Dtype::F32,
    );
    let plain = kld_json(dir.path(), "r.st", "c.st", &[]);
    let padded = Cmd::kld()
        .reference("rp.st")
        .candidate("cp.st")
        .flag("--vocab-size", "100")
        .arg("--json")
        .bootstrap(10)
        .in_dir(dir.path())
        .run()
        .json();
    assert_eq!(plain["metrics"], padded["metrics"]);
    assert_eq!(padded["protocol"]["padding"], "excluded");
    assert_eq!(padded["protocol"]["vocab_size"], 100);
}

#[test]
fn non_finite_rows_are_excluded_counted_and_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let (mut a, b, t) = logits(20, 30, 0.3, 5);
    a[5 * 30 + 7] = f32::NAN;
    write_dump(&dir.path().join("r.st"), &a, 20, 30, Some(&t), Dtype::F32);
    write_dump(&dir.path().join("c.st"), &b, 20, 30, Some(&t), Dtype::F32);
    let run = kld_json_run(dir.path(), "r.st", "c.st", &[]);
    assert_eq!(run.code, 0);
    assert_eq!(run.json()["n_nonfinite"], 1);
    assert_eq!(run.json()["n_positions"], 19);
    // The document counts them; the warning is for people, without --json.
    assert_eq!(run.stderr, "");
    let human = Cmd::kld()
        .reference("r.st")
        .candidate("c.st")
        .bootstrap(10)
        .in_dir(dir.path())
        .run();
    assert_eq!(human.code, 0);
    assert!(
        human.stderr.contains("1 row with non-finite logits"),
        "{}",
        human.stderr
    );
}

#[test]
fn mismatched_inputs_are_exit_2_saying_which() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, t) = logits(20, 30, 0.3, 6);
    let t: Vec<i32> = t.iter().map(|x| x % 25).collect();
    write_dump(&dir.path().join("r.st"), &a, 20, 30, Some(&t), Dtype::F32);
    write_dump(
        &dir.path().join("v.st"),
        &b[..20 * 25],
        20,
        25,
        Some(&t),
        Dtype::F32,
    );
    write_dump(
        &dir.path().join("n.st"),
        &b[..10 * 30],
        10,
        30,
        Some(&t[..10]),
        Dtype::F32,
    );
    let mut other = t.clone();
    other[7] = (other[7] + 1) % 25;
    write_dump(
        &dir.path().join("t.st"),
        &b,
        20,
        30,
        Some(&other),
        Dtype::F32,
    );
    let err = |cand: &str| {
        let run = Cmd::kld()
            .reference("r.st")
            .candidate(cand)
            .arg("--json")
            .in_dir(dir.path())
            .run();
        assert_eq!(run.code, 2, "{cand}: {}", run.stderr);
        run.json()["error"]["message"].as_str().unwrap().to_owned()
    };
    assert!(
        err("v.st").contains("vocabulary mismatch: 25 entries per row"),
        "{}",
        err("v.st")
    );
    assert!(err("n.st").contains("has 10 rows but the reference"));
    assert!(err("t.st").contains("token stream differs from the reference at row 7"));
    std::fs::write(dir.path().join("empty.st"), b"").unwrap();
    assert!(err("empty.st").contains("shorter than 8 bytes") || !err("empty.st").is_empty());
    let bytes = std::fs::read(dir.path().join("r.st")).unwrap();
    std::fs::write(dir.path().join("cut.st"), &bytes[..bytes.len() - 100]).unwrap();
    assert!(!err("cut.st").is_empty());
}

#[test]
fn inconsistent_flags_are_usage_errors() {
    let pair = Pair::new(10, 20, 0.3);
    for args in [
        vec!["--positions", "stride", "--stride", "4", "--offset", "4"],
        vec!["--positions", "stride", "--stride", "4"],
        vec!["--vocab", "top-k"],
        vec!["--top-k", "5"],
        vec!["--vocab", "threshold", "--threshold", "1"],
        vec!["--from", "3"],
    ] {
        let run = pair.kld(&args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    }
}

/// Regression (#14): `--bootstrap 1000000000` allocated a slot per resample up front (24 GB);
/// `--bootstrap` and `--context-length` are range-checked as usage errors before any work.
#[test]
fn bootstrap_and_context_length_flags_out_of_range_are_usage_errors() {
    let pair = Pair::new(10, 20, 0.3);
    for (args, needle) in [
        (vec!["--bootstrap", "1000000000"], "outside 1..=100000"),
        (vec!["--bootstrap", "0"], "outside 1..=100000"),
        (vec!["--context-length", "2097152"], "outside 2..=1048576"),
        (vec!["--context-length", "1"], "outside 2..=1048576"),
    ] {
        let run = pair.kld(&args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
    }
    assert_eq!(pair.kld(&["--bootstrap", "100000", "--json"]).code, 0);
}

#[test]
fn human_output_states_the_protocol_above_the_table() {
    let pair = Pair::new(200, 100, 0.3);
    let run = pair.kld(&["--bootstrap", "50", "--vocab", "top-k", "--top-k", "10"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let first: Vec<&str> = run.stdout.lines().take(4).collect();
    assert!(
        first[2].starts_with("protocol: forward KL(P_ref || P_cand) and reverse"),
        "{first:?}"
    );
    assert!(
        first[2].contains("reference top-10 (lumped tail)"),
        "{first:?}"
    );
    assert!(run.stdout.contains("kld_p999") && run.stdout.contains("* low support"));
    assert!(run.stdout.contains("by depth (j / L)"));
}

mod llamacpp {
    use super::*;

    const FIXTURES: &str = "tests/fixtures/llamacpp";

    /// `kld` of the fixtures' base file `candidate` against their reference base file.
    fn base_files(candidate: &str) -> Cmd {
        Cmd::kld()
            .reference(format!("{FIXTURES}/ref.kld"))
            .candidate(format!("{FIXTURES}/{candidate}"))
    }

    fn compat(candidate: &str) -> serde_json::Value {
        let run = base_files(candidate)
            .args(["--llamacpp-compat", "--json"])
            .run();
        assert_eq!(run.code, 0, "{}", run.stderr);
        run.json()
    }

    #[test]
    fn compat_mode_reproduces_the_printed_statistics() {
        for (cand, printed) in [
            ("cand-q5_0.kld", "kld-q5_0.txt"),
            ("cand-q6_k.kld", "kld-q6_k.txt"),
        ] {
            let doc = compat(cand);
            let text = std::fs::read_to_string(format!("{FIXTURES}/{printed}")).unwrap();
            let p = cardproof::kld::llamacpp::parse_printed(&text);
            let m = &doc["metrics"];
            let kld = p.kld_mean.unwrap().0;
            assert!(
                (m["kld_mean"].as_f64().unwrap() - kld).abs() <= 2e-5,
                "{cand}: {} vs {kld}",
                m["kld_mean"]
            );
            let same = p.same_top.unwrap().0;
            assert!(
                (m["top1_agreement"].as_f64().unwrap() - same).abs() <= 1.0 / 2457.0 + 1e-5,
                "{cand}"
            );
            assert_eq!(doc["n_positions"], 39 * 63);
            assert_eq!(doc["protocol"]["positions"]["policy"], "second_half");
        }
    }

    #[test]
    fn compat_human_output_is_llamacpps_block() {
        let run = base_files("cand-q6_k.kld").arg("--llamacpp-compat").run();
        assert_eq!(run.code, 0);
        assert!(
            run.stdout
                .contains("====== KL divergence statistics ======")
        );
        assert!(run.stdout.contains("Mean    KLD:"));
    }

    #[test]
    fn base_files_also_feed_the_standard_engine() {
        let run = base_files("cand-q5_0.kld")
            .arg("--json")
            .bootstrap(50)
            .run();
        assert_eq!(run.code, 0, "{}", run.stderr);
        let doc = run.json();
        assert_eq!(doc["n_positions"], 39 * 63);
        assert_eq!(doc["n_windows"], 39);
        // The file holds only second-half rows, and the protocol says so.
        assert_eq!(doc["protocol"]["positions"]["policy"], "second_half");
        assert!(doc["metrics"]["kld_mean"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn compat_needs_a_base_file_reference() {
        let pair = Pair::new(10, 20, 0.3);
        let run = pair.kld(&["--llamacpp-compat", "--json"]);
        assert_eq!(run.code, 2);
    }
}
