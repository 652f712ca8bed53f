//! Parsing the statistics block llama.cpp prints after `--kl-divergence`, in any of its versions.
//!
//! Versions and damage handled:
//! - current mainline and ik_llama.cpp (three sections, 90/95/0.1 % KLD lines);
//! - before llama.cpp PR #15999 (and ik_llama.cpp #817): the 99 % KLD line printed twice (both
//!   really the 99th percentile) and no 90 % line; the duplicate is recorded, 90 % left absent;
//! - before PR #16321: no 95 % and no 0.1 % KLD lines;
//! - the early 2024 block (`===== KL-divergence statistics`, `Average:`, `KLD_99 :` ...);
//! - `_`, `?`, `�` or mojibake for `±` and `Δ`, `+/-` for `±`, CRLF, ANSI colours, log prefixes;
//! - a block whose last lines are missing (llama.cpp can exit 0 without flushing them): fields
//!   absent and `truncated` set. The block's last line is only kept if every number on it has
//!   the full printed precision, so a number cut short is never read as a smaller one.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

/// What a printed block states; percentages are fractions (`94.261 %` is 0.94261), converted
/// by moving the decimal point in the text, so the fraction is the double nearest the printed
/// decimal. Fields are absent when not printed.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PrintedStats {
    pub ppl_q: Option<(f64, f64)>,
    pub ppl_base: Option<(f64, f64)>,
    /// `Cor(ln(PPL(Q)), ln(PPL(base)))`, a fraction.
    pub cor: Option<f64>,
    pub ln_ratio: Option<(f64, f64)>,
    pub ratio: Option<(f64, f64)>,
    pub diff: Option<(f64, f64)>,
    pub kld_mean: Option<(f64, f64)>,
    pub kld_max: Option<f64>,
    pub kld_p999: Option<f64>,
    pub kld_p99: Option<f64>,
    pub kld_p95: Option<f64>,
    pub kld_p90: Option<f64>,
    pub kld_median: Option<f64>,
    pub kld_p10: Option<f64>,
    pub kld_p5: Option<f64>,
    pub kld_p1: Option<f64>,
    pub kld_p01: Option<f64>,
    pub kld_min: Option<f64>,
    /// Mean Δp of the true next token, a fraction.
    pub dp_mean: Option<(f64, f64)>,
    pub dp_max: Option<f64>,
    pub dp_p999: Option<f64>,
    pub dp_p99: Option<f64>,
    pub dp_p95: Option<f64>,
    pub dp_p90: Option<f64>,
    pub dp_p75: Option<f64>,
    pub dp_median: Option<f64>,
    pub dp_p25: Option<f64>,
    pub dp_p10: Option<f64>,
    pub dp_p5: Option<f64>,
    pub dp_p1: Option<f64>,
    pub dp_p01: Option<f64>,
    pub dp_min: Option<f64>,
    /// RMS of Δp, a fraction.
    pub rms_dp: Option<(f64, f64)>,
    /// `Same top p`, a fraction.
    pub same_top: Option<(f64, f64)>,
    /// Two `99.0%   KLD` lines: printed by llama.cpp before its PR #15999 (no 90 % line then).
    pub duplicate_p99: bool,
    /// The early 2024 format (`===== KL-divergence statistics`, `Average:`, `KLD_99 :`).
    pub legacy: bool,
    /// The block started but its last line (`Same top p`, or `KLD_10` in the legacy format) is
    /// missing: the output was cut.
    pub truncated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    PplQ,
    PplBase,
    Cor,
    LnRatio,
    Ratio,
    Diff,
    KldMean,
    KldMax,
    KldP999,
    KldP99,
    KldP95,
    KldP90,
    KldMedian,
    KldP10,
    KldP5,
    KldP1,
    KldP01,
    KldMin,
    DpMean,
    DpMax,
    DpP999,
    DpP99,
    DpP95,
    DpP90,
    DpP75,
    DpMedian,
    DpP25,
    DpP10,
    DpP5,
    DpP1,
    DpP01,
    DpMin,
    RmsDp,
    SameTop,
}

const N_FIELDS: usize = Field::SameTop as usize + 1;

