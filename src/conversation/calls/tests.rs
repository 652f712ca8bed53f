//! Each family on hand-written turns, malformed and hostile ones included, and the checks.

use serde_json::{Value, json};

use super::*;

fn ok(name: &str, arguments: Value) -> ParsedCall {
    ParsedCall::Ok(Call {
        name: name.into(),
        arguments,
        text_values: false,
    })
}

fn text_ok(name: &str, arguments: Value) -> ParsedCall {
    ParsedCall::Ok(Call {
        name: name.into(),
        arguments,
        text_values: true,
    })
}

/// The reasons of a turn's malformed calls, and panics (a test failure) when one parsed.
fn malformed_reasons(turn: &TurnCalls) -> Vec<String> {
    turn.calls()
        .iter()
        .map(|c| match c {
            ParsedCall::Malformed { reason, .. } => reason.clone(),
            ParsedCall::Ok(call) => panic!("parsed {call:?}"),
        })
        .collect()
}

fn calls(format: CallFormat, text: &str) -> Vec<ParsedCall> {
    parse(format, text).calls().to_vec()
}

#[test]
fn hermes_blocks_are_calls_and_the_text_around_them_is_not() {
    let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}\n</tool_call><|im_end|>";
    assert_eq!(
        calls(CallFormat::Hermes, text),
        vec![
            ok("get_weather", json!({"city": "Zürich"})),
            ok("get_time", json!("{\"tz\": \"UTC\"}")),
        ]
    );
    assert_eq!(
        parse(CallFormat::Hermes, "The weather is fine."),
        TurnCalls::NoCall
    );
    // Arguments left out are none; `parameters` is read as `arguments`.
    assert_eq!(
        calls(
            CallFormat::Hermes,
            "<tool_call>{\"name\": \"ping\"}</tool_call><tool_call>{\"name\": \"f\", \"parameters\": {\"a\": 1}}</tool_call>"
        ),
        vec![ok("ping", json!({})), ok("f", json!({"a": 1}))]
    );
}

#[test]
fn a_call_that_opens_and_does_not_parse_is_malformed_not_absent() {
    let cases = [
        (
            CallFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
            "not valid JSON",
        ),
        (
            CallFormat::Hermes,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",
            "never closed",
        ),
        (
            CallFormat::Hermes,
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "no `name`",
        ),
        (
            CallFormat::Hermes,
            "<tool_call>[1, 2]</tool_call>",
            "not a JSON object",
        ),
        (
            CallFormat::Qwen3Coder,
            "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
            "never closed by `</parameter>`",
        ),
        (
            CallFormat::Qwen3Coder,
            "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
            "does not start with `<function=`",
        ),
        (
            CallFormat::Glm,
            "<tool_call>f<arg_key>a</arg_key>1</tool_call>",
            "expected `<arg_value>`",
        ),
        (
            CallFormat::Glm,
            "<tool_call>my tool<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
            "holds whitespace",
        ),
        (
            CallFormat::Llama3Json,
            "{\"name\": \"f\", \"parameters\": {\"a\": ",
            "not valid JSON",
        ),
        (
            CallFormat::Llama3Json,
            "<|python_tag|>brave_search.call(query=\"x\")",
            "built-in tool",
        ),
        (
            CallFormat::Mistral,
            "[TOOL_CALLS]get_weather{\"city\": \"Paris\"}",
            "neither a list nor",
        ),
        (CallFormat::Mistral, "[TOOL_CALLS][]", "empty list"),
        (
            CallFormat::Mistral,
            "[TOOL_CALLS]f[ARGS]{\"a\": tru",
            "not valid JSON",
        ),
        (
            CallFormat::DeepSeek,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n",
            "never closed",
        ),
        (
            CallFormat::DeepSeek,
            "<｜tool▁call▁begin｜>f{\"a\": 1}<｜tool▁call▁end｜>",
            "no `<｜tool▁sep｜>`",
        ),
        (
            CallFormat::DeepSeek,
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}<｜tool▁call▁end｜>",
            "never closed",
        ),
        (
            CallFormat::Kimi,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\"<|tool_call_end|>",
            "not valid JSON",
        ),
    ];
    for (format, text, reason) in cases {
        let turn = parse(format, text);
        let reasons = malformed_reasons(&turn);
        assert_eq!(reasons.len(), 1, "{format:?} {text:?}: {turn:?}");
        assert!(
            reasons[0].contains(reason),
            "{format:?} {text:?}: {reasons:?}"
        );
        assert_eq!(
            check(&turn.calls()[0], &Tools::default()),
            CallCheck::InvalidJson
        );
    }
}

