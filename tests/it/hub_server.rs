//! A Hub-compatible HTTP server on 127.0.0.1 for the `hf:` tests (never the real Hub).
//!
//! The main listener answers the Hub's URL layout: `GET /api/models/{repo}/revision/{rev}` with
//! the commit and siblings (size, blobId, lfs {sha256, size, pointerSize}) and
//! `GET /{repo}/resolve/{rev}/{path}`, which serves plain files itself and answers LFS files
//! (`*.safetensors`, `*.gguf`, and anything over 1 MiB) like the real Hub: a 302 to a second
//! listener (another port, so another origin, like the CDN), which serves the bytes with Range
//! support. Faults are injected per test: slow answers, truncated bodies, 500s, 429 with
//! Retry-After, an ignored Range, a required token, corrupted bytes, trickled bodies, inflated
//! sizes in the listing, bodies longer than the listing.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::Digest as _;

/// Files over this size get a made-up LFS digest (hashing sparse multi-GB fixtures would make
/// the tests slow; those tests never download them).
const HASH_LIMIT: u64 = 256 << 20;

#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// Hang on this many requests (any listener) for `slow_for` (beyond the client timeout), then
    /// close without answering; logged with status 0.
    pub slow: usize,
    pub slow_for: Duration,
    /// Cut this many file bodies in half (full Content-Length, then close).
    pub truncate: usize,
    /// Answer this many requests with 500.
    pub fail_500: usize,
    /// Answer this many requests with 429 and `Retry-After: 1`.
    pub rate_limit: usize,
    /// Serve whole files (200) whatever the Range header says.
    pub ignore_range: bool,
    /// Flip a byte of every file body from the CDN.
    pub corrupt: bool,
    /// Require `Authorization: Bearer <token>` on the main listener (a gated repo).
    pub token: Option<String>,
    /// Send file bodies one byte per this interval (a server that trickles, never stalls).
    pub trickle: Option<Duration>,
    /// List every LFS file with this size (model info claiming more than the file holds).
    pub claim_size: Option<u64>,
    /// Append this many bytes to every file body, Content-Length included (a body longer than
    /// the listing says).
    pub extra_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct Logged {
    pub listener: &'static str,
    pub path: String,
    pub range: Option<String>,
    pub authorization: bool,
    pub status: u16,
}

#[derive(Default)]
struct State {
    /// repo -> (revision name -> commit)
    refs: BTreeMap<String, BTreeMap<String, String>>,
    /// (repo, commit) -> directory holding the files
    commits: BTreeMap<(String, String), PathBuf>,
    /// cached listings: (repo, commit) -> siblings
    listings: BTreeMap<(String, String), Vec<FileInfo>>,
    faults: Faults,
    log: Vec<Logged>,
}

#[derive(Debug, Clone)]
struct FileInfo {
    path: String,
    size: u64,
    blob_id: String,
    lfs: Option<String>,
}

