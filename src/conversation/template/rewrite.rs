//! The template as jinja2 would run it: minijinja parses it, and this rewrite of the parsed
//! template routes every construct whose Python meaning differs from minijinja's through
//! cardproof's implementation of the Python one ([`super::pyops`], [`super::methods`]):
//!
//! - `a + b`, `a - b`, `a * b`, `a / b`, `a // b`, `a % b`, `a ** b`, `-a`, `a ~ b`, `==`,
//!   `!=`, `<`, `<=`, `>`, `>=`, `in`, chains of comparisons, `a[b]` and `a[b:c]` become calls
//!   of Python's operators;
//! - a `for` loop iterates through Python's iteration (`for x in none` raises);
//! - `x.items` (a method name, not called) is jinja2's attribute lookup, which finds the method
//!   before the key, and `x.items()` calls Python's method;
//! - `map`, `select`, `reject`, `selectattr` and `rejectattr` return generators;
//! - raw text is written through the same bounded output as `{{ ... }}`.
//!
//! What jinja2 would refuse to compile (an unknown filter or test, the `do` tag, which
//! transformers does not enable) is refused here, before anything renders; what cardproof
//! does not write as jinja2 does (an `{% autoescape %}` block, a macro's `varargs`) is refused
//! by name. Every rewritten node keeps its source span, so errors name the template's line.

use minijinja::machinery::Span;
use minijinja::machinery::ast::{
    self, BinOpKind, CallArg, CompareOpKind, Expr, Spanned, Stmt, UnaryOpKind,
};
use minijinja::value::Value;
use minijinja::{Error, ErrorKind};

use super::python::refusal;
use super::{filters, jinja_tests, methods};

/// The parsed template with jinja2's semantics routed in, or the first construct refused and
/// its line.
pub fn template<'a>(root: &Stmt<'a>, source: &'a str) -> Result<Stmt<'a>, (Error, usize)> {
    let mut r = Rewriter {
        source,
        refused: None,
        macro_depth: 0,
        soft: false,
    };
    let out = r.stmt(root);
    match r.refused {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

struct Rewriter<'s> {
    /// The template's source, which names an undefined operand as the template wrote it.
    source: &'s str,
    /// The first construct refused, with its line.
    refused: Option<(Error, usize)>,
    macro_depth: usize,
    /// Inside an `if` statement or a conditional expression, and no loop, macro or block
    /// between: jinja2 compiles an unknown filter or test there and fails only if it runs.
    soft: bool,
}

fn var<'a>(id: &'a str, span: Span) -> Expr<'a> {
    Expr::Var(Spanned::new(ast::Var { id }, span))
}

fn konst<'a>(value: Value, span: Span) -> Expr<'a> {
    Expr::Const(Spanned::new(ast::Const { value }, span))
}

/// A call of one of cardproof's functions.
fn call<'a>(function: &'static str, args: Vec<CallArg<'a>>, span: Span) -> Expr<'a> {
    Expr::Call(Spanned::new(
        ast::Call {
            expr: var(function, span),
            args,
        },
        span,
    ))
}

/// A statement that fails as jinja2 fails on a template loaded without a loader.
fn no_loader<'a>(span: Span) -> Stmt<'a> {
    let fail = call(
        "__cp_fail",
        positional(vec![konst(
            Value::from("TypeError: no loader for this environment specified"),
            span,
        )]),
        span,
    );
    Stmt::EmitExpr(Spanned::new(ast::EmitExpr { expr: fail }, span))
}

/// A literal checked for depth unless it is constant.
fn nested(literal: Expr<'_>, constant: bool) -> Expr<'_> {
    if constant {
        return literal;
    }
    let span = literal.span();
    call("__cp_nest", positional(vec![literal]), span)
}

fn positional<'a>(args: Vec<Expr<'a>>) -> Vec<CallArg<'a>> {
    args.into_iter().map(CallArg::Pos).collect()
}

fn compare_op(op: CompareOpKind) -> &'static str {
    match op {
        CompareOpKind::Eq => "==",
        CompareOpKind::Ne => "!=",
        CompareOpKind::Lt => "<",
        CompareOpKind::Lte => "<=",
        CompareOpKind::Gt => ">",
        CompareOpKind::Gte => ">=",
        CompareOpKind::In => "in",
        CompareOpKind::NotIn => "not in",
    }
}

