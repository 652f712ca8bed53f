#!/usr/bin/env python3
"""cardproof's transformers runner: per-position KLD records from two models on the user's GPU.

cardproof starts this program as a subprocess:

    python3 runners/transformers_runner.py REQUEST.json

and reads back what it writes: one safetensors file of per-position records per run (context
length) under the request's `result_dir`, and a JSON record of what actually ran (or a structured
error) at `record_path`. Progress goes to stderr as lines `{"cardproof_progress": ...}`. The
request and record formats are documented in docs/transformers-runner.md; cardproof checks every
field it reads, so a change here without a change there is an error, not a wrong number.

What it does, per window: chunked prefill of each model to its final hidden states with the KV
cache kept (full-sequence logits are never formed), the output head applied only at the scored
rows, a chunk of rows at a time, and the reduction on the device in float64 (design.md's numerics
rules): log-softmax of each row with its maximum subtracted, the log-ratio formed and summed in
float64, forward and reverse KL, first-index top-1, NLL of the true next token. The statistics
are cardproof's (the `measure` module); this program only produces the records.

Dependencies: torch and transformers (accelerate for `device: auto`), safetensors. Nothing else.
Only safetensors checkpoints are loaded, and `trust_remote_code` stays off unless the request
says otherwise (the user's `--trust-remote-code`).
"""

import functools
import json
import math
import os
import struct
import sys
import time
import traceback

PROTOCOL = 1
# Tokens the first model of each shape warms up on (see `run`'s `load`).
WARMUP_TOKENS = 4096
# Longest prefix the self-repeatability gate reruns (see `gate_self`).
GATE_TOKENS = 8192
# Bytes kept free on each device beyond the plan (allocator fragmentation, cuBLAS workspaces).
MARGIN = 0.08


