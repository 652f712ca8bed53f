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
    /// The prefill chunk (tokens): each window prefilled in pieces of this many tokens, the KV
    /// cache and recurrent state carried (and stored) between them, as an engine's chunked
    /// prefill runs it; `None`: each window in one pass. A protocol item: it changes the
    /// numbers (a state kept in bf16 is rounded only where a chunk ends).
    pub prefill_chunk: Option<usize>,
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
        if let Some(chunk) = self.prefill_chunk {
            check_prefill_chunk(chunk).map_err(bad)?;
        }
        self.vocab.check().map_err(bad)
    }
}

/// A prefill chunk in range: at least 1 token, at most the longest window there can be.
pub fn check_prefill_chunk(chunk: usize) -> std::result::Result<(), String> {
    let most = crate::kld::protocol::MAX_CONTEXT_LENGTH;
    if chunk == 0 || chunk > most {
        return Err(format!("prefill chunk {chunk} is not 1 to {most} tokens"));
    }
    Ok(())
}

/// The measurement protocol as the command line gives it: the raw value of each flag `kld`,
/// `measure` and `reference export` share (`--direction`, `--vocab`, `--top-k`, `--tail`,
/// `--threshold`, `--positions`, `--stride`, `--offset`, `--from`, `--vocab-size`,
/// `--bootstrap`, `--seed`), checked together by [`ProtocolFlags::options`]. Every refusal is a
/// usage message naming the flags; [`Default`] is the command line's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolFlags {
    /// `None`: both directions, forward only under `--vocab threshold` (llama.cpp's method).
    pub direction: Option<Direction>,
    pub vocab: disclosure::VocabMode,
    /// k, for `--vocab top-k` only.
    pub top_k: Option<usize>,
    pub tail: Tail,
    /// log p, read under `--vocab threshold` only.
    pub threshold: f64,
    pub positions: disclosure::PositionPolicy,
    /// For `--positions stride` only.
    pub stride: Option<u64>,
    /// For `--positions stride` only.
    pub offset: Option<u64>,
    /// For `--positions from` only.
    pub from: Option<u64>,
    /// For `--positions role:ROLE` only.
    pub role: Option<crate::kld::protocol::Role>,
    /// For `--positions span:SEGMENT` only.
    pub span: Option<crate::kld::protocol::Segment>,
    pub vocab_size: Option<usize>,
    /// Bootstrap resamples (the level is 0.95).
    pub bootstrap: usize,
    pub seed: u64,
}

impl Default for ProtocolFlags {
    fn default() -> Self {
        ProtocolFlags {
            direction: None,
            vocab: disclosure::VocabMode::Full,
            top_k: None,
            tail: Tail::Lumped,
            threshold: -16.0,
            positions: disclosure::PositionPolicy::All,
            stride: None,
            offset: None,
            from: None,
            role: None,
            span: None,
            vocab_size: None,
            bootstrap: 1000,
            seed: 0,
        }
    }
}

impl ProtocolFlags {
    /// The options of a run over `context_lengths` (each range-checked, then sorted and
    /// deduplicated: one run per length) with `bos`; no logits dumped. None given is left to
    /// [`MeasureOptions::check`].
    pub fn options(&self, context_lengths: &[usize], bos: Bos) -> Result<MeasureOptions, String> {
        let o = self.kld_options(None)?;
        let mut lengths = context_lengths.to_vec();
        for &l in &lengths {
            check_context_length(l as u64).map_err(|why| format!("--context-length {l}: {why}"))?;
        }
        lengths.sort_unstable();
        lengths.dedup();
        Ok(MeasureOptions {
            direction: o.direction,
            vocab: o.vocab,
            positions: o.positions,
            bootstrap: o.bootstrap,
            context_lengths: lengths,
            bos,
            vocab_size: o.vocab_size,
            dump_logits: None,
            prefill_chunk: None,
        })
    }

