//! The decoder forward pass (Llama, Mistral, Qwen2, Qwen3) on candle's CPU tensors, written out
//! rather than taken from candle-transformers so that declared activation and KV-cache
//! quantization can be emulated at the exact points the engines apply them (see docs/DESIGN.md).

use candle_core::{DType, Device, Tensor};

use super::config::ModelConfig;
use super::delta_rule::StateDtype;
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
    fn candle(self) -> DType {
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

struct Lin {
    /// `[in, out]` view of the `[out, in]` weight.
    wt: Tensor,
    bias: Option<Tensor>,
    input: InputQuant,
}

struct Layer {
    attn_norm: Tensor,
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    mlp_norm: Tensor,
    gate: Lin,
    up: Lin,
    down: Lin,
    kv: Option<KvQuant>,
}

/// What was loaded and how: for the measurement's environment record.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadReport {
    /// Weight storage schemes and how many linear modules use each.
    pub schemes: std::collections::BTreeMap<String, usize>,
    /// Emulated activation quantization and how many modules use each.
    pub activations: std::collections::BTreeMap<String, usize>,
    pub kv_cache: Option<String>,
}

pub struct Decoder {
    pub config: ModelConfig,
    pub compute: ComputeDtype,
    /// The dtype the carried recurrent (Gated DeltaNet) state is rounded to: read by hybrid
    /// layers; this dense decoder has no recurrent state and ignores it.
    pub recurrent_state: StateDtype,
    pub report: LoadReport,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Lin,
}

fn cerr(store: &dyn WeightStore, what: &str) -> impl Fn(candle_core::Error) -> Error {
    let path = store.path().to_owned();
    let what = what.to_owned();
    move |e| Error::runner(&path, format!("{what}: tensor operation failed: {e}"))
}

