//! The full-vocabulary row kernel: both KL directions and both log-normalizers in three passes
//! over the row, with the exponentials in f32 (vectorizable) and everything that needs precision
//! in f64.
//!
//! Why f32 exponentials are enough here: the KL is formed as `log1p(E_p[g(x)])` with
//! `x = c - E_p[c]`, `c = a - b` (exact in f64) and `g(x) = e^-x - 1 + x >= 0`. The weights
//! `p ∝ exp(a - max)` enter only as weights of non-negative terms, so their ~1e-7 relative error
//! moves the KL by ~1e-7 relative. `g` itself never subtracts two rounded exponentials where it
//! is small: for |x| < 1 it is a polynomial in the exact `x`; for |x| >= 1 it is at least 0.36,
//! so the f32 error of `e^-x` (taken as the ratio of the two rows' exponentials) stays ~1e-7 of it.

/// Define `$avx2` as `$impl_` compiled for AVX2 and FMA, and `$public` calling it when the CPU
/// has them (checked at run time), else the portable build of the same code.
macro_rules! dispatched {
    ($(#[$meta:meta])* pub fn $public:ident / $avx2:ident => $impl_:ident($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        fn $avx2($($arg: $ty),*) -> $ret {
            $impl_($($arg),*)
        }

        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        pub fn $public($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            if super::simd::has_avx2_fma() {
                // SAFETY: the CPU has AVX2 and FMA (checked just above), which is the only
                // requirement for calling a `#[target_feature(enable = "avx2,fma")]` function.
                #[allow(unsafe_code)]
                return unsafe { $avx2($($arg),*) };
            }
            $impl_($($arg),*)
        }
    };
}

/// `e^x` for x <= 0 in f32, branch-free so loops over it vectorize. Relative error below 2e-7;
/// arguments below -87 give 0 (such weights are below f32's normal range and irrelevant to a sum
/// dominated by values near 1).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let x = x.max(-87.0);
    // Round x·log2(e) to an integer n with the magic-number trick: the low bits of `t` then hold
    // n itself, so 2^n is built with integer operations only (no float-to-int conversion, whose
    // saturating semantics would keep the loop from vectorizing).
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Cephes expf minimax polynomial on [-ln2/2, ln2/2].
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let n_int = t.to_bits().wrapping_sub(ROUND.to_bits()); // n as a two's-complement integer
    let bits = n_int.wrapping_add(127) << 23;
    y * f32::from_bits(bits)
}

/// `g(x) = e^-x - 1 + x` for |x| < 1, as its series in f32 (relative error about 1e-7, the
/// truncation after x¹⁰ below 3e-8).
#[inline(always)]
fn g_small(x: f32) -> f32 {
    let mut p = 1.0 / 3_628_800.0f32; // 1/10!
    p = p * x - 1.0 / 362_880.0;
    p = p * x + 1.0 / 40_320.0;
    p = p * x - 1.0 / 5_040.0;
    p = p * x + 1.0 / 720.0;
    p = p * x - 1.0 / 120.0;
    p = p * x + 1.0 / 24.0;
    p = p * x - 1.0 / 6.0;
    p = p * x + 0.5;
    p * x * x
}

/// What the kernel returns for one row.
#[derive(Debug, Clone, Copy)]
pub struct FullRow {
    pub forward: f64,
    pub reverse: f64,
    pub lse_a: f64,
    pub lse_b: f64,
}

/// Lanes of the hand-split reductions: f64 sums in a fixed order are a dependency chain LLVM may
/// not reorder; separate lanes let it vectorize, and the result is still deterministic.
const LANES: usize = 8;

#[inline(always)]
fn lanes_sum(acc: [f64; LANES]) -> f64 {
    acc.iter().sum()
}

/// What one pass over a row finds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scan {
    /// A NaN or +inf is present (the row is excluded).
    pub non_finite: bool,
    /// A -inf (masked token) is present.
    pub masked: bool,
    pub max: f32,
    /// First index of the maximum.
    pub argmax: u32,
}

#[inline(always)]
fn scan_impl(x: &[f32]) -> Scan {
    let mut bad = [false; LANES];
    let mut masked = [false; LANES];
    let mut max = [f32::NEG_INFINITY; LANES];
    let n = x.len() / LANES * LANES;
    for c in x[..n].chunks_exact(LANES) {
        for j in 0..LANES {
            let v = c[j];
            bad[j] |= v.is_nan() | (v == f32::INFINITY);
            masked[j] |= v == f32::NEG_INFINITY;
            max[j] = if v > max[j] { v } else { max[j] };
        }
    }
    let mut scan = Scan {
        non_finite: bad.iter().any(|b| *b),
        masked: masked.iter().any(|b| *b),
        max: max
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m }),
        argmax: 0,
    };
    for &v in &x[n..] {
        scan.non_finite |= v.is_nan() | (v == f32::INFINITY);
        scan.masked |= v == f32::NEG_INFINITY;
        if v > scan.max {
            scan.max = v;
        }
    }
    // The first index of the maximum: test whole chunks for it (vectorized), then look inside
    // the first chunk that has it.
    let target = scan.max;
    let hit = x
        .chunks(64)
        .position(|c| c.iter().fold(0u32, |f, &v| f | u32::from(v == target)) != 0);
    scan.argmax = hit
        .and_then(|k| {
            x[k * 64..]
                .iter()
                .position(|&v| v == target)
                .map(|i| (k * 64 + i) as u32)
        })
        .unwrap_or(0);
    scan
}

