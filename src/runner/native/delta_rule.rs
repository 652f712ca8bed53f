//! The gated delta rule of Gated DeltaNet layers (Qwen3-Next, Qwen3.5 / Qwen3.6), pure Rust on
//! slices: the recurrent form (one token at a time, what decode runs) and the chunked form (64
//! tokens at a time, the WY/UT transform, what prefill runs), both over a carried state.
//!
//! The math is transformers' `torch_recurrent_gated_delta_rule` / `torch_chunk_gated_delta_rule`
//! with `use_qk_l2norm_in_kernel=True`: q and k are L2-normalised (`x * rsqrt(sum x^2 + 1e-6)`),
//! q is scaled by `key_dim^-0.5`, value head `h` reads key head `h / (value_heads / key_heads)`
//! (`repeat_interleave`), and per token, per value head, with the state `S` (`key_dim x
//! value_dim`):
//!
//! ```text
//! S <- S * exp(g_t);  kv = k^T S;  delta = (v - kv) * beta_t;  S <- S + k (x) delta;  o = q^T S
//! ```
//!
//! Both forms are generic over [`DeltaFloat`] (`f32`, `f64`): the native runner's f64 mode runs
//! them in f64 all through; its f32 and bf16 compute modes pass f32, as transformers does all
//! delta-rule math in fp32.
//!
//! The chunked form handles a last partial chunk as a chunk of its own length: nothing is padded,
//! so no padded position can reach the state (the class of transformers #46190, where prefill
//! and prefill-then-decode disagreed on Qwen3.5). It gives the recurrent form's output and final
//! state, and the same for a sequence split anywhere with the state carried between the calls.
//!
//! # The state dtype ([`StateDtype`])
//!
//! Engines keep the carried recurrent state ("SSM state") in a dtype of their own: vLLM's
//! `--mamba-ssm-cache-dtype`, SGLang's `--mamba-ssm-dtype`, bf16 by default on some backends.
//! An engine materialises that state only between its calls of the kernel: at the end of each
//! prefill chunk (the scheduler's chunked prefill, e.g. 2,048 tokens) and after every decode
//! step; inside a call the kernels keep it in fp32 registers. So the kernels here compute in the
//! compute precision (`F`) and never round the state; the caller (the hybrid layer, see
//! `hybrid.rs`) rounds what it carries from one call to the next. A one-pass prefill therefore
//! never sees the state dtype, as in an engine. `StateDtype::F32` means no rounding at all: in
//! f32 mode the state is f32, and in the f64 mode it is kept in f64 (the reference precision).

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};
use std::path::Path;

use rayon::prelude::*;

use super::matmul::{MatRef, matmul};
use crate::error::{Error, Result};

/// The chunk length of the chunked form (transformers', flash-linear-attention's and llama.cpp's).
pub const CHUNK: usize = 64;

/// The epsilon of the q/k L2 norm (transformers' `l2norm`, "aligned with FLA").
pub const L2_EPS: f64 = 1e-6;

/// Tokens computed per parallel block: the per-head output scratch is `BLOCK x value_dim`, so
/// memory stays flat on 100k-token prefills. A multiple of [`CHUNK`].
const BLOCK: usize = 4 * CHUNK;

/// Sizes of one sequence's gated delta rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaRuleShape {
    pub tokens: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
}

/// Precision the carried recurrent state is kept in between steps (engines' SSM-state dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateDtype {
    #[default]
    F32,
    Bf16,
    F16,
}

impl StateDtype {
    /// The accepted spellings: `f32`/`float32`, `bf16`/`bfloat16`, `f16`/`float16` (also with a
    /// `torch.` prefix, as configs and engines print them).
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.strip_prefix("torch.").unwrap_or(name);
        match name {
            "f32" | "float32" => Some(Self::F32),
            "bf16" | "bfloat16" => Some(Self::Bf16),
            "f16" | "float16" => Some(Self::F16),
            _ => None,
        }
    }

    /// The canonical name (`f32`, `bf16`, `f16`), as recorded and as the card writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// The names [`StateDtype::from_name`] accepts, for messages.
    pub const NAMES: &'static str = "f32 (float32), bf16 (bfloat16), f16 (float16)";
}

