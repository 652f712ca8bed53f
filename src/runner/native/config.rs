//! The decoder's shape, from `config.json` or GGUF metadata, validated before any weight loads.

use std::path::Path;

use serde_json::Value;

use super::moe::{MoeConfig, MoeFamily};
use crate::error::{Error, Result};

/// Architectures the native runner implements (HF `model_type` spellings).
pub const SUPPORTED: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "qwen3_next",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen3's attention with sparse mixture-of-experts feed-forward layers ([`super::moe`]).
    Qwen3Moe,
    /// Qwen3.5 / Qwen3.6 text model: Gated DeltaNet layers and gated full attention.
    Qwen3_5Text,
    /// The Qwen3.5 vision-language wrapper: its `text_config` is a `qwen3_5_text`, its text
    /// weights sit under `model.language_model.*`.
    Qwen3_5,
    /// Qwen3.5-MoE text model (`qwen3_5_moe_text`): the hybrid layers of Qwen3.5 with a sparse
    /// mixture-of-experts block (shared expert, always renormalised) in every layer.
    Qwen3_5MoeText,
    /// The Qwen3.5-MoE vision-language wrapper (`qwen3_5_moe`), laid out like [`Arch::Qwen3_5`].
    Qwen3_5Moe,
    /// Qwen3-Next: the hybrid layers of Qwen3.5 with fused `in_proj_qkvz` / `in_proj_ba`, and
    /// sparse mixture-of-experts blocks where `num_experts`, `decoder_sparse_step` and
    /// `mlp_only_layers` put them.
    Qwen3Next,
}

/// Largest size a hybrid config key may give (a hostile config must not size allocations).
pub const MAX_HYBRID_DIM: usize = 1 << 20;

/// The token mixer of one layer of a hybrid model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Gated DeltaNet (`linear_attention`).
    Linear,
    /// Gated softmax attention (`full_attention`).
    Full,
}

/// The Gated DeltaNet shape of a hybrid model (Qwen3.5 / Qwen3-Next).
#[derive(Debug, Clone, PartialEq)]
pub struct Hybrid {
    /// One entry per layer.
    pub layer_types: Vec<LayerType>,
    /// `linear_conv_kernel_dim`: the depthwise causal convolution's width.
    pub conv_kernel: usize,
    /// `linear_num_key_heads`, `linear_num_value_heads`.
    pub key_heads: usize,
    pub value_heads: usize,
    /// `linear_key_head_dim`, `linear_value_head_dim`.
    pub key_dim: usize,
    pub value_dim: usize,
    /// Qwen3-Next's fused, per-key-head interleaved `in_proj_qkvz` / `in_proj_ba`.
    pub fused_projections: bool,
    /// `mamba_ssm_dtype` as the config declares it (what vLLM keeps the recurrent state in).
    pub mamba_ssm_dtype: Option<String>,
    /// `mrope_section`, recorded: for text-only input the three position rows MRoPE mixes are
    /// equal, so it is plain RoPE on the rotary slice.
    pub mrope_section: Option<Vec<usize>>,
}

impl Hybrid {
    /// Width of the convolved q, k, v projection (`2·Hk·dk + Hv·dv`).
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "mistral" => Some(Arch::Mistral),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "qwen3_moe" => Some(Arch::Qwen3Moe),
            "qwen3_5_text" => Some(Arch::Qwen3_5Text),
            "qwen3_5" => Some(Arch::Qwen3_5),
            "qwen3_5_moe_text" => Some(Arch::Qwen3_5MoeText),
            "qwen3_5_moe" => Some(Arch::Qwen3_5Moe),
            "qwen3_next" => Some(Arch::Qwen3Next),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen3_5Text => "qwen3_5_text",
            Arch::Qwen3_5 => "qwen3_5",
            Arch::Qwen3_5MoeText => "qwen3_5_moe_text",
            Arch::Qwen3_5Moe => "qwen3_5_moe",
            Arch::Qwen3Next => "qwen3_next",
        }
    }

    /// The hybrid (Gated DeltaNet + gated attention) family.
    pub fn is_hybrid(self) -> bool {
        matches!(
            self,
            Arch::Qwen3_5Text
                | Arch::Qwen3_5
                | Arch::Qwen3_5MoeText
                | Arch::Qwen3_5Moe
                | Arch::Qwen3Next
        )
    }

    /// A vision-language wrapper whose text model sits under `text_config` and
    /// `model.language_model.*`.
    pub fn is_vlm(self) -> bool {
        matches!(self, Arch::Qwen3_5 | Arch::Qwen3_5Moe)
    }

    /// Per-head q/k RMSNorms (Qwen3 and the hybrid family).
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe) || self.is_hybrid()
    }
}

/// Llama 3's frequency-dependent RoPE scaling (`rope_type: llama3`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub rms_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Scaling>,
    pub tie_embeddings: bool,
    /// Mistral-style sliding-window attention (tokens each position sees, itself included).
    pub sliding_window: Option<usize>,
    pub max_positions: Option<usize>,
    /// Biases the architecture gives its linear modules, as transformers builds them (Qwen2:
    /// q/k/v always; Llama and Qwen3: `attention_bias` on q/k/v/o, Llama's `mlp_bias`).
    pub biases: Biases,
    /// The mixture-of-experts blocks, for architectures that have them.
    pub moe: Option<MoeConfig>,
    /// Dimensions of each head that RoPE rotates (the first ones; `head_dim` unless the
    /// hybrid family's `partial_rotary_factor` says fewer).
    pub rotary_dim: usize,
    /// Where the text model's tensors are: `model`, or `model.language_model` (Qwen3.5 VLMs).
    pub prefix: String,
    /// The Gated DeltaNet layers' shape (hybrid architectures only).
    pub hybrid: Option<Hybrid>,
}

