//! The Qwen3.5 / Qwen3.6, Qwen3-Next and Qwen3-MoE family in GGUF (`qwen35`, `qwen35moe`,
//! `qwen3next`, `qwen3moe`): what the metadata says about the model's shape, and how each Hugging
//! Face tensor the native runner asks for is found among llama.cpp's tensors with the converter's
//! transforms undone.
//!
//! The transforms are those of llama.cpp's `convert_hf_to_gguf.py` (`conversion/qwen.py`:
//! `Qwen3NextModel`, `_LinearAttentionVReorderBase`, `Qwen2MoeModel`), read from the source
//! vendored in llama-cpp-python 0.3.36 (llama.cpp 0c1e570):
//! - `A_log` is stored as `ssm_a = -exp(A_log)`; it is given back as `ln(-ssm_a)`, the form the
//!   safetensors path reads (exact to an ulp or two, not bit for bit: `exp` then `ln` rounds);
//! - every `*norm.weight` except the GDN output norm `linear_attn.norm` has `+1` baked in (the
//!   zero-centred `(1 + w)` RMSNorm of the hybrid models; not `qwen3moe`, whose norms are plain);
//! - `conv1d.weight` `[C, 1, K]` is squeezed to `[C, K]`;
//! - `dt_bias` is renamed `dt_proj.bias` (`ssm_dt.bias`);
//! - Qwen3.5 (`qwen35`, `qwen35moe`) reorders the value heads from grouped by key head
//!   (`[k0v0 k0v1 .. k1v0 ..]`) to tiled (`[k0v0 k1v0 .. k0v1 ..]`) when key and value head counts
//!   differ, in the value rows of `in_proj_qkv`, the rows of `in_proj_z`, `in_proj_a`, `in_proj_b`,
//!   `A_log` and `dt_bias`, the value channels of `conv1d` and the columns of `out_proj`;
//! - Qwen3-Next's fused `in_proj_qkvz` (per key head `[q k v z]`) is split into `attn_qkv`
//!   (`[q.. k.. v..]` over all heads) and `attn_gate` (`z`); `in_proj_ba` is kept as `ssm_ba`;
//! - per-expert weights are stacked into `ffn_{gate,up,down}_exps` (`[n_expert, out, in]`), from
//!   which one expert's rows are sliced without dequantizing the rest of the stack.

use std::path::Path;

use crate::checkpoint::gguf::{GgufFile, GgufValue};
use crate::error::{Error, Result};

/// A GGUF architecture of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen35,
    Qwen35Moe,
    Qwen3Next,
    Qwen3Moe,
}

impl Family {
    pub fn from_name(name: &str) -> Option<Family> {
        Some(match name {
            "qwen35" => Family::Qwen35,
            "qwen35moe" => Family::Qwen35Moe,
            "qwen3next" => Family::Qwen3Next,
            "qwen3moe" => Family::Qwen3Moe,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Family::Qwen35 => "qwen35",
            Family::Qwen35Moe => "qwen35moe",
            Family::Qwen3Next => "qwen3next",
            Family::Qwen3Moe => "qwen3moe",
        }
    }

    /// The Hugging Face `model_type` of the text model the converter reads.
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Family::Qwen35 => "qwen3_5_text",
            Family::Qwen35Moe => "qwen3_5_moe_text",
            Family::Qwen3Next => "qwen3_next",
            Family::Qwen3Moe => "qwen3_moe",
        }
    }

    /// Gated DeltaNet layers beside gated full attention, with zero-centred norms.
    pub fn hybrid(self) -> bool {
        self != Family::Qwen3Moe
    }

    pub fn moe(self) -> bool {
        self != Family::Qwen35
    }

    fn reorders_value_heads(self) -> bool {
        matches!(self, Family::Qwen35 | Family::Qwen35Moe)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    LinearAttention,
    FullAttention,
}

/// The Gated DeltaNet dimensions (`{arch}.ssm.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearAttentionShape {
    /// `ssm.conv_kernel` (HF `linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// `ssm.group_count` (HF `linear_num_key_heads`).
    pub key_heads: usize,
    /// `ssm.state_size` (HF `linear_key_head_dim`).
    pub key_head_dim: usize,
    /// `ssm.time_step_rank` (HF `linear_num_value_heads`).
    pub value_heads: usize,
    /// `ssm.inner_size / ssm.time_step_rank` (HF `linear_value_head_dim`).
    pub value_head_dim: usize,
}

