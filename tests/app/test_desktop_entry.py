"""`--install-desktop` (app/desktop_entry.py) against a temporary XDG data dir, and the Linux installer's own
desktop entry and systemd user unit, checked by the desktop's and systemd's validators where installed."""
from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app import desktop_entry

ROOT = Path(__file__).resolve().parents[2]
LINUX = ROOT / "installer" / "linux"
needs_validator = pytest.mark.skipif(shutil.which("desktop-file-validate") is None,
                                     reason="desktop-file-validate (Debian: desktop-file-utils) is not installed")


def fake_exe(folder: Path, name: str = "llamadesk") -> Path:
    """An executable file standing in for the bundle's."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / name
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


def read_entry(path: Path) -> dict[str, str]:
    """The [Desktop Entry] group's keys as a desktop would read them (string escapes not yet undone)."""
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # keys are case-sensitive
    parser.read_string(path.read_text(encoding="utf-8"))
    return dict(parser["Desktop Entry"])


def exec_argv(value: str) -> list[str]:
    """An Exec value as the argv a desktop starts, read the way the Desktop Entry spec says: the string escape
    '\\\\' undone first, then arguments split at spaces, a quoted one with '\\' escaping '"', '`', '$' and '\\'."""
    text, argv, arg, quoted, i = value.replace("\\\\", "\\"), [], None, False, 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\" and text[i + 1:i + 2] in ('"', "`", "$", "\\"):
            arg, i = arg + text[i + 1], i + 2
            continue
        if c == '"':
            quoted, arg = not quoted, arg or ""
        elif c == " " and not quoted:
            if arg is not None:
                argv.append(arg)
            arg = None
        else:
            arg = (arg or "") + c
        i += 1
    assert not quoted, f"unterminated quote in {value!r}"
    return [a.replace("%%", "%") for a in argv + ([arg] if arg is not None else [])]


def validate(path: Path) -> str:
    """desktop-file-validate's complaints about path (empty when it has none)."""
    done = subprocess.run(["desktop-file-validate", str(path)], capture_output=True, text=True, timeout=60)
    return (done.stdout + done.stderr).strip() + ("" if done.returncode == 0 else f" (exit {done.returncode})")


