//! Markdown escaping, both rules in one place. Output bytes depend on the rule, so each caller
//! keeps its own and no third is added:
//!
//! - [`escape_all`]: every Markdown punctuation character gets a backslash. For text a card or a
//!   measurement puts into a card's fidelity section (`card::write`), where nothing may turn
//!   into markup whatever surrounds it.
//! - [`escape_inline`]: only what GitHub-flavoured Markdown would read as markup in that place,
//!   so names and numbers in report.md read cleanly (`report`'s templates).

/// Escape text that came from a card or a measurement: a backslash before every Markdown
/// punctuation character, control characters and line separators as spaces.
pub fn escape_all(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '#' | '!' | '|' | '~' | '&' | '$'
            | '{' | '}' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Markdown escaping for untrusted text (card values, paths), for use in paragraphs, list items
/// and table cells: nothing in the result renders as a link (inline, reference or autolink), an
/// image, raw HTML, an entity, emphasis, code, a table cell break, a heading, a list or a quote.
///
/// It escapes only what Markdown would read as markup, so that report.md reads as plain text raw
/// (`|rerun - claim| <= 2.2e-5 (±5e-6)` stays as it is but for the pipes, which would end a
/// table cell):
///
/// - always: `\`, `` ` ``, `[`, `]`, `|`, `~` and `$` (GitHub's strikethrough and math) and `@`
///   (GFM's e-mail autolinks); `*` unless blank on both sides; `_` unless inside a word (GFM
///   reads no emphasis there);
/// - `(` after `]` (a link destination), `<` before a letter, `/`, `!` or `?` (raw HTML, an
///   autolink) and `&` before a letter, digit or `#` (an entity), each with a backslash;
/// - block syntax, which can only start a line (line breaks and other control characters become
///   spaces, since a newline would also end a table row): a leading `#`, `-`, `+`, `=`, `>`, or
///   `1.` / `1)`;
/// - bidirectional-override characters become U+FFFD (they can make text read differently than
///   it is); `://` and `www.` are broken so GFM does not autolink them.
pub fn escape_inline(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 4);
    let bytes = s.as_bytes();
    let chars: Vec<char> = s.chars().collect();
    // Block syntax (headings, lists, setext underlines) can only start a line; newlines become
    // spaces below, so only the first non-blank character can start one.
    let first = s
        .find(|c: char| !(c.is_whitespace() || c.is_control()))
        .unwrap_or(s.len());
    let lead_digits = bytes[first..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    let mut prev_cr = false;
    for (k, (i, c)) in s.char_indices().enumerate() {
        let was_cr = std::mem::replace(&mut prev_cr, c == '\r');
        let prev = k.checked_sub(1).map(|p| chars[p]);
        let next = chars.get(k + 1).copied();
        let blank = |c: Option<char>| c.is_none_or(char::is_whitespace);
        let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
        let escape = match c {
            '\\' | '`' | '[' | ']' | '|' | '~' | '$' | '@' => true,
            '*' => !(blank(prev) && blank(next)),
            '_' => !(word(prev) && word(next)),
            '(' => prev == Some(']'),
            '<' => next.is_some_and(|n| n.is_ascii_alphabetic() || matches!(n, '/' | '!' | '?')),
            '&' => next.is_some_and(|n| n.is_ascii_alphanumeric() || n == '#'),
            '#' | '-' | '+' | '=' | '>' => i == first,
            // `1.` or `1)` followed by a blank opens an ordered list.
            '.' | ')' => {
                lead_digits > 0
                    && i == first + lead_digits
                    && bytes.get(i + 1).is_none_or(|b| b.is_ascii_whitespace())
            }
            _ => false,
        };
        match c {
            _ if escape => {
                out.push('\\');
                out.push(c);
            }
            // GFM extended autolinks: `scheme://` and `www.`.
            ':' if bytes.get(i + 1..i + 3) == Some(b"//") => out.push_str("\\:"),
            '.' if i >= 3 && bytes[i - 3..i].eq_ignore_ascii_case(b"www") => out.push_str("\\."),
            '\n' if was_cr => {}
            '\n' | '\r' | '\t' => out.push(' '),
            c if c.is_control() => out.push(' '),
            c if is_bidi_control(c) => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// A bidirectional-override or -isolate character: it can make text read differently than it is.
pub(crate) fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}')
}
