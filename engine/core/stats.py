"""Counters of one loaded model, computed once where they happen (the runner) and read by /v1/stats,
/metrics, the dashboard and the benchmark alike."""
from __future__ import annotations

import time
from collections import deque

from engine.system import percentiles


class ModelStats:
    """Token, decode, cache and latency counters of one model."""

    RATE_WINDOW_S = 10.0

    def __init__(self) -> None:
        self.gen_tokens = 0
        self.prefill_tokens = 0
        self.decode_calls = 0
        self.max_streams_per_decode = 0
        self.prefix_cache_hits = 0
        self.prefix_cache_reused_tokens = 0
        self.rejected_requests = 0
        self.requests = 0
        self.forked_choices = 0  # n > 1 choices that took the first one's prompt KV instead of prefilling it
        self.prefix_attaches = 0  # requests that took a prefix's cells from another sequence (running or not)
        self.attached_tokens = 0
        self.ram_reused_tokens = 0  # prompt tokens restored from the host-RAM cache
        self.kv_reused_tokens = 0  # prompt tokens a request found in the sequence it was given
        self.disk_reused_tokens = 0  # prompt tokens restored from the cache a previous run left on disk
        self.embedding_inputs = 0
        self.embedding_decodes = 0
        self.ttft_ms: deque[float] = deque(maxlen=512)
        self.recent: deque[tuple[float, int, int]] = deque()  # (time, generated, prefilled) per tick

    def on_decode(self, streams: int, generated: int, prefilled: int) -> None:
        now = time.monotonic()
        self.decode_calls += 1
        self.max_streams_per_decode = max(self.max_streams_per_decode, streams)
        self.gen_tokens += generated
        self.prefill_tokens += prefilled
        self.recent.append((now, generated, prefilled))
        while self.recent and now - self.recent[0][0] > self.RATE_WINDOW_S:
            self.recent.popleft()

    def rates(self) -> tuple[float, float]:
        """Generated and prefilled tokens per second over the last few seconds."""
        now = time.monotonic()
        recent = [r for r in list(self.recent) if now - r[0] <= self.RATE_WINDOW_S]
        if not recent:
            return 0.0, 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(r[1] for r in recent) / span, sum(r[2] for r in recent) / span

    def ttft(self) -> dict[str, float]:
        return percentiles(self.ttft_ms)
