"""The Ollama API (/api/*) on the same engine, templates, tool parsers, grammars and reasoning split as
chat completions: a translation layer, no second engine path. Errors come in Ollama's shape {"error": "..."}
(server/errors.py answers so for every /api/ path). Images (base64) become chat image_url parts; a remote
model's chat and generate go upstream as chat completions (server/remote.py). Model names are ours, or
Ollama's `name:latest` for them; pulling, copying, creating and deleting models works on the roster
(server/ollama_models.py)."""
from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import AfterValidator, Field, field_validator, model_validator

from engine.chat import ROLES
from engine.errors import EngineError, InvalidRequest
from engine.models.tenancy import parse_keep_alive
from engine.requests import KEEP, ChatRequest, CompletionRequest, SamplingParams
from engine.system import VERSION
from engine.tools import assemble
from server import ollama_models, remote
from server.access import loopback_only
from server.keys import SERVICE
from server.schemas import (ChatTool, MinP, Penalty, RepeatPenalty, Stop, Temperature, TopK, TopP,
                            read_json, sampling_params)
from server.shapes import NonEmpty, Shape, documents, log_ignored, parse, refuse

routes = web.RouteTableDef()


# ---- the request shapes ---------------------------------------------------------------------------------

class OllamaOptions(Shape):
    """Ollama's "options": the sampling fields, bounded as chat completions' are. num_ctx, num_thread and the like
    shape a loaded model: they are the roster's (POST /api/create), not a request's, and are logged as ignored."""

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    num_predict: int | None = None  # the most tokens to generate; negative: until the model stops
    stop: Stop | None = None
    seed: int | None = None
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: Annotated[int, Field(ge=-1, le=1 << 20)] | None = None  # tokens the penalties look back on
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None

    @field_validator("num_predict")
    @classmethod
    def _a_count(cls, n: int | None) -> int | None:
        if n == 0:
            raise refuse("must be a number of tokens (or negative: until the model stops), got 0")
        return n

    def sampling(self) -> SamplingParams:
        """The options as the engine's SamplingParams (the ones it has no use for logged once)."""
        log_ignored(self.model_extra or {}, "ollama.options")
        return sampling_params({
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
            "max_tokens": self.num_predict if self.num_predict and self.num_predict > 0 else None,
            "stop": self.stop, "seed": self.seed, "repeat_penalty": self.repeat_penalty,
            "penalty_last_n": self.repeat_last_n, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty})


class OllamaCalledFunction(Shape):
    name: NonEmpty
    arguments: dict[str, Any] | str = {}  # an object, as Ollama sends it


class OllamaToolCall(Shape):
    function: OllamaCalledFunction


class OllamaMessage(Shape):
    """A chat message as Ollama sends it (other fields go to the chat template as they are)."""

    role: Literal[ROLES]
    content: str | None = None
    tool_calls: list[OllamaToolCall] | None = None  # arguments as objects
    tool_name: str | None = None  # a tool message: the tool whose result it is
    thinking: str | None = None  # an earlier reply's reasoning: not replayed to the template
    images: list[str] | None = None  # base64, each an image_url part before the content

    def as_chat(self, i: int) -> dict[str, Any]:
        """The message in chat-completions form (calls with ids and JSON-string arguments, the tool's name,
        images as data-URI parts)."""
        msg = self.model_dump(exclude_unset=True, exclude={"thinking", "images", "tool_calls", "tool_name"})
        if self.images:
            msg["content"] = _with_images(self.images, self.content or "")
        if self.tool_name is not None:
            msg["name"] = self.tool_name
        if self.tool_calls is not None:
            msg["tool_calls"] = [{"id": f"call_{i}_{j}", "type": "function", "function": {
                "name": c.function.name, "arguments": c.function.arguments if isinstance(c.function.arguments, str)
                else json.dumps(c.function.arguments, ensure_ascii=False)}} for j, c in enumerate(self.tool_calls)]
        return msg


Format = Literal["", "json"] | dict[str, Any]  # "json", or a JSON schema the reply follows


