"""Worker threads for speech: each owns the sherpa-onnx objects it builds and takes jobs from one bounded
queue; callers on the event loop await a future. Nothing here blocks the loop or the LLM scheduler."""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, Callable

from engine.errors import QueueFull
from engine.threads import compute, lower_priority


class WorkerPool:
    """Worker threads, each owning what `make()` builds, fed from one bounded queue."""

    def __init__(self, name: str, threads: int, max_queue: int, make: Callable[[], Any]):
        self.name = name
        self.queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self.jobs = 0
        self.busy = 0
        self.audio_s = 0.0  # seconds of audio processed (for the real-time factor)
        self.compute_s = 0.0
        self.busy_intervals: list[tuple[float, float]] = []  # recent (start, end), monotonic
        self.error: str | None = None
        self._threads = []
        ready = []
        for i in range(threads):
            t = threading.Thread(target=self._run, args=(make, ready), name=f"llamadesk-{name}-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        for t in self._threads:  # wait until every worker built its objects (or failed)
            while t.is_alive() and len(ready) < len(self._threads):
                time.sleep(0.005)
        failed = [r for r in ready if isinstance(r, BaseException)]
        if failed:
            self.close()
            raise failed[0]

    def _run(self, make: Callable[[], Any], ready: list) -> None:
        lower_priority()  # compete with the LLM scheduler as an equal; the event loop comes first
        try:
            owned = make()
        except BaseException as e:  # reported by __init__
            ready.append(e)
            return
        ready.append(True)
        while True:
            job = self.queue.get()
            if job is None:
                return
            fn, fut, loop = job
            self.busy += 1
            t0 = time.monotonic()
            try:
                with compute.speech_job():
                    result, audio_s = fn(owned)
                err = None
            except BaseException as e:  # delivered to the awaiting caller
                result, audio_s, err = None, 0.0, e
            t1 = time.monotonic()
            self.busy -= 1
            self.jobs += 1
            self.audio_s += audio_s
            self.compute_s += t1 - t0
            self.busy_intervals = (self.busy_intervals + [(t0, t1)])[-64:]
            loop.call_soon_threadsafe(_settle, fut, result, err)

    async def run(self, fn: Callable[[Any], tuple[Any, float]]) -> Any:
        """Run fn(owned) on a worker; fn returns (result, seconds of audio it handled)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        try:
            self.queue.put_nowait((fn, fut, loop))
        except queue.Full:
            raise QueueFull(f"the {self.name} queue is full ({self.queue.maxsize} waiting); retry later") from None
        return await fut

    def stats(self) -> dict[str, Any]:
        return {"state": "busy" if self.busy else "idle", "queued": self.queue.qsize(), "jobs": self.jobs,
                "workers": len(self._threads),
                "rtf": round(self.compute_s / self.audio_s, 4) if self.audio_s else None}

    def close(self) -> None:
        for _ in self._threads:
            try:
                self.queue.put_nowait(None)
            except queue.Full:
                pass


def _settle(fut: asyncio.Future, result: Any, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is not None:
        fut.set_exception(err)
    else:
        fut.set_result(result)
