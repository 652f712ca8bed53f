//! The 8-lane operations the row kernels are written in, twice: `portable` (arrays, one
//! lane-wise loop per operation) and `avx2` (one AVX2 instruction per operation, with the CPU
//! feature check that selects it). `kernel::kernels!` writes each kernel once and instantiates it
//! over both.
//!
//! Each operation does, in every lane, exactly the scalar IEEE operation (no fused multiply-adds;
//! `max_gt` is `if a > b { a } else { b }`, which is what `vmaxps` computes; integer operations
//! are exact), so both builds give
//! the same bits, and a test compares them.

/// Lanes of a vector.
pub const W: usize = 8;

/// Whether this CPU has AVX2 and FMA (std caches the detection).
#[cfg(target_arch = "x86_64")]
pub fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

pub mod portable {
    use super::W;

    pub type F = [f32; W];
    pub type M = [u32; W];
    pub type D = [f64; W];

    #[inline(always)]
    fn map(a: F, f: impl Fn(f32) -> f32) -> F {
        let mut r = a;
        for x in &mut r {
            *x = f(*x);
        }
        r
    }

    #[inline(always)]
    fn zip(a: F, b: F, f: impl Fn(f32, f32) -> f32) -> F {
        let mut r = a;
        for j in 0..W {
            r[j] = f(a[j], b[j]);
        }
        r
    }

    #[inline(always)]
    pub fn splat(v: f32) -> F {
        [v; W]
    }

    /// The first 8 entries of `s`.
    #[inline(always)]
    pub fn load(s: &[f32]) -> F {
        let mut r = [0f32; W];
        r.copy_from_slice(&s[..W]);
        r
    }

    #[inline(always)]
    pub fn store(v: F, s: &mut [f32]) {
        s[..W].copy_from_slice(&v);
    }

    #[inline(always)]
    pub fn add(a: F, b: F) -> F {
        zip(a, b, |x, y| x + y)
    }

    #[inline(always)]
    pub fn sub(a: F, b: F) -> F {
        zip(a, b, |x, y| x - y)
    }

    #[inline(always)]
    pub fn mul(a: F, b: F) -> F {
        zip(a, b, |x, y| x * y)
    }

    /// `if a > b { a } else { b }`: a NaN in either gives `b`.
    #[inline(always)]
    pub fn max_gt(a: F, b: F) -> F {
        zip(a, b, |x, y| if x > y { x } else { y })
    }

    #[inline(always)]
    pub fn abs(a: F) -> F {
        map(a, f32::abs)
    }

    /// Lanes where `a < b`.
    #[inline(always)]
    pub fn lt(a: F, b: F) -> M {
        let mut r = [0u32; W];
        for j in 0..W {
            r[j] = if a[j] < b[j] { u32::MAX } else { 0 };
        }
        r
    }

    #[inline(always)]
    pub fn all(m: M) -> bool {
        m.iter().all(|&v| v != 0)
    }

    /// `m ? a : b`, lane-wise.
    #[inline(always)]
    pub fn select(m: M, a: F, b: F) -> F {
        let mut r = a;
        for j in 0..W {
            r[j] = if m[j] != 0 { a[j] } else { b[j] };
        }
        r
    }

    /// `table[k & 7] · 2^(k >> 3)` for the integer k that `t = k + 1.5·2^23` holds in its low
    /// bits (see `kernel::exp_f32`): the table's exponent field plus k >> 3 (the 1.5·2^23 part
    /// drops out of the shifted bits).
    #[inline(always)]
    pub fn scale_table(table: &[f32; W], t: F) -> F {
        let mut r = t;
        for x in &mut r {
            let b = x.to_bits();
            *x = f32::from_bits(
                table[(b & 7) as usize]
                    .to_bits()
                    .wrapping_add((b >> 3) << 23),
            );
        }
        r
    }

    /// The largest lane, folded in lane order with `>`.
    #[inline(always)]
    pub fn hmax(a: F) -> f32 {
        a.iter()
            .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
    }

    #[inline(always)]
    pub fn dzero() -> D {
        [0.0; W]
    }

    /// `d + f64(a)`, lane-wise.
    #[inline(always)]
    pub fn dadd(d: D, a: F) -> D {
        let mut r = d;
        for j in 0..W {
            r[j] += f64::from(a[j]);
        }
        r
    }

    /// The lanes' sum, in lane order.
    #[inline(always)]
    pub fn dsum(d: D) -> f64 {
        d.iter().sum()
    }

    /// A hint to fetch the cache line at `s` into L2 (none here).
    #[inline(always)]
    pub fn prefetch(_s: &[f32]) {}
}

/// The same operations as `portable`, one AVX2 instruction each. Callable only from functions
/// compiled with `#[target_feature(enable = "avx2,fma")]`.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use super::W;
    use std::arch::x86_64::*;

    pub type F = __m256;
    pub type M = __m256;
    pub type D = (__m256d, __m256d);

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn splat(v: f32) -> F {
        _mm256_set1_ps(v)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn load(s: &[f32]) -> F {
        let mut r = [0f32; W];
        r.copy_from_slice(&s[..W]);
        bytemuck::cast(r)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn store(v: F, s: &mut [f32]) {
        s[..W].copy_from_slice(&bytemuck::cast::<F, [f32; W]>(v));
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn add(a: F, b: F) -> F {
        _mm256_add_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn sub(a: F, b: F) -> F {
        _mm256_sub_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn mul(a: F, b: F) -> F {
        _mm256_mul_ps(a, b)
    }

    /// `vmaxps a, b`: `if a > b { a } else { b }`, a NaN in either gives `b`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn max_gt(a: F, b: F) -> F {
        _mm256_max_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn abs(a: F) -> F {
        _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn lt(a: F, b: F) -> M {
        _mm256_cmp_ps::<_CMP_LT_OQ>(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn all(m: M) -> bool {
        _mm256_movemask_ps(m) == 0xFF
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn select(m: M, a: F, b: F) -> F {
        _mm256_blendv_ps(b, a, m)
    }

    /// `vpermps` picks the table entry by the low 3 bits of each lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn scale_table(table: &[f32; W], t: F) -> F {
        let ti = _mm256_castps_si256(t);
        let entry = _mm256_permutevar8x32_ps(bytemuck::cast(*table), ti);
        let exponent = _mm256_slli_epi32::<23>(_mm256_srli_epi32::<3>(ti));
        _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(entry), exponent))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn hmax(a: F) -> f32 {
        super::portable::hmax(bytemuck::cast(a))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn dzero() -> D {
        (_mm256_setzero_pd(), _mm256_setzero_pd())
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn dadd(d: D, a: F) -> D {
        let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
        let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(a));
        (_mm256_add_pd(d.0, lo), _mm256_add_pd(d.1, hi))
    }

    /// A hint to fetch the cache line at `s` into L2 (no effect on results, no fault).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn prefetch(s: &[f32]) {
        _mm_prefetch::<_MM_HINT_T1>(s.as_ptr().cast::<i8>());
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn dsum(d: D) -> f64 {
        let (lo, hi): ([f64; 4], [f64; 4]) = (bytemuck::cast(d.0), bytemuck::cast(d.1));
        super::portable::dsum([lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]])
    }
}
