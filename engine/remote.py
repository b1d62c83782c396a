"""Remote backends: roster entries another OpenAI-compatible server serves (vLLM, llama-server, Ollama's /v1,
another llamadesk). This is the policy side, with no HTTP in it: each entry's replicas, which replica takes the
next attempt (least outstanding requests), when a failing replica is out and when it is checked again
(exponential backoff), and the counters /v1/models, /v1/stats and /metrics read. server/remote.py relays the
requests and runs the checks."""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

from engine.config import ModelEntry
from engine.system import percentiles

log = logging.getLogger("llamadesk.remote")

DEFAULT_TIMEOUT_S = 600  # a buffered answer arrives whole, so this bounds a long generation too
HEALTH_EVERY_S = 10.0  # how often an in-service replica is checked (GET {url}/models)
BACKOFF_FIRST_S = 0.5  # a replica out of service is checked again after this, doubling per failure...
BACKOFF_MAX_S = 30.0  # ...up to this
WATCH_TICK_S = 0.2
LATENCY_WINDOW = 256  # recent latencies kept per replica


def base_url(url: str) -> str:
    """The OpenAI base URL an entry's url means: as written without a trailing slash, and a bare
    scheme://host:port taken as its /v1."""
    u = urlsplit(url.strip())
    path = u.path.rstrip("/") or "/v1"
    return urlunsplit((u.scheme.lower(), u.netloc, path, "", ""))


def backoff_s(failures: int) -> float:
    """Seconds until a replica that failed `failures` times in a row is checked again."""
    return min(BACKOFF_FIRST_S * 2 ** max(failures - 1, 0), BACKOFF_MAX_S)


@dataclass(eq=False)
class Replica:
    """One upstream base URL of a remote model, and what this server has seen of it."""

    url: str
    in_service: bool = True
    outstanding: int = 0
    requests: int = 0
    errors: int = 0
    failures: int = 0  # in a row; sets the backoff
    last_error: str | None = None
    next_check: float = 0.0  # monotonic; 0: at the first watch tick
    checking: bool = False
    picked_at: float = 0.0  # breaks ties between replicas equally busy: the least recently picked goes first
    latency_ms: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW))

    def fail(self, reason: str, now: float, checked: bool = False) -> None:
        """Take it out of service, to be checked again after the backoff. Once it is out only failed checks
        (checked) lengthen the backoff: the requests that failed together on it are one failure."""
        self.last_error = reason
        if not self.in_service and not checked:
            return
        self.failures += 1
        self.next_check = now + backoff_s(self.failures)
        if self.in_service:
            log.warning("remote %s taken out: %s (checked again in %.1f s)", self.url, reason,
                        backoff_s(self.failures))
        self.in_service = False

    def recover(self, now: float) -> None:
        """Put it (back) in service; the next routine check is HEALTH_EVERY_S away."""
        if not self.in_service:
            log.info("remote %s back in service after %d failed checks", self.url, self.failures)
        self.in_service = True
        self.failures = 0
        self.next_check = now + HEALTH_EVERY_S

    def due(self, now: float) -> bool:
        return not self.checking and now >= self.next_check

    def health(self) -> dict[str, Any]:
        return {"url": self.url, "healthy": self.in_service, "last_error": self.last_error}

    def stats(self) -> dict[str, Any]:
        return {**self.health(), "outstanding": self.outstanding, "requests": self.requests,
                "errors": self.errors, "latency_ms": percentiles(self.latency_ms)}


