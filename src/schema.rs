//! JSON Schemas generated from Rust types: one generator (draft 2020-12, an `$id`) for the
//! disclosure schema ([`crate::disclosure::json_schema`]) and every output document's
//! ([`crate::output::DOCUMENTS`]). Each is committed under `schema/` as [`text`] writes it, and a
//! test fails when a committed file differs from what its type generates.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::Value;

/// The generator settings every cardproof schema starts from (draft 2020-12); a schema adds its
/// own transforms.
pub fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12()
}

/// The root schema of `T` under `settings`, with `id` as its `$id`.
pub fn generate<T: JsonSchema>(settings: SchemaSettings, id: &str) -> Value {
    let mut schema = settings.into_generator().into_root_schema_for::<T>();
    schema.insert("$id".into(), id.into());
    schema.to_value()
}

/// A schema as committed: pretty JSON with a trailing newline.
pub fn text(schema: &Value) -> String {
    let mut text = serde_json::to_string_pretty(schema).expect("a schema serializes");
    text.push('\n');
    text
}
