//! Python's two string formattings, as templates use them: `"%s: %.2f" % (a, b)` (and jinja2's
//! `format` filter, which is the same) and `"{}: {:.2f}".format(a, b)`. Values are written as
//! Python writes them (`str()`, `repr()`, its float algorithms); every width and precision is
//! bounded before the text is built ([`super::limits`]); what Python would refuse
//! (`%d` of a string, a missing argument) is refused with Python's error, and the rare forms
//! cardproof does not write (`%a`, `{:n}`, nested `{}` in a spec) are refused by name.

use minijinja::value::Value;
use minijinja::{Error, ErrorKind, State};

use super::limits::reserve;
use super::python::{
    PyType, as_int, py_type, refusal, to_repr, to_str, type_error, type_name, value_error,
};
use super::strings::escape_html;

/// One conversion's layout: `[[fill]align][sign][#][0][width][,|_][.precision][type]`.
#[derive(Debug, Clone, Default)]
struct Spec {
    fill: Option<char>,
    align: Option<char>,
    sign: Option<char>,
    alt: bool,
    zero: bool,
    width: usize,
    grouping: Option<char>,
    precision: Option<usize>,
    ty: Option<char>,
}

/// The bytes a conversion may take before its value is written: its width and precision.
fn reserve_spec(state: &State, spec: &Spec) -> Result<(), Error> {
    reserve(
        state,
        spec.width as u128 + spec.precision.unwrap_or(0) as u128,
        "a format width or precision",
    )
}

/// A number of digits in a format spec, bounded so it cannot overflow.
fn digits(chars: &[char], at: &mut usize) -> Option<usize> {
    let start = *at;
    let mut n: usize = 0;
    while let Some(d) = chars.get(*at).and_then(|c| c.to_digit(10)) {
        n = n.saturating_mul(10).saturating_add(d as usize);
        *at += 1;
    }
    (*at > start).then_some(n)
}

/// `value % args` for a string `value`: Python's printf-style formatting. `markup`: the format
/// string is a `Markup`, which escapes every argument it writes as a string.
pub fn printf(state: &State, format: &str, args: &Value, markup: bool) -> Result<String, Error> {
    let chars: Vec<char> = format.chars().collect();
    let mapping = py_type(args) == PyType::Dict;
    let positional: Vec<Value> = if py_type(args) == PyType::Tuple {
        args.try_iter()?.collect()
    } else {
        vec![args.clone()]
    };
    let mut next = 0usize;
    let mut used_key = false;
    let take = |next: &mut usize| -> Result<Value, Error> {
        let v = positional
            .get(*next)
            .cloned()
            .ok_or_else(|| type_error("not enough arguments for format string"))?;
        *next += 1;
        Ok(v)
    };
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '%' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        i += 1;
        let mut key = None;
        if chars.get(i) == Some(&'(') {
            let close = chars[i..].iter().position(|&c| c == ')').map(|p| p + i);
            let Some(close) = close else {
                return Err(value_error("incomplete format key"));
            };
            key = Some(chars[i + 1..close].iter().collect::<String>());
            i = close + 1;
        }
        let mut spec = Spec::default();
        while let Some(&c) = chars.get(i) {
            match c {
                '-' => spec.align = Some('<'),
                '+' => spec.sign = Some('+'),
                ' ' if spec.sign != Some('+') => spec.sign = Some(' '),
                ' ' => {}
                '#' => spec.alt = true,
                '0' => spec.zero = true,
                _ => break,
            }
            i += 1;
        }
        if chars.get(i) == Some(&'*') {
            i += 1;
            let w = as_int(&take(&mut next)?).ok_or_else(|| type_error("* wants int"))?;
            if w < 0 {
                spec.align = Some('<');
            }
            spec.width = w.unsigned_abs().min(usize::MAX as u128) as usize;
        } else {
            spec.width = digits(&chars, &mut i).unwrap_or(0);
        }
        if chars.get(i) == Some(&'.') {
            i += 1;
            if chars.get(i) == Some(&'*') {
                i += 1;
                let p = as_int(&take(&mut next)?).ok_or_else(|| type_error("* wants int"))?;
                spec.precision = Some(p.max(0).min(usize::MAX as i128) as usize);
            } else {
                spec.precision = Some(digits(&chars, &mut i).unwrap_or(0));
            }
        }
        while matches!(chars.get(i), Some('h' | 'l' | 'L')) {
            i += 1;
        }
        let Some(&ty) = chars.get(i) else {
            return Err(value_error("incomplete format"));
        };
        i += 1;
        if ty == '%' {
            out.push('%');
            continue;
        }
        reserve_spec(state, &spec)?;
        let arg = match &key {
            Some(k) => {
                used_key = true;
                if !mapping {
                    return Err(type_error("format requires a mapping"));
                }
                let v = args.get_item(&Value::from(k.as_str()))?;
                if v.is_undefined() {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!("KeyError: '{k}'"),
                    ));
                }
                v
            }
            None => take(&mut next)?,
        };
        spec.ty = Some(ty);
        if spec.zero && spec.align.is_none() {
            spec.align = Some('=');
            spec.fill = Some('0');
        }
        out.push_str(&printf_one(&arg, &mut spec, ty, markup)?);
        reserve(state, out.len() as u128, "a formatted string")?;
    }
    if !used_key && !mapping && next < positional.len() {
        return Err(type_error(
            "not all arguments converted during string formatting",
        ));
    }
    Ok(out)
}

