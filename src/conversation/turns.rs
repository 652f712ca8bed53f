//! The assistant turns of a conversation file, as prompts to generate from: each turn's history
//! (every message before it, teacher-forced) rendered by the model's own template with the
//! generation prompt, as `apply_chat_template(messages[:i], add_generation_prompt=True)` renders
//! it, and tokenized as that render is (special tokens in the text are control tokens, none
//! added). The turn the conversation holds is kept beside it, for showing what was expected.

use serde_json::{Map, Value};

use super::eval::TokenizerContext;
use super::file::Conversation;
use super::template::Compiled;
use crate::kld::protocol::Role;

/// Which assistant turns are generated.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TurnSelection {
    /// Every assistant message.
    All,
    /// The assistant messages that call tools in the conversation.
    ToolCalls,
}

/// How a turn's tokens are chosen: the one decoding generation uses.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Decoding {
    /// The argmax at every step, with top-1 agreement's tie rule (the first index of the
    /// maximum).
    Greedy,
}

/// The most turns one run generates (each is a prefill continuation and a generation).
pub const MAX_TURNS: usize = 100_000;

/// One assistant turn to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnPrompt {
    /// The conversation (index in the file).
    pub conversation: u32,
    /// The assistant message (index in its conversation).
    pub message: u32,
    /// Its history rendered with the generation prompt, tokenized.
    pub prompt: Vec<u32>,
    /// Whether the conversation's own message calls tools.
    pub expects_call: bool,
}

/// Every selected assistant turn of `conversations`, in file order. Errors name the
/// conversation and message whose history does not render or tokenize.
pub fn turn_prompts(
    conversations: &[Conversation],
    template: &Compiled,
    context: &TokenizerContext,
    tokenizer: &tokenizers::Tokenizer,
    selection: TurnSelection,
) -> Result<Vec<TurnPrompt>, String> {
    let mut out = Vec::new();
    for (c, conversation) in conversations.iter().enumerate() {
        for (m, message) in conversation.messages.iter().enumerate() {
            if !is_assistant(message) {
                continue;
            }
            let expects_call = calls_tools(message);
            if selection == TurnSelection::ToolCalls && !expects_call {
                continue;
            }
            if out.len() == MAX_TURNS {
                return Err(format!(
                    "more than {MAX_TURNS} assistant turns to generate; select fewer"
                ));
            }
            let at = || format!("conversation {}, message {}", c + 1, m + 1);
            let history = Conversation {
                messages: conversation.messages[..m].to_vec(),
                tools: conversation.tools.clone(),
                add_generation_prompt: true,
                kwargs: conversation.kwargs.clone(),
            };
            let text = render(template, &history, &context.special)
                .map_err(|e| format!("{}: its history does not render: {e}", at()))?;
            let prompt = tokenizer
                .encode(text.as_str(), false)
                .map_err(|e| format!("{}: tokenizing its history failed: {e}", at()))?
                .get_ids()
                .to_vec();
            if prompt.is_empty() {
                return Err(format!("{}: its history renders to no token", at()));
            }
            out.push(TurnPrompt {
                conversation: c as u32,
                message: m as u32,
                prompt,
                expects_call,
            });
        }
    }
    Ok(out)
}

/// The token ids generation stops at: the tokenizer's end-of-turn tokens (`stops`, from the
/// generation config and the tokenizer config), those the tokenizer knows.
pub fn stop_ids(context: &TokenizerContext, tokenizer: &tokenizers::Tokenizer) -> Vec<u32> {
    let mut ids: Vec<u32> = context
        .markers
        .stops
        .iter()
        .filter_map(|s| tokenizer.token_to_id(s))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn render(
    template: &Compiled,
    conversation: &Conversation,
    special: &Map<String, Value>,
) -> Result<String, String> {
    super::render(template, conversation, special)
}

fn is_assistant(message: &Value) -> bool {
    message
        .get("role")
        .and_then(Value::as_str)
        .is_some_and(|r| Role::parse(r) == Some(Role::Assistant))
}

fn calls_tools(message: &Value) -> bool {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .is_some_and(|calls| !calls.is_empty())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::conversation::template::ChatTemplate;

    fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    /// The example tool conversation's assistant turns: each prompt is the history rendered
    /// with the generation prompt, so it ends with the template's assistant header and each
    /// later prompt extends the one before (one prefill serves them all).
    #[test]
    fn each_assistant_turn_is_its_history_with_the_generation_prompt() {
        let conversations =
            crate::conversation::file::read(&root().join("examples/data/tool-conversation.json"))
                .unwrap();
        let source =
            std::fs::read_to_string(root().join("examples/data/chat_template.jinja")).unwrap();
        let template = ChatTemplate::named(&source, 0, "chat_template.jinja").unwrap();
        let compiled = template.compiled().unwrap();
        let model = root().join("examples/models/shakespeare-bf16");
        let tokenizer = tokenizers::Tokenizer::from_file(model.join("tokenizer.json")).unwrap();
        let context = TokenizerContext::read(&model, &tokenizer).unwrap();
        let all = turn_prompts(
            &conversations,
            &compiled,
            &context,
            &tokenizer,
            TurnSelection::All,
        )
        .unwrap();
        let assistants = conversations[0]
            .messages
            .iter()
            .filter(|m| is_assistant(m))
            .count();
        assert_eq!(all.len(), assistants);
        assert!(
            all.windows(2)
                .all(|w| w[1].prompt.starts_with(&w[0].prompt))
        );
        let tail = &all[0].prompt[all[0].prompt.len() - 8..];
        let header = tokenizer.decode(tail, false).unwrap();
        assert!(header.ends_with("assistant\n"), "{header:?}");
        let calls = turn_prompts(
            &conversations,
            &compiled,
            &context,
            &tokenizer,
            TurnSelection::ToolCalls,
        )
        .unwrap();
        assert!(!calls.is_empty() && calls.len() < all.len());
        assert!(calls.iter().all(|t| t.expects_call));
    }
}
