//! Tiny checkpoints generated in code, with real tensor names, dtypes and shapes for each format.

use std::collections::BTreeMap;
use std::path::Path;

use cardproof::checkpoint::dtype::Dtype;
use cardproof::checkpoint::gguf::{self, GgmlType, GgufValue};
use cardproof::checkpoint::safetensors;
use serde_json::{Value, json};

pub const HIDDEN: u64 = 256;
pub const INTERMEDIATE: u64 = 512;
pub const VOCAB: u64 = 320;

/// Tensors of one safetensors file, zero-filled at their exact byte size.
#[derive(Default)]
pub struct Tensors(Vec<(String, Dtype, Vec<u64>, Vec<u8>)>);

impl Tensors {
    pub fn add(&mut self, name: &str, dtype: Dtype, shape: &[u64]) -> &mut Self {
        let bytes = dtype.byte_len(shape.iter().product()).expect("whole bytes");
        self.0.push((
            name.to_owned(),
            dtype,
            shape.to_vec(),
            vec![0; bytes as usize],
        ));
        self
    }

    pub fn add_bytes(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[u64],
        data: Vec<u8>,
    ) -> &mut Self {
        self.0.push((name.to_owned(), dtype, shape.to_vec(), data));
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let views: Vec<(&str, Dtype, &[u64], &[u8])> = self
            .0
            .iter()
            .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
            .collect();
        safetensors::serialize(&views, &BTreeMap::new())
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.bytes()).expect("write safetensors");
    }
}

pub fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
}

/// (module, out, in) for a llama-shaped decoder layer.
pub fn layer_linears(layer: usize) -> Vec<(String, u64, u64)> {
    let p = format!("model.layers.{layer}");
    vec![
        (format!("{p}.self_attn.q_proj"), HIDDEN, HIDDEN),
        (format!("{p}.self_attn.k_proj"), HIDDEN / 2, HIDDEN),
        (format!("{p}.self_attn.v_proj"), HIDDEN / 2, HIDDEN),
        (format!("{p}.self_attn.o_proj"), HIDDEN, HIDDEN),
        (format!("{p}.mlp.gate_proj"), INTERMEDIATE, HIDDEN),
        (format!("{p}.mlp.up_proj"), INTERMEDIATE, HIDDEN),
        (format!("{p}.mlp.down_proj"), HIDDEN, INTERMEDIATE),
    ]
}

/// Embeddings and norms every checkpoint has.
pub fn add_common(t: &mut Tensors, layers: usize) {
    t.add("model.embed_tokens.weight", Dtype::BF16, &[VOCAB, HIDDEN]);
    t.add("model.norm.weight", Dtype::BF16, &[HIDDEN]);
    for l in 0..layers {
        t.add(
            &format!("model.layers.{l}.input_layernorm.weight"),
            Dtype::BF16,
            &[HIDDEN],
        );
        t.add(
            &format!("model.layers.{l}.post_attention_layernorm.weight"),
            Dtype::BF16,
            &[HIDDEN],
        );
    }
}

pub fn base_config(quantization_config: Option<Value>) -> Value {
    let mut c = json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": 2,
        "vocab_size": VOCAB, "tie_word_embeddings": false});
    if let Some(q) = quantization_config {
        c["quantization_config"] = q;
    }
    c
}

fn nvfp4_pack(t: &mut Tensors, m: &str, out: u64, inn: u64) {
    t.add(&format!("{m}.weight_packed"), Dtype::U8, &[out, inn / 2]);
    t.add(
        &format!("{m}.weight_scale"),
        Dtype::F8_E4M3,
        &[out, inn / 16],
    );
    t.add(&format!("{m}.weight_global_scale"), Dtype::F32, &[1]);
}

fn fp8_static_tensor(t: &mut Tensors, m: &str, out: u64, inn: u64) {
    t.add(&format!("{m}.weight"), Dtype::F8_E4M3, &[out, inn]);
    t.add(&format!("{m}.weight_scale"), Dtype::F32, &[]);
    t.add(&format!("{m}.input_scale"), Dtype::F32, &[]);
}

