//! A [`Measurement`] from its typed parts: the scoring, the two identities and the environment,
//! with the ready `fidelity:` block serialized from the disclosure's own types.

use std::path::Path;

use serde_json::Value;

use super::document::{
    DraftCandidate, DraftReference, Environment, FidelityDraft, Measurement, ModelRecord, Padding,
    RunnerKind,
};
use super::options::{MeasureOptions, disclosed_protocol};
use super::score::Scoring;
use crate::disclosure::precision::{round_claim, round_sig};
use crate::disclosure::{
    self, CheckpointFormat, Engine, FlagValue, ResultClaim, Sha256, WeightDtype,
};

/// Metrics a card's `results` carry by default.
pub const CLAIMED: &[&str] = &[
    "kld_mean",
    "kld_p99",
    "kld_reverse_mean",
    "top1_agreement",
    "ppl_ratio",
];

/// The measurement document of a scoring.
pub fn measurement(
    scoring: &Scoring,
    o: &MeasureOptions,
    reference: ModelRecord,
    candidate: ModelRecord,
    environment: Environment,
) -> Measurement {
    let fidelity = fidelity_draft(scoring, o, &reference, &candidate, &environment);
    Measurement {
        schema_version: crate::schema::SchemaVersion,
        run_id: None,
        protocol_sha256: scoring.protocol.sha256(),
        protocol: scoring.protocol.clone(),
        reference,
        candidate,
        eval: scoring.eval.clone(),
        environment,
        runs: scoring.runs.iter().map(|r| r.record()).collect(),
        definitions: match crate::kld::definitions() {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        },
        fidelity,
        turns: None,
    }
}

/// A ready `fidelity:` block for the card. The repositories and revisions are not known to a
/// local measurement; `cardproof card` (or the Hub pins) add them.
fn fidelity_draft(
    m: &Scoring,
    o: &MeasureOptions,
    reference: &ModelRecord,
    candidate: &ModelRecord,
    environment: &Environment,
) -> FidelityDraft {
    let mut results = Vec::new();
    for run in &m.runs {
        for name in CLAIMED {
            let Some(value) = run.summary.metrics.get(*name) else {
                continue;
            };
            let uncertainty = run
                .summary
                .uncertainty
                .get(*name)
                .filter(|u| u.ci95.iter().all(|v| v.is_finite()))
                .map(|u| round_sig((u.ci95[1] - u.ci95[0]) / 2.0, 2));
            results.push(ResultClaim {
                metric: (*name).to_owned(),
                value: round_claim(name, *value),
                uncertainty,
                level: None,
                context_length: Some(run.context_length as u64),
                n_positions: Some(run.n_positions as u64),
                n_nonfinite: (run.n_nonfinite > 0).then_some(run.n_nonfinite as u64),
                n_turns: None,
            });
        }
    }
    // A run against a stored reference may not know the eval text's name or bytes: the draft
    // says what it does know (the artifact the tokens came from) and leaves out what it does not,
    // rather than writing an empty value a card would then carry.
    let text_name = m
        .eval
        .text_path
        .as_deref()
        .and_then(|p| Path::new(p).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .or_else(|| {
            let a = environment.reference_artifact.as_ref()?;
            let name = Path::new(&a.path)
                .file_name()?
                .to_string_lossy()
                .into_owned();
            Some(if a.kind == "llamacpp_base" {
                format!("the token stream of llama.cpp base file {name}")
            } else {
                format!("the eval text of reference artifact {name}")
            })
        })
        .unwrap_or_else(|| "the measured token stream".into());
    let digest = |d: &str| (!d.is_empty()).then(|| Sha256(d.to_owned()));
    FidelityDraft {
        schema: disclosure::SCHEMA_ID.into(),
        reference: DraftReference {
            repo: None,
            revision: None,
            format: if reference.format == "gguf" {
                CheckpointFormat::Gguf
            } else {
                CheckpointFormat::Safetensors
            },
            dtype: match reference.stored_dtype.as_str() {
                "bf16" => WeightDtype::Bf16,
                "f16" => WeightDtype::F16,
                "f32" => WeightDtype::F32,
                _ => WeightDtype::Other,
            },
            files_sha256: digest(&reference.manifest_sha256),
        },
        candidate: DraftCandidate {
            repo: None,
            revision: None,
            files_sha256: Sha256(candidate.manifest_sha256.clone()),
            file: single_file_name(&candidate.path),
        },
        runtime: runtime(environment),
        eval: disclosure::Eval {
            text: disclosure::EvalText {
                source: text_name,
                kind: m
                    .eval
                    .conversation
                    .as_ref()
                    .map(|_| disclosure::EvalTextKind::Conversation),
                sha256: digest(&m.eval.text_sha256),
                revision: None,
                split: None,
            },
            tokenizer: None,
            tokens: Some(disclosure::Tokens {
                count: m.eval.token_count as u64,
                sha256: Sha256(m.eval.tokens_sha256.clone()),
            }),
            bos: o.bos,
            chat_template: m.eval.conversation.as_ref().map(|_| true),
            conversation: m
                .eval
                .conversation
                .as_ref()
                .map(|c| disclosure::EvalConversation {
                    template: disclosure::ChatTemplateSource {
                        from: c.template.from,
                        // Its file's name, as the text's: where the card sits, the file sits beside it.
                        path: Path::new(&c.template.path)
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned()),
                        name: c.template.name.clone(),
                        sha256: Some(Sha256(c.template.sha256.clone())),
                    },
                    kwargs: Some(c.kwargs.clone()),
                    clock: Some(c.clock),
                    rendered_sha256: Some(Sha256(c.rendered_sha256.clone())),
                    renderer: Some(c.renderer.clone()),
                }),
        },
        protocol: disclosed_protocol(o, m.protocol.padding == Padding::Included),
        results,
    }
}

