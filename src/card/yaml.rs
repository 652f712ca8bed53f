//! A YAML 1.2 document tree that keeps, for every node, its byte span and scalar style.
//!
//! serde's data model erases both, yet every lint finding must point at a line and the YAML 1.1
//! lint must know whether a scalar was quoted. So the front matter is built from the event stream
//! of `granit-parser` (the parser under serde-saphyr) with our own budgets: nesting depth, alias
//! count and total nodes after alias expansion (alias bombs), plus strict duplicate-key rejection.
//! Plain scalars resolve by the YAML 1.2 core schema, not PyYAML's 1.1 rules; the lint reports the
//! scalars the two read differently.

use std::collections::HashMap;
use std::ops::Range;

use granit_parser::{Event, Parser, ScalarStyle, Span};
use serde_json::{Map, Number, Value};

/// Limits that keep a hostile front matter from exhausting memory or time.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub max_depth: usize,
    pub max_aliases: usize,
    pub max_nodes: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            max_depth: 64,
            max_aliases: 1_000,
            max_nodes: 200_000,
        }
    }
}

/// One YAML node with its byte span in the whole file.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub span: Range<usize>,
    pub kind: NodeKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Scalar(Scalar),
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    /// The scalar's text after escape processing.
    pub text: String,
    pub style: ScalarStyle,
    /// The value under the YAML 1.2 core schema (or an explicit core tag).
    pub value: Value,
}

impl Scalar {
    pub fn is_plain(&self) -> bool {
        self.style == ScalarStyle::Plain
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub key_span: Range<usize>,
    /// The key as written was a plain (unquoted) scalar.
    pub key_plain: bool,
    pub value: Node,
}

/// Why a front matter could not be read; the offset is in bytes from the start of the file.
#[derive(Debug, Clone, PartialEq)]
pub enum YamlError {
    Syntax {
        offset: usize,
        message: String,
    },
    DuplicateKey {
        offset: usize,
        key: String,
        first_offset: usize,
    },
    Budget {
        offset: usize,
        what: &'static str,
        limit: usize,
    },
    Unsupported {
        offset: usize,
        message: String,
    },
}

impl Node {
    /// The node as JSON (mapping keys are their scalar text, as the Hub's JSON API serves them).
    pub fn to_json(&self) -> Value {
        match &self.kind {
            NodeKind::Scalar(s) => s.value.clone(),
            NodeKind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeKind::Map(entries) => {
                let mut map = Map::new();
                for e in entries {
                    map.insert(e.key.clone(), e.value.to_json());
                }
                Value::Object(map)
            }
        }
    }

    pub fn get(&self, key: &str) -> Option<&Entry> {
        match &self.kind {
            NodeKind::Map(entries) => entries.iter().find(|e| e.key == key),
            _ => None,
        }
    }

