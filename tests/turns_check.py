#!/usr/bin/env python3
"""Independent check of cardproof's generated turns: transformers' own greedy `generate`.

Reads a measurement.json written by `cardproof measure --turns`, renders every turn's prompt
again with transformers' `apply_chat_template(messages[:i], add_generation_prompt=True)` (the
conversation file and template given), generates greedily with transformers (float32 on CPU,
`do_sample=False`, stopping at the measurement's stop ids, at most its max_new_tokens) for the
reference and the candidate, and compares the token ids with cardproof's, turn by turn.

    python3 tests/turns_check.py MEASUREMENT.json CONVERSATIONS.json TEMPLATE REFERENCE CANDIDATE

Exit 0 when every turn's prompt length and every generated token agree, 1 otherwise (each
difference printed).
"""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast


def conversations(path):
    text = open(path, encoding="utf-8").read()
    try:
        doc = json.loads(text)
        docs = doc if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "messages" in doc[0] else [doc]
    except json.JSONDecodeError:
        docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [d if isinstance(d, dict) else {"messages": d} for d in docs]


def greedy(model, ids, stops, max_new):
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=stops,
        pad_token_id=stops[0],
    )
    return out[0, len(ids):].tolist()


def main():
    measurement, conv_path, template_path, reference, candidate = sys.argv[1:6]
    m = json.load(open(measurement))
    t = m["turns"]
    stops = t["stop_ids"]
    max_new = t["protocol"]["max_new_tokens"]
    template = open(template_path, encoding="utf-8").read()
    # A model directory without tokenizer_config.json (the MoE fixture) names no tokenizer
    # class: AutoTokenizer would pick one by model type and add its special tokens; the file
    # itself is what the model was given, as cardproof reads it.
    if os.path.exists(os.path.join(reference, "tokenizer_config.json")):
        tok = AutoTokenizer.from_pretrained(reference)
    else:
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(reference, "tokenizer.json"))
    convs = conversations(conv_path)
    models = {
        side: AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        for side, path in (("reference", reference), ("candidate", candidate))
    }
    bad = 0
    for turn in t["turns"]:
        c = convs[turn["conversation"]]
        prompt = tok.apply_chat_template(
            c["messages"][: turn["message"]],
            tools=c.get("tools"),
            chat_template=template,
            add_generation_prompt=True,
            tokenize=False,
        )
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        where = f"conversation {turn['conversation'] + 1}, message {turn['message'] + 1}"
        if len(ids) != turn["prompt_tokens"]:
            print(f"{where}: prompt of {len(ids)} tokens, cardproof's {turn['prompt_tokens']}")
            bad += 1
            continue
        for side, model in models.items():
            with torch.no_grad():
                want = greedy(model, ids, stops, max_new)
            got = turn[side]["ids"]
            if want != got:
                print(f"{where}, {side}: transformers {want}, cardproof {got}")
                bad += 1
    n = len(t["turns"])
    print(f"{n - bad if bad <= n else 0} of {n} turns agree ({2 * n} generations)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
