//! The disclosure schema v1: the card's `fidelity:` block as Rust types.
//!
//! The committed `schema/disclosure-v1.schema.json` is generated from these types (a test fails
//! when the two drift), and lint validates cards against it. Doc comments become the schema's
//! descriptions, so they are written for card authors.

/// The KV-cache entry (`runtime.kv_cache`): a run records it and a card discloses it, so it
/// lives with the runners ([`crate::runner::kv_record`]).
pub use crate::runner::kv_record as kv_cache;
pub mod files;
pub mod precision;
pub mod read;
pub mod results;
pub mod vocabulary;

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The value of `fidelity.schema` for this version.
pub const SCHEMA_ID: &str = "cardproof/v1";

/// `$id` of the generated JSON Schema.
pub const SCHEMA_URI: &str = "https://cardproof.dev/schema/disclosure-v1.schema.json";

/// A KL-divergence fidelity disclosure: what a quantized checkpoint's KLD numbers were measured
/// against and how, so that they can be interpreted and rerun. Lives under the card front-matter
/// key `fidelity`. Extension keys starting with `x-` or `x_` are allowed in every section.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "cardproof fidelity disclosure v1",
    extend(
        "patternProperties" = {"^x[-_]": {}},
        "if" = {"required": ["files"]},
        "then" = {
            "not": {"anyOf": [{"required": ["quantization"]}, {"required": ["results"]}]},
            "properties": {"candidate": {"not": {"anyOf": [
                {"required": ["file"]}, {"required": ["files_sha256"]}
            ]}}}
        },
        "else" = {"required": ["quantization", "results"]}
    )
)]
pub struct Disclosure {
    /// Schema version; must be `cardproof/v1`.
    #[schemars(extend("const" = "cardproof/v1"))]
    pub schema: String,
    pub reference: Reference,
    /// The candidate repository; with `files`, its `file` and `files_sha256` are each entry's.
    pub candidate: Candidate,
    /// How the candidate was quantized (required unless `files` lists each file's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Quantization>,
    /// The calibration data (with `files`, the default for entries that give none).
    pub calibration: Calibration,
    pub runtime: Runtime,
    pub eval: Eval,
    pub protocol: Protocol,
    /// The claimed numbers (required unless `files` lists each file's). Metric names come from a
    /// fixed vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<ResultClaim>>,
    /// Many quant files under one card (a GGUF repository's Q2_K … Q8_0): each file's
    /// quantization, digest and claims, measured under the one reference, runtime, eval and
    /// protocol above. Lint and `verify` judge each entry as the card of that one file
    /// (`verify --file NAME`, or every file). With `files`, the top level has no `quantization`
    /// or `results` and `candidate` no `file` or `files_sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub files: Option<Vec<FileEntry>>,
}

/// One quant file of a card that describes many (`fidelity.files`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct FileEntry {
    /// The file, beside the card: a bare file name, never a path.
    #[schemars(regex(pattern = r"^[^/\\]+$"), length(min = 1, max = 255))]
    pub file: String,
    /// The file's digest as `cardproof hash FILE` computes it (binds its claims to its bytes).
    pub files_sha256: Sha256,
    pub quantization: Quantization,
    /// This file's calibration data, when it is not the block's `calibration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// This file's claimed numbers.
    pub results: Vec<ResultClaim>,
}

/// The reference checkpoint the candidate is compared against (disclosure item `reference`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Reference {
    /// Hub repository id of the reference, e.g. `Qwen/Qwen3-8B`.
    #[schemars(length(min = 1))]
    pub repo: String,
    /// Full 40-hex commit of the reference repository. Quote it: an all-digit hash is a number in
    /// YAML.
    #[schemars(regex(pattern = r"^[0-9a-f]{40}$"))]
    pub revision: String,
    /// File format the reference was run from.
    pub format: CheckpointFormat,
    /// Weight dtype of the reference as run (e.g. `bf16`).
    pub dtype: WeightDtype,
    /// Root digest of the reference files (`cardproof hash`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_sha256: Option<Sha256>,
}

