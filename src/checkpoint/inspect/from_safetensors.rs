//! The safetensors inspection: tensors grouped into modules, each classified by its layout.
//!
//! A module's tensors (weight, packed weight, scales, zero points, quant state) are read from the
//! headers and matched against the layouts of the known quantization schemes (bitsandbytes,
//! MXFP4, NVFP4, AWQ, GPTQ, compressed-tensors, FP8, INT8, MLX), with the checkpoint's
//! `config.json` and `hf_quant_config.json` as hints. It is by far the largest reader, and the
//! only one that needs the quantization config, so it is separate from the GGUF one.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::cross_check::cross_check;
use super::naming::{Role, bucket_of, split_name};
use super::{
    Bucket, DeclaredSummary, FileSummary, Inspection, Module, Status, Summary, finish, relative,
};
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::quant_config::{self, Declared, Expectation};
use crate::checkpoint::safetensors::{self, SafetensorsCheckpoint, TensorInfo};
use crate::error::{Error, Result};
use crate::findings::{Code, Finding};

/// bitsandbytes' quant-state blobs are a few hundred bytes of JSON.
const MAX_QUANT_STATE_BYTES: u64 = 64 * 1024;

/// `config.json` and `hf_quant_config.json` next to the weights.
pub(super) struct Configs {
    config: Option<Value>,
    hf_quant: Option<Value>,
}

impl Configs {
    pub(super) fn read(dir: &Path) -> Result<Configs> {
        Ok(Configs {
            config: crate::files::read_config_if_present(&dir.join("config.json"))?,
            hf_quant: crate::files::read_config_if_present(&dir.join("hf_quant_config.json"))?,
        })
    }
}

struct Member<'a> {
    role: Role,
    info: &'a TensorInfo,
    file: &'a safetensors::SafetensorsFile,
}

pub(super) fn inspect_safetensors(
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
            file_type: None,
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
    let group = Group::new(prefix, members, declared, mtp_layer);
    if let Some(classified) = group.bitsandbytes()? {
        return Ok(classified);
    }
    if let Some(classified) = group.packed()? {
        return Ok(classified);
    }
    let Some(weight) = group.find(Role::Weight) else {
        return Ok(group.without_weight());
    };
    let is_linear_shape = weight.shape.len() >= 2 && weight.shape.len() <= 3;
    // A Gated DeltaNet's (or Mamba's) depthwise causal convolution, `[channels, 1, kernel]`, is an
    // `nn.Conv1d`: quantizers' `Linear` targets never cover it, so a float one is a parameter of
    // its layer, not a module left in high precision.
    let is_depthwise_conv = prefix.ends_with(".conv1d")
        && weight.shape.len() == 3
        && weight.shape[1] == 1
        && !group.quantized_by_scales;
    if (!is_linear_shape || is_depthwise_conv) && group.bucket != Bucket::Embeddings {
        return Ok(Classified::NotLinear(float_parameters(members)));
    }
    if weight.dtype.is_high_precision_float() && !group.quantized_by_scales {
        let scheme = weight.dtype.name().to_ascii_lowercase();
        return Ok(Classified::Module(group.module(
            scheme,
            weight.shape.clone(),
            None,
            None,
        )));
    }
    Ok(group.quantized_weight(weight))
}

/// One module's tensors with what every layout check needs (its bucket, the declaration's
/// expectation, the bytes its weights take), so that each family of layouts is matched in a
/// method of its own, in the order `classify` tries them.
struct Group<'g, 'a> {
    prefix: &'g str,
    members: &'g [Member<'a>],
    declared: Option<&'g Declared>,
    expectation: Option<Expectation>,
    /// The bits the declaration gives this module's weights, if any.
    decl_bits: Option<u64>,
    storage_bytes: u64,
    bucket: Bucket,
    quantized_by_scales: bool,
}

