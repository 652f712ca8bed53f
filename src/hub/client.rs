//! The Hub's HTTP API on a blocking `ureq` agent.
//!
//! Redirects are followed here rather than by `ureq` so the rule "the token goes only to the
//! endpoint's origin" is ours and visible: the Hub answers `resolve` for LFS files with a 302 to
//! a CDN host, which must never see the user's token. Transient failures (connection errors,
//! timeouts, 5xx, 429/503 with `Retry-After`, truncated bodies) are retried a bounded number of
//! times with exponential backoff; everything else fails at once with a message that says what to
//! do. Every body byte read is counted, so `check` can report what it fetched.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use ureq::http::{Response, StatusCode};

use super::{HfSource, HubConfig, HubError, is_commit};
use crate::error::{Error, Result};

/// Model info bodies are JSON with one entry per file; 64 MiB is far beyond any real repo's.
const MAX_INFO_BYTES: u64 = 64 << 20;
/// Redirect hops followed per request (the Hub uses one or two).
const MAX_REDIRECTS: u32 = 5;
/// How far into a file we read and discard when a server ignores Range and the wanted bytes do
/// not start at 0 (a header at offset 8 is fine; a tensor in the middle of a shard is not).
const MAX_SKIP_WITHOUT_RANGE: u64 = 1 << 20;

/// `GET /api/models/{repo}/revision/{rev}?blobs=true`: the commit and every file.
#[derive(Debug, Clone, Deserialize)]
pub struct RepoInfo {
    /// The commit the revision resolved to.
    pub sha: String,
    #[serde(default)]
    pub siblings: Vec<Sibling>,
}

/// One file of a repository, as the Hub lists it.
#[derive(Debug, Clone, Deserialize)]
pub struct Sibling {
    pub rfilename: String,
    #[serde(default)]
    pub size: Option<u64>,
    /// The git blob id (SHA-1 of `blob <len>\0<bytes>`); for an LFS file, of its pointer.
    #[serde(rename = "blobId", default)]
    pub blob_id: Option<String>,
    #[serde(default)]
    pub lfs: Option<Lfs>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Lfs {
    /// SHA-256 of the file's content: what `cardproof hash` computes for it.
    pub sha256: String,
    pub size: u64,
    #[serde(rename = "pointerSize", default)]
    pub pointer_size: Option<u64>,
}

impl Sibling {
    /// The file's size (the LFS object's for LFS files).
    pub fn file_size(&self) -> u64 {
        self.lfs.as_ref().map_or(self.size.unwrap_or(0), |l| l.size)
    }

    /// The blob's name in the cache: the SHA-256 for LFS files, the git blob id otherwise (what
    /// `huggingface_hub` uses, its ETag).
    pub fn blob_name(&self) -> &str {
        self.lfs
            .as_ref()
            .map(|l| l.sha256.as_str())
            .or(self.blob_id.as_deref())
            .unwrap_or_default()
    }

    pub fn sha256(&self) -> Option<&str> {
        self.lfs.as_ref().map(|l| l.sha256.as_str())
    }
}

impl RepoInfo {
    pub fn sibling(&self, path: &str) -> Option<&Sibling> {
        self.siblings.iter().find(|s| s.rfilename == path)
    }

    /// Saturating: the sizes are the server's claims.
    pub fn total_size(&self) -> u64 {
        self.siblings
            .iter()
            .fold(0u64, |t, s| t.saturating_add(s.file_size()))
    }

    /// Refuse what would be unsafe to use as a cache name or a path: a commit that is not 40
    /// hex, a file path that could leave the snapshot, a digest that is not hex.
    fn validate(&self, url: &str) -> std::result::Result<(), HubError> {
        let bad = |message: String| HubError::BadResponse {
            url: url.to_owned(),
            message,
        };
        if !is_commit(&self.sha) {
            return Err(bad(format!("`sha` is `{}`, not a 40-hex commit", self.sha)));
        }
        for s in &self.siblings {
            let name = &s.rfilename;
            if name.is_empty()
                || name.starts_with('/')
                || name.contains('\\')
                || name.contains('\0')
                || name
                    .split('/')
                    .any(|p| p.is_empty() || p == "." || p == "..")
            {
                return Err(bad(format!(
                    "file name `{}` is not a safe relative path",
                    name.escape_default()
                )));
            }
            let hex = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| b.is_ascii_hexdigit());
            if let Some(l) = &s.lfs {
                if !hex(&l.sha256, 64) {
                    return Err(bad(format!("`{name}`: lfs.sha256 is not 64 hex digits")));
                }
            } else {
                if s.size.is_none() {
                    return Err(bad(format!(
                        "`{name}` has no size (was ?blobs=true honoured?)"
                    )));
                }
                if !s.blob_id.as_deref().is_some_and(|b| hex(b, 40)) {
                    return Err(bad(format!("`{name}` has no 40-hex blobId")));
                }
            }
        }
        Ok(())
    }
}

