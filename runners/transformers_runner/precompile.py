"""flash-linear-attention's kernels compiled beside the loading (issue #45): on a machine whose
Triton cache is empty, the first Gated DeltaNet prefill compiles and autotunes every kernel of the
chunked delta rule (about a minute for Qwen3.6's widths), and a length it has not met compiles
again. That work needs only the layers' shapes, not the weights: `start` launches this module as
a second process that runs the kernels on random inputs at the run's shapes (each length it will
prefill; with and without carried state where the run keeps a cache), writing the compiled
kernels and autotune results into the Triton cache the runner then reads, while the runner loads
its first model. `wait` joins it (with a deadline; a failure only means the warm-up compiles
itself). The kernels and arguments are the ones transformers' Qwen3.5 layer calls
(`chunk_gated_delta_rule` with q/k/v in the model dtype, g in float32, beta in the model dtype,
the L2 norm in the kernel)."""

import importlib.util
import json
import os
import subprocess
import sys
import time

# The longest the second process may run before it is stopped.
DEADLINE_S = 900
# Bytes of its stderr kept for the record.
TAIL_BYTES = 2000


def inputs_bytes(cfg, length, dtype_size):
    """A bound on the second process's device memory at `length` tokens: the inputs and about
    seven more tensors of their size inside the kernels (normalized q and k, w, u, the output,
    the in-chunk matrices), the per-64-token states, and a CUDA context."""
    hk, hv = cfg.get("linear_num_key_heads", 0), cfg.get("linear_num_value_heads", 0)
    dk, dv = cfg.get("linear_key_head_dim", 0), cfg.get("linear_value_head_dim", 0)
    per_token = 8 * (2 * hk * dk + hv * dv) * dtype_size + hv * dk * dv * dtype_size // 64
    return length * per_token + (1 << 30)


def start(req, cfg, plan, dtype_name, dtype_size, lengths, cached):
    """The second process, started (None where it would not help or could not fit: not on a GPU,
    no linear-attention layers, flash-linear-attention absent, or too little memory beside the
    plan)."""
    if req.get("device", "cuda") == "cpu" or "linear_attention" not in (cfg.get("layer_types") or []):
        return None
    if importlib.util.find_spec("fla") is None:
        return None
    # It runs while the weights load and exits before the first warm-up: the weights are what it
    # shares the device with.
    free = plan.get("free_bytes")
    need = inputs_bytes(cfg, max(lengths), dtype_size)
    weights = sum((plan.get("weights") or {}).values())
    if free is None or weights + need > 0.9 * free:
        return None
    spec = {
        "heads": [cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]],
        "dims": [cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]],
        "lengths": sorted(set(lengths)),
        "cached": bool(cached),
        "dtype": dtype_name,
        "device": req.get("device", "cuda"),
    }
    package = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(package)] + [p for p in [env.get("PYTHONPATH")] if p])
    log = open(os.path.join(req["result_dir"], "precompile.log"), "w+b") if os.path.isdir(req["result_dir"]) else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", f"{os.path.basename(package)}.precompile", json.dumps(spec)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=env,
    )
    return {"proc": proc, "log": log, "started": time.perf_counter(), "spec": spec}


def wait(handle):
    """Join the second process: (seconds waited here, what it did). A process past its deadline
    is killed; a failed one is reported, never raised (the warm-up then compiles itself)."""
    if handle is None:
        return 0.0, None
    t = time.perf_counter()
    proc = handle["proc"]
    left = max(1.0, DEADLINE_S - (t - handle["started"]))
    try:
        code = proc.wait(timeout=left)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = "killed at its deadline"
    waited = time.perf_counter() - t
    tail = ""
    log = handle["log"]
    if log is not subprocess.DEVNULL:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - TAIL_BYTES))
        tail = log.read().decode("utf-8", "replace")
        log.close()
    return waited, {
        "lengths": handle["spec"]["lengths"],
        "cached": handle["spec"]["cached"],
        "exit": code,
        "seconds": time.perf_counter() - handle["started"],
        "stderr_tail": tail if code != 0 else "",
    }


def main(argv):
    import torch
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    spec = json.loads(argv[1])
    (hk, hv), (dk, dv) = spec["heads"], spec["dims"]
    dtype = getattr(torch, spec["dtype"])
    dev = torch.device(spec["device"])
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.inference_mode():
        for n in spec["lengths"]:
            q = torch.randn(1, n, hk, dk, device=dev, dtype=dtype, generator=g)
            k = torch.randn(1, n, hk, dk, device=dev, dtype=dtype, generator=g)
            v = torch.randn(1, n, hv, dv, device=dev, dtype=dtype, generator=g)
            gate = -torch.nn.functional.softplus(torch.randn(1, n, hv, device=dev, generator=g))
            beta = torch.rand(1, n, hv, device=dev, generator=g).to(dtype)
            kwargs = dict(g=gate, beta=beta, use_qk_l2norm_in_kernel=True)
            chunk_gated_delta_rule(q, k, v, initial_state=None, output_final_state=False, **kwargs)
            if spec["cached"]:
                _, state = chunk_gated_delta_rule(q, k, v, initial_state=None, output_final_state=True, **kwargs)
                chunk_gated_delta_rule(q, k, v, initial_state=state, output_final_state=True, **kwargs)
            del q, k, v, gate, beta
            torch.cuda.synchronize(dev)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
