#!/usr/bin/env python3
"""Renders every chat template of tests/fixtures/chat_templates/templates with each conversation
of conversations.json as transformers renders it (`apply_chat_template`, the API a model's users
call), with `strftime_now` on a fixed clock, and every probe of probes.txt (one jinja2 rule each,
rendered in transformers' own chat-template environment), and writes one JSON document:

    {"clock": seconds, "special": {...},
     "renders": [
        {"template": name, "case": name, "text": str, "ids": [int, ...]} or
        {"template": name, "case": name, "error": str}, ...],
     "probes": [{"name": name, "text": str} or {"name": name, "error": str}, ...]}

`text` is what `apply_chat_template(..., tokenize=False)` returns (message keys whose value is
None dropped, reasoning aliased, special tokens given) and `ids` what `tokenize=True` returns with
the corpus tokenizer (tests/fixtures/chat_templates/tokenizer.json, made by make_tokenizer.py):
the rendered text tokenized with its special tokens parsed as control tokens and none added.
transformers is needed; torch is not.

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


def compiled(source):
    """transformers' compiled template for `source` (cached per source), on the fixed clock."""
    template = ctu._compile_jinja_template(source)
    template.globals["strftime_now"] = fixed_strftime
    return template


def error(e):
    return f"{type(e).__name__}: {e}"


def read_probes():
    """probes.txt: `=== name` lines, each followed by its template; the first block, `context`,
    is the JSON every probe renders with."""
    with open(os.path.join(FIXTURES, "probes.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, name, body = [], None, []
    for line in lines:
        if line.startswith("=== "):
            if name is not None:
                blocks.append((name, "\n".join(body).rstrip("\n")))
            name, body = line[4:].strip(), []
        else:
            body.append(line)
    if name is not None:
        blocks.append((name, "\n".join(body).rstrip("\n")))
    assert blocks and blocks[0][0] == "context", "probes.txt starts with its context"
    return json.loads(blocks[0][1]), blocks[1:]


def render_probes():
    context, probes = read_probes()
    out = []
    for name, source in probes:
        entry = {"name": name}
        try:
            entry["text"] = compiled(source).render(**context)
        except Exception as e:  # noqa: BLE001 - a template's own error is a result here
            entry["error"] = error(e)
        out.append(entry)
    return out


def main():
    with open(os.path.join(FIXTURES, "conversations.json"), encoding="utf-8") as f:
        doc = json.load(f)
    names = sorted(n for n in os.listdir(os.path.join(FIXTURES, "templates")) if n.endswith(".jinja"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(FIXTURES, "tokenizer.json"), **SPECIAL)
    renders = []
    for name in names:
        with open(os.path.join(FIXTURES, "templates", name), encoding="utf-8") as f:
            source = f.read()
        compiled(source)
        for case in doc["cases"]:
            entry = {"template": name, "case": case["name"]}
            tools = case.get("tools")
            tools = doc["tools"] if tools is True else tools or None
            args = dict(
                tools=tools,
                chat_template=source,
                add_generation_prompt=case["add_generation_prompt"],
                **case["kwargs"],
            )
            try:
                text = tokenizer.apply_chat_template(case["messages"], tokenize=False, **args)
                ids = tokenizer.apply_chat_template(case["messages"], tokenize=True, return_dict=False, **args)
                if ids and isinstance(ids[0], list):
                    ids = ids[0]
                if tokenizer.decode(ids) != text:
                    raise AssertionError("apply_chat_template's ids do not decode to its text")
                entry["text"] = text
                entry["ids"] = list(ids)
            except Exception as e:  # noqa: BLE001 - a template's own error is a result here
                entry["error"] = error(e)
            renders.append(entry)
    probes = render_probes()
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump({"clock": CLOCK, "special": SPECIAL, "renders": renders, "probes": probes}, f, ensure_ascii=False)
    print(
        f"{len(names)} templates, {len(renders)} renders, {sum('error' in r for r in renders)} errors; "
        f"{len(probes)} probes, {sum('error' in p for p in probes)} errors"
    )


if __name__ == "__main__":
    main()
