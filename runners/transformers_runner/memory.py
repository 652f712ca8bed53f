"""The memory plan: what each part of the run needs at its peak (weights, KV cache, activations,
kept hidden states, output-head chunks), the chunk size and head rows that fit the free memory
(or the request's limit), and the mode (both models at once, or one after the other); a run that
cannot fit is refused before anything loads, saying what would."""

import os

from .protocol import RunnerError

# Bytes kept free on each device beyond the plan (allocator fragmentation, cuBLAS workspaces).
MARGIN = 0.08


def eager_score_bytes(dtype_size):
    """Bytes per attention score at eager attention's peak (transformers' eager_attention_forward):
    the scores in the model dtype, the masked copy beside them, then the float32 softmax and its
    cast back while the masked scores are still referenced: 2 x dtype + 4."""
    return 2 * dtype_size + 4


def gdn_bytes(cfg, chunk, dtype_size):
    """A Gated DeltaNet layer's working set on a chunk (flash-linear-attention's chunked kernel):
    the per-64-token states [chunk / 64, value heads, key dim, value dim] in the model dtype and
    about six float32 tensors of [chunk, value heads, value dim] (q, k, v, w, u, the output); 0
    for a model without linear-attention layers."""
    if "linear_attention" not in (cfg.get("layer_types") or []):
        return 0
    hv = cfg.get("linear_num_value_heads", 0)
    dk = cfg.get("linear_key_head_dim", 0)
    dv = cfg.get("linear_value_head_dim", 0)
    return -(-chunk // 64) * hv * dk * dv * dtype_size + 6 * chunk * hv * max(dk, dv) * 4


def plan_memory(torch, req, cfg, weights, dtype_size, chunk, free, eager_block=None):
    """Bytes each part of the run needs at its peak for prefill chunks of `chunk` tokens (a chunk
    as long as the window is one pass without a cache, the engine's plain prefill), eager
    attention's queries taken `eager_block` at a time (None: the whole chunk at once)."""
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
    # tensors), a linear-attention layer's working set, and the attention's: for sdpa the mask a
    # cache needs (none for one causal pass, which takes the flash kernel); for eager the mask
    # and every head's scores of a block of queries at their peak (`eager_score_bytes`).
    act = chunk * (3 * inter + 6 * hidden) * dtype_size + gdn_bytes(cfg, chunk, dtype_size)
    attn = chunk * longest * (0 if whole else 2)
    if eager:
        block = min(eager_block or chunk, chunk)
        attn = max(attn, chunk * longest * dtype_size + heads * block * longest * eager_score_bytes(dtype_size))
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
        # Eager attention's queries per block where it is cut (None: the chunk at once).
        "eager_query_block": min(eager_block, chunk) if eager and eager_block and eager_block < chunk else None,
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


def eager_models(req):
    """The request's models (the reference, the candidate, a study's arms) that run eager
    attention, by name for messages."""
    models = req["models"]
    named = [("the reference", models["reference"]), ("the candidate", models["candidate"])]
    named += [(f"arm `{a.get('name') or i + 1}`", a) for i, a in enumerate(models.get("arms") or [])]
    return [name for name, m in named if m.get("attn_implementation") == "eager"]


def choose_plan(torch, req, cfg, weights, dtype_size):
    """The plan and mode, for every model of the run at once (a study's arms included), before
    anything loads: the asked chunk size, or (by default) the whole window when it fits, else the
    longest power-of-two chunk that does (down to 256 tokens). Eager attention's scores (every
    head's, for a block of queries against the whole window) are in the plan: where they do not
    fit at the chunk, its queries are taken in blocks (the longest power of two down to 16 that
    fits), so the other models keep their chunk; what fits nowhere is refused, naming the models
    that run eager attention and what would fit."""
    longest = max(r["context_length"] for r in req["runs"])
    asked = req.get("chunk_size") or 0
    limit = req.get("memory_limit_bytes")
    device = req.get("device", "cuda")
    free = limit if limit is not None else free_bytes(torch, device)
    chunks = [asked] if asked else [longest] + [c for c in (1 << k for k in range(20, 7, -1)) if c < longest]
    eager = eager_models(req)
    error = None
    for chunk in chunks:
        blocks = [None] + ([b for b in (1 << k for k in range(20, 3, -1)) if b < chunk] if eager else [])
        for block in blocks:
            plan = plan_memory(torch, req, cfg, weights, dtype_size, chunk, free, block)
            plan["free_bytes"] = free
            try:
                mode = choose_mode(req, plan, free, device)
            except RunnerError as e:
                # The last refusal is the smallest plan's: what the message reports.
                error = e
                continue
            plan["head_rows"] = plan[f"{mode}_head_rows"]
            plan["head_chunk"] = plan["head_rows"] * plan["per_head_row"]
            return plan, mode
    if eager:
        raise RunnerError(
            error.kind,
            f"{error} ({', '.join(eager)} run{'s' if len(eager) == 1 else ''} eager attention, whose scores are planned "
            f"even in query blocks of 16 tokens; a shorter context length, or the control off: controls: {{noise_floor: false}})",
        )
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
