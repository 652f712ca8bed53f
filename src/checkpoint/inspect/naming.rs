//! Module naming conventions: tensor suffixes and model-part buckets.
//!
//! Which role a tensor plays in its module (weight, packed weight, scale, zero point, quant
//! state...) follows from its name's suffix, and which part of the model a module belongs to
//! (attention, experts, router, embeddings...) from its name's parts, across Hugging Face,
//! compressed-tensors, ModelOpt, MLX, bitsandbytes and GGUF conventions. These are tables of
//! names, independent of any file format's bytes, so they live apart from the readers.

use super::Bucket;

/// Module suffixes, longest first, with their role in the module.
const SUFFIXES: &[(&str, Role)] = &[
    ("weight.quant_state.bitsandbytes__nf4", Role::QuantState),
    ("weight.quant_state.bitsandbytes__fp4", Role::QuantState),
    ("weight.nested_quant_map", Role::Aux),
    ("weight.nested_absmax", Role::Aux),
    ("weight.quant_map", Role::Aux),
    ("weight.absmax", Role::Aux),
    ("weight_global_scale", Role::GlobalScale),
    ("weight_zero_point", Role::Zeros),
    ("weight_scale_inv", Role::ScaleInv),
    ("weight_scale_2", Role::Scale2),
    ("weight_packed", Role::Packed),
    ("weight_format", Role::Meta),
    ("weight_g_idx", Role::Index),
    ("weight_shape", Role::Shape),
    ("weight_scale", Role::Scale),
    ("input_global_scale", Role::InputGlobalScale),
    ("pre_quant_scale", Role::Aux),
    ("output_scale", Role::Activation),
    ("input_scale", Role::InputScale),
    ("k_scale", Role::KvScale),
    ("v_scale", Role::KvScale),
    ("qweight", Role::QWeight),
    ("qzeros", Role::Zeros),
    ("scales", Role::Scale),
    ("biases", Role::Zeros),
    ("g_idx", Role::Index),
    ("weight", Role::Weight),
    ("bias", Role::Bias),
    ("SCB", Role::Scale),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Weight,
    Packed,
    QWeight,
    Blocks,
    Scale,
    ScaleInv,
    Scale2,
    GlobalScale,
    Zeros,
    Index,
    Shape,
    Aux,
    QuantState,
    Meta,
    InputScale,
    InputGlobalScale,
    Activation,
    KvScale,
    Bias,
}

impl Role {
    /// Tensors whose bytes count towards a module's bits per weight.
    pub(super) fn is_weight_storage(self) -> bool {
        matches!(
            self,
            Role::Weight
                | Role::Packed
                | Role::QWeight
                | Role::Blocks
                | Role::Scale
                | Role::ScaleInv
                | Role::Scale2
                | Role::GlobalScale
                | Role::Zeros
                | Role::Index
                | Role::Aux
        )
    }

    /// Only these make a module quantized: activation and KV-cache scales next to a BF16 weight do
    /// not.
    pub(super) fn is_weight_scale(self) -> bool {
        matches!(
            self,
            Role::Scale
                | Role::ScaleInv
                | Role::Scale2
                | Role::GlobalScale
                | Role::Zeros
                | Role::Aux
                | Role::QuantState
        )
    }
}

/// Split a tensor name into (module prefix, role).
pub(super) fn split_name(name: &str) -> (&str, Role) {
    for (suffix, role) in SUFFIXES {
        if let Some(prefix) = name.strip_suffix(suffix)
            && let Some(prefix) = prefix.strip_suffix('.')
        {
            return (prefix, *role);
        }
    }
    // gpt-oss MXFP4 experts: `...experts.gate_up_proj_blocks` / `_scales` / `_bias`.
    for (suffix, role) in [
        ("_blocks", Role::Blocks),
        ("_scales", Role::Scale),
        ("_bias", Role::Bias),
    ] {
        if let Some(prefix) = name.strip_suffix(suffix)
            && prefix.ends_with("_proj")
        {
            return (prefix, role);
        }
    }
    // Fused expert weights without a `.weight` suffix (`...experts.down_proj`, 3-D).
    if name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.ends_with("_proj"))
    {
        return (name, Role::Weight);
    }
    (name, Role::Meta)
}