impl Decoder {
    pub fn load(
        store: &dyn WeightStore,
        config: ModelConfig,
        compute: ComputeDtype,
        recurrent_state: StateDtype,
    ) -> Result<Decoder> {
        let dt = compute.candle();
        let dev = Device::Cpu;
        let mut report = LoadReport {
            schemes: Default::default(),
            activations: Default::default(),
            kv_cache: None,
        };
        let vector = |name: &str, len: usize| -> Result<Tensor> {
            let d = store.dense(name)?;
            if d.shape != [len] {
                return Err(Error::format(
                    store.path(),
                    Some(name),
                    format!("has shape {:?}; the config needs [{len}]", d.shape),
                ));
            }
            Tensor::from_vec(d.data, len, &dev)
                .and_then(|t| t.to_dtype(dt))
                .map_err(cerr(store, name))
        };
        let linear =
            |module: &str, out: usize, inp: usize, report: &mut LoadReport| -> Result<Lin> {
                let l: Linear = store.linear(module)?;
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
                let w = Tensor::from_vec(l.weight, (out, inp), &dev)
                    .and_then(|t| t.to_dtype(dt))
                    .map_err(cerr(store, module))?;
                let bias = match l.bias {
                    Some(b) => Some(
                        Tensor::from_vec(b, out, &dev)
                            .and_then(|t| t.to_dtype(dt))
                            .map_err(cerr(store, module))?,
                    ),
                    None => None,
                };
                Ok(Lin {
                    wt: w.t().map_err(cerr(store, module))?,
                    bias,
                    input: l.input,
                })
            };
        let c = &config;
        let embed_d = store.dense("model.embed_tokens.weight")?;
        if embed_d.shape != [c.vocab, c.hidden] {
            return Err(Error::format(
                store.path(),
                Some("model.embed_tokens.weight"),
                format!(
                    "has shape {:?}; the config needs [{}, {}]",
                    embed_d.shape, c.vocab, c.hidden
                ),
            ));
        }
        let embed = Tensor::from_vec(embed_d.data, (c.vocab, c.hidden), &dev)
            .and_then(|t| t.to_dtype(dt))
            .map_err(cerr(store, "model.embed_tokens.weight"))?;
        let (q_out, kv_out) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut layers = Vec::with_capacity(c.layers);
        for i in 0..c.layers {
            let p = format!("model.layers.{i}");
            let attn = format!("{p}.self_attn");
            // Qwen3 normalizes queries and keys per head; no other architecture here has those
            // weights (another model_type's q_norm is an unread tensor, refused below).
            let norm_opt = |name: String| -> Result<Option<Tensor>> {
                if c.arch == super::config::Arch::Qwen3 {
                    vector(&name, c.head_dim).map(Some)
                } else {
                    Ok(None)
                }
            };
            for (module, expected) in [
                ("self_attn.q_proj", c.biases.qkv),
                ("self_attn.k_proj", c.biases.qkv),
                ("self_attn.v_proj", c.biases.qkv),
                ("self_attn.o_proj", c.biases.o),
                ("mlp.gate_proj", c.biases.mlp),
                ("mlp.up_proj", c.biases.mlp),
                ("mlp.down_proj", c.biases.mlp),
            ] {
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
            let kv = store.kv_cache(&attn)?;
            match kv {
                Some(KvQuant::Fp8(s)) => {
                    report.kv_cache = Some(format!(
                        "fp8_e4m3 per tensor (emulated; layer {i}: k_scale {}, v_scale {})",
                        s.k_scale, s.v_scale
                    ));
                }
                Some(KvQuant::F16) => report.kv_cache = Some("f16 (emulated)".into()),
                None => {}
            }
            layers.push(Layer {
                attn_norm: vector(&format!("{p}.input_layernorm.weight"), c.hidden)?,
                q: linear(&format!("{attn}.q_proj"), q_out, c.hidden, &mut report)?,
                k: linear(&format!("{attn}.k_proj"), kv_out, c.hidden, &mut report)?,
                v: linear(&format!("{attn}.v_proj"), kv_out, c.hidden, &mut report)?,
                o: linear(&format!("{attn}.o_proj"), c.hidden, q_out, &mut report)?,
                q_norm: norm_opt(format!("{attn}.q_norm.weight"))?,
                k_norm: norm_opt(format!("{attn}.k_norm.weight"))?,
                mlp_norm: vector(&format!("{p}.post_attention_layernorm.weight"), c.hidden)?,
                gate: linear(
                    &format!("{p}.mlp.gate_proj"),
                    c.intermediate,
                    c.hidden,
                    &mut report,
                )?,
                up: linear(
                    &format!("{p}.mlp.up_proj"),
                    c.intermediate,
                    c.hidden,
                    &mut report,
                )?,
                down: linear(
                    &format!("{p}.mlp.down_proj"),
                    c.hidden,
                    c.intermediate,
                    &mut report,
                )?,
                kv,
            });
        }
        let norm = vector("model.norm.weight", c.hidden)?;
        let lm_head_stored = ["lm_head.weight", "lm_head.qweight", "lm_head.weight_packed"]
            .iter()
            .any(|n| store.has(n));
        let lm_head = if c.tie_embeddings {
            // transformers ties: the output layer *is* the embedding, whatever lm_head the files
            // hold. A stored lm_head is accepted only as a byte-identical copy.
            if lm_head_stored
                && store.tensor_sha256("lm_head.weight")?
                    != store.tensor_sha256("model.embed_tokens.weight")?
            {
                return Err(Error::format(
                    store.path(),
                    Some("lm_head.weight"),
                    "the config ties the word embeddings (tie_word_embeddings: true), so transformers uses model.embed_tokens.weight as the output layer and ignores this lm_head, which differs from it: the checkpoint and its config disagree",
                ));
            }
            Lin {
                wt: embed.t().map_err(cerr(store, "lm_head"))?,
                bias: None,
                input: InputQuant::None,
            }
        } else if lm_head_stored {
            linear("lm_head", c.vocab, c.hidden, &mut report)?
        } else {
            return Err(Error::format(
                store.path(),
                Some("lm_head.weight"),
                "missing, and the config does not tie the word embeddings",
            ));
        };
        let unread = store.unread();
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
        Ok(Decoder {
            config,
            compute,
            recurrent_state,
            report,
            embed,
            layers,
            norm,
            lm_head,
        })
    }

    /// Whether the model carries a recurrent state from token to token (linear-attention
    /// layers), which [`Decoder::recurrent_state`] applies to. This dense decoder has none.
    pub fn has_recurrent_state(&self) -> bool {
        false
    }

    /// Final hidden states `[n, hidden]` (before the final norm) of one window.
    pub fn hidden(&self, ids: &[u32]) -> candle_core::Result<Tensor> {
        let c = &self.config;
        let n = ids.len();
        let dev = Device::Cpu;
        let ids_t = Tensor::from_vec(ids.to_vec(), n, &dev)?;
        let mut x = self.embed.index_select(&ids_t, 0)?;
        let (cos, sin) = self.rope_tables(n)?;
        let mask = self.mask(n)?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let rep = c.heads / c.kv_heads;
        for layer in &self.layers {
            let h = rms_norm(&x, &layer.attn_norm, c.rms_eps)?;
            let q = linear(&h, &layer.q)?.reshape((n, c.heads, c.head_dim))?;
            let k = linear(&h, &layer.k)?.reshape((n, c.kv_heads, c.head_dim))?;
            let v = linear(&h, &layer.v)?.reshape((n, c.kv_heads, c.head_dim))?;
            let q = match &layer.q_norm {
                Some(w) => rms_norm(&q, w, c.rms_eps)?,
                None => q,
            };
            let k = match &layer.k_norm {
                Some(w) => rms_norm(&k, w, c.rms_eps)?,
                None => k,
            };
            let q = rope(&q, &cos, &sin)?;
            let mut k = rope(&k, &cos, &sin)?;
            let mut v = v;
            match layer.kv {
                Some(KvQuant::Fp8(s)) => {
                    k = fake_quant_tensor(&k, |d| dequant::fake_quant_fp8_static(d, s.k_scale))?;
                    v = fake_quant_tensor(&v, |d| dequant::fake_quant_fp8_static(d, s.v_scale))?;
                }
                Some(KvQuant::F16) => {
                    k = k.to_dtype(DType::F16)?.to_dtype(k.dtype())?;
                    v = v.to_dtype(DType::F16)?.to_dtype(v.dtype())?;
                }
                None => {}
            }
            // [heads, n, d]
            let q = q.transpose(0, 1)?.contiguous()?;
            let k = repeat_kv(&k.transpose(0, 1)?, rep)?;
            let v = repeat_kv(&v.transpose(0, 1)?, rep)?;
            let att = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&mask)?;
            let att = softmax_last(&att)?;
            let o = att
                .matmul(&v)?
                .transpose(0, 1)?
                .reshape((n, c.heads * c.head_dim))?;
            x = (x + linear(&o, &layer.o)?)?;
            let h = rms_norm(&x, &layer.mlp_norm, c.rms_eps)?;
            let g = linear(&h, &layer.gate)?;
            let u = linear(&h, &layer.up)?;
            let a = (g.silu()? * u)?;
            x = (x + linear(&a, &layer.down)?)?;
        }
        Ok(x)
    }

