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
    if !inspections.is_empty() {
        let fidelity = root
            .and_then(|r| r.get("fidelity"))
            .map(|f| f.value.to_json());
        checkpoint::check(fidelity.as_ref(), inspections, &locator, &mut findings);
    }
    match root.and_then(|r| r.get("fidelity")) {
        Some(fidelity) => {
            let json = fidelity.value.to_json();
            schema::validate(&json, &locator, &mut findings);
            items::check(&json, &locator, &mut findings);
            imprecise_claims(&fidelity.value, &locator, &mut findings);
            prose::contradictions(card, &claims_in_prose, &json, &locator, &mut findings);
            let root = root.expect("fidelity implies a root");
            metadata::hub(root, &json, &locator, &mut findings);
            metadata::model_index(root, &json, &locator, &mut findings);
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

/// Maps JSON pointers in the front matter to places in the file.
pub(crate) struct Locator<'c> {
    card: &'c Card,
    /// pointer -> (key span for mapping values, value span)
    spans: HashMap<String, (Option<Range<usize>>, Range<usize>)>,
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
        Locator { card, spans }
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
