//! Dequantizers of our own for the ggml block types candle does not know: the i-quants (IQ1_S,
//! IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS), the ternary types (TQ1_0,
//! TQ2_0), the FP4 types (MXFP4, NVFP4) and the 1- and 2-bit Q1_0 and Q2_0.
//!
//! The formats are those of the pinned llama.cpp (llama-cpp-python 0.3.36's vendored copy): the
//! block layouts of `ggml/src/ggml-common.h` (field order matters: TQ1_0 and TQ2_0 keep their
//! scale *after* the codes, IQ1_M has no scale field but spreads an f16 over its four 16-bit
//! scale words) and the reference `dequantize_row_*` of `ggml/src/ggml-quants.c`. Each block
//! function computes in f32 in the same order as ggml's reference dequantizer (Rust never fuses
//! a multiply and an add), so the values are ggml's bits: f16 scales widened exactly through
//! `half`, E8M0 scales as `ggml_e8m0_to_fp32_half`, UE4M3 scales as `ggml_ue4m3_to_fp32` (both
//! return half the scale, because the E2M1 table holds doubled values). The grids and tables
//! are generated from `ggml-common.h` into [`super::ggml_tables`].
//!
//! Every function here reads whole blocks of exactly the type's size (`chunks_exact`), so no
//! index can leave a block; [`dequantize`] refuses byte counts that are not whole blocks.

use half::f16;

use super::ggml_tables as t;
use crate::checkpoint::gguf::GgmlType;

/// The types this module dequantizes, in `ggml_type` id order.
#[cfg(test)]
pub(crate) const TYPES: [GgmlType; 15] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ3_S,
    GgmlType::IQ2_S,
    GgmlType::IQ4_XS,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
    GgmlType::NVFP4,
    GgmlType::Q1_0,
    GgmlType::Q2_0,
];

type BlockFn = fn(&[u8], &mut [f32]);

/// The block function for a type, with the block's element and byte counts as ggml declares
/// them (checked against [`GgmlType::block_size`] and [`GgmlType::type_size`] in the tests).
fn block_fn(ty: GgmlType) -> Option<(BlockFn, usize, usize)> {
    Some(match ty {
        GgmlType::IQ2_XXS => (iq2_xxs as BlockFn, QK_K, 66),
        GgmlType::IQ2_XS => (iq2_xs, QK_K, 74),
        GgmlType::IQ2_S => (iq2_s, QK_K, 82),
        GgmlType::IQ3_XXS => (iq3_xxs, QK_K, 98),
        GgmlType::IQ3_S => (iq3_s, QK_K, 110),
        GgmlType::IQ1_S => (iq1_s, QK_K, 50),
        GgmlType::IQ1_M => (iq1_m, QK_K, 56),
        GgmlType::IQ4_NL => (iq4_nl, 32, 18),
        GgmlType::IQ4_XS => (iq4_xs, QK_K, 136),
        GgmlType::TQ1_0 => (tq1_0, QK_K, 54),
        GgmlType::TQ2_0 => (tq2_0, QK_K, 66),
        GgmlType::MXFP4 => (mxfp4, 32, 17),
        GgmlType::NVFP4 => (nvfp4, 64, 36),
        GgmlType::Q1_0 => (q1_0, 128, 18),
        GgmlType::Q2_0 => (q2_0, 64, 18),
        _ => return None,
    })
}

const QK_K: usize = 256;

/// Whether [`dequantize`] handles `ty`.
pub(crate) fn supports(ty: GgmlType) -> bool {
    block_fn(ty).is_some()
}

