//! `hash`: the manifest of a checkpoint's files and its root digest (`hf:` sources downloaded
//! into the Hugging Face cache first), with a progress bar on a terminal.

use std::path::PathBuf;

use cardproof::checkpoint::hash::{Manifest, hash_path, total_size};

use super::{Failure, Outcome, local_path};
use crate::config::HashConfig;
use crate::printer::{self, Printer};

/// What `hash` computed, and where its files are from where the user stands.
pub struct Hashed {
    pub manifest: Manifest,
    /// What the manifest's paths are relative to, as the user can open it (the directory given,
    /// a single file's directory, an `hf:` source's snapshot); empty for the current directory.
    pub base: PathBuf,
}

pub fn run(config: &HashConfig, printer: &Printer) -> super::Result<Hashed> {
    let (path, _) = local_path(printer, &config.path)?;
    let base = if path.is_dir() {
        path.clone()
    } else {
        path.parent().map(PathBuf::from).unwrap_or_default()
    };
    let base = if base.as_os_str().is_empty() || base == std::path::Path::new(".") {
        PathBuf::new()
    } else {
        base
    };
    // sha256sum reads a name with a backslash or a line break differently (the names inside
    // are refused by the library for the same reason).
    if base.to_str().is_none_or(|b| b.contains(['\\', '\n', '\r'])) {
        return Err(Failure::Usage(format!(
            "{}: the manifest's paths start with this directory, which sha256sum cannot read \
             back (not UTF-8, a backslash or a line break); hash from inside it: `cd DIR && \
             cardproof hash .`",
            base.display()
        )));
    }
    let bar = config
        .progress
        .then(|| printer::progress_bar(printer::HASH_PROGRESS));
    let progress = |n: u64| {
        if let Some(bar) = &bar {
            bar.inc(n);
        }
    };
    if let Some(bar) = &bar {
        bar.set_length(total_size(&path, &config.options).unwrap_or(0));
    }
    let result = hash_path(&path, &config.options, &progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    Ok(Outcome::clean(Hashed {
        manifest: result?,
        base,
    }))
}
