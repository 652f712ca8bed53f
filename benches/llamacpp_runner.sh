#!/usr/bin/env bash
# CPU benchmark of `--runner llamacpp` against llama.cpp's own passes (docs/benchmarks.md):
#
#   benches/llamacpp_runner.sh [CARDPROOF_BIN] [N_CTX] [REPEATS]
#
# On the example GGUF pair (BF16 reference, Q4_0 candidate) over examples/data/tinyshakespeare.txt,
# interleaved, REPEATS times each (medians printed):
#   - two bare passes: llama-perplexity on the reference, then on the candidate;
#   - llama.cpp's KLD workflow: the base pass writing its base file, then the --kl-divergence pass;
#   - cardproof measure --runner llamacpp, with the printout gate (three processes) and without.
# llama-perplexity comes from runners/llamacpp/build.sh (the pinned source, cached).
set -euo pipefail
cd "$(dirname "$0")/.."
cardproof=${1:-target/release/cardproof}
n_ctx=${2:-512}
repeats=${3:-3}
bin="$(runners/llamacpp/build.sh)"
threads=$(nproc)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
text=examples/data/tinyshakespeare.txt
ref=examples/models/shakespeare-bf16-gguf/model.gguf
cand=examples/models/shakespeare-q4_0-gguf/model.gguf
ms() { date +%s%N | cut -c1-13; }
declare -A times
run() { # name, command...
  local name=$1; shift
  local s; s=$(ms)
  "$@" > "$work/$name.log" 2>&1
  times[$name]+="$(( $(ms) - s )) "
}
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
done
python3 - "$work/m/measurement.json" "$n_ctx" "$threads" \
  "${times[bare_reference]}" "${times[bare_candidate]}" "${times[llamacpp_base]}" \
  "${times[llamacpp_kld]}" "${times[cardproof]}" "${times[cardproof_no_gate]}" <<'EOF'
import json, statistics, sys
path, n_ctx, threads, *cols = sys.argv[1:]
med = [statistics.median(int(x) for x in c.split()) / 1000 for c in cols]
ref, cand, base, kld, cp, cp_ng = med
m = json.load(open(path))
g = m["environment"]["llamacpp"]["gate"]
print(f"n_ctx {n_ctx}, {threads} threads, {m['eval']['token_count']} tokens, {m['runs'][0]['n_positions']} rows")
print("| run | seconds (median) | ÷ two bare passes |")
print("|---|---:|---:|")
for name, t in [("bare pass, reference", ref), ("bare pass, candidate", cand),
                ("llama.cpp base pass + KLD pass", base + kld),
                ("cardproof --runner llamacpp (gate on)", cp),
                ("cardproof --runner llamacpp --llamacpp-no-gate", cp_ng)]:
    print(f"| {name} | {t:.2f} | {t / (ref + cand):.2f}x |")
print(f"gate: llama.cpp {g['printed_kld_mean']} vs cardproof {g['cardproof_kld_mean']:.7f} "
      f"(allowed ±{g['allowed']:.1e}); kld_mean {m['runs'][0]['metrics']['kld_mean']:.7f}")
EOF
