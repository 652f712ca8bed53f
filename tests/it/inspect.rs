//! `cardproof inspect`: every scheme from headers alone, buckets, bits per weight, and
//! config/tensor disagreements.

use cardproof::checkpoint::dtype::Dtype;
use serde_json::Value;

use crate::fixtures::*;
use crate::support::*;

/// `inspect --json` of a single checkpoint: its one-element `variants` list's entry.
fn inspect(dir: &std::path::Path) -> Value {
    let run = cardproof(&["inspect", dir.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    only_variant(run.json())
}

/// The one entry of a document's `variants` (every `inspect --json` has the list).
fn only_variant(doc: Value) -> Value {
    assert_eq!(doc["schema_version"], 1, "{doc}");
    let variants = doc["variants"].as_array().expect("a `variants` list");
    assert_eq!(variants.len(), 1, "one checkpoint, one variant: {doc}");
    variants[0].clone()
}

fn module<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no module {name}"))
}

fn bits(m: &Value) -> f64 {
    m["bits_per_weight"].as_f64().unwrap()
}

fn findings(doc: &Value) -> Vec<String> {
    doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["message"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn mixed_fp8_static_and_nvfp4_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    mixed_fp8_nvfp4(dir.path());
    let doc = inspect(dir.path());
    assert_eq!(doc["format"], "safetensors");
    let q = module(&doc, "model.layers.0.self_attn.q_proj");
    assert_eq!(
        (q["status"].as_str(), q["scheme"].as_str()),
        (Some("quantized"), Some("fp8-tensor"))
    );
    assert_eq!(q["activations"], "fp8-static");
    assert_eq!(q["bucket"], "attention");
    let gdn = module(&doc, "model.layers.1.linear_attn.in_proj_qkvz");
    assert_eq!(
        (gdn["scheme"].as_str(), gdn["activations"].as_str()),
        (Some("fp8-tensor"), Some("fp8-static"))
    );
    assert_eq!(gdn["bucket"], "linear_attention");
    let up = module(&doc, "model.layers.0.mlp.up_proj");
    assert_eq!(
        (up["scheme"].as_str(), up["group_size"].as_u64()),
        (Some("nvfp4"), Some(16))
    );
    assert_eq!(up["activations"], "none");
    // 4 bits + one E4M3 scale per 16 + a 4-byte global scale.
    let expected = 4.5 + 32.0 / (INTERMEDIATE * HIDDEN) as f64;
    assert!((bits(up) - expected).abs() < 1e-12, "{}", bits(up));
    let head = module(&doc, "lm_head");
    assert_eq!(
        (head["scheme"].as_str(), head["bucket"].as_str()),
        (Some("nvfp4"), Some("lm_head"))
    );
    let s = &doc["summary"];
    assert_eq!(s["lm_head"], "quantized");
    assert_eq!(s["embeddings"], "bf16");
    assert_eq!(s["quantized"], 4 + 3 + 3 + 3 + 1);
    assert_eq!(s["high_precision"], 0);
    assert_eq!(s["schemes"]["fp8-tensor"], 7);
    assert_eq!(s["schemes"]["nvfp4"], 7);
    assert_eq!(doc["buckets"]["linear_attention"]["modules"], 3);
    assert_eq!(doc["declared"]["method"], "compressed-tensors");
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));
}

#[test]
fn int4_group_128_symmetric_is_exactly_4_125_bits() {
    let dir = tempfile::tempdir().unwrap();
    int4_pack_quantized(dir.path(), 128, 128, false);
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.1.mlp.down_proj");
    assert_eq!(m["scheme"], "int4-group");
    assert_eq!(m["group_size"], 128);
    assert_eq!(m["symmetric"], true);
    assert_eq!(bits(m), 4.125);
    assert_eq!(m["shape"], serde_json::json!([HIDDEN, INTERMEDIATE]));
    assert_eq!(module(&doc, "lm_head")["status"], "high_precision");
    assert_eq!(doc["summary"]["schemes"]["bf16"], 1);
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));
}

