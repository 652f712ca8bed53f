//! The f32 forward pass's products against weights held as plain slices: an F32 checkpoint's
//! tensors read in place from its map (never copied: no fresh pages to fault in and zero, which
//! cost a fifth of a run's time on a VM), other formats dequantized once, and the LM head's
//! logits written straight into the rows the scorer reads. The product is the very `gemm` call
//! candle makes for `x.matmul(&w.t())` (same kernels, strides and parallelism), so the bits are
//! the ones candle's path gave; the unit tests hold them to it.

use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Tensor};

use super::delta_rule::DeltaFloat;
use super::packed::{GroupedValues, PackedRows};
use crate::checkpoint::mmap::MappedF32;

/// A tensor's f32 values: owned (dequantized or converted), or in place in the mapped file.
#[derive(Debug, Clone)]
pub enum Values {
    Owned(Vec<f32>),
    Mapped(MappedF32),
}

impl Deref for Values {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            Values::Owned(v) => v,
            Values::Mapped(m) => m.as_slice(),
        }
    }
}

impl From<Vec<f32>> for Values {
    fn from(v: Vec<f32>) -> Values {
        Values::Owned(v)
    }
}

impl Values {
    /// The values as an owned vector (a copy only when they are mapped).
    pub fn into_vec(self) -> Vec<f32> {
        match self {
            Values::Owned(v) => v,
            Values::Mapped(m) => m.as_slice().to_vec(),
        }
    }
}

/// A row-major f32 matrix `[rows, cols]`: a linear layer's `[out, in]` weight, or the embedding
/// `[vocab, hidden]` (which a tied LM head shares).
#[derive(Debug)]
pub(super) struct F32Matrix {
    pub(super) rows: usize,
    pub(super) cols: usize,
    values: Values,
    /// The same values as the file's blocks, which a one-row product reads instead (a fraction
    /// of the bytes; the same bits).
    packed: Option<PackedRows>,
    /// Without blocks, the values regrouped for one-row products (no transposes; bf16 values
    /// in half the bytes), made at the first one-row product: a scoring run that never decodes
    /// never holds the second copy.
    grouped: OnceLock<GroupedValues>,
}

impl F32Matrix {
    /// `None` unless `values` holds exactly `rows * cols` entries.
    pub(super) fn new(rows: usize, cols: usize, values: Values) -> Option<F32Matrix> {
        (rows.checked_mul(cols) == Some(values.len())).then_some(F32Matrix {
            rows,
            cols,
            values,
            packed: None,
            grouped: OnceLock::new(),
        })
    }

    /// The matrix with its file's blocks for one-row products: an error unless they have its
    /// shape and give its values (rows spread over the matrix are dequantized and compared bit
    /// for bit, so blocks that belong to another tensor or another row order are refused).
    pub(super) fn with_packed(mut self, packed: Option<PackedRows>) -> Result<F32Matrix, String> {
        let Some(p) = packed else {
            return Ok(self);
        };
        if (p.rows, p.cols) != (self.rows, self.cols) {
            return Err(format!(
                "its blocks are [{}, {}], its values [{}, {}]",
                p.rows, p.cols, self.rows, self.cols
            ));
        }
        let samples = [0, self.rows / 3, self.rows / 2, self.rows.saturating_sub(1)];
        for r in samples.into_iter().filter(|&r| r < self.rows) {
            let want = &self.values[r * self.cols..(r + 1) * self.cols];
            let same = p
                .dequantize_row(r)
                .iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            if !same {
                return Err(format!("row {r} of its blocks differs from its values"));
            }
        }
        self.packed = Some(p);
        Ok(self)
    }