/// One printf conversion of `arg`.
fn printf_one(arg: &Value, spec: &mut Spec, ty: char, markup: bool) -> Result<String, Error> {
    let escape = |s: String| {
        if markup && py_type(arg) != PyType::Markup {
            escape_html(&s)
        } else {
            s
        }
    };
    match ty {
        's' | 'r' => {
            let text = escape(if ty == 's' {
                to_str(arg)?
            } else {
                to_repr(arg)?
            });
            spec.align.get_or_insert('>');
            if spec.align == Some('=') {
                spec.align = Some('>');
                spec.fill = None;
            }
            Ok(pad(&truncate(&text, spec.precision), spec, '>'))
        }
        'd' | 'i' | 'u' => {
            let n = match (py_type(arg), as_int(arg)) {
                (_, Some(n)) => n,
                (PyType::Float, _) => {
                    let f = f64::try_from(arg.clone()).unwrap_or(f64::NAN);
                    if !f.is_finite() {
                        return Err(type_error(
                            "cannot convert float NaN or infinity to integer",
                        ));
                    }
                    f.trunc() as i128
                }
                _ => {
                    return Err(type_error(format!(
                        "%{ty} format: a real number is required, not {}",
                        type_name(arg)
                    )));
                }
            };
            spec.ty = Some('d');
            format_int(n, spec)
        }
        'x' | 'X' | 'o' => {
            let n = as_int(arg).ok_or_else(|| {
                type_error(format!(
                    "%{ty} format: an integer is required, not {}",
                    type_name(arg)
                ))
            })?;
            format_int(n, spec)
        }
        'e' | 'E' | 'f' | 'F' | 'g' | 'G' => {
            let f = super::python::as_number(arg).ok_or_else(|| {
                type_error(format!("must be real number, not {}", type_name(arg)))
            })?;
            spec.precision.get_or_insert(6);
            format_float(f, spec)
        }
        'c' => {
            let c = match (as_int(arg), arg.as_str()) {
                (Some(n), _) => {
                    u32::try_from(n)
                        .ok()
                        .and_then(char::from_u32)
                        .ok_or_else(|| {
                            Error::new(
                                ErrorKind::InvalidOperation,
                                "OverflowError: %c arg not in range(0x110000)",
                            )
                        })?
                }
                (None, Some(s)) if s.chars().count() == 1 => s.chars().next().expect("one char"),
                _ => return Err(type_error("%c requires int or char")),
            };
            Ok(pad(&escape(c.to_string()), spec, '>'))
        }
        'a' => Err(refusal("`%a` (Python's ascii()) in a format string")),
        other => Err(value_error(format!(
            "unsupported format character '{other}' (0x{:x})",
            other as u32
        ))),
    }
}

