"""The host-RAM prompt cache: KV states of sequences whose cells were about to be given to an unrelated
prompt, kept by their tokens under a byte budget (LRU), so that a conversation evicted from the KV by
others comes back without prefilling its history again (llama-server's --cache-ram).

Across restarts: on a clean shutdown the entries are written to a folder per model file and KV type
(bounded by --cache-disk); the next start lists them (tokens only) and reads an entry's state from disk
when a prompt first uses it. A file that is truncated or not ours is skipped with a log line."""
from __future__ import annotations

import hashlib
import logging
import os
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.core.prefixindex import PrefixIndex, key_of

log = logging.getLogger("llamadesk.engine")
MIN_TOKENS = 32  # shorter prompts are cheaper to prefill than to save and restore
MAGIC = b"LDPC1\n"  # llamadesk prompt cache, format 1: magic, n_tokens (u32), state bytes (u64), tokens, state
_HEAD = struct.Struct("<IQ")


@dataclass
class Entry:
    tokens: tuple[int, ...]
    state: bytes | None  # None: still on disk (path), read when first used
    path: Path | None = None
    size: int = 0  # bytes of state
    key: str = ""  # the prefix index's key of tokens (set when the entry is added)


def model_key(path: Path, kv_dtype: str) -> str:
    """A folder name for a model file's cache: its size and a hash of its first and last MiB, and the KV type
    (a state is only valid for the same weights and KV layout)."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return f"{path.stem[:60]}-{h.hexdigest()[:16]}-{kv_dtype}"


class PromptCache:
    """KV states by token sequence, within budget bytes of RAM; the least recently used go first."""

    def __init__(self, budget: int, disk_dir: Path | None = None, disk_budget: int = 0):
        self.budget = budget
        self.disk_dir = disk_dir
        self.disk_budget = disk_budget
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # by index key, least recently used first
        self._index = PrefixIndex()
        self.bytes = 0  # of states held in RAM
        self.saves = self.hits = self.evictions = self.reused_tokens = 0
        self.disk_hits = self.disk_reused_tokens = self.disk_skipped = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __len__(self) -> int:
        return len(self._entries)

    def wants(self, tokens: list[int]) -> bool:
        """Whether tokens are worth saving: long enough, and not already held (or covered by a longer entry)."""
        if not self.enabled or len(tokens) < MIN_TOKENS:
            return False
        return self._index.covering(key_of(tokens)) is None

    def put(self, tokens: list[int], state: bytes) -> bool:
        """Keep state for tokens, evicting the least recently used to make room; False when it cannot fit."""
        if len(state) > self.budget:
            return False
        key = key_of(tokens)
        for k in self._index.prefixes_of(key):
            self._drop(k)  # a shorter prefix of this entry adds nothing
        self._make_room(len(state))
        self._add(Entry(tuple(tokens), state, size=len(state)), key)
        self.bytes += len(state)
        self.saves += 1
        return True

    def best(self, prompt: list[int]) -> tuple[Entry, int] | None:
        """The entry sharing the longest prefix with prompt, and that length (None when nothing is shared)."""
        if not prompt:
            return None
        found = self._index.longest(key_of(prompt))
        return (self._entries[found[0]], found[1]) if found is not None else None

    def state_of(self, e: Entry) -> bytes | None:
        """e's KV state, read from disk the first time (None, and the entry dropped, when the file is bad)."""
        if e.state is not None:
            return e.state
        try:
            state = _read(e.path, with_state=True)[1]
        except (OSError, ValueError) as err:
            log.warning("prompt cache: skipping %s: %s", e.path, err)
            self.disk_skipped += 1
            self._drop(e.key)
            return None
        self.disk_hits += 1
        if len(state) <= self.budget:  # kept in RAM from now on; larger than the budget: used, not kept
            self._make_room(len(state), keep=e.key)
            e.state = state
            self.bytes += len(state)
        return state

    def used(self, e: Entry, n: int, from_disk: bool = False) -> None:
        """e served n tokens of a prompt: it is the most recently used now."""
        self._entries.move_to_end(e.key)
        self.hits += 1
        self.reused_tokens += n
        if from_disk:
            self.disk_reused_tokens += n

    def _make_room(self, size: int, keep: str | None = None) -> None:
        while self.bytes + size > self.budget:
            victim = next((k for k, e in self._entries.items() if e.state is not None and k != keep), None)
            if victim is None:
                return
            self._drop(victim)
            self.evictions += 1

    def _add(self, e: Entry, key: str) -> None:
        e.key = key
        self._entries[key] = e
        self._index.add(key)

    def _drop(self, key: str) -> None:
        e = self._entries.pop(key)
        self._index.remove(key)
        if e.state is not None:
            self.bytes -= len(e.state)

    # ---- across restarts --------------------------------------------------------------------------

    def save_to_disk(self) -> int:
        """Write the entries, most recently used first, within the disk budget; older files go. Returns how
        many were written (blocking: at shutdown, off the event loop)."""
        if self.disk_dir is None or self.disk_budget <= 0:
            return 0
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        kept, used, written = set(), 0, 0
        for e in reversed(list(self._entries.values())):
            if used + e.size > self.disk_budget:
                continue
            name = hashlib.sha1(np.asarray(e.tokens, dtype="<i4").tobytes()).hexdigest() + ".kv"
            path = self.disk_dir / name
            if e.state is not None and not path.exists():
                tmp = path.with_suffix(".tmp")
                with open(tmp, "wb") as f:
                    f.write(MAGIC + _HEAD.pack(len(e.tokens), len(e.state)))
                    f.write(np.asarray(e.tokens, dtype="<i4").tobytes())
                    f.write(e.state)
                os.replace(tmp, path)
                written += 1
            if path.exists():
                kept.add(name)
                used += e.size
        for f in self.disk_dir.glob("*.kv"):
            if f.name not in kept:
                f.unlink(missing_ok=True)
        return written

    def load_index(self) -> int:
        """List the entries a previous run left on disk (their tokens; states are read when used)."""
        if self.disk_dir is None or not self.disk_dir.is_dir():
            return 0
        n = 0
        for f in sorted(self.disk_dir.glob("*.kv"), key=lambda p: p.stat().st_mtime):
            try:
                tokens, _ = _read(f, with_state=False)
            except (OSError, ValueError) as err:
                log.warning("prompt cache: skipping %s: %s", f, err)
                self.disk_skipped += 1
                continue
            key = key_of(tokens)
            if key not in self._entries:
                size = f.stat().st_size - len(MAGIC) - _HEAD.size - 4 * len(tokens)
                self._add(Entry(tuple(tokens), None, f, size), key)
                n += 1
        return n

    def stats(self) -> dict[str, int]:
        return {"budget_bytes": self.budget, "entries": len(self._entries), "bytes": self.bytes, "saves": self.saves,
                "ram_entries": sum(1 for e in self._entries.values() if e.state is not None),
                "hits": self.hits, "evictions": self.evictions, "reused_tokens": self.reused_tokens,
                "disk_entries": sum(1 for e in self._entries.values() if e.path is not None),
                "disk_hits": self.disk_hits, "disk_reused_tokens": self.disk_reused_tokens,
                "disk_skipped": self.disk_skipped}


def _read(path: Path, with_state: bool) -> tuple[list[int], bytes | None]:
    """(tokens, state) of a cache file; ValueError for one that is truncated or not ours."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + _HEAD.size)
        if len(head) < len(MAGIC) + _HEAD.size or not head.startswith(MAGIC):
            raise ValueError("not a llamadesk prompt-cache file")
        n_tokens, n_state = _HEAD.unpack(head[len(MAGIC):])
        expected = len(head) + 4 * n_tokens + n_state
        if os.fstat(f.fileno()).st_size != expected:
            raise ValueError(f"truncated or padded: {os.fstat(f.fileno()).st_size} bytes, expected {expected}")
        raw = f.read(4 * n_tokens)
        tokens = np.frombuffer(raw, dtype="<i4").tolist()
        state = f.read(n_state) if with_state else None
    return tokens, state
