//! What a chat template may build. A template is code from a repository (a card's own template
//! file during `verify`), so its work and every value it makes are bounded before they are
//! made: a template that would exceed a bound is refused (exit 2, naming the template and its
//! line), never left to abort the process or exhaust memory.
//!
//! Two bounds hold together. minijinja's fuel charges every instruction and every byte its own
//! operators and filters create, so the total work and the total bytes created are bounded; and
//! every operation cardproof implements (Python's `+`, `*`, `~` and `%`, `tojson`, `indent`,
//! `join`, `format`, the string methods, ...) checks the size of its result against
//! [`MAX_BYTES`] before it allocates it, and charges the fuel for it.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

/// The largest string (or list, counted in bytes of its items) a template may build, and the
/// most it may write in one render, captured blocks and macro output included: 256 MiB, far
/// above any real conversation's render (a 100,000-token conversation renders to about 400 KB).
pub const MAX_BYTES: usize = 256 << 20;

/// The most items a list a template builds may hold.
pub const MAX_ITEMS: usize = 16 << 20;

/// How deeply a value may nest (a list in a list ...): values are dropped, compared and
/// written recursively, so a deeper one would overflow the stack. Python's own recursion limit
/// is 1,000 frames.
pub const MAX_DEPTH: usize = 500;

/// The most operators (`+`, `.`, `|`, `[`, `(`, `and`, ...) one `{{ ... }}` or `{% ... %}` may
/// hold: parsing, rewriting and compiling walk an expression recursively, so a chain of 200,000
/// `+` would overflow the stack. The longest expression of the corpus holds 26.
pub const MAX_OPERATORS: usize = 256;

/// minijinja's fuel for one render: one unit per instruction, one per 64 bytes minijinja
/// creates, one per 16 bytes cardproof's operations create. 32 million instructions: 270 times
/// what the costliest corpus template needs for the 54-message example conversation, and
/// enough for about 900 messages with the one template whose work grows with the square of
/// the conversation (Reka Edge's), over 10,000 with the others.
pub const FUEL: u64 = 32_000_000;

/// The refusal's wording when a bound is exceeded: a `MemoryError`, as Python reports an
/// allocation it cannot make.
pub fn too_large(what: &str, bytes: u128) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "MemoryError: {what} would build {bytes} bytes, over cardproof's bound of {MAX_BYTES} bytes on a value a chat template builds"
        ),
    )
}

/// How many bytes cardproof's own operations may create per unit of fuel: four times what
/// minijinja charges its own, so the values a render keeps stay far below the fuel's bound.
const BYTES_PER_FUEL: u128 = 16;

/// Checks that a result of `bytes` bytes may be built, and charges its fuel before it is.
pub fn reserve(state: &State, bytes: u128, what: &str) -> Result<(), Error> {
    if bytes > MAX_BYTES as u128 {
        return Err(too_large(what, bytes));
    }
    let fuel = (bytes / BYTES_PER_FUEL) as u64;
    if fuel > 0 {
        state.consume_fuel(fuel)?;
    }
    Ok(())
}

/// Checks that a list of `items` items may be built.
pub fn reserve_items(state: &State, items: u128, what: &str) -> Result<(), Error> {
    if items > MAX_ITEMS as u128 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "MemoryError: {what} would build a list of {items} items, over cardproof's bound of {MAX_ITEMS} items on a list a chat template builds"
            ),
        ));
    }
    reserve(state, items.saturating_mul(32), what)
}

/// A string being built that refuses to grow past [`MAX_BYTES`].
#[derive(Default)]
pub struct Bounded {
    pub text: String,
}

impl Bounded {
    pub fn push_str(&mut self, s: &str, what: &str) -> Result<(), Error> {
        let len = self.text.len() as u128 + s.len() as u128;
        if len > MAX_BYTES as u128 {
            return Err(too_large(what, len));
        }
        self.text.push_str(s);
        Ok(())
    }

    pub fn push(&mut self, c: char, what: &str) -> Result<(), Error> {
        let mut buf = [0u8; 4];
        self.push_str(c.encode_utf8(&mut buf), what)
    }
}

/// Checks that `value` nests at most [`MAX_DEPTH`] deep, charging the containers it visits:
/// the template is about to keep a value that holds it.
pub fn check_depth(state: &State, value: &Value) -> Result<(), Error> {
    let mut stack: Vec<(Value, usize)> = vec![(value.clone(), 0)];
    let mut visited: u64 = 0;
    while let Some((v, depth)) = stack.pop() {
        if depth > MAX_DEPTH {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "RecursionError: the template builds a value nested more than {MAX_DEPTH} levels deep"
                ),
            ));
        }
        visited += 1;
        if visited.is_multiple_of(64) {
            state.consume_fuel(1)?;
        }
        if let Some(iter) = v.downcast_object_ref::<super::objects::PyIter>() {
            stack.extend(iter.peek().iter().map(|c| (c.clone(), depth + 1)));
            continue;
        }
        match v.kind() {
            ValueKind::Seq => stack.extend(v.try_iter()?.map(|c| (c, depth + 1))),
            ValueKind::Map => {
                for k in v.try_iter()? {
                    let item = v.get_item(&k)?;
                    stack.push((item, depth + 1));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks that no tag of `source` holds more than [`MAX_OPERATORS`] operators; the error names
/// the line of the first that does. A source the tokenizer cannot read is left to the parser,
/// which names what is wrong.
pub fn check_expressions(
    source: &str,
    syntax: minijinja::syntax::SyntaxConfig,
) -> Result<(), (Error, usize)> {
    use minijinja::machinery::{Token, tokenize};
    let mut operators = 0usize;
    for token in tokenize(source, false, syntax) {
        let Ok((token, span)) = token else {
            return Ok(());
        };
        match token {
            Token::VariableStart | Token::BlockStart => operators = 0,
            Token::Plus
            | Token::Minus
            | Token::Mul
            | Token::Div
            | Token::FloorDiv
            | Token::Pow
            | Token::Mod
            | Token::Dot
            | Token::Tilde
            | Token::Pipe
            | Token::Eq
            | Token::Ne
            | Token::Gt
            | Token::Gte
            | Token::Lt
            | Token::Lte
            | Token::BracketOpen
            | Token::ParenOpen
            | Token::Ident("and" | "or" | "not" | "in" | "is" | "if") => {
                operators += 1;
                if operators > MAX_OPERATORS {
                    return Err((
                        Error::new(
                            ErrorKind::SyntaxError,
                            format!(
                                "an expression of more than {MAX_OPERATORS} operators, which cardproof does not compile (the deepest of the corpus has 26)"
                            ),
                        ),
                        span.start_line as usize,
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(())
}
