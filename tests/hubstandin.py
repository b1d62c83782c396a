"""A local stand-in for the Hugging Face hub's API, which these machines cannot reach: the routes and answer
shapes huggingface_hub reads (search, tree with LFS sha256s and Link paging, resolve redirecting to a CDN path
that honours Range), gated repos (401 / 403 with X-Error-Code: GatedRepo), unknown repos (401 RepoNotFound, as
the hub answers without a token), and the fault injection of tests/fileserver.py.
"""
from __future__ import annotations

import asyncio
import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tests.fileserver import Faults, write_body


@dataclass
class Repo:
    """One model repo: its files (path -> bytes) and what the API says about it."""

    files: dict[str, bytes]
    downloads: int = 0
    likes: int = 0
    tags: list[str] = field(default_factory=lambda: ["gguf", "text-generation"])
    gated: bool = False
    reported_sha256: dict[str, str] = field(default_factory=dict)  # path -> the (wrong) sha256 the tree reports
    reported_size: dict[str, int] = field(default_factory=dict)  # path -> the size the tree reports (never fetched)
    in_git: tuple[str, ...] = ("README.md",)  # small files kept in git: no lfs block in the tree
    page_size: int = 1000  # the tree's entries per page (the hub's is 1000 for recursive listings)


@dataclass
class HubStandIn:
    """Serves repos (id -> Repo) on a loopback port, in its own thread; token opens gated repos."""

    repos: dict[str, Repo] = field(default_factory=dict)
    token: str = "hf_standin_token"
    faults: dict[str, Faults] = field(default_factory=dict)  # "repo/path" -> faults of its download
    requests: list[dict] = field(default_factory=list)  # {method, path, query, range, auth, status}

    def __post_init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/api/models", self._search)
        app.router.add_get("/api/models/{owner}/{name}/tree/{rev}", self._tree)
        app.router.add_route("*", "/{owner}/{name}/resolve/{rev}/{path:.+}", self._resolve)
        app.router.add_get("/cdn/{owner}/{name}/{path:.+}", self._cdn)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        cdn = web.TCPSite(self.runner, "127.0.0.1", 0)  # another origin, as the hub's CDN is another host
        self.loop.run_until_complete(cdn.start())
        self.cdn_port = cdn._server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sha256(self, repo: str, path: str) -> str:
        return hashlib.sha256(self.repos[repo].files[path]).hexdigest()

    def fetched(self, repo: str, path: str) -> list[dict]:
        """The requests for a file's bytes (GETs on the CDN's side of resolve)."""
        return [r for r in self.requests if r["path"] == f"/cdn/{repo}/{path}" and r["method"] == "GET"]

    @web.middleware
    async def _record(self, request: web.Request, handler) -> web.StreamResponse:
        entry = {"method": request.method, "path": request.path, "query": dict(request.query),
                 "range": request.headers.get("Range"), "auth": request.headers.get("Authorization"), "status": None}
        self.requests.append(entry)
        try:
            resp = await handler(request)
        except web.HTTPException as e:  # the redirects
            entry["status"] = e.status
            raise
        entry["status"] = resp.status
        return resp

    async def _search(self, request: web.Request) -> web.Response:
        words = request.query.get("search", "").lower()
        want = request.query.get("filter")
        found = [(rid, r) for rid, r in self.repos.items()
                 if words in rid.lower() and (not want or want in r.tags)]
        found.sort(key=lambda x: -x[1].downloads)
        limit = int(request.query.get("limit", "1000"))
        return web.json_response([{"_id": f"{i:024x}", "id": rid, "modelId": rid, "likes": r.likes,
                                   "downloads": r.downloads, "private": False, "tags": r.tags,
                                   "pipeline_tag": "text-generation", "library_name": "gguf",
                                   "createdAt": "2025-01-01T00:00:00.000Z"}
                                  for i, (rid, r) in enumerate(found[:limit])])

    def _repo(self, request: web.Request) -> tuple[str, Repo | None]:
        rid = f"{request.match_info['owner']}/{request.match_info['name']}"
        return rid, self.repos.get(rid)

    async def _tree(self, request: web.Request) -> web.Response:
        rid, repo = self._repo(request)
        if repo is None:
            return _refuse(401, "RepoNotFound", "Repository not found")
        entries = []
        for path in sorted({p.rsplit("/", 1)[0] for p in repo.files if "/" in p}):
            entries.append({"type": "directory", "oid": "0" * 40, "size": 0, "path": path})
        for path, data in sorted(repo.files.items()):
            size = repo.reported_size.get(path, len(data))
            e = {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": size, "path": path}
            if path not in repo.in_git:
                e["lfs"] = {"oid": repo.reported_sha256.get(path, hashlib.sha256(data).hexdigest()), "size": size,
                            "pointerSize": 134}
            entries.append(e)
        start = int(request.query.get("cursor", "0"))
        page = entries[start:start + repo.page_size]
        headers = {}
        if start + repo.page_size < len(entries):
            nxt = request.url.with_query({"recursive": "true", "cursor": str(start + repo.page_size)})
            headers["Link"] = f'<{nxt}>; rel="next"'
        return web.json_response(page, headers=headers)

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        rid, repo = self._repo(request)
        path = request.match_info["path"]
        if repo is None:
            return _refuse(401, "RepoNotFound", "Repository not found")
        if repo.gated:
            auth = request.headers.get("Authorization")
            if auth is None:
                return _refuse(401, "GatedRepo", "Access to model is restricted. You must be authenticated.")
            if auth != f"Bearer {self.token}":
                return _refuse(403, "GatedRepo", "Access to model is restricted and you are not in the authorized "
                                                 "list.")
        if path not in repo.files:
            return _refuse(404, "EntryNotFound", "Entry not found")
        # the hub answers an LFS file with a redirect to its CDN, another origin (so the token is not sent on)
        raise web.HTTPFound(f"http://127.0.0.1:{self.cdn_port}/cdn/{rid}/{path}")

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        rid, repo = self._repo(request)
        path = request.match_info["path"]
        data = repo.files[path] if repo is not None else None
        if data is None:
            return web.Response(status=404, text="no such object")
        return await send(request, data, self.faults.setdefault(f"{rid}/{path}", Faults()))

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _refuse(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status,
                             headers={"X-Error-Code": code, "X-Error-Message": message})


async def send(request: web.Request, data: bytes, f: Faults) -> web.StreamResponse:
    """data, or the Range asked for, with f's faults (as tests/fileserver.py sends)."""
    if f.fail_first > 0:
        f.fail_first -= 1
        return web.Response(status=500, text="injected failure")
    rng = request.headers.get("Range")
    start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
    if rng and start >= len(data):
        return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
    resp = web.StreamResponse(status=206 if rng else 200)
    resp.content_length = len(data) - start
    if rng:
        resp.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
    if request.method == "HEAD":
        await resp.prepare(request)
        return resp
    await resp.prepare(request)
    return await write_body(request, resp, data, start, f)


def split_gguf(src: Path, dest: Path) -> list[Path]:
    """src rewritten as a two-part split GGUF (`<dest stem>-00001-of-00002.gguf`, …) with the `gguf` package's
    writer, as llama.cpp's gguf-split makes them (split.count / split.no / split.tensors.count in each part)."""
    import gguf
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dest, arch, split_max_tensors=(len(reader.tensors) + 1) // 2)
    for f in reader.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        kind = f.types[0]
        writer.add_key_value(f.name, f.contents(), kind,
                             sub_type=f.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    return sorted(dest.parent.glob(f"{dest.stem}-0*-of-*.gguf"))
