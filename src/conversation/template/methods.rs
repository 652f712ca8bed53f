//! Python's methods on the values a template sees, as jinja2's sandbox allows them: `str`'s
//! (with markupsafe's `Markup` escaping its arguments), `dict.get`/`items`/`keys`/`values`,
//! `list.index`/`count`. A method that changes its value (`append`, `update`, `pop`, ...) is
//! the sandbox's `SecurityError`; an attribute a value does not have is jinja2's
//! `UndefinedError` when called. Results are bounded before they are built.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

use super::format;
use super::limits::{reserve, reserve_items};
use super::objects::{IterKind, PyIter, PyMethod};
use super::python::{
    PyType, as_int, dict_get, py_eq, py_type, refusal, security_error, type_error, type_name,
    undefined_error, value_error,
};
use super::strings::{self, Predicate};

/// `str`'s methods (markupsafe's `Markup` adds `escape`, `unescape` and `striptags`).
const STR_METHODS: &[&str] = &[
    "capitalize",
    "casefold",
    "center",
    "count",
    "encode",
    "endswith",
    "expandtabs",
    "find",
    "format",
    "format_map",
    "index",
    "isalnum",
    "isalpha",
    "isascii",
    "isdecimal",
    "isdigit",
    "isidentifier",
    "islower",
    "isnumeric",
    "isprintable",
    "isspace",
    "istitle",
    "isupper",
    "join",
    "ljust",
    "lower",
    "lstrip",
    "maketrans",
    "partition",
    "removeprefix",
    "removesuffix",
    "replace",
    "rfind",
    "rindex",
    "rjust",
    "rpartition",
    "rsplit",
    "rstrip",
    "split",
    "splitlines",
    "startswith",
    "strip",
    "swapcase",
    "title",
    "translate",
    "upper",
    "zfill",
];
const DICT_METHODS: &[&str] = &[
    "clear",
    "copy",
    "fromkeys",
    "get",
    "items",
    "keys",
    "pop",
    "popitem",
    "setdefault",
    "update",
    "values",
];
const LIST_METHODS: &[&str] = &[
    "append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove", "reverse",
    "sort",
];
/// The methods and attributes of Python's numbers.
const NUMBER_METHODS: &[&str] = &[
    "as_integer_ratio",
    "bit_count",
    "bit_length",
    "conjugate",
    "denominator",
    "from_bytes",
    "fromhex",
    "hex",
    "imag",
    "is_integer",
    "numerator",
    "real",
    "to_bytes",
];
/// The methods jinja2's sandbox refuses because they change their value.
const DICT_MUTATORS: &[&str] = &["clear", "pop", "popitem", "setdefault", "update"];
const LIST_MUTATORS: &[&str] = &[
    "append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove",
];

/// Whether `name` is a method of `str`, `dict` or `list`: the attribute names whose jinja2
/// lookup differs from a key lookup.
pub fn is_method_name(name: &str) -> bool {
    STR_METHODS.contains(&name) || DICT_METHODS.contains(&name) || LIST_METHODS.contains(&name)
}

/// jinja2's `obj.name` for a method name: the bound method where `obj`'s type has one (a dict's
/// `items` before its key `"items"`), the sandbox's refusal for a method that changes its
/// value, and otherwise the ordinary attribute or key.
pub fn getattr(obj: &Value, name: &str) -> Result<Value, Error> {
    let method = |obj: &Value| {
        Ok(Value::from_object(PyMethod {
            receiver: obj.clone(),
            name: name.to_owned(),
        }))
    };
    match py_type(obj) {
        PyType::Str | PyType::Markup if STR_METHODS.contains(&name) => method(obj),
        PyType::Str | PyType::Markup => Ok(Value::UNDEFINED),
        PyType::Dict if DICT_MUTATORS.contains(&name) => Err(security_error(name, obj)),
        PyType::Dict if DICT_METHODS.contains(&name) => method(obj),
        PyType::List if LIST_MUTATORS.contains(&name) => Err(security_error(name, obj)),
        PyType::List if LIST_METHODS.contains(&name) => method(obj),
        PyType::Tuple if matches!(name, "count" | "index") => method(obj),
        PyType::List | PyType::Tuple => Ok(Value::UNDEFINED),
        PyType::Undefined => Err(undefined_error(format!(
            "an undefined value has no attribute '{name}'"
        ))),
        _ => obj.get_attr(name),
    }
}

