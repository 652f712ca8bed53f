//! cardproof: make the fidelity (KL-divergence) claims on quantized LLM model cards checkable.
//!
//! The library does the work and returns typed results and errors; the `cardproof` binary parses
//! arguments, prints and chooses exit codes. The pipeline, one way: [`card`] (front matter with
//! spans) -> [`disclosure`] (the schema as types) -> [`checkpoint`] and [`dequant`] (what the
//! files hold) -> [`kld`] (the KLD engine) -> [`runner`] (models to logits) -> [`rerun`] (one
//! rerun path: a request in, a typed [`rerun::Measurement`] out) -> [`lint`] and [`verify`]
//! (findings, verdicts, the typed [`verify::Report`]) -> [`report`] and [`attest`] (renderings, the
//! signed statement). [`hub`] makes `hf:` sources local; [`output`] holds every `--json`
//! document as a type. docs/DESIGN.md opens with the module map.

pub mod attest;
pub mod card;
pub mod checkpoint;
pub mod conversation;
pub mod dequant;
pub mod digest;
pub mod disclosure;
pub mod error;
pub mod files;
pub mod findings;
pub mod hub;
pub mod json_f64;
pub mod kld;
pub mod lint;
pub mod markdown;
pub mod output;
pub mod outset;
pub mod report;
#[cfg(feature = "native")]
pub mod rerun;
pub mod runner;
pub mod schema;
pub mod span;
#[cfg(feature = "native")]
pub mod study;
#[cfg(feature = "native")]
pub mod verify;

pub use error::{Error, ErrorKind, Result};

/// Version of every JSON document cardproof prints (`"schema_version"`).
pub const JSON_SCHEMA_VERSION: u32 = 1;
