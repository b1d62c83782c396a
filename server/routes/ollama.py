"""The Ollama API (/api/*) on the same engine, templates, tool parsers, grammars and reasoning split as
chat completions: a translation layer, no second engine path. Errors come in Ollama's shape {"error": "..."}
(server/errors.py answers so for every /api/ path)."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from engine.errors import EngineError, InvalidRequest
from engine.models.tenancy import parse_keep_alive
from engine.requests import KEEP, ChatRequest, CompletionRequest, SamplingParams
from engine.system import VERSION
from engine.tools import ReplyReader, assemble
from server import schemas
from server.keys import SERVICE
from server.schemas import Fields, read_json

routes = web.RouteTableDef()
# Ollama's options and the sampling fields they are (num_ctx, num_thread and the like shape a loaded model:
# they are read from the roster, not per request, and are logged as ignored)
OPTIONS = {"temperature": ("temperature", float), "top_p": ("top_p", float), "top_k": ("top_k", int),
           "min_p": ("min_p", float), "num_predict": ("max_tokens", int), "stop": ("stop", (str, list)),
           "seed": ("seed", int), "repeat_penalty": ("repeat_penalty", float),
           "presence_penalty": ("presence_penalty", float), "frequency_penalty": ("frequency_penalty", float)}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _sampling(f: Fields) -> SamplingParams:
    """Ollama's "options" object as the engine's sampling fields (checked like chat completions')."""
    opts = f.get("options", dict, {})
    body: dict[str, Any] = {}
    for name, (field, _) in OPTIONS.items():
        if name in opts:
            body[field] = opts[name]
    if body.get("max_tokens") is not None and body["max_tokens"] < 0:  # -1: until the model stops
        body.pop("max_tokens")
    if "repeat_last_n" in opts:
        body["_last_n"] = opts["repeat_last_n"]
    inner = Fields(body, "ollama.options")
    sp = schemas.sampling_params(inner)
    last_n = inner.get("_last_n", int, lo=-1, hi=1 << 20)
    if last_n is not None:
        sp.penalty_last_n = last_n
    ignored = sorted(set(opts) - set(OPTIONS) - {"repeat_last_n"})
    if ignored:
        Fields({k: opts[k] for k in ignored}, "ollama.options").log_ignored()
    return sp


def _format(f: Fields) -> dict | None:
    """Ollama's "format": "json" or a JSON schema, as the engine's output spec."""
    fmt = f.get("format", (str, dict))
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "schema": fmt}
    raise InvalidRequest(f"'format' must be \"json\" or a JSON schema object, got {fmt!r}", "format")


def _durations(gen, t0: float) -> dict[str, Any]:
    t = gen.usage.get("timings", {})
    return {"total_duration": int((time.monotonic() - t0) * 1e9), "load_duration": 0,
            "prompt_eval_count": t.get("prompt_n", 0), "prompt_eval_duration": int(t.get("prompt_ms", 0) * 1e6),
            "eval_count": t.get("predicted_n", 0), "eval_duration": int(t.get("predicted_ms", 0) * 1e6)}


def _calls(calls: list[dict]) -> list[dict]:
    """Tool calls as Ollama sends them: arguments as an object, not a JSON string."""
    out = []
    for c in calls:
        try:
            args = json.loads(c["arguments"]) if isinstance(c["arguments"], str) else c["arguments"]
        except json.JSONDecodeError:
            args = {}
        out.append({"function": {"name": c["name"], "arguments": args if isinstance(args, dict) else {}}})
    return out


def _messages(raw: list) -> list[dict]:
    """Ollama messages (tool_calls arguments as objects, "thinking") as chat-completions messages."""
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", "messages")
        if m.get("images"):
            raise InvalidRequest(f"messages[{i}].images: images are not supported yet", "messages")
        m = {k: v for k, v in m.items() if k not in ("thinking", "images")}
        calls = m.get("tool_calls")
        if isinstance(calls, list):  # Ollama's {"function": {"name", "arguments": {...}}} as OpenAI's calls
            m["tool_calls"] = [_openai_call(c, i, j) for j, c in enumerate(calls)]
        out.append(m)
    schemas.check_messages(out)  # the same 400s, naming the field, as chat completions
    return out


def _openai_call(c: Any, i: int, j: int) -> Any:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict):
        return c  # malformed: check_messages names it
    args = fn.get("arguments", {})
    return {"id": f"call_{i}_{j}", "type": "function",
            "function": {"name": fn.get("name"), "arguments": args if isinstance(args, str) else json.dumps(args)}}


