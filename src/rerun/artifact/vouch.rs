//! Who vouches for a reference artifact. An artifact (cardproof's own or a llama.cpp base file)
//! is the reference's side of a rerun stated by whoever made it: a file claiming another model's
//! identity, with its `.sha256` sidecar recomputed, is as easy to make as a true one. So a lane
//! that reads an artifact asks a [`Voucher`] (the binary's: `attest::artifact::Trust`, the keys
//! the user named) who signed what the artifact states, and records the answer, a [`Vouch`], in
//! the measurement; `verify` never gives `reproduced` against a reference nobody vouched for.
//!
//! This module holds only the data and the seam; the signatures are checked in
//! `attest::artifact`, above which the rerun does not reach.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an artifact file states about itself, as a signer signs it: the statement's predicate
/// (the artifact's kind, the reference's identity, the protocol and the eval's digests), and
/// the file's own digest, its subject.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactIdentity<'a> {
    pub path: &'a Path,
    /// SHA-256 of the file's bytes (lowercase hex).
    pub sha256: String,
    /// What the file itself says (every field must equal the signed predicate's).
    pub stated: Value,
}

/// Who vouches for an artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum Vouch {
    /// A DSSE envelope beside the artifact (`<file>.dsse.json`) verifies under a key the user
    /// trusts, its subject is the file's digest and its predicate is what the file states.
    Signed {
        /// The securesystemslib keyid of the key that verified it.
        keyid: String,
        /// Where that key came from (`--artifact-pub PATH`, or a key in the config directory).
        key_source: String,
        /// The reference the signer vouches for, as signed (`manifest_sha256`, `path`, ...).
        reference: Value,
    },
    /// Nobody: the user accepted the artifact with `--trust-unsigned-artifact`. Its numbers are
    /// shown, but no claim is reproduced against them.
    SelfAsserted {
        /// Why it is not vouched for (no envelope, no trusted key verifies it, ...).
        reason: String,
    },
}

impl Vouch {
    pub fn is_signed(&self) -> bool {
        matches!(self, Vouch::Signed { .. })
    }

    /// One line for people: who vouches for the reference and which one it claims to be.
    pub fn describe(&self) -> String {
        match self {
            Vouch::Signed {
                keyid, reference, ..
            } => {
                let manifest = reference["manifest_sha256"].as_str().unwrap_or("");
                if manifest.is_empty() {
                    format!("artifact signed by {keyid}, naming no reference manifest")
                } else {
                    format!("artifact signed by {keyid}, claiming manifest {manifest}")
                }
            }
            Vouch::SelfAsserted { reason } => {
                format!("self-asserted artifact, signed by no trusted key ({reason})")
            }
        }
    }
}

/// Decides who vouches for an artifact (`Err`: refused, exit 2 — unsigned or untrusted without
/// the user's consent, or a signature over something else).
pub trait Voucher: Sync + std::fmt::Debug {
    fn vouch(&self, artifact: &ArtifactIdentity) -> crate::error::Result<Vouch>;
}

/// A reference artifact as a lane's reference: the file, who decides whether it is vouched for,
/// and the reference's own weights when the user has them too (a seeded sample of the
/// artifact's rows is then recomputed from them and must match).
#[derive(Debug, Clone, Copy)]
pub struct ArtifactSource<'a> {
    pub file: &'a Path,
    pub voucher: &'a dyn Voucher,
    pub reference: Option<&'a Path>,
}

/// The rows of an artifact recomputed from the reference's weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SpotCheck {
    /// Seeds the choice of windows (random per run, recorded so the check can be repeated).
    pub seed: u64,
    /// `[context_length, window]` pairs recomputed.
    pub windows: Vec<[u64; 2]>,
    pub rows: u64,
    /// The largest per-row KL(recomputed || artifact) over those rows, in nats, in the
    /// artifact's vocabulary mode.
    pub max_row_kld: f64,
    /// The most [`SpotCheck::max_row_kld`] may be.
    pub limit: f64,
    /// The reference's root digest, which must be the one the artifact names.
    pub reference_manifest_sha256: String,
}

/// The most a recomputed row may differ from the artifact's (KL, nats). An artifact exported by
/// the native lane differs by the products' rounding only (0 to ~1e-11 nats: 1.3e-11 on the fp8
/// example's rows); another model's rows passed off as the reference's differ by ~1e-4 and more
/// (7e-4 on a row of the w8a16 example's artifact against the bf16 reference).
pub const SPOT_CHECK_MAX_ROW_KLD: f64 = 1e-6;

/// How many windows of `n` a spot check recomputes: one in sixteen, at least four (all of them
/// when there are fewer).
pub fn spot_check_windows(n: usize) -> usize {
    n.min(4.max(n.div_ceil(16)))
}
