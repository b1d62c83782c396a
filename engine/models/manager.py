"""The model manager: the roster of loaded models, loading and unloading them without a restart,
routing a request's "model" to one, and keeping the roster in the config file."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import platformdirs

from engine import llama
from engine.config import APP_NAME, OPTIONS, Config, ConfigError, ModelEntry
from engine.core.worker import Outbox, deliver
from engine.errors import Conflict, EngineError, InvalidRequest, ModelNotFound, NoModelLoaded
from engine.models.loaded import LoadedModel, ModelSettings, read_chat_template

log = logging.getLogger("llamadesk.engine")


def cache_ram_bytes(mib: int) -> int:
    """The host-RAM prompt cache budget: mib MiB, or for -1 an eighth of this machine's RAM (8 GiB at most)."""
    if mib >= 0:
        return mib << 20
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 8 << 30
    return min(ram // 8, 8 << 30)


def _either(own, default):
    """A roster entry's own setting, else the global one (0 and false are settings too)."""
    return default if own is None else own


def check_shape(entry: ModelEntry) -> None:
    """400s for per-model settings outside the schema's bounds and choices (ctx, streams, chunk, kv_dtype)."""
    for key in ("ctx", "streams", "chunk", "kv_dtype"):
        value = getattr(entry, key)
        if value is not None:
            try:
                OPTIONS[key].parse(value, "request")
            except ConfigError as e:
                raise InvalidRequest(str(e), key) from None


class ModelManager:
    """Loaded models by name, the default one, and the loads in progress."""

    def __init__(self, config: Config, run: Callable[[Callable[[], Any]], asyncio.Future],
                 refuse_while_benching: Callable[[str], None]):
        self.config = config
        self.loaded: dict[str, LoadedModel] = {}
        self.default_id: str | None = None
        self.loading: set[str] = set()
        self._run = run  # runs a function on the scheduler thread
        self._not_benching = refuse_while_benching

    def settings_for(self, entry: ModelEntry) -> ModelSettings:
        """The global settings with the roster entry's overrides applied."""
        c = self.config
        return ModelSettings(streams=entry.streams or c.streams, ctx=entry.ctx or c.ctx, chunk=entry.chunk or c.chunk,
                             kv_dtype=entry.kv_dtype or c.kv_dtype, threads=c.threads or llama.default_threads(),
                             default_max_tokens=c.max_tokens, gpu=c.gpu, chat_template=entry.chat_template,
                             tool_format=entry.tool_format, kv_unified=_either(entry.kv_unified, c.kv_unified),
                             cache_ram=cache_ram_bytes(_either(entry.cache_ram, c.cache_ram)),
                             cache_disk=_either(entry.cache_disk, c.cache_disk) << 20,
                             cache_dir=Path(platformdirs.user_cache_dir(APP_NAME)) / "prompt-cache")

    def load_all(self) -> None:
        """Load every roster entry (blocking; before the scheduler starts, or from a worker thread)."""
        for entry in self.config.models:
            t0 = time.monotonic()
            m = LoadedModel(entry.name, Path(entry.path).expanduser(), self.settings_for(entry))
            self.loaded[entry.name] = m
            if entry.default or self.default_id is None:
                self.default_id = entry.name
            log.info("loaded %s (%s, %s, ctx %d x %d streams) in %.1f s", entry.name, m.model.arch,
                     m.model.quant(), m.ctx, m.settings.streams, time.monotonic() - t0)

    # ---- routing -------------------------------------------------------------------------------

    def get(self, model: str | None) -> LoadedModel:
        """The model serving `model` (None or "": the default); ModelNotFound / NoModelLoaded otherwise."""
        if not self.loaded:
            raise NoModelLoaded("no model loaded: download one from the catalog (GET /catalog) or start with --model")
        if not model:
            return self.loaded[self.default_id]
        m = self.loaded.get(model)
        if m is None:
            raise ModelNotFound(f"The model '{model}' does not exist; available: {', '.join(self.loaded)}", "model")
        return m

    def activate(self, name: str) -> LoadedModel:
        """Route requests that name no model to this one (404 for a model not loaded)."""
        m = self.get(name)
        self.default_id = m.id
        return m

    # ---- loading and unloading ------------------------------------------------------------------

    async def add(self, entry: ModelEntry, make_default: bool = False,
                  progress: Callable[[float], None] | None = None) -> LoadedModel:
        """Load a model into the roster without a restart (weights and context built off the loop);
        progress(fraction) is called on the event loop as the weights load."""
        self._not_benching("load a model")
        check_shape(entry)
        if entry.chat_template:  # a file that is no template is refused before any weights load
            await asyncio.to_thread(read_chat_template, entry.chat_template)
        if entry.name in self.loading:
            raise Conflict(f"model '{entry.name}' is already loading")
        if entry.name in self.loaded:
            raise Conflict(f"a model named '{entry.name}' is already loaded")
        self.loading.add(entry.name)
        try:
            t0 = time.monotonic()
            loop = asyncio.get_running_loop()
            report = (lambda f: loop.call_soon_threadsafe(progress, f)) if progress else None
            m = await asyncio.to_thread(LoadedModel, entry.name, Path(entry.path).expanduser(),
                                        self.settings_for(entry), report)
        finally:
            self.loading.discard(entry.name)
        self.loaded[entry.name] = m  # the scheduler thread steps it from its next tick
        if make_default or self.default_id is None:
            self.default_id = entry.name
        log.info("loaded %s in process in %.1f s", entry.name, time.monotonic() - t0)
        return m

    async def remove(self, name: str) -> None:
        """Unload a model: abort its requests, drop it from the roster, free it on the scheduler thread."""
        self._not_benching("unload a model")
        m = self.loaded.pop(name, None)
        if m is None:
            raise ModelNotFound(f"The model '{name}' is not loaded", "model")
        out = Outbox()

        def abort_and_free() -> None:
            for r in m.live_requests():
                m.runner.cancel(r)
            m.runner.step(out)
            m.free()
        await self._run(abort_and_free)
        deliver(out.take())  # the aborted requests learn that they ended
        if self.default_id == name:
            self.default_id = next(iter(self.loaded), None)
        log.info("unloaded %s", name)

    async def reload(self, name: str, ctx: int | None = None, streams: int | None = None, chunk: int | None = None,
                     kv_dtype: str | None = None, progress: Callable[[float], None] | None = None) -> LoadedModel:
        """Serve a loaded model again with other per-model settings (its requests are aborted; the weights are
        mmap'd, so the second load comes from the page cache). The roster entry keeps the new settings and
        is saved as the authoritative config; if the new shape cannot load, the old one is put back."""
        if name not in self.loaded:
            raise ModelNotFound(f"The model '{name}' is not loaded", "model")
        old = next((m for m in self.config.models if m.name == name), None) or \
            ModelEntry(name=name, path=str(self.loaded[name].model.path))
        new = dataclasses.replace(old, **{k: v for k, v in (("ctx", ctx), ("streams", streams), ("chunk", chunk),
                                                             ("kv_dtype", kv_dtype)) if v is not None})
        check_shape(new)
        was_default = self.default_id == name
        await self.remove(name)
        try:
            m = await self.add(new, make_default=was_default, progress=progress)
        except EngineError:
            await self.add(old, make_default=was_default)
            raise
        if old in self.config.models:
            self.config.models[self.config.models.index(old)] = new
        else:  # a model loaded without a roster entry (the GUI's Open GGUF…) gets one
            self.config.models.append(new)
        await asyncio.to_thread(self.config.save)
        log.info("reloaded %s with ctx %s, streams %s, chunk %s, kv %s", name, new.ctx, new.streams, new.chunk,
                 new.kv_dtype)
        return m

    def make_default_entry(self, entry: ModelEntry) -> None:
        """Put entry first in the roster as the default (what serving a catalog entry saves)."""
        roster = [m for m in self.config.models if m.name != entry.name]
        for m in roster:
            m.default = False
        self.config.models = [entry, *roster]
        self.default_id = entry.name

    async def free_all(self) -> None:
        """Write each model's prompt cache to disk, then free every model (scheduler thread stopped)."""
        for m in self.loaded.values():
            if m.cache is not None:
                try:
                    n = await asyncio.to_thread(m.cache.save_to_disk)
                    if n:
                        log.info("%s: %d prompt-cache entries written to %s", m.id, n, m.cache.disk_dir)
                except OSError as e:  # a full disk must not stop the shutdown
                    log.warning("%s: prompt cache not written: %s", m.id, e)
            m.free()
