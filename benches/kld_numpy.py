#!/usr/bin/env python3
"""Baseline for benches/kld.rs: a straightforward numpy float64 KLD over two safetensors logit
dumps (log-softmax in float64, KL(P_ref || P_cand) per row), streaming row chunks. Prints the mean
KLD and the seconds taken."""

import json
import struct
import sys
import time

import numpy as np


def open_logits(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    info = header["logits"]
    assert info["dtype"] == "F32"
    rows, vocab = info["shape"]
    return np.memmap(path, dtype="<f4", mode="r", offset=8 + n + info["data_offsets"][0], shape=(rows, vocab))


def log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def main():
    a, b = open_logits(sys.argv[1]), open_logits(sys.argv[2])
    start = time.perf_counter()
    total = 0.0
    for i in range(0, a.shape[0], 50):
        lp = log_softmax(np.asarray(a[i : i + 50], dtype=np.float64))
        lq = log_softmax(np.asarray(b[i : i + 50], dtype=np.float64))
        total += (np.exp(lp) * (lp - lq)).sum()
    elapsed = time.perf_counter() - start
    print(json.dumps({"kld_mean": total / a.shape[0], "seconds": elapsed}))


if __name__ == "__main__":
    main()
