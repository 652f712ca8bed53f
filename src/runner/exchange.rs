//! The transformers runner's exchange as types: the request cardproof writes
//! (`request.json`) and the record the Python program answers with (`record.json`). Their JSON
//! Schemas (`schema/runner-request-v1.schema.json`, `schema/runner-record-v1.schema.json`) are
//! generated from these types; the program (the package runners/transformers_runner/, its
//! `protocol` module) is the other side.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::runner::native::generate::{Generated, GenerationTiming, Stop};

/// `request.json`: what to run.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "cardproof transformers runner request v1")]
pub struct RunnerRequest {
    /// The exchange's version; the program refuses another.
    #[schemars(extend("const" = crate::runner::transformers::PROTOCOL))]
    pub protocol: u64,
    pub models: RequestModels,
    /// `bfloat16`, `float16` or `float32`.
    pub dtype: String,
    /// `cuda`, `cuda:N`, `auto` or `cpu`.
    pub device: String,
    /// Tokens per prefill chunk (0: planned).
    pub chunk_size: usize,
    /// Rows per output-head chunk (0: planned).
    pub head_rows: usize,
    pub tf32: bool,
    pub deterministic: bool,
    pub trust_remote_code: bool,
    pub memory_limit_bytes: Option<u64>,
    /// `auto`, `side_by_side` or `sequential`.
    pub mode: String,
    /// `auto`, `device`, `host` or `disk`; the program reads an absent one (a request written
    /// before the field, the same protocol) as `auto`.
    #[serde(default = "keep_hidden_auto")]
    pub keep_hidden: String,
    /// Run the sanity gates on the first window.
    pub gates: bool,
    pub dump: Option<RequestDump>,
    /// Logit entries per row to reduce.
    pub vocab_size: usize,
    pub runs: Vec<RequestRun>,
    pub result_dir: String,
    pub record_path: String,
    /// Greedy turns each model generates after its scoring (`--turns`; null or absent, from a
    /// cardproof before the field: none).
    #[serde(default)]
    pub turns: Option<RequestTurns>,
}

fn keep_hidden_auto() -> String {
    "auto".into()
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RequestModels {
    pub reference: RequestModel,
    pub candidate: RequestModel,
    /// A study's arms: several candidates measured in turn against one reference pass (the
    /// runner then keeps the reference's hidden states for all of them and answers `arms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arms: Option<Vec<RequestModel>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RequestModel {
    /// A study arm's name, for the runner's messages (absent: the reference or the candidate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub path: String,
    pub attn_implementation: String,
    /// The KV-cache schemes the runner applies where the model writes its cache (write-then-
    /// read); absent: the model dtype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<RequestKvCache>,
    /// The dtype the carried recurrent (linear-attention) state and conv inputs are stored in
    /// after each cached forward pass (`bf16`, `f16`; absent: as the model keeps them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recurrent_state: Option<String>,
    /// The Gated DeltaNet kernel the model's linear-attention layers are held to (`fla`,
    /// `fla_recurrent`, `torch`; absent: transformers' own choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gdn_kernel: Option<String>,
}

/// Keys' and values' KV-cache schemes, by cardproof's names (`q8_0`, `int8_per_token_head`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RequestKvCache {
    pub k: String,
    pub v: String,
    /// `hadamard`: llama.cpp's rotation of the quantized sides (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<String>,
    /// `computed`: the per-tensor fp8 sides' scales computed from the first forward pass
    /// (vLLM's calculate_kv_scales; absent: 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales: Option<String>,
    /// `quantized_cache_residual`: transformers' QuantizedCache semantics (absent:
    /// write-then-read), with its residual length and the model's prefill chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semantics: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual_length: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_chunk: Option<u32>,
}

/// The turns to generate: every turn's prompt (little-endian u32 token ids, the prompts one
/// after another in `tokens_file`, `prompt_lengths` tokens each), the token ids a turn stops at,
/// the most tokens a turn generates (the stop token included) and the logit entries that are
/// tokens (the argmax reads no other).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestTurns {
    pub tokens_file: String,
    pub prompt_lengths: Vec<usize>,
    pub stops: Vec<u32>,
    pub max_new_tokens: usize,
    pub used: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RequestDump {
    pub dir: String,
    pub rows: usize,
}

