//! A model card: the README text, its YAML front matter found exactly as the Hugging Face Hub
//! finds it, and a line index so every finding can point at a line and column.

pub mod canonical;
pub mod prose;
pub mod write;
pub mod yaml;

/// The line that opens the section of the card body `cardproof card` writes (lint skips it).
pub const SECTION_START: &str = "<!-- cardproof:fidelity:start -->";
/// The line that closes the generated section of the card body.
pub const SECTION_END: &str = "<!-- cardproof:fidelity:end -->";

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

use crate::error::{Error, ErrorKind, Result};
use crate::span::{LineCol, LineIndex};

/// Cards over this size are refused: the Hub renders nothing that large and a hostile file must
/// not be read whole.
pub const MAX_CARD_BYTES: u64 = 16 * 1024 * 1024;

/// `huggingface_hub`'s `REGEX_YAML_BLOCK`, "the exact same regex as the Hub server": optional
/// leading whitespace, `---` and a line break, the block (lazily), a line break, `---` with
/// optional trailing blanks, then a line break or the end of the file.
static YAML_BLOCK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\A(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|\z))")
        .expect("front-matter regex is valid")
});

/// An opening `---` line at the top of the file (after optional whitespace).
static OPENING: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\A\s*---(\r\n|\r|\n)").expect("opening regex is valid"));

#[derive(Debug, Clone)]
pub struct Card {
    pub path: PathBuf,
    pub text: String,
    pub lines: LineIndex,
    pub front_matter: FrontMatter,
}

#[derive(Debug, Clone)]
pub enum FrontMatter {
    /// No front matter: the Hub sees no metadata.
    Absent,
    /// An opening `---` without a closing one; the Hub sees no metadata either.
    Unterminated { opening: Range<usize> },
    /// The block between the markers; `root` is `None` for an empty block.
    Present {
        yaml: Range<usize>,
        root: Option<yaml::Node>,
    },
}

impl Card {
    /// Read the card at `path`: a Markdown file, or a directory holding README.md.
    pub fn open(path: &Path) -> Result<Card> {
        let file = resolve_card_path(path)?;
        let bytes = crate::files::read_capped(&file, MAX_CARD_BYTES, "a card")?;
        Card::from_bytes(file, bytes)
    }

    pub fn from_bytes(path: PathBuf, bytes: Vec<u8>) -> Result<Card> {
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                let valid = e.utf8_error().valid_up_to();
                let bytes = e.into_bytes();
                let prefix = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
                let at = LineIndex::new(prefix).line_col(prefix, valid);
                return Err(Error::at(path, at, ErrorKind::NotUtf8));
            }
        };
        let lines = LineIndex::new(&text);
        let front_matter = find_front_matter(&text, &path, &lines)?;
        Ok(Card {
            path,
            text,
            lines,
            front_matter,
        })
    }

    pub fn line_col(&self, offset: usize) -> LineCol {
        self.lines.line_col(&self.text, offset)
    }

    /// The YAML root mapping, when the front matter is a mapping.
    pub fn metadata(&self) -> Option<&yaml::Node> {
        match &self.front_matter {
            FrontMatter::Present {
                root: Some(root), ..
            } => Some(root),
            _ => None,
        }
    }

    /// The Markdown body after the front matter (the whole text when there is none).
    pub fn body_range(&self) -> Range<usize> {
        match &self.front_matter {
            FrontMatter::Present { yaml, .. } => {
                let m = YAML_BLOCK.find(&self.text).map_or(yaml.end, |m| m.end());
                m..self.text.len()
            }
            _ => 0..self.text.len(),
        }
    }
}

/// A directory means its README.md; anything else is read as a card.
pub fn resolve_card_path(path: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        let readme = path.join("README.md");
        if readme.is_file() {
            return Ok(readme);
        }
        return Err(Error::new(path, ErrorKind::NoReadme));
    }
    Ok(path.to_path_buf())
}