    pub fn as_scalar(&self) -> Option<&Scalar> {
        match &self.kind {
            NodeKind::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// Visit every node with its JSON pointer and, for mapping values, the key's span.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&str, Option<&'a Range<usize>>, &'a Node)) {
        fn go<'a>(
            node: &'a Node,
            pointer: &mut String,
            key_span: Option<&'a Range<usize>>,
            f: &mut impl FnMut(&str, Option<&'a Range<usize>>, &'a Node),
        ) {
            f(pointer, key_span, node);
            let len = pointer.len();
            match &node.kind {
                NodeKind::Scalar(_) => {}
                NodeKind::Seq(items) => {
                    for (i, item) in items.iter().enumerate() {
                        pointer.push('/');
                        pointer.push_str(&i.to_string());
                        go(item, pointer, None, f);
                        pointer.truncate(len);
                    }
                }
                NodeKind::Map(entries) => {
                    for e in entries {
                        pointer.push('/');
                        pointer.push_str(&escape_pointer_token(&e.key));
                        go(&e.value, pointer, Some(&e.key_span), f);
                        pointer.truncate(len);
                    }
                }
            }
        }
        go(self, &mut String::new(), None, f);
    }
}

/// Escape one JSON-pointer reference token (RFC 6901).
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Parse one YAML document; `base` is the byte offset of `source` in the file. An empty document
/// gives `None`.
pub fn parse(source: &str, base: usize, budget: Budget) -> Result<Option<Node>, YamlError> {
    Builder {
        base,
        budget,
        stack: Vec::new(),
        anchors: HashMap::new(),
        aliases: 0,
        nodes: 0,
    }
    .run(source)
}

enum Frame {
    Seq {
        start: usize,
        items: Vec<Node>,
        anchor: usize,
    },
    Map {
        start: usize,
        entries: Vec<Entry>,
        key: Option<PendingKey>,
        anchor: usize,
    },
}

struct PendingKey {
    text: String,
    span: Range<usize>,
    plain: bool,
}

struct Builder {
    base: usize,
    budget: Budget,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    aliases: usize,
    nodes: usize,
}

impl Builder {
    fn run(mut self, source: &str) -> Result<Option<Node>, YamlError> {
        let mut parser = Parser::new_from_str(source);
        let mut root = None;
        let mut documents = 0;
        while let Some(next) = parser.next_event() {
            let (event, span) = next.map_err(|e| YamlError::Syntax {
                offset: self.base + marker_offset(source, e.marker()),
                message: e.to_string(),
            })?;
            let start = self.offset(source, &span, true);
            let end = self.offset(source, &span, false);
            match event {
                Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
                Event::DocumentStart(..) => {
                    documents += 1;
                    if documents > 1 {
                        return Err(YamlError::Unsupported {
                            offset: start,
                            message: "more than one YAML document in the front matter".into(),
                        });
                    }
                }
                Event::Scalar(text, style, anchor, tag) => {
                    let value = resolve(&text, style, tag.as_deref(), start)?;
                    let node = Node {
                        span: start..end,
                        kind: NodeKind::Scalar(Scalar {
                            text: text.into_owned(),
                            style,
                            value,
                        }),
                    };
                    self.count(1, start)?;
                    if let Some(done) = self.push(node, anchor)? {
                        root = Some(done);
                    }
                }
                Event::SequenceStart(_, anchor, tag) => {
                    check_collection_tag(tag.as_deref(), "seq", start)?;
                    self.open(
                        Frame::Seq {
                            start,
                            items: Vec::new(),
                            anchor,
                        },
                        start,
                    )?;
                }
                Event::MappingStart(_, anchor, tag) => {
                    check_collection_tag(tag.as_deref(), "map", start)?;
                    let frame = Frame::Map {
                        start,
                        entries: Vec::new(),
                        key: None,
                        anchor,
                    };
                    self.open(frame, start)?;
                }
                Event::SequenceEnd | Event::MappingEnd => {
                    let (node, anchor) = match self.stack.pop() {
                        Some(Frame::Seq {
                            start,
                            items,
                            anchor,
                        }) => (
                            Node {
                                span: start..end,
                                kind: NodeKind::Seq(items),
                            },
                            anchor,
                        ),
                        Some(Frame::Map {
                            start,
                            entries,
                            anchor,
                            ..
                        }) => (
                            Node {
                                span: start..end,
                                kind: NodeKind::Map(entries),
                            },
                            anchor,
                        ),
                        None => unreachable_syntax(start)?,
                    };
                    if let Some(done) = self.push(node, anchor)? {
                        root = Some(done);
                    }
                }
                Event::Alias(id) => {
                    self.aliases += 1;
                    if self.aliases > self.budget.max_aliases {
                        return Err(YamlError::Budget {
                            offset: start,
                            what: "alias",
                            limit: self.budget.max_aliases,
                        });
                    }
                    let Some(target) = self.anchors.get(&id).cloned() else {
                        return Err(YamlError::Syntax {
                            offset: start,
                            message: "alias refers to an unknown anchor".into(),
                        });
                    };
                    self.count(count_nodes(&target, self.budget.max_nodes), start)?;
                    let node = relocate(target, start..end);
                    if let Some(done) = self.push(node, 0)? {
                        root = Some(done);
                    }
                }
                _ => {}
            }
        }
        Ok(root)
    }

    fn offset(&self, source: &str, span: &Span, start: bool) -> usize {
        let marker = if start { span.start } else { span.end };
        self.base + marker_offset(source, &marker)
    }

    fn count(&mut self, n: usize, offset: usize) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > self.budget.max_nodes {
            return Err(YamlError::Budget {
                offset,
                what: "node",
                limit: self.budget.max_nodes,
            });
        }
        Ok(())
    }

    fn open(&mut self, frame: Frame, offset: usize) -> Result<(), YamlError> {
        if self.stack.len() >= self.budget.max_depth {
            return Err(YamlError::Budget {
                offset,
                what: "nesting depth",
                limit: self.budget.max_depth,
            });
        }
        self.count(1, offset)?;
        self.stack.push(frame);
        Ok(())
    }