#[test]
fn asymmetric_int4_counts_its_zero_points() {
    let dir = tempfile::tempdir().unwrap();
    int4_pack_quantized(dir.path(), 128, 128, true);
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.0.self_attn.q_proj");
    assert_eq!(m["symmetric"], false);
    // zero points: I32 packing 8 per int along out -> 4 bits per group of 128.
    assert_eq!(bits(m), 4.125 + 4.0 / 128.0);
}

#[test]
fn config_and_tensors_disagreeing_on_group_size_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    int4_pack_quantized(dir.path(), 64, 128, false);
    let doc = inspect(dir.path());
    let f = findings(&doc);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].contains("14 modules")
            && f[0].contains("declares group size 128, but the scales give 64"),
        "{f:?}"
    );
    assert_eq!(doc["findings"][0]["code"], "config-tensor-mismatch");
}

#[test]
fn int8_channel_and_fp8_block() {
    let dir = tempfile::tempdir().unwrap();
    int8_channel(dir.path());
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.0.mlp.gate_proj");
    assert_eq!(m["scheme"], "int8-channel");
    assert_eq!(bits(m), 8.0 + 16.0 / HIDDEN as f64);

    let dir = tempfile::tempdir().unwrap();
    fp8_block(dir.path());
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.0.mlp.down_proj");
    assert_eq!(m["scheme"], "fp8-block");
    assert_eq!(m["group_size"], serde_json::json!([128, 128]));
    assert_eq!(
        bits(m),
        8.0 + (2 * 4 * 32) as f64 / (HIDDEN * INTERMEDIATE) as f64
    );
    assert_eq!(doc["summary"]["lm_head"], "high_precision");
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));
}

#[test]
fn awq_and_gptq_are_told_apart_by_packing() {
    let dir = tempfile::tempdir().unwrap();
    awq(dir.path());
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.0.mlp.gate_proj");
    assert_eq!(m["scheme"], "int4-awq");
    assert_eq!(m["shape"], serde_json::json!([INTERMEDIATE, HIDDEN]));
    // 4 bits + F16 scale per 128 + 4-bit zero per 128.
    assert_eq!(bits(m), 4.0 + 16.0 / 128.0 + 4.0 / 128.0);
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));

    let dir = tempfile::tempdir().unwrap();
    gptq(dir.path());
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.0.mlp.down_proj");
    assert_eq!(m["scheme"], "int4-gptq");
    assert_eq!(m["shape"], serde_json::json!([HIDDEN, INTERMEDIATE]));
    // ... plus a 32-bit g_idx entry per input column.
    assert_eq!(
        bits(m),
        4.0 + 16.0 / 128.0 + 4.0 / 128.0 + 32.0 / HIDDEN as f64
    );
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));
}

#[test]
fn a_3bit_gptq_checkpoint_has_in_features_rows_times_32_over_3() {
    // 3-bit GPTQ packs 32 input rows into 3 int32 words: in = rows * 32 / 3, not rows * 10.
    let dir = tempfile::tempdir().unwrap();
    gptq_bits(dir.path(), 3);
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.0.mlp.down_proj");
    assert_eq!(m["scheme"], "int3-gptq");
    assert_eq!(m["shape"], serde_json::json!([HIDDEN, INTERMEDIATE]));
    assert_eq!(m["parameters"], HIDDEN * INTERMEDIATE);
    assert_eq!(m["group_size"], 128);
    // 3 bits + F16 scale and 3-bit zero per 128 + a 32-bit g_idx entry per input column.
    assert_eq!(
        bits(m),
        3.0 + 16.0 / 128.0 + 3.0 / 128.0 + 32.0 / HIDDEN as f64
    );
    let q = module(&doc, "model.layers.0.self_attn.q_proj");
    assert_eq!(q["shape"], serde_json::json!([HIDDEN, HIDDEN]));
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));
}

