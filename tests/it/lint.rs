//! `cardproof lint`: every finding code, the example cards, the output contract.

use cardproof::findings::Code;

use crate::support::*;

type Fixture = (Code, String, Option<&'static str>, Option<&'static str>);

/// Codes that need a checkpoint next to the card: (code, card, checkpoint writer).
type WriteCheckpoint = fn(&std::path::Path);

fn checkpoint_fixtures() -> Vec<(Code, String, WriteCheckpoint)> {
    vec![
        (Code::ConfigTensorMismatch, compliant_card(), |d| {
            crate::fixtures::int4_pack_quantized(d, 64, 128, false)
        }),
        (Code::UnknownScheme, compliant_card(), |d| {
            let mut t = crate::fixtures::Tensors::default();
            t.add(
                "model.layers.0.mlp.up_proj.weight",
                cardproof::checkpoint::dtype::Dtype::F8_E4M3,
                &[64, 64],
            );
            t.write(&d.join("model.safetensors"));
        }),
        (
            Code::QuantizationMismatch,
            compliant_card(),
            crate::fixtures::mixed_fp8_nvfp4,
        ),
        // A card listing `absent.gguf` beside `model.gguf`: the listed file is missing (an
        // error) and the file there is not listed (a warning).
        (Code::ListedFileMissing, files_card("absent.gguf"), |d| {
            crate::fixtures::gguf_q4_k(&d.join("model.gguf"))
        }),
        (Code::UnlistedFile, files_card("absent.gguf"), |d| {
            crate::fixtures::gguf_q4_k(&d.join("model.gguf"))
        }),
    ]
}

