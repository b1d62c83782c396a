#!/usr/bin/env bash
# Linux bundle: PyInstaller one-folder build -> dist/llamadesk-<version>-linux-<arch>.tar.gz, then a
# smoke test that starts the built executable with --no-gui and drives it over HTTP.
# Usage: installer/linux/build.sh [--portable]   (--portable rebuilds llama-cpp-python with runtime
# CPU-variant dispatch first; without it the bundle carries this machine's native build)
set -euo pipefail
cd "$(dirname "$0")/../.."
make -s .venv/.installed
BIN=.venv/bin
$BIN/pip install -q "pyinstaller>=6.5"
if [ "${1:-}" = "--portable" ]; then
  CMAKE_ARGS="-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF" \
    $BIN/pip install --force-reinstall --no-deps --no-binary llama-cpp-python "llama-cpp-python==0.3.36"
fi
$BIN/pyinstaller --noconfirm --clean build_spec.spec
VERSION=$($BIN/python -c "import engine.service as s; print(s.VERSION)")
ARCH=$(uname -m)
tar -C dist -czf "dist/llamadesk-$VERSION-linux-$ARCH.tar.gz" llamadesk
installer/smoke_test.sh dist/llamadesk/llamadesk
echo "built dist/llamadesk-$VERSION-linux-$ARCH.tar.gz"
