//! A JSON tree that keeps every object member, in order, duplicates included.
//!
//! serde_json keeps the last of two members with one key, and so does the official safetensors
//! crate (it deserializes into a `HashMap`); a first-wins parser reads the other one. Parsing into
//! this tree first lets the validators refuse duplicates and say where they are.

use std::collections::HashSet;
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    UInt(u64),
    NegInt(i64),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// The value as it would read in a message: numbers and short strings literally, the rest by
    /// kind.
    pub(crate) fn describe(&self) -> String {
        match self {
            Json::Null => "null".to_owned(),
            Json::Bool(b) => b.to_string(),
            Json::UInt(n) => n.to_string(),
            Json::NegInt(n) => n.to_string(),
            // Debug keeps `1e300` short where Display writes out every digit.
            Json::Float(f) => format!("{f:?}"),
            Json::Str(s) => format!("the string \"{}\"", super::shown(s)),
            Json::Array(_) => "an array".to_owned(),
            Json::Object(_) => "an object".to_owned(),
        }
    }
}

/// Parses `text` as one JSON value followed by nothing but whitespace, as `serde_json::from_str`
/// does. serde_json's recursion limit (128 levels) bounds the nesting, so neither parsing nor
/// walking or dropping the tree can exhaust the stack.
pub(crate) fn parse(text: &str) -> Result<Json, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Json::deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// The first key that occurs twice in one object of `value`, searched depth-first: the path of
/// the object holding it (`""` for `value` itself, else like `a.b[2]`) and the key.
pub(crate) fn find_duplicate(value: &Json) -> Option<(String, String)> {
    match value {
        Json::Object(members) => {
            let mut seen = HashSet::with_capacity(members.len());
            if let Some((key, _)) = members.iter().find(|(key, _)| !seen.insert(key.as_str())) {
                return Some((String::new(), key.clone()));
            }
            members.iter().find_map(|(key, child)| {
                find_duplicate(child).map(|(path, dup)| (join(key, &path), dup))
            })
        }
        Json::Array(items) => items.iter().enumerate().find_map(|(i, child)| {
            find_duplicate(child).map(|(path, dup)| (join(&format!("[{i}]"), &path), dup))
        }),
        _ => None,
    }
}

fn join(head: &str, tail: &str) -> String {
    match tail.as_bytes().first() {
        None => head.to_owned(),
        Some(b'[') => format!("{head}{tail}"),
        Some(_) => format!("{head}.{tail}"),
    }
}

/// Converts to serde_json's tree; only call this after [`find_duplicate`] found nothing, since a
/// `serde_json::Map` keeps one member per key.
pub(crate) fn into_value(value: Json) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(b),
        Json::UInt(n) => Value::from(n),
        Json::NegInt(n) => Value::from(n),
        // JSON numbers are finite, so `from_f64` cannot fail here; `Null` keeps this total.
        Json::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        Json::Str(s) => Value::String(s),
        Json::Array(items) => Value::Array(items.into_iter().map(into_value).collect()),
        Json::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(k, v)| (k, into_value(v)))
                .collect(),
        ),
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::UInt(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(u64::try_from(v).map_or(Json::NegInt(v), Json::UInt))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Str(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry::<String, Json>()? {
            members.push(member);
        }
        Ok(Json::Object(members))
    }
}