/// `format.format(*args, **kwargs)`: Python's `str.format`.
pub fn str_format(
    state: &State,
    format: &str,
    args: &[Value],
    kwargs: &Value,
    markup: bool,
) -> Result<String, Error> {
    let chars: Vec<char> = format.chars().collect();
    let mut out = String::new();
    let mut auto: Option<usize> = None;
    let mut manual = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '}' {
            if chars.get(i + 1) == Some(&'}') {
                out.push('}');
                i += 2;
                continue;
            }
            return Err(value_error("Single '}' encountered in format string"));
        }
        if c != '{' {
            out.push(c);
            i += 1;
            continue;
        }
        if chars.get(i + 1) == Some(&'{') {
            out.push('{');
            i += 2;
            continue;
        }
        let close = field_end(&chars, i + 1)?;
        let field: String = chars[i + 1..close].iter().collect();
        i = close + 1;
        let (name, conversion, spec) = split_field(&field)?;
        if spec.contains('{') {
            return Err(refusal("a nested `{}` inside a str.format spec"));
        }
        let value = field_value(&name, args, kwargs, &mut auto, &mut manual)?;
        let mut spec = parse_spec(&spec)?;
        reserve_spec(state, &spec)?;
        let text = match conversion {
            None => format_value(&value, &mut spec)?,
            Some('s') => pad(&truncate(&to_str(&value)?, spec.precision), &spec, '<'),
            Some('r') => pad(&truncate(&to_repr(&value)?, spec.precision), &spec, '<'),
            Some('a') => return Err(refusal("`!a` (Python's ascii()) in a format string")),
            Some(other) => {
                return Err(value_error(format!("Unknown conversion specifier {other}")));
            }
        };
        let text = if markup
            && (conversion.is_some() || py_type(&value) != PyType::Markup)
            && !value.is_number()
        {
            escape_html(&text)
        } else {
            text
        };
        out.push_str(&text);
        reserve(state, out.len() as u128, "a formatted string")?;
    }
    Ok(out)
}

/// Where a replacement field that opens before `from` closes (`[...]` may hold braces).
fn field_end(chars: &[char], from: usize) -> Result<usize, Error> {
    let mut depth = 0;
    let mut in_index = false;
    for (j, &c) in chars.iter().enumerate().skip(from) {
        match c {
            '[' if depth == 0 => in_index = true,
            ']' => in_index = false,
            '{' if !in_index => depth += 1,
            '}' if !in_index && depth > 0 => depth -= 1,
            '}' if !in_index => return Ok(j),
            _ => {}
        }
    }
    Err(value_error("expected '}' before end of string"))
}

/// A field's name, its `!r`/`!s` conversion and its spec.
fn split_field(field: &str) -> Result<(String, Option<char>, String), Error> {
    let mut name_end = field.len();
    let mut in_index = false;
    for (j, c) in field.char_indices() {
        match c {
            '[' => in_index = true,
            ']' => in_index = false,
            '!' | ':' if !in_index => {
                name_end = j;
                break;
            }
            _ => {}
        }
    }
    let (name, rest) = field.split_at(name_end);
    let (conversion, spec) = match rest.strip_prefix('!') {
        Some(r) => {
            let mut cs = r.chars();
            let conv = cs.next().ok_or_else(|| {
                value_error("end of string while looking for conversion specifier")
            })?;
            let after = cs.as_str();
            if !after.is_empty() && !after.starts_with(':') {
                return Err(value_error("expected ':' after conversion specifier"));
            }
            (Some(conv), after.strip_prefix(':').unwrap_or("").to_owned())
        }
        None => (None, rest.strip_prefix(':').unwrap_or("").to_owned()),
    };
    Ok((name.to_owned(), conversion, spec))
}

/// The value a field names: `{}`, `{0}`, `{name}`, then `.attr` and `[key]` lookups.
fn field_value(
    name: &str,
    args: &[Value],
    kwargs: &Value,
    auto: &mut Option<usize>,
    manual: &mut bool,
) -> Result<Value, Error> {
    let head_end = name.find(['.', '[']).unwrap_or(name.len());
    let (head, mut rest) = name.split_at(head_end);
    let mut value = if head.is_empty() {
        if *manual {
            return Err(value_error(
                "cannot switch from manual field specification to automatic field numbering",
            ));
        }
        let n = auto.map_or(0, |n| n + 1);
        *auto = Some(n);
        args.get(n).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("IndexError: Replacement index {n} out of range for positional args tuple"),
            )
        })?
    } else if let Ok(n) = head.parse::<usize>() {
        if auto.is_some() {
            return Err(value_error(
                "cannot switch from automatic field numbering to manual field specification",
            ));
        }
        *manual = true;
        args.get(n).cloned().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("IndexError: Replacement index {n} out of range for positional args tuple"),
            )
        })?
    } else {
        let v = kwargs
            .get_item(&Value::from(head))
            .unwrap_or(Value::UNDEFINED);
        if v.is_undefined() {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("KeyError: '{head}'"),
            ));
        }
        v
    };
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            value = value.get_attr(&r[..end])?;
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r
                .find(']')
                .ok_or_else(|| value_error("Missing ']' in format string"))?;
            let key = &r[..end];
            let key = key
                .parse::<i64>()
                .map_or_else(|_| Value::from(key), Value::from);
            value = value.get_item(&key)?;
            rest = &r[end + 1..];
        } else {
            return Err(value_error(
                "Only '.' or '[' may follow ']' in format field specifier",
            ));
        }
        if value.is_undefined() {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("KeyError: '{name}'"),
            ));
        }
    }
    Ok(value)
}

