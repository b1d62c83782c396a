"""Resumable, verified downloads of catalog entries: one at a time, the rest queued.

A download writes `<file>.part` in models_dir and resumes it with an HTTP Range request after
a dropped connection or an app restart. The sha256 is checked off the event loop before the
atomic rename into place; a `.sha256` sidecar records the verified hash. A mismatch deletes the
file. `.tar.bz2` speech archives are verified, checked member by member (no absolute paths,
no `..`, no links or devices), then unpacked into `models_dir/<name>/`.
"""
from __future__ import annotations

import asyncio
import errno
import hashlib
import logging
import os
import shutil
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable
from urllib.parse import urlsplit

import aiohttp

from engine.catalog.entries import Entry, sidecar_path
from engine.errors import Conflict, UpstreamError

log = logging.getLogger("llamadesk.downloads")
RETRY_STATUS = {408, 429, 500, 502, 503, 504}
BLOCK = 1 << 20


class DownloadError(UpstreamError):
    """A download failed for a reason worth telling the user (hash, space, HTTP, archive)."""


class DownloadConflict(Conflict):
    """The entry is already queued or downloading."""


@dataclass
class Download:
    """Progress of one entry's download, as /catalog and the Catalog panel show it."""

    name: str
    status: str = "queued"  # queued | downloading | verifying | extracting | done | failed | cancelled
    bytes: int = 0
    total: int = 0
    rate: float = 0.0  # bytes per second, recent
    error: str | None = None
    attempts: int = 0
    started: float = 0.0
    http_status: int | None = None  # the refusing answer's status, when the source refused (401 for a gated repo)

    @property
    def eta_s(self) -> float | None:
        if self.rate <= 0 or not self.total:
            return None
        return max(self.total - self.bytes, 0) / self.rate

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "bytes": self.bytes, "total": self.total,
                "rate": round(self.rate, 1), "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
                "error": self.error, "attempts": self.attempts}


class _Cancelled(Exception):
    pass


class Downloader:
    """Downloads catalog entries into models_dir, one at a time."""

    def __init__(self, models_dir: Path, mirror: str | None = None, retries: int = 5, backoff_s: float = 0.5,
                 on_change: Callable[[Download], None] | None = None):
        self.models_dir = Path(models_dir)
        self.mirror = mirror.rstrip("/") if mirror else None
        self.retries = retries
        self.backoff_s = backoff_s
        self.on_change = on_change
        self.downloads: dict[str, Download] = {}
        self._queue: asyncio.Queue[tuple[Entry, Download, str | None, dict[str, str]]] = asyncio.Queue()
        self._worker: asyncio.Task | None = None
        self._cancel: set[str] = set()
        self._session: aiohttp.ClientSession | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def url_for(self, e: Entry) -> str:
        """The entry's URL, or the same file name under the mirror base URL."""
        return f"{self.mirror}/{e.file}" if self.mirror else e.url

    def enqueue(self, e: Entry, url: str | None = None, headers: dict[str, str] | None = None) -> Download:
        """Queue an entry (DownloadConflict if it is already queued or running); url: fetch it from there rather
        than from url_for(e); headers: sent with each request (a hub token)."""
        cur = self.downloads.get(e.name)
        if cur and cur.status in ("queued", "downloading", "verifying", "extracting"):
            raise DownloadConflict(f"{e.name} is already {cur.status}")
        self._cancel.discard(e.name)
        d = Download(e.name)
        self.downloads[e.name] = d
        self._queue.put_nowait((e, d, url, dict(headers or {})))
        self._idle.clear()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="llamadesk-downloads")
        self._changed(d)
        return d

    def cancel(self, name: str) -> bool:
        """Stop a queued or running download; its partial file is removed."""
        d = self.downloads.get(name)
        if not d or d.status not in ("queued", "downloading", "verifying", "extracting"):
            return False
        self._cancel.add(name)
        if d.status == "queued":
            d.status = "cancelled"
            self._changed(d)
        return True

    async def wait_idle(self) -> None:
        """Until the queue is empty and nothing runs."""
        await self._idle.wait()

    async def close(self) -> None:
        """Stop the worker (a running download keeps its .part for the next start) and the session."""
        if self._worker:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        if self._session:
            await self._session.close()

    def _changed(self, d: Download) -> None:
        if self.on_change:
            self.on_change(d)

    async def _run(self) -> None:
        if self._session is None:
            # trust_env: HTTP(S)_PROXY / NO_PROXY from the environment are honoured.
            self._session = aiohttp.ClientSession(trust_env=True, timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=30, sock_read=60))
        while not self._queue.empty():
            e, d, url, headers = self._queue.get_nowait()
            if d.status == "cancelled":
                continue
            try:
                await self._download(e, d, url or self.url_for(e), headers)
                d.status = "done"
                log.info("downloaded and verified %s", e.name)
            except _Cancelled:
                d.status = "cancelled"
                _remove(self._part(e))
                log.info("download of %s cancelled", e.name)
            except DownloadError as err:
                d.status, d.error = "failed", err.message
                log.error("download of %s failed: %s", e.name, err.message)
            except OSError as err:
                d.status, d.error = "failed", f"cannot write {e.file}: {err.strerror or err}"
                log.error("download of %s failed: %s", e.name, d.error)
            self._cancel.discard(e.name)
            self._changed(d)
        self._idle.set()

    def _part(self, e: Entry) -> Path:
        return self.models_dir / (e.file + ".part")

    def _check(self, e: Entry) -> None:
        if e.name in self._cancel:
            raise _Cancelled()

    async def _download(self, e: Entry, d: Download, url: str, headers: dict[str, str]) -> None:
        self.models_dir.mkdir(parents=True, exist_ok=True)
        part = self._part(e)
        d.status, d.started = "downloading", time.monotonic()
        self._changed(d)
        while True:
            self._check(e)
            d.attempts += 1
            try:
                if await self._fetch(url, e, d, part, headers):
                    break
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as err:
                d.error = reason(err, url)  # shown while it retries, and as the failure when it gives up
                if d.attempts > self.retries:
                    raise DownloadError(f"{d.error} (tried {d.attempts} times)") from None
                log.warning("download of %s interrupted (%s); resuming", e.name, d.error)
            await asyncio.sleep(min(self.backoff_s * 2 ** (d.attempts - 1), 30))

        self._check(e)
        d.status = "verifying"
        self._changed(d)
        actual = await asyncio.to_thread(_sha256, part)
        if actual != e.sha256:
            _remove(part)
            raise DownloadError(f"sha256 mismatch for {e.name}: expected {e.sha256}, got {actual}; "
                                "the file was deleted")
        self._check(e)
        if e.is_archive:
            d.status = "extracting"
            self._changed(d)
            await asyncio.to_thread(extract_safely, part, e.local_path(self.models_dir))
            _remove(part)
        else:
            os.replace(part, e.local_path(self.models_dir))
        sidecar_path(e, self.models_dir).write_text(f"{e.sha256}  {e.local_path(Path('.')).name}\n")

    async def _fetch(self, url: str, e: Entry, d: Download, part: Path, extra: dict[str, str]) -> bool:
        """One HTTP attempt; True when the whole file is on disk, False to retry."""
        have = part.stat().st_size if part.exists() else 0
        headers = {**extra, **({"Range": f"bytes={have}-"} if have else {})}
        async with self._session.get(url, headers=headers) as r:
            if r.status == 416 and have:
                return True  # nothing left to fetch: the partial file is complete
            if r.status in RETRY_STATUS:
                if d.attempts > self.retries:
                    raise DownloadError(f"{url} answered HTTP {r.status} {d.attempts} times; giving up")
                log.warning("%s answered HTTP %d; retrying", url, r.status)
                return False
            if r.status not in (200, 206):
                d.http_status = r.status
                raise DownloadError(f"{url} answered HTTP {r.status} {r.reason}")
            if r.status == 206 and not (r.headers.get("Content-Range", "").startswith(f"bytes {have}-")):
                raise DownloadError(f"{url} sent a range that does not continue the partial file")
            if r.status == 200 and have:
                have = 0  # the server ignored the Range header: start over
            d.error = None  # bytes flow again: an earlier attempt's reason is over
            length = r.content_length
            total = have + length if length is not None else e.size
            d.total, d.bytes = total, have
            free = shutil.disk_usage(self.models_dir).free
            need = (total - have) + (total if e.is_archive else 0)  # an archive also needs room to unpack
            if need > free:
                raise DownloadError(f"not enough free space in {self.models_dir} for {e.name}: "
                                    f"needs {_gb(need)}, {_gb(free)} free")
            mode = "ab" if have else "wb"
            window: list[tuple[float, int]] = []
            with open(part, mode) as f:
                async for block in r.content.iter_chunked(BLOCK):
                    self._check(e)
                    await asyncio.to_thread(f.write, block)
                    d.bytes += len(block)
                    now = time.monotonic()
                    window.append((now, d.bytes))
                    window = [w for w in window if now - w[0] <= 3.0]
                    if len(window) > 1 and now > window[0][0]:
                        d.rate = (window[-1][1] - window[0][1]) / (now - window[0][0])
                    self._changed(d)
            if length is not None and d.bytes < total:
                raise aiohttp.ClientPayloadError(f"connection closed at {d.bytes} of {total} bytes")
            return True


