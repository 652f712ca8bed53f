//! The Gated DeltaNet token mixer of the hybrid Qwen3.5 / Qwen3.6 and Qwen3-Next models, as
//! transformers' `Qwen3_5GatedDeltaNet` computes it (see docs/DESIGN.md, "The hybrid layers"):
//!
//! 1. `in_proj_qkv(x)` → a depthwise causal conv1d over time (kernel `linear_conv_kernel_dim`,
//!    no bias, left zero padding) → SiLU → split into q, k `[Hk, dk]` and v `[Hv, dv]`;
//! 2. `β = sigmoid(in_proj_b(x))`, `g = −exp(A_log) · softplus(in_proj_a(x) + dt_bias)`;
//! 3. the gated delta rule ([`super::delta_rule`]; it L2-normalises q and k and scales q);
//! 4. the gated RMSNorm per value head: `w · rmsnorm(o)` (plain weight, cast back to the input
//!    dtype first) times `silu(z)`, `z = in_proj_z(x)`, in fp32;
//! 5. `out_proj`.
//!
//! Everything from the conv to the gated norm runs in f32 (f64 in an f64 run): transformers keeps
//! that math in fp32 whatever the model's dtype. A bf16 run rounds where transformers casts to
//! bf16 (the conv and its SiLU, β, the delta rule's output, the normed value before and after its
//! weight, the gated output).
//!
//! Qwen3-Next fuses the projections per key head: `in_proj_qkvz` holds, for each key head,
//! `[q (dk), k (dk), v (r·dv), z (r·dv)]` and `in_proj_ba` `[b (r), a (r)]` with
//! `r = Hv / Hk`; [`unfuse_qkvz`] and [`unfuse_ba`] rearrange the rows into Qwen3.5's separate
//! layout once at load, so one forward serves both.

use candle_core::{Device, Tensor, WithDType};
use rayon::prelude::*;

use super::config::{Hybrid, ModelConfig};
use super::decoder::{ComputeDtype, Lin, LoadReport, lin_from, linear, load_linear};
use super::delta_rule::{self, DeltaFloat, DeltaRuleShape, StateDtype};
use super::weights::{Linear, WeightStore};
use crate::error::{Error, Result};

/// One Gated DeltaNet layer, loaded.
pub struct GatedDeltaNet {
    qkv: Lin,
    z: Lin,
    b: Lin,
    a: Lin,
    out: Lin,
    /// `[conv_dim, kernel]`, f64.
    conv: Vec<f64>,
    kernel: usize,
    /// `A_log` and `dt_bias`, one per value head.
    a_log: Vec<f64>,
    dt_bias: Vec<f64>,
    /// The gated norm's weight `[dv]` (plain, not zero-centred).
    norm: Vec<f64>,
    eps: f64,
    shape: Shape,
    state_dtype: StateDtype,
}

#[derive(Debug, Clone, Copy)]
struct Shape {
    key_heads: usize,
    value_heads: usize,
    key_dim: usize,
    value_dim: usize,
}

