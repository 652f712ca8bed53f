//! Many quant files under one card (`fidelity.files`).
//!
//! A GGUF repository holds ten or more quant files under one README. Such a card discloses the
//! shared reference, runtime, eval and protocol once and lists each file with its quantization,
//! digest and claims. Each entry is read as the block a card for that one file would have (a
//! *view*: the shared sections, `candidate.file` and `candidate.files_sha256` from the entry, the
//! entry's `quantization`, `calibration` when it has one, and `results`), so lint, `verify` and a
//! signed report judge every file by the rules for one card, and adding a file to the card leaves
//! the other files' views, and the reports signed for them, as they were. Views are built on the
//! YAML tree and keep every node's place in the card, so a finding in a view points at the line
//! of the entry it came from.

use std::ops::Range;

use serde_json::Value;

use crate::card::yaml::{Entry, Node, NodeKind};

/// The keys of one `files` entry (besides `x-` / `x_` extensions).
pub const ENTRY_KEYS: [&str; 5] = [
    "file",
    "files_sha256",
    "quantization",
    "calibration",
    "results",
];

/// Most entries one card may list (a repository of every llama.cpp type has about 30).
pub const MAX_FILES: usize = 256;

/// One file's entry read as a single-file `fidelity` block.
#[derive(Debug, Clone)]
pub struct FileView {
    /// The entry's index in `fidelity.files`.
    pub index: usize,
    /// The file's name (a bare name; an entry naming a path is a [`Problem`], not a view).
    pub file: String,
    /// The entry gives its own `calibration` (else the view has the block's).
    pub own_calibration: bool,
    /// The view: a `fidelity` block for this one file.
    pub node: Node,
}

impl FileView {
    /// The place in the card of what the view holds at `pointer` (a pointer into the view,
    /// `/fidelity/...`): the entry's field for the parts it gives, the shared section else.
    pub fn card_pointer(&self, pointer: &str) -> String {
        let entry = format!("/fidelity/files/{}", self.index);
        let moved = |from: &str, to: &str| {
            pointer
                .strip_prefix(from)
                .filter(|rest| rest.is_empty() || rest.starts_with('/'))
                .map(|rest| format!("{entry}{to}{rest}"))
        };
        let mut routes = vec![
            ("/fidelity/candidate/file", "/file"),
            ("/fidelity/candidate/files_sha256", "/files_sha256"),
            ("/fidelity/quantization", "/quantization"),
            ("/fidelity/results", "/results"),
        ];
        if self.own_calibration {
            routes.push(("/fidelity/calibration", "/calibration"));
        }
        routes
            .into_iter()
            .find_map(|(from, to)| moved(from, to))
            .unwrap_or_else(|| pointer.to_owned())
    }

    /// Whether a place in the card (`/fidelity/files/N/...`) is another entry's: what is said
    /// about another file is not about this one.
    pub fn is_other_entry(&self, card_pointer: &str) -> bool {
        card_pointer
            .strip_prefix("/fidelity/files/")
            .and_then(|rest| rest.split('/').next())
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| i != self.index)
    }

    pub fn json(&self) -> Value {
        self.node.to_json()
    }
}

/// Something wrong with the list itself or one entry's shape, at a place in the card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub pointer: String,
    pub message: String,
}

/// A `fidelity` block with `files`: the views of its well-formed entries and what is wrong with
/// the rest.
#[derive(Debug, Clone, Default)]
pub struct Files {
    pub views: Vec<FileView>,
    pub problems: Vec<Problem>,
}

impl Files {
    /// The view of the entry for `name`.
    pub fn view(&self, name: &str) -> Option<&FileView> {
        self.views.iter().find(|v| v.file == name)
    }

    /// The files listed, in the card's order.
    pub fn names(&self) -> Vec<&str> {
        self.views.iter().map(|v| v.file.as_str()).collect()
    }
}

/// A bare file name: one path component, not `.` or `..`, no separator or NUL.
pub fn is_bare_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && !name.contains(['/', '\\', '\0'])
}

