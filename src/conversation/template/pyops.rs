//! Python's operators, which the rewritten template calls in place of minijinja's
//! ([`super::rewrite`]): `+`, `*`, `%`, `~`, `<`/`<=`/`>`/`>=`, `in`, and the iteration of a
//! `for` loop. Each raises where Python raises (`'a' + 1`, `none < 1`, `for x in none`,
//! `'x' in none`), follows markupsafe where a `Markup` string is involved (`Markup + str`
//! escapes the other operand), and bounds what it builds ([`super::limits`]).

use minijinja::value::{Rest, Value, ValueOrKwargs};
use minijinja::{Error, State};

use super::format;
use super::limits::{Bounded, reserve, reserve_items};
use super::objects::{IterKind, PyIter};
use super::python::{
    PyType, as_int, as_number, check_hashable, dict_get, py_compare, py_eq, py_str, py_type,
    type_error, type_name, undefined_error,
};
use super::strings::escape_html;

fn undefined_operand(op: &str) -> Error {
    undefined_error(format!("an undefined value is an operand of '{op}'"))
}

/// Python's integers have no bound; cardproof's stop at 128 bits.
fn too_big() -> Error {
    super::python::refusal("an integer beyond 128 bits (Python's integers have no bound)")
}

fn unsupported(op: &str, a: &Value, b: &Value) -> Error {
    type_error(format!(
        "unsupported operand type(s) for {op}: '{}' and '{}'",
        type_name(a),
        type_name(b)
    ))
}

/// `value`, unless it is undefined where jinja2's `Undefined` raises (an operand of `+`, `*`,
/// `<`, a subscripted or called value): then jinja2's `UndefinedError`, naming `what` as the
/// template wrote it.
pub fn defined(value: Value, what: String) -> Result<Value, Error> {
    if value.is_undefined() {
        return Err(undefined_error(format!("'{what}' is undefined")));
    }
    Ok(value)
}

/// Python's `a + b`.
pub fn add(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    let (ta, tb) = (py_type(&a), py_type(&b));
    if ta == PyType::Undefined || tb == PyType::Undefined {
        return Err(undefined_operand("+"));
    }
    let numeric = |t: PyType| matches!(t, PyType::Bool | PyType::Int | PyType::Float);
    match (ta, tb) {
        (x, y) if numeric(x) && numeric(y) => Ok(match (as_int(&a), as_int(&b)) {
            (Some(x), Some(y)) => x.checked_add(y).map(Value::from).ok_or_else(too_big)?,
            _ => Value::from(as_number(&a).unwrap_or(0.0) + as_number(&b).unwrap_or(0.0)),
        }),
        (PyType::Str | PyType::Markup, PyType::Str | PyType::Markup) => {
            let (x, y) = (
                a.as_str().unwrap_or_default(),
                b.as_str().unwrap_or_default(),
            );
            if ta == PyType::Str && tb == PyType::Str {
                reserve(state, x.len() as u128 + y.len() as u128, "`+`")?;
                return Ok(Value::from(format!("{x}{y}")));
            }
            // markupsafe: `Markup + str` and `str + Markup` escape the plain operand.
            let x = if ta == PyType::Markup {
                x.to_owned()
            } else {
                escape_html(x)
            };
            let y = if tb == PyType::Markup {
                y.to_owned()
            } else {
                escape_html(y)
            };
            reserve(state, x.len() as u128 + y.len() as u128, "`+`")?;
            Ok(Value::from_safe_string(format!("{x}{y}")))
        }
        (PyType::List, PyType::List) | (PyType::Tuple, PyType::Tuple) => {
            let n = a.len().unwrap_or(0) as u128 + b.len().unwrap_or(0) as u128;
            reserve_items(state, n, "`+`")?;
            let items: Vec<Value> = a.try_iter()?.chain(b.try_iter()?).collect();
            Ok(if ta == PyType::Tuple {
                Value::from(minijinja::value::Tuple::from(items))
            } else {
                Value::from(items)
            })
        }
        (PyType::Str | PyType::Markup | PyType::List | PyType::Tuple, _) => {
            let kind = match ta {
                PyType::List => "list",
                PyType::Tuple => "tuple",
                _ => "str",
            };
            Err(type_error(format!(
                "can only concatenate {kind} (not \"{}\") to {kind}",
                type_name(&b)
            )))
        }
        _ => Err(unsupported("+", &a, &b)),
    }
}