impl<'s> Rewriter<'s> {
    /// Records a refusal at `span` (the first one wins).
    fn refuse(&mut self, error: Error, span: Span) {
        if self.refused.is_none() {
            self.refused = Some((error, span.start_line as usize));
        }
    }

    fn stmts<'a>(&mut self, stmts: &[Stmt<'a>]) -> Vec<Stmt<'a>> {
        stmts.iter().map(|s| self.stmt(s)).collect()
    }

    /// Runs `f` in a frame that is soft (an `if`) or not (a loop body, a macro, a block).
    fn frame<T>(&mut self, soft: bool, f: impl FnOnce(&mut Self) -> T) -> T {
        let outer = std::mem::replace(&mut self.soft, soft);
        let out = f(self);
        self.soft = outer;
        out
    }

    /// A filter or test that fails when it runs, with `message`.
    fn fails_when_run<'a>(message: String, span: Span) -> Expr<'a> {
        call(
            "__cp_fail",
            positional(vec![konst(Value::from(message), span)]),
            span,
        )
    }

    fn stmt<'a>(&mut self, stmt: &Stmt<'a>) -> Stmt<'a> {
        match stmt {
            Stmt::Template(t) => Stmt::Template(Spanned::new(
                ast::Template {
                    children: self.stmts(&t.children),
                },
                t.span(),
            )),
            Stmt::EmitExpr(e) => Stmt::EmitExpr(Spanned::new(
                ast::EmitExpr {
                    expr: self.expr(&e.expr),
                },
                e.span(),
            )),
            // Raw text goes through the formatter too, so every byte written is counted.
            Stmt::EmitRaw(r) => Stmt::EmitExpr(Spanned::new(
                ast::EmitExpr {
                    expr: konst(Value::from(r.raw), r.span()),
                },
                r.span(),
            )),
            Stmt::ForLoop(f) => self.for_loop(f),
            Stmt::IfCond(i) => Stmt::IfCond(Spanned::new(
                ast::IfCond {
                    expr: self.frame(true, |r| r.expr(&i.expr)),
                    true_body: self.frame(true, |r| r.stmts(&i.true_body)),
                    false_body: self.frame(true, |r| r.stmts(&i.false_body)),
                },
                i.span(),
            )),
            Stmt::WithBlock(w) => Stmt::WithBlock(Spanned::new(
                ast::WithBlock {
                    assignments: w
                        .assignments
                        .iter()
                        .map(|(t, e)| (self.target(t), self.expr(e)))
                        .collect(),
                    body: self.frame(false, |r| r.stmts(&w.body)),
                },
                w.span(),
            )),
            Stmt::Set(s) => self.set(s),
            Stmt::SetBlock(s) => Stmt::SetBlock(Spanned::new(
                ast::SetBlock {
                    target: self.target(&s.target),
                    filter: self.frame(false, |r| s.filter.as_ref().map(|e| r.expr(e))),
                    body: self.frame(false, |r| r.stmts(&s.body)),
                },
                s.span(),
            )),
            Stmt::AutoEscape(a) => {
                self.refuse(refusal("an `{% autoescape %}` block (transformers renders without autoescaping, and cardproof writes no escaped output)"), a.span());
                Stmt::AutoEscape(Spanned::new(
                    ast::AutoEscape {
                        enabled: self.expr(&a.enabled),
                        body: self.stmts(&a.body),
                    },
                    a.span(),
                ))
            }
            Stmt::FilterBlock(f) => Stmt::FilterBlock(Spanned::new(
                ast::FilterBlock {
                    filter: self.frame(false, |r| r.expr(&f.filter)),
                    filter_span: f.filter_span,
                    body: self.frame(false, |r| r.stmts(&f.body)),
                },
                f.span(),
            )),
            Stmt::Block(b) => Stmt::Block(Spanned::new(
                ast::Block {
                    name: b.name,
                    required: b.required,
                    body: self.frame(false, |r| r.stmts(&b.body)),
                },
                b.span(),
            )),
            // transformers' environment has no loader: jinja2 raises when one of these runs.
            Stmt::Import(i) => no_loader(i.span()),
            Stmt::FromImport(i) => no_loader(i.span()),
            Stmt::Extends(e) => no_loader(e.span()),
            Stmt::Include(i) => no_loader(i.span()),
            Stmt::Macro(m) => Stmt::Macro(self.macro_decl(m)),
            Stmt::CallBlock(c) => Stmt::CallBlock(Spanned::new(
                ast::CallBlock {
                    call: self.call_node(&c.call),
                    call_expr_span: c.call_expr_span,
                    macro_decl: self.macro_decl(&c.macro_decl),
                },
                c.span(),
            )),
            Stmt::Continue(c) => Stmt::Continue(Spanned::new(ast::Continue, c.span())),
            Stmt::Break(b) => Stmt::Break(Spanned::new(ast::Break, b.span())),
            Stmt::Do(d) => {
                self.refuse(
                    Error::new(
                        ErrorKind::SyntaxError,
                        "TemplateSyntaxError: Encountered unknown tag 'do' (transformers does not enable jinja2's `do` extension)",
                    ),
                    d.span(),
                );
                Stmt::Do(Spanned::new(
                    ast::Do {
                        call: self.call_node(&d.call),
                    },
                    d.span(),
                ))
            }
        }
    }

    /// A `for` loop: its iterable through Python's iteration (and unpacking).
    fn for_loop<'a>(&mut self, f: &Spanned<ast::ForLoop<'a>>) -> Stmt<'a> {
        Stmt::ForLoop(Spanned::new(
            ast::ForLoop {
                target: self.target(&f.target),
                iter: match &f.target {
                    // `for a, b in pairs`: Python unpacks each item (a string into its
                    // characters) and counts them.
                    Expr::List(l) => call(
                        "__cp_iterate_unpacking",
                        positional(vec![
                            self.expr(&f.iter),
                            konst(Value::from(l.items.len()), f.span()),
                        ]),
                        f.span(),
                    ),
                    _ => call(
                        "__cp_iterate",
                        positional(vec![self.expr(&f.iter)]),
                        f.span(),
                    ),
                },
                filter_expr: self.frame(false, |r| f.filter_expr.as_ref().map(|e| r.expr(e))),
                recursive: f.recursive,
                body: self.frame(false, |r| r.stmts(&f.body)),
                else_body: self.frame(false, |r| r.stmts(&f.else_body)),
            },
            f.span(),
        ))
    }

    /// `{% set %}`: a tuple target unpacks as Python unpacks, a namespace refuses underscore
    /// names and is checked after it is set.
    fn set<'a>(&mut self, s: &Spanned<ast::Set<'a>>) -> Stmt<'a> {
        let mut expr = self.expr(&s.expr);
        if let Expr::List(l) = &s.target {
            expr = call(
                "__cp_unpack",
                positional(vec![expr, konst(Value::from(l.items.len()), s.span())]),
                s.span(),
            );
        }
        // transformers' namespace refuses names starting with an underscore.
        if let Expr::GetAttr(g) = &s.target
            && g.name.starts_with('_')
        {
            let message = format!(
                "SecurityError: Chat templates cannot store underscore-prefixed attributes on a namespace, but got '{}'. Please rename the attribute.",
                g.name
            );
            expr = call(
                "__cp_fail",
                positional(vec![konst(Value::from(message), s.span())]),
                s.span(),
            );
        }
        let set = Stmt::Set(Spanned::new(
            ast::Set {
                target: self.target(&s.target),
                expr,
            },
            s.span(),
        ));
        // `{% set ns.x = ... %}` can make a namespace hold itself: check it after.
        match &s.target {
            Expr::GetAttr(g) => {
                let check = call(
                    "__cp_assigned",
                    positional(vec![self.expr(&g.expr)]),
                    s.span(),
                );
                let check = Stmt::EmitExpr(Spanned::new(ast::EmitExpr { expr: check }, s.span()));
                Stmt::Template(Spanned::new(
                    ast::Template {
                        children: vec![set, check],
                    },
                    s.span(),
                ))
            }
            _ => set,
        }
    }

    fn macro_decl<'a>(&mut self, m: &Spanned<ast::Macro<'a>>) -> Spanned<ast::Macro<'a>> {
        self.macro_depth += 1;
        let out = Spanned::new(
            ast::Macro {
                name: m.name,
                args: m.args.iter().map(|a| self.expr(a)).collect(),
                defaults: m.defaults.iter().map(|a| self.expr(a)).collect(),
                body: self.frame(false, |r| r.stmts(&m.body)),
            },
            m.span(),
        );
        self.macro_depth -= 1;
        out
    }

    fn call_node<'a>(&mut self, c: &Spanned<ast::Call<'a>>) -> Spanned<ast::Call<'a>> {
        Spanned::new(
            ast::Call {
                expr: self.expr(&c.expr),
                args: c.args.iter().map(|a| self.call_arg(a)).collect(),
            },
            c.span(),
        )
    }

    fn call_arg<'a>(&mut self, arg: &CallArg<'a>) -> CallArg<'a> {
        match arg {
            CallArg::Pos(e) => CallArg::Pos(self.expr(e)),
            CallArg::Kwarg(name, e) => CallArg::Kwarg(name, self.expr(e)),
            CallArg::PosSplat(e) => CallArg::PosSplat(self.expr(e)),
            CallArg::KwargSplat(e) => CallArg::KwargSplat(self.expr(e)),
        }
    }

    /// An assignment target (`{% set x %}`, `{% for a, b in ... %}`, `{% set ns.x %}`): its
    /// shape stays what the compiler assigns to, only the namespace expression is rewritten.
    fn target<'a>(&mut self, expr: &Expr<'a>) -> Expr<'a> {
        match expr {
            Expr::List(l) => Expr::List(Spanned::new(
                ast::List {
                    items: l.items.iter().map(|e| self.target(e)).collect(),
                },
                l.span(),
            )),
            Expr::GetAttr(g) => Expr::GetAttr(Spanned::new(
                ast::GetAttr {
                    expr: self.expr(&g.expr),
                    name: g.name,
                },
                g.span(),
            )),
            other => self.expr(other),
        }
    }

    fn exprs<'a>(&mut self, exprs: &[Expr<'a>]) -> Vec<Expr<'a>> {
        exprs.iter().map(|e| self.expr(e)).collect()
    }

    fn expr<'a>(&mut self, expr: &Expr<'a>) -> Expr<'a> {
        match expr {
            Expr::Var(v) => {
                if self.macro_depth > 0 && matches!(v.id, "varargs" | "kwargs") {
                    self.refuse(refusal(format!("a macro's `{}` (jinja2's extra-argument collection, which cardproof does not implement)", v.id)), v.span());
                }
                var(v.id, v.span())
            }
            Expr::Const(c) => konst(c.value.clone(), c.span()),
            Expr::Slice(s) => {
                let span = s.span();
                let obj = self.expr(&s.expr);
                let mut args = vec![self.defined(&s.expr, obj)];
                for bound in [&s.start, &s.stop, &s.step] {
                    args.push(match bound {
                        Some(e) => self.expr(e),
                        None => konst(Value::from(()), span),
                    });
                }
                call("__cp_slice", positional(args), span)
            }
            Expr::UnaryOp(u) => match u.op {
                UnaryOpKind::Neg => {
                    let operand = self.expr(&u.expr);
                    let operand = self.defined(&u.expr, operand);
                    call("__cp_neg", positional(vec![operand]), u.span())
                }
                UnaryOpKind::Not => Expr::UnaryOp(Spanned::new(
                    ast::UnaryOp {
                        op: UnaryOpKind::Not,
                        expr: self.expr(&u.expr),
                    },
                    u.span(),
                )),
            },
            Expr::BinOp(b) => self.bin_op(b),
            Expr::Compare(c) => {
                let mut args = vec![self.expr(&c.expr)];
                for op in &c.ops {
                    args.push(konst(Value::from(compare_op(op.op)), c.span()));
                    args.push(self.expr(&op.expr));
                }
                call("__cp_chain", positional(args), c.span())
            }
            Expr::IfExpr(i) => Expr::IfExpr(Spanned::new(
                ast::IfExpr {
                    test_expr: self.frame(true, |r| r.expr(&i.test_expr)),
                    true_expr: self.frame(true, |r| r.expr(&i.true_expr)),
                    false_expr: self.frame(true, |r| i.false_expr.as_ref().map(|e| r.expr(e))),
                },
                i.span(),
            )),
            Expr::Filter(f) => self.filter(f),
            Expr::Test(t) => {
                if !jinja_tests::NAMES.contains(&t.name) {
                    if self.soft {
                        return Self::fails_when_run(
                            format!("TemplateRuntimeError: No test named '{}' found.", t.name),
                            t.span(),
                        );
                    }
                    self.refuse(
                        Error::new(
                            ErrorKind::UnknownTest,
                            format!("TemplateAssertionError: No test named '{}'.", t.name),
                        ),
                        t.span(),
                    );
                }
                Expr::Test(Spanned::new(
                    ast::Test {
                        name: t.name,
                        expr: self.expr(&t.expr),
                        args: t.args.iter().map(|a| self.call_arg(a)).collect(),
                    },
                    t.span(),
                ))
            }
            Expr::GetAttr(g) if methods::is_method_name(g.name) => call(
                "__cp_getattr",
                positional(vec![
                    self.expr(&g.expr),
                    konst(Value::from(g.name), g.span()),
                ]),
                g.span(),
            ),
            Expr::GetAttr(g) => Expr::GetAttr(Spanned::new(
                ast::GetAttr {
                    expr: self.expr(&g.expr),
                    name: g.name,
                },
                g.span(),
            )),
            Expr::GetItem(g) => {
                let obj = self.expr(&g.expr);
                let obj = self.defined(&g.expr, obj);
                call(
                    "__cp_getitem",
                    positional(vec![obj, self.expr(&g.subscript_expr)]),
                    g.span(),
                )
            }
            Expr::Call(c) => match &c.expr {
                // `x.items()`: Python's method, not minijinja's lookup of a key `items`.
                Expr::GetAttr(g) if methods::is_method_name(g.name) => {
                    let receiver = self.expr(&g.expr);
                    let mut args = vec![
                        CallArg::Pos(self.defined(&g.expr, receiver)),
                        CallArg::Pos(konst(Value::from(g.name), g.span())),
                    ];
                    args.extend(c.args.iter().map(|a| self.call_arg(a)));
                    call("__cp_method", args, c.span())
                }
                _ => Expr::Call(self.call_node(c)),
            },
            // A literal holding values made at run time may nest them one level deeper.
            Expr::List(l) => nested(
                Expr::List(Spanned::new(
                    ast::List {
                        items: self.exprs(&l.items),
                    },
                    l.span(),
                )),
                l.items.iter().all(|e| matches!(e, Expr::Const(_))),
            ),
            Expr::Tuple(t) => nested(
                Expr::Tuple(Spanned::new(
                    ast::Tuple {
                        items: self.exprs(&t.items),
                    },
                    t.span(),
                )),
                t.items.iter().all(|e| matches!(e, Expr::Const(_))),
            ),
            Expr::Map(m) => nested(
                Expr::Map(Spanned::new(
                    ast::Map {
                        keys: self.exprs(&m.keys),
                        values: self.exprs(&m.values),
                    },
                    m.span(),
                )),
                m.values.iter().all(|e| matches!(e, Expr::Const(_))),
            ),
        }
    }

    /// `expr` (already rewritten as `rewritten`), checked to be defined where jinja2's
    /// `Undefined` raises: the error names the operand as the template wrote it.
    fn defined<'a>(&self, expr: &Expr<'a>, rewritten: Expr<'a>) -> Expr<'a> {
        let span = expr.span();
        let hint = match expr {
            Expr::Var(v) => v.id,
            Expr::GetAttr(_) | Expr::GetItem(_) => self
                .source
                .get(span.start_offset as usize..span.end_offset as usize)
                .unwrap_or_default(),
            _ => return rewritten,
        };
        call(
            "__cp_defined",
            positional(vec![rewritten, konst(Value::from(hint), span)]),
            span,
        )
    }

    fn bin_op<'a>(&mut self, b: &Spanned<ast::BinOp<'a>>) -> Expr<'a> {
        let span = b.span();
        let (left, right) = (self.expr(&b.left), self.expr(&b.right));
        let strict = matches!(
            b.op,
            BinOpKind::Add
                | BinOpKind::Sub
                | BinOpKind::Mul
                | BinOpKind::Div
                | BinOpKind::FloorDiv
                | BinOpKind::Pow
                | BinOpKind::Rem
                | BinOpKind::Lt
                | BinOpKind::Lte
                | BinOpKind::Gt
                | BinOpKind::Gte
        );
        let (left, right) = if strict {
            let left = self.defined(&b.left, left);
            // `'%s' % undefined` writes '' in jinja2: only the format must be defined.
            let right = if matches!(b.op, BinOpKind::Rem) {
                right
            } else {
                self.defined(&b.right, right)
            };
            (left, right)
        } else {
            (left, right)
        };
        let python =
            |name: &'static str, left, right| call(name, positional(vec![left, right]), span);
        let compare = |op: &'static str, left, right| {
            call(
                "__cp_compare",
                positional(vec![left, konst(Value::from(op), span), right]),
                span,
            )
        };
        let arith = |op: &'static str, left, right| {
            call(
                "__cp_arith",
                positional(vec![left, konst(Value::from(op), span), right]),
                span,
            )
        };
        match b.op {
            BinOpKind::Add => python("__cp_add", left, right),
            BinOpKind::Mul => python("__cp_mul", left, right),
            BinOpKind::Rem => python("__cp_rem", left, right),
            BinOpKind::Concat => python("__cp_concat", left, right),
            BinOpKind::Sub => arith("-", left, right),
            BinOpKind::Div => arith("/", left, right),
            BinOpKind::FloorDiv => arith("//", left, right),
            BinOpKind::Pow => arith("**", left, right),
            BinOpKind::In => python("__cp_contains", right, left),
            BinOpKind::Lt => compare("<", left, right),
            BinOpKind::Lte => compare("<=", left, right),
            BinOpKind::Gt => compare(">", left, right),
            BinOpKind::Gte => compare(">=", left, right),
            BinOpKind::Eq => python("__cp_eq", left, right),
            BinOpKind::Ne => Expr::UnaryOp(Spanned::new(
                ast::UnaryOp {
                    op: UnaryOpKind::Not,
                    expr: python("__cp_eq", left, right),
                },
                span,
            )),
            op => Expr::BinOp(Spanned::new(ast::BinOp { op, left, right }, span)),
        }
    }

    fn filter<'a>(&mut self, f: &Spanned<ast::Filter<'a>>) -> Expr<'a> {
        let span = f.span();
        if filters::NOT_IMPLEMENTED.contains(&f.name) {
            let why = refusal(format!(
                "jinja2's `{}` filter, which cardproof does not implement",
                f.name
            ));
            return Self::fails_when_run(why.detail().unwrap_or_default().to_owned(), span);
        } else if !filters::IMPLEMENTED.contains(&f.name) && self.soft {
            return Self::fails_when_run(
                format!("TemplateRuntimeError: No filter named '{}' found.", f.name),
                span,
            );
        } else if !filters::IMPLEMENTED.contains(&f.name) {
            self.refuse(
                Error::new(
                    ErrorKind::UnknownFilter,
                    format!("TemplateAssertionError: No filter named '{}'.", f.name),
                ),
                span,
            );
        }
        let node = Expr::Filter(Spanned::new(
            ast::Filter {
                name: f.name,
                expr: f.expr.as_ref().map(|e| self.expr(e)),
                args: f.args.iter().map(|a| self.call_arg(a)).collect(),
            },
            span,
        ));
        // In a `{% filter %}` block the filter has no operand: it stays a filter.
        if f.expr.is_none() {
            return node;
        }
        let node = if filters::NESTING.contains(&f.name) {
            call("__cp_nest", positional(vec![node]), span)
        } else {
            node
        };
        if filters::GENERATORS.contains(&f.name) {
            call("__cp_generator", positional(vec![node]), span)
        } else {
            node
        }
    }
}
