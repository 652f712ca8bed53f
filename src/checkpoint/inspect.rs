//! What a checkpoint really holds, from headers alone: every linear module, whether it is
//! quantized or kept in high precision, its scheme and effective bits per weight, the buckets that
//! matter for fidelity, and where the configuration disagrees with the tensors.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::dtype::Dtype;
use super::gguf::{self, GgufFile};
use super::quant_config::{self, Declared, Expectation};
use super::safetensors::{self, SafetensorsCheckpoint, TensorInfo};
use crate::error::{Error, Result};
use crate::findings::{Code, Finding};

/// bitsandbytes' quant-state blobs are a few hundred bytes of JSON.
const MAX_QUANT_STATE_BYTES: u64 = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Quantized,
    HighPrecision,
}

/// Where a module sits, for the fidelity questions people ask ("is lm_head quantized?").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bucket {
    LmHead,
    Embeddings,
    Attention,
    LinearAttention,
    Mlp,
    MoeExperts,
    MoeRouter,
    Mtp,
    Vision,
    Other,
}

impl Bucket {
    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::LmHead => "lm_head",
            Bucket::Embeddings => "embeddings",
            Bucket::Attention => "attention",
            Bucket::LinearAttention => "linear_attention",
            Bucket::Mlp => "mlp",
            Bucket::MoeExperts => "moe_experts",
            Bucket::MoeRouter => "moe_router",
            Bucket::Mtp => "mtp",
            Bucket::Vision => "vision",
            Bucket::Other => "other",
        }
    }
}

/// One linear module (or the embeddings, reported apart).
#[derive(Debug, Clone, Serialize)]
pub struct Module {
    pub name: String,
    pub status: Status,
    pub scheme: String,
    /// Stored bytes of the weight with its scales, zero points and indexes, × 8 ÷ logical weights.
    pub bits_per_weight: f64,
    pub bucket: Bucket,
    /// Logical (dequantized) shape.
    pub shape: Vec<u64>,
    pub parameters: u64,
    /// Group size, or `[rows, cols]` for 2-D blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_size: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symmetric: Option<bool>,
    /// Activation handling: `none` (weight-only), `fp8-static`, `fp8-dynamic`, `int8-dynamic`,
    /// `nvfp4`; absent when the files do not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activations: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileSummary {
    pub path: String,
    pub size: u64,
    pub tensors: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct BucketSummary {
    pub modules: usize,
    pub quantized: usize,
    pub high_precision: usize,
    pub parameters: u64,
    pub schemes: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub quantized: usize,
    pub high_precision: usize,
    /// Histogram over all counted modules, high-precision ones included.
    pub schemes: BTreeMap<String, usize>,
    /// `quantized`, `high_precision`, `tied` (shares the embeddings) or `absent`.
    pub lm_head: String,
    /// Scheme of the token embeddings, if present.
    pub embeddings: Option<String>,
    /// KV-cache quantization the checkpoint carries (scales or a declaration).
    pub kv_cache: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeclaredSummary {
    pub source: String,
    pub method: String,
    pub ignore: Vec<String>,
}

/// One checkpoint (or one GGUF variant of a directory).
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    pub format: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub files: Vec<FileSummary>,
    pub tensor_count: usize,
    pub parameter_count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared: Option<DeclaredSummary>,
    pub modules: Vec<Module>,
    pub buckets: BTreeMap<&'static str, BucketSummary>,
    pub summary: Summary,
    pub findings: Vec<Finding>,
}

/// Inspect a path: a `.safetensors` file, a `.gguf` file, or a directory (which may hold several
/// GGUF variants, each reported on its own).
pub fn inspect_path(path: &Path) -> Result<Vec<Inspection>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() && !meta.is_dir() {
        return Err(crate::files::not_regular(path, &meta));
    }
    if meta.is_file() {
        return match extension(path).as_deref() {
            Some("gguf") => {
                // One file of a split GGUF stands for all of its parts.
                let dir = path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let mut siblings = Vec::new();
                for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
                    let p = entry.map_err(|e| Error::io(dir, e))?.path();
                    if extension(&p).as_deref() == Some("gguf") {
                        siblings.push(p);
                    }
                }
                siblings.sort();
                let name = path
                    .file_name()
                    .map(|n| dir.join(n))
                    .unwrap_or_else(|| path.to_path_buf());
                let files = gguf_variants(&siblings)
                    .into_iter()
                    .find(|(_, files)| files.len() > 1 && files.contains(&name))
                    .map_or_else(|| vec![path.to_path_buf()], |(_, files)| files);
                Ok(vec![inspect_gguf(&files, None)?])
            }
            Some("safetensors") => {
                let dir = path.parent().unwrap_or(Path::new("."));
                let configs = Configs::read(dir)?;
                Ok(vec![inspect_safetensors(
                    safetensors::open_file(path)?,
                    &configs,
                    dir,
                )?])
            }
            _ => Err(Error::malformed(
                path,
                None,
                "not a checkpoint: expected a .safetensors or .gguf file, or a directory",
            )),
        };
    }
    let mut ggufs = Vec::new();
    let mut has_safetensors = false;
    for entry in std::fs::read_dir(path).map_err(|e| Error::io(path, e))? {
        let p = entry.map_err(|e| Error::io(path, e))?.path();
        match extension(&p).as_deref() {
            Some("gguf") => ggufs.push(p),
            Some("safetensors") => has_safetensors = true,
            _ => {}
        }
    }
    let mut out = Vec::new();
    if has_safetensors || path.join("model.safetensors.index.json").exists() {
        let configs = Configs::read(path)?;
        out.push(inspect_safetensors(
            safetensors::open_dir(path)?,
            &configs,
            path,
        )?);
    }
    ggufs.sort();
    for (variant, files) in gguf_variants(&ggufs) {
        out.push(inspect_gguf(&files, Some(variant))?);
    }
    if out.is_empty() {
        return Err(Error::malformed(
            path,
            None,
            "no .safetensors or .gguf files in this directory",
        ));
    }
    Ok(out)
}

fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
}

/// Split GGUF files (`name-00001-of-00003.gguf`) form one variant.
fn gguf_variants(files: &[PathBuf]) -> Vec<(String, Vec<PathBuf>)> {
    let split = regex::Regex::new(r"^(.*)-\d{5}-of-\d{5}\.gguf$").expect("valid");
    let mut variants: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let key = split.captures(name).and_then(|c| c.get(1)).map_or_else(
            || name.trim_end_matches(".gguf").to_owned(),
            |m| m.as_str().to_owned(),
        );
        variants.entry(key).or_default().push(f.clone());
    }
    variants.into_iter().collect()
}

/// `config.json` and `hf_quant_config.json` next to the weights.
struct Configs {
    config: Option<Value>,
    hf_quant: Option<Value>,
}

impl Configs {
    fn read(dir: &Path) -> Result<Configs> {
        Ok(Configs {
            config: crate::files::read_config_if_present(&dir.join("config.json"))?,
            hf_quant: crate::files::read_config_if_present(&dir.join("hf_quant_config.json"))?,
        })
    }
}

/// Module suffixes, longest first, with their role in the module.
const SUFFIXES: &[(&str, Role)] = &[
    ("weight.quant_state.bitsandbytes__nf4", Role::QuantState),
    ("weight.quant_state.bitsandbytes__fp4", Role::QuantState),
    ("weight.nested_quant_map", Role::Aux),
    ("weight.nested_absmax", Role::Aux),
    ("weight.quant_map", Role::Aux),
    ("weight.absmax", Role::Aux),
    ("weight_global_scale", Role::GlobalScale),
    ("weight_zero_point", Role::Zeros),
    ("weight_scale_inv", Role::ScaleInv),
    ("weight_scale_2", Role::Scale2),
    ("weight_packed", Role::Packed),
    ("weight_format", Role::Meta),
    ("weight_g_idx", Role::Index),
    ("weight_shape", Role::Shape),
    ("weight_scale", Role::Scale),
    ("input_global_scale", Role::InputGlobalScale),
    ("pre_quant_scale", Role::Aux),
    ("output_scale", Role::Activation),
    ("input_scale", Role::InputScale),
    ("k_scale", Role::KvScale),
    ("v_scale", Role::KvScale),
    ("qweight", Role::QWeight),
    ("qzeros", Role::Zeros),
    ("scales", Role::Scale),
    ("biases", Role::Zeros),
    ("g_idx", Role::Index),
    ("weight", Role::Weight),
    ("bias", Role::Bias),
    ("SCB", Role::Scale),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Weight,
    Packed,
    QWeight,
    Blocks,
    Scale,
    ScaleInv,
    Scale2,
    GlobalScale,
    Zeros,
    Index,
    Shape,
    Aux,
    QuantState,
    Meta,
    InputScale,
    InputGlobalScale,
    Activation,
    KvScale,
    Bias,
}

impl Role {
    /// Tensors whose bytes count towards a module's bits per weight.
    fn is_weight_storage(self) -> bool {
        matches!(
            self,
            Role::Weight
                | Role::Packed
                | Role::QWeight
                | Role::Blocks
                | Role::Scale
                | Role::ScaleInv
                | Role::Scale2
                | Role::GlobalScale
                | Role::Zeros
                | Role::Index
                | Role::Aux
        )
    }

    /// Only these make a module quantized: activation and KV-cache scales next to a BF16 weight do
    /// not.
    fn is_weight_scale(self) -> bool {
        matches!(
            self,
            Role::Scale
                | Role::ScaleInv
                | Role::Scale2
                | Role::GlobalScale
                | Role::Zeros
                | Role::Aux
                | Role::QuantState
        )
    }
}

