//! The Python values a template sees, as jinja2 sees them: what type a minijinja value stands
//! for, Python's `str()` and `repr()` of it, its equality, ordering and hashability, and the
//! errors Python raises, worded as Python words them (`TypeError: 'NoneType' object is not
//! iterable`), so a refusal names the same error transformers would.

use std::cmp::Ordering;
use std::fmt::Display;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::json::python_float;
use super::limits::{Bounded, MAX_DEPTH};
use super::objects::{GroupTuple, IterKind, PyIter, PyMethod, PyRange};

/// The wording every refusal carries: what cardproof cannot render as transformers does.
pub const REFUSAL: &str = "cardproof cannot render this as transformers does";

/// A Python type, as far as a template can tell types apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyType {
    Undefined,
    None,
    Bool,
    Int,
    Float,
    Str,
    /// markupsafe's `Markup` (a `|safe` or `|escape` string).
    Markup,
    List,
    Tuple,
    Dict,
    /// jinja2's `Namespace`.
    Namespace,
    /// A generator, iterator or dict view ([`PyIter`]).
    Iter,
    Range,
    /// A bound method (`message.items` without a call).
    Method,
    /// A macro (or a call block's `caller`).
    Macro,
    /// A `for` loop's `loop`.
    Loop,
    /// Anything else: macros, `loop`, functions.
    Other,
}

/// The Python type `value` stands for.
pub fn py_type(value: &Value) -> PyType {
    match value.kind() {
        ValueKind::Undefined => PyType::Undefined,
        ValueKind::None => PyType::None,
        ValueKind::Bool => PyType::Bool,
        ValueKind::Number if value.is_integer() => PyType::Int,
        ValueKind::Number => PyType::Float,
        ValueKind::String if value.is_safe() => PyType::Markup,
        ValueKind::String => PyType::Str,
        ValueKind::Seq if value.is_tuple() => PyType::Tuple,
        ValueKind::Seq if value.downcast_object_ref::<GroupTuple>().is_some() => PyType::Tuple,
        ValueKind::Seq if value.downcast_object_ref::<PyRange>().is_some() => PyType::Range,
        ValueKind::Seq => PyType::List,
        ValueKind::Map if is_dict(value) => PyType::Dict,
        ValueKind::Map => match static_keys(value) {
            Some(["name", "arguments", "caller"]) => PyType::Macro,
            Some(["index0", ..]) => PyType::Loop,
            _ => PyType::Namespace,
        },
        _ if value.downcast_object_ref::<PyIter>().is_some() => PyType::Iter,
        _ if value.downcast_object_ref::<PyMethod>().is_some() => PyType::Method,
        _ => PyType::Other,
    }
}

/// Whether `value` is a dict (a JSON object or a `{...}` literal), not another mapping-like
/// object such as a namespace.
pub fn is_dict(value: &Value) -> bool {
    value
        .downcast_object_ref::<indexmap::IndexMap<Value, Value>>()
        .is_some()
}

/// The static keys a minijinja object enumerates: its macros enumerate `name`, `arguments`
/// and `caller`, its `loop` `index0`, `index`, ...; a namespace enumerates its values' keys.
fn static_keys(value: &Value) -> Option<&'static [&'static str]> {
    match value.as_object()?.enumerate() {
        minijinja::value::Enumerator::Str(keys) => Some(keys),
        _ => None,
    }
}

/// The name Python gives `value`'s type in its messages.
pub fn type_name(value: &Value) -> String {
    match py_type(value) {
        PyType::Undefined => "Undefined".into(),
        PyType::None => "NoneType".into(),
        PyType::Bool => "bool".into(),
        PyType::Int => "int".into(),
        PyType::Float => "float".into(),
        PyType::Str => "str".into(),
        PyType::Markup => "Markup".into(),
        PyType::List => "list".into(),
        PyType::Tuple => "tuple".into(),
        PyType::Dict => "dict".into(),
        PyType::Namespace => "Namespace".into(),
        PyType::Range => "range".into(),
        PyType::Iter => value
            .downcast_object_ref::<PyIter>()
            .map_or("generator", |i| i.kind.type_name())
            .into(),
        PyType::Method => "builtin_function_or_method".into(),
        PyType::Macro => "Macro".into(),
        PyType::Loop => "LoopContext".into(),
        PyType::Other => "object".into(),
    }
}

