//! cardproof: make the fidelity (KL-divergence) claims on quantized LLM model cards checkable.
//!
//! The library does the work and returns typed results and errors; the `cardproof` binary parses
//! arguments, prints and chooses exit codes. Pipeline: [`card`] (front matter with spans) ->
//! [`disclosure`] (the schema) -> [`lint`] (findings).

pub mod attest;
pub mod card;
pub mod checkpoint;
pub mod dequant;
pub mod disclosure;
pub mod error;
pub mod files;
pub mod findings;
pub mod hub;
pub mod json_f64;
pub mod kld;
pub mod lint;
pub mod output;
pub mod outset;
pub mod report;
#[cfg(feature = "native")]
pub mod rerun;
pub mod runner;
pub mod schema;
pub mod span;
#[cfg(feature = "native")]
pub mod verify;

pub use error::{Error, ErrorKind, Result};

/// Version of every JSON document cardproof prints (`"schema_version"`).
pub const JSON_SCHEMA_VERSION: u32 = 1;
