"""llama-bench's rows on a served slot: pp512 and tg128 (three timed repetitions after an untimed
warm-up) and tg128@N for N = 2..streams (summed rate of N sequences decoding together).

Runs on the scheduler thread, which owns the slot's context; the slot's sequences are cleared first
(its prefix cache is lost) and the service refuses text and audio work while it runs.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable

from engine.slot import Slot

REPS = 3


def _tokens(slot: Slot, n: int, rng: random.Random) -> list[int]:
    eog = slot.model.eog_ids
    return [t for t in (rng.randrange(slot.model.n_vocab) for _ in range(n * 2)) if t not in eog][:n]


def _pp(slot: Slot, n: int, rng: random.Random) -> float:
    """Seconds to prefill n tokens into sequence 0 (one decode per chunk, as llama-bench's n_batch)."""
    b = slot.bctx
    toks = _tokens(slot, n, rng)
    b.clear_seq(0)
    t0 = time.perf_counter()
    for start in range(0, n, b.n_batch):
        piece = toks[start:start + b.n_batch]
        b.decode_prefill(0, piece, start, 0, start + len(piece) == n)
        b.run(len(piece))
    return time.perf_counter() - t0


def _tg(slot: Slot, n: int, streams: int, rng: random.Random) -> float:
    """Seconds for `streams` sequences to decode n tokens each, one token per sequence per decode."""
    b = slot.bctx
    for s in range(streams):
        b.clear_seq(s)
    t0 = time.perf_counter()
    for pos in range(n):
        for s in range(streams):
            b.set_row(s, rng.randrange(slot.model.n_vocab), pos, s, True)
        b.run(streams)
    return time.perf_counter() - t0


def run(slot: Slot, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The benchmark rows for slot: test name, tokens, t/s mean and standard deviation."""
    if slot.embedding_only:
        raise ValueError(f"model '{slot.id}' is an embedding model: nothing to generate")
    rng = random.Random(0)
    rows = []
    tests: list[tuple[str, int, Callable[[], float]]] = [("pp512", 512, lambda: _pp(slot, 512, rng)),
                                                         ("tg128", 128, lambda: _tg(slot, 128, 1, rng))]
    for n in range(2, slot.settings.streams + 1):
        tests.append((f"tg128@{n}", 128 * n, lambda n=n: _tg(slot, 128, n, rng)))
    for name, tokens, once in tests:
        if progress:
            progress(name)
        once()  # untimed warm-up
        rates = [tokens / once() for _ in range(REPS)]
        rows.append({"test": name, "tokens": tokens, "t_s": round(statistics.mean(rates), 2),
                     "t_s_std": round(statistics.stdev(rates), 2)})
    for s in range(slot.settings.streams):
        slot.bctx.clear_seq(s)
        slot.scheduler.forget(s)
    return rows