impl GatedDeltaNet {
    /// Load `{module}.*` (e.g. `model.layers.0.linear_attn`).
    pub fn load(
        store: &dyn WeightStore,
        module: &str,
        c: &ModelConfig,
        h: &Hybrid,
        compute: ComputeDtype,
        state_dtype: StateDtype,
        report: &mut LoadReport,
    ) -> Result<GatedDeltaNet> {
        let dt = compute.candle();
        let (hk, hv, dk, dv) = (h.key_heads, h.value_heads, h.key_dim, h.value_dim);
        let value_width = hv * dv;
        let conv_dim = h.conv_dim();
        let projections: &[&str] = if h.fused_projections {
            &["in_proj_qkvz", "in_proj_ba", "out_proj"]
        } else {
            &[
                "in_proj_qkv",
                "in_proj_z",
                "in_proj_b",
                "in_proj_a",
                "out_proj",
            ]
        };
        for p in projections {
            let bias = format!("{module}.{p}.bias");
            if store.has(&bias) {
                return Err(Error::format(
                    store.path(),
                    Some(&bias),
                    format!(
                        "present in the checkpoint, but `{}` builds this projection without a bias (transformers would ignore it)",
                        c.arch.as_str()
                    ),
                ));
            }
        }
        let (qkv, z, b, a) = if h.fused_projections {
            let name = format!("{module}.in_proj_qkvz");
            let qkvz = store.linear(&name)?;
            let (qkv, z) = unfuse_qkvz(store, &name, qkvz, h, c.hidden)?;
            let name_ba = format!("{module}.in_proj_ba");
            let ba = store.linear(&name_ba)?;
            let (b, a) = unfuse_ba(store, &name_ba, ba, h, c.hidden)?;
            (
                lin_from(store, &name, qkv, conv_dim, c.hidden, dt, report)?,
                lin_from(store, &name, z, value_width, c.hidden, dt, report)?,
                lin_from(store, &name_ba, b, hv, c.hidden, dt, report)?,
                lin_from(store, &name_ba, a, hv, c.hidden, dt, report)?,
            )
        } else {
            let l = |p: &str, out: usize, report: &mut LoadReport| {
                load_linear(store, &format!("{module}.{p}"), out, c.hidden, dt, report)
            };
            (
                l("in_proj_qkv", conv_dim, report)?,
                l("in_proj_z", value_width, report)?,
                l("in_proj_b", hv, report)?,
                l("in_proj_a", hv, report)?,
            )
        };
        let out = load_linear(
            store,
            &format!("{module}.out_proj"),
            c.hidden,
            value_width,
            dt,
            report,
        )?;
        let dense = |suffix: &str, shapes: &[&[usize]]| -> Result<Vec<f64>> {
            let name = format!("{module}.{suffix}");
            let d = store.dense(&name)?;
            if !shapes.iter().any(|s| d.shape == *s) {
                return Err(Error::format(
                    store.path(),
                    Some(&name),
                    format!("has shape {:?}; the config needs {:?}", d.shape, shapes[0]),
                ));
            }
            Ok(d.data.iter().map(|&v| v as f64).collect())
        };
        let k = h.conv_kernel;
        // nn.Conv1d(groups=conv_dim) stores [conv_dim, 1, kernel]; a squeezed copy is accepted.
        let conv = dense("conv1d.weight", &[&[conv_dim, 1, k], &[conv_dim, k]])?;
        if store.has(&format!("{module}.conv1d.bias")) {
            return Err(Error::format(
                store.path(),
                Some(&format!("{module}.conv1d.bias")),
                "present in the checkpoint, but the Gated DeltaNet's convolution has no bias",
            ));
        }
        let a_log = dense("A_log", &[&[hv]])?;
        let dt_bias = dense("dt_bias", &[&[hv]])?;
        let norm = dense("norm.weight", &[&[dv]])?;
        Ok(GatedDeltaNet {
            qkv,
            z,
            b,
            a,
            out,
            conv,
            kernel: k,
            a_log,
            dt_bias,
            norm,
            eps: c.rms_eps,
            shape: Shape {
                key_heads: hk,
                value_heads: hv,
                key_dim: dk,
                value_dim: dv,
            },
            state_dtype,
        })
    }

    /// The layer's output `[n, hidden]` (before the residual add) on normed input `x`, from a
    /// fresh state.
    pub fn forward(&self, x: &Tensor, compute: ComputeDtype) -> candle_core::Result<Tensor> {
        self.forward_carried(x, compute, &mut DeltaNetState::default())
    }

    /// The layer's output continuing from `carried` (the conv inputs and recurrent state the
    /// tokens before left; empty for a fresh sequence), which is updated to the state after `x`.
    pub fn forward_carried(
        &self,
        x: &Tensor,
        compute: ComputeDtype,
        carried: &mut DeltaNetState,
    ) -> candle_core::Result<Tensor> {
        match compute {
            ComputeDtype::F64 => self.forward_in::<f64>(x, |v| v, carried),
            ComputeDtype::F32 => self.forward_in::<f32>(x, |v| v, carried),
            ComputeDtype::Bf16 => {
                self.forward_in::<f32>(x, |v| half::bf16::from_f32(v).to_f32(), carried)
            }
        }
    }

