#!/usr/bin/env python3
"""GPU benchmark of `cardproof study` in the transformers runner (issue #20; docs/benchmarks.md).

    python3 runners/gpu/study_bench.py --cardproof PATH --out DIR [--length 32768] [--arms 3]

A ~4B-parameter Qwen3-shaped reference with random weights (runners/bench_gpu.py's shape) and
`--arms` candidates, each the reference with multiplicative noise of another size on every
matrix (0.5%, 1%, 2%, ...: standing in for quantizations of different precision), saved as
safetensors with a synthetic word-level tokenizer over the full vocabulary; an eval text of
random words; then, on one GPU:

- the floor: one bare prefill (base model, no output head, one pass) of the window for each
  model, the reference and every arm (arms + 1 passes), each timed after a warm-up with CUDA
  synchronization, the models loaded one at a time;
- `cardproof study` with `runner: transformers`, every row of the window scored, the controls
  off: one program run, the reference's hidden states kept for every arm. Its compute is the
  runner's own timings (prefill + output head and reduction), its wall time the whole command
  (loading and warm-up included).

Prints a Markdown table and writes study_bench.json into --out.
"""

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_gpu  # noqa: E402


def tokenizer_json(vocab):
    """A word-level tokenizer: token i is the word `t<i>`, words split at whitespace."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": "t0"},
    }


def make_models(root, length, arms):
    """The reference and the arms' checkpoints (skipped when present)."""
    dirs = [os.path.join(root, "reference")] + [os.path.join(root, f"arm{i}") for i in range(arms)]
    if all(os.path.exists(os.path.join(d, "config.json")) for d in dirs):
        return dirs
    model = bench_gpu.new_model("dense", length + 64)
    vocab = model.config.vocab_size
    tok = tokenizer_json(vocab)
    original = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() == 2}
    for i, d in enumerate(dirs):
        with torch.no_grad():
            scale = 0.0 if i == 0 else 0.005 * 2 ** (i - 1)
            g = torch.Generator(device="cuda").manual_seed(i)
            for n, p in model.named_parameters():
                if p.dim() == 2:
                    p.copy_(original[n] * (1 + scale * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype)))
        model.save_pretrained(d, safe_serialization=True)
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tok, f)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
        print(f"saved {d} (noise {scale})", flush=True)
    del model, original
    gc.collect()
    torch.cuda.empty_cache()
    return dirs


def floor(dirs, ids):
    """One bare prefill per model of the window, warmed up first; seconds per model."""
    out = []
    for d in dirs:
        m = bench_gpu.load(d)
        bench_gpu.floor_pass(m, ids[:, :2048], 0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        bench_gpu.floor_pass(m, ids, 0)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
        del m
        gc.collect()
        torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cardproof", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/cardproof-study-bench")
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--arms", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dirs = make_models(a.work, a.length, a.arms)
    vocab = json.load(open(os.path.join(dirs[0], "config.json")))["vocab_size"]
    rng = random.Random(0)
    words = [f"t{rng.randrange(1, vocab)}" for _ in range(a.length + 16)]
    text = os.path.join(a.work, "eval.txt")
    with open(text, "w") as f:
        f.write(" ".join(words))
    ids = torch.tensor([[int(w[1:]) for w in words[: a.length]]], device="cuda")
    passes = floor(dirs, ids)
    study = os.path.join(a.work, "study.yaml")
    arms = "\n".join(f"  - {{name: arm{i}, candidate: {d}, changes: weights}}" for i, d in enumerate(dirs[1:]))
    with open(study, "w") as f:
        f.write(
            f"study: cardproof/study-v1\nname: gpu-4b\nreference: {dirs[0]}\neval: {{text: {text}}}\n"
            f"protocol: {{context_lengths: [{a.length}], resamples: 200}}\nrunner: transformers\n"
            f"transformers: {{device: cuda}}\ncontrols: {{repeatability: false, noise_floor: false}}\narms:\n{arms}\n"
        )
    t = time.perf_counter()
    r = subprocess.run([a.cardproof, "study", study, "--out", os.path.join(a.work, "out"), "--force", "--json"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        print(r.stderr, flush=True)
        sys.exit(r.returncode)
    doc = json.loads(r.stdout)
    m = json.load(open(os.path.join(a.work, "out", "arms", "arm0", "measurement.json")))
    timings = m["environment"]["transformers_runner"].get("timings_s", {})
    compute = timings.get("prefill", 0) + timings.get("head_and_reduce", 0)
    result = {
        "length": a.length,
        "arms": a.arms,
        "floor_passes_s": passes,
        "floor_s": sum(passes),
        "runner_timings_s": timings,
        "compute_s": compute,
        "compute_over_floor": compute / sum(passes),
        "wall_s": wall,
        "wall_over_floor": wall / sum(passes),
        "study_timings": doc["timings"],
        "arms_kld_mean": {x["name"]: x["runs"][0]["metrics"]["kld_mean"] for x in doc["arms"]},
        "arm_seconds": {x["name"]: x["seconds"] for x in doc["arms"]},
        "device": doc["device"],
    }
    with open(os.path.join(a.out, "study_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    print(f"| floor ({a.arms + 1} bare prefills of {a.length}) | study compute | ratio | study wall |")
    print(f"| {sum(passes):.2f} s | {compute:.2f} s | {compute / sum(passes):.3f}x | {wall:.1f} s |")


if __name__ == "__main__":
    main()
