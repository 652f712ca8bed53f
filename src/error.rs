//! Errors for input cardproof cannot work with: unreadable, malformed, unsupported, mismatched,
//! asked for in a way that cannot run, or over a budget.
//!
//! Every error names the file and, where one exists, the place in it. [`ErrorKind`] says which
//! domain the error belongs to (a file's format, the card, the tokenizer, a usage mistake, inputs
//! that do not belong together, …) and [`Error`]'s predicates (`is_usage`, `is_format`, …) and
//! [`Error::kind_name`] let callers tell them apart without matching on the enum, as jiff's and
//! safetensors' errors do. The binary maps all of them to exit code 2; findings about a readable
//! input are not errors (see [`crate::findings`]).

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

/// What went wrong, by domain. Kinds with a `subject` print `{subject}: {rule}` (or just `{rule}`
/// without one); the error's `file` and place come before it.
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
    /// A file breaks a rule of its format: a safetensors or GGUF header, a shard index, a
    /// checkpoint's config.json, a positions file, a measurement or report document, a DSSE
    /// envelope or in-toto statement, a PEM key, a logit artifact, an eval text that is not
    /// UTF-8; or a file that changed while cardproof read it. `subject` names the tensor, key or
    /// field.
    #[error("{}{rule}", subject_prefix(subject))]
    Format {
        subject: Option<String>,
        rule: String,
    },
    /// The card's content cannot be used as asked: its body or fidelity block cannot be
    /// written or read back, a card path that does not name a card.
    #[error("{}{rule}", subject_prefix(subject))]
    Card {
        subject: Option<String>,
        rule: String,
    },
    /// A tokenizer.json that cannot be read as one, or a text it cannot tokenize.
    #[error("{}{rule}", subject_prefix(subject))]
    Tokenizer {
        subject: Option<String>,
        rule: String,
    },
    /// A request that cannot run as asked: a flag combination, an option out of range, a path
    /// given where another kind of path is needed, an `--out` that would need `--force`. About
    /// what the caller asked, not about a file's bytes; the error's `file` is the path or option
    /// it concerns.
    #[error("{0}")]
    Usage(String),
    /// Inputs that do not belong together: a candidate whose tokenizer differs from the
    /// reference's, an artifact made for another tokenizer or protocol, a report signed over
    /// another card. The error's `file` is the input found not to fit.
    #[error("{}{rule}", subject_prefix(subject))]
    Mismatch {
        subject: Option<String>,
        rule: String,
    },
    /// A well-formed input cardproof does not handle: an architecture, quantization method or
    /// ggml type the native runner cannot emulate, a key algorithm other than Ed25519, a report
    /// schema version from another cardproof.
    #[error("{}{rule}", subject_prefix(subject))]
    Unsupported {
        subject: Option<String>,
        rule: String,
    },
    /// cardproof's own output failed: a document that does not encode, a built-in template that
    /// does not render, a written card that does not read back as written. A bug, never the
    /// input's fault.
    #[error("{0}")]
    Internal(String),
    /// A Hugging Face Hub source failed; the error's `file` is `hf:REPO@REVISION/PATH`, so the
    /// one message names the repository, the revision and the file. Boxed: it is large and rare,
    /// and every `Result` in the crate carries this type.
    #[error("{0}")]
    Hub(Box<HubError>),
    /// A runner failed while measuring: the transformers subprocess crashed, reported an error or
    /// answered with something other than what was asked, or the native runner's tensor
    /// computation failed. Never a verdict.
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

    /// `file` breaks its format's `rule` at `subject` (a tensor name, metadata key or field).
    pub fn format(file: &Path, subject: Option<&str>, rule: impl Into<String>) -> Self {
        let (subject, rule) = parts(subject, rule);
        Self::new(file, ErrorKind::Format { subject, rule })
    }

    /// The card at `file` cannot be used as asked: `rule` at `subject` (a field), if any.
    pub fn card(file: &Path, subject: Option<&str>, rule: impl Into<String>) -> Self {
        let (subject, rule) = parts(subject, rule);
        Self::new(file, ErrorKind::Card { subject, rule })
    }

    /// The tokenizer (or the text it tokenizes) at `file` breaks `rule`.
    pub fn tokenizer(file: &Path, subject: Option<&str>, rule: impl Into<String>) -> Self {
        let (subject, rule) = parts(subject, rule);
        Self::new(file, ErrorKind::Tokenizer { subject, rule })
    }

    /// A request that cannot run as asked; `file` is the path or option it concerns (an `--out`
    /// directory, a model path, the text whose windows an option sizes).
    pub fn usage(file: &Path, message: impl Into<String>) -> Self {
        Self::new(file, ErrorKind::Usage(message.into()))
    }

    /// `file` does not belong with another input: `rule` says which and how.
    pub fn mismatch(file: &Path, subject: Option<&str>, rule: impl Into<String>) -> Self {
        let (subject, rule) = parts(subject, rule);
        Self::new(file, ErrorKind::Mismatch { subject, rule })
    }

    /// `file` is well formed but asks for something cardproof does not handle.
    pub fn unsupported(file: &Path, subject: Option<&str>, rule: impl Into<String>) -> Self {
        let (subject, rule) = parts(subject, rule);
        Self::new(file, ErrorKind::Unsupported { subject, rule })
    }

    /// cardproof failed to produce `file` for a reason of its own (a bug).
    pub fn internal(file: &Path, message: impl Into<String>) -> Self {
        Self::new(file, ErrorKind::Internal(message.into()))
    }

    /// An external runner's failure while measuring `model`.
    pub fn runner(model: &Path, message: impl Into<String>) -> Self {
        Self::new(model, ErrorKind::Runner(message.into()))
    }

    /// The message without the file and place prefix (those have their own JSON fields).
    pub fn message(&self) -> String {
        self.kind.to_string()
    }

    /// A stable snake_case name of the error's kind, for the JSON error document: one of `io`,
    /// `write`, `not_found`, `no_readme`, `too_large`, `not_utf8`, `yaml`, `duplicate_key`,
    /// `budget`, `unsupported_yaml`, `format`, `card`, `tokenizer`, `usage`, `mismatch`,
    /// `unsupported`, `internal`, `hub`, `runner`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            ErrorKind::Io(_) => "io",
            ErrorKind::Write(_) => "write",
            ErrorKind::NotFound => "not_found",
            ErrorKind::NoReadme => "no_readme",
            ErrorKind::TooLarge { .. } => "too_large",
            ErrorKind::NotUtf8 => "not_utf8",
            ErrorKind::YamlSyntax(_) => "yaml",
            ErrorKind::DuplicateKey { .. } => "duplicate_key",
            ErrorKind::Budget { .. } => "budget",
            ErrorKind::UnsupportedYaml(_) => "unsupported_yaml",
            ErrorKind::Format { .. } => "format",
            ErrorKind::Card { .. } => "card",
            ErrorKind::Tokenizer { .. } => "tokenizer",
            ErrorKind::Usage(_) => "usage",
            ErrorKind::Mismatch { .. } => "mismatch",
            ErrorKind::Unsupported { .. } => "unsupported",
            ErrorKind::Internal(_) => "internal",
            ErrorKind::Hub(_) => "hub",
            ErrorKind::Runner(_) => "runner",
        }
    }

    /// A request that cannot run as asked ([`ErrorKind::Usage`]).
    pub fn is_usage(&self) -> bool {
        matches!(self.kind, ErrorKind::Usage(_))
    }

    /// The card's content cannot be used ([`ErrorKind::Card`]).
    pub fn is_card(&self) -> bool {
        matches!(self.kind, ErrorKind::Card { .. })
    }

    /// A file breaks its format's rule ([`ErrorKind::Format`]).
    pub fn is_format(&self) -> bool {
        matches!(self.kind, ErrorKind::Format { .. })
    }

    /// A tokenizer problem ([`ErrorKind::Tokenizer`]).
    pub fn is_tokenizer(&self) -> bool {
        matches!(self.kind, ErrorKind::Tokenizer { .. })
    }

    /// Inputs that do not belong together ([`ErrorKind::Mismatch`]).
    pub fn is_mismatch(&self) -> bool {
        matches!(self.kind, ErrorKind::Mismatch { .. })
    }

    /// A well-formed input cardproof does not handle ([`ErrorKind::Unsupported`]).
    pub fn is_unsupported(&self) -> bool {
        matches!(self.kind, ErrorKind::Unsupported { .. })
    }

    /// A bug in cardproof ([`ErrorKind::Internal`]).
    pub fn is_internal(&self) -> bool {
        matches!(self.kind, ErrorKind::Internal(_))
    }

    /// A runner failed ([`ErrorKind::Runner`]).
    pub fn is_runner(&self) -> bool {
        matches!(self.kind, ErrorKind::Runner(_))
    }

    /// A Hugging Face Hub source failed ([`ErrorKind::Hub`]).
    pub fn is_hub(&self) -> bool {
        matches!(self.kind, ErrorKind::Hub(_))
    }

    /// An input exists but cannot be read ([`ErrorKind::Io`]; a missing one is
    /// [`Error::is_not_found`], an output [`Error::is_write`]).
    pub fn is_io(&self) -> bool {
        matches!(self.kind, ErrorKind::Io(_))
    }

    /// An input that does not exist ([`ErrorKind::NotFound`]).
    pub fn is_not_found(&self) -> bool {
        matches!(self.kind, ErrorKind::NotFound)
    }

    /// An output cannot be created or written ([`ErrorKind::Write`]).
    pub fn is_write(&self) -> bool {
        matches!(self.kind, ErrorKind::Write(_))
    }
}

