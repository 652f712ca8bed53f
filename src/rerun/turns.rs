//! Tool calls, not only tokens: every assistant turn of a conversation eval text generated
//! greedily by the reference and by each candidate (teacher-forced history, free-running turn),
//! so a study can say whether a quantization breaks tool calls and whether the model recovers.
//!
//! The plan ([`plan`]) is the conversation file's assistant turns as prompts (each history
//! rendered by the model's own template with the generation prompt), the stop tokens and the
//! tools each conversation declares; [`generate`] runs one model over every prompt, sharing the
//! prefill of prompts that extend each other.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::conversation::calls::{self, CallCheck, CallFormat, Tools, TurnCalls};
use crate::conversation::eval::TokenizerContext;
use crate::conversation::file::{self, Conversation};
use crate::conversation::template::ChatTemplate;
pub use crate::conversation::turns::Decoding;
use crate::conversation::turns::{self, TurnPrompt, TurnSelection};
use crate::error::{Error, Result};
use crate::kld::turns::{Decision, TurnPair, Validity};
use crate::runner::native::NativeModel;
use crate::runner::native::generate::{Generated, GenerationTiming, Greedy, MAX_NEW_TOKENS, Stop};
use crate::runner::tokens::{ChatTemplateChoice, TokenizerFile, chat_template};

/// How turns are generated: part of the protocol, disclosed with the numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TurnProtocol {
    /// Which assistant turns.
    pub turns: TurnSelection,
    /// Greedy decoding: argmax with top-1's tie rule (the first index of the maximum).
    pub decoding: Decoding,
    /// Tokens generated at most per turn, the stop token included.
    pub max_new_tokens: usize,
}

/// The default `max_new_tokens`: room for a reasoning preamble and a call with its arguments.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 512;

impl TurnProtocol {
    /// `max_new_tokens` in 1..=[`MAX_NEW_TOKENS`], before any work.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !(1..=MAX_NEW_TOKENS).contains(&self.max_new_tokens) {
            return Err(format!(
                "max_new_tokens {} is outside 1..={MAX_NEW_TOKENS}",
                self.max_new_tokens
            ));
        }
        Ok(())
    }
}

/// The turns to generate and what judging them needs.
pub struct TurnPlan {
    /// The conversation file.
    pub text_path: std::path::PathBuf,
    pub prompts: Vec<TurnPrompt>,
    /// Token ids a turn stops at.
    pub stops: Vec<u32>,
    /// The conversations as read (their `tools` declarations judge the calls).
    pub conversations: Vec<Conversation>,
    /// The template's text (its family decides how calls are written).
    pub template_text: String,
}

/// The plan for the conversation file `text_path`, rendered with the template `choice` names
/// and tokenized with `tokenizer`, as the scored token stream was.
pub fn plan(
    tokenizer: &TokenizerFile,
    text_path: &Path,
    choice: &ChatTemplateChoice,
    reference: &Path,
    candidate: &Path,
    protocol: &TurnProtocol,
) -> Result<TurnPlan> {
    protocol
        .check()
        .map_err(|e| Error::usage(text_path, format!("--max-new-tokens: {e}")))?;
    if !crate::conversation::eval::is_conversation_file(text_path) {
        return Err(Error::usage(
            text_path,
            "turns are generated from a conversation file (.json or .jsonl); this eval text is plain text",
        ));
    }
    let conversations = file::read(text_path)?;
    let template = chat_template(choice, text_path, reference, candidate)?;
    let clock = choice
        .clock
        .unwrap_or(crate::conversation::eval::DEFAULT_CLOCK);
    let compiled_from =
        ChatTemplate::named(&template.text, clock, &template.file.display().to_string())
            .map_err(|e| Error::format(&template.file, template.name.as_deref(), e))?;
    let compiled = compiled_from
        .compiled()
        .map_err(|e| Error::format(&template.file, template.name.as_deref(), e))?;
    let dir = tokenizer.path.parent().unwrap_or(Path::new("."));
    let context = TokenizerContext::read(dir, &tokenizer.tokenizer)?;
    let prompts = turns::turn_prompts(
        &conversations,
        &compiled,
        &context,
        &tokenizer.tokenizer,
        protocol.turns,
    )
    .map_err(|e| Error::format(text_path, None, e))?;
    if prompts.is_empty() {
        return Err(Error::usage(
            text_path,
            match protocol.turns {
                TurnSelection::All => "holds no assistant turn to generate",
                TurnSelection::ToolCalls => "holds no assistant turn that calls a tool",
            },
        ));
    }
    let stops = turns::stop_ids(&context, &tokenizer.tokenizer);
    if stops.is_empty() {
        return Err(Error::usage(
            &tokenizer.path,
            "names no end-of-turn token the tokenizer knows (generation_config.json's eos_token_id, tokenizer_config.json's eos_token), so a generated turn could not end",
        ));
    }
    Ok(TurnPlan {
        text_path: text_path.to_owned(),
        prompts,
        stops,
        conversations,
        template_text: template.text,
    })
}

