#!/usr/bin/env python3
"""The native runner against llama.cpp and torch + transformers on the same CPU (issue #22;
docs/benchmarks.md). Both passes of a KLD measurement, same text, same threads, interleaved:

    python3 benches/cpu_peers.py [--cardproof target/release/cardproof] [--threads 1,2]
                                 [--repeats 3] [--candidates q8_0,q4_0] [--work DIR]

The pair: Qwen3-0.6B's shape (hidden 1024, 28 layers, 16 query and 8 KV heads of 128, MLP 3072,
vocabulary 151,936, tied embeddings; 0.44B parameters outside the embeddings), random N(0, 0.02)
weights, written by llama.cpp's own gguf-py (the pinned source runners/llamacpp/build.sh builds
from) as an F32 GGUF reference and Q8_0 / Q4_0 GGUF candidates (gguf-py's reference quantizers;
every matrix quantized, norms kept F32), and as safetensors for torch (the reference in F32, the
Q8_0 candidate dequantized to F32: the computation cardproof does). The tokenizer is the example
model's byte-level BPE padded to 151,936 entries. The text: the first 2,048+ tokens of
tinyshakespeare, 4 windows of 512, the second half of each scored (llama.cpp's protocol, which
computes the output head only on those rows; cardproof and the torch script do the same).

Runs, each as its own process (wall time; peak RSS from GNU time):
  - cardproof: `measure --reference REF --candidate CAND --positions second-half --vocab
    threshold --threads T` (the native runner, both passes, bootstrap and all outputs);
  - llama.cpp: `llama-perplexity -t T --kl-divergence-base` on the reference, then
    `--kl-divergence` on the candidate (its own two-pass workflow; peak RSS is the larger);
  - torch: transformers' Qwen3ForCausalLM in f32, `torch.set_num_threads(T)`, both models over
    the same windows, the head on the scored rows, the KL reduced on them.
The machine's f32 GEMM peak is OpenBLAS's (numpy's) best rate at T threads over the model's own
shapes; each runner's GFLOP/s counts the matrix products of both passes (projections, QK^T and
PV, the head on the scored rows) over its wall time. Prints a Markdown table and writes
DIR/cpu_peers.json.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = dict(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, ff=3072, vocab=151936)
N_CTX = 512
N_TOKENS = 2048
TOKENIZER_DIR = os.path.join(REPO, "examples/models/shakespeare-bf16")


def gguf_py():
    path = subprocess.run(
        [os.path.join(REPO, "runners/llamacpp/build.sh"), "--gguf-py"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    sys.path.insert(0, path)
    import gguf

    return gguf


def weights(seed=0):
    """The reference's tensors (GGUF names, f32), N(0, 0.02), norms 1."""
    s = SHAPE
    rng = np.random.default_rng(seed)
    h, hd, ff, v = s["hidden"], s["head_dim"], s["ff"], s["vocab"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)

    out = {"token_embd.weight": mat(v, h)}
    for i in range(s["layers"]):
        p = f"blk.{i}."
        out[p + "attn_norm.weight"] = np.ones(h, np.float32)
        out[p + "attn_q.weight"] = mat(q, h)
        out[p + "attn_k.weight"] = mat(kv, h)
        out[p + "attn_v.weight"] = mat(kv, h)
        out[p + "attn_output.weight"] = mat(h, q)
        out[p + "attn_q_norm.weight"] = np.ones(hd, np.float32)
        out[p + "attn_k_norm.weight"] = np.ones(hd, np.float32)
        out[p + "ffn_norm.weight"] = np.ones(h, np.float32)
        out[p + "ffn_gate.weight"] = mat(ff, h)
        out[p + "ffn_up.weight"] = mat(ff, h)
        out[p + "ffn_down.weight"] = mat(h, ff)
    out["output_norm.weight"] = np.ones(h, np.float32)
    return out


