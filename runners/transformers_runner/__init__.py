"""cardproof's transformers runner: per-position KLD records from two models on the user's GPU.

cardproof writes this package (embedded in its binary) into a temporary directory and starts it
as a subprocess:

    python3 DIR/transformers_runner REQUEST.json

(`python3 -m transformers_runner REQUEST.json` with DIR on the path does the same), and reads back
what it writes: one safetensors file of per-position records per run (context length) under the
request's `result_dir`, and a JSON record of what actually ran (or a structured error) at
`record_path`. Progress goes to stderr as lines `{"cardproof_progress": ...}`. The request and
record formats are documented in docs/transformers-runner.md; cardproof checks every field it
reads, so a change here without a change there is an error, not a wrong number.

What it does, per window: chunked prefill of each model to its final hidden states with the KV
cache kept (full-sequence logits are never formed), the output head applied only at the scored
rows, a chunk of rows at a time, and the reduction on the device in float64 (design.md's numerics
rules): log-softmax of each row with its maximum subtracted, the log-ratio formed and summed in
float64, forward and reverse KL, first-index top-1, NLL of the true next token. The statistics
are cardproof's (the `measure` module); this program only produces the records.

Modules: `protocol` (the request, the record, errors as records), `model` (checkpoints, loading,
attention, dtype), `kv_quant` (the KV-cache schemes, as the native runner's), `reduce` (the
per-row reduction, the Triton kernel), `memory` (the memory plan), `provenance` (what ran, for
the record) and `run` (the passes, in order). Importing the package imports neither torch nor
transformers: `run` does, and a missing one is an error record.

Dependencies: torch and transformers (accelerate for `device: auto`), safetensors. Nothing else.
Only safetensors checkpoints are loaded, and `trust_remote_code` stays off unless the request
says otherwise (the user's `--trust-remote-code`).
"""
