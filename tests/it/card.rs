//! `cardproof::card::write::write_card`: the measured `fidelity:` block, `model-index` and the
//! readable section written into cards, every other byte kept.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cardproof::card::write::{
    CardInputs, SECTION_END, SECTION_START, UpdateRequest, WrittenCard, update_card, write_card,
};
use cardproof::card::{Card, FrontMatter};
use cardproof::disclosure::Disclosure;
use cardproof::rerun::Measurement;
use serde_json::{Value, json};

use crate::support::{Cmd, cardproof, cardproof_in, model, repo_root};

const CANDIDATES: [&str; 4] = [
    "shakespeare-awq-int4",
    "shakespeare-fp8-block",
    "shakespeare-q4_0-gguf",
    "shakespeare-w8a16",
];

const REV_A: &str = "1111111111111111111111111111111111111111";
const REV_B: &str = "2222222222222222222222222222222222222222";

/// A fresh `cardproof measure` of `candidate` against the BF16 reference on the first ~3000
/// characters of the example eval text (context 128, 50 bootstrap resamples).
fn measure(candidate: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo_root().join("examples/data/eval.txt")).unwrap();
    let end = text[3000..].find('\n').map_or(text.len(), |i| 3000 + i + 1);
    let eval = dir.path().join("eval.txt");
    std::fs::write(&eval, &text[..end]).unwrap();
    let out = dir.path().join("out");
    let run = Cmd::measure()
        .reference(model("shakespeare-bf16"))
        .candidate(model(candidate))
        .eval_text(&eval)
        .context_length(128)
        .bootstrap(50)
        .out(&out)
        .in_dir(dir.path())
        .run();
    assert_eq!(run.code, 0, "{}", run.stderr);
    serde_json::from_str(&std::fs::read_to_string(out.join("measurement.json")).unwrap()).unwrap()
}

/// One measurement shared by the tests that only need some measurement.
fn w8a16() -> &'static Value {
    static M: OnceLock<Value> = OnceLock::new();
    M.get_or_init(|| measure("shakespeare-w8a16"))
}

fn inputs(measurement: &Value) -> CardInputs {
    CardInputs::new(typed(measurement).expect("a measurement"))
}

/// A measurement document read as `card` reads measurement.json.
fn typed(measurement: &Value) -> cardproof::error::Result<Measurement> {
    Measurement::from_slice(
        Path::new("measurement.json"),
        &serde_json::to_vec(measurement).unwrap(),
    )
}

fn write(existing: Option<&str>, inputs: &CardInputs) -> WrittenCard {
    write_card(existing, Path::new("model/README.md"), inputs)
        .unwrap_or_else(|e| panic!("write_card failed: {e}"))
}

fn parse(text: &str) -> Card {
    Card::from_bytes(PathBuf::from("README.md"), text.as_bytes().to_vec()).unwrap()
}

fn fidelity(text: &str) -> Value {
    parse(text)
        .metadata()
        .and_then(|r| r.get("fidelity"))
        .map(|e| e.value.to_json())
        .expect("a fidelity block")
}

/// Lint `text` as README.md; returns (error codes with pointers, JSON report).
fn lint(text: &str) -> (Vec<String>, Value) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README.md"), text).unwrap();
    let run = cardproof_in(dir.path(), &["lint", "README.md", "--json"]);
    let report = run.json();
    let errors: Vec<String> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] == "error")
        .map(|f| format!("{} {}", f["code"], f["pointer"]))
        .collect();
    assert_eq!(run.code, if errors.is_empty() { 0 } else { 1 }, "{report}");
    (errors, report)
}

fn lint_clean(text: &str) {
    let (errors, report) = lint(text);
    assert!(
        errors.is_empty(),
        "lint errors: {report:#}\n--- card\n{text}"
    );
}

/// The front matter with the given top-level entries cut out (from the key's line to the next
/// top-level key's line, or the end of the front matter), as text.
fn front_matter_without(text: &str, keys: &[&str]) -> String {
    let card = parse(text);
    let FrontMatter::Present { yaml, root } = &card.front_matter else {
        panic!("no front matter");
    };
    let Some(root) = root else {
        return text[yaml.clone()].to_owned();
    };
    let cardproof::card::yaml::NodeKind::Map(entries) = &root.kind else {
        panic!("not a mapping");
    };
    let line_start = |offset: usize| text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let mut cuts: Vec<Range<usize>> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if keys.contains(&entry.key.as_str()) {
            let end = entries
                .get(i + 1)
                .map_or(yaml.end, |next| line_start(next.key_span.start));
            cuts.push(line_start(entry.key_span.start)..end);
        }
    }
    let mut out = String::new();
    let mut cursor = yaml.start;
    for cut in cuts {
        out.push_str(&text[cursor..cut.start]);
        cursor = cut.end;
    }
    out.push_str(&text[cursor..yaml.end]);
    // The last kept entry loses nothing but may lose the line break a removed last entry had.
    out.trim_end_matches(['\r', '\n']).to_owned()
}

