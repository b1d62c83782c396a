#!/usr/bin/env bash
# Linux bundle: the PyInstaller one-folder build with the portable llama-cpp-python wheel of a variant
# (installer/wheel.sh: every CPU class; vulkan and cuda add that GPU backend), smoke-tested headless (and, on
# x86_64, with a faulting AMX variant and as an old CPU: installer/linux/*_smoke.sh), then packed
# as dist/llamadesk-<version>-linux-<arch>[-<variant>].tar.gz and, where appimagetool is at hand, an AppImage.
# Usage: installer/linux/build.sh [--variant cpu|vulkan|cuda] [--appimage|--no-appimage] [--models DIR]
#   --appimage: fail without appimagetool (default: make the AppImage only when it is found)
#   --models DIR: the starter set's files for the smoke test, made there when missing (default: the test assets
#   when prepared, else the starter set of `make run`; installer/smoke_models.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
VARIANT=cpu APPIMAGE=auto MODELS=${SMOKE_MODELS:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) VARIANT=$2; shift 2 ;;
    --appimage) APPIMAGE=yes; shift ;;
    --no-appimage) APPIMAGE=no; shift ;;
    --models) MODELS=$2; shift 2 ;;
    *) sed -n 's/^# Usage: /usage: /p' "$0" >&2; exit 2 ;;
  esac
done
installer/pyinstaller.sh "$VARIANT"
PY=build/bundle-venv/bin/python
MODELS=$($PY installer/smoke_models.py ${MODELS:+"$MODELS"})
installer/smoke_test.sh dist/llamadesk/llamadesk --models "$MODELS"
# on x86_64: with the AMX variant faulting as on a VM that advertises AMX (needs a C compiler), and as an
# SSE4.2-only CPU, which must get the sse42 variant (needs QEMU user mode)
if [ "$(uname -m)" = x86_64 ]; then
  if command -v "${CC:-cc}" >/dev/null; then
    installer/linux/faulty_variant_smoke.sh dist/llamadesk --models "$MODELS"
  else
    echo "no faulty-variant smoke test: no C compiler (installer/linux/faulty_variant_smoke.sh)"
  fi
  if command -v qemu-x86_64 >/dev/null; then
    installer/linux/oldcpu_smoke.sh dist/llamadesk Nehalem sse42 --models "$MODELS"
  else
    echo "no old-CPU smoke test: qemu-x86_64 not found (Debian's qemu-user; installer/linux/oldcpu_smoke.sh)"
  fi
fi

VERSION=$($PY -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
NAME=llamadesk-$VERSION-linux-$(uname -m)$([ "$VARIANT" = cpu ] || echo "-$VARIANT")
tar -C dist -czf "dist/$NAME.tar.gz" llamadesk
if [ "$APPIMAGE" = yes ] || { [ "$APPIMAGE" = auto ] && command -v "${APPIMAGETOOL:-appimagetool}" >/dev/null; }; then
  installer/linux/appimage.sh dist/llamadesk "dist/$NAME.AppImage"
else
  echo "no AppImage: appimagetool not found (APPIMAGETOOL names it; installer/linux/appimage.sh says why)"
fi
du -sh dist/llamadesk dist/"$NAME".*