/// `receiver.name(*args)`.
pub fn call(state: &State, receiver: &Value, name: &str, args: &[Value]) -> Result<Value, Error> {
    match py_type(receiver) {
        PyType::Str | PyType::Markup if STR_METHODS.contains(&name) => {
            string_method(state, receiver, name, args)
        }
        PyType::Dict if DICT_MUTATORS.contains(&name) => Err(security_error(name, receiver)),
        PyType::Dict if DICT_METHODS.contains(&name) => dict_method(state, receiver, name, args),
        PyType::List if LIST_MUTATORS.contains(&name) => Err(security_error(name, receiver)),
        PyType::List | PyType::Tuple if matches!(name, "count" | "index" | "copy") => {
            reserve_items(state, receiver.len().unwrap_or(0) as u128, name)?;
            seq_method(receiver, name, args)
        }
        PyType::None => Err(undefined_error(format!("'None' has no attribute '{name}'"))),
        PyType::Undefined => Err(undefined_error(format!(
            "an undefined value has no attribute '{name}'"
        ))),
        PyType::Int | PyType::Bool | PyType::Float if NUMBER_METHODS.contains(&name) => {
            Err(refusal(format!(
                "Python's `{}.{name}` method, which cardproof does not implement",
                type_name(receiver)
            )))
        }
        _ => Err(undefined_error(format!(
            "'{} object' has no attribute '{name}'",
            type_name(receiver)
        ))),
    }
}

/// The method call the rewrite makes of `obj.name(...)` for a method name: the value's own
/// attribute when it is callable (a namespace's, `loop.cycle`), else Python's method.
pub fn call_method(
    state: &mut State,
    obj: &Value,
    name: &str,
    args: &[Value],
) -> Result<Value, Error> {
    match py_type(obj) {
        PyType::Str
        | PyType::Markup
        | PyType::Dict
        | PyType::List
        | PyType::Tuple
        | PyType::None
        | PyType::Undefined => call(state, obj, name, args),
        _ => obj.call_method(state, name, args),
    }
}

/// Positional arguments `names` (and the same by keyword, where Python allows it), at least
/// `min` of them.
fn arguments(
    method: &str,
    args: &[Value],
    names: &[&str],
    min: usize,
) -> Result<Vec<Option<Value>>, Error> {
    let (positional, kwargs) = match args.last() {
        Some(last) if last.is_kwargs() => (&args[..args.len() - 1], Some(last)),
        _ => (args, None),
    };
    if positional.len() > names.len() {
        return Err(type_error(format!(
            "{method}() takes at most {} arguments ({} given)",
            names.len(),
            positional.len()
        )));
    }
    let mut out: Vec<Option<Value>> = names.iter().map(|_| None).collect();
    for (i, v) in positional.iter().enumerate() {
        out[i] = Some(v.clone());
    }
    if let Some(kwargs) = kwargs {
        for key in kwargs.try_iter()? {
            let key = key.as_str().unwrap_or_default().to_owned();
            let Some(i) = names.iter().position(|n| *n == key) else {
                return Err(type_error(format!(
                    "{method}() got an unexpected keyword argument '{key}'"
                )));
            };
            out[i] = Some(kwargs.get_item(&Value::from(key.as_str()))?);
        }
    }
    if out.iter().take(min).any(Option::is_none) {
        return Err(type_error(format!(
            "{method}() takes at least {min} argument(s)"
        )));
    }
    Ok(out)
}

/// An argument that must be a string (Python: `must be str, not int`).
fn str_arg(method: &str, v: &Value) -> Result<String, Error> {
    match py_type(v) {
        PyType::Str | PyType::Markup => Ok(v.as_str().unwrap_or_default().to_owned()),
        _ => Err(type_error(format!(
            "{method}() argument must be str, not {}",
            type_name(v)
        ))),
    }
}

/// An optional string argument (`None` allowed).
fn opt_str_arg(method: &str, v: &Option<Value>) -> Result<Option<String>, Error> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => str_arg(method, v).map(Some),
    }
}

