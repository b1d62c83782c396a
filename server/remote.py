"""The relay for remote models (engine/remote.py holds their replicas and the balancing policy), and their
replies to the translated routes (Responses, Messages, Ollama).

A middleware looks at the three OpenAI generation routes before their handlers: a body whose "model" names a
remote roster entry is sent to one of that entry's replicas, with "model" rewritten to the upstream's id and the
entry's key (never the client's) as the bearer token; any other request goes on to its handler, which reads the
same cached body. A buffered answer is relayed whole; a stream event by event as the events arrive, and a client
that goes away closes the upstream connection, which the upstream takes as a cancel. An attempt that fails before
anything was sent to the client is retried on another replica; after that the client gets an SSE error event.

The translated routes make a ChatRequest as for a local model; `chat` sends a remote one upstream as a streamed
chat completion through the same attempts, and its RemoteGeneration reads the chunks back into the engine's
events (content, reasoning, tool call start / arguments / end), which each route writes in its own shape.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import aiohttp
from aiohttp import web

from engine.config import ModelEntry
from engine.core.generation import Generation
from engine.errors import (EngineError, EngineStopped, InvalidRequest, ModelNotFound, PayloadTooLarge,
                           UpstreamError, UpstreamTimeout, UpstreamUnauthorized)
from engine.remote import Remotes, RemoteModel, Replica
from engine.requests import ChatRequest
from engine.system import VERSION
from engine.tools import Event, ReplyReader, new_call_id
from server.errors import sse_error_event
from server.keys import CONFIG, SERVICE
from server.schemas import read_json
from server.sse import open_stream

log = logging.getLogger("llamadesk.remote")

RELAYED_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/embeddings"))
CONNECT_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 5.0
HOPS_HEADER = "X-Llamadesk-Relay-Hops"  # llamadesks relaying to llamadesks count the hops...
MAX_HOPS = 8  # ...so that a roster pointing back at itself ends with a 502, not a pile of waiting relays


class Relay:
    """The remote models of one application, the one client session that reaches them, and their checks."""

    def __init__(self, remotes: Remotes):
        self.remotes = remotes
        self.session: aiohttp.ClientSession | None = None  # opened with the application, closed with it
        self._watcher: asyncio.Future | None = None

    async def open(self) -> None:
        if not self.remotes:
            return
        self.session = aiohttp.ClientSession(
            # identity: a compressed stream would reach the client only as fast as the decompressor lets it
            headers={"User-Agent": f"llamadesk/{VERSION}", "Accept-Encoding": "identity"})
        self._watch()
        log.info("remote models: %s", ", ".join(f"{m.name} ({len(m.replicas)} replica(s))"
                                                for m in self.remotes.models.values()))

    async def close(self) -> None:
        """Stop the checks and close the session: relayed requests still running end now (a stream with an
        error event), so they never hold up the server's shutdown."""
        await self._stop_watching()
        if self.session is not None:
            await self.session.close()

    async def refresh(self, entries: list[ModelEntry]) -> None:
        """Relay the roster's remote entries as they are now (one added or removed while serving): a model
        whose entry is unchanged keeps its replicas' health and counts, and requests being relayed go on."""
        fresh = Remotes.from_roster(entries)
        for name, m in fresh.models.items():
            old = self.remotes.models.get(name)
            if old is not None and old.same_upstream(m):
                fresh.models[name] = old
        await self._stop_watching()
        self.remotes = fresh
        if self.session is None or self.session.closed:
            await self.open()
        elif self.remotes:
            self._watch()

    def _watch(self) -> None:
        self._watcher = asyncio.ensure_future(self.remotes.watch(lambda m, r: _probe(self.session, m, r)))

    async def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None


RELAY = web.AppKey("remote_relay", Relay)


def install(app: web.Application) -> None:
    """The remote models of the roster, with their client session and health checks tied to the app's
    lifetime (register `remote_middleware` too)."""
    relay = app[RELAY] = Relay(Remotes.from_roster(app[CONFIG].models))

    async def lifetime(app: web.Application):
        await relay.open()
        yield
        await relay.close()

    async def on_shutdown(app: web.Application) -> None:  # before the server waits for running handlers
        await relay.close()
    app.cleanup_ctx.append(lifetime)
    app.on_shutdown.append(on_shutdown)


