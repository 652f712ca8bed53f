//! cardproof's dequantizers against the formats' own reference code, recorded as fixtures in
//! tests/fixtures/dequant (the scripts beside them made them): compressed-tensors 0.12.2's
//! compressors (with torch), transformers' fine-grained FP8 dequantization, and the gguf Python
//! package's numpy dequantizers.

use std::path::{Path, PathBuf};

use cardproof::checkpoint::dtype::Dtype;
use cardproof::dequant::{self, CtArgs, CtStrategy, Stored};
use cardproof::runner::native::Emulate;
use cardproof::runner::native::gguf::GgufStore;
use cardproof::runner::native::weights::WeightStore;
use safetensors::SafeTensors;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/dequant")
        .join(name)
}

fn stored<'a>(st: &'a SafeTensors, name: &str, shape: &'a mut Vec<usize>) -> Stored<'a> {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    *shape = t.shape().to_vec();
    Stored {
        dtype: Dtype::from_name(&t.dtype().to_string()).expect("known dtype"),
        shape,
        bytes: t.data(),
    }
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    st.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Every value equal, or within one f32 rounding of the reference's (the reference multiplies
/// in a possibly different order).
fn assert_matches(name: &str, ours: &[f32], reference: &[f32]) {
    assert_eq!(ours.len(), reference.len(), "{name}: length");
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut worst = 0f32;
    for (a, b) in ours.iter().zip(reference) {
        worst = worst.max((a - b).abs());
    }
    assert!(
        worst <= scale * 2.0 * f32::EPSILON,
        "{name}: max |ours - reference| {worst} (values up to {scale})"
    );
}

/// The fixture's `format` and QuantizationArgs (from `__metadata__`).
fn ct_args(bytes: &[u8]) -> (String, serde_json::Value) {
    let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
    let m = meta.metadata().clone().unwrap();
    (
        m["format"].clone(),
        serde_json::from_str(&m["args"]).unwrap(),
    )
}

fn load(path: &Path) -> &'static [u8] {
    Box::leak(std::fs::read(path).unwrap().into_boxed_slice())
}

#[test]
fn compressed_tensors_fixtures_match_the_package() {
    let mut seen = 0;
    for entry in std::fs::read_dir(fixture("")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("ct-") {
            continue;
        }
        let bytes = load(&path);
        let st = SafeTensors::deserialize(bytes).unwrap();
        let (format, args) = ct_args(bytes);
        let strategy = match args["strategy"].as_str().unwrap() {
            "tensor" => CtStrategy::Tensor,
            "channel" => CtStrategy::Channel,
            "group" => CtStrategy::Group,
            "block" => CtStrategy::Block,
            _ => CtStrategy::TensorGroup,
        };
        let a = CtArgs {
            strategy,
            group_size: args["group_size"].as_u64().map(|g| g as usize),
            block: args["block_structure"].as_array().map(|b| {
                [
                    b[0].as_u64().unwrap() as usize,
                    b[1].as_u64().unwrap() as usize,
                ]
            }),
        };
        let names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
        let has = |n: &str| names.iter().any(|x| x == n);
        let (mut s1, mut s2, mut s3, mut s4, mut s5) = (vec![], vec![], vec![], vec![], vec![]);
        let ours = match format.as_str() {
            "nvfp4-pack-quantized" => dequant::ct_nvfp4(
                stored(&st, "weight_packed", &mut s1),
                stored(&st, "weight_scale", &mut s2),
                stored(&st, "weight_global_scale", &mut s3),
            ),
            "pack-quantized" => {
                let shape: Vec<usize> = st
                    .tensor("weight_shape")
                    .unwrap()
                    .data()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as usize)
                    .collect();
                dequant::ct_pack_quantized(
                    stored(&st, "weight_packed", &mut s1),
                    [shape[0], shape[1]],
                    args["num_bits"].as_u64().unwrap() as u32,
                    stored(&st, "weight_scale", &mut s2),
                    has("weight_zero_point").then(|| stored(&st, "weight_zero_point", &mut s3)),
                    has("weight_g_idx").then(|| stored(&st, "weight_g_idx", &mut s4)),
                    &a,
                )
            }
            _ => dequant::ct_dense(
                stored(&st, "weight", &mut s1),
                stored(&st, "weight_scale", &mut s2),
                has("weight_zero_point").then(|| stored(&st, "weight_zero_point", &mut s5)),
                &a,
            ),
        }
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ours = if format == "nvfp4-pack-quantized" {
            // The package's decompress_weight returns the unpacked dtype, bf16 ("TODO: use a user
            // provided dequant dtype"); cardproof keeps the exact f32 product, which rounds to it.
            ours.iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect()
        } else {
            ours
        };
        assert_matches(&name, &ours, &f32s(&st, "reference"));
        seen += 1;
    }
    assert_eq!(seen, 10, "every compressed-tensors fixture is checked");
}

