//! `lint`: a card (local, or `hf:` with only README.md fetched), against the checkpoint beside it
//! when the path is a model directory.

use cardproof::card::Card;
use cardproof::hub::snapshot::Select;
use cardproof::lint::LintReport;

use super::{Outcome, hub_client, materialize};
use crate::config::LintConfig;
use crate::printer::Printer;

/// The card linted and its findings.
pub struct Linted {
    pub card: Card,
    pub report: LintReport,
    /// Findings left out by the rule selection.
    pub ignored: usize,
}

/// Every path linted, in the order given; findings (exit 1) when any card has an error.
pub fn run(config: &LintConfig, printer: &Printer) -> super::Result<Vec<Linted>> {
    let mut out = Vec::with_capacity(config.paths.len());
    for path in &config.paths {
        if config.model_cards && !is_model_card(path) {
            printer.note(&format!(
                "{}: not a model card (no front matter, no config.json or weights beside it): skipped",
                path.display()
            ));
            continue;
        }
        let mut linted = lint_one(path, printer)?;
        linted.ignored = config.selection.apply(&mut linted.report);
        out.push(linted);
    }
    let errors = out.iter().any(|l| l.report.errors() > 0);
    Ok(Outcome::findings_if(out, errors))
}

/// A local card (a Markdown file, or a directory's README.md) is a model card when it has YAML
/// front matter or its directory holds a config.json or weights (a model repository's
/// README.md); an `hf:` source, or a path with no card to read, is linted as given (and its
/// error reported).
fn is_model_card(path: &std::path::Path) -> bool {
    let (file, dir) = if path.is_dir() {
        (path.join("README.md"), path.to_owned())
    } else {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => std::path::PathBuf::from("."),
        };
        (path.to_owned(), dir)
    };
    if !file.is_file() {
        return true;
    }
    // The first three bytes say it (a README of any size is not read whole here).
    let front_matter = std::fs::File::open(&file).is_ok_and(|f| {
        let mut head = Vec::with_capacity(3);
        std::io::Read::read_to_end(&mut std::io::Read::take(f, 3), &mut head).is_ok()
            && head == b"---"
    });
    let dir = dir.as_path();
    front_matter || dir.join("config.json").is_file() || cardproof::checkpoint::has_checkpoint(dir)
}

fn lint_one(path: &std::path::Path, printer: &Printer) -> cardproof::Result<Linted> {
    let card = match super::hub_source(printer, path)? {
        Some(source) => {
            let snapshot = materialize(
                printer,
                &hub_client(),
                &source,
                Select::Only(&["README.md"]),
            )?;
            snapshot.read_card()?
        }
        None => Card::open(path)?,
    };
    let report = cardproof::lint::lint_at(&card, path)?;
    Ok(Linted {
        card,
        report,
        ignored: 0,
    })
}
