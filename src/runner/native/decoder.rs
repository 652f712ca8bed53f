//! The decoder forward pass (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, and the hybrid Qwen3.5 / Qwen3-Next
//! family) on candle's CPU tensors, written out rather than taken from candle-transformers so
//! that declared activation and KV-cache quantization can be emulated at the exact points the
//! engines apply them (see docs/DESIGN.md). A layer is a token mixer (softmax attention, the
//! hybrid family's gated attention, or a Gated DeltaNet, in [`super::hybrid`]) and an FFN.

use candle_core::{DType, Device, Tensor};

use super::attention;
use super::config::{LayerType, ModelConfig};
use super::delta_rule::StateDtype;
use super::fused;
use super::hybrid::GatedDeltaNet;
use super::llamacpp_cpu::GgmlActivation;
use super::matmul::{F32Matrix, Weight, with_f32};
use super::moe::MoeBlock;
use super::weights::{InputQuant, KvQuant, Linear, WeightStore};
use crate::dequant;
use crate::error::{Error, Result};

/// Compute precision of the forward pass (weights are dequantized exactly, then cast).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeDtype {
    F32,
    F64,
    Bf16,
}

impl ComputeDtype {
    pub(super) fn candle(self) -> DType {
        match self {
            ComputeDtype::F32 => DType::F32,
            ComputeDtype::F64 => DType::F64,
            ComputeDtype::Bf16 => DType::BF16,
        }
    }

    /// The dtype a name means: `f32`, `f64`, `bf16` (the command line's and a card's
    /// `runtime.compute_dtype`), or their torch spellings `float32`, `float64`, `bfloat16`.
    pub fn from_name(name: &str) -> Option<ComputeDtype> {
        match name {
            "f32" | "float32" => Some(ComputeDtype::F32),
            "f64" | "float64" => Some(ComputeDtype::F64),
            "bf16" | "bfloat16" => Some(ComputeDtype::Bf16),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ComputeDtype::F32 => "f32",
            ComputeDtype::F64 => "f64",
            ComputeDtype::Bf16 => "bf16",
        }
    }
}

pub(super) struct Lin {
    /// The `[out, in]` weight, applied as its `[in, out]` map.
    pub(super) wt: Weight,
    pub(super) bias: Option<Tensor>,
    pub(super) input: InputQuant,
    /// `[out, in / 32]` block minimums of a Q4_1/Q5_1 weight under llama.cpp's Q8_1 input
    /// ([`Linear::block_mins`]).
    pub(super) block_mins: Option<std::sync::Arc<Vec<f32>>>,
}

/// Softmax attention: the dense architectures', or the hybrid family's gated one (`q_proj` gives
/// a query and a sigmoid output gate per head, RoPE on the first `rotary_dim` dimensions).
struct Attention {
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    gated: bool,
    kv: Option<KvQuant>,
    /// Q and the softmax weights rounded to f16 at their products with the cache
    /// ([`WeightStore::f16_attention_products`]).
    f16_products: bool,
    /// The layer's (k_scale, v_scale) computed by [`Decoder::calibrate_kv_scales`] where the
    /// setting asks for them: set once, by the calibration pass, then read by every window.
    computed_scales: std::sync::OnceLock<(f32, f32)>,
}

/// A layer's token mixer.
enum Mixer {
    Attention(Box<Attention>),
    DeltaNet(Box<GatedDeltaNet>),
}

/// A layer's feed-forward block: the dense gated MLP, or a sparse mixture of experts.
enum Ffn {
    /// SwiGLU: down(silu(gate(x)) · up(x)).
    Dense {
        gate: Lin,
        up: Lin,
        down: Lin,
    },
    Moe(Box<MoeBlock>),
}

impl Ffn {
    fn forward(&self, h: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Ffn::Dense { gate, up, down } => {
                let g = linear(h, gate)?;
                let u = linear(h, up)?;
                let a = fused::silu_mul(&g, &u)?;
                linear(&a, down)
            }
            Ffn::Moe(block) => block.forward(h),
        }
    }
}

struct Layer {
    attn_norm: Tensor,
    mixer: Mixer,
    mlp_norm: Tensor,
    ffn: Ffn,
}

/// What was loaded and how: for the measurement's environment record.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadReport {
    /// Weight storage schemes and how many linear modules use each.
    pub schemes: std::collections::BTreeMap<String, usize>,
    /// Emulated activation quantization and how many modules use each.
    pub activations: std::collections::BTreeMap<String, usize>,
    pub kv_cache: Option<String>,
    /// The mixture-of-experts layers in words (see [`super::moe::MoeConfig::describe`]).
    pub experts: Option<String>,
    /// Tensors not loaded on purpose (a VLM's vision tower, multi-token-prediction heads).
    pub skipped: usize,
}

pub struct Decoder {
    pub config: ModelConfig,
    pub compute: ComputeDtype,
    /// The dtype the carried recurrent (Gated DeltaNet) state is rounded to: read by hybrid
    /// layers; this dense decoder has no recurrent state and ignores it.
    pub recurrent_state: StateDtype,
    pub report: LoadReport,
    /// The KV-cache schemes [`Decoder::set_kv_cache`] set, if it was called.
    kv_setting: Option<super::kv_cache::KvCacheSetting>,
    /// The protocol's prefill chunk (`None`: each window in one pass): a window is prefilled in
    /// pieces of this many tokens with everything carried between them, as an engine's chunked
    /// prefill runs it (see [`Decoder::set_prefill_chunk`]).
    prefill_chunk: Option<usize>,
    /// Whether the per-tensor fp8 schemes took the checkpoint's `k_scale` / `v_scale`.
    kv_checkpoint_scales: bool,
    /// Set only while [`Decoder::calibrate_kv_scales`] runs its pass: attention layers then
    /// compute their scales instead of refusing to run without them.
    kv_calibrating: std::sync::atomic::AtomicBool,
    /// The tokens the computed scales came from, once calibrated (the lock also keeps two
    /// calibrations from racing).
    kv_calibration: std::sync::Mutex<Option<usize>>,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Lin,
}

/// The token embedding `[vocab, hidden]`: a candle tensor in the f64 and bf16 computes, the f32
/// matrix (in place in an F32 file) that a tied LM head shares in f32.
enum Embedding {
    Candle(Tensor),
    F32(std::sync::Arc<F32Matrix>),
}

impl Embedding {
    fn rows(&self, ids: &[u32]) -> candle_core::Result<Tensor> {
        match self {
            Embedding::Candle(t) => {
                let ids = Tensor::from_vec(ids.to_vec(), ids.len(), &Device::Cpu)?;
                t.index_select(&ids, 0)
            }
            Embedding::F32(m) => m.gather(ids),
        }
    }

    /// The embedding as a tied LM head's weight.
    fn as_head(&self) -> candle_core::Result<Weight> {
        Ok(match self {
            Embedding::Candle(t) => Weight::Candle(t.t()?),
            Embedding::F32(m) => Weight::F32(m.clone()),
        })
    }
}