/// An integer argument (`None` allowed where `default` is given).
fn int_arg(method: &str, v: &Option<Value>, default: Option<i64>) -> Result<Option<i64>, Error> {
    match v {
        None => Ok(default),
        Some(v) if v.is_none() => Ok(default),
        Some(v) => as_int(v)
            .map(|n| Some(n.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64))
            .ok_or_else(|| {
                type_error(format!(
                    "'{}' object cannot be interpreted as an integer ({method})",
                    type_name(v)
                ))
            }),
    }
}

/// A `width` argument, bounded before anything that large is built.
fn width_arg(state: &State, method: &str, v: &Option<Value>) -> Result<usize, Error> {
    let w = int_arg(method, v, Some(0))?.unwrap_or(0).max(0);
    reserve(state, w as u128, method)?;
    Ok(w as usize)
}

/// A fill character argument.
fn fill_arg(method: &str, v: &Option<Value>) -> Result<char, Error> {
    match opt_str_arg(method, v)? {
        None => Ok(' '),
        Some(s) => {
            let mut cs = s.chars();
            match (cs.next(), cs.next()) {
                (Some(c), None) => Ok(c),
                _ => Err(type_error(
                    "The fill character must be exactly one character long",
                )),
            }
        }
    }
}

/// A string result: a `Markup` receiver gives `Markup`.
fn text(s: String, markup: bool) -> Value {
    if markup {
        Value::from_safe_string(s)
    } else {
        Value::from(s)
    }
}

/// `str`'s methods (a `Markup` receiver's give `Markup`, its string arguments escaped first, as
/// markupsafe wraps them).
fn string_method(
    state: &State,
    receiver: &Value,
    name: &str,
    args: &[Value],
) -> Result<Value, Error> {
    let s = receiver.as_str().unwrap_or_default();
    let markup = receiver.is_safe();
    let escaped: Vec<Value> = if markup && name != "format" && name != "join" {
        args.iter()
            .map(|a| match py_type(a) {
                PyType::Str => {
                    Value::from_safe_string(strings::escape_html(a.as_str().unwrap_or_default()))
                }
                _ => a.clone(),
            })
            .collect()
    } else {
        args.to_vec()
    };
    let call = Str {
        state,
        s,
        markup,
        name,
        args: &escaped,
    };
    match name {
        "upper" | "lower" | "title" | "capitalize" | "strip" | "lstrip" | "rstrip" | "replace"
        | "center" | "ljust" | "rjust" | "zfill" | "removeprefix" | "removesuffix" => {
            call.transform()
        }
        "split" | "rsplit" | "splitlines" | "partition" | "rpartition" => call.parts(),
        "startswith" | "endswith" | "find" | "rfind" | "index" | "rindex" | "count" => {
            call.search()
        }
        "isalpha" | "isalnum" | "isdecimal" | "isdigit" | "isnumeric" | "isspace" | "islower"
        | "isupper" | "isascii" => call.predicate(),
        "join" | "format" => call.combine(),
        other => Err(refusal(format!(
            "Python's `str.{other}` method, which cardproof does not implement"
        ))),
    }
}

/// One call of a `str` method.
struct Str<'c> {
    state: &'c State<'c, 'c>,
    s: &'c str,
    markup: bool,
    name: &'c str,
    args: &'c [Value],
}

