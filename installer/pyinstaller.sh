#!/usr/bin/env bash
# The PyInstaller build that installer/linux/build.sh and installer/macos/build.sh share: a venv of its own
# (build/bundle-venv, so the development .venv keeps its native wheel) holding llamadesk and the variant's
# llama-cpp-python wheel (installer/wheel.sh), then build_spec.spec -> dist/llamadesk/ (and dist/llamadesk.app
# on macOS).
# Usage: installer/pyinstaller.sh VARIANT
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANT=${1:?usage: installer/pyinstaller.sh VARIANT}
VENV=build/bundle-venv
if [ ! -x "$VENV/bin/python" ]; then
  "${PYTHON:-$(command -v python3.11 || command -v python3)}" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
WHEEL=$(PYTHON="$VENV/bin/python" installer/wheel.sh "$VARIANT")
# the wheel first and on its own: a previous variant's llama-cpp-python of the same version may be installed
"$VENV/bin/pip" install -q --force-reinstall --no-deps "$WHEEL"
"$VENV/bin/pip" install -q "$WHEEL" . "pyinstaller>=6.5"
"$VENV/bin/python" installer/make_icons.py build/icons
"$VENV/bin/pyinstaller" --noconfirm --clean --distpath dist --workpath build/pyinstaller build_spec.spec
