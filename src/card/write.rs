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

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Number, Value, json};

use super::yaml::{self, Entry, Node, NodeKind};
use super::{Card, FrontMatter};
use crate::error::{Error, ErrorKind, Result};

/// The line that opens the generated section of the card body.
pub const SECTION_START: &str = "<!-- cardproof:fidelity:start -->";
/// The line that closes the generated section of the card body.
pub const SECTION_END: &str = "<!-- cardproof:fidelity:end -->";
/// `source.name` of every `model-index` result cardproof writes: a `model-index` whose results
/// all carry it is cardproof's to replace.
pub const MODEL_INDEX_SOURCE: &str = "cardproof";
/// `source.url` of the `model-index` results cardproof writes.
pub const MODEL_INDEX_URL: &str = "https://cardproof.dev";

/// Flow sequences (`[256, 512]`) are used when the line stays within this many columns.
const FLOW_WIDTH: usize = 100;

/// What the card command adds besides the measurement's own block.
#[derive(Debug, Clone, Default)]
pub struct CardInputs {
    /// The `measurement.json` document (`cardproof measure`).
    pub measurement: Value,
    /// Values for fields a local measurement cannot know; each overrides what the card already
    /// has, and is kept from the existing card when `None`.
    pub reference_repo: Option<String>,
    pub reference_revision: Option<String>,
    pub candidate_repo: Option<String>,
    pub candidate_revision: Option<String>,
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
    for (side, revision) in [
        ("reference", &inputs.reference_revision),
        ("candidate", &inputs.candidate_revision),
    ] {
        if let Some(r) = revision
            && !is_hex(r, 40)
        {
            return Err(Error::malformed(
                path,
                Some(&format!("{side} revision")),
                format!("`{r}` is not a full 40-hex commit hash (lowercase)"),
            ));
        }
    }
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
    let fidelity = merge_fidelity(&measured, old_fidelity.as_ref(), inputs, &mut warnings);

    let mut edits: Vec<Edit> = Vec::new();
    let mut appended = String::new();
    let indent = layout.indent;

