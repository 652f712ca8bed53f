//! Chat templates rendered as transformers' `apply_chat_template` renders them (issue #19), so a
//! conversation eval text is the bytes the reference's own stack would have fed the model.
//!
//! transformers compiles a template in jinja2's `ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True)` with the loop-control extension, `{% generation %}` blocks, the globals
//! `raise_exception` and `strftime_now`, and its own `tojson` (`json.dumps(x,
//! ensure_ascii=False)`, not jinja2's HTML-safe one). The environment here is minijinja set up the
//! same way: Python's string and dict methods through minijinja-contrib's pycompat callback,
//! [`python_json`] for `tojson` byte for byte as `json.dumps` writes it (its kwargs `indent`,
//! `separators`, `sort_keys`, `ensure_ascii` included), `strftime_now` from a fixed clock (a
//! render must be reproducible, so the date is an input and is recorded), and `{% generation %}`
//! kept as a plain block (it marks the assistant's tokens; the text is the same).

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

/// The template's name inside its environment (no extension: no auto-escaping, as in
/// transformers).
const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source` with `clock` (seconds since the Unix epoch, UTC) as `strftime_now`'s
    /// time. The error names the construct minijinja could not parse.
    pub fn new(source: &str, clock: i64) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| format!("{e:#}"))?;
        env.set_syntax(syntax);
        // A template is code from a repository: bound its work (a loop that never ends is an
        // error, not a hang).
        env.set_fuel(Some(200_000_000));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function(
            "strftime_now",
            move |format: String| -> Result<Value, Error> {
                strftime(&format, clock).map(Value::from)
            },
        );
        env.add_filter("tojson", tojson);
        // jinja2's `iterable` test is false for None (minijinja iterates none as empty).
        env.add_test("iterable", |v: Value| {
            !matches!(v.kind(), ValueKind::None) && v.try_iter().is_ok()
        });
        refuse_unmatched_constructs(source)?;
        env.add_template_owned(NAME, generation_as_block(source))
            .map_err(|e| format!("the chat template does not compile: {e:#}"))?;
        Ok(ChatTemplate { env })
    }

    /// Renders with `context` (`messages`, `tools`, `add_generation_prompt`, the template's
    /// kwargs and special tokens), as `compiled_template.render(**context)` does.
    pub fn render(&self, context: &serde_json::Value) -> Result<String, String> {
        let template = self.env.get_template(NAME).map_err(|e| format!("{e:#}"))?;
        template
            .render(Value::from(minijinja::value::Serde(context)))
            .map_err(|e| format!("the chat template does not render: {e:#}"))
    }
}

/// Constructs whose jinja2 meaning minijinja does not share, refused by name rather than
/// rendered differently: a string added to a `|safe` one (jinja2's Markup escapes the other
/// operand, `"` becoming `&#34;`; minijinja concatenates).
fn refuse_unmatched_constructs(source: &str) -> Result<(), String> {
    let safe_plus = regex::Regex::new(r"\|\s*safe\s*\+").expect("a valid regex");
    if let Some(m) = safe_plus.find(source) {
        let line = source[..m.start()].matches('\n').count() + 1;
        return Err(format!(
            "the chat template adds to a `|safe` string (line {line}): jinja2 escapes the other operand as HTML there and cardproof's renderer does not, so it cannot render this template as transformers does"
        ));
    }
    Ok(())
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

/// transformers' `tojson` filter: `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)` with the caller's kwargs over those defaults.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let mut options = JsonOptions {
        indent: None,
        item: ", ".into(),
        key: ": ".into(),
        sort_keys: false,
        ensure_ascii: false,
    };
    if let Some(indent) = kwargs.get::<Option<Value>>("indent")? {
        options.indent = match indent.kind() {
            ValueKind::None | ValueKind::Undefined => None,
            ValueKind::Number => Some(" ".repeat(usize::try_from(indent).unwrap_or(0))),
            _ => Some(indent.to_string()),
        };
        if options.indent.is_some() {
            // json.dumps: with an indent the item separator loses its trailing space.
            options.item = ",".into();
        }
    }
    if let Some(separators) = kwargs.get::<Option<Value>>("separators")?
        && !separators.is_none()
    {
        options.item = separators.get_item_by_index(0)?.to_string();
        options.key = separators.get_item_by_index(1)?.to_string();
    }
    if let Some(sort) = kwargs.get::<Option<bool>>("sort_keys")? {
        options.sort_keys = sort;
    }
    if let Some(ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        options.ensure_ascii = ascii;
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    python_json(&value, &options, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// How `json.dumps` lays out its output.
pub struct JsonOptions {
    pub indent: Option<String>,
    pub item: String,
    pub key: String,
    pub sort_keys: bool,
    pub ensure_ascii: bool,
}

/// `value` as Python's `json.dumps` writes it with `options`: floats as `repr` writes them,
/// strings escaped as `json` escapes them (no `\/`, no HTML escaping).
pub fn python_json(
    value: &Value,
    options: &JsonOptions,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(indent) = &options.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => match (value.is_integer(), f64::try_from(value.clone())) {
            (true, _) => out.push_str(&value.to_string()),
            (false, Ok(f)) => out.push_str(&python_float(f)),
            (false, Err(_)) => out.push_str(&value.to_string()),
        },
        ValueKind::String => python_string(value.as_str().unwrap_or_default(), options, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item);
                }
                newline(out, depth + 1);
                python_json(item, options, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if options.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item);
                }
                newline(out, depth + 1);
                python_string(&key.to_string(), options, out);
                out.push_str(&options.key);
                python_json(&value.get_item(key)?, options, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} is not JSON", value.kind()),
            ));
        }
    }
    Ok(())
}

