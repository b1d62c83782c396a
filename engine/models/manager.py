"""The model manager: the roster of loaded models, loading and unloading them without a restart,
routing a request's "model" to one, and keeping the roster in the config file."""
from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

import platformdirs

from engine import llama
from engine.catalog.entries import CatalogError
from engine.config import APP_NAME, OPTIONS, Config, ConfigError, ModelEntry
from engine.core.worker import Outbox, deliver
from engine.system import total_ram_bytes
from engine.errors import (Conflict, EngineError, InsufficientMemory, InvalidRequest, ModelLoadError, ModelNotFound,
                           NoModelLoaded)
from engine.models.gguf import Footprint, NotGGUF, footprint
from engine.models.loaded import LoadedModel, ModelSettings, read_chat_template
from engine.models.tenancy import Tenancy, gib, memory_budget, victims, with_projector
from engine.requests import KEEP

log = logging.getLogger("llamadesk.engine")
LOAD_WAIT_S = 30.0  # how long a load waits for busy models to become idle before a 503
REAP_EVERY_S = 0.5


def cache_ram_bytes(mib: int) -> int:
    """The host-RAM prompt cache budget: mib MiB, or for -1 an eighth of this machine's RAM (8 GiB at most)."""
    if mib >= 0:
        return mib << 20
    return min((total_ram_bytes() or 64 << 30) // 8, 8 << 30)


def _either(own, default):
    """A roster entry's own setting, else the global one (0 and false are settings too)."""
    return default if own is None else own


def default_name(entries: list[ModelEntry]) -> str | None:
    """The model a request naming none goes to: the entry marked default (local or remote), else the first local
    entry, else the first remote one (a roster served only elsewhere is not in setup mode)."""
    marked = [e.name for e in entries if e.default]
    if marked:
        return marked[-1]  # the last, as each entry marked default used to replace the one before
    return next((e.name for e in entries if not e.remote), entries[0].name if entries else None)


def check_shape(entry: ModelEntry) -> None:
    """400s for per-model settings outside the schema's bounds and choices (ctx, streams, chunk, kv_dtype)."""
    for key in ("ctx", "streams", "chunk", "kv_dtype"):
        value = getattr(entry, key)
        if value is not None:
            try:
                OPTIONS[key].parse(value, "request")
            except ConfigError as e:
                raise InvalidRequest(str(e), key) from None


@dataclasses.dataclass
class LoadRecord:
    """One load: which model, why, and when it started and ended (monotonic seconds; ended None: failed or
    still loading)."""

    model: str
    on_demand: bool
    started: float
    ended: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "on_demand": self.on_demand,
                "seconds": round(self.ended - self.started, 3) if self.ended is not None else None}