/// The quantized checkpoint the numbers describe.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Candidate {
    /// Hub repository id of the candidate.
    #[schemars(length(min = 1))]
    pub repo: String,
    /// 40-hex commit of the candidate repository at measurement time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{40}$"))]
    pub revision: Option<String>,
    /// Root digest of the measured files as `cardproof hash` computes it (binds the numbers to
    /// exact bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_sha256: Option<Sha256>,
    /// The one file measured, when the candidate is a single file beside the card (a GGUF among
    /// a repository's files): `files_sha256` is then that file's digest, and `verify` of the
    /// directory verifies this file. A bare file name: never a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[^/\\]+$"), length(min = 1, max = 255))]
    pub file: Option<String>,
}

/// How the candidate was quantized.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Quantization {
    /// Scheme name, e.g. `fp8-block`, `int4-awq`, `nvfp4`, or a GGUF type such as `q4_k_m`.
    #[schemars(length(min = 1))]
    pub method: String,
    /// Weight storage type, e.g. `fp8_e4m3`, `int4`, `nvfp4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
    /// Activation handling, e.g. `none` (weight-only), `dynamic-fp8`, `static-fp8`, `nvfp4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activations: Option<String>,
    /// Group size (`128`) or block shape (`[128, 128]`) of the weight scales.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupSize>,
    /// Whether weight scales use a zero point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symmetric: Option<bool>,
    /// KV-cache storage type baked into the checkpoint, if any (e.g. `fp8_e4m3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<String>,
    /// Modules kept in high precision, as names or globs (`lm_head`, `model.layers.*.mlp.gate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_precision_modules: Option<Vec<String>>,
    /// A mixed build's schemes and the modules each covers, e.g. FP8 over the attention and GDN
    /// projections, NVFP4 over the MLP and lm_head; `lint` checks them against the tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<QuantizationTarget>>,
    /// Tool and version that produced the checkpoint, e.g. `llm-compressor 0.8.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

/// One scheme of a mixed build and the modules stored in it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuantizationTarget {
    /// The scheme as `inspect` names it, or its family: `fp8` (for `fp8-tensor`, `fp8-block`),
    /// `nvfp4`, `int4-awq`, a GGUF type such as `q8_0`.
    #[schemars(length(min = 1))]
    pub scheme: String,
    /// Where the scheme is used: `inspect` bucket names (`attention`, `linear_attention`, `mlp`,
    /// `moe_experts`, `moe_router`, `moe_shared_expert`, `mtp`, `vision`, `lm_head`,
    /// `embeddings`, `other`) or module names and globs (`model.layers.*.mlp.down_proj`). Every
    /// module stored in the scheme must be covered.
    #[schemars(length(min = 1))]
    pub modules: Vec<String>,
    /// How many linear modules are stored in the scheme (a count the card states).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

/// A group size or a two-dimensional block shape.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum GroupSize {
    Group(#[schemars(range(min = 1))] u64),
    Block(#[schemars(length(min = 2, max = 2))] Vec<u64>),
}

/// The calibration data used to quantize (disclosure item `calibration`). `{dataset: none}` when
/// the method uses none (round-to-nearest, dynamic FP8).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Calibration {
    /// Dataset id or description, or `none`.
    #[schemars(length(min = 1))]
    pub dataset: String,
    /// Dataset revision (40-hex commit for a Hub dataset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Dataset configuration name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// Dataset split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
    /// Number of calibration samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub samples: Option<u64>,
    /// Sequence length of each sample, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub seq_len: Option<u64>,
    /// SHA-256 of the calibration text or token file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Sha256>,
    /// Whether overlap with the evaluation text was checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_overlap: Option<EvalOverlap>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EvalOverlap {
    /// Checked: no overlap with the evaluation text.
    CheckedNone,
    /// Checked: the calibration data overlaps the evaluation text.
    CheckedOverlap,
    /// Not checked.
    Unchecked,
}