    /// The options of `kld`'s reduction of two logit files, `context_length` the window of a
    /// dump without a `positions` tensor (range-checked).
    pub fn kld_options(&self, context_length: Option<u64>) -> Result<crate::kld::Options, String> {
        use disclosure::{PositionPolicy, VocabMode as Name};
        let direction = match self.direction {
            Some(d) => d,
            // llama.cpp's threshold mode is forward only (see `unmeasurable`).
            None if self.vocab == Name::Threshold => Direction::Forward,
            None => Direction::Both,
        };
        let vocab = match self.vocab {
            Name::Full => VocabMode::Full,
            Name::TopK => {
                let k = self.top_k.ok_or("--vocab top-k needs --top-k K")?;
                if k == 0 {
                    return Err("--top-k must be at least 1".into());
                }
                VocabMode::TopK { k, tail: self.tail }
            }
            Name::Threshold => {
                if !(self.threshold.is_finite() && self.threshold <= 0.0) {
                    return Err(format!(
                        "--threshold {} must be a log-probability (<= 0)",
                        self.threshold
                    ));
                }
                VocabMode::Threshold {
                    log_p: self.threshold,
                }
            }
        };
        if let Some(why) = crate::kld::protocol::unmeasurable(direction, vocab) {
            let name = match self.direction {
                Some(Direction::Forward) => "forward",
                Some(Direction::Reverse) => "reverse",
                Some(Direction::Both) | None => "both",
            };
            return Err(format!("--direction {name}: {why}"));
        }
        if self.top_k.is_some() && self.vocab != Name::TopK {
            return Err("--top-k needs --vocab top-k".into());
        }
        let positions = match self.positions {
            PositionPolicy::All => Positions::All,
            PositionPolicy::SecondHalf => Positions::SecondHalf,
            PositionPolicy::Stride => {
                let stride = self.stride.ok_or("--positions stride needs --stride N")?;
                let offset = self
                    .offset
                    .ok_or("--positions stride needs --offset K (0 <= K < N)")?;
                if stride == 0 || offset >= stride {
                    return Err(format!(
                        "--offset {offset} must be below --stride {stride} (and the stride at least 1)"
                    ));
                }
                Positions::Stride { stride, offset }
            }
            PositionPolicy::From => Positions::From {
                from: self.from.ok_or("--positions from needs --from N")?,
            },
            PositionPolicy::Role => Positions::Role {
                role: self
                    .role
                    .ok_or("--positions role needs a role: role:assistant")?,
                stride: self.stride,
                offset: self.offset,
            },
            PositionPolicy::Span => Positions::Span {
                span: self
                    .span
                    .ok_or("--positions span needs a segment: span:tool_call")?,
                stride: self.stride,
                offset: self.offset,
            },
        };
        let labelled = matches!(self.positions, PositionPolicy::Role | PositionPolicy::Span);
        if labelled && self.stride.is_some() != self.offset.is_some() {
            return Err("--stride and --offset go together (0 <= K < N)".into());
        }
        if labelled && let Err(why) = positions.check() {
            return Err(format!("--offset/--stride: {why}"));
        }
        if (self.stride.is_some() || self.offset.is_some())
            && self.positions != PositionPolicy::Stride
            && !labelled
        {
            return Err(
                "--stride and --offset need --positions stride (or a role: or span: policy)".into(),
            );
        }
        if self.from.is_some() && self.positions != PositionPolicy::From {
            return Err("--from needs --positions from".into());
        }
        if self.vocab_size == Some(0) {
            return Err("--vocab-size must be at least 1".into());
        }
        let bootstrap = Bootstrap {
            resamples: self.bootstrap,
            seed: self.seed,
            level: 0.95,
        };
        bootstrap
            .check()
            .map_err(|why| format!("--bootstrap {}: {why}", self.bootstrap))?;
        if let Some(l) = context_length {
            check_context_length(l).map_err(|why| format!("--context-length {l}: {why}"))?;
        }
        Ok(crate::kld::Options {
            direction,
            vocab,
            positions,
            context_length,
            vocab_size: self.vocab_size,
            bootstrap,
        })
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
    /// The turns the card's turn metrics were generated by (`protocol.turns`).
    pub turns: Option<super::turns::TurnProtocol>,
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
    let positions = resolve_positions(&p.positions, &mut missing);
    let v = &p.vocab;
    let vocab = resolve_vocab(v, &mut missing);
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
    let turns = p
        .turns
        .as_ref()
        .and_then(|t| resolve_turns(t, &mut missing));
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
                prefill_chunk: p.prefill_chunk.map(|c| c as usize),
            },
            compute,
            bits: p.kl.units == KlUnits::Bits,
            padding_included: v.padding == Some(PaddingRows::Included),
            aggregation,
            turns,
        }),
        _ => Err(missing),
    }
}

/// The card's `protocol.turns` as the rerun generates them; an unusable `max_new_tokens` is
/// recorded in `missing`.
fn resolve_turns(
    t: &disclosure::Turns,
    missing: &mut Vec<String>,
) -> Option<super::turns::TurnProtocol> {
    let protocol = super::turns::TurnProtocol {
        turns: t.select,
        decoding: t.decoding,
        max_new_tokens: usize::try_from(t.max_new_tokens).unwrap_or(usize::MAX),
    };
    match protocol.check() {
        Ok(()) => Some(protocol),
        Err(why) => {
            missing.push(format!("protocol.turns: {why}"));
            None
        }
    }
}

