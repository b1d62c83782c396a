"""Request shapes declared once, as pydantic models: validation, the 400 naming the field, and the OpenAPI
document (server/routes/docs.py) all come from the same class.

A route reads its body with `parse(Model, body, route)`. Models derive from `Shape`: strict types (a string is
never coerced to a number, 1 is not true), finite numbers only, unknown fields kept and logged once per name.
`between(lo, hi)` is a bounded number whose 400 says both bounds; `refuse(sentence)` is a validator's error
that reads "'field.path' <sentence>".
"""
from __future__ import annotations

import logging
import math
import re
from typing import Annotated, Any, Iterable, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema
from pydantic_core import PydanticCustomError

from engine.errors import InvalidRequest

log = logging.getLogger("llamadesk.server")
_ignored_logged: set[str] = set()

# Accepted for compatibility but without effect here; never an error, never logged.
HARMLESS = {"user", "store", "metadata", "service_tier", "prediction", "modalities", "best_of",
            "reasoning_effort", "dimensions"}

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
    problem = not_plain_json(body, "body")
    if problem:
        problem = problem.replace("'body.", "'").replace("'body'", "the body")
        named = re.match(r"[^']*'([A-Za-z_]\w*)", problem)
        raise InvalidRequest(problem, named.group(1) if named else None)
    try:
        value = model.model_validate(body)
    except ValidationError as e:
        path, message = describe(e, body)
        raise InvalidRequest(message, re.split(r"[.\[]", path)[0] or None) from None
    log_ignored(value.model_extra or {}, route)
    return value


def log_ignored(names: Iterable[str], route: str) -> None:
    """Log, once per route and name, the fields a route accepts without reading (HARMLESS ones never)."""
    for name in sorted(set(names) - HARMLESS):
        key = f"{route}:{name}"
        if key not in _ignored_logged:
            _ignored_logged.add(key)
            log.warning("ignoring unsupported field '%s' in %s requests (logged once)", name, route)


# ---- field types whose 400 reads well ----------------------------------------------------------------

def refuse(sentence: str) -> PydanticCustomError:
    """A validator's error: the 400 says "'<field path>' <sentence>" (raise it from a validator)."""
    return PydanticCustomError("sentence", "{sentence}", {"sentence": sentence})


def between(lo: float, hi: float, kind: type = float) -> Any:
    """A number (or with kind=int, an integer) from lo to hi: the 400 names both bounds, the schema says them."""
    def check(v: Any) -> Any:
        if not lo <= v <= hi:
            raise refuse(f"must be between {lo} and {hi}, got {v}")
        return v
    return Annotated[kind, AfterValidator(check),
                     WithJsonSchema({"type": "integer" if kind is int else "number", "minimum": lo, "maximum": hi})]


NonEmpty = Annotated[str, Field(min_length=1)]


def describe(e: ValidationError, body: Any) -> tuple[str, str]:
    """The path and a sentence for the most telling error: of a union's branches, one that took the value's
    kind but refused it for another reason (a list too long) rather than one that wanted another kind there or
    inside it; else the one that got furthest into the value (the first of those as deep)."""
    errors = e.errors(include_url=False)
    paths = [_path_parts(err["loc"], body) for err in errors]
    refused = [p for err, p in zip(errors, paths) if err["type"] not in _MISMATCH]
    telling = [i for i, (err, p) in enumerate(zip(errors, paths))
               if err["type"] not in _MISMATCH or not any(p[:len(q)] == q for q in refused)]
    deepest = max(len(paths[i]) for i in telling)
    i = next(i for i in telling if len(paths[i]) == deepest)
    path = _path(paths[i])
    kinds = [_TYPE_WORDS.get(err["type"]) for err, p in zip(errors, paths) if _path(p) == path]
    if len(kinds) > 1 and all(kinds):  # every branch of a union wanted another type: name them all
        words = list(dict.fromkeys(kinds))
        return path, f"'{path}' must be {' or '.join(words)}, got {_json_type(errors[i].get('input'))}"
    return path, _sentence(path, errors[i])


_TYPE_WORDS = {"string_type": "a string", "int_type": "an integer", "float_type": "a number",
               "bool_type": "a boolean", "list_type": "an array", "dict_type": "an object",
               "model_type": "an object", "model_attributes_type": "an object", "int_from_float": "an integer"}
# errors that say only that a value is of another kind than a branch of a union takes
_MISMATCH = {*_TYPE_WORDS, "literal_error", "enum", "union_tag_invalid", "union_tag_not_found"}


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
    if kind == "sentence":
        return f"{where} {ctx['sentence']}"
    if kind in ("too_short", "string_too_short"):
        n = ctx.get("min_length")
        return f"{where} must not be empty" if n == 1 else \
            f"{where} must have at least {n} {'characters' if kind.startswith('string') else 'items'}"
    if kind in ("too_long", "string_too_long"):
        n = ctx.get("max_length")
        return f"{where} may have at most {n} {'characters' if kind.startswith('string') else 'items'}"
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
        if isinstance(node, dict) and isinstance(p, str) and p in node and not _is_tag(node, p, loc[k + 1:]):
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node):
            node = node[p]
        elif not last or not isinstance(p, str) or p in _BRANCH_LABELS or any(c in p for c in "[](),") \
                or not isinstance(node, dict):
            continue
        parts.append(p)
    return parts


_BRANCH_LABELS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "tagged-union"}


def _is_tag(node: dict, p: str, rest: tuple) -> bool:
    """Whether step p, a key of node, is a tagged union's tag instead (a text block's tag is "text", and so is
    its field): so when the next step is a field name that cannot be inside node[p] but is a key of node."""
    step = rest[0] if rest else None
    if not isinstance(step, str) or step in _BRANCH_LABELS or any(c in step for c in "[](),"):
        return False
    child = node[p]
    if isinstance(child, dict):
        return step not in child and step in node
    return True  # a field name is no step into an array or a scalar


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


# ---- what JSON can carry but the engine cannot take -------------------------------------------------

_INT64 = 2 ** 63
_SURROGATE = re.compile("[\ud800-\udfff]")


def not_plain_json(value: Any, path: str) -> str | None:
    """Why value (a body, or a field's value, nested parts included) cannot go on to the engine, or None: a
    lone surrogate cannot be encoded as UTF-8 (so not tokenized), NaN and Infinity are no JSON numbers, and no
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


def _first_surrogate(text: str) -> str:
    m = _SURROGATE.search(text)
    return f"\\u{ord(m.group()):04x} at character {m.start()}" if m else ""


# ---- the OpenAPI document's registry --------------------------------------------------------------

# (method, path) -> (request shape or None, summary); filled by @documents, read by server/routes/docs.py
DOCUMENTED: dict[tuple[str, str], tuple[type[Shape] | None, str]] = {}


def documents(method: str, path: str, summary: str, shape: type[Shape] | None = None):
    """Record a route's request shape and summary for /openapi.json (a decorator that returns the handler)."""
    def mark(handler):
        DOCUMENTED[(method.upper(), path)] = (shape, summary)
        return handler
    return mark

