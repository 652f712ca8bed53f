#!/usr/bin/env python3
"""Every lane on the real model, every quant type (issue #42; docs/benchmarks.md, "Real weights"):

    python3 benches/real_model.py [--cardproof target/release/cardproof] [--threads 2]
                                  [--types Q8_0,Q4_K_M] [--text examples/data/eval.txt]
                                  [--work DIR]

The model: runners/llamacpp/real_model.sh (SmolLM2-135M-Instruct's exact F32 dequantization as
the reference, llama-quantize candidates); llama.cpp: runners/llamacpp/build.sh (the same pinned
source). llama.cpp's protocol throughout: windows of 512, the second half of each scored, forward
KL over the reference's entries above e^-16, no BOS (the GGUF's add_bos_token is false).

Per type, each run its own process, wall time end to end, same threads:
  - llama.cpp, its own two-pass workflow (`llama-perplexity --kl-divergence-base` on the
    reference, then `--kl-divergence` on the candidate), flash attention on and off: the printed
    mean KLD and its ±, and the two passes' seconds;
  - cardproof's llama.cpp runner (`measure --runner llamacpp`, flash attention on): its reduction
    of the rows, the printout gate's numbers;
  - cardproof's native runner in reference semantics (`measure`) and emulating llama.cpp's CPU
    path with and without flash attention (`--emulate llamacpp-cpu`, `llamacpp-cpu-no-fa`): mean
    KLD, its z against the printout of the mode it emulates ((native - printed) / printed ±),
    seconds.
Prints a Markdown table and writes DIR/real_model.json.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q4_1-shipped", "Q3_K_M", "Q2_K",
         "IQ4_XS", "IQ4_NL", "IQ3_M", "IQ2_M"]
PROTOCOL = ["--context-length", "512", "--positions", "second-half", "--direction", "forward",
            "--vocab", "threshold", "--bos", "none"]


def script(name, *args):
    return subprocess.run([os.path.join(REPO, "runners/llamacpp", name), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def timed(cmd, env=None):
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return time.monotonic() - t, p


def llamacpp_two_pass(bin_dir, root, ty, text, threads, fa, work, env):
    base = os.path.join(work, f"base-{fa}.bin")
    args = ["-c", "512", "-t", str(threads), "-fa", fa]
    t_base, _ = timed([os.path.join(bin_dir, "llama-perplexity"), "-m",
                       os.path.join(root, "reference/model.gguf"), "-f", text, *args,
                       "--kl-divergence-base", base], env)
    t_kld, p = timed([os.path.join(bin_dir, "llama-perplexity"), "-m",
                      os.path.join(root, ty, "model.gguf"), *args, "--kl-divergence-base", base,
                      "--kl-divergence"], env)
    os.remove(base)
    m = re.search(r"Mean\s+KLD:\s+([0-9.]+)\s+±\s+([0-9.]+)", p.stdout + p.stderr)
    if not m:
        sys.exit(f"{ty}: llama.cpp printed no mean KLD")
    return {"kld": float(m.group(1)), "se": float(m.group(2)), "seconds": t_base + t_kld}


def measure(cardproof, root, ty, text, threads, out, lane, env):
    cmd = [cardproof, "measure", "--reference", os.path.join(root, "reference"), "--candidate",
           os.path.join(root, ty), "--eval-text", text, *PROTOCOL, "--threads", str(threads),
           "--out", out, "--force", *lane]
    seconds, _ = timed(cmd, env)
    with open(os.path.join(out, "measurement.json")) as f:
        m = json.load(f)
    return seconds, m


def one_type(a, root, bin_dir, ty, work, env):
    row = {"type": ty}
    for fa in ["on", "off"]:
        row[f"llamacpp_fa_{fa}"] = llamacpp_two_pass(bin_dir, root, ty, a.text, a.threads, fa,
                                                     work, env)
    s, m = measure(a.cardproof, root, ty, a.text, a.threads, os.path.join(work, "runner"),
                   ["--runner", "llamacpp", "--llamacpp-bin",
                    os.path.join(bin_dir, "llama-perplexity"), "--llamacpp-flash-attn", "on"],
                   env)
    gate = m["environment"]["llamacpp"]["gate"]
    row["runner"] = {"kld": m["runs"][0]["metrics"]["kld_mean"], "seconds": s,
                     "printed": gate["printed_kld_mean"],
                     "clamp_allowance": gate["clamp_allowance"], "allowed": gate["allowed"]}
    # Reference semantics against llama.cpp's default (flash attention on); each emulation
    # against the printout of the mode it emulates.
    for lane, flags, fa in [("reference", [], "on"),
                            ("emulated_fa_on", ["--emulate", "llamacpp-cpu"], "on"),
                            ("emulated_fa_off", ["--emulate", "llamacpp-cpu-no-fa"], "off")]:
        s, m = measure(a.cardproof, root, ty, a.text, a.threads, os.path.join(work, lane), flags,
                       env)
        kld = m["runs"][0]["metrics"]["kld_mean"]
        lc = row[f"llamacpp_fa_{fa}"]
        row[lane] = {"kld": kld, "seconds": s, "rows": m["runs"][0]["n_positions"],
                     "z": (kld - lc["kld"]) / lc["se"]}
    return row


def table(rows):
    out = ["| type | llama.cpp FA on | llama.cpp FA off | reference semantics (vs FA on) | "
           "emulation FA on (z) | emulation FA off (z) | llama.cpp runner (clamp allowance) | "
           "seconds: llama.cpp two passes / runner / reference / emulation |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        on, off = r["llamacpp_fa_on"], r["llamacpp_fa_off"]
        ref, run = r["reference"], r["runner"]
        e_on, e_off = r["emulated_fa_on"], r["emulated_fa_off"]
        out.append(
            f"| {r['type']} | {on['kld']:.6f} ± {on['se']:.6f} | {off['kld']:.6f} ± "
            f"{off['se']:.6f} | {ref['kld']:.6f} ({100 * (ref['kld'] / on['kld'] - 1):+.1f}%) | "
            f"{e_on['kld']:.6f} ({e_on['z']:+.2f}) | {e_off['kld']:.6f} ({e_off['z']:+.2f}) | "
            f"{run['kld']:.6f} ({run['clamp_allowance']:.1e}) | {on['seconds']:.1f} / "
            f"{run['seconds']:.1f} / {ref['seconds']:.1f} / {e_on['seconds']:.1f} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cardproof", default=os.path.join(REPO, "target/release/cardproof"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--text", default=os.path.join(REPO, "examples/data/eval.txt"))
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    root = script("real_model.sh")
    bin_dir = os.path.dirname(script("build.sh"))
    work = a.work or tempfile.mkdtemp(prefix="cardproof-real-")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ)
    # llama.cpp 0.3.36's AMX repacking crashes; without it every CPU runs ggml's vec_dot path.
    env.setdefault("LLAMA_ARG_REPACK", "0")
    rows = []
    for ty in a.types.split(","):
        rows.append(one_type(a, root, bin_dir, ty, work, env))
        print(f"{ty} done", file=sys.stderr)
        with open(os.path.join(work, "real_model.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
