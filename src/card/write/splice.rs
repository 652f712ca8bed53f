//! Byte splicing of the edits into the existing card.
//!
//! Where the front matter, its top-level entries and the body are, and the edits that replace an
//! entry, append entries, or replace the generated section, each cut at line boundaries and
//! written in the file's own line endings, so that every other byte of the card stays as it was.
//! This is the only code that knows byte offsets into the card.

use super::section::markdown;
use super::{SECTION_END, SECTION_START};
use crate::card::yaml::{Entry, Node, NodeKind};
use crate::card::{Card, FrontMatter};
use crate::error::{Error, ErrorKind, Result};
use std::ops::Range;
use std::path::PathBuf;

pub(super) struct Layout<'c> {
    text: &'c str,
    eol: &'static str,
    /// The front matter's YAML, when the card has one.
    yaml: Option<Range<usize>>,
    pub(super) root: Option<&'c Node>,
    /// Column of the top-level keys.
    pub(super) indent: usize,
    body: Range<usize>,
    path: PathBuf,
    card: Option<&'c Card>,
}

/// Replace `range` of the old text with `text`.
pub(super) struct Edit {
    range: Range<usize>,
    text: String,
}

impl<'c> Layout<'c> {
    pub(super) fn empty() -> Self {
        Layout {
            text: "",
            eol: "\n",
            yaml: None,
            root: None,
            indent: 0,
            body: 0..0,
            path: PathBuf::new(),
            card: None,
        }
    }

    pub(super) fn of(card: &'c Card) -> Result<Self> {
        let text = card.text.as_str();
        let eol = match text.find('\n') {
            Some(i) if i > 0 && text.as_bytes()[i - 1] == b'\r' => "\r\n",
            _ => "\n",
        };
        let error = |offset: usize, kind: ErrorKind| {
            Error::at(card.path.clone(), card.line_col(offset), kind)
        };
        let (yaml, root) = match &card.front_matter {
            FrontMatter::Absent => (None, None),
            FrontMatter::Unterminated { opening } => {
                return Err(error(
                    opening.start,
                    ErrorKind::YamlSyntax(
                        "the front matter opened with `---` is never closed by a `---` line".into(),
                    ),
                ));
            }
            FrontMatter::Present { yaml, root } => (Some(yaml.clone()), root.as_ref()),
        };
        if let Some(yaml) = &yaml {
            let bytes = text.as_bytes();
            if let Some(i) = (yaml.start..yaml.end)
                .find(|&i| bytes[i] == b'\r' && bytes.get(i + 1) != Some(&b'\n'))
            {
                return Err(error(
                    i,
                    ErrorKind::UnsupportedYaml(
                        "lone carriage-return line endings in the front matter; use LF or CRLF"
                            .into(),
                    ),
                ));
            }
        }
        let mut indent = 0;
        if let Some(root) = root {
            let NodeKind::Map(entries) = &root.kind else {
                return Err(error(
                    root.span.start,
                    ErrorKind::UnsupportedYaml(
                        "the front matter is not a mapping of `key: value` lines".into(),
                    ),
                ));
            };
            if text[root.span.start..].starts_with('{') {
                return Err(error(
                    root.span.start,
                    ErrorKind::UnsupportedYaml(
                        "the front matter is a flow mapping (`{...}`); write it as `key: value` \
                         lines so it can be edited in place"
                            .into(),
                    ),
                ));
            }
            let yaml_start = yaml.as_ref().map_or(0, |y| y.start);
            for (i, entry) in entries.iter().enumerate() {
                let start = line_start(text, yaml_start, entry.key_span.start);
                let prefix = &text[start..entry.key_span.start];
                if !prefix.bytes().all(|b| b == b' ') {
                    return Err(error(
                        entry.key_span.start,
                        ErrorKind::UnsupportedYaml(format!(
                            "the top-level key `{}` does not start its line",
                            entry.key
                        )),
                    ));
                }
                if i == 0 {
                    indent = prefix.len();
                }
            }
        }
        Ok(Layout {
            text,
            eol,
            yaml,
            root,
            indent,
            body: card.body_range(),
            path: card.path.clone(),
            card: Some(card),
        })
    }

