"""`--install-desktop`: llamadesk's menu entry and icon for the current user, the XDG way (Linux desktops).

The entry goes to $XDG_DATA_HOME/applications/llamadesk.desktop and the icon to
$XDG_DATA_HOME/icons/hicolor/scalable/apps/llamadesk.svg (~/.local/share when the variable is unset); desktops
watch both folders, so the entry shows up without a log-out. Installing again rewrites only what changed.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

from platformdirs.unix import Unix

log = logging.getLogger("llamadesk.app")

ICON = Path(__file__).resolve().parents[1] / "resources" / "icons" / "llamadesk.svg"
DESKTOP_ID = "llamadesk"  # the entry's file name and the icon's name in the theme
# Every key but Exec and TryExec, which name the installed program; the AppImage's entry
# (installer/linux/llamadesk.desktop) carries the same ones.
KEYS = {
    "Type": "Application",
    "Name": "llamadesk",
    "GenericName": "Local AI server",
    "Comment": "Run local AI models and serve them to any OpenAI client",
    "Icon": DESKTOP_ID,
    "Terminal": "false",
    "Categories": "Development;",
    "Keywords": "AI;LLM;chat;OpenAI;llama;speech;",
    "StartupNotify": "true",
    "StartupWMClass": "llamadesk",
}
# characters that make the Desktop Entry spec's Exec argument quoted
RESERVED = frozenset(" \t\"'\\><~|&;$*?#()`")


def default_data_home() -> Path:
    """$XDG_DATA_HOME, else ~/.local/share."""
    return Unix().user_data_path


def exec_argument(arg: str) -> str:
    """arg as one argument of an Exec value: the spec's quoting ('%' doubled; when quoted, '"', '`', '$' and '\\'
    escaped), then the general string escape of '\\', which a reader undoes first."""
    if any(ord(c) < 0x20 for c in arg):
        raise ValueError(f"{arg!r}: a control character cannot be written into a desktop entry")
    arg = arg.replace("%", "%%")
    if any(c in RESERVED for c in arg):
        arg = '"' + "".join("\\" + c if c in '"`$\\' else c for c in arg) + '"'
    return escape(arg)


def escape(value: str) -> str:
    """value as a desktop entry string (its one escape that a path can need: '\\' doubled)."""
    return value.replace("\\", "\\\\")


def entry_text(exe: Path) -> str:
    """The desktop entry that starts exe."""
    command = exec_argument(str(exe))  # first: it refuses what no entry can hold
    lines = ["[Desktop Entry]", *(f"{key}={value}" for key, value in KEYS.items()),
             f"TryExec={escape(str(exe))}",  # menus hide the entry once exe is gone
             f"Exec={command}"]
    return "\n".join(lines) + "\n"


def paths(data: Path) -> tuple[Path, Path]:
    """The entry's and the icon's paths under the data dir data."""
    return (data / "applications" / f"{DESKTOP_ID}.desktop",
            data / "icons" / "hicolor" / "scalable" / "apps" / f"{DESKTOP_ID}.svg")


def _put(path: Path, content: bytes) -> None:
    """Write content to path unless it already holds it; a reader never sees half a file."""
    if path.is_file() and path.read_bytes() == content:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def install(exe: Path, data_home: Path | None = None) -> list[Path]:
    """Put the entry starting exe and the icon under data_home (default: the XDG data dir); returns both paths."""
    exe = exe.absolute()
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        raise FileNotFoundError(f"{exe} is not an executable file")
    entry, icon = paths(data_home or default_data_home())
    _put(entry, entry_text(exe).encode())
    _put(icon, ICON.read_bytes())
    return [entry, icon]


def uninstall(data_home: Path | None = None) -> list[Path]:
    """Remove the entry and the icon from data_home (default: the XDG data dir); returns those that were there."""
    removed = []
    for path in paths(data_home or default_data_home()):
        if path.exists():
            path.unlink()
            removed.append(path)
    return removed


def launcher() -> Path:
    """The program the entry should start: the AppImage itself (its runtime names it in $APPIMAGE; the bundle it
    mounts lives at a temporary path), the bundle's executable, or the `llamadesk` script beside this python."""
    if os.environ.get("APPIMAGE"):
        return Path(os.environ["APPIMAGE"])
    if getattr(sys, "frozen", False):  # PyInstaller's bundle
        return Path(sys.executable)
    script = shutil.which("llamadesk", path=str(Path(sys.executable).parent)) or shutil.which("llamadesk")
    if script is None:
        raise FileNotFoundError("no llamadesk executable to start: install the package (pip install .) first")
    return Path(script)


def run(remove: bool = False) -> int:
    """`--install-desktop` (remove: `--uninstall-desktop`): do it, print each file, and return the exit code."""
    if sys.platform in ("win32", "darwin"):
        print("llamadesk: the desktop entry is for Linux desktops; the Windows installer and the macOS .app "
              "make their own", file=sys.stderr)
        return 2
    try:
        done = uninstall() if remove else install(launcher())
    except (OSError, ValueError) as e:
        print(f"llamadesk: error: {e}", file=sys.stderr)
        return 1
    for path in done:
        print(path)
    return 0
