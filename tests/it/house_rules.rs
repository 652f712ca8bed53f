//! The house rules that can be checked, checked (STYLE.md, docs/DESIGN.md's architecture map):
//! the library's modules form layers with no circle between them and no edge to a layer below
//! except the few on [`UPWARD_ALLOWED`] (none today), and no non-test function is over 150
//! lines (from `fn` to its closing brace).
//!
//! The crate's own source is parsed with syn from `src/lib.rs` down its `mod` declarations;
//! `#[cfg(test)]` items and modules are skipped. An edge is any path in non-test code that names
//! another module of the crate: `use crate::…`, `super::…`, `crate::x::f()` in an expression or
//! a type, or a child module's name.
//!
//! `CARDPROOF_HOUSE_REPORT=1 cargo test --test it house_rules -- --nocapture` prints the
//! numbers (lines per module, the longest functions, every circle between files).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use crate::support::repo_root;

/// The layers, top first: a module may use modules of its own layer (with no circle) and of the
/// layers above it. A module path names the module and everything under it, except a deeper
/// path listed on its own (`card::write` sits with the verdicts).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundations",
        &[
            "error", "files", "span", "findings", "schema", "json_f64", "digest", "markdown",
        ],
    ),
    ("card", &["card"]),
    ("checkpoint", &["checkpoint", "dequant"]),
    ("KLD", &["kld"]),
    ("conversations", &["conversation"]),
    ("runners", &["runner"]),
    ("disclosure", &["disclosure"]),
    ("sources", &["hub"]),
    ("rendering", &["report"]),
    ("signing", &["outset", "attest"]),
    ("rerun", &["rerun"]),
    (
        "verdicts",
        &[
            "lint",
            "verify",
            "study",
            "card::write",
            "hub::check",
            "attest::check",
            "attest::artifact",
        ],
    ),
    ("output", &["output"]),
];

/// Edges to a layer below, each with the reason it stays. Keep this list short.
const UPWARD_ALLOWED: &[(&str, &str, &str)] = &[];

const FUNCTION_LINE_LIMIT: usize = 150;

/// One module of the crate: its path (`["rerun", "lanes"]`) and its file.
#[derive(Debug, Clone)]
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// The crate's non-test source, parsed.
struct Crate {
    modules: Vec<Module>,
    /// Module path → the paths it names (resolved to absolute segment lists).
    refs: BTreeMap<Vec<String>, Vec<Vec<String>>>,
    /// (module path, function name, first line, lines).
    functions: Vec<(String, String, usize, usize)>,
    /// File → non-blank lines.
    lines: BTreeMap<PathBuf, usize>,
    /// (module path, line, what) of each matrix product called outside a helper: a
    /// `.matmul(` method call or a `gemm::gemm` path.
    products: Vec<(String, usize, String)>,
}

fn is_test_cfg(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("test")
            || match &a.meta {
                syn::Meta::List(l) if a.path().is_ident("cfg") => {
                    let tokens = l.tokens.to_string();
                    tokens
                        .split(|c: char| !c.is_alphanumeric() && c != '_')
                        .any(|w| w == "test")
                        && !tokens.contains("not (test")
                }
                _ => false,
            }
    })
}

/// Parse `file` as module `path` (and its children, recursively).
fn load(path: Vec<String>, file: &Path, children_dir: &Path, into: &mut Crate) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    into.lines.insert(
        file.to_owned(),
        text.lines().filter(|l| !l.trim().is_empty()).count(),
    );
    load_items(path, file, children_dir, &parsed.items, into);
}

fn load_items(
    path: Vec<String>,
    file: &Path,
    children_dir: &Path,
    items: &[syn::Item],
    into: &mut Crate,
) {
    into.modules.push(Module {
        path: path.clone(),
        file: file.to_owned(),
    });
    let mut walker = Walker {
        module: path.clone(),
        refs: Vec::new(),
        functions: Vec::new(),
        products: Vec::new(),
    };
    for item in items {
        if let syn::Item::Mod(m) = item {
            if is_test_cfg(&m.attrs) {
                continue;
            }
            let mut child = path.clone();
            child.push(m.ident.to_string());
            if let Some((_, inline)) = &m.content {
                let dir = children_dir.join(m.ident.to_string());
                load_items(child, file, &dir, inline, into);
            } else {
                let name = m.ident.to_string();
                let flat = children_dir.join(format!("{name}.rs"));
                let (child_file, grandchildren) = if flat.exists() {
                    (flat, children_dir.join(&name))
                } else {
                    let dir = children_dir.join(&name);
                    (dir.join("mod.rs"), dir)
                };
                load(child, &child_file, &grandchildren, into);
            }
            continue;
        }
        walker.visit_item(item);
    }
    into.refs.entry(path).or_default().extend(walker.refs);
    into.functions.extend(walker.functions);
    into.products.extend(walker.products);
}

/// Collects the crate paths and the function lengths of one module's non-test items.
struct Walker {
    module: Vec<String>,
    refs: Vec<Vec<String>>,
    functions: Vec<(String, String, usize, usize)>,
    products: Vec<(String, usize, String)>,
}

