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

/// `g(x) = e^-x - 1 + x` for |x| < 1 as a series in x (relative error below 1e-12).
#[inline(always)]
fn g_small(x: f64) -> f64 {
    // x²/2! - x³/3! + x⁴/4! - ... through x¹³.
    let mut p = -1.0 / 6_227_020_800.0; // -1/13!
    p = p * x + 1.0 / 479_001_600.0;
    p = p * x - 1.0 / 39_916_800.0;
    p = p * x + 1.0 / 3_628_800.0;
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
    let n = a.len();
    ea.resize(n, 0.0);
    eb.resize(n, 0.0);
    // Pass 1: exponentials (vectorized) and their sums.
    for ((e, &x), (f, &y)) in ea.iter_mut().zip(a).zip(eb.iter_mut().zip(b)) {
        *e = exp_f32(x - max_a);
        *f = exp_f32(y - max_b);
    }
    let (mut sa, mut sb) = (0.0f64, 0.0f64);
    for (&e, &f) in ea.iter().zip(eb.iter()) {
        sa += f64::from(e);
        sb += f64::from(f);
    }
    let lse_a = f64::from(max_a) + sa.ln();
    let lse_b = f64::from(max_b) + sb.ln();
    // Where one side is -inf and the other is not, a term is infinite or the exact c is.
    let mut forward_infinite = false;
    let mut reverse_infinite = false;
    let (mut ma, mut mb) = (0.0f64, 0.0f64);
    for i in 0..n {
        let (x, y) = (a[i], b[i]);
        if x == f32::NEG_INFINITY || y == f32::NEG_INFINITY {
            forward_infinite |= y == f32::NEG_INFINITY && x != f32::NEG_INFINITY;
            reverse_infinite |= x == f32::NEG_INFINITY && y != f32::NEG_INFINITY;
            continue;
        }
        let c = f64::from(x) - f64::from(y);
        ma += f64::from(ea[i]) * c;
        mb -= f64::from(eb[i]) * c;
    }
    let m_a = ma / sa;
    let m_b = mb / sb;
    // Pass 2: the non-negative summands. For |x| >= 1, e^{a-max_a} e^{-x} = e^{b-max_b} κ.
    let kappa_f = (f64::from(max_b) - f64::from(max_a) + m_a).exp();
    let kappa_r = (f64::from(max_a) - f64::from(max_b) + m_b).exp();
    let (mut kf, mut kr) = (0.0f64, 0.0f64);
    for i in 0..n {
        let (x, y) = (a[i], b[i]);
        let (wa, wb) = (f64::from(ea[i]), f64::from(eb[i]));
        if x == f32::NEG_INFINITY || y == f32::NEG_INFINITY {
            // P = 0 where Q > 0: only Q's mass enters E_p[e^-x] (and vice versa).
            if x == f32::NEG_INFINITY {
                kf += wb * kappa_f;
            }
            if y == f32::NEG_INFINITY {
                kr += wa * kappa_r;
            }
            continue;
        }
        let c = f64::from(x) - f64::from(y);
        let xf = c - m_a;
        kf += if xf.abs() < 1.0 {
            wa * g_small(xf)
        } else {
            wb * kappa_f - wa + wa * xf
        };
        if want_reverse {
            let xr = -c - m_b;
            kr += if xr.abs() < 1.0 {
                wb * g_small(xr)
            } else {
                wa * kappa_r - wb + wb * xr
            };
        }
    }
    let forward = if forward_infinite {
        f64::INFINITY
    } else {
        (kf / sa).ln_1p()
    };
    let reverse = if !want_reverse {
        f64::NAN
    } else if reverse_infinite {
        f64::INFINITY
    } else {
        (kr / sb).ln_1p()
    };
    FullRow {
        forward,
        reverse,
        lse_a,
        lse_b,
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
            let x = f64::from(i) / 1000.0;
            let want = (-x).exp_m1() + x;
            let got = g_small(x);
            assert!(
                ((got - want) / want.max(1e-300)).abs() < 1e-9 || (got - want).abs() < 1e-18,
                "{x}: {got} vs {want}"
            );
        }
    }
}
