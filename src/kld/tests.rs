//! The row math against an independent float64 reference written here, straight from the
//! definitions (log-softmax, then Σ p (log p - log q)).

use super::protocol::{Tail, VocabMode};
use super::row::{RowRecord, Scratch, reduce};
use super::stats::SplitMix64;

struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(SplitMix64::new(seed))
    }
    fn uniform(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
    fn logits(&mut self, n: usize, sigma: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * sigma) as f32).collect()
    }
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x
        .iter()
        .map(|&v| f64::from(v))
        .fold(f64::NEG_INFINITY, f64::max);
    let lse = max
        + x.iter()
            .map(|&v| (f64::from(v) - max).exp())
            .sum::<f64>()
            .ln();
    x.iter().map(|&v| f64::from(v) - lse).collect()
}

/// Σ_{i in set} p_i (lp_i - lq_i) over given log-prob vectors.
fn kl_ref(lp: &[f64], lq: &[f64]) -> f64 {
    lp.iter()
        .zip(lq)
        .filter(|(p, _)| **p > f64::NEG_INFINITY)
        .map(|(p, q)| p.exp() * (p - q))
        .sum()
}

fn full(a: &[f32], b: &[f32]) -> RowRecord {
    reduce(
        a,
        b,
        Some(3),
        VocabMode::Full,
        true,
        &mut Scratch::default(),
    )
    .expect("finite row")
}

fn assert_rel(got: f64, want: f64, what: &str) {
    let rel = ((got - want) / want.abs().max(1e-300)).abs();
    assert!(
        rel <= 1e-6 || (got - want).abs() < 1e-15,
        "{what}: got {got:e}, want {want:e} (rel {rel:e})"
    );
}

#[test]
fn full_vocabulary_matches_the_f64_reference() {
    let mut rng = Rng::new(1);
    for (case, sigma, noise) in [
        ("flat", 1.0, 1.0),
        ("peaked", 6.0, 0.5),
        ("close", 3.0, 0.01),
        ("very close", 3.0, 1e-3),
    ] {
        for _ in 0..5 {
            let a = rng.logits(5000, sigma);
            let b: Vec<f32> = a
                .iter()
                .map(|&x| (f64::from(x) + rng.normal() * noise) as f32)
                .collect();
            let r = full(&a, &b);
            let (lp, lq) = (log_softmax(&a), log_softmax(&b));
            assert_rel(r.forward, kl_ref(&lp, &lq), case);
            assert_rel(r.reverse, kl_ref(&lq, &lp), case);
            assert_rel(r.nll_ref.unwrap(), -lp[3], "nll_ref");
            assert_rel(r.nll_cand.unwrap(), -lq[3], "nll_cand");
        }
    }
}

#[test]
fn very_large_magnitudes_and_ties() {
    let mut rng = Rng::new(2);
    // bf16-like: values on a coarse grid tie often; a large common offset.
    let a: Vec<f32> = (0..4000)
        .map(|_| 30000.0 + (rng.normal() * 8.0).round() as f32 / 4.0)
        .collect();
    let b: Vec<f32> = a
        .iter()
        .map(|&x| x + (rng.normal() * 0.3).round() as f32 / 4.0)
        .collect();
    let r = full(&a, &b);
    assert_rel(
        r.forward,
        kl_ref(&log_softmax(&a), &log_softmax(&b)),
        "offset 30000",
    );
    assert_rel(
        r.reverse,
        kl_ref(&log_softmax(&b), &log_softmax(&a)),
        "offset 30000, reverse",
    );
    // Top-1 is the first index of the maximum.
    let t = vec![1.0f32, 5.0, 5.0, 2.0];
    assert_eq!(full(&t, &t).ref_top1, 1);
}

