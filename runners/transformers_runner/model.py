"""The models: the checkpoint's files and config, the compute dtype, loading through transformers
(safetensors only, remote code only when the request allows it), the attention implementation
asked for and the one in use, and the layer structure the warm-up and the probes look at."""

import json
import math
import os
import struct

from .protocol import RunnerError


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
        # `sdpa:BACKEND` loads as sdpa; the backend is held at each pass (`sdpa_backend`).
        attn_implementation=spec.get("attn_implementation", "sdpa").partition(":")[0],
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


def head_logits(torch, model, hidden):
    """The output head on some rows, exactly as the model's own forward applies it."""
    with torch.inference_mode():
        logits = model.get_output_embeddings()(hidden)
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
    return logits


# torch's SDPA backends by the names an attention value gives them (`sdpa:flash`): the one
# backend SDPA may use for every pass of the model (torch.nn.attention.sdpa_kernel); a backend
# that cannot run a call raises, so the backend recorded is the one that ran.
SDPA_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}


# The name eager attention in query blocks is registered under, per block size (see
# `eager_in_blocks`).
EAGER_BLOCKS_PREFIX = "cardproof_eager_query_block_"


def eager_in_blocks(torch, transformers, block):
    """Register (once per block size) eager attention taken `block` queries at a time: for each
    block, the model's own `eager_attention_forward` on those queries against every key, with
    those rows of eager's mask (the same row-wise math: scores, mask, float32 softmax, cast,
    values), the outputs concatenated. Every head's scores then exist for one block at a time,
    not for the whole chunk (the memory plan's choice where the chunk's would not fit). Returns
    the implementation's name."""
    import sys

    name = f"{EAGER_BLOCKS_PREFIX}{block}"
    registry = transformers.AttentionInterface
    if name in getattr(registry, "_global_mapping", {}):
        return name

    def attention(module, query, key, value, attention_mask, **kwargs):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        n = query.shape[2]
        outs = []
        for s in range(0, n, block):
            mask = attention_mask[:, :, s:s + block, :] if attention_mask is not None else None
            out, _ = eager(module, query[:, :, s:s + block], key, value, mask, **kwargs)
            outs.append(out)
        return torch.cat(outs, 1), None

    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    registry.register(name, attention)
    AttentionMaskInterface.register(name, eager_mask)
    return name


# The name SDPA held to one backend is registered under (see `sdpa_held`).
SDPA_HELD = "cardproof_sdpa_held"
# The backend the passes now running are held to (set by `sdpa_backend`; read by `sdpa_held`).
_HELD = {"backend": None}


def lower_right_causal(torch, mask, q_len, k_len):
    """Whether `mask` (transformers' boolean SDPA mask, one sequence) is exactly the causal mask
    of `q_len` queries that end where the `k_len` keys end: every earlier key visible, the
    chunk's own keys causally (a prefill chunk after the first, a decode step)."""
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or tuple(mask.shape) != (1, 1, q_len, k_len):
        return False
    expected = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril(k_len - q_len)
    return torch.equal(mask[0, 0], expected)