/// Every turn of `plan` generated by `model`, greedily, over the first `used` entries of each
/// logit row; `progress(done, total)` after each turn. Returns the turns and where the time
/// went.
pub fn generate(
    model: &NativeModel,
    plan: &TurnPlan,
    protocol: &TurnProtocol,
    used: usize,
    progress: &dyn Fn(usize, usize),
) -> Result<(Vec<Generated>, GenerationTiming)> {
    let greedy = greedy(plan, protocol, used);
    let prompts = plan.prompt_ids();
    let total = prompts.len();
    let generated = model
        .decoder
        .generate_turns(&prompts, &greedy, &|done| progress(done, total))
        .map_err(|e| Error::internal(&model.path, format!("generating turns: {e}")))?;
    model.check_unchanged()?;
    Ok(generated)
}

/// How every turn of `plan` is generated: `protocol`'s budget, the plan's stop ids, the first
/// `used` entries of each logit row.
pub fn greedy(plan: &TurnPlan, protocol: &TurnProtocol, used: usize) -> Greedy {
    Greedy {
        max_new_tokens: protocol.max_new_tokens,
        stops: plan.stops.clone(),
        used,
    }
}

impl TurnPlan {
    /// Each turn's prompt token ids, in order.
    pub fn prompt_ids(&self) -> Vec<&[u32]> {
        self.prompts.iter().map(|p| p.prompt.as_slice()).collect()
    }
}

/// One model's generated turn as judged: its text (the stop token left out), how it ended,
/// and the calls it makes in the template's family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JudgedTurn {
    pub tokens: usize,
    /// The generated token ids, the stop token included (what another engine's greedy
    /// generation is compared with, token for token).
    pub ids: Vec<u32>,
    pub stop: Stop,
    /// The turn's text, capped at [`MAX_SHOWN_BYTES`] (cut at a character boundary).
    pub text: String,
    pub calls: TurnCalls,
    /// Each call checked against the conversation's `tools`.
    pub checks: Vec<CallCheck>,
}

/// The most bytes of a turn's text a record keeps (enough to show a call and what went wrong).
pub const MAX_SHOWN_BYTES: usize = 4 << 10;

/// Judge one model's turns of `plan`: decode (special tokens kept: call markup is often one),
/// parse the calls in `format`'s family (`None`: the template writes no call cardproof reads,
/// so every turn is no call), check them against each conversation's tools.
pub fn judge(
    plan: &TurnPlan,
    generated: &[Generated],
    tokenizer: &tokenizers::Tokenizer,
    format: Option<CallFormat>,
) -> std::result::Result<Vec<JudgedTurn>, String> {
    let tools = plan
        .conversations
        .iter()
        .enumerate()
        .map(|(i, c)| {
            Tools::from_declarations(c.tools.as_ref().unwrap_or(&serde_json::Value::Null))
                .map_err(|e| format!("conversation {}: tools: {e}", i + 1))
        })
        .collect::<std::result::Result<Vec<_>, String>>()?;
    plan.prompts
        .iter()
        .zip(generated)
        .map(|(prompt, g)| {
            let body: &[u32] = match (g.stop, g.tokens.split_last()) {
                (Stop::StopToken, Some((_, body))) => body,
                _ => &g.tokens,
            };
            let text = tokenizer
                .decode(body, false)
                .map_err(|e| format!("decoding a generated turn: {e}"))?;
            let calls = format.map_or(TurnCalls::NoCall, |f| calls::parse(f, &text));
            let tools = &tools[prompt.conversation as usize];
            let checks = calls
                .calls()
                .iter()
                .map(|c| calls::check(c, tools))
                .collect();
            Ok(JudgedTurn {
                tokens: g.tokens.len(),
                ids: g.tokens.clone(),
                stop: g.stop,
                text: capped(&text, MAX_SHOWN_BYTES),
                calls,
                checks,
            })
        })
        .collect()
}