/// Python's `TypeError`.
pub fn type_error(message: impl Display) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("TypeError: {message}"))
}

/// Python's `ValueError`.
pub fn value_error(message: impl Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("ValueError: {message}"),
    )
}

/// jinja2's `UndefinedError`, raised when an undefined value is used rather than tested.
pub fn undefined_error(what: impl Display) -> Error {
    Error::new(ErrorKind::UndefinedError, format!("UndefinedError: {what}"))
}

/// jinja2's sandbox refusing a method that changes a value.
pub fn security_error(method: &str, value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "SecurityError: access to attribute '{method}' of '{}' object is unsafe.",
            type_name(value)
        ),
    )
}

/// A construct whose jinja2 text cardproof cannot write, refused by name.
pub fn refusal(construct: impl Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("{REFUSAL}: {construct}"),
    )
}

/// `value` as an integer, if it is a Python int (a bool counts, as in Python's arithmetic).
pub fn as_int(value: &Value) -> Option<i128> {
    match value.kind() {
        ValueKind::Bool => Some(i128::from(value.is_true())),
        ValueKind::Number if value.is_integer() => i128::try_from(value.clone()).ok(),
        _ => None,
    }
}

/// `value` as a float, if it is a Python number (int, float or bool).
pub fn as_number(value: &Value) -> Option<f64> {
    match value.kind() {
        ValueKind::Bool => Some(f64::from(u8::from(value.is_true()))),
        ValueKind::Number => f64::try_from(value.clone()).ok(),
        _ => None,
    }
}

/// Python's `str(value)`, appended to `out`.
pub fn py_str(value: &Value, out: &mut Bounded) -> Result<(), Error> {
    match py_type(value) {
        PyType::Undefined => Ok(()),
        PyType::Str | PyType::Markup => out.push_str(value.as_str().unwrap_or_default(), "str()"),
        PyType::Float => out.push_str(&float_str(value), "str()"),
        _ => py_repr(value, out, 0),
    }
}

/// Python's `str(value)` as a string.
pub fn to_str(value: &Value) -> Result<String, Error> {
    let mut out = Bounded::default();
    py_str(value, &mut out)?;
    Ok(out.text)
}

/// Python's `repr(value)` as a string.
pub fn to_repr(value: &Value) -> Result<String, Error> {
    let mut out = Bounded::default();
    py_repr(value, &mut out, 0)?;
    Ok(out.text)
}

/// A float as Python's `str()` writes it (`nan`, `inf` where JSON writes `NaN`, `Infinity`).
fn float_str(value: &Value) -> String {
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        python_float(f)
    }
}