/// Python's `a * b`: a string or list repeated (bounded before it is built), or numbers.
pub fn mul(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    let (ta, tb) = (py_type(&a), py_type(&b));
    if ta == PyType::Undefined || tb == PyType::Undefined {
        return Err(undefined_operand("*"));
    }
    let seq = |t: PyType| {
        matches!(
            t,
            PyType::Str | PyType::Markup | PyType::List | PyType::Tuple
        )
    };
    let (s, n, ts) = match (seq(ta), seq(tb)) {
        (true, false) => (&a, &b, ta),
        (false, true) => (&b, &a, tb),
        (true, true) => {
            return Err(type_error(format!(
                "can't multiply sequence by non-int of type '{}'",
                type_name(&b)
            )));
        }
        (false, false) => {
            if as_number(&a).is_none() || as_number(&b).is_none() {
                return Err(unsupported("*", &a, &b));
            }
            return Ok(match (as_int(&a), as_int(&b)) {
                (Some(x), Some(y)) => x.checked_mul(y).map(Value::from).ok_or_else(too_big)?,
                _ => Value::from(as_number(&a).unwrap_or(0.0) * as_number(&b).unwrap_or(0.0)),
            });
        }
    };
    let Some(times) = as_int(n) else {
        return Err(type_error(format!(
            "can't multiply sequence by non-int of type '{}'",
            type_name(n)
        )));
    };
    let times = times.max(0) as u128;
    match ts {
        PyType::Str | PyType::Markup => {
            let text = s.as_str().unwrap_or_default();
            reserve(state, (text.len() as u128).saturating_mul(times), "`*`")?;
            let out = text.repeat(times as usize);
            Ok(if ts == PyType::Markup {
                Value::from_safe_string(out)
            } else {
                Value::from(out)
            })
        }
        _ => {
            let items: Vec<Value> = s.try_iter()?.collect();
            reserve_items(state, (items.len() as u128).saturating_mul(times), "`*`")?;
            let mut out = Vec::with_capacity(items.len() * times as usize);
            for _ in 0..times {
                out.extend(items.iter().cloned());
            }
            Ok(if ts == PyType::Tuple {
                Value::from(minijinja::value::Tuple::from(out))
            } else {
                Value::from(out)
            })
        }
    }
}

/// Python's `a - b`, `a / b`, `a // b` and `a ** b` on numbers (a bool counts as an int):
/// `ZeroDivisionError` as Python words it, a float where Python gives one, and a refusal where
/// Python's unbounded integers or complex numbers would be needed.
pub fn arith(a: Value, op: &str, b: Value) -> Result<Value, Error> {
    let (ta, tb) = (py_type(&a), py_type(&b));
    if ta == PyType::Undefined || tb == PyType::Undefined {
        return Err(undefined_operand(op));
    }
    let (Some(x), Some(y)) = (as_number(&a), as_number(&b)) else {
        return Err(unsupported(op, &a, &b));
    };
    let ints = as_int(&a).zip(as_int(&b));
    let zero = |what: &str| {
        Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            format!("ZeroDivisionError: {what}"),
        ))
    };
    match (op, ints) {
        ("-", Some((i, j))) => i.checked_sub(j).map(Value::from).ok_or_else(too_big),
        ("-", None) => Ok(Value::from(x - y)),
        ("/", _) if y == 0.0 => zero(if ints.is_some() {
            "division by zero"
        } else {
            "float division by zero"
        }),
        ("/", _) => Ok(Value::from(x / y)),
        ("//", Some((_, 0))) => zero("integer division or modulo by zero"),
        ("//", Some((i, j))) => {
            let q = i.checked_div_euclid(j).ok_or_else(too_big)?;
            // Python floors; Euclid's quotient differs when the divisor is negative.
            let r = i - q * j;
            Ok(Value::from(if j < 0 && r != 0 { q + 1 } else { q }))
        }
        ("//", None) if y == 0.0 => zero("float floor division by zero"),
        ("//", None) => Ok(Value::from((x / y).floor())),
        ("**", Some((i, j))) if j >= 0 => u32::try_from(j)
            .ok()
            .and_then(|j| i.checked_pow(j))
            .map(Value::from)
            .ok_or_else(too_big),
        ("**", Some((0, _))) => zero("0.0 cannot be raised to a negative power"),
        ("**", _) if x == 0.0 && y < 0.0 => zero("0.0 cannot be raised to a negative power"),
        ("**", _) if x < 0.0 && y.fract() != 0.0 => Err(super::python::refusal(
            "a negative number raised to a fractional power (Python gives a complex number)",
        )),
        ("**", _) => Ok(Value::from(x.powf(y))),
        _ => Err(unsupported(op, &a, &b)),
    }
}