/// The views of `fidelity`'s `files`, or `None` when the block has no `files` key (a card for one
/// checkpoint).
pub fn read(fidelity: &Node) -> Option<Files> {
    let list = fidelity.get("files")?;
    let mut files = Files::default();
    let mut problem = |pointer: String, message: String| {
        files.problems.push(Problem { pointer, message });
    };
    for (key, why) in [
        (
            "quantization",
            "each file's entry gives its own `quantization`",
        ),
        ("results", "each file's entry gives its own `results`"),
    ] {
        if fidelity.get(key).is_some() {
            problem(
                format!("/fidelity/{key}"),
                format!("a card with `files` has no top-level `{key}`: {why}"),
            );
        }
    }
    if let Some(candidate) = fidelity.get("candidate") {
        for key in ["file", "files_sha256"] {
            if candidate.value.get(key).is_some() {
                problem(
                    format!("/fidelity/candidate/{key}"),
                    format!(
                        "a card with `files` has no `candidate.{key}`: each file's entry gives its \
                         own `{key}`"
                    ),
                );
            }
        }
    }
    let NodeKind::Seq(items) = &list.value.kind else {
        problem(
            "/fidelity/files".into(),
            "`files` must be a list of entries (`- file: NAME`, `files_sha256`, `quantization`, \
             `results`)"
                .into(),
        );
        return Some(files);
    };
    if items.is_empty() || items.len() > MAX_FILES {
        problem(
            "/fidelity/files".into(),
            format!(
                "`files` lists {} entries; a card lists 1 to {MAX_FILES} files",
                items.len()
            ),
        );
        if items.len() > MAX_FILES {
            return Some(files);
        }
    }
    let mut views = Vec::new();
    for (index, item) in items.iter().enumerate() {
        match entry_view(fidelity, index, item) {
            Ok(view) => {
                if views.iter().any(|v: &FileView| v.file == view.file) {
                    problem(
                        format!("/fidelity/files/{index}/file"),
                        format!(
                            "files[{index}] names `{}` again: each file has one entry",
                            view.file
                        ),
                    );
                } else {
                    views.push(view);
                }
            }
            Err(found) => {
                for p in found {
                    problem(p.pointer, p.message);
                }
            }
        }
    }
    files.views = views;
    Some(files)
}

/// Entry `index` read into its view, or every problem of its shape.
fn entry_view(fidelity: &Node, index: usize, item: &Node) -> Result<FileView, Vec<Problem>> {
    let at = |key: &str| format!("/fidelity/files/{index}{key}");
    let NodeKind::Map(entries) = &item.kind else {
        return Err(vec![Problem {
            pointer: at(""),
            message: format!(
                "files[{index}] is not a mapping: an entry has `file`, `files_sha256`, \
                 `quantization` and `results`"
            ),
        }]);
    };
    let mut problems = Vec::new();
    for e in entries {
        let extension = e.key.starts_with("x-") || e.key.starts_with("x_");
        if !extension && !ENTRY_KEYS.contains(&e.key.as_str()) {
            problems.push(Problem {
                pointer: at(&format!(
                    "/{}",
                    crate::card::yaml::escape_pointer_token(&e.key)
                )),
                message: format!(
                    "unknown field `{}` in files[{index}] (known fields: {})",
                    e.key,
                    ENTRY_KEYS.join(", ")
                ),
            });
        }
    }
    for key in ["file", "files_sha256", "quantization", "results"] {
        if item.get(key).is_none() {
            problems.push(Problem {
                pointer: at(""),
                message: format!("files[{index}] has no `{key}`: {}", why_required(key)),
            });
        }
    }
    let file = item
        .get("file")
        .and_then(|e| e.value.as_scalar())
        .and_then(|s| s.value.as_str().map(str::to_owned));
    match (&file, item.get("file")) {
        (Some(name), _) if is_bare_name(name) => {}
        (_, Some(e)) => problems.push(Problem {
            pointer: at("/file"),
            message: format!(
                "files[{index}].file is `{}`, not a bare file name: a card names files beside it, \
                 never a path",
                e.value.to_json()
            ),
        }),
        (_, None) => {}
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let file = file.expect("checked above");
    let own_calibration = item.get("calibration").is_some();
    Ok(FileView {
        index,
        file,
        own_calibration,
        node: view_node(fidelity, item),
    })
}

fn why_required(key: &str) -> &'static str {
    match key {
        "file" => "the entry must name the file it describes",
        "files_sha256" => {
            "it binds the entry's claims to the file's bytes (`cardproof hash FILE` prints it)"
        }
        "quantization" => "how this file was quantized is part of what its numbers mean",
        _ => "the entry claims nothing",
    }
}

