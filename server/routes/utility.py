"""llama-server's utility routes on the same models: /tokenize, /detokenize, /apply-template, /infill."""
from __future__ import annotations

from aiohttp import web

from engine.errors import EngineError, InvalidRequest
from server import schemas, sse
from server.errors import sse_error_event
from server.keys import SERVICE
from server.schemas import Fields, read_json

routes = web.RouteTableDef()


@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.Response:
    """{content, add_special?, parse_special?, with_pieces?, model?} -> {tokens: [id] or [{id, piece}]}."""
    f = Fields(await read_json(request), "tokenize")
    text = f.get("content", str, "")
    add_special = f.get("add_special", bool, False)
    parse_special = f.get("parse_special", bool, True)
    with_pieces = f.get("with_pieces", bool, False)
    model = f.get("model", str)
    f.log_ignored()
    m, toks = await request.app[SERVICE].generator.tokenize(model, text, add_special, parse_special)
    if not with_pieces:
        return web.json_response({"tokens": toks})
    out = []
    for t in toks:
        b = m.model.piece(t, special=True)
        try:
            piece: str | list[int] = b.decode("utf-8")
        except UnicodeDecodeError:  # part of a multi-byte character: its bytes, as llama-server sends them
            piece = list(b)
        out.append({"id": t, "piece": piece})
    return web.json_response({"tokens": out})


@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.Response:
    """{tokens: [id], model?} -> {content}."""
    f = Fields(await read_json(request), "detokenize")
    tokens = f.get("tokens", list, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise InvalidRequest("'tokens' must be an array of token ids", "tokens")
    model = f.get("model", str)
    f.log_ignored()
    return web.json_response({"content": await request.app[SERVICE].generator.detokenize(model, tokens)})


@routes.post("/apply-template")
async def apply_template(request: web.Request) -> web.Response:
    """A chat completion body -> {prompt}: what the model's chat template makes of it."""
    req, _ = schemas.chat_request(await read_json(request))
    return web.json_response({"prompt": await request.app[SERVICE].generator.apply_template(req)})


@routes.post("/infill")
async def infill(request: web.Request) -> web.StreamResponse:
    """llama-server's fill-in-the-middle: {input_prefix, input_suffix, prompt?, n_predict | max_tokens, sampling,
    stream?, model?} -> {content, stop, finish_reason, tokens_predicted, tokens_evaluated, timings}."""
    f = Fields(await read_json(request), "infill")
    prefix = f.get("input_prefix", str, "")
    suffix = f.get("input_suffix", str, "")
    prompt = f.get("prompt", str, "")
    n_predict = f.get("n_predict", int, lo=1)
    stream = f.get("stream", bool, False)
    model = f.get("model", str)
    sampling = schemas.sampling_params(f)
    if n_predict is not None and sampling.max_tokens is None:
        sampling.max_tokens = n_predict
    f.log_ignored()
    svc = request.app[SERVICE]
    gen, = await svc.generator.infill(model, prefix, suffix, prompt, sampling)

    def ending() -> dict:
        u = gen.usage
        return {"content": "", "model": gen.model, "stop": True, "finish_reason": gen.finish_reason,
                "tokens_predicted": u.get("completion_tokens", 0), "tokens_evaluated": u.get("prompt_tokens", 0),
                "timings": u.get("timings", {})}
    if not stream:
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