async def refresh(app: web.Application) -> None:
    """Pick up remote roster entries added or removed since the server started (the Models panel's "Add remote
    server…"), without stopping it."""
    await app[RELAY].refresh(app[CONFIG].models)


def model_cards(app: web.Application) -> list[dict[str, Any]]:
    """The remote models as /v1/models lists them: id, object, created, owned_by and backend "remote",
    remote_model, healthy (any replica in service) and replicas [{url, healthy, last_error}]."""
    return app[RELAY].remotes.cards()


def remote_stats(app: web.Application) -> list[dict[str, Any]]:
    """Per remote model: id, remote_model, outstanding, requests, errors (summed) and replicas [{url, healthy,
    last_error, outstanding, requests, errors, latency_ms {avg, p50, p95}}]."""
    return app[RELAY].remotes.stats()


@web.middleware
async def remote_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Relay a generation request naming a remote model; let every other request through."""
    relay = request.app[RELAY]
    if request.method != "POST" or request.path not in RELAYED_PATHS or not relay.remotes:
        return await handler(request)
    body = await read_json(request)  # the handler's own read_json gets the same bytes: request.read() caches
    remote = _target(request.app, body.get("model"))
    if remote is None:
        return await handler(request)
    return await _forward(request, relay.session, remote, body)


@dataclass(eq=False)
class _Failed(Exception):
    """An attempt on one replica that failed before anything reached the client."""

    replica: Replica
    reason: str
    timed_out: bool = False
    takes_out: bool = True  # the replica is unreachable (not merely answering an error)


async def _forward(request: web.Request, session: aiohttp.ClientSession, remote: RemoteModel,
                   body: dict[str, Any]) -> web.StreamResponse:
    """The body relayed to one of remote's replicas, and its answer to the client as it is."""
    payload = json.dumps({**body, "model": remote.remote_model}, ensure_ascii=False).encode()
    return await _relayed(session, remote, request.path.removeprefix("/v1"), payload, _hops(request),
                          lambda resp, replica, started: _answer(request, remote, replica, resp, started))


T = TypeVar("T")
Answer = Callable[[aiohttp.ClientResponse, Replica, float], Awaitable[T]]  # an upstream's response, read


async def _relayed(session: aiohttp.ClientSession, remote: RemoteModel, path: str, payload: bytes, hops: int,
                   answer: Answer[T]) -> T:
    """What answer makes of the first replica's response that does not fail before reaching the client: the
    replicas are tried in pick order; UpstreamTimeout or UpstreamError when none is left."""
    if hops >= MAX_HOPS:
        raise UpstreamError(f"remote model '{remote.name}': the request was relayed {hops} times already; does a "
                            "remote entry point back at a server that relays it?")
    headers = {**_headers(remote), HOPS_HEADER: str(hops + 1)}
    tried: set[Replica] = set()
    failures: list[_Failed] = []
    while (replica := remote.pick(tried)) is not None:
        tried.add(replica)
        try:
            return await _attempt(session, remote, replica, path, payload, headers, answer)
        except _Failed as f:
            failures.append(f)
            replica.errors += 1
            if f.takes_out:
                replica.fail(f.reason, time.monotonic())
            log.warning("remote model %s: %s %s%s", remote.name, replica.url, f.reason,
                        "; trying another replica" if len(tried) < len(remote.replicas) else "")
    said = "; ".join(f"{f.replica.url} {f.reason}" for f in failures) or "it has no replica"
    message = f"remote model '{remote.name}' is unavailable: {said}"
    if failures and failures[-1].timed_out:
        raise UpstreamTimeout(message)
    raise UpstreamError(message)


def _target(app: web.Application, model: Any) -> RemoteModel | None:
    """The remote model a request's "model" means: the one it names, or when it names none (absent or empty)
    the default model when that is a remote one."""
    if model is None or model == "":
        model = app[SERVICE].roster.default_id
    return app[RELAY].remotes.get(model)