dispatched! {
    /// NaN/+inf and -inf presence, the maximum and its first index.
    pub fn scan / scan_avx2 => scan_impl(x: &[f32]) -> Scan
}

/// Σ f64(x), in lanes.
#[inline(always)]
fn sum_f64(x: &[f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let blocks = x.chunks_exact(BLOCK);
    let rest: f64 = blocks.remainder().iter().map(|&v| f64::from(v)).sum();
    for blk in blocks {
        let mut t = [0f32; LANES];
        for c in blk.chunks_exact(LANES) {
            for j in 0..LANES {
                t[j] += c[j];
            }
        }
        for j in 0..LANES {
            acc[j] += f64::from(t[j]);
        }
    }
    lanes_sum(acc) + rest
}

/// Elements summed in f32 before joining the f64 total: 8 per lane, so a block's partial sum
/// carries at most 8 roundings (relative error below 5e-7 even when every term has the same
/// sign, about 1e-7 typically) while the f64 work drops eightfold.
const BLOCK: usize = 8 * LANES;

/// Σ w (a - b). An error here only shifts the centring constant m, which moves the KL by a
/// relative amount of the same size (see the module comment), so f32 products are enough.
#[inline(always)]
fn weighted_diff(w: &[f32], a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let n = w.len() / BLOCK * BLOCK;
    for ((bw, ba), bb) in w[..n]
        .chunks_exact(BLOCK)
        .zip(a[..n].chunks_exact(BLOCK))
        .zip(b[..n].chunks_exact(BLOCK))
    {
        let mut t = [0f32; LANES];
        for ((cw, ca), cb) in bw
            .chunks_exact(LANES)
            .zip(ba.chunks_exact(LANES))
            .zip(bb.chunks_exact(LANES))
        {
            for j in 0..LANES {
                t[j] += cw[j] * (ca[j] - cb[j]);
            }
        }
        for j in 0..LANES {
            acc[j] += f64::from(t[j]);
        }
    }
    let rest: f64 = (n..w.len())
        .map(|i| f64::from(w[i]) * (f64::from(a[i]) - f64::from(b[i])))
        .sum();
    lanes_sum(acc) + rest
}

/// One summand `w_p g(x)` of the KL, with `x = (p - q) - m` the centred logit difference and `w_q κ`
/// standing for `w_p e^{-x}` when |x| >= 1 (see the module comment).
#[inline(always)]
fn term(wp: f32, wq: f32, p: f32, q: f32, m: f32, kappa: f32) -> f32 {
    let x = (p - q) - m;
    let small = wp * g_small(x);
    let large = wq * kappa - wp + wp * x;
    if x.abs() < 1.0 { small } else { large }
}

/// Σ term over the row, f32 terms summed in f64 lanes.
#[inline(always)]
fn kl_sum(wp: &[f32], wq: &[f32], p: &[f32], q: &[f32], m: f32, kappa: f32) -> f64 {
    let mut acc = [0f64; LANES];
    let n = wp.len() / BLOCK * BLOCK;
    let blocks = wp[..n]
        .chunks_exact(BLOCK)
        .zip(wq[..n].chunks_exact(BLOCK))
        .zip(p[..n].chunks_exact(BLOCK))
        .zip(q[..n].chunks_exact(BLOCK));
    for (((bwp, bwq), bp), bq) in blocks {
        let mut t = [0f32; LANES];
        let chunks = bwp
            .chunks_exact(LANES)
            .zip(bwq.chunks_exact(LANES))
            .zip(bp.chunks_exact(LANES))
            .zip(bq.chunks_exact(LANES));
        for (((cwp, cwq), cp), cq) in chunks {
            for j in 0..LANES {
                t[j] += term(cwp[j], cwq[j], cp[j], cq[j], m, kappa);
            }
        }
        for j in 0..LANES {
            acc[j] += f64::from(t[j]);
        }
    }
    let rest: f64 = (n..wp.len())
        .map(|i| f64::from(term(wp[i], wq[i], p[i], q[i], m, kappa)))
        .sum();
    lanes_sum(acc) + rest
}

#[inline(always)]
fn exp_row(x: &[f32], max: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = exp_f32(v - max);
    }
}

