//! The nine disclosure items beyond what the schema can say: values present but too vague to
//! interpret a KLD number, and claims that contradict the protocol they sit under.
//!
//! Missing items are found by the schema (`required`) and reported in `schema.rs`; these checks
//! read the same JSON and only look at values of the right type (wrong types are already schema
//! violations).

use serde_json::Value;

use super::Locator;
use crate::disclosure::kv_cache::KvCache;
use crate::disclosure::vocabulary;
use crate::findings::{Code, Finding, Item};
use crate::runner::native::kv_cache::KvCacheSetting;

/// Words that name no particular version, kernel or device.
const PLACEHOLDERS: &[&str] = &[
    "", "auto", "default", "unknown", "latest", "n/a", "na", "none", "tbd", "todo", "?", "-",
    "various", "any", "main", "master", "nightly", "head",
];

pub(super) fn check(fidelity: &Value, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    let mut push = |item: Item, pointer: &str, message: String| {
        let finding = Finding::new(
            Code::VagueDisclosure,
            format!(
                "disclosure item `{item}` is too vague: {message}; {}",
                item.why()
            ),
        )
        .item(Some(item));
        out.push(locator.at_value(finding, pointer));
    };

    reference(fidelity, &mut push);
    runtime(fidelity, &mut push);
    kv_cache(fidelity, &mut push);
    eval_text(fidelity, &mut push);
    calibration(fidelity, &mut push);
    positions(fidelity, &mut push);
    conversation_positions(fidelity, locator, out);
    claims(fidelity, locator, out);
    kv_cache_coherent(fidelity, locator, out);
    candidate(fidelity, locator, out);
    calibration_overlap(fidelity, locator, out);
}

/// Without a revision or a files digest, the numbers are not bound to any bytes: the repository
/// can change after the measurement.
fn candidate(f: &Value, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    let Some(candidate) = f.get("candidate").filter(|c| c.is_object()) else {
        return;
    };
    if candidate.get("revision").is_none() && candidate.get("files_sha256").is_none() {
        out.push(locator.at_key(
            Finding::new(
                Code::CandidateUnpinned,
                "`fidelity.candidate` gives neither `revision` nor `files_sha256`, so the numbers are not bound to the files: the repository can change after the measurement",
            ),
            "/fidelity/candidate",
        ));
    }
}

/// The distinctive names in a dataset id or path: the first word of each `/` segment
/// (`Salesforce/wikitext` and `wikitext-2-raw-v1/test` share `wikitext`).
fn dataset_names(id: &str) -> Vec<String> {
    const GENERIC: &[&str] = &[
        "test",
        "train",
        "validation",
        "data",
        "dataset",
        "datasets",
        "text",
    ];
    id.to_ascii_lowercase()
        .split('/')
        .filter_map(|segment| segment.split(['-', '_', ':', '.']).next())
        .filter(|word| word.len() >= 4 && !GENERIC.contains(word))
        .map(str::to_owned)
        .collect()
}

/// Calibrating on the text that is then scored understates KLD.
fn calibration_overlap(f: &Value, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    let (Some(dataset), Some(source)) = (
        str_at(f, "/calibration/dataset"),
        str_at(f, "/eval/text/source"),
    ) else {
        return;
    };
    let overlap = str_at(f, "/calibration/eval_overlap");
    let same_family = !dataset.trim().eq_ignore_ascii_case("none")
        && dataset_names(dataset)
            .iter()
            .any(|n| dataset_names(source).contains(n));
    if overlap == Some("checked_overlap") || (same_family && overlap != Some("checked_none")) {
        let why = if overlap == Some("checked_overlap") {
            "the card says the calibration data overlaps the evaluation text".to_owned()
        } else {
            format!(
                "calibration data `{dataset}` and evaluation text `{source}` look like the same dataset"
            )
        };
        out.push(locator.at_value(
            Finding::new(
                Code::CalibrationOverlapsEval,
                format!(
                    "{why}: a quantizer calibrated on the scored text understates KLD; score other text, or check and set `calibration.eval_overlap: checked_none`"
                ),
            )
            .item(Some(Item::Calibration)),
            "/fidelity/calibration/dataset",
        ));
    }
}

type Push<'a> = dyn FnMut(Item, &str, String) + 'a;

fn str_at<'v>(v: &'v Value, pointer: &str) -> Option<&'v str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn is_placeholder(s: &str) -> bool {
    PLACEHOLDERS.contains(&s.trim().to_ascii_lowercase().as_str())
}

