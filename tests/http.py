"""Raw HTTP for the routes and inputs the openai client does not cover (status and body, errors too)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def request(url: str, method: str = "GET", body: Any = None, timeout: float = 120) -> tuple[int, Any]:
    """(status, parsed JSON or text) of a request to url; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={} if body is None else {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            return r.status, json.loads(raw) if r.headers.get_content_type() == "application/json" else raw
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def call(server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """request() against a LiveServer."""
    return request(server.url + path, method, body)
