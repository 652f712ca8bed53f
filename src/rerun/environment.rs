//! Where and how a rerun ran: each runner's environment record, and the check that a runner ran
//! the KV cache it was asked for.

use std::path::Path;

use serde_json::Value;

use super::document::{Environment, RunnerKind};
use super::identity::tokenizer_record;
use crate::error::{Error, Result};
use crate::runner::native::{self, ComputeDtype, Emulate, NativeModel};
use crate::runner::tokens;

/// The CPU's model name, from /proc/cpuinfo where there is one.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

pub(super) fn reference_kv(candidate: &NativeModel, compute: ComputeDtype) -> String {
    if let Some(setting) = candidate.decoder.kv_cache_setting() {
        return setting.label();
    }
    match &candidate.decoder.report.kv_cache {
        Some(kv) if kv.starts_with("f16") => "f16".to_owned(),
        Some(_) => "fp8_e4m3".to_owned(),
        None => compute.as_str().to_owned(),
    }
}

/// What every native run records about where and how it ran.
pub(super) fn native_environment(
    candidate: &NativeModel,
    compute: ComputeDtype,
    emulate: Emulate,
    threads: usize,
) -> Environment {
    Environment {
        runner: RunnerKind::Native,
        runner_version: env!("CARGO_PKG_VERSION").into(),
        engine: "candle".into(),
        engine_version: Some(native::CANDLE_VERSION.into()),
        torch_version: None,
        cuda_version: None,
        device: format!("cpu: {}", cpu_name()),
        compute_dtype: compute.as_str().into(),
        attention: "eager".into(),
        kv_cache_dtype: Some(reference_kv(candidate, compute)),
        kv_cache: candidate.decoder.kv_cache_record(),
        kv_scales: candidate.decoder.computed_kv_scales(),
        recurrent_state_dtype: candidate
            .decoder
            .has_recurrent_state()
            .then(|| candidate.decoder.recurrent_state.as_str().into()),
        emulate: Some(emulate),
        threads: Some(threads),
        tf32: None,
        lane: match emulate {
            Emulate::ReferenceSemantics => "reference semantics: weights dequantized exactly as their format defines, declared activation and KV-cache quantization emulated (fake-quant), exact softmax attention",
            Emulate::LlamacppCpu => "llama.cpp cpu emulation: weights dequantized exactly, activations quantized to each weight type's ggml dot-product partner (q8_0, q8_K, f16, bf16; the output head's too), f16 KV cache, flash attention (f32 over the f16 cache)",
            Emulate::LlamacppCpuNoFa => "llama.cpp cpu emulation without flash attention: weights dequantized exactly, activations quantized to each weight type's ggml dot-product partner (q8_0, q8_K, f16, bf16; the output head's too), f16 KV cache, Q and the softmax weights rounded to f16 at their products with it",
        }
        .into(),
        tokenizer: None,
        reference_artifact: None,
        linear_attention: None,
        reference_linear_attention: None,
        transformers_runner: None,
        llamacpp: None,
    }
}

/// The environment record of a transformers run: what the runner reported, in the fields every
/// measurement has.
pub(super) fn transformers_environment(
    reported: &crate::runner::exchange::RunnerEnvironment,
    tokenizer: &tokens::TokenizerFile,
) -> Environment {
    let gpus = &reported.gpus;
    let device = match gpus.first() {
        Some(g) => format!(
            "{} (compute capability {}){}",
            g.name,
            g.compute_capability,
            if gpus.len() > 1 {
                format!(" x{}", gpus.len())
            } else {
                String::new()
            }
        ),
        None => format!("cpu: {}", cpu_name()),
    };
    let (reference, candidate) = reported.models.attentions();
    let attention = if reference == candidate {
        reference
    } else {
        format!("{reference} (reference), {candidate} (candidate)")
    };
    let (linear_attention, reference_linear_attention) = linear_attention_of(reported);
    Environment {
        runner: RunnerKind::Transformers,
        runner_version: env!("CARGO_PKG_VERSION").into(),
        engine: "transformers".into(),
        engine_version: reported.transformers.clone(),
        torch_version: reported.torch.clone(),
        cuda_version: reported.cuda.clone(),
        lane: format!(
            "transformers {} on {}: the engine's own kernels (attention {}), weights as transformers loads them, reduction in float64 on the device",
            reported.transformers.as_deref().unwrap_or("?"),
            device,
            attention
        ),
        device,
        compute_dtype: reported.dtype.clone().unwrap_or_else(|| "?".into()),
        attention,
        kv_cache_dtype: crate::runner::exchange::RecordedKvCache::of(&reported.models.candidate)
            .ok()
            .and_then(|kv| kv.kv_cache_dtype),
        // Set from the request once the record is checked against it (see `run_transformers`).
        kv_cache: None,
        kv_scales: None,
        // Set per arm from the runner's model record (see `recurrent_state_ran`).
        recurrent_state_dtype: None,
        emulate: None,
        threads: None,
        tf32: reported.tf32,
        tokenizer: Some(tokenizer_record(tokenizer)),
        reference_artifact: None,
        linear_attention,
        reference_linear_attention,
        transformers_runner: Some(reported.clone()),
        llamacpp: None,
    }
}

