//! Merging the measured `fidelity:` block with what the card already disclosed.
//!
//! The measurement knows the numbers and the files it read; the card may know the repositories,
//! revisions, quantization and calibration the measurement cannot. This is the one place that
//! decides which of the two wins for each field, so it is kept apart from the text handling.

use serde_json::{Value, json};

use super::{CardInputs, Measured, str_at};

pub(super) fn merge_fidelity(
    m: &Measured,
    old: Option<&Value>,
    inputs: &CardInputs,
    warnings: &mut Vec<String>,
) -> Value {
    let mut f = Value::Object(m.fidelity.clone());
    let empty = json!({});
    let old = old.unwrap_or(&empty);

    // Identity the measurement cannot know: kept from the card, then overridden.
    for pointer in [
        "/reference/repo",
        "/reference/revision",
        "/candidate/repo",
        "/candidate/revision",
        "/quantization",
        "/calibration",
        "/eval/tokenizer",
    ] {
        if f.pointer(pointer).is_none()
            && let Some(v) = old.pointer(pointer)
        {
            set(&mut f, pointer, v.clone());
        }
    }
    for (pointer, value) in [
        ("/reference/repo", &inputs.reference_repo),
        ("/reference/revision", &inputs.reference_revision),
        ("/candidate/repo", &inputs.candidate_repo),
        ("/candidate/revision", &inputs.candidate_revision),
    ] {
        if let Some(v) = value {
            set(&mut f, pointer, Value::String(v.clone()));
        }
    }
    if let Some(method) = &inputs.quantization {
        set(
            &mut f,
            "/quantization/method",
            Value::String(method.clone()),
        );
    }
    if let Some(c) = &inputs.calibration {
        let mut block = serde_json::Map::new();
        block.insert("dataset".into(), Value::String(c.dataset.clone()));
        if let Some(r) = &c.revision {
            block.insert("revision".into(), Value::String(r.clone()));
        }
        if let Some(n) = c.samples {
            block.insert("samples".into(), n.into());
        }
        set(&mut f, "/calibration", Value::Object(block));
    }

    // The eval text's wording is kept when it describes the very bytes measured.
    let measured_sha = str_at(&f, "/eval/text/sha256").map(str::to_owned);
    let old_sha = str_at(old, "/eval/text/sha256");
    if let Some(old_text) = old.pointer("/eval/text").and_then(Value::as_object) {
        if measured_sha.is_some() && old_sha == measured_sha.as_deref() {
            for key in ["source", "revision", "split"] {
                if let Some(v) = old_text.get(key) {
                    set(&mut f, &format!("/eval/text/{key}"), v.clone());
                }
            }
        } else if old_text.contains_key("source") {
            warnings.push(format!(
                "the measured eval text is not the one the card described (`{}`); \
                 `eval.text.source` now names the measured file, `{}`: reword it if it should \
                 name a dataset",
                str_at(old, "/eval/text/source").unwrap_or_default(),
                str_at(&f, "/eval/text/source").unwrap_or_default()
            ));
        }
    }

    // Kept identities must still describe the measured files.
    for side in ["reference", "candidate"] {
        let pointer = format!("/{side}/files_sha256");
        if let (Some(new), Some(was)) = (str_at(&f, &pointer), str_at(old, &pointer))
            && new != was
        {
            let given = if side == "reference" {
                inputs.reference_revision.is_some()
            } else {
                inputs.candidate_revision.is_some()
            };
            if !given && f.pointer(&format!("/{side}/revision")).is_some() {
                warnings.push(format!(
                    "the measured {side} files differ from the card's `{side}.files_sha256`; the \
                     kept `{side}.revision` may not name the files measured"
                ));
            }
        }
    }

    carry_extensions(&mut f, old);

    for (pointer, what) in [
        (
            "/reference/repo",
            "the reference repository (`fidelity.reference.repo`)",
        ),
        (
            "/reference/revision",
            "the reference revision (`fidelity.reference.revision`)",
        ),
        (
            "/candidate/repo",
            "the candidate repository (`fidelity.candidate.repo`)",
        ),
        (
            "/quantization",
            "how the candidate was quantized (`fidelity.quantization`)",
        ),
        (
            "/calibration",
            "the calibration data (`fidelity.calibration`)",
        ),
    ] {
        if f.pointer(pointer).is_none() {
            warnings.push(format!(
                "{what} is not in the card and was not given; add it before publishing \
                 (`cardproof lint` reports it)"
            ));
        }
    }
    f
}

/// Extension fields (`x-...`, `x_...`) of the old block, at every level of mappings the new block
/// also has.
fn carry_extensions(new: &mut Value, old: &Value) {
    let (Some(new), Some(old)) = (new.as_object_mut(), old.as_object()) else {
        return;
    };
    for (key, value) in old {
        if key.starts_with("x-") || key.starts_with("x_") {
            if !new.contains_key(key) {
                new.insert(key.clone(), value.clone());
            }
        } else if let Some(child) = new.get_mut(key) {
            carry_extensions(child, value);
        }
    }
}

/// Set the value at a JSON pointer of plain keys, creating mappings on the way.
fn set(target: &mut Value, pointer: &str, value: Value) {
    let mut node = target;
    let keys: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, key) in keys.iter().enumerate() {
        if !node.is_object() {
            *node = json!({});
        }
        let map = node.as_object_mut().expect("made a mapping");
        if i + 1 == keys.len() {
            map.insert((*key).to_owned(), value);
            return;
        }
        node = map.entry(*key).or_insert_with(|| json!({}));
    }
}
