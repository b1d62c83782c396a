"""The model catalog: browse, download (resumable, verified), cancel, serve, import; and any GGUF from Hugging
Face: search, a repo's files, pull (NDJSON progress as Ollama's pull streams it)."""
from __future__ import annotations

import json
import logging
from typing import Annotated

from aiohttp import web
from pydantic import Field

from engine.catalog.entries import CatalogError, default_catalog_path
from engine.errors import EngineError
from server.access import loopback_only
from server.errors import classify
from server.keys import SERVICE
from server.schemas import read_json
from server.shapes import NonEmpty, Shape, documents, parse

routes = web.RouteTableDef()
log = logging.getLogger("llamadesk.server")


def readable_catalog(svc) -> None:
    """Refuse a request that needs the catalog when its file cannot be used (unreadable, or an entry that
    breaks an invariant): a 500 naming the file and the problem, logged as one line; nothing else stops."""
    try:
        svc.catalog.entries()
    except CatalogError as e:
        path = svc.config.catalog_path or default_catalog_path()
        problem = str(e) if str(path) in str(e) else f"the catalog {path}: {e}"
        log.warning("catalog not usable: %s", problem)
        raise EngineError(f"{problem} (fix the file, or point catalog_path at another)") from None


class SearchQuery(Shape):
    """GET /models/search's query string."""

    q: str = Field(min_length=1, max_length=200, description="words to search GGUF repos for")
    limit: Annotated[int, Field(ge=1, le=100, strict=False)] = 20  # query values are strings: "20" is 20


class FilesQuery(Shape):
    """GET /models/files' query string."""

    repo: str = Field(min_length=1, max_length=300, description="a Hugging Face repo, owner/name")


class PullRequest(Shape):
    """POST /models/pull's body."""

    model: str = Field(min_length=1, max_length=400, description="repo, repo:QUANT or repo/file.gguf")
    stream: bool = Field(True, description="NDJSON progress lines (default), or one object when done")
    vision: bool = Field(False, description="also pull the repo's vision tower (mmproj)")


class EntryName(Shape):
    """POST /catalog/cancel's and /catalog/serve's body."""

    name: NonEmpty = Field(description="the catalog entry's name (GET /catalog lists them)")


class DownloadRequest(EntryName):
    """POST /catalog/download's body."""

    tower: NonEmpty | None = Field(None, description="one of the entry's towers (a vision tower, a voice) instead")


class ImportRequest(Shape):
    """POST /catalog/import's body."""

    path: NonEmpty = Field(description="a GGUF file on this machine")


@documents("GET", "/catalog", "The catalog: every entry with what is on disk, whether it fits, and its download")
@routes.get("/catalog")
async def catalog(request: web.Request) -> web.Response:
    readable_catalog(request.app[SERVICE])
    return web.json_response(request.app[SERVICE].catalog.listing())


@documents("POST", "/catalog/download", "Download a catalog entry (or one of its towers), resumable and verified",
           DownloadRequest)
@routes.post("/catalog/download")
@loopback_only
async def download(request: web.Request) -> web.Response:
    body = parse(DownloadRequest, await read_json(request), "catalog.download")
    readable_catalog(request.app[SERVICE])
    return web.json_response(request.app[SERVICE].catalog.download(body.name, body.tower), status=202)


@documents("POST", "/catalog/cancel", "Cancel a queued or running catalog download", EntryName)
@routes.post("/catalog/cancel")
@loopback_only
async def cancel(request: web.Request) -> web.Response:
    body = parse(EntryName, await read_json(request), "catalog.cancel")
    return web.json_response({"name": body.name, "cancelled": request.app[SERVICE].catalog.cancel(body.name)})


@documents("POST", "/catalog/serve", "Serve a downloaded catalog entry now (and at the next start)", EntryName)
@routes.post("/catalog/serve")
@loopback_only
async def serve(request: web.Request) -> web.Response:
    body = parse(EntryName, await read_json(request), "catalog.serve")
    readable_catalog(request.app[SERVICE])
    return web.json_response(await request.app[SERVICE].catalog.serve(body.name))


@documents("POST", "/catalog/import", "Copy a GGUF file from this machine into models_dir (the catalog lists it)", ImportRequest)
@routes.post("/catalog/import")
@loopback_only
async def import_gguf(request: web.Request) -> web.Response:
    body = parse(ImportRequest, await read_json(request), "catalog.import")
    return web.json_response(await request.app[SERVICE].catalog.import_gguf(body.path), status=201)


@documents("GET", "/models/search", "Search Hugging Face for GGUF repos (?q=words&limit=20), most downloaded first")
@routes.get("/models/search")
async def search_hub(request: web.Request) -> web.Response:
    query = parse(SearchQuery, dict(request.query), "models.search")
    return web.json_response(await request.app[SERVICE].catalog.search(query.q, query.limit))


@documents("GET", "/models/files", "A Hugging Face repo's GGUF models (?repo=owner/name) with quant, size and fit")
@routes.get("/models/files")
async def hub_files(request: web.Request) -> web.Response:
    query = parse(FilesQuery, dict(request.query), "models.files")
    return web.json_response(await request.app[SERVICE].catalog.files(query.repo))


def _line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


@documents("POST", "/models/pull", "Pull a GGUF from Hugging Face (repo, repo:QUANT or repo/file.gguf), verified "
           "against its sha256; NDJSON progress", PullRequest)
@routes.post("/models/pull")
@loopback_only
async def pull(request: web.Request) -> web.StreamResponse:
    """Errors found before any byte moves (a bad name, no such repo or quant, a gated repo without a token) are
    the response's status; a failure while downloading is the stream's last line, {"error": {...}}. The pull goes
    on if the client leaves (GET /catalog lists it under `pulls`)."""
    body = parse(PullRequest, await read_json(request), "models.pull")
    readable_catalog(request.app[SERVICE])  # before any byte moves: the pull is named against the catalog
    job = await request.app[SERVICE].catalog.pull(body.model, body.vision)
    if not body.stream:
        await job.wait()
        if job.error is not None:
            raise job.error
        return web.json_response({"status": "success", **job.summary()})
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    try:
        async for event in job.events():
            await resp.write(_line(event))
    except EngineError as e:
        await resp.write(_line(classify(e)[1]))
    await resp.write_eof()
    return resp
