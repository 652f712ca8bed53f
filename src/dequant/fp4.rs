//! FP4 E2M1 weights: NVFP4 (compressed-tensors, ModelOpt) and MXFP4 (compressed-tensors, OCP / gpt-oss / ModelOpt).

use super::check::{
    Grid, byte_row, dequant_grid, dtype_in, exact, matrix, numel, scalar, shape_str,
};
use super::floats::{E2M1, E4M3};
use super::fp8::ue8m0_scales;
use super::{Result, Stored};
use crate::checkpoint::dtype::Dtype;

/// Dequantizes packed E2M1 (`[rows, cols/2]` bytes, low nibble = even column) against
/// per-`block`-column effective scales `eff` (`[rows, ceil(cols/block)]`).
fn fp4_grid(bytes: &[u8], rows: usize, cols: usize, block: usize, eff: &[f32]) -> Result<Vec<f32>> {
    let half = cols / 2;
    let grid = Grid {
        scale: eff,
        zero: None,
        rb: 1,
        cb: block,
        scols: cols.div_ceil(block),
    };
    dequant_grid(rows, cols, &grid, |o, row| {
        for (pair, &b) in row.chunks_exact_mut(2).zip(byte_row(bytes, o, half)) {
            pair[0] = E2M1[(b & 0x0F) as usize];
            pair[1] = E2M1[(b >> 4) as usize];
        }
    })
}

/// The FP8 E4M3 block scales of an NVFP4 weight, refusing NaN bytes.
fn e4m3_scales(role: &str, t: &Stored, scols: usize) -> Result<Vec<f32>> {
    if let Some(at) = t.bytes.iter().position(|&b| b & 0x7F == 0x7F) {
        return Err(format!(
            "{role}[{}][{}] is NaN (FP8 E4M3 byte 0x{:02X})",
            at / scols.max(1),
            at % scols.max(1),
            t.bytes[at]
        ));
    }
    Ok(t.bytes.iter().map(|&b| E4M3[b as usize]).collect())
}

/// Validates an NVFP4 pair: packed U8 `[out, in/2]` and F8_E4M3 block scales `[out, ceil(in/16)]`.
fn nvfp4_parts(
    wrole: &str,
    w: &Stored,
    srole: &str,
    s: &Stored,
) -> Result<(usize, usize, Vec<f32>)> {
    let [rows, half] = matrix(wrole, w, &[Dtype::U8])?;
    let cols = half * 2;
    let scols = cols.div_ceil(16);
    exact(
        srole,
        s,
        &[Dtype::F8_E4M3],
        &[rows, scols],
        &format!("a group size of 16 over {cols} input columns ({half} packed bytes)"),
    )?;
    Ok((rows, cols, e4m3_scales(srole, s, scols)?))
}

/// compressed-tensors `nvfp4-pack-quantized`: `weight_packed` U8 `[out, in/2]`, `weight_scale`
/// F8_E4M3 `[out, in/16]`, `weight_global_scale` F32 `[]` or `[1]`:
/// `w = fp4 * (scale / global_scale)`, the quotient taken first, in f32.
///
/// Checked against: vllm-project/compressed-tensors `compressors/nvfp4/base.py::decompress`
/// (scale cast to the unpacked dtype, bf16, which is exact for E4M3), `nvfp4/helpers.py::
/// unpack_fp4_from_uint8` (low nibble first, sign bit 0x08) and `forward_helpers.py::
/// _dequantize` (`scale = scale / global_scale`, then `x_q.to(scale.dtype) * scale`). With the
/// `[1]`-shaped F32 global scale that llm-compressor writes, torch promotes the division to f32,
/// as here (with a 0-dim global scale torch would round the quotient to bf16). The reference
/// finally casts the weight to bf16; this returns the f32 value. A zero or non-finite global
/// scale, or a NaN block scale, is an error.
pub fn ct_nvfp4(packed: Stored, scale: Stored, global_scale: Stored) -> Result<Vec<f32>> {
    let (rows, cols, s) = nvfp4_parts("weight_packed", &packed, "weight_scale", &scale)?;
    let gs = scalar("weight_global_scale", &global_scale, &[Dtype::F32])?;
    if !gs.is_finite() || gs == 0.0 {
        return Err(format!(
            "weight_global_scale is {gs}; dequantization divides by it, so it must be finite and non-zero"
        ));
    }
    let eff: Vec<f32> = s.iter().map(|&v| v / gs).collect();
    fp4_grid(packed.bytes, rows, cols, 16, &eff)
}

/// NVIDIA ModelOpt NVFP4: `weight` U8 `[out, in/2]`, `weight_scale` F8_E4M3 `[out, in/16]`,
/// `weight_scale_2` F32 `[]` or `[1]`: `w = fp4 * (scale * scale_2)`, the scale product first.
///
/// Checked against: NVIDIA/Model-Optimizer `modelopt/torch/quantization/qtensor/
/// nvfp4_tensor.py::NVFP4QTensor.dequantize` (`per_block_scale = scale.to(float32) *
/// double_scale`, then the unpacked E2M1 values, low nibble = even index, times
/// `per_block_scale`; then `.to(dtype)`, which this does not do). Gives the same weight as
/// [`ct_nvfp4`] when `scale_2 = 1 / global_scale` and both are powers of two.
pub fn modelopt_nvfp4(weight: Stored, scale: Stored, scale_2: Stored) -> Result<Vec<f32>> {
    let (rows, cols, s) = nvfp4_parts("weight", &weight, "weight_scale", &scale)?;
    let s2 = scalar("weight_scale_2", &scale_2, &[Dtype::F32])?;
    if !s2.is_finite() {
        return Err(format!("weight_scale_2 is {s2}; it must be finite"));
    }
    let eff: Vec<f32> = s.iter().map(|&v| v * s2).collect();
    fp4_grid(weight.bytes, rows, cols, 16, &eff)
}

