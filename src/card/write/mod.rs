//! `cardproof card`: write a measurement into a model card.
//!
//! The card's `fidelity:` block is replaced whole (or added at the end of the front matter),
//! `base_model` and `base_model_relation` are added when missing, the headline claims are mirrored
//! into a single-entry `model-index`, and a readable section is kept between two HTML comments in
//! the body. Every other byte of the card stays as it was: each edit is a splice at the byte span
//! the YAML parser reports for a top-level entry, cut at line boundaries and written in the file's
//! own line endings. The YAML is emitted here (block style, schema key order, and every string
//! quoted that a YAML 1.2 or a YAML 1.1 reader such as PyYAML would read as anything but itself),
//! then parsed back and compared before it is returned.
//!
//! The work is split by concept: [`merge`] folds the measurement into what the card already
//! disclosed, [`model_index`] mirrors the claims into the Hub's `model-index`, [`splice`] finds
//! the byte spans of the existing card and applies the edits, [`emit`] writes the YAML text, and
//! [`section`] renders the readable section of the body, and [`update`] reads the measurement and
//! writes the card to disk. This module holds the entry point, the measurement document they all
//! read, the small JSON helpers they share, and the final read-back check.

mod comparison;
mod emit;
mod files;
mod merge;
mod model_index;
mod section;
mod splice;
mod update;

use std::path::Path;

use serde_json::{Map, Value};

use self::emit::{SCHEMA_ROOT, emit_mapping};
use self::merge::merge_fidelity;
use self::model_index::{is_ours, model_index, model_name};
use self::section::section;
use self::splice::{Edit, Entries, Layout};
use super::Card;
use crate::error::{Error, Result};

pub use self::section::markdown;
pub use self::update::{CardUpdate, UpdateRequest, default_card_path, update_card};

pub use crate::card::{SECTION_END, SECTION_START};
/// `source.name` of every `model-index` result cardproof writes: a `model-index` whose results
/// all carry it is cardproof's to replace.
pub const MODEL_INDEX_SOURCE: &str = "cardproof";
/// `source.url` of the `model-index` results cardproof writes.
pub const MODEL_INDEX_URL: &str = "https://cardproof.dev";

/// What the card command adds besides the measurement's own block.
#[derive(Debug, Clone)]
pub struct CardInputs {
    /// The measurement (`cardproof measure`'s measurement.json, read into its type).
    pub measurement: crate::rerun::Measurement,
    /// Values for fields a local measurement cannot know; each overrides what the card already
    /// has, and is kept from the existing card when `None`.
    pub reference_repo: Option<String>,
    pub reference_revision: Option<String>,
    pub candidate_repo: Option<String>,
    pub candidate_revision: Option<String>,
    /// `quantization.method` (the rest of the card's `quantization` block is kept).
    pub quantization: Option<String>,
    /// The `calibration` block, replacing the card's whole.
    pub calibration: Option<CalibrationInput>,
    /// A study's comparison of this checkpoint with its other arms (Markdown, escaped), put
    /// into the fidelity section under the claims (`card --study`).
    pub comparison: Option<String>,
}

impl CardInputs {
    /// The measurement alone: every other field kept from the card.
    pub fn new(measurement: crate::rerun::Measurement) -> CardInputs {
        CardInputs {
            measurement,
            reference_repo: None,
            reference_revision: None,
            candidate_repo: None,
            candidate_revision: None,
            quantization: None,
            calibration: None,
            comparison: None,
        }
    }
}

/// The calibration data, as the `card` command's flags give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalibrationInput {
    /// `calibration.dataset`: a dataset id, or `none`.
    pub dataset: String,
    pub revision: Option<String>,
    pub samples: Option<u64>,
}

/// The new card text, and what the caller should tell the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenCard {
    /// The complete new README.md.
    pub text: String,
    /// Things left undone or worth a look: fields nobody supplied (lint reports them), an existing
    /// `model-index` left alone, KLD numbers in the prose outside the generated section.
    pub warnings: Vec<String>,
}