/// The compliant card as a card listing one file (`fidelity.files`): its quantization and
/// claims moved into the entry for `file`.
fn files_card(file: &str) -> String {
    let card = compliant_card();
    let mut out = String::new();
    let mut in_quantization = false;
    for line in card.lines() {
        if line == "  quantization:" {
            in_quantization = true;
            continue;
        }
        if in_quantization && line.starts_with("    ") {
            continue;
        }
        in_quantization = false;
        if line.starts_with("    files_sha256:") {
            continue;
        }
        if line == "  results:" {
            out.push_str(&format!(
                "  files:\n    - file: {file}\n      files_sha256: \"5d41402abc4b2a76b9719d911017c592e1b0f1f4c6fbb4cb8b2f3a9e6d7c8b9a\"\n      quantization: {{method: q4_k_m}}\n      results:\n"
            ));
            continue;
        }
        if line.starts_with("    - {metric") {
            out.push_str(&format!("    {line}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// One small card per finding code: (code, card text, expected pointer, expected item).
fn fixtures() -> Vec<Fixture> {
    vec![
        (
            Code::SchemaViolation,
            compliant_with("    device_count: 1\n", "    device_count: one\n"),
            Some("/fidelity/runtime/device_count"),
            Some("runtime"),
        ),
        (
            Code::MissingDisclosure,
            compliant_with("    kl: {direction: forward, units: nats}\n", ""),
            Some("/fidelity/protocol/kl"),
            Some("kl_direction"),
        ),
        (
            Code::VagueDisclosure,
            compliant_with("engine_version: \"0.11.1\"", "engine_version: latest"),
            Some("/fidelity/runtime/engine_version"),
            Some("runtime"),
        ),
        (
            Code::KvCacheMismatch,
            compliant_with(
                "    kv_cache_dtype: bf16\n",
                "    kv_cache_dtype: bf16\n    kv_cache: {k: q8_0, v: q4_0}\n",
            ),
            Some("/fidelity/runtime/kv_cache/k"),
            Some("runtime"),
        ),
        (
            Code::UnknownMetric,
            compliant_with("{metric: kld_p99,", "{metric: kld_99th,"),
            Some("/fidelity/results/1/metric"),
            None,
        ),
        (
            Code::InconsistentClaim,
            compliant_with("value: 0.981, context_length: 4096", "value: 0.981, context_length: 8192"),
            Some("/fidelity/results/2/context_length"),
            None,
        ),
        (
            Code::MissingBaseModel,
            compliant_with("base_model: Qwen/Qwen3-8B\n", ""),
            Some("/base_model"),
            None,
        ),
        (
            Code::BaseModelRelation,
            compliant_with("base_model_relation: quantized", "base_model_relation: finetune"),
            Some("/base_model_relation"),
            None,
        ),
        (
            Code::ReferenceNotBaseModel,
            compliant_with("base_model: Qwen/Qwen3-8B\n", "base_model: Qwen/Qwen3-14B\n"),
            Some("/fidelity/reference/repo"),
            None,
        ),
        (
            Code::CandidateUnpinned,
            compliant_card()
                .replace("    revision: \"3f1d2a7b9c0e4d5f6a7b8c9d0e1f2a3b4c5d6e7f\"\n", "")
                .replace(
                    "    files_sha256: \"5d41402abc4b2a76b9719d911017c592e1b0f1f4c6fbb4cb8b2f3a9e6d7c8b9a\"\n",
                    "",
                ),
            Some("/fidelity/candidate"),
            None,
        ),
        (
            Code::CalibrationOverlapsEval,
            compliant_with("    dataset: none\n", "    dataset: Salesforce/wikitext\n    sha256: \"0c6f7e1d6a4e5b8c9d2f3a1b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d\"\n"),
            Some("/fidelity/calibration/dataset"),
            Some("calibration"),
        ),
        (
            Code::UnquotedRevision,
            "---\nlicense: mit\nmodel-index:\n  - name: x\n    results:\n      - dataset: {type: wikitext, name: wikitext, revision: 0123456789}\n---\n".into(),
            Some("/model-index/0/results/0/dataset/revision"),
            None,
        ),
        (
            Code::Yaml11Ambiguous,
            "---\nlicense: mit\nlanguage: [en, no]\n---\n# Card\n".into(),
            Some("/language/1"),
            None,
        ),
        (
            Code::UndisclosedKldClaim,
            "---\nlicense: mit\n---\n# Quant\n\nMean KLD is 0.0123 against BF16.\n".into(),
            None,
            None,
        ),
        (
            Code::ProseContradictsDisclosure,
            format!("{}\nIn short: the mean KLD is 0.0456.\n", compliant_card()),
            None,
            None,
        ),
        (
            Code::ProseNotInDisclosure,
            format!("{}\nIn short: the maximum KLD is 4.56.\n", compliant_card()),
            None,
            None,
        ),
        (
            Code::NoFidelityDisclosure,
            "---\nlicense: mit\n---\n# A model\n".into(),
            None,
            None,
        ),
        (
            Code::ImpreciseClaim,
            compliant_with("value: 0.0123,", "value: 0.01,"),
            Some("/fidelity/results/0/value"),
            None,
        ),
        (
            Code::InvalidClaim,
            compliant_with("value: 0.0123,", "value: 123e-4,"),
            Some("/fidelity/results/0/value"),
            None,
        ),
        (
            Code::UnterminatedFrontMatter,
            "---\nlicense: mit\n# no closing marker\n".into(),
            None,
            None,
        ),
        (
            Code::ConversationAllPositions,
            compliant_with(
                "      source: \"wikitext-2-raw-v1/test\"\n",
                "      source: \"chat.json\"\n      kind: conversation\n",
            ),
            Some("/fidelity/protocol/positions/policy"),
            Some("positions"),
        ),
        (
            Code::MetadataNotMapping,
            "---\n- just\n- a list\n---\n# Card\n".into(),
            None,
            None,
        ),
        // The Hub's model-index shows kld_mean 0.00123 at 4096; the block claims 0.0123 there.
        (
            Code::ModelIndexContradictsDisclosure,
            compliant_with(
                "base_model_relation: quantized\n",
                "base_model_relation: quantized\nmodel-index:\n  - name: m\n    results:\n      - task: {type: text-generation}\n        dataset: {name: wikitext, type: wikitext, config: ctx4096-forward}\n        metrics:\n          - {type: kld_mean, value: 0.00123}\n          - {type: kld_p99, value: 0.184}\n",
            ),
            Some("/model-index/0/results/0/metrics/0/value"),
            None,
        ),
    ]
}

#[test]
fn every_finding_code_has_a_fixture_that_triggers_it() {
    let fixtures = fixtures();
    let with_checkpoint = checkpoint_fixtures();
    for code in Code::ALL {
        assert!(
            fixtures.iter().any(|(c, ..)| *c == code)
                || with_checkpoint.iter().any(|(c, ..)| *c == code),
            "no fixture for `{code}`"
        );
    }
    for (code, text, write) in with_checkpoint {
        let dir = card_dir(&text);
        write(dir.path());
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        let severity = code.severity().to_string();
        assert_eq!(
            run.finding(code.as_str())["severity"],
            severity.as_str(),
            "{code}"
        );
        assert_eq!(run.code, 1, "{code}");
    }
    for (code, text, pointer, item) in fixtures {
        let run = lint_text(&text);
        let finding = run.finding(code.as_str());
        assert_eq!(finding["severity"], code.severity().to_string(), "{code}");
        if let Some(pointer) = pointer {
            assert_eq!(finding["pointer"], pointer, "{code}");
        }
        if let Some(item) = item {
            assert_eq!(finding["item"], item, "{code}");
        }
        let line = finding["line"].as_u64();
        if code != Code::NoFidelityDisclosure {
            assert!(line.is_some(), "{code} must point at a line");
        }
        let expected_exit = if run.codes().iter().any(|c| {
            Code::ALL
                .iter()
                .any(|k| k.as_str() == c && k.severity().to_string() == "error")
        }) {
            1
        } else {
            0
        };
        assert_eq!(run.code, expected_exit, "{code}: {}", run.stderr);
    }
}

#[test]
fn findings_point_at_file_lines_and_columns() {
    let card = compliant_with("engine_version: \"0.11.1\"", "engine_version: latest");
    let run = lint_text(&card);
    let f = run.finding("vague-disclosure");
    let line = card
        .lines()
        .position(|l| l.contains("engine_version: latest"))
        .unwrap()
        + 1;
    assert_eq!(f["line"], line as u64);
    assert_eq!(f["column"], 21);
}

#[test]
fn a_missing_protocol_is_five_missing_items() {
    let card = compliant_card();
    let start = card.find("  protocol:\n").unwrap();
    let end = card.find("  results:\n").unwrap();
    let run = lint_text(format!("{}{}", &card[..start], &card[end..]));
    let mut items: Vec<String> = run.json()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "missing-disclosure")
        .map(|f| f["item"].as_str().unwrap().to_owned())
        .collect();
    items.sort();
    assert_eq!(
        items,
        [
            "aggregation",
            "context_lengths",
            "kl_direction",
            "positions",
            "vocab_truncation"
        ]
    );
    assert_eq!(run.code, 1);
}

#[test]
fn an_empty_fidelity_block_reports_all_nine_items() {
    let run =
        lint_text("---\nbase_model: a/b\nbase_model_relation: quantized\nfidelity: {}\n---\n");
    let mut items: Vec<String> = run.json()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["item"].as_str().map(str::to_owned))
        .collect();
    items.sort();
    items.dedup();
    assert_eq!(items.len(), 9, "{items:?}");
}

#[test]
fn wrong_types_everywhere_are_all_reported() {
    let text = "---\nbase_model: a/b\nbase_model_relation: quantized\nfidelity:\n  schema: 1\n  reference: [x]\n  candidate: 3\n  quantization: yes\n  calibration: []\n  runtime: {engine: 5, engine_version: 1.0, attention_backend: [], kv_cache_dtype: {}, compute_dtype: 16, device: true}\n  eval: {text: {source: 1}, bos: sometimes}\n  protocol: {context_lengths: [x, -1], positions: {policy: 3}, kl: {direction: up, units: 2}, vocab: {mode: []}, aggregation: {statistic: 1, uncertainty: 0.95}}\n  results: {metric: kld_mean}\n---\n";
    let run = lint_text(text);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let findings = run.json()["findings"].as_array().unwrap().clone();
    let violations: Vec<&str> = findings
        .iter()
        .filter(|f| f["code"] == "schema-violation")
        .map(|f| f["pointer"].as_str().unwrap())
        .collect();
    for pointer in [
        "/fidelity/schema",
        "/fidelity/reference",
        "/fidelity/candidate",
        "/fidelity/quantization",
        "/fidelity/calibration",
        "/fidelity/runtime/engine",
        "/fidelity/runtime/engine_version",
        "/fidelity/runtime/device",
        "/fidelity/eval/bos",
        "/fidelity/protocol/context_lengths/0",
        "/fidelity/protocol/context_lengths/1",
        "/fidelity/protocol/kl/direction",
        "/fidelity/protocol/aggregation/uncertainty",
        "/fidelity/results",
    ] {
        assert!(
            violations.contains(&pointer),
            "no violation at {pointer}: {violations:?}"
        );
    }
    for f in &findings {
        assert!(f["line"].is_u64(), "{f}");
    }
}

/// Regression (#14): the schema's ranges are what lint enforces, with the bounds right: a level
/// of exactly 0 or 1 (or 2.0) and `resamples: 1000000000` passed lint, then broke the rerun.
#[test]
fn protocol_numbers_outside_their_ranges_are_schema_violations() {
    let u = "/fidelity/protocol/aggregation/uncertainty";
    let uncertainty = "level: 0.95, resamples: 1000,";
    for (old, new, pointer, message) in [
        (
            uncertainty,
            "level: 2.0, resamples: 1000,",
            format!("{u}/level"),
            "must be below 1",
        ),
        (
            uncertainty,
            "level: 1.0, resamples: 1000,",
            format!("{u}/level"),
            "must be below 1",
        ),
        (
            uncertainty,
            "level: 0, resamples: 1000,",
            format!("{u}/level"),
            "must be above 0",
        ),
        (
            uncertainty,
            "level: 0.95, resamples: 1000000000,",
            format!("{u}/resamples"),
            "must be at most 100000",
        ),
        (
            "[4096, 32768]",
            "[4096, 2097152]",
            "/fidelity/protocol/context_lengths/1".to_owned(),
            "must be at most 1048576",
        ),
        (
            "{metric: kld_p99, value: 0.184,",
            "{metric: kld_p99, value: 0.184, level: 1.0,",
            "/fidelity/results/1/level".to_owned(),
            "must be below 1",
        ),
        (
            "stride: 32, offset: 31",
            "stride: 0, offset: 31",
            "/fidelity/protocol/positions/stride".to_owned(),
            "must be at least 1",
        ),
    ] {
        let run = lint_text(compliant_with(old, new));
        assert_eq!(run.code, 1, "{new}: {}", run.stderr);
        let findings = run.json()["findings"].as_array().unwrap().clone();
        let found = findings
            .iter()
            .find(|f| f["code"] == "schema-violation" && f["pointer"] == pointer.as_str());
        let found =
            found.unwrap_or_else(|| panic!("{new}: no violation at {pointer}: {findings:?}"));
        assert!(
            found["message"].as_str().unwrap().contains(message),
            "{new}: {found}"
        );
        assert!(found["line"].is_u64(), "{found}");
    }
    // Inside the ranges: clean.
    let run = lint_text(compliant_with(
        uncertainty,
        "level: 0.5, resamples: 100000,",
    ));
    assert_eq!(run.code, 0, "{}", run.stdout);
}

#[test]
fn unknown_fields_suggest_the_intended_one() {
    let run = lint_text(compliant_with(
        "    context_lengths: [4096, 32768]",
        "    context_length: [4096, 32768]",
    ));
    let messages: Vec<String> = run.json()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["message"].to_string())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("did you mean `context_lengths`")),
        "{messages:?}"
    );
}

