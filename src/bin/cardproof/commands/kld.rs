//! `kld`: two logit files (or llama.cpp base files) measured against each other.

use cardproof::kld::Measurement;
use cardproof::kld::compat::CompatMeasurement;

use super::Outcome;
use crate::config::KldConfig;

/// The measurement: cardproof's, or llama.cpp's statistics (`--llamacpp-compat`).
pub enum Kld {
    Measurement(Measurement),
    Compat(CompatMeasurement),
}

pub fn run(config: &KldConfig) -> super::Result<Kld> {
    let kld = if config.llamacpp_compat {
        Kld::Compat(cardproof::kld::compat::compat_measure(
            &config.reference,
            &config.candidate,
        )?)
    } else {
        Kld::Measurement(cardproof::kld::measure(
            &config.reference,
            &config.candidate,
            &config.options,
        )?)
    };
    Ok(Outcome::clean(kld))
}
