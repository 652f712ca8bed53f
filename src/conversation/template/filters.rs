//! jinja2's filters where minijinja's differ, written from jinja2's source: what each does with
//! `None` (`None | length` and `None | join` raise), with an undefined value (empty), with
//! generators (no length, not reversible), with `Markup`; Python's `str()` of the items
//! `join` and `string` write; `indent` keeping a trailing newline; `sort`, `min`, `max` and
//! `unique` comparing as Python compares (mixed types raise). minijinja's own `map`,
//! `select`, `reject`, `selectattr`, `rejectattr`, `batch`, `slice`, `groupby` and `default`
//! are kept; the rewrite makes the first five return generators. Every result is bounded.

use std::cmp::Ordering;

use minijinja::value::{Kwargs, Rest, Value};
use minijinja::{Environment, Error, ErrorKind, State};

use super::json::tojson;
use super::limits::{Bounded, reserve, reserve_items};
use super::methods;
use super::objects::{IterKind, PyIter};
use super::python::{
    PyType, as_int, as_number, check_hashable, py_cmp, py_str, py_type, to_str, type_error,
    type_name,
};
use super::strings;

/// The filters jinja2 has that the environment answers (the rewrite refuses any other name:
/// jinja2 knows none, or cardproof does not write it as jinja2 does).
pub const IMPLEMENTED: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "capitalize",
    "center",
    "count",
    "d",
    "default",
    "dictsort",
    "e",
    "escape",
    "first",
    "float",
    "forceescape",
    "format",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "string",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
];

/// jinja2's filters cardproof does not implement: a template using one is refused by name.
pub const NOT_IMPLEMENTED: &[&str] = &[
    "filesizeformat",
    "pprint",
    "random",
    "striptags",
    "truncate",
    "urlencode",
    "urlize",
    "wordcount",
    "wordwrap",
    "xmlattr",
];

/// minijinja's filters that nest their operand's items one level deeper.
pub const NESTING: &[&str] = &["batch", "slice", "groupby"];

/// The filters that return a generator in jinja2 and a list in minijinja.
pub const GENERATORS: &[&str] = &[
    "map",
    "select",
    "reject",
    "selectattr",
    "rejectattr",
    "batch",
    "slice",
];

/// Registers the filters over minijinja's.
pub fn register(env: &mut Environment<'_>) {
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("join", join);
    env.add_filter("first", first);
    env.add_filter("last", last);
    env.add_filter("list", list);
    env.add_filter("string", string);
    env.add_filter("safe", |v: Value| -> Result<Value, Error> {
        Ok(Value::from_safe_string(to_str(&v)?))
    });
    env.add_filter("escape", escape);
    env.add_filter("e", escape);
    env.add_filter("forceescape", |v: Value| -> Result<Value, Error> {
        Ok(Value::from_safe_string(strings::escape_html(&to_str(&v)?)))
    });
    env.add_filter("trim", trim);
    env.add_filter("upper", |s: &State, v: Value| {
        soft_map(s, v, |t| Ok(t.to_uppercase()))
    });
    env.add_filter("lower", |s: &State, v: Value| {
        soft_map(s, v, |t| Ok(t.to_lowercase()))
    });
    env.add_filter("capitalize", |s: &State, v: Value| {
        soft_map(s, v, strings::capitalize)
    });
    env.add_filter("title", |s: &State, v: Value| {
        soft_map(s, v, |t| Ok(strings::jinja_title(t)))
    });
    env.add_filter("replace", replace);
    env.add_filter("center", center);
    env.add_filter("indent", indent);
    env.add_filter("tojson", tojson);
    env.add_filter("items", items);
    env.add_filter("reverse", reverse);
    env.add_filter("sort", sort);
    env.add_filter("unique", unique);
    env.add_filter("min", |v: Value, a: Rest<Value>, k: Kwargs| {
        min_max(v, a, k, Ordering::Less)
    });
    env.add_filter("max", |v: Value, a: Rest<Value>, k: Kwargs| {
        min_max(v, a, k, Ordering::Greater)
    });
    env.add_filter("sum", sum);
    env.add_filter("dictsort", dictsort);
    env.add_filter("int", int);
    env.add_filter("float", float);
    env.add_filter("round", round);
    env.add_filter("abs", abs);
    env.add_filter("attr", attr);
    env.add_filter("format", format);
    env.add_filter("groupby", groupby);
    env.add_filter("default", default);
    env.add_filter("d", default);
}