def _hops(request: web.Request) -> int:
    try:
        return max(int(request.headers.get(HOPS_HEADER, "0")), 0)
    except ValueError:
        return 0


def _headers(remote: RemoteModel) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if remote.api_key:
        headers["Authorization"] = f"Bearer {remote.api_key}"
    return headers


async def _attempt(session: aiohttp.ClientSession, remote: RemoteModel, replica: Replica, path: str,
                   payload: bytes, headers: dict[str, str], answer: Answer[T]) -> T:
    """One replica's response, read by answer; _Failed when it failed before any byte reached the client."""
    url = replica.url + path
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=remote.timeout_s)
    if session.closed:
        raise EngineStopped("the server is shutting down")
    started = time.monotonic()
    replica.outstanding += 1
    replica.requests += 1
    try:
        try:
            resp = await session.post(url, data=payload, headers=headers, timeout=timeout,
                                      allow_redirects=False)
        except (TimeoutError, aiohttp.ClientError) as e:
            raise _failure(replica, e, remote) from None
        async with resp:
            try:
                return await answer(resp, replica, started)
            except BaseException:  # the client went away, or the attempt failed: the upstream sees it close
                resp.close()
                raise
    finally:
        replica.outstanding -= 1


async def _answer(request: web.Request, remote: RemoteModel, replica: Replica, resp: aiohttp.ClientResponse,
                  started: float) -> web.StreamResponse:
    """The upstream's answer as ours: 5xx is a failed attempt; 4xx, 3xx and 2xx pass through as they are."""
    await _refuse_5xx(resp, replica, remote)
    if resp.status == 200 and resp.content_type == "text/event-stream":
        return await _relay_stream(request, remote, replica, resp, started)
    body = await _read(resp, replica, remote)
    _served(replica, started)
    return web.Response(body=body, status=resp.status,
                        headers={"Content-Type": resp.headers.get("Content-Type", "application/json")})


async def _refuse_5xx(resp: aiohttp.ClientResponse, replica: Replica, remote: RemoteModel) -> None:
    """_Failed for a 5xx answer: the attempt failed, the next replica may serve it."""
    if resp.status >= 500:
        said = _upstream_message(await _read(resp, replica, remote))
        raise _Failed(replica, f"answered {resp.status}: {said}", takes_out=False)


async def _read(resp: aiohttp.ClientResponse, replica: Replica, remote: RemoteModel) -> bytes:
    try:
        return await resp.read()
    except (TimeoutError, aiohttp.ClientError) as e:
        raise _failure(replica, e, remote) from None


def _served(replica: Replica, started: float) -> None:
    """The replica's answer began to reach the client: its latency, and it is in service."""
    now = time.monotonic()
    replica.latency_ms.append((now - started) * 1000)
    if not replica.in_service:
        replica.recover(now)


async def _relay_stream(request: web.Request, remote: RemoteModel, replica: Replica,
                        resp: aiohttp.ClientResponse, started: float) -> web.StreamResponse:
    """Relay the upstream's SSE events as they arrive, whole events only (so an error event after a broken
    stream is never glued to half of one). Until the first event is sent a failure is _Failed, after it the
    client gets the error event."""
    stream: web.StreamResponse | None = None
    pending = b""
    while True:
        try:
            data = await resp.content.readany()
        except (TimeoutError, aiohttp.ClientError) as e:
            failure = _failure(replica, e, remote)
            if stream is None:
                raise failure from None
            replica.errors += 1
            replica.fail(failure.reason, time.monotonic())
            log.warning("remote model %s: %s %s mid-stream", remote.name, replica.url, failure.reason)
            await stream.write(sse_error_event(UpstreamError(
                f"remote model '{remote.name}': {replica.url} {failure.reason} mid-stream")))
            return stream
        if not data:
            break
        events, pending = _whole_events(pending + data)
        if events:
            stream = stream or await _open(request, replica, started)
            await stream.write(events)
    stream = stream or await _open(request, replica, started)
    if pending:  # a last event without its blank line
        await stream.write(pending)
    return stream