pub(super) fn bucket_of(name: &str, mtp_layer: Option<u64>) -> Bucket {
    let parts: Vec<&str> = name.split('.').collect();
    let has = |p: &str| parts.contains(&p);
    let last = parts.last().copied().unwrap_or_default();
    if name.contains("embed_tokens")
        || has("wte")
        || has("tok_embeddings")
        || has("word_embeddings")
        || has("token_embd")
    {
        return Bucket::Embeddings;
    }
    if last == "lm_head" || name == "output" || last == "embed_out" {
        return Bucket::LmHead;
    }
    let layer = parts
        .windows(2)
        .find(|w| w[0] == "layers" || w[0] == "blk" || w[0] == "h")
        .and_then(|w| w[1].parse::<u64>().ok());
    if has("mtp") || name.contains("nextn") || (layer.is_some() && layer == mtp_layer) {
        return Bucket::Mtp;
    }
    if has("visual") || has("vision_tower") || has("vision_model") || has("vision") {
        return Bucket::Vision;
    }
    if has("linear_attn") || last.starts_with("ssm_") || has("mamba") || has("mixer") {
        return Bucket::LinearAttention;
    }
    if has("shared_expert")
        || has("shared_experts")
        || last == "shared_expert_gate"
        || last.ends_with("_shexp")
    {
        return Bucket::MoeSharedExpert;
    }
    if last == "gate" && (has("mlp") || has("block_sparse_moe"))
        || last == "router"
        || last == "ffn_gate_inp"
    {
        return Bucket::MoeRouter;
    }
    if has("experts") || last.ends_with("_exps") {
        return Bucket::MoeExperts;
    }
    if has("self_attn") || has("attention") || has("attn") || last.starts_with("attn_") {
        return Bucket::Attention;
    }
    if has("mlp") || has("feed_forward") || has("ffn") || last.starts_with("ffn_") {
        return Bucket::Mlp;
    }
    Bucket::Other
}