/// The mixed checkpoint: static FP8 W8A8 on attention and linear-attention projections, NVFP4
/// W4A16 at group 16 on the MLP projections and lm_head (compressed-tensors). Layer 1 is a
/// GDN (linear attention) layer.
pub fn mixed_fp8_nvfp4(dir: &Path) {
    let mut t = Tensors::default();
    add_common(&mut t, 2);
    for (m, out, inn) in layer_linears(0) {
        if m.contains("self_attn") {
            fp8_static_tensor(&mut t, &m, out, inn);
        } else {
            nvfp4_pack(&mut t, &m, out, inn);
        }
    }
    for (m, out, inn) in [
        (
            "model.layers.1.linear_attn.in_proj_qkvz",
            2 * HIDDEN,
            HIDDEN,
        ),
        ("model.layers.1.linear_attn.in_proj_ba", 32, HIDDEN),
        ("model.layers.1.linear_attn.out_proj", HIDDEN, HIDDEN),
    ] {
        fp8_static_tensor(&mut t, m, out, inn);
    }
    t.add("model.layers.1.linear_attn.A_log", Dtype::F32, &[16]);
    for (m, out, inn) in layer_linears(1)
        .into_iter()
        .filter(|(m, ..)| m.contains("mlp"))
    {
        nvfp4_pack(&mut t, &m, out, inn);
    }
    nvfp4_pack(&mut t, "lm_head", VOCAB, HIDDEN);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &base_config(Some(json!({
            "quant_method": "compressed-tensors", "format": "mixed-precision",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {"targets": ["re:.*self_attn.*", "re:.*linear_attn.*"],
                    "format": "float-quantized",
                    "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false}},
                "group_1": {"targets": ["re:.*mlp.*", "lm_head"], "format": "nvfp4-pack-quantized",
                    "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": true, "dynamic": false},
                    "input_activations": null}
            },
            "ignore": []
        }))),
    );
}

/// compressed-tensors W4A16: int4 group `group`, pack-quantized, with zero points when `asym`.
pub fn int4_pack_quantized(dir: &Path, group: u64, declared_group: u64, asym: bool) {
    let mut t = Tensors::default();
    add_common(&mut t, 2);
    for l in 0..2 {
        for (m, out, inn) in layer_linears(l) {
            t.add(&format!("{m}.weight_packed"), Dtype::I32, &[out, inn / 8]);
            t.add(
                &format!("{m}.weight_scale"),
                Dtype::BF16,
                &[out, inn / group],
            );
            let shape: Vec<u8> = [out as i32, inn as i32]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            t.add_bytes(&format!("{m}.weight_shape"), Dtype::I32, &[2], shape);
            if asym {
                t.add(
                    &format!("{m}.weight_zero_point"),
                    Dtype::I32,
                    &[out / 8, inn / group],
                );
            }
        }
    }
    t.add("lm_head.weight", Dtype::BF16, &[VOCAB, HIDDEN]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &base_config(Some(json!({
            "quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": declared_group, "symmetric": !asym}}},
            "ignore": ["lm_head"]
        }))),
    );
}

/// compressed-tensors W8A8 int8: per-channel int8 weights, dynamic per-token int8 activations.
pub fn int8_channel(dir: &Path) {
    let mut t = Tensors::default();
    add_common(&mut t, 2);
    for l in 0..2 {
        for (m, out, inn) in layer_linears(l) {
            t.add(&format!("{m}.weight"), Dtype::I8, &[out, inn]);
            t.add(&format!("{m}.weight_scale"), Dtype::BF16, &[out, 1]);
        }
    }
    t.add("lm_head.weight", Dtype::BF16, &[VOCAB, HIDDEN]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &base_config(Some(json!({
            "quant_method": "compressed-tensors", "format": "int-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": true},
                "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": true, "symmetric": true}}},
            "ignore": ["lm_head"]
        }))),
    );
}

