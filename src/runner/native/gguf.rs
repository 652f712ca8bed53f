//! GGUF checkpoints for the native runner: our own header parser for metadata and layout, candle's
//! ggml dequantizers for the tensor data, and llama.cpp's tensor names mapped to Hugging Face's.

use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::{GgmlDType, ggml_file::qtensor_from_ggml};

use super::config::{Arch, ModelConfig};
use super::llamacpp_cpu::GgmlActivation;
use super::weights::{Dense, InputQuant, KvQuant, Linear, WeightStore};
use crate::checkpoint::gguf::{self, GgmlType, GgufFile, GgufValue};
use crate::checkpoint::mmap::MappedFile;
use crate::error::{Error, Result};

pub struct GgufStore {
    path: PathBuf,
    file: GgufFile,
    map: MappedFile,
    arch: Arch,
    /// llama.cpp's converter permutes Q and K rows of NORM-RoPE architectures (llama, mistral) so
    /// that its adjacent-pair rotation matches Hugging Face's half-split one; undo it on load.
    unpermute_qk: bool,
    heads: usize,
    kv_heads: usize,
    emulate: Emulate,
    /// llama.cpp tensor names loading has read (see [`WeightStore::unread`]).
    read: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// Whose numerics the forward pass follows.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Emulate {
    /// Exact dequantized weights, f32 activations: the quantization error itself.
    ReferenceSemantics,
    /// llama.cpp's CPU path: activations quantized to each weight type's dot-product partner,
    /// f16 KV cache.
    LlamacppCpu,
}

impl Emulate {
    /// The numerics a name means: `reference` and `llamacpp-cpu` (the command line's `--emulate`)
    /// or the recorded `reference_semantics` and `llamacpp_cpu`.
    pub fn from_name(name: &str) -> Option<Emulate> {
        match name {
            "reference" | "reference_semantics" => Some(Emulate::ReferenceSemantics),
            "llamacpp-cpu" | "llamacpp_cpu" => Some(Emulate::LlamacppCpu),
            _ => None,
        }
    }
}

/// ggml types candle dequantizes, by our type enum.
fn candle_type(ty: GgmlType) -> Option<GgmlDType> {
    Some(match ty {
        GgmlType::F32 => GgmlDType::F32,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::BF16 => GgmlDType::BF16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q8_1 => GgmlDType::Q8_1,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        GgmlType::Q8_K => GgmlDType::Q8K,
        _ => return None,
    })
}

/// Hugging Face name → llama.cpp name.
fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_owned());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, suffix) = rest.rsplit_once('.')?;
    let name = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{name}.{suffix}"))
}