/// Which linear modules carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Biases {
    pub qkv: bool,
    pub o: bool,
    pub mlp: bool,
}

impl ModelConfig {
    /// Read `config.json`. Every missing or inconsistent key is an error naming it.
    pub fn from_hf(path: &Path, config: &Value) -> Result<ModelConfig> {
        let text = HfText::read(path, config)?;
        let keys = HfKeys {
            path,
            config: text.config,
            prefix: text.key_prefix,
        };
        let arch = keys.arch(text.model_type)?;
        let hidden = keys.uint("hidden_size")?;
        let heads = keys.uint("num_attention_heads")?;
        let kv_heads = keys.opt_uint("num_key_value_heads")?.unwrap_or(heads);
        let head_dim = keys.head_dim(hidden, heads)?;
        let rope = keys.get("rope_parameters").or(keys.get("rope_scaling"));
        let rope_theta = keys.rope_theta(rope)?;
        let rope_scaling = keys.rope_scaling(rope)?;
        let sliding_window = keys.sliding_window(arch)?;
        let biases = keys.biases(arch)?;
        let layers = keys.uint("num_hidden_layers")?;
        let moe = keys.moe(arch, layers)?;
        let intermediate = keys.intermediate(moe.as_ref(), layers)?;
        let (rotary_dim, hybrid) = if arch.is_hybrid() {
            let (rotary_dim, hybrid) =
                hybrid_shape(path, keys.prefix, keys.config, rope, arch, layers, head_dim)?;
            (rotary_dim, Some(hybrid))
        } else {
            (head_dim, None)
        };
        let cfg = ModelConfig {
            moe,
            rotary_dim,
            prefix: text.tensor_prefix.to_owned(),
            hybrid,
            biases,
            arch,
            hidden,
            intermediate,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab: keys.uint("vocab_size")?,
            rms_eps: keys
                .float_in(keys.config, "rms_norm_eps", "rms_norm_eps")?
                .unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            // A VLM may state it on the wrapper rather than in its text_config.
            tie_embeddings: keys
                .get("tie_word_embeddings")
                .or(config.get("tie_word_embeddings"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            sliding_window,
            max_positions: keys.opt_uint("max_position_embeddings")?,
        };
        cfg.validate(path, ConfigKeys::HuggingFace(keys.prefix))?;
        Ok(cfg)
    }

    /// Every number of the shape in range before it sizes or scales anything, each error naming
    /// the key as the file spells it (`keys`): a hostile or broken config (`rms_norm_eps: -1`)
    /// fails here, not later as a NaN blamed on the eval text.
    pub fn validate(&self, path: &Path, keys: ConfigKeys) -> Result<()> {
        let positive = |value: f64, key: &str, upper: Option<f64>| -> Result<()> {
            let ok = value.is_finite() && value > 0.0 && upper.is_none_or(|u| value < u);
            if ok {
                return Ok(());
            }
            Err(Error::format(
                path,
                Some(&keys.name(key)),
                match upper {
                    Some(u) => format!("{value} is outside (0, {u})"),
                    None => format!("{value} is not a positive finite number"),
                },
            ))
        };
        // RMSNorm divides by sqrt(mean(x²) + eps): a negative eps is a NaN on a quiet row, and
        // an eps near 1 is no normalization at all.
        positive(self.rms_eps, "rms_norm_eps", Some(1.0))?;
        positive(self.rope_theta, "rope_theta", None)?;
        if let Some(s) = self.rope_scaling {
            positive(s.factor, "rope_scaling.factor", None)?;
            positive(s.low_freq_factor, "rope_scaling.low_freq_factor", None)?;
            positive(s.high_freq_factor, "rope_scaling.high_freq_factor", None)?;
            positive(
                s.original_max_position,
                "rope_scaling.original_max_position_embeddings",
                None,
            )?;
            // llama3's smoothing divides by high − low.
            if s.high_freq_factor <= s.low_freq_factor {
                return Err(Error::format(
                    path,
                    Some(&keys.name("rope_scaling.high_freq_factor")),
                    format!(
                        "{} is not above low_freq_factor {}",
                        s.high_freq_factor, s.low_freq_factor
                    ),
                ));
            }
        }
        // Products that size projections must not overflow (a hostile config).
        let widest = self
            .heads
            .checked_mul(self.head_dim)
            .and_then(|w| w.checked_mul(2))
            .filter(|&w| w <= 1 << 31);
        if widest.is_none() {
            return Err(Error::format(
                path,
                Some(&keys.name("num_attention_heads")),
                format!(
                    "{} heads of head_dim {} is wider than the native runner sizes",
                    self.heads, self.head_dim
                ),
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::format(
                path,
                Some(&keys.name("num_key_value_heads")),
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.kv_heads, self.heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::format(
                path,
                Some(&keys.name("head_dim")),
                format!(
                    "{} is odd; rotary embeddings need an even head size",
                    self.head_dim
                ),
            ));
        }
        Ok(())
    }

    /// Tensors the architecture does not load, on purpose (transformers ignores them too): the
    /// hybrid family's multi-token-prediction head (`mtp.*`), and a VLM's vision tower.
    pub fn skipped(&self, name: &str) -> bool {
        match self.arch {
            Arch::Qwen3_5 | Arch::Qwen3_5Moe => {
                name.starts_with("mtp.") || name.starts_with("model.visual.")
            }
            Arch::Qwen3_5Text | Arch::Qwen3_5MoeText | Arch::Qwen3Next => name.starts_with("mtp."),
            _ => false,
        }
    }

    /// Inverse frequencies of the rotary embedding, one per pair of rotated dimensions.
    pub fn inv_freq(&self) -> Vec<f64> {
        let half = self.rotary_dim / 2;
        (0..half)
            .map(|i| {
                let f = 1.0
                    / self
                        .rope_theta
                        .powf(2.0 * i as f64 / self.rotary_dim as f64);
                match self.rope_scaling {
                    None => f,
                    Some(s) => llama3_scale(f, s),
                }
            })
            .collect()
    }
}

impl ModelConfig {
    /// The decoder's shape for a GGUF file of the Qwen3.5 / Qwen3-Next / Qwen3-MoE families
    /// (`qwen35`, `qwen35moe`, `qwen3next`, `qwen3moe`), from what
    /// [`super::gguf_family::read_config`] read; its store gives the tensors back under their
    /// Hugging Face names with the converter's transforms undone.
    pub fn from_gguf_family(
        path: &Path,
        f: &super::gguf_family::GgufFamilyConfig,
    ) -> Result<ModelConfig> {
        use super::gguf_family::Family;
        let arch = match f.family {
            Family::Qwen35 => Arch::Qwen3_5Text,
            Family::Qwen35Moe => Arch::Qwen3_5MoeText,
            Family::Qwen3Next => Arch::Qwen3Next,
            Family::Qwen3Moe => Arch::Qwen3Moe,
        };
        let keys = FamilyKeys { path, f };
        if f.layer_types.len() != f.layers {
            return Err(keys.bad(
                "block_count",
                format!(
                    "{} layers with {} layer types",
                    f.layers,
                    f.layer_types.len()
                ),
            ));
        }
        let moe = match &f.moe {
            None => None,
            Some(m) => Some(keys.moe(m)?),
        };
        let all_sparse = moe.as_ref().is_some_and(|m| m.mlp_only_layers.is_empty());
        let intermediate = match f.intermediate {
            Some(n) => n,
            None if all_sparse => 0,
            None => return Err(keys.missing("feed_forward_length")),
        };
        let (rotary_dim, hybrid) = if f.family.hybrid() {
            (f.rotary_dims, Some(keys.hybrid(arch)?))
        } else {
            if f.rotary_dims != f.head_dim {
                return Err(Error::unsupported(
                    path,
                    Some(&keys.key("rope.dimension_count")),
                    format!(
                        "{} rotary dimensions for head_dim {}; this architecture rotates whole heads",
                        f.rotary_dims, f.head_dim
                    ),
                ));
            }
            (f.head_dim, None)
        };
        let cfg = ModelConfig {
            moe,
            arch,
            hidden: f.hidden,
            intermediate,
            layers: f.layers,
            heads: f.heads,
            kv_heads: f.kv_heads,
            head_dim: f.head_dim,
            vocab: f.vocab,
            rms_eps: f.rms_eps,
            rope_theta: f.rope_theta,
            rope_scaling: None,
            tie_embeddings: f.tie_embeddings,
            sliding_window: None,
            max_positions: f.max_positions,
            biases: Biases::default(),
            rotary_dim,
            prefix: "model".into(),
            hybrid,
        };
        cfg.validate(path, ConfigKeys::Gguf(f.family.as_str()))?;
        Ok(cfg)
    }
}

/// What [`ModelConfig::from_gguf_family`] reads, with errors that name the GGUF key
/// (`{arch}.{key}`), so the mixture-of-experts and hybrid parts are checked in methods of
/// their own.
struct FamilyKeys<'a> {
    path: &'a Path,
    f: &'a super::gguf_family::GgufFamilyConfig,
}

impl FamilyKeys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.f.family.as_str())
    }