/// Dequantize whole blocks of `ty` from `bytes` into `out` (one block's elements per block, in
/// ggml's order). An error, never a panic, for a type this module does not handle, a byte count
/// that is not whole blocks, or an `out` of another length.
pub(crate) fn dequantize(
    ty: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
) -> std::result::Result<(), String> {
    let (f, block, size) =
        block_fn(ty).ok_or_else(|| format!("{} is not a type of ggml_quants", ty.name()))?;
    if !bytes.len().is_multiple_of(size) {
        return Err(format!(
            "{} bytes are not whole {} blocks of {size} bytes",
            bytes.len(),
            ty.name()
        ));
    }
    let blocks = bytes.len() / size;
    if blocks.checked_mul(block) != Some(out.len()) {
        return Err(format!(
            "{blocks} {} blocks hold {blocks} x {block} values, not {}",
            ty.name(),
            out.len()
        ));
    }
    for (b, y) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(block)) {
        f(b, y);
    }
    Ok(())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A stored `ggml_half`, widened exactly.
fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16_at(b, at)).to_f32()
}

/// Byte `j` of a grid entry as ggml reads it: through a byte pointer on a little-endian host.
fn byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// `signs & kmask_iq2xs[j] ? -1.f : 1.f` (`kmask_iq2xs[j]` is `1 << j`).
fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 { -1.0 } else { 1.0 }
}

/// Eight values `dl * grid[j] * sign_j` of an IQ2 grid entry.
fn put8(y: &mut [f32], dl: f32, entry: u64, signs: u8) {
    for (j, v) in y[..8].iter_mut().enumerate() {
        *v = dl * f32::from(byte(entry, j)) * sign(signs, j);
    }
}

/// Two IQ3 grid entries of four values each, signed by bits 0..4 and 4..8 of `signs`.
fn put4x2(y: &mut [f32], dl: f32, e1: u32, e2: u32, signs: u8) {
    for j in 0..4 {
        y[j] = dl * f32::from(byte(e1.into(), j)) * sign(signs, j);
        y[j + 4] = dl * f32::from(byte(e2.into(), j)) * sign(signs, j + 4);
    }
}

/// d (f16) | qs: 32 x u16. Per 32 values: 4 grid bytes, then a u32 of four 7-bit sign indices
/// and a 4-bit scale; `db = d * (0.5 + s) * 0.25`.
fn iq2_xxs(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for ib in 0..QK_K / 32 {
        let q = &b[2 + 8 * ib..2 + 8 * ib + 8];
        let aux = u32_at(q, 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for l in 0..4 {
            let signs = t::KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let entry = t::IQ2XXS_GRID[usize::from(q[l])];
            put8(&mut y[32 * ib + 8 * l..], db, entry, signs);
        }
    }
}

/// d | qs: 32 x u16 (9-bit grid index, 7-bit sign index) | scales: 8 x two 4-bit scales, one per
/// 16 values.
fn iq2_xs(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for ib in 0..QK_K / 32 {
        let sc = b[66 + ib];
        let db = [
            d * (0.5 + f32::from(sc & 0xf)) * 0.25,
            d * (0.5 + f32::from(sc >> 4)) * 0.25,
        ];
        for l in 0..4 {
            let q = u16_at(b, 2 + 2 * (4 * ib + l));
            let entry = t::IQ2XS_GRID[usize::from(q & 511)];
            let signs = t::KSIGNS_IQ2XS[usize::from(q >> 9)];
            put8(&mut y[32 * ib + 8 * l..], db[l / 2], entry, signs);
        }
    }
}

/// d | qs: 32 grid index bytes, then 32 sign bytes | qh: 8 x four 2-bit index tops | scales: 8.
fn iq2_s(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for ib in 0..QK_K / 32 {
        let db = [
            d * (0.5 + f32::from(scales[ib] & 0xf)) * 0.25,
            d * (0.5 + f32::from(scales[ib] >> 4)) * 0.25,
        ];
        for l in 0..4 {
            let top = (usize::from(qh[ib]) << (8 - 2 * l)) & 0x300;
            let entry = t::IQ2S_GRID[usize::from(qs[4 * ib + l]) | top];
            put8(
                &mut y[32 * ib + 8 * l..],
                db[l / 2],
                entry,
                signs[4 * ib + l],
            );
        }
    }
}

/// d | qs: 64 grid index bytes | 8 x u32 (four 7-bit sign indices, a 4-bit scale);
/// `db = d * (0.5 + s) * 0.5`.
fn iq3_xxs(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qs = &b[2..66];
    for ib in 0..QK_K / 32 {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = t::KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let e1 = t::IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * l])];
            let e2 = t::IQ3XXS_GRID[usize::from(qs[8 * ib + 2 * l + 1])];
            put4x2(&mut y[32 * ib + 8 * l..], db, e1, e2, signs);
        }
    }
}

