"""llama-server's utility routes on the same models: /tokenize, /detokenize, /apply-template, /infill, and
OpenAI's /v1/chat/completions/input_tokens."""
from __future__ import annotations

import asyncio
import io
import json
from typing import Annotated

from aiohttp import web
from pydantic import Field

from engine.errors import EngineError
from server import schemas, sse
from server.errors import sse_error_event
from server.keys import SERVICE
from server.schemas import read_json
from server.shapes import Shape, documents, parse

routes = web.RouteTableDef()


class TokenizeRequest(Shape):
    """POST /tokenize (llama-server's fields and defaults)."""

    content: str = ""
    add_special: bool = False  # the model's BOS/EOS markers around the text
    parse_special: bool = True  # special-token text (<|im_start|>) as its token, not as characters
    with_pieces: bool = False  # each token with its text
    model: str | None = None


class DetokenizeRequest(Shape):
    """POST /detokenize."""

    tokens: list[int] = []
    model: str | None = None


class ExtraChunk(Shape):
    """Context from another file for /infill (llama-server's input_extra entries)."""

    text: str = ""
    filename: str = "tmp"


class InfillRequest(schemas.Sampling):
    """POST /infill: llama-server's fill-in-the-middle fields, and the sampling fields."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = []  # before the prefix: other files' text, each after its filename
    prompt: str = ""  # what the middle starts with
    n_predict: Annotated[int, Field(ge=1)] | None = None  # llama-server's max_tokens
    stream: bool = False
    model: str | None = None


@documents("POST", "/tokenize", "A text as the model's token ids (llama-server's /tokenize)", TokenizeRequest)
@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.Response:
    """{content, add_special?, parse_special?, with_pieces?, model?} -> {tokens: [id] or [{id, piece}]}."""
    body = parse(TokenizeRequest, await read_json(request), "tokenize")
    toks = await request.app[SERVICE].generator.tokenize(body.model, body.content, body.add_special,
                                                         body.parse_special, body.with_pieces)
    # a long text's ids (and pieces) serialize for longer than the loop may stall; sent from a stream, as
    # aiohttp wants a large body
    data = await asyncio.to_thread(lambda: json.dumps({"tokens": toks}).encode())
    return web.Response(body=io.BytesIO(data), content_type="application/json")


@documents("POST", "/detokenize", "Token ids as text (llama-server's /detokenize)", DetokenizeRequest)
@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.Response:
    """{tokens: [id], model?} -> {content}."""
    body = parse(DetokenizeRequest, await read_json(request), "detokenize")
    return web.json_response({"content": await request.app[SERVICE].generator.detokenize(body.model, body.tokens)})


@documents("POST", "/apply-template", "The prompt a chat completion body renders to (llama-server's /apply-template)",
           schemas.ChatCompletionRequest)
@routes.post("/apply-template")
async def apply_template(request: web.Request) -> web.Response:
    """A chat completion body -> {prompt}: what the model's chat template makes of it."""
    req, _ = schemas.chat_request(await read_json(request))
    return web.json_response({"prompt": await request.app[SERVICE].generator.apply_template(req)})


@documents("POST", "/v1/chat/completions/input_tokens",
           "The prompt tokens a chat completion body would prefill, not generated", schemas.ChatCompletionRequest)
@routes.post("/v1/chat/completions/input_tokens")
async def chat_input_tokens(request: web.Request) -> web.Response:
    """A chat completion body -> {object, input_tokens}: its prompt (template, tools, output format) counted."""
    req, _ = schemas.chat_request(await read_json(request))
    return web.json_response({"object": "chat.completion.input_tokens",
                              "input_tokens": await request.app[SERVICE].generator.count_tokens(req)})


@documents("POST", "/infill", "Fill in the middle between a prefix and a suffix (llama-server's /infill)",
           InfillRequest)
@routes.post("/infill")
async def infill(request: web.Request) -> web.StreamResponse:
    """llama-server's fill-in-the-middle: {input_prefix, input_suffix, input_extra?, prompt?, n_predict |
    max_tokens, sampling, stream?, model?} -> {content, stop, finish_reason, tokens_predicted, tokens_evaluated, timings}."""
    body = parse(InfillRequest, await read_json(request), "infill")
    sampling = body.sampling()
    if body.n_predict is not None and sampling.max_tokens is None:
        sampling.max_tokens = body.n_predict
    svc = request.app[SERVICE]
    gen, = await svc.generator.infill(body.model, body.input_prefix, body.input_suffix, body.prompt, sampling,
                                      extra=[(c.filename, c.text) for c in body.input_extra])

    def ending() -> dict:
        u = gen.usage
        return {"content": "", "model": gen.model, "stop": True, "finish_reason": gen.finish_reason,
                "tokens_predicted": u.get("completion_tokens", 0), "tokens_evaluated": u.get("prompt_tokens", 0),
                "timings": u.get("timings", {})}
    if not body.stream:
        try:
            text = await gen.text()
        finally:
            gen.cancel()
        return web.json_response({**ending(), "content": text})
    resp = await sse.open_stream(request)
    try:
        async for text in gen.chunks():
            await resp.write(sse.event({"content": text, "stop": False}))
        await resp.write(sse.event(ending()))
    except EngineError as e:
        await resp.write(sse_error_event(e))
    finally:
        gen.cancel()
    await resp.write_eof()
    return resp
