//! Hugging Face Hub sources: `hf:ORG/NAME[@REVISION]` wherever a path is accepted.
//!
//! A thin client of our own on `ureq` (blocking, rustls) instead of `hf-hub`: hf-hub 0.5 cannot
//! see the Hub's per-file SHA-256 and 1.0 is async with ~240 crates (notes 1.4/1.5). What this
//! module does, and why:
//!
//! - [`HfSource`] parses and validates the source, so a bad repo id never reaches a URL.
//! - [`HubConfig::from_env`] reads the variables other Hugging Face tools read (`HF_ENDPOINT`,
//!   `HF_TOKEN`, `HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`), so a user's setup carries over.
//! - [`client::Client`] talks HTTP: model info with per-file LFS digests, Range reads of headers,
//!   resumable downloads; bounded retries; the token only ever goes to the endpoint's own origin.
//! - [`cache`] is the standard cache layout, so files another tool downloaded are reused and ours
//!   are reused by them; nothing is placed in a snapshot before its digest was checked.
//! - [`remote`] inspects a repository from header bytes alone; [`check`] is `cardproof check`.
//! - [`snapshot`] materializes a pinned snapshot for the verbs that need whole files.

pub mod cache;
pub mod check;
pub mod client;
pub mod remote;
pub mod snapshot;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

pub use client::{Client, RepoInfo, Sibling};

/// The public Hub, used when `HF_ENDPOINT` is unset.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The prefix that marks a Hub source where a path is expected.
pub const PREFIX: &str = "hf:";
/// Revision used when the source names none (the Hub's default branch).
pub const DEFAULT_REVISION: &str = "main";

/// A repository on the Hub and the revision asked for (a branch, a tag or a commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfSource {
    pub repo: String,
    pub revision: String,
}

/// A Hub source as given and the commit it resolved to: what a measurement and a report record
/// about a model that came from the Hub.
#[derive(
    Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct HubPin {
    pub repo: String,
    /// The revision as given (a branch, a tag or a commit).
    pub revision: String,
    /// The 40-hex commit it resolved to, whose files were used.
    pub commit: String,
}

impl HfSource {
    /// This source as given, pinned at `commit`.
    pub fn pin(&self, commit: &str) -> HubPin {
        HubPin {
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            commit: commit.to_owned(),
        }
    }

    /// `Some` when `path` is spelled as a Hub source (`hf:...`), with the parse result.
    pub fn from_path(path: &Path) -> Option<Result<HfSource>> {
        let text = path.to_str()?;
        text.starts_with(PREFIX).then(|| HfSource::parse(text))
    }

    /// A bare `ORG/NAME[@REVISION]` (as `huggingface-cli` users type it) read as `hf:`: only
    /// where no such local path exists and the text is a valid Hub source; `None` otherwise (the
    /// path stays a path, and a missing one is reported as missing).
    pub fn bare(path: &Path) -> Option<HfSource> {
        let text = path.to_str()?;
        let repo = text.split('@').next()?;
        if text.starts_with(PREFIX)
            || repo.matches('/').count() != 1
            || text.starts_with(['.', '/', '~'])
            || std::fs::symlink_metadata(path).is_ok()
        {
            return None;
        }
        HfSource::parse(&format!("{PREFIX}{text}")).ok()
    }

    /// Parse `hf:ORG/NAME[@REVISION]`. Repo ids follow the Hub's rules (letters, digits, `-`,
    /// `_`, `.`; no leading `-`/`.`, no `--` or `..`; at most 96 characters); revisions are git ref
    /// names or commits without `..`, spaces or control characters.
    pub fn parse(text: &str) -> Result<HfSource> {
        let bad = |why: String| {
            Error::new(
                text,
                ErrorKind::Hub(Box::new(HubError::BadSource {
                    source_text: text.to_owned(),
                    why,
                })),
            )
        };
        let rest = text
            .strip_prefix(PREFIX)
            .ok_or_else(|| bad("a Hub source starts with `hf:`".into()))?;
        let (repo, revision) = match rest.split_once('@') {
            Some((repo, rev)) => (repo, Some(rev)),
            None => (rest, None),
        };
        validate_repo(repo).map_err(bad)?;
        let revision = match revision {
            Some(rev) => {
                validate_revision(rev).map_err(bad)?;
                rev.to_owned()
            }
            None => DEFAULT_REVISION.to_owned(),
        };
        Ok(HfSource {
            repo: repo.to_owned(),
            revision,
        })
    }

    /// The same repository at another revision (e.g. the pinned commit).
    pub fn at(&self, revision: &str) -> HfSource {
        HfSource {
            repo: self.repo.clone(),
            revision: revision.to_owned(),
        }
    }

