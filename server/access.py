"""Who may call what. The user's own browser is on loopback, so a local server is attacked through it:
a page on any origin can send "simple" cross-origin requests (CSRF), and a page whose host name re-resolves
to 127.0.0.1 can read the answers (DNS rebinding). So every request passes, before any work:

- the Host check: loopback names and IP literals always, the machine's own names when bound beyond
  loopback, and --allowed-hosts; anything else is 403 (a rebound name is never one of these);
- the Origin check: a request a web page sends carries Origin; it must be the server's own origin or one
  of --cors-origins, else 403. Requests without Origin (curl, SDKs, scripts) pass;
- the API key, when one is set, on every route but /health (supervisors and load balancers probe it), sent
  as 'Authorization: Bearer <key>' or as 'x-api-key: <key>' (what Anthropic's clients send).

Control routes are, in addition, loopback-only whatever --host says (`loopback_only`).
"""
from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import socket
import time
from dataclasses import dataclass, field

from aiohttp import web

from engine.errors import EngineError
from server.errors import json_error

log = logging.getLogger("llamadesk.server")
access_log = logging.getLogger("llamadesk.access")
OPEN_ROUTES = ("/health",)  # answer without the API key


def is_loopback(request: web.Request) -> bool:
    """Whether the request comes from this machine."""
    try:
        return ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:
        return False


def is_loopback_bind(host: str) -> bool:
    """Whether binding host keeps the server on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class InsecureBind(EngineError):
    """Serving beyond loopback was asked for without an API key."""


def check_exposure(config) -> bool:
    """Refuse (InsecureBind) to serve beyond loopback without an API key, unless the user opted out with
    --insecure-no-key; True when the server will be open to the network without a key."""
    if is_loopback_bind(config.host) or config.api_key:
        return False
    if not config.insecure_no_key:
        raise InsecureBind(f"refusing to serve on {config.host} without an API key: anyone on the network "
                           "could use and reconfigure this server. Set --api-key (the desktop app's "
                           "'Serve on the local network' makes one), or pass --insecure-no-key")
    return True


def loopback_only(handler):
    """Refuse the route (403) to clients on other machines."""
    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.StreamResponse:
        if not is_loopback(request):
            return json_error(403, f"{request.path} is only available from this machine", "permission_error",
                              request=request)
        return await handler(request)
    return wrapper


def _split_list(raw: str | None) -> set[str]:
    return {x.strip().lower() for x in (raw or "").split(",") if x.strip()}


def host_name(host_header: str) -> str:
    """The name (or address) part of a Host header, lowercased: 'Example.org:8080' -> 'example.org'."""
    h = host_header.strip().lower()
    if h.startswith("["):  # [::1]:8080
        return h[1:h.index("]")] if "]" in h else h
    if h.count(":") == 1:
        h = h.rsplit(":", 1)[0]
    return h


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def _own_names() -> set[str]:
    """This machine's names, as a browser on the local network would use them."""
    names = set()
    try:
        for n in (socket.gethostname(), socket.getfqdn()):
            if n:
                names |= {n.lower(), n.lower().split(".")[0] + ".local"}
    except OSError:
        pass
    return names