async def _open(request: web.Request, replica: Replica, started: float) -> web.StreamResponse:
    _served(replica, started)
    return await open_stream(request)


def _whole_events(buf: bytes) -> tuple[bytes, bytes]:
    """(the complete SSE events at the start of buf, the rest)."""
    lf, crlf = buf.rfind(b"\n\n"), buf.rfind(b"\r\n\r\n")
    cut = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    return buf[:cut], buf[cut:]


def _failure(replica: Replica, e: BaseException, remote: RemoteModel) -> _Failed:
    """What a client-side exception says about the replica, in words for the error message."""
    if isinstance(e, aiohttp.ConnectionTimeoutError):
        return _Failed(replica, f"did not accept a connection within {CONNECT_TIMEOUT_S:g} s", timed_out=True)
    if isinstance(e, TimeoutError):
        return _Failed(replica, f"sent nothing for {remote.timeout_s:g} s (timeout)", timed_out=True)
    if isinstance(e, aiohttp.ClientConnectorError):
        return _Failed(replica, f"could not be reached ({e.os_error.strerror or e.os_error})")
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return _Failed(replica, "closed the connection")
    if isinstance(e, aiohttp.ClientPayloadError):
        return _Failed(replica, "broke off its answer")
    return _Failed(replica, f"failed ({type(e).__name__}: {e})")


def _upstream_message(raw: bytes) -> str:
    """The message of an upstream's error body (OpenAI's {"error": {"message"}}, FastAPI's {"detail"}), else
    its start."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"][:300]
        for said in (err, body.get("detail"), body.get("message")):
            if isinstance(said, str):
                return said[:300]
    return raw[:300].decode("utf-8", "replace").strip() or "(no body)"


async def _probe(session: aiohttp.ClientSession, remote: RemoteModel, replica: Replica) -> str | None:
    """A replica's health check, GET {url}/models: None when it answers (below 500), else why not."""
    timeout = aiohttp.ClientTimeout(total=min(PROBE_TIMEOUT_S, remote.timeout_s))
    try:
        async with session.get(replica.url + "/models", headers=_headers(remote), timeout=timeout,
                               allow_redirects=False) as resp:
            await resp.read()
    except TimeoutError:
        return f"GET /models sent nothing for {timeout.total:g} s"
    except aiohttp.ClientError as e:
        return "GET /models: " + _failure(replica, e, remote).reason
    return None if resp.status < 500 else f"GET /models answered {resp.status}"


# ---- remote models through the translations (Responses, Messages, Ollama) ----------------------------------

async def chat(request: web.Request, req: ChatRequest, stream: bool) -> list[Generation | RemoteGeneration]:
    """The generation of a chat request a translation made: the engine's for a local model; for a remote one the
    upstream's reply to it as chat completions (streamed when the client's is, so that a buffered reply is the
    upstream's buffered one, calls and all), read back into the engine's events."""
    remote = _target(request.app, req.model)
    if remote is None:
        return await request.app[SERVICE].chat(req)
    gen = RemoteGeneration(remote)
    payload = json.dumps(upstream_body(req, remote, stream), ensure_ascii=False).encode()
    await gen.start(_session(request), payload, _hops(request))
    return [gen]


async def embed(request: web.Request, model: str | None, texts: list[str],
                keep_alive: Any) -> tuple[str, list[list[float]], int]:
    """(model id, vectors, prompt tokens) for texts, as the engine's embed answers: a remote model's from its
    upstream's /embeddings (for the Ollama routes, whose shapes are not OpenAI's)."""
    remote = _target(request.app, model)
    if remote is None:
        return await request.app[SERVICE].embed(model, texts, keep_alive)
    payload = json.dumps({"model": remote.remote_model, "input": texts}, ensure_ascii=False).encode()
    doc = await _relayed(_session(request), remote, "/embeddings", payload, _hops(request),
                         lambda resp, replica, started: _json_answer(resp, replica, remote, started))
    try:
        rows = sorted(doc["data"], key=lambda d: d.get("index", 0))
        vectors = [[float(x) for x in row["embedding"]] for row in rows]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UpstreamError(f"remote model '{remote.name}': the upstream's answer is not a list of embeddings "
                            "(is its url an OpenAI-compatible /v1?)") from None
    if len(vectors) != len(texts):
        raise UpstreamError(f"remote model '{remote.name}': the upstream sent {len(vectors)} embeddings for "
                            f"{len(texts)} texts")
    return remote.name, vectors, int((doc.get("usage") or {}).get("prompt_tokens") or 0)


