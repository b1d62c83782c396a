"""llamadesk's own routes: health, what the engine is doing (stats, streams, Prometheus metrics),
the model roster (load, unload, activate) and the configuration."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from pydantic import Field
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from engine.config import NETWORK_KEYS, OPTIONS, SECRET_KEYS, ConfigError, ModelEntry
from engine.errors import EngineStopped as ServiceUnavailable
from engine.errors import Forbidden, InvalidRequest
from engine.system import VERSION
from server import remote
from server.access import loopback_only
from server.keys import CONFIG, LIFECYCLE, SERVICE
from server.schemas import read_json
from server.shapes import NonEmpty, Shape, documents, parse

routes = web.RouteTableDef()
log = logging.getLogger("llamadesk.server")


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": request.app[SERVICE].status, "version": VERSION})


def _stats(request: web.Request) -> dict:
    """The engine's counters, and the remote models' (per replica: outstanding, requests, errors, latency)."""
    return {**request.app[SERVICE].stats(), "remote": remote.remote_stats(request.app)}


@routes.get("/v1/stats")
async def stats(request: web.Request) -> web.Response:
    return web.json_response(_stats(request))


@routes.get("/v1/streams")
async def streams(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].streams())


# (stats key, kind, help) of each per-model series in /metrics
_MODEL_SERIES = (
    ("gen_tokens", "counter", "tokens generated"), ("prefill_tokens", "counter", "prompt tokens prefilled"),
    ("decode_calls", "counter", "llama_decode calls"), ("requests", "counter", "generation requests accepted"),
    ("rejected_requests", "counter", "requests refused with 503 (queue full)"),
    ("prefix_cache_hits", "counter", "requests that reused a cached prompt prefix"),
    ("prefix_cache_reused_tokens", "counter", "prompt tokens taken from the prefix cache"),
    ("kv_reused_tokens", "counter", "prompt tokens found in the sequence a request was given"),
    ("attached_tokens", "counter", "prompt tokens attached from another sequence's cells"),
    ("prefix_attaches", "counter", "requests that attached a prefix held by another sequence"),
    ("ram_reused_tokens", "counter", "prompt tokens restored from the host-RAM prompt cache"),
    ("forked_choices", "counter", "n > 1 choices that took the first one's prompt KV"),
    ("active_streams", "gauge", "streams prefilling or decoding"), ("queued_streams", "gauge", "streams waiting"),
    ("max_streams_per_decode", "gauge", "most streams stepped by one decode"),
    ("gen_tok_s", "gauge", "generated tokens per second, recent"))
_CACHE_SERIES = (("entries", "gauge", "entries"), ("bytes", "gauge", "bytes held"),
                 ("hits", "counter", "restores"), ("evictions", "counter", "entries evicted (LRU)"))
_REMOTE_SERIES = (("outstanding", "gauge", "requests in flight"), ("requests", "counter", "requests relayed"),
                  ("errors", "counter", "requests that failed"))


class _StatsCollector:
    """The /v1/stats snapshot as Prometheus metric families (prometheus_client writes the exposition text)."""

    def __init__(self, stats: dict):
        self.stats = stats

    @staticmethod
    def family(name: str, kind: str, help_: str, labels: list[str]):
        cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
        return cls(f"llamadesk_{name}", help_, labels=labels)

    def collect(self):
        per_model = self.stats["models"]
        for key, kind, help_ in _MODEL_SERIES:
            fam = self.family(key, kind, help_, ["model"])
            for m in per_model:
                fam.add_metric([m["id"]], m[key])
            yield fam
        ttft = self.family("ttft_ms", "gauge", "time to first token, recent requests", ["model", "stat"])
        for m in per_model:
            for q in ("avg", "p50", "p95"):
                ttft.add_metric([m["id"], q], m["ttft_ms"][q])
        yield ttft
        caches = [(m["id"], m["prompt_cache"]) for m in per_model if m.get("prompt_cache")]
        for key, kind, help_ in _CACHE_SERIES:
            fam = self.family(f"prompt_cache_{key}", kind, f"host-RAM prompt cache: {help_}", ["model"])
            for mid, c in caches:
                fam.add_metric([mid], c[key])
            yield fam
        yield GaugeMetricFamily("llamadesk_rss_bytes", "resident memory of the process",
                                value=self.stats["memory"]["rss_bytes"])
        yield GaugeMetricFamily("llamadesk_uptime_seconds", "seconds since start", value=self.stats["uptime_s"])
        yield from self._speech()
        yield from self._remote()

    def _remote(self):
        """Per remote model and replica: its requests in flight, relayed, failed, and its latency."""
        replicas = [(m["id"], r) for m in self.stats.get("remote", []) for r in m["replicas"]]
        labels = ["model", "replica"]
        for key, kind, help_ in _REMOTE_SERIES:
            fam = self.family(f"remote_{key}", kind, f"remote model replica: {help_}", labels)
            for mid, r in replicas:
                fam.add_metric([mid, r["url"]], r[key])
            yield fam
        up = self.family("remote_healthy", "gauge", "remote model replica: 1 in service, 0 out", labels)
        latency = self.family("remote_latency_ms", "gauge", "remote model replica: latency, recent requests",
                              [*labels, "stat"])
        for mid, r in replicas:
            up.add_metric([mid, r["url"]], 1 if r["healthy"] else 0)
            for q in ("avg", "p50", "p95"):
                latency.add_metric([mid, r["url"], q], r["latency_ms"][q])
        yield up
        yield latency

    def _speech(self):
        for kind in ("asr", "tts"):
            s = self.stats.get(kind) or {}
            if "jobs" not in s:
                continue
            jobs = self.family(f"{kind}_jobs", "counter", f"{kind.upper()} jobs done", ["model"])
            jobs.add_metric([s["model"]], s["jobs"])
            queued = self.family(f"{kind}_queued", "gauge", f"{kind.upper()} jobs waiting", ["model"])
            queued.add_metric([s["model"]], s["queued"])
            yield jobs
            yield queued
            if s.get("rtf") is not None:
                rtf = self.family(f"{kind}_rtf", "gauge", "seconds of compute per second of audio", ["model"])
                rtf.add_metric([s["model"]], s["rtf"])
                yield rtf


def prometheus_text(stats: dict) -> bytes:
    """The /v1/stats counters in Prometheus' text format 0.0.4."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatsCollector(stats))
    return generate_latest(registry)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    """Prometheus metrics: the /v1/stats counters, per model."""
    return web.Response(body=prometheus_text(_stats(request)),
                        headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4, "X-Content-Type-Options": "nosniff"})


