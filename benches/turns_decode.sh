#!/usr/bin/env bash
# Greedy decode speed of the generated turns (issue #44, item 7; docs/benchmarks.md): the native
# runner against llama.cpp's own CPU decode on the same GGUF pair and threads, and what a run's
# turns cost against one prefill of each conversation plus its generated tokens.
#
#   benches/turns_decode.sh [CARDPROOF_BIN] [MAX_NEW_TOKENS] [REPEATS]
#
# Pairs: the example GGUF pair (BF16 reference, Q4_0 candidate) on the example conversation made
# compact enough for its 1024 trained positions (llama-server caps a slot there; the compaction of
# tests/it/llamacpp.rs), and, where CARDPROOF_REAL_MODEL names runners/llamacpp/real_model.sh's
# directory, SmolLM2-135M-Instruct (F32 reference, Q8_0 and Q4_0 candidates) on the example
# conversation's first twelve messages. For each, REPEATS times, interleaved (medians):
#   - cardproof measure --turns all (native): each model's prefill and decode from turns.timings;
#   - cardproof measure --runner llamacpp --turns all: llama.cpp's llama-server on the same
#     prompt ids, its own timings;
#   - llama-bench -p 0 -n MAX_NEW_TOKENS -d DEPTH: llama.cpp's bare decode at the longest
#     prompt's depth, as llama.cpp runs by default;
#   - the native measure without --turns: the turns' whole cost (rendering, prefill, decode,
#     judging) is the difference, set against (the longest prompt / the prefill rate + the
#     generated tokens / the decode rate) of each model, the rates from the same runs.
# llama-server and llama-bench come from runners/llamacpp/build.sh (the pinned source, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
cardproof=$(realpath "${1:-target/release/cardproof}")
max_new=${2:-64}
repeats=${3:-3}
bin="$(runners/llamacpp/build.sh)"
bench="$(dirname "$bin")/llama-bench"
threads=$(nproc)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
template=examples/data/chat_template.jinja

# conversation FILE MESSAGES COMPACT: the example conversation's first MESSAGES messages, made
# compact (shorter texts, the called tools without descriptions) when COMPACT is 1.
conversation() {
  python3 - "$@" <<'EOF'
import json, sys
out, messages, compact = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
d = json.load(open("examples/data/tool-conversation.json"))
d["messages"] = d["messages"][:messages]
if compact:
    for m in d["messages"]:
        if isinstance(m.get("content"), str):
            m["content"] = m["content"][: 80 if m["role"] == "user" else 40]
        m.pop("reasoning_content", None)
    d["messages"][0]["content"] = "You are the stage manager's assistant."
    keep = ("search_lines", "get_passage", "count_speeches")
    d["tools"] = [t for t in d["tools"] if t["function"]["name"] in keep]
    for t in d["tools"]:
        t["function"].pop("description", None)
        for p in t["function"]["parameters"]["properties"].values():
            p.pop("description", None)
json.dump(d, open(out, "w"))
EOF
}

# model_dir NAME GGUF_DIR: a directory with GGUF_DIR's model.gguf and tokenizer.json (hard
# links, else copies: cardproof follows no symbolic link out of a checkpoint), and a
# tokenizer_config.json naming <|im_end|> as the end of a turn (real_model.sh writes none).
model_dir() {
  local dir="$work/models/$1"
  mkdir -p "$dir"
  for f in model.gguf tokenizer.json; do
    ln "$2/$f" "$dir/$f" 2>/dev/null || cp "$2/$f" "$dir/$f"
  done
  echo '{"eos_token": "<|im_end|>"}' > "$dir/tokenizer_config.json"
  echo "$dir"
}

ms() { date +%s%N | cut -c1-13; }
declare -A times
run() { # name, command...
  local name=$1; shift
  local s; s=$(ms)
  "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; exit 1; }
  times[$name]+="$(( $(ms) - s )) "
}

