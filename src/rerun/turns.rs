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

use crate::conversation::eval::TokenizerContext;
use crate::conversation::file::{self, Conversation};
use crate::conversation::template::ChatTemplate;
use crate::conversation::turns::{self, TurnPrompt, TurnSelection};
use crate::error::{Error, Result};
use crate::runner::native::NativeModel;
use crate::runner::native::generate::{Generated, Greedy, MAX_NEW_TOKENS};
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

/// The one decoding generation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decoding {
    Greedy,
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
        prompts,
        stops,
        conversations,
        template_text: template.text,
    })
}

/// Every turn of `plan` generated by `model`, greedily, over the first `used` entries of each
/// logit row; `progress(done, total)` after each turn.
pub fn generate(
    model: &NativeModel,
    plan: &TurnPlan,
    protocol: &TurnProtocol,
    used: usize,
    progress: &dyn Fn(usize, usize),
) -> Result<Vec<Generated>> {
    let greedy = Greedy {
        max_new_tokens: protocol.max_new_tokens,
        stops: plan.stops.clone(),
        used,
    };
    let prompts: Vec<&[u32]> = plan.prompts.iter().map(|p| p.prompt.as_slice()).collect();
    let total = prompts.len();
    let (generated, _) = model
        .decoder
        .generate_turns(&prompts, &greedy, &|done| progress(done, total))
        .map_err(|e| Error::internal(&model.path, format!("generating turns: {e}")))?;
    model.check_unchanged()?;
    Ok(generated)
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
        let a = generate(&model, &plan, &protocol, used, &|_, _| {}).unwrap();
        assert_eq!(a.len(), plan.prompts.len());
        // Again, the first two turns alone: the same tokens.
        let first_two = TurnPlan {
            prompts: plan.prompts[..2].to_vec(),
            ..plan
        };
        let b = generate(&model, &first_two, &protocol, used, &|_, _| {}).unwrap();
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
