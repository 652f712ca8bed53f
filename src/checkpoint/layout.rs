//! Published quantization layouts against the GGUF headers: a `layouts/<file>.tensor-types.txt`
//! beside a GGUF (what publishers such as bartowski ship: the exact per-tensor types given to
//! `llama-quantize --tensor-type-file`) says which type each tensor was asked to take; the file's
//! header says which it has. A layout that does not describe the file is a cheap, fail-closed
//! finding: the card's "computed layout" numbers would be about another file.
//!
//! The file's lines are `PATTERN=TYPE`, matched as llama-quantize matches them: the first line
//! whose pattern a tensor's name contains (`std::regex_search`) gives its type. A pattern
//! `^NAME$` with NAME regex-escaped (how generators write exact names) or without regex
//! metacharacters is a plain name; others are regular expressions. A tensor whose row length
//! does not divide into the asked type's blocks takes llama-quantize's fallback type: it is not a
//! mismatch. Tensors no line matches keep the preset's type and are not checked.

use std::path::Path;

use super::gguf::{GgmlType, GgufFile};
use crate::error::{Error, Result};

/// A layout file is a few thousand lines.
const MAX_LAYOUT_BYTES: u64 = 4 << 20;
/// Longest pattern compiled (a hostile file cannot make the regex engine work for long).
const MAX_PATTERN: usize = 512;

/// One GGUF's layout file, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutCheck {
    /// The layout file, relative to the model directory.
    pub layout: String,
    /// The GGUF it describes.
    pub gguf: String,
    /// Tensors a line matched.
    pub checked: usize,
    /// `tensor: layout TYPE, file TYPE`, in the file's tensor order.
    pub mismatches: Vec<String>,
}

/// The layout file of each top-level GGUF in `dir` that has one
/// (`layouts/<file>.tensor-types.txt` or `layouts/<stem>.tensor-types.txt`), checked.
pub fn check_dir(dir: &Path) -> Result<Vec<LayoutCheck>> {
    let layouts = dir.join("layouts");
    if !layouts.is_dir() {
        return Ok(Vec::new());
    }
    let mut ggufs: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf") && !super::members::excluded(n))
        .collect();
    ggufs.sort();
    let mut out = Vec::new();
    for name in ggufs {
        let stem = name.trim_end_matches(".gguf");
        let Some(layout) = [name.as_str(), stem]
            .iter()
            .map(|n| format!("layouts/{n}.tensor-types.txt"))
            .find(|rel| dir.join(rel).is_file())
        else {
            continue;
        };
        let file = super::gguf::read_file(&dir.join(&name))?;
        out.push(check(&dir.join(&layout), &layout, &name, &file)?);
    }
    Ok(out)
}

/// `layout` (read from `path`) against `file`'s tensors.
pub fn check(path: &Path, layout: &str, gguf: &str, file: &GgufFile) -> Result<LayoutCheck> {
    let bytes = crate::files::read_capped(path, MAX_LAYOUT_BYTES, "a layout file")?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| Error::format(path, None, "a layout file must be UTF-8"))?;
    let rules = parse(path, text)?;
    let mut checked = 0;
    let mut mismatches = Vec::new();
    for t in &file.tensors {
        let Some((_, asked)) = rules.iter().find(|(p, _)| p.matches(&t.name)) else {
            continue;
        };
        checked += 1;
        let fallback = t
            .dims
            .first()
            .is_some_and(|&row| row % asked.block_size() != 0);
        if t.ty != *asked && !fallback {
            mismatches.push(format!(
                "{}: layout {}, file {}",
                t.name,
                asked.name(),
                t.ty.name()
            ));
        }
    }
    Ok(LayoutCheck {
        layout: layout.to_owned(),
        gguf: gguf.to_owned(),
        checked,
        mismatches,
    })
}

/// A line's pattern: an exact name, or a regular expression searched in the name.
enum Pattern {
    Name(String),
    Regex(regex::Regex),
}

impl Pattern {
    fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Name(n) => name.contains(n.as_str()),
            Pattern::Regex(r) => r.is_match(name),
        }
    }
}

fn parse(path: &Path, text: &str) -> Result<Vec<(Pattern, GgmlType)>> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |why: String| {
            let mut e = Error::format(path, None, why);
            e.at = Some(crate::span::LineCol {
                line: i + 1,
                column: 1,
            });
            e
        };
        let (pattern, ty) = line
            .rsplit_once('=')
            .ok_or_else(|| at("expected PATTERN=TYPE".into()))?;
        let asked = GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(ty.trim()))
            .ok_or_else(|| at(format!("`{ty}` is not a ggml type")))?;
        if pattern.len() > MAX_PATTERN {
            return Err(at(format!("a pattern over {MAX_PATTERN} characters")));
        }
        rules.push((plain_or_regex(pattern).map_err(at)?, asked));
    }
    Ok(rules)
}

/// `^NAME$` with NAME regex-escaped, or a name without metacharacters, as the plain name;
/// anything else compiled as a regular expression.
fn plain_or_regex(pattern: &str) -> std::result::Result<Pattern, String> {
    const META: &[char] = &[
        '\\', '^', '$', '.', '*', '+', '?', '(', ')', '[', ']', '{', '}', '|',
    ];
    if !pattern.contains(META) {
        return Ok(Pattern::Name(pattern.to_owned()));
    }
    if let Some(inner) = pattern.strip_prefix('^').and_then(|p| p.strip_suffix('$')) {
        let mut name = String::new();
        let mut chars = inner.chars();
        let mut plain = true;
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(e) if META.contains(&e) || e == '-' => name.push(e),
                    _ => plain = false,
                },
                c if META.contains(&c) => plain = false,
                c => name.push(c),
            }
        }
        if plain {
            // Anchored both ends: the whole name, not a part of it.
            return regex::Regex::new(&format!("^{}$", regex::escape(&name)))
                .map(Pattern::Regex)
                .map_err(|e| e.to_string());
        }
    }
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map(Pattern::Regex)
        .map_err(|e| format!("`{pattern}` is not a regular expression: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_llama_quantize_matches_them() {
        let exact = plain_or_regex(r"^blk\.0\.attn_q\.weight$").unwrap();
        assert!(exact.matches("blk.0.attn_q.weight"));
        assert!(!exact.matches("blk.10.attn_q.weight") && !exact.matches("blk.0.attn_q.weight.x"));
        let part = plain_or_regex("ffn_down").unwrap();
        assert!(part.matches("blk.3.ffn_down.weight"));
        let re = plain_or_regex(r"blk\.[0-9]+\.ffn_(up|gate)").unwrap();
        assert!(re.matches("blk.12.ffn_gate.weight") && !re.matches("blk.12.ffn_down.weight"));
        assert!(plain_or_regex("blk[").is_err());
        let e = parse(Path::new("l.txt"), "a=q4_0\nb=q9_9\n").err().unwrap();
        assert_eq!(e.at.map(|a| a.line), Some(2));
        assert!(e.to_string().contains("`q9_9` is not a ggml type"), "{e}");
        assert!(parse(Path::new("l.txt"), "no equals sign\n").is_err());
    }
}
