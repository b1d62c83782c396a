"""OpenAI routes: models, chat completions, completions, embeddings."""
from __future__ import annotations

import base64
import time

import numpy as np
from aiohttp import web

from engine.errors import EngineError, ModelNotFound
from engine.service import Generation
from server import schemas, sse
from server.errors import sse_error_event
from server.keys import SERVICE

routes = web.RouteTableDef()


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": request.app[SERVICE].models()})


@routes.get("/v1/models/{id}")
async def get_model(request: web.Request) -> web.Response:
    mid = request.match_info["id"]
    for m in request.app[SERVICE].models():
        if m["id"] == mid:
            return web.json_response(m)
    raise ModelNotFound(f"The model '{mid}' does not exist", "model")


def _usage(gen: Generation) -> dict:
    u = gen.usage
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"],
            "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
            "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]}}


async def _stream(request: web.Request, gen: Generation, opts: schemas.StreamOptions, chunk, wrap,
                  first: dict | None) -> web.StreamResponse:
    """Send gen as SSE. chunk(payload, finish_reason) builds an event object, wrap(text) the
    payload that carries text (a chat delta or a completion's text); first, if any, leads."""
    resp = await sse.open_stream(request)
    delta = sse.TextEvent(chunk(wrap(sse.MARK), None))
    try:
        if first is not None:
            await resp.write(sse.event(first))
        async for text in gen.chunks():
            await resp.write(delta.render(text))
        await resp.write(sse.event(chunk(wrap(None), gen.finish_reason)))
        if opts.include_usage:
            last = chunk(wrap(None), None)
            last["choices"] = []
            last["usage"] = _usage(gen)
            await resp.write(sse.event(last))
    except EngineError as e:
        await resp.write(sse_error_event(e))
    finally:
        gen.cancel()  # no-op when finished; evicts the stream when the client went away
    await resp.write(sse.DONE)
    await resp.write_eof()
    return resp


def _body(gen: Generation, cid: str, obj: str, choice: dict) -> dict:
    """The OpenAI envelope around one choice (a chunk or a whole response)."""
    return {"id": cid, "object": obj, "created": gen.created, "model": gen.model, "system_fingerprint": None,
            "choices": [{"index": 0, **choice, "logprobs": None}]}


async def _collect(gen: Generation) -> str:
    """The whole text of a buffered request; its stream is aborted if the client goes away."""
    try:
        return await gen.text()
    finally:
        gen.cancel()


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    req, opts = schemas.chat_request(await schemas.read_json(request))
    gen = await request.app[SERVICE].chat(req)
    cid = f"chatcmpl-{gen.id}"
    if opts.stream:
        def chunk(delta: dict, finish: str | None) -> dict:
            return _body(gen, cid, "chat.completion.chunk", {"delta": delta, "finish_reason": finish})
        return await _stream(request, gen, opts, chunk, lambda t: {} if t is None else {"content": t},
                             chunk({"role": "assistant", "content": ""}, None))
    text = await _collect(gen)
    message = {"role": "assistant", "content": text}
    return web.json_response({**_body(gen, cid, "chat.completion", {"message": message,
                                                                     "finish_reason": gen.finish_reason}),
                              "usage": _usage(gen)})


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    req, opts = schemas.completion_request(await schemas.read_json(request))
    gen = await request.app[SERVICE].complete(req)
    cid = f"cmpl-{gen.id}"
    prefix = req.prompt if req.echo and isinstance(req.prompt, str) else ""
    if opts.stream:
        def chunk(text: str, finish: str | None) -> dict:
            return _body(gen, cid, "text_completion", {"text": text, "finish_reason": finish})
        return await _stream(request, gen, opts, chunk, lambda t: t or "", chunk(prefix, None) if prefix else None)
    text = prefix + await _collect(gen)
    return web.json_response({**_body(gen, cid, "text_completion", {"text": text, "finish_reason": gen.finish_reason}),
                              "usage": _usage(gen)})


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    model, inputs, fmt = schemas.embedding_request(await schemas.read_json(request))
    model_id, vectors, n_tokens = await request.app[SERVICE].embed(model, inputs)
    data = []
    for i, v in enumerate(vectors):
        emb = base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() if fmt == "base64" else \
            [float(x) for x in v]
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return web.json_response({"object": "list", "data": data, "model": model_id,
                              "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                              "created": int(time.time())})
