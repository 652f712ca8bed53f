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

/// `reference sign`: an existing reference artifact or llama.cpp base file signed as the
/// reference's (FILE.dsse.json).
pub fn reference(args: &crate::cli::ReferenceSignArgs, printer: &Printer) -> super::Result<Signed> {
    let key = signing_key(printer, args.key.as_deref())?;
    Ok(Outcome::clean(cardproof::attest::artifact::sign_artifact(
        &args.file,
        args.reference.as_deref(),
        &key,
    )?))
}
