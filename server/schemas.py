"""Request bodies checked field by field and translated into engine requests.

Every check names the field it rejects; fields the server does not use are logged once per name.
(Over 400 lines on purpose: every route's body goes through the same Fields checks and value walk, and
keeping the OpenAI shapes side by side keeps them consistent.)
"""
from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from engine.chat import ROLES, TEMPLATE_VARIABLES
from server.errors import MAX_BODY_KEY
from engine.errors import InvalidRequest, UnsupportedMediaType
from engine.models.tenancy import parse_keep_alive
from engine.requests import KEEP, ChatRequest, CompletionRequest, SamplingParams

log = logging.getLogger("llamadesk.server")
_ignored_logged: set[str] = set()

# Accepted for compatibility but without effect here; never an error.
_HARMLESS = {"user", "store", "metadata", "service_tier", "prediction", "modalities", "suffix", "best_of",
             "reasoning_effort", "dimensions"}


MAX_DEPTH = 64  # deepest nesting of arrays and objects a JSON body may have


async def read_json(request: web.Request, empty_ok: bool = False) -> dict[str, Any]:
    """The request body as a JSON object (InvalidRequest if it is not one; 413 over the JSON limit; 415 unless
    it is sent as application/json). empty_ok: an empty body (no Content-Type needed) reads as {}."""
    limit = request.app[MAX_BODY_KEY]
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    if empty_ok and request.content_length == 0:
        return {}
    # A web page can send text/plain, form or multipart bodies to any origin without a CORS preflight;
    # JSON routes take only JSON, so such a "simple" request never reaches a handler.
    if request.content_type != "application/json":
        got = request.headers.get("Content-Type")
        raise UnsupportedMediaType(f"send the body as JSON with 'Content-Type: application/json' (got "
                                   f"{got!r})" if got else "send the body as JSON with 'Content-Type: "
                                   "application/json' (the request had no Content-Type)")
    raw = await request.read()
    if len(raw) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(raw))
    if empty_ok and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except RecursionError:  # deeper than the parser goes
        raise InvalidRequest(f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep") \
            from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer literal over 4300 digits
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    if _depth_exceeds(body, MAX_DEPTH):
        raise InvalidRequest(f"the request body nests arrays and objects more than {MAX_DEPTH} levels deep")
    if not isinstance(body, dict):
        raise InvalidRequest(f"the request body must be a JSON object, not {_json_type(body)}")
    return body


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether value nests lists and dicts deeper than limit (iteratively: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in v if isinstance(x, (list, dict)))
    return False


class Fields:
    """Typed access to a JSON body that remembers which fields were read."""

    def __init__(self, body: dict[str, Any], route: str):
        self.body = body
        self.route = route
        self.used: set[str] = set()

    def get(self, name: str, kinds: type | tuple[type, ...], default: Any = None, *, lo: float | None = None,
            hi: float | None = None, what: str | None = None) -> Any:
        """body[name] checked against kinds and bounds; default when absent or null. Numbers must be finite
        (integers within 64 bits) and strings valid Unicode, nested ones included."""
        self.used.add(name)
        v = self.body.get(name)
        if v is None:
            return default
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        is_bool = isinstance(v, bool)
        ok = any(isinstance(v, k) and (k is bool or not is_bool) for k in kinds)
        if float in kinds and isinstance(v, int) and not is_bool:
            if abs(v) > _MAX_FLOAT_INT:  # float() of it would raise OverflowError
                raise InvalidRequest(f"'{name}' is out of range: got an integer too large for a number", name)
            ok, v = True, float(v)
        if not ok:
            raise InvalidRequest(f"'{name}' must be {what or _kind_words(kinds)}, got {_json_type(v)}", name)
        problem = _not_plain_json(v, name)
        if problem:
            raise InvalidRequest(problem, name)
        if lo is not None and v < lo or hi is not None and v > hi:
            rng = f"between {lo} and {hi}" if lo is not None and hi is not None else \
                (f">= {lo}" if lo is not None else f"<= {hi}")
            raise InvalidRequest(f"'{name}' must be {rng}, got {v}", name)
        return v

    def require(self, name: str, kinds: type | tuple[type, ...], what: str = "") -> Any:
        """body[name] as get() checks it, and a 400 naming it when it is absent or empty."""
        v = self.get(name, kinds)
        if v is None or v == "":
            raise InvalidRequest(f"'{name}' is required" + (f": {what}" if what else ""), name)
        return v

    def use(self, *names: str) -> "Fields":
        """Mark fields as read (for bodies whose fields are read elsewhere)."""
        self.used.update(names)
        return self

    def log_ignored(self) -> None:
        """Log, once per field name, the fields this route did not use."""
        for name in self.body.keys() - self.used - _HARMLESS:
            key = f"{self.route}:{name}"
            if key not in _ignored_logged:
                _ignored_logged.add(key)
                log.warning("ignoring unsupported field '%s' in %s requests (logged once)", name, self.route)


_MAX_FLOAT_INT = 10 ** 308  # integers beyond this overflow a float
_INT64 = 2 ** 63
_SURROGATE = re.compile("[\ud800-\udfff]")


def _not_plain_json(value: Any, path: str) -> str | None:
    """Why value (a field's value, nested parts included) cannot go on to the engine, or None: a lone
    surrogate cannot be encoded as UTF-8 (so not tokenized), NaN and Infinity are no JSON numbers, and no
    engine parameter takes an integer beyond 64 bits. Iterative; the depth is bounded by read_json."""
    problem = _scalar_problem(value)
    if problem:
        return problem(path)
    stack = [(value, path)] if isinstance(value, (list, dict)) else []
    while stack:
        v, p = stack.pop()
        if isinstance(v, dict):
            for k in v:
                if _SURROGATE.search(k):
                    return f"a key in '{p}' holds a lone surrogate ({_first_surrogate(k)}), which is not valid " \
                           "Unicode text"
            children = [(x, k, ".") for k, x in v.items()]
        elif all(type(x) is int for x in v):  # token ids: checked by their extremes (a prompt may be 100k long)
            if v and (min(v) < -_INT64 or max(v) >= _INT64):
                i = next(i for i, x in enumerate(v) if not -_INT64 <= x < _INT64)
                return f"'{p}[{i}]' is out of range: integers here must fit in 64 bits"
            continue
        else:
            children = [(x, i, "[") for i, x in enumerate(v)]
        nested = []
        for x, key, sep in children:
            if isinstance(x, (list, dict)):
                nested.append((x, f"{p}.{key}" if sep == "." else f"{p}[{key}]"))
            elif (problem := _scalar_problem(x)) is not None:
                return problem(f"{p}.{key}" if sep == "." else f"{p}[{key}]")
        stack.extend(reversed(nested))  # depth first, in document order
    return None


def _scalar_problem(v: Any):
    """A function of the value's path giving why v is refused, or None."""
    if isinstance(v, str):
        if _SURROGATE.search(v):
            return lambda p: f"'{p}' holds a lone surrogate ({_first_surrogate(v)}), which is not valid Unicode text"
    elif isinstance(v, float):
        if not math.isfinite(v):
            return lambda p: f"'{p}' must be a finite number, got {v}"
    elif isinstance(v, int) and not isinstance(v, bool) and not -_INT64 <= v < _INT64:
        return lambda p: f"'{p}' is out of range: integers here must fit in 64 bits"
    return None


def _brief(v: Any) -> str:
    """repr(v), cut short: error messages quote what they refuse, but never a whole body."""
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _first_surrogate(text: str) -> str:
    m = _SURROGATE.search(text)
    return f"\\u{ord(m.group()):04x} at character {m.start()}" if m else ""


def _kind_words(kinds: tuple[type, ...]) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "an object"}
    return " or ".join(names[k] for k in kinds)


