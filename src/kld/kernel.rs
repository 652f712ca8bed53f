//! The full-vocabulary row kernel: both KL directions and both log-normalizers in two passes over
//! the row, with the exponentials in f32 (8 lanes) and everything that needs precision in f64.
//! The reverse direction costs no exponentials of its own: it comes from the same weighted sums
//! (`reverse_from_sums`).
//!
//! Why f32 exponentials are enough here: the KL is formed as `log1p(E_p[g(x)])` with
//! `x = c - m`, `c = a - b`, `m ≈ E_p[c]` (any centring is exact: the sums carry `E_p[x]`) and
//! `g(x) = e^-x - 1 + x >= 0`; `x` is formed in f32 from an error-free split of `a - b`
//! (`centred`), so it is accurate relative to itself even when the rows differ by a large common
//! offset, and `m` enters the log-normalizer exactly as pass 2 used it. The weights
//! `p ∝ exp(a - max)` enter only as weights of non-negative terms, so their ~1e-7 relative error
//! moves the KL by ~1e-7 relative. `g` itself never subtracts two rounded exponentials where it
//! is small: for |x| < 1 it is a polynomial in the exact `x`; for |x| >= 1 it is at least 0.36,
//! so the f32 error of `e^-x` (taken as the ratio of the two rows' exponentials) stays ~1e-7 of it.
//!
//! Pass 1 reads the rows from memory once, a tile at a time: the tile's maxima (which bring it
//! into L1), then its exponentials against the maximum so far, with the running sums rescaled when
//! the maximum grows (an online maximum; the stored exponentials are brought to the final maximum
//! in pass 2, a factor per tile). NaN and infinities show as non-finite tile sums. Pass 2 reads
//! both rows again (from cache for rows that fit) and forms the summands from the stored weights
//! and the centred differences; the candidate's exponentials are needed only where |x| >= 1,
//! so for close distributions (the usual case) a row costs one exponential per entry, and the
//! candidate's normalizer comes from the same sums (`Σ e^b ∝ Σ w_p e^{-x}`).

/// Define `$public` calling `$avx2` (a `#[target_feature(enable = "avx2,fma")]` function) when
/// the CPU has AVX2 and FMA (checked at run time), else `$portable`, the portable build of the
/// same code.
macro_rules! dispatched {
    (
        $(#[$meta:meta])* pub fn $public:ident => $avx2:path, $portable:path;
        ($($arg:ident: $ty:ty),*) -> $ret:ty
    ) => {
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
            $portable($($arg),*)
        }
    };
}

/// `e^x` for x <= 0 in f32, branch-free so it vectorizes (`kernels!` has the 8-lane form, the
/// same operations). Relative error below 1.3e-7 (3e-8 on average); arguments below -87 give
/// e^-87 (such weights are below f32's normal range and irrelevant to a sum dominated by values
/// near 1).
///
/// x = (k + j/8) ln2 + r with |r| <= ln2/16: e^x = 2^k · 2^(j/8) · e^r, the middle factor from a
/// table of 8 (one `vpermps`), e^r a cubic (minimax, 2.6e-8 relative).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    let x = if x > -87.0 { x } else { -87.0 };
    // Round 8·x·log2(e) to an integer with the magic-number trick: the low bits of `t` then hold
    // it, so the table index and 2^k come from integer operations on its bits.
    let t = x * LOG2E_8 + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_8_HI - n * LN2_8_LO;
    let q = (EXP_C3 * r + EXP_C2) * (r * r) + r;
    let b = t.to_bits();
    let s = f32::from_bits(
        EXP_T[(b & 7) as usize]
            .to_bits()
            .wrapping_add((b >> 3) << 23),
    );
    s * q + s
}

