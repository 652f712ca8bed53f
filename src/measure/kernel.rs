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

/// One summand `w_p g(x)` of the KL for a centred logit difference `x`, with `w_q κ` standing for
/// `w_p e^{-x}` when |x| >= 1 (see the module comment).
#[inline(always)]
fn term(wp: f32, wq: f32, x: f32, kappa: f32) -> f32 {
    let small = wp * g_small(x);
    let large = wq * kappa - wp + wp * x;
    if x.abs() < 1.0 { small } else { large }
}

/// The second pass for one direction: `(Σ w_p g(x), Σ w_p x)` with `x = (p - q) - m`, f32 terms
/// summed in f64 lanes. `w_q = e^{q - max_q}` is needed only where |x| >= 1, so it is computed
/// there only, for the 8 entries around such an x: rows of close distributions (the usual case)
/// then cost one exponential per entry, not two. The values do not depend on that choice.
#[inline(always)]
fn kl_pass(wp: &[f32], p: &[f32], q: &[f32], m: f32, max_q: f32, kappa: f32) -> (f64, f64) {
    let mut acc = [0f64; LANES];
    let mut acc_x = [0f64; LANES];
    let n = wp.len() / BLOCK * BLOCK;
    let blocks = wp[..n]
        .chunks_exact(BLOCK)
        .zip(p[..n].chunks_exact(BLOCK))
        .zip(q[..n].chunks_exact(BLOCK));
    for ((bw, bp), bq) in blocks {
        let mut t = [0f32; LANES];
        let mut tx = [0f32; LANES];
        let chunks = bw
            .chunks_exact(LANES)
            .zip(bp.chunks_exact(LANES))
            .zip(bq.chunks_exact(LANES));
        for ((cw, cp), cq) in chunks {
            let mut x = [0f32; LANES];
            let mut large = 0u32;
            for j in 0..LANES {
                x[j] = (cp[j] - cq[j]) - m;
                large |= u32::from(x[j].abs() >= 1.0);
            }
            if large == 0 {
                for j in 0..LANES {
                    t[j] += cw[j] * g_small(x[j]);
                }
            } else {
                for j in 0..LANES {
                    let wq = exp_f32(cq[j] - max_q);
                    t[j] += term(cw[j], wq, x[j], kappa);
                }
            }
            for j in 0..LANES {
                tx[j] += cw[j] * x[j];
            }
        }
        for j in 0..LANES {
            acc[j] += f64::from(t[j]);
            acc_x[j] += f64::from(tx[j]);
        }
    }
    let (mut rest, mut rest_x) = (0f64, 0f64);
    for i in n..wp.len() {
        let x = (p[i] - q[i]) - m;
        let wq = exp_f32(q[i] - max_q);
        rest += f64::from(term(wp[i], wq, x, kappa));
        rest_x += f64::from(wp[i] * x);
    }
    (lanes_sum(acc) + rest, lanes_sum(acc_x) + rest_x)
}

#[inline(always)]
fn exp_row(x: &[f32], max: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = exp_f32(v - max);
    }
}

/// The maximum of a tile, and whether it holds a NaN or +inf, and a -inf.
#[inline(always)]
fn tile_max(x: &[f32]) -> (f32, bool, bool) {
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
    let mut out = (
        max.iter()
            .copied()
            .fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m }),
        bad.iter().any(|b| *b),
        masked.iter().any(|b| *b),
    );
    for &v in &x[n..] {
        out.1 |= v.is_nan() | (v == f32::INFINITY);
        out.2 |= v == f32::NEG_INFINITY;
        if v > out.0 {
            out.0 = v;
        }
    }
    out
}

/// One row's exponentials in the first pass, against a maximum found on the way (online, a tile
/// at a time): each tile's exponentials are taken against the maximum so far, the running sums
/// rescaled when it grows, and the stored tiles brought to the final maximum at the end.
struct Online {
    scan: Scan,
    /// Σ e and Σ e (x - y), relative to `scan.max`.
    sum: f64,
    diff: f64,
}

impl Online {
    fn new() -> Online {
        Online {
            scan: Scan {
                non_finite: false,
                masked: false,
                max: f32::NEG_INFINITY,
                argmax: 0,
            },
            sum: 0.0,
            diff: 0.0,
        }
    }

    /// Take in tile `x` (its partner `y`) starting at `start`; `e` receives its exponentials.
    /// Returns the maximum they are relative to.
    #[inline(always)]
    fn tile(&mut self, x: &[f32], y: &[f32], start: usize, e: &mut [f32]) -> f32 {
        let (max, bad, masked) = tile_max(x);
        self.scan.non_finite |= bad;
        self.scan.masked |= masked;
        if max > self.scan.max {
            // The first index of the new maximum, found with whole chunks first (vectorized).
            let k = x
                .chunks(64)
                .position(|c| c.iter().fold(0u32, |f, &v| f | u32::from(v == max)) != 0)
                .unwrap_or(0);
            let i = x[k * 64..].iter().position(|&v| v == max).unwrap_or(0);
            let scale = (f64::from(self.scan.max) - f64::from(max)).exp();
            self.sum *= scale;
            self.diff *= scale;
            self.scan.max = max;
            self.scan.argmax = (start + k * 64 + i) as u32;
        }
        exp_row(x, self.scan.max, e);
        self.sum += sum_f64(e);
        self.diff += weighted_diff(e, x, y);
        self.scan.max
    }
}

/// Bring the tiles of `e` taken against `bases[t]` to the final maximum `max`.
fn rescale(e: &mut [f32], bases: &[f32], max: f32) {
    for (tile, &base) in e.chunks_mut(TILE).zip(bases) {
        if base != max {
            let d = f64::from(base) - f64::from(max);
            // Below e^-87 the weights are negligible (and would be subnormal): zero.
            let s = if d > -87.0 { d.exp() as f32 } else { 0.0 };
            for v in tile.iter_mut() {
                *v *= s;
            }
        }
    }
}

