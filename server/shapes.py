"""Request shapes declared once, as pydantic models: validation, the 400 naming the field, and the OpenAPI
document (server/routes/docs.py) all come from the same class.

A route reads its body with `parse(Model, body, route)`. Models derive from `Shape`: strict types (a string is
never coerced to a number, 1 is not true), finite numbers only, unknown fields kept and logged once per name.
"""
from __future__ import annotations

import logging
import re
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from engine.errors import InvalidRequest
from server.schemas import _HARMLESS, _not_plain_json

log = logging.getLogger("llamadesk.server")
_ignored_logged: set[str] = set()

M = TypeVar("M", bound="Shape")


class Shape(BaseModel):
    """Base of every request shape."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, populate_by_name=True)


class Closed(Shape):
    """A nested object whose unknown fields are an error (a typo in a tool definition should not pass)."""

    model_config = ConfigDict(extra="forbid")


def parse(model: type[M], body: dict[str, Any], route: str) -> M:
    """body validated as model; InvalidRequest naming the first offending field (its path, e.g.
    'input[2].content') otherwise. Lone surrogates, NaN and integers beyond 64 bits are refused anywhere."""
    problem = _not_plain_json(body, "body")
    if problem:
        problem = problem.replace("'body.", "'").replace("'body'", "the body")
        named = re.match(r"[^']*'([A-Za-z_]\w*)", problem)
        raise InvalidRequest(problem, named.group(1) if named else None)
    try:
        value = model.model_validate(body)
    except ValidationError as e:
        path, message = describe(e, body)
        raise InvalidRequest(message, re.split(r"[.\[]", path)[0] or None) from None
    extra = sorted((value.model_extra or {}).keys() - _HARMLESS)
    for name in extra:
        key = f"{route}:{name}"
        if key not in _ignored_logged:
            _ignored_logged.add(key)
            log.warning("ignoring unsupported field '%s' in %s requests (logged once)", name, route)
    return value


def describe(e: ValidationError, body: Any) -> tuple[str, str]:
    """The path and a sentence for the most telling error: of a union's branches, the one that got furthest
    (the first of those as deep)."""
    errors = e.errors(include_url=False)
    paths = [_path_parts(err["loc"], body) for err in errors]
    deepest = max(len(p) for p in paths)
    i = next(i for i, p in enumerate(paths) if len(p) == deepest)
    path = _path(paths[i])
    kinds = [_TYPE_WORDS.get(err["type"]) for err, p in zip(errors, paths) if _path(p) == path]
    if len(kinds) > 1 and all(kinds):  # every branch of a union wanted another type: name them all
        words = list(dict.fromkeys(kinds))
        return path, f"'{path}' must be {' or '.join(words)}, got {_json_type(errors[i].get('input'))}"
    return path, _sentence(path, errors[i])


_TYPE_WORDS = {"string_type": "a string", "int_type": "an integer", "float_type": "a number",
               "bool_type": "a boolean", "list_type": "an array", "dict_type": "an object",
               "model_type": "an object", "model_attributes_type": "an object", "int_from_float": "an integer"}


def _sentence(path: str, err: dict) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    where = f"'{path}'" if path else "the body"
    if kind == "missing":
        return f"{where} is required"
    if kind == "extra_forbidden":
        return f"{where} is not a known field here"
    if kind in _TYPE_WORDS:
        return f"{where} must be {_TYPE_WORDS[kind]}, got {_json_type(got)}"
    if kind in ("literal_error", "enum"):
        return f"{where} must be {ctx.get('expected', 'one of the allowed values')}, got {_brief(got)}"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        words = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}
        bound = next(iter(ctx.values()), "?")
        return f"{where} must be {words[kind]} {bound}, got {got}"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        return f"{where}: {err['msg'][0].lower()}{err['msg'][1:]}"
    if kind == "union_tag_invalid":
        return f"{where}: unknown type {ctx.get('tag')!r} (expected one of {ctx.get('expected_tags')})"
    if kind == "union_tag_not_found":
        return f"{where} needs a '{ctx.get('discriminator', 'type').strip(chr(39))}' field"
    if kind == "value_error":  # a validator's own ValueError: its message is the sentence
        return f"{where}: {str(ctx.get('error', err['msg']))}"
    msg = err["msg"]
    return f"{where}: {msg[0].lower()}{msg[1:]}"


def _path_parts(loc: tuple, body: Any) -> list:
    """The loc without pydantic's union-branch labels ('str', 'list[Item]', a tagged union's tag): the loc is
    walked through the body, and a step that is no key or index of it is a label (unless it is the last: a
    missing field's name)."""
    parts, node = [], body
    for k, p in enumerate(loc):
        last = k == len(loc) - 1
        if isinstance(node, dict) and isinstance(p, str) and p in node:
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            node = node[p]
        elif not last or not isinstance(p, str) or p in _BRANCH_LABELS or any(c in p for c in "[](),") \
                or not isinstance(node, dict):
            continue
        parts.append(p)
    return parts


_BRANCH_LABELS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "tagged-union"}


def _path(parts: list) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _brief(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


# ---- the OpenAPI document's registry --------------------------------------------------------------

# (method, path) -> (request shape or None, summary); filled by @documents, read by server/routes/docs.py
DOCUMENTED: dict[tuple[str, str], tuple[type[Shape] | None, str]] = {}


def documents(method: str, path: str, summary: str, shape: type[Shape] | None = None):
    """Record a route's request shape and summary for /openapi.json (a decorator that returns the handler)."""
    def mark(handler):
        DOCUMENTED[(method.upper(), path)] = (shape, summary)
        return handler
    return mark

