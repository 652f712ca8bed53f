//! The gated delta rule of Gated DeltaNet layers (Qwen3.5 / Qwen3.6, Qwen3-Next).
//!
//! A minimal, correct recurrent form (and a `chunked` entry point that runs it), written so that
//! the hybrid decoder could be built and tested against transformers; the chunked (64) form and
//! the state-dtype plumbing replace this file.

/// Sizes of one delta-rule call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaRuleShape {
    pub tokens: usize,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
}

/// The dtype the recurrent state is rounded to after every token (engines that keep it in bf16
/// or f16 drift from an fp32 state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateDtype {
    #[default]
    F32,
    Bf16,
    F16,
}

/// The float types the delta rule runs in.
pub trait DeltaFloat:
    Copy
    + Default
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
{
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn sqrt(self) -> Self;
    /// Round to the state dtype (a no-op for the F32 state when `Self` is f32 or wider).
    fn round_state(self, dtype: StateDtype) -> Self;
}

impl DeltaFloat for f32 {
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn exp(self) -> f32 {
        f32::exp(self)
    }
    fn sqrt(self) -> f32 {
        f32::sqrt(self)
    }
    fn round_state(self, dtype: StateDtype) -> f32 {
        match dtype {
            StateDtype::F32 => self,
            StateDtype::Bf16 => half::bf16::from_f32(self).to_f32(),
            StateDtype::F16 => half::f16::from_f32(self).to_f32(),
        }
    }
}

impl DeltaFloat for f64 {
    fn from_f64(v: f64) -> f64 {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn exp(self) -> f64 {
        f64::exp(self)
    }
    fn sqrt(self) -> f64 {
        f64::sqrt(self)
    }
    fn round_state(self, dtype: StateDtype) -> f64 {
        match dtype {
            StateDtype::F32 => self,
            StateDtype::Bf16 => half::bf16::from_f64(self).to_f64(),
            StateDtype::F16 => half::f16::from_f64(self).to_f64(),
        }
    }
}

/// The chunked form (here: the recurrent one, which it must equal).
#[allow(clippy::too_many_arguments)]
pub fn chunked<F: DeltaFloat>(
    shape: DeltaRuleShape,
    q: &[F],
    k: &[F],
    v: &[F],
    g: &[F],
    beta: &[F],
    state: &mut [F],
    state_dtype: StateDtype,
) -> Vec<F> {
    recurrent(shape, q, k, v, g, beta, state, state_dtype)
}

/// Token by token: per value head h (served by key head h / (value_heads / key_heads)),
/// S ← S·exp(g); δ = (v − kᵀS)·β; S ← S + k ⊗ δ; o = qᵀS, with q and k L2-normalised
/// (`x / sqrt(Σx² + 1e-6)`) and q scaled by key_dim^-1/2.
///
/// q, k `[tokens, key_heads, key_dim]`; v `[tokens, value_heads, value_dim]`; g, beta
/// `[tokens, value_heads]`; state `[value_heads, key_dim, value_dim]`, in and out. Returns the
/// output `[tokens, value_heads, value_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn recurrent<F: DeltaFloat>(
    shape: DeltaRuleShape,
    q: &[F],
    k: &[F],
    v: &[F],
    g: &[F],
    beta: &[F],
    state: &mut [F],
    state_dtype: StateDtype,
) -> Vec<F> {
    let DeltaRuleShape {
        tokens,
        key_heads,
        value_heads,
        key_dim: dk,
        value_dim: dv,
    } = shape;
    let group = value_heads / key_heads.max(1);
    let scale = F::from_f64(1.0 / (dk as f64).sqrt());
    let eps = F::from_f64(1e-6);
    let one = F::from_f64(1.0);
    let mut out = vec![F::default(); tokens * value_heads * dv];
    let (mut qn, mut kn) = (vec![F::default(); dk], vec![F::default(); dk]);
    let mut mem = vec![F::default(); dv];
    for t in 0..tokens {
        for h in 0..value_heads {
            let kh = h / group.max(1);
            let at = (t * key_heads + kh) * dk;
            let l2 = |x: &[F], into: &mut [F]| {
                let mut s = F::default();
                for &e in x {
                    s = s + e * e;
                }
                let inv = one / (s + eps).sqrt();
                for (o, &e) in into.iter_mut().zip(x) {
                    *o = e * inv;
                }
            };
            l2(&q[at..at + dk], &mut qn);
            l2(&k[at..at + dk], &mut kn);
            for e in qn.iter_mut() {
                *e = *e * scale;
            }
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
            let decay = g[t * value_heads + h].exp();
            for e in s.iter_mut() {
                *e = *e * decay;
            }
            mem.iter_mut().for_each(|m| *m = F::default());
            for i in 0..dk {
                for j in 0..dv {
                    mem[j] = mem[j] + s[i * dv + j] * kn[i];
                }
            }
            let b = beta[t * value_heads + h];
            let vt = &v[(t * value_heads + h) * dv..(t * value_heads + h + 1) * dv];
            for j in 0..dv {
                mem[j] = (vt[j] - mem[j]) * b;
            }
            for i in 0..dk {
                for j in 0..dv {
                    s[i * dv + j] = (s[i * dv + j] + kn[i] * mem[j]).round_state(state_dtype);
                }
            }
            let o = &mut out[(t * value_heads + h) * dv..(t * value_heads + h + 1) * dv];
            for j in 0..dv {
                let mut acc = F::default();
                for i in 0..dk {
                    acc = acc + s[i * dv + j] * qn[i];
                }
                o[j] = acc;
            }
        }
    }
    out
}
