//! Any bytes as a README: card parsing and lint must never panic, and must either refuse the input
//! with a placed error or produce findings whose lines exist in the file.
#![no_main]

use cardproof::card::Card;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(card) = Card::from_bytes("README.md".into(), data.to_vec()) else { return };
    let report = cardproof::lint::lint(&card);
    let lines = card.lines.line_count();
    for finding in &report.findings {
        if let Some(line) = finding.line {
            assert!(line >= 1 && line <= lines, "finding points past the end: {finding:?}");
        }
    }
});