_ERRNO_WORDS = {errno.ECONNREFUSED: "connection refused", errno.ENETUNREACH: "network unreachable",
                errno.EHOSTUNREACH: "host unreachable", errno.ETIMEDOUT: "timed out",
                errno.ECONNRESET: "connection reset"}


def reason(err: BaseException, url: str) -> str:
    """Why a request for url did not go through, in words a user reads (from the error's type and errno)."""
    host = urlsplit(url).hostname or url
    if isinstance(err, aiohttp.ClientConnectorDNSError):
        return f"Cannot reach {host}: its name does not resolve (offline?)"
    if isinstance(err, aiohttp.ClientConnectorError):
        code = err.os_error.errno
        words = _ERRNO_WORDS.get(code) or (os.strerror(code).lower() if code else str(err.os_error) or "no connection")
        return f"Cannot reach {host}: {words}"
    if isinstance(err, asyncio.TimeoutError):
        return f"{host} stopped answering (timed out)"
    if isinstance(err, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, ConnectionError)):
        return f"{host} dropped the connection"
    return f"the connection to {host} failed: {err or type(err).__name__}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def extract_safely(archive: Path, dest: Path) -> None:
    """Unpack a .tar.bz2 into dest, refusing the whole archive if any member could land outside it."""
    with tarfile.open(archive, "r:bz2") as tar:
        members = tar.getmembers()
        for m in members:
            p = PurePosixPath(m.name)
            if p.is_absolute() or ".." in p.parts or m.name.startswith(("/", "\\")) or ":" in p.parts[0]:
                raise DownloadError(f"refusing archive {archive.name}: member {m.name!r} points outside its folder")
            if not (m.isfile() or m.isdir()):
                raise DownloadError(f"refusing archive {archive.name}: member {m.name!r} is a link or device")
        tmp = dest.with_name(dest.name + ".unpacking")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            tar.extractall(tmp, members=members, filter="data")
            # sherpa-onnx archives hold one top folder: its contents become dest.
            entries = list(tmp.iterdir())
            root = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(root, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
