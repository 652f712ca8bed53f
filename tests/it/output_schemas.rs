//! The committed schema of every document (`schema/<name>-v1.schema.json`) matches its type in
//! `cardproof::output`, and [`assert_valid`] checks a command's output or a file it wrote against
//! it (the commands themselves run in `output_contract` and `written_documents`).

use serde_json::Value;

use crate::support::repo_root;

/// The committed schema of the document `name` ([`cardproof::output::DOCUMENTS`]).
fn committed(name: &str) -> Value {
    let document = cardproof::output::document(name)
        .unwrap_or_else(|| panic!("no output document `{name}` in cardproof::output::DOCUMENTS"));
    let path = repo_root().join(document.path());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run the tests with CARDPROOF_BLESS=1)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap()
}

/// `schema` with every object that declares `properties` closed to others, so a field the
/// output has and its schema lacks fails validation. The committed schemas stay open (a reader
/// of v1 keeps working when a field is added); the tests are strict.
fn closed(mut schema: Value) -> Value {
    fn close(v: &mut Value) {
        match v {
            Value::Object(map) => {
                if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                    map.insert("additionalProperties".into(), false.into());
                }
                map.values_mut().for_each(close);
            }
            Value::Array(items) => items.iter_mut().for_each(close),
            _ => {}
        }
    }
    close(&mut schema);
    schema
}

/// One place where a document breaks its committed schema.
#[derive(Debug)]
pub struct Violation {
    /// `its schema`, or `its schema, closed` (to undeclared fields).
    pub how: &'static str,
    /// The JSON pointer of the value that breaks it.
    pub at: String,
    pub message: String,
}

/// Where `doc` breaks the committed schema of the document `name`, as committed and closed to
/// undeclared fields.
pub fn violations(name: &str, doc: &Value) -> Vec<Violation> {
    let mut out = Vec::new();
    for (schema, how) in [
        (committed(name), "its schema"),
        (closed(committed(name)), "its schema, closed"),
    ] {
        let validator = jsonschema::validator_for(&schema)
            .unwrap_or_else(|e| panic!("schema `{name}` does not compile: {e}"));
        out.extend(validator.iter_errors(doc).map(|e| Violation {
            how,
            at: e.instance_path().to_string(),
            message: e.to_string(),
        }));
    }
    out
}

/// `doc` is a document `name` as its committed schema describes it, with no undeclared fields
/// and version 1 (`"schema_version": 1`, or `"protocol": 1` in the runner's exchange).
#[track_caller]
pub fn assert_valid(name: &str, what: &str, doc: &Value) {
    let document = cardproof::output::document(name)
        .unwrap_or_else(|| panic!("no output document `{name}` in cardproof::output::DOCUMENTS"));
    assert_eq!(doc[document.version_field], 1, "{what}: {doc}");
    let errors = violations(name, doc);
    if let Some(first) = errors.first() {
        let listed: Vec<String> = errors
            .iter()
            .filter(|v| v.how == first.how)
            .map(|v| format!("{} at {}", v.message, v.at))
            .collect();
        panic!(
            "{what}: the output does not validate against {} ({}):\n{}\n{doc:#}",
            first.how,
            repo_root().join(document.path()).display(),
            listed.join("\n")
        );
    }
}

#[test]
fn committed_output_schemas_match_the_types() {
    let bless = std::env::var_os("CARDPROOF_BLESS").is_some();
    let mut stale = Vec::new();
    for document in cardproof::output::DOCUMENTS {
        let path = repo_root().join(document.path());
        let generated = document.schema_text();
        if std::fs::read_to_string(&path).ok().as_deref() != Some(generated.as_str()) {
            if bless {
                std::fs::write(&path, &generated).unwrap();
            } else {
                stale.push(document.path());
            }
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} out of date with cardproof::output; rerun with CARDPROOF_BLESS=1 and commit the \
         result"
    );
}

#[test]
fn every_committed_schema_has_its_type() {
    let mut known: Vec<String> = cardproof::output::DOCUMENTS
        .iter()
        .map(|d| d.path())
        .collect();
    known.push("schema/disclosure-v1.schema.json".into());
    // The study file's (an input): tests/it/study.rs keeps it in step with its type.
    known.push("schema/study-file-v1.schema.json".into());
    for entry in std::fs::read_dir(repo_root().join("schema")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let path = format!("schema/{name}");
        assert!(
            known.contains(&path),
            "{path} belongs to no type (remove it)"
        );
    }
}

#[test]
fn output_schemas_are_draft_2020_12_with_a_version() {
    for document in cardproof::output::DOCUMENTS {
        let schema = document.schema();
        assert!(jsonschema::meta::is_valid(&schema), "{}", document.name);
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        assert_eq!(schema["$id"], document.id().as_str());
        let version = document.version_field;
        assert_eq!(
            schema["properties"][version]["const"], 1,
            "{}",
            document.name
        );
        let required = schema["required"].as_array().unwrap();
        assert!(required.contains(&version.into()), "{}", document.name);
    }
}