impl GgufStore {
    /// Open a GGUF file and read the decoder's shape from its metadata.
    pub fn open(path: &Path, emulate: Emulate) -> Result<(GgufStore, ModelConfig)> {
        let file = gguf::read_file(path)?;
        if let Some((_, count)) = file.split()
            && count > 1
        {
            return Err(Error::unsupported(
                path,
                Some("split.count"),
                format!(
                    "a GGUF split into {count} files; merge it with llama-gguf-split --merge first"
                ),
            ));
        }
        let map = MappedFile::open(path)?;
        let arch_name = file.architecture().unwrap_or_default().to_owned();
        let arch = Arch::from_name(&arch_name).ok_or_else(|| {
            Error::unsupported(
                path,
                Some("general.architecture"),
                format!(
                    "architecture `{arch_name}` is not supported by the native runner (supported: {})",
                    super::config::SUPPORTED.join(", ")
                ),
            )
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let uint = |k: &str| -> Result<usize> {
            file.get(&key(k))
                .and_then(GgufValue::as_u64)
                .filter(|&v| v > 0)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| {
                    Error::format(path, Some(&key(k)), "missing or not a positive integer")
                })
        };
        let float = |k: &str| -> Option<f64> {
            match file.get(&key(k))? {
                GgufValue::F32(v) => Some(f64::from(*v)),
                GgufValue::F64(v) => Some(*v),
                _ => None,
            }
        };
        let hidden = uint("embedding_length")?;
        let heads = uint("attention.head_count")?;
        let kv_heads = uint("attention.head_count_kv").unwrap_or(heads);
        let head_dim = uint("attention.key_length").unwrap_or(hidden / heads);
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::format(path, Some("token_embd.weight"), "tensor missing"))?;
        let vocab = embd.dims.get(1).copied().unwrap_or(0) as usize;
        let config = ModelConfig {
            arch,
            hidden,
            intermediate: uint("feed_forward_length")?,
            layers: uint("block_count")?,
            heads,
            kv_heads,
            head_dim,
            vocab,
            rms_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_theta: float("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling: None,
            tie_embeddings: file.tensor("output.weight").is_none(),
            sliding_window: None,
            max_positions: uint("context_length").ok(),
            // A GGUF file has no flags for them: its tensors are the declaration.
            biases: super::config::Biases {
                qkv: file.tensor("blk.0.attn_q.bias").is_some(),
                o: file.tensor("blk.0.attn_output.bias").is_some(),
                mlp: file.tensor("blk.0.ffn_up.bias").is_some(),
            },
            rotary_dim: head_dim,
            prefix: "model".into(),
            hybrid: None,
        };
        config.validate(path)?;
        let store = GgufStore {
            path: path.to_owned(),
            unpermute_qk: matches!(arch, Arch::Llama | Arch::Mistral),
            file,
            map,
            arch,
            heads,
            kv_heads,
            emulate,
            read: Default::default(),
        };
        Ok((store, config))
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// `tokenizer.ggml.bos_token_id`, if the file has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.file
            .get("tokenizer.ggml.bos_token_id")
            .and_then(GgufValue::as_u64)
            .and_then(|b| u32::try_from(b).ok())
    }

    fn load(&self, hf: &str) -> Result<Option<Dense>> {
        let Some(name) = gguf_name(hf) else {
            return Ok(None);
        };
        let Some(t) = self.file.tensor(&name) else {
            return Ok(None);
        };
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone());
        let bad = |rule: String| Error::format(&self.path, Some(&name), rule);
        let ty = candle_type(t.ty).ok_or_else(|| {
            Error::unsupported(&self.path, Some(&name), format!(
                "ggml type {} cannot be dequantized by the native runner (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, Q8_K)",
                t.ty.name()
            ))
        })?;
        let start = usize::try_from(t.offset).map_err(|_| bad("offset overflows".into()))?;
        let len = usize::try_from(t.n_bytes).map_err(|_| bad("size overflows".into()))?;
        let bytes = start
            .checked_add(len)
            .and_then(|end| self.map.bytes().get(start..end))
            .ok_or_else(|| bad("data lies outside the file".into()))?;
        let mut dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        dims.reverse();
        let q = qtensor_from_ggml(ty, bytes, dims.clone(), &Device::Cpu)
            .map_err(|e| bad(format!("dequantizing: {e}")))?;
        let tensor = q
            .dequantize(&Device::Cpu)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| bad(format!("dequantizing: {e}")))?;
        let mut dense = Dense {
            shape: dims,
            data: tensor,
        };
        if self.unpermute_qk
            && (hf.ends_with("self_attn.q_proj.weight") || hf.ends_with("self_attn.k_proj.weight"))
        {
            let heads = if hf.contains("q_proj") {
                self.heads
            } else {
                self.kv_heads
            };
            dense.data = unpermute_rows(&dense.data, &dense.shape, heads).map_err(bad)?;
        }
        Ok(Some(dense))
    }
}

/// Inverse of llama.cpp's `permute(w, n_head)`: GGUF row `h*d + 2i + s` is HF row `h*d + s*d/2 + i`.
fn unpermute_rows(
    data: &[f32],
    shape: &[usize],
    heads: usize,
) -> std::result::Result<Vec<f32>, String> {
    let [rows, cols] = shape else {
        return Err(format!("expected a 2-D weight, found shape {shape:?}"));
    };
    let (rows, cols) = (*rows, *cols);
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(format!(
            "{rows} rows do not split into {heads} heads of even size"
        ));
    }
    let d = rows / heads;
    let half = d / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..heads {
        for i in 0..half {
            for s in 0..2 {
                let src = (h * d + 2 * i + s) * cols;
                let dst = (h * d + s * half + i) * cols;
                out[dst..dst + cols].copy_from_slice(&data[src..src + cols]);
            }
        }
    }
    Ok(out)
}

impl WeightStore for GgufStore {
    fn path(&self) -> &Path {
        &self.path
    }

    fn has(&self, name: &str) -> bool {
        gguf_name(name).is_some_and(|n| self.file.tensor(&n).is_some())
    }

