//! KV-cache quantization schemes, each named after the engine whose numerics it follows: what a
//! key or value row becomes when an engine writes it to a quantized cache and reads it back for
//! attention (issue #18). llama.cpp's block types are below; vLLM's (`fp8_e4m3`, `fp8_e5m2`,
//! `int8_per_token_head`, `fp8_per_token_head`) are described at their [`KvScheme`] variants and
//! checked bit for bit against torch's casts as vLLM's write paths use them.
//!
//! The llama.cpp block types (`-ctk`/`-ctv`) follow ggml's reference quantizers
//! (`ggml-quants.c`, `quantize_row_*_ref`, which the CUDA KV write path in `cpy-utils.cuh`
//! repeats), as gguf-py's numpy quantizers transcribe them bit for bit: blocks of 32 values along
//! the head dimension, scales (and minima) stored as f16 rounded to nearest even, and each type's
//! own rounding of the codes:
//!
//! | type | scale | code | value read back |
//! |---|---|---|---|
//! | `q8_0` | `d = amax / 127` | `roundf(x / d)` (half away from zero) | `q · d16` |
//! | `q4_0` | `d = vmax / −8` (`vmax`: the signed value of largest magnitude, first on ties) | `min(15, trunc(x / d + 8.5))` | `(q − 8) · d16` |
//! | `q4_1` | `d = (max − min) / 15`, `m = min` | `min(15, trunc((x − min) / d + 0.5))` | `q · d16 + m16` |
//! | `q5_0` | `d = vmax / −16` | `min(31, trunc(x / d + 16.5))` | `(q − 16) · d16` |
//! | `q5_1` | `d = (max − min) / 31`, `m = min` | `min(31, trunc((x − min) / d + 0.5))` | `q · d16 + m16` |
//! | `iq4_nl` | `d = Σ w·t[q]·x / Σ w·t[q]²`, `w = x²` (in order, f32) | index of the table value `t` nearest `x · (1 / (vmax / −127))`, ties up | `d16 · t[q]` |
//!
//! `iq4_nl` follows the CPU backend's write (`quantize_row_iq4_nl_ref`; gguf-py has no iq4_nl
//! quantizer, so its fixture comes from ggml-quants.c itself, compiled without FP contraction as
//! ggml-base is on x86-64). llama.cpp's CUDA write (`quantize_f32_iq4_nl_block`) sums the
//! least-squares terms in another order, with fused multiply-adds, and keeps `vmax / −127` where
//! the fit is degenerate, so its f16 scale can differ from the CPU's in the last place.
//!
//! The codes are computed with the f32 scale (`x · (1/d)`, as ggml does) and read back with the
//! f16 one. A zero scale gives zero codes. [`encode_block`] gives ggml's block bytes, so the
//! emulation is checked byte for byte against gguf-py (tests/fixtures/kv_cache); [`decode_block`]
//! reads them back as ggml's `dequantize_row_*` does.
//!
//! llama.cpp's Hadamard rotation (PR #21038, on by default for quantized cache types since
//! April 2026; `LLAMA_ATTN_ROT_DISABLE=1` turns it off) is [`KvCacheSetting::hadamard`]: where
//! the K type is quantized and the head size a multiple of 64, Q and K are multiplied by the
//! orthonormal Sylvester–Walsh–Hadamard matrix `H_n` (entries `±(1/sqrtf(n))` in f32, `H·H =
//! I`) in blocks of `n` along the head, `n` the largest power of two that divides the head size
//! (`build_input_k_rot`); V likewise in blocks of 64 (`build_input_v_rot`), with the attention
//! output rotated back. Since `(H q)·k̂ = q·(H k̂)` and `Σ p·(H v̂)` is `H` of `Σ p·v̂`, the
//! emulation rotates the row, rounds it, and rotates the rounded row back ([`rotated`]), which
//! is the same attention without touching Q or the output; the rotation is done in f64 and
//! rounded to f32 once (ggml's f32 matrix product can differ from it in the last bit).
//!
//! Not emulated here: llama.cpp's CPU backend writes q8_0 through its SIMD `quantize_row_q8_0`
//! (`127 / amax`, round to nearest even), which differs from the reference in the last code on
//! some values; the CUDA and reference paths, which this follows, agree with each other.

use half::{bf16, f16};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Values per llama.cpp block.
pub const BLOCK: usize = 32;

/// One KV-cache scheme (for K or for V).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KvScheme {
    /// The model dtype: nothing is rounded.
    None,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    /// llama.cpp `iq4_nl`: blocks of 32, 4-bit indices into a fixed non-uniform table
    /// ([`IQ4_NL_VALUES`]) with an f16 scale refit by least squares (see the module's table).
    Iq4Nl,
    /// exllamav3's quantized cache at 2 to 8 bits (`CacheLayer_quant`; see [`exl3_group`]):
    /// groups of 32 values rotated by H32, one f16 absmax scale, a midpoint grid.
    #[serde(rename = "exl3_q2")]
    Exl3Q2,
    #[serde(rename = "exl3_q3")]
    Exl3Q3,
    #[serde(rename = "exl3_q4")]
    Exl3Q4,
    #[serde(rename = "exl3_q5")]
    Exl3Q5,
    #[serde(rename = "exl3_q6")]
    Exl3Q6,
    #[serde(rename = "exl3_q7")]
    Exl3Q7,
    #[serde(rename = "exl3_q8")]
    Exl3Q8,
    /// vLLM `fp8_e4m3` (`fp8`): one fp32 scale per tensor (the checkpoint's `k_scale` /
    /// `v_scale`, else 1.0, vLLM's default without `calculate_kv_scales`), `x / scale` cast to
    /// e4m3 with round to nearest even, saturating at ±448 (the CUDA write's `__NV_SATFINITE`).
    Fp8E4m3,
    /// vLLM `fp8_e5m2`: as `fp8_e4m3` with e5m2 (±57344).
    Fp8E5m2,
    /// vLLM `int8_per_token_head`: one fp32 scale per token and head, `max(amax / 127, 1e-6)`,
    /// codes `clamp(x · (1 / scale), −128, 127)` stored as int8 by truncation toward zero (the
    /// Triton kernel's float-to-int store).
    Int8PerTokenHead,
    /// vLLM `fp8_per_token_head`: scale `max(amax / 448, 1e-6)` per token and head, codes
    /// `clamp(x · (1 / scale), ±448)` cast to e4m3 (round to nearest even).
    Fp8PerTokenHead,
}

impl KvScheme {
    /// Every scheme, in the order messages list them.
    pub const ALL: [KvScheme; 20] = [
        KvScheme::None,
        KvScheme::F16,
        KvScheme::Bf16,
        KvScheme::Q8_0,
        KvScheme::Q4_0,
        KvScheme::Q4_1,
        KvScheme::Q5_0,
        KvScheme::Q5_1,
        KvScheme::Iq4Nl,
        KvScheme::Exl3Q2,
        KvScheme::Exl3Q3,
        KvScheme::Exl3Q4,
        KvScheme::Exl3Q5,
        KvScheme::Exl3Q6,
        KvScheme::Exl3Q7,
        KvScheme::Exl3Q8,
        KvScheme::Fp8E4m3,
        KvScheme::Fp8E5m2,
        KvScheme::Int8PerTokenHead,
        KvScheme::Fp8PerTokenHead,
    ];

