#!/usr/bin/env python3
"""GPU benchmark of the transformers runner (docs/benchmarks.md), in one script, on one GPU.

    python3 runners/bench_gpu.py --out DIR [--lengths 32768] [--longest 131072]

A ~4B-parameter Qwen3-architecture pair with random weights (the candidate is the reference with
1% multiplicative noise on every matrix, standing in for quantization error) is saved as
safetensors, then, on the same tokens:

- the floor: two bare chunked-prefill passes (one per model, no output head), timed with CUDA
  synchronization, models already loaded;
- cardproof's runner end to end: runners/transformers_runner.py as cardproof starts it (a request
  file, a subprocess), every row scored; its own timings split load from compute;
- the naive peer: `model(ids).logits` for the whole window, float32 log-softmax over all
  positions, KL per position, for both models; time and peak memory, or the out-of-memory error;
- the longest prompt each handles (cardproof's runner at --longest; the naive script at each
  length until it runs out of memory).

Prints a Markdown table at the end and writes bench.json.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import time

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))


def config(max_len):
    return transformers.Qwen3Config(
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=max_len,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        torch_dtype="bfloat16",
    )


def make_pair(root, max_len):
    ref_dir, cand_dir = os.path.join(root, "reference"), os.path.join(root, "candidate")
    if os.path.exists(os.path.join(cand_dir, "config.json")):
        return ref_dir, cand_dir
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen3ForCausalLM(config(max_len)).to(torch.bfloat16)
    model.save_pretrained(ref_dir, safe_serialization=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(1 + 0.01 * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype))
    model.save_pretrained(cand_dir, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    torch.cuda.empty_cache()
    print(f"pair saved: {params / 1e9:.2f}B parameters", flush=True)
    return ref_dir, cand_dir


def load(path):
    m = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation="sdpa", device_map="cuda", use_safetensors=True
    )
    return m.eval()


def floor_pass(model, ids, chunk):
    """A bare prefill: the base model over the window, no output head. `chunk` 0: one pass
    (the engine's plain prefill); else chunks with the KV cache kept."""
    with torch.inference_mode():
        if not chunk:
            model.base_model(input_ids=ids, use_cache=False)
            return
        cache = transformers.DynamicCache(config=model.config)
        for s in range(0, ids.shape[1], chunk):
            model.base_model(input_ids=ids[:, s:s + chunk], past_key_values=cache, use_cache=True)
        del cache


def time_floor(ref, cand, ids, chunk):
    floor_pass(ref, ids[:, :4096], 0)  # warm-up
    torch.cuda.synchronize()
    t = time.perf_counter()
    floor_pass(ref, ids, chunk)
    floor_pass(cand, ids, chunk)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def naive(ref, cand, ids):
    """The straightforward script: full logits, float32 log-softmax everywhere, KL per position."""
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t = time.perf_counter()
    try:
        with torch.inference_mode():
            lp = torch.log_softmax(ref(ids).logits.float(), -1)
            lq = torch.log_softmax(cand(ids).logits.float(), -1)
            kl = (lp.exp() * (lp - lq)).sum(-1)
            mean = float(kl.mean())
        torch.cuda.synchronize()
        out = {"seconds": time.perf_counter() - t, "kld_mean": mean, "ok": True}
    except torch.cuda.OutOfMemoryError as e:
        out = {"ok": False, "error": f"OutOfMemoryError: {str(e).splitlines()[0]}"}
    out["peak_bytes"] = torch.cuda.max_memory_allocated()
    lp = lq = kl = None
    gc.collect()
    torch.cuda.empty_cache()
    return out


def runner(ref_dir, cand_dir, ids, chunk, work, device="cuda"):
    """runners/transformers_runner.py as cardproof runs it: request, subprocess, record."""
    os.makedirs(work, exist_ok=True)
    length = ids.shape[1]
    tokens = os.path.join(work, "tokens.u32")
    ids[0].to(torch.int64).cpu().numpy().astype("<u4").tofile(tokens)
    req = {
        "protocol": 1,
        "models": {"reference": {"path": ref_dir, "attn_implementation": "sdpa"},
                   "candidate": {"path": cand_dir, "attn_implementation": "sdpa"}},
        "dtype": "bfloat16", "device": device, "chunk_size": chunk, "head_rows": 0,
        "tf32": False, "deterministic": False, "trust_remote_code": False,
        "memory_limit_bytes": None, "mode": "auto", "gates": False, "dump": None,
        "vocab_size": 151936,
        "runs": [{"context_length": length, "tokens_file": tokens, "n_windows": 1, "rows": list(range(length - 1))}],
        "result_dir": os.path.join(work, "results"), "record_path": os.path.join(work, "record.json"),
    }
    with open(os.path.join(work, "request.json"), "w") as f:
        json.dump(req, f)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, os.path.join(HERE, "transformers_runner.py"), os.path.join(work, "request.json")],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t
    with open(os.path.join(work, "record.json")) as f:
        rec = json.load(f)
    if not rec.get("ok"):
        return {"ok": False, "error": rec.get("error"), "wall_seconds": wall, "stderr_tail": p.stderr[-2000:]}
    env = rec["environment"]
    tm = env["timings_s"]
    from safetensors.torch import load_file
    res = load_file(rec["runs"][0]["path"])
    return {
        "ok": True,
        "wall_seconds": wall,
        "timings": tm,
        "compute_seconds": tm["prefill"] + tm["head_and_reduce"],
        "chunk_size": env["chunk_size"],
        "head_rows": env["head_rows"],
        "peak_bytes": max(g["peak_allocated_bytes"] for g in env["gpus"]),
        "mode": env["mode"],
        "kld_mean": float(res["forward"][res["finite"].bool()].mean()),
        "rows": int(res["forward"].numel()),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/cardproof-bench")
    ap.add_argument("--lengths", default="32768")
    ap.add_argument("--naive-lengths", default="32768,49152,65536")
    ap.add_argument("--longest", type=int, default=131072)
    ap.add_argument("--chunk", type=int, default=0, help="prefill chunk (0: one pass, the runner's default when it fits)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    p = torch.cuda.get_device_properties(0)
    results = {"gpu": p.name, "memory_bytes": p.total_memory, "torch": torch.__version__,
               "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d"), "chunk": a.chunk,
               "ratio": [], "naive": [], "longest": None}
    ref_dir, cand_dir = make_pair(a.work, max(a.longest, 131072))
    g = torch.Generator().manual_seed(2)
    lengths = [int(x) for x in a.lengths.split(",") if x]
    for length in lengths:
        ids = torch.randint(0, 151936, (1, length), generator=g).cuda()
        ref, cand = load(ref_dir), load(cand_dir)
        floor = time_floor(ref, cand, ids, a.chunk)
        del ref, cand
        gc.collect()
        torch.cuda.empty_cache()
        r = runner(ref_dir, cand_dir, ids, a.chunk, os.path.join(a.work, f"run{length}"))
        row = {"length": length, "floor_seconds": floor, "runner": r}
        if r["ok"]:
            row["compute_over_floor"] = r["compute_seconds"] / floor
        results["ratio"].append(row)
        print(json.dumps(row), flush=True)
    ref, cand = load(ref_dir), load(cand_dir)
    for length in [int(x) for x in a.naive_lengths.split(",") if x]:
        ids = torch.randint(0, 151936, (1, length), generator=g).cuda()
        n = naive(ref, cand, ids)
        n["length"] = length
        results["naive"].append(n)
        print(json.dumps(n), flush=True)
        if not n["ok"]:
            break
    del ref, cand
    gc.collect()
    torch.cuda.empty_cache()
    if a.longest:
        ids = torch.randint(0, 151936, (1, a.longest), generator=g).cuda()
        r = runner(ref_dir, cand_dir, ids, a.chunk, os.path.join(a.work, f"run{a.longest}"))
        r["length"] = a.longest
        results["longest"] = r
        print(json.dumps(r), flush=True)
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n{results['gpu']}, torch {results['torch']}, transformers {results['transformers']}, chunk {a.chunk}")
    print("| work | time | vs floor | peak memory |\n|---|---|---|---|")
    for row in results["ratio"]:
        r = row["runner"]
        print(f"| floor: 2 bare prefill passes, {row['length']} tokens | {row['floor_seconds']:.2f} s | 1.00x | |")
        if r["ok"]:
            print(f"| runner compute (prefill + head + reduction), {row['length']} | {r['compute_seconds']:.2f} s | {row['compute_over_floor']:.3f}x | {r['peak_bytes'] / 2**30:.1f} GiB |")
            print(f"| runner end to end incl. load, {row['length']} | {r['wall_seconds']:.2f} s | {r['wall_seconds'] / row['floor_seconds']:.2f}x | |")
    for n in results["naive"]:
        t = f"{n['seconds']:.2f} s" if n["ok"] else n["error"][:60]
        print(f"| naive script, {n['length']} tokens | {t} | | {n['peak_bytes'] / 2**30:.1f} GiB |")
    r = results["longest"]
    if r:
        t = f"{r['wall_seconds']:.1f} s (compute {r.get('compute_seconds', 0):.1f} s)" if r["ok"] else str(r.get("error"))[:80]
        print(f"| runner at {r['length']} tokens | {t} | | {r.get('peak_bytes', 0) / 2**30:.1f} GiB |")


if __name__ == "__main__":
    main()