    /// Attach a finished node to its parent; returns it when it is the document root.
    fn push(&mut self, node: Node, anchor: usize) -> Result<Option<Node>, YamlError> {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => Ok(Some(node)),
            Some(Frame::Seq { items, .. }) => {
                items.push(node);
                Ok(None)
            }
            Some(Frame::Map { entries, key, .. }) => {
                match key.take() {
                    None => {
                        let text = match &node.kind {
                            NodeKind::Scalar(s) => key_text(s),
                            _ => {
                                return Err(YamlError::Unsupported {
                                    offset: node.span.start,
                                    message: "a mapping key must be a scalar".into(),
                                });
                            }
                        };
                        if text == "<<" && node.as_scalar().is_some_and(Scalar::is_plain) {
                            return Err(YamlError::Unsupported {
                                offset: node.span.start,
                                message: "merge keys (`<<`) are YAML 1.1 only; write the keys out"
                                    .into(),
                            });
                        }
                        if let Some(first) = entries.iter().find(|e| e.key == text) {
                            return Err(YamlError::DuplicateKey {
                                offset: node.span.start,
                                key: text,
                                first_offset: first.key_span.start,
                            });
                        }
                        let plain = node.as_scalar().is_some_and(Scalar::is_plain);
                        *key = Some(PendingKey {
                            text,
                            span: node.span,
                            plain,
                        });
                    }
                    Some(k) => entries.push(Entry {
                        key: k.text,
                        key_span: k.span,
                        key_plain: k.plain,
                        value: node,
                    }),
                }
                Ok(None)
            }
        }
    }
}

fn unreachable_syntax<T>(offset: usize) -> Result<T, YamlError> {
    Err(YamlError::Syntax {
        offset,
        message: "unbalanced collection end".into(),
    })
}

/// The text a key is known by in JSON: its scalar text, with `null`-like keys kept literally.
fn key_text(s: &Scalar) -> String {
    match &s.value {
        Value::String(text) => text.clone(),
        Value::Number(n) if s.is_plain() => n.to_string(),
        _ => s.text.clone(),
    }
}

fn marker_offset(source: &str, marker: &granit_parser::Marker) -> usize {
    marker.byte_offset().unwrap_or_else(|| {
        source
            .char_indices()
            .nth(marker.index())
            .map_or(source.len(), |(i, _)| i)
    })
}

fn count_nodes(node: &Node, cap: usize) -> usize {
    let mut n = 0usize;
    node.walk(&mut |_, _, _| n = n.saturating_add(1).min(cap.saturating_add(1)));
    n
}

/// An expanded alias takes the span of the alias itself: that is where a reader should look.
fn relocate(mut node: Node, span: Range<usize>) -> Node {
    node.span = span.clone();
    match &mut node.kind {
        NodeKind::Scalar(_) => {}
        NodeKind::Seq(items) => {
            for item in items.iter_mut() {
                *item = relocate(std::mem::replace(item, placeholder()), span.clone());
            }
        }
        NodeKind::Map(entries) => {
            for e in entries.iter_mut() {
                e.key_span = span.clone();
                e.value = relocate(std::mem::replace(&mut e.value, placeholder()), span.clone());
            }
        }
    }
    node
}

fn placeholder() -> Node {
    Node {
        span: 0..0,
        kind: NodeKind::Seq(Vec::new()),
    }
}

fn check_collection_tag(
    tag: Option<&granit_parser::Tag>,
    expected: &str,
    offset: usize,
) -> Result<(), YamlError> {
    match tag {
        None => Ok(()),
        Some(t) if t.core_suffix() == Some(expected) => Ok(()),
        Some(t) => Err(YamlError::Unsupported {
            offset,
            message: format!("tag `{}` on a collection", t.original()),
        }),
    }
}

/// Resolve a scalar by the YAML 1.2 core schema; quoted and block scalars are strings.
fn resolve(
    text: &str,
    style: ScalarStyle,
    tag: Option<&granit_parser::Tag>,
    offset: usize,
) -> Result<Value, YamlError> {
    if let Some(tag) = tag {
        let bad = |what: &str| YamlError::Unsupported {
            offset,
            message: format!("`{text}` is not a valid {what}"),
        };
        return match tag.core_suffix() {
            Some("str") => Ok(Value::String(text.to_owned())),
            Some("null") => core_null(text)
                .then_some(Value::Null)
                .ok_or_else(|| bad("!!null")),
            Some("bool") => core_bool(text)
                .map(Value::Bool)
                .ok_or_else(|| bad("!!bool")),
            Some("int") => core_int(text).ok_or_else(|| bad("!!int")),
            Some("float") => core_int(text)
                .or_else(|| core_float(text))
                .ok_or_else(|| bad("!!float")),
            _ => Err(YamlError::Unsupported {
                offset,
                message: format!(
                    "tag `{}` (only the YAML core tags are read)",
                    tag.original()
                ),
            }),
        };
    }
    if style != ScalarStyle::Plain {
        return Ok(Value::String(text.to_owned()));
    }
    if core_null(text) {
        return Ok(Value::Null);
    }
    if let Some(b) = core_bool(text) {
        return Ok(Value::Bool(b));
    }
    Ok(core_int(text)
        .or_else(|| core_float(text))
        .unwrap_or_else(|| Value::String(text.into())))
}

fn core_null(text: &str) -> bool {
    matches!(text, "" | "~" | "null" | "Null" | "NULL")
}