    fn bad(&self, k: &str, rule: String) -> Error {
        Error::format(self.path, Some(&self.key(k)), rule)
    }

    fn missing(&self, k: &str) -> Error {
        Error::format(
            self.path,
            Some(&self.key(k)),
            "missing for this architecture",
        )
    }

    /// The experts, checked against the native runner's limits and the layer count.
    fn moe(&self, m: &super::gguf_family::MoeShape) -> Result<MoeConfig> {
        use super::gguf_family::Family;
        let f = self.f;
        let family = match f.family {
            Family::Qwen3Moe => MoeFamily::Qwen3Moe,
            Family::Qwen3Next => MoeFamily::Qwen3Next,
            Family::Qwen35Moe | Family::Qwen35 => MoeFamily::Qwen35Moe,
        };
        if m.experts == 0 || m.experts > super::moe::MAX_EXPERTS {
            return Err(self.bad(
                "expert_count",
                format!(
                    "{} experts; the native runner takes 1 to {}",
                    m.experts,
                    super::moe::MAX_EXPERTS
                ),
            ));
        }
        if m.experts_used == 0 {
            return Err(self.bad("expert_used_count", "0 experts per token".into()));
        }
        if m.sparse_layers.len() != f.layers {
            return Err(self.bad(
                "block_count",
                format!(
                    "{} layers but {} layers' router tensors were looked for",
                    f.layers,
                    m.sparse_layers.len()
                ),
            ));
        }
        let shared_intermediate = match family {
            MoeFamily::Qwen3Moe => None,
            _ => Some(
                m.shared_expert_intermediate
                    .ok_or_else(|| self.missing("expert_shared_feed_forward_length"))?,
            ),
        };
        Ok(MoeConfig {
            family,
            num_experts: m.experts,
            top_k: m.experts_used,
            intermediate: m.expert_intermediate,
            // llama.cpp's graphs for these families renormalise the chosen weights
            // (`norm_w` true) unless the file says otherwise; Qwen3.5-MoE always does.
            norm_topk_prob: family == MoeFamily::Qwen35Moe || m.norm_topk_prob.unwrap_or(true),
            shared_intermediate,
            // Which layers are sparse is what the tensor table holds (a router or not).
            sparse_step: 1,
            mlp_only_layers: (0..f.layers).filter(|&l| !m.sparse_layers[l]).collect(),
        })
    }