/// A format spec of the mini-language.
fn parse_spec(spec: &str) -> Result<Spec, Error> {
    let chars: Vec<char> = spec.chars().collect();
    let mut s = Spec::default();
    let mut i = 0;
    let is_align = |c: Option<&char>| matches!(c, Some('<' | '>' | '^' | '='));
    if chars.len() >= 2 && is_align(chars.get(1)) {
        s.fill = Some(chars[0]);
        s.align = Some(chars[1]);
        i = 2;
    } else if is_align(chars.first()) {
        s.align = Some(chars[0]);
        i = 1;
    }
    if let Some(&c @ ('+' | '-' | ' ')) = chars.get(i) {
        s.sign = Some(c);
        i += 1;
    }
    if chars.get(i) == Some(&'z') {
        return Err(refusal("the `z` option of a format spec"));
    }
    if chars.get(i) == Some(&'#') {
        s.alt = true;
        i += 1;
    }
    if chars.get(i) == Some(&'0') {
        s.zero = true;
        i += 1;
    }
    s.width = digits(&chars, &mut i).unwrap_or(0);
    if let Some(&g @ (',' | '_')) = chars.get(i) {
        s.grouping = Some(g);
        i += 1;
    }
    if chars.get(i) == Some(&'.') {
        i += 1;
        s.precision = Some(
            digits(&chars, &mut i)
                .ok_or_else(|| value_error("Format specifier missing precision"))?,
        );
    }
    if let Some(&t) = chars.get(i) {
        s.ty = Some(t);
        i += 1;
    }
    if i != chars.len() {
        return Err(value_error("Invalid format specifier"));
    }
    if s.zero && s.align.is_none() {
        s.fill.get_or_insert('0');
        s.align = Some('=');
    }
    Ok(s)
}

/// `format(value, spec)`: strings, ints, floats (a bool with a spec as its int); other values
/// only with an empty spec.
fn format_value(value: &Value, spec: &mut Spec) -> Result<String, Error> {
    let empty = spec.ty.is_none()
        && spec.width == 0
        && spec.precision.is_none()
        && spec.sign.is_none()
        && !spec.alt
        && spec.grouping.is_none();
    match py_type(value) {
        PyType::Str | PyType::Markup => {
            if !matches!(spec.ty, None | Some('s'))
                || spec.sign.is_some()
                || spec.alt
                || spec.align == Some('=')
            {
                return Err(value_error(format!(
                    "Unknown format code '{}' for object of type 'str'",
                    spec.ty.unwrap_or('=')
                )));
            }
            Ok(pad(
                &truncate(value.as_str().unwrap_or_default(), spec.precision),
                spec,
                '<',
            ))
        }
        PyType::Int | PyType::Bool if empty => to_str(value),
        PyType::Int | PyType::Bool => match spec.ty {
            Some('e' | 'E' | 'f' | 'F' | 'g' | 'G' | '%') => {
                format_float(super::python::as_number(value).unwrap_or(0.0), spec)
            }
            _ if spec.precision.is_some() => Err(value_error(
                "Precision not allowed in integer format specifier",
            )),
            _ => format_int(as_int(value).unwrap_or(0), spec),
        },
        PyType::Float => format_float(f64::try_from(value.clone()).unwrap_or(f64::NAN), spec),
        _ if empty => to_str(value),
        _ => Err(type_error(format!(
            "unsupported format string passed to {}.__format__",
            type_name(value)
        ))),
    }
}

