//! `cardproof lint`: the disclosure schema, the nine items, Hub metadata and undisclosed claims.

mod checkpoint;
mod items;
mod metadata;
pub(crate) mod prose;
mod schema;
pub mod select;

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;

use serde::Serialize;

use crate::card::yaml::{Node, NodeKind};
use crate::card::{Card, FrontMatter};
use crate::checkpoint::inspect::Inspection;
use crate::findings::{Code, Finding, Severity};

/// The result of linting one card.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct LintReport {
    #[serde(skip)]
    pub file: PathBuf,
    pub findings: Vec<Finding>,
}

impl LintReport {
    pub fn errors(&self) -> usize {
        self.findings.iter().filter(|f| f.is_error()).count()
    }

    pub fn warnings(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Warning)
            .count()
    }
}

/// Lint a parsed card.
pub fn lint(card: &Card) -> LintReport {
    lint_with_checkpoint(card, &[])
}

/// Claims printed too coarsely to be reproduced (`verify` gives them the `imprecise` verdict), and
/// entries `verify` cannot read as claims at all (`invalid`): flagged before publishing.
fn imprecise_claims(fidelity: &Node, locator: &Locator<'_>, out: &mut Vec<Finding>) {
    use crate::disclosure::precision::{IMPRECISE_RELATIVE, half_unit, relative_precision};
    for claim in crate::disclosure::results::claims(fidelity, &|_| 0) {
        if let Some(why) = &claim.invalid {
            // Verify gives such an entry the verdict `invalid`; say so here unless another error
            // already points into the entry (a schema violation, an unknown metric).
            let entry = format!("/fidelity/results/{}", claim.index);
            let covered = out.iter().any(|f| {
                f.is_error()
                    && f.pointer.as_deref().is_some_and(|p| {
                        p == entry
                            || p.starts_with(&format!("{entry}/"))
                            || p == "/fidelity/results"
                    })
            });
            if !covered {
                out.push(locator.at_value(
                    Finding::new(
                        Code::InvalidClaim,
                        format!("results[{}] cannot be read as a claim: {why}", claim.index),
                    ),
                    &format!("{entry}/value"),
                ));
            }
            continue;
        }
        // A turn metric's precision is judged against one count's share, which only the
        // rerun's counts give (`verify`); its value may sit at 0 or 1 like any share.
        if crate::disclosure::vocabulary::is_turn_metric(&claim.metric) {
            continue;
        }
        let relative = relative_precision(&claim.metric, &claim.text, claim.value);
        if relative <= IMPRECISE_RELATIVE {
            continue;
        }
        let said = if relative.is_finite() {
            format!(
                "±{:.1e}, {:.0}% of its scale",
                half_unit(&claim.text),
                100.0 * relative
            )
        } else {
            "nothing about its distance from the metric's bound".to_owned()
        };
        out.push(locator.at_value(
            Finding::new(
                Code::ImpreciseClaim,
                format!(
                    "{} `{}` is printed too coarsely to be checked: its digits say {said}; print it to within {}% (as `cardproof card` does), or `verify` calls it imprecise",
                    claim.metric,
                    claim.text,
                    100.0 * IMPRECISE_RELATIVE
                ),
            ),
            &format!("/fidelity/results/{}/value", claim.index),
        ));
    }
}

/// `cardproof lint PATH`: lint `card` (read from `path`), and when `path` is a model directory
/// holding a checkpoint, check the card against what the checkpoint really holds.
pub fn lint_at(card: &Card, path: &std::path::Path) -> crate::Result<LintReport> {
    let inspections = if path.is_dir() && crate::checkpoint::has_checkpoint(path) {
        crate::checkpoint::inspect::inspect_path(path)?
    } else {
        Vec::new()
    };
    Ok(lint_with_checkpoint(card, &inspections))
}