/// The row kernel's outcome.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    /// A NaN or +inf, or every entry -inf, in either row: the row is excluded.
    Excluded,
    Row {
        a: Scan,
        b: Scan,
        row: FullRow,
    },
}

/// `(e^ε (1 + K - ε) - 1)`: the KL sum `K = E_p[g(x)]` recentred by `ε = E_p[x]` (the rounding
/// left in the centring constant), without cancellation (both parts are O(ε K) and O(ε²)).
#[inline(always)]
fn recentre(k: f64, eps: f64) -> f64 {
    // e^ε (1 - ε) - 1 = -Σ_{n>=2} (n-1) ε^n / n!; |ε| is ~1e-7 here, three terms are plenty.
    let h = eps * eps * (0.5 + eps * (1.0 / 3.0 + eps * 0.125));
    (eps.exp() * k - h).max(0.0)
}

#[inline(always)]
fn full_impl(a: &[f32], b: &[f32], want_reverse: bool, buf: &mut Buffers) -> Outcome {
    let n = a.len();
    let tiles = n.div_ceil(TILE);
    buf.ea.resize(n, 0.0);
    buf.base_a.resize(tiles, 0.0);
    if want_reverse {
        buf.eb.resize(n, 0.0);
        buf.base_b.resize(tiles, 0.0);
    }
    // Pass 1, a tile at a time (the tile stays in L1 after the maximum's pass over it, so the
    // row is read from memory once): NaN/+inf/-inf, maxima and first argmaxes, exponentials,
    // their sums and the weighted mean of c = a - b.
    let (mut oa, mut ob) = (Online::new(), Online::new());
    for t in 0..tiles {
        let (start, end) = (t * TILE, ((t + 1) * TILE).min(n));
        let (ta, tb) = (&a[start..end], &b[start..end]);
        buf.base_a[t] = oa.tile(ta, tb, start, &mut buf.ea[start..end]);
        if want_reverse {
            buf.base_b[t] = ob.tile(tb, ta, start, &mut buf.eb[start..end]);
        } else {
            // Only the scan of b.
            let (max, bad, masked) = tile_max(tb);
            ob.scan.non_finite |= bad;
            ob.scan.masked |= masked;
            if max > ob.scan.max {
                ob.scan.max = max;
                ob.scan.argmax = (start + tb.iter().position(|&v| v == max).unwrap_or(0)) as u32;
            }
        }
    }
    let (sa, sb) = (oa.scan, ob.scan);
    if sa.non_finite || sb.non_finite || sa.max == f32::NEG_INFINITY || sb.max == f32::NEG_INFINITY
    {
        return Outcome::Excluded;
    }
    if sa.masked || sb.masked {
        let row = masked_row(a, b, sa.max, sb.max, want_reverse);
        return Outcome::Row { a: sa, b: sb, row };
    }
    let (max_a, max_b) = (sa.max, sb.max);
    let m_a = oa.diff / oa.sum;
    let m_b = if want_reverse { ob.diff / ob.sum } else { 0.0 };
    let ln_kf = f64::from(max_b) - f64::from(max_a) + m_a;
    let ln_kr = f64::from(max_a) - f64::from(max_b) + m_b;
    if ln_kf.abs() > 60.0 || (want_reverse && ln_kr.abs() > 60.0) {
        let row = masked_row(a, b, max_a, max_b, want_reverse);
        return Outcome::Row { a: sa, b: sb, row };
    }
    rescale(&mut buf.ea, &buf.base_a, max_a);
    // Pass 2: the non-negative summands, and Σ w x (zero but for rounding in m).
    let (k, x) = kl_pass(&buf.ea, a, b, m_a as f32, max_b, ln_kf.exp() as f32);
    let (k, eps) = (k / oa.sum, x / oa.sum);
    let forward = recentre(k, eps).ln_1p();
    let lse_a = f64::from(max_a) + oa.sum.ln();
    // Σ e^{b - max_a} = e^{-m} Σ w e^{-x} = e^{-m} Σ (w g(x) + w - w x): the candidate's
    // normalizer without its own exponentials (exact for a row against itself).
    let lse_b = (f64::from(max_a) - m_a) + (k - eps).ln_1p() + oa.sum.ln();
    let reverse = if want_reverse {
        rescale(&mut buf.eb, &buf.base_b, max_b);
        let (k, x) = kl_pass(&buf.eb, b, a, m_b as f32, max_a, ln_kr.exp() as f32);
        let (k, eps) = (k / ob.sum, x / ob.sum);
        recentre(k, eps).ln_1p()
    } else {
        f64::NAN
    };
    Outcome::Row {
        a: sa,
        b: sb,
        row: FullRow {
            forward,
            reverse,
            lse_a,
            lse_b,
        },
    }
}

/// Elements per tile of pass 1 (the two rows' tiles, 8 KiB each, and the exponentials stay in L1).
const TILE: usize = 2048;

/// Scratch buffers of the row kernel (one set per worker thread).
#[derive(Debug, Default)]
pub struct Buffers {
    ea: Vec<f32>,
    eb: Vec<f32>,
    base_a: Vec<f32>,
    base_b: Vec<f32>,
}

dispatched! {
    /// Scan both rows and, unless excluded, their KL (both ways when `want_reverse`) and
    /// log-normalizers over the full vocabulary. Rows with -inf (masked tokens) or extreme scale
    /// differences take the careful all-f64 path.
    pub fn full / full_avx2 => full_impl(
        a: &[f32], b: &[f32], want_reverse: bool, buf: &mut Buffers
    ) -> Outcome
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