#[test]
fn every_gptq_bit_width_reads_back_its_shape() {
    for bits in [2u64, 3, 4, 8] {
        let dir = tempfile::tempdir().unwrap();
        gptq_bits(dir.path(), bits);
        let doc = inspect(dir.path());
        let m = module(&doc, "model.layers.0.mlp.gate_proj");
        assert_eq!(m["scheme"], format!("int{bits}-gptq"), "{bits} bits");
        assert_eq!(
            m["shape"],
            serde_json::json!([INTERMEDIATE, HIDDEN]),
            "{bits} bits"
        );
        assert!(
            findings(&doc).is_empty(),
            "{bits} bits: {:?}",
            findings(&doc)
        );
    }
}

#[test]
fn a_3bit_gptq_qweight_whose_rows_hold_no_whole_values_is_unknown_with_a_finding() {
    // 25 packed rows of 3-bit values are 266.67 input rows: no layout, not a rounded guess.
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tensors::default();
    let m = "model.layers.0.mlp.down_proj";
    t.add(&format!("{m}.qweight"), Dtype::I32, &[25, 64]);
    t.add(&format!("{m}.qzeros"), Dtype::I32, &[2, 6]);
    t.add(&format!("{m}.scales"), Dtype::F16, &[2, 64]);
    t.write(&dir.path().join("model.safetensors"));
    write_json(
        &dir.path().join("config.json"),
        &base_config(Some(serde_json::json!({
            "quant_method": "gptq", "bits": 3, "group_size": 128
        }))),
    );
    let doc = inspect(dir.path());
    assert_eq!(module(&doc, m)["scheme"], "unknown");
    let f = findings(&doc);
    assert!(
        f.iter()
            .any(|f| f.contains(m) && f.contains("multiple of 3")),
        "{f:?}"
    );
}

#[test]
fn a_vocab_only_gguf_reports_no_lm_head() {
    // llama.cpp's vocabulary files: tokenizer metadata, no tensors. No embeddings, so no head
    // shares them: the head is absent, not tied.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ggml-vocab-llama.gguf");
    use cardproof::checkpoint::gguf::{GgufValue, serialize};
    let metadata = [
        ("general.architecture", GgufValue::String("llama".into())),
        ("tokenizer.ggml.model", GgufValue::String("llama".into())),
    ];
    std::fs::write(&path, serialize(&metadata, &[], 32)).unwrap();
    let run = cardproof(&["inspect", path.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = only_variant(run.json());
    assert_eq!(doc["tensor_count"], 0);
    assert_eq!(doc["parameter_count"], 0);
    assert_eq!(doc["summary"]["lm_head"], "absent");
    assert_eq!(doc["summary"]["embeddings"], Value::Null);
    let human = cardproof(&["inspect", path.to_str().unwrap()]);
    assert!(human.stdout.contains("lm_head absent"), "{}", human.stdout);
    // A GGUF with embeddings and no output tensor still ties its head to them.
    let tied = tempfile::tempdir().unwrap();
    gguf_q4_k(&tied.path().join("m.gguf"));
    let file = cardproof::checkpoint::gguf::read_file(&tied.path().join("m.gguf")).unwrap();
    let whole = std::fs::read(tied.path().join("m.gguf")).unwrap();
    let kept: Vec<_> = file
        .tensors
        .iter()
        .filter(|t| t.name != "output.weight")
        .map(|t| {
            let data = whole[t.offset as usize..(t.offset + t.n_bytes) as usize].to_vec();
            (t.name.clone(), t.ty, t.dims.clone(), data)
        })
        .collect();
    let views: Vec<_> = kept
        .iter()
        .map(|(n, t, d, b)| (n.as_str(), *t, d.as_slice(), b.as_slice()))
        .collect();
    let path = tied.path().join("m.gguf");
    std::fs::write(&path, serialize(&metadata, &views, 32)).unwrap();
    let doc = only_variant(cardproof(&["inspect", path.to_str().unwrap(), "--json"]).json());
    assert_eq!(doc["summary"]["lm_head"], "tied");
}

#[test]
fn modelopt_nvfp4_with_wildcard_excludes_and_fp8_kv_cache() {
    let dir = tempfile::tempdir().unwrap();
    modelopt_nvfp4(dir.path());
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.0.mlp.up_proj");
    assert_eq!(m["scheme"], "nvfp4");
    assert_eq!(m["activations"], "nvfp4");
    assert_eq!(m["group_size"], 16);
    assert_eq!(
        module(&doc, "model.layers.1.self_attn.q_proj")["status"],
        "high_precision"
    );
    assert_eq!(doc["declared"]["source"], "hf_quant_config.json");
    assert_eq!(doc["summary"]["kv_cache"], "FP8");
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));
}

