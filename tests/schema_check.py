#!/usr/bin/env python3
"""Independent check of the committed disclosure schema with Python's jsonschema and PyYAML.

Run by .ci/run after `cargo build` (needs `pip install jsonschema pyyaml`); it runs the debug
binary in $CARGO_TARGET_DIR (else target/) or the one --cardproof names. It checks that
schema/disclosure-v1.schema.json is a valid draft 2020-12 schema, and that the example cards'
`fidelity` blocks, read the way the Hub's Python tools read cards (huggingface_hub's front-matter
regex and yaml.safe_load), validate exactly when cardproof says they do.
"""

import argparse
import json
import os
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


def default_binary() -> pathlib.Path:
    """target/debug/cardproof under $CARGO_TARGET_DIR (relative to the working directory, as cargo
    reads it) or else under this repository's target/."""
    target = os.environ.get("CARGO_TARGET_DIR")
    return (pathlib.Path(target).resolve() if target else ROOT / "target") / "debug" / "cardproof"


def cardproof_schema_pointers(binary: pathlib.Path, card: pathlib.Path):
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cardproof", type=pathlib.Path, default=default_binary(),
                    help="the cardproof binary (default: debug build in $CARGO_TARGET_DIR or target/)")
    binary = ap.parse_args().cardproof.resolve()
    if not os.access(binary, os.X_OK):
        print(f"schema_check: ERROR: cardproof binary not found or not executable: {binary} "
              "(run `cargo build`, or pass --cardproof)", file=sys.stderr)
        return 2
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
        ours = cardproof_schema_pointers(binary, card)
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
