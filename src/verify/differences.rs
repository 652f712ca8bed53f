//! The differences between the card's lane and protocol and what the rerun did, field by field
//! on the types: each names the card's field path, the card's value and the rerun's, and each
//! makes the card's numbers not comparable with the rerun's.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::disclosure::{self, Engine};
use crate::rerun::document::{Measurement, RunnerKind};
use crate::rerun::options::Resolved;

/// One field where the card and the rerun differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Difference {
    /// The card's field (`fidelity.runtime.compute_dtype`).
    pub field: String,
    /// The card's value, as text.
    pub card: String,
    /// The rerun's value, as text.
    pub rerun: String,
    /// The difference in words (what a claim's reason quotes).
    pub message: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn text(v: &impl Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// A difference worded `{what}: card {c}, rerun {r}`.
fn plain(field: &str, what: &str, card: String, rerun: String) -> Difference {
    worded(field, what, card, rerun, "rerun")
}

/// A difference worded `{what}: card {c}, {side} {r}`.
fn worded(field: &str, what: &str, card: String, rerun: String, side: &str) -> Difference {
    Difference {
        field: format!("fidelity.{field}"),
        message: format!("{what}: card {card}, {side} {rerun}"),
        card,
        rerun,
    }
}

/// What the files measured are, as a rerun records them or its pre-flight finds them before
/// (`None`: not known).
pub struct Identities<'a> {
    pub eval_text_sha256: Option<&'a str>,
    /// How a conversation eval text was rendered (`None`: plain text, or not known).
    pub conversation: Option<&'a crate::conversation::eval::ConversationRecord>,
    /// Whether the eval text was read (so the absence of `conversation` means plain text).
    pub text_known: bool,
    /// The token stream's digest and length.
    pub tokens: Option<(&'a str, usize)>,
    pub candidate_files_sha256: &'a str,
    pub reference_files_sha256: Option<&'a str>,
}

/// Every identity the card pins (the files' root digests, the eval text's digest, the token
/// stream) that the given files contradict. `side` names where the value comes from (`rerun`,
/// `given files`). Revisions are not identities here: publishing a card is a commit that
/// changes the candidate's revision and not its files, and a reference's later commit may hold
/// the same files; the root digests are what bind the numbers to bytes.
pub fn identity_differences(card: &CardLane, id: &Identities, side: &str) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut digest = |field: &str, what: &str, c: Option<&str>, r: Option<&str>| {
        if let (Some(c), Some(r)) = (c, r)
            && c != r
        {
            out.push(worded(field, what, c.to_owned(), r.to_owned(), side));
        }
    };
    if let Some(e) = card.eval {
        digest(
            "eval.text.sha256",
            "eval text sha256",
            e.text.sha256.as_ref().map(|s| s.0.as_str()),
            id.eval_text_sha256,
        );

        if let (Some(t), Some((sha256, count))) = (&e.tokens, id.tokens) {
            digest(
                "eval.tokens.sha256",
                "tokens sha256",
                Some(&t.sha256.0),
                Some(sha256),
            );
            if t.count != count as u64 {
                digest(
                    "eval.tokens.count",
                    "token count",
                    Some(&t.count.to_string()),
                    Some(&count.to_string()),
                );
            }
        }
    }
    digest(
        "candidate.files_sha256",
        "candidate files (root sha256)",
        card.candidate_files_sha256,
        Some(id.candidate_files_sha256),
    );
    digest(
        "reference.files_sha256",
        "reference files (root sha256)",
        card.reference
            .and_then(|r| r.files_sha256.as_ref())
            .map(|s| s.0.as_str()),
        id.reference_files_sha256,
    );
    if let Some(e) = card.eval
        && id.text_known
    {
        out.extend(conversation_differences(e, id.conversation, side));
    }
    out
}