#[test]
fn qwen3_coder_parameters_are_text_without_the_templates_newlines() {
    let text = "I'll search.\n\n<tool_call>\n<function=search_files>\n<parameter=pattern>\nTODO|FIXME\n</parameter>\n<parameter=max_results>\n5\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>";
    assert_eq!(
        calls(CallFormat::Qwen3Coder, text),
        vec![
            text_ok(
                "search_files",
                json!({"pattern": "TODO|FIXME", "max_results": "5", "note": "line one\nline two"})
            ),
            text_ok("ping", json!({})),
        ]
    );
}

#[test]
fn glm_pairs_parse_with_and_without_newlines() {
    let spaced = "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
    let tight = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>";
    let want = vec![text_ok(
        "get_weather",
        json!({"city": "Zürich", "days": "2"}),
    )];
    assert_eq!(calls(CallFormat::Glm, spaced), want);
    assert_eq!(calls(CallFormat::Glm, tight), want);
    assert_eq!(
        calls(CallFormat::Glm, "<tool_call>ping</tool_call>"),
        vec![text_ok("ping", json!({}))]
    );
}

#[test]
fn llama_turns_are_calls_only_when_they_are_call_objects() {
    let call = ok("get_weather", json!({"city": "Paris"}));
    for text in [
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eom_id|>",
        "  {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}<|eot_id|>",
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}",
    ] {
        assert_eq!(
            calls(CallFormat::Llama3Json, text),
            vec![call.clone()],
            "{text}"
        );
    }
    assert_eq!(
        calls(
            CallFormat::Llama3Json,
            "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": [1]}}"
        ),
        vec![ok("a", json!({})), ok("b", json!({"x": [1]}))]
    );
    for text in [
        "Paris is sunny.",
        "{\"answer\": 42}",
        "{ not json at all",
        "",
    ] {
        assert_eq!(
            parse(CallFormat::Llama3Json, text),
            TurnCalls::NoCall,
            "{text}"
        );
    }
    // After a first call, a second object that is not one is malformed.
    let turn = parse(
        CallFormat::Llama3Json,
        "{\"name\": \"a\", \"parameters\": {}}; {\"answer\": 42}",
    );
    assert!(matches!(
        turn.calls(),
        [ParsedCall::Ok(_), ParsedCall::Malformed { .. }]
    ));
}

#[test]
fn mistral_lists_and_named_calls_parse() {
    let list = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcDEF123\"}, {\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}, \"id\": \"abcDEF124\"}]</s>";
    let named = "[TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}</s>";
    let want = vec![
        ok("get_weather", json!({"city": "Paris"})),
        ok("get_time", json!({"tz": "UTC"})),
    ];
    assert_eq!(calls(CallFormat::Mistral, list), want);
    assert_eq!(calls(CallFormat::Mistral, named), want);
    // A list never closed keeps the calls before the break.
    let turn = parse(
        CallFormat::Mistral,
        "[TOOL_CALLS][{\"name\": \"f\"} {\"name\": \"g\"}]",
    );
    assert!(matches!(
        turn.calls(),
        [ParsedCall::Ok(_), ParsedCall::Malformed { reason, .. }] if reason.contains("not closed by `]`")
    ));
    // An element that is no call is malformed; the list goes on.
    assert!(matches!(
        calls(CallFormat::Mistral, "[TOOL_CALLS][1, {\"name\": \"f\"}]").as_slice(),
        [ParsedCall::Malformed { .. }, ParsedCall::Ok(_)]
    ));
}

#[test]
fn deepseek_r1_and_v3_1_calls_parse() {
    let r1 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"UTC\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
    let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"tz\": \"UTC\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let want = vec![
        ok("get_weather", json!({"city": "Paris"})),
        ok("get_time", json!({"tz": "UTC"})),
    ];
    assert_eq!(calls(CallFormat::DeepSeek, r1), want);
    assert_eq!(calls(CallFormat::DeepSeek, v31), want);
    // A fence inside V3.1's JSON is the argument's, and R1's arguments may hold one.
    let code = json!({"code": "```py\nprint(1)\n```"});
    let v31 = format!("<｜tool▁call▁begin｜>run<｜tool▁sep｜>{code}<｜tool▁call▁end｜>");
    let r1 = format!(
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>run\n```json\n{code}\n```<｜tool▁call▁end｜>"
    );
    assert_eq!(
        calls(CallFormat::DeepSeek, &v31),
        vec![ok("run", code.clone())]
    );
    assert_eq!(calls(CallFormat::DeepSeek, &r1), vec![ok("run", code)]);
}

