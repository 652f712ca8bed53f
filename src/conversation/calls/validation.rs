//! Each call checked against the conversation's `tools`: a known name, arguments that are JSON,
//! and arguments its `parameters` schema accepts.

use std::collections::BTreeMap;

use jsonschema::Validator;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Call, ParsedCall, prefix};

/// The most tool declarations a conversation may carry.
pub const MAX_TOOLS: usize = 4096;

/// The most bytes of a schema mismatch's reason kept (a message quotes the offending value).
const MAX_REASON_BYTES: usize = 1024;

/// What a call is, checked against the tools the conversation declares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "check", rename_all = "snake_case")]
pub enum CallCheck {
    Valid,
    /// The call's markup or its arguments do not parse.
    InvalidJson,
    /// No declared tool has the call's name.
    UnknownName,
    /// The arguments are JSON the tool's `parameters` schema refuses.
    SchemaMismatch {
        reason: String,
    },
}

impl CallCheck {
    pub fn as_str(&self) -> &'static str {
        match self {
            CallCheck::Valid => "valid",
            CallCheck::InvalidJson => "invalid_json",
            CallCheck::UnknownName => "unknown_name",
            CallCheck::SchemaMismatch { .. } => "schema_mismatch",
        }
    }
}

/// The conversation's tool declarations, each `parameters` schema compiled once for all the
/// calls checked against it.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    tools: Vec<Tool>,
    /// Name → index into `tools`.
    by_name: BTreeMap<String, usize>,
}

#[derive(Debug, Clone)]
struct Tool {
    /// The `parameters` schema, absent when the declaration has none (any object passes).
    parameters: Option<Value>,
    validator: Option<Validator>,
}

impl Tools {
    /// From a conversation's `tools` (null or a list): OpenAI's `{"type": "function",
    /// "function": {"name", "description", "parameters"}}` or the bare function object. The
    /// reason names the declaration (its index) or the tool whose schema does not compile.
    pub fn from_declarations(declarations: &Value) -> Result<Tools, String> {
        let list = match declarations {
            Value::Null => return Ok(Tools::default()),
            Value::Array(list) => list,
            _ => return Err("`tools` is not a list of tool declarations".into()),
        };
        if list.len() > MAX_TOOLS {
            return Err(format!(
                "`tools` declares {} tools, over cardproof's bound of {MAX_TOOLS}",
                list.len()
            ));
        }
        let mut tools = Tools::default();
        for (i, declaration) in list.iter().enumerate() {
            let (name, tool) = declared(i, declaration)?;
            if let Some(first) = tools.by_name.get(&name) {
                return Err(format!(
                    "tool declarations {first} and {i} are both named `{name}`"
                ));
            }
            tools.by_name.insert(name, tools.tools.len());
            tools.tools.push(tool);
        }
        Ok(tools)
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The declared names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    fn get(&self, name: &str) -> Option<&Tool> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    /// A text-valued call ([`Call::text_values`]) with each value read as its parameter's
    /// schema types it: kept as text where a string is allowed, else the first of null
    /// (`None`, `null`), boolean (`True`, `true`, ...), integer, number, array and object the
    /// text spells, else left as text (which the schema then refuses). Values of unknown
    /// parameters stay text. Any other call is returned as it is.
    pub fn typed(&self, call: &Call) -> Call {
        let (true, Value::Object(arguments), Some(tool)) =
            (call.text_values, &call.arguments, self.get(&call.name))
        else {
            return call.clone();
        };
        let properties = tool
            .parameters
            .as_ref()
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object);
        let typed: Map<String, Value> = arguments
            .iter()
            .map(|(key, value)| {
                let schema = properties.and_then(|p| p.get(key));
                let value = match (value, schema) {
                    (Value::String(text), Some(schema)) => read_as(text, &types_of(schema)),
                    _ => value.clone(),
                };
                (key.clone(), value)
            })
            .collect();
        Call {
            name: call.name.clone(),
            arguments: Value::Object(typed),
            text_values: false,
        }
    }
}

