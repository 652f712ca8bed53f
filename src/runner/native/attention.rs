//! Softmax attention in f32 over the keys each query can see. candle's chain computed every
//! query against every key and masked afterwards: under a causal mask half of those scores, their
//! `exp`s and their products with the values are thrown away (5% of a 512-token window's
//! FLOPs, and the larger share the longer the context). Here each head's queries go in blocks of
//! [`QUERY_BLOCK`] rows against only the keys the block's rows can see, and every value is the
//! bits candle's chain gives:
//!
//! - a score is one dot product over `head_dim`, whatever block it is computed in;
//! - a row's softmax skips only trailing masked keys, which the chain turned into exact zeros;
//!   its sum runs over a prefix rounded up to [`SUM_ALIGN`] keys, so candle's vectorized row sum
//!   adds the same values in the same lanes (the zeros it skips changed nothing);
//! - the weighted sum of values runs over keys in blocks of [`KEY_BLOCK`], each block one chain
//!   of fused multiply-adds in key order (gemm's kernel on a single depth block), the blocks
//!   added in order; the skipped keys' weights are exact zeros. At most `KEY_BLOCK` keys this is
//!   the single chain candle's product computed; beyond it the blocking is this module's own,
//!   fixed (not the cache-size-dependent depth gemm picks), so the bits do not depend on the
//!   machine's caches.
//!
//! A masked key is never read, so a non-finite value there no longer reaches the output: the
//! semantics of engines that skip masked blocks, which is what a causal mask means.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::fused::softmax_row;
use super::matmul::{MatRef, matmul, with_f32};

/// Query rows per task at most: small enough that the skipped triangle is most of the masked
/// half, large enough that each product keeps gemm's kernel busy. A head's rows are split into
/// equal blocks (over 32 rows each when there are several), so that no block is a product small
/// enough for gemm to switch kernels (its dot-product kernels sum in another order).
const QUERY_BLOCK: usize = 64;
/// A row's softmax runs over a multiple of this many keys (or all of them): a multiple of every
/// unroll width of candle's row sum (32 lanes on AVX, 16 on NEON, 1 in its scalar form).
const SUM_ALIGN: usize = 64;
/// Keys per depth block of the weighted sum of values.
const KEY_BLOCK: usize = 512;

/// `softmax(q kᵀ · scale + mask) v` per head: `q` `[n, heads, d]`, `k` and `v` `[t, kv_heads, d]`
/// (query head `h` reads key head `h / (heads / kv_heads)`), `mask` `[n, t]` additive; the output
/// is `[n, heads · d]`. With `f16_weights` the softmax weights are rounded to f16 before their
/// product with the values (an engine's f16 product with an f16 cache). `None` where the inputs
/// are not f32 or not of these shapes: the caller runs candle's chain.
pub(super) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f64,
    f16_weights: bool,
) -> candle_core::Result<Option<Tensor>> {
    if [q, k, v, mask].iter().any(|t| t.dtype() != DType::F32) {
        return Ok(None);
    }
    let (Ok((n, heads, d)), Ok((t, kv_heads, dk)), Ok(vdims), Ok(mdims)) =
        (q.dims3(), k.dims3(), v.dims3(), mask.dims2())
    else {
        return Ok(None);
    };
    if dk != d
        || vdims != (t, kv_heads, d)
        || mdims != (n, t)
        || kv_heads == 0
        || heads % kv_heads != 0
        || n == 0
        || t == 0
        || d == 0
    {
        return Ok(None);
    }
    // `[t, kv_heads, d]` in row-major order is the rows `[t, kv_heads · d]`.
    with_f32(k, |k| {
        with_f32(v, |v| {
            attend_rows(q, k, v, None, kv_heads, mask, scale, f16_weights)
        })
    })
}

/// The first `positions` keys of a KV cache again, eight positions to a SIMD register:
/// `values[((p / 8) · kv_heads + h) · d · 8 + i · 8 + p % 8]` is key head `h`'s value `i` at
/// position `p` (zero past the last position). A single query's scores then read eight keys'
/// values of one depth with one load, with no transpose: the chains and bits of the
/// row-major product.
pub(super) struct GroupedKeys<'a> {
    pub(super) values: &'a [f32],
    pub(super) positions: usize,
}

