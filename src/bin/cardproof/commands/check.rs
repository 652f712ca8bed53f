//! `check`: a Hub upload checked from its headers, or a local directory before its upload (exit
//! 1 for errors).

use cardproof::hub::check::CheckReport;

use super::{Outcome, hub_client};
use crate::config::CheckConfig;
use crate::printer;

pub fn run(config: &CheckConfig, printer: &crate::printer::Printer) -> super::Result<CheckReport> {
    let key = config
        .public_key
        .as_deref()
        .map(cardproof::attest::read_verifying_key)
        .transpose()?;
    let path = std::path::Path::new(&config.source);
    let report = match super::hub_source(printer, path)? {
        Some(source) => cardproof::hub::check::check(&hub_client(), &source, key.as_ref())?,
        None => {
            // Hashing (only when the card claims a digest or a report is there) can take a while.
            let bar = std::io::IsTerminal::is_terminal(&std::io::stderr())
                .then(|| printer::progress_bar(printer::HASH_PROGRESS));
            if let Some(bar) = &bar {
                bar.set_length(
                    cardproof::checkpoint::hash::total_size(path, &Default::default()).unwrap_or(0),
                );
            }
            let progress = |n: u64| {
                if let Some(bar) = &bar {
                    bar.inc(n);
                }
            };
            let report = cardproof::hub::check::check_local(path, key.as_ref(), &progress);
            if let Some(bar) = &bar {
                bar.finish_and_clear();
            }
            report?
        }
    };
    let errors = report.errors() > 0;
    Ok(Outcome::findings_if(report, errors))
}
