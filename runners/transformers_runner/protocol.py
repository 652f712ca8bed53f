"""The request/record exchange with cardproof: the protocol version, reading and checking the
request and its token files, progress lines on stderr, and the record written at `record_path`,
a failure included (an error reaches cardproof as a record, never only as a traceback). The
formats are documented in docs/transformers-runner.md; cardproof checks every field it reads."""

import json
import os
import struct
import sys
import traceback

PROTOCOL = 1


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
    check_turns(req.get("turns"))
    return req


# The most tokens one turn may generate (cardproof's own cap, runner::native::generate).
MAX_NEW_TOKENS = 1 << 16


def check_turns(turns):
    """The request's `turns` (absent: none asked for): the prompts' token file and lengths, the
    stop ids, the budget and the logit entries that are tokens."""
    if turns is None:
        return
    require(isinstance(turns, dict), "turns must be an object")
    for key in ("tokens_file", "prompt_lengths", "stops", "max_new_tokens", "used"):
        require(key in turns, f"turns has no {key!r}")
    require(isinstance(turns["tokens_file"], str), "turns.tokens_file must be a path")
    lengths = turns["prompt_lengths"]
    require(
        isinstance(lengths, list) and lengths and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lengths),
        "turns.prompt_lengths must be a non-empty list of positive token counts",
    )
    stops = turns["stops"]
    require(
        isinstance(stops, list) and stops and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stops),
        "turns.stops must be a non-empty list of token ids",
    )
    budget = turns["max_new_tokens"]
    require(
        isinstance(budget, int) and not isinstance(budget, bool) and 1 <= budget <= MAX_NEW_TOKENS,
        f"turns.max_new_tokens must be 1 to {MAX_NEW_TOKENS}",
    )
    used = turns["used"]
    require(isinstance(used, int) and not isinstance(used, bool) and used >= 1, "turns.used must be a positive integer")


def read_turns(turns):
    """The checked `turns` with its prompts read: a list of token-id lists, one per turn."""
    path, lengths = turns["tokens_file"], turns["prompt_lengths"]
    size = os.path.getsize(path)
    total = sum(lengths)
    if size != total * 4:
        raise RunnerError("bad_request", f"{path} holds {size} bytes, expected {total} prompt tokens x 4 bytes")
    with open(path, "rb") as f:
        data = f.read()
    prompts, at = [], 0
    for n in lengths:
        prompts.append(list(struct.unpack_from(f"<{n}I", data, at * 4)))
        at += n
    return {**turns, "prompts": prompts}


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


def main(argv, run):
    """Read the request at argv[1], `run` it and write its record (or the error's); the exit
    status: 0 done, 2 usage, 3 a refusal (RunnerError), 4 anything else."""
    if len(argv) != 2:
        sys.stderr.write("usage: python3 -m transformers_runner REQUEST.json\n")
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
