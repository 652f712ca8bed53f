#!/bin/bash
# KV-cache sweeps in the transformers runner through a release binary (issue #18; run on one H200
# for docs/benchmarks.md): CARDPROOF=path/to/cardproof OUT=dir bash runners/gpu/kv_sweep.sh
# 1. The example (trained, 4.2M parameters) at 256 tokens, every scheme, bf16 on the H200.
# 2. A random 4.0B Qwen3-shape model at 32,768 tokens (the example's tokenizer: its 2,048 ids are
#    valid ids of the 151,936 vocabulary, the rest of the logits is padding to cardproof), for
#    the pipeline at length and the rounding cache's cost: none-vs-none against none-vs-SCHEME.
export PYTHONUNBUFFERED=1 CARDPROOF_PYTHON=python3 NO_COLOR=1
B=${CARDPROOF:-.bin/cardproof}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } > $OUT/gpu.txt 2>&1
s=$(date +%s)
$B measure --runner transformers --sweep kv_cache=none,bf16,q8_0,q5_1,q4_0,fp8_e4m3,int8_per_token_head,fp8_per_token_head \
  --candidate examples/models/shakespeare-bf16 --eval-text examples/data/eval.txt --context-length 256 \
  --out /tmp/swex --json > $OUT/sweep-example.json 2> $OUT/sweep-example.log
echo "example sweep: exit $? in $(( $(date +%s) - s )) s" | tee -a $OUT/gpu.txt
python3 - <<'P'
import shutil, sys
sys.path.insert(0, "runners")
import bench_gpu
m = bench_gpu.new_model("dense", 40960)
m.save_pretrained("/tmp/q4b", safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"examples/models/shakespeare-bf16/{f}", "/tmp/q4b")
print("4B saved", sum(p.numel() for p in m.parameters()))
P
s=$(date +%s)
$B measure --runner transformers --sweep kv_cache=none,none,q8_0,q4_0,int8_per_token_head \
  --candidate /tmp/q4b --eval-text examples/data/tinyshakespeare.txt --context-length 32768 \
  --out /tmp/sw4b --json > $OUT/sweep-4b.json 2> $OUT/sweep-4b.log
echo "4B sweep: exit $? in $(( $(date +%s) - s )) s" | tee -a $OUT/gpu.txt
python3 - <<'P'
import json, os
for name in ("sweep-example", "sweep-4b"):
    try:
        d = json.load(open(f"{os.environ['OUT']}/{name}.json"))
    except Exception as e:
        print(name, "unreadable", e); continue
    for p in d.get("pairs", []):
        r = p["runs"][0]
        t = p["environment"].get("lane", "")
        print(name, p["other"], r["kld_mean"], r["top1_agreement"], r["n_flips"], r["n_positions"])
for d in ("/tmp/sw4b",):
    for sub in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        m = os.path.join(d, sub, "measurement.json")
        if os.path.exists(m):
            e = json.load(open(m))["environment"]
            tm = (e.get("transformers_runner") or {}).get("timings_s") or {}
            print(sub, {k: round(v, 3) for k, v in tm.items() if isinstance(v, float)})
P
tail -3 $OUT/sweep-4b.log