/// The HTTP side of the Hub, one per command.
pub struct Client {
    agent: ureq::Agent,
    config: HubConfig,
    fetched: AtomicU64,
}

/// What a request is about, for messages: the source and the file.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    source: &'a HfSource,
    file: Option<&'a str>,
}

impl Ctx<'_> {
    fn err(&self, e: HubError) -> Error {
        self.source.error(self.file, e)
    }
}

/// A failure worth another attempt, with what to say if none is left.
enum Attempt {
    Retry(HubError, Option<Duration>),
    Fail(HubError),
}

impl Client {
    pub fn new(config: HubConfig) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_connect(Some(config.timeout))
            .timeout_recv_response(Some(config.timeout))
            .timeout_per_read(Some(config.timeout))
            .user_agent(format!("cardproof/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            agent,
            config,
            fetched: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// Body bytes read from the network so far (every request, errors included).
    pub fn bytes_fetched(&self) -> u64 {
        self.fetched.load(Ordering::Relaxed)
    }

    fn offline(&self, source: &HfSource, file: Option<&str>, what: String) -> Error {
        source.error(
            file,
            HubError::Offline {
                what,
                cache: self.config.cache_dir.display().to_string(),
            },
        )
    }

    /// The file URL the Hub serves (`{endpoint}/{repo}/resolve/{rev}/{path}`).
    pub fn resolve_url(&self, repo: &str, revision: &str, path: &str) -> String {
        format!(
            "{}/{repo}/resolve/{}/{}",
            self.config.endpoint,
            encode(revision, false),
            encode(path, true)
        )
    }

    /// Model info at `source.revision`, with sizes, blob ids and LFS digests of every file.
    pub fn repo_info(&self, source: &HfSource) -> Result<RepoInfo> {
        if self.config.offline {
            return Err(self.offline(
                source,
                None,
                "the repository's file list (model info)".into(),
            ));
        }
        let url = format!(
            "{}/api/models/{}/revision/{}?blobs=true",
            self.config.endpoint,
            source.repo,
            encode(&source.revision, false)
        );
        let ctx = Ctx { source, file: None };
        let attempts = self.config.retries + 1;
        let mut last = None;
        for attempt in 1..=attempts {
            let response = self.send(ctx, &url, None)?;
            let mut body = Vec::new();
            match self.read_limited(response, MAX_INFO_BYTES + 1, &mut body) {
                Ok(()) => {}
                Err(e) => {
                    last = Some(network(&url, attempt, &e));
                    self.pause(attempt, None);
                    continue;
                }
            }
            if body.len() as u64 > MAX_INFO_BYTES {
                return Err(ctx.err(HubError::TooLarge {
                    what: "the model info answer".into(),
                    size: body.len() as u64,
                    limit: MAX_INFO_BYTES,
                }));
            }
            let info: RepoInfo = serde_json::from_slice(&body).map_err(|e| {
                ctx.err(HubError::BadResponse {
                    url: url.clone(),
                    message: format!("not model info JSON: {e}"),
                })
            })?;
            info.validate(&url).map_err(|e| ctx.err(e))?;
            return Ok(info);
        }
        Err(ctx.err(last.unwrap_or(HubError::Network {
            url,
            attempts,
            message: "no attempt made".into(),
        })))
    }

    /// Bytes `[start, end)` of `path` in a repository pinned at a commit, of a file of
    /// `file_size` bytes. A server that ignores Range (200 instead of 206) is tolerated only while
    /// the bytes before `start` are few: we read the prefix we need and close the connection.
    pub fn read_range(
        &self,
        source: &HfSource,
        path: &str,
        start: u64,
        end: u64,
        file_size: u64,
    ) -> Result<Vec<u8>> {
        let ctx = Ctx {
            source,
            file: Some(path),
        };
        if self.config.offline {
            return Err(self.offline(source, Some(path), format!("`{path}`")));
        }
        let end = end.min(file_size);
        if start >= end {
            return Ok(Vec::new());
        }
        let url = self.resolve_url(&source.repo, &source.revision, path);
        let want = end - start;
        let attempts = self.config.retries + 1;
        let mut last = None;
        for attempt in 1..=attempts {
            let response = self.send(ctx, &url, Some((start, Some(end - 1))))?;
            let status = response.status();
            let mut out = Vec::new();
            let result = if status == StatusCode::PARTIAL_CONTENT {
                match content_range_start(&response) {
                    Some(s) if s != start => {
                        return Err(ctx.err(HubError::BadResponse {
                            url,
                            message: format!("asked for bytes from {start}, got bytes from {s}"),
                        }));
                    }
                    _ => self.read_limited(response, want, &mut out),
                }
            } else {
                // 200: the whole file is coming. Read up to `end` and stop.
                if start > MAX_SKIP_WITHOUT_RANGE {
                    return Err(ctx.err(HubError::RangeIgnored {
                        start,
                        size: file_size,
                    }));
                }
                self.read_limited(response, end, &mut out).and_then(|()| {
                    if out.len() as u64 == end {
                        out.drain(..start as usize);
                        Ok(())
                    } else {
                        Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!(
                                "the body (Range ignored) ended after {} of the {end} bytes needed",
                                out.len()
                            ),
                        ))
                    }
                })
            };
            match result {
                Ok(()) if out.len() as u64 == want => return Ok(out),
                Ok(()) => {
                    last = Some(HubError::Truncated {
                        expected: want,
                        got: out.len() as u64,
                        attempts: attempt,
                    });
                }
                Err(e) => last = Some(network(&url, attempt, &e)),
            }
            if attempt < attempts {
                self.pause(attempt, None);
            }
        }
        Err(ctx.err(last.expect("at least one attempt")))
    }