/// d | qs: 64 grid index bytes | qh: 8 bytes of 9th index bits | signs: 32 bytes | scales: 4 x
/// two 4-bit scales, one per 32 values; `db = d * (1 + 2 s)`.
fn iq3_s(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for ib in 0..QK_K / 32 {
        let s = if ib % 2 == 0 {
            scales[ib / 2] & 0xf
        } else {
            scales[ib / 2] >> 4
        };
        let db = d * f32::from(1 + 2 * s);
        let h = usize::from(qh[ib]);
        for l in 0..4 {
            let i1 = usize::from(qs[8 * ib + 2 * l]) | ((h << (8 - 2 * l)) & 256);
            let i2 = usize::from(qs[8 * ib + 2 * l + 1]) | ((h << (7 - 2 * l)) & 256);
            let (e1, e2) = (t::IQ3S_GRID[i1], t::IQ3S_GRID[i2]);
            put4x2(&mut y[32 * ib + 8 * l..], db, e1, e2, signs[4 * ib + l]);
        }
    }
}

/// `IQ1S_DELTA` and `IQ1M_DELTA`.
const IQ1_DELTA: f32 = 0.125;

/// Eight values `dl * (grid[j] + delta)` of an IQ1 grid entry (bytes are i8 in {-1, 0, 1}).
fn put_iq1(y: &mut [f32], dl: f32, index: usize, delta: f32) {
    let entry = t::IQ1S_GRID[index];
    for (j, v) in y[..8].iter_mut().enumerate() {
        *v = dl * (f32::from(byte(entry, j) as i8) + delta);
    }
}

/// d | qs: 32 grid index bytes | qh: 8 x u16 (four 3-bit index tops, a 3-bit scale, the delta's
/// sign in bit 15).
fn iq1_s(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qs = &b[2..34];
    for ib in 0..QK_K / 32 {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 {
            -IQ1_DELTA
        } else {
            IQ1_DELTA
        };
        for l in 0..4 {
            let index = usize::from(qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            put_iq1(&mut y[32 * ib + 8 * l..], dl, index, delta);
        }
    }
}

/// qs: 32 grid index bytes | qh: 16 bytes (per 8 values a 3-bit index top and the delta's sign)
/// | scales: 4 x u16, each four 3-bit scales (one per 16 values) and 4 bits of the block's f16.
fn iq1_m(b: &[u8], y: &mut [f32]) {
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = f16::from_bits(bits).to_f32();
    let (qs, qh) = (&b[0..32], &b[32..48]);
    for ib in 0..QK_K / 32 {
        let shift = 6 * (ib % 2);
        let dl1 = d * f32::from(2 * ((sc[ib / 2] >> shift) & 0x7) + 1);
        let dl2 = d * f32::from(2 * ((sc[ib / 2] >> (shift + 3)) & 0x7) + 1);
        let (h0, h1) = (usize::from(qh[2 * ib]), usize::from(qh[2 * ib + 1]));
        let q = |l: usize| usize::from(qs[4 * ib + l]);
        let index = [
            q(0) | ((h0 << 8) & 0x700),
            q(1) | ((h0 << 4) & 0x700),
            q(2) | ((h1 << 8) & 0x700),
            q(3) | ((h1 << 4) & 0x700),
        ];
        let delta = |h: usize, bit: usize| {
            if h & bit != 0 { -IQ1_DELTA } else { IQ1_DELTA }
        };
        let deltas = [
            delta(h0, 0x08),
            delta(h0, 0x80),
            delta(h1, 0x08),
            delta(h1, 0x80),
        ];
        for l in 0..4 {
            let dl = if l < 2 { dl1 } else { dl2 };
            put_iq1(&mut y[32 * ib + 8 * l..], dl, index[l], deltas[l]);
        }
    }
}

/// d | qs: 16 bytes, low nibbles the first 16 values, high nibbles the last 16.
fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for j in 0..16 {
        y[j] = d * f32::from(t::KVALUES_IQ4NL[usize::from(b[2 + j] & 0xf)]);
        y[j + 16] = d * f32::from(t::KVALUES_IQ4NL[usize::from(b[2 + j] >> 4)]);
    }
}

