//! `cardproof card`: a `measurement.json` written into the card on disk, from reading the
//! measurement to reading back the file written. [`write_card`](super::write_card) computes the
//! text; this is the part around it that touches files.

use std::path::{Path, PathBuf};

use super::{CalibrationInput, CardInputs, write_card};
use crate::card::Card;
use crate::error::{Error, Result};
use crate::rerun::Measurement;

/// What `cardproof card` writes, and where.
#[derive(Debug, Clone, Default)]
pub struct UpdateRequest {
    /// The `measurement.json` (`cardproof measure`); with `study`, empty: the arm's.
    pub measurement: PathBuf,
    /// A study's `study.json` and one of its arms: the arm's measurement is written, with the
    /// study's comparison of the arms in the fidelity section.
    pub study: Option<(PathBuf, String)>,
    /// A `llama-perplexity --kl-divergence` log, and its base file: llama.cpp's printed
    /// numbers written as the claims ([`crate::rerun::from_log`]); needs `into`.
    pub from_llamacpp: Option<(PathBuf, Option<PathBuf>)>,
    /// The card to write; `None`: README.md beside the measured candidate
    /// ([`default_card_path`]).
    pub into: Option<PathBuf>,
    /// Fields a local measurement cannot know (see [`CardInputs`]).
    pub reference_repo: Option<String>,
    pub reference_revision: Option<String>,
    pub candidate_repo: Option<String>,
    pub candidate_revision: Option<String>,
    pub quantization: Option<String>,
    pub calibration: Option<CalibrationInput>,
}

/// The card written.
#[derive(Debug, Clone)]
pub struct CardUpdate {
    /// The card's path.
    pub path: PathBuf,
    /// There was no card before.
    pub created: bool,
    /// SHA-256 of the file as written (lowercase hex).
    pub sha256: String,
    /// What the writer left undone or wants looked at ([`super::WrittenCard::warnings`]).
    pub warnings: Vec<String>,
    /// The card read back from disk (for linting what was written).
    pub card: Card,
}

/// Read the measurement, write it into the card (creating the card when there is none) whole and
/// atomically, and read the file back.
pub fn update_card(request: &UpdateRequest) -> Result<CardUpdate> {
    let (measurement_path, comparison) = match &request.study {
        Some((study, arm)) => {
            let (path, table) = super::comparison::card_comparison(study, arm)?;
            (path, Some(table))
        }
        None => (request.measurement.clone(), None),
    };
    let request = &UpdateRequest {
        measurement: measurement_path,
        ..request.clone()
    };
    let mut imported_warnings = Vec::new();
    let (measurement, path) = match &request.from_llamacpp {
        Some((log, base)) => {
            let into = request.into.clone().ok_or_else(|| {
                Error::usage(
                    log,
                    "--from-llamacpp needs --into CARD, beside the GGUF it measured",
                )
            })?;
            let dir = match into.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
                _ => PathBuf::from("."),
            };
            let threads = std::thread::available_parallelism().map_or(1, usize::from);
            let (m, warnings) =
                crate::rerun::from_log::measurement_from_log(log, base.as_deref(), &dir, threads)?;
            imported_warnings = warnings;
            (m, into)
        }
        None => {
            // Read capped (a regular file) and into its type, so an error names the file given
            // and the field.
            let measurement = Measurement::read(&request.measurement)?;
            let path = match &request.into {
                Some(p) => p.clone(),
                None => default_card_path(&request.measurement, &measurement)?,
            };
            (measurement, path)
        }
    };
    let (measurement, path) = {
        let (mut measurement, path) = (measurement, path);
        imported_warnings.extend(eval_source_beside(&mut measurement, &path));
        (measurement, path)
    };
    let existing = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(&path, e)),
    };
    let written = write_card(
        existing.as_deref(),
        &path,
        &CardInputs {
            measurement,
            reference_repo: request.reference_repo.clone(),
            reference_revision: request.reference_revision.clone(),
            candidate_repo: request.candidate_repo.clone(),
            candidate_revision: request.candidate_revision.clone(),
            quantization: request.quantization.clone(),
            calibration: request.calibration.clone(),
            comparison,
        },
    )?;
    crate::files::write_atomically(&path, written.text.as_bytes())?;
    let card = Card::open(&path)?;
    let sha256 = crate::digest::sha256_hex(card.text.as_bytes());
    let mut warnings = imported_warnings;
    warnings.extend(written.warnings);
    Ok(CardUpdate {
        path,
        created: existing.is_none(),
        sha256,
        warnings,
        card,
    })
}

/// `eval.text.source` as `verify` will look for it: the measured file's path relative to the
/// card's directory when it lies inside it (verify reads only files there). Else the name stays
/// and a warning says how `verify` will find the text (a card naming a bare file name that
/// `verify` then could not find was a reported friction).
fn eval_source_beside(measurement: &mut Measurement, card: &Path) -> Option<String> {
    let text = measurement.eval.text_path.clone()?;
    let dir = match card.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let inside = match (std::fs::canonicalize(&text), std::fs::canonicalize(dir)) {
        (Ok(t), Ok(d)) => t.strip_prefix(&d).ok().map(|r| {
            r.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/")
        }),
        _ => None,
    };
    match inside {
        Some(rel) => {
            measurement.fidelity.eval.text.source = rel;
            None
        }
        None => Some(format!(
            "the eval text {text} is not in the card's directory {}: `verify` reads only files \
             there, so copy it beside the card as `{}` (sha256 {}) or pass `verify --eval-text`",
            dir.display(),
            measurement.fidelity.eval.text.source,
            measurement.eval.text_sha256
        )),
    }
}

/// The card a measurement goes into when none is named: README.md in the candidate's directory
/// (beside it, for a single file). A candidate measured from the Hub was read from the Hugging
/// Face cache, which is never written to (its snapshot would then differ from the Hub): that is
/// an error asking for the card of a local clone.
pub fn default_card_path(measurement_path: &Path, measurement: &Measurement) -> Result<PathBuf> {
    if let Some(pin) = &measurement.candidate.hub {
        let repo = &pin.repo;
        return Err(Error::usage(
            measurement_path,
            format!(
                "candidate.hub: the candidate was measured from hf:{repo}; pass --into with the \
                 card of your local clone (cardproof never writes into the Hugging Face cache)"
            ),
        ));
    }
    let candidate = Some(measurement.candidate.path.as_str())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            Error::usage(
                measurement_path,
                "candidate.path: empty; pass --into README.md",
            )
        })?;
    let c = Path::new(candidate);
    let dir = if c.is_file() {
        c.parent().unwrap_or(c)
    } else {
        c
    };
    Ok(dir.join("README.md"))
}
