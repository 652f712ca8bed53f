//! `lint`: a card (local, or `hf:` with only README.md fetched), against the checkpoint beside it
//! when the path is a model directory.

use cardproof::card::Card;
use cardproof::hub::HfSource;
use cardproof::hub::snapshot::Select;
use cardproof::lint::LintReport;

use super::{Outcome, hub_client, materialize};
use crate::config::LintConfig;
use crate::printer::Printer;

/// The card linted and its findings.
pub struct Linted {
    pub card: Card,
    pub report: LintReport,
}

pub fn run(config: &LintConfig, printer: &Printer) -> super::Result<Linted> {
    let card = match HfSource::from_path(&config.path) {
        Some(source) => {
            let snapshot = materialize(
                printer,
                &hub_client(),
                &source?,
                Select::Only(&["README.md"]),
            )?;
            snapshot.read_card()?
        }
        None => Card::open(&config.path)?,
    };
    let report = cardproof::lint::lint_at(&card, &config.path)?;
    let errors = report.errors() > 0;
    Ok(Outcome::findings_if(Linted { card, report }, errors))
}
