"""Who may call what: control routes answer only to this machine, whatever --host says."""
from __future__ import annotations

import functools
import ipaddress

from aiohttp import web

from server.errors import json_error


def is_loopback(request: web.Request) -> bool:
    """Whether the request comes from this machine."""
    try:
        return ipaddress.ip_address(request.remote or "").is_loopback
    except ValueError:
        return False


def loopback_only(handler):
    """Refuse the route (403) to clients on other machines."""
    @functools.wraps(handler)
    async def wrapper(request: web.Request) -> web.StreamResponse:
        if not is_loopback(request):
            return json_error(403, f"{request.path} is only available from this machine", "permission_error")
        return await handler(request)
    return wrapper
