//! What a checkpoint's configuration declares about its quantization: `config.json`
//! `quantization_config` (compressed-tensors, fine-grained FP8, AWQ, GPTQ, ModelOpt,
//! bitsandbytes, gpt-oss MXFP4), `hf_quant_config.json` (ModelOpt) and MLX's `quantization`.
//! Any other `quant_method` is kept as declared and marked unknown (`Declared::unknown_method`).
//!
//! Declarations are only cross-checked against what the tensors hold; the tensors decide.

use regex::Regex;
use serde_json::Value;

/// How a config names modules.
#[derive(Debug, Clone)]
pub enum Pattern {
    /// A class name such as `Linear`: matches every linear module.
    Class(String),
    /// compressed-tensors `re:` patterns (Python `re.match`: anchored at the start).
    Regex(Regex),
    /// ModelOpt wildcards (`fnmatch`).
    Glob(Regex),
    /// transformers' `modules_to_not_convert`: the key appears in the name on component
    /// boundaries (`mlp.gate` matches `layers.0.mlp.gate` but not `layers.0.mlp.gate_proj`, which
    /// real checkpoints that list `mlp.gate` do quantize).
    Component(String),
    /// An exact module name.
    Exact(String),
}

impl Pattern {
    pub fn matches(&self, module: &str) -> bool {
        match self {
            Pattern::Class(class) => class == "Linear" || class.ends_with("Linear"),
            Pattern::Regex(re) | Pattern::Glob(re) => re.is_match(module),
            Pattern::Component(s) => {
                let s = s.trim_matches('.');
                module == s
                    || module.starts_with(&format!("{s}."))
                    || module.ends_with(&format!(".{s}"))
                    || module.contains(&format!(".{s}."))
            }
            Pattern::Exact(s) => module == s || module.ends_with(&format!(".{s}")),
        }
    }

    fn compressed_tensors(text: &str) -> Pattern {
        if let Some(re) = text.strip_prefix("re:") {
            if let Ok(re) = Regex::new(&format!("^(?:{re})")) {
                return Pattern::Regex(re);
            }
            return Pattern::Exact(text.to_owned());
        }
        if text.chars().next().is_some_and(char::is_uppercase) && !text.contains('.') {
            return Pattern::Class(text.to_owned());
        }
        Pattern::Exact(text.to_owned())
    }

    fn glob(text: &str) -> Pattern {
        let mut re = String::from("^");
        for c in text.chars() {
            match c {
                '*' => re.push_str(".*"),
                '?' => re.push('.'),
                c => re.push_str(&regex::escape(&c.to_string())),
            }
        }
        re.push('$');
        Regex::new(&re).map_or_else(|_| Pattern::Exact(text.to_owned()), Pattern::Glob)
    }
}

/// The weight quantization a config declares for some modules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightDecl {
    pub bits: Option<u64>,
    /// `int` or `float`.
    pub kind: Option<String>,
    pub group_size: Option<u64>,
    pub block: Option<[u64; 2]>,
    pub strategy: Option<String>,
    pub symmetric: Option<bool>,
    pub format: Option<String>,
    /// The group's input activations, e.g. `dynamic float8 token` (absent: weight-only).
    pub activations: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Group {
    pub targets: Vec<Pattern>,
    pub weights: WeightDecl,
    /// e.g. `dynamic float8 token`, `static float8 tensor`, `nvfp4 dynamic local`.
    pub activations: Option<String>,
}

/// A declaration read from the checkpoint's configuration files.
#[derive(Debug, Clone)]
pub struct Declared {
    /// Where it was read (`config.json quantization_config`, `hf_quant_config.json`).
    pub source: String,
    /// `quant_method` (or `mlx`).
    pub method: String,
    pub groups: Vec<Group>,
    pub ignore: Vec<Pattern>,
    /// Text of the ignore list as written, for messages.
    pub ignore_text: Vec<String>,
    pub kv_cache: Option<String>,
    /// Methods that never quantize `lm_head` unless told (AWQ, GPTQ, bitsandbytes, fine FP8).
    pub lm_head_default_excluded: bool,
    /// A method cardproof reads (`KNOWN_METHODS`, ModelOpt's file, MLX); false for any other
    /// `quant_method`, whose declaration says nothing cardproof can check.
    pub known: bool,
}