@dataclass
class RemoteModel:
    """A roster entry served elsewhere: the upstream's id for it, the key sent upstream, its replicas."""

    name: str
    remote_model: str
    replicas: list[Replica]
    api_key: str | None
    timeout_s: float
    created: int
    key_problem: str | None = None  # api_key_env names a variable that is not set

    @classmethod
    def from_entry(cls, entry: ModelEntry, created: int) -> RemoteModel:
        urls = list(dict.fromkeys(base_url(u) for u in [*([entry.url] if entry.url else []), *(entry.urls or [])]))
        key, problem = entry.api_key, None
        if entry.api_key_env:
            key = os.environ.get(entry.api_key_env) or None
            if key is None:
                problem = f"api_key_env: ${entry.api_key_env} is not set; requests go without a key"
                log.warning("remote model %s: %s", entry.name, problem)
        return cls(entry.name, entry.remote_model or entry.name, [Replica(u) for u in urls], key,
                   float(entry.timeout or DEFAULT_TIMEOUT_S), created, problem)

    def same_upstream(self, other: RemoteModel) -> bool:
        """Whether other reaches the same upstream model the same way (its entry was not changed)."""
        return (self.remote_model, [r.url for r in self.replicas], self.api_key, self.timeout_s) == \
            (other.remote_model, [r.url for r in other.replicas], other.api_key, other.timeout_s)

    def pick(self, tried: set[Replica]) -> Replica | None:
        """The replica for the next attempt of a request that already tried `tried`: of those in service, the
        one with the fewest requests outstanding (the least recently picked of a tie); when every one left is
        out, the one due to be checked soonest (a last resort beats answering 502 unasked); None when all were
        tried."""
        left = [r for r in self.replicas if r not in tried]
        if not left:
            return None
        serving = [r for r in left if r.in_service]
        chosen = min(serving, key=lambda r: (r.outstanding, r.picked_at)) if serving else \
            min(left, key=lambda r: r.next_check)
        chosen.picked_at = time.monotonic()
        return chosen

    def card(self) -> dict[str, Any]:
        """This model as /v1/models lists it."""
        card = {"id": self.name, "object": "model", "created": self.created, "owned_by": "remote",
                "backend": "remote", "remote_model": self.remote_model,
                "healthy": any(r.in_service for r in self.replicas),
                "replicas": [r.health() for r in self.replicas]}
        if self.key_problem:
            card["error"] = self.key_problem
        return card

    def stats(self) -> dict[str, Any]:
        """This model's counters, per replica and summed."""
        reps = [r.stats() for r in self.replicas]
        return {"id": self.name, "remote_model": self.remote_model,
                **{k: sum(r[k] for r in reps) for k in ("outstanding", "requests", "errors")}, "replicas": reps}


Probe = Callable[[RemoteModel, Replica], Awaitable[str | None]]  # None: healthy; else why not


class Remotes:
    """The remote models of one server, by name."""

    def __init__(self, models: list[RemoteModel]):
        self.models = {m.name: m for m in models}
        self._checks: set[asyncio.Task] = set()

    @classmethod
    def from_roster(cls, entries: list[ModelEntry]) -> Remotes:
        created = int(time.time())
        return cls([RemoteModel.from_entry(e, created) for e in entries if e.remote])

    def __bool__(self) -> bool:
        return bool(self.models)

    def get(self, name: Any) -> RemoteModel | None:
        """The remote model a request's "model" names, if it names one."""
        return self.models.get(name) if isinstance(name, str) else None

    def cards(self) -> list[dict[str, Any]]:
        return [m.card() for m in self.models.values()]

    def stats(self) -> list[dict[str, Any]]:
        return [m.stats() for m in self.models.values()]

    async def watch(self, probe: Probe) -> None:
        """Check every replica when it is due: in-service ones every HEALTH_EVERY_S, out-of-service ones on
        their backoff; runs until cancelled."""
        try:
            while True:
                now = time.monotonic()
                for m in self.models.values():
                    for r in m.replicas:
                        if r.due(now):
                            r.checking = True
                            task = asyncio.ensure_future(self._check(probe, m, r))
                            self._checks.add(task)
                            task.add_done_callback(self._checks.discard)
                await asyncio.sleep(WATCH_TICK_S)
        finally:
            for task in list(self._checks):
                task.cancel()

    async def _check(self, probe: Probe, m: RemoteModel, r: Replica) -> None:
        try:
            problem = await probe(m, r)
        finally:
            r.checking = False
        if problem is None:
            r.recover(time.monotonic())
        else:
            r.fail(problem, time.monotonic(), checked=True)
