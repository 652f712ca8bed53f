//! The manifest: SHA-256 of every file of a checkpoint and a root digest anyone can recompute with
//! coreutils (`sha256sum` lines, sorted by path in byte order, hashed again).
//!
//! Files hash in parallel (one file is inherently sequential), each read in large chunks so that
//! the SHA-256 instructions, not syscalls, bound the speed.
//!
//! What the walk accepts, checked from metadata before anything is opened: regular files and
//! directories, and symbolic links that resolve to either *inside* the hashed directory (or, for
//! a Hugging Face cache snapshot `.../snapshots/<commit>/`, inside that repository's `blobs/`,
//! where the snapshot's links point). A link resolving anywhere else (`..`, an absolute path out
//! of the checkpoint), a dangling link, a FIFO, a socket or a device is an error naming it: a FIFO
//! blocks the open, `/dev/zero` never ends, and a link out of the directory would put files that
//! are not the checkpoint's into its digest.

use crate::digest::hex;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorKind, Result};

/// What `hash` leaves out by default, for people: the card (an edit must not change the
/// checkpoint's digest), repository plumbing and cardproof's report sets (the rule is
/// [`super::members::excluded`]).
pub const DEFAULT_EXCLUDES: &[&str] = &[
    "README.md",
    ".gitattributes",
    ".git/",
    ".cache/",
    "cardproof report sets (report.json, report.dsse.json, positions.safetensors, ...)",
];

const CHUNK: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct ManifestEntry {
    /// Relative to the hashed path, forward slashes.
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// Where a symbolic link pointed (the digest is of the target's content).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    pub files: Vec<ManifestEntry>,
    pub root_sha256: String,
    /// Paths left out, relative to the hashed path.
    pub excluded: Vec<String>,
}

impl Manifest {
    /// The manifest in `sha256sum` format; its SHA-256 is the root digest.
    pub fn text(&self) -> String {
        manifest_text(&self.files)
    }

    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

pub fn manifest_text(files: &[ManifestEntry]) -> String {
    files
        .iter()
        .map(|f| format!("{}  {}\n", f.sha256, f.path))
        .collect()
}

#[derive(Debug, Clone, Default)]
pub struct HashOptions {
    /// Worker threads; `None` uses every core.
    pub threads: Option<usize>,
    /// Hash the card and repository plumbing too.
    pub include_all: bool,
}

/// A file to hash: where it is, how it is named in the manifest, where a link pointed.
#[derive(Debug, Clone)]
struct Source {
    path: PathBuf,
    name: String,
    size: u64,
    link: Option<String>,
}

/// Hash a directory (or a single file). `progress` receives byte counts as they are hashed.
pub fn hash_path(
    root: &Path,
    options: &HashOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Manifest> {
    let meta = std::fs::metadata(root).map_err(|e| Error::io(root, e))?;
    let (sources, excluded) = if meta.is_dir() {
        collect(root, options)?
    } else if !meta.is_file() {
        return Err(crate::files::not_regular(root, &meta));
    } else {
        let name = root
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::unsupported(root, None, "file name is not UTF-8"))?
            .to_owned();
        check_name(root, &name)?;
        (
            vec![Source {
                path: root.to_path_buf(),
                name,
                size: meta.len(),
                link: None,
            }],
            Vec::new(),
        )
    };
    let work = || -> Result<Vec<ManifestEntry>> {
        sources
            .par_iter()
            .map(|s| hash_source(s, progress))
            .collect()
    };
    let files = match options.threads {
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build()
            .map_err(|e| Error::new(root, ErrorKind::Io(std::io::Error::other(e))))?
            .install(work)?,
        None => work()?,
    };
    let root_sha256 = hex(&Sha256::digest(manifest_text(&files).as_bytes()));
    Ok(Manifest {
        files,
        root_sha256,
        excluded,
    })
}

/// Bytes `hash_path` would read (for a progress bar); `None` when the walk fails (the hash itself
/// then reports the error).
pub fn total_size(root: &Path, options: &HashOptions) -> Option<u64> {
    let meta = std::fs::metadata(root).ok()?;
    if !meta.is_dir() {
        return meta.is_file().then_some(meta.len());
    }
    collect(root, options)
        .ok()
        .map(|(sources, _)| sources.iter().map(|s| s.size).sum())
}

/// The files `hash_path` would hash in a directory, by manifest name, with their sizes (nothing is
/// read); the same walk, links and refusals.
pub fn list_files(root: &Path, options: &HashOptions) -> Result<Vec<(String, u64)>> {
    let (sources, _) = collect(root, options)?;
    Ok(sources.into_iter().map(|s| (s.name, s.size)).collect())
}

/// SHA-256 of one file's bytes.
pub fn hash_file(path: &Path) -> Result<String> {
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len();
    let source = Source {
        path: path.to_path_buf(),
        name: String::new(),
        size,
        link: None,
    };
    Ok(hash_source(&source, &|_| {})?.sha256)
}

fn hash_source(source: &Source, progress: &(dyn Fn(u64) + Sync)) -> Result<ManifestEntry> {
    let path = &source.path;
    let (mut file, _) = crate::files::open_regular(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(path, e)),
        };
        hasher.update(&buffer[..n]);
        size += n as u64;
        progress(n as u64);
    }
    if size != source.size {
        return Err(Error::format(
            path,
            None,
            format!(
                "file changed while hashing ({} bytes listed, {size} read)",
                source.size
            ),
        ));
    }
    Ok(ManifestEntry {
        path: source.name.clone(),
        size,
        sha256: hex(&hasher.finalize()),
        link: source.link.clone(),
    })
}