/// Split a tensor name into (module prefix, role).
fn split_name(name: &str) -> (&str, Role) {
    for (suffix, role) in SUFFIXES {
        if let Some(prefix) = name.strip_suffix(suffix)
            && let Some(prefix) = prefix.strip_suffix('.')
        {
            return (prefix, *role);
        }
    }
    // gpt-oss MXFP4 experts: `...experts.gate_up_proj_blocks` / `_scales` / `_bias`.
    for (suffix, role) in [
        ("_blocks", Role::Blocks),
        ("_scales", Role::Scale),
        ("_bias", Role::Bias),
    ] {
        if let Some(prefix) = name.strip_suffix(suffix)
            && prefix.ends_with("_proj")
        {
            return (prefix, role);
        }
    }
    // Fused expert weights without a `.weight` suffix (`...experts.down_proj`, 3-D).
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.ends_with("_proj"))
    {
        return (name, Role::Weight);
    }
    (name, Role::Meta)
}

fn bucket_of(name: &str, mtp_layer: Option<u64>) -> Bucket {
    let parts: Vec<&str> = name.split('.').collect();
    let has = |p: &str| parts.contains(&p);
    let last = parts.last().copied().unwrap_or_default();
    if name.contains("embed_tokens")
        || has("wte")
        || has("tok_embeddings")
        || has("word_embeddings")
        || has("token_embd")
    {
        return Bucket::Embeddings;
    }
    if last == "lm_head" || name == "output" || last == "embed_out" {
        return Bucket::LmHead;
    }
    let layer = parts
        .windows(2)
        .find(|w| w[0] == "layers" || w[0] == "blk" || w[0] == "h")
        .and_then(|w| w[1].parse::<u64>().ok());
    if has("mtp") || name.contains("nextn") || (layer.is_some() && layer == mtp_layer) {
        return Bucket::Mtp;
    }
    if has("visual") || has("vision_tower") || has("vision_model") || has("vision") {
        return Bucket::Vision;
    }
    if has("linear_attn") || last.starts_with("ssm_") || has("mamba") || has("mixer") {
        return Bucket::LinearAttention;
    }
    if last == "gate" && (has("mlp") || has("block_sparse_moe"))
        || last == "router"
        || last == "shared_expert_gate"
        || last == "ffn_gate_inp"
        || last == "ffn_gate_inp_shexp"
    {
        return Bucket::MoeRouter;
    }
    if has("experts") || last.ends_with("_exps") {
        return Bucket::MoeExperts;
    }
    if has("self_attn") || has("attention") || has("attn") || last.starts_with("attn_") {
        return Bucket::Attention;
    }
    if has("mlp") || has("feed_forward") || has("ffn") || last.starts_with("ffn_") {
        return Bucket::Mlp;
    }
    Bucket::Other
}

struct Member<'a> {
    role: Role,
    info: &'a TensorInfo,
    file: &'a safetensors::SafetensorsFile,
}

