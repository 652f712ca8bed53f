//! compressed-tensors integer/FP8 formats: dense (`int-`/`float-`/`naive-quantized`) and `pack-quantized`.

use super::check::{
    Grid, byte_row, dequant_grid, dtype_in, exact, fill_tiles, matrix, numel, output, shape_str,
};
use super::floats::{E4M3, decode_all};
use super::int::{Packing, stream_field, unpack_row};
use super::{Result, Stored};
use crate::checkpoint::dtype::Dtype;

/// The `strategy` of a compressed-tensors weight `QuantizationArgs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtStrategy {
    Tensor,
    Channel,
    Group,
    Block,
    /// Group scales plus a global scale (NVFP4): only [`super::ct_nvfp4`] handles it.
    TensorGroup,
}

/// The weight `QuantizationArgs` fields that shape the scales.
#[derive(Debug, Clone)]
pub struct CtArgs {
    pub strategy: CtStrategy,
    pub group_size: Option<usize>,
    /// `block_structure` `[rows, cols]`.
    pub block: Option<[usize; 2]>,
}

const SCALE_DTYPES: &[Dtype] = &[Dtype::F32, Dtype::BF16, Dtype::F16];

/// The scale grid of a strategy over a `[rows, cols]` weight: `(expected scale shape, rb, cb,
/// scols, why)` where `why` completes the "needs" error sentence.
fn layout(
    args: &CtArgs,
    rows: usize,
    cols: usize,
) -> Result<(Vec<usize>, usize, usize, usize, String)> {
    match args.strategy {
        CtStrategy::Tensor => Ok((
            vec![1],
            rows.max(1),
            cols.max(1),
            1,
            String::from("a per-tensor scale"),
        )),
        CtStrategy::Channel => Ok((
            vec![rows, 1],
            1,
            cols.max(1),
            1,
            format!("a per-channel scale over {rows} output rows"),
        )),
        CtStrategy::Group => {
            let g = match args.group_size {
                Some(g) if g > 0 => g,
                Some(_) => return Err(String::from("strategy group has group_size 0")),
                None => return Err(String::from("strategy group needs a group_size")),
            };
            let ng = cols.div_ceil(g);
            Ok((
                vec![rows, ng],
                1,
                g,
                ng,
                format!("a group size of {g} over {cols} input columns"),
            ))
        }
        CtStrategy::Block => {
            let [b0, b1] = match args.block {
                Some([b0, b1]) if b0 > 0 && b1 > 0 => [b0, b1],
                Some(b) => {
                    return Err(format!(
                        "strategy block has block_structure {}; both sides must be positive",
                        shape_str(&b)
                    ));
                }
                None => return Err(String::from("strategy block needs a block_structure")),
            };
            let (sr, sc) = (rows.div_ceil(b0), cols.div_ceil(b1));
            Ok((
                vec![sr, sc],
                b0,
                b1,
                sc,
                format!("a {b0}x{b1} block structure over a {rows} x {cols} weight"),
            ))
        }
        CtStrategy::TensorGroup => Err(String::from(
            "strategy tensor_group (NVFP4) carries a global scale; dequantize it with ct_nvfp4",
        )),
    }
}

/// Checks a scale-shaped tensor (scale or unpacked zero point) against the strategy's shape.
/// A per-tensor scale may be `[]` or `[1]`.
fn check_scale_shape(role: &str, t: &Stored, expected: &[usize], why: &str) -> Result<()> {
    let ok = if expected == [1] {
        matches!(t.shape, [] | [1])
    } else {
        t.shape == expected
    };
    if ok {
        Ok(())
    } else {
        let want = if expected == [1] {
            String::from("[] or [1]")
        } else {
            shape_str(expected)
        };
        Err(format!(
            "{role} has shape {}; {why} needs {want}",
            shape_str(t.shape)
        ))
    }
}