/// The stack the numbers were measured on (disclosure item `runtime`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Runtime {
    /// Inference engine.
    pub engine: Engine,
    /// Engine version, with a commit for source builds (e.g. `0.11.1`, `b6123 (82bb485)`).
    #[schemars(length(min = 1))]
    pub engine_version: String,
    /// Attention kernel actually used, as the engine names it (`FLASHINFER`, `sdpa`, `eager`,
    /// `flash_attn`, `cpu`).
    #[schemars(length(min = 1))]
    pub attention_backend: String,
    /// KV-cache dtype as run (`bf16`, `fp8_e4m3`, `q8_0`, ...).
    #[schemars(length(min = 1))]
    pub kv_cache_dtype: String,
    /// The KV cache in detail, K and V separately: granularity, scale source, llama.cpp's
    /// Hadamard rotation, read-back semantics. Optional; must agree with `kv_cache_dtype`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<kv_cache::KvCache>,
    /// The dtype the carried recurrent state of linear-attention (Gated DeltaNet) layers is kept
    /// in, as run (vLLM's `mamba_ssm_cache_dtype`, SGLang's `mamba_ssm_dtype`): `f32`, `bf16`,
    /// `f16` (or `float32`, `bfloat16`, `float16`, with or without `torch.`). For hybrid models;
    /// absent means the engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(torch\.)?(f32|float32|bf16|bfloat16|f16|float16)$"))]
    pub recurrent_state_dtype: Option<String>,
    /// Dtype of activations and accumulation (`bf16`, `f16`, `f32`).
    #[schemars(length(min = 1))]
    pub compute_dtype: String,
    /// Device model, e.g. `NVIDIA H200` or `CPU (x86-64, AVX-512)`.
    #[schemars(length(min = 1))]
    pub device: String,
    /// Number of devices (tensor parallelism changes reductions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub device_count: Option<u64>,
    /// Engine flags that change numerics (batch sizes, eager mode, prefix caching, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<BTreeMap<String, FlagValue>>,
}

/// A scalar flag value.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum FlagValue {
    Bool(bool),
    Integer(i64),
    Number(f64),
    Text(String),
}

/// Inference engines, snake_case (`llama_cpp` for llama.cpp).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    Transformers,
    Vllm,
    Sglang,
    LlamaCpp,
    IkLlamaCpp,
    Exllamav2,
    Exllamav3,
    Mlx,
    TensorrtLlm,
    /// cardproof's own native CPU runner.
    Cardproof,
    Other,
}

/// The evaluation text and how it became tokens (disclosure item `eval_text`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Eval {
    pub text: EvalText,
    /// Tokenizer used; defaults to the reference's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<Tokenizer>,
    /// The token stream scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Tokens>,
    /// BOS policy: `none`, `per_window` (first token of each window replaced by BOS, as
    /// llama.cpp does) or `per_document`.
    pub bos: BosPolicy,
    /// Whether a chat template was applied to the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<bool>,
    /// For a conversation eval text (`text.kind: conversation`): how the conversations were
    /// rendered into the tokens scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<EvalConversation>,
}

/// What an eval text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvalTextKind {
    /// Plain text, tokenized as it is.
    Text,
    /// Conversations (JSON or JSONL in the shape `apply_chat_template` takes: messages, tools,
    /// kwargs), rendered with a chat template, then tokenized with special tokens parsed.
    Conversation,
}

/// How a conversation eval text became tokens: the template (where it came from and its
/// digest: a quant repository may ship a patched one), the kwargs, the clock `strftime_now`
/// read, and the rendered text's digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct EvalConversation {
    pub template: ChatTemplateSource,
    /// The distinct sets of template kwargs the conversations carry (`enable_thinking`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kwargs: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    /// Seconds since 1970 UTC that `strftime_now` read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<i64>,
    /// SHA-256 of the rendered text (every conversation's render, in file order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendered_sha256: Option<Sha256>,
    /// The renderer and the semantics it follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renderer: Option<String>,
}

