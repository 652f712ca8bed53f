#!/usr/bin/env bash
# The transformers runner's checks on the GPU machine (docs/benchmarks.md, tests/fixtures/gpu):
# the example pairs measured on the GPU with a logit dump (the fixture that checks the device's
# reduction against cardproof's), an attention sweep, and the benchmark. Run from the repository
# root with the cardproof binary at $BIN; writes under $OUT.
# The GPU machine has no package registry: compressed-tensors (>= 0.15 for transformers 5.17)
# and its pure-Python dependencies travel as wheels under .whl/ and .whl/gpu/ (not committed;
# `pip download --no-deps compressed-tensors pydantic loguru frozendict ...` on a machine that has
# one, then carry `.whl` with the device call).
set -u
BIN=${BIN:-target/device/cardproof}
OUT=${OUT:-/tmp/cardproof-gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
if ls .whl/gpu/*.whl >/dev/null 2>&1; then python3 -m pip install -q --no-deps $(ls .whl/*.whl | grep -v compressed_tensors) .whl/gpu/*.whl 2>&1 | grep -v WARNING | tail -1; fi
python3 runners/gpu/check_reduction.py 2>&1 | tee "$OUT/check_reduction.txt" | tail -16
M=examples/models
for cand in ${CANDIDATES:-w8a16 fp8-block}; do
  "$BIN" measure --runner transformers --reference $M/shakespeare-bf16 --candidate $M/shakespeare-$cand \
    --eval-text examples/data/eval.txt --context-length 256 --out "$OUT/$cand" \
    --runner-dump "$OUT/$cand/dump" --json > "$OUT/$cand.json" 2> "$OUT/$cand.err"
  echo "$cand rc=$?"; tail -2 "$OUT/$cand.err"
done
[ "${SWEEP:-1}" = 1 ] && "$BIN" measure --runner transformers --sweep attention=sdpa,eager --candidate $M/shakespeare-bf16 \
  --eval-text examples/data/eval.txt --context-length 256 --out "$OUT/sweep" > "$OUT/sweep.txt" 2> "$OUT/sweep.err"
echo "sweep rc=$?"; cat "$OUT/sweep.txt" | head -8; tail -2 "$OUT/sweep.err"
if [ "${BENCH:-1}" = 1 ]; then
  python3 runners/bench_gpu.py --out "$OUT/bench" ${BENCH_ARGS:-} 2>&1 | tail -25
fi