/// The reference's and a candidate's turns paired for the statistics.
pub fn pairs(
    plan: &TurnPlan,
    reference: (&[Generated], &[JudgedTurn]),
    candidate: (&[Generated], &[JudgedTurn]),
) -> Vec<TurnPair> {
    plan.prompts
        .iter()
        .zip(reference.0.iter().zip(reference.1))
        .zip(candidate.0.iter().zip(candidate.1))
        .map(|((prompt, (rg, rj)), (cg, cj))| {
            let decision = |j: &JudgedTurn| match j.calls.calls().len() {
                0 => Decision::NoCall,
                n => Decision::Calls(n),
            };
            let calls_match = match (rj.calls.parsed(), cj.calls.parsed()) {
                (Some(a), Some(b)) if !a.is_empty() => {
                    let a: Vec<_> = a.into_iter().cloned().collect();
                    let b: Vec<_> = b.into_iter().cloned().collect();
                    calls::same_calls(&a, &b)
                }
                _ => false,
            };
            TurnPair {
                conversation: prompt.conversation,
                turn: prompt.message,
                reference_tokens: rg.tokens.clone(),
                candidate_tokens: cg.tokens.clone(),
                reference_calls: decision(rj),
                candidate_calls: decision(cj),
                calls_match,
                candidate_valid: cj.checks.iter().map(validity).collect(),
            }
        })
        .collect()
}

fn validity(check: &CallCheck) -> Validity {
    match check {
        CallCheck::Valid => Validity::Valid,
        CallCheck::InvalidJson => Validity::InvalidJson,
        CallCheck::UnknownName => Validity::UnknownName,
        CallCheck::SchemaMismatch { .. } => Validity::SchemaMismatch,
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
fn capped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What generating and judging turns needs for a whole rerun, built once before any model
/// runs: the protocol, the plan, the tokenizer that decodes the turns, the logit entries that
/// are tokens, and the template's call family.
pub struct TurnWork {
    pub protocol: TurnProtocol,
    pub plan: TurnPlan,
    pub tokenizer: tokenizers::Tokenizer,
    pub used: usize,
    pub format: Option<CallFormat>,
    /// The conversation file, where it is not the eval text (`--turns-conversation`).
    pub conversation: Option<ConversationFile>,
}

/// The conversation file the turns came from, where it is not the eval text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ConversationFile {
    pub path: String,
    pub sha256: String,
}

impl TurnWork {
    /// The work for `protocol`, the conversation file `text_path` rendered as the scored stream
    /// was (`choice`, the reference's and candidate's paths) with `tokenizer`.
    pub fn new(
        protocol: TurnProtocol,
        tokenizer: &TokenizerFile,
        text_path: &Path,
        choice: &ChatTemplateChoice,
        models: (&Path, &Path),
    ) -> Result<TurnWork> {
        let plan = plan(tokenizer, text_path, choice, models.0, models.1, &protocol)?;
        let format = calls::format_of(&plan.template_text);
        Ok(TurnWork {
            protocol,
            plan,
            tokenizer: tokenizer.tokenizer.clone(),
            used: tokenizer.vocab_size,
            format,
            conversation: None,
        })
    }

    /// Every turn generated by `model`, and where the time went; `progress(done, total)`
    /// after each.
    pub fn generate(
        &self,
        model: &NativeModel,
        progress: &dyn Fn(usize, usize),
    ) -> Result<(Vec<Generated>, GenerationTiming)> {
        generate(model, &self.plan, &self.protocol, self.used, progress)
    }

    /// How every turn is generated (budget, stop ids, the tokenizer's entries).
    pub fn greedy(&self) -> Greedy {
        greedy(&self.plan, &self.protocol, self.used)
    }

    /// One model's turns judged (decoded, calls read and checked).
    fn judge(&self, generated: &[Generated], at: &Path) -> Result<Vec<JudgedTurn>> {
        judge(&self.plan, generated, &self.tokenizer, self.format)
            .map_err(|e| Error::format(at, None, e))
    }

    /// The reference's turns (and where their time went, where known), judged once for every
    /// arm of the run.
    pub fn reference(
        &self,
        generated: Vec<Generated>,
        timing: Option<GenerationTiming>,
        at: &Path,
    ) -> Result<ReferenceTurns> {
        let judged = self.judge(&generated, at)?;
        Ok(ReferenceTurns {
            generated,
            judged,
            timing,
        })
    }

    /// The record of a candidate's turns against the reference's: the candidate's judged,
    /// both paired and summarized with `bootstrap`.
    pub fn record(
        &self,
        reference: &ReferenceTurns,
        (candidate, candidate_timing): (&[Generated], Option<GenerationTiming>),
        bootstrap: &crate::kld::protocol::Bootstrap,
        at: &Path,
    ) -> Result<TurnsRecord> {
        let timings =
            (reference.timing.is_some() || candidate_timing.is_some()).then_some(TurnTimings {
                reference: reference.timing,
                candidate: candidate_timing,
            });
        let cj = self.judge(candidate, at)?;
        let (reference, rj) = (&reference.generated[..], reference.judged.clone());
        let pairs = pairs(&self.plan, (reference, &rj), (candidate, &cj));
        let summary = crate::kld::turns::summarize(&pairs, bootstrap)
            .map_err(|e| Error::internal(at, format!("the turns' statistics: {e}")))?;
        let turns = self
            .plan
            .prompts
            .iter()
            .zip(rj.into_iter().zip(cj))
            .zip(&pairs)
            .map(|((p, (reference, candidate)), pair)| TurnRecord {
                conversation: p.conversation,
                message: p.message,
                prompt_tokens: p.prompt.len(),
                first_divergence: crate::kld::turns::first_divergence(
                    &pair.reference_tokens,
                    &pair.candidate_tokens,
                ),
                reference,
                candidate,
            })
            .collect();
        Ok(TurnsRecord {
            protocol: self.protocol,
            generated_by: None,
            conversation: self.conversation.clone(),
            call_format: self.format,
            stop_ids: self.plan.stops.clone(),
            summary,
            turns,
            definitions: crate::kld::turns::definitions(),
            timings,
            pairs,
        })
    }
}

/// The reference's generated turns and their judgement, shared by every arm.
pub struct ReferenceTurns {
    generated: Vec<Generated>,
    judged: Vec<JudgedTurn>,
    timing: Option<GenerationTiming>,
}

/// Where each model's generation time went (seconds vary from run to run; they are not part of
/// the measurement's numbers).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TurnTimings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<GenerationTiming>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<GenerationTiming>,
}

