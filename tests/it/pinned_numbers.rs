//! Numbers that cannot drift unnoticed: the examples' outputs are digested and compared with
//! `tests/fixtures/pinned/<case>.sha256`, so that neither a refactor nor another machine moves a
//! bit without a test saying so.
//!
//! Each case runs the binary from the repository root on committed inputs and digests what it
//! writes: `positions.safetensors` and logit dumps as bytes, JSON documents after
//! [`normalized`] (which drops only what names the run or the machine: run ids, the device, the
//! thread count, output-set manifests, timings, and the repository's and output's absolute paths). The
//! native lane gives the same bits on every machine, so these digests are the same everywhere.
//!
//! `CARDPROOF_BLESS=1 cargo test --test it pinned_numbers` rewrites the files; a change to them
//! in a commit is a change of the numbers and must say why.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::support::{cardproof, cardproof_with, repo_root};

/// JSON keys whose values name the run or the machine, not the measurement.
const VOLATILE_KEYS: [&str; 6] = [
    "run_id",
    "device",
    "threads",
    "set_files",
    "seconds",
    "timings",
];

/// A JSON document with what names the run or the machine removed (see the module comment), as
/// compact text.
fn normalized(text: &str, out: &Path) -> String {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                for key in VOLATILE_KEYS {
                    map.remove(key);
                }
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value: serde_json::Value = serde_json::from_str(text).expect("a JSON document");
    strip(&mut value);
    value
        .to_string()
        .replace(out.to_str().unwrap(), "$OUT")
        .replace(repo_root().to_str().unwrap(), "$REPO")
}

/// The digest of every file under `dir` whose name ends in one of `suffixes`, by path relative
/// to `dir`.
fn digests(dir: &Path, suffixes: &[&str]) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, suffixes: &[&str], into: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, suffixes, into);
                continue;
            }
            let name = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            if !suffixes.iter().any(|s| name.ends_with(s)) {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let bytes = if name.ends_with(".json") {
                normalized(std::str::from_utf8(&bytes).unwrap(), root).into_bytes()
            } else {
                bytes
            };
            into.insert(name, cardproof::digest::hex(&Sha256::digest(&bytes)));
        }
    }
    let mut into = BTreeMap::new();
    walk(dir, dir, suffixes, &mut into);
    assert!(
        !into.is_empty(),
        "{} holds no file to digest",
        dir.display()
    );
    into
}