/// The single-file block of one entry: the shared sections in the block's order, with the
/// entry's parts in place of the top level's.
fn view_node(fidelity: &Node, item: &Node) -> Node {
    let NodeKind::Map(shared) = &fidelity.kind else {
        return fidelity.clone();
    };
    let from_item = |key: &str| item.get(key).cloned();
    let mut out: Vec<Entry> = Vec::new();
    for e in shared {
        match e.key.as_str() {
            "files" | "quantization" | "results" => {}
            "candidate" => out.push(candidate_view(e, item)),
            "calibration" => out.push(from_item("calibration").unwrap_or_else(|| e.clone())),
            _ => out.push(e.clone()),
        }
    }
    // The entry's own parts, after the shared sections they sit among in a single-file card.
    for key in ["quantization", "results"] {
        if let Some(e) = from_item(key) {
            out.push(e);
        }
    }
    if fidelity.get("calibration").is_none()
        && let Some(e) = from_item("calibration")
    {
        out.push(e);
    }
    Node {
        span: fidelity.span.clone(),
        kind: NodeKind::Map(out),
    }
}

/// `candidate` with the entry's `file` and `files_sha256` (the top level's, if any, dropped: a
/// [`Problem`] says so).
fn candidate_view(candidate: &Entry, item: &Node) -> Entry {
    let mut entries: Vec<Entry> = match &candidate.value.kind {
        NodeKind::Map(es) => es
            .iter()
            .filter(|e| e.key != "file" && e.key != "files_sha256")
            .cloned()
            .collect(),
        _ => return candidate.clone(),
    };
    for key in ["files_sha256", "file"] {
        if let Some(e) = item.get(key) {
            entries.push(e.clone());
        }
    }
    Entry {
        value: Node {
            span: candidate.value.span.clone(),
            kind: NodeKind::Map(entries),
        },
        ..candidate.clone()
    }
}

/// The results of every entry (a card's prose and `model-index` speak of all its files).
pub fn all_results(fidelity: &Value) -> Vec<Value> {
    match fidelity.get("files").and_then(Value::as_array) {
        Some(entries) => entries
            .iter()
            .filter_map(|e| e.get("results").and_then(Value::as_array))
            .flatten()
            .cloned()
            .collect(),
        None => fidelity
            .get("results")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    }
}

/// The JSON view of `file` in a `fidelity` block given as JSON (a signed report's card is compared
/// with the view it signed): `None` when the block lists no such file or has no `files`.
pub fn view_json(fidelity: &Value, file: &str) -> Option<Value> {
    let node = json_node(fidelity);
    let files = read(&node)?;
    files.view(file).map(FileView::json)
}

/// The card's `fidelity` block as a report about `file` reads it: for a card listing many files,
/// that file's view, which is what `verify` signed for it, so adding or updating another file's
/// entry leaves this file's report standing; else the block itself
/// ([`crate::card::canonical::fidelity_json`]). A file the card no longer lists reads as `null`.
pub fn fidelity_of_file(card: &crate::card::Card, file: Option<&str>) -> Value {
    let whole = crate::card::canonical::fidelity_json(card);
    match file {
        Some(name) if whole.get("files").is_some() => {
            view_json(&whole, name).unwrap_or(Value::Null)
        }
        _ => whole,
    }
}