/// A conversation eval text's render, the card's against the rerun's: the kind of text, the
/// template (where from, its digest, its name), the kwargs, the clock and the rendered text's
/// digest, each where the card states it. A template or render that differs makes the tokens
/// other tokens, whatever the file's digest says.
fn conversation_differences(
    e: &disclosure::Eval,
    ran: Option<&crate::conversation::eval::ConversationRecord>,
    side: &str,
) -> Vec<Difference> {
    let card_kind = match (e.text.kind, &e.conversation) {
        (Some(disclosure::EvalTextKind::Conversation), _) | (None, Some(_)) => "conversation",
        _ => "text",
    };
    let ran_kind = if ran.is_some() {
        "conversation"
    } else {
        "text"
    };
    if card_kind != ran_kind {
        return vec![worded(
            "eval.text.kind",
            "eval text kind",
            card_kind.into(),
            ran_kind.into(),
            side,
        )];
    }
    let (Some(c), Some(r)) = (&e.conversation, ran) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut differ = |field: &str, what: &str, card: Option<String>, rerun: String| {
        if let Some(card) = card
            && card != rerun
        {
            out.push(worded(field, what, card, rerun, side));
        }
    };
    differ(
        "eval.conversation.template.from",
        "chat template source",
        Some(c.template.from.as_str().to_owned()),
        r.template.from.as_str().to_owned(),
    );
    differ(
        "eval.conversation.template.sha256",
        "chat template sha256",
        c.template.sha256.as_ref().map(|d| d.0.clone()),
        r.template.sha256.clone(),
    );
    differ(
        "eval.conversation.template.name",
        "chat template name",
        c.template.name.clone(),
        r.template.name.clone().unwrap_or_else(|| "(none)".into()),
    );
    differ(
        "eval.conversation.clock",
        "strftime_now clock",
        c.clock.map(|t| t.to_string()),
        r.clock.to_string(),
    );
    differ(
        "eval.conversation.kwargs",
        "template kwargs",
        c.kwargs.as_ref().map(text),
        text(&r.kwargs),
    );
    differ(
        "eval.conversation.rendered_sha256",
        "rendered text sha256",
        c.rendered_sha256.as_ref().map(|d| d.0.clone()),
        r.rendered_sha256.clone(),
    );
    out
}

/// The card's sections as read, and the rerun's measurement.
pub struct CardLane<'a> {
    pub runtime: Option<&'a disclosure::Runtime>,
    pub eval: Option<&'a disclosure::Eval>,
    pub reference: Option<&'a disclosure::Reference>,
    /// `candidate.files_sha256`, as the card states it.
    pub candidate_files_sha256: Option<&'a str>,
    /// `protocol.turns`, as the card states it.
    pub turns: Option<&'a disclosure::Turns>,
}

