//! A card listing many files (`fidelity.files`): one file's measurement added to it, or its
//! entry updated, the other files' entries kept as they were.
//!
//! A measurement of one file (`candidate.file`) goes into such a card when the card already lists
//! files, or describes another file of the same directory (it then becomes the first entry). The
//! measurement is merged with that file's view (or, for a new file, with the shared sections
//! alone), and must share the other files' reference, runtime, eval and protocol: one card
//! discloses one protocol, so a file measured otherwise is refused, naming each difference.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The sections every file of the card shares (besides `candidate.repo` and `.revision`).
const SHARED: [&str; 5] = ["schema", "reference", "runtime", "eval", "protocol"];
/// An entry's own parts, besides its `calibration` when it is not the block's.
const OWN: [&str; 4] = ["file", "files_sha256", "quantization", "results"];

/// The file a measurement of one file measured, when it goes into a card listing files: the card
/// lists files already, or its block describes another file.
pub(super) fn listed_file<'m>(
    measured: &'m Map<String, Value>,
    old: Option<&Value>,
) -> Option<&'m str> {
    let file = measured.get("candidate")?.get("file")?.as_str()?;
    let old = old?;
    let lists = old.get("files").is_some();
    let other = old
        .pointer("/candidate/file")
        .and_then(Value::as_str)
        .is_some_and(|f| f != file);
    (lists || other).then_some(file)
}

/// What the measurement of `file` is merged with: the file's view when the card has it, else the
/// shared sections of the card (another file's quantization and claims are not this one's).
pub(super) fn merge_base(old: &Value, file: &str) -> Value {
    if old.get("files").is_some() {
        if let Some(view) = crate::disclosure::files::view_json(old, file) {
            return view;
        }
    } else if old.pointer("/candidate/file").and_then(Value::as_str) == Some(file) {
        return old.clone();
    }
    let mut base = old.clone();
    if let Some(map) = base.as_object_mut() {
        for key in ["files", "quantization", "results"] {
            map.remove(key);
        }
    }
    if let Some(candidate) = base.get_mut("candidate").and_then(Value::as_object_mut) {
        candidate.remove("file");
        candidate.remove("files_sha256");
    }
    base
}

/// The card's new block: `view` (the merged single-file block of one file) folded into `old`'s
/// files, replacing that file's entry or appended after the others.
pub(super) fn fold(view: &Value, old: &Value, card: &Path) -> Result<Value> {
    let file = view
        .pointer("/candidate/file")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let old_entries: Vec<Value> = match old.get("files").and_then(Value::as_array) {
        Some(entries) => entries.clone(),
        None => vec![entry_of(old)],
    };
    let shared_calibration = view.get("calibration").cloned();
    let old_calibration = old.get("calibration").cloned();
    let mut differences = Vec::new();
    let mut entries = Vec::new();
    let mut replaced = false;
    for mut entry in old_entries {
        let name = entry
            .get("file")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if name == file {
            entries.push(entry_of(view));
            replaced = true;
            continue;
        }
        let other = match old.get("files") {
            Some(_) => crate::disclosure::files::view_json(old, name).unwrap_or_default(),
            None => old.clone(),
        };
        for key in SHARED {
            let (a, b) = (other.get(key), view.get(key));
            if a != b {
                let signed = a.cloned().unwrap_or(Value::Null);
                let now = b.cloned().unwrap_or(Value::Null);
                differences.extend(
                    crate::card::canonical::differences(&signed, &now)
                        .into_iter()
                        .map(|d| d.replacen("fidelity", &format!("{key} (`{name}`; `{file}`)"), 1)),
                );
            }
        }
        // The entry's effective calibration, kept: its own where it is not the new shared one.
        let calibration = entry
            .get("calibration")
            .cloned()
            .or(old_calibration.clone());
        if let Some(map) = entry.as_object_mut() {
            map.remove("calibration");
            if calibration != shared_calibration
                && let Some(c) = calibration
            {
                map.insert("calibration".into(), c);
            }
        }
        entries.push(entry);
    }
    if !differences.is_empty() {
        const SHOWN: usize = 8;
        let more = differences.len().saturating_sub(SHOWN);
        differences.truncate(SHOWN);
        if more > 0 {
            differences.push(format!("and {more} more"));
        }
        return Err(Error::usage(
            card,
            format!(
                "lists files measured under another protocol than `{file}` was: {}. One card \
                 discloses one reference, runtime, eval text and protocol for all its files: \
                 measure `{file}` as the others were (or them again as it was), or give it a card \
                 of its own",
                differences.join("; ")
            ),
        ));
    }
    if !replaced {
        entries.push(entry_of(view));
    }
    let mut block = Map::new();
    if let Some(map) = view.as_object() {
        for (key, value) in map {
            match key.as_str() {
                "quantization" | "results" | "files" => {}
                "candidate" => {
                    let mut c = value.as_object().cloned().unwrap_or_default();
                    c.remove("file");
                    c.remove("files_sha256");
                    block.insert(key.clone(), Value::Object(c));
                }
                _ => {
                    block.insert(key.clone(), value.clone());
                }
            }
        }
    }
    block.insert("files".into(), Value::Array(entries));
    Ok(Value::Object(block))
}

