//! Errors for input cardproof cannot work with: unreadable, malformed or over a budget.
//!
//! Every error names the file and, where one exists, the place in it. The binary maps all of them
//! to exit code 2; findings about a readable input are not errors (see [`crate::findings`]).

use std::path::{Path, PathBuf};

use crate::span::LineCol;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An input cardproof cannot process, with the file and place it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", location_prefix(file, *at))]
pub struct Error {
    pub file: PathBuf,
    pub at: Option<LineCol>,
    pub kind: ErrorKind,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    #[error("cannot read: {0}")]
    Io(#[source] std::io::Error),
    /// An output that cannot be created or written (a read-only, full or missing directory, a
    /// file where a directory is needed); the error's `file` is the final path, never a
    /// temporary name.
    #[error("cannot write: {0}")]
    Write(#[source] std::io::Error),
    #[error("no such file or directory")]
    NotFound,
    #[error("directory holds no README.md")]
    NoReadme,
    /// A file read whole is over its cap; `what` names the kind of file ("a card").
    #[error("file is {size} bytes, over the {limit}-byte limit for {what}")]
    TooLarge {
        size: u64,
        limit: u64,
        what: &'static str,
    },
    #[error("not valid UTF-8 (a model card must be UTF-8 text)")]
    NotUtf8,
    #[error("YAML syntax error in the front matter: {0}")]
    YamlSyntax(String),
    #[error("duplicate key `{key}` in the front matter (first defined on line {first_line})")]
    DuplicateKey { key: String, first_line: usize },
    #[error("front matter exceeds the {what} budget of {limit}")]
    Budget { what: &'static str, limit: usize },
    #[error("unsupported YAML in the front matter: {0}")]
    UnsupportedYaml(String),
    /// A checkpoint file breaks a rule of its format; `subject` names the tensor or key.
    #[error("{}{rule}", subject.as_ref().map(|s| format!("{s}: ")).unwrap_or_default())]
    Malformed {
        subject: Option<String>,
        rule: String,
    },
    /// A Hugging Face Hub source failed; the error's `file` is `hf:REPO@REVISION/PATH`, so the
    /// one message names the repository, the revision and the file. Boxed: it is large and rare,
    /// and every `Result` in the crate carries this type.
    #[error("{0}")]
    Hub(Box<crate::hub::HubError>),
    /// An external runner (the transformers subprocess) failed: it crashed, reported an error or
    /// answered with something other than what was asked. Never a verdict.
    #[error("{0}")]
    Runner(String),
}

impl Error {
    pub fn new(file: impl Into<PathBuf>, kind: ErrorKind) -> Self {
        Self {
            file: file.into(),
            at: None,
            kind,
        }
    }

    pub fn at(file: impl Into<PathBuf>, at: LineCol, kind: ErrorKind) -> Self {
        Self {
            file: file.into(),
            at: Some(at),
            kind,
        }
    }

    pub fn io(file: &Path, error: std::io::Error) -> Self {
        let kind = if error.kind() == std::io::ErrorKind::NotFound {
            ErrorKind::NotFound
        } else {
            ErrorKind::Io(error)
        };
        Self::new(file, kind)
    }

    /// `file` cannot be created or written: unlike [`Error::io`], worded as a write, and a
    /// missing parent is not "no such file" (the output is what is missing, not an input).
    pub fn write(file: &Path, error: std::io::Error) -> Self {
        Self::new(file, ErrorKind::Write(error))
    }

    /// A checkpoint file that breaks `rule` at `subject` (a tensor name or metadata key).
    pub fn malformed(file: &Path, subject: Option<&str>, rule: impl Into<String>) -> Self {
        Self::new(
            file,
            ErrorKind::Malformed {
                subject: subject.map(str::to_owned),
                rule: rule.into(),
            },
        )
    }

    /// An external runner's failure while measuring `model`.
    pub fn runner(model: &Path, message: impl Into<String>) -> Self {
        Self::new(model, ErrorKind::Runner(message.into()))
    }

    /// The message without the file and place prefix (those have their own JSON fields).
    pub fn message(&self) -> String {
        self.kind.to_string()
    }
}

fn location_prefix(file: &Path, at: Option<LineCol>) -> String {
    match at {
        Some(at) => format!("{}:{}:{}", file.display(), at.line, at.column),
        None => file.display().to_string(),
    }
}