/// The mixture-of-experts dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeShape {
    /// `expert_count` (HF `num_experts`).
    pub experts: usize,
    /// `expert_used_count` (HF `num_experts_per_tok`).
    pub experts_used: usize,
    /// `expert_feed_forward_length` (HF `moe_intermediate_size`).
    pub expert_intermediate: usize,
    /// `expert_shared_feed_forward_length` (HF `shared_expert_intermediate_size`), if any.
    pub shared_expert_intermediate: Option<usize>,
    /// `expert_weights_norm` (HF `norm_topk_prob`) when the file states it; llama.cpp's converter
    /// does not write it for this family (its loader assumes normalized top-k weights).
    pub norm_topk_prob: Option<bool>,
    /// Per layer: whether it has a router (`blk.N.ffn_gate_inp.weight`), i.e. is a sparse block.
    pub sparse_layers: Vec<bool>,
}

/// What a family GGUF's metadata (and tensor table, where metadata is silent) says about the
/// model, in Hugging Face terms; a plain record for the native runner's config to take up.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufFamilyConfig {
    pub family: Family,
    pub hidden: usize,
    /// Decoder layers, the MTP (`nextn`) blocks the converter appends not counted.
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// `attention.key_length` (HF `head_dim`).
    pub head_dim: usize,
    /// `feed_forward_length`, absent in the all-MoE files.
    pub intermediate: Option<usize>,
    pub vocab: usize,
    pub rms_eps: f64,
    pub rope_theta: f64,
    /// `rope.dimension_count`: the rotary slice of each head (HF `head_dim · partial_rotary_factor`).
    pub rotary_dims: usize,
    /// `rope.dimension_sections` (MRoPE; for text all sections rotate alike).
    pub rope_sections: Option<Vec<u64>>,
    pub max_positions: Option<usize>,
    pub tie_embeddings: bool,
    /// One entry per decoder layer; all full attention for `qwen3moe`.
    pub layer_types: Vec<LayerKind>,
    /// `full_attention_interval` as written. llama.cpp's converter writes the HF config's value or
    /// 4 when the config has none (transformers does not keep it when `layer_types` is derived),
    /// so `attention.recurrent_layers` is what decides `layer_types` when present.
    pub full_attention_interval: Option<usize>,
    pub linear: Option<LinearAttentionShape>,
    pub moe: Option<MoeShape>,
    /// `nextn_predict_layers`: MTP blocks stored after the decoder layers (never run).
    pub mtp_layers: usize,
}

impl GgufFamilyConfig {
    pub fn partial_rotary_factor(&self) -> f64 {
        self.rotary_dims as f64 / self.head_dim as f64
    }
}