class RunnerError(Exception):
    """An error with a kind cardproof maps to its own message (never a traceback to the user)."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def progress(stage, done=None, total=None):
    line = {"cardproof_progress": stage}
    if done is not None:
        line["done"] = done
        line["total"] = total
    sys.stderr.write(json.dumps(line) + "\n")
    sys.stderr.flush()


def write_json(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Request


def require(cond, message):
    if not cond:
        raise RunnerError("bad_request", message)


def read_request(path):
    try:
        with open(path) as f:
            req = json.load(f)
    except (OSError, ValueError) as e:
        raise RunnerError("bad_request", f"cannot read the request {path}: {e}")
    require(isinstance(req, dict), "the request is not a JSON object")
    require(
        req.get("protocol") == PROTOCOL,
        f"request protocol {req.get('protocol')!r}, this runner speaks {PROTOCOL}",
    )
    for key in ("models", "runs", "result_dir", "record_path", "vocab_size"):
        require(key in req, f"the request has no {key!r}")
    for side in ("reference", "candidate"):
        m = req["models"].get(side)
        require(isinstance(m, dict) and isinstance(m.get("path"), str), f"models.{side}.path missing")
    arms = req["models"].get("arms")
    require(
        arms is None or (isinstance(arms, list) and arms and all(isinstance(a, dict) and isinstance(a.get("path"), str) for a in arms)),
        "models.arms must be a non-empty list of models with a path",
    )
    require(isinstance(req["vocab_size"], int) and req["vocab_size"] > 0, "vocab_size must be a positive integer")
    require(req.get("keep_hidden") in (None, "auto", "device", "host", "disk"), "keep_hidden must be auto, device, host or disk")
    require(req.get("mode", "auto") in ("auto", "side_by_side", "sequential"), "mode must be auto, side_by_side or sequential")
    for i, run in enumerate(req["runs"]):
        for key in ("context_length", "tokens_file", "n_windows", "rows"):
            require(key in run, f"runs[{i}] has no {key!r}")
        length = run["context_length"]
        require(isinstance(length, int) and length >= 2, f"runs[{i}].context_length must be >= 2")
        n_windows = run["n_windows"]
        require(isinstance(n_windows, int) and n_windows >= 1, f"runs[{i}].n_windows must be >= 1")
        per_window = run.get("window_rows")
        if per_window is None:
            # One list of rows shared by every window.
            per_window = [run["rows"]] * n_windows
            require(run["rows"], f"runs[{i}].rows must not be empty")
        else:
            require(
                isinstance(per_window, list) and len(per_window) == n_windows and not run["rows"],
                f"runs[{i}].window_rows must hold one list per window (and rows be empty)",
            )
            require(any(per_window), f"runs[{i}].window_rows selects no row")
        for w, rows in enumerate(per_window):
            require(
                isinstance(rows, list)
                and all(isinstance(r, int) and 0 <= r <= length - 2 for r in rows)
                and rows == sorted(set(rows)),
                f"runs[{i}] window {w}: rows must be increasing row indices in 0..={length - 2}",
            )
        run["window_rows"] = per_window
    return req


def next_tokens(torch, ids, rows, vocab):
    """The true next token of each scored row (row j predicts token j + 1); -1 beyond `vocab`."""
    return torch.tensor([ids[j + 1] if ids[j + 1] < vocab else -1 for j in rows], dtype=torch.long)


def read_tokens(path, n_windows, length):
    size = os.path.getsize(path)
    if size != n_windows * length * 4:
        raise RunnerError(
            "bad_request",
            f"{path} holds {size} bytes, expected {n_windows} windows x {length} tokens x 4 bytes",
        )
    with open(path, "rb") as f:
        data = f.read()
    return [list(struct.unpack_from(f"<{length}I", data, w * length * 4)) for w in range(n_windows)]


# ---------------------------------------------------------------------------------------------
# Models


def torch_dtype(torch, name):
    table = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if name not in table:
        raise RunnerError("bad_request", f"dtype {name!r} is not one of {sorted(table)}")
    return table[name]


def checkpoint_files(path):
    """The safetensors files of a checkpoint directory; refuses anything that would need pickle."""
    if not os.path.isdir(path):
        raise RunnerError("bad_model", f"{path}: not a directory (the transformers runner loads safetensors checkpoint directories)")
    if not os.path.exists(os.path.join(path, "config.json")):
        raise RunnerError("bad_model", f"{path}: no config.json")
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        ggufs = [f for f in os.listdir(path) if f.endswith(".gguf")]
        hint = " (GGUF checkpoints run with --runner native)" if ggufs else ""
        raise RunnerError("bad_model", f"{path}: no .safetensors file{hint}")
    return [os.path.join(path, f) for f in files]


def safetensors_header(path):
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise RunnerError("bad_model", f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise RunnerError("bad_model", f"{path}: safetensors header of {n} bytes is over the 100 MB cap")
        try:
            return json.loads(f.read(n))
        except ValueError as e:
            raise RunnerError("bad_model", f"{path}: safetensors header is not JSON: {e}")


FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


def weight_bytes(path, dtype_size):
    """Bytes the weights take once loaded: float tensors at the compute dtype, the rest as stored."""
    total = 0
    for file in checkpoint_files(path):
        for name, t in safetensors_header(file).items():
            if name == "__metadata__":
                continue
            numel = math.prod(t["shape"]) if t["shape"] else 1
            stored = t["data_offsets"][1] - t["data_offsets"][0]
            total += numel * dtype_size if t["dtype"] in FLOAT_DTYPES else stored
    return total


def read_config(path, whole=False):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    return cfg if whole else cfg.get("text_config", cfg)


def load_model(torch, transformers, spec, dtype, device, trust_remote_code):
    checkpoint_files(spec["path"])
    kwargs = dict(
        dtype=dtype,
        attn_implementation=spec.get("attn_implementation", "sdpa"),
        use_safetensors=True,
        trust_remote_code=bool(trust_remote_code),
    )
    if device != "cpu":
        kwargs["device_map"] = device
    qc = read_config(spec["path"], whole=True).get("quantization_config") or {}
    if qc.get("quant_method") == "compressed-tensors":
        # transformers runs compressed-tensors checkpoints "compressed" only with kernels for the
        # scheme; decompressing at load (weights dequantized into the compute dtype) runs every
        # scheme and is what is recorded (`run_compressed: false`).
        try:
            kwargs["quantization_config"] = transformers.CompressedTensorsConfig(run_compressed=False)
        except (AttributeError, TypeError, ImportError) as e:
            raise RunnerError("load_failed", f"{spec['path']}: compressed-tensors checkpoint, but this transformers cannot decompress it: {e}")
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(spec["path"], **kwargs)
    except ImportError as e:
        raise RunnerError("missing_package", f"{spec['path']}: transformers could not load it, a package it needs is missing: {type(e).__name__}: {e}")
    except (ValueError, OSError, KeyError) as e:
        raise RunnerError("load_failed", f"{spec['path']}: transformers could not load it: {type(e).__name__}: {e}")
    model.eval()
    return model


def attn_used(model):
    return getattr(model.config, "_attn_implementation", None) or "unknown"


def set_attention(model, impl):
    if attn_used(model) == impl:
        return
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        raise RunnerError("unsupported", f"this transformers cannot switch attention to {impl} on a loaded model")
    setter(impl)
    if attn_used(model) != impl:
        raise RunnerError("unsupported", f"attention {impl} was asked for but {attn_used(model)} is in use")


def input_device(model):
    emb = model.get_input_embeddings()
    return emb.weight.device


# ---------------------------------------------------------------------------------------------
# Kernel choices of linear-attention (Gated DeltaNet) layers, observed


# The functions transformers dispatches through `use_kernel_func_from_hub_with_fallback` in a
# prefill (decode's recurrent form and conv update never run here), by the names it resolves.
PREFILL_KERNELS = ("chunk_gated_delta_rule", "causal_conv1d_fn")
# The distributions that ship each importable kernel package.
KERNEL_DISTRIBUTIONS = {"fla": ("flash-linear-attention", "fla-core"), "causal_conv1d": ("causal-conv1d",)}


def is_linear_attention(module):
    return type(module).__name__.endswith("GatedDeltaNet")


class first_layers:
    """The model's decoder stack cut, for the `with` block, to its first layers holding one of
    each layer type (`config.layer_types`; the first layer where there is none)."""

    def __init__(self, model):
        self.base = model.base_model
        config = getattr(model.config, "get_text_config", lambda: model.config)()
        types = list(getattr(config, "layer_types", None) or [])
        self.n = max((types.index(t) for t in set(types)), default=0) + 1

    def __enter__(self):
        self.full = getattr(self.base, "layers", None)
        if self.full is not None and len(self.full) > self.n:
            self.base.layers = type(self.full)(list(self.full)[: self.n])
        return self

    def __exit__(self, *exc):
        if self.full is not None:
            self.base.layers = self.full
        return False


def function_name(f):
    inner = getattr(f, "__func__", f)
    return f"{getattr(inner, '__module__', None) or '?'}.{getattr(inner, '__qualname__', None) or type(inner).__name__}"


def code_objects(f):
    """The code objects of `f` and of every function it wraps (functools.wraps' `__wrapped__`)."""
    codes = set()
    seen = 0
    while f is not None and seen < 16:
        code = getattr(getattr(f, "__func__", f), "__code__", None)
        if code is not None:
            codes.add(code)
        f = getattr(f, "__wrapped__", None)
        seen += 1
    return codes


def package_versions(module_name):
    from importlib import metadata

    top = (module_name or "").split(".")[0]
    out = []
    for dist in KERNEL_DISTRIBUTIONS.get(top, (top,)):
        try:
            out.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return out


class KernelWatch:
    """Watches a forward pass (sys.setprofile) and notes, for each prefill kernel transformers
    dispatches, the function that was actually entered: transformers' dispatch shim
    (`wrapped`, in transformers.integrations.hub_kernels) holds the implementation it resolved
    (`implementation`) and the reference torch function (`torch_function`); a call from the shim
    into one of the implementation's code objects is that implementation running. The forward
    that runs for each GDN layer is noted too (a kernels-hub layer replaces it whole)."""

    def __init__(self):
        self.ran = {}
        self.layer_forwards = set()

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_name == "forward":
            owner = frame.f_locals.get("self")
            if owner is not None and is_linear_attention(owner):
                self.layer_forwards.add(f"{frame.f_globals.get('__name__', '?')}.{code.co_qualname}")
            return
        back = frame.f_back
        if back is None or back.f_code.co_name != "wrapped" or not back.f_globals.get("__name__", "").endswith("integrations.hub_kernels"):
            return
        shim = back.f_locals
        name = shim.get("func_name")
        if name not in PREFILL_KERNELS or name in self.ran:
            return
        impl, reference = shim.get("implementation"), shim.get("torch_function")
        if impl is None or code not in code_objects(impl):
            return  # a helper the shim calls (the export check, a warning), not the kernel
        self.ran[name] = (impl, reference)

    def watch(self, f):
        previous = sys.getprofile()
        sys.setprofile(self)
        try:
            return f()
        finally:
            sys.setprofile(previous)


def kernel_choice(watch, name, transformers_module):
    """(source, function, packages) of one prefill kernel as watched."""
    if name in watch.ran:
        impl, reference = watch.ran[name]
        if impl is reference:
            return "torch_fallback", function_name(reference), []
        module = getattr(getattr(impl, "__func__", impl), "__module__", "") or ""
        top = module.split(".")[0]
        return ("package" if top in KERNEL_DISTRIBUTIONS else "other"), function_name(impl), package_versions(module)
    # No dispatch seen: the layer's forward itself was replaced (a kernels-hub layer) or the
    # function was never reached.
    foreign = sorted(f for f in watch.layer_forwards if not f.startswith(transformers_module))
    if foreign:
        return "kernels_hub", foreign[0], []
    return "not_observed", None, []


def cached_state(cache, idx, kind):
    """Layer `idx`'s `kind` ("recurrent" or "conv") state in a cache: through the cache's getter
    (transformers 5.24) or the layer's own dict of states (5.17); None when neither holds one."""
    getter = getattr(cache, f"get_{kind}_state", None)
    if getter is not None:
        try:
            found = getter(idx)
            if found is not None:
                return found
        except (AttributeError, IndexError, KeyError, TypeError):
            pass
    try:
        states = getattr(cache.layers[idx], f"{kind}_states")
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    found = states.get(0) if isinstance(states, dict) else states
    return found if hasattr(found, "dtype") else None


def dtype_name(t):
    return str(t.dtype).replace("torch.", "") if t is not None else None


def probe_linear_attention(torch, transformers, model, ids):
    """The kernels a model's GDN layers run in prefill and the dtypes their states hold, observed
    on `ids` (a few tokens): one pass without a cache (the runner's one-pass prefill) watched for
    the kernels, then two chunks with a cache (its chunked prefill), whose conv and recurrent
    states are read back. None for a model without linear-attention layers."""
    layers = [m for m in model.modules() if is_linear_attention(m)]
    if not layers:
        return None
    base = model.base_model
    dev = input_device(model)
    x = torch.tensor(ids, dtype=torch.long, device=dev)[None]
    watch = KernelWatch()
    with torch.inference_mode():
        watch.watch(lambda: base(input_ids=x, use_cache=False))
        try:
            cache = transformers.DynamicCache(config=model.config)
        except TypeError:
            cache = transformers.DynamicCache()
        half = max(1, x.shape[1] // 2)

        def two_chunks():
            base(input_ids=x[:, :half], past_key_values=cache, use_cache=True)
            base(input_ids=x[:, half:], past_key_values=cache, use_cache=True)

        watch.watch(two_chunks)
    recurrent, conv = set(), set()
    for layer in layers:
        idx = getattr(layer, "layer_idx", None)
        recurrent.add(dtype_name(cached_state(cache, idx, "recurrent")))
        conv.add(dtype_name(cached_state(cache, idx, "conv")))
    transformers_module = type(layers[0]).__module__
    gdn = kernel_choice(watch, "chunk_gated_delta_rule", transformers_module)
    conv1d = kernel_choice(watch, "causal_conv1d_fn", transformers_module)
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    ssm = getattr(config, "mamba_ssm_dtype", None) or getattr(model.config, "mamba_ssm_dtype", None)
    one = lambda found: ", ".join(sorted(d for d in found if d)) or None  # noqa: E731
    return {
        "layers": len(layers),
        "gdn_kernel": gdn[0],
        "gdn_function": gdn[1],
        "causal_conv1d": conv1d[0],
        "causal_conv1d_function": conv1d[1],
        "packages": sorted(set(gdn[2] + conv1d[2])),
        "recurrent_state_dtype": one(recurrent),
        "conv_state_dtype": one(conv),
        "config_mamba_ssm_dtype": str(ssm).replace("torch.", "") if ssm is not None else None,
        "observed_in": f"the warm-up: one pass and a two-chunk cached prefill of {x.shape[1]} tokens",
    }


# ---------------------------------------------------------------------------------------------
# KV-cache schemes (issue #18): the same formulas as cardproof's native runner
# (src/runner/native/kv_cache.rs), in float32 torch, applied where the engine writes the cache.


def _roundf(torch, x):
    """C's roundf (half away from zero), exactly: floor plus the doubled remainder's floor, as
    gguf-py writes it (floor(|x| + 0.5) is wrong for the float just below 0.5)."""
    a = x.abs()
    f = torch.floor(a)
    return torch.sign(x) * (f + torch.floor(2 * (a - f)))


def _llamacpp_blocks(torch, name, x):
    """llama.cpp's reference quantizers on rows of blocks of 32 (float32 in and out)."""
    b = x.reshape(-1, 32)
    f16 = lambda v: v.to(torch.float16).float()  # noqa: E731
    inv = lambda d: torch.where(d == 0, torch.zeros_like(d), 1.0 / d)  # noqa: E731
    if name == "q8_0":
        d = b.abs().amax(-1, keepdim=True) / 127
        # Through the integer code, as the block stores it (a negative zero reads back as 0).
        q = _roundf(torch, b * inv(d)).to(torch.int32).float()
        return (q * f16(d)).reshape(x.shape)
    if name == "iq4_nl":
        return _iq4_nl_blocks(torch, b).reshape(x.shape)
    if name in ("q4_0", "q5_0"):
        levels, offset, top = (-8.0, 8.5, 15) if name == "q4_0" else (-16.0, 16.5, 31)
        vmax = torch.gather(b, -1, b.abs().argmax(-1, keepdim=True))
        d = vmax / levels
        q = torch.trunc(b * inv(d) + offset).clamp(0, top)
        return ((q + levels) * f16(d)).reshape(x.shape)
    steps = 15.0 if name == "q4_1" else 31.0
    lo = b.amin(-1, keepdim=True)
    d = (b.amax(-1, keepdim=True) - lo) / steps
    q = torch.trunc((b - lo) * inv(d) + 0.5).clamp(0, steps)
    return (q * f16(d) + f16(lo)).reshape(x.shape)


LLAMACPP_BLOCKED = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _iq4_nl_blocks(torch, b):
    """ggml's CPU iq4_nl write (quantize_row_iq4_nl_ref, no importance weights) on blocks [n, 32],
    read back: codes nearest x / (vmax / -127) in the table (ties up), then the scale refit to
    sum(w q x) / sum(w q^2) with w = x^2, summed in order in float32 as the C loop does (a
    reduction kernel would sum in another order). Blocks whose largest magnitude is below 1e-15
    read back as zero."""
    table = torch.tensor(IQ4_NL_VALUES, dtype=torch.float32, device=b.device)
    vmax = torch.gather(b, -1, b.abs().argmax(-1, keepdim=True))
    tiny = vmax.abs() < 1e-15
    ident = torch.where(tiny, torch.ones_like(vmax), vmax / table[0])
    al = b * (1.0 / ident)
    # best_index_int8: the first table value above al, then the nearer neighbour, ties up.
    hi = torch.searchsorted(table, al.contiguous(), right=True).clamp(1, 15)
    lower, upper = table[hi - 1], table[hi]
    idx = torch.where(al - lower < upper - al, hi - 1, hi)
    idx = torch.where(al <= table[0], torch.zeros_like(idx), idx)
    idx = torch.where(al >= table[15], torch.full_like(idx, 15), idx)
    q = table[idx]
    sumqx = torch.zeros_like(vmax)
    sumq2 = torch.zeros_like(vmax)
    for j in range(32):
        x, qj = b[:, j:j + 1], q[:, j:j + 1]
        wq = (x * x) * qj
        sumqx = sumqx + wq * x
        sumq2 = sumq2 + wq * qj
    d = torch.where(sumq2 > 0, sumqx / torch.where(sumq2 > 0, sumq2, torch.ones_like(sumq2)), torch.zeros_like(sumq2))
    d = torch.where(tiny, torch.zeros_like(d), d)
    return d.to(torch.float16).float() * q


EXL3_SCHEMES = {f"exl3_q{b}": b for b in range(2, 9)}
EXL3_R32 = 0.17677669529663688110  # 1/sqrt(32), rounded to float32 where it multiplies


def _walsh_hadamard_32(torch, v):
    """Unnormalized Walsh-Hadamard transform of groups [n, 32] in float32, one butterfly stage per
    index bit from the lowest ((a, b) -> (a + b, a - b)), the order of exllamav3's kernel."""
    n = v.shape[0]
    h = 1
    while h < 32:
        w = v.reshape(n, 32 // (2 * h), 2, h)
        a, b = w[:, :, 0, :], w[:, :, 1, :]
        v = torch.stack((a + b, a - b), dim=2).reshape(n, 32)
        h *= 2
    return v


def _exl3_groups(torch, bits, b):
    """exllamav3's quantized cache (quant_block_x4 / dequant_block_x4, no compander) on groups
    [n, 32]: f16 in, H32 rotation scaled by 1/sqrt(32), f16 absmax scale (+1e-10), codes
    floor(v / s * m + m) clamped to [0, 2m - 1] with m = 2^(bits-1), read back as
    (q - (m - 0.5)) * (s16 * 1/sqrt(32) / m), rotated back, f16 out."""
    m = float(1 << (bits - 1))
    r32 = torch.tensor(EXL3_R32, dtype=torch.float32, device=b.device)
    v = _walsh_hadamard_32(torch, b.to(torch.float16).float()) * r32
    s = v.abs().amax(-1, keepdim=True) + torch.tensor(1e-10, dtype=torch.float32, device=b.device)
    inv = 1.0 / s
    q = torch.floor(v * inv * m + m).clamp(0, 2 * m - 1)
    step = s.to(torch.float16).float() * r32 * (1.0 / m)
    w = _walsh_hadamard_32(torch, (q - (m - 0.5)) * step)
    return w.to(torch.float16).float()


KV_SCHEMES = ("none", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl",
              *EXL3_SCHEMES,
              "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head")


def kv_quantize(torch, name, x, tensor_scale=1.0):
    """`x` ([..., head_dim], any float dtype) as the cache gives it back under scheme `name`,
    in x's dtype. The arithmetic is float32, as cardproof's native runner does it."""
    if name == "none":
        return x
    if (name in LLAMACPP_BLOCKED or name in EXL3_SCHEMES) and x.shape[-1] % 32:
        raise RunnerError("unsupported", f"KV-cache scheme `{name}` quantizes groups of 32 values along the head, and this model's head size is {x.shape[-1]}")
    dtype = x.dtype
    v = x.float()
    if name == "f16":
        out = v.to(torch.float16).float()
    elif name == "bf16":
        out = v.to(torch.bfloat16).float()
    elif name in LLAMACPP_BLOCKED:
        out = _llamacpp_blocks(torch, name, v)
    elif name in EXL3_SCHEMES:
        out = _exl3_groups(torch, EXL3_SCHEMES[name], v.reshape(-1, 32)).reshape(v.shape)
    elif name in ("fp8_e4m3", "fp8_e5m2"):
        fp8, top = (torch.float8_e4m3fn, 448.0) if name == "fp8_e4m3" else (torch.float8_e5m2, 57344.0)
        out = (v / tensor_scale).clamp(-top, top).to(fp8).float() * tensor_scale
    elif name in ("int8_per_token_head", "fp8_per_token_head"):
        qmax, qmin = (127.0, -128.0) if name == "int8_per_token_head" else (448.0, -448.0)
        scale = (v.abs().amax(-1, keepdim=True) / qmax).clamp(min=1e-6)
        q = (v * (1.0 / scale)).clamp(qmin, qmax)
        q = q.to(torch.int8) if name == "int8_per_token_head" else q.to(torch.float8_e4m3fn)
        out = q.float() * scale
    else:
        raise RunnerError("unsupported", f"KV-cache scheme `{name}` is not one of {', '.join(KV_SCHEMES)}")
    return out.to(dtype)


@functools.lru_cache(maxsize=16)
def hadamard_matrix(torch, n, device):
    """ggml_gen_hadamard's orthonormal Sylvester matrix (entries +-(1/sqrtf(n)) as f32), in
    float64 so that one rotation rounds to float32 once, as the native runner does it. Cached per
    (n, device): callers only read it."""
    import numpy

    entry = float(numpy.float32(1.0 / float(numpy.sqrt(numpy.float32(n)))))
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h * entry).to(device)


def rotation_sizes(head_dim):
    """llama.cpp's rotation blocks for (K, V): the largest power of two >= 64 dividing the head,
    and 64; None where the head is not a multiple of 64 (llama.cpp does not rotate it)."""
    if head_dim <= 0 or head_dim % 64:
        return None
    k = 64
    while head_dim % (2 * k) == 0:
        k *= 2
    return k, 64


def kv_rounded(torch, name, x, rotation, tensor_scale=1.0):
    """`x` as the cache gives it back: rounded by `name` (a per-tensor fp8 side by
    `tensor_scale`), in llama.cpp's rotated basis (H x, rounded, rotated back: the same attention
    as rotating Q and the output) when `rotation` is a block size."""
    if rotation is None:
        return kv_quantize(torch, name, x, tensor_scale)
    h = hadamard_matrix(torch, rotation, x.device)
    rot = lambda t: (t.double().reshape(-1, rotation) @ h).float().reshape(t.shape)  # noqa: E731
    return rot(kv_quantize(torch, name, rot(x.float()), tensor_scale)).to(x.dtype)


# vLLM's divisors for computed scales (K_SCALE_CONSTANT, V_SCALE_CONSTANT in vllm/envs.py).
K_SCALE_RANGE, V_SCALE_RANGE = 200.0, 100.0
FP8_PER_TENSOR = ("fp8_e4m3", "fp8_e5m2")


def computed_scales(torch, key, value):
    """vLLM's Attention.calc_kv_scales on one layer's first forward pass: the largest magnitude
    of the keys and of the values (in their dtype) over a 0-dim float32 range, so the quotient is
    float32. A zero or non-finite scale is refused (vLLM would divide by it)."""
    out = []
    for side, x, top in (("key", key, K_SCALE_RANGE), ("value", value, V_SCALE_RANGE)):
        scale = x.abs().max() / torch.tensor(top, dtype=torch.float32, device=x.device)
        s = float(scale)
        if bool(torch.isnan(x).any()) or not (math.isfinite(s) and s > 0):
            raise RunnerError(
                "unsupported",
                f"the computed {side} scale is {s}: the first forward pass gave no finite, non-zero {side}s to scale by",
            )
        out.append(scale)
    return tuple(out)


def kv_setting(spec, path):
    """The (k, v, rotation, computed scales) a request model asks for, checked; None for the
    model dtype."""
    kv = spec.get("kv_cache")
    if not kv or (kv.get("k", "none") == "none" and kv.get("v", "none") == "none"):
        return None
    k, v = kv.get("k", "none"), kv.get("v", "none")
    for name in (k, v):
        if name not in KV_SCHEMES:
            raise RunnerError("unsupported", f"KV-cache scheme `{name}` is not one of {', '.join(KV_SCHEMES)}")
    rotation = kv.get("rotation")
    if rotation not in (None, "none", "hadamard"):
        raise RunnerError("unsupported", f"KV-cache rotation `{rotation}` is not hadamard or none")
    hadamard = rotation == "hadamard"
    if hadamard:
        if any(n not in LLAMACPP_BLOCKED and n not in ("none", "f16", "bf16") for n in (k, v)):
            raise RunnerError("unsupported", "llama.cpp's Hadamard rotation goes with its own cache types only")
        if not any(n in LLAMACPP_BLOCKED for n in (k, v)):
            raise RunnerError("unsupported", "llama.cpp's Hadamard rotation applies only to a quantized cache")
    scales = kv.get("scales")
    if scales not in (None, "computed"):
        raise RunnerError("unsupported", f"KV-cache scales `{scales}` are not computed (or absent: 1.0)")
    computed = scales == "computed"
    if computed and not any(n in FP8_PER_TENSOR for n in (k, v)):
        raise RunnerError("unsupported", "computed KV-cache scales belong to the per-tensor fp8 caches only")
    qc = read_config(path, whole=True).get("quantization_config") or {}
    if any(n in FP8_PER_TENSOR for n in (k, v)) and not computed and qc.get("kv_cache_scheme"):
        raise RunnerError(
            "unsupported",
            f"{path}: the checkpoint declares its own KV-cache scales (kv_cache_scheme); this runner applies "
            "per-tensor fp8 with scale 1.0 or computed scales only; use --runner native, which takes the "
            "checkpoint's k_scale/v_scale",
        )
    semantics = kv.get("semantics")
    if semantics not in (None, "write_then_read", "quantized_cache_residual"):
        raise RunnerError("unsupported", f"KV-cache semantics `{semantics}` is not write_then_read or quantized_cache_residual")
    residual = None
    if semantics == "quantized_cache_residual":
        if computed:
            raise RunnerError("unsupported", "computed KV-cache scales are vLLM's (write-then-read), not transformers' QuantizedCache")
        length = kv.get("residual_length", 128)
        chunk = kv.get("prefill_chunk", length)
        for what, n in (("residual length", length), ("prefill chunk", chunk)):
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 1 << 20:
                raise RunnerError("unsupported", f"KV-cache {what} `{n}` is not 1 to {1 << 20} tokens")
        residual = (length, chunk)
    return (k, v, hadamard, computed, residual)


def kv_label(setting):
    k, v = setting[0], setting[1]
    return k if k == v else f"k:{k}/v:{v}"


def new_cache(torch, transformers, model):
    """A DynamicCache for `model`; with a KV-cache scheme set on the model, one that rounds each
    chunk's keys and values as the engine writes them, before attention reads the cache back
    (write-then-read: a one-pass prefill sees the scheme on its own tokens too). Each token is
    rounded once, when written, as an engine's cache holds it."""
    setting = getattr(model, "_cardproof_kv", None)
    cls = transformers.DynamicCache
    if setting is not None:
        k_name, v_name, hadamard, computed, residual = setting
        # vLLM's computed scales: per layer, from the model's first forward pass (its first
        # window's first prefill chunk), then frozen for every later window.
        # Keyed by the setting: a model shared by a sweep's two sides computes each side's own.
        frozen = model.__dict__.setdefault("_cardproof_kv_scales", {}).setdefault(setting, {})

        def sizes(x):
            if not hadamard:
                return None, None
            found = rotation_sizes(x.shape[-1])
            if found is None:
                raise RunnerError(
                    "unsupported",
                    f"llama.cpp rotates only heads whose size is a multiple of 64, and this model's is {x.shape[-1]}",
                )
            return (found[0] if k_name in LLAMACPP_BLOCKED else None,
                    found[1] if v_name in LLAMACPP_BLOCKED else None)

        class RoundingCache(transformers.DynamicCache):
            def update(self, key_states, value_states, layer_idx, *args, **kwargs):
                k_rot, v_rot = sizes(key_states)
                k_scale = v_scale = 1.0
                if computed:
                    if layer_idx not in frozen:
                        frozen[layer_idx] = computed_scales(torch, key_states, value_states) + (key_states.shape[-2],)
                    k_scale, v_scale, _ = frozen[layer_idx]
                if residual is not None:
                    return self.residual_update(key_states, value_states, layer_idx, k_rot, v_rot, *args, **kwargs)
                return super().update(
                    kv_rounded(torch, k_name, key_states, k_rot, k_scale),
                    kv_rounded(torch, v_name, value_states, v_rot, v_scale),
                    layer_idx,
                    *args,
                    **kwargs,
                )

            def residual_update(self, key_states, value_states, layer_idx, k_rot, v_rot, *args, **kwargs):
                """transformers' QuantizedLayer.update with this scheme's rounding: the first
                update stores its states rounded and returns them as they are; later ones
                return cat(stored, residual, new) unrounded past the stored part, and round the
                whole history again once the residual and the new states reach the residual
                length."""
                tails = self.__dict__.setdefault("_cardproof_raw_tail", {})
                if layer_idx not in tails:
                    super().update(
                        kv_rounded(torch, k_name, key_states, k_rot),
                        kv_rounded(torch, v_name, value_states, v_rot),
                        layer_idx,
                        *args,
                        **kwargs,
                    )
                    tails[layer_idx] = 0
                    return key_states, value_states
                keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
                n = key_states.shape[-2]
                if tails[layer_idx] + n >= residual[0]:
                    layer = self.layers[layer_idx]
                    layer.keys = kv_rounded(torch, k_name, keys, k_rot)
                    layer.values = kv_rounded(torch, v_name, values, v_rot)
                    tails[layer_idx] = 0
                else:
                    tails[layer_idx] += n
                return keys, values

        cls = RoundingCache
    try:
        return cls(config=model.config)
    except TypeError:
        return cls()


# ---------------------------------------------------------------------------------------------
# Forward pass and reduction


def prefill(torch, transformers, model, ids, keep, chunk):
    """Final hidden states at rows `keep` (a sorted LongTensor on the CPU) of one window, by
    chunked prefill with the KV cache kept. Returns [len(keep), hidden] on the head's device."""
    base = model.base_model
    dev = input_device(model)
    ids_t = torch.tensor(ids, dtype=torch.long, device=dev)[None]
    cache = new_cache(torch, transformers, model)
    head_dev = model.get_output_embeddings().weight.device
    out = []
    n = ids_t.shape[1]
    setting = getattr(model, "_cardproof_kv", None)
    if setting is not None and setting[4] is not None:
        # transformers' QuantizedCache semantics are defined per update: the model's own
        # prefill chunk (a single pass would read nothing rounded).
        chunk = setting[4][1]
    with torch.inference_mode():
        if chunk >= n:
            # The whole window in one pass, as the engine's own prefill runs it (no cache kept,
            # unless a KV-cache scheme needs one to round what attention reads).
            if getattr(model, "_cardproof_kv", None) is None:
                h = base(input_ids=ids_t, use_cache=False).last_hidden_state[0]
            else:
                h = base(input_ids=ids_t, past_key_values=cache, use_cache=True).last_hidden_state[0]
            del cache
            return h.index_select(0, keep.to(h.device)).to(head_dev)
        for start in range(0, n, chunk):
            end = min(n, start + chunk)
            # Positions come from the cache's length, as in the model's own generate().
            h = base(
                input_ids=ids_t[:, start:end],
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state[0]
            lo = torch.searchsorted(keep, start)
            hi = torch.searchsorted(keep, end)
            if hi > lo:
                sel = (keep[lo:hi] - start).to(h.device)
                out.append(h.index_select(0, sel).to(head_dev))
            del h
    del cache
    return torch.cat(out, 0)


def head_logits(torch, model, hidden):
    """The output head on some rows, exactly as the model's own forward applies it."""
    with torch.inference_mode():
        logits = model.get_output_embeddings()(hidden)
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
    return logits


_TRITON_KERNEL = None


def triton_kernel():
    """The fused row reduction (one read of both logit rows, everything accumulated in float64),
    compiled on first use; None where Triton is missing (the torch path then runs)."""
    global _TRITON_KERNEL
    if _TRITON_KERNEL is not None:
        return _TRITON_KERNEL or None
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _TRITON_KERNEL = False
        return None

    @triton.jit
    def kl_rows(a_ptr, b_ptr, stride, vocab, out_ptr, top_ptr, BLOCK: tl.constexpr):
        # One program per row, BLOCK lanes, each lane with its own online maximum (its sums
        # rescaled when its maximum grows), joined at the end: each row is read once. Per lane:
        # s = sum e^(x - m), t = sum e^(x - m) (a - b), all float64; c = a - b is formed from
        # float64 upcasts (exact).
        row = tl.program_id(0).to(tl.int64)
        a_row = a_ptr + row * stride
        b_row = b_ptr + row * stride
        lanes = tl.arange(0, BLOCK)
        neg = float("-inf")
        m_a = tl.full([BLOCK], neg, tl.float64)
        m_b = tl.full([BLOCK], neg, tl.float64)
        s_a = tl.zeros([BLOCK], tl.float64)
        s_b = tl.zeros([BLOCK], tl.float64)
        t_a = tl.zeros([BLOCK], tl.float64)
        t_b = tl.zeros([BLOCK], tl.float64)
        arg_a = tl.zeros([BLOCK], tl.int32)
        arg_b = tl.zeros([BLOCK], tl.int32)
        nan_seen = tl.zeros([BLOCK], tl.int32)
        for start in range(0, vocab, BLOCK):
            offs = start + lanes
            inside = offs < vocab
            a = tl.load(a_row + offs, mask=inside, other=neg).to(tl.float64)
            b = tl.load(b_row + offs, mask=inside, other=neg).to(tl.float64)
            nan_seen += ((a != a) | (b != b)).to(tl.int32)
            # Strictly greater: a lane keeps the first index of its maximum.
            arg_a = tl.where(a > m_a, offs, arg_a)
            arg_b = tl.where(b > m_b, offs, arg_b)
            new_a = tl.maximum(m_a, a)
            new_b = tl.maximum(m_b, b)
            # exp(-inf - -inf) would be NaN while a lane has seen only -inf: factor 1 then.
            ra = tl.where(new_a == neg, 1.0, tl.exp(m_a - new_a))
            rb = tl.where(new_b == neg, 1.0, tl.exp(m_b - new_b))
            ea = tl.where(a == neg, 0.0, tl.exp(a - new_a))
            eb = tl.where(b == neg, 0.0, tl.exp(b - new_b))
            c = a - b
            # p = 0 contributes nothing; mass against a -inf is infinite.
            ta = tl.where(a == neg, 0.0, tl.where(b == neg, float("inf"), ea * c))
            tb = tl.where(b == neg, 0.0, tl.where(a == neg, neg, eb * c))
            s_a = s_a * ra + ea
            s_b = s_b * rb + eb
            t_a = t_a * ra + ta
            t_b = t_b * rb + tb
            m_a = new_a
            m_b = new_b
        big_a = tl.max(m_a, 0)
        big_b = tl.max(m_b, 0)
        fa = tl.where(m_a == neg, 0.0, tl.exp(m_a - big_a))
        fb = tl.where(m_b == neg, 0.0, tl.exp(m_b - big_b))
        sa = tl.sum(s_a * fa, 0)
        sb = tl.sum(s_b * fb, 0)
        ta_sum = tl.sum(tl.where(fa == 0.0, 0.0, t_a * fa), 0)
        tb_sum = tl.sum(tl.where(fb == 0.0, 0.0, t_b * fb), 0)
        top_a = tl.min(tl.where(m_a == big_a, arg_a, 2147483647), 0)
        top_b = tl.min(tl.where(m_b == big_b, arg_b, 2147483647), 0)
        lse_a = big_a + tl.log(sa)
        lse_b = big_b + tl.log(sb)
        shift = lse_a - lse_b
        o = out_ptr + row * 6
        tl.store(o + 0, ta_sum / sa - shift)
        tl.store(o + 1, shift - tb_sum / sb)
        tl.store(o + 2, lse_a)
        tl.store(o + 3, lse_b)
        tl.store(o + 4, big_a)
        tl.store(o + 5, tl.sum(nan_seen, 0).to(tl.float64))
        tl.store(top_ptr + row * 2 + 0, top_a)
        tl.store(top_ptr + row * 2 + 1, top_b)

    _TRITON_KERNEL = kl_rows
    return kl_rows


def reduce_rows_fused(torch, la, lb, tokens, vocab):
    """`reduce_rows` in one fused Triton kernel per block of rows: the same records, to float64
    rounding (checked against the torch path by runners/gpu/check_reduction.py)."""
    kernel = triton_kernel()
    la = la.contiguous()
    lb = lb.contiguous()
    rows = la.shape[0]
    out = torch.empty((rows, 6), dtype=torch.float64, device=la.device)
    top = torch.empty((rows, 2), dtype=torch.int32, device=la.device)
    # Triton launches on the current device; with device_map="auto" the head may sit elsewhere.
    with torch.cuda.device(la.device):
        kernel[(rows,)](la, lb, la.stride(0), vocab, out, top, BLOCK=1024)
    fwd, rev, lse_a, lse_b, max_a, nan_seen = out.unbind(1)
    inf = float("inf")
    bad = (nan_seen > 0) | (max_a == inf) | (max_a == -inf) | torch.isinf(lse_b) | torch.isnan(lse_b)
    a_t = la[:, :vocab].gather(1, tokens.clamp(min=0)[:, None])[:, 0].double()
    b_t = lb[:, :vocab].gather(1, tokens.clamp(min=0)[:, None])[:, 0].double()
    known = tokens >= 0
    nan = torch.full_like(lse_a, float("nan"))
    return {
        "forward": torch.where(bad, nan, fwd).clamp(min=0.0),
        "reverse": torch.where(bad, nan, rev).clamp(min=0.0),
        "ref_top1": top[:, 0].contiguous(),
        "cand_top1": top[:, 1].contiguous(),
        "ref_top1_prob": (max_a - lse_a).exp(),
        "nll_ref": torch.where(known, lse_a - a_t, nan),
        "nll_cand": torch.where(known, lse_b - b_t, nan),
        "finite": (~bad).to(torch.uint8),
    }


def reduce_rows(torch, la, lb, tokens, vocab):
    """Per-row records of two logit blocks [R, V] (any float dtype, upcast exactly to float64):
    forward and reverse KL (nats), first-index top-1, the reference's top-1 probability, NLLs of
    `tokens` (a LongTensor on the logits' device, -1 where unknown), and whether the row is
    finite (no NaN or +inf, not every entry -inf). Padded entries beyond `vocab` are dropped.

    With c = a - b formed in float64 (exact: both are float64 upcasts) and the normalizers
    Z = sum e^(x - max) in float64:
        KL(P||Q) = sum_i p_i c_i - (lse_a - lse_b),   KL(Q||P) = -sum_i q_i c_i + (lse_a - lse_b)
    The subtraction loses only f64 digits (1e-16 times the spread of c): far below 1e-6 of any
    KL that matters, and it keeps the passes over memory few (a handful per row, each a fused
    kernel). Rows holding -inf (masked tokens) take `reduce_masked`, which treats 0 log 0 as 0."""
    a = la[:, :vocab].double()
    b = lb[:, :vocab].double()
    max_a, top_a = a.max(1)  # first index of the maximum (torch documents it); NaN propagates
    max_b, top_b = b.max(1)
    inf = float("inf")
    bad = torch.isnan(max_a) | torch.isnan(max_b) | (max_a == inf) | (max_b == inf) | (max_a == -inf) | (max_b == -inf)
    if bool(torch.isneginf(a).any()) or bool(torch.isneginf(b).any()):
        return reduce_masked(torch, a, b, max_a, top_a, max_b, top_b, bad, tokens)
    safe_a = torch.where(bad, torch.zeros_like(max_a), max_a)
    safe_b = torch.where(bad, torch.zeros_like(max_b), max_b)
    ea = torch.exp(a - safe_a[:, None])
    eb = torch.exp(b - safe_b[:, None])
    za = ea.sum(1)
    zb = eb.sum(1)
    lse_a = safe_a + za.log()
    lse_b = safe_b + zb.log()
    c = a - b
    # Row-wise dot products in one pass each (batched matrix products in float64).
    pc = torch.bmm(ea[:, None, :], c[:, :, None])[:, 0, 0] / za
    qc = torch.bmm(eb[:, None, :], c[:, :, None])[:, 0, 0] / zb
    shift = lse_a - lse_b
    fwd = pc - shift
    rev = shift - qc
    return finish_records(torch, a, b, fwd, rev, top_a, top_b, max_a, lse_a, lse_b, bad, tokens)


def reduce_masked(torch, a, b, max_a, top_a, max_b, top_b, bad, tokens):
    """`reduce_rows` for rows with -inf entries: log-probabilities, terms with p = 0 dropped, and
    +inf where one side has mass the other has not."""
    lse_a = torch.logsumexp(a, 1)
    lse_b = torch.logsumexp(b, 1)
    lp = a - lse_a[:, None]
    lq = b - lse_b[:, None]
    d = lp - lq
    p = lp.exp()
    q = lq.exp()
    a_masked = torch.isneginf(a)
    b_masked = torch.isneginf(b)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=a.device)
    zero = torch.zeros((), dtype=torch.float64, device=a.device)
    fwd = torch.where(a_masked, zero, torch.where(b_masked, inf, p * d)).sum(1)
    rev = torch.where(b_masked, zero, torch.where(a_masked, inf, q * -d)).sum(1)
    return finish_records(torch, a, b, fwd, rev, top_a, top_b, max_a, lse_a, lse_b, bad, tokens)


def finish_records(torch, a, b, fwd, rev, top_a, top_b, max_a, lse_a, lse_b, bad, tokens):
    known = tokens >= 0
    t = tokens.clamp(min=0)[:, None]
    nan = torch.full_like(lse_a, float("nan"))
    nll_a = torch.where(known, lse_a - a.gather(1, t)[:, 0], nan)
    nll_b = torch.where(known, lse_b - b.gather(1, t)[:, 0], nan)
    return {
        "forward": fwd.clamp(min=0.0),
        "reverse": rev.clamp(min=0.0),
        "ref_top1": top_a.int(),
        "cand_top1": top_b.int(),
        "ref_top1_prob": (max_a - lse_a).exp(),
        "nll_ref": nll_a,
        "nll_cand": nll_b,
        "finite": (~bad).to(torch.uint8),
    }


# ---------------------------------------------------------------------------------------------
# Memory plan


def plan_memory(torch, req, cfg, weights, dtype_size, chunk, free):
    """Bytes each part of the run needs at its peak for prefill chunks of `chunk` tokens (a chunk
    as long as the window is one pass without a cache, the engine's plain prefill)."""
    hidden = cfg.get("hidden_size", 0)
    layers = cfg.get("num_hidden_layers", 0)
    heads = cfg.get("num_attention_heads", 1)
    kv_heads = cfg.get("num_key_value_heads", heads) or heads
    head_dim = cfg.get("head_dim") or (hidden // max(heads, 1))
    inter = cfg.get("intermediate_size", 4 * hidden)
    vocab_width = cfg.get("vocab_size", req["vocab_size"])
    longest = max(r["context_length"] for r in req["runs"])
    most_rows = max(len(rows) for r in req["runs"] for rows in r["window_rows"])
    chunk = min(chunk, longest)
    models = [req["models"]["reference"], req["models"]["candidate"], *(req["models"].get("arms") or [])]
    eager = any(m.get("attn_implementation") == "eager" for m in models)
    whole = chunk >= longest
    # One pass keeps one layer's keys and values at a time; chunks keep every layer's (the cache).
    kv = 2 * (1 if whole else layers) * kv_heads * head_dim * longest * dtype_size
    # Per layer at once: the chunk's activations (MLP intermediate x3, a few hidden-sized
    # tensors) and the attention's working set: for sdpa the mask a cache needs (none for one
    # causal pass, which takes the flash kernel); for eager the scores, twice.
    act = chunk * (3 * inter + 6 * hidden) * dtype_size
    attn = chunk * longest * (heads * 6 if eager else (0 if whole else 2))
    # Head chunk: two logit blocks in the model dtype and about six float64 temporaries per row.
    per_row = vocab_width * (2 * dtype_size + 6 * 8)
    kept = most_rows * hidden * dtype_size
    fixed = kv + act + attn + 2 * kept
    plans = {
        "weights": weights,
        "kv_cache": kv,
        "activations": act + attn,
        "kept_hidden": 2 * kept,
        "chunk_size": chunk,
    }
    for mode, w in (
        ("side_by_side", weights["reference"] + weights["candidate"]),
        ("sequential", max(weights["reference"], weights["candidate"])),
    ):
        rows = req.get("head_rows") or 0
        if not rows:
            # As many rows as the memory left allows, so launches do not dominate: at most 2048
            # and 6 GiB, at least 16.
            left = (free * (1 - MARGIN) - w - fixed) if free is not None else float("inf")
            cap = min(2048, (6 << 30) // max(1, per_row))
            rows = int(max(16, min(cap, left // per_row if left > 0 else 0)))
        plans[f"{mode}_head_rows"] = rows
        plans[f"{mode}_bytes"] = w + fixed + rows * per_row
    plans["per_head_row"] = per_row
    return plans


def free_bytes(torch, device):
    if device == "cpu":
        try:
            pages = os.sysconf("SC_AVPHYS_PAGES")
            return pages * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    total = 0
    if device == "auto":
        for i in range(torch.cuda.device_count()):
            total += torch.cuda.mem_get_info(i)[0]
        return total
    idx = torch.device(device).index or 0
    return torch.cuda.mem_get_info(idx)[0]


def human(n):
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def choose_plan(torch, req, cfg, weights, dtype_size):
    """The plan and mode: the asked chunk size, or (by default) the whole window when it fits,
    else the longest power-of-two chunk that does (down to 256 tokens)."""
    longest = max(r["context_length"] for r in req["runs"])
    asked = req.get("chunk_size") or 0
    limit = req.get("memory_limit_bytes")
    device = req.get("device", "cuda")
    free = limit if limit is not None else free_bytes(torch, device)
    chunks = [asked] if asked else [longest] + [c for c in (1 << k for k in range(20, 7, -1)) if c < longest]
    error = None
    for chunk in chunks:
        plan = plan_memory(torch, req, cfg, weights, dtype_size, chunk, free)
        plan["free_bytes"] = free
        try:
            mode = choose_mode(req, plan, free, device)
        except RunnerError as e:
            error = e
            continue
        plan["head_rows"] = plan[f"{mode}_head_rows"]
        plan["head_chunk"] = plan["head_rows"] * plan["per_head_row"]
        return plan, mode
    raise error


def choose_mode(req, plan, free, device):
    wanted = req.get("mode", "auto")
    if free is None:
        return "side_by_side" if wanted == "auto" else wanted
    budget = free * (1 - MARGIN)
    side, seq = plan["side_by_side_bytes"], plan["sequential_bytes"]
    if wanted in ("auto", "side_by_side") and side <= budget:
        return "side_by_side"
    if wanted in ("auto", "sequential") and seq <= budget:
        return "sequential"
    mode = "sequential" if wanted != "side_by_side" else "side_by_side"
    need = plan[f"{mode}_bytes"]
    rows = plan[f"{mode}_head_rows"]
    w = plan["weights"]
    parts = (
        f"weights {human(w['reference'])} + {human(w['candidate'])}, KV cache {human(plan['kv_cache'])}, "
        f"activations {human(plan['activations'])} at chunk {plan['chunk_size']}, "
        f"head chunk {human(rows * plan['per_head_row'])} at {rows} rows"
    )
    advice = []
    if plan["activations"] > 0.2 * need:
        advice.append("a smaller --chunk-size")
    if plan["kv_cache"] > 0.3 * need:
        advice.append("a shorter --context-length")
    if device != "cpu":
        advice.append("more GPUs with --device auto")
    else:
        advice.append("a machine with more memory")
    raise RunnerError(
        "out_of_memory_plan",
        f"the run needs about {human(need)} ({parts}) but {human(free)} is free on {device}; try {', or '.join(advice)}",
    )


# ---------------------------------------------------------------------------------------------
# The run


def environment(torch, transformers, req, models, timings, plan, mode):
    env = {
        "runner": "transformers",
        "runner_protocol": PROTOCOL,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": req.get("device", "cuda"),
        "dtype": req.get("dtype", "bfloat16"),
        "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32),
        "bf16_reduced_precision_reduction": bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
        "fp16_reduced_precision_reduction": bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "chunk_size": plan["chunk_size"],
        "head_rows": plan["head_rows"],
        "mode": mode,
        "memory_plan": plan,
        "reduction": "float64 on the device: log-ratio a - b of float64 upcasts, normalizers and sums in float64 with the maximum subtracted",
        "reduction_kernel": plan.get("reduction_kernel"),
        "timings_s": timings,
    }
    try:
        import accelerate

        env["accelerate"] = accelerate.__version__
    except ImportError:
        env["accelerate"] = None
    if torch.cuda.is_available() and req.get("device", "cuda") != "cpu":
        gpus = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({
                "index": i,
                "name": p.name,
                "compute_capability": f"{p.major}.{p.minor}",
                "memory_bytes": p.total_memory,
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(i),
            })
        env["gpus"] = gpus
    else:
        import platform

        env["gpus"] = []
        env["cpu"] = platform.processor() or platform.machine()
        env["threads"] = torch.get_num_threads()
    env["models"] = models
    return env


def kv_scales_record(model, setting):
    """The per-layer KV-cache scales this run computed under `setting` (vLLM's
    calculate_kv_scales), or None."""
    found = model.__dict__.get("_cardproof_kv_scales", {}).get(setting)
    if not found:
        return None
    layers = sorted(found.items())
    return {
        "tokens": int(layers[0][1][2]),
        "layers": [{"layer": int(i), "k_scale": float(k), "v_scale": float(v)} for i, (k, v, _) in layers],
    }


def model_record(model, spec):
    q = getattr(model.config, "quantization_config", None)
    if q is not None and not isinstance(q, dict):
        q = q.to_dict() if hasattr(q, "to_dict") else str(q)
    # The floating dtype the model computes in (its first floating parameter's; a quantized
    # checkpoint's first parameter may be an integer weight). The KV cache holds that dtype.
    dtype = str(model.dtype).replace("torch.", "")
    kv = kv_setting(spec, spec["path"])
    return {
        "path": spec["path"],
        "attention": attn_used(model),
        "param_dtype": dtype,
        "logits_dtype": str(model.get_output_embeddings().weight.dtype).replace("torch.", ""),
        # A scheme cardproof applies (`kv_cache` in the request), else the model dtype.
        "kv_cache_dtype": kv_label(kv) if kv else dtype,
        "kv_cache_rotation": "hadamard" if kv and kv[2] else "none",
        "kv_cache_scales": "computed" if kv and kv[3] else "unit",
        "kv_cache_semantics": "quantized_cache_residual" if kv and kv[4] else "write_then_read",
        "kv_cache_residual": list(kv[4]) if kv and kv[4] else None,
        "kv_scales": kv_scales_record(model, kv),
        "quant_method": (q or {}).get("quant_method") if isinstance(q, dict) else q,
        "run_compressed": (q or {}).get("run_compressed") if isinstance(q, dict) else None,
        "device_map": {k: str(v) for k, v in (getattr(model, "hf_device_map", None) or {}).items()} or str(model.device),
        "architecture": type(model).__name__,
    }


def run(req):
    t0 = time.perf_counter()
    try:
        import torch
        import transformers
        from safetensors.torch import save_file
    except ImportError as e:
        raise RunnerError("missing_dependency", f"the transformers runner needs torch, transformers and safetensors: {e}")
    device = req.get("device", "cuda")
    if device != "cpu" and not torch.cuda.is_available():
        raise RunnerError("no_gpu", f"device {device!r} asked for but torch sees no CUDA GPU (torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    tf32 = bool(req.get("tf32", False))
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if req.get("deterministic"):
        torch.use_deterministic_algorithms(True)
    dtype = torch_dtype(torch, req.get("dtype", "bfloat16"))
    dtype_size = torch.tensor([], dtype=dtype).element_size()
    specs = req["models"]
    # A study's arms: several candidates against one reference pass (sequential: the
    # reference's kept hidden states serve every arm; one arm loaded at a time).
    arm_specs = specs.get("arms") or None
    if arm_specs:
        req["mode"] = "sequential"
        specs["candidate"] = max(arm_specs, key=lambda a: weight_bytes(a["path"], dtype_size))
    shared = (
        specs["candidate"]["path"] == specs["reference"]["path"]
        and not req.get("load_twice", False)
        and not arm_specs
    )
    weights = {
        "reference": weight_bytes(specs["reference"]["path"], dtype_size),
        "candidate": 0 if shared else weight_bytes(specs["candidate"]["path"], dtype_size),
    }
    cfg = read_config(specs["reference"]["path"])
    plan, mode = choose_plan(torch, req, cfg, weights, dtype_size)
    if req.get("plan_only"):
        return {"environment": {"memory_plan": plan, "mode": mode}, "runs": []}
    chunk = plan["chunk_size"]
    head_rows = plan["head_rows"]
    vocab = req["vocab_size"]
    runs = []
    for r in req["runs"]:
        runs.append((r, read_tokens(r["tokens_file"], r["n_windows"], r["context_length"])))
    total_windows = sum(r["n_windows"] for r in req["runs"])
    timings = {"load": 0.0, "warmup": 0.0, "prefill": 0.0, "head_and_reduce": 0.0, "gates": 0.0}
    if device != "cpu":
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)

    longest = max(r["context_length"] for r in req["runs"])
    first_window = runs[0][1][0]
    # A window of the longest run: the warm-up's passes at each length are its prefixes.
    longest_window = max(runs, key=lambda rw: rw[0]["context_length"])[1][0]
    warmed = set()
    linear_attention = {}

    def load(spec, side):
        t = time.perf_counter()
        progress(f"loading {spec['path']}")
        m = load_model(torch, transformers, spec, dtype, device, req.get("trust_remote_code", False))
        m._cardproof_kv = kv_setting(spec, spec["path"])
        timings["load"] += time.perf_counter() - t
        # Warm-up (kernel selection, lazy initialization, Triton compilation and autotuning, the
        # fused reduction's compilation), timed apart, so the timings of the real work are the
        # work's. The first model of each shape runs the plan's prefill form on the first
        # WARMUP_TOKENS tokens of the first window: kernels that autotune (flash-linear-
        # attention's) then choose their configurations on a realistic length, once per process;
        # a second model of the same shape reuses them and warms up on a few tokens.
        t = time.perf_counter()
        # Each warm-up step's time, so a slow warm-up says where it went (compilation and
        # autotuning show up as the step that first meets a kernel or a length).
        steps = timings.setdefault("warmup_steps", [])
        mark = [t]

        def step(what):
            if device != "cpu":
                torch.cuda.synchronize()
            now = time.perf_counter()
            steps.append({"model": side, "step": what, "seconds": now - mark[0]})
            mark[0] = now

        set_attention(m, spec.get("attn_implementation", "sdpa"))
        shape = (type(m).__name__, json.dumps(read_config(spec["path"]), sort_keys=True, default=str))
        n = min(WARMUP_TOKENS if shape not in warmed else 64, longest)
        ids = first_window[:n]
        rows = torch.arange(n - 1)
        h = prefill(torch, transformers, m, ids, rows, n if chunk >= longest else max(1, min(chunk, n // 2)))
        step(f"prefill of {n} tokens, every layer")
        if shape not in warmed and any(is_linear_attention(x) for x in m.modules()):
            # flash-linear-attention's Triton kernels compile for each sequence length they
            # meet (measured: ~10 s on the first 131,072-token prefill of a process, 0 after):
            # every length the run will prefill (the windows' and the self gate's prefix) is run
            # once here through the first layers only, one of each layer type.
            lengths = sorted({r["context_length"] for r in req["runs"]} | ({GATE_TOKENS} if req.get("gates") else set()))
            with first_layers(m):
                for length in lengths:
                    if n < length <= longest:
                        prefill(torch, transformers, m, longest_window[:length], torch.arange(1), chunk if chunk < length else length)
                        step(f"prefill of {length} tokens, first layer of each type")
        warmed.add(shape)
        logits = head_logits(torch, m, h[:2])
        reduce(torch, logits, logits, torch.zeros(2, dtype=torch.long, device=logits.device), vocab)
        del h, logits
        step("output head and reduction")
        linear_attention[side] = probe_linear_attention(torch, transformers, m, first_window[:min(64, longest)])
        step("linear-attention probe")
        if device != "cpu":
            torch.cuda.synchronize()
        timings["warmup"] += time.perf_counter() - t
        # Scales computed from the first forward pass are the measurement's, not the warm-up's.
        m.__dict__.pop("_cardproof_kv_scales", None)
        return m

    def hidden_of(model, spec, ids, keep, account="prefill"):
        """The kept rows' final hidden states; the time goes to `account` (the gates' own
        passes are timed as the gates', not as the measurement's)."""
        set_attention(model, spec.get("attn_implementation", "sdpa"))
        # Per side: one model shared by both sides (a sweep) switches its scheme with its side.
        model._cardproof_kv = kv_setting(spec, spec["path"])
        t = time.perf_counter()
        h = prefill(torch, transformers, model, ids, keep, chunk)
        if device != "cpu":
            torch.cuda.synchronize()
        timings[account] += time.perf_counter() - t
        return h

    dump = req.get("dump")
    # The fused kernel where Triton runs (CUDA); the torch path elsewhere or when asked.
    fused = device != "cpu" and req.get("reduction", "auto") != "torch" and triton_kernel() is not None
    reduce = reduce_rows_fused if fused else reduce_rows
    plan["reduction_kernel"] = "triton (fused, one read per row)" if fused else "torch"

    def dump_logits(ref_model, h_ref, cand_model, h_cand, targets, rows):
        """The first rows' logits of both models as `cardproof kld` reads them (f32, exact
        upcasts of what the head produced), so the device's reduction can be checked against
        cardproof's own on the same numbers."""
        n = min(dump["rows"], h_ref.shape[0])
        la = head_logits(torch, ref_model, h_ref[:n])[:, :vocab].float().cpu()
        lb = head_logits(torch, cand_model, h_cand[:n])[:, :vocab].float().cpu()
        os.makedirs(dump["dir"], exist_ok=True)
        for name, logits in (("reference", la), ("candidate", lb)):
            save_file(
                {
                    "logits": logits.contiguous(),
                    "tokens": targets[:n].int().contiguous(),
                    "positions": torch.tensor(rows[:n], dtype=torch.int64),
                },
                os.path.join(dump["dir"], f"{name}.logits.safetensors"),
            )

    def records_of(ref_model, h_ref, cand_model, h_cand, targets, shift=0, account="head_and_reduce"):
        """Reduce rows of the kept hidden states, head_rows at a time."""
        t = time.perf_counter()
        parts = []
        n = h_ref.shape[0] - shift
        for s in range(0, n, head_rows):
            e = min(n, s + head_rows)
            la = head_logits(torch, ref_model, h_ref[s:e])
            lb = head_logits(torch, cand_model, h_cand[s + shift:e + shift])
            if lb.device != la.device:
                lb = lb.to(la.device)
            rec = reduce(torch, la, lb, targets[s:e].to(la.device), vocab)
            parts.append(rec)
            del la, lb
        if device != "cpu":
            torch.cuda.synchronize()
        timings[account] += time.perf_counter() - t
        return {k: torch.cat([p[k] for p in parts]).cpu() for k in parts[0]}

    gates = None
    done = 0
    dumped = False
    results = []
    if mode == "side_by_side":
        ref_model = load(specs["reference"], "reference")
        if shared:
            linear_attention["candidate"] = linear_attention["reference"]
        cand_model = ref_model if shared else load(specs["candidate"], "candidate")
        for ri, (r, windows) in enumerate(runs):
            recs = []
            for w, ids in enumerate(windows):
                rows = r["window_rows"][w]
                if not rows:
                    # No token of this window is scored: nothing to run.
                    recs.append(None)
                    done += 1
                    progress("measuring", done, total_windows)
                    continue
                keep = torch.tensor(rows, dtype=torch.long)
                targets = next_tokens(torch, ids, rows, vocab)
                h_ref = hidden_of(ref_model, specs["reference"], ids, keep)
                h_cand = hidden_of(cand_model, specs["candidate"], ids, keep)
                recs.append(records_of(ref_model, h_ref, cand_model, h_cand, targets))
                if dump and not dumped:
                    dumped = True
                    dump_logits(ref_model, h_ref, cand_model, h_cand, targets, rows)
                if req.get("gates") and gates is None:
                    gates = run_gates(torch, timings, hidden_of, records_of, ref_model, cand_model, specs, ids, keep, targets, h_ref, h_cand)
                del h_ref, h_cand
                done += 1
                progress("measuring", done, total_windows)
            results.append(recs)
    else:
        # Reference first, its final hidden states at the scored rows kept (exact: the logits
        # are recomputed from them with the reference's head), then the candidate; the
        # reference's output head stays loaded for the reduction. Where they are kept: on the
        # head's device when they take under a quarter of its free memory, else in host memory
        # when under half of what the host has free, else on disk beside the results.
        ref_model = load(specs["reference"], "reference")
        ref_record = model_record(ref_model, specs["reference"])
        kept = []
        all_rows = sum(len(rows) for r in req["runs"] for rows in r["window_rows"])
        kept_bytes = all_rows * cfg.get("hidden_size", 0) * dtype_size
        where = req.get("keep_hidden") or "auto"
        if where == "auto":
            host_free = free_bytes(torch, "cpu") or 0
            if device != "cpu" and kept_bytes <= 0.25 * (plan.get("free_bytes") or 0):
                where = "device"
            elif kept_bytes <= 0.5 * host_free:
                where = "host"
            else:
                where = "disk"
        plan["kept_hidden_where"] = where
        spill = os.path.join(req["result_dir"], "spill")

        def stash(h, ri, w):
            if where == "device":
                return h
            if where == "host":
                return h.cpu()
            os.makedirs(spill, exist_ok=True)
            path = os.path.join(spill, f"run{ri}-window{w}.pt")
            torch.save(h.cpu(), path)
            return path

        def unstash(x, last=True):
            if isinstance(x, str):
                h = torch.load(x, weights_only=True)
                if last:
                    os.remove(x)
                return h
            return x

        for ri, (r, windows) in enumerate(runs):
            hs = []
            for w, ids in enumerate(windows):
                rows = r["window_rows"][w]
                if not rows:
                    hs.append(None)
                    done += 1
                    progress("measuring reference", done, 2 * total_windows)
                    continue
                keep = torch.tensor(rows, dtype=torch.long)
                h = hidden_of(ref_model, specs["reference"], ids, keep)
                if req.get("gates") and gates is None:
                    targets = next_tokens(torch, ids, rows, vocab)
                    gates = gate_self(torch, timings, hidden_of, records_of, ref_model, specs, ids, keep, targets, h)
                hs.append(stash(h, ri, w))
                del h
                done += 1
                progress("measuring reference", done, 2 * total_windows)
            kept.append(hs)
        ref_head = ref_model.get_output_embeddings()
        ref_cfg = ref_model.config
        # The record was taken before the pass; the scales it computed are known only now.
        ref_record["kv_scales"] = kv_scales_record(ref_model, kv_setting(specs["reference"], specs["reference"]["path"]))
        del ref_model
        if device != "cpu":
            torch.cuda.empty_cache()

        class HeadOnly:
            config = ref_cfg

            @staticmethod
            def get_output_embeddings():
                return ref_head

        arm_list = arm_specs or [specs["candidate"]]
        arm_results = []
        for ai, cspec in enumerate(arm_list):
            last = ai == len(arm_list) - 1
            t_arm = time.perf_counter()
            what = f"arm {ai + 1}/{len(arm_list)}" if arm_specs else "candidate"
            if arm_specs:
                done = 0
            cand_model = load(cspec, "candidate")
            shifted = False
            arm_runs = []
            for ri, (r, windows) in enumerate(runs):
                recs = []
                for w, ids in enumerate(windows):
                    rows = r["window_rows"][w]
                    if not rows:
                        recs.append(None)
                        done += 1
                        progress(f"measuring {what}", done, total_windows if arm_specs else 2 * total_windows)
                        continue
                    keep = torch.tensor(rows, dtype=torch.long)
                    targets = next_tokens(torch, ids, rows, vocab)
                    h_ref = unstash(kept[ri][w], last).to(ref_head.weight.device)
                    h_cand = hidden_of(cand_model, cspec, ids, keep)
                    recs.append(records_of(HeadOnly, h_ref, cand_model, h_cand, targets))
                    if req.get("gates") and not shifted:
                        shifted = True
                        gates["shift_forward_mean"] = gate_shift(torch, timings, records_of, HeadOnly, h_ref, cand_model, h_cand, targets)
                    if last:
                        kept[ri][w] = None
                    done += 1
                    progress(f"measuring {what}", done, total_windows if arm_specs else 2 * total_windows)
                arm_runs.append(recs)
            cand_record = model_record(cand_model, cspec)
            cand_record["attention"] = attn_used(cand_model)
            if device != "cpu":
                torch.cuda.synchronize()
            arm_results.append((arm_runs, cand_record, time.perf_counter() - t_arm))
            if not last:
                del cand_model
                if device != "cpu":
                    torch.cuda.empty_cache()
        results = arm_results[0][0]

    os.makedirs(req["result_dir"], exist_ok=True)

    def save_runs(results, suffix):
        files = []
        for ri, ((r, windows), recs) in enumerate(zip(runs, results)):
            per_window = r["window_rows"]
            n_rows = sum(len(rows) for rows in per_window)
            ran = [x for x in recs if x is not None]
            tensors = {k: torch.cat([x[k] for x in ran]).contiguous() for k in ran[0]}
            counts = torch.tensor([len(rows) for rows in per_window], dtype=torch.long)
            tensors["window"] = torch.arange(len(windows), dtype=torch.int32).repeat_interleave(counts)
            tensors["position"] = torch.tensor([j for rows in per_window for j in rows], dtype=torch.int64)
            path = os.path.join(req["result_dir"], f"run{ri}{suffix}.safetensors")
            save_file(tensors, path + ".tmp", metadata={"context_length": str(r["context_length"]), "rows": str(n_rows)})
            os.replace(path + ".tmp", path)
            files.append({"context_length": r["context_length"], "path": path, "rows": n_rows})
        return files

    files = save_runs(results, "")
    arms_out = None
    if arm_specs:
        arms_out = [
            {"runs": save_runs(arm_runs, f"-arm{ai}"), "model": rec, "seconds": seconds}
            for ai, (arm_runs, rec, seconds) in enumerate(arm_results)
        ]
        cand_model = None
    timings["total"] = time.perf_counter() - t0
    if mode == "side_by_side":
        ref_record = model_record(ref_model, specs["reference"])
    if arm_specs:
        models = {"reference": ref_record, "candidate": arms_out[0]["model"]}
    else:
        models = {"reference": ref_record, "candidate": model_record(cand_model, specs["candidate"])}
        models["candidate"]["attention"] = attn_used(cand_model)
    # A shared model switches attention per side: record what each side asked for and got.
    models["reference"]["attention"] = specs["reference"].get("attn_implementation", "sdpa")
    env = environment(torch, transformers, req, models, timings, plan, mode)
    if any(linear_attention.get(side) for side in ("reference", "candidate")):
        env["linear_attention"] = {side: linear_attention.get(side) for side in ("reference", "candidate")}
        if device != "cpu":
            for side, rec in env["linear_attention"].items():
                if rec and rec["gdn_kernel"] == "torch_fallback":
                    sys.stderr.write(
                        f"warning: the {side}'s Gated DeltaNet layers ran transformers' torch fallback "
                        "(flash-linear-attention is not installed): correct, but far slower on a GPU\n"
                    )
    out = {
        "environment": env,
        "runs": files,
        "gates": gates,
    }
    if arms_out is not None:
        out["arms"] = arms_out
    return out


def gate_self(torch, timings, hidden_of, records_of, ref_model, specs, ids, keep, targets, h_ref):
    """The first gate, on the first window: the reference run a second time against the first
    run (must give exactly 0 and identical top-1). A window over GATE_TOKENS tokens is not run
    a third time whole: its first GATE_TOKENS tokens are run twice and compared (the same kernels
    on the same inputs; a fraction of the measurement's cost). Its passes are timed as the
    gates' (`account`)."""
    if len(ids) <= GATE_TOKENS:
        again = hidden_of(ref_model, specs["reference"], ids, keep, account="gates")
        same = records_of(ref_model, h_ref, ref_model, again, targets, account="gates")
    else:
        # At least the first kept row inside the prefix; the rows are the first kept rows, so
        # their targets are the first targets.
        n = min(len(ids), max(GATE_TOKENS, int(keep[0]) + 2))
        rows = keep[keep <= n - 2]
        first = hidden_of(ref_model, specs["reference"], ids[:n], rows, account="gates")
        again = hidden_of(ref_model, specs["reference"], ids[:n], rows, account="gates")
        same = records_of(ref_model, first, ref_model, again, targets[: rows.numel()], account="gates")
    ok = same["finite"].bool()
    return {
        "self_forward_mean": float(same["forward"][ok].mean()) if ok.any() else float("nan"),
        "self_reverse_mean": float(same["reverse"][ok].mean()) if ok.any() else float("nan"),
        "self_top1_identical": bool((same["ref_top1"] == same["cand_top1"]).all()),
        "self_tokens": len(ids) if len(ids) <= GATE_TOKENS else n,
    }


def gate_shift(torch, timings, records_of, ref_model, h_ref, cand_model, h_cand, targets):
    """The second gate: reference row k against candidate row k+1 of the kept rows (consecutive
    rows when every row is scored; the point is misalignment, not which rows): a large KL."""
    out = float("nan")
    if h_ref.shape[0] > 1:
        shifted = records_of(ref_model, h_ref, cand_model, h_cand, targets[:-1], shift=1, account="gates")
        ok = shifted["finite"].bool()
        out = float(shifted["forward"][ok].mean()) if ok.any() else float("nan")
    return out


def run_gates(torch, timings, hidden_of, records_of, ref_model, cand_model, specs, ids, keep, targets, h_ref, h_cand):
    """Both gates on the first window, both models loaded."""
    out = gate_self(torch, timings, hidden_of, records_of, ref_model, specs, ids, keep, targets, h_ref)
    out["shift_forward_mean"] = gate_shift(torch, timings, records_of, ref_model, h_ref, cand_model, h_cand, targets)
    return out


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: transformers_runner.py REQUEST.json\n")
        return 2
    record_path = None
    try:
        req = read_request(argv[1])
        record_path = req["record_path"]
        record = run(req)
        write_json(record_path, {"protocol": PROTOCOL, "ok": True, **record})
        return 0
    except RunnerError as e:
        doc = {"protocol": PROTOCOL, "ok": False, "error": {"kind": e.kind, "message": str(e)}}
        code = 3
    except Exception as e:  # noqa: BLE001 - every failure must reach cardproof as a record
        if "OutOfMemoryError" in type(e).__name__:
            kind = "out_of_memory"
        elif isinstance(e, ImportError):
            # A package the checkpoint's loader or kernels need is not installed here (e.g.
            # transformers' FP8 path wants `kernels`): the environment's problem, not a bug.
            kind = "missing_package"
        else:
            kind = "internal"
        doc = {
            "protocol": PROTOCOL,
            "ok": False,
            "error": {"kind": kind, "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()},
        }
        code = 4
    if record_path is None:
        # No request to say where: the error goes to stderr, which cardproof shows.
        sys.stderr.write(json.dumps(doc) + "\n")
    else:
        write_json(record_path, doc)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
