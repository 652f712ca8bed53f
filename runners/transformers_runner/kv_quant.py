"""KV-cache schemes (issue #18): the same formulas as cardproof's native runner
(src/runner/native/kv_cache.rs), in float32 torch, applied where the engine writes the cache.
Checked bit for bit against the native runner's fixtures by tests/kv_quant_check.py."""

import functools
import math

from .model import read_config
from .protocol import RunnerError


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