class _KeepAlive(Shape):
    keep_alive: float | str | None = None  # seconds or a duration ("5m"); 0: unload when done; negative: keep

    def keep(self) -> Any:
        """The engine's keep_alive (KEEP: the model's time-to-live stands)."""
        return KEEP if self.keep_alive is None else parse_keep_alive(self.keep_alive)


class _Generating(_KeepAlive):
    """What chat and generate share."""

    model: NonEmpty
    stream: bool = True  # Ollama streams NDJSON unless told otherwise
    options: OllamaOptions | None = None
    format: Format | None = None

    def sampling(self) -> SamplingParams:
        """The request's options as the engine's SamplingParams."""
        return (self.options or OllamaOptions()).sampling()

    def output(self) -> dict[str, Any] | None:
        """The engine's output spec for "format"."""
        if self.format == "json":
            return {"type": "json_object"}
        return {"type": "json_schema", "schema": self.format} if isinstance(self.format, dict) else None


class OllamaChatRequest(_Generating):
    """POST /api/chat."""

    messages: list[OllamaMessage] = []  # none: load the model (or with keep_alive 0, unload it)
    tools: list[ChatTool] | None = None
    think: bool | Literal["low", "medium", "high"] | None = None  # a level turns thinking on

    def chat(self, model: str) -> ChatRequest:
        """The engine's ChatRequest for model (our id for the name the request gave)."""
        kwargs = {"enable_thinking": bool(self.think)} if self.think is not None else {}
        return ChatRequest(model, [m.as_chat(i) for i, m in enumerate(self.messages)], self.sampling(),
                           template_kwargs=kwargs, tools=[t.as_dict() for t in self.tools] if self.tools else None,
                           response_format=self.output(), keep_alive=self.keep(),
                           truncation=None)  # Ollama's API has no truncation field


class OllamaGenerateRequest(_Generating):
    """POST /api/generate: a prompt through the chat template (with "system"), or as it is with "raw"."""

    prompt: str = ""  # empty: load the model (or with keep_alive 0, unload it)
    system: str | None = None
    raw: bool = False
    images: list[str] | None = None  # base64, with the prompt's user message (not with "raw")
    suffix: str | None = None  # fill in the middle: the prompt is the text before the gap, this after it


class OllamaEmbedRequest(_KeepAlive):
    """POST /api/embed."""

    model: NonEmpty
    input: str | Annotated[list[str], Field(min_length=1)]


class OllamaEmbeddingsRequest(_KeepAlive):
    """POST /api/embeddings (the legacy route)."""

    model: NonEmpty
    prompt: NonEmpty


class OllamaShowRequest(Shape):
    """POST /api/show (model; "name" is the older field)."""

    model: NonEmpty | None = None
    name: NonEmpty | None = None

    def named(self) -> str:
        """The model asked about (400 when neither field names one)."""
        if not (self.model or self.name):
            raise InvalidRequest("'model' is required", "model")
        return self.model or self.name


_MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}$"


def _usable_model_name(name: str) -> str:
    if not re.fullmatch(_MODEL_NAME, name):
        raise refuse(f"must be 1 to 200 letters, digits and _ . : / @ + - (starting with a letter or digit), got "
                     f"{name[:80]!r}")
    return name


ModelName = Annotated[str, Field(json_schema_extra={"pattern": _MODEL_NAME}), AfterValidator(_usable_model_name)]


class OllamaPullRequest(Shape):
    """POST /api/pull: hf.co/{owner}/{repo}[:QUANT] (or owner/repo[:QUANT], repo/file.gguf), or a catalog entry."""

    model: Annotated[str, Field(min_length=1, max_length=400)]
    stream: bool = True  # NDJSON progress lines; false: one object when done
    insecure: bool | None = None  # accepted: the hub is reached over HTTPS (or HF_ENDPOINT) either way


class OllamaCopyRequest(Shape):
    """POST /api/copy: another roster name for a model."""

    source: NonEmpty
    destination: ModelName


class OllamaDeleteRequest(Shape):
    """DELETE /api/delete."""

    model: NonEmpty