    /// Rows `ids` gathered into `[ids.len(), cols]` (an embedding lookup); an id out of range
    /// is an error.
    pub(super) fn gather(&self, ids: &[u32]) -> candle_core::Result<Tensor> {
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        for &id in ids {
            let r = id as usize;
            if r >= self.rows {
                return Err(candle_core::Error::Msg(format!(
                    "token id {id} is outside the embedding's {} rows",
                    self.rows
                )));
            }
            out.extend_from_slice(&self.values[r * self.cols..(r + 1) * self.cols]);
        }
        Tensor::from_vec(out, (ids.len(), self.cols), &Device::Cpu)
    }

    /// `x · selfᵀ` for `x` `[.., cols]` (f32): `[.., rows]`.
    pub(super) fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut dims = x.dims().to_vec();
        let mut out = Vec::new();
        self.apply_into(x, &mut out)?;
        if let Some(last) = dims.last_mut() {
            *last = self.rows;
        }
        Tensor::from_vec(out, dims, &Device::Cpu)
    }

    /// `x · selfᵀ` written into `out` (resized to `[m, rows]`, row-major), whose allocation
    /// the caller may reuse from one call to the next.
    pub(super) fn apply_into(&self, x: &Tensor, out: &mut Vec<f32>) -> candle_core::Result<()> {
        if x.dtype() != DType::F32 {
            return Err(candle_core::Error::Msg(format!(
                "an f32 weight applied to a {:?} input",
                x.dtype()
            )));
        }
        let k = *x.dims().last().unwrap_or(&0);
        if k != self.cols {
            return Err(candle_core::Error::Msg(format!(
                "a [{}, {}] weight applied to rows of {k}",
                self.rows, self.cols
            )));
        }
        let m = x.elem_count().checked_div(k).unwrap_or(0);
        with_f32(x, |lhs| {
            out.clear();
            out.resize(m * self.rows, 0.0);
            match &self.packed {
                Some(p) if m == 1 => {
                    super::row_product::packed_row_times(out, lhs, p, rayon::current_num_threads())
                }
                None if m == 1 && self.rows >= super::row_product::TILE => {
                    let grouped = self
                        .grouped
                        .get_or_init(|| GroupedValues::new(&self.values, self.rows, self.cols));
                    super::row_product::grouped_row_times(
                        out,
                        lhs,
                        &self.values,
                        grouped,
                        rayon::current_num_threads(),
                    )
                }
                _ => x_wt(lhs, m, k, &self.values, self.rows, out),
            }
            Ok(())
        })
    }
}

/// `f` on an f32 CPU tensor's values in row-major order: read in place when the tensor is
/// contiguous, else from a contiguous copy.
pub(super) fn with_f32<R>(
    x: &Tensor,
    f: impl FnOnce(&[f32]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let x = x.contiguous()?;
    let (storage, layout) = x.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(candle_core::Error::Msg("a CPU tensor was expected".into()));
    };
    let start = layout.start_offset();
    let values = cpu
        .as_slice::<f32>()?
        .get(start..start + x.elem_count())
        .ok_or_else(|| candle_core::Error::Msg("a tensor shorter than its shape".into()))?;
    f(values)
}

/// A linear module's weight as the forward pass holds it: candle's `[in, out]` view (f64 and
/// bf16 compute), or an f32 matrix applied by [`x_wt`].
pub(super) enum Weight {
    Candle(Tensor),
    F32(Arc<F32Matrix>),
}

impl Weight {
    /// `x · W` (with `W` the module's `[in, out]` map).
    pub(super) fn apply(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Weight::Candle(wt) => fixed_depth_matmul(x, wt),
            Weight::F32(w) => w.apply(x),
        }
    }

    /// The `[in, out]` view as a candle tensor (a router's or another small dense matrix's
    /// product done by candle).
    pub(super) fn candle(&self) -> candle_core::Result<Tensor> {
        match self {
            Weight::Candle(wt) => Ok(wt.clone()),
            Weight::F32(w) => Tensor::from_slice(&w.values, (w.rows, w.cols), &Device::Cpu)?.t(),
        }
    }
}