impl Str<'_> {
    /// The methods that give the string changed.
    fn transform(&self) -> Result<Value, Error> {
        let (state, s, markup, name, args) =
            (self.state, self.s, self.markup, self.name, self.args);
        match name {
            "upper" | "lower" => {
                arguments(name, args, &[], 0)?;
                reserve(state, s.len() as u128 * 3, name)?;
                Ok(text(
                    if name == "upper" {
                        s.to_uppercase()
                    } else {
                        s.to_lowercase()
                    },
                    markup,
                ))
            }
            "title" | "capitalize" => {
                arguments(name, args, &[], 0)?;
                reserve(state, s.len() as u128 * 3, name)?;
                Ok(text(
                    if name == "title" {
                        strings::title(s)?
                    } else {
                        strings::capitalize(s)?
                    },
                    markup,
                ))
            }
            "strip" | "lstrip" | "rstrip" => {
                let a = arguments(name, args, &["chars"], 0)?;
                let chars = opt_str_arg(name, &a[0])?;
                let (left, right) = (name != "rstrip", name != "lstrip");
                Ok(text(
                    strings::strip(s, chars.as_deref(), left, right).to_owned(),
                    markup,
                ))
            }
            "replace" => {
                let a = arguments(name, args, &["old", "new", "count"], 2)?;
                let old = str_arg(name, a[0].as_ref().expect("a required argument"))?;
                let new = str_arg(name, a[1].as_ref().expect("a required argument"))?;
                let count = int_arg(name, &a[2], Some(-1))?.unwrap_or(-1);
                replace(state, s, &old, &new, count).map(|r| text(r, markup))
            }
            "center" | "ljust" | "rjust" => {
                let a = arguments(name, args, &["width", "fillchar"], 1)?;
                let width = width_arg(state, name, &a[0])?;
                let fill = fill_arg(name, &a[1])?;
                Ok(text(
                    match name {
                        "center" => strings::center(s, width, fill),
                        _ => strings::justify(s, width, fill, name == "ljust"),
                    },
                    markup,
                ))
            }
            "zfill" => {
                let a = arguments(name, args, &["width"], 1)?;
                let width = width_arg(state, name, &a[0])?;
                Ok(text(strings::zfill(s, width), markup))
            }
            "removeprefix" | "removesuffix" => {
                let a = arguments(name, args, &["affix"], 1)?;
                let affix = str_arg(name, a[0].as_ref().expect("a required argument"))?;
                let out = if name == "removeprefix" {
                    s.strip_prefix(affix.as_str())
                } else {
                    s.strip_suffix(affix.as_str())
                };
                Ok(text(out.unwrap_or(s).to_owned(), markup))
            }
            _ => unreachable!("a transforming method"),
        }
    }

    /// The methods that give the string's parts.
    fn parts(&self) -> Result<Value, Error> {
        let (state, s, markup, name, args) =
            (self.state, self.s, self.markup, self.name, self.args);
        match name {
            "split" | "rsplit" => {
                let a = arguments(name, args, &["sep", "maxsplit"], 0)?;
                let sep = opt_str_arg(name, &a[0])?;
                let max = int_arg(name, &a[1], Some(-1))?.unwrap_or(-1);
                // Counted before the parts are built.
                let most = match sep.as_deref() {
                    Some("") | None => s.split(strings::is_space).filter(|p| !p.is_empty()).count(),
                    Some(sep) => s.matches(sep).count() + 1,
                };
                let most = if max < 0 {
                    most
                } else {
                    most.min(max as usize + 1)
                };
                reserve_items(state, most as u128, name)?;
                let parts = strings::split(s, sep.as_deref(), max, name == "rsplit")?;
                Ok(Value::from(
                    parts
                        .into_iter()
                        .map(|p| text(p, markup))
                        .collect::<Vec<_>>(),
                ))
            }
            "splitlines" => {
                let a = arguments(name, args, &["keepends"], 0)?;
                let keep = a[0].as_ref().is_some_and(|v| v.is_true());
                reserve_items(
                    state,
                    s.chars().filter(|&c| strings::is_line_break(c)).count() as u128 + 1,
                    name,
                )?;
                let lines = strings::splitlines(s, keep);
                Ok(Value::from(
                    lines
                        .into_iter()
                        .map(|p| text(p, markup))
                        .collect::<Vec<_>>(),
                ))
            }
            "partition" | "rpartition" => {
                let a = arguments(name, args, &["sep"], 1)?;
                let sep = str_arg(name, a[0].as_ref().expect("a required argument"))?;
                if sep.is_empty() {
                    return Err(value_error("empty separator"));
                }
                let at = if name == "partition" {
                    s.find(&sep)
                } else {
                    s.rfind(&sep)
                };
                let parts = match at {
                    Some(i) => [&s[..i], &sep[..], &s[i + sep.len()..]],
                    None if name == "partition" => [s, "", ""],
                    None => ["", "", s],
                };
                Ok(Value::from(minijinja::value::Tuple::from(
                    parts
                        .iter()
                        .map(|p| text((*p).to_owned(), markup))
                        .collect::<Vec<_>>(),
                )))
            }
            _ => unreachable!("a splitting method"),
        }
    }

    /// The methods that look for a substring.
    fn search(&self) -> Result<Value, Error> {
        let (s, name, args) = (self.s, self.name, self.args);
        match name {
            "startswith" | "endswith" => {
                let a = arguments(name, args, &["prefix", "start", "end"], 1)?;
                let (start, end) = (int_arg(name, &a[1], None)?, int_arg(name, &a[2], None)?);
                let Some((from, to)) = strings::char_range(s, start, end) else {
                    return Ok(Value::from(false));
                };
                let hay = &s[from..to];
                let test = |p: &str| {
                    if name == "startswith" {
                        hay.starts_with(p)
                    } else {
                        hay.ends_with(p)
                    }
                };
                let wanted = a[0].clone().expect("a required argument");
                match py_type(&wanted) {
                    PyType::Str | PyType::Markup => {
                        Ok(Value::from(test(wanted.as_str().unwrap_or_default())))
                    }
                    PyType::Tuple => {
                        for p in wanted.try_iter()? {
                            if test(&str_arg(name, &p)?) {
                                return Ok(Value::from(true));
                            }
                        }
                        Ok(Value::from(false))
                    }
                    _ => Err(type_error(format!(
                        "{name} first arg must be str or a tuple of str, not {}",
                        type_name(&wanted)
                    ))),
                }
            }
            "find" | "rfind" | "index" | "rindex" | "count" => {
                let a = arguments(name, args, &["sub", "start", "end"], 1)?;
                let sub = str_arg(name, a[0].as_ref().expect("a required argument"))?;
                let (start, end) = (int_arg(name, &a[1], None)?, int_arg(name, &a[2], None)?);
                let range = strings::char_range(s, start, end);
                if name == "count" {
                    return Ok(Value::from(range.map_or(0, |(f, t)| {
                        if sub.is_empty() {
                            s[f..t].chars().count() + 1
                        } else {
                            s[f..t].matches(sub.as_str()).count()
                        }
                    })));
                }
                let found = range.and_then(|(f, t)| {
                    let hay = &s[f..t];
                    let at = if name.starts_with('r') {
                        hay.rfind(sub.as_str())
                    } else {
                        hay.find(sub.as_str())
                    };
                    at.map(|b| strings::char_index(s, f + b))
                });
                match (found, name) {
                    (Some(i), _) => Ok(Value::from(i)),
                    (None, "index" | "rindex") => Err(value_error("substring not found")),
                    (None, _) => Ok(Value::from(-1)),
                }
            }
            _ => unreachable!("a searching method"),
        }
    }

    /// Python's character predicates (`isalpha`, ...).
    fn predicate(&self) -> Result<Value, Error> {
        arguments(self.name, self.args, &[], 0)?;
        let p = match self.name {
            "isalpha" => Predicate::Alpha,
            "isalnum" => Predicate::Alnum,
            "isdecimal" => Predicate::Decimal,
            "isdigit" => Predicate::Digit,
            "isnumeric" => Predicate::Numeric,
            "isspace" => Predicate::Space,
            "islower" => Predicate::Lower,
            "isupper" => Predicate::Upper,
            _ => return Ok(Value::from(self.s.is_ascii())),
        };
        strings::predicate(self.s, p).map(Value::from)
    }

    /// `join` and `format`, which write their arguments into the string.
    fn combine(&self) -> Result<Value, Error> {
        let (state, s, markup, name, args) =
            (self.state, self.s, self.markup, self.name, self.args);
        match name {
            "join" => {
                let a = arguments(name, args, &["iterable"], 1)?;
                join_method(
                    state,
                    s,
                    markup,
                    a[0].as_ref().expect("a required argument"),
                )
            }
            "format" => {
                let (positional, kwargs) = match args.last() {
                    Some(last) if last.is_kwargs() => (&args[..args.len() - 1], last.clone()),
                    _ => (args, Value::from(())),
                };
                let out = format::str_format(state, s, positional, &kwargs, markup)?;
                Ok(text(out, markup))
            }
            _ => unreachable!("a combining method"),
        }
    }
}