/// 8·log2(e).
const LOG2E_8: f32 = 11.541_56;
/// ln2/8 in two parts, the first with 14 significant bits (so n·LN2_8_HI is exact for |n| <= 1024).
const LN2_8_HI: f32 = 0.086_647_03;
const LN2_8_LO: f32 = -3.636_121_4e-6;
/// 1.5 * 2^23: adding it rounds to an integer.
const ROUND: f32 = 12_582_912.0;
/// e^r ≈ 1 + r + r² (EXP_C2 + EXP_C3 r) on |r| <= ln2/16 (minimax, relative).
const EXP_C2: f32 = 0.500_064_73;
const EXP_C3: f32 = 0.166_668_6;
/// 2^(j/8), j = 0..8.
const EXP_T: [f32; 8] = [
    1.0,
    1.090_507_7,
    1.189_207_1,
    1.296_839_6,
    std::f32::consts::SQRT_2,
    1.542_210_8,
    1.681_792_9,
    1.834_008_1,
];

/// `g(x) = e^-x - 1 + x` for |x| < 1 in f32: x² times a minimax polynomial for g(x)/x²
/// (relative error 4.3e-9 on [-1, 1]; below 2e-7, 4e-8 on average, with the f32 rounding).
#[inline(always)]
fn g_small(x: f32) -> f32 {
    let mut p = G_P[7];
    for &k in G_P[..7].iter().rev() {
        p = p * x + k;
    }
    p * x * x
}

/// Minimax (relative) polynomial for g(x)/x² = Σ (-x)^n / (n+2)! on [-1, 1], degree 7, lowest
/// degree first (Remez; the series itself needs degree 8 for the same accuracy).
const G_P: [f32; 8] = [
    0.5,
    -0.166_666_67,
    0.041_666_735,
    -0.008_333_310_5,
    0.001_388_545_1,
    -0.000_198_440_23,
    2.535_483e-5,
    -2.772_283_6e-6,
];

/// `g` for |x| < 1/4: a shorter minimax polynomial (degree 4, relative error 2.4e-8 there;
/// below 2e-7 with the rounding). Close distributions (the usual case) have whole chunks of such
/// x.
#[inline(always)]
fn g_tiny(x: f32) -> f32 {
    let mut p = G4[4];
    for &k in G4[..4].iter().rev() {
        p = p * x + k;
    }
    p * x * x
}

/// Minimax (relative) polynomial for g(x)/x² on [-1/4, 1/4], degree 4, lowest degree first.
const G4: [f32; 5] = [
    0.5,
    -0.166_666_42,
    0.041_666_716,
    -0.008_348_839,
    0.001_389_534_3,
];

/// The centred logit difference `x = (p - q) - m` in f32 with the rounding of `p - q` kept: the
/// difference is split error-free into `d + lo` (Knuth's two-sum), then `x = (d - m) + lo`. When
/// the rows differ by a common offset, `d` and `m` are close and `d - m` is exact, so `x` is
/// accurate relative to itself; `d - m` alone would carry an error of half an ulp of the offset
/// (5e-7 at an offset of 15), which is all of a close pair's KL and Δp.
#[inline(always)]
fn centred(p: f32, q: f32, m: f32) -> f32 {
    let d = p - q;
    let back = d - p;
    let lo = (p - (d - back)) - (q + back);
    (d - m) + lo
}

/// One summand `w_p g(x)` of the KL for a centred logit difference `x`, with `w_q κ` standing for
/// `w_p e^{-x}` when |x| >= 1 (see the module comment).
#[inline(always)]
fn term(wp: f32, wq: f32, x: f32, kappa: f32) -> f32 {
    if x.abs() < 0.25 {
        return wp * g_tiny(x);
    }
    let small = wp * g_small(x);
    let large = wq * kappa - wp + wp * x;
    if x.abs() < 1.0 { small } else { large }
}

