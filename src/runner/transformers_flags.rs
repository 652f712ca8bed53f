//! The `transformers` runner's settings as the command line gives them, and their checks: a
//! [`TransformersFlags`] of raw flag values becomes [`TransformersOptions`] (and a `--sweep` its
//! knob and values), every refusal a usage message naming the flag.

use std::path::PathBuf;

use crate::runner::transformers::{
    ATTENTION_IMPLEMENTATIONS, Device, GDN_KERNELS, TransformersOptions,
};

/// The raw values of `--python`, `--device`, `--torch-dtype`, `--attention`, `--chunk-size`,
/// `--head-rows`, `--tf32`, `--deterministic`, `--trust-remote-code`, `--sweep` and the hidden
/// development flags. [`Default`] is the command line's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransformersFlags {
    /// `None`: `$CARDPROOF_PYTHON`, else `python3`.
    pub python: Option<PathBuf>,
    /// `cuda`, `cuda:N`, `auto` or `cpu`.
    pub device: String,
    /// `bfloat16`, `float16` or `float32`; `None`: bfloat16, and `verify` may follow the card.
    pub torch_dtype: Option<String>,
    /// One of [`ATTENTION_IMPLEMENTATIONS`]; `None`: sdpa, and `verify` may follow the card.
    pub attention: Option<String>,
    /// One of [`GDN_KERNELS`]; `None`: transformers' choice.
    pub gdn_kernel: Option<String>,
    /// `None`: planned (the whole window when it fits).
    pub chunk_size: Option<u32>,
    /// `None`: planned from free memory.
    pub head_rows: Option<u32>,
    pub tf32: bool,
    pub deterministic: bool,
    pub trust_remote_code: bool,
    /// `KNOB=A,B,...` (see [`parse_sweep`]).
    pub sweep: Option<String>,
    /// A runner program in place of the embedded one (development).
    pub runner_script: Option<PathBuf>,
    /// Plan memory as if only this many bytes were free (tests).
    pub memory_limit: Option<u64>,
    /// `auto`, `device`, `host` or `disk`.
    pub keep_hidden: String,
    /// Write the first 64 scored rows' logits of both models into this directory.
    pub runner_dump: Option<PathBuf>,
}

impl Default for TransformersFlags {
    fn default() -> Self {
        TransformersFlags {
            python: None,
            device: "cuda".into(),
            torch_dtype: None,
            attention: None,
            gdn_kernel: None,
            chunk_size: None,
            head_rows: None,
            tf32: false,
            deterministic: false,
            trust_remote_code: false,
            sweep: None,
            runner_script: None,
            memory_limit: None,
            keep_hidden: "auto".into(),
            runner_dump: None,
        }
    }
}

/// Rows of each model's logits `--runner-dump` writes.
const DUMP_ROWS: usize = 64;

impl TransformersFlags {
    /// The runner's settings, validated (`--sweep` is read by [`TransformersFlags::sweep`]).
    pub fn options(&self) -> Result<TransformersOptions, String> {
        let device = Device::parse(&self.device).ok_or_else(|| {
            format!(
                "--device {}: expected cuda, cuda:N, auto or cpu",
                self.device
            )
        })?;
        let attention = self.attention.clone().unwrap_or_else(|| "sdpa".into());
        check_attention(&attention)?;
        if let Some(k) = &self.gdn_kernel {
            check_gdn_kernel(k).map_err(|e| format!("--gdn-kernel: {e}"))?;
        }
        let dtype = match self.torch_dtype.as_deref() {
            None => "bfloat16",
            Some(d @ ("bfloat16" | "float16" | "float32")) => d,
            Some(other) => {
                return Err(format!(
                    "--torch-dtype {other}: expected bfloat16, float16 or float32"
                ));
            }
        };
        let keep_hidden = match self.keep_hidden.as_str() {
            k @ ("auto" | "device" | "host" | "disk") => k,
            other => {
                return Err(format!(
                    "--keep-hidden {other}: expected auto, device, host or disk"
                ));
            }
        };
        let defaults = TransformersOptions::default();
        Ok(TransformersOptions {
            python: self.python.clone().unwrap_or(defaults.python),
            script: self.runner_script.clone(),
            device,
            dtype: dtype.into(),
            attention: (attention.clone(), attention),
            gdn_kernel: (self.gdn_kernel.clone(), self.gdn_kernel.clone()),
            follow_card: (self.attention.is_none(), self.torch_dtype.is_none()),
            chunk_size: self.chunk_size.map_or(0, |n| n as usize),
            head_rows: self.head_rows.map_or(0, |n| n as usize),
            tf32: self.tf32,
            deterministic: self.deterministic,
            trust_remote_code: self.trust_remote_code,
            memory_limit: self.memory_limit,
            mode: "auto".into(),
            keep_hidden: keep_hidden.into(),
            gates: false,
            dump_rows: self.runner_dump.clone().map(|d| (d, DUMP_ROWS)),
            kv_cache: (None, None),
            turns: None,
            recurrent_state: defaults.recurrent_state,
        })
    }

