//! Emulation of llama.cpp's CPU activation path (`--emulate llamacpp-cpu`): ggml's CPU matrix
//! products quantize the activations to the weight type's dot-product partner (`vec_dot_type`,
//! [`GgmlActivation::for_weight`]): Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4/NVFP4/Q1_0/Q2_0 (Q8_1,
//! the same grid, for Q4_1/Q5_1), Q8_K for the k-quants, the other i-quants and the ternary
//! types, f16 for F16 and bf16 for BF16 weights; the KV cache is f16 by default. These roundings
//! move KLD by
//! several percent on small models (measured on the llama.cpp fixtures: docs/DESIGN.md), so a
//! card measured with llama.cpp is reproduced in this lane, not in reference semantics.
//!
//! Checked against ggml's `quantize_row_q8_0` (the AVX2 path: `id = 127/amax`, round to nearest
//! even, the scale `amax/127` stored as f16) and `quantize_row_q8_K_ref` (`iscale = -127/max` with
//! `max` the signed extreme, `nearest_int`, `min(127, q)`, `d = 1/iscale` in f32).

use half::{bf16, f16};

use crate::checkpoint::gguf::GgmlType;

/// Activation rounding for one weight type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlActivation {
    Q8_0,
    /// Q4_1/Q5_1's partner: Q8_0's grid, and a stored block sum `s` their dot products use
    /// ([`q8_1_with_sum_residuals`]).
    Q8_1,
    Q8K,
    F16,
    Bf16,
}

impl GgmlActivation {
    /// How ggml's CPU backend rounds a matrix product's input for weights of type `w`: its
    /// `vec_dot_type` in `type_traits_cpu` (ggml/src/ggml-cpu/ggml-cpu.c of the pinned
    /// llama.cpp). `None` where that is F32 (no rounding): F32 weights, and the types with no CPU
    /// dot product (Q8_K, which ggml uses only as an activation type, F64 and the integers).
    /// Q8_1 weights declare Q8_1 but have no CPU dot product either (the quantizer never writes
    /// them); Q4_1 and Q5_1 are Q8_1's real users (the block-sum term: [`q8_1_with_sum_residuals`]).
    pub fn for_weight(w: GgmlType) -> Option<GgmlActivation> {
        Some(match w {
            GgmlType::Q4_0
            | GgmlType::Q5_0
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4
            | GgmlType::NVFP4
            | GgmlType::Q1_0
            | GgmlType::Q2_0 => GgmlActivation::Q8_0,
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlActivation::Q8_1,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ2_S
            | GgmlType::IQ3_XXS
            | GgmlType::IQ3_S
            | GgmlType::IQ1_S
            | GgmlType::IQ1_M
            | GgmlType::IQ4_XS
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0 => GgmlActivation::Q8K,
            GgmlType::F16 => GgmlActivation::F16,
            GgmlType::BF16 => GgmlActivation::Bf16,
            GgmlType::F32
            | GgmlType::Q8_K
            | GgmlType::F64
            | GgmlType::I8
            | GgmlType::I16
            | GgmlType::I32
            | GgmlType::I64 => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            GgmlActivation::Q8_0 => "llama.cpp cpu: q8_0 blocks of 32",
            GgmlActivation::Q8_1 => "llama.cpp cpu: q8_1 blocks of 32 (with the f16 block sums)",
            GgmlActivation::Q8K => "llama.cpp cpu: q8_K blocks of 256",
            GgmlActivation::F16 => "llama.cpp cpu: f16",
            GgmlActivation::Bf16 => "llama.cpp cpu: bf16",
        }
    }

    /// Quantize-dequantize rows of `cols` values in place.
    pub fn apply(self, x: &mut [f32], cols: usize) {
        match self {
            GgmlActivation::Q8_0 | GgmlActivation::Q8_1 => rows(x, cols, 32, q8_0_block),
            GgmlActivation::Q8K => rows(x, cols, 256, q8k_block),
            GgmlActivation::F16 => x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32()),
            GgmlActivation::Bf16 => x.iter_mut().for_each(|v| *v = bf16::from_f32(*v).to_f32()),
        }
    }
}

fn rows(x: &mut [f32], cols: usize, block: usize, f: fn(&mut [f32])) {
    if cols == 0 {
        return;
    }
    for row in x.chunks_mut(cols) {
        for b in row.chunks_mut(block) {
            f(b);
        }
    }
}

