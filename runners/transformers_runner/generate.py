"""Greedy turns (`--turns`): every assistant turn's prompt prefilled, then one token at a time
through the same cache, by the model objects the measurement just used, with its attention
implementation and its KV-cache scheme (the cache is `kv_quant.new_cache`'s, so a scheme rounds
what each step writes, as it rounded what the measurement's prefill wrote; computed scales stay
the ones the measurement's first window froze).

The argmax is cardproof's native one: the head's logits (as `head_logits` applies it, soft-capping
included) over the tokenizer's first `used` entries, upcast to float32, and `torch.argmax`, which
returns the index of the first maximal value when several are maximal (torch's documented tie
rule; the native runner's and top-1 agreement's). A row with a NaN or an infinity ends the turn
before it (`non_finite`). The stop token is generated and returned but not fed back.

One prefill, many turns: the turn prompts of a conversation are mostly prefixes of each other (the
history grows by the true reply and what follows it). A cache of plain attention layers
(`DynamicLayer`s, write-then-read rounding included) is cropped after each turn to the prompt's
common prefix with the next prompt, which is then prefilled from there (`crop`). A cache that
cannot be rolled back (linear-attention layers' recurrent state, sliding-window layers, the
residual bookkeeping of transformers' QuantizedCache semantics) is copied at each prompt's end,
and a next prompt that extends that prompt continues the copy, as the native runner does
(`snapshot`); any other prompt is prefilled afresh. Where the cache cannot even be copied, every
prompt is prefilled afresh (`none`). The record says which, per model."""

import copy
import time

from .gdn import gdn_kernel, gdn_setting
from .kv_quant import kv_label, kv_setting, new_cache
from .model import attn_used, head_logits, input_device, sdpa_backend, set_attention
from .protocol import RunnerError, progress
from .state import state_setting, store_states


def next_token(torch, logits, used):
    """The greedy token of a logit row ([1, width]): the first index of the maximum of its first
    `used` entries in float32; None when one of them is not finite."""
    row = logits[0, :used].float()
    # Both read back in one transfer: a step waits for the device once, not twice.
    token, finite = torch.stack((torch.argmax(row), torch.isfinite(row).all().long())).tolist()
    return token if finite else None


def extend(torch, model, ids, cache, chunk):
    """`ids` appended to `cache` through the decoder, `chunk` tokens a pass (positions come from
    the cache's length, as in the model's own generate()); the last token's logits."""
    base = model.base_model
    t = torch.tensor(ids, dtype=torch.long, device=input_device(model))[None]
    h = None
    with sdpa_backend(torch, model), gdn_kernel(model):
        for start in range(0, t.shape[1], chunk):
            h = base(input_ids=t[:, start:start + chunk], past_key_values=cache, use_cache=True).last_hidden_state[0, -1:]
            # The engine stores the carried state after each chunk and each decode step.
            store_states(model, cache)
    return head_logits(torch, model, h.to(model.get_output_embeddings().weight.device))


def greedy(torch, model, cache, logits, turns):
    """One turn from a prefilled prompt's last logits: (tokens, stop)."""
    stops = set(turns["stops"])
    tokens = []
    while len(tokens) < turns["max_new_tokens"]:
        token = next_token(torch, logits, turns["used"])
        if token is None:
            return tokens, "non_finite"
        tokens.append(token)
        if token in stops:
            return tokens, "stop_token"
        if len(tokens) == turns["max_new_tokens"]:
            break
        logits = extend(torch, model, [token], cache, 1)
    return tokens, "max_tokens"


