#!/usr/bin/env python3
"""Helpers of runners/llamacpp/real_model.sh (the real model: SmolLM2-135M-Instruct).

    real_model.py tokenizer GGUF OUT_DIR   write OUT_DIR/tokenizer.json from the GGUF's own
                                           tokenizer (what llama.cpp tokenizes with)
    real_model.py check-f32 GGUF           fail unless every tensor of GGUF is F32

Run with gguf-py on sys.path (the script puts the pinned source's there).

The tokenizer: llama.cpp's `gpt2` BPE with the `smollm` pre-tokenizer (llama-vocab.cpp: digits
split one by one, then GPT-2's regex) is, in Hugging Face's terms, a byte-level BPE model with the
GGUF's vocabulary and merges behind a `Digits(individual_digits)` + `ByteLevel` pre-tokenizer, no
normalizer, and the GGUF's control tokens (token_type 3) as special added tokens. Any other
tokenizer.ggml.model or .pre is refused: the mapping is only claimed for this one.
"""

import json
import os
import sys

import gguf

CONTROL = 3


def field(reader, name):
    f = reader.fields.get(name)
    if f is None:
        sys.exit(f"{name}: missing from the GGUF")
    return f.contents()


def tokenizer(path, out_dir):
    r = gguf.GGUFReader(path)
    model, pre = field(r, "tokenizer.ggml.model"), field(r, "tokenizer.ggml.pre")
    if (model, pre) != ("gpt2", "smollm"):
        sys.exit(f"tokenizer {model}/{pre}: only gpt2/smollm is mapped to a tokenizer.json")
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    if len(tokens) != len(types) or len(set(tokens)) != len(tokens):
        sys.exit("tokenizer.ggml.tokens: not one type per token, or a token listed twice")
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, (t, ty) in enumerate(zip(tokens, types)) if ty == CONTROL
    ]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": list(merges)},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)


def check_f32(path):
    r = gguf.GGUFReader(path)
    other = [(t.name, t.tensor_type.name) for t in r.tensors
             if t.tensor_type != gguf.GGMLQuantizationType.F32]
    if other:
        sys.exit(f"{path}: not all F32: {other[:5]}")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "tokenizer":
        tokenizer(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "check-f32":
        check_f32(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
