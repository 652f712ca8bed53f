//! A conversation file as an eval text: every conversation rendered with the chat template as
//! transformers renders it, labelled ([`super::spans`]), tokenized as `apply_chat_template(...,
//! tokenize=True)` tokenizes it (special tokens in the text parsed as control tokens, none
//! added), and the token streams concatenated in file order, each token carrying its
//! [`TokenLabel`].
//!
//! What a card discloses of it is the [`ConversationRecord`]: the file's digest, the template's
//! source and digest, the kwargs, the clock `strftime_now` read, the rendered text's digest, and
//! how many tokens each segment and role holds.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::file::{self, Conversation};
use super::source::TemplateSource;
use super::spans::{self, Labelled, Role, Segment, TurnMarkers};
use super::template::ChatTemplate;
use crate::digest::hex;
use crate::error::{Error, Result};

/// The clock `strftime_now` reads unless a run names another: 2026-01-01 00:00:00 UTC. A render
/// must not depend on the day it runs, so the date is an input, recorded with the render.
pub const DEFAULT_CLOCK: i64 = 1_767_225_600;

/// What one token of a conversation eval text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenLabel {
    /// The conversation (index in the file).
    pub conversation: u32,
    /// The message (index in its conversation); `None` for the generation prompt.
    pub message: Option<u32>,
    pub role: Option<Role>,
    pub segment: Segment,
}

/// Where the template was taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TemplateFrom {
    /// The reference model's directory (`chat_template.jinja` or `tokenizer_config.json`).
    Reference,
    /// The candidate's: quant repositories sometimes ship a patched template.
    Candidate,
    /// A file named with `--chat-template`.
    File,
}

impl TemplateFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateFrom::Reference => "reference",
            TemplateFrom::Candidate => "candidate",
            TemplateFrom::File => "file",
        }
    }
}

/// The template a conversation eval text was rendered with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TemplateRecord {
    pub from: TemplateFrom,
    /// The file it was read from, as given.
    pub path: String,
    /// The name within a `tokenizer_config.json` list of templates, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// SHA-256 of the template's text.
    pub sha256: String,
}

/// How a conversation eval text was rendered and what it holds: what a card discloses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ConversationRecord {
    pub conversations: usize,
    pub messages: usize,
    pub template: TemplateRecord,
    /// Each distinct set of template kwargs the conversations carry (`enable_thinking`, ...),
    /// in file order.
    pub kwargs: Vec<Map<String, Value>>,
    /// Seconds since the epoch (UTC) that `strftime_now` read.
    pub clock: i64,
    /// The renderer and the semantics it follows.
    pub renderer: String,
    /// SHA-256 of the rendered text, every conversation's render concatenated in file order.
    pub rendered_sha256: String,
    /// Tokens per segment (`content`, `reasoning`, `tool_call`, `tool_result`, `scaffolding`).
    pub segment_tokens: BTreeMap<String, usize>,
    /// Tokens per role (`none`: the generation prompt).
    pub role_tokens: BTreeMap<String, usize>,
}

/// A conversation file tokenized, with each token's label.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub ids: Vec<u32>,
    pub labels: Vec<TokenLabel>,
    pub record: ConversationRecord,
}

/// What rendering needs from the tokenizer's directory: the special tokens a template sees, and
/// the tokens that end turns.
#[derive(Debug, Clone, Default)]
pub struct TokenizerContext {
    /// `bos_token`, `eos_token`, ... as transformers hands them to every template.
    pub special: Map<String, Value>,
    pub markers: TurnMarkers,
}

