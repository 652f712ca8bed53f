//! GGUF checkpoints for the native runner: our own header parser for metadata and layout, candle's
//! ggml dequantizers for the tensor data, and llama.cpp's tensor names mapped to Hugging Face's.

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;

use super::config::{Arch, ModelConfig};
use super::gguf_family::{self, Family, GgufFamilyConfig, Plan};
use super::llamacpp_cpu::GgmlActivation;
use super::matmul::Values;
use super::packed::{BlockType, PackedRows};
use super::weights::{Dense, InputQuant, KvQuant, Linear, WeightStore};
use crate::checkpoint::gguf::{self, GgmlType, GgufFile, GgufValue};
use crate::checkpoint::mmap::MappedFile;
use crate::error::{Error, Result};

pub struct GgufStore {
    path: PathBuf,
    file: GgufFile,
    map: MappedFile,
    /// The dense architectures' config (`None` for the hybrid / MoE family, whose shape is
    /// [`GgufStore::family_config`]).
    arch: Option<Arch>,
    /// llama.cpp's converter permutes Q and K rows of NORM-RoPE architectures (llama, mistral) so
    /// that its adjacent-pair rotation matches Hugging Face's half-split one; undo it on load.
    unpermute_qk: bool,
    heads: usize,
    kv_heads: usize,
    /// `qwen35`, `qwen35moe`, `qwen3next`, `qwen3moe`: names and transforms of their own.
    family: Option<GgufFamilyConfig>,
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
    /// f16 KV cache, flash attention (llama.cpp's default on the CPU: its tiled kernel widens the
    /// f16 keys and values and computes in f32).
    LlamacppCpu,
    /// The same without flash attention (`-fa off`): the score and value products' inputs, Q and
    /// the softmax weights, are also rounded to f16 (the f16 cache's `vec_dot_type`).
    LlamacppCpuNoFa,
}

