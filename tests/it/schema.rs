//! The committed JSON Schema matches the Rust types, and `cardproof schema` prints it.

use crate::support::*;

const COMMITTED: &str = "schema/disclosure-v1.schema.json";

#[test]
fn committed_schema_matches_the_types() {
    let committed = std::fs::read_to_string(repo_root().join(COMMITTED)).unwrap_or_default();
    let generated = cardproof::disclosure::json_schema_text();
    if committed != generated {
        if std::env::var_os("CARDPROOF_BLESS").is_some() {
            std::fs::write(repo_root().join(COMMITTED), &generated).unwrap();
            return;
        }
        panic!(
            "{COMMITTED} is out of date with src/disclosure; rerun with CARDPROOF_BLESS=1 and \
             commit the result"
        );
    }
}

#[test]
fn schema_command_prints_the_committed_schema() {
    let run = cardproof(&["schema"]);
    assert_eq!(run.code, 0);
    let committed = std::fs::read_to_string(repo_root().join(COMMITTED)).unwrap();
    assert_eq!(run.stdout, committed);
    let schema: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
}

#[test]
fn the_schema_is_a_valid_draft_2020_12_schema() {
    let schema: serde_json::Value =
        serde_json::from_str(&cardproof::disclosure::json_schema_text()).unwrap();
    assert!(jsonschema::meta::is_valid(&schema));
}

#[test]
fn the_compliant_example_deserializes_into_the_types() {
    // The types and the schema agree on the compliant card: it validates and it deserializes.
    let run = cardproof(&["lint", "examples/cards/compliant-fp8", "--json"]);
    assert_eq!(run.code, 0);
    let card =
        cardproof::card::Card::open(&repo_root().join("examples/cards/compliant-fp8")).unwrap();
    let fidelity = card
        .metadata()
        .unwrap()
        .get("fidelity")
        .unwrap()
        .value
        .to_json();
    let disclosure: cardproof::disclosure::Disclosure = serde_json::from_value(fidelity).unwrap();
    assert_eq!(disclosure.schema, cardproof::disclosure::SCHEMA_ID);
    assert_eq!(disclosure.results.as_ref().map(Vec::len), Some(4));
}