impl TokenizerContext {
    /// From the directory holding `tokenizer.json`: `tokenizer_config.json` (special tokens,
    /// `eos_token`) and `generation_config.json` (`eos_token_id`, an id or a list), and the
    /// tokenizer's added tokens marked special.
    pub fn read(dir: &Path, tokenizer: &tokenizers::Tokenizer) -> Result<TokenizerContext> {
        let config = crate::files::read_config_if_present(&dir.join("tokenizer_config.json"))?
            .unwrap_or(Value::Null);
        let special = super::special_tokens(&config);
        let mut stops: Vec<String> = Vec::new();
        if let Some(Value::String(eos)) = special.get("eos_token") {
            stops.push(eos.clone());
        }
        let generation = dir.join("generation_config.json");
        if let Some(g) = crate::files::read_config_if_present(&generation)? {
            let ids: Vec<&Value> = match &g["eos_token_id"] {
                Value::Array(list) => list.iter().collect(),
                Value::Null => Vec::new(),
                one => vec![one],
            };
            for id in ids {
                let token = id
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
                    .and_then(|i| tokenizer.id_to_token(i))
                    .ok_or_else(|| {
                        Error::format(
                            &generation,
                            Some("eos_token_id"),
                            format!("{id} is not a token id of the tokenizer"),
                        )
                    })?;
                stops.push(token);
            }
        }
        stops.sort();
        stops.dedup();
        let mut specials: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !stops.contains(&t.content))
            .map(|t| t.content)
            .collect();
        specials.sort();
        Ok(TokenizerContext {
            special,
            markers: TurnMarkers { stops, specials },
        })
    }
}

/// The most bytes all the conversations of one file may render to together (one token stream,
/// as large as the file itself may be): with each conversation's own
/// [`spans::MAX_RENDER_BYTES`], this bounds the work and memory of labelling and tokenizing a
/// file, whatever its template writes per message.
pub const MAX_RENDERED_FILE_BYTES: usize = 256 << 20;

/// What is left of a file's [`MAX_RENDERED_FILE_BYTES`].
struct RenderBudget {
    spent: usize,
    limit: usize,
}

impl RenderBudget {
    /// Spends one conversation's render; over the limit, the error names the file and the
    /// conversation that crossed it.
    fn spend(&mut self, bytes: usize, path: &Path, at: &str) -> Result<()> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent <= self.limit {
            return Ok(());
        }
        Err(Error::format(
            path,
            Some(at),
            format!(
                "the conversations up to this one render to {} bytes, over the {} MiB the conversations of one file may render to (the work of labelling and tokenizing them grows with it); split the file",
                self.spent,
                self.limit >> 20
            ),
        ))
    }
}

/// A conversation of at least this many messages shows each step of its labelling as progress.
pub const LONG_CONVERSATION: usize = 1_000;

/// Every conversation of `path` rendered with `template`, labelled and tokenized with
/// `tokenizer`. `progress` hears which conversation is being worked on: the first, one per
/// percent of the file, and each step of a long one ([`LONG_CONVERSATION`]), so a long file or
/// conversation never sits silent.
pub fn render_file(
    path: &Path,
    template: &TemplateSource,
    from: TemplateFrom,
    tokenizer: &tokenizers::Tokenizer,
    context: &TokenizerContext,
    clock: i64,
    progress: &dyn Fn(&str),
) -> Result<Rendered> {
    let conversations = file::read(path)?;
    // Render errors name the template's file (and its name in a tokenizer config) and line.
    let label = match &template.name {
        Some(name) => format!("{} (template `{name}`)", template.file.display()),
        None => template.file.display().to_string(),
    };
    let checked = ChatTemplate::named(&template.text, clock, &label)
        .map_err(|e| Error::format(&template.file, template.name.as_deref(), e))?;
    let compiled = checked
        .compiled()
        .map_err(|e| Error::format(&template.file, template.name.as_deref(), e))?;
    let mut ids = Vec::new();
    let mut labels = Vec::new();
    let mut rendered = Sha256::new();
    let mut budget = RenderBudget {
        spent: 0,
        limit: MAX_RENDERED_FILE_BYTES,
    };
    let mut kwargs: Vec<Map<String, Value>> = Vec::new();
    let n = conversations.len();
    for (i, c) in conversations.iter().enumerate() {
        let at = format!("conversation {}", i + 1);
        let long = c.messages.len() >= LONG_CONVERSATION;
        let step = |what: &str| progress(&format!("tokenizing conversation {}/{n}{what}", i + 1));
        if long {
            step(&format!(
                " ({} messages, {} tool calls): labelling",
                c.messages.len(),
                tool_calls(c)
            ));
        } else if i == 0 || 100 * i / n > 100 * (i - 1) / n {
            step("");
        }
        let labelled = spans::label_compiled(&compiled, c, &context.special, &context.markers)
            .map_err(|why| Error::format(path, Some(&at), why))?;
        budget.spend(labelled.text.len(), path, &at)?;
        if long {
            step(&format!(
                ": tokenizing its render ({} bytes)",
                labelled.text.len()
            ));
        }
        rendered.update(labelled.text.as_bytes());
        let encoding = tokenizer
            .encode(labelled.text.as_str(), false)
            .map_err(|e| {
                Error::tokenizer(
                    path,
                    Some(&at),
                    format!("tokenizing its render failed: {e}"),
                )
            })?;
        labels.extend(label_tokens(&labelled, encoding.get_offsets(), i as u32));
        ids.extend_from_slice(encoding.get_ids());
        if !kwargs.contains(&c.kwargs) {
            kwargs.push(c.kwargs.clone());
        }
    }
    let mut segment_tokens = BTreeMap::new();
    let mut role_tokens = BTreeMap::new();
    for l in &labels {
        *segment_tokens
            .entry(l.segment.as_str().to_owned())
            .or_insert(0) += 1;
        *role_tokens
            .entry(l.role.map_or("none", Role::as_str).to_owned())
            .or_insert(0) += 1;
    }
    let record = ConversationRecord {
        conversations: conversations.len(),
        messages: conversations.iter().map(|c| c.messages.len()).sum(),
        template: TemplateRecord {
            from,
            path: template.file.display().to_string(),
            name: template.name.clone(),
            sha256: template.sha256.clone(),
        },
        kwargs,
        clock,
        renderer: renderer(),
        rendered_sha256: hex(&rendered.finalize()),
        segment_tokens,
        role_tokens,
    };
    Ok(Rendered {
        ids,
        labels,
        record,
    })
}

