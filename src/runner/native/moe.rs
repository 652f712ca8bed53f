//! The sparse mixture-of-experts block as transformers computes it for `qwen3_moe`,
//! `qwen3_next` and `qwen3_5_moe` (their `*SparseMoeBlock`), with its configuration keys.
//!
//! Per token: router logits `x · Wᵣᵀ` (in the compute dtype), a softmax over all experts (float32,
//! as transformers' `softmax(..., dtype=torch.float)`; float64 in the f64 mode, which is this lane's
//! exact math), the top-k probabilities, renormalised to sum 1 when `norm_topk_prob` (always for
//! `qwen3_5_moe`), cast back to the compute dtype; the output is Σ wₑ · downₑ(silu(gateₑ x) ·
//! upₑ x) over the chosen experts, plus, in `qwen3_next` / `qwen3_5_moe`, the shared expert's MLP
//! scaled by `sigmoid(shared_expert_gate · x)`.
//!
//! Ties: `torch.topk`'s order among equal probabilities is unspecified, and on CPU it is not the
//! lowest index (torch 2.15: four equal probabilities, k = 2, give experts 2 and 3). Here an exact
//! tie at the k-th place goes to the lower expert index. Ties need bit-equal router probabilities,
//! which trained routers do not produce; where they occur engines disagree with each other too.
//!
//! Dispatch is exact and grouped: the tokens routed to each expert are gathered, that expert runs
//! once on them (three matmuls), and its weighted rows are added back in expert order, as
//! transformers' eager loop does. Experts no token chose are not computed.
//!
//! Expert weights are read per expert by module name (`{mlp}.experts.{e}.{gate,up,down}_proj`,
//! the layout of Hub checkpoints and of `save_pretrained`, which reverts transformers' fused
//! in-memory layout), so quantized experts dequantize through [`WeightStore::linear`] like any
//! linear module and a GGUF store can map the names onto its stacked `ffn_*_exps` tensors. A
//! checkpoint saved with `save_original_format=False` holds the fused 3-D parameters instead
//! (`experts.gate_up_proj` `[E, 2I, H]`, gate in the first half, and `experts.down_proj`
//! `[E, H, I]`); those are split into per-expert matrices at load.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::decoder::{ComputeDtype, Lin, LoadReport, linear};
use super::weights::{InputQuant, WeightStore};
use crate::error::{Error, Result};

/// The most experts one block may declare (Qwen3-Next has 512); a larger count is refused before
/// anything is allocated.
pub const MAX_EXPERTS: usize = 4096;
/// The largest expert or shared-expert width accepted from a config.
pub const MAX_INTERMEDIATE: usize = 1 << 20;

/// Which transformers block the configuration describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeFamily {
    /// `Qwen3MoeSparseMoeBlock`: no shared expert; `norm_topk_prob` (default false).
    Qwen3Moe,
    /// `Qwen3NextSparseMoeBlock`: shared expert with its gate; `norm_topk_prob` (default true).
    Qwen3Next,
    /// `Qwen3_5MoeSparseMoeBlock`: shared expert with its gate; always renormalised; every layer
    /// sparse.
    Qwen35Moe,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoeConfig {
    pub family: MoeFamily,
    pub num_experts: usize,
    /// Experts per token (`num_experts_per_tok`), in `1..=num_experts`.
    pub top_k: usize,
    /// Each expert's width (`moe_intermediate_size`).
    pub intermediate: usize,
    /// Renormalise the top-k probabilities to sum 1.
    pub norm_topk_prob: bool,
    /// The shared expert's width (`shared_expert_intermediate_size`), where the family has one.
    pub shared_intermediate: Option<usize>,
    /// Layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` and `i` is not in
    /// `mlp_only_layers`.
    pub sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
}

impl MoeConfig {
    /// The MoE keys of `config.json` (or its `text_config`), every number range-checked and every
    /// error naming its key. `layers` is `num_hidden_layers`, already validated.
    pub fn from_hf(
        path: &Path,
        config: &Value,
        family: MoeFamily,
        layers: usize,
    ) -> Result<MoeConfig> {
        MoeConfig::from_hf_at(path, config, family, layers, "")
    }

