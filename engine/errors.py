"""Typed engine errors. server/errors.py maps each class to an HTTP status in one place."""
from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine reports to a caller."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(EngineError):
    """The request is malformed or asks for something out of range."""


class ContextLengthExceeded(InvalidRequest):
    """The prompt (plus the requested completion) does not fit the context."""


class UnsupportedMediaType(InvalidRequest):
    """The body is not sent in the media type the route reads (JSON routes take application/json only)."""


class PayloadTooLarge(InvalidRequest):
    """The input is larger than a configured bound (bytes, decoded audio seconds, file size)."""


class Forbidden(EngineError):
    """The caller may not do this (a foreign Origin, a network setting changed without the API key)."""


class ModelNotFound(EngineError):
    """The request names a model that is not in the roster."""


class NotFound(EngineError):
    """The request names a stored object (a stored response) that does not exist or is no longer kept."""


class UnsupportedByModel(InvalidRequest):
    """The model cannot serve this kind of request (e.g. chat on an embedding model)."""


class Conflict(EngineError):
    """The action collides with work in progress (a download already running, a model loading)."""


class BenchRunning(EngineError):
    """A benchmark has the engine to itself for a moment."""


class QueueFull(EngineError):
    """Every stream is busy and the wait queue is at its bound."""


class NoModelLoaded(EngineError):
    """The server runs in setup mode: nothing is loaded to serve the request."""


class SpeechUnavailable(EngineError):
    """The route needs a speech model (ASR, TTS, VAD) that is not loaded."""


class ModelLoadError(EngineError):
    """A model file is missing, truncated or not a GGUF llama.cpp can load."""


class EngineStopped(EngineError):
    """The engine is shutting down and takes no more work."""


class UpstreamError(EngineError):
    """A remote service llamadesk called for the request (the model hub) failed or could not be reached."""


class UpstreamTimeout(UpstreamError):
    """A remote service llamadesk called for the request sent nothing within its timeout."""


class UpstreamUnauthorized(UpstreamError):
    """A remote service refused for want of credentials (a gated or private model repo without a token)."""


class InsufficientMemory(EngineError):
    """A model does not fit the memory budget (alone, or beside the busy models)."""