/// Read the family's shape from a GGUF header. Every count is checked against the others so a
/// hostile file gets one error naming the key, never a panic or a nonsense shape later.
pub fn read_config(path: &Path, file: &GgufFile) -> Result<GgufFamilyConfig> {
    let arch = file.architecture().unwrap_or_default();
    let family = Family::from_name(arch).ok_or_else(|| {
        Error::unsupported(
            path,
            Some("general.architecture"),
            format!("`{arch}` is not one of qwen35, qwen35moe, qwen3next, qwen3moe"),
        )
    })?;
    let meta = Meta { path, file, arch };
    let hidden = meta.uint("embedding_length")?;
    let block_count = meta.uint("block_count")?;
    let mtp_layers = meta.opt_uint("nextn_predict_layers")?.unwrap_or(0);
    let layers = block_count
        .checked_sub(mtp_layers)
        .filter(|&l| l > 0)
        .ok_or_else(|| {
            meta.bad(
                "nextn_predict_layers",
                format!("{mtp_layers} MTP layers leave no decoder layer of {block_count} blocks"),
            )
        })?;
    let heads = meta.uint("attention.head_count")?;
    let kv_heads = meta.opt_uint("attention.head_count_kv")?.unwrap_or(heads);
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(meta.bad(
            "attention.head_count_kv",
            format!("{kv_heads} key/value heads do not divide {heads} query heads"),
        ));
    }
    let head_dim = match meta.opt_uint("attention.key_length")? {
        Some(d) if d > 0 => d,
        Some(_) => return Err(meta.bad("attention.key_length", "is 0".into())),
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => return Err(meta.bad("attention.key_length", "missing".into())),
    };
    let rotary_dims = meta.opt_uint("rope.dimension_count")?.unwrap_or(head_dim);
    if rotary_dims == 0 || rotary_dims > head_dim || !rotary_dims.is_multiple_of(2) {
        return Err(meta.bad(
            "rope.dimension_count",
            format!(
                "{rotary_dims} rotary dimensions do not fit a head of {head_dim} (even, 2..={head_dim})"
            ),
        ));
    }
    let rope_sections = meta.rope_sections()?;
    let vocab = meta.vocab(hidden)?;
    let linear = if family.hybrid() {
        Some(meta.linear_shape()?)
    } else {
        None
    };
    let full_attention_interval = meta.opt_uint("full_attention_interval")?;
    let layer_types = if family.hybrid() {
        meta.hybrid_layer_types(layers, block_count, full_attention_interval)?
    } else {
        vec![LayerKind::FullAttention; layers]
    };
    let moe = if family.moe() {
        Some(meta.moe_shape(layers)?)
    } else {
        None
    };
    Ok(GgufFamilyConfig {
        family,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate: meta.opt_uint("feed_forward_length")?.filter(|&n| n > 0),
        vocab,
        rms_eps: meta
            .float("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-6),
        rope_theta: meta.float("rope.freq_base")?.unwrap_or(10_000.0),
        rotary_dims,
        rope_sections,
        max_positions: meta.opt_uint("context_length")?.filter(|&n| n > 0),
        tie_embeddings: file.tensor("output.weight").is_none(),
        layer_types,
        full_attention_interval,
        linear,
        moe,
        mtp_layers,
    })
}