/// Fine-grained FP8 (DeepSeek/Qwen3-FP8 style): E4M3 weights with 128×128 `weight_scale_inv`.
pub fn fp8_block(dir: &Path) {
    let mut t = Tensors::default();
    add_common(&mut t, 2);
    for l in 0..2 {
        for (m, out, inn) in layer_linears(l) {
            t.add(&format!("{m}.weight"), Dtype::F8_E4M3, &[out, inn]);
            t.add(
                &format!("{m}.weight_scale_inv"),
                Dtype::F32,
                &[out.div_ceil(128), inn.div_ceil(128)],
            );
        }
    }
    t.add("lm_head.weight", Dtype::BF16, &[VOCAB, HIDDEN]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &base_config(Some(
            json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}),
        )),
    );
}

/// AutoAWQ GEMM: qweight [in, out/8], qzeros [in/g, out/8], scales [in/g, out].
pub fn awq(dir: &Path) {
    let mut t = Tensors::default();
    add_common(&mut t, 2);
    for l in 0..2 {
        for (m, out, inn) in layer_linears(l) {
            t.add(&format!("{m}.qweight"), Dtype::I32, &[inn, out / 8]);
            t.add(&format!("{m}.qzeros"), Dtype::I32, &[inn / 128, out / 8]);
            t.add(&format!("{m}.scales"), Dtype::F16, &[inn / 128, out]);
        }
    }
    t.add("lm_head.weight", Dtype::F16, &[VOCAB, HIDDEN]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &base_config(Some(
            json!({"quant_method": "awq", "bits": 4, "group_size": 128,
            "zero_point": true, "version": "gemm"}),
        )),
    );
}

/// GPTQ with act-order: qweight [in/8, out], qzeros [in/g, out/8], scales [in/g, out], g_idx [in].
pub fn gptq(dir: &Path) {
    gptq_bits(dir, 4);
}

/// GPTQ at `bits` (2, 3, 4 or 8) as AutoGPTQ writes it: `qweight` I32 `[in*bits/32, out]` (3-bit:
/// 32 input rows in every 3 words), `qzeros` I32 `[groups, out*bits/32]`, group size 128.
pub fn gptq_bits(dir: &Path, bits: u64) {
    let mut t = Tensors::default();
    add_common(&mut t, 2);
    for l in 0..2 {
        for (m, out, inn) in layer_linears(l) {
            t.add(&format!("{m}.qweight"), Dtype::I32, &[inn * bits / 32, out]);
            t.add(
                &format!("{m}.qzeros"),
                Dtype::I32,
                &[inn / 128, out * bits / 32],
            );
            t.add(&format!("{m}.scales"), Dtype::F16, &[inn / 128, out]);
            t.add(&format!("{m}.g_idx"), Dtype::I32, &[inn]);
        }
    }
    t.add("lm_head.weight", Dtype::F16, &[VOCAB, HIDDEN]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &base_config(Some(
            json!({"quant_method": "gptq", "bits": bits, "group_size": 128,
            "desc_act": true, "sym": true, "checkpoint_format": "gptq"}),
        )),
    );
}

