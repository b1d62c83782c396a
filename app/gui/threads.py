"""The Chat panel's conversations: one SQLite file in the user data dir, so every thread is kept as it goes
and the last one reopens after a restart.

A thread is a row (title, system prompt, model); its messages are rows in order; a small key/value table keeps
the panel's state (the last thread, the custom system prompt). Calls are short, local transactions made when a
turn starts or ends, on a rename or a delete (never per streamed token). No Qt here: the store is plain data.
"""
from __future__ import annotations

import json
import logging
import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from engine.config import APP_NAME

log = logging.getLogger("llamadesk.gui")

DEFAULT_TITLE = "New chat"
TITLE_CHARS = 60

_SCHEMA = """
CREATE TABLE IF NOT EXISTS threads (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    renamed INTEGER NOT NULL DEFAULT 0,
    system TEXT NOT NULL DEFAULT '',
    model TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    thread INTEGER NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '',
    images TEXT,
    PRIMARY KEY (thread, seq)
);
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Thread:
    """One conversation as the sidebar lists it."""

    id: int
    title: str
    system: str
    model: str | None
    created: float
    updated: float


def default_path() -> Path:
    """chats.sqlite3 in the platform's user data dir (beside the stored responses and the models)."""
    return Path(platformdirs.user_data_dir(APP_NAME)) / "chats.sqlite3"


def title_from(messages: list[dict[str, Any]]) -> str:
    """A thread's automatic title: the first line of its first user message, shortened."""
    first = next((m["content"] for m in messages if m["role"] == "user" and m["content"].strip()), "")
    line = re.sub(r"\s+", " ", first.strip().splitlines()[0]) if first.strip() else ""
    if not line:
        return DEFAULT_TITLE
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1].rstrip() + "…"


def _like(query: str) -> str:
    """query as a LIKE pattern matching it anywhere, its own % and _ taken literally."""
    return "%" + re.sub(r"([\\%_])", r"\\\1", query) + "%"


class ThreadStore:
    """The saved conversations. A file that cannot be opened leaves the store in memory (with a log line and
    `problem` set): the chat keeps working, its threads are just not kept."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.problem: str | None = None
        try:
            self._db = self._open(self.path)
        except (OSError, sqlite3.Error) as e:
            self.problem = f"chats are not saved: {self.path} cannot be opened ({e})"
            log.warning("%s", self.problem)
            self._db = self._connect(":memory:")

    # ---- opening -------------------------------------------------------------------------------

    def _open(self, path: Path) -> sqlite3.Connection:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return self._connect(str(path))
        except sqlite3.DatabaseError as e:  # not a database: set it aside rather than lose the app's chat
            aside = path.with_name(path.name + ".corrupt")
            log.warning("the chat store %s cannot be read (%s): set aside as %s, starting a new one", path, e,
                        aside.name)
            path.replace(aside)
            for suffix in ("-wal", "-shm"):
                path.with_name(path.name + suffix).unlink(missing_ok=True)
            return self._connect(str(path))

    @staticmethod
    def _connect(where: str) -> sqlite3.Connection:
        db = sqlite3.connect(where)
        try:
            db.execute("PRAGMA foreign_keys=ON")
            if where != ":memory:":
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")  # WAL stays consistent; a power cut may lose the last turn
            db.executescript(_SCHEMA)
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def close(self) -> None:
        """Close the file (a second call does nothing)."""
        if self._db is not None:
            self._db.close()
            self._db = None

    # ---- threads -------------------------------------------------------------------------------

    def create(self, system: str = "", model: str | None = None) -> Thread:
        """A new, empty thread (listed first)."""
        now = time.time()
        with self._db as db:
            cur = db.execute("INSERT INTO threads (title, system, model, created, updated) VALUES (?, ?, ?, ?, ?)",
                             (DEFAULT_TITLE, system, model, now, now))
        return self.get(cur.lastrowid)

    def get(self, tid: int) -> Thread | None:
        """Thread tid, or None when there is none."""
        row = self._db.execute("SELECT id, title, system, model, created, updated FROM threads WHERE id = ?",
                               (tid,)).fetchone()
        return Thread(*row) if row else None

    def threads(self, query: str = "") -> list[Thread]:
        """Every thread, the most recently used first; with a query, those whose title or a message contains it
        (case-insensitive for ASCII letters)."""
        sql = "SELECT id, title, system, model, created, updated FROM threads"
        args: tuple = ()
        if query.strip():
            sql += (" WHERE title LIKE ?1 ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m WHERE m.thread = threads.id"
                    " AND m.content LIKE ?1 ESCAPE '\\')")
            args = (_like(query.strip()),)
        return [Thread(*row) for row in self._db.execute(sql + " ORDER BY updated DESC, id DESC", args)]

    def rename(self, tid: int, title: str) -> None:
        """Give thread tid a title of the user's (no longer taken from its first message)."""
        title = re.sub(r"\s+", " ", title).strip()
        if not title:
            return
        with self._db as db:
            db.execute("UPDATE threads SET title = ?, renamed = 1 WHERE id = ?", (title, tid))

    def delete(self, tid: int) -> None:
        """Forget thread tid and its messages."""
        with self._db as db:
            db.execute("DELETE FROM threads WHERE id = ?", (tid,))

    # ---- messages ------------------------------------------------------------------------------

    def messages(self, tid: int) -> list[dict[str, Any]]:
        """Thread tid's messages in order: {"role", "content", "meta"} (and "images", data URLs, when any)."""
        out = []
        for role, content, meta, images in self._db.execute(
                "SELECT role, content, meta, images FROM messages WHERE thread = ? ORDER BY seq", (tid,)):
            m = {"role": role, "content": content, "meta": meta}
            if images:
                m["images"] = json.loads(images)
            out.append(m)
        return out

    def save(self, tid: int, messages: list[dict[str, Any]], system: str | None = None,
             model: str | None = None) -> bool:
        """Replace thread tid's messages (and its system prompt and model when given), in one transaction; an
        untitled thread takes its title from its first user message. False when the thread is gone."""
        with self._db as db:
            row = db.execute("SELECT renamed FROM threads WHERE id = ?", (tid,)).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM messages WHERE thread = ?", (tid,))
            db.executemany("INSERT INTO messages (thread, seq, role, content, meta, images) VALUES (?, ?, ?, ?, ?, ?)",
                           [(tid, i, m["role"], m["content"], m.get("meta") or "",
                             json.dumps(m["images"]) if m.get("images") else None) for i, m in enumerate(messages)])
            fields = {"updated": time.time()}
            if not row[0]:
                fields["title"] = title_from(messages)
            if system is not None:
                fields["system"] = system
            if model is not None:
                fields["model"] = model
            db.execute(f"UPDATE threads SET {', '.join(k + ' = ?' for k in fields)} WHERE id = ?",
                       (*fields.values(), tid))
        return True

    # ---- the panel's state -----------------------------------------------------------------------

    def state(self, key: str, default: str | None = None) -> str | None:
        """A value the panel kept (the last thread, the custom system prompt)."""
        row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def set_state(self, key: str, value: str) -> None:
        with self._db as db:
            db.execute("INSERT OR REPLACE INTO state (key, value) VALUES (?, ?)", (key, value))