/// An integer in a spec's type (`d`, `x`, `X`, `o`, `b`, `c`), sign, `#` prefix, grouping and
/// padding.
fn format_int(n: i128, spec: &Spec) -> Result<String, Error> {
    let (digits, prefix, group) = match spec.ty.unwrap_or('d') {
        'd' => (n.unsigned_abs().to_string(), "", 3),
        'x' => (format!("{:x}", n.unsigned_abs()), "0x", 4),
        'X' => (format!("{:X}", n.unsigned_abs()), "0X", 4),
        'o' => (format!("{:o}", n.unsigned_abs()), "0o", 4),
        'b' => (format!("{:b}", n.unsigned_abs()), "0b", 4),
        'c' => {
            let c = u32::try_from(n)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "OverflowError: %c arg not in range(0x110000)",
                    )
                })?;
            return Ok(pad(&c.to_string(), spec, '<'));
        }
        'n' => return Err(refusal("the locale-dependent `n` format type")),
        other => {
            return Err(value_error(format!(
                "Unknown format code '{other}' for object of type 'int'"
            )));
        }
    };
    let digits = match spec.grouping {
        Some(g) => group_digits(&digits, g, group),
        None => digits,
    };
    let sign = sign_of(n < 0, spec);
    let prefix = if spec.alt { prefix } else { "" };
    Ok(pad_number(&format!("{sign}{prefix}"), &digits, spec))
}

/// A float in a spec's type (`e`, `f`, `g`, `%`, or none), as Python's `format` and `%` write
/// it.
fn format_float(f: f64, spec: &Spec) -> Result<String, Error> {
    let upper = matches!(spec.ty, Some('E' | 'F' | 'G'));
    let sign = sign_of(f.is_sign_negative() && !f.is_nan(), spec);
    let a = f.abs();
    let body = if a.is_nan() {
        "nan".to_owned()
    } else if a.is_infinite() {
        "inf".to_owned()
    } else {
        match spec.ty {
            Some('e' | 'E') => sci(a, spec.precision.unwrap_or(6), spec.alt),
            Some('f' | 'F') => fixed(a, spec.precision.unwrap_or(6), spec.alt),
            Some('%') => format!(
                "{}%",
                fixed(a * 100.0, spec.precision.unwrap_or(6), spec.alt)
            ),
            Some('g' | 'G') => general(a, spec.precision.unwrap_or(6), spec.alt, false),
            None if spec.precision.is_none() => super::json::python_float(a),
            None => general(a, spec.precision.unwrap_or(6), spec.alt, true),
            Some('n') => return Err(refusal("the locale-dependent `n` format type")),
            Some(other) => {
                return Err(value_error(format!(
                    "Unknown format code '{other}' for object of type 'float'"
                )));
            }
        }
    };
    let body = if upper { body.to_uppercase() } else { body };
    let body = match spec.grouping {
        Some(g) => {
            let split = body
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(body.len());
            format!("{}{}", group_digits(&body[..split], g, 3), &body[split..])
        }
        None => body,
    };
    Ok(pad_number(sign, &body, spec))
}

/// `%.{p}f`.
fn fixed(a: f64, precision: usize, alt: bool) -> String {
    let s = format!("{a:.precision$}");
    if alt && precision == 0 {
        format!("{s}.")
    } else {
        s
    }
}

/// `%.{p}e`: Python writes the exponent's sign and at least two digits.
fn sci(a: f64, precision: usize, alt: bool) -> String {
    let s = format!("{a:.precision$e}");
    let (mantissa, exp) = s.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let dot = if alt && precision == 0 { "." } else { "" };
    format!(
        "{mantissa}{dot}e{}{:02}",
        if exp < 0 { '-' } else { '+' },
        exp.abs()
    )
}

/// `%g` (and the spec without a type but with a precision, `repr_style`): `p` significant
/// digits, fixed notation for exponents from −4 below `p`, trailing zeros dropped unless `#`.
fn general(a: f64, precision: usize, alt: bool, repr_style: bool) -> String {
    let p = precision.max(1);
    let rounded = format!("{a:.*e}", p - 1);
    let exp: i64 = rounded
        .split_once('e')
        .expect("an exponent")
        .1
        .parse()
        .expect("an exponent");
    // Without a type, scientific notation starts one exponent earlier.
    let fixed_below = if repr_style { p as i64 - 1 } else { p as i64 };
    let s = if (-4..fixed_below).contains(&exp) {
        format!("{a:.*}", (p as i64 - 1 - exp).max(0) as usize)
    } else {
        sci(a, p - 1, alt)
    };
    if alt {
        return s;
    }
    let (num, exp_part) = match s.find('e') {
        Some(e) => (&s[..e], &s[e..]),
        None => (s.as_str(), ""),
    };
    let num = if num.contains('.') {
        num.trim_end_matches('0').trim_end_matches('.')
    } else {
        num
    };
    let num = if repr_style && exp_part.is_empty() && !num.contains('.') {
        format!("{num}.0")
    } else {
        num.to_owned()
    };
    format!("{num}{exp_part}")
}

