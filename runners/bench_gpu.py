#!/usr/bin/env python3
"""GPU benchmark of the transformers runner (docs/benchmarks.md), in one script, on one GPU.

    python3 runners/bench_gpu.py --out DIR [--lengths 32768] [--longest 131072]

A ~4B-parameter Qwen3-architecture pair with random weights (the candidate is the reference with
1% multiplicative noise on every matrix, standing in for quantization error) is saved as
safetensors, then, on the same tokens:

- the floor: two bare chunked-prefill passes (one per model, no output head), timed with CUDA
  synchronization, models already loaded;
- cardproof's runner end to end: runners/transformers_runner/ as cardproof starts it (a request
  file, a subprocess), every row scored; its own timings split load from compute;
- the naive peer: `model(ids).logits` for the whole window, float32 log-softmax over all
  positions, KL per position, for both models; time and peak memory, or the out-of-memory error;
- the longest prompt each handles (cardproof's runner at --longest; the naive script at each
  length until it runs out of memory).

Prints a Markdown table at the end and writes bench.json.

    python3 runners/bench_gpu.py --out DIR --shape hybrid [--runner new=PATH --runner old=PATH]
        [--profile-tokens 32768] [--self64 102400]

The hybrid shape (issue #17): a random-init `Qwen3_5ForCausalLM` (model_type `qwen3_5_text`) at
Qwen3.6-27B's widths (its model card: hidden 5120, FFN 17408, vocabulary 248,320 untied; Gated
DeltaNet 16 QK heads / 48 V heads of 128, conv kernel 4; gated attention 24 Q / 4 KV heads of
256, rotary on 64 dims, theta 1e7) with 16 of its 64 layers (3 GDN + 1 attention, repeated),
8.63B parameters, every 32nd row scored and the gates on. Side by side in one process: the floor
(two bare prefills, warmed up), each runner copy given (`--runner name=path`, a package directory
or a single-file runner from before the package: its compute, warm-up and gate costs from its
own timings), and a torch.profiler table of one bare prefill
(`--profile-tokens`). `--self64 N`: the full 64-layer shape (26.9B parameters, 51 GB in bf16),
random init on the GPU and never written to disk, measured against itself at N tokens: its floor
(two bare prefills of the one model) and the runner's own `run` in this process with only the
loading replaced by the model in memory.
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


def hybrid_config(layers, max_len):
    """Qwen3.6-27B's text widths (its model card), `layers` of its 64."""
    return transformers.Qwen3_5TextConfig(
        vocab_size=248320,
        hidden_size=5120,
        intermediate_size=17408,
        num_hidden_layers=layers,
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        max_position_embeddings=max(max_len, 262144),
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        torch_dtype="bfloat16",
    )


def new_model(shape, max_len, layers=16):
    torch.manual_seed(0)
    with torch.device("cuda"):
        if shape == "hybrid":
            # Made in bf16 directly: the 64-layer shape would take 108 GB in float32 first.
            previous = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                return transformers.Qwen3_5ForCausalLM(hybrid_config(layers, max_len)).to(torch.bfloat16)
            finally:
                torch.set_default_dtype(previous)
        return transformers.Qwen3ForCausalLM(config(max_len)).to(torch.bfloat16)


def make_pair(root, max_len, shape="dense"):
    ref_dir, cand_dir = os.path.join(root, shape, "reference"), os.path.join(root, shape, "candidate")
    if os.path.exists(os.path.join(cand_dir, "config.json")):
        return ref_dir, cand_dir
    model = new_model(shape, max_len)
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


def request(ref_dir, cand_dir, ids, chunk, work, device="cuda", stride=1, gates=False, vocab=151936):
    length = ids.shape[1]
    tokens = os.path.join(work, "tokens.u32")
    ids[0].to(torch.int64).cpu().numpy().astype("<u4").tofile(tokens)
    return {
        "protocol": 1,
        "models": {"reference": {"path": ref_dir, "attn_implementation": "sdpa"},
                   "candidate": {"path": cand_dir, "attn_implementation": "sdpa"}},
        "dtype": "bfloat16", "device": device, "chunk_size": chunk, "head_rows": 0,
        "tf32": False, "deterministic": False, "trust_remote_code": False,
        "memory_limit_bytes": None, "mode": "auto", "gates": gates, "dump": None,
        "vocab_size": vocab,
        "runs": [{"context_length": length, "tokens_file": tokens, "n_windows": 1,
                  "rows": list(range(0, length - 1, stride))}],
        "result_dir": os.path.join(work, "results"), "record_path": os.path.join(work, "record.json"),
    }


