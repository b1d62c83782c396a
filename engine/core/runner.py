"""The mechanism: executes the scheduler's plan for one loaded model each tick (batch build, one
llama_decode, one more before it for image rows when an image prefills, sampling, detokenization, stop
strings) and turns what happened into events.

Everything here runs on the scheduler thread, except `submit` (the event loop appends to the inbox)
and the read-only `live()` snapshot.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any

from engine.core.promptcache import MIN_TOKENS, PromptCache
from engine.core.request import Delta, End, Failed, Request, RequestState
from engine.core.scheduler import Scheduler, Step
from engine.core.stats import ModelStats
from engine.core.worker import Outbox
from engine.errors import EngineError
from engine.llama import BatchContext, LlamaModel, token_logprobs
from engine.threads import compute

log = logging.getLogger("llamadesk.engine")
TAIL_CHARS = 80  # how much recent text /v1/streams shows per request


class Runner:
    """Runs one model's requests: an inbox filled on the event loop, a scheduler, the batched context."""

    def __init__(self, name: str, model: LlamaModel, bctx: BatchContext | None, n_seq: int, chunk: int, ctx: int,
                 threads: int, cache: PromptCache | None = None):
        self.name = name
        self.model = model
        self.bctx = bctx
        self.ctx = ctx
        self.threads = threads
        self.cache = cache  # the host-RAM prompt cache (None: off)
        self.scheduler = Scheduler(n_seq, chunk, share=bool(bctx and bctx.unified))
        self.stats = ModelStats()
        self.inbox: deque[Request] = deque()  # appended on the loop, taken on the scheduler thread
        self.done: deque[Request] = deque(maxlen=32)  # the last finished, for /v1/streams

    def submit(self, req: Request) -> None:
        """Hand a request (and its n > 1 choices) over to the scheduler thread (event loop)."""
        self.inbox.append(req)

    def cancel(self, req: Request) -> None:
        """Abort a request: it is evicted at this tick (scheduler thread, posted by Generation.cancel)."""
        if req.state is not RequestState.DONE and not req.cancelled:
            req.cancelled = True
            req.cancel_tick = self.stats.decode_calls

    # ---- the tick ------------------------------------------------------------------------------

    def step(self, out: Outbox) -> bool:
        """Run one tick: admit, plan, decode (image rows, then tokens), sample. Returns False when there was nothing
        to do.

        A failure that concerns one request (its sampler, its detokenizer) ends that request alone; a failed
        decode ends the requests of that batch; anything else propagates to the worker, which ends every
        request of this model (fail_all) and keeps ticking."""
        sched = self.scheduler
        while self.inbox:
            sched.add(self.inbox.popleft())
        for r in [x for w in sched.waiting for x in w.family] + list(sched.running):
            if r.cancelled and r.state is not RequestState.DONE:
                self._end(r, "cancelled", out)
        for r, keep, held in sched.admit():
            self._admitted(r, keep, held)
            for child in r.family[1:]:  # emptied now; they get r's prompt when it is in (fork)
                self._save(child.seq, sched.seq_tokens[child.seq])
                self.bctx.clear_seq(child.seq)
                sched.forget(child.seq)
        for r in list(sched.running):  # a longer prefix held by another sequence: share its cells
            src = sched.attach_source(r)
            if src is not None:
                self.bctx.attach(src[0], r.seq, src[1])
                gained = sched.attached(r, src[1])
                r.reuse["attached"] = r.reuse.get("attached", 0) + gained
                self.stats.prefix_attaches += 1
                self.stats.attached_tokens += gained
                self.stats.prefix_cache_reused_tokens += gained
                if r.reused_tokens == gained:  # the request's first reuse
                    self.stats.prefix_cache_hits += 1
        step = sched.schedule()
        if step.n_tokens == 0:
            return False

        bctx = self.bctx
        image_rows = self._decode_images(step, out)
        row = 0
        to_sample: list[tuple[Request, int]] = []
        # Rows in ascending sequence order, as llama-server fills its batches. Measured here: once
        # sequences had been recycled out of order, arrival-ordered rows made each 4-stream
        # llama_decode 21-28 ms instead of 17 ms (SmolLM2-135M, 2 threads).
        for r in sorted(step.decode, key=lambda x: x.seq):
            bctx.set_row(row, r.generated[-1], r.num_cached_tokens, r.seq, True)
            to_sample.append((r, row))
            row += 1
        for r, n in step.prefill:
            start = r.num_cached_tokens
            completes = start + n == len(r.prompt)
            bctx.decode_prefill(r.seq, r.prompt[start:start + n], start, row, completes)
            if completes:
                to_sample.append((r, row + n - 1))
            row += n
        if row:
            bctx.set_threads(compute.begin_decode(self.threads))
            try:
                bctx.run(row)
            except RuntimeError as e:
                log.error("%s: %s", self.name, e)
                for r in [*step.decode, *(p for p, _ in step.prefill)]:  # choices waiting on a prompt end with it
                    self._fail(r, out, EngineError(f"decode failed: {e}"))
                return True
            finally:
                compute.end_decode()
        sched.advance(Step(step.decode, step.prefill))
        forked = [(c, row) for r, row in to_sample if r.state is RequestState.PREFILL for c in self._fork(r)]
        self.stats.on_decode(step.streams + len(forked), len(to_sample) + len(forked),
                             sum(n for _, n in step.prefill) + image_rows)
        now = time.monotonic()
        for r, row in to_sample + forked:
            try:
                tok = r.sampler.sample(bctx, row)
                if r.state is RequestState.PREFILL:
                    sched.start_decoding(r)
                    r.first_token_at = now
                    self.stats.ttft_ms.append((now - r.submitted) * 1000.0)
                self._on_token(r, tok, out, row)
            except Exception as e:  # this request's sampler or text: the others go on
                log.exception("%s: request %s failed while sampling", self.name, r.id)
                self._fail(r, out, EngineError(f"internal error while sampling: {type(e).__name__}"))
        return True

    def _decode_images(self, step: Step, out: Outbox) -> int:
        """Prefill the step's image rows, before its token batch (whose logits are sampled); returns the rows
        decoded. A failed decode ends the requests whose rows it held."""
        if not step.images:
            return 0
        slices, whole = [], False
        for r, n in step.images:
            start = r.num_cached_tokens
            image = r.image_at(start)
            slices.append((r.seq, image.rows[start - image.start:start - image.start + n], start))
            whole |= image.whole  # one projector per model: all its images are alike
        self.bctx.set_threads(compute.begin_decode(self.threads))
        try:
            self.bctx.run_rows(slices, non_causal=whole)
        except RuntimeError as e:
            log.error("%s: %s", self.name, e)
            for r, _ in step.images:
                self._fail(r, out, EngineError(f"decode failed: {e}"))
            return 0
        finally:
            compute.end_decode()
        self.scheduler.advance(Step([], [], step.images))
        return sum(n for _, n in step.images)

    def _admitted(self, r: Request, keep: int, held: list[int]) -> None:
        """r took a sequence that held `held`, of which it keeps `keep` tokens: save the rest of that
        conversation to the host-RAM cache before the cells are cut, then take the best of what the sequence
        kept and what the cache has."""
        sched, cache = self.scheduler, self.cache
        if len(held) - keep >= MIN_TOKENS:
            self._save(r.seq, held)  # before keep_prefix drops the rest
        found = cache.best(r.prompt) if cache is not None and cache.enabled else None
        if found is not None and r.reusable(min(found[1], len(r.prompt) - 1)) >= keep + MIN_TOKENS:
            entry, n = found
            n = r.reusable(min(n, len(r.prompt) - 1))
            from_disk = entry.state is None
            state = cache.state_of(entry)  # read from disk the first time after a restart; None: a bad file
            if state is not None and self.bctx.restore_seq(r.seq, state) and self.bctx.keep_prefix(r.seq, n):
                sched.restored(r, list(entry.tokens), n)
                r.reuse = {"disk" if from_disk else "ram": n}
                cache.used(entry, n, from_disk)
                if from_disk:
                    self.stats.disk_reused_tokens += n
                else:
                    self.stats.ram_reused_tokens += n
                self.stats.prefix_cache_hits += 1
                self.stats.prefix_cache_reused_tokens += n
                return
            if state is not None:  # the restore failed: what the sequence held is gone, start over
                self.bctx.clear_seq(r.seq)
                sched.forget(r.seq)
                r.num_cached_tokens = r.reused_tokens = 0
                return
            # (a bad file: the sequence still holds what it kept)
        if not self.bctx.keep_prefix(r.seq, keep):
            self.bctx.clear_seq(r.seq)  # this memory type cannot drop a suffix: start over
            sched.forget(r.seq)
            r.num_cached_tokens = r.reused_tokens = keep = 0
        if keep:
            r.reuse = {"kv": keep}
            self.stats.prefix_cache_hits += 1
            self.stats.prefix_cache_reused_tokens += keep
            self.stats.kv_reused_tokens += keep

    def save_all(self) -> None:
        """Put what every sequence holds into the prompt cache (at a clean shutdown, before it is written)."""
        if self.cache is None or self.bctx is None:
            return
        for q in range(self.scheduler.n_seq):
            self._save(q, self.scheduler.seq_tokens[q])

    def _save(self, seq: int, held: list[int]) -> None:
        """Keep what seq holds in the host-RAM cache before its cells go to an unrelated prompt."""
        if self.cache is not None and self.cache.wants(held):
            self.cache.put(held, self.bctx.save_seq(seq))

    def _fork(self, parent: Request) -> list[Request]:
        """n > 1: the choices waiting for parent's prompt copy its KV and sample from its last row."""
        forked = self.scheduler.fork(parent)
        for c in forked:
            self.bctx.copy_seq(parent.seq, c.seq)
        self.stats.forked_choices += len(forked)
        return forked

    def _on_token(self, r: Request, tok: int, out: Outbox, row: int) -> None:
        if tok in self.model.eog_ids and not r.sampling.ignore_eos:
            self._end(r, "stop", out)
            return
        r.generated.append(tok)
        piece = self.model.piece(tok, r.render_special)
        lp = None
        if r.sampling.logprobs is not None:
            lp = self._logprob_entry(tok, piece, row, r.sampling.logprobs, r.render_special)
        text, hit = r.stops.push(r.utf8.push(piece))
        if text or lp:
            out.add(r.sink, Delta(text, lp), urgent=not r.sent_text)
            r.sent_text = True
            r.tail = (r.tail + text)[-TAIL_CHARS:]
        if hit:
            self._end(r, "stop", out, flush=False)
        elif len(r.generated) >= r.max_tokens:
            self._end(r, "length", out)
        elif r.num_cached_tokens + 1 >= self.ctx:
            self._end(r, "length", out)

    def _logprob_entry(self, tok: int, piece: bytes, row: int, top: int, special: bool) -> dict[str, Any]:
        """OpenAI's logprobs entry for one sampled token, from the raw logits of its row."""
        lp, best = token_logprobs(self.bctx.logits(row), tok, top)

        def one(t: int, p: float, b: bytes) -> dict[str, Any]:
            # JSON has no NaN or infinity (a model with broken weights gives both): OpenAI's floor instead
            return {"token": b.decode("utf-8", "replace"), "logprob": p if math.isfinite(p) else -9999.0,
                    "bytes": list(b)}
        entry = one(tok, lp, piece)
        entry["top_logprobs"] = [one(t, p, self.model.piece(t, special)) for t, p in best]
        return entry

    def _end(self, r: Request, reason: str, out: Outbox, flush: bool = True, error: EngineError | None = None) -> None:
        if flush and reason not in ("cancelled", "error"):
            rest, _ = r.stops.push(r.utf8.flush())
            rest += r.stops.flush()
            if rest:
                out.add(r.sink, Delta(rest))
        if reason == "cancelled":
            r.evict_ticks = self.stats.decode_calls - (r.cancel_tick or self.stats.decode_calls)
        waiting_choices = [c for c in r.children if c.state in (RequestState.QUEUED, RequestState.PREFILL)] \
            if r.state in (RequestState.QUEUED, RequestState.PREFILL) else []
        self.scheduler.finish(r)
        r.finish_reason = reason
        r.ended_at = time.monotonic()
        if r.sampler:
            r.sampler.free()
        usage = {"prompt_tokens": len(r.prompt), "completion_tokens": len(r.generated),
                 "cached_tokens": r.reused_tokens, "timings": r.timings()}
        out.add(r.sink, Failed(error) if error else End(reason, usage), urgent=True)
        self.done.append(r)
        for c in waiting_choices:  # they were to start from this prompt: they end with it
            self._end(c, reason, out, flush=False, error=error)

    def _fail(self, r: Request, out: Outbox, error: EngineError) -> None:
        """End one request with an error; its sequence's KV is dropped (it may hold half a step)."""
        if r.state in (RequestState.PREFILL, RequestState.DECODE) and r.seq >= 0:
            try:
                self.bctx.clear_seq(r.seq)
            except Exception:
                log.exception("%s: could not clear sequence %d", self.name, r.seq)
            self.scheduler.forget(r.seq)
        self._end(r, "error", out, error=error)

    def fail_all(self, out: Outbox, error: EngineError) -> int:
        """End every live request of this model with error, whatever state each is in (the tick failed, so
        none of them can be trusted to continue); returns how many. Never raises."""
        live = self.live()
        self.inbox.clear()
        for r in live:
            if r.state is RequestState.DONE:
                continue
            try:
                self._fail(r, out, error)
            except Exception:  # _end itself failed: still tell the caller, and free the request's place
                log.exception("%s: could not end request %s cleanly", self.name, r.id)
                self.scheduler.finish(r)
                out.add(r.sink, Failed(error), urgent=True)
        return len(live)

    def free(self) -> None:
        """Release the native objects of the requests still held (after the model's requests ended)."""
        for r in self.scheduler.running:
            if r.sampler:
                r.sampler.free()

    # ---- snapshots (any thread) ------------------------------------------------------------------

    def live(self) -> list[Request]:
        """Every request not yet ended: in the inbox, waiting (with their choices) or running."""
        inbox = [x for r in list(self.inbox) for x in r.family]
        waiting = [x for r in list(self.scheduler.waiting) for x in r.family]
        return [*inbox, *waiting, *list(self.scheduler.running)]