/// `out[m, n] = lhs[m, k] · w[n, k]ᵀ`, all row-major: the `gemm` call candle's CPU matmul makes
/// for a contiguous `lhs` and the transposed view of `w`, with the same parallelism (the
/// process's thread count; the split never changes the bits).
pub(super) fn x_wt(lhs: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    assert!(
        lhs.len() == m * k && w.len() == n * k && out.len() == m * n,
        "x_wt: operand sizes disagree with [{m}, {k}] · [{n}, {k}]ᵀ"
    );
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    product(
        out,
        n,
        None,
        MatRef::rows(lhs, m, k),
        MatRef::rows(w, n, k).transposed(),
        parallelism,
    );
}

/// `a.matmul(b)` (candle's product, for the dtypes and shapes the f32 path leaves to it) with
/// the depth cut by [`depth_blocks`]' fixed rule where gemm would cut it by the cache
/// ([`cut_by_cache`]), the blocks' products added in order: on every machine what gemm
/// computes on a 32 KiB 8-way L1.
pub(super) fn fixed_depth_matmul(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    use candle_core::D;
    let (m, k, n) = (a.dim(D::Minus2)?, a.dim(D::Minus1)?, b.dim(D::Minus1)?);
    if a.rank() == 2 && b.rank() == 2 && a.dtype() == DType::F32 && by_rows(m, n, k) {
        // gemm's special paths sum in the machine's order: the fixed order's chains instead.
        return with_f32(a, |x| {
            with_f32(b, |w| {
                let mut out = vec![0f32; m * n];
                product(
                    &mut out,
                    n,
                    None,
                    MatRef::rows(x, m, k),
                    MatRef::rows(w, k, n),
                    gemm::Parallelism::None,
                );
                Tensor::from_vec(out, (m, n), &Device::Cpu)
            })
        });
    }
    if !cut_by_cache(m, k, n) {
        return a.matmul(b);
    }
    let mut out: Option<Tensor> = None;
    for (start, depth) in depth_blocks(k) {
        let block =
            a.narrow(D::Minus1, start, depth)?
                .matmul(&b.narrow(D::Minus2, start, depth)?)?;
        out = Some(match out {
            None => block,
            Some(sum) => (sum + block)?,
        });
    }
    out.ok_or_else(|| candle_core::Error::Msg("an empty product".into()))
}

/// A read-only strided matrix view over a slice: element `(r, c)` is `data[r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub struct MatRef<'a, F> {
    pub(super) data: &'a [F],
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) rs: usize,
    pub(super) cs: usize,
}