def write_gguf(gguf, tensors, kind, path):
    sys.path.insert(0, os.path.join(REPO, "runners/llamacpp"))
    from make_gguf_pair import add_qwen3_metadata

    qtype = {"f32": gguf.GGMLQuantizationType.F32, "q8_0": gguf.GGMLQuantizationType.Q8_0,
             "q4_0": gguf.GGMLQuantizationType.Q4_0}[kind]
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[kind]
    w = gguf.GGUFWriter(path, "qwen3")
    add_qwen3_metadata(w, gguf, SHAPE, f"cardproof-bench-qwen3-0.6b-random-{kind}", ftype,
                       TOKENIZER_DIR)
    dequantized = {}
    for name, t in tensors.items():
        if t.ndim == 2 and kind != "f32":
            q = gguf.quants.quantize(t, qtype)
            w.add_tensor(name, q, raw_dtype=qtype)
            dequantized[name] = gguf.quants.dequantize(q, qtype).reshape(t.shape)
        else:
            w.add_tensor(name, t)
            dequantized[name] = t
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dequantized


def write_safetensors(tensors, directory):
    """transformers' Qwen3 layout of the GGUF tensors (f32), tied embeddings."""
    from safetensors.numpy import save_file

    s = SHAPE
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    out = {"model.embed_tokens.weight": tensors["token_embd.weight"],
           "model.norm.weight": tensors["output_norm.weight"]}
    for i in range(s["layers"]):
        for g, hf in names.items():
            out[f"model.layers.{i}.{hf}.weight"] = tensors[f"blk.{i}.{g}.weight"]
    os.makedirs(directory, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()},
              os.path.join(directory, "model.safetensors"))
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
              "hidden_size": s["hidden"], "intermediate_size": s["ff"],
              "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
              "num_key_value_heads": s["kv_heads"], "head_dim": s["head_dim"],
              "vocab_size": s["vocab"], "max_position_embeddings": 40960,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
              "hidden_act": "silu", "attention_bias": False, "torch_dtype": "float32"}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def model_dir(work, name):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(TOKENIZER_DIR, f), "rb") as src, open(os.path.join(d, f), "wb") as dst:
            dst.write(src.read())
    return d


def prepare(work, candidates):
    stamp = os.path.join(work, "pair.json")
    want = {"shape": SHAPE, "candidates": sorted(candidates), "seed": 0}
    if os.path.exists(stamp) and json.load(open(stamp)) == want:
        return
    gguf = gguf_py()
    t = time.time()
    tensors = weights()
    write_gguf(gguf, tensors, "f32", os.path.join(model_dir(work, "ref-f32"), "model.gguf"))
    write_safetensors(tensors, model_dir(work, "ref-f32-st"))
    for kind in candidates:
        deq = write_gguf(gguf, tensors, kind, os.path.join(model_dir(work, kind), "model.gguf"))
        if kind == "q8_0":
            write_safetensors(deq, model_dir(work, "q8_0-st"))
        del deq
    # The text: tinyshakespeare cut to the first 2,048 tokens (and a few hundred more).
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    text = open(os.path.join(REPO, "examples/data/tinyshakespeare.txt"), encoding="utf-8").read()
    lo, hi = 0, len(text)
    while lo < hi:  # the shortest prefix of >= N_TOKENS + 64 tokens
        mid = (lo + hi) // 2
        if len(tok.encode(text[:mid]).ids) >= N_TOKENS + 64:
            hi = mid
        else:
            lo = mid + 1
    with open(os.path.join(work, "text.txt"), "w", encoding="utf-8") as f:
        f.write(text[:lo])
    json.dump(want, open(stamp, "w"))
    print(f"pair written in {time.time() - t:.0f} s", file=sys.stderr)


