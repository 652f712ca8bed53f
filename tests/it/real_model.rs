//! The real model (issue #42): SmolLM2-135M-Instruct, its exact F32 dequantization and eleven
//! llama-quantize candidates, as runners/llamacpp/real_model.sh makes them (named by
//! CARDPROOF_REAL_MODEL), with llama.cpp's llama-perplexity (CARDPROOF_LLAMACPP_BIN). Ignored by
//! `cargo test`; `.ci/run` runs them with `--ignored`, where a missing model or binary fails them.
//!
//! The lanes are compared on the first windows of the example eval text (`TEXT_BYTES`): enough
//! rows for llama.cpp to print its statistics, few enough for a debug build in CI. The closing
//! numbers on the whole text are in docs/benchmarks.md ("Real weights").

use std::path::{Path, PathBuf};

use cardproof::runner::native::Emulate;
use cardproof::runner::native::gguf::GgufStore;
use cardproof::runner::native::weights::WeightStore;

use crate::support::{Cmd, Run, cardproof, repo_root};

/// Every candidate the script makes, and the shipped file.
const TYPES: [&str; 12] = [
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q4_K_M",
    "Q4_0",
    "Q4_1-shipped",
    "Q3_K_M",
    "Q2_K",
    "IQ4_XS",
    "IQ4_NL",
    "IQ3_M",
    "IQ2_M",
];
/// The eval text's first bytes the lanes are compared on: two windows of 512 tokens (510 scored
/// rows; llama-perplexity needs two windows' tokens), so that the debug build CI runs gets
/// through every type in both flash-attention modes.
const TEXT_BYTES: usize = 4096;
const REASON: &str = "needs the real model and llama.cpp (CARDPROOF_REAL_MODEL from runners/llamacpp/real_model.sh, CARDPROOF_LLAMACPP_BIN; .ci/run sets both)";

fn real_model() -> PathBuf {
    PathBuf::from(std::env::var("CARDPROOF_REAL_MODEL").expect(REASON))
}

fn llamacpp_bin() -> String {
    std::env::var("CARDPROOF_LLAMACPP_BIN").expect(REASON)
}

/// The eval text's first [`TEXT_BYTES`], cut at a line end, in `dir`.
fn text(dir: &Path) -> PathBuf {
    let full = std::fs::read_to_string(repo_root().join("examples/data/eval.txt")).unwrap();
    let cut = full[..TEXT_BYTES].rfind('\n').unwrap() + 1;
    let path = dir.join("eval.txt");
    std::fs::write(&path, &full[..cut]).unwrap();
    path
}

fn measurement(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("measurement.json")).unwrap()).unwrap()
}

/// `measure` of candidate `ty` against the reference in llama.cpp's protocol (windows of 512,
/// the second half scored, forward KL over the reference's entries above e^-16), with `lane`'s
/// flags.
fn measure(ty: &str, text: &Path, out: &Path, lane: &[&str]) -> Run {
    measure_candidate(&real_model().join(ty), text, out, lane)
}

/// [`measure`] of any candidate path (a copy beside its card).
fn measure_candidate(candidate: &Path, text: &Path, out: &Path, lane: &[&str]) -> Run {
    Cmd::measure()
        .reference(real_model().join("reference"))
        .candidate(candidate)
        .eval_text(text)
        .context_length(512)
        .args(["--positions", "second-half", "--direction", "forward"])
        .args(["--vocab", "threshold", "--bos", "none", "--threads", "2"])
        .out(out)
        .arg("--force")
        .args(lane)
        .run()
}

/// The shipped Q4_1 file dequantized by the native runner is the reference, bit for bit: the
/// reference is the shipped model's exact dequantization (llama-quantize's F32 conversion).
#[test]
#[ignore = "needs the real model (CARDPROOF_REAL_MODEL; .ci/run sets it)"]
fn the_reference_is_the_shipped_files_exact_dequantization() {
    let root = real_model();
    let (shipped, config) = GgufStore::open(
        &root.join("Q4_1-shipped/model.gguf"),
        Emulate::ReferenceSemantics,
    )
    .unwrap();
    let (reference, _) = GgufStore::open(
        &root.join("reference/model.gguf"),
        Emulate::ReferenceSemantics,
    )
    .unwrap();
    let mut names = vec![
        "model.embed_tokens.weight".to_owned(),
        "model.norm.weight".into(),
    ];
    for l in 0..config.layers {
        for m in [
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ] {
            names.push(format!("model.layers.{l}.{m}.weight"));
        }
        names.push(format!("model.layers.{l}.input_layernorm.weight"));
        names.push(format!("model.layers.{l}.post_attention_layernorm.weight"));
    }
    for name in &names {
        let (a, b) = (shipped.dense(name).unwrap(), reference.dense(name).unwrap());
        assert_eq!(a.shape, b.shape, "{name}");
        let first = a
            .data
            .iter()
            .zip(&b.data)
            .position(|(x, y)| x.to_bits() != y.to_bits());
        assert!(first.is_none(), "{name}: element {first:?} differs");
    }
    assert_eq!(names.len(), 2 + 9 * config.layers);
}