impl std::fmt::Display for StateDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The floating-point types the delta rule runs in: `f32` and `f64`.
pub trait DeltaFloat:
    Copy
    + Send
    + Sync
    + Debug
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    /// A per-step log decay below which `exp` is exactly 0 in this type: `g` is clamped there, so
    /// an infinite decay (a hostile `A_log`) resets the state in both forms instead of making the
    /// chunked form's cumulative sums `-inf - -inf`.
    const DECAY_FLOOR: Self;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn sqrt(self) -> Self;
    /// The larger of two values (`NaN` stays `NaN`).
    fn max_of(self, other: Self) -> Self;
    /// `self` rounded to `dtype` and back (`F32` leaves it as is).
    fn round_state(self, dtype: StateDtype) -> Self;
    /// `self * a + b` rounded once (a fused multiply-add, in hardware or in software).
    fn fused_mul_add(self, a: Self, b: Self) -> Self;
    /// The one-row product's chains of outputs `j0..j0 + 8` in SIMD lanes, where this type and
    /// CPU have a form for `rhs`'s layout (`None`: the caller runs the scalar chains, which give
    /// the same bits).
    fn row_tile(
        _x: super::matmul::MatRef<'_, Self>,
        _rhs: super::matmul::MatRef<'_, Self>,
        _j0: usize,
    ) -> Option<[Self; super::row_product::TILE]> {
        None
    }
    /// [`DeltaFloat::row_tile`] for outputs `j0..j0 + 2 · TILE` at once, where a form has them
    /// (twice the independent chains in flight).
    fn row_tile_wide(
        _x: super::matmul::MatRef<'_, Self>,
        _rhs: super::matmul::MatRef<'_, Self>,
        _j0: usize,
    ) -> Option<[Self; 2 * super::row_product::TILE]> {
        None
    }
}

impl DeltaFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const DECAY_FLOOR: Self = -110.0;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn max_of(self, other: Self) -> Self {
        if self.is_nan() { self } else { self.max(other) }
    }
    fn round_state(self, dtype: StateDtype) -> Self {
        match dtype {
            StateDtype::F32 => self,
            StateDtype::Bf16 => half::bf16::from_f32(self).to_f32(),
            StateDtype::F16 => half::f16::from_f32(self).to_f32(),
        }
    }
    fn fused_mul_add(self, a: Self, b: Self) -> Self {
        self.mul_add(a, b)
    }
    fn row_tile(
        x: super::matmul::MatRef<'_, Self>,
        rhs: super::matmul::MatRef<'_, Self>,
        j0: usize,
    ) -> Option<[Self; super::row_product::TILE]> {
        super::row_product::f32_tile(x, rhs, j0)
    }
    fn row_tile_wide(
        x: super::matmul::MatRef<'_, Self>,
        rhs: super::matmul::MatRef<'_, Self>,
        j0: usize,
    ) -> Option<[Self; 2 * super::row_product::TILE]> {
        super::row_product::f32_tile_wide(x, rhs, j0)
    }
}

impl DeltaFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const DECAY_FLOOR: Self = -750.0;
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn max_of(self, other: Self) -> Self {
        if self.is_nan() { self } else { self.max(other) }
    }
    fn round_state(self, dtype: StateDtype) -> Self {
        match dtype {
            StateDtype::F32 => self,
            StateDtype::Bf16 => half::bf16::from_f64(self).to_f64(),
            StateDtype::F16 => half::f16::from_f64(self).to_f64(),
        }
    }
    fn fused_mul_add(self, a: Self, b: Self) -> Self {
        self.mul_add(a, b)
    }
}

/// Checks every slice against the shape: a mismatch is a bug in the caller (an internal error),
/// never an out-of-bounds read or a silently wrong answer.
fn check<F>(
    shape: DeltaRuleShape,
    q: &[F],
    k: &[F],
    v: &[F],
    g: &[F],
    beta: &[F],
    state: &[F],
) -> Result<()> {
    let DeltaRuleShape {
        tokens,
        key_heads,
        value_heads,
        key_dim,
        value_dim,
    } = shape;
    let here = Path::new("delta_rule");
    let fail = |what: String| Err(Error::internal(here, format!("gated delta rule: {what}")));
    if key_heads == 0 || value_heads == 0 || key_dim == 0 || value_dim == 0 {
        return fail(format!("empty head shape {shape:?}"));
    }
    if value_heads % key_heads != 0 {
        return fail(format!(
            "{value_heads} value heads are not a multiple of {key_heads} key heads"
        ));
    }
    let size = |a: usize, b: usize, c: usize| a.checked_mul(b).and_then(|x| x.checked_mul(c));
    let expect = [
        ("q", q.len(), size(tokens, key_heads, key_dim)),
        ("k", k.len(), size(tokens, key_heads, key_dim)),
        ("v", v.len(), size(tokens, value_heads, value_dim)),
        ("g", g.len(), size(tokens, value_heads, 1)),
        ("beta", beta.len(), size(tokens, value_heads, 1)),
        ("state", state.len(), size(value_heads, key_dim, value_dim)),
    ];
    for (name, len, want) in expect {
        if Some(len) != want {
            return fail(format!(
                "`{name}` holds {len} values where the shape {shape:?} needs {}",
                want.map_or("more than usize::MAX".into(), |w| w.to_string())
            ));
        }
    }
    Ok(())
}

