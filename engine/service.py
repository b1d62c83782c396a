"""The facade the HTTP routes and the GUI bridge both call (in process, awaited on the loop). It composes
the rooms and owns nothing else:

- `roster` (engine/models): the loaded models, loading, unloading, routing, the config file's roster;
- `generator` (engine/generate.py): chat, completions and embeddings onto the scheduler thread;
- `worker` (engine/core): the scheduler thread, which owns every llama.cpp context call;
- `catalog` (engine/catalog): the curated catalog, downloads, serving an entry, importing a GGUF;
- `speech` (engine/speech): the VAD, ASR and TTS services;
- `bench` (engine/bench.py): the benchmark, which has the engine to itself while it runs.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import time
from pathlib import Path
from typing import Any, Callable

from engine.catalog.service import CatalogService
from engine.config import Config
from engine.core.generation import Generation
from engine.core.worker import Outbox, Worker
from engine.errors import EngineError, EngineStopped
from engine.generate import Generator
from engine.models.manager import ModelManager
from engine.models.tenancy import memory_budget
from engine.requests import KEEP, ChatRequest, CompletionRequest
from engine.bench import Bench
from engine.speech.manager import SpeechManager
from engine.system import VERSION, hardware_line, percentiles, rss_bytes

log = logging.getLogger("llamadesk.engine")


class Service:
    """Models, generation, embeddings, speech, catalog, benchmark and counters behind one in-process API."""

    def __init__(self, config: Config):
        self.config = config
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.worker: Worker | None = None
        self.bench = Bench(self.run)
        self.roster = ModelManager(config, self.run, self.bench.refuse)
        self.speech = SpeechManager(config, self.bench.refuse)
        self.catalog = CatalogService(config, self.roster, self.speech, self.bench.refuse)
        self.generator = Generator(self.roster, self.run, lambda: self.worker, self.bench.refuse)
        self.roster.discover = self.catalog.available

    # ---- lifecycle ------------------------------------------------------------------------------

    def load_models(self) -> None:
        """Load every roster entry (blocking; call before start(), or from a worker thread)."""
        self.roster.load_all()

    def load_speech(self) -> None:
        """Start the VAD, ASR and TTS services (blocking); a model that fails degrades, never kills."""
        self.speech.load()

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the scheduler thread, delivering to loop (the running loop by default)."""
        loop = loop or asyncio.get_running_loop()
        self.worker = Worker(loop, lambda: [m.runner for m in self.roster.loaded.values()])
        self.worker.start()
        self.catalog.start()
        self.roster.start()

    async def stop(self) -> None:
        """Abort every request, stop the scheduler thread and free the models."""
        if self.worker is None:
            return
        await self.catalog.close()
        await self.roster.stop()
        models = list(self.roster.loaded.values())

        def abort_all() -> None:
            out = Outbox()
            for m in models:
                for r in m.live_requests():
                    m.runner.cancel(r)
                m.runner.step(out)
                m.runner.save_all()  # what the sequences hold goes with the prompt cache to disk
        worker = self.worker
        try:
            await asyncio.wait_for(self.run(abort_all), 10)
        except (asyncio.TimeoutError, EngineError):
            pass
        worker.stop()
        await asyncio.get_running_loop().run_in_executor(None, worker.join, 10)
        self.speech.close()
        await self.roster.free_all()
        self.worker = None
        self.generator.close()

    def run(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Run fn on the scheduler thread (between ticks); await its result."""
        if self.worker is None:
            raise EngineStopped("the engine is not running")
        return asyncio.wrap_future(self.worker.call(fn))

    @property
    def setup_mode(self) -> bool:
        """Nothing to serve: no model loaded and none configured (a default unloaded while idle still serves)."""
        return not self.roster.loaded and self.roster.default_id is None

    @property
    def status(self) -> str:
        """ok, loading (a model is being loaded), setup (nothing to serve yet) or degraded (the scheduler
        thread is not ticking: it is recovering from a failed loop, or it died)."""
        if self.worker is not None and not self.worker.healthy:
            return "degraded"
        if self.roster.loading:
            return "loading"
        return "setup" if self.setup_mode else "ok"

    # ---- the hot path -----------------------------------------------------------------------------

    async def chat(self, req: ChatRequest, n: int = 1) -> list[Generation]:
        """A chat completion with n choices (the prompt is prefilled once)."""
        return await self.generator.chat(req, n)

    async def complete(self, req: CompletionRequest, n: int = 1) -> list[Generation]:
        """A raw completion with n choices."""
        return await self.generator.complete(req, n)

    async def embed(self, model: str | None, inputs: list[str | list[int]], keep_alive: Any = KEEP,
                    ) -> tuple[str, list, int]:
        """(model id, unit-norm vectors, prompt tokens) for every input."""
        return await self.generator.embed(model, inputs, keep_alive)

    async def rerank(self, model: str | None, query: str, documents: list[str]) -> tuple[str, list[float], int]:
        """(model id, each document's relevance score to query, prompt tokens) from a reranker."""
        return await self.generator.rerank(model, query, documents)

    async def run_bench(self, model: str | None = None) -> dict[str, Any]:
        """llama-bench's rows (pp512, tg128, tg128@N) on a served model."""
        return await self.bench.finish(self.bench.begin(self.roster.get(model)))

    # ---- observation ------------------------------------------------------------------------------

    def models(self) -> list[dict[str, Any]]:
        """Every model this server can serve, OpenAI /v1/models style plus llamadesk's details: the loaded ones
        ("state": "loaded"), those loading ("loading", with progress), and those a request would load
        ("unloaded": roster entries, downloaded catalog entries, GGUFs in models_dir), then speech models."""
        r = self.roster
        out = []
        for m in r.loaded.values():
            t = r.tenancy.get(m.id)
            out.append({"id": m.id, "object": "model", "created": m.created, "owned_by": "llamadesk",
                        "default": m.id == r.default_id, "kind": "embedding" if m.embedding_only else "llm",
                        "state": "loaded", "ctx": m.ctx, "streams": m.settings.streams,
                        "memory_bytes": t.footprint.total if t else None,
                        "ttl_s": t.ttl if t else None, "loaded_on_demand": t.on_demand if t else False,
                        **m.describe()})
        for name, entry in r.available().items():
            if name in r.loaded:
                continue
            info = {"id": name, "object": "model", "created": int(self.started_wall), "owned_by": "llamadesk",
                    "default": name == r.default_id, "state": "loading" if name in r.loading else "unloaded",
                    "path": entry.path}
            if entry.image_mmproj:  # it loads with its projector: its chat takes images before the first load
                info["vision"] = True
            if name in r.progress:
                info["progress"] = round(r.progress[name], 3)
            try:
                info["size"] = Path(entry.path).expanduser().stat().st_size
                need = r.footprint(Path(entry.path).expanduser(), r.settings_for(entry))
                info["memory_bytes"], info["kind"] = need.total, "embedding" if need.embedding else "llm"
            except EngineError as e:
                info["error"] = e.message
            except OSError as e:
                info["error"] = f"cannot read {entry.path}: {e.strerror}"
            out.append(info)
        return out + self.speech.models(int(self.started_wall))

    def stats(self) -> dict[str, Any]:
        """Scheduler counters summed over the models, plus each model's own (SPEC §4 names)."""
        loaded = list(self.roster.loaded.values())
        entries = [m.stats_entry() for m in loaded]
        summed = {k: sum(e[k] for e in entries) for k in (
            "gen_tokens", "prefill_tokens", "decode_calls", "prefix_cache_hits", "prefix_cache_reused_tokens",
            "active_streams", "queued_streams", "rejected_requests", "requests", "gen_tok_s", "prefill_tok_s",
            "forked_choices", "kv_reused_tokens", "prefix_attaches", "attached_tokens", "ram_reused_tokens",
            "disk_reused_tokens")}
        summed["max_streams_per_decode"] = max((e["max_streams_per_decode"] for e in entries), default=0)
        summed["ttft_ms"] = percentiles(v for m in loaded for v in list(m.stats.ttft_ms))
        speech = self.speech.stats()
        asr = self.speech.asr
        if asr is not None:  # transcriptions that ran while the LLM was decoding (recent window)
            ticks = sorted(t for m in loaded for t, _, _ in list(m.stats.recent))
            speech["asr"]["jobs_overlapping_generation"] = sum(
                1 for a, b in list(asr.pool.busy_intervals) if bisect.bisect_right(ticks, b) > bisect.bisect_left(ticks, a))
        w = self.worker
        summed["scheduler"] = {"alive": bool(w and w.is_alive()), "restarts": w.restarts if w else 0,
                               "tick_errors": w.tick_errors if w else 0}
        summed["lifecycle"] = {**self.roster.counters, "loaded": len(self.roster.loaded),
                               "recent_loads": [r.as_dict() for r in self.roster.recent_loads],
                               "loading": sorted(self.roster.loading), "memory_budget_bytes":
                               memory_budget(self.config.max_memory), "memory_used_bytes":
                               sum(t.footprint.total for t in self.roster.tenancy.values())}
        return {"setup": self.setup_mode, "status": self.status, "version": VERSION,
                "bench": {"state": self.bench.state["state"], "current": self.bench.state.get("current")},
                "uptime_s": round(time.monotonic() - self.started, 1), "hardware": hardware_line(),
                "memory": {"rss_bytes": rss_bytes()}, **summed, "models": entries, **speech}

    def streams(self) -> dict[str, Any]:
        """Live requests and the recently finished ones."""
        return {"streams": [info for m in self.roster.loaded.values() for info in m.requests_info()]}
