//! The card's disclosed protocol as rerun settings, and the differences between the card's lane
//! and the rerun's that make its numbers not comparable.

use serde_json::Value;

use crate::measure::protocol::{
    Bootstrap, Direction, Positions, Tail, VocabMode, check_context_length,
};
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
    // Every number that sizes a loop or an allocation is range-checked here: a card's
    // `resamples: 1000000000` or `level: 2.0` is unusable, never clamped or defaulted.
    let mut context_lengths: Vec<usize> = Vec::new();
    for (i, l) in p["context_lengths"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        match l.as_u64().map(|n| (n, check_context_length(n))) {
            Some((n, Ok(()))) => context_lengths.push(n as usize),
            Some((_, Err(why))) => missing.push(format!("protocol.context_lengths[{i}]: {why}")),
            None => missing.push(format!(
                "protocol.context_lengths[{i}]: {l} is not a whole number of tokens"
            )),
        }
    }
    if context_lengths.is_empty() && missing.is_empty() {
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
        Some("threshold") => {
            let mode = VocabMode::Threshold {
                log_p: optional(&v["log_p"], Value::as_f64, -16.0).unwrap_or(f64::NAN),
            };
            match mode.check() {
                Ok(()) => Some(mode),
                Err(why) => {
                    missing.push(format!("protocol.{why} (found {})", v["log_p"]));
                    None
                }
            }
        }
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
    let key = "protocol.aggregation.uncertainty";
    let resamples = optional(&u["resamples"], Value::as_u64, 1000);
    let seed = optional(&u["seed"], Value::as_u64, 0);
    let level = optional(&u["level"], Value::as_f64, 0.95);
    for (name, ok) in [
        ("resamples", resamples.is_some()),
        ("seed", seed.is_some()),
        ("level", level.is_some()),
    ] {
        if !ok {
            missing.push(format!("{key}.{name}: {} is not a usable number", u[name]));
        }
    }
    let bootstrap = Bootstrap {
        resamples: resamples.map_or(0, |r| usize::try_from(r).unwrap_or(usize::MAX)),
        seed: seed.unwrap_or(0),
        level: level.unwrap_or(f64::NAN),
    };
    if resamples.is_some()
        && level.is_some()
        && let Err(why) = bootstrap.check()
    {
        missing.push(format!("{key}: {why}"));
    }
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

/// A field that defaults when absent: `Some(default)` then, the value when `get` reads it, and
/// `None` when it is present but unusable (a string, a negative seed, a fractional count).
fn optional<T>(v: &Value, get: impl Fn(&Value) -> Option<T>, default: T) -> Option<T> {
    if v.is_null() { Some(default) } else { get(v) }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The compliant example's disclosure with `edit` applied.
    fn resolved(edit: impl Fn(&mut Value)) -> Result<Resolved, Vec<String>> {
        let mut f = serde_json::json!({
            "protocol": {
                "context_lengths": [512],
                "positions": {"policy": "stride", "stride": 32, "offset": 31},
                "kl": {"direction": "forward", "units": "nats"},
                "vocab": {"mode": "full"},
                "aggregation": {
                    "statistic": "mean_over_positions",
                    "uncertainty": {"method": "block_bootstrap", "level": 0.95, "resamples": 1000, "seed": 7}
                }
            },
            "eval": {"bos": "none"},
            "runtime": {"engine": "cardproof"}
        });
        edit(&mut f);
        resolve(&f)
    }

    /// Regression (#14): `resolve` passed a card's `level: 2.0` to the bootstrap (a panic),
    /// `resamples: 1000000000` (24 GB) and a 2^30-token window through, and turned a negative
    /// seed or a string count into the default without a word.
    #[test]
    fn protocol_numbers_out_of_range_are_unusable_not_clamped() {
        let ok = resolved(|_| {}).unwrap();
        assert_eq!(ok.options.bootstrap.resamples, 1000);
        assert_eq!(ok.options.bootstrap.seed, 7);
        let u = "/protocol/aggregation/uncertainty";
        for (pointer, value, needle) in [
            (
                format!("{u}/level"),
                serde_json::json!(2.0),
                "level 2 is not strictly between 0 and 1",
            ),
            (
                format!("{u}/level"),
                serde_json::json!(1.0),
                "level 1 is not",
            ),
            (format!("{u}/level"), serde_json::json!(0), "level 0 is not"),
            (
                format!("{u}/resamples"),
                serde_json::json!(1_000_000_000u64),
                "resamples 1000000000 is outside 1..=100000",
            ),
            (
                format!("{u}/resamples"),
                serde_json::json!(0),
                "resamples 0",
            ),
            (
                format!("{u}/resamples"),
                serde_json::json!("many"),
                "resamples: \"many\" is not a usable number",
            ),
            (
                format!("{u}/seed"),
                serde_json::json!(-1),
                "seed: -1 is not a usable number",
            ),
            (
                "/protocol/context_lengths/0".into(),
                serde_json::json!(1u64 << 30),
                "context_lengths[0]: context length 1073741824 is outside 2..=1048576",
            ),
            (
                "/protocol/context_lengths/0".into(),
                serde_json::json!(1),
                "outside 2..=",
            ),
            (
                "/protocol/context_lengths/0".into(),
                serde_json::json!("4k"),
                "not a whole number",
            ),
            (
                "/protocol/positions/stride".into(),
                serde_json::json!(0),
                "stride",
            ),
        ] {
            let missing = resolved(|f| *f.pointer_mut(&pointer).unwrap() = value.clone())
                .err()
                .unwrap_or_else(|| panic!("{pointer} = {value} was accepted"));
            assert!(
                missing.iter().any(|m| m.contains(needle)),
                "{pointer} = {value}: {missing:?}"
            );
        }
        let missing = resolved(|f| {
            f["protocol"]["vocab"] = serde_json::json!({"mode": "threshold", "log_p": 3.0});
        })
        .err()
        .unwrap();
        assert!(missing.iter().any(|m| m.contains("log_p 3")), "{missing:?}");
    }
}
