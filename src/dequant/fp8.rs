//! Fine-grained block FP8 (`quant_method: fp8`, DeepSeek-V3 / Qwen3-FP8): FP8 E4M3 weights with per-block inverse scales.

use super::check::{Grid, byte_row, dequant_grid, dtype_in, matrix, numel, shape_str};
use super::floats::{E4M3, decode_all};
use super::{Result, Stored};
use crate::checkpoint::dtype::Dtype;

/// Decodes UE8M0 scale bytes (`2^(b-127)`), refusing `0xFF` (NaN) with its position.
pub(super) fn ue8m0_scales(role: &str, bytes: &[u8], cols: usize) -> Result<Vec<f32>> {
    if let Some(at) = bytes.iter().position(|&b| b == 0xFF) {
        let (r, c) = (at / cols.max(1), at % cols.max(1));
        return Err(format!(
            "{role}[{r}][{c}] is 0xFF, the NaN encoding of UE8M0; no valid checkpoint stores it"
        ));
    }
    Ok(bytes
        .iter()
        .map(|&b| super::floats::e8m0_to_f32(b))
        .collect())
}

/// Fine-grained FP8: `weight` F8_E4M3 `[out, in]`, `weight_scale_inv` `[ceil(out/b0),
/// ceil(in/b1)]` (the dequant multiplier): `w = fp8 * scale_inv`. Scales F32/BF16/F16, or UE8M0
/// (dtype F8_E8M0, or U8 with `ue8m0 = true`). With `ue8m0 = true` float scales are used as
/// stored (DeepSeek's `scale_fmt: ue8m0` checkpoints store power-of-two F32 scales).
///
/// Checked against: huggingface/transformers `integrations/finegrained_fp8.py` (`FP8Linear`
/// allocates `weight_scale_inv` as `[ceil(out/b0), ceil(in/b1)]`; `Fp8Dequantize`:
/// `quantized.to(float32) * scales.to(float32)` broadcast over each block, which there requires
/// exact tiling; partial last blocks follow the Triton GEMM's `offs // group` indexing) and
/// vllm-project/vllm `quantization/utils/fp8_utils.py`. A UE8M0 byte `0xFF` (NaN) is an error.
pub fn fp8_block(
    weight: Stored,
    scale_inv: Stored,
    block: [usize; 2],
    ue8m0: bool,
) -> Result<Vec<f32>> {
    let [rows, cols] = matrix("weight", &weight, &[Dtype::F8_E4M3])?;
    let [b0, b1] = block;
    if b0 == 0 || b1 == 0 {
        return Err(format!(
            "weight_block_size {} must be positive",
            shape_str(&block)
        ));
    }
    let allowed: &[Dtype] = if ue8m0 {
        &[
            Dtype::F8_E8M0,
            Dtype::U8,
            Dtype::F32,
            Dtype::BF16,
            Dtype::F16,
        ]
    } else {
        &[Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F8_E8M0]
    };
    dtype_in("weight_scale_inv", &scale_inv, allowed).map_err(|e| {
        if scale_inv.dtype == Dtype::U8 {
            format!("{e} (a U8 weight_scale_inv is read as UE8M0 only when scale_fmt is ue8m0)")
        } else {
            e
        }
    })?;
    numel("weight_scale_inv", &scale_inv)?;
    let (sr, sc) = (rows.div_ceil(b0), cols.div_ceil(b1));
    if scale_inv.shape != [sr, sc] {
        return Err(format!(
            "weight_scale_inv has shape {}; a {b0}x{b1} block over a {rows} x {cols} weight needs {}",
            shape_str(scale_inv.shape),
            shape_str(&[sr, sc])
        ));
    }
    let s = match scale_inv.dtype {
        Dtype::F8_E8M0 | Dtype::U8 => ue8m0_scales("weight_scale_inv", scale_inv.bytes, sc)?,
        _ => decode_all("weight_scale_inv", &scale_inv)?,
    };
    let grid = Grid {
        scale: &s,
        zero: None,
        rb: b0,
        cb: b1,
        scols: sc,
    };
    let bytes = weight.bytes;
    dequant_grid(rows, cols, &grid, |o, row| {
        for (w, &b) in row.iter_mut().zip(byte_row(bytes, o, cols)) {
            *w = E4M3[b as usize];
        }
    })
}