#[inline(always)]
fn full_row_impl(
    a: &[f32],
    b: &[f32],
    max_a: f32,
    max_b: f32,
    want_reverse: bool,
    ea: &mut [f32],
    eb: &mut [f32],
) -> FullRow {
    // Pass 1, a tile at a time so the tile stays in L1: exponentials, their sums and the
    // weighted mean of c = a - b.
    let (mut sa, mut sb, mut wd) = (0.0f64, 0.0f64, 0.0f64);
    for start in (0..a.len()).step_by(TILE) {
        let end = (start + TILE).min(a.len());
        let (ta, tb) = (&a[start..end], &b[start..end]);
        let (tea, teb) = (&mut ea[start..end], &mut eb[start..end]);
        exp_row(ta, max_a, tea);
        exp_row(tb, max_b, teb);
        sa += sum_f64(tea);
        sb += sum_f64(teb);
        wd += weighted_diff(tea, ta, tb);
    }
    let m_a = wd / sa;
    let lse_a = f64::from(max_a) + sa.ln();
    let lse_b = f64::from(max_b) + sb.ln();
    // Pass 2: the non-negative summands.
    let ln_kf = f64::from(max_b) - f64::from(max_a) + m_a;
    let m_b = if want_reverse {
        weighted_diff(eb, b, a) / sb
    } else {
        0.0
    };
    let ln_kr = f64::from(max_a) - f64::from(max_b) + m_b;
    if ln_kf.abs() > 60.0 || ln_kr.abs() > 60.0 {
        return masked_row(a, b, max_a, max_b, want_reverse);
    }
    let forward = (kl_sum(ea, eb, a, b, m_a as f32, ln_kf.exp() as f32) / sa).ln_1p();
    let reverse = if want_reverse {
        (kl_sum(eb, ea, b, a, m_b as f32, ln_kr.exp() as f32) / sb).ln_1p()
    } else {
        f64::NAN
    };
    FullRow {
        forward,
        reverse,
        lse_a,
        lse_b,
    }
}

/// Elements per tile of pass 1 (4 arrays of 8 KiB: well inside L1).
const TILE: usize = 2048;

/// KL both ways over the full vocabulary. `a` and `b` must be free of NaN and +inf (checked by
/// the caller); `masked` says whether either holds -inf (masked tokens), which takes the careful
/// all-f64 path. `ea`/`eb` are scratch buffers.
#[allow(clippy::too_many_arguments)]
pub fn full_row(
    a: &[f32],
    b: &[f32],
    max_a: f32,
    max_b: f32,
    masked: bool,
    want_reverse: bool,
    ea: &mut Vec<f32>,
    eb: &mut Vec<f32>,
) -> FullRow {
    if masked {
        return masked_row(a, b, max_a, max_b, want_reverse);
    }
    ea.resize(a.len(), 0.0);
    eb.resize(a.len(), 0.0);
    unmasked_row(
        a,
        b,
        max_a,
        max_b,
        want_reverse,
        ea.as_mut_slice(),
        eb.as_mut_slice(),
    )
}

dispatched! {
    /// The vectorized path for rows without masked tokens.
    pub fn unmasked_row / unmasked_row_avx2 => full_row_impl(
        a: &[f32], b: &[f32], max_a: f32, max_b: f32, want_reverse: bool, ea: &mut [f32], eb: &mut [f32]
    ) -> FullRow
}

/// The careful all-f64 path for rows with masked (-inf) tokens or extreme scale differences.
fn masked_row(a: &[f32], b: &[f32], max_a: f32, max_b: f32, want_reverse: bool) -> FullRow {
    let lse = |x: &[f32], max: f32| {
        let m = f64::from(max);
        m + x
            .iter()
            .map(|&v| (f64::from(v) - m).exp())
            .sum::<f64>()
            .ln()
    };
    FullRow {
        forward: super::row::kl_f64(a, b, f64::from(max_a)),
        reverse: if want_reverse {
            super::row::kl_f64(b, a, f64::from(max_b))
        } else {
            f64::NAN
        },
        lse_a: lse(a, max_a),
        lse_b: lse(b, max_b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_f32_is_accurate_on_its_domain() {
        let mut worst = 0.0f64;
        let mut x = 0.0f32;
        while x > -87.0 {
            let got = f64::from(exp_f32(x));
            let want = f64::from(x).exp();
            worst = worst.max(((got - want) / want).abs());
            x -= 0.000_37;
        }
        assert!(worst < 2e-7, "worst relative error {worst:e}");
        assert_eq!(exp_f32(f32::NEG_INFINITY), exp_f32(-87.0));
        assert!(exp_f32(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn g_series_matches_expm1() {
        for i in -999..1000 {
            let x = (f64::from(i) / 1000.0) as f32;
            let exact = (-f64::from(x)).exp_m1() + f64::from(x);
            let got = f64::from(g_small(x));
            assert!(
                ((got - exact) / exact.max(1e-300)).abs() < 3e-7 || exact < 1e-30,
                "{x}: {got} vs {exact}"
            );
        }
    }
}
