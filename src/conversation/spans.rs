//! Which message, role and segment every byte of a rendered conversation belongs to, found from
//! the rendering itself (issue #19), never by pattern-matching the output.
//!
//! Renders of the same conversation with the same template decide it (two, four or six, however
//! many messages it has):
//!
//! 1. **Fields, by sentinels.** Every string the conversation gives the template for a message
//!    (content and its text parts, reasoning, each tool call's function name and the string
//!    leaves of its arguments) is wrapped in private-use sentinels that carry the field's id,
//!    around its non-blank core so `trim`/`strip` keep them; the template renders the wrapped
//!    conversation, and removing the sentinels must give the plain render byte for byte (a
//!    template that slices, measures or re-encodes a field is refused, naming the message and
//!    field). Where a sentinel pair lands, that field's bytes are.
//! 2. **Turns.** Bytes between fields are template scaffolding. Scaffolding between two fields of
//!    one message is that message's; between two messages it is split after the first token
//!    generation stops at (the model's EOS tokens: `<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`,
//!    `<｜end▁of▁sentence｜>`, `</s>`), or failing one, after the first special (control) token
//!    (Mistral's `[/INST]`): up to and including it, the earlier message's, after it the later
//!    one's (with neither, all the later one's). Before the first field: the first field's
//!    message; after the last field's turn end: no message (the generation prompt).
//! 3. **Tool calls, by difference.** The conversation is rendered again with the tool calls of
//!    every other assistant message that makes calls removed (the first, third, ...), and once
//!    more with those of the rest removed, each plain and marked: a constant number of renders,
//!    never one per message. The fields both renders hold, each placed once in each, are anchors
//!    that align the two (a message whose calls are kept anchors its neighbours by its call
//!    fields); between consecutive anchors the renders are compared, and each stretch where they
//!    differ (the minimal window between the stretch's common prefix and suffix) is the work of
//!    the message with removed calls it lies in (or, lying in none, of the closest one before
//!    it). A message's windows, from its first to its last and clipped to its own scaffolding,
//!    are its tool-call segment: `<tool_call>`, `<function=…>`, `[TOOL_CALLS]` and the JSON
//!    punctuation included, since the model generates those too. When the render without the
//!    calls fails, or one window holds the removed calls of two messages (nothing of theirs
//!    between to tell them apart), a message's segment runs from its first tool-call field to
//!    its last.
//!
//! The work is linear in the render: a conversation may render to at most [`MAX_RENDER_BYTES`]
//! and hold at most [`MAX_FIELDS`] strings.

use serde_json::{Map, Value};

use super::file::Conversation;
use super::template::{ChatTemplate, Compiled};

pub use crate::kld::protocol::{Role, Segment};

/// A run of bytes of the render with one owner and one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: usize,
    pub end: usize,
    /// The message (index into the conversation's messages) that owns the bytes; `None` after
    /// the last message's end-of-turn marker (the generation prompt).
    pub message: Option<u32>,
    pub segment: Segment,
}

/// A conversation rendered, with every byte labelled.
#[derive(Debug, Clone)]
pub struct Labelled {
    /// The render, exactly as `apply_chat_template(tokenize=False)` writes it.
    pub text: String,
    /// Contiguous, sorted ranges covering `text`.
    pub ranges: Vec<Range>,
    /// Each message's role.
    pub roles: Vec<Role>,
    /// Assistant messages whose tool-call segment came from their fields only (the render
    /// without tool calls failed, or could not tell their calls from another message's).
    pub tool_calls_from_fields: Vec<u32>,
    /// How many times the template rendered the conversation to label it: two, four when one
    /// message calls tools, six when more do, however many (the work stays linear in the render).
    pub renders: u32,
}

/// The most bytes one conversation may render to. Labelling renders it a constant number of
/// times and tokenizing reads it once, so this bounds one conversation's work and memory (a
/// render of 8 MiB peaks at about 1.5 GB, tokenizing included); a 100k-token agent conversation
/// with thousands of tool calls renders to about half a MiB.
pub const MAX_RENDER_BYTES: usize = 16 << 20;

/// The most strings of one conversation marked as fields (each carries its own sentinels and
/// record, made before the template renders them).
pub const MAX_FIELDS: usize = 1 << 20;

/// The sentinels: a field opens with `OPEN`, its id in hex digits `DIGIT0..`, `ID_END`, and
/// closes with `CLOSE`. All lie in Supplementary Private Use Area-A, which no template or
/// tokenizer gives meaning to; a conversation that holds any of them is refused.
const OPEN: char = '\u{F0000}';
const ID_END: char = '\u{F0001}';
const CLOSE: char = '\u{F0002}';
const DIGIT0: u32 = 0xF0010;
const SENTINELS: std::ops::RangeInclusive<char> = '\u{F0000}'..='\u{F001F}';

/// Whether `c` is one of the field markers (the `tojson` filter writes them raw even when asked
/// for ASCII, so a marked render strips back to the plain one).
pub(crate) fn is_marker(c: char) -> bool {
    SENTINELS.contains(&c)
}

/// One wrapped string of a message.
#[derive(Debug, Clone)]
struct Field {
    message: u32,
    segment: Segment,
    /// Where in the message it is, for errors (`content`, `tool_calls[0].function.name`).
    path: String,
}

/// The tokens that end a turn, from the tokenizer and the generation config.
#[derive(Debug, Clone, Default)]
pub struct TurnMarkers {
    /// Tokens generation stops at (`generation_config.json`'s `eos_token_id`, the tokenizer
    /// config's `eos_token`): an assistant's turn ends with one.
    pub stops: Vec<String>,
    /// The tokenizer's other special (control) tokens, for turns that end with none of the stops
    /// (Mistral's user turn ends at `[/INST]`).
    pub specials: Vec<String>,
}

impl TurnMarkers {
    /// Where the turn that `run` closes ends: after its first stop token, else after its first
    /// special token; `None` when it holds neither.
    fn turn_end(&self, run: &str) -> Option<usize> {
        first_end(run, &self.stops).or_else(|| first_end(run, &self.specials))
    }
}

/// The template, compiled once, and its special-token kwargs, counting its renders.
struct Renderer<'a> {
    template: &'a Compiled<'a>,
    special: &'a Map<String, Value>,
    count: std::cell::Cell<u32>,
}

impl Renderer<'_> {
    fn render(&self, conversation: &Conversation) -> Result<String, String> {
        self.count.set(self.count.get() + 1);
        super::render(self.template, conversation, self.special)
    }
}

