//! `verify-report`: a signed report checked offline (exit 1 when it does not verify).

use cardproof::attest::{CheckedReport, ReportRequest};

use super::Outcome;
use crate::config::VerifyReportConfig;

pub fn run(config: &VerifyReportConfig) -> super::Result<CheckedReport> {
    let report = cardproof::attest::check_report(&ReportRequest {
        envelope: &config.envelope,
        public_key: &config.public_key,
        checkpoint: config.checkpoint.as_deref(),
        card: config.card.as_deref(),
        study: config.study.as_deref(),
    })?;
    let failed = !report.verified();
    Ok(Outcome::findings_if(report, failed))
}
