"""A real local HTTP file server for download tests: Range requests and injected faults.

It stands in for the model hubs, which these machines cannot reach.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Faults:
    """What to do wrong for one file."""

    cut_at: int | None = None  # drop the connection after sending this many bytes of the file (once)
    fail_first: int = 0  # answer 500 this many times first
    throttle_bps: int | None = None  # send at most this many bytes per second
    fake_length: int | None = None  # announce this Content-Length and send nothing


@dataclass
class FileServer:
    """Serves `files` (name -> bytes) at /<name> on a loopback port, in its own thread."""

    files: dict[str, bytes] = field(default_factory=dict)
    faults: dict[str, Faults] = field(default_factory=dict)
    requests: list[tuple[str, str | None, int]] = field(default_factory=list)  # (name, Range, status)

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/{name}", self._serve)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        rng = request.headers.get("Range")
        data = self.files.get(name)
        f = self.faults.setdefault(name, Faults())
        if data is None:
            self.requests.append((name, rng, 404))
            return web.Response(status=404, text="no such file")
        if f.fail_first > 0:
            f.fail_first -= 1
            self.requests.append((name, rng, 500))
            return web.Response(status=500, text="injected failure")
        start = 0
        if rng:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                self.requests.append((name, rng, 416))
                return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        status = 206 if rng else 200
        self.requests.append((name, rng, status))
        resp = web.StreamResponse(status=status)
        if f.fake_length is not None:
            resp.content_length = f.fake_length
            await resp.prepare(request)
            return resp
        body = data[start:]
        resp.content_length = len(body)
        if rng:
            resp.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        await resp.prepare(request)
        return await write_body(request, resp, data, start, f)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


async def write_body(request: web.Request, resp: web.StreamResponse, data: bytes, start: int,
                     f: Faults) -> web.StreamResponse:
    """Send data[start:] on a prepared response in 64 KiB steps, with f's cut and throttle."""
    sent, step = start, 64 * 1024
    while sent < len(data):
        end = min(sent + step, len(data))
        if f.cut_at is not None and sent < f.cut_at <= end:
            await resp.write(data[sent:f.cut_at])
            f.cut_at = None
            request.transport.close()  # drop the connection mid-body
            return resp
        await resp.write(data[sent:end])
        sent = end
        if f.throttle_bps:
            await asyncio.sleep(step / f.throttle_bps)
    await resp.write_eof()
    return resp
