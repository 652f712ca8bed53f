//! The output contract: every JSON document a command prints with `--json`, as a type, and the
//! committed JSON Schema of each.
//!
//! A document is an object with `"schema_version": 1` first ([`SchemaVersion`]), then the
//! command's fields. The binary builds these types from the library's results and serializes
//! them; it has no other way to put JSON on stdout (SARIF, a format of its own, is [`sarif`]).
//! A failed command prints an [`ErrorDocument`] instead.
//!
//! [`DOCUMENTS`] names every document and generates its schema (draft 2020-12, the generator of
//! [`crate::schema`]); each is committed as `schema/<name>-v1.schema.json`. Beside the stdout
//! documents it holds the files cardproof writes (`measurement.json`, `report.json`,
//! `sweep.json`) and the transformers runner's exchange (`request.json`, `record.json`). A test
//! fails when a committed schema differs from its type, and others run the commands on the
//! examples and validate what they printed or wrote against the committed schema. Some
//! documents embed values from `src/kld` whose types have no schema of their own;
//! [`kld`] describes them.

pub mod kld;
pub mod sarif;
pub mod text;

use std::path::Path;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use crate::attest::{CheckedReport, KeyPair, Mismatch, Signed};
use crate::card::write::CardUpdate;
use crate::checkpoint::hash::{Manifest, ManifestEntry};
use crate::checkpoint::inspect::Inspection;
use crate::findings::Finding;
use crate::hub::check::CheckReport;
use crate::lint::LintReport;

use crate::schema::SchemaVersion;

fn display(path: &Path) -> String {
    path.display().to_string()
}

/// `lint --json`: the card's findings.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LintDocument<'a> {
    pub schema_version: SchemaVersion,
    /// The card linted (`hf:REPO@COMMIT/README.md` for a card on the Hub).
    pub file: String,
    pub findings: &'a [Finding],
}

impl<'a> LintDocument<'a> {
    pub fn new(file: &Path, report: &'a LintReport) -> Self {
        LintDocument {
            schema_version: SchemaVersion,
            file: display(file),
            findings: &report.findings,
        }
    }
}

/// `inspect --json`: one entry per checkpoint (a directory of GGUF files holds one per variant;
/// a single file or checkpoint is a one-element list).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InspectDocument<'a> {
    pub schema_version: SchemaVersion,
    pub variants: &'a [Inspection],
}

impl<'a> InspectDocument<'a> {
    pub fn new(variants: &'a [Inspection]) -> Self {
        InspectDocument {
            schema_version: SchemaVersion,
            variants,
        }
    }
}

/// `hash --json`: the manifest and its root digest.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HashDocument<'a> {
    pub schema_version: SchemaVersion,
    pub files: &'a [ManifestEntry],
    /// SHA-256 of the manifest in `sha256sum` format.
    pub root_sha256: &'a str,
    /// Paths left out, relative to the hashed path.
    pub excluded: &'a [String],
}

impl<'a> HashDocument<'a> {
    pub fn new(manifest: &'a Manifest) -> Self {
        HashDocument {
            schema_version: SchemaVersion,
            files: &manifest.files,
            root_sha256: &manifest.root_sha256,
            excluded: &manifest.excluded,
        }
    }
}

/// `kld --json`: the measurement of one pair of logit files.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KldDocument<'a> {
    pub schema_version: SchemaVersion,
    #[serde(flatten)]
    #[schemars(with = "kld::Measurement")]
    pub measurement: &'a crate::kld::Measurement,
}

impl<'a> KldDocument<'a> {
    pub fn new(measurement: &'a crate::kld::Measurement) -> Self {
        KldDocument {
            schema_version: SchemaVersion,
            measurement,
        }
    }
}

/// `kld --llamacpp-compat --json`: llama.cpp's statistics of two base files.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KldCompatDocument<'a> {
    pub schema_version: SchemaVersion,
    #[serde(flatten)]
    #[schemars(with = "kld::CompatMeasurement")]
    pub measurement: &'a crate::kld::compat::CompatMeasurement,
}

impl<'a> KldCompatDocument<'a> {
    pub fn new(measurement: &'a crate::kld::compat::CompatMeasurement) -> Self {
        KldCompatDocument {
            schema_version: SchemaVersion,
            measurement,
        }
    }
}

/// Whether `card` created the card or updated one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CardAction {
    Created,
    Updated,
}

/// Lint's counts for the card written.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct LintCounts {
    pub errors: usize,
    pub warnings: usize,
    /// The findings of the card as written (as `lint --json` gives them): among them, prose KLD
    /// numbers outside the generated section that contradict the new block.
    pub findings: Vec<crate::findings::Finding>,
}

/// `card --json`: the card written and its lint counts.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CardDocument<'a> {
    pub schema_version: SchemaVersion,
    /// The card written.
    pub card: String,
    pub action: CardAction,
    /// SHA-256 of the card as written.
    pub sha256: &'a str,
    /// The measurement.json written into it.
    pub measurement: String,
    pub lint: LintCounts,
    /// What the writer left undone or wants looked at.
    pub warnings: &'a [String],
}