fn q8_0_block(b: &mut [f32]) {
    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 {
        b.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let d = f16::from_f32(amax / 127.0).to_f32();
    let id = 127.0 / amax;
    for v in b.iter_mut() {
        *v = (*v * id).round_ties_even() * d;
    }
}

/// Rounds rows of `cols` values to Q8_1 in place (Q8_0's grid) and returns, per row and block of
/// 32, `s − d·Σq`: ggml's Q4_1/Q5_1 dot product adds the weight block's minimum times the
/// activation block's stored sum `s = f16(d32·Σq)` (`quantize_row_q8_1`: `d32 = amax/127` before
/// its f16 rounding `d`), not times the rounded values' own sum `d·Σq`. `cols` must be a multiple
/// of 32 (a Q4_1/Q5_1 row always is).
pub fn q8_1_with_sum_residuals(x: &mut [f32], cols: usize) -> Vec<f32> {
    if cols == 0 {
        return Vec::new();
    }
    x.chunks_mut(32)
        .map(|b| {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 {
                b.iter_mut().for_each(|v| *v = 0.0);
                return 0.0;
            }
            let d32 = amax / 127.0;
            let d = f16::from_f32(d32).to_f32();
            let id = 127.0 / amax;
            let mut sum = 0i32;
            for v in b.iter_mut() {
                let q = (*v * id).round_ties_even();
                sum += q as i32;
                *v = q * d;
            }
            f16::from_f32(d32 * sum as f32).to_f32() - d * sum as f32
        })
        .collect()
}

fn q8k_block(b: &mut [f32]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in b.iter() {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        b.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let iscale = -127.0 / max;
    let d = 1.0 / iscale;
    for v in b.iter_mut() {
        *v = (iscale * *v).round_ties_even().min(127.0) * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_keeps_the_block_extreme_and_a_127_step_grid() {
        let mut b: Vec<f32> = (0..32).map(|i| i as f32 / 31.0 - 0.5).collect();
        let orig = b.clone();
        GgmlActivation::Q8_0.apply(&mut b, 32);
        let d = f16::from_f32(0.5 / 127.0).to_f32();
        for (q, o) in b.iter().zip(&orig) {
            let steps = q / d;
            assert!(
                (steps - steps.round()).abs() < 1e-4,
                "{q} is not on the grid"
            );
            assert!((q - o).abs() <= d * 0.5 + 1e-6);
        }
    }

    #[test]
    fn q8k_uses_the_signed_extreme_and_caps_at_127() {
        // The extreme is negative: iscale = -127/max > 0 maps it to -127 exactly.
        let mut b = vec![0.0f32; 256];
        b[0] = -2.0;
        b[1] = 1.0;
        GgmlActivation::Q8K.apply(&mut b, 256);
        assert_eq!(b[0], -2.0);
        assert!((b[1] - 64.0 * 2.0 / 127.0).abs() < 1e-6);
    }

    /// One check per family of `type_traits_cpu`'s `vec_dot_type`, and every type decided.
    #[test]
    fn for_weight_follows_ggml_cpu_vec_dot_type() {
        use GgmlType as T;
        let q8_0 = [
            T::Q4_0,
            T::Q5_0,
            T::Q8_0,
            T::IQ4_NL,
            T::MXFP4,
            T::NVFP4,
            T::Q1_0,
            T::Q2_0,
        ];
        let q8_1 = [T::Q4_1, T::Q5_1, T::Q8_1];
        let k_quants = [T::Q2_K, T::Q3_K, T::Q4_K, T::Q5_K, T::Q6_K];
        let iq = [
            T::IQ2_XXS,
            T::IQ2_XS,
            T::IQ2_S,
            T::IQ3_XXS,
            T::IQ3_S,
            T::IQ1_S,
            T::IQ1_M,
            T::IQ4_XS,
        ];
        let tq = [T::TQ1_0, T::TQ2_0];
        let none = [T::F32, T::Q8_K, T::F64, T::I8, T::I16, T::I32, T::I64];
        let families: [(&[T], Option<GgmlActivation>); 8] = [
            (&q8_0, Some(GgmlActivation::Q8_0)),
            (&q8_1, Some(GgmlActivation::Q8_1)),
            (&k_quants, Some(GgmlActivation::Q8K)),
            (&iq, Some(GgmlActivation::Q8K)),
            (&tq, Some(GgmlActivation::Q8K)),
            (&[T::F16], Some(GgmlActivation::F16)),
            (&[T::BF16], Some(GgmlActivation::Bf16)),
            (&none, None),
        ];
        let mut seen = 0;
        for (types, want) in families {
            for &t in types {
                assert_eq!(GgmlActivation::for_weight(t), want, "{t}");
                seen += 1;
            }
        }
        assert_eq!(seen, GgmlType::ALL.len(), "a type in no family");
    }

    #[test]
    fn q8_1_rounds_to_q8_0s_grid_and_keeps_the_f16_sum_residual() {
        let orig: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 9.3) / 7.0)
            .collect();
        let (mut a, mut b) = (orig.clone(), orig.clone());
        GgmlActivation::Q8_0.apply(&mut a, 64);
        let residuals = q8_1_with_sum_residuals(&mut b, 64);
        assert_eq!(a, b, "the same grid as q8_0");
        assert_eq!(residuals.len(), 2);
        for (block, r) in orig.chunks(32).zip(&residuals) {
            // By hand: the block's integer sum, its f32 and f16 scales.
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            let id = 127.0 / amax;
            let sum: f32 = block.iter().map(|v| (v * id).round_ties_even()).sum();
            let d32 = amax / 127.0;
            let s = f16::from_f32(d32 * sum).to_f32();
            assert_eq!(*r, s - f16::from_f32(d32).to_f32() * sum);
        }
        assert!(residuals.iter().any(|r| *r != 0.0));
    }

    #[test]
    fn float_roundings_are_exact_casts() {
        let mut x = vec![1.0 + 1e-4];
        GgmlActivation::F16.apply(&mut x, 1);
        assert_eq!(x[0], 1.0);
    }
}