/// Write or update the card at `path` (used in messages and for the model's name when no
/// candidate repository is known): `existing` is its current text, `None` when there is no card.
pub fn write_card(existing: Option<&str>, path: &Path, inputs: &CardInputs) -> Result<WrittenCard> {
    let measured = Measured::read(&inputs.measurement)?;
    check_inputs(path, inputs)?;
    let card = existing
        .map(|text| Card::from_bytes(path.to_path_buf(), text.as_bytes().to_vec()))
        .transpose()?;
    let layout = match &card {
        Some(card) => Layout::of(card)?,
        None => Layout::empty(),
    };
    let mut warnings = Vec::new();

    let root = layout.root;
    let old_fidelity = root
        .and_then(|r| r.get("fidelity"))
        .map(|e| e.value.to_json())
        .filter(Value::is_object);
    // One file measured into a card that lists files (or describes another file): its entry.
    let listed = files::listed_file(&measured.fidelity, old_fidelity.as_ref()).map(str::to_owned);
    if listed.is_none()
        && let Some(old) = &old_fidelity
        && let Some(entries) = old.get("files").and_then(Value::as_array)
    {
        return Err(Error::usage(
            path,
            format!(
                "lists {} files (`fidelity.files`), and the measurement is of a whole directory: \
                 measure one file (`--candidate DIR/FILE.gguf`) to add or update its entry",
                entries.len()
            ),
        ));
    }
    let base = match (&listed, &old_fidelity) {
        (Some(file), Some(old)) => Some(files::merge_base(old, file)),
        _ => old_fidelity.clone(),
    };
    let view = merge_fidelity(&measured, base.as_ref(), inputs, &mut warnings);
    let fidelity = match (&listed, &old_fidelity) {
        (Some(_), Some(old)) => files::fold(&view, old, path)?,
        _ => view.clone(),
    };

    let mut edits: Vec<Edit> = Vec::new();
    let mut appended = String::new();
    let indent = layout.indent;

    let names = Names::of(&view);
    base_model_entries(root, &names, indent, &mut appended, &mut warnings);
    let name = model_name(&names, &measured, path);
    let model_index = model_index(&names, &measured, &name);
    let mut model_index_written = true;
    let existing_index = root.and_then(|r| r.entries().iter().position(|e| e.key == "model-index"));
    if listed.is_some() {
        // The Hub's `model-index` describes one model; a card listing files mirrors none (and
        // removes the one cardproof wrote for a single file).
        model_index_written = false;
        if let Some(i) = existing_index
            && is_ours(&root.expect("found in root").entries()[i].value.to_json())
        {
            edits.push(layout.replace_entry(i, "")?);
        }
    } else {
        let mut map = Map::new();
        map.insert("model-index".into(), model_index.clone());
        let mut block = String::new();
        emit_mapping(&mut block, indent, &map, None);
        match existing_index {
            None => appended.push_str(&block),
            Some(i) if is_ours(&root.expect("found in root").entries()[i].value.to_json()) => {
                edits.push(layout.replace_entry(i, &block)?);
            }
            Some(_) => {
                model_index_written = false;
                warnings.push(
                    "the card's `model-index` was not written by cardproof; it was left unchanged \
                     and the fidelity claims are not mirrored into it"
                        .into(),
                );
            }
        }
    }

    // fidelity: replaced whole, or added at the end of the front matter.
    {
        let mut map = Map::new();
        map.insert("fidelity".into(), fidelity.clone());
        let mut block = String::new();
        emit_mapping(&mut block, indent, &map, Some(&*SCHEMA_ROOT));
        match root.and_then(|r| r.entries().iter().position(|e| e.key == "fidelity")) {
            Some(i) => edits.push(layout.replace_entry(i, &block)?),
            None => appended.push_str(&block),
        }
    }
    if !appended.is_empty() {
        edits.push(layout.append_to_front_matter(&appended));
    }

    // The readable section in the body.
    let section = section(
        &names,
        &measured,
        &name,
        inputs.comparison.as_deref(),
        listed.is_some().then_some(&fidelity),
    );
    let new_card = existing.is_none_or(|t| t.trim().is_empty());
    let has_markers = card
        .as_ref()
        .is_some_and(|c| c.text.contains(SECTION_START));
    if !has_markers && let Some((range, heading)) = layout.hand_written_section() {
        let line = card.as_ref().map_or(0, |c| c.line_col(range.start).line);
        warnings.push(format!(
            "the hand-written fidelity section `{heading}` (line {line}) was replaced by \
             cardproof's section; other KLD numbers in the prose that contradict the new block \
             are lint findings (`prose-contradicts-disclosure`)"
        ));
    }
    edits.push(layout.section_edit(&section, &name, new_card)?);

    let text = layout.apply(edits);
    self_check(
        &text,
        path,
        &fidelity,
        model_index_written.then_some(&model_index),
    )?;
    Ok(WrittenCard { text, warnings })
}

/// The flags' values, checked before anything is read: full commit hashes, no empty values.
fn check_inputs(path: &Path, inputs: &CardInputs) -> Result<()> {
    for (side, revision) in [
        ("reference", &inputs.reference_revision),
        ("candidate", &inputs.candidate_revision),
    ] {
        if let Some(r) = revision
            && !is_hex(r, 40)
        {
            return Err(Error::usage(
                path,
                format!("{side} revision: `{r}` is not a full 40-hex commit hash (lowercase)"),
            ));
        }
    }
    for (flag, value) in [
        ("--quantization", inputs.quantization.as_deref()),
        (
            "--calibration",
            inputs.calibration.as_ref().map(|c| c.dataset.as_str()),
        ),
        (
            "--calibration-revision",
            inputs
                .calibration
                .as_ref()
                .and_then(|c| c.revision.as_deref()),
        ),
    ] {
        if value.is_some_and(|v| v.trim().is_empty()) {
            return Err(Error::usage(path, format!("{flag}: the value is empty")));
        }
    }
    Ok(())
}