    /// The edit that replaces top-level entry `index` (its key's line to the end of its value's
    /// last line, leaving blank lines and column-0 comments before the next key in place).
    pub(super) fn replace_entry(&self, index: usize, block: &str) -> Result<Edit> {
        let (Some(yaml), Some(root)) = (&self.yaml, self.root) else {
            unreachable!("entries exist only in a front matter");
        };
        let entries = root.entries();
        let entry = &entries[index];
        let start = line_start(self.text, yaml.start, entry.key_span.start);
        let initial = entries.get(index + 1).map_or(yaml.end, |next| {
            line_start(self.text, yaml.start, next.key_span.start)
        });
        let floor = line_end(self.text, yaml, content_end(self.text, entry)).min(initial);
        let mut cut = initial;
        while cut > floor {
            let prev = line_start(self.text, yaml.start, cut - 1);
            if prev < floor {
                break;
            }
            let line = &self.text[prev..cut];
            let trimmed = line.trim();
            let indent = line.len() - line.trim_start_matches(' ').len();
            if trimmed.is_empty() || (trimmed.starts_with('#') && indent <= self.indent) {
                cut = prev;
            } else {
                break;
            }
        }
        let mut text = self.localize(block);
        if !self.text[..cut].ends_with('\n') {
            strip_eol(&mut text);
        }
        Ok(Edit {
            range: start..cut,
            text,
        })
    }

    /// The edit that adds top-level entries after the front matter's last non-blank line (or
    /// creates a front matter at the top of the file).
    pub(super) fn append_to_front_matter(&self, block: &str) -> Edit {
        let mut text = self.localize(block);
        let Some(yaml) = &self.yaml else {
            let eol = self.eol;
            return Edit {
                range: 0..0,
                text: format!("---{eol}{text}---{eol}"),
            };
        };
        let source = &self.text[yaml.clone()];
        let last = source
            .split_inclusive('\n')
            .scan(yaml.start, |offset, line| {
                let start = *offset;
                *offset += line.len();
                Some((start, *offset, line))
            })
            .filter(|(_, _, line)| !line.trim().is_empty())
            .last();
        match last {
            None if source.is_empty() => {
                strip_eol(&mut text);
                Edit {
                    range: yaml.start..yaml.start,
                    text,
                }
            }
            None => Edit {
                range: yaml.start..yaml.start,
                text,
            },
            Some((_, end, _)) => {
                if !self.text[..end].ends_with('\n') {
                    strip_eol(&mut text);
                    text = format!("{}{text}", self.eol);
                }
                Edit {
                    range: end..end,
                    text,
                }
            }
        }
    }

    /// The edit that replaces the section between the markers, or appends it to the body.
    pub(super) fn section_edit(&self, section: &str, name: &str, new_card: bool) -> Result<Edit> {
        let section = self.localize(section);
        let body = &self.text[self.body.clone()];
        let eol = self.eol;
        if let Some(s) = body.find(SECTION_START) {
            let start = self.body.start + s;
            let Some(e) = self.text[start..].find(SECTION_END) else {
                return Err(self.body_error(
                    start,
                    format!("`{SECTION_START}` is not followed by `{SECTION_END}`"),
                ));
            };
            let end = start + e + SECTION_END.len();
            let mut text = section;
            strip_eol(&mut text);
            return Ok(Edit {
                range: start..end,
                text,
            });
        }
        if let Some(e) = body.find(SECTION_END) {
            return Err(self.body_error(
                self.body.start + e,
                format!("`{SECTION_END}` without a `{SECTION_START}` before it"),
            ));
        }
        if let Some((range, _)) = self.hand_written_section() {
            let mut text = section;
            let rest = &self.text[range.end..];
            if !rest.is_empty() && !rest.starts_with(['\n', '\r']) {
                text.push_str(eol);
            }
            return Ok(Edit { range, text });
        }
        let end = self.text.len();
        let before = &self.text[..end];
        let lead = if new_card {
            format!("{eol}# {}{eol}{eol}", markdown(name))
        } else if before.is_empty() || before.ends_with("\n\n") || before.ends_with("\r\n\r\n") {
            String::new()
        } else if before.ends_with('\n') {
            eol.to_owned()
        } else {
            format!("{eol}{eol}")
        };
        Ok(Edit {
            range: end..end,
            text: format!("{lead}{section}"),
        })
    }

    fn body_error(&self, offset: usize, message: String) -> Error {
        match self.card {
            Some(card) => Error::at(
                self.path.clone(),
                card.line_col(offset),
                ErrorKind::Card {
                    subject: None,
                    rule: message,
                },
            ),
            None => Error::card(&self.path, None, message),
        }
    }