    /// The canonical name (`q8_0`), as flags and cards spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            KvScheme::None => "none",
            KvScheme::F16 => "f16",
            KvScheme::Bf16 => "bf16",
            KvScheme::Q8_0 => "q8_0",
            KvScheme::Q4_0 => "q4_0",
            KvScheme::Q4_1 => "q4_1",
            KvScheme::Q5_0 => "q5_0",
            KvScheme::Q5_1 => "q5_1",
            KvScheme::Iq4Nl => "iq4_nl",
            KvScheme::Exl3Q2 => "exl3_q2",
            KvScheme::Exl3Q3 => "exl3_q3",
            KvScheme::Exl3Q4 => "exl3_q4",
            KvScheme::Exl3Q5 => "exl3_q5",
            KvScheme::Exl3Q6 => "exl3_q6",
            KvScheme::Exl3Q7 => "exl3_q7",
            KvScheme::Exl3Q8 => "exl3_q8",
            KvScheme::Fp8E4m3 => "fp8_e4m3",
            KvScheme::Fp8E5m2 => "fp8_e5m2",
            KvScheme::Int8PerTokenHead => "int8_per_token_head",
            KvScheme::Fp8PerTokenHead => "fp8_per_token_head",
        }
    }

    /// A scheme by its canonical name or an engine's spelling of it (`float16`, `bfloat16`,
    /// `Q8_0`).
    pub fn from_name(name: &str) -> Option<KvScheme> {
        let lower = name.to_ascii_lowercase();
        let canonical = match lower.as_str() {
            "float16" | "fp16" | "half" => "f16",
            "bfloat16" => "bf16",
            "auto" => "none",
            "fp8" => "fp8_e4m3",
            other => other,
        };
        Self::ALL.into_iter().find(|s| s.as_str() == canonical)
    }

    /// The accepted names, for messages.
    pub fn names() -> String {
        Self::ALL.map(KvScheme::as_str).join(", ")
    }

    /// Why `name` is not a scheme, for messages: an engine's cache type that cardproof knows of
    /// but does not emulate says so and why (a run of it cannot be followed), anything else
    /// gets the list.
    pub fn unknown(name: &str) -> String {
        let lower = name.trim().to_ascii_lowercase();
        let why = match lower.as_str() {
            "int4_per_token_head" | "int2_per_token_head" => Some(
                "vLLM's, but its numerics (the channels per fp16 scale and the magnitude levels of its codebook) are not pinned from a retrievable vLLM source, so cardproof does not emulate it",
            ),
            "nvfp4" | "fp8_inc" | "fp8_ds_mla" => {
                Some("a vLLM cache type cardproof does not emulate")
            }
            s if s.starts_with("turboquant") => {
                Some("vLLM's TurboQuant cache, which cardproof does not emulate")
            }
            s if s.starts_with("exl3") || s.starts_with("exllamav3") => Some(
                "not one of exllamav3's cache widths cardproof names (exl3_q2 to exl3_q8: k_bits / v_bits of CacheLayer_quant, without the cubic compander)",
            ),
            "iq4_xs" | "q2_k" | "q3_k" | "q4_k" | "q5_k" | "q6_k" | "q8_k" => {
                Some("a ggml weight type, not one llama.cpp accepts for its KV cache")
            }
            _ => None,
        };
        match why {
            Some(why) => format!(
                "`{name}` is {why}; the KV-cache schemes are {}",
                Self::names()
            ),
            None => format!(
                "`{name}` is not a KV-cache scheme; use one of {}",
                Self::names()
            ),
        }
    }

    /// The engine whose numerics the scheme follows, for records and reports.
    pub fn describe(self) -> &'static str {
        match self {
            KvScheme::None => "the model dtype (not rounded)",
            KvScheme::F16 => "f16 (round to nearest even)",
            KvScheme::Bf16 => "bf16 (round to nearest even)",
            KvScheme::Q8_0 => "llama.cpp q8_0: blocks of 32, f16 scale amax/127, roundf",
            KvScheme::Q4_0 => "llama.cpp q4_0: blocks of 32, f16 scale vmax/-8, +8.5 truncation",
            KvScheme::Q4_1 => "llama.cpp q4_1: blocks of 32, f16 scale and minimum, 15 steps",
            KvScheme::Q5_0 => "llama.cpp q5_0: blocks of 32, f16 scale vmax/-16, +16.5 truncation",
            KvScheme::Q5_1 => "llama.cpp q5_1: blocks of 32, f16 scale and minimum, 31 steps",
            KvScheme::Iq4Nl => {
                "llama.cpp iq4_nl: blocks of 32, non-uniform 16-value table, least-squares f16 scale"
            }
            KvScheme::Exl3Q2
            | KvScheme::Exl3Q3
            | KvScheme::Exl3Q4
            | KvScheme::Exl3Q5
            | KvScheme::Exl3Q6
            | KvScheme::Exl3Q7
            | KvScheme::Exl3Q8 => {
                "exllamav3 quantized cache: f16 in, groups of 32 rotated by H32, f16 absmax scale, midpoint grid"
            }
            KvScheme::Fp8E4m3 => "vLLM fp8_e4m3: per-tensor fp32 scale, RNE, saturating",
            KvScheme::Fp8E5m2 => "vLLM fp8_e5m2: per-tensor fp32 scale, RNE, saturating",
            KvScheme::Int8PerTokenHead => {
                "vLLM int8_per_token_head: fp32 scale amax/127 per token and head, truncated codes"
            }
            KvScheme::Fp8PerTokenHead => {
                "vLLM fp8_per_token_head: fp32 scale amax/448 per token and head, e4m3 RNE"
            }
        }
    }

    /// Whether the scheme is one of llama.cpp's block types (rows a whole number of blocks of
    /// 32; what llama.cpp's Hadamard rotation goes with).
    pub fn is_blocked(self) -> bool {
        block_bytes(self) > 0
    }

    /// exllamav3's bits per value, for its schemes.
    pub fn exl3_bits(self) -> Option<u32> {
        Some(match self {
            KvScheme::Exl3Q2 => 2,
            KvScheme::Exl3Q3 => 3,
            KvScheme::Exl3Q4 => 4,
            KvScheme::Exl3Q5 => 5,
            KvScheme::Exl3Q6 => 6,
            KvScheme::Exl3Q7 => 7,
            KvScheme::Exl3Q8 => 8,
            _ => return None,
        })
    }

    /// Whether one scale covers each 32 values along the head (llama.cpp's blocks and
    /// exllamav3's groups), so the head size must be a multiple of 32.
    pub fn in_groups_of_32(self) -> bool {
        self.is_blocked() || self.exl3_bits().is_some()
    }

    /// Whether the scheme quantizes (not merely a float cast): what a card's disclosure of it
    /// makes worth following in a rerun.
    pub fn is_quantized(self) -> bool {
        !matches!(self, KvScheme::None | KvScheme::F16 | KvScheme::Bf16)
    }

    /// Whether the scheme takes a per-tensor scale (vLLM's per-tensor fp8).
    pub fn takes_tensor_scale(self) -> bool {
        matches!(self, KvScheme::Fp8E4m3 | KvScheme::Fp8E5m2)
    }

    /// Rounds `rows` (each `row_len` values: one head's key or value of one token) to what the
    /// cache gives back, in place. Blocked schemes need `row_len` to be a multiple of
    /// [`BLOCK`] (llama.cpp refuses other head sizes for these types); the caller checks it at
    /// load time, and a mismatch here is a bug (the last partial block is left unrounded
    /// rather than read out of bounds).
    pub fn apply(self, rows: &mut [f32], row_len: usize) {
        self.apply_scaled(rows, row_len, 1.0);
    }

    /// [`KvScheme::apply`] with the per-tensor scale of the fp8 schemes (ignored by the others).
    pub fn apply_scaled(self, rows: &mut [f32], row_len: usize, tensor_scale: f32) {
        match self {
            KvScheme::Fp8E4m3 => rows.iter_mut().for_each(|v| {
                *v = crate::dequant::round_to_e4m3(*v / tensor_scale) * tensor_scale;
            }),
            KvScheme::Fp8E5m2 => rows.iter_mut().for_each(|v| {
                *v = crate::dequant::round_to_e5m2(*v / tensor_scale) * tensor_scale;
            }),
            KvScheme::Int8PerTokenHead | KvScheme::Fp8PerTokenHead => {
                for row in rows.chunks_mut(row_len.max(1)) {
                    per_token_head(self, row);
                }
            }
            KvScheme::None => {}
            s if s.exl3_bits().is_some() => {
                let bits = s.exl3_bits().expect("an exllamav3 scheme");
                debug_assert!(row_len.is_multiple_of(BLOCK), "row of {row_len} values");
                for group in rows.chunks_exact_mut(BLOCK) {
                    exl3_group(bits, group.try_into().expect("a whole group"));
                }
            }
            KvScheme::F16 => rows
                .iter_mut()
                .for_each(|v| *v = f16::from_f32(*v).to_f32()),
            KvScheme::Bf16 => rows
                .iter_mut()
                .for_each(|v| *v = bf16::from_f32(*v).to_f32()),
            blocked => {
                debug_assert!(row_len.is_multiple_of(BLOCK), "row of {row_len} values");
                let mut bytes = [0u8; 40];
                for block in rows.chunks_exact_mut(BLOCK) {
                    let block: &mut [f32; BLOCK] = block.try_into().expect("a whole block");
                    let n = encode_block(blocked, block, &mut bytes);
                    decode_block(blocked, &bytes[..n], block);
                }
            }
        }
    }
}

impl std::fmt::Display for KvScheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The KV-cache schemes of one run: K and V separately (llama.cpp's `-ctk` / `-ctv`), and
/// whether llama.cpp's Hadamard rotation runs with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KvCacheSetting {
    pub k: KvScheme,
    pub v: KvScheme,
    /// llama.cpp's rotation of each llama.cpp-quantized side (see the module doc); written
    /// `+hadamard` after the schemes' name.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hadamard: bool,
    /// vLLM's `calculate_kv_scales`: each attention layer's per-tensor fp8 scales computed
    /// once, from the first forward pass ([`computed_scales`]), instead of the checkpoint's
    /// (else 1.0); written `+computed` after the name.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub computed_scales: bool,
    /// transformers' `QuantizedCache` semantics instead of write-then-read
    /// ([`ResidualWindow`]); written `+residualN` (and `+chunkC`) after the name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub residual: Option<ResidualWindow>,
}

/// transformers' `QuantizedCache` semantics (`QuantizedLayer.update`, cache_utils.py), with the
/// scheme's own rounding: the first update of a sequence (its first prefill chunk) stores its
/// keys and values rounded but attention reads them unrounded; each later update reads
/// `cat(stored, residual, new)` with the residual and the new chunk unrounded, and once the
/// residual and the new chunk reach `length` tokens the whole history is rounded again from
/// what attention read (stored rows included) and the residual emptied. A single prefill
/// therefore sees no KV quantization at all: the window is prefilled in chunks of `chunk`
/// tokens, which the number depends on, so both are recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ResidualWindow {
    /// `residual_length` (transformers' default [`DEFAULT_RESIDUAL`]).
    pub length: u32,
    /// Tokens per prefill chunk (default: `length`).
    pub chunk: u32,
}

/// transformers' default `residual_length`.
pub const DEFAULT_RESIDUAL: u32 = 128;
/// The largest residual length or prefill chunk accepted: bounds the loops they size.
pub const MAX_RESIDUAL: u32 = 1 << 20;

impl ResidualWindow {
    /// A window of `length` (default 128) and `chunk` (default `length`), each in
    /// 1..=[`MAX_RESIDUAL`].
    pub fn new(length: Option<u32>, chunk: Option<u32>) -> Result<ResidualWindow, String> {
        let length = length.unwrap_or(DEFAULT_RESIDUAL);
        let chunk = chunk.unwrap_or(length);
        for (what, n) in [("residual length", length), ("prefill chunk", chunk)] {
            if !(1..=MAX_RESIDUAL).contains(&n) {
                return Err(format!(
                    "the KV cache's {what} is {n}; it must be 1 to {MAX_RESIDUAL} tokens"
                ));
            }
        }
        Ok(ResidualWindow { length, chunk })
    }
}

/// The raw values of the KV-cache flags (`--kv-cache`, `--kv-cache-k`, `--kv-cache-v`,
/// `--kv-cache-rotation`, `--kv-cache-scales`, `--kv-cache-semantics`, `--kv-cache-residual`,
/// `--kv-cache-chunk`).
#[derive(Debug, Clone, Copy, Default)]
pub struct KvFlags<'a> {
    pub both: Option<&'a str>,
    pub k: Option<&'a str>,
    pub v: Option<&'a str>,
    pub rotation: Option<&'a str>,
    pub scales: Option<&'a str>,
    pub semantics: Option<&'a str>,
    pub residual: Option<u32>,
    pub chunk: Option<u32>,
}