/// `base_model` and `base_model_relation`: added when missing, never changed (a disagreement
/// is a warning, and lint's finding).
fn base_model_entries(
    root: Option<&crate::card::yaml::Node>,
    names: &Names<'_>,
    indent: usize,
    appended: &mut String,
    warnings: &mut Vec<String>,
) {
    let reference_repo = names.reference_repo;
    match root
        .and_then(|r| r.get("base_model"))
        .map(|e| e.value.to_json())
    {
        None => match reference_repo {
            Some(repo) if is_hub_id(repo) => {
                let mut map = Map::new();
                map.insert("base_model".into(), repo.into());
                emit_mapping(appended, indent, &map, None);
            }
            Some(repo) => warnings.push(format!(
                "`base_model` is missing and the reference `{repo}` is not a Hub repository id \
                 (`org/name`), so it was not added"
            )),
            None => warnings.push(
                "`base_model` is missing and the reference repository is not known, so it was \
                 not added"
                    .into(),
            ),
        },
        Some(base) => {
            let bases: Vec<&str> = match &base {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if bases.is_empty() {
                warnings.push("`base_model` is present but names no model; left unchanged".into());
            } else if let Some(repo) = reference_repo
                && !bases.contains(&repo)
            {
                warnings.push(format!(
                    "`base_model` is `{}` but the reference is `{repo}`; left unchanged (lint \
                     reports the mismatch)",
                    bases.join(", ")
                ));
            }
        }
    }
    match root
        .and_then(|r| r.get("base_model_relation"))
        .map(|e| e.value.to_json())
    {
        None => {
            let mut map = Map::new();
            map.insert("base_model_relation".into(), "quantized".into());
            emit_mapping(appended, indent, &map, None);
        }
        Some(Value::String(s)) if s == "quantized" => {}
        Some(other) => warnings.push(format!(
            "`base_model_relation` is `{}`, not `quantized`; left unchanged (lint reports it)",
            other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_owned)
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// The measurement document.

struct Measured {
    /// The measurement, read into its type (a document of another shape is refused).
    doc: crate::rerun::Measurement,
    /// Its ready `fidelity:` block as JSON, for merging with the card's block.
    fidelity: Map<String, Value>,
}

impl Measured {
    fn read(doc: &crate::rerun::Measurement) -> Result<Self> {
        let path = Path::new("measurement.json");
        let doc = doc.clone();
        if doc.runs.is_empty() {
            return Err(Error::format(
                path,
                None,
                "the measurement document has no `runs`; pass the measurement.json that \
                 `cardproof measure` wrote",
            ));
        }
        let fidelity = match serde_json::to_value(&doc.fidelity) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        Ok(Measured { doc, fidelity })
    }
}

/// The names the merged block gives that the measurement's draft may not have: the
/// repositories a card or the flags name, and the eval text's wording kept from the card when it
/// describes the bytes measured. Everything else the card's prose and `model-index` say comes
/// from the draft's types.
struct Names<'a> {
    reference_repo: Option<&'a str>,
    candidate_repo: Option<&'a str>,
    eval_source: Option<&'a str>,
}

impl<'a> Names<'a> {
    fn of(merged: &'a Value) -> Names<'a> {
        Names {
            reference_repo: str_at(merged, "/reference/repo"),
            candidate_repo: str_at(merged, "/candidate/repo"),
            eval_source: str_at(merged, "/eval/text/source"),
        }
    }
}

fn str_at<'v>(v: &'v Value, pointer: &str) -> Option<&'v str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// A disclosure enum's word as the schema spells it (`bf16`, `safetensors`, `nats`).
fn word(v: &impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

/// A Hub repository id: `name` or `org/name`, letters, digits, `-`, `_` and `.`.
fn is_hub_id(repo: &str) -> bool {
    let parts: Vec<&str> = repo.split('/').collect();
    parts.len() <= 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with(['.', '-'])
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

// ---------------------------------------------------------------------------------------------
// Reading the result back.

/// The written card must parse, and its blocks must read back as the values written.
fn self_check(
    text: &str,
    path: &Path,
    fidelity: &Value,
    model_index: Option<&Value>,
) -> Result<()> {
    let card = Card::from_bytes(path.to_path_buf(), text.as_bytes().to_vec())?;
    let root = card.metadata();
    let read = |key: &str| root.and_then(|r| r.get(key)).map(|e| e.value.to_json());
    let mut wrong = Vec::new();
    if read("fidelity").as_ref() != Some(fidelity) {
        wrong.push("fidelity");
    }
    if let Some(mi) = model_index
        && read("model-index").as_ref() != Some(mi)
    {
        wrong.push("model-index");
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(Error::internal(
            path,
            format!(
                "internal error: the written `{}` does not read back as written; the card was \
                 not changed (please report this)",
                wrong.join("` and `")
            ),
        ))
    }
}