/// Python's `repr(value)`, appended to `out`. Objects whose repr holds a memory address
/// (generators, methods, macros) are refused: their text differs on every run.
pub fn py_repr(value: &Value, out: &mut Bounded, depth: usize) -> Result<(), Error> {
    const WHAT: &str = "repr()";
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "RecursionError: maximum recursion depth exceeded while getting the repr of an object",
        ));
    }
    match py_type(value) {
        PyType::Undefined => out.push_str("Undefined", WHAT),
        PyType::None => out.push_str("None", WHAT),
        PyType::Bool => out.push_str(if value.is_true() { "True" } else { "False" }, WHAT),
        PyType::Int => out.push_str(&value.to_string(), WHAT),
        PyType::Float => out.push_str(&float_str(value), WHAT),
        PyType::Str => string_repr(value.as_str().unwrap_or_default(), out),
        PyType::Markup => {
            out.push_str("Markup(", WHAT)?;
            string_repr(value.as_str().unwrap_or_default(), out)?;
            out.push_str(")", WHAT)
        }
        PyType::List | PyType::Tuple => {
            let tuple = py_type(value) == PyType::Tuple;
            out.push_str(if tuple { "(" } else { "[" }, WHAT)?;
            let mut n = 0;
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ", WHAT)?;
                }
                py_repr(&item, out, depth + 1)?;
                n += 1;
            }
            if tuple && n == 1 {
                out.push_str(",", WHAT)?;
            }
            out.push_str(if tuple { ")" } else { "]" }, WHAT)
        }
        PyType::Dict => {
            out.push_str("{", WHAT)?;
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ", WHAT)?;
                }
                py_repr(&key, out, depth + 1)?;
                out.push_str(": ", WHAT)?;
                py_repr(&value.get_item(&key)?, out, depth + 1)?;
            }
            out.push_str("}", WHAT)
        }
        PyType::Range => {
            let r = value.downcast_object_ref::<PyRange>().expect("a range");
            out.push_str(&r.repr(), WHAT)
        }
        PyType::Iter => {
            let iter = value.downcast_object_ref::<PyIter>().expect("an iterator");
            match iter.kind.view_name() {
                Some(name) => {
                    out.push_str(name, WHAT)?;
                    out.push_str("([", WHAT)?;
                    for (i, item) in iter.peek().iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ", WHAT)?;
                        }
                        py_repr(item, out, depth + 1)?;
                    }
                    out.push_str("])", WHAT)
                }
                None => Err(address(&type_name(value))),
            }
        }
        PyType::Namespace => {
            out.push_str("<Namespace {", WHAT)?;
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ", WHAT)?;
                }
                py_repr(&key, out, depth + 1)?;
                out.push_str(": ", WHAT)?;
                py_repr(&value.get_item(&key)?, out, depth + 1)?;
            }
            out.push_str("}>", WHAT)
        }
        PyType::Method => Err(address("builtin method")),
        // jinja2's `LoopContext.__repr__`.
        PyType::Loop => out.push_str(
            &format!(
                "<LoopContext {}/{}>",
                value.get_attr("index")?,
                value.get_attr("length")?
            ),
            WHAT,
        ),
        // jinja2's `Macro.__repr__`.
        PyType::Macro => {
            // A call block's `caller` has no name in jinja2.
            let name = value.get_attr("name")?.to_string();
            if name == "caller" {
                return out.push_str("<Macro anonymous>", WHAT);
            }
            out.push_str("<Macro ", WHAT)?;
            string_repr(&name, out)?;
            out.push_str(">", WHAT)
        }
        PyType::Other => Err(address(&format!("{} object", value.kind()))),
    }
}

/// The refusal for printing an object whose Python text is its memory address.
fn address(what: &str) -> Error {
    refusal(format!(
        "the template writes a {what}, which Python prints with its memory address (`<... at 0x...>`), different on every run"
    ))
}

/// A string as Python's `repr` writes it: single quotes unless the string holds a single quote
/// and no double one, backslash escapes for the quote, `\\`, `\t`, `\n`, `\r`, and `\x..`,
/// `\u....` or `\U........` for every character Python does not print.
fn string_repr(s: &str, out: &mut Bounded) -> Result<(), Error> {
    const WHAT: &str = "repr()";
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote, WHAT)?;
    for c in s.chars() {
        match c {
            c if c == quote || c == '\\' => {
                out.push('\\', WHAT)?;
                out.push(c, WHAT)?;
            }
            '\t' => out.push_str("\\t", WHAT)?,
            '\n' => out.push_str("\\n", WHAT)?,
            '\r' => out.push_str("\\r", WHAT)?,
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32), WHAT)?
            }
            // cardproof's field markers stay raw, as in `tojson`: they are never in a render it
            // keeps, and a marked render must strip back to the plain one.
            c if (c as u32) < 0x7f || is_printable(c) || super::super::spans::is_marker(c) => {
                out.push(c, WHAT)?
            }
            c if (c as u32) <= 0xff => out.push_str(&format!("\\x{:02x}", c as u32), WHAT)?,
            c if (c as u32) <= 0xffff => out.push_str(&format!("\\u{:04x}", c as u32), WHAT)?,
            c => out.push_str(&format!("\\U{:08x}", c as u32), WHAT)?,
        }
    }
    out.push(quote, WHAT)
}

/// Python's `str.isprintable()` for one character: not a control, format, surrogate,
/// private-use or unassigned character, and not a separator other than the space.
pub fn is_printable(c: char) -> bool {
    use unicode_general_category::{GeneralCategory as G, get_general_category};
    if c == ' ' {
        return true;
    }
    !matches!(
        get_general_category(c),
        G::Control
            | G::Format
            | G::Surrogate
            | G::PrivateUse
            | G::Unassigned
            | G::LineSeparator
            | G::ParagraphSeparator
            | G::SpaceSeparator
    )
}

