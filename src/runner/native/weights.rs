//! Weights as the decoder uses them: f32 on exactly dequantized values, read by Hugging Face
//! tensor name from safetensors (every format of [`crate::dequant`]) or GGUF (candle's
//! dequantizers). Declared activation quantization is resolved here too, per linear module.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::mmap::MappedFile;
use crate::checkpoint::quant_config::{self, Declared, Expectation, WeightDecl};
use crate::checkpoint::safetensors::{self, SafetensorsCheckpoint, TensorInfo};
use crate::dequant::{self, CtArgs, CtStrategy, GptqFormat, Stored};
use crate::error::{Error, Result};

/// A plain f32 tensor, row-major.
#[derive(Debug, Clone)]
pub struct Dense {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Quantization applied to a linear module's input in the forward pass (fake-quant), so the rerun
/// measures what the checkpoint's declared activation path computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InputQuant {
    None,
    /// FP8 E4M3, one dynamic scale per token (row).
    Fp8PerToken,
    /// FP8 E4M3, one dynamic scale per group of `n` columns of each token.
    Fp8PerTokenGroup(usize),
    /// FP8 E4M3 with a static per-tensor scale.
    Fp8Static(f32),
    /// INT8, one dynamic symmetric scale per token.
    Int8PerToken,
    /// NVFP4: E2M1 values, E4M3 scales per 16 elements under a global scale.
    Nvfp4 {
        global_scale: f32,
    },
    /// An engine's own activation path (`--emulate`), e.g. llama.cpp's CPU Q8 blocks.
    Ggml(super::llamacpp_cpu::GgmlActivation),
}

impl InputQuant {
    pub fn describe(self) -> String {
        match self {
            InputQuant::None => "none".into(),
            InputQuant::Fp8PerToken => "fp8_e4m3 dynamic per token".into(),
            InputQuant::Fp8PerTokenGroup(n) => {
                format!("fp8_e4m3 dynamic per token per {n} columns")
            }
            InputQuant::Fp8Static(_) => "fp8_e4m3 static per tensor".into(),
            InputQuant::Int8PerToken => "int8 dynamic per token".into(),
            InputQuant::Nvfp4 { .. } => "nvfp4 dynamic per 16 elements".into(),
            InputQuant::Ggml(g) => g.describe().into(),
        }
    }
}

/// A linear module's weight `[out, in]`, bias, and input quantization.
#[derive(Debug, Clone)]
pub struct Linear {
    pub out: usize,
    pub inp: usize,
    /// `[out, in]`, row-major: in place in the file where it is stored as plain f32.
    pub weight: super::matmul::Values,
    pub bias: Option<Vec<f32>>,
    pub input: InputQuant,
    /// How the weight was stored (`bf16`, `compressed-tensors int-quantized channel`, ...).
    pub scheme: String,
    /// `[out, in / 32]`: each 32-column block's stored minimum, for a Q4_1/Q5_1 weight emulating
    /// llama.cpp (its dot product adds `m · s` with the activation block's f16 sum `s`, not the
    /// sum of the rounded activations: [`super::llamacpp_cpu::q8_1_sum_residuals`]).
    pub block_mins: Option<Vec<f32>>,
    /// The weight's blocks in place in the file, where its format has a one-row product that
    /// reads them ([`super::packed`]); `None` for any weight rearranged after reading.
    pub packed: Option<super::packed::PackedRows>,
}

/// KV-cache quantization declared by the checkpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvFp8 {
    pub k_scale: f32,
    pub v_scale: f32,
}

/// How the KV cache rounds keys (after RoPE) and values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvQuant {
    Fp8(KvFp8),
    /// An f16 cache (llama.cpp's default).
    F16,
    /// A scheme the run asks for (`--kv-cache`), K and V separately; it replaces what the
    /// checkpoint declares.
    Scheme {
        setting: super::kv_cache::KvCacheSetting,
        /// The per-tensor scales of vLLM's fp8 schemes: the checkpoint's, else 1.0.
        k_scale: f32,
        v_scale: f32,
        /// llama.cpp's Hadamard rotation block sizes for keys and values, where they rotate.
        k_rotation: Option<usize>,
        v_rotation: Option<usize>,
    },
}

