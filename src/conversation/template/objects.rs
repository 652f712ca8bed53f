//! The Python objects jinja2's filters and methods return that are not lists: generators
//! (`map`, `select`, `unique`, ...), iterators (`reverse` of a list, `items`), dict views
//! (`.items()`, `.keys()`, `.values()`), ranges, and bound methods (`message.items` without a
//! call). They behave as in Python: a generator is consumed once and has no length, is always
//! true and is no JSON; a view has a length and prints as `dict_items([...])`.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use minijinja::{Error, State};

/// What kind of Python iterator or view a [`PyIter`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IterKind {
    /// A generator (`map`, `select`, `reject`, `selectattr`, `rejectattr`, `unique`, `batch`,
    /// `slice`, `items`): consumed once, no length, always true.
    Generator,
    /// `reversed(list)`: consumed once, no length, always true.
    ListReverse,
    /// `dict.keys()`, `dict.values()`, `dict.items()`: iterated any number of times, with a
    /// length.
    Keys,
    Values,
    Items,
}

impl IterKind {
    /// The name Python gives the type.
    pub fn type_name(self) -> &'static str {
        match self {
            IterKind::Generator => "generator",
            IterKind::ListReverse => "list_reverseiterator",
            IterKind::Keys => "dict_keys",
            IterKind::Values => "dict_values",
            IterKind::Items => "dict_items",
        }
    }

    /// A view's name as its `repr` writes it (`dict_items([...])`); iterators have no text but
    /// their address.
    pub fn view_name(self) -> Option<&'static str> {
        self.is_view().then(|| self.type_name())
    }

    pub fn is_view(self) -> bool {
        matches!(self, IterKind::Keys | IterKind::Values | IterKind::Items)
    }
}

/// A Python iterator or dict view over values computed when it was made.
#[derive(Debug)]
pub struct PyIter {
    pub kind: IterKind,
    items: Vec<Value>,
    /// How many items an iterator has handed out (a view never advances).
    cursor: AtomicUsize,
}

impl PyIter {
    pub fn value(kind: IterKind, items: Vec<Value>) -> Value {
        Value::from_object(PyIter {
            kind,
            items,
            cursor: AtomicUsize::new(0),
        })
    }

    /// The items not yet consumed (all of a view's).
    pub fn peek(&self) -> &[Value] {
        &self.items[self.cursor.load(Ordering::Relaxed).min(self.items.len())..]
    }

    /// The items not yet consumed, consuming them (an iterator is then exhausted).
    pub fn take(&self) -> Vec<Value> {
        let rest = self.peek().to_vec();
        if !self.kind.is_view() {
            self.cursor.store(self.items.len(), Ordering::Relaxed);
        }
        rest
    }

    /// Python's `next()`: the next item, consuming it.
    pub fn next(&self) -> Option<Value> {
        if self.kind.is_view() {
            return self.items.first().cloned();
        }
        let at = self.cursor.fetch_add(1, Ordering::Relaxed);
        self.items.get(at).cloned()
    }

    /// A view's length; iterators have none.
    pub fn len(&self) -> Option<usize> {
        self.kind.is_view().then_some(self.items.len())
    }
}

impl Object for PyIter {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Iterable
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.take())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        self.len()
    }

    fn is_true(self: &Arc<Self>) -> bool {
        self.len().is_none_or(|n| n > 0)
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} object>", self.kind.type_name())
    }
}

/// Python's `range`, as jinja2's sandbox bounds it (100,000 items at most).
#[derive(Debug)]
pub struct PyRange {
    pub start: i64,
    pub stop: i64,
    pub step: i64,
}

/// jinja2's `MAX_RANGE`.
pub const MAX_RANGE: u64 = 100_000;

impl PyRange {
    pub fn len(&self) -> u64 {
        let (start, stop, step) = (
            i128::from(self.start),
            i128::from(self.stop),
            i128::from(self.step),
        );
        let n = if step > 0 {
            (stop - start + step - 1) / step
        } else {
            (start - stop - step - 1) / -step
        };
        n.max(0) as u64
    }

    pub fn items(&self) -> impl Iterator<Item = i64> + '_ {
        (0..self.len()).map(|i| self.start + i as i64 * self.step)
    }

    pub fn repr(&self) -> String {
        if self.step == 1 {
            format!("range({}, {})", self.start, self.stop)
        } else {
            format!("range({}, {}, {})", self.start, self.stop, self.step)
        }
    }
}

impl Object for PyRange {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let len = self.len() as i64;
        let i = key.as_i64()?;
        let i = if i < 0 { i + len } else { i };
        (0..len)
            .contains(&i)
            .then(|| Value::from(self.start + i * self.step))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(self.len() as usize)
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&PyRange::repr(self))
    }
}

/// A bound method read as an attribute (`message.items`, `text.upper`): jinja2 resolves the
/// attribute to the method before any key of that name, so it is callable, true and
/// defined, and prints as its address.
#[derive(Debug)]
pub struct PyMethod {
    pub receiver: Value,
    pub name: String,
}

impl Object for PyMethod {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn call(self: &Arc<Self>, state: &mut State<'_, '_>, args: &[Value]) -> Result<Value, Error> {
        super::methods::call_method(state, &self.receiver, &self.name, args)
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<built-in method {}>", self.name)
    }
}

/// jinja2's `_GroupTuple` from `groupby`: a `(grouper, list)` tuple whose items are also its
/// attributes `grouper` and `list`.
#[derive(Debug)]
pub struct GroupTuple {
    pub grouper: Value,
    pub list: Value,
}

impl Object for GroupTuple {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match (key.as_i64(), key.as_str()) {
            (Some(0 | -2), _) | (_, Some("grouper")) => Some(self.grouper.clone()),
            (Some(1 | -1), _) | (_, Some("list")) => Some(self.list.clone()),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Seq(2)
    }
}
