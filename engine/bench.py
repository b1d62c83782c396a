"""llama-bench's rows on a loaded model: pp512 and tg128 (three timed repetitions after an untimed
warm-up) and tg128@N for N = 2..streams (summed rate of N sequences decoding together).

Runs on the scheduler thread, which owns the model's context; its sequences are cleared first (its prefix
cache is lost) and the other rooms refuse text and audio work (503) and model or download changes (409)
while it runs (`Bench.refuse`). It reports each step (N of M, the rows so far) as it goes and stops at the
next decode when cancelled.
"""
from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from typing import Any, Callable

from engine import backends
from engine.errors import BenchRunning, Conflict
from engine.models.loaded import LoadedModel
from engine.system import hardware_line

REPS = 3
log = logging.getLogger("llamadesk.engine")


class BenchCancelled(Exception):
    """Bench.cancel() stopped the run; `rows` holds the tests that had finished."""

    def __init__(self, rows: list[dict[str, Any]]):
        super().__init__("benchmark cancelled")
        self.rows = rows


def _check(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise BenchCancelled([])


def _tokens(m: LoadedModel, n: int, rng: random.Random) -> list[int]:
    eog = m.model.eog_ids
    return [t for t in (rng.randrange(m.model.n_vocab) for _ in range(n * 2)) if t not in eog][:n]


def _pp(m: LoadedModel, n: int, rng: random.Random, cancel: threading.Event | None = None) -> float:
    """Seconds to prefill n tokens into sequence 0 (one decode per chunk, as llama-bench's n_batch)."""
    b = m.runner.bctx
    toks = _tokens(m, n, rng)
    b.clear_seq(0)
    t0 = time.perf_counter()
    for start in range(0, n, b.n_batch):
        _check(cancel)
        piece = toks[start:start + b.n_batch]
        b.decode_prefill(0, piece, start, 0, start + len(piece) == n)
        b.run(len(piece))
    return time.perf_counter() - t0


def _tg(m: LoadedModel, n: int, streams: int, rng: random.Random, cancel: threading.Event | None = None) -> float:
    """Seconds for `streams` sequences to decode n tokens each, one token per sequence per decode."""
    b = m.runner.bctx
    for s in range(streams):
        b.clear_seq(s)
    t0 = time.perf_counter()
    for pos in range(n):
        _check(cancel)
        for s in range(streams):
            b.set_row(s, rng.randrange(m.model.n_vocab), pos, s, True)
        b.run(streams)
    return time.perf_counter() - t0


def where(m: LoadedModel) -> dict[str, Any]:
    """What a run of m ran on: its devices and layers offloaded (as /v1/models has them) and the CPU variant
    loaded (None for a build without variants)."""
    choice = backends.current()
    described = m.describe()
    return {"devices": described["devices"], "gpu_layers": described["gpu_layers"],
            "cpu_variant": choice.variant.name if choice is not None and choice.variant is not None else None}


def plan(m: LoadedModel) -> list[tuple[str, int]]:
    """The tests a run of m makes, in order: (name, tokens per timed repetition)."""
    return [("pp512", 512), ("tg128", 128)] + [(f"tg128@{n}", 128 * n) for n in range(2, m.settings.streams + 1)]


def _timer(m: LoadedModel, name: str, rng: random.Random, cancel: threading.Event | None) -> Callable[[], float]:
    """One repetition of the test `name`: its seconds."""
    if name == "pp512":
        return lambda: _pp(m, 512, rng, cancel)
    streams = int(name.partition("@")[2] or 1)
    return lambda: _tg(m, 128, streams, rng, cancel)


def run(m: LoadedModel, progress: Callable[[dict[str, Any]], None] | None = None,
        cancel: threading.Event | None = None) -> list[dict[str, Any]]:
    """The benchmark rows for model m: test name, tokens, t/s mean and standard deviation. progress gets
    {"step", "steps", "current", "rows"} before each test and once after the last; a set `cancel` stops the
    run at its next decode (BenchCancelled, with the rows done)."""
    if m.embedding_only:
        raise ValueError(f"model '{m.id}' is an embedding model: nothing to generate")
    rng = random.Random(0)
    tests = plan(m)
    rows: list[dict[str, Any]] = []
    try:
        for step, (name, tokens) in enumerate(tests, 1):
            if progress:
                progress({"step": step, "steps": len(tests), "current": name, "rows": list(rows)})
            once = _timer(m, name, rng, cancel)
            once()  # untimed warm-up
            rates = [tokens / once() for _ in range(REPS)]
            rows.append({"test": name, "tokens": tokens, "t_s": round(statistics.mean(rates), 2),
                         "t_s_std": round(statistics.stdev(rates), 2)})
            log.info("benchmark %s, %d of %d: %s %.2f ± %.2f t/s", m.id, step, len(tests), name, rows[-1]["t_s"],
                     rows[-1]["t_s_std"])
        if progress:
            progress({"step": len(tests), "steps": len(tests), "current": None, "rows": list(rows)})
    except BenchCancelled:
        raise BenchCancelled(rows) from None
    finally:  # the sequences go back to the scheduler empty, whatever happened
        for s in range(m.settings.streams):
            m.runner.bctx.clear_seq(s)
            m.runner.scheduler.forget(s)
    return rows


class Bench:
    """The benchmark's state and history; while it runs, the engine is refused other work."""

    def __init__(self, run_on_scheduler):
        self._run = run_on_scheduler
        self.state: dict[str, Any] = {"state": "idle"}
        self.history: list[dict[str, Any]] = []
        self.task = None  # the asyncio task of a run started over HTTP (kept referenced)
        self._cancel = threading.Event()

    @property
    def running(self) -> bool:
        return self.state["state"] == "running"

    def refuse(self, action: str | None = None) -> None:
        """503 for work (or 409 for an action) while the benchmark has the engine."""
        if self.running:
            if action:
                raise Conflict(f"cannot {action} while the benchmark runs; retry when GET /bench says done")
            raise BenchRunning("a benchmark is running; retry in a few seconds")

    def begin(self, m: LoadedModel) -> LoadedModel:
        """Claim the engine for a benchmark of m (409 when busy); finish() runs it."""
        self.refuse("start a benchmark")
        busy = len(m.live_requests())
        if busy:
            raise Conflict(f"model '{m.id}' is serving {busy} request(s); the benchmark needs it idle")
        self._cancel.clear()
        self.state = {"state": "running", "model": m.id, "current": None, "step": 0, "steps": len(plan(m)),
                      "rows": [], "started": time.time(), **where(m)}
        return m

    def cancel(self) -> bool:
        """Stop the running benchmark at its next decode (finish() then returns a cancelled record);
        False when none runs."""
        if not self.running:
            return False
        self._cancel.set()
        return True

    async def finish(self, m: LoadedModel, progress: Callable[[dict[str, Any]], None] | None = None,
                     ) -> dict[str, Any]:
        """Run the benchmark begun by begin(); its record is the new state and joins the history (a cancelled
        run's record keeps the rows done and stays out of it). progress: as run()'s, on the scheduler thread."""
        state = self.state
        t0 = time.monotonic()

        def on_progress(p: dict[str, Any]) -> None:
            state.update(p)  # GET /bench shows the step and the rows so far
            if progress is not None:
                progress(p)
        log.info("benchmark of %s: %d tests, %d timed repetitions each", m.id, state["steps"], REPS)
        try:
            rows = await self._run(lambda: run(m, on_progress, self._cancel))
        except BenchCancelled as e:
            self.state = {**state, "state": "cancelled", "current": None, "rows": e.rows,
                          "seconds": round(time.monotonic() - t0, 2)}
            log.info("benchmark of %s cancelled after %d of %d tests", m.id, len(e.rows), state["steps"])
            return self.state
        except Exception as e:
            self.state = {**state, "state": "failed", "error": str(e)}
            log.error("benchmark of %s failed: %s", m.id, e)
            raise
        mm = m.model
        record = {"state": "done", "model": m.id, "file": str(mm.path), "quant": mm.quant(), "params": mm.n_params,
                  "kv_dtype": m.settings.kv_dtype, "threads": m.settings.threads, "streams": m.settings.streams,
                  "hardware": hardware_line(), **where(m), "rows": rows, "started": state["started"],
                  "seconds": round(time.monotonic() - t0, 2)}
        self.state = record
        self.history = (self.history + [record])[-20:]
        log.info("benchmark of %s done in %.1f s", m.id, record["seconds"])
        return record