impl Walker {
    fn resolve(&self, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        match first.as_str() {
            "crate" => Some(segments[1..].to_vec()),
            "super" | "self" => {
                let mut base = self.module.clone();
                let mut rest = segments;
                while let Some(s) = rest.first() {
                    match s.as_str() {
                        "super" => {
                            base.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
                base.extend(rest.iter().cloned());
                Some(base)
            }
            // A child module named without `self::` resolves against the module.
            _ => {
                let mut base = self.module.clone();
                base.extend(segments.iter().cloned());
                Some(base)
            }
        }
    }

    fn record_function(&mut self, name: String, sig: &syn::Signature, block: &syn::Block) {
        let start = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        self.functions
            .push((self.module.join("::"), name, start, end + 1 - start));
    }
}

fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, into: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, into);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut full = prefix.clone();
            full.push(n.ident.to_string());
            into.push(full);
        }
        syn::UseTree::Rename(r) => {
            let mut full = prefix.clone();
            full.push(r.ident.to_string());
            into.push(full);
        }
        syn::UseTree::Glob(_) => into.push(prefix.clone()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_paths(t, prefix, into)),
    }
}

impl<'ast> Visit<'ast> for Walker {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => &[],
        };
        if !is_test_cfg(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        use_paths(&u.tree, &mut Vec::new(), &mut paths);
        for p in paths {
            if matches!(
                p.first().map(String::as_str),
                Some("crate" | "super" | "self")
            ) && let Some(resolved) = self.resolve(&p)
            {
                self.refs.push(resolved);
            }
        }
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if call.method == "matmul" {
            let line = call.method.span().start().line;
            self.products
                .push((self.module.join("::"), line, ".matmul(".into()));
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.ends_with(&["gemm".to_owned(), "gemm".to_owned()]) {
            let line = p.segments[0].ident.span().start().line;
            self.products
                .push((self.module.join("::"), line, "gemm::gemm".into()));
        }
        if segments.len() > 1
            && let Some(resolved) = self.resolve(&segments)
        {
            self.refs.push(resolved);
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record_function(f.sig.ident.to_string(), &f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test_cfg(&f.attrs) {
            self.record_function(f.sig.ident.to_string(), &f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record_function(f.sig.ident.to_string(), &f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

fn parse_crate() -> Crate {
    let src = repo_root().join("src");
    let mut krate = Crate {
        modules: Vec::new(),
        refs: BTreeMap::new(),
        functions: Vec::new(),
        lines: BTreeMap::new(),
        products: Vec::new(),
    };
    load(Vec::new(), &src.join("lib.rs"), &src, &mut krate);
    krate
}

/// The longest known module path that prefixes `path`.
fn module_of<'a>(krate: &'a Crate, path: &[String]) -> Option<&'a Module> {
    krate
        .modules
        .iter()
        .filter(|m| !m.path.is_empty() && path.starts_with(&m.path))
        .max_by_key(|m| m.path.len())
}

/// The layer unit (an entry of [`LAYERS`]) a module belongs to, with its layer's index.
fn unit_of(path: &[String]) -> Option<(usize, String)> {
    let joined = path.join("::");
    LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, (_, units))| units.iter().map(move |u| (i, *u)))
        .filter(|(_, u)| joined == *u || joined.starts_with(&format!("{u}::")))
        .max_by_key(|(_, u)| u.len())
        .map(|(i, u)| (i, u.to_owned()))
}

/// File-level edges (file → files it names), for the report.
fn file_edges(krate: &Crate) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for m in &krate.modules {
        edges.entry(m.file.clone()).or_default();
    }
    for (from, refs) in &krate.refs {
        let Some(from) = krate.modules.iter().find(|m| &m.path == from) else {
            continue;
        };
        for r in refs {
            if let Some(to) = module_of(krate, r) {
                // A parent naming its own child module is the `mod` tree, not a dependency.
                if to.file != from.file && !to.path.starts_with(&from.path) {
                    edges
                        .entry(from.file.clone())
                        .or_default()
                        .insert(to.file.clone());
                }
            }
        }
    }
    edges
}

/// The unit-level edges: (from unit, to unit) → one example (from module, to path).
fn unit_edges(krate: &Crate) -> BTreeMap<(String, String), (String, String)> {
    let mut edges = BTreeMap::new();
    for (from, refs) in &krate.refs {
        let Some((_, from_unit)) = unit_of(from) else {
            continue;
        };
        for r in refs {
            let Some(to) = module_of(krate, r) else {
                continue;
            };
            let Some((_, to_unit)) = unit_of(&to.path) else {
                continue;
            };
            if to_unit != from_unit {
                edges
                    .entry((from_unit.clone(), to_unit))
                    .or_insert((from.join("::"), r.join("::")));
            }
        }
    }
    edges
}

/// Strongly connected components with more than one member (Tarjan's, iterative enough for a
/// crate's files).
fn circles<T: Ord + Clone>(edges: &BTreeMap<T, BTreeSet<T>>) -> Vec<Vec<T>> {
    struct State<T> {
        index: BTreeMap<T, usize>,
        low: BTreeMap<T, usize>,
        stack: Vec<T>,
        on_stack: BTreeSet<T>,
        next: usize,
        out: Vec<Vec<T>>,
    }
    fn connect<T: Ord + Clone>(v: &T, edges: &BTreeMap<T, BTreeSet<T>>, s: &mut State<T>) {
        s.index.insert(v.clone(), s.next);
        s.low.insert(v.clone(), s.next);
        s.next += 1;
        s.stack.push(v.clone());
        s.on_stack.insert(v.clone());
        for w in edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                connect(w, edges, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v.clone(), low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v.clone(), low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                let done = &w == v;
                component.push(w);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            connect(v, edges, &mut s);
        }
    }
    s.out
}

#[allow(clippy::print_stderr)] // the report is asked for by CARDPROOF_HOUSE_REPORT
fn report(krate: &Crate) {
    if std::env::var_os("CARDPROOF_HOUSE_REPORT").is_none() {
        return;
    }
    let src = repo_root().join("src");
    let mut per_module: BTreeMap<String, usize> = BTreeMap::new();
    for (file, n) in &krate.lines {
        let rel = file.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs")
            .to_owned();
        *per_module.entry(top).or_default() += n;
    }
    eprintln!("non-blank lines per top module (non-test files and test modules inline):");
    for (m, n) in &per_module {
        eprintln!("  {m:<14} {n}");
    }
    let mut long: Vec<_> = krate
        .functions
        .iter()
        .filter(|f| f.3 > FUNCTION_LINE_LIMIT)
        .collect();
    long.sort_by_key(|f| std::cmp::Reverse(f.3));
    eprintln!("functions over {FUNCTION_LINE_LIMIT} lines: {}", long.len());
    for f in &long {
        eprintln!("  {:>4}  {}::{} (line {})", f.3, f.0, f.1, f.2);
    }
    let files = circles(&file_edges(krate));
    eprintln!("circles between files: {}", files.len());
    for c in &files {
        let names: Vec<String> = c
            .iter()
            .map(|p| p.strip_prefix(&src).unwrap().display().to_string())
            .collect();
        eprintln!("  {} files: {}", names.len(), names.join(" "));
    }
    eprintln!("edges between units:");
    for ((a, b), (m, p)) in unit_edges(krate) {
        eprintln!("  {a} -> {b}   ({m} names {p})");
    }
}

#[test]
fn modules_form_layers_with_no_circle_and_no_edge_downward() {
    let krate = parse_crate();
    report(&krate);
    for m in &krate.modules {
        assert!(
            m.path.is_empty() || unit_of(&m.path).is_some(),
            "module {} is in no layer of house_rules::LAYERS (and docs/DESIGN.md's map)",
            m.path.join("::")
        );
    }
    let edges = unit_edges(&krate);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        graph.entry(a.clone()).or_default().insert(b.clone());
    }
    let found = circles(&graph);
    let mut problems: Vec<String> = found
        .iter()
        .map(|c| format!("circle between modules: {}", c.join(", ")))
        .collect();
    for ((a, b), (module, path)) in &edges {
        let layer = |u: &str| unit_of(&u.split("::").map(str::to_owned).collect::<Vec<_>>());
        let (la, lb) = (layer(a).unwrap().0, layer(b).unwrap().0);
        let allowed = UPWARD_ALLOWED.iter().any(|(x, y, _)| x == a && y == b);
        if lb > la && !allowed {
            problems.push(format!(
                "{a} ({}) uses {b} ({}), a layer below: {module} names {path}",
                LAYERS[la].0, LAYERS[lb].0
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The one module that calls gemm and candle's `matmul`: it cuts the depth of every product gemm
/// would cut by the CPU's cache into fixed blocks, so the native runner gives the same bits on
/// every machine. A product called anywhere else would round by the machine's caches.
const PRODUCTS_MODULE: &str = "runner::native::matmul";

#[test]
fn every_matrix_product_goes_through_the_fixed_depth_module() {
    let krate = parse_crate();
    assert!(
        krate.products.iter().any(|p| p.0 == PRODUCTS_MODULE),
        "the walker found no product in {PRODUCTS_MODULE}: it no longer sees them"
    );
    let elsewhere: Vec<String> = krate
        .products
        .iter()
        .filter(|p| p.0 != PRODUCTS_MODULE)
        .map(|(module, line, what)| format!("{module} line {line}: {what}"))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "matrix products outside {PRODUCTS_MODULE} (use its product, x_wt, matmul or fixed_depth_matmul): {elsewhere:?}"
    );
}

#[test]
fn no_function_is_over_150_lines() {
    let krate = parse_crate();
    let long: Vec<String> = krate
        .functions
        .iter()
        .filter(|f| f.3 > FUNCTION_LINE_LIMIT)
        .map(|f| format!("{}::{}", f.0, f.1))
        .collect();
    assert!(
        long.is_empty(),
        "functions over {FUNCTION_LINE_LIMIT} lines: {long:?}"
    );
}
