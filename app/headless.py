"""--no-gui: the same server on a plain asyncio loop. Never imports Qt."""
from __future__ import annotations

import asyncio
import logging
import signal

from app.host import Host
from engine.config import Config
from engine.errors import EngineError

log = logging.getLogger("llamadesk.app")


async def serve(config: Config, stop: asyncio.Event | None = None, argv: list[str] | None = None) -> int:
    """Load the models, serve until SIGINT/SIGTERM, POST /shutdown (or `stop`), then shut down in order."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    host = Host(config, argv, on_shutdown=stop.set)
    # before the models load: a SIGTERM meanwhile (systemd stopping a slow start) is a clean stop once they have
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
            pass
    try:
        await host.start()
    except EngineError as e:
        log.error("%s", e.message)
        return 2
    if stop.is_set():
        log.info("stopping: asked to while the models loaded")
    await stop.wait()
    await host.stop(drain_s=5.0)
    log.info("bye")
    return 0


def run(config: Config, argv: list[str] | None = None) -> int:
    """Run the headless server to completion; the process exit code."""
    return asyncio.run(serve(config, argv=argv))