/// One summand `w_p h(x)` of the reverse KL, `h(x) = x (1 - e^-x) >= 0`, from the forward
/// summand `t = w_p g(x)` of `term` (the same branches): `x (w_p x - t)` where |x| < 1 (no
/// cancellation there: |g(x)| < 0.72 |x|), `x (w_p - w_q κ)` beyond.
#[inline(always)]
fn reverse_term(wp: f32, wq: f32, x: f32, kappa: f32, t: f32) -> f32 {
    if x.abs() < 1.0 {
        x * (wp * x - t)
    } else {
        x * (wp - wq * kappa)
    }
}

/// The reverse KL from the forward pass's sums over the reference's weights (normalized):
/// `k = E_p[g(x)]`, `eps = E_p[x]`, `h = E_p[h(x)]`. With `q/p = e^-x / M`, `M = E_p[e^-x] =
/// 1 + k - eps`: `KL(q || p) = E_p[-x e^-x] / M - ln M = (h - eps) / M - ln M`, exact for any
/// centring; the two terms cancel only to about half (h ≈ 2k for close distributions).
#[inline(always)]
fn reverse_from_sums(k: f64, eps: f64, h: f64) -> f64 {
    let ln_m = (k - eps).ln_1p();
    ((h - eps) / (1.0 + (k - eps)) - ln_m).max(0.0)
}

/// What the kernel returns for one row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FullRow {
    pub forward: f64,
    pub reverse: f64,
    pub lse_a: f64,
    pub lse_b: f64,
}

/// Lanes of the hand-split reductions of `scan`.
const LANES: usize = 8;

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
    let (max, non_finite, masked) = tile_max(x);
    Scan {
        non_finite,
        masked,
        max,
        argmax: first_index(x, max) as u32,
    }
}

/// The maximum of `x` (`>` order, NaNs ignored), whether it holds a NaN or +inf, and a -inf.
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

/// The first index of `target` in `x` (0 if absent): whole chunks are tested first (vectorized),
/// then the first chunk that has it.
#[inline(always)]
fn first_index(x: &[f32], target: f32) -> usize {
    x.chunks(64)
        .position(|c| c.iter().fold(0u32, |f, &v| f | u32::from(v == target)) != 0)
        .and_then(|k| {
            x[k * 64..]
                .iter()
                .position(|&v| v == target)
                .map(|i| k * 64 + i)
        })
        .unwrap_or(0)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn scan_avx2(x: &[f32]) -> Scan {
    scan_impl(x)
}

dispatched! {
    /// NaN/+inf and -inf presence, the maximum and its first index.
    pub fn scan => scan_avx2, scan_impl; (x: &[f32]) -> Scan
}

/// Elements summed in f32 before joining the f64 total: 8 per lane, so a block's partial sum
/// carries at most 8 roundings (relative error below 5e-7 even when every term has the same
/// sign, about 1e-7 typically) while the f64 work drops eightfold.
const BLOCK: usize = 8 * LANES;

/// Elements per tile of pass 1 (the two rows' tiles, 8 KiB each, and the exponentials stay in
/// L1). A multiple of `BLOCK`.
const TILE: usize = 2048;

/// One row's online maximum in pass 1, with the sums kept relative to it.
struct Online {
    scan: Scan,
    /// Σ e and Σ e (x - y), relative to `scan.max`.
    sum: f64,
    diff: f64,
    /// Sums came out non-finite without a NaN or infinity (overflow): take the f64 path.
    overflow: bool,
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
            overflow: false,
        }
    }

    /// Take in the maximum `max` of tile `x` starting at `start`.
    #[inline(always)]
    fn grow(&mut self, x: &[f32], start: usize, max: f32) {
        if max > self.scan.max {
            let scale = (f64::from(self.scan.max) - f64::from(max)).exp();
            self.sum *= scale;
            self.diff *= scale;
            self.scan.max = max;
            self.scan.argmax = (start + first_index(x, max)) as u32;
        }
    }

    /// Take in the sums of tile `x` (its partner `y`), taken against `scan.max`.
    #[inline(always)]
    fn add(&mut self, x: &[f32], y: &[f32], (s, d): (f64, f64)) {
        if !(s.is_finite() && d.is_finite()) {
            let (_, bad_x, masked_x) = tile_max(x);
            let (_, bad_y, masked_y) = tile_max(y);
            // Flags for the pair of rows: either one excludes the row or takes the f64 path.
            self.scan.non_finite |= bad_x | bad_y;
            self.scan.masked |= masked_x | masked_y;
            self.overflow |= !(bad_x | bad_y | masked_x | masked_y);
        }
        self.sum += s;
        self.diff += d;
    }
}

