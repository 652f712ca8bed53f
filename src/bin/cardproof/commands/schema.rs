//! `schema`: the JSON Schema of the `fidelity` block.

use super::Outcome;

pub fn run() -> super::Result<String> {
    Ok(Outcome::clean(cardproof::disclosure::json_schema_text()))
}
