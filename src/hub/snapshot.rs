//! A pinned snapshot on disk, for the verbs that need whole files (`hash`, `verify`, `measure`,
//! `lint`): resolve the revision to a commit, download what the cache lacks (resuming
//! `.incomplete` blobs), check every new blob against the Hub's digest, and hand back the
//! snapshot folder so the local code runs unchanged.

use std::path::PathBuf;

use super::cache::{Expected, RepoCache, cache_err, check_digest};
use super::client::{Client, RepoInfo, Sibling, check_free_space};
use super::{HfSource, HubError};
use crate::error::Result;

/// Which files of the repository are needed.
#[derive(Debug, Clone, Copy)]
pub enum Select<'a> {
    /// Every file of the repository.
    All,
    /// Only these paths (each must exist).
    Only(&'a [&'a str]),
}

/// A snapshot on disk.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The source pinned at its commit (`revision` is the 40-hex commit).
    pub pinned: HfSource,
    /// `snapshots/<commit>/` in the cache.
    pub dir: PathBuf,
    /// The Hub's file list (absent offline).
    pub info: Option<RepoInfo>,
    /// Files that were downloaded now (the rest came from the cache).
    pub downloaded: Vec<String>,
}

impl Snapshot {
    /// The snapshot's README.md as a card, named `hf:REPO@COMMIT/README.md` in findings and
    /// errors.
    pub fn read_card(&self) -> Result<crate::card::Card> {
        let path = self.dir.join("README.md");
        let bytes = crate::files::read_capped(&path, crate::card::MAX_CARD_BYTES, "a card")?;
        crate::card::Card::from_bytes(self.pinned.display_path(Some("README.md")), bytes)
    }
}

/// Progress of a materialization: `(bytes done, bytes to download)`.
pub type Progress<'a> = &'a dyn Fn(u64, u64);

/// Make the selected files of `source` present and verified in the cache.
pub fn materialize(
    client: &Client,
    source: &HfSource,
    select: Select<'_>,
    progress: Progress<'_>,
) -> Result<Snapshot> {
    let cache = RepoCache::new(&client.config().cache_dir, &source.repo);
    if client.config().offline {
        return offline(client, &cache, source, select);
    }
    let info = client.repo_info(source)?;
    let pinned = source.at(&info.sha);
    let wanted: Vec<&Sibling> = match select {
        Select::All => info.siblings.iter().collect(),
        Select::Only(paths) => paths
            .iter()
            .map(|p| {
                info.sibling(p).ok_or_else(|| {
                    pinned.error(
                        Some(p),
                        HubError::EntryNotFound {
                            repo: source.repo.clone(),
                            revision: info.sha.clone(),
                        },
                    )
                })
            })
            .collect::<Result<_>>()?,
    };
    let downloaded = ensure_files(client, &pinned, &info, &wanted, progress)?;
    cache.write_ref(source, &info.sha)?;
    Ok(Snapshot {
        dir: cache.snapshot_dir(&info.sha),
        pinned,
        info: Some(info),
        downloaded,
    })
}

/// Make `wanted` (files of `info`, a listing at `pinned`'s commit) present and verified in the
/// snapshot: files already there are hashed and compared with the Hub's digests, blobs already
/// there are linked, the rest is downloaded and verified. Returns the files that were
/// downloaded.
pub fn ensure_files(
    client: &Client,
    pinned: &HfSource,
    info: &RepoInfo,
    wanted: &[&Sibling],
    progress: Progress<'_>,
) -> Result<Vec<String>> {
    let cache = RepoCache::new(&client.config().cache_dir, &pinned.repo);
    let (cached, missing): (Vec<&Sibling>, Vec<&Sibling>) = wanted
        .iter()
        .copied()
        .partition(|s| present(&cache, &info.sha, s));
    // Files another tool (or an earlier run) put in the snapshot are checked too before use:
    // the cache layout promises whole files, not correct ones.
    for s in cached {
        verify_cached(pinned, &cache.snapshot_dir(&info.sha).join(&s.rfilename), s)?;
    }
    // Sizes are the server's claims: sums saturate.
    let to_fetch: Vec<&&Sibling> = missing
        .iter()
        .filter(|s| !cache.blob(s.blob_name()).is_file())
        .collect();
    let total = to_fetch
        .iter()
        .fold(0u64, |t, s| t.saturating_add(s.file_size()));
    // Refused before the first byte when the whole download cannot fit (bytes of `.incomplete`
    // files already there count as held), rather than filling the disk shard by shard.
    if !to_fetch.is_empty() {
        let blobs = cache.root.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(|e| cache_err(pinned, None, &blobs, e))?;
        let needed = to_fetch.iter().fold(0u64, |t, s| {
            let held = std::fs::metadata(partial_path(&cache, s)).map_or(0, |m| m.len());
            t.saturating_add(s.file_size().saturating_sub(held))
        });
        check_free_space(&blobs, needed).map_err(|e| pinned.error(None, e))?;
    }
    let mut done = 0u64;
    let mut downloaded = Vec::new();
    for s in missing {
        let blob = cache.blob(s.blob_name());
        if blob.is_file() {
            verify_cached(pinned, &blob, s)?;
        } else {
            fetch_blob(client, &cache, pinned, s, &|n| {
                progress(done.saturating_add(n), total)
            })?;
            done = done.saturating_add(s.file_size());
            downloaded.push(s.rfilename.clone());
        }
        cache.link(pinned, &info.sha, &s.rfilename, s.blob_name())?;
    }
    Ok(downloaded)
}

