#!/usr/bin/env bash
# CPU benchmark of `--runner llamacpp` against llama.cpp's own passes (docs/benchmarks.md):
#
#   benches/llamacpp_runner.sh [CARDPROOF_BIN] [N_CTX] [REPEATS]
#
# By default on the example GGUF pair (BF16 reference, Q4_0 candidate) over
# examples/data/tinyshakespeare.txt; REF=, CAND= and TEXT= in the environment set another pair
# and text (the real model: REF=$(runners/llamacpp/real_model.sh)/reference/model.gguf
# CAND=$(runners/llamacpp/real_model.sh)/Q4_K_M/model.gguf). Interleaved, REPEATS times each
# (medians printed):
#   - two bare passes: llama-perplexity on the reference, then on the candidate;
#   - llama.cpp's KLD workflow: the base pass writing its base file, then the --kl-divergence pass;
#   - cardproof measure --runner llamacpp, with the printout gate (three processes) and without;
#   - with BEFORE=ANOTHER_CARDPROOF_BIN, that binary's two runs too (a change's before and after,
#     at the same load).
# llama-perplexity comes from runners/llamacpp/build.sh (the pinned source, cached). The load
# average is printed before and after: the runs share the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
cardproof=${1:-target/release/cardproof}
n_ctx=${2:-512}
repeats=${3:-3}
bin="$(runners/llamacpp/build.sh)"
threads=$(nproc)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
text=${TEXT:-examples/data/tinyshakespeare.txt}
ref=${REF:-examples/models/shakespeare-bf16-gguf/model.gguf}
cand=${CAND:-examples/models/shakespeare-q4_0-gguf/model.gguf}
before=${BEFORE:-}
ms() { date +%s%N | cut -c1-13; }
declare -A times cpu
run() { # name, command... (wall time, and the CPU time of it and every process it waited for)
  local name=$1; shift
  local s; s=$(ms)
  /usr/bin/time -o "$work/$name.cpu" -f "%U %S" "$@" > "$work/$name.log" 2>&1
  times[$name]+="$(( $(ms) - s )) "
  cpu[$name]+="$(awk '{printf "%d", 1000 * ($1 + $2)}' "$work/$name.cpu") "
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$repeats"); do
  run bare_reference "$bin" -m "$ref" -f "$text" -c "$n_ctx" -t "$threads"
  run bare_candidate "$bin" -m "$cand" -f "$text" -c "$n_ctx" -t "$threads"
  run llamacpp_base "$bin" -m "$ref" -f "$text" -c "$n_ctx" -t "$threads" --kl-divergence-base "$work/ref.base"
  run llamacpp_kld "$bin" -m "$cand" -c "$n_ctx" -t "$threads" --kl-divergence-base "$work/ref.base" --kl-divergence
  rm -f "$work/ref.base"
  args=(measure --runner llamacpp --llamacpp-bin "$bin" --reference "$ref" --candidate "$cand"
        --eval-text "$text" --context-length "$n_ctx" --positions second-half --vocab threshold
        --threads "$threads" --force)
  run cardproof "$cardproof" "${args[@]}" --out "$work/m"
  run cardproof_no_gate "$cardproof" "${args[@]}" --llamacpp-no-gate --out "$work/m2"
  if [ -n "$before" ]; then
    run before "$before" "${args[@]}" --out "$work/b"
    run before_no_gate "$before" "${args[@]}" --llamacpp-no-gate --out "$work/b2"
  fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
names=(bare_reference bare_candidate llamacpp_base llamacpp_kld cardproof cardproof_no_gate before
       before_no_gate)
cols=()
for n in "${names[@]}"; do cols+=("${times[$n]:-}"); done
for n in "${names[@]}"; do cols+=("${cpu[$n]:-}"); done
python3 - "$work/m/measurement.json" "$n_ctx" "$threads" "${cols[@]}" <<'PY'
import json, statistics, sys
path, n_ctx, threads, *cols = sys.argv[1:]
med = [statistics.median(int(x) for x in c.split()) / 1000 if c.strip() else None for c in cols]
ref, cand, base, kld, cp, cp_ng, b, b_ng = med[:8]
cpu = dict(zip(["ref", "cand", "base", "kld", "cp", "cp_ng", "b", "b_ng"], med[8:]))
m = json.load(open(path))
g = m["environment"]["llamacpp"]["gate"]
print(f"n_ctx {n_ctx}, {threads} threads, {m['eval']['token_count']} tokens, {m['runs'][0]['n_positions']} rows")
print("| run | seconds (median) | ÷ two bare passes | ÷ llama.cpp's workflow |")
print("|---|---:|---:|---:|")
rows = [("bare pass, reference", ref), ("bare pass, candidate", cand),
        ("llama.cpp base pass + KLD pass", base + kld),
        ("cardproof --runner llamacpp (gate on)", cp),
        ("cardproof --runner llamacpp --llamacpp-no-gate", cp_ng)]
if b is not None:
    rows += [("before: gate on", b), ("before: --llamacpp-no-gate", b_ng)]
for name, t in rows:
    print(f"| {name} | {t:.2f} | {t / (ref + cand):.2f}x | {t / (base + kld):.2f}x |")
print(f"the gate on top: {cp / cp_ng - 1:+.1%}" + (f" (before: {b / b_ng - 1:+.1%})" if b else ""))
# CPU seconds (user + system, every process each run waited for): the work, whatever the load.
work = cpu["base"] + cpu["kld"]
print("CPU seconds (median): " + ", ".join(
    f"{k} {v:.1f} ({v / work:.2f}x llama.cpp's workflow)" for k, v in cpu.items() if v is not None))
print(f"gate: llama.cpp {g['printed_kld_mean']} vs cardproof {g['cardproof_kld_mean']:.7f} "
      f"(allowed ±{g['allowed']:.1e}); kld_mean {m['runs'][0]['metrics']['kld_mean']:.7f}")
PY