/// Compare `found` with the committed `tests/fixtures/pinned/<case>.sha256` (or write it under
/// `CARDPROOF_BLESS=1`).
fn check_pinned(case: &str, found: &BTreeMap<String, String>) {
    let path = repo_root().join(format!("tests/fixtures/pinned/{case}.sha256"));
    let text: String = found
        .iter()
        .map(|(name, digest)| format!("{digest}  {name}\n"))
        .collect();
    if std::env::var_os("CARDPROOF_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let committed: BTreeMap<&str, &str> = committed
        .lines()
        .filter_map(|l| l.split_once("  ").map(|(d, n)| (n, d)))
        .collect();
    let moved: Vec<String> = found
        .iter()
        .filter(|(name, digest)| committed.get(name.as_str()) != Some(&digest.as_str()))
        .map(|(name, _)| name.clone())
        .chain(
            committed
                .keys()
                .filter(|n| !found.contains_key(**n))
                .map(|n| format!("{n} (missing)")),
        )
        .collect();
    assert!(
        moved.is_empty(),
        "{case}: the numbers moved in {moved:?} (tests/fixtures/pinned/{case}.sha256); if the \
         change is intended, rerun with CARDPROOF_BLESS=1 and say why in the commit"
    );
}

/// Run `args` (paths relative to the repository root, `$OUT` for the output directory) and pin
/// the files it writes there; returns the run.
fn pin(case: &str, args: &[&str], suffixes: &[&str]) -> crate::support::Run {
    pin_in(case, args, suffixes).0
}

/// [`pin`], keeping the output directory for the caller to read.
fn pin_in(
    case: &str,
    args: &[&str],
    suffixes: &[&str],
) -> (crate::support::Run, tempfile::TempDir) {
    let out = tempfile::tempdir().unwrap();
    let out_str = out.path().to_str().unwrap().to_owned();
    let args: Vec<String> = args.iter().map(|a| a.replace("$OUT", &out_str)).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let config = tempfile::tempdir().unwrap();
    let run = if args[0] == "verify" {
        cardproof_with(
            &repo_root(),
            &[("CARDPROOF_CONFIG_DIR", config.path())],
            &args,
        )
    } else {
        cardproof(&args)
    };
    assert!(run.code == 0, "{case}: exit {}\n{}", run.code, run.stderr);
    check_pinned(case, &digests(out.path(), suffixes));
    (run, out)
}

const MEASUREMENT: [&str; 2] = ["positions.safetensors", "measurement.json"];

/// The seed study: four weight arms, two KV-cache arms and both controls against the bf16
/// example, plus the study document's comparisons; the guide's table of arms is the one the
/// study prints (less the seconds column), so it is never typed by hand.
#[test]
fn the_example_study_arms_keep_their_numbers() {
    let run = pin(
        "study-shakespeare",
        &[
            "study",
            "examples/studies/shakespeare.yaml",
            "--out",
            "$OUT/s",
        ],
        &["positions.safetensors", "measurement.json", "study.json"],
    );
    check_readme_study_table(&run.stdout);
}

/// The guide's block of arms (the lines after its header line, up to the closing fence) must be
/// the study's printed table without its last column, `seconds`.
fn check_readme_study_table(printed: &str) {
    let table: Vec<String> = printed
        .lines()
        .skip_while(|l| !l.starts_with("arm "))
        .take_while(|l| !l.is_empty())
        .map(|l| {
            let cut = l.trim_end().rfind(' ').expect("a column to cut");
            l[..cut].trim_end().to_owned()
        })
        .collect();
    check_readme_block(&table, printed, "shakespeare");
}

/// One test at a time reads and rewrites docs/guide.md (tests run in parallel; a blessing must
/// not lose another's).
static GUIDE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The guide's (docs/guide.md) lines from `lines[0]` up to `end` (a closing fence, or the blank
/// line after a Markdown table) are `lines`; `CARDPROOF_BLESS=1` writes them.
fn check_guide_lines(lines: &[String], end: &str, what: &str) {
    assert!(lines.len() > 1, "{what} printed nothing to compare");
    let _one_writer = GUIDE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = repo_root().join("docs/guide.md");
    let guide = std::fs::read_to_string(&path).unwrap();
    let header = lines[0].split(" (").next().unwrap_or(&lines[0]);
    let start = guide
        .find(&format!("\n{header}"))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("docs/guide.md holds no line starting `{header}` ({what})"));
    let stop = start + guide[start..].find(end).expect("the block's end") + 1;
    let want = format!("{}\n", lines.join("\n"));
    if std::env::var_os("CARDPROOF_BLESS").is_some() {
        std::fs::write(
            &path,
            format!("{}{want}{}", &guide[..start], &guide[stop..]),
        )
        .unwrap();
        return;
    }
    assert_eq!(
        guide[start..stop],
        want,
        "docs/guide.md's block is not what {what} gives; rerun with CARDPROOF_BLESS=1"
    );
}

/// The guide's (docs/guide.md) copy of `table` (from its header line up to the closing fence) is `table`.
fn check_readme_block(table: &[String], printed: &str, study: &str) {
    assert!(table.len() > 1, "the study printed no table:\n{printed}");
    check_guide_lines(
        table,
        "\n```",
        &format!("`cardproof study examples/studies/{study}.yaml` prints"),
    );
}