impl GroupedKeys<'_> {
    /// Positions per group: one AVX2 register's lanes.
    const LANES: usize = 8;

    /// `grouped` (holding positions `0..from`) extended to every row of `k` (`[t, kv_heads ·
    /// d]`).
    pub(super) fn extend(
        grouped: &mut Vec<f32>,
        k: &[f32],
        from: usize,
        kv_heads: usize,
        d: usize,
    ) {
        let width = kv_heads * d;
        let t = k.len() / width;
        let group = width * Self::LANES;
        grouped.resize(t.div_ceil(Self::LANES) * group, 0.0);
        for p in from..t {
            let (base, lane) = ((p / Self::LANES) * group, p % Self::LANES);
            for (j, &x) in k[p * width..(p + 1) * width].iter().enumerate() {
                let (h, i) = (j / d, j % d);
                grouped[base + h * d * Self::LANES + i * Self::LANES + lane] = x;
            }
        }
    }
}

/// [`attend`] on keys and values held as f32 rows `[t, kv_heads · d]` (a KV cache appended in
/// place), `d` taken from `q`, with the keys also grouped where the cache holds them so;
/// `None` where the shapes do not fit.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_rows(
    q: &Tensor,
    k: &[f32],
    v: &[f32],
    grouped: Option<GroupedKeys<'_>>,
    kv_heads: usize,
    mask: &Tensor,
    scale: f64,
    f16_weights: bool,
) -> candle_core::Result<Option<Tensor>> {
    if q.dtype() != DType::F32 || mask.dtype() != DType::F32 {
        return Ok(None);
    }
    let (Ok((n, heads, d)), Ok(mdims)) = (q.dims3(), mask.dims2()) else {
        return Ok(None);
    };
    let width = kv_heads * d;
    if width == 0 || k.len() != v.len() || !k.len().is_multiple_of(width) {
        return Ok(None);
    }
    let t = k.len() / width;
    if mdims != (n, t) || heads % kv_heads != 0 || n == 0 || t == 0 {
        return Ok(None);
    }
    let shape = Shape {
        n,
        t,
        heads,
        kv_heads,
        d,
        scale: scale as f32,
        f16_weights,
    };
    with_f32(q, |q| {
        with_f32(mask, |mask| {
            let grouped =
                grouped.filter(|g| g.positions == t && g.values.len() == t.div_ceil(8) * 8 * width);
            let out = attend_slices(&shape, q, k, v, grouped.as_ref(), mask);
            Tensor::from_vec(out, (n, heads * d), &Device::Cpu).map(Some)
        })
    })
}