fn inspect_safetensors(
    checkpoint: SafetensorsCheckpoint,
    configs: &Configs,
    root: &Path,
) -> Result<Inspection> {
    let declared = quant_config::declared(configs.config.as_ref(), configs.hf_quant.as_ref());
    let config = configs.config.as_ref();
    // DeepSeek-style MTP lives in the extra decoder layer at index num_hidden_layers.
    let mtp_layer = config
        .filter(|c| {
            c.get("num_nextn_predict_layers")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                > 0
        })
        .and_then(|c| c.get("num_hidden_layers").and_then(Value::as_u64));
    let mut groups: BTreeMap<&str, Vec<Member<'_>>> = BTreeMap::new();
    for (file, info) in checkpoint.tensors() {
        let (prefix, role) = split_name(&info.name);
        groups
            .entry(prefix)
            .or_default()
            .push(Member { role, info, file });
    }
    let mut modules = Vec::new();
    let mut embeddings = Vec::new();
    let mut kv_scales = false;
    let mut other_parameters = 0u64;
    let mut findings = Vec::new();
    for (prefix, members) in &groups {
        kv_scales |= members.iter().any(|m| m.role == Role::KvScale);
        let module = match classify(prefix, members, declared.as_ref(), mtp_layer)? {
            Classified::Module(m) => m,
            Classified::Unknown(m, why) => {
                findings.push(Finding::new(
                    Code::UnknownScheme,
                    format!("module `{prefix}`: unrecognised quantization layout ({why})"),
                ));
                m
            }
            Classified::NotLinear(params) => {
                other_parameters += params;
                continue;
            }
        };
        if module.bucket == Bucket::Embeddings {
            embeddings.push(module);
        } else {
            modules.push(module);
        }
    }
    let tied = config
        .and_then(|c| c.get("tie_word_embeddings"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let files = checkpoint
        .files
        .iter()
        .map(|f| FileSummary {
            path: relative(&f.path, root),
            size: f.file_size,
            tensors: f.tensors.len(),
        })
        .collect();
    if let Some(d) = &declared {
        if let Some(what) = d.unknown_method() {
            findings.push(Finding::new(
                Code::UnknownScheme,
                format!("{what}: its declaration is not checked against the tensors"),
            ));
        }
        findings.extend(cross_check(d, &modules));
    }
    let kv_cache = declared
        .as_ref()
        .and_then(|d| d.kv_cache.clone())
        .or_else(|| kv_scales.then(|| "fp8 (k_scale/v_scale present)".to_owned()));
    Ok(finish(
        Inspection {
            format: "safetensors",
            variant: None,
            files,
            tensor_count: checkpoint.tensor_count(),
            parameter_count: other_parameters,
            declared: declared.map(|d| DeclaredSummary {
                source: d.source.clone(),
                method: d.method.clone(),
                ignore: d.ignore_text.clone(),
            }),
            modules,
            buckets: BTreeMap::new(),
            summary: Summary {
                quantized: 0,
                high_precision: 0,
                schemes: BTreeMap::new(),
                lm_head: if tied { "tied".into() } else { "absent".into() },
                embeddings: embeddings.first().map(|e| e.scheme.clone()),
                kv_cache,
            },
            findings,
        },
        &embeddings,
    ))
}

fn relative(path: &Path, root: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// Fill in the summary, bucket histograms and parameter count (which so far holds the
/// parameters outside modules: norms, biases) from the modules.
fn finish(mut inspection: Inspection, embeddings: &[Module]) -> Inspection {
    inspection.parameter_count += inspection
        .modules
        .iter()
        .chain(embeddings)
        .map(|m| m.parameters)
        .sum::<u64>();
    let mut summary = inspection.summary.clone();
    for m in &inspection.modules {
        match m.status {
            Status::Quantized => summary.quantized += 1,
            Status::HighPrecision => summary.high_precision += 1,
        }
        *summary.schemes.entry(m.scheme.clone()).or_default() += 1;
        if m.bucket == Bucket::LmHead {
            summary.lm_head = match m.status {
                Status::Quantized => "quantized".into(),
                Status::HighPrecision => "high_precision".into(),
            };
        }
    }
    for m in inspection.modules.iter().chain(embeddings) {
        let b = inspection.buckets.entry(m.bucket.as_str()).or_default();
        b.modules += 1;
        b.parameters += m.parameters;
        match m.status {
            Status::Quantized => b.quantized += 1,
            Status::HighPrecision => b.high_precision += 1,
        }
        *b.schemes.entry(m.scheme.clone()).or_default() += 1;
    }
    inspection.summary = summary;
    inspection
}

enum Classified {
    Module(Module),
    Unknown(Module, String),
    /// Norms, biases and other non-linear tensors: their parameter count.
    NotLinear(u64),
}

fn classify(
    prefix: &str,
    members: &[Member<'_>],
    declared: Option<&Declared>,
    mtp_layer: Option<u64>,
) -> Result<Classified> {
    let find = |role: Role| members.iter().find(|m| m.role == role).map(|m| m.info);
    let has = |role: Role| members.iter().any(|m| m.role == role);
    let storage_bytes: u64 = members
        .iter()
        .filter(|m| m.role.is_weight_storage())
        .map(|m| m.info.byte_len())
        .sum();
    let bucket = bucket_of(prefix, mtp_layer);
    let expectation = declared.map(|d| d.expectation(prefix));
    let decl_bits = match &expectation {
        Some(Expectation::Quantized(w)) => w.bits,
        _ => None,
    };
    let quantized_by_scales = members.iter().any(|m| m.role.is_weight_scale());

    let mut module =
        |scheme: String, shape: Vec<u64>, group: Option<Value>, symmetric: Option<bool>| {
            let parameters = shape.iter().product::<u64>();
            let bits = if parameters == 0 {
                0.0
            } else {
                storage_bytes as f64 * 8.0 / parameters as f64
            };
            let status = if is_high_precision_scheme(&scheme) {
                Status::HighPrecision
            } else {
                Status::Quantized
            };
            let activations = (status == Status::Quantized)
                .then(|| activation_scheme(&scheme, members, &expectation))
                .flatten();
            Module {
                name: prefix.to_owned(),
                status,
                scheme,
                bits_per_weight: bits,
                bucket,
                shape,
                parameters,
                group_size: group,
                symmetric,
                activations,
            }
        };

    // bitsandbytes 4-bit: the logical shape lives in a small JSON tensor.
    if let Some(state) = members.iter().find(|m| m.role == Role::QuantState) {
        let blob =
            safetensors::read_tensor_bytes(state.file, &state.info.name, MAX_QUANT_STATE_BYTES)?;
        let json: Value = serde_json::from_slice(&blob).map_err(|e| {
            Error::malformed(
                &state.file.path,
                Some(&state.info.name),
                format!("quant state is not JSON: {e}"),
            )
        })?;
        let shape: Vec<u64> = json
            .get("shape")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default();
        let kind = if state.info.name.ends_with("__nf4") {
            "bnb-nf4"
        } else {
            "bnb-fp4"
        };
        let group = json.get("blocksize").cloned();
        return Ok(Classified::Module(module(
            kind.into(),
            shape,
            group,
            Some(true),
        )));
    }
    if let Some(w) = find(Role::Weight)
        && find(Role::Scale).is_some_and(|s| s.name.ends_with(".SCB"))
    {
        return Ok(Classified::Module(module(
            "bnb-int8".into(),
            w.shape.clone(),
            None,
            Some(true),
        )));
    }
    // gpt-oss MXFP4 experts: blocks [.., in/32, 16] U8 + scales [.., in/32] U8 (E8M0).
    if let (Some(blocks), Some(_)) = (find(Role::Blocks), find(Role::Scale)) {
        let mut shape = blocks.shape.clone();
        let last = shape.pop().unwrap_or(0);
        let groups = shape.pop().unwrap_or(0);
        shape.push(groups * last * 2);
        return Ok(Classified::Module(module(
            "mxfp4".into(),
            shape,
            Some(32.into()),
            Some(true),
        )));
    }
    // AWQ / GPTQ.
    if let (Some(q), Some(scales)) = (find(Role::QWeight), find(Role::Scale)) {
        return Ok(classify_awq_gptq(
            q,
            scales,
            has(Role::Index),
            declared,
            decl_bits,
            &mut module,
        ));
    }
    if let Some(packed) = find(Role::Packed) {
        let scale = find(Role::Scale);
        if packed.dtype == Dtype::U8 {
            // FP4 packed two per byte, U8 [out, in/2]: NVFP4 has E4M3 scales per 16 (and a
            // global scale), MXFP4 E8M0 scales per 32.
            let nvfp4 = has(Role::GlobalScale) || scale.is_some_and(|s| s.dtype == Dtype::F8_E4M3);
            let shape = vec![dim(packed, 0), dim(packed, 1) * 2];
            let group = scale.map(|s| group_of(shape[1], dim(s, 1)));
            let scheme = if nvfp4 { "nvfp4" } else { "mxfp4" };
            return Ok(Classified::Module(module(
                scheme.into(),
                shape,
                group,
                Some(true),
            )));
        }
        // pack-quantized ints: I32 [out, in*bits/32].
        let bits = decl_bits.unwrap_or(4);
        let shape = match find(Role::Shape) {
            Some(s) => read_shape(members, s)?,
            None => vec![dim(packed, 0), dim(packed, 1) * (32 / bits.clamp(1, 32))],
        };
        let bits = if dim(packed, 1) > 0 && shape.len() == 2 && shape[1] > 0 {
            (dim(packed, 1) * 32).div_ceil(shape[1]).clamp(1, 32)
        } else {
            bits
        };
        let groups = scale.map_or(1, |s| dim(s, 1).max(1));
        let kind = if groups <= 1 { "channel" } else { "group" };
        let group = (groups > 1).then(|| group_of(shape.get(1).copied().unwrap_or(0), groups));
        let scheme = format!("int{bits}-{kind}");
        return Ok(Classified::Module(module(
            scheme,
            shape,
            group,
            Some(!has(Role::Zeros)),
        )));
    }
    let Some(weight) = find(Role::Weight) else {
        if members.iter().any(|m| m.role.is_weight_storage()) {
            let names: Vec<&str> = members.iter().map(|m| m.info.name.as_str()).collect();
            let shape = members
                .first()
                .map(|m| m.info.shape.clone())
                .unwrap_or_default();
            return Ok(Classified::Unknown(
                module("unknown".into(), shape, None, None),
                format!("tensors {}", names.join(", ")),
            ));
        }
        return Ok(Classified::NotLinear(float_parameters(members)));
    };
    let is_linear_shape = weight.shape.len() >= 2 && weight.shape.len() <= 3;
    if !is_linear_shape && bucket != Bucket::Embeddings {
        return Ok(Classified::NotLinear(float_parameters(members)));
    }
    let shape = weight.shape.clone();
    if weight.dtype.is_high_precision_float() && !quantized_by_scales {
        let scheme = weight.dtype.name().to_ascii_lowercase();
        return Ok(Classified::Module(module(scheme, shape, None, None)));
    }
    if weight.dtype.is_fp8() {
        if let Some(inv) = find(Role::ScaleInv) {
            return Ok(fp8_block(weight, inv, declared, &mut module));
        }
        if let Some(scale) = find(Role::Scale) {
            if has(Role::Scale2) {
                return Ok(Classified::Unknown(
                    module("unknown".into(), shape, None, None),
                    "FP8 weight with two scale levels".into(),
                ));
            }
            let numel = scale.numel();
            let (out, inn) = (dim(weight, 0), dim(weight, 1));
            return Ok(Classified::Module(if numel <= 1 {
                module("fp8-tensor".into(), shape, None, Some(true))
            } else if numel == out {
                module("fp8-channel".into(), shape, None, Some(true))
            } else {
                let (r, c) = (dim(scale, 0).max(1), dim(scale, 1).max(1));
                let block = Value::from(vec![out.div_ceil(r), inn.div_ceil(c)]);
                module("fp8-block".into(), shape, Some(block), Some(true))
            }));
        }
    }
    if weight.dtype == Dtype::U8
        && let Some(scale) = find(Role::Scale)
    {
        // ModelOpt NVFP4: U8 [out, in/2] + E4M3 [out, in/16] + weight_scale_2; MXFP4: E8M0 per 32.
        let shape = vec![dim(weight, 0), dim(weight, 1) * 2];
        let group = Some(group_of(shape[1], dim(scale, 1)));
        let scheme = if scale.dtype == Dtype::F8_E4M3 || has(Role::Scale2) {
            "nvfp4"
        } else {
            "mxfp4"
        };
        return Ok(Classified::Module(module(
            scheme.into(),
            shape,
            group,
            Some(true),
        )));
    }
    if weight.dtype == Dtype::I8
        && let Some(scale) = find(Role::Scale)
    {
        let numel = scale.numel();
        let out = dim(weight, 0);
        let (scheme, group) = if numel <= 1 {
            ("int8-tensor", None)
        } else if numel == out {
            ("int8-channel", None)
        } else {
            ("int8-group", Some(group_of(dim(weight, 1), dim(scale, 1))))
        };
        return Ok(Classified::Module(module(
            scheme.into(),
            shape,
            group,
            Some(!has(Role::Zeros)),
        )));
    }
    if weight.dtype == Dtype::U32
        && let Some(scale) = find(Role::Scale)
        && has(Role::Zeros)
    {
        // MLX affine: U32 [out, in*bits/32] + scales/biases [out, in/group].
        let bits = decl_bits.unwrap_or(4).clamp(1, 32);
        let shape = vec![dim(weight, 0), dim(weight, 1) * 32 / bits];
        let group = Some(group_of(shape[1], dim(scale, 1)));
        return Ok(Classified::Module(module(
            format!("int{bits}-group"),
            shape,
            group,
            Some(false),
        )));
    }
    let names: Vec<String> = members
        .iter()
        .map(|m| format!("{} {}", m.info.name, m.info.dtype))
        .collect();
    Ok(Classified::Unknown(
        module("unknown".into(), shape, None, None),
        names.join(", "),
    ))
}

/// Parameters of a group of non-linear tensors (norms, biases): its float elements.
fn float_parameters(members: &[Member<'_>]) -> u64 {
    members
        .iter()
        .filter(|m| m.info.dtype.is_high_precision_float())
        .map(|m| m.info.numel())
        .sum()
}

fn is_high_precision_scheme(scheme: &str) -> bool {
    matches!(scheme, "bf16" | "f16" | "f32" | "f64")
}

fn dim(t: &TensorInfo, i: usize) -> u64 {
    t.shape.get(i).copied().unwrap_or(1)
}

fn group_of(columns: u64, groups: u64) -> Value {
    columns.checked_div(groups).map_or(Value::Null, Value::from)
}

/// compressed-tensors' `weight_shape`: the logical shape, as two integers.
fn read_shape(members: &[Member<'_>], shape: &TensorInfo) -> Result<Vec<u64>> {
    let member = members
        .iter()
        .find(|m| m.info.name == shape.name)
        .expect("member exists");
    let bytes = safetensors::read_tensor_bytes(member.file, &shape.name, 64)?;
    let width = (shape.dtype.bits() / 8) as usize;
    if width == 0 || bytes.len() % width != 0 {
        return Err(Error::malformed(
            &member.file.path,
            Some(&shape.name),
            "weight_shape must hold integers",
        ));
    }
    Ok(bytes
        .chunks(width)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect())
}

fn classify_awq_gptq(
    q: &TensorInfo,
    scales: &TensorInfo,
    has_g_idx: bool,
    declared: Option<&Declared>,
    decl_bits: Option<u64>,
    module: &mut impl FnMut(String, Vec<u64>, Option<Value>, Option<bool>) -> Module,
) -> Classified {
    let bits = decl_bits.unwrap_or(4).clamp(1, 32);
    let pack = 32 / bits;
    let out_from_scales = dim(scales, 1);
    let method = declared.map(|d| d.method.as_str());
    // AWQ packs along the output dim ([in, out/pack]); GPTQ along the input dim ([in/pack, out]).
    let awq_shaped = dim(q, 1) * pack == out_from_scales;
    let gptq_shaped = dim(q, 1) == out_from_scales;
    let (scheme, shape) = if awq_shaped && method != Some("gptq") {
        ("awq", vec![out_from_scales, dim(q, 0)])
    } else if gptq_shaped {
        ("gptq", vec![out_from_scales, dim(q, 0) * pack])
    } else {
        let shape = vec![out_from_scales, dim(q, 0)];
        return Classified::Unknown(
            module("unknown".into(), shape, None, None),
            format!(
                "qweight {:?} does not match scales {:?} for {bits}-bit AWQ or GPTQ",
                q.shape, scales.shape
            ),
        );
    };
    let groups = dim(scales, 0).max(1);
    let group = if groups == 1 {
        Value::from(-1)
    } else {
        Value::from(shape[1] / groups)
    };
    let scheme = format!("int{bits}-{scheme}");
    let mut m = module(scheme, shape, Some(group), None);
    if has_g_idx && m.scheme.ends_with("gptq") {
        m.activations = m.activations.or(Some("none".into()));
    }
    Classified::Module(m)
}

fn fp8_block(
    weight: &TensorInfo,
    inv: &TensorInfo,
    declared: Option<&Declared>,
    module: &mut impl FnMut(String, Vec<u64>, Option<Value>, Option<bool>) -> Module,
) -> Classified {
    let (out, inn) = (dim(weight, 0), dim(weight, 1));
    let (r, c) = (dim(inv, 0).max(1), dim(inv, 1).max(1));
    let block = declared
        .and_then(|d| d.groups.first())
        .and_then(|g| g.weights.block)
        .unwrap_or([out.div_ceil(r), inn.div_ceil(c)]);
    let expected = [out.div_ceil(block[0].max(1)), inn.div_ceil(block[1].max(1))];
    let shape = weight.shape.clone();
    if expected != [r, c] {
        return Classified::Unknown(
            module("unknown".into(), shape, None, None),
            format!(
                "weight_scale_inv grid {:?} is not ceil({out}/{}) × ceil({inn}/{}) = {:?}",
                inv.shape, block[0], block[1], expected
            ),
        );
    }
    Classified::Module(module(
        "fp8-block".into(),
        shape,
        Some(Value::from(block.to_vec())),
        Some(true),
    ))
}

/// How a quantized module's activations are handled: tensors first (static input scales), then
/// the declaration (dynamic schemes leave no tensors), else weight-only when declared at all.
fn activation_scheme(
    scheme: &str,
    members: &[Member<'_>],
    expectation: &Option<Expectation>,
) -> Option<String> {
    let has = |role: Role| members.iter().any(|m| m.role == role);
    let declared = match expectation {
        Some(Expectation::Quantized(w)) => Some(w.activations.as_deref().unwrap_or("none")),
        _ => None,
    };
    if has(Role::InputGlobalScale) || (has(Role::InputScale) && scheme == "nvfp4") {
        return Some("nvfp4".into());
    }
    let kind = |text: &str| -> &'static str {
        if text.contains("float4") || text.contains("nvfp4") {
            "nvfp4"
        } else if text.contains("float8") || text.contains("fp8") {
            "fp8"
        } else {
            "int8"
        }
    };
    if has(Role::InputScale) {
        let base = if scheme.starts_with("fp8") {
            "fp8"
        } else {
            declared.map_or("int8", kind)
        };
        return Some(format!("{base}-static"));
    }
    let declared = declared?;
    if declared == "none" {
        return Some("none".into());
    }
    let base = kind(declared);
    if base == "nvfp4" {
        return Some("nvfp4".into());
    }
    let timing = if declared.starts_with("static") {
        "static"
    } else {
        "dynamic"
    };
    Some(format!("{base}-{timing}"))
}

/// Group disagreements so a 600-module checkpoint gives one finding per kind, with examples.
fn cross_check(declared: &Declared, modules: &[Module]) -> Vec<Finding> {
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for m in modules {
        let what = match (declared.expectation(&m.name), m.status) {
            (Expectation::Excluded, Status::Quantized) => Some(format!(
                "{} excludes them from quantization, but the tensors are {}",
                declared.source, m.scheme
            )),
            (Expectation::Quantized(w), Status::HighPrecision) => Some(format!(
                "{} declares them quantized ({}-bit {}), but the tensors are {}",
                declared.source,
                w.bits.map_or("?".into(), |b| b.to_string()),
                w.kind.as_deref().unwrap_or("?"),
                m.scheme
            )),
            (Expectation::Quantized(w), Status::Quantized) => {
                let detected_group = m.group_size.as_ref().and_then(Value::as_u64);
                let declared_group = w
                    .group_size
                    .filter(|_| w.strategy.as_deref() != Some("channel"));
                match (declared_group, detected_group) {
                    (Some(d), Some(t)) if d != t => Some(format!(
                        "{} declares group size {d}, but the scales give {t}",
                        declared.source
                    )),
                    _ => family_mismatch(declared, &w, m),
                }
            }
            _ => None,
        };
        if let Some(what) = what {
            groups.entry(what).or_default().push(&m.name);
        }
    }
    groups
        .into_iter()
        .map(|(what, names)| {
            let shown: Vec<String> = names.iter().take(3).map(|n| format!("`{n}`")).collect();
            let more = if names.len() > 3 {
                format!(" and {} more", names.len() - 3)
            } else {
                String::new()
            };
            Finding::new(
                Code::ConfigTensorMismatch,
                format!(
                    "{} module{} ({}{more}): {what}",
                    names.len(),
                    if names.len() == 1 { "" } else { "s" },
                    shown.join(", ")
                ),
            )
        })
        .collect()
}

fn family_mismatch(
    declared: &Declared,
    w: &quant_config::WeightDecl,
    m: &Module,
) -> Option<String> {
    let scheme = m.scheme.as_str();
    let expected_family = match declared.method.as_str() {
        "awq" => Some("awq"),
        "gptq" => Some("gptq"),
        "fp8" => Some("fp8"),
        "bitsandbytes" => Some("bnb"),
        _ => None,
    };
    if let Some(family) = expected_family
        && !scheme.contains(family)
    {
        return Some(format!(
            "{} declares {}, but the tensors are {scheme}",
            declared.source, declared.method
        ));
    }
    if let Some(bits) = w.bits
        && let Some(digits) = scheme.strip_prefix("int").and_then(|s| s.split('-').next())
        && digits.parse::<u64>().is_ok_and(|b| b != bits)
    {
        return Some(format!(
            "{} declares {bits}-bit weights, but the tensors are {scheme}",
            declared.source
        ));
    }
    None
}

fn inspect_gguf(paths: &[PathBuf], variant: Option<String>) -> Result<Inspection> {
    let files: Vec<GgufFile> = paths
        .iter()
        .map(|p| gguf::read_file(p))
        .collect::<Result<_>>()?;
    let mut modules = Vec::new();
    let mut embeddings = Vec::new();
    let mut other_parameters = 0u64;
    let mut tensor_count = 0;
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for file in &files {
        for t in &file.tensors {
            if let Some(first) = seen.insert(&t.name, &file.path) {
                return Err(Error::malformed(
                    &file.path,
                    Some(&t.name),
                    format!("tensor also appears in {}", first.display()),
                ));
            }
        }
    }
    for file in &files {
        tensor_count += file.tensors.len();
        for t in &file.tensors {
            let name = t.name.strip_suffix(".weight").unwrap_or(&t.name);
            if t.dims.len() < 2 || t.name.ends_with(".bias") {
                other_parameters += t.numel();
                continue;
            }
            let bucket = bucket_of(name, None);
            let parameters = t.numel();
            let module = Module {
                name: name.to_owned(),
                status: if t.ty.is_quantized() {
                    Status::Quantized
                } else {
                    Status::HighPrecision
                },
                scheme: t.ty.name().to_owned(),
                bits_per_weight: if parameters == 0 {
                    0.0
                } else {
                    t.n_bytes as f64 * 8.0 / parameters as f64
                },
                bucket,
                // GGUF lists dims innermost first; report [out, in] like safetensors.
                shape: t.dims.iter().rev().copied().collect(),
                parameters,
                group_size: t.ty.is_quantized().then(|| Value::from(t.ty.block_size())),
                symmetric: None,
                activations: None,
            };
            if bucket == Bucket::Embeddings {
                embeddings.push(module);
            } else {
                modules.push(module);
            }
        }
    }
    let root = paths
        .first()
        .and_then(|p| p.parent())
        .unwrap_or(Path::new(""));
    let has_output = modules.iter().any(|m| m.bucket == Bucket::LmHead);
    let summary = Summary {
        quantized: 0,
        high_precision: 0,
        schemes: BTreeMap::new(),
        lm_head: if has_output {
            "absent".into()
        } else {
            "tied".into()
        },
        embeddings: embeddings.first().map(|e| e.scheme.clone()),
        kv_cache: None,
    };
    Ok(finish(
        Inspection {
            format: "gguf",
            variant,
            files: files
                .iter()
                .map(|f| FileSummary {
                    path: relative(&f.path, root),
                    size: f.file_size,
                    tensors: f.tensors.len(),
                })
                .collect(),
            tensor_count,
            parameter_count: other_parameters,
            declared: None,
            modules,
            buckets: BTreeMap::new(),
            summary,
            findings: Vec::new(),
        },
        &embeddings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_names() {
        assert_eq!(bucket_of("lm_head", None), Bucket::LmHead);
        assert_eq!(bucket_of("model.embed_tokens", None), Bucket::Embeddings);
        assert_eq!(
            bucket_of("model.layers.0.self_attn.q_proj", None),
            Bucket::Attention
        );
        assert_eq!(
            bucket_of("model.layers.0.linear_attn.in_proj_qkvz", None),
            Bucket::LinearAttention
        );
        assert_eq!(
            bucket_of("model.layers.0.mlp.gate", None),
            Bucket::MoeRouter
        );
        assert_eq!(bucket_of("model.layers.0.mlp.gate_proj", None), Bucket::Mlp);
        assert_eq!(
            bucket_of("model.layers.0.mlp.experts.3.down_proj", None),
            Bucket::MoeExperts
        );
        assert_eq!(
            bucket_of("model.layers.61.self_attn.q_proj", Some(61)),
            Bucket::Mtp
        );
        assert_eq!(bucket_of("mtp.layers.0.mlp.up_proj", None), Bucket::Mtp);
        assert_eq!(bucket_of("blk.3.attn_q", None), Bucket::Attention);
        assert_eq!(bucket_of("blk.3.ffn_gate_inp", None), Bucket::MoeRouter);
        assert_eq!(bucket_of("blk.3.ffn_up_exps", None), Bucket::MoeExperts);
        assert_eq!(bucket_of("blk.3.ssm_out", None), Bucket::LinearAttention);
        assert_eq!(bucket_of("output", None), Bucket::LmHead);
        assert_eq!(bucket_of("token_embd", None), Bucket::Embeddings);
    }

    #[test]
    fn tensor_names_split_into_module_and_role() {
        assert_eq!(split_name("a.b.weight_scale_inv"), ("a.b", Role::ScaleInv));
        assert_eq!(
            split_name("a.b.weight.quant_state.bitsandbytes__nf4"),
            ("a.b", Role::QuantState)
        );
        assert_eq!(
            split_name("m.experts.gate_up_proj_blocks"),
            ("m.experts.gate_up_proj", Role::Blocks)
        );
        assert_eq!(split_name("m.norm.weight"), ("m.norm", Role::Weight));
    }
}