#[test]
fn kimi_calls_parse_and_drop_the_functions_prefix_and_index() {
    let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
    assert_eq!(
        calls(CallFormat::Kimi, text),
        vec![
            ok("get_weather", json!({"city": "Paris"})),
            ok("get_time", json!({}))
        ]
    );
}

#[test]
fn calls_inside_reasoning_are_not_calls() {
    let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    let cases = [
        (format!("<think>\nmaybe {call}\n</think>\n\nNo call."), 0),
        (format!("maybe {call}\n</think>\n\n{call}"), 1),
        (format!("<think>\nstill thinking {call}"), 0),
        (format!("[THINK]{call}[/THINK]{call}{call}"), 2),
    ];
    for (text, n) in cases {
        assert_eq!(calls(CallFormat::Hermes, &text).len(), n, "{text}");
    }
}

#[test]
fn plain_text_is_no_call_in_every_format() {
    for format in CallFormat::ALL {
        for text in [
            "",
            "Paris is sunny, 21 °C.",
            "Use the `get_weather` tool with {city}.",
        ] {
            assert_eq!(
                parse(format, text),
                TurnCalls::NoCall,
                "{format:?} {text:?}"
            );
        }
    }
}

/// One call of each family, for the bounds tests.
fn one_call(format: CallFormat) -> &'static str {
    match format {
        CallFormat::Hermes => "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
        CallFormat::Qwen3Coder => "<tool_call><function=f></function></tool_call>",
        CallFormat::Glm => "<tool_call>f</tool_call>",
        CallFormat::Llama3Json => "{\"name\": \"f\", \"parameters\": {}};",
        CallFormat::Mistral => "[TOOL_CALLS]f[ARGS]{}",
        CallFormat::DeepSeek => "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
        CallFormat::Kimi => "<|tool_call_begin|>f<|tool_call_argument_begin|>{}<|tool_call_end|>",
    }
}

#[test]
fn a_turn_with_thousands_of_calls_stops_at_the_bound() {
    for format in CallFormat::ALL {
        let text = one_call(format).repeat(5_000);
        let turn = parse(format, &text);
        let calls = turn.calls();
        assert_eq!(calls.len(), MAX_CALLS + 1, "{format:?}");
        assert!(
            calls[..MAX_CALLS]
                .iter()
                .all(|c| matches!(c, ParsedCall::Ok(_)))
        );
        assert!(
            matches!(&calls[MAX_CALLS], ParsedCall::Malformed { reason, .. } if reason.contains("more than 64")),
            "{format:?}"
        );
    }
    // Nemo's list form too, however long the list.
    let list = format!(
        "[TOOL_CALLS][{}{{\"name\": \"f\"}}]",
        "{\"name\": \"f\"}, ".repeat(100_000)
    );
    assert_eq!(
        parse(CallFormat::Mistral, &list).calls().len(),
        MAX_CALLS + 1
    );
}

#[test]
fn hostile_turns_never_panic() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_object = "{\"a\":".repeat(50_000);
    let huge = "x".repeat(MAX_TURN_BYTES + 10);
    let bidi = "\u{202e}\u{2066}f\u{0}\u{7}\u{feff}";
    let mut texts = vec![
        deep.clone(),
        deep_object.clone(),
        huge,
        bidi.to_owned(),
        "é".repeat(MAX_TURN_BYTES / 2 + 1),
    ];
    for format in CallFormat::ALL {
        let call = one_call(format);
        for cut in 0..=call.len() {
            if call.is_char_boundary(cut) {
                texts.push(call[..cut].to_owned());
            }
        }
    }
    let openers = [
        "<tool_call>",
        "<tool_call>{\"name\": \"f\", \"arguments\": ",
        "<tool_call><function=",
        "<tool_call>f<arg_key>",
        "<|python_tag|>",
        "{\"name\": \"f\", \"parameters\": ",
        "[TOOL_CALLS]",
        "[TOOL_CALLS][",
        "[TOOL_CALLS]f[ARGS]",
        "<｜tool▁call▁begin｜>f<｜tool▁sep｜>",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n",
        "<|tool_call_begin|>f<|tool_call_argument_begin|>",
    ];
    for opener in openers {
        texts.push(format!("{opener}{deep}"));
        texts.push(format!("{opener}{deep_object}"));
        texts.push(format!("{opener}{bidi}"));
        texts.push(opener.repeat(20_000));
    }
    for format in CallFormat::ALL {
        for text in &texts {
            let turn = parse(format, text);
            assert!(turn.calls().len() <= MAX_CALLS + 1);
            for call in turn.calls() {
                if let ParsedCall::Malformed { raw, .. } = call {
                    assert!(raw.len() <= MAX_RAW_BYTES);
                }
                let _ = check(call, &Tools::default());
            }
        }
    }
    // A name carrying bidi or control characters parses as written (JSON may) and names no
    // tool; between markers it breaks the markup.
    let name = "get\u{202e}weather";
    let turn = parse(
        CallFormat::Hermes,
        &format!("<tool_call>{{\"name\": \"{name}\", \"arguments\": {{}}}}</tool_call>"),
    );
    let tools = weather_tools();
    assert_eq!(check(&turn.calls()[0], &tools), CallCheck::UnknownName);
    let turn = parse(CallFormat::Mistral, "[TOOL_CALLS]get\u{0}weather[ARGS]{}");
    assert!(malformed_reasons(&turn)[0].contains("control character"));
}