#[test]
fn a_misspelled_engine_names_the_field_and_the_closest_engine() {
    let run = lint_text(compliant_with(
        "    engine: vllm\n",
        "    engine: llama.cpp\n",
    ));
    assert_eq!(run.code, 1, "{}", run.stdout);
    let f = run.finding("schema-violation");
    let message = f["message"].as_str().unwrap();
    assert_eq!(f["pointer"], "/fidelity/runtime/engine");
    assert!(
        message.contains("`fidelity.runtime.engine` must be one of")
            && message.contains("did you mean `llama_cpp`?")
            && !message.contains("oneOf"),
        "{message}"
    );
}

#[test]
fn llama_cpp_same_top_p_is_a_known_metric() {
    let run = lint_text(compliant_with(
        "    - {metric: top1_agreement, value: 0.981, context_length: 4096}\n",
        "    - {metric: top1_agreement, value: 0.981, context_length: 4096}\n    - {metric: same_top_p, value: 98.12, context_length: 4096}\n",
    ));
    assert_eq!(run.code, 0, "{}", run.stdout);
    let run = lint_text(compliant_with(
        "    - {metric: top1_agreement, value: 0.981, context_length: 4096}\n",
        "    - {metric: same_top_p, value: 981.2, context_length: 4096}\n",
    ));
    assert_eq!(
        run.code, 1,
        "a percentage above 100 is invalid: {}",
        run.stdout
    );
    assert!(
        run.codes().contains(&"invalid-claim".to_owned()),
        "{}",
        run.stdout
    );
}

