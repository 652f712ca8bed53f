//! `cardproof measure` with the native runner on the example models under examples/models.

use std::path::Path;

use crate::support::{Cmd, copy_dir, edit_config, model, repo_root, short_text};

fn measure(
    reference: &str,
    candidate: &str,
    extra: &[&str],
) -> (serde_json::Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 2500);
    let out = dir.path().join("out");
    let run = Cmd::measure()
        .reference(reference)
        .candidate(candidate)
        .eval_text(&text)
        .context_length(128)
        .bootstrap(100)
        .out(&out)
        .arg("--json")
        .args(extra)
        .run();
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = run.json();
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("measurement.json")).unwrap())
            .unwrap();
    assert_eq!(
        doc, file,
        "stdout and measurement.json hold the same document"
    );
    assert!(out.join("positions.safetensors").exists());
    (doc, dir)
}

fn metric(doc: &serde_json::Value, name: &str) -> f64 {
    doc["runs"][0]["metrics"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("no {name} in {}", doc["runs"][0]["metrics"]))
}

#[test]
fn a_model_against_itself_gives_exactly_zero() {
    let bf16 = model("shakespeare-bf16");
    let (doc, _dir) = measure(&bf16, &bf16, &[]);
    assert_eq!(metric(&doc, "kld_mean"), 0.0);
    assert_eq!(metric(&doc, "kld_max"), 0.0);
    assert_eq!(metric(&doc, "kld_reverse_mean"), 0.0);
    assert_eq!(metric(&doc, "top1_agreement"), 1.0);
    assert_eq!(metric(&doc, "ppl_ratio"), 1.0);
    assert_eq!(doc["schema_version"], 1);
    assert_eq!(doc["runs"][0]["context_length"], 128);
    assert_eq!(doc["eval"]["bos"], "none");
    assert_eq!(doc["environment"]["runner"], "native");
    assert_eq!(doc["environment"]["compute_dtype"], "f32");
    assert_eq!(
        doc["reference"]["manifest_sha256"],
        doc["candidate"]["manifest_sha256"]
    );
    assert_eq!(
        doc["reference"]["lm_head_sha256"].as_str().unwrap().len(),
        64
    );
}

#[test]
fn quantized_examples_diverge_in_the_expected_order() {
    let bf16 = model("shakespeare-bf16");
    let kld = |name: &str| {
        let (doc, _dir) = measure(&bf16, &model(name), &["--direction", "forward"]);
        assert!(doc["runs"][0]["metrics"].get("kld_reverse_mean").is_none());
        metric(&doc, "kld_mean")
    };
    let int8 = kld("shakespeare-w8a16");
    let fp8 = kld("shakespeare-fp8-block");
    let int4 = kld("shakespeare-awq-int4");
    let q4 = kld("shakespeare-q4_0-gguf");
    for (name, v) in [
        ("int8", int8),
        ("fp8", fp8),
        ("awq int4", int4),
        ("gguf q4_0", q4),
    ] {
        assert!(v > 0.0 && v.is_finite(), "{name}: {v}");
    }
    assert!(int4 > int8, "int4 {int4} should exceed int8 {int8}");
    assert!(int4 > fp8, "int4 {int4} should exceed fp8 {fp8}");
    assert!(
        fp8 > int8,
        "fp8 (3 mantissa bits) {fp8} should exceed int8 per channel {int8}"
    );
}

