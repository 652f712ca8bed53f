"""The recurrent-state dtype (`--recurrent-state-dtype`, a study arm's `recurrent_state`): the
carried state of linear-attention (Gated DeltaNet) layers kept in a lower precision between
calls, as an engine stores its SSM state (vLLM's `--mamba-ssm-cache-dtype`). An engine
materialises the state only between its kernel calls: at the end of each prefill chunk and after
every decode step; inside a call the kernels keep it in fp32. So after every cached forward pass
the recurrent state and the conv state (the last inputs the causal conv reads) of every
linear-attention layer are rounded (round to nearest even) to the dtype, in place, as the native
runner rounds what its hybrid layers carry (src/runner/native/hybrid.rs)."""

from .model import is_linear_attention
from .protocol import RunnerError
from .provenance import cached_state

# The request's names and torch's dtype attribute for each (`f32`: nothing is rounded).
STATE_DTYPES = {"f32": None, "bf16": "bfloat16", "f16": "float16"}


def state_setting(torch, model, spec):
    """The torch dtype `spec` keeps the recurrent state in (None: not rounded), checked against
    the model: a state dtype on a model without linear-attention layers is refused."""
    name = spec.get("recurrent_state") or "f32"
    if name not in STATE_DTYPES:
        raise RunnerError("bad_request", f"recurrent_state {name!r} is not one of {', '.join(STATE_DTYPES)}")
    attr = STATE_DTYPES[name]
    if attr is None:
        return None
    layers = [getattr(m, "layer_idx", None) for m in model.modules() if is_linear_attention(m)]
    if not layers or None in layers:
        raise RunnerError("unsupported", f"{spec['path']}: recurrent_state {name} asked for, but the model has no linear-attention layers whose state the cache holds")
    return getattr(torch, attr), tuple(layers)


def store_states(model, cache):
    """Round the linear-attention layers' carried states in `cache` to the model's state dtype
    (set by `state_setting` as `model._cardproof_state`), as the engine stores them."""
    setting = getattr(model, "_cardproof_state", None)
    if setting is None or cache is None:
        return
    dtype, layers = setting
    for idx in layers:
        for kind in ("recurrent", "conv"):
            t = cached_state(cache, idx, kind)
            if t is None:
                raise RunnerError("unsupported", f"layer {idx}: no {kind} state in the cache to keep in {dtype} (this transformers stores it elsewhere)")
            if t.dtype != dtype:
                t.copy_(t.to(dtype))