/// A filter's arguments after its operand, by position or by name as Python binds them:
/// `names` in order; a name given twice, an unknown name or too many are `TypeError`s.
fn params(
    filter: &str,
    args: &[Value],
    kwargs: &Kwargs,
    names: &[&str],
) -> Result<Vec<Option<Value>>, Error> {
    if args.len() > names.len() {
        return Err(type_error(format!(
            "{filter}() takes at most {} arguments ({} given)",
            names.len() + 1,
            args.len() + 1
        )));
    }
    let mut out: Vec<Option<Value>> = names.iter().map(|_| None).collect();
    for (i, a) in args.iter().enumerate() {
        out[i] = Some(a.clone());
    }
    for (i, name) in names.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            if out[i].is_some() {
                return Err(type_error(format!(
                    "{filter}() got multiple values for argument '{name}'"
                )));
            }
            out[i] = Some(v);
        }
    }
    if let Some(unknown) = kwargs.args().find(|k| !names.contains(k)) {
        return Err(type_error(format!(
            "{filter}() got an unexpected keyword argument '{unknown}'"
        )));
    }
    kwargs.assert_all_used()?;
    Ok(out)
}

/// A parameter's truth (`None` when absent).
fn flag(v: &Option<Value>) -> bool {
    v.as_ref().is_some_and(|v| v.is_true())
}

/// A string parameter (an absent or `None` one is `None`).
fn text_param(v: &Option<Value>) -> Result<Option<String>, Error> {
    match v {
        Some(v) if !v.is_none() && !v.is_undefined() => to_str(v).map(Some),
        _ => Ok(None),
    }
}

/// The items of a value a filter iterates: `None` and other non-iterables are Python's
/// `TypeError`, an undefined value is empty, a generator is consumed.
fn iterate(value: &Value) -> Result<Vec<Value>, Error> {
    match py_type(value) {
        PyType::Undefined => Ok(Vec::new()),
        PyType::Iter => Ok(value
            .downcast_object_ref::<PyIter>()
            .expect("an iterator")
            .take()),
        PyType::Str
        | PyType::Markup
        | PyType::List
        | PyType::Tuple
        | PyType::Dict
        | PyType::Range => Ok(value.try_iter()?.collect()),
        _ => Err(type_error(format!(
            "'{}' object is not iterable",
            type_name(value)
        ))),
    }
}

/// `length` / `count`: Python's `len()`; an undefined value is 0.
fn length(value: Value) -> Result<Value, Error> {
    match py_type(&value) {
        PyType::Undefined => Ok(Value::from(0)),
        PyType::Str | PyType::Markup => Ok(Value::from(
            value.as_str().unwrap_or_default().chars().count(),
        )),
        PyType::List | PyType::Tuple | PyType::Dict | PyType::Range => {
            Ok(Value::from(value.len().unwrap_or(0)))
        }
        PyType::Iter => value
            .downcast_object_ref::<PyIter>()
            .and_then(PyIter::len)
            .map(Value::from)
            .ok_or_else(|| {
                type_error(format!(
                    "object of type '{}' has no len()",
                    type_name(&value)
                ))
            }),
        _ => Err(type_error(format!(
            "object of type '{}' has no len()",
            type_name(&value)
        ))),
    }
}

/// A `attribute=` lookup as jinja2's `make_attrgetter` does it: dotted parts, integer parts as
/// indices, undefined when missing.
fn lookup(item: &Value, attribute: &str) -> Result<Value, Error> {
    let mut v = item.clone();
    for part in attribute.split('.') {
        v = match part.parse::<i64>() {
            Ok(i) => v.get_item(&Value::from(i)).unwrap_or(Value::UNDEFINED),
            Err(_) => v.get_item(&Value::from(part)).unwrap_or(Value::UNDEFINED),
        };
    }
    Ok(v)
}

