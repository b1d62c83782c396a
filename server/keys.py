"""Typed keys of the aiohttp application state."""
from __future__ import annotations

from aiohttp import web

from engine.config import Config
from engine.service import Service

SERVICE = web.AppKey("service", Service)
CONFIG = web.AppKey("config", Config)