def flops_per_pass():
    """Matrix-product FLOPs of one pass: every projection on every token, QK^T and PV over each
    window (causal: half the square), the head on the scored rows."""
    s = SHAPE
    h, hd, ff, v = s["hidden"], s["head_dim"], s["ff"], s["vocab"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    per_token = 2 * (h * (q + 2 * kv) + q * h + 3 * h * ff) * s["layers"]
    windows = N_TOKENS // N_CTX
    attention = windows * s["layers"] * 2 * 2 * s["heads"] * hd * (N_CTX * N_CTX / 2)
    scored = windows * (N_CTX - 1 - N_CTX // 2)
    return per_token * N_TOKENS + attention + 2 * scored * h * v


def gemm_peak(threads):
    """OpenBLAS's best f32 rate (GFLOP/s) at `threads` over the pass's shapes."""
    code = f"""
import time, numpy as np
s = {SHAPE}
best = 0.0
for (m, k, n) in [({N_CTX}, s['hidden'], s['ff']), ({N_CTX}, s['ff'], s['hidden']),
                  ({N_CTX // 2}, s['hidden'], 16384), (1024, 1024, 1024)]:
    a = np.random.rand(m, k).astype(np.float32); b = np.random.rand(k, n).astype(np.float32)
    a @ b
    for _ in range(5):
        t = time.perf_counter(); a @ b; dt = time.perf_counter() - t
        best = max(best, 2 * m * k * n / dt / 1e9)
print(best)
"""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                         text=True)
    return float(out.stdout.strip())


def timed(cmd, log, env=None):
    """Wall seconds and peak RSS (MiB, GNU time's %M) of one process."""
    rss = log + ".rss"
    t = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.call(["/usr/bin/time", "-f", "%M", "-o", rss] + cmd, stdout=f,
                               stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t
    if code != 0:
        sys.exit(f"{cmd[0]} failed ({code}); see {log}")
    return wall, int(open(rss).read().split()[-1]) / 1024


def torch_run(args):
    """The torch + transformers peer: both models over the windows, the KL on the scored rows."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    tok = Tokenizer.from_file(os.path.join(TOKENIZER_DIR, "tokenizer.json"))
    ids = tok.encode(open(args.text, encoding="utf-8").read()).ids[:N_TOKENS]
    windows = torch.tensor(ids).view(-1, N_CTX)
    half = N_CTX // 2
    rows = []
    for model_dir in (args.reference, args.candidate):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()
        out = []
        with torch.inference_mode():
            for w in windows:
                hidden = model.model(input_ids=w[None]).last_hidden_state[0, half:N_CTX - 1]
                out.append(torch.log_softmax(model.lm_head(hidden), dim=-1))
        rows.append(torch.cat(out))
        del model
    p, q = rows
    kld = (p.exp() * (p - q)).sum(-1).mean().item()
    print(json.dumps({"kld_mean": kld, "rows": p.shape[0]}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cardproof", default=os.path.join(REPO, "target/release/cardproof"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--candidates", default="q8_0,q4_0")
    ap.add_argument("--work", default=os.path.expanduser("~/.cache/cardproof/cpu-peers"))
    ap.add_argument("--baseline", help="another cardproof binary timed in the same interleaving")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--torch-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reference")
    ap.add_argument("--candidate")
    ap.add_argument("--text")
    args, _ = ap.parse_known_args()
    if args.torch_run:
        args.threads = int(args.threads)
        return torch_run(args)
    candidates = args.candidates.split(",")
    os.makedirs(args.work, exist_ok=True)
    prepare(args.work, candidates)
    llama = subprocess.run([os.path.join(REPO, "runners/llamacpp/build.sh")], check=True,
                           capture_output=True, text=True).stdout.strip()
    import importlib.util

    have_torch = not args.no_torch and all(
        importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
    work, text = args.work, os.path.join(args.work, "text.txt")
    ref = os.path.join(work, "ref-f32")
    flops = 2 * flops_per_pass()
    results = []
    for threads in [int(t) for t in args.threads.split(",")]:
        peak = gemm_peak(threads)
        for kind in candidates:
            cand = os.path.join(work, kind)
            runs = {"cardproof": [], "llamacpp": []}
            if args.baseline:
                runs["cardproof_baseline"] = []
            if have_torch and kind == "q8_0":
                runs["torch"] = []
            for _ in range(args.repeats):
                def measure(binary, out):
                    return [binary, "measure", "--reference", ref, "--candidate", cand,
                            "--eval-text", text, "--context-length", str(N_CTX), "--positions",
                            "second-half", "--vocab", "threshold", "--threads", str(threads),
                            "--out", out, "--force", "--json"]

                out = os.path.join(work, "out")
                runs["cardproof"].append(timed(measure(args.cardproof, out),
                                               os.path.join(work, "cardproof.log")))
                m = json.load(open(os.path.join(out, "measurement.json")))
                if args.baseline:
                    runs["cardproof_baseline"].append(timed(
                        measure(args.baseline, out + "-baseline"),
                        os.path.join(work, "cardproof-baseline.log")))
                    b = json.load(open(os.path.join(out + "-baseline", "measurement.json")))
                    if b["runs"][0]["metrics"] != m["runs"][0]["metrics"]:
                        sys.exit("the baseline binary's numbers differ from this one's")
                base = os.path.join(work, "ref.base")
                a = timed([llama, "-m", os.path.join(ref, "model.gguf"), "-f", text, "-c",
                           str(N_CTX), "-t", str(threads), "--chunks", str(N_TOKENS // N_CTX),
                           "--kl-divergence-base", base], os.path.join(work, "llama-base.log"))
                b = timed([llama, "-m", os.path.join(cand, "model.gguf"), "-c", str(N_CTX),
                           "-t", str(threads), "--kl-divergence-base", base, "--kl-divergence"],
                          os.path.join(work, "llama-kld.log"))
                os.remove(base)
                runs["llamacpp"].append((a[0] + b[0], max(a[1], b[1])))
                if "torch" in runs:
                    runs["torch"].append(timed(
                        [sys.executable, __file__, "--torch-run", "--threads", str(threads),
                         "--reference", ref + "-st", "--candidate", os.path.join(work, "q8_0-st"),
                         "--text", text], os.path.join(work, "torch.log")))
            row = {"threads": threads, "candidate": kind, "gemm_peak_gflops": peak,
                   "cardproof_kld_mean": m["runs"][0]["metrics"]["kld_mean"],
                   "tokens_per_pass": N_TOKENS}
            for name, r in runs.items():
                wall = statistics.median(x[0] for x in r)
                row[name] = {"seconds": wall, "all_seconds": [x[0] for x in r],
                             "peak_rss_mib": max(x[1] for x in r),
                             "tokens_per_second_per_pass": 2 * N_TOKENS / wall,
                             "gflops": flops / wall / 1e9,
                             "fraction_of_peak": flops / wall / 1e9 / peak}
            for peer in ("llamacpp", "torch", "cardproof_baseline"):
                if peer in row:
                    row[f"ratio_to_{peer}"] = row["cardproof"]["seconds"] / row[peer]["seconds"]
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    doc = {"machine": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip(),
           "flags": sorted({f for f in open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
                            if f.startswith(("avx", "fma", "amx"))}),
           "cores": os.cpu_count(), "shape": SHAPE, "n_ctx": N_CTX, "tokens": N_TOKENS,
           "flops_both_passes": flops, "results": results}
    json.dump(doc, open(os.path.join(work, "cpu_peers.json"), "w"), indent=1)
    print(f"machine: {doc['machine']}, {doc['cores']} cores, {' '.join(doc['flags'])}")
    if any("cardproof_baseline" in r for r in results):
        print("\n| threads | candidate | cardproof before s | after s | after ÷ before | before ÷ llama.cpp |")
        print("|---|---|---:|---:|---:|---:|")
        for r in results:
            b = r["cardproof_baseline"]["seconds"]
            print(f"| {r['threads']} | {r['candidate']} | {b:.2f} | {r['cardproof']['seconds']:.2f} | "
                  f"{r['cardproof']['seconds'] / b:.2f}x | {b / r['llamacpp']['seconds']:.2f}x |")
        print()
    print("| threads | candidate | cardproof s | llama.cpp s | torch s | ÷ llama.cpp | ÷ torch "
          "| peak RSS MiB (cp / llama / torch) | GFLOP/s (cp / llama / torch) of peak |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for r in results:
        t = r.get("torch")
        print(f"| {r['threads']} | {r['candidate']} | {r['cardproof']['seconds']:.2f} | "
              f"{r['llamacpp']['seconds']:.2f} | {t['seconds'] if t else float('nan'):.2f} | "
              f"{r['ratio_to_llamacpp']:.2f}x | "
              f"{(str(round(r['ratio_to_torch'], 2)) + 'x') if t else '-'} | "
              f"{r['cardproof']['peak_rss_mib']:.0f} / {r['llamacpp']['peak_rss_mib']:.0f} / "
              f"{t['peak_rss_mib'] if t else float('nan'):.0f} | "
              f"{r['cardproof']['gflops']:.0f} / {r['llamacpp']['gflops']:.0f} / "
              f"{t['gflops'] if t else float('nan'):.0f} of {r['gemm_peak_gflops']:.0f} |")


if __name__ == "__main__":
    main()