/// `join(d='', attribute=None)`: `str(d).join(map(str, value))`, a plain string.
fn join(state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let p = params("join", &args, &kwargs, &["d", "attribute"])?;
    let attribute = text_param(&p[1])?;
    let sep = p[0].as_ref().map(to_str).transpose()?.unwrap_or_default();
    let mut out = Bounded::default();
    for (i, item) in iterate(&value)?.iter().enumerate() {
        if i > 0 {
            out.push_str(&sep, "join")?;
        }
        let item = match &attribute {
            Some(a) => lookup(item, a)?,
            None => item.clone(),
        };
        py_str(&item, &mut out)?;
    }
    reserve(state, out.text.len() as u128, "join")?;
    Ok(Value::from(out.text))
}

/// `first`: `next(iter(value))`, undefined when empty.
fn first(value: Value) -> Result<Value, Error> {
    match py_type(&value) {
        PyType::Undefined => Ok(Value::UNDEFINED),
        PyType::Iter => Ok(value
            .downcast_object_ref::<PyIter>()
            .expect("an iterator")
            .next()
            .unwrap_or(Value::UNDEFINED)),
        _ => Ok(iterate(&value)?
            .into_iter()
            .next()
            .unwrap_or(Value::UNDEFINED)),
    }
}

/// `last`: `next(iter(reversed(value)))`; a generator is not reversible.
fn last(value: Value) -> Result<Value, Error> {
    match py_type(&value) {
        PyType::Undefined => Ok(Value::UNDEFINED),
        PyType::Iter
            if !value
                .downcast_object_ref::<PyIter>()
                .expect("an iterator")
                .kind
                .is_view() =>
        {
            Err(type_error(format!(
                "'{}' object is not reversible",
                type_name(&value)
            )))
        }
        PyType::Str
        | PyType::Markup
        | PyType::List
        | PyType::Tuple
        | PyType::Dict
        | PyType::Range
        | PyType::Iter => Ok(iterate(&value)?.pop().unwrap_or(Value::UNDEFINED)),
        _ => Err(type_error(format!(
            "'{}' object is not reversible",
            type_name(&value)
        ))),
    }
}

/// `list`.
fn list(state: &State, value: Value) -> Result<Value, Error> {
    let items = iterate(&value)?;
    reserve_items(state, items.len() as u128, "list")?;
    Ok(Value::from(items))
}

/// `string`: `soft_str`, which keeps a `Markup`.
fn string(value: Value) -> Result<Value, Error> {
    if py_type(&value) == PyType::Markup {
        return Ok(value);
    }
    Ok(Value::from(to_str(&value)?))
}

/// `escape`: markupsafe's, a `Markup` unchanged.
fn escape(value: Value) -> Result<Value, Error> {
    if py_type(&value) == PyType::Markup {
        return Ok(value);
    }
    Ok(Value::from_safe_string(strings::escape_html(&to_str(
        &value,
    )?)))
}

/// A string filter applied to `soft_str(value)`, keeping a `Markup` a `Markup`.
fn soft_map(
    state: &State,
    value: Value,
    f: impl Fn(&str) -> Result<String, Error>,
) -> Result<Value, Error> {
    let text = to_str(&value)?;
    reserve(state, text.len() as u128 * 3, "a string filter")?;
    let out = f(&text)?;
    Ok(if py_type(&value) == PyType::Markup {
        Value::from_safe_string(out)
    } else {
        Value::from(out)
    })
}

/// `trim(chars=None)`.
fn trim(state: &State, value: Value, chars: Option<Value>) -> Result<Value, Error> {
    let chars = chars
        .filter(|c| !c.is_none())
        .map(|c| to_str(&c))
        .transpose()?;
    soft_map(state, value, |t| {
        Ok(strings::strip(t, chars.as_deref(), true, true).to_owned())
    })
}

