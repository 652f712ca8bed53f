//! Signed verification reports: the cryptography behind `cardproof`'s attestations.
//!
//! A report is an [in-toto Statement v1] (one subject per checkpoint file, our own predicate)
//! wrapped in a [DSSE v1] envelope and signed with Ed25519. Both are open formats on purpose: a
//! consumer who does not trust cardproof can check a report with independent tooling
//! (securesystemslib's `dsse.Envelope.verify`, or any Ed25519 library plus the three-line PAE),
//! which `tests/attest_check.py` does in CI.
//!
//! * [`keys`]: Ed25519 keys as PKCS#8 / SPKI PEM files, the securesystemslib keyid, the default
//!   key directory.
//! * [`dsse`]: pre-authentication encoding, signing, co-signing, lenient base64.
//! * [`statement`]: the in-toto Statement and its subjects.
//! * [`verify`]: offline verification of an envelope and of a checkpoint against its subjects.
//! * [`sign`]: a measurement.json or report.json signed over a checkpoint's files (`cardproof sign`).
//! * [`check`]: every check of a signed report in one call (`cardproof verify-report`).
//!
//! Nothing here prints; the binary announces a created key and renders mismatches.
//!
//! [in-toto Statement v1]: https://github.com/in-toto/attestation/blob/main/spec/v1/statement.md
//! [DSSE v1]: https://github.com/secure-systems-lab/dsse/blob/master/protocol.md

pub mod artifact;
pub mod check;
pub mod dsse;
pub mod keys;
pub mod set;
pub mod sign;
pub mod statement;
pub mod verify;

#[cfg(test)]
mod tests;

pub use artifact::ARTIFACT_PREDICATE_TYPE;
pub use check::{CheckedReport, ReportRequest, check_report};
pub use dsse::{add_signature, pae, sign_envelope};
pub use keys::{
    KeyPair, create_keypair, default_key_dir, default_signing_key, generate_key, keyid,
    public_key_pem, read_signing_key, read_verifying_key, write_keypair,
};
pub use sign::{Signed, default_envelope_path, sign_document, sign_file};
pub use statement::{ResourceDescriptor, Statement, Subject, statement, statement_of, subjects};
pub use verify::{
    Mismatch, Outcome, Verified, check_card, check_subjects, compare_card, verify_envelope,
};

/// The in-toto Statement type this crate writes and accepts (v1; the URI carries the major
/// version, so a v2 statement is rejected rather than misread).
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";

/// The DSSE payload type of an in-toto statement. Verification rejects any other type: the
/// signature covers the type, and a payload of another type must not be interpreted as ours.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// The predicate type of a cardproof verification report.
pub const PREDICATE_TYPE: &str = "https://cardproof.dev/verification-report/v1";

/// The predicate type of a signed measurement.json (`cardproof sign`).
pub const MEASUREMENT_PREDICATE_TYPE: &str = "https://cardproof.dev/measurement/v1";

/// The predicate type of a signed study (`study.dsse.json`): its subjects are the study file and
/// the files of the checkpoints it compares, its predicate study.json.
pub const STUDY_PREDICATE_TYPE: &str = "https://cardproof.dev/study/v1";