def reuse_mode(cache, residual):
    """How a cache serves the next prompt: `crop` when every layer is a plain DynamicLayer (and
    no QuantizedCache residual is kept beside it), else `snapshot`."""
    if residual:
        return "snapshot"
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return "snapshot"
    layers = getattr(cache, "layers", None)
    if layers and all(type(layer) is DynamicLayer for layer in layers) and callable(getattr(cache, "crop", None)):
        return "crop"
    return "snapshot"


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Turns:
    """The prompts' caches, one turn after another (see the module's doc for the reuse)."""

    def __init__(self, torch, transformers, model, chunk, residual):
        self.torch, self.transformers, self.model = torch, transformers, model
        self.chunk, self.residual = chunk, residual
        self.mode = None
        self.cache = None
        self.snapshot = None
        self.previous = None
        self.prefilled = 0

    def fresh(self):
        return new_cache(self.torch, self.transformers, self.model)

    def start_of(self, prompt):
        """The cache to prefill `prompt` into and how many of its tokens it already holds."""
        prev = self.previous
        if self.mode == "crop" and self.cache is not None:
            keep = min(common_prefix(prev, prompt), len(prompt) - 1)
            if keep > 0:
                self.cache.crop(keep - self.cache.get_seq_length())
                return self.cache, keep
        if self.mode == "snapshot" and self.snapshot is not None and len(prompt) > len(prev) and prompt[: len(prev)] == prev:
            cache, self.snapshot = self.snapshot, None
            return cache, len(prev)
        return self.fresh(), 0

    def prefill(self, prompt):
        """The cache at `prompt`'s end and its last logits."""
        cache, start = self.start_of(prompt)
        logits = extend(self.torch, self.model, prompt[start:], cache, self.chunk)
        self.prefilled += len(prompt) - start
        if self.mode is None:
            self.mode = reuse_mode(cache, self.residual)
        if self.mode == "snapshot":
            try:
                self.snapshot = copy.deepcopy(cache)
            except Exception:  # noqa: BLE001 - a cache that cannot be copied is prefilled per turn
                self.mode, self.snapshot = "none", None
        self.cache, self.previous = cache, prompt
        return cache, logits


def generate_turns(r, model, spec, who):
    """Every turn of the request's `turns` generated by `model` as `spec` runs it (its attention
    and KV-cache scheme, set as the measurement set them; `who` names it in progress lines); the
    record's turn set for this model."""
    torch, turns = r.torch, r.turns
    set_attention(model, spec.get("attn_implementation", "sdpa"))
    model._cardproof_kv = kv_setting(spec, spec["path"])
    model._cardproof_state = state_setting(torch, model, spec)
    model._cardproof_gdn = gdn_setting(model, spec)
    width = model.get_output_embeddings().weight.shape[0]
    if turns["used"] > width:
        raise RunnerError("bad_request", f"turns.used {turns['used']} is over {who}'s {width} logit entries")
    setting = model._cardproof_kv
    residual = setting[4] if setting is not None else None
    # QuantizedCache semantics are defined per update: the setting's prefill chunk, counted from
    # where each prefilled piece starts (as the native runner does); otherwise the plan's chunk.
    chunk = max(1, residual[1] if residual is not None else r.chunk)
    t = time.perf_counter()
    state = Turns(torch, r.transformers, model, chunk, residual is not None)
    out = []
    total = len(turns["prompts"])
    # Where the time went, as the native runner counts it: a prompt's prefill (its last row's
    # logits and, with `snapshot`, the cache's copy included), then its turn's decode (every
    # step from the first argmax on); each region ends at a device synchronization.
    timing = {"prefill_tokens": 0, "prefill_seconds": 0.0, "generated_tokens": 0, "decode_seconds": 0.0}
    with torch.inference_mode():
        for i, prompt in enumerate(turns["prompts"]):
            r.synchronize()
            t0 = time.perf_counter()
            before = state.prefilled
            cache, logits = state.prefill(prompt)
            r.synchronize()
            t1 = time.perf_counter()
            tokens, stop = greedy(torch, model, cache, logits, turns)
            r.synchronize()
            t2 = time.perf_counter()
            timing["prefill_tokens"] += state.prefilled - before
            timing["prefill_seconds"] += t1 - t0
            timing["generated_tokens"] += len(tokens)
            timing["decode_seconds"] += t2 - t1
            out.append({"tokens": tokens, "stop": stop})
            progress(f"generating {who}'s turns {i + 1}/{total}")
    state.cache = state.snapshot = None
    r.synchronize()
    seconds = time.perf_counter() - t
    r.timings["turns"] = r.timings.get("turns", 0.0) + seconds
    return {
        "engine": {
            "attention": attn_used(model),
            "dtype": r.req.get("dtype", "bfloat16"),
            "kv_cache": kv_label(setting) if setting is not None else None,
            "prefix_reuse": state.mode or "none",
            "prefilled_tokens": state.prefilled,
        },
        "seconds": seconds,
        "timing": timing,
        "turns": out,
    }

