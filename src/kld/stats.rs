//! From per-row records to the metric vocabulary: means, percentiles, perplexities, the i.i.d.
//! standard error llama.cpp prints, a seeded block bootstrap for every metric, and diagnostics
//! that show where divergence sits (depth in the window, reference confidence).

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::json_f64;

use super::row::RowRecord;

/// One scored row with where it sits.
#[derive(Debug, Clone, Copy)]
pub struct Scored {
    pub record: RowRecord,
    /// Index of the window (bootstrap block) the row belongs to.
    pub block: u32,
    /// Row position j in its window, and the window's length.
    pub position: u64,
    pub window_len: u64,
}

/// Percentile levels reported for each KL direction (besides mean and max).
pub const PERCENTILES: &[(&str, f64)] = &[
    ("median", 0.5),
    ("p90", 0.9),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p999", 0.999),
];

/// Fewer rows than this beyond a percentile make it low-support: its value is noise.
pub const MIN_TAIL_ROWS: f64 = 100.0;

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Uncertainty {
    /// i.i.d. per-row standard error (llama.cpp's formula), where one exists for the metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sem: Option<f64>,
    /// Block-bootstrap percentile interval at the protocol's level (null ends: not finite).
    #[serde(deserialize_with = "json_f64::pair")]
    #[schemars(with = "[Option<f64>; 2]")]
    pub ci95: [f64; 2],
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Bucket {
    pub label: String,
    pub n: usize,
    pub kld_mean: Option<f64>,
    pub top1_flips: usize,
    pub flip_rate: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Diagnostics {
    /// 8 equal buckets of j / window length.
    pub by_depth: Vec<Bucket>,
    /// Buckets of the reference's top-1 probability.
    pub by_confidence: Vec<Bucket>,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Summary {
    /// Metric values by name (the vocabulary in `definitions`); null: not finite.
    #[serde(deserialize_with = "json_f64::map")]
    #[schemars(with = "BTreeMap<String, Option<f64>>")]
    pub metrics: BTreeMap<String, f64>,
    pub uncertainty: BTreeMap<String, Uncertainty>,
    pub low_support: Vec<String>,
    pub diagnostics: Diagnostics,
}

/// The rows' order by each KL direction, computed once: a bootstrap resample is a multiset of
/// the rows, so its sorted values are these orders with each row repeated by its count, and its
/// percentiles need a walk over the counts instead of a sort (n log n per resample).
struct Orders {
    forward: Vec<u32>,
    reverse: Vec<u32>,
}

impl Orders {
    fn new(rows: &[Scored]) -> Orders {
        let order = |key: fn(&RowRecord) -> f64| {
            let mut o: Vec<u32> = (0..rows.len() as u32).collect();
            o.sort_by(|&a, &b| {
                key(&rows[a as usize].record).total_cmp(&key(&rows[b as usize].record))
            });
            o
        };
        Orders {
            forward: order(|r| r.forward),
            reverse: order(|r| r.reverse),
        }
    }
}

/// Metric values of one sample of rows: each row `counts[i]` times (a bootstrap resample), or
/// once (`None`, the full set).
fn metrics(
    rows: &[Scored],
    counts: Option<&[u32]>,
    orders: &Orders,
    forward: bool,
    reverse: bool,
    tokens: bool,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let count = |i: usize| counts.map_or(1, |c| c[i]);
    let m: u64 = counts.map_or(rows.len() as u64, |c| c.iter().map(|&k| u64::from(k)).sum());
    if m == 0 {
        return out;
    }
    let mut add_kl = |prefix: &str, order: &[u32], value: fn(&RowRecord) -> f64| {
        // Ranks wanted: each percentile's two neighbours at q·(m-1), and the maximum.
        let mut wanted: Vec<(usize, u64)> = Vec::new();
        for (k, (_, q)) in PERCENTILES.iter().enumerate() {
            let pos = q * (m - 1) as f64;
            let lo = pos.floor() as u64;
            wanted.push((2 * k, lo));
            wanted.push((2 * k + 1, (lo + 1).min(m - 1)));
        }
        wanted.sort_by_key(|&(_, rank)| rank);
        let mut at = vec![0.0f64; 2 * PERCENTILES.len()];
        let (mut sum, mut seen, mut next, mut max) = (0.0f64, 0u64, 0usize, f64::NAN);
        for &j in order {
            let c = count(j as usize);
            if c == 0 {
                continue;
            }
            let v = value(&rows[j as usize].record);
            sum += f64::from(c) * v;
            seen += u64::from(c);
            while next < wanted.len() && wanted[next].1 < seen {
                at[wanted[next].0] = v;
                next += 1;
            }
            max = v;
        }
        out.insert(format!("{prefix}_mean"), sum / m as f64);
        for (k, (name, q)) in PERCENTILES.iter().enumerate() {
            let pos = q * (m - 1) as f64;
            let frac = pos - pos.floor();
            let (lo, hi) = (at[2 * k], at[2 * k + 1]);
            out.insert(format!("{prefix}_{name}"), lo + (hi - lo) * frac);
        }
        out.insert(format!("{prefix}_max"), max);
    };
    if forward {
        add_kl("kld", &orders.forward, |r| r.forward);
    }
    if reverse {
        add_kl("kld_reverse", &orders.reverse, |r| r.reverse);
    }
    let weighted = |f: &dyn Fn(&RowRecord) -> f64| {
        rows.iter()
            .enumerate()
            .map(|(i, r)| f64::from(count(i)) * f(&r.record))
            .sum::<f64>()
            / m as f64
    };
    let agree = weighted(&|r| f64::from(u8::from(r.ref_top1 == r.cand_top1)));
    out.insert("top1_agreement".into(), agree);
    if tokens {
        let nll_ref = weighted(&|r| r.nll_ref.unwrap_or(f64::NAN));
        let nll_cand = weighted(&|r| r.nll_cand.unwrap_or(f64::NAN));
        out.insert("ppl_ref".into(), nll_ref.exp());
        out.insert("ppl_cand".into(), nll_cand.exp());
        out.insert("ppl_ratio".into(), (nll_cand - nll_ref).exp());
        let dp2 = weighted(&|r| r.delta_p().map_or(f64::NAN, |d| d * d));
        out.insert("delta_p_rms".into(), dp2.sqrt());
    }
    out
}

/// Linear interpolation at q·(n-1) over sorted values (numpy's default). `q` outside [0, 1] is
/// clamped to it and a NaN `q` or no values give NaN: a caller's bad level never indexes past
/// the values (callers validate levels; this only keeps the library from panicking).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if n == 0 || q.is_nan() {
        return f64::NAN;
    }
    if n == 1 {
        return sorted[0];
    }
    let q = q.clamp(0.0, 1.0);
    let pos = q * (n - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(n - 1);
    let frac = pos - lo as f64;
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

/// llama.cpp's `mean_and_uncertainty`: the i.i.d. standard error of a mean (0 when undefined).
fn sem(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut s, mut s2, mut n) = (0.0f64, 0.0f64, 0usize);
    for v in values {
        s += v;
        s2 += v * v;
        n += 1;
    }
    let mean = s / n as f64;
    let var = s2 / n as f64 - mean * mean;
    let u = if var > 0.0 && n > 10 {
        (var / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    (mean, u)
}

pub fn summarize(
    rows: &[Scored],
    forward: bool,
    reverse: bool,
    resamples: usize,
    seed: u64,
    level: f64,
) -> Summary {
    let tokens = !rows.is_empty()
        && rows
            .iter()
            .all(|r| r.record.nll_ref.is_some() && r.record.nll_cand.is_some());
    let orders = Orders::new(rows);
    let metrics = metrics(rows, None, &orders, forward, reverse, tokens);
    let n = rows.len();

    // Blocks for the bootstrap: the rows of each window (or run of rows) stay together.
    let mut blocks: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        blocks.entry(r.block).or_default().push(i);
    }
    let blocks: Vec<Vec<usize>> = blocks.into_values().collect();
    let samples: Vec<BTreeMap<String, f64>> = (0..resamples)
        .into_par_iter()
        .map_init(
            || vec![0u32; n],
            |counts, i| {
                let mut rng = SplitMix64::for_stream(seed, i as u64);
                counts.iter_mut().for_each(|c| *c = 0);
                for _ in 0..blocks.len() {
                    for &r in &blocks[rng.below(blocks.len() as u64) as usize] {
                        counts[r] += 1;
                    }
                }
                self::metrics(rows, Some(counts), &orders, forward, reverse, tokens)
            },
        )
        .collect();

    let alpha = (1.0 - level) / 2.0;
    let mut uncertainty = BTreeMap::new();
    for name in metrics.keys() {
        let mut values: Vec<f64> = samples
            .iter()
            .filter_map(|s| s.get(name).copied())
            .collect();
        values.sort_by(|a, b| a.total_cmp(b));
        let ci95 = if values.is_empty() {
            [f64::NAN, f64::NAN]
        } else {
            [percentile(&values, alpha), percentile(&values, 1.0 - alpha)]
        };
        uncertainty.insert(
            name.clone(),
            Uncertainty {
                sem: iid_sem(name, rows, &metrics),
                ci95,
            },
        );
    }

    let low_support = PERCENTILES
        .iter()
        .filter(|(_, q)| (n as f64) * (1.0 - q) < MIN_TAIL_ROWS)
        .flat_map(|(name, _)| {
            let mut v = Vec::new();
            if forward {
                v.push(format!("kld_{name}"));
            }
            if reverse {
                v.push(format!("kld_reverse_{name}"));
            }
            v
        })
        .chain(
            ((n as f64) < MIN_TAIL_ROWS)
                .then(|| {
                    let mut v = Vec::new();
                    if forward {
                        v.push("kld_max".to_owned());
                    }
                    if reverse {
                        v.push("kld_reverse_max".to_owned());
                    }
                    v
                })
                .into_iter()
                .flatten(),
        )
        .collect();

    Summary {
        metrics,
        uncertainty,
        low_support,
        diagnostics: diagnostics(rows, forward),
    }
}

/// The i.i.d. standard errors llama.cpp prints, for the metrics that have one.
fn iid_sem(name: &str, rows: &[Scored], metrics: &BTreeMap<String, f64>) -> Option<f64> {
    let n = rows.len();
    match name {
        "kld_mean" => Some(sem(rows.iter().map(|r| r.record.forward)).1),
        "kld_reverse_mean" => Some(sem(rows.iter().map(|r| r.record.reverse)).1),
        "top1_agreement" => {
            let p = metrics[name];
            (n > 1).then(|| (p * (1.0 - p) / (n - 1) as f64).sqrt())
        }
        "ppl_ref" => {
            Some(metrics[name] * sem(rows.iter().map(|r| r.record.nll_ref.unwrap_or(f64::NAN))).1)
        }
        "ppl_cand" => {
            Some(metrics[name] * sem(rows.iter().map(|r| r.record.nll_cand.unwrap_or(f64::NAN))).1)
        }
        "ppl_ratio" => {
            let (_, u1) = sem(rows.iter().map(|r| r.record.nll_cand.unwrap_or(f64::NAN)));
            let (_, u2) = sem(rows.iter().map(|r| r.record.nll_ref.unwrap_or(f64::NAN)));
            let cov = covariance(rows);
            Some(metrics[name] * (u1 * u1 + u2 * u2 - 2.0 * cov).max(0.0).sqrt())
        }
        "delta_p_rms" => {
            let (mean2, u) = sem(rows
                .iter()
                .map(|r| r.record.delta_p().map_or(f64::NAN, |d| d * d)));
            let rms = mean2.sqrt();
            Some(if rms > 0.0 { 0.5 / rms * u } else { 0.0 })
        }
        _ => None,
    }
}

/// llama.cpp's covariance of the two mean NLLs.
fn covariance(rows: &[Scored]) -> f64 {
    let n = rows.len();
    if n < 10 {
        return 0.0;
    }
    let (mut sa, mut sb, mut sab) = (0.0, 0.0, 0.0);
    for r in rows {
        let (a, b) = (
            r.record.nll_cand.unwrap_or(f64::NAN),
            r.record.nll_ref.unwrap_or(f64::NAN),
        );
        sa += a;
        sb += b;
        sab += a * b;
    }
    let nf = n as f64;
    (sab / nf - (sa / nf) * (sb / nf)) / (nf - 1.0)
}

/// Reference-confidence buckets (as exllamav3's model_diff): [0, .25), [.25, .5), [.5, .75),
/// [.75, .95), [.95, 1].
const CONFIDENCE_EDGES: &[f64] = &[0.0, 0.25, 0.5, 0.75, 0.95, 1.0];

fn diagnostics(rows: &[Scored], forward: bool) -> Diagnostics {
    let bucket = |label: String, members: Vec<&Scored>| {
        let n = members.len();
        let flips = members
            .iter()
            .filter(|r| r.record.ref_top1 != r.record.cand_top1)
            .count();
        Bucket {
            label,
            n,
            kld_mean: (n > 0 && forward)
                .then(|| members.iter().map(|r| r.record.forward).sum::<f64>() / n as f64),
            top1_flips: flips,
            flip_rate: (n > 0).then(|| flips as f64 / n as f64),
        }
    };
    let by_depth = (0..8)
        .map(|b| {
            let members = rows
                .iter()
                .filter(|r| ((r.position * 8) / r.window_len.max(1)).min(7) == b)
                .collect();
            bucket(format!("{}/8–{}/8", b, b + 1), members)
        })
        .collect();
    let by_confidence = CONFIDENCE_EDGES
        .windows(2)
        .enumerate()
        .map(|(i, w)| {
            let last = i == CONFIDENCE_EDGES.len() - 2;
            let members = rows
                .iter()
                .filter(|r| {
                    let p = r.record.ref_top1_prob;
                    p >= w[0] && (p < w[1] || (last && p <= w[1]))
                })
                .collect();
            let close = if last { "]" } else { ")" };
            bucket(format!("[{:.2}, {:.2}{close}", w[0], w[1]), members)
        })
        .collect();
    Diagnostics {
        by_depth,
        by_confidence,
    }
}

/// SplitMix64: a tiny, fully specified generator, so a recorded seed reproduces the same
/// resamples in every version (a library's generator may change between releases).
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// An independent stream per resample. Seeding stream i with `seed ^ i·γ` (γ the SplitMix
    /// increment) would make stream i the same sequence as stream 0 shifted by i draws, and the
    /// resamples nearly identical; a state passed through the output mix is not.
    pub fn for_stream(seed: u64, stream: u64) -> Self {
        SplitMix64(SplitMix64(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, n) without modulo bias (Lemire's multiply-shift with rejection).
    pub fn below(&mut self, n: u64) -> u64 {
        loop {
            let x = self.next_u64();
            let m = u128::from(x) * u128::from(n);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.5);
        assert_eq!(percentile(&v, 0.9), 3.7);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(percentile(&[5.0], 0.99), 5.0);
    }

    /// Regression: resample streams seeded `seed ^ i·γ` were shifted copies of one sequence, so
    /// the resamples barely differed and the intervals were far too narrow (they even missed the
    /// point estimate). The interval of a mean must match the normal approximation's width.
    #[test]
    fn bootstrap_interval_of_a_mean_has_the_normal_width() {
        use super::super::row::RowRecord;
        let mut rng = SplitMix64::new(42);
        let rows: Vec<Scored> = (0..4000u32)
            .map(|i| {
                let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
                Scored {
                    record: RowRecord {
                        forward: u,
                        reverse: u,
                        ref_top1: 0,
                        cand_top1: 0,
                        ref_top1_prob: 0.5,
                        nll_ref: None,
                        nll_cand: None,
                    },
                    block: i / 50,
                    position: u64::from(i % 50),
                    window_len: 51,
                }
            })
            .collect();
        let s = summarize(&rows, true, false, 2000, 0, 0.95);
        let mean = s.metrics["kld_mean"];
        let [lo, hi] = s.uncertainty["kld_mean"].ci95;
        assert!(lo < mean && mean < hi, "{lo} {mean} {hi}");
        // Uniform values: sd = 1/sqrt(12); normal 95% half-width = 1.96 sd / sqrt(n).
        let expected = 1.96 / 12f64.sqrt() / 4000f64.sqrt();
        let half = (hi - lo) / 2.0;
        assert!(
            (half / expected - 1.0).abs() < 0.2,
            "half-width {half}, expected {expected}"
        );
    }

    /// Regression (#14): a card's `level: 2.0` made the interval's upper percentile index past
    /// the resamples (a panic in `summarize`). Bad levels are refused before a measurement; the
    /// statistics themselves must not panic on any level.
    #[test]
    fn no_level_makes_the_bootstrap_panic() {
        let v = [1.0, 2.0, 3.0];
        assert_eq!(percentile(&v, 1.5), 3.0);
        assert_eq!(percentile(&v, -0.5), 1.0);
        assert!(percentile(&v, f64::NAN).is_nan());
        assert!(percentile(&[], 0.5).is_nan());
        let rows: Vec<Scored> = (0..50u32)
            .map(|i| Scored {
                record: RowRecord {
                    forward: f64::from(i),
                    reverse: f64::from(i),
                    ref_top1: 0,
                    cand_top1: 0,
                    ref_top1_prob: 0.5,
                    nll_ref: None,
                    nll_cand: None,
                },
                block: i / 5,
                position: u64::from(i % 5),
                window_len: 6,
            })
            .collect();
        for level in [2.0, 1.0, 0.0, -1.0, f64::NAN, f64::INFINITY] {
            let s = summarize(&rows, true, true, 20, 0, level);
            assert!(s.uncertainty.contains_key("kld_mean"), "{level}");
        }
    }

    #[test]
    fn resample_streams_do_not_overlap() {
        let a: Vec<u64> = {
            let mut r = SplitMix64::for_stream(0, 0);
            (0..64).map(|_| r.next_u64()).collect()
        };
        let mut r = SplitMix64::for_stream(0, 1);
        let b: Vec<u64> = (0..64).map(|_| r.next_u64()).collect();
        assert!(a.iter().all(|x| !b.contains(x)));
    }

    #[test]
    fn splitmix_is_the_reference_sequence() {
        // First outputs of SplitMix64 seeded with 1234567 (Vigna's reference implementation).
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        let mut r = SplitMix64::new(7);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
        }
    }
}