/// A single-file block's entry: its own parts (its calibration goes with the shared sections).
fn entry_of(view: &Value) -> Value {
    let mut entry = Map::new();
    for key in OWN {
        let value = match key {
            "file" | "files_sha256" => view.pointer(&format!("/candidate/{key}")),
            _ => view.get(key),
        };
        if let Some(v) = value {
            entry.insert(key.into(), v.clone());
        }
    }
    Value::Object(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view(file: &str, method: &str, kld: f64, device: &str) -> Value {
        json!({
            "schema": "cardproof/v1",
            "reference": {"repo": "org/base"},
            "candidate": {"repo": "org/m-GGUF", "files_sha256": format!("sha-{file}"), "file": file},
            "quantization": {"method": method},
            "calibration": {"dataset": "none"},
            "runtime": {"device": device},
            "eval": {"bos": "none"},
            "protocol": {"context_lengths": [512]},
            "results": [{"metric": "kld_mean", "value": kld}],
        })
    }

    #[test]
    fn a_second_file_turns_a_card_for_one_into_a_card_listing_both() {
        let first = view("m-Q4_0.gguf", "q4_0", 0.1, "cpu");
        let measured = view("m-Q8_0.gguf", "q8_0", 0.01, "cpu");
        let m = measured.as_object().unwrap().clone();
        assert_eq!(listed_file(&m, Some(&first)), Some("m-Q8_0.gguf"));
        assert_eq!(listed_file(&m, None), None);
        assert_eq!(listed_file(&m, Some(&measured)), None);
        let base = merge_base(&first, "m-Q8_0.gguf");
        assert!(base.get("quantization").is_none() && base.get("results").is_none());
        assert_eq!(base["candidate"], json!({"repo": "org/m-GGUF"}));

        let block = fold(&measured, &first, Path::new("README.md")).unwrap();
        assert_eq!(block["candidate"], json!({"repo": "org/m-GGUF"}));
        assert!(block.get("results").is_none());
        let files = block["files"].as_array().unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0]["file"], "m-Q4_0.gguf");
        assert_eq!(files[1]["results"][0]["value"], 0.01);
        // Each view reads back as the file's own block.
        assert_eq!(
            crate::disclosure::files::view_json(&block, "m-Q8_0.gguf").unwrap(),
            measured
        );
        // Measured again: the entry is replaced in place, the other kept.
        let again = view("m-Q4_0.gguf", "q4_0", 0.2, "cpu");
        assert_eq!(
            merge_base(&block, "m-Q4_0.gguf")["results"][0]["value"],
            0.1
        );
        let updated = fold(&again, &block, Path::new("README.md")).unwrap();
        assert_eq!(updated["files"][0]["results"][0]["value"], 0.2);
        assert_eq!(updated["files"][1], block["files"][1]);
    }

    #[test]
    fn a_file_measured_under_another_protocol_is_refused_naming_the_difference() {
        let first = view("m-Q4_0.gguf", "q4_0", 0.1, "cpu");
        let other = view("m-Q8_0.gguf", "q8_0", 0.01, "cuda");
        let e = fold(&other, &first, Path::new("README.md")).unwrap_err();
        assert!(
            e.message()
                .contains("runtime (`m-Q4_0.gguf`; `m-Q8_0.gguf`).device"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn an_entry_keeps_a_calibration_that_is_no_longer_the_shared_one() {
        let first = view("a.gguf", "q4_0", 0.1, "cpu");
        let mut second = view("b.gguf", "iq4_xs", 0.05, "cpu");
        second["calibration"] = json!({"dataset": "imatrix-wiki"});
        let block = fold(&second, &first, Path::new("README.md")).unwrap();
        assert_eq!(block["calibration"], json!({"dataset": "imatrix-wiki"}));
        assert_eq!(block["files"][0]["calibration"], json!({"dataset": "none"}));
        assert!(block["files"][1].get("calibration").is_none());
        assert_eq!(
            crate::disclosure::files::view_json(&block, "a.gguf").unwrap(),
            first
        );
    }
}