/// How many tool calls a conversation's messages make.
fn tool_calls(c: &Conversation) -> usize {
    c.messages
        .iter()
        .filter_map(|m| m.get("tool_calls").and_then(Value::as_array))
        .map(Vec::len)
        .sum()
}

/// The renderer's name and the semantics it follows, recorded with every render.
pub fn renderer() -> String {
    format!(
        "cardproof {} (minijinja 3.1.0 parsing, jinja2's Python semantics, transformers apply_chat_template)",
        env!("CARGO_PKG_VERSION")
    )
}

/// Each token's label: the message and segment holding most of its bytes (ties: the earlier);
/// a token with no bytes (offsets empty) takes the label at its start.
pub fn label_tokens(
    labelled: &Labelled,
    offsets: &[(usize, usize)],
    conversation: u32,
) -> Vec<TokenLabel> {
    let ranges = &labelled.ranges;
    let mut first = 0usize;
    offsets
        .iter()
        .map(|&(start, end)| {
            while first + 1 < ranges.len() && ranges[first].end <= start {
                first += 1;
            }
            let mut best: Option<(usize, &spans::Range)> = None;
            for r in ranges[first..]
                .iter()
                .take_while(|r| r.start < end.max(start + 1))
            {
                let overlap = r.end.min(end.max(start + 1)) - r.start.max(start);
                if best.is_none_or(|(b, _)| overlap > b) {
                    best = Some((overlap, r));
                }
            }
            let r = best.map_or_else(
                || {
                    ranges.last().copied().unwrap_or(spans::Range {
                        start: 0,
                        end: 0,
                        message: None,
                        segment: Segment::Scaffolding,
                    })
                },
                |(_, r)| *r,
            );
            TokenLabel {
                conversation,
                message: r.message,
                role: r.message.map(|m| labelled.roles[m as usize]),
                segment: r.segment,
            }
        })
        .collect()
}

/// Whether an eval text is a conversation file: `.json` and `.jsonl` are, anything else is
/// plain text.
pub fn is_conversation_file(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("json" | "jsonl")
    )
}