#[test]
fn bitsandbytes_nf4_reads_its_quant_state_and_int8_its_scb() {
    let dir = tempfile::tempdir().unwrap();
    bnb_nf4(dir.path());
    let doc = inspect(dir.path());
    let m = module(&doc, "model.layers.0.mlp.up_proj");
    assert_eq!(m["scheme"], "bnb-nf4");
    assert_eq!(m["shape"], serde_json::json!([INTERMEDIATE, HIDDEN]));
    assert_eq!(m["group_size"], 64);
    let n = (INTERMEDIATE * HIDDEN) as f64;
    assert_eq!(bits(m), 4.0 + 32.0 / 64.0 + 16.0 * 32.0 / n);
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));

    let dir = tempfile::tempdir().unwrap();
    bnb_int8(dir.path());
    let doc = inspect(dir.path());
    assert_eq!(
        module(&doc, "model.layers.0.self_attn.o_proj")["scheme"],
        "bnb-int8"
    );
}

#[test]
fn sharded_checkpoints_are_read_through_their_index() {
    let dir = tempfile::tempdir().unwrap();
    sharded_bf16(dir.path());
    let doc = inspect(dir.path());
    assert_eq!(doc["files"].as_array().unwrap().len(), 2);
    assert_eq!(doc["summary"]["high_precision"], 15);
    assert_eq!(doc["summary"]["schemes"]["bf16"], 15);
    let params =
        VOCAB * HIDDEN * 2 + HIDDEN * 5 + 2 * (HIDDEN * HIDDEN * 3 + INTERMEDIATE * HIDDEN * 3);
    assert_eq!(doc["parameter_count"], params);
}

#[test]
fn gguf_types_give_exact_bits() {
    let dir = tempfile::tempdir().unwrap();
    gguf_q4_k(&dir.path().join("model-Q4_K_M.gguf"));
    let doc = inspect(dir.path());
    assert_eq!(doc["format"], "gguf");
    assert_eq!(bits(module(&doc, "blk.0.attn_q")), 4.5);
    assert_eq!(bits(module(&doc, "blk.1.ffn_down")), 6.5625);
    assert_eq!(module(&doc, "output")["bucket"], "lm_head");
    assert_eq!(doc["summary"]["embeddings"], "q4_k");
    assert_eq!(doc["summary"]["schemes"]["q4_k"], 12);
    assert_eq!(doc["summary"]["schemes"]["q6_k"], 3);
}

/// One JSON shape whatever the input: a single GGUF file, a directory with one checkpoint and a
/// directory of several GGUF variants all give `{"schema_version": 1, "variants": [...]}`, and a
/// file's entry is the same as its entry in the directory's list.
#[test]
fn inspect_json_has_one_shape_for_one_or_many_variants() {
    let keys = |doc: &Value| -> Vec<String> { doc.as_object().unwrap().keys().cloned().collect() };
    let many = cardproof(&["inspect", "tests/fixtures/llamacpp", "--json"]);
    let file = cardproof(&["inspect", "tests/fixtures/llamacpp/ref-f32.gguf", "--json"]);
    let dir = cardproof(&["inspect", &model("shakespeare-q4_0-gguf"), "--json"]);
    for run in [&many, &file, &dir] {
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert_eq!(keys(&run.json()), ["schema_version", "variants"]);
    }
    assert_eq!(many.json()["variants"].as_array().unwrap().len(), 3);
    let one = only_variant(file.json());
    assert_eq!(one["format"], "gguf");
    assert_eq!(only_variant(dir.json())["format"], "gguf");
    // The file's entry is its entry in the directory's list, but for the variant's name.
    let mut listed = many.json()["variants"][2].clone();
    assert_eq!(listed["variant"], "ref-f32");
    listed["variant"] = one["variant"].clone();
    assert_eq!(listed["summary"], one["summary"]);
    assert_eq!(listed["modules"], one["modules"]);
}

