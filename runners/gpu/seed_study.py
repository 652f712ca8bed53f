#!/usr/bin/env python3
"""The seed study on one GPU, as a user runs it (issue #45; numbers in docs/benchmarks.md).

    python3 runners/gpu/seed_study.py prepare --work DIR [--tiny]
    python3 runners/gpu/seed_study.py measure --cardproof BIN --work DIR --out OUT [--length 131072]
    python3 runners/gpu/seed_study.py study --cardproof BIN --work DIR --out OUT [--length 32768]

`prepare` writes the seed's architecture at 16 of its 64 layers: a random-init
`Qwen3_5ForCausalLM` at Qwen3.6-27B's widths (runners/bench_gpu.py's hybrid shape, 8.6B
parameters, 17 GB in bf16) and the candidate, the reference with 1% multiplicative noise on every
matrix, each with a word-level tokenizer over the 248,320-entry vocabulary, and an eval text of
random words. `--tiny` uses the hybrid test fixture instead (CPU, for checking this script).

`measure` times `cardproof measure --runner transformers` at `--length` tokens, every 32nd row,
twice: first with an empty Triton cache (a fresh machine's first run: every kernel compiles),
then again (a warm machine). For each: the command's wall time, the runner's load, warm-up (and
its steps), compute (prefill + output head and reduction), and the ratios the issue sets: wall
over load + compute (<= 2x cold, <= 1.3x warm), warm-up <= 30 s cold.

`study` runs the seed's three tests as one `cardproof study` at `--length` tokens in 2,048-token
prefill chunks (the seed engine's): kernel arms for each SDPA backend that can run the chunks'
masked attention on this GPU (checked first, the others listed as not run) and for the Gated
DeltaNet kernels, KV-cache arms (q8_0, q4_0), a bf16 recurrent-state arm, the weights arm (the
candidate), and the default controls (repeat, eager attention). Its wall time against the sum of
the runner's loads and passes (<= 1.3x).

Each command prints a Markdown table and writes OUT/seed_<phase>.json.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))


def tokenizer_json(vocab):
    """A word-level tokenizer: token i is the word `t<i>`, words split at whitespace."""
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": "t0"},
    }


def paths(work):
    return os.path.join(work, "reference"), os.path.join(work, "candidate"), os.path.join(work, "eval.txt")


def prepare(a):
    import torch

    ref, cand, text = paths(a.work)
    os.makedirs(a.work, exist_ok=True)
    if not os.path.exists(os.path.join(cand, "config.json")):
        t = time.perf_counter()
        if a.tiny:
            import transformers

            shutil.copytree(os.path.join(REPO, "tests/fixtures/hybrid/qwen3_5_text"), ref, dirs_exist_ok=True)
            model = transformers.AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32)
        else:
            import bench_gpu

            model = bench_gpu.new_model("hybrid", max(a.length, 131072) + 64)
            model.save_pretrained(ref, safe_serialization=True)
        g = torch.Generator(device=next(model.parameters()).device).manual_seed(1)
        with torch.no_grad():
            for _, p in model.named_parameters():
                if p.dim() == 2:
                    p.mul_(1 + 0.01 * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype))
        model.save_pretrained(cand, safe_serialization=True)
        vocab = model.config.vocab_size
        del model
        for d in (ref, cand):
            for name in os.listdir(d):
                if name.startswith("tokenizer"):
                    os.remove(os.path.join(d, name))
            with open(os.path.join(d, "tokenizer.json"), "w") as f:
                json.dump(tokenizer_json(vocab), f)
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
        print(f"models written in {time.perf_counter() - t:.1f} s", flush=True)
    with open(os.path.join(ref, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(0)
    with open(text, "w") as f:
        words = 8 * a.length if a.tiny else max(a.length, 131072)
        f.write(" ".join(f"t{rng.randrange(vocab)}" for _ in range(words + 16)))


def cardproof_env(triton_cache):
    env = dict(os.environ)
    env["TRITON_CACHE_DIR"] = triton_cache
    return env


STAGES = []


def run(cmd, env, log):
    """Run `cmd`; its stderr's progress lines (CARDPROOF_PROGRESS=plain) are kept with the
    seconds since the start at which each came (STAGES), to split the wall time."""
    t = time.perf_counter()
    env = dict(env, CARDPROOF_PROGRESS="plain")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    reader = __import__("threading").Thread(target=lambda: out.append(p.stdout.read()))
    reader.start()
    err = []
    STAGES.clear()
    for line in p.stderr:
        err.append(line)
        if line.startswith("progress: "):
            STAGES.append((round(time.perf_counter() - t, 2), line[len("progress: "):].strip()))
    p.wait()
    reader.join()
    wall = time.perf_counter() - t
    stderr = "".join(err)
    with open(log, "w") as f:
        f.write(out[0][-20000:] + "\n--- stderr ---\n" + stderr[-20000:])
    if p.returncode not in (0, 1):
        print(stderr[-4000:], flush=True)
    return p.returncode, wall


def device_args(a):
    return ["--device", "cpu", "--torch-dtype", "float32"] if a.tiny else []


def runner_times(record):
    """The runner's own timings from a measurement's environment."""
    env = record["environment"]["transformers_runner"]
    tm = env["timings_s"]
    return {
        "load": tm.get("load", 0.0),
        "warmup": tm.get("warmup", 0.0),
        "compute": tm.get("prefill", 0.0) + tm.get("head_and_reduce", 0.0),
        "gates": tm.get("gates", 0.0),
        "total": tm.get("total", 0.0),
        "warmup_steps": tm.get("warmup_steps", []),
        "memory_plan": {k: env["memory_plan"].get(k) for k in ("chunk_size", "eager_query_block", "free_bytes")},
        "linear_attention": (record["environment"].get("linear_attention") or {}),
    }


def measure(a):
    ref, cand, text = paths(a.work)
    os.makedirs(a.out, exist_ok=True)
    cache = os.path.join(a.work, f"triton-{int(time.time())}")
    results = {"length": a.length}
    for label in ("cold", "warm"):
        out = os.path.join(a.work, f"measure-{label}")
        cmd = [a.cardproof, "measure", "--runner", "transformers", *device_args(a), "--reference", ref,
               "--candidate", cand, "--eval-text", text, "--context-length", str(a.length),
               "--positions", "stride", "--stride", "32", "--offset", "31", "--out", out, "--force"]
        code, wall = run(cmd, cardproof_env(cache), os.path.join(a.out, f"measure-{label}.log"))
        if code != 0:
            results[label] = {"ok": False, "exit": code, "wall": wall}
            continue
        with open(os.path.join(out, "measurement.json")) as f:
            rec = json.load(f)
        tm = runner_times(rec)
        tm.update(ok=True, wall=wall, kld_mean=rec["runs"][0]["metrics"]["kld_mean"], stages=list(STAGES),
                  wall_over_load_and_compute=wall / (tm["load"] + tm["compute"]),
                  outside_runner=wall - tm["total"])
        results[label] = tm
        print(json.dumps({label: {k: v for k, v in tm.items() if k != "warmup_steps"}}), flush=True)
    with open(os.path.join(a.out, "seed_measure.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n`measure --runner transformers`, {a.length} tokens, every 32nd row")
    print("| machine | wall | load | warm-up | compute | outside the runner | wall / (load + compute) |\n|---|---|---|---|---|---|---|")
    for label in ("cold", "warm"):
        r = results[label]
        if r.get("ok"):
            print(f"| {label} | {r['wall']:.1f} s | {r['load']:.1f} s | {r['warmup']:.1f} s | {r['compute']:.2f} s | {r['outside_runner']:.1f} s | {r['wall_over_load_and_compute']:.2f}x |")
        else:
            print(f"| {label} | failed (exit {r['exit']}) after {r['wall']:.1f} s | | | | | |")
    for label in ("cold", "warm"):
        for s in results[label].get("warmup_steps", []):
            print(f"  {label} warm-up: {s['model']}: {s['step']}: {s['seconds']:.1f} s")
        for at, stage in results[label].get("stages", []):
            print(f"  {label} at {at:7.2f} s: {stage}")


def sdpa_backends(a):
    """The SDPA backends that run, here, the calls a chunked study's passes make at the seed's
    heads (the runner's own `sdpa_calls`, as its check before loading tries them)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transformers_runner.model import SDPA_BACKENDS, sdpa_calls

    dev, dtype = ("cpu", torch.float32) if a.tiny else ("cuda", torch.bfloat16)
    heads, kv_heads, dim = (16, 4, 8) if a.tiny else (24, 4, 256)
    ok, refused = [], {}
    for name, b in SDPA_BACKENDS.items():
        try:
            with torch.inference_mode(), sdpa_kernel([getattr(SDPBackend, b)]):
                for _, call in sdpa_calls(torch, name, heads, kv_heads, dim, dtype, dev, True):
                    call()
            ok.append(name)
        except RuntimeError as e:
            refused[name] = str(e).splitlines()[0][:200]
    return ok, refused


def study(a):
    ref, cand, text = paths(a.work)
    os.makedirs(a.out, exist_ok=True)
    chunk = min(2048, a.length // 2)
    backends, refused = sdpa_backends(a)
    if a.sdpa is not None:
        backends = [b for b in backends if b in a.sdpa.split(",")]
    # The fixture's heads (16) are below llama.cpp's 32-value blocks: fp8 in --tiny.
    kv = ["fp8_e4m3"] if a.tiny else (a.kv.split(",") if a.kv else ["q8_0", "q4_0"])
    arms = ["  - {name: weights-1pct, candidate: candidate, changes: weights}"]
    arms += [f"  - {{name: kv-{k}, kv_cache: {k}, changes: kv_cache}}" for k in kv]
    arms += [
        "  - {name: state-bf16, recurrent_state: bf16, changes: recurrent_state}"]
    arms += [f"  - {{name: sdpa-{b}, attention: 'sdpa:{b}', changes: kernel}}" for b in backends]
    gdn = a.gdn.split(",") if a.gdn else ["torch_recurrent" if a.tiny else "fla_recurrent", "torch"]
    arms += [f"  - {{name: gdn-{k.replace('_', '-')}, gdn_kernel: {k}, changes: kernel}}" for k in gdn]
    transformers = "{device: cpu, torch_dtype: float32}" if a.tiny else "{device: cuda}"
    yaml = (
        "study: cardproof/study-v1\nname: seed\nreference: reference\neval: {text: eval.txt}\n"
        f"protocol: {{context_lengths: [{a.length}], prefill_chunk: {chunk}, positions: {{policy: stride, stride: 32, offset: 31}}, resamples: 200}}\n"
        f"runner: transformers\ntransformers: {transformers}\narms:\n" + "\n".join(arms) + "\n"
    )
    path = os.path.join(a.work, "seed.yaml")
    with open(path, "w") as f:
        f.write(yaml)
    out = os.path.join(a.work, "study-out")
    cache = os.path.join(a.work, "triton-study")
    code, wall = run([a.cardproof, "study", path, "--out", out, "--force", "--json"], cardproof_env(cache), os.path.join(a.out, "study.log"))
    results = {"length": a.length, "prefill_chunk": chunk, "sdpa_backends": backends, "sdpa_refused": refused,
               "wall": wall, "exit": code, "stages": list(STAGES)}
    if code == 0:
        with open(os.path.join(out, "study.json")) as f:
            doc = json.load(f)
        with open(os.path.join(out, doc["arms"][0]["measurement"])) as f:
            tm = runner_times(json.load(f))
        results.update(runner=tm, timings=doc["timings"],
                       arms=[{"name": x["name"], "changes": x["changes"], "kld_mean": x["runs"][0]["metrics"]["kld_mean"],
                              "top1_flips": x["runs"][0]["top1_flips"], "seconds": x["seconds"]} for x in doc["arms"]])
        results["wall_over_loads_and_passes"] = wall / (tm["load"] + tm["compute"])
        shutil.copy(os.path.join(out, "study.md"), os.path.join(a.out, "study.md"))
    with open(os.path.join(a.out, "seed_study.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n`study`, {a.length} tokens, prefill chunk {chunk}: exit {code}, wall {wall:.1f} s")
    print(f"SDPA backends that run masked chunks here: {backends}; not: {refused}")
    if code == 0:
        tm = results["runner"]
        print(f"runner: load {tm['load']:.1f} s, warm-up {tm['warmup']:.1f} s, passes {tm['compute']:.1f} s; wall / (loads + passes) {results['wall_over_loads_and_passes']:.2f}x")
        print("| arm | changes | kld_mean | top-1 flips | seconds |\n|---|---|---|---|---|")
        for x in results["arms"]:
            print(f"| {x['name']} | {x['changes']} | {x['kld_mean']:.3g} | {x['top1_flips']} | {x['seconds']:.1f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=("prepare", "measure", "study"))
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", default=".")
    ap.add_argument("--cardproof")
    ap.add_argument("--length", type=int, default=0)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--sdpa", help="study: only these SDPA backends (of those that run here)")
    ap.add_argument("--kv", help="study: the KV-cache arms (default q8_0,q4_0)")
    ap.add_argument("--gdn", help="study: the GDN kernel arms (default fla_recurrent,torch)")
    a = ap.parse_args()
    if not a.length:
        a.length = {"prepare": 131072, "measure": 131072, "study": 32768}[a.phase]
        if a.tiny:
            a.length = 128
    {"prepare": prepare, "measure": measure, "study": study}[a.phase](a)


if __name__ == "__main__":
    main()