    /// The Gated DeltaNet layers of a hybrid family, with its partial rotary slice checked.
    fn hybrid(&self, arch: Arch) -> Result<Hybrid> {
        use super::gguf_family::LayerKind;
        let f = self.f;
        let linear = f.linear.ok_or_else(|| self.missing("ssm.conv_kernel"))?;
        if !(2..=f.head_dim).contains(&f.rotary_dims) || !f.rotary_dims.is_multiple_of(2) {
            return Err(self.bad(
                "rope.dimension_count",
                format!(
                    "{} rotary dimensions for head_dim {}; RoPE needs an even number from 2 to head_dim",
                    f.rotary_dims, f.head_dim
                ),
            ));
        }
        if linear.key_heads == 0 || !linear.value_heads.is_multiple_of(linear.key_heads) {
            return Err(self.bad(
                "ssm.time_step_rank",
                format!(
                    "{} value heads for {} key heads: each key head serves a group of value heads",
                    linear.value_heads, linear.key_heads
                ),
            ));
        }
        Ok(Hybrid {
            layer_types: f
                .layer_types
                .iter()
                .map(|k| match k {
                    LayerKind::LinearAttention => LayerType::Linear,
                    LayerKind::FullAttention => LayerType::Full,
                })
                .collect(),
            conv_kernel: linear.conv_kernel,
            key_heads: linear.key_heads,
            value_heads: linear.value_heads,
            key_dim: linear.key_head_dim,
            value_dim: linear.value_head_dim,
            fused_projections: arch == Arch::Qwen3Next,
            mamba_ssm_dtype: None,
            mrope_section: f
                .rope_sections
                .as_ref()
                .map(|s| s.iter().map(|&n| n as usize).collect()),
        })
    }
}

/// How a config's keys are spelled where they were read, for errors that name them.
#[derive(Debug, Clone, Copy)]
pub enum ConfigKeys<'a> {
    /// config.json, with the prefix of a nested text config (`text_config.`).
    HuggingFace(&'a str),
    /// GGUF metadata of this architecture (`qwen3.attention.layer_norm_rms_epsilon`).
    Gguf(&'a str),
}

impl ConfigKeys<'_> {
    /// The name of config.json key `key` in this source.
    pub fn name(self, key: &str) -> String {
        match self {
            ConfigKeys::HuggingFace(prefix) => format!("{prefix}{key}"),
            ConfigKeys::Gguf(arch) => {
                let gguf = match key {
                    "rms_norm_eps" => "attention.layer_norm_rms_epsilon",
                    "rope_theta" => "rope.freq_base",
                    "num_attention_heads" => "attention.head_count",
                    "num_key_value_heads" => "attention.head_count_kv",
                    "head_dim" => "attention.key_length",
                    other => other,
                };
                format!("{arch}.{gguf}")
            }
        }
    }
}

/// The text model's settings within a `config.json`, and where its tensors are.
struct HfText<'a> {
    /// The top level's `model_type`: it picks the architecture.
    model_type: &'a str,
    /// The object every other key is read from: the top level, or a VLM's `text_config`.
    config: &'a Value,
    /// How keys read from `config` are spelled in errors (`text_config.`, or empty).
    key_prefix: &'static str,
    /// Where the text model's tensors are: `model`, or `model.language_model`.
    tensor_prefix: &'static str,
}

impl<'a> HfText<'a> {
    /// `model_type`, and for a Qwen3.5 vision-language checkpoint its `text_config`, checked to
    /// be an object of the matching text type before any key is read from it.
    fn read(path: &Path, config: &'a Value) -> Result<HfText<'a>> {
        let model_type = config
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                Error::format(
                    path,
                    Some("model_type"),
                    "missing (needed to choose the architecture)",
                )
            })?;
        // A Qwen3.5 vision-language checkpoint: the text model's settings are its text_config.
        let text_type = match model_type {
            "qwen3_5" => "qwen3_5_text",
            "qwen3_5_moe" => "qwen3_5_moe_text",
            _ => {
                return Ok(HfText {
                    model_type,
                    config,
                    key_prefix: "",
                    tensor_prefix: "model",
                });
            }
        };
        let text = config
            .get("text_config")
            .filter(|v| v.is_object())
            .ok_or_else(|| {
                Error::format(
                    path,
                    Some("text_config"),
                    format!("missing or not an object (a {model_type} checkpoint nests its text model's settings there)"),
                )
            })?;
        match text.get("model_type") {
            None => {}
            Some(Value::String(t)) if t == text_type => {}
            Some(other) => {
                return Err(Error::format(
                    path,
                    Some("text_config.model_type"),
                    format!("is {other}; a {model_type} checkpoint's text model is {text_type}"),
                ));
            }
        }
        Ok(HfText {
            model_type,
            config: text,
            key_prefix: "text_config.",
            tensor_prefix: "model.language_model",
        })
    }
}

/// One `config.json` object read key by key: every value type-checked, and every error naming
/// the key as the file spells it (`text_config.head_dim` in a VLM's nested text model).
#[derive(Clone, Copy)]
struct HfKeys<'a> {
    path: &'a Path,
    config: &'a Value,
    /// Put before each key an error names (`text_config.`, or empty).
    prefix: &'a str,
}

impl<'a> HfKeys<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.config.get(key)
    }

    /// A format error at `key`.
    fn bad(&self, key: &str, rule: String) -> Error {
        Error::format(self.path, Some(&format!("{}{key}", self.prefix)), rule)
    }

    /// An unsupported-setting error at `key`.
    fn unsupported(&self, key: &str, rule: String) -> Error {
        Error::unsupported(self.path, Some(&format!("{}{key}", self.prefix)), rule)
    }

    /// A required positive integer.
    fn uint(&self, key: &str) -> Result<usize> {
        match self.get(key) {
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.bad(key, format!("must be a positive integer, found {v}"))),
            None => Err(self.bad(key, "missing".into())),
        }
    }

    /// An optional positive integer: absent or null is `None`, anything else must be one.
    fn opt_uint(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.uint(key).map(Some),
        }
    }

    /// The number at `key` of `map` (this object or one nested in it), named `name` in errors.
    /// A float key present with another type is an error naming it, never the default.
    fn float_in(&self, map: &Value, key: &str, name: &str) -> Result<Option<f64>> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(name, format!("must be a number, found {v}"))),
        }
    }

    /// A boolean; absent or null is false.
    fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.bad(key, format!("must be true or false, found {v}"))),
        }
    }
}