/// The turns of one arm in measurement.json: how they were generated, the statistics, and
/// every turn of both models.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TurnsRecord {
    pub protocol: TurnProtocol,
    /// The engine that generated both models' turns, where not cardproof's native decoder
    /// (absent: the native runner, which the environment describes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_by: Option<TurnsGeneratedBy>,
    /// The conversation file the turns came from, where it is not the eval text (the
    /// llama.cpp runner's, whose eval text is plain text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationFile>,
    /// The template family the calls were read in (`null`: the template writes no call
    /// cardproof reads, so every turn counts as no call).
    pub call_format: Option<CallFormat>,
    /// The token ids a turn stopped at.
    pub stop_ids: Vec<u32>,
    pub summary: crate::kld::turns::TurnSummary,
    pub turns: Vec<TurnRecord>,
    /// Every statistic of `summary`, defined.
    pub definitions: serde_json::Value,
    /// Where each model's generation time went (prefill and decode), where the runner measured
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<TurnTimings>,
    /// The turns as the statistics read them (token ids included), for comparing arms on the
    /// same turns; not written.
    #[serde(skip)]
    #[schemars(skip)]
    pub pairs: Vec<TurnPair>,
}

/// Turns generated by another engine than the native runner: which, and how each model ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TurnsGeneratedBy {
    /// `transformers`: the runner program on the user's device, after scoring, with the model
    /// objects, attention and KV-cache scheme of the measurement.
    pub runner: crate::rerun::document::RunnerKind,
    pub reference: crate::runner::exchange::TurnEngine,
    pub candidate: crate::runner::exchange::TurnEngine,
}