fn collect(root: &Path, options: &HashOptions) -> Result<(Vec<Source>, Vec<String>)> {
    let inside = allowed_roots(root)?;
    let mut sources = Vec::new();
    let mut excluded = Vec::new();
    let mut visited = BTreeSet::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        // Links to directories inside the checkpoint are followed, so guard against cycles.
        let canonical = std::fs::canonicalize(&dir).map_err(|e| Error::io(&dir, e))?;
        if !visited.insert(canonical) {
            continue;
        }
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let path = entry.path();
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                return Err(Error::unsupported(&path, None, "file name is not UTF-8"));
            };
            let name = format!("{prefix}{file_name}");
            let file_type = entry.file_type().map_err(|e| Error::io(&path, e))?;
            let (meta, link) = if file_type.is_symlink() {
                let target = std::fs::read_link(&path).map_err(|e| Error::io(&path, e))?;
                let shown = target.to_string_lossy().into_owned();
                let resolved = std::fs::canonicalize(&path).map_err(|e| {
                    Error::format(
                        &path,
                        None,
                        format!("is a symbolic link to `{shown}`, which cannot be resolved ({e})"),
                    )
                })?;
                if !inside.iter().any(|r| resolved.starts_with(r)) {
                    return Err(Error::unsupported(
                        &path,
                        None,
                        format!(
                            "is a symbolic link to `{shown}`, which resolves to {}, outside the \
                             checkpoint directory {}; only links that stay inside it are followed",
                            resolved.display(),
                            root.display()
                        ),
                    ));
                }
                let meta = std::fs::metadata(&resolved).map_err(|e| Error::io(&path, e))?;
                (meta, Some(shown))
            } else {
                (entry.metadata().map_err(|e| Error::io(&path, e))?, None)
            };
            if meta.is_dir() {
                if !options.include_all && super::members::excluded_dir(file_name) {
                    excluded.push(format!("{name}/"));
                    continue;
                }
                stack.push((path, format!("{name}/")));
                continue;
            }
            if !meta.is_file() {
                return Err(crate::files::not_regular(&path, &meta));
            }
            if !options.include_all && super::members::excluded(&name) {
                excluded.push(name);
                continue;
            }
            check_name(&path, &name)?;
            sources.push(Source {
                path,
                name,
                size: meta.len(),
                link,
            });
        }
    }
    sources.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    excluded.sort();
    Ok((sources, excluded))
}

/// Where links in the walk of `root` may resolve to: the directory itself, and for a Hugging
/// Face cache snapshot (`<repo>/snapshots/<commit>`) the repository's `blobs/` beside it.
fn allowed_roots(root: &Path) -> Result<Vec<PathBuf>> {
    let canonical = std::fs::canonicalize(root).map_err(|e| Error::io(root, e))?;
    let mut roots = vec![canonical.clone()];
    if let Some(snapshots) = canonical.parent()
        && snapshots.file_name().is_some_and(|n| n == "snapshots")
        && let Some(repo) = snapshots.parent()
        && let Ok(blobs) = std::fs::canonicalize(repo.join("blobs"))
    {
        roots.push(blobs);
    }
    Ok(roots)
}

/// `sha256sum` escapes names with a newline or backslash, which would make the manifest
/// ambiguous for anyone recomputing it with coreutils.
fn check_name(path: &Path, name: &str) -> Result<()> {
    if name.contains(['\n', '\r', '\\']) {
        return Err(Error::unsupported(
            path,
            Some(&name.escape_debug().to_string()),
            "file name holds a newline or backslash, which `sha256sum` would escape; rename it",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests_and_sorted_manifest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.bin"), b"abc").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.json"), b"").unwrap();
        std::fs::write(dir.path().join("B.txt"), b"x").unwrap();
        std::fs::write(dir.path().join("README.md"), b"card").unwrap();
        let m = hash_path(dir.path(), &HashOptions::default(), &|_| {}).unwrap();
        let names: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["B.txt", "b.bin", "sub/a.json"]);
        assert_eq!(
            m.files[1].sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            m.files[2].sha256,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(m.excluded, ["README.md"]);
        assert_eq!(m.root_sha256, hex(&Sha256::digest(m.text().as_bytes())));
    }

    /// The rule's one exception: a Hugging Face cache snapshot's links into `../../blobs`.
    #[cfg(unix)]
    #[test]
    fn a_hub_snapshot_may_link_into_its_blobs_but_nowhere_else() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--name");
        let snapshot = repo.join("snapshots").join("c".repeat(40));
        std::fs::create_dir_all(snapshot.join("sub")).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::write(repo.join("blobs/aaa"), b"abc").unwrap();
        std::os::unix::fs::symlink("../../blobs/aaa", snapshot.join("a.bin")).unwrap();
        std::os::unix::fs::symlink("../../../blobs/aaa", snapshot.join("sub/b.bin")).unwrap();
        let m = hash_path(&snapshot, &HashOptions::default(), &|_| {}).unwrap();
        assert_eq!(m.files.len(), 2);
        assert_eq!(m.files[0].sha256, m.files[1].sha256);
        // The repository's refs are not blobs: a link there is refused.
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), b"x").unwrap();
        std::os::unix::fs::symlink("../../refs/main", snapshot.join("c.bin")).unwrap();
        let err = hash_path(&snapshot, &HashOptions::default(), &|_| {}).unwrap_err();
        assert!(err.to_string().contains("outside the checkpoint"), "{err}");
    }

    #[test]
    fn names_sha256sum_would_escape_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a\\b"), b"").unwrap();
        let err = hash_path(dir.path(), &HashOptions::default(), &|_| {}).unwrap_err();
        assert!(err.to_string().contains("backslash"), "{err}");
    }
}