#[test]
fn measurement_json_carries_protocol_digests_and_a_fidelity_block() {
    let (doc, dir) = measure(
        &model("shakespeare-bf16"),
        &model("shakespeare-w8a16"),
        &[
            "--positions",
            "stride",
            "--stride",
            "4",
            "--offset",
            "3",
            "--bos",
            "per-window",
        ],
    );
    let p = &doc["protocol"];
    assert_eq!(
        p["positions"],
        serde_json::json!({"policy": "stride", "stride": 4, "offset": 3})
    );
    assert_eq!(p["bos"], "per_window");
    assert_eq!(p["context_lengths"], serde_json::json!([128]));
    assert_eq!(doc["protocol_sha256"].as_str().unwrap().len(), 64);
    // 2500 characters give some windows of 128 tokens; rows 3, 7, ..., 123 (row 127 predicts
    // past the window) are scored in each.
    let run = &doc["runs"][0];
    assert_eq!(
        run["n_positions"].as_u64().unwrap(),
        run["n_windows"].as_u64().unwrap() * 31
    );
    let f = &doc["fidelity"];
    assert_eq!(f["schema"], "cardproof/v1");
    assert_eq!(f["eval"]["bos"], "per_window");
    assert_eq!(f["eval"]["tokens"]["sha256"], doc["eval"]["tokens_sha256"]);
    assert_eq!(f["runtime"]["engine"], "cardproof");
    // A dense model has no recurrent state: none is recorded or disclosed.
    assert!(doc["environment"].get("recurrent_state_dtype").is_none());
    assert!(f["runtime"].get("recurrent_state_dtype").is_none());
    assert!(
        f["results"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["metric"] == "kld_mean")
    );
    // positions.safetensors holds one row per scored position.
    let bytes = std::fs::read(dir.path().join("out/positions.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kld = st.tensor("ctx128.kld").unwrap();
    assert_eq!(kld.shape(), [run["n_positions"].as_u64().unwrap() as usize]);
}

#[test]
fn logit_dumps_reproduce_the_measurement_through_kld() {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 1500);
    let dump = dir.path().join("dump");
    let run = Cmd::measure()
        .reference(model("shakespeare-bf16"))
        .candidate(model("shakespeare-fp8-block"))
        .eval_text(&text)
        .context_length(64)
        .out(dir.path().join("out"))
        .flag("--dump-logits", &dump)
        .bootstrap(50)
        .arg("--json")
        .run();
    assert_eq!(run.code, 0, "{}", run.stderr);
    let measured = run.json();
    let kld = Cmd::kld()
        .reference("dump/reference.logits.safetensors")
        .candidate("dump/candidate.logits.safetensors")
        .bootstrap(50)
        .arg("--json")
        .in_dir(dir.path())
        .run();
    assert_eq!(kld.code, 0, "{}", kld.stderr);
    let k = kld.json();
    for name in [
        "kld_mean",
        "kld_p99",
        "kld_reverse_mean",
        "top1_agreement",
        "ppl_ref",
        "ppl_cand",
    ] {
        assert_eq!(
            k["metrics"][name], measured["runs"][0]["metrics"][name],
            "{name}"
        );
    }
}

#[test]
fn bad_inputs_are_exit_2_with_one_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 300);
    let bf16 = model("shakespeare-bf16");
    let run = |candidate: &str, text: &Path, extra: &[&str]| {
        Cmd::measure()
            .reference(&bf16)
            .candidate(candidate)
            .eval_text(text)
            .context_length(512)
            .out(dir.path().join("out"))
            .args(extra)
            .run()
    };
    // Eval text shorter than one window.
    let r = run(&bf16, &text, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("shorter than one window of 512"),
        "{}",
        r.stderr
    );
    assert!(!dir.path().join("out/measurement.json").exists());

    // An unsupported architecture is named, with the supported ones.
    let broken = dir.path().join("gemma");
    copy_dir(
        &repo_root().join("examples/models/shakespeare-bf16"),
        &broken,
    );
    edit_config(&broken, |c| c["model_type"] = "gemma3".into());
    let long = repo_root().join("examples/data/eval.txt");
    let r = run(broken.to_str().unwrap(), &long, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("gemma3") && r.stderr.contains("llama, mistral, qwen2, qwen3"),
        "{}",
        r.stderr
    );

    // A config that disagrees with the tensors.
    edit_config(&broken, |c| {
        c["model_type"] = "qwen3".into();
        c["intermediate_size"] = 1024.into();
    });
    let r = run(broken.to_str().unwrap(), &long, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("mlp.gate_proj") && r.stderr.contains("[1024, 256]"),
        "{}",
        r.stderr
    );

    // A missing config key.
    edit_config(&broken, |c| {
        c.as_object_mut().unwrap().remove("num_hidden_layers");
    });
    let r = run(broken.to_str().unwrap(), &long, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("num_hidden_layers: missing"),
        "{}",
        r.stderr
    );

    // A different tokenizer.
    let other = dir.path().join("other-tok");
    copy_dir(
        &repo_root().join("examples/models/shakespeare-bf16"),
        &other,
    );
    let tok = std::fs::read_to_string(other.join("tokenizer.json")).unwrap();
    let mut t: serde_json::Value = serde_json::from_str(&tok).unwrap();
    let vocab = t["model"]["vocab"].as_object_mut().unwrap();
    let a = vocab["e"].clone();
    let b = vocab["t"].clone();
    vocab.insert("e".into(), b);
    vocab.insert("t".into(), a);
    std::fs::write(other.join("tokenizer.json"), t.to_string()).unwrap();
    let r = run(other.to_str().unwrap(), &long, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("tokenizer differs from the reference"),
        "{}",
        r.stderr
    );

    // An unsupported quantization format is named, with the supported ones.
    let bnb = dir.path().join("bnb");
    std::fs::create_dir_all(&bnb).unwrap();
    crate::fixtures::bnb_nf4(&bnb);
    edit_config(&bnb, |c| c["num_attention_heads"] = 4.into());
    let r = run(bnb.to_str().unwrap(), &long, &[]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("bitsandbytes weights are not supported")
            && r.stderr.contains("supported: compressed-tensors"),
        "{}",
        r.stderr
    );

    // Output inside a checkpoint is refused before any work.
    let r = Cmd::measure()
        .reference(&bf16)
        .candidate(&bf16)
        .eval_text(&long)
        .context_length(64)
        .out(repo_root().join("examples/models/shakespeare-bf16/out"))
        .run();
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("is inside the checkpoint"),
        "{}",
        r.stderr
    );
}

