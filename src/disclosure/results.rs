//! The card's `results` as printed: one claim per entry, with the value's text (which fixes its
//! stated precision) and, for an entry that cannot be read as a claim, why. Nothing is dropped:
//! `verify` gives an unreadable entry its own `invalid` verdict, and `lint` flags it.

use crate::card::yaml::{Node, NodeKind, Scalar};
use crate::disclosure::vocabulary;

/// Keys a `results` entry may have (besides `x-`/`x_` extensions).
const CLAIM_KEYS: &[&str] = &[
    "metric",
    "value",
    "uncertainty",
    "level",
    "context_length",
    "n_positions",
    "n_nonfinite",
    "n_turns",
];

/// One entry of the card's `fidelity.results`, with the value as printed.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Index of the entry in `results`.
    pub index: usize,
    pub metric: String,
    /// The claimed value; NaN when the entry is invalid.
    pub value: f64,
    /// The value's text in the card, which fixes its printed precision.
    pub text: String,
    pub uncertainty: Option<f64>,
    pub context_length: Option<u64>,
    /// Scored rows the card says are behind the value.
    pub n_positions: Option<u64>,
    /// Rows the card says were excluded as non-finite.
    pub n_nonfinite: Option<u64>,
    /// Generated turns the card says are behind a turn metric's value.
    pub n_turns: Option<u64>,
    /// 1-based line of the claim in the card.
    pub line: Option<usize>,
    /// Why the entry cannot be read as a claim (its verdict is then `invalid`).
    pub invalid: Option<String>,
}

/// A plain decimal number as printed: the only form whose digits state a precision, and one that
/// YAML 1.1 readers (PyYAML, which the Hub's Python tools use) also read as that number. So digits
/// before any `.` (`0.5`, not `.5`), and an exponent only after a `.` and with its sign
/// (`1.5e-03`, not `1.5e3` or `1e-3`, which PyYAML reads as strings).
fn decimal_text(text: &str) -> bool {
    let t = text.strip_prefix(['+', '-']).unwrap_or(text);
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (mantissa, None),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let exponent_ok = exponent.is_none_or(|e| {
        frac.is_some()
            && e.strip_prefix(['+', '-'])
                .is_some_and(|e| !e.is_empty() && e.len() <= 4 && digits(e))
    });
    !int.is_empty() && digits(int) && frac.is_none_or(digits) && exponent_ok
}

/// The range a metric's value can take.
fn value_range(metric: &str) -> (f64, f64, &'static str) {
    match metric {
        "top1_agreement" => (0.0, 1.0, "a fraction in [0, 1]"),
        "same_top_p" => (0.0, 100.0, "a percentage in [0, 100]"),
        "delta_p_rms" => (0.0, 1.0, "a probability difference in [0, 1]"),
        m if vocabulary::is_turn_metric(m) => (0.0, 1.0, "a share of turns or calls in [0, 1]"),
        m if m.starts_with("ppl_") => (f64::MIN_POSITIVE, f64::INFINITY, "positive"),
        _ => (0.0, f64::INFINITY, "a divergence, at least 0"),
    }
}

/// A number in a results entry: a plain (unquoted) finite decimal.
fn number(item: &Node, key: &str) -> Result<Option<(f64, Scalar)>, String> {
    let Some(entry) = item.get(key) else {
        return Ok(None);
    };
    let Some(s) = entry.value.as_scalar() else {
        return Err(format!("`{key}` is not a number but a list or mapping"));
    };
    if !s.is_plain() {
        return Err(format!(
            "`{key}` is the quoted string {:?}, not a number",
            s.text
        ));
    }
    match s.value.as_f64() {
        Some(v) if v.is_finite() && decimal_text(&s.text) => Ok(Some((v, s.clone()))),
        Some(_) => Err(format!(
            "`{key}` is {:?}: write it as a plain decimal number that YAML 1.1 readers read as one too (`0.0123`, `1.5e-03`; its digits state its precision)",
            s.text
        )),
        None => Err(format!("`{key}` is {:?}, not a finite number", s.text)),
    }
}

/// A count in a results entry: a plain non-negative integer.
fn count(item: &Node, key: &str, min: u64) -> Result<Option<u64>, String> {
    let Some((v, s)) = number(item, key)? else {
        return Ok(None);
    };
    match s.value.as_u64() {
        Some(n) if n >= min => Ok(Some(n)),
        _ => Err(format!(
            "`{key}` is {v}: it must be a whole number of at least {min}"
        )),
    }
}

