"""OpenAI routes: models, chat completions, completions, embeddings."""
from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, AsyncIterator

import numpy as np
from aiohttp import web

from engine.errors import EngineError, ModelNotFound
from engine.core.generation import Generation
from engine.models.loaded import LoadedModel
from engine.tools import Event, ReplyReader, assemble
from server import remote, schemas, sse
from server.errors import sse_error_event
from server.keys import SERVICE
from server.shapes import documents

routes = web.RouteTableDef()


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    """Every model this server serves: its own (loaded, loading, on disk, speech) and the roster's remote ones."""
    return web.json_response({"object": "list", "data": _model_cards(request)})


@routes.get("/v1/models/{id}")
async def get_model(request: web.Request) -> web.Response:
    mid = request.match_info["id"]
    for m in _model_cards(request):
        if m["id"] == mid:
            return web.json_response(m)
    raise ModelNotFound(f"The model '{mid}' does not exist", "model")


def _model_cards(request: web.Request) -> list[dict[str, Any]]:
    svc = request.app[SERVICE]
    own = [{**card, "capabilities": _capabilities(svc.roster.loaded.get(card["id"]), card)} for card in svc.models()]
    # what a remote model can do is the upstream's to say: nothing is claimed for it
    return own + [{**card, "capabilities": []} for card in remote.model_cards(request.app)]


def _capabilities(m: LoadedModel | None, card: dict[str, Any]) -> list[str]:
    """What the model is known to do (Ollama's capability names): for a loaded model from its GGUF and chat
    template; for one not loaded, its kind, and vision when its roster entry names a projector."""
    kind = card.get("kind")
    if kind == "asr":
        return ["transcription"] + (["translation"] if card.get("can_translate") else [])
    if kind == "tts":
        return ["speech"]
    if m is None:
        return {"llm": ["completion", *(["vision"] if card.get("vision") else [])],
                "embedding": ["embedding"]}.get(kind, [])
    if m.model.is_reranker:
        return ["rerank"]
    if m.embedding_only:
        return ["embedding"]
    return ["completion", *(["tools"] if m.tool_format != "none" else []), *(["thinking"] if m.thinks else []),
            *(["vision"] if m.vision else [])]


def _timings(gens: list[Generation]) -> dict:
    """llama-server's `timings` object (of the first choice)."""
    return gens[0].usage.get("timings", {})


def _usage(gens: list[Generation]) -> dict:
    """Usage of n choices: the prompt counted once, the completions summed."""
    u = gens[0].usage
    completion = sum(g.usage["completion_tokens"] for g in gens)
    return {"prompt_tokens": u["prompt_tokens"], "completion_tokens": completion,
            "total_tokens": u["prompt_tokens"] + completion,
            "prompt_tokens_details": {"cached_tokens": u["cached_tokens"]}}


def _envelope(gen: Generation, cid: str, obj: str, choices: list[dict]) -> dict:
    return {"id": cid, "object": obj, "created": gen.created, "model": gen.model, "system_fingerprint": None,
            "choices": choices}


async def _fan_in(gens: list[Generation]) -> AsyncIterator[tuple[int, str | None]]:
    """(choice index, text) as each generation delivers; (index, None) when one ends."""
    if len(gens) == 1:
        async for text in gens[0].chunks():
            yield 0, text
        yield 0, None
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, g: Generation) -> None:
        try:
            async for text in g.chunks():
                queue.put_nowait((i, text, None))
            queue.put_nowait((i, None, None))
        except EngineError as e:
            queue.put_nowait((i, None, e))
    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        ended = 0
        while ended < len(gens):
            i, text, err = await queue.get()
            if err is not None:
                raise err
            ended += text is None
            yield i, text
    finally:
        for t in tasks:
            t.cancel()


async def _gather_texts(gens: list[Generation]) -> list[str]:
    texts = [""] * len(gens)
    async for i, text in _fan_in(gens):
        if text:
            texts[i] += text
    return texts


def _cancel_all(gens: list[Generation]) -> None:
    for g in gens:
        g.cancel()  # no-op when finished; evicts the stream when the client went away