/// One context length: its windows' token ids (little-endian u32, `n_windows` x
/// `context_length`) and the rows to score in each.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RequestRun {
    pub context_length: usize,
    pub tokens_file: String,
    pub n_windows: usize,
    /// The rows scored in every window (increasing), when every window scores the same rows.
    pub rows: Vec<usize>,
    /// Per window, the rows scored, when they differ from window to window (a role or span
    /// policy over a conversation); `rows` is then empty. A window with no row is not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_rows: Option<Vec<Vec<usize>>>,
}

/// `record.json`: what the program did, or why it failed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[schemars(title = "cardproof transformers runner record v1")]
pub struct RunnerRecord {
    /// The request's protocol; cardproof refuses a record in another.
    #[schemars(extend("const" = crate::runner::transformers::PROTOCOL))]
    pub protocol: u64,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RecordError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<RunnerEnvironment>,
    #[serde(default)]
    pub runs: Vec<RecordRun>,
    /// The gates' raw numbers (absent or null: not asked for).
    #[serde(default)]
    pub gates: Option<GateNumbers>,
    /// For a request with `models.arms`: each arm's runs, model record and seconds, in the
    /// request's order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arms: Option<Vec<RecordArm>>,
    /// For a request with `turns`: the reference's generated turns, and a single candidate's
    /// (each arm of a study has its own in `arms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<RecordTurns>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecordArm {
    pub runs: Vec<RecordRun>,
    /// The arm's model as it ran (the candidate's record of a single pair).
    pub model: serde_json::Value,
    pub seconds: f64,
    /// The arm's generated turns, for a request with `turns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<RecordTurnSet>,
}

/// The generated turns of the reference and of a single candidate (`null` in a study).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordTurns {
    pub reference: RecordTurnSet,
    #[serde(default)]
    pub candidate: Option<RecordTurnSet>,
}

/// One model's generated turns, in the request's order, how it generated them and the
/// seconds it took.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordTurnSet {
    pub engine: TurnEngine,
    pub seconds: f64,
    /// Where the time went: the prompts' prefill (tokens run, seconds) and the turns' decode
    /// (tokens generated, seconds), each region timed to a device synchronization (absent: a
    /// runner program older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<GenerationTiming>,
    pub turns: Vec<RecordTurn>,
}

/// One generated turn: its token ids (the stop token included) and why it ended.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordTurn {
    pub tokens: Vec<u64>,
    pub stop: Stop,
}

/// How one model generated its turns in the transformers runner: the same model object,
/// attention implementation and KV-cache scheme its scoring used, greedy over float32 logits
/// (`torch.argmax`: the first index of the maximum), and how prompts shared their prefill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnEngine {
    /// The attention implementation in use.
    pub attention: String,
    /// The dtype the model ran in.
    pub dtype: String,
    /// The KV-cache scheme the cache rounded with (`null`: the model dtype).
    pub kv_cache: Option<String>,
    pub prefix_reuse: PrefixReuse,
    /// Prompt tokens run through the model over every turn (the prompts' total, less what the
    /// reuse saved).
    pub prefilled_tokens: u64,
}

/// How a model's turn prompts shared their prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PrefixReuse {
    /// Plain attention layers: the cache cropped after each turn to the prompt's common prefix
    /// with the next prompt, which is prefilled from there.
    Crop,
    /// A cache that cannot be rolled back (linear-attention state, sliding windows,
    /// QuantizedCache's residual): copied at each prompt's end; a next prompt that extends the
    /// prompt continues the copy, any other is prefilled afresh (the native runner's rule).
    Snapshot,
    /// A cache that cannot be copied: every prompt prefilled afresh.
    None,
}

/// What a request's `turns` asked for, kept to check the answer against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnAsk {
    pub prompts: Vec<Vec<u32>>,
    pub stops: Vec<u32>,
    pub max_new_tokens: usize,
    pub used: usize,
}