/// Source of weights by Hugging Face name.
pub trait WeightStore {
    fn path(&self) -> &Path;
    fn has(&self, name: &str) -> bool;
    /// A high-precision tensor (embeddings, norms, biases, an unquantized linear weight).
    fn dense(&self, name: &str) -> Result<Dense>;
    /// A linear module (`model.layers.0.self_attn.q_proj`), dequantized.
    fn linear(&self, module: &str) -> Result<Linear>;
    /// [`WeightStore::dense`]'s shape and values, read in place from the file's map where the
    /// tensor is stored as plain f32 and needs no rearranging (no copy), else as `dense` gives
    /// them.
    fn dense_values(&self, name: &str) -> Result<(Vec<usize>, super::matmul::Values)> {
        self.dense(name).map(|d| (d.shape, d.data.into()))
    }
    /// A tensor's blocks in place in the file, for the one-row product ([`super::packed`]);
    /// `None` where the format has none or the tensor is rearranged on reading.
    fn packed_rows(&self, _name: &str) -> Result<Option<super::packed::PackedRows>> {
        Ok(None)
    }
    /// FP8 KV-cache scales of one attention module, if the checkpoint declares a quantized cache.
    fn kv_cache(&self, attention: &str) -> Result<Option<KvQuant>>;
    /// How the output layer's input is rounded when the output layer is the tied embedding
    /// `embedding`: an engine multiplies by the embedding as stored, so an emulated engine
    /// rounds that product's input as it rounds any other (llama.cpp: the embedding type's
    /// dot-product partner). Nothing by default.
    fn tied_head_input(&self, _embedding: &str) -> InputQuant {
        InputQuant::None
    }
    /// Whether attention's two products round their f32 inputs (Q, the softmax weights) to f16,
    /// as an engine multiplying them with an f16 KV cache in f16 does (llama.cpp without flash
    /// attention). No by default.
    fn f16_attention_products(&self) -> bool {
        false
    }
    /// SHA-256 of a tensor's bytes as stored (identifies the lm_head whatever its format).
    fn tensor_sha256(&self, name: &str) -> Result<Option<String>>;
    /// The stored dtype of a tensor, lower case (`bf16`), or `unknown`.
    fn stored_dtype(&self, name: &str) -> String;
    /// Tensors of the checkpoint that loading never read: the declared architecture does not
    /// use them, so the checkpoint is not what its config says it is.
    fn unread(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Tensors transformers itself ignores when loading (buffers older exports saved).
pub fn ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
}

/// A tensor as stored: the file holding it, dtype, shape and bytes.
type Raw<'a> = (PathBuf, Dtype, Vec<usize>, &'a [u8]);

/// A safetensors checkpoint, memory-mapped.
pub struct SafetensorsStore {
    dir: PathBuf,
    checkpoint: SafetensorsCheckpoint,
    maps: BTreeMap<PathBuf, MappedFile>,
    config: Value,
    declared: Option<Declared>,
    /// Tensor names loading has looked up (see [`WeightStore::unread`]).
    read: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl SafetensorsStore {
    pub fn open(dir: &Path, config: Value) -> Result<SafetensorsStore> {
        let checkpoint = safetensors::open_dir(dir)?;
        let mut maps = BTreeMap::new();
        for file in &checkpoint.files {
            let map = MappedFile::open(&file.path)?;
            if map.bytes().len() as u64 != file.file_size {
                return Err(Error::format(
                    &file.path,
                    None,
                    "file changed size since its header was read",
                ));
            }
            maps.insert(file.path.clone(), map);
        }
        let hf_quant = std::fs::read_to_string(dir.join("hf_quant_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok());
        let declared = quant_config::declared(Some(&config), hf_quant.as_ref());
        Ok(SafetensorsStore {
            dir: dir.to_owned(),
            checkpoint,
            maps,
            config,
            declared,
            read: Default::default(),
        })
    }

    pub fn declared(&self) -> Option<&Declared> {
        self.declared.as_ref()
    }

    /// The runner computes what the checkpoint's declaration says (weight formats, activation
    /// quantization, KV cache): a `quant_method` cardproof does not know leaves that unknown, so
    /// it is refused before any work rather than measured as if it were plain weights.
    pub fn refuse_unknown_method(&self) -> Result<()> {
        let Some(d) = self.declared.as_ref().filter(|d| !d.known) else {
            return Ok(());
        };
        let what = if d.method.is_empty() {
            "has no `quant_method` string".to_owned()
        } else {
            format!(
                "quant_method `{}` is not a quantization method cardproof knows",
                d.method
            )
        };
        Err(Error::unsupported(
            &self.dir.join("config.json"),
            Some("quantization_config"),
            format!(
                "{what} (known: {}), so the native runner cannot tell what this checkpoint computes",
                quant_config::KNOWN_METHODS.join(", ")
            ),
        ))
    }

    /// A tensor loading uses (recorded as read).
    fn find(&self, name: &str) -> Option<(&Path, &TensorInfo)> {
        let found = self.checkpoint.tensor(name)?;
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
        Some((found.0.path.as_path(), found.1))
    }

    /// The stored bytes and shape of a tensor.
    fn stored(&self, name: &str) -> Result<Option<Raw<'_>>> {
        let Some((path, info)) = self.find(name) else {
            return Ok(None);
        };
        let map = &self.maps[path];
        let range = usize::try_from(info.data.start)
            .ok()
            .zip(usize::try_from(info.data.end).ok());
        let bytes = range
            .and_then(|(a, b)| map.bytes().get(a..b))
            .ok_or_else(|| Error::format(path, Some(name), "data range outside the file"))?;
        let shape = info
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| Error::format(path, Some(name), "shape does not fit in memory"))?;
        Ok(Some((path.to_owned(), info.dtype, shape, bytes)))
    }

    fn quant_method(&self) -> Option<&str> {
        self.declared.as_ref().map(|d| d.method.as_str())
    }

    fn quant_config(&self) -> &Value {
        self.config
            .get("quantization_config")
            .unwrap_or(&Value::Null)
    }

    fn scalar(&self, name: &str) -> Result<Option<f32>> {
        let Some((path, dtype, shape, bytes)) = self.stored(name)? else {
            return Ok(None);
        };
        let values = dequant::to_f32(Stored {
            dtype,
            shape: &shape,
            bytes,
        })
        .map_err(|e| Error::format(&path, Some(name), e))?;
        match values.as_slice() {
            [v] if v.is_finite() && *v > 0.0 => Ok(Some(*v)),
            _ => Err(Error::format(
                &path,
                Some(name),
                format!(
                    "expected one positive finite scale, found {} values",
                    values.len()
                ),
            )),
        }
    }

    fn input_quant(&self, module: &str, activations: Option<&str>) -> Result<InputQuant> {
        let method = self.quant_method().unwrap_or_default();
        let bad = |what: &str| {
            Error::unsupported(
                &self.dir.join("config.json"),
                Some("quantization_config"),
                format!(
                    "declared activation quantization `{what}` of {module} cannot be emulated by the native runner (supported: dynamic float8 per token or per token group, static float8 per tensor, dynamic int8 per token, nvfp4)"
                ),
            )
        };
        if method == "modelopt" {
            let input_scale = self.scalar(&format!("{module}.input_scale"))?;
            return Ok(
                match (self.find(&format!("{module}.weight_scale_2")), input_scale) {
                    (Some(_), Some(s)) => InputQuant::Nvfp4 {
                        global_scale: 1.0 / s,
                    },
                    (None, Some(s)) => InputQuant::Fp8Static(s),
                    _ => InputQuant::None,
                },
            );
        }
        let Some(a) = activations else {
            return Ok(InputQuant::None);
        };
        let group = || {
            self.quant_config()
                .get("weight_block_size")
                .and_then(|b| b.get(1))
                .and_then(Value::as_u64)
                .map_or(128, |g| g as usize)
        };
        Ok(match a {
            "dynamic float8 token" => InputQuant::Fp8PerToken,
            "dynamic float8 group" | "dynamic float8" => InputQuant::Fp8PerTokenGroup(group()),
            "dynamic int8 token" => InputQuant::Int8PerToken,
            "static float8 tensor" => {
                let s = self
                    .scalar(&format!("{module}.input_scale"))?
                    .ok_or_else(|| bad("static float8 tensor without input_scale"))?;
                InputQuant::Fp8Static(s)
            }
            a if a.starts_with("dynamic-local float4") => {
                let g = self
                    .scalar(&format!("{module}.input_global_scale"))?
                    .ok_or_else(|| bad("nvfp4 without input_global_scale"))?;
                InputQuant::Nvfp4 { global_scale: g }
            }
            other => return Err(bad(other)),
        })
    }

    /// One stored part of a linear module (`{module}.{suffix}`), if the checkpoint has it.
    fn part(&self, module: &str, suffix: &str) -> Result<Option<Raw<'_>>> {
        self.stored(&format!("{module}.{suffix}"))
    }