    /// Download `path` into `dest` (the blob's `.incomplete` file), resuming from what `dest`
    /// already holds, until it holds `size` bytes. `progress` gets the bytes held so far. The caller
    /// verifies the digest before anything is renamed into place.
    pub fn download(
        &self,
        source: &HfSource,
        path: &str,
        size: u64,
        dest: &std::path::Path,
        progress: &dyn Fn(u64),
    ) -> Result<()> {
        let ctx = Ctx {
            source,
            file: Some(path),
        };
        if self.config.offline {
            return Err(self.offline(source, Some(path), format!("`{path}`")));
        }
        let url = self.resolve_url(&source.repo, &source.revision, path);
        let io_err = |e: std::io::Error| {
            ctx.err(HubError::Cache {
                path: dest.display().to_string(),
                message: e.to_string(),
            })
        };
        let attempts = self.config.retries + 1;
        let mut last = None;
        for attempt in 1..=attempts {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dest)
                .map_err(io_err)?;
            let mut have = file.metadata().map_err(io_err)?.len();
            if have > size {
                file.set_len(0).map_err(io_err)?;
                have = 0;
            }
            if have == size {
                return Ok(());
            }
            let dir = dest
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            check_free_space(dir, size - have).map_err(|e| ctx.err(e))?;
            progress(have);
            let range = (have > 0).then_some((have, None));
            let response = self.send(ctx, &url, range)?;
            if have > 0 {
                let resumed = response.status() == StatusCode::PARTIAL_CONTENT
                    && content_range_start(&response) == Some(have);
                if !resumed {
                    // The server sent the file from the start: begin again.
                    file.set_len(0).map_err(io_err)?;
                    have = 0;
                    progress(0);
                }
            }
            // A body that disagrees with the Hub's listing is another file: its bytes could never
            // pass the digest check, and a partial download of it is worth nothing.
            if let Some(message) = declared_size_mismatch(&response, size, have) {
                drop(file);
                let _ = std::fs::remove_file(dest);
                return Err(ctx.err(HubError::BadResponse { url, message }));
            }
            // At most the declared size is ever written, whatever the server sends.
            let mut reader = response.into_body().into_reader().take(size - have);
            let mut buf = vec![0u8; 1 << 16];
            let mut speed = self.speed_guard();
            let outcome = loop {
                match reader.read(&mut buf) {
                    Ok(0) => break Ok(()),
                    Ok(n) => {
                        self.fetched.fetch_add(n as u64, Ordering::Relaxed);
                        if let Err(e) = file.write_all(&buf[..n]) {
                            // A full disk or a failing cache: the partial file only holds space.
                            drop(file);
                            let _ = std::fs::remove_file(dest);
                            return Err(io_err(e));
                        }
                        have += n as u64;
                        progress(have);
                        if let Err(e) = speed.update(n as u64) {
                            break Err(e);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            // A slow or cut transfer keeps its bytes: the next attempt (or run) resumes them.
            file.flush().map_err(io_err)?;
            match outcome {
                Ok(()) if have == size => return Ok(()),
                Ok(()) => {
                    last = Some(HubError::Truncated {
                        expected: size,
                        got: have,
                        attempts: attempt,
                    });
                }
                Err(e) => last = Some(network(&url, attempt, &e)),
            }
            if attempt < attempts {
                self.pause(attempt, None);
            }
        }
        Err(ctx.err(last.expect("at least one attempt")))
    }

    /// Read at most `limit` body bytes into `out`, counting them.
    fn read_limited(
        &self,
        response: Response<ureq::Body>,
        limit: u64,
        out: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let mut reader = response.into_body().into_reader().take(limit);
        let mut buf = [0u8; 16 * 1024];
        let mut speed = self.speed_guard();
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    self.fetched.fetch_add(n as u64, Ordering::Relaxed);
                    out.extend_from_slice(&buf[..n]);
                    speed.update(n as u64)?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn speed_guard(&self) -> SpeedGuard {
        SpeedGuard::new(self.config.min_speed, self.config.speed_window)
    }

    fn pause(&self, attempt: u32, retry_after: Option<Duration>) {
        let delay = retry_after.unwrap_or_else(|| {
            let factor = 1u32 << (attempt - 1).min(6);
            (self.config.backoff * factor).min(Duration::from_secs(8))
        });
        std::thread::sleep(delay);
    }

    /// GET `url` (with an optional Range), following redirects and retrying transient failures.
    /// Returns a 2xx response whose body is unread.
    fn send(
        &self,
        ctx: Ctx<'_>,
        url: &str,
        range: Option<(u64, Option<u64>)>,
    ) -> Result<Response<ureq::Body>> {
        let attempts = self.config.retries + 1;
        let mut last = None;
        for attempt in 1..=attempts {
            match self.send_once(ctx, url, range, attempt) {
                Ok(r) => return Ok(r),
                Err(Attempt::Fail(e)) => return Err(ctx.err(e)),
                Err(Attempt::Retry(e, wait)) => {
                    last = Some(e);
                    if attempt < attempts {
                        self.pause(attempt, wait);
                    }
                }
            }
        }
        Err(ctx.err(last.expect("at least one attempt")))
    }

    fn send_once(
        &self,
        ctx: Ctx<'_>,
        url: &str,
        range: Option<(u64, Option<u64>)>,
        attempt: u32,
    ) -> std::result::Result<Response<ureq::Body>, Attempt> {
        let endpoint_origin = origin(&self.config.endpoint);
        let mut current = url.to_owned();
        for _hop in 0..=MAX_REDIRECTS {
            let mut request = self.agent.get(&current);
            if let Some((start, end)) = range {
                let end = end.map(|e| e.to_string()).unwrap_or_default();
                request = request.header("Range", format!("bytes={start}-{end}"));
            }
            // The token goes to the endpoint's origin only, never to a redirect target elsewhere.
            if let Some(token) = &self.config.token
                && origin(&current) == endpoint_origin
            {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            let response = match request.call() {
                Ok(r) => r,
                Err(e) => {
                    return Err(Attempt::Retry(
                        HubError::Network {
                            url: current.clone(),
                            attempts: attempt,
                            message: e.to_string(),
                        },
                        None,
                    ));
                }
            };
            let status = response.status().as_u16();
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            match status {
                200..=299 => return Ok(response),
                301 | 302 | 303 | 307 | 308 => {
                    let Some(location) = header("location") else {
                        return Err(Attempt::Fail(HubError::BadResponse {
                            url: current,
                            message: format!("HTTP {status} without a Location header"),
                        }));
                    };
                    current = join_location(&current, &location).ok_or_else(|| {
                        Attempt::Fail(HubError::BadResponse {
                            url: current.clone(),
                            message: format!("redirect to an unusable location `{location}`"),
                        })
                    })?;
                    continue;
                }
                _ => {}
            }
            let code = header("x-error-code");
            let message = header("x-error-message");
            let repo = ctx.source.repo.clone();
            let revision = ctx.source.revision.clone();
            let fail = match (status, code.as_deref()) {
                (_, Some("RepoNotFound")) => HubError::RepoNotFound {
                    repo,
                    endpoint: self.config.endpoint.clone(),
                },
                (_, Some("RevisionNotFound")) => HubError::RevisionNotFound { repo, revision },
                (_, Some("EntryNotFound")) => HubError::EntryNotFound { repo, revision },
                (401 | 403, code) => HubError::Unauthorized {
                    status,
                    repo,
                    hint: match (&self.config.token, code) {
                        (None, Some("GatedRepo")) => {
                            "the repository is gated: accept its conditions on the Hub and set \
                             HF_TOKEN to a token of that account"
                                .into()
                        }
                        (None, _) => {
                            "it is gated or private: set HF_TOKEN to a token with access".into()
                        }
                        (Some(_), _) => {
                            "the token in HF_TOKEN (or the saved login) has no access to it".into()
                        }
                    },
                },
                (404, _) => HubError::Http {
                    status,
                    url: current.clone(),
                    attempts: attempt,
                    detail: ": the repository, the revision or the file does not exist".into(),
                },
                (429 | 503, _) => {
                    let after = header("retry-after").and_then(|v| v.trim().parse::<u64>().ok());
                    let e = HubError::RateLimited {
                        url: current.clone(),
                        retry_after_secs: after,
                        attempts: attempt,
                    };
                    return match after.map(Duration::from_secs) {
                        Some(wait) if wait > self.config.max_retry_after => Err(Attempt::Fail(e)),
                        wait => Err(Attempt::Retry(e, wait)),
                    };
                }
                (500..=599, _) => {
                    return Err(Attempt::Retry(
                        HubError::Http {
                            status,
                            url: current.clone(),
                            attempts: attempt,
                            detail: message.map(|m| format!(": {m}")).unwrap_or_default(),
                        },
                        None,
                    ));
                }
                _ => HubError::Http {
                    status,
                    url: current.clone(),
                    attempts: attempt,
                    detail: message.map(|m| format!(": {m}")).unwrap_or_default(),
                },
            };
            return Err(Attempt::Fail(fail));
        }
        Err(Attempt::Fail(HubError::BadResponse {
            url: url.to_owned(),
            message: format!("more than {MAX_REDIRECTS} redirects"),
        }))
    }
}

/// Aborts a body that arrives slower than `min_rate` bytes/s on average over the last `window`
/// (curl's low-speed limit). The per-read timeout catches a server that stops, not one that
/// trickles a byte every half second; and one deadline per request cannot suit both a 2 KB
/// config and a 5 GB shard. Under this rule a body of `n` bytes ends within about
/// `n / min_rate + window`, whatever its size: a deadline that scales with the file.
struct SpeedGuard {
    min_rate: u64,
    window: Duration,
    total: u64,
    /// (when, bytes so far); the first is the newest at or before `now - window`.
    samples: VecDeque<(Instant, u64)>,
}

impl SpeedGuard {
    fn new(min_rate: u64, window: Duration) -> SpeedGuard {
        SpeedGuard {
            min_rate,
            window,
            total: 0,
            samples: VecDeque::from([(Instant::now(), 0)]),
        }
    }

    /// Count `n` more bytes; an error once the average over a full window is below the minimum.
    fn update(&mut self, n: u64) -> std::io::Result<()> {
        self.total += n;
        if self.min_rate == 0 {
            return Ok(());
        }
        let now = Instant::now();
        while self.samples.len() >= 2 && now - self.samples[1].0 >= self.window {
            self.samples.pop_front();
        }
        let last = self.samples.back().map_or(now, |s| s.0);
        // Samples every 1/16 window: the memory stays bounded however small the reads are.
        if now - last >= self.window / 16 {
            self.samples.push_back((now, self.total));
        }
        let (since, at) = self.samples[0];
        let span = now - since;
        if span < self.window {
            return Ok(());
        }
        let got = self.total - at;
        let rate = got as f64 / span.as_secs_f64();
        if rate < self.min_rate as f64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the transfer slowed to {rate:.0} bytes/s over the last {:.0} s, below the \
                     minimum of {} bytes/s (CARDPROOF_HTTP_MIN_BYTES_PER_SEC, \
                     CARDPROOF_HTTP_SPEED_WINDOW_SECS)",
                    span.as_secs_f64(),
                    self.min_rate
                ),
            ));
        }
        Ok(())
    }
}

/// Refuse a download of `needed` more bytes into `dir` when its file system has less free space
/// than that (when the free space cannot be read, the download goes ahead).
pub(crate) fn check_free_space(
    dir: &std::path::Path,
    needed: u64,
) -> std::result::Result<(), HubError> {
    match crate::files::free_space(dir) {
        Some(available) if available < needed => Err(HubError::NoSpace {
            path: dir.display().to_string(),
            needed,
            available,
        }),
        _ => Ok(()),
    }
}

/// Why a download answer does not fit the listing's `size` when `have` bytes are held: its
/// Content-Length (the rest of the file) or its Content-Range total (the whole file) differs.
fn declared_size_mismatch(response: &Response<ureq::Body>, size: u64, have: u64) -> Option<String> {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_owned())
    };
    if let Some(len) = header("content-length").and_then(|v| v.parse::<u64>().ok())
        && len != size - have
    {
        return Some(format!(
            "the server sends {len} bytes where {} remain of the {size} bytes the Hub lists; \
             the partial download was deleted",
            size - have
        ));
    }
    let total = header("content-range")
        .and_then(|v| v.rsplit_once('/').map(|(_, t)| t.to_owned()))
        .and_then(|t| t.parse::<u64>().ok());
    if let Some(total) = total
        && total != size
    {
        return Some(format!(
            "the server's file is {total} bytes, the Hub lists {size}; the partial download was \
             deleted"
        ));
    }
    None
}