fn reference(f: &Value, push: &mut Push<'_>) {
    if let Some(repo) = str_at(f, "/reference/repo") {
        let hub_id = repo.split('/').count() == 2 && repo.split('/').all(|p| !p.is_empty());
        if !hub_id && f.pointer("/reference/files_sha256").is_none() {
            push(
                Item::Reference,
                "/fidelity/reference/repo",
                format!(
                    "`{repo}` is not a Hub repository id (`org/name`) and no \
                     `reference.files_sha256` pins the files"
                ),
            );
        }
    }
}

fn runtime(f: &Value, push: &mut Push<'_>) {
    let fields = [
        (
            "engine_version",
            "name the exact version (and commit for a source build)",
        ),
        (
            "attention_backend",
            "name the kernel actually used; `auto` resolves differently per machine",
        ),
        (
            "kv_cache_dtype",
            "name the dtype actually stored; `auto` follows the model dtype",
        ),
        ("compute_dtype", "name the dtype actually used"),
        ("device", "name the device model (e.g. `NVIDIA H200`)"),
    ];
    for (field, advice) in fields {
        let pointer = format!("/runtime/{field}");
        if let Some(value) = str_at(f, &pointer) {
            let generic_device = field == "device"
                && matches!(
                    value.trim().to_ascii_lowercase().as_str(),
                    "gpu" | "cuda" | "nvidia"
                );
            if is_placeholder(value) || generic_device {
                push(
                    Item::Runtime,
                    &format!("/fidelity{pointer}"),
                    format!("`runtime.{field}` is `{value}`: {advice}"),
                );
            }
        }
    }
}

/// The card's structured KV-cache entry, when it has one that parses (a malformed one is a
/// schema violation already).
fn kv_cache_entry(f: &Value) -> Option<KvCache> {
    serde_json::from_value(f.pointer("/runtime/kv_cache")?.clone()).ok()
}

/// A KV-cache name that leaves out what moves the number: per-tensor fp8 without where its
/// scale came from (1.0, the checkpoint's, computed), llama.cpp's quantized types without
/// whether the Hadamard rotation was on (default since April 2026, per build).
fn kv_cache(f: &Value, push: &mut Push<'_>) {
    let Some(dtype) = str_at(f, "/runtime/kv_cache_dtype") else {
        return;
    };
    let entry = kv_cache_entry(f);
    let Some(setting) = entry
        .as_ref()
        .and_then(|e| e.setting().ok())
        .or_else(|| KvCacheSetting::from_label(dtype))
    else {
        return;
    };
    let schemes = [setting.k, setting.v];
    let pointer = if f.pointer("/runtime/kv_cache").is_some() {
        "/fidelity/runtime/kv_cache"
    } else {
        "/fidelity/runtime/kv_cache_dtype"
    };
    let scale_source = entry.as_ref().and_then(|e| e.scale_source);
    if schemes.iter().any(|s| s.takes_tensor_scale()) && scale_source.is_none() {
        push(
            Item::Runtime,
            pointer,
            format!(
                "the KV cache is `{dtype}` (one scale per tensor) without `runtime.kv_cache.scale_source`: a scale of 1.0, the checkpoint's `k_scale`/`v_scale` and scales computed from the first window give different numbers"
            ),
        );
    }
    let llama_cpp = matches!(
        str_at(f, "/runtime/engine"),
        Some("llama_cpp" | "ik_llama_cpp")
    );
    let rotation = entry.as_ref().and_then(|e| e.rotation);
    if llama_cpp && schemes.iter().any(|s| s.is_blocked()) && rotation.is_none() {
        push(
            Item::Runtime,
            pointer,
            format!(
                "the KV cache is `{dtype}` on llama.cpp without `runtime.kv_cache.rotation`: builds since April 2026 rotate Q/K/V by a Hadamard matrix before a quantized store unless `LLAMA_ATTN_ROT_DISABLE=1`, and the two give different numbers"
            ),
        );
    }
}

/// The structured KV-cache entry must name real schemes, agree with `kv_cache_dtype` and with
/// itself (a granularity or scale source its schemes do not have).
fn kv_cache_coherent(f: &Value, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    let (Some(entry), Some(dtype)) = (kv_cache_entry(f), str_at(f, "/runtime/kv_cache_dtype"))
    else {
        return;
    };
    for (field, message) in entry.contradictions(dtype) {
        out.push(locator.at_value(
            Finding::new(Code::KvCacheMismatch, message).item(Some(Item::Runtime)),
            &format!("/fidelity/runtime/kv_cache/{field}"),
        ));
    }
}