/// `replace(old, new, count=None)`: with autoescaping off, `str(s).replace(...)`.
fn replace(
    state: &State,
    value: Value,
    old: Value,
    new: Value,
    count: Option<Value>,
) -> Result<Value, Error> {
    let count = count
        .and_then(|c| as_int(&c))
        .map_or(-1, |c| c.clamp(-1, i128::from(i64::MAX)) as i64);
    let out = methods::replace(
        state,
        &to_str(&value)?,
        &to_str(&old)?,
        &to_str(&new)?,
        count,
    )?;
    Ok(Value::from(out))
}

/// `center(width=80)`.
fn center(state: &State, value: Value, width: Option<Value>) -> Result<Value, Error> {
    let width = match width {
        Some(w) => as_int(&w).ok_or_else(|| {
            type_error(format!(
                "'{}' object cannot be interpreted as an integer",
                type_name(&w)
            ))
        })?,
        None => 80,
    };
    let width = width.max(0) as u128;
    reserve(state, width, "center")?;
    Ok(Value::from(strings::center(
        &to_str(&value)?,
        width as usize,
        ' ',
    )))
}

/// `indent(width=4, first=False, blank=False)` as jinja2 writes it: a trailing newline is kept
/// (`'{\n' | indent(4, first=true)` is `"    {\n"`), lines split where Python splits them,
/// `width` a number of spaces or a string.
fn indent(state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut given: [Option<Value>; 3] = Default::default();
    if args.len() > 3 {
        return Err(type_error("indent() takes at most 4 arguments"));
    }
    for (i, a) in args.iter().enumerate() {
        given[i] = Some(a.clone());
    }
    for (i, name) in ["width", "first", "blank"].iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            given[i] = Some(v);
        }
    }
    kwargs.assert_all_used()?;
    let [width, first, blank] = given;
    let indention = match width.as_ref().map(|w| (py_type(w), w)) {
        None => "    ".to_owned(),
        Some((PyType::Str | PyType::Markup, w)) => to_str(w)?,
        Some((_, w)) => {
            let n = as_int(w).ok_or_else(|| {
                type_error(format!(
                    "can't multiply sequence by non-int of type '{}'",
                    type_name(w)
                ))
            })?;
            let n = n.max(0) as u128;
            reserve(state, n, "indent")?;
            " ".repeat(n as usize)
        }
    };
    let (first, blank) = (
        first.is_some_and(|v| v.is_true()),
        blank.is_some_and(|v| v.is_true()),
    );
    let text = to_str(&value)?;
    // `s += "\n"` then `splitlines()`: the added newline keeps a trailing one.
    let lines = strings::splitlines(&format!("{text}\n"), false);
    let line_count = lines.len() as u128;
    reserve(
        state,
        text.len() as u128 + line_count * (indention.len() as u128 + 1),
        "indent",
    )?;
    let mut out = String::new();
    if blank {
        out = lines.join(&format!("\n{indention}"));
    } else {
        let mut it = lines.iter();
        out.push_str(it.next().map_or("", String::as_str));
        let rest: Vec<String> = it
            .map(|l| {
                if l.is_empty() {
                    String::new()
                } else {
                    format!("{indention}{l}")
                }
            })
            .collect();
        if !rest.is_empty() {
            out.push('\n');
            out.push_str(&rest.join("\n"));
        }
    }
    if first {
        out = format!("{indention}{out}");
    }
    Ok(if py_type(&value) == PyType::Markup {
        Value::from_safe_string(out)
    } else {
        Value::from(out)
    })
}

/// `items`: a generator of a mapping's `(key, value)` pairs; an undefined value gives none.
fn items(state: &State, value: Value) -> Result<Value, Error> {
    match py_type(&value) {
        PyType::Undefined => Ok(PyIter::value(IterKind::Generator, Vec::new())),
        PyType::Dict => {
            reserve_items(state, value.len().unwrap_or(0) as u128 * 3, "items")?;
            let pairs = value
                .try_iter()?
                .map(|k| {
                    Ok(Value::from(minijinja::value::Tuple::from(vec![
                        k.clone(),
                        value.get_item(&k)?,
                    ])))
                })
                .collect::<Result<Vec<_>, Error>>()?;
            Ok(PyIter::value(IterKind::Generator, pairs))
        }
        _ => Err(type_error("Can only get item pairs from a mapping.")),
    }
}