/// The file's `{arch}.*` metadata, read with the checks every count needs, so each part of the
/// shape is read by a method of its own and every error names its full key.
struct Meta<'f> {
    path: &'f Path,
    file: &'f GgufFile,
    arch: &'f str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn get(&self, k: &str) -> Option<&GgufValue> {
        self.file.get(&self.key(k))
    }

    fn bad(&self, k: &str, rule: String) -> Error {
        Error::format(self.path, Some(&self.key(k)), rule)
    }

    fn opt_uint(&self, k: &str) -> Result<Option<usize>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|v| usize::try_from(v).ok())
                .map(Some)
                .ok_or_else(|| self.bad(k, "not a non-negative integer".into())),
        }
    }

    fn uint(&self, k: &str) -> Result<usize> {
        self.opt_uint(k)?
            .filter(|&v| v > 0)
            .ok_or_else(|| self.bad(k, "missing or not a positive integer".into()))
    }

    fn float(&self, k: &str) -> Result<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(GgufValue::F32(v)) if v.is_finite() => Ok(Some(f64::from(*v))),
            Some(GgufValue::F64(v)) if v.is_finite() => Ok(Some(*v)),
            Some(_) => Err(self.bad(k, "not a finite float".into())),
        }
    }

    /// `rope.dimension_sections` (MRoPE), if written.
    fn rope_sections(&self) -> Result<Option<Vec<u64>>> {
        Ok(match self.get("rope.dimension_sections") {
            None => None,
            Some(GgufValue::Array(a)) => Some(
                a.values
                    .iter()
                    .map(GgufValue::as_u64)
                    .collect::<Option<Vec<u64>>>()
                    .ok_or_else(|| {
                        self.bad("rope.dimension_sections", "not an array of integers".into())
                    })?,
            ),
            Some(_) => return Err(self.bad("rope.dimension_sections", "not an array".into())),
        })
    }

    /// The vocabulary, from the shape of `token_embd.weight` (`[hidden, vocab]`).
    fn vocab(&self, hidden: usize) -> Result<usize> {
        let path = self.path;
        let embd = self
            .file
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::format(path, Some("token_embd.weight"), "tensor missing"))?;
        match embd.dims[..] {
            [h, v] if h == hidden as u64 && v > 0 => usize::try_from(v).map_err(|_| {
                Error::format(path, Some("token_embd.weight"), "vocabulary overflows")
            }),
            _ => Err(Error::format(
                path,
                Some("token_embd.weight"),
                format!("shape {:?} is not [{hidden}, vocab]", embd.dims),
            )),
        }
    }

    /// The Gated DeltaNet dimensions of a hybrid family (`ssm.*`).
    fn linear_shape(&self) -> Result<LinearAttentionShape> {
        let value_heads = self.uint("ssm.time_step_rank")?;
        let key_heads = self.uint("ssm.group_count")?;
        let inner = self.uint("ssm.inner_size")?;
        if !value_heads.is_multiple_of(key_heads) {
            return Err(self.bad(
                "ssm.group_count",
                format!(
                    "{key_heads} key heads do not divide {value_heads} value heads (ssm.time_step_rank)"
                ),
            ));
        }
        if !inner.is_multiple_of(value_heads) {
            return Err(self.bad(
                "ssm.inner_size",
                format!("{inner} does not split into {value_heads} value heads"),
            ));
        }
        Ok(LinearAttentionShape {
            conv_kernel: self.uint("ssm.conv_kernel")?,
            key_heads,
            key_head_dim: self.uint("ssm.state_size")?,
            value_heads,
            value_head_dim: inner / value_heads,
        })
    }

    /// A hybrid family's layer kinds: `attention.recurrent_layers` when written (one entry per
    /// block, MTP blocks included), else transformers' rule over `full_attention_interval`.
    fn hybrid_layer_types(
        &self,
        layers: usize,
        block_count: usize,
        full_attention_interval: Option<usize>,
    ) -> Result<Vec<LayerKind>> {
        if let Some(v) = self.get("attention.recurrent_layers") {
            let GgufValue::Array(a) = v else {
                return Err(self.bad("attention.recurrent_layers", "not an array".into()));
            };
            if a.values.len() != block_count {
                return Err(self.bad(
                    "attention.recurrent_layers",
                    format!("{} entries for {block_count} blocks", a.values.len()),
                ));
            }
            let kinds = a
                .values
                .iter()
                .map(|v| match v {
                    GgufValue::Bool(true) => Some(LayerKind::LinearAttention),
                    GgufValue::Bool(false) => Some(LayerKind::FullAttention),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    self.bad(
                        "attention.recurrent_layers",
                        "not an array of booleans".into(),
                    )
                })?;
            return Ok(kinds[..layers].to_vec());
        }
        let interval = full_attention_interval.filter(|&i| i > 0).ok_or_else(|| {
            self.bad(
                "full_attention_interval",
                "missing or 0, and no attention.recurrent_layers".into(),
            )
        })?;
        // transformers' rule: linear unless (i + 1) % interval == 0.
        Ok((0..layers)
            .map(|i| {
                if (i + 1).is_multiple_of(interval) {
                    LayerKind::FullAttention
                } else {
                    LayerKind::LinearAttention
                }
            })
            .collect())
    }

    /// The mixture-of-experts dimensions; a layer is sparse when it has a router tensor.
    fn moe_shape(&self, layers: usize) -> Result<MoeShape> {
        let experts = self.uint("expert_count")?;
        let experts_used = self.uint("expert_used_count")?;
        if experts_used > experts {
            return Err(self.bad(
                "expert_used_count",
                format!("{experts_used} experts per token of {experts}"),
            ));
        }
        let norm_topk_prob = match self.get("expert_weights_norm") {
            None => None,
            Some(GgufValue::Bool(b)) => Some(*b),
            Some(_) => return Err(self.bad("expert_weights_norm", "not a boolean".into())),
        };
        Ok(MoeShape {
            experts,
            experts_used,
            expert_intermediate: self.uint("expert_feed_forward_length")?,
            shared_expert_intermediate: self
                .opt_uint("expert_shared_feed_forward_length")?
                .filter(|&n| n > 0),
            norm_topk_prob,
            sparse_layers: (0..layers)
                .map(|l| {
                    self.file
                        .tensor(&format!("blk.{l}.ffn_gate_inp.weight"))
                        .is_some()
                })
                .collect(),
        })
    }
}

