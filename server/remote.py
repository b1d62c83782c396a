"""The relay for remote models (engine/remote.py holds their replicas and the balancing policy).

A middleware looks at the three OpenAI generation routes before their handlers: a body whose "model" names a
remote roster entry is sent to one of that entry's replicas, with "model" rewritten to the upstream's id and the
entry's key (never the client's) as the bearer token; any other request goes on to its handler, which reads the
same cached body. A buffered answer is relayed whole; a stream event by event as the events arrive, and a client
that goes away closes the upstream connection, which the upstream takes as a cancel. An attempt that fails before
anything was sent to the client is retried on another replica; after that the client gets an SSE error event.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from engine.errors import EngineStopped, UpstreamError
from engine.remote import Remotes, RemoteModel, Replica
from engine.system import VERSION
from server.errors import json_error, sse_error_event
from server.keys import CONFIG
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
        self._watcher = asyncio.ensure_future(self.remotes.watch(lambda m, r: _probe(self.session, m, r)))
        log.info("remote models: %s", ", ".join(f"{m.name} ({len(m.replicas)} replica(s))"
                                                for m in self.remotes.models.values()))

    async def close(self) -> None:
        """Stop the checks and close the session: relayed requests still running end now (a stream with an
        error event), so they never hold up the server's shutdown."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        if self.session is not None:
            await self.session.close()


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
    remote = relay.remotes.get(body.get("model"))
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
    hops = _hops(request)
    if hops >= MAX_HOPS:
        raise UpstreamError(f"remote model '{remote.name}': the request was relayed {hops} times already; does a "
                            "remote entry point back at a server that relays it?")
    payload = json.dumps({**body, "model": remote.remote_model}, ensure_ascii=False).encode()
    headers = {**_headers(remote), HOPS_HEADER: str(hops + 1)}
    tried: set[Replica] = set()
    failures: list[_Failed] = []
    while (replica := remote.pick(tried)) is not None:
        tried.add(replica)
        try:
            return await _attempt(request, session, remote, replica, payload, headers)
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
        return json_error(504, message, "server_error", None, "upstream_timeout")
    raise UpstreamError(message)


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


async def _attempt(request: web.Request, session: aiohttp.ClientSession, remote: RemoteModel, replica: Replica,
                   payload: bytes, headers: dict[str, str]) -> web.StreamResponse:
    """One replica's answer relayed to the client; _Failed when it failed before any byte reached the client."""
    url = replica.url + request.path.removeprefix("/v1")
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
                return await _answer(request, remote, replica, resp, started)
            except BaseException:  # the client went away, or the attempt failed: the upstream sees it close
                resp.close()
                raise
    finally:
        replica.outstanding -= 1


async def _answer(request: web.Request, remote: RemoteModel, replica: Replica, resp: aiohttp.ClientResponse,
                  started: float) -> web.StreamResponse:
    """The upstream's answer as ours: 5xx is a failed attempt; 4xx, 3xx and 2xx pass through as they are."""
    if resp.status >= 500:
        said = _upstream_message(await _read(resp, replica, remote))
        raise _Failed(replica, f"answered {resp.status}: {said}", takes_out=False)
    if resp.status == 200 and resp.content_type == "text/event-stream":
        return await _relay_stream(request, remote, replica, resp, started)
    body = await _read(resp, replica, remote)
    _served(replica, started)
    return web.Response(body=body, status=resp.status,
                        headers={"Content-Type": resp.headers.get("Content-Type", "application/json")})


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
