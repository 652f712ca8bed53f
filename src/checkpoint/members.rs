//! Which files of a model directory are the checkpoint: one rule for every reader (`hash`,
//! `inspect`, `check`, the runners' loaders, a study's plan, the Hub's remote inspection).
//!
//! A published model directory holds more than weights: the card, git's plumbing, and — once
//! the maintainer follows the publishing recipe — cardproof's own report set beside the weights.
//! None of these may change the checkpoint's digest (a report committed after a measurement
//! would otherwise make the next `verify` find "another checkpoint"), and none may be read as
//! weights (`positions.safetensors` is a safetensors file). So every reader asks [`excluded`].

/// The files a cardproof run writes into an output set (`verify`, `measure`, `study`, `sign`),
/// by name: never part of a checkpoint, wherever they sit in it (a study's arms sit in
/// `arms/<name>/`).
pub const REPORT_SET_FILES: &[&str] = &[
    "report.json",
    "report.dsse.json",
    "report.md",
    "report.html",
    "measurement.json",
    "measurement.dsse.json",
    "positions.safetensors",
    "sweep.json",
    "sweep.html",
    "study.json",
    "study.dsse.json",
    "study.md",
    "study.html",
    "study.incomplete.json",
    "carry.json",
    ".cardproof-set.json",
];

/// Whether `rel` (a path relative to the model directory, `/`-separated) is left out of the
/// checkpoint: the card and `.gitattributes` at the top, anything under a `.git/` or `.cache/`
/// directory, and a report set's files anywhere. Why, for a message, is [`why_excluded`].
pub fn excluded(rel: &str) -> bool {
    why_excluded(rel).is_some()
}

/// [`excluded`], with the reason.
pub fn why_excluded(rel: &str) -> Option<&'static str> {
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let (name, dirs) = parts.split_last()?;
    if dirs.iter().any(|d| *d == ".git" || *d == ".cache") {
        return Some("repository plumbing");
    }
    if dirs.is_empty() && (*name == "README.md" || *name == ".gitattributes") {
        return Some("the card and repository plumbing");
    }
    if is_report_file(name) {
        return Some("a cardproof report set's file");
    }
    None
}

/// Whether a file named `name` is one a cardproof output set holds.
pub fn is_report_file(name: &str) -> bool {
    REPORT_SET_FILES.contains(&name) || is_carried_rows(name)
}

/// A directory name whose whole content is left out (`.git/`, `.cache/`).
pub fn excluded_dir(name: &str) -> bool {
    name == ".git" || name == ".cache"
}

/// `carry-run<N>.safetensors`: an interrupted study's carried rows.
fn is_carried_rows(name: &str) -> bool {
    name.strip_prefix("carry-run")
        .and_then(|r| r.strip_suffix(".safetensors"))
        .is_some_and(|n| !n.is_empty() && n.len() <= 6 && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_plumbing_and_report_sets_are_not_the_checkpoint() {
        for rel in [
            "README.md",
            ".gitattributes",
            ".git/HEAD",
            "sub/.cache/x",
            "report.json",
            "report.dsse.json",
            "positions.safetensors",
            "cardproof/report.html",
            "arms/q4/measurement.json",
            ".cardproof-set.json",
            "arms/q4/carry-run0.safetensors",
        ] {
            assert!(excluded(rel), "{rel}");
        }
        for rel in [
            "model.safetensors",
            "model-00001-of-00002.safetensors",
            "config.json",
            "docs/README.md",
            "model.Q4_K_M.gguf",
            "carry-run.safetensors",
            "positions.safetensors.index.json",
        ] {
            assert!(!excluded(rel), "{rel}");
        }
    }
}
