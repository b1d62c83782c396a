"""`llamadesk`: the desktop app, or with --no-gui (or no display) the headless server."""
from __future__ import annotations

import logging
import os
import sys
from typing import Callable

from app import qtprobe
from engine.config import Config, ConfigError, load

log = logging.getLogger("llamadesk.app")


def has_display() -> bool:
    """Whether a GUI could open a window here."""
    if sys.platform in ("win32", "darwin"):
        return True
    # QT_QPA_PLATFORM names a Qt platform explicitly (e.g. offscreen, vnc): the user wants the window.
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("QT_QPA_PLATFORM"))


def main(argv: list[str] | None = None, starter: Callable[[Config], Config | None] | None = None) -> int:
    """Parse the configuration and run; returns the exit code (2 for bad configuration or models). `make run`
    passes starter (app/starter.py): once logging is set up, it may put the starter set in the configuration."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from app import bench_cli
        return bench_cli.main(argv[1:])
    if argv[:1] == ["pull"]:
        from app import pull_cli
        return pull_cli.main(argv[1:])
    if argv[:1] == ["rpc-server"]:  # llama.cpp's rpc-server, for a model another llamadesk serves with --rpc
        from app import rpc_server
        return rpc_server.main(argv[1:])
    if argv[:1] == [qtprobe.PROBE_COMMAND]:
        return qtprobe.run_probe()
    if argv[:1] in (["--install-desktop"], ["--uninstall-desktop"]):  # a user-scope desktop entry (XDG)
        from app import desktop_entry
        return desktop_entry.run(remove=argv[0] == "--uninstall-desktop")
    if argv[:1] == ["probe-cpu"] and len(argv) == 3:  # a bundle's CPU-variant probe child (engine/backends.py)
        from engine import backends
        return backends.probe_child(argv[1], argv[2])
    try:
        config = load(argv)
    except ConfigError as e:
        print(f"llamadesk: error: {e}", file=sys.stderr)
        return 2
    from server.access import InsecureBind, check_exposure
    try:
        check_exposure(config)  # before any model loads: serving on the network needs a key
    except InsecureBind as e:
        print(f"llamadesk: error: {e.message}", file=sys.stderr)
        return 2
    from app import logs
    logfile = logs.setup(config.log_level)
    if logfile:
        log.info("logging to %s", logfile)
    if starter is not None and (with_starter := starter(config)) is not None:
        config, argv = with_starter, None  # no flags to re-read: a /restart serves the same starter set
    if not config.no_gui:
        if not has_display():
            log.info("no display found: running headless (the same as --no-gui)")
        elif (problem := qtprobe.probe()) is not None:
            print(problem.line(), file=sys.stderr, flush=True)
        else:
            from app.gui.main import run_gui  # the only path that imports Qt
            return run_gui(config, argv)
    from app import headless
    return headless.run(config, argv)


if __name__ == "__main__":
    sys.exit(main())