    /// A linear module's weight dequantized, by which weight tensor it stores (qweight,
    /// weight_packed or weight), so each storage family is read by its own rules.
    fn dequantize_linear(
        &self,
        module: &str,
        decl: Option<&WeightDecl>,
        method: &str,
    ) -> Result<Dequantized> {
        if let Some(qweight) = self.part(module, "qweight")? {
            self.qweight_linear(module, &qweight, method)
        } else if let Some(packed) = self.part(module, "weight_packed")? {
            self.packed_linear(module, &packed, decl)
        } else if let Some(w8) = self.part(module, "weight")? {
            self.weight_linear(module, &w8, decl, method)
        } else {
            Err(Error::format(
                &self.dir,
                Some(module),
                "no weight tensor (weight, weight_packed or qweight) for this linear module",
            ))
        }
    }

    /// A `qweight` module (AWQ or GPTQ): both need qzeros and scales beside it.
    fn qweight_linear(&self, module: &str, qweight: &Raw<'_>, method: &str) -> Result<Dequantized> {
        let err = |path: &Path, e: String| Error::format(path, Some(module), e);
        let qzeros = self
            .part(module, "qzeros")?
            .ok_or_else(|| err(&qweight.0, "qweight without qzeros".into()))?;
        let scales = self
            .part(module, "scales")?
            .ok_or_else(|| err(&qweight.0, "qweight without scales".into()))?;
        if method == "awq" {
            self.awq_linear(module, qweight, &qzeros, &scales)
        } else if method == "gptq" {
            self.gptq_linear(module, qweight, &qzeros, &scales)
        } else {
            Err(Error::unsupported(
                &qweight.0,
                Some(module),
                format!(
                    "`qweight` tensors under quant_method `{method}` are not supported (supported: awq, gptq)"
                ),
            ))
        }
    }

