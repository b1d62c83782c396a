"""A token-prefix index: which held token sequence shares the longest prefix with a prompt, in O(log n).

Sequences are kept as strings (one character per token id) in sorted order. In lexicographic order the key
sharing the longest prefix with a query is one of the two neighbours of the query's insertion point, so a
lookup is a bisection and two prefix comparisons, all done by CPython's string compare in C instead of a
Python loop per token per entry (what a trie over token ids would walk). It answers the questions the
prompt cache asks: the best match for a prompt, whether a sequence is already covered by a longer one, and
which held sequence is a prefix of a new one.
"""
from __future__ import annotations

from bisect import bisect_left, insort


def key_of(tokens) -> str:
    """The index key of a token sequence (token ids are below 0x110000: every vocabulary is)."""
    return "".join(map(chr, tokens))


def common_length(a, b) -> int:
    """Length of the longest common prefix of two sequences (strings, lists or tuples): a binary search on
    slice equality, so the comparisons run in C."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixIndex:
    """A sorted set of keys with longest-prefix queries."""

    def __init__(self):
        self._keys: list[str] = []

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: str) -> bool:
        i = bisect_left(self._keys, key)
        return i < len(self._keys) and self._keys[i] == key

    def add(self, key: str) -> None:
        if key not in self:
            insort(self._keys, key)

    def remove(self, key: str) -> None:
        i = bisect_left(self._keys, key)
        if i < len(self._keys) and self._keys[i] == key:
            del self._keys[i]

    def longest(self, query: str) -> tuple[str, int] | None:
        """The key sharing the longest prefix with query, and that length (None when none shares one)."""
        i = bisect_left(self._keys, query)
        best, n = None, 0
        for j in (i - 1, i):
            if 0 <= j < len(self._keys):
                k = common_length(self._keys[j], query)
                if k > n:
                    best, n = self._keys[j], k
        return (best, n) if best is not None else None

    def covering(self, query: str) -> str | None:
        """A key that starts with query (query itself included), or None."""
        i = bisect_left(self._keys, query)
        return self._keys[i] if i < len(self._keys) and self._keys[i].startswith(query) else None

    def prefixes_of(self, query: str) -> list[str]:
        """The keys that query starts with (shorter or equal). Walking left from query's place: every key that
        is a prefix of query sorts before it, and the keys between them start with that prefix too."""
        out = []
        i = bisect_left(self._keys, query)
        if i < len(self._keys) and self._keys[i] == query:
            out.append(query)
        j = i - 1
        while j >= 0 and query.startswith(self._keys[j][:1]):
            if query.startswith(self._keys[j]):
                out.append(self._keys[j])
            j -= 1
        if j >= 0 and self._keys[0] == "":  # the empty key (sorted first) is a prefix of everything
            out.append("")
        return out
