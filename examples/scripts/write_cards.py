#!/usr/bin/env python3
"""Write the README.md card of each quantized example model from a `cardproof measure` run.

For every candidate under examples/models, runs

    cardproof measure --reference examples/models/shakespeare-bf16 --candidate <it>
        --eval-text examples/data/eval.txt --context-length 256 --bos none --positions all

and writes <it>/README.md: Hub metadata, the `fidelity:` block measurement.json carries (its
claims are the measured numbers), completed with what a local measurement cannot know: where the
reference and candidate live. The examples live in this repository, so their `repo` is their path
here and their `revision` the commit that added the weights (REVISION below).

    python3 examples/scripts/write_cards.py [--cardproof PATH]   # default: the release binary
                                                                 # in $CARGO_TARGET_DIR or target/
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODELS = os.path.join("examples", "models")
REFERENCE = "shakespeare-bf16"
# The commit of this repository that added examples/models (weights and tokenizer).
REVISION = "aebc08a6edbab4465a99260c28646dfe1034e3b9"
# The hybrid (Gated DeltaNet) example: its reference and the commit that added its weights.
HYBRID_REFERENCE = "shakespeare-hybrid-bf16"
HYBRID_REVISION = "865481ed8a5ae63c786b2d6fa270382f5d3eae6a"
DENSE_ABOUT = ("cardproof's 4.2M-parameter example model\n(Qwen3 architecture, trained on Tiny "
               "Shakespeare by `examples/scripts/train_example.py`)")
HYBRID_ABOUT = ("cardproof's 1.4M-parameter hybrid example model\n(Qwen3.5 architecture: three "
                "Gated DeltaNet layers then one gated full-attention layer, trained on Tiny "
                "Shakespeare by `examples/scripts/train_example.py --arch qwen3_5`)")
# What the hybrid quantizations keep in BF16 besides lm_head and the embedding: the GDN layers'
# beta and decay projections (one output per value head).
HYBRID_KEPT = ["lm_head", "model.embed_tokens", "model.layers.*.linear_attn.in_proj_a",
               "model.layers.*.linear_attn.in_proj_b"]

CANDIDATES = {
    "shakespeare-w8a16": {
        "title": "INT8 weights per output channel (compressed-tensors W8A16)",
        "quantization": {"method": "int8-channel", "weights": "int8", "activations": "bf16",
                          "symmetric": True, "high_precision_modules": ["lm_head", "model.embed_tokens"],
                          "tool": "examples/scripts/quantize_example.py"},
        "tags": ["compressed-tensors", "int8", "w8a16"],
        "library": "transformers",
    },
    "shakespeare-fp8-block": {
        "title": "FP8 E4M3 weights in 128x128 blocks, dynamic FP8 activations (fine-grained FP8)",
        "quantization": {"method": "fp8-block", "weights": "fp8_e4m3", "activations": "dynamic-fp8",
                          "group": [128, 128], "symmetric": True,
                          "high_precision_modules": ["lm_head", "model.embed_tokens"],
                          "tool": "examples/scripts/quantize_example.py"},
        "tags": ["fp8"],
        "library": "transformers",
        # Emulated FP8 activation quantization is discontinuous: f32 rounding that differs between
        # CPUs (AVX2 vs AVX-512 kernels) flips quantization steps and moves the KLD by percents,
        # so this card is measured (and verified) in f64, where such flips practically vanish.
        "measure": ["--compute-dtype", "f64"],
    },
    "shakespeare-awq-int4": {
        "title": "INT4 weights in groups of 128 with zero points, AWQ GEMM layout (round-to-nearest)",
        "quantization": {"method": "int4-awq", "weights": "int4", "activations": "fp16", "group": 128,
                          "symmetric": False, "high_precision_modules": ["lm_head", "model.embed_tokens"],
                          "tool": "examples/scripts/quantize_example.py (round-to-nearest, no activation-aware search)"},
        "tags": ["awq", "int4"],
        "library": "transformers",
    },
    "shakespeare-q4_0-gguf": {
        "title": "GGUF Q4_0 (token embedding and output in Q8_0)",
        "quantization": {"method": "q4_0", "weights": "q4_0", "high_precision_modules": [],
                          "tool": "examples/scripts/quantize_example.py (gguf-py quantizers)"},
        "tags": ["gguf", "q4_0"],
        "library": "gguf",
    },
    "shakespeare-hybrid-w8a16": {
        "title": "INT8 weights per output channel (compressed-tensors W8A16)",
        "reference": HYBRID_REFERENCE,
        "revision": HYBRID_REVISION,
        "about": HYBRID_ABOUT,
        "quantization": {"method": "int8-channel", "weights": "int8", "activations": "bf16",
                          "symmetric": True, "high_precision_modules": HYBRID_KEPT,
                          "tool": "examples/scripts/quantize_example.py"},
        "tags": ["compressed-tensors", "int8", "w8a16", "gated-deltanet"],
        "library": "transformers",
    },
    "shakespeare-hybrid-fp8-block": {
        "title": "FP8 E4M3 weights in 128x128 blocks, dynamic FP8 activations (fine-grained FP8)",
        "reference": HYBRID_REFERENCE,
        "revision": HYBRID_REVISION,
        "about": HYBRID_ABOUT,
        "quantization": {"method": "fp8-block", "weights": "fp8_e4m3", "activations": "dynamic-fp8",
                          "group": [128, 128], "symmetric": True,
                          "high_precision_modules": HYBRID_KEPT,
                          "tool": "examples/scripts/quantize_example.py"},
        "tags": ["fp8", "gated-deltanet"],
        "library": "transformers",
        # As for the dense FP8 example: emulated FP8 activations are measured in f64.
        "measure": ["--compute-dtype", "f64"],
    },
}


class Quoted(str):
    pass


def quoted_representer(dumper, data):
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')


yaml.SafeDumper.add_representer(Quoted, quoted_representer)


def quote_digests(v):
    """Revisions and digests are quoted: an all-digit hex string would read as a number."""
    if isinstance(v, dict):
        return {k: quote_digests(x) for k, x in v.items()}
    if isinstance(v, list):
        return [quote_digests(x) for x in v]
    if isinstance(v, str) and len(v) in (40, 64) and all(c in "0123456789abcdef" for c in v):
        return Quoted(v)
    return v


def measure(cardproof, candidate, reference, out, extra):
    cmd = [cardproof, "measure", "--reference", os.path.join(MODELS, reference),
           "--candidate", os.path.join(MODELS, candidate), "--eval-text", "examples/data/eval.txt",
           "--context-length", "256", "--bos", "none", "--positions", "all", "--out", out, "--json"] + extra
    print("$ " + " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def card(name, spec, doc):
    reference = spec.get("reference", REFERENCE)
    revision = spec.get("revision", REVISION)
    f = doc["fidelity"]
    f["reference"] = {"repo": f"{MODELS}/{reference}", "revision": revision, **f["reference"]}
    f["candidate"] = {"repo": f"{MODELS}/{name}", "revision": revision, **f["candidate"]}
    q = f.setdefault("quantization", {})
    q.update(spec["quantization"])
    f["calibration"] = {"dataset": "none"}
    # A path relative to the repository root: `cardproof verify` reads the text from it.
    f["eval"]["text"]["source"] = "examples/data/eval.txt"
    f["eval"]["tokenizer"] = {"repo": f"{MODELS}/{reference}", "revision": revision}
    ordered = {k: f[k] for k in ("schema", "reference", "candidate", "quantization", "calibration",
                                 "runtime", "eval", "protocol", "results") if k in f}
    meta = {
        "license": "apache-2.0",
        "library_name": spec["library"],
        "pipeline_tag": "text-generation",
        "base_model": f"{MODELS}/{reference}",
        "base_model_relation": "quantized",
        "tags": spec["tags"],
        "fidelity": quote_digests(ordered),
    }
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=100)
    run = doc["runs"][0]
    m, u = run["metrics"], run["uncertainty"]

    def ci(name):
        lo, hi = u[name]["ci95"]
        return f"[{lo:.4g}, {hi:.4g}]"

    body = f"""
