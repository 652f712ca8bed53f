//! Signed reference artifacts. An artifact is the reference's side of a rerun as its exporter
//! states it, so `reference export` signs what it wrote: an in-toto statement whose subject is
//! the artifact's bytes and whose predicate ([`ARTIFACT_PREDICATE_TYPE`]) is what the file states
//! (the reference's manifest and lm_head digests, the protocol's digest, the eval's token digest),
//! in a DSSE envelope beside it (`<file>.dsse.json`).
//!
//! A rerun accepts an artifact only through [`Trust`], the keys the user names (`--artifact-pub`,
//! the config directory's own key and `trusted/*.pub`): an envelope that verifies under one of
//! them, about this file, stating what the file states, makes the artifact
//! [`Vouch::Signed`]. Anything else is refused, unless the user says
//! `--trust-unsigned-artifact`, which makes it [`Vouch::SelfAsserted`]: its numbers are shown and
//! no claim is reproduced against them.

use std::path::{Path, PathBuf};

use ed25519_dalek::{SigningKey, VerifyingKey};
use serde_json::Value;

use super::verify::{Outcome, verify_envelope};
use crate::error::{Error, Result};
use crate::rerun::artifact::{ArtifactIdentity, Vouch, Voucher, envelope_path};

/// The predicate type of a signed reference artifact.
pub const ARTIFACT_PREDICATE_TYPE: &str = "https://cardproof.dev/reference-artifact/v1";

/// The config directory's folder of other people's public keys trusted for artifacts.
pub const TRUSTED_KEYS_DIR: &str = "trusted";

/// Keys read from `trusted/` at most (a folder of keys, not of anything).
const MAX_TRUSTED_KEYS: usize = 256;

