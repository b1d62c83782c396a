"""Render the app icon (resources/icons/llamadesk.svg) as the PNGs the bundles need.

Windows and macOS want raster icons: PyInstaller turns build/icons/llamadesk.png into the .ico and .icns (with
Pillow, a llamadesk dependency); the AppImage takes llamadesk-256.png as its thumbnail (.DirIcon). Qt's SVG renderer
is the one the desktop app draws the same file with. Usage: python installer/make_icons.py OUTDIR
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

SVG = Path(__file__).resolve().parents[1] / "resources" / "icons" / "llamadesk.svg"
SIZES = {"llamadesk.png": 1024, "llamadesk-256.png": 256}


def render(svg: Path, size: int, out: Path) -> None:
    """Write svg as a size x size PNG with a transparent background."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"make_icons: {svg} is not an SVG Qt can draw")
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    if not image.save(str(out)):
        raise SystemExit(f"make_icons: could not write {out}")


def main(argv: list[str]) -> int:
    """Render every size into the folder argv[0]."""
    if len(argv) != 1:
        print("usage: python installer/make_icons.py OUTDIR", file=sys.stderr)
        return 2
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # a build machine has no display
    from PySide6.QtGui import QGuiApplication
    app = QGuiApplication([])  # noqa: F841 -- image and font handling need one
    outdir = Path(argv[0])
    outdir.mkdir(parents=True, exist_ok=True)
    for name, size in SIZES.items():
        render(SVG, size, outdir / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
