#!/usr/bin/env bash
# Records the GPU fixture of tests/fixtures/gpu/ (a real exchange of the transformers runner on
# the example pair, with the first rows' logits) and runs `verify --runner transformers` on a
# card written from that measurement. Run from the repository root on the GPU machine with the
# cardproof binary at $BIN; writes under $OUT.
# The GPU machine has no package registry: compressed-tensors (>= 0.15 for transformers 5.17)
# and its pure-Python dependencies travel as wheels under .whl/ and .whl/gpu/ (not committed;
# `pip download --no-deps compressed-tensors pydantic loguru frozendict ...` on a machine that has
# one, then carry `.whl` with the device call).
set -u
BIN=${BIN:-target/device/cardproof}
OUT=${OUT:-/tmp/cardproof-gpu}
M=examples/models
mkdir -p "$OUT"
python3 -m pip install --no-deps $(ls .whl/*.whl | grep -v compressed_tensors) .whl/gpu/*.whl 2>&1 | grep -v "^WARNING\|already satisfied" | tail -3
python3 -c "import compressed_tensors, transformers; print('compressed-tensors', compressed_tensors.__version__)" 2>&1 | tail -2
CAND=${CAND:-w8a16}
"$BIN" measure --runner transformers --reference $M/shakespeare-bf16 --candidate $M/shakespeare-$CAND \
  --eval-text examples/data/eval.txt --context-length 256 --out "$OUT/measure" \
  --runner-dump "$OUT/fixture" > "$OUT/measure.txt" 2> "$OUT/measure.err"
echo "measure rc=$?"; tail -3 "$OUT/measure.err"; head -12 "$OUT/measure.txt"
cp -r $M/shakespeare-$CAND "$OUT/candidate"
"$BIN" card --measurement "$OUT/measure/measurement.json" --into "$OUT/candidate/README.md" 2>&1 | tail -3
cp "$OUT/candidate/README.md" "$OUT/card.md"
"$BIN" verify "$OUT/candidate" --reference $M/shakespeare-bf16 --runner transformers --out "$OUT/verify" > "$OUT/verify.txt" 2> "$OUT/verify.err"
echo "verify rc=$?"; tail -25 "$OUT/verify.txt"; tail -3 "$OUT/verify.err"
rm -rf "$OUT/candidate"