/// Labels `conversation` as `template` renders it with `special` (the template's special-token
/// kwargs); `markers` end turns. The error says which message and field could not be placed,
/// and why, or which limit the conversation is over.
pub fn label(
    template: &ChatTemplate,
    conversation: &Conversation,
    special: &Map<String, Value>,
    markers: &TurnMarkers,
) -> Result<Labelled, String> {
    label_compiled(&template.compiled()?, conversation, special, markers)
}

/// [`label`] with a template compiled once for every conversation of a file.
pub fn label_compiled(
    template: &Compiled,
    conversation: &Conversation,
    special: &Map<String, Value>,
    markers: &TurnMarkers,
) -> Result<Labelled, String> {
    let renderer = Renderer {
        template,
        special,
        count: std::cell::Cell::new(0),
    };
    let placed = place(&renderer, conversation, markers)?;
    let roles: Vec<Role> = conversation
        .messages
        .iter()
        .map(|m| Role::of(m["role"].as_str().unwrap_or_default()))
        .collect();

    // 3. Tool calls.
    let mut ranges = placed.ranges;
    let calls: Vec<u32> = conversation
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m.get("tool_calls")
                .and_then(Value::as_array)
                .is_some_and(|c| !c.is_empty())
        })
        .map(|(k, _)| k as u32)
        .collect();
    // Every other message with calls loses them in one render, every other in another: each
    // keeps its neighbours' calls, whose fields then anchor it (parallel calls written as
    // consecutive assistant messages stay apart).
    let mut tool_calls_from_fields = Vec::new();
    if !calls.is_empty() {
        let from_fields = field_regions(&placed.owned, conversation.messages.len());
        let mut regions: Vec<Option<(usize, usize)>> = vec![None; conversation.messages.len()];
        for parity in [0, 1] {
            let class: Vec<u32> = calls.iter().skip(parity).step_by(2).copied().collect();
            if class.is_empty() {
                continue;
            }
            let found = tool_call_windows(
                &renderer,
                (conversation, &placed.wrapped),
                &class,
                (&placed.text, &placed.spans),
                placed.field_count,
                &ranges,
            );
            for (i, &k) in class.iter().enumerate() {
                regions[k as usize] = match found.as_ref().map(|f| f[i]) {
                    Some(Calls::Unchanged) => None,
                    Some(Calls::Window(start, end)) => Some((start, end)),
                    None | Some(Calls::Ambiguous) => {
                        tool_calls_from_fields.push(k);
                        from_fields[k as usize]
                    }
                };
            }
        }
        tool_calls_from_fields.sort_unstable();
        ranges = mark_tool_calls(ranges, &regions);
    }
    Ok(Labelled {
        text: placed.text,
        ranges,
        roles,
        tool_calls_from_fields,
        renders: renderer.count.get(),
    })
}

/// A conversation rendered with its fields placed and every byte given an owner (steps 1 and
/// 2), before the tool calls are found.
struct Placed {
    text: String,
    /// The conversation with its fields marked.
    wrapped: Conversation,
    field_count: usize,
    /// Where each field landed in `text`.
    spans: Vec<Span>,
    /// The non-empty spans with their message and segment, sorted.
    owned: Vec<(usize, usize, u32, Segment)>,
    ranges: Vec<Range>,
}

/// Steps 1 and 2: the plain render (within [`MAX_RENDER_BYTES`]), the marked render (within
/// [`MAX_FIELDS`]) that places the fields, and the turns.
fn place(
    renderer: &Renderer,
    conversation: &Conversation,
    markers: &TurnMarkers,
) -> Result<Placed, String> {
    let (template, special) = (renderer.template, renderer.special);
    let text = renderer.render(conversation)?;
    if text.len() > MAX_RENDER_BYTES {
        return Err(format!(
            "it renders to {} bytes, over the {} MiB one conversation may render to (the work of labelling and tokenizing it grows with its render); split it into shorter conversations",
            text.len(),
            MAX_RENDER_BYTES >> 20
        ));
    }
    if text.chars().any(|c| SENTINELS.contains(&c))
        || conversation
            .tools
            .as_ref()
            .is_some_and(|t| t.to_string().chars().any(|c| SENTINELS.contains(&c)))
    {
        return Err("the rendered conversation holds characters U+F0000..U+F001F, which cardproof uses to find each message's text; remove them".into());
    }

    // 1. Fields.
    let mut fields = Vec::new();
    let mut messages = Vec::with_capacity(conversation.messages.len());
    for (i, m) in conversation.messages.iter().enumerate() {
        messages.push(wrap_message(i as u32, m, &mut fields));
        if fields.len() > MAX_FIELDS {
            return Err(format!(
                "its messages hold more than {MAX_FIELDS} strings (by message {}), more than cardproof marks to label one conversation; split it into shorter conversations",
                i + 1
            ));
        }
    }
    let wrapped = Conversation {
        messages,
        ..conversation.clone()
    };
    let sentinel_text = renderer.render(&wrapped).map_err(|e| {
        format!(
            "the template renders the conversation but not with its messages' text marked ({e}); {}",
            culprit(template, conversation, special, &text)
        )
    })?;
    let spans = field_spans(&sentinel_text, &text, fields.len())
        .map_err(|why| format!("{why}; {}", culprit(template, conversation, special, &text)))?;
    drop(sentinel_text);
    let mut owned: Vec<(usize, usize, u32, Segment)> = spans
        .iter()
        .filter(|s| s.start < s.end)
        .map(|s| {
            let f = &fields[s.field];
            (s.start, s.end, f.message, f.segment)
        })
        .collect();
    owned.sort_by_key(|&(start, end, ..)| (start, end));

    // 2. Turns: every byte gets an owner and a segment.
    let ranges = turns(&text, &owned, markers);
    Ok(Placed {
        text,
        wrapped,
        field_count: fields.len(),
        spans,
        owned,
        ranges,
    })
}

/// Every byte of `text` given an owner and a segment from the placed fields (`owned`, sorted):
/// field bytes are their field's, scaffolding between two messages' fields is split at the turn
/// end `markers` find.
fn turns(text: &str, owned: &[(usize, usize, u32, Segment)], markers: &TurnMarkers) -> Vec<Range> {
    let mut ranges = Vec::new();
    let turn_end = |run: &str| markers.turn_end(run);
    let mut at = 0usize;
    let mut previous: Option<u32> = None;
    for &(start, end, message, segment) in owned {
        if start < at {
            // A field inside one already placed (a template that writes a string twice,
            // overlapping): the first placement stands.
            if end > at {
                ranges.push(Range {
                    start: at,
                    end,
                    message: Some(message),
                    segment,
                });
                at = end;
            }
            continue;
        }
        if start > at {
            let run = &text[at..start];
            match previous {
                Some(p) if p != message => {
                    let split = at + turn_end(run).unwrap_or(0);
                    push(&mut ranges, at, split, Some(p), Segment::Scaffolding);
                    push(
                        &mut ranges,
                        split,
                        start,
                        Some(message),
                        Segment::Scaffolding,
                    );
                }
                Some(p) => push(&mut ranges, at, start, Some(p), Segment::Scaffolding),
                None => push(&mut ranges, at, start, Some(message), Segment::Scaffolding),
            }
        }
        push(&mut ranges, start, end, Some(message), segment);
        at = end;
        previous = Some(message);
    }
    if at < text.len() {
        let run = &text[at..];
        let split = at + previous.map_or(0, |_| turn_end(run).unwrap_or(0));
        push(&mut ranges, at, split, previous, Segment::Scaffolding);
        push(&mut ranges, split, text.len(), None, Segment::Scaffolding);
    }
    ranges
}