/// The factor that brings a tile's exponentials, taken against `base`, to the final `max`.
#[inline(always)]
fn tile_scale(base: f32, max: f32) -> f32 {
    if base == max {
        return 1.0;
    }
    let d = f64::from(base) - f64::from(max);
    // Below e^-87 the weights are negligible (and would be subnormal): zero.
    if d > -87.0 { d.exp() as f32 } else { 0.0 }
}

/// The row kernel's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// A NaN or +inf, or every entry -inf, in either row: the row is excluded.
    Excluded,
    Row {
        a: Scan,
        b: Scan,
        row: FullRow,
    },
}

/// `e^ε (1 + K - ε) - 1`: the KL sum `K = E_p[g(x)]` recentred by `ε = E_p[x]` (the rounding
/// left in the centring constant m), without cancellation (`e^ε K - (ε²/2 + ε³/3 + ε⁴/8 ...)`).
#[inline(always)]
fn recentre(k: f64, eps: f64) -> f64 {
    // |ε| is ~1e-7 of the spread of x here: three terms are plenty.
    let h = eps * eps * (0.5 + eps * (1.0 / 3.0 + eps * 0.125));
    (eps.exp() * k - h).max(0.0)
}

/// The row kernels over 8-lane operations `$ops` (a module of `simd`), each function with the
/// attributes given: instantiated once portable and once for AVX2.
macro_rules! kernels {
    ($ops:ident, $(#[$attr:meta])*) => {
        use super::*;
        use crate::kld::simd::{$ops as v, W};

        /// `exp_f32` on 8 lanes, the same operations in the same order.
        $(#[$attr])*
        fn exp8(x: v::F) -> v::F {
            let x = v::max_gt(x, v::splat(-87.0));
            let t = v::add(v::mul(x, v::splat(LOG2E_8)), v::splat(ROUND));
            let n = v::sub(t, v::splat(ROUND));
            let r = v::sub(
                v::sub(x, v::mul(n, v::splat(LN2_8_HI))),
                v::mul(n, v::splat(LN2_8_LO)),
            );
            let p = v::add(v::mul(v::splat(EXP_C3), r), v::splat(EXP_C2));
            let q = v::add(v::mul(p, v::mul(r, r)), r);
            let s = v::scale_table(&EXP_T, t);
            v::add(v::mul(s, q), s)
        }

        /// `g_small` on 8 lanes, the same operations in the same order.
        $(#[$attr])*
        fn g8(x: v::F) -> v::F {
            let mut p = v::splat(G_P[7]);
            for &k in G_P[..7].iter().rev() {
                p = v::add(v::mul(p, x), v::splat(k));
            }
            v::mul(v::mul(p, x), x)
        }

        /// `g_tiny` on 8 lanes, the same operations in the same order.
        $(#[$attr])*
        fn g4(x: v::F) -> v::F {
            let mut p = v::splat(G4[4]);
            for &k in G4[..4].iter().rev() {
                p = v::add(v::mul(p, x), v::splat(k));
            }
            v::mul(v::mul(p, x), x)
        }

        /// The maxima of two tiles (`>` order; NaNs ignored).
        $(#[$attr])*
        fn tile_maxima(x: &[f32], y: &[f32]) -> (f32, f32) {
            let mut mx = v::splat(f32::NEG_INFINITY);
            let mut my = mx;
            let n = x.len() / W * W;
            for (cx, cy) in x[..n].chunks_exact(W).zip(y[..n].chunks_exact(W)) {
                mx = v::max_gt(v::load(cx), mx);
                my = v::max_gt(v::load(cy), my);
            }
            let (mut max_x, mut max_y) = (v::hmax(mx), v::hmax(my));
            for (&a, &b) in x[n..].iter().zip(&y[n..]) {
                max_x = if a > max_x { a } else { max_x };
                max_y = if b > max_y { b } else { max_y };
            }
            (max_x, max_y)
        }

        /// `e = exp(x - base)` over a tile, a cache line (16 entries) per step, each step
        /// fetching a line of each of the next tiles (they arrive while this one is computed:
        /// the rows are read from memory once, here).
        $(#[$attr])*
        fn tile_exps(x: &[f32], base: f32, e: &mut [f32], next: (&[f32], &[f32])) {
            let bv = v::splat(base);
            let n = x.len() / (2 * W) * (2 * W);
            let lines = x[..n].chunks_exact(2 * W).zip(e[..n].chunks_exact_mut(2 * W));
            for (i, (lx, le)) in lines.enumerate() {
                v::prefetch(next.0.get(i * 2 * W..).unwrap_or_default());
                v::prefetch(next.1.get(i * 2 * W..).unwrap_or_default());
                let (e0, e1) = le.split_at_mut(W);
                v::store(exp8(v::sub(v::load(lx), bv)), e0);
                v::store(exp8(v::sub(v::load(&lx[W..]), bv)), e1);
            }
            for i in n..x.len() {
                e[i] = exp_f32(x[i] - base);
            }
        }

        /// Over a tile of exponentials `e` and differences `d = x - y` (rounded: only the
        /// centring constant comes from them), in f32 over blocks then f64 lanes: `Σ e` and
        /// `Σ e d`. Both come out non-finite when a row holds a NaN or an infinity (`e > 0`),
        /// which is how those are noticed.
        $(#[$attr])*
        fn tile_sums(x: &[f32], y: &[f32], e: &[f32]) -> (f64, f64) {
            let mut acc_s = v::dzero();
            let mut acc_d = v::dzero();
            let n = e.len() / BLOCK * BLOCK;
            let blocks = x[..n]
                .chunks_exact(BLOCK)
                .zip(y[..n].chunks_exact(BLOCK))
                .zip(e[..n].chunks_exact(BLOCK));
            for ((bx, by), be) in blocks {
                let mut ts = v::splat(0.0);
                let mut td = ts;
                let chunks = bx.chunks_exact(W).zip(by.chunks_exact(W)).zip(be.chunks_exact(W));
                for ((cx, cy), ce) in chunks {
                    let ea = v::load(ce);
                    let d = v::sub(v::load(cx), v::load(cy));
                    ts = v::add(ts, ea);
                    td = v::add(td, v::mul(ea, d));
                }
                acc_s = v::dadd(acc_s, ts);
                acc_d = v::dadd(acc_d, td);
            }
            let (mut s, mut d) = (0f64, 0f64);
            for i in n..e.len() {
                s += f64::from(e[i]);
                d += f64::from(e[i] * (x[i] - y[i]));
            }
            (v::dsum(acc_s) + s, v::dsum(acc_d) + d)
        }

        /// `centred` on 8 lanes, the same operations in the same order.
        $(#[$attr])*
        fn centred8(p: v::F, q: v::F, m: v::F) -> v::F {
            let d = v::sub(p, q);
            let back = v::sub(d, p);
            let lo = v::sub(v::sub(p, v::sub(d, back)), v::add(q, back));
            v::add(v::sub(d, m), lo)
        }

        /// Pass 2: `(Σ w_p g(x), Σ w_p x, Σ w_p h(x))` with `x = (p - q) - m` (`centred`) and
        /// `w_p = e_p · scale` (`e_p` as pass 1 stored it, tile by tile against `bases`,
        /// brought to `max_p`); the third sum (the reverse KL's, see `reverse_from_sums`) only
        /// when `REV`, else 0. `w_q = e^{q - max_q}` is needed only where |x| >= 1 and is
        /// computed there only, for the 8 entries around such an x; and g takes a shorter
        /// polynomial for chunks whose |x| are all below 1/4.
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        fn kl_pass<const REV: bool>(
            ep: &[f32], p: &[f32], q: &[f32], bases: &[f32], max_p: f32, m: f32, max_q: f32,
            kappa: f32,
        ) -> (f64, f64, f64) {
            let (mv, one, kv, mq) = (v::splat(m), v::splat(1.0), v::splat(kappa), v::splat(max_q));
            let quarter = v::splat(0.25);
            let zero = v::splat(0.0);
            let mut acc = v::dzero();
            let mut acc_x = v::dzero();
            let mut acc_h = v::dzero();
            let (mut rest, mut rest_x, mut rest_h) = (0f64, 0f64, 0f64);
            for (t, &base) in bases.iter().enumerate() {
                let (start, end) = (t * TILE, ((t + 1) * TILE).min(p.len()));
                let scale = tile_scale(base, max_p);
                let sv = v::splat(scale);
                let (te, tp, tq) = (&ep[start..end], &p[start..end], &q[start..end]);
                let n = te.len() / BLOCK * BLOCK;
                let blocks = te[..n]
                    .chunks_exact(BLOCK)
                    .zip(tp[..n].chunks_exact(BLOCK))
                    .zip(tq[..n].chunks_exact(BLOCK));
                for ((be, bp), bq) in blocks {
                    let mut s = zero;
                    let mut sx = zero;
                    let mut sh = zero;
                    let chunks = be.chunks_exact(W).zip(bp.chunks_exact(W)).zip(bq.chunks_exact(W));
                    for ((ce, cp), cq) in chunks {
                        let w = v::mul(v::load(ce), sv);
                        let qv = v::load(cq);
                        let x = centred8(v::load(cp), qv, mv);
                        let wx = v::mul(w, x);
                        let ax = v::abs(x);
                        let (term, rterm) = if v::all(v::lt(ax, quarter)) {
                            let t = v::mul(w, g4(x));
                            (t, if REV { v::mul(x, v::sub(wx, t)) } else { zero })
                        } else {
                            let small = v::lt(ax, one);
                            let gs = v::mul(w, g8(x));
                            let rs = if REV { v::mul(x, v::sub(wx, gs)) } else { zero };
                            if v::all(small) {
                                (gs, rs)
                            } else {
                                let wqk = v::mul(exp8(v::sub(qv, mq)), kv);
                                let large = v::add(v::sub(wqk, w), wx);
                                let rl = if REV { v::mul(x, v::sub(w, wqk)) } else { zero };
                                (v::select(small, gs, large), v::select(small, rs, rl))
                            }
                        };
                        s = v::add(s, term);
                        sx = v::add(sx, wx);
                        if REV {
                            sh = v::add(sh, rterm);
                        }
                    }
                    acc = v::dadd(acc, s);
                    acc_x = v::dadd(acc_x, sx);
                    if REV {
                        acc_h = v::dadd(acc_h, sh);
                    }
                }
                for i in n..te.len() {
                    let w = te[i] * scale;
                    let x = centred(tp[i], tq[i], m);
                    let wq = exp_f32(tq[i] - max_q);
                    let t = term(w, wq, x, kappa);
                    rest += f64::from(t);
                    rest_x += f64::from(w * x);
                    if REV {
                        rest_h += f64::from(reverse_term(w, wq, x, kappa, t));
                    }
                }
            }
            (v::dsum(acc) + rest, v::dsum(acc_x) + rest_x, v::dsum(acc_h) + rest_h)
        }

        /// Scan both rows and, unless excluded, their KL (both ways when `want_reverse`) and
        /// log-normalizers.
        $(#[$attr])*
        pub fn full(a: &[f32], b: &[f32], want_reverse: bool, buf: &mut Buffers) -> Outcome {
            let n = a.len();
            let tiles = n.div_ceil(TILE);
            buf.ea.resize(n, 0.0);
            buf.base_a.resize(tiles, 0.0);
            // Pass 1: maxima, first argmaxes, exponentials, their sums and the weighted mean of
            // c = a - b; NaN and infinities.
            let (mut oa, mut ob) = (Online::new(), Online::new());
            for t in 0..tiles {
                let (start, end) = (t * TILE, ((t + 1) * TILE).min(n));
                let (ta, tb) = (&a[start..end], &b[start..end]);
                let (max_a, max_b) = tile_maxima(ta, tb);
                oa.grow(ta, start, max_a);
                ob.grow(tb, start, max_b);
                let next = (a.get(end..).unwrap_or_default(), b.get(end..).unwrap_or_default());
                let tea = &mut buf.ea[start..end];
                tile_exps(ta, oa.scan.max, tea, next);
                oa.add(ta, tb, tile_sums(ta, tb, tea));
                buf.base_a[t] = oa.scan.max;
            }
            let (sa, sb) = (oa.scan, ob.scan);
            if sa.non_finite
                || sb.non_finite
                || sa.max == f32::NEG_INFINITY
                || sb.max == f32::NEG_INFINITY
            {
                return Outcome::Excluded;
            }
            let (max_a, max_b) = (sa.max, sb.max);
            let m_a = oa.diff / oa.sum;
            let ln_kf = f64::from(max_b) - f64::from(max_a) + m_a;
            if sa.masked || sb.masked || oa.overflow || ln_kf.abs() > 60.0 {
                let row = masked_row(a, b, max_a, max_b, want_reverse);
                return Outcome::Row { a: sa, b: sb, row };
            }
            // Pass 2: the non-negative summands, and Σ w x (zero but for rounding in m).
            let kf = ln_kf.exp() as f32;
            let ea = &buf.ea;
            let (m, bases) = (m_a as f32, &buf.base_a);
            let (k, x, h) = if want_reverse {
                kl_pass::<true>(ea, a, b, bases, max_a, m, max_b, kf)
            } else {
                kl_pass::<false>(ea, a, b, bases, max_a, m, max_b, kf)
            };
            let (k, eps) = (k / oa.sum, x / oa.sum);
            let forward = recentre(k, eps).ln_1p();
            let lse_a = f64::from(max_a) + oa.sum.ln();
            // Σ e^{b - max_a} = e^{-m} Σ w e^{-x} = e^{-m} Σ (w g(x) + w - w x): the candidate's
            // normalizer without its own exponentials (exactly lse_a for a row against itself).
            let lse_b = (f64::from(max_a) - f64::from(m)) + (k - eps).ln_1p() + oa.sum.ln();
            let reverse = if want_reverse {
                reverse_from_sums(k, eps, h / oa.sum)
            } else {
                f64::NAN
            };
            if !(forward.is_finite() && lse_b.is_finite() && (!want_reverse || reverse.is_finite())) {
                // An f32 sum overflowed in pass 2 (extreme but finite logits): the f64 path.
                let row = masked_row(a, b, max_a, max_b, want_reverse);
                return Outcome::Row { a: sa, b: sb, row };
            }
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
    };
}

/// The kernels, portable build.
mod portable {
    kernels!(portable, #[inline]);
}

/// The kernels, AVX2 build (only called after the CPU check, see `dispatched!`).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    kernels!(avx2, #[inline] #[target_feature(enable = "avx2,fma")]);
}

/// Scratch buffers of the row kernel (one set per worker thread).
#[derive(Debug, Default)]
pub struct Buffers {
    ea: Vec<f32>,
    base_a: Vec<f32>,
}

dispatched! {
    /// Scan both rows and, unless excluded, their KL (both ways when `want_reverse`) and
    /// log-normalizers over the full vocabulary. Rows with -inf (masked tokens) or extreme scale
    /// differences take the careful all-f64 path.
    pub fn full => avx2::full, portable::full;
        (a: &[f32], b: &[f32], want_reverse: bool, buf: &mut Buffers) -> Outcome
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
        let (mut worst, mut total, mut count) = (0.0f64, 0.0f64, 0u32);
        let mut x = 0.0f32;
        while x > -87.0 {
            let got = f64::from(exp_f32(x));
            let want = f64::from(x).exp();
            let rel = ((got - want) / want).abs();
            worst = worst.max(rel);
            total += rel;
            count += 1;
            x -= 0.000_37;
        }
        assert!(worst < 1.3e-7, "worst relative error {worst:e}");
        assert!(total / f64::from(count) < 4e-8, "mean relative error");
        assert_eq!(exp_f32(f32::NEG_INFINITY), exp_f32(-87.0));
        assert!(exp_f32(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn g_polynomials_match_expm1() {
        for i in -999..1000 {
            let x = (f64::from(i) / 1000.0) as f32;
            let exact = (-f64::from(x)).exp_m1() + f64::from(x);
            let rel = |got: f32| ((f64::from(got) - exact) / exact.max(1e-300)).abs();
            assert!(rel(g_small(x)) < 2e-7 || exact < 1e-30, "{x}");
            if x.abs() < 0.25 {
                assert!(rel(g_tiny(x)) < 2e-7 || exact < 1e-30, "{x}");
            }
        }
    }

    /// Rows that take every branch of the kernel: tiny, small and large |x| (within one chunk
    /// and whole chunks), several tiles with the maximum growing, a length that leaves
    /// remainders.
    fn rows(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = super::super::stats::SplitMix64::new(seed);
        let mut u = || (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let a: Vec<f32> = (0..n).map(|i| 8.0 * u() + (i as f32 / 500.0)).collect();
        let b = a
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let spread = [0.01, 0.3, 1.5, 6.0][(i / 700) % 4];
                x + spread * u()
            })
            .collect();
        (a, b)
    }

    #[test]
    fn the_avx2_and_portable_builds_agree_to_the_bit() {
        // `full` runs the AVX2 build where the CPU has it; the portable one is called directly.
        for (n, seed) in [(9_001, 1), (2_048, 2), (151_936, 3), (37, 4)] {
            let (a, b) = rows(n, seed);
            for want_reverse in [true, false] {
                let (mut b1, mut b2) = (Buffers::default(), Buffers::default());
                let x = full(&a, &b, want_reverse, &mut b1);
                let y = portable::full(&a, &b, want_reverse, &mut b2);
                let bits = |o: Outcome| match o {
                    Outcome::Row { a, b, row } => Some((
                        a,
                        b,
                        [row.forward, row.reverse, row.lse_a, row.lse_b].map(f64::to_bits),
                    )),
                    Outcome::Excluded => None,
                };
                assert_eq!(bits(x), bits(y), "n = {n}, reverse {want_reverse}");
            }
        }
    }

    #[test]
    fn forward_does_not_depend_on_the_reverse_being_wanted() {
        let (a, b) = rows(20_000, 5);
        let mut buf = Buffers::default();
        let (Outcome::Row { row: both, .. }, Outcome::Row { row: fwd, .. }) =
            (full(&a, &b, true, &mut buf), full(&a, &b, false, &mut buf))
        else {
            panic!("finite rows");
        };
        assert_eq!(both.forward.to_bits(), fwd.forward.to_bits());
        assert_eq!(both.lse_b.to_bits(), fwd.lse_b.to_bits());
    }
}
