"""The Gated DeltaNet kernel (`gdn_kernel`: a kernel axis of the seed study, beside attention):
which implementation of the gated delta rule a hybrid model's linear-attention layers run.

- `fla`: flash-linear-attention's chunked kernel in prefill, its fused recurrent kernel in decode
  (what transformers picks when the package is installed);
- `fla_recurrent`: flash-linear-attention's fused recurrent kernel for every token, prefill too;
- `torch`: transformers' own torch functions (chunked in prefill, recurrent in decode);
- `torch_recurrent`: transformers' torch recurrent function for every token, prefill too.

transformers resolves the implementation once, at import, behind a dispatch shim; the runner
holds a model's layers to the asked one for each of its passes by replacing the functions the
layers call (`torch_chunk_gated_delta_rule` and `torch_recurrent_gated_delta_rule` of the
model's module, or the layer's own attributes where an older transformers keeps them there) for
the duration of the pass, with wrappers that count their calls: a pass through linear-attention
layers in which the asked kernel did not run is an error, so the kernel recorded is the one that
ran. Absent: whatever transformers picked (recorded by the warm-up's observation)."""

import inspect
import sys

from .model import is_linear_attention
from .protocol import RunnerError

GDN_KERNELS = ("fla", "fla_recurrent", "torch", "torch_recurrent")
# The names transformers' GDN layers call the delta rule by (prefill's chunked form, decode's
# recurrent form), as module globals (transformers 5) or layer attributes (older Qwen3-Next).
CALLED = (("torch_chunk_gated_delta_rule", "chunk_gated_delta_rule"), ("torch_recurrent_gated_delta_rule", "recurrent_gated_delta_rule"))


def unwrapped(f):
    """transformers' own torch function behind its dispatch shim (functools.wraps)."""
    seen = 0
    while getattr(f, "__wrapped__", None) is not None and seen < 8:
        f = f.__wrapped__
        seen += 1
    return f


def gdn_setting(model, spec):
    """The kernel `spec` asks the model's GDN layers to run (None: transformers' choice), resolved
    to (name, where, prefill function, decode function); refused for a model without
    linear-attention layers, a kernel whose package is missing, or a transformers whose layers
    call the delta rule by names this runner does not know."""
    name = spec.get("gdn_kernel")
    if not name:
        return None
    if name not in GDN_KERNELS:
        raise RunnerError("bad_request", f"gdn_kernel {name!r} is not one of {', '.join(GDN_KERNELS)}")
    layers = [m for m in model.modules() if is_linear_attention(m)]
    if not layers:
        raise RunnerError("unsupported", f"{spec['path']}: gdn_kernel {name} asked for, but the model has no Gated DeltaNet layers")
    module = sys.modules[type(layers[0]).__module__]
    if all(hasattr(module, glob) for glob, _ in CALLED):
        where = ("module", module)
        current = [getattr(module, glob) for glob, _ in CALLED]
    elif all(hasattr(layers[0], attr) for _, attr in CALLED):
        where = ("layers", layers)
        current = [getattr(layers[0], attr) for _, attr in CALLED]
    else:
        raise RunnerError("unsupported", f"gdn_kernel {name}: this transformers' {type(layers[0]).__name__} calls the delta rule by names the runner does not know")
    if name.startswith("torch"):
        prefill, decode = (unwrapped(f) for f in current)
        if name == "torch_recurrent":
            prefill = decode
    else:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        except ImportError as e:
            raise RunnerError("missing_package", f"gdn_kernel {name} asked for, but flash-linear-attention cannot be imported: {e}")
        prefill = chunk_gated_delta_rule if name == "fla" else fused_recurrent_gated_delta_rule
        decode = fused_recurrent_gated_delta_rule
    return name, where, prefill, decode


class Counted:
    """`f` called with the keyword arguments it takes (as transformers' shim filters them),
    counting its calls."""

    def __init__(self, f):
        self.f, self.calls = f, 0
        self.params = set(inspect.signature(f).parameters)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.f(*args, **{k: v for k, v in kwargs.items() if k in self.params})


class gdn_kernel:
    """The model's passes inside the `with` block run the GDN kernel `gdn_setting` resolved
    (`model._cardproof_gdn`); nothing when it has none. The replaced functions are restored on
    exit, and a pass in which neither ran is an error."""

    def __init__(self, model):
        self.setting = getattr(model, "_cardproof_gdn", None)
        self.saved = []

    def __enter__(self):
        if self.setting is None:
            return self
        name, (kind, where), prefill, decode = self.setting
        self.counted = [Counted(prefill), Counted(decode)]
        targets = [where] if kind == "module" else list(where)
        for target in targets:
            for (glob, attr), f in zip(CALLED, self.counted):
                key = glob if kind == "module" else attr
                self.saved.append((target, key, getattr(target, key)))
                setattr(target, key, f)
        return self

    def __exit__(self, kind, exc, tb):
        for target, key, f in reversed(self.saved):
            setattr(target, key, f)
        self.saved = []
        if exc is None and self.setting is not None and not any(c.calls for c in self.counted):
            raise RunnerError("unsupported", f"gdn_kernel {self.setting[0]} was asked for, but the model's Gated DeltaNet layers did not call it (this transformers dispatches elsewhere)")
        return False