    /// Logits `[rows.len(), vocab]` (f32, row-major) at the given rows of [`Decoder::hidden`]'s
    /// output: the LM head runs only where rows are scored.
    pub fn logits_at(&self, hidden: &Tensor, rows: &[usize]) -> candle_core::Result<Vec<f32>> {
        self.head(&self.normed_at(hidden, rows)?)
    }

    /// The LM head's input at the given rows: the final hidden states after the final norm, in the
    /// compute dtype (what a hidden-state reference artifact stores).
    pub fn normed_at(&self, hidden: &Tensor, rows: &[usize]) -> candle_core::Result<Tensor> {
        let rows_t = Tensor::from_vec(
            rows.iter().map(|&r| r as u32).collect::<Vec<_>>(),
            rows.len(),
            &Device::Cpu,
        )?;
        rms_norm(
            &hidden.index_select(&rows_t, 0)?,
            &self.norm,
            self.config.rms_eps,
        )
    }

    /// Logits (f32, row-major) of LM-head inputs `[rows, hidden]`.
    pub fn head(&self, normed: &Tensor) -> candle_core::Result<Vec<f32>> {
        let logits = linear(&normed.to_dtype(self.compute.candle())?, &self.lm_head)?;
        logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
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

    /// cos and sin `[n, head_dim]` in the half-split (NeoX / Hugging Face) layout, computed in f64.
    fn rope_tables(&self, n: usize) -> candle_core::Result<(Tensor, Tensor)> {
        let inv = self.config.inv_freq();
        let d = self.config.head_dim;
        let mut cos = Vec::with_capacity(n * d);
        let mut sin = Vec::with_capacity(n * d);
        // Angles in f64 (engines form them in f32, which drifts at long positions; this runner's
        // lane is the exact math).
        for p in 0..n {
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

    /// Additive causal mask `[n, n]` (with the sliding window, if any).
    fn mask(&self, n: usize) -> candle_core::Result<Tensor> {
        let window = self.config.sliding_window.unwrap_or(usize::MAX);
        let m: Vec<f32> = (0..n)
            .flat_map(|i| {
                (0..n).map(move |j| {
                    if j > i || i - j >= window {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            })
            .collect();
        Tensor::from_vec(m, (n, n), &Device::Cpu)?.to_dtype(self.compute.candle())
    }
}

fn linear(x: &Tensor, l: &Lin) -> candle_core::Result<Tensor> {
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
    let y = x.matmul(&l.wt)?;
    match &l.bias {
        Some(b) => y.broadcast_add(b),
        None => Ok(y),
    }
}

/// Quantize-dequantize a tensor's values in f32, keeping its shape and dtype.
fn fake_quant_tensor(t: &Tensor, f: impl Fn(&mut [f32])) -> candle_core::Result<Tensor> {
    let shape = t.shape().clone();
    let dt = t.dtype();
    let mut data = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    f(&mut data);
    Tensor::from_vec(data, shape, t.device())?.to_dtype(dt)
}

/// x / sqrt(mean(x²) + eps) * w over the last dimension.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let last = x.rank() - 1;
    let ms = x.sqr()?.mean_keepdim(last)?;
    let r = (ms + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&r)?.broadcast_mul(w)
}

/// Rotary embedding in the half-split layout: x·cos + rotate_half(x)·sin on `[n, heads, d]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let d = x.dim(2)?;
    let x1 = x.narrow(2, 0, d / 2)?;
    let x2 = x.narrow(2, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], 2)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
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

fn softmax_last(x: &Tensor) -> candle_core::Result<Tensor> {
    let last = x.rank() - 1;
    let max = x.max_keepdim(last)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(last)?;
    e.broadcast_div(&s)
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