#[test]
fn reverse_when_the_candidate_moves_mass_onto_unlikely_tokens() {
    // The reverse KL is formed from the reference's weights; here the candidate's mass sits
    // where the reference's weights are 1e-13 to below f32's range (|x| far beyond 1).
    let mut rng = Rng::new(8);
    for boost in [30.0f32, 60.0, 95.0] {
        let mut a = rng.logits(6000, 2.0);
        a[10] += 20.0;
        let mut b: Vec<f32> = a.iter().map(|&x| x + 0.2 * rng.normal() as f32).collect();
        for i in [100, 2000, 5999] {
            a[i] -= boost;
            b[i] += 15.0;
        }
        let r = full(&a, &b);
        let (lp, lq) = (log_softmax(&a), log_softmax(&b));
        assert_rel(r.forward, kl_ref(&lp, &lq), "forward, moved mass");
        assert_rel(r.reverse, kl_ref(&lq, &lp), "reverse, moved mass");
    }
}

#[test]
fn a_distribution_against_itself_is_exactly_zero() {
    let mut rng = Rng::new(3);
    for sigma in [0.1, 1.0, 10.0] {
        let a = rng.logits(3000, sigma);
        let r = full(&a, &a);
        assert_eq!((r.forward, r.reverse), (0.0, 0.0));
        assert_eq!(r.ref_top1, r.cand_top1);
    }
}

#[test]
fn reverse_equals_forward_with_inputs_swapped() {
    let mut rng = Rng::new(4);
    let a = rng.logits(2000, 2.0);
    let b = rng.logits(2000, 2.0);
    // The kernel forms the reverse from the reference's weights in the same pass (not by a
    // second pass with the roles swapped), so the two agree to rounding, not to the bit.
    assert_rel(
        full(&a, &b).reverse,
        full(&b, &a).forward,
        "reverse vs swapped forward",
    );
    let b_close: Vec<f32> = a.iter().map(|&x| x + 0.01 * rng.normal() as f32).collect();
    assert_rel(
        full(&a, &b_close).reverse,
        full(&b_close, &a).forward,
        "close rows: reverse vs swapped forward",
    );
}

#[test]
fn negative_infinity_entries_are_masked_tokens() {
    let mut rng = Rng::new(5);
    let mut a = rng.logits(1000, 2.0);
    let mut b: Vec<f32> = a.iter().map(|&x| x + 0.1 * rng.normal() as f32).collect();
    for i in (0..1000).step_by(7) {
        a[i] = f32::NEG_INFINITY;
        b[i] = f32::NEG_INFINITY;
    }
    let r = full(&a, &b);
    let (lp, lq) = (log_softmax(&a), log_softmax(&b));
    assert_rel(r.forward, kl_ref(&lp, &lq), "masked both");
    assert_rel(r.reverse, kl_ref(&lq, &lp), "masked both, reverse");
    // The reference masks a token the candidate keeps: forward finite, reverse infinite.
    a[1] = f32::NEG_INFINITY;
    let r = full(&a, &b);
    assert_rel(
        r.forward,
        kl_ref(&log_softmax(&a), &log_softmax(&b)),
        "ref-only mask",
    );
    assert_eq!(r.reverse, f64::INFINITY);
}

#[test]
fn nan_and_positive_infinity_exclude_the_row() {
    let clean = [0.0f32, 1.0, 2.0];
    for bad in [[0.0f32, 1.0, f32::NAN], [0.0, f32::INFINITY, 1.0]] {
        for (a, b) in [(&bad, &clean), (&clean, &bad)] {
            let r = reduce(a, b, None, VocabMode::Full, true, &mut Scratch::default());
            assert!(r.is_none(), "{a:?} vs {b:?}");
        }
    }
}

fn top_k(a: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..a.len()).collect();
    idx.sort_by(|&i, &j| a[j].partial_cmp(&a[i]).unwrap().then(i.cmp(&j)));
    idx.truncate(k);
    idx
}