class CreateParameters(Shape):
    """The Modelfile parameters a roster entry has keys for (anything else is a 400 naming it)."""

    num_ctx: int | None = None  # the entry's ctx
    num_batch: int | None = None  # the entry's chunk: the largest prefill slice per step

    def settings(self) -> dict[str, Any]:
        """The roster keys and values (bounds are the roster's: checked with the new entry)."""
        for k in self.model_extra or {}:
            raise InvalidRequest(f"'parameters.{k}' has no roster setting here (only "
                                 f"{', '.join(ollama_models.MODELFILE_KEYS)}); send it in each request's options",
                                 "parameters")
        given = self.model_dump(exclude_none=True, exclude=set(self.model_extra or {}))
        return {ollama_models.MODELFILE_KEYS[k]: v for k, v in given.items()}


class OllamaCreateRequest(Shape):
    """POST /api/create: a new roster entry from an existing model, with its own chat template and settings."""

    model: ModelName
    from_: NonEmpty = Field(alias="from")  # the model it starts from
    template: NonEmpty | None = None  # a Jinja chat template (not Ollama's Go template syntax)
    parameters: CreateParameters | None = None
    stream: bool = True

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, body: Any) -> Any:
        """400 for a field of Ollama's no roster key holds (before it is logged as one merely ignored)."""
        for field in sorted(_UNSUPPORTED.keys() & (body.keys() if isinstance(body, dict) else set())):
            if body[field] is not None:
                raise InvalidRequest(f"'{field}' is not supported here: {_UNSUPPORTED[field]}", field)
        return body

    def settings(self) -> dict[str, Any]:
        """The new entry's roster settings (400 for a parameter no roster key holds)."""
        return self.parameters.settings() if self.parameters else {}


_UNSUPPORTED = {  # Ollama's create fields no roster key holds, and what to do instead
    "system": "a model's default system prompt has no roster key yet; send a system message with each chat",
    "messages": "a model's preset conversation has no roster key; send the messages with each chat",
    "files": "a model is created from an existing one ('from'); pull or import a GGUF to add one",
    "adapters": "LoRA adapters are not served",
    "quantize": "models are not requantized here; pull the quant you want (hf.co/owner/repo:QUANT)",
}


_MAGIC = (("iVBORw0KGgo", "image/png"), ("/9j/", "image/jpeg"), ("R0lGOD", "image/gif"), ("UklGR", "image/webp"),
          ("Qk", "image/bmp"))  # how each format's first bytes read in base64


def _with_images(images: list[str], text: str) -> list[dict[str, Any]]:
    """Ollama's base64 images and a text as chat-completions content parts: image_url data URIs (a media type
    from the image's first bytes, for upstreams that read it; Pillow reads the bytes themselves), then the text."""
    def url(b64: str) -> str:
        if b64[:5].lower() == "data:":
            return b64
        kind = next((t for head, t in _MAGIC if b64.startswith(head)), "application/octet-stream")
        return f"data:{kind};base64,{b64}"
    return [*({"type": "image_url", "image_url": {"url": url(b)}} for b in images), {"type": "text", "text": text}]


def _model(request: web.Request, name: str) -> str:
    """Our id for an Ollama model name: a remote entry's (with or without ':latest'), else the roster's."""
    for candidate in (name, name.removesuffix(ollama_models.LATEST)):
        if remote.is_remote(request, candidate):
            return candidate
    return ollama_models.resolve(request.app[SERVICE], name)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


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
    """The language and embedding models, as `ollama list` counts them: a GGUF in models_dir that a roster entry
    serves (a pull's file under the name it was pulled by) is listed once, by the roster's name."""
    svc = request.app[SERVICE]
    rostered = {e.name for e in svc.config.models}
    files = ollama_models.rostered_files(svc)
    return [m for m in svc.models() if m.get("kind") in ("llm", "embedding")
            and (m["id"] in rostered or m["state"] == "loaded" or not ollama_models.is_rostered_file(m.get("path"),
                                                                                                   files))]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


