"""Typed keys of the aiohttp application state."""
from __future__ import annotations

from typing import Protocol

from aiohttp import web

from engine.config import Config
from engine.service import Service

SERVICE = web.AppKey("service", Service)
CONFIG = web.AppKey("config", Config)


class Lifecycle(Protocol):
    """What hosts the server: it can reload it in process or shut the process down."""

    def request_restart(self) -> None: ...

    def request_shutdown(self) -> None: ...


LIFECYCLE = web.AppKey("lifecycle", Lifecycle)  # None when embedded without a host