    /// [`MoeConfig::from_hf`] for keys nested under `key_prefix` (`text_config.` in a VLM), which
    /// errors name.
    pub fn from_hf_at(
        path: &Path,
        config: &Value,
        family: MoeFamily,
        layers: usize,
        key_prefix: &str,
    ) -> Result<MoeConfig> {
        let bad = |key: &str, rule: String| {
            Error::format(path, Some(&format!("{key_prefix}{key}")), rule)
        };
        let bounded = |key: &str, v: &Value, max: usize| -> Result<usize> {
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| (1..=max).contains(&n))
                .ok_or_else(|| bad(key, format!("must be an integer in 1..={max}, found {v}")))
        };
        let required = |key: &str, max: usize| -> Result<usize> {
            match config.get(key) {
                None | Some(Value::Null) => Err(bad(
                    key,
                    "missing (a mixture-of-experts config needs it)".into(),
                )),
                Some(v) => bounded(key, v, max),
            }
        };
        // transformers 5 saves Qwen3MoeConfig's `num_experts` under its attribute-map name.
        let num_experts = match (config.get("num_experts"), config.get("num_local_experts")) {
            (Some(a), Some(b)) if !a.is_null() && !b.is_null() && a != b => {
                return Err(bad(
                    "num_experts",
                    format!("{a} disagrees with num_local_experts {b}"),
                ));
            }
            (Some(v), _) if !v.is_null() => bounded("num_experts", v, MAX_EXPERTS)?,
            (_, Some(v)) if !v.is_null() => bounded("num_local_experts", v, MAX_EXPERTS)?,
            _ => {
                return Err(bad(
                    "num_experts",
                    "missing (a mixture-of-experts config needs it)".into(),
                ));
            }
        };
        let top_k = required("num_experts_per_tok", MAX_EXPERTS)?;
        if top_k > num_experts {
            return Err(bad(
                "num_experts_per_tok",
                format!("{top_k} is more than num_experts {num_experts}"),
            ));
        }
        let intermediate = required("moe_intermediate_size", MAX_INTERMEDIATE)?;
        let flag = |key: &str, default: bool| -> Result<bool> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Bool(b)) => Ok(*b),
                Some(v) => Err(bad(key, format!("must be true or false, found {v}"))),
            }
        };
        let norm_topk_prob = match family {
            MoeFamily::Qwen3Moe => flag("norm_topk_prob", false)?,
            MoeFamily::Qwen3Next => flag("norm_topk_prob", true)?,
            // Qwen3_5MoeTopKRouter renormalises whatever the config says.
            MoeFamily::Qwen35Moe => true,
        };
        let shared_intermediate = match family {
            MoeFamily::Qwen3Moe => None,
            MoeFamily::Qwen3Next | MoeFamily::Qwen35Moe => Some(required(
                "shared_expert_intermediate_size",
                MAX_INTERMEDIATE,
            )?),
        };
        let (sparse_step, mlp_only_layers) = if family == MoeFamily::Qwen35Moe {
            (1, Vec::new())
        } else {
            let step = match config.get("decoder_sparse_step") {
                None | Some(Value::Null) => 1,
                Some(v) => bounded("decoder_sparse_step", v, layers.max(1))?,
            };
            let only = match config.get("mlp_only_layers") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| {
                        v.as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .filter(|&n| n < layers)
                            .ok_or_else(|| {
                                bad(
                                    "mlp_only_layers",
                                    format!(
                                        "entry {v} is not a layer index in 0..{layers} (num_hidden_layers)"
                                    ),
                                )
                            })
                    })
                    .collect::<Result<Vec<_>>>()?,
                Some(v) => {
                    return Err(bad(
                        "mlp_only_layers",
                        format!("must be a list of layer indices, found {v}"),
                    ));
                }
            };
            (step, only)
        };
        Ok(MoeConfig {
            family,
            num_experts,
            top_k,
            intermediate,
            norm_topk_prob,
            shared_intermediate,
            sparse_step,
            mlp_only_layers,
        })
    }

    /// Whether layer `i`'s feed-forward block is the sparse MoE block (transformers' rule).
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer) && (layer + 1).is_multiple_of(self.sparse_step)
    }

    /// The block in words, for the measurement's environment record.
    pub fn describe(&self, sparse_layers: usize, layers: usize) -> String {
        format!(
            "{sparse_layers} of {layers} layers sparse: {} experts of width {}, top-{}{}{}; routers and shared-expert gates dense",
            self.num_experts,
            self.intermediate,
            self.top_k,
            if self.norm_topk_prob {
                " renormalised"
            } else {
                ""
            },
            match self.shared_intermediate {
                Some(s) => format!(", shared expert of width {s} with sigmoid gate"),
                None => String::new(),
            }
        )
    }
}

