//! Offline verification: does an envelope carry a valid signature by a given key, and does a
//! checkpoint on disk still match the files the signed statement lists?
//!
//! Two kinds of "no" are kept apart. An envelope that is not an envelope (bad JSON, missing fields,
//! bad base64, a foreign payload type, a payload that is not a statement) is an input error
//! ([`Error`], exit 2): there is nothing to verify. A well-formed envelope whose signatures do not
//! check out, or a checkpoint that differs from the report, is a verification result
//! ([`Outcome::Failed`], a list of [`Mismatch`]es), which the caller reports as a failed check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ed25519_dalek::{Signature, VerifyingKey};
use serde::Serialize;
use serde_json::Value;

use super::PAYLOAD_TYPE;
use super::dsse::{EnvelopeParts, pae};
use super::keys::keyid;
use super::statement::parse_statement;
use crate::checkpoint::hash::{HashOptions, hash_path};
use crate::error::{Error, Result};
use crate::span::LineCol;

/// Envelopes hold a statement with one subject per file; 64 MiB is thousands of times a large
/// checkpoint's report, and refusing more keeps a wrong file from being read into memory.
const MAX_ENVELOPE: u64 = 64 * 1024 * 1024;

/// Values of [`Mismatch::what`].
pub mod what {
    /// A signature entry that does not verify under the given key.
    pub const SIGNATURE: &str = "signature";
    /// A signature entry whose keyid names another key.
    pub const KEYID: &str = "keyid";
    /// A subject of the statement with no matching file in the checkpoint, or one that cannot be
    /// compared (no name or no sha256).
    pub const SUBJECT: &str = "subject";
    /// A file whose SHA-256 differs from its subject's.
    pub const DIGEST: &str = "digest";
    /// A checkpoint file the statement does not list.
    pub const FILE: &str = "file";
    /// The card's `fidelity` block is not the one the report signed (or one side has none).
    pub const CARD: &str = "card";
    /// A file beside the envelope belongs to another run (or was changed after it).
    pub const SET: &str = "set";
}

/// A verified envelope: the statement parsed from the exact payload bytes that were verified, and
/// the keyid of the key that verified them.
#[derive(Debug, Clone)]
pub struct Verified {
    pub statement: super::Statement,
    pub keyid: String,
}

/// One reason verification failed. `what` is one of the [`what`] constants; `detail` is a
/// sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Mismatch {
    pub what: String,
    pub detail: String,
}