/// The decoder's settings in `config.json`, one reader per concern, in the order `from_hf`
/// checks them.
impl HfKeys<'_> {
    /// The architecture `model_type` names, or an error listing the supported ones.
    fn arch(&self, model_type: &str) -> Result<Arch> {
        Arch::from_name(model_type).ok_or_else(|| {
            self.unsupported(
                "model_type",
                format!(
                    "architecture `{model_type}` is not supported by the native runner (supported: {})",
                    SUPPORTED.join(", ")
                ),
            )
        })
    }

    /// `head_dim`, or `hidden_size / num_attention_heads` where transformers derives it.
    fn head_dim(&self, hidden: usize, heads: usize) -> Result<usize> {
        match self.opt_uint("head_dim")? {
            Some(d) => Ok(d),
            None if hidden.is_multiple_of(heads) => Ok(hidden / heads),
            None => Err(self.bad(
                "head_dim",
                format!(
                    "missing, and hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
                ),
            )),
        }
    }

    /// `rope_theta` at the top level, else in the RoPE object (transformers 5's
    /// `rope_parameters`), else 10⁴.
    fn rope_theta(&self, rope: Option<&Value>) -> Result<f64> {
        if let Some(t) = self.float_in(self.config, "rope_theta", "rope_theta")? {
            return Ok(t);
        }
        let nested = match rope {
            Some(r) if r.is_object() => {
                self.float_in(r, "rope_theta", "rope_parameters.rope_theta")?
            }
            _ => None,
        };
        Ok(nested.unwrap_or(10_000.0))
    }

    /// The RoPE object's scaling: none for `default`, Llama 3's four numbers for `llama3`, and
    /// any other type unsupported (a scaling the runner ignored would change every logit).
    fn rope_scaling(&self, rope: Option<&Value>) -> Result<Option<Llama3Scaling>> {
        let Some(r) = rope.filter(|r| !r.is_null()) else {
            return Ok(None);
        };
        let kind = r
            .get("rope_type")
            .or(r.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        match kind {
            "default" => Ok(None),
            "llama3" => {
                let f = |k: &str| {
                    self.float_in(r, k, &format!("rope_scaling.{k}"))?
                        .ok_or_else(|| {
                            self.bad("rope_scaling", format!("llama3 scaling needs `{k}`"))
                        })
                };
                Ok(Some(Llama3Scaling {
                    factor: f("factor")?,
                    low_freq_factor: f("low_freq_factor")?,
                    high_freq_factor: f("high_freq_factor")?,
                    original_max_position: f("original_max_position_embeddings")?,
                }))
            }
            other => Err(self.unsupported(
                "rope_scaling",
                format!(
                    "RoPE scaling `{other}` is not supported by the native runner (supported: default, llama3)"
                ),
            )),
        }
    }

    /// The attention window, read only where sliding-window attention is on
    /// (`use_sliding_window`, which Mistral defaults to).
    fn sliding_window(&self, arch: Arch) -> Result<Option<usize>> {
        let use_sliding = self
            .get("use_sliding_window")
            .and_then(Value::as_bool)
            .unwrap_or(arch == Arch::Mistral);
        if use_sliding {
            self.opt_uint("sliding_window")
        } else {
            Ok(None)
        }
    }

    /// Which linear modules carry a bias, as transformers builds them: fixed by the
    /// architecture, or its `attention_bias` (and Llama's `mlp_bias`) flags.
    fn biases(&self, arch: Arch) -> Result<Biases> {
        Ok(match arch {
            Arch::Qwen2 => Biases {
                qkv: true,
                o: false,
                mlp: false,
            },
            Arch::Mistral => Biases::default(),
            Arch::Llama
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::Qwen3_5Text
            | Arch::Qwen3_5
            | Arch::Qwen3_5MoeText
            | Arch::Qwen3_5Moe
            | Arch::Qwen3Next => {
                let attention = self.flag("attention_bias")?;
                Biases {
                    qkv: attention,
                    o: attention,
                    mlp: arch == Arch::Llama && self.flag("mlp_bias")?,
                }
            }
        })
    }

    /// The mixture-of-experts blocks, for an architecture that has them.
    fn moe(&self, arch: Arch, layers: usize) -> Result<Option<MoeConfig>> {
        let family = match arch {
            Arch::Qwen3Moe => MoeFamily::Qwen3Moe,
            Arch::Qwen3_5MoeText | Arch::Qwen3_5Moe => MoeFamily::Qwen35Moe,
            // transformers: num_experts 0 makes every Qwen3-Next MLP dense.
            Arch::Qwen3Next if self.get("num_experts").and_then(Value::as_u64) != Some(0) => {
                MoeFamily::Qwen3Next
            }
            _ => return Ok(None),
        };
        MoeConfig::from_hf_at(self.path, self.config, family, layers, self.prefix).map(Some)
    }

    /// `intermediate_size`, the dense MLP width. A model whose every layer is sparse has none
    /// (Qwen3.5-MoE): 0.
    fn intermediate(&self, moe: Option<&MoeConfig>, layers: usize) -> Result<usize> {
        let all_sparse = moe.is_some_and(|m| (0..layers).all(|i| m.is_sparse(i)));
        match self.opt_uint("intermediate_size")? {
            Some(n) => Ok(n),
            None if all_sparse => Ok(0),
            None => self.uint("intermediate_size"),
        }
    }
}

