#!/usr/bin/env bash
# macOS bundle (Apple silicon): llamadesk.app from build_spec.spec's BUNDLE with the metal variant of
# llama-cpp-python (installer/wheel.sh: GGML_METAL=ON with the shaders embedded, and the CPU variants
# apple_m1 / apple_m2_m3 / apple_m4 picked at start), smoke-tested headless, then a dmg holding the .app and a link
# to /Applications to drag it onto: dist/llamadesk-<version>-macos-arm64.dmg. The .app is signed ad hoc
# (PyInstaller's default on arm64) and not notarized: Gatekeeper asks once (right-click, Open).
# Usage: installer/macos/build.sh [--models DIR]   (DIR: as in installer/linux/build.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODELS=${SMOKE_MODELS:-}
if [ "${1:-}" = "--models" ]; then MODELS=${2:?--models DIR}; fi
installer/pyinstaller.sh metal
PY=build/bundle-venv/bin/python
MODELS=$($PY installer/smoke_models.py ${MODELS:+"$MODELS"})
installer/smoke_test.sh dist/llamadesk.app/Contents/MacOS/llamadesk --models "$MODELS"

VERSION=$($PY -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
DMG=dist/llamadesk-$VERSION-macos-$(uname -m).dmg
STAGE=build/dmg
rm -rf "$STAGE" "$DMG"
mkdir -p "$STAGE"
ditto dist/llamadesk.app "$STAGE/llamadesk.app"  # ditto keeps the signature's extended attributes and links
ln -s /Applications "$STAGE/Applications"
hdiutil create -volname llamadesk -srcfolder "$STAGE" -fs HFS+ -format UDZO -ov "$DMG"
du -sh dist/llamadesk.app "$DMG"