def test_install_puts_the_entry_and_icon_under_xdg_data_home(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    exe = fake_exe(tmp_path / "opt" / "llamadesk")
    written = desktop_entry.install(exe)
    assert written == [data / "applications" / "llamadesk.desktop",
                       data / "icons" / "hicolor" / "scalable" / "apps" / "llamadesk.svg"]
    assert sorted(p for p in data.rglob("*") if p.is_file()) == sorted(written)
    keys = read_entry(written[0])
    assert exec_argv(keys["Exec"]) == [str(exe)]
    assert keys["TryExec"] == str(exe) and keys["Icon"] == "llamadesk" and keys["Type"] == "Application"
    assert written[1].read_bytes() == (ROOT / "resources" / "icons" / "llamadesk.svg").read_bytes()


def test_install_without_xdg_data_home_uses_local_share(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    entry, icon = desktop_entry.install(fake_exe(tmp_path / "bin"))
    assert entry == tmp_path / ".local" / "share" / "applications" / "llamadesk.desktop" and entry.is_file()
    assert icon.is_relative_to(tmp_path / ".local" / "share" / "icons" / "hicolor") and icon.is_file()


@needs_validator
@pytest.mark.parametrize("folder", ["plain", "with space", "100% $HOME `x` \"q\" 'a' back\\slash (1) #2"],
                         ids=["plain", "space", "reserved-characters"])
def test_installed_entry_is_valid_and_starts_that_exact_path(tmp_path, folder):
    exe = fake_exe(tmp_path / folder)
    entry, _ = desktop_entry.install(exe, tmp_path / "data")
    assert validate(entry) == ""
    assert exec_argv(read_entry(entry)["Exec"]) == [str(exe)]


def test_install_twice_changes_nothing_and_again_elsewhere_moves_exec(tmp_path):
    data = tmp_path / "data"
    exe = fake_exe(tmp_path / "a")
    first = desktop_entry.install(exe, data)
    for path in first:
        os.utime(path, ns=(1, 1))  # a rewrite would give it the time of now
    assert desktop_entry.install(exe, data) == first
    assert [p.stat().st_mtime_ns for p in first] == [1, 1]
    moved = fake_exe(tmp_path / "b")
    assert desktop_entry.install(moved, data) == first
    assert exec_argv(read_entry(first[0])["Exec"]) == [str(moved)]
    assert first[1].stat().st_mtime_ns == 1  # the icon did not change
    assert sorted(p.name for p in data.rglob("*") if p.is_file()) == ["llamadesk.desktop", "llamadesk.svg"]


def test_uninstall_removes_what_install_put_and_then_has_nothing_to_remove(tmp_path):
    data = tmp_path / "data"
    written = desktop_entry.install(fake_exe(tmp_path / "bin"), data)
    assert desktop_entry.uninstall(data) == written
    assert not any(p.exists() for p in written)
    assert desktop_entry.uninstall(data) == []


@pytest.mark.parametrize("make", [lambda tmp: tmp / "absent", lambda tmp: tmp,
                                  lambda tmp: (tmp / "plain.txt", (tmp / "plain.txt").write_text("x"))[0]],
                         ids=["missing", "a-folder", "not-executable"])
def test_install_refuses_what_cannot_start(tmp_path, make):
    with pytest.raises(FileNotFoundError, match="not an executable file"):
        desktop_entry.install(make(tmp_path), tmp_path / "data")
    assert not (tmp_path / "data").exists()


def test_install_refuses_a_path_no_entry_can_hold(tmp_path):
    with pytest.raises(ValueError, match="control character"):
        desktop_entry.install(fake_exe(tmp_path / "line\nbreak"), tmp_path / "data")


def test_launcher_is_the_appimage_when_running_from_one(tmp_path, monkeypatch):
    monkeypatch.setenv("APPIMAGE", str(tmp_path / "llamadesk-0.1.0-x86_64.AppImage"))
    assert desktop_entry.launcher() == tmp_path / "llamadesk-0.1.0-x86_64.AppImage"


def test_launcher_from_a_source_install_is_the_environments_script(monkeypatch):
    monkeypatch.delenv("APPIMAGE", raising=False)
    script = shutil.which("llamadesk", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("this environment has no llamadesk script (pip install -e . makes one)")
    assert desktop_entry.launcher() == Path(script)


def test_run_prints_each_file_and_exits_0(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("APPIMAGE", str(fake_exe(tmp_path / "apps", "llamadesk.AppImage")))
    assert desktop_entry.run() == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(p) for p in desktop_entry.paths(tmp_path / "data")]
    assert desktop_entry.run(remove=True) == 0
    assert not any(p.exists() for p in desktop_entry.paths(tmp_path / "data"))
    monkeypatch.setenv("APPIMAGE", str(tmp_path / "gone.AppImage"))
    assert desktop_entry.run() == 1
    assert "not an executable file" in capsys.readouterr().err


def test_the_appimages_entry_carries_the_installed_entrys_keys():
    keys = read_entry(LINUX / "llamadesk.desktop")
    assert keys.pop("Exec") == "llamadesk"  # AppRun is what starts; appimagetool wants a plain command
    assert keys == desktop_entry.KEYS


@needs_validator
def test_the_appimages_entry_is_valid():
    assert validate(LINUX / "llamadesk.desktop") == ""


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_user_unit_verifies(tmp_path):
    unit = (LINUX / "llamadesk.service").read_text()
    start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert start.split("=", 1)[1].split()[1:] == ["--no-gui"]
    assert "RestartPreventExitStatus=2" in unit.splitlines()  # a bad config (exit 2) is not restarted every 5 s
    # verify checks that ExecStart exists; the unit's %h/.local/opt path is the user's to fill in
    exe = fake_exe(tmp_path / "opt")
    (tmp_path / "llamadesk.service").write_text(unit.replace(start, f"ExecStart={exe} --no-gui"))
    done = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "llamadesk.service")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_the_command_line_flags_install_and_remove_the_entry(tmp_path, monkeypatch):
    """`llamadesk --install-desktop` / `--uninstall-desktop` through app.main, as a user types them."""
    from app.main import main
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setenv("APPIMAGE", str(fake_exe(tmp_path / "bin")))
    assert main(["--install-desktop"]) == 0
    entry = tmp_path / "applications" / "llamadesk.desktop"
    assert entry.is_file() and str(tmp_path / "bin" / "llamadesk") in entry.read_text()
    assert main(["--uninstall-desktop"]) == 0
    assert not entry.exists()