    /// The forward in the working float `W`; `round` is the cast to the model's dtype and back
    /// (identity unless the run is bf16).
    fn forward_in<W: Work>(
        &self,
        x: &Tensor,
        round: fn(W) -> W,
        carried: &mut DeltaNetState,
    ) -> candle_core::Result<Tensor> {
        let Shape {
            key_heads: hk,
            value_heads: hv,
            key_dim: dk,
            value_dim: dv,
        } = self.shape;
        let n = x.dim(0)?;
        let dt = x.dtype();
        let rows = |t: Tensor| -> candle_core::Result<Vec<W>> {
            t.to_dtype(<W as WithDType>::DTYPE)?
                .flatten_all()?
                .to_vec1::<W>()
        };
        let width = 2 * hk * dk + hv * dv;
        // The conv reads the kernel − 1 inputs before this call's first token (zeros when fresh).
        let history = self.kernel - 1;
        let mut mixed: Vec<W> = if carried.conv.len() == history * width {
            carried.conv.iter().map(|&e| W::w_from(e)).collect()
        } else {
            vec![W::default(); history * width]
        };
        mixed.extend(rows(linear(x, &self.qkv)?)?);
        carried.conv = mixed[mixed.len() - history * width..]
            .iter()
            .map(|&e| e.w_to())
            .collect();
        let conv = self.causal_conv_silu(&mixed, history + n, width, round);
        let conv = &conv[history * width..];
        let (mut q, mut k, mut v) = (
            Vec::with_capacity(n * hk * dk),
            Vec::with_capacity(n * hk * dk),
            Vec::with_capacity(n * hv * dv),
        );
        for t in 0..n {
            let row = &conv[t * width..(t + 1) * width];
            q.extend_from_slice(&row[..hk * dk]);
            k.extend_from_slice(&row[hk * dk..2 * hk * dk]);
            v.extend_from_slice(&row[2 * hk * dk..]);
        }
        let b = rows(linear(x, &self.b)?)?;
        let a = rows(linear(x, &self.a)?)?;
        let one = W::w_from(1.0);
        let mut beta = Vec::with_capacity(n * hv);
        let mut g = Vec::with_capacity(n * hv);
        for t in 0..n {
            for h in 0..hv {
                let i = t * hv + h;
                beta.push(round(one / (one + (W::w_from(0.0) - b[i]).w_exp())));
                let decay = W::w_from(self.a_log[h]).w_exp();
                let s = softplus(a[i] + W::w_from(self.dt_bias[h]));
                g.push(W::w_from(0.0) - decay * s);
            }
        }
        let mut state: Vec<W> = if carried.recurrent.len() == hv * dk * dv {
            carried.recurrent.iter().map(|&e| W::w_from(e)).collect()
        } else {
            vec![W::default(); hv * dk * dv]
        };
        let o = delta_rule::chunked(
            DeltaRuleShape {
                tokens: n,
                key_heads: hk,
                value_heads: hv,
                key_dim: dk,
                value_dim: dv,
            },
            &q,
            &k,
            &v,
            &g,
            &beta,
            &mut state,
        )
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        // What the layer carries to its next call is stored in the state dtype, as an engine
        // stores its SSM state at the end of a prefill chunk or a decode step (the kernel keeps
        // it in full precision inside the call).
        carried.recurrent = state
            .iter()
            .map(|&e| e.w_to().round_state(self.state_dtype))
            .collect();
        for e in &mut carried.conv {
            *e = e.round_state(self.state_dtype);
        }
        let z = rows(linear(x, &self.z)?)?;
        // The gated RMSNorm, one (token, value head) row per task: the same operations in the
        // same order as one loop, so the result does not depend on the threads.
        let mut normed = vec![W::default(); n * hv * dv];
        let eps = W::w_from(self.eps);
        let norm = &self.norm;
        normed
            .par_chunks_mut(dv)
            .zip(o.par_chunks(dv))
            .zip(z.par_chunks(dv))
            .for_each(|((out, head), zs)| {
                let mut ss = W::default();
                for &e in head {
                    let e = round(e);
                    ss += e * e;
                }
                let inv = one / (ss / W::w_from(dv as f64) + eps).w_sqrt();
                for (((dst, &e), &w), &zv) in out.iter_mut().zip(head).zip(norm).zip(zs) {
                    let y = round(round(round(e) * inv) * W::w_from(w));
                    let silu = zv / (one + (W::w_from(0.0) - zv).w_exp());
                    *dst = round(y * silu);
                }
            });
        let normed = Tensor::from_vec(normed, (n, hv * dv), &Device::Cpu)?.to_dtype(dt)?;
        linear(&normed, &self.out)
    }