/// Python's `-x`.
pub fn neg(x: Value) -> Result<Value, Error> {
    match (py_type(&x), as_int(&x)) {
        (PyType::Undefined, _) => Err(undefined_operand("-")),
        (_, Some(i)) => i.checked_neg().map(Value::from).ok_or_else(too_big),
        (PyType::Float, _) => Ok(Value::from(-as_number(&x).unwrap_or(0.0))),
        _ => Err(type_error(format!(
            "bad operand type for unary -: '{}'",
            type_name(&x)
        ))),
    }
}

/// Python's `a % b`: printf-style formatting for a string, the floored remainder for numbers.
pub fn rem(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    let (ta, tb) = (py_type(&a), py_type(&b));
    if ta == PyType::Undefined
        || (tb == PyType::Undefined && !matches!(ta, PyType::Str | PyType::Markup))
    {
        return Err(undefined_operand("%"));
    }
    if matches!(ta, PyType::Str | PyType::Markup) {
        let out = format::printf(
            state,
            a.as_str().unwrap_or_default(),
            &b,
            ta == PyType::Markup,
        )?;
        return Ok(if ta == PyType::Markup {
            Value::from_safe_string(out)
        } else {
            Value::from(out)
        });
    }
    let zero = || {
        minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "ZeroDivisionError: integer modulo by zero",
        )
    };
    match (as_int(&a), as_int(&b), as_number(&a), as_number(&b)) {
        (Some(_), Some(0), _, _) => Err(zero()),
        (Some(x), Some(y), _, _) => {
            // Python's remainder takes the divisor's sign.
            let r = x.checked_rem_euclid(y).ok_or_else(too_big)?;
            Ok(Value::from(if y < 0 && r != 0 { r + y } else { r }))
        }
        (_, _, Some(_), Some(0.0)) => Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            "ZeroDivisionError: float modulo",
        )),
        (_, _, Some(x), Some(y)) => {
            let mut r = x % y;
            if r != 0.0 && (r < 0.0) != (y < 0.0) {
                r += y;
            } else if r == 0.0 {
                r = 0.0f64.copysign(y);
            }
            Ok(Value::from(r))
        }
        _ => Err(unsupported("%", &a, &b)),
    }
}

/// jinja2's `a ~ b` (autoescaping off): `str(a) + str(b)`, a plain string; an undefined
/// operand is empty.
pub fn concat(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    let mut out = Bounded::default();
    py_str(&a, &mut out)?;
    py_str(&b, &mut out)?;
    reserve(state, out.text.len() as u128, "`~`")?;
    Ok(Value::from(out.text))
}

/// Python's ordering operators.
pub fn compare(a: Value, op: &str, b: Value) -> Result<bool, Error> {
    py_compare(&a, &b, op)
}

