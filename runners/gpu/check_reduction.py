#!/usr/bin/env python3
"""Checks the transformers runner's two row reductions (the fused Triton kernel and the torch
path) against an independent float64 reference, on the GPU, and times them.

    python3 runners/gpu/check_reduction.py

Cases: flat, peaked, close and very close rows; ties (first index); -inf entries on one or both
sides; NaN and +inf rows (excluded); a 30000 offset; bf16 and f32 inputs; a padded vocabulary.
Exits 1 on any disagreement beyond 1e-6 relative (or 1e-15 absolute)."""

import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from transformers_runner import reduce as tr  # noqa: E402


def reference(la, lb, tokens, vocab):
    """Textbook float64, on the CPU, row by row."""
    out = {k: [] for k in ("forward", "reverse", "ref_top1", "cand_top1", "nll_ref", "nll_cand", "finite")}
    for a, b, t in zip(la[:, :vocab].double().cpu(), lb[:, :vocab].double().cpu(), tokens.cpu()):
        bad = bool(torch.isnan(a).any() or torch.isnan(b).any() or torch.isposinf(a).any() or torch.isposinf(b).any()
                   or torch.isneginf(a).all() or torch.isneginf(b).all())
        out["finite"].append(0 if bad else 1)
        if bad:
            for k in ("forward", "reverse", "nll_ref", "nll_cand"):
                out[k].append(float("nan"))
            out["ref_top1"].append(-1)
            out["cand_top1"].append(-1)
            continue
        lp = torch.log_softmax(a, 0)
        lq = torch.log_softmax(b, 0)
        p, q = lp.exp(), lq.exp()
        f = torch.where(torch.isneginf(a), 0.0, torch.where(torch.isneginf(b), float("inf"), p * (lp - lq))).sum()
        r = torch.where(torch.isneginf(b), 0.0, torch.where(torch.isneginf(a), float("inf"), q * (lq - lp))).sum()
        out["forward"].append(float(f))
        out["reverse"].append(float(r))
        out["ref_top1"].append(int((a == a.max()).nonzero()[0]))
        out["cand_top1"].append(int((b == b.max()).nonzero()[0]))
        out["nll_ref"].append(float(-lp[t]) if t >= 0 else float("nan"))
        out["nll_cand"].append(float(-lq[t]) if t >= 0 else float("nan"))
    return out


def close(got, want):
    if want != want:
        return True  # excluded rows: values not compared
    if want == float("inf"):
        return got == float("inf")
    return abs(got - want) <= max(1e-6 * abs(want), 1e-15)


def cases(g, dev):
    v = 151936
    def rows(n, sigma, noise, dtype=torch.bfloat16, offset=0.0):
        a = torch.randn(n, v, generator=g, device=dev) * sigma + offset
        a[:, :8] += 12.0
        b = a + torch.randn(n, v, generator=g, device=dev) * noise
        return a.to(dtype), b.to(dtype)
    yield "flat", *rows(16, 1.0, 1.0)
    yield "peaked", *rows(16, 6.0, 0.5)
    yield "close f32", *rows(16, 3.0, 0.01, torch.float32)
    yield "very close f32", *rows(16, 3.0, 1e-3, torch.float32)
    yield "offset 30000 f32", *rows(8, 2.0, 0.3, torch.float32, 30000.0)
    a, b = rows(8, 2.0, 0.1)
    a[:, 5] = a[:, 9] = a.max() + 1  # ties: first index
    b[:, 7] = b[:, 3] = b.max() + 1
    yield "ties", a, b
    a, b = rows(8, 2.0, 0.1, torch.float32)
    a[:, ::7] = float("-inf")
    b[:, ::7] = float("-inf")
    b[1, 1] = float("-inf")  # mass against -inf: forward infinite
    a[2, 2] = float("-inf")  # reverse infinite
    yield "masked", a, b
    a, b = rows(4, 2.0, 0.1, torch.float32)
    a[0, 3] = float("nan")
    b[1, 4] = float("inf")
    a[2, :] = float("-inf")
    yield "non-finite rows", a, b


def main():
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    failures = 0
    for name, a, b in cases(g, dev):
        vocab = a.shape[1] - (7 if name == "flat" else 0)  # a padded vocabulary once
        tokens = torch.randint(0, vocab, (a.shape[0],), generator=g, device=dev)
        tokens[0] = -1
        want = reference(a, b, tokens, vocab)
        for label, fn in (("fused", tr.reduce_rows_fused), ("torch", tr.reduce_rows)):
            got = {k: v.cpu().tolist() for k, v in fn(torch, a, b, tokens, vocab).items()}
            bad = []
            for i in range(a.shape[0]):
                if got["finite"][i] != want["finite"][i]:
                    bad.append(f"row {i} finite {got['finite'][i]} want {want['finite'][i]}")
                    continue
                if not want["finite"][i]:
                    continue
                for k in ("forward", "reverse", "nll_ref", "nll_cand"):
                    if not close(got[k][i], want[k][i]):
                        bad.append(f"row {i} {k} {got[k][i]!r} want {want[k][i]!r}")
                for k in ("ref_top1", "cand_top1"):
                    if got[k][i] != want[k][i]:
                        bad.append(f"row {i} {k} {got[k][i]} want {want[k][i]}")
            failures += len(bad)
            print(f"{name:18s} {label}: {'ok' if not bad else 'FAIL ' + '; '.join(bad[:4])}")
    # Timing on a head chunk's worth of rows.
    a = (torch.randn(815, 151936, generator=g, device=dev) * 2).to(torch.bfloat16)
    b = (a.float() + 0.05 * torch.randn(815, 151936, generator=g, device=dev)).to(torch.bfloat16)
    t = torch.randint(0, 151936, (815,), generator=g, device=dev)
    for label, fn in (("fused", tr.reduce_rows_fused), ("torch", tr.reduce_rows)):
        fn(torch, a, b, t, 151936)
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            s = time.perf_counter()
            fn(torch, a, b, t, 151936)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - s)
        times.sort()
        print(f"timing {label}: {times[2] * 1e3:.2f} ms median for 815 x 151936 bf16 rows "
              f"({815 * 151936 * 4 / times[2] / 1e9:.0f} GB/s of logits read)")
    print("all reductions agree" if failures == 0 else f"{failures} disagreements")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