/// The body with the generated section (and the separator before it) removed.
fn body_without_section(text: &str) -> String {
    let card = parse(text);
    let body = &text[card.body_range()];
    let start = body.find(SECTION_START).expect("section start");
    let end = body.find(SECTION_END).expect("section end") + SECTION_END.len();
    assert!(start < end);
    format!("{}{}", &body[..start], &body[end..])
}

/// Text before the front matter's YAML: the opening marker, byte for byte.
fn opening(text: &str) -> String {
    match parse(text).front_matter {
        FrontMatter::Present { yaml, .. } => text[..yaml.start].to_owned(),
        _ => panic!("no front matter"),
    }
}

/// The measured parts of the block are the measurement's.
fn assert_measured(block: &Value, measurement: &Value) {
    let m = &measurement["fidelity"];
    for pointer in [
        "/schema",
        "/protocol",
        "/results",
        "/runtime",
        "/eval/tokens",
        "/eval/bos",
        "/eval/text/sha256",
        "/reference/format",
        "/reference/dtype",
        "/reference/files_sha256",
        "/candidate/files_sha256",
    ] {
        assert_eq!(
            block.pointer(pointer),
            m.pointer(pointer),
            "{pointer} differs from the measurement"
        );
        assert!(block.pointer(pointer).is_some(), "{pointer} missing");
    }
}

