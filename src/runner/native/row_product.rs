//! One row times a matrix: the product a decode step makes against every weight, and a single
//! query's against its keys and values. Each output is one chain of fused multiply-adds in depth
//! order from zero, combined with the destination as gemm combines a depth block: the order in
//! which gemm's kernel sums a product of many rows, so a decoded token's row has the bits the
//! same position's prefill gives.
//!
//! gemm itself switches to dot-product kernels at one row, vectorized along the depth with the
//! machine's SIMD width (8 lanes on AVX2, 4 on NEON, 1 in its scalar form), so a decoded row's bits
//! depended on the machine, and gemm runs them on one thread. Here eight outputs are eight SIMD
//! lanes, each its own chain (on AVX2 + FMA; eight weight rows transposed eight depths at a time
//! when each output's weights lie along the depth), and the scalar form computes the same chains
//! one at a time: the same bits on every machine. Outputs are split among threads, never the
//! depth, so the thread count does not change them either.

use rayon::prelude::*;

use super::delta_rule::DeltaFloat;
use super::matmul::MatRef;
use super::packed::{BLOCK, GROUP, GroupedValues, PackedRows};
#[cfg(target_arch = "x86_64")]
use super::packed::{BlockType, Grouped};

/// f32 lanes of one AVX2 register.
const LANES: usize = 8;
/// Registers a tile's chains run in: independent chains hide the fused multiply-add's latency.
const GROUPS: usize = 4;
/// Outputs per SIMD tile.
pub(super) const TILE: usize = LANES * GROUPS;
/// Multiply-adds under which a product stays on the calling thread (a task costs microseconds).
const PARALLEL_WORK: usize = 1 << 15;

/// `dst[j] = chain_j` (`alpha` `None` or zero), `dst[j] + chain_j` (`alpha` one) or
/// `alpha · dst[j] + chain_j`, where `chain_j` sums `x[t] · rhs[t, j]` over the depth `t` in
/// order, one rounding per step (gemm's combination of a depth block with the destination).
/// `x` is one row (`[1, k]`), `rhs` `[k, n]`; `threads` > 1 splits the outputs among rayon's
/// threads when the product is large enough.
pub(super) fn row_times<F: DeltaFloat>(
    dst: &mut [F],
    alpha: Option<F>,
    x: MatRef<'_, F>,
    rhs: MatRef<'_, F>,
    threads: usize,
) {
    let (k, n) = (rhs.rows, rhs.cols);
    assert!(
        x.rows == 1 && x.cols == k && dst.len() >= n && x.in_bounds() && rhs.in_bounds(),
        "row product: [{}, {}] x [{k}, {n}] into {}",
        x.rows,
        x.cols,
        dst.len()
    );
    let dst = &mut dst[..n];
    let tasks = if threads > 1 && n.saturating_mul(k) >= PARALLEL_WORK {
        threads.min(n.div_ceil(TILE))
    } else {
        1
    };
    if tasks <= 1 {
        return outputs(dst, 0, alpha, x, rhs);
    }
    let size = n.div_ceil(tasks).next_multiple_of(TILE);
    dst.par_chunks_mut(size)
        .enumerate()
        .for_each(|(i, part)| outputs(part, i * size, alpha, x, rhs));
}

/// Outputs `from..from + dst.len()` of [`row_times`]: whole tiles in SIMD lanes where the type
/// and CPU have a form, the rest (and everything else) as scalar chains.
fn outputs<F: DeltaFloat>(
    dst: &mut [F],
    from: usize,
    alpha: Option<F>,
    x: MatRef<'_, F>,
    rhs: MatRef<'_, F>,
) {
    let mut j = 0;
    while j + 2 * TILE <= dst.len() {
        let Some(tile) = F::row_tile_wide(x, rhs, from + j) else {
            break;
        };
        for (d, s) in dst[j..j + 2 * TILE].iter_mut().zip(tile) {
            *d = combine(alpha, *d, s);
        }
        j += 2 * TILE;
    }
    while j + TILE <= dst.len() {
        let Some(tile) = F::row_tile(x, rhs, from + j) else {
            break;
        };
        for (d, s) in dst[j..j + TILE].iter_mut().zip(tile) {
            *d = combine(alpha, *d, s);
        }
        j += TILE;
    }
    for (i, d) in dst.iter_mut().enumerate().skip(j) {
        *d = combine(alpha, *d, chain(x, rhs, from + i));
    }
}

/// Output `j`'s chain: `x[t] · rhs[t, j]` added in depth order from zero, each step one fused
/// multiply-add.
pub(super) fn chain<F: DeltaFloat>(x: MatRef<'_, F>, rhs: MatRef<'_, F>, j: usize) -> F {
    (0..rhs.rows).fold(F::ZERO, |s, t| {
        x.data[t * x.cs].fused_mul_add(rhs.data[t * rhs.rs + j * rhs.cs], s)
    })
}

/// A depth block's chain `s` combined with the destination's `d` as gemm combines them: `s`
/// alone when the destination is not read (or `alpha` is zero), one rounded addition when
/// `alpha` is one, else `alpha · d` rounded, then added.
fn combine<F: DeltaFloat>(alpha: Option<F>, d: F, s: F) -> F {
    match alpha {
        None => s,
        Some(a) if a == F::ZERO => s,
        Some(a) if a == F::ONE => s + d,
        Some(a) => a * d + s,
    }
}