impl Mismatch {
    pub fn new(what: &str, detail: impl Into<String>) -> Self {
        Self {
            what: what.to_owned(),
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Verified(Box<Verified>),
    Failed(Vec<Mismatch>),
}

/// Verify the DSSE envelope in `path` against `key` (what `cardproof verify-report ENVELOPE --pub
/// KEY` does).
///
/// It passes when at least one signature verifies under `key` with `verify_strict` (which rejects
/// malleable and small-order signatures) over `PAE(payloadType, payload)`, *and* that entry's
/// keyid is empty or [`keyid`]`(key)`. The keyid is only a hint, but a hint naming another key
/// means the envelope claims a different signer, so it is not accepted silently. Otherwise the
/// result is [`Outcome::Failed`] with one [`Mismatch`] per signature entry saying why.
///
/// The payload is parsed as a statement only after a signature verified, and from the very bytes
/// that were verified (DSSE: never re-parse the envelope after verifying), so what the caller reads
/// is exactly what was signed.
pub fn verify_envelope(path: &Path, key: &VerifyingKey) -> Result<Outcome> {
    let bytes = crate::files::read_capped(path, MAX_ENVELOPE, "a DSSE envelope")?;
    let envelope: Value = serde_json::from_slice(&bytes).map_err(|e| {
        Error::at(
            path,
            LineCol {
                line: e.line(),
                column: e.column(),
            },
            crate::ErrorKind::Format {
                subject: None,
                rule: format!("not JSON, so not a DSSE envelope: {e}"),
            },
        )
    })?;
    let parts = EnvelopeParts::from_value(path, &envelope)?;
    if parts.payload_type != PAYLOAD_TYPE {
        return Err(Error::format(
            path,
            Some("payloadType"),
            format!(
                "is `{}`; a cardproof report has `{PAYLOAD_TYPE}`",
                parts.payload_type
            ),
        ));
    }

    let expected = keyid(key);
    let message = pae(&parts.payload_type, &parts.payload);
    let mut mismatches = Vec::new();
    for (i, entry) in parts.signatures.iter().enumerate() {
        let n = i + 1;
        let verifies = match Signature::from_slice(&entry.sig) {
            Ok(sig) => key.verify_strict(&message, &sig).is_ok(),
            Err(_) => {
                mismatches.push(Mismatch::new(
                    what::SIGNATURE,
                    format!(
                        "signature {n} is {} bytes, not an Ed25519 signature (64 bytes)",
                        entry.sig.len()
                    ),
                ));
                continue;
            }
        };
        let keyid_ok = entry.keyid.is_empty() || entry.keyid == expected;
        match (verifies, keyid_ok) {
            (true, true) => {
                let statement = parse_statement(path, &parts.payload)?;
                return Ok(Outcome::Verified(Box::new(Verified {
                    statement,
                    keyid: expected,
                })));
            }
            (verifies, false) => mismatches.push(Mismatch::new(
                what::KEYID,
                format!(
                    "signature {n} has keyid {}, which belongs to another key (the given key's \
                     keyid is {expected}){}",
                    entry.keyid,
                    if verifies {
                        "; its signature does verify under the given key, but the keyid was \
                         changed"
                    } else {
                        ""
                    }
                ),
            )),
            (false, true) => mismatches.push(Mismatch::new(
                what::SIGNATURE,
                format!(
                    "signature {n}{} does not verify under the given key: the payload, its type \
                     or the signature was changed, or another key signed it",
                    if entry.keyid.is_empty() {
                        String::new()
                    } else {
                        format!(" (keyid {})", entry.keyid)
                    }
                ),
            )),
        }
    }
    if parts.signatures.is_empty() {
        mismatches.push(Mismatch::new(
            what::SIGNATURE,
            "the envelope holds no signatures",
        ));
    }
    Ok(Outcome::Failed(mismatches))
}

/// Compare a verified statement's subjects with the checkpoint directory as it is now.
///
/// The directory is hashed with [`hash_path`] and default options (the card and repository
/// plumbing are left out, as when the report was made), and compared both ways by name: every
/// subject must name a hashed file with the same SHA-256 ([`what::SUBJECT`] when missing,
/// [`what::DIGEST`] with both digests when changed), and every hashed file must be a subject
/// ([`what::FILE`]). A subject without a name or a sha256 digest cannot be matched and is a
/// [`what::SUBJECT`] mismatch too. An empty list means the checkpoint matches. Errors are the
/// hasher's (an unreadable checkpoint).
pub fn check_subjects(statement: &super::Statement, checkpoint: &Path) -> Result<Vec<Mismatch>> {
    let manifest = hash_path(checkpoint, &HashOptions::default(), &|_| {})?;
    let on_disk: BTreeMap<&str, &str> = manifest
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.sha256.as_str()))
        .collect();
    Ok(compare_subjects(statement, on_disk))
}

/// Compare a verified statement's subjects with a file list (relative path -> SHA-256), both
/// ways, as [`check_subjects`] does for a directory. The list can come from anywhere that knows
/// the files' digests, e.g. the Hub's per-file LFS SHA-256 (no download needed).
pub fn compare_subjects(
    statement: &super::Statement,
    on_disk: BTreeMap<&str, &str>,
) -> Vec<Mismatch> {
    compare_subjects_in(statement, on_disk, "the checkpoint")
}