_FOREVER = "2318-01-01T00:00:00Z"  # Ollama's expires_at for a model that stays
_REMOTE_DETAILS = {"format": "remote", "family": "", "families": [], "parameter_size": "", "quantization_level": ""}


def _remote_cards(request: web.Request) -> dict[str, dict]:
    return {c["id"]: c for c in remote.model_cards(request.app)}


def _remote_of(card: dict) -> dict:
    """Ollama's fields for a model served elsewhere (its cloud models carry them too)."""
    return {"remote_model": card["remote_model"], "remote_host": card["replicas"][0]["url"] if card["replicas"]
            else ""}


@routes.get("/api/tags")
async def tags(request: web.Request) -> web.Response:
    """The models this server can serve, loaded or not, as `ollama list` shows them."""
    out = [{"name": m["id"], "model": m["id"], "modified_at": _iso(m["created"]),
            "size": m.get("file_size", m.get("size", 0)), "digest": "", "details": _details(m)}
           for m in _llms(request)]
    out += [{"name": c["id"], "model": c["id"], "modified_at": _iso(c["created"]), "size": 0, "digest": "",
             "details": _REMOTE_DETAILS, **_remote_of(c)} for c in _remote_cards(request).values()]
    return web.json_response({"models": out})


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    """The loaded models, with when each unloads if it stays idle ("expires_at")."""
    out = []
    for m in _llms(request):
        if m["state"] != "loaded":
            continue
        ttl = m.get("ttl_s")
        expires = _iso(time.time() + ttl) if ttl is not None else _FOREVER
        out.append({"name": m["id"], "model": m["id"], "size": m.get("memory_bytes") or m.get("file_size", 0),
                    "size_vram": 0, "digest": "", "expires_at": expires, "details": _details(m)})
    out += [{"name": c["id"], "model": c["id"], "size": 0, "size_vram": 0, "digest": "", "expires_at": _FOREVER,
             "details": _REMOTE_DETAILS, **_remote_of(c)} for c in _remote_cards(request).values() if c["healthy"]]
    return web.json_response({"models": out})


def _parameters(m) -> str:
    """The model's settings as Modelfile PARAMETER lines."""
    return f"num_ctx {m.ctx}\nnum_batch {m.settings.chunk}"


@documents("POST", "/api/show", "A model's template, capabilities and details (Ollama)", OllamaShowRequest)
@routes.post("/api/show")
async def show(request: web.Request) -> web.Response:
    """The model's details, capabilities and chat template (an unloaded model is loaded first)."""
    body = parse(OllamaShowRequest, await read_json(request), "ollama.show")
    svc = request.app[SERVICE]
    card = _remote_cards(request).get(_model(request, body.named()))
    if card is not None:
        return web.json_response({"modelfile": "", "parameters": "", "template": "", "details": _REMOTE_DETAILS,
                                  "capabilities": ["completion"], "model_info": {}, **_remote_of(card)})
    async with svc.roster.lease(ollama_models.resolve(svc, body.named())) as loaded:
        info = next(m for m in svc.models() if m["id"] == loaded.id)
    caps = ["embedding"] if loaded.embedding_only else ["completion"] + (["tools"] if loaded.tool_format != "none"
                                                                         else []) + (["thinking"] if loaded.thinks
                                                                                     else [])
    return web.json_response({"modelfile": "", "parameters": _parameters(loaded),
                              "template": loaded.template.source or "", "details": _details(info),
                              "capabilities": caps,
                              "model_info": {"general.architecture": info.get("arch"),
                                             "general.parameter_count": info.get("params"),
                                             f"{info.get('arch')}.context_length": info.get("n_ctx_train")}})


@documents("POST", "/api/chat", "A chat turn, streamed as NDJSON by default (Ollama)", OllamaChatRequest)
@routes.post("/api/chat")
async def chat(request: web.Request) -> web.StreamResponse:
    """A chat turn: streamed as NDJSON lines by default ("stream": false for one object)."""
    body = parse(OllamaChatRequest, await read_json(request), "ollama.chat")
    req = body.chat(_model(request, body.model))
    if not req.messages:  # Ollama's way to load a model (or, with keep_alive 0, to unload it)
        return await _load_or_unload(request, req.model, req.keep_alive, {"message": {"role": "assistant",
                                                                                        "content": ""}})
    t0 = time.monotonic()
    gen, = await remote.chat(request, req, body.stream)
    reader = remote.reply_reader(gen, streaming=False)  # calls come whole, as Ollama sends them

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
    return await _reply(request, gen, t0, body.stream, parts(), whole, {"message": message("")})


