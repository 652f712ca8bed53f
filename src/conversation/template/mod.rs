//! Chat templates rendered as transformers' `apply_chat_template` renders them (issue #19), so a
//! conversation eval text is the bytes the reference's own stack would have fed the model.
//!
//! transformers compiles a template in jinja2's `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` with the loop-control extension, `{% generation %}` blocks, the globals
//! `raise_exception` and `strftime_now`, its own `tojson` (`json.dumps`, not jinja2's HTML-safe
//! one), `dict` and a `namespace` that refuses underscore names. Python's semantics are what a
//! template sees: `None | length` raises, `map` returns a generator that `tojson` refuses, a
//! dict's `.items` is its method, `Markup + str` escapes.
//!
//! cardproof parses the template with minijinja (whose syntax is jinja2's), rewrites the parsed
//! template so every construct whose meaning differs is routed through cardproof's
//! implementation of Python's ([`rewrite`]), and runs it in a minijinja environment whose
//! filters, tests, methods and output are jinja2's ([`filters`], [`jinja_tests`], [`methods`],
//! [`python`]). A construct cardproof cannot write as jinja2 does is refused by name
//! ([`python::REFUSAL`]); everything a template builds is bounded ([`limits`]). The CI corpus
//! check renders llama.cpp's 70 real templates and a set of probes of each rule through both
//! and compares bytes.

pub mod clock;
mod filters;
mod format;
mod jinja_tests;
pub mod json;
pub mod limits;
mod methods;
mod objects;
mod pyops;
pub mod python;
mod rewrite;
mod strings;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use minijinja::machinery::{self, CodeGenerator, Instructions};
use minijinja::value::{Kwargs, Rest, Value, ValueOrKwargs};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

pub use clock::strftime;

use limits::{FUEL, MAX_BYTES};
use objects::{MAX_RANGE, PyRange};
use python::{PyType, as_int, py_type, refusal, to_str, type_error, type_name, value_error};

/// A chat template, checked to compile as jinja2 would compile it.
pub struct ChatTemplate {
    /// The source with `{% generation %}` blocks made plain blocks.
    source: String,
    /// What errors call the template: its file (and name within a tokenizer config).
    name: String,
    clock: i64,
}

