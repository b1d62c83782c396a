"""The scheduler thread: runs posted calls, then one tick of every loaded model, then delivers the
events of the tick to the event loop in one call. It owns every llama.cpp context call.

A supervisor wraps the loop: an exception that escapes a model's tick ends that model's requests (the
runner's fail_all) and the loop goes on; one that escapes the loop itself is logged, counted and the loop
restarts. No request can stop the thread.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from typing import Any, Callable

from engine.core.request import Event, Sink
from engine.errors import EngineError, EngineStopped
from engine.threads import lower_priority

log = logging.getLogger("llamadesk.engine")
FLUSH_S = 0.02  # longest a generated delta waits to be batched with the next ones


class Outbox:
    """Events for the event loop, gathered over ticks and handed over in one call.

    Delivering every token the moment it exists costs the event loop a wake-up and a socket
    write per token, and on a machine where llama.cpp uses every core that work stalls the
    next decode. So deltas are batched for a few milliseconds; first tokens and endings are
    urgent and leave at once.
    """

    def __init__(self) -> None:
        self.events: list[tuple[Sink, Event]] = []
        self.urgent = False

    def add(self, sink: Sink, event: Event, urgent: bool = False) -> None:
        self.events.append((sink, event))
        self.urgent |= urgent

    def take(self) -> list[tuple[Sink, Event]]:
        events, self.events, self.urgent = self.events, [], False
        return events


def deliver(events: list[tuple[Sink, Event]]) -> None:
    """Hand events to their collectors (on the event loop)."""
    for sink, event in events:
        try:
            sink.push(event)
        except Exception:  # one collector's failure must not lose the other requests' events
            log.exception("delivering an engine event failed")


class Worker(threading.Thread):
    """The scheduler thread over the runners that `runners()` returns (read at every tick)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, runners: Callable[[], list[Any]]):
        super().__init__(name="llamadesk-scheduler", daemon=True)
        self._event_loop = loop
        self._runners = runners
        self._calls: deque[tuple[Callable[[], Any], concurrent.futures.Future]] = deque()
        self._event = threading.Event()
        self._stopping = False
        self.restarts = 0  # times the loop failed and was restarted
        self.tick_errors = 0  # model ticks that failed (their requests were ended)
        self.recovering = False

    @property
    def healthy(self) -> bool:
        """Whether the thread is alive and ticking (not recovering from a failed loop)."""
        return self.is_alive() and not self.recovering

    def wake(self) -> None:
        self._event.set()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run fn on the scheduler thread between ticks; its result comes back as a future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self._stopping:
            fut.set_exception(EngineStopped("the engine is shutting down"))
            return fut
        self._calls.append((fn, fut))
        self._event.set()
        return fut

    def stop(self) -> None:
        self._stopping = True
        self._event.set()

    def run(self) -> None:
        """The supervisor: the loop below never ends on an exception; it is logged, counted and restarted."""
        lower_priority()
        out = Outbox()
        while not self._stopping:
            try:
                self._loop(out)
            except BaseException:
                self.restarts += 1
                self.recovering = True
                log.exception("the scheduler loop failed; restarting it (restart %d)", self.restarts)
                time.sleep(min(0.05 * self.restarts, 1.0))  # a fault that repeats must not spin the CPU
        while self._calls:  # nobody will run these now
            _, fut = self._calls.popleft()
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineStopped("the engine is shutting down"))

    def _loop(self, out: Outbox) -> None:
        """schedule -> run -> postprocess for every model, then deliver (nano-vllm's LLMEngine.step)."""
        last_flush = 0.0
        while not self._stopping:
            while self._calls:
                fn, fut = self._calls.popleft()
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as e:  # delivered to the awaiting caller
                        fut.set_exception(e)
            worked = False
            for runner in self._runners():
                try:
                    worked |= runner.step(out)
                except Exception as e:
                    self.tick_errors += 1
                    log.exception("scheduler tick failed for %s; ending its requests", runner.name)
                    n = runner.fail_all(out, EngineError(f"internal error in the scheduler ({type(e).__name__}); "
                                                         "the request was ended, the server keeps serving"))
                    log.error("%s: %d request(s) ended by the failed tick", runner.name, n)
            self.recovering = False
            now = time.monotonic()
            if out.events and (out.urgent or not worked or now - last_flush >= FLUSH_S):
                self._event_loop.call_soon_threadsafe(deliver, out.take())
                last_flush = now
            if not worked and not self._calls:
                self._event.wait()
                self._event.clear()
