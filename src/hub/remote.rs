//! Inspect a Hub repository from header bytes alone.
//!
//! The local inspector reads files; rather than teach every reader a second input, we build a
//! *header mirror*: a temporary folder with the small files (`config.json`,
//! `hf_quant_config.json`, indexes) copied whole, and for each shard a sparse file of its real
//! size holding only the bytes the readers look at (the safetensors length and JSON header, the
//! GGUF header, bitsandbytes' tiny quant-state tensors), fetched by HTTP Range. The very same
//! inspector then runs on it, so `inspect hf:...` and `check` give exactly what a local
//! `inspect` of the downloaded files gives, and every parser cap (the 100 MB safetensors header
//! limit, config and index limits) applies to remote bytes too. Files already in the cache are
//! linked instead of fetched.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::cache::{RepoCache, cache_err};
use super::client::{Client, RepoInfo, Sibling};
use super::{HfSource, HubError};
use crate::checkpoint::inspect::Inspection;
use crate::checkpoint::{gguf, safetensors};
use crate::error::{Error, Result};

/// Small files read whole: beyond the local readers' own caps (16 MiB configs, 64 MiB indexes)
/// nothing is fetched.
const MAX_SMALL_FILE: u64 = 64 << 20;
/// bitsandbytes quant-state tensors are a few hundred bytes of JSON; the inspector's cap.
const MAX_QUANT_STATE: u64 = 64 * 1024;
/// GGUF headers hold the tokenizer (a few MB for large vocabularies); refuse beyond this.
pub const MAX_GGUF_HEADER: u64 = 256 << 20;
/// First GGUF read; doubled (or grown to what the parser says it needs) until the header fits.
const GGUF_FIRST_READ: u64 = 1 << 20;

/// The header mirror of a pinned repository, with the inspector's results.
pub struct Remote {
    pub inspections: Vec<Inspection>,
    /// Each published layout (`layouts/<file>.tensor-types.txt`) against its GGUF's header.
    pub layouts: Vec<crate::checkpoint::layout::LayoutCheck>,
}

/// A source inspected from its headers ([`inspect_source`]).
pub struct SourceInspection {
    /// The commit the source's revision resolved to.
    pub commit: String,
    pub inspections: Vec<Inspection>,
    /// Bytes fetched from the Hub, and the repository's size.
    pub bytes_fetched: u64,
    pub total_size: u64,
}

/// `inspect hf:...` online: resolve the revision to a commit and inspect the files there from
/// their headers ([`inspect_remote`]).
pub fn inspect_source(client: &Client, source: &HfSource) -> Result<SourceInspection> {
    let info = client.repo_info(source)?;
    let pinned = source.at(&info.sha);
    let remote = inspect_remote(client, &pinned, &info)?;
    Ok(SourceInspection {
        inspections: remote.inspections,
        bytes_fetched: client.bytes_fetched(),
        total_size: info.total_size(),
        commit: info.sha,
    })
}

fn is_small_config(name: &str) -> bool {
    name == "config.json"
        || name == "hf_quant_config.json"
        || name.ends_with(".safetensors.index.json")
}

/// Whether the repository holds weights the inspector reads (top-level safetensors or GGUF).
pub fn has_checkpoint(info: &RepoInfo) -> bool {
    info.siblings.iter().any(|s| {
        !s.rfilename.contains('/')
            && !crate::checkpoint::members::excluded(&s.rfilename)
            && (s.rfilename.ends_with(".safetensors")
                || s.rfilename.ends_with(".gguf")
                || s.rfilename == "model.safetensors.index.json")
    })
}

/// Inspect `pinned` (a source at its commit) from headers. Errors name `hf:REPO@COMMIT/FILE`.
pub fn inspect_remote(client: &Client, pinned: &HfSource, info: &RepoInfo) -> Result<Remote> {
    let cache = RepoCache::new(&client.config().cache_dir, &pinned.repo);
    let mirror = tempfile::Builder::new()
        .prefix("cardproof-hub-")
        .tempdir()
        .map_err(|e| cache_err(pinned, None, &std::env::temp_dir(), e))?;
    let root = mirror.path();
    for s in info.siblings.iter().filter(|s| !s.rfilename.contains('/')) {
        let name = s.rfilename.as_str();
        let lower = name.to_ascii_lowercase();
        let wanted = !crate::checkpoint::members::excluded(name)
            && (is_small_config(name)
                || lower.ends_with(".safetensors")
                || lower.ends_with(".gguf"));
        if !wanted {
            continue;
        }
        let dest = root.join(name);
        if let Some(cached) = cache.cached_file(&info.sha, name)
            && std::fs::metadata(&cached).is_ok_and(|m| m.len() == s.file_size())
        {
            link(pinned, &cached, &dest)?;
            continue;
        }
        if is_small_config(name) {
            small_file(client, pinned, s, &dest)?;
        } else if lower.ends_with(".safetensors") {
            safetensors_header(client, pinned, s, &dest)?;
        } else {
            gguf_header(client, pinned, s, &dest)?;
        }
    }
    // A publisher's per-file layouts: small text files, compared with the headers above.
    for s in info.siblings.iter().filter(|s| is_layout(&s.rfilename)) {
        let dest = root.join(&s.rfilename);
        std::fs::create_dir_all(root.join("layouts"))
            .map_err(|e| cache_err(pinned, None, &root.join("layouts"), e))?;
        if let Some(cached) = cache.cached_file(&info.sha, &s.rfilename)
            && std::fs::metadata(&cached).is_ok_and(|m| m.len() == s.file_size())
        {
            link(pinned, &cached, &dest)?;
        } else {
            small_file(client, pinned, s, &dest)?;
        }
    }
    let inspections = crate::checkpoint::inspect::inspect_path(root)
        .map_err(|e| rename_error(e, root, pinned))?;
    let layouts =
        crate::checkpoint::layout::check_dir(root).map_err(|e| rename_error(e, root, pinned))?;
    Ok(Remote {
        inspections,
        layouts,
    })
}