/// Declaration `i`: its name and its compiled schema.
fn declared(i: usize, declaration: &Value) -> Result<(String, Tool), String> {
    let Value::Object(object) = declaration else {
        return Err(format!("tool declaration {i} is not an object"));
    };
    let function = match object.get("function") {
        Some(Value::Object(function)) => function,
        Some(_) => {
            return Err(format!(
                "tool declaration {i}'s `function` is not an object"
            ));
        }
        None => object,
    };
    let name = match function.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => return Err(format!("tool declaration {i} has no name")),
    };
    let parameters = function.get("parameters").filter(|p| !p.is_null()).cloned();
    let validator = match &parameters {
        Some(schema) => Some(jsonschema::validator_for(schema).map_err(|e| {
            format!(
                "the `parameters` schema of tool `{name}` (declaration {i}) does not compile: {e}"
            )
        })?),
        None => None,
    };
    Ok((
        name,
        Tool {
            parameters,
            validator,
        },
    ))
}

/// `call` checked against `tools`.
pub fn check(call: &ParsedCall, tools: &Tools) -> CallCheck {
    let call = match call {
        ParsedCall::Ok(call) => call,
        ParsedCall::Malformed { .. } => return CallCheck::InvalidJson,
    };
    let Some(tool) = tools.get(&call.name) else {
        return CallCheck::UnknownName;
    };
    let typed = tools.typed(call);
    let arguments = match typed.arguments {
        Value::String(text) => match serde_json::from_str::<Value>(&text) {
            Ok(arguments) => arguments,
            Err(_) => return CallCheck::InvalidJson,
        },
        arguments => arguments,
    };
    if !arguments.is_object() {
        return CallCheck::SchemaMismatch {
            reason: format!("the arguments are {}, not an object", kind(&arguments)),
        };
    }
    let Some(validator) = &tool.validator else {
        return CallCheck::Valid;
    };
    let reasons: Vec<String> = validator
        .iter_errors(&arguments)
        .take(3)
        .map(|e| {
            let at = e.instance_path().as_str();
            let at = if at.is_empty() { "arguments" } else { at };
            format!("{at}: {e}")
        })
        .collect();
    match reasons.is_empty() {
        true => CallCheck::Valid,
        false => CallCheck::SchemaMismatch {
            reason: prefix(&reasons.join("; "), MAX_REASON_BYTES).to_owned(),
        },
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The JSON types a parameter's schema allows: its `type` (one or a list), those of its
/// `anyOf`/`oneOf` branches (pydantic's `Optional`), and those of its `enum`/`const` values.
fn types_of(schema: &Value) -> Vec<&'static str> {
    let mut types = Vec::new();
    declared_types(schema, &mut types);
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = schema.get(key) {
            branches.iter().for_each(|b| declared_types(b, &mut types));
        }
    }
    let values = schema
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .chain(schema.get("const"));
    for value in values {
        add_type(json_type(value), &mut types);
    }
    types
}

/// The types a schema's own `type` names.
fn declared_types(schema: &Value, types: &mut Vec<&'static str>) {
    match schema.get("type") {
        Some(Value::String(t)) => add_type(t, types),
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(Value::as_str)
            .for_each(|t| add_type(t, types)),
        _ => {}
    }
}

fn add_type(t: &str, types: &mut Vec<&'static str>) {
    if let Some(known) = TYPES.iter().find(|k| **k == t)
        && !types.contains(known)
    {
        types.push(known);
    }
}

/// The types text may be read as, in the order tried.
const TYPES: [&str; 7] = [
    "string", "null", "boolean", "integer", "number", "array", "object",
];

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `text` as the first of `types` it spells (a string where one is allowed), else as text.
fn read_as(text: &str, types: &[&str]) -> Value {
    if types.is_empty() || types.contains(&"string") {
        return Value::String(text.to_owned());
    }
    let trimmed = text.trim();
    let json = serde_json::from_str::<Value>(trimmed).ok();
    for t in TYPES.iter().filter(|t| types.contains(t)) {
        let read = match *t {
            "null" => matches!(trimmed, "None" | "null").then_some(Value::Null),
            "boolean" => match trimmed {
                "True" | "true" => Some(Value::Bool(true)),
                "False" | "false" => Some(Value::Bool(false)),
                _ => None,
            },
            "integer" => json.clone().filter(|v| {
                v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0)
            }),
            "number" => json.clone().filter(Value::is_number),
            "array" => json.clone().filter(Value::is_array),
            "object" => json.clone().filter(Value::is_object),
            _ => None,
        };
        if let Some(value) = read {
            return value;
        }
    }
    Value::String(text.to_owned())
}
