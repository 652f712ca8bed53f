//! The card's disclosed protocol as rerun settings, and the differences between the card's lane
//! and the rerun's that make its numbers not comparable.

use serde_json::Value;

use crate::measure::protocol::{Bootstrap, Direction, Positions, Tail, VocabMode};
use crate::measurement::MeasureOptions;
use crate::runner::tokens::Bos;

/// Rerun settings from a disclosure.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub options: MeasureOptions,
    /// Compute dtype the card states for the native runner (`f32` when another engine ran it).
    pub compute: String,
    /// Card states KL in bits (the rerun's nats are converted before comparing).
    pub bits: bool,
    /// Padding rows included (the rerun then scores every logit entry).
    pub padding_included: bool,
    /// Aggregation other than the mean over positions (not computed by the rerun).
    pub aggregation: Option<String>,
}

/// What the card discloses, or why the rerun cannot follow it (each a missing or unusable piece).
pub fn resolve(f: &Value) -> Result<Resolved, Vec<String>> {
    let mut missing = Vec::new();
    let p = &f["protocol"];
    let context_lengths: Vec<usize> = p["context_lengths"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|l| l as usize)
                .collect()
        })
        .unwrap_or_default();
    if context_lengths.is_empty() {
        missing.push("protocol.context_lengths missing".into());
    }
    let positions = match p["positions"]["policy"].as_str() {
        Some("all") => Some(Positions::All),
        Some("second_half") => Some(Positions::SecondHalf),
        Some("stride") => match (
            p["positions"]["stride"].as_u64(),
            p["positions"]["offset"].as_u64(),
        ) {
            (Some(stride), Some(offset)) if stride > 0 && offset < stride => {
                Some(Positions::Stride { stride, offset })
            }
            _ => {
                missing.push(
                    "protocol.positions: stride policy needs stride and an offset below it".into(),
                );
                None
            }
        },
        Some("from") => match p["positions"]["from"].as_u64() {
            Some(from) => Some(Positions::From { from }),
            None => {
                missing.push("protocol.positions: from policy needs `from`".into());
                None
            }
        },
        _ => {
            missing.push("protocol.positions missing".into());
            None
        }
    };
    let direction = match p["kl"]["direction"].as_str() {
        Some("forward") => Some(Direction::Forward),
        Some("reverse") => Some(Direction::Reverse),
        Some("both") => Some(Direction::Both),
        _ => {
            missing.push("protocol.kl.direction missing".into());
            None
        }
    };
    let bits = p["kl"]["units"].as_str() == Some("bits");
    let v = &p["vocab"];
    let vocab = match v["mode"].as_str() {
        Some("full") => Some(VocabMode::Full),
        Some("threshold") => Some(VocabMode::Threshold {
            log_p: v["log_p"].as_f64().unwrap_or(-16.0),
        }),
        Some("top_k") => {
            let tail = match v["tail"].as_str() {
                Some("lumped") => Some(Tail::Lumped),
                Some("dropped") => Some(Tail::Dropped),
                Some("renormalized") => Some(Tail::Renormalized),
                _ => None,
            };
            match (v["k"].as_u64(), tail) {
                (Some(k), Some(tail)) if k > 0 => Some(VocabMode::TopK {
                    k: k as usize,
                    tail,
                }),
                _ => {
                    missing.push("protocol.vocab: top_k needs k and tail".into());
                    None
                }
            }
        }
        _ => {
            missing.push("protocol.vocab.mode missing".into());
            None
        }
    };
    let padding_included = v["padding"].as_str() == Some("included");
    let agg = &p["aggregation"];
    let aggregation = match agg["statistic"].as_str() {
        Some("mean_over_positions") => None,
        Some(other) => Some(other.to_owned()),
        None => {
            missing.push("protocol.aggregation.statistic missing".into());
            None
        }
    };
    let u = &agg["uncertainty"];
    let bootstrap = Bootstrap {
        resamples: u["resamples"].as_u64().map_or(1000, |r| r as usize),
        seed: u["seed"].as_u64().unwrap_or(0),
        level: u["level"].as_f64().unwrap_or(0.95),
    };
    let bos = match f["eval"]["bos"].as_str() {
        Some("none") => Some(Bos::None),
        Some("per_window") => Some(Bos::PerWindow),
        Some("per_document") => Some(Bos::PerDocument),
        _ => {
            missing.push("eval.bos missing".into());
            None
        }
    };
    let compute = match f["runtime"]["engine"].as_str() {
        Some("cardproof") => f["runtime"]["compute_dtype"]
            .as_str()
            .unwrap_or("f32")
            .to_owned(),
        _ => "f32".to_owned(),
    };
    if let (Some(d), Some(v)) = (direction, vocab)
        && let Some(why) = crate::measure::protocol::unmeasurable(d, v)
    {
        missing.push(format!("protocol.kl.direction: {why}"));
    }
    match (positions, direction, vocab, bos) {
        (Some(positions), Some(direction), Some(vocab), Some(bos)) if missing.is_empty() => {
            Ok(Resolved {
                options: MeasureOptions {
                    direction,
                    vocab,
                    positions,
                    bootstrap,
                    context_lengths,
                    bos,
                    vocab_size: None,
                    dump_logits: None,
                },
                compute,
                bits,
                padding_included,
                aggregation,
            })
        }
        _ => Err(missing),
    }
}

