"""A slot: one loaded GGUF, its batched generation context, and the runner that executes
the scheduler's plan each tick (batch build, one llama_decode, sampling, detokenization).

Everything in here runs on the scheduler thread, except the read-only snapshot methods.
"""
from __future__ import annotations

import logging
import math
import os
import stat
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engine.chat import ChatTemplate
from engine import tools
from engine.errors import ContextLengthExceeded, EngineError, InvalidRequest, ModelLoadError, UnsupportedByModel
from engine.llama import BatchContext, EmbedContext, LlamaModel, SamplerChain, token_logprobs
from engine.requests import SamplingParams
from engine.scheduler import Scheduler, Stream, StreamState
from engine.text import StopMatcher, Utf8Stream
from engine.threads import compute

log = logging.getLogger("llamadesk.engine")

TAIL_CHARS = 80  # how much recent text /v1/streams shows per stream
MAX_TEMPLATE_BYTES = 1 << 20  # a chat template file is Jinja text; the largest real ones are ~20 KB


def read_chat_template(path: str) -> str:
    """The text of a chat template file: a regular UTF-8 file of at most 1 MB (ModelLoadError otherwise,
    so /dev/zero or a binary file is refused before anything is read into memory)."""
    p = Path(path).expanduser()
    shown = path if len(path) <= 300 else path[:300] + "…"
    try:
        with open(p, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ModelLoadError(f"chat_template {shown} is not a regular file")
            if st.st_size > MAX_TEMPLATE_BYTES:
                raise ModelLoadError(f"chat_template {shown} is {st.st_size} bytes; a template may have at most "
                                     f"{MAX_TEMPLATE_BYTES} bytes")
            data = f.read(MAX_TEMPLATE_BYTES + 1)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read chat_template {shown}: {getattr(e, 'strerror', None) or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelLoadError(f"chat_template {shown} is not UTF-8 text (a Jinja template file)") from None
    if "\x00" in text:
        raise ModelLoadError(f"chat_template {shown} is a binary file, not a Jinja template")
    return text


class Outbox:
    """Events for the event loop, gathered over ticks and handed over in one call.

    Delivering every token the moment it exists costs the event loop a wake-up and a socket
    write per token, and on a machine where llama.cpp uses every core that work stalls the
    next decode. So deltas are batched for a few milliseconds; first tokens and endings are
    urgent and leave at once.
    """

    def __init__(self) -> None:
        self.events: list[tuple[Any, tuple]] = []
        self.urgent = False

    def add(self, sink: Any, event: tuple, urgent: bool = False) -> None:
        self.events.append((sink, event))
        self.urgent |= urgent

    def take(self) -> list[tuple[Any, tuple]]:
        events, self.events, self.urgent = self.events, [], False
        return events


@dataclass
class SlotSettings:
    """Per-slot shape: streams, per-stream context, prefill chunk, KV type, threads."""

    streams: int
    ctx: int
    chunk: int
    kv_dtype: str
    threads: int
    default_max_tokens: int
    gpu: str = "auto"
    chat_template: str | None = None  # a Jinja file that replaces the GGUF's template
    tool_format: str | None = None  # None: detected from the template; "none": tools are refused


@dataclass(eq=False)
class Job:
    """The runner's per-stream state."""

    sink: Any  # has .push(event); called on the event loop
    sampling: SamplingParams
    max_tokens: int
    sampler: SamplerChain | None = None
    utf8: Utf8Stream = field(default_factory=Utf8Stream)
    stops: StopMatcher | None = None
    submitted: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    ended_at: float | None = None
    tail: str = ""
    sent_text: bool = False
    render_special: bool = False  # keep special tokens' text (tool-call and reasoning markers) for parsing
    finish_reason: str | None = None
    cancel_tick: int | None = None
    evict_ticks: int | None = None


class SlotStats:
    """Counters of one slot; computed once, read by /v1/stats, /metrics and the dashboard."""

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
        self.embedding_inputs = 0
        self.embedding_decodes = 0
        self.ttft_ms: deque[float] = deque(maxlen=512)
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, generated, prefilled) per tick

    def on_decode(self, streams: int, generated: int, prefilled: int) -> None:
        now = time.monotonic()
        self.decode_calls += 1
        self.max_streams_per_decode = max(self.max_streams_per_decode, streams)
        self.gen_tokens += generated
        self.prefill_tokens += prefilled
        self._recent.append((now, generated, prefilled))
        while self._recent and now - self._recent[0][0] > self.RATE_WINDOW_S:
            self._recent.popleft()

    def rates(self) -> tuple[float, float]:
        """Generated and prefilled tokens per second over the last few seconds."""
        recent = list(self._recent)
        now = time.monotonic()
        recent = [r for r in recent if now - r[0] <= self.RATE_WINDOW_S]
        if not recent:
            return 0.0, 0.0
        span = max(now - recent[0][0], 1.0)
        return sum(r[1] for r in recent) / span, sum(r[2] for r in recent) / span

    def ttft(self) -> dict[str, float]:
        vals = list(self.ttft_ms)
        if not vals:
            return {"avg": 0.0, "p50": 0.0, "p95": 0.0}
        return {"avg": float(np.mean(vals)), "p50": float(np.percentile(vals, 50)),
                "p95": float(np.percentile(vals, 95))}


def job_timings(s: Stream) -> dict[str, float]:
    """llama-server's per-request timings: prompt (queue + prefill until the first token) and generation."""
    job = s.job
    end = job.ended_at or time.monotonic()
    first = job.first_token_at or end
    prompt_ms = (first - job.submitted) * 1000
    predicted_ms = (end - first) * 1000
    predicted = max(len(s.generated) - 1, 0)  # the first token belongs to the prompt phase
    return {"prompt_n": len(s.prompt) - s.reused_tokens, "cache_n": s.reused_tokens,
            "prompt_ms": round(prompt_ms, 3), "predicted_n": len(s.generated), "predicted_ms": round(predicted_ms, 3),
            "predicted_per_second": round(predicted / (predicted_ms / 1000), 2) if predicted and predicted_ms else 0.0}


class Slot:
    """One served model: weights, a generation context with `streams` sequences, a scheduler."""

    def __init__(self, model_id: str, path: Path, settings: SlotSettings,
                 progress: Callable[[float], None] | None = None):
        self.id = model_id
        self.settings = settings
        self.model = LlamaModel(path, settings.gpu, progress)
        self.state = "loading"
        self.embedding_only = self.model.is_embedding_model
        self.ctx = min(settings.ctx, self.model.n_ctx_train) if self.model.n_ctx_train > 0 else settings.ctx
        source = read_chat_template(settings.chat_template) if settings.chat_template else self.model.chat_template
        self.template = ChatTemplate(source, self.model.token_text(self.model.bos_id),
                                     self.model.token_text(self.model.eos_id))
        self.tool_format = settings.tool_format or tools.detect_format(self.template.source)
        self.thinks = tools.thinks(self.template.source)
        self.bctx: BatchContext | None = None
        if not self.embedding_only:
            n_batch = settings.chunk + settings.streams
            self.bctx = BatchContext(self.model, settings.streams, self.ctx, n_batch, settings.threads,
                                     settings.kv_dtype)
        self._ectx: EmbedContext | None = None
        self.scheduler = Scheduler(settings.streams, settings.chunk)
        self.stats = SlotStats()
        self.inbox: deque[Stream] = deque()  # appended on the loop, taken on the scheduler thread
        self.outstanding = 0  # requests admitted and not yet ended (loop thread only)
        self.done: deque[Stream] = deque(maxlen=32)
        self.created = int(time.time())
        self.state = "ready"

    # ---- the tick (scheduler thread) -------------------------------------------------------

    def step(self, out: Outbox) -> bool:
        """Run one tick: admit, plan, decode once, sample. Returns False when there was nothing to do.

        A failure that concerns one stream (its sampler, its detokenizer) ends that stream alone; a failed
        decode ends the streams of that batch; anything else propagates to the worker, which ends every
        stream of this slot (fail_all) and keeps ticking."""
        sched = self.scheduler
        while self.inbox:
            sched.add(self.inbox.popleft())
        for s in [*sched.waiting, *sched.running]:
            if s.cancelled:
                self._end(s, "cancelled", out)
        for s, keep in sched.admit():
            if not self.bctx.keep_prefix(s.seq, keep):
                self.bctx.clear_seq(s.seq)  # this memory type cannot drop a suffix: start over
                sched.forget(s.seq)
                s.num_cached_tokens = s.reused_tokens = keep = 0
            if keep:
                self.stats.prefix_cache_hits += 1
                self.stats.prefix_cache_reused_tokens += keep
        step = sched.schedule()
        if step.n_tokens == 0:
            return False

        bctx = self.bctx
        row = 0
        to_sample: list[tuple[Stream, int]] = []
        # Rows in ascending sequence order, as llama-server fills its batches. Measured here: once
        # sequences had been recycled out of order, arrival-ordered rows made each 4-stream
        # llama_decode 21-28 ms instead of 17 ms (SmolLM2-135M, 2 threads).
        for s in sorted(step.decode, key=lambda st: st.seq):
            bctx.set_row(row, s.generated[-1], s.num_cached_tokens, s.seq, True)
            to_sample.append((s, row))
            row += 1
        for s, n in step.prefill:
            start = s.num_cached_tokens
            completes = start + n == len(s.prompt)
            bctx.decode_prefill(s.seq, s.prompt[start:start + n], start, row, completes)
            if completes:
                to_sample.append((s, row + n - 1))
            row += n
        bctx.set_threads(compute.begin_decode(self.settings.threads))
        try:
            bctx.run(row)
        except RuntimeError as e:
            log.error("%s: %s", self.id, e)
            for s in [*step.decode, *(p for p, _ in step.prefill)]:
                self._fail(s, out, EngineError(f"decode failed: {e}"))
            return True
        finally:
            compute.end_decode()
        sched.advance(step)
        self.stats.on_decode(step.streams, len(to_sample), sum(n for _, n in step.prefill))
        now = time.monotonic()
        for s, r in to_sample:
            try:
                tok = s.job.sampler.sample(bctx, r)
                if s.state is StreamState.PREFILL:
                    sched.start_decoding(s)
                    s.job.first_token_at = now
                    self.stats.ttft_ms.append((now - s.job.submitted) * 1000.0)
                self._on_token(s, tok, out, r)
            except Exception as e:  # this stream's sampler or text: the others go on
                log.exception("%s: stream %s failed while sampling", self.id, s.id)
                self._fail(s, out, EngineError(f"internal error while sampling: {type(e).__name__}"))
        return True

    def _fail(self, s: Stream, out: Outbox, error: EngineError) -> None:
        """End one stream with an error; its sequence's KV is dropped (it may hold half a step)."""
        if s.state in (StreamState.PREFILL, StreamState.DECODE) and s.seq >= 0:
            try:
                self.bctx.clear_seq(s.seq)
            except Exception:
                log.exception("%s: could not clear sequence %d", self.id, s.seq)
            self.scheduler.forget(s.seq)
        self._end(s, "error", out, error=error)

    def fail_all(self, out: Outbox, error: EngineError) -> int:
        """End every live stream of this slot with error, whatever state each is in (the tick failed, so
        none of them can be trusted to continue); returns how many. Never raises."""
        streams = self.live_streams()
        self.inbox.clear()
        for s in streams:
            if s.state is StreamState.DONE:
                continue
            try:
                self._fail(s, out, error)
            except Exception:  # _end itself failed: still tell the caller, and free the stream's place
                log.exception("%s: could not end stream %s cleanly", self.id, s.id)
                self.scheduler.finish(s)
                out.add(s.job.sink, ("error", error), urgent=True)
        return len(streams)

    def _on_token(self, s: Stream, tok: int, out: Outbox, row: int) -> None:
        job = s.job
        if tok in self.model.eog_ids and not job.sampling.ignore_eos:
            self._end(s, "stop", out)
            return
        s.generated.append(tok)
        piece = self.model.piece(tok, job.render_special)
        lp = None
        if job.sampling.logprobs is not None:
            lp = self._logprob_entry(tok, piece, row, job.sampling.logprobs, job.render_special)
        text, hit = job.stops.push(job.utf8.push(piece))
        if text or lp:
            out.add(job.sink, ("delta", text, lp), urgent=not job.sent_text)
            job.sent_text = True
            job.tail = (job.tail + text)[-TAIL_CHARS:]
        if hit:
            self._end(s, "stop", out, flush=False)
        elif len(s.generated) >= job.max_tokens:
            self._end(s, "length", out)
        elif s.num_cached_tokens + 1 >= self.ctx:
            self._end(s, "length", out)

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

    def _end(self, s: Stream, reason: str, out: Outbox, flush: bool = True, error: EngineError | None = None) -> None:
        job = s.job
        if flush and reason not in ("cancelled", "error"):
            rest, _ = job.stops.push(job.utf8.flush())
            rest += job.stops.flush()
            if rest:
                out.add(job.sink, ("delta", rest))
        if reason == "cancelled":
            job.evict_ticks = self.stats.decode_calls - (job.cancel_tick or self.stats.decode_calls)
        self.scheduler.finish(s)
        job.finish_reason = reason
        job.ended_at = time.monotonic()
        if job.sampler:
            job.sampler.free()
        usage = {"prompt_tokens": len(s.prompt), "completion_tokens": len(s.generated),
                 "cached_tokens": s.reused_tokens, "timings": job_timings(s)}
        out.add(job.sink, ("error", error) if error else ("end", reason, usage), urgent=True)
        self.done.append(s)

    # ---- admission (event loop) -------------------------------------------------------------

    def make_stream(self, stream_id: str, prompt: list[int], sampling: SamplingParams, sink: Any,
                    explicit_max: bool, render_special: bool = False) -> Stream:
        """Check a prompt against the context and wrap it as a stream (raises ContextLengthExceeded)."""
        if self.embedding_only:
            raise UnsupportedByModel(f"model '{self.id}' is an embedding model: it serves /v1/embeddings only",
                                     "model")
        n = len(prompt)
        room = self.ctx - n
        if room < 1:
            raise ContextLengthExceeded(
                f"the prompt is {n} tokens but the context of model '{self.id}' is {self.ctx} tokens "
                f"per stream; shorten it or send \"truncation\": \"auto\"", "messages")
        wanted = sampling.max_tokens or self.settings.default_max_tokens
        if explicit_max and wanted > room:
            raise ContextLengthExceeded(
                f"this model's context is {self.ctx} tokens per stream, but {n + wanted} were requested "
                f"({n} in the prompt, {wanted} for the completion)", "max_tokens")
        job = Job(sink=sink, sampling=sampling, max_tokens=min(wanted, room), stops=StopMatcher(sampling.stop),
                  render_special=render_special)
        return Stream(id=stream_id, prompt=prompt, job=job)

    def check_sampling(self, sp: SamplingParams) -> None:
        """400s for sampling settings this model cannot take (before the request is admitted)."""
        bad = [t for t in sp.logit_bias if not 0 <= t < self.model.n_vocab]
        if bad:
            raise InvalidRequest(f"'logit_bias' names token id {bad[0]}, outside the vocabulary of model "
                                 f"'{self.id}' (0..{self.model.n_vocab - 1})", "logit_bias")

    def new_sampler(self, sp: SamplingParams) -> SamplerChain:
        """The request's native sampler chain (InvalidRequest for a grammar llama.cpp refuses). Built off the
        scheduler thread, before admission: it reads only the vocabulary."""
        self.check_sampling(sp)
        bias = dict(sp.logit_bias)
        if sp.ignore_eos:
            bias.update({t: -float("inf") for t in self.model.eog_ids})
        seed = sp.seed if sp.seed is not None else int.from_bytes(np.random.bytes(4), "little")
        return SamplerChain(
            self.model, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p,
            repeat_penalty=sp.repeat_penalty, presence_penalty=sp.presence_penalty,
            frequency_penalty=sp.frequency_penalty, penalty_last_n=sp.penalty_last_n, seed=seed, logit_bias=bias,
            grammar=sp.grammar, grammar_triggers=sp.grammar_triggers)

    # ---- embeddings (scheduler thread) ------------------------------------------------------

    def embed_limit(self) -> int:
        """Longest input (in tokens) one embedding can take."""
        return min(self.model.n_ctx_train or 2048, 2048)

    def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Vectors for several token lists, packed into as few decodes as fit."""
        if self._ectx is None:
            self._ectx = EmbedContext(self.model, self.settings.threads, self.embed_limit())
        ectx = self._ectx
        vectors: list[np.ndarray] = []
        group: list[list[int]] = []
        used = decodes = 0
        for toks in inputs:
            if group and (used + len(toks) > ectx.n_batch or len(group) == ectx.MAX_SEQS):
                vectors += ectx.embed_group(group)
                group, used, decodes = [], 0, decodes + 1
            group.append(toks)
            used += len(toks)
        if group:
            vectors += ectx.embed_group(group)
            decodes += 1
        self.stats.embedding_inputs += len(inputs)
        self.stats.embedding_decodes += decodes
        return vectors

    # ---- snapshots (any thread) -------------------------------------------------------------

    def live_streams(self) -> list[Stream]:
        return [*list(self.inbox), *list(self.scheduler.waiting), *list(self.scheduler.running)]

    def stream_info(self, s: Stream) -> dict[str, Any]:
        job = s.job
        now = job.ended_at or time.monotonic()
        tok_s = 0.0
        if job.first_token_at is not None and len(s.generated) > 1:
            tok_s = (len(s.generated) - 1) / max(now - job.first_token_at, 1e-6)
        state = "queued" if s.state is StreamState.INBOX else s.state.value  # the thread has not taken it yet
        info = {"id": s.id, "model": self.id, "state": state, "prompt_tokens": len(s.prompt),
                "prompt_done": min(s.num_cached_tokens, len(s.prompt)), "gen_tokens": len(s.generated),
                "max_tokens": job.max_tokens, "tok_s": round(tok_s, 2), "tail": job.tail,
                "seq": s.seq if s.seq >= 0 else None}
        if s.state is StreamState.DONE:
            info["finish_reason"] = job.finish_reason
            if job.evict_ticks is not None:
                info["evict_ticks"] = job.evict_ticks
        return info

    def stats_entry(self) -> dict[str, Any]:
        st = self.stats
        gen_rate, prefill_rate = st.rates()
        live = self.live_streams()
        return {
            "id": self.id, "state": self.state, "ctx": self.ctx, "streams": self.settings.streams,
            "chunk": self.settings.chunk, "kv_dtype": self.settings.kv_dtype,
            "embedding_only": self.embedding_only,
            "gen_tokens": st.gen_tokens, "prefill_tokens": st.prefill_tokens, "decode_calls": st.decode_calls,
            "max_streams_per_decode": st.max_streams_per_decode,
            "prefix_cache_hits": st.prefix_cache_hits, "prefix_cache_reused_tokens": st.prefix_cache_reused_tokens,
            "active_streams": sum(1 for s in live if s.state in (StreamState.PREFILL, StreamState.DECODE)),
            "queued_streams": sum(1 for s in live if s.state in (StreamState.INBOX, StreamState.QUEUED)),
            "rejected_requests": st.rejected_requests, "requests": st.requests,
            "embedding_inputs": st.embedding_inputs, "embedding_decodes": st.embedding_decodes,
            "ttft_ms": st.ttft(), "gen_tok_s": round(gen_rate, 2), "prefill_tok_s": round(prefill_rate, 2),
        }

    def describe(self) -> dict[str, Any]:
        m = self.model
        return {"path": str(m.path), "file_size": m.file_size, "arch": m.arch, "quant": m.quant(),
                "params": m.n_params, "n_ctx_train": m.n_ctx_train, "description": m.description,
                "embedding_only": self.embedding_only, "chunk": self.settings.chunk, "kv_dtype": self.settings.kv_dtype}

    def free(self) -> None:
        """Release every native object of the slot (scheduler thread, after all streams ended)."""
        for s in self.scheduler.running:
            if s.job.sampler:
                s.job.sampler.free()
        if self.bctx:
            self.bctx.free()
        if self._ectx:
            self._ectx.free()
        self.model.free()
        self.state = "unloaded"

