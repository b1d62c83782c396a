"""llama-bench's rows on a loaded model: pp512 and tg128 (three timed repetitions after an untimed
warm-up) and tg128@N for N = 2..streams (summed rate of N sequences decoding together).

Runs on the scheduler thread, which owns the model's context; its sequences are cleared first (its prefix
cache is lost) and the other rooms refuse text and audio work (503) and model or download changes (409)
while it runs (`Bench.refuse`).
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable

from engine.errors import BenchRunning, Conflict
from engine.models.loaded import LoadedModel
from engine.system import hardware_line

REPS = 3


def _tokens(m: LoadedModel, n: int, rng: random.Random) -> list[int]:
    eog = m.model.eog_ids
    return [t for t in (rng.randrange(m.model.n_vocab) for _ in range(n * 2)) if t not in eog][:n]


def _pp(m: LoadedModel, n: int, rng: random.Random) -> float:
    """Seconds to prefill n tokens into sequence 0 (one decode per chunk, as llama-bench's n_batch)."""
    b = m.runner.bctx
    toks = _tokens(m, n, rng)
    b.clear_seq(0)
    t0 = time.perf_counter()
    for start in range(0, n, b.n_batch):
        piece = toks[start:start + b.n_batch]
        b.decode_prefill(0, piece, start, 0, start + len(piece) == n)
        b.run(len(piece))
    return time.perf_counter() - t0


def _tg(m: LoadedModel, n: int, streams: int, rng: random.Random) -> float:
    """Seconds for `streams` sequences to decode n tokens each, one token per sequence per decode."""
    b = m.runner.bctx
    for s in range(streams):
        b.clear_seq(s)
    t0 = time.perf_counter()
    for pos in range(n):
        for s in range(streams):
            b.set_row(s, rng.randrange(m.model.n_vocab), pos, s, True)
        b.run(streams)
    return time.perf_counter() - t0


def run(m: LoadedModel, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The benchmark rows for model m: test name, tokens, t/s mean and standard deviation."""
    if m.embedding_only:
        raise ValueError(f"model '{m.id}' is an embedding model: nothing to generate")
    rng = random.Random(0)
    rows = []
    tests: list[tuple[str, int, Callable[[], float]]] = [("pp512", 512, lambda: _pp(m, 512, rng)),
                                                         ("tg128", 128, lambda: _tg(m, 128, 1, rng))]
    for n in range(2, m.settings.streams + 1):
        tests.append((f"tg128@{n}", 128 * n, lambda n=n: _tg(m, 128, n, rng)))
    for name, tokens, once in tests:
        if progress:
            progress(name)
        once()  # untimed warm-up
        rates = [tokens / once() for _ in range(REPS)]
        rows.append({"test": name, "tokens": tokens, "t_s": round(statistics.mean(rates), 2),
                     "t_s_std": round(statistics.stdev(rates), 2)})
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
        self.state = {"state": "running", "model": m.id, "current": None, "started": time.time()}
        return m

    async def finish(self, m: LoadedModel) -> dict[str, Any]:
        """Run the benchmark begun by begin(); its record is the new state and joins the history."""
        state = self.state
        t0 = time.monotonic()
        try:
            rows = await self._run(lambda: run(m, lambda name: state.update(current=name)))
        except Exception as e:
            self.state = {**state, "state": "failed", "error": str(e)}
            raise
        mm = m.model
        record = {"state": "done", "model": m.id, "file": str(mm.path), "quant": mm.quant(), "params": mm.n_params,
                  "kv_dtype": m.settings.kv_dtype, "threads": m.settings.threads, "streams": m.settings.streams,
                  "hardware": hardware_line(), "rows": rows, "started": state["started"],
                  "seconds": round(time.monotonic() - t0, 2)}
        self.state = record
        self.history = (self.history + [record])[-20:]
        return record
