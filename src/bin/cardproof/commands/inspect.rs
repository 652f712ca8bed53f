//! `inspect`: what a checkpoint holds, from its headers (`hf:` sources by Range requests).

use cardproof::checkpoint::inspect::{Inspection, inspect_path};
use cardproof::hub::HfSource;
use cardproof::hub::snapshot::Select;

use super::{Outcome, hub_client, materialize};
use crate::config::InspectConfig;
use crate::printer::Printer;

pub fn run(config: &InspectConfig, printer: &Printer) -> super::Result<Vec<Inspection>> {
    let inspections = match super::hub_source(printer, &config.path)? {
        Some(source) => inspect_hub(printer, &source)?,
        None => inspect_path(&config.path)?,
    };
    Ok(Outcome::clean(inspections))
}

/// `inspect hf:...`: headers only by Range requests; offline, the cached snapshot.
fn inspect_hub(printer: &Printer, source: &HfSource) -> cardproof::Result<Vec<Inspection>> {
    let client = hub_client();
    if client.config().offline {
        let snapshot = materialize(printer, &client, source, Select::All)?;
        return inspect_path(&snapshot.dir);
    }
    let remote = cardproof::hub::remote::inspect_source(&client, source)?;
    printer.note(&format!(
        "{source} is commit {}: fetched {} of {} bytes",
        remote.commit, remote.bytes_fetched, remote.total_size
    ));
    Ok(remote.inspections)
}