    /// Depthwise causal convolution over time (zero left padding of `kernel − 1`) then SiLU, on
    /// `[n, width]` rows.
    fn causal_conv_silu<W: Work>(
        &self,
        x: &[W],
        n: usize,
        width: usize,
        round: fn(W) -> W,
    ) -> Vec<W> {
        let k = self.kernel;
        let one = W::w_from(1.0);
        let weights: Vec<W> = self.conv.iter().map(|&w| W::w_from(w)).collect();
        let mut out = vec![W::default(); n * width];
        // One time step per task (each output depends only on inputs): the same operations
        // in the same order as one loop.
        out.par_chunks_mut(width).enumerate().for_each(|(t, row)| {
            for (ch, dst) in row.iter_mut().enumerate() {
                let w = &weights[ch * k..(ch + 1) * k];
                let mut acc = W::default();
                for (j, &wj) in w.iter().enumerate() {
                    // Tap j reads position t + j − (k − 1).
                    if let Some(src) = (t + j).checked_sub(k - 1) {
                        acc += wj * x[src * width + ch];
                    }
                }
                let acc = round(acc);
                *dst = round(acc / (one + (W::w_from(0.0) - acc).w_exp()));
            }
        });
        out
    }
}

/// What a Gated DeltaNet layer carries from one call to the next, widened to f64 (exact for the
/// f32 and f64 working floats): the last `kernel − 1` conv inputs `[kernel − 1, conv width]` and
/// the recurrent state `[value heads, dk, dv]`. Empty for a fresh sequence.
#[derive(Debug, Clone, Default)]
pub struct DeltaNetState {
    pub conv: Vec<f64>,
    pub recurrent: Vec<f64>,
}

/// log(1 + eˣ), with torch's threshold: x itself above 20.
fn softplus<W: Work>(x: W) -> W {
    if x.w_to() > 20.0 {
        x
    } else {
        x.w_exp().w_ln_1p()
    }
}

/// The working float of the layer (f32, or f64 in an f64 run). Its own method names, because
/// `DeltaFloat` and candle's `WithDType` both define `from_f64` / `to_f64`.
trait Work: DeltaFloat + WithDType + PartialOrd + Default {
    fn w_from(v: f64) -> Self;
    fn w_to(self) -> f64;
    fn w_exp(self) -> Self;
    fn w_sqrt(self) -> Self;
    fn w_ln_1p(self) -> Self;
}

impl Work for f32 {
    fn w_from(v: f64) -> f32 {
        v as f32
    }
    fn w_to(self) -> f64 {
        self as f64
    }
    fn w_exp(self) -> f32 {
        self.exp()
    }
    fn w_sqrt(self) -> f32 {
        self.sqrt()
    }
    fn w_ln_1p(self) -> f32 {
        self.ln_1p()
    }
}

impl Work for f64 {
    fn w_from(v: f64) -> f64 {
        v
    }
    fn w_to(self) -> f64 {
        self
    }
    fn w_exp(self) -> f64 {
        self.exp()
    }
    fn w_sqrt(self) -> f64 {
        self.sqrt()
    }
    fn w_ln_1p(self) -> f64 {
        self.ln_1p()
    }
}