async def _json_answer(resp: aiohttp.ClientResponse, replica: Replica, remote: RemoteModel,
                       started: float) -> dict[str, Any]:
    """An upstream's JSON answer (its refusal as ours when it refused)."""
    await _refuse(resp, replica, remote)
    raw = await _read(resp, replica, remote)
    _served(replica, started)
    return _upstream_json(raw, remote, "a JSON object")


def _upstream_json(raw: bytes, remote: RemoteModel, expected: str) -> dict[str, Any]:
    """An upstream's JSON object; UpstreamError for anything else (what was expected, and what came)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise UpstreamError(f"remote model '{remote.name}': the upstream sent {raw[:80]!r}, not {expected} (is its "
                            "url an OpenAI-compatible /v1?)")
    return doc


def _session(request: web.Request) -> aiohttp.ClientSession:
    session = request.app[RELAY].session
    if session is None or session.closed:
        raise EngineStopped("the server is shutting down")
    return session


def reply_reader(gen: Generation | RemoteGeneration, streaming: bool) -> ReplyReader | RemoteReader:
    """What reads a generation's output as events: the engine's parsers for a local one; a remote one comes
    parsed (the upstream split its own reasoning and tool calls)."""
    return gen.reader if isinstance(gen, RemoteGeneration) else ReplyReader(gen.reading, streaming)


def is_remote(request: web.Request, model: Any) -> bool:
    """Whether model names a remote roster entry."""
    return request.app[RELAY].remotes.get(model) is not None


def upstream_body(req: ChatRequest, remote: RemoteModel, stream: bool) -> dict[str, Any]:
    """The chat-completions body a ChatRequest amounts to (a stream with its usage); fields at their defaults
    stay out, so that an upstream of another kind reads only what was asked."""
    s = req.sampling
    fmt = req.response_format
    optional = {
        "max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": None if s.top_p == 1 else s.top_p,
        "top_k": s.top_k or None, "min_p": s.min_p or None, "seed": s.seed, "stop": s.stop or None,
        "presence_penalty": s.presence_penalty or None, "frequency_penalty": s.frequency_penalty or None,
        "repeat_penalty": None if s.repeat_penalty == 1 else s.repeat_penalty,
        "tools": req.tools, "tool_choice": req.tool_choice,
        "parallel_tool_calls": None if req.parallel_tool_calls else False,
        "response_format": fmt if fmt is None or fmt["type"] != "json_schema" else
        {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}},
        "chat_template_kwargs": req.template_kwargs or None}
    delivery = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    return {"model": remote.remote_model, "messages": req.messages, **delivery,
            **{k: v for k, v in optional.items() if v is not None}}


class _Deltas:
    """Chat-completion deltas as the engine's events: reasoning, content, and each tool call as its start (id
    and name), its argument fragments and its end."""

    def __init__(self) -> None:
        self.calls = 0  # calls started
        self._open: int | None = None  # the upstream's index of the call being streamed

    def events(self, delta: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        for kind, text in (("reasoning", delta.get("reasoning_content") or delta.get("reasoning")),
                           ("content", delta.get("content"))):
            if isinstance(text, str) and text:
                out += self.end() + [Event(kind, text)]
        for pos, call in enumerate(delta.get("tool_calls") or []):
            fn = call.get("function") or {}
            index = call.get("index", pos)
            if index != self._open:
                out += self.end()
                self._open = index
                self.calls += 1
                out.append(Event("tool_call_start", call={"id": call.get("id") or new_call_id(""),
                                                          "name": fn.get("name") or ""}, index=self.calls - 1))
            if fn.get("arguments"):
                args = fn["arguments"]  # a whole message's may be an object (Ollama's own shape)
                out.append(Event("tool_args", args if isinstance(args, str) else json.dumps(args),
                                 index=self.calls - 1))
        return out

    def end(self) -> list[Event]:
        """The open call's end, if one is open."""
        if self._open is None:
            return []
        self._open = None
        return [Event("tool_call_end", index=self.calls - 1)]