/// What [`Decoder::hidden_continued`] carries between calls on one sequence. A clone is a
/// snapshot (its tensors are shared; a later call appends to new ones).
#[derive(Default, Clone)]
pub struct DecoderCache {
    /// Tokens already run (the next one's position).
    pub tokens: usize,
    layers: Vec<LayerCache>,
    /// Drop each layer's state once it is used ([`Decoder::hidden`]'s single call).
    discard: bool,
}

#[derive(Default, Clone)]
struct LayerCache {
    /// Keys and values `[tokens, kv_heads, head_dim]` of an attention layer, where they are
    /// not [`KvRows`] (another compute dtype; transformers' residual window).
    kv: Option<(Tensor, Tensor)>,
    /// The f32 keys and values an attention layer appends to, in place.
    rows: KvRows,
    /// The last rows of `kv` held unrounded: transformers' residual window
    /// ([`super::kv_cache::ResidualWindow`]); 0 under write-then-read.
    raw_tail: usize,
    delta: super::hybrid::DeltaNetState,
}

/// An attention layer's f32 keys and values `[tokens, kv_heads · head_dim]`, appended in place:
/// a decode step adds one row instead of copying the whole cache into a new tensor. A clone
/// (a snapshot of the cache at a turn's start) shares them until either side appends, which
/// then copies once (`Arc::make_mut`).
#[derive(Default, Clone)]
struct KvRows {
    k: std::sync::Arc<Vec<f32>>,
    v: std::sync::Arc<Vec<f32>>,
    /// The keys again, eight positions to a SIMD register, for a single query's scores
    /// ([`super::attention::GroupedKeys`]); kept from the first decode step on (a one-row
    /// append), so a run that only scores windows never holds them.
    grouped: std::sync::Arc<Vec<f32>>,
    /// Positions `grouped` holds (all of them, or 0 before the first decode step).
    grouped_positions: usize,
}

impl KvRows {
    /// Brings `grouped` up to every key row held (`[tokens, kv_heads · d]`).
    fn group_keys(&mut self, kv_heads: usize, d: usize) {
        let width = kv_heads * d;
        let t = self.k.len().checked_div(width).unwrap_or(0);
        if t == self.grouped_positions || width == 0 {
            return;
        }
        let grouped = std::sync::Arc::make_mut(&mut self.grouped);
        super::attention::GroupedKeys::extend(
            grouped,
            &self.k,
            self.grouped_positions,
            kv_heads,
            d,
        );
        self.grouped_positions = t;
    }
}

/// The keys and values attention reads: rows held in place, or tensors.
enum Keys {
    Rows(KvRows),
    Tensors(Tensor, Tensor),
}

pub(super) fn cerr(store: &dyn WeightStore, what: &str) -> impl Fn(candle_core::Error) -> Error {
    let path = store.path().to_owned();
    let what = what.to_owned();
    move |e| Error::runner(&path, format!("{what}: tensor operation failed: {e}"))
}

/// What every part of [`Decoder::load`] reads: the store, the config and the dtypes, so the
/// per-concern loaders share one argument.
struct Loader<'a> {
    store: &'a dyn WeightStore,
    c: &'a ModelConfig,
    dt: DType,
    compute: ComputeDtype,
    recurrent_state: StateDtype,
    /// The hybrid family's norms are zero-centred: x·rsqrt(mean x² + eps)·(1 + w).
    zero_centred: bool,
}