/// The `quant_method` values of `config.json` `quantization_config` that cardproof reads.
pub const KNOWN_METHODS: [&str; 7] = [
    "compressed-tensors",
    "fp8",
    "awq",
    "gptq",
    "modelopt",
    "bitsandbytes",
    "mxfp4",
];

/// What the declaration says about one module.
#[derive(Debug, Clone, PartialEq)]
pub enum Expectation {
    Excluded,
    Quantized(WeightDecl),
    /// The declaration says nothing about this module.
    Silent,
}

impl Declared {
    /// What is wrong with the declared method when cardproof does not know it: the method as
    /// written (or its absence) and the known ones. `None` for a known method.
    pub fn unknown_method(&self) -> Option<String> {
        if self.known {
            return None;
        }
        let what = if self.method.is_empty() {
            "has no `quant_method` string".to_owned()
        } else {
            format!(
                "declares quant_method `{}`, which cardproof does not know",
                self.method
            )
        };
        Some(format!(
            "{} {what} (known: {})",
            self.source,
            KNOWN_METHODS.join(", ")
        ))
    }

    pub fn expectation(&self, module: &str) -> Expectation {
        if self.ignore.iter().any(|p| p.matches(module)) {
            return Expectation::Excluded;
        }
        if self.lm_head_default_excluded && module.ends_with("lm_head") {
            return Expectation::Excluded;
        }
        // Later groups win, as in compressed-tensors when targets overlap.
        for group in self.groups.iter().rev() {
            if group.targets.iter().any(|p| p.matches(module)) {
                return Expectation::Quantized(group.weights.clone());
            }
        }
        Expectation::Silent
    }
}