/// A gated SiLU MLP (one expert, or the shared expert).
pub struct Mlp {
    gate: Lin,
    up: Lin,
    down: Lin,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let g = linear(x, &self.gate)?;
        let u = linear(x, &self.up)?;
        linear(&super::fused::silu_mul(&g, &u)?, &self.down)
    }
}

/// One sparse MoE block, loaded.
pub struct MoeBlock {
    /// `[hidden, num_experts]`: the router's `[E, hidden]` weight transposed.
    router: Tensor,
    experts: Vec<Mlp>,
    shared: Option<(Mlp, Tensor)>,
    top_k: usize,
    norm_topk_prob: bool,
    compute: ComputeDtype,
}

fn cerr(path: &Path, what: &str) -> impl Fn(candle_core::Error) -> Error {
    let path = path.to_owned();
    let what = what.to_owned();
    move |e| Error::runner(&path, format!("{what}: tensor operation failed: {e}"))
}

/// A `[out, in]` matrix as the decoder's linear module (`[in, out]` view), no input quantization.
fn dense_lin(
    path: &Path,
    what: &str,
    data: Vec<f32>,
    out: usize,
    inp: usize,
    dt: DType,
) -> Result<Lin> {
    // f32 compute: the matrix every other linear module is, so a fused stack's experts give the
    // bits per-expert tensors give.
    let wt = if dt == DType::F32 {
        let m = super::matmul::F32Matrix::new(out, inp, data.into()).ok_or_else(|| {
            Error::runner(path, format!("{what}: values disagree with [{out}, {inp}]"))
        })?;
        super::matmul::Weight::F32(std::sync::Arc::new(m))
    } else {
        let w = Tensor::from_vec(data, (out, inp), &Device::Cpu)
            .and_then(|t| t.to_dtype(dt))
            .map_err(cerr(path, what))?;
        super::matmul::Weight::Candle(w.t().map_err(cerr(path, what))?)
    };
    Ok(Lin {
        wt,
        bias: None,
        input: InputQuant::None,
        block_mins: None,
    })
}

/// An expert's linear module through the store (dequantized as its format defines), shape-checked
/// and counted by [`super::decoder::lin_from`]; an expert has no bias.
fn store_lin(
    store: &dyn WeightStore,
    module: &str,
    out: usize,
    inp: usize,
    dt: DType,
    report: &mut LoadReport,
) -> Result<Lin> {
    let l = store.linear(module)?;
    if l.bias.is_some() {
        return Err(Error::format(
            store.path(),
            Some(&format!("{module}.bias")),
            "present, but transformers' MoE experts have no bias (it would ignore it)",
        ));
    }
    super::decoder::lin_from(store, module, l, out, inp, dt, report)
}

/// A dense (never quantized) matrix of the exact shape, e.g. a router.
fn dense_matrix(store: &dyn WeightStore, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let d = store.dense(name)?;
    if d.shape != shape {
        return Err(Error::format(
            store.path(),
            Some(name),
            format!("has shape {:?}; the config needs {shape:?}", d.shape),
        ));
    }
    Ok(d.data)
}