#[test]
fn example_cards_take_a_fresh_measurement() {
    let measurements: Vec<(&str, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = CANDIDATES
            .iter()
            .map(|name| scope.spawn(move || (*name, measure(name))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (name, measurement) in measurements {
        let path = repo_root()
            .join("examples/models")
            .join(name)
            .join("README.md");
        let original = std::fs::read_to_string(&path).unwrap();
        let written = write_card(Some(&original), &path, &inputs(&measurement)).unwrap();
        let text = &written.text;
        let (_, report) = lint(text);
        assert_eq!(report["findings"], json!([]), "{name}: {report:#}");

        // Everything outside `fidelity:`, `model-index` and the section is byte-identical.
        assert_eq!(opening(text), opening(&original), "{name}");
        assert_eq!(
            front_matter_without(text, &["fidelity", "model-index"]),
            front_matter_without(&original, &["fidelity", "model-index"]),
            "{name}"
        );
        // The hand-written `## Fidelity` section (its heading to the end of its table) is
        // replaced by the generated one; every other byte of the body stays.
        let body = body_without_section(text);
        let original_body = &original[parse(&original).body_range()];
        let heading = original_body
            .find("## Fidelity\n")
            .expect("a hand-written section");
        let table = heading + original_body[heading..].find("\n|").unwrap();
        let after = table + original_body[table..].find("\n\n").unwrap() + 1;
        assert_eq!(
            body,
            format!("{}\n{}", &original_body[..heading], &original_body[after..]),
            "{name}: the body changed outside the hand-written section"
        );
        assert!(
            written.warnings.iter().any(|w| w.contains("`## Fidelity`")),
            "{name}: {:?}",
            written.warnings
        );

        // Measured values from the measurement, identity kept from the card.
        let block = fidelity(text);
        assert_measured(&block, &measurement);
        let old = fidelity(&original);
        for pointer in [
            "/reference/repo",
            "/reference/revision",
            "/candidate/repo",
            "/candidate/revision",
            "/quantization",
            "/calibration",
            "/eval/tokenizer",
        ] {
            assert_eq!(
                block.pointer(pointer),
                old.pointer(pointer),
                "{name} {pointer}"
            );
        }
        // A shorter text than the card described: the source names the measured file.
        assert_eq!(block["eval"]["text"]["source"], "eval.txt");
        assert!(
            written.warnings.iter().any(|w| w.contains("eval text")),
            "{:?}",
            written.warnings
        );
        serde_json::from_value::<Disclosure>(block.clone()).expect("a valid disclosure");

        // The model-index mirrors the claims, one entry.
        let meta = parse(text).metadata().unwrap().to_json();
        let mi = &meta["model-index"];
        assert_eq!(mi.as_array().unwrap().len(), 1);
        assert_eq!(mi[0]["name"], old["candidate"]["repo"]);
        let result = &mi[0]["results"][0];
        assert_eq!(result["dataset"]["config"], "ctx128-both");
        assert_eq!(result["dataset"]["split"], "cardproof-native");
        assert_eq!(result["source"]["name"], "cardproof");
        assert_eq!(result["metrics"][0]["type"], "kld_mean");
        assert_eq!(result["metrics"][0]["value"], block["results"][0]["value"]);

        // The section states the protocol and one table.
        let card = parse(text);
        let body = &text[card.body_range()];
        assert!(body.contains("## Fidelity (cardproof)"), "{body}");
        assert!(body.contains("| mean KLD (forward, nats) |"), "{body}");
        assert!(body.contains("**Context length 128**"), "{body}");
        assert!(
            body.contains("block") || body.contains("bootstrap"),
            "{body}"
        );

        // Writing again changes nothing.
        let again = write_card(Some(text), &path, &inputs(&measurement)).unwrap();
        assert_eq!(&again.text, text, "{name}: not idempotent");
    }
}

#[test]
fn the_emitted_block_is_compact_and_quoted() {
    let original =
        std::fs::read_to_string(repo_root().join("examples/models/shakespeare-w8a16/README.md"))
            .unwrap();
    let written = write(Some(&original), &inputs(w8a16()));
    let text = &written.text;
    assert!(text.contains("\n  schema: cardproof/v1\n"), "{text}");
    assert!(
        text.contains("    revision: \"aebc08a6edbab4465a99260c28646dfe1034e3b9\"\n"),
        "{text}"
    );
    assert!(text.contains("    context_lengths: [128]\n"), "{text}");
    assert!(text.contains("    device: \"cpu: "), "{text}");
    assert!(text.contains("    engine_version: \"0.1.0\"\n"), "{text}");
    assert!(
        text.contains("\n    - {metric: kld_mean, value: "),
        "results are flow mappings: {text}"
    );
    // Keys in the schema's order.
    let order: Vec<usize> = [
        "\n  schema:",
        "\n  reference:",
        "\n  candidate:",
        "\n  quantization:",
        "\n  calibration:",
        "\n  runtime:",
        "\n  eval:",
        "\n  protocol:",
        "\n  results:",
    ]
    .iter()
    .map(|k| text.find(k).unwrap_or_else(|| panic!("{k} missing")))
    .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
}

#[test]
fn crlf_and_comments_between_keys_are_kept() {
    let base = std::fs::read_to_string(
        repo_root().join("examples/models/shakespeare-fp8-block/README.md"),
    )
    .unwrap();
    // Comments before, inside and after the block; the block in the middle; CRLF throughout.
    let fm_end = base.find("\n---\n").unwrap();
    let fm = &base[4..fm_end];
    let (head, fidelity_block) = fm.split_at(fm.find("fidelity:").unwrap());
    let fidelity_block =
        fidelity_block.replace("  runtime:", "  # measured on a laptop\n  runtime:");
    let lf = format!(
        "---\n# Hub metadata\n{head}# the disclosure:\n{fidelity_block}\n\n# tags for search\n\
         extra_gated_prompt: \"ok\"  # keep me\n---\n{}",
        &base[fm_end + 5..]
    );
    let crlf = lf.replace('\n', "\r\n");
    let written = write(Some(&crlf), &inputs(w8a16()));
    let text = &written.text;
    assert!(
        !text.replace("\r\n", "").contains('\n'),
        "a bare LF was written"
    );
    lint_clean(text);
    assert_eq!(
        front_matter_without(text, &["fidelity", "model-index"]),
        front_matter_without(&crlf, &["fidelity", "model-index"])
    );
    assert!(text.contains("\r\n# the disclosure:\r\nfidelity:\r\n  schema:"));
    assert!(
        text.contains("\r\n\r\n# tags for search\r\nextra_gated_prompt: \"ok\"  # keep me\r\n")
    );
    assert!(
        !text.contains("measured on a laptop"),
        "the old block is replaced whole"
    );
    assert_measured(&fidelity(text), w8a16());
    assert_eq!(write(Some(text), &inputs(w8a16())).text, *text);
}

#[test]
fn a_card_without_front_matter_gets_one() {
    let original = "# My quantization\r\n\r\nSome words.\r\n";
    let mut given = inputs(w8a16());
    given.reference_repo = Some("example-org/tiny-bf16".into());
    given.reference_revision = Some(REV_A.into());
    given.candidate_repo = Some("example-org/tiny-w8a16".into());
    let written = write(Some(original), &given);
    let text = &written.text;
    assert!(text.starts_with("---\r\n"), "{text}");
    let card = parse(text);
    let body = &text[card.body_range()];
    assert!(body.starts_with(original), "{body}");
    let meta = card.metadata().unwrap().to_json();
    assert_eq!(meta["base_model"], "example-org/tiny-bf16");
    assert_eq!(meta["base_model_relation"], "quantized");
    assert_eq!(meta["fidelity"]["reference"]["revision"], REV_A);
    assert_measured(&meta["fidelity"], w8a16());
    // Quantization and calibration cannot come from a measurement: said, and lint agrees.
    for what in ["fidelity.quantization", "fidelity.calibration"] {
        assert!(
            written.warnings.iter().any(|w| w.contains(what)),
            "{:?}",
            written.warnings
        );
    }
    let (errors, _) = lint(text);
    assert!(
        errors
            .iter()
            .all(|e| e.contains("/fidelity/quantization") || e.contains("/fidelity/calibration")),
        "{errors:?}"
    );
    assert_eq!(write(Some(text), &given).text, *text);
}

#[test]
fn no_card_at_all_creates_one() {
    let mut given = inputs(w8a16());
    given.reference_repo = Some("example-org/tiny-bf16".into());
    given.reference_revision = Some(REV_A.into());
    let written = write(None, &given);
    let text = &written.text;
    assert!(
        text.starts_with("---\nbase_model: example-org/tiny-bf16\n"),
        "{text}"
    );
    // No candidate repository known: named after the measured directory.
    assert!(text.contains("\n# shakespeare-w8a16\n"), "{text}");
    assert!(text.contains("- name: shakespeare-w8a16\n"), "{text}");
    assert!(text.ends_with(&format!("{SECTION_END}\n")), "{text}");
    let (errors, _) = lint(text);
    assert!(
        errors.iter().all(|e| e.contains("/fidelity/quantization")
            || e.contains("/fidelity/calibration")
            || e.contains("/fidelity/candidate")),
        "{errors:?}"
    );
    assert_measured(&fidelity(text), w8a16());
    assert_eq!(write(Some(text), &given).text, *text);

    // A local reference path is no Hub id: no `base_model`, and a warning says why.
    let mut local = given.clone();
    local.reference_repo = Some("/models/tiny-bf16".into());
    let written = write(None, &local);
    assert!(!written.text.contains("base_model:"), "{}", written.text);
    assert!(
        written
            .warnings
            .iter()
            .any(|w| w.contains("not a Hub repository id")),
        "{:?}",
        written.warnings
    );

    // With quantization and calibration added by hand, the card lints clean.
    let completed = text.replace(
        "\n  runtime:\n",
        "\n  quantization:\n    method: int8-channel\n  calibration:\n    dataset: none\n  runtime:\n",
    );
    let mut given = given.clone();
    given.candidate_repo = Some("example-org/tiny-w8a16".into());
    let rewritten = write(Some(&completed), &given);
    lint_clean(&rewritten.text);
    assert_eq!(
        fidelity(&rewritten.text)["quantization"]["method"],
        "int8-channel"
    );
}

#[test]
fn inputs_override_the_card_and_existing_fields_are_kept() {
    let card = crate::support::compliant_card();
    // The measured candidate files are not the card's, and its revision is kept: said.
    let kept = write(Some(&card), &inputs(w8a16()));
    assert!(
        kept.warnings
            .iter()
            .any(|w| w.contains("candidate files differ")),
        "{:?}",
        kept.warnings
    );
    // The old card's hand-written fidelity section (with its table) is replaced: said.
    assert!(
        kept.warnings
            .iter()
            .any(|w| w.contains("hand-written fidelity section `## Fidelity`")),
        "{:?}",
        kept.warnings
    );
    assert!(!kept.text.contains("| 4,096 | 0.0123"), "{}", kept.text);
    lint_clean(&kept.text);

    let mut given = inputs(w8a16());
    given.candidate_revision = Some(REV_B.into());
    let written = write(Some(&card), &given);
    let block = fidelity(&written.text);
    assert_eq!(block["candidate"]["revision"], REV_B);
    assert_eq!(block["candidate"]["repo"], "example-org/Qwen3-8B-FP8-block");
    assert_eq!(
        block["reference"]["revision"],
        "9c925d64d72725edaf899c6cb9c377fd0709d9c5"
    );
    assert_eq!(block["quantization"]["group"], json!([128, 128]));
    assert_eq!(block["eval"]["tokenizer"]["repo"], "Qwen/Qwen3-8B");
    assert_measured(&block, w8a16());
    assert!(
        !written
            .warnings
            .iter()
            .any(|w| w.contains("candidate files differ")),
        "{:?}",
        written.warnings
    );
    lint_clean(&written.text);
}

#[test]
fn ambiguous_strings_are_quoted_and_round_trip() {
    let strings = [
        "no",
        "1e5",
        "0123",
        "a: b",
        "#x",
        "",
        "yes",
        "2024-01-31",
        "on",
        "~",
    ];
    let card = crate::support::compliant_card().replace(
        "    tool: \"llm-compressor 0.8.1\"\n",
        &format!(
            "    tool: \"llm-compressor 0.8.1\"\n    x-notes: {}\n  x_extra: {{note: \"no\"}}\n",
            serde_json::to_string(&strings).unwrap()
        ),
    );
    assert!(card.contains("x-notes"));
    let written = write(Some(&card), &inputs(w8a16()));
    let text = &written.text;
    assert!(
        text.contains(
            "x-notes: [\"no\", \"1e5\", \"0123\", \"a: b\", \"#x\", \"\", \"yes\", \"2024-01-31\", \"on\", \"~\"]"
        ),
        "{text}"
    );
    assert!(text.contains("note: \"no\""), "{text}");
    let block = fidelity(text);
    assert_eq!(block["quantization"]["x-notes"], json!(strings));
    assert_eq!(block["x_extra"]["note"], "no");
    let (_, report) = lint(text);
    assert!(
        !report.to_string().contains("yaml11-ambiguous"),
        "{report:#}"
    );
    lint_clean(text);
}

#[test]
fn a_foreign_model_index_is_left_alone_and_ours_is_replaced() {
    let foreign = "model-index:\n- name: someone/else\n  results:\n  - task: {type: text-generation}\n    dataset: {name: wikitext, type: wikitext}\n    metrics:\n    - {type: perplexity, value: 6.1}\n";
    let card = crate::support::compliant_card().replacen(
        "fidelity:\n",
        &format!("{foreign}fidelity:\n"),
        1,
    );
    let written = write(Some(&card), &inputs(w8a16()));
    assert!(
        written.text.contains(foreign),
        "the foreign model-index changed"
    );
    assert!(
        written.warnings.iter().any(|w| w.contains("model-index")),
        "{:?}",
        written.warnings
    );
    lint_clean(&written.text);

    // Ours (written by an earlier run, here placed before `fidelity:`) is replaced in place.
    let first = write(Some(&crate::support::compliant_card()), &inputs(w8a16())).text;
    let card = parse(&first);
    let meta = card.metadata().unwrap().to_json();
    assert_eq!(
        meta["model-index"][0]["results"][0]["source"]["name"],
        "cardproof"
    );
    let other = measure_variant(w8a16());
    let second = write(Some(&first), &inputs(&other)).text;
    let mi = parse(&second).metadata().unwrap().to_json()["model-index"].clone();
    assert_eq!(mi.as_array().unwrap().len(), 1);
    assert_eq!(mi[0]["results"][0]["metrics"][0]["value"], json!(0.5));
    assert_eq!(second.matches("model-index:").count(), 1);
}

/// The same measurement with a different mean KLD claim, as a later run would give.
fn measure_variant(m: &Value) -> Value {
    let mut m = m.clone();
    m["fidelity"]["results"][0]["value"] = json!(0.5);
    m
}

#[test]
fn the_section_is_replaced_between_its_markers() {
    let card = format!(
        "---\nlicense: mit\n---\n# Title\n\n{SECTION_START}\nold words\n{SECTION_END}\n\n## After\n\nkept\n"
    );
    let written = write(Some(&card), &inputs(w8a16()));
    let text = &written.text;
    assert!(!text.contains("old words"));
    assert!(
        text.contains(&format!("{SECTION_END}\n\n## After\n\nkept\n")),
        "{text}"
    );
    assert!(text.contains("# Title\n\n<!-- cardproof:fidelity:start -->\n## Fidelity"));
    assert_eq!(text.matches(SECTION_START).count(), 1);
    // Card text is escaped for Markdown.
    let mut given = inputs(w8a16());
    given.candidate_repo = Some("org/model_with*stars|pipes".into());
    let text = write(Some(&card), &given).text;
    assert!(
        text.contains("**org/model\\_with\\*stars\\|pipes**"),
        "{text}"
    );
}

#[test]
fn unusable_inputs_are_errors() {
    let err = typed(&json!({"runs": []})).unwrap_err();
    assert!(
        err.is_format() && err.to_string().contains("is not a measurement.json"),
        "{err}"
    );
    let mut no_fidelity = w8a16().clone();
    no_fidelity.as_object_mut().unwrap().remove("fidelity");
    let err = typed(&no_fidelity).unwrap_err();
    assert!(
        err.to_string().contains("missing field `fidelity`"),
        "{err}"
    );
    let mut no_runs = w8a16().clone();
    no_runs.as_object_mut().unwrap().remove("runs");
    let err = typed(&no_runs).unwrap_err();
    assert!(err.to_string().contains("runs"), "{err}");
    // A measurement with no runs is read, and refused by the card writer.
    let mut empty = w8a16().clone();
    empty["runs"] = json!([]);
    let err = write_card(None, Path::new("README.md"), &inputs(&empty)).unwrap_err();
    assert!(err.to_string().contains("has no `runs`"), "{err}");

    let broken = "---\nlicense: mit\nfidelity: [unclosed\n---\n# body\n";
    let err = write_card(Some(broken), Path::new("m/README.md"), &inputs(w8a16())).unwrap_err();
    let message = err.to_string();
    assert!(message.starts_with("m/README.md:"), "{message}");
    assert!(err.at.is_some(), "{message}");

    let unterminated = "\n---\nlicense: mit\n# body\n";
    let err = write_card(Some(unterminated), Path::new("README.md"), &inputs(w8a16())).unwrap_err();
    assert_eq!(err.at.map(|a| a.line), Some(2), "{err}");

    let mut bad = inputs(w8a16());
    bad.reference_revision = Some("main".into());
    assert!(write_card(None, Path::new("README.md"), &bad).is_err());
}

#[test]
fn odd_layouts_are_edited_in_place() {
    let added = [
        "fidelity",
        "model-index",
        "base_model",
        "base_model_relation",
    ];
    for card in [
        // Indented top-level keys, the block in the middle.
        "---\n  license: mit\n  fidelity:\n    old: 1\n  tags: [a]\n---\nbody\n",
        // A blank line before the closing marker; a body without a final line break.
        "---\nlicense: mit\n\n---\nbody",
        // Empty front matter, comment-only front matter, an empty file.
        "---\n\n---\n",
        "---\n# only a comment\n---\n",
        "",
        // An empty block, then a key; a trailing comment.
        "---\nfidelity:\nnext: 1\n# trailing\n---\n",
        // A flow block with a comment, blank lines and the next key's comment, closing at EOF.
        "---\nfidelity: {schema: x}   # c\n\n\n# about next\nnext: 1\n---",
        // A block scalar before the block.
        "---\na: |\n  text\n\n  more\nfidelity:\n  - x\nz: 2\n---\n",
    ] {
        let written = write(Some(card), &inputs(w8a16()));
        let text = &written.text;
        assert_measured(&fidelity(text), w8a16());
        assert_eq!(write(Some(text), &inputs(w8a16())).text, *text, "{card:?}");
        if card.starts_with("---") {
            assert_eq!(opening(text), opening(card), "{card:?}");
            assert_eq!(
                front_matter_without(text, &added),
                front_matter_without(card, &added),
                "{card:?} -> {text}"
            );
        }
        let original_body = match parse(card).front_matter {
            FrontMatter::Present { .. } => &card[parse(card).body_range()],
            _ => card,
        };
        let body = body_without_section(text);
        assert!(body.starts_with(original_body), "{card:?} -> {text}");
    }
    let meta = parse(
        &write(
            Some("---\na: |\n  text\n\n  more\nfidelity:\n  - x\nz: 2\n---\n"),
            &inputs(w8a16()),
        )
        .text,
    )
    .metadata()
    .unwrap()
    .to_json();
    assert_eq!(meta["a"], "text\n\nmore\n");
    assert_eq!(meta["z"], 2);
}

/// Random strings and numbers in an extension field of the existing block come back unchanged
/// after a rewrite: whatever the quoting, both YAML readers see the same values.
#[test]
fn random_extension_values_round_trip() {
    let alphabet: Vec<char> = " abyn01.:-#,'\"\\[]{}!&*|>%@`\t\né~=<xeEoO_+?/\u{2028}"
        .chars()
        .collect();
    let mut seed = 0x853c_49e6_748f_ea9bu64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut strings = vec![String::new()];
    for _ in 0..300 {
        let r = next();
        let len = (r % 7) as usize;
        strings.push(
            (0..len)
                .map(|i| alphabet[((r >> (8 + 6 * i)) as usize) % alphabet.len()])
                .collect(),
        );
    }
    let mut numbers: Vec<Value> = vec![json!(0), json!(-7), json!(1.0), json!(1e-7), json!(2.5e17)];
    for _ in 0..300 {
        let f = f64::from_bits(next());
        if f.is_finite() {
            numbers.push(json!(f));
        }
        numbers.push(json!(next() as i64));
    }
    let card = crate::support::compliant_card().replace(
        "  calibration:\n",
        &format!(
            "  x-strings: {}\n  x-numbers: {}\n  calibration:\n",
            serde_json::to_string(&strings).unwrap(),
            serde_json::to_string(&numbers).unwrap()
        ),
    );
    let before = fidelity(&card);
    assert_eq!(
        before["x-strings"],
        json!(strings),
        "the fixture itself reads back"
    );
    let text = write(Some(&card), &inputs(w8a16())).text;
    let after = fidelity(&text);
    assert_eq!(after["x-strings"], json!(strings));
    assert_eq!(after["x-numbers"], json!(numbers));
    let (_, report) = lint(&text);
    let ambiguous: Vec<&Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "yaml11-ambiguous" || f["code"] == "unquoted-revision")
        .collect();
    assert!(ambiguous.is_empty(), "{ambiguous:#?}");
}

/// The eval text's wording stays when the card described the very bytes measured.
#[test]
fn the_eval_text_wording_is_kept_for_the_same_text() {
    let first = write(None, &inputs(w8a16())).text;
    let reworded = first.replace(
        "      source: eval.txt\n",
        "      source: \"Tiny Shakespeare: the first 3000 characters\"\n      split: test\n",
    );
    assert_ne!(reworded, first);
    let written = write(Some(&reworded), &inputs(w8a16()));
    let block = fidelity(&written.text);
    assert_eq!(
        block["eval"]["text"]["source"],
        "Tiny Shakespeare: the first 3000 characters"
    );
    assert_eq!(block["eval"]["text"]["split"], "test");
    assert!(
        !written.warnings.iter().any(|w| w.contains("eval text")),
        "{:?}",
        written.warnings
    );
    assert!(
        written
            .text
            .contains("The eval text is Tiny Shakespeare: the first 3000 characters (")
    );
}

#[test]
fn update_card_writes_beside_the_candidate_and_never_into_the_hub_cache() {
    let dir = tempfile::tempdir().unwrap();
    let candidate = dir.path().join("candidate");
    crate::support::copy_model("shakespeare-w8a16", &candidate);
    let mut measurement = w8a16().clone();
    measurement["candidate"]["path"] = candidate.display().to_string().into();
    let file = dir.path().join("measurement.json");
    std::fs::write(&file, measurement.to_string()).unwrap();
    let request = UpdateRequest {
        measurement: file.clone(),
        ..UpdateRequest::default()
    };

    // No --into: the candidate's README.md, updated; the digest and the card are what is on disk.
    let update = update_card(&request).unwrap();
    let card = candidate.join("README.md");
    assert_eq!(update.path, card);
    assert!(!update.created);
    let on_disk = std::fs::read(&card).unwrap();
    assert_eq!(update.card.text.as_bytes(), on_disk.as_slice());
    assert_eq!(
        update.sha256,
        cardproof::checkpoint::hash::hash_file(&card).unwrap()
    );
    assert_measured(&fidelity(&update.card.text), &measurement);

    // --into a card that does not exist yet: created.
    let fresh = dir.path().join("fresh.md");
    let update = update_card(&UpdateRequest {
        into: Some(fresh.clone()),
        ..request.clone()
    })
    .unwrap();
    assert!(update.created);
    assert_eq!(update.path, fresh);

    // A candidate measured from the Hub was read from the cache: refused without --into.
    measurement["candidate"]["hub"] =
        json!({"repo": "example-org/tiny", "revision": "main", "commit": REV_A});
    std::fs::write(&file, measurement.to_string()).unwrap();
    let before = std::fs::read(&card).unwrap();
    let e = update_card(&request).unwrap_err();
    assert_eq!(e.file, file);
    assert!(e.to_string().contains("hf:example-org/tiny"), "{e}");
    assert!(e.to_string().contains("--into"), "{e}");
    assert_eq!(std::fs::read(&card).unwrap(), before);
    // No candidate path: --into is needed.
    let mut no_path = measurement.clone();
    no_path["candidate"]["hub"] = Value::Null;
    no_path["candidate"]["path"] = json!("");
    let e =
        cardproof::card::write::default_card_path(&file, &typed(&no_path).unwrap()).unwrap_err();
    assert!(e.to_string().contains("candidate.path"), "{e}");
    // Not JSON, and JSON of another shape: refused naming the file given (and the field).
    std::fs::write(&file, "not json").unwrap();
    let e = update_card(&request).unwrap_err();
    assert_eq!(e.file, file);
    assert!(e.to_string().contains("is not a measurement.json"), "{e}");
    measurement["runs"][0]["context_length"] = json!("x");
    std::fs::write(&file, measurement.to_string()).unwrap();
    let e = update_card(&request).unwrap_err();
    assert!(e.is_format() && e.file == file, "{e}");
    assert!(e.to_string().contains("runs[0].context_length"), "{e}");
    assert_eq!(std::fs::read(&card).unwrap(), before);
}

/// A copy of the w8a16 example without its card, and a measurement of it on disk.
fn bare_candidate() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let candidate = dir.path().join("candidate");
    crate::support::copy_model("shakespeare-w8a16", &candidate);
    std::fs::remove_file(candidate.join("README.md")).unwrap();
    let mut measurement = w8a16().clone();
    measurement["candidate"]["path"] = candidate.display().to_string().into();
    let file = dir.path().join("measurement.json");
    std::fs::write(&file, measurement.to_string()).unwrap();
    (dir, file)
}

#[test]
fn a_new_card_written_with_the_identity_flags_lints_clean_in_one_command() {
    let (dir, file) = bare_candidate();
    let candidate = dir.path().join("candidate");
    let run = cardproof(&[
        "card",
        "--measurement",
        file.to_str().unwrap(),
        "--reference-repo",
        "example-org/shakespeare-bf16",
        "--reference-revision",
        REV_A,
        "--candidate-repo",
        "example-org/shakespeare-w8a16",
        "--candidate-revision",
        REV_B,
        "--quantization",
        "int8-channel",
        "--calibration",
        "none",
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = run.json();
    assert_eq!(doc["action"], "created");
    assert_eq!(doc["lint"]["errors"], 0, "{doc:#}");
    assert_eq!(doc["lint"]["findings"], json!([]), "{doc:#}");
    let block = fidelity(&std::fs::read_to_string(candidate.join("README.md")).unwrap());
    assert_eq!(block["quantization"]["method"], "int8-channel");
    assert_eq!(block["calibration"], json!({"dataset": "none"}));
    assert_eq!(block["reference"]["revision"], REV_A);
    let lint = cardproof(&["lint", candidate.to_str().unwrap()]);
    assert_eq!(lint.code, 0, "{}", lint.stderr);
    assert!(
        lint.stderr.contains("0 errors, 0 warnings"),
        "{}",
        lint.stderr
    );

    // Without them the same command names what is missing, and the card has lint errors.
    let (_dir, file) = bare_candidate();
    let run = cardproof(&["card", "--measurement", file.to_str().unwrap()]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("error[missing-disclosure]"),
        "{}",
        run.stderr
    );
    // ... and which flags fill what a measurement cannot know.
    for flag in ["--quantization METHOD", "--calibration DATASET"] {
        assert!(run.stderr.contains(flag), "{}", run.stderr);
    }
    // A calibration revision without a dataset is a usage error.
    let run = cardproof(&[
        "card",
        "--measurement",
        file.to_str().unwrap(),
        "--calibration-revision",
        "main",
    ]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[test]
fn an_update_replaces_the_hand_written_section_and_flags_a_contradicting_prose_number() {
    let (dir, file) = bare_candidate();
    let card = dir.path().join("candidate/README.md");
    let first = cardproof(&[
        "card",
        "--measurement",
        file.to_str().unwrap(),
        "--reference-repo",
        "example-org/shakespeare-bf16",
        "--reference-revision",
        REV_A,
        "--candidate-repo",
        "example-org/shakespeare-w8a16",
        "--quantization",
        "int8-channel",
        "--calibration",
        "none",
    ]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    // An author's card: the metadata kept, the body hand-written, with an old fidelity section
    // and a stale number in the introduction.
    let written = std::fs::read_to_string(&card).unwrap();
    let front = &written[..written.find(SECTION_START).unwrap()];
    let hand = format!(
        "{front}Intro: this quant keeps a mean KLD of 0.5 against BF16.\n\n## KL divergence\n\n\
         | quant | \u{03BC}KLD | 99.9% KLD |\n|---|---|---|\n| int8 | 0.0009 | 0.2 |\n\n\
         Thanks for reading.\n\n## Usage\n\nRun it.\n"
    );
    std::fs::write(&card, &hand).unwrap();
    let run = cardproof(&["card", "--measurement", file.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 0, "warnings only: {}", run.stderr);
    let text = std::fs::read_to_string(&card).unwrap();
    assert!(
        !text.contains("## KL divergence") && !text.contains("| int8 | 0.0009"),
        "{text}"
    );
    assert_eq!(text.matches(SECTION_START).count(), 1, "{text}");
    assert!(
        text.contains("Thanks for reading.\n\n## Usage\n\nRun it.\n"),
        "{text}"
    );
    assert!(
        text.find(SECTION_END).unwrap() < text.find("Thanks for reading").unwrap()
            && text.find("Intro:").unwrap() < text.find(SECTION_START).unwrap(),
        "{text}"
    );
    let doc = run.json();
    assert!(
        doc["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("`## KL divergence`")),
        "{doc:#}"
    );
    let findings = doc["lint"]["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{doc:#}");
    assert_eq!(findings[0]["code"], "prose-contradicts-disclosure");
    assert!(
        findings[0]["message"].as_str().unwrap().contains("KLD 0.5"),
        "{doc:#}"
    );
    // With --json the document carries the finding; stderr does not repeat it.
    assert!(
        !run.stderr.contains("warning[prose-contradicts-disclosure]"),
        "{}",
        run.stderr
    );
}

/// `card` wrote `eval.text.source` as the bare file name, which `verify` (reading only files in
/// the card's directory) then could not find: an eval text inside the card's directory is named
/// by its path there; one outside keeps its name and the writer says how `verify` will find it.
#[test]
fn the_eval_source_is_written_where_verify_finds_it() {
    let (dir, file) = bare_candidate();
    let candidate = dir.path().join("candidate");
    std::fs::create_dir_all(candidate.join("data")).unwrap();
    let inside = candidate.join("data/eval.txt");
    std::fs::copy(repo_root().join("examples/data/eval.txt"), &inside).unwrap();
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let outside = m["eval"]["text_path"].clone();
    m["eval"]["text_path"] = inside.display().to_string().into();
    std::fs::write(&file, m.to_string()).unwrap();
    let flags = ["--quantization", "int8-channel", "--calibration", "none"];
    let mut args = vec!["card", "--measurement", file.to_str().unwrap()];
    args.extend(flags);
    let run = cardproof(&args);
    assert_ne!(run.code, 2, "{}", run.stderr);
    let card = std::fs::read_to_string(candidate.join("README.md")).unwrap();
    assert_eq!(fidelity(&card)["eval"]["text"]["source"], "data/eval.txt");
    assert!(
        !run.stderr.contains("not in the card's directory"),
        "{}",
        run.stderr
    );
    // Outside the card's directory: the name, and a note on how verify finds the text.
    m["eval"]["text_path"] = outside;
    std::fs::write(&file, m.to_string()).unwrap();
    let run = cardproof(&args);
    assert_ne!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains("not in the card's directory"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("verify --eval-text"), "{}", run.stderr);
}
