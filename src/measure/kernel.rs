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

/// Run `$call` compiled for AVX2 and FMA when the CPU has them (checked once at run time), else
/// for the baseline target. The body is the same code; only the instructions differ.
macro_rules! dispatch {
    ($name:ident($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if super::simd::has_avx2_fma() {
                super::simd::avx2(|| $name($($arg),*))
            } else {
                $name($($arg),*)
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $name($($arg),*)
        }
    }};
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
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    // Cephes expf minimax polynomial on [-ln2/2, ln2/2].
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let y = p * r * r + r + 1.0;
    let bits = ((n as i32 + 127) as u32) << 23;
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

/// One scan: NaN or +inf present, and the maximum.
#[inline(always)]
fn scan_impl(x: &[f32]) -> (bool, f32) {
    let mut bad = [false; LANES];
    let mut max = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            bad[j] |= c[j].is_nan() | (c[j] == f32::INFINITY);
            max[j] = if c[j] > max[j] { c[j] } else { max[j] };
        }
    }
    let mut any_bad = bad.iter().any(|b| *b);
    let mut m = max.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &v in rest {
        any_bad |= v.is_nan() | (v == f32::INFINITY);
        if v > m {
            m = v;
        }
    }
    (any_bad, m)
}

/// Whether the row holds NaN or +inf, its maximum, and the first index of the maximum.
pub fn scan(x: &[f32]) -> (bool, f32, u32) {
    let (bad, max) = dispatch!(scan_impl(x));
    let first = x.iter().position(|&v| v == max).unwrap_or(0) as u32;
    (bad, max, first)
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
    let n = a.len();
    // Pass 1: exponentials, their sums and the weighted means of c = a - b.
    let (mut sa, mut sb, mut ma, mut mb) =
        ([0f64; LANES], [0f64; LANES], [0f64; LANES], [0f64; LANES]);
    let mut masked = false;
    let mut i = 0;
    while i + LANES <= n {
        for j in 0..LANES {
            let (x, y) = (a[i + j], b[i + j]);
            masked |= (x == f32::NEG_INFINITY) | (y == f32::NEG_INFINITY);
            let (e, f) = (exp_f32(x - max_a), exp_f32(y - max_b));
            ea[i + j] = e;
            eb[i + j] = f;
            let c = f64::from(x) - f64::from(y);
            sa[j] += f64::from(e);
            sb[j] += f64::from(f);
            ma[j] += f64::from(e) * c;
            mb[j] -= f64::from(f) * c;
        }
        i += LANES;
    }
    for k in i..n {
        let (x, y) = (a[k], b[k]);
        masked |= (x == f32::NEG_INFINITY) | (y == f32::NEG_INFINITY);
        let (e, f) = (exp_f32(x - max_a), exp_f32(y - max_b));
        ea[k] = e;
        eb[k] = f;
        let c = f64::from(x) - f64::from(y);
        sa[0] += f64::from(e);
        sb[0] += f64::from(f);
        ma[0] += f64::from(e) * c;
        mb[0] -= f64::from(f) * c;
    }
    if masked {
        // -inf entries make c infinite or undefined: the careful path handles them.
        return masked_row(a, b, max_a, max_b, want_reverse);
    }
    let (sa, sb) = (lanes_sum(sa), lanes_sum(sb));
    let (m_a, m_b) = (lanes_sum(ma) / sa, lanes_sum(mb) / sb);
    let lse_a = f64::from(max_a) + sa.ln();
    let lse_b = f64::from(max_b) + sb.ln();
    // Pass 2: the non-negative summands. For |x| >= 1, e^{a-max_a} e^{-x} = e^{b-max_b} κ.
    let ln_kf = f64::from(max_b) - f64::from(max_a) + m_a;
    let ln_kr = f64::from(max_a) - f64::from(max_b) + m_b;
    if ln_kf.abs() > 60.0 || ln_kr.abs() > 60.0 {
        return masked_row(a, b, max_a, max_b, want_reverse);
    }
    let (kf32, kr32) = (ln_kf.exp() as f32, ln_kr.exp() as f32);
    let (mf, mr) = (m_a as f32, m_b as f32);
    let (mut kf, mut kr) = ([0f64; LANES], [0f64; LANES]);
    let term = |wa: f32, wb: f32, x: f32, kappa: f32| -> f32 {
        let small = g_small(x);
        let large = wb * kappa - wa + wa * x;
        if x.abs() < 1.0 { wa * small } else { large }
    };
    let mut i = 0;
    while i + LANES <= n {
        for j in 0..LANES {
            let (wa, wb) = (ea[i + j], eb[i + j]);
            let c = a[i + j] - b[i + j];
            kf[j] += f64::from(term(wa, wb, c - mf, kf32));
            if want_reverse {
                kr[j] += f64::from(term(wb, wa, -c - mr, kr32));
            }
        }
        i += LANES;
    }
    for k in i..n {
        let (wa, wb) = (ea[k], eb[k]);
        let c = a[k] - b[k];
        kf[0] += f64::from(term(wa, wb, c - mf, kf32));
        if want_reverse {
            kr[0] += f64::from(term(wb, wa, -c - mr, kr32));
        }
    }
    FullRow {
        forward: (lanes_sum(kf) / sa).ln_1p(),
        reverse: if want_reverse {
            (lanes_sum(kr) / sb).ln_1p()
        } else {
            f64::NAN
        },
        lse_a,
        lse_b,
    }
}

/// KL both ways over the full vocabulary. `a` and `b` must be free of NaN and +inf (checked by
/// the caller); -inf entries are masked tokens. `ea`/`eb` are scratch buffers.
pub fn full_row(
    a: &[f32],
    b: &[f32],
    max_a: f32,
    max_b: f32,
    want_reverse: bool,
    ea: &mut Vec<f32>,
    eb: &mut Vec<f32>,
) -> FullRow {
    ea.resize(a.len(), 0.0);
    eb.resize(a.len(), 0.0);
    let (ea, eb) = (ea.as_mut_slice(), eb.as_mut_slice());
    dispatch!(full_row_impl(a, b, max_a, max_b, want_reverse, ea, eb))
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