/// Where a conversation eval text's chat template came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct ChatTemplateSource {
    /// `reference` (the reference repository's template), `candidate` (the candidate
    /// repository's own) or `file`.
    pub from: crate::conversation::eval::TemplateFrom,
    /// The file, as named when it was rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A named template of a `tokenizer_config.json` list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// SHA-256 of the template's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Sha256>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct EvalText {
    /// Dataset id and file or URI, e.g. `wikitext-2-raw-v1/test`.
    #[schemars(length(min = 1))]
    pub source: String,
    /// `text` (the default) or `conversation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<EvalTextKind>,
    /// SHA-256 of the exact text bytes scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Sha256>,
    /// Dataset revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Dataset split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Tokenizer {
    /// Hub repository id of the tokenizer.
    #[schemars(length(min = 1))]
    pub repo: String,
    /// 40-hex commit of the tokenizer repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{40}$"))]
    pub revision: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Tokens {
    /// Number of tokens in the stream.
    #[schemars(range(min = 1))]
    pub count: u64,
    /// SHA-256 of the token ids as little-endian int32.
    pub sha256: Sha256,
}

/// The card's BOS policy is the runner's own type (one spelling everywhere).
pub use crate::kld::protocol::Bos as BosPolicy;

/// How the text was cut, scored and summarised.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Protocol {
    /// Window lengths in tokens; the stream is cut into non-overlapping windows of each length
    /// (disclosure item `context_lengths`).
    #[schemars(length(min = 1))]
    pub context_lengths: Vec<ContextLength>,
    pub positions: Positions,
    pub kl: Kl,
    pub vocab: Vocab,
    pub aggregation: Aggregation,
    /// How the assistant turns behind the turn metrics (`tool_call_f1`, `tool_call_valid`,
    /// `tool_call_match`, `turn_match`) were generated; required when `results` claims any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<Turns>,
    /// The prefill chunk in tokens: each window was prefilled in pieces of this many tokens, the
    /// KV cache and recurrent state carried (and stored in the engine's state dtype) between
    /// them, as an engine's chunked prefill runs it. Absent: each window in one pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::kld::protocol::MAX_CONTEXT_LENGTH))]
    pub prefill_chunk: Option<u64>,
}

/// Generated assistant turns (a conversation eval text): each turn generated from the true
/// history before it, rendered by the chat template with the generation prompt, by both models.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Turns {
    /// Which assistant turns: `all`, or `tool_calls` (those that call tools in the conversation).
    pub select: crate::conversation::turns::TurnSelection,
    /// `greedy`: the argmax at every step, the first index of the maximum on ties.
    pub decoding: crate::conversation::turns::Decoding,
    /// Tokens generated at most per turn, the stop token included.
    #[schemars(range(min = 1, max = 65536))]
    pub max_new_tokens: u64,
    /// The token ids that end a turn (the template's end-of-turn tokens).
    pub stop_token_ids: Vec<u32>,
}

/// A window length in tokens (at least 2: one row predicts the next token; at most 2^20).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct ContextLength(
    #[schemars(range(min = 2, max = crate::kld::protocol::MAX_CONTEXT_LENGTH))] pub u64,
);