#[test]
fn prose_kld_numbers_in_the_forms_real_cards_use_are_undisclosed_claims() {
    for (prose, excerpt) in [
        (
            "| quant | \u{03BC}KLD |\n|---|---|\n| Q4_K_M | 0.0312 |\n",
            "0.0312",
        ),
        (
            "| quant | \u{1D707}KLD |\n|---|---|\n| Q4_K_M | 0.0312 |\n",
            "0.0312",
        ),
        (
            "| quant | \u{00B5}KLD |\n|---|---|\n| Q4_K_M | 0.0312 |\n",
            "0.0312",
        ),
        ("We get D_KL(P||Q) = 0.0123 on wikitext.\n", "0.0123"),
        ("eval: kl_div=0.0123\n", "0.0123"),
        ("KLD 99.9%: 0.563\n", "99.9th percentile KLD 0.563"),
    ] {
        let run = lint_text(format!("---\nlicense: mit\n---\n# Quant\n\n{prose}"));
        assert_eq!(run.code, 1, "{prose}: {}", run.stdout);
        let f = run.finding("undisclosed-kld-claim");
        let message = f["message"].as_str().unwrap();
        assert!(message.contains(excerpt), "{prose}: {message}");
    }
}

#[test]
fn a_card_without_fidelity_or_claims_gets_one_warning_and_exit_0() {
    let run = lint_text(
        "---\nlicense: apache-2.0\nlibrary_name: transformers\n---\n# Model\n\nA model.\n",
    );
    assert_eq!(run.code, 0);
    assert_eq!(run.codes(), ["no-fidelity-disclosure"]);
}

#[test]
fn a_card_without_front_matter_is_linted_without_metadata() {
    let run = lint_text("# Model\n\nNo metadata here.\n");
    assert_eq!(run.code, 0);
    assert_eq!(run.codes(), ["no-fidelity-disclosure"]);
    let run = lint_text("# Model\n\n| quant | KLD |\n|---|---|\n| Q4_K | 0.031 |\n");
    assert_eq!(run.code, 1);
    let f = run.finding("undisclosed-kld-claim");
    assert_eq!(
        (f["line"].as_u64(), f["column"].as_u64()),
        (Some(5), Some(10))
    );
}

#[test]
fn an_unterminated_front_matter_points_at_its_opening_marker() {
    let run = lint_text("\n---\nlicense: mit\nfidelity: {}\n");
    assert_eq!(run.code, 1);
    let f = run.finding("unterminated-front-matter");
    assert_eq!(
        (f["line"].as_u64(), f["column"].as_u64()),
        (Some(2), Some(1))
    );
}

#[test]
fn crlf_cards_lint_like_lf_cards() {
    let lf = compliant_with("engine_version: \"0.11.1\"", "engine_version: latest");
    let crlf = lf.replace('\n', "\r\n");
    let (a, b) = (lint_text(&lf), lint_text(&crlf));
    assert_eq!(a.code, b.code);
    assert_eq!(a.json()["findings"], b.json()["findings"]);
}