impl Emulate {
    /// The command line's name (`--emulate NAME`).
    pub fn flag_name(self) -> &'static str {
        match self {
            Emulate::ReferenceSemantics => "reference",
            Emulate::LlamacppCpu => "llamacpp-cpu",
            Emulate::LlamacppCpuNoFa => "llamacpp-cpu-no-fa",
        }
    }

    /// The numerics a name means: `reference` and `llamacpp-cpu` (the command line's `--emulate`)
    /// or the recorded `reference_semantics` and `llamacpp_cpu`.
    pub fn from_name(name: &str) -> Option<Emulate> {
        match name {
            "reference" | "reference_semantics" => Some(Emulate::ReferenceSemantics),
            "llamacpp-cpu" | "llamacpp_cpu" => Some(Emulate::LlamacppCpu),
            "llamacpp-cpu-no-fa" | "llamacpp_cpu_no_fa" => Some(Emulate::LlamacppCpuNoFa),
            _ => None,
        }
    }

    /// Whether the numerics are llama.cpp's CPU path (with or without flash attention).
    pub fn is_llamacpp(self) -> bool {
        matches!(self, Emulate::LlamacppCpu | Emulate::LlamacppCpuNoFa)
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

/// Whether the native runner dequantizes `ty`: the float types and every ggml block type, by
/// candle's kernels where candle has one ([`candle_type`]) and by our own
/// ([`super::ggml_quants`]) for the rest. The integer types and F64 hold no weights.
pub(crate) fn dequantizable(ty: GgmlType) -> bool {
    candle_type(ty).is_some() || super::ggml_quants::supports(ty)
}

/// The error for a tensor of a type [`dequantizable`] refuses, listing what is supported.
fn not_dequantizable(ty: GgmlType) -> String {
    let names: Vec<&str> = GgmlType::ALL
        .into_iter()
        .filter(|&t| dequantizable(t))
        .map(GgmlType::name)
        .collect();
    format!(
        "ggml type {} cannot be dequantized by the native runner (supported: {})",
        ty.name(),
        names.join(", ")
    )
}

/// Elements dequantized per task (4 MiB of f32): the temporary of a block type's chunk stays in
/// cache while it is copied into place.
const DEQUANT_CHUNK: usize = 1 << 20;

/// A tensor's bytes (llama.cpp's layout, `dims` outermost first) as f32, written once into the
/// result and in parallel: float types converted element by element (exactly what candle's
/// dequantizer does, without its two intermediate copies), block types dequantized a run of
/// whole rows at a time, by candle's own kernels for the types candle has and by
/// [`super::ggml_quants`] for the others. Every size is checked before it sizes a loop or an
/// allocation (rows of whole blocks, no overflow, exactly the bytes the shape needs). The result
/// is the same bits whatever the threads: each element comes from its own block alone.
pub(super) fn dequantize_bytes(
    ty: GgmlType,
    bytes: &[u8],
    dims: &[usize],
) -> std::result::Result<Vec<f32>, String> {
    use rayon::prelude::*;
    if !dequantizable(ty) {
        return Err(not_dequantizable(ty));
    }
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("the element count overflows")?;
    let cols = dims.last().copied().unwrap_or(1).max(1);
    let (block, size) = (
        usize::try_from(ty.block_size()).map_err(|_| "block size overflows")?,
        usize::try_from(ty.type_size()).map_err(|_| "type size overflows")?,
    );
    if block == 0 || size == 0 || !cols.is_multiple_of(block) {
        return Err(format!(
            "rows of {cols} are not whole {} blocks of {block}",
            ty.name()
        ));
    }
    let row_bytes = (cols / block)
        .checked_mul(size)
        .ok_or("the row size overflows")?;
    let want = (n / cols)
        .checked_mul(row_bytes)
        .ok_or("the data size overflows")?;
    if bytes.len() != want {
        return Err(format!(
            "{} bytes for {n} elements of {} ({want} expected)",
            bytes.len(),
            ty.name()
        ));
    }
    let mut out = vec![0f32; n];
    match ty {
        GgmlType::F32 => out
            .par_chunks_mut(DEQUANT_CHUNK)
            .zip(bytes.par_chunks(DEQUANT_CHUNK * 4))
            .for_each(|(o, b)| {
                for (v, x) in o.iter_mut().zip(b.chunks_exact(4)) {
                    *v = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                }
            }),
        GgmlType::F16 | GgmlType::BF16 => {
            let bf16 = ty == GgmlType::BF16;
            out.par_chunks_mut(DEQUANT_CHUNK)
                .zip(bytes.par_chunks(DEQUANT_CHUNK * 2))
                .for_each(|(o, b)| {
                    for (v, x) in o.iter_mut().zip(b.chunks_exact(2)) {
                        let bits = u16::from_le_bytes([x[0], x[1]]);
                        *v = if bf16 {
                            half::bf16::from_bits(bits).to_f32()
                        } else {
                            half::f16::from_bits(bits).to_f32()
                        };
                    }
                });
        }
        _ => {
            let rows = (DEQUANT_CHUNK / cols).max(1);
            let candle = candle_type(ty);
            out.par_chunks_mut(rows * cols)
                .zip(bytes.par_chunks(rows * row_bytes))
                .try_for_each(|(o, b)| match candle {
                    Some(candle) => candle_rows(candle, b, o),
                    None => super::ggml_quants::dequantize(ty, b, o),
                })?;
        }
    }
    Ok(out)
}

/// Whole rows of a block type candle knows, dequantized by candle's kernel into `o`.
fn candle_rows(candle: GgmlDType, b: &[u8], o: &mut [f32]) -> std::result::Result<(), String> {
    let q = candle.from_data(std::borrow::Cow::Borrowed(b));
    match q.dequantize(o.len()).map_err(|e| e.to_string())? {
        candle_core::CpuStorage::F32(v) if v.len() == o.len() => {
            o.copy_from_slice(&v);
            Ok(())
        }
        _ => Err(format!(
            "candle's {candle:?} dequantizer returned another shape"
        )),
    }
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
        let mut store = GgufStore::open_weights(path, emulate)?;
        // The hybrid family: its shape was read with the weights (tensors come back under their
        // Hugging Face names), and the hybrid decoder runs it.
        if let Some(family) = store.family_config() {
            let config = ModelConfig::from_gguf_family(path, family)?;
            return Ok((store, config));
        }
        let file = &store.file;
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
        // A float key of another type is an error naming it, never the default.
        let float = |k: &str| -> Result<Option<f64>> {
            match file.get(&key(k)) {
                None => Ok(None),
                Some(GgufValue::F32(v)) => Ok(Some(f64::from(*v))),
                Some(GgufValue::F64(v)) => Ok(Some(*v)),
                Some(_) => Err(Error::format(
                    path,
                    Some(&key(k)),
                    "must be a floating-point number",
                )),
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
            moe: None,
            arch,
            hidden,
            intermediate: uint("feed_forward_length")?,
            layers: uint("block_count")?,
            heads,
            kv_heads,
            head_dim,
            vocab,
            rms_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            rope_theta: float("rope.freq_base")?.unwrap_or(10_000.0),
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
        config.validate(path, super::config::ConfigKeys::Gguf(&arch_name))?;
        store.arch = Some(arch);
        store.unpermute_qk = matches!(arch, Arch::Llama | Arch::Mistral);
        store.heads = heads;
        store.kv_heads = kv_heads;
        Ok((store, config))
    }

    /// Open a GGUF file for its tensors by Hugging Face name, without building the decoder's
    /// config: the dense architectures (whose Q/K unpermute [`GgufStore::open`] sets up) and the
    /// hybrid / MoE family, whose shape is read here ([`GgufStore::family_config`]) because the
    /// name mapping and the transforms depend on it.
    pub fn open_weights(path: &Path, emulate: Emulate) -> Result<GgufStore> {
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
        let family = match file.architecture().and_then(Family::from_name) {
            Some(_) => Some(gguf_family::read_config(path, &file)?),
            None => None,
        };
        Ok(GgufStore {
            path: path.to_owned(),
            file,
            map,
            arch: None,
            unpermute_qk: false,
            heads: 0,
            kv_heads: 0,
            family,
            emulate,
            read: Default::default(),
        })
    }

    /// The dense architecture [`GgufStore::open`] found (`None` when opened with
    /// [`GgufStore::open_weights`]).
    pub fn arch(&self) -> Option<Arch> {
        self.arch
    }

    /// What a `qwen35` / `qwen35moe` / `qwen3next` / `qwen3moe` file's metadata says about the
    /// model; `None` for other architectures.
    pub fn family_config(&self) -> Option<&GgufFamilyConfig> {
        self.family.as_ref()
    }

    /// `tokenizer.ggml.bos_token_id`, if the file has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.file
            .get("tokenizer.ggml.bos_token_id")
            .and_then(GgufValue::as_u64)
            .and_then(|b| u32::try_from(b).ok())
    }

    /// How a matrix product over a weight of type `ggml` rounds its input in the emulated
    /// engine: ggml's CPU path quantizes it to the type's `vec_dot_type`.
    fn emulated_input(&self, ggml: Option<GgmlType>) -> InputQuant {
        match (
            self.emulate.is_llamacpp(),
            ggml.and_then(GgmlActivation::for_weight),
        ) {
            (true, Some(a)) => InputQuant::Ggml(a),
            _ => InputQuant::None,
        }
    }

    /// A Q4_1/Q5_1 weight's stored block minimums `[out, in / 32]` (each block's f16 `m`, its
    /// bytes 2..4), rows in Hugging Face order, for the Q8_1 sum term; `None` where the tensor is
    /// read through a transform or an expert slice (the term is then left out: the lane's record
    /// names the Q8_1 rounding either way).
    fn block_mins(&self, hf: &str, out: usize, inp: usize) -> Result<Option<Vec<f32>>> {
        let Some(plan) = self.plan(hf) else {
            return Ok(None);
        };
        let [name] = &plan.tensors[..] else {
            return Ok(None);
        };
        let Some(t) = self.file.tensor(name) else {
            return Ok(None);
        };
        if plan.expert.is_some() || !plan.steps.is_empty() {
            return Ok(None);
        }
        let bad = |rule: String| Error::format(&self.path, Some(name), rule);
        let size = t.ty.type_size() as usize;
        if !matches!(t.ty, GgmlType::Q4_1 | GgmlType::Q5_1) || !inp.is_multiple_of(32) {
            return Ok(None);
        }
        let blocks = out
            .checked_mul(inp / 32)
            .ok_or_else(|| bad("block count overflows".into()))?;
        let start = usize::try_from(t.offset).map_err(|_| bad("offset overflows".into()))?;
        let bytes = blocks
            .checked_mul(size)
            .and_then(|len| start.checked_add(len).map(|end| (start, end)))
            .and_then(|(s, e)| self.map.bytes().get(s..e))
            .ok_or_else(|| bad("data lies outside the file".into()))?;
        let mut mins: Vec<f32> = bytes
            .chunks_exact(size)
            .map(|b| half::f16::from_bits(u16::from_le_bytes([b[2], b[3]])).to_f32())
            .collect();
        if let Some(heads) = self.permuted_heads(hf) {
            mins = unpermute_rows(&mins, &[out, inp / 32], heads).map_err(bad)?;
        }
        Ok(Some(mins))
    }

    /// The heads of a Q or K weight whose rows llama.cpp's converter permuted (see
    /// `unpermute_qk`), `None` for every other tensor.
    fn permuted_heads(&self, hf: &str) -> Option<usize> {
        if !self.unpermute_qk {
            return None;
        }
        if hf.ends_with("self_attn.q_proj.weight") {
            Some(self.heads)
        } else if hf.ends_with("self_attn.k_proj.weight") {
            Some(self.kv_heads)
        } else {
            None
        }
    }

    /// How a Hugging Face tensor is found in this file, if it is.
    fn plan(&self, hf: &str) -> Option<Plan> {
        let plan = match &self.family {
            Some(config) => gguf_family::plan(config, hf)?,
            None => Plan {
                tensors: vec![gguf_name(hf)?],
                expert: None,
                steps: Vec::new(),
            },
        };
        plan.tensors
            .iter()
            .all(|t| self.file.tensor(t).is_some())
            .then_some(plan)
    }

    /// The stored tensor a Hugging Face name reads first (its type is the module's).
    fn primary(&self, hf: &str) -> Option<&gguf::GgufTensor> {
        self.plan(hf).and_then(|p| self.file.tensor(&p.tensors[0]))
    }

    /// One stored tensor by its llama.cpp name, dequantized to f32 as stored: no Hugging Face
    /// name mapping, no transform, no Q/K unpermute; `shape` outermost first. (The dequantizer
    /// fixtures read tensors of every ggml type through it.)
    pub fn dequantize_named(&self, name: &str) -> Result<Dense> {
        self.dequantize(name, None)
    }

    /// One llama.cpp tensor dequantized to f32 (HF order: `[out, in]`); with `expert`, only that
    /// expert's rows of a `[n_expert, out, in]` stack are read and dequantized.
    fn dequantize(&self, name: &str, expert: Option<usize>) -> Result<Dense> {
        let t = self
            .file
            .tensor(name)
            .ok_or_else(|| Error::format(&self.path, Some(name), "tensor missing"))?;
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned());
        let bad = |rule: String| Error::format(&self.path, Some(name), rule);
        if !dequantizable(t.ty) {
            return Err(Error::unsupported(
                &self.path,
                Some(name),
                not_dequantizable(t.ty),
            ));
        }
        let start = usize::try_from(t.offset).map_err(|_| bad("offset overflows".into()))?;
        let len = usize::try_from(t.n_bytes).map_err(|_| bad("size overflows".into()))?;
        let mut dims = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| bad("a dimension overflows".into()))?;
        dims.reverse();
        let (start, len) = match expert {
            None => (start, len),
            Some(e) => {
                let [n_expert, rows, cols] = dims[..] else {
                    return Err(bad(format!(
                        "an expert stack must be 3-D [n_expert, out, in], found {dims:?}"
                    )));
                };
                if e >= n_expert || n_expert == 0 || !len.is_multiple_of(n_expert) {
                    return Err(bad(format!(
                        "expert {e} of a stack of {n_expert} ({len} bytes) cannot be sliced"
                    )));
                }
                // Blocks run along the rows, so each expert's rows are whole blocks, contiguous.
                let per = len / n_expert;
                dims = vec![rows, cols];
                let at = e
                    .checked_mul(per)
                    .and_then(|o| start.checked_add(o))
                    .ok_or_else(|| bad("expert offset overflows".into()))?;
                (at, per)
            }
        };
        let bytes = start
            .checked_add(len)
            .and_then(|end| self.map.bytes().get(start..end))
            .ok_or_else(|| bad("data lies outside the file".into()))?;
        let data =
            dequantize_bytes(t.ty, bytes, &dims).map_err(|e| bad(format!("dequantizing: {e}")))?;
        Ok(Dense { shape: dims, data })
    }

    /// An F32 tensor that loading would take as stored (one stored tensor, no expert slice, no
    /// transform, no Q/K row permutation), in place in the map; `None` for anything else.
    fn mapped(&self, hf: &str) -> Result<Option<(Vec<usize>, Values)>> {
        let Some(plan) = self.plan(hf) else {
            return Ok(None);
        };
        let permuted = self.permuted_heads(hf).is_some();
        let [name] = &plan.tensors[..] else {
            return Ok(None);
        };
        let Some(t) = self.file.tensor(name) else {
            return Ok(None);
        };
        if permuted || plan.expert.is_some() || !plan.steps.is_empty() || t.ty != GgmlType::F32 {
            return Ok(None);
        }
        let bad = |rule: &str| Error::format(&self.path, Some(name), rule);
        let mut dims = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| bad("dimension overflows"))?;
        dims.reverse();
        let count = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| bad("element count overflows"))?;
        let start = usize::try_from(t.offset).map_err(|_| bad("offset overflows"))?;
        if u64::try_from(count).ok().and_then(|c| c.checked_mul(4)) != Some(t.n_bytes) {
            return Err(bad("F32 data size disagrees with its shape"));
        }
        let Some(view) = self.map.f32_view(start, count) else {
            // Unaligned or outside the file: the copying path reads (and reports) it.
            return Ok(None);
        };
        self.read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.clone());
        Ok(Some((dims, Values::Mapped(view))))
    }

    fn load(&self, hf: &str) -> Result<Option<Dense>> {
        let Some(plan) = self.plan(hf) else {
            return Ok(None);
        };
        let name = &plan.tensors[0];
        let bad = |rule: String| Error::format(&self.path, Some(name), rule);
        let mut dense = self.dequantize(name, plan.expert)?;
        let second = match plan.tensors.get(1) {
            Some(n) => Some(self.dequantize(n, None)?.data),
            None => None,
        };
        for step in &plan.steps {
            gguf_family::undo(step, &mut dense.shape, &mut dense.data, second.as_deref())
                .map_err(bad)?;
        }
        if let Some(heads) = self.permuted_heads(hf) {
            dense.data = unpermute_rows(&dense.data, &dense.shape, heads).map_err(bad)?;
        }
        Ok(Some(dense))
    }
}

/// The GGUF row of each Hugging Face row of a Q or K weight ([`unpermute_rows`]'s map).
fn permuted_order(rows: usize, heads: usize) -> std::result::Result<Vec<u32>, String> {
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(format!(
            "{rows} rows do not split into {heads} heads of even size"
        ));
    }
    let rows32 = u32::try_from(rows).map_err(|_| format!("{rows} rows overflow"))?;
    let d = rows / heads;
    let half = d / 2;
    let mut order = vec![0u32; rows];
    for h in 0..heads {
        for i in 0..half {
            for s in 0..2 {
                order[h * d + s * half + i] = (h * d + 2 * i + s) as u32;
            }
        }
    }
    debug_assert!(order.iter().all(|&r| r < rows32));
    Ok(order)
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
        self.plan(name).is_some()
    }

    fn unread(&self) -> Vec<String> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        // The family's MTP (`nextn`) blocks follow the decoder layers; llama.cpp keeps them
        // "preserved but unused", and so does the native runner: not reading them is no sign of
        // a checkpoint that is not what its metadata says.
        let mtp = |name: &str| {
            self.family.as_ref().is_some_and(|c| {
                c.mtp_layers > 0
                    && name
                        .strip_prefix("blk.")
                        .and_then(|r| r.split('.').next())
                        .and_then(|n| n.parse::<usize>().ok())
                        .is_some_and(|n| n >= c.layers)
            })
        };
        self.file
            .tensors
            .iter()
            .map(|t| &t.name)
            .filter(|name| !read.contains(*name) && !mtp(name))
            .cloned()
            .collect()
    }

    fn dense(&self, name: &str) -> Result<Dense> {
        self.load(name)?.ok_or_else(|| {
            Error::format(&self.path, Some(name), "tensor missing from the GGUF file")
        })
    }

    fn dense_values(&self, name: &str) -> Result<(Vec<usize>, Values)> {
        match self.mapped(name)? {
            Some(found) => Ok(found),
            None => self.dense(name).map(|d| (d.shape, d.data.into())),
        }
    }

    fn linear(&self, module: &str) -> Result<Linear> {
        let (shape, weight) = self.dense_values(&format!("{module}.weight"))?;
        let [out, inp] = shape[..] else {
            return Err(Error::format(&self.path, Some(module), "weight is not 2-D"));
        };
        let ggml = self.primary(&format!("{module}.weight")).map(|t| t.ty);
        let ty = ggml.map_or("?", GgmlType::name);
        let input = self.emulated_input(ggml);
        let bias = self.load(&format!("{module}.bias"))?.map(|b| b.data);
        let block_mins = match input {
            InputQuant::Ggml(GgmlActivation::Q8_1) => {
                self.block_mins(&format!("{module}.weight"), out, inp)?
            }
            _ => None,
        };
        // The blocks serve a one-row product of the plain f32 path only (an emulated engine's
        // rounded activations take the dequantized matrix).
        let packed = match input {
            InputQuant::None => self.packed_rows(&format!("{module}.weight"))?,
            _ => None,
        };
        Ok(Linear {
            out,
            inp,
            weight,
            bias,
            input,
            scheme: format!("gguf {ty}"),
            block_mins,
            packed,
        })
    }

    fn packed_rows(&self, hf: &str) -> Result<Option<PackedRows>> {
        let Some(plan) = self.plan(hf) else {
            return Ok(None);
        };
        let [name] = &plan.tensors[..] else {
            return Ok(None);
        };
        let Some(t) = self.file.tensor(name) else {
            return Ok(None);
        };
        let ty = match t.ty {
            GgmlType::Q8_0 => BlockType::Q8_0,
            GgmlType::Q4_0 => BlockType::Q4_0,
            _ => return Ok(None),
        };
        if plan.expert.is_some() || !plan.steps.is_empty() {
            return Ok(None);
        }
        let bad = |rule: &str| Error::format(&self.path, Some(name), rule);
        let [cols, rows] = t.dims[..] else {
            return Ok(None);
        };
        let (rows, cols) = (
            usize::try_from(rows).map_err(|_| bad("dimension overflows"))?,
            usize::try_from(cols).map_err(|_| bad("dimension overflows"))?,
        );
        let start = usize::try_from(t.offset).map_err(|_| bad("offset overflows"))?;
        let len = usize::try_from(t.n_bytes).map_err(|_| bad("size overflows"))?;
        let order = match self.permuted_heads(hf) {
            Some(heads) => Some(permuted_order(rows, heads).map_err(|e| bad(&e))?),
            None => None,
        };
        // A range outside the file or sizes that disagree: the dequantizing path reads (and
        // reports) the tensor; no blocks.
        Ok(self
            .map
            .bytes_view(start, len)
            .and_then(|bytes| PackedRows::new(ty, rows, cols, bytes, order)))
    }

    fn kv_cache(&self, _attention: &str) -> Result<Option<KvQuant>> {
        Ok(self.emulate.is_llamacpp().then_some(KvQuant::F16))
    }

    fn f16_attention_products(&self) -> bool {
        self.emulate == Emulate::LlamacppCpuNoFa
    }

    fn tied_head_input(&self, embedding: &str) -> InputQuant {
        self.emulated_input(self.primary(embedding).map(|t| t.ty))
    }

    fn tensor_sha256(&self, name: &str) -> Result<Option<String>> {
        use sha2::{Digest, Sha256};
        let Some(t) = self.primary(name) else {
            return Ok(None);
        };
        let bytes = usize::try_from(t.offset)
            .ok()
            .zip(usize::try_from(t.n_bytes).ok())
            .and_then(|(a, n)| self.map.bytes().get(a..a.checked_add(n)?))
            .ok_or_else(|| {
                Error::format(&self.path, Some(&t.name), "data lies outside the file")
            })?;
        Ok(Some(crate::digest::hex(&Sha256::digest(bytes))))
    }

    fn stored_dtype(&self, name: &str) -> String {
        self.primary(name)
            .map_or("unknown".into(), |t| t.ty.name().to_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass parallel dequantizer gives candle's bits (its QTensor path, which the
    /// dequantizer fixtures check against gguf-py) for every type, over several chunks.
    #[test]
    fn dequantize_bytes_equals_candles_dequantizer_bit_for_bit() {
        use candle_core::quantized::{QTensor, ggml_file::qtensor_from_ggml};
        use candle_core::{Device, Tensor};
        let (rows, cols) = (2 * DEQUANT_CHUNK / 512 + 3, 512);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i as f32 * 0.618).sin() * 3.0) * (1.0 + (i % 7) as f32))
            .collect();
        let x = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
        for (ty, candle) in [
            (GgmlType::F32, GgmlDType::F32),
            (GgmlType::F16, GgmlDType::F16),
            (GgmlType::BF16, GgmlDType::BF16),
            (GgmlType::Q8_0, GgmlDType::Q8_0),
            (GgmlType::Q4_0, GgmlDType::Q4_0),
            (GgmlType::Q5_1, GgmlDType::Q5_1),
            (GgmlType::Q4_K, GgmlDType::Q4K),
            (GgmlType::Q6_K, GgmlDType::Q6K),
        ] {
            let q = QTensor::quantize(&x, candle).unwrap();
            let bytes = q.data().unwrap().to_vec();
            let want: Vec<u32> = qtensor_from_ggml(candle, &bytes, vec![rows, cols], &Device::Cpu)
                .unwrap()
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let got: Vec<u32> = dequantize_bytes(ty, &bytes, &[rows, cols])
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert!(got == want, "{ty:?}");
        }
        assert!(dequantize_bytes(GgmlType::Q8_0, &[0; 10], &[1, 32]).is_err());
    }

    /// Every ggml weight type dequantizes (candle's kernels or ours), and the refusal of the
    /// others (F64, integers) names every supported type.
    #[test]
    fn every_weight_type_is_dequantizable() {
        for ty in GgmlType::ALL {
            let weight =
                ty.is_quantized() || matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            assert_eq!(dequantizable(ty), weight, "{ty}");
        }
        let e = dequantize_bytes(GgmlType::I32, &[0; 4], &[1]).unwrap_err();
        assert!(e.contains("ggml type i32 cannot be dequantized"), "{e}");
        for ty in GgmlType::ALL.into_iter().filter(|&t| dequantizable(t)) {
            assert!(
                e.contains(&format!(" {},", ty.name())) || e.ends_with(&format!(" {})", ty.name())),
                "{ty}: {e}"
            );
        }
    }

    /// Our block types through the parallel path: several chunks of rows, each element from its
    /// own block, so the result is the one-pass dequantization's bits whatever the thread count.
    #[test]
    fn our_block_types_are_the_same_bits_in_parallel_and_alone() {
        for ty in [
            GgmlType::IQ4_NL,
            GgmlType::IQ2_XS,
            GgmlType::TQ1_0,
            GgmlType::NVFP4,
        ] {
            let (block, size) = (ty.block_size() as usize, ty.type_size() as usize);
            let cols = 4 * block.max(256);
            let rows = DEQUANT_CHUNK / cols * 2 + 3;
            let n_bytes = rows * cols / block * size;
            // Pseudo-random bytes: every code, scale and sign pattern turns up.
            let bytes: Vec<u8> = (0..n_bytes)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(13) as u8)
                .collect();
            let mut alone = vec![0f32; rows * cols];
            super::super::ggml_quants::dequantize(ty, &bytes, &mut alone).unwrap();
            let alone: Vec<u32> = alone.iter().map(|v| v.to_bits()).collect();
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let got = pool
                    .install(|| dequantize_bytes(ty, &bytes, &[rows, cols]))
                    .unwrap();
                let got: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                assert!(got == alone, "{ty} on {threads} threads");
            }
        }
    }

    /// Sizes read from a hostile file: a row that is not whole blocks, an element count or a
    /// data size that overflows, bytes that do not match the shape. Errors, never panics.
    #[test]
    fn hostile_shapes_are_refused() {
        let e = dequantize_bytes(GgmlType::IQ2_XXS, &[0; 66], &[1, 255]).unwrap_err();
        assert!(e.contains("not whole iq2_xxs blocks of 256"), "{e}");
        let e = dequantize_bytes(GgmlType::Q1_0, &[0; 18], &[2, 64]).unwrap_err();
        assert!(e.contains("not whole"), "{e}");
        let e = dequantize_bytes(GgmlType::IQ4_NL, &[0; 18], &[usize::MAX, 32]).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        let e = dequantize_bytes(GgmlType::F32, &[0; 4], &[2, usize::MAX / 2]).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        let e = dequantize_bytes(GgmlType::MXFP4, &[0; 16], &[1, 32]).unwrap_err();
        assert!(
            e.contains("16 bytes for 32 elements of mxfp4 (17 expected)"),
            "{e}"
        );
        let e = dequantize_bytes(GgmlType::TQ2_0, &[0; 67], &[1, 256]).unwrap_err();
        assert!(e.contains("67 bytes"), "{e}");
        assert_eq!(
            dequantize_bytes(GgmlType::IQ1_M, &[], &[0, 256]).unwrap(),
            Vec::<f32>::new()
        );
    }

    #[test]
    fn emulate_names() {
        for (name, e) in [
            ("reference", Emulate::ReferenceSemantics),
            ("reference_semantics", Emulate::ReferenceSemantics),
            ("llamacpp-cpu", Emulate::LlamacppCpu),
            ("llamacpp_cpu", Emulate::LlamacppCpu),
            ("llamacpp-cpu-no-fa", Emulate::LlamacppCpuNoFa),
            ("llamacpp_cpu_no_fa", Emulate::LlamacppCpuNoFa),
        ] {
            assert_eq!(Emulate::from_name(name), Some(e), "{name}");
        }
        assert_eq!(Emulate::from_name("llamacpp"), None);
        for e in [
            Emulate::ReferenceSemantics,
            Emulate::LlamacppCpu,
            Emulate::LlamacppCpuNoFa,
        ] {
            assert_eq!(Emulate::from_name(e.flag_name()), Some(e));
        }
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

    /// tests/fixtures/gguf_family: tiny random HF models converted by llama.cpp's own converter.
    mod family {
        use super::super::*;
        use crate::runner::native::gguf_family::LayerKind;
        use serde_json::Value;
        use sha2::{Digest, Sha256};

        fn fixture(name: &str) -> PathBuf {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/gguf_family")
                .join(name)
        }

        fn manifest(family: &str) -> Value {
            let text = std::fs::read_to_string(fixture(&format!("{family}.hf.json"))).unwrap();
            serde_json::from_str(&text).unwrap()
        }

        fn open(file: &str) -> GgufStore {
            GgufStore::open_weights(&fixture(file), Emulate::ReferenceSemantics).unwrap()
        }

        fn sha(data: &[f32]) -> String {
            let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
            crate::digest::hex(&Sha256::digest(&bytes))
        }

        fn shape(entry: &Value) -> Vec<usize> {
            entry["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect()
        }

        /// Every HF tensor read back from the F32 GGUF equals the HF checkpoint's: bit for bit
        /// (SHA-256 of the f32 values), except `A_log`, which llama.cpp stores as `-exp(A_log)`,
        /// so `ln(-ssm_a)` is within a few ulps. And every GGUF tensor was needed for one.
        fn hf_tensors_come_back_exactly(family: &str) {
            let m = manifest(family);
            let store = open(&format!("{family}.f32.gguf"));
            let tensors = m["tensors"].as_object().unwrap();
            let mut exact = 0;
            for (name, entry) in tensors {
                assert!(store.has(name), "{family}: {name} has no GGUF tensor");
                let got = store.dense(name).unwrap();
                assert_eq!(got.shape, shape(entry), "{family}: {name} shape");
                if name.ends_with(".A_log") {
                    let want: Vec<f64> = entry["values"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_f64().unwrap())
                        .collect();
                    for (g, w) in got.data.iter().zip(&want) {
                        let ulp = f64::from(f32::EPSILON) * w.abs().max(f64::MIN_POSITIVE);
                        assert!(
                            (f64::from(*g) - w).abs() <= 4.0 * ulp,
                            "{family}: {name}: {g} against A_log {w}"
                        );
                    }
                } else {
                    assert_eq!(
                        sha(&got.data),
                        entry["sha256"].as_str().unwrap(),
                        "{family}: {name} differs from the HF tensor"
                    );
                    exact += 1;
                }
            }
            assert!(exact > 20, "{family}: only {exact} tensors compared");
            assert_eq!(
                store.unread(),
                Vec::<String>::new(),
                "{family}: GGUF tensors no HF tensor reads"
            );
        }

        /// An F32 file's tensors that need no rearranging are read in place from the map (no
        /// copy), with the same values the copying path gives, and reading them counts as read.
        #[test]
        fn f32_tensors_are_read_in_place_with_the_copying_paths_values() {
            for family in ["qwen35", "qwen3moe"] {
                let m = manifest(family);
                let store = open(&format!("{family}.f32.gguf"));
                let copied = open(&format!("{family}.f32.gguf"));
                let mut mapped = 0;
                for name in m["tensors"].as_object().unwrap().keys() {
                    let (shape, values) = store.dense_values(name).unwrap();
                    let want = copied.dense(name).unwrap();
                    assert_eq!(shape, want.shape, "{family}: {name}");
                    let same = values.len() == want.data.len()
                        && values
                            .iter()
                            .zip(&want.data)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{family}: {name} read in place differs from its copy");
                    if matches!(values, crate::runner::native::matmul::Values::Mapped(_)) {
                        mapped += 1;
                    }
                }
                assert!(mapped > 10, "{family}: only {mapped} tensors read in place");
                assert_eq!(store.unread(), Vec::<String>::new(), "{family}");
            }
        }

        #[test]
        fn qwen35_gguf_gives_back_the_hf_tensors() {
            hf_tensors_come_back_exactly("qwen35");
        }

        #[test]
        fn qwen35moe_gguf_gives_back_the_hf_tensors() {
            hf_tensors_come_back_exactly("qwen35moe");
        }

        #[test]
        fn qwen3next_gguf_gives_back_the_hf_tensors() {
            hf_tensors_come_back_exactly("qwen3next");
        }

        #[test]
        fn qwen3moe_gguf_gives_back_the_hf_tensors() {
            hf_tensors_come_back_exactly("qwen3moe");
        }

        #[test]
        fn vlm_text_names_read_the_same_tensors() {
            let store = open("qwen35.f32.gguf");
            for name in [
                "model.layers.0.linear_attn.in_proj_qkv.weight",
                "model.layers.1.self_attn.q_norm.weight",
                "model.norm.weight",
            ] {
                let vlm = name.replacen("model.", "model.language_model.", 1);
                assert_eq!(
                    store.dense(&vlm).unwrap().data,
                    store.dense(name).unwrap().data,
                    "{vlm}"
                );
            }
            assert!(!store.has("model.visual.blocks.0.attn.qkv.weight"));
            assert!(!store.has("mtp.layers.0.self_attn.q_proj.weight"));
            assert!(!store.has("model.layers.2.input_layernorm.weight"));
        }

        /// The Q8_0 file gives the same tensors within Q8_0's rounding (half a step of
        /// `amax/127` per block; a full step of the row's amax allowed), and its F32 tensors
        /// (norms, router, GDN parameters) bit for bit. One expert at a time is sliced out of
        /// the quantized stacks.
        #[test]
        fn qwen35moe_q8_0_gives_back_the_hf_tensors_within_quantization() {
            let m = manifest("qwen35moe");
            let f32s = open("qwen35moe.f32.gguf");
            let q8 = open("qwen35moe.q8_0.gguf");
            let mut quantized = 0;
            for name in m["tensors"].as_object().unwrap().keys() {
                let want = f32s.dense(name).unwrap();
                let got = q8.dense(name).unwrap();
                assert_eq!(got.shape, want.shape, "{name}");
                if q8.stored_dtype(name) == "q8_0" {
                    quantized += 1;
                    let cols = *want.shape.last().unwrap();
                    for (g, w) in got.data.chunks(cols).zip(want.data.chunks(cols)) {
                        let step = w.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                        for (a, b) in g.iter().zip(w) {
                            assert!((a - b).abs() <= step, "{name}: {a} against {b}");
                        }
                    }
                    assert_ne!(got.data, want.data, "{name}: Q8_0 left every value exact");
                } else {
                    assert_eq!(got.data, want.data, "{name}");
                }
            }
            assert!(quantized >= 20, "only {quantized} Q8_0 tensors");
            assert_eq!(q8.unread(), Vec::<String>::new());
        }

        /// `family_config` against the HF config the GGUF was converted from.
        #[test]
        fn family_config_matches_the_hf_config() {
            for family in ["qwen35", "qwen35moe", "qwen3next", "qwen3moe"] {
                let m = manifest(family);
                let hf = &m["config"];
                let u = |k: &str| {
                    hf[k]
                        .as_u64()
                        .unwrap_or_else(|| panic!("{family}: config.json has no {k}"))
                        as usize
                };
                let store = open(&format!("{family}.f32.gguf"));
                let c = store.family_config().unwrap();
                assert_eq!(c.family.as_str(), family);
                assert_eq!(c.family.hf_model_type(), m["model_type"].as_str().unwrap());
                assert_eq!(c.hidden, u("hidden_size"), "{family}");
                assert_eq!(c.layers, u("num_hidden_layers"), "{family}");
                assert_eq!(c.heads, u("num_attention_heads"), "{family}");
                assert_eq!(c.kv_heads, u("num_key_value_heads"), "{family}");
                assert_eq!(c.head_dim, u("head_dim"), "{family}");
                assert_eq!(c.vocab, u("vocab_size"), "{family}");
                assert_eq!(
                    c.tie_embeddings,
                    hf["tie_word_embeddings"].as_bool().unwrap()
                );
                assert_eq!(
                    c.rms_eps as f32,
                    hf["rms_norm_eps"].as_f64().unwrap() as f32
                );
                assert_eq!(c.max_positions, Some(u("max_position_embeddings")));
                assert_eq!(c.mtp_layers, 0);
                let partial = hf["rope_parameters"]["partial_rotary_factor"]
                    .as_f64()
                    .unwrap_or(1.0);
                assert_eq!(c.partial_rotary_factor(), partial, "{family}");
                if let Some(types) = hf["layer_types"].as_array().filter(|_| c.family.hybrid()) {
                    let want: Vec<LayerKind> = types
                        .iter()
                        .map(|t| match t.as_str().unwrap() {
                            "linear_attention" => LayerKind::LinearAttention,
                            _ => LayerKind::FullAttention,
                        })
                        .collect();
                    assert_eq!(c.layer_types, want, "{family}");
                    let l = c.linear.unwrap();
                    assert_eq!(l.conv_kernel, u("linear_conv_kernel_dim"));
                    assert_eq!(l.key_heads, u("linear_num_key_heads"));
                    assert_eq!(l.key_head_dim, u("linear_key_head_dim"));
                    assert_eq!(l.value_heads, u("linear_num_value_heads"));
                    assert_eq!(l.value_head_dim, u("linear_value_head_dim"));
                } else {
                    assert!(c.linear.is_none(), "{family}");
                    assert!(c.layer_types.iter().all(|t| *t == LayerKind::FullAttention));
                }
                match &c.moe {
                    Some(moe) => {
                        let experts = if hf["num_experts"].is_u64() {
                            u("num_experts")
                        } else {
                            u("num_local_experts")
                        };
                        assert_eq!(moe.experts, experts, "{family}");
                        assert_eq!(moe.experts_used, u("num_experts_per_tok"));
                        assert_eq!(moe.expert_intermediate, u("moe_intermediate_size"));
                        assert_eq!(
                            moe.shared_expert_intermediate,
                            hf.get("shared_expert_intermediate_size")
                                .and_then(Value::as_u64)
                                .map(|n| n as usize)
                        );
                        assert_eq!(moe.sparse_layers, vec![true; c.layers], "{family}");
                    }
                    None => {
                        assert_eq!(family, "qwen35");
                        assert_eq!(c.intermediate, Some(u("intermediate_size")));
                    }
                }
            }
        }

        /// A file with an MTP block after the decoder layers (as llama.cpp's converter writes
        /// one without `--no-mtp`): the block is not a decoder layer, loading need not read it,
        /// and inspect reports it in the `mtp` bucket.
        #[test]
        fn an_mtp_block_is_neither_a_layer_nor_an_unread_tensor() {
            let path = fixture("qwen35.f32.gguf");
            let file = gguf::read_file(&path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let mut metadata: Vec<(String, GgufValue)> = file
                .metadata
                .iter()
                .filter(|(k, _)| k != "GGUF.version")
                .cloned()
                .collect();
            for (k, v) in &mut metadata {
                match k.as_str() {
                    "qwen35.block_count" => *v = GgufValue::U32(3),
                    "qwen35.attention.recurrent_layers" => {
                        *v = GgufValue::Array(gguf::GgufArray {
                            elem_type: 7,
                            values: vec![
                                GgufValue::Bool(true),
                                GgufValue::Bool(false),
                                GgufValue::Bool(false),
                            ],
                        })
                    }
                    _ => {}
                }
            }
            metadata.push(("qwen35.nextn_predict_layers".into(), GgufValue::U32(1)));
            let data = |t: &gguf::GgufTensor| {
                bytes[t.offset as usize..(t.offset + t.n_bytes) as usize].to_vec()
            };
            let mut tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = file
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.ty, t.dims.clone(), data(t)))
                .collect();
            // The MTP block: a copy of layer 1's attention and its own projection.
            for n in ["attn_q.weight", "attn_norm.weight"] {
                let t = file.tensor(&format!("blk.1.{n}")).unwrap();
                tensors.push((format!("blk.2.{n}"), t.ty, t.dims.clone(), data(t)));
            }
            let eh = file.tensor("blk.1.attn_output.weight").unwrap();
            tensors.push((
                "blk.2.nextn.eh_proj.weight".into(),
                eh.ty,
                eh.dims.clone(),
                data(eh),
            ));
            let md: Vec<(&str, GgufValue)> = metadata
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect();
            let ts: Vec<(&str, GgmlType, &[u64], &[u8])> = tensors
                .iter()
                .map(|(n, ty, d, b)| (n.as_str(), *ty, d.as_slice(), b.as_slice()))
                .collect();
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("with-mtp.gguf");
            std::fs::write(&out, gguf::serialize(&md, &ts, file.alignment)).unwrap();

            let store = GgufStore::open_weights(&out, Emulate::ReferenceSemantics).unwrap();
            let c = store.family_config().unwrap();
            assert_eq!((c.layers, c.mtp_layers), (2, 1));
            assert_eq!(c.layer_types.len(), 2);
            assert!(!store.has("model.layers.2.self_attn.q_proj.weight"));
            let m = manifest("qwen35");
            for name in m["tensors"].as_object().unwrap().keys() {
                store.dense(name).unwrap();
            }
            assert_eq!(store.unread(), Vec::<String>::new());

            let inspection = crate::checkpoint::inspect::inspect_path(&out).unwrap();
            let bucket = |name: &str| {
                inspection[0]
                    .modules
                    .iter()
                    .find(|m| m.name == name)
                    .unwrap_or_else(|| panic!("no module {name}"))
                    .bucket
                    .as_str()
            };
            assert_eq!(bucket("blk.2.attn_q"), "mtp");
            assert_eq!(bucket("blk.2.nextn.eh_proj"), "mtp");
            assert_eq!(bucket("blk.1.attn_q"), "attention");
            assert_eq!(bucket("blk.0.attn_qkv"), "linear_attention");
        }

        /// A hostile header gets one error naming the key, never a panic.
        #[test]
        fn family_config_refuses_inconsistent_metadata() {
            let path = fixture("qwen35.f32.gguf");
            let file = gguf::read_file(&path).unwrap();
            let with = |key: &str, value: GgufValue| {
                let mut f = file.clone();
                f.metadata.retain(|(k, _)| k != key);
                f.metadata.push((key.to_owned(), value));
                gguf_family::read_config(&path, &f).unwrap_err().to_string()
            };
            let e = with("qwen35.ssm.group_count", GgufValue::U32(3));
            assert!(
                e.contains("qwen35.ssm.group_count") && e.contains("do not divide"),
                "{e}"
            );
            let e = with("qwen35.ssm.inner_size", GgufValue::U32(30));
            assert!(e.contains("qwen35.ssm.inner_size"), "{e}");
            let e = with("qwen35.rope.dimension_count", GgufValue::U32(17));
            assert!(e.contains("qwen35.rope.dimension_count"), "{e}");
            let e = with(
                "qwen35.attention.recurrent_layers",
                GgufValue::Array(gguf::GgufArray {
                    elem_type: 7,
                    values: vec![GgufValue::Bool(true)],
                }),
            );
            assert!(e.contains("1 entries for 2 blocks"), "{e}");
            let e = with("qwen35.nextn_predict_layers", GgufValue::U32(2));
            assert!(
                e.contains("qwen35.nextn_predict_layers") && e.contains("no decoder layer"),
                "{e}"
            );
            let e = with("qwen35.attention.head_count_kv", GgufValue::U32(0));
            assert!(e.contains("qwen35.attention.head_count_kv"), "{e}");
        }

        /// A stored `ssm_a` that is not negative is no `-exp(A_log)`: an error naming the tensor.
        #[test]
        fn positive_ssm_a_is_refused_with_the_tensor_name() {
            let path = fixture("qwen35.f32.gguf");
            let bytes = std::fs::read(&path).unwrap();
            let file = gguf::read_file(&path).unwrap();
            let t = file.tensor("blk.0.ssm_a").unwrap();
            let mut hostile = bytes.clone();
            let at = t.offset as usize;
            hostile[at..at + 4].copy_from_slice(&1.0f32.to_le_bytes());
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("hostile.gguf");
            std::fs::write(&p, hostile).unwrap();
            let store = GgufStore::open_weights(&p, Emulate::ReferenceSemantics).unwrap();
            let e = store
                .dense("model.layers.0.linear_attn.A_log")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("blk.0.ssm_a") && e.contains("must be < 0"),
                "{e}"
            );
        }
    }
}
