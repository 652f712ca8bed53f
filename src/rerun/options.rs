//! The run options, and the one conversion between them and the card's typed protocol: a card's
//! `fidelity.protocol` (with `eval.bos` and the runtime's compute dtype) resolves into
//! [`MeasureOptions`] here, and a measurement's options become the ready `fidelity.protocol`
//! block here. Nothing else matches protocol strings.

use std::path::{Path, PathBuf};

use crate::disclosure::{self, ContextLength, KlUnits, PaddingRows};
use crate::error::{Error, Result};
use crate::kld::protocol::{
    Bootstrap, Bos, Direction, Positions, Tail, VocabMode, check_context_length,
};

/// Everything that defines a measurement besides the two models and the text.
#[derive(Debug, Clone)]
pub struct MeasureOptions {
    pub direction: Direction,
    pub vocab: VocabMode,
    pub positions: Positions,
    pub bootstrap: Bootstrap,
    pub context_lengths: Vec<usize>,
    pub bos: Bos,
    /// Logit entries to use; default: the tokenizer's vocabulary (padding excluded).
    pub vocab_size: Option<usize>,
    /// Write both models' logits at the scored rows here (one context length only).
    pub dump_logits: Option<PathBuf>,
}

impl MeasureOptions {
    /// Every number that sizes a loop or an allocation, in range (context lengths, bootstrap
    /// resamples and level, stride, k, threshold) before any work starts; the binary and
    /// `verify` check earlier with their own wording, this guards every library caller.
    pub fn check(&self) -> Result<()> {
        let bad = |rule: String| Error::usage(Path::new("measurement protocol"), rule);
        if self.context_lengths.is_empty() {
            return Err(bad("no context length given".into()));
        }
        for &l in &self.context_lengths {
            check_context_length(l as u64).map_err(bad)?;
        }
        self.bootstrap.check().map_err(bad)?;
        self.positions.check().map_err(bad)?;
        self.vocab.check().map_err(bad)
    }
}

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