    /// AWQ GEMM int4: the config's version, bits and group size decide whether it can be read.
    fn awq_linear(
        &self,
        module: &str,
        qweight: &Raw<'_>,
        qzeros: &Raw<'_>,
        scales: &Raw<'_>,
    ) -> Result<Dequantized> {
        let err = |path: &Path, e: String| Error::format(path, Some(module), e);
        let unsupported = |path: &Path, e: String| Error::unsupported(path, Some(module), e);
        let q = self.quant_config();
        let version = q.get("version").and_then(Value::as_str).unwrap_or("gemm");
        if !version.eq_ignore_ascii_case("gemm") {
            return Err(unsupported(
                &qweight.0,
                format!("AWQ version `{version}` is not supported (supported: gemm)"),
            ));
        }
        let bits = q
            .get("bits")
            .or(q.get("w_bit"))
            .and_then(Value::as_u64)
            .unwrap_or(4);
        if bits != 4 {
            return Err(unsupported(
                &qweight.0,
                format!("AWQ with {bits} bits is not supported (supported: 4)"),
            ));
        }
        let group = q
            .get("group_size")
            .or(q.get("q_group_size"))
            .and_then(Value::as_u64)
            .ok_or_else(|| err(&qweight.0, "AWQ config has no group_size".into()))?
            as usize;
        let weight = dequant::awq_gemm(
            as_stored(qweight),
            as_stored(qzeros),
            as_stored(scales),
            group,
        )
        .map_err(|e| err(&qweight.0, e))?;
        Ok(Dequantized {
            weight,
            out: scales.2.get(1).copied().unwrap_or(0),
            inp: qweight.2.first().copied().unwrap_or(0),
            scheme: format!("awq int4 gemm group {group}"),
        })
    }

    /// GPTQ: bits, group size and checkpoint format come from the config, g_idx if stored.
    fn gptq_linear(
        &self,
        module: &str,
        qweight: &Raw<'_>,
        qzeros: &Raw<'_>,
        scales: &Raw<'_>,
    ) -> Result<Dequantized> {
        let q = self.quant_config();
        let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(4) as u32;
        let group = q
            .get("group_size")
            .and_then(Value::as_i64)
            .filter(|g| *g > 0)
            .map(|g| g as usize);
        let format = match q.get("checkpoint_format").and_then(Value::as_str) {
            Some("gptq_v2") => GptqFormat::V2,
            _ => GptqFormat::V1,
        };
        let g_idx = self.part(module, "g_idx")?;
        let weight = dequant::gptq(
            as_stored(qweight),
            as_stored(qzeros),
            as_stored(scales),
            g_idx.as_ref().map(as_stored),
            bits,
            group,
            format,
        )
        .map_err(|e| Error::format(&qweight.0, Some(module), e))?;
        let out = scales.2.get(1).copied().unwrap_or(0);
        let inp = weight.len().checked_div(out).unwrap_or(0);
        Ok(Dequantized {
            weight,
            out,
            inp,
            scheme: format!("gptq int{bits}"),
        })
    }

    /// A compressed-tensors `weight_packed` module: NVFP4, MXFP4 or packed integers.
    fn packed_linear(
        &self,
        module: &str,
        packed: &Raw<'_>,
        decl: Option<&WeightDecl>,
    ) -> Result<Dequantized> {
        let err = |path: &Path, e: String| Error::format(path, Some(module), e);
        let scale = self
            .part(module, "weight_scale")?
            .ok_or_else(|| err(&packed.0, "weight_packed without weight_scale".into()))?;
        let w = decl.cloned().unwrap_or_default();
        let format = w.format.clone().unwrap_or_default();
        let out = packed.2.first().copied().unwrap_or(0);
        let half_inp = packed.2.get(1).copied().unwrap_or(0);
        if packed.1 == Dtype::U8 && format.starts_with("nvfp4")
            || self.has(&format!("{module}.weight_global_scale"))
        {
            let global = self
                .part(module, "weight_global_scale")?
                .ok_or_else(|| err(&packed.0, "NVFP4 weight without weight_global_scale".into()))?;
            let weight =
                dequant::ct_nvfp4(as_stored(packed), as_stored(&scale), as_stored(&global))
                    .map_err(|e| err(&packed.0, e))?;
            Ok(Dequantized {
                weight,
                out,
                inp: half_inp * 2,
                scheme: "compressed-tensors nvfp4-pack-quantized".into(),
            })
        } else if packed.1 == Dtype::U8 {
            let weight = dequant::ct_mxfp4(as_stored(packed), as_stored(&scale))
                .map_err(|e| err(&packed.0, e))?;
            Ok(Dequantized {
                weight,
                out,
                inp: half_inp * 2,
                scheme: "compressed-tensors mxfp4-pack-quantized".into(),
            })
        } else {
            self.pack_quantized_linear(module, packed, &scale, w)
        }
    }