/// The tool-calling study: five weight arms and four KV caches against the stage-manager model,
/// every tool-calling turn of its six held-out conversations generated by each; the guide's
/// table of turns is the one the study prints. Which arms break calls, and which recover, is
/// asserted besides the digests: the 4-bit-and-up weights and llama.cpp's KV caches hold every
/// call, ExLlamaV3's 3-bit cache breaks one, its 2-bit cache breaks calls it recovers from and
/// calls it does not, and 2-bit weights break every call.
#[test]
#[ignore = "the whole tool-calling study (11 models, 36 generated turns each): ~7 minutes in a \
            debug build; .ci/run runs it"]
fn the_tool_calling_study_shows_which_arms_break_calls_and_which_recover() {
    let run = pin(
        "study-stagehand",
        &[
            "study",
            "examples/studies/stagehand.yaml",
            "--out",
            "$OUT/s",
        ],
        &["measurement.json", "study.json"],
    );
    let table: Vec<String> = run
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("== turns generated"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.trim_end().to_owned())
        .collect();
    // arm, turns, turn_match, tool_call_match, its interval (two words), tool_call_valid,
    // tool_call_f1, failures, recovered, unrecovered.
    let arm = |name: &str| -> Vec<String> {
        table
            .iter()
            .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .find(|w| w[0] == name)
            .unwrap_or_else(|| panic!("arm {name} in\n{}", run.stdout))
    };
    let count = |w: &[String], from_end: usize| -> u64 { w[w.len() - from_end].parse().unwrap() };
    for holds in [
        "w8a16",
        "fp8-block",
        "awq-int4",
        "q4_0-gguf",
        "kv-q8_0",
        "kv-q4_0",
        "control-repeat",
    ] {
        assert_eq!(
            count(&arm(holds), 3),
            0,
            "{holds} fails a turn:\n{}",
            run.stdout
        );
    }
    assert!(count(&arm("kv-exl3_q3"), 3) > 0, "{}", run.stdout);
    let q2 = arm("kv-exl3_q2");
    assert!(count(&q2, 2) > 0 && count(&q2, 1) > 0, "{}", run.stdout);
    assert_eq!(arm("q2_0-gguf")[3], "0.000", "{}", run.stdout);
    check_readme_block(&table, &run.stdout, "stagehand");
}

/// The README's main job: `verify` of the fp8-block example card.
#[test]
fn the_readme_verify_keeps_its_numbers() {
    pin(
        "verify-fp8-block",
        &[
            "verify",
            "examples/models/shakespeare-fp8-block",
            "--reference",
            "examples/models/shakespeare-bf16",
            "--eval-text",
            "examples/data/eval.txt",
            "--out",
            "$OUT/r",
        ],
        &["positions.safetensors"],
    );
}

/// The GGUF bf16 example (the pair the study has no arm for).
#[test]
fn the_bf16_gguf_pair_keeps_its_numbers() {
    pin(
        "measure-bf16-gguf",
        &[
            "measure",
            "--reference",
            "examples/models/shakespeare-bf16",
            "--candidate",
            "examples/models/shakespeare-bf16-gguf",
            "--eval-text",
            "examples/data/eval.txt",
            "--context-length",
            "256",
            "--out",
            "$OUT/m",
        ],
        &MEASUREMENT,
    );
}

/// Both hybrid (Gated DeltaNet) example pairs.
#[test]
fn the_hybrid_example_pairs_keep_their_numbers() {
    for candidate in ["w8a16", "fp8-block"] {
        pin(
            &format!("measure-hybrid-{candidate}"),
            &[
                "measure",
                "--reference",
                "examples/models/shakespeare-hybrid-bf16",
                "--candidate",
                &format!("examples/models/shakespeare-hybrid-{candidate}"),
                "--eval-text",
                "examples/data/eval.txt",
                "--context-length",
                "256",
                "--out",
                "$OUT/m",
            ],
            &MEASUREMENT,
        );
    }
}