#[test]
fn top_k_modes_match_their_definitions() {
    let mut rng = Rng::new(6);
    let mut s = Scratch::default();
    for _ in 0..10 {
        let a = rng.logits(3000, 3.0);
        let b: Vec<f32> = a.iter().map(|&x| x + 0.2 * rng.normal() as f32).collect();
        let (lp, lq) = (log_softmax(&a), log_softmax(&b));
        let set = top_k(&a, 50);
        // lumped: the set plus one tail bucket.
        let tail = |l: &[f64]| (1.0 - set.iter().map(|&i| l[i].exp()).sum::<f64>()).ln();
        let mut lp_l: Vec<f64> = set.iter().map(|&i| lp[i]).collect();
        let mut lq_l: Vec<f64> = set.iter().map(|&i| lq[i]).collect();
        lp_l.push(tail(&lp));
        lq_l.push(tail(&lq));
        let r = reduce(
            &a,
            &b,
            None,
            VocabMode::TopK {
                k: 50,
                tail: Tail::Lumped,
            },
            true,
            &mut s,
        )
        .unwrap();
        assert_rel(r.forward, kl_ref(&lp_l, &lq_l), "lumped");
        assert_rel(r.reverse, kl_ref(&lq_l, &lp_l), "lumped reverse");
        // dropped: the full-vocabulary terms over the set.
        let lp_d: Vec<f64> = set.iter().map(|&i| lp[i]).collect();
        let lq_d: Vec<f64> = set.iter().map(|&i| lq[i]).collect();
        let r = reduce(
            &a,
            &b,
            None,
            VocabMode::TopK {
                k: 50,
                tail: Tail::Dropped,
            },
            true,
            &mut s,
        )
        .unwrap();
        assert_rel(r.forward, kl_ref(&lp_d, &lq_d), "dropped");
        // renormalized: both distributions over the set.
        let renorm = |l: &[f64]| {
            let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + l.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            l.iter().map(|v| v - lse).collect::<Vec<_>>()
        };
        let r = reduce(
            &a,
            &b,
            None,
            VocabMode::TopK {
                k: 50,
                tail: Tail::Renormalized,
            },
            true,
            &mut s,
        )
        .unwrap();
        assert_rel(
            r.forward,
            kl_ref(&renorm(&lp_d), &renorm(&lq_d)),
            "renormalized",
        );
        // threshold: reference terms with log p <= -8 dropped.
        let keep: Vec<usize> = (0..a.len()).filter(|&i| lp[i] > -8.0).collect();
        let r = reduce(
            &a,
            &b,
            None,
            VocabMode::Threshold { log_p: -8.0 },
            true,
            &mut s,
        )
        .unwrap();
        let (p_t, q_t): (Vec<f64>, Vec<f64>) = keep.iter().map(|&i| (lp[i], lq[i])).unzip();
        assert_rel(r.forward, kl_ref(&p_t, &q_t), "threshold");
    }
}

#[test]
fn lumped_top_k_never_exceeds_the_full_kl_and_converges_to_it() {
    let mut rng = Rng::new(7);
    let mut s = Scratch::default();
    for trial in 0..200 {
        let n = 50 + (rng.uniform() * 400.0) as usize;
        let sigma = 0.5 + rng.uniform() * 6.0;
        let a = rng.logits(n, sigma);
        let noise = if trial % 2 == 0 { 0.05 } else { 1.0 };
        let b: Vec<f32> = a
            .iter()
            .map(|&x| x + (noise * rng.normal()) as f32)
            .collect();
        let full = reduce(&a, &b, None, VocabMode::Full, true, &mut s).unwrap();
        let mut previous = 0.0;
        for k in [1, 2, 5, 10, 50, n] {
            let r = reduce(
                &a,
                &b,
                None,
                VocabMode::TopK {
                    k,
                    tail: Tail::Lumped,
                },
                true,
                &mut s,
            )
            .unwrap();
            // Within the full kernel's accuracy (1e-6 relative; it uses f32 exponentials).
            assert!(
                r.forward <= full.forward * (1.0 + 1e-6),
                "k={k}: {} > {}",
                r.forward,
                full.forward
            );
            assert!(r.reverse <= full.reverse * (1.0 + 1e-6), "reverse k={k}");
            assert!(
                r.forward >= previous * (1.0 - 1e-9) - 1e-15,
                "not monotone in k"
            );
            previous = r.forward;
        }
        let all = reduce(
            &a,
            &b,
            None,
            VocabMode::TopK {
                k: n,
                tail: Tail::Lumped,
            },
            true,
            &mut s,
        )
        .unwrap();
        assert_rel(all.forward, full.forward, "k = vocabulary");
    }
}

