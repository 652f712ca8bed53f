//! The standard Hugging Face cache layout, so files `huggingface_hub`, `hf download`, vLLM or
//! transformers already downloaded are reused, and ours are reused by them:
//!
//! ```text
//! <cache>/models--ORG--NAME/
//!   refs/<revision>                 the commit a branch or tag pointed at (a file with 40 hex)
//!   blobs/<sha256 or git blob id>   file contents, named by digest
//!   blobs/<id>.incomplete           a download in progress (never read as a file)
//!   snapshots/<commit>/<path>       relative symlink ../../blobs/<id> (deeper paths add ../)
//! ```
//!
//! A blob gets its final name only after its bytes were checked against the Hub's digest, so a
//! file in a snapshot is whole and correct, whoever resumes or interrupts a download.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha1::Digest as _;

use super::client::Sibling;
use super::{HfSource, HubError, is_commit};
use crate::error::{Error, Result};

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    pub root: PathBuf,
}

impl RepoCache {
    pub fn new(cache_dir: &Path, repo: &str) -> RepoCache {
        RepoCache {
            root: cache_dir.join(folder_name(repo)),
        }
    }

    /// The commit `revision` resolves to in the cache: itself when it is a commit whose snapshot
    /// exists, else what `refs/<revision>` holds.
    pub fn cached_commit(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return self
                .snapshot_dir(revision)
                .is_dir()
                .then(|| revision.to_owned());
        }
        let text = std::fs::read_to_string(self.root.join("refs").join(revision)).ok()?;
        let commit = text.trim();
        is_commit(commit).then(|| commit.to_owned())
    }

    /// Record that `revision` pointed at `commit` (skipped when the revision is the commit).
    pub fn write_ref(&self, source: &HfSource, commit: &str) -> Result<()> {
        if source.revision == commit {
            return Ok(());
        }
        let path = self.root.join("refs").join(&source.revision);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| cache_err(source, None, dir, e))?;
        }
        write_atomically(&path, commit.as_bytes()).map_err(|e| cache_err(source, None, &path, e))
    }

    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    /// The snapshot path of `file` if it is present (a dangling link counts as absent).
    pub fn cached_file(&self, commit: &str, file: &str) -> Option<PathBuf> {
        let p = self.snapshot_dir(commit).join(file);
        p.is_file().then_some(p)
    }

    pub fn blob(&self, name: &str) -> PathBuf {
        self.root.join("blobs").join(name)
    }

    /// Link `snapshots/<commit>/<file>` to `blobs/<blob>` (a relative symlink, as
    /// `huggingface_hub` makes; a copy where symlinks are unavailable).
    pub fn link(&self, source: &HfSource, commit: &str, file: &str, blob: &str) -> Result<PathBuf> {
        let target = self.snapshot_dir(commit).join(file);
        let dir = target.parent().unwrap_or(&self.root).to_owned();
        std::fs::create_dir_all(&dir).map_err(|e| cache_err(source, Some(file), &dir, e))?;
        let depth = file.split('/').count() + 1;
        let relative: PathBuf = std::iter::repeat_n("..", depth)
            .collect::<PathBuf>()
            .join("blobs")
            .join(blob);
        let _ = std::fs::remove_file(&target);
        link_or_copy(&relative, &self.blob(blob), &target)
            .map_err(|e| cache_err(source, Some(file), &target, e))?;
        Ok(target)
    }
}

#[cfg(unix)]
fn link_or_copy(relative: &Path, _blob: &Path, target: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(relative, target)
}

#[cfg(not(unix))]
fn link_or_copy(_relative: &Path, blob: &Path, target: &Path) -> std::io::Result<()> {
    std::fs::copy(blob, target).map(|_| ())
}

/// `models--ORG--NAME`, the cache folder of a model repository.
pub fn folder_name(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

pub(crate) fn cache_err(
    source: &HfSource,
    file: Option<&str>,
    path: &Path,
    e: std::io::Error,
) -> Error {
    source.error(
        file,
        HubError::Cache {
            path: path.display().to_string(),
            message: e.to_string(),
        },
    )
}

/// Write under a temporary name, then rename: readers never see half a file.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// What a file's bytes must hash to, from the Hub's listing.
#[derive(Debug, Clone)]
pub enum Expected {
    /// LFS files: the SHA-256 of the content.
    Sha256(String),
    /// Other files: the git blob id, SHA-1 of `blob <len>\0<content>`.
    GitBlob(String),
}

impl Expected {
    pub fn of(sibling: &Sibling) -> Expected {
        match (&sibling.lfs, &sibling.blob_id) {
            (Some(l), _) => Expected::Sha256(l.sha256.to_ascii_lowercase()),
            (None, Some(b)) => Expected::GitBlob(b.to_ascii_lowercase()),
            (None, None) => Expected::GitBlob(String::new()),
        }
    }
}

/// Hash `path` (a file of `size` bytes) the way `expected` says and compare.
pub fn check_digest(
    path: &Path,
    size: u64,
    expected: &Expected,
) -> std::io::Result<Option<HubError>> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let (algorithm, want, got) = match expected {
        Expected::Sha256(want) => {
            let mut h = sha2::Sha256::new();
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            ("SHA-256", want, hex(&h.finalize()))
        }
        Expected::GitBlob(want) => {
            let mut h = sha1::Sha1::new();
            h.update(format!("blob {size}\0").as_bytes());
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            ("git blob id", want, hex(&h.finalize()))
        }
    };
    Ok((&got != want).then(|| HubError::DigestMismatch {
        algorithm,
        expected: want.clone(),
        actual: got,
    }))
}

use crate::digest::hex;

/// The git blob id of bytes in memory.
pub fn git_blob_id(bytes: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_id_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(
            git_blob_id(b"hello\n"),
            "ce013625030ba8dba906f756967f9e9ca394464a"
        );
        assert_eq!(folder_name("org/name"), "models--org--name");
    }
}