/// What the render without tool calls says of one message's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Calls {
    /// Removing them changed nothing (a template that does not write them).
    Unchanged,
    /// The bytes from its first differing window to its last.
    Window(usize, usize),
    /// A differing window also holds another message's calls.
    Ambiguous,
}

/// For each message of `calls` (messages with tool calls), what differs where the conversation
/// is rendered without their tool calls; `None` when that render (plain or marked) fails.
/// `conversations` are the plain and the marked conversation, `rendered` the plain render and its
/// fields' spans, `ranges` its labels so far.
fn tool_call_windows(
    renderer: &Renderer,
    conversations: (&Conversation, &Conversation),
    calls: &[u32],
    rendered: (&str, &[Span]),
    field_count: usize,
    ranges: &[Range],
) -> Option<Vec<Calls>> {
    let other = renderer
        .render(&without_tool_calls(conversations.0, calls))
        .ok()?;
    let marked = renderer
        .render(&without_tool_calls(conversations.1, calls))
        .ok()?;
    let other_spans = field_spans(&marked, &other, field_count).ok()?;
    drop(marked);
    let (text, spans) = rendered;
    let windows = differing_windows(text, spans, &other, &other_spans, field_count);
    Some(attribute(&windows, calls, ranges))
}

/// `conversation` with the tool calls of the messages `calls` removed (the other keys keep their
/// order, for templates that write a message's keys in order).
fn without_tool_calls(conversation: &Conversation, calls: &[u32]) -> Conversation {
    let mut c = conversation.clone();
    for &k in calls {
        if let Some(m) = c.messages[k as usize].as_object_mut() {
            m.shift_remove("tool_calls");
        }
    }
    c
}

/// Which message of `calls` (those whose calls were removed) each differing window is the work
/// of: the one of them owning bytes in it (two or more: each is ambiguous), else the closest one
/// before it (a template may change the next message's header when the calls are gone); none
/// before it: no message's. Each message gets its windows' hull.
fn attribute(windows: &[(usize, usize)], calls: &[u32], ranges: &[Range]) -> Vec<Calls> {
    let mut index: Vec<Option<usize>> = Vec::new();
    for (i, &k) in calls.iter().enumerate() {
        let k = k as usize;
        if index.len() <= k {
            index.resize(k + 1, None);
        }
        index[k] = Some(i);
    }
    let call_of = |r: &Range| {
        r.message
            .and_then(|m| index.get(m as usize).copied().flatten())
    };
    // Where each message with calls begins in the render, in render order.
    let mut begins: Vec<(usize, usize)> = Vec::new();
    let mut seen = vec![false; calls.len()];
    for r in ranges {
        if let Some(i) = call_of(r)
            && !std::mem::replace(&mut seen[i], true)
        {
            begins.push((r.start, i));
        }
    }
    begins.sort_unstable();
    let mut out = vec![Calls::Unchanged; calls.len()];
    let mut owners: Vec<usize> = Vec::new();
    // The last window each message was counted an owner of (windows are disjoint and sorted, so
    // the whole pass visits each range about once).
    let mut counted = vec![usize::MAX; calls.len()];
    for (w, &(start, end)) in windows.iter().enumerate() {
        owners.clear();
        let first = ranges.partition_point(|r| r.end <= start);
        for r in ranges[first..].iter().take_while(|r| r.start < end) {
            if let Some(i) = call_of(r)
                && std::mem::replace(&mut counted[i], w) != w
            {
                owners.push(i);
            }
        }
        if owners.is_empty() {
            let before = begins.partition_point(|&(at, _)| at <= start);
            if before > 0 {
                owners.push(begins[before - 1].1);
            }
        }
        let ambiguous = owners.len() > 1;
        for &i in &owners {
            out[i] = match out[i] {
                _ if ambiguous => Calls::Ambiguous,
                Calls::Ambiguous => Calls::Ambiguous,
                Calls::Unchanged => Calls::Window(start, end),
                Calls::Window(a, b) => Calls::Window(a.min(start), b.max(end)),
            };
        }
    }
    out
}

/// Each message's span of tool-call fields (its first tool-call field's start to its last's
/// end), for messages whose calls the render without them does not place.
fn field_regions(
    owned: &[(usize, usize, u32, Segment)],
    messages: usize,
) -> Vec<Option<(usize, usize)>> {
    let mut regions: Vec<Option<(usize, usize)>> = vec![None; messages];
    for &(start, end, k, segment) in owned {
        if segment == Segment::ToolCall
            && let Some(region) = regions.get_mut(k as usize)
        {
            *region = Some((region.map_or(start, |r| r.0), end));
        }
    }
    regions
}

/// Appends a range, merged with the last one when they carry the same label.
fn push(ranges: &mut Vec<Range>, start: usize, end: usize, message: Option<u32>, segment: Segment) {
    if start >= end {
        return;
    }
    if let Some(last) = ranges.last_mut()
        && last.end == start
        && last.message == message
        && last.segment == segment
    {
        last.end = end;
        return;
    }
    ranges.push(Range {
        start,
        end,
        message,
        segment,
    });
}

/// Where the first of `tokens` in `run` ends, if it holds one (the leftmost, longest).
fn first_end(run: &str, tokens: &[String]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for s in tokens.iter().filter(|s| !s.is_empty()) {
        if let Some(i) = run.find(s.as_str()) {
            let candidate = (i, i + s.len());
            best = match best {
                Some(b) if b.0 < i || (b.0 == i && b.1 >= candidate.1) => Some(b),
                _ => Some(candidate),
            };
        }
    }
    best.map(|b| b.1)
}