impl RecordTurnSet {
    /// The turns as generated, checked against `ask`: one per prompt, every id one of the
    /// `used` tokens, no turn over the budget, each stop reason what its tokens show (a stop
    /// token last and nowhere before it; `max_tokens` exactly at the budget), the prefill count
    /// no more than the prompts hold, the timing's counts the engine's prefill and the turns'
    /// tokens, its seconds finite and not negative. `Err` says which turn and what is wrong.
    pub fn checked(self, ask: &TurnAsk) -> Result<(Vec<Generated>, TurnEngine), String> {
        if self.turns.len() != ask.prompts.len() {
            return Err(format!(
                "{} generated turns for the {} prompts asked",
                self.turns.len(),
                ask.prompts.len()
            ));
        }
        let prompt_tokens: u64 = ask.prompts.iter().map(|p| p.len() as u64).sum();
        if self.engine.prefilled_tokens > prompt_tokens {
            return Err(format!(
                "{} prompt tokens prefilled, and the prompts hold {prompt_tokens}",
                self.engine.prefilled_tokens
            ));
        }
        if !(self.seconds.is_finite() && self.seconds >= 0.0) {
            return Err(format!("the turns took {} seconds", self.seconds));
        }
        if let Some(t) = &self.timing {
            let generated: usize = self.turns.iter().map(|t| t.tokens.len()).sum();
            if t.prefill_tokens as u64 != self.engine.prefilled_tokens {
                return Err(format!(
                    "timing.prefill_tokens {} is not engine.prefilled_tokens {}",
                    t.prefill_tokens, self.engine.prefilled_tokens
                ));
            }
            if t.generated_tokens != generated {
                return Err(format!(
                    "timing.generated_tokens {} is not the {generated} tokens of the turns",
                    t.generated_tokens
                ));
            }
            for (name, v) in [
                ("prefill_seconds", t.prefill_seconds),
                ("decode_seconds", t.decode_seconds),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(format!("timing.{name} is {v}"));
                }
            }
        }
        let generated = self
            .turns
            .into_iter()
            .enumerate()
            .map(|(i, t)| t.checked(ask).map_err(|e| format!("turn {}: {e}", i + 1)))
            .collect::<Result<Vec<_>, String>>()?;
        Ok((generated, self.engine))
    }
}

