//! `sign`: a measurement.json or report.json signed over a checkpoint's files.

use cardproof::attest::Signed;

use super::{Outcome, signing_key};
use crate::config::SignConfig;
use crate::printer::Printer;

pub fn run(config: &SignConfig, printer: &Printer) -> super::Result<Signed> {
    let key = signing_key(printer, config.key.as_deref())?;
    Ok(Outcome::clean(cardproof::attest::sign_file(
        &config.file,
        config.checkpoint.as_deref(),
        &key,
        config.out.as_deref(),
    )?))
}