/// Differences between the card's lane and protocol and what the rerun did: each one makes the
/// card's numbers not comparable with the rerun's.
pub fn lane_differences(card: &Value, measurement: &Value, resolved: &Resolved) -> Vec<String> {
    let mut out = Vec::new();
    let rt = &card["runtime"];
    let env = &measurement["environment"];
    let engine = rt["engine"].as_str().unwrap_or("?");
    let rerun_engine = if env["runner"] == "transformers" {
        "transformers"
    } else {
        "cardproof"
    };
    if engine != rerun_engine {
        out.push(format!(
            "engine: the card's numbers come from {engine} {} on {}; the rerun is {} ({})",
            rt["engine_version"].as_str().unwrap_or("?"),
            rt["device"].as_str().unwrap_or("?"),
            if rerun_engine == "cardproof" {
                "cardproof's native runner"
            } else {
                "cardproof's transformers runner"
            },
            env["lane"].as_str().unwrap_or("reference semantics"),
        ));
    } else if rerun_engine == "transformers" {
        // Same engine: its version, the GPU and every numerics knob must match too.
        let rerun_rt = &measurement["fidelity"]["runtime"];
        for (what, key) in [
            ("transformers version", "engine_version"),
            ("device", "device"),
            ("device count", "device_count"),
            ("attention", "attention_backend"),
            ("compute dtype", "compute_dtype"),
            ("KV-cache dtype", "kv_cache_dtype"),
        ] {
            let (c, r) = (&rt[key], &rerun_rt[key]);
            if !c.is_null() && !r.is_null() && c != r {
                out.push(format!("{what}: card {c}, rerun {r}"));
            }
        }
        for flag in ["torch", "tf32"] {
            let (c, r) = (&rt["flags"][flag], &rerun_rt["flags"][flag]);
            if !c.is_null() && c != r {
                out.push(format!("{flag}: card {c}, rerun {r}"));
            }
        }
    } else {
        let pairs = [
            (
                "compute dtype",
                rt["compute_dtype"].as_str(),
                env["compute_dtype"].as_str(),
            ),
            (
                "KV-cache dtype",
                rt["kv_cache_dtype"].as_str(),
                env["kv_cache_dtype"].as_str(),
            ),
            (
                "attention",
                rt["attention_backend"].as_str(),
                env["attention"].as_str(),
            ),
        ];
        for (what, claimed, rerun) in pairs {
            if let (Some(c), Some(r)) = (claimed, rerun)
                && !c.eq_ignore_ascii_case(r)
            {
                out.push(format!("{what}: card {c}, rerun {r}"));
            }
        }
    }
    let digest = |what: &str, claimed: &Value, rerun: &Value| -> Option<String> {
        match (claimed.as_str(), rerun.as_str()) {
            (Some(c), Some(r)) if c != r => Some(format!("{what}: card {c}, rerun {r}")),
            _ => None,
        }
    };
    let ev = &measurement["eval"];
    out.extend(digest(
        "eval text sha256",
        &card["eval"]["text"]["sha256"],
        &ev["text_sha256"],
    ));
    out.extend(digest(
        "tokens sha256",
        &card["eval"]["tokens"]["sha256"],
        &ev["tokens_sha256"],
    ));
    if let (Some(c), Some(r)) = (
        card["eval"]["tokens"]["count"].as_u64(),
        ev["token_count"].as_u64(),
    ) && c != r
    {
        out.push(format!("token count: card {c}, rerun {r}"));
    }
    out.extend(digest(
        "candidate files (root sha256)",
        &card["candidate"]["files_sha256"],
        &measurement["candidate"]["manifest_sha256"],
    ));
    out.extend(digest(
        "reference files (root sha256)",
        &card["reference"]["files_sha256"],
        &measurement["reference"]["manifest_sha256"],
    ));
    if let Some(a) = &resolved.aggregation {
        out.push(format!(
            "aggregation: card {a}, the rerun computes mean_over_positions"
        ));
    }
    out
}
