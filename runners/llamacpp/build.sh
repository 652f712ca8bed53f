#!/usr/bin/env bash
# Build llama.cpp's `llama-perplexity`, `llama-server`, `llama-bench`, `llama-quantize` and `llama-imatrix` from a
# pinned source a package registry serves: the llama-cpp-python sdist, which vendors llama.cpp
# under vendor/llama.cpp. Prints llama-perplexity's path on stdout (everything else goes to
# stderr); the others lie beside it: llama-server (the llama.cpp runner's generated turns, found
# beside llama-perplexity), llama-bench (benches/turns_decode.sh), llama-quantize and
# llama-imatrix (the real model's candidates).
#
#   runners/llamacpp/build.sh            CPU build (what CI and the llama.cpp runner's tests use)
#   runners/llamacpp/build.sh --cuda     CUDA build (GGML_CUDA=ON; needs nvcc)
#   runners/llamacpp/build.sh --gguf-py  no build: the same source's gguf-py (llama.cpp's Python
#                                        GGUF writer and reference quantizers), for the benches
#
# The build is cached under $CARDPROOF_CACHE (default ~/.cache/cardproof), keyed by the source's
# sha256, the backend and, for the CPU build (compiled for the host's instruction sets), the
# CPU's flags: a second run on the same machine prints the cached binary at once. A cache is
# complete only with every binary of $bins: one from before a binary was added (llama-server,
# llama-bench) is built again into the same directory (the same source and flags, so the same
# kernels; each binary replaced atomically), and the directory keeps its name, so a path taken
# from an earlier run stays valid.
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
backend=cpu
[ "${1:-}" = "--cuda" ] && backend=cuda

cache="${CARDPROOF_CACHE:-$HOME/.cache/cardproof}"

# The pinned sdist, checked, unpacked into $1; sets $src to its vendor/llama.cpp.
fetch_source() {
  # Only this package as source: its build requirements (cmake among them) come as wheels.
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python --dest "$1" \
    "llama-cpp-python==$VERSION" >&2
  local sdist="$1/llama_cpp_python-$VERSION.tar.gz"
  echo "$SHA256  $sdist" | sha256sum --check --quiet - >&2 || {
    echo "llama-cpp-python $VERSION: the sdist's sha256 is not the pinned one" >&2
    exit 1
  }
  tar -xzf "$sdist" -C "$1"
  src="$1/llama_cpp_python-$VERSION/vendor/llama.cpp"
}

if [ "${1:-}" = "--gguf-py" ]; then
  py="$cache/gguf-py-$VERSION-${SHA256:0:12}"
  if [ ! -d "$py/gguf" ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    fetch_source "$work"
    mkdir -p "$cache"
    rm -rf "$py.tmp" && cp -r "$src/gguf-py" "$py.tmp" && mv "$py.tmp" "$py"
  fi
  echo "$py"
  exit 0
fi
cpu_key=""
if [ "$backend" = cpu ] && [ -r /proc/cpuinfo ]; then
  cpu_key="-$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)"
fi
out="$cache/llama-perplexity-$VERSION-${SHA256:0:12}-$backend$cpu_key"
bins=(llama-quantize llama-imatrix llama-server llama-bench llama-perplexity)
complete=1
for bin in "${bins[@]}"; do
  [ -x "$out/$bin" ] || complete=0
done
if [ "$complete" = 1 ]; then
  echo "$out/llama-perplexity"
  exit 0
fi

command -v cmake >/dev/null 2>&1 || python3 -m pip install --quiet cmake >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fetch_source "$work"
# The server without its web page's prebuilt assets (a download at build time) and without
# HTTPS (it listens on 127.0.0.1 only).
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
       -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF)
[ "$backend" = cuda ] && flags+=(-DGGML_CUDA=ON)
cmake -S "$src" -B "$work/build" "${flags[@]}" >&2
cmake --build "$work/build" --target "${bins[@]}" -j "$(nproc)" >&2
mkdir -p "$out"
for bin in "${bins[@]}"; do
  cp "$work/build/bin/$bin" "$out/$bin.tmp"
  mv "$out/$bin.tmp" "$out/$bin"
done
echo "$out/llama-perplexity"