fn eval_text(f: &Value, push: &mut Push<'_>) {
    let Some(source) = str_at(f, "/eval/text/source") else {
        return;
    };
    let text_digest = f.pointer("/eval/text/sha256").is_some();
    let token_digest = f.pointer("/eval/tokens/sha256").is_some();
    if is_placeholder(source) {
        push(
            Item::EvalText,
            "/fidelity/eval/text/source",
            format!("`eval.text.source` is `{source}`"),
        );
    } else if !text_digest && !token_digest {
        push(
            Item::EvalText,
            "/fidelity/eval/text",
            format!(
                "`{source}` is named but neither `eval.text.sha256` nor `eval.tokens.sha256` pins \
                 the exact bytes or tokens (a dataset name has variants: raw or tokenized, \
                 trailing newlines, revisions)"
            ),
        );
    }
    if is_conversation(f) && f.pointer("/eval/conversation/template/sha256").is_none() {
        let at = if f.pointer("/eval/conversation/template").is_some() {
            "/fidelity/eval/conversation/template"
        } else {
            "/fidelity/eval/text"
        };
        push(
            Item::EvalText,
            at,
            "the text is conversations, but no `eval.conversation.template.sha256` says which \
             chat template rendered them: templates differ between the reference's repository, \
             a quant repository's patched copy and an engine's built-in one, and each renders \
             other tokens"
                .into(),
        );
    }
}

/// Whether the card says its eval text is conversations.
fn is_conversation(f: &Value) -> bool {
    str_at(f, "/eval/text/kind") == Some("conversation")
        || f.pointer("/eval/conversation").is_some()
}

/// A conversation scored at every position mixes what the model generates with what it reads
/// (system prompt, tool declarations, tool results, template markup); said, not refused.
fn conversation_positions(f: &Value, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    let policy = str_at(f, "/protocol/positions/policy");
    if !is_conversation(f) || matches!(policy, None | Some("role" | "span")) {
        return;
    }
    out.push(locator.at_value(
        Finding::new(
            Code::ConversationAllPositions,
            format!(
                "the eval text is conversations but positions policy `{}` scores every kind of token alike: the number mixes what the model generates (the assistant's text and tool calls) with what it only reads (system prompt, tool declarations, tool results, template markup); measure `role: assistant` or `span: tool_call` too, as separate results",
                policy.unwrap_or_default()
            ),
        )
        .item(Some(Item::Positions)),
        "/fidelity/protocol/positions/policy",
    ));
}

fn calibration(f: &Value, push: &mut Push<'_>) {
    let Some(dataset) = str_at(f, "/calibration/dataset") else {
        return;
    };
    if dataset.trim().eq_ignore_ascii_case("none") {
        return;
    }
    if is_placeholder(dataset) {
        push(
            Item::Calibration,
            "/fidelity/calibration/dataset",
            format!("`calibration.dataset` is `{dataset}`; write `none` if no data was used"),
        );
        return;
    }
    if f.pointer("/calibration/sha256").is_some() {
        return;
    }
    let missing: Vec<&str> = ["revision", "samples"]
        .into_iter()
        .filter(|k| f.pointer(&format!("/calibration/{k}")).is_none())
        .collect();
    if !missing.is_empty() {
        push(
            Item::Calibration,
            "/fidelity/calibration",
            format!(
                "`{dataset}` is named without `calibration.sha256` or `{}`, so which data (and how \
                 much of it) is unknown",
                missing
                    .iter()
                    .map(|k| format!("calibration.{k}"))
                    .collect::<Vec<_>>()
                    .join("` and `")
            ),
        );
    }
}

fn positions(f: &Value, push: &mut Push<'_>) {
    let policy = str_at(f, "/protocol/positions/policy");
    let stride = f
        .pointer("/protocol/positions/stride")
        .and_then(Value::as_u64);
    let offset = f
        .pointer("/protocol/positions/offset")
        .and_then(Value::as_u64);
    if let (Some("stride"), Some(stride), Some(offset)) = (policy, stride, offset)
        && offset >= stride
    {
        push(
            Item::Positions,
            "/fidelity/protocol/positions/offset",
            format!(
                "offset {offset} is not below stride {stride}, so no row has j mod {stride} = {offset}"
            ),
        );
    }
    for (name, field) in [("role", "role"), ("span", "span")] {
        if policy != Some(name) {
            continue;
        }
        if f.pointer(&format!("/protocol/positions/{field}")).is_none() {
            push(
                Item::Positions,
                "/fidelity/protocol/positions/policy",
                format!("policy `{name}` does not say which {field} it scores (`{field}:`)"),
            );
        } else if !is_conversation(f) {
            push(
                Item::Positions,
                "/fidelity/protocol/positions/policy",
                format!(
                    "policy `{name}` selects tokens of a conversation's messages, but the eval text is not said to be conversations (`eval.text.kind: conversation` and `eval.conversation`)"
                ),
            );
        }
        if stride.is_some() != offset.is_some() {
            push(
                Item::Positions,
                "/fidelity/protocol/positions",
                "a stride needs its offset, and an offset its stride".into(),
            );
        }
    }
    let from = f
        .pointer("/protocol/positions/from")
        .and_then(Value::as_u64);
    let shortest = f
        .pointer("/protocol/context_lengths")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().filter_map(Value::as_u64).min());
    if let (Some("from"), Some(from), Some(shortest)) = (policy, from, shortest)
        && from + 2 > shortest
    {
        push(
            Item::Positions,
            "/fidelity/protocol/positions/from",
            format!(
                "`from: {from}` scores no row of a {shortest}-token window (rows are 0..={})",
                shortest - 2
            ),
        );
    }
}