/// Hash a file already in the cache and compare it with the Hub's digest.
fn verify_cached(pinned: &HfSource, path: &std::path::Path, s: &Sibling) -> Result<()> {
    let mismatch = check_digest(path, s.file_size(), &Expected::of(s))
        .map_err(|e| cache_err(pinned, Some(&s.rfilename), path, e))?;
    match mismatch {
        Some(HubError::DigestMismatch {
            algorithm,
            expected,
            actual,
        }) => Err(pinned.error(
            Some(&s.rfilename),
            HubError::CachedMismatch {
                path: path.display().to_string(),
                algorithm,
                expected,
                actual,
            },
        )),
        Some(other) => Err(pinned.error(Some(&s.rfilename), other)),
        None => Ok(()),
    }
}

/// A file already in the snapshot with the size the Hub lists (another tool's download counts).
fn present(cache: &RepoCache, commit: &str, s: &Sibling) -> bool {
    cache
        .cached_file(commit, &s.rfilename)
        .and_then(|p| std::fs::metadata(p).ok())
        .is_some_and(|m| m.len() == s.file_size())
}

/// `blobs/<id>.incomplete`: a download in progress.
fn partial_path(cache: &RepoCache, s: &Sibling) -> std::path::PathBuf {
    cache.blob(&format!("{}.incomplete", s.blob_name()))
}

/// Download one blob to `<id>.incomplete` (resuming), verify it, then give it its name.
fn fetch_blob(
    client: &Client,
    cache: &RepoCache,
    pinned: &HfSource,
    s: &Sibling,
    progress: &dyn Fn(u64),
) -> Result<()> {
    let file = s.rfilename.as_str();
    let blob = cache.blob(s.blob_name());
    let dir = blob.parent().unwrap_or(&cache.root).to_owned();
    std::fs::create_dir_all(&dir).map_err(|e| cache_err(pinned, Some(file), &dir, e))?;
    let partial = partial_path(cache, s);
    client.download(pinned, file, s.file_size(), &partial, progress)?;
    let mismatch = check_digest(&partial, s.file_size(), &Expected::of(s))
        .map_err(|e| cache_err(pinned, Some(file), &partial, e))?;
    if let Some(e) = mismatch {
        // Never keep bytes that failed the check: a resume would build on them.
        let _ = std::fs::remove_file(&partial);
        return Err(pinned.error(Some(file), e));
    }
    std::fs::rename(&partial, &blob).map_err(|e| cache_err(pinned, Some(file), &blob, e))
}

fn offline(
    client: &Client,
    cache: &RepoCache,
    source: &HfSource,
    select: Select<'_>,
) -> Result<Snapshot> {
    let cache_text = client.config().cache_dir.display().to_string();
    let Some(commit) = cache.cached_commit(&source.revision) else {
        return Err(source.error(
            None,
            HubError::Offline {
                what: format!(
                    "revision `{}` of `{}` (no refs/{} or snapshot)",
                    source.revision, source.repo, source.revision
                ),
                cache: cache_text,
            },
        ));
    };
    let pinned = source.at(&commit);
    let dir = cache.snapshot_dir(&commit);
    let mut needed: Vec<String> = match select {
        Select::Only(paths) => paths.iter().map(|p| (*p).to_owned()).collect(),
        Select::All => Vec::new(),
    };
    if matches!(select, Select::All) {
        // Without the Hub's list, the shards a cached index names are what we can check.
        if let Ok(index) =
            crate::checkpoint::safetensors::read_index(&dir.join("model.safetensors.index.json"))
        {
            let mut shards: Vec<String> = index.weight_map.into_values().collect();
            shards.sort();
            shards.dedup();
            needed.extend(shards);
        }
    }
    for file in &needed {
        if cache.cached_file(&commit, file).is_none() {
            return Err(pinned.error(
                Some(file),
                HubError::Offline {
                    what: format!("`{file}` of `{}` at {commit}", source.repo),
                    cache: cache_text,
                },
            ));
        }
    }
    Ok(Snapshot {
        pinned,
        dir,
        info: None,
        downloaded: Vec::new(),
    })
}