/// Each [`Field`]'s name, in declaration order: the [`PrintedStats`] field it fills.
const NAMES: [&str; N_FIELDS] = [
    "ppl_q",
    "ppl_base",
    "cor",
    "ln_ratio",
    "ratio",
    "diff",
    "kld_mean",
    "kld_max",
    "kld_p999",
    "kld_p99",
    "kld_p95",
    "kld_p90",
    "kld_median",
    "kld_p10",
    "kld_p5",
    "kld_p1",
    "kld_p01",
    "kld_min",
    "dp_mean",
    "dp_max",
    "dp_p999",
    "dp_p99",
    "dp_p95",
    "dp_p90",
    "dp_p75",
    "dp_median",
    "dp_p25",
    "dp_p10",
    "dp_p5",
    "dp_p1",
    "dp_p01",
    "dp_min",
    "rms_dp",
    "same_top",
];

/// Where a block's statistics were printed: the 1-based line of `text` each was read from, so
/// a value out of its range can be named at its line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrintedLines {
    lines: Vec<(&'static str, usize)>,
}

impl PrintedLines {
    /// The line `field` (a [`PrintedStats`] field's name: `kld_mean`, `same_top`) was read
    /// from, when it was.
    pub fn of(&self, field: &str) -> Option<usize> {
        self.lines
            .iter()
            .find(|(name, _)| *name == field)
            .map(|&(_, line)| line)
    }
}

/// How a line prints its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `value ± uncertainty`.
    Pair,
    /// `value`.
    Single,
}

struct Spec {
    field: Field,
    shape: Shape,
    /// Printed as a percentage (converted to a fraction, and a `%` ends the line).
    percent: bool,
    /// Decimals llama.cpp prints, checked on a block's last line only.
    decimals: usize,
    /// Only inside a legacy block (its labels are too generic elsewhere).
    legacy: bool,
    label: &'static str,
}

const fn spec(
    field: Field,
    shape: Shape,
    percent: bool,
    decimals: usize,
    label: &'static str,
) -> Spec {
    Spec {
        field,
        shape,
        percent,
        decimals,
        legacy: false,
        label,
    }
}

const fn legacy(field: Field, shape: Shape, label: &'static str) -> Spec {
    Spec {
        field,
        shape,
        percent: false,
        decimals: 6,
        legacy: true,
        label,
    }
}

/// `Δ` as printed, or as encoding trouble leaves it.
const DELTA: &str = r"(?:Δ|Î”|Ξ”|_+|\?+|�+|Delta ?)";