/// [`DeltaFloat::row_tile`] for f32: the AVX2 + FMA forms where the CPU has them and each
/// output's weights lie along the depth (`rhs.rs == 1`) or each depth's along the outputs
/// (`rhs.cs == 1`).
pub(super) fn f32_tile(x: MatRef<'_, f32>, rhs: MatRef<'_, f32>, j0: usize) -> Option<[f32; TILE]> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && (rhs.rs == 1 || rhs.cs == 1)
    {
        let k = rhs.rows;
        // Every element the tile reads: depth 0..k of outputs j0..j0 + 8 (and of x).
        let last =
            |m: &MatRef<'_, f32>, rows: usize, cols: usize| (rows - 1) * m.rs + (cols - 1) * m.cs;
        assert!(
            k > 0
                && j0 + TILE <= rhs.cols
                && last(&rhs, k, j0 + TILE) < rhs.data.len()
                && last(&x, 1, k) < x.data.len(),
            "a row product's tile outside its operands"
        );
        // SAFETY: the CPU has AVX2 and FMA (checked above), and every index the tile reads,
        // `t * rs + j * cs` for t < k and j < j0 + 8 (and `t * x.cs`), is at most the largest
        // one, checked to lie inside its slice just above.
        #[allow(unsafe_code)]
        return Some(unsafe {
            if rhs.rs == 1 {
                avx2::along_depth(x, rhs, j0)
            } else {
                avx2::along_outputs(x, rhs, j0)
            }
        });
    }
    let _ = (x, rhs, j0);
    None
}

/// [`DeltaFloat::row_tile_wide`] for f32: where each depth's weights lie along the outputs
/// (`rhs.cs == 1`, a query's weighted sum of values), 64 outputs in eight registers: a step's
/// fused multiply-adds are eight independent chains, enough to hide their latency.
pub(super) fn f32_tile_wide(
    x: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    j0: usize,
) -> Option<[f32; 2 * TILE]> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && rhs.cs == 1
    {
        let k = rhs.rows;
        assert!(
            k > 0
                && j0 + 2 * TILE <= rhs.cols
                && (k - 1) * rhs.rs + j0 + 2 * TILE - 1 < rhs.data.len()
                && (k - 1) * x.cs < x.data.len(),
            "a row product's wide tile outside its operands"
        );
        // SAFETY: the CPU has AVX2 and FMA (checked above), and every index the tile reads,
        // `t * rs + j` for t < k and j < j0 + 64 (and `t * x.cs`), is at most the largest one,
        // checked to lie inside its slice just above.
        #[allow(unsafe_code)]
        return Some(unsafe { avx2::along_outputs_wide(x, rhs, j0) });
    }
    let _ = (x, rhs, j0);
    None
}

/// `dst[j]` = output `j`'s chain (from zero, in depth order) of `x[t]` times its values, held
/// in groups of eight outputs `stride` apart, each group `[depth][8]`: output `j`'s value of
/// depth `t` is `grouped[(j / 8) · stride + t · 8 + j % 8]` (a single query against grouped
/// keys). The bits of [`row_times`] (no destination read) on the same values; one thread.
pub(super) fn strided_groups_times(dst: &mut [f32], x: &[f32], grouped: &[f32], stride: usize) {
    let (n, k) = (dst.len(), x.len());
    if n == 0 {
        return;
    }
    let groups = n.div_ceil(GROUP);
    assert!(
        k > 0 && stride >= k * GROUP && (groups - 1) * stride + k * GROUP <= grouped.len(),
        "a grouped product outside its values: {n} outputs of {k}, stride {stride}, {} values",
        grouped.len()
    );
    let mut g = 0;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        const WIDE: usize = 2 * GROUPS;
        while g < groups {
            let take = if groups - g >= WIDE { WIDE } else { 1 };
            let mut out = [0f32; 2 * TILE];
            // SAFETY: the CPU has AVX2 and FMA (checked above); groups `g..g + take` are below
            // `groups`, each read `k · 8` values from `(g + i) · stride`, inside `grouped`
            // (asserted above); `x` has `k` values.
            #[allow(unsafe_code)]
            unsafe {
                if take == WIDE {
                    avx2::strided_groups::<WIDE>(&mut out, x, grouped, stride, g)
                } else {
                    avx2::strided_groups::<1>(&mut out, x, grouped, stride, g)
                }
            };
            let from = g * GROUP;
            let len = (take * GROUP).min(n - from);
            dst[from..from + len].copy_from_slice(&out[..len]);
            g += take;
        }
    }
    for (j, d) in dst.iter_mut().enumerate().skip(g * GROUP) {
        let at = (j / GROUP) * stride + j % GROUP;
        *d = (0..k).fold(0f32, |s, t| x[t].mul_add(grouped[at + t * GROUP], s));
    }
}

/// Columns of one key head a task of [`shared_weighted_sums`] takes at most: four registers for
/// each of three query heads.
pub(super) const SHARED_COLUMNS: usize = 4 * LANES;

/// Query heads read together by [`shared_weighted_sums`]: with four registers each, twelve
/// chains plus the loaded values and the broadcast weights fill the sixteen AVX2 registers.
const SHARED_HEADS: usize = 3;

