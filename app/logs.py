"""Logging to stderr and to a file in the user log dir."""
from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

import platformdirs

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup(level: str) -> Path | None:
    """Configure the root logger; return the log file's path (None if it cannot be written)."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    stderr = logging.StreamHandler()
    stderr.setFormatter(logging.Formatter(FORMAT, "%H:%M:%S"))
    root.addHandler(stderr)
    # llama.cpp narrates every load at info level; keep its warnings and errors only.
    logging.getLogger("llamadesk.llama").setLevel(max(logging.getLevelName(level.upper()), logging.WARNING)
                                                  if level != "debug" else logging.DEBUG)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    path = Path(platformdirs.user_log_dir("llamadesk")) / "llamadesk.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.handlers.RotatingFileHandler(path, maxBytes=5 * 2**20, backupCount=2, encoding="utf-8")
    except OSError:
        return None
    fh.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(fh)
    return path
