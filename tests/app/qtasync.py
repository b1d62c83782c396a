"""Small helpers the desktop tests share for driving the app on its qasync loop (tests/app/conftest.py)."""
from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest


def run(loop, coro, timeout: float = 60):
    """Run coro on the loop (the app's server and window run meanwhile), at most timeout seconds."""
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


async def until(pred, timeout: float = 30.0) -> None:
    """Wait, with the loop running, until pred() holds; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def next_signal(signal, pred=lambda *a: True) -> asyncio.Future:
    """A future resolved with the arguments of the next emission of signal matching pred."""
    fut = asyncio.get_event_loop().create_future()

    def on(*args):
        if pred(*args) and not fut.done():
            fut.set_result(args)
    signal.connect(on)
    fut.add_done_callback(lambda _: signal.disconnect(on))
    return fut


@contextlib.contextmanager
def desktops(loop, tmp: Path, roster: str, args: list[str], panel: str) -> Iterator[SimpleNamespace]:
    """A starter of desktop apps over one config file (holding roster) and one data dir in tmp, each started with
    args on the loop, its window at 900x600 showing panel (a restart is a quit and another start); the first one
    started. Every one still running is quit at the end."""
    from app.gui.main import Desktop
    from engine.config import load
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_DATA_HOME", str(tmp / "data"))  # the module's own chats.sqlite3
    cfg_path = tmp / "llamadesk.toml"
    cfg_path.write_text(roster)
    started: list[Desktop] = []

    def run_long(coro, timeout: float = 120):
        return run(loop, coro, timeout)

    def start() -> Desktop:
        desktop = Desktop(load(["--config", str(cfg_path), "--port", "0", *args, "--models-dir", str(tmp / "models")]))
        run_long(desktop.start())
        started.append(desktop)
        desktop.window.resize(900, 600)
        desktop.window.show_panel(panel)
        return desktop

    try:
        yield SimpleNamespace(run=run_long, start=start, first=start(), tmp=tmp)
    finally:
        for desktop in started:
            if desktop.host.service is not None:
                run_long(desktop.quit())
        patch.undo()