async def _sse(request: web.Request, gens: list[Generation], opts: schemas.StreamOptions, cid: str, obj: str,
               body) -> web.StreamResponse:
    """Stream gens as SSE: body(resp) writes the choices' chunks; then the usage chunk, an error event if
    the engine failed mid-way, [DONE]. Every stream is aborted on the way out (client gone or done)."""
    resp = await sse.open_stream(request)
    try:
        await body(resp)
        if opts.include_usage:
            await resp.write(sse.event({**_envelope(gens[0], cid, obj, []), "usage": _usage(gens),
                                        "timings": _timings(gens)}))
    except EngineError as e:
        await resp.write(sse_error_event(e))
    finally:
        _cancel_all(gens)
    await resp.write(sse.DONE)
    await resp.write_eof()
    return resp


# ---- chat ----------------------------------------------------------------------------------------

class _ChatChoice:
    """Turns one generation's text into message fields (content, reasoning, tool calls)."""

    def __init__(self, gen: Generation, streaming: bool):
        self.gen = gen
        self.reader = ReplyReader(gen.reading, streaming)
        self.parser = self.reader.parser  # None: plain text, no parsing

    @property
    def calls(self) -> int:
        return self.reader.calls

    def events(self, text: str | None) -> list[Event]:
        return self.reader.events(text)

    def deltas(self, text: str | None) -> list[dict]:
        """Chat deltas for new text (None: the generation ended)."""
        if self.parser is None:
            return [{"content": text}] if text else []
        return [d for d in (self._delta(e) for e in self.events(text)) if d]

    def _delta(self, e: Event) -> dict | None:
        if e.kind == "content":
            return {"content": e.text}
        if e.kind == "reasoning":
            return {"reasoning_content": e.text}
        if e.kind == "tool_call_end":
            return None
        i = e.index
        if e.kind == "tool_args":
            return {"tool_calls": [{"index": i, "function": {"arguments": e.text}}]}
        c = e.call  # a whole call, or the start of a streamed one (id and name first)
        return {"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                "function": {"name": c["name"], "arguments": c.get("arguments", "")}}]}

    @property
    def finish_reason(self) -> str:
        if self.reader.cut_call:  # max_tokens ended it inside a call: the call is not whole
            return "length"
        return "tool_calls" if self.calls else self.gen.finish_reason

    def message(self, text: str) -> dict:
        """The whole assistant message of a buffered reply."""
        if self.parser is None:
            return {"role": "assistant", "content": text}
        content, reasoning, calls = assemble(self.events(text) + self.events(None))
        msg: dict[str, Any] = {"role": "assistant", "content": content if content.strip() or not calls else None}
        if reasoning:
            msg["reasoning_content"] = reasoning
        if calls:
            msg["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
        return msg


@documents("POST", "/v1/chat/completions", "Create a chat completion (OpenAI Chat Completions)",
           schemas.ChatCompletionRequest)
@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    req, opts = schemas.chat_request(await schemas.read_json(request))
    gens = await request.app[SERVICE].chat(req, opts.n)
    cid = f"chatcmpl-{gens[0].id}"
    choices = [_ChatChoice(g, opts.stream) for g in gens]
    if opts.stream:
        return await _chat_stream(request, gens, choices, opts, cid)
    try:
        texts = await _gather_texts(gens)
    finally:
        _cancel_all(gens)
    out = [{"index": i, "message": c.message(t), "finish_reason": c.finish_reason,
            "logprobs": {"content": g.take_logprobs(), "refusal": None} if opts.logprobs else None}
           for i, (c, g, t) in enumerate(zip(choices, gens, texts))]
    return web.json_response({**_envelope(gens[0], cid, "chat.completion", out), "usage": _usage(gens),
                              "timings": _timings(gens)})


async def _chat_stream(request: web.Request, gens: list[Generation], choices: list[_ChatChoice],
                       opts: schemas.StreamOptions, cid: str) -> web.StreamResponse:
    def chunk(i: int, delta: dict, finish: str | None = None, logprobs: list | None = None) -> dict:
        lp = {"content": logprobs, "refusal": None} if logprobs else None
        return _envelope(gens[0], cid, "chat.completion.chunk",
                         [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}])
    # Plain text (the common case) goes out through a pre-rendered template: one json.dumps per chunk.
    plain = sse.TextEvent(chunk(0, {"content": sse.MARK})) \
        if len(gens) == 1 and choices[0].parser is None and not opts.logprobs else None

    async def body(resp: web.StreamResponse) -> None:
        for i in range(len(gens)):
            await resp.write(sse.event(chunk(i, {"role": "assistant", "content": ""})))
        async for i, text in _fan_in(gens):
            if plain is not None and text:
                await resp.write(plain.render(text))
                continue
            lps = gens[i].take_logprobs() if opts.logprobs else None
            deltas = choices[i].deltas(text)
            for k, d in enumerate(deltas):
                await resp.write(sse.event(chunk(i, d, logprobs=lps if k == 0 else None)))
            if lps and not deltas:
                await resp.write(sse.event(chunk(i, {}, logprobs=lps)))
            if text is None:
                await resp.write(sse.event(chunk(i, {}, choices[i].finish_reason)))
    return await _sse(request, gens, opts, cid, "chat.completion.chunk", body)


# ---- completions ---------------------------------------------------------------------------------

def _completion_logprobs(entries: list[dict], offset: int) -> dict:
    """Legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e["token"])
        lps.append(e["logprob"])
        tops.append({t["token"]: t["logprob"] for t in e["top_logprobs"]})
        offsets.append(offset)
        offset += len(e["token"])
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


@documents("POST", "/v1/completions", "Complete a text or token prompt (OpenAI Completions, no chat template)",
           schemas.TextCompletionRequest)
@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    req, opts, suffix = schemas.completion_request(await schemas.read_json(request))
    svc = request.app[SERVICE]
    if suffix is None:
        gens = await svc.complete(req, opts.n)
    else:  # fill in the middle, as /infill does: the prompt before the gap, the suffix after it
        gens = await svc.generator.infill(req.model, req.prompt, suffix, "", req.sampling, opts.n, req.keep_alive,
                                          field="suffix")
    cid = f"cmpl-{gens[0].id}"
    prefix = req.prompt if req.echo and isinstance(req.prompt, str) else ""
    if opts.stream:
        return await _completion_stream(request, gens, opts, cid, prefix)
    try:
        texts = await _gather_texts(gens)
    finally:
        _cancel_all(gens)
    out = [{"index": i, "text": prefix + t, "finish_reason": g.finish_reason,
            "logprobs": _completion_logprobs(g.take_logprobs(), len(prefix)) if opts.logprobs else None}
           for i, (g, t) in enumerate(zip(gens, texts))]
    return web.json_response({**_envelope(gens[0], cid, "text_completion", out), "usage": _usage(gens),
                              "timings": _timings(gens)})


async def _completion_stream(request: web.Request, gens: list[Generation], opts: schemas.StreamOptions, cid: str,
                             prefix: str) -> web.StreamResponse:
    def chunk(i: int, text: str, finish: str | None = None, logprobs: dict | None = None) -> dict:
        return _envelope(gens[0], cid, "text_completion",
                         [{"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}])
    plain = sse.TextEvent(chunk(0, sse.MARK)) if len(gens) == 1 and not opts.logprobs else None
    offsets = [len(prefix)] * len(gens)

    async def body(resp: web.StreamResponse) -> None:
        if prefix:
            for i in range(len(gens)):
                await resp.write(sse.event(chunk(i, prefix)))
        async for i, text in _fan_in(gens):
            if text is None:
                await resp.write(sse.event(chunk(i, "", gens[i].finish_reason)))
            elif plain is not None:
                await resp.write(plain.render(text))
            else:
                lp = _completion_logprobs(gens[i].take_logprobs(), offsets[i]) if opts.logprobs else None
                offsets[i] += len(text)
                await resp.write(sse.event(chunk(i, text, logprobs=lp)))
    return await _sse(request, gens, opts, cid, "text_completion", body)


# ---- embeddings ----------------------------------------------------------------------------------

@documents("POST", "/v1/embeddings", "Embed texts or token lists (OpenAI Embeddings)", schemas.EmbeddingRequest)
@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    model, inputs, fmt, keep = schemas.embedding_request(await schemas.read_json(request))
    model_id, vectors, n_tokens = await request.app[SERVICE].embed(model, inputs, keep)
    data = []
    for i, v in enumerate(vectors):
        emb = base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() if fmt == "base64" else \
            [float(x) for x in v]
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return web.json_response({"object": "list", "data": data, "model": model_id,
                              "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                              "created": int(time.time())})
