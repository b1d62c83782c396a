"""The policy: which requests run in the next decode and how many prompt tokens each prefills.

Pure bookkeeping, no llama.cpp calls: engine/core/runner.py runs what `schedule()` returns and reports
back with `advance()`. Tested with a fake runner in tests/engine/test_scheduler.py.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.core.prefixindex import common_length
from engine.core.request import Request, RequestState


@dataclass
class Step:
    """One tick's plan: one token for each decoding request, prompt slices of tokens to prefill, and slices of
    image rows to prefill (their own decode: a batch holds either token ids or embeddings)."""

    decode: list[Request]
    prefill: list[tuple[Request, int]]
    images: list[tuple[Request, int]] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.prefill) + sum(n for _, n in self.images)

    @property
    def streams(self) -> int:
        return len(self.decode) + len(self.prefill) + len(self.images)


common_prefix = common_length  # of two token lists (slice compares in C, not a loop per token)


MIN_SHARE = 16  # fewer shared tokens than this are not worth waiting for or attaching


class Scheduler:
    """Waiting and running requests over n_seq KV sequences, with a prefill budget per tick.

    share (a unified KV pool): a request may attach the cells of a prefix that another sequence holds,
    running or finished, and waits (at most until the prefix is in) for an earlier request that is
    prefilling a prefix they share, instead of computing the same tokens twice."""

    def __init__(self, n_seq: int, chunk: int, share: bool = False):
        self.n_seq = n_seq
        self.chunk = chunk
        self.share = share
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_seqs: list[int] = list(range(n_seq))
        # What each sequence's KV holds: a finished request's tokens stay for prefix reuse.
        self.seq_tokens: list[list[int]] = [[] for _ in range(n_seq)]

    def add(self, req: Request) -> None:
        """Queue a new request (its n > 1 choices ride along with it)."""
        for r in req.family:
            r.state = RequestState.QUEUED
        self.waiting.append(req)

    def admit(self) -> list[tuple[Request, int, list[int]]]:
        """Give free sequences to waiting requests, FIFO; return (request, tokens kept from the cache, what
        the sequence held before: the runner may save that to the host-RAM cache before it is cut).

        Each request takes the free sequence whose cached tokens share the longest prefix with its
        prompt; at least the prompt's last token is always recomputed, for its logits. A request with
        n > 1 choices waits until a sequence is free for each: the others take the sequences whose
        cache is worth least and get the first one's KV once its prompt is in (fork).
        """
        admitted = []
        while self.waiting and len(self.free_seqs) >= len(self.waiting[0].family):
            r = self.waiting.popleft()
            best = max(self.free_seqs, key=lambda q: common_prefix(self.seq_tokens[q], r.prompt))
            keep = r.reusable(min(common_prefix(self.seq_tokens[best], r.prompt), len(r.prompt) - 1))
            self._take(r, best)
            held = list(self.seq_tokens[best])
            del self.seq_tokens[best][keep:]
            r.num_cached_tokens = r.reused_tokens = keep
            for child in r.family[1:]:
                self._take(child, min(self.free_seqs, key=lambda q: len(self.seq_tokens[q])))
            admitted.append((r, keep, held))
        return admitted

    def _take(self, r: Request, seq: int) -> None:
        self.free_seqs.remove(seq)
        r.seq = seq
        r.state = RequestState.PREFILL
        self.running.append(r)

    def restored(self, r: Request, tokens: list[int], n: int) -> None:
        """r's sequence now holds the first n of tokens (restored from the host-RAM cache)."""
        self.seq_tokens[r.seq] = list(tokens[:n])
        r.num_cached_tokens = r.reused_tokens = n

    def attach_source(self, r: Request) -> tuple[int, int] | None:
        """(sequence, n): another sequence, running or finished, whose first n tokens (MIN_SHARE at least) are a
        longer prefix of r's prompt than what r has; None when there is none or sharing is off."""
        if not self.share or r.parent is not None or r.state is not RequestState.PREFILL:
            return None
        limit = len(r.prompt) - 1  # the last prompt token is always computed, for its logits
        best, best_n = -1, max(r.num_cached_tokens, MIN_SHARE - 1)
        for q in range(self.n_seq):
            if q != r.seq:
                n = r.reusable(min(common_prefix(self.seq_tokens[q], r.prompt), limit))
                if n > best_n:
                    best, best_n = q, n
        return (best, best_n) if best >= 0 else None

    def attached(self, r: Request, n: int) -> int:
        """r's sequence now holds the first n prompt tokens (attached from another); returns the tokens gained."""
        gained = n - r.num_cached_tokens
        self.seq_tokens[r.seq] = list(r.prompt[:n])
        r.num_cached_tokens = n
        r.reused_tokens += gained
        return gained

    def waits_for_prefix(self, r: Request) -> bool:
        """Whether a request admitted before r is prefilling a prefix of r's prompt (MIN_SHARE tokens at least)
        beyond what r has: r waits for it and attaches, instead of computing it too."""
        if not self.share:
            return False
        have = r.num_cached_tokens
        for p in self.running:
            if p is r:
                return False  # only earlier requests: no two ever wait for each other
            if p.state is RequestState.PREFILL and p.parent is None:
                n = r.reusable(min(common_prefix(p.prompt, r.prompt), len(r.prompt) - 1))
                if n >= MIN_SHARE and n > have and p.num_cached_tokens < n:
                    return True
        return False

    def schedule(self) -> Step:
        """Plan the next decode: every decoding request, plus prompt slices within the chunk budget (choices
        waiting for their first one's prompt, and requests waiting for a shared prefix, prefill nothing). A
        slice ends where the prompt's text or image run does; an image that must be decoded whole waits for a
        tick with room for all of it."""
        decode = [r for r in self.running if r.state is RequestState.DECODE]
        prefill, images = [], []
        budget = self.chunk
        for r in self.running:
            if budget <= 0:
                break
            if r.state is RequestState.PREFILL and r.parent is None and not self.waits_for_prefix(r):
                start = r.num_cached_tokens
                run = r.run_end(start) - start
                n = min(run, budget)
                image = r.image_at(start)
                if image is None:
                    prefill.append((r, n))
                elif image.whole and n < run:
                    continue
                else:
                    images.append((r, n))
                budget -= n
        return Step(decode, prefill, images)

    def advance(self, step: Step) -> None:
        """Record that step was decoded: the fed tokens and image rows are now in each sequence's KV."""
        for r in step.decode:
            self.seq_tokens[r.seq].append(r.generated[-1])
            r.num_cached_tokens += 1
        for r, n in [*step.prefill, *step.images]:
            start = r.num_cached_tokens
            self.seq_tokens[r.seq].extend(r.prompt[start:start + n])
            r.num_cached_tokens += n

    def prompt_done(self, req: Request) -> bool:
        """Whether the request's whole prompt is in the KV (its next logits give the first token)."""
        return req.num_cached_tokens >= len(req.prompt)

    def fork(self, parent: Request) -> list[Request]:
        """The parent's prompt is in: its waiting choices now hold the same KV (the runner copies it) and
        sample their first token from the same logits. Returns the choices forked."""
        forked = [c for c in parent.children if c.state is RequestState.PREFILL]
        for c in forked:
            self.seq_tokens[c.seq] = list(self.seq_tokens[parent.seq])
            c.num_cached_tokens = parent.num_cached_tokens
            c.reused_tokens = parent.reused_tokens
        return forked

    def start_decoding(self, req: Request) -> None:
        """The first token was sampled: from now on the request decodes one token per tick."""
        req.state = RequestState.DECODE

    def finish(self, req: Request) -> None:
        """Retire a request; its sequence becomes free and keeps its KV for prefix reuse. A request the
        scheduler never took (INBOX), or one already retired, is only marked done."""
        if req.state is RequestState.QUEUED:
            if req in self.waiting:
                self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            if req.seq not in self.free_seqs:
                self.free_seqs.append(req.seq)
        req.state = RequestState.DONE

    def forget(self, seq: int) -> None:
        """The sequence's KV was cleared (e.g. after a failed decode): nothing cached there."""
        self.seq_tokens[seq].clear()
