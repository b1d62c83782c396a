"""The serving host shared by the desktop app and --no-gui: the engine facade plus the HTTP
server, with pause/resume and an in-process reload. Never imports Qt."""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Callable

from engine.config import Config
from engine.service import Service
from server.access import check_exposure
from server.app import PortInUse, Server, start_server

log = logging.getLogger("llamadesk.app")


class Host:
    """Owns the Service and the Server for one configuration."""

    def __init__(self, config: Config, argv: list[str] | None = None,
                 on_shutdown: Callable[[], None] | None = None):
        self.config = config
        self.argv = argv  # the flags it started with: /restart reads the config again with them
        self.on_shutdown = on_shutdown
        self.on_reload: Callable[[], None] | None = None  # the desktop refreshes its panels
        self.service: Service | None = None
        self.server: Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()  # one stop or reload at a time
        self.closing = False  # stop() was asked for: no reload may start the server again

    @property
    def url(self) -> str | None:
        return self.server.url if self.server else None

    @property
    def serving(self) -> bool:
        return self.server is not None

    async def start(self, paused_if_taken: bool = False) -> str | None:
        """Load the configured models (off the loop), start the scheduler, then listen. With paused_if_taken (the
        desktop), a port another program holds leaves the engine running, not listening, and returns why
        (Serving listens again, say on another port); else PortInUse."""
        check_exposure(self.config)  # InsecureBind before any model loads
        service = Service(self.config)
        log.info("loading %d model(s)", len(self.config.models))
        await asyncio.to_thread(service.load_models)  # EngineError (e.g. a bad GGUF) propagates
        await asyncio.to_thread(service.load_speech)  # speech models degrade instead (logged, routes explain)
        if service.setup_mode:
            log.warning("no model configured: serving in setup mode (download one from the catalog)")
        service.start(asyncio.get_running_loop())
        self.service = service
        taken = None
        try:
            self.server = await start_server(service, self.config, self)
        except BaseException as e:
            if not (paused_if_taken and isinstance(e, PortInUse)):
                await service.stop()
                self.service = None
                raise
            taken = e.message
            log.error("%s: not serving until Serving is pressed (the models are loaded)", taken)
        if self.server is not None:
            log.info("serving the OpenAI API on %s/v1", self.server.url)
        # What exists now (models, the app's windows, libraries) lives as long as the process: keep
        # it out of the cyclic GC's full collections, which otherwise stall the shared event loop
        # (window and HTTP replies) for 60-100 ms under load (measured by tests/bench/bench_gui_lag.py).
        gc.collect()
        gc.freeze()
        return taken

    async def pause(self) -> None:
        """Stop listening; models stay loaded."""
        if self.server:
            await self.server.stop()
            self.server = None
            log.info("serving paused")

    async def resume(self) -> None:
        """Listen again on the configured address."""
        if self.server is None and self.service is not None:
            self.server = await start_server(self.service, self.config, self)
            log.info("serving resumed on %s/v1", self.server.url)

    async def stop(self, drain_s: float = 0.0) -> None:
        """Let running streams finish for up to drain_s, then stop listening and free the models. Waits for
        a reload in progress (/restart then /shutdown back to back) and cancels any later one."""
        self.closing = True
        async with self._lock:
            await self._stop(drain_s)

    async def _stop(self, drain_s: float) -> None:
        if self.service and drain_s > 0:
            deadline = time.monotonic() + drain_s
            while time.monotonic() < deadline and self.service.stats()["active_streams"]:
                await asyncio.sleep(0.05)
        log.info("shutting down: stopping the HTTP server")
        if self.server:
            await self.server.stop()
            self.server = None
        if self.service:
            log.info("shutting down: aborting requests and freeing models")
            await self.service.stop()
            self.service = None

    async def reload(self, config: Config, drain_s: float = 0.0) -> None:
        """Apply a new configuration in process: stop everything, start again (no process restart).
        A port of 0 ("any free port") keeps the port already bound, so clients find the server again."""
        check_exposure(config)  # a configuration that may not serve leaves the running one up
        async with self._lock:
            if self.closing:
                log.info("not reloading: the server is shutting down")
                return
            if config.port == 0 and self.server is not None:
                config.values["port"] = self.server.port
            await self._stop(drain_s)
            self.config = config
            await self.start()
        if self.on_reload is not None:
            self.on_reload()

    # ---- the server's /restart and /shutdown ------------------------------------------------------

    def request_restart(self) -> None:
        """Reload the config file (with the same flags) and models, after the current response."""
        from engine.config import load

        async def go() -> None:
            await asyncio.sleep(0.05)  # let the 202 leave first
            try:
                config = load(self.argv) if self.argv is not None else self.config
                await self.reload(config, drain_s=5.0)
            except Exception:
                log.exception("restart failed")
        self._spawn(go())

    def request_shutdown(self) -> None:
        """Ask whoever runs the host to quit (headless: exit; desktop: Quit)."""
        if self.on_shutdown is not None:
            asyncio.get_running_loop().call_later(0.05, self.on_shutdown)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
