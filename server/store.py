"""Stored Responses API responses: a bounded SQLite file in the user data dir, so a client can continue a
conversation by `previous_response_id`, also after a restart.

One row per response: the Response object as sent and the request's own input items (a conversation is the
chain of its rows through `previous`). The oldest rows go first once the rows exceed the byte bound. Every
call runs on the store's own thread (sqlite3 connections belong to the thread that made them), never on the
event loop.
"""
from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from engine.errors import NotFound

log = logging.getLogger("llamadesk.server")
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    previous TEXT,
    response TEXT NOT NULL,
    input TEXT NOT NULL,
    size INTEGER NOT NULL
)"""


@dataclass
class Stored:
    """One stored response: the Response object and the input items of its own request."""

    response: dict[str, Any]
    input: list[dict[str, Any]]


class ResponseStore:
    """The stored responses, at most max_bytes of them (0: nothing is kept). A file that cannot be opened or
    written costs the stored responses, never a request: the reply goes out, with a log line."""

    def __init__(self, path: Path, max_bytes: int):
        self.path = path
        self.max_bytes = max_bytes
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="response-store")
        self._db: sqlite3.Connection | None = None

    @property
    def enabled(self) -> bool:
        """Whether responses are kept (the bound is above 0 and the file is open)."""
        return self._db is not None

    def _call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return asyncio.wrap_future(self._pool.submit(fn, *args))

    async def open(self) -> None:
        """Open (or create) the file; a file that is no database is set aside and a new one started."""
        if self.max_bytes <= 0:
            return
        try:
            await self._call(self._open)
        except (OSError, sqlite3.Error) as e:
            log.warning("the response store %s cannot be opened (%s): responses are not kept", self.path, e)

    async def close(self) -> None:
        """Close the file and the store's thread (a second call does nothing)."""
        if self._db is not None:
            await self._call(self._close)
        self._pool.shutdown(wait=False)  # idle now: its thread ends without blocking the loop

    async def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        """Keep a response and its request's input items, evicting the oldest beyond the bound."""
        if self._db is None:
            return
        try:
            await self._call(self._put, response, input_items)
        except sqlite3.Error as e:
            log.warning("response %s could not be stored (%s)", response["id"], e)

    async def get(self, rid: str) -> Stored:
        """The stored response rid (NotFound if it is not kept)."""
        return await self._call(self._get, rid)

    async def delete(self, rid: str) -> None:
        """Forget response rid (NotFound if it is not kept)."""
        await self._call(self._delete, rid)

    async def conversation(self, rid: str) -> list[dict[str, Any]]:
        """Every item of the conversation up to and with response rid: each turn's input, then its output, from
        the first turn on (NotFound, naming it, if a turn is no longer kept)."""
        return await self._call(self._conversation, rid)

    # ---- on the store's thread -------------------------------------------------------------------

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as e:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.warning("the response store %s cannot be read (%s): set aside as %s, starting a new one",
                        self.path, e, aside.name)
            self.path.replace(aside)
            for suffix in ("-wal", "-shm"):
                self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)
            self._db = self._connect()
        count, size = self._db.execute("SELECT count(*), total(size) FROM responses").fetchone()
        log.info("response store: %s (%d responses, %.1f MB)", self.path, count, size / 2**20)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; a power cut may lose the last writes
            db.execute(_SCHEMA)
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def _close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def _put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        body, items = json.dumps(response, ensure_ascii=False), json.dumps(input_items, ensure_ascii=False)
        size = len(body) + len(items)
        with self._db as db:  # one transaction: the row and the evictions it makes
            db.execute("INSERT OR REPLACE INTO responses (id, previous, response, input, size) VALUES (?, ?, ?, ?, ?)",
                       (response["id"], response.get("previous_response_id"), body, items, size))
            self._evict(db)

    def _evict(self, db: sqlite3.Connection) -> None:
        """Delete the oldest rows until the rest fit the bound."""
        excess = db.execute("SELECT total(size) FROM responses").fetchone()[0] - self.max_bytes
        if excess <= 0:
            return
        last, freed = None, 0
        for seq, size in db.execute("SELECT seq, size FROM responses ORDER BY seq"):
            last, freed = seq, freed + size
            if freed >= excess:
                break
        db.execute("DELETE FROM responses WHERE seq <= ?", (last,))

    def _row(self, rid: str) -> tuple[str, str]:
        row = self._db.execute("SELECT response, input FROM responses WHERE id = ?", (rid,)).fetchone() \
            if self._db is not None else None
        if row is None:
            raise NotFound(f"no stored response with id '{rid}'" + ("" if self._db is not None else
                           " (no responses are kept: responses_store_mb is 0, or the store could not be opened)"))
        return row

    def _get(self, rid: str) -> Stored:
        response, items = self._row(rid)
        return Stored(json.loads(response), json.loads(items))

    def _delete(self, rid: str) -> None:
        self._row(rid)
        with self._db as db:
            db.execute("DELETE FROM responses WHERE id = ?", (rid,))

    def _conversation(self, rid: str) -> list[dict[str, Any]]:
        turns: list[Stored] = []
        at: str | None = rid
        while at is not None:  # ids are made here and never reused: a chain has no cycle
            try:
                turns.append(self._get(at))
            except NotFound:
                if at == rid:
                    raise
                raise NotFound(f"response '{at}', an earlier turn of the conversation of '{rid}', is no longer "
                               "stored: it was deleted, or evicted (the oldest responses go beyond "
                               "responses_store_mb)") from None
            at = turns[-1].response.get("previous_response_id")
        return [item for turn in reversed(turns) for item in (*turn.input, *turn.response["output"])]