/// `conversation`'s render and its ids with `tokenizer`, for checks against transformers.
pub fn render_one(
    template: &ChatTemplate,
    conversation: &Conversation,
    tokenizer: &tokenizers::Tokenizer,
    context: &TokenizerContext,
) -> std::result::Result<(Labelled, Vec<u32>, Vec<TokenLabel>), String> {
    let labelled = spans::label(template, conversation, &context.special, &context.markers)?;
    let encoding = tokenizer
        .encode(labelled.text.as_str(), false)
        .map_err(|e| e.to_string())?;
    let labels = label_tokens(&labelled, encoding.get_offsets(), 0);
    Ok((labelled, encoding.get_ids().to_vec(), labels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Regression (#41): a long conversation sat silent while it was labelled. `render_file`
    /// reports the first conversation, one per percent of the file, and both steps of a long
    /// one, and nothing else (a file of many short conversations does not flood the log).
    #[test]
    fn progress_names_the_first_conversation_each_percent_and_each_step_of_a_long_one() {
        let dir = tempfile::tempdir().unwrap();
        let short = json!({"messages": [{"role": "user", "content": "hi"}]});
        let mut long = vec![json!({"role": "user", "content": "go"})];
        for i in 0..LONG_CONVERSATION / 2 {
            long.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"function": {"name": "f", "arguments": {"i": i}}}
            ]}));
            long.push(json!({"role": "tool", "content": "ok"}));
        }
        let mut lines: Vec<String> = (0..250).map(|_| short.to_string()).collect();
        lines[124] = json!({"messages": long}).to_string();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, lines.join("\n")).unwrap();
        let template = dir.path().join("t.jinja");
        std::fs::write(
            &template,
            "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name }}{% endfor %}{{ m.content or '' }}\n{% endfor %}",
        )
        .unwrap();
        let tokenizer = tokenizers::Tokenizer::from_file(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/models/shakespeare-bf16/tokenizer.json"),
        )
        .unwrap();
        let heard = std::cell::RefCell::new(Vec::new());
        let rendered = render_file(
            &path,
            &TemplateSource::from_file(&template).unwrap(),
            TemplateFrom::File,
            &tokenizer,
            &TokenizerContext::default(),
            DEFAULT_CLOCK,
            &|line| heard.borrow_mut().push(line.to_owned()),
        )
        .unwrap();
        assert_eq!(rendered.record.conversations, 250);
        let heard = heard.into_inner();
        // 250 conversations: a percent is 2.5 of them, so 100 reports, and the long one's two
        // steps (it starts no percent).
        assert_eq!(heard.len(), 102, "{heard:#?}");
        assert_eq!(heard[0], "tokenizing conversation 1/250");
        assert_eq!(heard[1], "tokenizing conversation 4/250");
        let long = format!(
            "tokenizing conversation 125/250 ({} messages, {} tool calls)",
            LONG_CONVERSATION + 1,
            LONG_CONVERSATION / 2
        );
        let at = heard.iter().position(|l| l.starts_with(&long)).unwrap();
        assert_eq!(heard[at], format!("{long}: labelling"));
        assert_eq!(
            heard[at + 1],
            "tokenizing conversation 125/250: tokenizing its render (2503 bytes)"
        );
        assert_eq!(heard[101], "tokenizing conversation 249/250");
    }

    /// Regression (#41): the file's caps bounded its size, not its work; the renders of one
    /// file are capped in all, and the error names the file and the conversation that crossed
    /// the cap.
    #[test]
    fn a_file_rendering_past_its_budget_is_refused_at_the_conversation_that_crosses_it() {
        let mut budget = RenderBudget {
            spent: 0,
            limit: 3 << 20,
        };
        let path = Path::new("agents.jsonl");
        budget.spend(2 << 20, path, "conversation 1").unwrap();
        budget.spend(1 << 20, path, "conversation 2").unwrap();
        let e = budget.spend(1, path, "conversation 3").unwrap_err();
        assert!(e.is_format());
        assert_eq!(
            e.to_string(),
            "agents.jsonl: conversation 3: the conversations up to this one render to 3145729 bytes, over the 3 MiB the conversations of one file may render to (the work of labelling and tokenizing them grows with it); split the file"
        );
        assert_eq!(MAX_RENDERED_FILE_BYTES, 256 << 20);
    }
}