# pair NAME REFERENCE CANDIDATE CONVERSATION TEXT: the runs of one pair (TEXT the plain text
# llama-perplexity scores beside the turns), then its table.
pair() {
  local name=$1 ref=$2 cand=$3 conv=$4 text=$5
  local native=(measure --reference "$ref" --candidate "$cand" --eval-text "$conv"
                --chat-template "$template" --context-length 128 --threads "$threads" --force)
  local turns=(--turns all --max-new-tokens "$max_new")
  for i in $(seq "$repeats"); do
    run "$name-plain" "$cardproof" "${native[@]}" --out "$work/$name-plain"
    run "$name-turns" "$cardproof" "${native[@]}" "${turns[@]}" --out "$work/$name-native$i"
    run "$name-llamacpp" "$cardproof" measure --runner llamacpp --llamacpp-bin "$bin" \
      --reference "$ref" --candidate "$cand" --eval-text "$text" \
      --context-length 256 --positions second-half --vocab threshold --bos none --threads "$threads" \
      "${turns[@]}" --turns-conversation "$conv" --chat-template "$template" \
      --out "$work/$name-llamacpp$i" --force
  done
  local depth
  depth=$(python3 -c "import json,sys; print(max(t['prompt_tokens'] for t in json.load(open(sys.argv[1]))['turns']['turns']))" "$work/$name-native1/measurement.json")
  for side in reference candidate; do
    local model=$ref; [ $side = candidate ] && model=$cand
    "$bench" -m "$model/model.gguf" -p 0 -n "$max_new" -d "$depth" -t "$threads" -r "$repeats" \
      -o json > "$work/$name-bench-$side.json" 2> "$work/bench.log"
  done
  python3 - "$work" "$name" "$repeats" "$threads" "$max_new" \
    "${times[$name-plain]}" "${times[$name-turns]}" <<'EOF'
import json, statistics, sys
work, name, repeats, threads, max_new, plain, turned = sys.argv[1:]
repeats, med = int(repeats), statistics.median
def timings(kind):
    runs = [json.load(open(f"{work}/{name}-{kind}{i}/measurement.json"))["turns"]
            for i in range(1, repeats + 1)]
    return runs[0], {side: {k: med(r["timings"][side][k] for r in runs)
                            for k in runs[0]["timings"][side]}
                     for side in ("reference", "candidate")}
doc, native = timings("native")
_, llamacpp = timings("llamacpp")
bench = {s: json.load(open(f"{work}/{name}-bench-{s}.json"))[0]["avg_ts"]
         for s in ("reference", "candidate")}
longest = max(t["prompt_tokens"] for t in doc["turns"])
generated = int(native["reference"]["generated_tokens"])
print(f"\n{name}: {threads} threads, {len(doc['turns'])} turns of at most {max_new} tokens "
      f"({generated} generated by the reference), longest prompt {longest} tokens, medians of {repeats}\n")
print(f"| model | native decode tok/s | llama-server decode tok/s | native ÷ llama-server | "
      f"llama-bench tg{max_new} @ d{longest} tok/s | native prefill tok/s | llama-server prefill tok/s |")
print("|---|---:|---:|---:|---:|---:|---:|")
rate = lambda t, n, s: t[n] / t[s]
for side in ("reference", "candidate"):
    n, l = native[side], llamacpp[side]
    nd, ld = rate(n, "generated_tokens", "decode_seconds"), rate(l, "generated_tokens", "decode_seconds")
    np_, lp = rate(n, "prefill_tokens", "prefill_seconds"), rate(l, "prefill_tokens", "prefill_seconds")
    print(f"| {side} | {nd:.0f} | {ld:.0f} | {nd / ld:.2f}x | {bench[side]:.0f} | {np_:.0f} | {lp:.0f} |")
cost = (med(int(x) for x in turned.split()) - med(int(x) for x in plain.split())) / 1000
expected = sum(longest / rate(native[s], "prefill_tokens", "prefill_seconds")
               + native[s]["generated_tokens"] / rate(native[s], "generated_tokens", "decode_seconds")
               for s in ("reference", "candidate"))
print(f"\nnative turns' cost (measure --turns less measure): {cost:.2f} s; one prefill of the "
      f"longest prompt + the generated tokens, both models: {expected:.2f} s; ratio {cost / expected:.2f}x "
      f"(prefill tokens run per model: {native['reference']['prefill_tokens']:.0f})")
EOF
}

conversation "$work/compact.json" 11 1
pair example examples/models/shakespeare-bf16-gguf examples/models/shakespeare-q4_0-gguf \
  "$work/compact.json" examples/data/eval.txt
if [ -n "${CARDPROOF_REAL_MODEL:-}" ]; then
  conversation "$work/twelve.json" 12 0
  head -c 8000 examples/data/tinyshakespeare.txt > "$work/text.txt"
  real_ref=$(model_dir f32 "$CARDPROOF_REAL_MODEL/reference")
  for q in Q8_0 Q4_0; do
    pair "smollm2-$q" "$real_ref" "$(model_dir "$q" "$CARDPROOF_REAL_MODEL/$q")" "$work/twelve.json" \
      "$work/text.txt"
  done
fi