/// Rows `[out, in]` of a dequantized weight, picked by index.
fn pick_rows(l: &Linear, rows: &[usize]) -> Linear {
    let mut weight = Vec::with_capacity(rows.len() * l.inp);
    for &r in rows {
        weight.extend_from_slice(&l.weight[r * l.inp..(r + 1) * l.inp]);
    }
    Linear {
        out: rows.len(),
        inp: l.inp,
        weight: weight.into(),
        bias: l
            .bias
            .as_ref()
            .map(|b| rows.iter().map(|&r| b[r]).collect()),
        input: l.input,
        scheme: l.scheme.clone(),
        block_mins: l.block_mins.as_ref().map(|m| {
            let per = m.len() / l.out.max(1);
            rows.iter()
                .flat_map(|&r| m[r * per..(r + 1) * per].iter().copied())
                .collect()
        }),
        // Rows picked out of the file's tensor are not its stored rows.
        packed: None,
    }
}

fn fused_shape_error(
    store: &dyn WeightStore,
    module: &str,
    l: &Linear,
    out: usize,
    hidden: usize,
) -> Error {
    Error::format(
        store.path(),
        Some(module),
        format!(
            "weight is [{}, {}]; the config needs [{out}, {hidden}]",
            l.out, l.inp
        ),
    )
}

/// Qwen3-Next's `in_proj_qkvz` (per key head `[q dk, k dk, v r·dv, z r·dv]`) as Qwen3.5's
/// `in_proj_qkv` (`[all q, all k, all v]`) and `in_proj_z`, as transformers'
/// `fix_query_key_value_ordering` splits it.
pub fn unfuse_qkvz(
    store: &dyn WeightStore,
    module: &str,
    l: Linear,
    h: &Hybrid,
    hidden: usize,
) -> Result<(Linear, Linear)> {
    let (hk, dk, dv) = (h.key_heads, h.key_dim, h.value_dim);
    let r = h.value_heads / hk;
    let group = 2 * dk + 2 * r * dv;
    if (l.out, l.inp) != (hk * group, hidden) {
        return Err(fused_shape_error(store, module, &l, hk * group, hidden));
    }
    let block = |g: usize, from: usize, len: usize| (g * group + from)..(g * group + from + len);
    let mut qkv_rows = Vec::with_capacity(h.conv_dim());
    for g in 0..hk {
        qkv_rows.extend(block(g, 0, dk));
    }
    for g in 0..hk {
        qkv_rows.extend(block(g, dk, dk));
    }
    for g in 0..hk {
        qkv_rows.extend(block(g, 2 * dk, r * dv));
    }
    let z_rows: Vec<usize> = (0..hk)
        .flat_map(|g| block(g, 2 * dk + r * dv, r * dv))
        .collect();
    Ok((pick_rows(&l, &qkv_rows), pick_rows(&l, &z_rows)))
}