/// One type through the llama.cpp runner and the emulation lane, flash attention on (llama.cpp's
/// CPU default; `--emulate llamacpp-cpu`) and off (`-fa off`; `--emulate llamacpp-cpu-no-fa`):
/// the printout gate passes (no real model is refused), and each emulation lies within two of
/// llama.cpp's printed standard errors of its printout.
fn lanes_agree(ty: &str, dir: &Path, text: &Path) -> String {
    let bin = llamacpp_bin();
    let mut line = format!("{ty}:");
    for (fa, emulate) in [("on", "llamacpp-cpu"), ("off", "llamacpp-cpu-no-fa")] {
        let out = dir.join(format!("{ty}-llamacpp-{fa}"));
        let r = measure(
            ty,
            text,
            &out,
            &[
                "--runner",
                "llamacpp",
                "--llamacpp-bin",
                &bin,
                "--llamacpp-flash-attn",
                fa,
            ],
        );
        assert_eq!(r.code, 0, "{ty} fa {fa}: {}", r.transcript());
        let gate = measurement(&out)["environment"]["llamacpp"]["gate"].clone();
        let (printed, se, ours) = (
            gate["printed_kld_mean"].as_f64().unwrap(),
            gate["printed_kld_mean_se"].as_f64().unwrap(),
            gate["cardproof_kld_mean"].as_f64().unwrap(),
        );
        assert!(se > 0.0, "{ty}: {gate}");
        let out = dir.join(format!("{ty}-{emulate}"));
        let r = measure(ty, text, &out, &["--emulate", emulate]);
        assert_eq!(r.code, 0, "{ty} {emulate}: {}", r.transcript());
        let emulated = measurement(&out)["runs"][0]["metrics"]["kld_mean"]
            .as_f64()
            .unwrap();
        let z = (emulated - printed) / se;
        line += &format!(
            " fa {fa}: llama.cpp {printed:.5} ± {se:.5}, runner {ours:.6}, {emulate} {emulated:.6} (z {z:+.2});"
        );
        assert!(z.abs() <= 2.0, "{line}");
    }
    line
}

#[test]
#[ignore = "needs the real model and llama.cpp (CARDPROOF_REAL_MODEL, CARDPROOF_LLAMACPP_BIN; .ci/run sets both)"]
#[allow(clippy::print_stderr)] // the agreement, for the CI log
fn every_lane_agrees_with_llamacpp_on_every_quant_type() {
    let dir = tempfile::tempdir().unwrap();
    let text = text(dir.path());
    // CARDPROOF_REAL_MODEL_TYPES=Q8_0,Q4_K_M runs only those (a local rerun of one failure).
    let only = std::env::var("CARDPROOF_REAL_MODEL_TYPES").ok();
    let lines: Vec<String> = TYPES
        .iter()
        .filter(|ty| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|t| t == **ty))
        })
        .map(|ty| lanes_agree(ty, dir.path(), &text))
        .collect();
    assert!(
        !lines.is_empty(),
        "CARDPROOF_REAL_MODEL_TYPES names none of {TYPES:?}"
    );
    eprintln!("{}", lines.join("\n"));
}

/// A doctored printout on real rows is still refused: llama.cpp's running mean KLD raised by 2%
/// on the real Q4_K_M (whose candidate window clamps real entries).
#[test]
#[ignore = "needs the real model and llama.cpp (CARDPROOF_REAL_MODEL, CARDPROOF_LLAMACPP_BIN; .ci/run sets both)"]
fn a_doctored_printout_on_the_real_model_fails_the_gate() {
    let bin = llamacpp_bin();
    let dir = tempfile::tempdir().unwrap();
    let text = text(dir.path());
    let liar = crate::llamacpp::raised_printout(dir.path(), &bin, 1.02);
    let out = dir.path().join("m");
    let r = measure(
        "Q4_K_M",
        &text,
        &out,
        &[
            "--runner",
            "llamacpp",
            "--llamacpp-bin",
            liar.to_str().unwrap(),
        ],
    );
    assert_ne!(r.code, 0, "{}", r.transcript());
    let m = r.message();
    assert!(m.contains("printout gate") && m.contains("mean KLD"), "{m}");
    assert!(!out.join("measurement.json").exists());
}