impl Loader<'_> {
    /// A norm weight of `len`, zero-centred where the architecture is.
    fn vector(&self, name: &str, len: usize) -> Result<Tensor> {
        load_vector(self.store, name, len, self.dt, self.zero_centred)
    }

    /// A linear module at the compute dtype, counted in the report.
    fn linear(&self, module: &str, out: usize, inp: usize, report: &mut LoadReport) -> Result<Lin> {
        load_linear(self.store, module, out, inp, self.dt, report)
    }

    /// The token embedding, checked against `[vocab, hidden]`: an F32 matrix in the f32 compute
    /// (so a tied head shares it), a candle tensor otherwise.
    fn embedding(&self, embed_name: &str) -> Result<Embedding> {
        let (store, c, dt) = (self.store, self.c, self.dt);
        let (embed_shape, embed_values) = store.dense_values(embed_name)?;
        if embed_shape != [c.vocab, c.hidden] {
            return Err(Error::format(
                store.path(),
                Some(embed_name),
                format!(
                    "has shape {:?}; the config needs [{}, {}]",
                    embed_shape, c.vocab, c.hidden
                ),
            ));
        }
        Ok(if dt == DType::F32 {
            let m = F32Matrix::new(c.vocab, c.hidden, embed_values)
                .ok_or_else(|| {
                    Error::format(
                        store.path(),
                        Some(embed_name),
                        "values disagree with its shape",
                    )
                })?
                .with_packed(store.packed_rows(embed_name)?)
                .map_err(|e| Error::runner(store.path(), format!("{embed_name}: {e}")))?;
            Embedding::F32(std::sync::Arc::new(m))
        } else {
            Embedding::Candle(
                Tensor::from_vec(embed_values.into_vec(), (c.vocab, c.hidden), &Device::Cpu)
                    .and_then(|t| t.to_dtype(dt))
                    .map_err(cerr(store, embed_name))?,
            )
        })
    }

    /// Layer `i`: its biases checked against the architecture, then its norms, mixer and FFN, in
    /// the order the checks must run.
    fn layer(&self, i: usize, report: &mut LoadReport) -> Result<Layer> {
        let c = self.c;
        let p = format!("{}.layers.{i}", c.prefix);
        let layer_type = c
            .hybrid
            .as_ref()
            .map_or(LayerType::Full, |h| h.layer_types[i]);
        self.check_biases(&p, layer_type)?;
        let attn_norm = self.vector(&format!("{p}.input_layernorm.weight"), c.hidden)?;
        let mixer = match (layer_type, &c.hybrid) {
            (LayerType::Linear, Some(h)) => Mixer::DeltaNet(Box::new(GatedDeltaNet::load(
                self.store,
                &format!("{p}.linear_attn"),
                c,
                h,
                self.compute,
                self.recurrent_state,
                report,
            )?)),
            _ => Mixer::Attention(Box::new(self.attention(i, &p, report)?)),
        };
        Ok(Layer {
            attn_norm,
            mixer,
            mlp_norm: self.vector(&format!("{p}.post_attention_layernorm.weight"), c.hidden)?,
            ffn: self.ffn(i, &p, report)?,
        })
    }

    /// Refuses a bias the declared architecture does not have, or lacks one it has: transformers
    /// would ignore the first and initialize the second at random.
    fn check_biases(&self, p: &str, layer_type: LayerType) -> Result<()> {
        let (store, c) = (self.store, self.c);
        let attention_biases = [
            ("self_attn.q_proj", c.biases.qkv),
            ("self_attn.k_proj", c.biases.qkv),
            ("self_attn.v_proj", c.biases.qkv),
            ("self_attn.o_proj", c.biases.o),
        ];
        let mlp_biases = [
            ("mlp.gate_proj", c.biases.mlp),
            ("mlp.up_proj", c.biases.mlp),
            ("mlp.down_proj", c.biases.mlp),
        ];
        let mut checked = Vec::new();
        if layer_type == LayerType::Full {
            checked.extend(attention_biases);
        }
        checked.extend(mlp_biases);
        for (module, expected) in checked {
            let name = format!("{p}.{module}.bias");
            if store.has(&name) != expected {
                return Err(Error::format(
                    store.path(),
                    Some(&name),
                    format!(
                        "{} in the checkpoint, but the declared architecture `{}` {} it (transformers would {})",
                        if expected { "missing" } else { "present" },
                        c.arch.as_str(),
                        if expected {
                            "has"
                        } else {
                            "has no bias here, so it would not use"
                        },
                        if expected {
                            "initialize it at random"
                        } else {
                            "ignore it"
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Layer `i`'s softmax attention and its KV cache, the cache's quantization noted in the
    /// report.
    fn attention(&self, i: usize, p: &str, report: &mut LoadReport) -> Result<Attention> {
        let (store, c) = (self.store, self.c);
        let attn = format!("{p}.self_attn");
        let (q_out, kv_out) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        // The hybrid family's q_proj carries a per-head output gate beside the query.
        let q_proj_out = if c.arch.is_hybrid() { 2 * q_out } else { q_out };
        // Qwen3 and the hybrid family normalize queries and keys per head; no other
        // architecture here has those weights (another model_type's q_norm is an unread
        // tensor, refused below).
        let norm_opt = |name: String| -> Result<Option<Tensor>> {
            if c.arch.has_qk_norm() {
                self.vector(&name, c.head_dim).map(Some)
            } else {
                Ok(None)
            }
        };
        // The KV cache (and its quantization) exists only in attention layers.
        let kv = store.kv_cache(&attn)?;
        match kv {
            Some(KvQuant::Fp8(s)) => {
                report.kv_cache = Some(format!(
                    "fp8_e4m3 per tensor (emulated; layer {i}: k_scale {}, v_scale {})",
                    s.k_scale, s.v_scale
                ));
            }
            Some(KvQuant::F16) if store.f16_attention_products() => {
                report.kv_cache = Some(
                    "f16 (emulated), no flash attention: Q and the softmax weights rounded to f16 at their products".into(),
                )
            }
            Some(KvQuant::F16) => report.kv_cache = Some("f16 (emulated)".into()),
            // A store never declares a run's scheme; `set_kv_cache` sets it.
            Some(KvQuant::Scheme { .. }) | None => {}
        }
        Ok(Attention {
            q: self.linear(&format!("{attn}.q_proj"), q_proj_out, c.hidden, report)?,
            k: self.linear(&format!("{attn}.k_proj"), kv_out, c.hidden, report)?,
            v: self.linear(&format!("{attn}.v_proj"), kv_out, c.hidden, report)?,
            o: self.linear(&format!("{attn}.o_proj"), c.hidden, q_out, report)?,
            q_norm: norm_opt(format!("{attn}.q_norm.weight"))?,
            k_norm: norm_opt(format!("{attn}.k_norm.weight"))?,
            gated: c.arch.is_hybrid(),
            kv,
            f16_products: store.f16_attention_products(),
            computed_scales: Default::default(),
        })
    }

    /// Layer `i`'s FFN: a mixture of experts where the config makes the layer sparse, the dense
    /// gated MLP otherwise.
    fn ffn(&self, i: usize, p: &str, report: &mut LoadReport) -> Result<Ffn> {
        let c = self.c;
        Ok(match &c.moe {
            Some(m) if m.is_sparse(i) => Ffn::Moe(Box::new(MoeBlock::load(
                self.store,
                &format!("{p}.mlp"),
                m,
                c.hidden,
                self.compute,
                report,
            )?)),
            _ => Ffn::Dense {
                gate: self.linear(
                    &format!("{p}.mlp.gate_proj"),
                    c.intermediate,
                    c.hidden,
                    report,
                )?,
                up: self.linear(
                    &format!("{p}.mlp.up_proj"),
                    c.intermediate,
                    c.hidden,
                    report,
                )?,
                down: self.linear(
                    &format!("{p}.mlp.down_proj"),
                    c.hidden,
                    c.intermediate,
                    report,
                )?,
            },
        })
    }

    /// The output layer: the embedding itself where the config ties them (a stored lm_head only
    /// as its byte-identical copy), the stored lm_head otherwise.
    fn lm_head(&self, embed: &Embedding, embed_name: &str, report: &mut LoadReport) -> Result<Lin> {
        let (store, c) = (self.store, self.c);
        let lm_head_stored = ["lm_head.weight", "lm_head.qweight", "lm_head.weight_packed"]
            .iter()
            .any(|n| store.has(n));
        if c.tie_embeddings {
            // transformers ties: the output layer *is* the embedding, whatever lm_head the files
            // hold. A stored lm_head is accepted only as a byte-identical copy.
            if lm_head_stored
                && store.tensor_sha256("lm_head.weight")? != store.tensor_sha256(embed_name)?
            {
                return Err(Error::format(
                    store.path(),
                    Some("lm_head.weight"),
                    "the config ties the word embeddings (tie_word_embeddings: true), so transformers uses model.embed_tokens.weight as the output layer and ignores this lm_head, which differs from it: the checkpoint and its config disagree",
                ));
            }
            let input = store.tied_head_input(embed_name);
            if input != InputQuant::None {
                *report.activations.entry(input.describe()).or_default() += 1;
            }
            Ok(Lin {
                wt: embed.as_head().map_err(cerr(store, "lm_head"))?,
                bias: None,
                input,
                block_mins: None,
            })
        } else if lm_head_stored {
            self.linear("lm_head", c.vocab, c.hidden, report)
        } else {
            Err(Error::format(
                store.path(),
                Some("lm_head.weight"),
                "missing, and the config does not tie the word embeddings",
            ))
        }
    }

    /// Refuses any tensor left unread (a checkpoint that is not what its config says), after
    /// counting those the architecture skips on purpose, as transformers does.
    fn check_unread(&self, report: &mut LoadReport) -> Result<()> {
        let (store, c) = (self.store, self.c);
        let (skipped, unread): (Vec<String>, Vec<String>) =
            store.unread().into_iter().partition(|n| c.skipped(n));
        report.skipped = skipped.len();
        if let Some(first) = unread.first() {
            return Err(Error::format(
                store.path(),
                Some(first),
                format!(
                    "{} tensor(s) the declared architecture `{}` does not use ({}{}): the checkpoint is not what its config says (another model_type, or tensors the native runner would silently drop)",
                    unread.len(),
                    c.arch.as_str(),
                    unread
                        .iter()
                        .take(5)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                    if unread.len() > 5 { ", ..." } else { "" }
                ),
            ));
        }
        Ok(())
    }
}

impl Decoder {
    pub fn load(
        store: &dyn WeightStore,
        config: ModelConfig,
        compute: ComputeDtype,
        recurrent_state: StateDtype,
    ) -> Result<Decoder> {
        let mut report = LoadReport {
            schemes: Default::default(),
            activations: Default::default(),
            kv_cache: None,
            experts: None,
            skipped: 0,
        };
        let c = &config;
        let ld = Loader {
            store,
            c,
            dt: compute.candle(),
            compute,
            recurrent_state,
            zero_centred: c.arch.is_hybrid(),
        };
        let embed_name = format!("{}.embed_tokens.weight", c.prefix);
        let embed = ld.embedding(&embed_name)?;
        let layers = (0..c.layers)
            .map(|i| ld.layer(i, &mut report))
            .collect::<Result<Vec<_>>>()?;
        if let Some(m) = &c.moe {
            let sparse = (0..c.layers).filter(|&i| m.is_sparse(i)).count();
            report.experts = Some(m.describe(sparse, c.layers));
        }
        let norm = ld.vector(&format!("{}.norm.weight", c.prefix), c.hidden)?;
        let lm_head = ld.lm_head(&embed, &embed_name, &mut report)?;
        ld.check_unread(&mut report)?;
        Ok(Decoder {
            config,
            compute,
            recurrent_state,
            report,
            kv_setting: None,
            prefill_chunk: None,
            kv_checkpoint_scales: false,
            kv_calibrating: Default::default(),
            kv_calibration: Default::default(),
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// Sets every attention layer's KV cache to `setting` (replacing what the checkpoint
    /// declares; Gated DeltaNet layers have no KV cache). Blocked schemes need a head size that is
    /// a multiple of 32, as llama.cpp does; the error says which.
    pub fn set_kv_cache(
        &mut self,
        setting: super::kv_cache::KvCacheSetting,
    ) -> std::result::Result<(), String> {
        let d = self.config.head_dim;
        for s in [setting.k, setting.v] {
            if s.in_groups_of_32() && !d.is_multiple_of(super::kv_cache::BLOCK) {
                return Err(format!(
                    "the KV-cache scheme {s} quantizes blocks of {} values along the head, and this model's head size is {d}",
                    super::kv_cache::BLOCK
                ));
            }
        }
        let (k_rotation, v_rotation) = setting.rotations(d)?;
        let setting = setting.checked_scales()?;
        self.kv_setting = Some(setting);
        *self
            .kv_calibration
            .get_mut()
            .unwrap_or_else(|e| e.into_inner()) = None;
        let mut attention_layers = 0;
        let mut checkpoint_scales = 0;
        for layer in &mut self.layers {
            if let Mixer::Attention(a) = &mut layer.mixer {
                // vLLM's per-tensor fp8 takes the checkpoint's scales where it declares them.
                let (k_scale, v_scale) = match a.kv {
                    Some(KvQuant::Fp8(s)) => {
                        checkpoint_scales += 1;
                        (s.k_scale, s.v_scale)
                    }
                    Some(KvQuant::Scheme {
                        k_scale, v_scale, ..
                    }) => (k_scale, v_scale),
                    _ => (1.0, 1.0),
                };
                a.computed_scales = Default::default();
                a.kv = setting.changes_anything().then_some(KvQuant::Scheme {
                    setting,
                    k_scale,
                    v_scale,
                    k_rotation,
                    v_rotation,
                });
                attention_layers += 1;
            }
        }
        self.kv_checkpoint_scales = checkpoint_scales > 0;
        let scales = if !(setting.k.takes_tensor_scale() || setting.v.takes_tensor_scale()) {
            String::new()
        } else if setting.computed_scales {
            format!(
                "; scales computed from the first forward pass, amax/{} for keys and amax/{} for values (vLLM's calculate_kv_scales)",
                super::kv_cache::K_SCALE_RANGE,
                super::kv_cache::V_SCALE_RANGE
            )
        } else if checkpoint_scales > 0 {
            "; the checkpoint's k_scale and v_scale".to_owned()
        } else {
            "; scales 1.0 (the checkpoint declares none)".to_owned()
        };
        let rotation = match (k_rotation, v_rotation) {
            (None, None) => String::new(),
            (k, v) => {
                let side =
                    |name: &str, n: Option<usize>| n.map(|n| format!("{name} in blocks of {n}"));
                let sides: Vec<String> = [side("Q/K", k), side("V", v)]
                    .into_iter()
                    .flatten()
                    .collect();
                format!("; llama.cpp's Hadamard rotation, {}", sides.join(", "))
            }
        };
        let rotation = match setting.residual {
            Some(w) => format!(
                "{rotation}; transformers' QuantizedCache semantics: the first prefill chunk and a residual window of {} tokens read unrounded, prefill chunks of {}",
                w.length, w.chunk
            ),
            None => rotation,
        };
        self.report.kv_cache = setting.changes_anything().then(|| {
            if setting.k == setting.v {
                format!(
                    "{} (emulated, K and V; {attention_layers} attention layers{scales}{rotation})",
                    setting.k.describe()
                )
            } else {
                format!(
                    "K {}; V {} (emulated; {attention_layers} attention layers{scales}{rotation})",
                    setting.k.describe(),
                    setting.v.describe()
                )
            }
        });
        Ok(())
    }

    /// Computes each attention layer's fp8 scales from one forward pass of `ids`, as vLLM's
    /// `calculate_kv_scales` does on the engine's first batch: layer by layer, each from the keys
    /// and values it receives (so later layers see the earlier layers' rounding), then frozen.
    /// Runs only where the setting computes scales and they are not yet computed; returns
    /// whether it ran. Windows run in parallel, so a runner calls this once, on the first
    /// window, before any other: a window that needs the scales and finds none is an error.
    pub fn calibrate_kv_scales(&self, ids: &[u32]) -> candle_core::Result<bool> {
        if !self.kv_setting.is_some_and(|s| s.computed_scales) {
            return Ok(false);
        }
        let mut done = self
            .kv_calibration
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if done.is_some() {
            return Ok(false);
        }
        use std::sync::atomic::Ordering;
        self.kv_calibrating.store(true, Ordering::SeqCst);
        let pass = self.hidden(ids);
        self.kv_calibrating.store(false, Ordering::SeqCst);
        pass?;
        *done = Some(ids.len());
        Ok(true)
    }

    /// The scales [`Decoder::calibrate_kv_scales`] computed, for the measurement record;
    /// `None` before it ran or where the setting takes none.
    pub fn computed_kv_scales(&self) -> Option<super::kv_cache::ComputedKvScales> {
        use super::kv_cache::{ComputedKvScales, LayerKvScales};
        let tokens = (*self
            .kv_calibration
            .lock()
            .unwrap_or_else(|e| e.into_inner()))?;
        let layers = self
            .layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match &l.mixer {
                Mixer::Attention(a) => a.computed_scales.get().map(|&(k, v)| LayerKvScales {
                    layer: i,
                    k_scale: f64::from(k),
                    v_scale: f64::from(v),
                }),
                _ => None,
            })
            .collect();
        Some(ComputedKvScales { tokens, layers })
    }

    /// The KV-cache schemes the run set ([`Decoder::set_kv_cache`]); `None`: the checkpoint's.
    pub fn kv_cache_setting(&self) -> Option<super::kv_cache::KvCacheSetting> {
        self.kv_setting
    }

    /// How the run's KV cache rounds, for the measurement record: the set scheme, else the
    /// checkpoint's own fp8 declaration; `None` when nothing is rounded.
    pub fn kv_cache_record(&self) -> Option<crate::runner::kv_record::KvCache> {
        use super::kv_cache::{KvCacheSetting, KvScheme};
        let setting = match self.kv_setting {
            Some(s) => s,
            None if self.layers.iter().any(|l| {
                matches!(&l.mixer, Mixer::Attention(a) if matches!(a.kv, Some(KvQuant::Fp8(_))))
            }) =>
            {
                return Some(crate::runner::kv_record::KvCache::as_run(
                    KvCacheSetting::both(KvScheme::Fp8E4m3),
                    true,
                ));
            }
            None => return None,
        };
        setting
            .changes_anything()
            .then(|| crate::runner::kv_record::KvCache::as_run(setting, self.kv_checkpoint_scales))
    }

    /// Whether the model carries a recurrent state from token to token (linear-attention
    /// layers), which [`Decoder::recurrent_state`] applies to.
    pub fn has_recurrent_state(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l.mixer, Mixer::DeltaNet(_)))
    }

    /// The chunk a prefill is cut into under transformers' QuantizedCache semantics (`None`:
    /// any other KV cache, which one pass fills as any number of pieces would).
    pub fn kv_residual_chunk(&self) -> Option<usize> {
        self.kv_setting
            .and_then(|s| s.residual)
            .map(|w| w.chunk as usize)
    }

    /// Prefill every window in pieces of `chunk` tokens (the protocol's `prefill_chunk`), the
    /// KV cache, conv inputs and recurrent state carried between pieces (the recurrent state and
    /// conv inputs stored in [`Decoder::recurrent_state`]'s dtype at each boundary). A KV-cache
    /// scheme with transformers' QuantizedCache semantics has its own prefill chunk: the two
    /// must agree.
    pub fn set_prefill_chunk(&mut self, chunk: Option<usize>) -> std::result::Result<(), String> {
        if chunk == Some(0) {
            return Err("a prefill chunk of 0 tokens".into());
        }
        if let (Some(c), Some(residual)) = (chunk, self.kv_residual_chunk())
            && c != residual
        {
            return Err(format!(
                "the prefill chunk is {c} tokens but the KV-cache scheme's QuantizedCache semantics prefill in chunks of {residual}"
            ));
        }
        self.prefill_chunk = chunk;
        Ok(())
    }

    /// The prefill chunk windows are cut into (`None`: one pass).
    pub fn prefill_chunk(&self) -> Option<usize> {
        self.prefill_chunk.or(self.kv_residual_chunk())
    }

    /// Final hidden states `[n, hidden]` (before the final norm) of one window.
    pub fn hidden(&self, ids: &[u32]) -> candle_core::Result<Tensor> {
        // A chunked prefill (the protocol's, or transformers' QuantizedCache semantics, which
        // are defined per update: one pass would read nothing rounded).
        let chunk = match self.kv_residual_chunk() {
            Some(residual) => Some(residual),
            None => self.prefill_chunk.filter(|&c| c < ids.len()),
        };
        if let Some(chunk) = chunk {
            let mut cache = DecoderCache::default();
            let parts = ids
                .chunks(chunk)
                .map(|part| self.hidden_continued(part, &mut cache))
                .collect::<candle_core::Result<Vec<_>>>()?;
            return Tensor::cat(&parts, 0);
        }
        // Nothing is kept: each layer's keys and values are freed once the layer is done, as
        // before the cache existed (a long window's cache would be gigabytes).
        let mut once = DecoderCache {
            discard: true,
            ..DecoderCache::default()
        };
        self.hidden_continued(ids, &mut once)
    }

    /// Final hidden states of `ids` continuing the tokens `cache` holds (keys and values of the
    /// attention layers, conv inputs and recurrent states of the Gated DeltaNet layers), which
    /// it then holds too: a window prefilled in pieces gives the rows of one prefill.
    pub fn hidden_continued(
        &self,
        ids: &[u32],
        cache: &mut DecoderCache,
    ) -> candle_core::Result<Tensor> {
        let n = ids.len();
        let past = cache.tokens;
        if cache.layers.len() != self.layers.len() {
            cache.layers = self.layers.iter().map(|_| LayerCache::default()).collect();
        }
        let mut x = self.embed.rows(ids)?;
        let (cos, sin) = self.rope_tables(past, n)?;
        let mask = self.mask(past, n)?;
        for (layer, carried) in self.layers.iter().zip(&mut cache.layers) {
            let h = self.norm(&x, &layer.attn_norm)?;
            let mixed = match &layer.mixer {
                Mixer::Attention(a) => self.attention(a, &h, &cos, &sin, &mask, carried)?,
                Mixer::DeltaNet(g) => g.forward_carried(&h, self.compute, &mut carried.delta)?,
            };
            if cache.discard {
                *carried = LayerCache::default();
            }
            x = (x + mixed)?;
            let h = self.norm(&x, &layer.mlp_norm)?;
            x = (x + layer.ffn.forward(&h)?)?;
        }
        cache.tokens += n;
        Ok(x)
    }

    /// An RMSNorm of the model (zero-centred weights were loaded as 1 + w); the hybrid family
    /// computes it in fp32 and casts back, as transformers does.
    fn norm(&self, x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
        let eps = self.config.rms_eps;
        if self.config.arch.is_hybrid() && x.dtype() == DType::BF16 {
            let y = fused::rms_norm(&x.to_dtype(DType::F32)?, &w.to_dtype(DType::F32)?, eps)?;
            return y.to_dtype(DType::BF16);
        }
        fused::rms_norm(x, w, eps)
    }

    /// A layer's computed (k_scale, v_scale): set by the calibration pass from this pass's
    /// keys and values, else read; an error where the run never calibrated (fail closed:
    /// scales of 1.0 would quietly measure another cache).
    fn computed_scales(
        &self,
        layer: &Attention,
        k: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<(f32, f32)> {
        if let Some(s) = layer.computed_scales.get() {
            return Ok(*s);
        }
        if !self
            .kv_calibrating
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(candle_core::Error::Msg(
                "the KV cache computes its scales from the first forward pass, and this run did not calibrate them first".into(),
            ));
        }
        let flat = |t: &Tensor| t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
        let found = super::kv_cache::computed_scales(&flat(k)?, &flat(v)?)
            .map_err(candle_core::Error::Msg)?;
        Ok(*layer.computed_scales.get_or_init(|| found))
    }

    /// One attention block's output (before the residual add) on normed input `h` `[n, hidden]`.
    fn attention(
        &self,
        layer: &Attention,
        h: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        cache: &mut LayerCache,
    ) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let n = h.dim(0)?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let rep = c.heads / c.kv_heads;
        let (q, gate) = if layer.gated {
            // Per head: [query (head_dim), gate (head_dim)].
            let qg = linear(h, &layer.q)?.reshape((n, c.heads, 2 * c.head_dim))?;
            let q = qg.narrow(2, 0, c.head_dim)?.contiguous()?;
            let gate = qg
                .narrow(2, c.head_dim, c.head_dim)?
                .contiguous()?
                .reshape((n, c.heads * c.head_dim))?;
            (q, Some(gate))
        } else {
            (
                linear(h, &layer.q)?.reshape((n, c.heads, c.head_dim))?,
                None,
            )
        };
        let k = linear(h, &layer.k)?.reshape((n, c.kv_heads, c.head_dim))?;
        let v = linear(h, &layer.v)?.reshape((n, c.kv_heads, c.head_dim))?;
        let q = match &layer.q_norm {
            Some(w) => self.norm(&q, w)?,
            None => q,
        };
        let k = match &layer.k_norm {
            Some(w) => self.norm(&k, w)?,
            None => k,
        };
        let (q, k) = if c.rotary_dim == c.head_dim {
            (rope(&q, cos, sin)?, rope(&k, cos, sin)?)
        } else {
            (
                partial_rope(&q, cos, sin, c.rotary_dim)?,
                partial_rope(&k, cos, sin, c.rotary_dim)?,
            )
        };
        let keys = self.cached(layer, k, v, cache)?;
        let q = if layer.f16_products {
            q.to_dtype(DType::F16)?.to_dtype(q.dtype())?
        } else {
            q
        };
        let (k, v) = match keys {
            Keys::Rows(rows) => {
                let t = rows.k.len() / (c.kv_heads * c.head_dim).max(1);
                let grouped =
                    (rows.grouped_positions == t && t > 0).then(|| attention::GroupedKeys {
                        values: &rows.grouped,
                        positions: t,
                    });
                let found = attention::attend_rows(
                    &q,
                    &rows.k,
                    &rows.v,
                    grouped,
                    c.kv_heads,
                    mask,
                    scale,
                    layer.f16_products,
                )?;
                if let Some(o) = found {
                    let o = match &gate {
                        Some(g) => (o * sigmoid(g)?)?,
                        None => o,
                    };
                    return linear(&o, &layer.o);
                }
                let t = rows.k.len() / (c.kv_heads * c.head_dim).max(1);
                let shape = (t, c.kv_heads, c.head_dim);
                (
                    Tensor::from_slice(&rows.k, shape, &Device::Cpu)?,
                    Tensor::from_slice(&rows.v, shape, &Device::Cpu)?,
                )
            }
            Keys::Tensors(k, v) => (k, v),
        };
        let o = match attention::attend(&q, &k, &v, mask, scale, layer.f16_products)? {
            Some(o) => o,
            None => {
                // [heads, n, d]
                let q = q.transpose(0, 1)?.contiguous()?;
                let k = repeat_kv(&k.transpose(0, 1)?, rep)?;
                let v = repeat_kv(&v.transpose(0, 1)?, rep)?;
                let att = fused::softmax_scaled_masked(
                    &super::matmul::fixed_depth_matmul(&q, &k.t()?)?,
                    scale,
                    mask,
                )?;
                let att = if layer.f16_products {
                    att.to_dtype(DType::F16)?.to_dtype(att.dtype())?
                } else {
                    att
                };
                super::matmul::fixed_depth_matmul(&att, &v)?
                    .transpose(0, 1)?
                    .reshape((n, c.heads * c.head_dim))?
            }
        };
        let o = match &gate {
            Some(g) => (o * sigmoid(g)?)?,
            None => o,
        };
        linear(&o, &layer.o)
    }

    /// The keys and values attention reads `[tokens, kv_heads, head_dim]`, this chunk's `k`, `v`
    /// (after RoPE) appended to what `cache` holds, which then holds them as the layer's KV
    /// cache stores them: rounded by its scheme, and under transformers' QuantizedCache
    /// semantics with its unrounded residual window.
    fn cached(
        &self,
        layer: &Attention,
        k: Tensor,
        v: Tensor,
        cache: &mut LayerCache,
    ) -> candle_core::Result<Keys> {
        let (mut k, mut v) = (k, v);
        match layer.kv {
            Some(KvQuant::Fp8(s)) => {
                k = fake_quant_tensor(&k, |d| dequant::fake_quant_fp8_static(d, s.k_scale))?;
                v = fake_quant_tensor(&v, |d| dequant::fake_quant_fp8_static(d, s.v_scale))?;
            }
            Some(KvQuant::F16) => {
                k = k.to_dtype(DType::F16)?.to_dtype(k.dtype())?;
                v = v.to_dtype(DType::F16)?.to_dtype(v.dtype())?;
            }
            Some(KvQuant::Scheme {
                setting,
                k_scale,
                v_scale,
                k_rotation,
                v_rotation,
            }) => {
                let d = self.config.head_dim;
                let (k_scale, v_scale) = if setting.computed_scales {
                    self.computed_scales(layer, &k, &v)?
                } else {
                    (k_scale, v_scale)
                };
                // With llama.cpp's rotation, rounded in the rotated basis and rotated back
                // (the same attention as rotating Q and the output; kv_cache.rs says why).
                use super::kv_cache::rotated;
                let round = |k: &Tensor, v: &Tensor| -> candle_core::Result<(Tensor, Tensor)> {
                    Ok((
                        fake_quant_tensor(k, |x| rotated(setting.k, x, d, k_scale, k_rotation))?,
                        fake_quant_tensor(v, |x| rotated(setting.v, x, d, v_scale, v_rotation))?,
                    ))
                };
                let Some(window) = setting.residual else {
                    // Write-then-read, as llama.cpp's and vLLM's graphs store the chunk's keys
                    // and values in the cache before attention reads them back: every row this
                    // pass attends to is the cache's, its own tokens' included.
                    (k, v) = round(&k, &v)?;
                    return append(cache, k, v);
                };
                // transformers' QuantizedLayer.update, step for step.
                let n = k.dim(0)?;
                let Some((pk, pv)) = cache.kv.take() else {
                    // The first update: stored rounded, read as they are.
                    cache.kv = Some(round(&k, &v)?);
                    cache.raw_tail = 0;
                    return Ok(Keys::Tensors(k, v));
                };
                let k = Tensor::cat(&[&pk, &k], 0)?;
                let v = Tensor::cat(&[&pv, &v], 0)?;
                if cache.raw_tail + n >= window.length as usize {
                    // The window is full: the whole history rounded again, from what attention
                    // reads now.
                    cache.kv = Some(round(&k, &v)?);
                    cache.raw_tail = 0;
                } else {
                    cache.kv = Some((k.clone(), v.clone()));
                    cache.raw_tail += n;
                }
                return Ok(Keys::Tensors(k, v));
            }
            None => {}
        }
        append(cache, k, v)
    }

    /// Logits `[rows.len(), vocab]` (f32, row-major) at the given rows of [`Decoder::hidden`]'s
    /// output: the LM head runs only where rows are scored.
    pub fn logits_at(&self, hidden: &Tensor, rows: &[usize]) -> candle_core::Result<Vec<f32>> {
        let mut out = Vec::new();
        self.logits_into(hidden, rows, &mut out)?;
        Ok(out)
    }

    /// [`Decoder::logits_at`] written into `out` (its allocation reused where it is large enough).
    pub fn logits_into(
        &self,
        hidden: &Tensor,
        rows: &[usize],
        out: &mut Vec<f32>,
    ) -> candle_core::Result<()> {
        self.head_into(&self.normed_at(hidden, rows)?, out)
    }

    /// The LM head's input at the given rows: the final hidden states after the final norm, in the
    /// compute dtype (what a hidden-state reference artifact stores).
    pub fn normed_at(&self, hidden: &Tensor, rows: &[usize]) -> candle_core::Result<Tensor> {
        let rows_t = Tensor::from_vec(
            rows.iter().map(|&r| r as u32).collect::<Vec<_>>(),
            rows.len(),
            &Device::Cpu,
        )?;
        self.norm(&hidden.index_select(&rows_t, 0)?, &self.norm)
    }

    /// Logits `[rows.len(), vocab]` at the given rows in the compute dtype, widened to f64 (an
    /// f64 run's logits without the f32 rounding of [`Decoder::logits_at`]).
    pub fn logits_f64_at(&self, hidden: &Tensor, rows: &[usize]) -> candle_core::Result<Vec<f64>> {
        let normed = self.normed_at(hidden, rows)?;
        let logits = linear(&normed.to_dtype(self.compute.candle())?, &self.lm_head)?;
        logits.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
    }

    /// Logits (f32, row-major) of LM-head inputs `[rows, hidden]`.
    pub fn head(&self, normed: &Tensor) -> candle_core::Result<Vec<f32>> {
        let mut out = Vec::new();
        self.head_into(normed, &mut out)?;
        Ok(out)
    }

    /// [`Decoder::head`] written into `out`.
    fn head_into(&self, normed: &Tensor, out: &mut Vec<f32>) -> candle_core::Result<()> {
        if let (Weight::F32(w), None, InputQuant::None) =
            (&self.lm_head.wt, &self.lm_head.bias, self.lm_head.input)
        {
            // Straight into the caller's rows: no tensor, no copy, no fresh pages per chunk.
            return w.apply_into(&normed.to_dtype(DType::F32)?, out);
        }
        let logits = linear(&normed.to_dtype(self.compute.candle())?, &self.lm_head)?;
        *out = logits
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(())
    }

    /// Logits of LM-head inputs given as f32 rows (`rows.len() / hidden` of them).
    pub fn head_from_rows(&self, rows: Vec<f32>) -> candle_core::Result<Vec<f32>> {
        let n = rows.len() / self.config.hidden.max(1);
        self.head(&Tensor::from_vec(
            rows,
            (n, self.config.hidden),
            &Device::Cpu,
        )?)
    }

    /// cos and sin `[n, rotary_dim]` in the half-split (NeoX / Hugging Face) layout, computed in
    /// f64 (`rotary_dim` is `head_dim` but for the hybrid family's partial RoPE).
    fn rope_tables(&self, start: usize, n: usize) -> candle_core::Result<(Tensor, Tensor)> {
        let inv = self.config.inv_freq();
        let d = self.config.rotary_dim;
        let mut cos = Vec::with_capacity(n * d);
        let mut sin = Vec::with_capacity(n * d);
        // Angles in f64 (engines form them in f32, which drifts at long positions; this runner's
        // lane is the exact math).
        for p in start..start + n {
            for _half in 0..2 {
                for f in &inv {
                    let angle = p as f64 * f;
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        let dt = self.compute.candle();
        let cos = Tensor::from_vec(cos, (n, 1, d), &Device::Cpu)?.to_dtype(dt)?;
        let sin = Tensor::from_vec(sin, (n, 1, d), &Device::Cpu)?.to_dtype(dt)?;
        Ok((cos, sin))
    }

    /// Additive causal mask `[n, past + n]` of `n` new tokens after `past` cached ones (with the
    /// sliding window, if any).
    fn mask(&self, past: usize, n: usize) -> candle_core::Result<Tensor> {
        let window = self.config.sliding_window.unwrap_or(usize::MAX);
        attention::causal_mask(past, n, window)?.to_dtype(self.compute.candle())
    }
}

/// A norm weight `[len]` in the compute dtype (`1 + w`, formed in f64, when zero-centred).
pub(super) fn load_vector(
    store: &dyn WeightStore,
    name: &str,
    len: usize,
    dt: DType,
    zero_centred: bool,
) -> Result<Tensor> {
    let d = store.dense(name)?;
    if d.shape != [len] {
        return Err(Error::format(
            store.path(),
            Some(name),
            format!("has shape {:?}; the config needs [{len}]", d.shape),
        ));
    }
    let t = if zero_centred {
        let w: Vec<f64> = d.data.iter().map(|&w| 1.0 + w as f64).collect();
        Tensor::from_vec(w, len, &Device::Cpu)
    } else {
        Tensor::from_vec(d.data, len, &Device::Cpu)
    };
    t.and_then(|t| t.to_dtype(dt)).map_err(cerr(store, name))
}

/// A linear module, dequantized, checked against the config's `[out, in]`, counted in the report.
pub(super) fn load_linear(
    store: &dyn WeightStore,
    module: &str,
    out: usize,
    inp: usize,
    dt: DType,
    report: &mut LoadReport,
) -> Result<Lin> {
    let l: Linear = store.linear(module)?;
    lin_from(store, module, l, out, inp, dt, report)
}

/// [`load_linear`] on a module already read (and perhaps rearranged) by the caller.
pub(super) fn lin_from(
    store: &dyn WeightStore,
    module: &str,
    l: Linear,
    out: usize,
    inp: usize,
    dt: DType,
    report: &mut LoadReport,
) -> Result<Lin> {
    if (l.out, l.inp) != (out, inp) {
        return Err(Error::format(
            store.path(),
            Some(module),
            format!(
                "weight is [{}, {}]; the config needs [{out}, {inp}]",
                l.out, l.inp
            ),
        ));
    }
    *report.schemes.entry(l.scheme.clone()).or_default() += 1;
    if l.input != InputQuant::None {
        *report.activations.entry(l.input.describe()).or_default() += 1;
    }
    let dev = Device::Cpu;
    let wt = if dt == DType::F32 {
        let m = F32Matrix::new(out, inp, l.weight)
            .ok_or_else(|| {
                Error::format(store.path(), Some(module), "values disagree with its shape")
            })?
            .with_packed(l.packed)
            .map_err(|e| Error::runner(store.path(), format!("{module}: {e}")))?;
        Weight::F32(std::sync::Arc::new(m))
    } else {
        let w = Tensor::from_vec(l.weight.into_vec(), (out, inp), &dev)
            .and_then(|t| t.to_dtype(dt))
            .map_err(cerr(store, module))?;
        Weight::Candle(w.t().map_err(cerr(store, module))?)
    };
    let bias = match l.bias {
        Some(b) => Some(
            Tensor::from_vec(b, out, &dev)
                .and_then(|t| t.to_dtype(dt))
                .map_err(cerr(store, module))?,
        ),
        None => None,
    };
    Ok(Lin {
        wt,
        bias,
        input: l.input,
        block_mins: l.block_mins.map(std::sync::Arc::new),
    })
}

pub(super) fn linear(x: &Tensor, l: &Lin) -> candle_core::Result<Tensor> {
    if let (InputQuant::Ggml(GgmlActivation::Q8_1), Some(mins)) = (l.input, &l.block_mins) {
        return linear_q8_1(x, l, mins);
    }
    let x = match l.input {
        InputQuant::None => x.clone(),
        q => {
            let cols = *x.dims().last().unwrap_or(&1);
            fake_quant_tensor(x, |d| match q {
                InputQuant::None => {}
                InputQuant::Fp8PerToken => dequant::fake_quant_fp8_per_token(d, cols),
                InputQuant::Fp8PerTokenGroup(g) => {
                    dequant::fake_quant_fp8_per_token(d, g.min(cols))
                }
                InputQuant::Fp8Static(s) => dequant::fake_quant_fp8_static(d, s),
                InputQuant::Int8PerToken => dequant::fake_quant_int8_per_token(d, cols),
                InputQuant::Nvfp4 { global_scale } => {
                    dequant::fake_quant_nvfp4(d, cols, global_scale)
                }
                InputQuant::Ggml(g) => g.apply(d, cols),
            })?
        }
    };
    let y = l.wt.apply(&x)?;
    match &l.bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// A Q4_1/Q5_1 weight's product under llama.cpp's Q8_1 input: the rounded activations times the
/// dequantized weight, plus each block's minimum times its sum residual
/// ([`super::llamacpp_cpu::q8_1_with_sum_residuals`]): what ggml's dot product computes.
fn linear_q8_1(x: &Tensor, l: &Lin, mins: &[f32]) -> candle_core::Result<Tensor> {
    use rayon::prelude::*;
    let dims = x.dims().to_vec();
    let cols = *dims.last().unwrap_or(&1);
    let blocks = cols / 32;
    if blocks == 0 || !cols.is_multiple_of(32) || !mins.len().is_multiple_of(blocks) {
        candle_core::bail!(
            "a Q8_1 input of {cols} columns against {} block minimums",
            mins.len()
        );
    }
    let mut data = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let residuals = super::llamacpp_cpu::q8_1_with_sum_residuals(&mut data, cols);
    let rounded = Tensor::from_vec(data, dims, &Device::Cpu)?.to_dtype(x.dtype())?;
    let y = l.wt.apply(&rounded)?;
    let out = mins.len() / blocks;
    let mut correction = vec![0f32; residuals.len() / blocks * out];
    correction
        .par_chunks_mut(out)
        .zip(residuals.par_chunks(blocks))
        .for_each(|(c, r)| {
            for (o, m) in c.iter_mut().zip(mins.chunks_exact(blocks)) {
                *o = m.iter().zip(r).map(|(m, r)| m * r).sum();
            }
        });
    let correction = Tensor::from_vec(correction, y.shape(), &Device::Cpu)?.to_dtype(y.dtype())?;
    let y = (y + correction)?;
    match &l.bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// Quantize-dequantize a tensor's values in f32, keeping its shape and dtype.
/// `k`, `v` appended to the layer's stored keys and values (as stored: after RoPE and any KV
/// rounding), which then hold them: what attention reads. f32 keys go into the rows kept in
/// place; others are concatenated into new tensors.
fn append(cache: &mut LayerCache, k: Tensor, v: Tensor) -> candle_core::Result<Keys> {
    if k.dtype() == DType::F32 && v.dtype() == DType::F32 && cache.kv.is_none() {
        let rows = &mut cache.rows;
        with_f32(&k, |k| {
            std::sync::Arc::make_mut(&mut rows.k).extend_from_slice(k);
            Ok(())
        })?;
        with_f32(&v, |v| {
            std::sync::Arc::make_mut(&mut rows.v).extend_from_slice(v);
            Ok(())
        })?;
        // A decode step (one new row), or rows after one: the single query's grouped keys.
        if let Ok((n, kv_heads, d)) = k.dims3()
            && (n == 1 || rows.grouped_positions > 0)
        {
            rows.group_keys(kv_heads, d);
        }
        return Ok(Keys::Rows(rows.clone()));
    }
    let (k, v) = match cache.kv.take() {
        Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 0)?, Tensor::cat(&[&pv, &v], 0)?),
        None => (k, v),
    };
    cache.kv = Some((k.clone(), v.clone()));
    Ok(Keys::Tensors(k, v))
}

fn fake_quant_tensor(t: &Tensor, f: impl Fn(&mut [f32])) -> candle_core::Result<Tensor> {
    let shape = t.shape().clone();
    let dt = t.dtype();
    let mut data = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    f(&mut data);
    Tensor::from_vec(data, shape, t.device())?.to_dtype(dt)
}

/// Rotary embedding in the half-split layout: x·cos + rotate_half(x)·sin on `[n, heads, d]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let d = x.dim(2)?;
    let x1 = x.narrow(2, 0, d / 2)?;
    let x2 = x.narrow(2, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], 2)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

/// RoPE on the first `rotary` dimensions of each head (rotate-half on that slice), the rest
/// passed through: the hybrid family's partial rotary embedding.
fn partial_rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    rotary: usize,
) -> candle_core::Result<Tensor> {
    let d = x.dim(2)?;
    let rotated = rope(&x.narrow(2, 0, rotary)?, cos, sin)?;
    Tensor::cat(&[&rotated, &x.narrow(2, rotary, d - rotary)?], 2)
}

/// 1 / (1 + exp(−x)).
pub(super) fn sigmoid(x: &Tensor) -> candle_core::Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

/// `[kv_heads, n, d]` → `[kv_heads * rep, n, d]`, head h using kv head h / rep.
fn repeat_kv(x: &Tensor, rep: usize) -> candle_core::Result<Tensor> {
    if rep == 1 {
        return x.contiguous();
    }
    let (kv, n, d) = x.dims3()?;
    x.unsqueeze(1)?
        .expand((kv, rep, n, d))?
        .reshape((kv * rep, n, d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_dtype_names() {
        for (names, d) in [
            (["f32", "float32"], ComputeDtype::F32),
            (["f64", "float64"], ComputeDtype::F64),
            (["bf16", "bfloat16"], ComputeDtype::Bf16),
        ] {
            for name in names {
                assert_eq!(ComputeDtype::from_name(name), Some(d), "{name}");
            }
            assert_eq!(ComputeDtype::from_name(d.as_str()), Some(d));
        }
        assert_eq!(ComputeDtype::from_name("f16"), None);
    }
}