impl<'a> CardDocument<'a> {
    pub fn new(update: &'a CardUpdate, measurement: &Path, lint: &LintReport) -> Self {
        CardDocument {
            schema_version: SchemaVersion,
            card: display(&update.path),
            action: if update.created {
                CardAction::Created
            } else {
                CardAction::Updated
            },
            sha256: &update.sha256,
            measurement: display(measurement),
            lint: LintCounts {
                errors: lint.errors(),
                warnings: lint.warnings(),
                findings: lint.findings.clone(),
            },
            warnings: &update.warnings,
        }
    }
}

/// `keygen --json`: the key pair written.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KeygenDocument<'a> {
    pub schema_version: SchemaVersion,
    pub private_key: String,
    pub public_key: String,
    pub keyid: &'a str,
}

impl<'a> KeygenDocument<'a> {
    pub fn new(keys: &'a KeyPair) -> Self {
        KeygenDocument {
            schema_version: SchemaVersion,
            private_key: display(&keys.private),
            public_key: display(&keys.public),
            keyid: &keys.keyid,
        }
    }
}

/// `sign --json`: the envelope written and what it signs.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SignDocument<'a> {
    pub schema_version: SchemaVersion,
    /// The DSSE envelope written.
    pub envelope: String,
    /// SHA-256 of the envelope file.
    pub sha256: &'a str,
    /// The measurement.json or report.json signed.
    pub signed: String,
    pub keyid: &'a str,
    pub predicate_type: &'a str,
    /// How many checkpoint files the statement lists.
    pub subjects: usize,
}

impl<'a> SignDocument<'a> {
    pub fn new(signed: &'a Signed) -> Self {
        SignDocument {
            schema_version: SchemaVersion,
            envelope: display(&signed.envelope),
            sha256: &signed.sha256,
            signed: display(&signed.file),
            keyid: &signed.keyid,
            predicate_type: &signed.predicate_type,
            subjects: signed.subjects,
        }
    }
}

/// `verify-report --json`: whether the signed report verifies, and why not.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct VerifyReportDocument<'a> {
    pub schema_version: SchemaVersion,
    pub envelope: String,
    /// The keyid of the public key checked against.
    pub keyid: &'a str,
    /// The signature verifies and nothing mismatches.
    pub verified: bool,
    /// The checkpoint whose files were compared with the subjects.
    pub subjects_checked: Option<String>,
    /// The card whose fidelity block was compared with the signed one.
    pub card_checked: Option<String>,
    /// The study file whose subjects (it, its reference's and arms' files) were compared.
    pub study_checked: Option<String>,
    /// The directory beside the envelope whose files were checked against the signed set
    /// (`null`: the envelope stands alone, nothing beside it is vouched for).
    pub set_checked: Option<String>,
    pub run_id: Option<&'a str>,
    pub mismatches: &'a [Mismatch],
    pub predicate_type: Option<&'a str>,
    /// A verification report's verdict (a signed measurement has none).
    pub verdict: Option<&'a str>,
}

impl<'a> VerifyReportDocument<'a> {
    pub fn new(report: &'a CheckedReport) -> Self {
        VerifyReportDocument {
            schema_version: SchemaVersion,
            envelope: display(&report.envelope),
            keyid: &report.keyid,
            verified: report.verified(),
            subjects_checked: report.subjects_checked.as_deref().map(display),
            card_checked: report.card_checked.as_deref().map(display),
            study_checked: report.study_checked.as_deref().map(display),
            set_checked: report.set_checked.as_deref().map(display),
            run_id: report.run_id.as_deref(),
            mismatches: &report.mismatches,
            predicate_type: report.predicate_type.as_deref(),
            verdict: report.verdict.as_deref(),
        }
    }
}

/// `check --json`: a Hub upload checked from its headers.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CheckDocument<'a> {
    pub schema_version: SchemaVersion,
    #[serde(flatten)]
    pub report: &'a CheckReport,
}

impl<'a> CheckDocument<'a> {
    pub fn new(report: &'a CheckReport) -> Self {
        CheckDocument {
            schema_version: SchemaVersion,
            report,
        }
    }
}

/// What every command prints with `--json` when it fails (exit 2): bad input, or a usage error
/// found after parsing.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorDocument {
    pub schema_version: SchemaVersion,
    pub error: ErrorBody,
}

/// The error: one message, and the file and place it concerns where there is one.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorBody {
    pub message: String,
    /// Absent (`null`) for a usage error.
    pub file: Option<String>,
    /// 1-based.
    pub line: Option<usize>,
    /// 1-based, in characters.
    pub column: Option<usize>,
    /// What the error is about, a stable name ([`crate::Error::kind_name`]): `usage` for a usage
    /// error, else one of `io`, `write`, `not_found`, `no_readme`, `too_large`, `not_utf8`,
    /// `yaml`, `duplicate_key`, `budget`, `unsupported_yaml`, `format`, `card`, `tokenizer`,
    /// `mismatch`, `unsupported`, `internal`, `hub`, `runner`.
    pub kind: &'static str,
}