/// A copy of candidate `ty`'s GGUF (and its tokenizer) in `dir`: a card is written beside it,
/// never into the cache.
fn candidate_copy(ty: &str, dir: &Path) -> PathBuf {
    let to = dir.join(ty);
    std::fs::create_dir_all(&to).unwrap();
    for f in ["model.gguf", "tokenizer.json"] {
        std::fs::copy(real_model().join(ty).join(f), to.join(f)).unwrap();
    }
    to.join("model.gguf")
}

/// `card` from a measurement into the README.md beside `file`, with the identity a measurement
/// cannot know given as flags.
fn write_card(measurement: &Path, file: &Path, ty: &str) {
    let r = cardproof(&[
        "card",
        "--measurement",
        measurement.join("measurement.json").to_str().unwrap(),
        "--reference-repo",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "--reference-revision",
        "0000000000000000000000000000000000000000",
        "--candidate-repo",
        &format!("cardproof/SmolLM2-135M-Instruct-{ty}-GGUF"),
        "--quantization",
        &ty.to_lowercase(),
        "--calibration",
        "none",
    ]);
    assert_eq!(r.code, 0, "{ty} card: {}", r.stderr);
    let card = std::fs::read_to_string(file.with_file_name("README.md")).unwrap();
    assert!(card.contains("file: model.gguf"), "{ty}: {card}");
}

/// `verify --json` of `target` against the reference, in the native lane (reference semantics)
/// or with `lane`'s flags.
fn verify_in(target: &Path, text: &Path, out: &Path, lane: &[&str]) -> Run {
    Cmd::verify(target)
        .reference(real_model().join("reference"))
        .eval_text(text)
        .args(["--threads", "2"])
        .out(out)
        .arg("--json")
        .args(lane)
        .run()
}

/// One layout rule on real files: a type measured as a single GGUF file gets a card beside it
/// that verifies, given the file or its directory, with the manifest it was measured with.
#[test]
#[ignore = "needs the real model (CARDPROOF_REAL_MODEL; .ci/run sets it)"]
fn a_card_for_each_real_gguf_file_verifies_by_file_and_by_directory() {
    let dir = tempfile::tempdir().unwrap();
    let text = text(dir.path());
    // The rule is the same for every type (loading every type is the lanes' test): a legacy
    // quant, a k-quant mix and an i-quant mix.
    for ty in ["Q8_0", "Q4_K_M", "IQ4_XS"] {
        let file = candidate_copy(ty, dir.path());
        let m = dir.path().join(format!("{ty}-m"));
        let r = measure_candidate(&file, &text, &m, &[]);
        assert_eq!(r.code, 0, "{ty} measure: {}", r.transcript());
        write_card(&m, &file, ty);
        for (target, how) in [(file.clone(), "file"), (file.with_file_name(""), "dir")] {
            let r = verify_in(&target, &text, &dir.path().join(format!("{ty}-{how}")), &[]);
            assert_eq!(r.code, 0, "{ty} by {how}: {}\n{}", r.stderr, r.stdout);
            assert_eq!(r.json()["verdict"], "reproduced", "{ty} by {how}");
        }
    }
}

/// A card whose claims llama.cpp measured (the runner, Q4_K_M) reproduces in the llama.cpp lane,
/// and is `not_comparable` in the native lane, which is not the engine the card names.
#[test]
#[ignore = "needs the real model and llama.cpp (CARDPROOF_REAL_MODEL, CARDPROOF_LLAMACPP_BIN; .ci/run sets both)"]
fn a_llamacpp_measured_real_card_reproduces_in_its_lane_only() {
    let bin = llamacpp_bin();
    let dir = tempfile::tempdir().unwrap();
    let text = text(dir.path());
    let file = candidate_copy("Q4_K_M", dir.path());
    let m = dir.path().join("m");
    let lane = ["--runner", "llamacpp", "--llamacpp-bin", &bin];
    let r = measure_candidate(&file, &text, &m, &lane);
    assert_eq!(r.code, 0, "measure: {}", r.transcript());
    write_card(&m, &file, "Q4_K_M");
    let r = verify_in(&file, &text, &dir.path().join("llamacpp"), &lane);
    assert_eq!(r.code, 0, "llama.cpp lane: {}\n{}", r.stderr, r.stdout);
    assert_eq!(r.json()["verdict"], "reproduced");
    let r = verify_in(&file, &text, &dir.path().join("native"), &[]);
    assert_eq!(r.code, 1, "native lane: {}\n{}", r.stderr, r.stdout);
    assert_eq!(r.json()["verdict"], "not_comparable");
}

