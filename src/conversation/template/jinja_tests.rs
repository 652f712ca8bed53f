//! jinja2's tests (`x is defined`, `x is sequence`, ...) as jinja2 decides them on Python
//! values: a string and a dict are sequences, `True` is a number but not an integer, `None` is
//! not iterable, an undefined value is iterable, callable and a sequence (jinja2's `Undefined`
//! has `__iter__`, `__call__`, `__len__` and `__getitem__`), a generator is iterable but no
//! sequence. The comparison tests compare as Python's operators do.

use minijinja::value::Value;
use minijinja::{Environment, Error, State};

use super::pyops;
use super::python::{PyType, py_compare, py_eq, py_type, refusal, to_str};
use super::strings::{self, Predicate};

/// jinja2's tests, all implemented here (the rewrite refuses any other name).
pub const NAMES: &[&str] = &[
    "boolean",
    "callable",
    "defined",
    "divisibleby",
    "eq",
    "equalto",
    "==",
    "escaped",
    "even",
    "false",
    "filter",
    "float",
    "ge",
    ">=",
    "gt",
    "greaterthan",
    ">",
    "in",
    "integer",
    "iterable",
    "le",
    "<=",
    "lower",
    "lt",
    "lessthan",
    "<",
    "mapping",
    "ne",
    "!=",
    "none",
    "number",
    "odd",
    "sameas",
    "sequence",
    "string",
    "test",
    "true",
    "undefined",
    "upper",
];

/// Registers the tests over minijinja's.
pub fn register(env: &mut Environment<'_>) {
    env.add_test("boolean", |v: Value| py_type(&v) == PyType::Bool);
    // Macros, functions, bound methods and `loop` are callable, and so is jinja2's `Undefined`.
    env.add_test("callable", |v: Value| {
        v.is_undefined()
            || v.kind() == minijinja::value::ValueKind::Plain
            || matches!(py_type(&v), PyType::Macro | PyType::Loop)
    });
    env.add_test("defined", |v: Value| !v.is_undefined());
    env.add_test("undefined", |v: Value| v.is_undefined());
    env.add_test("none", |v: Value| v.is_none());
    env.add_test("true", |v: Value| {
        py_type(&v) == PyType::Bool && v.is_true()
    });
    env.add_test("false", |v: Value| {
        py_type(&v) == PyType::Bool && !v.is_true()
    });
    env.add_test("number", |v: Value| {
        matches!(py_type(&v), PyType::Bool | PyType::Int | PyType::Float)
    });
    env.add_test("integer", |v: Value| py_type(&v) == PyType::Int);
    env.add_test("float", |v: Value| py_type(&v) == PyType::Float);
    env.add_test("string", |v: Value| {
        matches!(py_type(&v), PyType::Str | PyType::Markup)
    });
    env.add_test("escaped", |v: Value| py_type(&v) == PyType::Markup);
    env.add_test("mapping", |v: Value| py_type(&v) == PyType::Dict);
    env.add_test("sequence", |v: Value| {
        matches!(
            py_type(&v),
            PyType::Undefined
                | PyType::Str
                | PyType::Markup
                | PyType::List
                | PyType::Tuple
                | PyType::Dict
                | PyType::Range
        )
    });
    env.add_test("iterable", |v: Value| {
        matches!(
            py_type(&v),
            PyType::Undefined
                | PyType::Str
                | PyType::Markup
                | PyType::List
                | PyType::Tuple
                | PyType::Dict
                | PyType::Range
                | PyType::Iter
        )
    });
    env.add_test("lower", |v: Value| -> Result<bool, Error> {
        strings::predicate(&to_str(&v)?, Predicate::Lower)
    });
    env.add_test("upper", |v: Value| -> Result<bool, Error> {
        strings::predicate(&to_str(&v)?, Predicate::Upper)
    });
    env.add_test("odd", |s: &State, v: Value| -> Result<bool, Error> {
        Ok(!py_eq(&pyops::rem(s, v, Value::from(2))?, &Value::from(0)))
    });
    env.add_test("even", |s: &State, v: Value| -> Result<bool, Error> {
        Ok(py_eq(&pyops::rem(s, v, Value::from(2))?, &Value::from(0)))
    });
    env.add_test(
        "divisibleby",
        |s: &State, v: Value, n: Value| -> Result<bool, Error> {
            Ok(py_eq(&pyops::rem(s, v, n)?, &Value::from(0)))
        },
    );
    for name in ["eq", "equalto", "=="] {
        env.add_test(name, |a: Value, b: Value| py_eq(&a, &b));
    }
    for name in ["ne", "!="] {
        env.add_test(name, |a: Value, b: Value| !py_eq(&a, &b));
    }
    for (names, op) in [
        (&["lt", "lessthan", "<"][..], "<"),
        (&["le", "<="][..], "<="),
        (&["gt", "greaterthan", ">"][..], ">"),
        (&["ge", ">="][..], ">="),
    ] {
        for name in names {
            env.add_test(*name, move |a: Value, b: Value| py_compare(&a, &b, op));
        }
    }
    env.add_test("in", |a: Value, b: Value| pyops::contains(b, a));
    env.add_test("sameas", |a: Value, b: Value| -> Result<bool, Error> {
        // Python's identity is defined for None, True and False; for other values it is an
        // accident of the interpreter.
        match (py_type(&a), py_type(&b)) {
            (PyType::None | PyType::Bool, _) | (_, PyType::None | PyType::Bool) => {
                Ok(py_type(&a) == py_type(&b) && a.is_true() == b.is_true())
            }
            _ => Err(refusal(
                "`is sameas` between values other than None, True and False",
            )),
        }
    });
    env.add_test("filter", |v: Value| -> Result<bool, Error> {
        let name = to_str(&v)?;
        Ok(super::filters::IMPLEMENTED.contains(&name.as_str())
            || super::filters::NOT_IMPLEMENTED.contains(&name.as_str()))
    });
    env.add_test("test", |v: Value| -> Result<bool, Error> {
        Ok(NAMES.contains(&to_str(&v)?.as_str()))
    });
}