impl RecordTurn {
    fn checked(self, ask: &TurnAsk) -> Result<Generated, String> {
        let n = self.tokens.len();
        if n > ask.max_new_tokens {
            return Err(format!(
                "{n} tokens, over max_new_tokens {}",
                ask.max_new_tokens
            ));
        }
        let tokens = self
            .tokens
            .iter()
            .enumerate()
            .map(|(j, &id)| {
                u32::try_from(id)
                    .ok()
                    .filter(|&t| (t as usize) < ask.used)
                    .ok_or_else(|| {
                        format!(
                            "token {} is id {id}, outside the {} token ids of the vocabulary",
                            j + 1,
                            ask.used
                        )
                    })
            })
            .collect::<Result<Vec<u32>, String>>()?;
        let is_stop = |t: &u32| ask.stops.contains(t);
        let body = match (self.stop, tokens.split_last()) {
            (Stop::StopToken, Some((last, body))) if is_stop(last) => body,
            (Stop::StopToken, _) => {
                return Err("ended at a stop token, and its last token is none".into());
            }
            _ => &tokens[..],
        };
        if let Some(j) = body.iter().position(is_stop) {
            return Err(format!(
                "goes on after the stop token {} at token {}",
                body[j],
                j + 1
            ));
        }
        match self.stop {
            Stop::MaxTokens if n != ask.max_new_tokens => Err(format!(
                "ended at max_new_tokens {} after {n} tokens",
                ask.max_new_tokens
            )),
            Stop::NonFinite if n >= ask.max_new_tokens => Err(format!(
                "ended at a non-finite logit row after {n} tokens, the whole budget"
            )),
            _ => Ok(Generated {
                tokens,
                stop: self.stop,
            }),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecordError {
    /// `invalid_request`, `out_of_memory`, `internal`, ...
    pub kind: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceback: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecordRun {
    #[serde(default)]
    pub context_length: Option<usize>,
    /// The run's result file (in the request's `result_dir`).
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub rows: Option<usize>,
}

/// What the program reports about where and how it ran; the fields cardproof reads are named,
/// the rest is kept as given.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct RunnerEnvironment {
    #[serde(default)]
    pub transformers: Option<String>,
    #[serde(default)]
    pub torch: Option<String>,
    #[serde(default)]
    pub cuda: Option<String>,
    #[serde(default)]
    pub dtype: Option<String>,
    #[serde(default)]
    pub tf32: Option<bool>,
    #[serde(default)]
    pub chunk_size: Option<i64>,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub models: RecordModels,
    /// The kernels and state dtypes of each model's linear-attention (Gated DeltaNet) layers, as
    /// observed in the warm-up (absent: neither model has such layers, or a runner from before
    /// the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub linear_attention: Option<LinearAttentionRecord>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Each side's linear-attention kernels (`null`: that model has no such layers).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LinearAttentionRecord {
    pub reference: Option<LinearAttentionKernels>,
    pub candidate: Option<LinearAttentionKernels>,
}

/// What a model's Gated DeltaNet layers ran in prefill: the functions transformers' kernel
/// dispatch actually entered (not a guess from which packages import), and the dtypes the
/// layers' cache states held after a cached prefill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinearAttentionKernels {
    /// Linear-attention layers in the model.
    pub layers: usize,
    /// Where the chunked gated delta rule came from.
    pub gdn_kernel: KernelSource,
    /// The function that ran, `module.qualname` (`null`: none was observed).
    pub gdn_function: Option<String>,
    /// Where the causal depthwise conv1d came from.
    pub causal_conv1d: KernelSource,
    pub causal_conv1d_function: Option<String>,
    /// The kernel packages that ran, `distribution version`.
    pub packages: Vec<String>,
    /// The recurrent (delta-rule) state's dtype in the cache (`null`: not readable).
    pub recurrent_state_dtype: Option<String>,
    /// The conv state's dtype in the cache.
    pub conv_state_dtype: Option<String>,
    /// The checkpoint config's `mamba_ssm_dtype` (what vLLM takes as the state's dtype).
    pub config_mamba_ssm_dtype: Option<String>,
    /// Where the choices were observed.
    pub observed_in: String,
}

/// The origin of a kernel transformers dispatches with a fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KernelSource {
    /// The original package (flash-linear-attention's Triton kernels, causal-conv1d's CUDA one).
    Package,
    /// A kernels-hub layer replaced the layer's forward.
    KernelsHub,
    /// transformers' own torch implementation.
    TorchFallback,
    /// Something else was dispatched (its function is recorded).
    Other,
    /// No call was observed.
    NotObserved,
}

impl KernelSource {
    pub fn as_str(self) -> &'static str {
        match self {
            KernelSource::Package => "package",
            KernelSource::KernelsHub => "kernels_hub",
            KernelSource::TorchFallback => "torch_fallback",
            KernelSource::Other => "other",
            KernelSource::NotObserved => "not_observed",
        }
    }
}