/// Every difference between the card's lane and protocol and the rerun's.
pub fn lane_differences(card: &CardLane, m: &Measurement, resolved: &Resolved) -> Vec<Difference> {
    let mut out = Vec::new();
    let env = &m.environment;
    let rerun_engine = match env.runner {
        RunnerKind::Transformers => Engine::Transformers,
        RunnerKind::Native => Engine::Cardproof,
        RunnerKind::Llamacpp => Engine::LlamaCpp,
    };
    if let Some(rt) = card.runtime {
        if rt.engine != rerun_engine {
            out.push(Difference {
                field: "fidelity.runtime.engine".into(),
                card: text(&rt.engine),
                rerun: text(&rerun_engine),
                message: format!(
                    "engine: the card's numbers come from {} {} on {}; the rerun is {} ({})",
                    text(&rt.engine),
                    rt.engine_version,
                    rt.device,
                    if rerun_engine == Engine::Cardproof {
                        "cardproof's native runner"
                    } else {
                        "cardproof's transformers runner"
                    },
                    env.lane,
                ),
            });
        } else if rerun_engine == Engine::LlamaCpp {
            out.extend(llamacpp_differences(rt, m));
        } else if rerun_engine == Engine::Transformers {
            // Same engine: its version, the GPU and every numerics knob must match too.
            let r = &m.fidelity.runtime;
            for (field, what, c, v) in [
                (
                    "runtime.engine_version",
                    "transformers version",
                    &rt.engine_version,
                    &r.engine_version,
                ),
                ("runtime.device", "device", &rt.device, &r.device),
                (
                    "runtime.attention_backend",
                    "attention",
                    &rt.attention_backend,
                    &r.attention_backend,
                ),
                (
                    "runtime.compute_dtype",
                    "compute dtype",
                    &rt.compute_dtype,
                    &r.compute_dtype,
                ),
                (
                    "runtime.kv_cache_dtype",
                    "KV-cache dtype",
                    &rt.kv_cache_dtype,
                    &r.kv_cache_dtype,
                ),
            ] {
                if c != v {
                    out.push(plain(field, what, text(c), text(v)));
                }
            }
            if let Some(d) = state_difference(rt, r.recurrent_state_dtype.as_deref()) {
                out.push(d);
            }
            if let (Some(c), Some(v)) = (rt.device_count, r.device_count)
                && c != v
            {
                out.push(plain(
                    "runtime.device_count",
                    "device count",
                    c.to_string(),
                    v.to_string(),
                ));
            }
            for flag in ["torch", "tf32"] {
                let c = rt.flags.as_ref().and_then(|f| f.get(flag));
                let v = r.flags.as_ref().and_then(|f| f.get(flag));
                if let Some(c) = c
                    && v.is_none_or(|v| text(v) != text(c))
                {
                    out.push(plain(
                        &format!("runtime.flags.{flag}"),
                        flag,
                        text(c),
                        v.map_or("null".into(), text),
                    ));
                }
            }
        } else {
            let kv = env.kv_cache_dtype.clone().unwrap_or_default();
            for (field, what, c, v) in [
                (
                    "runtime.compute_dtype",
                    "compute dtype",
                    &rt.compute_dtype,
                    &env.compute_dtype,
                ),
                (
                    "runtime.kv_cache_dtype",
                    "KV-cache dtype",
                    &rt.kv_cache_dtype,
                    &kv,
                ),
                (
                    "runtime.attention_backend",
                    "attention",
                    &rt.attention_backend,
                    &env.attention,
                ),
            ] {
                if !c.eq_ignore_ascii_case(v) {
                    out.push(plain(field, what, c.clone(), v.clone()));
                }
            }
            if let Some(d) = state_difference(rt, env.recurrent_state_dtype.as_deref()) {
                out.push(d);
            }
        }
        if rt.engine == rerun_engine {
            out.extend(kv_cache_differences(rt, env.kv_cache.as_ref()));
        }
    }
    out.extend(identity_differences(
        card,
        &Identities {
            eval_text_sha256: Some(&m.eval.text_sha256),
            conversation: m.eval.conversation.as_ref(),
            text_known: m.eval.text_path.is_some(),
            tokens: Some((&m.eval.tokens_sha256, m.eval.token_count)),
            candidate_files_sha256: &m.candidate.manifest_sha256,
            reference_files_sha256: Some(&m.reference.manifest_sha256),
        },
        "rerun",
    ));
    out.extend(turn_differences(card.turns, m.turns.as_ref()));
    if let Some(a) = &resolved.aggregation {
        out.push(Difference {
            field: "fidelity.protocol.aggregation.statistic".into(),
            card: a.clone(),
            rerun: "mean_over_positions".into(),
            message: format!("aggregation: card {a}, the rerun computes mean_over_positions"),
        });
    }
    out
}

/// The card's `protocol.turns` against the turns the rerun generated: the rerun follows the
/// card's selection, decoding and `max_new_tokens`, and finds its stop tokens in the chat
/// template, so these differ only when the card's are not what its template says.
fn turn_differences(
    card: Option<&disclosure::Turns>,
    ran: Option<&crate::rerun::turns::TurnsRecord>,
) -> Vec<Difference> {
    let (Some(card), Some(ran)) = (card, ran) else {
        return Vec::new();
    };
    let ids = |v: &[u32]| {
        let shown: Vec<String> = v.iter().map(u32::to_string).collect();
        format!("[{}]", shown.join(", "))
    };
    let mut out = Vec::new();
    if card.stop_token_ids != ran.stop_ids {
        out.push(plain(
            "protocol.turns.stop_token_ids",
            "stop tokens",
            ids(&card.stop_token_ids),
            ids(&ran.stop_ids),
        ));
    }
    if card.max_new_tokens != ran.protocol.max_new_tokens as u64 {
        out.push(plain(
            "protocol.turns.max_new_tokens",
            "max_new_tokens",
            card.max_new_tokens.to_string(),
            ran.protocol.max_new_tokens.to_string(),
        ));
    }
    if card.select != ran.protocol.turns {
        out.push(plain(
            "protocol.turns.select",
            "turns",
            text(&card.select),
            text(&ran.protocol.turns),
        ));
    }
    out
}