@dataclass
class Policy:
    """The allowlists one server checks every request against."""

    api_key: str | None = None
    cors_origins: set[str] = field(default_factory=set)
    allowed_hosts: set[str] = field(default_factory=set)
    beyond_loopback: bool = False

    def __post_init__(self) -> None:
        self._expected = f"Bearer {self.api_key}".encode() if self.api_key else None
        self._key = self.api_key.encode() if self.api_key else None
        self._own = _own_names() if self.beyond_loopback else set()

    @classmethod
    def from_config(cls, config) -> "Policy":
        return cls(api_key=config.api_key or None, cors_origins=_split_list(config.cors_origins),
                   allowed_hosts=_split_list(config.allowed_hosts), beyond_loopback=not is_loopback_bind(config.host))

    def host_allowed(self, host_header: str | None) -> bool:
        """Whether a request naming this Host may be answered (the DNS-rebinding guard)."""
        if host_header is None:  # HTTP/1.0 clients; every browser sends Host
            return True
        name = host_name(host_header)
        if _is_ip(name) or name in ("localhost", "localhost.") or name.endswith(".localhost"):
            return True  # an address cannot be rebound; *.localhost never leaves the machine (RFC 6761)
        if "*" in self.allowed_hosts or name in self._own or name in self.allowed_hosts:
            return True
        return any(h.startswith(".") and name.endswith(h) for h in self.allowed_hosts)

    def origin_allowed(self, origin: str, host_header: str | None) -> bool:
        """Whether a browser request from origin may be served: the server's own origin or an allowed one."""
        o = origin.strip().lower().rstrip("/")
        if "*" in self.cors_origins or o in self.cors_origins:
            return True
        if host_header is None or o == "null":
            return False
        own = host_header.strip().lower()
        return o in (f"http://{own}", f"http://{own.removesuffix(':80')}")

    def key_ok(self, request: web.Request) -> bool:
        """Whether the request carries the API key (always true when none is set)."""
        if self._expected is None:
            return True
        # aiohttp keeps undecodable header bytes as surrogate escapes; give them back as bytes
        bearer = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        key = request.headers.get("x-api-key", "").encode("utf-8", "surrogateescape")
        # both compared, whichever is sent: the time taken says nothing about either
        return hmac.compare_digest(bearer, self._expected) | hmac.compare_digest(key, self._key)


def guard_middleware(policy: Policy):
    """Host, Origin and API-key checks, before any work; CORS headers for the allowed origins."""
    @web.middleware
    async def guard(request: web.Request, handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if not policy.host_allowed(host):
            log.warning("refused %s %s: Host %r is not one this server answers to (origin %s)", request.method,
                        request.path, host, request.headers.get("Origin", "-"))
            return json_error(403, f"this server does not answer to the host name '{host_name(host)}' (a guard "
                              "against DNS rebinding); allow it with --allowed-hosts", "permission_error",
                              None, "host_not_allowed", request)
        origin = request.headers.get("Origin")
        if origin is not None and not policy.origin_allowed(origin, host):
            log.warning("refused %s %s from the web page origin %r", request.method, request.path, origin)
            return json_error(403, f"requests from web pages on {origin} are refused (a guard against cross-site "
                              "requests); allow that origin with --cors-origins", "permission_error",
                              None, "origin_not_allowed", request)
        if origin is None and request.method not in ("GET", "HEAD", "OPTIONS") and \
                request.headers.get("Sec-Fetch-Site") in ("cross-site", "same-site"):
            log.warning("refused %s %s: a cross-site browser request without Origin", request.method, request.path)
            return json_error(403, "cross-site browser requests are refused", "permission_error", None,
                              "origin_not_allowed", request)
        if origin is not None and request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            resp: web.StreamResponse = web.Response(status=204)  # the preflight needs no API key
            resp.headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
            resp.headers["Access-Control-Allow-Headers"] = request.headers.get(
                "Access-Control-Request-Headers", "Authorization, Content-Type")
            resp.headers["Access-Control-Max-Age"] = "600"
        elif request.path not in OPEN_ROUTES and not policy.key_ok(request):
            resp = json_error(401, "missing or wrong API key: send 'Authorization: Bearer <key>' or "
                              "'x-api-key: <key>'", "authentication_error", None, "invalid_api_key", request)
        else:
            resp = await handler(request)
        if origin is not None:
            resp.headers["Access-Control-Allow-Origin"] = origin
            resp.headers["Vary"] = "Origin"
        return resp
    return guard


@web.middleware
async def access_middleware(request: web.Request, handler) -> web.StreamResponse:
    """One line per request: method, path, status, duration and the Origin if any; never bodies or keys."""
    t0 = time.monotonic()
    status: int | str = "-"
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:
        status = e.status
        raise
    except BaseException:
        status = "aborted"  # the client went away (handler cancelled) or the handler failed
        raise
    finally:
        origin = request.headers.get("Origin")
        access_log.info("%s %s %s %.1fms%s", request.method, request.path, status, (time.monotonic() - t0) * 1000,
                        f" origin={origin}" if origin else "")
