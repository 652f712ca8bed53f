//! Python's string algorithms where Rust's differ: what counts as whitespace (`\x1c`–`\x1f`
//! too), where lines end (`\v`, `\f`, `\x85`, U+2028 ...), `split()` without a separator,
//! positions counted in code points, `center`'s odd-margin rule, `title` and the `is...`
//! predicates. Where Python's answer rests on Unicode tables cardproof does not carry (the
//! title case of `ß`, whether `½` is a digit), the answer is a refusal naming the character,
//! never a guess.

use minijinja::Error;
use unicode_general_category::{GeneralCategory as G, get_general_category};

use super::python::{refusal, value_error};

/// Python's `str.isspace()` for one character.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's line boundaries (`str.splitlines`).
pub fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r'
            | '\u{b}'
            | '\u{c}'
            | '\u{1c}'
            | '\u{1d}'
            | '\u{1e}'
            | '\u{85}'
            | '\u{2028}'
            | '\u{2029}'
    )
}

/// `str.strip(chars)`, `lstrip`, `rstrip`: `chars` `None` strips Python's whitespace.
pub fn strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let set = |c: char| chars.map_or_else(|| is_space(c), |set| set.contains(c));
    let s = if left { s.trim_start_matches(set) } else { s };
    if right { s.trim_end_matches(set) } else { s }
}

/// `str.split(sep, maxsplit)` (`rsplit` with `from_right`): without a separator, runs of
/// whitespace split and empty parts are dropped; an empty separator is a `ValueError`.
pub fn split(
    s: &str,
    sep: Option<&str>,
    maxsplit: i64,
    from_right: bool,
) -> Result<Vec<String>, Error> {
    let max = if maxsplit < 0 {
        usize::MAX
    } else {
        maxsplit as usize
    };
    match sep {
        Some("") => Err(value_error("empty separator")),
        Some(sep) if from_right => {
            let mut parts: Vec<String> = s
                .rsplitn(max.saturating_add(1), sep)
                .map(str::to_owned)
                .collect();
            parts.reverse();
            Ok(parts)
        }
        Some(sep) => Ok(s
            .splitn(max.saturating_add(1), sep)
            .map(str::to_owned)
            .collect()),
        None if from_right => {
            let reversed: String = s.chars().rev().collect();
            let mut parts: Vec<String> = split_whitespace(&reversed, max)
                .into_iter()
                .map(|p| p.chars().rev().collect())
                .collect();
            parts.reverse();
            Ok(parts)
        }
        None => Ok(split_whitespace(s, max)),
    }
}

/// `str.split()` with at most `max` splits: the rest keeps its inner and trailing whitespace.
fn split_whitespace(s: &str, max: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = s.trim_start_matches(is_space);
    while !rest.is_empty() {
        if parts.len() == max {
            parts.push(rest.to_owned());
            break;
        }
        let end = rest.find(is_space).unwrap_or(rest.len());
        parts.push(rest[..end].to_owned());
        rest = rest[end..].trim_start_matches(is_space);
    }
    parts
}

/// `str.splitlines(keepends)`.
pub fn splitlines(s: &str, keepends: bool) -> Vec<String> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if !is_line_break(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        if c == '\r' && chars.peek().is_some_and(|&(_, n)| n == '\n') {
            chars.next();
            end += 1;
        }
        lines.push(s[start..if keepends { end } else { i }].to_owned());
        start = end;
    }
    if start < s.len() {
        lines.push(s[start..].to_owned());
    }
    lines
}

/// The byte range of the code-point slice `[start:end]` Python takes for `find`, `count`,
/// `startswith` and the like (negative positions count from the end, out-of-range ones clamp).
pub fn char_range(s: &str, start: Option<i64>, end: Option<i64>) -> Option<(usize, usize)> {
    let n = s.chars().count() as i64;
    let clamp = |i: i64| if i < 0 { (i + n).max(0) } else { i.min(n) };
    let (a, b) = (clamp(start.unwrap_or(0)), clamp(end.unwrap_or(n)));
    if a > b {
        return None;
    }
    let byte = |i: i64| s.char_indices().nth(i as usize).map_or(s.len(), |(b, _)| b);
    Some((byte(a), byte(b)))
}

/// The code-point position of a byte offset.
pub fn char_index(s: &str, byte: usize) -> i64 {
    s[..byte].chars().count() as i64
}