/// One step undoing a converter transform, applied to the dequantized f32 tensor.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    /// `w + 1` was stored.
    MinusOne,
    /// `-exp(A_log)` was stored.
    LogOfNegated,
    /// Rows after the first `skip` are value heads in tiled order; put them back grouped by key
    /// head. A row is `row_len` values (1 for a 1-D tensor).
    UntileRows {
        skip: usize,
        key_heads: usize,
        per_key: usize,
        head_dim: usize,
    },
    /// The same for the columns of a 2-D weight (`out_proj`'s input).
    UntileCols {
        key_heads: usize,
        per_key: usize,
        head_dim: usize,
    },
    /// `[C, K]` back to the HF `[C, 1, K]`.
    Unsqueeze1,
    /// Qwen3-Next: `attn_qkv` (first) and `attn_gate` (second) back into the per-key-head
    /// `[q k v z]` rows of `in_proj_qkvz`.
    JoinQkvz {
        key_heads: usize,
        key_head_dim: usize,
        /// `value_heads / key_heads · value_head_dim`.
        value_per_key: usize,
    },
}

/// How one HF tensor is read: the llama.cpp tensors (the first gives the stored type), the expert
/// to slice out of a stacked tensor, and the steps undoing the converter.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Plan {
    pub tensors: Vec<String>,
    pub expert: Option<usize>,
    pub steps: Vec<Step>,
}

impl Plan {
    fn plain(name: String) -> Plan {
        Plan {
            tensors: vec![name],
            expert: None,
            steps: Vec::new(),
        }
    }
}