/// Python's `==` (which never raises): numbers by value (`True == 1 == 1.0`), strings by text,
/// lists and tuples item by item (a list never equals a tuple), dicts by their items
/// whatever the order, `None` only to `None`, an undefined value only to another.
pub fn py_eq(a: &Value, b: &Value) -> bool {
    py_eq_at(a, b, 0)
}

fn py_eq_at(a: &Value, b: &Value, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let (ta, tb) = (py_type(a), py_type(b));
    match (ta, tb) {
        (
            PyType::Bool | PyType::Int | PyType::Float,
            PyType::Bool | PyType::Int | PyType::Float,
        ) => match (as_int(a), as_int(b)) {
            (Some(x), Some(y)) => x == y,
            _ => as_number(a) == as_number(b),
        },
        (PyType::Str | PyType::Markup, PyType::Str | PyType::Markup) => a.as_str() == b.as_str(),
        (PyType::List, PyType::List) | (PyType::Tuple, PyType::Tuple) => {
            a.len() == b.len()
                && match (a.try_iter(), b.try_iter()) {
                    (Ok(x), Ok(y)) => x.zip(y).all(|(x, y)| py_eq_at(&x, &y, depth + 1)),
                    _ => false,
                }
        }
        (PyType::Dict, PyType::Dict) => {
            a.len() == b.len()
                && a.try_iter().is_ok_and(|mut keys| {
                    keys.all(|k| match (dict_get(a, &k), dict_get(b, &k)) {
                        (Some(x), Some(y)) => py_eq_at(&x, &y, depth + 1),
                        _ => false,
                    })
                })
        }
        (PyType::None, PyType::None) | (PyType::Undefined, PyType::Undefined) => true,
        (PyType::Iter, PyType::Iter) => {
            let (x, y) = (
                a.downcast_object::<PyIter>().expect("an iterator"),
                b.downcast_object::<PyIter>().expect("an iterator"),
            );
            // `dict.keys()` and `dict.items()` compare as sets; other iterators (and values
            // views) only equal themselves.
            let set_like = |k: IterKind| matches!(k, IterKind::Keys | IterKind::Items);
            if set_like(x.kind) && set_like(y.kind) {
                let (xs, ys) = (x.peek(), y.peek());
                xs.len() == ys.len()
                    && xs
                        .iter()
                        .all(|v| ys.iter().any(|w| py_eq_at(v, w, depth + 1)))
            } else {
                std::sync::Arc::ptr_eq(&x, &y)
            }
        }
        (PyType::Range, PyType::Range) => {
            let (x, y) = (
                a.downcast_object_ref::<PyRange>().expect("a range"),
                b.downcast_object_ref::<PyRange>().expect("a range"),
            );
            x.items().eq(y.items())
        }
        // Other objects (namespaces, macros, iterators) are equal only to themselves.
        _ => ta == tb && a.as_object().is_some() && a == b,
    }
}

/// A dict's value for `key` as Python looks it up: by hash equality, so `1`, `1.0` and `True`
/// are the same key.
pub fn dict_get(dict: &Value, key: &Value) -> Option<Value> {
    if let Ok(value) = dict.get_item(key)
        && !value.is_undefined()
    {
        return Some(value);
    }
    // A miss by minijinja's key: the same key by Python's hash equality, or a key whose value
    // is itself undefined.
    let found = dict.try_iter().ok()?.find(|k| py_eq(k, key))?;
    dict.get_item(&found).ok()
}

