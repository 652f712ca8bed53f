#!/usr/bin/env bash
# GPU benchmark of `--runner llamacpp` (issue #21; docs/benchmarks.md), on a machine with nvcc:
#
#   runners/llamacpp/gpu_bench.sh build SRC_TAR_XZ OUT_DIR     (the binaries and the models)
#   runners/llamacpp/gpu_bench.sh run CARDPROOF_BIN TEXT OUT_DIR [N_CTX]   (the timings)
#
# Two phases, so that each fits one call of a lent machine (the second finds the first's files
# under /tmp/llamacpp-bench).
#
# SRC_TAR_XZ: the pinned llama.cpp source (llama-cpp-python 0.3.36's vendor/llama.cpp, the
# files runners/llamacpp/build.sh builds from). It builds llama-perplexity and llama-quantize
# with CUDA, writes a ~4B Qwen3-shaped BF16 GGUF with random weights (make_gguf_pair.py) and its
# Q4_0 by llama-quantize, then times on the GPU (-ngl all), over TEXT in windows of N_CTX:
#   - two bare passes: llama-perplexity on the reference, then on the candidate (no base file);
#   - llama.cpp's own KLD workflow: the base pass writing its base file, then the KLD pass;
#   - cardproof measure --runner llamacpp (three processes at once, the printout gate on), and
#     with --llamacpp-no-gate (two processes).
# Writes OUT_DIR/llamacpp_bench.json and prints a Markdown table.
set -euo pipefail
phase=$1; shift
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
work=/tmp/llamacpp-bench
bin="$work/build/bin"
ms() { date +%s%N | cut -c1-13; }
secs() { python3 -c "print(round(($(ms) - $1) / 1000, 2))"; }

if [ "$phase" = build ]; then
  src_tar=$1; out=$2
  mkdir -p "$work/src" "$out"
  t0=$(ms)
  tar -xJf "$src_tar" -C "$work/src"
  cmake -S "$work/src" -B "$work/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > "$out/cmake.log" 2>&1
  cmake --build "$work/build" --target llama-perplexity llama-quantize -j "$(nproc)" >> "$out/cmake.log" 2>&1
  echo "build: $(secs "$t0") s" | tee "$out/build_seconds.txt"
  "$bin/llama-perplexity" --version 2>&1 | head -2 | tee "$out/version.txt" "$work/version.txt"
  t0=$(ms)
  python3 "$here/make_gguf_pair.py" --gguf-py "$work/src/gguf-py" \
    --tokenizer "$repo/examples/models/shakespeare-bf16" --out "$work/ref.gguf"
  "$bin/llama-quantize" "$work/ref.gguf" "$work/cand.gguf" Q4_0 > "$out/quantize.log" 2>&1
  echo "models: $(secs "$t0") s" | tee -a "$out/build_seconds.txt"
  ls -la "$work"
  exit 0
fi

cardproof=$1; text=$2; out=$3; n_ctx=${4:-4096}
mkdir -p "$out"
# The build phase's version line (its own OUT_DIR may be another directory).
cp "$work/version.txt" "$out/version.txt"
common=(-c "$n_ctx" -ngl all -lv 4)
timed() { # name, command... (each time also appended to times.txt as it comes)
  local name=$1; shift
  local s; s=$(ms)
  "$@" > "$out/$name.log" 2>&1
  local t; t=$(secs "$s")
  echo "$name $t" >> "$out/times.txt"
  echo "$t"
}
# A warm-up pass (CUDA context, page cache), then each measurement.
"$bin/llama-perplexity" -m "$work/ref.gguf" -f "$text" "${common[@]}" --chunks 1 > /dev/null 2>&1
t_ref=$(timed bare_reference "$bin/llama-perplexity" -m "$work/ref.gguf" -f "$text" "${common[@]}")
t_cand=$(timed bare_candidate "$bin/llama-perplexity" -m "$work/cand.gguf" -f "$text" "${common[@]}")
cp_args=(measure --runner llamacpp --llamacpp-bin "$bin/llama-perplexity" --llamacpp-gpu-layers all
  --reference "$work/ref.gguf" --candidate "$work/cand.gguf" --eval-text "$text"
  --context-length "$n_ctx" --positions second-half --vocab threshold --force)