/// The card's structured KV-cache entry against how the rerun's cache ran: granularity, scale
/// source, rotation and semantics, each a field the card states (the schemes themselves are
/// `kv_cache_dtype`'s comparison). A rerun without a rounded cache ran the model dtype.
fn kv_cache_differences(
    rt: &disclosure::Runtime,
    ran: Option<&crate::disclosure::kv_cache::KvCache>,
) -> Vec<Difference> {
    use crate::disclosure::kv_cache::{KvCache, KvRotation};
    use crate::runner::native::kv_cache::KvCacheSetting;
    let Some(card) = &rt.kv_cache else {
        // A card without the entry states no rotation; a rotated rerun is not what it says.
        return match ran.and_then(|r| r.rotation) {
            Some(rotation @ KvRotation::Hadamard) => vec![plain(
                "runtime.kv_cache.rotation",
                "KV-cache rotation",
                "(not stated)".into(),
                rotation.to_string(),
            )],
            _ => Vec::new(),
        };
    };
    let unrounded = KvCache::as_run(KvCacheSetting::plain(), false);
    card.differences(ran.unwrap_or(&unrounded))
        .into_iter()
        .filter(|(field, _, _)| !matches!(*field, "k" | "v"))
        .map(|(field, c, r)| {
            plain(
                &format!("runtime.kv_cache.{field}"),
                &format!("KV-cache {}", field.replace('_', " ")),
                c,
                r,
            )
        })
        .collect()
}

/// The recurrent-state dtype of the card's runtime against the rerun's, by canonical name (`f32`
/// = `float32` = `torch.float32`). Either side absent is the engine's default, fp32 (cardproof's
/// native runner and transformers both keep the state in fp32); a card value that names no dtype
/// never matches.
fn state_difference(rt: &disclosure::Runtime, rerun: Option<&str>) -> Option<Difference> {
    use crate::runner::native::StateDtype;
    let card = rt.recurrent_state_dtype.as_deref().unwrap_or("f32");
    let rerun = rerun.unwrap_or("f32");
    let same = matches!(
        (StateDtype::from_name(card), StateDtype::from_name(rerun)),
        (Some(a), Some(b)) if a == b
    );
    (!same).then(|| {
        plain(
            "runtime.recurrent_state_dtype",
            "recurrent-state dtype",
            card.to_owned(),
            rerun.to_owned(),
        )
    })
}

/// A card measured in llama.cpp against a llama.cpp rerun: the build, the backend (and the GPU
/// where one ran), the attention and KV-cache settings as llama.cpp resolved them, and each
/// numerics flag the card states. Threads are recorded, not compared (ggml splits rows, not
/// sums, across threads); a flag the card does not state is llama.cpp's default on both sides.
fn llamacpp_differences(rt: &disclosure::Runtime, m: &Measurement) -> Vec<Difference> {
    let mut out = Vec::new();
    let r = &m.fidelity.runtime;
    if normalized_build(&rt.engine_version) != normalized_build(&r.engine_version) {
        out.push(plain(
            "runtime.engine_version",
            "llama.cpp build",
            rt.engine_version.clone(),
            r.engine_version.clone(),
        ));
    }
    for (field, what, c, v) in [
        (
            "runtime.attention_backend",
            "attention",
            &rt.attention_backend,
            &r.attention_backend,
        ),
        (
            "runtime.kv_cache_dtype",
            "KV-cache dtype",
            &rt.kv_cache_dtype,
            &r.kv_cache_dtype,
        ),
    ] {
        if !c.eq_ignore_ascii_case(v) {
            out.push(plain(field, what, c.clone(), v.clone()));
        }
    }
    let empty = std::collections::BTreeMap::new();
    let card_flags = rt.flags.as_ref().unwrap_or(&empty);
    let rerun_flags = r.flags.as_ref().unwrap_or(&empty);
    out.extend(device_and_environment(
        (&rt.device, card_flags),
        (&r.device, rerun_flags),
    ));
    for flag in [
        "backend",
        "flash_attn",
        "cache_type_k",
        "cache_type_v",
        "attn_rotation",
        "n_batch",
        "n_ubatch",
        "n_gpu_layers",
        "ppl_stride",
    ] {
        if let Some(c) = card_flags.get(flag) {
            let v = rerun_flags.get(flag);
            if v.is_none_or(|v| text(v) != text(c)) {
                out.push(plain(
                    &format!("runtime.flags.{flag}"),
                    &format!("llama.cpp {flag}"),
                    text(c),
                    v.map_or("(not set)".into(), text),
                ));
            }
        }
    }
    out
}