fn parts(subject: Option<&str>, rule: impl Into<String>) -> (Option<String>, String) {
    (subject.map(str::to_owned), rule.into())
}

fn subject_prefix(subject: &Option<String>) -> String {
    subject
        .as_ref()
        .map(|s| format!("{s}: "))
        .unwrap_or_default()
}

fn location_prefix(file: &Path, at: Option<LineCol>) -> String {
    match at {
        Some(at) => format!("{}:{}:{}", file.display(), at.line, at.column),
        None => file.display().to_string(),
    }
}

/// Why a Hub source could not be used. Each message is one sentence for people; the error's
/// `file` names the repository, revision and file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    #[error("not a valid Hub source `{source_text}`: {why}")]
    BadSource { source_text: String, why: String },
    #[error(
        "repository `{repo}` not found on {endpoint} (a private or gated repository answers the \
         same without a token: set HF_TOKEN)"
    )]
    RepoNotFound { repo: String, endpoint: String },
    #[error("revision `{revision}` not found in repository `{repo}`")]
    RevisionNotFound { repo: String, revision: String },
    #[error("file not found in repository `{repo}` at revision `{revision}`")]
    EntryNotFound { repo: String, revision: String },
    #[error("access denied (HTTP {status}) to `{repo}`: {hint}")]
    Unauthorized {
        status: u16,
        repo: String,
        hint: String,
    },
    #[error("rate limited by {url} (HTTP 429/503){}", retry_text(*retry_after_secs, *attempts))]
    RateLimited {
        url: String,
        retry_after_secs: Option<u64>,
        attempts: u32,
    },
    #[error("HTTP {status} from {url} after {attempts} attempt(s){detail}")]
    Http {
        status: u16,
        url: String,
        attempts: u32,
        detail: String,
    },
    #[error("network error from {url} after {attempts} attempt(s): {message}")]
    Network {
        url: String,
        attempts: u32,
        message: String,
    },
    #[error(
        "the server ignored the HTTP Range request for bytes {start}.. and would send the whole \
         {size}-byte file; refusing to download it to read a header"
    )]
    RangeIgnored { start: u64, size: u64 },
    #[error(
        "response truncated: expected {expected} bytes, got {got} (after {attempts} attempt(s))"
    )]
    Truncated {
        expected: u64,
        got: u64,
        attempts: u32,
    },
    #[error(
        "downloaded bytes do not match the Hub's {algorithm}: expected {expected}, got {actual}; \
         the download was deleted"
    )]
    DigestMismatch {
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    #[error(
        "the cached copy {path} does not match the Hub's {algorithm} (expected {expected}, got \
         {actual}); delete it from the cache and run again"
    )]
    CachedMismatch {
        path: String,
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    #[error("offline (HF_HUB_OFFLINE is set) and {what} is not in the cache {cache}")]
    Offline { what: String, cache: String },
    #[error("{what} is {size} bytes, over the {limit}-byte limit")]
    TooLarge { what: String, size: u64, limit: u64 },
    #[error(
        "not enough free disk space in {path}: the download needs {needed} bytes and {available} \
         are free; free some space or point HF_HUB_CACHE elsewhere"
    )]
    NoSpace {
        path: String,
        needed: u64,
        available: u64,
    },
    #[error("unexpected answer from {url}: {message}")]
    BadResponse { url: String, message: String },
    #[error("Hugging Face cache {path}: {message}")]
    Cache { path: String, message: String },
}

