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

use crate::printer::Printer;

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
