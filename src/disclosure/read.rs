//! The card's `fidelity` block (as JSON, from the YAML tree) read into the disclosure types, one
//! section at a time: a card with a broken `calibration` still has a readable `protocol`, and a
//! verification reruns what it can read. Extension keys (`x-...`, `x_...`) are dropped before
//! reading, as the schema allows them everywhere and the types do not name them.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Eval, Protocol, Reference, Runtime};

/// `value` without extension keys, at every depth.
fn without_extensions(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !(k.starts_with("x-") || k.starts_with("x_")))
                .map(|(k, v)| (k.clone(), without_extensions(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_extensions).collect()),
        other => other.clone(),
    }
}

/// One section read into its type; the error names the field path from `at`
/// (`protocol.aggregation.uncertainty.resamples: invalid type: ...`).
pub fn section<T: DeserializeOwned>(value: &Value, at: &str) -> Result<T, String> {
    if value.is_null() {
        return Err(format!("{at} missing"));
    }
    let value = without_extensions(value);
    serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        let path = path
            .split('.')
            .filter(|p| *p != "?")
            .map(|p| {
                // `context_lengths.0` reads as `context_lengths[0]`.
                if p.chars().all(|c| c.is_ascii_digit()) {
                    format!("[{p}]")
                } else {
                    format!(".{p}")
                }
            })
            .collect::<String>();
        format!("{at}{path}: {}", e.into_inner())
    })
}

/// The sections a rerun reads, each on its own.
#[derive(Debug, Clone)]
pub struct Sections {
    pub reference: Result<Reference, String>,
    pub runtime: Result<Runtime, String>,
    pub eval: Result<Eval, String>,
    pub protocol: Result<Protocol, String>,
    /// `quantization.method`, when it is text.
    pub quantization_method: Option<String>,
}

impl Sections {
    /// Read the sections of a `fidelity` block (`Value::Null` when the card has none).
    pub fn read(fidelity: &Value) -> Sections {
        Sections {
            reference: section(&fidelity["reference"], "reference"),
            runtime: section(&fidelity["runtime"], "runtime"),
            eval: section(&fidelity["eval"], "eval"),
            protocol: section(&fidelity["protocol"], "protocol"),
            quantization_method: fidelity["quantization"]["method"]
                .as_str()
                .map(str::to_owned),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_name_the_field_path_and_ignore_extensions() {
        let f = serde_json::json!({
            "protocol": {
                "x-note": "ignored",
                "context_lengths": [512, "4k"],
                "positions": {"policy": "all"},
                "kl": {"direction": "forward", "units": "nats"},
                "vocab": {"mode": "full", "x_why": 1},
                "aggregation": {"statistic": "mean_over_positions", "uncertainty": {"method": "none"}}
            },
            "eval": {"text": {"source": "t.txt"}, "bos": "per_window", "x-extra": {}}
        });
        let s = Sections::read(&f);
        let e = s.protocol.unwrap_err();
        assert!(
            e.starts_with("protocol.context_lengths[1]: invalid type: string \"4k\""),
            "{e}"
        );
        let eval = s.eval.unwrap();
        assert_eq!(eval.bos, crate::kld::protocol::Bos::PerWindow);
        assert_eq!(s.runtime.unwrap_err(), "runtime missing");
    }
}
