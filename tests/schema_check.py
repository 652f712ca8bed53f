#!/usr/bin/env python3
"""Independent check of the committed disclosure schema with Python's jsonschema and PyYAML.

Run by .ci/run (needs `pip install jsonschema pyyaml`). It checks that
schema/disclosure-v1.schema.json is a valid draft 2020-12 schema, and that the example cards'
`fidelity` blocks, read the way the Hub's Python tools read cards (huggingface_hub's front-matter
regex and yaml.safe_load), validate exactly when cardproof says they do.
"""

import json
import pathlib
import re
import subprocess
import sys

import jsonschema
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "schema" / "disclosure-v1.schema.json").read_text())
# huggingface_hub's REGEX_YAML_BLOCK.
YAML_BLOCK = re.compile(r"^(\s*---(?:\r\n|\r|\n))([\S\s]*?)((?:\r\n|\r|\n)---[ \t]*(\r\n|\n|$))")


def fidelity_block(card: pathlib.Path):
    match = YAML_BLOCK.match(card.read_text(encoding="utf-8"))
    if not match:
        return None
    return (yaml.safe_load(match.group(2)) or {}).get("fidelity")


def cardproof_schema_pointers(card: pathlib.Path):
    binary = ROOT / "target" / "debug" / "cardproof"
    out = subprocess.run(
        [str(binary), "lint", str(card), "--json"], capture_output=True, text=True, check=False
    )
    findings = json.loads(out.stdout)["findings"]
    return {
        f["pointer"]
        for f in findings
        if f["code"] in ("schema-violation", "missing-disclosure", "unknown-metric")
    }


def main() -> int:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    failures = 0
    cards = sorted((ROOT / "examples").rglob("README.md"))
    for card in cards:
        block = fidelity_block(card)
        if block is None:
            print(f"skip  {card.relative_to(ROOT)} (no fidelity block)")
            continue
        python_errors = sorted(validator.iter_errors(block), key=lambda e: list(e.absolute_path))
        ours = cardproof_schema_pointers(card)
        agree = bool(python_errors) == bool(ours)
        status = "ok   " if agree else "FAIL "
        failures += not agree
        print(f"{status} {card.relative_to(ROOT)}: python-jsonschema {len(python_errors)} errors, "
              f"cardproof {len(ours)} schema findings")
        for e in python_errors:
            print(f"        /fidelity/{'/'.join(map(str, e.absolute_path))}: {e.message[:100]}")
    if not cards:
        print("no example cards found")
        return 1
    print(f"{len(cards) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