/// Whether [`shared_weighted_sums`] has its SIMD form here (else attention keeps its per-head
/// products, which give the same bits).
pub(super) fn shared_weighted_sums_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dst[r · width + j]` = head `r`'s chain (from zero, in position order, one fused multiply-add
/// a step) of `weights[r][p] · values[p · stride + j]` over its positions, for every column
/// `j < width`, combined with the destination by `alpha` as [`row_times`] combines a depth
/// block: a query's weighted sum of one key head's values, for all the query heads that read
/// that key head, each value loaded once for up to [`SHARED_HEADS`] of them. The bits of
/// [`row_times`] per head. Needs [`shared_weighted_sums_available`]; panics otherwise or when the
/// operands do not hold the positions and columns.
pub(super) fn shared_weighted_sums(
    dst: &mut [f32],
    alpha: Option<f32>,
    weights: &[&[f32]],
    values: &[f32],
    stride: usize,
    width: usize,
) {
    let len = weights.first().map_or(0, |w| w.len());
    assert!(
        shared_weighted_sums_available()
            && len > 0
            && weights.iter().all(|w| w.len() == len)
            && (1..=SHARED_COLUMNS).contains(&width)
            && width <= stride
            && (len - 1) * stride + width <= values.len()
            && dst.len() >= weights.len() * width,
        "shared weighted sums: {} heads of {len} positions, {width} of {} values every {stride}",
        weights.len(),
        values.len()
    );
    #[cfg(target_arch = "x86_64")]
    for (b, batch) in weights.chunks(SHARED_HEADS).enumerate() {
        let mut j = 0;
        while j < width {
            let (take, wide) = if width - j >= SHARED_COLUMNS {
                (SHARED_COLUMNS, true)
            } else {
                (LANES.min(width - j), false)
            };
            let mut out = [[0f32; SHARED_COLUMNS]; SHARED_HEADS];
            let at = values[j..].as_ptr();
            // SAFETY: the CPU has AVX2 and FMA (asserted above); each weight row has `len`
            // values; the kernel reads `values[p · stride + j + i]` for p < len and i < 8 · W
            // (i < take when `take` < 8), inside `values` as asserted above.
            #[allow(unsafe_code)]
            unsafe {
                match (batch.len(), wide) {
                    (3, true) => avx2::shared_sums::<3, 4>(&mut out, batch, at, stride, take),
                    (2, true) => avx2::shared_sums::<2, 4>(&mut out, batch, at, stride, take),
                    (1, true) => avx2::shared_sums::<1, 4>(&mut out, batch, at, stride, take),
                    (3, false) => avx2::shared_sums::<3, 1>(&mut out, batch, at, stride, take),
                    (2, false) => avx2::shared_sums::<2, 1>(&mut out, batch, at, stride, take),
                    _ => avx2::shared_sums::<1, 1>(&mut out, batch, at, stride, take),
                }
            }
            for (r, row) in out.iter().take(batch.len()).enumerate() {
                let head = b * SHARED_HEADS + r;
                let to = &mut dst[head * width + j..head * width + j + take];
                for (d, &chain) in to.iter_mut().zip(&row[..take]) {
                    *d = combine(alpha, *d, chain);
                }
            }
            j += take;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (dst, alpha, values, stride, width);
}

/// `dst = x · wᵀ` for one row `x` (`[1, cols]`) against a weight held as its file's blocks:
/// the bits [`row_times`] gives on the dequantized matrix, through the same depth cut
/// ([`super::matmul::depth_blocks`] beyond [`super::matmul::DEPTH_BLOCK`], else one chain),
/// each block dequantized as it is read.
pub(super) fn packed_row_times(dst: &mut [f32], x: &[f32], w: &PackedRows, threads: usize) {
    let (n, k) = (w.rows, w.cols);
    assert!(
        x.len() == k && dst.len() >= n,
        "packed row product: {} values against [{n}, {k}] into {}",
        x.len(),
        dst.len()
    );
    let cuts = depth_cuts(k);
    split_outputs(&mut dst[..n], k, threads, |part, from| {
        packed_outputs(part, from, x, w, &cuts)
    });
}

/// `dst = x · wᵀ` for one row `x` (`[1, cols]`) against a row-major f32 weight `w` (`[n,
/// cols]`) whose whole groups of eight rows `grouped` also holds regrouped: the bits of
/// [`row_times`] on `w` (the same chains and depth cut), the tiles read from `grouped` with no
/// transpose where the CPU has AVX2 and FMA, every other output a scalar chain along `w`.
pub(super) fn grouped_row_times(
    dst: &mut [f32],
    x: &[f32],
    w: &[f32],
    grouped: &GroupedValues,
    threads: usize,
) {
    let k = x.len();
    let n = w.len().checked_div(k).unwrap_or(0);
    assert!(
        k > 0 && n * k == w.len() && dst.len() >= n && grouped.len() == n / GROUP * GROUP * k,
        "grouped row product: {k} values against {} weights ({} grouped) into {}",
        w.len(),
        grouped.len(),
        dst.len()
    );
    let cuts = depth_cuts(k);
    let whole = n / GROUP * GROUP;
    split_outputs(&mut dst[..n], k, threads, |part, from| {
        let mut j = 0;
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            while from + j + TILE <= whole && j + TILE <= part.len() {
                // SAFETY: the CPU has AVX2 and FMA (checked above); `from` is a multiple of
                // TILE (split_outputs), so groups `(from + j) / 8..+ 4` are whole groups, all of
                // which `grouped` holds (asserted above, `k` deep each); the cuts lie in `0..k`.
                #[allow(unsafe_code)]
                let tile = unsafe {
                    match grouped {
                        GroupedValues::F32(v) => {
                            avx2::values_tile::<false>(v.as_ptr().cast(), k, from + j, x, &cuts)
                        }
                        GroupedValues::Bf16(v) => {
                            avx2::values_tile::<true>(v.as_ptr().cast(), k, from + j, x, &cuts)
                        }
                    }
                };
                part[j..j + TILE].copy_from_slice(&tile);
                j += TILE;
            }
        }
        for (i, d) in part.iter_mut().enumerate().skip(j) {
            *d = cut_chain(x, &w[(from + i) * k..(from + i + 1) * k], &cuts);
        }
    });
}

/// The depth cut of a one-row product `k` deep, as [`super::matmul::product`] cuts it:
/// [`super::matmul::depth_blocks`] beyond [`super::matmul::DEPTH_BLOCK`], else one chain.
fn depth_cuts(k: usize) -> Vec<(usize, usize)> {
    if k > super::matmul::DEPTH_BLOCK {
        super::matmul::depth_blocks(k).collect()
    } else {
        vec![(0, k)]
    }
}