    // base_model and base_model_relation: added when missing, never changed.
    let reference_repo = str_at(&fidelity, "/reference/repo");
    match root
        .and_then(|r| r.get("base_model"))
        .map(|e| e.value.to_json())
    {
        None => match reference_repo {
            Some(repo) if is_hub_id(repo) => {
                let mut map = Map::new();
                map.insert("base_model".into(), repo.into());
                emit_mapping(&mut appended, indent, &map, None);
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
            emit_mapping(&mut appended, indent, &map, None);
        }
        Some(Value::String(s)) if s == "quantized" => {}
        Some(other) => warnings.push(format!(
            "`base_model_relation` is `{}`, not `quantized`; left unchanged (lint reports it)",
            other
                .as_str()
                .map_or_else(|| other.to_string(), str::to_owned)
        )),
    }

    // model-index: replaced when cardproof wrote it, added when absent, else left alone.
    let name = model_name(&fidelity, &measured, path);
    let model_index = model_index(&fidelity, &measured, &name);
    let mut model_index_written = true;
    {
        let mut map = Map::new();
        map.insert("model-index".into(), model_index.clone());
        let mut block = String::new();
        emit_mapping(&mut block, indent, &map, None);
        match root.and_then(|r| r.entries().iter().position(|e| e.key == "model-index")) {
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
    let section = section(&fidelity, &measured, &name);
    let new_card = existing.is_none_or(|t| t.trim().is_empty());
    edits.push(layout.section_edit(&section, &name, new_card)?);
    warnings.extend(layout.prose_warning());

    let text = layout.apply(edits);
    self_check(
        &text,
        path,
        &fidelity,
        model_index_written.then_some(&model_index),
    )?;
    Ok(WrittenCard { text, warnings })
}

// ---------------------------------------------------------------------------------------------
// The measurement document.

struct Measured<'a> {
    fidelity: &'a Map<String, Value>,
    runs: &'a [Value],
    doc: &'a Value,
}

impl<'a> Measured<'a> {
    fn read(doc: &'a Value) -> Result<Self> {
        let bad = |what: &str| {
            Error::malformed(
                Path::new("measurement.json"),
                None,
                format!(
                    "the measurement document has no {what}; pass the measurement.json that \
                     `cardproof measure` wrote"
                ),
            )
        };
        let fidelity = doc
            .get("fidelity")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("`fidelity` block"))?;
        let runs = doc
            .get("runs")
            .and_then(Value::as_array)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| bad("`runs`"))?;
        if fidelity.get("protocol").is_none() || fidelity.get("results").is_none() {
            return Err(bad("`fidelity.protocol` or `fidelity.results`"));
        }
        Ok(Measured {
            fidelity,
            runs,
            doc,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Merging the measured block with what the card already disclosed.

fn merge_fidelity(
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

fn str_at<'v>(v: &'v Value, pointer: &str) -> Option<&'v str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn u64_at(v: &Value, pointer: &str) -> Option<u64> {
    v.pointer(pointer).and_then(Value::as_u64)
}

fn f64_at(v: &Value, pointer: &str) -> Option<f64> {
    v.pointer(pointer).and_then(Value::as_f64)
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
// model-index.

fn model_name(fidelity: &Value, m: &Measured, path: &Path) -> String {
    if let Some(repo) = str_at(fidelity, "/candidate/repo") {
        return repo.to_owned();
    }
    let dir = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty() && n != "." && n != "..")
    };
    str_at(m.doc, "/candidate/path")
        .and_then(|p| dir(Path::new(p)))
        .or_else(|| path.parent().and_then(dir))
        .unwrap_or_else(|| "model".to_owned())
}

/// The lane the numbers were measured in, e.g. `cardproof-native`.
fn lane(m: &Measured) -> String {
    let runner = str_at(m.doc, "/environment/runner").unwrap_or("native");
    let mut lane = format!("cardproof-{runner}");
    if let Some(emulate) = str_at(m.doc, "/environment/emulate")
        && emulate != "reference_semantics"
    {
        lane.push('-');
        lane.push_str(&emulate.replace('_', "-"));
    }
    lane
}

fn metric_label(metric: &str, units: &str) -> String {
    let (direction, stat) = if let Some(stat) = metric.strip_prefix("kld_reverse_") {
        ("reverse", stat)
    } else if let Some(stat) = metric.strip_prefix("kld_") {
        ("forward", stat)
    } else {
        return match metric {
            "top1_agreement" => "top-1 agreement".into(),
            "ppl_ref" => "reference perplexity".into(),
            "ppl_cand" => "candidate perplexity".into(),
            "ppl_ratio" => "PPL ratio (candidate / reference)".into(),
            "delta_p_rms" => "RMS change in the true token's probability".into(),
            other => other.to_owned(),
        };
    };
    let stat = match stat {
        "p999" => "p99.9".to_owned(),
        s => s.to_owned(),
    };
    format!("{stat} KLD ({direction}, {units})")
}

fn model_index(fidelity: &Value, m: &Measured, name: &str) -> Value {
    let source = str_at(fidelity, "/eval/text/source").unwrap_or("eval text");
    let direction = str_at(fidelity, "/protocol/kl/direction").unwrap_or("forward");
    let units = str_at(fidelity, "/protocol/kl/units").unwrap_or("nats");
    let claims = fidelity
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let lengths = context_lengths(fidelity, m);
    let mut results = Vec::new();
    for &length in &lengths {
        let metrics: Vec<Value> = claims
            .iter()
            .filter(|c| {
                c.get("context_length").and_then(Value::as_u64) == Some(length)
                    || (lengths.len() == 1 && c.get("context_length").is_none())
            })
            .filter_map(|c| {
                let metric = c.get("metric")?.as_str()?;
                let value = c.get("value")?.clone();
                Some(json!({"type": metric, "value": value, "name": metric_label(metric, units)}))
            })
            .collect();
        if metrics.is_empty() {
            continue;
        }
        results.push(json!({
            "task": {"type": "text-generation"},
            "dataset": {
                "name": source,
                "type": source,
                "config": format!("ctx{length}-{direction}"),
                "split": lane(m),
            },
            "metrics": metrics,
            "source": {"name": MODEL_INDEX_SOURCE, "url": MODEL_INDEX_URL},
        }));
    }
    json!([{"name": name, "results": results}])
}

fn context_lengths(fidelity: &Value, m: &Measured) -> Vec<u64> {
    let listed: Vec<u64> = fidelity
        .pointer("/protocol/context_lengths")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    if listed.is_empty() {
        m.runs
            .iter()
            .filter_map(|r| r.get("context_length").and_then(Value::as_u64))
            .collect()
    } else {
        listed
    }
}

/// A `model-index` cardproof wrote: one entry whose results all name cardproof as their source.
fn is_ours(model_index: &Value) -> bool {
    let Some([entry]) = model_index.as_array().map(Vec::as_slice) else {
        return false;
    };
    let Some(results) = entry.get("results").and_then(Value::as_array) else {
        return false;
    };
    !results.is_empty()
        && results
            .iter()
            .all(|r| str_at(r, "/source/name") == Some(MODEL_INDEX_SOURCE))
}

// ---------------------------------------------------------------------------------------------
// The existing card: where the front matter, its entries and the body are.

struct Layout<'c> {
    text: &'c str,
    eol: &'static str,
    /// The front matter's YAML, when the card has one.
    yaml: Option<Range<usize>>,
    root: Option<&'c Node>,
    /// Column of the top-level keys.
    indent: usize,
    body: Range<usize>,
    path: PathBuf,
    card: Option<&'c Card>,
}

/// Replace `range` of the old text with `text`.
struct Edit {
    range: Range<usize>,
    text: String,
}

impl<'c> Layout<'c> {
    fn empty() -> Self {
        Layout {
            text: "",
            eol: "\n",
            yaml: None,
            root: None,
            indent: 0,
            body: 0..0,
            path: PathBuf::new(),
            card: None,
        }
    }