/// The suffix [`KvCacheSetting::name`] gives a rotated setting.
const HADAMARD_SUFFIX: &str = "+hadamard";
/// The suffix [`KvCacheSetting::name`] gives a setting whose fp8 scales are computed.
const COMPUTED_SUFFIX: &str = "+computed";
/// The suffix [`KvCacheSetting::name`] gives transformers' QuantizedCache semantics, followed
/// by the residual length (and `+chunkC` where the prefill chunk differs from it).
const RESIDUAL_SUFFIX: &str = "+residual";

/// vLLM's divisors for computed scales (`K_SCALE_CONSTANT`, `V_SCALE_CONSTANT`, defaults of
/// `vllm/envs.py`): `k_scale = amax(|key|) / 200`, `v_scale = amax(|value|) / 100`.
pub const K_SCALE_RANGE: f32 = 200.0;
pub const V_SCALE_RANGE: f32 = 100.0;

/// vLLM's `Attention.calc_kv_scales` on one layer's keys and values of the first forward pass
/// (after RoPE and any key norm, as the layer receives them): the largest magnitude of each,
/// divided in f32 (the 0-dim model-dtype max over a 0-dim fp32 range promotes to fp32). An
/// error where a scale would be zero or not finite (vLLM would divide by it), naming the side.
pub fn computed_scales(keys: &[f32], values: &[f32]) -> Result<(f32, f32), String> {
    let amax = |x: &[f32]| {
        x.iter()
            .fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m })
    };
    let (ka, va) = (amax(keys), amax(values));
    let (k, v) = (ka / K_SCALE_RANGE, va / V_SCALE_RANGE);
    for (side, s, a) in [("key", k, ka), ("value", v, va)] {
        if !(s.is_finite() && s > 0.0) || keys.iter().chain(values).any(|x| x.is_nan()) {
            return Err(format!(
                "the computed {side} scale is {s} (amax {a}): the first forward pass gave no finite, non-zero {side}s to scale by"
            ));
        }
    }
    Ok((k, v))
}

/// llama.cpp's rotation block sizes for keys and values of a head of `head_dim` values: keys in
/// blocks of the largest power of two (at least 64) that divides the head, values in blocks of
/// 64; `None` where llama.cpp does not rotate (a head size that is not a multiple of 64).
pub fn rotation_sizes(head_dim: usize) -> Option<(usize, usize)> {
    if head_dim == 0 || !head_dim.is_multiple_of(64) {
        return None;
    }
    let mut k = 64;
    while head_dim.is_multiple_of(k * 2) {
        k *= 2;
    }
    Some((k, 64))
}

/// `x ← H_n x` on each block of `n` values (`n` a power of two): the Sylvester Walsh–Hadamard
/// transform scaled by ggml's f32 entry `1/sqrtf(n)`, done in f64 and rounded to f32 once.
pub fn hadamard(x: &mut [f32], n: usize) {
    debug_assert!(n.is_power_of_two() && x.len().is_multiple_of(n));
    // ggml_gen_hadamard: `1.0 / sqrtf(n)` (a double quotient) stored as f32.
    let entry = f64::from((1.0 / f64::from((n as f32).sqrt())) as f32);
    let mut y = vec![0f64; n];
    for block in x.chunks_exact_mut(n) {
        for (a, b) in y.iter_mut().zip(block.iter()) {
            *a = f64::from(*b);
        }
        let mut h = 1;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (y[j], y[j + h]);
                    y[j] = a + b;
                    y[j + h] = a - b;
                }
            }
            h *= 2;
        }
        for (b, a) in block.iter_mut().zip(y.iter()) {
            // `+ 0.0`: a zero comes out +0, as a dot product accumulated from 0 gives it.
            *b = (*a * entry + 0.0) as f32;
        }
    }
}

/// `rows` rounded by `scheme` in the rotated basis and rotated back (`H · round(H x)`) when
/// `rotation` is a block size, else rounded as they are.
pub fn rotated(
    scheme: KvScheme,
    rows: &mut [f32],
    row_len: usize,
    tensor_scale: f32,
    rotation: Option<usize>,
) {
    match rotation {
        Some(n) => {
            hadamard(rows, n);
            scheme.apply_scaled(rows, row_len, tensor_scale);
            hadamard(rows, n);
        }
        None => scheme.apply_scaled(rows, row_len, tensor_scale),
    }
}

/// A flag that contradicts what `--kv-cache LABEL` already says (`q4_0+hadamard` with
/// `--kv-cache-rotation none`, `fp8_e4m3+computed` with `--kv-cache-scales checkpoint`,
/// `+residual64` with `--kv-cache-semantics write_then_read` or another `--kv-cache-residual`):
/// refused, naming both, rather than one silently winning.
fn conflicts(
    label: Option<&str>,
    base: &KvCacheSetting,
    hadamard: Option<bool>,
    computed: Option<bool>,
    residual_semantics: Option<bool>,
    residual: Option<u32>,
    chunk: Option<u32>,
) -> Result<(), String> {
    let label = label.unwrap_or_default();
    let says = |what: &str| format!("--kv-cache {label} ({what})");
    if base.hadamard && hadamard == Some(false) {
        return Err(format!(
            "--kv-cache-rotation none contradicts {}: drop one",
            says("+hadamard")
        ));
    }
    if base.computed_scales && computed == Some(false) {
        return Err(format!(
            "--kv-cache-scales checkpoint contradicts {}: drop one",
            says("+computed")
        ));
    }
    if let Some(w) = base.residual {
        if residual_semantics == Some(false) {
            return Err(format!(
                "--kv-cache-semantics write_then_read contradicts {}: drop one",
                says("transformers' QuantizedCache (+residual)")
            ));
        }
        // Only what the label spells out is stated (`+residual` alone is the default length,
        // no `+chunkC` the default chunk); a flag may set what it leaves open.
        let stated = |part: &str| {
            label
                .split('+')
                .any(|p| p.starts_with(part) && p.len() > part.len())
        };
        if let Some(n) = residual.filter(|&n| n != w.length && stated("residual")) {
            return Err(format!(
                "--kv-cache-residual {n} contradicts {}: drop one",
                says(&format!("a residual of {}", w.length))
            ));
        }
        if let Some(c) = chunk.filter(|&c| c != w.chunk && stated("chunk")) {
            return Err(format!(
                "--kv-cache-chunk {c} contradicts {}: drop one",
                says(&format!("a prefill chunk of {}", w.chunk))
            ));
        }
    }
    Ok(())
}

impl KvCacheSetting {
    /// From `--kv-cache` (both) and `--kv-cache-k` / `--kv-cache-v` (each overrides its half),
    /// with the rotation, scale and semantics flags. `None` when no flag is given. An unknown
    /// name is an error listing the known ones.
    pub fn from_flags(flags: KvFlags<'_>) -> Result<Option<KvCacheSetting>, String> {
        let KvFlags {
            both,
            k,
            v,
            rotation,
            scales,
            semantics,
            residual,
            chunk,
        } = flags;
        if both.is_none() && k.is_none() && v.is_none() {
            let residual = residual.map(|n| format!("--kv-cache-residual {n}"));
            let chunk = chunk.map(|n| format!("--kv-cache-chunk {n}"));
            let semantics = semantics.map(|s| format!("--kv-cache-semantics {s}"));
            return match (rotation, scales, semantics.or(residual).or(chunk)) {
                (None, None, None) => Ok(None),
                (Some(r), _, _) => Err(format!(
                    "--kv-cache-rotation {r}: rotates a quantized KV cache; give the cache with --kv-cache (or -k / -v)"
                )),
                (None, Some(s), _) => Err(format!(
                    "--kv-cache-scales {s}: sets the scales of a per-tensor fp8 KV cache; give the cache with --kv-cache (or -k / -v)"
                )),
                (None, None, Some(flag)) => Err(format!(
                    "{flag}: sets how a quantized KV cache is read back; give the cache with --kv-cache (or -k / -v)"
                )),
            };
        }
        let computed = match scales {
            None => None,
            Some(s) if s.eq_ignore_ascii_case("computed") => Some(true),
            Some(s) if s.eq_ignore_ascii_case("checkpoint") => Some(false),
            Some(s) => {
                return Err(format!(
                    "--kv-cache-scales: `{s}` is not a scale source; use `computed` (vLLM's calculate_kv_scales: amax/200 for keys, amax/100 for values, from the first forward pass) or `checkpoint` (its k_scale/v_scale, else 1.0)"
                ));
            }
        };
        let hadamard = match rotation {
            None => None,
            Some(r) if r.eq_ignore_ascii_case("hadamard") => Some(true),
            Some(r) if r.eq_ignore_ascii_case("none") => Some(false),
            Some(r) => {
                return Err(format!(
                    "--kv-cache-rotation: `{r}` is not a rotation; use `hadamard` (llama.cpp's, its default for quantized caches since April 2026) or `none`"
                ));
            }
        };
        let residual_semantics = match semantics {
            None => None,
            Some(s) if s.eq_ignore_ascii_case("quantized_cache_residual") => Some(true),
            Some(s) if s.eq_ignore_ascii_case("write_then_read") => Some(false),
            Some(s) => {
                return Err(format!(
                    "--kv-cache-semantics: `{s}` is not a read-back semantics; use `write_then_read` (vLLM, llama.cpp: a chunk's keys and values are stored before attention reads them) or `quantized_cache_residual` (transformers' QuantizedCache: the first prefill chunk and a residual window read unrounded)"
                ));
            }
        };
        let parse = |flag: &str, name: &str| {
            KvScheme::from_name(name).ok_or_else(|| format!("{flag}: {}", KvScheme::unknown(name)))
        };
        // `--kv-cache` also takes a recorded label (`k:q8_0/v:q4_0`), so a run's record can be
        // passed back as it is.
        let base = match both {
            Some(name) => KvCacheSetting::from_label(name).ok_or_else(|| {
                format!(
                    "--kv-cache: {} (or k:SCHEME/v:SCHEME, with +hadamard, +computed, +residualN)",
                    KvCacheSetting::unknown_label(name)
                )
            })?,
            None => KvCacheSetting::plain(),
        };
        conflicts(
            both,
            &base,
            hadamard,
            computed,
            residual_semantics,
            residual,
            chunk,
        )?;
        let residual = match (residual_semantics, base.residual) {
            (Some(false), _) if residual.is_some() || chunk.is_some() => {
                return Err(
                    "--kv-cache-residual and --kv-cache-chunk size transformers' QuantizedCache window; they do not go with --kv-cache-semantics write_then_read".into(),
                );
            }
            (Some(false), _) => None,
            (None, None) if residual.is_none() && chunk.is_none() => None,
            (_, from_label) => Some(ResidualWindow::new(
                residual.or(from_label.map(|w| w.length)),
                chunk.or(from_label.map(|w| w.chunk)),
            )?),
        };
        KvCacheSetting {
            k: k.map(|n| parse("--kv-cache-k", n))
                .transpose()?
                .unwrap_or(base.k),
            v: v.map(|n| parse("--kv-cache-v", n))
                .transpose()?
                .unwrap_or(base.v),
            hadamard: hadamard.unwrap_or(base.hadamard),
            computed_scales: computed.unwrap_or(base.computed_scales),
            residual,
        }
        .checked_scales()
        .map(Some)
    }