/// The tokenizer.json real_model.sh writes tokenizes as llama.cpp does: llama.cpp's own base pass
/// over the text stores its token stream, and the tokenizer gives the same ids, every one.
#[test]
#[ignore = "needs the real model and llama.cpp (CARDPROOF_REAL_MODEL, CARDPROOF_LLAMACPP_BIN; .ci/run sets both)"]
fn the_tokenizer_json_tokenizes_as_llama_cpp_does() {
    let dir = tempfile::tempdir().unwrap();
    let text = text(dir.path());
    let base = dir.path().join("base.bin");
    let out = std::process::Command::new(llamacpp_bin())
        .args([
            "-m",
            real_model().join("reference/model.gguf").to_str().unwrap(),
        ])
        .args(["-f", text.to_str().unwrap(), "-c", "512", "-t", "2"])
        .args(["--kl-divergence-base", base.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stream = cardproof::kld::llamacpp::BaseFile::open(&base).unwrap();
    let tokenizer =
        tokenizers::Tokenizer::from_file(real_model().join("reference/tokenizer.json")).unwrap();
    let ids = tokenizer
        .encode(std::fs::read_to_string(&text).unwrap(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    let kept = stream.tokens.len();
    assert_eq!(kept, 2 * 512, "llama.cpp keeps whole windows");
    assert!(ids.len() >= kept);
    let ours: Vec<i32> = ids[..kept].iter().map(|&i| i as i32).collect();
    let first = ours.iter().zip(&stream.tokens).position(|(a, b)| a != b);
    assert!(first.is_none(), "token {first:?} differs");
}

/// A real GGUF repository: ten llama-quantize types of the real model (legacy quants, k-quant
/// and i-quant mixes) as files beside one card, each measured and added with `card
/// --measurement`; the card lints clean against all of them (each entry's method against its own
/// file's tensors), and `verify` of the directory reproduces every file, each into its own set.
#[test]
#[ignore = "needs the real model (CARDPROOF_REAL_MODEL; .ci/run sets it)"]
fn one_card_lists_every_real_quant_file_and_each_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let text = text(dir.path());
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::copy(
        real_model().join("reference/tokenizer.json"),
        repo.join("tokenizer.json"),
    )
    .unwrap();
    // Ten of the types (the shipped Q4_1 is the reference's own source, so its KLD is 0 by
    // construction and its quantization-engaged gate fails, as it should; IQ3_M left out for time).
    let types: Vec<&str> = TYPES
        .into_iter()
        .filter(|t| !matches!(*t, "Q4_1-shipped" | "IQ3_M"))
        .collect();
    assert_eq!(types.len(), 10);
    let mut files = Vec::new();
    for ty in types.iter().copied() {
        let name = format!("SmolLM2-135M-Instruct-{ty}.gguf");
        std::fs::copy(real_model().join(ty).join("model.gguf"), repo.join(&name)).unwrap();
        let m = dir.path().join(format!("{ty}-m"));
        let r = measure_candidate(&repo.join(&name), &text, &m, &[]);
        assert_eq!(r.code, 0, "{ty} measure: {}", r.transcript());
        let method = ty.trim_end_matches("-shipped").to_lowercase();
        let r = cardproof(&[
            "card",
            "--measurement",
            m.join("measurement.json").to_str().unwrap(),
            "--reference-repo",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "--reference-revision",
            "0000000000000000000000000000000000000000",
            "--candidate-repo",
            "cardproof/SmolLM2-135M-Instruct-GGUF",
            "--quantization",
            &method,
            "--calibration",
            "none",
        ]);
        assert_eq!(r.code, 0, "{ty} card: {}", r.stderr);
        files.push(name);
    }
    let card = std::fs::read_to_string(repo.join("README.md")).unwrap();
    assert_eq!(
        card.matches("  - file: SmolLM2-135M-Instruct-").count(),
        10,
        "{card}"
    );
    let lint = cardproof(&["lint", repo.to_str().unwrap(), "--json"]);
    assert_eq!(lint.code, 0, "{}", lint.stdout);
    let r = verify_in(&repo, &text, &dir.path().join("reports"), &[]);
    let summary = r.json();
    for (entry, file) in summary["files"].as_array().unwrap().iter().zip(&files) {
        assert_eq!(entry["file"], file.as_str());
        assert_eq!(entry["verdict"], "reproduced", "{entry:#}");
    }
    assert_eq!(summary["files"].as_array().unwrap().len(), 10);
    assert_eq!(r.code, 0, "{}", r.stderr);
}