    fn of(card: &'c Card) -> Result<Self> {
        let text = card.text.as_str();
        let eol = match text.find('\n') {
            Some(i) if i > 0 && text.as_bytes()[i - 1] == b'\r' => "\r\n",
            _ => "\n",
        };
        let error = |offset: usize, kind: ErrorKind| {
            Error::at(card.path.clone(), card.line_col(offset), kind)
        };
        let (yaml, root) = match &card.front_matter {
            FrontMatter::Absent => (None, None),
            FrontMatter::Unterminated { opening } => {
                return Err(error(
                    opening.start,
                    ErrorKind::YamlSyntax(
                        "the front matter opened with `---` is never closed by a `---` line".into(),
                    ),
                ));
            }
            FrontMatter::Present { yaml, root } => (Some(yaml.clone()), root.as_ref()),
        };
        if let Some(yaml) = &yaml {
            let bytes = text.as_bytes();
            if let Some(i) = (yaml.start..yaml.end)
                .find(|&i| bytes[i] == b'\r' && bytes.get(i + 1) != Some(&b'\n'))
            {
                return Err(error(
                    i,
                    ErrorKind::UnsupportedYaml(
                        "lone carriage-return line endings in the front matter; use LF or CRLF"
                            .into(),
                    ),
                ));
            }
        }
        let mut indent = 0;
        if let Some(root) = root {
            let NodeKind::Map(entries) = &root.kind else {
                return Err(error(
                    root.span.start,
                    ErrorKind::UnsupportedYaml(
                        "the front matter is not a mapping of `key: value` lines".into(),
                    ),
                ));
            };
            if text[root.span.start..].starts_with('{') {
                return Err(error(
                    root.span.start,
                    ErrorKind::UnsupportedYaml(
                        "the front matter is a flow mapping (`{...}`); write it as `key: value` \
                         lines so it can be edited in place"
                            .into(),
                    ),
                ));
            }
            let yaml_start = yaml.as_ref().map_or(0, |y| y.start);
            for (i, entry) in entries.iter().enumerate() {
                let start = line_start(text, yaml_start, entry.key_span.start);
                let prefix = &text[start..entry.key_span.start];
                if !prefix.bytes().all(|b| b == b' ') {
                    return Err(error(
                        entry.key_span.start,
                        ErrorKind::UnsupportedYaml(format!(
                            "the top-level key `{}` does not start its line",
                            entry.key
                        )),
                    ));
                }
                if i == 0 {
                    indent = prefix.len();
                }
            }
        }
        Ok(Layout {
            text,
            eol,
            yaml,
            root,
            indent,
            body: card.body_range(),
            path: card.path.clone(),
            card: Some(card),
        })
    }

    /// The edit that replaces top-level entry `index` (its key's line to the end of its value's
    /// last line, leaving blank lines and column-0 comments before the next key in place).
    fn replace_entry(&self, index: usize, block: &str) -> Result<Edit> {
        let (Some(yaml), Some(root)) = (&self.yaml, self.root) else {
            unreachable!("entries exist only in a front matter");
        };
        let entries = root.entries();
        let entry = &entries[index];
        let start = line_start(self.text, yaml.start, entry.key_span.start);
        let initial = entries.get(index + 1).map_or(yaml.end, |next| {
            line_start(self.text, yaml.start, next.key_span.start)
        });
        let floor = line_end(self.text, yaml, content_end(self.text, entry)).min(initial);
        let mut cut = initial;
        while cut > floor {
            let prev = line_start(self.text, yaml.start, cut - 1);
            if prev < floor {
                break;
            }
            let line = &self.text[prev..cut];
            let trimmed = line.trim();
            let indent = line.len() - line.trim_start_matches(' ').len();
            if trimmed.is_empty() || (trimmed.starts_with('#') && indent <= self.indent) {
                cut = prev;
            } else {
                break;
            }
        }
        let mut text = self.localize(block);
        if !self.text[..cut].ends_with('\n') {
            strip_eol(&mut text);
        }
        Ok(Edit {
            range: start..cut,
            text,
        })
    }

    /// The edit that adds top-level entries after the front matter's last non-blank line (or
    /// creates a front matter at the top of the file).
    fn append_to_front_matter(&self, block: &str) -> Edit {
        let mut text = self.localize(block);
        let Some(yaml) = &self.yaml else {
            let eol = self.eol;
            return Edit {
                range: 0..0,
                text: format!("---{eol}{text}---{eol}"),
            };
        };
        let source = &self.text[yaml.clone()];
        let last = source
            .split_inclusive('\n')
            .scan(yaml.start, |offset, line| {
                let start = *offset;
                *offset += line.len();
                Some((start, *offset, line))
            })
            .filter(|(_, _, line)| !line.trim().is_empty())
            .last();
        match last {
            None if source.is_empty() => {
                strip_eol(&mut text);
                Edit {
                    range: yaml.start..yaml.start,
                    text,
                }
            }
            None => Edit {
                range: yaml.start..yaml.start,
                text,
            },
            Some((_, end, _)) => {
                if !self.text[..end].ends_with('\n') {
                    strip_eol(&mut text);
                    text = format!("{}{text}", self.eol);
                }
                Edit {
                    range: end..end,
                    text,
                }
            }
        }
    }

    /// The edit that replaces the section between the markers, or appends it to the body.
    fn section_edit(&self, section: &str, name: &str, new_card: bool) -> Result<Edit> {
        let section = self.localize(section);
        let body = &self.text[self.body.clone()];
        let eol = self.eol;
        if let Some(s) = body.find(SECTION_START) {
            let start = self.body.start + s;
            let Some(e) = self.text[start..].find(SECTION_END) else {
                return Err(self.body_error(
                    start,
                    format!("`{SECTION_START}` is not followed by `{SECTION_END}`"),
                ));
            };
            let end = start + e + SECTION_END.len();
            let mut text = section;
            strip_eol(&mut text);
            return Ok(Edit {
                range: start..end,
                text,
            });
        }
        if let Some(e) = body.find(SECTION_END) {
            return Err(self.body_error(
                self.body.start + e,
                format!("`{SECTION_END}` without a `{SECTION_START}` before it"),
            ));
        }
        let end = self.text.len();
        let before = &self.text[..end];
        let lead = if new_card {
            format!("{eol}# {}{eol}{eol}", markdown(name))
        } else if before.is_empty() || before.ends_with("\n\n") || before.ends_with("\r\n\r\n") {
            String::new()
        } else if before.ends_with('\n') {
            eol.to_owned()
        } else {
            format!("{eol}{eol}")
        };
        Ok(Edit {
            range: end..end,
            text: format!("{lead}{section}"),
        })
    }

