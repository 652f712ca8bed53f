"""What ran, recorded: versions, devices and torch switches (`environment`), each model's record
(attention, dtypes, KV-cache scheme and computed scales, placement), and the kernels and state
dtypes of linear-attention (Gated DeltaNet) layers as observed in the warm-up."""

import os
import sys

from .kv_quant import kv_label, kv_setting
from .model import attn_used, input_device, is_linear_attention
from .protocol import PROTOCOL


# ---------------------------------------------------------------------------------------------
# Kernel choices of linear-attention (Gated DeltaNet) layers, observed


# The functions transformers dispatches through `use_kernel_func_from_hub_with_fallback` in a
# prefill (decode's recurrent form and conv update never run here), by the names it resolves.
PREFILL_KERNELS = ("chunk_gated_delta_rule", "causal_conv1d_fn")
# The distributions that ship each importable kernel package.
KERNEL_DISTRIBUTIONS = {"fla": ("flash-linear-attention", "fla-core"), "causal_conv1d": ("causal-conv1d",)}


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


def probe_linear_attention(torch, transformers, model, ids, watch=None):
    """The kernels a model's GDN layers run in prefill and the dtypes their states hold. With
    `watch` (the warm-up's one-pass prefill, watched), the kernels as it saw them and no states:
    a run whose windows are each one pass stores none, and probing a cached pass would compile
    kernels it never runs. Without, observed on `ids` (a few tokens): one pass without a cache
    watched for the kernels, then two chunks with a cache (the chunked prefill), whose conv and
    recurrent states are read back. None for a model without linear-attention layers."""
    layers = [m for m in model.modules() if is_linear_attention(m)]
    if not layers:
        return None
    recurrent, conv = set(), set()
    if watch is not None:
        observed_in = "the warm-up's one-pass prefill (a one-pass run stores no recurrent or conv state)"
    else:
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
        for layer in layers:
            idx = getattr(layer, "layer_idx", None)
            recurrent.add(dtype_name(cached_state(cache, idx, "recurrent")))
            conv.add(dtype_name(cached_state(cache, idx, "conv")))
        observed_in = f"the warm-up: one pass and a two-chunk cached prefill of {x.shape[1]} tokens"
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
        "observed_in": observed_in,
    }


# ---------------------------------------------------------------------------------------------
# The record of the run


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
        # Linear-attention layers (a carried recurrent state), and the dtype cardproof stores
        # that state in after each cached pass (`f32`: as the model keeps it).
        "linear_attention_layers": sum(1 for m in model.modules() if is_linear_attention(m)),
        "recurrent_state": spec.get("recurrent_state") or "f32",
        # The GDN kernel the runner held the layers to (None: transformers' own choice, which
        # the warm-up observes).
        "gdn_kernel": spec.get("gdn_kernel"),
    }
