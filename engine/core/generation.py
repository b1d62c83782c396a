"""A request's collector on the event loop: the scheduler thread's events arrive here (in one call per
delivery), the caller iterates the text and reads how it ended."""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable

from engine.core.request import Delta, End, Event, Failed, Request
from engine.errors import EngineError, EngineStopped
from engine.requests import OutputReading


class Generation:
    """One choice of a request: its text as it comes, its logprobs, its end (finish reason, usage) or error."""

    def __init__(self, request: Request, model_id: str, reading: OutputReading,
                 cancel: Callable[[Request], None], closed: Callable[[], None]):
        self.request = request
        self.id = request.id
        self.model = model_id
        self.created = int(time.time())
        self.prompt_tokens = len(request.prompt)
        self.reading = reading  # how to read the text: tool-call format, tools on, reasoning
        self.logprobs: list[dict] = []  # entries not yet taken (take_logprobs)
        self.error: EngineError | None = None
        self._end: End | None = None
        self._cancel = cancel
        self._closed = closed
        self._pending: list[str] = []
        self._wake = asyncio.Event()
        self._cancelled = False  # the caller asked for it to stop

    @property
    def ended(self) -> bool:
        return self._end is not None or self.error is not None

    @property
    def finish_reason(self) -> str | None:
        return self._end.reason if self._end else None

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the text (None when the model stopped by itself or by length)."""
        return self.request.stops.matched if self.finish_reason == "stop" else None

    @property
    def usage(self) -> dict[str, Any]:
        return self._end.usage if self._end else {}

    def push(self, event: Event) -> None:
        """Take an event from the scheduler thread (runs on the event loop)."""
        if isinstance(event, Delta):
            if event.text:
                self._pending.append(event.text)
            if event.logprobs:
                self.logprobs.append(event.logprobs)
        elif not self.ended:
            if isinstance(event, End) and event.reason == "cancelled" and not self._cancelled:
                # the engine aborted it (its model unloaded, the server stopping): an error, not an ending
                self.error = EngineStopped("the request was aborted: its model was unloaded or the server is "
                                           "stopping")
            elif isinstance(event, End):
                self._end = event
            elif isinstance(event, Failed):
                self.error = event.error
            self._closed()
        self._wake.set()

    async def chunks(self) -> AsyncIterator[str]:
        """The generated text as it comes, one string per delivery (all pieces since the last one)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._pending:
                text = "".join(self._pending)
                self._pending.clear()
                yield text
            if self.error:
                raise self.error
            if self._end:
                return

    def take_logprobs(self) -> list[dict]:
        """The logprob entries of the tokens delivered since the last call."""
        out, self.logprobs = self.logprobs, []
        return out

    async def text(self) -> str:
        """The whole generated text (buffered mode)."""
        return "".join([c async for c in self.chunks()])

    def cancel(self) -> None:
        """Abort the request in the engine (a message to the scheduler thread; evicted at its next tick)."""
        if not self.ended:
            self._cancelled = True
            self._cancel(self.request)