class LoadRequest(Shape):
    """POST /v1/models/load: a GGUF into the roster without a restart (bounds: the roster's, checked at load)."""

    path: NonEmpty = Field(description="a GGUF file on this machine")
    name: NonEmpty | None = Field(None, description="the model's id (default: the file's stem)")
    ctx: int | None = None
    streams: int | None = None
    chunk: int | None = None
    kv_dtype: str | None = None
    chat_template: str | None = Field(None, description="a Jinja chat template file instead of the GGUF's")
    default: bool | None = Field(None, description="serve requests that name no model")

    def entry(self) -> ModelEntry:
        return ModelEntry(name=self.name or Path(self.path).stem, path=self.path, ctx=self.ctx, streams=self.streams,
                          chunk=self.chunk, kv_dtype=self.kv_dtype, chat_template=self.chat_template)


class ModelRequest(Shape):
    """POST /v1/models/unload's and /activate's body."""

    model: NonEmpty


class ReloadRequest(ModelRequest):
    """POST /v1/models/reload: a served model's settings, changed (the others stay)."""

    ctx: int | None = None
    streams: int | None = None
    chunk: int | None = None
    kv_dtype: str | None = None


class ConfigRequest(Shape):
    """POST /config."""

    values: dict[str, Any] | None = Field(None, description="config keys and their values (null: the default)")
    save: bool | None = Field(None, description="also write them to the config file")


class BenchRequest(Shape):
    """POST /bench (an empty body: the default model)."""

    model: str | None = None


@documents("POST", "/v1/models/load", "Load a GGUF into the roster without a restart", LoadRequest)
@routes.post("/v1/models/load")
@loopback_only
async def load_model(request: web.Request) -> web.Response:
    body = parse(LoadRequest, await read_json(request), "models.load")
    entry = body.entry()
    svc = request.app[SERVICE]
    await svc.roster.add(entry, make_default=bool(body.default))
    return web.json_response(next(m for m in svc.models() if m["id"] == entry.name))


@documents("POST", "/v1/models/reload", "Load a served model again with another ctx, streams, chunk or kv_dtype",
           ReloadRequest)
@routes.post("/v1/models/reload")
@loopback_only
async def reload_model(request: web.Request) -> web.Response:
    """Per-model settings: load a served model again with another ctx, streams, chunk or kv_dtype."""
    body = parse(ReloadRequest, await read_json(request), "models.reload")
    svc = request.app[SERVICE]
    await svc.roster.reload(body.model, ctx=body.ctx, streams=body.streams, chunk=body.chunk, kv_dtype=body.kv_dtype)
    return web.json_response(next(m for m in svc.models() if m["id"] == body.model))


@documents("POST", "/v1/models/unload", "Unload a model (the roster keeps it; a request naming it loads it)",
           ModelRequest)