class ModelManager:
    """Loaded models by name, the default one, the loads in progress, and what else could be loaded.

    Models come and go on demand: a request naming an available model that is not loaded loads it (one load
    however many wait for it), an idle model leaves when its time-to-live runs out (its roster ttl, the last
    request's keep_alive, or --idle-ttl for models loaded on demand), and a load that does not fit the memory
    budget or the loaded-model count evicts idle models, least recently used first."""

    def __init__(self, config: Config, run: Callable[[Callable[[], Any]], asyncio.Future],
                 refuse_while_benching: Callable[[str], None]):
        self.config = config
        self.loaded: dict[str, LoadedModel] = {}
        self.default_id: str | None = None
        self.loading: dict[str, asyncio.Future] = {}  # name -> the load every waiter awaits
        self.progress: dict[str, float] = {}  # name -> fraction of its weights read, while loading
        self.tenancy: dict[str, Tenancy] = {}
        self.reserved: dict[str, int] = {}  # bytes promised to loads in flight
        self.counters = {"loads": 0, "on_demand_loads": 0, "load_failures": 0, "idle_unloads": 0, "evictions": 0,
                         "refused_for_memory": 0}
        self.discover: Callable[[], list[ModelEntry]] = lambda: []  # more available models (catalog, models_dir)
        self._discovery_problem: str | None = None
        self.recent_loads: collections.deque[LoadRecord] = collections.deque(maxlen=16)
        self._footprints: dict[tuple, Footprint] = {}
        self._reaper: asyncio.Task | None = None
        self._run = run  # runs a function on the scheduler thread
        self._not_benching = refuse_while_benching

    def settings_for(self, entry: ModelEntry) -> ModelSettings:
        """The global settings with the roster entry's overrides applied."""
        c = self.config
        return ModelSettings(streams=entry.streams or c.streams, ctx=entry.ctx or c.ctx, chunk=entry.chunk or c.chunk,
                             kv_dtype=entry.kv_dtype or c.kv_dtype, threads=c.threads or llama.default_threads(),
                             default_max_tokens=c.max_tokens, gpu=c.gpu,
                             gpu_layers=_either(entry.gpu_layers, c.gpu_layers), chat_template=entry.chat_template,
                             tool_format=entry.tool_format, kv_unified=_either(entry.kv_unified, c.kv_unified),
                             cache_ram=cache_ram_bytes(_either(entry.cache_ram, c.cache_ram)),
                             cache_disk=_either(entry.cache_disk, c.cache_disk) << 20,
                             cache_dir=Path(platformdirs.user_cache_dir(APP_NAME)) / "prompt-cache",
                             image_mmproj=entry.image_mmproj, rpc=c.rpc_for(entry))

    def load_all(self) -> None:
        """Load the roster entries that load at start (blocking; before the scheduler starts, or from a worker
        thread); the others (preload = false) are loaded by the first request that names them."""
        self.default_id = default_name(self.config.models)
        for entry in self.config.models:
            if entry.remote:  # served elsewhere (server/remote.py relays it); nothing to load
                continue
            if entry.preload is False:
                continue
            t0 = time.monotonic()
            m = LoadedModel(entry.name, Path(entry.path).expanduser(), self.settings_for(entry))
            self.loaded[entry.name] = m
            self.tenancy[entry.name] = self._tenancy(entry, m, on_demand=False)
            self.counters["loads"] += 1
            log.info("loaded %s (%s, %s, ctx %d x %d streams) in %.1f s", entry.name, m.model.arch,
                     m.model.quant(), m.ctx, m.settings.streams, time.monotonic() - t0)

    def start(self) -> None:
        """Start unloading idle models whose time is up (on the running loop)."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None

    # ---- routing -------------------------------------------------------------------------------

    def get(self, model: str | None) -> LoadedModel:
        """The loaded model serving `model` (None or "": the default); ModelNotFound / NoModelLoaded otherwise."""
        if not self.loaded:
            raise NoModelLoaded("no model loaded: download one from the catalog (GET /catalog) or start with --model")
        if not model:
            if self.default_id not in self.loaded:
                raise NoModelLoaded(f"the default model '{self.default_id}' is not loaded")
            return self.loaded[self.default_id]
        m = self.loaded.get(model)
        if m is None:
            raise ModelNotFound(f"The model '{model}' is not loaded; loaded: {', '.join(self.loaded)}", "model")
        return m

    def available(self) -> dict[str, ModelEntry]:
        """Every model this server can serve by name: roster entries first, then the catalog's downloads and
        the GGUFs in models_dir (a name the roster has is the roster's). Remote entries are not among them:
        another server serves those."""
        out = {e.name: e for e in self.config.models if not e.remote}
        for e in self._discovered():
            out.setdefault(e.name, e)
        return out

    def _discovered(self) -> list[ModelEntry]:
        """discover()'s models; none while the catalog file cannot be used (said once per problem: the roster
        keeps serving, and the catalog's routes answer the problem)."""
        try:
            return self.discover()
        except CatalogError as e:
            if str(e) != self._discovery_problem:
                self._discovery_problem = str(e)
                log.warning("models on disk not discovered: %s", e)
            return []

    @contextlib.asynccontextmanager
    async def lease(self, model: str | None, keep_alive: float | None | object = KEEP):
        """The model serving `model`, loaded first if it is available but not loaded (JIT), held loaded until
        the block exits (the request is submitted by then, and counted as the model's own). keep_alive: how
        long the model stays once idle after this request (None: until unloaded; KEEP: as it was)."""
        m = await self.acquire(model)
        t = self.tenancy.get(m.id)
        if t is not None:
            t.leases += 1
            if keep_alive is not KEEP:
                t.keep(keep_alive)
        try:
            yield m
        finally:
            if t is not None:
                t.leases -= 1
                t.last_used = time.monotonic()

    async def acquire(self, model: str | None) -> LoadedModel:
        """The loaded model for `model`, loading it on demand when it is available and --jit is on."""
        name = model or self.default_id
        if name is None:
            raise NoModelLoaded("no model loaded: download one from the catalog (GET /catalog) or start with --model")
        m = self.loaded.get(name)
        if m is not None:
            if name in self.tenancy:
                self.tenancy[name].last_used = time.monotonic()
            return m
        if name not in self.loading:
            entry = self.available().get(name)
            if entry is None and self._is_remote(name):
                raise ModelNotFound(f"The model '{name}' is served by a remote backend (backend = \"remote\"), "
                                    "which this route does not relay", "model")
            if entry is None:
                names = sorted(self.available()) or sorted(self.loaded)
                raise ModelNotFound(f"The model '{name}' does not exist; available: {', '.join(names) or 'none'}",
                                    "model")
            if not self.config.jit:
                raise ModelNotFound(f"The model '{name}' is not loaded (--jit is off): load it first with "
                                    "POST /v1/models/load", "model")
            self.loading[name] = asyncio.ensure_future(self._load(entry, on_demand=True))
            self.loading[name].add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved
        return await asyncio.shield(self.loading[name])

    def _is_remote(self, name: str) -> bool:
        return any(e.remote and e.name == name for e in self.config.models)

    def activate(self, name: str) -> LoadedModel:
        """Route requests that name no model to this one (404 for a model not loaded); the roster says so."""
        m = self.get(name)
        self.default_id = m.id
        for e in self.config.models:
            e.default = e.name == m.id
        self._save_soon()
        return m

    # ---- loading and unloading ------------------------------------------------------------------

    async def add(self, entry: ModelEntry, make_default: bool = False,
                  progress: Callable[[float], None] | None = None) -> LoadedModel:
        """Load a model into the roster without a restart (weights and context built off the loop);
        progress(fraction) is called on the event loop as the weights load. The roster in the config file
        keeps it (loaded at the next start too)."""
        self._not_benching("load a model")
        check_shape(entry)
        if entry.chat_template:  # a file that is no template is refused before any weights load
            await asyncio.to_thread(read_chat_template, entry.chat_template)
        if entry.name in self.loading:
            raise Conflict(f"model '{entry.name}' is already loading")
        if entry.name in self.loaded:
            raise Conflict(f"a model named '{entry.name}' is already loaded")
        if entry.remote or self._is_remote(entry.name):
            raise Conflict(f"'{entry.name}' names a remote model in the roster; a model loaded here needs a name "
                           "of its own")
        fut = self.loading[entry.name] = asyncio.ensure_future(self._load(entry, on_demand=False, progress=progress))
        m = await asyncio.shield(fut)
        if make_default or self.default_id is None:
            self.default_id = entry.name
        self._remember(entry, make_default)
        return m

    async def add_entry(self, entry: ModelEntry) -> None:
        """Add a roster entry without loading it (the first request naming it loads it) and save the roster:
        400 for settings outside the schema's bounds, 409 for a name the roster or a loaded model has."""
        check_shape(entry)
        name = entry.name
        if name in self.loaded or name in self.loading or any(e.name == name for e in self.config.models):
            raise Conflict(f"a model named '{name}' already exists: remove it first (or pick another name)", "name")
        self.config.models.append(entry)
        await asyncio.to_thread(self.config.save)

    async def forget(self, name: str) -> list[ModelEntry]:
        """Remove name from the roster (unloading it first when loaded; its requests are aborted) and save the
        roster; the entries removed. A default that goes is replaced by a loaded model or the first entry."""
        if name in self.loaded:
            self._not_benching("unload a model")
            await self._unload(name)
        gone = [e for e in self.config.models if e.name == name]
        self.config.models = [e for e in self.config.models if e.name != name]
        if self.default_id == name:
            self.default_id = next(iter(self.loaded), None) or default_name(self.config.models)
        await asyncio.to_thread(self.config.save)
        log.info("removed %s from the roster", name)
        return gone

    async def _load(self, entry: ModelEntry, on_demand: bool,
                    progress: Callable[[float], None] | None = None) -> LoadedModel:
        """Make room, then load entry off the loop (the scheduler thread keeps ticking the other models);
        every waiter gets the model or the same error. Runs as the one task of self.loading[name]."""
        name = entry.name
        try:
            settings = self.settings_for(entry)
            path = Path(entry.path).expanduser()
            await asyncio.to_thread(llama.check_gguf, path)  # missing, not a file, not a GGUF: said plainly
            need = await asyncio.to_thread(self.footprint, path, settings)
            await self._make_room(name, need)
            self.reserved[name] = need.total
            t0 = time.monotonic()
            record = LoadRecord(name, on_demand, t0)
            self.recent_loads.append(record)
            loop = asyncio.get_running_loop()

            def report(f: float) -> None:
                self.progress[name] = f
                if progress is not None:
                    progress(f)
            m = await asyncio.to_thread(LoadedModel, name, Path(entry.path).expanduser(), settings,
                                        lambda f: loop.call_soon_threadsafe(report, f))
        except EngineError:
            self.counters["load_failures"] += 1
            raise
        finally:
            self.loading.pop(name, None)
            self.progress.pop(name, None)
            self.reserved.pop(name, None)
        record.ended = time.monotonic()
        self.loaded[name] = m  # the scheduler thread steps it from its next tick
        self.tenancy[name] = self._tenancy(entry, m, on_demand, need)
        self.counters["loads"] += 1
        self.counters["on_demand_loads"] += on_demand
        if self.default_id is None:
            self.default_id = name
        log.info("loaded %s%s in %.1f s (about %s: weights %s, KV %s, compute %s)", name,
                 " on demand" if on_demand else "", time.monotonic() - t0, gib(need.total), gib(need.weights),
                 gib(need.kv), gib(need.compute))
        return m

    def footprint(self, path: Path, settings: ModelSettings) -> Footprint:
        """What serving path with settings would take (from the GGUF header; blocking, cached per file)."""
        try:
            st = path.stat()
        except (OSError, ValueError):  # gone, unreadable, or a name the OS refuses (NUL, too long)
            llama.check_gguf(path)  # the plain message for each of those
            raise
        key = (str(path), st.st_size, st.st_mtime_ns, settings.ctx, settings.streams, settings.kv_dtype,
               settings.chunk, settings.image_mmproj)
        if key not in self._footprints:
            try:
                self._footprints[key] = with_projector(footprint(path, settings.ctx, settings.streams,
                                                                 settings.kv_dtype, settings.chunk),
                                                       settings.image_mmproj)
            except (NotGGUF, OSError, ValueError) as e:
                raise ModelLoadError(f"cannot load model {path}: {e}") from None
        if settings.rpc:  # its weights and KV cache live on the rpc-servers (the file's pages here are cache)
            return dataclasses.replace(self._footprints[key], weights=0, kv=0)
        return self._footprints[key]

    async def _make_room(self, name: str, need: Footprint) -> None:
        """Evict idle models (LRU) until need fits the memory budget and the loaded-model count; wait a while
        for busy ones to finish; InsufficientMemory when it cannot fit."""
        budget = memory_budget(self.config.max_memory)
        if need.total > budget:
            self.counters["refused_for_memory"] += 1
            raise InsufficientMemory(
                f"model '{name}' needs about {gib(need.total)} (weights {gib(need.weights)}, KV cache "
                f"{gib(need.kv)}, compute {gib(need.compute)}) but the memory budget is {gib(budget)} "
                "(--max-memory); lower its ctx or streams, or pick a smaller quant", "model")
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            busy = {n for n, m in self.loaded.items() if m.outstanding > 0}
            evict = victims(list(self.tenancy.values()), busy, need.total, budget, sum(self.reserved.values()),
                            self.config.max_loaded, len(self.reserved))
            if evict is not None:
                for t in evict:
                    log.info("unloading idle %s to make room for %s (%s needed, budget %s)", t.name, name,
                             gib(need.total), gib(budget))
                    self.counters["evictions"] += 1
                    await self._unload(t.name)
                return
            if time.monotonic() > deadline:
                self.counters["refused_for_memory"] += 1
                raise InsufficientMemory(
                    f"model '{name}' (about {gib(need.total)}) does not fit beside the busy models "
                    f"{', '.join(sorted(busy))} within {gib(budget)} (--max-memory, --max-loaded "
                    f"{self.config.max_loaded or 'unlimited'}); retry when they are idle", "model")
            await asyncio.sleep(0.2)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_EVERY_S)
            try:
                await self.reap()
            except Exception:  # a failed unload must not end the reaper
                log.exception("unloading idle models failed")

    async def reap(self) -> None:
        """Unload the models whose time-to-live ran out while idle (a busy model is never unloaded)."""
        now = time.monotonic()
        for name, t in list(self.tenancy.items()):
            m = self.loaded.get(name)
            if m is None:
                continue
            if m.outstanding > 0:
                t.last_used = now
            elif t.expired(now, busy=False):
                log.info("unloading %s: idle for %.0f s (ttl %.0f s)", name, now - t.last_used, t.ttl)
                self.counters["idle_unloads"] += 1
                await self._unload(name)

    async def release(self, name: str) -> bool:
        """Unload a model as soon as it is idle (Ollama's keep_alive 0 with nothing to generate); the roster is
        unchanged. False when it is not loaded."""
        t = self.tenancy.get(name)
        if t is None:
            return False
        t.keep(0)
        t.last_used = 0.0
        await self.reap()
        return True

    async def remove(self, name: str) -> None:
        """Unload a model: abort its requests, free it on the scheduler thread. The roster keeps the entry, not
        loaded at the next start (preload = false); a request naming it loads it again."""
        self._not_benching("unload a model")
        if name not in self.loaded:
            raise ModelNotFound(f"The model '{name}' is not loaded", "model")
        await self._unload(name)
        if self.default_id == name:
            self.default_id = next(iter(self.loaded), None)
        entry = next((e for e in self.config.models if e.name == name), None)
        if entry is not None and entry.preload is not False:
            entry.preload = False
            await asyncio.to_thread(self.config.save)
        log.info("unloaded %s", name)

    async def _unload(self, name: str) -> None:
        m = self.loaded.pop(name)
        self.tenancy.pop(name, None)
        out = Outbox()

        def abort_and_free() -> None:
            for r in m.live_requests():
                m.runner.cancel(r)
            m.runner.step(out)
            m.free()
        await self._run(abort_and_free)
        deliver(out.take())  # the aborted requests learn that they ended

    def _tenancy(self, entry: ModelEntry, m: LoadedModel, on_demand: bool, need: Footprint | None = None) -> Tenancy:
        if need is None:
            need = self.footprint(Path(entry.path).expanduser(), m.settings)
        if entry.ttl is not None:
            ttl = None if entry.ttl < 0 else float(entry.ttl)
        elif on_demand and self.config.idle_ttl >= 0:
            ttl = float(self.config.idle_ttl)
        else:
            ttl = None
        return Tenancy(entry.name, need, on_demand, ttl)

    def _remember(self, entry: ModelEntry, make_default: bool) -> None:
        """Keep a model loaded by hand in the config file's roster (loaded at the next start)."""
        known = next((e for e in self.config.models if e.name == entry.name), None)
        if known is None:
            self.config.models.append(entry)
            known = entry
        known.preload = None
        if make_default:
            for e in self.config.models:
                e.default = e is known
        self._save_soon()

    def _save_soon(self) -> None:
        task = asyncio.get_running_loop().run_in_executor(None, self.config.save)
        task.add_done_callback(lambda f: f.exception() and log.warning("roster not saved: %s", f.exception()))

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
        self._not_benching("reload a model")
        await self._unload(name)
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