def summary(rec, wall):
    """The numbers of one runner record."""
    if not rec.get("ok"):
        return {"ok": False, "error": rec.get("error"), "wall_seconds": wall}
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
        "peak_bytes": max((g["peak_allocated_bytes"] for g in env["gpus"]), default=0),
        "mode": env["mode"],
        "kld_mean": float(res["forward"][res["finite"].bool()].mean()),
        "rows": int(res["forward"].numel()),
        "gates": rec.get("gates"),
        "linear_attention": env.get("linear_attention"),
    }


def hybrid_runner(script, ref_dir, cand_dir, ids, work, stride, triton_cache=None):
    """A copy of the runner as cardproof starts it (request, subprocess, record), gates on.
    `triton_cache`: the subprocess's TRITON_CACHE_DIR (a fresh one makes the first runner a
    first process on the machine and the next ones later processes)."""
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    if triton_cache:
        env["TRITON_CACHE_DIR"] = triton_cache
    req = request(ref_dir, cand_dir, ids, 0, work, stride=stride, gates=True, vocab=248320)
    with open(os.path.join(work, "request.json"), "w") as f:
        json.dump(req, f)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, script, os.path.join(work, "request.json")], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    try:
        with open(req["record_path"]) as f:
            rec = json.load(f)
    except OSError:
        return {"ok": False, "error": "no record", "stderr_tail": p.stderr[-2000:], "wall_seconds": wall}
    out = summary(rec, wall)
    out["stderr_tail"] = p.stderr[-1500:]
    return out


def profile_prefill(model, ids, out_dir, label):
    """torch.profiler over one bare prefill: the CUDA time per kernel, the top rows kept."""
    from torch.profiler import ProfilerActivity, profile
    floor_pass(model, ids[:, :4096], 0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        floor_pass(model, ids, 0)
        torch.cuda.synchronize()
    try:
        table = prof.key_averages().table(sort_by="device_time_total", row_limit=40)
    except (KeyError, AttributeError, ValueError):
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    with open(os.path.join(out_dir, f"profile-{label}.txt"), "w") as f:
        f.write(table)
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)))[:12]:
        rows.append({"name": e.key[:90], "cuda_ms": getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) / 1000, "calls": e.count})
    return rows


class RunnerCopy:
    """A runner copy's modules (a package's, or a single-file runner's one) and its `run`."""

    def __init__(self, modules, run):
        self.modules = modules
        self.run = run

    def patch(self, name, value):
        """Replace `name` in every module that holds it (a package's modules import their
        functions by name, so each holds its own reference)."""
        for m in self.modules:
            if hasattr(m, name):
                setattr(m, name, value)


def runner_module(script):
    """A runner copy imported (a package directory, or a single-file runner from before the
    package), loading replaced by models already in memory."""
    import importlib
    import importlib.util
    name = f"cardproof_runner_{abs(hash(script))}"
    if os.path.isdir(script):
        spec = importlib.util.spec_from_file_location(name, os.path.join(script, "__init__.py"),
                                                      submodule_search_locations=[script])
        pkg = importlib.util.module_from_spec(spec)
        sys.modules[name] = pkg
        spec.loader.exec_module(pkg)
        run = importlib.import_module(f"{name}.run").run
        modules = [m for k, m in list(sys.modules.items()) if k == name or k.startswith(name + ".")]
    else:
        spec = importlib.util.spec_from_file_location(name, script)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        run, modules = mod.run, [mod]
    copy = RunnerCopy(modules, run)
    copy.patch("checkpoint_files", lambda path: [path])
    # The weights are resident already (so out of the free memory the plan reads): 0 more.
    copy.patch("weight_bytes", lambda path, size: 0)
    return copy