/// Which rows of each window are scored (disclosure item `positions`). Row j predicts token j+1.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "patternProperties" = {"^x[-_]": {}},
    "allOf" = [
        {"if": {"properties": {"policy": {"const": "stride"}}, "required": ["policy"]},
         "then": {"required": ["stride", "offset"]}},
        {"if": {"properties": {"policy": {"const": "from"}}, "required": ["policy"]},
         "then": {"required": ["from"]}}
    ]
))]
pub struct Positions {
    pub policy: PositionPolicy,
    /// For `stride`: score rows with j mod stride = offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub stride: Option<u64>,
    /// For `stride`: the residue scored (31 with stride 32 scores every 32nd token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// For `from`: score rows j >= from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<u64>,
    /// For `role` (conversation eval texts): score rows predicting a token of this role's
    /// messages (`system`, `developer`, `user`, `assistant`, `tool`, `other`); with `stride`
    /// and `offset`, only those rows with j mod stride = offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<crate::kld::protocol::Role>,
    /// For `span` (conversation eval texts): score rows predicting a token of this segment
    /// (`content`, `reasoning`, `tool_call`, `tool_result`, `scaffolding`); with `stride` and
    /// `offset`, only those rows with j mod stride = offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<crate::kld::protocol::Segment>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PositionPolicy {
    /// Every row.
    All,
    /// Rows with j mod stride = offset.
    Stride,
    /// Rows j from L/2 to L-2, as llama.cpp scores.
    SecondHalf,
    /// Rows j >= from.
    From,
    /// Rows predicting a token of one role's messages (conversation eval texts).
    Role,
    /// Rows predicting a token of one segment: content, reasoning, tool calls, tool results,
    /// template scaffolding (conversation eval texts).
    Span,
}

/// KL direction and units (disclosure item `kl_direction`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Kl {
    /// `forward` = KL(P_ref || P_cand) (llama.cpp's), `reverse` = KL(P_cand || P_ref), or `both`.
    pub direction: KlDirection,
    pub units: KlUnits,
}

/// The card's KL direction is the measurement's own type (one spelling everywhere).
pub use crate::kld::protocol::Direction as KlDirection;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KlUnits {
    Nats,
    Bits,
}

/// Vocabulary coverage of the KL sum (disclosure item `vocab_truncation`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "patternProperties" = {"^x[-_]": {}},
    "allOf" = [
        {"if": {"properties": {"mode": {"const": "top_k"}}, "required": ["mode"]},
         "then": {"required": ["k", "tail"]}},
        {"if": {"properties": {"mode": {"const": "threshold"}}, "required": ["mode"]},
         "then": {"required": ["log_p"]}}
    ]
))]
pub struct Vocab {
    pub mode: VocabMode,
    /// For `top_k`: the reference's top k tokens are kept (ties by lowest token id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::kld::MAX_VOCAB))]
    pub k: Option<u64>,
    /// For `top_k`: what happens to the tail beyond k.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<TailMode>,
    /// For `threshold`: reference terms with log p at or below this are dropped (llama.cpp: -16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 0.0))]
    pub log_p: Option<f64>,
    /// Logit rows beyond the tokenizer's vocabulary (padding): `excluded` (default) or `included`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding: Option<PaddingRows>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum VocabMode {
    /// Every token of the vocabulary.
    Full,
    /// The reference's top k tokens.
    TopK,
    /// Reference terms with log p at or below `log_p` dropped.
    Threshold,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TailMode {
    /// The tail is one bucket: a guaranteed lower bound on the full KL.
    Lumped,
    /// The tail is ignored.
    Dropped,
    /// Both distributions renormalized over the top k.
    Renormalized,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PaddingRows {
    Excluded,
    Included,
}

/// How per-row values became the claimed numbers (disclosure item `aggregation`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct Aggregation {
    pub statistic: AggregationStatistic,
    pub uncertainty: Uncertainty,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AggregationStatistic {
    /// Every scored row weighs the same (llama.cpp's mean).
    MeanOverPositions,
    /// Each window's mean weighs the same.
    MeanOfWindowMeans,
    /// Each document's mean weighs the same.
    MeanOfDocumentMeans,
}

/// How `results[].uncertainty` was computed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend(
    "patternProperties" = {"^x[-_]": {}},
    "allOf" = [
        {"if": {"properties": {"method": {"enum": ["block_bootstrap", "bootstrap"]}},
                "required": ["method"]},
         "then": {"required": ["level"]}},
        {"if": {"properties": {"method": {"const": "iid_stderr"}}, "required": ["method"]},
         "then": {"required": ["level"]}}
    ]
))]
pub struct Uncertainty {
    pub method: UncertaintyMethod,
    /// Coverage of the interval, strictly between 0 and 1, e.g. 0.95 (for `iid_stderr`: 0.6827
    /// for one standard error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0.0, "exclusiveMaximum" = 1.0))]
    pub level: Option<f64>,
    /// Bootstrap resamples (at most 100,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::kld::protocol::MAX_RESAMPLES))]
    pub resamples: Option<u64>,
    /// Bootstrap seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Bootstrap block: `window`, `document`, or a run length in rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<FlagValue>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum UncertaintyMethod {
    /// Resampling whole windows (or documents, or fixed runs of rows).
    BlockBootstrap,
    /// Resampling single rows (ignores correlation between neighbouring tokens).
    Bootstrap,
    /// llama.cpp's i.i.d. per-token standard error.
    IidStderr,
    /// No uncertainty given.
    None,
}

