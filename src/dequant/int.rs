//! Integer formats packed into int32 words: AWQ GEMM and GPTQ (and the bit-stream reader they share with pack-quantized).

use super::check::{dtype_in, exact, fill_tiles, matrix, mul, numel, output, shape_str, word};
use super::floats::decode_all;
use super::{Result, Stored};
use crate::checkpoint::dtype::Dtype;

/// How sub-byte fields sit in a stream of little-endian u32 words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Packing {
    /// Field `k` starts at bit `k * bits` of the stream and may straddle two words.
    Dense,
    /// `per_word` fields per word, field `k` at bit `(k % per_word) * bits` of word `k / per_word`
    /// (the unused high bits of each word are zero).
    PerWord(usize),
}

impl Packing {
    /// The packing of `n` fields of `bits` bits stored in `words` words: dense
    /// (`ceil(n*bits/32)` words), or for bits that do not divide 32 also the older per-word
    /// layout (`ceil(n / floor(32/bits))` words).
    pub(super) fn detect(role: &str, n: usize, bits: u32, words: usize) -> Result<Packing> {
        let b = bits as usize;
        let dense = n
            .checked_mul(b)
            .map(|x| x.div_ceil(32))
            .ok_or_else(|| format!("{role}: {n} values of {bits} bits overflow"))?;
        if 32 % b == 0 {
            return if words == dense {
                Ok(Packing::Dense)
            } else {
                Err(format!(
                    "{role} has {words} packed words along its packed dimension; {n} values of {bits} bits need {dense}"
                ))
            };
        }
        let per_word = 32 / b;
        let legacy = n.div_ceil(per_word);
        match (words == dense, words == legacy) {
            (true, true) if words <= 1 => Ok(Packing::Dense),
            (true, true) => Err(format!(
                "{role}: {words} words for {n} values of {bits} bits fits both the dense and the older per-word packing; cannot tell which"
            )),
            (true, false) => Ok(Packing::Dense),
            (false, true) => Ok(Packing::PerWord(per_word)),
            (false, false) => Err(format!(
                "{role} has {words} packed words along its packed dimension; {n} values of {bits} bits need {dense} (dense packing) or {legacy} (older per-word packing)"
            )),
        }
    }
}

/// Field `k` (masked to `bits`) of the word stream whose word `r` is word `base + r * stride` of
/// `bytes` (little-endian u32s). Callers validate that the stream holds field `k`.
#[inline]
pub(super) fn stream_field(
    bytes: &[u8],
    base: usize,
    stride: usize,
    k: usize,
    bits: u32,
    packing: Packing,
) -> u32 {
    let mask = (1u32 << bits) - 1;
    let at = |r: usize| word(bytes, base.wrapping_add(r.wrapping_mul(stride)));
    match packing {
        Packing::Dense => {
            let pos = k.wrapping_mul(bits as usize);
            let (r, off) = (pos / 32, (pos % 32) as u32);
            let mut v = at(r) >> off;
            if off + bits > 32 {
                v |= at(r + 1) << (32 - off);
            }
            v & mask
        }
        Packing::PerWord(per) => {
            let per = per.max(1);
            let off = ((k % per) as u32).wrapping_mul(bits);
            (at(k / per) >> (off & 31)) & mask
        }
    }
}

/// Unpacks the first `out.len()` fields (unsigned, as f32) of a stream of contiguous
/// little-endian words. Fields past the end of `words` are left as they are (callers validate).
pub(super) fn unpack_row(words: &[u8], bits: u32, packing: Packing, out: &mut [f32]) {
    let b = bits as usize;
    let mask = (1u32 << bits) - 1;
    let per = match packing {
        Packing::PerWord(p) => Some(p.max(1)),
        Packing::Dense if 32 % b == 0 => Some(32 / b),
        Packing::Dense => None,
    };
    match per {
        Some(per) => {
            for (chunk, wb) in out.chunks_mut(per).zip(words.chunks_exact(4)) {
                let w = u32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]);
                for (j, x) in chunk.iter_mut().enumerate() {
                    *x = ((w >> (b * j)) & mask) as f32;
                }
            }
        }
        None => {
            for (k, x) in out.iter_mut().enumerate() {
                *x = stream_field(words, 0, 1, k, bits, Packing::Dense) as f32;
            }
        }
    }
}

const SCALE_DTYPES: &[Dtype] = &[Dtype::F16, Dtype::BF16, Dtype::F32];