/// Read one `results` entry; `Err` says why it is not a claim.
fn read_claim(item: &Node, claim: &mut Claim) -> Result<(), String> {
    let NodeKind::Map(entries) = &item.kind else {
        return Err("the entry is not a mapping of metric, value, ...".into());
    };
    for e in entries {
        if !CLAIM_KEYS.contains(&e.key.as_str())
            && !e.key.starts_with("x-")
            && !e.key.starts_with("x_")
        {
            let hint = CLAIM_KEYS
                .iter()
                .map(|k| (vocabulary::edit_distance(&e.key, k), *k))
                .filter(|(d, _)| *d <= 2)
                .min()
                .map_or(String::new(), |(_, k)| format!(" (did you mean `{k}`?)"));
            return Err(format!("unknown key `{}`{hint}", e.key));
        }
    }
    let metric = match item.get("metric").map(|e| e.value.as_scalar()) {
        None => return Err("no `metric`".into()),
        Some(Some(s)) if s.is_plain() || s.value.is_string() => s.text.clone(),
        Some(_) => return Err("`metric` is not a name".into()),
    };
    claim.metric = metric.clone();
    if !vocabulary::is_metric(&metric) {
        let hint = vocabulary::closest(&metric)
            .map_or(String::new(), |s| format!(" (did you mean `{s}`?)"));
        return Err(format!(
            "`{metric}` is not a metric of the vocabulary{hint}"
        ));
    }
    if let Some(s) = item.get("value").and_then(|e| e.value.as_scalar()) {
        claim.text = s.text.clone();
    }
    let (value, scalar) = number(item, "value")?.ok_or("no `value`")?;
    claim.text = scalar.text.clone();
    let (lo, hi, what) = value_range(&metric);
    if !(lo..=hi).contains(&value) {
        return Err(format!(
            "`value` {} is out of range: {metric} is {what}",
            scalar.text
        ));
    }
    claim.value = value;
    claim.uncertainty = match number(item, "uncertainty")? {
        Some((u, _)) if u >= 0.0 => Some(u),
        Some((u, _)) => return Err(format!("`uncertainty` {u} is negative")),
        None => None,
    };
    if let Some((level, _)) = number(item, "level")?
        && !(level > 0.0 && level < 1.0)
    {
        return Err(format!("`level` {level} is not strictly between 0 and 1"));
    }
    claim.context_length = count(item, "context_length", 2)?;
    claim.n_positions = count(item, "n_positions", 1)?;
    claim.n_nonfinite = count(item, "n_nonfinite", 0)?;
    claim.n_turns = count(item, "n_turns", 1)?;
    let turn = vocabulary::is_turn_metric(&metric);
    let misplaced = if turn {
        ["context_length", "n_positions", "n_nonfinite"]
            .into_iter()
            .find(|k| item.get(k).is_some())
    } else {
        item.get("n_turns").map(|_| "n_turns")
    };
    match misplaced {
        Some(key) if turn => Err(format!(
            "`{key}` on a turn metric: {metric} is measured once over the generated turns \
             (`protocol.turns`), not over the scored rows of a context length; state `n_turns`"
        )),
        Some(key) => Err(format!(
            "`{key}` on {metric}: only the turn metrics (tool_call_f1, tool_call_valid, \
             tool_call_match, turn_match) are counted in turns"
        )),
        None => Ok(()),
    }
}

/// Read `results` from the card's `fidelity` node (as parsed, with scalar text): one claim per
/// entry, unreadable entries included (as invalid claims), so none is silently dropped.
pub fn claims(fidelity: &Node, line_of: &dyn Fn(usize) -> usize) -> Vec<Claim> {
    let Some(results) = fidelity.get("results") else {
        return Vec::new();
    };
    let blank = |index: usize, node: &Node| Claim {
        index,
        metric: String::new(),
        value: f64::NAN,
        text: String::new(),
        uncertainty: None,
        context_length: None,
        n_positions: None,
        n_nonfinite: None,
        n_turns: None,
        line: Some(line_of(node.span.start)),
        invalid: None,
    };
    let NodeKind::Seq(items) = &results.value.kind else {
        let mut c = blank(0, &results.value);
        c.invalid = Some("`results` is not a list of claims".into());
        return vec![c];
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let mut claim = blank(index, item);
            if let Err(why) = read_claim(item, &mut claim) {
                claim.value = f64::NAN;
                claim.invalid = Some(why);
            }
            claim
        })
        .collect()
}