/// The additive causal mask `[n, past + n]` (f32) of `n` queries after `past` cached keys: key
/// `j` is visible to query `i` (at position `past + i`) when `j ≤ past + i` and within `window`
/// positions of it.
pub(super) fn causal_mask(past: usize, n: usize, window: usize) -> candle_core::Result<Tensor> {
    let m: Vec<f32> = (past..past + n)
        .flat_map(|i| {
            (0..past + n).map(move |j| {
                if j > i || i - j >= window {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_vec(m, (n, past + n), &Device::Cpu)
}

/// The problem's sizes: `n` queries, `t` keys, `heads` query heads over `kv_heads` key heads of
/// `d` values each.
struct Shape {
    n: usize,
    t: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    scale: f32,
    f16_weights: bool,
}

/// [`attend`] on the tensors' values (shapes checked by the caller).
fn attend_slices(
    s: &Shape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    grouped: Option<&GroupedKeys<'_>>,
    mask: &[f32],
) -> Vec<f32> {
    let visible = visible_keys(mask, s.n, s.t);
    let o = Operands {
        visible: &visible,
        q,
        k,
        v,
        grouped,
        mask,
    };
    if let Some(out) = one_query(s, &o) {
        return out;
    }
    attend_blocks(s, &o)
}

/// The inputs every head's task reads: per query row the keys it sees, the queries, keys and
/// values as rows, the grouped keys where the cache holds them, the mask.
struct Operands<'a> {
    visible: &'a [usize],
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    grouped: Option<&'a GroupedKeys<'a>>,
    mask: &'a [f32],
}

/// [`attend_slices`] in blocks of query rows per head, each block's weights and weighted sum in
/// one task.
fn attend_blocks(s: &Shape, o: &Operands<'_>) -> Vec<f32> {
    let blocks = s.n.div_ceil(QUERY_BLOCK);
    let size = s.n.div_ceil(blocks);
    let tasks: Vec<(usize, usize)> = (0..s.heads)
        .flat_map(|h| (0..blocks).map(move |b| (h, b)))
        .collect();
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map_init(Vec::new, |scores, &(h, b)| {
            let rows = b * size..s.n.min((b + 1) * size);
            block_output(s, h, rows, o, scores)
        })
        .collect();
    let width = s.heads * s.d;
    let mut out = vec![0f32; s.n * width];
    for (&(h, b), part) in tasks.iter().zip(&parts) {
        let r0 = b * size;
        for (i, row) in part.chunks_exact(s.d).enumerate() {
            let at = (r0 + i) * width + h * s.d;
            out[at..at + s.d].copy_from_slice(row);
        }
    }
    out
}

/// Per query row of `mask` `[n, t]`: how many leading keys it can see (one past its last entry
/// above `-inf`; 0 when every key is masked).
fn visible_keys(mask: &[f32], n: usize, t: usize) -> Vec<usize> {
    mask.chunks_exact(t)
        .take(n)
        .map(|row| {
            row.iter()
                .rposition(|&m| m != f32::NEG_INFINITY)
                .map_or(0, |j| j + 1)
        })
        .collect()
}

/// Keys a block whose rows see at most `needed` keys computes, of `t`: `needed` rounded up to
/// [`SUM_ALIGN`] while that stays inside the rows' aligned part, else all `t` (a row with no
/// visible key gets all of them too, so its softmax is the chain's NaN).
fn computed_keys(needed: usize, t: usize) -> usize {
    let rounded = needed.div_ceil(SUM_ALIGN) * SUM_ALIGN;
    if needed > 0 && rounded <= t / SUM_ALIGN * SUM_ALIGN {
        rounded
    } else {
        t
    }
}

/// Head `h`'s output at query rows `block`: `[rows, d]`, row-major.
fn block_output(
    s: &Shape,
    h: usize,
    block: std::ops::Range<usize>,
    o: &Operands<'_>,
    scores: &mut Vec<f32>,
) -> Vec<f32> {
    let rows = block.len();
    let keys = block_weights(s, h, block, o, scores);
    let g = h / (s.heads / s.kv_heads);
    let kv_stride = s.kv_heads * s.d;
    // out[rows, d] = Σ over key blocks of scores[.., block] · v_g[block].
    let mut out = vec![0f32; rows * s.d];
    for (i, start) in (0..keys).step_by(KEY_BLOCK).enumerate() {
        let len = KEY_BLOCK.min(keys - start);
        matmul(
            &mut out,
            s.d,
            (i > 0).then_some(1.0),
            MatRef {
                data: &scores[start..],
                rows,
                cols: len,
                rs: keys,
                cs: 1,
            },
            MatRef {
                data: &o.v[start * kv_stride + g * s.d..],
                rows: len,
                cols: s.d,
                rs: kv_stride,
                cs: 1,
            },
        );
    }
    out
}

/// Head `h`'s softmax weights at query rows `block` into `scores` (`[rows, keys]`, row-major,
/// rounded to f16 when the shape says so); returns `keys`, the keys computed.
fn block_weights(
    s: &Shape,
    h: usize,
    block: std::ops::Range<usize>,
    o: &Operands<'_>,
    scores: &mut Vec<f32>,
) -> usize {
    let Operands {
        visible,
        q,
        k,
        grouped,
        mask,
        ..
    } = *o;
    let (d, t) = (s.d, s.t);
    let (r0, rows) = (block.start, block.len());
    let seen = &visible[block];
    let needed = seen.iter().copied().max().unwrap_or(0);
    let keys = if seen.contains(&0) {
        t
    } else {
        computed_keys(needed, t)
    };
    let g = h / (s.heads / s.kv_heads);
    let kv_stride = s.kv_heads * d;
    // scores[rows, keys] = q_h[r0..] · k_g[..keys]ᵀ.
    scores.clear();
    scores.resize(rows * keys, 0.0);
    let q_h = &q[r0 * s.heads * d + h * d..];
    if let Some(gk) = grouped.filter(|gk| rows == 1 && keys <= gk.positions) {
        // One query: its chains along the grouped keys (the same bits, no transpose).
        let stride = s.kv_heads * d * GroupedKeys::LANES;
        super::row_product::strided_groups_times(
            scores,
            &q_h[..d],
            &gk.values[g * d * GroupedKeys::LANES..],
            stride,
        );
    } else {
        matmul(
            scores,
            keys,
            None,
            MatRef {
                data: q_h,
                rows,
                cols: d,
                rs: s.heads * d,
                cs: 1,
            },
            MatRef {
                data: &k[g * d..],
                rows: keys,
                cols: d,
                rs: kv_stride,
                cs: 1,
            }
            .transposed(),
        );
    }
    for (i, row) in scores.chunks_exact_mut(keys).enumerate() {
        let at = (r0 + i) * t;
        softmax_row(row, &mask[at..at + keys], s.scale);
        if s.f16_weights {
            row.iter_mut()
                .for_each(|p| *p = half::f16::from_f32(*p).to_f32());
        }
    }
    keys
}

/// A single query (a decode step): each head's weights as [`block_weights`] gives them, then
/// the weighted sums of the values with every query head of a key head read together
/// ([`super::row_product::shared_weighted_sums`]): each value is loaded once for all of them
/// instead of once per query head. The bits of [`block_output`]: the same chains, key blocks
/// and additions. `None` where the CPU has no such kernel.
fn one_query(s: &Shape, o: &Operands<'_>) -> Option<Vec<f32>> {
    if s.n != 1 || !super::row_product::shared_weighted_sums_available() {
        return None;
    }
    let weights: Vec<(usize, Vec<f32>)> = (0..s.heads)
        .into_par_iter()
        .map(|h| {
            let mut scores = Vec::new();
            let keys = block_weights(s, h, 0..1, o, &mut scores);
            (keys, scores)
        })
        .collect();
    let rep = s.heads / s.kv_heads;
    let columns = super::row_product::SHARED_COLUMNS;
    // Tasks: a key head's columns, `columns` at a time (the last part shorter).
    let tasks: Vec<(usize, usize)> = (0..s.kv_heads)
        .flat_map(|g| (0..s.d).step_by(columns).map(move |c| (g, c)))
        .collect();
    let kv_stride = s.kv_heads * s.d;
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(g, c)| {
            let width = columns.min(s.d - c);
            let heads = &weights[g * rep..(g + 1) * rep];
            let mut out = vec![0f32; rep * width];
            let keys = heads[0].0;
            debug_assert!(heads.iter().all(|(n, _)| *n == keys));
            // Each key block's chains added onto the blocks' before, as `block_output`'s are.
            for (i, start) in (0..keys).step_by(KEY_BLOCK).enumerate() {
                let len = KEY_BLOCK.min(keys - start);
                let rows: Vec<&[f32]> = heads.iter().map(|(_, w)| &w[start..start + len]).collect();
                super::row_product::shared_weighted_sums(
                    &mut out,
                    (i > 0).then_some(1.0),
                    &rows,
                    &o.v[start * kv_stride + g * s.d + c..],
                    kv_stride,
                    width,
                );
            }
            out
        })
        .collect();
    let mut out = vec![0f32; s.heads * s.d];
    for (&(g, c), part) in tasks.iter().zip(&parts) {
        let width = columns.min(s.d - c);
        for (r, row) in part.chunks_exact(width).enumerate() {
            let at = (g * rep + r) * s.d + c;
            out[at..at + width].copy_from_slice(row);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::native::fused::softmax_scaled_masked;
    use crate::runner::native::fused::tests::tensor;
    use crate::runner::native::matmul::tests::{oracle_matmul, same_bits};

    fn mask(n: usize, past: usize, window: usize) -> Tensor {
        causal_mask(past, n, window).unwrap()
    }

    /// candle's chain, as the decoder ran it before this module, its products in the fixed order
    /// every product of the native runner takes (candle's where gemm runs its many-row kernel).
    fn chain(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f64) -> Vec<f32> {
        let (n, heads, d) = q.dims3().unwrap();
        let rep = heads / k.dim(1).unwrap();
        let repeat = |x: &Tensor| {
            let x = x.transpose(0, 1).unwrap();
            let (kv, t, d) = x.dims3().unwrap();
            x.unsqueeze(1)
                .unwrap()
                .expand((kv, rep, t, d))
                .unwrap()
                .reshape((kv * rep, t, d))
                .unwrap()
        };
        let q = q.transpose(0, 1).unwrap().contiguous().unwrap();
        let (k, v) = (repeat(k), repeat(v));
        let att = softmax_scaled_masked(&oracle_matmul(&q, &k.t().unwrap()), scale, mask).unwrap();
        oracle_matmul(&att, &v)
            .transpose(0, 1)
            .unwrap()
            .reshape((n, heads * d))
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// llama.cpp without flash attention multiplies the f16 values by the softmax weights
    /// rounded to f16: the blocked path gives the chain's product of the rounded weights.
    #[test]
    fn f16_weights_are_the_rounded_softmax_times_the_values() {
        let (n, heads, kv, d) = (40, 4, 2, 16);
        let q = tensor(&[n, heads, d], 1, 4.0);
        let k = tensor(&[n, kv, d], 2, 4.0);
        let v = tensor(&[n, kv, d], 3, 2.0);
        let m = mask(n, 0, usize::MAX);
        let scale = 0.25;
        let flat = |t: Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
        let rounded = flat(attend(&q, &k, &v, &m, scale, true).unwrap().unwrap());
        let plain = flat(attend(&q, &k, &v, &m, scale, false).unwrap().unwrap());
        assert_ne!(rounded, plain, "the rounding changed nothing");
        // The chain with its weights rounded to f16 by hand.
        let rep = heads / kv;
        let repeat = |x: &Tensor| {
            let x = x.transpose(0, 1).unwrap();
            x.unsqueeze(1)
                .unwrap()
                .expand((kv, rep, n, d))
                .unwrap()
                .reshape((heads, n, d))
                .unwrap()
        };
        let qt = q.transpose(0, 1).unwrap().contiguous().unwrap();
        let att = softmax_scaled_masked(&qt.matmul(&repeat(&k).t().unwrap()).unwrap(), scale, &m)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let want = flat(
            att.matmul(&repeat(&v))
                .unwrap()
                .transpose(0, 1)
                .unwrap()
                .reshape((n, heads * d))
                .unwrap(),
        );
        for (i, (a, b)) in rounded.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{i}: {a} vs {b}");
        }
    }

    fn run(n: usize, past: usize, heads: usize, kv: usize, d: usize, window: usize) -> Vec<f32> {
        let t = past + n;
        let q = tensor(&[n, heads, d], 1, 4.0);
        let k = tensor(&[t, kv, d], 2, 4.0);
        let v = tensor(&[t, kv, d], 3, 2.0);
        let m = mask(n, past, window);
        let scale = 1.0 / (d as f64).sqrt();
        let got = attend(&q, &k, &v, &m, scale, false).unwrap().unwrap();
        assert_eq!(got.dims(), &[n, heads * d]);
        got.flatten_all().unwrap().to_vec1().unwrap()
    }

    fn expected(
        n: usize,
        past: usize,
        heads: usize,
        kv: usize,
        d: usize,
        window: usize,
    ) -> Vec<f32> {
        let t = past + n;
        let q = tensor(&[n, heads, d], 1, 4.0);
        let k = tensor(&[t, kv, d], 2, 4.0);
        let v = tensor(&[t, kv, d], 3, 2.0);
        chain(&q, &k, &v, &mask(n, past, window), 1.0 / (d as f64).sqrt())
    }

    /// A single query against grouped keys (grown one position at a time, as decode steps grow
    /// them, or all at once) gives the bits of the row-major keys, for key counts with and
    /// without a partial group, several query heads per key head, and the chain's.
    #[test]
    fn a_single_query_against_grouped_keys_is_the_rows_bits() {
        for (t, heads, kv, d) in [
            (1, 2, 1, 8),
            (37, 9, 3, 64),
            (70, 4, 2, 16),
            (600, 2, 2, 64),
        ] {
            let q = tensor(&[1, heads, d], 1, 4.0);
            let k = tensor(&[t, kv, d], 2, 4.0);
            let v = tensor(&[t, kv, d], 3, 2.0);
            let m = mask(1, t - 1, usize::MAX);
            let scale = 1.0 / (d as f64).sqrt();
            let flat = |x: &Tensor| -> Vec<f32> { x.flatten_all().unwrap().to_vec1().unwrap() };
            let (kr, vr) = (flat(&k), flat(&v));
            let rows = attend_rows(&q, &kr, &vr, None, kv, &m, scale, false)
                .unwrap()
                .unwrap();
            let mut grown = Vec::new();
            for p in 0..t {
                GroupedKeys::extend(&mut grown, &kr[..(p + 1) * kv * d], p, kv, d);
            }
            let mut whole = Vec::new();
            GroupedKeys::extend(&mut whole, &kr, 0, kv, d);
            assert_eq!(grown, whole);
            let grouped = GroupedKeys {
                values: &grown,
                positions: t,
            };
            let fast = attend_rows(&q, &kr, &vr, Some(grouped), kv, &m, scale, false)
                .unwrap()
                .unwrap();
            assert!(
                same_bits(&flat(&rows), &flat(&fast)),
                "t {t}, heads {heads}, kv {kv}"
            );
            // The grouped keys are what was read: a changed one changes the output.
            let mut changed = grown.clone();
            changed[0] = f32::NAN;
            let read = GroupedKeys {
                values: &changed,
                positions: t,
            };
            let other = attend_rows(&q, &kr, &vr, Some(read), kv, &m, scale, false)
                .unwrap()
                .unwrap();
            assert!(
                !same_bits(&flat(&other), &flat(&fast)),
                "t {t}: grouped keys unread"
            );
            // Up to KEY_BLOCK keys the blocked sum is the chain itself.
            assert!(
                t > KEY_BLOCK || same_bits(&flat(&fast), &chain(&q, &k, &v, &m, scale)),
                "t {t}: the chain"
            );
        }
    }

    /// A decode step's query heads read their key head's values together
    /// ([`one_query`]): the bits of the per-head blocks, for head counts per key head of one to
    /// five (batches of three and a rest), widths that are and are not multiples of the shared
    /// columns and of a register, key blocks past [`KEY_BLOCK`], f16 weights, with and without
    /// grouped keys.
    #[test]
    fn a_decode_steps_shared_values_are_the_per_head_blocks_bits() {
        if !crate::runner::native::row_product::shared_weighted_sums_available() {
            return;
        }
        for (t, heads, kv, d, f16_weights) in [
            (1, 1, 1, 8, false),
            (37, 9, 3, 64, false),
            (70, 8, 2, 80, true),
            (600, 5, 1, 12, false),
            (1100, 6, 2, 128, true),
        ] {
            let q = tensor(&[1, heads, d], 1, 4.0);
            let k = tensor(&[t, kv, d], 2, 4.0);
            let v = tensor(&[t, kv, d], 3, 2.0);
            let m = mask(1, t - 1, usize::MAX);
            let flat = |x: &Tensor| -> Vec<f32> { x.flatten_all().unwrap().to_vec1().unwrap() };
            let (q, kr, vr, m) = (flat(&q), flat(&k), flat(&v), flat(&m));
            let shape = Shape {
                n: 1,
                t,
                heads,
                kv_heads: kv,
                d,
                scale: 1.0 / (d as f32).sqrt(),
                f16_weights,
            };
            let visible = visible_keys(&m, 1, t);
            let mut grown = Vec::new();
            GroupedKeys::extend(&mut grown, &kr, 0, kv, d);
            for grouped in [
                None,
                Some(GroupedKeys {
                    values: &grown,
                    positions: t,
                }),
            ] {
                let o = Operands {
                    visible: &visible,
                    q: &q,
                    k: &kr,
                    v: &vr,
                    grouped: grouped.as_ref(),
                    mask: &m,
                };
                let blocks = attend_blocks(&shape, &o);
                let shared = one_query(&shape, &o).expect("the shared path runs here");
                assert!(
                    same_bits(&blocks, &shared),
                    "t {t}, heads {heads}/{kv}, d {d}, f16 {f16_weights}"
                );
                // The values are what is read: a changed one changes the output.
                let mut changed = vr.clone();
                changed[(t - 1) * kv * d + d - 1] = f32::NAN;
                let other = one_query(&shape, &Operands { v: &changed, ..o }).unwrap();
                assert!(!same_bits(&other, &shared), "t {t}, d {d}: values unread");
            }
        }
    }

    #[test]
    fn visible_keys_attention_is_the_chains_bits() {
        // (n, past, heads, kv heads, d, sliding window): one token, blocks with a ragged last
        // one, prefixes shorter and longer than the sum's alignment, a cache before the queries,
        // grouped queries, a sliding window (leading masked keys stay computed).
        for (n, past, heads, kv, d, window) in [
            (1, 0, 1, 1, 8, usize::MAX),
            (7, 0, 2, 1, 16, usize::MAX),
            (64, 0, 4, 2, 32, usize::MAX),
            (200, 0, 4, 4, 64, usize::MAX),
            (129, 70, 2, 1, 128, usize::MAX),
            (512, 0, 2, 1, 128, usize::MAX),
            (300, 0, 2, 2, 32, 100),
        ] {
            assert!(
                same_bits(
                    &run(n, past, heads, kv, d, window),
                    &expected(n, past, heads, kv, d, window)
                ),
                "n {n}, past {past}, heads {heads}/{kv}, d {d}, window {window}"
            );
        }
    }

    #[test]
    fn long_contexts_match_the_chain_closely_and_do_not_depend_on_threads() {
        // Beyond one key block the depth blocking is this module's own: the values agree with
        // the chain to rounding, and the bits are the same on one thread and on several.
        let (n, heads, kv, d) = (700, 2, 1, 64);
        let got = run(n, 0, heads, kv, d, usize::MAX);
        let want = expected(n, 0, heads, kv, d, usize::MAX);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1e-2), "{a} vs {b}");
        }
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| run(n, 0, heads, kv, d, usize::MAX));
        assert!(same_bits(&got, &one));
    }

    #[test]
    fn blocks_compute_only_the_keys_their_rows_see() {
        // Rounded up to the row sum's alignment while that stays inside the aligned keys.
        assert_eq!(computed_keys(1, 512), 64);
        assert_eq!(computed_keys(64, 512), 64);
        assert_eq!(computed_keys(65, 512), 128);
        assert_eq!(computed_keys(448, 512), 448);
        assert_eq!(computed_keys(449, 512), 512);
        // Past the aligned part, and with no visible key, all of them.
        assert_eq!(computed_keys(449, 500), 500);
        assert_eq!(computed_keys(30, 40), 40);
        assert_eq!(computed_keys(0, 512), 512);
        // A causal mask of 512 queries: the rows' blocks see 64, 128, … keys, not 512 each.
        let m = mask(512, 0, usize::MAX)
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let visible = visible_keys(&m, 512, 512);
        assert_eq!((visible[0], visible[63], visible[511]), (1, 64, 512));
        let computed: usize = (0..8)
            .map(|b| {
                computed_keys(
                    visible[b * 64..(b + 1) * 64].iter().copied().max().unwrap(),
                    512,
                )
            })
            .sum();
        assert_eq!(computed, 64 * 36);
    }

    #[test]
    fn a_row_with_no_visible_key_is_the_chains_nan() {
        let q = tensor(&[3, 1, 8], 1, 1.0);
        let k = tensor(&[3, 1, 8], 2, 1.0);
        let v = tensor(&[3, 1, 8], 3, 1.0);
        let mut m = mask(3, 0, usize::MAX).to_vec2::<f32>().unwrap();
        m[1] = vec![f32::NEG_INFINITY; 3];
        let m = Tensor::new(m, &Device::Cpu).unwrap();
        let got: Vec<f32> = attend(&q, &k, &v, &m, 0.5, false)
            .unwrap()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let want = chain(&q, &k, &v, &m, 0.5);
        assert!(got[8..16].iter().all(|x| x.is_nan()));
        assert!(same_bits(&got[..8], &want[..8]) && same_bits(&got[16..], &want[16..]));
    }

    #[test]
    fn other_dtypes_and_shapes_take_the_chain() {
        let q = tensor(&[4, 2, 8], 1, 1.0);
        let k = tensor(&[4, 1, 8], 2, 1.0);
        let m = mask(4, 0, usize::MAX);
        let q64 = q.to_dtype(DType::F64).unwrap();
        assert!(attend(&q64, &k, &k, &m, 1.0, false).unwrap().is_none());
        let k3 = tensor(&[4, 3, 8], 2, 1.0);
        assert!(attend(&q, &k3, &k3, &m, 1.0, false).unwrap().is_none());
        assert!(
            attend(&q, &k, &k, &mask(3, 0, usize::MAX), 1.0, false)
                .unwrap()
                .is_none()
        );
    }
}