/// Claims that contradict the protocol: a context length not measured, a direction not used, an
/// uncertainty without a method.
fn claims(f: &Value, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    let Some(results) = f.pointer("/results").and_then(Value::as_array) else {
        return;
    };
    let lengths: Vec<u64> = f
        .pointer("/protocol/context_lengths")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let direction = str_at(f, "/protocol/kl/direction");
    let method = str_at(f, "/protocol/aggregation/uncertainty/method");
    let mut turn_findings = Vec::new();
    let mut inconsistent = |pointer: String, message: String| {
        out.push(locator.at_value(Finding::new(Code::InconsistentClaim, message), &pointer));
    };
    for (i, claim) in results.iter().enumerate() {
        let base = format!("/fidelity/results/{i}");
        let metric = claim
            .get("metric")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if vocabulary::is_turn_metric(metric) {
            turn_claim(f, locator, &mut turn_findings, (i, metric));
            continue;
        }
        match claim.get("context_length").and_then(Value::as_u64) {
            Some(length) if !lengths.is_empty() && !lengths.contains(&length) => inconsistent(
                format!("{base}/context_length"),
                format!(
                    "`{metric}` is claimed at context length {length}, which \
                     `protocol.context_lengths` ({}) does not list",
                    join(&lengths)
                ),
            ),
            None if lengths.len() > 1 && claim.get("context_length").is_none() => inconsistent(
                base.clone(),
                format!(
                    "`{metric}` gives no `context_length`, but the protocol lists several ({})",
                    join(&lengths)
                ),
            ),
            _ => {}
        }
        let wrong_direction = match direction {
            Some("forward") => vocabulary::is_reverse_kl(metric),
            Some("reverse") => vocabulary::is_forward_kl(metric),
            _ => false,
        };
        if wrong_direction {
            inconsistent(
                format!("{base}/metric"),
                format!(
                    "`{metric}` is a {} KL metric, but `protocol.kl.direction` is `{}`",
                    if vocabulary::is_reverse_kl(metric) {
                        "reverse"
                    } else {
                        "forward"
                    },
                    direction.unwrap_or_default()
                ),
            );
        }
        if claim.get("uncertainty").is_some() && method == Some("none") {
            inconsistent(
                format!("{base}/uncertainty"),
                format!(
                    "`{metric}` states an uncertainty, but `protocol.aggregation.uncertainty.method` \
                     is `none`"
                ),
            );
        }
    }
    out.extend(turn_findings);
}

/// A turn metric's claim needs the turns it was measured on: a conversation eval text and
/// `protocol.turns` (which turns, decoding, `max_new_tokens`, stop tokens).
fn turn_claim(
    f: &Value,
    locator: &Locator<'_>,
    out: &mut Vec<Finding>,
    (i, metric): (usize, &str),
) {
    if f.pointer("/protocol/turns").is_none() {
        let item = Item::Positions;
        let finding = Finding::new(
            Code::MissingDisclosure,
            format!(
                "disclosure item `{item}`: `protocol.turns` is missing, but results[{i}] claims \
                 the turn metric `{metric}`: which turns were generated, how (decoding, \
                 max_new_tokens) and where they stop (stop_token_ids) decide its value; {}",
                item.why()
            ),
        )
        .item(Some(item));
        out.push(locator.at_value(finding, &format!("/fidelity/results/{i}/metric")));
    }
    if !is_conversation(f) {
        out.push(locator.at_value(
            Finding::new(
                Code::InconsistentClaim,
                format!(
                    "`{metric}` is a turn metric, generated on the assistant turns of \
                     conversations, but the eval text is not conversations (`eval.text.kind`)"
                ),
            ),
            &format!("/fidelity/results/{i}/metric"),
        ));
    }
}

fn join(values: &[u64]) -> String {
    values
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
