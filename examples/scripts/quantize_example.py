#!/usr/bin/env python3
"""Quantize cardproof's example model into four real on-disk formats (numpy only, no torch).

Reads examples/models/shakespeare-bf16 (a ~4M-parameter Qwen3 decoder, all BF16) and writes, next
to it, one directory per format. Each directory gets a copy of tokenizer.json,
tokenizer_config.json and generation_config.json, and the safetensors variants a config.json with
the `quantization_config` their loaders (transformers / vLLM) read.

  shakespeare-w8a16/       compressed-tensors `int-quantized`, W8A16: the 7 linear projections of
                           every layer as `weight` I8 [out, in] + `weight_scale` BF16 [out, 1]
                           (symmetric, one scale per output row: absmax / 127.5, which is what
                           compressed-tensors' calculate_qparams gives for 8-bit symmetric;
                           q = clip(round_half_even(w / scale), -128, 127)).
  shakespeare-fp8-block/   fine-grained FP8 (`quant_method: fp8`, DeepSeek-V3 / Qwen3-FP8
                           layout): `weight` F8_E4M3 [out, in] + `weight_scale_inv` F32
                           [ceil(out/128), ceil(in/128)] = block absmax / 448;
                           q = float8_e4m3fn(clip(w / scale, -448, 448)), round to nearest even.
  shakespeare-awq-int4/    AWQ GEMM (`quant_method: awq`, 4 bits, group 128, zero point):
                           `qweight` I32 [in, out/8], `qzeros` I32 [in/128, out/8], `scales` F16
                           [in/128, out], nibbles in AutoAWQ's interleaved order.
                           NOTE: this is plain round-to-nearest asymmetric min/max quantization
                           written in AWQ's on-disk format. There is no activation-aware scale
                           search and no clipping search (no calibration data at all), so it is
                           "RTN in AWQ packaging", not AWQ the algorithm.
  shakespeare-q4_0-gguf/   model.gguf (GGUF v3, architecture `qwen3`, written with gguf-py's
                           GGUFWriter): linear weights Q4_0, token_embd / output Q8_0, norms F32,
                           metadata and tensor names as llama.cpp's convert_hf_to_gguf.py writes
                           them for Qwen3 (no Q/K permutation for qwen3).
  shakespeare-bf16-gguf/   the same GGUF layout with every matrix BF16 (the source's bits): the
                           reference llama.cpp runs the Q4_0 file against (`--runner llamacpp`).

Embeddings, norms and lm_head stay BF16 in the safetensors variants (bit-identical copies).
Everything is deterministic: the same input gives byte-identical outputs.

For each variant the script prints the file sizes and the relative RMS error
(||W_deq - W||_F / ||W||_F over all quantized weights) of the dequantized weights against BF16.

    python3 examples/scripts/quantize_example.py
    python3 examples/scripts/quantize_example.py --src DIR --out-root DIR
"""

import argparse
import json
import os
import shutil
import struct

import gguf
import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.normpath(os.path.join(HERE, "..", "models"))

LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")

# Versions recorded in the configs, as the real exporters stamp them.
COMPRESSED_TENSORS_VERSION = "0.12.2"

FP8_E4M3_MAX = 448.0
FP8_BLOCK = (128, 128)
AWQ_BITS = 4
AWQ_GROUP = 128
# AutoAWQ's packing order (awq/modules/linear/gemm.py, awq/utils/packing_utils.py AWQ_ORDER):
# nibble k (bits 4k..4k+3) of packed int32 column j holds logical output column 8*j + AWQ_ORDER[k].
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


# --------------------------------------------------------------------------------------------
# safetensors I/O (the format is tiny: u64 LE header length, JSON header, raw LE data)
# --------------------------------------------------------------------------------------------