pub struct HubServer {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

impl HubServer {
    pub fn start() -> HubServer {
        let main = TcpListener::bind("127.0.0.1:0").expect("bind");
        let cdn = TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", main.local_addr().unwrap());
        let cdn_base = format!("http://{}", cdn.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        for (listener, name) in [(main, "hub"), (cdn, "cdn")] {
            let state = state.clone();
            let stop = stop.clone();
            let cdn_base = cdn_base.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = state.clone();
                    let cdn_base = cdn_base.clone();
                    std::thread::spawn(move || {
                        let _ = handle(stream, name, &state, &cdn_base);
                    });
                }
            });
        }
        HubServer {
            endpoint,
            state,
            stop,
        }
    }

    /// Publish `dir` as `commit` of `repo`, and point `revision` (a branch) at it.
    pub fn publish(&self, repo: &str, revision: &str, commit: &str, dir: &Path) {
        let mut s = self.state.lock().unwrap();
        s.refs
            .entry(repo.to_owned())
            .or_default()
            .insert(revision.to_owned(), commit.to_owned());
        s.commits
            .insert((repo.to_owned(), commit.to_owned()), dir.to_owned());
        s.listings.remove(&(repo.to_owned(), commit.to_owned()));
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().unwrap().faults = faults;
    }

    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn git_blob_id(bytes: &[u8]) -> String {
    cardproof::hub::cache::git_blob_id(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_lfs(path: &str, size: u64) -> bool {
    path.ends_with(".safetensors") || path.ends_with(".gguf") || size > (1 << 20)
}

fn listing(dir: &Path) -> Vec<FileInfo> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_owned(), String::new())];
    while let Some((d, prefix)) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            if e.file_type().unwrap().is_dir() {
                stack.push((e.path(), format!("{name}/")));
                continue;
            }
            let size = e.metadata().unwrap().len();
            if is_lfs(&name, size) {
                let sha = if size <= HASH_LIMIT {
                    cardproof::checkpoint::hash::hash_file(&e.path()).unwrap()
                } else {
                    hex(&sha2::Sha256::digest(
                        format!("sparse:{name}:{size}").as_bytes(),
                    ))
                };
                let pointer = format!(
                    "version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n"
                );
                out.push(FileInfo {
                    path: name,
                    size,
                    blob_id: git_blob_id(pointer.as_bytes()),
                    lfs: Some(sha),
                });
            } else {
                let bytes = std::fs::read(e.path()).unwrap();
                out.push(FileInfo {
                    path: name,
                    size,
                    blob_id: git_blob_id(&bytes),
                    lfs: None,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

struct Request {
    path: String,
    headers: BTreeMap<String, String>,
}

fn read_request(stream: &TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let _method = parts.next()?;
    let path = parts.next()?.to_owned();
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    Some(Request { path, headers })
}

fn respond(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

fn take_fault(counter: &mut usize) -> bool {
    if *counter > 0 {
        *counter -= 1;
        true
    } else {
        false
    }
}

fn handle(
    mut stream: TcpStream,
    listener: &'static str,
    state: &Arc<Mutex<State>>,
    cdn_base: &str,
) -> std::io::Result<()> {
    let Some(req) = read_request(&stream) else {
        return Ok(());
    };
    let range = req.headers.get("range").cloned();
    let authorization = req.headers.get("authorization").cloned();
    let log = |status: u16| {
        state.lock().unwrap().log.push(Logged {
            listener,
            path: req.path.clone(),
            range: range.clone(),
            authorization: authorization.is_some(),
            status,
        });
    };
    // Faults that apply to any request.
    let (slow, fail, limit, faults) = {
        let mut s = state.lock().unwrap();
        let slow = take_fault(&mut s.faults.slow);
        let fail = !slow && take_fault(&mut s.faults.fail_500);
        let limit = !slow && !fail && take_fault(&mut s.faults.rate_limit);
        (slow, fail, limit, s.faults.clone())
    };
    if slow {
        // A server that hangs: logged now (status 0), then closed without an answer.
        log(0);
        std::thread::sleep(faults.slow_for);
        return Ok(());
    }
    if fail {
        log(500);
        return respond(&mut stream, 500, &[], b"internal error");
    }
    if limit {
        log(429);
        return respond(
            &mut stream,
            429,
            &[("Retry-After", "1".into())],
            b"slow down",
        );
    }
    if listener == "cdn" {
        // /blobs/{repo...}/{commit}/{path}?... : the file lives in the commit's directory.
        let path = req.path.split('?').next().unwrap_or_default();
        let rest = path.strip_prefix("/blobs/").unwrap_or_default();
        let parts: Vec<&str> = rest.splitn(4, '/').collect();
        if parts.len() < 4 {
            log(404);
            return respond(&mut stream, 404, &[], b"");
        }
        let repo = format!("{}/{}", parts[0], parts[1]);
        let dir = state
            .lock()
            .unwrap()
            .commits
            .get(&(repo, parts[2].to_owned()))
            .cloned();
        let Some(dir) = dir else {
            log(404);
            return respond(&mut stream, 404, &[], b"");
        };
        return serve_file(
            &mut stream,
            &dir.join(decode(parts[3])),
            range.as_deref(),
            &faults,
            state,
            &log,
        );
    }
    if let Some(token) = &faults.token
        && authorization.as_deref() != Some(&format!("Bearer {token}"))
    {
        log(401);
        return respond(
            &mut stream,
            401,
            &[("X-Error-Code", "GatedRepo".into())],
            b"gated",
        );
    }
    let path = req.path.split('?').next().unwrap_or_default().to_owned();
    let not_found = |stream: &mut TcpStream, code: &str| {
        log(404);
        respond(
            stream,
            404,
            &[("X-Error-Code", code.into())],
            code.as_bytes(),
        )
    };
    let lookup = |repo: &str, rev: &str| -> Result<(String, PathBuf), &'static str> {
        let s = state.lock().unwrap();
        let Some(refs) = s.refs.get(repo) else {
            return Err("RepoNotFound");
        };
        let commit = refs.get(rev).cloned().or_else(|| {
            s.commits
                .contains_key(&(repo.to_owned(), rev.to_owned()))
                .then(|| rev.to_owned())
        });
        let Some(commit) = commit else {
            return Err("RevisionNotFound");
        };
        let dir = s.commits[&(repo.to_owned(), commit.clone())].clone();
        Ok((commit, dir))
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        // {org}/{name}/revision/{rev}
        let parts: Vec<&str> = rest.splitn(4, '/').collect();
        if parts.len() != 4 || parts[2] != "revision" {
            return not_found(&mut stream, "RepoNotFound");
        }
        let repo = format!("{}/{}", parts[0], parts[1]);
        let rev = decode(parts[3]);
        let (commit, dir) = match lookup(&repo, &rev) {
            Ok(x) => x,
            Err(code) => return not_found(&mut stream, code),
        };
        let files = {
            let key = (repo.clone(), commit.clone());
            let cached = state.lock().unwrap().listings.get(&key).cloned();
            match cached {
                Some(f) => f,
                None => {
                    let f = listing(&dir);
                    state.lock().unwrap().listings.insert(key, f.clone());
                    f
                }
            }
        };
        let siblings: Vec<serde_json::Value> = files
            .iter()
            .map(|f| {
                let size = match (&f.lfs, faults.claim_size) {
                    (Some(_), Some(claim)) => claim,
                    _ => f.size,
                };
                let mut v =
                    serde_json::json!({"rfilename": f.path, "size": size, "blobId": f.blob_id});
                if let Some(sha) = &f.lfs {
                    v["lfs"] = serde_json::json!({"sha256": sha, "size": size, "pointerSize": 134});
                }
                v
            })
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({
            "id": repo, "modelId": repo, "sha": commit, "private": false, "siblings": siblings
        }))
        .unwrap();
        log(200);
        return respond(
            &mut stream,
            200,
            &[("Content-Type", "application/json".into())],
            &body,
        );
    }
    // /{org}/{name}/resolve/{rev}/{path}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if parts.len() != 5 || parts[2] != "resolve" {
        return not_found(&mut stream, "RepoNotFound");
    }
    let repo = format!("{}/{}", parts[0], parts[1]);
    let rev = decode(parts[3]);
    let file = decode(parts[4]);
    let (commit, dir) = match lookup(&repo, &rev) {
        Ok(x) => x,
        Err(code) => return not_found(&mut stream, code),
    };
    let full = dir.join(&file);
    let Ok(meta) = std::fs::metadata(&full) else {
        return not_found(&mut stream, "EntryNotFound");
    };
    if is_lfs(&file, meta.len()) {
        log(302);
        let location = format!("{cdn_base}/blobs/{repo}/{commit}/{}", parts[4]);
        return respond(
            &mut stream,
            302,
            &[
                ("Location", location),
                ("X-Repo-Commit", commit),
                ("X-Linked-Size", meta.len().to_string()),
            ],
            b"",
        );
    }
    serve_file(&mut stream, &full, range.as_deref(), &faults, state, &log)
}

fn serve_file(
    stream: &mut TcpStream,
    path: &Path,
    range: Option<&str>,
    faults: &Faults,
    state: &Arc<Mutex<State>>,
    log: &dyn Fn(u16),
) -> std::io::Result<()> {
    let Ok(mut file) = std::fs::File::open(path) else {
        log(404);
        return respond(
            stream,
            404,
            &[("X-Error-Code", "EntryNotFound".into())],
            b"",
        );
    };
    let size = file.metadata()?.len();
    let parsed = range
        .filter(|_| !faults.ignore_range)
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| {
            let (a, b) = r.split_once('-')?;
            let a: u64 = a.parse().ok()?;
            let b: u64 = if b.is_empty() {
                size - 1
            } else {
                b.parse::<u64>().ok()?.min(size - 1)
            };
            (a <= b).then_some((a, b))
        });
    let (status, start, end) = match parsed {
        Some((a, b)) => (206, a, b + 1),
        None => (200, 0, size),
    };
    let len = end - start;
    let truncate = take_fault(&mut state.lock().unwrap().faults.truncate);
    log(status);
    let head_len = len + faults.extra_bytes;
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {head_len}\r\nConnection: close\r\nAccept-Ranges: bytes\r\n"
    );
    if status == 206 {
        head.push_str(&format!(
            "Content-Range: bytes {start}-{}/{size}\r\n",
            end - 1
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    file.seek(SeekFrom::Start(start))?;
    let send = if truncate { len / 2 } else { len };
    let mut reader = file.take(send);
    let mut buf = vec![0u8; 1 << 16];
    let mut first = true;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if faults.corrupt && first {
            buf[0] ^= 0xff;
        }
        first = false;
        if let Some(interval) = faults.trickle {
            for b in &buf[..n] {
                if stream
                    .write_all(&[*b])
                    .and_then(|()| stream.flush())
                    .is_err()
                {
                    return Ok(());
                }
                std::thread::sleep(interval);
            }
            continue;
        }
        // A client that read what it needed closes early (ignored Range): that is fine.
        if stream.write_all(&buf[..n]).is_err() {
            return Ok(());
        }
    }
    if faults.extra_bytes > 0 && !truncate {
        let _ = stream.write_all(&vec![0u8; faults.extra_bytes as usize]);
    }
    stream.flush()
}