/// d | scales_h: u16 (2 high bits per 32 values) | scales_l: 4 x two low nibbles | qs: 128 bytes,
/// per 32 values 16 bytes laid out as IQ4_NL's; `dl = d * (ls - 32)`.
fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let scales_h = u16_at(b, 2);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for ib in 0..QK_K / 32 {
        let lo = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
        let hi = ((scales_h >> (2 * ib)) & 3) as u8;
        let ls = i32::from(lo | (hi << 4));
        let dl = d * (ls - 32) as f32;
        for j in 0..16 {
            let q = qs[16 * ib + j];
            y[32 * ib + j] = dl * f32::from(t::KVALUES_IQ4NL[usize::from(q & 0xf)]);
            y[32 * ib + j + 16] = dl * f32::from(t::KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

/// One base-3 digit of a TQ1_0 byte: `q * 3^n` (mod 256) puts digit n at the top, and
/// `(q * 3) >> 8` reads it; the value is `(digit - 1) * d`.
fn trit(q: u8, n: usize, d: f32) -> f32 {
    const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];
    let top = q.wrapping_mul(POW3[n]);
    let xi = ((u16::from(top) * 3) >> 8) as i16;
    f32::from(xi - 1) * d
}

/// qs: 48 bytes of five trits | qh: 4 bytes of four trits | d (last). Order: qs[0..32] digit by
/// digit (160 values), qs[32..48] likewise (80), then qh (16).
fn tq1_0(b: &[u8], y: &mut [f32]) {
    let (qs, qh) = (&b[0..48], &b[48..52]);
    let d = half_at(b, 52);
    let mut at = 0;
    for (start, len) in [(0, 32), (32, 16)] {
        for n in 0..5 {
            for &q in &qs[start..start + len] {
                y[at] = trit(q, n, d);
                at += 1;
            }
        }
    }
    for n in 0..4 {
        for &q in qh {
            y[at] = trit(q, n, d);
            at += 1;
        }
    }
}

/// qs: 64 bytes of four 2-bit codes | d (last). Per 32 bytes, bit pair l of each byte in turn;
/// the value is `(code - 1) * d`.
fn tq2_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 64);
    for half in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                let q = (b[32 * half + m] >> (2 * l)) & 3;
                y[128 * half + 32 * l + m] = f32::from(i16::from(q) - 1) * d;
            }
        }
    }
}

/// `ggml_e8m0_to_fp32_half`: 2^(e - 128), with e = 0 and 1 as the subnormals 2^-128 and 2^-127.
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// `ggml_ue4m3_to_fp32`: unsigned E4M3 (bias 7, bit 7 ignored) times 0.5; 0 and 0x7F read as 0.
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0xf);
    let man = f32::from(x & 7);
    // Powers of two built from their bits: exact, as `ldexpf` is.
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    let raw = if exp == 0 {
        man * pow2(-9)
    } else {
        (1.0 + man / 8.0) * pow2(exp - 7)
    };
    raw * 0.5
}

/// e (E8M0) | qs: 16 bytes of E2M1 codes, low nibbles first.
fn mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_half(b[0]);
    for j in 0..16 {
        y[j] = f32::from(t::KVALUES_FP4[usize::from(b[1 + j] & 0xf)]) * d;
        y[j + 16] = f32::from(t::KVALUES_FP4[usize::from(b[1 + j] >> 4)]) * d;
    }
}