type Flags = std::collections::BTreeMap<String, disclosure::FlagValue>;

/// What runs llama.cpp's kernels besides its flags: the device, on every backend (a GPU's, and
/// on the CPU the instruction sets a native build compiles for: AVX2, AVX-512, AMX; the example
/// card's numbers differ by ~0.1% between an AMD EPYC and an Intel Xeon), and the settings its
/// processes read from the environment (`env.LLAMA_ARG_*` flags), on either side.
fn device_and_environment(card: (&str, &Flags), rerun: (&str, &Flags)) -> Vec<Difference> {
    let mut out = Vec::new();
    if card.0 != rerun.0 {
        out.push(plain(
            "runtime.device",
            "device",
            card.0.to_owned(),
            rerun.0.to_owned(),
        ));
    }
    let keys: std::collections::BTreeSet<&String> = card
        .1
        .keys()
        .chain(rerun.1.keys())
        .filter(|k| k.starts_with("env."))
        .collect();
    for key in keys {
        let (c, v) = (card.1.get(key), rerun.1.get(key));
        if c.map(text) != v.map(text) {
            out.push(plain(
                &format!("runtime.flags.{key}"),
                &format!("llama.cpp setting from the environment {}", &key[4..]),
                c.map_or("(not set)".into(), text),
                v.map_or("(not set)".into(), text),
            ));
        }
    }
    out
}

/// A llama.cpp version as its parts: `b6590 (abcdef12)`, `6590 (abcdef12)` and
/// `version: 6590 (abcdef12)` are one build.
fn normalized_build(v: &str) -> String {
    v.trim()
        .trim_start_matches("version:")
        .trim()
        .trim_start_matches('b')
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (#41): the llama.cpp lane's CPU device was not compared (a card measured on an
    /// AMD EPYC was "not reproduced" on an Intel Xeon, whose native build runs other kernels),
    /// and settings inherited from the environment were not recorded at all.
    #[test]
    fn the_device_and_inherited_llamacpp_settings_are_part_of_the_lane() {
        let none = Flags::new();
        let repack = Flags::from([(
            "env.LLAMA_ARG_REPACK".to_owned(),
            disclosure::FlagValue::Text("0".into()),
        )]);
        assert!(
            device_and_environment(("cpu: AMD EPYC", &none), ("cpu: AMD EPYC", &none)).is_empty()
        );
        let d = device_and_environment(("cpu: AMD EPYC", &none), ("cpu: Intel(R) Xeon(R)", &none));
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].message,
            "device: card cpu: AMD EPYC, rerun cpu: Intel(R) Xeon(R)"
        );
        let d = device_and_environment(("cpu: AMD EPYC", &none), ("cpu: AMD EPYC", &repack));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].field, "fidelity.runtime.flags.env.LLAMA_ARG_REPACK");
        assert!(
            d[0].message.contains("card (not set), rerun 0"),
            "{}",
            d[0].message
        );
        assert!(device_and_environment(("cpu", &repack), ("cpu", &repack)).is_empty());
    }
}