def _json_type(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(v), type(v).__name__)


@dataclass
class StreamOptions:
    """How the response is delivered."""

    stream: bool
    include_usage: bool
    n: int = 1  # choices, generated as parallel streams
    logprobs: bool = False


def sampling_params(f: Fields) -> SamplingParams:
    """The sampling fields every generating route reads (max_tokens, temperature, penalties, stop, ...)."""
    max_tokens = f.get("max_completion_tokens", int, lo=1)
    if max_tokens is None:
        max_tokens = f.get("max_tokens", int, lo=1)
    else:
        f.used.add("max_tokens")
    stop = f.get("stop", (str, list), [], what="a string or an array of strings")
    if isinstance(stop, str):
        stop = [stop]
    if len(stop) > 16 or not all(isinstance(s, str) for s in stop):
        raise InvalidRequest("'stop' must be a string or an array of at most 16 strings", "stop")
    bias_raw = f.get("logit_bias", dict, {})
    bias = {}
    for k, v in bias_raw.items():
        try:
            tok = int(k)
        except ValueError:
            tok = -1
        if not 0 <= tok < 2**31:
            raise InvalidRequest(f"'logit_bias' keys must be token ids, got {_brief(k)}", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise InvalidRequest(f"'logit_bias' values must be numbers between -100 and 100, got {_brief(v)}",
                                 "logit_bias")
        bias[tok] = float(v)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=f.get("temperature", float, 1.0, lo=0, hi=2),
        top_p=f.get("top_p", float, 1.0, lo=0, hi=1),
        top_k=f.get("top_k", int, 0, lo=0, hi=2**31 - 1),
        min_p=f.get("min_p", float, 0.0, lo=0, hi=1),
        repeat_penalty=f.get("repeat_penalty", float, 1.0, lo=0.01, hi=10),
        presence_penalty=f.get("presence_penalty", float, 0.0, lo=-2, hi=2),
        frequency_penalty=f.get("frequency_penalty", float, 0.0, lo=-2, hi=2),
        seed=f.get("seed", int),
        logit_bias=bias,
        stop=stop,
        ignore_eos=f.get("ignore_eos", bool, False),
    )


