"""The facade the HTTP routes and the GUI panels both call (in process, awaited on the loop).

One scheduler thread owns every llama.cpp context call and steps each slot in turn; callers on
the asyncio side get a per-request `Generation` that the thread fills through
`loop.call_soon_threadsafe`, once per tick for all streams together.
"""
from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import platform
import shutil
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from engine import catalog as cat
from engine import llama, tools
from engine.chat import turns
from engine.config import KV_DTYPES, Config, ModelEntry, save_authoritative
from engine.downloads import Downloader
from engine.errors import (BenchRunning, Conflict, ContextLengthExceeded, EngineError, EngineStopped, InvalidRequest,
                           ModelLoadError, ModelNotFound, NoModelLoaded, QueueFull, SpeechUnavailable,
                           UnsupportedByModel)
from engine.requests import ChatRequest, CompletionRequest, SamplingParams
from engine.slot import Outbox, Slot, SlotSettings, read_chat_template
from engine.threads import lower_priority

log = logging.getLogger("llamadesk.engine")
VERSION = "0.1.0"
MAX_QUEUED = 32  # requests waiting for a stream, per model, before 503
FLUSH_S = 0.02  # longest a generated delta waits to be batched with the next ones


class Generation:
    """One request's collector: the scheduler thread fills it, the caller iterates its text."""

    def __init__(self, service: "Service", slot: Slot, request_id: str):
        self.id = request_id
        self.model = slot.id
        self.created = int(time.time())
        self._service = service
        self._slot = slot
        self._stream = None
        self.prompt_tokens = 0
        self.logprobs: list[dict] = []  # entries not yet taken (take_logprobs)
        # how to read the output: tool-call wire format, whether tools are on, whether it may <think>
        self.tool_format = slot.tool_format
        self.tools_active = False
        self.reasoning = False
        self.in_reasoning = False
        self.constrained_calls = False  # a grammar guarantees every call completes (so calls may stream)
        self._pending: list[str] = []
        self._wake = asyncio.Event()
        self._ended = False
        self.error: EngineError | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, int] = {}

    def push(self, event: tuple) -> None:
        """Take an event from the scheduler thread (runs on the event loop)."""
        kind = event[0]
        if kind == "delta":
            if event[1]:
                self._pending.append(event[1])
            if len(event) > 2 and event[2]:
                self.logprobs.append(event[2])
        elif kind == "end":
            self.finish_reason, self.usage = event[1], event[2]
            self._close()
        elif kind == "error":
            self.error = event[1]
            self._close()
        self._wake.set()

    def _close(self) -> None:
        if not self._ended:
            self._ended = True
            self._slot.outstanding -= 1

    async def chunks(self) -> AsyncIterator[str]:
        """The generated text as it comes, one string per delivery (all pieces since the last one)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._pending:
                text = "".join(self._pending)
                self._pending.clear()
                yield text
            if self.error:
                raise self.error
            if self._ended:
                return

    def take_logprobs(self) -> list[dict]:
        """The logprob entries of the tokens delivered since the last call."""
        out, self.logprobs = self.logprobs, []
        return out

    async def text(self) -> str:
        """The whole generated text (buffered mode)."""
        return "".join([c async for c in self.chunks()])

    def cancel(self) -> None:
        """Abort the request in the engine: its stream is evicted at the next tick."""
        if self._stream is not None and not self._ended:
            self._stream.job.cancel_tick = self._slot.stats.decode_calls
            self._stream.cancelled = True
            self._service._worker.wake()


class _Worker(threading.Thread):
    """The scheduler thread: runs queued calls, then one tick of every slot, then delivers."""

    def __init__(self, loop: asyncio.AbstractEventLoop, slots: Callable[[], list[Slot]]):
        super().__init__(name="llamadesk-scheduler", daemon=True)
        self._event_loop = loop
        self.restarts = 0  # times the loop failed and was restarted
        self.tick_errors = 0  # slot ticks that failed (their streams were ended)
        self.recovering = False
        self._slots = slots
        self._calls: deque[tuple[Callable[[], Any], concurrent.futures.Future]] = deque()
        self._event = threading.Event()
        self._stopping = False

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

    @property
    def healthy(self) -> bool:
        """Whether the thread is alive and ticking (not recovering from a failed loop)."""
        return self.is_alive() and not self.recovering

    def run(self) -> None:
        """The supervisor: the loop below never ends on an exception, it is logged, counted and restarted."""
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
            for slot in self._slots():
                try:
                    worked |= slot.step(out)
                except Exception as e:
                    self.tick_errors += 1
                    log.exception("scheduler tick failed for %s; ending its streams", slot.id)
                    n = slot.fail_all(out, EngineError(f"internal error in the scheduler ({type(e).__name__}); "
                                                       "the request was ended, the server keeps serving"))
                    log.error("%s: %d stream(s) ended by the failed tick", slot.id, n)
            self.recovering = False
            now = time.monotonic()
            if out.events and (out.urgent or not worked or now - last_flush >= FLUSH_S):
                self._event_loop.call_soon_threadsafe(_deliver, out.take())
                last_flush = now
            if not worked and not self._calls:
                self._event.wait()
                self._event.clear()


def _deliver(out: list) -> None:
    for sink, event in out:
        try:
            sink.push(event)
        except Exception:  # one collector's failure must not lose the other requests' events
            log.exception("delivering an engine event failed")


def _check_shape(entry: ModelEntry) -> None:
    """400s for per-model settings llama.cpp cannot take."""
    for key, lo, hi in (("ctx", 64, 1 << 22), ("streams", 1, 64), ("chunk", 16, 1 << 16)):
        value = getattr(entry, key)
        if value is not None and not lo <= value <= hi:
            raise InvalidRequest(f"'{key}' must be between {lo} and {hi}, got {value}", key)
    if entry.kv_dtype is not None and entry.kv_dtype not in KV_DTYPES:
        raise InvalidRequest(f"'kv_dtype' must be one of {', '.join(KV_DTYPES)}, got {entry.kv_dtype!r}", "kv_dtype")


class Service:
    """Models, generation, embeddings and counters behind one in-process API."""

    def __init__(self, config: Config):
        self.config = config
        self.slots: dict[str, Slot] = {}
        self.default_id: str | None = None
        self.started = time.monotonic()
        self.started_wall = time.time()
        self._worker: _Worker | None = None
        self._prep = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="llamadesk-prep")
        self._ids = itertools.count(1)
        self.loading: set[str] = set()
        self._catalog: list[cat.Entry] | None = None
        self.downloader: Downloader | None = None
        self.asr = self.tts = self.vad = None  # speech services (engine/speech); None when not loaded
        self.bench_state: dict[str, Any] = {"state": "idle"}
        self.bench_history: list[dict[str, Any]] = []
        self.bench_task: asyncio.Task | None = None
        self.speech_errors: dict[str, str] = {}  # why a configured speech model is not serving
    # ---- lifecycle ----------------------------------------------------------------------------

    def slot_settings(self, entry: ModelEntry) -> SlotSettings:
        """The global settings with the roster entry's overrides applied."""
        c = self.config
        return SlotSettings(streams=entry.streams or c.streams, ctx=entry.ctx or c.ctx, chunk=entry.chunk or c.chunk,
                            kv_dtype=entry.kv_dtype or c.kv_dtype, threads=c.threads or llama.default_threads(),
                            default_max_tokens=c.max_tokens, gpu=c.gpu, chat_template=entry.chat_template,
                            tool_format=entry.tool_format)

    def load_speech(self) -> None:
        """Start the VAD, ASR and TTS services; a model that fails is logged and its routes explain (degrade,
        never die). Blocking; call before start() or from a worker thread."""
        from engine.speech.asr import AsrService
        from engine.speech.tts import TtsService
        from engine.speech.vad import VadService
        c = self.config
        vad_path = Path(c.vad).expanduser() if c.vad else Path(__file__).resolve().parent.parent / "resources" / \
            "models" / "silero_vad.onnx"
        for kind, make in (("vad", lambda: VadService(vad_path)),
                           ("asr", lambda: AsrService(Path(c.asr).expanduser(), c.asr_workers, self.vad) if c.asr else None),
                           ("tts", lambda: TtsService(Path(c.tts).expanduser()) if c.tts else None)):
            try:
                svc = make()
            except Exception as e:  # a broken model must not take the server down
                msg = e.message if isinstance(e, EngineError) else f"{type(e).__name__}: {e}"
                self.speech_errors[kind] = msg
                log.error("%s model not loaded: %s", kind.upper(), msg)
                continue
            setattr(self, kind, svc)
            if svc is not None:
                log.info("%s ready: %s", kind.upper(), getattr(svc, "id", vad_path.name))

    def speech(self, kind: str):
        """The ASR or TTS service, or a clear error saying how to get one."""
        self._not_benching()
        svc = getattr(self, kind)
        if svc is None:
            what = {"asr": "speech-to-text", "tts": "text-to-speech", "vad": "voice activity detection"}[kind]
            why = f" ({self.speech_errors[kind]})" if kind in self.speech_errors else ""
            flag = f"start with --{kind} or download one from the catalog" if kind != "vad" else "check --vad"
            raise SpeechUnavailable(f"no {what} model loaded{why}: {flag}")
        return svc

    def load_models(self) -> None:
        """Load every roster entry (blocking; call before start(), or from a worker thread)."""
        for entry in self.config.models:
            t0 = time.monotonic()
            slot = Slot(entry.name, Path(entry.path).expanduser(), self.slot_settings(entry))
            self.slots[entry.name] = slot
            if entry.default or self.default_id is None:
                self.default_id = entry.name
            log.info("loaded %s (%s, %s, ctx %d x %d streams) in %.1f s", entry.name, slot.model.arch,
                     slot.model.quant(), slot.ctx, slot.settings.streams, time.monotonic() - t0)

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the scheduler thread, delivering to loop (the running loop by default)."""
        loop = loop or asyncio.get_running_loop()
        self._worker = _Worker(loop, lambda: list(self.slots.values()))
        self._worker.start()
        self.downloader = Downloader(self.config.models_dir(), mirror=self.config.catalog_mirror)

    async def stop(self) -> None:
        """Abort every request, stop the scheduler thread and free the models."""
        if self._worker is None:
            return
        if self.downloader:
            await self.downloader.close()
        for slot in self.slots.values():
            for s in slot.live_streams():
                s.cancelled = True
        worker = self._worker
        fut = worker.call(lambda: [slot.step(Outbox()) for slot in self.slots.values()])
        try:
            await asyncio.wait_for(asyncio.wrap_future(fut), 10)
        except (asyncio.TimeoutError, EngineError):
            pass
        worker.stop()
        await asyncio.get_running_loop().run_in_executor(None, worker.join, 10)
        for svc in (self.asr, self.tts, self.vad):
            if svc is not None:
                svc.pool.close()
        for slot in self.slots.values():
            slot.free()
        self._worker = None
        self._prep.shutdown(wait=False)

    @property
    def setup_mode(self) -> bool:
        return not self.slots

    @property
    def status(self) -> str:
        """ok, loading (a model is being loaded), setup (nothing to serve yet) or degraded (the scheduler
        thread is not ticking: it is recovering from a failed loop, or it died)."""
        if self._worker is not None and not self._worker.healthy:
            return "degraded"
        if self.loading:
            return "loading"
        return "setup" if self.setup_mode else "ok"

    async def add_model(self, entry: ModelEntry, make_default: bool = False,
                        progress: Callable[[float], None] | None = None) -> Slot:
        """Load a model into the roster without a restart (weights and context built off the loop);
        progress(fraction) is called on the event loop as the weights load."""
        self._not_benching("load a model")
        _check_shape(entry)
        if entry.chat_template:  # a file that is no template is refused before any weights load
            await asyncio.to_thread(read_chat_template, entry.chat_template)
        if entry.name in self.loading:
            raise Conflict(f"model '{entry.name}' is already loading")
        if entry.name in self.slots:
            raise Conflict(f"a model named '{entry.name}' is already loaded")
        self.loading.add(entry.name)
        try:
            t0 = time.monotonic()
            loop = asyncio.get_running_loop()
            report = (lambda f: loop.call_soon_threadsafe(progress, f)) if progress else None
            slot = await asyncio.to_thread(Slot, entry.name, Path(entry.path).expanduser(), self.slot_settings(entry),
                                           report)
        finally:
            self.loading.discard(entry.name)
        self.slots[entry.name] = slot  # the scheduler thread steps it from its next tick
        if make_default or self.default_id is None:
            self.default_id = entry.name
        log.info("loaded %s in process in %.1f s", entry.name, time.monotonic() - t0)
        return slot

    async def remove_model(self, name: str) -> None:
        """Unload a model: abort its streams, drop it from the roster, free it on the scheduler thread."""
        self._not_benching("unload a model")
        slot = self.slots.pop(name, None)
        if slot is None:
            raise ModelNotFound(f"The model '{name}' is not loaded", "model")
        for s in slot.live_streams():
            s.cancelled = True
        out = Outbox()
        await self._run(lambda: (slot.step(out), slot.free()))
        _deliver(out.take())  # the aborted requests learn that they ended
        if self.default_id == name:
            self.default_id = next(iter(self.slots), None)
        log.info("unloaded %s", name)

    async def reload_model(self, name: str, ctx: int | None = None, streams: int | None = None,
                           chunk: int | None = None, kv_dtype: str | None = None,
                           progress: Callable[[float], None] | None = None) -> dict[str, Any]:
        """Serve a loaded model again with other per-model settings (its streams are aborted; the weights are
        mmap'd, so the second load comes from the page cache). The roster entry keeps the new settings and
        is saved as the authoritative config; if the new shape cannot load, the old one is put back."""
        if name not in self.slots:
            raise ModelNotFound(f"The model '{name}' is not loaded", "model")
        old = next((m for m in self.config.models if m.name == name), None) or \
            ModelEntry(name=name, path=str(self.slots[name].model.path))
        new = dataclasses.replace(old, **{k: v for k, v in (("ctx", ctx), ("streams", streams), ("chunk", chunk),
                                                             ("kv_dtype", kv_dtype)) if v is not None})
        _check_shape(new)
        was_default = self.default_id == name
        await self.remove_model(name)
        try:
            await self.add_model(new, make_default=was_default, progress=progress)
        except EngineError:
            await self.add_model(old, make_default=was_default)
            raise
        if old in self.config.models:
            self.config.models[self.config.models.index(old)] = new
        else:  # a model loaded without a roster entry (the GUI's Open GGUF…) gets one
            self.config.models.append(new)
        if self.config.path is not None:
            await asyncio.to_thread(save_authoritative, self.config.path, {}, self.config.models)
        log.info("reloaded %s with ctx %s, streams %s, chunk %s, kv %s", name, new.ctx, new.streams, new.chunk,
                 new.kv_dtype)
        return next(m for m in self.models() if m["id"] == name)

    # ---- catalog and downloads ----------------------------------------------------------------

    def catalog_entries(self) -> list[cat.Entry]:
        """The catalog (shipped, or catalog_path), read once."""
        if self._catalog is None:
            path = Path(self.config.catalog_path).expanduser() if self.config.catalog_path else None
            self._catalog = cat.load_catalog(path)
        return self._catalog

    def catalog_entry(self, name: str) -> cat.Entry:
        for e in self.catalog_entries():
            if e.name == name:
                return e
        raise ModelNotFound(f"'{name}' is not in the catalog", "name")

    def catalog(self) -> dict[str, Any]:
        """Every entry with what is on disk, its fit badge and its download state; the box facts."""
        c = self.config
        models_dir = c.models_dir()
        box = cat.box_facts()
        downloads = self.downloader.downloads if self.downloader else {}
        entries = []
        for e in self.catalog_entries():
            d = cat.describe(e, models_dir, c.ctx, c.streams, c.kv_dtype, box)
            d["download"] = downloads[e.name].as_dict() if e.name in downloads else None
            d["served"] = e.name in self.slots
            entries.append(d)
        return {"box": box, "models_dir": str(models_dir), "entries": entries,
                "local": cat.unknown_local_ggufs(self.catalog_entries(), models_dir)}

    def download(self, name: str, tower: str | None = None) -> dict[str, Any]:
        """Queue the entry (or, with tower, that tower of the entry) for download."""
        self._not_benching("start a download")
        e = self.catalog_entry(name)
        if tower is not None:
            if tower not in e.towers:
                raise InvalidRequest(f"'{name}' has no tower '{tower}'; its towers: {', '.join(e.towers) or 'none'}",
                                     "tower")
            e = self.catalog_entry(tower)
        return self.downloader.enqueue(e).as_dict()

    def cancel_download(self, name: str) -> bool:
        """Cancel a queued or running download (False when there is none)."""
        return self.downloader.cancel(name)

    async def serve(self, name: str) -> dict[str, Any]:
        """Serve a downloaded catalog entry now, in process: an LLM or embedding model joins the roster as
        the default (with its speech towers already on disk wired in), an ASR or TTS model replaces the
        speech model; the result is saved as the authoritative config, so the next start serves it too."""
        e = self.catalog_entry(name)
        if e.kind not in ("llm", "embedding", "asr", "tts"):
            raise InvalidRequest(f"'{name}' is a {e.kind} model: it is served as a tower of another entry",
                                 "name")
        path = self._downloaded(e)
        values: dict[str, Any] = {}
        if e.kind in ("asr", "tts"):
            await self.set_speech(e.kind, path)
            values[e.kind] = path
        else:
            entry = ModelEntry(name=e.name, path=path, default=True)
            if name not in self.slots:
                await self.add_model(entry, make_default=True)
            self.default_id = name
            roster = [m for m in self.config.models if m.name != name]
            for m in roster:
                m.default = False
            self.config.models = [entry, *roster]
        towers = []
        for t in (self.catalog_entry(t) for t in e.towers):
            state = cat.local_state(t, self.config.models_dir())
            wired = False
            if t.kind in ("asr", "tts") and state["state"] in ("verified", "present"):
                await self.set_speech(t.kind, state["path"])
                values[t.kind] = state["path"]
                wired = True
            # an mmproj (vision) tower is kept on disk: serving images needs the vision engine
            towers.append({"name": t.name, "kind": t.kind, "local": state["state"], "wired": wired})
        self.config.values.update(values)
        for k in values:
            self.config.sources[k] = "toml"
        if self.config.path is not None:
            await asyncio.to_thread(save_authoritative, self.config.path, values, self.config.models)
        return {"served": name, "kind": e.kind, "default": e.kind in ("llm", "embedding"),
                "config": str(self.config.path), "towers": towers}

    def _downloaded(self, e: cat.Entry) -> str:
        state = cat.local_state(e, self.config.models_dir())
        if state["state"] not in ("verified", "present"):
            raise Conflict(f"'{e.name}' is not downloaded yet ({state['state']}): POST /catalog/download first")
        return state["path"]

    async def set_speech(self, kind: str, path: str) -> None:
        """Replace the ASR or TTS model in process (built off the loop; the old one is closed)."""
        from engine.speech.asr import AsrService
        from engine.speech.tts import TtsService
        if kind == "asr":
            svc = await asyncio.to_thread(AsrService, Path(path), self.config.asr_workers, self.vad)
        else:
            svc = await asyncio.to_thread(TtsService, Path(path))
        old = getattr(self, kind)
        self.speech_errors.pop(kind, None)
        setattr(self, kind, svc)
        if old is not None:
            old.pool.close()
        log.info("%s now serves %s", kind.upper(), svc.id)

    async def import_gguf(self, path: str) -> dict[str, Any]:
        """Copy a GGUF from disk into models_dir so the catalog lists it (checked to be a GGUF first)."""
        src = Path(path).expanduser()
        llama.check_gguf(src)
        dest_dir = self.config.models_dir()
        dest = dest_dir / src.name
        if dest.exists():
            raise Conflict(f"{dest} already exists")
        dest_dir.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".importing")
        await asyncio.to_thread(shutil.copyfile, src, tmp)
        os.replace(tmp, dest)
        return {"name": dest.stem, "path": str(dest), "size": dest.stat().st_size}

    def _run(self, fn: Callable[[], Any]) -> asyncio.Future:
        if self._worker is None:
            raise EngineStopped("the engine is not running")
        return asyncio.wrap_future(self._worker.call(fn))

    # ---- routing ------------------------------------------------------------------------------

    def slot_for(self, model: str | None) -> Slot:
        """The slot serving `model` (None: the default); ModelNotFound / NoModelLoaded otherwise."""
        if not self.slots:
            raise NoModelLoaded("no model loaded: download one from the catalog (GET /catalog) or start with --model")
        if model is None or model == "":
            return self.slots[self.default_id]
        slot = self.slots.get(model)
        if slot is None:
            raise ModelNotFound(f"The model '{model}' does not exist; available: {', '.join(self.slots)}", "model")
        return slot

    # ---- generation ---------------------------------------------------------------------------

    def _not_benching(self, action: str | None = None) -> None:
        """503 for work (or 409 for an action) while the benchmark has the engine."""
        if self.bench_state["state"] == "running":
            if action:
                raise Conflict(f"cannot {action} while the benchmark runs; retry when GET /bench says done")
            raise BenchRunning("a benchmark is running; retry in a few seconds")

    async def chat(self, req: ChatRequest) -> Generation:
        """Render, tokenize and queue a chat completion; iterate the result's chunks()."""
        self._not_benching()
        slot = self.slot_for(req.model)
        if req.tools and req.tool_choice != "none" and slot.tool_format == "none":
            raise UnsupportedByModel(f"model '{slot.id}' is configured without tool calling (tool_format = "
                                     "\"none\")", "tools")
        plan = tools.plan_tools(slot.tool_format, req.messages, req.tools, req.tool_choice, req.parallel_tool_calls)
        sampling = req.sampling
        if plan.grammar and sampling.grammar and not plan.grammar_triggers:
            raise InvalidRequest("response_format cannot be combined with a required or forced tool call",
                                 "response_format")
        constrained = False
        if plan.grammar and not sampling.grammar:  # with response_format and tool_choice auto, the format wins
            sampling = dataclasses.replace(sampling, grammar=plan.grammar, grammar_triggers=plan.grammar_triggers)
            constrained = True
        req = dataclasses.replace(req, messages=plan.messages,
                                  template_kwargs={**req.template_kwargs, **plan.template_kwargs})
        prompt, text = await asyncio.get_running_loop().run_in_executor(self._prep, self._chat_tokens, slot, req)
        reasoning = slot.thinks and req.template_kwargs.get("enable_thinking") is not False
        gen = await self._submit(slot, prompt, sampling, render_special=plan.tools_active or reasoning)
        gen.tools_active, gen.reasoning, gen.constrained_calls = plan.tools_active, reasoning, constrained
        # templates that open <think> in the generation prompt: the reply starts inside the reasoning
        gen.in_reasoning = reasoning and text.rstrip().endswith("<think>")
        return gen

    async def complete(self, req: CompletionRequest) -> Generation:
        """Tokenize and queue a raw completion."""
        self._not_benching()
        slot = self.slot_for(req.model)
        if isinstance(req.prompt, str):
            prompt = await asyncio.get_running_loop().run_in_executor(self._prep, self._tokenize, slot, req.prompt)
        else:
            prompt = list(req.prompt)
            bad = [t for t in prompt if not 0 <= t < slot.model.n_vocab]
            if bad:
                raise InvalidRequest(f"token id {bad[0]} is outside the vocabulary (0..{slot.model.n_vocab - 1})",
                                     "prompt")
        if not prompt:
            raise InvalidRequest("the prompt is empty", "prompt")
        return await self._submit(slot, prompt, req.sampling)

    async def _submit(self, slot: Slot, prompt: list[int], sampling: SamplingParams,
                      render_special: bool = False) -> Generation:
        """Check the request against the model, build its sampler (a grammar llama.cpp refuses is a 400
        here, before anything streams) and hand it to the scheduler thread."""
        if self._worker is None:
            raise EngineStopped("the engine is not running")
        if slot.outstanding >= slot.settings.streams + MAX_QUEUED:
            slot.stats.rejected_requests += 1
            raise QueueFull(f"model '{slot.id}' is busy: {slot.settings.streams} streams generating and "
                            f"{MAX_QUEUED} requests queued; retry later")
        gen = Generation(self, slot, f"{next(self._ids):x}{uuid.uuid4().hex[:12]}")
        stream = slot.make_stream(gen.id, prompt, sampling, gen, explicit_max=sampling.max_tokens is not None,
                                  render_special=render_special)
        slot.check_sampling(sampling)
        slot.outstanding += 1  # the place is taken while the sampler is built; given back if that fails
        fut = asyncio.get_running_loop().run_in_executor(self._prep, slot.new_sampler, sampling)
        try:
            stream.job.sampler = await asyncio.shield(fut)
        except BaseException:
            slot.outstanding -= 1
            # the client left while the sampler was built: free it once it exists
            fut.add_done_callback(lambda f: f.cancelled() or f.exception() or f.result().free())
            raise
        gen._stream = stream
        gen.prompt_tokens = len(prompt)
        slot.stats.requests += 1
        slot.inbox.append(stream)
        self._worker.wake()
        return gen

    def _tokenize(self, slot: Slot, text: str) -> list[int]:
        m = slot.model
        add_bos = m.add_bos and not (slot.template.bos and text.startswith(slot.template.bos))
        return m.tokenize(text, add_special=add_bos, parse_special=True)

    def _chat_tokens(self, slot: Slot, req: ChatRequest) -> tuple[list[int], str]:
        """The prompt tokens and text; with truncation 'auto', oldest user-led turns go until it fits."""
        messages = req.messages
        text = slot.template.render(messages, **req.template_kwargs)
        tokens = self._tokenize(slot, text)
        if req.truncation != "auto":
            return tokens, text
        sp = req.sampling
        need = sp.max_tokens or min(slot.settings.default_max_tokens, slot.ctx // 4)
        system, groups = turns(messages)
        while len(tokens) + need > slot.ctx and len(groups) > 1:
            groups.pop(0)
            kept = system + [i for g in groups for i in g]
            messages = [req.messages[i] for i in kept]
            text = slot.template.render(messages, **req.template_kwargs)
            tokens = self._tokenize(slot, text)
        if len(tokens) + need > slot.ctx:
            raise ContextLengthExceeded(
                f"even with truncation the system prompt and latest turn take {len(tokens)} tokens, which with "
                f"{need} for the completion exceeds the context of {slot.ctx}", "messages")
        return tokens, text

    # ---- embeddings ---------------------------------------------------------------------------

    async def embed(self, model: str | None, inputs: list[str | list[int]]) -> tuple[str, list, int]:
        """(model id, unit-norm vectors, prompt tokens) for every input, batched into few decodes."""
        self._not_benching()
        slot = self.slot_for(model)
        loop = asyncio.get_running_loop()
        toks = await loop.run_in_executor(self._prep, self._embed_tokens, slot, inputs)
        vectors = await self._run(lambda: slot.embed(toks))
        return slot.id, vectors, sum(len(t) for t in toks)

    def _embed_tokens(self, slot: Slot, inputs: list[str | list[int]]) -> list[list[int]]:
        out = []
        limit = slot.embed_limit()
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                if not item:
                    raise InvalidRequest(f"input[{i}] is an empty string", "input")
                toks = slot.model.tokenize(item, add_special=True, parse_special=False)
            else:
                toks = list(item)
                if not toks or any(not 0 <= t < slot.model.n_vocab for t in toks):
                    raise InvalidRequest(f"input[{i}] is not a non-empty list of valid token ids", "input")
            if len(toks) > limit:
                raise ContextLengthExceeded(f"input[{i}] is {len(toks)} tokens; model '{slot.id}' embeds at most "
                                            f"{limit}", "input")
            out.append(toks)
        return out

    # ---- benchmark ----------------------------------------------------------------------------

    async def run_bench(self, model: str | None = None) -> dict[str, Any]:
        """llama-bench's rows (pp512, tg128, tg128@N) on a served model; the engine is refused other work
        (503) and model or download changes (409) meanwhile."""
        return await self.finish_bench(self.begin_bench(model))

    def begin_bench(self, model: str | None = None) -> Slot:
        """Claim the engine for a benchmark of model (409 when busy); finish_bench runs it."""
        self._not_benching("start a benchmark")
        slot = self.slot_for(model)
        busy = len(slot.live_streams())
        if busy:
            raise Conflict(f"model '{slot.id}' is serving {busy} request(s); the benchmark needs it idle")
        self.bench_state = {"state": "running", "model": slot.id, "current": None, "started": time.time()}
        return slot

    async def finish_bench(self, slot: Slot) -> dict[str, Any]:
        """Run the benchmark begun by begin_bench; its record is the new bench_state and joins the history."""
        from engine import bench
        state = self.bench_state
        t0 = time.monotonic()
        try:
            rows = await self._run(lambda: bench.run(slot, lambda name: state.update(current=name)))
        except Exception as e:
            self.bench_state = {**state, "state": "failed", "error": str(e)}
            raise
        m = slot.model
        record = {"state": "done", "model": slot.id, "file": str(m.path), "quant": m.quant(), "params": m.n_params,
                  "kv_dtype": slot.settings.kv_dtype, "threads": slot.settings.threads, "streams": slot.settings.streams,
                  "hardware": hardware_line(), "rows": rows, "started": state["started"],
                  "seconds": round(time.monotonic() - t0, 2)}
        self.bench_state = record
        self.bench_history = (self.bench_history + [record])[-20:]
        return record

    # ---- observation --------------------------------------------------------------------------

    def models(self) -> list[dict[str, Any]]:
        """Every served model, OpenAI /v1/models style plus llamadesk's details."""
        out = [{"id": s.id, "object": "model", "created": s.created, "owned_by": "llamadesk",
                "default": s.id == self.default_id, "kind": "embedding" if s.embedding_only else "llm",
                "state": s.state, "ctx": s.ctx, "streams": s.settings.streams, **s.describe()}
               for s in self.slots.values()]
        for kind in ("asr", "tts"):
            svc = getattr(self, kind)
            if svc is not None:
                out.append({"id": svc.id, "object": "model", "created": int(self.started_wall), "owned_by": "llamadesk",
                            "kind": kind, "state": "ready", "type": svc.model.kind, "path": str(svc.model.path),
                            **({"voices": svc.model.voices} if kind == "tts" else
                               {"can_translate": svc.model.can_translate})})
        return out

    def stats(self) -> dict[str, Any]:
        """Scheduler counters summed over slots, plus each slot's own (SPEC §4 names)."""
        entries = [s.stats_entry() for s in self.slots.values()]
        summed = {k: sum(e[k] for e in entries) for k in (
            "gen_tokens", "prefill_tokens", "decode_calls", "prefix_cache_hits", "prefix_cache_reused_tokens",
            "active_streams", "queued_streams", "rejected_requests", "requests", "gen_tok_s", "prefill_tok_s")}
        summed["max_streams_per_decode"] = max((e["max_streams_per_decode"] for e in entries), default=0)
        ttfts = [v for s in self.slots.values() for v in s.stats.ttft_ms]
        summed["ttft_ms"] = _percentiles(ttfts)
        speech = {k: ({"model": svc.id, **svc.pool.stats()} if svc is not None else
                      {"state": "error" if k in self.speech_errors else "off", "error": self.speech_errors.get(k)})
                  for k, svc in (("asr", self.asr), ("tts", self.tts))}
        if self.asr is not None:  # transcriptions that ran while the LLM was decoding (recent window)
            ticks = sorted(t for slot in self.slots.values() for t, _, _ in list(slot.stats._recent))
            speech["asr"]["jobs_overlapping_generation"] = sum(
                1 for a, b in list(self.asr.pool.busy_intervals) if bisect.bisect_right(ticks, b) > bisect.bisect_left(ticks, a))
        w = self._worker
        summed["scheduler"] = {"alive": bool(w and w.is_alive()), "restarts": w.restarts if w else 0,
                               "tick_errors": w.tick_errors if w else 0}
        return {"setup": self.setup_mode, "status": self.status, "version": VERSION,
                "bench": {"state": self.bench_state["state"], "current": self.bench_state.get("current")},
                "uptime_s": round(time.monotonic() - self.started, 1), "hardware": hardware_line(),
                "memory": {"rss_bytes": rss_bytes()}, **summed, "models": entries, **speech}

    def streams(self) -> dict[str, Any]:
        """Live streams and the recently finished ones."""
        out = []
        for slot in self.slots.values():
            out += [slot.stream_info(s) for s in list(slot.done)]
            out += [slot.stream_info(s) for s in slot.live_streams()]
        return {"streams": out}


def _percentiles(vals: list[float]) -> dict[str, float]:
    if not vals:
        return {"avg": 0.0, "p50": 0.0, "p95": 0.0}
    vals = sorted(vals)
    pick = lambda q: vals[min(len(vals) - 1, int(q * (len(vals) - 1) + 0.5))]  # noqa: E731
    return {"avg": round(sum(vals) / len(vals), 2), "p50": round(pick(0.5), 2), "p95": round(pick(0.95), 2)}


def rss_bytes() -> int:
    """Resident memory of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_hardware: str | None = None


def hardware_line() -> str:
    """One line naming the CPU, core count, memory and llama.cpp's CPU features."""
    global _hardware
    if _hardware is None:
        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
        except OSError:
            pass
        mem = ""
        try:
            mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
        except (ValueError, OSError, AttributeError):
            pass
        feats = [p.split("=")[0].strip() for p in llama.system_info().split("|") if p.strip().endswith("= 1")]
        _hardware = f"{cpu}, {os.cpu_count()} cores{mem}; llama.cpp: {' '.join(feats)}"
    return _hardware