@routes.post("/v1/models/unload")
@loopback_only
async def unload_model(request: web.Request) -> web.Response:
    name = parse(ModelRequest, await read_json(request), "models.unload").model
    await request.app[SERVICE].roster.remove(name)
    return web.json_response({"unloaded": name})


@documents("POST", "/v1/models/activate", "Serve requests that name no model with this one", ModelRequest)
@routes.post("/v1/models/activate")
@loopback_only
async def activate_model(request: web.Request) -> web.Response:
    name = parse(ModelRequest, await read_json(request), "models.activate").model
    return web.json_response({"default": request.app[SERVICE].roster.activate(name).id})  # 404 when unknown


@routes.get("/config")
async def get_config(request: web.Request) -> web.Response:
    cfg = request.app[SERVICE].config
    report = cfg.report()
    for key in SECRET_KEYS:
        if report[key]["value"]:
            report[key]["value"] = "***"
    return web.json_response({"path": str(cfg.path) if cfg.path else None, "keys": report,
                              "models": [{**dataclasses.asdict(m), **({"api_key": "***"} if m.api_key else {})}
                                         for m in cfg.models]})  # a remote model's key, shown as *** too


@documents("POST", "/config", "Validate config values; with save, write them to the config file", ConfigRequest)
@routes.post("/config")
@loopback_only
async def post_config(request: web.Request) -> web.Response:
    """Validate {"values": {key: value}}; with "save": true also write them as the authoritative TOML
    (they apply at the next start or reload)."""
    body = parse(ConfigRequest, await read_json(request), "config")
    values, save = body.values or {}, bool(body.save)
    parsed = {}
    for key, raw in values.items():
        opt = OPTIONS.get(key)
        if opt is None or opt.cli_only:
            raise InvalidRequest(f"unknown config key '{key}'", "values")
        try:
            parsed[key] = None if raw is None else opt.parse(raw, "request")
        except ConfigError as e:
            raise InvalidRequest(str(e), key) from None
    exposure = sorted(set(parsed) & set(NETWORK_KEYS))
    if exposure and not request.app[CONFIG].api_key:
        # the key check already passed when a key is set; without one, any caller could be a web page
        log.warning("refused a config change of %s over HTTP (no API key set; origin %s)", ", ".join(exposure),
                    request.headers.get("Origin", "-"))
        raise Forbidden(f"{', '.join(exposure)} cannot be changed over HTTP unless the server has an API key; "
                        "change them in the app's Settings, on the command line or in the config file", exposure[0])
    cfg = request.app[SERVICE].config
    if save:
        if cfg.path is None:
            raise InvalidRequest("this server runs without a config file to save to", "save")
        await asyncio.to_thread(cfg.save, parsed)
        log.warning("config saved to %s over HTTP: %s (origin %s)", cfg.path, ", ".join(sorted(parsed)) or "nothing",
                    request.headers.get("Origin", "-"))
    return web.json_response({"valid": True, "saved": bool(save), "values": parsed,
                              "path": str(cfg.path) if cfg.path else None})


@routes.get("/bench")
async def bench_state(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return web.json_response({**svc.bench.state, "history": svc.bench.history})


@documents("POST", "/bench", "Start the benchmark (llama-bench's rows) on a served model", BenchRequest)
@routes.post("/bench")
@loopback_only
async def bench_start(request: web.Request) -> web.Response:
    """Start the benchmark ({"model"?}); GET /bench follows it."""
    model = parse(BenchRequest, await read_json(request, empty_ok=True), "bench").model
    svc = request.app[SERVICE]
    m = svc.bench.begin(svc.roster.get(model))  # 404, 409 (busy) or 503 (setup mode) here, before 202

    async def go() -> None:
        try:
            await svc.bench.finish(m)
        except Exception:  # recorded in bench_state as failed
            log.exception("benchmark failed")
    svc.bench.task = asyncio.create_task(go())  # kept referenced while it runs
    return web.json_response(svc.bench.state, status=202)


def _lifecycle(request: web.Request):
    host = request.app[LIFECYCLE]
    if host is None:
        raise ServiceUnavailable("this server is embedded without a host that can restart or stop it")
    return host


@routes.post("/restart")
@loopback_only
async def restart(request: web.Request) -> web.Response:
    """Reload config and models in process (running streams drain first); the port stays the same."""
    await read_json(request, empty_ok=True)  # no body or JSON, as every POST: a page's text/plain is 415
    _lifecycle(request).request_restart()
    return web.json_response({"restarting": True}, status=202)


@routes.post("/shutdown")
@loopback_only
async def shutdown(request: web.Request) -> web.Response:
    """Drain running streams, stop serving and exit."""
    await read_json(request, empty_ok=True)  # no body or JSON, as every POST: a page's text/plain is 415
    _lifecycle(request).request_shutdown()
    return web.json_response({"shutting_down": True}, status=202)