t_cp=$(timed cardproof "$cardproof" "${cp_args[@]}" --out /tmp/llamacpp-bench-out/m-gate)
cp /tmp/llamacpp-bench-out/m-gate/measurement.json "$out/measurement.json"
t_cp_nogate=$(timed cardproof_nogate "$cardproof" "${cp_args[@]}" --llamacpp-no-gate --out /tmp/llamacpp-bench-out/m-nogate)
t_base=$(timed llamacpp_base "$bin/llama-perplexity" -m "$work/ref.gguf" -f "$text" "${common[@]}" \
  --kl-divergence-base "$work/ref.base")
base_bytes=$(stat -c %s "$work/ref.base")
t_kld=$(timed llamacpp_kld "$bin/llama-perplexity" -m "$work/cand.gguf" "${common[@]}" \
  --kl-divergence-base "$work/ref.base" --kl-divergence)
rm -f "$work/ref.base"

python3 - "$out" 0 0 "$t_ref" "$t_cand" "$t_base" "$t_kld" "$t_cp" "$t_cp_nogate" "$base_bytes" "$n_ctx" <<'EOF'
import json, sys
out, *vals = sys.argv[1:]
build, models, ref, cand, base, kld, cp, cp_nogate = map(float, vals[:8])
base_bytes, n_ctx = int(vals[8]), int(vals[9])
m = json.load(open(f"{out}/measurement.json"))
gate = m["environment"]["llamacpp"]["gate"]
run = m["runs"][0]
doc = {
    "n_ctx": n_ctx, "rows": run["n_positions"], "tokens": m["eval"]["token_count"],
    "version": open(f"{out}/version.txt").read().strip(),
    "device": m["environment"]["device"],
    "seconds": {"bare_reference": ref, "bare_candidate": cand,
                "llamacpp_base_pass": base, "llamacpp_kld_pass": kld,
                "cardproof": cp, "cardproof_no_gate": cp_nogate},
    "base_file_bytes": base_bytes,
    "ratio_to_two_bare_passes": {"cardproof": cp / (ref + cand), "cardproof_no_gate": cp_nogate / (ref + cand),
                                 "llamacpp_workflow": (base + kld) / (ref + cand)},
    # Issue #45's targets: without the gate at most 1.1x llama.cpp's own workflow, the gate at
    # most 30% on top.
    "ratio_to_llamacpp_workflow": {"cardproof": cp / (base + kld),
                                   "cardproof_no_gate": cp_nogate / (base + kld)},
    "gate_on_top": cp / cp_nogate - 1,
    "pair_seconds": m["environment"]["llamacpp"]["seconds"],
    "kld_mean": run["metrics"]["kld_mean"], "gate": gate,
}
json.dump(doc, open(f"{out}/llamacpp_bench.json", "w"), indent=1)
print(json.dumps(doc, indent=1))
print("| run | seconds | ÷ two bare passes | ÷ llama.cpp's workflow |")
print("|---|---:|---:|---:|")
for name, t in [("bare pass, reference", ref), ("bare pass, candidate", cand),
                ("llama.cpp's workflow: base pass writing its base file", base),
                ("then its --kl-divergence pass", kld),
                ("llama.cpp's workflow, both", base + kld),
                ("cardproof measure --runner llamacpp (gate on)", cp),
                ("the same, --llamacpp-no-gate", cp_nogate)]:
    print(f"| {name} | {t:.2f} | {t / (ref + cand):.2f}x | {t / (base + kld):.2f}x |")
print(f"the gate on top: {cp / cp_nogate - 1:+.1%}")
EOF
