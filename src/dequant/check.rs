//! Shared validation (dtype, shape, byte length) and the row-parallel scaled-grid kernel.

use rayon::prelude::*;

use super::{Result, Stored};
use crate::checkpoint::dtype::Dtype;

/// `[4, 2]`, `[]`.
pub(super) fn shape_str(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// `F32, BF16 or F16`.
fn dtype_list(allowed: &[Dtype]) -> String {
    match allowed {
        [] => String::from("nothing"),
        [one] => one.name().to_string(),
        [init @ .., last] => {
            let names: Vec<&str> = init.iter().map(|d| d.name()).collect();
            format!("{} or {}", names.join(", "), last.name())
        }
    }
}

/// Checks the dtype is one of `allowed`.
pub(super) fn dtype_in(role: &str, t: &Stored, allowed: &[Dtype]) -> Result<()> {
    if allowed.contains(&t.dtype) {
        Ok(())
    } else {
        Err(format!(
            "{role} has dtype {}; expected {}",
            t.dtype.name(),
            dtype_list(allowed)
        ))
    }
}

/// Element count of `t`, after checking that the byte length is exactly what dtype and shape need.
pub(super) fn numel(role: &str, t: &Stored) -> Result<usize> {
    let n = t
        .shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            format!(
                "{role} has shape {} whose element count overflows",
                shape_str(t.shape)
            )
        })?;
    let need = u64::try_from(n)
        .ok()
        .and_then(|n| t.dtype.byte_len(n))
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            format!(
                "{role} has shape {} which is not a whole number of bytes of {}",
                shape_str(t.shape),
                t.dtype.name()
            )
        })?;
    if t.bytes.len() != need {
        return Err(format!(
            "{role} ({} {}) has {} bytes; that dtype and shape need {need}",
            t.dtype.name(),
            shape_str(t.shape),
            t.bytes.len()
        ));
    }
    Ok(n)
}

/// Checks dtype and byte length, and that the tensor is 2-D; returns `[rows, cols]`.
pub(super) fn matrix(role: &str, t: &Stored, allowed: &[Dtype]) -> Result<[usize; 2]> {
    dtype_in(role, t, allowed)?;
    numel(role, t)?;
    match t.shape {
        [r, c] => Ok([*r, *c]),
        _ => Err(format!(
            "{role} has shape {}; expected a 2-D tensor",
            shape_str(t.shape)
        )),
    }
}

/// Checks dtype, byte length and exact shape. `why` completes "... needs {expected}".
pub(super) fn exact(
    role: &str,
    t: &Stored,
    allowed: &[Dtype],
    expected: &[usize],
    why: &str,
) -> Result<()> {
    dtype_in(role, t, allowed)?;
    numel(role, t)?;
    if t.shape != expected {
        return Err(format!(
            "{role} has shape {}; {why} needs {}",
            shape_str(t.shape),
            shape_str(expected)
        ));
    }
    Ok(())
}

/// A one-element tensor of shape `[]` or `[1]`, decoded to f32.
pub(super) fn scalar(role: &str, t: &Stored, allowed: &[Dtype]) -> Result<f32> {
    dtype_in(role, t, allowed)?;
    numel(role, t)?;
    if !matches!(t.shape, [] | [1]) {
        return Err(format!(
            "{role} has shape {}; a per-tensor scale needs [] or [1]",
            shape_str(t.shape)
        ));
    }
    let v = super::floats::decode_all(role, t)?;
    v.first()
        .copied()
        .ok_or_else(|| format!("{role} is empty; a per-tensor scale needs one value"))
}

/// `a * b` or an error naming what overflowed.
pub(super) fn mul(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| format!("{what}: {a} * {b} overflows"))
}

/// The little-endian u32 word `i` of `bytes` (0 past the end; callers validate lengths first).
#[inline]
pub(super) fn word(bytes: &[u8], i: usize) -> u32 {
    let at = i.wrapping_mul(4);
    match bytes.get(at..at.wrapping_add(4)) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
        _ => 0,
    }
}

/// A zeroed `rows * cols` output buffer, or an error if the size overflows.
pub(super) fn output(rows: usize, cols: usize, role: &str) -> Result<Vec<f32>> {
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| format!("{role}: the dequantized size {rows} x {cols} overflows"))?;
    Ok(vec![0.0; n])
}

/// Runs `fill(first_row, tile)` over tiles of `tile_rows` full rows of `out`, in parallel.
pub(super) fn fill_tiles(
    out: &mut [f32],
    cols: usize,
    tile_rows: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    let Some(chunk) = cols.checked_mul(tile_rows.max(1)) else {
        return;
    };
    if chunk == 0 || out.is_empty() {
        return;
    }
    out.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(t, tile)| fill(t * tile_rows.max(1), tile));
}

/// Scales (and optional zero points) on a grid: the element at `(o, i)` uses
/// `scale[(o / rb) * scols + i / cb]`; the weight is `(q - z) * s`.
pub(super) struct Grid<'a> {
    pub scale: &'a [f32],
    pub zero: Option<&'a [f32]>,
    /// Rows per scale row.
    pub rb: usize,
    /// Columns per scale column.
    pub cb: usize,
    /// Scale columns.
    pub scols: usize,
}

/// Dequantizes a `[rows, cols]` weight against a scale [`Grid`]: `decode_row(o, row)` writes the
/// raw quantized values of row `o` (as f32), then each becomes `(q - z) * s`. The grid must cover
/// the weight (checked here, as a last defence).
pub(super) fn dequant_grid(
    rows: usize,
    cols: usize,
    grid: &Grid,
    decode_row: impl Fn(usize, &mut [f32]) + Sync + Send,
) -> Result<Vec<f32>> {
    let (rb, cb) = (grid.rb.max(1), grid.cb.max(1));
    let srows = rows.div_ceil(rb);
    let need = srows.saturating_mul(grid.scols);
    let covers_cols = grid.scols.checked_mul(cb).is_some_and(|c| c >= cols);
    let zero_ok = grid.zero.is_none_or(|z| z.len() >= need);
    if grid.scale.len() < need || !covers_cols || !zero_ok {
        return Err(format!(
            "internal: a scale grid of {} values ({} columns of {cb}) does not cover a {rows} x {cols} weight",
            grid.scale.len(),
            grid.scols
        ));
    }
    let mut out = output(rows, cols, "weight")?;
    fill_tiles(&mut out, cols, 1, |o, row| {
        decode_row(o, row);
        let base = (o / rb) * grid.scols;
        for (j, part) in row.chunks_mut(cb).enumerate() {
            let s = grid.scale[base + j];
            match grid.zero {
                Some(z) => {
                    let z = z[base + j];
                    part.iter_mut().for_each(|w| *w = (*w - z) * s);
                }
                None => part.iter_mut().for_each(|w| *w *= s),
            }
        }
    });
    Ok(out)
}

/// Row `o` of a row-major byte matrix with `width` bytes per row (empty if out of range; callers
/// validate lengths first).
#[inline]
pub(super) fn byte_row(bytes: &[u8], o: usize, width: usize) -> &[u8] {
    let start = o.saturating_mul(width);
    bytes.get(start..start.saturating_add(width)).unwrap_or(&[])
}