/// Scaffolding bytes of each message `k` inside `regions[k]` become its tool-call segment;
/// fields keep theirs. One pass over the ranges.
fn mark_tool_calls(ranges: Vec<Range>, regions: &[Option<(usize, usize)>]) -> Vec<Range> {
    let mut out = Vec::with_capacity(ranges.len() + 2 * regions.len());
    for r in ranges {
        let region = r
            .message
            .filter(|_| r.segment == Segment::Scaffolding)
            .and_then(|k| regions.get(k as usize).copied().flatten());
        let Some((start, end)) = region else {
            push(&mut out, r.start, r.end, r.message, r.segment);
            continue;
        };
        let (a, b) = (r.start.max(start), r.end.min(end));
        if a >= b {
            push(&mut out, r.start, r.end, r.message, r.segment);
            continue;
        }
        push(&mut out, r.start, a, r.message, r.segment);
        push(&mut out, a, b, r.message, Segment::ToolCall);
        push(&mut out, b, r.end, r.message, r.segment);
    }
    out
}

/// Where `a` (with its fields at `a_spans`) differs from `b` (fields at `b_spans`): the two are
/// aligned at their anchors ([`anchors`]), and between each pair of consecutive sync points the
/// minimal differing window is taken, in `a`'s bytes. Linear in the texts.
fn differing_windows(
    a: &str,
    a_spans: &[Span],
    b: &str,
    b_spans: &[Span],
    field_count: usize,
) -> Vec<(usize, usize)> {
    let mut windows = Vec::new();
    let (mut pa, mut pb) = (0usize, 0usize);
    let sync = anchors(a_spans, b_spans, field_count)
        .into_iter()
        .flat_map(|(x, y)| [(x.start, y.start), (x.end, y.end)])
        .chain([(a.len(), b.len())]);
    for (qa, qb) in sync {
        let (x, y) = (&a[pa..qa], &b[pb..qb]);
        if x != y {
            let (start, end) = differing_window(x, y);
            windows.push((pa + start, pa + end));
        }
        (pa, pb) = (qa, qb);
    }
    windows
}

/// The fields placed exactly once in each render, in an order both renders agree on (the
/// longest such chain, found by patience sorting) and not overlapping: each is a point where
/// the two renders are known to correspond.
fn anchors<'s>(
    a_spans: &'s [Span],
    b_spans: &'s [Span],
    field_count: usize,
) -> Vec<(&'s Span, &'s Span)> {
    let once = |spans: &'s [Span]| {
        let mut at: Vec<Option<&'s Span>> = vec![None; field_count];
        let mut twice = vec![false; field_count];
        for s in spans {
            if at[s.field].replace(s).is_some() {
                twice[s.field] = true;
            }
        }
        for (slot, twice) in at.iter_mut().zip(twice) {
            if twice {
                *slot = None;
            }
        }
        at
    };
    let (in_a, in_b) = (once(a_spans), once(b_spans));
    let mut pairs: Vec<(&Span, &Span)> = in_a
        .into_iter()
        .zip(in_b)
        .filter_map(|(x, y)| x.zip(y))
        .collect();
    pairs.sort_unstable_by_key(|(x, _)| (x.start, x.end));
    // The longest chain strictly increasing in `b` too.
    let mut tails: Vec<usize> = Vec::new();
    let mut before: Vec<Option<usize>> = vec![None; pairs.len()];
    for (i, (_, y)) in pairs.iter().enumerate() {
        let at = tails.partition_point(|&t| pairs[t].1.start < y.start);
        before[i] = at.checked_sub(1).map(|p| tails[p]);
        if at == tails.len() {
            tails.push(i);
        } else {
            tails[at] = i;
        }
    }
    let mut chain = Vec::with_capacity(tails.len());
    let mut next = tails.last().copied();
    while let Some(i) = next {
        chain.push(pairs[i]);
        next = before[i];
    }
    chain.reverse();
    // Sync points must not go back in either render.
    let (mut end_a, mut end_b) = (0usize, 0usize);
    chain.retain(|(x, y)| {
        let keep = x.start >= end_a && y.start >= end_b;
        if keep {
            (end_a, end_b) = (x.end, y.end);
        }
        keep
    });
    chain
}

/// The smallest window of `a` outside which `a` and `b` agree (their common prefix and suffix),
/// widened to whole characters.
fn differing_window(a: &str, b: &str) -> (usize, usize) {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let prefix = x.iter().zip(y).take_while(|(p, q)| p == q).count();
    let room = x.len().min(y.len()) - prefix;
    let suffix = x
        .iter()
        .rev()
        .zip(y.iter().rev())
        .take(room)
        .take_while(|(p, q)| p == q)
        .count();
    let start = a.floor_char_boundary(prefix);
    let end = a.ceil_char_boundary(x.len() - suffix);
    (start, end.max(start))
}

/// A message with each of its strings wrapped in sentinels (fields recorded in `fields`).
fn wrap_message(message: u32, m: &Value, fields: &mut Vec<Field>) -> Value {
    let Some(object) = m.as_object() else {
        return m.clone();
    };
    let tool = Role::of(
        object
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    ) == Role::Tool;
    let content_segment = if tool {
        Segment::ToolResult
    } else {
        Segment::Content
    };
    let mut out = object.clone();
    let mut wrap = |value: &mut Value, segment: Segment, path: String| {
        if let Value::String(s) = value {
            *s = wrapped(s, fields.len());
            if s.chars().any(|c| c == OPEN) {
                fields.push(Field {
                    message,
                    segment,
                    path,
                });
            }
        }
    };
    if let Some(content) = out.get_mut("content") {
        match content {
            Value::Array(parts) => {
                for (i, part) in parts.iter_mut().enumerate() {
                    if let Some(text) = part.get_mut("text") {
                        wrap(text, content_segment, format!("content[{i}].text"));
                    }
                }
            }
            other => wrap(other, content_segment, "content".into()),
        }
    }
    for key in super::REASONING_FIELDS {
        if let Some(v) = out.get_mut(key) {
            wrap(v, Segment::Reasoning, key.into());
        }
    }
    if let Some(Value::Array(calls)) = out.get_mut("tool_calls") {
        for (i, call) in calls.iter_mut().enumerate() {
            // OpenAI's shape (`function: {name, arguments}`) or the flat one.
            let (prefix, target) = match call.get("function").is_some() {
                true => (
                    format!("tool_calls[{i}].function"),
                    call.get_mut("function"),
                ),
                false => (format!("tool_calls[{i}]"), Some(call)),
            };
            let Some(Value::Object(function)) = target else {
                continue;
            };
            if let Some(name) = function.get_mut("name") {
                wrap(name, Segment::ToolCall, format!("{prefix}.name"));
            }
            if let Some(arguments) = function.get_mut("arguments") {
                wrap_leaves(arguments, &format!("{prefix}.arguments"), &mut wrap);
            }
        }
    }
    Value::Object(out)
}