    fn body_error(&self, offset: usize, message: String) -> Error {
        match self.card {
            Some(card) => Error::at(
                self.path.clone(),
                card.line_col(offset),
                ErrorKind::Malformed {
                    subject: None,
                    rule: message,
                },
            ),
            None => Error::malformed(&self.path, None, message),
        }
    }

    /// A warning when the body states KLD numbers outside the generated section.
    fn prose_warning(&self) -> Option<String> {
        static CLAIM: LazyLock<Regex> = LazyLock::new(|| {
            Regex::new(r"(?i)(\bKLD\b|\bKL[- ]?div|\bKullback).*\d*\.\d+|\d*\.\d+.*\bKLD\b")
                .expect("valid")
        });
        let body = &self.text[self.body.clone()];
        let generated = match (body.find(SECTION_START), body.find(SECTION_END)) {
            (Some(s), Some(e)) if e > s => s..e,
            _ => body.len()..body.len(),
        };
        let mut offset = 0;
        for line in body.split_inclusive('\n') {
            let start = offset;
            offset += line.len();
            if generated.contains(&start) {
                continue;
            }
            // Table rows below a KLD header carry bare numbers; the header names the metric.
            if CLAIM.is_match(line) || (line.trim_start().starts_with('|') && line.contains("KLD"))
            {
                let at = self
                    .card
                    .map(|c| c.line_col(self.body.start + start).line)
                    .unwrap_or(0);
                return Some(format!(
                    "the card body states KLD numbers outside the cardproof section (line {at}); \
                     check that they agree with this measurement or remove them"
                ));
            }
        }
        None
    }

    /// `\n` to the file's line ending.
    fn localize(&self, text: &str) -> String {
        if self.eol == "\n" {
            text.to_owned()
        } else {
            text.replace('\n', self.eol)
        }
    }

    fn apply(&self, mut edits: Vec<Edit>) -> String {
        edits.sort_by_key(|e| (e.range.start, e.range.end));
        let mut out = String::with_capacity(self.text.len() + 4096);
        let mut cursor = 0;
        for edit in edits {
            debug_assert!(edit.range.start >= cursor, "edits overlap");
            out.push_str(&self.text[cursor..edit.range.start]);
            out.push_str(&edit.text);
            cursor = edit.range.end;
        }
        out.push_str(&self.text[cursor..]);
        out
    }
}

trait Entries {
    fn entries(&self) -> &[Entry];
}

impl Entries for Node {
    fn entries(&self) -> &[Entry] {
        match &self.kind {
            NodeKind::Map(entries) => entries,
            _ => &[],
        }
    }
}

fn strip_eol(text: &mut String) {
    if text.ends_with("\r\n") {
        text.truncate(text.len() - 2);
    } else if text.ends_with('\n') {
        text.truncate(text.len() - 1);
    }
}

/// The start of the line holding `offset`, not before `floor`.
fn line_start(text: &str, floor: usize, offset: usize) -> usize {
    text[floor..offset]
        .rfind('\n')
        .map_or(floor, |i| floor + i + 1)
}

/// The start of the line after the one holding `offset` (or the end of the YAML).
fn line_end(text: &str, yaml: &Range<usize>, offset: usize) -> usize {
    let offset = offset.clamp(yaml.start, yaml.end);
    if offset > yaml.start && text.as_bytes()[offset - 1] == b'\n' {
        return offset;
    }
    text[offset..yaml.end]
        .find('\n')
        .map_or(yaml.end, |i| offset + i + 1)
}

/// The end of the last byte an entry's key or value occupies, from the spans the parser reports
/// reliably: scalars, keys and flow collections (a block collection's end is the next token).
fn content_end(text: &str, entry: &Entry) -> usize {
    let mut end = entry.key_span.end;
    entry.value.walk(&mut |_, key, node| {
        if let Some(key) = key {
            end = end.max(key.end);
        }
        let flow = matches!(node.kind, NodeKind::Seq(_) | NodeKind::Map(_))
            && matches!(text.as_bytes().get(node.span.start), Some(b'[' | b'{'));
        if (matches!(node.kind, NodeKind::Scalar(_)) || flow) && node.span.end > node.span.start {
            end = end.max(node.span.end);
        }
    });
    end.max(entry.key_span.end)
}

// ---------------------------------------------------------------------------------------------
// YAML emission.

static SCHEMA: LazyLock<Value> = LazyLock::new(crate::disclosure::json_schema);

/// A schema for `{fidelity: <disclosure>}`, so the top-level call can be schema-guided.
static SCHEMA_ROOT: LazyLock<Value> =
    LazyLock::new(|| json!({"properties": {"fidelity": {"$ref": "#/$defs/__root"}}}));

fn resolve(node: &Value) -> &Value {
    let Some(reference) = node.get("$ref").and_then(Value::as_str) else {
        return node;
    };
    if reference == "#/$defs/__root" {
        return &SCHEMA;
    }
    reference
        .strip_prefix("#/$defs/")
        .and_then(|name| SCHEMA.get("$defs").and_then(|d| d.get(name)))
        .unwrap_or(node)
}

fn child_schema<'s>(schema: Option<&'s Value>, key: &str) -> Option<&'s Value> {
    let schema = resolve(schema?);
    schema.get("properties").and_then(|p| p.get(key))
}

