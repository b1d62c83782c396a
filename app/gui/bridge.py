"""The one QObject between the panels and the engine facade.

Panels are passive views: every call into the engine goes through the bridge's methods (reads return
plain data, actions run as asyncio tasks on the shared qasync loop, so nothing blocking runs on it), and
what changes comes back through its typed signals, stats once per tick.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import time
from typing import Any

from PySide6.QtCore import QObject, QSettings, QTimer, Signal

from app.gui import theme
from app.host import Host
from engine.config import Config, ModelEntry
from engine.errors import EngineError
from engine.requests import ChatRequest, SamplingParams

log = logging.getLogger("llamadesk.gui")


class LogBridge(logging.Handler):
    """A logging handler that re-emits records as a Qt signal (queued to the GUI thread)."""

    def __init__(self, signal: Signal):
        super().__init__(logging.DEBUG)
        self._signal = signal
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._signal.emit(record.levelname, self.format(record))
        except RuntimeError:  # the bridge is gone (shutting down)
            pass


class RemoteRefused(Exception):
    """An upstream that could not list its models; the message says why in plain words."""


async def _upstream_models(url: str, api_key: str | None) -> list[str]:
    """The model ids GET {base}/models answers (raises RemoteRefused)."""
    import aiohttp

    from engine.catalog.downloads import reason
    from engine.remote import base_url
    base = base_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as session, \
                session.get(base + "/models", headers=headers, allow_redirects=False) as resp:
            status, body = resp.status, await resp.read()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        raise RemoteRefused(reason(e, base)) from None
    if status in (401, 403):
        raise RemoteRefused(f"{base} refused the API key ({status}): check the key" if api_key else
                            f"{base} needs an API key ({status})")
    if status != 200:
        raise RemoteRefused(f"{base}/models answered {status}: is this an OpenAI-compatible base URL (…/v1)?")
    try:
        return [m["id"] for m in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError):
        raise RemoteRefused(f"{base}/models did not answer with a model list: is this an OpenAI-compatible "
                            "server?") from None


def _loading_fraction(weights_read: float) -> float:
    """What a load's progress bar shows: the weights come first, then the context and KV cache are set up
    with all weights read, so 1.0 waits for the load to end."""
    return min(weights_read, 0.99)


class Bridge(QObject):
    """Typed signals out, facade calls in."""

    stats_updated = Signal(dict)  # /v1/stats, once a second
    streams_updated = Signal(list)  # /v1/streams' list, once a second
    state_changed = Signal(str)  # serving | setup | loading | busy | benchmarking | paused | stopped
    models_changed = Signal()
    log_record = Signal(str, str)  # level, formatted line
    chat_delta = Signal(str, str)  # chat id, text
    chat_done = Signal(str, dict)  # chat id, {finish_reason, usage, tok_s, seconds}
    chat_error = Signal(str, str)  # chat id, message
    notice = Signal(str)  # a one-line message for the status bar
    config_saved = Signal(str)  # path
    theme_saved = Signal(str)  # the theme remembered for the next start
    speech_ready = Signal(str, object)  # request id, {"samples", "rate", "wav"}
    transcript_started = Signal(str, object)  # request id, {"samples", "spans", "duration"}: drawn at once
    transcript_segment = Signal(str, object)  # request id, {"id", "start", "end", "text"}: each as it is decoded
    transcript_ready = Signal(str, object)  # request id, {"text", "segments", "duration", "spans", "samples"}
    speech_error = Signal(str, str)  # request id, message
    bench_progress = Signal(dict)  # {"step", "steps", "current", "rows"}: before each test, and after the last
    bench_done = Signal(dict)  # the benchmark record (state done, cancelled or failed)
    load_progress = Signal(str, float)  # model name, fraction of its weights loaded
    hub_results = Signal(str, object)  # query, the GGUF repos Hugging Face found for it
    hub_files = Signal(str, object)  # repo, its GGUF models (quant, size, fit) and vision towers
    hub_failed = Signal(str)  # why a Hugging Face search, listing or pull did not go through
    remote_listed = Signal(str, list)  # base URL asked, the upstream's model ids
    remote_failed = Signal(str, str)  # base URL, why listing or adding its models did not go through
    remotes_added = Signal(list)  # the names of the remote entries added to the roster
    reloaded = Signal()
    quitting = Signal()

    def __init__(self, host: Host, ui_state: QSettings | None = None):
        super().__init__()
        self.host = host
        self.ui_state = ui_state  # the window's remembered state (notices seen, the theme)
        self._chats: dict[str, asyncio.Task] = {}
        self._gens: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self._state = ""
        self._timer = QTimer(self)
        self._timer.setInterval(1000)
        self._timer.timeout.connect(self.on_tick)
        # loads the window did not start (a request naming an unloaded model) show their progress too
        self._load_timer = QTimer(self)
        self._load_timer.setInterval(150)
        self._load_timer.timeout.connect(self.on_load_tick)
        self._loads_seen: set[str] = set()
        self.log_handler = LogBridge(self.log_record)

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Begin the 1 Hz updates; follow reloads of the host (Settings, or POST /restart)."""
        self.host.on_reload = self.on_host_reloaded
        self._timer.start()
        self._load_timer.start()
        self.on_tick()

    def on_host_reloaded(self) -> None:
        self.reloaded.emit()
        self.models_changed.emit()
        self.on_tick()

    def spawn(self, coro) -> asyncio.Task:
        """Run a coroutine on the shared loop, logging (not raising) its failure."""
        task = asyncio.get_event_loop().create_task(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                e = t.exception()
                msg = e.message if isinstance(e, EngineError) else str(e)
                log.error("%s", msg, exc_info=None if isinstance(e, EngineError) else e)
                self.notice.emit(msg)
        task.add_done_callback(done)
        return task

    def state(self, stats: dict | None = None) -> str:
        """What the tray and status bar show (from this tick's stats when given)."""
        svc = self.host.service
        if svc is None:
            return "stopped"
        if svc.bench.running:
            return "benchmarking"
        if svc.status != "ok":
            return svc.status
        if not self.host.serving:
            return "paused"
        return "busy" if (stats or svc.stats())["active_streams"] else "serving"

    def show_state(self, state: str) -> None:
        """Say `state` now (e.g. loading, before the engine says so); the next tick says what is true."""
        if state != self._state:
            self._state = state
            self.state_changed.emit(state)

    def on_tick(self) -> None:
        """One stats snapshot per tick: the state, the panels' charts and tables all read it."""
        svc = self.host.service
        stats = svc.stats() if svc is not None else None
        self.show_state(self.state(stats))
        if stats is None:
            return
        self.stats_updated.emit(stats)
        self.streams_updated.emit(svc.streams()["streams"])

    def on_load_tick(self) -> None:
        """Each load in progress, however it started (a request naming an unloaded model too), as
        load_progress; 1.0 once it ended."""
        svc = self.host.service
        loading = set(svc.roster.loading) if svc is not None else set()
        progress = svc.roster.progress if svc is not None else {}
        for name in loading:
            self.load_progress.emit(name, _loading_fraction(progress.get(name, 0.0)))
        for name in self._loads_seen - loading:
            self.load_progress.emit(name, 1.0)
        if loading != self._loads_seen:
            self._loads_seen = loading
            self.show_state(self.state())  # a load began or ended: say so now, not at the next second

    # ---- reads for the panels (plain data; empty while the host is stopped) ---------------------

    def models(self) -> list[dict[str, Any]]:
        """Every served model as /v1/models lists it."""
        svc = self.host.service
        return svc.models() if svc is not None else []

    @property
    def running(self) -> bool:
        """Whether the host has an engine (not between a stop and a start)."""
        return self.host.service is not None

    @property
    def setup_mode(self) -> bool:
        svc = self.host.service
        return svc is None or svc.setup_mode

    def catalog(self) -> dict[str, Any] | None:
        """The catalog as GET /catalog shows it (None while stopped)."""
        svc = self.host.service
        return svc.catalog.listing() if svc is not None else None

    def import_gguf(self, path: str) -> asyncio.Task:
        """Copy a GGUF into models_dir (checked first); it is then listed, and served by name on demand."""
        async def go() -> None:
            try:
                out = await self.host.service.catalog.import_gguf(path)
                self.notice.emit(f"imported {out['name']}: served as '{out['name']}' on demand")
            except EngineError as e:
                self.notice.emit(e.message)
            self.models_changed.emit()
            self.reloaded.emit()
        return self.spawn(go())

    def models_dir(self) -> str | None:
        svc = self.host.service
        return str(svc.config.models_dir()) if svc is not None else None

    def speech_models(self) -> dict[str, Any]:
        """{"tts": its voices or None, "asr": its id or None}: what the speech controls can offer."""
        svc = self.host.service
        tts = svc.speech.tts if svc is not None else None
        asr = svc.speech.asr if svc is not None else None
        return {"tts": tts.model.voices if tts is not None else None, "asr": asr.id if asr is not None else None}

    # ---- chat -----------------------------------------------------------------------------

    def chat(self, model: str | None, messages: list[dict], sampling: SamplingParams) -> str:
        """Start a streamed chat reply; returns its id for chat_delta/chat_done/chat_error."""
        cid = f"chat-{next(self._ids)}"
        self._chats[cid] = self.spawn(self._chat(cid, model, messages, sampling))
        return cid

    async def _chat(self, cid: str, model: str | None, messages: list[dict], sampling: SamplingParams) -> None:
        t0 = time.monotonic()
        first = None
        gen = None
        try:
            gen = (await self.host.service.chat(ChatRequest(model, messages, sampling)))[0]
            self._gens[cid] = gen
            async for text in gen.chunks():
                if first is None:
                    first = time.monotonic()
                self.chat_delta.emit(cid, text)
            end = time.monotonic()
            n = gen.usage.get("completion_tokens", 0)
            tok_s = (n - 1) / (end - first) if first and n > 1 and end > first else 0.0
            self.chat_done.emit(cid, {"finish_reason": gen.finish_reason, "usage": gen.usage,
                                      "tok_s": round(tok_s, 1), "seconds": round(end - t0, 2), "id": gen.id})
        except EngineError as e:
            self.chat_error.emit(cid, e.message)
        except asyncio.CancelledError:
            self.chat_done.emit(cid, {"finish_reason": "cancelled", "usage": gen.usage if gen else {},
                                      "tok_s": 0.0, "seconds": round(time.monotonic() - t0, 2),
                                      "id": gen.id if gen else None})
        finally:
            if gen is not None:
                gen.cancel()  # no-op when it finished; aborts the engine stream otherwise
            self._chats.pop(cid, None)
            self._gens.pop(cid, None)

    def stop_chat(self, cid: str) -> None:
        """Abort a running reply in the engine; chat_done follows once the engine evicted it."""
        gen = self._gens.get(cid)
        if gen is not None:
            gen.cancel()  # the engine ends the stream at its next tick and reports "cancelled"
        elif cid in self._chats:
            self._chats[cid].cancel()  # not submitted yet

    def engine_stream_id(self, cid: str) -> str | None:
        """The engine's id of a running chat (as /v1/streams shows it)."""
        gen = self._gens.get(cid)
        return gen.id if gen else None

    # ---- models -----------------------------------------------------------------------------

    def load_model(self, path: str) -> asyncio.Task:
        """Serve another GGUF (loaded off the loop)."""
        from pathlib import Path
        name = Path(path).stem

        async def go() -> None:
            self.show_state("loading")
            try:
                await self.host.service.roster.add(ModelEntry(name=name, path=path), progress=lambda f:
                                                   self.load_progress.emit(name, _loading_fraction(f)))
            finally:
                self.load_progress.emit(name, 1.0)
                self.on_tick()
            self.models_changed.emit()
            self.notice.emit(f"loaded {name}")
        return self.spawn(go())

    def load_available(self, name: str) -> asyncio.Task:
        """Load a model the server lists as available (a roster entry, a download, a GGUF in models_dir)."""
        return self._loading(name, f"loaded {name}", self.host.service.roster.acquire(name))

    def reload_model(self, name: str, settings: dict) -> asyncio.Task:
        """Serve a model again with other per-model settings (ctx, streams, chunk, kv_dtype); saved to the config."""
        return self._loading(name, f"reloaded {name}", self.host.service.roster.reload(
            name, progress=lambda f: self.load_progress.emit(name, _loading_fraction(f)), **settings))

    def _loading(self, name: str, done: str, work) -> asyncio.Task:
        """Run a load (the awaitable work) with the status bar saying so; its outcome as a notice."""
        async def go() -> None:
            self.show_state("loading")
            try:
                await work
                self.notice.emit(done)
            except EngineError as e:
                self.notice.emit(f"{name}: {e.message}")
            finally:
                self.load_progress.emit(name, 1.0)
                self.on_tick()
                self.models_changed.emit()
        return self.spawn(go())

    def unload_model(self, name: str) -> asyncio.Task:
        """Stop serving a model and free it."""
        async def go() -> None:
            await self.host.service.roster.remove(name)
            self.models_changed.emit()
            self.notice.emit(f"unloaded {name}")
        return self.spawn(go())

    def set_default(self, name: str) -> None:
        """Route requests without a model to this one."""
        try:
            self.host.service.roster.activate(name)
        except EngineError as e:
            self.notice.emit(e.message)
            return
        self.models_changed.emit()

    # ---- remote servers -------------------------------------------------------------------------

    def remote_models(self) -> list[dict[str, Any]]:
        """The roster's remote entries as /v1/models lists them (health from the server's checks); while the
        server is paused, as the roster has them, health unknown (None)."""
        from server import remote
        server = self.host.server
        if server is not None and server.runner is not None:
            return remote.model_cards(server.runner.app)
        return [{"id": m.name, "remote_model": m.remote_model or m.name, "healthy": None,
                 "replicas": [{"url": u, "healthy": None, "last_error": None} for u in [m.url, *(m.urls or [])] if u]}
                for m in self.host.config.models if m.remote]

    def list_remote(self, url: str, api_key: str | None) -> asyncio.Task:
        """Ask an OpenAI-compatible server at url (its base URL; a bare host:port means its /v1) for its
        models; remote_listed(url, ids) follows, or remote_failed(url, why) in plain words."""
        async def go() -> None:
            try:
                ids = await _upstream_models(url, api_key)
            except RemoteRefused as e:
                self.remote_failed.emit(url, str(e))
                return
            self.remote_listed.emit(url, ids)
        return self.spawn(go())

    def add_remotes(self, url: str, api_key: str | None, picked: dict[str, str]) -> asyncio.Task:
        """Add a [[models]] backend = "remote" entry per {name: upstream id} (saved in the roster, as every
        roster change) and relayed at once, requests in flight going on; remotes_added(names) follows, or
        remote_failed(url, why) with nothing added."""
        from engine.remote import base_url
        roster = self.host.service.roster

        async def go() -> None:
            entries = [ModelEntry(name=name, backend="remote", url=base_url(url), remote_model=upstream,
                                  api_key=api_key or None) for name, upstream in picked.items()]
            taken = [e.name for e in entries if any(m.name == e.name for m in self.host.config.models)
                     or e.name in roster.loaded or e.name in roster.available()]
            if taken:
                self.remote_failed.emit(url, f"a model named {', '.join(taken)} already exists here: pick another "
                                             "name")
                return
            try:
                for entry in entries:
                    await roster.add_entry(entry)
            except EngineError as e:
                self.remote_failed.emit(url, e.message)
                return
            server = self.host.server
            if server is not None and server.runner is not None:  # serving: the relay takes them at once
                from server import remote
                await remote.refresh(server.runner.app)
            log.info("added remote model(s) %s from %s", ", ".join(picked), url)
            self.models_changed.emit()
            self.remotes_added.emit(list(picked))
        return self.spawn(go())

    # ---- speech -------------------------------------------------------------------------------

    def synthesize(self, text: str, voice: str | None = None, speed: float = 1.0) -> str:
        """Text to speech; speech_ready (or speech_error) follows with the same id."""
        rid = f"tts-{next(self._ids)}"

        async def go() -> None:
            from app.gui.audio_io import wav_bytes
            from engine.speech.tts import check_tts_input
            try:
                check_tts_input(text, speed)
                samples, rate = await self.host.service.speech.get("tts").speak(text, voice, speed)
                self.speech_ready.emit(rid, {"samples": samples, "rate": rate,
                                             "wav": await asyncio.to_thread(wav_bytes, samples, rate)})
            except EngineError as e:
                self.speech_error.emit(rid, e.message)
        self.spawn(go())
        return rid

    def transcribe(self, data: bytes, language: str | None = None) -> str:
        """Speech to text with segments and the VAD's spans: transcript_started (the audio and its spans), a
        transcript_segment per span as it is decoded, then transcript_ready (or speech_error)."""
        rid = f"asr-{next(self._ids)}"

        async def go() -> None:
            from engine.speech import audio
            try:
                speech = self.host.service.speech
                asr = speech.get("asr")
                samples = await asyncio.to_thread(audio.decode, data, 16000)
                vad = speech.vad
                spans = await vad.spans(samples) if vad is not None else None
                duration = round(len(samples) / 16000, 3)
                self.transcript_started.emit(rid, {"samples": samples, "spans": spans or [], "duration": duration})
                segments = []
                async for segment in asr.transcribe_stream(samples, language, "transcribe", spans):
                    segments.append(segment)
                    self.transcript_segment.emit(rid, segment)
                self.transcript_ready.emit(rid, {"text": " ".join(s["text"] for s in segments), "segments": segments,
                                                 "duration": duration, "spans": spans or [], "samples": samples})
            except EngineError as e:
                self.speech_error.emit(rid, e.message)
        self.spawn(go())
        return rid

    # ---- benchmark ----------------------------------------------------------------------------

    def run_bench(self, model: str | None = None) -> asyncio.Task:
        """Run the benchmark; bench_progress as each test starts, then bench_done with its record."""
        loop = asyncio.get_event_loop()

        def progress(p: dict) -> None:  # on the scheduler thread
            loop.call_soon_threadsafe(self.bench_progress.emit, p)

        async def go() -> None:
            bench = self.host.service.bench
            try:
                m = bench.begin(self.host.service.roster.get(model))
                self.show_state(self.state())  # "benchmarking" at once
                record = await bench.finish(m, progress)
            except EngineError as e:
                self.bench_done.emit({"state": "failed", "error": e.message})
                raise
            except Exception as e:  # noqa: BLE001 (llama.cpp failing mid-run: the panel says so)
                self.bench_done.emit({"state": "failed", "error": str(e)})
                raise
            finally:
                self.show_state(self.state())  # serving again
            self.bench_done.emit(record)
        return self.spawn(go())

    def cancel_bench(self) -> bool:
        """Stop the running benchmark at its next decode; bench_done follows (state cancelled)."""
        svc = self.host.service
        return svc is not None and svc.bench.cancel()

    # ---- settings -----------------------------------------------------------------------------

    def save_settings(self, config: Config, values: dict[str, Any]) -> str:
        """Write values (and the roster) as the authoritative TOML; returns its path."""
        path = config.save(values)
        self.config_saved.emit(str(path))
        return str(path)

    # ---- catalog ------------------------------------------------------------------------------

    def download(self, name: str) -> None:
        """Queue a catalog entry's download (its progress shows in catalog())."""
        try:
            self.host.service.catalog.download(name)
        except EngineError as e:
            self.notice.emit(e.message)

    def cancel_download(self, name: str) -> None:
        self.host.service.catalog.cancel(name)

    def serve(self, name: str) -> asyncio.Task:
        """Serve a downloaded catalog entry now (no restart)."""
        async def go() -> None:
            await self.host.service.catalog.serve(name)
            self.models_changed.emit()
            self.notice.emit(f"serving {name}")
        return self.spawn(go())

    # ---- Hugging Face -------------------------------------------------------------------------

    def search_hub(self, query: str) -> asyncio.Task:
        """Search Hugging Face for GGUF repos; hub_results follows (hub_failed when it fails)."""
        async def go() -> None:
            self.hub_results.emit(query, (await self.host.service.catalog.search(query))["models"])
        return self._hub(go())

    def hub_repo(self, repo: str) -> asyncio.Task:
        """A repo's GGUF models and vision towers; hub_files follows."""
        async def go() -> None:
            self.hub_files.emit(repo, await self.host.service.catalog.files(repo))
        return self._hub(go())

    def pull(self, model: str, vision: bool = False) -> asyncio.Task:
        """Pull repo[:QUANT|/file.gguf] (its progress shows in catalog()'s pulls); the model is served by name."""
        async def go() -> None:
            job = await self.host.service.catalog.pull(model, vision)
            self.notice.emit(f"pulling {model}")
            await job.wait()
            if job.error is not None:
                raise job.error
            self.models_changed.emit()
            self.notice.emit(f"pulled {model}: a request for the model '{job.model}' serves it")
        return self._hub(go())

    def _hub(self, coro) -> asyncio.Task:
        async def go() -> None:
            try:
                await coro
            except EngineError as e:
                self.hub_failed.emit(e.message)
                raise
        return self.spawn(go())

    def apply(self, config: Config) -> asyncio.Task:
        """Reload the server in process with a new configuration (no process restart)."""
        async def go() -> None:
            self.show_state("loading")
            try:
                await self.host.reload(config)  # the host's on_reload refreshes the panels
            finally:
                self.on_tick()
            self.notice.emit(f"settings applied; serving on {self.host.url}")
        return self.spawn(go())

    def save_theme(self, name: str) -> None:
        """Remember the theme chosen in the app (View menu or Settings) for the next start; theme_saved follows."""
        if self.ui_state is not None:
            theme.remember(self.ui_state, name)
        self.theme_saved.emit(name)

    # ---- serving ------------------------------------------------------------------------------

    def toggle_serving(self) -> asyncio.Task:
        """Pause or resume the HTTP server (models stay loaded)."""
        async def go() -> None:
            if self.host.serving:
                self._pin_port()
                await self.host.pause()
            else:
                try:
                    await self.host.resume()
                except EngineError as e:  # the port is still taken (PortInUse), or cannot be bound
                    self.notice.emit(f"not serving: {e.message}")
            self.on_tick()
        return self.spawn(go())

    def _pin_port(self) -> None:
        """A port of 0 ("any free port") becomes the one bound now, so clients find the server again after
        it listens anew."""
        if self.host.config.port == 0 and self.host.server is not None:
            self.host.config.values["port"] = self.host.server.port

    def serve_on_network(self, on: bool) -> asyncio.Task:
        """Listen on every interface (on) or on loopback only; the models stay loaded. Raises InsecureBind,
        before anything changes, when that needs an API key and none is set (server/access.py)."""
        from server.access import check_exposure
        config = self.host.config
        bind = "0.0.0.0" if on else "127.0.0.1"
        check_exposure(dataclasses.replace(config, values={**config.values, "host": bind}))

        async def go() -> None:
            listening = self.host.serving
            self._pin_port()
            await self.host.pause()
            config.values["host"] = bind
            if listening:
                await self.host.resume()
            self.on_tick()
            self.notice.emit(f"serving on {'the local network' if on else 'this machine only'}: {self.host.url}"
                             if listening else f"will serve on {bind} when resumed")
        return self.spawn(go())

    def start_download(self, name: str) -> str | None:
        """Queue a catalog entry's download (again, after a failure: it resumes); None, or why it cannot start,
        for the Catalog panel to show beside the entry."""
        try:
            self.host.service.catalog.download(name)
        except EngineError as e:
            return e.message
        return None

    def rostered(self, name: str) -> bool:
        """Whether name is an entry of the roster ([[models]], local or remote): what Remove takes away. A GGUF
        found in models_dir or a downloaded catalog entry is listed without being one."""
        svc = self.host.service
        return svc is not None and any(e.name == name for e in svc.config.models)

    def forget(self, name: str) -> asyncio.Task:
        """Take name out of the roster and save it (unloaded first when loaded; its file stays on disk); a
        remote entry stops being relayed at once. models_changed follows, or the engine's refusal (the
        benchmark is using it) as a notice."""
        async def go() -> None:
            svc = self.host.service
            remote = any(e.remote and e.name == name for e in svc.config.models)
            try:
                await svc.roster.forget(name)
            except EngineError as e:
                self.notice.emit(f"{name} not removed: {e.message}")
                return
            server = self.host.server
            if remote and server is not None and server.runner is not None:  # serving: the relay drops it now
                from server import remote as relay
                await relay.refresh(server.runner.app)
            self.on_tick()
            self.models_changed.emit()
            self.notice.emit(f"removed {name} from the roster")
        return self.spawn(go())

    async def shutdown(self) -> None:
        """Drain streams (5 s at most), stop the server, free the models."""
        self._timer.stop()
        self._load_timer.stop()
        self.quitting.emit()
        for task in list(self._chats.values()):
            task.cancel()
        await self.host.stop(drain_s=5.0)