/// `part(outputs, from)` over `dst` split among threads as [`row_times`] splits it: parts of
/// whole tiles (`from` a multiple of [`TILE`]), on the calling thread when the product is small.
fn split_outputs(
    dst: &mut [f32],
    k: usize,
    threads: usize,
    part: impl Fn(&mut [f32], usize) + Sync,
) {
    let n = dst.len();
    let tasks = if threads > 1 && n.saturating_mul(k) >= PARALLEL_WORK {
        threads.min(n.div_ceil(TILE))
    } else {
        1
    };
    if tasks <= 1 {
        return part(dst, 0);
    }
    let size = n.div_ceil(tasks).next_multiple_of(TILE);
    dst.par_chunks_mut(size)
        .enumerate()
        .for_each(|(i, p)| part(p, i * size));
}

/// One output's chains along `row` over the depth cuts, the cuts' sums added in order.
fn cut_chain(x: &[f32], row: &[f32], cuts: &[(usize, usize)]) -> f32 {
    let mut total = 0f32;
    for (c, &(start, depth)) in cuts.iter().enumerate() {
        let s = x[start..start + depth]
            .iter()
            .zip(&row[start..start + depth])
            .fold(0f32, |s, (&a, &b)| a.mul_add(b, s));
        total = if c == 0 { s } else { s + total };
    }
    total
}

/// Outputs `from..from + dst.len()` of [`packed_row_times`]: [`TILE`] rows at a time from the
/// weight's [`super::packed::Grouped`] codes in SIMD lanes where the CPU has AVX2 and FMA (one
/// load, conversion, scaling and fused multiply-add per eight weights), else each block of the
/// tile's rows dequantized into a staging tile that scalar chains read; the rows left over one
/// at a time.
fn packed_outputs(
    dst: &mut [f32],
    from: usize,
    x: &[f32],
    w: &PackedRows,
    cuts: &[(usize, usize)],
) {
    let mut j = 0;
    #[cfg(target_arch = "x86_64")]
    if let Some(grouped) = w.grouped.as_deref()
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
    {
        assert!(
            x.len() == w.cols
                && from.is_multiple_of(GROUP)
                && grouped.codes.len()
                    == w.rows / GROUP * (w.cols / BLOCK) * w.ty.code_bytes() * GROUP
                && grouped.scales.len() == w.rows / GROUP * w.cols / BLOCK * GROUP
                && cuts.iter().all(|&(s, d)| s + d <= w.cols),
            "a grouped tile outside its weight"
        );
        while from + j + TILE <= w.rows / GROUP * GROUP && j + TILE <= dst.len() {
            // SAFETY: the CPU has AVX2, FMA and F16C (checked above); the tile's groups
            // `(from + j) / 8..+ 4` are whole groups of `grouped`, whose sizes match the
            // weight's, `x` has the weight's columns and the cuts lie inside them (asserted).
            #[allow(unsafe_code)]
            let tile = unsafe {
                match w.ty {
                    BlockType::Q8_0 => {
                        avx2::grouped_tile::<false>(grouped, w.cols, from + j, x, cuts)
                    }
                    BlockType::Q4_0 => {
                        avx2::grouped_tile::<true>(grouped, w.cols, from + j, x, cuts)
                    }
                }
            };
            dst[j..j + TILE].copy_from_slice(&tile);
            j += TILE;
        }
    }
    let mut staging = [[0f32; BLOCK]; TILE];
    while j + TILE <= dst.len() {
        let mut total = [0f32; TILE];
        for (c, &(start, depth)) in cuts.iter().enumerate() {
            let mut acc = [0f32; TILE];
            let mut t = start;
            while t < start + depth {
                let b = t / BLOCK;
                let end = (start + depth).min((b + 1) * BLOCK);
                for (r, row) in staging.iter_mut().enumerate() {
                    w.block(from + j + r, b, row);
                }
                acc = staged_chains(acc, &x[t..end], &staging, t - b * BLOCK);
                t = end;
            }
            for (sum, a) in total.iter_mut().zip(acc) {
                *sum = if c == 0 { a } else { a + *sum };
            }
        }
        dst[j..j + TILE].copy_from_slice(&total);
        j += TILE;
    }
    for (i, d) in dst.iter_mut().enumerate().skip(j) {
        *d = cut_chain(x, &w.dequantize_row(from + i), cuts);
    }
}

/// `acc` continued by the staged rows' chains over columns `at..at + x.len()`, one lane at a
/// time.
pub(super) fn staged_chains(
    mut acc: [f32; TILE],
    x: &[f32],
    staging: &[[f32; BLOCK]; TILE],
    at: usize,
) -> [f32; TILE] {
    assert!(at + x.len() <= BLOCK, "a staged chain outside its block");
    for (r, a) in acc.iter_mut().enumerate() {
        *a = x
            .iter()
            .zip(&staging[r][at..])
            .fold(*a, |s, (&xv, &wv)| xv.mul_add(wv, s));
    }
    acc
}

/// The AVX2 + FMA tiles (called only after the CPU check and the bounds checks of their
/// callers). A tile is [`TILE`] outputs in [`GROUPS`] registers of eight lanes, each lane one
/// output's chain: the groups' chains are independent, so the fused multiply-adds overlap.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, GROUP, GROUPS, Grouped, LANES, MatRef, TILE};

    type Rows = [[*const f32; LANES]; GROUPS];

    /// [`TILE`] outputs whose weights each lie along the depth (`rhs.rs == 1`, outputs `cs`
    /// apart), from zero.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn along_depth(
        x: MatRef<'_, f32>,
        rhs: MatRef<'_, f32>,
        j0: usize,
    ) -> [f32; TILE] {
        // SAFETY: the caller checked that every `t * x.cs` and every `t + (j0 + r) * cs`
        // (t < k, r < TILE) lies inside its slice.
        unsafe {
            let base = rhs.data.as_ptr();
            let mut rows: Rows = [[base; LANES]; GROUPS];
            for (g, group) in rows.iter_mut().enumerate() {
                for (r, p) in group.iter_mut().enumerate() {
                    *p = base.add((j0 + g * LANES + r) * rhs.cs);
                }
            }
            let acc = chains(
                [_mm256_setzero_ps(); GROUPS],
                x.data.as_ptr(),
                x.cs,
                &rows,
                0,
                rhs.rows,
            );
            store(acc)
        }
    }

    /// `acc` continued by the tile's chains over depths `from..to`: lane `r` of group `g` adds
    /// `x[t · xs] · rows[g][r][t]` for t in order. Eight depths at a time, each group's eight
    /// rows are read and transposed, so that one broadcast of `x[t]` and one fused
    /// multiply-add serve a group's lanes.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `x[t · xs]` and `rows[g][r][t]` are readable for
    /// `from <= t < to`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn chains(
        mut acc: [__m256; GROUPS],
        x: *const f32,
        xs: usize,
        rows: &Rows,
        from: usize,
        to: usize,
    ) -> [__m256; GROUPS] {
        // SAFETY: the reads are those the caller vouches for.
        unsafe {
            let mut t = from;
            while t + LANES <= to {
                for (g, group) in rows.iter().enumerate() {
                    let mut loaded = [_mm256_setzero_ps(); LANES];
                    for r in 0..LANES {
                        loaded[r] = _mm256_loadu_ps(group[r].add(t));
                    }
                    let columns = transpose(loaded);
                    for (i, column) in columns.into_iter().enumerate() {
                        let xt = _mm256_set1_ps(*x.add((t + i) * xs));
                        acc[g] = _mm256_fmadd_ps(xt, column, acc[g]);
                    }
                }
                t += LANES;
            }
            while t < to {
                let xt = _mm256_set1_ps(*x.add(t * xs));
                for (g, group) in rows.iter().enumerate() {
                    let column = _mm256_setr_ps(
                        *group[0].add(t),
                        *group[1].add(t),
                        *group[2].add(t),
                        *group[3].add(t),
                        *group[4].add(t),
                        *group[5].add(t),
                        *group[6].add(t),
                        *group[7].add(t),
                    );
                    acc[g] = _mm256_fmadd_ps(xt, column, acc[g]);
                }
                t += 1;
            }
            acc
        }
    }

    /// Outputs `j0..j0 + TILE` of [`super::packed_row_times`] from the weight's grouped codes
    /// (`Q4`: Q4_0, else Q8_0): per depth cut, each block of the tile's four groups in depth
    /// order, one broadcast of `x[t]` for the tile and, per group, one load of its eight codes
    /// of depth `t`, their conversion, the scale's multiplication (an exact product: the values
    /// of [`super::BlockType::dequantize`]) and one fused multiply-add; the cuts' sums added in
    /// order.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `j0` is a multiple of [`GROUP`] and groups `j0 / 8..+ 4` are
    /// whole groups of `grouped`, a `cols`-deep weight's; `x` has `cols` values; the cuts lie
    /// inside `0..cols`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn grouped_tile<const Q4: bool>(
        grouped: &Grouped,
        cols: usize,
        j0: usize,
        x: &[f32],
        cuts: &[(usize, usize)],
    ) -> [f32; TILE] {
        let blocks = cols / BLOCK;
        let code = if Q4 { BLOCK / 2 } else { BLOCK };
        let g0 = j0 / GROUP;
        let mut total = [_mm256_setzero_ps(); GROUPS];
        // SAFETY: every group-block read below is one of the tile's groups' `blocks` blocks
        // (`b < blocks` as `t < cols`), inside `codes` and `scales` as the caller vouches; `x`
        // is read at `t < cols`.
        unsafe {
            for (c, &(start, depth)) in cuts.iter().enumerate() {
                let mut acc = [_mm256_setzero_ps(); GROUPS];
                let mut t = start;
                while t < start + depth {
                    let b = t / BLOCK;
                    let (from, to) = (t - b * BLOCK, (start + depth - b * BLOCK).min(BLOCK));
                    let mut codes = [grouped.codes.as_ptr(); GROUPS];
                    let mut scales = [_mm256_setzero_ps(); GROUPS];
                    for g in 0..GROUPS {
                        let at = (g0 + g) * blocks + b;
                        codes[g] = grouped.codes.as_ptr().add(at * code * GROUP);
                        // f16 to f32 is exact, as `f16::to_f32` is.
                        let halves =
                            _mm_loadu_si128(grouped.scales.as_ptr().add(at * GROUP).cast());
                        scales[g] = _mm256_cvtph_ps(halves);
                    }
                    let xb = x.as_ptr().add(b * BLOCK);
                    // The block's depths in order (Q4_0: the low nibbles' 16, then the high
                    // ones'), each half with its scales times the power of two its codes carry.
                    let low = (from.min(BLOCK / 2), to.min(BLOCK / 2));
                    let high = (from.max(BLOCK / 2), to.max(BLOCK / 2));
                    for (half, (d0, d1)) in [low, high].into_iter().enumerate() {
                        if d0 == d1 {
                            continue;
                        }
                        let scaled = if Q4 {
                            let unit = _mm256_set1_ps(if half == 0 { LOW_UNIT } else { HIGH_UNIT });
                            scales.map(|s| _mm256_mul_ps(s, unit))
                        } else {
                            scales
                        };
                        if (d0, d1) == (0, BLOCK / 2) {
                            for d in 0..BLOCK / 2 {
                                acc = depth_step::<Q4>(acc, xb, &codes, &scaled, d);
                            }
                        } else if (d0, d1) == (BLOCK / 2, BLOCK) {
                            for d in BLOCK / 2..BLOCK {
                                acc = depth_step::<Q4>(acc, xb, &codes, &scaled, d);
                            }
                        } else {
                            for d in d0..d1 {
                                acc = depth_step::<Q4>(acc, xb, &codes, &scaled, d);
                            }
                        }
                    }
                    t = b * BLOCK + to;
                }
                total = add_cut(total, acc, c);
            }
        }
        store(total)
    }

    /// Outputs `j0..j0 + TILE` of [`super::grouped_row_times`] from grouped values (`BF16`: the
    /// upper halves of f32, else f32): per depth cut, each depth in order, one broadcast of
    /// `x[t]` and, per group, one load of its eight values of depth `t` (bf16 widened by a
    /// shift: exact) and one fused multiply-add; the cuts' sums added in order.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `base` points at grouped values (2 bytes each when `BF16`,
    /// else 4) holding groups `j0 / 8..+ 4` whole, `cols` deep; `j0` is a multiple of
    /// [`GROUP`]; `x` has `cols` values; the cuts lie inside `0..cols`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn values_tile<const BF16: bool>(
        base: *const u8,
        cols: usize,
        j0: usize,
        x: &[f32],
        cuts: &[(usize, usize)],
    ) -> [f32; TILE] {
        let size = if BF16 { 2 } else { 4 };
        let g0 = j0 / GROUP;
        let mut total = [_mm256_setzero_ps(); GROUPS];
        // SAFETY: group `g0 + g`'s depth `t` starts `((g0 + g) · cols + t) · 8` values into
        // `base`, inside the grouped values for `t < cols` as the caller vouches; `x[t]` too.
        unsafe {
            let mut groups = [base; GROUPS];
            for (g, p) in groups.iter_mut().enumerate() {
                *p = base.add((g0 + g) * cols * GROUP * size);
            }
            for (c, &(start, depth)) in cuts.iter().enumerate() {
                let mut acc = [_mm256_setzero_ps(); GROUPS];
                for t in start..start + depth {
                    let xt = _mm256_set1_ps(*x.as_ptr().add(t));
                    for g in 0..GROUPS {
                        let p = groups[g].add(t * GROUP * size);
                        let w = if BF16 {
                            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
                        } else {
                            _mm256_loadu_ps(p.cast())
                        };
                        acc[g] = _mm256_fmadd_ps(xt, w, acc[g]);
                    }
                }
                total = add_cut(total, acc, c);
            }
        }
        store(total)
    }

    /// Q4_0's low nibbles come out of [`depth_step`] as `q · 2^28`, its high ones as `q · 2^4`:
    /// their scales are multiplied by these units first. Both products are exact (an f16 scale
    /// times a power of two stays far inside f32's normal range), so `code · scale` is the value
    /// [`super::BlockType::dequantize`] gives.
    const LOW_UNIT: f32 = 1.0 / (1u32 << 28) as f32;
    const HIGH_UNIT: f32 = 1.0 / 16.0;

    /// The tile's chains one depth `d` of a block further: `xb[d]` times each group's eight
    /// weights of depth `d` (codes converted, times the group's scales as [`LOW_UNIT`] and
    /// [`HIGH_UNIT`] say), fused into `acc`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `d < BLOCK`; `xb[d]` is readable, and each `codes[g]` points
    /// at a group's block of grouped codes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn depth_step<const Q4: bool>(
        mut acc: [__m256; GROUPS],
        xb: *const f32,
        codes: &[*const u8; GROUPS],
        scales: &[__m256; GROUPS],
        d: usize,
    ) -> [__m256; GROUPS] {
        // SAFETY: as the caller vouches; a code byte index `d` (Q8_0) or `d % 16` (Q4_0) is
        // inside the group's block of `code * GROUP` bytes.
        unsafe {
            let xt = _mm256_set1_ps(*xb.add(d));
            for g in 0..GROUPS {
                let q = if Q4 {
                    // Nibbles stored as q - 8 in two's complement, the byte sign-extended: the
                    // low nibble shifted to the top gives q · 2^28, the high one with the low
                    // bits cleared q · 2^4 (one integer operation each; the scales carry the
                    // inverse power of two, so the product is the same exact value).
                    let bytes = _mm_loadl_epi64(codes[g].add((d % 16) * GROUP).cast());
                    let wide = _mm256_cvtepi8_epi32(bytes);
                    if d < 16 {
                        _mm256_slli_epi32::<28>(wide)
                    } else {
                        _mm256_and_si256(wide, _mm256_set1_epi32(!0xF))
                    }
                } else {
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64(codes[g].add(d * GROUP).cast()))
                };
                let weights = _mm256_mul_ps(_mm256_cvtepi32_ps(q), scales[g]);
                acc[g] = _mm256_fmadd_ps(xt, weights, acc[g]);
            }
            acc
        }
    }

    /// [`TILE`] outputs side by side in each depth's row (`rhs.cs == 1`): one load per group
    /// and depth.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn along_outputs(
        x: MatRef<'_, f32>,
        rhs: MatRef<'_, f32>,
        j0: usize,
    ) -> [f32; TILE] {
        // SAFETY: as in `along_depth`, every index read was checked.
        unsafe {
            let (xp, xs) = (x.data.as_ptr(), x.cs);
            let base = rhs.data.as_ptr().add(j0);
            let mut acc = [_mm256_setzero_ps(); GROUPS];
            for t in 0..rhs.rows {
                let xt = _mm256_set1_ps(*xp.add(t * xs));
                let row = base.add(t * rhs.rs);
                for (g, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(xt, _mm256_loadu_ps(row.add(g * LANES)), *a);
                }
            }
            store(acc)
        }
    }

    /// Groups `g0..g0 + G` of [`super::strided_groups_times`] into `out[..8 · G]`: per depth,
    /// one broadcast of `x[t]`, and per group one load and one fused multiply-add.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `G ≤ 8`; each group `g0 + i` (i < G) has `x.len() · 8` values
    /// from `(g0 + i) · stride` inside `grouped`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn strided_groups<const G: usize>(
        out: &mut [f32; 2 * TILE],
        x: &[f32],
        grouped: &[f32],
        stride: usize,
        g0: usize,
    ) {
        // SAFETY: the reads are those the caller vouches for; `out` holds 64 ≥ 8 · G values.
        unsafe {
            let base = grouped.as_ptr();
            let mut acc = [_mm256_setzero_ps(); G];
            for (t, &xt) in x.iter().enumerate() {
                let xt = _mm256_set1_ps(xt);
                for (i, a) in acc.iter_mut().enumerate() {
                    let p = base.add((g0 + i) * stride + t * GROUP);
                    *a = _mm256_fmadd_ps(xt, _mm256_loadu_ps(p), *a);
                }
            }
            for (i, a) in acc.into_iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(i * LANES), a);
            }
        }
    }

    /// `out[r][..8 · W]`: head `r`'s chains over `weights[r]`'s positions of the `8 · W`
    /// columns at `values` (rows `stride` apart), per position one load of each register of
    /// values for all `H` heads. With `take < 8` (W = 1) only `take` columns are read, the
    /// others' lanes are zeros.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `weights` has `H` rows of equal length `len`; `values[p ·
    /// stride + i]` is readable for p < len and i < 8 · W (i < take when take < 8).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn shared_sums<const H: usize, const W: usize>(
        out: &mut [[f32; 4 * LANES]; 3],
        weights: &[&[f32]],
        values: *const f32,
        stride: usize,
        take: usize,
    ) {
        // SAFETY: as the caller vouches; a partial register is read lane by lane.
        unsafe {
            let len = weights[0].len();
            let w: [*const f32; H] = std::array::from_fn(|r| weights[r].as_ptr());
            let mut acc = [[_mm256_setzero_ps(); W]; H];
            let partial = take < LANES;
            for p in 0..len {
                let row = values.add(p * stride);
                let x: [__m256; H] = std::array::from_fn(|r| _mm256_set1_ps(*w[r].add(p)));
                for i in 0..W {
                    let v = if partial {
                        let mut lanes = [0f32; LANES];
                        for (l, lane) in lanes.iter_mut().enumerate().take(take) {
                            *lane = *row.add(l);
                        }
                        _mm256_loadu_ps(lanes.as_ptr())
                    } else {
                        _mm256_loadu_ps(row.add(i * LANES))
                    };
                    for (a, &xr) in acc.iter_mut().zip(&x) {
                        a[i] = _mm256_fmadd_ps(xr, v, a[i]);
                    }
                }
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                for (i, &reg) in a.iter().enumerate() {
                    _mm256_storeu_ps(o.as_mut_ptr().add(i * LANES), reg);
                }
            }
        }
    }

    /// [`along_outputs`] for `2 · TILE` outputs in eight registers.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn along_outputs_wide(
        x: MatRef<'_, f32>,
        rhs: MatRef<'_, f32>,
        j0: usize,
    ) -> [f32; 2 * TILE] {
        const WIDE: usize = 2 * GROUPS;
        // SAFETY: as in `along_outputs`, every index read was checked by the caller.
        unsafe {
            let (xp, xs) = (x.data.as_ptr(), x.cs);
            let base = rhs.data.as_ptr().add(j0);
            let mut acc = [_mm256_setzero_ps(); WIDE];
            for t in 0..rhs.rows {
                let xt = _mm256_set1_ps(*xp.add(t * xs));
                let row = base.add(t * rhs.rs);
                for (g, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(xt, _mm256_loadu_ps(row.add(g * LANES)), *a);
                }
            }
            let mut out = [0f32; 2 * TILE];
            for (g, a) in acc.into_iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(g * LANES), a);
            }
            out
        }
    }

    /// The 8x8 transpose: `out[i]` lane `r` is `rows[r]` lane `i`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn transpose(r: [__m256; LANES]) -> [__m256; LANES] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }

    /// The tiles' running sum after depth cut `c` (whose chains are `acc`): the first cut's
    /// chains, then each later cut's added to the sum, as [`super::cut_chain`] adds them.
    #[target_feature(enable = "avx")]
    #[inline]
    fn add_cut(total: [__m256; GROUPS], acc: [__m256; GROUPS], c: usize) -> [__m256; GROUPS] {
        if c == 0 {
            return acc;
        }
        std::array::from_fn(|g| _mm256_add_ps(acc[g], total[g]))
    }

    /// The tile's registers as its outputs, in order.
    #[target_feature(enable = "avx")]
    #[inline]
    fn store(acc: [__m256; GROUPS]) -> [f32; TILE] {
        let mut out = [0f32; TILE];
        for (g, a) in acc.into_iter().enumerate() {
            // SAFETY: `out` holds `TILE` values; group `g` writes lanes `8g..8g + 8`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(g * LANES), a) };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::native::matmul::tests::{same_bits, values};

    /// The chains one output at a time, scalar: what every machine computes.
    fn scalar(
        alpha: Option<f32>,
        dst: &[f32],
        x: MatRef<'_, f32>,
        rhs: MatRef<'_, f32>,
    ) -> Vec<f32> {
        (0..rhs.cols)
            .map(|j| combine(alpha, dst[j], chain(x, rhs, j)))
            .collect()
    }

    #[test]
    fn simd_tiles_and_threads_give_the_scalar_chains_bits() {
        // Both layouts (weights along the depth: a linear layer's `[out, in]`, keys; along the
        // outputs: values), depths with and without a tail of the 8-wide transpose, output
        // counts with and without a partial tile, every combination with the destination.
        for (k, n) in [(1, 9), (7, 8), (8, 16), (64, 40), (288, 576), (517, 1000)] {
            let x = values(k, 1);
            let w = values(n * k, 2);
            let start = values(n, 3);
            let along_depth = MatRef::rows(&w, n, k).transposed();
            let along_outputs = MatRef::rows(&w, k, n);
            for rhs in [along_depth, along_outputs] {
                for alpha in [None, Some(0.0), Some(1.0), Some(0.75)] {
                    let want = scalar(alpha, &start, MatRef::rows(&x, 1, k), rhs);
                    for threads in [1, 2, 3] {
                        let mut got = start.clone();
                        row_times(&mut got, alpha, MatRef::rows(&x, 1, k), rhs, threads);
                        let same = same_bits(&got, &want);
                        assert!(
                            same,
                            "k {k}, n {n}, rs {}, alpha {alpha:?}, {threads} threads",
                            rhs.rs
                        );
                    }
                }
            }
        }
    }

    /// The grouped product (tiles from the regrouped copy, the rest along the rows) gives the
    /// bits of the row-major product, for f32 values and for values that are all bf16 (kept as
    /// 16 bits): output counts with partial tiles and groups, depths cut and uncut, 1-3 threads.
    #[test]
    fn grouped_values_give_the_row_products_bits() {
        for bf16 in [false, true] {
            for (k, n) in [(7, 32), (64, 40), (288, 100), (517, 70), (1568, 64)] {
                let x = values(k, 1);
                let mut w = values(n * k, 2);
                if bf16 {
                    w.iter_mut()
                        .for_each(|v| *v = f32::from_bits(v.to_bits() & 0xFFFF_0000));
                }
                let grouped = GroupedValues::new(&w, n, k);
                assert_eq!(matches!(grouped, GroupedValues::Bf16(_)), bf16);
                let rhs = MatRef::rows(&w, n, k).transposed();
                for threads in [1, 2, 3] {
                    let mut want = vec![0f32; n];
                    crate::runner::native::matmul::x_wt(&x, 1, k, &w, n, &mut want);
                    let mut scalar_chains = vec![0f32; n];
                    row_times(&mut scalar_chains, None, MatRef::rows(&x, 1, k), rhs, 1);
                    if k <= crate::runner::native::matmul::DEPTH_BLOCK {
                        assert_eq!(want, scalar_chains);
                    }
                    let mut got = vec![0f32; n];
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    pool.install(|| grouped_row_times(&mut got, &x, &w, &grouped, threads));
                    let same = same_bits(&got, &want);
                    assert!(same, "bf16 {bf16}, k {k}, n {n}, {threads} threads");
                }
            }
        }
    }

    /// Outputs grouped eight to a register, groups `stride` apart, give the row-major chains'
    /// bits: whole and partial groups, eight groups at a time and one, strides with gaps.
    #[test]
    fn strided_groups_give_the_row_products_bits() {
        for (n, k, gap) in [
            (1usize, 1usize, 0usize),
            (7, 64, 0),
            (9, 5, 24),
            (64, 64, 8),
            (130, 64, 512),
            (200, 17, 3),
        ] {
            let stride = k * GROUP + gap;
            let groups = n.div_ceil(GROUP);
            let grouped = values((groups - 1) * stride + k * GROUP, 4);
            let x = values(k, 5);
            // The same values row-major: output j's weights along the depth.
            let w: Vec<f32> = (0..n)
                .flat_map(|j| {
                    let at = (j / GROUP) * stride + j % GROUP;
                    (0..k).map(move |t| at + t * GROUP)
                })
                .map(|i| grouped[i])
                .collect();
            let mut want = vec![0f32; n];
            let rhs = MatRef::rows(&w, n, k).transposed();
            row_times(&mut want, None, MatRef::rows(&x, 1, k), rhs, 1);
            let mut got = vec![f32::NAN; n];
            strided_groups_times(&mut got, &x, &grouped, stride);
            let same = same_bits(&got, &want);
            assert!(same, "n {n}, k {k}, gap {gap}");
        }
    }

    #[test]
    fn a_strided_row_reads_only_its_own_elements() {
        // x every third element of a longer slice (a query head inside a row of heads).
        let (k, n) = (20, 16);
        let wide = values(3 * k, 4);
        let x = MatRef {
            data: &wide,
            rows: 1,
            cols: k,
            rs: 3 * k,
            cs: 3,
        };
        let packed: Vec<f32> = (0..k).map(|t| wide[3 * t]).collect();
        let w = values(n * k, 5);
        let rhs = MatRef::rows(&w, n, k).transposed();
        let mut a = vec![0f32; n];
        let mut b = vec![0f32; n];
        row_times(&mut a, None, x, rhs, 1);
        row_times(&mut b, None, MatRef::rows(&packed, 1, k), rhs, 1);
        assert_eq!(a, b);
    }

    #[test]
    fn non_finite_inputs_propagate_as_the_chain_does() {
        let (k, n) = (16, 8);
        let mut x = values(k, 6);
        x[5] = f32::INFINITY;
        let mut w = values(n * k, 7);
        w[3 * k + 5] = 0.0; // inf · 0 = NaN in output 3 only
        let rhs = MatRef::rows(&w, n, k).transposed();
        let mut got = vec![0f32; n];
        row_times(&mut got, None, MatRef::rows(&x, 1, k), rhs, 1);
        assert!(got[3].is_nan());
        assert!(
            got.iter()
                .enumerate()
                .all(|(j, v)| j == 3 || v.is_infinite())
        );
    }
}