def run_in_process(mod, held, req):
    """The runner's own `run` on the models in `held` (path -> model); its record."""
    mod.patch("load_model", lambda torch_, transformers_, spec_, dtype, device, trc: held[spec_["path"]])
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    try:
        rec = {"protocol": 1, "ok": True, **mod.run(req)}
    except Exception as e:  # noqa: BLE001 - a failure is a result to print
        rec = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return rec, time.perf_counter() - t


def pair_in_process(a, results):
    """The hybrid pair made in GPU memory (never on disk); each runner copy's own `run` in this
    process (the first one cold: its warm-up pays the process's compilation), then the floor."""
    import tempfile
    length = a.longest
    t = time.perf_counter()
    ref = new_model("hybrid", length).eval()
    cand = new_model("hybrid", length).eval()
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for p in cand.parameters():
            if p.dim() == 2:
                p.mul_(1 + 0.01 * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype))
    torch.cuda.synchronize()
    results["init_seconds"] = time.perf_counter() - t
    results["params"] = sum(p.numel() for p in ref.parameters())
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 248320, (1, length), generator=gen).cuda()
    work = tempfile.mkdtemp(prefix="pair-")
    held = {}
    for name, m in (("reference", ref), ("candidate", cand)):
        d = os.path.join(work, name)
        m.config.save_pretrained(d)  # config.json only
        held[d] = m
    results["runners"] = {}
    for spec in a.runner:
        name, _, script = spec.partition("=")
        os.makedirs(os.path.join(work, name), exist_ok=True)
        req = request(os.path.join(work, "reference"), os.path.join(work, "candidate"), ids, 0,
                      os.path.join(work, name), stride=a.row_stride, gates=True, vocab=248320)
        rec, wall = run_in_process(runner_module(script), held, req)
        r = summary(rec, wall)
        results["runners"][name] = r
        print(json.dumps({name: r}), flush=True)
    floor = time_floor(ref, cand, ids, 0)
    singles = []
    for m in (ref, cand):
        torch.cuda.synchronize()
        t = time.perf_counter()
        floor_pass(m, ids, 0)
        torch.cuda.synchronize()
        singles.append(time.perf_counter() - t)
    results["floor_seconds"] = floor
    results["floor_single_seconds"] = singles
    warm_floor = sum(singles)
    for r in results["runners"].values():
        if r["ok"]:
            r["compute_over_floor"] = r["compute_seconds"] / warm_floor
    print(json.dumps({"floor_first": floor, "singles": singles}), flush=True)
    held.clear()
    del ref, cand
    gc.collect()
    torch.cuda.empty_cache()
    print(f"\nhybrid 16-layer pair in process, {results['params'] / 1e9:.2f}B each, {length} tokens, every {a.row_stride}th row; floor (2 warm bare prefills) {warm_floor:.2f} s (first, cold: {floor:.2f} s)")
    print("| runner | prefill | head+reduce | compute vs floor | warm-up | gates | GDN kernel | peak | gates' numbers |\n|---|---|---|---|---|---|---|---|---|")
    for name, r in results["runners"].items():
        if r["ok"]:
            tm = r["timings"]
            la = (r.get("linear_attention") or {}).get("candidate") or {}
            print(f"| {name} | {tm['prefill']:.2f} s | {tm['head_and_reduce']:.2f} s | {r['compute_over_floor']:.3f}x | {tm['warmup']:.2f} s | {tm['gates']:.2f} s | {la.get('gdn_kernel', '-')} {la.get('gdn_function', '')} | {r['peak_bytes'] / 2**30:.1f} GiB | {r['gates']} |")
        else:
            print(f"| {name} | failed: {str(r.get('error'))[:150]} |")


def self64(script, length, out_dir, stride):
    """The full 64-layer shape measured against itself, in this process (never on disk)."""
    import tempfile
    mod = runner_module(script)
    t = time.perf_counter()
    model = new_model("hybrid", length, layers=64).eval()
    torch.cuda.synchronize()
    made = time.perf_counter() - t
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 248320, (1, length), generator=g).cuda()
    work = tempfile.mkdtemp(prefix="self64-")
    cfg_dir = os.path.join(work, "model")
    model.config.save_pretrained(cfg_dir)  # config.json only: the weights stay in memory
    held = {cfg_dir: model}
    req = request(cfg_dir, cfg_dir, ids, 0, work, stride=stride, gates=True, vocab=248320)
    # The runner first (its warm-up compiles for this length), then the floor: two bare
    # prefills of the one model, warm.
    rec, wall = run_in_process(mod, held, req)
    floor = time_floor(model, model, ids, 0)
    out = summary(rec, wall)
    out.update({"length": length, "params": params, "init_seconds": made, "floor_seconds": floor})
    if out["ok"]:
        out["compute_over_floor"] = out["compute_seconds"] / floor
    held.clear()
    del model, rec
    gc.collect()
    torch.cuda.empty_cache()
    return out