/// `reverse`: a reversed string; `reversed(value)` where Python can reverse it (an iterator,
/// printed only by its address); else the items as a reversed list.
fn reverse(state: &State, value: Value) -> Result<Value, Error> {
    match py_type(&value) {
        PyType::Str | PyType::Markup => {
            let out: String = value.as_str().unwrap_or_default().chars().rev().collect();
            Ok(if value.is_safe() {
                Value::from_safe_string(out)
            } else {
                Value::from(out)
            })
        }
        PyType::List | PyType::Tuple | PyType::Dict | PyType::Range | PyType::Undefined => {
            let mut items = iterate_kept(state, &value, "reverse")?;
            items.reverse();
            Ok(PyIter::value(IterKind::ListReverse, items))
        }
        PyType::Iter => {
            let iter = value.downcast_object_ref::<PyIter>().expect("an iterator");
            let mut items = iter.take();
            items.reverse();
            Ok(if iter.kind.is_view() {
                PyIter::value(IterKind::ListReverse, items)
            } else {
                Value::from(items)
            })
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "FilterArgumentError: argument must be iterable",
        )),
    }
}

/// The sort key jinja2 uses: the `attribute` (comma-separated: several keys), strings lower
/// cased unless `case_sensitive`.
fn sort_key(item: &Value, attribute: Option<&str>, case_sensitive: bool) -> Result<Value, Error> {
    let fold = |v: Value| -> Value {
        if !case_sensitive && matches!(py_type(&v), PyType::Str | PyType::Markup) {
            Value::from(v.as_str().unwrap_or_default().to_lowercase())
        } else {
            v
        }
    };
    match attribute {
        None => Ok(fold(item.clone())),
        Some(a) if a.contains(',') => {
            let keys = a
                .split(',')
                .map(|p| lookup(item, p.trim()).map(fold))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::from(minijinja::value::Tuple::from(keys)))
        }
        Some(a) => lookup(item, a).map(fold),
    }
}

/// Sorts `pairs` by key as Python's stable `sorted` does; a comparison Python cannot make is
/// its `TypeError`.
fn sort_by_key(pairs: &mut [(Value, Value)], reverse: bool) -> Result<(), Error> {
    let mut failed = None;
    pairs.sort_by(|(a, _), (b, _)| {
        let o = py_cmp(a, b, "<").unwrap_or_else(|e| {
            failed.get_or_insert(e);
            Ordering::Equal
        });
        if reverse { o.reverse() } else { o }
    });
    failed.map_or(Ok(()), Err)
}

/// `sort(reverse=False, case_sensitive=False, attribute=None)`: a list.
fn sort(state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let p = params(
        "sort",
        &args,
        &kwargs,
        &["reverse", "case_sensitive", "attribute"],
    )?;
    let (reverse, case_sensitive, attribute) = (flag(&p[0]), flag(&p[1]), text_param(&p[2])?);
    let mut pairs = iterate_kept(state, &value, "sort")?
        .into_iter()
        .map(|v| Ok((sort_key(&v, attribute.as_deref(), case_sensitive)?, v)))
        .collect::<Result<Vec<_>, Error>>()?;
    sort_by_key(&mut pairs, reverse)?;
    Ok(Value::from(
        pairs.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    ))
}

/// The items a filter iterates, charged as the copy it keeps.
fn iterate_kept(state: &State, value: &Value, what: &str) -> Result<Vec<Value>, Error> {
    let items = iterate(value)?;
    reserve_items(state, items.len() as u128, what)?;
    Ok(items)
}

/// `unique(case_sensitive=False, attribute=None)`: a generator of the first of each key.
fn unique(state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let p = params("unique", &args, &kwargs, &["case_sensitive", "attribute"])?;
    let (case_sensitive, attribute) = (flag(&p[0]), text_param(&p[1])?);
    let mut seen: Vec<Value> = Vec::new();
    let mut out = Vec::new();
    for item in iterate_kept(state, &value, "unique")? {
        let key = sort_key(&item, attribute.as_deref(), case_sensitive)?;
        check_hashable(&key)?;
        if !seen.iter().any(|k| super::python::py_eq(k, &key)) {
            seen.push(key);
            out.push(item);
        }
    }
    Ok(PyIter::value(IterKind::Generator, out))
}

