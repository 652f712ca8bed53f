//! Integration tests through the `cardproof` binary. One test binary (links once).

mod bad_input;
mod fixtures;
mod hash;
mod inspect;
mod kld;
mod lint;
mod schema;
mod support;
