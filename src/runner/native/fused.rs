//! Element-wise steps of the f32 forward pass fused into one pass over each row, spread over
//! rayon's pool by rows: RMSNorm, the attention softmax with its scale and mask, and SwiGLU's
//! `silu(g)·u`. candle ran each as a chain of whole-tensor operations (the softmax alone was
//! seven passes over heads × n × t values, each into fresh memory). Every value is computed with
//! the very operations candle's chain applies, in its order (its row sum included: candle's own
//! vectorized `vec_reduce_sum`), so the bits do not move; the unit tests hold each kernel to the
//! chain it replaces. Other dtypes, and non-contiguous inputs, take the chain.

use candle_core::cpu::kernels::VecOps;
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

/// Rows per rayon task: enough work per task that scheduling is noise.
const MIN_ROWS_PER_TASK: usize = 8;

/// candle's row sum (its reduction over a contiguous last dimension).
#[allow(unsafe_code)]
fn row_sum(row: &[f32]) -> f32 {
    let mut s = 0f32;
    if row.is_empty() {
        return s;
    }
    // SAFETY: reads `row.len()` values from a live slice and writes one f32 to a local.
    unsafe { <f32 as VecOps>::vec_reduce_sum(row.as_ptr(), &mut s, row.len()) };
    s
}

/// A contiguous f32 tensor's values (a copy only where candle holds it strided).
fn values(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

fn all_f32(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| t.dtype() == DType::F32)
}

/// `x / sqrt(mean(x²) + eps) · w` over the last dimension (candle's chain: `sqr`, `mean_keepdim`,
/// `+ eps`, `sqrt`, `recip`, `broadcast_mul` by the row's factor, then by `w`).
pub(super) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    if !all_f32(&[x, w]) || x.rank() == 0 {
        return rms_norm_chain(x, w, eps);
    }
    let d = x.dim(x.rank() - 1)?;
    if w.dims() != [d] || d == 0 {
        return rms_norm_chain(x, w, eps);
    }
    let w = values(w)?;
    let mut y = values(x)?;
    let inv_d = (1f64 / d as f64) as f32;
    let eps = eps as f32;
    y.par_chunks_mut(d)
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each_init(
            || vec![0f32; d],
            |sq, row| {
                for (s, &v) in sq.iter_mut().zip(row.iter()) {
                    *s = v * v;
                }
                let ms = row_sum(sq) * inv_d + 0.0;
                let r = (ms * 1.0 + eps).sqrt().recip();
                for (v, &wi) in row.iter_mut().zip(&w) {
                    *v = (*v * r) * wi;
                }
            },
        );
    Tensor::from_vec(y, x.shape(), &Device::Cpu)
}

fn rms_norm_chain(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let Some(last) = x.rank().checked_sub(1) else {
        return Err(candle_core::Error::Msg("RMSNorm of a scalar".into()));
    };
    let ms = x.sqr()?.mean_keepdim(last)?;
    let r = (ms + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&r)?.broadcast_mul(w)
}

/// `softmax(scores · scale + mask)` over the last dimension, `scores` `[.., n, t]`, `mask`
/// `[n, t]` (candle's chain: the affine scale, `broadcast_add`, `max_keepdim`, `broadcast_sub`,
/// `exp`, `sum_keepdim`, `broadcast_div`).
pub(super) fn softmax_scaled_masked(
    scores: &Tensor,
    scale: f64,
    mask: &Tensor,
) -> candle_core::Result<Tensor> {
    let rank = scores.rank();
    let fused = all_f32(&[scores, mask])
        && rank >= 2
        && mask.dims() == &scores.dims()[rank - 2..]
        && scores.dim(rank - 1)? > 0;
    if !fused {
        return softmax_chain(&(scores * scale)?.broadcast_add(mask)?);
    }
    let (n, t) = (scores.dim(rank - 2)?, scores.dim(rank - 1)?);
    let mask = values(mask)?;
    let mut y = values(scores)?;
    let scale = scale as f32;
    y.par_chunks_mut(t)
        .with_min_len(MIN_ROWS_PER_TASK)
        .enumerate()
        .for_each(|(i, row)| softmax_row(row, &mask[(i % n) * t..(i % n + 1) * t], scale));
    Tensor::from_vec(y, scores.shape(), &Device::Cpu)
}

/// One row of [`softmax_scaled_masked`] in place: `row` ← softmax(`row` · `scale` + `mask`), the
/// two of equal length.
pub(super) fn softmax_row(row: &mut [f32], mask: &[f32], scale: f32) {
    for (v, &mi) in row.iter_mut().zip(mask) {
        *v = (*v * scale + 0.0) + mi;
    }
    let max = row_max(row);
    for v in row.iter_mut() {
        *v = (*v - max).exp();
    }
    let sum = row_sum(row);
    for v in row.iter_mut() {
        *v /= sum;
    }
}