/// What the card's typed protocol discloses, or why the rerun cannot follow it (each a missing
/// or unusable piece, named by its field path). Every number that sizes a loop or an allocation
/// is range-checked here: a card's `resamples: 1000000000` or `level: 2.0` is unusable, never
/// clamped or defaulted.
pub fn resolve(
    p: &disclosure::Protocol,
    bos: disclosure::BosPolicy,
    runtime: Option<&disclosure::Runtime>,
) -> Result<Resolved, Vec<String>> {
    let mut missing = Vec::new();
    let mut context_lengths = Vec::new();
    for (i, ContextLength(n)) in p.context_lengths.iter().enumerate() {
        match check_context_length(*n) {
            Ok(()) => context_lengths.push(*n as usize),
            Err(why) => missing.push(format!("protocol.context_lengths[{i}]: {why}")),
        }
    }
    if context_lengths.is_empty() && missing.is_empty() {
        missing.push("protocol.context_lengths missing".into());
    }
    let pos = &p.positions;
    let positions = match pos.policy {
        disclosure::PositionPolicy::All => Some(Positions::All),
        disclosure::PositionPolicy::SecondHalf => Some(Positions::SecondHalf),
        disclosure::PositionPolicy::Stride => match (pos.stride, pos.offset) {
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
        disclosure::PositionPolicy::From => match pos.from {
            Some(from) => Some(Positions::From { from }),
            None => {
                missing.push("protocol.positions: from policy needs `from`".into());
                None
            }
        },
    };
    let v = &p.vocab;
    let vocab = match v.mode {
        disclosure::VocabMode::Full => Some(VocabMode::Full),
        disclosure::VocabMode::Threshold => {
            let mode = VocabMode::Threshold {
                log_p: v.log_p.unwrap_or(-16.0),
            };
            match mode.check() {
                Ok(()) => Some(mode),
                Err(why) => {
                    missing.push(format!(
                        "protocol.{why} (found {})",
                        v.log_p.map_or("none".into(), |l| l.to_string())
                    ));
                    None
                }
            }
        }
        disclosure::VocabMode::TopK => match (v.k, v.tail) {
            (Some(k), Some(tail)) if k > 0 => Some(VocabMode::TopK {
                k: usize::try_from(k).unwrap_or(usize::MAX),
                tail: match tail {
                    disclosure::TailMode::Lumped => Tail::Lumped,
                    disclosure::TailMode::Dropped => Tail::Dropped,
                    disclosure::TailMode::Renormalized => Tail::Renormalized,
                },
            }),
            _ => {
                missing.push("protocol.vocab: top_k needs k and tail".into());
                None
            }
        },
    };
    if let Some(v) = vocab
        && let Err(why) = v.check()
    {
        missing.push(format!("protocol.{why}"));
    }
    let aggregation = match p.aggregation.statistic {
        disclosure::AggregationStatistic::MeanOverPositions => None,
        other => Some(
            serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        ),
    };
    let u = &p.aggregation.uncertainty;
    let bootstrap = Bootstrap {
        resamples: u
            .resamples
            .map_or(1000, |r| usize::try_from(r).unwrap_or(usize::MAX)),
        seed: u.seed.unwrap_or(0),
        level: u.level.unwrap_or(0.95),
    };
    if let Err(why) = bootstrap.check() {
        missing.push(format!("protocol.aggregation.uncertainty: {why}"));
    }
    let compute = match runtime {
        Some(rt) if rt.engine == disclosure::Engine::Cardproof => rt.compute_dtype.clone(),
        _ => "f32".to_owned(),
    };
    let direction = p.kl.direction;
    if let Some(v) = vocab
        && let Some(why) = crate::kld::protocol::unmeasurable(direction, v)
    {
        missing.push(format!("protocol.kl.direction: {why}"));
    }
    match (positions, vocab) {
        (Some(positions), Some(vocab)) if missing.is_empty() => Ok(Resolved {
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
            bits: p.kl.units == KlUnits::Bits,
            padding_included: v.padding == Some(PaddingRows::Included),
            aggregation,
        }),
        _ => Err(missing),
    }
}

/// The ready `fidelity.protocol` block of a measurement run with `o` (the inverse of
/// [`resolve`]): what a card states so that its numbers can be rerun exactly.
pub fn disclosed_protocol(o: &MeasureOptions, padding_included: bool) -> disclosure::Protocol {
    let (policy, stride, offset, from) = match o.positions {
        Positions::All => (disclosure::PositionPolicy::All, None, None, None),
        Positions::Stride { stride, offset } => (
            disclosure::PositionPolicy::Stride,
            Some(stride),
            Some(offset),
            None,
        ),
        Positions::SecondHalf => (disclosure::PositionPolicy::SecondHalf, None, None, None),
        Positions::From { from } => (disclosure::PositionPolicy::From, None, None, Some(from)),
    };
    // No padding rows at all reads as the default policy, `excluded`.
    let padding = Some(if padding_included {
        PaddingRows::Included
    } else {
        PaddingRows::Excluded
    });
    let vocab = match o.vocab {
        VocabMode::Full => disclosure::Vocab {
            mode: disclosure::VocabMode::Full,
            k: None,
            tail: None,
            log_p: None,
            padding,
        },
        VocabMode::TopK { k, tail } => disclosure::Vocab {
            mode: disclosure::VocabMode::TopK,
            k: Some(k as u64),
            tail: Some(match tail {
                Tail::Lumped => disclosure::TailMode::Lumped,
                Tail::Dropped => disclosure::TailMode::Dropped,
                Tail::Renormalized => disclosure::TailMode::Renormalized,
            }),
            log_p: None,
            padding,
        },
        VocabMode::Threshold { log_p } => disclosure::Vocab {
            mode: disclosure::VocabMode::Threshold,
            k: None,
            tail: None,
            log_p: Some(log_p),
            padding,
        },
    };
    disclosure::Protocol {
        context_lengths: o
            .context_lengths
            .iter()
            .map(|&l| ContextLength(l as u64))
            .collect(),
        positions: disclosure::Positions {
            policy,
            stride,
            offset,
            from,
        },
        kl: disclosure::Kl {
            direction: o.direction,
            units: KlUnits::Nats,
        },
        vocab,
        aggregation: disclosure::Aggregation {
            statistic: disclosure::AggregationStatistic::MeanOverPositions,
            uncertainty: disclosure::Uncertainty {
                method: disclosure::UncertaintyMethod::BlockBootstrap,
                level: Some(o.bootstrap.level),
                resamples: Some(o.bootstrap.resamples as u64),
                seed: Some(o.bootstrap.seed),
                block: Some(disclosure::FlagValue::Text("window".into())),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compliant example's protocol with `edit` applied to its JSON, read as the card is.
    fn resolved(edit: impl Fn(&mut serde_json::Value)) -> Result<Resolved, Vec<String>> {
        let mut f = serde_json::json!({
            "context_lengths": [512],
            "positions": {"policy": "stride", "stride": 32, "offset": 31},
            "kl": {"direction": "forward", "units": "nats"},
            "vocab": {"mode": "full"},
            "aggregation": {
                "statistic": "mean_over_positions",
                "uncertainty": {"method": "block_bootstrap", "level": 0.95, "resamples": 1000, "seed": 7}
            }
        });
        edit(&mut f);
        let p: disclosure::Protocol =
            disclosure::read::section(&f, "protocol").map_err(|e| vec![e])?;
        resolve(&p, disclosure::BosPolicy::None, None)
    }

    /// Regression (#14): `resolve` passed a card's `level: 2.0` to the bootstrap (a panic),
    /// `resamples: 1000000000` (24 GB) and a 2^30-token window through, and turned a negative
    /// seed or a string count into the default without a word.
    #[test]
    fn protocol_numbers_out_of_range_are_unusable_not_clamped() {
        let ok = resolved(|_| {}).unwrap();
        assert_eq!(ok.options.bootstrap.resamples, 1000);
        assert_eq!(ok.options.bootstrap.seed, 7);
        let u = "/aggregation/uncertainty";
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
                "protocol.aggregation.uncertainty.resamples: invalid type: string \"many\"",
            ),
            (
                format!("{u}/seed"),
                serde_json::json!(-1),
                "protocol.aggregation.uncertainty.seed: invalid value: integer `-1`",
            ),
            (
                "/context_lengths/0".into(),
                serde_json::json!(1u64 << 30),
                "context_lengths[0]: context length 1073741824 is outside 2..=1048576",
            ),
            (
                "/context_lengths/0".into(),
                serde_json::json!(1),
                "outside 2..=",
            ),
            (
                "/context_lengths/0".into(),
                serde_json::json!("4k"),
                "protocol.context_lengths[0]: invalid type: string \"4k\"",
            ),
            ("/positions/stride".into(), serde_json::json!(0), "stride"),
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
            f["vocab"] = serde_json::json!({"mode": "threshold", "log_p": 3.0});
        })
        .err()
        .unwrap();
        assert!(missing.iter().any(|m| m.contains("log_p 3")), "{missing:?}");
    }

    /// The two directions of the one conversion agree: a measurement's disclosed protocol
    /// resolves back into the options it was measured with.
    #[test]
    fn disclosed_protocol_resolves_to_its_options() {
        for (positions, vocab) in [
            (Positions::All, VocabMode::Full),
            (
                Positions::Stride {
                    stride: 32,
                    offset: 31,
                },
                VocabMode::TopK {
                    k: 16,
                    tail: Tail::Renormalized,
                },
            ),
            (Positions::SecondHalf, VocabMode::Threshold { log_p: -16.0 }),
            (Positions::From { from: 5 }, VocabMode::Full),
        ] {
            let o = MeasureOptions {
                direction: if matches!(vocab, VocabMode::Threshold { .. }) {
                    Direction::Forward
                } else {
                    Direction::Both
                },
                vocab,
                positions,
                bootstrap: Bootstrap {
                    resamples: 500,
                    seed: 3,
                    level: 0.9,
                },
                context_lengths: vec![128, 512],
                bos: Bos::PerWindow,
                vocab_size: None,
                dump_logits: None,
            };
            let p = disclosed_protocol(&o, true);
            let back = resolve(&p, Bos::PerWindow, None).unwrap();
            assert_eq!(back.options.positions, o.positions);
            assert_eq!(back.options.vocab, o.vocab);
            assert_eq!(back.options.direction, o.direction);
            assert_eq!(back.options.bootstrap, o.bootstrap);
            assert_eq!(back.options.context_lengths, o.context_lengths);
            assert!(back.padding_included && !back.bits && back.aggregation.is_none());
        }
    }
}
