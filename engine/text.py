"""Incremental detokenization and stop-string matching for streamed text."""
from __future__ import annotations

import codecs


def partial_suffix(buf: str, markers) -> int:
    """Length of the longest suffix of buf that is a proper prefix of one of markers (text to hold back
    because the next piece may complete a stop string or a tool-call tag)."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(buf)), best, -1):
            if buf.endswith(m[:n]):
                best = n
                break
    return best


class Utf8Stream:
    """Turns token byte pieces into text, never emitting half of a multi-byte character."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, piece: bytes) -> str:
        """The complete characters that piece finishes (possibly none)."""
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """Whatever is left at the end (an incomplete tail becomes U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings across chunk boundaries; holds back text that may start one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.matched: str | None = None  # the stop string that ended the text, once one has
        self._held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Feed new text; return (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buf = self._held + text
        found = [(i, s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            hit, self.matched = min(found, key=lambda f: f[0])
            self._held = ""
            return buf[:hit], True
        keep = partial_suffix(buf, self.stops)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """The held-back text, when the stream ends without a stop string."""
        out, self._held = self._held, ""
        return out