/// One assistant turn as both models generated it.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TurnRecord {
    pub conversation: u32,
    /// The assistant message of the conversation the turn stands for.
    pub message: u32,
    pub prompt_tokens: usize,
    /// The first token index where the two turns differ (`null`: equal).
    pub first_divergence: Option<usize>,
    pub reference: JudgedTurn,
    pub candidate: JudgedTurn,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::native::{ComputeDtype, Emulate, StateDtype, load};

    fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    fn example_plan(turns: TurnSelection) -> Result<TurnPlan> {
        let model = root().join("examples/models/shakespeare-bf16");
        let tokenizer = crate::runner::tokens::load_tokenizer(&model.join("tokenizer.json"))?;
        let choice = ChatTemplateChoice {
            from: crate::conversation::eval::TemplateFrom::File,
            file: Some(root().join("examples/data/chat_template.jinja")),
            ..ChatTemplateChoice::default()
        };
        plan(
            &tokenizer,
            &root().join("examples/data/tool-conversation.json"),
            &choice,
            &model,
            &model,
            &TurnProtocol {
                turns,
                decoding: Decoding::Greedy,
                max_new_tokens: 16,
            },
        )
    }

    /// The example conversation's turns, generated by the example model: one prefill serves
    /// the nested prompts, each turn ends at a stop token or 16 tokens, and a model against
    /// itself generates the same turns (the repeat control is exact in this lane).
    #[test]
    fn the_example_conversations_turns_generate_and_repeat_exactly() {
        let plan = example_plan(TurnSelection::All).unwrap();
        assert!(!plan.stops.is_empty());
        let model = load(
            &root().join("examples/models/shakespeare-bf16"),
            ComputeDtype::F32,
            Emulate::ReferenceSemantics,
            StateDtype::F32,
        )
        .unwrap();
        let protocol = TurnProtocol {
            turns: TurnSelection::All,
            decoding: Decoding::Greedy,
            max_new_tokens: 16,
        };
        let used = model.decoder.config.vocab;
        let (a, _) = generate(&model, &plan, &protocol, used, &|_, _| {}).unwrap();
        assert_eq!(a.len(), plan.prompts.len());
        // Again, the first two turns alone: the same tokens.
        let first_two = TurnPlan {
            prompts: plan.prompts[..2].to_vec(),
            ..plan
        };
        let (b, _) = generate(&model, &first_two, &protocol, used, &|_, _| {}).unwrap();
        assert_eq!(a[..2], b[..]);
        assert!(
            a.iter()
                .all(|g| !g.tokens.is_empty() && g.tokens.len() <= 16)
        );
    }

    #[test]
    fn plain_text_and_a_zero_budget_are_refused() {
        let model = root().join("examples/models/shakespeare-bf16");
        let tokenizer =
            crate::runner::tokens::load_tokenizer(&model.join("tokenizer.json")).unwrap();
        let protocol = TurnProtocol {
            turns: TurnSelection::All,
            decoding: Decoding::Greedy,
            max_new_tokens: 16,
        };
        let e = plan(
            &tokenizer,
            &root().join("examples/data/eval.txt"),
            &ChatTemplateChoice::default(),
            &model,
            &model,
            &protocol,
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("conversation file"), "{e}");
        let e = plan(
            &tokenizer,
            &root().join("examples/data/tool-conversation.json"),
            &ChatTemplateChoice::default(),
            &model,
            &model,
            &TurnProtocol {
                max_new_tokens: 0,
                ..protocol
            },
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("max_new_tokens 0"), "{e}");
    }
}

/// One turn metric as cards and reports show it: its value (null when undefined on these
/// turns), the counts behind it in words, and its interval.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnMetricRow {
    pub metric: &'static str,
    pub value: Option<f64>,
    pub counts: String,
    pub ci95: Option<[f64; 2]>,
}

impl TurnsRecord {
    /// The four turn metrics, in the vocabulary's order, with their counts.
    pub fn metric_rows(&self) -> Vec<TurnMetricRow> {
        let s = &self.summary;
        let (f1, v) = (&s.tool_call_f1, &s.tool_call_valid);
        let finite = |u: &crate::kld::stats::Uncertainty| {
            u.ci95.iter().all(|x| x.is_finite()).then_some(u.ci95)
        };
        vec![
            TurnMetricRow {
                metric: "tool_call_f1",
                value: Some(f1.value),
                counts: format!("tp {} fp {} fn {} tn {}", f1.tp, f1.fp, f1.fn_, f1.tn),
                ci95: finite(&f1.uncertainty),
            },
            TurnMetricRow {
                metric: "tool_call_valid",
                value: v.value,
                counts: format!(
                    "{} of {} calls (invalid JSON {}, unknown name {}, schema mismatch {})",
                    v.valid, v.calls, v.invalid_json, v.unknown_name, v.schema_mismatch
                ),
                ci95: finite(&v.uncertainty),
            },
            TurnMetricRow {
                metric: "tool_call_match",
                value: s.tool_call_match.value,
                counts: format!(
                    "{} of {} calling turns",
                    s.tool_call_match.hits, s.tool_call_match.of
                ),
                ci95: finite(&s.tool_call_match.uncertainty),
            },
            TurnMetricRow {
                metric: "turn_match",
                value: s.turn_match.value,
                counts: format!("{} of {} turns", s.turn_match.hits, s.turn_match.of),
                ci95: finite(&s.turn_match.uncertainty),
            },
        ]
    }

    /// The template's call family by its recorded name (`qwen3_coder`), or `none found`.
    pub fn call_format_name(&self) -> String {
        self.call_format
            .and_then(|f| serde_json::to_value(f).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| "none found".into())
    }
}