#[test]
fn a_directory_of_gguf_files_reports_each_variant() {
    let run = cardproof(&["inspect", "tests/fixtures/llamacpp", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = run.json();
    let variants: Vec<&str> = doc["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["variant"].as_str().unwrap())
        .collect();
    assert_eq!(variants, ["cand-q5_0", "cand-q6_k", "ref-f32"]);
    assert_eq!(doc["variants"][2]["summary"]["quantized"], 0);
}

#[test]
fn unrecognised_layouts_are_unknown_with_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tensors::default();
    t.add(
        "model.layers.0.mlp.up_proj.weight",
        cardproof::checkpoint::dtype::Dtype::F8_E4M3,
        &[64, 64],
    );
    t.write(&dir.path().join("model.safetensors"));
    let doc = inspect(dir.path());
    assert_eq!(
        module(&doc, "model.layers.0.mlp.up_proj")["scheme"],
        "unknown"
    );
    assert_eq!(doc["findings"][0]["code"], "unknown-scheme");
}

/// A `quant_method` cardproof does not know used to give no finding at all: the tensors were
/// classified and the declaration silently ignored.
#[test]
fn an_unknown_quant_method_is_a_finding_naming_it_and_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    fp8_block(dir.path());
    let config = dir.path().join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["quantization_config"]["quant_method"] = "zzz-unknown".into();
    write_json(&config, &c);
    let doc = inspect(dir.path());
    assert_eq!(doc["declared"]["method"], "zzz-unknown");
    let unknown: Vec<&Value> = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["message"].as_str().unwrap().contains("zzz-unknown"))
        .collect();
    assert_eq!(unknown.len(), 1, "{:?}", findings(&doc));
    assert_eq!(unknown[0]["code"], "unknown-scheme");
    assert_eq!(unknown[0]["severity"], "error");
    assert_eq!(
        unknown[0]["message"],
        "config.json quantization_config declares quant_method `zzz-unknown`, which cardproof does not know (known: compressed-tensors, fp8, awq, gptq, modelopt, bitsandbytes, mxfp4): its declaration is not checked against the tensors"
    );
    // The tensors are still classified.
    assert_eq!(
        module(&doc, "model.layers.0.mlp.down_proj")["scheme"],
        "fp8-block"
    );

    // No quant_method at all is the same finding.
    c["quantization_config"]
        .as_object_mut()
        .unwrap()
        .remove("quant_method");
    write_json(&config, &c);
    let doc = inspect(dir.path());
    assert!(
        findings(&doc).iter().any(|f| f.contains(
            "config.json quantization_config has no `quant_method` string (known: compressed-tensors"
        )),
        "{:?}",
        findings(&doc)
    );
}