/// The largest value of `row` that is not NaN (`-inf` when there is none), in eight lanes (so
/// the compiler keeps it in SIMD registers). The same value in any order: `f32::max` returns the
/// other operand of a NaN, and of two zeros either, whose difference from a value is the same
/// after `exp`.
fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(v);
        }
    }
    let tail = chunks.remainder().iter();
    lanes
        .into_iter()
        .chain(tail.copied())
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Softmax over the last dimension, as candle's operations compute it.
pub(super) fn softmax_chain(x: &Tensor) -> candle_core::Result<Tensor> {
    let Some(last) = x.rank().checked_sub(1) else {
        return Err(candle_core::Error::Msg("softmax of a scalar".into()));
    };
    let max = x.max_keepdim(last)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(last)?;
    e.broadcast_div(&s)
}

/// `silu(g) · u` elementwise (candle's `silu`, `v / (1 + exp(−v))`, then `mul`).
pub(super) fn silu_mul(g: &Tensor, u: &Tensor) -> candle_core::Result<Tensor> {
    if !all_f32(&[g, u]) || g.dims() != u.dims() {
        return g.silu()? * u;
    }
    let u_values = values(u)?;
    let mut y = values(g)?;
    let width = *g.dims().last().unwrap_or(&1);
    y.par_chunks_mut(width.max(1))
        .zip(u_values.par_chunks(width.max(1)))
        .with_min_len(MIN_ROWS_PER_TASK)
        .for_each(|(row, u)| {
            for (v, &ui) in row.iter_mut().zip(u) {
                *v = (*v / (1.0 + (-*v).exp())) * ui;
            }
        });
    Tensor::from_vec(y, g.shape(), &Device::Cpu)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A deterministic tensor of values spread over `[-spread/2, spread/2)`.
    pub(in crate::runner::native) fn tensor(dims: &[usize], seed: u32, spread: f32) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (x as f32 / (1u32 << 24) as f32 - 0.5) * spread
            })
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    }

    fn same_bits(a: &Tensor, b: &Tensor) -> bool {
        let (a, b) = (values(a).unwrap(), values(b).unwrap());
        a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// The eight-lane maximum is the one-at-a-time fold's value, NaNs, infinities and signed
    /// zeros included, at lengths with and without a tail.
    #[test]
    fn row_max_is_the_folds_value() {
        let specials = [
            f32::NAN,
            f32::NEG_INFINITY,
            f32::INFINITY,
            -0.0,
            0.0,
            -1.5,
            3.25,
        ];
        for len in [0usize, 1, 7, 8, 9, 64, 67] {
            for seed in 0..40u32 {
                let row: Vec<f32> = (0..len)
                    .map(|i| {
                        let x = (i as u32 * 31 + seed * 7).wrapping_mul(2_654_435_761) >> 8;
                        if x.is_multiple_of(3) {
                            specials[(x as usize / 3) % specials.len()]
                        } else {
                            (x as f32 / (1u32 << 24) as f32 - 0.5) * 8.0
                        }
                    })
                    .collect();
                let fold = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let got = row_max(&row);
                // Equal values (either zero where the fold's is a zero).
                assert!(
                    got == fold || (got.is_nan() && fold.is_nan()),
                    "len {len}, seed {seed}: {got} vs {fold}"
                );
            }
        }
    }

    #[test]
    fn rms_norm_is_the_chains_bits() {
        for dims in [[3usize, 7], [33, 128], [64, 1024], [5, 1000]] {
            let x = tensor(&dims, 1, 6.0);
            let w = tensor(&[dims[1]], 2, 2.0);
            let fused = rms_norm(&x, &w, 1e-6).unwrap();
            assert!(
                same_bits(&fused, &rms_norm_chain(&x, &w, 1e-6).unwrap()),
                "{dims:?}"
            );
        }
        // Heads: [n, heads, d] normed per head.
        let x = tensor(&[9, 4, 128], 3, 3.0);
        let w = tensor(&[128], 4, 1.0);
        assert!(same_bits(
            &rms_norm(&x, &w, 1e-6).unwrap(),
            &rms_norm_chain(&x, &w, 1e-6).unwrap()
        ));
    }

    #[test]
    fn masked_softmax_is_the_chains_bits() {
        for (h, n, t) in [(1, 1, 1), (3, 5, 9), (16, 40, 40), (4, 17, 300)] {
            let s = tensor(&[h, n, t], 5, 40.0);
            // A causal mask after t - n cached positions.
            let past = t - n;
            let m: Vec<f32> = (0..n)
                .flat_map(|i| {
                    (0..t).map(move |j| if j > past + i { f32::NEG_INFINITY } else { 0.0 })
                })
                .collect();
            let mask = Tensor::from_vec(m, (n, t), &Device::Cpu).unwrap();
            let scale = 1.0 / (128f64).sqrt();
            let fused = softmax_scaled_masked(&s, scale, &mask).unwrap();
            let chain =
                softmax_chain(&(&s * scale).unwrap().broadcast_add(&mask).unwrap()).unwrap();
            assert!(same_bits(&fused, &chain), "[{h}, {n}, {t}]");
        }
    }

    #[test]
    fn silu_mul_is_the_chains_bits() {
        let g = tensor(&[37, 300], 6, 20.0);
        let u = tensor(&[37, 300], 7, 4.0);
        let chain = (g.silu().unwrap() * &u).unwrap();
        assert!(same_bits(&silu_mul(&g, &u).unwrap(), &chain));
    }
}