    /// How errors and outputs name a file of this source: `hf:ORG/NAME@REV/PATH`.
    pub fn display_path(&self, file: Option<&str>) -> PathBuf {
        match file {
            Some(f) => PathBuf::from(format!("{self}/{f}")),
            None => PathBuf::from(self.to_string()),
        }
    }

    /// A Hub error about `file` (or the repository) of this source.
    pub fn error(&self, file: Option<&str>, error: HubError) -> Error {
        Error::new(self.display_path(file), ErrorKind::Hub(Box::new(error)))
    }
}

impl std::fmt::Display for HfSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PREFIX}{}@{}", self.repo, self.revision)
    }
}

fn validate_name(part: &str, what: &str) -> std::result::Result<(), String> {
    if part.is_empty() {
        return Err(format!(
            "the {what} is empty (expected hf:ORG/NAME[@REVISION])"
        ));
    }
    if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "the {what} `{part}` holds `{}`; only letters, digits, `-`, `_` and `.` are allowed",
            c.escape_default()
        ));
    }
    if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
        return Err(format!(
            "the {what} `{part}` starts or ends with `-` or `.`"
        ));
    }
    if part.contains("--") || part.contains("..") {
        return Err(format!("the {what} `{part}` contains `--` or `..`"));
    }
    Ok(())
}

/// The Hub's repo id rules; `--` is refused because the cache folder name joins parts with it.
pub fn validate_repo(repo: &str) -> std::result::Result<(), String> {
    if repo.len() > 96 {
        return Err(format!("the repo id is {} characters, over 96", repo.len()));
    }
    match repo.split_once('/') {
        Some((org, name)) => {
            validate_name(org, "organization")?;
            validate_name(name, "repository name")?;
        }
        None => validate_name(repo, "repository name")?,
    }
    Ok(())
}

/// A git ref name or commit: no `..`, no leading `/` or `-`, printable ASCII without spaces
/// or the characters git refuses (`~^:?*[\`).
pub fn validate_revision(rev: &str) -> std::result::Result<(), String> {
    if rev.is_empty() {
        return Err("the revision after `@` is empty".into());
    }
    if rev.len() > 255 {
        return Err("the revision is over 255 characters".into());
    }
    if let Some(c) = rev.chars().find(|c| {
        !c.is_ascii_graphic() || matches!(c, '~' | '^' | ':' | '?' | '*' | '[' | '\\' | '@')
    }) {
        return Err(format!(
            "the revision `{rev}` holds `{}`, which a git ref cannot",
            c.escape_default()
        ));
    }
    if rev.contains("..") || rev.starts_with(['/', '-', '.']) || rev.ends_with('/') {
        return Err(format!("the revision `{rev}` is not a valid git ref"));
    }
    Ok(())
}

/// Whether `rev` is a full commit hash (40 lowercase hex digits).
pub fn is_commit(rev: &str) -> bool {
    rev.len() == 40 && rev.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Settings from the environment, read once per command.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Base URL without a trailing slash (`HF_ENDPOINT`, default [`DEFAULT_ENDPOINT`]).
    pub endpoint: String,
    /// `HF_TOKEN`, else the token file `huggingface-cli login` writes (`HF_TOKEN_PATH` or
    /// `$HF_HOME/token`). Sent only to the endpoint's origin.
    pub token: Option<String>,
    /// The hub cache: `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`, `$HF_HOME/hub`,
    /// `$XDG_CACHE_HOME/huggingface/hub` or `~/.cache/huggingface/hub`.
    pub cache_dir: PathBuf,
    /// `HF_HUB_OFFLINE` is set to a true value: never touch the network.
    pub offline: bool,
    /// Connect, response and per-read timeout (`CARDPROOF_HTTP_TIMEOUT_SECS`, default 30).
    pub timeout: Duration,
    /// A body arriving slower than this many bytes/s, averaged over `speed_window`, is aborted
    /// (and retried, resuming a download): `CARDPROOF_HTTP_MIN_BYTES_PER_SEC`, default 10,240;
    /// 0 turns the rule off.
    pub min_speed: u64,
    /// The window of `min_speed` (`CARDPROOF_HTTP_SPEED_WINDOW_SECS`, default 60).
    pub speed_window: Duration,
    /// Retries after the first attempt for transient failures (`CARDPROOF_HTTP_RETRIES`, default
    /// 4).
    pub retries: u32,
    /// First backoff delay; doubles per retry up to 8 s.
    pub backoff: Duration,
    /// The longest `Retry-After` honoured; a longer one fails at once with the wait named.
    pub max_retry_after: Duration,
}

