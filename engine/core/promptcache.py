"""The host-RAM prompt cache: KV states of sequences whose cells were about to be given to an unrelated
prompt, kept by their tokens under a byte budget (LRU), so that a conversation evicted from the KV by
others comes back without prefilling its history again (llama-server's --cache-ram)."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.core.scheduler import common_prefix

MIN_TOKENS = 32  # shorter prompts are cheaper to prefill than to save and restore


@dataclass
class Entry:
    tokens: tuple[int, ...]
    state: bytes


class PromptCache:
    """KV states by token sequence, within budget bytes; the least recently used go first."""

    def __init__(self, budget: int):
        self.budget = budget
        self._entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.bytes = 0
        self.saves = self.hits = self.evictions = self.reused_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __len__(self) -> int:
        return len(self._entries)

    def wants(self, tokens: list[int]) -> bool:
        """Whether tokens are worth saving: long enough, and not already held (or covered by a longer entry)."""
        if not self.enabled or len(tokens) < MIN_TOKENS:
            return False
        t = tuple(tokens)
        return not any(len(k) >= len(t) and k[:len(t)] == t for k in self._entries)

    def put(self, tokens: list[int], state: bytes) -> bool:
        """Keep state for tokens, evicting the least recently used to make room; False when it cannot fit."""
        if len(state) > self.budget:
            return False
        t = tuple(tokens)
        for k in [k for k in self._entries if len(k) <= len(t) and t[:len(k)] == k]:
            self._drop(k)  # a shorter prefix of this entry adds nothing
        while self.bytes + len(state) > self.budget:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._entries[t] = Entry(t, state)
        self.bytes += len(state)
        self.saves += 1
        return True

    def best(self, prompt: list[int]) -> tuple[Entry, int] | None:
        """The entry sharing the longest prefix with prompt, and that length (None when nothing is shared)."""
        found, n = None, 0
        for e in self._entries.values():
            if e.tokens and prompt and e.tokens[0] == prompt[0]:
                k = common_prefix(list(e.tokens), prompt)
                if k > n:
                    found, n = e, k
        return (found, n) if found is not None else None

    def used(self, e: Entry, n: int) -> None:
        """e served n tokens of a prompt: it is the most recently used now."""
        self._entries.move_to_end(e.tokens)
        self.hits += 1
        self.reused_tokens += n

    def _drop(self, key: tuple[int, ...]) -> None:
        e = self._entries.pop(key)
        self.bytes -= len(e.state)

    def stats(self) -> dict[str, int]:
        return {"budget_bytes": self.budget, "entries": len(self._entries), "bytes": self.bytes, "saves": self.saves,
                "hits": self.hits, "evictions": self.evictions, "reused_tokens": self.reused_tokens}