    /// Compressed-tensors integer pack-quantized: the logical shape is read from weight_shape.
    fn pack_quantized_linear(
        &self,
        module: &str,
        packed: &Raw<'_>,
        scale: &Raw<'_>,
        w: WeightDecl,
    ) -> Result<Dequantized> {
        let err = |path: &Path, e: String| Error::format(path, Some(module), e);
        let shape_t = self
            .part(module, "weight_shape")?
            .ok_or_else(|| err(&packed.0, "weight_packed without weight_shape".into()))?;
        let dims = dequant::to_f32(as_stored(&shape_t)).map_err(|e| err(&shape_t.0, e))?;
        let [o, i] = dims.as_slice() else {
            return Err(err(
                &shape_t.0,
                format!("weight_shape holds {} values, expected 2", dims.len()),
            ));
        };
        let (o, i) = (*o as usize, *i as usize);
        let bits = w.bits.unwrap_or(4) as u32;
        let zp = self.part(module, "weight_zero_point")?;
        let g_idx = self.part(module, "weight_g_idx")?;
        let args = ct_args(&w);
        let weight = dequant::ct_pack_quantized(
            as_stored(packed),
            [o, i],
            bits,
            as_stored(scale),
            zp.as_ref().map(as_stored),
            g_idx.as_ref().map(as_stored),
            &args,
        )
        .map_err(|e| err(&packed.0, e))?;
        Ok(Dequantized {
            weight,
            out: o,
            inp: i,
            scheme: format!(
                "compressed-tensors pack-quantized int{bits} {}",
                w.strategy.unwrap_or_default()
            ),
        })
    }

    /// A plain `weight` tensor: high-precision float, or quantized with the scale tensors
    /// beside it naming the format (fine-grained fp8, modelopt, compressed-tensors).
    fn weight_linear(
        &self,
        module: &str,
        w8: &Raw<'_>,
        decl: Option<&WeightDecl>,
        method: &str,
    ) -> Result<Dequantized> {
        let err = |path: &Path, e: String| Error::format(path, Some(module), e);
        let unsupported = |path: &Path, e: String| Error::unsupported(path, Some(module), e);
        let (dtype, shape) = (w8.1, w8.2.clone());
        let [o, i] = shape.as_slice() else {
            return Err(err(
                &w8.0,
                format!("weight has shape {shape:?}, expected 2 dimensions"),
            ));
        };
        let (out, inp) = (*o, *i);
        let plain = |weight: Vec<f32>, scheme: String| Dequantized {
            weight,
            out,
            inp,
            scheme,
        };
        if dtype.is_high_precision_float() {
            let weight = dequant::to_f32(as_stored(w8)).map_err(|e| err(&w8.0, e))?;
            Ok(plain(weight, dtype.name().to_lowercase()))
        } else if let Some(scale_inv) = self.part(module, "weight_scale_inv")? {
            let (weight, scheme) = self.fp8_block_weight(module, w8, &scale_inv)?;
            Ok(plain(weight, scheme))
        } else if let Some(scale_2) = self.part(module, "weight_scale_2")? {
            let scale = self
                .part(module, "weight_scale")?
                .ok_or_else(|| err(&w8.0, "weight_scale_2 without weight_scale".into()))?;
            let weight =
                dequant::modelopt_nvfp4(as_stored(w8), as_stored(&scale), as_stored(&scale_2))
                    .map_err(|e| err(&w8.0, e))?;
            Ok(Dequantized {
                inp: inp * 2,
                ..plain(weight, "modelopt nvfp4".into())
            })
        } else if let Some(scale) = self.part(module, "weight_scale")? {
            if dtype == Dtype::U8 && method == "modelopt" {
                let weight =
                    dequant::mxfp4(as_stored(w8), as_stored(&scale)).map_err(|e| err(&w8.0, e))?;
                Ok(Dequantized {
                    inp: inp * 2,
                    ..plain(weight, "modelopt mxfp4".into())
                })
            } else {
                let (weight, scheme) = self.scaled_weight(module, w8, &scale, decl, method)?;
                Ok(plain(weight, scheme))
            }
        } else if self.has(&format!("{module}.weight.quant_state.bitsandbytes__nf4"))
            || self.has(&format!("{module}.weight.quant_state.bitsandbytes__fp4"))
            || self.has(&format!("{module}.SCB"))
        {
            Err(unsupported(&w8.0, "bitsandbytes weights are not supported by the native runner (supported: compressed-tensors, fine-grained fp8, awq, gptq, modelopt nvfp4/fp8/mxfp4, gguf)".into()))
        } else {
            Err(unsupported(
                &w8.0,
                format!(
                    "weight stored as {} with no scale tensor: not a format the native runner knows",
                    dtype.name()
                ),
            ))
        }
    }

    /// Fine-grained FP8 with block scales (`weight_scale_inv`): the block size is the config's.
    fn fp8_block_weight(
        &self,
        module: &str,
        w8: &Raw<'_>,
        scale_inv: &Raw<'_>,
    ) -> Result<(Vec<f32>, String)> {
        let err = |path: &Path, e: String| Error::format(path, Some(module), e);
        let block = self
            .quant_config()
            .get("weight_block_size")
            .and_then(Value::as_array)
            .and_then(|a| Some([a.first()?.as_u64()? as usize, a.get(1)?.as_u64()? as usize]))
            .ok_or_else(|| {
                err(
                    &w8.0,
                    "weight_scale_inv without weight_block_size in quantization_config".into(),
                )
            })?;
        let ue8m0 = self.quant_config().get("scale_fmt").and_then(Value::as_str) == Some("ue8m0");
        let weight = dequant::fp8_block(as_stored(w8), as_stored(scale_inv), block, ue8m0)
            .map_err(|e| err(&w8.0, e))?;
        Ok((
            weight,
            format!("fine-grained fp8 block {}x{}", block[0], block[1]),
        ))
    }