/// The card's `runtime` item from a measurement's environment record.
pub fn runtime(environment: &Environment) -> disclosure::Runtime {
    let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
    if let (RunnerKind::Llamacpp, Some(l)) = (environment.runner, &environment.llamacpp) {
        return disclosure::Runtime {
            engine: Engine::LlamaCpp,
            engine_version: text(&environment.engine_version),
            attention_backend: environment.attention.clone(),
            kv_cache_dtype: text(&environment.kv_cache_dtype),
            kv_cache: environment.kv_cache.clone(),
            recurrent_state_dtype: None,
            compute_dtype: environment.compute_dtype.clone(),
            device: environment.device.clone(),
            device_count: Some(1),
            flags: Some(llamacpp_flags(l)),
        };
    }
    if environment.runner != RunnerKind::Transformers {
        return disclosure::Runtime {
            engine: Engine::Cardproof,
            engine_version: env!("CARGO_PKG_VERSION").into(),
            attention_backend: environment.attention.clone(),
            kv_cache_dtype: text(&environment.kv_cache_dtype),
            kv_cache: environment.kv_cache.clone(),
            recurrent_state_dtype: environment.recurrent_state_dtype.clone(),
            compute_dtype: environment.compute_dtype.clone(),
            device: environment.device.clone(),
            device_count: Some(1),
            flags: None,
        };
    }
    let short = |v: &str| match v {
        "bfloat16" => "bf16".to_owned(),
        "float16" => "f16".to_owned(),
        "float32" => "f32".to_owned(),
        other => other.to_owned(),
    };
    let reported = environment.transformers_runner.clone().unwrap_or_default();
    let mut flags = std::collections::BTreeMap::new();
    if let Some(torch) = &reported.torch {
        flags.insert("torch".into(), FlagValue::Text(torch.clone()));
    }
    flags.insert(
        "cuda".into(),
        FlagValue::Text(reported.cuda.clone().unwrap_or_else(|| "none".into())),
    );
    if let Some(tf32) = reported.tf32 {
        flags.insert("tf32".into(), FlagValue::Bool(tf32));
    }
    if let Some(chunk) = reported.chunk_size {
        flags.insert("prefill_chunk".into(), FlagValue::Integer(chunk));
    }
    flags.insert(
        "reduction".into(),
        FlagValue::Text("cardproof transformers runner (float64)".into()),
    );
    let gpus = reported.gpus.len();
    disclosure::Runtime {
        engine: Engine::Transformers,
        engine_version: text(&environment.engine_version),
        attention_backend: environment.attention.clone(),
        kv_cache_dtype: short(&text(&environment.kv_cache_dtype)),
        kv_cache: environment.kv_cache.clone(),
        recurrent_state_dtype: environment.recurrent_state_dtype.as_deref().map(short),
        compute_dtype: short(&environment.compute_dtype),
        device: environment.device.clone(),
        device_count: Some(gpus.max(1) as u64),
        flags: Some(flags),
    }
}