/// `dst = src * rsqrt(sum src^2 + eps) * scale`.
#[inline]
fn l2_normalised<F: DeltaFloat>(src: &[F], scale: F, dst: &mut [F]) {
    let inv = F::ONE / (dot(src, src) + F::from_f64(L2_EPS)).sqrt();
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = x * inv * scale;
    }
}

/// `y += a * x`.
#[inline]
fn axpy<F: DeltaFloat>(y: &mut [F], a: F, x: &[F]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `a . b` with eight independent accumulators, so the compiler can keep them in vector lanes (a
/// single running sum is a serial chain it may not reorder).
#[inline]
fn dot<F: DeltaFloat>(a: &[F], b: &[F]) -> F {
    let mut acc = [F::ZERO; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let mut tail = F::ZERO;
    for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    for (x, y) in ca.zip(cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// The scale applied to q: `key_dim^-0.5`.
fn q_scale<F: DeltaFloat>(key_dim: usize) -> F {
    F::from_f64((key_dim as f64).powf(-0.5))
}

/// Runs `head` over every value head in parallel, one block of tokens at a time, and
/// interleaves the per-head outputs into `[tokens, value_heads, value_dim]`. `head(h, t0, t1,
/// state_h, out)` computes tokens `t0..t1` of value head `h` into `out` (`(t1 - t0) x
/// value_dim`), reading and updating that head's state.
fn by_heads<F, H>(shape: DeltaRuleShape, state: &mut [F], head: H) -> Vec<F>
where
    F: DeltaFloat,
    H: Fn(usize, usize, usize, &mut [F], &mut [F]) + Sync,
{
    let DeltaRuleShape {
        tokens,
        value_heads,
        key_dim,
        value_dim,
        ..
    } = shape;
    let mut out = vec![F::ZERO; tokens * value_heads * value_dim];
    let block = BLOCK.min(tokens.max(1));
    let mut scratch: Vec<Vec<F>> = (0..value_heads)
        .map(|_| vec![F::ZERO; block * value_dim])
        .collect();
    let mut t0 = 0;
    while t0 < tokens {
        let t1 = (t0 + block).min(tokens);
        scratch
            .par_iter_mut()
            .zip(state.par_chunks_mut(key_dim * value_dim))
            .enumerate()
            .for_each(|(h, (buf, s))| head(h, t0, t1, s, &mut buf[..(t1 - t0) * value_dim]));
        let rows = &mut out[t0 * value_heads * value_dim..t1 * value_heads * value_dim];
        for (i, row) in rows.chunks_exact_mut(value_heads * value_dim).enumerate() {
            for (h, dst) in row.chunks_exact_mut(value_dim).enumerate() {
                dst.copy_from_slice(&scratch[h][i * value_dim..(i + 1) * value_dim]);
            }
        }
        t0 = t1;
    }
    out
}

/// The recurrent form: one token at a time (what decode runs). Arguments as [`chunked`].
#[allow(clippy::too_many_arguments)]
pub fn recurrent<F: DeltaFloat>(
    shape: DeltaRuleShape,
    q: &[F],
    k: &[F],
    v: &[F],
    g: &[F],
    beta: &[F],
    state: &mut [F],
) -> Result<Vec<F>> {
    check(shape, q, k, v, g, beta, state)?;
    let DeltaRuleShape {
        key_heads,
        value_heads,
        key_dim: dk,
        value_dim: dv,
        ..
    } = shape;
    let group = value_heads / key_heads;
    let scale = q_scale::<F>(dk);
    Ok(by_heads(shape, state, |h, t0, t1, s, out| {
        let kh = h / group;
        let (mut qn, mut kn) = (vec![F::ZERO; dk], vec![F::ZERO; dk]);
        let mut kv = vec![F::ZERO; dv];
        for (t, o) in (t0..t1).zip(out.chunks_exact_mut(dv)) {
            let at = (t * key_heads + kh) * dk;
            l2_normalised(&q[at..at + dk], scale, &mut qn);
            l2_normalised(&k[at..at + dk], F::ONE, &mut kn);
            let vt = &v[(t * value_heads + h) * dv..][..dv];
            let decay = g[t * value_heads + h].max_of(F::DECAY_FLOOR).exp();
            let b = beta[t * value_heads + h];
            // kv = k^T (S * decay), read before the update.
            kv.fill(F::ZERO);
            for (&kr, srow) in kn.iter().zip(s.chunks_exact(dv)) {
                axpy(&mut kv, kr, srow);
            }
            // delta = (v - kv) * beta, kept in `kv`.
            for (d, &x) in kv.iter_mut().zip(vt) {
                *d = (x - *d * decay) * b;
            }
            // S <- S * decay + k (x) delta; o = q^T S.
            o.fill(F::ZERO);
            for ((&kr, &qr), srow) in kn.iter().zip(&qn).zip(s.chunks_exact_mut(dv)) {
                for (sv, &d) in srow.iter_mut().zip(&kv) {
                    *sv = *sv * decay + kr * d;
                }
                axpy(o, qr, srow);
            }
        }
    }))
}

/// The chunked form (chunks of [`CHUNK`] tokens, the WY/UT transform): what prefill runs, with
/// cost linear in tokens.
///
/// `q`, `k`: `[tokens, key_heads, key_dim]` as they leave the conv + SiLU (not yet normalised);
/// `v`: `[tokens, value_heads, value_dim]`; `g` (per-step log decay, `<= 0`) and `beta`:
/// `[tokens, value_heads]`; `state`: `[value_heads, key_dim, value_dim]`, the carried state, read
/// and updated in place (zeros for a fresh sequence). Returns `o`: `[tokens, value_heads,
/// value_dim]`. A slice whose length does not match the shape is an internal error.
///
/// Per chunk of `L` tokens, with `c` the in-chunk cumulative log decay and `S` the state at the
/// chunk's start: the delta-rule corrections `u` solve the unit-lower-triangular system
/// `u_i + sum_{j<i} beta_i (k_i . k_j) exp(c_i - c_j) u_j = beta_i (v_i - exp(c_i) k_i^T S)` by
/// forward substitution; then `o_i = exp(c_i) q_i^T S + sum_{j<=i} (q_i . k_j) exp(c_i - c_j) u_j`
/// and `S <- exp(c_L) S + sum_j exp(c_L - c_j) k_j (x) u_j`. A last partial chunk is a chunk of
/// its own length (no padding).
#[allow(clippy::too_many_arguments)]
pub fn chunked<F: DeltaFloat>(
    shape: DeltaRuleShape,
    q: &[F],
    k: &[F],
    v: &[F],
    g: &[F],
    beta: &[F],
    state: &mut [F],
) -> Result<Vec<F>> {
    check(shape, q, k, v, g, beta, state)?;
    let DeltaRuleShape {
        key_heads,
        value_heads,
        key_dim: dk,
        value_dim: dv,
        ..
    } = shape;
    let group = value_heads / key_heads;
    let scale = q_scale::<F>(dk);
    Ok(by_heads(shape, state, |h, t0, t1, s, out| {
        let kh = h / group;
        // Per-chunk scratch, allocated once per head and block. `qk_rows` stacks the chunk's
        // normalised q (rows 0..L) over its k (rows L..2L), so one product serves both.
        let mut qk_rows = vec![F::ZERO; 2 * CHUNK * dk];
        let mut gram = [F::ZERO; 2 * CHUNK * CHUNK];
        let mut read = vec![F::ZERO; 2 * CHUNK * dv];
        let mut u = vec![F::ZERO; CHUNK * dv];
        let mut kw = vec![F::ZERO; CHUNK * dk];
        let mut qk = [F::ZERO; CHUNK * CHUNK];
        let mut cum = [F::ZERO; CHUNK];
        let mut ecum = [F::ZERO; CHUNK];
        let mut c0 = t0;
        while c0 < t1 {
            let len = CHUNK.min(t1 - c0);
            let rows = &mut qk_rows[..2 * len * dk];
            let out = &mut out[(c0 - t0) * dv..(c0 - t0 + len) * dv];
            // Normalised q (scaled) and k, the cumulative log decay.
            let mut acc = F::ZERO;
            for i in 0..len {
                let t = c0 + i;
                let at = (t * key_heads + kh) * dk;
                let (qs, ks) = rows.split_at_mut(len * dk);
                l2_normalised(&q[at..at + dk], scale, &mut qs[i * dk..(i + 1) * dk]);
                l2_normalised(&k[at..at + dk], F::ONE, &mut ks[i * dk..(i + 1) * dk]);
                acc += g[t * value_heads + h].max_of(F::DECAY_FLOOR);
                cum[i] = acc;
                ecum[i] = acc.exp();
            }
            let rows = &qk_rows[..2 * len * dk];
            let kc = &rows[len * dk..];
            // [q; k] k^T: the chunk's q.k and k.k products, one [2L, dk] x [dk, L] product.
            let gram = &mut gram[..2 * len * len];
            matmul(
                gram,
                len,
                None,
                MatRef::rows(rows, 2 * len, dk),
                MatRef::rows(kc, len, dk).transposed(),
            );
            // [q; k] S: every token's read of the chunk-start state, one [2L, dk] x [dk, dv].
            let read = &mut read[..2 * len * dv];
            matmul(
                read,
                dv,
                None,
                MatRef::rows(rows, 2 * len, dk),
                MatRef::rows(s, dk, dv),
            );
            // Decayed, masked Gram matrices: qk[i][j] = (q_i . k_j) exp(c_i - c_j) for j <= i;
            // kk[i][j] = beta_i (k_i . k_j) exp(c_i - c_j) for j < i (kept in gram's k half).
            let (gq, gk) = gram.split_at_mut(len * len);
            let qk = &mut qk[..len * len];
            for i in 0..len {
                let b = beta[(c0 + i) * value_heads + h];
                for j in 0..len {
                    let at = i * len + j;
                    if j <= i {
                        let decay = (cum[i] - cum[j]).exp();
                        qk[at] = gq[at] * decay;
                        gk[at] = if j < i { b * gk[at] * decay } else { F::ZERO };
                    } else {
                        qk[at] = F::ZERO;
                        gk[at] = F::ZERO;
                    }
                }
            }
            // Right-hand side: beta_i (v_i - exp(c_i) k_i^T S); and o_i = exp(c_i) q_i^T S.
            let u = &mut u[..len * dv];
            let (read_q, read_k) = read.split_at(len * dv);
            let rows_of = u
                .chunks_exact_mut(dv)
                .zip(out.chunks_exact_mut(dv))
                .zip(read_k.chunks_exact(dv).zip(read_q.chunks_exact(dv)));
            for (i, ((ui, oi), (rk, rq))) in rows_of.enumerate() {
                let t = c0 + i;
                let b = beta[t * value_heads + h];
                let e = ecum[i];
                let vt = &v[(t * value_heads + h) * dv..][..dv];
                for ((uv, &w), &x) in ui.iter_mut().zip(rk).zip(vt) {
                    *uv = b * (x - e * w);
                }
                for (ov, &w) in oi.iter_mut().zip(rq) {
                    *ov = e * w;
                }
            }
            // Forward substitution (unit lower triangular): u_i -= sum_{j<i} kk[i][j] u_j.
            for i in 1..len {
                let (done, rest) = u.split_at_mut(i * dv);
                let ui = &mut rest[..dv];
                for (j, uj) in done.chunks_exact(dv).enumerate() {
                    axpy(ui, -gk[i * len + j], uj);
                }
            }
            // o += qk u: the in-chunk attention, one [L, L] x [L, dv] product.
            matmul(
                out,
                dv,
                Some(F::ONE),
                MatRef::rows(qk, len, len),
                MatRef::rows(u, len, dv),
            );
            // S <- exp(c_L) S + sum_j exp(c_L - c_j) k_j (x) u_j: one [dk, L] x [L, dv]
            // product.
            let last = cum[len - 1];
            let kw = &mut kw[..len * dk];
            for (j, (dst, src)) in kw.chunks_exact_mut(dk).zip(kc.chunks_exact(dk)).enumerate() {
                let w = (last - cum[j]).exp();
                for (d, &x) in dst.iter_mut().zip(src) {
                    *d = x * w;
                }
            }
            matmul(
                s,
                dv,
                Some(ecum[len - 1]),
                MatRef::rows(kw, len, dk).transposed(),
                MatRef::rows(u, len, dv),
            );
            c0 += len;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (splitmix64) with normal draws (Box-Muller).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f64 {
            let (a, b) = (self.next().max(1e-300), self.next());
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        }
        fn normals(&mut self, n: usize) -> Vec<f64> {
            (0..n).map(|_| self.normal()).collect()
        }
    }

    /// Inputs of one sequence as transformers' GDN layer makes them: g = -exp(a) * softplus(b),
    /// beta = sigmoid(x).
    struct Inputs {
        shape: DeltaRuleShape,
        q: Vec<f64>,
        k: Vec<f64>,
        v: Vec<f64>,
        g: Vec<f64>,
        beta: Vec<f64>,
        state: Vec<f64>,
    }

    fn inputs(tokens: usize, seed: u64) -> Inputs {
        let shape = DeltaRuleShape {
            tokens,
            key_heads: 2,
            value_heads: 4,
            key_dim: 16,
            value_dim: 8,
        };
        inputs_of(shape, seed)
    }

    fn inputs_of(shape: DeltaRuleShape, seed: u64) -> Inputs {
        let tokens = shape.tokens;
        let mut r = Rng(seed);
        let nk = tokens * shape.key_heads * shape.key_dim;
        let nv = tokens * shape.value_heads * shape.value_dim;
        let ng = tokens * shape.value_heads;
        let g = (0..ng)
            .map(|_| {
                let (a, b) = (r.normal() * 0.5 - 1.0, r.normal());
                -a.exp() * (1.0 + b.exp()).ln()
            })
            .collect();
        let beta = (0..ng).map(|_| 1.0 / (1.0 + (-r.normal()).exp())).collect();
        Inputs {
            q: r.normals(nk),
            k: r.normals(nk),
            v: r.normals(nv),
            g,
            beta,
            state: r
                .normals(shape.value_heads * shape.key_dim * shape.value_dim)
                .into_iter()
                .map(|x| x * 0.1)
                .collect(),
            shape,
        }
    }

    fn to32(x: &[f64]) -> Vec<f32> {
        x.iter().map(|&x| x as f32).collect()
    }

    type Form<F> = fn(DeltaRuleShape, &[F], &[F], &[F], &[F], &[F], &mut [F]) -> Result<Vec<F>>;

    fn run<F: DeltaFloat>(
        form: Form<F>,
        x: &Inputs,
        conv: fn(&[f64]) -> Vec<F>,
    ) -> (Vec<F>, Vec<F>) {
        let mut state = conv(&x.state);
        let o = form(
            x.shape,
            &conv(&x.q),
            &conv(&x.k),
            &conv(&x.v),
            &conv(&x.g),
            &conv(&x.beta),
            &mut state,
        )
        .unwrap();
        (o, state)
    }

    /// Runs the sequence in pieces split at `cuts`, carrying the state, rounded to `dtype`
    /// between pieces (as an engine stores it between calls).
    fn run_split<F: DeltaFloat>(
        form: Form<F>,
        x: &Inputs,
        conv: fn(&[f64]) -> Vec<F>,
        cuts: &[usize],
        dtype: StateDtype,
    ) -> (Vec<F>, Vec<F>) {
        let s = x.shape;
        let mut state = conv(&x.state);
        let mut out = Vec::new();
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(s.tokens);
        for w in bounds.windows(2) {
            let (a, b) = (w[0], w[1]);
            let shape = DeltaRuleShape { tokens: b - a, ..s };
            let kd = s.key_heads * s.key_dim;
            let vd = s.value_heads * s.value_dim;
            let hv = s.value_heads;
            out.extend(
                form(
                    shape,
                    &conv(&x.q[a * kd..b * kd]),
                    &conv(&x.k[a * kd..b * kd]),
                    &conv(&x.v[a * vd..b * vd]),
                    &conv(&x.g[a * hv..b * hv]),
                    &conv(&x.beta[a * hv..b * hv]),
                    &mut state,
                )
                .unwrap(),
            );
            if b < s.tokens {
                for w in state.iter_mut() {
                    *w = w.round_state(dtype);
                }
            }
        }
        (out, state)
    }

    /// The largest |a - b| relative to the largest |b| (at least 1).
    fn rel_diff<F: DeltaFloat>(a: &[F], b: &[F]) -> f64 {
        let f = |x: F| x.to_f64();
        assert_eq!(a.len(), b.len());
        let scale = b.iter().map(|&x| f(x).abs()).fold(1.0, f64::max);
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (f(x) - f(y)).abs())
            .fold(0.0, f64::max)
            / scale
    }

    #[test]
    fn recurrent_and_chunked_agree_at_chunk_edges_f32_and_f64() {
        for tokens in [1, 63, 64, 65, 200] {
            let x = inputs(tokens, 7 + tokens as u64);
            let (ro, rs) = run::<f32>(recurrent, &x, to32);
            let (co, cs) = run::<f32>(chunked, &x, to32);
            assert!(rel_diff(&co, &ro) < 1e-5, "f32 output, {tokens} tokens");
            assert!(rel_diff(&cs, &rs) < 1e-5, "f32 state, {tokens} tokens");
            let (ro, rs) = run::<f64>(recurrent, &x, <[f64]>::to_vec);
            let (co, cs) = run::<f64>(chunked, &x, <[f64]>::to_vec);
            assert!(rel_diff(&co, &ro) < 1e-12, "f64 output, {tokens} tokens");
            assert!(rel_diff(&cs, &rs) < 1e-12, "f64 state, {tokens} tokens");
            assert!(ro.iter().all(|x| x.is_finite()) && ro.iter().any(|&x| x != 0.0));
        }
    }

    /// Head sizes like real models' (and not square), so the blocked products run the matrix
    /// kernels' full-width paths, not only their small-size edges.
    #[test]
    fn recurrent_and_chunked_agree_at_model_sized_heads() {
        let shape = DeltaRuleShape {
            tokens: 150,
            key_heads: 1,
            value_heads: 2,
            key_dim: 128,
            value_dim: 96,
        };
        let x = inputs_of(shape, 29);
        let (ro, rs) = run::<f64>(recurrent, &x, <[f64]>::to_vec);
        let (co, cs) = run::<f64>(chunked, &x, <[f64]>::to_vec);
        assert!(rel_diff(&co, &ro) < 1e-12 && rel_diff(&cs, &rs) < 1e-12);
        let (ro, rs) = run::<f32>(recurrent, &x, to32);
        let (co, cs) = run::<f32>(chunked, &x, to32);
        assert!(rel_diff(&co, &ro) < 1e-5 && rel_diff(&cs, &rs) < 1e-5);
    }

    #[test]
    fn a_sequence_split_anywhere_gives_the_same_output_and_state() {
        let x = inputs(200, 3);
        let (whole, whole_state) = run::<f64>(chunked, &x, <[f64]>::to_vec);
        for cuts in [&[1][..], &[63], &[64], &[65], &[10, 100, 129], &[199]] {
            for form in [chunked as Form<f64>, recurrent] {
                let (o, s) = run_split(form, &x, <[f64]>::to_vec, cuts, StateDtype::F32);
                assert!(rel_diff(&o, &whole) < 1e-12, "split at {cuts:?}");
                assert!(
                    rel_diff(&s, &whole_state) < 1e-12,
                    "state split at {cuts:?}"
                );
            }
            let (o, s) = run_split::<f32>(chunked, &x, to32, cuts, StateDtype::F32);
            assert!(rel_diff(&o, &to32(&whole)) < 1e-5, "f32 split at {cuts:?}");
            assert!(rel_diff(&s, &to32(&whole_state)) < 1e-5);
        }
    }

    #[test]
    fn a_low_precision_state_acts_between_calls_only_and_f32_not_at_all() {
        let x = inputs(130, 11);
        let cuts = [32, 64, 96, 100];
        for form in [chunked as Form<f32>, recurrent] {
            let (plain, _) = run::<f32>(form, &x, to32);
            // F32: no rounding; split calls are the whole call to f32 precision.
            let (f32_split, _) = run_split::<f32>(form, &x, to32, &cuts, StateDtype::F32);
            assert!(rel_diff(&f32_split, &plain) < 1e-5);
            for dtype in [StateDtype::Bf16, StateDtype::F16] {
                let (a, sa) = run_split::<f32>(form, &x, to32, &cuts, dtype);
                let (b, _) = run_split::<f32>(form, &x, to32, &cuts, dtype);
                assert_eq!(a, b, "{dtype} deterministic");
                let d = rel_diff(&a, &f32_split);
                assert!(d > 1e-6, "{dtype} changes the output ({d})");
                assert!(d < 0.1, "{dtype} changes the output a little ({d})");
                // Rows before the first boundary never read a rounded state.
                let first = 32 * x.shape.value_heads * x.shape.value_dim;
                assert_eq!(
                    a[..first],
                    f32_split[..first],
                    "{dtype} before the first call ends"
                );
                // The state after the last piece is the kernel's, not rounded (the caller
                // rounds what it stores).
                assert!(sa.iter().any(|&w| w.round_state(dtype) != w));
            }
            // bf16 (8 mantissa bits) moves it more than f16 (11).
            let bf = rel_diff(
                &run_split::<f32>(form, &x, to32, &cuts, StateDtype::Bf16).0,
                &f32_split,
            );
            let hf = rel_diff(
                &run_split::<f32>(form, &x, to32, &cuts, StateDtype::F16).0,
                &f32_split,
            );
            assert!(bf > hf, "bf16 {bf} vs f16 {hf}");
        }
        // In f64 mode F32 keeps f64: no rounding to f32 at all.
        let (a, _) = run::<f64>(chunked, &x, <[f64]>::to_vec);
        let (r, _) = run::<f64>(recurrent, &x, <[f64]>::to_vec);
        assert!(rel_diff(&a, &r) < 1e-12);
    }

    #[test]
    fn recurrent_matches_a_direct_transcription_of_the_rule() {
        // S <- S*exp(g); kv = k^T S; delta = (v - kv)*beta; S <- S + k (x) delta; o = q^T S,
        // written out on one head group with plain indexing.
        let x = inputs(9, 5);
        let s = x.shape;
        let (dk, dv) = (s.key_dim, s.value_dim);
        let mut state = x.state.clone();
        let mut want = vec![0.0; s.tokens * s.value_heads * dv];
        for h in 0..s.value_heads {
            let kh = h / (s.value_heads / s.key_heads);
            let st = &mut state[h * dk * dv..(h + 1) * dk * dv];
            for t in 0..s.tokens {
                let at = (t * s.key_heads + kh) * dk;
                let norm = |x: &[f64]| {
                    let n = 1.0 / (x.iter().map(|a| a * a).sum::<f64>() + 1e-6).sqrt();
                    x.iter().map(|a| a * n).collect::<Vec<_>>()
                };
                let qn: Vec<f64> = norm(&x.q[at..at + dk])
                    .iter()
                    .map(|a| a / (dk as f64).sqrt())
                    .collect();
                let kn = norm(&x.k[at..at + dk]);
                let gi = x.g[t * s.value_heads + h].exp();
                st.iter_mut().for_each(|w| *w *= gi);
                for c in 0..dv {
                    let kv: f64 = (0..dk).map(|r| kn[r] * st[r * dv + c]).sum();
                    let delta = (x.v[(t * s.value_heads + h) * dv + c] - kv)
                        * x.beta[t * s.value_heads + h];
                    for r in 0..dk {
                        st[r * dv + c] += kn[r] * delta;
                    }
                    want[(t * s.value_heads + h) * dv + c] =
                        (0..dk).map(|r| qn[r] * st[r * dv + c]).sum();
                }
            }
        }
        let (o, st) = run::<f64>(recurrent, &x, <[f64]>::to_vec);
        assert!(rel_diff(&o, &want) < 1e-13);
        assert!(rel_diff(&st, &state) < 1e-13);
    }

    #[test]
    fn an_infinite_decay_resets_the_state_in_both_forms() {
        let mut x = inputs(100, 17);
        x.g[40 * x.shape.value_heads + 1] = f64::NEG_INFINITY;
        let (ro, rs) = run::<f64>(recurrent, &x, <[f64]>::to_vec);
        let (co, cs) = run::<f64>(chunked, &x, <[f64]>::to_vec);
        assert!(co.iter().all(|x| x.is_finite()));
        assert!(rel_diff(&co, &ro) < 1e-12 && rel_diff(&cs, &rs) < 1e-12);
    }

    #[test]
    fn lengths_that_do_not_match_the_shape_are_an_error() {
        let x = inputs(5, 1);
        let mut state = x.state.clone();
        let short = &x.v[1..];
        for form in [chunked as Form<f64>, recurrent] {
            let e = form(x.shape, &x.q, &x.k, short, &x.g, &x.beta, &mut state).unwrap_err();
            assert!(e.is_internal(), "{e}");
            assert!(e.to_string().contains("`v` holds 159 values"), "{e}");
            let bad = DeltaRuleShape {
                value_heads: 3,
                ..x.shape
            };
            let e = form(bad, &x.q, &x.k, &x.v, &x.g, &x.beta, &mut state).unwrap_err();
            assert!(e.to_string().contains("not a multiple"), "{e}");
        }
        // An empty sequence is fine and leaves the state alone.
        let empty = DeltaRuleShape {
            tokens: 0,
            ..x.shape
        };
        let o = chunked::<f64>(empty, &[], &[], &[], &[], &[], &mut state);
        assert!(o.unwrap().is_empty());
        assert_eq!(state, x.state);
    }

    #[test]
    fn state_dtype_names() {
        for (n, d) in [
            ("f32", StateDtype::F32),
            ("float32", StateDtype::F32),
            ("torch.float32", StateDtype::F32),
            ("bf16", StateDtype::Bf16),
            ("bfloat16", StateDtype::Bf16),
            ("f16", StateDtype::F16),
            ("float16", StateDtype::F16),
        ] {
            assert_eq!(StateDtype::from_name(n), Some(d), "{n}");
            assert_eq!(StateDtype::from_name(d.as_str()), Some(d));
        }
        for bad in ["", "fp8", "F32", "half", "float64"] {
            assert_eq!(StateDtype::from_name(bad), None, "{bad}");
        }
        assert_eq!(
            serde_json::to_string(&StateDtype::Bf16).unwrap(),
            "\"bf16\""
        );
    }
}