/// `str.replace(old, new, count)`, bounded before it is built.
pub fn replace(state: &State, s: &str, old: &str, new: &str, count: i64) -> Result<String, Error> {
    let found = if old.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(old).count()
    };
    let n = if count < 0 {
        found
    } else {
        found.min(count as usize)
    };
    let grows = new.len().saturating_sub(old.len()) as u128;
    reserve(state, s.len() as u128 + grows * n as u128, "str.replace")?;
    Ok(if count < 0 {
        s.replace(old, new)
    } else {
        s.replacen(old, new, n)
    })
}

/// `sep.join(iterable)`: every item a string (Python's `TypeError` otherwise); a `Markup`
/// separator escapes the items.
fn join_method(state: &State, sep: &str, markup: bool, iterable: &Value) -> Result<Value, Error> {
    let items = match py_type(iterable) {
        PyType::None | PyType::Int | PyType::Float | PyType::Bool | PyType::Undefined => {
            return Err(type_error("can only join an iterable"));
        }
        _ => iterable.try_iter()?,
    };
    let mut out = String::new();
    for (i, item) in items.enumerate() {
        let piece = match py_type(&item) {
            PyType::Markup => item.as_str().unwrap_or_default().to_owned(),
            PyType::Str if markup => strings::escape_html(item.as_str().unwrap_or_default()),
            PyType::Str => item.as_str().unwrap_or_default().to_owned(),
            _ => {
                return Err(type_error(format!(
                    "sequence item {i}: expected str instance, {} found",
                    type_name(&item)
                )));
            }
        };
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(&piece);
        reserve(state, out.len() as u128, "str.join")?;
    }
    Ok(text(out, markup))
}

