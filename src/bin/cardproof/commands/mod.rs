//! One module per command: a function from the validated config to an [`Outcome`] (the typed
//! value the printer renders, and its exit class) or a [`Failure`]. The printer is passed in for
//! what a command shows while it works (progress bars, notes about downloads and keys); exit
//! codes and error messages are `main`'s.

pub mod card;
pub mod check;
pub mod hash;
pub mod inspect;
pub mod keygen;
pub mod kld;
pub mod lint;
pub mod rerun;
pub mod schema;
pub mod sign;
pub mod verify_report;

use cardproof::hub::snapshot::Select;

use crate::printer::{self, Printer};

/// How a finished command ends: exit 0, or exit 1 for findings (lint errors, a report that does
/// not verify).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Clean,
    Findings,
}

/// What a command produced: the value to print, and its exit class.
#[derive(Debug)]
pub struct Outcome<T> {
    pub value: T,
    pub class: Class,
}

impl<T> Outcome<T> {
    pub fn clean(value: T) -> Self {
        Outcome {
            value,
            class: Class::Clean,
        }
    }

    /// Exit 1 when `findings`.
    pub fn findings_if(value: T, findings: bool) -> Self {
        Outcome {
            value,
            class: if findings {
                Class::Findings
            } else {
                Class::Clean
            },
        }
    }
}

/// Why a command has no outcome (exit 2).
#[derive(Debug)]
pub enum Failure {
    /// An input that cannot be used: one message naming the file and place.
    Input(cardproof::Error),
    /// Flags that do not go together, found after parsing.
    Usage(String),
}

impl From<cardproof::Error> for Failure {
    fn from(e: cardproof::Error) -> Self {
        Failure::Input(e)
    }
}

pub type Result<T> = std::result::Result<Outcome<T>, Failure>;

/// The Hub client for this command, from the environment (`HF_ENDPOINT`, `HF_TOKEN`, ...).
pub fn hub_client() -> cardproof::hub::Client {
    cardproof::hub::Client::new(cardproof::hub::HubConfig::from_env())
}

/// The signing key: `--key`, or the default one, created (and announced) on first use.
pub fn signing_key(
    printer: &Printer,
    path: Option<&std::path::Path>,
) -> cardproof::Result<ed25519_dalek::SigningKey> {
    match path {
        Some(path) => cardproof::attest::read_signing_key(path),
        None => cardproof::attest::default_signing_key().map(|(key, path, created)| {
            if created {
                printer.note(&format!(
                    "created your signing key {} (public key beside it); reports are signed with it",
                    path.display()
                ));
            }
            key
        }),
    }
}

/// Make the selected files of a Hub source present and verified in the Hugging Face cache, with
/// a download progress bar on a terminal, and say which commit was used.
pub fn materialize(
    printer: &Printer,
    client: &cardproof::hub::Client,
    source: &cardproof::hub::HfSource,
    select: Select<'_>,
) -> cardproof::Result<cardproof::hub::snapshot::Snapshot> {
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr())
        .then(|| printer::progress_bar(printer::DOWNLOAD_PROGRESS));
    let progress = |done: u64, total: u64| {
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    };
    let result = cardproof::hub::snapshot::materialize(client, source, select, &progress);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let snapshot = result?;
    printer.note(&format!(
        "{source} is commit {} ({}; {} file(s) downloaded and verified, the rest from the cache {})",
        snapshot.pinned.revision,
        if client.config().offline {
            "offline"
        } else {
            "pinned"
        },
        snapshot.downloaded.len(),
        snapshot.dir.display()
    ));
    Ok(snapshot)
}

/// The Hub source a path names: `hf:ORG/NAME[@REV]`, or a bare `ORG/NAME[@REV]` where no such
/// local path exists (said on stderr, as `huggingface-cli` users type it); `None`: a local path.
/// Every command that takes `hf:` asks this, so they read a path the same way.
pub fn hub_source(
    printer: &Printer,
    path: &std::path::Path,
) -> cardproof::Result<Option<cardproof::hub::HfSource>> {
    Ok(match cardproof::hub::HfSource::from_path(path) {
        Some(source) => Some(source?),
        None => cardproof::hub::HfSource::bare(path).inspect(|s| {
            printer.note(&format!(
                "{} is not a local path: reading it as the Hub repository {s}",
                path.display()
            ))
        }),
    })
}

/// A path for the local code: a Hub source becomes its verified snapshot folder (all files),
/// with the commit it resolved to.
pub fn local_path(
    printer: &Printer,
    path: &std::path::Path,
) -> cardproof::Result<(std::path::PathBuf, Option<cardproof::hub::HubPin>)> {
    match hub_source(printer, path)? {
        Some(source) => {
            let snapshot = materialize(printer, &hub_client(), &source, Select::All)?;
            let pin = source.pin(&snapshot.pinned.revision);
            Ok((snapshot.dir, Some(pin)))
        }
        None => Ok((path.to_owned(), None)),
    }
}