/// The protocol's positions as run options; a policy without the fields it needs is recorded in
/// `missing`.
fn resolve_positions(pos: &disclosure::Positions, missing: &mut Vec<String>) -> Option<Positions> {
    match pos.policy {
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
        disclosure::PositionPolicy::Role | disclosure::PositionPolicy::Span => {
            let policy = match (pos.policy, pos.role, pos.span) {
                (disclosure::PositionPolicy::Role, Some(role), _) => Some(Positions::Role {
                    role,
                    stride: pos.stride,
                    offset: pos.offset,
                }),
                (disclosure::PositionPolicy::Span, _, Some(span)) => Some(Positions::Span {
                    span,
                    stride: pos.stride,
                    offset: pos.offset,
                }),
                _ => None,
            };
            match policy.map(|p| (p, p.check())) {
                Some((p, Ok(()))) => Some(p),
                Some((_, Err(why))) => {
                    missing.push(format!("protocol.{why}"));
                    None
                }
                None => {
                    missing.push(
                        "protocol.positions: a role policy needs `role`, a span policy `span`"
                            .into(),
                    );
                    None
                }
            }
        }
    }
}

/// The protocol's vocabulary as run options; a mode without the fields it needs is recorded in
/// `missing`.
fn resolve_vocab(v: &disclosure::Vocab, missing: &mut Vec<String>) -> Option<VocabMode> {
    match v.mode {
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
    }
}

