"""--no-gui: the same server on a plain asyncio loop. Never imports Qt."""
from __future__ import annotations

import asyncio
import logging
import signal

from engine.config import Config
from engine.errors import EngineError
from engine.service import Service
from server.app import start_server

log = logging.getLogger("llamadesk.app")


async def serve(config: Config, stop: asyncio.Event | None = None) -> int:
    """Load the models, serve until SIGINT/SIGTERM (or `stop`), then shut down in order."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    service = Service(config)
    log.info("loading %d model(s)", len(config.models))
    try:
        await asyncio.to_thread(service.load_models)
    except EngineError as e:
        log.error("%s", e.message)
        return 2
    if service.setup_mode:
        log.warning("no model configured: serving in setup mode (start with --model FILE.gguf)")
    service.start(loop)
    try:
        server = await start_server(service, config)
    except EngineError as e:
        log.error("%s", e.message)
        await service.stop()
        return 2
    log.info("serving the OpenAI API on %s/v1", server.url)
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # Windows, or not the main thread
            pass
    await stop.wait()
    log.info("shutting down: stopping the HTTP server")
    await server.stop()
    log.info("shutting down: aborting requests and freeing models")
    await service.stop()
    log.info("bye")
    return 0


def run(config: Config) -> int:
    """Run the headless server to completion; the process exit code."""
    return asyncio.run(serve(config))