/// A GGUF tensor's bucket. In the hybrid Gated DeltaNet architectures (`qwen35`, `qwen35moe`,
/// `qwen3next`) `attn_qkv` and `attn_gate` are the GDN layer's projections (`in_proj_qkv` or the
/// `q k v` part of `in_proj_qkvz`, and `in_proj_z`), not attention; blocks from `mtp_from` on are
/// the MTP (`nextn`) blocks the converter appends.
pub(super) fn gguf_bucket(name: &str, architecture: &str, mtp_from: Option<u64>) -> Bucket {
    let parts: Vec<&str> = name.split('.').collect();
    let layer = match parts[..] {
        ["blk", n, ..] => n.parse::<u64>().ok(),
        _ => None,
    };
    if let (Some(l), Some(first)) = (layer, mtp_from)
        && l >= first
    {
        return Bucket::Mtp;
    }
    let hybrid = matches!(architecture, "qwen35" | "qwen35moe" | "qwen3next");
    if hybrid && matches!(parts.last(), Some(&"attn_qkv") | Some(&"attn_gate")) {
        return Bucket::LinearAttention;
    }
    bucket_of(name, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_names() {
        assert_eq!(bucket_of("lm_head", None), Bucket::LmHead);
        assert_eq!(bucket_of("model.embed_tokens", None), Bucket::Embeddings);
        assert_eq!(
            bucket_of("model.layers.0.self_attn.q_proj", None),
            Bucket::Attention
        );
        assert_eq!(
            bucket_of("model.layers.0.linear_attn.in_proj_qkvz", None),
            Bucket::LinearAttention
        );
        assert_eq!(
            bucket_of("model.layers.0.mlp.gate", None),
            Bucket::MoeRouter
        );
        assert_eq!(bucket_of("model.layers.0.mlp.gate_proj", None), Bucket::Mlp);
        assert_eq!(
            bucket_of("model.layers.0.mlp.experts.3.down_proj", None),
            Bucket::MoeExperts
        );
        assert_eq!(
            bucket_of("model.layers.61.self_attn.q_proj", Some(61)),
            Bucket::Mtp
        );
        assert_eq!(bucket_of("mtp.layers.0.mlp.up_proj", None), Bucket::Mtp);
        assert_eq!(bucket_of("blk.3.attn_q", None), Bucket::Attention);
        assert_eq!(bucket_of("blk.3.ffn_gate_inp", None), Bucket::MoeRouter);
        assert_eq!(bucket_of("blk.3.ffn_up_exps", None), Bucket::MoeExperts);
        assert_eq!(bucket_of("blk.3.ssm_out", None), Bucket::LinearAttention);
        assert_eq!(bucket_of("output", None), Bucket::LmHead);
        assert_eq!(bucket_of("token_embd", None), Bucket::Embeddings);
    }

    #[test]
    fn the_hybrid_familys_modules_have_their_own_buckets() {
        for (name, bucket) in [
            (
                "model.language_model.layers.0.linear_attn.in_proj_qkv",
                Bucket::LinearAttention,
            ),
            (
                "model.language_model.layers.0.linear_attn.in_proj_z",
                Bucket::LinearAttention,
            ),
            (
                "model.language_model.layers.0.linear_attn.in_proj_a",
                Bucket::LinearAttention,
            ),
            (
                "model.language_model.layers.0.linear_attn.conv1d",
                Bucket::LinearAttention,
            ),
            (
                "model.layers.0.linear_attn.in_proj_ba",
                Bucket::LinearAttention,
            ),
            (
                "model.language_model.layers.3.self_attn.q_proj",
                Bucket::Attention,
            ),
            (
                "model.language_model.layers.0.mlp.experts.gate_up_proj",
                Bucket::MoeExperts,
            ),
            ("model.layers.0.mlp.experts.7.up_proj", Bucket::MoeExperts),
            ("model.layers.0.mlp.gate", Bucket::MoeRouter),
            (
                "model.layers.0.mlp.shared_expert.down_proj",
                Bucket::MoeSharedExpert,
            ),
            (
                "model.layers.0.mlp.shared_expert_gate",
                Bucket::MoeSharedExpert,
            ),
            (
                "model.layers.0.mlp.shared_experts.up_proj",
                Bucket::MoeSharedExpert,
            ),
            ("mtp.layers.0.mlp.experts.0.up_proj", Bucket::Mtp),
            ("mtp.fc", Bucket::Mtp),
            ("model.visual.blocks.0.attn.qkv", Bucket::Vision),
            ("model.visual.merger.linear_fc1", Bucket::Vision),
            ("blk.0.ffn_up_shexp", Bucket::MoeSharedExpert),
            ("blk.0.ffn_gate_inp_shexp", Bucket::MoeSharedExpert),
            ("blk.0.ffn_gate_inp", Bucket::MoeRouter),
        ] {
            assert_eq!(bucket_of(name, None), bucket, "{name}");
        }
        assert_eq!(
            gguf_bucket("blk.0.attn_qkv", "qwen35", None),
            Bucket::LinearAttention
        );
        assert_eq!(
            gguf_bucket("blk.0.attn_gate", "qwen3next", None),
            Bucket::LinearAttention
        );
        assert_eq!(
            gguf_bucket("blk.3.attn_q", "qwen35", None),
            Bucket::Attention
        );
        // Elsewhere a fused `attn_qkv` is attention (phi3, qwen3vl).
        assert_eq!(
            gguf_bucket("blk.0.attn_qkv", "phi3", None),
            Bucket::Attention
        );
        assert_eq!(
            gguf_bucket("blk.64.attn_q", "qwen35", Some(64)),
            Bucket::Mtp
        );
        assert_eq!(
            gguf_bucket("blk.63.attn_q", "qwen35", Some(64)),
            Bucket::Attention
        );
        for b in Bucket::ALL {
            assert_eq!(Bucket::from_name(b.as_str()), Some(b));
        }
    }

    #[test]
    fn tensor_names_split_into_module_and_role() {
        assert_eq!(split_name("a.b.weight_scale_inv"), ("a.b", Role::ScaleInv));
        assert_eq!(
            split_name("a.b.weight.quant_state.bitsandbytes__nf4"),
            ("a.b", Role::QuantState)
        );
        assert_eq!(
            split_name("m.experts.gate_up_proj_blocks"),
            ("m.experts.gate_up_proj", Role::Blocks)
        );
        assert_eq!(split_name("m.norm.weight"), ("m.norm", Role::Weight));
    }
}
