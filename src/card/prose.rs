//! KLD numbers in a card's Markdown prose: a sentence, a table column or a pasted llama.cpp log.
//! Found here, once, for `lint` (which compares them with the fidelity block) and `card`
//! (which finds the section its table goes after).

use std::ops::Range;
use std::sync::LazyLock;

use regex::Regex;

/// One place where the prose states a KLD number.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProseClaim {
    /// Bytes of the KLD term (or the number, in a table row) in the whole text.
    pub span: Range<usize>,
    /// A short quote of the claim, for the message.
    pub excerpt: String,
    /// The number as printed (`0.0123`).
    pub text: String,
    /// Which statistic the number is, as far as its label says.
    pub statistic: Statistic,
}

/// The statistic a prose KLD number states, read from its label (`Mean KLD`, `KLD 99.9%`,
/// `Maximum KLD`); a bare `KLD` is taken as the mean, as every tool that prints one means it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Statistic {
    Mean,
    Median,
    Max,
    Min,
    /// The percentile (`99.9` for `99.9%` or `p99.9`).
    Percentile(f64),
}

impl Statistic {
    /// The vocabulary metric this statistic is (forward KL), when there is one.
    pub(crate) fn metric(self) -> Option<&'static str> {
        match self {
            Statistic::Mean => Some("kld_mean"),
            Statistic::Median => Some("kld_median"),
            Statistic::Max => Some("kld_max"),
            Statistic::Min => None,
            Statistic::Percentile(p) => [
                (50.0, "kld_median"),
                (90.0, "kld_p90"),
                (95.0, "kld_p95"),
                (99.0, "kld_p99"),
                (99.9, "kld_p999"),
            ]
            .into_iter()
            .find(|(q, _)| (q - p).abs() < 1e-9)
            .map(|(_, m)| m),
        }
    }

    fn label(self) -> String {
        match self {
            Statistic::Mean => String::new(),
            Statistic::Median => "median ".into(),
            Statistic::Max => "max ".into(),
            Statistic::Min => "min ".into(),
            Statistic::Percentile(p) => format!("{p}th percentile "),
        }
    }
}

/// A KLD term: `KLD` (also `μKLD`, `𝜇KLD`, `µKLD`: the mean, as table columns write it),
/// `KL divergence`, `kl_div`, `Kullback`, `KL(`, `KL:`, `D_KL(P||Q)`.
static TERM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(?:[\x{03BC}\x{00B5}\x{1D707}]|\b)KLD\b|\bKL[-_ ]?div(?:ergence)?\b|\bKullback|\bD_?\{?KL\}?(?:\s*\([^)\n]*\))?|\bKL\s*\(|\bKL\s*[:=]",
    )
    .expect("valid")
});

/// A fractional number: KLD values are small, so `0.0123`, `.012` or `1.2e-3`, not `512`. The
/// group after it catches a `%`, which makes the number a percentile label (`99.9%`).
static NUMBER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:^|[^\w.])(\d*\.\d+(?:[eE][-+]?\d+)?|\d+[eE]-\d+)(\s*%)?").expect("valid")
});

/// A percentile label: `99.9%`, `99%`, `p99.9`, `P99`.
static PERCENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)(?:^|[^\w.])(?:(\d+(?:\.\d+)?)\s*%|p(\d+(?:\.\d+)?)\b)").expect("valid")
});

/// What a label says about the statistic: a percentile (`99.9%`, `p99`), else a median, maximum
/// or minimum, else the mean.
fn statistic(label: &str) -> Statistic {
    for c in PERCENT.captures_iter(label) {
        // `95% CI`, `95% confidence`, `95% interval` name an interval's level, not a percentile.
        let after = label[c.get(0).map_or(0, |m| m.end())..]
            .trim_start_matches([' ', '('])
            .to_lowercase();
        if ["ci", "conf", "interval"]
            .iter()
            .any(|w| after.starts_with(w))
        {
            continue;
        }
        if let Some(p) = c.get(1).or(c.get(2)).and_then(|m| m.as_str().parse().ok()) {
            return Statistic::Percentile(p);
        }
    }
    let lower = label.to_lowercase();
    if lower.contains("median") {
        Statistic::Median
    } else if lower.contains("max") {
        Statistic::Max
    } else if lower.contains("min") {
        Statistic::Min
    } else {
        Statistic::Mean
    }
}

/// The first number in `text` that is a value, not a percentile label.
fn value(text: &str) -> Option<regex::Match<'_>> {
    NUMBER
        .captures_iter(text)
        .find(|c| c.get(2).is_none())
        .and_then(|c| c.get(1))
}