    /// `--sweep`, parsed and checked, when given.
    pub fn sweep(&self) -> Result<Option<(String, Vec<String>)>, String> {
        self.sweep.as_deref().map(parse_sweep).transpose()
    }
}

/// `--sweep KNOB=A,B,...`: the knob and its values, the first the baseline. The one knob is
/// `attention` (the weights stay the same, the kernel changes); each value one of
/// [`ATTENTION_IMPLEMENTATIONS`].
pub fn parse_sweep(s: &str) -> Result<(String, Vec<String>), String> {
    let (knob, values) = s
        .split_once('=')
        .ok_or_else(|| format!("--sweep {s}: expected KNOB=A,B (e.g. attention=eager,sdpa)"))?;
    let llamacpp = crate::runner::llamacpp::SWEEP_KNOBS.contains(&knob);
    if !matches!(knob, "attention" | "gdn_kernel" | "kv_cache") && !llamacpp {
        return Err(format!(
            "--sweep {s}: the knob can be `attention` or `gdn_kernel` (the kernel changes), `kv_cache` (the KV-cache scheme changes) or, with --runner llamacpp, {} (llama.cpp's settings); the weights stay the same",
            crate::runner::llamacpp::SWEEP_KNOBS.join(", ")
        ));
    }
    let values: Vec<String> = values.split(',').map(|v| v.trim().to_owned()).collect();
    if values.len() < 2 || values.iter().any(String::is_empty) {
        return Err(format!(
            "--sweep {s}: give at least two values, the first the baseline"
        ));
    }
    for v in &values {
        if llamacpp {
            crate::runner::llamacpp::with_knob(
                &crate::runner::llamacpp::LlamacppSettings::default(),
                knob,
                v,
            )
            .map_err(|e| format!("--sweep {s}: `{v}`: {e}"))?;
        } else if knob == "attention" {
            check_attention(v)?;
        } else if knob == "gdn_kernel" {
            check_gdn_kernel(v).map_err(|e| format!("--sweep {s}: {e}"))?;
        } else {
            match crate::runner::native::kv_cache::KvCacheSetting::from_label(v) {
                None => {
                    return Err(format!(
                        "--sweep {s}: {}",
                        crate::runner::native::kv_cache::KvCacheSetting::unknown_label(v)
                    ));
                }
                Some(setting) => {
                    setting
                        .checked_scales()
                        .map_err(|e| format!("--sweep {s}: `{v}`: {e}"))?;
                }
            }
        }
    }
    Ok((knob.to_owned(), values))
}

/// Whether `v` is a Gated DeltaNet kernel the runner can hold linear-attention layers to.
pub fn check_gdn_kernel(v: &str) -> Result<(), String> {
    if GDN_KERNELS.contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "GDN kernel {v:?} is not one of {}",
            GDN_KERNELS.join(", ")
        ))
    }
}