#[test]
fn extension_fields_are_allowed() {
    let run = lint_text(compliant_with(
        "  schema: cardproof/v1\n",
        "  schema: cardproof/v1\n  x-notes: measured twice\n",
    ));
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn the_compliant_example_is_clean() {
    let run = cardproof(&["lint", "examples/cards/compliant-fp8", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.codes(), Vec::<String>::new());
}

#[test]
fn json_output_has_the_documented_shape() {
    let run = cardproof(&["lint", "examples/cards/hub-pitfalls/README.md", "--json"]);
    let doc = run.json();
    assert_eq!(doc["schema_version"], 1);
    for f in doc["findings"].as_array().unwrap() {
        let keys: Vec<&str> = f.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "code", "severity", "message", "item", "pointer", "line", "column"
            ]
        );
    }
    // The document holds the findings; stderr does not repeat them (it does without --json).
    assert_eq!(run.stderr, "");
}

macro_rules! example_snapshot {
    ($name:ident, $dir:literal) => {
        #[test]
        fn $name() {
            let run = cardproof(&["lint", concat!("examples/cards/", $dir)]);
            assert!(run.stdout.is_empty(), "human output goes to stderr");
            insta::assert_snapshot!(concat!(stringify!($name), "_human"), run.transcript());
            let json = cardproof(&["lint", concat!("examples/cards/", $dir), "--json"]);
            let pretty = serde_json::to_string_pretty(&json.json()).unwrap();
            insta::assert_snapshot!(concat!(stringify!($name), "_json"), pretty);
        }
    };
}

example_snapshot!(example_compliant_fp8, "compliant-fp8");
example_snapshot!(example_undisclosed_gguf, "undisclosed-gguf");
example_snapshot!(example_vague_disclosure, "vague-disclosure");
example_snapshot!(example_hub_pitfalls, "hub-pitfalls");

#[test]
fn markdown_format_renders_a_table_on_stdout() {
    let run = cardproof(&[
        "lint",
        "examples/cards/vague-disclosure",
        "--format",
        "markdown",
    ]);
    assert_eq!(run.code, 1);
    insta::assert_snapshot!(run.stdout);
}

mod with_checkpoint {
    use crate::fixtures;
    use crate::support::*;

    /// A model directory: the mixed checkpoint plus a card describing it.
    fn model_dir(card: &str) -> tempfile::TempDir {
        let dir = card_dir(card);
        fixtures::mixed_fp8_nvfp4(dir.path());
        dir
    }

    fn card(high_precision: &str, group: &str, method: &str, activations: &str) -> String {
        compliant_card()
            .replace(
                "    high_precision_modules: [lm_head, \"model.embed_tokens\", \"model.layers.*.mlp.gate\"]\n",
                &format!("    high_precision_modules: {high_precision}\n"),
            )
            .replace("    group: [128, 128]\n", &format!("    group: {group}\n"))
            .replace("    method: fp8-block\n", &format!("    method: {method}\n"))
            .replace("    activations: dynamic-fp8\n", &format!("    activations: {activations}\n"))
    }

    #[test]
    fn a_card_that_matches_its_checkpoint_is_clean() {
        let dir = model_dir(&card(
            "[\"model.embed_tokens\"]",
            "16",
            "nvfp4",
            "static-fp8",
        ));
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
    }

    #[test]
    fn lm_head_said_bf16_but_quantized_is_an_error() {
        let dir = model_dir(&card("[lm_head]", "16", "nvfp4", "static-fp8"));
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        assert_eq!(run.code, 1);
        let f = run.finding("quantization-mismatch");
        assert_eq!(
            f["pointer"],
            "/fidelity/quantization/high_precision_modules/0"
        );
        assert!(
            f["message"].as_str().unwrap().contains("`lm_head` (nvfp4)"),
            "{f}"
        );
        assert!(f["line"].is_u64());
    }

    #[test]
    fn group_method_and_activation_mismatches_are_errors() {
        let dir = model_dir(&card(
            "[\"model.embed_tokens\"]",
            "128",
            "int4-awq",
            "dynamic-fp8",
        ));
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        assert_eq!(run.code, 1);
        let pointers: Vec<String> = run.json()["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["code"] == "quantization-mismatch")
            .map(|f| f["pointer"].as_str().unwrap().to_owned())
            .collect();
        let mut pointers = pointers;
        pointers.sort();
        assert_eq!(
            pointers,
            [
                "/fidelity/quantization/activations",
                "/fidelity/quantization/group",
                "/fidelity/quantization/method"
            ]
        );
    }

    /// `quantization.method: none` (weights left as they are: a KV-cache or runtime study) on an
    /// unquantized checkpoint used to be reported as a mismatch with itself.
    #[test]
    fn method_none_matches_an_unquantized_checkpoint_and_not_a_quantized_one() {
        let method_findings = |run: &Run| -> Vec<String> {
            run.json()["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| {
                    f["code"] == "quantization-mismatch"
                        && f["pointer"] == "/fidelity/quantization/method"
                })
                .map(|f| f["message"].as_str().unwrap().to_owned())
                .collect()
        };
        let none = compliant_with("    method: fp8-block\n", "    method: none\n");
        let dir = card_dir(&none);
        copy_model("shakespeare-bf16", dir.path());
        std::fs::write(dir.path().join("README.md"), &none).unwrap();
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        assert_eq!(
            method_findings(&run),
            Vec::<String>::new(),
            "{}",
            run.stdout
        );
        let dir = card_dir(&none);
        fixtures::fp8_block(dir.path());
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        let found = method_findings(&run);
        assert!(
            found.len() == 1
                && found[0].contains("the card says `none`, but the checkpoint holds quantized"),
            "{found:?}"
        );
    }