/// One claimed number.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("patternProperties" = {"^x[-_]": {}}))]
pub struct ResultClaim {
    /// Metric name from the cardproof vocabulary (`kld_mean`, `top1_agreement`, ...).
    #[schemars(extend("enum" = vocabulary::METRICS))]
    pub metric: String,
    /// The claimed value, as printed (its precision sets the reproduction tolerance).
    pub value: f64,
    /// Half-width of the interval at `level` (default the aggregation's level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub uncertainty: Option<f64>,
    /// Coverage of `uncertainty` when it differs from the aggregation's, strictly between 0 and 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("exclusiveMinimum" = 0.0, "exclusiveMaximum" = 1.0))]
    pub level: Option<f64>,
    /// Context length this value was measured at (required when several are listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = crate::kld::protocol::MAX_CONTEXT_LENGTH))]
    pub context_length: Option<u64>,
    /// Number of scored rows behind the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub n_positions: Option<u64>,
    /// Scored rows left out because a model's logits were not finite (absent: none). A rerun
    /// that leaves out other rows does not reproduce the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_nonfinite: Option<u64>,
    /// Generated turns behind a turn metric's value (`tool_call_f1`, `tool_call_valid`,
    /// `tool_call_match`, `turn_match`), which are not per context length: such a claim has
    /// `n_turns`, never `context_length`, `n_positions` or `n_nonfinite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub n_turns: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointFormat {
    Safetensors,
    Gguf,
    Mlx,
    Other,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WeightDtype {
    Bf16,
    F16,
    F32,
    Fp8,
    Other,
}

/// A SHA-256 digest, 64 lowercase hex digits (quoted in YAML).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(transparent)]
pub struct Sha256(#[schemars(regex(pattern = r"^[0-9a-f]{64}$"))] pub String);

/// The JSON Schema (draft 2020-12) of the `fidelity` block.
pub fn json_schema() -> Value {
    let settings = crate::schema::settings().with_transform(forbid_null_for_options);
    crate::schema::generate::<Disclosure>(settings, SCHEMA_URI)
}

/// Optional fields are omitted, never `null`: a `revision: ~` is as undisclosed as a missing one,
/// and saying so in the schema lets independent validators agree with lint.
fn forbid_null_for_options(schema: &mut schemars::Schema) {
    schemars::transform::transform_subschemas(&mut forbid_null_for_options, schema);
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(types)) = object.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            object.insert("type".into(), only);
        }
    }
    for key in ["anyOf", "oneOf"] {
        let Some(Value::Array(branches)) = object.get(key) else {
            continue;
        };
        let kept: Vec<Value> = branches
            .iter()
            .filter(|b| b.get("type") != Some(&"null".into()))
            .cloned()
            .collect();
        if kept.len() == branches.len() {
            continue;
        }
        object.remove(key);
        if let [only] = kept.as_slice()
            && let Some(only) = only.as_object()
        {
            for (k, v) in only {
                object.insert(k.clone(), v.clone());
            }
        } else {
            object.insert(key.into(), Value::Array(kept));
        }
    }
    if let Some(Value::Array(values)) = object.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
}

/// The schema as committed: pretty JSON with a trailing newline.
pub fn json_schema_text() -> String {
    crate::schema::text(&json_schema())
}
