//! `card`: a measurement written into a model card, which is then linted.

use std::path::PathBuf;

use cardproof::card::write::{CardUpdate, UpdateRequest};
use cardproof::lint::LintReport;

use super::Outcome;

/// The card written and its lint report.
pub struct Written {
    pub update: CardUpdate,
    pub measurement: PathBuf,
    pub lint: LintReport,
}

pub fn run(config: &UpdateRequest) -> super::Result<Written> {
    let update = cardproof::card::write::update_card(config)?;
    // Linted as `cardproof lint` lints it: a README.md against the checkpoint beside it (as
    // `lint DIR`), any other card file alone.
    let readme = update.path.file_name().is_some_and(|n| n == "README.md");
    let dir = match update.path.parent() {
        Some(d) if readme && d.as_os_str().is_empty() => std::path::Path::new("."),
        Some(d) if readme => d,
        _ => update.path.as_path(),
    };
    let lint = cardproof::lint::lint_at(&update.card, dir)?;
    let errors = lint.errors() > 0;
    let written = Written {
        update,
        measurement: config.measurement.clone(),
        lint,
    };
    Ok(Outcome::findings_if(written, errors))
}
