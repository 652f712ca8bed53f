//! Scalar decoders (FP8 E4M3/E5M2, E8M0, FP4 E2M1), plain upcasts, and round-to-format helpers.

use rayon::prelude::*;

use super::check::{dtype_in, numel};
use super::{Result, Stored};
use crate::checkpoint::dtype::Dtype;

/// `2^e` for a normal-range exponent, built from bits (usable in const context).
const fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

const fn build_e4m3() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut b = 0usize;
    while b < 256 {
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0f32 };
        let e = ((b >> 3) & 0xF) as i32;
        let m = (b & 0x7) as f32;
        let mag = if e == 0xF && (b & 0x7) == 0x7 {
            f32::NAN
        } else if e == 0 {
            m * pow2(-9)
        } else {
            (1.0 + m / 8.0) * pow2(e - 7)
        };
        t[b] = sign * mag;
        b += 1;
    }
    t
}

const fn build_e5m2() -> [f32; 256] {
    let mut t = [0.0f32; 256];
    let mut b = 0usize;
    while b < 256 {
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0f32 };
        let e = ((b >> 2) & 0x1F) as i32;
        let m = (b & 0x3) as f32;
        let mag = if e == 0x1F {
            if b & 0x3 == 0 {
                f32::INFINITY
            } else {
                f32::NAN
            }
        } else if e == 0 {
            m * pow2(-16)
        } else {
            (1.0 + m / 4.0) * pow2(e - 15)
        };
        t[b] = sign * mag;
        b += 1;
    }
    t
}

/// Every E4M3FN byte decoded (index = byte).
pub(super) static E4M3: [f32; 256] = build_e4m3();
static E5M2: [f32; 256] = build_e5m2();

/// E2M1 nibble values (index = nibble; bit 3 is the sign).
pub(super) static E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// FP8 E4M3FN (OCP "fn": bias 7, no infinities, S.1111.111 is NaN, max ±448) to f32, exactly.
///
/// Checked against: pytorch `c10/util/Float8_e4m3fn.h` semantics as used by compressed-tensors
/// (`FP8_E4M3_DATA`, quant_args.py) and the OCP FP8 spec: subnormals `m * 2^-9`, normals
/// `(1 + m/8) * 2^(e-7)`.
#[inline]
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    E4M3[b as usize]
}

/// FP8 E5M2 (IEEE-like: bias 15, infinities at S.11111.00, NaN at S.11111.{01,10,11}) to f32.
///
/// Checked against: OCP FP8 spec / torch `float8_e5m2` (the upper byte of an IEEE f16).
#[inline]
pub fn fp8_e5m2_to_f32(b: u8) -> f32 {
    E5M2[b as usize]
}

/// UE8M0 (OCP MX scale): `2^(b - 127)`, `0xFF` is NaN. `b = 0` gives `2^-127` (an f32 subnormal).
///
/// Checked against: compressed-tensors `compressors/mx_utils.py::decompress_mx_scale`
/// (`2 ** (scale - 127)`), transformers `integrations/mxfp4.py` (`ldexp(lut, scales - 127)`).
/// Both of those turn `0xFF` into `2^128` (+inf in bf16); the OCP spec makes it NaN, as here.
#[inline]
pub fn e8m0_to_f32(b: u8) -> f32 {
    match b {
        0xFF => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits(u32::from(b) << 23),
    }
}

/// FP4 E2M1 nibble (low 4 bits of `nibble`; bit 3 is the sign) to f32: ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}.
///
/// Checked against: compressed-tensors `compressors/nvfp4/helpers.py` (`kE2M1ToFloat`, sign bit
/// 0x08) and ModelOpt `qtensor/nvfp4_tensor.py` (`e2m1_values`).
#[inline]
pub fn fp4_e2m1_to_f32(nibble: u8) -> f32 {
    E2M1[(nibble & 0x0F) as usize]
}

fn convert<const W: usize>(bytes: &[u8], f: impl Fn([u8; W]) -> f32 + Sync + Send) -> Vec<f32> {
    const CHUNK: usize = 1 << 16;
    let n = bytes.len() / W;
    let mut out = vec![0.0f32; n];
    out.par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * W))
        .for_each(|(o, b)| {
            for (v, c) in o.iter_mut().zip(b.chunks_exact(W)) {
                let mut a = [0u8; W];
                a.copy_from_slice(c);
                *v = f(a);
            }
        });
    out
}