    /// A hand-written fidelity section of the body: a heading that names KLD or fidelity (outside
    /// code fences), up to the next heading of its level or above, holding at least one KLD
    /// number (lint's prose claim finder). The first such section is the one `card` replaces
    /// when the card has no generated section yet; returns its byte range and its heading line.
    pub(super) fn hand_written_section(&self) -> Option<(Range<usize>, String)> {
        let body = self.body.clone();
        let text = &self.text[body.clone()];
        let mut headings: Vec<(usize, usize, &str)> = Vec::new(); // (start, level, line)
        let mut fence: Option<&str> = None;
        let mut offset = body.start;
        for raw in text.split_inclusive('\n') {
            let start = offset;
            offset += raw.len();
            let line = raw.trim_end_matches(['\n', '\r']);
            let trimmed = line.trim_start_matches(' ');
            if line.len() - trimmed.len() > 3 {
                continue;
            }
            if let Some(f) = fence {
                if trimmed.starts_with(f) {
                    fence = None;
                }
                continue;
            }
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                fence = Some(&trimmed[..3]);
                continue;
            }
            let level = trimmed.bytes().take_while(|b| *b == b'#').count();
            if (1..=6).contains(&level) && trimmed[level..].starts_with([' ', '\t']) {
                headings.push((start, level, line));
            }
        }
        for (i, &(start, level, line)) in headings.iter().enumerate() {
            let title = line.trim_start_matches([' ', '#']);
            if !(crate::card::prose::names_kld(title) || title.to_lowercase().contains("fidelity"))
            {
                continue;
            }
            let end = headings[i + 1..]
                .iter()
                .find(|(_, l, _)| *l <= level)
                .map_or(body.end, |(s, _, _)| *s);
            // The section runs to the end of the last block (paragraph, table, list) that states
            // a KLD number; what follows it under the heading (a closing remark) is kept.
            let Some(last) = crate::card::prose::kld_claims(self.text, start..end)
                .iter()
                .map(|c| c.span.end)
                .max()
            else {
                continue;
            };
            let mut cut = end;
            let mut at = line_start(self.text, start, last);
            for raw in self.text[at..end].split_inclusive('\n') {
                if raw.trim().is_empty() {
                    cut = at;
                    break;
                }
                at += raw.len();
            }
            return Some((start..cut, line.trim().to_owned()));
        }
        None
    }

    /// `\n` to the file's line ending.
    fn localize(&self, text: &str) -> String {
        if self.eol == "\n" {
            text.to_owned()
        } else {
            text.replace('\n', self.eol)
        }
    }

    pub(super) fn apply(&self, mut edits: Vec<Edit>) -> String {
        edits.sort_by_key(|e| (e.range.start, e.range.end));
        let mut out = String::with_capacity(self.text.len() + 4096);
        let mut cursor = 0;
        for edit in edits {
            debug_assert!(edit.range.start >= cursor, "edits overlap");
            out.push_str(&self.text[cursor..edit.range.start]);
            out.push_str(&edit.text);
            cursor = edit.range.end;
        }
        out.push_str(&self.text[cursor..]);
        out
    }
}

pub(super) trait Entries {
    fn entries(&self) -> &[Entry];
}

impl Entries for Node {
    fn entries(&self) -> &[Entry] {
        match &self.kind {
            NodeKind::Map(entries) => entries,
            _ => &[],
        }
    }
}

fn strip_eol(text: &mut String) {
    if text.ends_with("\r\n") {
        text.truncate(text.len() - 2);
    } else if text.ends_with('\n') {
        text.truncate(text.len() - 1);
    }
}

/// The start of the line holding `offset`, not before `floor`.
fn line_start(text: &str, floor: usize, offset: usize) -> usize {
    text[floor..offset]
        .rfind('\n')
        .map_or(floor, |i| floor + i + 1)
}

/// The start of the line after the one holding `offset` (or the end of the YAML).
fn line_end(text: &str, yaml: &Range<usize>, offset: usize) -> usize {
    let offset = offset.clamp(yaml.start, yaml.end);
    if offset > yaml.start && text.as_bytes()[offset - 1] == b'\n' {
        return offset;
    }
    text[offset..yaml.end]
        .find('\n')
        .map_or(yaml.end, |i| offset + i + 1)
}

/// The end of the last byte an entry's key or value occupies, from the spans the parser reports
/// reliably: scalars, keys and flow collections (a block collection's end is the next token).
fn content_end(text: &str, entry: &Entry) -> usize {
    let mut end = entry.key_span.end;
    entry.value.walk(&mut |_, key, node| {
        if let Some(key) = key {
            end = end.max(key.end);
        }
        let flow = matches!(node.kind, NodeKind::Seq(_) | NodeKind::Map(_))
            && matches!(text.as_bytes().get(node.span.start), Some(b'[' | b'{'));
        if (matches!(node.kind, NodeKind::Scalar(_)) || flow) && node.span.end > node.span.start {
            end = end.max(node.span.end);
        }
    });
    end.max(entry.key_span.end)
}