/// A JSON value as a YAML tree without places (for [`view_json`]).
fn json_node(value: &Value) -> Node {
    let kind = match value {
        Value::Array(items) => NodeKind::Seq(items.iter().map(json_node).collect()),
        Value::Object(map) => NodeKind::Map(
            map.iter()
                .map(|(k, v)| Entry {
                    key: k.clone(),
                    key_span: Range::default(),
                    key_plain: true,
                    value: json_node(v),
                })
                .collect(),
        ),
        scalar => NodeKind::Scalar(crate::card::yaml::Scalar {
            text: scalar
                .as_str()
                .map_or_else(|| scalar.to_string(), str::to_owned),
            style: granit_parser::ScalarStyle::Plain,
            value: scalar.clone(),
        }),
    };
    Node {
        span: Range::default(),
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fidelity(yaml: &str) -> Node {
        let text = format!("---\nfidelity:\n{yaml}---\n");
        let card = crate::card::Card::from_bytes("README.md".into(), text.into_bytes()).unwrap();
        card.metadata()
            .unwrap()
            .get("fidelity")
            .unwrap()
            .value
            .clone()
    }

    const TWO: &str = "  schema: cardproof/v1
  candidate:
    repo: org/m-GGUF
  calibration:
    dataset: none
  protocol: {context_lengths: [512]}
  files:
  - file: m-Q4_0.gguf
    files_sha256: aaaa
    quantization: {method: q4_0}
    results: [{metric: kld_mean, value: 0.1}]
  - file: m-Q8_0.gguf
    files_sha256: bbbb
    quantization: {method: q8_0}
    calibration: {dataset: wiki}
    results: [{metric: kld_mean, value: 0.01}]
";

    #[test]
    fn each_entry_reads_as_the_block_of_one_file() {
        let files = read(&fidelity(TWO)).unwrap();
        assert!(files.problems.is_empty(), "{:?}", files.problems);
        assert_eq!(files.names(), ["m-Q4_0.gguf", "m-Q8_0.gguf"]);
        let q8 = files.view("m-Q8_0.gguf").unwrap();
        assert_eq!(
            q8.json(),
            json!({
                "schema": "cardproof/v1",
                "candidate": {"repo": "org/m-GGUF", "files_sha256": "bbbb", "file": "m-Q8_0.gguf"},
                "calibration": {"dataset": "wiki"},
                "protocol": {"context_lengths": [512]},
                "quantization": {"method": "q8_0"},
                "results": [{"metric": "kld_mean", "value": 0.01}],
            })
        );
        assert_eq!(
            files.view("m-Q4_0.gguf").unwrap().json()["calibration"],
            json!({"dataset": "none"})
        );
        // Places map back to the entry for its own parts, to the shared section else.
        assert_eq!(
            q8.card_pointer("/fidelity/results/0/value"),
            "/fidelity/files/1/results/0/value"
        );
        assert_eq!(
            q8.card_pointer("/fidelity/calibration/dataset"),
            "/fidelity/files/1/calibration/dataset"
        );
        assert_eq!(
            files.views[0].card_pointer("/fidelity/calibration/dataset"),
            "/fidelity/calibration/dataset"
        );
        assert_eq!(
            q8.card_pointer("/fidelity/candidate/files_sha256"),
            "/fidelity/files/1/files_sha256"
        );
        assert_eq!(q8.card_pointer("/fidelity/resultsx"), "/fidelity/resultsx");
        assert!(q8.is_other_entry("/fidelity/files/0/results"));
        assert!(!q8.is_other_entry("/fidelity/files/1/results"));
        assert!(!q8.is_other_entry("/fidelity/protocol"));
        // The same view from the block as JSON (a signed report's comparison).
        let as_json = fidelity(TWO).to_json();
        assert_eq!(view_json(&as_json, "m-Q8_0.gguf").unwrap(), q8.json());
        assert_eq!(view_json(&as_json, "m-Q2_K.gguf"), None);
        assert_eq!(all_results(&as_json).len(), 2);
    }

    #[test]
    fn a_card_without_files_has_no_views() {
        assert!(read(&fidelity("  schema: cardproof/v1\n  results: []\n")).is_none());
    }

    #[test]
    fn malformed_entries_are_problems_at_their_place() {
        let yaml = "  quantization: {method: q4_0}
  candidate: {repo: r, file: a.gguf}
  files:
  - file: ../a.gguf
    files_sha256: a
    quantization: {}
    results: []
  - file: b.gguf
    size: 3
    x-note: fine
  - just text
  - file: c.gguf
    files_sha256: c
    quantization: {}
    results: []
  - file: c.gguf
    files_sha256: c
    quantization: {}
    results: []
";
        let files = read(&fidelity(yaml)).unwrap();
        let shown: Vec<String> = files
            .problems
            .iter()
            .map(|p| format!("{} {}", p.pointer, p.message))
            .collect();
        let expect = [
            "/fidelity/quantization a card with `files` has no top-level `quantization`",
            "/fidelity/candidate/file a card with `files` has no `candidate.file`",
            "/fidelity/files/0/file files[0].file is `\"../a.gguf\"`, not a bare file name",
            "/fidelity/files/1/size unknown field `size` in files[1]",
            "/fidelity/files/1 files[1] has no `files_sha256`",
            "/fidelity/files/1 files[1] has no `quantization`",
            "/fidelity/files/1 files[1] has no `results`",
            "/fidelity/files/2 files[2] is not a mapping",
            "/fidelity/files/4/file files[4] names `c.gguf` again",
        ];
        for e in expect {
            assert!(shown.iter().any(|s| s.starts_with(e)), "{e}\n{shown:#?}");
        }
        assert_eq!(shown.len(), expect.len(), "{shown:#?}");
        assert_eq!(files.names(), ["c.gguf"]);
        assert!(!is_bare_name(".."));
        assert!(!is_bare_name("a\\b"));
        assert!(is_bare_name("m-Q4_K_M.gguf"));
    }
}