/// The plan for a Hugging Face tensor name, or `None` when the family has no such tensor. Names
/// under `model.language_model.` (the Qwen3.5 vision-language layout) are the text model's.
pub(super) fn plan(config: &GgufFamilyConfig, hf: &str) -> Option<Plan> {
    let hf = hf
        .strip_prefix("model.language_model.")
        .map_or_else(|| hf.to_owned(), |rest| format!("model.{rest}"));
    let zc = config.family.hybrid();
    let norm = |name: String| {
        let mut p = Plan::plain(name);
        if zc {
            p.steps.push(Step::MinusOne);
        }
        p
    };
    match hf.as_str() {
        "model.embed_tokens.weight" => return Some(Plan::plain("token_embd.weight".into())),
        "lm_head.weight" => return Some(Plan::plain("output.weight".into())),
        "model.norm.weight" => return Some(norm("output_norm.weight".into())),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok().filter(|&l| l < config.layers)?;
    let blk = |n: &str| format!("blk.{layer}.{n}");
    let (module, suffix) = match rest.rsplit_once('.') {
        Some((m, s)) if s == "weight" || s == "bias" => (m, s),
        // `linear_attn.A_log`, `linear_attn.dt_bias`: parameters without a suffix.
        _ => (rest, ""),
    };
    if let Some(experts) = module.strip_prefix("mlp.experts.") {
        let (e, proj) = experts.split_once('.')?;
        let e: usize = e.parse().ok()?;
        let moe = config.moe.as_ref()?;
        if e >= moe.experts || suffix != "weight" {
            return None;
        }
        let stack = match proj {
            "gate_proj" => "ffn_gate_exps",
            "up_proj" => "ffn_up_exps",
            "down_proj" => "ffn_down_exps",
            _ => return None,
        };
        return Some(Plan {
            tensors: vec![blk(&format!("{stack}.weight"))],
            expert: Some(e),
            steps: Vec::new(),
        });
    }
    let lin = config.linear;
    // The value-head reorder, where the converter applied it.
    let untile = |skip: usize, head_dim: usize| -> Option<Step> {
        let l = lin?;
        (config.family.reorders_value_heads() && l.key_heads != l.value_heads).then_some(
            Step::UntileRows {
                skip,
                key_heads: l.key_heads,
                per_key: l.value_heads / l.key_heads,
                head_dim,
            },
        )
    };
    let with = |name: String, steps: Vec<Option<Step>>| Plan {
        tensors: vec![name],
        expert: None,
        steps: steps.into_iter().flatten().collect(),
    };
    let p = match (module, suffix) {
        ("input_layernorm", "weight") => norm(blk("attn_norm.weight")),
        ("post_attention_layernorm", "weight") if zc => norm(blk("post_attention_norm.weight")),
        ("post_attention_layernorm", "weight") => norm(blk("ffn_norm.weight")),
        ("self_attn.q_norm", "weight") => norm(blk("attn_q_norm.weight")),
        ("self_attn.k_norm", "weight") => norm(blk("attn_k_norm.weight")),
        ("self_attn.q_proj", s) => Plan::plain(blk(&format!("attn_q.{s}"))),
        ("self_attn.k_proj", s) => Plan::plain(blk(&format!("attn_k.{s}"))),
        ("self_attn.v_proj", s) => Plan::plain(blk(&format!("attn_v.{s}"))),
        ("self_attn.o_proj", s) => Plan::plain(blk(&format!("attn_output.{s}"))),
        ("mlp.gate_proj", "weight") => Plan::plain(blk("ffn_gate.weight")),
        ("mlp.up_proj", "weight") => Plan::plain(blk("ffn_up.weight")),
        ("mlp.down_proj", "weight") => Plan::plain(blk("ffn_down.weight")),
        ("mlp.gate", "weight") => Plan::plain(blk("ffn_gate_inp.weight")),
        ("mlp.shared_expert.gate_proj", "weight") => Plan::plain(blk("ffn_gate_shexp.weight")),
        ("mlp.shared_expert.up_proj", "weight") => Plan::plain(blk("ffn_up_shexp.weight")),
        ("mlp.shared_expert.down_proj", "weight") => Plan::plain(blk("ffn_down_shexp.weight")),
        ("mlp.shared_expert_gate", "weight") => Plan::plain(blk("ffn_gate_inp_shexp.weight")),
        (m, s) if m.starts_with("linear_attn.") => {
            let l = lin?;
            let qk = 2 * l.key_heads * l.key_head_dim;
            let dv = l.value_head_dim;
            match (&m["linear_attn.".len()..], s) {
                ("in_proj_qkv", "weight") if config.family != Family::Qwen3Next => {
                    with(blk("attn_qkv.weight"), vec![untile(qk, dv)])
                }
                ("in_proj_z", "weight") if config.family != Family::Qwen3Next => {
                    with(blk("attn_gate.weight"), vec![untile(0, dv)])
                }
                ("in_proj_b", "weight") if config.family != Family::Qwen3Next => {
                    with(blk("ssm_beta.weight"), vec![untile(0, 1)])
                }
                ("in_proj_a", "weight") if config.family != Family::Qwen3Next => {
                    with(blk("ssm_alpha.weight"), vec![untile(0, 1)])
                }
                ("in_proj_qkvz", "weight") if config.family == Family::Qwen3Next => Plan {
                    tensors: vec![blk("attn_qkv.weight"), blk("attn_gate.weight")],
                    expert: None,
                    steps: vec![Step::JoinQkvz {
                        key_heads: l.key_heads,
                        key_head_dim: l.key_head_dim,
                        value_per_key: l.value_heads / l.key_heads * dv,
                    }],
                },
                ("in_proj_ba", "weight") if config.family == Family::Qwen3Next => {
                    Plan::plain(blk("ssm_ba.weight"))
                }
                ("A_log", "") => with(blk("ssm_a"), vec![Some(Step::LogOfNegated), untile(0, 1)]),
                ("dt_bias", "") => with(blk("ssm_dt.bias"), vec![untile(0, 1)]),
                ("conv1d", "weight") => with(
                    blk("ssm_conv1d.weight"),
                    vec![untile(qk, dv), Some(Step::Unsqueeze1)],
                ),
                // The gated output norm: a plain RMSNorm weight, stored as is.
                ("norm", "weight") => Plan::plain(blk("ssm_norm.weight")),
                ("out_proj", "weight") => with(
                    blk("ssm_out.weight"),
                    vec![
                        (config.family.reorders_value_heads() && l.key_heads != l.value_heads)
                            .then_some(Step::UntileCols {
                                key_heads: l.key_heads,
                                per_key: l.value_heads / l.key_heads,
                                head_dim: dv,
                            }),
                    ],
                ),
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(p)
}

/// Grouped index of a value-head element from its tiled position: the converter moved HF element
/// `(k, r, d)` (key head, value head within it, dim) to `(r, k, d)`.
fn tiled_of_grouped(i: usize, key_heads: usize, per_key: usize, head_dim: usize) -> usize {
    let d = i % head_dim;
    let head = i / head_dim;
    let (k, r) = (head / per_key, head % per_key);
    (r * key_heads + k) * head_dim + d
}

/// Apply one step to `(shape, data)`; `second` is the plan's second tensor (`JoinQkvz`).
pub(super) fn undo(
    step: &Step,
    shape: &mut Vec<usize>,
    data: &mut Vec<f32>,
    second: Option<&[f32]>,
) -> std::result::Result<(), String> {
    match *step {
        Step::MinusOne => data.iter_mut().for_each(|w| *w -= 1.0),
        Step::LogOfNegated => {
            // NaN and 0 included: no finite A_log gives them.
            if let Some(bad) = data.iter().find(|a| a.is_nan() || **a >= 0.0) {
                return Err(format!(
                    "ssm_a holds {bad}, which is not -exp(A_log) of any A_log (must be < 0)"
                ));
            }
            data.iter_mut().for_each(|a| *a = (-*a).ln());
        }
        Step::UntileRows {
            skip,
            key_heads,
            per_key,
            head_dim,
        } => {
            let rows = shape.first().copied().unwrap_or(0);
            let n = key_heads * per_key * head_dim;
            if rows == 0 || skip + n != rows || !data.len().is_multiple_of(rows) {
                return Err(format!(
                    "{rows} rows are not {skip} + {key_heads}·{per_key}·{head_dim} value rows"
                ));
            }
            let cols = data.len() / rows;
            let mut out = data.clone();
            for i in 0..n {
                let src = (skip + tiled_of_grouped(i, key_heads, per_key, head_dim)) * cols;
                let dst = (skip + i) * cols;
                out[dst..dst + cols].copy_from_slice(&data[src..src + cols]);
            }
            *data = out;
        }
        Step::UntileCols {
            key_heads,
            per_key,
            head_dim,
        } => {
            let n = key_heads * per_key * head_dim;
            let [rows, cols] = shape[..] else {
                return Err(format!("expected a 2-D weight, found shape {shape:?}"));
            };
            if cols != n {
                return Err(format!(
                    "{cols} columns are not {key_heads}·{per_key}·{head_dim} value columns"
                ));
            }
            let mut out = data.clone();
            for r in 0..rows {
                for i in 0..n {
                    out[r * cols + i] =
                        data[r * cols + tiled_of_grouped(i, key_heads, per_key, head_dim)];
                }
            }
            *data = out;
        }
        Step::Unsqueeze1 => {
            let [c, k] = shape[..] else {
                return Err(format!(
                    "expected a squeezed [channels, kernel] conv, found {shape:?}"
                ));
            };
            *shape = vec![c, 1, k];
        }
        Step::JoinQkvz {
            key_heads,
            key_head_dim,
            value_per_key,
        } => {
            let second = second.ok_or("attn_gate is missing")?;
            let (qk, v) = (key_heads * key_head_dim, key_heads * value_per_key);
            let [rows, cols] = shape[..] else {
                return Err(format!("expected a 2-D attn_qkv, found shape {shape:?}"));
            };
            if rows != 2 * qk + v || second.len() != v * cols {
                return Err(format!(
                    "attn_qkv has {rows} rows and attn_gate {} values; expected {} rows and {} values",
                    second.len(),
                    2 * qk + v,
                    v * cols
                ));
            }
            let per_head = 2 * key_head_dim + 2 * value_per_key;
            let mut out = Vec::with_capacity(key_heads * per_head * cols);
            let rows_of =
                |src: &[f32], from: usize, n: usize| src[from * cols..(from + n) * cols].to_vec();
            for h in 0..key_heads {
                out.extend(rows_of(data, h * key_head_dim, key_head_dim));
                out.extend(rows_of(data, qk + h * key_head_dim, key_head_dim));
                out.extend(rows_of(data, 2 * qk + h * value_per_key, value_per_key));
                out.extend(rows_of(second, h * value_per_key, value_per_key));
            }
            *data = out;
            *shape = vec![key_heads * per_head, cols];
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untile_inverts_the_converters_value_head_reorder() {
        // Two key heads, two value heads each, head dim 1: HF grouped [k0v0 k0v1 k1v0 k1v1] was
        // stored tiled [k0v0 k1v0 k0v1 k1v1].
        let mut shape = vec![4];
        let mut data = vec![0.0, 2.0, 1.0, 3.0];
        let step = Step::UntileRows {
            skip: 0,
            key_heads: 2,
            per_key: 2,
            head_dim: 1,
        };
        undo(&step, &mut shape, &mut data, None).unwrap();
        assert_eq!(data, vec![0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn a_log_that_is_not_negative_is_refused() {
        let mut shape = vec![2];
        let mut data = vec![-1.0, 0.5];
        let err = undo(&Step::LogOfNegated, &mut shape, &mut data, None).unwrap_err();
        assert!(err.contains("must be < 0"), "{err}");
    }
}
