"""GET /openapi.json: the OpenAPI 3.1 document of every route the application serves, generated from the router
(what is served) and the pydantic request shapes the routes registered with server.shapes.documents (what they
read): a JSON body, or for the uploads a multipart form whose file is a binary string."""
from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic.json_schema import models_json_schema

from engine.system import VERSION
from server.shapes import DOCUMENTED

routes = web.RouteTableDef()

_UPLOADS = {"/v1/audio/transcriptions", "/v1/audio/translations", "/vad"}  # multipart/form-data bodies
_OPEN = {"/health"}  # the one route the API key does not guard


def openapi(app: web.Application) -> dict[str, Any]:
    """The document for app's router."""
    shapes = sorted({s for s, _ in DOCUMENTED.values() if s is not None}, key=lambda s: s.__name__)
    refs, defs = models_json_schema([(s, "validation") for s in shapes], ref_template="#/components/schemas/{model}")
    paths: dict[str, dict] = {}
    for route in app.router.routes():
        method = route.method.upper()
        if method in ("HEAD", "*") or route.resource is None:
            continue
        path = route.resource.canonical
        shape, summary = DOCUMENTED.get((method, path), (None, _first_line(route.handler.__doc__)))
        op: dict[str, Any] = {"summary": summary or f"{method} {path}", "operationId": _operation_id(method, path),
                              "tags": [_tag(path)], "responses": _responses()}
        if path in _OPEN:
            op["security"] = []
        params = re.findall(r"{(\w+)}", path)
        if params:
            op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                                for p in params]
        if method in ("POST", "PUT", "PATCH") or (method == "DELETE" and shape is not None):  # Ollama's delete
            op["requestBody"] = _body(path, refs.get((shape, "validation")) if shape else None)
        paths.setdefault(path, {})[method.lower()] = op
    return {"openapi": "3.1.0",
            "info": {"title": "llamadesk", "version": VERSION,
                     "description": "A local server for language, embedding and speech models: the OpenAI, "
                                    "Anthropic, Ollama and llama-server protocols on one engine."},
            "paths": dict(sorted(paths.items())),
            "components": {"schemas": defs.get("$defs", {}),
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                               "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}},
            "security": [{"bearer": []}, {"apiKey": []}]}


def _body(path: str, schema: dict | None) -> dict:
    media = "multipart/form-data" if path in _UPLOADS else "application/json"
    return {"required": schema is not None or path in _UPLOADS,
            "content": {media: {"schema": schema or {"type": "object"}}}}


def _responses() -> dict:
    error = {"description": "an error in the route's protocol shape, naming the problem",
             "content": {"application/json": {"schema": {"type": "object"}}}}
    return {"200": {"description": "success"}, "400": error, "401": error, "403": error, "404": error,
            "503": error}


def _first_line(doc: str | None) -> str:
    return doc.strip().splitlines()[0].rstrip(".") if doc and doc.strip() else ""


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}") for w in path.strip("/").replace("-", "_").replace(".", "_").split("/") if w]
    return "_".join([method.lower(), *words]) or method.lower()


def _tag(path: str) -> str:
    if path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/audio") or path == "/vad":
        return "audio"
    if path.startswith(("/v1/chat", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/responses")):
        return "openai"
    return "llamadesk"


@routes.get("/openapi.json")
async def openapi_json(request: web.Request) -> web.Response:
    """This document"""
    return web.json_response(openapi(request.app))
