#!/usr/bin/env python3
"""Generate src/runner/native/ggml_tables.rs: the grid, sign and value tables of ggml's i-quants
and FP4 types, read from the pinned llama.cpp's `ggml/src/ggml-common.h` (llama-cpp-python
0.3.36's vendored copy), so that nobody copies four thousand numbers by hand.

    python3 -m pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all:
    tar xzf llama_cpp_python-0.3.36.tar.gz
    python3 runners/llamacpp/gen_ggml_tables.py llama_cpp_python-0.3.36/vendor/llama.cpp

Each table is the `GGML_TABLE_BEGIN(type, name, size) ... GGML_TABLE_END()` block of that name
(for `iq1s_grid`, the C/C++ variant, not the GPU one): the element count must equal the declared
size and every value must fit the declared type, or the script stops. The output records the
sha256 of the header it read; `cargo fmt` leaves it as written (`#[rustfmt::skip]`).
"""

import hashlib
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "..", "src", "runner", "native", "ggml_tables.rs"))

# (C name, Rust name, C type, what it is)
TABLES = [
    ("ksigns_iq2xs", "KSIGNS_IQ2XS", "uint8_t",
     "7 sign bits and their parity as the 8th: bit j set = value j negated (IQ2, IQ3_XXS)"),
    ("iq2xxs_grid", "IQ2XXS_GRID", "uint64_t", "IQ2_XXS: 8 magnitudes per entry, byte j = value j"),
    ("iq2xs_grid", "IQ2XS_GRID", "uint64_t", "IQ2_XS: 8 magnitudes per entry, byte j = value j"),
    ("iq2s_grid", "IQ2S_GRID", "uint64_t", "IQ2_S: 8 magnitudes per entry, byte j = value j"),
    ("iq3xxs_grid", "IQ3XXS_GRID", "uint32_t", "IQ3_XXS: 4 magnitudes per entry, byte j = value j"),
    ("iq3s_grid", "IQ3S_GRID", "uint32_t", "IQ3_S: 4 magnitudes per entry, byte j = value j"),
    ("kvalues_iq4nl", "KVALUES_IQ4NL", "int8_t", "IQ4_NL / IQ4_XS: the 16 non-linear levels"),
    ("kvalues_fp4", "KVALUES_FP4", "int8_t", "E2M1 values doubled, shared by MXFP4 and NVFP4"),
    ("iq1s_grid", "IQ1S_GRID", "uint64_t",
     "IQ1_S / IQ1_M: 8 values in {-1, 0, 1} per entry, byte j = value j as an i8"),
]

RUST = {"uint8_t": "u8", "int8_t": "i8", "uint32_t": "u32", "uint64_t": "u64"}
RANGE = {"uint8_t": (0, 255), "int8_t": (-128, 127), "uint32_t": (0, 2**32 - 1), "uint64_t": (0, 2**64 - 1)}
PER_LINE = {"u8": 16, "i8": 16, "u32": 8, "u64": 4}


def read_table(text, c_type, name):
    """The values of one table, checked against its declared type and size."""
    pattern = re.compile(r"GGML_TABLE_BEGIN\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)(.*?)GGML_TABLE_END\(\)", re.S)
    found = [m for m in pattern.finditer(text) if m.group(2) == name]
    if len(found) != 1:
        raise SystemExit(f"{name}: {len(found)} tables of that name in ggml-common.h")
    m = found[0]
    if m.group(1) != c_type:
        raise SystemExit(f"{name}: declared {m.group(1)}, expected {c_type}")
    size_token = m.group(3)
    if size_token.isdigit():
        size = int(size_token)
    else:
        d = re.search(r"#define\s+" + size_token + r"\s+(\d+)", text)
        if not d:
            raise SystemExit(f"{name}: size {size_token} is not defined")
        size = int(d.group(1))
    body = re.sub(r"//[^\n]*", "", m.group(4))
    values = [int(v, 0) for v in re.findall(r"-?(?:0x[0-9a-fA-F]+|\d+)", body)]
    if len(values) != size:
        raise SystemExit(f"{name}: {len(values)} values for a declared size of {size}")
    lo, hi = RANGE[c_type]
    bad = [v for v in values if not lo <= v <= hi]
    if bad:
        raise SystemExit(f"{name}: {bad[0]} does not fit {c_type}")
    return values


def literal(v, rust):
    if rust == "u64":
        return f"0x{v:016x}"
    if rust == "u32":
        return f"0x{v:08x}"
    return str(v)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: gen_ggml_tables.py LLAMA_CPP_SOURCE_DIR (the tree holding ggml/src/ggml-common.h)")
    path = os.path.join(sys.argv[1], "ggml", "src", "ggml-common.h")
    raw = open(path, "rb").read()
    text = raw.decode()
    digest = hashlib.sha256(raw).hexdigest()
    pkg_info = os.path.join(sys.argv[1], "..", "..", "PKG-INFO")
    version = "unknown"
    if os.path.exists(pkg_info):
        version = next((l.split(": ", 1)[1].strip() for l in open(pkg_info) if l.startswith("Version: ")), version)
    out = [
        "//! ggml's i-quant grids, sign table and 4-bit value tables, generated from the pinned",
        f"//! llama.cpp (llama-cpp-python {version}, vendor/llama.cpp/ggml/src/ggml-common.h,",
        f"//! sha256 {digest}).",
        "//!",
        "//! Do not edit: rerun `python3 runners/llamacpp/gen_ggml_tables.py LLAMA_CPP_SOURCE_DIR`",
        "//! (the script says how to unpack the pinned source); it checks every table's element count",
        "//! against its declared size. Grid entries are read byte by byte, little-endian, as ggml reads",
        "//! them (`(const uint8_t *)(grid + index)`).",
        "",
    ]
    for c_name, rust_name, c_type, what in TABLES:
        values = read_table(text, c_type, c_name)
        rust = RUST[c_type]
        out.append(f"/// `{c_name}`: {what}.")
        out.append("#[rustfmt::skip]")
        out.append(f"pub(super) static {rust_name}: [{rust}; {len(values)}] = [")
        n = PER_LINE[rust]
        for i in range(0, len(values), n):
            out.append("    " + ", ".join(literal(v, rust) for v in values[i:i + n]) + ",")
        out.append("];")
        out.append("")
    with open(OUT, "w") as f:
        f.write("\n".join(out))
    print(f"wrote {OUT} from {path} (sha256 {digest})")


if __name__ == "__main__":
    main()
