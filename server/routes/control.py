"""llamadesk's own routes: health and what the engine is doing."""
from __future__ import annotations

from aiohttp import web

from engine.service import VERSION
from server.keys import SERVICE

routes = web.RouteTableDef()


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": request.app[SERVICE].status, "version": VERSION})


@routes.get("/v1/stats")
async def stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].stats())


@routes.get("/v1/streams")
async def streams(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].streams())