/// compressed-tensors `mxfp4-pack-quantized`: `weight_packed` U8 `[out, in/2]`, `weight_scale`
/// U8 or F8_E8M0 `[out, ceil(in/32)]`: `w = fp4 * 2^(scale - 127)`.
///
/// Checked against: vllm-project/compressed-tensors `compressors/mxfp4/base.py` (inherits the
/// NVFP4 unpacking; `_decompress_scale` = `mx_utils.py::decompress_mx_scale`, `2 ** (e - 127)`)
/// and `forward_helpers.py::_dequantize` (no global scale). Scale byte `0xFF` is an error (the
/// reference gives +inf).
pub fn ct_mxfp4(packed: Stored, scale: Stored) -> Result<Vec<f32>> {
    let [rows, half] = matrix("weight_packed", &packed, &[Dtype::U8])?;
    let cols = half * 2;
    let scols = cols.div_ceil(32);
    exact(
        "weight_scale",
        &scale,
        &[Dtype::U8, Dtype::F8_E8M0],
        &[rows, scols],
        &format!("a group size of 32 over {cols} input columns ({half} packed bytes)"),
    )?;
    let eff = ue8m0_scales("weight_scale", scale.bytes, scols)?;
    fp4_grid(packed.bytes, rows, cols, 32, &eff)
}

/// MXFP4 (OCP MX: E2M1 values in blocks of 32 sharing a UE8M0 scale), in either layout:
/// - gpt-oss / transformers: `blocks` U8 `[..., G, 16]` with `scales` `[..., G]`;
/// - ModelOpt `dequantize_packed` / DeepSeek-V4 (and compressed-tensors): `blocks` U8
///   `[..., K/2]` with `scales` `[..., ceil(K/32)]`.
///
/// Both are the same bytes: returns row-major `[..., K]` (for gpt-oss `[..., rows, G*32]`, i.e.
/// `[experts, out, in]`, *without* the final `transpose(1, 2)` transformers applies to fit its
/// `[experts, in, out]` parameters). Scales U8 or F8_E8M0; `0xFF` is an error.
///
/// Checked against: huggingface/transformers `integrations/mxfp4.py::convert_moe_packed_tensors`
/// (low nibble -> even index, `ldexp(lut[idx], scales - 127)`), NVIDIA/Model-Optimizer
/// `qtensor/mxfp4_tensor.py::MXFP4QTensor.dequantize_packed` (same, last-dim layout). Both map
/// `0xFF` to 2^128 (+inf in bf16) while the OCP spec calls it NaN; no real checkpoint stores it.
pub fn mxfp4(blocks: Stored, scales: Stored) -> Result<Vec<f32>> {
    dtype_in("blocks", &blocks, &[Dtype::U8])?;
    numel("blocks", &blocks)?;
    dtype_in("scales", &scales, &[Dtype::U8, Dtype::F8_E8M0])?;
    numel("scales", &scales)?;
    let (b, s) = (blocks.shape, scales.shape);
    let layout_err = || {
        format!(
            "blocks has shape {} and scales {}; MXFP4 needs blocks [..., G, 16] with scales [..., G] (gpt-oss), or blocks [..., K/2] with scales [..., ceil(K/32)]",
            shape_str(b),
            shape_str(s)
        )
    };
    let (prefix, half, scols) = match (b.split_last(), s.split_last()) {
        // gpt-oss: blocks [..., G, 16], scales [..., G].
        (Some((&16, bp)), Some((&g, _))) if b.len() == s.len() + 1 && bp == s => {
            let rows_prefix = &bp[..bp.len().saturating_sub(1)];
            (rows_prefix, g.checked_mul(16).ok_or_else(layout_err)?, g)
        }
        // Last-dim layout: blocks [..., K/2], scales [..., K/32].
        (Some((&half, bp)), Some((&sc, sp))) if b.len() == s.len() && bp == sp => {
            if sc != (half * 2).div_ceil(32) {
                return Err(format!(
                    "scales has shape {}; a group size of 32 over {} values ({half} packed bytes) needs {} in the last dimension",
                    shape_str(s),
                    half * 2,
                    (half * 2).div_ceil(32)
                ));
            }
            (bp, half, sc)
        }
        _ => return Err(layout_err()),
    };
    let rows = prefix
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(layout_err)?;
    let cols = half * 2;
    if cols.div_ceil(32) != scols {
        return Err(layout_err());
    }
    let eff = ue8m0_scales("scales", scales.bytes, scols)?;
    fp4_grid(blocks.bytes, rows, cols, 32, &eff)
}