/// AWQ's packing order: nibble `p` of a word holds output column `8*c + AWQ_ORDER[p]`.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// AWQ GEMM (`version: gemm`, 4-bit): `qweight` I32 `[in, out/8]`, `qzeros` I32 `[in/g, out/8]`,
/// `scales` F16 (or BF16/F32) `[in/g, out]`; `w[o][i] = (q - z) * s`. Returns `[out, in]`.
///
/// Checked against: casper-hansen/AutoAWQ `awq/utils/packing_utils.py` (`unpack_awq`: nibble `p`
/// at shift `4p`; `reverse_awq_order` with `AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]`, i.e.
/// output `m` of each group of 8 comes from nibble `REVERSE[m]`, equivalently nibble `p` holds
/// output `AWQ_ORDER[p] = [0, 2, 4, 6, 1, 3, 5, 7][p]`; `dequantize_gemm`: `(iweight - izeros) *
/// scales` with both repeated `group_size` times along the input dim). Zero points are stored as
/// is (no +1). The reference multiplies in f16; the f32 product here is exact. `in % group_size`
/// must be 0 (AutoAWQ's `WQLinear_GEMM` asserts it).
pub fn awq_gemm(
    qweight: Stored,
    qzeros: Stored,
    scales: Stored,
    group_size: usize,
) -> Result<Vec<f32>> {
    let [inf, packs] = matrix("qweight", &qweight, &[Dtype::I32])?;
    let outf = mul(packs, 8, "qweight: out features")?;
    if group_size == 0 {
        return Err(String::from("AWQ group_size is 0"));
    }
    if inf % group_size != 0 {
        return Err(format!(
            "qweight has {inf} input rows, not a multiple of the group size {group_size}"
        ));
    }
    let ng = inf / group_size;
    let why = format!("a group size of {group_size} over {inf} input rows and {outf} outputs");
    exact("qzeros", &qzeros, &[Dtype::I32], &[ng, packs], &why)?;
    exact("scales", &scales, SCALE_DTYPES, &[ng, outf], &why)?;
    let s = decode_all("scales", &scales)?;
    let (qw, qz) = (qweight.bytes, qzeros.bytes);

    let mut out = output(outf, inf, "qweight")?;
    // One tile = the 8 output rows of one packed column.
    fill_tiles(&mut out, inf, 8, |o0, tile| {
        let c = o0 / 8;
        for i in 0..inf {
            let g = i / group_size;
            let w = word(qw, i * packs + c);
            let z = word(qz, g * packs + c);
            let srow = &s[g * outf + o0..];
            for (p, &m) in AWQ_ORDER.iter().enumerate() {
                let q = ((w >> (4 * p)) & 0xF) as i32;
                let zz = ((z >> (4 * p)) & 0xF) as i32;
                if let (Some(dst), Some(&sc)) = (tile.get_mut(m * inf + i), srow.get(m)) {
                    *dst = (q - zz) as f32 * sc;
                }
            }
        }
    });
    Ok(out)
}

/// GPTQ checkpoint format: `checkpoint_format: gptq` (v1) stores zero points minus one,
/// `gptq_v2` stores them as is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GptqFormat {
    V1,
    V2,
}