def _stream_options(f: Fields) -> StreamOptions:
    stream = f.get("stream", bool, False)
    opts = f.get("stream_options", dict, {})
    include_usage = opts.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise InvalidRequest("'stream_options.include_usage' must be a boolean", "stream_options")
    return StreamOptions(stream, include_usage, n=f.get("n", int, 1, lo=1, hi=8))


def _response_format(f: Fields) -> dict[str, Any] | None:
    """What a response_format asks for, as the engine's output spec: {"type": "json_object"} or
    {"type": "json_schema", "schema": {...}} (None for plain text). The engine compiles it into a grammar."""
    rf = f.get("response_format", dict)
    kind = (rf or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, dict):
            raise InvalidRequest("response_format json_schema needs {\"json_schema\": {\"name\", \"schema\": {...}}}",
                                 "response_format")
        return {"type": "json_schema", "schema": schema}
    raise InvalidRequest(f"response_format type must be text, json_object or json_schema, got {_brief(kind)}",
                         "response_format")


_CALL_SHAPE = '{"id", "type": "function", "function": {"name", "arguments"}}'
_TOOL_SHAPE = '{"type": "function", "function": {"name", "description"?, "parameters"?}}'
_TOOL_CHOICES = ("none", "auto", "required")
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # OpenAI's (plus '.'): it goes into grammars and call syntax


def check_messages(messages: list) -> None:
    """Each message's role, content, name and tool_calls have the OpenAI shape (the engine relies on it)."""
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest(f"{at} must be an object", "messages")
        if m.get("role") not in ROLES:
            raise InvalidRequest(f"{at}.role must be one of {', '.join(ROLES)}, got {_brief(m.get('role'))}",
                                 "messages")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidRequest(f"{at}.content must be a string or an array of parts", "messages")
        for j, part in enumerate(content if isinstance(content, list) else []):
            if not isinstance(part, dict):
                raise InvalidRequest(f"{at}.content parts must be objects", "messages")
            if not isinstance(part.get("type"), str):
                raise InvalidRequest(f"{at}.content[{j}].type must be a string", "messages")
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{at}.content[{j}].text must be a string", "messages")
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise InvalidRequest(f"{at}.{key} must be a string", "messages")
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise InvalidRequest(f"{at}.tool_calls must be an array of {_CALL_SHAPE}", "messages")
        for j, c in enumerate(calls):
            where = f"{at}.tool_calls[{j}]"
            if not isinstance(c, dict):
                raise InvalidRequest(f"{where} must be an object {_CALL_SHAPE}, got {_json_type(c)}", "messages")
            if c.get("id") is not None and not isinstance(c["id"], str):
                raise InvalidRequest(f"{where}.id must be a string", "messages")
            if c.get("type", "function") != "function":
                raise InvalidRequest(f"{where}.type must be 'function'", "messages")
            fn = c.get("function")
            if not isinstance(fn, dict):
                raise InvalidRequest(f"{where}.function must be an object {{\"name\", \"arguments\"}}", "messages")
            if not isinstance(fn.get("name"), str) or not fn["name"]:
                raise InvalidRequest(f"{where}.function.name must be a non-empty string", "messages")
            if fn.get("arguments") is not None and not isinstance(fn["arguments"], (str, dict)):
                raise InvalidRequest(f"{where}.function.arguments must be a JSON string (or an object)", "messages")


def tools_field(f: Fields) -> list[dict] | None:
    """The tools array, each a function with a usable name and a JSON schema for its parameters."""
    tools = f.get("tools", list)
    for i, t in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise InvalidRequest(f"{where} must be an object {_TOOL_SHAPE}, got {_json_type(t)}", "tools")
        if t.get("type", "function") != "function":
            raise InvalidRequest(f"{where}.type must be 'function', got {_brief(t.get('type'))}", "tools")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise InvalidRequest(f"{where}.function must be an object {{\"name\", ...}}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise InvalidRequest(f"{where}.function.name must be 1 to 64 letters, digits, '_', '-' or '.', got "
                                 f"{_brief(name)}", "tools")
        if fn.get("description") is not None and not isinstance(fn["description"], str):
            raise InvalidRequest(f"{where}.function.description must be a string", "tools")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise InvalidRequest(f"{where}.function.parameters must be a JSON schema object", "tools")
    return tools


