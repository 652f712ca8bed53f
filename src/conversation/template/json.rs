//! transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)`, its four options taken by position or by name, written
//! byte for byte as Python's `json` writes it (floats as `repr` writes them, no `\/`, no HTML
//! escaping), and raising where `json.dumps` raises: a value that is no JSON (an undefined
//! value, a generator, a view), an option of the wrong type, a separators value that does not
//! unpack into two. The text is bounded as it is written ([`super::limits`]).

use minijinja::value::{Kwargs, Rest, Value};
use minijinja::{Error, ErrorKind, State};

use super::limits::{Bounded, MAX_DEPTH, reserve};
use super::python::{PyType, as_int, py_cmp, py_type, to_str, type_error, type_name, value_error};

/// How `json.dumps` lays out its output.
pub struct JsonOptions {
    /// The indent of one level (`None`: everything on one line).
    pub indent: Option<String>,
    pub item: String,
    pub key: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

impl Default for JsonOptions {
    fn default() -> Self {
        JsonOptions {
            indent: None,
            item: ", ".into(),
            key: ": ".into(),
            sort_keys: false,
            ensure_ascii: false,
        }
    }
}

/// The filter: `value | tojson(ensure_ascii, indent, separators, sort_keys)`, each also by
/// name. The result is a plain string (transformers' `tojson` returns `str`, not `Markup`).
pub fn tojson(
    state: &State,
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > NAMES.len() {
        return Err(type_error(format!(
            "tojson() takes from 1 to 5 positional arguments but {} were given",
            args.len() + 1
        )));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (i, arg) in args.iter().enumerate() {
        given[i] = Some(arg.clone());
    }
    for (i, name) in NAMES.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            if given[i].is_some() {
                return Err(type_error(format!(
                    "tojson() got multiple values for argument '{name}'"
                )));
            }
            given[i] = Some(v);
        }
    }
    if let Err(e) = kwargs.assert_all_used() {
        return Err(type_error(format!(
            "tojson() got an unexpected keyword argument ({})",
            e.detail().unwrap_or("unknown")
        )));
    }
    let [ensure_ascii, indent, separators, sort_keys] = given;
    let options = options(state, ensure_ascii, indent, separators, sort_keys)?;
    let mut out = Bounded::default();
    python_json(&value, &options, 0, &mut out)?;
    reserve(state, out.text.len() as u128, "tojson")?;
    Ok(Value::from(out.text))
}

/// `json.dumps`'s options from the filter's arguments, checked as Python checks them.
fn options(
    state: &State,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    separators: Option<Value>,
    sort_keys: Option<Value>,
) -> Result<JsonOptions, Error> {
    let mut options = JsonOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        ..JsonOptions::default()
    };
    match indent.as_ref().map(|v| (py_type(v), v)) {
        None | Some((PyType::None, _)) => {}
        Some((PyType::Str | PyType::Markup, v)) => options.indent = Some(to_str(v)?),
        Some((PyType::Int | PyType::Bool, v)) => {
            // `' ' * indent`: a negative indent is none at all, a huge one a MemoryError.
            let n = as_int(v).unwrap_or(0).max(0) as u128;
            reserve(state, n, "tojson's indent")?;
            options.indent = Some(" ".repeat(n as usize));
        }
        Some((_, v)) => {
            return Err(type_error(format!(
                "can't multiply sequence by non-int of type '{}'",
                type_name(v)
            )));
        }
    }
    if options.indent.is_some() {
        // json.dumps: with an indent the item separator loses its trailing space.
        options.item = ",".into();
    }
    if let Some(separators) = separators.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = match py_type(&separators) {
            PyType::Iter | PyType::List | PyType::Tuple | PyType::Str | PyType::Markup => {
                separators.try_iter()?.collect()
            }
            _ => {
                return Err(type_error(format!(
                    "cannot unpack non-iterable {} object",
                    type_name(&separators)
                )));
            }
        };
        match parts.as_slice() {
            [item, key] => {
                for part in [item, key] {
                    if !matches!(py_type(part), PyType::Str | PyType::Markup) {
                        return Err(type_error(format!(
                            "separators must be str, not {}",
                            type_name(part)
                        )));
                    }
                }
                options.item = to_str(item)?;
                options.key = to_str(key)?;
            }
            few if few.len() < 2 => {
                return Err(value_error(format!(
                    "not enough values to unpack (expected 2, got {})",
                    few.len()
                )));
            }
            _ => return Err(value_error("too many values to unpack (expected 2)")),
        }
    }
    Ok(options)
}