    /// A weight with `weight_scale` (and maybe a zero point): ModelOpt FP8 takes its strategy
    /// from the scale's shape, compressed-tensors from the declaration.
    fn scaled_weight(
        &self,
        module: &str,
        w8: &Raw<'_>,
        scale: &Raw<'_>,
        decl: Option<&WeightDecl>,
        method: &str,
    ) -> Result<(Vec<f32>, String)> {
        let zp = self.part(module, "weight_zero_point")?;
        let w = decl.cloned().unwrap_or_default();
        let args = if method == "modelopt" {
            // ModelOpt FP8: per-tensor (FP8) or per-channel scales, by shape.
            CtArgs {
                strategy: if scale.2.iter().product::<usize>() == 1 {
                    CtStrategy::Tensor
                } else {
                    CtStrategy::Channel
                },
                group_size: None,
                block: None,
            }
        } else {
            ct_args(&w)
        };
        let weight = dequant::ct_dense(
            as_stored(w8),
            as_stored(scale),
            zp.as_ref().map(as_stored),
            &args,
        )
        .map_err(|e| Error::format(&w8.0, Some(module), e))?;
        let scheme = format!(
            "{} {} {}",
            if method == "modelopt" {
                "modelopt"
            } else {
                "compressed-tensors"
            },
            w8.1.name().to_lowercase(),
            w.strategy.unwrap_or_else(|| "tensor".into())
        );
        Ok((weight, scheme))
    }

    /// The dequantized weight must fill `[out, in]` and the bias must match `out`, else the
    /// checkpoint's tensors disagree about the module's shape.
    fn check_linear_sizes(
        &self,
        module: &str,
        values: usize,
        out: usize,
        inp: usize,
        bias: Option<&[f32]>,
    ) -> Result<()> {
        if values != out * inp {
            return Err(Error::format(
                &self.dir,
                Some(module),
                format!("dequantized {values} values for a [{out}, {inp}] weight"),
            ));
        }
        if let Some(b) = bias
            && b.len() != out
        {
            return Err(Error::format(
                &self.dir,
                Some(&format!("{module}.bias")),
                format!("has {} values for {out} outputs", b.len()),
            ));
        }
        Ok(())
    }
}

impl WeightStore for SafetensorsStore {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn has(&self, name: &str) -> bool {
        self.checkpoint.tensor(name).is_some()
    }

    fn unread(&self) -> Vec<String> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        self.checkpoint
            .files
            .iter()
            .flat_map(|f| f.tensors.iter().map(|t| &t.name))
            .filter(|name| !read.contains(*name) && !ignorable(name))
            .cloned()
            .collect()
    }

    fn dense(&self, name: &str) -> Result<Dense> {
        let (path, dtype, shape, bytes) = self.stored(name)?.ok_or_else(|| {
            Error::format(&self.dir, Some(name), "tensor missing from the checkpoint")
        })?;
        if !dtype.is_high_precision_float() {
            return Err(Error::unsupported(
                &path,
                Some(name),
                format!(
                    "stored as {}; the native runner expects this tensor in F32, F16 or BF16",
                    dtype.name()
                ),
            ));
        }
        let data = dequant::to_f32(Stored {
            dtype,
            shape: &shape,
            bytes,
        })
        .map_err(|e| Error::format(&path, Some(name), e))?;
        Ok(Dense { shape, data })
    }

    fn linear(&self, module: &str) -> Result<Linear> {
        let expectation = self
            .declared
            .as_ref()
            .map_or(Expectation::Silent, |d| d.expectation(module));
        let decl = match &expectation {
            Expectation::Quantized(w) => Some(w.clone()),
            _ => None,
        };
        let bias = if self.has(&format!("{module}.bias")) {
            Some(self.dense(&format!("{module}.bias"))?.data)
        } else {
            None
        };
        let method = self.quant_method().unwrap_or_default().to_owned();
        let Dequantized {
            weight,
            out,
            inp,
            scheme,
        } = self.dequantize_linear(module, decl.as_ref(), &method)?;
        self.check_linear_sizes(module, weight.len(), out, inp, bias.as_deref())?;
        let input = match &decl {
            Some(w) => self.input_quant(module, w.activations.as_deref())?,
            None if method == "modelopt" && !matches!(expectation, Expectation::Excluded) => {
                self.input_quant(module, None)?
            }
            None => InputQuant::None,
        };
        Ok(Linear {
            out,
            inp,
            weight: weight.into(),
            bias,
            input,
            scheme,
            block_mins: None,
            packed: None,
        })
    }

    fn kv_cache(&self, attention: &str) -> Result<Option<KvQuant>> {
        let declared = self.declared.as_ref().and_then(|d| d.kv_cache.clone());
        let Some(kv) = declared else {
            return Ok(None);
        };
        let fp8 = kv.contains("float") && kv.contains('8') || kv.eq_ignore_ascii_case("fp8");
        if !fp8 {
            return Err(Error::unsupported(
                &self.dir.join("config.json"),
                Some("kv_cache_scheme"),
                format!(
                    "KV-cache quantization `{kv}` cannot be emulated by the native runner (supported: fp8 per tensor)"
                ),
            ));
        }
        // vLLM's default when a checkpoint declares an FP8 cache without scales is 1.0.
        let k = self.scalar(&format!("{attention}.k_scale"))?.unwrap_or(1.0);
        let v = self.scalar(&format!("{attention}.v_scale"))?.unwrap_or(1.0);
        Ok(Some(KvQuant::Fp8(KvFp8 {
            k_scale: k,
            v_scale: v,
        })))
    }

    fn tensor_sha256(&self, name: &str) -> Result<Option<String>> {
        use sha2::{Digest, Sha256};
        let module = name.strip_suffix(".weight").unwrap_or(name);
        for candidate in [
            name.to_owned(),
            format!("{module}.weight_packed"),
            format!("{module}.qweight"),
        ] {
            if let Some((_, _, _, bytes)) = self.stored(&candidate)? {
                return Ok(Some(crate::digest::hex(&Sha256::digest(bytes))));
            }
        }
        Ok(None)
    }

    fn stored_dtype(&self, name: &str) -> String {
        self.find(name).map_or("unknown".into(), |(_, info)| {
            info.dtype.name().to_lowercase()
        })
    }
}