/// 200 rows of 2048 and the true next token of each, sampled from the reference: the candidate is
/// the reference plus `offset` (a common shift, which softmax ignores) plus N(0, noise²).
fn dump(
    seed: u64,
    sigma: f64,
    base: f64,
    offset: f64,
    noise: f64,
) -> Vec<(Vec<f32>, Vec<f32>, u32)> {
    let mut rng = Rng::new(seed);
    (0..200)
        .map(|_| {
            let a: Vec<f32> = (0..2048)
                .map(|_| (base + rng.normal() * sigma) as f32)
                .collect();
            let b: Vec<f32> = a
                .iter()
                .map(|&x| (f64::from(x) + offset + rng.normal() * noise) as f32)
                .collect();
            let lp = log_softmax(&a);
            let mut u = rng.uniform();
            let t = lp.iter().position(|l| {
                u -= l.exp();
                u <= 0.0
            });
            (a, b, t.unwrap_or(0) as u32)
        })
        .collect()
}

/// Every statistic of `--direction forward|reverse|both` on 200×2048 f32 rows against float64
/// straight from the definitions. Guards Δp: it is the difference of two close probabilities, so
/// the rounding of the logit difference at the scale of a common offset between the rows (and
/// the f32-vs-f64 centring constant in the candidate's normalizer) moved `delta_p_rms` by 1e-4
/// relative and more on these rows, and the KL by 5e-6.
#[test]
fn every_statistic_matches_the_f64_reference_in_every_direction_mode() {
    use super::protocol::Direction;
    use super::stats::{Scored, summarize};
    for (case, seed, sigma, base, offset, noise) in [
        ("quantization-like", 11, 2.0, 0.0, 0.0, 0.05),
        ("close, offset 1.5", 12, 3.0, 0.0, 1.5, 0.01),
        ("very close, offset 15", 13, 2.5, -20.0, 15.0, 1e-3),
        ("nearly equal, offset 40", 14, 1.0, 0.0, 40.0, 1e-4),
    ] {
        let rows = dump(seed, sigma, base, offset, noise);
        let (mut fwd, mut rev, mut nll_p, mut nll_q, mut dp2) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for (a, b, t) in &rows {
            let (lp, lq) = (log_softmax(a), log_softmax(b));
            let t = *t as usize;
            fwd += kl_ref(&lp, &lq);
            rev += kl_ref(&lq, &lp);
            nll_p -= lp[t];
            nll_q -= lq[t];
            dp2 += (lq[t].exp() - lp[t].exp()).powi(2);
        }
        let n = rows.len() as f64;
        let want = [
            ("kld_mean", fwd / n),
            ("kld_reverse_mean", rev / n),
            ("ppl_ref", (nll_p / n).exp()),
            ("ppl_cand", (nll_q / n).exp()),
            ("delta_p_rms", (dp2 / n).sqrt()),
        ];
        for direction in [Direction::Forward, Direction::Reverse, Direction::Both] {
            let mut scratch = Scratch::default();
            let scored: Vec<Scored> = rows
                .iter()
                .enumerate()
                .map(|(i, (a, b, t))| Scored {
                    record: reduce(
                        a,
                        b,
                        Some(*t),
                        VocabMode::Full,
                        direction.reverse(),
                        &mut scratch,
                    )
                    .expect("finite row"),
                    block: i as u32,
                    position: 0,
                    window_len: 2,
                })
                .collect();
            let metrics = summarize(
                &scored,
                direction.forward(),
                direction.reverse(),
                0,
                0,
                0.95,
            )
            .metrics;
            for (name, value) in want {
                let shown = match name {
                    "kld_mean" => direction.forward(),
                    "kld_reverse_mean" => direction.reverse(),
                    _ => true,
                };
                assert_eq!(
                    metrics.contains_key(name),
                    shown,
                    "{case}, {direction:?}: {name}"
                );
                if shown {
                    assert_rel(
                        metrics[name],
                        value,
                        &format!("{case}, {direction:?}: {name}"),
                    );
                }
            }
        }
    }
}