/// `str.center(width, fill)`: Python puts the extra character of an odd margin on the left when
/// the width is odd.
pub fn center(s: &str, width: usize, fill: char) -> String {
    let len = s.chars().count();
    if width <= len {
        return s.to_owned();
    }
    let margin = width - len;
    let left = margin / 2 + (margin & width & 1);
    let pad = |n: usize| std::iter::repeat_n(fill, n).collect::<String>();
    format!("{}{s}{}", pad(left), pad(margin - left))
}

/// `str.ljust` / `str.rjust`.
pub fn justify(s: &str, width: usize, fill: char, left: bool) -> String {
    let len = s.chars().count();
    let pad: String = std::iter::repeat_n(fill, width.saturating_sub(len)).collect();
    if left {
        format!("{s}{pad}")
    } else {
        format!("{pad}{s}")
    }
}

/// `str.zfill(width)`: zeros after any sign.
pub fn zfill(s: &str, width: usize) -> String {
    let len = s.chars().count();
    if width <= len {
        return s.to_owned();
    }
    let zeros = "0".repeat(width - len);
    match s.strip_prefix(['+', '-']) {
        Some(rest) => format!("{}{zeros}{rest}", &s[..1]),
        None => format!("{zeros}{s}"),
    }
}

/// Whether a character is cased (has an upper or lower case form), as `str.title` decides.
fn is_cased(c: char) -> bool {
    c.is_lowercase() || c.is_uppercase() || get_general_category(c) == G::TitlecaseLetter
}

/// One character's title case: its upper case, except for the digraphs whose title form is
/// their own; a character whose upper case is several characters is refused (Python's title
/// case of `ß` is `Ss`, not `SS`, and cardproof carries no table of those).
fn title_char(c: char, out: &mut String) -> Result<(), Error> {
    let title = match c {
        'Ǆ' | 'ǅ' | 'ǆ' => 'ǅ',
        'Ǉ' | 'ǈ' | 'ǉ' => 'ǈ',
        'Ǌ' | 'ǋ' | 'ǌ' => 'ǋ',
        'Ǳ' | 'ǲ' | 'ǳ' => 'ǲ',
        c => {
            let mut upper = c.to_uppercase();
            match (upper.next(), upper.next()) {
                (Some(u), None) => u,
                _ => {
                    return Err(refusal(format!(
                        "the title case of {c:?} (U+{:04X}) is not the upper case cardproof knows",
                        c as u32
                    )));
                }
            }
        }
    };
    out.push(title);
    Ok(())
}

/// Python's `str.title()`: a cased character after a cased one lower-cased, any other title
/// cased.
pub fn title(s: &str) -> Result<String, Error> {
    let mut out = String::with_capacity(s.len());
    let mut previous_cased = false;
    for c in s.chars() {
        if previous_cased {
            out.extend(c.to_lowercase());
        } else {
            title_char(c, &mut out)?;
        }
        previous_cased = is_cased(c);
    }
    Ok(out)
}

/// Python's `str.capitalize()`: the first character title cased, the rest lower cased.
pub fn capitalize(s: &str) -> Result<String, Error> {
    let mut chars = s.chars();
    let mut out = String::with_capacity(s.len());
    if let Some(first) = chars.next() {
        title_char(first, &mut out)?;
    }
    for c in chars {
        out.extend(c.to_lowercase());
    }
    Ok(out)
}

/// jinja2's `title` filter (not `str.title`): each word that follows `-`, whitespace, `(`,
/// `{`, `[` or `<` gets its first character upper cased and the rest lower cased.
pub fn jinja_title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut word_start = true;
    for c in s.chars() {
        let boundary = c == '-' || is_space(c) || "({[<".contains(c);
        if boundary {
            out.push(c);
        } else if word_start {
            out.extend(c.to_uppercase());
        } else {
            out.extend(c.to_lowercase());
        }
        word_start = boundary;
    }
    out
}

/// Which of Python's character predicates.
#[derive(Debug, Clone, Copy)]
pub enum Predicate {
    Alpha,
    Alnum,
    Decimal,
    Digit,
    Numeric,
    Space,
    Lower,
    Upper,
}