/// The ready `fidelity.protocol` block of a measurement run with `o` (the inverse of
/// [`resolve`]): what a card states so that its numbers can be rerun exactly.
pub fn disclosed_protocol(o: &MeasureOptions, padding_included: bool) -> disclosure::Protocol {
    let (mut role, mut span) = (None, None);
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
        Positions::Role {
            role: r,
            stride,
            offset,
        } => {
            role = Some(r);
            (disclosure::PositionPolicy::Role, stride, offset, None)
        }
        Positions::Span {
            span: s,
            stride,
            offset,
        } => {
            span = Some(s);
            (disclosure::PositionPolicy::Span, stride, offset, None)
        }
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
            role,
            span,
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
        turns: None,
        prefill_chunk: o.prefill_chunk.map(|c| c as u64),
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
                prefill_chunk: Some(2048),
            };
            let p = disclosed_protocol(&o, true);
            let back = resolve(&p, Bos::PerWindow, None).unwrap();
            assert_eq!(back.options.positions, o.positions);
            assert_eq!(back.options.vocab, o.vocab);
            assert_eq!(back.options.direction, o.direction);
            assert_eq!(back.options.bootstrap, o.bootstrap);
            assert_eq!(back.options.context_lengths, o.context_lengths);
            assert_eq!(back.options.prefill_chunk, o.prefill_chunk);
            assert!(back.padding_included && !back.bits && back.aggregation.is_none());
        }
    }

    fn flags(edit: impl Fn(&mut ProtocolFlags)) -> Result<MeasureOptions, String> {
        let mut f = ProtocolFlags::default();
        edit(&mut f);
        f.options(&[512], Bos::None)
    }

    /// The command line's defaults: full vocabulary, both directions, every row, 1000 resamples
    /// at 95% with seed 0; under `--vocab threshold` the direction is forward only.
    #[test]
    fn protocol_flags_defaults() {
        let o = flags(|_| {}).unwrap();
        assert_eq!(o.direction, Direction::Both);
        assert_eq!(o.vocab, VocabMode::Full);
        assert_eq!(o.positions, Positions::All);
        assert_eq!(
            o.bootstrap,
            Bootstrap {
                resamples: 1000,
                seed: 0,
                level: 0.95
            }
        );
        assert_eq!(
            (o.vocab_size, o.bos, o.dump_logits),
            (None, Bos::None, None)
        );
        let t = flags(|f| f.vocab = disclosure::VocabMode::Threshold).unwrap();
        assert_eq!(t.direction, Direction::Forward);
        assert_eq!(t.vocab, VocabMode::Threshold { log_p: -16.0 });
        let k = flags(|f| {
            f.vocab = disclosure::VocabMode::TopK;
            f.top_k = Some(8);
            f.tail = Tail::Dropped;
            f.positions = disclosure::PositionPolicy::Stride;
            f.stride = Some(4);
            f.offset = Some(3);
            f.direction = Some(Direction::Reverse);
        })
        .unwrap();
        assert_eq!(k.direction, Direction::Reverse);
        assert_eq!(
            k.vocab,
            VocabMode::TopK {
                k: 8,
                tail: Tail::Dropped
            }
        );
        assert_eq!(
            k.positions,
            Positions::Stride {
                stride: 4,
                offset: 3
            }
        );
        let from = flags(|f| {
            f.positions = disclosure::PositionPolicy::From;
            f.from = Some(7);
        });
        assert_eq!(from.unwrap().positions, Positions::From { from: 7 });
    }

    /// Context lengths: each in range, then sorted and deduplicated (one run per length).
    #[test]
    fn protocol_flags_context_lengths() {
        let f = ProtocolFlags::default();
        let o = f.options(&[512, 128, 512], Bos::PerWindow).unwrap();
        assert_eq!((o.context_lengths, o.bos), (vec![128, 512], Bos::PerWindow));
        assert_eq!(
            f.options(&[512, 1], Bos::None).unwrap_err(),
            "--context-length 1: context length 1 is outside 2..=1048576 tokens"
        );
        let kld = f.kld_options(Some(64)).unwrap();
        assert_eq!(kld.context_length, Some(64));
        assert_eq!(f.kld_options(None).unwrap().context_length, None);
        assert_eq!(
            f.kld_options(Some(1 << 21)).unwrap_err(),
            "--context-length 2097152: context length 2097152 is outside 2..=1048576 tokens"
        );
    }

    /// Each inconsistent or out-of-range combination is refused with a message naming its flags.
    #[test]
    fn protocol_flags_refusals() {
        use disclosure::{PositionPolicy as P, VocabMode as V};
        type Edit = fn(&mut ProtocolFlags);
        let cases: Vec<(Edit, &str)> = vec![
            (|f| f.vocab = V::TopK, "--vocab top-k needs --top-k K"),
            (
                |f| {
                    f.vocab = V::TopK;
                    f.top_k = Some(0);
                },
                "--top-k must be at least 1",
            ),
            (|f| f.top_k = Some(5), "--top-k needs --vocab top-k"),
            (
                |f| {
                    f.vocab = V::Threshold;
                    f.threshold = 1.0;
                },
                "--threshold 1 must be a log-probability (<= 0)",
            ),
            (
                |f| {
                    f.vocab = V::Threshold;
                    f.threshold = f64::NAN;
                },
                "--threshold NaN must be a log-probability (<= 0)",
            ),
            (
                |f| f.positions = P::Stride,
                "--positions stride needs --stride N",
            ),
            (
                |f| {
                    f.positions = P::Stride;
                    f.stride = Some(4);
                },
                "--positions stride needs --offset K (0 <= K < N)",
            ),
            (
                |f| {
                    f.positions = P::Stride;
                    f.stride = Some(4);
                    f.offset = Some(4);
                },
                "--offset 4 must be below --stride 4 (and the stride at least 1)",
            ),
            (
                |f| {
                    f.positions = P::Stride;
                    f.stride = Some(0);
                    f.offset = Some(0);
                },
                "--offset 0 must be below --stride 0 (and the stride at least 1)",
            ),
            (
                |f| f.offset = Some(1),
                "--stride and --offset need --positions stride (or a role: or span: policy)",
            ),
            (
                |f| f.stride = Some(2),
                "--stride and --offset need --positions stride (or a role: or span: policy)",
            ),
            (|f| f.positions = P::From, "--positions from needs --from N"),
            (|f| f.from = Some(3), "--from needs --positions from"),
            (
                |f| f.vocab_size = Some(0),
                "--vocab-size must be at least 1",
            ),
            (
                |f| f.bootstrap = 0,
                "--bootstrap 0: bootstrap resamples 0 is outside 1..=100000",
            ),
            (
                |f| f.bootstrap = 1_000_000_000,
                "--bootstrap 1000000000: bootstrap resamples 1000000000 is outside 1..=100000",
            ),
        ];
        for (edit, message) in cases {
            assert_eq!(flags(edit).unwrap_err(), message);
            let mut f = ProtocolFlags::default();
            edit(&mut f);
            assert_eq!(f.kld_options(None).unwrap_err(), message);
        }
        // The reverse KL under a threshold is not a divergence: refused, the direction named
        // as given (or `both` by default when it is not forward).
        for (direction, name) in [
            (Some(Direction::Reverse), "reverse"),
            (Some(Direction::Both), "both"),
        ] {
            let e = flags(|f| {
                f.vocab = V::Threshold;
                f.direction = direction;
            })
            .unwrap_err();
            assert!(
                e.starts_with(&format!(
                    "--direction {name}: the reverse KL under vocab mode threshold"
                )),
                "{e}"
            );
        }
    }
}