/// compressed-tensors `int-quantized` / `float-quantized` / `naive-quantized`: `weight` I8 or
/// F8_E4M3 `[out, in]`, `weight_scale` by strategy (tensor `[]`/`[1]`, channel `[out, 1]`, group
/// `[out, ceil(in/g)]`, block `[ceil(out/b0), ceil(in/b1)]`), optional `weight_zero_point` of the
/// scale's shape: `w = (q - zp) * scale`.
///
/// Checked against: vllm-project/compressed-tensors `quantization/lifecycle/forward.py`
/// (`dequantize` -> `_process_group` / `_process_block`) and `forward_helpers.py::_dequantize`
/// (`x_q.to(scale.dtype) - zero_point`, then `* scale`). Block scales are padded (`ceil`) as in
/// `maybe_pad_tensor_for_block_quant`. Differences: the reference multiplies in the scale dtype
/// (bf16 rounding); here the product is taken in f32 (exact for I8 with f16/bf16 scales).
/// Zero points may be I8/I32 or float. `TensorGroup` is refused (use [`super::ct_nvfp4`]).
pub fn ct_dense(
    weight: Stored,
    scale: Stored,
    zero_point: Option<Stored>,
    args: &CtArgs,
) -> Result<Vec<f32>> {
    let [rows, cols] = matrix("weight", &weight, &[Dtype::I8, Dtype::F8_E4M3])?;
    let (expected, rb, cb, scols, why) = layout(args, rows, cols)?;
    dtype_in("weight_scale", &scale, SCALE_DTYPES)?;
    numel("weight_scale", &scale)?;
    check_scale_shape("weight_scale", &scale, &expected, &why)?;
    let s = decode_all("weight_scale", &scale)?;
    let z = match &zero_point {
        Some(zp) => {
            dtype_in(
                "weight_zero_point",
                zp,
                &[Dtype::I8, Dtype::I32, Dtype::F32, Dtype::BF16, Dtype::F16],
            )?;
            numel("weight_zero_point", zp)?;
            check_scale_shape("weight_zero_point", zp, &expected, &why)?;
            Some(decode_all("weight_zero_point", zp)?)
        }
        None => None,
    };
    let grid = Grid {
        scale: &s,
        zero: z.as_deref(),
        rb,
        cb,
        scols,
    };
    let bytes = weight.bytes;
    match weight.dtype {
        Dtype::I8 => dequant_grid(rows, cols, &grid, |o, row| {
            for (w, &b) in row.iter_mut().zip(byte_row(bytes, o, cols)) {
                *w = f32::from(b as i8);
            }
        }),
        _ => dequant_grid(rows, cols, &grid, |o, row| {
            for (w, &b) in row.iter_mut().zip(byte_row(bytes, o, cols)) {
                *w = E4M3[b as usize];
            }
        }),
    }
}

/// compressed-tensors `pack-quantized`: `weight_packed` I32 `[out, ceil(in*bits/32)]`, logical
/// `shape` `[out, in]` (from `weight_shape`), `weight_scale` by strategy, optional
/// `weight_zero_point` (packed I32 `[ceil(out*bits/32), ngroups]` for group/channel, or I8 of the
/// scale's shape), optional `weight_g_idx` I32 `[in]`. `bits` 1..=8.
///
/// Checked against: vllm-project/compressed-tensors `compressors/pack_quantized/helpers.py`
/// (`pack_to_int32` / `unpack_from_int32`) and `pack_quantized/base.py::decompress`:
/// - values are stored offset: `u = q + 2^(bits-1)`, and zero points the same way, so
///   `w = ((u - off) - (uz - off)) * s`;
/// - packing is dense and LSB-first within a row: element `i` starts at bit `i*bits` of the
///   row's little-endian word stream and may straddle two words (`ceil(in*bits/32)` words).
///   For bits 1, 2, 4, 8 this is the same as the older `32/bits`-per-word packing. For 3, 5, 6,
///   7 bits the older releases (before "Support arbitrary 1-8 bit INT weight packing", #715)
///   put `floor(32/bits)` values per word without straddling; that layout is recognised by its
///   word count `ceil(in/floor(32/bits))` and decoded too (an error if the two counts coincide
///   for a row of more than one word, since it would be ambiguous);
/// - zero points are packed along dim 0 (output rows) for group and channel strategies only;
/// - `g_idx`: `-1` anywhere means column order (as `_process_group`'s `-1 in g_idx`);
///   otherwise column `i` uses scale column `g_idx[i]` (vLLM's kernels' semantics; the
///   reference's argsort-based grouping gives the same result for any well-formed g_idx). Used
///   only with the group strategy, like the reference.
pub fn ct_pack_quantized(
    packed: Stored,
    shape: [usize; 2],
    bits: u32,
    scale: Stored,
    zero_point: Option<Stored>,
    g_idx: Option<Stored>,
    args: &CtArgs,
) -> Result<Vec<f32>> {
    if !(1..=8).contains(&bits) {
        return Err(format!(
            "pack-quantized supports num_bits 1 to 8; got {bits}"
        ));
    }
    let [rows, cols] = shape;
    let [prow, pcols] = matrix("weight_packed", &packed, &[Dtype::I32])?;
    let row_packing = Packing::detect("weight_packed", cols, bits, pcols)?;
    if prow != rows {
        return Err(format!(
            "weight_packed has shape {}; weight_shape {} needs {rows} rows",
            shape_str(packed.shape),
            shape_str(&shape)
        ));
    }
    let (expected, rb, cb, scols, why) = layout(args, rows, cols)?;
    dtype_in("weight_scale", &scale, SCALE_DTYPES)?;
    numel("weight_scale", &scale)?;
    check_scale_shape("weight_scale", &scale, &expected, &why)?;
    let s = decode_all("weight_scale", &scale)?;
    let off = 1i32 << (bits - 1);

    // Zero points, as signed f32 values laid out like the scale.
    let z: Option<Vec<f32>> = match &zero_point {
        None => None,
        Some(zp) if zp.dtype == Dtype::I32 => {
            Some(packed_zero_points(zp, args, rows, scols, bits)?)
        }
        Some(zp) => {
            dtype_in("weight_zero_point", zp, &[Dtype::I8, Dtype::I32])?; // I32 handled above
            numel("weight_zero_point", zp)?;
            check_scale_shape("weight_zero_point", zp, &expected, &why)?;
            Some(decode_all("weight_zero_point", zp)?)
        }
    };
    let groups = activation_order(g_idx.as_ref(), args.strategy, cols, scols)?;

    let bytes = packed.bytes;
    let decode_row = |o: usize, row: &mut [f32]| {
        let words = byte_row(bytes, o, pcols.saturating_mul(4));
        unpack_row(words, bits, row_packing, row);
        row.iter_mut().for_each(|w| *w -= off as f32);
    };
    match groups {
        None => {
            let grid = Grid {
                scale: &s,
                zero: z.as_deref(),
                rb,
                cb,
                scols,
            };
            dequant_grid(rows, cols, &grid, decode_row)
        }
        Some(groups) => {
            // Group strategy: one scale row per output row.
            let mut out = output(rows, cols, "weight_packed")?;
            let (s, z) = (&s, z.as_deref());
            fill_tiles(&mut out, cols, 1, |o, row| {
                decode_row(o, row);
                let base = o * scols;
                for (w, &g) in row.iter_mut().zip(&groups) {
                    let k = base + g as usize;
                    let zz = z.map_or(0.0, |z| z[k]);
                    *w = (*w - zz) * s[k];
                }
            });
            Ok(out)
        }
    }
}