/// Python's `hash()` check: lists, dicts and other mutable values cannot be dict keys or set
/// members.
pub fn check_hashable(value: &Value) -> Result<(), Error> {
    match py_type(value) {
        PyType::List | PyType::Dict | PyType::Namespace => Err(type_error(format!(
            "unhashable type: '{}'",
            type_name(value)
        ))),
        PyType::Tuple => {
            for item in value.try_iter()? {
                check_hashable(&item)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Python's ordering of two values (`<`, `sorted`, `min`): numbers by value, strings by code
/// point, lists and tuples item by item; anything else, `None` included, is a `TypeError`, and
/// an undefined value an `UndefinedError`.
pub fn py_cmp(a: &Value, b: &Value, op: &str) -> Result<Ordering, Error> {
    py_cmp_at(a, b, op, 0)
}

fn py_cmp_at(a: &Value, b: &Value, op: &str, depth: usize) -> Result<Ordering, Error> {
    if depth > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "RecursionError: maximum recursion depth exceeded in comparison",
        ));
    }
    let (ta, tb) = (py_type(a), py_type(b));
    if ta == PyType::Undefined || tb == PyType::Undefined {
        return Err(undefined_error(format!(
            "an undefined value is compared with '{op}'"
        )));
    }
    match (ta, tb) {
        (
            PyType::Bool | PyType::Int | PyType::Float,
            PyType::Bool | PyType::Int | PyType::Float,
        ) => {
            Ok(match (as_int(a), as_int(b)) {
                (Some(x), Some(y)) => x.cmp(&y),
                // NaN compares false every way: `Equal` reads as "not less, not greater", and
                // callers test `<=`/`>=` through `py_le`.
                _ => as_number(a)
                    .partial_cmp(&as_number(b))
                    .unwrap_or(Ordering::Equal),
            })
        }
        (PyType::Str | PyType::Markup, PyType::Str | PyType::Markup) => {
            Ok(a.as_str().cmp(&b.as_str()))
        }
        (PyType::List, PyType::List) | (PyType::Tuple, PyType::Tuple) => {
            let (xs, ys): (Vec<Value>, Vec<Value>) =
                (a.try_iter()?.collect(), b.try_iter()?.collect());
            for (x, y) in xs.iter().zip(&ys) {
                if !py_eq(x, y) {
                    return py_cmp_at(x, y, op, depth + 1);
                }
            }
            Ok(xs.len().cmp(&ys.len()))
        }
        _ => Err(type_error(format!(
            "'{op}' not supported between instances of '{}' and '{}'",
            type_name(a),
            type_name(b)
        ))),
    }
}

/// Python's `a <op> b` for an ordering operator, NaN included (every comparison with NaN is
/// false).
pub fn py_compare(a: &Value, b: &Value, op: &str) -> Result<bool, Error> {
    let ordering = py_cmp(a, b, op)?;
    let nan = [a, b]
        .iter()
        .any(|v| py_type(v) == PyType::Float && as_number(v).is_some_and(f64::is_nan));
    if nan {
        return Ok(false);
    }
    Ok(match op {
        "<" => ordering == Ordering::Less,
        "<=" => ordering != Ordering::Greater,
        ">" => ordering == Ordering::Greater,
        ">=" => ordering != Ordering::Less,
        _ => unreachable!("an ordering operator"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repr_writes_pythons_quotes_escapes_and_floats() {
        let v = Value::from(minijinja::value::Serde(serde_json::json!([
            "it's",
            "say \"hi\"",
            "both ' \"",
            "\u{7}\u{a0}\u{200b}é😀\u{7f}\n",
            1e-5,
            1e16,
            2.5,
            null,
            true
        ])));
        assert_eq!(
            to_repr(&v).unwrap(),
            r#"["it's", 'say "hi"', 'both \' "', '\x07\xa0\u200bé😀\x7f\n', 1e-05, 1e+16, 2.5, None, True]"#
        );
        assert_eq!(to_str(&Value::from(f64::INFINITY)).unwrap(), "inf");
        assert_eq!(to_str(&Value::UNDEFINED).unwrap(), "");
    }

    #[test]
    fn ordering_across_types_is_a_type_error_as_in_python() {
        let e = py_cmp(&Value::from(1), &Value::from("a"), "<").unwrap_err();
        assert!(
            e.to_string()
                .contains("'<' not supported between instances of 'int' and 'str'")
        );
        assert!(py_cmp(&Value::from(()), &Value::from(1), "<").is_err());
        assert!(py_compare(&Value::from(1), &Value::from(1.5), "<").unwrap());
        assert!(!py_compare(&Value::from(f64::NAN), &Value::from(1), "<=").unwrap());
        assert!(py_eq(&Value::from(true), &Value::from(1.0)));
    }
}
