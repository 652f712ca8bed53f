//! The decoder's shape, from `config.json` or GGUF metadata, validated before any weight loads.

use std::path::Path;

use serde_json::Value;

use super::moe::{MoeConfig, MoeFamily};
use crate::error::{Error, Result};

/// Architectures the native runner implements (HF `model_type` spellings).
pub const SUPPORTED: &[&str] = &["llama", "mistral", "qwen2", "qwen3", "qwen3_moe"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen3's attention with sparse mixture-of-experts feed-forward layers ([`super::moe`]).
    Qwen3Moe,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "mistral" => Some(Arch::Mistral),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "qwen3_moe" => Some(Arch::Qwen3Moe),
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
        }
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
        let bad = |key: &str, rule: String| Error::format(path, Some(key), rule);
        let unsupported = |key: &str, rule: String| Error::unsupported(path, Some(key), rule);
        let model_type = config
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                bad(
                    "model_type",
                    "missing (needed to choose the architecture)".into(),
                )
            })?;
        let arch = Arch::from_name(model_type).ok_or_else(|| {
            unsupported(
                "model_type",
                format!(
                    "architecture `{model_type}` is not supported by the native runner (supported: {})",
                    SUPPORTED.join(", ")
                ),
            )
        })?;
        let uint = |key: &str| -> Result<usize> {
            match config.get(key) {
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad(key, format!("must be a positive integer, found {v}"))),
                None => Err(bad(key, "missing".into())),
            }
        };
        let opt_uint = |key: &str| -> Result<Option<usize>> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(_) => uint(key).map(Some),
            }
        };
        let hidden = uint("hidden_size")?;
        let heads = uint("num_attention_heads")?;
        let kv_heads = opt_uint("num_key_value_heads")?.unwrap_or(heads);
        let head_dim = match opt_uint("head_dim")? {
            Some(d) => d,
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(bad(
                    "head_dim",
                    format!(
                        "missing, and hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
                    ),
                ));
            }
        };
        let rope = config.get("rope_parameters").or(config.get("rope_scaling"));
        let rope_theta = config
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| rope?.get("rope_theta")?.as_f64())
            .unwrap_or(10_000.0);
        let rope_scaling = match rope {
            None | Some(Value::Null) => None,
            Some(r) => {
                let kind = r
                    .get("rope_type")
                    .or(r.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                match kind {
                    "default" => None,
                    "llama3" => {
                        let f = |k: &str| {
                            r.get(k).and_then(Value::as_f64).ok_or_else(|| {
                                bad("rope_scaling", format!("llama3 scaling needs `{k}`"))
                            })
                        };
                        Some(Llama3Scaling {
                            factor: f("factor")?,
                            low_freq_factor: f("low_freq_factor")?,
                            high_freq_factor: f("high_freq_factor")?,
                            original_max_position: f("original_max_position_embeddings")?,
                        })
                    }
                    other => {
                        return Err(unsupported(
                            "rope_scaling",
                            format!(
                                "RoPE scaling `{other}` is not supported by the native runner (supported: default, llama3)"
                            ),
                        ));
                    }
                }
            }
        };
        let use_sliding = config
            .get("use_sliding_window")
            .and_then(Value::as_bool)
            .unwrap_or(arch == Arch::Mistral);
        let sliding_window = if use_sliding {
            opt_uint("sliding_window")?
        } else {
            None
        };
        let flag = |key: &str| -> Result<bool> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(v) => Err(bad(key, format!("must be true or false, found {v}"))),
            }
        };
        let biases = match arch {
            Arch::Qwen2 => Biases {
                qkv: true,
                o: false,
                mlp: false,
            },
            Arch::Mistral => Biases::default(),
            Arch::Llama | Arch::Qwen3 | Arch::Qwen3Moe => {
                let attention = flag("attention_bias")?;
                Biases {
                    qkv: attention,
                    o: attention,
                    mlp: arch == Arch::Llama && flag("mlp_bias")?,
                }
            }
        };
        let layers = uint("num_hidden_layers")?;
        let moe = match arch {
            Arch::Qwen3Moe => Some(MoeConfig::from_hf(
                path,
                config,
                MoeFamily::Qwen3Moe,
                layers,
            )?),
            _ => None,
        };
        let cfg = ModelConfig {
            moe,
            biases,
            arch,
            hidden,
            intermediate: uint("intermediate_size")?,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab: uint("vocab_size")?,
            rms_eps: config
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            tie_embeddings: config
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            sliding_window,
            max_positions: opt_uint("max_position_embeddings")?,
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    pub fn validate(&self, path: &Path) -> Result<()> {
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::format(
                path,
                Some("num_key_value_heads"),
                format!(
                    "{} does not divide num_attention_heads {}",
                    self.kv_heads, self.heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::format(
                path,
                Some("head_dim"),
                format!(
                    "{} is odd; rotary embeddings need an even head size",
                    self.head_dim
                ),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(Error::format(
                path,
                Some("rope_theta"),
                format!("{} is not a positive number", self.rope_theta),
            ));
        }
        Ok(())
    }

    /// Inverse frequencies of the rotary embedding, one per pair of dimensions.
    pub fn inv_freq(&self) -> Vec<f64> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let f = 1.0 / self.rope_theta.powf(2.0 * i as f64 / self.head_dim as f64);
                match self.rope_scaling {
                    None => f,
                    Some(s) => llama3_scale(f, s),
                }
            })
            .collect()
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