/// GPTQ: `qweight` I32 `[in*bits/32, out]` packed along the input dim, `qzeros` I32
/// `[groups, out*bits/32]`, `scales` F16 (or BF16/F32) `[groups, out]`, optional `g_idx` I32
/// `[in]`. `bits` 2, 3, 4 or 8. `group_size` `None` (= -1) means one group. Returns `[out, in]`.
///
/// Checked against: AutoGPTQ/AutoGPTQ `auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`
/// (`pack` and the torch fallback in `forward`): for 2/4/8 bits value `j` of a word sits at shift
/// `bits * j`; for 3 bits 32 values span 3 words with values 10 and 21 straddling words, which is
/// exactly a dense LSB-first bit stream (value `k` at bit `3k`), so every width is read as that
/// stream. `pack` stores `zeros - 1` and `forward` unpacks, masks each field and adds 1 without
/// re-masking (v1: `z = field + 1`, up to `2^bits`); `weight = scales * (weight - zeros)`.
/// GPTQ v2 (GPTQModel `checkpoint_format: gptq_v2`) stores `z` itself. With `g_idx` input row `i`
/// uses group `g_idx[i]` (AutoGPTQ `qlinear_cuda.py`), else `i / group_size`. The reference
/// multiplies in f16; the f32 product here is exact. GPTQModel's own v1->v2 conversion adds
/// `0x11111111`-style constants to whole words, which carries into the next field when a stored
/// field is all ones; this follows AutoGPTQ's per-field `+1` instead.
pub fn gptq(
    qweight: Stored,
    qzeros: Stored,
    scales: Stored,
    g_idx: Option<Stored>,
    bits: u32,
    group_size: Option<usize>,
    format: GptqFormat,
) -> Result<Vec<f32>> {
    if !matches!(bits, 2 | 3 | 4 | 8) {
        return Err(format!("GPTQ supports bits 2, 3, 4 and 8; got {bits}"));
    }
    let b = bits as usize;
    let [kw, outf] = matrix("qweight", &qweight, &[Dtype::I32])?;
    let inf = mul(kw, 32, "qweight: input features")? / b;
    if inf * b != kw * 32 {
        return Err(format!(
            "qweight has {kw} packed rows; {bits}-bit GPTQ packs 32 input rows into {bits} words, so the row count must be a multiple of {bits}"
        ));
    }
    let gs = match group_size {
        None => inf.max(1),
        Some(0) => return Err(String::from("GPTQ group_size is 0")),
        Some(g) => g,
    };
    let ng = inf.div_ceil(gs);
    let zbits = mul(outf, b, "qzeros: packed width")?;
    if zbits % 32 != 0 {
        return Err(format!(
            "{outf} output features of {bits} bits do not fill whole int32 words of qzeros"
        ));
    }
    let zw = zbits / 32;
    let why = match group_size {
        None => format!("one group over {inf} input rows and {outf} outputs"),
        Some(g) => format!("a group size of {g} over {inf} input rows and {outf} outputs"),
    };
    exact("qzeros", &qzeros, &[Dtype::I32], &[ng, zw], &why)?;
    dtype_in("scales", &scales, SCALE_DTYPES)?;
    numel("scales", &scales)?;
    if scales.shape != [ng, outf] {
        return Err(format!(
            "scales has shape {}; {why} needs {}",
            shape_str(scales.shape),
            shape_str(&[ng, outf])
        ));
    }
    if let Some(g) = &g_idx {
        exact(
            "g_idx",
            g,
            &[Dtype::I32],
            &[inf],
            &format!("a weight with {inf} input rows"),
        )?;
    }
    if inf == 0 || outf == 0 {
        return Ok(Vec::new());
    }
    let s = decode_all("scales", &scales)?;

    // Group of every input row (inf is bounded by the qweight bytes now that outf > 0).
    let groups: Vec<usize> = match &g_idx {
        Some(g) => {
            let mut v = Vec::with_capacity(inf);
            for (i, c) in g.bytes.chunks_exact(4).enumerate() {
                let x = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                match usize::try_from(x) {
                    Ok(u) if u < ng => v.push(u),
                    _ => {
                        return Err(format!(
                            "g_idx[{i}] is {x}; scales has {ng} groups (valid: 0 to {})",
                            ng.saturating_sub(1)
                        ));
                    }
                }
            }
            v
        }
        None => (0..inf).map(|i| i / gs).collect(),
    };

    // Zero points [ng, out] as f32.
    let plus = match format {
        GptqFormat::V1 => 1.0,
        GptqFormat::V2 => 0.0,
    };
    let mut z = Vec::with_capacity(ng.saturating_mul(outf));
    for g in 0..ng {
        for o in 0..outf {
            let f = stream_field(qzeros.bytes, g * zw, 1, o, bits, Packing::Dense);
            z.push(f as f32 + plus);
        }
    }

    let qw = qweight.bytes;
    let mut out = output(outf, inf, "qweight")?;
    const TILE: usize = 16;
    let mask = (1u32 << bits) - 1;
    fill_tiles(&mut out, inf, TILE, |o0, tile| {
        let n = tile.len() / inf.max(1);
        // 1. Raw values: packed word row r holds input rows r*per .. r*per+per of each column.
        if 32 % b == 0 {
            let per = 32 / b;
            for r in 0..kw {
                for t in 0..n {
                    let w = word(qw, r * outf + o0 + t);
                    let start = t * inf + r * per;
                    if let Some(dst) = tile.get_mut(start..start + per) {
                        for (j, x) in dst.iter_mut().enumerate() {
                            *x = ((w >> (b * j)) & mask) as f32;
                        }
                    }
                }
            }
        } else {
            for i in 0..inf {
                for t in 0..n {
                    let q = stream_field(qw, o0 + t, outf, i, bits, Packing::Dense);
                    if let Some(x) = tile.get_mut(t * inf + i) {
                        *x = q as f32;
                    }
                }
            }
        }
        // 2. (q - z) * s with the group of each input row.
        for (t, row) in tile.chunks_mut(inf.max(1)).enumerate() {
            let o = o0 + t;
            for (x, &g) in row.iter_mut().zip(&groups) {
                let k = g * outf + o;
                if let (Some(&zz), Some(&sc)) = (z.get(k), s.get(k)) {
                    *x = (*x - zz) * sc;
                }
            }
        }
    });
    Ok(out)
}