/// Every string leaf of an arguments value (or the value itself, a JSON string).
fn wrap_leaves(value: &mut Value, path: &str, wrap: &mut impl FnMut(&mut Value, Segment, String)) {
    match value {
        Value::String(_) => wrap(value, Segment::ToolCall, path.to_owned()),
        Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                wrap_leaves(v, &format!("{path}[{i}]"), wrap);
            }
        }
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                wrap_leaves(v, &format!("{path}.{k}"), wrap);
            }
        }
        _ => {}
    }
}

/// `s` with its non-blank core between sentinels for field `id` (blank strings stay as they are:
/// a template may test them for emptiness).
fn wrapped(s: &str, id: usize) -> String {
    let core = s.trim();
    if core.is_empty() {
        return s.to_owned();
    }
    let lead = &s[..s.len() - s.trim_start().len()];
    let trail = &s[s.trim_end().len()..];
    let mut out = String::with_capacity(s.len() + 16);
    out.push_str(lead);
    out.push(OPEN);
    for digit in format!("{id:x}").chars() {
        let d = digit.to_digit(16).expect("a hex digit");
        out.push(char::from_u32(DIGIT0 + d).expect("a private-use character"));
    }
    out.push(ID_END);
    out.push_str(core);
    out.push(CLOSE);
    out.push_str(trail);
    out
}

/// One placed field: its id and its bytes in the plain render.
struct Span {
    field: usize,
    start: usize,
    end: usize,
}

/// The fields' spans, in plain-render bytes, from the sentinel render; the sentinel render with
/// its sentinels removed must be the plain render, and every id one of the `field_count` fields.
fn field_spans(sentinel_text: &str, plain: &str, field_count: usize) -> Result<Vec<Span>, String> {
    let mut stripped = String::with_capacity(plain.len());
    let mut spans = Vec::new();
    let mut open: Vec<(usize, usize)> = Vec::new();
    let mut chars = sentinel_text.chars();
    while let Some(c) = chars.next() {
        match c {
            OPEN => {
                let mut id = 0usize;
                loop {
                    match chars.next() {
                        Some(ID_END) if id < field_count => break,
                        Some(ID_END) => {
                            return Err("a field marker was garbled by the template".into());
                        }
                        Some(d) if (DIGIT0..DIGIT0 + 16).contains(&(d as u32)) => {
                            id = id
                                .checked_mul(16)
                                .and_then(|i| i.checked_add((d as u32 - DIGIT0) as usize))
                                .ok_or("a field marker was garbled by the template")?;
                        }
                        _ => return Err("a field marker was cut by the template".into()),
                    }
                }
                open.push((id, stripped.len()));
            }
            CLOSE => {
                let (field, start) = open
                    .pop()
                    .ok_or("the template wrote the end of a field whose start it dropped")?;
                spans.push(Span {
                    field,
                    start,
                    end: stripped.len(),
                });
            }
            c if SENTINELS.contains(&c) => {
                return Err("a field marker was cut by the template".into());
            }
            c => stripped.push(c),
        }
    }
    if !open.is_empty() {
        return Err("the template wrote the start of a field and dropped its end".into());
    }
    if stripped != plain {
        let at = stripped
            .bytes()
            .zip(plain.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(stripped.len().min(plain.len()));
        return Err(format!(
            "with its messages' text marked, the template writes other text (from byte {at})"
        ));
    }
    Ok(spans)
}

/// Which single field the template cannot carry a marker through, for the error: each field is
/// tried alone (a few renders; only on the error path).
fn culprit(
    template: &Compiled,
    conversation: &Conversation,
    special: &Map<String, Value>,
    plain: &str,
) -> String {
    let mut fields = Vec::new();
    let wrapped: Vec<Value> = conversation
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| wrap_message(i as u32, m, &mut fields))
        .collect();
    // Each try renders the whole conversation: at most 256 of them, and at most
    // `CULPRIT_BYTES` rendered in all.
    let tries = (CULPRIT_BYTES / plain.len().max(1)).clamp(1, 256);
    for (id, field) in fields.iter().enumerate().take(tries) {
        let k = field.message as usize;
        let mut c = conversation.clone();
        c.messages[k] = keep_one_marker(&wrapped[k], id);
        let ok = super::render(template, &c, special)
            .ok()
            .and_then(|t| field_spans(&t, plain, fields.len()).ok())
            .is_some();
        if !ok {
            return format!(
                "the template changes message {} ({}): its `{}` (cardproof cannot tell which tokens are that message's; a template that slices, measures or re-encodes a message's text is not supported)",
                k + 1,
                conversation.messages[k]["role"].as_str().unwrap_or("?"),
                field.path
            );
        }
    }
    if fields.len() > tries {
        return format!(
            "none of the first {tries} of its {} fields is to blame alone: the template writes other text when several are marked",
            fields.len()
        );
    }
    "no single field is to blame: the template writes other text when several are marked".into()
}

/// How many bytes the search for a culprit field may render in all.
const CULPRIT_BYTES: usize = 256 << 20;

/// The field id a wrapped string carries.
fn marker_id(s: &str) -> Option<usize> {
    let after = s.split_once(OPEN)?.1;
    let digits = after.split_once(ID_END)?.0;
    digits.chars().try_fold(0usize, |id, d| {
        let d = (d as u32).checked_sub(DIGIT0).filter(|&d| d < 16)?;
        id.checked_mul(16)?.checked_add(d as usize)
    })
}