/// Label patterns (regex, `{D}` standing for [`DELTA`]); `\b` keeps ` 5.0%` from matching inside
/// `95.0%`.
const SPECS: &[Spec] = {
    use Field::*;
    use Shape::*;
    &[
        spec(PplQ, Pair, false, 6, r"Mean PPL\(Q\)\s*:"),
        spec(PplBase, Pair, false, 6, r"Mean PPL\(base\)\s*:"),
        spec(
            Cor,
            Single,
            true,
            2,
            r"Cor\(ln\(PPL\(Q\)\),\s*ln\(PPL\(base\)\)\)\s*:",
        ),
        spec(
            LnRatio,
            Pair,
            false,
            6,
            r"Mean ln\(PPL\(Q\)/PPL\(base\)\)\s*:",
        ),
        spec(Ratio, Pair, false, 6, r"Mean PPL\(Q\)/PPL\(base\)\s*:"),
        spec(Diff, Pair, false, 6, r"Mean PPL\(Q\)-PPL\(base\)\s*:"),
        spec(KldMean, Pair, false, 6, r"Mean\s+KLD\s*:"),
        spec(KldMax, Single, false, 6, r"Maximum\s+KLD\s*:"),
        spec(KldP999, Single, false, 6, r"\b99\.9%\s*KLD\s*:"),
        spec(KldP99, Single, false, 6, r"\b99\.0%\s*KLD\s*:"),
        spec(KldP95, Single, false, 6, r"\b95\.0%\s*KLD\s*:"),
        spec(KldP90, Single, false, 6, r"\b90\.0%\s*KLD\s*:"),
        spec(KldMedian, Single, false, 6, r"Median\s+KLD\s*:"),
        spec(KldP10, Single, false, 6, r"\b10\.0%\s*KLD\s*:"),
        spec(KldP5, Single, false, 6, r"\b5\.0%\s*KLD\s*:"),
        spec(KldP1, Single, false, 6, r"\b1\.0%\s*KLD\s*:"),
        spec(KldP01, Single, false, 6, r"\b0\.1%\s*KLD\s*:"),
        spec(KldMin, Single, false, 6, r"Minimum\s+KLD\s*:"),
        spec(DpMean, Pair, true, 3, r"Mean\s+{D}p\s*:"),
        spec(DpMax, Single, true, 3, r"Maximum\s+{D}p\s*:"),
        spec(DpP999, Single, true, 3, r"\b99\.9%\s*{D}p\s*:"),
        spec(DpP99, Single, true, 3, r"\b99\.0%\s*{D}p\s*:"),
        spec(DpP95, Single, true, 3, r"\b95\.0%\s*{D}p\s*:"),
        spec(DpP90, Single, true, 3, r"\b90\.0%\s*{D}p\s*:"),
        spec(DpP75, Single, true, 3, r"\b75\.0%\s*{D}p\s*:"),
        spec(DpMedian, Single, true, 3, r"Median\s+{D}p\s*:"),
        spec(DpP25, Single, true, 3, r"\b25\.0%\s*{D}p\s*:"),
        spec(DpP10, Single, true, 3, r"\b10\.0%\s*{D}p\s*:"),
        spec(DpP5, Single, true, 3, r"\b5\.0%\s*{D}p\s*:"),
        spec(DpP1, Single, true, 3, r"\b1\.0%\s*{D}p\s*:"),
        spec(DpP01, Single, true, 3, r"\b0\.1%\s*{D}p\s*:"),
        spec(DpMin, Single, true, 3, r"Minimum\s+{D}p\s*:"),
        spec(RmsDp, Pair, true, 3, r"RMS\s+{D}p\s*:"),
        spec(SameTop, Pair, true, 3, r"Same top p\s*:"),
        legacy(KldMean, Pair, r"^\s*Average\s*:"),
        legacy(KldMedian, Single, r"^\s*Median\s*:"),
        legacy(KldMax, Single, r"^\s*Maximum\s*:"),
        legacy(KldP99, Single, r"\bKLD_99\s*:"),
        legacy(KldP95, Single, r"\bKLD_95\s*:"),
        legacy(KldP90, Single, r"\bKLD_90\s*:"),
        legacy(KldMin, Single, r"^\s*Minimum\s*:"),
        legacy(KldP1, Single, r"\bKLD_01\s*:"),
        legacy(KldP5, Single, r"\bKLD_05\s*:"),
        legacy(KldP10, Single, r"\bKLD_10\s*:"),
    ]
};

/// A printf number: `%f` output, plus `nan`/`-nan`/`inf` and exponents for good measure.
const NUM: &str =
    r"[-+]?(?:(?i:nan|inf)|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?)";
/// `±` as printed, spelled out, or mangled by an encoding.
const PM: &str = r"(?:±|\+/-|\+-|Â±|Ã‚Â±|_+|\?+|�+)";

struct Compiled {
    regex: Regex,
    spec: &'static Spec,
}

/// Every line pattern, and all of them as one set: a line is scanned once to find the patterns
/// that can match, instead of once per pattern.
struct Patterns {
    set: RegexSet,
    each: Vec<Compiled>,
}

static PATTERNS: LazyLock<Patterns> = LazyLock::new(|| {
    let each: Vec<Compiled> = SPECS
        .iter()
        .map(|spec| {
            // An ASCII `\b`: a Unicode word boundary makes the regex engines fall back to their
            // slowest mode on every line holding `Δ` or `±`, which is every line here.
            let label = spec.label.replace("{D}", DELTA).replace(r"\b", r"(?-u:\b)");
            // A number ends at a space, a `%`, or the end of the line, so `0.02llama_perf` (a cut
            // line run into the next output) is not read as 0.02.
            let values = match spec.shape {
                Shape::Pair => format!(r"\s*({NUM})\s*{PM}\s*({NUM})(\s*%)?(?:\s|$)"),
                Shape::Single => format!(r"\s*({NUM})()(\s*%)?(?:\s|$)"),
            };
            let regex = Regex::new(&format!("{label}{values}"))
                .unwrap_or_else(|e| panic!("bad built-in pattern for {:?}: {e}", spec.field));
            Compiled { regex, spec }
        })
        .collect();
    let set = RegexSet::new(each.iter().map(|c| c.regex.as_str()))
        .unwrap_or_else(|e| panic!("bad built-in pattern set: {e}"));
    Patterns { set, each }
});