fn item_schema(schema: Option<&Value>) -> Option<&Value> {
    resolve(schema?).get("items")
}

/// The keys of `map` in the schema's order, then the others in the map's order.
fn ordered<'m>(
    map: &'m Map<String, Value>,
    schema: Option<&Value>,
) -> Vec<(&'m String, &'m Value)> {
    let known: Vec<&str> = schema
        .map(resolve)
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let mut out: Vec<(&String, &Value)> = Vec::with_capacity(map.len());
    for key in &known {
        if let Some((k, v)) = map.get_key_value(*key) {
            out.push((k, v));
        }
    }
    for (k, v) in map {
        if !known.contains(&k.as_str()) {
            out.push((k, v));
        }
    }
    out
}

fn is_scalar(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

/// A block mapping at `indent`, one `key: value` per line (nested mappings 2 columns deeper).
fn emit_mapping(out: &mut String, indent: usize, map: &Map<String, Value>, schema: Option<&Value>) {
    let pad = " ".repeat(indent);
    for (key, value) in ordered(map, schema) {
        let k = key_text(key);
        let child = child_schema(schema, key);
        match value {
            Value::Object(o) if o.is_empty() => out.push_str(&format!("{pad}{k}: {{}}\n")),
            Value::Object(o) => {
                out.push_str(&format!("{pad}{k}:\n"));
                emit_mapping(out, indent + 2, o, child);
            }
            Value::Array(a) if a.is_empty() => out.push_str(&format!("{pad}{k}: []\n")),
            Value::Array(a) => {
                let flow = flow_text(value, child, None);
                if a.iter().all(is_scalar) && indent + k.len() + 2 + flow.len() <= FLOW_WIDTH {
                    out.push_str(&format!("{pad}{k}: {flow}\n"));
                } else {
                    out.push_str(&format!("{pad}{k}:\n"));
                    emit_sequence(out, indent + 2, a, item_schema(child));
                }
            }
            scalar => {
                let text = claim_value_text(map, key, scalar)
                    .unwrap_or_else(|| scalar_text(scalar, Some(key)));
                out.push_str(&format!("{pad}{k}: {text}\n"));
            }
        }
    }
}

/// A claim's `value` with the digits its precision needs, trailing zeros kept: `1.002100`, not
/// `1.0021` (which would state less precision than was measured).
fn claim_value_text(map: &Map<String, Value>, key: &str, value: &Value) -> Option<String> {
    if key != "value" {
        return None;
    }
    let metric = map.get("metric")?.as_str()?;
    crate::disclosure::precision::claim_text(metric, value.as_f64()?)
}

/// A block sequence at `indent`: mappings of scalars as flow mappings, other mappings in block
/// style after the `- `, everything else in flow style.
fn emit_sequence(out: &mut String, indent: usize, items: &[Value], schema: Option<&Value>) {
    let pad = " ".repeat(indent);
    for item in items {
        match item {
            Value::Object(o) if !o.is_empty() && !o.values().all(is_scalar) => {
                let mut inner = String::new();
                emit_mapping(&mut inner, indent + 2, o, schema);
                let inner = &inner[indent + 2..];
                out.push_str(&format!("{pad}- {inner}"));
            }
            _ => out.push_str(&format!("{pad}- {}\n", flow_text(item, schema, None))),
        }
    }
}

/// A value in flow style (`[a, b]`, `{k: v}`).
fn flow_text(value: &Value, schema: Option<&Value>, key: Option<&str>) -> String {
    match value {
        Value::Array(items) => {
            let inner = item_schema(schema);
            let parts: Vec<String> = items.iter().map(|i| flow_text(i, inner, None)).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Object(map) => {
            let parts: Vec<String> = ordered(map, schema)
                .into_iter()
                .map(|(k, v)| {
                    let text = claim_value_text(map, k, v)
                        .unwrap_or_else(|| flow_text(v, child_schema(schema, k), Some(k)));
                    format!("{}: {text}", key_text(k))
                })
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        scalar => scalar_text(scalar, key),
    }
}

/// Keys whose values are revisions or digests, always quoted.
fn is_revision_key(key: &str) -> bool {
    key == "revision" || key.ends_with("_revision") || key == "sha256" || key.ends_with("_sha256")
}

fn scalar_text(value: &Value, key: Option<&str>) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => number_text(n),
        Value::String(s) => {
            let force = key.is_some_and(is_revision_key) || is_hex(s, 40) || is_hex(s, 64);
            string_text(s, force)
        }
        Value::Array(_) | Value::Object(_) => flow_text(value, None, key),
    }
}

fn key_text(key: &str) -> String {
    string_text(key, false)
}

/// A number that reads back as the same value and type in YAML 1.2 and PyYAML: integers as
/// integers, floats always with a `.` (and a signed exponent when very small or large).
pub(crate) fn number_text(n: &Number) -> String {
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    float_text(n.as_f64().unwrap_or(0.0))
}

fn float_text(f: f64) -> String {
    let a = f.abs();
    if a != 0.0 && !(1e-5..1e16).contains(&a) {
        let s = format!("{f:e}");
        let (mantissa, exponent) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = if mantissa.contains('.') {
            mantissa.to_owned()
        } else {
            format!("{mantissa}.0")
        };
        let exponent = if exponent.starts_with('-') {
            exponent.to_owned()
        } else {
            format!("+{exponent}")
        };
        return format!("{mantissa}e{exponent}");
    }
    let s = format!("{f}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// A string as a plain scalar when every reader reads it back as that string, else double-quoted.
pub(crate) fn string_text(s: &str, force_quotes: bool) -> String {
    if force_quotes || needs_quotes(s) {
        quoted(s)
    } else {
        s.to_owned()
    }
}

fn needs_quotes(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return true;
    };
    if s.trim() != s
        || s.chars().any(|c| {
            c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                )
        })
        || "-?:,[]{}#&*!|>'\"%@`".contains(first)
        || s.contains([':', '#', ',', '[', ']', '{', '}'])
    {
        return true;
    }
    // YAML 1.1 (PyYAML) and 1.2 booleans and nulls, in any case.
    let lower = s.to_ascii_lowercase();
    if matches!(
        lower.as_str(),
        "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null" | "~" | "=" | "<<"
    ) {
        return true;
    }
    // Numbers, dates, times, leading zeros, octal, hex, binary, sexagesimal, .inf/.nan.
    let bytes = s.as_bytes();
    let starts_numeric = first.is_ascii_digit()
        || first == '.'
        || (matches!(first, '+' | '-')
            && bytes
                .get(1)
                .is_some_and(|b| b.is_ascii_digit() || *b == b'.'));
    if starts_numeric || s.parse::<f64>().is_ok() {
        return true;
    }
    // Last line of defence: our own YAML 1.2 reader must give the string back.
    let probe = format!("k: {s}\n");
    let read = yaml::parse(&probe, 0, yaml::Budget::default())
        .ok()
        .flatten()
        .and_then(|root| root.get("k").map(|e| e.value.to_json()));
    read.as_ref().and_then(Value::as_str) != Some(s)
}

fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{feff}' | '\u{fffe}' | '\u{ffff}'
                ) =>
            {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------------------------
// The readable section.

/// Escape text that came from a card or a measurement for Markdown.
fn markdown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '#' | '!' | '|' | '~' | '&' | '$'
            | '{' | '}' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Round to `digits` significant digits.
fn round_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let scale = 10f64.powi(digits - 1 - x.abs().log10().floor() as i32);
    (x * scale).round() / scale
}

