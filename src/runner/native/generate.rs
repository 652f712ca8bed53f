//! Greedy generation in the native runner: a prompt prefilled into a [`DecoderCache`], then one
//! token at a time through the same cache (the KV-cache scheme rounds what each step writes, as
//! in prefill; a Gated DeltaNet layer carries its conv inputs and recurrent state, kept in the
//! run's state dtype between steps, as engines store them).
//!
//! Argmax has the tie rule of top-1 agreement (the first index of the maximum) over the entries
//! the tokenizer knows (`used`; padding rows of the output head are never generated). Several
//! turns of one conversation share their prefill: a prompt that extends the one before it is
//! prefilled from where that one stopped, and each turn generates from a snapshot of the cache
//! at its prompt's end, so a conversation costs about one prefill plus the generated tokens.

use candle_core::Tensor;

use super::decoder::{Decoder, DecoderCache};

/// The most tokens one turn may generate (a protocol's `max_new_tokens` is checked against it
/// before any work: each step appends to every attention layer's cache).
pub const MAX_NEW_TOKENS: usize = 1 << 16;

/// How a turn is generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greedy {
    /// Tokens generated at most, the stop token included.
    pub max_new_tokens: usize,
    /// Tokens that end a turn (the template's end-of-turn tokens); the stop token is generated
    /// (and returned) but not fed back.
    pub stops: Vec<u32>,
    /// Entries of a logit row that are tokens (the tokenizer's vocabulary, padding excluded).
    pub used: usize,
}

/// Why a turn ended.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// It generated one of the stop tokens (the last token returned).
    StopToken,
    /// It reached `max_new_tokens`.
    MaxTokens,
    /// A logit row held a NaN or an infinity: no argmax exists, the turn ends before it.
    NonFinite,
}

/// One generated turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub stop: Stop,
}

/// Where a model's generation time went, over every turn of a run: what the turns' costs are
/// checked against (about one prefill of each conversation plus the generated tokens).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub struct GenerationTiming {
    /// Prompt tokens run through the model (a prompt that extends the one before is prefilled
    /// from where that one stopped).
    pub prefill_tokens: usize,
    pub prefill_seconds: f64,
    /// Tokens generated, stop tokens included (an engine that generates past a stop id counts
    /// what it generated).
    pub generated_tokens: usize,
    /// Seconds spent generating them (every step after the prefill).
    pub decode_seconds: f64,
}

impl GenerationTiming {
    /// Generated tokens per second of decoding (`None` before any).
    pub fn decode_tokens_per_second(&self) -> Option<f64> {
        (self.decode_seconds > 0.0).then(|| self.generated_tokens as f64 / self.decode_seconds)
    }
}