/// The kind each logit-file error belongs to: a dump or base file that breaks its format is a
/// format error, two files that do not describe the same rows are a mismatch, and an option that
/// does not fit the files is a usage mistake. Guards the conversion from the old catch-all kind;
/// the messages are the ones `kld` has always printed.
#[test]
fn logit_file_errors_name_their_kind() {
    use super::llamacpp::BaseFileWriter;
    use super::protocol::{Bootstrap, Direction, Positions};
    use super::source::LogitSource;
    use crate::checkpoint::dtype::Dtype;
    use crate::checkpoint::safetensors::serialize;
    use std::collections::BTreeMap;
    use std::path::Path;

    let dir = tempfile::tempdir().unwrap();
    let write_dump = |name: &str, rows: usize, vocab: usize| {
        let path = dir.path().join(name);
        let logits: Vec<u8> = (0..rows * vocab)
            .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
            .collect();
        let shape = [rows as u64, vocab as u64];
        let tensors: Vec<(&str, Dtype, &[u64], &[u8])> =
            vec![("logits", Dtype::F32, &shape, &logits)];
        std::fs::write(&path, serialize(&tensors, &BTreeMap::new())).unwrap();
        path
    };
    let options = |context_length: Option<u64>| super::Options {
        direction: Direction::Forward,
        vocab: VocabMode::Full,
        positions: Positions::All,
        context_length,
        vocab_size: None,
        bootstrap: Bootstrap {
            resamples: 10,
            seed: 1,
            level: 0.95,
        },
    };
    let open = |path: &Path| LogitSource::open(path, None).map(|_| ()).unwrap_err();

    // A truncated logit dump, garbage bytes, and a dump without its `logits` tensor: format.
    let reference = write_dump("ref.safetensors", 8, 16);
    let bytes = std::fs::read(&reference).unwrap();
    let cut = dir.path().join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 40]).unwrap();
    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"\xff\x00 not a safetensors file at all").unwrap();
    let no_logits = dir.path().join("no-logits.safetensors");
    let ids = [0u8; 32];
    let shape = [8u64];
    let tensors: Vec<(&str, Dtype, &[u64], &[u8])> = vec![("tokens", Dtype::I32, &shape, &ids)];
    std::fs::write(&no_logits, serialize(&tensors, &BTreeMap::new())).unwrap();
    for path in [&cut, &garbage, &no_logits] {
        let e = open(path);
        assert!(e.is_format(), "{e:?}");
        assert_eq!(e.kind_name(), "format");
        assert_eq!(e.file, *path);
    }
    assert_eq!(
        open(&no_logits).to_string(),
        format!(
            "{}: logits: a logit dump needs a `logits` tensor [rows, vocab]",
            no_logits.display()
        )
    );

    // A truncated llama.cpp base file (its header promises more rows than it holds): format.
    let base = dir.path().join("ref.kld");
    let mut w = BaseFileWriter::create(&base, 8, 4, &[0; 8]).unwrap();
    for _ in 0..3 {
        w.write_row_logits(&[0.0, 1.0, 2.0, 3.0]).unwrap();
    }
    w.finish().unwrap();
    let bytes = std::fs::read(&base).unwrap();
    std::fs::write(&base, &bytes[..bytes.len() - 5]).unwrap();
    let e = open(&base);
    assert!(e.is_format(), "{e:?}");
    assert!(e.to_string().contains("truncated"), "{e}");

    // A candidate whose rows are another width than the reference's: a mismatch, not a format
    // error (each file is fine on its own).
    let narrow = write_dump("narrow.safetensors", 8, 12);
    let e = super::measure(&reference, &narrow, &options(None)).unwrap_err();
    assert!(e.is_mismatch() && !e.is_format(), "{e:?}");
    assert_eq!(e.file, narrow);
    assert_eq!(
        e.to_string(),
        format!(
            "{}: vocabulary mismatch: 12 entries per row, the reference {} has 16",
            narrow.display(),
            reference.display()
        )
    );
    let short = write_dump("short.safetensors", 4, 16);
    let e = super::measure(&reference, &short, &options(None)).unwrap_err();
    assert!(e.is_mismatch(), "{e:?}");

    // A --context-length the rows are not whole windows of: the request, not the file.
    let e = super::measure(&reference, &reference, &options(Some(3))).unwrap_err();
    assert!(e.is_usage() && !e.is_format(), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: logits: 8 rows are not whole windows of --context-length 3 (one row per token)",
            reference.display()
        )
    );
}