/// Whether `v` is an attention implementation the runner can ask transformers for.
pub fn check_attention(v: &str) -> Result<(), String> {
    if ATTENTION_IMPLEMENTATIONS.contains(&v) {
        Ok(())
    } else {
        Err(format!(
            "attention {v:?} is not one of {}",
            ATTENTION_IMPLEMENTATIONS.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(edit: impl Fn(&mut TransformersFlags)) -> Result<TransformersOptions, String> {
        let mut f = TransformersFlags::default();
        edit(&mut f);
        f.options()
    }

    /// The command line's defaults: one GPU, bfloat16, sdpa for both models, planned chunks,
    /// the card followed for attention and dtype, nothing recorded as changed.
    #[test]
    fn defaults() {
        let o = options(|_| {}).unwrap();
        assert_eq!(o.device, Device::Cuda(None));
        assert_eq!(o.dtype, "bfloat16");
        assert_eq!(o.attention, ("sdpa".to_owned(), "sdpa".to_owned()));
        assert_eq!(o.follow_card, (true, true));
        assert_eq!((o.chunk_size, o.head_rows), (0, 0));
        assert!(!o.tf32 && !o.deterministic && !o.trust_remote_code && !o.gates);
        assert_eq!((o.mode.as_str(), o.keep_hidden.as_str()), ("auto", "auto"));
        assert_eq!((o.script, o.memory_limit, o.dump_rows), (None, None, None));
        assert_eq!(o.python, TransformersOptions::default().python);
        assert_eq!(TransformersFlags::default().sweep(), Ok(None));
    }

    #[test]
    fn given_values_are_kept_and_stop_following_the_card() {
        let o = options(|f| {
            f.python = Some("/opt/py".into());
            f.device = "cuda:3".into();
            f.torch_dtype = Some("float32".into());
            f.attention = Some("eager".into());
            f.chunk_size = Some(256);
            f.head_rows = Some(32);
            f.tf32 = true;
            f.deterministic = true;
            f.trust_remote_code = true;
            f.keep_hidden = "disk".into();
            f.runner_dump = Some("dump".into());
        })
        .unwrap();
        assert_eq!(o.python, PathBuf::from("/opt/py"));
        assert_eq!(o.device, Device::Cuda(Some(3)));
        assert_eq!(o.dtype, "float32");
        assert_eq!(o.attention, ("eager".to_owned(), "eager".to_owned()));
        assert_eq!(o.follow_card, (false, false));
        assert_eq!((o.chunk_size, o.head_rows), (256, 32));
        assert!(o.tf32 && o.deterministic && o.trust_remote_code);
        assert_eq!(o.keep_hidden, "disk");
        assert_eq!(o.dump_rows, Some((PathBuf::from("dump"), 64)));
        for (device, parsed) in [("auto", Device::Auto), ("cpu", Device::Cpu)] {
            assert_eq!(
                options(|f| f.device = device.into()).unwrap().device,
                parsed
            );
        }
    }

    #[test]
    fn refusals() {
        assert_eq!(
            options(|f| f.device = "tpu".into()).unwrap_err(),
            "--device tpu: expected cuda, cuda:N, auto or cpu"
        );
        assert_eq!(
            options(|f| f.device = "cuda:x".into()).unwrap_err(),
            "--device cuda:x: expected cuda, cuda:N, auto or cpu"
        );
        assert_eq!(
            options(|f| f.attention = Some("magic".into())).unwrap_err(),
            "attention \"magic\" is not one of sdpa, sdpa:flash, sdpa:efficient, sdpa:cudnn, sdpa:math, eager, flash_attention_2, flash_attention_3, flex_attention"
        );
        assert_eq!(
            options(|f| f.torch_dtype = Some("int8".into())).unwrap_err(),
            "--torch-dtype int8: expected bfloat16, float16 or float32"
        );
        assert_eq!(
            options(|f| f.keep_hidden = "tape".into()).unwrap_err(),
            "--keep-hidden tape: expected auto, device, host or disk"
        );
    }

    #[test]
    fn sweep() {
        assert_eq!(
            parse_sweep("attention=eager, sdpa"),
            Ok((
                "attention".to_owned(),
                vec!["eager".to_owned(), "sdpa".to_owned()]
            ))
        );
        for (s, message) in [
            (
                "attention",
                "--sweep attention: expected KNOB=A,B (e.g. attention=eager,sdpa)",
            ),
            (
                "dtype=bf16,f32",
                "--sweep dtype=bf16,f32: the knob can be `attention` or `gdn_kernel` (the kernel changes), `kv_cache` (the KV-cache scheme changes) or, with --runner llamacpp, llamacpp.kv, llamacpp.flash_attn, llamacpp.backend (llama.cpp's settings); the weights stay the same",
            ),
            (
                "attention=sdpa",
                "--sweep attention=sdpa: give at least two values, the first the baseline",
            ),
            (
                "attention=sdpa,",
                "--sweep attention=sdpa,: give at least two values, the first the baseline",
            ),
            (
                "attention=sdpa,magic",
                "attention \"magic\" is not one of sdpa, sdpa:flash, sdpa:efficient, sdpa:cudnn, sdpa:math, eager, flash_attention_2, flash_attention_3, flex_attention",
            ),
            (
                "gdn_kernel=fla,triton",
                "--sweep gdn_kernel=fla,triton: GDN kernel \"triton\" is not one of fla, fla_recurrent, torch, torch_recurrent",
            ),
        ] {
            assert_eq!(parse_sweep(s).unwrap_err(), message);
        }
        let f = TransformersFlags {
            sweep: Some("attention=sdpa,eager".into()),
            ..TransformersFlags::default()
        };
        assert_eq!(f.sweep().unwrap().unwrap().1, ["sdpa", "eager"]);
        assert_eq!(
            parse_sweep("gdn_kernel=fla,torch").unwrap(),
            (
                "gdn_kernel".to_owned(),
                vec!["fla".to_owned(), "torch".to_owned()]
            )
        );
        assert_eq!(
            parse_sweep("attention=sdpa:flash,sdpa:cudnn").unwrap().1,
            ["sdpa:flash", "sdpa:cudnn"]
        );
    }

    #[test]
    fn the_gdn_kernel_is_checked_and_held_on_both_sides() {
        let o = options(|f| f.gdn_kernel = Some("torch_recurrent".into())).unwrap();
        assert_eq!(
            o.gdn_kernel,
            (
                Some("torch_recurrent".into()),
                Some("torch_recurrent".into())
            )
        );
        assert_eq!(options(|_| {}).unwrap().gdn_kernel, (None, None));
        let e = options(|f| f.gdn_kernel = Some("cuda".into())).unwrap_err();
        assert!(e.starts_with("--gdn-kernel: GDN kernel \"cuda\""), "{e}");
    }
}