_ST_DTYPES = {
    "BF16": np.dtype("<u2"),  # kept as raw bits; see bf16_to_f32
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "I8": np.dtype("i1"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "F8_E4M3": np.dtype("u1"),  # kept as raw bits
}


def read_safetensors(path):
    """Return {name: (dtype_str, ndarray of raw values)}; BF16 and F8 stay as raw bit patterns."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = _ST_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        arr = np.frombuffer(blob, dtype=dt, count=(end - begin) // dt.itemsize, offset=base + begin)
        out[name] = (info["dtype"], arr.reshape(info["shape"]))
    return out


def write_safetensors(path, tensors):
    """tensors: {name: (dtype_str, ndarray)}; written in name order, header padded to 8 bytes."""
    header = {"__metadata__": {"format": "pt"}}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        data = np.ascontiguousarray(arr).astype(_ST_DTYPES[dtype].newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * (-len(hbytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for c in chunks:
            f.write(c)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


# --------------------------------------------------------------------------------------------
# quantizers: each returns (on-disk tensors for one module, dequantized float32 weight)
# --------------------------------------------------------------------------------------------


def quant_int8_channel(w):
    """compressed-tensors W8A16: symmetric int8, one BF16 scale per output row."""
    absmax = np.abs(w).max(axis=1, keepdims=True)
    scale = np.maximum(absmax / np.float32(127.5), np.finfo(np.float32).eps).astype(np.float32)
    scale_bits = f32_to_bf16_bits(scale)
    s = bf16_to_f32(scale_bits)
    q = np.clip(np.rint(w / s), -128, 127).astype(np.int8)
    tensors = {"weight": ("I8", q), "weight_scale": ("BF16", scale_bits)}
    return tensors, q.astype(np.float32) * s


def quant_fp8_block(w, block=FP8_BLOCK):
    """Fine-grained FP8 E4M3 with one F32 dequant multiplier per 128x128 block."""
    out_f, in_f = w.shape
    br, bc = block
    nr, nc = -(-out_f // br), -(-in_f // bc)
    padded = np.zeros((nr * br, nc * bc), dtype=np.float32)
    padded[:out_f, :in_f] = w
    blocks = padded.reshape(nr, br, nc, bc)
    absmax = np.abs(blocks).max(axis=(1, 3))
    scale = (absmax / np.float32(FP8_E4M3_MAX)).astype(np.float32)
    scale = np.where(scale == 0, np.float32(1.0), scale)
    full = np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:out_f, :in_f]
    q = np.clip(w / full, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    tensors = {"weight": ("F8_E4M3", q.view(np.uint8)), "weight_scale_inv": ("F32", scale)}
    return tensors, q.astype(np.float32) * full


def awq_pack(values):
    """[rows, cols] ints in 0..15 -> [rows, cols/8] int32, AutoAWQ GEMM nibble order."""
    rows, cols = values.shape
    v = values.astype(np.uint32).reshape(rows, cols // 8, 8)
    packed = np.zeros((rows, cols // 8), dtype=np.uint32)
    for k, col in enumerate(AWQ_ORDER):
        packed |= v[:, :, col] << np.uint32(AWQ_BITS * k)
    return packed.view(np.int32)


def quant_awq_gemm(w, group=AWQ_GROUP):
    """Asymmetric 4-bit RTN per (output row, group of 128 input columns), AWQ GEMM layout."""
    out_f, in_f = w.shape
    assert in_f % group == 0 and out_f % 8 == 0, (out_f, in_f)
    g = w.reshape(out_f, in_f // group, group)
    wmax = g.max(axis=2)
    wmin = g.min(axis=2)
    max_int = 2**AWQ_BITS - 1
    scale = (np.maximum(wmax - wmin, np.float32(1e-5)) / np.float32(max_int)).astype(np.float16)
    s = scale.astype(np.float32)  # [out, groups]
    zero = np.clip(np.rint(-wmin / s), 0, max_int)  # [out, groups]
    q = np.clip(np.rint(g / s[:, :, None]) + zero[:, :, None], 0, max_int)  # [out, groups, group]
    deq = ((q - zero[:, :, None]) * s[:, :, None]).reshape(out_f, in_f).astype(np.float32)
    intweight = q.reshape(out_f, in_f).T.astype(np.uint32)  # [in, out]
    tensors = {
        "qweight": ("I32", awq_pack(intweight)),
        "qzeros": ("I32", awq_pack(zero.T.astype(np.uint32))),  # [groups, out] -> [groups, out/8]
        "scales": ("F16", np.ascontiguousarray(scale.T)),  # [groups, out]
    }
    return tensors, deq


# --------------------------------------------------------------------------------------------
# quantization_config blocks
# --------------------------------------------------------------------------------------------


def ct_w8a16_config():
    """What compressed-tensors' ModelCompressor.update_config writes for an llm-compressor W8A16
    run saved with quantization_format="int-quantized" (json.dump(..., sort_keys=True))."""
    weights = {
        "actorder": None,
        "block_structure": None,
        "dynamic": False,
        "group_size": None,
        "num_bits": 8,
        "observer": "minmax",
        "observer_kwargs": {},
        "strategy": "channel",
        "symmetric": True,
        "type": "int",
    }
    return {
        "config_groups": {
            "group_0": {
                "format": "int-quantized",
                "input_activations": None,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": weights,
            }
        },
        "format": "int-quantized",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": COMPRESSED_TENSORS_VERSION,
    }


def fp8_block_config():
    """The block the Qwen3-*-FP8 checkpoints carry (DeepSeek-V3 layout plus an exclusion list)."""
    return {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": ["lm_head"],
        "quant_method": "fp8",
        "weight_block_size": list(FP8_BLOCK),
    }


def awq_config():
    """AutoAWQ's AwqConfig.to_transformers_dict()."""
    return {
        "bits": AWQ_BITS,
        "group_size": AWQ_GROUP,
        "modules_to_not_convert": None,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    }


# --------------------------------------------------------------------------------------------
# writers
# --------------------------------------------------------------------------------------------


# The hybrid Qwen3.5 model's projections, by layer type. The Gated DeltaNet layers' in_proj_a and
# in_proj_b (one output per value head) stay BF16, as in the published Qwen3.5 quantizations whose
# FP8 targets are exactly the attention projections plus in_proj_qkv, in_proj_z and out_proj.
HYBRID_LINEARS = {
    "linear_attention": (
        "linear_attn.in_proj_qkv",
        "linear_attn.in_proj_z",
        "linear_attn.out_proj",
    ),
    "full_attention": (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
    ),
}
HYBRID_UNQUANTIZED = ("linear_attn.in_proj_a", "linear_attn.in_proj_b")
MLP_LINEARS = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def linear_names(cfg):
    if cfg["model_type"] == "qwen3":
        return [f"model.layers.{i}.{m}" for i in range(cfg["num_hidden_layers"]) for m in LINEARS]
    return [
        f"model.layers.{i}.{m}"
        for i, kind in enumerate(cfg["layer_types"])
        for m in HYBRID_LINEARS[kind] + MLP_LINEARS
    ]


def hybrid_ignore(qcfg):
    """The exclusion lists of a hybrid model's quantization_config: lm_head and the GDN gates."""
    qcfg = json.loads(json.dumps(qcfg))
    if qcfg["quant_method"] == "compressed-tensors":
        qcfg["ignore"] = ["lm_head"] + [f"re:.*{m}$" for m in HYBRID_UNQUANTIZED]
    else:
        qcfg["modules_to_not_convert"] = ["lm_head"] + [m.split(".")[1] for m in HYBRID_UNQUANTIZED]
    return qcfg


def copy_side_files(src, dst):
    for name in SIDE_FILES:
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


def write_config(dst, cfg, qcfg, dtype=None):
    cfg = json.loads(json.dumps(cfg))
    cfg["quantization_config"] = qcfg
    if dtype is not None:
        cfg["dtype"] = dtype
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


class ErrAcc:
    """Accumulates ||deq - w||^2 and ||w||^2 by group name."""

    def __init__(self):
        self.num = {}
        self.den = {}

    def add(self, group, w, deq):
        d = deq.astype(np.float64) - w.astype(np.float64)
        self.num[group] = self.num.get(group, 0.0) + float(np.sum(d * d))
        self.den[group] = self.den.get(group, 0.0) + float(np.sum(w.astype(np.float64) ** 2))

    def rel(self, groups=None):
        groups = list(self.num) if groups is None else groups
        return float(np.sqrt(sum(self.num[g] for g in groups) / sum(self.den[g] for g in groups)))


def proj_of(name):
    return name.rsplit(".", 1)[-1]


def write_safetensors_variant(src, dst, cfg, st, quantizer, qcfg, dtype=None):
    os.makedirs(dst, exist_ok=True)
    out = dict(st)  # pass-through entries (embeddings, norms, lm_head) keep their exact bits
    acc = ErrAcc()
    for mod in linear_names(cfg):
        dtype_str, bits = out.pop(mod + ".weight")
        assert dtype_str == "BF16", (mod, dtype_str)
        w = bf16_to_f32(bits)
        tensors, deq = quantizer(w)
        for suffix, t in tensors.items():
            out[f"{mod}.{suffix}"] = t
        acc.add(proj_of(mod), w, deq)
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    write_config(dst, cfg, qcfg, dtype)
    copy_side_files(src, dst)
    return acc


# GGUF --------------------------------------------------------------------------------------

GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_tensor_name(hf_name):
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    prefix = "model.layers."
    assert hf_name.startswith(prefix) and hf_name.endswith(".weight"), hf_name
    layer, rest = hf_name[len(prefix) : -len(".weight")].split(".", 1)
    return f"blk.{int(layer)}.{GGUF_NAMES[rest]}.weight"


def gguf_vocab(src):
    """tokens / token types / merges as convert_hf_to_gguf.py's _set_vocab_gpt2 lays them out."""
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    assert model["type"] == "BPE", model["type"]
    vocab = dict(model["vocab"])
    special = set()
    user = set()
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        (special if added.get("special") else user).add(added["id"])
    n = max(vocab.values()) + 1
    tokens = [None] * n
    for text, idx in vocab.items():
        tokens[idx] = text
    types = []
    for idx in range(n):
        if tokens[idx] is None:
            tokens[idx] = f"[PAD{idx}]"
            types.append(gguf.TokenType.UNUSED)
        elif idx in special:
            types.append(gguf.TokenType.CONTROL)
        elif idx in user:
            types.append(gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tok, tokens, types, merges, vocab


def write_gguf_variant(src, dst, cfg, st, kind="q4_0"):
    """kind "q4_0": linear weights Q4_0, token_embd / output Q8_0 (llama-quantize's Q4_0 mix);
    kind "bf16": every matrix BF16, the bits of the safetensors source (convert_hf_to_gguf.py
    --outtype bf16), the reference a llama.cpp measurement of the Q4_0 file runs against."""
    os.makedirs(dst, exist_ok=True)
    path = os.path.join(dst, "model.gguf")
    if kind == "bf16":
        qtype_linear = qtype_vocab = gguf.GGMLQuantizationType.BF16
        file_type = gguf.LlamaFileType.MOSTLY_BF16
    else:
        qtype_linear = gguf.GGMLQuantizationType.Q4_0
        qtype_vocab = gguf.GGMLQuantizationType.Q8_0
        file_type = gguf.LlamaFileType.MOSTLY_Q4_0

    w = gguf.GGUFWriter(path, "qwen3")
    # general.* (convert_hf_to_gguf.py writes these from its Metadata; llama-quantize adds the
    # quantization version and rewrites file_type)
    w.add_type("model")
    w.add_name(f"shakespeare-{kind}")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(int(file_type))
    # qwen3.* hyperparameters (TextModel.set_gguf_parameters)
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    # tokenizer.ggml.* (_set_vocab_gpt2 + SpecialVocab)
    tok, tokens, types, merges, vocab = gguf_vocab(src)
    assert len(tokens) == cfg["vocab_size"], (len(tokens), cfg["vocab_size"])
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        tcfg = json.load(f)
    w.add_tokenizer_model("gpt2")
    # ByteLevel pre-tokenizer with the GPT-2 split regex == llama.cpp's "gpt-2" pre-tokenizer.
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[tcfg["bos_token"]])
    w.add_eos_token_id(vocab[tcfg["eos_token"]])
    w.add_add_bos_token(False)  # the HF post-processor adds no BOS

    acc = ErrAcc()
    order = ["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        order += [
            p + "input_layernorm.weight",
            p + "self_attn.q_proj.weight",
            p + "self_attn.k_proj.weight",
            p + "self_attn.v_proj.weight",
            p + "self_attn.o_proj.weight",
            p + "self_attn.q_norm.weight",
            p + "self_attn.k_norm.weight",
            p + "post_attention_layernorm.weight",
            p + "mlp.gate_proj.weight",
            p + "mlp.up_proj.weight",
            p + "mlp.down_proj.weight",
        ]
    order += ["model.norm.weight", "lm_head.weight"]
    assert sorted(order) == sorted(st), sorted(set(st) ^ set(order))
    for hf_name in order:
        dtype_str, bits = st[hf_name]
        assert dtype_str == "BF16", (hf_name, dtype_str)
        x = bf16_to_f32(bits)
        name = gguf_tensor_name(hf_name)
        if x.ndim == 1:
            w.add_tensor(name, x.astype(np.float32))
            continue
        qt = qtype_vocab if hf_name in ("model.embed_tokens.weight", "lm_head.weight") else qtype_linear
        qdata = gguf.quants.quantize(x, qt)
        w.add_tensor(name, qdata, raw_dtype=qt)
        deq = gguf.quants.dequantize(qdata, qt).reshape(x.shape)
        group = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        acc.add(group, x, deq)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    copy_side_files(src, dst)
    return acc


# --------------------------------------------------------------------------------------------


def dir_report(path):
    files = sorted(os.listdir(path))
    sizes = {f: os.path.getsize(os.path.join(path, f)) for f in files}
    return sizes, sum(sizes.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=os.path.join(MODELS, "shakespeare-bf16"))
    ap.add_argument("--out-root", default=MODELS)
    ap.add_argument("--prefix", default="shakespeare",
                    help="the variants' directory names start with this (stagehand for the tool model)")
    args = ap.parse_args()
    p = args.prefix

    with open(os.path.join(args.src, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["model_type"] in ("qwen3", "qwen3_5_text"), cfg["model_type"]
    st = read_safetensors(os.path.join(args.src, "model.safetensors"))

    if cfg["model_type"] == "qwen3_5_text":
        variants = [
            (f"{p}-hybrid-w8a16", lambda d: write_safetensors_variant(
                args.src, d, cfg, st, quant_int8_channel, hybrid_ignore(ct_w8a16_config()))),
            (f"{p}-hybrid-fp8-block", lambda d: write_safetensors_variant(
                args.src, d, cfg, st, quant_fp8_block, hybrid_ignore(fp8_block_config()))),
        ]
    else:
        variants = [
            (f"{p}-w8a16", lambda d: write_safetensors_variant(
                args.src, d, cfg, st, quant_int8_channel, ct_w8a16_config())),
            (f"{p}-fp8-block", lambda d: write_safetensors_variant(
                args.src, d, cfg, st, quant_fp8_block, fp8_block_config())),
            (f"{p}-awq-int4", lambda d: write_safetensors_variant(
                args.src, d, cfg, st, quant_awq_gemm, awq_config(), dtype="float16")),
            (f"{p}-q4_0-gguf", lambda d: write_gguf_variant(args.src, d, cfg, st)),
            (f"{p}-bf16-gguf", lambda d: write_gguf_variant(args.src, d, cfg, st, "bf16")),
        ]
    src_sizes, src_total = dir_report(args.src)
    print(f"source {args.src}: model.safetensors {src_sizes['model.safetensors']:,} bytes")
    grand = src_total
    for name, fn in variants:
        dst = os.path.join(args.out_root, name)
        acc = fn(dst)
        sizes, total = dir_report(dst)
        grand += total
        print(f"\n{name}/  ({total:,} bytes)")
        for f, s in sizes.items():
            print(f"  {f:<24} {s:>12,}")
        groups = sorted(acc.num)
        linear_groups = [g for g in groups if g not in ("token_embd", "output")]
        print(f"  rel. RMS error, all quantized linear projections: {acc.rel(linear_groups):.5f}")
        for g in groups:
            print(f"    {g:<12} {acc.rel([g]):.5f}")
    print(f"\nexamples/models total (source + variants): {grand:,} bytes")


if __name__ == "__main__":
    main()