#[test]
fn fine_grained_fp8_matches_transformers() {
    let model =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/models/shakespeare-fp8-block");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let store = cardproof::runner::native::weights::SafetensorsStore::open(&model, config).unwrap();
    let st =
        SafeTensors::deserialize(load(&fixture("fp8-block-transformers.safetensors"))).unwrap();
    for name in [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.3.mlp.down_proj.weight",
    ] {
        let ours = store.linear(name.strip_suffix(".weight").unwrap()).unwrap();
        assert_matches(name, &ours.weight, &f32s(&st, name));
    }
}

#[test]
fn gguf_tensors_match_gguf_py() {
    let st = SafeTensors::deserialize(load(&fixture("gguf-reference.safetensors"))).unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let files = [
        (
            "cand-q5_0.gguf",
            root.join("tests/fixtures/llamacpp/cand-q5_0.gguf"),
        ),
        (
            "cand-q6_k.gguf",
            root.join("tests/fixtures/llamacpp/cand-q6_k.gguf"),
        ),
        (
            "model.gguf",
            root.join("examples/models/shakespeare-q4_0-gguf/model.gguf"),
        ),
    ];
    let hf = |gguf: &str| -> String {
        let map = [
            ("attn_q", "self_attn.q_proj"),
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("ffn_down", "mlp.down_proj"),
        ];
        match gguf {
            "token_embd.weight" => "model.embed_tokens.weight".into(),
            "output.weight" => "lm_head.weight".into(),
            _ => {
                let rest = gguf.strip_prefix("blk.").unwrap();
                let (layer, rest) = rest.split_once('.').unwrap();
                let module = rest.strip_suffix(".weight").unwrap();
                let hf = map.iter().find(|(g, _)| *g == module).unwrap().1;
                format!("model.layers.{layer}.{hf}.weight")
            }
        }
    };
    let mut seen = 0;
    for (file, path) in &files {
        let (store, _) = GgufStore::open(path, Emulate::ReferenceSemantics).unwrap();
        for name in st.names() {
            let Some(tensor) = name.strip_prefix(&format!("{file}|")) else {
                continue;
            };
            let reference = f32s(&st, name);
            let ours = store.dense(&hf(tensor)).unwrap();
            assert_matches(name, &ours.data[..reference.len()], &reference);
            seen += 1;
        }
    }
    assert_eq!(seen, 7);
}

/// The types of our own dequantizers (src/runner/native/ggml_quants.rs): every ggml weight
/// type the pinned llama.cpp defines beyond those candle dequantizes.
const OUR_TYPES: [&str; 15] = [
    "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs", "iq1_m",
    "tq1_0", "tq2_0", "mxfp4", "nvfp4", "q1_0", "q2_0",
];

/// Real rows of SmolLM2-135M-Instruct in every ggml block type llama-quantize writes for it
/// (tests/fixtures/dequant/make_gguf_real_quants.py): the native runner's dequantizer gives the
/// reference's values bit for bit: gguf-py's, which the script checked against ggml-quants.c's
/// `dequantize_row_*` bit for bit, and ggml's own for Q1_0 and Q2_0 (gguf-py has none). Every
/// type of our own dequantizers is covered, and so is every k-quant and legacy block type.
#[test]
fn real_gguf_quants_match_the_reference_bit_for_bit() {
    let path = fixture("real-quants.gguf");
    let st = SafeTensors::deserialize(load(&fixture("real-quants-reference.safetensors"))).unwrap();
    let file = cardproof::checkpoint::gguf::read_file(&path).unwrap();
    let store = GgufStore::open_weights(&path, Emulate::ReferenceSemantics).unwrap();
    let mut types = Vec::new();
    for t in &file.tensors {
        assert_eq!(
            t.name,
            t.ty.name(),
            "a fixture tensor is named after its type"
        );
        let reference = f32s(&st, &t.name);
        let ours = store
            .dequantize_named(&t.name)
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        let shape = st.tensor(&t.name).unwrap().shape().to_vec();
        assert_eq!(ours.shape, shape, "{}", t.name);
        let differ = ours
            .data
            .iter()
            .zip(&reference)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(ours.data.len(), reference.len(), "{}", t.name);
        assert_eq!(
            differ, 0,
            "{}: {differ} values differ from the reference",
            t.name
        );
        types.push(t.name.clone());
    }
    assert_eq!(
        st.names().len(),
        types.len(),
        "a reference with no fixture tensor"
    );
    for ty in OUR_TYPES.iter().chain(&[
        "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
    ]) {
        assert!(
            types.iter().any(|t| t == ty),
            "the fixture has no {ty} tensor"
        );
    }
}
