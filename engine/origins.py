"""What a browser origin and a host name look like: the one check behind the Settings panel's fields and the
config loader's `cors_origins` (each returns None when the text is fine, else the problem in plain words)."""
from __future__ import annotations

import ipaddress
import re
from typing import Callable
from urllib.parse import urlsplit

_HOSTNAME = re.compile(r"^(?=.{1,253}\.?$)[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}"
                       r"[a-z0-9_])?)*\.?$", re.IGNORECASE)
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")


def is_host(text: str) -> bool:
    """Whether text is an IP address (IPv6 with or without brackets) or a DNS host name."""
    try:
        ipaddress.ip_address(text.strip("[]"))
        return True
    except ValueError:
        return bool(_HOSTNAME.match(text))


def check_origin(text: str) -> str | None:
    """One browser origin: scheme://host[:port], nothing after it; or * for any."""
    if text == "*":
        return None
    try:
        parts = urlsplit(text)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:  # a port that is no number, or out of range
        port_ok = False
    if (not _SCHEME.match(parts.scheme) or "://" not in text or not parts.hostname or not is_host(parts.hostname)
            or not port_ok):
        return f"'{text}' is not an origin: write scheme://host:port, for example http://localhost:3000"
    if parts.path or parts.query or parts.fragment or parts.username:
        return f"'{text}' is not an origin: leave out the path (an origin is only scheme://host:port)"
    return None


def check_each(text: str, check: Callable[[str], str | None]) -> str | None:
    """The first problem of a comma-separated list (an empty entry is one), each entry checked by check."""
    items = [x.strip() for x in text.split(",")]
    if any(not x for x in items):
        return "an empty entry: separate entries with single commas"
    return next((err for err in map(check, items) if err), None)


def check_origins(text: str) -> str | None:
    """A comma-separated list of origins (`cors_origins`)."""
    return check_each(text, check_origin)