/// `min` / `max(case_sensitive=False, attribute=None)`: undefined when empty.
fn min_max(
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
    want: Ordering,
) -> Result<Value, Error> {
    let name = if want == Ordering::Less { "min" } else { "max" };
    let p = params(name, &args, &kwargs, &["case_sensitive", "attribute"])?;
    let (case_sensitive, attribute) = (flag(&p[0]), text_param(&p[1])?);
    let mut best: Option<(Value, Value)> = None;
    for item in iterate(&value)? {
        let key = sort_key(&item, attribute.as_deref(), case_sensitive)?;
        best = match best {
            None => Some((key, item)),
            Some((k, v)) => {
                if py_cmp(&key, &k, if want == Ordering::Less { "<" } else { ">" })? == want {
                    Some((key, item))
                } else {
                    Some((k, v))
                }
            }
        };
    }
    Ok(best.map_or(Value::UNDEFINED, |(_, v)| v))
}

/// `sum(attribute=None, start=0)`: Python's `+` item by item.
fn sum(state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let p = params("sum", &args, &kwargs, &["attribute", "start"])?;
    let attribute = text_param(&p[0])?;
    let mut total = p[1].clone().unwrap_or(Value::from(0));
    for item in iterate(&value)? {
        let item = match &attribute {
            Some(a) => lookup(&item, a)?,
            None => item,
        };
        total = super::pyops::add(state, total, item)?;
    }
    Ok(total)
}

/// `dictsort(case_sensitive=False, by='key', reverse=False)`: a list of `(key, value)` pairs.
fn dictsort(
    state: &State,
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let p = params(
        "dictsort",
        &args,
        &kwargs,
        &["case_sensitive", "by", "reverse"],
    )?;
    let (case_sensitive, reverse) = (flag(&p[0]), flag(&p[2]));
    let by = text_param(&p[1])?.unwrap_or_else(|| "key".into());
    if py_type(&value) != PyType::Dict {
        return Err(undefined_attribute(&value, "items"));
    }
    reserve_items(state, value.len().unwrap_or(0) as u128 * 3, "dictsort")?;
    let by_value = match by.as_str() {
        "key" => false,
        "value" => true,
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "FilterArgumentError: You can only sort by either \"key\" or \"value\"",
            ));
        }
    };
    let mut pairs = value
        .try_iter()?
        .map(|k| {
            let v = value.get_item(&k)?;
            let key = sort_key(if by_value { &v } else { &k }, None, case_sensitive)?;
            Ok((key, Value::from(minijinja::value::Tuple::from(vec![k, v]))))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    sort_by_key(&mut pairs, reverse)?;
    Ok(Value::from(
        pairs.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
    ))
}

fn undefined_attribute(value: &Value, name: &str) -> Error {
    super::python::undefined_error(format!(
        "'{} object' has no attribute '{name}'",
        type_name(value)
    ))
}

/// Python's `int()` of a string: whitespace around, a sign, digits in `base` with single
/// underscores between them (`base` 0: a `0x`/`0o`/`0b` prefix chooses).
fn parse_int(s: &str, base: u32) -> Option<i128> {
    let t = strings::strip(s, None, true, true);
    let (negative, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let lower = t.to_ascii_lowercase();
    let (base, digits) = match (base, lower.get(..2)) {
        (0 | 16, Some("0x")) => (16, &t[2..]),
        (0 | 8, Some("0o")) => (8, &t[2..]),
        (0 | 2, Some("0b")) => (2, &t[2..]),
        (0, _) if t.len() > 1 && t.starts_with('0') && t.chars().any(|c| c != '0' && c != '_') => {
            return None;
        }
        (0, _) => (10, t),
        (b, _) => (b, t),
    };
    let digits = digits
        .strip_prefix('_')
        .filter(|_| base != 10)
        .unwrap_or(digits);
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    let n = i128::from_str_radix(&digits.replace('_', ""), base).ok()?;
    Some(if negative { -n } else { n })
}

/// Python's `float()` of a string.
fn parse_float(s: &str) -> Option<f64> {
    let t = strings::strip(s, None, true, true);
    if t.starts_with('_') || t.ends_with('_') || t.contains("__") {
        return None;
    }
    let plain = t.replace('_', "");
    let lower = plain.to_ascii_lowercase();
    let body = lower.trim_start_matches(['+', '-']);
    if matches!(body, "inf" | "infinity" | "nan") {
        return plain.parse::<f64>().ok();
    }
    if body.chars().any(|c| c.is_ascii_alphabetic() && c != 'e') {
        return None;
    }
    plain.parse::<f64>().ok()
}

/// `int(default=0, base=10)`: `int(value)`, else `int(float(value))`, else the default.
fn int(
    value: Value,
    default: Option<Value>,
    base: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let default = kwargs
        .get::<Option<Value>>("default")?
        .or(default)
        .unwrap_or(Value::from(0));
    let base = kwargs
        .get::<Option<Value>>("base")?
        .or(base)
        .and_then(|b| as_int(&b))
        .unwrap_or(10);
    kwargs.assert_all_used()?;
    if !(base == 0 || (2..=36).contains(&base)) {
        return Ok(default);
    }
    let from_float = |f: f64| -> Result<Value, Error> {
        if f.is_infinite() {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "OverflowError: cannot convert float infinity to integer",
            ));
        }
        Ok(if f.is_nan() {
            default.clone()
        } else {
            Value::from(f.trunc() as i128)
        })
    };
    match py_type(&value) {
        PyType::Int | PyType::Bool => Ok(Value::from(as_int(&value).unwrap_or(0))),
        PyType::Float => from_float(as_number(&value).unwrap_or(f64::NAN)),
        PyType::Str | PyType::Markup => {
            let s = value.as_str().unwrap_or_default();
            match parse_int(s, base as u32) {
                Some(n) => Ok(Value::from(n)),
                None => match parse_float(s) {
                    Some(f) => from_float(f),
                    None => Ok(default),
                },
            }
        }
        _ => Ok(default),
    }
}