/// `message` with every field marker removed but field `keep`'s.
fn keep_one_marker(message: &Value, keep: usize) -> Value {
    match message {
        Value::String(s) if s.contains(OPEN) && marker_id(s) != Some(keep) => {
            Value::String(s.chars().filter(|c| !SENTINELS.contains(c)).collect())
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| keep_one_marker(i, keep)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, x)| (k.clone(), keep_one_marker(x, keep)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

    /// A ChatML template with Qwen3.5's XML tool calls (the shape of the real one, short).
    const CHATML: &str = r#"{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.reasoning_content %}<think>
{{ m.reasoning_content | trim }}
</think>

{% endif %}{{ m.content | trim if m.content is string else '' }}{% if m.tool_calls %}{% for c in m.tool_calls %}

<tool_call>
<function={{ c.function.name }}>
{% for k, v in c.function.arguments | items %}<parameter={{ k }}>
{{ v | tojson if v is mapping else v }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

    fn conversation(messages: Value) -> Conversation {
        Conversation {
            messages: messages.as_array().unwrap().clone(),
            tools: None,
            add_generation_prompt: true,
            kwargs: Map::new(),
        }
    }

    fn specials() -> TurnMarkers {
        TurnMarkers {
            stops: vec!["<|im_end|>".into()],
            specials: vec!["<|im_start|>".into()],
        }
    }

    /// The text of each range, with its message and segment.
    fn pieces(l: &Labelled) -> Vec<(Option<u32>, &'static str, &str)> {
        l.ranges
            .iter()
            .map(|r| (r.message, r.segment.as_str(), &l.text[r.start..r.end]))
            .collect()
    }

    #[test]
    fn fields_turns_and_tool_calls_are_labelled_from_the_render() {
        let t = ChatTemplate::new(CHATML, 0).unwrap();
        let c = conversation(json!([
            {"role": "user", "content": " Weather? "},
            {"role": "assistant", "reasoning_content": "Ask the tool.", "content": "Checking.",
             "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]},
            {"role": "tool", "content": "3 °C"},
            {"role": "assistant", "content": "It is 3 °C."}
        ]));
        let l = label(&t, &c, &Map::new(), &specials()).unwrap();
        // trim_blocks takes the newline after `{% for %}`: one newline before <tool_call>.
        assert_eq!(
            pieces(&l),
            vec![
                (Some(0), "scaffolding", "<|im_start|>user\n"),
                (Some(0), "content", "Weather?"),
                (Some(0), "scaffolding", "<|im_end|>"),
                (Some(1), "scaffolding", "\n<|im_start|>assistant\n<think>\n"),
                (Some(1), "reasoning", "Ask the tool."),
                (Some(1), "scaffolding", "\n</think>\n\n"),
                (Some(1), "content", "Checking."),
                (
                    Some(1),
                    "tool_call",
                    "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
                ),
                (Some(1), "scaffolding", "<|im_end|>"),
                (Some(2), "scaffolding", "\n<|im_start|>tool\n"),
                (Some(2), "tool_result", "3 °C"),
                (Some(2), "scaffolding", "<|im_end|>"),
                (Some(3), "scaffolding", "\n<|im_start|>assistant\n"),
                (Some(3), "content", "It is 3 °C."),
                (Some(3), "scaffolding", "<|im_end|>"),
                (None, "scaffolding", "\n<|im_start|>assistant\n"),
            ]
        );
        assert_eq!(l.roles[2], Role::Tool);
        assert!(l.tool_calls_from_fields.is_empty());
    }

    #[test]
    fn a_template_that_slices_a_message_is_refused_naming_it() {
        let t = ChatTemplate::new(
            "{% for m in messages %}[{{ m.role }}]{{ m.content[:4] }}{% endfor %}",
            0,
        )
        .unwrap();
        let c = conversation(json!([
            {"role": "user", "content": "hello there"}
        ]));
        let e = label(&t, &c, &Map::new(), &specials()).unwrap_err();
        assert!(
            e.contains("message 1 (user)") && e.contains("`content`"),
            "{e}"
        );
    }

    #[test]
    fn sentinel_characters_in_the_conversation_are_refused() {
        let t = ChatTemplate::new(CHATML, 0).unwrap();
        let c = conversation(json!([{"role": "user", "content": "a\u{F0001}b"}]));
        assert!(
            label(&t, &c, &Map::new(), &specials())
                .unwrap_err()
                .contains("U+F0000")
        );
    }

    #[test]
    fn without_a_special_token_the_run_goes_to_the_later_message() {
        let t = ChatTemplate::new(
            "{% for m in messages %}### {{ m.role }}:\n{{ m.content }}\n\n{% endfor %}",
            0,
        )
        .unwrap();
        let c = conversation(json!([
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"}
        ]));
        let l = label(&t, &c, &Map::new(), &TurnMarkers::default()).unwrap();
        assert_eq!(
            pieces(&l),
            vec![
                (Some(0), "scaffolding", "### user:\n"),
                (Some(0), "content", "a"),
                (Some(1), "scaffolding", "\n\n### assistant:\n"),
                (Some(1), "content", "b"),
                (None, "scaffolding", "\n\n"),
            ]
        );
    }

    #[test]
    fn the_differing_window_is_the_inserted_text() {
        assert_eq!(differing_window("abXYcd", "abcd"), (2, 4));
        assert_eq!(differing_window("abcd", "abcd"), (4, 4));
        // Repeated characters: the window is one of the minimal ones.
        let (s, e) = differing_window("aaXaa", "aaaa");
        assert_eq!(e - s, 1);
        // Never inside a character.
        let (s, e) = differing_window("aé", "aè");
        assert_eq!((s, e), (1, 3));
    }

    /// The labels as cardproof found tool calls before issue #41: one render per message with
    /// calls, without them, diffed with the whole render (quadratic in the messages). The
    /// oracle the linear labelling is held to.
    fn label_by_rerenders(
        template: &ChatTemplate,
        c: &Conversation,
        special: &Map<String, Value>,
        markers: &TurnMarkers,
    ) -> Result<Labelled, String> {
        let compiled = template.compiled()?;
        let renderer = Renderer {
            template: &compiled,
            special,
            count: std::cell::Cell::new(0),
        };
        let placed = place(&renderer, c, markers)?;
        let from_fields = field_regions(&placed.owned, c.messages.len());
        let mut ranges = placed.ranges;
        let mut tool_calls_from_fields = Vec::new();
        for (k, m) in c.messages.iter().enumerate() {
            if m.get("tool_calls")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
            {
                continue;
            }
            let mut other = c.clone();
            other.messages[k]
                .as_object_mut()
                .unwrap()
                .remove("tool_calls");
            let mut regions = vec![None; c.messages.len()];
            regions[k] = match renderer.render(&other) {
                Ok(other) => Some(differing_window(&placed.text, &other)),
                Err(_) => {
                    tool_calls_from_fields.push(k as u32);
                    from_fields[k]
                }
            };
            ranges = mark_tool_calls(ranges, &regions);
        }
        Ok(Labelled {
            text: placed.text,
            ranges,
            roles: Vec::new(),
            tool_calls_from_fields,
            renders: renderer.count.get(),
        })
    }

    /// Where the labelling and its oracle disagree on `c`, if they do.
    fn disagreement(
        template: &ChatTemplate,
        c: &Conversation,
        special: &Map<String, Value>,
        markers: &TurnMarkers,
    ) -> Option<String> {
        let ours = label(template, c, special, markers);
        let oracle = label_by_rerenders(template, c, special, markers);
        match (ours, oracle) {
            (Ok(l), Ok(o)) => {
                let differ = |what: &str| {
                    let at = l
                        .ranges
                        .iter()
                        .zip(&o.ranges)
                        .position(|(a, b)| a != b)
                        .unwrap_or(l.ranges.len().min(o.ranges.len()));
                    let show = |x: &Labelled| {
                        x.ranges[at.saturating_sub(1)..(at + 2).min(x.ranges.len())]
                            .iter()
                            .map(|r| {
                                format!(
                                    "{:?}/{}:{:?}",
                                    r.message,
                                    r.segment.as_str(),
                                    &x.text[r.start..r.end]
                                )
                            })
                            .collect::<Vec<_>>()
                    };
                    Some(format!(
                        "{what}: labelled {:?}, oracle {:?}",
                        show(&l),
                        show(&o)
                    ))
                };
                if l.text != o.text {
                    Some("other text".into())
                } else if l.ranges != o.ranges {
                    differ("other ranges")
                } else if l.tool_calls_from_fields != o.tool_calls_from_fields {
                    Some(format!(
                        "calls from fields {:?}, oracle {:?}",
                        l.tool_calls_from_fields, o.tool_calls_from_fields
                    ))
                } else {
                    None
                }
            }
            (Err(a), Err(b)) if a == b => None,
            (a, b) => Some(format!(
                "labelled {:?}, oracle {:?}",
                a.map(|_| ()),
                b.map(|_| ())
            )),
        }
    }

    /// Whether every byte the oracle labels a message's tool call, `l` does too.
    fn covers_oracle_calls(l: &Labelled, oracle: &Labelled) -> bool {
        let at = |x: &Labelled, byte: usize| {
            let r = &x.ranges[x.ranges.partition_point(|r| r.end <= byte)];
            (r.message, r.segment)
        };
        l.text == oracle.text
            && oracle
                .ranges
                .iter()
                .filter(|r| r.segment == Segment::ToolCall)
                .all(|r| (r.start..r.end).all(|b| at(l, b) == (r.message, Segment::ToolCall)))
    }

    /// An agent conversation of `rounds` rounds: a request, then per round an assistant turn
    /// with (`parallel`) calls and their tool results; contents vary (empty, text, reasoning).
    fn agent(rounds: usize, parallel: usize) -> Conversation {
        let mut messages = vec![
            json!({"role": "system", "content": "Use the tools when they help."}),
            json!({"role": "user", "content": "Weather in Zürich, Bern and Genève?"}),
        ];
        for i in 0..rounds {
            let calls: Vec<Value> = (0..parallel)
                .map(|j| {
                    json!({"id": format!("call_{i}_{j}"), "type": "function", "function": {
                        "name": "get_weather",
                        "arguments": {"city": format!("City {i}.{j}"), "days": i + j}
                    }})
                })
                .collect();
            let mut assistant = json!({"role": "assistant", "content": "", "tool_calls": calls});
            if i % 3 == 1 {
                assistant["content"] = json!(format!("Checking round {i}."));
            }
            if i % 4 == 2 {
                assistant["reasoning_content"] = json!("Still missing cities.");
            }
            messages.push(assistant);
            for j in 0..parallel {
                messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}_{j}"), "name": "get_weather",
                                     "content": format!("{{\"temp\": {i}.{j}, \"sky\": \"cloudy\"}}")}));
            }
        }
        messages.push(json!({"role": "assistant", "content": "All cloudy."}));
        messages.push(json!({"role": "user", "content": "Thanks."}));
        Conversation {
            messages,
            tools: None,
            add_generation_prompt: true,
            kwargs: Map::new(),
        }
    }

    /// `c` with its tool calls split into consecutive assistant messages, one call each, before
    /// their results: parallel calls as some datasets write them.
    fn split_calls(c: &Conversation) -> Conversation {
        let mut messages = Vec::new();
        for m in &c.messages {
            match m["tool_calls"].as_array() {
                Some(calls) if calls.len() > 1 => {
                    for (j, call) in calls.iter().enumerate() {
                        let mut one = m.clone();
                        one["tool_calls"] = json!([call]);
                        if j > 0 {
                            one["content"] = json!("");
                            one.as_object_mut().unwrap().remove("reasoning_content");
                        }
                        messages.push(one);
                    }
                }
                _ => messages.push(m.clone()),
            }
        }
        Conversation {
            messages,
            ..c.clone()
        }
    }

    #[test]
    fn tool_calls_are_labelled_as_one_render_per_message_labelled_them() {
        let t = ChatTemplate::new(CHATML, 0).unwrap();
        let example = ChatTemplate::new(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/chat_template.jinja"),
            )
            .unwrap(),
            0,
        )
        .unwrap();
        let markers = TurnMarkers {
            stops: vec!["<|im_end|>".into(), "<|endoftext|>".into()],
            specials: vec!["<|im_start|>".into()],
        };
        let mut checked = 0;
        for template in [&t, &example] {
            for rounds in [1, 2, 3, 7] {
                for parallel in [1, 2, 3] {
                    for c in [
                        agent(rounds, parallel),
                        split_calls(&agent(rounds, parallel)),
                    ] {
                        let l = label(template, &c, &Map::new(), &markers).unwrap();
                        assert!(
                            l.ranges.iter().any(|r| r.segment == Segment::ToolCall),
                            "no tool call labelled"
                        );
                        assert_eq!(
                            disagreement(template, &c, &Map::new(), &markers),
                            None,
                            "{rounds} rounds of {parallel} calls"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 48);
    }

    /// Regression (#41): each message with tool calls rendered the whole conversation once more,
    /// so 2,000 calls took 80 s and 4,000 did not end in 600 s. The renders are counted, not
    /// timed: however many messages call tools, the template renders the conversation two,
    /// four or six times.
    #[test]
    fn labelling_renders_a_constant_number_of_times_however_many_tool_calls() {
        let t = ChatTemplate::new(CHATML, 0).unwrap();
        let renders = |c: &Conversation| label(&t, c, &Map::new(), &specials()).unwrap().renders;
        let plain = conversation(json!([{"role": "user", "content": "hi"}]));
        assert_eq!(renders(&plain), 2);
        assert_eq!(renders(&agent(1, 3)), 4);
        for rounds in [2, 10, 100, 1_000] {
            assert_eq!(renders(&agent(rounds, 1)), 6, "{rounds} rounds");
        }
        // And the labels are those of one render per message.
        assert_eq!(
            disagreement(&t, &agent(100, 2), &Map::new(), &specials()),
            None
        );
    }

    /// The real-template corpus (tests/fixtures/chat_templates): every template with every
    /// conversation it renders, the corpus's own and longer agent conversations (several
    /// messages with calls, and calls split into consecutive messages), labelled as one render
    /// per message labelled them.
    #[test]
    fn the_corpus_is_labelled_as_one_render_per_message_labelled_it() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates");
        let read = |name: &str| -> Value {
            serde_json::from_str(&std::fs::read_to_string(fixtures.join(name)).unwrap()).unwrap()
        };
        let (corpus, m) = (read("conversations.json"), read("markers.json"));
        let markers = TurnMarkers {
            stops: serde_json::from_value(m["stops"].clone()).unwrap(),
            specials: serde_json::from_value(m["specials"].clone()).unwrap(),
        };
        let special: Map<String, Value> =
            serde_json::from_value(json!({"bos_token": "<s>", "eos_token": "</s>"})).unwrap();
        let mut cases: Vec<(String, Conversation)> = corpus["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|case| {
                let c = Conversation {
                    messages: case["messages"].as_array().unwrap().clone(),
                    tools: (case["tools"] == true).then(|| corpus["tools"].clone()),
                    add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                    kwargs: case["kwargs"].as_object().unwrap().clone(),
                };
                (case["name"].as_str().unwrap().to_owned(), c)
            })
            .collect();
        for (rounds, parallel) in [(3, 1), (4, 2)] {
            let mut c = agent(rounds, parallel);
            c.tools = Some(corpus["tools"].clone());
            cases.push((format!("agent {rounds}x{parallel}"), c.clone()));
            cases.push((format!("agent {rounds}x{parallel} split"), split_calls(&c)));
        }
        let mut names: Vec<_> = std::fs::read_dir(fixtures.join("templates"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        let (mut compared, mut with_calls, mut shifted, mut differing) = (0, 0, 0, Vec::new());
        for path in &names {
            let Ok(t) = ChatTemplate::new(&std::fs::read_to_string(path).unwrap(), 0) else {
                continue;
            };
            for (name, c) in &cases {
                if super::super::render(&t.compiled().unwrap(), c, &special).is_err() {
                    continue;
                }
                compared += 1;
                if let Ok(l) = label(&t, c, &special, &markers)
                    && l.ranges.iter().any(|r| r.segment == Segment::ToolCall)
                {
                    with_calls += 1;
                }
                let Some(why) = disagreement(&t, c, &special, &markers) else {
                    continue;
                };
                // With calls split into consecutive messages, one render per message found a
                // window shifted by the repeated call text (the common prefix ran into the next
                // message's call); anchored by the next call's fields, the labelling finds at
                // least every tool-call byte it found.
                let covers = name.ends_with("split")
                    && covers_oracle_calls(
                        &label(&t, c, &special, &markers).unwrap(),
                        &label_by_rerenders(&t, c, &special, &markers).unwrap(),
                    );
                if covers {
                    shifted += 1;
                } else {
                    differing.push(format!(
                        "{} / {name}: {why}",
                        path.file_name().unwrap().display()
                    ));
                }
            }
        }
        assert!(differing.is_empty(), "{}", differing.join("\n"));
        assert!(
            compared >= 550 && with_calls >= 250,
            "{compared} compared, {with_calls} with calls"
        );
        assert!(
            shifted <= 1,
            "{shifted} split conversations labelled otherwise than the oracle"
        );
    }

    /// Regression (#41): a template that rewrote a marker's id made the labelling index a field
    /// that does not exist (a panic); it is refused, naming the field it garbles.
    #[test]
    fn a_template_that_rewrites_a_field_marker_is_refused_not_a_panic() {
        let source = "{% for m in messages %}[{{ m.role }}]{{ m.content | replace('\u{F0010}', '\u{F001F}') }}{% endfor %}";
        let t = ChatTemplate::new(source, 0).unwrap();
        let c = conversation(json!([{"role": "user", "content": "hello"}]));
        let e = label(&t, &c, &Map::new(), &specials()).unwrap_err();
        assert!(
            e.contains("garbled") && e.contains("message 1 (user)") && e.contains("`content`"),
            "{e}"
        );
    }

    /// Regression (#41): the strings of a conversation are each marked (and recorded) before the
    /// template renders them, whether it writes them or not; more than [`MAX_FIELDS`] are
    /// refused before the marked render.
    #[test]
    fn more_strings_than_the_field_limit_are_refused_before_they_are_rendered() {
        let t = ChatTemplate::new("{% for m in messages %}[{{ m.role }}]{% endfor %}", 0).unwrap();
        let leaves = vec![Value::String("a".into()); MAX_FIELDS + 1];
        let c = conversation(json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": leaves}}]}
        ]));
        let e = label(&t, &c, &Map::new(), &specials()).unwrap_err();
        assert!(
            e.contains(&format!("more than {MAX_FIELDS} strings (by message 2)")),
            "{e}"
        );
    }

    /// Regression (#41): one conversation's work is bounded by its render, not only by the
    /// file's size: a render over [`MAX_RENDER_BYTES`] is refused before it is marked,
    /// labelled or tokenized.
    #[test]
    fn a_render_over_the_limit_is_refused_naming_its_size_and_the_limit() {
        let t = ChatTemplate::new(CHATML, 0).unwrap();
        let c = conversation(json!([{"role": "user", "content": "a".repeat(MAX_RENDER_BYTES)}]));
        let e = label(&t, &c, &Map::new(), &specials()).unwrap_err();
        assert!(
            e.contains(&format!(
                "renders to {} bytes, over the 16 MiB one conversation may render to",
                MAX_RENDER_BYTES + "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n".len()
            )),
            "{e}"
        );
    }

    /// Where nothing lies between two messages' calls to tell them apart in the render without
    /// them (the template writes no call field, so the message between keeps nothing that
    /// anchors), each of the two falls back to its fields, and says so.
    #[test]
    fn calls_that_cannot_be_told_apart_fall_back_to_their_fields() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.reasoning_content or '' }}{% if m.tool_calls %}[calls]{% endif %}{{ m.content }}<end>\n{% endfor %}",
            0,
        )
        .unwrap();
        let call = json!([{"function": {"name": "f", "arguments": {}}}]);
        let c = conversation(json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "reasoning_content": "first", "content": "", "tool_calls": call},
            {"role": "assistant", "content": "", "tool_calls": call},
            {"role": "assistant", "content": "third", "tool_calls": call},
            {"role": "tool", "content": "done"}
        ]));
        let markers = TurnMarkers {
            stops: vec!["<end>".into()],
            specials: Vec::new(),
        };
        let l = label(&t, &c, &Map::new(), &markers).unwrap();
        assert_eq!(l.tool_calls_from_fields, vec![1, 3]);
        // One render per message told them apart; their fields (none written) cannot.
        let oracle = label_by_rerenders(&t, &c, &Map::new(), &markers).unwrap();
        let calls = |x: &Labelled| -> Vec<Option<u32>> {
            x.ranges
                .iter()
                .filter(|r| r.segment == Segment::ToolCall)
                .map(|r| r.message)
                .collect()
        };
        assert_eq!(calls(&oracle), vec![Some(1), Some(3)]);
        assert_eq!(calls(&l), Vec::<Option<u32>>::new());
    }
}
