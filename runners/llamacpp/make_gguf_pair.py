#!/usr/bin/env python3
"""A ~4B-parameter Qwen3-shaped GGUF reference with random weights, for timing the llama.cpp
runner on a GPU (runners/llamacpp/gpu_bench.sh; docs/benchmarks.md).

    python3 runners/llamacpp/make_gguf_pair.py --gguf-py DIR --tokenizer DIR --out FILE.gguf

Qwen3-4B's shape (hidden 2560, 36 layers, 32 query and 8 KV heads of 128, MLP 9728, vocabulary
151,936, untied output), every matrix N(0, 0.02) in BF16, norms 1. The tokenizer is the example
model's byte-level BPE (2,048 tokens, `--tokenizer`), its vocabulary padded to 151,936 with
unused entries, so the output head and the base streams have a real model's width while the
text tokenizes as the example's. Written with llama.cpp's own gguf-py (`--gguf-py`, the vendored
copy of the source the binary is built from); the candidate is `llama-quantize`'s Q4_0 of it.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

SHAPE = dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, ff=9728, vocab=151936)


def vocab_of(tokenizer_dir, n):
    """tokens / types / merges as convert_hf_to_gguf.py lays out a GPT-2-style BPE, padded to n."""
    import gguf

    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    model = tok["model"]
    vocab = dict(model["vocab"])
    special = set()
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        if added.get("special"):
            special.add(added["id"])
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
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        tcfg = json.load(f)
    return tokens, types, merges, vocab[tcfg["bos_token"]], vocab[tcfg["eos_token"]]


def add_qwen3_metadata(w, gguf, s, name, file_type, tokenizer_dir):
    """A Qwen3 model's GGUF metadata for shape `s` (SHAPE's keys), with the example tokenizer
    padded to the shape's vocabulary; no BOS added (as the example's)."""
    tokens, types, merges, bos, eos = vocab_of(tokenizer_dir, s["vocab"])
    w.add_type("model")
    w.add_name(name)
    w.add_file_type(int(file_type))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(s["layers"])
    w.add_context_length(40960)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ff"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def bf16(shape, gen):
    """N(0, 0.02) on the GPU (where there is one), as BF16 bit patterns (uint16) on the host."""
    x = torch.randn(shape, generator=gen, device=DEVICE, dtype=torch.float32) * 0.02
    return x.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-py", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=SHAPE["layers"])
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf

    s = dict(SHAPE, layers=args.layers)
    w = gguf.GGUFWriter(args.out, "qwen3")
    add_qwen3_metadata(w, gguf, s, "cardproof-bench-qwen3-4b-random",
                       gguf.LlamaFileType.MOSTLY_BF16, args.tokenizer)

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    bf = gguf.GGMLQuantizationType.BF16
    h, hd, ff, v = s["hidden"], s["head_dim"], s["ff"], s["vocab"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", bf16((v, h), gen), raw_dtype=bf)
    for i in range(s["layers"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(h))
        w.add_tensor(p + "attn_q.weight", bf16((q, h), gen), raw_dtype=bf)
        w.add_tensor(p + "attn_k.weight", bf16((kv, h), gen), raw_dtype=bf)
        w.add_tensor(p + "attn_v.weight", bf16((kv, h), gen), raw_dtype=bf)
        w.add_tensor(p + "attn_output.weight", bf16((h, q), gen), raw_dtype=bf)
        w.add_tensor(p + "attn_q_norm.weight", ones(hd))
        w.add_tensor(p + "attn_k_norm.weight", ones(hd))
        w.add_tensor(p + "ffn_norm.weight", ones(h))
        w.add_tensor(p + "ffn_gate.weight", bf16((ff, h), gen), raw_dtype=bf)
        w.add_tensor(p + "ffn_up.weight", bf16((ff, h), gen), raw_dtype=bf)
        w.add_tensor(p + "ffn_down.weight", bf16((h, ff), gen), raw_dtype=bf)
    w.add_tensor("output_norm.weight", ones(h))
    w.add_tensor("output.weight", bf16((v, h), gen), raw_dtype=bf)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    n = sum(t.n_elements for t in gguf.GGUFReader(args.out).tensors)
    print(f"wrote {args.out}: {n / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main()
