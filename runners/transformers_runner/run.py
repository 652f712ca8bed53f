"""The run: the request's models loaded and warmed up, each window prefilled to the final hidden
states at its scored rows (chunked, the KV cache kept, when the plan says so), the output head and
the reduction on those rows a chunk at a time, both models side by side or one after the other
(the reference's hidden states kept for the candidate, or for each arm of a study), the sanity
gates on the first window, each model's greedy turns after its pass (`generate`, when the request
has `turns`), and the result files and the record's content."""

import json
import os
import sys
import time

from .gdn import gdn_kernel, gdn_setting
from .generate import generate_turns
from .kv_quant import kv_setting, new_cache
from .memory import choose_plan, free_bytes
from .model import (
    attn_used,
    check_sdpa_backends,
    first_layers,
    head_logits,
    input_device,
    is_linear_attention,
    load_model,
    read_config,
    sdpa_backend,
    set_attention,
    torch_dtype,
    weight_bytes,
)
from .protocol import PROTOCOL, RunnerError, next_tokens, progress, read_tokens, read_turns, write_json
from .provenance import KernelWatch, environment, kv_scales_record, model_record, probe_linear_attention
from .reduce import reduce_rows, reduce_rows_fused, triton_kernel
from .state import state_setting, store_states

# Tokens the first model of each shape warms up on (see `Run.warm_up`).
WARMUP_TOKENS = 4096
# Longest prefix the self-repeatability gate reruns (see `gate_self`).
GATE_TOKENS = 8192


# ---------------------------------------------------------------------------------------------
# Forward pass


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
    with torch.inference_mode(), sdpa_backend(torch, model), gdn_kernel(model):
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
            # The engine stores the carried state between chunks (in its state dtype).
            store_states(model, cache)
            lo = torch.searchsorted(keep, start)
            hi = torch.searchsorted(keep, end)
            if hi > lo:
                sel = (keep[lo:hi] - start).to(h.device)
                out.append(h.index_select(0, sel).to(head_dev))
            del h
    del cache
    return torch.cat(out, 0)


# ---------------------------------------------------------------------------------------------
# The run


def run(req):
    """Run the request; returns the record's content (what `protocol.main` writes after
    `protocol` and `ok`)."""
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
    check_sdpa_backends(torch, req, cfg, dtype, plan["chunk_size"] < max(r_["context_length"] for r_ in req["runs"]))
    r = Run(torch, transformers, save_file, req, plan, dtype, dtype_size)
    if arm_specs:
        partial = os.path.join(req["result_dir"], "partial.json")

        def journal(outcome):
            # The arms done so far, as the record would hold them, replaced whole after each arm:
            # what cardproof keeps of a study whose later arm fails, a signal's death included
            # (`study --resume` runs only the rest).
            os.makedirs(req["result_dir"], exist_ok=True)
            write_json(partial, {"protocol": PROTOCOL, "ok": True, **record(r, mode, arm_specs, outcome, t0)})

        r.journal = journal
    if mode == "side_by_side":
        outcome = side_by_side(r, shared)
    else:
        outcome = sequential(r, cfg, arm_specs)
    return record(r, mode, arm_specs, outcome, t0)


