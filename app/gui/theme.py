"""The app's colours: the platform's palette, or a light or a dark one, switched at once; and the SVG icons
drawn in the palette's text colour so they read on either."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from PySide6.QtCore import QByteArray, QSettings, Qt
from PySide6.QtGui import QColor, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

THEMES = ("system", "light", "dark")  # the config's `theme` choices, in menu order
ICONS = Path(__file__).resolve().parents[2] / "resources" / "icons"
THEME_KEY = "theme"  # in the window's state (llamadesk-window.ini), not the settings file

Role = QPalette.ColorRole
Group = QPalette.ColorGroup

_DARK = {Role.Window: "#2d2d30", Role.WindowText: "#e6e6e6", Role.Base: "#1e1e20", Role.AlternateBase: "#2a2a2d",
         Role.ToolTipBase: "#3a3a3e", Role.ToolTipText: "#f0f0f0", Role.PlaceholderText: "#8c8c90",
         Role.Text: "#e6e6e6", Role.Button: "#38383c", Role.ButtonText: "#e6e6e6", Role.BrightText: "#ff6b6b",
         Role.Light: "#4a4a4f", Role.Midlight: "#3e3e42", Role.Mid: "#26262a", Role.Dark: "#1a1a1c",
         Role.Shadow: "#0a0a0a", Role.Highlight: "#3d7edb", Role.HighlightedText: "#ffffff", Role.Link: "#6ea8ff",
         Role.LinkVisited: "#b48cff"}
_DARK_DISABLED = {Role.WindowText: "#7c7c80", Role.Text: "#7c7c80", Role.ButtonText: "#7c7c80",
                  Role.Highlight: "#4a4a4f", Role.HighlightedText: "#a0a0a4"}
_LIGHT = {Role.Window: "#efefef", Role.WindowText: "#1e1e1e", Role.Base: "#ffffff", Role.AlternateBase: "#f5f5f5",
          Role.ToolTipBase: "#ffffdc", Role.ToolTipText: "#1e1e1e", Role.PlaceholderText: "#80808a",
          Role.Text: "#1e1e1e", Role.Button: "#efefef", Role.ButtonText: "#1e1e1e", Role.BrightText: "#ffffff",
          Role.Light: "#ffffff", Role.Midlight: "#cacaca", Role.Mid: "#b8b8b8", Role.Dark: "#9f9f9f",
          Role.Shadow: "#767676", Role.Highlight: "#308cc6", Role.HighlightedText: "#ffffff", Role.Link: "#0b57c2",
          Role.LinkVisited: "#7b3fb5"}
_LIGHT_DISABLED = {Role.WindowText: "#9a9a9a", Role.Text: "#9a9a9a", Role.ButtonText: "#9a9a9a",
                   Role.Highlight: "#c8c8c8", Role.HighlightedText: "#f5f5f5"}


if hasattr(Role, "Accent"):  # Qt 6.6+: Fusion draws checked boxes and progress bars with it
    _DARK[Role.Accent] = _DARK[Role.Highlight]
    _LIGHT[Role.Accent] = _LIGHT[Role.Highlight]
_state: dict[str, object] = {"name": "system", "system": None}  # the theme set, the platform's palette


def _palette(colors: dict, disabled: dict) -> QPalette:
    pal = QPalette()
    for role, color in colors.items():
        pal.setColor(role, QColor(color))
    for role, color in disabled.items():
        pal.setColor(Group.Disabled, role, QColor(color))
    return pal


def apply(app: QApplication, name: str) -> None:
    """Switch the whole app to the theme `name` (one of THEMES) at once; every widget repaints."""
    if name not in THEMES:
        raise ValueError(f"unknown theme {name!r}; one of {', '.join(THEMES)}")
    if _state["system"] is None:
        _state["system"] = QPalette(app.palette())  # what "system" goes back to
    if name == "dark":
        palette = _palette(_DARK, _DARK_DISABLED)
    elif name == "light":
        palette = _palette(_LIGHT, _LIGHT_DISABLED)
    else:
        palette = _state["system"]
    _state["name"] = name
    app.setPalette(palette)
    _drawn.cache_clear()
    for widget in app.allWidgets():
        if widget.styleSheet():  # a style sheet resolved its colours (palette(base)…) when polished: again
            widget.setStyleSheet(widget.styleSheet())


def remembered(state: QSettings, config) -> str:
    """The theme to start with: a --theme flag, else the one last chosen in the app, else the config's."""
    chosen = state.value(THEME_KEY)
    if config.sources.get("theme") == "cli" or chosen not in THEMES:
        return config.theme
    return chosen


def remember(state: QSettings, name: str) -> None:
    """Keep the theme chosen in the app in the window's own state: a GUI preference, so it never makes the
    settings file authoritative (which would let that file's values win over command-line flags)."""
    state.setValue(THEME_KEY, name)
    state.sync()


def current() -> str:
    """The theme apply() last set ("system" before any)."""
    return _state["name"]


def is_dark(palette: QPalette | None = None) -> bool:
    """Whether the palette (the app's by default) has light text on a dark window."""
    palette = palette or QApplication.palette()
    return palette.color(Role.Window).lightness() < palette.color(Role.WindowText).lightness()


def icon(name: str) -> QIcon:
    """resources/icons/<name>.svg with `currentColor` drawn in the palette's text colour."""
    return _drawn(name, QApplication.palette().color(Role.WindowText).name())


@lru_cache(maxsize=256)
def _drawn(name: str, color: str) -> QIcon:
    svg = (ICONS / f"{name}.svg").read_text().replace("currentColor", color)
    renderer = QSvgRenderer(QByteArray(svg.encode()))
    out = QIcon()
    for size in (16, 20, 24, 32, 48):  # a pixmap per size keeps small icons crisp (no downscaling blur)
        pix = QPixmap(size, size)
        pix.fill(Qt.GlobalColor.transparent)
        painter = QPainter(pix)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        renderer.render(painter)
        painter.end()
        out.addPixmap(pix)
    return out