fn weather_tools() -> Tools {
    Tools::from_declarations(&json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1},
                "metric": {"type": "boolean"},
                "cities": {"type": "array", "items": {"type": "string"}},
                "when": {"anyOf": [{"type": "number"}, {"type": "null"}]},
                "unit": {"enum": ["celsius", "fahrenheit"]}
            },
            "required": ["city"],
            "additionalProperties": false
        }}},
        {"name": "ping", "description": "bare function object, no parameters"}
    ]))
    .unwrap()
}

#[test]
fn calls_are_checked_against_the_declared_tools() {
    let tools = weather_tools();
    assert_eq!(tools.len(), 2);
    assert_eq!(tools.names().collect::<Vec<_>>(), ["get_weather", "ping"]);
    let checked = |call: ParsedCall| check(&call, &tools);
    assert_eq!(
        checked(ok("get_weather", json!({"city": "Paris", "days": 2}))),
        CallCheck::Valid
    );
    assert_eq!(
        checked(ok("get_weather", json!("{\"city\": \"Paris\"}"))),
        CallCheck::Valid
    );
    assert_eq!(
        checked(ok("get_weather", json!("{\"city\": "))),
        CallCheck::InvalidJson
    );
    assert_eq!(
        checked(ok("ping", json!({"anything": [1]}))),
        CallCheck::Valid
    );
    assert_eq!(
        checked(ok("get_wether", json!({"city": "Paris"}))),
        CallCheck::UnknownName
    );
    let mismatch = |call: ParsedCall| match check(&call, &tools) {
        CallCheck::SchemaMismatch { reason } => reason,
        other => panic!("{other:?}"),
    };
    assert!(mismatch(ok("get_weather", json!({"days": 2}))).contains("city"));
    assert!(mismatch(ok("get_weather", json!({"city": "Paris", "days": "2"}))).contains("/days"));
    assert!(mismatch(ok("get_weather", json!({"city": "Paris", "days": 0}))).contains("/days"));
    assert!(mismatch(ok("get_weather", json!({"city": "Paris", "wind": 1}))).contains("wind"));
    assert!(mismatch(ok("ping", json!([1]))).contains("a list, not an object"));
}

#[test]
fn text_values_are_read_by_the_parameters_schema() {
    let tools = weather_tools();
    let call = Call {
        name: "get_weather".into(),
        arguments: json!({
            "city": "2", "days": "3", "metric": "True", "cities": "[\"a\", \"b\"]",
            "when": "None", "unit": "celsius", "extra": "5"
        }),
        text_values: true,
    };
    let typed = tools.typed(&call);
    assert_eq!(
        typed.arguments,
        json!({
            "city": "2", "days": 3, "metric": true, "cities": ["a", "b"],
            "when": null, "unit": "celsius", "extra": "5"
        })
    );
    assert!(!typed.text_values);
    // `extra` is no parameter, so the schema refuses the call; without it, it is valid.
    assert!(matches!(
        check(&ParsedCall::Ok(call.clone()), &tools),
        CallCheck::SchemaMismatch { .. }
    ));
    let mut valid = call.clone();
    valid.arguments.as_object_mut().unwrap().remove("extra");
    assert_eq!(check(&ParsedCall::Ok(valid), &tools), CallCheck::Valid);
    // Text that spells no allowed type stays text, which the schema refuses.
    let mut bad = call;
    bad.arguments = json!({"city": "x", "days": "three"});
    assert!(matches!(
        check(&ParsedCall::Ok(bad), &tools),
        CallCheck::SchemaMismatch { .. }
    ));
}

