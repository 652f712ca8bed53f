//! Exact dequantization of every on-disk weight format the native runner loads.
//!
//! Pure functions from the bytes of safetensors tensors to row-major `f32`: no candle, no I/O.
//! Every function validates dtypes, shapes and byte lengths first (with checked arithmetic) and
//! returns an `Err(String)` naming the tensor role (`weight_scale`, `qzeros`, ...) and the shapes
//! involved; the caller prefixes file and module. Nothing here panics on bad input.
//!
//! Numerics: every weight is computed in `f32` as the formula of its reference implementation,
//! in the same order of operations, but without the final rounding to the model dtype (bf16/f16)
//! that the Python references apply when they decompress. For the integer formats the `f32`
//! product `(q - z) * s` is exact (at most 9 significant bits times an f16/bf16 scale), so the
//! result is the mathematical value of the weight.
//!
//! Layout of the module:
//! - [`floats`]: scalar decoders (FP8 E4M3/E5M2, E8M0, FP4 E2M1), [`to_f32`], round-to-format.
//! - [`ct`]: compressed-tensors dense and `pack-quantized` integer formats.
//! - [`fp4`]: NVFP4 (compressed-tensors and ModelOpt) and MXFP4 (compressed-tensors, OCP/gpt-oss).
//! - [`fp8`]: fine-grained block FP8 (`quant_method: fp8`).
//! - [`int`]: AWQ GEMM and GPTQ.
//! - [`fake_quant`]: activation / KV fake quantization.

mod check;
pub mod ct;
pub mod fake_quant;
pub mod floats;
pub mod fp4;
pub mod fp8;
pub mod int;
#[cfg(test)]
mod tests;

use crate::checkpoint::dtype::Dtype;

pub use ct::{CtArgs, CtStrategy, ct_dense, ct_pack_quantized};
pub use fake_quant::{
    fake_quant_fp8_per_token, fake_quant_fp8_static, fake_quant_int8_per_token, fake_quant_nvfp4,
};
pub use floats::{
    e8m0_to_f32, fp4_e2m1_to_f32, fp8_e4m3_to_f32, fp8_e5m2_to_f32, round_to_e2m1, round_to_e4m3,
    round_to_e5m2, to_f32,
};
pub use fp4::{ct_mxfp4, ct_nvfp4, modelopt_nvfp4, mxfp4};
pub use fp8::fp8_block;
pub use int::{GptqFormat, awq_gemm, gptq};

/// A tensor as stored on disk: dtype, shape, little-endian bytes (exactly
/// `shape.product() * bits / 8` bytes).
#[derive(Debug, Clone, Copy)]
pub struct Stored<'a> {
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

/// Every function returns the logical weight as row-major `f32` `[out, in]` (for 2-D weights) or
/// an error whose message says exactly what is wrong, e.g. "weight_scale has shape [4, 1]; a
/// group size of 128 over 256 input columns needs [4, 2]".
pub type Result<T> = std::result::Result<T, String>;
