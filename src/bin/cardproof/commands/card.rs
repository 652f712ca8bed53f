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
    // Linted as `cardproof lint DIR` lints it: against the checkpoint beside it, when there is one.
    let dir = update
        .path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let lint = cardproof::lint::lint_at(&update.card, dir)?;
    let errors = lint.errors() > 0;
    let written = Written {
        update,
        measurement: config.measurement.clone(),
        lint,
    };
    Ok(Outcome::findings_if(written, errors))
}