/// [`compare_subjects`], the files on disk named `place` in the messages (`the checkpoint`,
/// `the study's files`).
pub fn compare_subjects_in(
    statement: &super::Statement,
    mut on_disk: BTreeMap<&str, &str>,
    place: &str,
) -> Vec<Mismatch> {
    let mut mismatches = Vec::new();
    let listed = &statement.subject;
    if listed.is_empty() {
        mismatches.push(Mismatch::new(
            what::SUBJECT,
            "the statement lists no subjects to compare",
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, subject) in listed.iter().enumerate() {
        let name = subject.name.as_deref();
        let sha256 = subject.digest.get("sha256").map(String::as_str);
        let (Some(name), Some(sha256)) = (name, sha256) else {
            mismatches.push(Mismatch::new(
                what::SUBJECT,
                format!(
                    "subject {} has no name or no sha256 digest, so no file can be matched to it",
                    i + 1
                ),
            ));
            continue;
        };
        if !seen.insert(name) {
            mismatches.push(Mismatch::new(
                what::SUBJECT,
                format!("`{name}` is listed more than once"),
            ));
            continue;
        }
        match on_disk.remove(name) {
            None => mismatches.push(Mismatch::new(
                what::SUBJECT,
                format!("`{name}` is in the report but not in {place}"),
            )),
            Some(actual) if !actual.eq_ignore_ascii_case(sha256) => {
                mismatches.push(Mismatch::new(
                    what::DIGEST,
                    format!(
                        "`{name}` changed: the report has sha256 {sha256}, {place} has {actual}"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    for name in on_disk.keys() {
        mismatches.push(Mismatch::new(
            what::FILE,
            format!("`{name}` is in {place} but not in the report"),
        ));
    }
    mismatches
}

/// Compare the card's `fidelity` block with the one a verification report signed.
///
/// The report's predicate carries `card.fidelity_sha256`, the SHA-256 of the block's canonical
/// form ([`crate::card::canonical`]), `null` when the card it verified had no block. It must equal
/// the digest of `card`'s block now; `card` is `None` when there is no card at all (a checkpoint
/// without README.md). On a difference the first [`what::CARD`] mismatch gives both digests and
/// the next ones name each differing field, read against the signed `card.disclosure`
/// (`fidelity.results[0].value: signed 0.01661, card 0.0198`). A statement that is not a
/// verification report, or one without `card.fidelity_sha256` (made before the card was bound),
/// binds no card and is a mismatch too: it must not vouch for the card beside it. `card_name` names
/// the card in the messages.
pub fn compare_card(
    statement: &super::Statement,
    card: Option<&crate::card::Card>,
    card_name: &str,
) -> Vec<Mismatch> {
    use crate::card::canonical::{differences, fidelity_sha256};
    let predicate_type = statement.predicate_type.as_str();
    if predicate_type != super::PREDICATE_TYPE {
        return vec![Mismatch::new(
            what::CARD,
            format!(
                "the statement's predicate type is `{predicate_type}`, not a verification report \
                 (`{}`): it binds no card, so it says nothing about {card_name}",
                super::PREDICATE_TYPE
            ),
        )];
    }
    let signed_card = &statement.predicate()["card"];
    let signed = match signed_card.get("fidelity_sha256") {
        None => {
            return vec![Mismatch::new(
                what::CARD,
                "the report does not bind the card (its predicate has no \
                 `card.fidelity_sha256`: it was made before cardproof bound the card's fidelity \
                 block); rerun `cardproof verify` for a report that does",
            )];
        }
        Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Some(s.to_ascii_lowercase())
        }
        Some(other) => {
            return vec![Mismatch::new(
                what::CARD,
                format!("the report's `card.fidelity_sha256` is {other}, not a SHA-256"),
            )];
        }
    };
    let file = signed_card
        .pointer("/disclosure/candidate/file")
        .and_then(Value::as_str);
    let now = card.map_or(Value::Null, |c| {
        crate::disclosure::files::fidelity_of_file(c, file)
    });
    let digest = fidelity_sha256(&now);
    match (signed, digest) {
        (None, None) => Vec::new(),
        (Some(s), None) => vec![Mismatch::new(
            what::CARD,
            if card.is_some() {
                format!(
                    "{card_name} has no `fidelity` block, but the report signed one (sha256 {s})"
                )
            } else {
                format!(
                    "there is no card ({card_name}), but the report signed a `fidelity` block \
                     (sha256 {s})"
                )
            },
        )],
        (None, Some(d)) => vec![Mismatch::new(
            what::CARD,
            format!(
                "{card_name} has a `fidelity` block (sha256 {d}), but the report was signed for a \
                 card without one"
            ),
        )],
        (Some(s), Some(d)) if s == d => card.map_or_else(Vec::new, |c| {
            let mut m = model_index_edits(signed_card, c, card_name);
            m.extend(precision_edits(
                &statement.predicate()["claims"],
                c,
                card_name,
            ));
            m
        }),
        (Some(s), Some(d)) => {
            let mut mismatches = vec![Mismatch::new(
                what::CARD,
                format!(
                    "the `fidelity` block of {card_name} is not the one the report signed \
                     (sha256 {s} signed, {d} now): the card was edited after signing"
                ),
            )];
            if let Some(disclosure) = signed_card.get("disclosure") {
                const SHOWN: usize = 20;
                let fields = differences(disclosure, &now);
                let more = fields.len().saturating_sub(SHOWN);
                mismatches.extend(
                    fields
                        .into_iter()
                        .take(SHOWN)
                        .map(|f| Mismatch::new(what::CARD, f)),
                );
                if more > 0 {
                    mismatches.push(Mismatch::new(
                        what::CARD,
                        format!("and {more} more differing field(s)"),
                    ));
                }
            }
            mismatches
        }
    }
}

/// The card's `model-index` (the Hub's numbers) against the digest the report signed: edited,
/// added or removed after signing is a mismatch, as is a report that binds none (made before
/// cardproof bound it).
fn model_index_edits(
    signed_card: &Value,
    card: &crate::card::Card,
    card_name: &str,
) -> Vec<Mismatch> {
    use crate::card::canonical::{fidelity_sha256, model_index_json};
    let now = fidelity_sha256(&model_index_json(card));
    let signed = match signed_card.get("model_index_sha256") {
        None => {
            return vec![Mismatch::new(
                what::CARD,
                "the report does not bind the card's `model-index` (made before cardproof bound the numbers the Hub shows); rerun `cardproof verify` for a report that does",
            )];
        }
        Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.to_ascii_lowercase()),
        Some(other) => {
            return vec![Mismatch::new(
                what::CARD,
                format!("the report's `card.model_index_sha256` is {other}, not a SHA-256"),
            )];
        }
    };
    if signed == now {
        return Vec::new();
    }
    let show = |d: &Option<String>| d.clone().unwrap_or_else(|| "none".to_owned());
    vec![Mismatch::new(
        what::CARD,
        format!(
            "the `model-index` of {card_name} (the numbers the Hub shows) is not the one the report signed (sha256 {} signed, {} now): it was edited after signing",
            show(&signed),
            show(&now)
        ),
    )]
}

/// Claims whose value was reprinted after signing with other digits (`0.0166` → `0.016600`): the
/// canonical form reads both as one number, but the digits state the precision the verdict was
/// judged at, so a card claiming more precision than was verified is a mismatch too.
fn precision_edits(
    signed_claims: &Value,
    card: &crate::card::Card,
    card_name: &str,
) -> Vec<Mismatch> {
    let Some(fidelity) = card.metadata().and_then(|m| m.get("fidelity")) else {
        return Vec::new();
    };
    let now = crate::disclosure::results::claims(&fidelity.value, &|_| 0);
    signed_claims
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let index = usize::try_from(c["index"].as_u64()?).ok()?;
            let signed = c["claimed_text"].as_str()?;
            let text = &now.get(index)?.text;
            (text != signed).then(|| {
                Mismatch::new(
                    what::CARD,
                    format!(
                        "fidelity.results[{index}].value: signed `{signed}`, {card_name} `{text}` (the same number printed with another precision; the report judged the signed one)"
                    ),
                )
            })
        })
        .collect()
}

/// The card `verify-report` compares with a verified statement, and the result: `card`
/// (`--card FILE`: a Markdown file or a directory holding README.md), else the checkpoint
/// directory's README.md (its absence is a mismatch when the report signed a `fidelity` block).
/// `None` when there is nothing to compare: neither given, or only a checkpoint for a statement
/// that is not a verification report (a signed measurement binds no card; `--card` with one is
/// a mismatch). A card that cannot be read or parsed is an error.
pub fn check_card(
    statement: &super::Statement,
    card: Option<&Path>,
    checkpoint: Option<&Path>,
) -> Result<Option<(std::path::PathBuf, Vec<Mismatch>)>> {
    use crate::card::Card;
    let (path, parsed) = match (card, checkpoint) {
        (Some(c), _) => {
            let path = crate::card::resolve_card_path(c)?;
            let parsed = Card::open(&path)?;
            (path, Some(parsed))
        }
        (None, Some(dir)) => {
            if statement.predicate_type != super::PREDICATE_TYPE {
                return Ok(None);
            }
            let dir = if dir.is_file() {
                dir.parent().unwrap_or(Path::new("."))
            } else {
                dir
            };
            let path = dir.join("README.md");
            let parsed = match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                _ => Some(Card::open(&path)?),
            };
            (path, parsed)
        }
        (None, None) => return Ok(None),
    };
    let name = path.display().to_string();
    let mismatches = compare_card(statement, parsed.as_ref(), &name);
    Ok(Some((path, mismatches)))
}