#[test]
fn malformed_checkpoints_are_exit_2_naming_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = {
        let mut t = Tensors::default();
        t.add(
            "w.weight",
            cardproof::checkpoint::dtype::Dtype::BF16,
            &[4, 4],
        );
        t.bytes()
    };
    bytes.push(0); // a trailing byte after the data
    std::fs::write(dir.path().join("model.safetensors"), &bytes).unwrap();
    let run = cardproof_in(dir.path(), &["inspect", ".", "--json"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    let e = &run.json()["error"];
    assert!(
        e["file"].as_str().unwrap().ends_with("model.safetensors"),
        "{e}"
    );
    assert!(!run.stderr.contains("panicked"));

    std::fs::write(
        dir.path().join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\xff{}",
    )
    .unwrap();
    let run = cardproof_in(dir.path(), &["inspect", "."]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("model.safetensors"), "{}", run.stderr);
}

#[test]
fn human_output_summarises_buckets_and_schemes() {
    let dir = tempfile::tempdir().unwrap();
    mixed_fp8_nvfp4(dir.path());
    let run = cardproof_in(dir.path(), &["inspect", "."]);
    assert_eq!(run.code, 0);
    insta::assert_snapshot!(run.stdout);
}

#[test]
fn one_part_of_a_split_gguf_stands_for_all_parts() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.gguf");
    gguf_q4_k(&whole);
    let file = cardproof::checkpoint::gguf::read_file(&whole).unwrap();
    // Two parts: the first holds the token embeddings, the second the rest.
    let tensors: Vec<_> = file
        .tensors
        .iter()
        .map(|t| {
            let data = std::fs::read(&whole).unwrap()
                [t.offset as usize..(t.offset + t.n_bytes) as usize]
                .to_vec();
            (t.name.clone(), t.ty, t.dims.clone(), data)
        })
        .collect();
    std::fs::remove_file(&whole).unwrap();
    for (i, part) in [&tensors[..1], &tensors[1..]].iter().enumerate() {
        let views: Vec<_> = part
            .iter()
            .map(|(n, t, d, b)| (n.as_str(), *t, d.as_slice(), b.as_slice()))
            .collect();
        let meta = [
            (
                "general.architecture",
                cardproof::checkpoint::gguf::GgufValue::String("llama".into()),
            ),
            (
                "split.no",
                cardproof::checkpoint::gguf::GgufValue::U16(i as u16),
            ),
            (
                "split.count",
                cardproof::checkpoint::gguf::GgufValue::U16(2),
            ),
        ];
        let path = dir
            .path()
            .join(format!("m-Q4_K-{:05}-of-00002.gguf", i + 1));
        std::fs::write(
            path,
            cardproof::checkpoint::gguf::serialize(&meta, &views, 32),
        )
        .unwrap();
    }
    let run = cardproof_in(
        dir.path(),
        &["inspect", "m-Q4_K-00002-of-00002.gguf", "--json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let doc = only_variant(run.json());
    assert_eq!(doc["files"].as_array().unwrap().len(), 2);
    assert_eq!(doc["tensor_count"], tensors.len());
    assert_eq!(doc["summary"]["embeddings"], "q4_k");
}

#[test]
fn hybrid_vlm_checkpoint_reports_gdn_mtp_and_vision_in_their_own_buckets() {
    let dir = tempfile::tempdir().unwrap();
    hybrid_fp8_nvfp4(dir.path());
    let doc = inspect(dir.path());
    let b = &doc["buckets"];
    let count = |bucket: &str| b[bucket]["modules"].as_u64().unwrap_or(0);
    // 3 GDN layers × (in_proj_qkv, in_proj_z, out_proj FP8; in_proj_a, in_proj_b bf16); the
    // depthwise conv1d is an nn.Conv1d, no linear module (quantizers' `Linear` targets skip it).
    assert_eq!(count("linear_attention"), 15, "{b}");
    assert_eq!(b["linear_attention"]["schemes"]["fp8-tensor"], 9);
    assert_eq!(b["attention"]["schemes"]["fp8-tensor"], 4);
    assert_eq!(b["mlp"]["schemes"]["nvfp4"], 12);
    assert_eq!(b["lm_head"]["schemes"]["nvfp4"], 1);
    assert_eq!(count("mtp"), 3, "{b}");
    // The two linear vision modules (the 5-D patch-embedding conv is no linear module).
    assert_eq!(count("vision"), 2, "{b}");
    assert_eq!(b["mtp"]["quantized"], 0);
    assert_eq!(b["vision"]["quantized"], 0);
    assert!(
        doc["modules"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| !m["name"].as_str().unwrap().ends_with(".conv1d")),
        "a depthwise conv1d is listed as a linear module"
    );
    assert_eq!(doc["summary"]["schemes"]["fp8-tensor"], 13);
    assert_eq!(doc["summary"]["schemes"]["nvfp4"], 13);
    assert!(findings(&doc).is_empty(), "{:?}", findings(&doc));
}

#[test]
fn hybrid_vlm_checkpoint_human_output() {
    let dir = tempfile::tempdir().unwrap();
    hybrid_fp8_nvfp4(dir.path());
    let run = cardproof_in(dir.path(), &["inspect", "."]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
}

/// llama.cpp's converter output for the MoE hybrid (tests/fixtures/gguf_family): GDN projections
/// (`attn_qkv`, `attn_gate`, `ssm_*`), experts, router and shared expert in their buckets.
#[test]
fn gguf_hybrid_moe_buckets() {
    let path = repo_root().join("tests/fixtures/gguf_family/qwen35moe.q8_0.gguf");
    let doc = inspect_file(&path);
    let b = &doc["buckets"];
    // attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out (Q8_0) and the squeezed conv (F32).
    assert_eq!(b["linear_attention"]["modules"], 6, "{b}");
    assert_eq!(b["linear_attention"]["quantized"], 5, "{b}");
    // 2 layers × the gate, up and down expert stacks.
    assert_eq!(b["moe_experts"]["modules"], 6, "{b}");
    assert_eq!(b["moe_router"]["modules"], 2, "{b}");
    // 2 layers × (gate, up, down, gate_inp_shexp).
    assert_eq!(b["moe_shared_expert"]["modules"], 8, "{b}");
    assert_eq!(b["attention"]["modules"], 4, "{b}");
    assert_eq!(module(&doc, "blk.0.attn_qkv")["bucket"], "linear_attention");
    assert_eq!(module(&doc, "blk.1.attn_q")["bucket"], "attention");
}

#[test]
fn gguf_hybrid_moe_human_output() {
    let path = repo_root().join("tests/fixtures/gguf_family/qwen35moe.q8_0.gguf");
    let run = cardproof(&["inspect", path.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
}

fn inspect_file(path: &std::path::Path) -> Value {
    let run = cardproof(&["inspect", path.to_str().unwrap(), "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    only_variant(run.json())
}

#[test]
fn moe_experts_routers_shared_experts_and_mtp_have_their_own_buckets() {
    let dir = tempfile::tempdir().unwrap();
    moe_hybrid_bf16(dir.path());
    let doc = inspect(dir.path());
    let bucket = |name: &str| module(&doc, name)["bucket"].as_str().unwrap().to_owned();
    assert_eq!(
        bucket("model.layers.0.mlp.experts.3.down_proj"),
        "moe_experts"
    );
    assert_eq!(
        bucket("model.layers.1.mlp.experts.gate_up_proj"),
        "moe_experts"
    );
    assert_eq!(bucket("model.layers.0.mlp.gate"), "moe_router");
    assert_eq!(
        bucket("model.layers.0.mlp.shared_expert.up_proj"),
        "moe_shared_expert"
    );
    assert_eq!(
        bucket("model.layers.0.mlp.shared_expert_gate"),
        "moe_shared_expert"
    );
    assert_eq!(
        bucket("model.layers.0.linear_attn.in_proj_qkvz"),
        "linear_attention"
    );
    assert_eq!(
        bucket("model.layers.0.linear_attn.in_proj_ba"),
        "linear_attention"
    );
    assert_eq!(bucket("mtp.layers.0.mlp.gate"), "mtp");
    let b = &doc["buckets"];
    // 12 per-expert modules in layer 0, the two fused stacks of layer 1.
    assert_eq!(b["moe_experts"]["modules"], 14, "{b}");
    assert_eq!(b["moe_router"]["modules"], 2, "{b}");
    assert_eq!(b["moe_shared_expert"]["modules"], 8, "{b}");
    assert_eq!(b["mtp"]["modules"], 3, "{b}");
    // in_proj_qkvz, in_proj_ba, out_proj (the conv1d is no linear module).
    assert_eq!(b["linear_attention"]["modules"], 3, "{b}");
    assert_eq!(
        module(&doc, "model.layers.1.mlp.experts.gate_up_proj")["shape"],
        serde_json::json!([4, 64, 64])
    );
}

#[test]
fn moe_hybrid_human_output() {
    let dir = tempfile::tempdir().unwrap();
    moe_hybrid_bf16(dir.path());
    let run = cardproof_in(dir.path(), &["inspect", "."]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    insta::assert_snapshot!(run.stdout);
}
