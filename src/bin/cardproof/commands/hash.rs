//! `hash`: the manifest of a checkpoint's files and its root digest (`hf:` sources downloaded
//! into the Hugging Face cache first), with a progress bar on a terminal.

use cardproof::checkpoint::hash::{Manifest, hash_path, total_size};

use super::{Outcome, local_path};
use crate::config::HashConfig;
use crate::printer::{self, Printer};

pub fn run(config: &HashConfig, printer: &Printer) -> super::Result<Manifest> {
    let (path, _) = local_path(printer, &config.path)?;
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
    Ok(Outcome::clean(result?))
}