static ANSI: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").unwrap_or_else(|e| panic!("bad ANSI pattern: {e}"))
});

/// One parsed line: the field, its values, and whether it carries full printed precision.
#[derive(Debug, Clone, Copy)]
struct Parsed {
    field: Field,
    value: f64,
    unc: Option<f64>,
    full_precision: bool,
}

struct Block {
    values: [Option<(f64, Option<f64>)>; N_FIELDS],
    /// The 1-based line of each value.
    lines: [usize; N_FIELDS],
    last: Option<Parsed>,
    started: bool,
    legacy: bool,
    duplicate_p99: bool,
}

impl Default for Block {
    fn default() -> Self {
        Block {
            values: [None; N_FIELDS],
            lines: [0; N_FIELDS],
            last: None,
            started: false,
            legacy: false,
            duplicate_p99: false,
        }
    }
}

impl Block {
    fn into_stats(mut self) -> (PrintedStats, PrintedLines) {
        // The block's last line may be where the output was cut: keep it only at full precision.
        if let Some(last) = self.last
            && !last.full_precision
        {
            self.values[last.field as usize] = None;
        }
        let lines = PrintedLines {
            lines: NAMES
                .iter()
                .zip(self.values.iter().zip(self.lines))
                .filter(|(_, (v, _))| v.is_some())
                .map(|(&name, (_, line))| (name, line))
                .collect(),
        };
        (self.stats(), lines)
    }

    fn stats(&self) -> PrintedStats {
        let v = &self.values;
        let single = |f: Field| v[f as usize].map(|(x, _)| x);
        let pair = |f: Field| v[f as usize].and_then(|(x, u)| u.map(|u| (x, u)));
        let end = if self.legacy {
            Field::KldP10
        } else {
            Field::SameTop
        };
        use Field::*;
        PrintedStats {
            ppl_q: pair(PplQ),
            ppl_base: pair(PplBase),
            cor: single(Cor),
            ln_ratio: pair(LnRatio),
            ratio: pair(Ratio),
            diff: pair(Diff),
            kld_mean: pair(KldMean),
            kld_max: single(KldMax),
            kld_p999: single(KldP999),
            kld_p99: single(KldP99),
            kld_p95: single(KldP95),
            kld_p90: single(KldP90),
            kld_median: single(KldMedian),
            kld_p10: single(KldP10),
            kld_p5: single(KldP5),
            kld_p1: single(KldP1),
            kld_p01: single(KldP01),
            kld_min: single(KldMin),
            dp_mean: pair(DpMean),
            dp_max: single(DpMax),
            dp_p999: single(DpP999),
            dp_p99: single(DpP99),
            dp_p95: single(DpP95),
            dp_p90: single(DpP90),
            dp_p75: single(DpP75),
            dp_median: single(DpMedian),
            dp_p25: single(DpP25),
            dp_p10: single(DpP10),
            dp_p5: single(DpP5),
            dp_p1: single(DpP1),
            dp_p01: single(DpP01),
            dp_min: single(DpMin),
            rms_dp: pair(RmsDp),
            same_top: pair(SameTop),
            duplicate_p99: self.duplicate_p99,
            legacy: self.legacy,
            truncated: self.started && v[end as usize].is_none(),
        }
    }
}

/// The first statistics block in `text` (a log, a card, a pasted snippet); never fails, and
/// gives empty stats when there is none. See [`parse_printed_blocks`] for several.
pub fn parse_printed(text: &str) -> PrintedStats {
    parse_printed_located(text).0
}

/// [`parse_printed`], with the line each statistic was read from.
pub fn parse_printed_located(text: &str) -> (PrintedStats, PrintedLines) {
    blocks(text).into_iter().next().unwrap_or_default()
}

/// Every statistics block in `text`, in order. A block starts at a `Perplexity statistics` (or
/// legacy `KL-divergence statistics`) header, or when a statistic already seen appears again.
pub fn parse_printed_blocks(text: &str) -> Vec<PrintedStats> {
    blocks(text).into_iter().map(|(stats, _)| stats).collect()
}