/// The guide's conversation example (a tool-calling conversation rendered by the chat template)
/// and its table of how far each quantization moves the tokens inside tool calls against the
/// rest: the FP8 run is pinned and its `by span` block is the guide's; the table is regenerated
/// from each candidate's measurement (the tool-call spans' rows, mean KLD and top-1 flips), so
/// none of its numbers is typed by hand.
#[test]
fn the_conversation_example_keeps_its_numbers_and_the_guides_tables() {
    const CONVERSATION: [&str; 8] = [
        "--reference",
        "examples/models/shakespeare-bf16",
        "--eval-text",
        "examples/data/tool-conversation.json",
        "--chat-template",
        "examples/data/chat_template.jinja",
        "--context-length",
        "512",
    ];
    let candidates: [(&str, &[&str]); 6] = [
        (
            "W8A16",
            &["--candidate", "examples/models/shakespeare-w8a16"],
        ),
        (
            "FP8 block",
            &["--candidate", "examples/models/shakespeare-fp8-block"],
        ),
        (
            "GGUF Q4_0",
            &["--candidate", "examples/models/shakespeare-q4_0-gguf"],
        ),
        (
            "AWQ int4",
            &["--candidate", "examples/models/shakespeare-awq-int4"],
        ),
        (
            "bf16 with a q8_0 KV cache",
            &[
                "--candidate",
                "examples/models/shakespeare-bf16",
                "--kv-cache",
                "q8_0",
            ],
        ),
        (
            "bf16 with a q4_0 KV cache",
            &[
                "--candidate",
                "examples/models/shakespeare-bf16",
                "--kv-cache",
                "q4_0",
            ],
        ),
    ];
    let mut rows = Vec::new();
    let mut sizes = (0, 0);
    for (label, candidate) in candidates {
        let mut args = vec!["measure"];
        args.extend(CONVERSATION);
        args.extend(candidate);
        args.extend(["--out", "$OUT/m"]);
        let (r, out) = if label == "FP8 block" {
            pin_in("measure-conversation", &args, &MEASUREMENT)
        } else {
            let out = tempfile::tempdir().unwrap();
            let out_arg = out.path().join("m");
            *args.last_mut().unwrap() = out_arg.to_str().unwrap();
            let r = cardproof(&args);
            assert_eq!(r.code, 0, "{label}: {}", r.stderr);
            (r, out)
        };
        if label == "FP8 block" {
            let block: Vec<String> = r
                .stdout
                .lines()
                .skip_while(|l| !l.starts_with("by span"))
                .take_while(|l| !l.is_empty())
                .map(str::to_owned)
                .collect();
            check_guide_lines(&block, "\n```", "the FP8 candidate's `by span` table");
        }
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.path().join("m/measurement.json")).unwrap())
                .unwrap();
        let run = &m["runs"][0];
        let span = |name: &str| {
            let s = run["spans"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["by"] == "tool_call" && s["name"] == name)
                .unwrap_or_else(|| panic!("{label}: no tool_call {name} span"));
            (
                s["n_positions"].as_u64().unwrap(),
                s["top1_flips"].as_u64().unwrap(),
                s["metrics"]["kld_mean"].as_f64().unwrap(),
            )
        };
        let (n_in, flips_in, in_mean) = span("inside");
        let (n_out, flips_out, out_mean) = span("outside");
        sizes = (n_in, n_out);
        rows.push(format!(
            "| {label} | {} | {} | {} | {:.2} | {:.1}% | {:.1}% |",
            sig3(run["metrics"]["kld_mean"].as_f64().unwrap()),
            sig3(in_mean),
            sig3(out_mean),
            in_mean / out_mean,
            100.0 * flips_in as f64 / n_in as f64,
            100.0 * flips_out as f64 / n_out as f64,
        ));
    }
    let mut table = vec![
        format!(
            "| candidate | kld_mean, all rows | inside tool calls ({} rows) | outside ({}) | ratio | flip rate inside | outside |",
            grouped(sizes.0),
            grouped(sizes.1)
        ),
        "|---|---:|---:|---:|---:|---:|---:|".to_owned(),
    ];
    table.extend(rows);
    check_guide_lines(
        &table,
        "\n\n",
        "measure --json of each candidate on the example conversation",
    );
}