fn sign_of(negative: bool, spec: &Spec) -> &'static str {
    match (negative, spec.sign) {
        (true, _) => "-",
        (false, Some('+')) => "+",
        (false, Some(' ')) => " ",
        _ => "",
    }
}

/// Digits grouped in threes (or fours) from the right with `sep`.
fn group_digits(digits: &str, sep: char, size: usize) -> String {
    let chars: Vec<char> = digits.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        if i > 0 && (chars.len() - i).is_multiple_of(size) {
            out.push(sep);
        }
        out.push(*c);
    }
    out
}

/// A number padded to the spec's width: `=` (and zero padding) pads between the sign and the
/// digits; numbers align right by default.
fn pad_number(sign: &str, body: &str, spec: &Spec) -> String {
    if spec.align == Some('=') {
        let len = sign.chars().count() + body.chars().count();
        let fill = spec.fill.unwrap_or(' ');
        let pad: String = std::iter::repeat_n(fill, spec.width.saturating_sub(len)).collect();
        return format!("{sign}{pad}{body}");
    }
    pad(&format!("{sign}{body}"), spec, '>')
}

/// `text` padded to the spec's width with its fill and alignment (`default` when none).
fn pad(text: &str, spec: &Spec, default: char) -> String {
    let len = text.chars().count();
    if spec.width <= len {
        return text.to_owned();
    }
    let fill = spec.fill.unwrap_or(' ');
    let n = spec.width - len;
    let run = |k: usize| std::iter::repeat_n(fill, k).collect::<String>();
    match spec.align.unwrap_or(default) {
        '<' => format!("{text}{}", run(n)),
        '^' => format!("{}{text}{}", run(n / 2), run(n - n / 2)),
        _ => format!("{}{text}", run(n)),
    }
}

/// A precision as a string's maximum length.
fn truncate(text: &str, precision: Option<usize>) -> String {
    match precision {
        Some(p) => text.chars().take(p).collect(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> Spec {
        parse_spec(s).unwrap()
    }

    #[test]
    fn numbers_are_formatted_as_python_formats_them() {
        assert_eq!(format_int(1234567, &spec(",")).unwrap(), "1,234,567");
        assert_eq!(format_int(255, &spec("#x")).unwrap(), "0xff");
        assert_eq!(format_int(12, &spec("=+8")).unwrap(), "+     12");
        assert_eq!(format_int(-12, &spec("08")).unwrap(), "-0000012");
        assert_eq!(format_float(1234.5678, &spec(",.2f")).unwrap(), "1,234.57");
        assert_eq!(format_float(0.31416, &spec(".2%")).unwrap(), "31.42%");
        assert_eq!(format_float(2.5, &spec("g")).unwrap(), "2.5");
        assert_eq!(format_float(1e20, &spec("")).unwrap(), "1e+20");
        assert_eq!(format_float(1e20, &spec(".3")).unwrap(), "1e+20");
        assert_eq!(format_float(2.0, &spec(".3")).unwrap(), "2.0");
        assert_eq!(general(1e-5, 6, false, false), "1e-05");
        assert_eq!(general(123456789.0, 6, false, false), "1.23457e+08");
        assert_eq!(general(1.0, 6, true, false), "1.00000");
        assert_eq!(general(0.0001234, 3, false, false), "0.000123");
        assert_eq!(general(100000.0, 6, false, false), "100000");
        assert_eq!(general(1000000.0, 6, false, false), "1e+06");
        assert_eq!(sci(1.5e3, 6, false), "1.500000e+03");
        assert_eq!(sci(2.5, 0, false), "2e+00");
        assert_eq!(fixed(2.5, 0, false), "2");
        assert_eq!(fixed(2.0, 0, true), "2.");
        assert_eq!(pad("ab", &spec("^7"), '<'), "  ab   ");
    }
}