fn retry_text(after: Option<u64>, attempts: u32) -> String {
    match after {
        Some(s) => {
            format!(" after {attempts} attempt(s); the server asks to wait {s} s before retrying")
        }
        None => format!(" after {attempts} attempt(s)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "m/model.safetensors";

    /// One error of every kind, with the predicate that should hold for it.
    fn one_of_each() -> Vec<(Error, &'static str)> {
        let f = Path::new(FILE);
        let hub = HubError::BadSource {
            source_text: "hf:".into(),
            why: "no repository".into(),
        };
        vec![
            (
                Error::new(f, ErrorKind::Io(std::io::Error::other("busy"))),
                "io",
            ),
            (Error::write(f, std::io::Error::other("full")), "write"),
            (
                Error::io(f, std::io::ErrorKind::NotFound.into()),
                "not_found",
            ),
            (Error::new(f, ErrorKind::NoReadme), "no_readme"),
            (
                Error::new(
                    f,
                    ErrorKind::TooLarge {
                        size: 9,
                        limit: 8,
                        what: "a card",
                    },
                ),
                "too_large",
            ),
            (Error::new(f, ErrorKind::NotUtf8), "not_utf8"),
            (Error::new(f, ErrorKind::YamlSyntax("x".into())), "yaml"),
            (
                Error::new(
                    f,
                    ErrorKind::DuplicateKey {
                        key: "k".into(),
                        first_line: 1,
                    },
                ),
                "duplicate_key",
            ),
            (
                Error::new(
                    f,
                    ErrorKind::Budget {
                        what: "node",
                        limit: 1,
                    },
                ),
                "budget",
            ),
            (
                Error::new(f, ErrorKind::UnsupportedYaml("anchors".into())),
                "unsupported_yaml",
            ),
            (Error::format(f, Some("w"), "bad dtype"), "format"),
            (Error::card(f, None, "no end marker"), "card"),
            (Error::tokenizer(f, None, "not JSON"), "tokenizer"),
            (Error::usage(f, "pass --force"), "usage"),
            (Error::mismatch(f, None, "another vocabulary"), "mismatch"),
            (
                Error::unsupported(f, Some("k"), "unknown method"),
                "unsupported",
            ),
            (Error::internal(f, "cannot encode"), "internal"),
            (Error::new(f, ErrorKind::Hub(Box::new(hub))), "hub"),
            (Error::runner(f, "crashed"), "runner"),
        ]
    }

    #[test]
    fn each_predicate_holds_for_its_kind_only() {
        type Predicate = fn(&Error) -> bool;
        let predicates: [(&str, Predicate); 12] = [
            ("usage", Error::is_usage),
            ("card", Error::is_card),
            ("format", Error::is_format),
            ("tokenizer", Error::is_tokenizer),
            ("mismatch", Error::is_mismatch),
            ("unsupported", Error::is_unsupported),
            ("internal", Error::is_internal),
            ("runner", Error::is_runner),
            ("hub", Error::is_hub),
            ("io", Error::is_io),
            ("not_found", Error::is_not_found),
            ("write", Error::is_write),
        ];
        for (error, name) in one_of_each() {
            for (kind, predicate) in predicates {
                assert_eq!(
                    predicate(&error),
                    kind == name,
                    "{kind} on {name}: {error:?}"
                );
            }
        }
    }

    #[test]
    fn kind_names_are_stable() {
        let names: Vec<&str> = one_of_each().iter().map(|(e, _)| e.kind_name()).collect();
        let expected: Vec<&str> = one_of_each().iter().map(|(_, n)| *n).collect();
        assert_eq!(names, expected);
        // The names the JSON error document carries: changing one breaks its readers.
        assert_eq!(
            names,
            [
                "io",
                "write",
                "not_found",
                "no_readme",
                "too_large",
                "not_utf8",
                "yaml",
                "duplicate_key",
                "budget",
                "unsupported_yaml",
                "format",
                "card",
                "tokenizer",
                "usage",
                "mismatch",
                "unsupported",
                "internal",
                "hub",
                "runner",
            ]
        );
    }

    /// The text `Malformed { subject, rule }` printed before the kinds had names.
    fn old_malformed(file: &str, at: Option<LineCol>, subject: Option<&str>, rule: &str) -> String {
        let place = match at {
            Some(at) => format!("{file}:{}:{}", at.line, at.column),
            None => file.to_owned(),
        };
        match subject {
            Some(s) => format!("{place}: {s}: {rule}"),
            None => format!("{place}: {rule}"),
        }
    }

    #[test]
    fn messages_are_unchanged_by_the_kinds() {
        let f = Path::new(FILE);
        type Make = fn(&Path, Option<&str>, String) -> Error;
        let subject_kinds: [Make; 5] = [
            |f, s, r| Error::format(f, s, r),
            |f, s, r| Error::card(f, s, r),
            |f, s, r| Error::tokenizer(f, s, r),
            |f, s, r| Error::mismatch(f, s, r),
            |f, s, r| Error::unsupported(f, s, r),
        ];
        for make in subject_kinds {
            let e = make(f, Some("tensor `w`"), "dtype F8 is unknown".into());
            assert_eq!(
                e.to_string(),
                old_malformed(FILE, None, Some("tensor `w`"), "dtype F8 is unknown")
            );
            assert_eq!(e.message(), "tensor `w`: dtype F8 is unknown");
            let e = make(f, None, "too short".into());
            assert_eq!(e.to_string(), old_malformed(FILE, None, None, "too short"));
            let at = LineCol { line: 3, column: 7 };
            let mut e = make(f, None, "not closed".into());
            e.at = Some(at);
            assert_eq!(
                e.to_string(),
                old_malformed(FILE, Some(at), None, "not closed")
            );
        }
        // Usage and internal errors were `Malformed` with no subject: the message as it was.
        let rule = "is a file, not a directory: --out names the directory the outputs go into";
        assert_eq!(
            Error::usage(Path::new("out"), rule).to_string(),
            old_malformed("out", None, None, rule)
        );
        assert_eq!(
            Error::internal(Path::new("out/report.json"), "cannot encode: x").to_string(),
            "out/report.json: cannot encode: x"
        );
        // A subject folded into a usage message prints as the subject did.
        assert_eq!(
            Error::usage(
                Path::new("README.md"),
                "reference revision: `main` is not a full 40-hex commit hash (lowercase)"
            )
            .to_string(),
            old_malformed(
                "README.md",
                None,
                Some("reference revision"),
                "`main` is not a full 40-hex commit hash (lowercase)"
            )
        );
        // The kinds that kept their names print as before.
        assert_eq!(
            Error::runner(f, "exited with 1").to_string(),
            format!("{FILE}: exited with 1")
        );
        assert_eq!(
            Error::new(f, ErrorKind::NoReadme).to_string(),
            format!("{FILE}: directory holds no README.md")
        );
    }

    /// An `--out` that needs `--force` is a usage mistake, not a malformed file: nothing about
    /// the directory's bytes is wrong, the request must change.
    #[test]
    fn usage_mistakes_are_not_malformed_file_errors() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::write(out.join("notes.txt"), "mine").unwrap();
        let options = crate::outset::SetOptions {
            kind: crate::outset::Kind::Verify,
            force: false,
            models: &[],
        };
        let Err(e) = crate::outset::OutputSet::create(&out, &options) else {
            panic!("an --out holding other files opened without --force");
        };
        assert!(e.is_usage(), "{e:?}");
        assert!(!e.is_format(), "{e:?}");
        assert_eq!(e.kind_name(), "usage");
        assert!(e.to_string().contains("--force"), "{e}");

        // An option out of range: a context length no window fits in.
        let stream = crate::runner::tokens::TokenStream {
            text_bytes: 3,
            ..crate::runner::tokens::TokenStream::of_ids(vec![1, 2, 3], String::new())
        };
        let e = crate::runner::tokens::windows(
            &stream,
            Path::new("eval.txt"),
            1,
            crate::runner::tokens::Bos::None,
            None,
        )
        .unwrap_err();
        assert!(e.is_usage() && !e.is_format(), "{e:?}");
    }
}