/// The first index of the maximum of `row[..used]`, `None` when an entry is not finite.
pub fn argmax(row: &[f32], used: usize) -> Option<u32> {
    let row = &row[..used.min(row.len())];
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in row.iter().enumerate() {
        if !x.is_finite() {
            return None;
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// A prompt prefilled: the cache at its end and the logits of its last row (the first
/// generated token's distribution).
pub struct Prefilled {
    pub cache: DecoderCache,
    pub last_logits: Vec<f32>,
}

impl Decoder {
    /// Prefill `ids` continuing `cache` (empty for a fresh sequence); `ids` must not be empty.
    pub fn prefill(&self, ids: &[u32], mut cache: DecoderCache) -> candle_core::Result<Prefilled> {
        if ids.is_empty() {
            return Err(candle_core::Error::Msg(
                "a prompt to prefill holds no token".into(),
            ));
        }
        // The protocol's prefill chunk, or transformers' QuantizedCache chunk (defined per
        // update): a prompt is prefilled in chunks counted from where this piece starts (as
        // `hidden` does).
        let chunk = self
            .prefill_chunk()
            .unwrap_or(ids.len())
            .clamp(1, ids.len());
        let mut parts = ids.chunks(chunk);
        let mut hidden = self.hidden_continued(parts.next().unwrap_or_default(), &mut cache)?;
        for part in parts {
            hidden = self.hidden_continued(part, &mut cache)?;
        }
        let last_logits = self.logits_at(&hidden, &[hidden.dim(0)? - 1])?;
        Ok(Prefilled { cache, last_logits })
    }

    /// Generate greedily from a prefilled prompt; `from` is left as it was (its cache is cloned:
    /// tensors are shared, each step appends to new ones).
    pub fn generate(&self, from: &Prefilled, g: &Greedy) -> candle_core::Result<Generated> {
        if g.max_new_tokens > MAX_NEW_TOKENS {
            return Err(candle_core::Error::Msg(format!(
                "max_new_tokens {} is over {MAX_NEW_TOKENS}",
                g.max_new_tokens
            )));
        }
        let mut cache = from.cache.clone();
        let mut row = from.last_logits.clone();
        let mut tokens = Vec::new();
        while tokens.len() < g.max_new_tokens {
            let Some(next) = argmax(&row, g.used) else {
                return Ok(Generated {
                    tokens,
                    stop: Stop::NonFinite,
                });
            };
            tokens.push(next);
            if g.stops.contains(&next) {
                return Ok(Generated {
                    tokens,
                    stop: Stop::StopToken,
                });
            }
            if tokens.len() == g.max_new_tokens {
                break;
            }
            let hidden: Tensor = self.hidden_continued(&[next], &mut cache)?;
            row = self.logits_at(&hidden, &[0])?;
        }
        Ok(Generated {
            tokens,
            stop: Stop::MaxTokens,
        })
    }

    /// Every prompt of `prompts` generated, in order, sharing prefill work: a prompt that
    /// extends the previous one continues its cache; any other starts afresh. Returns each
    /// turn's generation and where the time went (the prefill tokens run in all).
    pub fn generate_turns(
        &self,
        prompts: &[&[u32]],
        g: &Greedy,
        progress: &dyn Fn(usize),
    ) -> candle_core::Result<(Vec<Generated>, GenerationTiming)> {
        let mut out = Vec::with_capacity(prompts.len());
        let mut at: Option<(Vec<u32>, Prefilled)> = None;
        let mut timing = GenerationTiming::default();
        for (i, prompt) in prompts.iter().enumerate() {
            let start = match &at {
                Some((done, p)) if prompt.len() > done.len() && prompt.starts_with(done) => {
                    Some((done.len(), p.cache.clone()))
                }
                _ => None,
            };
            let (skip, cache) = start.unwrap_or_default();
            let clock = std::time::Instant::now();
            let state = self.prefill(&prompt[skip..], cache)?;
            timing.prefill_seconds += clock.elapsed().as_secs_f64();
            timing.prefill_tokens += prompt.len() - skip;
            let clock = std::time::Instant::now();
            let generated = self.generate(&state, g)?;
            timing.decode_seconds += clock.elapsed().as_secs_f64();
            timing.generated_tokens += generated.tokens.len();
            out.push(generated);
            at = Some((prompt.to_vec(), state));
            progress(i + 1);
        }
        Ok((out, timing))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::runner::native::{ComputeDtype, Emulate, StateDtype, load};

    fn model(name: &str) -> super::super::NativeModel {
        load(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/models")
                .join(name),
            ComputeDtype::F32,
            Emulate::ReferenceSemantics,
            StateDtype::F32,
        )
        .unwrap()
    }

    fn prompt(name: &str, text: &str) -> Vec<u32> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/models")
            .join(name);
        let t = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        t.encode(text, false).unwrap().get_ids().to_vec()
    }

    /// The greedy tokens recomputed from scratch: the whole sequence run again for every step.
    fn from_scratch(d: &Decoder, prompt: &[u32], g: &Greedy) -> Vec<u32> {
        let mut ids = prompt.to_vec();
        let mut out = Vec::new();
        while out.len() < g.max_new_tokens {
            let hidden = d.hidden(&ids).unwrap();
            let row = d.logits_at(&hidden, &[ids.len() - 1]).unwrap();
            let next = argmax(&row, g.used).unwrap();
            out.push(next);
            if g.stops.contains(&next) {
                break;
            }
            ids.push(next);
        }
        out
    }

    #[test]
    fn argmax_takes_the_first_maximum_and_refuses_non_finite_rows() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0], 4), Some(1));
        // Padding entries beyond `used` are never generated.
        assert_eq!(argmax(&[1.0, 0.0, 9.0], 2), Some(0));
        assert_eq!(argmax(&[1.0, f32::NAN], 2), None);
        assert_eq!(argmax(&[f32::INFINITY, 1.0], 2), None);
        assert_eq!(argmax(&[], 0), None);
    }

    /// Incremental decode through the cache gives the tokens a full recomputation gives, for a
    /// dense model and for a hybrid one (whose Gated DeltaNet state is carried step to step).
    #[test]
    fn cached_greedy_decode_equals_recomputing_every_step() {
        for name in ["shakespeare-bf16", "shakespeare-hybrid-bf16"] {
            let m = model(name);
            let d = &m.decoder;
            let ids = prompt(name, "ROMEO:\nWhat light through yonder window");
            let g = Greedy {
                max_new_tokens: 24,
                stops: vec![],
                used: d.config.vocab,
            };
            let state = d.prefill(&ids, DecoderCache::default()).unwrap();
            let got = d.generate(&state, &g).unwrap();
            assert_eq!(got.stop, Stop::MaxTokens);
            assert_eq!(got.tokens, from_scratch(d, &ids, &g), "{name}");
            // The snapshot is untouched: generating again gives the same turn.
            assert_eq!(d.generate(&state, &g).unwrap(), got, "{name}");
        }
    }

    /// A decoded step's logits are the same position's prefill logits to rounding, from a
    /// two-token prefill on: its products are the many-row kernel's chains (`row_product`),
    /// and the one difference left is the softmax's row sum, candle's vectorized sum over the
    /// row's keys where the prefill sums a block's (the same values, other lanes).
    #[test]
    fn a_decoded_row_is_the_prefills_row_to_rounding() {
        let m = model("shakespeare-bf16");
        let d = &m.decoder;
        let text = "ROMEO:\nWhat light through yonder window breaks? It is the east, and Juliet is the sun.";
        let ids = prompt("shakespeare-bf16", &text.repeat(8));
        assert!(ids.len() > 130, "{} tokens", ids.len());
        let mut cache = d.prefill(&ids[..2], DecoderCache::default()).unwrap().cache;
        let whole = d.hidden(&ids).unwrap();
        for (i, &id) in ids.iter().enumerate().skip(2) {
            let step = d.hidden_continued(&[id], &mut cache).unwrap();
            let decoded = d.logits_at(&step, &[0]).unwrap();
            let prefilled = d.logits_at(&whole, &[i]).unwrap();
            let scale = prefilled.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = decoded
                .iter()
                .zip(&prefilled)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                worst <= 1e-5 * scale,
                "position {i}: {worst} off (scale {scale})"
            );
            assert_eq!(
                argmax(&decoded, d.config.vocab),
                argmax(&prefilled, d.config.vocab)
            );
        }
    }

    /// Turns whose prompts extend each other share one prefill and generate what each prompt
    /// prefilled on its own generates; a stop token ends a turn and is returned.
    #[test]
    fn nested_prompts_share_their_prefill() {
        let m = model("shakespeare-bf16");
        let d = &m.decoder;
        let text = prompt(
            "shakespeare-bf16",
            "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.",
        );
        let prompts: Vec<&[u32]> = vec![&text[..8], &text[..15], &text[..text.len()]];
        let mut g = Greedy {
            max_new_tokens: 12,
            stops: vec![],
            used: d.config.vocab,
        };
        let alone: Vec<Generated> = prompts
            .iter()
            .map(|p| {
                let state = d.prefill(p, DecoderCache::default()).unwrap();
                d.generate(&state, &g).unwrap()
            })
            .collect();
        let (shared, timing) = d.generate_turns(&prompts, &g, &|_| {}).unwrap();
        assert_eq!(timing.prefill_tokens, text.len());
        assert_eq!(
            timing.generated_tokens,
            shared.iter().map(|t| t.tokens.len()).sum::<usize>()
        );
        for (a, b) in alone.iter().zip(&shared) {
            assert_eq!(a.tokens, b.tokens);
        }
        // The third token of the first turn as a stop: the turn ends there, with it.
        g.stops = vec![alone[0].tokens[2]];
        let first = alone[0]
            .tokens
            .iter()
            .position(|t| *t == g.stops[0])
            .unwrap();
        let (stopped, _) = d.generate_turns(&prompts[..1], &g, &|_| {}).unwrap();
        assert_eq!(stopped[0].stop, Stop::StopToken);
        assert_eq!(stopped[0].tokens, alone[0].tokens[..=first]);
    }

    #[test]
    fn an_empty_prompt_and_an_oversized_turn_are_refused() {
        let m = model("shakespeare-bf16");
        let d = &m.decoder;
        assert!(d.prefill(&[], DecoderCache::default()).is_err());
        let state = d.prefill(&[1, 2, 3], DecoderCache::default()).unwrap();
        let g = Greedy {
            max_new_tokens: MAX_NEW_TOKENS + 1,
            stops: vec![],
            used: d.config.vocab,
        };
        assert!(d.generate(&state, &g).is_err());
    }
}