/// `float(default=0.0)`.
fn float(value: Value, default: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let default = kwargs
        .get::<Option<Value>>("default")?
        .or(default)
        .unwrap_or(Value::from(0.0));
    kwargs.assert_all_used()?;
    Ok(match py_type(&value) {
        PyType::Int | PyType::Bool | PyType::Float => Value::from(as_number(&value).unwrap_or(0.0)),
        PyType::Str | PyType::Markup => {
            parse_float(value.as_str().unwrap_or_default()).map_or(default, Value::from)
        }
        _ => default,
    })
}

/// `round(precision=0, method='common')`: Python's `round` (halves to even, on the exact
/// binary value), `floor` or `ceil`; a float unless an int was given to `common`.
fn round(
    value: Value,
    precision: Option<Value>,
    method: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let precision = kwargs
        .get::<Option<Value>>("precision")?
        .or(precision)
        .and_then(|p| as_int(&p))
        .unwrap_or(0);
    let method = kwargs
        .get::<Option<String>>("method")?
        .or(method.map(|m| to_str(&m)).transpose()?)
        .unwrap_or_else(|| "common".into());
    kwargs.assert_all_used()?;
    if !matches!(method.as_str(), "common" | "ceil" | "floor") {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "FilterArgumentError: method must be common, ceil or floor",
        ));
    }
    let x = as_number(&value).ok_or_else(|| {
        type_error(format!(
            "type {} doesn't define __round__ method",
            type_name(&value)
        ))
    })?;
    if method == "common" && as_int(&value).is_some() && precision >= 0 {
        return Ok(Value::from(as_int(&value).unwrap_or(0)));
    }
    let p = precision.clamp(-308, 308) as i32;
    let rounded = match method.as_str() {
        "common" if p >= 0 => format!("{x:.*}", p as usize).parse::<f64>().unwrap_or(x),
        "common" => (x / 10f64.powi(-p)).round_ties_even() * 10f64.powi(-p),
        "floor" => (x * 10f64.powi(p)).floor() / 10f64.powi(p),
        _ => (x * 10f64.powi(p)).ceil() / 10f64.powi(p),
    };
    Ok(Value::from(rounded))
}

