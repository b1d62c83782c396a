"""`llamadesk pull <repo>[:<quant>|/<file.gguf>]`: a GGUF from Hugging Face into models_dir, verified against the
sha256 the hub reports, without starting the server; a running server then serves it by name on demand.

Exit status: 0 when every file is on disk and verified, 1 when the pull failed (the reason on stderr), 2 for a
bad name or configuration. An interrupted pull keeps its partial file: the same command resumes it.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from engine.catalog import hub as hf
from engine.catalog.downloads import Downloader
from engine.catalog.entries import CatalogError, load_catalog
from engine.config import ConfigError, load
from engine.errors import EngineError, InvalidRequest


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llamadesk pull", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="repo (the quant that fits this machine), repo:QUANT, or repo/file.gguf")
    p.add_argument("--vision", action="store_true", help="also pull the repo's vision tower (mmproj)")
    p.add_argument("-c", "--config", help="the TOML config file (models_dir, hf_token)")
    p.add_argument("--models-dir", help="where to put the model (default: the config's models_dir)")
    return p


class Progress:
    """One line per step on stderr; on a terminal, the byte count redrawn in place."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self._step = -1  # the last tenth of a file reported off a terminal

    def show(self, event: dict) -> None:
        status = event["status"]
        if "completed" in event and event.get("total"):
            fraction = event["completed"] / event["total"]
            line = f"{status}: {_mb(event['completed'])} / {_mb(event['total'])} ({fraction:.0%})"
            if self.tty:
                self.stream.write("\r" + line.ljust(72))
            elif int(fraction * 10) != self._step:
                self._step = int(fraction * 10)
                self.stream.write(line + "\n")
        elif status != "success":
            self._step = -1
            self.stream.write(("\n" if self.tty else "") + status + (f" ({event['file']})" if "file" in event
                                                                     else "") + "\n")
        self.stream.flush()


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load((["--config", args.config] if args.config else [])
                      + (["--models-dir", args.models_dir] if args.models_dir else []) + ["--no-gui"])
        spec = hf.parse_spec(args.model)
    except ConfigError as e:
        print(f"llamadesk pull: error: {e}", file=sys.stderr)
        return 2
    except InvalidRequest as e:
        print(f"llamadesk pull: error: {e.message.replace(repr('model'), 'the model name')}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="llamadesk pull: %(message)s")
    progress = Progress()

    async def go() -> hf.Pull:
        jobs: list[hf.Pull] = []
        downloader = Downloader(config.models_dir(), on_change=lambda d: [j.on_change(d) for j in jobs])
        puller = hf.Puller(hf.Hub(token=hf.token_from(config.hf_token)), downloader, config.models_dir(),
                           config.ctx, config.streams, config.kv_dtype)
        try:
            jobs.append(await puller.start(spec, args.vision))
            async for event in jobs[0].events():
                progress.show(event)
            return jobs[0]
        finally:
            await downloader.close()  # an unfinished file keeps its .part for the next run

    try:
        job = asyncio.run(go())
    except EngineError as e:
        print(f"llamadesk pull: error: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nllamadesk pull: interrupted; the same command resumes the download", file=sys.stderr)
        return 130
    try:
        entries = load_catalog(Path(config.catalog_path).expanduser() if config.catalog_path else None)
    except CatalogError:
        entries = []  # a broken catalog file does not change what was pulled
    name = hf.served_name(job.path, config.models, entries)
    print(f"pulled {job.variant.repo} {job.variant.quant or job.variant.path} into {job.path} (sha256 verified); "
          f"a request for the model '{name}' serves it")
    return 0
