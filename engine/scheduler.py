"""The policy: which streams run in the next decode and how many prompt tokens each prefills.

Pure bookkeeping, no llama.cpp calls: engine/slot.py runs what `schedule()` returns and reports
back with `advance()`. Tested with a fake runner in tests/engine/test_scheduler.py.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class StreamState(Enum):
    """Where a stream is in its life: INBOX (submitted on the event loop, not yet seen by the scheduler
    thread), QUEUED (waiting for a sequence), PREFILL, DECODE, DONE."""

    INBOX = "inbox"
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


@dataclass(eq=False)
class Stream:
    """One generation request as the scheduler sees it."""

    id: str
    prompt: list[int]
    state: StreamState = StreamState.INBOX
    seq: int = -1
    num_cached_tokens: int = 0  # tokens of this stream already in its sequence's KV cache
    generated: list[int] = field(default_factory=list)
    reused_tokens: int = 0  # prompt tokens taken from the prefix cache instead of prefilled
    cancelled: bool = False
    job: Any = None  # the runner's per-stream state (sampler, detokenizer, sink)

    @property
    def prompt_left(self) -> int:
        return len(self.prompt) - self.num_cached_tokens


@dataclass
class Step:
    """One tick's plan: one token for each decoding stream, and prompt slices to prefill."""

    decode: list[Stream]
    prefill: list[tuple[Stream, int]]

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.prefill)

    @property
    def streams(self) -> int:
        return len(self.decode) + len(self.prefill)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    """Waiting and running streams over n_seq KV sequences, with a prefill budget per tick."""

    def __init__(self, n_seq: int, chunk: int):
        self.n_seq = n_seq
        self.chunk = chunk
        self.waiting: deque[Stream] = deque()
        self.running: list[Stream] = []
        self.free_seqs: list[int] = list(range(n_seq))
        # What each sequence's KV holds: a finished stream's tokens stay for prefix reuse.
        self.seq_tokens: list[list[int]] = [[] for _ in range(n_seq)]

    def add(self, stream: Stream) -> None:
        """Queue a new stream."""
        stream.state = StreamState.QUEUED
        self.waiting.append(stream)

    def admit(self) -> list[tuple[Stream, int]]:
        """Give free sequences to waiting streams, FIFO; return (stream, tokens kept from the cache).

        Each stream takes the free sequence whose cached tokens share the longest prefix with
        its prompt; at least the prompt's last token is always recomputed, for its logits.
        """
        admitted = []
        while self.waiting and self.free_seqs:
            s = self.waiting.popleft()
            best = max(self.free_seqs, key=lambda q: common_prefix(self.seq_tokens[q], s.prompt))
            keep = min(common_prefix(self.seq_tokens[best], s.prompt), len(s.prompt) - 1)
            self.free_seqs.remove(best)
            del self.seq_tokens[best][keep:]
            s.seq = best
            s.num_cached_tokens = keep
            s.reused_tokens = keep
            s.state = StreamState.PREFILL
            self.running.append(s)
            admitted.append((s, keep))
        return admitted

    def schedule(self) -> Step:
        """Plan the next decode: every decoding stream, plus prompt slices within the chunk budget."""
        decode = [s for s in self.running if s.state is StreamState.DECODE]
        prefill = []
        budget = self.chunk
        for s in self.running:
            if budget <= 0:
                break
            if s.state is StreamState.PREFILL:
                n = min(s.prompt_left, budget)
                prefill.append((s, n))
                budget -= n
        return Step(decode, prefill)

    def advance(self, step: Step) -> None:
        """Record that step was decoded: the fed tokens are now in each sequence's KV."""
        for s in step.decode:
            self.seq_tokens[s.seq].append(s.generated[-1])
            s.num_cached_tokens += 1
        for s, n in step.prefill:
            start = s.num_cached_tokens
            self.seq_tokens[s.seq].extend(s.prompt[start:start + n])
            s.num_cached_tokens += n

    def prompt_done(self, stream: Stream) -> bool:
        """Whether the stream's whole prompt is in the KV (its next logits give the first token)."""
        return stream.num_cached_tokens >= len(stream.prompt)

    def start_decoding(self, stream: Stream) -> None:
        """The first token was sampled: from now on the stream decodes one token per tick."""
        stream.state = StreamState.DECODE

    def finish(self, stream: Stream) -> None:
        """Retire a stream; its sequence becomes free and keeps its KV for prefix reuse. A stream the
        scheduler never took (INBOX) or already retired is only marked done."""
        if stream.state is StreamState.QUEUED:
            if stream in self.waiting:
                self.waiting.remove(stream)
        elif stream in self.running:
            self.running.remove(stream)
            if stream.seq not in self.free_seqs:
                self.free_seqs.append(stream.seq)
        stream.state = StreamState.DONE

    def forget(self, seq: int) -> None:
        """The sequence's KV was cleared (e.g. after a failed decode): nothing cached there."""
        self.seq_tokens[seq].clear()

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running