fn core_bool(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

fn core_int(text: &str) -> Option<Value> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let (radix, body) = if let Some(rest) = text.strip_prefix("0o") {
        (8, rest)
    } else if let Some(rest) = text.strip_prefix("0x") {
        (16, rest)
    } else {
        (10, digits)
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u128::from_str_radix(body, radix).ok();
    let number = match magnitude {
        Some(m) if !negative && m <= u64::MAX as u128 => Number::from(m as u64),
        Some(m) if negative && m <= i64::MAX as u128 + 1 => Number::from((-(m as i128)) as i64),
        // Too large for an integer: YAML readers fall back to a float, losing digits. The lint
        // flags this for revisions (an all-digit commit hash).
        _ => {
            let f: f64 = body.parse::<f64>().ok()?;
            Number::from_f64(if negative { -f } else { f })?
        }
    };
    Some(Value::Number(number))
}

fn core_float(text: &str) -> Option<Value> {
    let t = text.strip_prefix(['-', '+']).unwrap_or(text);
    if matches!(t, ".inf" | ".Inf" | ".INF") || matches!(text, ".nan" | ".NaN" | ".NAN") {
        // JSON has no infinities or NaN; keep the text so validation says what is wrong.
        return Some(Value::String(text.to_owned()));
    }
    if !is_core_float_syntax(t) {
        return None;
    }
    let f: f64 = text.parse().ok()?;
    Some(Number::from_f64(f).map_or_else(|| Value::String(text.to_owned()), Value::Number))
}

/// `(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`
fn is_core_float_syntax(t: &str) -> bool {
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => {
            (int.is_empty() && !frac.is_empty() || !int.is_empty())
                && int.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|b| b.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
    });
    mantissa_ok && exponent_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn json_of(src: &str) -> Value {
        parse(src, 0, Budget::default()).unwrap().unwrap().to_json()
    }

    #[test]
    fn resolves_plain_scalars_by_the_yaml_1_2_core_schema() {
        let v = json_of(
            "a: no\nb: yes\nc: 0755\nd: 0o17\ne: 0x1F\nf: 1_000\ng: 1e3\nh: ~\ni: True\nj: 1.5\nk: '12'\nl: 1:30\nm: .inf\n",
        );
        assert_eq!(
            v,
            json!({"a": "no", "b": "yes", "c": 755, "d": 15, "e": 31, "f": "1_000", "g": 1000.0,
                   "h": null, "i": true, "j": 1.5, "k": "12", "l": "1:30", "m": ".inf"})
        );
    }

    #[test]
    fn huge_all_digit_numbers_become_floats() {
        let v = json_of("r: 1234567890123456789012345678901234567890\n");
        assert!(v["r"].is_f64());
    }

    #[test]
    fn keeps_spans_of_keys_and_values() {
        let src = "top:\n  inner: [1, 2]\n";
        let root = parse(src, 10, Budget::default()).unwrap().unwrap();
        let mut seen = Vec::new();
        root.walk(&mut |p, k, n| seen.push((p.to_owned(), k.cloned(), n.span.clone())));
        let inner = seen.iter().find(|(p, ..)| p == "/top/inner").unwrap();
        assert_eq!(inner.1, Some(17..22));
        assert_eq!(&src[inner.2.start - 10..inner.2.end - 10], "[1, 2]");
        let item = seen.iter().find(|(p, ..)| p == "/top/inner/1").unwrap();
        assert_eq!(&src[item.2.start - 10..item.2.end - 10], "2");
    }

    #[test]
    fn rejects_duplicate_keys_at_the_second_occurrence() {
        let err = parse("a: 1\nb: 2\na: 3\n", 0, Budget::default()).unwrap_err();
        assert_eq!(
            err,
            YamlError::DuplicateKey {
                offset: 10,
                key: "a".into(),
                first_offset: 0
            }
        );
    }

    #[test]
    fn alias_bombs_hit_the_node_budget() {
        let mut src = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 0..8 {
            let prev = if i == 0 {
                "a".to_string()
            } else {
                format!("l{}", i - 1)
            };
            src.push_str(&format!("l{i}: &l{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"));
        }
        let err = parse(&src, 0, Budget::default()).unwrap_err();
        assert!(
            matches!(err, YamlError::Budget { what: "node", .. }),
            "{err:?}"
        );
    }

    #[test]
    fn deep_nesting_hits_the_depth_budget() {
        let src = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let err = parse(&src, 0, Budget::default()).unwrap_err();
        assert!(
            matches!(err, YamlError::Budget { .. } | YamlError::Syntax { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn aliases_expand_like_pyyaml() {
        assert_eq!(
            json_of("a: &x {k: 1}\nb: *x\n"),
            json!({"a": {"k": 1}, "b": {"k": 1}})
        );
    }
}