    /// Itself, or an error where it computes scales and neither side takes a per-tensor one.
    /// Where the setting asks for llama.cpp's rotation, that K or V is one of llama.cpp's
    /// quantized types and neither side is another engine's.
    fn check_rotation_schemes(self) -> Result<(), String> {
        if !self.hadamard {
            return Ok(());
        }
        if let Some(s) = [self.k, self.v]
            .into_iter()
            .find(|s| s.is_quantized() && !s.is_blocked())
        {
            return Err(format!(
                "llama.cpp's Hadamard rotation goes with its own cache types (q8_0, q4_0, ...), not with {s}"
            ));
        }
        if !self.k.is_blocked() && !self.v.is_blocked() {
            return Err(
                "llama.cpp's Hadamard rotation applies only to a quantized cache; neither K nor V is one".into(),
            );
        }
        Ok(())
    }

    /// The setting, if its parts go together without a model to look at (scale source and
    /// semantics, rotation and schemes): what flags, sweeps and cards are checked with before a
    /// runner starts.
    pub fn checked_scales(self) -> Result<KvCacheSetting, String> {
        self.check_rotation_schemes()?;
        if self.computed_scales && !(self.k.takes_tensor_scale() || self.v.takes_tensor_scale()) {
            return Err(format!(
                "computed scales (vLLM's calculate_kv_scales) belong to the per-tensor fp8 caches (fp8_e4m3, fp8_e5m2), and this cache is {}",
                self.label()
            ));
        }
        if self.computed_scales && self.residual.is_some() {
            return Err(
                "computed scales are vLLM's (calculate_kv_scales, write-then-read); transformers' QuantizedCache semantics with them is no engine's cache, so it is not emulated".into(),
            );
        }
        Ok(self)
    }

    /// Nothing rounded, nothing rotated: the model dtype.
    pub fn plain() -> KvCacheSetting {
        KvCacheSetting::both(KvScheme::None)
    }

    /// `scheme` for K and V, unrotated.
    pub fn both(scheme: KvScheme) -> KvCacheSetting {
        KvCacheSetting {
            k: scheme,
            v: scheme,
            hadamard: false,
            computed_scales: false,
            residual: None,
        }
    }

    /// The rotation block sizes for keys and values of a head of `head_dim`: a side is rotated
    /// where the setting asks for the rotation and that side is one of llama.cpp's quantized
    /// types, as llama.cpp decides it (`attn_rot_k`, `attn_rot_v`). An error where the setting
    /// asks for a rotation llama.cpp would not do.
    pub fn rotations(self, head_dim: usize) -> Result<(Option<usize>, Option<usize>), String> {
        if !self.hadamard {
            return Ok((None, None));
        }
        self.check_rotation_schemes()?;
        let Some((k, v)) = rotation_sizes(head_dim) else {
            return Err(format!(
                "llama.cpp rotates only heads whose size is a multiple of 64, and this model's is {head_dim}: llama.cpp runs it unrotated, so drop the rotation"
            ));
        };
        Ok((
            self.k.is_blocked().then_some(k),
            self.v.is_blocked().then_some(v),
        ))
    }

    /// Why [`KvCacheSetting::from_label`] refused `label`, naming the part at fault.
    pub fn unknown_label(label: &str) -> String {
        let base = label.trim().split('+').next().unwrap_or("").trim();
        let schemes: Vec<&str> = match (base.strip_prefix("k:"), base.split_once("/v:")) {
            (Some(_), Some((k, v))) => vec![&k[2..], v],
            _ => vec![base],
        };
        match schemes
            .into_iter()
            .find(|s| KvScheme::from_name(s).is_none())
        {
            Some(bad) => KvScheme::unknown(bad),
            None => format!(
                "`{label}` is not a KV-cache setting: the suffixes are +hadamard, +computed, +residualN and +chunkC (with a residual), each once"
            ),
        }
    }

    /// A recorded [`KvCacheSetting::label`] read back (`q8_0`, `k:q8_0/v:q4_0`); `None` for
    /// anything else.
    pub fn from_label(label: &str) -> Option<KvCacheSetting> {
        let mut parts = label.trim().split('+');
        let label = parts.next()?.trim();
        let (mut hadamard, mut computed_scales) = (false, false);
        let (mut residual, mut chunk): (Option<u32>, Option<u32>) = (None, None);
        // The suffixes in any order, each once.
        for suffix in parts {
            let number = |digits: &str| -> Option<u32> {
                (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| digits.parse().ok())
                    .flatten()
            };
            match suffix.trim() {
                "hadamard" if !hadamard => hadamard = true,
                "computed" if !computed_scales => computed_scales = true,
                "residual" if residual.is_none() => residual = Some(DEFAULT_RESIDUAL),
                s if residual.is_none() && s.starts_with("residual") => {
                    residual = Some(number(&s["residual".len()..])?);
                }
                s if chunk.is_none() && s.starts_with("chunk") => {
                    chunk = Some(number(&s["chunk".len()..])?);
                }
                _ => return None,
            }
        }
        // A chunk alone sizes nothing: write-then-read reads the same in any chunks.
        if chunk.is_some() && residual.is_none() {
            return None;
        }
        let residual = match residual {
            Some(_) => Some(ResidualWindow::new(residual, chunk).ok()?),
            None => None,
        };
        let (k, v) = match KvScheme::from_name(label) {
            Some(scheme) => (scheme, scheme),
            None => {
                let (k, v) = label.split_once('/')?;
                (
                    KvScheme::from_name(k.trim().strip_prefix("k:")?)?,
                    KvScheme::from_name(v.trim().strip_prefix("v:")?)?,
                )
            }
        };
        Some(KvCacheSetting {
            k,
            v,
            hadamard,
            computed_scales,
            residual,
        })
    }

    /// Whether anything is rounded.
    pub fn changes_anything(self) -> bool {
        self.k != KvScheme::None || self.v != KvScheme::None
    }

    /// The name recorded as the run's `kv_cache_dtype`: the scheme (`q8_0`) when K and V share
    /// it, else `k:q8_0/v:q4_0`.
    pub fn label(self) -> String {
        if self.k == self.v {
            self.k.as_str().to_owned()
        } else {
            format!("k:{}/v:{}", self.k, self.v)
        }
    }

    /// The whole setting in one word, rotation included (`q4_0+hadamard`): what sweeps, flags
    /// and messages use. The record's `kv_cache_dtype` is [`KvCacheSetting::label`], the cache
    /// types alone, as engines' flags name them; its rotation is `kv_cache.rotation`.
    pub fn name(self) -> String {
        let mut name = self.label();
        if self.hadamard {
            name.push_str(HADAMARD_SUFFIX);
        }
        if self.computed_scales {
            name.push_str(COMPUTED_SUFFIX);
        }
        if let Some(w) = self.residual {
            name.push_str(&format!("{RESIDUAL_SUFFIX}{}", w.length));
            if w.chunk != w.length {
                name.push_str(&format!("+chunk{}", w.chunk));
            }
        }
        name
    }
}

/// vLLM's per-token-head quantization of one head's row, read back (`q · scale`).
fn per_token_head(scheme: KvScheme, row: &mut [f32]) {
    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (top, bottom) = match scheme {
        KvScheme::Int8PerTokenHead => (127.0, -128.0),
        _ => (448.0, -448.0),
    };
    let scale = (amax / top).max(1e-6);
    let inv = 1.0 / scale;
    for v in row.iter_mut() {
        let q = (*v * inv).clamp(bottom, top);
        let q = match scheme {
            // Through the integer, as the cache holds it (a negative zero reads back as 0).
            KvScheme::Int8PerTokenHead => f32::from(q.trunc() as i8),
            _ => crate::dequant::round_to_e4m3(q),
        };
        *v = q * scale;
    }
}

/// Bytes of one block of `scheme` (ggml's `sizeof(block_*)`); 0 for unblocked schemes.
pub fn block_bytes(scheme: KvScheme) -> usize {
    match scheme {
        KvScheme::Q8_0 => 34,
        KvScheme::Q4_0 | KvScheme::Iq4Nl => 18,
        KvScheme::Q4_1 => 20,
        KvScheme::Q5_0 => 22,
        KvScheme::Q5_1 => 24,
        _ => 0,
    }
}

/// The value of largest magnitude, with its sign (the first such on ties, as numpy's `argmax`
/// and ggml's strict `>` scan pick it).
fn signed_extreme(x: &[f32; BLOCK]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32; BLOCK]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// `1 / d`, or 0 for a zero scale (ggml's `d ? 1.0f/d : 0.0f`).
fn inverse(d: f32) -> f32 {
    if d == 0.0 { 0.0 } else { 1.0 / d }
}