/// Read the declaration from `config.json` (already parsed) and `hf_quant_config.json`, if any.
pub fn declared(config: Option<&Value>, hf_quant_config: Option<&Value>) -> Option<Declared> {
    if let Some(hq) = hf_quant_config
        && let Some(q) = hq.get("quantization")
    {
        return Some(modelopt(q, "hf_quant_config.json"));
    }
    let config = config?;
    if let Some(q) = config.get("quantization_config") {
        let method = q
            .get("quant_method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        return Some(match method {
            "compressed-tensors" => compressed_tensors(q),
            "fp8" => fine_grained_fp8(q),
            "awq" => awq(q),
            "gptq" => gptq(q),
            "modelopt" => modelopt(q, "config.json quantization_config"),
            "bitsandbytes" => bitsandbytes(q),
            "mxfp4" => mxfp4(q),
            other => Declared {
                known: false,
                ..base("config.json quantization_config", other)
            },
        });
    }
    config
        .get("quantization")
        .filter(|q| q.is_object())
        .map(mlx)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn u64_at(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

fn base(source: &str, method: &str) -> Declared {
    Declared {
        source: source.into(),
        method: method.into(),
        groups: Vec::new(),
        ignore: Vec::new(),
        ignore_text: Vec::new(),
        kv_cache: None,
        lm_head_default_excluded: false,
        known: true,
    }
}

fn compressed_tensors(q: &Value) -> Declared {
    let mut d = base("config.json quantization_config", "compressed-tensors");
    let global_format = q.get("format").and_then(Value::as_str).map(str::to_owned);
    if let Some(groups) = q.get("config_groups").and_then(Value::as_object) {
        for group in groups.values() {
            let w = group.get("weights").unwrap_or(&Value::Null);
            let block = w
                .get("block_structure")
                .and_then(Value::as_array)
                .and_then(|a| Some([a.first()?.as_u64()?, a.get(1)?.as_u64()?]));
            let weights = WeightDecl {
                bits: u64_at(w, "num_bits"),
                kind: w.get("type").and_then(Value::as_str).map(str::to_owned),
                group_size: u64_at(w, "group_size"),
                block,
                strategy: w.get("strategy").and_then(Value::as_str).map(str::to_owned),
                symmetric: w.get("symmetric").and_then(Value::as_bool),
                format: group
                    .get("format")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .or_else(|| global_format.clone()),
                activations: None,
            };
            let activations = group
                .get("input_activations")
                .filter(|a| a.is_object())
                .map(|a| {
                    let dynamic = match a.get("dynamic") {
                        Some(Value::Bool(true)) => "dynamic",
                        Some(Value::String(s)) if s == "local" => "dynamic-local",
                        _ => "static",
                    };
                    format!(
                        "{dynamic} {}{} {}",
                        a.get("type").and_then(Value::as_str).unwrap_or("?"),
                        u64_at(a, "num_bits").unwrap_or(0),
                        a.get("strategy").and_then(Value::as_str).unwrap_or("?")
                    )
                });
            let weights = WeightDecl {
                activations: activations.clone(),
                ..weights
            };
            let targets = strings(group.get("targets"))
                .iter()
                .map(|t| Pattern::compressed_tensors(t))
                .collect();
            d.groups.push(Group {
                targets,
                weights,
                activations,
            });
        }
    }
    d.ignore_text = strings(q.get("ignore"));
    d.ignore = d
        .ignore_text
        .iter()
        .map(|t| Pattern::compressed_tensors(t))
        .collect();
    d.kv_cache = q
        .get("kv_cache_scheme")
        .filter(|v| !v.is_null())
        .map(Value::to_string);
    d
}

/// `modules_to_not_convert` style lists.
fn not_convert(d: &mut Declared, q: &Value, key: &str) {
    d.ignore_text = strings(q.get(key));
    d.ignore = d
        .ignore_text
        .iter()
        .map(|s| Pattern::Component(s.clone()))
        .collect();
}

fn all_linear(weights: WeightDecl) -> Group {
    Group {
        targets: vec![Pattern::Class("Linear".into())],
        weights,
        activations: None,
    }
}

fn fine_grained_fp8(q: &Value) -> Declared {
    let mut d = base("config.json quantization_config", "fp8");
    let block = q
        .get("weight_block_size")
        .and_then(Value::as_array)
        .and_then(|a| Some([a.first()?.as_u64()?, a.get(1)?.as_u64()?]));
    let activations = q
        .get("activation_scheme")
        .and_then(Value::as_str)
        .map(|s| format!("{s} float8"));
    let mut group = all_linear(WeightDecl {
        bits: Some(8),
        kind: Some("float".into()),
        block,
        strategy: Some(if block.is_some() { "block" } else { "tensor" }.into()),
        activations: activations.clone(),
        ..Default::default()
    });
    group.activations = activations;
    d.groups.push(group);
    not_convert(&mut d, q, "modules_to_not_convert");
    d.lm_head_default_excluded = true;
    d
}

fn awq(q: &Value) -> Declared {
    let mut d = base("config.json quantization_config", "awq");
    d.groups.push(all_linear(WeightDecl {
        bits: u64_at(q, "bits").or(u64_at(q, "w_bit")),
        kind: Some("int".into()),
        group_size: u64_at(q, "group_size").or(u64_at(q, "q_group_size")),
        strategy: Some("group".into()),
        symmetric: q.get("zero_point").and_then(Value::as_bool).map(|z| !z),
        ..Default::default()
    }));
    not_convert(&mut d, q, "modules_to_not_convert");
    d.lm_head_default_excluded = true;
    d
}

fn gptq(q: &Value) -> Declared {
    let mut d = base("config.json quantization_config", "gptq");
    let group_size = q
        .get("group_size")
        .and_then(Value::as_i64)
        .filter(|g| *g > 0)
        .map(|g| g as u64);
    d.groups.push(all_linear(WeightDecl {
        bits: u64_at(q, "bits"),
        kind: Some("int".into()),
        group_size,
        strategy: Some(
            if group_size.is_some() {
                "group"
            } else {
                "channel"
            }
            .into(),
        ),
        symmetric: q.get("sym").and_then(Value::as_bool),
        ..Default::default()
    }));
    not_convert(&mut d, q, "modules_to_not_convert");
    d.lm_head_default_excluded = !q.get("lm_head").and_then(Value::as_bool).unwrap_or(false);
    d
}

fn bitsandbytes(q: &Value) -> Declared {
    let mut d = base("config.json quantization_config", "bitsandbytes");
    let four = q
        .get("load_in_4bit")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    d.groups.push(all_linear(WeightDecl {
        bits: Some(if four { 4 } else { 8 }),
        kind: q
            .get("bnb_4bit_quant_type")
            .and_then(Value::as_str)
            .filter(|_| four)
            .map(str::to_owned)
            .or(Some("int".into())),
        ..Default::default()
    }));
    not_convert(&mut d, q, "llm_int8_skip_modules");
    d.lm_head_default_excluded = true;
    d
}

/// gpt-oss MXFP4 (transformers' `Mxfp4Config`): the MoE experts only, so nothing is said about
/// the other modules but what `modules_to_not_convert` keeps out.
fn mxfp4(q: &Value) -> Declared {
    let mut d = base("config.json quantization_config", "mxfp4");
    not_convert(&mut d, q, "modules_to_not_convert");
    d
}

fn modelopt(q: &Value, source: &str) -> Declared {
    let mut d = base(source, "modelopt");
    let algo = q
        .get("quant_algo")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let group_size = u64_at(q, "group_size");
    let weights_for = |algo: &str, group: Option<u64>| -> WeightDecl {
        match algo {
            "NVFP4" | "NVFP4_AWQ" => WeightDecl {
                bits: Some(4),
                kind: Some("nvfp4".into()),
                group_size: group.or(Some(16)),
                strategy: Some("tensor_group".into()),
                ..Default::default()
            },
            "FP8" | "FP8_PER_CHANNEL_PER_TOKEN" => WeightDecl {
                bits: Some(8),
                kind: Some("float".into()),
                strategy: Some(if algo == "FP8" { "tensor" } else { "channel" }.into()),
                ..Default::default()
            },
            "W4A16_AWQ" | "W4A8_AWQ" => WeightDecl {
                bits: Some(4),
                kind: Some("int".into()),
                group_size: group,
                strategy: Some("group".into()),
                ..Default::default()
            },
            "W8A16" | "W8A8_SQ_PER_CHANNEL" => WeightDecl {
                bits: Some(8),
                kind: Some("int".into()),
                strategy: Some("channel".into()),
                ..Default::default()
            },
            "W4A8_MXFP4_FP8" => WeightDecl {
                bits: Some(4),
                kind: Some("mxfp4".into()),
                group_size: Some(32),
                ..Default::default()
            },
            _ => WeightDecl::default(),
        }
    };
    if algo == "MIXED_PRECISION" {
        if let Some(layers) = q.get("quantized_layers").and_then(Value::as_object) {
            for (name, spec) in layers {
                let layer_algo = spec
                    .get("quant_algo")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                d.groups.push(Group {
                    targets: vec![Pattern::Exact(name.clone())],
                    weights: weights_for(layer_algo, u64_at(spec, "group_size")),
                    activations: None,
                });
            }
        }
    } else if !algo.is_empty() {
        d.groups.push(all_linear(weights_for(&algo, group_size)));
    }
    d.ignore_text = strings(q.get("exclude_modules").or_else(|| q.get("ignore")));
    d.ignore = d.ignore_text.iter().map(|s| Pattern::glob(s)).collect();
    d.kv_cache = q
        .get("kv_cache_quant_algo")
        .and_then(Value::as_str)
        .map(str::to_owned);
    d
}

fn mlx(q: &Value) -> Declared {
    let mut d = base("config.json quantization", "mlx");
    let mode = q.get("mode").and_then(Value::as_str).unwrap_or("affine");
    let weights = |spec: &Value| WeightDecl {
        bits: u64_at(spec, "bits"),
        kind: Some(mode.to_owned()),
        group_size: u64_at(spec, "group_size"),
        strategy: Some("group".into()),
        symmetric: Some(false),
        ..Default::default()
    };
    d.groups.push(all_linear(weights(q)));
    if let Some(map) = q.as_object() {
        for (name, spec) in map {
            match spec {
                Value::Object(_) => d.groups.push(Group {
                    targets: vec![Pattern::Exact(name.clone())],
                    weights: weights(spec),
                    activations: None,
                }),
                Value::Bool(false) => {
                    d.ignore_text.push(name.clone());
                    d.ignore.push(Pattern::Exact(name.clone()));
                }
                _ => {}
            }
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn compressed_tensors_targets_and_ignore() {
        let config = json!({"quantization_config": {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {
                "g0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true}},
                "g1": {"targets": ["re:.*mlp.*"], "format": "nvfp4-pack-quantized",
                        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}
            },
            "ignore": ["lm_head", "re:.*mlp.gate$"]}});
        let d = declared(Some(&config), None).unwrap();
        assert_eq!(d.expectation("lm_head"), Expectation::Excluded);
        assert_eq!(
            d.expectation("model.layers.0.mlp.gate"),
            Expectation::Excluded
        );
        let Expectation::Quantized(w) = d.expectation("model.layers.0.mlp.up_proj") else {
            panic!()
        };
        assert_eq!(
            (w.bits, w.group_size, w.format.as_deref()),
            (Some(4), Some(16), Some("nvfp4-pack-quantized"))
        );
        let Expectation::Quantized(w) = d.expectation("model.layers.0.self_attn.q_proj") else {
            panic!()
        };
        assert_eq!(w.strategy.as_deref(), Some("channel"));
    }

    #[test]
    fn a_method_cardproof_does_not_know_is_marked_unknown() {
        let with = |q: Value| declared(Some(&json!({ "quantization_config": q })), None).unwrap();
        let d = with(json!({"quant_method": "zzz-unknown", "bits": 4}));
        assert!(!d.known);
        assert_eq!(d.method, "zzz-unknown");
        let why = d.unknown_method().unwrap();
        assert!(why.contains("`zzz-unknown`"), "{why}");
        assert!(why.contains(&KNOWN_METHODS.join(", ")), "{why}");
        assert!(
            with(json!({"bits": 4}))
                .unknown_method()
                .unwrap()
                .contains("no `quant_method`")
        );
        for method in KNOWN_METHODS {
            assert_eq!(
                with(json!({ "quant_method": method })).unknown_method(),
                None,
                "{method}"
            );
        }
        // gpt-oss: MXFP4 experts; what modules_to_not_convert names stays out.
        let d = with(json!({"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}));
        assert_eq!(d.expectation("lm_head"), Expectation::Excluded);
        assert_eq!(
            d.expectation("model.layers.0.mlp.experts"),
            Expectation::Silent
        );
        let hq = json!({"quantization": {"quant_algo": "FP8"}});
        assert!(declared(None, Some(&hq)).unwrap().known);
        let mlx = json!({"quantization": {"group_size": 64, "bits": 4}});
        assert!(declared(Some(&mlx), None).unwrap().known);
    }

    #[test]
    fn modelopt_wildcards() {
        let hq = json!({"producer": {"name": "modelopt"}, "quantization": {
            "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head", "model.layers.0.linear_attn*"]}});
        let d = declared(None, Some(&hq)).unwrap();
        assert_eq!(
            d.expectation("model.layers.0.linear_attn.in_proj_qkvz"),
            Expectation::Excluded
        );
        assert!(matches!(
            d.expectation("model.layers.1.linear_attn.in_proj_qkvz"),
            Expectation::Quantized(_)
        ));
    }

    #[test]
    fn fine_grained_fp8_keeps_lm_head_by_default() {
        let config = json!({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["mlp.gate"]}});
        let d = declared(Some(&config), None).unwrap();
        assert_eq!(d.expectation("lm_head"), Expectation::Excluded);
        assert_eq!(
            d.expectation("model.layers.3.mlp.gate"),
            Expectation::Excluded
        );
        let Expectation::Quantized(w) = d.expectation("model.layers.3.mlp.down_proj") else {
            panic!()
        };
        assert_eq!(w.block, Some([128, 128]));
    }
}