def sdpa_held(torch, transformers):
    """Register (once) SDPA for a model held to one backend other than math (`sdpa:flash`,
    `efficient`, `cudnn`): transformers' own `sdpa_attention_forward`, except where the mask is
    plain causality. There the grouped keys are repeated to the query heads (efficient and cuDNN
    take no `enable_gqa`) and a chunk's causal mask is passed as torch's lower-right causal bias
    (`torch.nn.attention.bias.causal_lower_right`, the same mask) instead of a boolean tensor: the
    fused backends run that bias in their own kernels (flash's and efficient's causal variant for
    queries that end where the keys end), as an engine's chunked prefill does, where a boolean
    mask only the math backend (and efficient's slower masked path) takes. Inside the backend's
    `sdpa_kernel` torch's dispatch of the bias uses only that backend. Returns the name."""
    registry = transformers.AttentionInterface
    if SDPA_HELD in getattr(registry, "_global_mapping", {}):
        return SDPA_HELD
    from torch.nn.attention.bias import causal_lower_right
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        q_len, k_len = query.shape[2], key.shape[2]
        plain = attention_mask is None and (q_len == k_len or q_len == 1)
        if dropout or not (plain or lower_right_causal(torch, attention_mask, q_len, k_len)):
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
        groups = query.shape[1] // key.shape[1]
        if groups > 1:
            key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        f = torch.nn.functional.scaled_dot_product_attention
        if q_len == k_len:
            out = f(query, key, value, is_causal=q_len > 1, scale=scaling)
        elif q_len == 1:
            out = f(query, key, value, scale=scaling)
        else:
            out = f(query, key, value, attn_mask=causal_lower_right(q_len, k_len), scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    registry.register(SDPA_HELD, attention)
    AttentionMaskInterface.register(SDPA_HELD, sdpa_mask)
    return SDPA_HELD


def sdpa_calls(torch, backend, heads, kv_heads, dim, dtype, device, chunked):
    """The SDPA calls a model held to `backend` makes, on small tensors at its heads, head size
    and dtype: (what, call) pairs. transformers' own for math (grouped keys by `enable_gqa`
    where the head size allows; a chunk under a boolean mask), `sdpa_held`'s for the others
    (keys repeated; a chunk under the lower-right causal bias)."""
    f = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(1, heads, 64, dim, dtype=dtype, device=device)
    kv = torch.randn(1, kv_heads, 64, dim, dtype=dtype, device=device)
    long_kv = torch.randn(1, heads, 128, dim, dtype=dtype, device=device)
    if backend == "math":
        gqa = {"enable_gqa": True} if kv_heads != heads and dim <= 256 else {}
        calls = [("a causal pass without a mask", lambda: f(q, kv if gqa else q, kv if gqa else q, is_causal=True, **gqa))]
        mask = torch.ones(64, 128, dtype=torch.bool, device=device).tril(64)[None, None]
        chunk = ("a chunk's queries against the cache under a mask", lambda: f(q, long_kv, long_kv, attn_mask=mask))
    else:
        from torch.nn.attention.bias import causal_lower_right

        calls = [("a causal pass without a mask", lambda: f(q, q, q, is_causal=True))]
        chunk = ("a chunk's queries against the cache under the lower-right causal bias",
                 lambda: f(q, long_kv, long_kv, attn_mask=causal_lower_right(64, 128)))
    return calls + [chunk] if chunked else calls


def attn_used(model):
    """The attention implementation in use, with the SDPA backend it is held to (`sdpa:flash`);
    eager in query blocks is eager."""
    impl = getattr(model.config, "_attn_implementation", None) or "unknown"
    if impl.startswith(EAGER_BLOCKS_PREFIX):
        return "eager"
    if impl == SDPA_HELD:
        impl = "sdpa"
    backend = getattr(model, "_cardproof_sdpa", None)
    return f"{impl}:{backend}" if backend and impl == "sdpa" else impl


def set_attention(model, impl):
    """`impl` for the model's next passes: transformers' implementation, and for `sdpa:BACKEND`
    the one SDPA backend its passes may use (see `sdpa_backend`)."""
    base, _, backend = impl.partition(":")
    if backend and (base != "sdpa" or backend not in SDPA_BACKENDS):
        raise RunnerError("bad_request", f"attention {impl!r}: a backend is sdpa's, one of {', '.join('sdpa:' + b for b in SDPA_BACKENDS)}")
    model._cardproof_sdpa = backend or None
    block = getattr(model, "_cardproof_eager_block", None)
    if base == "eager" and block:
        # The memory plan cut eager's queries into blocks (see `eager_in_blocks`).
        import torch
        import transformers

        base = eager_in_blocks(torch, transformers, block)
    elif base == "sdpa" and backend and backend != "math":
        import torch
        import transformers

        base = sdpa_held(torch, transformers)
    if (getattr(model.config, "_attn_implementation", None) or "unknown") == base:
        return
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        raise RunnerError("unsupported", f"this transformers cannot switch attention to {base} on a loaded model")
    setter(base)
    if attn_used(model) != impl:
        raise RunnerError("unsupported", f"attention {impl} was asked for but {attn_used(model)} is in use")


def check_sdpa_backends(torch, req, cfg, dtype, chunked):
    """Every `sdpa:BACKEND` of the request's models tried, before anything loads, on the calls
    its passes make at the model's heads, head size and dtype (`sdpa_calls`: a causal pass
    without a mask, a window in one pass or a first chunk; with `chunked`, a chunk's queries
    against more keys). A backend that cannot run one of them is refused here, naming the model,
    rather than after the passes before it (an efficient-backend arm at 32k was refused after
    five minutes of a study)."""
    models = req["models"]
    named = [("the reference", models["reference"]), ("the candidate", models["candidate"])]
    named += [(f"arm `{a.get('name') or i + 1}`", a) for i, a in enumerate(models.get("arms") or [])]
    asked = {}
    for name, m in named:
        base, _, backend = m.get("attn_implementation", "sdpa").partition(":")
        if base == "sdpa" and backend:
            asked.setdefault(backend, []).append(name)
    if not asked:
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads = cfg.get("num_attention_heads", 1)
    kv_heads = cfg.get("num_key_value_heads", heads) or heads
    dim = cfg.get("head_dim") or cfg.get("hidden_size", 0) // max(heads, 1)
    device = "cpu" if req.get("device", "cuda") == "cpu" else "cuda"
    for backend, names in asked.items():
        for what, call in sdpa_calls(torch, backend, heads, kv_heads, dim, dtype, device, chunked):
            try:
                with torch.inference_mode(), sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[backend])]):
                    call()
            except RuntimeError as e:
                raise RunnerError(
                    "unsupported",
                    f"attention sdpa:{backend} ({', '.join(names)}): torch's {backend} backend cannot run {what} at this model's "
                    f"{heads} heads, {kv_heads} key heads of {dim} in {str(dtype).replace('torch.', '')} on {device}: "
                    f"{str(e).splitlines()[0]}; refused before loading",
                ) from e


class sdpa_backend:
    """The model's passes inside the `with` block held to its SDPA backend (`set_attention`);
    nothing when it has none. A pass the backend cannot run is a clear error."""

    def __init__(self, torch, model):
        self.torch, self.backend, self.ctx = torch, getattr(model, "_cardproof_sdpa", None), None

    def __enter__(self):
        if self.backend:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            self.ctx = sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[self.backend])])
            self.ctx.__enter__()
            self.outer, _HELD["backend"] = _HELD["backend"], self.backend
        return self

    def __exit__(self, kind, exc, tb):
        if self.ctx is not None:
            self.ctx.__exit__(kind, exc, tb)
            _HELD["backend"] = self.outer
        if exc is not None and self.backend and isinstance(exc, RuntimeError) and "kernel" in str(exc).lower():
            raise RunnerError(
                "unsupported",
                f"attention sdpa:{self.backend} was asked for, but torch's {self.backend} backend cannot run this pass (dtype, head size, mask or device): {str(exc).splitlines()[0]}",
            ) from exc
        return False


def input_device(model):
    emb = model.get_input_embeddings()
    return emb.weight.device


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