/// ggml's `(int8_t)` / `(uint8_t)` cast of a non-negative float: truncation toward zero.
fn truncated(x: f32) -> u8 {
    x.trunc().clamp(0.0, 255.0) as u8
}

/// Packs 32 codes of up to 5 bits as ggml does: the low nibbles of values `j` and `j + 16` share
/// byte `j` (low, high); the fifth bits go to a little-endian 32-bit mask.
fn pack_nibbles(codes: &[u8; BLOCK], qs: &mut [u8]) {
    for j in 0..BLOCK / 2 {
        qs[j] = (codes[j] & 0x0F) | ((codes[j + BLOCK / 2] & 0x0F) << 4);
    }
}

fn high_bits(codes: &[u8; BLOCK]) -> [u8; 4] {
    let mut mask = 0u32;
    for (j, &c) in codes.iter().enumerate() {
        mask |= u32::from(c >> 4 & 1) << j;
    }
    mask.to_le_bytes()
}

/// Encodes one block of a blocked scheme into `out` in ggml's layout and returns its length
/// ([`block_bytes`]). Non-finite inputs give what ggml's arithmetic gives (the caller decides
/// whether to accept them); an unblocked scheme writes nothing and returns 0.
pub fn encode_block(scheme: KvScheme, x: &[f32; BLOCK], out: &mut [u8]) -> usize {
    let f16_bytes = |v: f32| f16::from_f32(v).to_le_bytes();
    let mut codes = [0u8; BLOCK];
    match scheme {
        KvScheme::Q8_0 => {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = inverse(d);
            out[..2].copy_from_slice(&f16_bytes(d));
            for (o, &v) in out[2..34].iter_mut().zip(x) {
                // roundf: half away from zero.
                *o = ((v * id).round() as i8) as u8;
            }
        }
        KvScheme::Q4_0 | KvScheme::Q5_0 => {
            let (levels, offset, top) = if scheme == KvScheme::Q4_0 {
                (-8.0, 8.5, 15)
            } else {
                (-16.0, 16.5, 31)
            };
            let d = signed_extreme(x) / levels;
            let id = inverse(d);
            for (c, &v) in codes.iter_mut().zip(x) {
                *c = truncated(v * id + offset).min(top);
            }
            out[..2].copy_from_slice(&f16_bytes(d));
            if scheme == KvScheme::Q4_0 {
                pack_nibbles(&codes, &mut out[2..18]);
            } else {
                out[2..6].copy_from_slice(&high_bits(&codes));
                pack_nibbles(&codes, &mut out[6..22]);
            }
        }
        KvScheme::Q4_1 | KvScheme::Q5_1 => {
            let (steps, top) = if scheme == KvScheme::Q4_1 {
                (15.0, 15)
            } else {
                (31.0, 31)
            };
            let (min, max) = min_max(x);
            let d = (max - min) / steps;
            let id = inverse(d);
            for (c, &v) in codes.iter_mut().zip(x) {
                *c = truncated((v - min) * id + 0.5).min(top);
            }
            out[..2].copy_from_slice(&f16_bytes(d));
            out[2..4].copy_from_slice(&f16_bytes(min));
            if scheme == KvScheme::Q4_1 {
                pack_nibbles(&codes, &mut out[4..20]);
            } else {
                out[4..8].copy_from_slice(&high_bits(&codes));
                pack_nibbles(&codes, &mut out[8..24]);
            }
        }
        KvScheme::Iq4Nl => {
            let (d, codes) = iq4_nl(x);
            out[..2].copy_from_slice(&f16_bytes(d));
            pack_nibbles(&codes, &mut out[2..18]);
        }
        _ => return 0,
    }
    block_bytes(scheme)
}

/// `1/sqrt(32)` as exllamav3's kernels spell it (rounded to f32).
const EXL3_R32: f32 = 0.176_776_69;

/// The unnormalized Walsh–Hadamard transform of 32 values in f32, one butterfly stage per index
/// bit from the lowest (`(a, b) -> (a + b, a − b)`): the order of exllamav3's in-register H4 and
/// its lane-shuffled H8, so each stage rounds as the kernel's does.
fn walsh_hadamard_32(v: &mut [f32; BLOCK]) {
    let mut h = 1;
    while h < BLOCK {
        for i in 0..BLOCK {
            if i & h == 0 {
                let (a, b) = (v[i], v[i + h]);
                v[i] = a + b;
                v[i + h] = a - b;
            }
        }
        h <<= 1;
    }
}

/// One group of 32 values as exllamav3's quantized cache stores and reads it back
/// (`q_cache_kernels.cuh`, `quant_block_x4` and `dequant_block_x4`, no compander): the values
/// as f16 (the cache takes half), rotated by H32 and scaled by `1/sqrt(32)`; the scale `s` is the
/// rotated group's absmax plus 1e-10, stored as f16; codes `floor((v / s) · 2^(b−1) + 2^(b−1))`
/// clamped to `[0, 2^b − 1]` (the reciprocal `1/s` in f32, as the kernel multiplies by it);
/// read back as `(q − (2^(b−1) − 0.5)) · (s16 · 1/sqrt(32) / 2^(b−1))`, rotated back by H32 and
/// rounded to f16.
fn exl3_group(bits: u32, x: &mut [f32; BLOCK]) {
    let (scale, codes) = exl3_encode(bits, x);
    *x = exl3_decode(bits, scale, &codes);
}

/// exllamav3's write of one group: its f16 scale and codes.
fn exl3_encode(bits: u32, x: &[f32; BLOCK]) -> (f16, [i32; BLOCK]) {
    let m = (1u32 << (bits - 1)) as f32;
    let qmax = (1i32 << bits) - 1;
    let mut v = x.map(|a| f16::from_f32(a).to_f32());
    walsh_hadamard_32(&mut v);
    v.iter_mut().for_each(|e| *e *= EXL3_R32);
    let s = v.iter().fold(0f32, |acc, e| acc.max(e.abs())) + 1e-10;
    let inv = 1.0 / s;
    // fmaf(v·inv, m, m): m is a power of two, so the product is exact and only the sum rounds.
    let codes = v.map(|e| ((e * inv * m + m).floor() as i32).clamp(0, qmax));
    (f16::from_f32(s), codes)
}

/// exllamav3's read of one group back to f16 values.
fn exl3_decode(bits: u32, scale: f16, codes: &[i32; BLOCK]) -> [f32; BLOCK] {
    let m = (1u32 << (bits - 1)) as f32;
    let step = scale.to_f32() * EXL3_R32 * (1.0 / m);
    let mut w = codes.map(|q| (q as f32 - (m - 0.5)) * step);
    walsh_hadamard_32(&mut w);
    w.map(|e| f16::from_f32(e).to_f32())
}