fn blocks(text: &str) -> Vec<(PrintedStats, PrintedLines)> {
    let mut blocks = Vec::new();
    let mut cur = Block::default();
    for (index, raw) in text.split('\n').enumerate() {
        let line = raw.trim_end_matches('\r');
        let stripped;
        let line = if line.contains('\x1b') {
            stripped = ANSI.replace_all(line, "");
            stripped.as_ref()
        } else {
            line
        };
        let modern_header = line.contains("====== Perplexity statistics ======");
        let legacy_header = line.contains("===== KL-divergence statistics");
        if modern_header || legacy_header {
            if cur.started {
                blocks.push(std::mem::take(&mut cur).into_stats());
            }
            cur.started = true;
            cur.legacy = legacy_header;
            continue;
        }
        let Some(parsed) = parse_line(line, cur.legacy) else {
            continue;
        };
        let slot = parsed.field as usize;
        if cur.values[slot].is_some() {
            let repeat_of_last = cur.last.is_some_and(|l| l.field == parsed.field);
            if parsed.field == Field::KldP99 && repeat_of_last {
                cur.duplicate_p99 = true;
                continue;
            }
            blocks.push(std::mem::take(&mut cur).into_stats());
        }
        cur.started = true;
        cur.values[slot] = Some((parsed.value, parsed.unc));
        cur.lines[slot] = index + 1;
        cur.last = Some(parsed);
    }
    if cur.started {
        blocks.push(cur.into_stats());
    }
    blocks
}

fn parse_line(line: &str, in_legacy: bool) -> Option<Parsed> {
    // Every statistic line has a colon; most log lines can be skipped without a scan.
    if !line.contains(':') {
        return None;
    }
    let patterns = &*PATTERNS;
    for i in patterns.set.matches(line).iter() {
        let c = &patterns.each[i];
        if c.spec.legacy && !in_legacy {
            continue;
        }
        let Some(caps) = c.regex.captures(line) else {
            continue;
        };
        let spec = c.spec;
        let v = caps.get(1)?.as_str();
        let u = caps.get(2).map(|m| m.as_str()).filter(|s| !s.is_empty());
        let has_percent = caps.get(3).is_some();
        let convert = |s: &str| {
            if spec.percent {
                percent_to_fraction(s)
            } else {
                parse_number(s)
            }
        };
        let value = convert(v)?;
        let unc = match u {
            Some(u) => Some(convert(u)?),
            None => None,
        };
        let full_precision = has_full_precision(v, spec.decimals)
            && u.is_none_or(|u| has_full_precision(u, spec.decimals))
            && (has_percent || !spec.percent);
        return Some(Parsed {
            field: spec.field,
            value,
            unc,
            full_precision,
        });
    }
    None
}

/// `nan`/`inf` as printed, or exactly `decimals` digits after the point.
fn has_full_precision(s: &str, decimals: usize) -> bool {
    let s = s.trim_start_matches(['-', '+']);
    if s.eq_ignore_ascii_case("nan") || s.eq_ignore_ascii_case("inf") {
        return true;
    }
    match s.split_once('.') {
        Some((_, frac)) => frac.len() == decimals && frac.bytes().all(|b| b.is_ascii_digit()),
        None => decimals == 0,
    }
}

fn parse_number(s: &str) -> Option<f64> {
    let t = s.trim_start_matches('+');
    let body = t.trim_start_matches('-');
    if body.eq_ignore_ascii_case("nan") {
        return Some(if t.starts_with('-') {
            -f64::NAN
        } else {
            f64::NAN
        });
    }
    if body.eq_ignore_ascii_case("inf") {
        return Some(if t.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    t.parse().ok()
}

/// `94.261` to 0.94261 by moving the decimal point two places in the text, so the result is the
/// double nearest the printed decimal divided by 100 (dividing the parsed double would not be).
fn percent_to_fraction(s: &str) -> Option<f64> {
    let x = parse_number(s)?;
    if !x.is_finite() {
        return Some(x);
    }
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
        None => (s, 0),
    };
    format!("{mantissa}e{}", exp.checked_sub(2)?).parse().ok()
}
