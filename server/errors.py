"""The one place that turns errors into HTTP: status codes and OpenAI-shaped bodies
{"error": {"message", "type", "param", "code"}}, for JSON responses and SSE error events alike (on the Ollama
API's and Anthropic's paths, in their shapes)."""
from __future__ import annotations

import json
import logging

from aiohttp import web

from engine import errors as E

log = logging.getLogger("llamadesk.server")

# Engine error class -> (HTTP status, OpenAI error type, code). The most specific class wins.
_MAP: list[tuple[type[E.EngineError], int, str, str | None]] = [
    (E.ContextLengthExceeded, 400, "invalid_request_error", "context_length_exceeded"),
    (E.UnsupportedByModel, 400, "invalid_request_error", "model_not_supported"),
    (E.UnsupportedMediaType, 415, "invalid_request_error", "unsupported_media_type"),
    (E.PayloadTooLarge, 413, "invalid_request_error", "request_too_large"),
    (E.InvalidRequest, 400, "invalid_request_error", None),
    (E.Forbidden, 403, "permission_error", "forbidden"),
    (E.ModelNotFound, 404, "invalid_request_error", "model_not_found"),
    (E.NotFound, 404, "invalid_request_error", "not_found"),
    (E.Conflict, 409, "invalid_request_error", "conflict"),
    (E.BenchRunning, 503, "server_error", "benchmark_running"),
    (E.QueueFull, 503, "server_error", "server_overloaded"),
    (E.NoModelLoaded, 503, "server_error", "no_model_loaded"),
    (E.InsufficientMemory, 503, "server_error", "insufficient_memory"),
    (E.SpeechUnavailable, 503, "server_error", "no_model_loaded"),
    (E.EngineStopped, 503, "server_error", "shutting_down"),
    (E.ModelLoadError, 400, "invalid_request_error", "model_load_failed"),
    (E.UpstreamUnauthorized, 401, "authentication_error", "upstream_unauthorized"),
    (E.UpstreamTimeout, 504, "server_error", "upstream_timeout"),
    (E.UpstreamError, 502, "server_error", "upstream_error"),
    (E.EngineError, 500, "server_error", None),
]


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def classify(exc: E.EngineError) -> tuple[int, dict]:
    """HTTP status and body for an engine error."""
    for cls, status, type_, code in _MAP:
        if isinstance(exc, cls):
            # an upstream's refusal relayed (server/remote.py) keeps the upstream's own type and code
            return status, error_body(exc.message, getattr(exc, "upstream_type", None) or type_, exc.param,
                                      getattr(exc, "upstream_code", None) or code)
    raise AssertionError("unreachable: EngineError is the last entry")


OLLAMA_PREFIX = "/api/"  # the Ollama API's routes answer errors in its own shape: {"error": "message"}
ANTHROPIC_PATH = "/v1/messages"  # and Anthropic's Messages API (and what is under it) in Anthropic's
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error", 529: "overloaded_error"}


def is_anthropic(path: str) -> bool:
    """Whether path is one of the Anthropic Messages API's."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def anthropic_error_body(status: int, message: str) -> dict:
    """Anthropic's error object: {"type": "error", "error": {"type", "message"}}, its type from the status."""
    type_ = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": type_, "message": message}}


# The engine names the chat-completions field a value came in; these protocols carry it in fields of their own.
_OLLAMA_PARAMS = {"response_format": "format"}
_ANTHROPIC_PARAMS = {"response_format": "output_config"}


def _naming(message: str, param: str | None, names: dict[str, str]) -> str:
    """The message naming the protocol's field (their error shapes have no param of their own), led by it as
    Anthropic leads its own ("max_tokens: Field required") where the message does not name it already."""
    if param is None:
        return message
    field = names.get(param, param)
    return message if field in message else f"{field}: {message}"


def json_error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, request: web.Request | None = None) -> web.Response:
    """An error response in the OpenAI shape, or in the Ollama API's or Anthropic's for their routes (given
    the request)."""
    if request is not None and request.path.startswith(OLLAMA_PREFIX):
        return web.json_response({"error": _naming(message, param, _OLLAMA_PARAMS)}, status=status)
    if request is not None and is_anthropic(request.path):
        return web.json_response(anthropic_error_body(status, _naming(message, param, _ANTHROPIC_PARAMS)),
                                 status=status)
    return web.json_response(error_body(message, type_, param, code), status=status)


def engine_error_response(exc: E.EngineError) -> web.Response:
    """An engine error as a JSON response."""
    status, body = classify(exc)
    return web.json_response(body, status=status)


def sse_error_event(exc: E.EngineError) -> bytes:
    """An engine error as an SSE data event (for failures after the stream started)."""
    _, body = classify(exc)
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def anthropic_error_event(exc: E.EngineError) -> bytes:
    """An engine error as Anthropic's SSE error event (for failures after the stream started)."""
    status, _ = classify(exc)
    return b"event: error\ndata: " + json.dumps(anthropic_error_body(status, exc.message)).encode() + b"\n\n"


_HTTP_TYPES = {401: ("authentication_error", "invalid_api_key"), 403: ("permission_error", None),
               404: ("invalid_request_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed"),
               413: ("invalid_request_error", "request_too_large")}


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every failure leaves as an OpenAI-shaped error; the server keeps serving."""
    try:
        return await handler(request)
    except E.EngineError as e:
        status, body = classify(e)
        log.info("%s %s -> %d: %s", request.method, request.path, status, e.message)
        err = body["error"]
        return json_error(status, e.message, err["type"], err["param"], err["code"], request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        type_, code = _HTTP_TYPES.get(e.status, ("invalid_request_error", None))
        if e.status == 404:
            message = f"unknown route: {request.method} {request.path}"
        elif e.status == 405:
            message = f"method {request.method} is not allowed on {request.path}"
        elif e.status == 413:
            upload = request.content_type.startswith("multipart/")
            limit = request.app[MAX_UPLOAD_KEY if upload else MAX_BODY_KEY]
            message = f"request body too large: the {'upload' if upload else 'JSON'} limit is {limit // 2**20} MB"
        else:
            message = e.text or e.reason
        log.warning("%s %s -> %d: %s", request.method, request.path, e.status, message)
        return json_error(e.status, message, type_, None, code, request)
    except ConnectionError as e:  # the client went away mid-response: nothing to tell it, nothing to trace
        log.info("%s %s: client went away (%s)", request.method, request.path, e)
        # aiohttp's writing this one fails quietly too; 499 is what the access log shows (nginx's "client closed")
        return web.Response(status=499, reason="Client Closed Request")
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return json_error(500, "internal server error (logged)", "server_error", request=request)


MAX_BODY_KEY = web.AppKey("max_body_bytes", int)
MAX_UPLOAD_KEY = web.AppKey("max_upload_bytes", int)
