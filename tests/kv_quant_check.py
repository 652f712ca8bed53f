#!/usr/bin/env python3
"""The transformers runner's KV-cache quantizers (runners/transformers_runner/kv_quant.py,
`kv_quantize`) against the fixtures cardproof's native quantizers are checked on
(tests/fixtures/kv_cache):
gguf-py's llama.cpp blocks, torch's casts on vLLM's write paths and llama.cpp's Hadamard
rotation (rotation.json), bit for bit in float32. Run by
the CI torch test `transformers::torch::the_runners_kv_quantizers_match_the_fixtures_bit_for_bit`:

    python3 tests/kv_quant_check.py
"""

import importlib
import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "kv_cache")


def runner():
    """The runner package's `kv_quant` module, imported from this tree."""
    sys.path.insert(0, os.path.join(ROOT, "runners"))
    try:
        return importlib.import_module("transformers_runner.kv_quant")
    finally:
        sys.path.pop(0)


def floats(bits):
    return torch.from_numpy(np.array(bits, dtype="<u4").view("<f4").copy())


def same(name, got, want):
    g = got.contiguous().view(torch.int32)
    w = want.contiguous().view(torch.int32)
    bad = (g != w).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise SystemExit(f"{name}: {len(bad)} values differ, first at {i}: {got.flatten()[i].item()!r} vs {want.flatten()[i].item()!r}")


def main():
    r = runner()
    checked = 0
    with open(os.path.join(FIXTURES, "llamacpp.json")) as f:
        doc = json.load(f)
    blocks = floats([v for b in doc["blocks"] for v in b]).reshape(len(doc["blocks"]), 32)
    for name, t in doc["types"].items():
        want = floats([v for row in t["values"] for v in row]).reshape(blocks.shape)
        same(name, r.kv_quantize(torch, name, blocks), want)
        checked += 1
    # ggml's own iq4_nl write (ggml-quants.c): blocks whose codes ggml leaves unset read back as
    # zeros of either sign, so they are compared as numbers.
    with open(os.path.join(FIXTURES, "iq4_nl.json")) as f:
        doc = json.load(f)
    blocks = floats([v for b in doc["blocks"] for v in b]).reshape(len(doc["blocks"]), 32)
    t = doc["types"]["iq4_nl"]
    want = floats([v for row in t["values"] for v in row]).reshape(blocks.shape)
    got = r.kv_quantize(torch, "iq4_nl", blocks)
    loose = torch.zeros(len(blocks), dtype=torch.bool)
    loose[t["codes_undefined"]] = True
    same("iq4_nl", got[~loose], want[~loose])
    if not torch.equal(got[loose], want[loose]):
        raise SystemExit("iq4_nl: a block below ggml's 1e-15 threshold does not read back as zeros")
    checked += 1
    # exllamav3's own warp kernels (exl3.json): values read back as f16; a NaN (a scale past
    # f16's range) matches any NaN.
    with open(os.path.join(FIXTURES, "exl3.json")) as f:
        doc = json.load(f)
    groups = floats([v for g in doc["groups"] for v in g]).reshape(len(doc["groups"]), 32)
    for bits, t in doc["bits"].items():
        want = torch.from_numpy(np.array(t["values"], dtype="<u2").view("<f2").astype(np.float32))
        got = r.kv_quantize(torch, f"exl3_q{bits}", groups)
        both_nan = got.isnan() & want.isnan()
        same(f"exl3_q{bits}", torch.where(both_nan, want, got), want)
        checked += 1
    with open(os.path.join(FIXTURES, "vllm.json")) as f:
        doc = json.load(f)
    rows = floats(doc["rows"]).reshape(-1, doc["head_dim"])
    for case in doc["cases"]:
        want = floats(case["values"]).reshape(rows.shape)
        got = r.kv_quantize(torch, case["scheme"], rows, tensor_scale=np.float32(case["scale"]).item())
        same(f"{case['scheme']} at scale {case['scale']}", got, want)
        checked += 1
    # vLLM's calc_kv_scales (amax/200 for keys, amax/100 for values, in float32), from the
    # model dtype's max as vLLM takes it, against numpy in float32.
    for dtype in (torch.float32, torch.bfloat16):
        x = rows.to(dtype)
        k, v = r.computed_scales(torch, x, -x)
        amax = np.float32(np.abs(x.float().numpy()).max())
        for side, got, top in (("k", k, 200), ("v", v, 100)):
            want = amax / np.float32(top)
            if got.dtype != torch.float32 or np.float32(got.item()) != want:
                raise SystemExit(f"computed {side}_scale from {dtype}: {got!r}, numpy {want!r}")
        checked += 1
    with open(os.path.join(FIXTURES, "rotation.json")) as f:
        doc = json.load(f)
    for case in doc["cases"]:
        rows = floats(case["rows"]).reshape(-1, case["head_dim"])
        want = floats(case["values"]).reshape(rows.shape)
        got = r.kv_rounded(torch, case["scheme"], rows, case["block"])
        same(f"{case['scheme']} rotated in blocks of {case['block']} (head {case['head_dim']})", got, want)
        checked += 1
    print(f"kv quantizers: {checked} cases bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