impl MoeBlock {
    /// The block of the module `mlp` (`model.layers.N.mlp`) from the store.
    pub fn load(
        store: &dyn WeightStore,
        mlp: &str,
        cfg: &MoeConfig,
        hidden: usize,
        compute: ComputeDtype,
        report: &mut LoadReport,
    ) -> Result<MoeBlock> {
        let dt = compute.candle();
        let path = store.path();
        let (e_n, inter) = (cfg.num_experts, cfg.intermediate);
        let router_name = format!("{mlp}.gate.weight");
        let router = dense_matrix(store, &router_name, &[e_n, hidden])?;
        let router = dense_lin(path, &router_name, router, e_n, hidden, dt)?
            .wt
            .candle()
            .map_err(cerr(path, &router_name))?;
        let fused_gate_up = format!("{mlp}.experts.gate_up_proj");
        let fused_down = format!("{mlp}.experts.down_proj");
        let experts = if store.has(&fused_gate_up) || store.has(&fused_down) {
            if store.has(&format!("{mlp}.experts.0.gate_proj.weight")) {
                return Err(Error::format(
                    path,
                    Some(&fused_gate_up),
                    "the checkpoint holds both fused and per-expert weights for this block",
                ));
            }
            let gate_up = dense_matrix(store, &fused_gate_up, &[e_n, 2 * inter, hidden])?;
            let down = dense_matrix(store, &fused_down, &[e_n, hidden, inter])?;
            let scheme = store.stored_dtype(&fused_gate_up);
            *report.schemes.entry(scheme).or_default() += 3 * e_n;
            let (gu, dn) = (2 * inter * hidden, hidden * inter);
            (0..e_n)
                .map(|e| {
                    let block = &gate_up[e * gu..(e + 1) * gu];
                    let (g, u) = block.split_at(inter * hidden);
                    let name = |p: &str| format!("{mlp}.experts.{e}.{p} (of the fused tensors)");
                    Ok(Mlp {
                        gate: dense_lin(path, &name("gate_proj"), g.to_vec(), inter, hidden, dt)?,
                        up: dense_lin(path, &name("up_proj"), u.to_vec(), inter, hidden, dt)?,
                        down: dense_lin(
                            path,
                            &name("down_proj"),
                            down[e * dn..(e + 1) * dn].to_vec(),
                            hidden,
                            inter,
                            dt,
                        )?,
                    })
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            (0..e_n)
                .map(|e| {
                    let p = format!("{mlp}.experts.{e}");
                    Ok(Mlp {
                        gate: store_lin(
                            store,
                            &format!("{p}.gate_proj"),
                            inter,
                            hidden,
                            dt,
                            report,
                        )?,
                        up: store_lin(store, &format!("{p}.up_proj"), inter, hidden, dt, report)?,
                        down: store_lin(
                            store,
                            &format!("{p}.down_proj"),
                            hidden,
                            inter,
                            dt,
                            report,
                        )?,
                    })
                })
                .collect::<Result<Vec<_>>>()?
        };
        let shared = match cfg.shared_intermediate {
            None => None,
            Some(s) => {
                let p = format!("{mlp}.shared_expert");
                let mlp_s = Mlp {
                    gate: store_lin(store, &format!("{p}.gate_proj"), s, hidden, dt, report)?,
                    up: store_lin(store, &format!("{p}.up_proj"), s, hidden, dt, report)?,
                    down: store_lin(store, &format!("{p}.down_proj"), hidden, s, dt, report)?,
                };
                let gate_name = format!("{mlp}.shared_expert_gate.weight");
                let g = dense_matrix(store, &gate_name, &[1, hidden])?;
                Some((
                    mlp_s,
                    dense_lin(path, &gate_name, g, 1, hidden, dt)?
                        .wt
                        .candle()
                        .map_err(cerr(path, &gate_name))?,
                ))
            }
        };
        Ok(MoeBlock {
            router,
            experts,
            shared,
            top_k: cfg.top_k,
            norm_topk_prob: cfg.norm_topk_prob,
            compute,
        })
    }

    /// Each token's chosen experts and their weights: `routes[t]` is `(expert, weight)` in
    /// descending probability, ties to the lower index.
    pub fn route(&self, x: &Tensor) -> candle_core::Result<Vec<Vec<(usize, f64)>>> {
        let logits = super::matmul::fixed_depth_matmul(x, &self.router)?;
        let wide = if self.compute == ComputeDtype::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let probs = softmax_rows(&logits.to_dtype(wide)?)?;
        let e_n = probs.dim(1)?;
        // Values as the softmax's dtype computed them (f32 exactly, or f64).
        let rows = probs.to_dtype(DType::F64)?.to_vec2::<f64>()?;
        Ok(rows
            .iter()
            .map(|p| {
                let mut order: Vec<usize> = (0..e_n).collect();
                // Stable: equal probabilities keep ascending index order.
                order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
                order.truncate(self.top_k);
                let chosen: Vec<(usize, f64)> = order.iter().map(|&e| (e, p[e])).collect();
                if !self.norm_topk_prob {
                    return chosen;
                }
                if wide == DType::F32 {
                    // The sum and the division in float32, as transformers does them.
                    let sum: f32 = chosen.iter().map(|&(_, w)| w as f32).sum();
                    chosen
                        .into_iter()
                        .map(|(e, w)| (e, f64::from(w as f32 / sum)))
                        .collect()
                } else {
                    let sum: f64 = chosen.iter().map(|&(_, w)| w).sum();
                    chosen.into_iter().map(|(e, w)| (e, w / sum)).collect()
                }
            })
            .collect())
    }

    /// `[n, hidden] -> [n, hidden]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (n, hidden) = x.dims2()?;
        let dt = x.dtype();
        let routes = self.route(x)?;
        // Tokens per expert, in token order, with their weights.
        let mut groups: Vec<(Vec<u32>, Vec<f64>)> =
            vec![(Vec::new(), Vec::new()); self.experts.len()];
        for (t, chosen) in routes.iter().enumerate() {
            for &(e, w) in chosen {
                groups[e].0.push(t as u32);
                groups[e].1.push(w);
            }
        }
        let mut out = Tensor::zeros((n, hidden), dt, x.device())?;
        for (expert, (tokens, weights)) in self.experts.iter().zip(groups) {
            if tokens.is_empty() {
                continue;
            }
            let m = tokens.len();
            let idx = Tensor::from_vec(tokens, m, x.device())?;
            let rows = x.index_select(&idx, 0)?;
            let y = expert.forward(&rows)?;
            // The weight in the compute dtype (transformers casts the router's values to it).
            let w = Tensor::from_vec(weights, (m, 1), x.device())?.to_dtype(dt)?;
            out = out.index_add(&idx, &y.broadcast_mul(&w)?, 0)?;
        }
        if let Some((mlp, gate)) = &self.shared {
            let s = mlp.forward(x)?;
            let g = sigmoid(&super::matmul::fixed_depth_matmul(x, gate)?)?;
            out = (out + s.broadcast_mul(&g)?)?;
        }
        Ok(out)
    }
}

fn softmax_rows(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(1)?;
    e.broadcast_div(&s)
}

fn sigmoid(x: &Tensor) -> candle_core::Result<Tensor> {
    (x.neg()?.exp()? + 1.0)?.recip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::native::weights::{Dense, MemoryStore, SafetensorsStore};
    use serde_json::json;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/moe")
    }