/// Sign an artifact cardproof just wrote: `stated` is what the file states about itself, and
/// `reference` the reference it was made from when the file itself does not say (a llama.cpp
/// base file). Writes `<file>.dsse.json` and returns its path.
pub fn sign(
    path: &Path,
    sha256: &str,
    stated: &Value,
    reference: Option<&Value>,
    key: &SigningKey,
) -> Result<PathBuf> {
    let mut predicate = stated.clone();
    if let (Some(object), Some(reference)) = (predicate.as_object_mut(), reference) {
        object
            .entry("reference")
            .or_insert_with(|| reference.clone());
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let subject = super::Subject {
        name,
        sha256: sha256.to_owned(),
    };
    let statement = super::statement_of(ARTIFACT_PREDICATE_TYPE, &[subject], predicate);
    let payload = serde_json::to_vec(&statement)
        .map_err(|e| Error::internal(path, format!("cannot encode the statement: {e}")))?;
    let envelope = super::sign_envelope(&payload, super::PAYLOAD_TYPE, key);
    let out = envelope_path(path);
    let text = serde_json::to_vec_pretty(&envelope)
        .map_err(|e| Error::internal(&out, format!("cannot encode: {e}")))?;
    crate::files::write_atomically(&out, &text)?;
    Ok(out)
}

/// A public key trusted for artifacts, and where it came from.
#[derive(Debug, Clone)]
pub struct TrustedKey {
    pub key: VerifyingKey,
    pub source: String,
}

/// Whom the user trusts to vouch for a reference artifact.
#[derive(Debug, Clone)]
pub struct Trust {
    pub keys: Vec<TrustedKey>,
    /// `--trust-unsigned-artifact`: accept an artifact nobody trusted vouches for, as
    /// self-asserted.
    pub allow_unsigned: bool,
}

impl Trust {
    /// The keys named with `--artifact-pub` (each must read as an Ed25519 public key), then the
    /// config directory's: its own `cardproof.pub` and every `trusted/*.pub`.
    pub fn new(named: &[PathBuf], allow_unsigned: bool) -> Result<Trust> {
        let mut keys = Vec::new();
        for path in named {
            keys.push(TrustedKey {
                key: super::read_verifying_key(path)?,
                source: format!("--artifact-pub {}", path.display()),
            });
        }
        if let Ok(dir) = super::default_key_dir() {
            keys.extend(config_keys(&dir)?);
        }
        Ok(Trust {
            keys,
            allow_unsigned,
        })
    }

    /// The trust a run reads only when it uses an artifact (`artifact`): otherwise no key is
    /// read, so a stray file in the config directory's `trusted/` never fails a run that has no
    /// artifact to vouch for.
    pub fn when_used(
        artifact: Option<&Path>,
        named: &[PathBuf],
        allow_unsigned: bool,
    ) -> Result<Trust> {
        match artifact {
            Some(_) => Trust::new(named, allow_unsigned),
            None => Ok(Trust {
                keys: Vec::new(),
                allow_unsigned,
            }),
        }
    }

    /// Refuse, or with `--trust-unsigned-artifact` accept as self-asserted.
    fn unsigned(&self, path: &Path, reason: String) -> Result<Vouch> {
        if self.allow_unsigned {
            return Ok(Vouch::SelfAsserted { reason });
        }
        Err(Error::usage(
            path,
            format!(
                "is not vouched for: {reason}. An artifact is a claim by whoever made it; name its signer's public key with --artifact-pub KEY (or put it in the config directory's {TRUSTED_KEYS_DIR}/), or pass --trust-unsigned-artifact to use it anyway (then no claim can be reproduced against it)"
            ),
        ))
    }
}

/// The config directory's keys: `cardproof.pub` (the user's own) and `trusted/*.pub`, in name
/// order. Missing files are none; a file there that is not a public key is an error naming it.
fn config_keys(dir: &Path) -> Result<Vec<TrustedKey>> {
    let mut out = Vec::new();
    let own = dir.join(super::keys::PUBLIC_KEY_FILE);
    if std::fs::metadata(&own).is_ok_and(|m| m.is_file()) {
        out.push(TrustedKey {
            key: super::read_verifying_key(&own)?,
            source: format!("your own key {}", own.display()),
        });
    }
    let trusted = dir.join(TRUSTED_KEYS_DIR);
    let Ok(entries) = std::fs::read_dir(&trusted) else {
        return Ok(out);
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pub"))
        .collect();
    paths.sort();
    if paths.len() > MAX_TRUSTED_KEYS {
        return Err(Error::usage(
            &trusted,
            format!(
                "holds {} keys; at most {MAX_TRUSTED_KEYS} are read",
                paths.len()
            ),
        ));
    }
    for path in paths {
        out.push(TrustedKey {
            key: super::read_verifying_key(&path)?,
            source: format!("trusted key {}", path.display()),
        });
    }
    Ok(out)
}

impl Voucher for Trust {
    fn vouch(&self, a: &ArtifactIdentity) -> Result<Vouch> {
        let envelope = envelope_path(a.path);
        if std::fs::symlink_metadata(&envelope).is_err() {
            return self.unsigned(
                a.path,
                format!(
                    "there is no signed statement beside it ({})",
                    envelope.display()
                ),
            );
        }
        let mut tried = Vec::new();
        for trusted in &self.keys {
            match verify_envelope(&envelope, &trusted.key)? {
                Outcome::Verified(v) => {
                    let reference = about_this_file(&envelope, &v.statement, a)?;
                    return Ok(Vouch::Signed {
                        keyid: v.keyid,
                        key_source: trusted.source.clone(),
                        reference,
                    });
                }
                Outcome::Failed(_) => tried.push(super::keyid(&trusted.key)),
            }
        }
        let signers = signer_keyids(&envelope);
        self.unsigned(
            a.path,
            format!(
                "{} is signed by {} and verifies under none of the {} key(s) you trust{}",
                envelope.display(),
                if signers.is_empty() {
                    "no named key".to_owned()
                } else {
                    format!("keyid {}", signers.join(", "))
                },
                tried.len(),
                if tried.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", tried.join(", "))
                }
            ),
        )
    }
}

/// The keyids an envelope's signatures name (for the refusal's message only: unverified).
fn signer_keyids(envelope: &Path) -> Vec<String> {
    crate::files::read_capped(envelope, 64 << 20, "a DSSE envelope")
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|v| {
            v["signatures"].as_array().map(|s| {
                s.iter()
                    .filter_map(|e| e["keyid"].as_str().filter(|k| !k.is_empty()))
                    .map(str::to_owned)
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// A verified statement must be an artifact statement about exactly this file's bytes, stating
/// what the file states; returns the reference it vouches for. Anything else was signed about
/// another file or another claim, and is refused whatever the user trusts.
fn about_this_file(
    envelope: &Path,
    statement: &super::Statement,
    a: &ArtifactIdentity,
) -> Result<Value> {
    let refuse = |rule: String| Error::mismatch(envelope, None, rule);
    let kind = statement.predicate_type.as_str();
    if kind != ARTIFACT_PREDICATE_TYPE {
        return Err(refuse(format!(
            "is a signed `{kind}` statement, not a reference artifact's (`{ARTIFACT_PREDICATE_TYPE}`)"
        )));
    }
    let subjects = &statement.subject;
    let digests: Vec<&str> = subjects
        .iter()
        .filter_map(|s| s.digest.get("sha256").map(String::as_str))
        .collect();
    if digests.len() != 1 || subjects.len() != 1 || !digests[0].eq_ignore_ascii_case(&a.sha256) {
        return Err(refuse(format!(
            "is signed about {} (sha256 {}), not {} (sha256 {}): the artifact was changed or replaced after it was signed",
            subjects
                .first()
                .and_then(|s| s.name.as_deref())
                .unwrap_or("another file"),
            digests.join(", "),
            a.path.display(),
            a.sha256
        )));
    }
    let predicate = statement.predicate();
    let stated = a.stated.as_object().into_iter().flatten();
    for (field, value) in stated {
        if &predicate[field] != value {
            return Err(refuse(format!(
                "signs `{field}` as {}, but {} states {value}",
                predicate[field],
                a.path.display()
            )));
        }
    }
    let reference = predicate["reference"].clone();
    if !reference.is_object() {
        return Err(refuse(
            "names no reference (`predicate.reference`): a signed artifact says which reference it is"
                .into(),
        ));
    }
    Ok(reference)
}

/// Sign what `reference export` wrote (`exported` is its answer), recording the envelope and the
/// signer in it.
pub fn sign_exported(
    exported: &mut crate::rerun::export::Exported,
    key: &SigningKey,
) -> Result<()> {
    let path = PathBuf::from(&exported.artifact);
    let envelope = sign(
        &path,
        &exported.sha256,
        &exported.stated,
        Some(&exported.reference),
        key,
    )?;
    exported.envelope = Some(envelope.display().to_string());
    exported.signed_by = Some(super::keyid(&key.verifying_key()));
    Ok(())
}

/// `cardproof reference sign FILE`: sign an artifact that exists (one made by another run, or a
/// llama.cpp base file made by `llama-perplexity --kl-divergence-base`), vouching for it as the
/// reference's. `reference` is that model: required for a base file, which names none (its root
/// digest goes into the statement); for cardproof's artifact it must be the one its header names.
pub fn sign_artifact(
    path: &Path,
    reference: Option<&Path>,
    key: &SigningKey,
) -> Result<super::Signed> {
    use crate::checkpoint::hash::{HashOptions, hash_path};
    let root = |model: &Path| -> Result<String> {
        Ok(hash_path(model, &HashOptions::default(), &|_| {})?.root_sha256)
    };
    let (sha256, stated, named) = if crate::kld::source::is_llamacpp_base(path) {
        let base = crate::kld::llamacpp::BaseFile::open(path)?;
        let Some(model) = reference else {
            return Err(Error::usage(
                path,
                "is a llama.cpp base file, which names no reference: pass --reference MODEL, the model it was made from (its root digest is what the signature vouches for)",
            ));
        };
        let named = serde_json::json!({
            "path": model.display().to_string(),
            "manifest_sha256": root(model)?,
        });
        (
            crate::checkpoint::hash::hash_file(path)?,
            crate::rerun::artifact::llamacpp::stated(&base),
            Some(named),
        )
    } else {
        let artifact = crate::rerun::artifact::Artifact::open(path)?;
        if let Some(model) = reference {
            let named = artifact
                .header
                .reference
                .manifest_sha256
                .as_deref()
                .unwrap_or_default();
            let digest = root(model)?;
            if digest != named {
                return Err(Error::mismatch(
                    model,
                    None,
                    format!(
                        "is not the reference {} names (root sha256 {digest}, the artifact names {named:?})",
                        path.display()
                    ),
                ));
            }
        }
        (artifact.sha256.clone(), artifact.stated(), None)
    };
    let envelope = sign(path, &sha256, &stated, named.as_ref(), key)?;
    Ok(super::Signed {
        sha256: crate::checkpoint::hash::hash_file(&envelope)?,
        envelope,
        file: path.to_owned(),
        keyid: super::keyid(&key.verifying_key()),
        predicate_type: ARTIFACT_PREDICATE_TYPE.to_owned(),
        subjects: 1,
    })
}