/// The candidate's linear-attention kernels (the reference's when the candidate has none), and
/// the reference's where they differ.
pub(super) fn linear_attention_of(
    reported: &crate::runner::exchange::RunnerEnvironment,
) -> (
    Option<crate::runner::exchange::LinearAttentionKernels>,
    Option<crate::runner::exchange::LinearAttentionKernels>,
) {
    let Some(la) = &reported.linear_attention else {
        return (None, None);
    };
    match (&la.candidate, &la.reference) {
        (Some(c), Some(r)) if c != r => (Some(c.clone()), Some(r.clone())),
        (Some(c), _) => (Some(c.clone()), None),
        (None, r) => (r.clone(), None),
    }
}

/// The KV-cache part of a transformers runner's model record, typed; a record that holds
/// something else is the runner's error.
pub(super) fn recorded_kv(
    candidate: &Path,
    record: &Value,
) -> Result<crate::runner::exchange::RecordedKvCache> {
    crate::runner::exchange::RecordedKvCache::of(record).map_err(|e| {
        Error::runner(
            candidate,
            format!("the transformers runner's model record does not read: {e}"),
        )
    })
}

/// Each side's KV cache as the transformers runner recorded it against what was asked: a
/// scheme asked for and not applied is the runner's error, naming both.
pub(super) fn kv_cache_ran(
    candidate: &Path,
    sides: &[(
        &str,
        Option<crate::runner::native::kv_cache::KvCacheSetting>,
        &Value,
    )],
) -> Result<()> {
    for &(side, asked, record) in sides {
        let Some(asked) = asked.filter(|s| s.changes_anything()) else {
            continue;
        };
        let recorded = recorded_kv(candidate, record)?;
        let ran = recorded
            .kv_cache_dtype
            .as_deref()
            .unwrap_or("(none recorded)");
        let rotated = recorded.kv_cache_rotation.as_deref() == Some("hadamard");
        let computed = recorded.kv_cache_scales.as_deref() == Some("computed");
        // transformers' QuantizedCache window as [residual length, prefill chunk].
        let residual = (recorded.kv_cache_semantics.as_deref() == Some("quantized_cache_residual"))
            .then(|| {
                let n = |i: usize| {
                    recorded
                        .kv_cache_residual
                        .as_ref()
                        .and_then(|w| w.get(i).copied().flatten())
                };
                (n(0), n(1))
            });
        let asked_residual = asked
            .residual
            .map(|w| (Some(u64::from(w.length)), Some(u64::from(w.chunk))));
        if ran != asked.label()
            || rotated != asked.hadamard
            || computed != asked.computed_scales
            || residual != asked_residual
        {
            let window = match residual {
                Some((length, chunk)) => format!(
                    "+residual{}+chunk{}",
                    length.map_or("?".into(), |n| n.to_string()),
                    chunk.map_or("?".into(), |n| n.to_string())
                ),
                None => String::new(),
            };
            let ran = format!(
                "{ran}{}{}{window}",
                if rotated { "+hadamard" } else { "" },
                if computed { "+computed" } else { "" }
            );
            return Err(Error::runner(
                candidate,
                format!(
                    "the transformers runner ran the {side} with KV cache `{ran}` where `{}` was asked for",
                    asked.name()
                ),
            ));
        }
    }
    Ok(())
}

/// The recurrent-state dtype the transformers runner says the candidate ran with, checked
/// against what was asked: a knob asked for and not applied (a runner program older than the
/// request) is an error, not a silently plain run. `None` for a model without linear-attention
/// layers (the runner counts them), else the dtype the state was stored in.
pub(super) fn recurrent_state_ran(
    candidate: &Path,
    asked: crate::runner::native::StateDtype,
    record: &Value,
) -> Result<Option<String>> {
    let ran = record.get("recurrent_state").and_then(Value::as_str);
    let layers = record
        .get("linear_attention_layers")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if ran != Some(asked.as_str())
        && (ran.is_some() || asked != crate::runner::native::StateDtype::F32)
    {
        return Err(Error::runner(
            candidate,
            format!(
                "the recurrent state was asked for in {asked} but the transformers runner records {}",
                ran.unwrap_or("(none recorded)")
            ),
        ));
    }
    Ok((layers > 0).then(|| asked.as_str().to_owned()))
}

/// The Gated DeltaNet kernel the transformers runner says it held the candidate's layers to,
/// checked against what was asked (`None`: transformers' choice): a kernel asked for and not
/// recorded is an error, not a silently default run.
pub(super) fn gdn_kernel_ran(candidate: &Path, asked: Option<&str>, record: &Value) -> Result<()> {
    let ran = record.get("gdn_kernel").and_then(Value::as_str);
    if ran != asked {
        return Err(Error::runner(
            candidate,
            format!(
                "the Gated DeltaNet kernel {} was asked for but the transformers runner records {}",
                asked.unwrap_or("(transformers' choice)"),
                ran.unwrap_or("(none)")
            ),
        ));
    }
    Ok(())
}