    #[test]
    fn weight_only_activations_on_a_dynamic_fp8_checkpoint_is_an_error() {
        let dir = card_dir(compliant_with(
            "    activations: dynamic-fp8\n",
            "    activations: none\n",
        ));
        fixtures::fp8_block(dir.path());
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        assert_eq!(run.code, 1, "{}", run.stdout);
        let f = run.finding("quantization-mismatch");
        assert_eq!(f["pointer"], "/fidelity/quantization/activations");
        let message = f["message"].as_str().unwrap();
        assert!(message.contains("fp8-dynamic"), "{message}");
        // The same checkpoint with its activations disclosed has no such finding.
        let dir = card_dir(compliant_card());
        fixtures::fp8_block(dir.path());
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        assert!(
            !run.json()["findings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["pointer"] == "/fidelity/quantization/activations"),
            "{}",
            run.stdout
        );
    }

    #[test]
    fn config_tensor_disagreements_become_lint_errors() {
        let dir = card_dir(compliant_card());
        fixtures::int4_pack_quantized(dir.path(), 64, 128, false);
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        assert_eq!(run.code, 1);
        let f = run.finding("config-tensor-mismatch");
        assert_eq!(f["severity"], "error");
    }

    #[test]
    fn a_malformed_checkpoint_next_to_the_card_is_exit_2() {
        let dir = card_dir(compliant_card());
        std::fs::write(dir.path().join("model.safetensors"), b"short").unwrap();
        let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
        assert_eq!(run.code, 2);
        assert!(
            run.json()["error"]["file"]
                .as_str()
                .unwrap()
                .ends_with("model.safetensors")
        );
    }
}

#[test]
fn lint_at_checks_a_model_directory_against_its_checkpoint() {
    // The library call behind `cardproof lint PATH`: a model directory's card is checked against
    // the checkpoint beside it, a card file alone is not.
    let dir = model("shakespeare-w8a16");
    let dir = std::path::Path::new(&dir);
    let card = cardproof::card::Card::open(dir).unwrap();
    let with = cardproof::lint::lint_at(&card, dir).unwrap();
    let inspections = cardproof::checkpoint::inspect::inspect_path(dir).unwrap();
    assert_eq!(
        with.findings,
        cardproof::lint::lint_with_checkpoint(&card, &inspections).findings
    );
    let alone = cardproof::lint::lint_at(&card, &dir.join("README.md")).unwrap();
    assert_eq!(alone.findings, cardproof::lint::lint(&card).findings);
}

#[test]
fn a_3bit_gptq_group_size_is_not_a_false_mismatch() {
    // A real 3-bit GPTQ upload (group size 128) was read as in = rows * 10 and its scales as
    // "group size 120": a false config-tensor-mismatch and exit 1.
    let dir = card_dir(compliant_card());
    crate::fixtures::gptq_bits(dir.path(), 3);
    let run = cardproof(&["lint", dir.path().to_str().unwrap(), "--json"]);
    let codes = run.codes();
    assert!(
        !codes.iter().any(|c| c == "config-tensor-mismatch"),
        "{codes:?}\n{}",
        run.stdout
    );
    // The checkpoint was read: the FP8 card disagrees with the GPTQ tensors.
    assert!(
        codes.iter().any(|c| c == "quantization-mismatch"),
        "{codes:?}"
    );
}

/// The card's `quantization.targets` (a mixed build's schemes and the modules each covers) against
/// a hybrid checkpoint quantized like the seed's NVFP4 build: FP8 over attention and the GDN
/// projections, NVFP4 over the MLP and lm_head.
mod mixed_targets {
    use crate::fixtures;
    use crate::support::*;

    fn card(targets: &str) -> String {
        compliant_card()
            .replace(
                "    high_precision_modules: [lm_head, \"model.embed_tokens\", \"model.layers.*.mlp.gate\"]\n",
                &format!(
                    "    high_precision_modules: [\"embed_tokens\", \"linear_attn.in_proj_a\", \"linear_attn.in_proj_b\", \"linear_attn.conv1d\", vision, mtp]\n    targets:\n{targets}"
                ),
            )
            .replace("    group: [128, 128]\n", "    group: 16\n")
            .replace("    method: fp8-block\n", "    method: nvfp4\n")
            .replace("    activations: dynamic-fp8\n", "    activations: static-fp8\n")
    }

    fn lint(targets: &str) -> Run {
        let text = card(targets);
        assert!(text.contains("    targets:\n"), "the card template changed");
        let dir = card_dir(&text);
        fixtures::hybrid_fp8_nvfp4(dir.path());
        cardproof_in(dir.path(), &["lint", ".", "--json"])
    }

    const STATED: &str = "      - {scheme: fp8, modules: [attention, linear_attention], count: 13}\n      - {scheme: nvfp4, modules: [mlp, lm_head], count: 13}\n";

    #[test]
    fn a_card_stating_the_seeds_fp8_nvfp4_mix_is_clean() {
        let run = lint(STATED);
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    }