class RemoteReader:
    """ReplyReader's surface over a remote reply: the events its chunks delivered, in order."""

    parser = "upstream"  # not None: the routes take these events rather than reading the text as content
    cut_call = False  # a call cut by max_tokens ends with the reply; the finish reason says "length"

    def __init__(self) -> None:
        self.deltas = _Deltas()
        self.delivered: list[Event] = []

    @property
    def calls(self) -> int:
        return self.deltas.calls

    def events(self, text: str | None) -> list[Event]:
        """The events delivered since the last call (None: the reply ended; the open call closes)."""
        out, self.delivered = self.delivered, []
        return out + self.deltas.end() if text is None else out


class RemoteGeneration:
    """A remote model's reply to a translated chat request, with the surface the routes use on the engine's
    Generation (chunks, text, finish_reason, usage, cancel). The upstream's response is read by a task of its
    own, through the relay's replica pick and retries; start() returns once its first chunk arrived, so that a
    failure before it is the route's error response, in its protocol's shape."""

    reading = None  # the reader is the upstream's (reply_reader)
    stop_sequence = None  # chat completions do not say which stop string ended the text

    def __init__(self, remote: RemoteModel):
        self.remote = remote
        self.model = remote.name
        self.id = uuid.uuid4().hex
        self.created = int(time.time())
        self.prompt_tokens = 0  # until the upstream's usage arrives
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.error: EngineError | None = None
        self.reader = RemoteReader()
        self._pending: list[Event] = []
        self._ended = False
        self._wake = asyncio.Event()
        self._first: asyncio.Future | None = None
        self._task: asyncio.Future | None = None

    async def start(self, session: aiohttp.ClientSession, payload: bytes, hops: int) -> None:
        """Send the request and wait for the first chunk of the reply (UpstreamError, UpstreamTimeout or the
        upstream's refusal when it never came)."""
        self._first = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(_relayed(session, self.remote, "/chat/completions", payload, hops,
                                                    self._read))
        self._task.add_done_callback(self._done)
        try:
            await self._first
        except asyncio.CancelledError:  # the client went away before the reply began
            self.cancel()
            raise

    async def chunks(self) -> AsyncIterator[str]:
        """The content text of each delivery of events (the reader hands out the events themselves)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._pending:
                batch, self._pending = self._pending, []
                self.reader.delivered += batch
                yield "".join(e.text for e in batch if e.kind == "content")
            if self.error:
                raise self.error
            if self._ended:
                return

    async def text(self) -> str:
        """The whole content text (buffered mode)."""
        return "".join([c async for c in self.chunks()])

    def cancel(self) -> None:
        """Stop reading: the upstream connection closes, which the upstream takes as a cancel."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _read(self, resp: aiohttp.ClientResponse, replica: Replica, started: float) -> None:
        remote = self.remote
        await _refuse(resp, replica, remote)
        if resp.content_type != "text/event-stream":  # a buffered answer
            body = _upstream_json(await _read(resp, replica, remote), remote, "a chat completion")
            self._begun(replica, started)
            self._chunk({**body, "choices": [{**c, "delta": c.get("message") or {}} for c in body.get("choices", [])]})
            return
        try:
            async for line in resp.content:
                if line.startswith(b"data:") and (data := line[5:].strip()) != b"[DONE]":
                    self._begun(replica, started)
                    self._chunk(_upstream_json(data, remote, "a chat completion chunk"))
        except (TimeoutError, aiohttp.ClientError) as e:
            failure = _failure(replica, e, remote)
            if not self._first.done():
                raise failure from None
            replica.errors += 1
            replica.fail(failure.reason, time.monotonic())
            raise UpstreamError(f"remote model '{remote.name}': {replica.url} {failure.reason} mid-stream") from None

    def _begun(self, replica: Replica, started: float) -> None:
        if not self._first.done():
            _served(replica, started)
            self._first.set_result(None)

    def _chunk(self, chunk: dict[str, Any]) -> None:
        """One chat-completion chunk (or a whole completion, its message as the delta) taken in."""
        if isinstance(chunk.get("error"), dict):  # the upstream's error event
            raise UpstreamError(f"remote model '{self.remote.name}': {_upstream_message(json.dumps(chunk).encode())}")
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                self._pending += self.reader.deltas.events(choice.get("delta") or {})
                self.finish_reason = choice.get("finish_reason") or self.finish_reason
        if isinstance(chunk.get("usage"), dict):
            self.usage = _usage(chunk["usage"], chunk.get("timings"))
            self.prompt_tokens = self.usage["prompt_tokens"]
        self._wake.set()

    def _done(self, task: asyncio.Future) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None and not isinstance(error, EngineError):  # a chunk of a shape no upstream should send
            log.warning("remote model %s: unreadable reply", self.remote.name, exc_info=error)
            error = UpstreamError(f"remote model '{self.remote.name}': its reply could not be read "
                                  f"({type(error).__name__}: {error})")
        if not self._first.done():
            if error is not None:
                self._first.set_exception(error)
            else:
                self._first.set_result(None)  # a reply with no chunk: empty
        elif error is not None:
            self.error = error
        self.usage = self.usage or _usage({}, None)  # an upstream that sent none
        self._ended = True
        self._wake.set()


