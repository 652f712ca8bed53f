//! `check`: a Hub upload checked from its headers (exit 1 for errors).

use cardproof::hub::check::CheckReport;

use super::{Outcome, hub_client};
use crate::config::CheckConfig;

pub fn run(config: &CheckConfig) -> super::Result<CheckReport> {
    let source = cardproof::hub::HfSource::parse(&config.source)?;
    let key = config
        .public_key
        .as_deref()
        .map(cardproof::attest::read_verifying_key)
        .transpose()?;
    let report = cardproof::hub::check::check(&hub_client(), &source, key.as_ref())?;
    let errors = report.errors() > 0;
    Ok(Outcome::findings_if(report, errors))
}
