#!/usr/bin/env python3
"""Multi-GPU placement check (the two-GPU machine): the 4B-parameter pair of bench_gpu.py run by
the transformers runner with `device: auto` (accelerate's device_map="auto") and with
`device: cuda:0`, same tokens; prints where the layers went, the peak memory per GPU and both
mean KLDs (placement must not change the numbers beyond the cross-device rounding).

    python3 runners/gpu/multi_gpu.py --out DIR"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
import bench_gpu  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--length", type=int, default=32768)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ref, cand = bench_gpu.make_pair("/tmp/cardproof-bench", 131072)
    ids = torch.randint(0, 151936, (1, a.length), generator=torch.Generator().manual_seed(3))
    results = {"gpus": [torch.cuda.get_device_properties(i).name for i in range(torch.cuda.device_count())]}
    for device in ("auto", "cuda:0"):
        work = f"/tmp/cardproof-multi-{device.replace(':', '')}"
        r = bench_gpu.runner(ref, cand, ids, 0, work, device=device)
        rec = json.load(open(os.path.join(work, "record.json")))
        env = rec.get("environment", {})
        maps = {side: m.get("device_map") for side, m in env.get("models", {}).items()}
        placed = {}
        for side, m in maps.items():
            if isinstance(m, dict):
                placed[side] = sorted({str(v) for v in m.values()})
            else:
                placed[side] = m
        r["placement"] = placed
        r["peaks"] = [g.get("peak_allocated_bytes") for g in env.get("gpus", [])]
        results[device] = r
        print(device, json.dumps({k: r.get(k) for k in ("ok", "kld_mean", "compute_seconds", "placement", "peaks", "error")}), flush=True)
    if results["auto"].get("ok") and results["cuda:0"].get("ok"):
        x, y = results["auto"]["kld_mean"], results["cuda:0"]["kld_mean"]
        print(f"kld_mean auto {x:.9e} vs one GPU {y:.9e} (relative {abs(x - y) / y:.1e})")
    json.dump(results, open(os.path.join(a.out, "multi_gpu.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
