#!/usr/bin/env python3
"""Independent float64 oracle for cardproof's native runner (numpy only).

Runs `cardproof measure` on the example checkpoints with --dump-logits, then recomputes everything
the runner reports from the checkpoint files alone, with code that shares nothing with the Rust
implementation: its own safetensors reader, its own dequantizers (compressed-tensors int8/int4,
fine-grained FP8 with weight_scale_inv, AWQ GEMM), and a float64 forward pass for the Qwen3,
Qwen2, Llama and Mistral decoder families read from config.json.

Checks, for each candidate in CANDIDATES:
  (a) the dumped reference and candidate logits equal the oracle's, compared as log-softmax
      rows: max |difference| < LOGIT_TOL (the runner computes in float32);
  (b) the oracle's mean forward KL(P_ref || P_cand) (float64, full vocabulary) equals
      measurement.json runs[0].metrics.kld_mean to a relative KLD_REL_TOL, the oracle's top-1
      agreement equals runs[0].metrics.top1_agreement within 2/N, and n_positions == N;
  (c) tokens[i] == input_ids[window[i], positions[i] + 1] (the scored token is the true next one);
and (d) a measurement of the reference against itself gives kld_mean == 0 and
top1_agreement == 1 exactly.

    python3 tests/native_oracle.py        # the debug binary in $CARGO_TARGET_DIR, else target/
    python3 tests/native_oracle.py --cardproof path/to/cardproof
    python3 tests/native_oracle.py --work-dir /tmp/oracle --no-run   # re-check existing dumps

Exits 0 when every check passes, 1 on any failure (each failure is printed), 2 on a usage or
setup error (missing binary, missing files, cardproof exiting non-zero).
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

# The oracle multiplies small matrices; OpenBLAS's threading costs ~10x more than it saves there.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MODELS = os.path.join(ROOT, "examples", "models")
EVAL_TEXT = os.path.join(ROOT, "examples", "data", "eval.txt")
REFERENCE = "shakespeare-bf16"
CANDIDATES = ["shakespeare-w8a16", "shakespeare-fp8-block", "shakespeare-awq-int4"]
EVAL_CHARS = 3000
CONTEXT_LENGTH = 64

LOGIT_TOL = 1e-3
KLD_REL_TOL = 2e-2


class SetupError(Exception):
    pass


# ============================================================================================
# safetensors reader
# ============================================================================================


def _f8_e4m3fn_table():
    """All 256 float8_e4m3fn values: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities,
    S.1111.111 is NaN."""
    table = np.empty(256, dtype=np.float64)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exp = (byte >> 3) & 0xF
        man = byte & 0x7
        if exp == 0xF and man == 0x7:
            table[byte] = np.nan
        elif exp == 0:
            table[byte] = sign * (man / 8.0) * 2.0**-6
        else:
            table[byte] = sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)
    return table


F8_E4M3_TABLE = _f8_e4m3fn_table()

_RAW = {
    "BF16": "<u2",
    "F16": "<f2",
    "F32": "<f4",
    "F64": "<f8",
    "I8": "i1",
    "U8": "u1",
    "I16": "<i2",
    "I32": "<i4",
    "I64": "<i8",
    "F8_E4M3": "u1",
}


def _decode(dtype, raw):
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E4M3":
        return F8_E4M3_TABLE[raw]
    return raw


def read_safetensors(path):
    """{name: ndarray}. Floats decode to float32/float64 (BF16 via bits << 16, F8_E4M3 via the
    table above), integers stay integers."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SetupError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in _RAW:
            raise SetupError(f"{path}: {name}: dtype {dtype} not supported by the oracle")
        dt = np.dtype(_RAW[dtype])
        begin, end = info["data_offsets"]
        count = int(np.prod(info["shape"], dtype=np.int64))
        if end - begin != count * dt.itemsize or base + end > len(blob):
            raise SetupError(f"{path}: {name}: data_offsets do not match shape/dtype")
        raw = np.frombuffer(blob, dtype=dt, count=count, offset=base + begin).reshape(info["shape"])
        out[name] = _decode(dtype, raw)
    return out