    fn unread(&self) -> Vec<String> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        self.file
            .tensors
            .iter()
            .map(|t| &t.name)
            .filter(|name| !read.contains(*name))
            .cloned()
            .collect()
    }

    fn dense(&self, name: &str) -> Result<Dense> {
        self.load(name)?.ok_or_else(|| {
            Error::format(&self.path, Some(name), "tensor missing from the GGUF file")
        })
    }

    fn linear(&self, module: &str) -> Result<Linear> {
        let w = self.dense(&format!("{module}.weight"))?;
        let [out, inp] = w.shape[..] else {
            return Err(Error::format(&self.path, Some(module), "weight is not 2-D"));
        };
        let ggml = gguf_name(&format!("{module}.weight"))
            .and_then(|n| self.file.tensor(&n))
            .map(|t| t.ty);
        let ty = ggml.map_or("?", GgmlType::name);
        let input = match (self.emulate, ggml) {
            (Emulate::LlamacppCpu, Some(t)) => match t {
                GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q8_0 => InputQuant::Ggml(GgmlActivation::Q8_0),
                GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K => InputQuant::Ggml(GgmlActivation::Q8K),
                GgmlType::F16 => InputQuant::Ggml(GgmlActivation::F16),
                GgmlType::BF16 => InputQuant::Ggml(GgmlActivation::Bf16),
                _ => InputQuant::None,
            },
            _ => InputQuant::None,
        };
        let bias = self.load(&format!("{module}.bias"))?.map(|b| b.data);
        Ok(Linear {
            out,
            inp,
            weight: w.data,
            bias,
            input,
            scheme: format!("gguf {ty}"),
        })
    }

    fn kv_cache(&self, _attention: &str) -> Result<Option<KvQuant>> {
        Ok((self.emulate == Emulate::LlamacppCpu).then_some(KvQuant::F16))
    }

    fn tensor_sha256(&self, name: &str) -> Result<Option<String>> {
        use sha2::{Digest, Sha256};
        let Some(t) = gguf_name(name).and_then(|n| self.file.tensor(&n)) else {
            return Ok(None);
        };
        let bytes = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.n_bytes).ok())
            .and_then(|(a, n)| self.map.bytes().get(a..a.checked_add(n)?))
            .ok_or_else(|| {
                Error::format(&self.path, Some(&t.name), "data lies outside the file")
            })?;
        Ok(Some(crate::checkpoint::hash::hex(&Sha256::digest(bytes))))
    }

    fn stored_dtype(&self, name: &str) -> String {
        gguf_name(name)
            .and_then(|n| self.file.tensor(&n))
            .map_or("unknown".into(), |t| t.ty.name().to_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emulate_names() {
        for (name, e) in [
            ("reference", Emulate::ReferenceSemantics),
            ("reference_semantics", Emulate::ReferenceSemantics),
            ("llamacpp-cpu", Emulate::LlamacppCpu),
            ("llamacpp_cpu", Emulate::LlamacppCpu),
        ] {
            assert_eq!(Emulate::from_name(name), Some(e), "{name}");
        }
        assert_eq!(Emulate::from_name("llamacpp"), None);
    }

    #[test]
    fn hf_names_map_to_llamacpp_names() {
        assert_eq!(
            gguf_name("model.layers.3.self_attn.q_proj.weight").unwrap(),
            "blk.3.attn_q.weight"
        );
        assert_eq!(
            gguf_name("model.layers.0.mlp.down_proj.weight").unwrap(),
            "blk.0.ffn_down.weight"
        );
        assert_eq!(
            gguf_name("model.layers.1.self_attn.k_proj.bias").unwrap(),
            "blk.1.attn_k.bias"
        );
        assert_eq!(gguf_name("lm_head.weight").unwrap(), "output.weight");
        assert!(gguf_name("model.layers.0.mlp.experts.0.weight").is_none());
    }

    #[test]
    fn unpermute_inverts_llamacpp_permute() {
        // One head of size 4, one column: llama.cpp's permute maps HF rows [a b c d] (halves
        // [a b], [c d]) to [a c b d].
        let gguf = [0.0, 2.0, 1.0, 3.0];
        let hf = unpermute_rows(&gguf, &[4, 1], 1).unwrap();
        assert_eq!(hf, vec![0.0, 1.0, 2.0, 3.0]);
    }
}