def _usage(u: dict[str, Any], timings: Any) -> dict[str, Any]:
    """An upstream's usage in the engine's terms (its own timings when it sent llama-server's)."""
    prompt, completion = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "cached_tokens": int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
           "timings": timings if isinstance(timings, dict) else {"prompt_n": prompt, "predicted_n": completion}}
    reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens")
    out["reasoning_tokens"] = reasoning if isinstance(reasoning, int) else 0  # not counted here: no tokenizer
    return out


_REFUSALS: dict[int, type[EngineError]] = {400: InvalidRequest, 422: InvalidRequest, 413: PayloadTooLarge,
                                           404: ModelNotFound, 401: UpstreamUnauthorized, 403: UpstreamUnauthorized}


async def _refuse(resp: aiohttp.ClientResponse, replica: Replica, remote: RemoteModel) -> None:
    """For an answer that is not a success: _Failed for a 5xx (the next replica may serve it), else the
    upstream's refusal as this server's error, with its param, code and type."""
    await _refuse_5xx(resp, replica, remote)
    if resp.status < 400:
        return
    raw = await _read(resp, replica, remote)
    said, fields = _upstream_model(_upstream_message(raw), remote), _error_fields(raw)
    error = _REFUSALS.get(resp.status, UpstreamError)(
        f"remote model '{remote.name}': {replica.url} answered {resp.status}: {said}", fields.get("param"))
    error.upstream_code, error.upstream_type = fields.get("code"), fields.get("type")  # classify() keeps them
    raise error


def _error_fields(raw: bytes) -> dict[str, str]:
    """The string fields of an upstream's OpenAI-shaped error body ({"error": {"param", "code", "type"...}})."""
    try:
        err = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return {}
    return {k: v for k, v in err.items() if isinstance(v, str)} if isinstance(err, dict) else {}


def _upstream_model(message: str, remote: RemoteModel) -> str:
    """An upstream's message with the model it names called the upstream's (its id is not one of ours)."""
    named = re.compile(r"(?<!upstream )\b([Mm])odel (['\"`]?)" + re.escape(remote.remote_model) + r"\2")
    return named.sub(lambda m: f"{'u' if m[1] == 'm' else 'U'}pstream model {m[2]}{remote.remote_model}{m[2]}",
                     message)