    #[test]
    fn a_card_misstating_which_modules_are_fp8_is_flagged_at_its_line() {
        // FP8 said to cover attention and the MLP, NVFP4 the GDN projections: both wrong.
        let run = lint(
            "      - {scheme: fp8, modules: [attention, mlp], count: 13}\n      - {scheme: nvfp4, modules: [linear_attention, lm_head]}\n",
        );
        assert_eq!(run.code, 1, "{}", run.stdout);
        let text = card(
            "      - {scheme: fp8, modules: [attention, mlp], count: 13}\n      - {scheme: nvfp4, modules: [linear_attention, lm_head]}\n",
        );
        let line_of =
            |needle: &str| text.lines().position(|l| l.contains(needle)).unwrap() as u64 + 1;
        let findings: Vec<serde_json::Value> = run.json()["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["code"] == "quantization-mismatch")
            .cloned()
            .collect();
        let by_pointer = |p: &str| {
            findings
                .iter()
                .find(|f| f["pointer"] == p)
                .unwrap_or_else(|| panic!("no finding at {p}: {findings:?}"))
        };
        let fp8 = by_pointer("/fidelity/quantization/targets/0/modules");
        let message = fp8["message"].as_str().unwrap();
        assert!(
            message.contains("9 modules outside them are stored as fp8 (bucket linear_attention)")
                && message.contains("model.language_model.layers.0.linear_attn.in_proj_qkv"),
            "{message}"
        );
        assert_eq!(fp8["line"], line_of("scheme: fp8"));
        let count = by_pointer("/fidelity/quantization/targets/0/count");
        assert!(
            count["message"]
                .as_str()
                .unwrap()
                .contains("stores 4 there"),
            "{count}"
        );
        let nvfp4 = by_pointer("/fidelity/quantization/targets/1/modules");
        assert!(
            nvfp4["message"]
                .as_str()
                .unwrap()
                .contains("12 modules outside them are stored as nvfp4 (bucket mlp)"),
            "{nvfp4}"
        );
        assert_eq!(nvfp4["line"], line_of("scheme: nvfp4"));
        assert_eq!(findings.len(), 3, "{findings:?}");
    }

    #[test]
    fn a_wrong_count_or_an_absent_scheme_is_flagged() {
        let run = lint(
            "      - {scheme: fp8, modules: [attention, linear_attention], count: 208}\n      - {scheme: nvfp4, modules: [mlp, lm_head], count: 13}\n      - {scheme: int4-awq, modules: [moe_experts]}\n",
        );
        assert_eq!(run.code, 1, "{}", run.stdout);
        let pointers: Vec<String> = run.json()["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["code"] == "quantization-mismatch")
            .map(|f| f["pointer"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            pointers,
            [
                "/fidelity/quantization/targets/0/count",
                "/fidelity/quantization/targets/2/scheme"
            ],
            "{}",
            run.stdout
        );
    }

    #[test]
    fn mixed_targets_findings_read_as_text() {
        let text = card(
            "      - {scheme: fp8, modules: [attention, mlp], count: 13}\n      - {scheme: nvfp4, modules: [linear_attention, lm_head]}\n",
        );
        let dir = card_dir(&text);
        fixtures::hybrid_fp8_nvfp4(dir.path());
        let run = cardproof_in(dir.path(), &["lint", "."]);
        assert_eq!(run.code, 1);
        insta::assert_snapshot!(run.transcript());
    }
}

#[test]
fn a_recurrent_state_dtype_in_the_runtime_is_checked_against_the_dtypes_engines_keep() {
    // Accepted: cardproof's names and torch's spellings (as vLLM's and SGLang's flags take them).
    for good in ["f32", "bf16", "f16", "float32", "bfloat16", "torch.float16"] {
        let run = lint_text(compliant_with(
            "    kv_cache_dtype: bf16\n",
            &format!("    kv_cache_dtype: bf16\n    recurrent_state_dtype: {good}\n"),
        ));
        assert_eq!(run.code, 0, "{good}: {}", run.stdout);
        assert_eq!(run.codes(), Vec::<String>::new(), "{good}");
    }
    // Anything else is a schema violation at its own line.
    for bad in ["fp8", "auto", "float64", "BF16"] {
        let card = compliant_with(
            "    kv_cache_dtype: bf16\n",
            &format!("    kv_cache_dtype: bf16\n    recurrent_state_dtype: {bad}\n"),
        );
        let line = card
            .lines()
            .position(|l| l.contains("recurrent_state_dtype"))
            .unwrap()
            + 1;
        let run = lint_text(&card);
        assert_eq!(run.code, 1, "{bad}: {}", run.stdout);
        let f = run.finding("schema-violation");
        assert_eq!(
            f["pointer"], "/fidelity/runtime/recurrent_state_dtype",
            "{f}"
        );
        assert_eq!(f["line"], line as u64, "{f}");
        assert_eq!(f["severity"], "error", "{f}");
    }
}

/// Hooks and CI linted one path at a time and merged SARIF with jq: `lint` takes several paths,
/// one summary and one SARIF log for all; `--json` stays one card's document.
#[test]
fn several_cards_lint_as_one_run_with_one_sarif_log() {
    let (clean, undisclosed) = (
        "examples/cards/compliant-fp8",
        "examples/cards/undisclosed-gguf",
    );
    let both = cardproof(&["lint", clean, undisclosed]);
    assert_eq!(both.code, 1, "{}", both.stderr);
    assert!(both.stderr.contains("2 cards: 2 errors"), "{}", both.stderr);
    let sarif = cardproof(&["lint", clean, undisclosed, "--format", "sarif"]);
    assert_eq!(sarif.code, 1, "{}", sarif.stderr);
    let log = sarif.json();
    let runs = log["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let uris: std::collections::BTreeSet<String> = runs[0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(uris.iter().all(|u| u.starts_with(undisclosed)), "{uris:?}");
    let json = cardproof(&["lint", clean, undisclosed, "--json"]);
    assert_eq!(json.code, 2, "{}", json.stdout);
    assert!(json.stdout.contains("--format sarif"), "{}", json.stdout);
}

/// Rule selection: `--ignore CODE` and `lint.ignore` in the working directory's
/// `.cardproof.yaml`, never a settings file inside the linted directory (a repository could
/// silence the rules about its own card).
#[test]
fn ignored_codes_come_from_the_user_never_from_the_linted_directory() {
    let card = "examples/cards/undisclosed-gguf";
    let ignored = cardproof(&["lint", card, "--ignore", "undisclosed-kld-claim"]);
    assert_eq!(ignored.code, 0, "{}", ignored.stderr);
    assert!(
        ignored.stderr.contains("2 findings left out"),
        "{}",
        ignored.stderr
    );
    let unknown = cardproof(&["lint", card, "--ignore", "no-such-code"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert!(
        unknown
            .stderr
            .contains("`no-such-code` is not a finding code"),
        "{}",
        unknown.stderr
    );

    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("card");
    crate::support::copy_dir(&repo_root().join(card), &copy);
    std::fs::write(
        copy.join(".cardproof.yaml"),
        "lint:\n  ignore: [undisclosed-kld-claim]\n",
    )
    .unwrap();
    let in_card_dir = Cmd::new("lint").path(&copy).in_dir(repo_root()).run();
    assert_eq!(in_card_dir.code, 1, "{}", in_card_dir.stderr);
    let in_cwd = Cmd::new("lint").path(&copy).in_dir(&copy).run();
    assert_eq!(in_cwd.code, 0, "{}", in_cwd.stderr);
}

/// The pre-commit hook matched every README.md, and this repository's own README failed it with
/// KLD numbers in its prose: `--model-cards` skips a file that is not a model card (no front
/// matter, no config.json or weights beside it) and still lints the cards.
#[test]
fn model_cards_only_skips_a_readme_that_is_not_a_model_card() {
    let r = cardproof(&[
        "lint",
        "--model-cards",
        "README.md",
        "examples/cards/undisclosed-gguf/README.md",
    ]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("README.md: not a model card"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("undisclosed-kld-claim"), "{}", r.stderr);
    let own = cardproof(&["lint", "--model-cards", "README.md"]);
    assert_eq!(own.code, 0, "{}", own.stderr);
}

/// exllamav3 cards print both KL directions as table columns, `KL-div (q→o)` and
/// `KL-div (o→q)`: lint reads each column's numbers as KLD claims (here undisclosed: no
/// `fidelity:` block), the arrow kept in the excerpt it names.
#[test]
fn exllamav3_kl_div_columns_in_both_directions_are_read_as_claims() {
    let dir = tempfile::tempdir().unwrap();
    let card = dir.path().join("README.md");
    std::fs::write(
        &card,
        "---\nlicense: apache-2.0\nbase_model: Qwen/Qwen3-8B\n---\n# Qwen3-8B exl3\n\n\
         | bpw | PPL | KL-div (q→o) | KL-div (o→q) | Top-1 |\n|---|---|---|---|---|\n\
         | 4.0 | 9.12 | 0.0231 | 0.0245 | 0.912 |\n",
    )
    .unwrap();
    let r = cardproof(&["lint", card.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    let messages: Vec<String> = r.json()["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "undisclosed-kld-claim")
        .map(|f| f["message"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("KL-div (q→o) 0.0231")),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("KL-div (o→q) 0.0245")),
        "{messages:?}"
    );
}

/// A card listing files is linted entry by entry as the card of each file: the compliant card
/// moved into one entry is as clean, and a finding inside an entry points at it and names its
/// file.
#[test]
fn a_card_listing_files_lints_each_entry_as_the_card_of_one_file() {
    let dir = card_dir(files_card("m-Q4_K_M.gguf"));
    let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    let broken = files_card("m-Q4_K_M.gguf").replacen("{metric: kld_p99,", "{metric: kld_99th,", 1);
    let dir = card_dir(&broken);
    let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    let f = run.finding("unknown-metric");
    assert_eq!(f["pointer"], "/fidelity/files/0/results/1/metric");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .starts_with("files[0] `m-Q4_K_M.gguf`: "),
        "{f}"
    );
    // Top-level claims beside `files` are refused: each file's entry has its own.
    let both = files_card("m.gguf").replacen("  files:\n", "  results: []\n  files:\n", 1);
    let dir = card_dir(&both);
    let run = cardproof_in(dir.path(), &["lint", ".", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert_eq!(
        run.finding("schema-violation")["pointer"],
        "/fidelity/results"
    );
}
