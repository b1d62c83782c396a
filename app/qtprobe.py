"""Whether Qt can open a window here, asked of a child process before the app imports Qt: Qt calls abort()
when its platform plugin cannot load (a system library missing, a display that does not answer), which
would take the server down with it. Never imports Qt itself."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

# What the child runs: start Qt's GUI layer (the platform plugin loads here) and quit.
PROBE = "import sys\nfrom PySide6.QtGui import QGuiApplication\nQGuiApplication(sys.argv[:1])\n"
PROBE_COMMAND = "qt-probe"  # `llamadesk qt-probe` runs PROBE where there is no Python (a frozen build)
_MISSING = re.compile(r"([\w.+-]+\.so(?:\.\d+)*): cannot open shared object file")
_PLUGIN = re.compile(r'Qt platform plugin "([^"]+)"')
# Debian/Ubuntu packages not named after the library's soname (libfoo.so.1 -> libfoo1)
_PACKAGES = {"libglib-2.0.so.0": "libglib2.0-0", "libgobject-2.0.so.0": "libglib2.0-0",
             "libgio-2.0.so.0": "libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0",
             "libwayland-client.so.0": "libwayland-client0", "libEGL.so.1": "libegl1", "libGL.so.1": "libgl1",
             "libOpenGL.so.0": "libopengl0", "libGLX.so.0": "libglx0"}


@dataclass(frozen=True)
class QtProblem:
    """Why Qt cannot start: the platform plugin, the missing shared library if that is it, Qt's words."""

    plugin: str
    library: str | None
    reason: str

    def line(self) -> str:
        """The one line the app prints before serving headless."""
        if self.library is None:
            why = f"Qt's {self.plugin} platform plugin cannot start ({self.reason})"
        elif self.library.startswith("libQt6") or self.library.startswith("libpyside6"):
            why = (f"Qt's {self.plugin} platform plugin needs {self.library}, which PySide6 should have brought "
                   "(reinstall it: pip install --force-reinstall PySide6)")
        else:
            why = (f"Qt's {self.plugin} platform plugin needs the system library {self.library}, which is not "
                   f"installed (Debian/Ubuntu: sudo apt install {debian_package(self.library)})")
        return f"llamadesk: no window: {why}; serving headless instead (--no-gui skips this check)"


def debian_package(soname: str) -> str:
    """The Debian/Ubuntu package that ships a shared library, by Debian's naming policy: the soname without
    '.so.', a hyphen before the version when the name ends in a digit (libxcb-cursor.so.0 -> libxcb-cursor0,
    libxkbcommon-x11.so.0 -> libxkbcommon-x11-0)."""
    if soname in _PACKAGES:
        return _PACKAGES[soname]
    m = re.fullmatch(r"(.+?)\.so\.(\d+)(?:\.\d+)*", soname)
    if m is None:
        return soname.removesuffix(".so").lower()
    name, major = m.group(1).lower(), m.group(2)
    return f"{name}-{major}" if name[-1].isdigit() else f"{name}{major}"


def diagnose(output: str, platform: str) -> QtProblem:
    """Read a failed start's stderr (with QT_DEBUG_PLUGINS on): the first library the loader could not find,
    else Qt's last warning."""
    plugin = (_PLUGIN.findall(output) or [platform])[0]
    missing = _MISSING.findall(output)
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("qt.qpa") or "could not" in ln.lower() or "cannot" in ln.lower()]
    reason = (said or lines or ["it exited without a message"])[-1]
    return QtProblem(plugin, missing[0] if missing else None, re.sub(r"^qt\.[\w.]+: ", "", reason)[:300])


def requested_platform() -> str:
    """The platform plugin Qt will try first here."""
    wanted = os.environ.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0]
    if wanted:
        return wanted
    return "wayland" if os.environ.get("WAYLAND_DISPLAY") and not os.environ.get("DISPLAY") else "xcb"


def probe(timeout: float = 60.0) -> QtProblem | None:
    """None when Qt's GUI layer starts in a child process; else why it did not."""
    if getattr(sys, "frozen", False):
        command = [sys.executable, PROBE_COMMAND]
    else:
        command = [sys.executable, "-c", PROBE]
    env = {**os.environ, "QT_DEBUG_PLUGINS": "1"}  # the loader's own error names a missing library
    platform = requested_platform()
    try:
        done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return QtProblem(platform, None, f"it did not start within {timeout:.0f} s; is the display answering?")
    except OSError as e:
        return QtProblem(platform, None, f"the check could not run: {e.strerror}")
    if done.returncode == 0:
        return None
    return diagnose(done.stderr, platform)


def run_probe() -> int:
    """`llamadesk qt-probe` (PROBE in a frozen build): start Qt's GUI layer and exit 0; Qt aborts the process
    when it cannot."""
    from PySide6.QtGui import QGuiApplication
    QGuiApplication(sys.argv[:1])
    return 0