/// A `quant_method` cardproof does not know leaves what the checkpoint computes unknown (the FP8
/// example's weights with its dynamic FP8 activations declared under another name were measured
/// as weight-only before): refused before any work, naming the file, the key, the method and the
/// known ones.
#[test]
fn an_unknown_quant_method_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let candidate = dir.path().join("unknown-method");
    copy_dir(
        &repo_root().join("examples/models/shakespeare-fp8-block"),
        &candidate,
    );
    edit_config(&candidate, |c| {
        c["quantization_config"]["quant_method"] = "zzz-unknown".into();
    });
    let out = dir.path().join("out");
    let r = Cmd::measure()
        .reference(model("shakespeare-bf16"))
        .candidate(&candidate)
        .eval_text("examples/data/eval.txt")
        .context_length(64)
        .out(&out)
        .run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    let config = candidate.join("config.json");
    assert!(
        r.stderr.contains(&format!(
            "{}: quantization_config: quant_method `zzz-unknown` is not a quantization method cardproof knows (known: compressed-tensors, fp8, awq",
            config.display()
        )),
        "{}",
        r.stderr
    );
    assert_eq!(r.diagnostics().lines().count(), 1, "{}", r.stderr);
    assert!(!out.join("measurement.json").exists());
}

/// `measure` of an unloadable copy of the bf16 example against itself (see
/// [`crate::support::unloadable_copy`]) on the first `chars` of the eval text: a refusal other
/// than the load error was found before any forward pass.
fn measure_unloadable(chars: usize, extra: &[&str]) -> (crate::support::Run, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::support::unloadable_copy("shakespeare-bf16", &dir.path().join("model"));
    let text = short_text(dir.path(), chars);
    let out = dir.path().join("out");
    let run = Cmd::measure()
        .reference(&model)
        .candidate(&model)
        .eval_text(&text)
        .bootstrap(10)
        .out(&out)
        .args(extra)
        .run();
    (run, dir)
}