/// d: 4 UE4M3 scales, one per 16 values | qs: 32 bytes, per 16 values 8 bytes, low nibbles
/// first.
fn nvfp4(b: &[u8], y: &mut [f32]) {
    for s in 0..4 {
        let d = ue4m3_half(b[s]);
        for j in 0..8 {
            let q = b[4 + 8 * s + j];
            y[16 * s + j] = f32::from(t::KVALUES_FP4[usize::from(q & 0xf)]) * d;
            y[16 * s + j + 8] = f32::from(t::KVALUES_FP4[usize::from(q >> 4)]) * d;
        }
    }
}

/// d | 128 bits, least significant first: a set bit is `d`, a clear one `-d`.
fn q1_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (j, v) in y[..128].iter_mut().enumerate() {
        *v = if (b[2 + j / 8] >> (j % 8)) & 1 != 0 {
            d
        } else {
            -d
        };
    }
}

/// d | 64 2-bit codes, least significant pair first: `(code - 1) * d` (-1, 0, 1, 2).
fn q2_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (j, v) in y[..64].iter_mut().enumerate() {
        let q = (b[2 + j / 4] >> ((j % 4) * 2)) & 3;
        *v = f32::from(i16::from(q) - 1) * d;
    }
}

/// Each block below is built by hand and its values derived from the format definition in
/// `ggml-common.h` / `ggml-quants.c` (grid entries quoted from the header), not by running
/// this code.
#[cfg(test)]
mod tests {
    use super::*;

    const ONE: [u8; 2] = [0x00, 0x3c]; // f16 1.0
    const HALF: [u8; 2] = [0x00, 0x38]; // f16 0.5
    const TWO: [u8; 2] = [0x00, 0x40]; // f16 2.0
    const QUARTER: [u8; 2] = [0x00, 0x34]; // f16 0.25