/// NVIDIA ModelOpt NVFP4 (W4A4) with wildcard excludes; layer 1's attention stays BF16.
pub fn modelopt_nvfp4(dir: &Path) {
    let mut t = Tensors::default();
    add_common(&mut t, 2);
    for l in 0..2 {
        for (m, out, inn) in layer_linears(l) {
            if l == 1 && m.contains("self_attn") {
                t.add(&format!("{m}.weight"), Dtype::BF16, &[out, inn]);
                continue;
            }
            t.add(&format!("{m}.weight"), Dtype::U8, &[out, inn / 2]);
            t.add(
                &format!("{m}.weight_scale"),
                Dtype::F8_E4M3,
                &[out, inn / 16],
            );
            t.add(&format!("{m}.weight_scale_2"), Dtype::F32, &[]);
            t.add(&format!("{m}.input_scale"), Dtype::F32, &[]);
        }
        t.add(
            &format!("model.layers.{l}.self_attn.k_scale"),
            Dtype::F32,
            &[],
        );
        t.add(
            &format!("model.layers.{l}.self_attn.v_scale"),
            Dtype::F32,
            &[],
        );
    }
    t.add("lm_head.weight", Dtype::BF16, &[VOCAB, HIDDEN]);
    t.write(&dir.join("model.safetensors"));
    write_json(&dir.join("config.json"), &base_config(None));
    write_json(
        &dir.join("hf_quant_config.json"),
        &json!({"producer": {"name": "modelopt", "version": "0.29.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                "exclude_modules": ["lm_head", "model.layers.1.self_attn*"]}}),
    );
}

/// bitsandbytes 4-bit NF4 with its JSON quant-state tensor, and 8-bit (`SCB`).
pub fn bnb_nf4(dir: &Path) {
    let mut t = Tensors::default();
    add_common(&mut t, 2);
    for l in 0..2 {
        for (m, out, inn) in layer_linears(l) {
            let n = out * inn;
            t.add(&format!("{m}.weight"), Dtype::U8, &[n / 2, 1]);
            t.add(&format!("{m}.weight.absmax"), Dtype::F32, &[n / 64]);
            t.add(&format!("{m}.weight.quant_map"), Dtype::F32, &[16]);
            let state = serde_json::to_vec(&json!({"quant_type": "nf4", "blocksize": 64,
                "dtype": "bfloat16", "shape": [out, inn]}))
            .unwrap();
            let len = state.len() as u64;
            t.add_bytes(
                &format!("{m}.weight.quant_state.bitsandbytes__nf4"),
                Dtype::U8,
                &[len],
                state,
            );
        }
    }
    t.add("lm_head.weight", Dtype::BF16, &[VOCAB, HIDDEN]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &base_config(Some(
            json!({"quant_method": "bitsandbytes", "load_in_4bit": true,
            "bnb_4bit_quant_type": "nf4", "llm_int8_skip_modules": ["lm_head"]}),
        )),
    );
}

pub fn bnb_int8(dir: &Path) {
    let mut t = Tensors::default();
    add_common(&mut t, 1);
    for (m, out, inn) in layer_linears(0) {
        t.add(&format!("{m}.weight"), Dtype::I8, &[out, inn]);
        t.add(&format!("{m}.SCB"), Dtype::F32, &[out]);
    }
    t.add("lm_head.weight", Dtype::BF16, &[VOCAB, HIDDEN]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &base_config(Some(
            json!({"quant_method": "bitsandbytes", "load_in_8bit": true}),
        )),
    );
}

/// A BF16 checkpoint in two shards with an index.
pub fn sharded_bf16(dir: &Path) {
    let mut a = Tensors::default();
    let mut b = Tensors::default();
    add_common(&mut a, 2);
    for (m, out, inn) in layer_linears(0) {
        a.add(&format!("{m}.weight"), Dtype::BF16, &[out, inn]);
    }
    for (m, out, inn) in layer_linears(1) {
        b.add(&format!("{m}.weight"), Dtype::BF16, &[out, inn]);
    }
    b.add("lm_head.weight", Dtype::BF16, &[VOCAB, HIDDEN]);
    let mut map = serde_json::Map::new();
    let mut total = 0u64;
    for (file, tensors) in [
        ("model-00001-of-00002.safetensors", &a),
        ("model-00002-of-00002.safetensors", &b),
    ] {
        tensors.write(&dir.join(file));
        for (name, dtype, shape, _) in &tensors.0 {
            map.insert(name.clone(), file.into());
            total += dtype.byte_len(shape.iter().product()).unwrap();
        }
    }
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": total}, "weight_map": map}),
    );
    write_json(&dir.join("config.json"), &base_config(None));
}

/// A GGUF Q4_K_M-style file: Q4_K projections, Q6_K output, F32 norms.
pub fn gguf_q4_k(path: &Path) {
    let mut tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, ty: GgmlType, dims: &[u64]| {
        let n: u64 = dims.iter().product();
        let bytes = n / ty.block_size() * ty.type_size();
        tensors.push((name.to_owned(), ty, dims.to_vec(), vec![0; bytes as usize]));
    };
    add("token_embd.weight", GgmlType::Q4_K, &[HIDDEN, VOCAB]);
    for l in 0..2 {
        add(
            &format!("blk.{l}.attn_norm.weight"),
            GgmlType::F32,
            &[HIDDEN],
        );
        for name in ["attn_q", "attn_output"] {
            add(
                &format!("blk.{l}.{name}.weight"),
                GgmlType::Q4_K,
                &[HIDDEN, HIDDEN],
            );
        }
        for name in ["attn_k", "attn_v"] {
            add(
                &format!("blk.{l}.{name}.weight"),
                GgmlType::Q4_K,
                &[HIDDEN, HIDDEN / 2],
            );
        }
        add(
            &format!("blk.{l}.ffn_gate.weight"),
            GgmlType::Q4_K,
            &[HIDDEN, INTERMEDIATE],
        );
        add(
            &format!("blk.{l}.ffn_up.weight"),
            GgmlType::Q4_K,
            &[HIDDEN, INTERMEDIATE],
        );
        add(
            &format!("blk.{l}.ffn_down.weight"),
            GgmlType::Q6_K,
            &[INTERMEDIATE, HIDDEN],
        );
    }
    add("output_norm.weight", GgmlType::F32, &[HIDDEN]);
    add("output.weight", GgmlType::Q6_K, &[HIDDEN, VOCAB]);
    let views: Vec<(&str, GgmlType, &[u64], &[u8])> = tensors
        .iter()
        .map(|(n, t, d, b)| (n.as_str(), *t, d.as_slice(), b.as_slice()))
        .collect();
    let metadata = [
        ("general.architecture", GgufValue::String("llama".into())),
        ("general.file_type", GgufValue::U32(15)),
        ("general.quantization_version", GgufValue::U32(2)),
    ];
    std::fs::write(path, gguf::serialize(&metadata, &views, 32)).unwrap();
}

/// A Qwen3.5/3.6-style hybrid vision-language checkpoint quantized like the seed's NVFP4 build,
/// at small scale: 4 text layers (3 Gated DeltaNet, then 1 full attention), static FP8 W8A8 on the
/// 4 attention and 9 GDN projections (`in_proj_qkv`, `in_proj_z`, `out_proj`), NVFP4 on the 12
/// MLP projections and lm_head; `in_proj_a` / `in_proj_b`, the GDN conv, the vision tower and the
/// MTP block stay bf16 (compressed-tensors, VLM layout `model.language_model.*`). The seed's own
/// build is the same pattern over 64 layers: 208 FP8 targets over 64 attention and 144 GDN
/// projections, 193 NVFP4 targets over the MLP and lm_head.
pub fn hybrid_fp8_nvfp4(dir: &Path) {
    const H: u64 = 64;
    const FF: u64 = 128;
    let mut t = Tensors::default();
    let lm = "model.language_model";
    t.add(
        &format!("{lm}.embed_tokens.weight"),
        Dtype::BF16,
        &[VOCAB, H],
    );
    t.add(&format!("{lm}.norm.weight"), Dtype::BF16, &[H]);
    for l in 0..4 {
        let p = format!("{lm}.layers.{l}");
        for n in ["input_layernorm", "post_attention_layernorm"] {
            t.add(&format!("{p}.{n}.weight"), Dtype::BF16, &[H]);
        }
        if l == 3 {
            for (m, out) in [
                ("q_proj", 2 * H),
                ("k_proj", H / 2),
                ("v_proj", H / 2),
                ("o_proj", H),
            ] {
                // q_proj holds the query and the output gate: 2 × heads × head_dim = 2H.
                fp8_static_tensor(&mut t, &format!("{p}.self_attn.{m}"), out, H);
            }
            t.add(&format!("{p}.self_attn.q_norm.weight"), Dtype::BF16, &[32]);
            t.add(&format!("{p}.self_attn.k_norm.weight"), Dtype::BF16, &[32]);
        } else {
            let g = format!("{p}.linear_attn");
            fp8_static_tensor(&mut t, &format!("{g}.in_proj_qkv"), 2 * H, H);
            fp8_static_tensor(&mut t, &format!("{g}.in_proj_z"), H, H);
            fp8_static_tensor(&mut t, &format!("{g}.out_proj"), H, H);
            t.add(&format!("{g}.in_proj_a.weight"), Dtype::BF16, &[4, H]);
            t.add(&format!("{g}.in_proj_b.weight"), Dtype::BF16, &[4, H]);
            t.add(&format!("{g}.conv1d.weight"), Dtype::BF16, &[2 * H, 1, 4]);
            t.add(&format!("{g}.A_log"), Dtype::F32, &[4]);
            t.add(&format!("{g}.dt_bias"), Dtype::F32, &[4]);
            t.add(&format!("{g}.norm.weight"), Dtype::F32, &[16]);
        }
        for (m, out, inn) in [
            ("gate_proj", FF, H),
            ("up_proj", FF, H),
            ("down_proj", H, FF),
        ] {
            nvfp4_pack(&mut t, &format!("{p}.mlp.{m}"), out, inn);
        }
    }
    nvfp4_pack(&mut t, "lm_head", VOCAB, H);
    // The vision tower and the MTP block, unquantized.
    t.add(
        "model.visual.patch_embed.proj.weight",
        Dtype::BF16,
        &[H, 3, 2, 4, 4],
    );
    t.add(
        "model.visual.blocks.0.attn.qkv.weight",
        Dtype::BF16,
        &[3 * H, H],
    );
    t.add(
        "model.visual.blocks.0.mlp.linear_fc1.weight",
        Dtype::BF16,
        &[FF, H],
    );
    t.add("mtp.fc.weight", Dtype::BF16, &[H, 2 * H]);
    t.add(
        "mtp.layers.0.self_attn.q_proj.weight",
        Dtype::BF16,
        &[2 * H, H],
    );
    t.add("mtp.layers.0.mlp.up_proj.weight", Dtype::BF16, &[FF, H]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": false,
            "text_config": {"model_type": "qwen3_5_text", "hidden_size": H, "num_hidden_layers": 4,
                "intermediate_size": FF, "vocab_size": VOCAB, "full_attention_interval": 4,
                "mtp_num_hidden_layers": 1},
            "quantization_config": {
                "quant_method": "compressed-tensors", "format": "mixed-precision",
                "quantization_status": "compressed",
                "config_groups": {
                    "group_0": {"targets": ["re:.*self_attn\\.(q|k|v|o)_proj$",
                            "re:.*linear_attn\\.(in_proj_qkv|in_proj_z|out_proj)$"],
                        "format": "float-quantized",
                        "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false},
                        "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true, "dynamic": false}},
                    "group_1": {"targets": ["re:.*language_model.*mlp\\.(gate|up|down)_proj$", "lm_head"],
                        "format": "nvfp4-pack-quantized",
                        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": true, "dynamic": false},
                        "input_activations": null}
                },
                "ignore": ["re:.*visual.*", "re:^mtp.*"]
            }
        }),
    );
}

/// A bf16 Qwen3-Next-style MoE checkpoint, 2 layers (GDN with the fused `in_proj_qkvz` /
/// `in_proj_ba`, then full attention), each a sparse block of 4 experts with a router, a shared
/// expert and its gate; one MTP layer; plus, in layer 1, experts stored fused the transformers-5
/// way (`mlp.experts.gate_up_proj`, 3-D) to show both layouts land in the experts bucket.
pub fn moe_hybrid_bf16(dir: &Path) {
    const H: u64 = 64;
    const FF: u64 = 32;
    let mut t = Tensors::default();
    t.add("model.embed_tokens.weight", Dtype::BF16, &[VOCAB, H]);
    t.add("model.norm.weight", Dtype::BF16, &[H]);
    t.add("lm_head.weight", Dtype::BF16, &[VOCAB, H]);
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        t.add(&format!("{p}.input_layernorm.weight"), Dtype::BF16, &[H]);
        t.add(
            &format!("{p}.post_attention_layernorm.weight"),
            Dtype::BF16,
            &[H],
        );
        if l == 0 {
            t.add(
                &format!("{p}.linear_attn.in_proj_qkvz.weight"),
                Dtype::BF16,
                &[3 * H, H],
            );
            t.add(
                &format!("{p}.linear_attn.in_proj_ba.weight"),
                Dtype::BF16,
                &[8, H],
            );
            t.add(
                &format!("{p}.linear_attn.conv1d.weight"),
                Dtype::BF16,
                &[2 * H, 1, 4],
            );
            t.add(
                &format!("{p}.linear_attn.out_proj.weight"),
                Dtype::BF16,
                &[H, H],
            );
            t.add(&format!("{p}.linear_attn.A_log"), Dtype::F32, &[4]);
            for e in 0..4 {
                for (m, out, inn) in [
                    ("gate_proj", FF, H),
                    ("up_proj", FF, H),
                    ("down_proj", H, FF),
                ] {
                    t.add(
                        &format!("{p}.mlp.experts.{e}.{m}.weight"),
                        Dtype::BF16,
                        &[out, inn],
                    );
                }
            }
        } else {
            for (m, out) in [
                ("q_proj", 2 * H),
                ("k_proj", H / 2),
                ("v_proj", H / 2),
                ("o_proj", H),
            ] {
                t.add(&format!("{p}.self_attn.{m}.weight"), Dtype::BF16, &[out, H]);
            }
            t.add(
                &format!("{p}.mlp.experts.gate_up_proj"),
                Dtype::BF16,
                &[4, 2 * FF, H],
            );
            t.add(
                &format!("{p}.mlp.experts.down_proj"),
                Dtype::BF16,
                &[4, H, FF],
            );
        }
        t.add(&format!("{p}.mlp.gate.weight"), Dtype::BF16, &[4, H]);
        for (m, out, inn) in [
            ("gate_proj", FF, H),
            ("up_proj", FF, H),
            ("down_proj", H, FF),
        ] {
            t.add(
                &format!("{p}.mlp.shared_expert.{m}.weight"),
                Dtype::BF16,
                &[out, inn],
            );
        }
        t.add(
            &format!("{p}.mlp.shared_expert_gate.weight"),
            Dtype::BF16,
            &[1, H],
        );
    }
    t.add("mtp.fc.weight", Dtype::BF16, &[H, 2 * H]);
    t.add(
        "mtp.layers.0.mlp.experts.0.up_proj.weight",
        Dtype::BF16,
        &[FF, H],
    );
    t.add("mtp.layers.0.mlp.gate.weight", Dtype::BF16, &[4, H]);
    t.write(&dir.join("model.safetensors"));
    write_json(
        &dir.join("config.json"),
        &json!({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
            "hidden_size": H, "num_hidden_layers": 2, "vocab_size": VOCAB,
            "num_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": false}),
    );
}