@documents("POST", "/api/generate", "A completion of a prompt, templated or raw, streamed as NDJSON by default "
           "(Ollama)", OllamaGenerateRequest)
@routes.post("/api/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    """A completion: the prompt through the model's chat template (with "system"), or as it is with "raw"."""
    body = parse(OllamaGenerateRequest, await read_json(request), "ollama.generate")
    svc = request.app[SERVICE]
    model, sampling, fmt, keep = _model(request, body.model), body.sampling(), body.output(), body.keep()
    if not body.prompt and body.suffix is None:  # Ollama's way to load a model (or with keep_alive 0, to unload it)
        return await _load_or_unload(request, model, keep, {"response": ""})
    t0 = time.monotonic()
    if body.suffix is not None:
        gen = await _fill_in_the_middle(request, body, model, sampling, keep)
    elif body.raw:
        for field, why in (("format", "needs the chat template"), ("images", "go with the chat template's user turn")):
            if getattr(body, field):
                raise InvalidRequest(f"'{field}' {why}: not with \"raw\": true", field)
        if remote.is_remote(request, model):
            raise InvalidRequest(f"model '{model}' is remote: its prompts go through its chat template (\"raw\" is "
                                 "for local models)", "raw")
        gen, = await svc.complete(CompletionRequest(model, body.prompt, sampling, keep_alive=keep))
    else:
        messages = [{"role": "system", "content": body.system}] if body.system else []
        messages.append({"role": "user", "content": _with_images(body.images, body.prompt) if body.images
                         else body.prompt})
        gen, = await remote.chat(request, ChatRequest(model, messages, sampling, response_format=fmt,
                                                      keep_alive=keep), body.stream)

    async def parts():
        async for text in gen.chunks():
            if text:  # a remote reply's reasoning comes as chunks without content
                yield {"response": text}

    async def whole() -> dict:
        return {"response": await gen.text()}
    return await _reply(request, gen, t0, body.stream, parts(), whole, {"response": ""})


async def _fill_in_the_middle(request: web.Request, body: OllamaGenerateRequest, model: str, sampling, keep):
    """What goes between the prompt and the suffix, laid out with the model's FIM tokens as /infill does."""
    for field in ("system", "format", "images"):
        if getattr(body, field):
            raise InvalidRequest(f"'{field}' does not go with 'suffix' (a fill-in-the-middle prompt has no chat "
                                 "template)", field)
    if remote.is_remote(request, model):
        raise InvalidRequest(f"model '{model}' is remote: 'suffix' (fill in the middle) is for local models", "suffix")
    gen, = await request.app[SERVICE].generator.infill(model, body.prompt, body.suffix, "", sampling, 1, keep,
                                                        field="suffix")
    return gen


async def _load_or_unload(request: web.Request, model: str, keep, empty: dict) -> web.Response:
    """An empty chat or generate: load the model (JIT) and keep it as keep_alive says, or unload it for 0 (a
    remote model is served elsewhere: nothing to do)."""
    svc = request.app[SERVICE]
    if remote.is_remote(request, model):
        return web.json_response({"model": model, "created_at": _now(), **empty, "done": True, "done_reason": "load"})
    if keep == 0:
        unloaded = await svc.roster.release(model)
        return web.json_response({"model": model, "created_at": _now(), **empty, "done": True,
                                  "done_reason": "unload" if unloaded else "stop"})
    async with svc.roster.lease(model, keep):
        pass
    return web.json_response({"model": model, "created_at": _now(), **empty, "done": True, "done_reason": "load"})


@documents("POST", "/api/embed", "Embed a text or texts (Ollama)", OllamaEmbedRequest)
@routes.post("/api/embed")
async def embed(request: web.Request) -> web.Response:
    """{model, input: text or texts} -> {model, embeddings: [[...]], prompt_eval_count}."""
    body = parse(OllamaEmbedRequest, await read_json(request), "ollama.embed")
    t0 = time.monotonic()
    texts = [body.input] if isinstance(body.input, str) else body.input
    model_id, vectors, n_tokens = await remote.embed(request, _model(request, body.model), texts, body.keep())
    return web.json_response({"model": model_id, "embeddings": [[float(x) for x in v] for v in vectors],
                              "total_duration": int((time.monotonic() - t0) * 1e9), "load_duration": 0,
                              "prompt_eval_count": n_tokens})


@documents("POST", "/api/embeddings", "Embed one text (Ollama's legacy route)", OllamaEmbeddingsRequest)
@routes.post("/api/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    """The legacy embeddings route: {model, prompt} -> {embedding: [...]}."""
    body = parse(OllamaEmbeddingsRequest, await read_json(request), "ollama.embeddings")
    _, vectors, _ = await remote.embed(request, _model(request, body.model), [body.prompt], body.keep())
    return web.json_response({"embedding": [float(x) for x in vectors[0]]})


# ---- model management -------------------------------------------------------------------------------------

async def _progress(request: web.Request, lines, finished: asyncio.Future, stream: bool) -> web.StreamResponse:
    """Progress lines then {"status": "success", model} as NDJSON (a failure after the first line is the last
    line, {"error"}); or, not streamed, the success object once done (a failure is the response's status)."""
    if not stream:
        return web.json_response({"status": "success", "model": await asyncio.shield(finished)})
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    try:
        async for line in lines():
            await resp.write(_line(line))
        await resp.write(_line({"status": "success", "model": await asyncio.shield(finished)}))
    except EngineError as e:
        await resp.write(_line({"error": e.message}))
    await resp.write_eof()
    return resp


@documents("POST", "/api/pull", "Pull a model from Hugging Face (hf.co/owner/repo:QUANT) or the catalog, with NDJSON "
           "progress (Ollama)", OllamaPullRequest)
@routes.post("/api/pull")
@loopback_only
async def pull(request: web.Request) -> web.StreamResponse:
    """Errors found before any byte moves are the response's status; the pull goes on if the client leaves."""
    body = parse(OllamaPullRequest, await read_json(request), "ollama.pull")
    job = await ollama_models.pull(request.app[SERVICE], body.model)
    return await _progress(request, job.lines, job.finished, body.stream)


@documents("POST", "/api/copy", "Another roster name for a model (Ollama)", OllamaCopyRequest)
@routes.post("/api/copy")
@loopback_only
async def copy(request: web.Request) -> web.Response:
    body = parse(OllamaCopyRequest, await read_json(request), "ollama.copy")
    await ollama_models.copy(request.app[SERVICE], body.source, body.destination)
    return web.json_response({"status": "success"})


@documents("DELETE", "/api/delete", "Remove a model from the roster, and its file when it lives in models_dir "
           "(Ollama)", OllamaDeleteRequest)
@routes.delete("/api/delete")
@loopback_only
async def delete(request: web.Request) -> web.Response:
    body = parse(OllamaDeleteRequest, await read_json(request), "ollama.delete")
    return web.json_response({"status": "success", **await ollama_models.delete(request.app[SERVICE], body.model)})


@documents("POST", "/api/create", "A new roster entry from a model, with its own chat template and num_ctx / "
           "num_batch (Ollama)", OllamaCreateRequest)
@routes.post("/api/create")
@loopback_only
async def create(request: web.Request) -> web.StreamResponse:
    body = parse(OllamaCreateRequest, await read_json(request), "ollama.create")
    entry = await ollama_models.create(request.app[SERVICE], body.model, body.from_, body.template, body.settings())
    if not body.stream:
        return web.json_response({"status": "success", "model": entry.name})
    return web.Response(body=_line({"status": "success", "model": entry.name}), content_type="application/x-ndjson")