/// iq4_nl's table (ggml-common.h's `kvalues_iq4nl`): a code is an index into it.
pub const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The index of the table value nearest `x` (ggml's `best_index_int8`: a bisection, and a tie
/// between two neighbours goes to the upper one).
fn nearest_iq4_nl_index(x: f32) -> u8 {
    let values = IQ4_NL_VALUES.map(f32::from);
    if x <= values[0] {
        return 0;
    }
    if x >= values[15] {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < values[mid] {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - values[hi - 1] < values[hi] - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// ggml's CPU iq4_nl write (`quantize_row_iq4_nl_ref`, one block, no importance weights): codes
/// from the scale `vmax / −127`, then the scale refit to `Σ w·q·x / Σ w·q²` with `w = x²`,
/// summed in order in f32. Below a largest magnitude of 1e-15 (`GROUP_MAX_EPS`) the scale is 0;
/// ggml leaves the codes unset there and this writes zeros (the values read back are zero
/// either way).
fn iq4_nl(x: &[f32; BLOCK]) -> (f32, [u8; BLOCK]) {
    let mut codes = [0u8; BLOCK];
    let max = signed_extreme(x);
    if max.abs() < 1e-15 {
        return (0.0, codes);
    }
    let id = 1.0 / (max / f32::from(IQ4_NL_VALUES[0]));
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = nearest_iq4_nl_index(id * v);
        let q = f32::from(IQ4_NL_VALUES[usize::from(*c)]);
        let w = v * v;
        sumqx += w * q * v;
        sumq2 += w * q * q;
    }
    let d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    (d, codes)
}

/// Reads one block back as ggml's `dequantize_row_*` does (f32 products of the f16 scale).
pub fn decode_block(scheme: KvScheme, bytes: &[u8], out: &mut [f32; BLOCK]) {
    let half_at = |i: usize| f16::from_le_bytes([bytes[i], bytes[i + 1]]).to_f32();
    let nibble = |qs: &[u8], j: usize| {
        if j < BLOCK / 2 {
            qs[j] & 0x0F
        } else {
            qs[j - BLOCK / 2] >> 4
        }
    };
    let high =
        |qh: &[u8], j: usize| (u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]) >> j & 1) as u8;
    match scheme {
        KvScheme::Q8_0 => {
            let d = half_at(0);
            for (o, &q) in out.iter_mut().zip(&bytes[2..34]) {
                *o = f32::from(q as i8) * d;
            }
        }
        KvScheme::Q4_0 => {
            let d = half_at(0);
            for (j, o) in out.iter_mut().enumerate() {
                *o = (f32::from(nibble(&bytes[2..18], j)) - 8.0) * d;
            }
        }
        KvScheme::Iq4Nl => {
            let d = half_at(0);
            for (j, o) in out.iter_mut().enumerate() {
                *o = d * f32::from(IQ4_NL_VALUES[usize::from(nibble(&bytes[2..18], j))]);
            }
        }
        KvScheme::Q5_0 => {
            let d = half_at(0);
            for (j, o) in out.iter_mut().enumerate() {
                let q = nibble(&bytes[6..22], j) | high(&bytes[2..6], j) << 4;
                *o = (f32::from(q) - 16.0) * d;
            }
        }
        KvScheme::Q4_1 => {
            let (d, m) = (half_at(0), half_at(2));
            for (j, o) in out.iter_mut().enumerate() {
                *o = f32::from(nibble(&bytes[4..20], j)) * d + m;
            }
        }
        KvScheme::Q5_1 => {
            let (d, m) = (half_at(0), half_at(2));
            for (j, o) in out.iter_mut().enumerate() {
                let q = nibble(&bytes[8..24], j) | high(&bytes[4..8], j) << 4;
                *o = f32::from(q) * d + m;
            }
        }
        _ => {}
    }
}

/// The per-tensor fp8 scales a run computed (`scale_source: computed`, vLLM's
/// `calculate_kv_scales`): each attention layer's `amax(|key|)/200` and `amax(|value|)/100`
/// on the first forward pass, then frozen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ComputedKvScales {
    /// Tokens of the forward pass they came from: the measurement's first window (or its first
    /// prefill chunk, where the runner prefills in chunks).
    #[schemars(range(min = 1))]
    pub tokens: usize,
    /// One entry per attention layer, in model order.
    pub layers: Vec<LayerKvScales>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LayerKvScales {
    /// The layer's index in the model (Gated DeltaNet layers have no KV cache and no entry).
    pub layer: usize,
    pub k_scale: f64,
    pub v_scale: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_engine_spellings_are_accepted() {
        for s in KvScheme::ALL {
            assert_eq!(KvScheme::from_name(s.as_str()), Some(s));
        }
        assert_eq!(KvScheme::from_name("Q8_0"), Some(KvScheme::Q8_0));
        assert_eq!(KvScheme::from_name("float16"), Some(KvScheme::F16));
        assert_eq!(KvScheme::from_name("bfloat16"), Some(KvScheme::Bf16));
        assert_eq!(KvScheme::from_name("fp8"), Some(KvScheme::Fp8E4m3));
        let both = KvCacheSetting::from_label("int8_per_token_head").unwrap();
        assert_eq!(both.label(), "int8_per_token_head");
        let mixed = KvCacheSetting::from_label("k:q8_0/v:fp8_e5m2").unwrap();
        assert_eq!((mixed.k, mixed.v), (KvScheme::Q8_0, KvScheme::Fp8E5m2));
        assert_eq!(mixed.label(), "k:q8_0/v:fp8_e5m2");
        for bad in [
            "f32",
            "k:q8_0",
            "v:q8_0/k:q4_0",
            "k:q8_0/v:int2",
            "k:q8_0,v:q4_0",
        ] {
            assert_eq!(KvCacheSetting::from_label(bad), None, "{bad}");
        }
        for bad in ["", "q8", "int4", "q2_k", "iq4_xs"] {
            assert_eq!(KvScheme::from_name(bad), None, "{bad}");
        }
        assert!(KvScheme::names().contains("q5_1"));
    }

    #[test]
    fn a_block_reads_back_within_half_a_step_but_a_clamped_extreme() {
        let x: [f32; BLOCK] = std::array::from_fn(|i| ((i * 37 % 32) as f32 - 15.5) / 7.0);
        for s in KvScheme::ALL.into_iter().filter(|s| s.is_blocked()) {
            let mut y = x;
            s.apply(&mut y, BLOCK);
            let (lo, hi) = min_max(&x);
            let steps = match s {
                KvScheme::Q8_0 => 254.0,
                KvScheme::Q4_0 | KvScheme::Q4_1 => 15.0,
                // iq4_nl's widest gap (−127 to −104) is 23 of the table's 240: as coarse as 10.4
                // even steps; its least-squares scale can shrink that a little further.
                KvScheme::Iq4Nl => 240.0 / 23.0 * 0.9,
                _ => 31.0,
            };
            // Symmetric types spread 2·amax over their steps, affine ones max − min.
            let span = if matches!(s, KvScheme::Q4_1 | KvScheme::Q5_1) {
                hi - lo
            } else {
                2.0 * lo.abs().max(hi.abs())
            };
            let step = span / steps;
            // q4_0 and q5_0 put the signed extreme on code 0, so the opposite extreme of the same
            // magnitude lands one past the top code and is clamped: a whole step off.
            let clamped = |a: f32| {
                matches!(s, KvScheme::Q4_0 | KvScheme::Q5_0)
                    && a.abs() == lo.abs().max(hi.abs())
                    && a.signum() != signed_extreme(&x).signum()
            };
            for (a, b) in x.iter().zip(&y) {
                let bound = if clamped(*a) { 1.0 } else { 0.5 } * step * 1.01 + 1e-3;
                assert!((a - b).abs() <= bound, "{s}: {a} -> {b}");
            }
            assert_ne!(x, y, "{s} rounds something");
        }
    }

    #[test]
    fn zeros_stay_zeros_and_a_zero_scale_gives_zero_codes() {
        for s in KvScheme::ALL {
            let mut y = [0f32; BLOCK];
            s.apply(&mut y, BLOCK);
            assert_eq!(y, [0f32; BLOCK], "{s}");
        }
        // A constant block: affine types read it back through the minimum alone.
        let mut y = [1.25f32; BLOCK];
        KvScheme::Q4_1.apply(&mut y, BLOCK);
        assert_eq!(y, [1.25f32; BLOCK]);
    }

    /// A fixture's floats, kept as their u32 bit patterns.
    fn floats(v: &serde_json::Value) -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|b| f32::from_bits(b.as_u64().unwrap() as u32))
            .collect()
    }

    /// A fixture file of tests/fixtures/kv_cache.
    fn fixture(name: &str) -> serde_json::Value {
        let path = format!(
            "{}/tests/fixtures/kv_cache/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// A fixture's list of 32-value blocks.
    fn fixture_blocks(v: &serde_json::Value) -> Vec<[f32; BLOCK]> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|b| floats(b).try_into().unwrap())
            .collect()
    }

    /// Every block of a fixture file of llama.cpp blocks: the same bytes (but codes ggml leaves
    /// unset), the same values read back, and `apply` the same as encode-then-decode.
    fn check_llamacpp_blocks(file: &str, types_expected: usize) {
        let doc = fixture(file);
        let blocks = fixture_blocks(&doc["blocks"]);
        assert!(blocks.len() >= 50);
        let types = doc["types"].as_object().unwrap();
        assert_eq!(types.len(), types_expected);
        for (name, t) in types {
            let scheme = KvScheme::from_name(name).unwrap();
            let bytes = t["bytes"].as_array().unwrap();
            let values = t["values"].as_array().unwrap();
            let undefined: Vec<u64> = t["codes_undefined"]
                .as_array()
                .map(|a| a.iter().map(|i| i.as_u64().unwrap()).collect())
                .unwrap_or_default();
            assert_eq!(bytes.len(), blocks.len());
            for (i, x) in blocks.iter().enumerate() {
                let mut out = [0u8; 40];
                let n = encode_block(scheme, x, &mut out);
                let hex: String = out[..n].iter().map(|b| format!("{b:02x}")).collect();
                let want_hex = bytes[i].as_str().unwrap();
                let want = floats(&values[i]);
                let mut y = [0f32; BLOCK];
                decode_block(scheme, &out[..n], &mut y);
                let mut z = *x;
                scheme.apply(&mut z, BLOCK);
                if undefined.contains(&(i as u64)) {
                    // The scale only, and values equal as numbers (an unset code's table value
                    // gives the zero its sign).
                    assert_eq!(hex[..4], want_hex[..4], "{name} block {i} scale");
                    assert_eq!(y.to_vec(), want, "{name} block {i} read back");
                    assert_eq!(z.to_vec(), want, "{name} block {i} applied");
                    continue;
                }
                assert_eq!(hex, want_hex, "{name} block {i}: {x:?}");
                let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{name} block {i} read back");
                assert_eq!(
                    z.map(f32::to_bits).to_vec(),
                    want,
                    "{name} block {i} applied"
                );
            }
        }
    }

    /// gguf-py's quantizers (bit-exact with ggml's reference ones) on random and adversarial
    /// blocks (tests/fixtures/kv_cache/llamacpp.json).
    #[test]
    fn every_block_matches_gguf_py_byte_for_byte() {
        check_llamacpp_blocks("llamacpp.json", 5);
    }

    /// ggml's own CPU iq4_nl write, compiled from ggml-quants.c (gguf-py has no iq4_nl
    /// quantizer), on the same blocks and iq4_nl's own ties (tests/fixtures/kv_cache/iq4_nl.json).
    #[test]
    fn iq4_nl_blocks_match_ggml_quants_c_byte_for_byte() {
        check_llamacpp_blocks("iq4_nl.json", 1);
    }

    /// exllamav3's own warp kernels (`quant_block_x4` / `dequant_block_x4`, run on the CPU by
    /// make_exl3.py's lane shim) on random and edge groups at 2 to 8 bits: the same f16 scale and
    /// the same f16 values read back (tests/fixtures/kv_cache/exl3.json).
    #[test]
    fn exl3_groups_match_exllamav3s_kernels_bit_for_bit() {
        assert_eq!(EXL3_R32, (1.0f64 / 32f64.sqrt()) as f32);
        let doc = fixture("exl3.json");
        let groups = fixture_blocks(&doc["groups"]);
        assert!(groups.len() >= 60);
        let bits = doc["bits"].as_object().unwrap();
        assert_eq!(bits.len(), 7);
        let u16s = |v: &serde_json::Value| -> Vec<u16> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u16)
                .collect()
        };
        for (b, t) in bits {
            let b: u32 = b.parse().unwrap();
            let scheme = KvScheme::ALL
                .into_iter()
                .find(|s| s.exl3_bits() == Some(b))
                .unwrap();
            let scales = u16s(&t["scales"]);
            let values = t["values"].as_array().unwrap();
            for (i, x) in groups.iter().enumerate() {
                let (scale, _) = exl3_encode(b, x);
                assert_eq!(scale.to_bits(), scales[i], "{scheme} group {i} scale");
                let want: Vec<u32> = u16s(&values[i])
                    .into_iter()
                    .map(|h| f16::from_bits(h).to_f32().to_bits())
                    .collect();
                let mut y = *x;
                scheme.apply(&mut y, BLOCK);
                // A scale past f16's range is inf and the values read back NaN (f16's largest
                // values do that); a NaN's sign bit is the platform's, not the format's.
                let got: Vec<u32> = y
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| match g.is_nan() && f32::from_bits(*w).is_nan() {
                        true => *w,
                        false => g.to_bits(),
                    })
                    .collect();
                assert_eq!(got, want, "{scheme} group {i}");
            }
        }
    }

    /// A one-layer decoder with synthetic weights and a head of 16.
    fn tiny_decoder() -> crate::runner::native::decoder::Decoder {
        use crate::runner::native::StateDtype;
        use crate::runner::native::config::{Arch, ModelConfig};
        use crate::runner::native::decoder::{ComputeDtype, Decoder};
        let config = ModelConfig {
            arch: Arch::Qwen3,
            hidden: 32,
            intermediate: 48,
            layers: 1,
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            vocab: 64,
            rms_eps: 1e-6,
            rope_theta: 1e6,
            rope_scaling: None,
            tie_embeddings: false,
            sliding_window: None,
            max_positions: Some(4096),
            biases: Default::default(),
            rotary_dim: 16,
            prefix: "model".into(),
            moe: None,
            hybrid: None,
        };
        let store = crate::runner::native::weights::synthetic(&config, 1);
        Decoder::load(&store, config, ComputeDtype::F32, StateDtype::F32).unwrap()
    }

    /// A head size that is not a whole number of blocks is refused at load, naming both; the
    /// float schemes take any head size; `none` clears a setting.
    #[test]
    fn a_head_size_that_is_not_whole_blocks_is_refused_for_block_schemes() {
        let mut d = tiny_decoder();
        let both = KvCacheSetting::both;
        let e = d.set_kv_cache(both(KvScheme::Q4_0)).unwrap_err();
        assert!(
            e.contains("blocks of 32") && e.contains("head size is 16"),
            "{e}"
        );
        let ids: Vec<u32> = (0..20).collect();
        let plain = d.logits_at(&d.hidden(&ids).unwrap(), &[19]).unwrap();
        d.set_kv_cache(both(KvScheme::F16)).unwrap();
        assert_eq!(d.kv_cache_setting(), Some(both(KvScheme::F16)));
        assert!(d.report.kv_cache.as_deref().unwrap().starts_with("f16"));
        let rounded = d.logits_at(&d.hidden(&ids).unwrap(), &[19]).unwrap();
        assert_ne!(plain, rounded, "an f16 cache changes the logits a little");
        d.set_kv_cache(both(KvScheme::None)).unwrap();
        assert_eq!(d.report.kv_cache, None);
        assert_eq!(d.logits_at(&d.hidden(&ids).unwrap(), &[19]).unwrap(), plain);

        // Computed fp8 scales: refused until calibrated, computed once, frozen, recorded.
        d.set_kv_cache(both(KvScheme::Fp8E4m3)).unwrap();
        let unit = d.logits_at(&d.hidden(&ids).unwrap(), &[19]).unwrap();
        let computed = KvCacheSetting::from_label("fp8_e4m3+computed").unwrap();
        d.set_kv_cache(computed).unwrap();
        let e = d.hidden(&ids).unwrap_err().to_string();
        assert!(e.contains("did not calibrate"), "{e}");
        assert_eq!(d.computed_kv_scales(), None);
        assert!(d.calibrate_kv_scales(&ids[..12]).unwrap());
        assert!(!d.calibrate_kv_scales(&ids).unwrap(), "calibrated once");
        let found = d.computed_kv_scales().unwrap();
        assert_eq!((found.tokens, found.layers.len()), (12, 1));
        assert!(found.layers[0].k_scale > 0.0 && found.layers[0].v_scale > 0.0);
        let scaled = d.logits_at(&d.hidden(&ids).unwrap(), &[19]).unwrap();
        assert_ne!(scaled, unit, "amax/200 is not a scale of 1.0");
        assert_ne!(scaled, plain);
        assert!(
            d.report
                .kv_cache
                .as_deref()
                .unwrap()
                .contains("calculate_kv_scales")
        );
        let record = d.kv_cache_record().unwrap();
        assert_eq!(
            record.scale_source,
            Some(crate::runner::kv_record::KvScaleSource::Computed)
        );
        assert_eq!(record.setting().unwrap(), computed);
        // Setting the cache again forgets the scales.
        d.set_kv_cache(computed).unwrap();
        assert_eq!(d.computed_kv_scales(), None);
        let e = d
            .set_kv_cache(KvCacheSetting {
                computed_scales: true,
                ..both(KvScheme::F16)
            })
            .unwrap_err();
        assert!(e.contains("per-tensor fp8"), "{e}");
    }

    /// transformers' QuantizedCache semantics: a window no longer than one chunk reads nothing
    /// rounded; the first chunk's rows are the plain model's; the history is rounded again only
    /// once the residual window fills, after the chunk that fills it has read it unrounded.
    #[test]
    fn quantized_cache_residual_reads_the_first_chunk_and_the_window_unrounded() {
        let mut d = tiny_decoder();
        let ids: Vec<u32> = (0..20).collect();
        let rows: Vec<usize> = (0..20).collect();
        let logits = |d: &crate::runner::native::decoder::Decoder| {
            let all = d.logits_at(&d.hidden(&ids).unwrap(), &rows).unwrap();
            let vocab = all.len() / rows.len();
            all.chunks(vocab).map(<[f32]>::to_vec).collect::<Vec<_>>()
        };
        let plain = logits(&d);
        let int8 = KvScheme::Int8PerTokenHead;
        let residual = |length, chunk| KvCacheSetting {
            residual: Some(ResidualWindow { length, chunk }),
            ..KvCacheSetting::both(int8)
        };
        d.set_kv_cache(KvCacheSetting::both(int8)).unwrap();
        let write_then_read = logits(&d);
        d.set_kv_cache(residual(128, 20)).unwrap();
        assert_eq!(
            logits(&d),
            plain,
            "one update reads its own states unrounded"
        );
        assert!(
            d.report
                .kv_cache
                .as_deref()
                .unwrap()
                .contains("QuantizedCache")
        );
        let record = d.kv_cache_record().unwrap();
        assert_eq!(
            (
                record.semantics,
                record.residual_length,
                record.prefill_chunk
            ),
            (
                Some(crate::runner::kv_record::KvSemantics::QuantizedCacheResidual),
                Some(128),
                Some(20)
            )
        );
        assert_eq!(record.setting().unwrap(), residual(128, 20));
        // Chunks of 4: [0, 4) unrounded; a window of 8 fills at the third chunk (4 + 4), a
        // window of 12 at the fourth (8 + 4).
        d.set_kv_cache(residual(8, 4)).unwrap();
        let eight = logits(&d);
        d.set_kv_cache(residual(12, 4)).unwrap();
        let twelve = logits(&d);
        // The unrounded model prefilled in the same chunks (a chunk's products round in the
        // last bit unlike one pass's).
        let chunked_plain = {
            let mut cache = crate::runner::native::decoder::DecoderCache::default();
            d.set_kv_cache(KvCacheSetting::plain()).unwrap();
            let parts: Vec<_> = ids
                .chunks(4)
                .map(|p| d.hidden_continued(p, &mut cache).unwrap())
                .collect();
            let hidden = candle_core::Tensor::cat(&parts, 0).unwrap();
            let all = d.logits_at(&hidden, &rows).unwrap();
            let vocab = all.len() / rows.len();
            all.chunks(vocab).map(<[f32]>::to_vec).collect::<Vec<_>>()
        };
        assert_eq!(
            eight[..4],
            chunked_plain[..4],
            "the first chunk reads unrounded"
        );
        for r in 4..20 {
            assert_ne!(
                eight[r], chunked_plain[r],
                "row {r} reads the rounded first chunk"
            );
            assert_ne!(
                eight[r], write_then_read[r],
                "row {r} reads its own chunk unrounded"
            );
        }
        assert_eq!(
            eight[..12],
            twelve[..12],
            "no flush is read before the third chunk ends"
        );
        for r in 12..16 {
            assert_ne!(eight[r], twelve[r], "row {r}: flushed at 8, not yet at 12");
        }
        // The flags, the suffix and their limits.
        let flags = |semantics, residual, chunk| {
            KvCacheSetting::from_flags(KvFlags {
                both: Some("q8_0"),
                semantics,
                residual,
                chunk,
                ..Default::default()
            })
        };
        let q8 = |length, chunk| KvCacheSetting {
            residual: Some(ResidualWindow { length, chunk }),
            ..KvCacheSetting::both(KvScheme::Q8_0)
        };
        assert_eq!(
            flags(Some("quantized_cache_residual"), None, None).unwrap(),
            Some(q8(128, 128))
        );
        assert_eq!(flags(None, Some(64), Some(16)).unwrap(), Some(q8(64, 16)));
        assert_eq!(q8(64, 16).name(), "q8_0+residual64+chunk16");
        assert_eq!(
            KvCacheSetting::from_label("q8_0+residual64+chunk16"),
            Some(q8(64, 16))
        );
        assert_eq!(
            KvCacheSetting::from_label("q8_0+residual"),
            Some(q8(128, 128))
        );
        for bad in [
            "q8_0+chunk16",
            "q8_0+residual0",
            "q8_0+residualx",
            "q8_0+residual+residual",
        ] {
            assert_eq!(KvCacheSetting::from_label(bad), None, "{bad}");
        }
        let e = flags(Some("write_then_read"), Some(64), None).unwrap_err();
        assert!(e.contains("do not go with"), "{e}");
        let e = flags(Some("lazy"), None, None).unwrap_err();
        assert!(e.contains("quantized_cache_residual"), "{e}");
        let e = KvCacheSetting::from_flags(KvFlags {
            both: Some("fp8+computed+residual"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("no engine's cache"), "{e}");
        let e = KvCacheSetting::from_flags(KvFlags {
            residual: Some(64),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("give the cache"), "{e}");
        assert!(ResidualWindow::new(Some(MAX_RESIDUAL + 1), None).is_err());
    }

    /// vLLM's `calc_kv_scales`: amax/200 for keys, amax/100 for values, in f32; a zero or NaN
    /// pass is refused rather than divided by.
    #[test]
    fn computed_scales_follow_vllms_calc_kv_scales() {
        let (k, v) = computed_scales(&[0.5, -3.0, 1.0], &[-0.25, 2.0]).unwrap();
        assert_eq!(k, 3.0f32 / 200.0);
        assert_eq!(v, 2.0f32 / 100.0);
        let e = computed_scales(&[0.0, 0.0], &[1.0]).unwrap_err();
        assert!(e.contains("key scale"), "{e}");
        let e = computed_scales(&[1.0], &[0.0]).unwrap_err();
        assert!(e.contains("value scale"), "{e}");
        assert!(computed_scales(&[1.0, f32::NAN], &[1.0]).is_err());
    }

    /// `+computed` and `+hadamard` read back in either order; the scales flag sets or clears
    /// it and refuses caches without a per-tensor scale.
    #[test]
    fn the_scales_flag_and_suffix_are_checked() {
        let s = KvCacheSetting::from_label("k:q4_0/v:fp8_e4m3+computed+hadamard").unwrap();
        assert!(s.computed_scales && s.hadamard);
        assert_eq!(s.name(), "k:q4_0/v:fp8_e4m3+hadamard+computed");
        assert_eq!(KvCacheSetting::from_label(&s.name()), Some(s));
        assert_eq!(s.label(), "k:q4_0/v:fp8_e4m3");
        assert_eq!(
            KvCacheSetting::from_label("fp8_e4m3+computed+computed"),
            None
        );
        let s = KvCacheSetting::from_flags(KvFlags {
            both: Some("fp8"),
            scales: Some("computed"),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert!(s.computed_scales);
        let e = KvCacheSetting::from_flags(KvFlags {
            both: Some("fp8+computed"),
            scales: Some("checkpoint"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("contradicts --kv-cache fp8+computed"), "{e}");
        let e = KvCacheSetting::from_flags(KvFlags {
            both: Some("q8_0"),
            scales: Some("computed"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("per-tensor fp8"), "{e}");
        let e = KvCacheSetting::from_flags(KvFlags {
            scales: Some("computed"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("--kv-cache"), "{e}");
        let e = KvCacheSetting::from_flags(KvFlags {
            both: Some("fp8"),
            scales: Some("dynamic"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("`dynamic` is not a scale source"), "{e}");
    }

    /// llama.cpp's rotation blocks (`build_input_k_rot` / `build_input_v_rot`): K the largest
    /// power of two dividing the head, V 64; heads not a multiple of 64 are not rotated.
    #[test]
    fn rotation_blocks_follow_llama_cpps_rule() {
        assert_eq!(rotation_sizes(64), Some((64, 64)));
        assert_eq!(rotation_sizes(128), Some((128, 64)));
        assert_eq!(rotation_sizes(192), Some((64, 64)));
        assert_eq!(rotation_sizes(256), Some((256, 64)));
        assert_eq!(rotation_sizes(576), Some((64, 64)));
        for d in [0, 32, 80, 96, 100] {
            assert_eq!(rotation_sizes(d), None, "{d}");
        }
        let q4 = KvCacheSetting {
            hadamard: true,
            ..KvCacheSetting::both(KvScheme::Q4_0)
        };
        assert_eq!(q4.rotations(128), Ok((Some(128), Some(64))));
        let k_only = KvCacheSetting::from_label("k:q8_0/v:f16+hadamard").unwrap();
        assert!(k_only.hadamard);
        assert_eq!(k_only.rotations(64), Ok((Some(64), None)));
        assert_eq!(k_only.name(), "k:q8_0/v:f16+hadamard");
        assert_eq!(k_only.label(), "k:q8_0/v:f16");
        assert!(q4.rotations(96).unwrap_err().contains("multiple of 64"));
        let fp8 = KvCacheSetting::from_label("fp8_e4m3+hadamard").unwrap();
        assert!(
            fp8.rotations(128)
                .unwrap_err()
                .contains("not with fp8_e4m3")
        );
        let floats = KvCacheSetting::from_label("f16+hadamard").unwrap();
        assert!(
            floats
                .rotations(128)
                .unwrap_err()
                .contains("only to a quantized cache")
        );
        assert_eq!(
            KvCacheSetting::both(KvScheme::Q4_0).rotations(96),
            Ok((None, None))
        );
    }

    /// Regression (#41): a flag that contradicts the `--kv-cache` label is refused naming both;
    /// a flag that sets what the label leaves open is not.
    #[test]
    fn flags_that_contradict_the_kv_cache_label_are_refused() {
        fn flags(both: &'static str) -> KvFlags<'static> {
            KvFlags {
                both: Some(both),
                ..Default::default()
            }
        }
        for (f, needle) in [
            (
                KvFlags {
                    semantics: Some("write_then_read"),
                    ..flags("q4_0+residual64")
                },
                "--kv-cache-semantics write_then_read contradicts",
            ),
            (
                KvFlags {
                    residual: Some(32),
                    ..flags("q4_0+residual64")
                },
                "--kv-cache-residual 32 contradicts",
            ),
            (
                KvFlags {
                    chunk: Some(16),
                    ..flags("q4_0+residual64+chunk32")
                },
                "--kv-cache-chunk 16 contradicts",
            ),
        ] {
            let e = KvCacheSetting::from_flags(f).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        let s = KvCacheSetting::from_flags(KvFlags {
            chunk: Some(16),
            ..flags("q4_0+residual64")
        })
        .unwrap()
        .unwrap();
        assert_eq!(s.residual.map(|w| (w.length, w.chunk)), Some((64, 16)));
        let s = KvCacheSetting::from_flags(KvFlags {
            residual: Some(32),
            ..flags("q4_0+residual")
        })
        .unwrap()
        .unwrap();
        assert_eq!(s.residual.map(|w| w.length), Some(32));
    }

    /// The flags: `--kv-cache-rotation` sets or clears the rotation, needs a cache, and refuses
    /// other words.
    #[test]
    fn the_rotation_flag_is_checked() {
        let s = KvCacheSetting::from_flags(KvFlags {
            both: Some("q4_0"),
            rotation: Some("hadamard"),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert!(s.hadamard && s.k == KvScheme::Q4_0);
        // Regression (#41): a flag contradicting the label ran un-rotated silently.
        let e = KvCacheSetting::from_flags(KvFlags {
            both: Some("q4_0+hadamard"),
            rotation: Some("none"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("contradicts --kv-cache q4_0+hadamard"), "{e}");
        let s = KvCacheSetting::from_flags(KvFlags {
            both: Some("q4_0+hadamard"),
            rotation: Some("hadamard"),
            ..Default::default()
        })
        .unwrap()
        .unwrap();
        assert!(s.hadamard, "agreeing flags are fine");
        let e = KvCacheSetting::from_flags(KvFlags {
            rotation: Some("hadamard"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("--kv-cache"), "{e}");
        let e = KvCacheSetting::from_flags(KvFlags {
            both: Some("q8_0"),
            rotation: Some("h32"),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("`h32` is not a rotation"), "{e}");
    }

    /// The rotation is orthonormal and its own inverse (up to the f32 rounding of a round
    /// trip), and spreads a spike over the block.
    #[test]
    fn the_hadamard_rotation_is_its_own_inverse() {
        let mut x: Vec<f32> = (0..256).map(|i| ((i * 37) % 23) as f32 - 11.0).collect();
        let orig = x.clone();
        hadamard(&mut x, 128);
        let norm = |v: &[f32]| v.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>();
        assert!((norm(&x) / norm(&orig) - 1.0).abs() < 1e-6);
        hadamard(&mut x, 128);
        for (a, b) in x.iter().zip(&orig) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} {b}");
        }
        let mut spike = vec![0f32; 64];
        spike[3] = 8.0;
        hadamard(&mut spike, 64);
        assert!(spike.iter().all(|v| v.abs() == 1.0), "{spike:?}");
    }

    /// Rotated, rounded and rotated back, bit for bit what an independent numpy construction
    /// with gguf-py's quantizers gives (tests/fixtures/kv_cache/rotation.json: heads of 64 to
    /// 256, K and V block sizes, q8_0 / q4_0 / q5_1).
    #[test]
    fn the_rotated_cache_matches_numpy_and_gguf_py_bit_for_bit() {
        let doc = fixture("rotation.json");
        let cases = doc["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 18);
        for case in cases {
            let scheme = KvScheme::from_name(case["scheme"].as_str().unwrap()).unwrap();
            let head_dim = case["head_dim"].as_u64().unwrap() as usize;
            let block = case["block"].as_u64().unwrap() as usize;
            let mut rows = floats(&case["rows"]);
            let want = floats(&case["values"]);
            rotated(scheme, &mut rows, head_dim, 1.0, Some(block));
            let differing = rows
                .iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let first = rows
                .iter()
                .zip(&want)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                differing,
                0,
                "{scheme} head {head_dim} block {block}: first at {first:?}: {:?}",
                first.map(|i| (rows[i], want[i]))
            );
        }
    }

    /// vLLM's schemes against torch's casts as vLLM's write paths use them (fp8 per tensor at
    /// three scales, int8 and fp8 per token and head), bit for bit (tests/fixtures/kv_cache).
    #[test]
    fn vllm_schemes_match_torchs_casts_bit_for_bit() {
        let doc = fixture("vllm.json");
        let head_dim = doc["head_dim"].as_u64().unwrap() as usize;
        let rows = floats(&doc["rows"]);
        let cases = doc["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 8);
        for case in cases {
            let name = case["scheme"].as_str().unwrap();
            let scheme = KvScheme::from_name(name).unwrap();
            let scale = case["scale"].as_f64().unwrap() as f32;
            let want = floats(&case["values"]);
            let mut got = rows.clone();
            scheme.apply_scaled(&mut got, head_dim, scale);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{name} at scale {scale}, value {i}: {} -> {g}, torch {w}",
                    rows[i]
                );
            }
        }
    }
}
