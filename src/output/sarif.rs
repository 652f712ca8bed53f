//! SARIF 2.1.0 (`--format sarif`, for code scanning): lint's findings, and `check`'s findings
//! about a Hub upload, as one run of cardproof whose rules are every lint finding code (so a
//! result's `ruleIndex` is stable across runs).

use std::path::Path;

use serde::Serialize;

use crate::card::Card;
use crate::findings::{Code, Finding, Severity};
use crate::hub::check::CheckReport;
use crate::lint::LintReport;

/// A SARIF log.
#[derive(Debug, Clone, Serialize)]
pub struct Log {
    #[serde(rename = "$schema")]
    pub schema: &'static str,
    pub version: &'static str,
    pub runs: Vec<Run>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    pub tool: Tool,
    pub column_kind: &'static str,
    pub results: Vec<SarifResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Tool {
    pub driver: Driver,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Driver {
    pub name: &'static str,
    pub version: &'static str,
    pub information_uri: &'static str,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub id: &'static str,
    pub name: &'static str,
    pub short_description: Message,
    pub help_uri: &'static str,
    pub default_configuration: Configuration,
}

#[derive(Debug, Clone, Serialize)]
pub struct Configuration {
    pub level: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub text: String,
}

/// One SARIF result.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SarifResult {
    pub rule_id: String,
    /// The rule's index in the driver's rules (lint findings only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule_index: Option<usize>,
    pub level: &'static str,
    pub message: Message,
    pub locations: Vec<Location>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Location {
    pub physical_location: PhysicalLocation,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalLocation {
    pub artifact_location: ArtifactLocation,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<Region>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ArtifactLocation {
    pub uri: String,
}

/// 1-based lines, columns in Unicode code points (the run's `columnKind`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Region {
    pub start_line: usize,
    pub start_column: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_line: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_column: Option<usize>,
}

/// `lint --format sarif`.
pub fn lint_log(card: &Card, report: &LintReport) -> Log {
    log(report
        .findings
        .iter()
        .map(|f| lint_result(card, f))
        .collect())
}

/// `lint --format sarif` of several cards: one log, one run, every card's results in the order
/// given (each located in its own card).
pub fn lint_logs(cards: &[(&Card, &LintReport)]) -> Log {
    log(cards
        .iter()
        .flat_map(|(card, report)| report.findings.iter().map(|f| lint_result(card, f)))
        .collect())
}

/// `check --format sarif`: the card's findings, then the findings about the repository (located
/// at its README.md).
pub fn check_log(report: &CheckReport) -> Log {
    let mut results: Vec<SarifResult> = Vec::new();
    if let (Some(card), Some(lint)) = (&report.card_text, &report.card) {
        results.extend(lint.findings.iter().map(|f| lint_result(card, f)));
    }
    for f in &report.hub_findings {
        results.push(SarifResult {
            rule_id: f.code.to_owned(),
            rule_index: None,
            level: level(f.severity),
            message: Message {
                text: f.message.clone(),
            },
            locations: vec![Location {
                physical_location: PhysicalLocation {
                    artifact_location: ArtifactLocation {
                        uri: format!("{}/README.md", report.source),
                    },
                    region: None,
                },
            }],
        });
    }
    log(results)
}

/// SARIF's artifact URI for a card: a relative path with forward slashes (what code scanning
/// resolves against the repository root), a `file://` URI for an absolute path, or the `hf:`
/// name as it is.
fn uri(path: &Path) -> String {
    let text = path.to_string_lossy().replace('\\', "/");
    if path.is_absolute() {
        format!("file://{text}")
    } else {
        text.strip_prefix("./").unwrap_or(&text).to_owned()
    }
}

fn level(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

/// One SARIF result for a lint finding, with a region from its span.
fn lint_result(card: &Card, f: &Finding) -> SarifResult {
    let region = match (f.line, f.column) {
        (Some(line), Some(column)) => {
            let end = f
                .span
                .as_ref()
                .map(|span| card.line_col(span.end.min(card.text.len())))
                .filter(|end| (end.line, end.column) > (line, column));
            Some(Region {
                start_line: line,
                start_column: column,
                end_line: end.map(|e| e.line),
                end_column: end.map(|e| e.column),
            })
        }
        _ => None,
    };
    let mut message = f.message.clone();
    if let Some(pointer) = &f.pointer {
        message.push_str(&format!(" (at {pointer})"));
    }
    SarifResult {
        rule_id: f.code.as_str().to_owned(),
        rule_index: Code::ALL.iter().position(|c| *c == f.code),
        level: level(f.severity),
        message: Message { text: message },
        locations: vec![Location {
            physical_location: PhysicalLocation {
                artifact_location: ArtifactLocation {
                    uri: uri(&card.path),
                },
                region,
            },
        }],
    }
}

fn log(results: Vec<SarifResult>) -> Log {
    let rules = Code::ALL
        .iter()
        .map(|c| Rule {
            id: c.as_str(),
            name: c.as_str(),
            short_description: Message {
                text: format!("cardproof lint finding `{}`", c.as_str()),
            },
            help_uri: "https://github.com/cardproof/cardproof#finding-codes",
            default_configuration: Configuration {
                level: level(c.severity()),
            },
        })
        .collect();
    Log {
        schema: "https://json.schemastore.org/sarif-2.1.0.json",
        version: "2.1.0",
        runs: vec![Run {
            tool: Tool {
                driver: Driver {
                    name: "cardproof",
                    version: env!("CARGO_PKG_VERSION"),
                    information_uri: "https://github.com/cardproof/cardproof",
                    rules,
                },
            },
            column_kind: "unicodeCodePoints",
            results,
        }],
    }
}
