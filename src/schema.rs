//! JSON Schemas generated from Rust types: one generator (draft 2020-12, an `$id`) for the
//! disclosure schema ([`crate::disclosure::json_schema`]) and every output document's
//! ([`crate::output::DOCUMENTS`]). Each is committed under `schema/` as [`text`] writes it, and a
//! test fails when a committed file differs from what its type generates.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
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

/// `"schema_version"`, first in every document: always [`crate::JSON_SCHEMA_VERSION`]. A
/// change that breaks a reader of a document bumps it, and the schema files' `-v1`. A document
/// read back (`measurement.json`) deserializes it from exactly that number and refuses another.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchemaVersion;

impl Serialize for SchemaVersion {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(crate::JSON_SCHEMA_VERSION)
    }
}

impl<'de> Deserialize<'de> for SchemaVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let version = u64::deserialize(deserializer)?;
        if version == u64::from(crate::JSON_SCHEMA_VERSION) {
            Ok(SchemaVersion)
        } else {
            Err(serde::de::Error::custom(format!(
                "unsupported schema_version {version} (this cardproof reads version {})",
                crate::JSON_SCHEMA_VERSION
            )))
        }
    }
}

impl JsonSchema for SchemaVersion {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SchemaVersion".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "The version of this document's shape.",
            "const": crate::JSON_SCHEMA_VERSION,
        })
    }
}
