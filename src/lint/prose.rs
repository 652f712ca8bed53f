//! KLD numbers in a card's Markdown prose: a sentence, a table column or a pasted llama.cpp log.

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

/// One place where the prose states a KLD number.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ProseClaim {
    /// Bytes of the KLD term (or the number, in a table row) in the whole text.
    pub span: Range<usize>,
    /// A short quote of the claim, for the message.
    pub excerpt: String,
}

static TERM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\bKLD\b|\bKL[- ]?div(?:ergence)?\b|\bKullback|\bKL\s*\(|\bKL\s*[:=]")
        .expect("valid")
});

/// A fractional number: KLD values are small, so `0.0123`, `.012` or `1.2e-3`, not `512`.
static NUMBER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:^|[^\w.])(\d*\.\d+(?:[eE][-+]?\d+)?|\d+[eE]-\d+)").expect("valid")
});

pub(super) fn kld_claims(text: &str, body: Range<usize>) -> Vec<ProseClaim> {
    let mut claims = Vec::new();
    let lines: Vec<(usize, &str)> = line_spans(&text[body.clone()])
        .map(|(start, line)| (body.start + start, line))
        .collect();
    let mut i = 0;
    while i < lines.len() {
        let (start, line) = lines[i];
        let Some(term) = TERM.find(line) else {
            i += 1;
            continue;
        };
        if is_table_row(line) {
            // A header (or row) naming KLD: numbers in that column of the rows below are claims.
            let column = cell_index(line, term.start());
            let mut j = i + 1;
            while j < lines.len() && is_table_row(lines[j].1) {
                let (row_start, row) = lines[j];
                if let Some((cell_start, cell)) = cell(row, column)
                    && let Some(m) = NUMBER.captures(cell).and_then(|c| c.get(1))
                {
                    claims.push(ProseClaim {
                        span: row_start + cell_start + m.start()..row_start + cell_start + m.end(),
                        excerpt: format!("{} {}", term.as_str().trim(), m.as_str()),
                    });
                    break;
                }
                j += 1;
            }
            if let Some(m) = NUMBER.captures(&line[term.end()..]).and_then(|c| c.get(1)) {
                claims.push(claim_at(start, line, term.range(), m.as_str()));
            }
            i = j.max(i + 1);
            continue;
        }
        if let Some(m) = NUMBER.captures(line).and_then(|c| c.get(1)) {
            claims.push(claim_at(start, line, term.range(), m.as_str()));
        }
        i += 1;
    }
    claims
}

fn claim_at(line_start: usize, line: &str, term: Range<usize>, number: &str) -> ProseClaim {
    let excerpt = format!("{} {number}", line[term.clone()].trim());
    ProseClaim {
        span: line_start + term.start..line_start + term.end,
        excerpt,
    }
}

fn line_spans(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut offset = 0;
    text.split_inclusive('\n').map(move |raw| {
        let start = offset;
        offset += raw.len();
        (start, raw.trim_end_matches(['\n', '\r']))
    })
}

fn is_table_row(line: &str) -> bool {
    line.trim_start().starts_with('|')
}

/// Which `|`-separated cell a byte offset falls in.
fn cell_index(line: &str, offset: usize) -> usize {
    line[..offset].matches('|').count()
}

fn cell(line: &str, index: usize) -> Option<(usize, &str)> {
    let mut start = 0;
    for (i, part) in line.split('|').enumerate() {
        if i == index {
            return Some((start, part));
        }
        start += part.len() + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(text: &str) -> Vec<String> {
        kld_claims(text, 0..text.len())
            .into_iter()
            .map(|c| c.excerpt)
            .collect()
    }

    #[test]
    fn finds_numbers_in_sentences_tables_and_logs() {
        assert_eq!(claims("Our KLD is 0.0123 on wikitext.\n"), ["KLD 0.0123"]);
        assert_eq!(
            claims("| quant | KLD | PPL |\n|---|---|---|\n| Q4_K_M | 0.0312 | 6.1 |\n"),
            ["KLD 0.0312"]
        );
        assert_eq!(
            claims("```\nMean    KLD:   0.001355 ±   0.000010\n```\n"),
            ["KLD 0.001355"]
        );
        assert_eq!(claims("KL divergence: 1.2e-3\n"), ["KL divergence 1.2e-3"]);
    }

    #[test]
    fn ignores_mentions_without_numbers() {
        assert!(
            claims("We plan to report KLD against the BF16 model over 512 tokens.\n").is_empty()
        );
        assert!(claims("| model | KLD |\n|---|---|\n| Q4_K_M | n/a |\n").is_empty());
        assert!(claims("Qwen3-8B-Q4_K_M, 4.5 bits per weight.\n").is_empty());
    }
}