    /// A zeroed block of `ty` with `parts` written at their byte offsets, dequantized.
    fn run(ty: GgmlType, parts: &[(usize, &[u8])]) -> Vec<f32> {
        let mut b = vec![0u8; ty.type_size() as usize];
        for (at, bytes) in parts {
            b[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        let mut y = vec![f32::NAN; ty.block_size() as usize];
        dequantize(ty, &b, &mut y).unwrap();
        y
    }

    fn check(ty: GgmlType, y: &[f32], at: usize, want: &[f32]) {
        assert_eq!(&y[at..at + want.len()], want, "{ty} at {at}");
    }

    #[test]
    fn block_geometry_is_ggmls() {
        for ty in TYPES {
            let (_, block, size) = block_fn(ty).unwrap();
            assert_eq!(block as u64, ty.block_size(), "{ty}");
            assert_eq!(size as u64, ty.type_size(), "{ty}");
        }
        let ours = GgmlType::ALL.into_iter().filter(|&t| supports(t)).count();
        assert_eq!(ours, TYPES.len());
    }

    /// Grid entries 0 and 1 are 0x0808080808080808 and 0x080808080808082b (magnitudes 8 and
    /// 43); sign index 1 is 0b1000_0001 (value 0 negated, and value 7 for even parity).
    #[test]
    fn iq2_xxs() {
        let ty = GgmlType::IQ2_XXS;
        // db = 1 * (0.5 + 1) * 0.25 = 0.375; then 0.125 where the scale nibble is 0.
        let aux = (1u32 | (1 << 28)).to_le_bytes();
        let y = run(ty, &[(0, &ONE), (2, &[0, 1, 0, 0]), (6, &aux)]);
        check(ty, &y, 0, &[-3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, -3.0]);
        check(ty, &y, 8, &[16.125, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]);
        check(ty, &y, 24, &[3.0; 8]);
        check(ty, &y, 32, &[1.0; 8]);
    }

    /// qs[0] = grid 1 with sign index 3 (0b11: values 0 and 1 negated); scales 0x21: db 0.75 for
    /// the first 16 values, 1.25 for the next.
    #[test]
    fn iq2_xs() {
        let ty = GgmlType::IQ2_XS;
        let q0 = (1u16 | (3 << 9)).to_le_bytes();
        let y = run(ty, &[(0, &TWO), (2, &q0), (66, &[0x21])]);
        check(ty, &y, 0, &[-32.25, -6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0]);
        check(ty, &y, 8, &[6.0; 8]);
        check(ty, &y, 16, &[10.0; 8]);
        // Scale nibble 0: 2 * 0.5 * 0.25 = 0.25, times 8.
        check(ty, &y, 32, &[2.0; 8]);
    }

    /// qh[0] = 1 lifts the first group's index to 256 (0x0819081919191919, bytes low first
    /// 25 25 25 25 25 8 25 8); scales 0x13: 0.875 then 0.375; signs[0] = 1.
    #[test]
    fn iq2_s() {
        let ty = GgmlType::IQ2_S;
        let y = run(
            ty,
            &[(0, &ONE), (34, &[0x01]), (66, &[0x01]), (74, &[0x13])],
        );
        let (a, b) = (21.875, 7.0);
        check(ty, &y, 0, &[-a, a, a, a, a, b, a, b]);
        check(ty, &y, 8, &[7.0; 8]);
        check(ty, &y, 16, &[3.0; 8]);
    }

    /// Grid entries 0x04040404 and 0x04040414; the u32 after the 64 index bytes holds sign index
    /// 1 for the first 8 values and the scale 1: db = (0.5 + 1) * 0.5 = 0.75.
    #[test]
    fn iq3_xxs() {
        let ty = GgmlType::IQ3_XXS;
        let aux = (1u32 | (1 << 28)).to_le_bytes();
        let y = run(ty, &[(0, &ONE), (2, &[0, 1]), (66, &aux)]);
        check(ty, &y, 0, &[-3.0, 3.0, 3.0, 3.0, 15.0, 3.0, 3.0, -3.0]);
        check(ty, &y, 8, &[3.0; 8]);
        // Scale 0: 0.5 * 0.5 = 0.25, times 4.
        check(ty, &y, 32, &[1.0; 8]);
    }

    /// Grid entries 0 (0x01010101) and 256 (0x05090507: 7 5 9 5); qh[0] = 0b11 lifts both of the
    /// first pair to 256; scales 0x21: d (1 + 2) = 1.5, then d (1 + 4) = 2.5; signs[0] = 0x10.
    #[test]
    fn iq3_s() {
        let ty = GgmlType::IQ3_S;
        let y = run(
            ty,
            &[(0, &HALF), (66, &[0x03]), (74, &[0x10]), (106, &[0x21])],
        );
        check(ty, &y, 0, &[10.5, 7.5, 13.5, 7.5, -10.5, 7.5, 13.5, 7.5]);
        check(ty, &y, 8, &[1.5; 8]);
        check(ty, &y, 32, &[2.5; 8]);
        check(ty, &y, 64, &[0.5; 8]);
    }

    /// Grid entries 0 (all -1), 1 (1 then -1s) and 256 (0xff00ff01000100ff: -1 0 1 0 1 -1 0 -1);
    /// qh[0]: scale 3 (dl = 7), delta negative, the third group's index lifted to 256.
    #[test]
    fn iq1_s() {
        let ty = GgmlType::IQ1_S;
        let qh = (0x8000u16 | (3 << 12) | (1 << 6)).to_le_bytes();
        let y = run(ty, &[(0, &ONE), (2, &[0, 1, 0, 0]), (34, &qh)]);
        let (m, z, p) = (-7.875, -0.875, 6.125);
        check(ty, &y, 0, &[m; 8]);
        check(ty, &y, 8, &[p, m, m, m, m, m, m, m]);
        check(ty, &y, 16, &[m, z, p, z, p, m, z, m]);
        check(ty, &y, 24, &[m; 8]);
        // qh 0: dl = 1, delta +0.125.
        check(ty, &y, 32, &[-0.875; 8]);
    }

    /// The f16 1.0 (0x3C00) spread over the top nibbles of the four scale words (0, 0, 0xC, 0x3);
    /// the first word's 3-bit scales 1 and 2 give 3 and 5; qh bits 3 and 7 flip the deltas.
    #[test]
    fn iq1_m() {
        let ty = GgmlType::IQ1_M;
        let scales = [0x11, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x30];
        let y = run(ty, &[(32, &[0x08, 0x80, 0x01]), (48, &scales)]);
        check(ty, &y, 0, &[-3.375; 8]);
        check(ty, &y, 8, &[-2.625; 8]);
        check(ty, &y, 16, &[-4.375; 8]);
        check(ty, &y, 24, &[-5.625; 8]);
        // Second 32: scales 0, index lifted to 256 (0xff00ff01000100ff), delta +0.125.
        let (m, z, p) = (-0.875, 0.125, 1.125);
        check(ty, &y, 32, &[m, z, p, z, p, m, z, m]);
        check(ty, &y, 40, &[-0.875; 8]);
    }

    /// kvalues_iq4nl = -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113, times d = 0.5.
    #[test]
    fn iq4_nl() {
        let ty = GgmlType::IQ4_NL;
        let codes: Vec<u8> = (0..16).collect();
        let y = run(ty, &[(0, &HALF), (2, &codes)]);
        let want = [
            -63.5, -52.0, -41.5, -32.5, -24.5, -17.5, -11.0, -5.0, 0.5, 6.5, 12.5, 19.0, 26.5,
            34.5, 44.5, 56.5,
        ];
        check(ty, &y, 0, &want);
        check(ty, &y, 16, &[-63.5; 16]);
    }

    /// 6-bit scales, low nibbles in scales_l and 2 high bits in scales_h: 1 | 2 << 4 = 33 (dl 1),
    /// 0 | 2 << 4 = 32 (dl 0), then 0 (dl -32).
    #[test]
    fn iq4_xs() {
        let ty = GgmlType::IQ4_XS;
        let y = run(
            ty,
            &[
                (0, &ONE),
                (2, &[0x0a, 0x00]),
                (4, &[0x01]),
                (8, &[0xf0]),
                (40, &[0x88]),
            ],
        );
        check(ty, &y, 0, &[-127.0, -127.0]);
        check(ty, &y, 16, &[113.0, -127.0]);
        check(ty, &y, 32, &[0.0; 32]);
        check(ty, &y, 64, &[-32.0, 4064.0]);
        check(ty, &y, 80, &[-32.0, 4064.0]);
    }

    /// A byte holds five trits as the fraction q/256 of 3^5: trits 2 0 1 2 1 are
    /// x = 162 + 9 + 6 + 1 = 178, stored as ceil(178 * 256 / 243) = 188. Digit n of qs[m] is
    /// value 32 n + m (qs[0..32]), 160 + 16 n + m - 32 (qs[32..48]), 240 + 4 n + j (qh[j]).
    #[test]
    fn tq1_0() {
        let ty = GgmlType::TQ1_0;
        let y = run(ty, &[(0, &[188]), (32, &[188]), (49, &[188]), (52, &HALF)]);
        let digits = [0.5, -0.5, 0.0, 0.5, 0.0];
        for (n, &v) in digits.iter().enumerate() {
            check(ty, &y, 32 * n, &[v, -0.5]);
            check(ty, &y, 160 + 16 * n, &[v, -0.5]);
            if n < 4 {
                check(ty, &y, 240 + 4 * n, &[-0.5, v, -0.5]);
            }
        }
    }

    /// 0xE4 = codes 0 1 2 3 from the low bits: -1 0 1 2 times d = 2, at values m + 32 l.
    #[test]
    fn tq2_0() {
        let ty = GgmlType::TQ2_0;
        let y = run(ty, &[(0, &[0xe4]), (32, &[0xe4]), (64, &TWO)]);
        for (l, v) in [-2.0, 0.0, 2.0, 4.0].into_iter().enumerate() {
            check(ty, &y, 32 * l, &[v, -2.0]);
            check(ty, &y, 128 + 32 * l, &[v, -2.0]);
        }
    }

    /// E8M0 128 is 2^1; the table holds E2M1 doubled (code 1 = 0.5 -> 1, code 7 = 6 -> 12, code 9
    /// = -0.5 -> -1), so the scale used is 2^0.
    #[test]
    fn mxfp4() {
        let ty = GgmlType::MXFP4;
        let y = run(ty, &[(0, &[128]), (1, &[0x71, 0xf9])]);
        check(ty, &y, 0, &[1.0, -1.0, 0.0]);
        check(ty, &y, 16, &[12.0, -12.0, 0.0]);
        // E8M0 0 and 1 are 2^-127 and 2^-126, halved: subnormals.
        assert_eq!(e8m0_half(0), f32::from_bits(1 << 21));
        assert_eq!(e8m0_half(1), f32::from_bits(1 << 22));
        assert_eq!(e8m0_half(2), f32::MIN_POSITIVE);
        assert_eq!(e8m0_half(254), 2f32.powi(126));
        let y = run(ty, &[(0, &[0]), (1, &[0x02])]);
        assert_eq!(y[0], 2.0 * f32::from_bits(1 << 21));
    }

    /// UE4M3 scales 0x38 = 1.0, 0x3C = 1.5, 0x01 = 2^-9 (subnormal) and 0x7F (read as 0),
    /// halved as the doubled E2M1 table needs.
    #[test]
    fn nvfp4() {
        let ty = GgmlType::NVFP4;
        let y = run(
            ty,
            &[
                (0, &[0x38, 0x3c, 0x01, 0x7f]),
                (4, &[0x72]),
                (12, &[0x0d]),
                (20, &[0x07]),
                (28, &[0x77]),
            ],
        );
        check(ty, &y, 0, &[1.0, 0.0]);
        check(ty, &y, 8, &[6.0, 0.0]);
        check(ty, &y, 16, &[-4.5]);
        check(ty, &y, 24, &[0.0]);
        check(ty, &y, 32, &[12.0 / 1024.0]);
        check(ty, &y, 48, &[0.0; 16]);
        // Bit 7 is not read: 0xFF is 1.875 * 2^8, halved.
        assert_eq!(ue4m3_half(0xff), 240.0);
        assert_eq!(ue4m3_half(0x80), 0.0);
        assert_eq!(ue4m3_half(0x7e), 224.0);
    }

    #[test]
    fn q1_0() {
        let ty = GgmlType::Q1_0;
        let y = run(ty, &[(0, &QUARTER), (2, &[0x05]), (17, &[0x80])]);
        check(ty, &y, 0, &[0.25, -0.25, 0.25, -0.25]);
        check(
            ty,
            &y,
            120,
            &[-0.25, -0.25, -0.25, -0.25, -0.25, -0.25, -0.25, 0.25],
        );
    }

    /// 00 = -1, 01 = 0, 10 = +1, 11 = +2, least significant pair first.
    #[test]
    fn q2_0() {
        let ty = GgmlType::Q2_0;
        let y = run(ty, &[(0, &HALF), (2, &[0xe4]), (17, &[0x1b])]);
        check(ty, &y, 0, &[-0.5, 0.0, 0.5, 1.0, -0.5]);
        check(ty, &y, 60, &[1.0, 0.5, 0.0, -0.5]);
    }

    /// Byte counts that are not whole blocks, an output of another length, and a type of
    /// candle's: errors, never panics.
    #[test]
    fn wrong_sizes_are_refused() {
        for ty in TYPES {
            let (_, block, size) = block_fn(ty).unwrap();
            let mut out = vec![0f32; block];
            let short = vec![0u8; size - 1];
            assert!(dequantize(ty, &short, &mut out).is_err(), "{ty}: short");
            let long = vec![0u8; size + 1];
            assert!(dequantize(ty, &long, &mut out).is_err(), "{ty}: long");
            let two = vec![0u8; 2 * size];
            assert!(dequantize(ty, &two, &mut out).is_err(), "{ty}: two blocks");
            assert!(dequantize(ty, &two[..size], &mut out[..block - 1]).is_err());
            assert!(dequantize(ty, &[], &mut []).is_ok());
        }
        assert!(dequantize(GgmlType::Q4_0, &[0; 18], &mut [0.0; 32]).is_err());
    }
}
