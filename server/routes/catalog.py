"""The model catalog: browse, download (resumable, verified), cancel, serve, import."""
from __future__ import annotations

from aiohttp import web

from server.access import loopback_only
from server.keys import SERVICE
from server.schemas import Fields, read_json

routes = web.RouteTableDef()


async def _name(request: web.Request, route: str, *extra: str) -> tuple[str, dict]:
    f = Fields(await read_json(request), route)
    name = f.require("name", str, "the catalog entry's name")
    values = {k: f.get(k, str) for k in extra}
    f.log_ignored()
    return name, values


@routes.get("/catalog")
async def catalog(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].catalog.listing())


@routes.post("/catalog/download")
@loopback_only
async def download(request: web.Request) -> web.Response:
    name, extra = await _name(request, "catalog.download", "tower")
    return web.json_response(request.app[SERVICE].catalog.download(name, extra["tower"]), status=202)


@routes.post("/catalog/cancel")
@loopback_only
async def cancel(request: web.Request) -> web.Response:
    name, _ = await _name(request, "catalog.cancel")
    return web.json_response({"name": name, "cancelled": request.app[SERVICE].catalog.cancel(name)})


@routes.post("/catalog/serve")
@loopback_only
async def serve(request: web.Request) -> web.Response:
    name, _ = await _name(request, "catalog.serve")
    return web.json_response(await request.app[SERVICE].catalog.serve(name))


@routes.post("/catalog/import")
@loopback_only
async def import_gguf(request: web.Request) -> web.Response:
    f = Fields(await read_json(request), "catalog.import")
    path = f.require("path", str, "a GGUF file on this machine")
    return web.json_response(await request.app[SERVICE].catalog.import_gguf(path), status=201)