def read_model_tensors(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(index):
        raise SetupError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        out.update(read_safetensors(os.path.join(model_dir, name)))
    return out


# ============================================================================================
# dequantization: every function returns {module_prefix + ".weight": float64 [out, in]}
# ============================================================================================


def _expand_blocks(scale, shape):
    """Broadcast a [ceil(out/br), ceil(in/bc)] grid to [out, in]."""
    out_f, in_f = shape
    br = -(-out_f // scale.shape[0])
    bc = -(-in_f // scale.shape[1])
    return np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:out_f, :in_f]


def _unpack_ct_int32(packed, num_bits, n, axis):
    """compressed-tensors pack_to_int32: value i of each int32 (bits i*b..) is element
    pack*k + i along `axis`, stored with an offset of 2^(b-1)."""
    pack = 32 // num_bits
    u = packed.astype(np.int64) & 0xFFFFFFFF
    parts = [(u >> (num_bits * i)) & ((1 << num_bits) - 1) for i in range(pack)]
    stacked = np.stack(parts, axis=axis + 1)  # [..., k, i, ...]
    shape = list(packed.shape)
    shape[axis] *= pack
    values = stacked.reshape(shape)
    values = np.take(values, np.arange(n), axis=axis)
    return values - (1 << (num_bits - 1))


def dequant_compressed_tensors(t, qcfg):
    fmt = qcfg.get("format")
    weights = {}
    modules = sorted({k.rsplit(".", 1)[0] for k in t if k.endswith(".weight_scale")})
    for m in modules:
        scale = t[m + ".weight_scale"].astype(np.float64)
        zp = t.get(m + ".weight_zero_point")
        if m + ".weight_packed" in t:  # pack-quantized: int4/int8 packed into int32 along the input dim
            packed = t[m + ".weight_packed"]
            out_f, in_f = (int(x) for x in t[m + ".weight_shape"])
            bits = 32 // (-(-in_f // packed.shape[1]))
            q = _unpack_ct_int32(packed, bits, in_f, axis=1).astype(np.float64)
            if zp is not None and zp.shape[0] != out_f:  # zero points packed along the output dim
                zp = _unpack_ct_int32(zp, bits, out_f, axis=0)
        else:
            q = t[m + ".weight"].astype(np.float64)
            out_f, in_f = q.shape
        zp = np.zeros_like(scale) if zp is None else zp.astype(np.float64)
        if scale.ndim == 0 or scale.size == 1:  # tensor
            s, z = np.full((out_f, in_f), scale.reshape(-1)[0]), np.full((out_f, in_f), zp.reshape(-1)[0])
        elif scale.shape == (out_f, 1):  # channel
            s, z = np.broadcast_to(scale, (out_f, in_f)), np.broadcast_to(zp.reshape(out_f, 1), (out_f, in_f))
        elif scale.shape[0] == out_f:  # group along the input dimension
            g = in_f // scale.shape[1]
            if m + ".weight_g_idx" in t:
                idx = t[m + ".weight_g_idx"].astype(np.int64)
            else:
                idx = np.arange(in_f) // g
            s, z = scale[:, idx], zp.reshape(scale.shape)[:, idx]
        else:  # block
            s, z = _expand_blocks(scale, (out_f, in_f)), _expand_blocks(zp.reshape(scale.shape), (out_f, in_f))
        weights[m + ".weight"] = (q - z) * s
    if not modules and fmt not in (None, "dense"):
        raise SetupError("compressed-tensors config but no weight_scale tensors found")
    return weights


def dequant_fp8_block(t, qcfg):
    weights = {}
    for k in sorted(t):
        if not k.endswith(".weight_scale_inv"):
            continue
        m = k[: -len("_scale_inv")]
        q = t[m].astype(np.float64)
        scale = t[k].astype(np.float64)
        if scale.ndim == 0 or scale.size == 1:
            weights[m] = q * scale.reshape(-1)[0]
        else:
            weights[m] = q * _expand_blocks(scale, q.shape)
    return weights


AWQ_REVERSE = [0, 4, 1, 5, 2, 6, 3, 7]  # logical column c of each group of 8 sits in nibble AWQ_REVERSE[c]


def _unpack_awq(packed, bits):
    per = 32 // bits
    u = packed.astype(np.int64) & 0xFFFFFFFF
    nibbles = np.stack([(u >> (bits * k)) & ((1 << bits) - 1) for k in range(per)], axis=-1)  # [r, c, k]
    logical = nibbles[:, :, AWQ_REVERSE]  # [r, c, column-within-8]
    return logical.reshape(packed.shape[0], packed.shape[1] * per)


def dequant_awq(t, qcfg):
    version = str(qcfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise SetupError(f"AWQ version {version!r}: the oracle only reads GEMM packing")
    bits = int(qcfg.get("bits", qcfg.get("w_bit", 4)))
    group = int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
    weights = {}
    for k in sorted(t):
        if not k.endswith(".qweight"):
            continue
        m = k[: -len(".qweight")]
        iw = _unpack_awq(t[k], bits).astype(np.float64)  # [in, out]
        scales = t[m + ".scales"].astype(np.float64)  # [in/group, out]
        if qcfg.get("zero_point", True):
            iz = _unpack_awq(t[m + ".qzeros"], bits).astype(np.float64)  # [in/group, out]
        else:
            iz = np.full_like(scales, 2 ** (bits - 1))
        g = group if group > 0 else iw.shape[0]
        w_t = (iw - np.repeat(iz, g, axis=0)) * np.repeat(scales, g, axis=0)  # [in, out]
        weights[m + ".weight"] = w_t.T
    return weights


DEQUANTIZERS = {
    "compressed-tensors": dequant_compressed_tensors,
    "fp8": dequant_fp8_block,
    "awq": dequant_awq,
}

# tensors that belong to a quantized module's storage rather than to the float model
QUANT_SUFFIXES = (
    ".weight_scale", ".weight_scale_inv", ".weight_zero_point", ".weight_packed", ".weight_shape",
    ".weight_g_idx", ".input_scale", ".qweight", ".qzeros", ".scales",
)


def load_model(model_dir):
    """(config, {hf tensor name: float64 array}) with every linear weight dequantized."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    raw = read_model_tensors(model_dir)
    qcfg = cfg.get("quantization_config")
    weights = {}
    if qcfg:
        method = qcfg.get("quant_method")
        if method not in DEQUANTIZERS:
            raise SetupError(f"{model_dir}: quant_method {method!r} not supported by the oracle")
        weights.update(DEQUANTIZERS[method](raw, qcfg))
        if method == "fp8" and qcfg.get("activation_scheme") == "dynamic":
            group = int(qcfg["weight_block_size"][1])
            weights["__activation_group__"] = {
                k[: -len(".weight_scale_inv")]: group for k in raw if k.endswith(".weight_scale_inv")
            }
    for k, v in raw.items():
        if k in weights or k.endswith(QUANT_SUFFIXES) or k.startswith("__"):
            continue
        if not np.issubdtype(v.dtype, np.floating):
            raise SetupError(f"{model_dir}: {k} is {v.dtype} but no dequantizer claimed it")
        weights[k] = v.astype(np.float64)
    return cfg, weights


# ============================================================================================
# float64 forward pass (one function per block)
# ============================================================================================

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")


class Arch:
    def __init__(self, cfg):
        self.model_type = cfg.get("model_type")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise SetupError(f"model_type {self.model_type!r} not supported by the oracle")
        self.n_layers = cfg["num_hidden_layers"]
        self.hidden = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.n_heads
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise SetupError(f"rope_type {rope_type!r} not supported by the oracle")
        theta = cfg.get("rope_theta", rope.get("rope_theta"))
        self.rope_theta = float(theta if theta is not None else 10000.0)
        self.qk_norm = self.model_type == "qwen3"
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        window = cfg.get("sliding_window")
        uses_window = self.model_type == "mistral" or cfg.get("use_sliding_window", False)
        self.sliding_window = int(window) if (window and uses_window) else None
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise SetupError(f"hidden_act {act!r} not supported by the oracle")


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


_E4M3_POSITIVE = F8_E4M3_TABLE[:127]  # codes 0..126, increasing; 127 is NaN


def round_e4m3(y):
    """Nearest float8_e4m3fn value (ties to the even code), saturating at +-448."""
    a = np.minimum(np.abs(y), 448.0)
    hi = np.clip(np.searchsorted(_E4M3_POSITIVE, a), 1, 126)
    lo = hi - 1
    d_lo = a - _E4M3_POSITIVE[lo]
    d_hi = _E4M3_POSITIVE[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return np.sign(y) * np.where(pick_hi, _E4M3_POSITIVE[hi], _E4M3_POSITIVE[lo])


def fp8_per_token_group(x, group):
    """Dynamic FP8 activation quantization, one scale (amax / 448) per `group` values of a row, as
    fine-grained FP8 checkpoints with `activation_scheme: dynamic` declare.

    The quantizer's own arithmetic is float32 (scale, division), as engines and cardproof compute
    it: the result is sensitive to it. Done in float64 instead, the candidate's distributions move
    by a KL of about 0.005 on the example model (a quarter of its KLD against the reference),
    because values that land on a rounding midpoint in one precision do not in the other."""
    shape = x.shape
    g = x.astype(np.float32).reshape(-1, shape[-1] // group, group)
    scale = (np.abs(g).max(axis=-1, keepdims=True) / np.float32(448.0)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1.0), scale)
    ratio = (g / safe).astype(np.float32)
    q = (round_e4m3(ratio.astype(np.float64)).astype(np.float32) * safe).astype(np.float32)
    return np.where(scale == 0, g, q).reshape(shape).astype(np.float64)


def linear(x, weights, prefix):
    act = weights.get("__activation_group__", {}).get(prefix)
    if act:
        x = fp8_per_token_group(x, act)
    y = x @ weights[prefix + ".weight"].T
    bias = weights.get(prefix + ".bias")
    return y if bias is None else y + bias


def rope_tables(n_pos, head_dim, theta):
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(n_pos, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, hd/2]
    angles = np.concatenate([angles, angles], axis=-1)  # [T, hd]
    return np.cos(angles), np.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate-half (NeoX) layout. x: [heads, T, hd]."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def causal_mask(n_pos, window):
    i = np.arange(n_pos)[:, None]
    j = np.arange(n_pos)[None, :]
    allowed = j <= i
    if window is not None:
        allowed &= (i - j) < window
    return np.where(allowed, 0.0, -np.inf)


def attention(x, weights, p, arch, cos, sin, mask):
    T = x.shape[0]
    hd = arch.head_dim
    q = linear(x, weights, p + "q_proj").reshape(T, arch.n_heads, hd).transpose(1, 0, 2)
    k = linear(x, weights, p + "k_proj").reshape(T, arch.n_kv, hd).transpose(1, 0, 2)
    v = linear(x, weights, p + "v_proj").reshape(T, arch.n_kv, hd).transpose(1, 0, 2)
    if arch.qk_norm:
        q = rms_norm(q, weights[p + "q_norm.weight"], arch.eps)
        k = rms_norm(k, weights[p + "k_norm.weight"], arch.eps)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    group = arch.n_heads // arch.n_kv
    k = np.repeat(k, group, axis=0)  # query head h reads kv head h // group
    v = np.repeat(v, group, axis=0)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask  # [H, T, T]
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = (probs @ v).transpose(1, 0, 2).reshape(T, arch.n_heads * hd)
    return linear(out, weights, p + "o_proj")


def silu(x):
    return x / (1.0 + np.exp(-x))


def mlp(x, weights, p):
    return linear(silu(linear(x, weights, p + "gate_proj")) * linear(x, weights, p + "up_proj"), weights, p + "down_proj")


def decoder_layer(x, weights, i, arch, cos, sin, mask):
    p = f"model.layers.{i}."
    h = x + attention(rms_norm(x, weights[p + "input_layernorm.weight"], arch.eps), weights, p + "self_attn.", arch, cos, sin, mask)
    return h + mlp(rms_norm(h, weights[p + "post_attention_layernorm.weight"], arch.eps), weights, p + "mlp.")


def forward(token_ids, arch, weights):
    """Logits [T, V] (float64) for one window fed from position 0."""
    T = len(token_ids)
    x = weights["model.embed_tokens.weight"][np.asarray(token_ids, dtype=np.int64)]
    cos, sin = rope_tables(T, arch.head_dim, arch.rope_theta)
    mask = causal_mask(T, arch.sliding_window)
    for i in range(arch.n_layers):
        x = decoder_layer(x, weights, i, arch, cos, sin, mask)
    x = rms_norm(x, weights["model.norm.weight"], arch.eps)
    head = weights.get("lm_head.weight")
    if arch.tied or head is None:
        head = weights["model.embed_tokens.weight"]
    return x @ head.T


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


class Oracle:
    def __init__(self, model_dir):
        self.name = os.path.basename(os.path.normpath(model_dir))
        cfg, self.weights = load_model(model_dir)
        self.arch = Arch(cfg)
        self._cache = {}

    def window_logprobs(self, input_ids):
        """log-softmax [W, L, V] for every window row of input_ids [W, L]."""
        key = input_ids.tobytes() + bytes(str(input_ids.shape), "ascii")
        if key not in self._cache:
            self._cache[key] = np.stack([log_softmax(forward(row, self.arch, self.weights)) for row in input_ids])
        return self._cache[key]


# ============================================================================================
# running cardproof and checking its output
# ============================================================================================


class Report:
    def __init__(self):
        self.failures = []

    def check(self, ok, label, detail):
        status = "ok  " if ok else "FAIL"
        print(f"  [{status}] {label}: {detail}")
        if not ok:
            self.failures.append(f"{label}: {detail}")


def write_eval_text(path):
    with open(EVAL_TEXT, encoding="utf-8") as f:
        text = f.read()
    cut = text.rfind("\n", 0, EVAL_CHARS)
    if cut < 0:
        raise SetupError(f"{EVAL_TEXT}: no line end in the first {EVAL_CHARS} characters")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[: cut + 1])
    return cut + 1


def declares_activation_quantization(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        q = json.load(f).get("quantization_config") or {}
    return q.get("quant_method") == "fp8" and q.get("activation_scheme") == "dynamic"


def run_measure(cardproof, candidate_dir, eval_path, dump_dir, out_dir):
    # Emulated FP8 activation quantization is discontinuous, so f32 rounding of the activations
    # (cardproof's default compute) flips quantization steps that float64 does not: on the example
    # model the f32 and float64 candidates differ by a KL of about 0.005, a quarter of the KLD
    # itself. The oracle is float64, so such candidates are run with --compute-dtype f64 and
    # compared as tightly as the rest (the quantizer's own arithmetic stays f32 on both sides).
    extra = ["--compute-dtype", "f64"] if declares_activation_quantization(candidate_dir) else []
    cmd = [
        cardproof, "measure",
        "--reference", os.path.join(MODELS, REFERENCE),
        "--candidate", candidate_dir,
        "--eval-text", eval_path,
        "--context-length", str(CONTEXT_LENGTH),
        "--positions", "all",
        "--dump-logits", dump_dir,
        "--out", out_dir,
        "--json",
    ] + extra
    print("  $ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SetupError(
            f"cardproof exited {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    try:
        json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise SetupError(f"cardproof stdout is not one JSON document ({e}):\n{proc.stdout[-2000:]}")


def load_dump(path):
    if not os.path.exists(path):
        raise SetupError(f"missing dump {path}")
    t = read_safetensors(path)
    for name in ("logits", "tokens", "positions", "window", "input_ids"):
        if name not in t:
            raise SetupError(f"{path}: no tensor {name!r} (has {sorted(t)})")
    return {k: np.asarray(v) for k, v in t.items()}


def load_metrics(out_dir):
    path = os.path.join(out_dir, "measurement.json")
    if not os.path.exists(path):
        raise SetupError(f"missing {path}")
    with open(path) as f:
        doc = json.load(f)
    try:
        run = doc["runs"][0]
        return {
            "kld_mean": float(run["metrics"]["kld_mean"]),
            "top1_agreement": float(run["metrics"]["top1_agreement"]),
            "n_positions": int(run["n_positions"]),
        }
    except (KeyError, IndexError, TypeError) as e:
        raise SetupError(f"{path}: no runs[0].metrics.kld_mean / top1_agreement / n_positions ({e!r})")


def rows_of(dump, oracle):
    """The oracle's log-softmax rows at the dump's (window, position) pairs: [N, V]."""
    lp = oracle.window_logprobs(dump["input_ids"].astype(np.int64))
    return lp[dump["window"].astype(np.int64), dump["positions"].astype(np.int64)]


def check_layout(rep, label, dump, vocab):
    n = dump["logits"].shape[0]
    ids = dump["input_ids"]
    shapes_ok = (
        dump["logits"].ndim == 2 and dump["logits"].shape[1] == vocab
        and dump["tokens"].shape == (n,) and dump["positions"].shape == (n,) and dump["window"].shape == (n,)
        and ids.ndim == 2 and n > 0
    )
    rep.check(shapes_ok, f"{label} layout",
              f"logits {list(dump['logits'].shape)}, tokens {list(dump['tokens'].shape)}, "
              f"positions {list(dump['positions'].shape)}, window {list(dump['window'].shape)}, input_ids {list(ids.shape)}")
    if not shapes_ok:
        return False
    w, j = dump["window"].astype(np.int64), dump["positions"].astype(np.int64)
    in_range = bool(np.all((w >= 0) & (w < ids.shape[0]) & (j >= 0) & (j + 1 < ids.shape[1])))
    rep.check(in_range, f"{label} (window, position) in range",
              f"windows {w.min()}..{w.max()} of {ids.shape[0]}, positions {j.min()}..{j.max()} (need position + 1 < {ids.shape[1]})")
    if not in_range:
        return False
    nxt = ids[w, j + 1]
    bad = np.nonzero(nxt != dump["tokens"])[0]
    rep.check(bad.size == 0, f"(c) {label} tokens[i] == input_ids[window[i], positions[i]+1]",
              f"{n - bad.size}/{n} rows match" + (f"; first mismatch at row {bad[0]}" if bad.size else ""))
    return True


def check_candidate(rep, cand, work, ref_oracle, run, cardproof, eval_path):
    print(f"\n== {REFERENCE} vs {cand}")
    dump_dir = os.path.join(work, f"dump-{cand}")
    out_dir = os.path.join(work, f"out-{cand}")
    cand_dir = os.path.join(MODELS, cand)
    if run:
        run_measure(cardproof, cand_dir, eval_path, dump_dir, out_dir)
    ref_dump = load_dump(os.path.join(dump_dir, "reference.logits.safetensors"))
    cand_dump = load_dump(os.path.join(dump_dir, "candidate.logits.safetensors"))
    metrics = load_metrics(out_dir)
    self_compare = os.path.normpath(cand_dir) == os.path.normpath(os.path.join(MODELS, REFERENCE))
    cand_oracle = ref_oracle if self_compare else Oracle(cand_dir)
    vocab = ref_oracle.weights["model.embed_tokens.weight"].shape[0]

    ok = check_layout(rep, "reference dump", ref_dump, vocab) & check_layout(rep, "candidate dump", cand_dump, vocab)
    if not ok:
        return
    same_rows = all(np.array_equal(ref_dump[k], cand_dump[k]) for k in ("tokens", "positions", "window", "input_ids"))
    rep.check(same_rows, "reference and candidate dumps score the same rows", "tokens/positions/window/input_ids identical" if same_rows else "they differ")
    if not same_rows:
        return
    n = ref_dump["logits"].shape[0]

    lp_ref = rows_of(ref_dump, ref_oracle)
    lp_cand = rows_of(cand_dump, cand_oracle)
    # Emulated activation quantization is discontinuous: the rare input on a rounding step can
    # land on either side, so for such candidates rows are compared as distributions.
    discontinuous = bool(cand_oracle.weights.get("__activation_group__"))
    for side, dump, lp in (("reference", ref_dump, lp_ref), ("candidate", cand_dump, lp_cand)):
        got = log_softmax(dump["logits"].astype(np.float64))
        diff = np.abs(got - lp)
        worst = np.unravel_index(np.argmax(diff), diff.shape)
        if side == "candidate" and discontinuous:
            # Compare distributions rather than every log-prob: the runner's candidate must be
            # far closer to the oracle's candidate than the candidate is to the reference.
            p_or = np.exp(lp)
            gap = float(np.mean(np.sum(p_or * (lp - got), axis=-1)))
            kld_ref = float(np.mean(np.sum(np.exp(lp_ref) * (lp_ref - lp), axis=-1)))
            rep.check(gap < 0.01 * kld_ref, f"(a) {side} distribution vs oracle (activation quantization emulated)",
                      f"mean KL(oracle || runner) {gap:.3e}, below 1% of the candidate's KLD {kld_ref:.3e}; max |log-prob diff| {diff.max():.3e}")
            continue
        rep.check(bool(diff.max() < LOGIT_TOL), f"(a) {side} log-softmax vs oracle",
                  f"max |diff| {diff.max():.3e} (tol {LOGIT_TOL:g}) at row {worst[0]}, token {worst[1]}; mean {diff.mean():.2e}")

    p_ref = np.exp(lp_ref)
    kl_rows = np.sum(p_ref * (lp_ref - lp_cand), axis=-1)
    kld = float(kl_rows.mean())
    top1 = float(np.mean(lp_ref.argmax(axis=-1) == lp_cand.argmax(axis=-1)))
    rel = abs(metrics["kld_mean"] - kld) / kld if kld > 0 else float("inf")
    rep.check(metrics["n_positions"] == n, "(b) n_positions", f"runner {metrics['n_positions']}, dump rows {n}")
    kld_tol = KLD_REL_TOL
    top1_tol = 0.01 if discontinuous else 2.0 / n
    rep.check(bool(rel < kld_tol), "(b) kld_mean",
              f"runner {metrics['kld_mean']:.6e}, oracle {kld:.6e}, rel diff {rel:.2e} (tol {kld_tol:g})")
    rep.check(abs(metrics["top1_agreement"] - top1) <= top1_tol, "(b) top1_agreement",
              f"runner {metrics['top1_agreement']:.6f}, oracle {top1:.6f}, |diff| {abs(metrics['top1_agreement'] - top1):.2e} (tol {top1_tol:.2e})")


def check_self(rep, work, ref_oracle, run, cardproof, eval_path):
    print(f"\n== {REFERENCE} vs itself")
    dump_dir = os.path.join(work, "dump-self")
    out_dir = os.path.join(work, "out-self")
    if run:
        run_measure(cardproof, os.path.join(MODELS, REFERENCE), eval_path, dump_dir, out_dir)
    m = load_metrics(out_dir)
    rep.check(m["kld_mean"] == 0.0, "(d) self kld_mean == 0", f"runner {m['kld_mean']!r}")
    rep.check(m["top1_agreement"] == 1.0, "(d) self top1_agreement == 1", f"runner {m['top1_agreement']!r}")
    ref_dump = load_dump(os.path.join(dump_dir, "reference.logits.safetensors"))
    cand_dump = load_dump(os.path.join(dump_dir, "candidate.logits.safetensors"))
    same = np.array_equal(ref_dump["logits"], cand_dump["logits"])
    rep.check(same, "(d) self dumps bit-identical", "reference == candidate logits" if same else "logits differ")
    if check_layout(rep, "self dump", ref_dump, ref_oracle.weights["model.embed_tokens.weight"].shape[0]):
        diff = np.abs(log_softmax(ref_dump["logits"].astype(np.float64)) - rows_of(ref_dump, ref_oracle))
        rep.check(bool(diff.max() < LOGIT_TOL), "(a) self log-softmax vs oracle", f"max |diff| {diff.max():.3e} (tol {LOGIT_TOL:g})")


def main():
    ap = argparse.ArgumentParser(description="float64 oracle for cardproof measure")
    # cargo reads a relative CARGO_TARGET_DIR from the working directory, and so does abspath.
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    ap.add_argument("--cardproof", default=os.path.join(target, "debug", "cardproof"),
                    help="the cardproof binary (default: debug build in $CARGO_TARGET_DIR or target/)")
    ap.add_argument("--work-dir", help="keep dumps here instead of a temporary directory")
    ap.add_argument("--no-run", action="store_true", help="check the dumps already in --work-dir without running cardproof")
    ap.add_argument("--candidates", nargs="*", default=CANDIDATES)
    args = ap.parse_args()
    args.cardproof = os.path.abspath(args.cardproof)

    try:
        if args.no_run and not args.work_dir:
            raise SetupError("--no-run needs --work-dir")
        if not args.no_run and not os.access(args.cardproof, os.X_OK):
            raise SetupError(f"cardproof binary not found or not executable: {args.cardproof}")
        tmp = None  # keeps the temporary directory alive until main returns
        if args.work_dir:
            work = os.path.abspath(args.work_dir)
            os.makedirs(work, exist_ok=True)
        else:
            tmp = tempfile.TemporaryDirectory(prefix="cardproof-oracle-")
            work = tmp.name
        eval_path = os.path.join(work, "eval.txt")
        if not args.no_run:
            n_chars = write_eval_text(eval_path)
            print(f"eval text: {n_chars} characters of {os.path.relpath(EVAL_TEXT, ROOT)} -> {eval_path}")
        print(f"context length {CONTEXT_LENGTH}, positions all; oracle: float64 numpy forward pass")
        ref_oracle = Oracle(os.path.join(MODELS, REFERENCE))
        rep = Report()
        for cand in args.candidates:
            check_candidate(rep, cand, work, ref_oracle, not args.no_run, args.cardproof, eval_path)
        check_self(rep, work, ref_oracle, not args.no_run, args.cardproof, eval_path)
    except SetupError as e:
        print(f"\nnative_oracle: ERROR: {e}", file=sys.stderr)
        return 2

    print()
    if rep.failures:
        print(f"native_oracle: {len(rep.failures)} check(s) FAILED:", file=sys.stderr)
        for f in rep.failures:
            print(f"  - {f}", file=sys.stderr)
        return 1
    print("native_oracle: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