impl HubConfig {
    pub fn from_env() -> HubConfig {
        Self::from_lookup(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// [`HubConfig::from_env`] over any variable lookup (tests pass a map).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> HubConfig {
        let home = var("HOME")
            .or_else(|| var("USERPROFILE"))
            .map(PathBuf::from);
        let hf_home = var("HF_HOME").map(PathBuf::from).or_else(|| {
            var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".cache")))
                .map(|c| c.join("huggingface"))
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .map(PathBuf::from)
            .or_else(|| hf_home.as_ref().map(|h| h.join("hub")))
            .unwrap_or_else(|| PathBuf::from(".cache/huggingface/hub"));
        let token = var("HF_TOKEN")
            .or_else(|| var("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| {
                let path = var("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .or_else(|| hf_home.as_ref().map(|h| h.join("token")))?;
                let text = std::fs::read_to_string(path).ok()?;
                Some(text.trim().to_owned()).filter(|t| !t.is_empty())
            });
        let truthy = |v: Option<String>| {
            v.is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "on" | "yes" | "true"
                )
            })
        };
        let secs = |k: &str, default: u64| {
            var(k)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0)
                .map_or(Duration::from_secs(default), Duration::from_secs_f64)
        };
        HubConfig {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned())
                .trim_end_matches('/')
                .to_owned(),
            token,
            cache_dir,
            offline: truthy(var("HF_HUB_OFFLINE")),
            timeout: secs("CARDPROOF_HTTP_TIMEOUT_SECS", 30),
            min_speed: var("CARDPROOF_HTTP_MIN_BYTES_PER_SEC")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(10 * 1024),
            speed_window: secs("CARDPROOF_HTTP_SPEED_WINDOW_SECS", 60),
            retries: var("CARDPROOF_HTTP_RETRIES")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(4)
                .min(20),
            backoff: Duration::from_millis(
                var("CARDPROOF_HTTP_BACKOFF_MS")
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(500)
                    .min(60_000),
            ),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

pub use crate::error::HubError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_validate() {
        let s = HfSource::parse("hf:Qwen/Qwen3-8B@refs/pr/1").unwrap();
        assert_eq!(
            (s.repo.as_str(), s.revision.as_str()),
            ("Qwen/Qwen3-8B", "refs/pr/1")
        );
        assert_eq!(HfSource::parse("hf:gpt2").unwrap().revision, "main");
        assert_eq!(
            HfSource::parse("hf:a/b")
                .unwrap()
                .display_path(Some("x/y.json")),
            PathBuf::from("hf:a/b@main/x/y.json")
        );
        for bad in [
            "hf:",
            "hf:/x",
            "hf:a/b/c",
            "hf:a b/c",
            "hf:-a/b",
            "hf:a/b.",
            "hf:a--b/c",
            "hf:a/b@",
            "hf:a/b@x..y",
            "hf:a/b@-x",
            "hf:a/b@x y",
            "hf:a/b@x:y",
        ] {
            assert!(HfSource::parse(bad).is_err(), "{bad}");
        }
        assert!(HfSource::from_path(Path::new("./model")).is_none());
        assert!(is_commit("0123456789abcdef0123456789abcdef01234567"));
        assert!(!is_commit("main"));
    }

    #[test]
    fn config_follows_the_huggingface_hub_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let c = HubConfig::from_lookup(env(&[("HOME", "/h")]));
        assert_eq!(c.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(c.cache_dir, PathBuf::from("/h/.cache/huggingface/hub"));
        assert!(!c.offline && c.token.is_none());
        let c = HubConfig::from_lookup(env(&[
            ("HOME", "/h"),
            ("HF_HOME", "/hf"),
            ("HF_ENDPOINT", "http://127.0.0.1:9/"),
            ("HF_HUB_OFFLINE", "true"),
            ("HF_TOKEN", "hf_x"),
            ("CARDPROOF_HTTP_TIMEOUT_SECS", "1.5"),
        ]));
        assert_eq!(c.cache_dir, PathBuf::from("/hf/hub"));
        assert_eq!(c.endpoint, "http://127.0.0.1:9");
        assert!(c.offline);
        assert_eq!(c.token.as_deref(), Some("hf_x"));
        assert_eq!(c.timeout, Duration::from_millis(1500));
        assert_eq!(
            (c.min_speed, c.speed_window),
            (10 * 1024, Duration::from_secs(60))
        );
        let c = HubConfig::from_lookup(env(&[
            ("CARDPROOF_HTTP_MIN_BYTES_PER_SEC", "0"),
            ("CARDPROOF_HTTP_SPEED_WINDOW_SECS", "5"),
        ]));
        assert_eq!((c.min_speed, c.speed_window), (0, Duration::from_secs(5)));
        let c = HubConfig::from_lookup(env(&[
            ("HF_HOME", "/hf"),
            ("HF_HUB_CACHE", "/cache"),
            ("HF_HUB_OFFLINE", "0"),
        ]));
        assert_eq!(c.cache_dir, PathBuf::from("/cache"));
        assert!(!c.offline);
    }
}