impl<'a, F> MatRef<'a, F> {
    /// The row-major `rows x cols` matrix at the start of `data`.
    pub(super) fn rows(data: &'a [F], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The same elements read as the transpose (no copy).
    pub(super) fn transposed(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// Whether every element lies inside `data` (what makes the raw product below sound).
    pub(super) fn in_bounds(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `dst = lhs rhs`, or `dst = alpha dst + lhs rhs` with `Some(alpha)`, where `dst` is row-major
/// with `dst_cols` columns: the `gemm` crate's kernels (the ones candle runs), single-threaded, as
/// the callers (the delta rule, attention) already run one head per task.
pub(super) fn matmul<F: DeltaFloat>(
    dst: &mut [F],
    dst_cols: usize,
    alpha: Option<F>,
    lhs: MatRef<'_, F>,
    rhs: MatRef<'_, F>,
) {
    product(dst, dst_cols, alpha, lhs, rhs, gemm::Parallelism::None)
}

/// [`matmul`] under `parallelism`: the one raw `gemm` call of the forward pass. The shapes are
/// checked before it: a mismatch is a bug and panics rather than reading out of bounds.
fn product<F: DeltaFloat>(
    dst: &mut [F],
    dst_cols: usize,
    alpha: Option<F>,
    lhs: MatRef<'_, F>,
    rhs: MatRef<'_, F>,
    parallelism: gemm::Parallelism,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert!(
        rhs.rows == k && n == dst_cols && dst.len() >= m * n && lhs.in_bounds() && rhs.in_bounds(),
        "strided product: [{m}, {k}] x [{}, {n}] into [{}, {dst_cols}]",
        rhs.rows,
        dst.len() / dst_cols.max(1)
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: `dst` stays `alpha dst`, or is zero.
        match alpha {
            None => dst[..m * n].fill(F::ZERO),
            Some(a) => dst[..m * n].iter_mut().for_each(|d| *d *= a),
        }
        return;
    }
    // One row takes the cut a product of many rows takes (gemm would leave a one-row product
    // of few outputs uncut), so that a decoded row has the bits of the prefill's.
    if !(cut_by_cache(m, k, n) || (by_rows(m, n, k) && k > DEPTH_BLOCK)) {
        return one_block(dst, m, n, k, alpha, lhs, rhs, parallelism);
    }
    // One call per fixed depth block, each adding onto what the blocks before it left (the
    // same `dst = dst + block` step gemm takes between its own depth blocks).
    let mut alpha = alpha;
    for (start, depth) in depth_blocks(k) {
        let lhs = MatRef {
            data: &lhs.data[start * lhs.cs..],
            cols: depth,
            ..lhs
        };
        let rhs = MatRef {
            data: &rhs.data[start * rhs.rs..],
            rows: depth,
            ..rhs
        };
        one_block(dst, m, n, depth, alpha, lhs, rhs, parallelism);
        alpha = Some(F::ONE);
    }
}

/// Outputs (rows × columns) at most of a product gemm computes with its dot-product kernels
/// (its "horizontal" path), which [`one_block`] leaves to [`super::row_product`] ([`by_rows`]).
const SMALL_PRODUCT: usize = 256;

/// Whether an `[m, k] · [k, n]` product runs row by row in [`super::row_product`]: wherever
/// gemm would leave its many-row kernel for one of its special paths (one row or one column:
/// matrix-vector kernels; few outputs: dot-product kernels; a depth of 2 or less: outer
/// products), whose order follows the machine's SIMD width or fusing.
fn by_rows(m: usize, n: usize, k: usize) -> bool {
    m == 1 || n == 1 || k <= 2 || m * n <= SMALL_PRODUCT
}

/// The depth of one `gemm` call at most where gemm would size its depth blocks from the cache.
pub(super) const DEPTH_BLOCK: usize = 512;

/// Whether gemm would cut an `[m, k] · [k, n]` product's depth by the CPU's cache: on its
/// general path (more than 64 rows or columns, more than 256 entries: smaller products take
/// fixed depth blocks of 512 or 1024) it sizes depth blocks from the L1 cache's size and ways
/// (at least 512: one 768-deep block on a 48 KiB 12-way L1, two of 384 on a 32 KiB 8-way one)
/// and adds the blocks' sums in turn, so a product deeper than 512 rounds differently on
/// machines with other caches. Those products are cut here by [`depth_blocks`]' fixed rule.
pub(super) fn cut_by_cache(m: usize, k: usize, n: usize) -> bool {
    k > DEPTH_BLOCK && (m > 64 || n > 64) && m * n > 256
}

/// `(start, depth)` of each depth block of a `k`-deep product: as few blocks of at most
/// [`DEPTH_BLOCK`] as cover `k`, of equal depth but for the last (gemm's own cut on a 32 KiB
/// 8-way L1, so that such machines keep the bits they gave before).
pub(super) fn depth_blocks(k: usize) -> impl Iterator<Item = (usize, usize)> {
    let n_blocks = k.div_ceil(DEPTH_BLOCK).max(1);
    let depth = k.div_ceil(n_blocks).max(1);
    (0..k)
        .step_by(depth)
        .map(move |start| (start, depth.min(k - start)))
}

/// One `gemm` call (views within those [`product`] checked).
#[allow(clippy::too_many_arguments)]
fn one_block<F: DeltaFloat>(
    dst: &mut [F],
    m: usize,
    n: usize,
    k: usize,
    alpha: Option<F>,
    lhs: MatRef<'_, F>,
    rhs: MatRef<'_, F>,
    parallelism: gemm::Parallelism,
) {
    assert!(
        dst.len() >= m * n && lhs.in_bounds() && rhs.in_bounds(),
        "a depth block outside its product"
    );
    if by_rows(m, n, k) {
        // One row, or a product so small that gemm would take its dot-product kernels
        // (vectorized along the depth by the machine's SIMD width): each row's chains in the
        // order of gemm's many-row kernel, the same on every machine.
        let threads = match parallelism {
            gemm::Parallelism::Rayon(t) => t.max(1),
            _ => 1,
        };
        for (i, row) in dst[..m * n].chunks_exact_mut(n).enumerate() {
            let x = MatRef {
                data: &lhs.data[i * lhs.rs..],
                rows: 1,
                ..lhs
            };
            super::row_product::row_times(row, alpha, x, rhs, threads);
        }
        return;
    }
    let stride = |x: usize| x as isize;
    // SAFETY: every index the product touches is `r * rs + c * cs` with `r`, `c` inside the
    // checked shapes, and each view's largest such index is inside its slice (`in_bounds`, and
    // `dst.len() >= m * n` for the row-major destination); `dst` does not alias `lhs` or `rhs`
    // (it is a `&mut`). `F` is `f32` or `f64` (the only `DeltaFloat`s), both of which `gemm`
    // dispatches natively.
    #[allow(unsafe_code)]
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            stride(n),
            alpha.is_some(),
            lhs.data.as_ptr(),
            stride(lhs.cs),
            stride(lhs.rs),
            rhs.data.as_ptr(),
            stride(rhs.cs),
            stride(rhs.rs),
            alpha.unwrap_or(F::ZERO),
            F::ONE,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A deterministic spread of magnitudes and signs (products round differently by order),
    /// shared by the native runner's kernel tests.
    pub(in crate::runner::native) fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (x as f32 / (1u32 << 24) as f32 - 0.5) * (1.0 + (i % 7) as f32)
            })
            .collect()
    }

    /// Whether two f32 slices hold the same bits (NaN payloads and zero signs included).
    pub(in crate::runner::native) fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Every product is the fixed order's chains ([`fixed_depth_oracle`]); where gemm runs its
    /// many-row kernel (more than 256 outputs, more than one row) those are candle's bits too.
    #[test]
    fn products_are_the_fixed_orders_bits_and_candles_where_gemm_runs_them() {
        for (m, k, n) in [
            (1, 1, 1),
            (1, 7, 9),
            (1, 600, 40),
            (3, 5, 7),
            (2, 64, 64),
            (37, 129, 65),
            (256, 64, 300),
            (5, 1024, 3),
        ] {
            let x = values(m * k, 1);
            let w = values(n * k, 2);
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
            let wt = Tensor::from_vec(w.clone(), (n, k), &Device::Cpu).unwrap();
            let matrix = F32Matrix::new(n, k, Values::Owned(w.clone())).unwrap();
            let got = matrix.apply(&xt).unwrap();
            assert_eq!(got.dims(), &[m, n]);
            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&fixed_depth_oracle(&x, m, k, &w, n)),
                "[{m}, {k}] · [{n}, {k}]ᵀ differs from the fixed order"
            );
            if m > 1 && m * n > SMALL_PRODUCT {
                let candle = xt
                    .matmul(&wt.t().unwrap())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&candle),
                    "[{m}, {k}] · [{n}, {k}]ᵀ vs candle"
                );
            }
        }
    }

    /// [`fixed_depth_oracle`] on tensors: `a [.., m, k] · b [.., k, n]` (f32, any strides), each
    /// matrix of the batch on its own.
    pub(crate) fn oracle_matmul(a: &Tensor, b: &Tensor) -> Tensor {
        let (m, k) = (a.dim(a.rank() - 2).unwrap(), a.dim(a.rank() - 1).unwrap());
        let n = b.dim(b.rank() - 1).unwrap();
        let batch = a.elem_count() / (m * k);
        let av = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // w[n, k]: b's matrices transposed.
        let bt = b.transpose(b.rank() - 2, b.rank() - 1).unwrap();
        let bv = bt.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let mut out = Vec::with_capacity(batch * m * n);
        for i in 0..batch {
            out.extend(fixed_depth_oracle(
                &av[i * m * k..(i + 1) * m * k],
                m,
                k,
                &bv[i * n * k..(i + 1) * n * k],
                n,
            ));
        }
        let mut dims = a.dims().to_vec();
        *dims.last_mut().unwrap() = n;
        Tensor::from_vec(out, dims, &Device::Cpu).unwrap()
    }

    /// What every machine computes for `x[m, k] · w[n, k]ᵀ`: per depth block of
    /// [`depth_blocks`], one chain of fused multiply-adds in depth order from zero, the blocks'
    /// sums added in order.
    pub(crate) fn fixed_depth_oracle(
        x: &[f32],
        m: usize,
        k: usize,
        w: &[f32],
        n: usize,
    ) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut total: Option<f32> = None;
                for (start, depth) in depth_blocks(k) {
                    let mut s = 0f32;
                    for t in start..start + depth {
                        s = x[i * k + t].mul_add(w[j * k + t], s);
                    }
                    total = Some(total.map_or(s, |acc| acc + s));
                }
                out[i * n + j] = total.unwrap_or(0.0);
            }
        }
        out
    }

    #[test]
    fn deep_products_round_the_same_on_every_machine() {
        // gemm alone would cut these depths by the L1 cache's size and ways (one 768-deep block
        // on a 48 KiB 12-way L1, two of 384 on a 32 KiB 8-way one): the fixed cut gives the
        // oracle's bits whatever the machine (the products are large enough for gemm's
        // cache-sized path, over 64 rows and columns).
        for (m, k, n) in [
            (300, 768, 200),
            (100, 1300, 70),
            (70, 2048, 90),
            (65, 513, 66),
        ] {
            assert!(cut_by_cache(m, k, n));
            let x = values(m * k, 11);
            let w = values(n * k, 12);
            let mut got = vec![0f32; m * n];
            x_wt(&x, m, k, &w, n, &mut got);
            let want = fixed_depth_oracle(&x, m, k, &w, n);
            let differ = got
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(
                differ, 0,
                "[{m}, {k}] · [{n}, {k}]ᵀ: {differ} entries off the fixed order"
            );
        }
    }

    #[test]
    fn the_depth_cut_is_gemms_own_on_a_common_l1() {
        let blocks = |k: usize| depth_blocks(k).collect::<Vec<_>>();
        assert_eq!(blocks(1), vec![(0, 1)]);
        assert_eq!(blocks(512), vec![(0, 512)]);
        assert_eq!(blocks(513), vec![(0, 257), (257, 256)]);
        assert_eq!(blocks(768), vec![(0, 384), (384, 384)]);
        assert_eq!(blocks(1025), vec![(0, 342), (342, 342), (684, 341)]);
        for k in 1..5000 {
            let b = blocks(k);
            assert!(
                b.iter().all(|&(_, d)| (1..=DEPTH_BLOCK).contains(&d)),
                "{k}"
            );
            assert_eq!(b.iter().map(|&(_, d)| d).sum::<usize>(), k);
            assert!(b.windows(2).all(|p| p[0].0 + p[0].1 == p[1].0), "{k}");
        }
    }

    #[test]
    fn candles_products_take_the_same_fixed_cut() {
        // The products left to candle (f64 compute, the attention fallback, MoE routers):
        // 2-D and batched, against the f64 oracle of the same order.
        for (m, k, n) in [(80, 768, 70), (2, 1100, 130)] {
            let x: Vec<f64> = values(m * k, 21).into_iter().map(f64::from).collect();
            let w: Vec<f64> = values(k * n, 22).into_iter().map(f64::from).collect();
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
            let wt = Tensor::from_vec(w.clone(), (k, n), &Device::Cpu).unwrap();
            let got = fixed_depth_matmul(&xt, &wt)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            let batched = fixed_depth_matmul(
                &Tensor::stack(&[&xt, &xt], 0).unwrap(),
                &Tensor::stack(&[&wt, &wt], 0).unwrap(),
            )
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
            for i in 0..m {
                for j in 0..n {
                    let mut total: Option<f64> = None;
                    for (start, depth) in depth_blocks(k) {
                        let mut s = 0f64;
                        for t in start..start + depth {
                            s = x[i * k + t].mul_add(w[t * n + j], s);
                        }
                        total = Some(total.map_or(s, |acc| acc + s));
                    }
                    let want = total.unwrap().to_bits();
                    assert_eq!(got[i * n + j].to_bits(), want, "[{m}, {k}, {n}] ({i}, {j})");
                    assert_eq!(batched[i * n + j].to_bits(), want, "batched ({i}, {j})");
                    assert_eq!(
                        batched[m * n + i * n + j].to_bits(),
                        want,
                        "batch 1 ({i}, {j})"
                    );
                }
            }
        }
    }

    #[test]
    fn a_rows_product_does_not_depend_on_the_rows_beside_it() {
        // What lets the scorer chunk the head's rows by its memory bound (which follows the
        // thread count): any chunk of two rows or more gives each row the same bits.
        let (m, k, n) = (300, 1024, 1000);
        let x = values(m * k, 5);
        let w = values(n * k, 6);
        let mut whole = vec![0f32; m * n];
        x_wt(&x, m, k, &w, n, &mut whole);
        let partitions: [&[usize]; 3] = [&[150, 150], &[2, 296, 2], &[110, 110, 80]];
        for sizes in partitions {
            let mut at = 0;
            for &rows in sizes {
                let mut part = vec![0f32; rows * n];
                x_wt(&x[at * k..(at + rows) * k], rows, k, &w, n, &mut part);
                let same = part
                    .iter()
                    .zip(&whole[at * n..(at + rows) * n])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "rows {at}..{} as a chunk of {rows}", at + rows);
                at += rows;
            }
            assert_eq!(at, m);
        }
    }

    #[test]
    fn gather_reads_rows_and_refuses_ids_out_of_range() {
        let matrix = F32Matrix::new(3, 2, Values::Owned(vec![0., 1., 2., 3., 4., 5.])).unwrap();
        let rows = matrix.gather(&[2, 0]).unwrap();
        assert_eq!(
            rows.to_vec2::<f32>().unwrap(),
            vec![vec![4., 5.], vec![0., 1.]]
        );
        assert!(matrix.gather(&[3]).is_err());
        assert!(F32Matrix::new(2, 2, Values::Owned(vec![0.; 3])).is_none());
    }

    #[test]
    fn an_empty_depth_gives_zeros() {
        let mut out = vec![f32::NAN; 6];
        x_wt(&[], 2, 0, &[], 3, &mut out);
        assert_eq!(out, [0.0; 6]);
    }

    #[test]
    fn a_mismatched_input_is_an_error() {
        let matrix = F32Matrix::new(2, 3, Values::Owned(vec![0.; 6])).unwrap();
        let x = Tensor::zeros((4, 2), DType::F32, &Device::Cpu).unwrap();
        assert!(matrix.apply(&x).is_err());
        let x = Tensor::zeros((4, 3), DType::F64, &Device::Cpu).unwrap();
        assert!(matrix.apply(&x).is_err());
    }
}