fn show(x: f64) -> String {
    format!("{}", round_sig(x, 4))
}

/// `11033` -> `11,033`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn section(f: &Value, m: &Measured, name: &str) -> String {
    let doc = m.doc;
    let mut p = String::new();

    // What was compared, by what.
    let candidate = markdown(name);
    let reference = str_at(f, "/reference/repo")
        .or_else(|| str_at(doc, "/reference/path"))
        .map_or_else(|| "the reference".to_owned(), markdown);
    let ref_detail: Vec<&str> = [
        str_at(f, "/reference/dtype"),
        str_at(f, "/reference/format"),
    ]
    .into_iter()
    .flatten()
    .collect();
    p.push_str(&format!(
        "**{candidate}** was compared with the reference **{reference}**"
    ));
    if !ref_detail.is_empty() {
        p.push_str(&format!(" ({})", markdown(&ref_detail.join(", "))));
    }
    let runner = match str_at(doc, "/environment/runner") {
        Some("native") | None => "cardproof's native CPU runner".to_owned(),
        Some(other) => format!("cardproof's {} runner", markdown(other)),
    };
    p.push_str(&format!(" by {runner}"));
    let mut setup = Vec::new();
    if let (Some(engine), Some(version)) = (
        str_at(doc, "/environment/engine"),
        str_at(doc, "/environment/engine_version"),
    ) {
        setup.push(format!("{} {}", markdown(engine), markdown(version)));
    }
    if let Some(c) = str_at(f, "/runtime/compute_dtype") {
        setup.push(format!("{} compute", markdown(c)));
    }
    if let Some(kv) = str_at(f, "/runtime/kv_cache_dtype") {
        setup.push(format!("{} KV cache", markdown(kv)));
    }
    if let Some(d) = str_at(f, "/runtime/device") {
        setup.push(format!("on {}", markdown(d)));
    }
    if !setup.is_empty() {
        p.push_str(&format!(" ({})", setup.join(", ")));
    }
    let lane_name = lane(m);
    match str_at(doc, "/environment/lane") {
        Some(words) => p.push_str(&format!(
            ", lane `{lane_name}` ({})",
            markdown(words.trim_end_matches('.'))
        )),
        None => p.push_str(&format!(", lane `{lane_name}`")),
    }
    p.push_str(". ");

    // The text.
    let source = str_at(f, "/eval/text/source").unwrap_or("the eval text");
    p.push_str(&format!("The eval text is {}", markdown(source)));
    let mut text_detail = Vec::new();
    if let Some(count) = u64_at(f, "/eval/tokens/count") {
        text_detail.push(format!("{} tokens", grouped(count)));
    }
    match str_at(f, "/eval/bos") {
        Some("none") => text_detail.push("no BOS token".into()),
        Some("per_window") => text_detail.push("a BOS token starting each window".into()),
        Some("per_document") => text_detail.push("a BOS token per document".into()),
        _ => {}
    }
    if let Some(sha) = str_at(f, "/eval/text/sha256") {
        text_detail.push(format!(
            "SHA-256 `{}…`",
            sha.chars().take(12).collect::<String>()
        ));
    }
    if !text_detail.is_empty() {
        p.push_str(&format!(" ({})", text_detail.join(", ")));
    }
    let lengths = context_lengths(f, m);
    let lengths_words: Vec<String> = lengths.iter().map(|l| grouped(*l)).collect();
    p.push_str(&format!(
        ", cut into non-overlapping windows of {} tokens (a trailing partial window is dropped). ",
        lengths_words.join(" and ")
    ));

    // Rows, direction, vocabulary.
    let positions = match str_at(f, "/protocol/positions/policy") {
        Some("all") => "Every row of each window is scored (row j predicts token j+1)".to_owned(),
        Some("stride") => format!(
            "Rows j with j mod {} = {} are scored (row j predicts token j+1)",
            u64_at(f, "/protocol/positions/stride").unwrap_or(1),
            u64_at(f, "/protocol/positions/offset").unwrap_or(0)
        ),
        Some("second_half") => {
            "Rows from L/2 to L-2 of each window of L tokens are scored, as llama.cpp scores"
                .to_owned()
        }
        Some("from") => format!(
            "Rows j ≥ {} of each window are scored (row j predicts token j+1)",
            u64_at(f, "/protocol/positions/from").unwrap_or(0)
        ),
        _ => "Rows are scored as the `fidelity.protocol.positions` metadata says".to_owned(),
    };
    p.push_str(&positions);
    p.push_str(". ");
    let units = str_at(f, "/protocol/kl/units").unwrap_or("nats");
    let forward =
        "forward KL, `KL(P_ref ‖ P_cand) = Σ_i p_ref(i) · (log p_ref(i) − log p_cand(i))`";
    let reverse =
        "reverse KL, `KL(P_cand ‖ P_ref) = Σ_i p_cand(i) · (log p_cand(i) − log p_ref(i))`";
    let direction = match str_at(f, "/protocol/kl/direction") {
        Some("reverse") => reverse.to_owned(),
        Some("both") => format!("{forward}, and {reverse}"),
        _ => forward.to_owned(),
    };
    p.push_str(&format!(
        "The divergence is {direction}, in {}",
        markdown(units)
    ));
    let padding = match str_at(f, "/protocol/vocab/padding") {
        Some("excluded") => "; logit rows beyond the tokenizer's vocabulary are excluded",
        Some("included") => "; logit rows beyond the tokenizer's vocabulary, if any, are included",
        _ => "",
    };
    let vocab = match str_at(f, "/protocol/vocab/mode") {
        Some("full") => "summed over the full vocabulary".to_owned(),
        Some("top_k") => format!(
            "summed over the reference's top {} tokens (tail {})",
            u64_at(f, "/protocol/vocab/k").unwrap_or(0),
            markdown(str_at(f, "/protocol/vocab/tail").unwrap_or("unstated"))
        ),
        Some("threshold") => format!(
            "dropping reference terms with log p ≤ {}",
            f64_at(f, "/protocol/vocab/log_p").unwrap_or(0.0)
        ),
        _ => "over the vocabulary the metadata states".to_owned(),
    };
    p.push_str(&format!(", {vocab}{padding}. "));

    // Aggregation and uncertainty.
    let statistic = match str_at(f, "/protocol/aggregation/statistic") {
        Some("mean_over_positions") => "the mean over all scored rows",
        Some("mean_of_window_means") => "the mean of the windows' means",
        Some("mean_of_document_means") => "the mean of the documents' means",
        _ => "aggregated as the metadata states",
    };
    p.push_str(&format!(
        "Means are {statistic}; percentiles interpolate linearly over the sorted rows. "
    ));
    let level = f64_at(f, "/protocol/aggregation/uncertainty/level").unwrap_or(0.95);
    let level_words = format!("{}%", show(level * 100.0));
    match str_at(f, "/protocol/aggregation/uncertainty/method") {
        Some("block_bootstrap") | Some("bootstrap") => {
            let blocks = match m.runs[0].get("bootstrap_block").and_then(Value::as_str) {
                Some(b) if b.starts_with("run:") => {
                    format!("runs of {} consecutive rows", markdown(&b[4..]))
                }
                _ => "whole windows".to_owned(),
            };
            let mut detail = Vec::new();
            if let Some(r) = u64_at(f, "/protocol/aggregation/uncertainty/resamples") {
                detail.push(format!("{} resamples", grouped(r)));
            }
            if let Some(s) = u64_at(f, "/protocol/aggregation/uncertainty/seed") {
                detail.push(format!("seed {s}"));
            }
            p.push_str(&format!(
                "Intervals are {level_words} percentile intervals of a bootstrap resampling {blocks}"
            ));
            if !detail.is_empty() {
                p.push_str(&format!(" ({})", detail.join(", ")));
            }
            p.push('.');
        }
        _ => p.push_str("No uncertainty is stated."),
    }

    let mut s = String::new();
    s.push_str(SECTION_START);
    s.push_str("\n## Fidelity (cardproof)\n\n");
    s.push_str(&p);
    s.push_str("\n\n");

    let claims = f
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for run in m.runs {
        let Some(length) = run.get("context_length").and_then(Value::as_u64) else {
            continue;
        };
        let mut heading = format!("**Context length {}**", grouped(length));
        let mut detail = Vec::new();
        if let Some(w) = run.get("n_windows").and_then(Value::as_u64) {
            detail.push(format!("{} windows", grouped(w)));
        }
        if let Some(n) = run.get("n_positions").and_then(Value::as_u64) {
            detail.push(format!("{} scored rows", grouped(n)));
        }
        if !detail.is_empty() {
            heading.push_str(&format!(" ({})", detail.join(", ")));
        }
        s.push_str(&heading);
        s.push_str(&format!(
            "\n\n| metric | value | {level_words} interval |\n|---|---|---|\n"
        ));
        for metric in [
            "kld_mean",
            "kld_reverse_mean",
            "kld_p99",
            "top1_agreement",
            "ppl_ratio",
        ] {
            let claimed = claims
                .iter()
                .find(|c| {
                    c.get("metric").and_then(Value::as_str) == Some(metric)
                        && (c.get("context_length").and_then(Value::as_u64) == Some(length)
                            || (lengths.len() == 1 && c.get("context_length").is_none()))
                })
                .and_then(|c| c.get("value").and_then(Value::as_f64));
            let measured = run
                .pointer(&format!("/metrics/{metric}"))
                .and_then(Value::as_f64);
            let Some(value) = claimed.or(measured.map(|v| round_sig(v, 4))) else {
                continue;
            };
            if metric == "kld_reverse_mean"
                && str_at(f, "/protocol/kl/direction") == Some("forward")
            {
                continue;
            }
            let interval = run
                .pointer(&format!("/uncertainty/{metric}/ci95"))
                .and_then(Value::as_array)
                .and_then(|ci| Some((ci.first()?.as_f64()?, ci.get(1)?.as_f64()?)))
                .map_or_else(
                    || "–".to_owned(),
                    |(lo, hi)| format!("[{}, {}]", show(lo), show(hi)),
                );
            let label = metric_label(metric, units);
            s.push_str(&format!("| {label} | {value} | {interval} |\n"));
        }
        s.push('\n');
    }
    s.push_str(
        "The complete protocol and the claims are in this card's `fidelity:` metadata \
         (schema `cardproof/v1`); this section is rewritten by `cardproof card`.\n",
    );
    s.push_str(SECTION_END);
    s.push('\n');
    s
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
        Err(Error::malformed(
            path,
            None,
            format!(
                "internal error: the written `{}` does not read back as written; the card was \
                 not changed (please report this)",
                wrong.join("` and `")
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_back(text: &str) -> Value {
        let doc = format!("k: {text}\n");
        yaml::parse(&doc, 0, yaml::Budget::default())
            .unwrap()
            .unwrap()
            .get("k")
            .unwrap()
            .value
            .to_json()
    }

    #[test]
    fn ambiguous_strings_are_quoted_and_read_back() {
        for s in [
            "no",
            "No",
            "off",
            "y",
            "n",
            "yes",
            "true",
            "null",
            "~",
            "1e5",
            "0123",
            "a: b",
            "#x",
            "",
            " lead",
            "trail ",
            "0x1f",
            "0o17",
            "1_000",
            "1:30",
            "2024-01-31",
            ".inf",
            ".5",
            "-1",
            "+1",
            "=",
            "<<",
            "- x",
            "[a]",
            "{a}",
            "a, b",
            "*x",
            "&x",
            "!x",
            "|",
            ">",
            "%x",
            "@x",
            "`x",
            "'x",
            "\"x",
            "tab\there",
            "line\nbreak",
            "nan",
            "inf",
            "\u{2028}",
        ] {
            let text = string_text(s, false);
            assert!(text.starts_with('"'), "{s:?} must be quoted, got {text}");
            assert_eq!(
                read_back(&text),
                Value::String(s.into()),
                "{s:?} via {text}"
            );
        }
        for s in [
            "bf16",
            "safetensors",
            "Qwen/Qwen3-8B",
            "eval.txt",
            "a b",
            "x-y",
            "é",
        ] {
            assert_eq!(string_text(s, false), s);
        }
        let hex = "aebc08a6edbab4465a99260c28646dfe1034e3b9";
        assert_eq!(scalar_text(&json!(hex), None), format!("\"{hex}\""));
        assert_eq!(scalar_text(&json!("main"), Some("revision")), "\"main\"");
    }

    #[test]
    fn generated_strings_round_trip() {
        let alphabet: Vec<char> = " abyn01.:-#,'\"\\[]{}!&*|>%@`\t\n\u{7f}é~=<xeEoO_+?"
            .chars()
            .collect();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..5000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 6) as usize;
            let s: String = (0..len)
                .map(|i| alphabet[((seed >> (8 + 5 * i)) as usize) % alphabet.len()])
                .collect();
            let text = string_text(&s, false);
            assert_eq!(
                read_back(&text),
                Value::String(s.clone()),
                "{s:?} via {text}"
            );
            let flow = read_back(&format!("[{text}]"));
            assert_eq!(flow, json!([s]), "{s:?} in a flow sequence via {text}");
        }
    }

    #[test]
    fn numbers_round_trip_with_their_type() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut values = vec![
            0.0, -0.0, 1.0, 0.95, 1e-5, 9.99e-6, 1e16, 1e300, 5e-324, -2.5e-7,
        ];
        for _ in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let f = f64::from_bits(seed);
            if f.is_finite() {
                values.push(f);
            }
        }
        for f in values {
            let n = Number::from_f64(f).unwrap();
            let text = number_text(&n);
            let back = read_back(&text);
            assert!(back.is_f64(), "{f} printed as {text} reads back as {back}");
            assert_eq!(
                back.as_f64().unwrap().to_bits(),
                f.to_bits(),
                "{f} via {text}"
            );
        }
        assert_eq!(number_text(&Number::from(128u64)), "128");
        assert_eq!(number_text(&Number::from(-3i64)), "-3");
        assert_eq!(read_back("128"), json!(128));
    }

    #[test]
    fn markdown_escapes_card_text() {
        assert_eq!(markdown("a_b*c|d<e>"), "a\\_b\\*c\\|d\\<e\\>");
    }
}