/// A linear module's weight as dequantized, before its bias and input quantization are added.
struct Dequantized {
    weight: Vec<f32>,
    out: usize,
    inp: usize,
    scheme: String,
}

/// A stored tensor as the dequantizers read it.
fn as_stored<'a>(x: &'a Raw<'_>) -> Stored<'a> {
    Stored {
        dtype: x.1,
        shape: &x.2,
        bytes: x.3,
    }
}

fn ct_args(w: &quant_config::WeightDecl) -> CtArgs {
    let strategy = match w.strategy.as_deref() {
        Some("channel") => CtStrategy::Channel,
        Some("group") => CtStrategy::Group,
        Some("block") => CtStrategy::Block,
        Some("tensor_group") => CtStrategy::TensorGroup,
        _ => CtStrategy::Tensor,
    };
    CtArgs {
        strategy,
        group_size: w.group_size.map(|g| g as usize),
        block: w.block.map(|[a, b]| [a as usize, b as usize]),
    }
}

/// Weights held in memory by Hugging Face name (synthetic models for benchmarks and tests).
pub struct MemoryStore {
    pub name: PathBuf,
    pub tensors: BTreeMap<String, Dense>,
}

impl WeightStore for MemoryStore {
    fn path(&self) -> &Path {
        &self.name
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn dense(&self, name: &str) -> Result<Dense> {
        self.tensors
            .get(name)
            .cloned()
            .ok_or_else(|| Error::format(&self.name, Some(name), "tensor missing"))
    }

    fn linear(&self, module: &str) -> Result<Linear> {
        let w = self.dense(&format!("{module}.weight"))?;
        let [out, inp] = w.shape[..] else {
            return Err(Error::format(&self.name, Some(module), "weight is not 2-D"));
        };
        Ok(Linear {
            out,
            inp,
            weight: w.data.into(),
            bias: self
                .tensors
                .get(&format!("{module}.bias"))
                .map(|b| b.data.clone()),
            input: InputQuant::None,
            scheme: "f32".into(),
            block_mins: None,
            packed: None,
        })
    }

    fn kv_cache(&self, _attention: &str) -> Result<Option<KvQuant>> {
        Ok(None)
    }

    fn tensor_sha256(&self, _name: &str) -> Result<Option<String>> {
        Ok(None)
    }

    fn stored_dtype(&self, _name: &str) -> String {
        "f32".into()
    }
}

/// A random model of the given shape (deterministic in `seed`), for benchmarks.
pub fn synthetic(config: &super::config::ModelConfig, seed: u64) -> MemoryStore {
    let mut t = SyntheticTensors {
        rng: crate::kld::stats::SplitMix64::new(seed),
        tensors: BTreeMap::new(),
    };
    let c = config;
    let s = 1.0 / (c.hidden as f32).sqrt();
    t.add(
        "model.embed_tokens.weight".into(),
        vec![c.vocab, c.hidden],
        1.0,
    );
    t.add("lm_head.weight".into(), vec![c.vocab, c.hidden], s);
    t.add("model.norm.weight".into(), vec![c.hidden], 1.0);
    for i in 0..c.layers {
        let p = format!("model.layers.{i}");
        t.add(format!("{p}.input_layernorm.weight"), vec![c.hidden], 1.0);
        t.add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![c.hidden],
            1.0,
        );
        let linear = c
            .hybrid
            .as_ref()
            .filter(|h| h.layer_types[i] == super::config::LayerType::Linear);
        if let Some(h) = linear {
            t.gated_delta_net(c, h, &p);
        } else {
            t.attention(c, &p);
        }
        t.mlp(c, &p);
    }
    let mut tensors = t.tensors;
    for (name, t) in tensors.iter_mut() {
        if name.ends_with(".linear_attn.A_log") {
            t.data.iter_mut().for_each(|x| *x -= 2.0);
        }
    }
    MemoryStore {
        name: PathBuf::from("synthetic"),
        tensors,
    }
}