/// The name of a template given without one.
const UNNAMED: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source` with `clock` (seconds since the Unix epoch, UTC) as `strftime_now`'s
    /// time. The error names the construct that does not compile and its line.
    pub fn new(source: &str, clock: i64) -> Result<ChatTemplate, String> {
        ChatTemplate::named(source, clock, UNNAMED)
    }

    /// [`ChatTemplate::new`] with the name errors give the template (its file).
    pub fn named(source: &str, clock: i64, name: &str) -> Result<ChatTemplate, String> {
        if source.len() > MAX_BYTES {
            return Err(format!(
                "the chat template {name} holds {} bytes, over cardproof's bound of {MAX_BYTES}",
                source.len()
            ));
        }
        let template = ChatTemplate {
            source: generation_as_block(source),
            name: name.to_owned(),
            clock,
        };
        template.compile()?;
        Ok(template)
    }

    /// Renders with `context` (`messages`, `tools`, `add_generation_prompt`, the template's
    /// kwargs and special tokens), as `compiled_template.render(**context)` does. The error
    /// names the template's error (Python's, where Python would raise) and its line. For many
    /// renders, [`ChatTemplate::compiled`] once and [`Compiled::render`] each.
    pub fn render(&self, context: &serde_json::Value) -> Result<String, String> {
        self.compiled()?.render(context)
    }

    /// The template parsed, rewritten and compiled, with its environment, once for many
    /// renders: labelling renders a conversation up to six times and a file holds thousands of
    /// conversations, and compiling is most of a short conversation's render.
    pub fn compiled(&self) -> Result<Compiled<'_>, String> {
        let (instructions, blocks) = self.compile()?;
        let written = Arc::new(AtomicUsize::new(0));
        Ok(Compiled {
            template: self,
            env: environment(self.clock, written.clone()),
            instructions,
            blocks,
            written,
            _one_thread: std::marker::PhantomData,
        })
    }

    /// Parses, rewrites ([`rewrite`]) and compiles the template.
    #[allow(clippy::type_complexity)]
    fn compile(&self) -> Result<(Instructions<'_>, BTreeMap<&str, Instructions<'_>>), String> {
        limits::check_expressions(&self.source, syntax())
            .map_err(|(e, line)| self.describe(&e, Some(line), "does not compile"))?;
        let ast = machinery::parse(&self.source, &self.name, syntax())
            .map_err(|e| self.describe(&e, e.line(), "does not compile"))?;
        let ast = rewrite::template(&ast, &self.source)
            .map_err(|(e, line)| self.describe(&e, Some(line), "does not compile"))?;
        let mut generator = CodeGenerator::new(&self.name, &self.source);
        generator.compile_stmt(&ast);
        Ok(generator.finish())
    }

    /// An error as one line: the template, the line, and what went wrong.
    fn describe(&self, e: &Error, line: Option<usize>, what: &str) -> String {
        let detail = match (e.kind(), e.detail()) {
            (ErrorKind::OutOfFuel, _) => format!(
                "it ran past cardproof's bound of {FUEL} units of work on one render (one per instruction, one per 16 to 64 bytes it creates)"
            ),
            // minijinja's own errors, named by the Python error jinja2 raises for them.
            (ErrorKind::SyntaxError, d) => {
                format!("TemplateSyntaxError: {}", d.unwrap_or("invalid syntax"))
            }
            (ErrorKind::TooManyArguments | ErrorKind::MissingArgument, d) => {
                format!(
                    "TypeError: {}",
                    d.map_or_else(|| e.kind().to_string(), str::to_owned)
                )
            }
            (ErrorKind::UnknownFunction | ErrorKind::UndefinedError, d)
                if !d.is_some_and(|d| d.starts_with("UndefinedError:")) =>
            {
                format!(
                    "UndefinedError: {}",
                    d.map_or_else(|| e.kind().to_string(), str::to_owned)
                )
            }
            (_, Some(detail)) => detail.to_owned(),
            (kind, None) => kind.to_string(),
        };
        let name = if self.name == UNNAMED {
            "the chat template".to_owned()
        } else {
            format!("the chat template {}", self.name)
        };
        match line {
            Some(line) => format!("{name} {what} (line {line}): {detail}"),
            None => format!("{name} {what}: {detail}"),
        }
    }
}

/// A [`ChatTemplate`] compiled once ([`ChatTemplate::compiled`]), rendered many times.
pub struct Compiled<'a> {
    template: &'a ChatTemplate,
    env: Environment<'a>,
    instructions: Instructions<'a>,
    blocks: BTreeMap<&'a str, Instructions<'a>>,
    /// Bytes the current render has written (reset by each render; fuel is per render too).
    written: Arc<AtomicUsize>,
    /// Renders share the counter: one thread renders at a time.
    _one_thread: std::marker::PhantomData<std::cell::Cell<()>>,
}

impl Compiled<'_> {
    /// [`ChatTemplate::render`] without compiling again.
    pub fn render(&self, context: &serde_json::Value) -> Result<String, String> {
        self.written.store(0, Ordering::Relaxed);
        let root = Value::from(minijinja::value::Serde(context));
        let mut text = String::new();
        let result = {
            let mut out = machinery::make_string_output(&mut text);
            machinery::eval(
                &self.env,
                &self.instructions,
                root,
                &self.blocks,
                &mut out,
                AutoEscape::None,
            )
            .map(|_| ())
        };
        result.map_err(|e| self.template.describe(&e, e.line(), "does not render"))?;
        Ok(text)
    }
}

/// transformers' whitespace settings.
fn syntax() -> minijinja::syntax::SyntaxConfig {
    minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .expect("a valid syntax")
}

/// The environment one render runs in; `written` counts the bytes it writes.
fn environment<'s>(clock: i64, written: Arc<AtomicUsize>) -> Environment<'s> {
    let mut env = Environment::new();
    env.set_debug(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // A template is code from a repository: bound its work (a loop that never ends is an
    // error, not a hang) and what it builds.
    env.set_fuel(Some(FUEL));
    env.set_formatter(move |out, _state, value| {
        let owned;
        let text = match py_type(value) {
            PyType::Str | PyType::Markup => value.as_str().unwrap_or_default(),
            _ => {
                owned = to_str(value)?;
                owned.as_str()
            }
        };
        let total = written.fetch_add(text.len(), Ordering::Relaxed) as u128 + text.len() as u128;
        if total > MAX_BYTES as u128 {
            return Err(limits::too_large("the render", total));
        }
        out.write_str(text)
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "the render could not be written"))
    });
    env.set_unknown_method_callback(|state, value, method, args| {
        methods::unknown_method(state, value, method, args)
    });
    filters::register(&mut env);
    jinja_tests::register(&mut env);
    globals(&mut env, clock);
    env.add_function("__cp_add", pyops::add);
    env.add_function("__cp_mul", pyops::mul);
    env.add_function("__cp_rem", pyops::rem);
    env.add_function("__cp_concat", pyops::concat);
    env.add_function("__cp_compare", |a: Value, op: String, b: Value| {
        pyops::compare(a, &op, b)
    });
    env.add_function("__cp_neg", pyops::neg);
    env.add_function("__cp_eq", |a: Value, b: Value| python::py_eq(&a, &b));
    env.add_function("__cp_arith", |a: Value, op: String, b: Value| {
        pyops::arith(a, &op, b)
    });
    env.add_function("__cp_chain", pyops::chain);
    env.add_function("__cp_contains", pyops::contains);
    env.add_function("__cp_iterate", pyops::iterate);
    env.add_function("__cp_iterate_unpacking", pyops::iterate_unpacking);
    env.add_function("__cp_unpack", pyops::unpack);
    env.add_function("__cp_generator", pyops::generator);
    env.add_function("__cp_nest", pyops::nest);
    env.add_function("__cp_assigned", pyops::assigned);
    env.add_function("__cp_getattr", |obj: Value, name: String| {
        pyops::getattr(obj, &name)
    });
    env.add_function("__cp_method", pyops::method);
    env.add_function("__cp_getitem", pyops::getitem);
    env.add_function("__cp_slice", pyops::slice);
    env.add_function("__cp_defined", pyops::defined);
    env.add_function("__cp_fail", |message: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, message))
    });
    env
}

/// transformers' globals (`raise_exception`, `strftime_now`, its `dict` and `namespace`) and
/// jinja2's (`range` as the sandbox bounds it).
fn globals(env: &mut Environment<'_>, clock: i64) {
    env.remove_global("debug");
    env.add_function(
        "raise_exception",
        |message: String| -> Result<Value, Error> {
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("TemplateError: {message}"),
            ))
        },
    );
    env.add_function(
        "strftime_now",
        move |state: &State, format: String| -> Result<Value, Error> {
            limits::reserve(state, format.len() as u128 * 16, "strftime_now")?;
            strftime(&format, clock).map(Value::from)
        },
    );
    env.add_function("range", range);
    env.add_function("dict", dict);
    env.add_function("namespace", |state: &State, args: Rest<Value>, kwargs: Kwargs| -> Result<Value, Error> {
        let attrs = dict(state, args, kwargs)?;
        for name in attrs.try_iter()? {
            if name.as_str().is_some_and(|n| n.starts_with('_')) {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "SecurityError: Chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'. Please rename the attribute.",
                        name.as_str().unwrap_or_default()
                    ),
                ));
            }
        }
        minijinja::functions::namespace(Some(ValueOrKwargs::from(attrs)))
    });
    for name in ["cycler", "joiner", "lipsum"] {
        env.add_function(name, move |_: Rest<Value>| -> Result<Value, Error> {
            Err(refusal(format!(
                "jinja2's `{name}`, which cardproof does not implement"
            )))
        });
    }
}

/// jinja2's sandboxed `range`: Python's, refused beyond 100,000 items.
fn range(args: Rest<Value>) -> Result<Value, Error> {
    let ints = args
        .iter()
        .map(|a| {
            as_int(a)
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| {
                    type_error(format!(
                        "'{}' object cannot be interpreted as an integer",
                        type_name(a)
                    ))
                })
        })
        .collect::<Result<Vec<i64>, Error>>()?;
    let (start, stop, step) = match ints.as_slice() {
        [stop] => (0, *stop, 1),
        [start, stop] => (*start, *stop, 1),
        [start, stop, step] => (*start, *stop, *step),
        _ => {
            return Err(type_error(format!(
                "range expected at most 3 arguments, got {}",
                ints.len()
            )));
        }
    };
    if step == 0 {
        return Err(value_error("range() arg 3 must not be zero"));
    }
    let r = PyRange { start, stop, step };
    if r.len() > MAX_RANGE {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE ({MAX_RANGE})."
            ),
        ));
    }
    Ok(Value::from_object(r))
}

/// transformers' `dict(*args, **kwargs)`: Python's `dict()` of a mapping or of pairs, updated
/// with the keyword arguments.
fn dict(state: &State, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let mut map: indexmap::IndexMap<Value, Value> = indexmap::IndexMap::new();
    match args.as_slice() {
        [] => {}
        [source] => match py_type(source) {
            PyType::Dict => {
                for k in source.try_iter()? {
                    let v = source.get_item(&k)?;
                    map.insert(k, v);
                }
            }
            PyType::List | PyType::Tuple | PyType::Iter => {
                for (i, pair) in source.try_iter()?.enumerate() {
                    let items: Vec<Value> = match py_type(&pair) {
                        PyType::List | PyType::Tuple | PyType::Str => pair.try_iter()?.collect(),
                        _ => {
                            return Err(type_error(format!(
                                "cannot convert dictionary update sequence element #{i} to a sequence"
                            )));
                        }
                    };
                    let [k, v] = <[Value; 2]>::try_from(items).map_err(|items| {
                        value_error(format!(
                            "dictionary update sequence element #{i} has length {}; 2 is required",
                            items.len()
                        ))
                    })?;
                    python::check_hashable(&k)?;
                    map.insert(k, v);
                }
            }
            _ => {
                return Err(type_error(format!(
                    "'{}' object is not iterable",
                    type_name(source)
                )));
            }
        },
        more => {
            return Err(type_error(format!(
                "dict expected at most 1 argument, got {}",
                more.len()
            )));
        }
    }
    for name in kwargs.args() {
        map.insert(Value::from(name), kwargs.get::<Value>(name)?);
    }
    limits::reserve_items(state, map.len() as u128 * 2, "dict")?;
    let map = Value::from_object(map);
    limits::check_depth(state, &map)?;
    Ok(map)
}

/// `{% generation %}` ... `{% endgeneration %}` (transformers' AssistantTracker) as an `if true`
/// block with the same whitespace control, so the rendered text is what jinja2 writes.
fn generation_as_block(source: &str) -> String {
    let open = regex::Regex::new(r"\{%(-|\+)?\s*generation\s*(-|\+)?%\}").expect("a valid regex");
    let close =
        regex::Regex::new(r"\{%(-|\+)?\s*endgeneration\s*(-|\+)?%\}").expect("a valid regex");
    let s = open.replace_all(source, "{%${1} if true ${2}%}");
    close.replace_all(&s, "{%${1} endif ${2}%}").into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, context: serde_json::Value) -> Result<String, String> {
        ChatTemplate::new(source, 0)?.render(&context)
    }

    #[test]
    fn tojson_writes_json_dumps_bytes() {
        let out = render(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':'), sort_keys=true) }}|{{ s | tojson(ensure_ascii=true) }}",
            serde_json::json!({
                "x": {"b": [1, 2.5, null, true], "a": "é</x>/\n"},
                "s": "é😀"
            }),
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, null, true], \"a\": \"é</x>/\\n\"}|{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"é</x>/\\n\"\n}|{\"a\":\"é</x>/\\n\",\"b\":[1,2.5,null,true]}|\"\\u00e9\\ud83d\\ude00\""
        );
    }

    #[test]
    fn tojson_takes_pythons_arguments_and_refuses_what_json_dumps_refuses() {
        let x = serde_json::json!({"x": {"b": 1, "a": [1]}});
        // Positionally, transformers' `tojson(x, ensure_ascii, indent, separators, sort_keys)`.
        assert_eq!(
            render("{{ x | tojson(false, 1) }}", x.clone()).unwrap(),
            "{\n \"b\": 1,\n \"a\": [\n  1\n ]\n}"
        );
        assert_eq!(
            render("{{ x | tojson(indent=true) }}", x.clone()).unwrap(),
            "{\n \"b\": 1,\n \"a\": [\n  1\n ]\n}"
        );
        assert_eq!(
            render("{{ x | tojson(indent='\t', sort_keys=1) }}", x.clone()).unwrap(),
            "{\n\t\"a\": [\n\t\t1\n\t],\n\t\"b\": 1\n}"
        );
        for (bad, why) in [
            ("{{ x | tojson(bogus=1) }}", "TypeError"),
            (
                "{{ x | tojson(separators=',') }}",
                "ValueError: not enough values to unpack (expected 2, got 1)",
            ),
            (
                "{{ x | tojson(indent=1.5) }}",
                "TypeError: can't multiply sequence by non-int of type 'float'",
            ),
            (
                "{{ nope | tojson }}",
                "TypeError: Object of type Undefined is not JSON serializable",
            ),
            (
                "{{ x.a | map('string') | tojson }}",
                "TypeError: Object of type generator is not JSON serializable",
            ),
            (
                "{{ {(1, 2): 1} | tojson }}",
                "TypeError: keys must be str, int, float, bool or None, not tuple",
            ),
        ] {
            let e = render(bad, x.clone()).unwrap_err();
            assert!(e.contains(why) && e.contains("(line 1)"), "{bad}: {e}");
        }
    }

    /// Every way issue #41 found (and more) for a template to build more than cardproof allows
    /// is refused before the value is built, as a `MemoryError` (or `RecursionError`) naming
    /// the line: widths, precisions, indents, repeats, joins, pads, splits, slices, nesting.
    #[test]
    fn a_width_repeat_or_nesting_beyond_the_bound_is_refused_naming_its_line() {
        for bomb in [
            "{{ x | tojson(indent=10**12) }}",
            "{{ x | tojson(indent=2**40) }}",
            r#"{{ "{:>5000000000}".format("x") }}"#,
            r#"{{ "{:.5000000000f}".format(1.5) }}"#,
            r#"{{ "%5000000000s" % "x" }}"#,
            r#"{{ "%.*f" % (5000000000, 1.5) }}"#,
            r#"{{ "%5000000000s" | format("x") }}"#,
            r#"{{ "x" * 10000000000 }}"#,
            "{{ [1] * 10000000000 }}",
            "{{ (1,) * 10000000000 }}",
            "{{ 'x' | center(10000000000) }}",
            "{{ 'x'.ljust(10000000000) }}",
            "{{ 'x'.center(10000000000, '-') }}",
            "{{ 'x'.zfill(10000000000) }}",
            r"{{ 'a\nb' | indent(10000000000) }}",
            "{{ ('x,' * 20000000).split(',') | length }}",
            "{{ strftime_now('%Y' * 10000000) }}",
            "{% for i in range(100000) %}{{ 'x' * 10000 }}{% endfor %}",
            "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}",
            "{% set ns = namespace(x=[1]) %}{% for i in range(1000) %}{% set ns.x = ns.x | batch(1) | list %}{% endfor %}",
            "{% set ns = namespace(x=1) %}{% set ns.x = ns %}",
        ] {
            let source = format!(
                "{{{{ '' }}}}
{bomb}"
            );
            let e = render(&source, serde_json::json!({"x": [1, 2]})).unwrap_err();
            assert!(e.contains("(line 2)"), "{bomb}: {e}");
            assert!(
                e.contains("MemoryError") || e.contains("RecursionError"),
                "{bomb}: {e}"
            );
        }
    }

    /// An expression deep enough to overflow the stack of the parser, the rewrite or the
    /// compiler is refused by its size; one of the largest size allowed renders, on a test
    /// thread's small stack.
    #[test]
    fn an_expression_too_deep_to_compile_is_refused_naming_its_line() {
        for deep in [
            format!("{{{{ {}1 }}}}", "1 + ".repeat(200_000)),
            format!("{{{{ x{} }}}}", ".a".repeat(200_000)),
            format!("{{{{ 1{} }}}}", "|abs".repeat(200_000)),
            format!("{{{{ x{} }}}}", "[0]".repeat(200_000)),
        ] {
            let e = ChatTemplate::new(&format!("a\n{deep}"), 0).err().unwrap();
            assert!(
                e.contains("(line 2)") && e.contains("more than 256 operators"),
                "{e}"
            );
        }
        let widest = format!("{{{{ {}1 }}}}", "1 + ".repeat(limits::MAX_OPERATORS));
        assert_eq!(render(&widest, serde_json::json!({})).unwrap(), "257");
    }

    /// A macro that calls itself without end is refused at minijinja's recursion limit, on a
    /// test thread's small stack.
    #[test]
    fn a_macro_that_recurses_without_end_is_refused() {
        let e = render(
            "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(e.contains("recursion"), "{e}");
    }

    /// Work is bounded too: a loop that does not end in time is refused, not a hang.
    #[test]
    fn a_template_that_runs_past_its_fuel_is_refused() {
        let e = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(e.contains("units of work on one render"), "{e}");
    }

    /// A template compiled once renders each time as a fresh one does: its bounds are per render
    /// (a render that ran out of fuel leaves nothing behind for the next), and nothing of one
    /// render's context stays for the next.
    #[test]
    fn a_template_compiled_once_renders_each_time_as_a_fresh_one() {
        let t = ChatTemplate::new(
            "{% if n %}{% for i in range(n) %}{% for j in range(n) %}{% endfor %}{% endfor %}{% endif %}{{ messages | length }}{{ x | default('-') }}",
            0,
        )
        .unwrap();
        let c = t.compiled().unwrap();
        let small = serde_json::json!({"messages": [1, 2], "n": 0, "x": 7});
        let other = serde_json::json!({"messages": [1], "n": 0});
        let endless = serde_json::json!({"messages": [], "n": 100000});
        assert_eq!(c.render(&small).unwrap(), "27");
        assert!(c.render(&endless).unwrap_err().contains("units of work"));
        assert_eq!(c.render(&other).unwrap(), t.render(&other).unwrap());
        assert_eq!(c.render(&other).unwrap(), "1-");
        assert_eq!(c.render(&small).unwrap(), "27");
    }

    /// Issue #41's Cohere Command R+ case: jinja2's `indent` keeps a trailing newline.
    #[test]
    fn indent_keeps_a_trailing_newline_as_jinja2_does() {
        let out = render(
            "[{{ '{\n' | indent(4, first=true) }}][{{ 'a\n\nb' | indent(2) }}][{{ 'a\n\nb' | indent(2, blank=true) }}][{{ 'a\n' | indent('> ', true) }}]",
            serde_json::json!({}),
        )
        .unwrap();
        assert_eq!(out, "[    {\n][a\n\n  b][a\n  \n  b][> a\n]");
    }

    /// Where jinja2 raises, cardproof raises the same Python error (issue #41: Hermes, Cohere
    /// and DeepSeek-R1 templates rendered where transformers raised).
    #[test]
    fn what_jinja2_refuses_is_refused_with_pythons_error() {
        for (source, error) in [
            (
                "{% for t in tools %}{% endfor %}",
                "TypeError: 'NoneType' object is not iterable",
            ),
            (
                "{{ tools | length }}",
                "TypeError: object of type 'NoneType' has no len()",
            ),
            (
                "{{ 'x' in tools }}",
                "TypeError: argument of type 'NoneType' is not iterable",
            ),
            (
                "{{ messages | map(attribute='role') | tojson }}",
                "TypeError: Object of type generator is not JSON serializable",
            ),
            (
                "{{ 'a' + 1 }}",
                "TypeError: can only concatenate str (not \"int\") to str",
            ),
            (
                "{{ 1 < 'a' }}",
                "TypeError: '<' not supported between instances of 'int' and 'str'",
            ),
            (
                "{{ functions + 'x' }}",
                "UndefinedError: 'functions' is undefined",
            ),
            (
                "{{ [] .append(1) }}",
                "SecurityError: access to attribute 'append' of 'list' object is unsafe.",
            ),
            (
                "{{ x | from_json }}",
                "TemplateAssertionError: No filter named 'from_json'.",
            ),
        ] {
            let e = render(
                source,
                serde_json::json!({"tools": null, "messages": [{"role": "user"}]}),
            )
            .unwrap_err();
            assert!(e.contains(error) && e.contains("(line 1)"), "{source}: {e}");
        }
    }

    /// functionary v3.1's `"..."|safe + name`: markupsafe escapes the plain operand.
    #[test]
    fn a_string_added_to_a_safe_one_is_escaped_as_markupsafe_escapes_it() {
        let out = render(
            "{{ 'Use '|safe + name + ' to '|safe + f | tojson }}|{{ ('<' | safe) ~ '>' }}",
            serde_json::json!({"name": "<a & b>", "f": {"q": "\"x\""}}),
        )
        .unwrap();
        assert_eq!(
            out,
            "Use &lt;a &amp; b&gt; to {&#34;q&#34;: &#34;\\&#34;x\\&#34;&#34;}|<>"
        );
    }

    #[test]
    fn generation_blocks_keep_their_text_and_whitespace_control() {
        let t = ChatTemplate::new(
            "a\n{%- generation -%}\n b {{ raise_exception('x') if false }}\n{%- endgeneration %}c",
            0,
        )
        .unwrap();
        assert_eq!(t.render(&serde_json::json!({})).unwrap(), "ab c");
        let t = ChatTemplate::new("{{ raise_exception('no tools here') }}", 0).unwrap();
        assert!(
            t.render(&serde_json::json!({}))
                .unwrap_err()
                .contains("no tools here")
        );
    }
}