#[test]
fn an_unloadable_model_fails_at_its_load_which_the_early_checks_precede() {
    // The premise of the tests below: this model passes every early check and fails to load.
    let (r, _dir) = measure_unloadable(10_000, &["--context-length", "128"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("model.safetensors"), "{}", r.stderr);
    assert!(
        r.diagnostics().starts_with("warning: ") && !r.stderr.contains("exceeds"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_context_length_past_the_models_positions_is_refused_before_any_forward_pass() {
    let (r, dir) = measure_unloadable(10_000, &["--context-length", "2048"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let config = dir.path().join("model/config.json");
    assert!(
        r.stderr.contains(&format!(
            "{}: context length 2048 exceeds the model's max_position_embeddings 1024",
            config.display()
        )),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("model.safetensors"), "{}", r.stderr);
    // At the limit it passes the check (and reaches the load).
    let (r, _dir) = measure_unloadable(10_000, &["--context-length", "1024"]);
    assert!(!r.stderr.contains("exceeds"), "{}", r.stderr);
}

#[test]
fn too_few_bootstrap_blocks_are_named_before_any_forward_pass() {
    // About 840 tokens in windows of 128: 6 windows, 6 blocks, a warning before the work (the
    // load then fails, after it).
    let (r, _dir) = measure_unloadable(2500, &["--context-length", "128"]);
    let warning =
        "tokens make 6 windows of 128, 6 bootstrap blocks; below 30 the ci95 is too narrow";
    let said = r.diagnostics();
    let (Some(warned), Some(load)) = (said.find(warning), said.find("model.safetensors")) else {
        panic!("{}", r.stderr)
    };
    assert!(
        said.starts_with("warning: ") && warned < load,
        "{}",
        r.stderr
    );
    assert_eq!(r.code, 2, "the unloadable model: {}", r.stderr);
    // One window whose one scored row is one block: no interval, refused.
    let (r, dir) = measure_unloadable(
        2500,
        &[
            "--context-length",
            "512",
            "--positions",
            "stride",
            "--stride",
            "512",
            "--offset",
            "0",
        ],
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "{}: context length 512: one 512-token window, its 1 scored rows in runs of 1, 1 bootstrap block; an interval needs at least 2",
            dir.path().join("eval.txt").display()
        )),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("model.safetensors"), "{}", r.stderr);
}

#[test]
fn a_candidate_with_another_tokenizer_is_refused_before_any_forward_pass() {
    let dir = tempfile::tempdir().unwrap();
    let reference = crate::support::unloadable_copy("shakespeare-bf16", &dir.path().join("ref"));
    let candidate = crate::support::unloadable_copy("shakespeare-bf16", &dir.path().join("cand"));
    // Two tokens' ids swapped: the same vocabulary, other ids.
    let path = candidate.join("tokenizer.json");
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let vocab = t["model"]["vocab"].as_object_mut().unwrap();
    let (a, b) = (vocab["!"].clone(), vocab["#"].clone());
    vocab.insert("!".into(), b);
    vocab.insert("#".into(), a);
    std::fs::write(&path, serde_json::to_vec(&t).unwrap()).unwrap();
    let text = short_text(dir.path(), 2500);
    let r = Cmd::measure()
        .reference(&reference)
        .candidate(&candidate)
        .eval_text(&text)
        .context_length(128)
        .out(dir.path().join("out"))
        .run();
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "{}: tokenizer differs from the reference's {}: 2 of 2048 tokens have other ids",
            path.display(),
            reference.join("tokenizer.json").display()
        )),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("model.safetensors"), "{}", r.stderr);
}

#[test]
fn the_recurrent_state_dtype_flag_is_validated_and_refused_where_it_would_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let text = short_text(dir.path(), 2500);
    let bf16 = model("shakespeare-bf16");
    let out = dir.path().join("out");
    let run = |extra: &[&str]| {
        Cmd::measure()
            .reference(&bf16)
            .candidate(&bf16)
            .eval_text(&text)
            .context_length(128)
            .out(&out)
            .args(extra)
            .run()
    };
    // Not a dtype: exit 2 naming the flag, the value and the choices, before any work.
    let r = run(&["--recurrent-state-dtype", "fp8"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--recurrent-state-dtype: `fp8` is not a state dtype"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("bf16 (bfloat16)"), "{}", r.stderr);
    // llama.cpp keeps its own state.
    let r = run(&[
        "--runner",
        "llamacpp",
        "--recurrent-state-dtype",
        "bfloat16",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--runner llamacpp keeps llama.cpp's own state"),
        "{}",
        r.stderr
    );
    // One pass per window: nothing stores the state, nothing would change.
    let r = run(&["--recurrent-state-dtype", "bf16"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("would change nothing"), "{}", r.stderr);
    // A dense candidate has no recurrent state to keep in bf16: refused, not silently ignored.
    let r = run(&["--recurrent-state-dtype", "bf16", "--prefill-chunk", "32"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("has no recurrent (linear-attention) layers"),
        "{}",
        r.stderr
    );
    assert!(!out.join("measurement.json").exists());
}