fn find_front_matter(text: &str, path: &Path, lines: &LineIndex) -> Result<FrontMatter> {
    if let Some(caps) = YAML_BLOCK.captures(text) {
        let block = caps.get(2).expect("group 2 always participates");
        let source = block.as_str();
        let root = yaml::parse(source, block.start(), yaml::Budget::default())
            .map_err(|e| yaml_error(e, text, path, lines))?;
        return Ok(FrontMatter::Present {
            yaml: block.range(),
            root,
        });
    }
    if let Some(m) = OPENING.find(text) {
        let start = m.as_str().find("---").map_or(m.start(), |i| m.start() + i);
        return Ok(FrontMatter::Unterminated {
            opening: start..start + 3,
        });
    }
    Ok(FrontMatter::Absent)
}

/// A YAML error in a whole file `text` (a settings file, not a card's front matter) as the
/// error naming `path`, the line and column, and what is wrong.
pub fn yaml_file_error(e: yaml::YamlError, text: &str, path: &Path) -> Error {
    let error = yaml_error(e, text, path, &LineIndex::new(text));
    match error.kind {
        // Not a card: the syntax error is the file's, not its front matter's.
        ErrorKind::YamlSyntax(message) => Error {
            kind: ErrorKind::Format {
                subject: None,
                rule: format!("YAML syntax error: {message}"),
            },
            ..error
        },
        _ => error,
    }
}

fn yaml_error(e: yaml::YamlError, text: &str, path: &Path, lines: &LineIndex) -> Error {
    let at = |offset| lines.line_col(text, offset);
    match e {
        yaml::YamlError::Syntax { offset, message } => Error::at(
            path,
            at(offset),
            ErrorKind::YamlSyntax(clean_scan_message(&message)),
        ),
        yaml::YamlError::DuplicateKey {
            offset,
            key,
            first_offset,
        } => Error::at(
            path,
            at(offset),
            ErrorKind::DuplicateKey {
                key,
                first_line: at(first_offset).line,
            },
        ),
        yaml::YamlError::Budget {
            offset,
            what,
            limit,
        } => Error::at(path, at(offset), ErrorKind::Budget { what, limit }),
        yaml::YamlError::Unsupported { offset, message } => {
            Error::at(path, at(offset), ErrorKind::UnsupportedYaml(message))
        }
    }
}

/// granit-parser appends its own (block-relative) position; ours is file-relative.
fn clean_scan_message(message: &str) -> String {
    static POSITION: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"\s*(at|on)? ?(byte|char|line) \d+.*$").expect("position regex is valid")
    });
    let cleaned = POSITION.replace(message, "");
    if cleaned.trim().is_empty() {
        message.to_owned()
    } else {
        cleaned.trim().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(text: &str) -> Result<Card> {
        Card::from_bytes("README.md".into(), text.as_bytes().to_vec())
    }

    #[test]
    fn finds_front_matter_like_the_hub() {
        let c = card("---\nlicense: mit\n---\n# Title\n").unwrap();
        assert!(c.metadata().is_some());
        assert_eq!(&c.text[c.body_range()], "# Title\n");
    }

    #[test]
    fn accepts_leading_whitespace_crlf_and_closing_at_eof() {
        let c = card("\n  ---\r\nlicense: mit\r\n---").unwrap();
        let root = c.metadata().unwrap();
        assert_eq!(root.to_json()["license"], "mit");
    }

    #[test]
    fn unterminated_front_matter_points_at_the_opening_marker() {
        let c = card("\n---\nlicense: mit\n").unwrap();
        match c.front_matter {
            FrontMatter::Unterminated { opening } => assert_eq!(opening, 1..4),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_horizontal_rule_later_in_the_file_is_not_front_matter() {
        let c = card("# Title\n---\nx: 1\n---\n").unwrap();
        assert!(matches!(c.front_matter, FrontMatter::Absent));
    }

    #[test]
    fn invalid_utf8_names_the_line() {
        let err = Card::from_bytes("c.md".into(), b"ok\nbad \xff here".to_vec()).unwrap_err();
        assert!(matches!(err.kind, ErrorKind::NotUtf8));
        assert_eq!(err.at, Some(LineCol { line: 2, column: 5 }));
    }
}