/// The random model's tensors as they are drawn: one generator, so the tensors must be added
/// in the same order every time for the same seed to give the same model.
struct SyntheticTensors {
    rng: crate::kld::stats::SplitMix64,
    tensors: BTreeMap<String, Dense>,
}

impl SyntheticTensors {
    /// A tensor of uniform values in `[-scale, scale)`, drawn now.
    fn add(&mut self, name: String, shape: Vec<usize>, scale: f32) {
        let n: usize = shape.iter().product();
        let rng = &mut self.rng;
        let data = (0..n)
            .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale)
            .collect();
        self.tensors.insert(name, Dense { shape, data });
    }

    /// A Gated DeltaNet layer, Qwen3.5's separate projections (A_log is moved near -2 once
    /// every tensor is drawn: slow decays, so the state carries context as trained layers'
    /// mostly do).
    fn gated_delta_net(
        &mut self,
        c: &super::config::ModelConfig,
        h: &super::config::Hybrid,
        p: &str,
    ) {
        let s = 1.0 / (c.hidden as f32).sqrt();
        let m = format!("{p}.linear_attn");
        let width = h.value_heads * h.value_dim;
        for (name, shape, scale) in [
            ("in_proj_qkv.weight", vec![h.conv_dim(), c.hidden], s),
            ("in_proj_z.weight", vec![width, c.hidden], s),
            ("in_proj_b.weight", vec![h.value_heads, c.hidden], s),
            ("in_proj_a.weight", vec![h.value_heads, c.hidden], s),
            (
                "out_proj.weight",
                vec![c.hidden, width],
                1.0 / (width as f32).sqrt(),
            ),
            ("conv1d.weight", vec![h.conv_dim(), 1, h.conv_kernel], 0.5),
            ("A_log", vec![h.value_heads], 0.5),
            ("dt_bias", vec![h.value_heads], 0.5),
            ("norm.weight", vec![h.value_dim], 1.0),
        ] {
            self.add(format!("{m}.{name}"), shape, scale);
        }
    }

    /// A full-attention layer: Q, K, V and O projections, their biases where the
    /// architecture has them, and the Q/K norms.
    fn attention(&mut self, c: &super::config::ModelConfig, p: &str) {
        let s = 1.0 / (c.hidden as f32).sqrt();
        let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        // The hybrid family's q_proj carries a per-head output gate beside the query.
        let q_rows = if c.arch.is_hybrid() { 2 * q } else { q };
        self.add(
            format!("{p}.self_attn.q_proj.weight"),
            vec![q_rows, c.hidden],
            s,
        );
        self.add(
            format!("{p}.self_attn.k_proj.weight"),
            vec![kv, c.hidden],
            s,
        );
        self.add(
            format!("{p}.self_attn.v_proj.weight"),
            vec![kv, c.hidden],
            s,
        );
        self.add(format!("{p}.self_attn.o_proj.weight"), vec![c.hidden, q], s);
        for (module, out, with) in [
            ("self_attn.q_proj", q_rows, c.biases.qkv),
            ("self_attn.k_proj", kv, c.biases.qkv),
            ("self_attn.v_proj", kv, c.biases.qkv),
            ("self_attn.o_proj", c.hidden, c.biases.o),
        ] {
            if with {
                self.add(format!("{p}.{module}.bias"), vec![out], s);
            }
        }
        if c.arch.has_qk_norm() {
            self.add(
                format!("{p}.self_attn.q_norm.weight"),
                vec![c.head_dim],
                1.0,
            );
            self.add(
                format!("{p}.self_attn.k_norm.weight"),
                vec![c.head_dim],
                1.0,
            );
        }
    }

    /// A layer's dense MLP: the biases first (where the architecture has them), then the gate,
    /// up and down projections.
    fn mlp(&mut self, c: &super::config::ModelConfig, p: &str) {
        let s = 1.0 / (c.hidden as f32).sqrt();
        for (module, out, with) in [
            ("mlp.gate_proj", c.intermediate, c.biases.mlp),
            ("mlp.up_proj", c.intermediate, c.biases.mlp),
            ("mlp.down_proj", c.hidden, c.biases.mlp),
        ] {
            if with {
                self.add(format!("{p}.{module}.bias"), vec![out], s);
            }
        }
        self.add(
            format!("{p}.mlp.gate_proj.weight"),
            vec![c.intermediate, c.hidden],
            s,
        );
        self.add(
            format!("{p}.mlp.up_proj.weight"),
            vec![c.intermediate, c.hidden],
            s,
        );
        self.add(
            format!("{p}.mlp.down_proj.weight"),
            vec![c.hidden, c.intermediate],
            1.0 / (c.intermediate as f32).sqrt(),
        );
    }
}