/// A JSON string as Python's `json` escapes it.
fn python_string(s: &str, options: &JsonOptions, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            // cardproof's field markers stay raw: they are never in a render it keeps, and a
            // marked render must strip back to the plain one.
            c if options.ensure_ascii && (c as u32) > 0x7e && !super::spans::is_marker(c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` (and so `json.dumps`) writes it: the shortest digits that round
/// trip, fixed notation for exponents from −4 to 15, else `1e-05` / `1.5e+16`; `NaN`,
/// `Infinity`, `-Infinity` as `json.dumps` allows them.
pub fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d.ddde±x`.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let head = &digits[..1];
        let tail = &digits[1..];
        let mantissa = if tail.is_empty() {
            head.to_string()
        } else {
            format!("{head}.{tail}")
        };
        format!(
            "{sign}{mantissa}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

/// Python's `datetime.strftime` for the specifiers chat templates use (`%d %m %Y %y %B %b %A %a
/// %H %M %S %j %e %-d %%`), at `clock` seconds since the epoch in UTC. Others are an error
/// naming them, rather than text Python would not write.
pub fn strftime(format: &str, clock: i64) -> Result<String, Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = clock.div_euclid(86_400);
    let secs = clock.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let year_day = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let spec = match chars.next() {
            Some('-') => match chars.next() {
                Some('d') => {
                    out.push_str(&day.to_string());
                    continue;
                }
                other => format!("-{}", other.map(String::from).unwrap_or_default()),
            },
            Some(s) => s.to_string(),
            None => String::new(),
        };
        match spec.as_str() {
            "d" => out.push_str(&format!("{day:02}")),
            "e" => out.push_str(&format!("{day:>2}")),
            "m" => out.push_str(&format!("{month:02}")),
            "Y" => out.push_str(&year.to_string()),
            "y" => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            "B" => out.push_str(MONTHS[(month - 1) as usize]),
            "b" => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            "A" => out.push_str(DAYS[weekday]),
            "a" => out.push_str(&DAYS[weekday][..3]),
            "H" => out.push_str(&format!("{:02}", secs / 3600)),
            "M" => out.push_str(&format!("{:02}", secs / 60 % 60)),
            "S" => out.push_str(&format!("{:02}", secs % 60)),
            "j" => out.push_str(&format!("{year_day:03}")),
            "%" => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: `%{other}` is not a specifier cardproof writes"),
                ));
            }
        }
    }
    Ok(out)
}

/// (year, month, day) of a day count from 1970-01-01 (Howard Hinnant's civil calendar).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The day count from 1970-01-01 of a civil date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_written_as_pythons_repr_writes_them() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (-2.5e-7, "-2.5e-07"),
            (0.1, "0.1"),
            (123.456, "123.456"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ] {
            assert_eq!(python_float(f), want, "{f}");
        }
    }

    #[test]
    fn tojson_writes_json_dumps_bytes() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ x | tojson(separators=(',', ':'), sort_keys=true) }}|{{ s | tojson(ensure_ascii=true) }}",
            0,
        )
        .unwrap();
        let out = t
            .render(&serde_json::json!({
                "x": {"b": [1, 2.5, null, true], "a": "é</x>/\n"},
                "s": "é😀"
            }))
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, null, true], \"a\": \"é</x>/\\n\"}|{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"é</x>/\\n\"\n}|{\"a\":\"é</x>/\\n\",\"b\":[1,2.5,null,true]}|\"\\u00e9\\ud83d\\ude00\""
        );
    }

    #[test]
    fn strftime_now_reads_the_fixed_clock() {
        // 2026-12-03 18:48:20 UTC, a Thursday, the 337th day.
        let clock = 1_796_323_700;
        assert_eq!(
            strftime("%d %B %Y, %a %H:%M:%S %j %-d %b %y", clock).unwrap(),
            "03 December 2026, Thu 18:48:20 337 3 Dec 26"
        );
        assert!(strftime("%Z", clock).is_err());
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