/// Qwen3-Next's `in_proj_ba` (per key head `[b r, a r]`) as `in_proj_b` and `in_proj_a`.
pub fn unfuse_ba(
    store: &dyn WeightStore,
    module: &str,
    l: Linear,
    h: &Hybrid,
    hidden: usize,
) -> Result<(Linear, Linear)> {
    let hk = h.key_heads;
    let r = h.value_heads / hk;
    if (l.out, l.inp) != (hk * 2 * r, hidden) {
        return Err(fused_shape_error(store, module, &l, hk * 2 * r, hidden));
    }
    let b_rows: Vec<usize> = (0..hk).flat_map(|g| g * 2 * r..g * 2 * r + r).collect();
    let a_rows: Vec<usize> = (0..hk)
        .flat_map(|g| g * 2 * r + r..(g + 1) * 2 * r)
        .collect();
    Ok((pick_rows(&l, &b_rows), pick_rows(&l, &a_rows)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::native::config::LayerType;
    use crate::runner::native::weights::InputQuant;
    use std::path::PathBuf;

    /// A `[rows, 1]` weight whose row r holds r, to see where each row lands.
    fn numbered(rows: usize) -> Linear {
        Linear {
            out: rows,
            inp: 1,
            weight: (0..rows).map(|r| r as f32).collect::<Vec<_>>().into(),
            bias: None,
            input: InputQuant::None,
            scheme: "f32".into(),
            block_mins: None,
            packed: None,
        }
    }

    fn store() -> crate::runner::native::weights::MemoryStore {
        crate::runner::native::weights::MemoryStore {
            name: PathBuf::from("memory"),
            tensors: Default::default(),
        }
    }

    #[test]
    fn unfusing_follows_qwen3_next_per_key_head_layout() {
        // 2 key heads of dim 2, 4 value heads (2 per key head) of dim 1: per key head the
        // fused rows are [q q k k v v z z] and [b b a a].
        let h = Hybrid {
            layer_types: vec![LayerType::Linear],
            conv_kernel: 4,
            key_heads: 2,
            value_heads: 4,
            key_dim: 2,
            value_dim: 1,
            fused_projections: true,
            mamba_ssm_dtype: None,
            mrope_section: None,
        };
        let rows = |l: &Linear| l.weight.iter().map(|&w| w as usize).collect::<Vec<_>>();
        let (qkv, z) = unfuse_qkvz(&store(), "m", numbered(16), &h, 1).unwrap();
        assert_eq!(rows(&qkv), [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13]);
        assert_eq!(rows(&z), [6, 7, 14, 15]);
        let (b, a) = unfuse_ba(&store(), "m", numbered(8), &h, 1).unwrap();
        assert_eq!(rows(&b), [0, 1, 4, 5]);
        assert_eq!(rows(&a), [2, 3, 6, 7]);
        let e = unfuse_qkvz(&store(), "m", numbered(15), &h, 1).unwrap_err();
        assert!(e.to_string().contains("the config needs [16, 1]"), "{e}");
    }

    #[test]
    fn softplus_follows_torch_threshold() {
        assert_eq!(softplus(25.0f64), 25.0);
        assert!((softplus(0.0f64) - std::f64::consts::LN_2).abs() < 1e-15);
        assert!((softplus(-30.0f32) - (-30.0f32).exp()).abs() < 1e-20);
    }

    /// The benchmarks' synthetic hybrid model (benches/native.rs) loads through the real
    /// loader and runs: a tensor it forgets or misnames would fail here, not in a bench.
    #[test]
    fn the_synthetic_hybrid_model_loads_and_its_chunked_prefill_matches_a_split_one() {
        use crate::runner::native::config::{Arch, ModelConfig};
        use crate::runner::native::decoder::{ComputeDtype, Decoder, DecoderCache};
        let config = ModelConfig {
            arch: Arch::Qwen3_5Text,
            hidden: 32,
            intermediate: 48,
            layers: 4,
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            vocab: 64,
            rms_eps: 1e-6,
            rope_theta: 1e7,
            rope_scaling: None,
            tie_embeddings: false,
            sliding_window: None,
            max_positions: Some(4096),
            biases: Default::default(),
            rotary_dim: 4,
            prefix: "model".into(),
            moe: None,
            hybrid: Some(Hybrid {
                layer_types: vec![
                    LayerType::Linear,
                    LayerType::Linear,
                    LayerType::Linear,
                    LayerType::Full,
                ],
                conv_kernel: 4,
                key_heads: 2,
                value_heads: 4,
                key_dim: 8,
                value_dim: 8,
                fused_projections: false,
                mamba_ssm_dtype: None,
                mrope_section: None,
            }),
        };
        let store = crate::runner::native::weights::synthetic(&config, 3);
        let d = Decoder::load(&store, config, ComputeDtype::F64, StateDtype::F32).unwrap();
        let ids: Vec<u32> = (0..150u32).map(|i| (i * 37) % 64).collect();
        let rows: Vec<usize> = (0..ids.len()).collect();
        let whole = d.logits_at(&d.hidden(&ids).unwrap(), &rows).unwrap();
        assert!(whole.iter().all(|x| x.is_finite()));
        let mut cache = DecoderCache::default();
        let mut split = Vec::new();
        for part in [&ids[..70], &ids[70..]] {
            let h = d.hidden_continued(part, &mut cache).unwrap();
            let r: Vec<usize> = (0..part.len()).collect();
            split.extend(d.logits_at(&h, &r).unwrap());
        }
        let worst = whole
            .iter()
            .zip(&split)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "split prefill differs by {worst}");
    }
}