impl LinearAttentionKernels {
    /// One line for people: `GDN flash-linear-attention (fla.ops…chunk_gated_delta_rule), conv1d
    /// torch fallback, recurrent state float32, conv state bfloat16`.
    pub fn summary(&self) -> String {
        let part = |source: KernelSource, function: &Option<String>| {
            let what = match source {
                KernelSource::TorchFallback => "torch fallback".to_owned(),
                other => other.as_str().replace('_', " "),
            };
            match function {
                Some(f) => format!("{what} ({f})"),
                None => what,
            }
        };
        let mut s = format!(
            "{} GDN layers: delta rule {}, conv1d {}; recurrent state {}, conv state {}",
            self.layers,
            part(self.gdn_kernel, &self.gdn_function),
            part(self.causal_conv1d, &self.causal_conv1d_function),
            self.recurrent_state_dtype.as_deref().unwrap_or("?"),
            self.conv_state_dtype.as_deref().unwrap_or("?"),
        );
        if let Some(d) = &self.config_mamba_ssm_dtype {
            s.push_str(&format!(" (config mamba_ssm_dtype {d})"));
        }
        if !self.packages.is_empty() {
            s.push_str(&format!("; {}", self.packages.join(", ")));
        }
        s
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Gpu {
    pub name: String,
    pub compute_capability: String,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// Each model as the program loaded it (its own record, kept as given).
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct RecordModels {
    #[serde(default)]
    pub reference: Value,
    #[serde(default)]
    pub candidate: Value,
}

impl RecordModels {
    fn attention(model: &Value) -> String {
        model["attention"].as_str().unwrap_or("?").to_owned()
    }

    /// The attention implementation each side ran with.
    pub fn attentions(&self) -> (String, String) {
        (
            Self::attention(&self.reference),
            Self::attention(&self.candidate),
        )
    }
}

/// The sanity gates' raw numbers on the first window.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
pub struct GateNumbers {
    #[serde(default)]
    pub self_forward_mean: Option<f64>,
    #[serde(default)]
    pub self_reverse_mean: Option<f64>,
    #[serde(default)]
    pub self_top1_identical: Option<bool>,
    #[serde(default)]
    pub shift_forward_mean: Option<f64>,
    /// Why the gates did not run.
    #[serde(default)]
    pub skipped: Option<String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// What a runner's model record (`models.reference`, `models.candidate`, an arm's `model`) says
/// about its KV cache, read into a type once. The record itself is kept as the runner wrote it
/// (it is recorded verbatim in measurement.json); this is the part cardproof checks.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct RecordedKvCache {
    /// The scheme the cache ran as (`q8_0`, `fp8_e4m3`, ...).
    #[serde(default)]
    pub kv_cache_dtype: Option<String>,
    /// `hadamard` when Q/K/V were rotated before the store.
    #[serde(default)]
    pub kv_cache_rotation: Option<String>,
    /// `computed` when the fp8 scales were computed from the first window.
    #[serde(default)]
    pub kv_cache_scales: Option<String>,
    /// `quantized_cache_residual` for transformers' QuantizedCache.
    #[serde(default)]
    pub kv_cache_semantics: Option<String>,
    /// QuantizedCache's window: `[residual length, prefill chunk]`.
    #[serde(default)]
    pub kv_cache_residual: Option<Vec<Option<u64>>>,
    /// The computed per-layer scales.
    #[serde(default)]
    pub kv_scales: Option<crate::runner::native::kv_cache::ComputedKvScales>,
}

impl RecordedKvCache {
    /// The KV-cache part of a model record; a record that is not an object states nothing, and
    /// one whose fields have other types is the runner's error (`Err` names the field).
    pub fn of(record: &Value) -> Result<RecordedKvCache, String> {
        if !record.is_object() {
            return Ok(RecordedKvCache::default());
        }
        serde_path_to_error::deserialize(record).map_err(|e| format!("{}: {}", e.path(), e.inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask() -> TurnAsk {
        TurnAsk {
            prompts: vec![vec![1, 2, 3], vec![1, 2, 3, 4, 5]],
            stops: vec![0],
            max_new_tokens: 4,
            used: 100,
        }
    }

    /// A runner's turn set as JSON, `turns` its turns.
    fn answer(turns: serde_json::Value) -> RecordTurnSet {
        serde_json::from_value(serde_json::json!({
            "engine": {
                "attention": "sdpa",
                "dtype": "float32",
                "kv_cache": null,
                "prefix_reuse": "crop",
                "prefilled_tokens": 5,
            },
            "seconds": 0.25,
            "turns": turns,
        }))
        .unwrap()
    }

    #[test]
    fn a_well_formed_turn_set_reads_as_generated_turns() {
        let (generated, engine) = answer(serde_json::json!([
            {"tokens": [7, 8, 0], "stop": "stop_token"},
            {"tokens": [9, 9, 9, 9], "stop": "max_tokens"},
        ]))
        .checked(&ask())
        .unwrap();
        assert_eq!(engine.prefix_reuse, PrefixReuse::Crop);
        assert_eq!(
            generated,
            vec![
                Generated {
                    tokens: vec![7, 8, 0],
                    stop: Stop::StopToken
                },
                Generated {
                    tokens: vec![9, 9, 9, 9],
                    stop: Stop::MaxTokens
                },
            ]
        );
        // A non-finite row may end a turn before any token.
        let (generated, _) = answer(serde_json::json!([
            {"tokens": [], "stop": "non_finite"},
            {"tokens": [5], "stop": "non_finite"},
        ]))
        .checked(&ask())
        .unwrap();
        assert!(generated[0].tokens.is_empty());
    }

    /// A buggy or hostile runner's turns are refused with the turn and what is wrong, never a
    /// panic: the wrong number of turns, an id outside the vocabulary (or past u32), a turn over
    /// the budget, a stop reason its tokens contradict, a prefill count over the prompts.
    #[test]
    fn malformed_turns_are_refused_naming_the_turn_and_the_fault() {
        let ok = serde_json::json!({"tokens": [1], "stop": "non_finite"});
        for (turns, message) in [
            (
                serde_json::json!([ok]),
                "1 generated turns for the 2 prompts asked",
            ),
            (
                serde_json::json!([ok, ok, ok]),
                "3 generated turns for the 2 prompts asked",
            ),
            (
                serde_json::json!([ok, {"tokens": [1, 100], "stop": "non_finite"}]),
                "turn 2: token 2 is id 100, outside the 100 token ids of the vocabulary",
            ),
            (
                serde_json::json!([{"tokens": [5_000_000_000u64], "stop": "non_finite"}, ok]),
                "turn 1: token 1 is id 5000000000, outside",
            ),
            (
                serde_json::json!([ok, {"tokens": [1, 2, 3, 4, 5], "stop": "max_tokens"}]),
                "turn 2: 5 tokens, over max_new_tokens 4",
            ),
            (
                serde_json::json!([{"tokens": [1, 2], "stop": "stop_token"}, ok]),
                "turn 1: ended at a stop token, and its last token is none",
            ),
            (
                serde_json::json!([{"tokens": [], "stop": "stop_token"}, ok]),
                "turn 1: ended at a stop token",
            ),
            (
                serde_json::json!([{"tokens": [1, 0, 2], "stop": "non_finite"}, ok]),
                "turn 1: goes on after the stop token 0 at token 2",
            ),
            (
                serde_json::json!([{"tokens": [1, 2], "stop": "max_tokens"}, ok]),
                "turn 1: ended at max_new_tokens 4 after 2 tokens",
            ),
            (
                serde_json::json!([{"tokens": [1, 2, 3, 4], "stop": "non_finite"}, ok]),
                "turn 1: ended at a non-finite logit row after 4 tokens",
            ),
        ] {
            let e = answer(turns.clone()).checked(&ask()).unwrap_err();
            assert!(e.contains(message), "{turns}: {e}");
        }
        let mut over = answer(serde_json::json!([ok, ok]));
        over.engine.prefilled_tokens = 9;
        let e = over.checked(&ask()).unwrap_err();
        assert!(
            e.contains("9 prompt tokens prefilled, and the prompts hold 8"),
            "{e}"
        );
        let mut nan = answer(serde_json::json!([ok, ok]));
        nan.seconds = f64::NAN;
        assert!(nan.checked(&ask()).is_err());
        // A timing whose counts are not the engine's and the turns', or whose seconds are not
        // a duration.
        let timed = |prefill: usize, generated: usize, seconds: f64| {
            let mut set = answer(serde_json::json!([ok, ok]));
            set.timing = Some(GenerationTiming {
                prefill_tokens: prefill,
                prefill_seconds: 0.5,
                generated_tokens: generated,
                decode_seconds: seconds,
            });
            set.checked(&ask())
        };
        assert!(timed(5, 2, 0.25).is_ok());
        for (bad, message) in [
            (
                timed(4, 2, 0.25),
                "timing.prefill_tokens 4 is not engine.prefilled_tokens 5",
            ),
            (
                timed(5, 3, 0.25),
                "timing.generated_tokens 3 is not the 2 tokens",
            ),
            (timed(5, 2, -1.0), "timing.decode_seconds is -1"),
            (timed(5, 2, f64::INFINITY), "timing.decode_seconds is inf"),
        ] {
            let e = bad.unwrap_err();
            assert!(e.contains(message), "{e}");
        }
        // What serde refuses names its field: a negative id, an unknown stop reason.
        for bad in [
            serde_json::json!({"tokens": [-1], "stop": "max_tokens"}),
            serde_json::json!({"tokens": [1], "stop": "tired"}),
        ] {
            assert!(serde_json::from_value::<RecordTurn>(bad).is_err());
        }
    }
}
