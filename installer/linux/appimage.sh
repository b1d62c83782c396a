#!/usr/bin/env bash
# An AppImage of the one-folder bundle: an AppDir with the bundle under usr/lib/llamadesk, AppRun, the desktop
# entry and the icon, packed by appimagetool behind the AppImage type-2 runtime.
# Usage: installer/linux/appimage.sh dist/llamadesk OUT.AppImage
# Needs appimagetool (APPIMAGETOOL=path, else on PATH) and the runtime (APPIMAGE_RUNTIME=path; without it
# appimagetool downloads one). Neither is in a package registry this project reaches: PyPI's AppImage packages
# (appimage, python-appimage, pyproject-appimage) and npm's (@reforged/maker-appimage and the electron makers)
# all download appimagetool or the runtime from the AppImage project's releases when they run, and Debian 12
# has only libappimage, a library for reading AppImages. So CI downloads both (.github/workflows/release.yml);
# without them this script stops after the AppDir (exit 3), which can be checked by hand.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=${1:?usage: installer/linux/appimage.sh dist/llamadesk OUT.AppImage}
OUT=${2:?usage: installer/linux/appimage.sh dist/llamadesk OUT.AppImage}
APPDIR=build/llamadesk.AppDir
rm -rf "$APPDIR"
mkdir -p "$APPDIR/usr/lib"
cp -a "$BUNDLE" "$APPDIR/usr/lib/llamadesk"
install -m 755 installer/linux/AppRun "$APPDIR/AppRun"
cp installer/linux/llamadesk.desktop "$APPDIR/llamadesk.desktop"
cp resources/icons/llamadesk.svg "$APPDIR/llamadesk.svg"
if [ -f build/icons/llamadesk-256.png ]; then  # the thumbnail file managers show (installer/make_icons.py)
  cp build/icons/llamadesk-256.png "$APPDIR/.DirIcon"
else
  ln -s llamadesk.svg "$APPDIR/.DirIcon"
fi
TOOL=${APPIMAGETOOL:-appimagetool}
if ! command -v "$TOOL" >/dev/null; then
  echo "appimage.sh: appimagetool not found (APPIMAGETOOL=path); the AppDir is in $APPDIR" >&2
  exit 3
fi
case "$(uname -m)" in
  x86_64) ARCH=x86_64 ;;
  aarch64|arm64) ARCH=aarch64 ;;
  *) ARCH=$(uname -m) ;;
esac
# --no-appstream: there is no AppStream metainfo file (software centres' listing) to check
ARCH=$ARCH "$TOOL" --no-appstream ${APPIMAGE_RUNTIME:+--runtime-file "$APPIMAGE_RUNTIME"} "$APPDIR" "$OUT"
echo "built $OUT"