/// The quant types of [`gguf_quant_repo`]: file suffix, the type of its 2-D weights, the type of
/// `output.weight` where it differs, and llama.cpp's `general.file_type`.
pub const QUANT_FILES: [(&str, GgmlType, Option<GgmlType>, u32); 10] = [
    ("Q8_0", GgmlType::Q8_0, None, 7),
    ("Q5_1", GgmlType::Q5_1, None, 9),
    ("Q5_0", GgmlType::Q5_0, None, 8),
    ("Q4_1", GgmlType::Q4_1, None, 3),
    ("Q4_0", GgmlType::Q4_0, None, 2),
    ("IQ4_NL", GgmlType::IQ4_NL, None, 25),
    ("Q4_0_L", GgmlType::Q4_0, Some(GgmlType::Q8_0), 2),
    ("Q4_1_L", GgmlType::Q4_1, Some(GgmlType::Q8_0), 3),
    ("Q5_0_L", GgmlType::Q5_0, Some(GgmlType::Q8_0), 8),
    ("F32", GgmlType::F32, None, 0),
];
/// A GGUF repository as publishers lay it out: the BF16 example's weights written as ten quant
/// files (`shakespeare-<suffix>.gguf`, [`QUANT_FILES`]; `_L` keeps `output.weight` at Q8_0, as
/// the `_L` uploads do; the F32 file is lossless, its KLD exactly 0) beside its tokenizer, no
/// card. Each
/// 2-D weight is encoded here by the library's ggml block encoders (checked against ggml's own
/// quantizers in the KV-cache tests); 1-D tensors (norms) stay F32, as llama-quantize keeps them.
/// Returns the file names in that order.
pub fn gguf_quant_repo(dir: &Path) -> Vec<String> {
    use cardproof::runner::native::kv_cache::{KvScheme, encode_block};
    let source = Path::new(&crate::support::model("shakespeare-bf16-gguf")).join("model.gguf");
    let bytes = std::fs::read(&source).unwrap();
    let header = gguf::read_file(&source).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(source.parent().unwrap()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name != "model.gguf" && name != "README.md" {
            std::fs::copy(entry.path(), dir.join(name)).unwrap();
        }
    }
    let f32_of = |t: &gguf::GgufTensor| -> Vec<f32> {
        let data = &bytes[t.offset as usize..(t.offset + t.n_bytes) as usize];
        match t.ty {
            GgmlType::F32 => data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            GgmlType::BF16 => data
                .chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                .collect(),
            other => panic!("the BF16 example holds {other:?}"),
        }
    };
    let encode = |ty: GgmlType, x: &[f32]| -> Vec<u8> {
        match ty {
            GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            GgmlType::F16 => x
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
            GgmlType::BF16 => x
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
            _ => {
                let scheme = match ty {
                    GgmlType::Q8_0 => KvScheme::Q8_0,
                    GgmlType::Q5_1 => KvScheme::Q5_1,
                    GgmlType::Q5_0 => KvScheme::Q5_0,
                    GgmlType::Q4_1 => KvScheme::Q4_1,
                    GgmlType::Q4_0 => KvScheme::Q4_0,
                    GgmlType::IQ4_NL => KvScheme::Iq4Nl,
                    other => panic!("no encoder for {other:?}"),
                };
                let mut out = vec![0u8; x.len() / 32 * ty.type_size() as usize];
                for (block, o) in x
                    .chunks_exact(32)
                    .zip(out.chunks_exact_mut(ty.type_size() as usize))
                {
                    encode_block(scheme, block.try_into().unwrap(), o);
                }
                out
            }
        }
    };
    let mut names = Vec::new();
    for (suffix, weights, output, file_type) in QUANT_FILES {
        let tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = header
            .tensors
            .iter()
            .map(|t| {
                let x = f32_of(t);
                let ty = match (t.dims.len(), t.name.as_str()) {
                    (1, _) => GgmlType::F32,
                    (_, "output.weight") => output.unwrap_or(weights),
                    _ => weights,
                };
                (t.name.clone(), ty, t.dims.clone(), encode(ty, &x))
            })
            .collect();
        let views: Vec<(&str, GgmlType, &[u64], &[u8])> = tensors
            .iter()
            .map(|(n, t, d, b)| (n.as_str(), *t, d.as_slice(), b.as_slice()))
            .collect();
        let metadata: Vec<(&str, GgufValue)> = header
            .metadata
            .iter()
            .map(|(k, v)| match k.as_str() {
                "general.file_type" => (k.as_str(), GgufValue::U32(file_type)),
                _ => (k.as_str(), v.clone()),
            })
            .collect();
        let name = format!("shakespeare-{suffix}.gguf");
        std::fs::write(
            dir.join(&name),
            gguf::serialize(&metadata, &views, header.alignment),
        )
        .unwrap();
        names.push(name);
    }
    names
}
