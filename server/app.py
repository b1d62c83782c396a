"""The aiohttp application, embedded in a running loop with AppRunner/TCPSite (never run_app)."""
from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

from aiohttp import web

from engine.config import Config
from engine.errors import EngineError
from engine.service import Service
from server.access import Policy, access_middleware, check_exposure, guard_middleware
from server.errors import MAX_BODY_KEY, MAX_UPLOAD_KEY, error_middleware
from server.keys import CONFIG, LIFECYCLE, SERVICE
from server.routes import anthropic, audio, catalog, control, docs, ollama, openai, responses, utility
from server.routes import rerank
from server import remote

log = logging.getLogger("llamadesk.server")


class PortInUse(EngineError):
    """The configured port is taken by another process."""


def build_app(service: Service, config: Config, lifecycle=None) -> web.Application:
    """The application with every route, the error mapping and the body-size limit."""
    max_body = config.max_json_mb * 2**20
    max_upload = config.max_upload_mb * 2**20
    # remote_middleware last: after the access checks, inside the error mapping, just before the handlers
    middlewares = [guard_middleware(Policy.from_config(config)), error_middleware, remote.remote_middleware]
    if config.access_log:
        middlewares.insert(0, access_middleware)
    app = web.Application(client_max_size=max(max_body, max_upload), middlewares=middlewares)
    app[SERVICE] = service
    app[CONFIG] = config
    app[LIFECYCLE] = lifecycle
    app[MAX_BODY_KEY] = max_body
    app[MAX_UPLOAD_KEY] = max_upload
    app.add_routes(openai.routes)
    app.add_routes(control.routes)
    app.add_routes(catalog.routes)
    app.add_routes(audio.routes)
    app.add_routes(utility.routes)
    app.add_routes(ollama.routes)
    app.add_routes(anthropic.routes)
    app.add_routes(rerank.routes)
    responses.install(app)  # the routes, and the response store opened and closed with the app
    remote.install(app)  # the roster's remote models, their client session and health checks
    app.add_routes(docs.routes)
    return app


@dataclass
class Server:
    """A running HTTP server: its runner and the URL it listens on."""

    runner: web.AppRunner | None
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop listening and close open connections (a second call does nothing)."""
        runner, self.runner = self.runner, None
        if runner is not None:
            await runner.cleanup()


async def start_server(service: Service, config: Config, lifecycle=None) -> Server:
    """Serve the application on config.host:config.port in the running loop; lifecycle (the host)
    serves /restart and /shutdown."""
    if check_exposure(config):
        log.warning("serving on %s WITHOUT an API key (--insecure-no-key): anyone who can reach this machine "
                    "can use the server", config.host)
    app = build_app(service, config, lifecycle)
    # handler_cancellation: a client that goes away cancels its handler, which aborts its engine work.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {config.port} on {config.host} is in use; choose another with --port") from None
        raise PortInUse(f"cannot listen on {config.host}:{config.port}: {e.strerror}") from None
    port = site._server.sockets[0].getsockname()[1]  # the real port when config.port is 0
    return Server(runner, config.host, port)
