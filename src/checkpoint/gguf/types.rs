//! ggml tensor types: ids, names and block geometry.
//!
//! Ids are `enum ggml_type` in ggml's `include/ggml.h`; block sizes (elements per block) and type
//! sizes (bytes per block) are the `QK*` constants and block structs of `src/ggml-common.h`, whose
//! `static_assert`s pin each struct's size. Bits per weight follow exactly from the two.

use std::fmt;

/// A tensor type a GGUF file can hold today. Ids ggml removed are not variants: see
/// [`removed_type_name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    /// OCP MX FP4: 32 E2M1 values sharing one E8M0 scale.
    MXFP4,
    /// NVIDIA FP4: 64 E2M1 values with four E4M3 scales (one per 16).
    NVFP4,
    Q1_0,
    Q2_0,
}

/// Super-block size of the k-quants, IQ and TQ families (`QK_K`).
const QK_K: u64 = 256;

impl GgmlType {
    /// Every type, in id order.
    pub const ALL: [GgmlType; 35] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ];

    /// The type with this `ggml_type` id; `None` for removed ids (4, 5, 31-33, 36-38) and ids
    /// ggml does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::Q8_K => 15,
            GgmlType::IQ2_XXS => 16,
            GgmlType::IQ2_XS => 17,
            GgmlType::IQ3_XXS => 18,
            GgmlType::IQ1_S => 19,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ3_S => 21,
            GgmlType::IQ2_S => 22,
            GgmlType::IQ4_XS => 23,
            GgmlType::I8 => 24,
            GgmlType::I16 => 25,
            GgmlType::I32 => 26,
            GgmlType::I64 => 27,
            GgmlType::F64 => 28,
            GgmlType::IQ1_M => 29,
            GgmlType::BF16 => 30,
            GgmlType::TQ1_0 => 34,
            GgmlType::TQ2_0 => 35,
            GgmlType::MXFP4 => 39,
            GgmlType::NVFP4 => 40,
            GgmlType::Q1_0 => 41,
            GgmlType::Q2_0 => 42,
        }
    }

    /// ggml's `type_name`, lowercased throughout (ggml itself spells the k-quants `q4_K`).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::Q2_K => "q2_k",
            GgmlType::Q3_K => "q3_k",
            GgmlType::Q4_K => "q4_k",
            GgmlType::Q5_K => "q5_k",
            GgmlType::Q6_K => "q6_k",
            GgmlType::Q8_K => "q8_k",
            GgmlType::IQ2_XXS => "iq2_xxs",
            GgmlType::IQ2_XS => "iq2_xs",
            GgmlType::IQ3_XXS => "iq3_xxs",
            GgmlType::IQ1_S => "iq1_s",
            GgmlType::IQ4_NL => "iq4_nl",
            GgmlType::IQ3_S => "iq3_s",
            GgmlType::IQ2_S => "iq2_s",
            GgmlType::IQ4_XS => "iq4_xs",
            GgmlType::I8 => "i8",
            GgmlType::I16 => "i16",
            GgmlType::I32 => "i32",
            GgmlType::I64 => "i64",
            GgmlType::F64 => "f64",
            GgmlType::IQ1_M => "iq1_m",
            GgmlType::BF16 => "bf16",
            GgmlType::TQ1_0 => "tq1_0",
            GgmlType::TQ2_0 => "tq2_0",
            GgmlType::MXFP4 => "mxfp4",
            GgmlType::NVFP4 => "nvfp4",
            GgmlType::Q1_0 => "q1_0",
            GgmlType::Q2_0 => "q2_0",
        }
    }

    /// Elements per block (`blck_size` in ggml's type traits).
    pub fn block_size(self) -> u64 {
        match self {
            GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::F64
            | GgmlType::I8
            | GgmlType::I16
            | GgmlType::I32
            | GgmlType::I64 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => 32,
            GgmlType::NVFP4 | GgmlType::Q2_0 => 64,
            GgmlType::Q1_0 => 128,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K
            | GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ3_XXS
            | GgmlType::IQ1_S
            | GgmlType::IQ3_S
            | GgmlType::IQ2_S
            | GgmlType::IQ4_XS
            | GgmlType::IQ1_M
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0 => QK_K,
        }
    }

    /// Bytes per block (`sizeof(block_*)`); each sum is the right-hand side of the struct's
    /// `static_assert` in `ggml-common.h` (a `ggml_half` is 2 bytes).
    pub fn type_size(self) -> u64 {
        match self {
            GgmlType::I8 => 1,
            GgmlType::F16 | GgmlType::BF16 | GgmlType::I16 => 2,
            GgmlType::F32 | GgmlType::I32 => 4,
            GgmlType::F64 | GgmlType::I64 => 8,
            // d + 16 nibbles
            GgmlType::Q4_0 | GgmlType::IQ4_NL => 2 + 16,
            // d, m + 16 nibbles
            GgmlType::Q4_1 => 2 * 2 + 16,
            // d + qh[4] + 16 nibbles
            GgmlType::Q5_0 => 2 + 4 + 16,
            // d, m + qh[4] + 16 nibbles
            GgmlType::Q5_1 => 2 * 2 + 4 + 16,
            // d + 32 int8
            GgmlType::Q8_0 => 2 + 32,
            // d, s + 32 int8
            GgmlType::Q8_1 => 2 * 2 + 32,
            // E8M0 scale + 16 bytes of E2M1 pairs
            GgmlType::MXFP4 => 1 + 16,
            // 4 E4M3 sub-scales + 32 bytes of E2M1 pairs
            GgmlType::NVFP4 => 4 + 32,
            // d + 128 bits
            GgmlType::Q1_0 => 2 + 128 / 8,
            // d + 64 x 2 bits
            GgmlType::Q2_0 => 2 + 64 / 4,
            // d, dmin + scales[QK_K/16] + qs[QK_K/4]
            GgmlType::Q2_K => 2 * 2 + QK_K / 16 + QK_K / 4,
            // d + qs[QK_K/4] + hmask[QK_K/8] + scales[12]
            GgmlType::Q3_K => 2 + QK_K / 4 + QK_K / 8 + 12,
            // d, dmin + scales[12] + qs[QK_K/2]
            GgmlType::Q4_K => 2 * 2 + 12 + QK_K / 2,
            // d, dmin + scales[12] + qs[QK_K/2] + qh[QK_K/8]
            GgmlType::Q5_K => 2 * 2 + 12 + QK_K / 2 + QK_K / 8,
            // d + scales[QK_K/16] + ql, qh (3*QK_K/4)
            GgmlType::Q6_K => 2 + QK_K / 16 + 3 * QK_K / 4,
            // float d + qs[QK_K] + int16 bsums[QK_K/16]
            GgmlType::Q8_K => 4 + QK_K + QK_K / 16 * 2,
            // d + uint16 qs[QK_K/8]
            GgmlType::IQ2_XXS => 2 + QK_K / 8 * 2,
            // d + uint16 qs[QK_K/8] + scales[QK_K/32]
            GgmlType::IQ2_XS => 2 + QK_K / 8 * 2 + QK_K / 32,
            // d + qs[QK_K/4] + qh, scales (QK_K/16)
            GgmlType::IQ2_S => 2 + QK_K / 4 + QK_K / 16,
            // d + qs[3*QK_K/8]
            GgmlType::IQ3_XXS => 2 + 3 * (QK_K / 8),
            // d + 13*(QK_K/32) + scales[QK_K/64]
            GgmlType::IQ3_S => 2 + 13 * (QK_K / 32) + QK_K / 64,
            // d + qs[QK_K/8] + uint16 qh[QK_K/32]
            GgmlType::IQ1_S => 2 + QK_K / 8 + QK_K / 16,
            // qs[QK_K/8] + qh[QK_K/16] + scales[QK_K/32] (no d)
            GgmlType::IQ1_M => QK_K / 8 + QK_K / 16 + QK_K / 32,
            // d + scales_h + scales_l[QK_K/64] + qs[QK_K/2]
            GgmlType::IQ4_XS => 2 + 2 + QK_K / 64 + QK_K / 2,
            // d + qh[QK_K/64] + qs[(QK_K - 4*QK_K/64)/5]
            GgmlType::TQ1_0 => 2 + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5,
            // d + qs[QK_K/4]
            GgmlType::TQ2_0 => 2 + QK_K / 4,
        }
    }

    /// Storage bits per element, scales included. Exact: block sizes are powers of two.
    pub fn bits_per_weight(self) -> f64 {
        (self.type_size() * 8) as f64 / self.block_size() as f64
    }

    /// Whether ggml counts the type as quantized: everything but the plain floats and integers.
    pub fn is_quantized(self) -> bool {
        !matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::BF16
                | GgmlType::F64
                | GgmlType::I8
                | GgmlType::I16
                | GgmlType::I32
                | GgmlType::I64
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// ggml's name for an id it removed, so an error can say what the file holds.
pub(crate) fn removed_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        4 => "Q4_2",
        5 => "Q4_3",
        31 => "Q4_0_4_4",
        32 => "Q4_0_4_8",
        33 => "Q4_0_8_8",
        36 => "IQ4_NL_4_4",
        37 => "IQ4_NL_4_8",
        38 => "IQ4_NL_8_8",
        _ => return None,
    })
}