/// The hybrid family's keys (Qwen3.5 `qwen3_5_text`, Qwen3-Next), each range-checked before it
/// sizes anything: the rotary slice and the Gated DeltaNet shape.
fn hybrid_shape(
    path: &Path,
    kp: &str,
    config: &Value,
    rope: Option<&Value>,
    arch: Arch,
    layers: usize,
    head_dim: usize,
) -> Result<(usize, Hybrid)> {
    let keys = HybridKeys { path, kp, config };
    keys.check_activation()?;
    if layers > MAX_HYBRID_DIM || head_dim > MAX_HYBRID_DIM {
        return Err(keys.bad(
            "num_hidden_layers",
            format!("num_hidden_layers and head_dim must be at most {MAX_HYBRID_DIM}"),
        ));
    }
    let rotary_dim = keys.rotary_dim(rope, head_dim)?;
    let mrope_section = keys.mrope_section(rope)?;
    let layer_types = keys.layer_types(layers)?;
    let key_heads = keys.dim("linear_num_key_heads", None)?;
    let value_heads = keys.dim("linear_num_value_heads", None)?;
    if !value_heads.is_multiple_of(key_heads) {
        return Err(keys.bad(
            "linear_num_value_heads",
            format!(
                "{value_heads} is not a multiple of linear_num_key_heads {key_heads} (each key head serves a group of value heads)"
            ),
        ));
    }
    let conv_kernel = keys.dim("linear_conv_kernel_dim", None)?;
    if conv_kernel > 64 {
        return Err(keys.bad(
            "linear_conv_kernel_dim",
            format!("{conv_kernel} is wider than 64"),
        ));
    }
    let mamba_ssm_dtype = keys.mamba_ssm_dtype()?;
    let hybrid = Hybrid {
        layer_types,
        conv_kernel,
        key_heads,
        value_heads,
        key_dim: keys.dim("linear_key_head_dim", None)?,
        value_dim: keys.dim("linear_value_head_dim", None)?,
        fused_projections: arch == Arch::Qwen3Next,
        mamba_ssm_dtype,
        mrope_section,
    };
    Ok((rotary_dim, hybrid))
}

/// Where the hybrid family's keys are read from, so each reader names the key it rejects.
struct HybridKeys<'a> {
    path: &'a Path,
    kp: &'a str,
    config: &'a Value,
}

impl HybridKeys<'_> {
    /// A format error naming the key with its config prefix.
    fn bad(&self, key: &str, rule: String) -> Error {
        Error::format(self.path, Some(&format!("{}{key}", self.kp)), rule)
    }

    /// A positive size key, at most [`MAX_HYBRID_DIM`], so nothing it sizes can overflow.
    fn dim(&self, key: &str, default: Option<u64>) -> Result<usize> {
        let v = match (self.config.get(key), default) {
            (Some(v), _) => v,
            (None, Some(d)) => return Ok(d as usize),
            (None, None) => return Err(self.bad(key, "missing".into())),
        };
        v.as_u64()
            .filter(|&n| n > 0 && n <= MAX_HYBRID_DIM as u64)
            .map(|n| n as usize)
            .ok_or_else(|| {
                self.bad(
                    key,
                    format!("must be an integer from 1 to {MAX_HYBRID_DIM}, found {v}"),
                )
            })
    }

    /// `hidden_act`, if given, must be SiLU: the only activation the native runner implements.
    fn check_activation(&self) -> Result<()> {
        if let Some(act) = self.config.get("hidden_act")
            && act.as_str() != Some("silu")
        {
            return Err(Error::unsupported(
                self.path,
                Some(&format!("{}hidden_act", self.kp)),
                format!(
                    "{act} is not supported by the native runner for this architecture (supported: silu)"
                ),
            ));
        }
        Ok(())
    }

    /// The rotary slice: the first head_dim·partial_rotary_factor dimensions (transformers:
    /// int(head_dim * factor)), in rope_parameters or at the top level, 0.25 by default.
    fn rotary_dim(&self, rope: Option<&Value>, head_dim: usize) -> Result<usize> {
        let factor_at = rope
            .and_then(|r| r.get("partial_rotary_factor"))
            .map(|v| ("rope_parameters.partial_rotary_factor", v))
            .or_else(|| {
                self.config
                    .get("partial_rotary_factor")
                    .map(|v| ("partial_rotary_factor", v))
            });
        let factor = match factor_at {
            None => 0.25,
            Some((key, v)) => v
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0 && *f <= 1.0)
                .ok_or_else(|| self.bad(key, format!("must be a number in (0, 1], found {v}")))?,
        };
        let rotary_dim = (head_dim as f64 * factor) as usize;
        if rotary_dim < 2 || !rotary_dim.is_multiple_of(2) {
            return Err(self.bad(
                "partial_rotary_factor",
                format!(
                    "rotates {rotary_dim} of head_dim {head_dim}'s dimensions; RoPE needs an even number, at least 2"
                ),
            ));
        }
        Ok(rotary_dim)
    }

    /// The multimodal RoPE sections, in rope_parameters or at the top level, if any.
    fn mrope_section(&self, rope: Option<&Value>) -> Result<Option<Vec<usize>>> {
        Ok(
            match rope
                .and_then(|r| r.get("mrope_section"))
                .or(self.config.get("mrope_section"))
            {
                None | Some(Value::Null) => None,
                Some(Value::Array(a)) => Some(
                    a.iter()
                        .map(|e| {
                            e.as_u64()
                                .filter(|&n| n <= MAX_HYBRID_DIM as u64)
                                .map(|n| n as usize)
                                .ok_or_else(|| {
                                    self.bad(
                                        "rope_parameters.mrope_section",
                                        format!(
                                            "entries must be small non-negative integers, found {e}"
                                        ),
                                    )
                                })
                        })
                        .collect::<Result<Vec<_>>>()?,
                ),
                Some(v) => {
                    return Err(self.bad(
                        "rope_parameters.mrope_section",
                        format!("must be a list of integers, found {v}"),
                    ));
                }
            },
        )
    }

    /// Each layer's kind: listed in `layer_types`, or every `full_attention_interval`-th full.
    fn layer_types(&self, layers: usize) -> Result<Vec<LayerType>> {
        match self.config.get("layer_types") {
            None | Some(Value::Null) => {
                // transformers: linear if (i + 1) % full_attention_interval != 0.
                let interval = self.dim("full_attention_interval", Some(4))?;
                Ok((0..layers)
                    .map(|i| {
                        if (i + 1) % interval != 0 {
                            LayerType::Linear
                        } else {
                            LayerType::Full
                        }
                    })
                    .collect())
            }
            Some(Value::Array(a)) => {
                if a.len() != layers {
                    return Err(self.bad(
                        "layer_types",
                        format!("has {} entries for num_hidden_layers {layers}", a.len()),
                    ));
                }
                a.iter()
                    .enumerate()
                    .map(|(i, t)| match t.as_str() {
                        Some("linear_attention") => Ok(LayerType::Linear),
                        Some("full_attention") => Ok(LayerType::Full),
                        _ => Err(self.bad(
                            &format!("layer_types[{i}]"),
                            format!(
                                "is {t}; a layer is \"linear_attention\" or \"full_attention\""
                            ),
                        )),
                    })
                    .collect()
            }
            Some(v) => Err(self.bad(
                "layer_types",
                format!("must be a list of layer types, found {v}"),
            )),
        }
    }

    /// `mamba_ssm_dtype`, the recurrent state's dtype name, if the config gives one.
    fn mamba_ssm_dtype(&self) -> Result<Option<String>> {
        match self.config.get("mamba_ssm_dtype") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(d)) => Ok(Some(d.clone())),
            Some(v) => Err(self.bad(
                "mamba_ssm_dtype",
                format!("must be a dtype name, found {v}"),
            )),
        }
    }
}