/// Lint a card that sits next to a checkpoint: also cross-check its `quantization` section against
/// what `inspect` found, and turn inspect's own findings into errors.
pub fn lint_with_checkpoint(card: &Card, inspections: &[Inspection]) -> LintReport {
    let locator = Locator::new(card);
    let mut findings = Vec::new();
    let body = card.body_range();
    let claims_in_prose = crate::card::prose::kld_claims(&card.text, body.clone());

    match &card.front_matter {
        FrontMatter::Unterminated { opening } => {
            findings.push(locator.at_span(
                Finding::new(
                    Code::UnterminatedFrontMatter,
                    "front matter opened with `---` is never closed by a `---` line, so the Hub \
                     sees no metadata at all",
                ),
                opening.clone(),
            ));
        }
        FrontMatter::Present {
            root: Some(root), ..
        } if !matches!(root.kind, NodeKind::Map(_)) => {
            findings.push(locator.at_span(
                Finding::new(
                    Code::MetadataNotMapping,
                    "front matter must be a YAML mapping (`key: value` lines); the Hub rejects \
                     anything else",
                ),
                root.span.clone(),
            ));
        }
        _ => {}
    }

    let root = card
        .metadata()
        .filter(|r| matches!(r.kind, NodeKind::Map(_)));
    if let Some(root) = root {
        metadata::yaml_scalars(root, &locator, &mut findings);
    }
    let fidelity = root.and_then(|r| r.get("fidelity"));
    if !inspections.is_empty() {
        checkpoint::inspection_findings(inspections, &mut findings);
    }
    match fidelity {
        Some(fidelity) => {
            let root = root.expect("fidelity implies a root");
            disclosure_findings(
                card,
                root,
                &fidelity.value,
                inspections,
                &claims_in_prose,
                &locator,
                &mut findings,
            );
        }
        None if !claims_in_prose.is_empty() => {
            for claim in claims_in_prose {
                findings.push(locator.at_span(
                    Finding::new(
                        Code::UndisclosedKldClaim,
                        format!(
                            "the card claims a KLD number ({}) but has no `fidelity:` disclosure: \
                             the number cannot be interpreted or rerun (write the block with \
                             `cardproof card --measurement measurement.json` after `cardproof \
                             measure`, or from a log with `cardproof card --from-llamacpp LOG`)",
                            claim.excerpt
                        ),
                    ),
                    claim.span,
                ));
            }
        }
        None => {
            let why = match &card.front_matter {
                FrontMatter::Present { root: Some(_), .. } => {
                    "the front matter has no `fidelity:` block"
                }
                _ => "the card has no front matter, so no metadata and no `fidelity:` block",
            };
            findings.push(Finding::new(
                Code::NoFidelityDisclosure,
                format!(
                    "no fidelity disclosure: {why}; add one before publishing KLD numbers \
                     (`cardproof card --measurement measurement.json` writes it from a `cardproof \
                     measure` run)"
                ),
            ));
        }
    }

    findings.sort_by(|a, b| {
        (
            a.line.unwrap_or(0),
            a.column.unwrap_or(0),
            a.code,
            &a.pointer,
        )
            .cmp(&(
                b.line.unwrap_or(0),
                b.column.unwrap_or(0),
                b.code,
                &b.pointer,
            ))
    });
    findings.dedup_by(|a, b| a.code == b.code && a.pointer == b.pointer && a.message == b.message);
    LintReport {
        file: card.path.clone(),
        findings,
    }
}

/// Findings of a `fidelity` block: each view (the block itself, or each entry of a card listing
/// many files) against the schema, the nine items, its claims' precision, the Hub metadata and,
/// beside a checkpoint, its file's tensors; then the prose and `model-index` against every claim.
fn disclosure_findings(
    card: &Card,
    root: &Node,
    fidelity: &Node,
    inspections: &[Inspection],
    claims_in_prose: &[crate::card::prose::ProseClaim],
    locator: &Locator<'_>,
    findings: &mut Vec<Finding>,
) {
    let files = crate::disclosure::files::read(fidelity);
    let views: Vec<(&Node, Locator<'_>)> = match &files {
        Some(files) => {
            listed_files(files, inspections, locator, findings);
            files
                .views
                .iter()
                .map(|v| (&v.node, locator.for_view(v)))
                .collect()
        }
        None => vec![(fidelity, locator.whole())],
    };
    for (node, locator) in &views {
        let json = node.to_json();
        if !inspections.is_empty() {
            let file = json.pointer("/candidate/file").and_then(|f| f.as_str());
            checkpoint::check(&json, &of_file(inspections, file), locator, findings);
        }
        schema::validate(&json, locator, findings);
        items::check(&json, locator, findings);
        imprecise_claims(node, locator, findings);
        metadata::hub(root, &json, locator, findings);
    }
    // The prose and the Hub's `model-index` speak of every file the card lists.
    let mut whole = fidelity.to_json();
    whole["results"] = serde_json::Value::Array(crate::disclosure::files::all_results(&whole));
    prose::contradictions(card, claims_in_prose, &whole, locator, findings);
    metadata::model_index(root, &whole, locator, findings);
}

/// The inspections of `file` (a bare name beside the card), or all of them when the card names
/// none: a card for one file of a directory is judged against that file's tensors only.
fn of_file<'i>(inspections: &'i [Inspection], file: Option<&str>) -> Vec<&'i Inspection> {
    inspections
        .iter()
        .filter(|i| {
            file.is_none_or(|name| {
                i.files
                    .iter()
                    .any(|f| f.path.rsplit(['/', '\\']).next() == Some(name))
            })
        })
        .collect()
}