/// llama.cpp's name of a GGUF's `general.file_type` (`enum llama_ftype`; gguf-py's
/// `LlamaFileType`, whose `MOSTLY_` prefix is dropped), lowercased: what `llama-quantize` was asked
/// for (`q4_k_m`). A tensor whose rows do not divide into the type's blocks is stored in a
/// fallback type, so on a small model a `q3_k_m` file may hold no `q3_k` tensor at all. `None`
/// for an id llama.cpp does not define (removed ones included).
pub fn file_type_name(id: u64) -> Option<&'static str> {
    Some(match id {
        0 => "f32",
        1 => "f16",
        2 => "q4_0",
        3 => "q4_1",
        7 => "q8_0",
        8 => "q5_0",
        9 => "q5_1",
        10 => "q2_k",
        11 => "q3_k_s",
        12 => "q3_k_m",
        13 => "q3_k_l",
        14 => "q4_k_s",
        15 => "q4_k_m",
        16 => "q5_k_s",
        17 => "q5_k_m",
        18 => "q6_k",
        19 => "iq2_xxs",
        20 => "iq2_xs",
        21 => "q2_k_s",
        22 => "iq3_xs",
        23 => "iq3_xxs",
        24 => "iq1_s",
        25 => "iq4_nl",
        26 => "iq3_s",
        27 => "iq3_m",
        28 => "iq2_s",
        29 => "iq2_m",
        30 => "iq4_xs",
        31 => "iq1_m",
        32 => "bf16",
        36 => "tq1_0",
        37 => "tq2_0",
        38 => "mxfp4_moe",
        39 => "nvfp4",
        40 => "q1_0",
        41 => "q2_0",
        _ => return None,
    })
}

#[cfg(test)]
mod file_type_tests {
    use super::file_type_name;

    /// The names llama.cpp gives its file types (gguf-py's `LlamaFileType`, `llama-quantize
    /// --help`), the removed ids unnamed.
    #[test]
    fn file_types_are_named_as_llama_cpp_names_them() {
        for (id, name) in [
            (0, "f32"),
            (2, "q4_0"),
            (7, "q8_0"),
            (12, "q3_k_m"),
            (15, "q4_k_m"),
            (18, "q6_k"),
            (29, "iq2_m"),
            (30, "iq4_xs"),
            (32, "bf16"),
            (41, "q2_0"),
        ] {
            assert_eq!(file_type_name(id), Some(name), "{id}");
        }
        for removed in [4, 5, 6, 33, 34, 35, 42, 1024] {
            assert_eq!(file_type_name(removed), None, "{removed}");
        }
    }
}