/// The flags of a llama.cpp run as a card's `runtime.flags` carries them: each setting that
/// changes a number, as asked and as llama.cpp resolved it, under llama.cpp's own names.
pub fn llamacpp_flags(
    l: &crate::runner::llamacpp::LlamacppRecord,
) -> std::collections::BTreeMap<String, FlagValue> {
    let mut flags = std::collections::BTreeMap::new();
    let c = &l.candidate;
    let s = &l.candidate_settings;
    let mut text = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            flags.insert(k.to_owned(), FlagValue::Text(v));
        }
    };
    text("backend", Some(c.backend.clone()));
    text("build", l.build.build.clone());
    text("commit", l.build.commit.clone());
    text("n_gpu_layers", s.gpu_layers.clone());
    text("flash_attn", c.flash_attn.clone().or(s.flash_attn.clone()));
    text(
        "cache_type_k",
        c.cache_type_k.clone().or(s.cache_type_k.clone()),
    );
    text(
        "cache_type_v",
        c.cache_type_v.clone().or(s.cache_type_v.clone()),
    );
    let mut int = |k: &str, v: Option<u32>| {
        if let Some(v) = v {
            flags.insert(k.to_owned(), FlagValue::Integer(i64::from(v)));
        }
    };
    int("n_batch", c.n_batch.or(s.batch));
    int("n_ubatch", c.n_ubatch.or(s.ubatch));
    int("threads", s.threads);
    int("ppl_stride", Some(l.ppl_stride));
    int("chunks", Some(l.chunks));
    if c.rotation_k.is_some() || c.rotation_v.is_some() {
        flags.insert(
            "attn_rotation".into(),
            FlagValue::Bool(c.rotation_k == Some(true) || c.rotation_v == Some(true)),
        );
    }
    for (k, v) in &l.inherited_environment {
        flags.insert(format!("env.{k}"), FlagValue::Text(v.clone()));
    }
    flags.insert(
        "reduction".into(),
        FlagValue::Text(if l.imported_from.is_some() {
            "llama.cpp's own --kl-divergence printout (imported from its log)".into()
        } else {
            "cardproof's llama.cpp-compatible reader of llama-perplexity's base streams".into()
        }),
    );
    flags
}

/// The candidate's file name when it was measured as one file (a GGUF), not a directory: the
/// card written beside it names the file it describes.
fn single_file_name(path: &str) -> Option<String> {
    let p = Path::new(path);
    if !p.is_file() {
        return None;
    }
    p.file_name()?.to_str().map(str::to_owned)
}

/// The draft's turn claims and their `protocol.turns`, once a measurement's turns are recorded:
/// every turn metric that is defined on these turns, with its interval's half-width and the
/// number of turns behind it.
pub fn add_turn_claims(draft: &mut FidelityDraft, turns: &super::turns::TurnsRecord) {
    let s = &turns.summary;
    draft.protocol.turns = Some(disclosure::Turns {
        select: turns.protocol.turns,
        decoding: turns.protocol.decoding,
        max_new_tokens: turns.protocol.max_new_tokens as u64,
        stop_token_ids: turns.stop_ids.clone(),
    });
    let shares = [
        (
            "tool_call_f1",
            Some(s.tool_call_f1.value),
            &s.tool_call_f1.uncertainty,
        ),
        (
            "tool_call_valid",
            s.tool_call_valid.value,
            &s.tool_call_valid.uncertainty,
        ),
        (
            "tool_call_match",
            s.tool_call_match.value,
            &s.tool_call_match.uncertainty,
        ),
        ("turn_match", s.turn_match.value, &s.turn_match.uncertainty),
    ];
    for (metric, value, u) in shares {
        let Some(value) = value.filter(|v| v.is_finite()) else {
            continue;
        };
        draft.results.push(ResultClaim {
            metric: metric.to_owned(),
            value: round_claim(metric, value),
            uncertainty: u
                .ci95
                .iter()
                .all(|v| v.is_finite())
                .then(|| round_sig((u.ci95[1] - u.ci95[0]) / 2.0, 2)),
            level: None,
            context_length: None,
            n_positions: None,
            n_nonfinite: None,
            n_turns: Some(s.turns),
        });
    }
}
