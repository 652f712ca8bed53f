//! Reading back the floats cardproof wrote: JSON has no NaN or infinity, so serde_json writes a
//! non-finite `f64` as `null`; these read such a `null` back as NaN, so a document cardproof wrote
//! always reads back into its own type.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

fn or_nan(v: Option<f64>) -> f64 {
    v.unwrap_or(f64::NAN)
}

/// An `f64` written as a number or `null`.
pub fn number<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Option::<f64>::deserialize(d).map(or_nan)
}

/// A pair of `f64`s, each a number or `null`.
pub fn pair<'de, D: Deserializer<'de>>(d: D) -> Result<[f64; 2], D::Error> {
    let [a, b] = <[Option<f64>; 2]>::deserialize(d)?;
    Ok([or_nan(a), or_nan(b)])
}

/// A map of `f64`s, each a number or `null`.
pub fn map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    let m = BTreeMap::<String, Option<f64>>::deserialize(d)?;
    Ok(m.into_iter().map(|(k, v)| (k, or_nan(v))).collect())
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize, serde::Serialize)]
    struct Doc {
        #[serde(deserialize_with = "super::number")]
        x: f64,
        #[serde(deserialize_with = "super::pair")]
        ci: [f64; 2],
    }

    #[test]
    fn non_finite_floats_round_trip_as_null() {
        let text = serde_json::to_string(&Doc {
            x: f64::NAN,
            ci: [1.5, f64::INFINITY],
        })
        .unwrap();
        assert_eq!(text, r#"{"x":null,"ci":[1.5,null]}"#);
        let back: Doc = serde_json::from_str(&text).unwrap();
        assert!(back.x.is_nan() && back.ci[0] == 1.5 && back.ci[1].is_nan());
    }
}