/// The guide's table of KV-cache schemes on the bf16 example against itself, regenerated from the
/// sweep it names (`measure --sweep kv_cache=...`, each scheme's pair against `none`).
#[test]
fn the_guides_kv_cache_table_is_what_the_sweep_measures() {
    let out = tempfile::tempdir().unwrap();
    let r = cardproof(&[
        "measure",
        "--reference",
        "examples/models/shakespeare-bf16",
        "--candidate",
        "examples/models/shakespeare-bf16",
        "--eval-text",
        "examples/data/eval.txt",
        "--context-length",
        "256",
        "--sweep",
        "kv_cache=none,q8_0,q5_1,iq4_nl,q4_0,exl3_q8,exl3_q4,exl3_q2",
        "--out",
        out.path().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let sweep = r.json();
    let mut table = vec![
        "| scheme | rows | kld_mean | kld_p99 | top-1 agreement |".to_owned(),
        "|---|---:|---:|---:|---:|".to_owned(),
    ];
    for pair in sweep["pairs"].as_array().unwrap() {
        let run = &pair["runs"][0];
        let f = |key: &str| run[key].as_f64().unwrap();
        table.push(format!(
            "| {} | {} | {} | {} | {} |",
            pair["other"].as_str().unwrap(),
            grouped(run["n_positions"].as_u64().unwrap()),
            sig3(f("kld_mean")),
            sig3(f("kld_p99")),
            sig3(f("top1_agreement")),
        ));
    }
    check_guide_lines(
        &table,
        "\n\n",
        "measure --sweep kv_cache=... on the bf16 example",
    );
}

/// Three significant digits, trailing zeros dropped, as the guide's tables print them.
fn sig3(x: f64) -> String {
    if x == 0.0 {
        return "0".to_owned();
    }
    let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{x:.digits$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// `11033` -> `11,033`.
fn grouped(n: u64) -> String {
    let d = n.to_string();
    d.chars()
        .enumerate()
        .flat_map(|(i, c)| {
            let comma = i > 0 && (d.len() - i).is_multiple_of(3);
            comma.then_some(',').into_iter().chain([c])
        })
        .collect()
}

/// The tiny hybrid and mixture-of-experts models' forward passes, as logit dumps (each model
/// against itself, so the dump is the forward pass's bits).
#[test]
fn the_tiny_hybrid_and_moe_models_keep_their_logits() {
    for (case, model, eval) in [
        (
            "dump-qwen3-moe",
            "tests/fixtures/moe/qwen3-moe",
            "tests/fixtures/moe/qwen3-moe/eval.txt",
        ),
        (
            "dump-qwen3_5-moe-text",
            "tests/fixtures/hybrid_moe/qwen3_5_moe_text",
            "tests/fixtures/hybrid/eval.txt",
        ),
        (
            "dump-qwen3-next-moe",
            "tests/fixtures/hybrid_moe/qwen3_next_moe",
            "tests/fixtures/hybrid/eval.txt",
        ),
        (
            "dump-qwen3_5-text",
            "tests/fixtures/hybrid/qwen3_5_text",
            "tests/fixtures/hybrid/eval.txt",
        ),
    ] {
        pin(
            case,
            &[
                "measure",
                "--reference",
                model,
                "--candidate",
                model,
                "--eval-text",
                eval,
                "--context-length",
                "32",
                "--bos",
                "none",
                "--bootstrap",
                "10",
                "--out",
                "$OUT/m",
                "--dump-logits",
                "$OUT/dump",
            ],
            &[
                "reference.logits.safetensors",
                "candidate.logits.safetensors",
            ],
        );
    }
}