class Run:
    """What every stage of one run shares: torch, the request, the plan, the windows, the
    timings, and the model passes (loading with the warm-up, prefill, head and reduction)."""

    def __init__(self, torch, transformers, save_file, req, plan, dtype, dtype_size):
        self.torch, self.transformers, self.save_file = torch, transformers, save_file
        self.req, self.plan, self.dtype, self.dtype_size = req, plan, dtype, dtype_size
        self.device = req.get("device", "cuda")
        self.specs = req["models"]
        self.chunk = plan["chunk_size"]
        self.head_rows = plan["head_rows"]
        self.vocab = req["vocab_size"]
        self.runs = []
        for r in req["runs"]:
            self.runs.append((r, read_tokens(r["tokens_file"], r["n_windows"], r["context_length"])))
        self.total_windows = sum(r["n_windows"] for r in req["runs"])
        # The turns to generate after scoring (None: no `--turns`).
        self.turns = read_turns(req["turns"]) if req.get("turns") else None
        self.timings = {"load": 0.0, "warmup": 0.0, "prefill": 0.0, "head_and_reduce": 0.0, "gates": 0.0}
        if self.device != "cpu":
            for i in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(i)

        self.longest = max(r["context_length"] for r in req["runs"])
        self.first_window = self.runs[0][1][0]
        # A window of the longest run: the warm-up's passes at each length are its prefixes.
        self.longest_window = max(self.runs, key=lambda rw: rw[0]["context_length"])[1][0]
        self.warmed = set()
        self.linear_attention = {}

        self.dump = req.get("dump")
        # The fused kernel where Triton runs (CUDA); the torch path elsewhere or when asked.
        fused = self.device != "cpu" and req.get("reduction", "auto") != "torch" and triton_kernel() is not None
        self.reduce = reduce_rows_fused if fused else reduce_rows
        plan["reduction_kernel"] = "triton (fused, one read per row)" if fused else "torch"

    def synchronize(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def keeps_state(self):
        """Whether any pass keeps a cache (chunks, turns, a KV-cache scheme, a state dtype): then
        the cached path's kernels run and its states are observed."""
        specs = [self.specs["reference"], self.specs["candidate"], *(self.specs.get("arms") or [])]
        return (
            self.chunk < self.longest
            or self.turns is not None
            or any(s.get("kv_cache") or s.get("recurrent_state") for s in specs)
        )

    def load(self, spec, side, warm=True):
        """`spec`'s model loaded, and warmed up unless `warm` is false (side by side, both models
        load, then both warm up)."""
        torch = self.torch
        t = time.perf_counter()
        progress(f"loading {spec['path']}")
        m = load_model(torch, self.transformers, spec, self.dtype, self.device, self.req.get("trust_remote_code", False))
        m._cardproof_kv = kv_setting(spec, spec["path"])
        m._cardproof_state = state_setting(torch, m, spec)
        m._cardproof_gdn = gdn_setting(m, spec)
        m._cardproof_eager_block = self.plan.get("eager_query_block")
        self.timings["load"] += time.perf_counter() - t
        if warm:
            self.warm(m, spec, side)
        return m

    def warm(self, m, spec, side):
        """The warm-up of a loaded model, timed as the warm-up's."""
        # Warm-up (kernel selection, lazy initialization, Triton compilation and autotuning, the
        # fused reduction's compilation), timed apart, so the timings of the real work are the
        # work's. The first model of each shape runs the plan's prefill form on the first
        # WARMUP_TOKENS tokens of the first window: kernels that autotune (flash-linear-
        # attention's) then choose their configurations on a realistic length, once per process;
        # a second model of the same shape reuses them and warms up on a few tokens.
        t = time.perf_counter()
        self.warm_up(m, spec, side, t)
        self.synchronize()
        self.timings["warmup"] += time.perf_counter() - t
        # Scales computed from the first forward pass are the measurement's, not the warm-up's.
        m.__dict__.pop("_cardproof_kv_scales", None)

    def warm_up(self, m, spec, side, t):
        """The warm-up of a model just loaded (see `load`), from time `t`."""
        torch, transformers = self.torch, self.transformers
        chunk, longest = self.chunk, self.longest
        # Each warm-up step's time, so a slow warm-up says where it went (compilation and
        # autotuning show up as the step that first meets a kernel or a length).
        steps = self.timings.setdefault("warmup_steps", [])
        mark = [t]

        def step(what):
            self.synchronize()
            now = time.perf_counter()
            steps.append({"model": side, "step": what, "seconds": now - mark[0]})
            mark[0] = now

        set_attention(m, spec.get("attn_implementation", "sdpa"))
        shape = (type(m).__name__, json.dumps(read_config(spec["path"]), sort_keys=True, default=str))
        # Every model warms up at the same length: kernels that compile per length (flash-linear-
        # attention's) then compile for it once (a second model at another length paid 14 s).
        n = min(WARMUP_TOKENS, longest)
        ids = self.first_window[:n]
        rows = torch.arange(n - 1)
        linear = any(is_linear_attention(x) for x in m.modules())
        # A one-pass run's linear-attention kernels are observed on this pass (see below).
        watch = KernelWatch() if linear and not self.keeps_state() else None
        h = (watch.watch if watch else (lambda f: f()))(
            lambda: prefill(torch, transformers, m, ids, rows, n if chunk >= longest else max(1, min(chunk, n // 2)))
        )
        step(f"prefill of {n} tokens, every layer")
        if shape not in self.warmed and linear:
            # flash-linear-attention's Triton kernels compile for each sequence length they
            # meet (measured: ~10 s on the first 131,072-token prefill of a process, 0 after):
            # every length the run will prefill (the windows' and the self gate's prefix) is run
            # once here through the first layers only, one of each layer type.
            lengths = sorted({r["context_length"] for r in self.req["runs"]} | ({GATE_TOKENS} if self.req.get("gates") else set()))
            with first_layers(m):
                for length in lengths:
                    if n < length <= longest:
                        prefill(torch, transformers, m, self.longest_window[:length], torch.arange(1), chunk if chunk < length else length)
                        step(f"prefill of {length} tokens, first layer of each type")
        self.warmed.add(shape)
        logits = head_logits(torch, m, h[:2])
        self.reduce(torch, logits, logits, torch.zeros(2, dtype=torch.long, device=logits.device), self.vocab)
        del h, logits
        step("output head and reduction")
        # The kernels and states of the GDN layers: observed on the warm-up's pass where every
        # window is one pass (a probe of the cached path would compile kernels the run never
        # runs), else probed on a few tokens with a cache.
        self.linear_attention[side] = probe_linear_attention(torch, transformers, m, self.first_window[:min(64, longest)], watch)
        step("linear-attention probe" if watch is None else "linear-attention kernels (observed on the warm-up's pass)")

    def generate(self, model, spec, who):
        """`model`'s turns as `spec` runs it, when the request asks for turns (else None)."""
        if self.turns is None:
            return None
        return generate_turns(self, model, spec, who)

    def hidden_of(self, model, spec, ids, keep, account="prefill"):
        """The kept rows' final hidden states; the time goes to `account` (the gates' own
        passes are timed as the gates', not as the measurement's)."""
        set_attention(model, spec.get("attn_implementation", "sdpa"))
        # Per side: one model shared by both sides (a sweep) switches its scheme with its side.
        model._cardproof_kv = kv_setting(spec, spec["path"])
        model._cardproof_state = state_setting(self.torch, model, spec)
        model._cardproof_gdn = gdn_setting(model, spec)
        t = time.perf_counter()
        h = prefill(self.torch, self.transformers, model, ids, keep, self.chunk)
        self.synchronize()
        self.timings[account] += time.perf_counter() - t
        return h

    def dump_logits(self, ref_model, h_ref, cand_model, h_cand, targets, rows):
        """The first rows' logits of both models as `cardproof kld` reads them (f32, exact
        upcasts of what the head produced), so the device's reduction can be checked against
        cardproof's own on the same numbers."""
        torch, dump, vocab = self.torch, self.dump, self.vocab
        n = min(dump["rows"], h_ref.shape[0])
        la = head_logits(torch, ref_model, h_ref[:n])[:, :vocab].float().cpu()
        lb = head_logits(torch, cand_model, h_cand[:n])[:, :vocab].float().cpu()
        os.makedirs(dump["dir"], exist_ok=True)
        for name, logits in (("reference", la), ("candidate", lb)):
            self.save_file(
                {
                    "logits": logits.contiguous(),
                    "tokens": targets[:n].int().contiguous(),
                    "positions": torch.tensor(rows[:n], dtype=torch.int64),
                },
                os.path.join(dump["dir"], f"{name}.logits.safetensors"),
            )

    def records_of(self, ref_model, h_ref, cand_model, h_cand, targets, shift=0, account="head_and_reduce"):
        """Reduce rows of the kept hidden states, head_rows at a time."""
        torch, head_rows = self.torch, self.head_rows
        t = time.perf_counter()
        parts = []
        n = h_ref.shape[0] - shift
        for s in range(0, n, head_rows):
            e = min(n, s + head_rows)
            la = head_logits(torch, ref_model, h_ref[s:e])
            lb = head_logits(torch, cand_model, h_cand[s + shift:e + shift])
            if lb.device != la.device:
                lb = lb.to(la.device)
            rec = self.reduce(torch, la, lb, targets[s:e].to(la.device), self.vocab)
            parts.append(rec)
            del la, lb
        self.synchronize()
        self.timings[account] += time.perf_counter() - t
        return {k: torch.cat([p[k] for p in parts]).cpu() for k in parts[0]}


class Outcome:
    """What a mode's passes leave for the record: per run, per window, the records (None for a
    window without scored rows); the gates' numbers; the models (or the reference's record,
    taken before it was unloaded); each arm's runs, model record, seconds and turns; the
    generated turns of the reference and of a single candidate (None: not asked for)."""

    def __init__(self, results, gates, ref_model=None, ref_record=None, cand_model=None, arm_results=None, turns=None):
        self.results, self.gates = results, gates
        self.ref_model, self.ref_record, self.cand_model = ref_model, ref_record, cand_model
        self.arm_results = arm_results
        self.turns = turns


# ---------------------------------------------------------------------------------------------
# Side by side: both models loaded, each window reduced at once


def side_by_side(r, shared):
    torch, specs = r.torch, r.specs
    gates = None
    done = 0
    dumped = False
    results = []
    ref_model = r.load(specs["reference"], "reference", warm=False)
    cand_model = ref_model if shared else r.load(specs["candidate"], "candidate", warm=False)
    r.warm(ref_model, specs["reference"], "reference")
    if shared:
        r.linear_attention["candidate"] = r.linear_attention["reference"]
    else:
        r.warm(cand_model, specs["candidate"], "candidate")
    for ri, (run_, windows) in enumerate(r.runs):
        recs = []
        for w, ids in enumerate(windows):
            rows = run_["window_rows"][w]
            if not rows:
                # No token of this window is scored: nothing to run.
                recs.append(None)
                done += 1
                progress("measuring", done, r.total_windows)
                continue
            keep = torch.tensor(rows, dtype=torch.long)
            targets = next_tokens(torch, ids, rows, r.vocab)
            h_ref = r.hidden_of(ref_model, specs["reference"], ids, keep)
            h_cand = r.hidden_of(cand_model, specs["candidate"], ids, keep)
            recs.append(r.records_of(ref_model, h_ref, cand_model, h_cand, targets))
            if r.dump and not dumped:
                dumped = True
                r.dump_logits(ref_model, h_ref, cand_model, h_cand, targets, rows)
            if r.req.get("gates") and gates is None:
                gates = run_gates(torch, r.timings, r.hidden_of, r.records_of, ref_model, cand_model, specs, ids, keep, targets, h_ref, h_cand)
            del h_ref, h_cand
            done += 1
            progress("measuring", done, r.total_windows)
        results.append(recs)
    # The turns after the scoring, each side as it was scored (one model shared by both sides
    # switches its attention and KV-cache scheme with its side).
    turns = None
    if r.turns is not None:
        turns = {
            "reference": r.generate(ref_model, specs["reference"], "the reference"),
            "candidate": r.generate(cand_model, specs["candidate"], "the candidate"),
        }
    return Outcome(results, gates, ref_model=ref_model, cand_model=cand_model, turns=turns)


# ---------------------------------------------------------------------------------------------
# Sequential: the reference first, its final hidden states at the scored rows kept, then the
# candidate (or each arm of a study) against them


def sequential(r, cfg, arm_specs):
    """Reference first, its final hidden states at the scored rows kept (exact: the logits are
    recomputed from them with the reference's head), then the candidate; the reference's output
    head stays loaded for the reduction."""
    torch, specs = r.torch, r.specs
    ref_model = r.load(specs["reference"], "reference")
    ref_record = model_record(ref_model, specs["reference"])
    kept = Kept(r, cfg)
    gates, done = reference_pass(r, ref_model, kept)
    ref_turns = r.generate(ref_model, specs["reference"], "the reference")
    ref_head = ref_model.get_output_embeddings()
    ref_cfg = ref_model.config
    # The record was taken before the pass; the scales it computed are known only now.
    ref_record["kv_scales"] = kv_scales_record(ref_model, kv_setting(specs["reference"], specs["reference"]["path"]))
    del ref_model
    if r.device != "cpu":
        torch.cuda.empty_cache()

    class HeadOnly:
        config = ref_cfg

        @staticmethod
        def get_output_embeddings():
            return ref_head

    arm_list = arm_specs or [specs["candidate"]]
    arm_results = []
    cand_model = None
    for ai, cspec in enumerate(arm_list):
        last = ai == len(arm_list) - 1
        t_arm = time.perf_counter()
        what = f"arm {ai + 1}/{len(arm_list)}" if arm_specs else "candidate"
        who = what if arm_specs else "the candidate"
        if arm_specs:
            done = 0
        cand_model = r.load(cspec, "candidate")
        arm_runs, done = arm_pass(r, kept, HeadOnly, cand_model, cspec, last, gates, what, done, bool(arm_specs))
        cand_record = model_record(cand_model, cspec)
        cand_record["attention"] = attn_used(cand_model)
        r.synchronize()
        seconds = time.perf_counter() - t_arm
        arm_results.append((arm_runs, cand_record, seconds, r.generate(cand_model, cspec, who)))
        if arm_specs and not last:
            done_turns = {"reference": ref_turns, "candidate": None} if r.turns is not None else None
            r.journal(Outcome(arm_results[0][0], gates, ref_record=ref_record, arm_results=list(arm_results), turns=done_turns))
        if not last:
            del cand_model
            if r.device != "cpu":
                torch.cuda.empty_cache()
    turns = None
    if r.turns is not None:
        turns = {"reference": ref_turns, "candidate": None if arm_specs else arm_results[0][3]}
    return Outcome(arm_results[0][0], gates, ref_record=ref_record, cand_model=cand_model, arm_results=arm_results, turns=turns)


class Kept:
    """Where the reference's hidden states wait for the candidate: on the head's device when they
    take under a quarter of its free memory, else in host memory when under half of what the
    host has free, else on disk beside the results (`keep_hidden: auto`), or where the request
    says. Per run, per window: the kept states (None: a window without scored rows)."""

    def __init__(self, r, cfg):
        self.torch = r.torch
        self.runs = []
        all_rows = sum(len(rows) for run_ in r.req["runs"] for rows in run_["window_rows"])
        kept_bytes = all_rows * cfg.get("hidden_size", 0) * r.dtype_size
        where = r.req.get("keep_hidden") or "auto"
        if where == "auto":
            host_free = free_bytes(r.torch, "cpu") or 0
            if r.device != "cpu" and kept_bytes <= 0.25 * (r.plan.get("free_bytes") or 0):
                where = "device"
            elif kept_bytes <= 0.5 * host_free:
                where = "host"
            else:
                where = "disk"
        r.plan["kept_hidden_where"] = where
        self.where = where
        self.spill = os.path.join(r.req["result_dir"], "spill")

    def stash(self, h, ri, w):
        if self.where == "device":
            return h
        if self.where == "host":
            return h.cpu()
        os.makedirs(self.spill, exist_ok=True)
        path = os.path.join(self.spill, f"run{ri}-window{w}.pt")
        self.torch.save(h.cpu(), path)
        return path

    def unstash(self, x, last=True):
        if isinstance(x, str):
            h = self.torch.load(x, weights_only=True)
            if last:
                os.remove(x)
            return h
        return x


def reference_pass(r, ref_model, kept):
    """The reference over every window, its hidden states kept; the self gate on the first
    window. Returns the gates' numbers and the windows done."""
    torch, specs = r.torch, r.specs
    gates = None
    done = 0
    for ri, (run_, windows) in enumerate(r.runs):
        hs = []
        for w, ids in enumerate(windows):
            rows = run_["window_rows"][w]
            if not rows:
                hs.append(None)
                done += 1
                progress("measuring reference", done, 2 * r.total_windows)
                continue
            keep = torch.tensor(rows, dtype=torch.long)
            h = r.hidden_of(ref_model, specs["reference"], ids, keep)
            if r.req.get("gates") and gates is None:
                targets = next_tokens(torch, ids, rows, r.vocab)
                gates = gate_self(torch, r.timings, r.hidden_of, r.records_of, ref_model, specs, ids, keep, targets, h)
            hs.append(kept.stash(h, ri, w))
            del h
            done += 1
            progress("measuring reference", done, 2 * r.total_windows)
        kept.runs.append(hs)
    return gates, done


def arm_pass(r, kept, head_only, cand_model, cspec, last, gates, what, done, arms):
    """One candidate (or arm) over every window against the kept reference states (released
    after the `last` one); the shift gate on its first window. Returns its per-run records and
    the windows done."""
    torch = r.torch
    ref_head = head_only.get_output_embeddings()
    shifted = False
    arm_runs = []
    for ri, (run_, windows) in enumerate(r.runs):
        recs = []
        for w, ids in enumerate(windows):
            rows = run_["window_rows"][w]
            if not rows:
                recs.append(None)
                done += 1
                progress(f"measuring {what}", done, r.total_windows if arms else 2 * r.total_windows)
                continue
            keep = torch.tensor(rows, dtype=torch.long)
            targets = next_tokens(torch, ids, rows, r.vocab)
            h_ref = kept.unstash(kept.runs[ri][w], last).to(ref_head.weight.device)
            h_cand = r.hidden_of(cand_model, cspec, ids, keep)
            recs.append(r.records_of(head_only, h_ref, cand_model, h_cand, targets))
            if r.req.get("gates") and not shifted:
                shifted = True
                gates["shift_forward_mean"] = gate_shift(torch, r.timings, r.records_of, head_only, h_ref, cand_model, h_cand, targets)
            if last:
                kept.runs[ri][w] = None
            done += 1
            progress(f"measuring {what}", done, r.total_windows if arms else 2 * r.total_windows)
        arm_runs.append(recs)
    return arm_runs, done


# ---------------------------------------------------------------------------------------------
# Results and the record


def save_runs(r, results, suffix):
    """One safetensors file of per-row records per run; the record's list of them."""
    torch, req = r.torch, r.req
    files = []
    for ri, ((run_, windows), recs) in enumerate(zip(r.runs, results)):
        per_window = run_["window_rows"]
        n_rows = sum(len(rows) for rows in per_window)
        ran = [x for x in recs if x is not None]
        tensors = {k: torch.cat([x[k] for x in ran]).contiguous() for k in ran[0]}
        counts = torch.tensor([len(rows) for rows in per_window], dtype=torch.long)
        tensors["window"] = torch.arange(len(windows), dtype=torch.int32).repeat_interleave(counts)
        tensors["position"] = torch.tensor([j for rows in per_window for j in rows], dtype=torch.int64)
        path = os.path.join(req["result_dir"], f"run{ri}{suffix}.safetensors")
        r.save_file(tensors, path + ".tmp", metadata={"context_length": str(run_["context_length"]), "rows": str(n_rows)})
        os.replace(path + ".tmp", path)
        files.append({"context_length": run_["context_length"], "path": path, "rows": n_rows})
    return files


def record(r, mode, arm_specs, outcome, t0):
    """The result files written and the record's content: the environment, the runs' files,
    the gates' numbers, and each arm's files, model and seconds."""
    req, specs = r.req, r.specs
    os.makedirs(req["result_dir"], exist_ok=True)
    files = save_runs(r, outcome.results, "")
    arms_out = None
    if arm_specs:
        arms_out = [
            {"runs": save_runs(r, arm_runs, f"-arm{ai}"), "model": rec, "seconds": seconds}
            for ai, (arm_runs, rec, seconds, _) in enumerate(outcome.arm_results)
        ]
        if outcome.turns is not None:
            for arm, (_, _, _, turns) in zip(arms_out, outcome.arm_results):
                arm["turns"] = turns
        outcome.cand_model = None
    r.timings["total"] = time.perf_counter() - t0
    if mode == "side_by_side":
        outcome.ref_record = model_record(outcome.ref_model, specs["reference"])
    if arm_specs:
        models = {"reference": outcome.ref_record, "candidate": arms_out[0]["model"]}
    else:
        models = {"reference": outcome.ref_record, "candidate": model_record(outcome.cand_model, specs["candidate"])}
        models["candidate"]["attention"] = attn_used(outcome.cand_model)
    # A shared model switches attention per side: record what each side asked for and got.
    models["reference"]["attention"] = specs["reference"].get("attn_implementation", "sdpa")
    env = environment(r.torch, r.transformers, req, models, r.timings, r.plan, mode)
    linear_attention = r.linear_attention
    if any(linear_attention.get(side) for side in ("reference", "candidate")):
        env["linear_attention"] = {side: linear_attention.get(side) for side in ("reference", "candidate")}
        if r.device != "cpu":
            for side, rec in env["linear_attention"].items():
                if rec and rec["gdn_kernel"] == "torch_fallback":
                    sys.stderr.write(
                        f"warning: the {side}'s Gated DeltaNet layers ran transformers' torch fallback "
                        "(flash-linear-attention is not installed): correct, but far slower on a GPU\n"
                    )
    out = {
        "environment": env,
        "runs": files,
        "gates": outcome.gates,
    }
    if arms_out is not None:
        out["arms"] = arms_out
    if outcome.turns is not None:
        out["turns"] = outcome.turns
    return out


# ---------------------------------------------------------------------------------------------
# Sanity gates

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