def _tool_choice(f: Fields) -> str | dict | None:
    """'none', 'auto', 'required' or {"type": "function", "function": {"name"}}."""
    choice = f.get("tool_choice", (str, dict), what="'none', 'auto', 'required' or an object")
    if choice is None or choice in _TOOL_CHOICES:
        return choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"] \
            and choice.get("type", "function") == "function":
        return choice
    raise InvalidRequest("'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}", "tool_choice")


def chat_request(body: dict[str, Any]) -> tuple[ChatRequest, StreamOptions]:
    """A /v1/chat/completions body as an engine ChatRequest."""
    f = Fields(body, "chat.completions")
    model = f.get("model", str)
    messages = f.get("messages", list)
    if messages is None:
        raise InvalidRequest("'messages' is required", "messages")
    if not messages:
        raise InvalidRequest("'messages' must not be empty", "messages")
    check_messages(messages)
    sampling = sampling_params(f)
    opts = _stream_options(f)
    response_format = _response_format(f)
    if f.get("logprobs", bool, False):
        opts.logprobs = True
        sampling.logprobs = f.get("top_logprobs", int, 0, lo=0, hi=20)
    else:
        f.get("top_logprobs", int)
    parallel_tool_calls = f.get("parallel_tool_calls", bool, True)
    truncation = f.get("truncation", str, "disabled")
    if truncation not in ("auto", "disabled"):
        raise InvalidRequest("'truncation' must be 'auto' or 'disabled'", "truncation")
    kwargs = dict(f.get("chat_template_kwargs", dict, {}))
    taken = sorted(kwargs.keys() & TEMPLATE_VARIABLES)
    if taken:
        raise InvalidRequest(f"'chat_template_kwargs' may not set the chat template's own variables "
                             f"({', '.join(taken)}); use the request's fields for them", "chat_template_kwargs")
    thinking = f.get("enable_thinking", bool)
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    tools = tools_field(f)
    tool_choice = _tool_choice(f)
    keep = keep_alive(f)
    f.log_ignored()
    return ChatRequest(model, messages, sampling, truncation, kwargs, tools=tools, tool_choice=tool_choice,
                       parallel_tool_calls=parallel_tool_calls, response_format=response_format,
                       keep_alive=keep), opts


def completion_request(body: dict[str, Any]) -> tuple[CompletionRequest, StreamOptions]:
    """A /v1/completions body as an engine CompletionRequest."""
    f = Fields(body, "completions")
    model = f.get("model", str)
    prompt = f.get("prompt", (str, list), what="a string, an array of token ids, or an array of one string")
    if prompt is None:
        raise InvalidRequest("'prompt' is required", "prompt")
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise InvalidRequest("'prompt' must be a string, an array of token ids, or an array of one string; "
                                 "several prompts in one request are not supported yet", "prompt")
    sampling = sampling_params(f)
    opts = _stream_options(f)
    top = f.get("logprobs", int, None, lo=0, hi=5)
    if top is not None:
        opts.logprobs = True
        sampling.logprobs = top
    echo = f.get("echo", bool, False)
    keep = keep_alive(f)
    f.log_ignored()
    return CompletionRequest(model, prompt, sampling, echo, keep_alive=keep), opts


def embedding_request(body: dict[str, Any]) -> tuple[str | None, list[str | list[int]], str, Any]:
    """(model, inputs, encoding_format, keep_alive) of a /v1/embeddings body."""
    f = Fields(body, "embeddings")
    model = f.get("model", str)
    raw = f.get("input", (str, list))
    if raw is None:
        raise InvalidRequest("'input' is required", "input")
    if isinstance(raw, str):
        inputs: list[str | list[int]] = [raw]
    elif raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        inputs = [raw]
    elif raw and all(isinstance(x, str) or (isinstance(x, list) and all(isinstance(t, int) for t in x))
                     for x in raw):
        inputs = list(raw)
    else:
        raise InvalidRequest("'input' must be a non-empty string, array of strings, or array(s) of token ids",
                             "input")
    if len(inputs) > 2048:
        raise InvalidRequest("'input' may hold at most 2048 items", "input")
    fmt = f.get("encoding_format", str, "float")
    if fmt not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    keep = keep_alive(f)
    f.log_ignored()
    return model, inputs, fmt, keep


def keep_alive(f: Fields) -> Any:
    """How long the model stays loaded once idle after this request: Ollama's "keep_alive" (seconds or a
    duration; 0: unload when done; negative: until unloaded) or LM Studio's "ttl" (seconds); KEEP when absent."""
    raw = f.get("keep_alive", (int, float, str))
    ttl = f.get("ttl", int, lo=-1)
    if raw is not None and ttl is not None:
        raise InvalidRequest("send 'keep_alive' or 'ttl', not both", "ttl")
    if raw is not None:
        return parse_keep_alive(raw)
    if ttl is not None:
        return None if ttl < 0 else float(ttl)
    return KEEP