/// `layouts/<file>.tensor-types.txt`, one level deep (no other path is fetched for it).
fn is_layout(name: &str) -> bool {
    name.strip_prefix("layouts/").is_some_and(|rest| {
        !rest.contains('/')
            && rest.ends_with(".tensor-types.txt")
            && crate::disclosure::files::is_bare_name(rest)
    })
}

/// Errors from the mirror name the Hub file, not the temporary folder.
fn rename_error(mut e: Error, root: &Path, pinned: &HfSource) -> Error {
    if let Ok(rel) = e.file.strip_prefix(root) {
        let rel = rel.to_string_lossy().replace('\\', "/");
        e.file = pinned.display_path((!rel.is_empty()).then_some(rel.as_str()));
    }
    e
}

fn link(pinned: &HfSource, cached: &Path, dest: &Path) -> Result<()> {
    let cached = cached.canonicalize().unwrap_or_else(|_| cached.to_owned());
    #[cfg(unix)]
    let r = std::os::unix::fs::symlink(&cached, dest);
    #[cfg(not(unix))]
    let r = std::fs::copy(&cached, dest).map(|_| ());
    r.map_err(|e| cache_err(pinned, None, dest, e))
}

fn small_file(client: &Client, pinned: &HfSource, s: &Sibling, dest: &Path) -> Result<()> {
    let size = s.file_size();
    if size > MAX_SMALL_FILE {
        return Err(pinned.error(
            Some(&s.rfilename),
            HubError::TooLarge {
                what: format!("`{}`", s.rfilename),
                size,
                limit: MAX_SMALL_FILE,
            },
        ));
    }
    let bytes = client.read_range(pinned, &s.rfilename, 0, size, size)?;
    std::fs::write(dest, bytes).map_err(|e| cache_err(pinned, Some(&s.rfilename), dest, e))
}

/// A sparse file of `size` bytes with `parts` written at their offsets.
fn sparse(
    pinned: &HfSource,
    name: &str,
    dest: &Path,
    size: u64,
    parts: &[(u64, &[u8])],
) -> Result<()> {
    let err = |e| cache_err(pinned, Some(name), dest, e);
    let mut f = std::fs::File::create(dest).map_err(err)?;
    f.set_len(size).map_err(err)?;
    for (offset, bytes) in parts {
        f.seek(SeekFrom::Start(*offset)).map_err(err)?;
        f.write_all(bytes).map_err(err)?;
    }
    Ok(())
}

/// The 8-byte length, then exactly the JSON header; a length the parser will refuse is not
/// followed (the mirror then holds only the 8 bytes and the inspector reports the same error a
/// local run would).
fn safetensors_header(client: &Client, pinned: &HfSource, s: &Sibling, dest: &Path) -> Result<()> {
    let name = s.rfilename.as_str();
    let size = s.file_size();
    let first = client.read_range(pinned, name, 0, 8, size)?;
    let Some(len) = first.first_chunk::<8>().map(|b| u64::from_le_bytes(*b)) else {
        return sparse(pinned, name, dest, size, &[(0, &first)]);
    };
    if len > safetensors::MAX_HEADER_BYTES || 8 + len > size {
        return sparse(pinned, name, dest, size, &[(0, &first)]);
    }
    let header = client.read_range(pinned, name, 8, 8 + len, size)?;
    let mut prefix = first;
    prefix.extend_from_slice(&header);
    // bitsandbytes keeps each module's logical shape in a small JSON tensor: fetch those too.
    let mut extra: Vec<(u64, Vec<u8>)> = Vec::new();
    if let Ok(parsed) = safetensors::parse_header(&PathBuf::from(name), &prefix, size) {
        for t in &parsed.tensors {
            let quant_state = t.name.ends_with(".quant_state.bitsandbytes__nf4")
                || t.name.ends_with(".quant_state.bitsandbytes__fp4");
            if quant_state && t.byte_len() <= MAX_QUANT_STATE {
                let bytes = client.read_range(pinned, name, t.data.start, t.data.end, size)?;
                extra.push((t.data.start, bytes));
            }
        }
    }
    let mut parts: Vec<(u64, &[u8])> = vec![(0, &prefix)];
    parts.extend(extra.iter().map(|(o, b)| (*o, b.as_slice())));
    sparse(pinned, name, dest, size, &parts)
}

/// Grow the read until the GGUF parser has the whole header (or finds the file malformed).
fn gguf_header(client: &Client, pinned: &HfSource, s: &Sibling, dest: &Path) -> Result<()> {
    let name = s.rfilename.as_str();
    let size = s.file_size();
    let mut bytes = client.read_range(pinned, name, 0, GGUF_FIRST_READ.min(size), size)?;
    loop {
        match gguf::parse_header(&PathBuf::from(name), &bytes, size) {
            Ok(_) | Err(gguf::ParseError::Malformed(_)) => break,
            Err(gguf::ParseError::NeedMore(n)) => {
                let have = bytes.len() as u64;
                let next = n.max(have.saturating_mul(2)).min(size);
                if next <= have {
                    break;
                }
                if next > MAX_GGUF_HEADER {
                    return Err(pinned.error(
                        Some(name),
                        HubError::TooLarge {
                            what: "the GGUF header".into(),
                            size: next,
                            limit: MAX_GGUF_HEADER,
                        },
                    ));
                }
                let more = client.read_range(pinned, name, have, next, size)?;
                bytes.extend_from_slice(&more);
            }
        }
    }
    sparse(pinned, name, dest, size, &[(0, &bytes)])
}
