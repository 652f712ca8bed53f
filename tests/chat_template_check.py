#!/usr/bin/env python3
"""Renders every chat template of tests/fixtures/chat_templates/templates with each conversation
of conversations.json as transformers renders it (`render_jinja_template`, the function under
`apply_chat_template`), with `strftime_now` on a fixed clock, and writes one JSON document:

    {"clock": seconds, "special": {...}, "renders": [
        {"template": name, "case": name, "text": str, "ids": [int, ...]} or
        {"template": name, "case": name, "error": str}, ...]}

`ids` are what `apply_chat_template(..., tokenize=True)` returns with the corpus tokenizer
(tests/fixtures/chat_templates/tokenizer.json, made by make_tokenizer.py): the rendered text
tokenized with its special tokens parsed as control tokens and no special tokens added.

Run by the CI test `transformers::torch::chat_templates_render_as_transformers_renders_them`,
which renders the same with cardproof and compares the bytes:

    python3 tests/chat_template_check.py OUT.json
"""

import datetime
import json
import os
import sys

from transformers import PreTrainedTokenizerFast
from transformers.utils import chat_template_utils as ctu

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
CLOCK = 1796323700  # 2026-12-03 18:48:20 UTC
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def fixed_strftime(fmt):
    return datetime.datetime.fromtimestamp(CLOCK, datetime.timezone.utc).strftime(fmt)


def main():
    with open(os.path.join(FIXTURES, "conversations.json")) as f:
        doc = json.load(f)
    names = sorted(n for n in os.listdir(os.path.join(FIXTURES, "templates")) if n.endswith(".jinja"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(FIXTURES, "tokenizer.json"), **SPECIAL)
    renders = []
    for name in names:
        with open(os.path.join(FIXTURES, "templates", name), encoding="utf-8") as f:
            source = f.read()
        for case in doc["cases"]:
            entry = {"template": name, "case": case["name"]}
            try:
                # The compiled template is cached per source: fix its clock before rendering.
                ctu._compile_jinja_template(source).globals["strftime_now"] = fixed_strftime
                entry["text"] = ctu.render_jinja_template(
                    conversations=[case["messages"]],
                    tools=doc["tools"] if case.get("tools") else None,
                    chat_template=source,
                    add_generation_prompt=case["add_generation_prompt"],
                    **SPECIAL,
                    **case["kwargs"],
                )[0][0]
                ids = tokenizer.apply_chat_template(
                    case["messages"],
                    tools=doc["tools"] if case.get("tools") else None,
                    chat_template=source,
                    add_generation_prompt=case["add_generation_prompt"],
                    tokenize=True,
                    return_dict=False,
                    **case["kwargs"],
                )
                if ids and isinstance(ids[0], list):
                    ids = ids[0]
                if tokenizer.decode(ids) != entry["text"]:
                    raise AssertionError("apply_chat_template's ids do not decode to its text")
                entry["ids"] = list(ids)
            except Exception as e:  # noqa: BLE001 - a template's own error is a result here
                entry["error"] = f"{type(e).__name__}: {e}"
            renders.append(entry)
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump({"clock": CLOCK, "special": SPECIAL, "renders": renders}, f, ensure_ascii=False)
    print(f"{len(names)} templates, {len(renders)} renders, {sum('error' in r for r in renders)} errors")


if __name__ == "__main__":
    main()