/// `dict`'s methods the sandbox allows.
fn dict_method(
    state: &State,
    receiver: &Value,
    name: &str,
    args: &[Value],
) -> Result<Value, Error> {
    let pairs = || -> Result<Vec<(Value, Value)>, Error> {
        receiver
            .try_iter()?
            .map(|k| Ok((k.clone(), receiver.get_item(&k)?)))
            .collect()
    };
    match name {
        "get" => {
            let a = arguments(name, args, &["key", "default"], 1)?;
            let key = a[0].clone().expect("a required argument");
            super::python::check_hashable(&key)?;
            Ok(dict_get(receiver, &key).unwrap_or_else(|| a[1].clone().unwrap_or(Value::from(()))))
        }
        "items" | "keys" | "values" => {
            arguments(name, args, &[], 0)?;
            reserve_items(state, receiver.len().unwrap_or(0) as u128 * 2, name)?;
            let (kind, items) = match name {
                "items" => (
                    IterKind::Items,
                    pairs()?
                        .into_iter()
                        .map(|(k, v)| Value::from(minijinja::value::Tuple::from(vec![k, v])))
                        .collect(),
                ),
                "keys" => (IterKind::Keys, receiver.try_iter()?.collect()),
                _ => (
                    IterKind::Values,
                    pairs()?.into_iter().map(|(_, v)| v).collect(),
                ),
            };
            Ok(PyIter::value(kind, items))
        }
        "copy" => {
            arguments(name, args, &[], 0)?;
            Ok(receiver.clone())
        }
        other => Err(refusal(format!(
            "Python's `dict.{other}` method, which cardproof does not implement"
        ))),
    }
}

/// `list.index`, `list.count`, `list.copy` (and a tuple's `index` and `count`).
fn seq_method(receiver: &Value, name: &str, args: &[Value]) -> Result<Value, Error> {
    let items: Vec<Value> = receiver.try_iter()?.collect();
    match name {
        "count" => {
            let a = arguments(name, args, &["value"], 1)?;
            let x = a[0].clone().expect("a required argument");
            Ok(Value::from(items.iter().filter(|v| py_eq(v, &x)).count()))
        }
        "index" => {
            let a = arguments(name, args, &["value", "start", "stop"], 1)?;
            let x = a[0].clone().expect("a required argument");
            let n = items.len() as i64;
            let clamp = |i: i64| if i < 0 { (i + n).max(0) } else { i.min(n) };
            let start = clamp(int_arg(name, &a[1], Some(0))?.unwrap_or(0)) as usize;
            let stop = clamp(int_arg(name, &a[2], Some(n))?.unwrap_or(n)) as usize;
            (start..stop.max(start))
                .find(|&i| py_eq(&items[i], &x))
                .map(Value::from)
                .ok_or_else(|| {
                    value_error(format!(
                        "{} is not in {}",
                        super::python::to_repr(&x).unwrap_or_default(),
                        type_name(receiver)
                    ))
                })
        }
        _ => {
            arguments(name, args, &[], 0)?;
            Ok(Value::from(items))
        }
    }
}

/// minijinja's hook for a method no value answers: Python's answer, as [`call`] gives it.
pub fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if value.kind() == ValueKind::Invalid {
        return Err(Error::new(ErrorKind::InvalidOperation, "an invalid value"));
    }
    call(state, value, method, args)
}
