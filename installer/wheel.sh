#!/usr/bin/env bash
# The llama-cpp-python wheel a bundle carries, built once per variant and configuration and cached.
# Usage: installer/wheel.sh VARIANT          build it unless cached; print the wheel's path
#        installer/wheel.sh --args VARIANT   print the variant's CMake arguments (vulkan: once the headers are fit)
#        installer/wheel.sh --carry-modules WHEEL   move a pip-built wheel's ggml modules into llama_cpp/lib (below)
# VARIANT: cpu (every CPU class: llama.cpp loads the best libggml-cpu-* at start), vulkan, cuda (Linux and
# Windows) or metal (macOS); the GPU variants carry the CPU variants too, for the layers left on the CPU.
# Environment: PYTHON (a python with pip; default python3), WHEEL_CACHE (default ~/.cache/llamadesk/wheels,
# beside the Makefile's native wheel), LLAMA_WHEEL (a wheel already built with these arguments
# and its modules carried: used as is), VULKAN_HEADERS (vulkan: the include folder of Vulkan-Headers to build
# against, holding vulkan/vulkan_core.h, e.g. a Khronos Vulkan-Headers release's include/ or Debian 13's
# libvulkan-dev unpacked; default: $VULKAN_SDK/include where VULKAN_SDK is set, else the system's).
set -euo pipefail
# absolute: CMake reads it from its build folder, and the caller named it from where it stands (a folder that is
# not there stays as named, for check_vulkan_headers to say so)
[ -z "${VULKAN_HEADERS:-}" ] || VULKAN_HEADERS=$(cd "$VULKAN_HEADERS" 2>/dev/null && pwd || echo "$VULKAN_HEADERS")
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
# Runtime CPU dispatch instead of the build machine's instruction set; RPC lets a bundle offload to
# `rpc-server` hosts; nothing of llama.cpp's own tools, tests or downloader is needed by the Python package.
BASE_ARGS="-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF -DGGML_RPC=ON \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF"

cmake_args() {
  case "$1" in
    cpu) echo "$BASE_ARGS" ;;
    vulkan) echo "$BASE_ARGS -DGGML_VULKAN=ON${VULKAN_HEADERS:+ -DVulkan_INCLUDE_DIR=$VULKAN_HEADERS}" ;;
    cuda) echo "$BASE_ARGS -DGGML_CUDA=ON" ;;
    # the Metal shaders are compiled into the library, so the .app needs no .metal file beside it
    metal) echo "$BASE_ARGS -DGGML_METAL=ON -DGGML_METAL_EMBED_LIBRARY=ON" ;;
    *) echo "installer/wheel.sh: unknown variant '$1' (cpu, vulkan, cuda, metal)" >&2; return 2 ;;
  esac
}

# llama-cpp-python installs into llama_cpp/lib only the libraries it links; ggml installs its loadable backend
# modules (the CPU variants, RPC, GPU) to CMake's bin/, which lands at the wheel's root (site-packages/bin/, where
# nothing looks) beside a second copy of the libraries in lib/. Move the modules beside libggml, where
# engine/backends.py looks for them, and drop both stray folders; `wheel pack` rewrites RECORD.
carry_modules() {
  local wheel=$1 tmp root
  "$PY" -m wheel version >/dev/null 2>&1 || "$PY" -m pip install -q wheel >&2
  tmp=$(mktemp -d)
  "$PY" -m wheel unpack -d "$tmp" "$wheel" >&2
  root=$(echo "$tmp"/*/)
  if [ -d "$root/bin" ]; then
    find "$root/bin" -maxdepth 1 -name '*ggml-*' -exec mv -f {} "$root/llama_cpp/lib/" \;
    rm -rf "${root:?}/bin" "${root:?}/lib"
    "$PY" -m wheel pack -d "$(dirname "$wheel")" "$root" >&2
  fi
  rm -rf "$tmp"
}

# The vendored ggml-vulkan.cpp creates its instance with VK_EXT_layer_settings, which Vulkan-Headers 1.3.239
# (Debian 12's libvulkan-dev) lack: stop now rather than at that file, twenty minutes into the build.
# The headers are VULKAN_HEADERS, else the SDK's where VULKAN_SDK is set (Windows, macOS), else the system's.
check_vulkan_headers() {
  local core
  core=${VULKAN_HEADERS:-${VULKAN_SDK:+$VULKAN_SDK/include}}
  core=${core:-$(pkg-config --variable=includedir vulkan 2>/dev/null || echo /usr/include)}/vulkan/vulkan_core.h
  if [ -n "${VULKAN_HEADERS:-}" ] && [ ! -f "$core" ]; then
    echo "installer/wheel.sh: VULKAN_HEADERS=$VULKAN_HEADERS holds no vulkan/vulkan_core.h (name their include" \
      "folder)" >&2
    exit 3
  fi
  if [ -f "$core" ] && ! grep -q VK_EXT_layer_settings "$core"; then
    echo "installer/wheel.sh: $core (VK_HEADER_VERSION $(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' \
      "$core")) has no VK_EXT_layer_settings, which the vendored ggml-vulkan.cpp needs: install newer Vulkan-Headers" \
      "(the Vulkan SDK's, or set VULKAN_HEADERS to their include folder)" >&2
    exit 3
  fi
}

if [ "${1:-}" = "--carry-modules" ]; then
  carry_modules "${2:?usage: installer/wheel.sh --carry-modules WHEEL}"
  exit
fi
if [ "${1:-}" = "--args" ]; then
  [ "${2:-}" != vulkan ] || check_vulkan_headers
  cmake_args "${2:?usage: installer/wheel.sh --args VARIANT}"
  exit
fi
VARIANT=${1:?usage: installer/wheel.sh VARIANT}
ARGS=$(cmake_args "$VARIANT")
VERSION=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
# the Makefile's scheme: one folder per version and CMake arguments, so two configurations never mix
# (hashed with python: macOS has no sha1sum; the newline is echo's, so the digests match the Makefile's)
TAG=$("$PY" -c 'import hashlib, sys; print(hashlib.sha1(sys.argv[1].encode() + b"\n").hexdigest()[:12])' \
  "$VERSION $ARGS")
DIR="${WHEEL_CACHE:-$HOME/.cache/llamadesk/wheels}/llama-cpp-python-$TAG"

if [ -n "${LLAMA_WHEEL:-}" ]; then
  echo "$LLAMA_WHEEL"
  exit
fi
if [ ! -f "$DIR/.done" ]; then
  [ "$VARIANT" != vulkan ] || check_vulkan_headers
  echo "building llama-cpp-python $VERSION ($VARIANT) into $DIR: $ARGS" >&2
  mkdir -p "$DIR"
  # pip's cache is bypassed: it keys wheels by the sdist, not by CMAKE_ARGS, and would hand back another build
  CORES=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)  # macOS has no nproc
  CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$CORES}" \
    "$PY" -m pip wheel --no-cache-dir --no-deps --no-binary llama-cpp-python -w "$DIR" \
    "llama-cpp-python==$VERSION" >&2
  touch "$DIR/.done"
fi
if [ ! -f "$DIR/.modules" ]; then
  carry_modules "$(ls "$DIR"/llama_cpp_python-"$VERSION"-*.whl)"
  touch "$DIR/.modules"
fi
ls "$DIR"/llama_cpp_python-"$VERSION"-*.whl