pub(crate) fn kld_claims(text: &str, body: Range<usize>) -> Vec<ProseClaim> {
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
            // A header (or row) naming KLD: numbers in that column of the rows below are claims,
            // one per column that names it.
            let mut next = i + 1;
            let mut seen = Vec::new();
            for term in TERM.find_iter(line) {
                let column = cell_index(line, term.start());
                if seen.contains(&column) {
                    continue;
                }
                seen.push(column);
                let header = cell(line, column).map_or("", |(_, c)| c);
                let mut j = i + 1;
                while j < lines.len() && is_table_row(lines[j].1) {
                    let (row_start, row) = lines[j];
                    if let Some((cell_start, cell)) = cell(row, column)
                        && let Some(m) = value(cell)
                    {
                        let stat = statistic(header);
                        claims.push(ProseClaim {
                            span: row_start + cell_start + m.start()
                                ..row_start + cell_start + m.end(),
                            excerpt: format!("{}{} {}", stat.label(), header.trim(), m.as_str()),
                            text: m.as_str().to_owned(),
                            statistic: stat,
                        });
                        break;
                    }
                    j += 1;
                }
                next = next.max(j);
            }
            let rest = &line[term.end()..];
            if let Some(m) = value(rest) {
                let stat = statistic(&line[term.start()..term.end() + m.start()]);
                claims.push(claim_at(start, line, term.range(), m.as_str(), stat));
            }
            i = next;
            continue;
        }
        if let Some(m) = value(line) {
            // The label is what comes before the number: `KLD 99.9%: 0.563`, `Maximum KLD: 12.3`.
            let stat = statistic(&line[..m.start()]);
            claims.push(claim_at(start, line, term.range(), m.as_str(), stat));
        }
        i += 1;
    }
    claims
}

/// Whether `text` names KLD (a heading such as `## KL divergence` or `### μKLD results`).
pub(crate) fn names_kld(text: &str) -> bool {
    TERM.is_match(text)
}

fn claim_at(
    line_start: usize,
    line: &str,
    term: Range<usize>,
    number: &str,
    statistic: Statistic,
) -> ProseClaim {
    let excerpt = format!(
        "{}{} {number}",
        statistic.label(),
        line[term.clone()].trim()
    );
    ProseClaim {
        span: line_start + term.start..line_start + term.end,
        excerpt,
        text: number.to_owned(),
        statistic,
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

    fn parsed(text: &str) -> Vec<(String, Statistic)> {
        kld_claims(text, 0..text.len())
            .into_iter()
            .map(|c| (c.text, c.statistic))
            .collect()
    }

    #[test]
    fn reads_mu_columns_dkl_and_kl_div() {
        for mu in ["\u{03BC}", "\u{1D707}", "\u{00B5}"] {
            let table =
                format!("| quant | {mu}KLD | PPL |\n|---|---|---|\n| Q4 | 0.0312 | 6.1 |\n");
            assert_eq!(
                parsed(&table),
                [("0.0312".to_owned(), Statistic::Mean)],
                "{mu}"
            );
        }
        assert_eq!(
            parsed("We measured D_KL(P||Q) = 0.0123 on wikitext.\n"),
            [("0.0123".to_owned(), Statistic::Mean)]
        );
        assert_eq!(
            parsed("eval: kl_div=0.0123, ppl=6.1\n"),
            [("0.0123".to_owned(), Statistic::Mean)]
        );
    }

    #[test]
    fn a_percent_is_the_percentile_label_not_the_value() {
        assert_eq!(
            parsed("KLD 99.9%: 0.563\n"),
            [("0.563".to_owned(), Statistic::Percentile(99.9))]
        );
        assert_eq!(
            parsed("99.9%   KLD:   0.563112\nMaximum KLD:  12.5\nMedian  KLD:   0.0011\n"),
            [
                ("0.563112".to_owned(), Statistic::Percentile(99.9)),
                ("12.5".to_owned(), Statistic::Max),
                ("0.0011".to_owned(), Statistic::Median),
            ]
        );
        assert_eq!(
            parsed("| quant | 99.9% KLD | Mean KLD |\n|---|---|---|\n| Q4 | 0.563 | 0.0312 |\n"),
            [
                ("0.563".to_owned(), Statistic::Percentile(99.9)),
                ("0.0312".to_owned(), Statistic::Mean),
            ]
        );
        assert_eq!(Statistic::Percentile(99.9).metric(), Some("kld_p999"));
        assert_eq!(statistic("mean KLD (95% CI)"), Statistic::Mean);
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