/// `default(default_value='', boolean=False)`: the default for an undefined value (and with
/// `boolean` for any false one).
fn default(value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let p = params("default", &args, &kwargs, &["default_value", "boolean"])?;
    let fallback = p[0].clone().unwrap_or(Value::from(""));
    Ok(
        if value.is_undefined() || (flag(&p[1]) && !value.is_true()) {
            fallback
        } else {
            value
        },
    )
}

/// `groupby(attribute, default=None, case_sensitive=False)`: `(grouper, list)` tuples of the
/// items sorted by the attribute, runs of equal keys together; unless `case_sensitive` strings
/// compare lower cased and the grouper is the first item's own key.
fn groupby(state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let p = params(
        "groupby",
        &args,
        &kwargs,
        &["attribute", "default", "case_sensitive"],
    )?;
    let attribute = text_param(&p[0])?
        .ok_or_else(|| type_error("groupby() missing required argument 'attribute'"))?;
    let case_sensitive = flag(&p[2]);
    let key = |item: &Value| -> Result<Value, Error> {
        let k = lookup(item, &attribute)?;
        Ok(match (&p[1], k.is_undefined()) {
            (Some(d), true) => d.clone(),
            _ => k,
        })
    };
    let mut pairs = iterate_kept(state, &value, "groupby")?
        .into_iter()
        .map(|item| {
            let k = key(&item)?;
            let folded = sort_key(&k, None, case_sensitive)?;
            Ok((folded, item))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    sort_by_key(&mut pairs, false)?;
    let mut groups: Vec<(Value, Vec<Value>)> = Vec::new();
    for (folded, item) in pairs {
        match groups.last_mut() {
            Some((k, items)) if super::python::py_eq(k, &folded) => items.push(item),
            _ => groups.push((folded, vec![item])),
        }
    }
    let out = groups
        .into_iter()
        .map(|(_, items)| {
            Ok(Value::from_object(super::objects::GroupTuple {
                grouper: key(&items[0])?,
                list: Value::from(items),
            }))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(Value::from(out))
}

/// `abs`.
fn abs(value: Value) -> Result<Value, Error> {
    match py_type(&value) {
        PyType::Int | PyType::Bool => Ok(Value::from(as_int(&value).unwrap_or(0).abs())),
        PyType::Float => Ok(Value::from(as_number(&value).unwrap_or(0.0).abs())),
        _ => Err(type_error(format!(
            "bad operand type for abs(): '{}'",
            type_name(&value)
        ))),
    }
}

/// `attr(name)`: the attribute only, never an item (a dict's key is not its attribute).
fn attr(value: Value, name: Value) -> Result<Value, Error> {
    let name = to_str(&name)?;
    match py_type(&value) {
        PyType::Str | PyType::Markup | PyType::Dict | PyType::List | PyType::Tuple => {
            if methods::is_method_name(&name) {
                methods::getattr(&value, &name)
            } else {
                Ok(Value::UNDEFINED)
            }
        }
        _ => value.get_attr(&name),
    }
}

/// `format(*args, **kwargs)`: `soft_str(value) % (kwargs or args)`.
fn format(state: &State, value: Value, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let names: Vec<String> = kwargs.args().map(str::to_owned).collect();
    if !names.is_empty() && !args.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "FilterArgumentError: can't handle positional and keyword arguments at the same time",
        ));
    }
    let operand = if names.is_empty() {
        Value::from(minijinja::value::Tuple::from(args.0))
    } else {
        let mut map = indexmap::IndexMap::new();
        for n in &names {
            map.insert(Value::from(n.as_str()), kwargs.get::<Value>(n)?);
        }
        Value::from_object(map)
    };
    let format = match py_type(&value) {
        PyType::Str | PyType::Markup => value,
        _ => Value::from(to_str(&value)?),
    };
    super::pyops::rem(state, format, operand)
}