def hybrid_main(a, results):
    """The hybrid pair at --longest tokens (issue #17); `--longest 0` with --self64: the 64-layer
    shape alone."""
    length = a.longest
    if not length:
        return self64_main(a, results)
    if a.in_process:
        pair_in_process(a, results)
        if a.self64:
            results["self64"] = s64 = self64(dict(x.partition("=")[::2] for x in a.runner)["new"], a.self64, a.out, a.row_stride)
            print(json.dumps(s64), flush=True)
            if s64["ok"]:
                tm = s64["timings"]
                print(f"64-layer ({s64['params'] / 1e9:.2f}B) against itself, {s64['length']} tokens: floor {s64['floor_seconds']:.2f} s; compute {s64['compute_seconds']:.2f} s ({s64['compute_over_floor']:.3f}x); warm-up {tm['warmup']:.2f} s; gates {tm['gates']:.2f} s; peak {s64['peak_bytes'] / 2**30:.1f} GiB; {s64['gates']}")
        with open(os.path.join(a.out, f"bench-hybrid-{a.label}.json"), "w") as f:
            json.dump(results, f, indent=1)
        return
    ref_dir, cand_dir = make_pair(a.work, length, shape="hybrid")
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 248320, (1, length), generator=g).cuda()
    ref, cand = load(ref_dir), load(cand_dir)
    results["params"] = sum(p.numel() for p in ref.parameters())
    singles = []
    # The first floor call of a process pays flash-linear-attention's compilation (~11 s at
    # 131,072 tokens on a cold Triton cache): the floor is the second, warm pair of passes.
    first = time_floor(ref, cand, ids, 0)
    for m in (ref, cand):
        torch.cuda.synchronize()
        t = time.perf_counter()
        floor_pass(m, ids, 0)
        torch.cuda.synchronize()
        singles.append(time.perf_counter() - t)
    floor = sum(singles)
    results["floor_seconds"] = floor
    results["floor_first_call_seconds"] = first
    results["floor_single_seconds"] = singles
    print(json.dumps({"floor": floor, "first_call": first, "singles": singles}), flush=True)
    if a.profile_tokens:
        results["profile"] = profile_prefill(ref, ids[:, :a.profile_tokens], a.out, f"{a.label}-{a.profile_tokens}")
        print(json.dumps(results["profile"][:6]), flush=True)
    del ref, cand
    gc.collect()
    torch.cuda.empty_cache()
    results["runners"] = {}
    for spec in a.runner or [f"new={os.path.join(HERE, 'transformers_runner')}"]:
        name, _, script = spec.partition("=")
        r = hybrid_runner(script, ref_dir, cand_dir, ids, os.path.join(a.work, f"run-{a.label}-{name}"), a.row_stride, a.runner_triton_cache)
        if r["ok"]:
            r["compute_over_floor"] = r["compute_seconds"] / floor
        results["runners"][name] = r
        print(json.dumps({name: {k: v for k, v in r.items() if k != "stderr_tail"}}), flush=True)
    if a.self64:
        script = dict(x.partition("=")[::2] for x in (a.runner or [f"new={os.path.join(HERE, 'transformers_runner')}"]))["new"]
        results["self64"] = s64 = self64(script, a.self64, a.out, a.row_stride)
        print(json.dumps(s64), flush=True)
    with open(os.path.join(a.out, f"bench-hybrid-{a.label}.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n{results['gpu']}, torch {results['torch']}, transformers {results['transformers']}, {a.label}")
    print(f"hybrid 16-layer pair, {results['params'] / 1e9:.2f}B parameters each, {length} tokens, every {a.row_stride}th row")
    print("| work | time | vs floor | warm-up | gates | GDN kernel | peak |\n|---|---|---|---|---|---|---|")
    print(f"| floor: 2 bare prefills | {floor:.2f} s | 1.00x | | | | |")
    for name, r in results["runners"].items():
        if r["ok"]:
            la = (r.get("linear_attention") or {}).get("candidate") or {}
            tm = r["timings"]
            print(f"| runner {name}: compute | {r['compute_seconds']:.2f} s | {r['compute_over_floor']:.3f}x | {tm['warmup']:.2f} s | {tm['gates']:.2f} s | {la.get('gdn_kernel', '?')} | {r['peak_bytes'] / 2**30:.1f} GiB |")
        else:
            print(f"| runner {name}: failed {str(r.get('error'))[:80]} | | | | | | |")
    s64 = results.get("self64")
    if s64:
        if s64["ok"]:
            tm = s64["timings"]
            print(f"| 64-layer self, {s64['length']} tokens: floor | {s64['floor_seconds']:.2f} s | 1.00x | | | | |")
            print(f"| 64-layer self: compute | {s64['compute_seconds']:.2f} s | {s64['compute_over_floor']:.3f}x | {tm['warmup']:.2f} s | {tm['gates']:.2f} s | | {s64['peak_bytes'] / 2**30:.1f} GiB |")
        else:
            print(f"| 64-layer self failed: {str(s64.get('error'))[:100]} | | | | | | |")


def self64_main(a, results):
    script = dict(x.partition("=")[::2] for x in (a.runner or [f"new={os.path.join(HERE, 'transformers_runner')}"]))["new"]
    results["self64"] = s64 = self64(script, a.self64, a.out, a.row_stride)
    with open(os.path.join(a.out, f"bench-hybrid-{a.label}.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n{results['gpu']}, torch {results['torch']}, transformers {results['transformers']}, fla {results.get('fla')}")
    if s64["ok"]:
        tm = s64["timings"]
        print(f"64-layer hybrid ({s64['params'] / 1e9:.2f}B) against itself, {s64['length']} tokens, every {a.row_stride}th row:")
        print(f"floor {s64['floor_seconds']:.2f} s; compute {s64['compute_seconds']:.2f} s ({s64['compute_over_floor']:.3f}x); "
              f"warm-up {tm['warmup']:.2f} s; gates {tm['gates']:.2f} s; peak {s64['peak_bytes'] / 2**30:.1f} GiB; gates {s64['gates']}")
    else:
        print(f"64-layer failed: {s64.get('error')}")


def runner(ref_dir, cand_dir, ids, chunk, work, device="cuda"):
    """runners/transformers_runner/ as cardproof runs it: request, subprocess, record."""
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
    p = subprocess.run([sys.executable, os.path.join(HERE, "transformers_runner"), os.path.join(work, "request.json")],
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
    ap.add_argument("--shape", choices=("dense", "hybrid"), default="dense")
    ap.add_argument("--runner", action="append", help="hybrid: name=path of a runner copy to time (repeatable)")
    ap.add_argument("--row-stride", type=int, default=32, help="hybrid: score every Nth row")
    ap.add_argument("--profile-tokens", type=int, default=0, help="hybrid: profile one bare prefill of this many tokens")
    ap.add_argument("--self64", type=int, default=0, help="hybrid: also the 64-layer shape against itself at N tokens")
    ap.add_argument("--label", default="run", help="hybrid: a name for this configuration (file names)")
    ap.add_argument("--runner-triton-cache", default=None, help="hybrid: the runner subprocesses' TRITON_CACHE_DIR (fresh: the first runner is a cold machine's first process)")
    ap.add_argument("--in-process", action="store_true", help="hybrid: the pair in GPU memory, the runners' own run in this process")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    p = torch.cuda.get_device_properties(0)
    results = {"gpu": p.name, "memory_bytes": p.total_memory, "torch": torch.__version__,
               "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d"), "chunk": a.chunk,
               "ratio": [], "naive": [], "longest": None}
    if a.shape == "hybrid":
        try:
            from importlib import metadata
            results["fla"] = metadata.version("flash-linear-attention")
        except Exception:  # noqa: BLE001 - absent is a result
            results["fla"] = None
        hybrid_main(a, results)
        return
    ref_dir, cand_dir = make_pair(a.work, max(a.longest, 131072), shape="dense")
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