/// [`to_f32`] with a tensor role for error messages.
pub(super) fn decode_all(role: &str, t: &Stored) -> Result<Vec<f32>> {
    use Dtype::*;
    dtype_in(
        role,
        t,
        &[
            F32, F16, BF16, F64, F8_E4M3, F8_E5M2, F8_E8M0, I8, U8, I16, U16, I32, U32, I64, U64,
        ],
    )?;
    numel(role, t)?;
    let b = t.bytes;
    Ok(match t.dtype {
        F32 => convert::<4>(b, f32::from_le_bytes),
        F16 => convert::<2>(b, |a| half::f16::from_le_bytes(a).to_f32()),
        BF16 => convert::<2>(b, |a| half::bf16::from_le_bytes(a).to_f32()),
        F64 => convert::<8>(b, |a| f64::from_le_bytes(a) as f32),
        F8_E4M3 => convert::<1>(b, |[x]| fp8_e4m3_to_f32(x)),
        F8_E5M2 => convert::<1>(b, |[x]| fp8_e5m2_to_f32(x)),
        F8_E8M0 => convert::<1>(b, |[x]| e8m0_to_f32(x)),
        I8 => convert::<1>(b, |[x]| f32::from(x as i8)),
        U8 => convert::<1>(b, |[x]| f32::from(x)),
        I16 => convert::<2>(b, |a| f32::from(i16::from_le_bytes(a))),
        U16 => convert::<2>(b, |a| f32::from(u16::from_le_bytes(a))),
        I32 => convert::<4>(b, |a| i32::from_le_bytes(a) as f32),
        U32 => convert::<4>(b, |a| u32::from_le_bytes(a) as f32),
        I64 => convert::<8>(b, |a| i64::from_le_bytes(a) as f32),
        U64 => convert::<8>(b, |a| u64::from_le_bytes(a) as f32),
        // Unreachable: `dtype_in` above admits only the arms listed.
        other => return Err(format!("{role} has unsupported dtype {}", other.name())),
    })
}

/// Upcasts a plain tensor to f32, row-major, exactly: F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E8M0,
/// I8, U8, I16, U16. Also F64 and I32/U32/I64/U64 "as numbers", which round to nearest f32 (exact
/// for |v| <= 2^24 integers and for f64 values that are f32 values). Other dtypes (F4, F6, FNUZ
/// FP8, BOOL, C64) are an error.
///
/// Checked against: `half` (IEEE f16/bf16), and the decoders above.
pub fn to_f32(t: Stored) -> Result<Vec<f32>> {
    decode_all("tensor", &t)
}

/// Rounds to the nearest FP8 E4M3FN value, ties to even, saturating at ±448; NaN stays NaN.
///
/// Checked against: compressed-tensors `quant_args.py::round_to_quantized_type_args`, which
/// clamps to `[finfo.min, finfo.max] = [-448, 448]` *before* `tensor.to(torch.float8_e4m3fn)`.
/// The torch cast itself is round-to-nearest-even and does not saturate (out-of-range values
/// become NaN), so the saturation here comes from that explicit clamp. Sign of zero is kept.
pub fn round_to_e4m3(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let c = x.clamp(-448.0, 448.0);
    let a = c.abs();
    if a < pow2(-6) {
        // Subnormal range: a fixed spacing of 2^-9 (scaling by a power of two is exact).
        return (c * pow2(9)).round_ties_even() * pow2(-9);
    }
    // Normal: 3 mantissa bits, so the spacing is 2^(e-3) for a in [2^e, 2^(e+1)).
    let e = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
    let spacing = pow2(e - 3);
    (c / spacing).round_ties_even() * spacing
}

/// Rounds to the nearest FP8 E5M2 value, ties to even, saturating at ±57344; NaN stays NaN.
/// vLLM's CUDA KV-cache write (`__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2)`) saturates
/// the same way; a plain torch cast would make out-of-range values infinite instead.
pub fn round_to_e5m2(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let c = x.clamp(-57344.0, 57344.0);
    let a = c.abs();
    if a < pow2(-14) {
        // Subnormal range: a fixed spacing of 2^-16.
        return (c * pow2(16)).round_ties_even() * pow2(-16);
    }
    // Normal: 2 mantissa bits, so the spacing is 2^(e-2) for a in [2^e, 2^(e+1)).
    let e = ((a.to_bits() >> 23) & 0xFF) as i32 - 127;
    let spacing = pow2(e - 2);
    (c / spacing).round_ties_even() * spacing
}

/// Rounds to the nearest FP4 E2M1 value, ties to even, saturating at ±6; NaN stays NaN.
///
/// Checked against: compressed-tensors `quantization/utils/fp4_utils.py::cast_to_fp4` (torch
/// path: thresholds `<= 0.25 -> 0`, `< 0.75 -> 0.5`, `<= 1.25 -> 1`, `< 1.75 -> 1.5`,
/// `<= 2.5 -> 2`, `< 3.5 -> 3`, `<= 5 -> 4`, else 6; i.e. ties to the even code) and ModelOpt
/// `nvfp4_tensor.py::_cast_fp4` (same bounds). Note the Triton path of compressed-tensors first
/// rounds its input to bf16; this function rounds the f32 input directly.
pub fn round_to_e2m1(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let m = if a <= 0.25 {
        0.0
    } else if a < 0.75 {
        0.5
    } else if a <= 1.25 {
        1.0
    } else if a < 1.75 {
        1.5
    } else if a <= 2.5 {
        2.0
    } else if a < 3.5 {
        3.0
    } else if a <= 5.0 {
        4.0
    } else {
        6.0
    };
    f32::copysign(m, x)
}