/// A card listing many files beside a checkpoint: each listed file must be there, and a GGUF
/// the card does not list is said (a reader would take the card to speak for it).
fn listed_files(
    files: &crate::disclosure::files::Files,
    inspections: &[Inspection],
    locator: &Locator<'_>,
    findings: &mut Vec<Finding>,
) {
    for p in &files.problems {
        findings.push(locator.at_key(
            Finding::new(Code::SchemaViolation, p.message.clone()),
            &p.pointer,
        ));
    }
    if inspections.is_empty() {
        return;
    }
    let present: Vec<&str> = inspections
        .iter()
        .flat_map(|i| i.files.first())
        .map(|f| f.path.rsplit(['/', '\\']).next().unwrap_or(&f.path))
        .collect();
    for view in &files.views {
        if of_file(inspections, Some(&view.file)).is_empty() {
            findings.push(locator.at_value(
                Finding::new(
                    Code::ListedFileMissing,
                    format!(
                        "files[{}] describes `{}`, which is not a checkpoint file beside the card \
                         (found: {})",
                        view.index,
                        view.file,
                        if present.is_empty() {
                            "none".to_owned()
                        } else {
                            present.join(", ")
                        }
                    ),
                ),
                &format!("/fidelity/files/{}/file", view.index),
            ));
        }
    }
    for name in present {
        if files.view(name).is_none() && name.to_ascii_lowercase().ends_with(".gguf") {
            findings.push(locator.at_value(
                Finding::new(
                    Code::UnlistedFile,
                    format!(
                        "`{name}` sits beside the card but `fidelity.files` does not list it: its \
                         quality is not disclosed (measure it and add it with `cardproof card \
                         --measurement`, or move it to a repository of its own)"
                    ),
                ),
                "/fidelity/files",
            ));
        }
    }
}

/// pointer -> (key span for mapping values, value span)
type Spans = HashMap<String, (Option<Range<usize>>, Range<usize>)>;

/// Maps JSON pointers in the front matter to places in the file; for one file's view of a card
/// listing many ([`crate::disclosure::files`]), a pointer into the view first becomes the place
/// in the card it was read from, and a finding there names the file.
pub(crate) struct Locator<'c> {
    card: &'c Card,
    spans: std::rc::Rc<Spans>,
    view: Option<&'c crate::disclosure::files::FileView>,
}

impl<'c> Locator<'c> {
    fn new(card: &'c Card) -> Self {
        let mut spans = HashMap::new();
        if let Some(root) = card.metadata() {
            root.walk(
                &mut |pointer: &str, key: Option<&Range<usize>>, node: &Node| {
                    spans.insert(pointer.to_owned(), (key.cloned(), node.span.clone()));
                },
            );
        }
        Locator {
            card,
            spans: std::rc::Rc::new(spans),
            view: None,
        }
    }

    /// The locator for one file's view.
    fn for_view<'v>(&self, view: &'v crate::disclosure::files::FileView) -> Locator<'v>
    where
        'c: 'v,
    {
        Locator {
            card: self.card,
            spans: self.spans.clone(),
            view: Some(view),
        }
    }

    /// The locator for the card's block as it is.
    fn whole(&self) -> Locator<'c> {
        Locator {
            card: self.card,
            spans: self.spans.clone(),
            view: None,
        }
    }

    pub(crate) fn at_span(&self, mut finding: Finding, span: Range<usize>) -> Finding {
        let at = self.card.line_col(span.start);
        finding.line = Some(at.line);
        finding.column = Some(at.column);
        finding.span = Some(span);
        finding
    }

    /// Point at the value at `pointer`, or at its nearest existing ancestor's key.
    pub(crate) fn at_value(&self, finding: Finding, pointer: &str) -> Finding {
        self.place(finding, pointer, false)
    }

    /// Point at the key of the entry at `pointer` (or its nearest existing ancestor).
    pub(crate) fn at_key(&self, finding: Finding, pointer: &str) -> Finding {
        self.place(finding, pointer, true)
    }

    fn place(&self, mut finding: Finding, pointer: &str, prefer_key: bool) -> Finding {
        let pointer = match self.view {
            Some(view) => {
                let moved = view.card_pointer(pointer);
                if moved != pointer {
                    finding.message =
                        format!("files[{}] `{}`: {}", view.index, view.file, finding.message);
                }
                moved
            }
            None => pointer.to_owned(),
        };
        let pointer = pointer.as_str();
        finding.pointer = Some(pointer.to_owned());
        let mut current = pointer;
        let mut exact = true;
        loop {
            if let Some((key, value)) = self.spans.get(current) {
                let span = match key {
                    Some(k) if prefer_key || !exact => k.clone(),
                    _ => value.clone(),
                };
                return self.at_span(finding, span);
            }
            match current.rfind('/') {
                Some(i) => {
                    current = &current[..i];
                    exact = false;
                }
                None => return finding,
            }
        }
    }
}