impl ErrorDocument {
    pub fn new(error: &crate::Error) -> Self {
        ErrorDocument {
            schema_version: SchemaVersion,
            error: ErrorBody {
                message: error.message(),
                file: Some(display(&error.file)),
                line: error.at.map(|a| a.line),
                column: error.at.map(|a| a.column),
                kind: error.kind_name(),
            },
        }
    }

    pub fn usage(message: &str) -> Self {
        ErrorDocument {
            schema_version: SchemaVersion,
            error: ErrorBody {
                message: message.to_owned(),
                file: None,
                line: None,
                column: None,
                kind: "usage",
            },
        }
    }
}

/// One document: its name (the schema file is `schema/<name>-v1.schema.json`), the field that
/// holds its version, and its type's schema.
#[derive(Debug, Clone, Copy)]
pub struct Document {
    pub name: &'static str,
    /// The field holding the document's version, `const` in its schema: `schema_version` in
    /// cardproof's own documents, `protocol` in the transformers runner's exchange.
    pub version_field: &'static str,
    generate: fn(&str) -> Value,
}

impl Document {
    /// The document `T`, committed as `schema/<name>-v1.schema.json`: its schema describes what
    /// cardproof writes (schemars' serialize contract): a field is required unless it may be
    /// left out, and `null` is allowed where it may be printed.
    pub const fn of<T: JsonSchema>(name: &'static str) -> Document {
        Document {
            name,
            version_field: "schema_version",
            generate: generate::<T, false>,
        }
    }

    /// One side of the transformers runner's exchange, versioned by `protocol`. Its schema is
    /// what the reading side must accept (schemars' deserialize contract): a field with a
    /// default, or `null`able, may be absent (the runner reads a request of an earlier cardproof
    /// of the same protocol, and answers a failure with no runs).
    pub const fn exchange<T: JsonSchema>(name: &'static str) -> Document {
        Document {
            name,
            version_field: "protocol",
            generate: generate::<T, true>,
        }
    }

    /// The schema file, relative to the repository root.
    pub fn path(&self) -> String {
        format!("schema/{}-v1.schema.json", self.name)
    }

    /// The schema's `$id`.
    pub fn id(&self) -> String {
        format!("https://cardproof.dev/{}", self.path())
    }

    pub fn schema(&self) -> Value {
        (self.generate)(&self.id())
    }

    /// The schema as committed.
    pub fn schema_text(&self) -> String {
        crate::schema::text(&self.schema())
    }
}

/// `T`'s schema under the deserialize contract (`READ`) or the serialize contract.
fn generate<T: JsonSchema, const READ: bool>(id: &str) -> Value {
    let settings = crate::schema::settings();
    let settings = if READ {
        settings.for_deserialize()
    } else {
        settings.for_serialize()
    };
    crate::schema::generate::<T>(settings, id)
}

/// Every document with a committed schema: what the commands print with `--json`, the files
/// they write, and the transformers runner's exchange. A new document is one more entry here:
/// its schema file then comes from the drift test (`CARDPROOF_BLESS=1`).
pub const DOCUMENTS: &[Document] = &[
    Document::of::<LintDocument<'static>>("lint"),
    Document::of::<InspectDocument<'static>>("inspect"),
    Document::of::<HashDocument<'static>>("hash"),
    Document::of::<KldDocument<'static>>("kld"),
    Document::of::<KldCompatDocument<'static>>("kld-llamacpp-compat"),
    Document::of::<CardDocument<'static>>("card"),
    Document::of::<KeygenDocument<'static>>("keygen"),
    Document::of::<SignDocument<'static>>("sign"),
    Document::of::<VerifyReportDocument<'static>>("verify-report"),
    Document::of::<CheckDocument<'static>>("check"),
    Document::of::<ErrorDocument>("error"),
    #[cfg(feature = "native")]
    Document::of::<crate::rerun::document::Measurement>("measurement"),
    #[cfg(feature = "native")]
    Document::of::<crate::verify::Report>("report"),
    #[cfg(feature = "native")]
    Document::of::<crate::verify::FilesSummary>("verify-files"),
    #[cfg(feature = "native")]
    Document::of::<crate::rerun::sweep::Sweep>("sweep"),
    #[cfg(feature = "native")]
    Document::of::<crate::rerun::export::Exported>("export"),
    #[cfg(feature = "native")]
    Document::of::<crate::study::document::StudyDocument>("study"),
    #[cfg(feature = "native")]
    Document::exchange::<crate::runner::exchange::RunnerRequest>("runner-request"),
    #[cfg(feature = "native")]
    Document::exchange::<crate::runner::exchange::RunnerRecord>("runner-record"),
];

/// The document called `name` in [`DOCUMENTS`].
pub fn document(name: &str) -> Option<&'static Document> {
    DOCUMENTS.iter().find(|d| d.name == name)
}