/// Python's `str.isalpha()`, `isdigit()`, ...: false for an empty string. Where the answer
/// needs Unicode's numeric types (is `½` a digit? is `一` numeric?), refused.
pub fn predicate(s: &str, p: Predicate) -> Result<bool, Error> {
    if s.is_empty() {
        return Ok(false);
    }
    let number = |c: char| {
        matches!(
            get_general_category(c),
            G::DecimalNumber | G::LetterNumber | G::OtherNumber
        )
    };
    let letter = |c: char| {
        matches!(
            get_general_category(c),
            G::UppercaseLetter
                | G::LowercaseLetter
                | G::TitlecaseLetter
                | G::ModifierLetter
                | G::OtherLetter
        )
    };
    let decimal = |c: char| get_general_category(c) == G::DecimalNumber;
    let unsure = |c: char| {
        refusal(format!(
            "whether {c:?} (U+{:04X}) is a digit or numeric rests on Unicode tables cardproof does not carry",
            c as u32
        ))
    };
    match p {
        Predicate::Alpha => Ok(s.chars().all(letter)),
        Predicate::Space => Ok(s.chars().all(is_space)),
        Predicate::Decimal => Ok(s.chars().all(decimal)),
        Predicate::Digit => {
            for c in s.chars() {
                if !number(c) {
                    return Ok(false);
                }
                if !decimal(c) {
                    return Err(unsure(c));
                }
            }
            Ok(true)
        }
        Predicate::Numeric => {
            for c in s.chars() {
                if get_general_category(c) == G::OtherLetter {
                    return Err(unsure(c));
                }
                if !number(c) {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Predicate::Alnum => Ok(s.chars().all(|c| letter(c) || number(c))),
        Predicate::Lower | Predicate::Upper => {
            let mut cased = false;
            for c in s.chars() {
                let (wrong, right) = if matches!(p, Predicate::Lower) {
                    (
                        c.is_uppercase() || get_general_category(c) == G::TitlecaseLetter,
                        c.is_lowercase(),
                    )
                } else {
                    (
                        c.is_lowercase() || get_general_category(c) == G::TitlecaseLetter,
                        c.is_uppercase(),
                    )
                };
                if wrong {
                    return Ok(false);
                }
                cased |= right;
            }
            Ok(cased)
        }
    }
}

/// markupsafe's `escape`: `&`, `<`, `>`, `'` and `"` as HTML entities.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_strip_and_lines_follow_python() {
        assert_eq!(split("a b  c", None, -1, false).unwrap(), ["a", "b", "c"]);
        assert_eq!(
            split("  a b  c  ", None, 1, false).unwrap(),
            ["a", "b  c  "]
        );
        assert_eq!(split("  a b  c  ", None, 1, true).unwrap(), ["  a b", "c"]);
        assert_eq!(split("a,b,c", Some(","), 1, true).unwrap(), ["a,b", "c"]);
        assert_eq!(
            split("a\u{a0}b\u{2003}c\u{1c}d", None, -1, false).unwrap(),
            ["a", "b", "c", "d"]
        );
        assert!(split("a", Some(""), -1, false).is_err());
        assert_eq!(strip("\u{a0}x\u{3000}\u{1c}", None, true, true), "x");
        assert_eq!(strip("xxaxx", Some("x"), true, false), "axx");
        assert_eq!(
            splitlines("a\u{b}b\u{c}c\u{1c}d\u{85}e\u{2028}f\r\ng\n", false),
            ["a", "b", "c", "d", "e", "f", "g"]
        );
        assert_eq!(splitlines("a\r\nb", true), ["a\r\n", "b"]);
    }

    #[test]
    fn padding_and_case_follow_python() {
        assert_eq!(center("abc", 9, ' '), "   abc   ");
        assert_eq!(center("ab", 5, '*'), "**ab*");
        assert_eq!(center("abc", 6, '*'), "*abc**");
        assert_eq!(zfill("-7", 4), "-007");
        assert_eq!(title("o'neil x1y ǆemal").unwrap(), "O'Neil X1Y ǅemal");
        assert_eq!(
            jinja_title("o'neil x1y hello-world"),
            "O'neil X1y Hello-World"
        );
        assert_eq!(title("straße").unwrap(), "Straße");
        assert!(title("ßa").is_err());
        assert_eq!(capitalize("hELLO wORLD").unwrap(), "Hello world");
        assert!(predicate("123", Predicate::Digit).unwrap());
        assert!(predicate("½", Predicate::Digit).is_err());
        assert!(!predicate("1a", Predicate::Digit).unwrap());
        assert!(predicate("Ab1", Predicate::Alnum).unwrap());
        assert_eq!(escape_html("'\"&<>"), "&#39;&#34;&amp;&lt;&gt;");
    }
}
