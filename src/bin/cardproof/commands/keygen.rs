//! `keygen`: a new Ed25519 key pair.

use cardproof::attest::KeyPair;

use super::Outcome;
use crate::config::KeygenConfig;

pub fn run(config: &KeygenConfig) -> super::Result<KeyPair> {
    Ok(Outcome::clean(cardproof::attest::create_keypair(
        &config.out,
    )?))
}
