"""`make run`: llamadesk, serving the starter set when nothing else is configured.

With no flags and no model in the config file, it serves SmolLM2-135M-Instruct (chat), all-MiniLM-L6-v2
(embeddings), whisper tiny.en (speech to text) and the Piper voice en_US joe (text to speech), made once from PyPI
wheels (app/pypi_models.py, no model hub needed) into <user cache dir>/starter. With flags, or a model in the
config file, it runs exactly what `llamadesk` runs. Whether a model is configured is what engine/config.py's
`load` says, so a TOML roster or `-m` always wins.

LLAMADESK_STARTER_SOURCE names a folder already holding the set's files by the same names (the test assets):
they are linked or copied from there instead of made.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import platformdirs

from app import pypi_models
from app.main import main as run_llamadesk
from engine.config import APP_NAME, Config, ModelEntry

log = logging.getLogger("llamadesk.starter")

CHAT, EMBEDDINGS = "smollm2-135m-instruct", "all-minilm-l6-v2"  # the names requests use
PARTS = (pypi_models.SMOLLM2, pypi_models.MINILM, pypi_models.WHISPER, pypi_models.PIPER)
MARKER = "starter.json"  # what a finished preparation made: each part's files and sizes
SOURCE_ENV = "LLAMADESK_STARTER_SOURCE"


def starter_dir() -> Path:
    """Where the starter set lives: <user cache dir>/starter (on Linux $XDG_CACHE_HOME/llamadesk/starter)."""
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "starter"


def _files(path: Path) -> dict[str, int]:
    """Each file of a part (the part itself when it is one file) with its size."""
    if not path.exists():
        return {}
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {p.relative_to(path.parent).as_posix(): p.stat().st_size for p in files}


def _recorded(dest: Path) -> dict[str, dict[str, int]]:
    try:
        return json.loads((dest / MARKER).read_text())["parts"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def is_ready(dest: Path) -> bool:
    """Whether dest holds every part as the last preparation left it (sizes: hashing its 350 MB at every start
    would cost seconds)."""
    recorded = _recorded(dest)
    return all(p.name in recorded and _files(dest / p.name) == recorded[p.name] for p in PARTS)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(src, dst)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _from_source(src: Path) -> Callable[[Path], None]:
    """A maker that takes a part already made elsewhere (linked where the file system allows)."""
    def make(tmp: Path) -> None:
        _remove(tmp)  # what an interrupted copy left
        if src.is_dir():
            shutil.copytree(src, tmp, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(src), str(tmp))
    return make


def prepare(dest: Path, source: Path | None = None) -> bool:
    """Make every part of the set in dest, unless the last preparation's are all there; True when it made any.
    A part that changed since (a truncated file, a deleted one) is made again; the wheels are deleted after."""
    if is_ready(dest):
        return False
    log.info("starter set: preparing it once from PyPI wheels (a minute or so; later starts reuse it)")
    logging.getLogger("gguf").setLevel(logging.WARNING)  # its writer narrates every file it writes
    t0 = time.monotonic()
    recorded, wheels = _recorded(dest), dest / "_wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        target = dest / part.name
        if part.name in recorded and _files(target) != recorded[part.name]:
            log.warning("starter set: %s changed since it was prepared: making it again", target)
            _remove(target)
        if source is not None and (source / part.name).exists():
            pypi_models.atomic(target, _from_source(source / part.name), log.info)
        else:
            part.prepare(dest, wheels, log.info)
    shutil.rmtree(wheels, ignore_errors=True)  # ~300 MB only needed to make the set
    marker = {"parts": {p.name: _files(dest / p.name) for p in PARTS}, "prepared_s": round(time.monotonic() - t0, 1)}
    (dest / MARKER).write_text(json.dumps(marker, indent=1))
    log.info("starter set: prepared in %.0f s", marker["prepared_s"])
    return True


def with_starter(config: Config, dest: Path) -> Config:
    """config serving the starter set in dest: chat and embeddings in the roster, speech models where config has
    none of its own."""
    values, sources = dict(config.values), dict(config.sources)
    for key, part in (("asr", pypi_models.WHISPER), ("tts", pypi_models.PIPER)):
        if not values.get(key):
            values[key], sources[key] = str(dest / part.name), "starter"
    models = [ModelEntry(name=CHAT, path=str(dest / pypi_models.SMOLLM2.name), default=True),
              ModelEntry(name=EMBEDDINGS, path=str(dest / pypi_models.MINILM.name))]
    return dataclasses.replace(config, values=values, sources=sources, models=models)


def _announce(dest: Path, config: Config) -> None:
    log.info("starter set: no model is configured, so llamadesk serves its starter set from %s", dest)
    log.info("starter set: chat %s (SmolLM2-135M-Instruct), embeddings %s (all-MiniLM-L6-v2), speech to text %s, "
             "text to speech %s", CHAT, EMBEDDINGS,
             "whisper tiny.en" if config.sources["asr"] == "starter" else f"{config.asr} (configured)",
             "Piper en_US joe" if config.sources["tts"] == "starter" else f"{config.tts} (configured)")
    log.info('starter set: to serve your own model: make run ARGS="-m path/to/model.gguf", download one in the '
             "Catalog panel, or .venv/bin/llamadesk pull hf.co/<owner>/<repo>")


def serve_starter(config: Config, dest: Path | None = None, source: Path | None = None) -> Config | None:
    """config with the starter set in it (prepared first) when config serves no model; None to run config as it
    is: a model is configured, or the set could not be prepared (then it starts in setup mode, as before)."""
    if config.models:
        return None
    dest = dest or starter_dir()
    starter = with_starter(config, dest)
    _announce(dest, starter)
    try:
        prepare(dest, source)
    except Exception:  # pip offline, a full disk, a broken wheel: the app still starts, in setup mode
        log.exception("starter set: could not prepare it; starting without it (setup mode)")
        return None
    return starter


def main(argv: list[str] | None = None) -> int:
    """`make run [ARGS=…]`: with flags exactly `llamadesk ARGS`; without, the same, with the starter set when no
    model is configured."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        return run_llamadesk(argv)
    source = os.environ.get(SOURCE_ENV)
    return run_llamadesk([], starter=lambda config: serve_starter(config, source=Path(source) if source else None))


if __name__ == "__main__":
    sys.exit(main())