/// `value` as Python's `json.dumps` writes it with `options`, appended to `out`.
pub fn python_json(
    value: &Value,
    options: &JsonOptions,
    depth: usize,
    out: &mut Bounded,
) -> Result<(), Error> {
    const WHAT: &str = "tojson";
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "RecursionError: maximum recursion depth exceeded while encoding a JSON object",
        ));
    }
    let newline = |out: &mut Bounded, depth: usize| -> Result<(), Error> {
        if let Some(indent) = &options.indent {
            out.push('\n', WHAT)?;
            for _ in 0..depth {
                out.push_str(indent, WHAT)?;
            }
        }
        Ok(())
    };
    match py_type(value) {
        PyType::None => out.push_str("null", WHAT)?,
        PyType::Bool => out.push_str(if value.is_true() { "true" } else { "false" }, WHAT)?,
        PyType::Int => out.push_str(&value.to_string(), WHAT)?,
        PyType::Float => out.push_str(
            &python_float(f64::try_from(value.clone()).unwrap_or(f64::NAN)),
            WHAT,
        )?,
        PyType::Str | PyType::Markup => {
            python_string(value.as_str().unwrap_or_default(), options, out)?
        }
        PyType::List | PyType::Tuple => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                return out.push_str("[]", WHAT);
            }
            out.push('[', WHAT)?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item, WHAT)?;
                }
                newline(out, depth + 1)?;
                python_json(item, options, depth + 1, out)?;
            }
            newline(out, depth)?;
            out.push(']', WHAT)?;
        }
        PyType::Dict => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                return out.push_str("{}", WHAT);
            }
            if options.sort_keys {
                sort_keys(&mut keys)?;
            }
            out.push('{', WHAT)?;
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item, WHAT)?;
                }
                newline(out, depth + 1)?;
                python_string(&json_key(key)?, options, out)?;
                out.push_str(&options.key, WHAT)?;
                python_json(&value.get_item(key)?, options, depth + 1, out)?;
            }
            newline(out, depth)?;
            out.push('}', WHAT)?;
        }
        _ => {
            return Err(type_error(format!(
                "Object of type {} is not JSON serializable",
                type_name(value)
            )));
        }
    }
    Ok(())
}

/// `sorted(dict.items())`'s key order: keys of types Python cannot order are a `TypeError`.
fn sort_keys(keys: &mut [Value]) -> Result<(), Error> {
    let mut failed = None;
    keys.sort_by(|a, b| {
        py_cmp(a, b, "<").unwrap_or_else(|e| {
            failed.get_or_insert(e);
            std::cmp::Ordering::Equal
        })
    });
    failed.map_or(Ok(()), Err)
}

/// A dict key as `json.dumps` writes it: strings as they are, numbers, `True`/`False`/`None`
/// as their JSON text; any other key is a `TypeError`.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match py_type(key) {
        PyType::Str | PyType::Markup => key.as_str().unwrap_or_default().to_owned(),
        PyType::Int => key.to_string(),
        PyType::Float => python_float(f64::try_from(key.clone()).unwrap_or(f64::NAN)),
        PyType::Bool => if key.is_true() { "true" } else { "false" }.into(),
        PyType::None => "null".into(),
        _ => {
            return Err(type_error(format!(
                "keys must be str, int, float, bool or None, not {}",
                type_name(key)
            )));
        }
    })
}

/// A JSON string as Python's `json` escapes it.
fn python_string(s: &str, options: &JsonOptions, out: &mut Bounded) -> Result<(), Error> {
    const WHAT: &str = "tojson";
    out.push('"', WHAT)?;
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\"", WHAT)?,
            '\\' => out.push_str("\\\\", WHAT)?,
            '\n' => out.push_str("\\n", WHAT)?,
            '\r' => out.push_str("\\r", WHAT)?,
            '\t' => out.push_str("\\t", WHAT)?,
            '\u{8}' => out.push_str("\\b", WHAT)?,
            '\u{c}' => out.push_str("\\f", WHAT)?,
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32), WHAT)?,
            // cardproof's field markers stay raw: they are never in a render it keeps, and a
            // marked render must strip back to the plain one.
            c if options.ensure_ascii
                && (c as u32) > 0x7e
                && !super::super::spans::is_marker(c) =>
            {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"), WHAT)?;
                }
            }
            c => out.push(c, WHAT)?,
        }
    }
    out.push('"', WHAT)
}

/// A float as Python's `repr` (and so `json.dumps`) writes it: the shortest digits that round
/// trip, fixed notation for exponents from −4 to 15, else `1e-05` / `1.5e+16`; `NaN`,
/// `Infinity`, `-Infinity` as `json.dumps` allows them.
pub fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d.ddde±x`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let head = &digits[..1];
        let tail = &digits[1..];
        let mantissa = if tail.is_empty() {
            head.to_string()
        } else {
            format!("{head}.{tail}")
        };
        format!(
            "{sign}{mantissa}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_pythons_repr_writes_them() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (-2.5e-7, "-2.5e-07"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ] {
            assert_eq!(python_float(f), want, "{f}");
        }
    }
}