/// A chain of comparisons (`a < b < c`): each pair as Python compares it, stopping at the first
/// false one.
pub fn chain(args: Rest<Value>) -> Result<bool, Error> {
    let args = args.0;
    let mut i = 0;
    while i + 2 < args.len() {
        let (a, op, b) = (
            &args[i],
            args[i + 1].as_str().unwrap_or_default(),
            &args[i + 2],
        );
        let holds = match op {
            "==" => py_eq(a, b),
            "!=" => !py_eq(a, b),
            "in" => contains(b.clone(), a.clone())?,
            "not in" => !contains(b.clone(), a.clone())?,
            op => py_compare(a, b, op)?,
        };
        if !holds {
            return Ok(false);
        }
        i += 2;
    }
    Ok(true)
}

/// Python's `item in container` (the arguments in that order: `contains(container, item)`).
pub fn contains(container: Value, item: Value) -> Result<bool, Error> {
    match py_type(&container) {
        PyType::Undefined => Ok(false),
        PyType::Str | PyType::Markup => match py_type(&item) {
            PyType::Str | PyType::Markup => Ok(container
                .as_str()
                .unwrap_or_default()
                .contains(item.as_str().unwrap_or_default())),
            _ => Err(type_error(format!(
                "'in <string>' requires string as left operand, not {}",
                type_name(&item)
            ))),
        },
        PyType::List | PyType::Tuple | PyType::Range => {
            Ok(container.try_iter()?.any(|x| py_eq(&x, &item)))
        }
        PyType::Dict => {
            check_hashable(&item)?;
            Ok(dict_get(&container, &item).is_some())
        }
        PyType::Iter => {
            let iter = container
                .downcast_object_ref::<PyIter>()
                .expect("an iterator");
            if iter.kind == IterKind::Items {
                return Ok(iter.peek().iter().any(|x| py_eq(x, &item)));
            }
            if iter.kind.is_view() {
                return Ok(iter.peek().iter().any(|x| py_eq(x, &item)));
            }
            // An iterator is consumed up to the item found, as in Python.
            while let Some(x) = iter.next() {
                if py_eq(&x, &item) {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        _ => Err(type_error(format!(
            "argument of type '{}' is not iterable",
            type_name(&container)
        ))),
    }
}

/// What a `for` loop iterates: `None`, numbers and other non-iterables are Python's
/// `TypeError`; an undefined value iterates as empty (jinja2's `Undefined`).
pub fn iterate(value: Value) -> Result<Value, Error> {
    match py_type(&value) {
        PyType::Undefined
        | PyType::Str
        | PyType::Markup
        | PyType::List
        | PyType::Tuple
        | PyType::Dict
        | PyType::Iter
        | PyType::Range => Ok(value),
        _ => Err(type_error(format!(
            "'{}' object is not iterable",
            type_name(&value)
        ))),
    }
}

/// Python's unpacking of `value` into `n` names: a string's characters, a dict's keys, a
/// sequence's items, exactly `n` of them.
pub fn unpack(value: Value, n: usize) -> Result<Value, Error> {
    let items: Vec<Value> = match py_type(&value) {
        PyType::Str | PyType::Markup => {
            let s = value.as_str().unwrap_or_default();
            // Counted before anything is built: a long string is not made a list of characters.
            let k = s.chars().take(n + 1).count();
            if k != n {
                return Err(unpack_count(n, k, s.chars().count()));
            }
            s.chars().map(|c| Value::from(c.to_string())).collect()
        }
        PyType::List | PyType::Tuple | PyType::Dict | PyType::Range => value.try_iter()?.collect(),
        PyType::Iter => value
            .downcast_object_ref::<PyIter>()
            .expect("an iterator")
            .take(),
        _ => {
            return Err(type_error(format!(
                "cannot unpack non-iterable {} object",
                type_name(&value)
            )));
        }
    };
    match items.len() {
        k if k != n => Err(unpack_count(n, k, k)),
        _ => Ok(Value::from(items)),
    }
}

/// Python's error for unpacking `total` values into `n` names.
fn unpack_count(n: usize, k: usize, total: usize) -> Error {
    if k > n {
        super::python::value_error(format!("too many values to unpack (expected {n})"))
    } else {
        super::python::value_error(format!(
            "not enough values to unpack (expected {n}, got {total})"
        ))
    }
}

/// A `for` loop with several names: its items, each unpacked as Python unpacks it.
pub fn iterate_unpacking(state: &State, value: Value, n: usize) -> Result<Value, Error> {
    let items: Vec<Value> = match py_type(&iterate(value.clone())?) {
        PyType::Undefined => Vec::new(),
        PyType::Iter => value
            .downcast_object_ref::<PyIter>()
            .expect("an iterator")
            .take(),
        _ => value.try_iter()?.collect(),
    };
    reserve_items(
        state,
        (items.len() as u128).saturating_mul(n as u128 + 1),
        "unpacking",
    )?;
    let unpacked = items
        .into_iter()
        .map(|item| unpack(item, n))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::from(unpacked))
}

/// The result of one of jinja2's generator filters (`map`, `select`, `reject`, `selectattr`,
/// `rejectattr`), computed by minijinja's filter, as the generator jinja2 returns.
pub fn generator(state: &State, value: Value) -> Result<Value, Error> {
    reserve_items(state, value.len().unwrap_or(0) as u128, "a generator")?;
    let items: Vec<Value> = value.try_iter()?.collect();
    Ok(PyIter::value(IterKind::Generator, items))
}

/// A value the template builds from others (a literal, `batch`, ...), checked to nest at most
/// [`super::limits::MAX_DEPTH`] deep.
pub fn nest(state: &State, value: Value) -> Result<Value, Error> {
    super::limits::check_depth(state, &value)?;
    Ok(value)
}

/// After `{% set ns.x = ... %}`: the namespace, checked to nest at most
/// [`super::limits::MAX_DEPTH`] deep (a namespace set to hold itself nests without end).
pub fn assigned(state: &State, namespace: Value) -> Result<Value, Error> {
    super::limits::check_depth(state, &namespace)?;
    Ok(Value::from(""))
}

/// `obj.name` for a method name ([`super::methods::getattr`]).
pub fn getattr(obj: Value, name: &str) -> Result<Value, Error> {
    super::methods::getattr(&obj, name)
}

/// `obj.name(args)` for a method name ([`super::methods::call_method`]); keyword arguments
/// arrive as the last of `args`.
pub fn method(
    state: &mut State,
    obj: Value,
    name: String,
    args: Rest<ValueOrKwargs>,
) -> Result<Value, Error> {
    super::methods::call_method(state, &obj, &name, &args.into_values())
}

/// jinja2's `obj[key]`: Python's subscript, and where it fails (a missing key, an index out of
/// range, a type that has no items) the attribute of that name for a string key, else an
/// undefined value; subscripting an undefined value is an `UndefinedError`.
pub fn getitem(obj: Value, key: Value) -> Result<Value, Error> {
    let by_name = |obj: &Value| match key.as_str() {
        Some(name) if super::methods::is_method_name(name) => super::methods::getattr(obj, name),
        _ => Ok(Value::UNDEFINED),
    };
    match py_type(&obj) {
        PyType::Undefined => Err(undefined_error("an undefined value is subscripted")),
        PyType::Dict => {
            if check_hashable(&key).is_err() {
                return Ok(Value::UNDEFINED);
            }
            match dict_get(&obj, &key) {
                Some(v) => Ok(v),
                None => by_name(&obj),
            }
        }
        PyType::List | PyType::Tuple | PyType::Str | PyType::Markup | PyType::Range => {
            let Some(i) = (py_type(&key) != PyType::Float)
                .then(|| as_int(&key))
                .flatten()
            else {
                return by_name(&obj);
            };
            if let Some(s) = obj.as_str() {
                let n = s.chars().count() as i128;
                let at = if i < 0 { i + n } else { i };
                return Ok(match (0..n).contains(&at) {
                    true => s
                        .chars()
                        .nth(at as usize)
                        .map_or(Value::UNDEFINED, |c| Value::from(c.to_string())),
                    false => Value::UNDEFINED,
                });
            }
            let n = obj.len().unwrap_or(0) as i128;
            let at = if i < 0 { i + n } else { i };
            Ok(match (0..n).contains(&at) {
                true => obj.try_iter()?.nth(at as usize).unwrap_or(Value::UNDEFINED),
                false => Value::UNDEFINED,
            })
        }
        PyType::None
        | PyType::Bool
        | PyType::Int
        | PyType::Float
        | PyType::Iter
        | PyType::Method => Ok(Value::UNDEFINED),
        PyType::Namespace | PyType::Macro | PyType::Loop | PyType::Other => {
            Ok(obj.get_item(&key).unwrap_or(Value::UNDEFINED))
        }
    }
}

/// jinja2's `obj[start:stop:step]`: Python's slice of a string, list, tuple or range; an
/// undefined value for anything Python cannot slice.
pub fn slice(
    state: &State,
    obj: Value,
    start: Value,
    stop: Value,
    step: Value,
) -> Result<Value, Error> {
    // jinja2 slices with Python's own subscript, so what Python cannot slice raises.
    let t = py_type(&obj);
    match t {
        PyType::Undefined => return Err(undefined_error("an undefined value is sliced")),
        PyType::Str | PyType::Markup | PyType::List | PyType::Tuple | PyType::Range => {}
        PyType::Dict => return Err(type_error("unhashable type: 'slice'")),
        _ => {
            return Err(type_error(format!(
                "'{}' object is not subscriptable",
                type_name(&obj)
            )));
        }
    }
    let index = |v: &Value| -> Result<Option<i128>, Error> {
        match py_type(v) {
            PyType::None => Ok(None),
            PyType::Int | PyType::Bool => Ok(as_int(v)),
            _ => Err(type_error(
                "slice indices must be integers or None or have an __index__ method",
            )),
        }
    };
    let (start, stop, step) = (index(&start)?, index(&stop)?, index(&step)?);
    let step = step.unwrap_or(1);
    if step == 0 {
        return Err(super::python::value_error("slice step cannot be zero"));
    }
    let n = match obj.as_str() {
        Some(s) => s.chars().count(),
        None => obj.len().unwrap_or(0),
    } as i128;
    // Python's `slice.indices(n)`.
    let clamp = |i: Option<i128>, default: i128, lo: i128, hi: i128| match i {
        None => default,
        Some(i) if i < 0 => (i + n).max(lo),
        Some(i) => i.min(hi),
    };
    let (from, to) = if step > 0 {
        (clamp(start, 0, 0, n), clamp(stop, n, 0, n))
    } else {
        (clamp(start, n - 1, -1, n - 1), clamp(stop, -1, -1, n - 1))
    };
    // Whether position `i` is taken.
    let taken = |i: i128| {
        if step > 0 {
            i >= from && i < to && (i - from) % step == 0
        } else {
            i <= from && i > to && (from - i) % -step == 0
        }
    };
    let count = if step > 0 {
        ((to - from).max(0) + step - 1) / step
    } else {
        ((from - to).max(0) - step - 1) / -step
    };
    if let Some(s) = obj.as_str() {
        reserve(state, s.len() as u128, "a slice")?;
        let out: String = if step > 0 {
            s.chars()
                .enumerate()
                .filter(|&(i, _)| taken(i as i128))
                .map(|(_, c)| c)
                .collect()
        } else {
            s.chars()
                .rev()
                .enumerate()
                .filter(|&(k, _)| taken(n - 1 - k as i128))
                .map(|(_, c)| c)
                .collect()
        };
        return Ok(Value::from(out));
    }
    reserve_items(state, count.max(0) as u128, "a slice")?;
    let items: Vec<Value> = obj.try_iter()?.collect();
    let mut picked = Vec::with_capacity(count.max(0) as usize);
    let mut i = from;
    while (step > 0 && i < to) || (step < 0 && i > to) {
        picked.push(items[i as usize].clone());
        i += step;
    }
    Ok(match t {
        PyType::Tuple => Value::from(minijinja::value::Tuple::from(picked)),
        _ => Value::from(picked),
    })
}