/// Llama 3.1's wavelength-dependent scaling of one inverse frequency.
fn llama3_scale(freq: f64, s: Llama3Scaling) -> f64 {
    let low_wavelen = s.original_max_position / s.low_freq_factor;
    let high_wavelen = s.original_max_position / s.high_freq_factor;
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    if wavelen < high_wavelen {
        freq
    } else if wavelen > low_wavelen {
        freq / s.factor
    } else {
        let smooth = (s.original_max_position / wavelen - s.low_freq_factor)
            / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen3() -> Value {
        json!({"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 768,
               "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 64, "vocab_size": 2048, "rms_norm_eps": 1e-6,
               "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    }

    #[test]
    fn reads_transformers_5_rope_parameters() {
        let c = ModelConfig::from_hf(Path::new("config.json"), &qwen3()).unwrap();
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!((c.heads, c.kv_heads, c.head_dim), (4, 2, 64));
        assert!(!c.tie_embeddings);
    }

    #[test]
    fn unsupported_architecture_lists_the_supported_ones() {
        let mut v = qwen3();
        v["model_type"] = json!("gemma3");
        let e = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("gemma3") && s.contains("llama, mistral, qwen2, qwen3"),
            "{s}"
        );
    }

    #[test]
    fn missing_key_is_named() {
        let mut v = qwen3();
        v.as_object_mut().unwrap().remove("hidden_size");
        let e = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap_err();
        assert!(e.to_string().contains("hidden_size: missing"), "{e}");
    }

    fn qwen3_5_text() -> Value {
        json!({"model_type": "qwen3_5_text", "hidden_size": 32, "intermediate_size": 64,
               "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "vocab_size": 256, "linear_num_key_heads": 2,
               "linear_num_value_heads": 4, "linear_key_head_dim": 16,
               "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
               "mamba_ssm_dtype": "float32",
               "rope_parameters": {"rope_theta": 1e4, "rope_type": "default",
                                   "mrope_section": [11, 11, 10]}})
    }

    #[test]
    fn hybrid_layer_types_derive_from_full_attention_interval() {
        let path = Path::new("config.json");
        let c = ModelConfig::from_hf(path, &qwen3_5_text()).unwrap();
        let h = c.hybrid.as_ref().unwrap();
        use LayerType::{Full, Linear};
        // Default interval 4: linear if (i + 1) % 4 != 0.
        assert_eq!(
            h.layer_types,
            [Linear, Linear, Linear, Full, Linear, Linear, Linear, Full]
        );
        assert_eq!(h.conv_dim(), 2 * 2 * 16 + 4 * 8);
        assert_eq!(h.mamba_ssm_dtype.as_deref(), Some("float32"));
        assert_eq!(h.mrope_section.as_deref(), Some(&[11, 11, 10][..]));
        assert!(!h.fused_projections);
        // partial_rotary_factor defaults to 0.25: RoPE on 4 of 16 dimensions, frequencies over 4.
        assert_eq!(c.rotary_dim, 4);
        assert_eq!(c.inv_freq(), vec![1.0, 1.0 / 100.0]);
        let mut v = qwen3_5_text();
        v["full_attention_interval"] = json!(2);
        v["partial_rotary_factor"] = json!(0.5);
        let c = ModelConfig::from_hf(path, &v).unwrap();
        assert_eq!(c.hybrid.unwrap().layer_types, [Linear, Full].repeat(4));
        assert_eq!(c.rotary_dim, 8);
    }

    #[test]
    fn a_qwen3_5_vlm_reads_its_text_config_and_language_model_weights() {
        let v = json!({"model_type": "qwen3_5", "tie_word_embeddings": true,
                       "text_config": qwen3_5_text(), "vision_config": {"depth": 1}});
        let c = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap();
        assert_eq!(c.arch, Arch::Qwen3_5);
        assert_eq!(c.prefix, "model.language_model");
        assert!(c.tie_embeddings);
        assert!(c.skipped("model.visual.blocks.0.attn.qkv.weight"));
        assert!(c.skipped("mtp.fc.weight"));
        assert!(!c.skipped("model.language_model.layers.0.mlp.up_proj.weight"));
        let mut v = v;
        v["text_config"]["model_type"] = json!("qwen3");
        let e = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap_err();
        assert!(e.to_string().contains("text_config.model_type"), "{e}");
    }

    #[test]
    fn a_qwen3_next_reads_its_expert_layers_with_transformers_rule() {
        let mut v = qwen3_5_text();
        v["model_type"] = json!("qwen3_next");
        // No num_experts: transformers would build 512 experts per layer; the runner refuses to
        // guess the expert keys and names the first one missing.
        let e = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap_err();
        assert!(e.to_string().contains("num_experts"), "{e}");
        v["num_experts"] = json!(8);
        v["num_experts_per_tok"] = json!(2);
        v["moe_intermediate_size"] = json!(16);
        v["shared_expert_intermediate_size"] = json!(24);
        v["mlp_only_layers"] = json!([0, 1, 2, 3, 4, 5, 6]);
        let c = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap();
        let m = c.moe.as_ref().unwrap();
        assert_eq!(m.family, MoeFamily::Qwen3Next);
        assert!(m.norm_topk_prob, "Qwen3-Next renormalises by default");
        let sparse: Vec<usize> = (0..c.layers).filter(|&i| m.is_sparse(i)).collect();
        assert_eq!(sparse, [7]);
        v["num_experts"] = json!(0);
        let c = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap();
        assert!(c.moe.is_none());
        assert!(c.hybrid.unwrap().fused_projections);
    }

    #[test]
    fn a_qwen3_5_moe_vlm_nests_its_expert_keys_and_needs_no_dense_width() {
        let mut text = qwen3_5_text();
        text["model_type"] = json!("qwen3_5_moe_text");
        text.as_object_mut().unwrap().remove("intermediate_size");
        text["num_experts"] = json!(4);
        text["num_experts_per_tok"] = json!(2);
        text["moe_intermediate_size"] = json!(16);
        let v = json!({"model_type": "qwen3_5_moe", "text_config": text.clone()});
        // The shared expert's width is required, and the error names it under text_config.
        let e = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap_err();
        assert!(
            e.to_string()
                .contains("text_config.shared_expert_intermediate_size"),
            "{e}"
        );
        text["shared_expert_intermediate_size"] = json!(24);
        text["norm_topk_prob"] = json!(false);
        let v = json!({"model_type": "qwen3_5_moe", "text_config": text});
        let c = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap();
        assert_eq!(c.arch, Arch::Qwen3_5Moe);
        assert_eq!(c.prefix, "model.language_model");
        assert_eq!(c.intermediate, 0);
        let m = c.moe.as_ref().unwrap();
        assert!(
            m.norm_topk_prob,
            "Qwen3.5-MoE's router renormalises whatever the config says"
        );
        assert!((0..c.layers).all(|i| m.is_sparse(i)));
        assert!(c.skipped("model.visual.blocks.0.attn.qkv.weight") && c.skipped("mtp.fc.weight"));
        let wrong =
            json!({"model_type": "qwen3_5_moe", "text_config": {"model_type": "qwen3_5_text"}});
        let e = ModelConfig::from_hf(Path::new("config.json"), &wrong).unwrap_err();
        assert!(e.to_string().contains("qwen3_5_moe_text"), "{e}");
    }

    #[test]
    fn hybrid_sizes_are_range_checked_and_named() {
        for (key, value, said) in [
            (
                "linear_num_key_heads",
                json!(0),
                "linear_num_key_heads: must be an integer from 1",
            ),
            (
                "linear_num_value_heads",
                json!(5),
                "linear_num_value_heads: 5 is not a multiple",
            ),
            (
                "linear_conv_kernel_dim",
                json!(65),
                "linear_conv_kernel_dim: 65 is wider than 64",
            ),
            (
                "linear_value_head_dim",
                json!(-1),
                "linear_value_head_dim: must be an integer",
            ),
            (
                "full_attention_interval",
                json!(0),
                "full_attention_interval: must be an integer",
            ),
            (
                "layer_types",
                json!("linear"),
                "layer_types: must be a list",
            ),
            (
                "mamba_ssm_dtype",
                json!(3),
                "mamba_ssm_dtype: must be a dtype name",
            ),
            ("hidden_act", json!("gelu"), "hidden_act"),
            (
                "partial_rotary_factor",
                json!(0.01),
                "partial_rotary_factor: rotates 0 of head_dim 16",
            ),
        ] {
            let mut v = qwen3_5_text();
            v[key] = value;
            let e = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap_err();
            assert!(e.to_string().contains(said), "{key}: {e}");
        }
        let mut v = qwen3_5_text();
        v["num_attention_heads"] = json!(1u64 << 62);
        v["num_key_value_heads"] = json!(1u64 << 62);
        let e = ModelConfig::from_hf(Path::new("config.json"), &v).unwrap_err();
        assert!(e.to_string().contains("num_attention_heads"), "{e}");
    }

    #[test]
    fn llama3_scaling_keeps_high_frequencies_and_divides_low_ones() {
        let s = Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 8192.0,
        };
        assert_eq!(llama3_scale(1.0, s), 1.0);
        let low = 2.0 * std::f64::consts::PI / 100_000.0;
        assert_eq!(llama3_scale(low, s), low / 8.0);
    }
}
