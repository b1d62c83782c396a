#!/usr/bin/env bash
# Build llama.cpp's llama-server (or its RPC server, ggml-rpc-server: `llamadesk rpc-server` runs it) from the
# source vendored in the llama-cpp-python sdist that llamadesk uses, with the same CPU flags as the Makefile's
# wheel, into a cache dir. GGML_RPC is on: an rpc-server speaks the RPC protocol of that same ggml.
# Usage: build_llama_server.sh [CACHE_DIR] [llama-server|ggml-rpc-server]   -> prints the path of the binary
set -euo pipefail
VERSION=0.3.36
CACHE=${1:-$HOME/.cache/llamadesk}
TARGET=${2:-llama-server}
case "$TARGET" in llama-server|ggml-rpc-server) ;; *) echo "unknown target $TARGET" >&2; exit 2;; esac
OUT=$CACHE/llama.cpp-$VERSION
BIN=$OUT/build/bin/$TARGET
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ ! -d "$OUT/src" ]; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$VERSION" >&2
  tar xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$tmp"
  mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$OUT/src"
  rm -rf "$tmp"
fi
# a machine with only Python and a compiler has no cmake on PATH: PyPI's, in the python's own environment (as
# the wheel's build gets it through its build isolation)
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then
  "$PY" -m pip install -q "cmake>=3.21" >&2
  CMAKE="$(dirname "$PY")/cmake"
fi
FLAGS=""
[ "$(uname -m)" = x86_64 ] && FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
"$CMAKE" -S "$OUT/src" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_RPC=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" >&2
"$CMAKE" --build "$OUT/build" --config Release --target "$TARGET" -j"$(nproc)" >&2
echo "$BIN"