/// Zero points packed into I32 words along the output rows (group and channel strategies
/// only), as signed f32 values laid out like the scale: `[rows, scols]`.
fn packed_zero_points(
    zp: &Stored,
    args: &CtArgs,
    rows: usize,
    scols: usize,
    bits: u32,
) -> Result<Vec<f32>> {
    let off = 1i32 << (bits - 1);
    let mask = (1u32 << bits) - 1;
    if !matches!(args.strategy, CtStrategy::Group | CtStrategy::Channel) {
        return Err(format!(
            "weight_zero_point is packed I32, but the {:?} strategy stores zero points unpacked (I8)",
            args.strategy
        ));
    }
    let [zr, zc] = matrix("weight_zero_point", zp, &[Dtype::I32])?;
    if zc != scols {
        return Err(format!(
            "weight_zero_point has shape {}; packed along the {rows} output rows with {scols} scale columns it needs {} columns",
            shape_str(zp.shape),
            scols
        ));
    }
    let zpack = Packing::detect("weight_zero_point", rows, bits, zr)?;
    // rows * scols is bounded by the validated zero-point bytes (or is 0).
    let mut v = vec![0.0f32; rows.saturating_mul(scols)];
    for j in 0..scols {
        for o in 0..rows {
            let u = stream_field(zp.bytes, j, scols, o, bits, zpack) & mask;
            if let Some(x) = v.get_mut(o * scols + j) {
                *x = (u as i32 - off) as f32;
            }
        }
    }
    Ok(v)
}

/// Activation order (`weight_g_idx`): the scale column of each input column, for the group
/// strategy; `None` when absent, all `-1`-marked, or outside group strategies (where it is
/// still checked for shape).
fn activation_order(
    g_idx: Option<&Stored>,
    strategy: CtStrategy,
    cols: usize,
    scols: usize,
) -> Result<Option<Vec<u32>>> {
    let Some(g) = g_idx else {
        return Ok(None);
    };
    exact(
        "weight_g_idx",
        g,
        &[Dtype::I32],
        &[cols],
        &format!("a weight with {cols} input columns"),
    )?;
    if strategy != CtStrategy::Group {
        // The reference ignores g_idx outside group strategies; still check it is sane.
        return Ok(None);
    }
    let raw: Vec<i32> = g
        .bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    if raw.contains(&-1) {
        return Ok(None);
    }
    let mut v = Vec::with_capacity(raw.len());
    for (i, &x) in raw.iter().enumerate() {
        match u32::try_from(x) {
            Ok(u) if (u as usize) < scols => v.push(u),
            _ => {
                return Err(format!(
                    "weight_g_idx[{i}] is {x}; weight_scale has {scols} groups (valid: 0 to {})",
                    scols.saturating_sub(1)
                ));
            }
        }
    }
    Ok(Some(v))
}
