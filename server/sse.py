"""Server-sent events for streamed completions."""
from __future__ import annotations

import json
from typing import Any

from aiohttp import web


async def open_stream(request: web.Request) -> web.StreamResponse:
    """Start an SSE response."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    return resp


def event(obj: Any) -> bytes:
    """One SSE data event holding obj as JSON."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
MARK = "\x00"  # stands for the text in a template; JSON writes it as "\u0000"


class TextEvent:
    """An SSE event whose only varying part is one string: the JSON around it is rendered once,
    so a streamed token costs one json.dumps of its text, not of the whole chunk object."""

    def __init__(self, template: Any):
        self._head, self._tail = event(template).split(json.dumps(MARK).encode())

    def render(self, text: str) -> bytes:
        return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail
