"""The aiohttp application, embedded in a running loop with AppRunner/TCPSite (never run_app)."""
from __future__ import annotations

import errno
import hmac
import logging
from dataclasses import dataclass

from aiohttp import web

from engine.config import Config
from engine.errors import EngineError
from engine.service import Service
from server.errors import MAX_BODY_KEY, MAX_UPLOAD_KEY, error_middleware, json_error
from server.keys import CONFIG, LIFECYCLE, SERVICE
from server.routes import audio, catalog, control, openai

log = logging.getLogger("llamadesk.server")


class PortInUse(EngineError):
    """The configured port is taken by another process."""


def _auth_middleware(api_key: str):
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def auth(request: web.Request, handler):
        got = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(got, expected):
            return json_error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                              "authentication_error", None, "invalid_api_key")
        return await handler(request)
    return auth


def _cors_middleware(origins: set[str]):
    """Browser clients from the allowed origins may call the API (preflight answered here)."""
    any_origin = "*" in origins

    @web.middleware
    async def cors(request: web.Request, handler):
        origin = request.headers.get("Origin")
        allowed = origin is not None and (any_origin or origin in origins)
        if request.method == "OPTIONS" and allowed and "Access-Control-Request-Method" in request.headers:
            resp = web.Response(status=204)
            resp.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            resp.headers["Access-Control-Allow-Headers"] = request.headers.get(
                "Access-Control-Request-Headers", "Authorization, Content-Type")
            resp.headers["Access-Control-Max-Age"] = "600"
        else:
            resp = await handler(request)
        if allowed:
            resp.headers["Access-Control-Allow-Origin"] = origin
            resp.headers["Vary"] = "Origin"
        return resp
    return cors


def build_app(service: Service, config: Config, lifecycle=None) -> web.Application:
    """The application with every route, the error mapping and the body-size limit."""
    max_body = config.max_json_mb * 2**20
    max_upload = config.max_upload_mb * 2**20
    middlewares = [error_middleware]
    if config.cors_origins:
        middlewares.insert(0, _cors_middleware({o.strip() for o in config.cors_origins.split(",") if o.strip()}))
    if config.api_key:
        middlewares.append(_auth_middleware(config.api_key))
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
    return app


@dataclass
class Server:
    """A running HTTP server: its runner and the URL it listens on."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        await self.runner.cleanup()


async def start_server(service: Service, config: Config, lifecycle=None) -> Server:
    """Serve the application on config.host:config.port in the running loop; lifecycle (the host)
    serves /restart and /shutdown."""
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
