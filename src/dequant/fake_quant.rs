//! Activation / KV fake quantization (quantize, then dequantize in place) emulating declared activation schemes.
//!
//! Every function works on rows of `cols` values (`x.len()` need not be a multiple: a trailing
//! partial row is treated as a row; `cols == 0` leaves `x` unchanged). All arithmetic is f32.

use rayon::prelude::*;

use super::floats::{round_to_e2m1, round_to_e4m3};

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 16;

/// `max |v|`, NaN if any value is NaN (like `torch.amax`).
fn amax(v: &[f32]) -> f32 {
    let mut m = 0.0f32;
    for &x in v {
        let a = x.abs();
        if a.is_nan() {
            return a;
        }
        if a > m {
            m = a;
        }
    }
    m
}

fn for_rows(x: &mut [f32], cols: usize, f: impl Fn(&mut [f32]) + Sync + Send) {
    if cols == 0 || x.is_empty() {
        return;
    }
    let chunk = cols.saturating_mul(ROWS_PER_TASK);
    x.par_chunks_mut(chunk)
        .for_each(|rows| rows.chunks_mut(cols).for_each(&f));
}

/// Dynamic per-token FP8: per row `scale = amax / 448` (f32), `x = e4m3(x / scale) * scale`;
/// a row with `amax == 0` is left unchanged.
///
/// Checked against: vllm-project/compressed-tensors `quantization/utils/helpers.py::
/// calculate_qparams` (symmetric: `max_abs / (bit_range / 2)` with the FP8 range [-448, 448], so
/// `amax / 448`; a zero scale becomes the dtype's eps, which maps a zero row to itself) and
/// `forward_helpers.py::_quantize_dequantize` (`x / scale`, clamp to ±448, cast to E4M3, times
/// scale). vLLM's CUDA kernel instead multiplies by `1 / scale` and floors the scale at
/// `1 / (448 * 512)`; those differ only at rounding ties and for near-zero rows.
pub fn fake_quant_fp8_per_token(x: &mut [f32], cols: usize) {
    for_rows(x, cols, |row| {
        let m = amax(row);
        if m == 0.0 {
            return;
        }
        let scale = m / 448.0;
        for v in row.iter_mut() {
            *v = round_to_e4m3(*v / scale) * scale;
        }
    });
}

/// Static per-tensor FP8: `x = e4m3(x / scale) * scale` (clamped to ±448 before rounding).
///
/// Checked against: vllm-project/compressed-tensors `forward_helpers.py::_quantize_dequantize`
/// with a stored `input_scale`.
pub fn fake_quant_fp8_static(x: &mut [f32], scale: f32) {
    x.par_chunks_mut(1 << 14).for_each(|c| {
        for v in c.iter_mut() {
            *v = round_to_e4m3(*v / scale) * scale;
        }
    });
}

/// Dynamic per-token symmetric INT8: per row `scale = amax / 127` (f32),
/// `q = clamp(round_half_even(x / scale), -128, 127)`, `x = q * scale`; `amax == 0` leaves the
/// row unchanged.
///
/// Checked against: vllm-project/vllm `csrc/quantization/compressed_tensors/
/// int8_quant_kernels.cu` (`scale = absmax / 127`, `cvt.rni.sat.s8.f32`: round to nearest even,
/// saturate to [-128, 127]). That kernel multiplies by `127 / absmax` rather than dividing by the
/// scale (a difference only at rounding ties). compressed-tensors' own fake quant differs: its
/// `calculate_qparams` uses `amax / 127.5` (half of the [-128, 127] range), so its grid is
/// slightly finer; this follows the vLLM kernel that serves such checkpoints.
pub fn fake_quant_int8_per_token(x: &mut [f32], cols: usize) {
    for_rows(x, cols, |row| {
        let m = amax(row);
        if m == 0.0 {
            return;
        }
        let scale = m / 127.0;
        for v in row.iter_mut() {
            let q = (*v / scale).round_ties_even().clamp(-128.0, 127.0);
            *v = q * scale;
        }
    });
}

/// NVFP4 dynamic ("local") activation quantization: per 16 consecutive values of a row,
/// `s = e4m3(global_scale * (amax / 6))` (0 replaced by 0.125, the E4M3 eps), then
/// `scale = s / global_scale` and `x = e2m1(clamp(x / scale, -6, 6)) * scale`.
///
/// Checked against: vllm-project/compressed-tensors `helpers.py::compute_dynamic_scales_and_zp`
/// -> `calculate_qparams` (`max_abs / 6`, times `global_scale`, rounded to the FP8 `scale_dtype`
/// with a clamp to ±448, zero scales -> `_get_dtype_eps(float8_e4m3fn) = 0.125`) and
/// `forward_helpers.py::_quantize_dequantize` (`scale / global_scale`, `x / scale`, clamp ±6,
/// `cast_to_fp4`, times scale). A trailing group shorter than 16 is its own group.
pub fn fake_quant_nvfp4(x: &mut [f32], cols: usize, global_scale: f32) {
    for_rows(x, cols, |row| {
        for g in row.chunks_mut(16) {
            let m = amax(g);
            let mut s = round_to_e4m3(global_scale * (m / 6.0));
            if s == 0.0 {
                s = 0.125;
            }
            let scale = s / global_scale;
            for v in g.iter_mut() {
                *v = round_to_e2m1((*v / scale).clamp(-6.0, 6.0)) * scale;
            }
        }
    });
}