impl<'g, 'a> Group<'g, 'a> {
    fn new(
        prefix: &'g str,
        members: &'g [Member<'a>],
        declared: Option<&'g Declared>,
        mtp_layer: Option<u64>,
    ) -> Self {
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
        Group {
            prefix,
            members,
            declared,
            expectation,
            decl_bits,
            storage_bytes,
            bucket,
            quantized_by_scales,
        }
    }

    fn find(&self, role: Role) -> Option<&'g TensorInfo> {
        self.members.iter().find(|m| m.role == role).map(|m| m.info)
    }

    fn has(&self, role: Role) -> bool {
        self.members.iter().any(|m| m.role == role)
    }

    /// The module with this scheme and logical shape; its bits per weight are the bytes its
    /// weight tensors take over its parameters.
    fn module(
        &self,
        scheme: String,
        shape: Vec<u64>,
        group: Option<Value>,
        symmetric: Option<bool>,
    ) -> Module {
        let parameters = shape.iter().product::<u64>();
        let bits = if parameters == 0 {
            0.0
        } else {
            self.storage_bytes as f64 * 8.0 / parameters as f64
        };
        let status = if is_high_precision_scheme(&scheme) {
            Status::HighPrecision
        } else {
            Status::Quantized
        };
        let activations = (status == Status::Quantized)
            .then(|| activation_scheme(&scheme, self.members, &self.expectation))
            .flatten();
        Module {
            name: self.prefix.to_owned(),
            status,
            scheme,
            bits_per_weight: bits,
            bucket: self.bucket,
            shape,
            parameters,
            group_size: group,
            symmetric,
            activations,
        }
    }

    /// bitsandbytes: 4-bit with its quant-state blob, or int8 with `.SCB` scales.
    fn bitsandbytes(&self) -> Result<Option<Classified>> {
        // bitsandbytes 4-bit: the logical shape lives in a small JSON tensor.
        if let Some(state) = self.members.iter().find(|m| m.role == Role::QuantState) {
            let blob = safetensors::read_tensor_bytes(
                state.file,
                &state.info.name,
                MAX_QUANT_STATE_BYTES,
            )?;
            let json: Value = serde_json::from_slice(&blob).map_err(|e| {
                Error::format(
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
            return Ok(Some(Classified::Module(self.module(
                kind.into(),
                shape,
                group,
                Some(true),
            ))));
        }
        if let Some(w) = self.find(Role::Weight)
            && self
                .find(Role::Scale)
                .is_some_and(|s| s.name.ends_with(".SCB"))
        {
            return Ok(Some(Classified::Module(self.module(
                "bnb-int8".into(),
                w.shape.clone(),
                None,
                Some(true),
            ))));
        }
        Ok(None)
    }

    /// Layouts whose weight is not a plain `weight` tensor: MXFP4 blocks, AWQ/GPTQ `qweight`,
    /// and compressed-tensors' `weight_packed` (FP4 or packed ints).
    fn packed(&self) -> Result<Option<Classified>> {
        let mut module = |scheme: String, shape: Vec<u64>, group, symmetric| {
            self.module(scheme, shape, group, symmetric)
        };
        // gpt-oss MXFP4 experts: blocks [.., in/32, 16] U8 + scales [.., in/32] U8 (E8M0).
        if let (Some(blocks), Some(_)) = (self.find(Role::Blocks), self.find(Role::Scale)) {
            let mut shape = blocks.shape.clone();
            let last = shape.pop().unwrap_or(0);
            let groups = shape.pop().unwrap_or(0);
            shape.push(groups * last * 2);
            return Ok(Some(Classified::Module(module(
                "mxfp4".into(),
                shape,
                Some(32.into()),
                Some(true),
            ))));
        }
        // AWQ / GPTQ.
        if let (Some(q), Some(scales)) = (self.find(Role::QWeight), self.find(Role::Scale)) {
            return Ok(Some(classify_awq_gptq(
                q,
                scales,
                self.has(Role::Index),
                self.declared,
                self.decl_bits,
                &mut module,
            )));
        }
        match self.find(Role::Packed) {
            Some(packed) => self.weight_packed(packed).map(Some),
            None => Ok(None),
        }
    }

    /// compressed-tensors' `weight_packed`: FP4 two per byte, or ints packed into I32 words.
    fn weight_packed(&self, packed: &TensorInfo) -> Result<Classified> {
        let scale = self.find(Role::Scale);
        if packed.dtype == Dtype::U8 {
            // FP4 packed two per byte, U8 [out, in/2]: NVFP4 has E4M3 scales per 16 (and a
            // global scale), MXFP4 E8M0 scales per 32.
            let nvfp4 =
                self.has(Role::GlobalScale) || scale.is_some_and(|s| s.dtype == Dtype::F8_E4M3);
            let shape = vec![dim(packed, 0), dim(packed, 1) * 2];
            let group = scale.map(|s| group_of(shape[1], dim(s, 1)));
            let scheme = if nvfp4 { "nvfp4" } else { "mxfp4" };
            return Ok(Classified::Module(self.module(
                scheme.into(),
                shape,
                group,
                Some(true),
            )));
        }
        // pack-quantized ints: I32 [out, in*bits/32].
        let bits = self.decl_bits.unwrap_or(4);
        let shape = match self.find(Role::Shape) {
            Some(s) => read_shape(self.members, s)?,
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
        Ok(Classified::Module(self.module(
            scheme,
            shape,
            group,
            Some(!self.has(Role::Zeros)),
        )))
    }

    /// A group with no `weight` tensor: an unknown layout when it holds weight storage, else
    /// the parameters of norms and biases.
    fn without_weight(&self) -> Classified {
        if self.members.iter().any(|m| m.role.is_weight_storage()) {
            let names: Vec<&str> = self.members.iter().map(|m| m.info.name.as_str()).collect();
            let shape = self
                .members
                .first()
                .map(|m| m.info.shape.clone())
                .unwrap_or_default();
            return Classified::Unknown(
                self.module("unknown".into(), shape, None, None),
                format!("tensors {}", names.join(", ")),
            );
        }
        Classified::NotLinear(float_parameters(self.members))
    }

    /// A linear `weight` that is not a plain float: FP8, FP4 in U8, INT8, MLX affine, or an
    /// unknown layout naming its tensors.
    fn quantized_weight(&self, weight: &TensorInfo) -> Classified {
        let shape = weight.shape.clone();
        if weight.dtype.is_fp8() {
            if let Some(inv) = self.find(Role::ScaleInv) {
                let mut module = |scheme: String, shape: Vec<u64>, group, symmetric| {
                    self.module(scheme, shape, group, symmetric)
                };
                return fp8_block(weight, inv, self.declared, &mut module);
            }
            if let Some(scale) = self.find(Role::Scale) {
                return self.fp8_scaled(weight, scale);
            }
        }
        if weight.dtype == Dtype::U8
            && let Some(scale) = self.find(Role::Scale)
        {
            // ModelOpt NVFP4: U8 [out, in/2] + E4M3 [out, in/16] + weight_scale_2; MXFP4: E8M0
            // per 32.
            let shape = vec![dim(weight, 0), dim(weight, 1) * 2];
            let group = Some(group_of(shape[1], dim(scale, 1)));
            let scheme = if scale.dtype == Dtype::F8_E4M3 || self.has(Role::Scale2) {
                "nvfp4"
            } else {
                "mxfp4"
            };
            return Classified::Module(self.module(scheme.into(), shape, group, Some(true)));
        }
        if weight.dtype == Dtype::I8
            && let Some(scale) = self.find(Role::Scale)
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
            return Classified::Module(self.module(
                scheme.into(),
                shape,
                group,
                Some(!self.has(Role::Zeros)),
            ));
        }
        if weight.dtype == Dtype::U32
            && let Some(scale) = self.find(Role::Scale)
            && self.has(Role::Zeros)
        {
            // MLX affine: U32 [out, in*bits/32] + scales/biases [out, in/group].
            let bits = self.decl_bits.unwrap_or(4).clamp(1, 32);
            let shape = vec![dim(weight, 0), dim(weight, 1) * 32 / bits];
            let group = Some(group_of(shape[1], dim(scale, 1)));
            return Classified::Module(self.module(
                format!("int{bits}-group"),
                shape,
                group,
                Some(false),
            ));
        }
        let names: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{} {}", m.info.name, m.info.dtype))
            .collect();
        Classified::Unknown(
            self.module("unknown".into(), shape, None, None),
            names.join(", "),
        )
    }

    /// An FP8 weight with a `weight_scale`: per tensor, per output channel or per block, by the
    /// scale's size.
    fn fp8_scaled(&self, weight: &TensorInfo, scale: &TensorInfo) -> Classified {
        let shape = weight.shape.clone();
        if self.has(Role::Scale2) {
            return Classified::Unknown(
                self.module("unknown".into(), shape, None, None),
                "FP8 weight with two scale levels".into(),
            );
        }
        let numel = scale.numel();
        let (out, inn) = (dim(weight, 0), dim(weight, 1));
        Classified::Module(if numel <= 1 {
            self.module("fp8-tensor".into(), shape, None, Some(true))
        } else if numel == out {
            self.module("fp8-channel".into(), shape, None, Some(true))
        } else {
            let (r, c) = (dim(scale, 0).max(1), dim(scale, 1).max(1));
            let block = Value::from(vec![out.div_ceil(r), inn.div_ceil(c)]);
            self.module("fp8-block".into(), shape, Some(block), Some(true))
        })
    }
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
        return Err(Error::format(
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
    let out_from_scales = dim(scales, 1);
    let method = declared.map(|d| d.method.as_str());
    // AWQ packs 32/bits whole fields per word along the output dim ([in, out*bits/32], 4-bit
    // in practice); GPTQ packs a dense bit stream along the input dim ([in*bits/32, out]), so
    // 3-bit GPTQ holds 32 input rows in every 3 words.
    let awq_shaped = 32 % bits == 0 && dim(q, 1).checked_mul(32 / bits) == Some(out_from_scales);
    let gptq_shaped = dim(q, 1) == out_from_scales;
    let (scheme, shape) = if awq_shaped && method != Some("gptq") {
        ("awq", vec![out_from_scales, dim(q, 0)])
    } else if gptq_shaped {
        match gptq_in_features(dim(q, 0), bits) {
            Some(inf) => ("gptq", vec![out_from_scales, inf]),
            None => {
                return Classified::Unknown(
                    module(
                        "unknown".into(),
                        vec![out_from_scales, dim(q, 0)],
                        None,
                        None,
                    ),
                    format!(
                        "qweight {:?} has {} packed rows; {bits}-bit GPTQ packs 32 input rows into \
                         {bits} int32 words, so the rows must be a multiple of {}",
                        q.shape,
                        dim(q, 0),
                        bits / gcd(32, bits)
                    ),
                );
            }
        }
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

/// GPTQ's input features from its packed rows: `rows * 32 / bits`, exactly (3-bit: 32 values in
/// 3 words), or `None` when the rows hold no whole number of values.
fn gptq_in_features(rows: u64, bits: u64) -> Option<u64> {
    let packed_bits = rows.checked_mul(32)?;
    (bits > 0 && packed_bits % bits == 0).then(|| packed_bits / bits)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
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