    fn f64s(st: &safetensors::SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<f64>) {
        let t = st.tensor(name).unwrap();
        let data = match t.dtype() {
            safetensors::Dtype::F64 => t
                .data()
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            safetensors::Dtype::F32 => t
                .data()
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            d => panic!("{name}: {d:?}"),
        };
        (t.shape().to_vec(), data)
    }

    fn max_abs(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max)
    }

    /// A block of the fixture file (`next`: Qwen3NextSparseMoeBlock, per-expert names; `q35`:
    /// Qwen3_5MoeSparseMoeBlock, fused 3-D experts) against transformers' own outputs.
    fn block_matches_transformers(prefix: &str, family: MoeFamily, cfg: Value) {
        let dir = fixtures().join("blocks");
        let bytes = std::fs::read(dir.join("blocks.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let (shape, x) = f64s(&st, "input");
        let store = SafetensorsStore::open(&dir, json!({})).unwrap();
        let cfg = MoeConfig::from_hf(path(), &cfg, family, 1).unwrap();
        for (compute, out, tol) in [
            (ComputeDtype::F32, "output_f32", 1e-5),
            (ComputeDtype::F64, "output_f64", 1e-12),
        ] {
            let mut report = LoadReport {
                schemes: Default::default(),
                activations: Default::default(),
                kv_cache: None,
                experts: None,
                skipped: 0,
            };
            let block = MoeBlock::load(&store, prefix, &cfg, 64, compute, &mut report).unwrap();
            let xt = Tensor::from_vec(x.clone(), (shape[0], shape[1]), &Device::Cpu)
                .unwrap()
                .to_dtype(compute.candle())
                .unwrap();
            let y: Vec<f64> = block
                .forward(&xt)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let (_, want) = f64s(&st, &format!("{prefix}.{out}"));
            let d = max_abs(&y, &want);
            assert!(
                d < tol,
                "{prefix} {compute:?}: max |native - transformers| = {d:e}"
            );
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert!(
                scale > 0.1,
                "{prefix}: outputs are not trivially small ({scale})"
            );
        }
    }

    #[test]
    fn qwen3_next_block_with_shared_expert_matches_transformers() {
        // norm_topk_prob false, top-3 of 8, shared expert with its sigmoid gate.
        block_matches_transformers(
            "next",
            MoeFamily::Qwen3Next,
            json!({"num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 48, "norm_topk_prob": false}),
        );
    }

    #[test]
    fn qwen3_5_moe_block_fused_experts_top_k_all_matches_transformers() {
        // top-k = num_experts (every expert runs), always renormalised, fused 3-D tensors.
        block_matches_transformers(
            "q35",
            MoeFamily::Qwen35Moe,
            json!({"num_experts": 4, "num_experts_per_tok": 4, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 40}),
        );
    }

    /// A random qwen3_moe-style block in memory (`e` experts of width 8 over hidden 16).
    fn memory_block(e: usize, k: usize, norm: bool, zero_router: bool) -> (MoeBlock, Tensor) {
        let mut rng = crate::kld::stats::SplitMix64::new(7);
        let mut draw = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.8)
                .collect()
        };
        let mut tensors = BTreeMap::new();
        let mut add = |name: String, shape: Vec<usize>, data: Vec<f32>| {
            tensors.insert(name, Dense { shape, data });
        };
        let (h, i) = (16, 8);
        let router = if zero_router {
            vec![0.0; e * h]
        } else {
            draw(e * h)
        };
        add("m.gate.weight".into(), vec![e, h], router);
        for x in 0..e {
            add(
                format!("m.experts.{x}.gate_proj.weight"),
                vec![i, h],
                draw(i * h),
            );
            add(
                format!("m.experts.{x}.up_proj.weight"),
                vec![i, h],
                draw(i * h),
            );
            add(
                format!("m.experts.{x}.down_proj.weight"),
                vec![h, i],
                draw(h * i),
            );
        }
        let x = Tensor::from_vec(draw(12 * h), (12, h), &Device::Cpu).unwrap();
        let store = MemoryStore {
            name: PathBuf::from("memory"),
            tensors,
        };
        let cfg = MoeConfig::from_hf(
            path(),
            &json!({"num_experts": e, "num_experts_per_tok": k, "moe_intermediate_size": i,
                    "norm_topk_prob": norm}),
            MoeFamily::Qwen3Moe,
            1,
        )
        .unwrap();
        let mut report = LoadReport {
            schemes: Default::default(),
            activations: Default::default(),
            kv_cache: None,
            experts: None,
            skipped: 0,
        };
        let block = MoeBlock::load(&store, "m", &cfg, h, ComputeDtype::F32, &mut report).unwrap();
        assert_eq!(
            report.schemes["f32"],
            3 * e,
            "every expert's three modules are counted"
        );
        (block, x)
    }

    #[test]
    fn grouped_dispatch_equals_each_token_through_its_own_experts() {
        for (k, norm) in [(2, true), (2, false), (5, false), (5, true)] {
            let (block, x) = memory_block(5, k, norm, false);
            let routes = block.route(&x).unwrap();
            let got = block.forward(&x).unwrap().to_vec2::<f32>().unwrap();
            for (t, chosen) in routes.iter().enumerate() {
                assert_eq!(chosen.len(), k);
                let sum: f64 = chosen.iter().map(|c| c.1).sum();
                if norm {
                    assert!(
                        (sum - 1.0).abs() < 1e-6,
                        "renormalised weights sum to {sum}"
                    );
                } else if k < 5 {
                    assert!(sum < 1.0, "softmax top-k without renormalisation: {sum}");
                }
                let row = x.narrow(0, t, 1).unwrap();
                let mut want = vec![0f64; 16];
                for &(e, w) in chosen {
                    let y = block.experts[e]
                        .forward(&row)
                        .unwrap()
                        .to_vec2::<f32>()
                        .unwrap();
                    for (acc, v) in want.iter_mut().zip(&y[0]) {
                        *acc += w * f64::from(*v);
                    }
                }
                for (a, b) in got[t].iter().zip(&want) {
                    assert!((f64::from(*a) - b).abs() < 1e-5, "token {t}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn router_ties_go_to_the_lower_expert_index() {
        // A zero router: every expert equally likely. torch.topk's order here is unspecified
        // (CPU torch 2.15 picks 2 and 3 of four); cardproof takes the lowest indices.
        let (block, x) = memory_block(4, 2, true, true);
        for chosen in block.route(&x).unwrap() {
            assert_eq!(chosen, vec![(0, 0.5), (1, 0.5)]);
        }
        let (block, x) = memory_block(4, 2, false, true);
        for chosen in block.route(&x).unwrap() {
            assert_eq!(chosen, vec![(0, 0.25), (1, 0.25)]);
        }
    }

    /// The tiny qwen3_moe of the fixture (3 layers, layer 1 dense) against transformers' forward,
    /// through the native runner's loader and decoder.
    #[test]
    fn qwen3_moe_rows_match_transformers_in_f32_and_f64() {
        let bytes = std::fs::read(fixtures().join("qwen3-moe.rows.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let ids_t = st.tensor("input_ids").unwrap();
        let [windows, ctx] = ids_t.shape()[..] else {
            panic!("input_ids is not 2-D")
        };
        let ids: Vec<u32> = ids_t
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect();
        for (compute, name, tol) in [
            (ComputeDtype::F32, "logprobs_f32", 1e-4),
            (ComputeDtype::F64, "logprobs_f64", 1e-9),
        ] {
            let model = crate::runner::native::load(
                &fixtures().join("qwen3-moe"),
                compute,
                crate::runner::native::Emulate::ReferenceSemantics,
                crate::runner::native::delta_rule::StateDtype::F32,
            )
            .unwrap();
            let d = &model.decoder;
            assert_eq!(d.config.arch.as_str(), "qwen3_moe");
            let experts = d.report.experts.as_deref().unwrap();
            assert!(
                experts.starts_with("2 of 3 layers sparse: 8 experts"),
                "{experts}"
            );
            let (_, want) = f64s(&st, name);
            let vocab = d.config.vocab;
            let rows: Vec<usize> = (0..ctx).collect();
            let mut worst = 0f64;
            for w in 0..windows {
                let hidden = d.hidden(&ids[w * ctx..(w + 1) * ctx]).unwrap();
                let logits = d.logits_f64_at(&hidden, &rows).unwrap();
                for (r, row) in logits.chunks_exact(vocab).enumerate() {
                    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                    let lp: Vec<f64> = row.iter().map(|v| v - lse).collect();
                    let off = (w * ctx + r) * vocab;
                    let reference = &want[off..off + vocab];
                    worst = worst.max(max_abs(&lp, reference));
                    let top =
                        |v: &[f64]| (0..vocab).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
                    assert_eq!(
                        top(&lp),
                        top(reference),
                        "{name}: top-1 of window {w} row {r}"
                    );
                }
            }
            assert!(
                worst < tol,
                "{name}: max |native - transformers| = {worst:e}"
            );
        }
    }

    fn path() -> &'static Path {
        Path::new("config.json")
    }

    fn qwen3_moe() -> Value {
        json!({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [1]})
    }

    #[test]
    fn reads_the_moe_keys_and_the_sparse_layers() {
        let c = MoeConfig::from_hf(path(), &qwen3_moe(), MoeFamily::Qwen3Moe, 3).unwrap();
        assert_eq!((c.num_experts, c.top_k, c.intermediate), (8, 2, 32));
        assert!(c.norm_topk_prob && c.shared_intermediate.is_none());
        assert_eq!(
            (0..3).map(|i| c.is_sparse(i)).collect::<Vec<_>>(),
            [true, false, true]
        );
        let mut v = qwen3_moe();
        v["decoder_sparse_step"] = json!(2);
        v["mlp_only_layers"] = json!([]);
        let c = MoeConfig::from_hf(path(), &v, MoeFamily::Qwen3Moe, 4).unwrap();
        assert_eq!(
            (0..4).map(|i| c.is_sparse(i)).collect::<Vec<_>>(),
            [false, true, false, true]
        );
    }

    #[test]
    fn transformers_5_num_local_experts_is_read_and_must_agree() {
        let mut v = qwen3_moe();
        v.as_object_mut().unwrap().remove("num_experts");
        v["num_local_experts"] = json!(8);
        let c = MoeConfig::from_hf(path(), &v, MoeFamily::Qwen3Moe, 3).unwrap();
        assert_eq!(c.num_experts, 8);
        v["num_experts"] = json!(16);
        let e = MoeConfig::from_hf(path(), &v, MoeFamily::Qwen3Moe, 3).unwrap_err();
        assert!(
            e.to_string()
                .contains("num_experts: 16 disagrees with num_local_experts 8"),
            "{e}"
        );
    }

    #[test]
    fn family_defaults_follow_transformers() {
        let mut v = qwen3_moe();
        v.as_object_mut().unwrap().remove("norm_topk_prob");
        assert!(
            !MoeConfig::from_hf(path(), &v, MoeFamily::Qwen3Moe, 3)
                .unwrap()
                .norm_topk_prob
        );
        v["shared_expert_intermediate_size"] = json!(48);
        let n = MoeConfig::from_hf(path(), &v, MoeFamily::Qwen3Next, 3).unwrap();
        assert!(n.norm_topk_prob);
        assert_eq!(n.shared_intermediate, Some(48));
        v["norm_topk_prob"] = json!(false);
        let q = MoeConfig::from_hf(path(), &v, MoeFamily::Qwen35Moe, 3).unwrap();
        assert!(q.norm_topk_prob, "Qwen3_5MoeTopKRouter always renormalises");
        assert!(
            (0..3).all(|i| q.is_sparse(i)),
            "every qwen3_5_moe layer is sparse"
        );
    }

    #[test]
    fn hostile_moe_numbers_are_refused_naming_the_key() {
        for (key, value, says) in [
            (
                "num_experts",
                json!(0),
                "num_experts: must be an integer in 1..=4096, found 0",
            ),
            (
                "num_experts",
                json!(1u64 << 40),
                "num_experts: must be an integer in 1..=4096",
            ),
            ("num_experts", json!(-3), "num_experts: must be an integer"),
            (
                "num_experts_per_tok",
                json!(9),
                "num_experts_per_tok: 9 is more than num_experts 8",
            ),
            (
                "num_experts_per_tok",
                json!(0),
                "num_experts_per_tok: must be an integer in 1..=",
            ),
            (
                "moe_intermediate_size",
                json!(1.5),
                "moe_intermediate_size: must be an integer",
            ),
            (
                "moe_intermediate_size",
                json!(1u64 << 30),
                "moe_intermediate_size: must be an integer in 1..=1048576",
            ),
            (
                "decoder_sparse_step",
                json!(0),
                "decoder_sparse_step: must be an integer in 1..=3",
            ),
            (
                "mlp_only_layers",
                json!([0, 7]),
                "mlp_only_layers: entry 7 is not a layer index in 0..3",
            ),
            (
                "mlp_only_layers",
                json!("1"),
                "mlp_only_layers: must be a list of layer indices",
            ),
            (
                "norm_topk_prob",
                json!("yes"),
                "norm_topk_prob: must be true or false",
            ),
        ] {
            let mut v = qwen3_moe();
            v[key] = value;
            let e = MoeConfig::from_hf(path(), &v, MoeFamily::Qwen3Moe, 3).unwrap_err();
            assert!(e.is_format(), "{key}: {e}");
            assert!(e.to_string().contains(says), "{key}: {e}");
        }
        let mut v = qwen3_moe();
        v.as_object_mut().unwrap().remove("moe_intermediate_size");
        let e = MoeConfig::from_hf(path(), &v, MoeFamily::Qwen3Moe, 3).unwrap_err();
        assert!(
            e.to_string().contains("moe_intermediate_size: missing"),
            "{e}"
        );
        let e = MoeConfig::from_hf(path(), &qwen3_moe(), MoeFamily::Qwen3Next, 3).unwrap_err();
        assert!(
            e.to_string()
                .contains("shared_expert_intermediate_size: missing"),
            "{e}"
        );
    }
}