fn network(url: &str, attempt: u32, e: &std::io::Error) -> HubError {
    HubError::Network {
        url: url.to_owned(),
        attempts: attempt,
        message: e.to_string(),
    }
}

/// The first byte of a 206 answer (`Content-Range: bytes START-END/SIZE`).
fn content_range_start(response: &Response<ureq::Body>) -> Option<u64> {
    let v = response.headers().get("content-range")?.to_str().ok()?;
    let rest = v.trim().strip_prefix("bytes ")?;
    rest.split('-').next()?.trim().parse().ok()
}

/// `scheme://host[:port]` of a URL, lowercased: what decides whether a token may be sent.
pub fn origin(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return String::new();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // Credentials in the URL are not part of the origin.
    let authority = authority.rsplit('@').next().unwrap_or_default();
    format!(
        "{}://{}",
        scheme.to_ascii_lowercase(),
        authority.to_ascii_lowercase()
    )
}

/// A redirect target: absolute (`http(s)://...`) or absolute-path (`/...`) relative to `base`.
fn join_location(base: &str, location: &str) -> Option<String> {
    if location.starts_with("https://") || location.starts_with("http://") {
        return Some(location.to_owned());
    }
    if location.starts_with('/') && !location.starts_with("//") {
        let o = origin(base);
        return (!o.is_empty()).then(|| format!("{o}{location}"));
    }
    None
}