def _line(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


async def _reply(request: web.Request, gen, t0: float, stream: bool, parts, whole, empty: dict) -> web.StreamResponse:
    """One object (whole()), or NDJSON lines: each of parts, then the ending with empty; an engine failure after
    the first line ends the stream with an {"error"} line. The engine request is aborted on the way out."""
    def line(obj: dict, done: bool = False) -> bytes:
        head = {"model": gen.model, "created_at": _now()}
        if done:  # the finish reason and counts exist once the generation ended
            head |= {"done": True, "done_reason": "length" if gen.finish_reason == "length" else "stop",
                     **_durations(gen, t0)}
        else:
            head["done"] = False
        return _line({**head, **obj})
    try:
        if not stream:
            body = await whole()
            return web.Response(body=line(body, done=True), content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        try:
            async for part in parts:
                await resp.write(line(part))
            await resp.write(line(empty, done=True))
        except EngineError as e:
            await resp.write(_line({"error": e.message}))
        await resp.write_eof()
        return resp
    finally:
        gen.cancel()


@routes.get("/api/version")
async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


def _details(m: dict) -> dict:
    return {"format": "gguf", "family": m.get("arch", ""), "families": [m.get("arch", "")],
            "parameter_size": f"{m.get('params', 0) / 1e9:.1f}B" if m.get("params", 0) >= 1e9 else
            f"{m.get('params', 0) / 1e6:.0f}M", "quantization_level": m.get("quant", "")}


def _llms(request: web.Request) -> list[dict]:
    return [m for m in request.app[SERVICE].models() if m.get("kind") in ("llm", "embedding")]


def _keep_alive(f: Fields):
    """The request's keep_alive (Ollama: seconds or a duration; 0 unloads when done, negative keeps)."""
    raw = f.get("keep_alive", (int, float, str))
    return KEEP if raw is None else parse_keep_alive(raw)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


@routes.get("/api/tags")
async def tags(request: web.Request) -> web.Response:
    """The models this server can serve, loaded or not, as `ollama list` shows them."""
    out = [{"name": m["id"], "model": m["id"], "modified_at": _iso(m["created"]),
            "size": m.get("file_size", m.get("size", 0)), "digest": "", "details": _details(m)}
           for m in _llms(request)]
    return web.json_response({"models": out})


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    """The loaded models, with when each unloads if it stays idle ("expires_at")."""
    out = []
    for m in _llms(request):
        if m["state"] != "loaded":
            continue
        ttl = m.get("ttl_s")
        expires = _iso(time.time() + ttl) if ttl is not None else "2318-01-01T00:00:00Z"  # Ollama's "forever"
        out.append({"name": m["id"], "model": m["id"], "size": m.get("memory_bytes") or m.get("file_size", 0),
                    "size_vram": 0, "digest": "", "expires_at": expires, "details": _details(m)})
    return web.json_response({"models": out})


@routes.post("/api/show")
async def show(request: web.Request) -> web.Response:
    f = Fields(await read_json(request), "ollama.show")
    name = f.get("model", str) or f.get("name", str)
    f.log_ignored()
    svc = request.app[SERVICE]
    loaded = svc.roster.get(name)  # 404 for a model not served
    info = next(m for m in svc.models() if m["id"] == loaded.id)
    caps = ["embedding"] if loaded.embedding_only else ["completion"] + (["tools"] if loaded.tool_format != "none"
                                                                         else []) + (["thinking"] if loaded.thinks
                                                                                     else [])
    return web.json_response({"modelfile": "", "parameters": "", "template": loaded.template.source or "",
                              "details": _details(info), "capabilities": caps,
                              "model_info": {"general.architecture": info.get("arch"),
                                             "general.parameter_count": info.get("params"),
                                             f"{info.get('arch')}.context_length": info.get("n_ctx_train")}})


@routes.post("/api/chat")
async def chat(request: web.Request) -> web.StreamResponse:
    """A chat turn: streamed as NDJSON lines by default ("stream": false for one object)."""
    f = Fields(await read_json(request), "ollama.chat")
    model = f.require("model", str, "the model to chat with")
    raw = f.get("messages", list, [])
    stream = f.get("stream", bool, True)
    think = f.get("think", bool)
    kwargs = {"enable_thinking": think} if think is not None else {}
    keep = _keep_alive(f)
    req = ChatRequest(model, _messages(raw), _sampling(f), template_kwargs=kwargs, tools=schemas.tools_field(f),
                      response_format=_format(f), keep_alive=keep)
    f.log_ignored()
    if not req.messages:  # Ollama's way to load a model (or, with keep_alive 0, to unload it)
        return await _load_or_unload(request.app[SERVICE], model, keep, {"message": {"role": "assistant",
                                                                                   "content": ""}})
    t0 = time.monotonic()
    gen, = await request.app[SERVICE].chat(req)
    reader = ReplyReader(gen.reading, streaming=False)  # calls come whole, as Ollama sends them

    def message(content: str, thinking: str = "", calls: list[dict] | None = None) -> dict:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            msg["thinking"] = thinking
        if calls:
            msg["tool_calls"] = _calls(calls)
        return msg

    def read(text: str | None) -> dict | None:  # a piece of the reply (None: its end) as a message, if any
        if reader.parser is None:
            return {"message": message(text)} if text else None
        content, thinking, calls = assemble(reader.events(text))
        return {"message": message(content, thinking, calls)} if content or thinking or calls else None

    async def parts():
        async for text in gen.chunks():
            if (part := read(text)) is not None:
                yield part
        if (part := read(None)) is not None:
            yield part

    async def whole() -> dict:
        text = await gen.text()
        if reader.parser is None:
            return {"message": message(text)}
        content, thinking, calls = assemble(reader.events(text) + reader.events(None))
        return {"message": message(content, thinking, calls)}
    return await _reply(request, gen, t0, stream, parts(), whole, {"message": message("")})


@routes.post("/api/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    """A completion: the prompt through the model's chat template (with "system"), or as it is with "raw"."""
    f = Fields(await read_json(request), "ollama.generate")
    model = f.require("model", str, "the model to generate with")
    prompt = f.get("prompt", str, "")
    system = f.get("system", str)
    raw = f.get("raw", bool, False)
    stream = f.get("stream", bool, True)
    sampling = _sampling(f)
    fmt = _format(f)
    f.log_ignored()
    keep = _keep_alive(f)
    svc = request.app[SERVICE]
    if not prompt:  # Ollama's way to load a model (or, with keep_alive 0, to unload it): done at once
        return await _load_or_unload(svc, model, keep, {"response": ""})
    t0 = time.monotonic()
    if raw:
        if fmt is not None:
            raise InvalidRequest("'format' needs the chat template: not with \"raw\": true", "format")
        gen, = await svc.complete(CompletionRequest(model, prompt, sampling, keep_alive=keep))
    else:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        gen, = await svc.chat(ChatRequest(model, messages, sampling, response_format=fmt, keep_alive=keep))

    async def parts():
        async for text in gen.chunks():
            yield {"response": text}

    async def whole() -> dict:
        return {"response": await gen.text()}
    return await _reply(request, gen, t0, stream, parts(), whole, {"response": ""})


async def _load_or_unload(svc, model: str, keep, empty: dict) -> web.Response:
    """An empty chat or generate: load the model (JIT) and keep it as keep_alive says, or unload it for 0."""
    if keep == 0:
        unloaded = await svc.roster.release(model)
        return web.json_response({"model": model, "created_at": _now(), **empty, "done": True,
                                  "done_reason": "unload" if unloaded else "stop"})
    async with svc.roster.lease(model, keep):
        pass
    return web.json_response({"model": model, "created_at": _now(), **empty, "done": True, "done_reason": "load"})


@routes.post("/api/embed")
async def embed(request: web.Request) -> web.Response:
    """{model, input: text or texts} -> {model, embeddings: [[...]], prompt_eval_count}."""
    f = Fields(await read_json(request), "ollama.embed")
    model = f.require("model", str, "the embedding model")
    raw = f.get("input", (str, list))
    if raw is None or raw == [] or (isinstance(raw, list) and not all(isinstance(x, str) for x in raw)):
        raise InvalidRequest("'input' must be a string or an array of strings", "input")
    keep = _keep_alive(f)
    f.log_ignored()
    t0 = time.monotonic()
    model_id, vectors, n_tokens = await request.app[SERVICE].embed(model, [raw] if isinstance(raw, str) else raw,
                                                                   keep)
    return web.json_response({"model": model_id, "embeddings": [[float(x) for x in v] for v in vectors],
                              "total_duration": int((time.monotonic() - t0) * 1e9), "load_duration": 0,
                              "prompt_eval_count": n_tokens})


@routes.post("/api/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    """The legacy embeddings route: {model, prompt} -> {embedding: [...]}."""
    f = Fields(await read_json(request), "ollama.embeddings")
    model = f.require("model", str, "the embedding model")
    prompt = f.require("prompt", str, "the text to embed")
    keep = _keep_alive(f)
    f.log_ignored()
    _, vectors, _ = await request.app[SERVICE].embed(model, [prompt], keep)
    return web.json_response({"embedding": [float(x) for x in vectors[0]]})