# {name}

{spec['title']} of [{reference}](../{reference}), {spec.get('about', DENSE_ABOUT)}. Made by
`examples/scripts/quantize_example.py`; this card by `examples/scripts/write_cards.py` from a
`cardproof measure` run.

## Fidelity

Measured by cardproof's native CPU runner (reference semantics: weights dequantized exactly,
declared activation quantization emulated, {doc['environment']['compute_dtype']} compute) against the BF16 reference, on
`examples/data/eval.txt` ({doc['eval']['token_count']} tokens, no BOS), windows of
{run['context_length']} tokens, every position ({run['n_positions']} rows), full vocabulary,
forward KL in nats, 95% intervals from a block bootstrap over the {run['n_windows']} windows:

| metric | value | 95% CI |
|---|---|---|
| mean KLD | {m['kld_mean']:.4g} | {ci('kld_mean')} |
| p99 KLD | {m['kld_p99']:.4g} | {ci('kld_p99')} |
| mean reverse KLD | {m['kld_reverse_mean']:.4g} | {ci('kld_reverse_mean')} |
| top-1 agreement | {m['top1_agreement']:.4f} | {ci('top1_agreement')} |
| PPL ratio (candidate / reference) | {m['ppl_ratio']:.4f} | {ci('ppl_ratio')} |

The exact protocol is in the card's `fidelity:` metadata.

*An example model for testing cardproof; it is not useful for anything else.*
"""
    return f"---\n{front}---\n{body}"


def main():
    ap = argparse.ArgumentParser()
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    ap.add_argument("--cardproof", default=os.path.join(target, "release", "cardproof"))
    ap.add_argument("--only", action="append", choices=sorted(CANDIDATES),
                    help="write only this candidate's card (repeatable; default: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in CANDIDATES.items():
            if args.only and name not in args.only:
                continue
            doc = measure(os.path.abspath(args.cardproof), name, spec.get("reference", REFERENCE),
                          os.path.join(tmp, name), spec.get("measure", []))
            path = os.path.join(ROOT, MODELS, name, "README.md")
            with open(path, "w", encoding="utf-8") as f:
                f.write(card(name, spec, doc))
            print(f"wrote {os.path.relpath(path, ROOT)}: kld_mean {doc['runs'][0]['metrics']['kld_mean']:.4g}",
                  file=sys.stderr)


if __name__ == "__main__":
    main()