#[test]
fn bad_declarations_are_refused_naming_the_declaration_or_tool() {
    let refused = |tools: Value| Tools::from_declarations(&tools).unwrap_err();
    assert!(refused(json!({"name": "f"})).contains("not a list"));
    assert!(refused(json!([{"name": "f"}, 3])).contains("declaration 1 is not an object"));
    assert!(
        refused(json!([{"function": {"description": "x"}}])).contains("declaration 0 has no name")
    );
    assert!(refused(json!([{"name": ""}])).contains("declaration 0 has no name"));
    assert!(refused(json!([{"name": "f"}, {"name": "f"}])).contains("0 and 1 are both named `f`"));
    let e = refused(json!([{"name": "f", "parameters": {"type": "objekt"}}]));
    assert!(e.contains("tool `f`"), "{e}");
    let e = refused(json!([{"name": "g", "parameters": {"properties": {"a": {"pattern": "("}}}}]));
    assert!(e.contains("tool `g`"), "{e}");
    assert!(Tools::from_declarations(&Value::Null).unwrap().is_empty());
    let many = Value::Array(vec![json!({"name": "f"}); validation::MAX_TOOLS + 1]);
    assert!(refused(many).contains("bound"));
}

#[test]
fn same_call_ignores_key_order_and_number_spelling_and_decodes_string_arguments() {
    let call = |name: &str, arguments: Value| Call {
        name: name.into(),
        arguments,
        text_values: false,
    };
    let a = call("f", json!({"x": 1, "y": {"b": [1.5, "z"], "a": null}}));
    let b = call(
        "f",
        serde_json::from_str(r#"{"y": {"a": null, "b": [1.5, "z"]}, "x": 1.0}"#).unwrap(),
    );
    let c = call("f", json!(r#"{"x": 1, "y": {"a": null, "b": [1.5, "z"]}}"#));
    assert!(same_call(&a, &b));
    assert!(same_call(&a, &c));
    assert!(!same_call(&a, &call("g", a.arguments.clone())));
    assert!(!same_call(
        &a,
        &call("f", json!({"x": 2, "y": {"b": [1.5, "z"], "a": null}}))
    ));
    assert!(!same_call(
        &a,
        &call("f", json!({"x": "1", "y": {"b": [1.5, "z"], "a": null}}))
    ));
    assert!(same_calls(&[a.clone(), c.clone()], &[b.clone(), a.clone()]));
    assert!(!same_calls(
        &[a.clone(), c.clone()],
        std::slice::from_ref(&a)
    ));
    let other = call("g", json!({}));
    assert!(!same_calls(&[a.clone(), other.clone()], &[other, a]));
}

#[test]
fn records_serialize_as_their_names_and_read_back() {
    for format in CallFormat::ALL {
        assert_eq!(
            serde_json::to_value(format).unwrap(),
            json!(format.as_str())
        );
        let back: CallFormat = serde_json::from_value(json!(format.as_str())).unwrap();
        assert_eq!(back, format);
    }
    let turn = parse(
        CallFormat::Qwen3Coder,
        "<tool_call><function=f><parameter=a>1</parameter></function></tool_call><tool_call>",
    );
    let written = serde_json::to_value(&turn).unwrap();
    assert_eq!(written["turn"], "calls");
    assert_eq!(written["calls"][0]["parsed"], "ok");
    assert_eq!(written["calls"][0]["text_values"], true);
    assert_eq!(written["calls"][1]["parsed"], "malformed");
    assert_eq!(serde_json::from_value::<TurnCalls>(written).unwrap(), turn);
    assert_eq!(
        serde_json::to_value(TurnCalls::NoCall).unwrap(),
        json!({"turn": "no_call"})
    );
    let mismatch = CallCheck::SchemaMismatch { reason: "r".into() };
    let written = serde_json::to_value(&mismatch).unwrap();
    assert_eq!(written, json!({"check": mismatch.as_str(), "reason": "r"}));
    assert_eq!(
        serde_json::from_value::<CallCheck>(written).unwrap(),
        mismatch
    );
    let unknown = json!({"parsed": "ok", "name": "f", "arguments": {}, "extra": 1});
    assert!(serde_json::from_value::<ParsedCall>(unknown).is_err());
}