/// Percent-encode for a URL path: everything but unreserved characters (and `/` between path
/// segments when `keep_slash`), so a branch `refs/pr/1` becomes `refs%2Fpr%2F1`.
pub fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (keep_slash && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_speed_rule_judges_a_full_window_only() {
        let window = Duration::from_millis(100);
        let mut g = SpeedGuard::new(1000, window);
        g.update(1).unwrap();
        std::thread::sleep(window + Duration::from_millis(20));
        let e = g.update(1).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            e.to_string().contains("below the minimum of 1000 bytes/s"),
            "{e}"
        );
        // Fast enough: 10 kB in the window.
        let mut g = SpeedGuard::new(1000, window);
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(25));
            g.update(2000).unwrap();
        }
        // Off at 0.
        let mut g = SpeedGuard::new(0, window);
        std::thread::sleep(window + Duration::from_millis(20));
        g.update(0).unwrap();
    }

    #[test]
    fn origins_and_locations() {
        assert_eq!(origin("https://HF.co/a/b?x"), "https://hf.co");
        assert_eq!(origin("http://127.0.0.1:8080/x"), "http://127.0.0.1:8080");
        assert_ne!(
            origin("http://127.0.0.1:8080/x"),
            origin("http://127.0.0.1:8081/x")
        );
        assert_eq!(
            join_location("http://a:1/x/y", "/z?q").as_deref(),
            Some("http://a:1/z?q")
        );
        assert_eq!(join_location("http://a:1/x", "//evil/z"), None);
        assert_eq!(encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(encode("a b/c.json", true), "a%20b/c.json");
    }
}
