"""Property-based fuzzing of every JSON and multipart route with hypothesis: however bad the request
(wrong types, NaN and Infinity, numbers past 64 bits, lone surrogates, nested junk, broken bodies), the
answer is a 2xx or an OpenAI-shaped 4xx, never a 5xx or a hang, no request keeps a stream's place, and
the server answers a normal chat afterwards.

The strategies follow the request schemas: each field gets plausible values most of the time and junk
otherwise. Bounded and deterministic (derandomize, no example database): a few hundred examples in all,
generations of at most 8 tokens on the tiny model. The server is this module's own (its roster can be
unloaded and reloaded without touching other modules), with its config, models dir and catalog mirror in
a temporary directory, so a saved config or a started download stays there. /restart and /shutdown are
never sent.
"""
from __future__ import annotations

import http.client
import io
import json
import math
import struct
import time
import urllib.request
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from engine.chat import ROLES
from tests.conftest import TEMPLATES, LiveServer

# ---- the server -----------------------------------------------------------------------------------

DEFAULT = "fuzz-tiny"
SPARE = "fuzz-spare"  # the one model generated unload/reload bodies may name; put back when unloaded
CHAT_MODELS = [DEFAULT, "fuzz-hermes", "fuzz-gemma", "fuzz-think", "fuzz-smol"]
SERVED = [*CHAT_MODELS, "fuzz-minilm", SPARE]


@pytest.fixture(scope="module")
def server(assets, tmp_path_factory):
    """The tiny model under several chat templates, SmolLM2 and MiniLM, and VAD, ASR and TTS; generations
    default to 8 tokens; the catalog mirror is a closed port, so no download reaches the network."""
    tmp = tmp_path_factory.mktemp("fuzz")
    tiny = assets["tiny"]

    def model(name: str, path: Path, template: str | None = None, default: bool = False) -> str:
        return (f'[[models]]\nname = "{name}"\npath = "{path}"\nctx = 2048\nstreams = 2\n'
                + (f'chat_template = "{TEMPLATES / template}"\n' if template else "")
                + ("default = true\n" if default else ""))
    toml = (f'models_dir = "{tmp / "models"}"\ncatalog_mirror = "http://127.0.0.1:9"\n\n'
            + "\n".join([model(DEFAULT, tiny, default=True), model("fuzz-hermes", tiny, "hermes.jinja"),
                         model("fuzz-gemma", tiny, "gemma.jinja"), model("fuzz-think", tiny, "chatml_think.jinja"),
                         model("fuzz-smol", assets["smollm2"]), model("fuzz-minilm", assets["minilm"]),
                         model(SPARE, tiny)]))
    srv = LiveServer(["--max-tokens", "8", "--vad", str(assets["vad"]), "--asr", str(assets["whisper"]),
                      "--tts", str(assets["piper"]), "--access-log", "off"], toml, tmp)
    srv.tmp = tmp
    srv.tiny = tiny
    (tmp / "junk.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    (tmp / "truncated.gguf").write_bytes(tiny.read_bytes()[:4096])
    (tmp / "empty.gguf").write_bytes(b"")
    yield srv
    srv.stop()


# ---- HTTP ---------------------------------------------------------------------------------------

@dataclass
class Reply:
    status: int
    content_type: str
    body: bytes


def send(srv, path: str, body: bytes, content_type: str | None, timeout: float = 60) -> Reply:
    """POST exactly these bytes with exactly this Content-Type (none when None); the whole reply is read,
    so a stream that never ends fails the example by timeout."""
    host, port = srv.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        headers = {"Content-Length": str(len(body))}
        if content_type is not None:
            headers["Content-Type"] = content_type
        conn.request("POST", path, body=body, headers=headers)
        r = conn.getresponse()
        return Reply(r.status, r.getheader("Content-Type", ""), r.read())
    finally:
        conn.close()


def check_error(err: Any) -> None:
    """The OpenAI error object: message and type strings, param and code strings or null."""
    assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err


def check(r: Reply, path: str) -> Reply:
    """The property: 2xx or 4xx (never 5xx); every error, in a body or a stream, in the OpenAI shape."""
    assert r.status < 500, f"{path} -> {r.status}: {r.body[:500]!r}"
    assert 200 <= r.status < 500, (r.status, r.body[:300])
    if r.status >= 400:
        check_error(json.loads(r.body)["error"])
    elif r.content_type.startswith("application/json"):
        json.loads(r.body)
    elif r.content_type.startswith("text/event-stream"):
        for line in r.body.split(b"\n"):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                data = json.loads(line[6:])
                if "error" in data:  # an engine failure after the stream started: typed, never a crash
                    check_error(data["error"])
                    assert data["error"]["type"] != "server_error", data
    return r


def fuzz(srv, path: str, raw: "Raw") -> Reply:
    """Send a generated request and check the property; the outcome is counted for
    --hypothesis-show-statistics (status and the error's first words), to see what the strategies reach."""
    r = check(send(srv, path, raw.data, raw.content_type), path)
    error = json.loads(r.body)["error"]["message"][:40] if r.status >= 400 else ""
    event(f"{path} {r.status} {error}")
    return r


def post_json(srv, path: str, obj: Any) -> Reply:
    return send(srv, path, json.dumps(obj).encode(), "application/json")


def idle(srv) -> None:
    """No stream is left running or queued (a request that failed kept no place)."""
    deadline = time.monotonic() + 30
    while True:
        stats = srv.get("/v1/stats")
        if stats["active_streams"] == 0 and stats["queued_streams"] == 0:
            return
        assert time.monotonic() < deadline, f"streams left behind: {stats['active_streams']} active, " \
                                            f"{stats['queued_streams']} queued"
        time.sleep(0.05)


# ---- strategies ---------------------------------------------------------------------------------

SETTINGS = settings(derandomize=True, database=None, deadline=30_000, print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def bounded(n: int) -> settings:
    """SETTINGS with at most n generated examples."""
    return settings(SETTINGS, max_examples=n)

def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, each as often as its weight says (shrinking towards the first)."""
    return st.sampled_from([s for w, s in choices for _ in range(w)]).flatmap(lambda s: s)


# Python's json reads NaN, Infinity and -Infinity and writes them back the same way (json.dumps allow_nan).
NUMBERS = st.one_of(
    st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -2**63 - 1, 2**64, 10**30, 10**400, -10**400, 1e308, -1e308,
                     5e-324, -0.0, math.nan, math.inf, -math.inf]))
SURROGATES = st.sampled_from(["\ud800", "x\udfff", "\udbff", "ok \udc00 ok", "\ud83d\ude00", "\ud83d"])
SPECIAL_TEXT = st.sampled_from(["", " ", "\x00", "a\x00b", "<|im_start|>", "<|im_end|>", "<s>", "</s>",
                                "<tool_call>", "</think>", "[TOOL_CALLS]", "{{ 7 * 7 }}", "{% for %}",
                                "\u202e\u2066", "🙂" * 5, "x" * 300, "../../etc/passwd", "%s%n", "\r\n\r\n"])
TEXT = weighted((8, st.text(max_size=12)), (1, SURROGATES), (2, SPECIAL_TEXT))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JUNK = st.recursive(SCALARS, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(TEXT, c, max_size=4)),
                    max_leaves=8)


def field(*plausible: st.SearchStrategy) -> st.SearchStrategy:
    """A field's value: one of the plausible strategies nine times in ten, junk otherwise."""
    return weighted((9, st.one_of(*plausible)), (1, JUNK))


NAME = weighted((6, st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)),
                (2, st.sampled_from(["get_weather", "f", "lookup-2", "a.b"])),
                (1, st.sampled_from(["x" * 65, "bad name", '"q"', "é", "a\\b", "f(", ""])))
SMALL = st.integers(0, 8)
COUNT = st.one_of(st.integers(0, 6), st.sampled_from([4096, 4097, 10**6, 10**9, -1]))
PATTERNS = st.sampled_from(["^a+$", "^[0-9]{2,5}$", "^(a{1000}){1000}$", "(", "^x{5000}$", "^.*$", "[a-z]"])
LEAF_SCHEMA = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])},
    optional={"minLength": COUNT, "maxLength": COUNT, "pattern": PATTERNS, "minimum": NUMBERS,
              "maximum": NUMBERS, "enum": st.lists(st.one_of(st.text(max_size=5), st.integers(-9, 9)), max_size=3),
              "$ref": st.sampled_from(["#", "#/defs/x", "https://example.com/schema.json", "file:///etc/passwd"])})
SCHEMA = st.recursive(LEAF_SCHEMA, lambda c: st.one_of(
    st.fixed_dictionaries({"type": st.just("object")},
                          optional={"properties": st.dictionaries(NAME, c, max_size=3),
                                    "required": st.lists(NAME, max_size=2), "additionalProperties": st.booleans(),
                                    "minProperties": COUNT}),
    st.fixed_dictionaries({"type": st.just("array"), "items": c}, optional={"minItems": COUNT, "maxItems": COUNT}),
    st.fixed_dictionaries({"anyOf": st.lists(c, min_size=1, max_size=3)})), max_leaves=5)
ARGUMENTS = st.one_of(st.just('{"city": "Paris"}'), st.just("{broken"), st.just("[1]"), st.just('"s"'),
                      st.dictionaries(st.text(max_size=4), SCALARS, max_size=2), TEXT)
TOOL_CALL = st.fixed_dictionaries({}, optional={
    "id": field(st.text(max_size=8)), "type": field(st.just("function")),
    "function": field(st.fixed_dictionaries({}, optional={"name": field(NAME), "arguments": field(ARGUMENTS)}))})
PART = st.fixed_dictionaries({"type": field(st.sampled_from(["text", "image_url", "input_audio"]))},
                             optional={"text": field(TEXT), "image_url": JUNK})
MESSAGE = st.fixed_dictionaries({"role": field(st.sampled_from(ROLES))}, optional={
    "content": field(TEXT, st.lists(PART, max_size=3)), "name": field(st.text(max_size=6)),
    "tool_calls": field(st.lists(TOOL_CALL, max_size=2)), "tool_call_id": field(st.text(max_size=6)),
    "reasoning_content": field(TEXT)})
SIMPLE_SCHEMA = st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(
    NAME, st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "boolean"},
                           {"type": "string", "enum": ["a", "b"]}]), max_size=3)})
TOOL = st.fixed_dictionaries({"type": field(st.just("function")), "function": field(st.fixed_dictionaries(
    {"name": field(NAME)}, optional={"description": field(TEXT),
                                     "parameters": field(weighted((3, SIMPLE_SCHEMA), (2, SCHEMA)))}))})
TOOL_CHOICE = field(st.sampled_from(["none", "auto", "required"]),
                    st.fixed_dictionaries({"type": field(st.just("function")),
                                           "function": field(st.fixed_dictionaries({"name": field(NAME)}))}))
RESPONSE_FORMAT = field(st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
                        st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": field(
                            st.fixed_dictionaries({"name": st.text(max_size=5), "schema": field(SCHEMA)}))}))
STOP = field(TEXT, st.lists(TEXT, max_size=3))
LOGIT_BIAS = field(st.dictionaries(st.one_of(st.integers(-3, 300).map(str), TEXT),
                                   field(st.floats(-100, 100), st.integers(-100, 100)), max_size=3))
SAMPLING = {
    "max_tokens": field(st.integers(1, 8)), "max_completion_tokens": field(st.integers(1, 8)),
    "temperature": field(st.floats(0, 2)), "top_p": field(st.floats(0, 1)), "top_k": field(st.integers(0, 100)),
    "min_p": field(st.floats(0, 1)), "repeat_penalty": field(st.floats(0.01, 10)),
    "presence_penalty": field(st.floats(-2, 2)), "frequency_penalty": field(st.floats(-2, 2)),
    "seed": field(st.integers(-2**63, 2**63 - 1)), "stop": STOP, "logit_bias": LOGIT_BIAS,
    "ignore_eos": field(st.booleans()), "n": field(st.integers(1, 3)), "stream": field(st.booleans()),
    "stream_options": field(st.fixed_dictionaries({"include_usage": field(st.booleans())})),
}
OPTIONAL_JUNK = st.dictionaries(TEXT, JUNK, max_size=2)  # fields no route reads


def body_of(required: dict, optional: dict, most: int = 4) -> st.SearchStrategy:
    """A JSON object with the required fields, up to `most` of the optional ones and maybe unknown ones (few
    fields at a time, so a body often gets past the first check and reaches the deeper ones)."""
    optional = {k: v for k, v in optional.items() if k not in required}
    chosen = st.lists(st.sampled_from(sorted(optional)), max_size=most, unique=True) if optional else st.just([])
    known = chosen.flatmap(lambda keys: st.fixed_dictionaries({**required, **{k: optional[k] for k in keys}}))
    return st.builds(lambda known, extra: {**extra, **known}, known, weighted((4, st.just({})), (1, OPTIONAL_JUNK)))


def cheap(body: Any) -> Any:
    """Generation kept small: any max_tokens-like count above 8 (and below what the context refuses anyway)
    becomes 8, n at most 3."""
    if isinstance(body, dict):
        for k in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            v = body.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and 8 < v <= 2048:
                body[k] = 8
        v = body.get("n")
        if isinstance(v, int) and not isinstance(v, bool) and 3 < v <= 8:
            body["n"] = 3
    return body


@dataclass
class Raw:
    """A request body as sent: bytes and Content-Type."""

    data: bytes
    content_type: str | None = "application/json"

    def __repr__(self) -> str:
        return f"Raw({self.data[:400]!r}, {self.content_type!r})"


def J(obj: Any) -> Raw:
    return Raw(json.dumps(obj).encode())


def _mangle(data: bytes, how: int, at: int) -> bytes:
    at %= max(len(data), 1)
    return [data[:at],  # truncated
            data[:at] + b"\xff\xfe" + data[at:],  # invalid UTF-8
            data[:at] + b"\xed\xa0\x80" + data[at:],  # a surrogate encoded as UTF-8 (CESU), invalid
            b"\xef\xbb\xbf" + data,  # a byte-order mark
            data + b" garbage"][how]


def raw_json(bodies: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly the bodies as JSON; sometimes mangled bytes, or a top-level value that is no object."""
    as_json = bodies.map(lambda b: J(cheap(b)))
    mangled = st.builds(lambda b, how, at: Raw(_mangle(json.dumps(b).encode(), how, at)), bodies,
                        st.integers(0, 4), st.integers(0, 10**6))
    others = st.one_of(JUNK.map(J), st.sampled_from([Raw(b""), Raw(b"null"), Raw(b"[]"), Raw(b"{}"), Raw(b"NaN"),
                                                     Raw(b"{" * 100 + b"}" * 100), Raw(b'{"a": 1, "a": 2}')]))
    return weighted((18, as_json), (1, mangled), (1, others))


PLAIN_MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                                  "content": st.text(max_size=20)}), min_size=1, max_size=3)
CHAT_MODEL = field(weighted((8, st.sampled_from(["", *CHAT_MODELS])), (1, TEXT)))
CHAT_BASE = {"messages": field(PLAIN_MESSAGES, st.lists(MESSAGE, min_size=1, max_size=4)),
             "max_tokens": SAMPLING["max_tokens"], "model": CHAT_MODEL}
TOOL_BODY = body_of({**CHAT_BASE, "tools": field(st.lists(TOOL, min_size=1, max_size=2))}, {
    "tool_choice": TOOL_CHOICE, "parallel_tool_calls": field(st.booleans()), "stream": SAMPLING["stream"],
    "n": SAMPLING["n"], "temperature": SAMPLING["temperature"], "response_format": RESPONSE_FORMAT}, most=3)
CHAT_BODY = weighted((3, TOOL_BODY), (5, body_of(CHAT_BASE, {**SAMPLING,
    "tools": field(st.lists(TOOL, max_size=2)), "tool_choice": TOOL_CHOICE, "parallel_tool_calls": field(st.booleans()),
    "response_format": RESPONSE_FORMAT, "logprobs": field(st.booleans()), "top_logprobs": field(st.integers(0, 20)),
    "truncation": field(st.sampled_from(["auto", "disabled"])),
    "chat_template_kwargs": field(st.dictionaries(st.one_of(st.sampled_from(
        ["enable_thinking", "documents", "custom", "messages", "tools", "bos_token", "add_generation_prompt",
         "raise_exception"]), TEXT), JUNK, max_size=3)),
    "enable_thinking": field(st.booleans()), "user": field(st.text(max_size=5)), "metadata": JUNK})))
TOKEN_IDS = st.lists(st.integers(-3, 300), max_size=8)  # the tiny model's vocabulary is 269 tokens
PROMPT = weighted((4, st.text(min_size=1, max_size=20)), (1, TEXT), (1, TOKEN_IDS), (1, st.lists(TEXT, max_size=2)),
                  (1, st.lists(TOKEN_IDS, max_size=2)))
COMPLETION_BODY = body_of({"prompt": field(PROMPT), "max_tokens": SAMPLING["max_tokens"]},
                          {"model": field(st.sampled_from(["", DEFAULT, "fuzz-smol"]), TEXT), **SAMPLING,
                           "echo": field(st.booleans()), "logprobs": field(st.integers(0, 5)), "suffix": JUNK,
                           "best_of": JUNK})
EMBEDDING_INPUT = weighted((3, st.text(min_size=1, max_size=20)),
                           (2, st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=3)), (1, TEXT),
                           (1, st.lists(TEXT, max_size=3)), (1, TOKEN_IDS), (1, st.lists(TOKEN_IDS, max_size=2)))
EMBEDDING_BODY = body_of({"input": field(EMBEDDING_INPUT)},
                         {"model": field(st.sampled_from(["", DEFAULT, "fuzz-minilm"]), TEXT),
                          "encoding_format": field(st.sampled_from(["float", "base64"])), "dimensions": JUNK,
                          "user": JUNK})
SPEECH_BODY = body_of({"input": field(st.sampled_from(["Hi.", "One. Two.", "1 2 3"]), TEXT)}, {
    "model": field(st.sampled_from(["tts-1", "gpt-4o-mini-tts", ""]), TEXT),
    "voice": field(st.sampled_from(["alloy", "joe", 0, 1, -1, 10**6, {"id": "joe"}, {"id": 5}, {}]), TEXT),
    "speed": field(st.floats(0.1, 5)), "instructions": field(TEXT),
    "response_format": field(st.sampled_from(["wav", "pcm", "flac", "mp3", "opus", "aac", "ogg"])),
    "stream_format": field(st.sampled_from(["audio", "sse"]))})


def _examples(*bodies: Any):
    """@example for each body (explicit reproducers run before the generated ones)."""
    def wrap(fn):
        for b in reversed(bodies):
            fn = example(raw=b if isinstance(b, Raw) else J(b))(fn)
        return fn
    return wrap


HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
BAD_CALLS = [[1], "x", [{"id": "1"}], [{"id": "a"}], [None], [{"function": {}}], [{"function": "f"}], {"a": 1}]
REPRODUCERS = [
    Raw(b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": NaN}'),
    Raw(b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "top_p": Infinity}'),
    Raw(b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "min_p": -Infinity}'),
    Raw(b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 1' + b"0" * 400 + b"}"),
    {"messages": HI, "max_tokens": 2, "tools": ["x"]}, {"messages": HI, "max_tokens": 2, "tools": [1]},
    {"messages": HI, "max_tokens": 2, "tools": [{"type": "function", "function": {}}]},
    *[{"messages": [*HI, {"role": "assistant", "tool_calls": c}, *HI], "max_tokens": 2, "model": m}
      for c in BAD_CALLS for m in (DEFAULT, "fuzz-gemma")],
    {"messages": [*HI, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "zz"}}]}, *HI],
     "max_tokens": 2, "model": "fuzz-gemma"},
    {"messages": HI, "max_tokens": 2, "tools": TOOLS, "tool_choice": {"type": "function", "function": "f"}},
    {"messages": HI, "max_tokens": 2, "chat_template_kwargs": {"messages": 5}},
    {"messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 2},
    {"messages": HI, "max_tokens": 2, "stop": ["\udfff"]},
    {"messages": HI, "max_tokens": 2,
     "tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]},
    {"messages": HI, "max_tokens": 2, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "minLength": 10**9}}}},
    {"messages": HI, "max_tokens": 2, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "array", "maxItems": 10**7}}}}}]},
]


# ---- JSON routes ----------------------------------------------------------------------------------

@bounded(160)
@given(raw=raw_json(CHAT_BODY))
@_examples(*REPRODUCERS)
def test_fuzz_chat_completions(server, raw):
    fuzz(server, "/v1/chat/completions", raw)
    idle(server)


@bounded(60)
@given(raw=raw_json(COMPLETION_BODY))
@_examples({"prompt": "\ud800", "max_tokens": 2}, {"prompt": ["\udc00"], "max_tokens": 2},
           Raw(b'{"prompt": "hi", "max_tokens": 2, "temperature": NaN}'), {"prompt": [10**30], "max_tokens": 2})
def test_fuzz_completions(server, raw):
    fuzz(server, "/v1/completions", raw)
    idle(server)


@bounded(50)
@given(raw=raw_json(EMBEDDING_BODY))
@_examples({"input": "\ud800"}, {"input": ["ok", "\udfff"]}, {"input": [[2**64]]}, {"input": [True]})
def test_fuzz_embeddings(server, raw):
    fuzz(server, "/v1/embeddings", raw)


@bounded(40)
@given(raw=raw_json(SPEECH_BODY))
@_examples({"input": "\ud800 hi", "voice": "alloy"}, Raw(b'{"input": "Hi.", "voice": "alloy", "speed": NaN}'),
           {"input": "Hi.", "voice": 10**30})
def test_fuzz_speech(server, raw):
    fuzz(server, "/v1/audio/speech", raw)


def _paths(srv) -> st.SearchStrategy:
    """Model file paths: none, text, directories, files that are no GGUF, and the real tiny model."""
    return field(st.sampled_from([str(srv.tmp / "junk.gguf"), str(srv.tmp / "truncated.gguf"),
                                  str(srv.tmp / "empty.gguf"), str(srv.tmp), "/", ".", "/nonexistent/x.gguf",
                                  "/dev/null", "~", "", str(srv.tiny), "/tmp/" + "a" * 5000]), TEXT)


# ctx, streams and chunk in or just out of the server's bounds; large in-bound values would really
# allocate (a 4M-token KV cache), so junk integers stay out of them.
SIZES = {"ctx": st.one_of(st.integers(64, 4096), st.integers(-10, 63), st.integers(2**22 + 1, 2**70)),
         "streams": st.one_of(st.integers(1, 4), st.integers(-10, 0), st.integers(65, 2**70)),
         "chunk": st.one_of(st.integers(16, 512), st.integers(-10, 15), st.integers(2**31, 2**70))}
SIZE_JUNK = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), TEXT, st.lists(SMALL, max_size=2),
                      st.just(10**400))


def _size(name: str) -> st.SearchStrategy:
    return st.one_of(SIZES[name], SIZES[name], SIZE_JUNK)


def _control_requests(srv) -> st.SearchStrategy:
    names = st.one_of(st.sampled_from([SPARE, "", "nope"]), TEXT, JUNK)
    kv = field(st.sampled_from(["f16", "q8_0", "q4_0", "f32", "bf16", "int3"]))
    load = body_of({"path": _paths(srv)}, {"name": field(st.sampled_from(["fuzz-new", SPARE, DEFAULT]), TEXT),
                                           "ctx": _size("ctx"), "streams": _size("streams"), "chunk": _size("chunk"),
                                           "kv_dtype": kv, "chat_template": field(st.sampled_from(
                                               [str(TEMPLATES / "hermes.jinja"), str(srv.tmp / "junk.gguf"), "/"]),
                                               TEXT), "default": field(st.booleans())})
    reload = body_of({"model": names}, {"ctx": _size("ctx"), "streams": _size("streams"),
                                        "chunk": _size("chunk"), "kv_dtype": kv})
    by_name = body_of({"model": names}, {})
    activate = body_of({"model": st.one_of(st.sampled_from(SERVED), TEXT, JUNK)}, {})
    option_names = ["ctx", "streams", "max_tokens", "threads", "chunk", "kv_dtype", "gpu", "log_level", "host",
                    "port", "api_key", "cors_origins", "allowed_hosts", "insecure_no_key", "access_log",
                    "max_json_mb", "models_dir", "config", "no_gui", "nonsense"]
    config = body_of({}, {"values": field(st.dictionaries(st.one_of(st.sampled_from(option_names), TEXT),
                                                          field(st.integers(-5, 10**5), st.text(max_size=8),
                                                                st.booleans()), max_size=3)),
                          "save": field(st.booleans())})
    return st.one_of(st.tuples(st.just("/v1/models/load"), raw_json(load)),
                     st.tuples(st.just("/v1/models/reload"), raw_json(reload)),
                     st.tuples(st.just("/v1/models/unload"), raw_json(by_name)),
                     st.tuples(st.just("/v1/models/activate"), raw_json(activate)),
                     st.tuples(st.just("/config"), raw_json(config)))


def _restore_roster(srv, path: str, r: Reply) -> None:
    """Undo what a generated control request really did: a model it loaded goes, the spare comes back, the
    default is the tiny model again."""
    if r.status == 200 and path == "/v1/models/load":
        loaded = json.loads(r.body)["id"]
        if loaded not in SERVED:
            assert post_json(srv, "/v1/models/unload", {"model": loaded}).status == 200
    served = {m["id"] for m in srv.get("/v1/models")["data"]}
    assert set(SERVED) - {SPARE} <= served, f"{path} unloaded a model it may not name"
    if SPARE not in served:
        r = post_json(srv, "/v1/models/load", {"path": str(srv.tiny), "name": SPARE, "ctx": 2048, "streams": 2})
        assert r.status == 200, r.body
    if srv.service.roster.default_id != DEFAULT:
        assert post_json(srv, "/v1/models/activate", {"model": DEFAULT}).status == 200


def test_fuzz_control_routes(server):
    """Model load / reload / unload / activate and /config: never a 5xx; the roster is put back after each."""
    @bounded(80)
    @given(req=_control_requests(server))
    @example(req=("/v1/models/reload", J({"model": SPARE, "ctx": 10**20})))
    @example(req=("/v1/models/load", J({"path": "/tmp/x\x00y"})))
    @example(req=("/v1/models/load", J({"path": str(server.tiny), "name": "\ud800"})))
    @example(req=("/config", Raw(b'{"values": {"ctx": NaN}}')))
    def run(req):
        path, raw = req
        r = fuzz(server, path, raw)
        _restore_roster(server, path, r)
    run()
    idle(server)


def _catalog_requests(srv) -> st.SearchStrategy:
    entries = [e["name"] for e in srv.get("/catalog")["entries"]]
    names = field(st.sampled_from(entries), TEXT)
    by_name = body_of({"name": names}, {"tower": field(st.sampled_from(entries), TEXT)})
    importing = body_of({"path": _paths(srv)}, {})
    return st.one_of(st.tuples(st.sampled_from(["/catalog/download", "/catalog/cancel", "/catalog/serve"]),
                               raw_json(by_name)),
                     st.tuples(st.just("/catalog/import"), raw_json(importing)))


def test_fuzz_catalog_routes(server):
    """Download (to a closed port), cancel, serve and import: never a 5xx."""
    @bounded(45)
    @given(req=_catalog_requests(server))
    @example(req=("/catalog/download", J({"name": "\ud800"})))
    @example(req=("/catalog/import", J({"path": str(server.tmp / "junk.gguf")})))
    def run(req):
        path, raw = req
        fuzz(server, path, raw)
    run()
    for d in (e["download"] for e in server.get("/catalog")["entries"]):
        if d and d.get("state") in ("queued", "running"):
            post_json(server, "/catalog/cancel", {"name": d["name"]})
    idle(server)


UTILITY_BODIES = st.one_of(
    st.tuples(st.just("/tokenize"), raw_json(body_of({"content": field(TEXT)}, {
        "add_special": field(st.booleans()), "parse_special": field(st.booleans()),
        "with_pieces": field(st.booleans()), "model": field(st.sampled_from(["", DEFAULT, "fuzz-minilm"]), TEXT)}))),
    st.tuples(st.just("/detokenize"), raw_json(body_of({"tokens": field(TOKEN_IDS)}, {
        "model": field(st.sampled_from(["", DEFAULT, "fuzz-minilm"]), TEXT)}))),
    st.tuples(st.just("/apply-template"), raw_json(CHAT_BODY)),
    st.tuples(st.just("/infill"), raw_json(body_of({"input_prefix": field(TEXT)}, {
        "input_suffix": field(TEXT), "prompt": field(TEXT), "n_predict": field(st.integers(-1, 4)),
        "stream": field(st.booleans()), "model": field(st.sampled_from(["", DEFAULT]), TEXT), **SAMPLING}))))


@bounded(40)
@given(req=UTILITY_BODIES)
@example(req=("/tokenize", J({"content": "\ud800"})))
@example(req=("/detokenize", J({"tokens": [2**70]})))
@example(req=("/apply-template", J({"messages": [{"role": "user", "content": "hi"}], "tools": ["x"]})))
def test_fuzz_utility_routes(server, req):
    path, raw = req
    fuzz(server, path, raw)


OLLAMA_OPTIONS = st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "min_p", "num_predict", "stop",
                                                 "seed", "repeat_penalty", "repeat_last_n", "presence_penalty",
                                                 "frequency_penalty", "num_ctx", "mirostat"]),
                                 st.one_of(st.integers(-2, 5), st.floats(allow_nan=True), TEXT, JUNK), max_size=4)
OLLAMA_MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                                                  "content": TEXT}, optional={"images": JUNK, "tool_calls": JUNK,
                                                                              "thinking": TEXT}), max_size=3)
OLLAMA_BODIES = st.one_of(
    st.tuples(st.just("/api/chat"), raw_json(body_of({"model": field(st.sampled_from([DEFAULT, "nope"]), TEXT)}, {
        "messages": field(OLLAMA_MESSAGES), "stream": field(st.booleans()), "options": field(OLLAMA_OPTIONS),
        "format": field(st.sampled_from(["json", "", "yaml", {"type": "object"}])), "think": field(st.booleans()),
        "tools": field(st.lists(TOOL, max_size=1))}))),
    st.tuples(st.just("/api/generate"), raw_json(body_of({"model": field(st.sampled_from([DEFAULT]), TEXT)}, {
        "prompt": field(TEXT), "system": field(TEXT), "raw": field(st.booleans()), "stream": field(st.booleans()),
        "options": field(OLLAMA_OPTIONS), "format": field(st.sampled_from(["json", {"type": "object"}]))}))),
    st.tuples(st.just("/api/embed"), raw_json(body_of({"model": field(st.sampled_from(["fuzz-minilm", DEFAULT]))}, {
        "input": field(EMBEDDING_INPUT)}))),
    st.tuples(st.just("/api/show"), raw_json(body_of({}, {"model": field(st.sampled_from([DEFAULT, "nope"]), TEXT)}))))


@bounded(40)
@given(req=OLLAMA_BODIES)
@example(req=("/api/chat", Raw(b'{"model": "fuzz-tiny", "messages": [{"role": "user", "content": "hi"}], '
                             b'"options": {"temperature": NaN}}')))
@example(req=("/api/chat", J({"model": "fuzz-tiny", "messages": [{"role": "user", "content": "hi",
                                                                  "tool_calls": [{"function": 5}]}]})))
def test_fuzz_ollama_routes(server, req):
    """Never a 5xx; errors in Ollama's shape {"error": "..."}, also as the last line of a stream."""
    path, raw = req
    r = send(server, path, raw.data, raw.content_type)
    assert 200 <= r.status < 500, (path, r.status, r.body[:300])
    if r.status >= 400:
        assert isinstance(json.loads(r.body)["error"], str)
    elif r.content_type.startswith("application/x-ndjson"):
        lines = [json.loads(x) for x in r.body.split(b"\n") if x.strip()]
        assert lines and (lines[-1].get("done") or isinstance(lines[-1].get("error"), str)), lines[-1:]
    idle(server)


# Model management: names that are no Hugging Face name (a pull of one would reach for the real hub), sources that
# are served models, and what the tests below may create; each created entry is deleted afterwards.
LOCAL_NAME = st.one_of(st.sampled_from(["nope", "fuzz-made", "fuzz-made:latest", "voice", ""]),
                       TEXT.filter(lambda t: "/" not in t), st.none(), st.booleans(), NUMBERS,
                       st.lists(SMALL, max_size=2))
JINJA = st.sampled_from(["{% for m in messages %}{{ m.content }}{% endfor %}", "{{ .Prompt }}", "{% if %}",
                         "{{ raise_exception('no') }}", ""])
OLLAMA_MANAGEMENT = st.one_of(
    st.tuples(st.just("/api/pull"), raw_json(body_of({"model": LOCAL_NAME}, {
        "stream": field(st.booleans()), "insecure": field(st.booleans())}))),
    st.tuples(st.just("/api/copy"), raw_json(body_of({"source": field(st.sampled_from([DEFAULT, "nope"]), TEXT)}, {
        "destination": LOCAL_NAME}))),
    st.tuples(st.just("/api/create"), raw_json(body_of({"model": LOCAL_NAME}, {
        "from": field(st.sampled_from([DEFAULT, "fuzz-hermes", "nope"]), TEXT), "template": field(JINJA, TEXT),
        "parameters": field(st.dictionaries(st.sampled_from(["num_ctx", "num_batch", "temperature", "stop"]),
                                            st.one_of(st.integers(-1, 70000), TEXT, JUNK), max_size=2)),
        "system": field(TEXT), "stream": field(st.booleans()), "quantize": JUNK}))),
    st.tuples(st.just("/api/delete"), raw_json(body_of({"model": LOCAL_NAME}, {}))))


def test_fuzz_ollama_model_management(server):
    """Pull, copy, create and delete: never a 5xx, errors in Ollama's shape; the served models stay."""
    @bounded(60)
    @given(req=OLLAMA_MANAGEMENT)
    @example(req=("/api/create", J({"model": "fuzz-made", "from": DEFAULT, "template": "{{ .Prompt }}"})))
    @example(req=("/api/create", J({"model": "fuzz-made", "from": DEFAULT, "parameters": {"num_ctx": 10**30}})))
    @example(req=("/api/copy", J({"source": DEFAULT, "destination": "\ud800"})))
    @example(req=("/api/delete", Raw(b'{"model": NaN}')))
    def run(req):
        path, raw = req
        method = "DELETE" if path == "/api/delete" else "POST"
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request(method, path, body=raw.data, headers={"Content-Length": str(len(raw.data)),
                                                               **({"Content-Type": raw.content_type}
                                                                  if raw.content_type else {})})
            r = conn.getresponse()
            status, body = r.status, r.read()
        finally:
            conn.close()
        assert 200 <= status < 500, (path, status, body[:300])
        event(f"{path} {status} {json.loads(body.splitlines()[-1]).get('error', '')[:40] if status >= 400 else ''}")
        if status >= 400:
            assert isinstance(json.loads(body)["error"], str)
        assert set(SERVED) <= {m["id"] for m in server.get("/v1/models")["data"]}
    run()
    made = {e.name for e in server.service.config.models} - set(SERVED)
    for name in made:
        req = urllib.request.Request(server.url + "/api/delete", method="DELETE", headers={
            "Content-Type": "application/json"}, data=json.dumps({"model": name}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
    idle(server)


A_TEXT = st.fixed_dictionaries({"type": field(st.just("text")), "text": field(TEXT)},
                               optional={"cache_control": field(st.just({"type": "ephemeral"}))})
A_IDS = st.sampled_from(["toolu_1", "toolu_2", ""])
A_BLOCK = st.one_of(
    A_TEXT,
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": field(A_IDS), "name": field(NAME),
                           "input": field(st.dictionaries(st.text(max_size=4), SCALARS, max_size=2))}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": field(A_IDS)},
                          optional={"content": field(TEXT, st.lists(A_TEXT, max_size=2)),
                                    "is_error": field(st.booleans())}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": field(TEXT)}, optional={"signature": field(TEXT)}),
    st.fixed_dictionaries({"type": field(st.sampled_from(["image", "document", "redacted_thinking", "search_result",
                                                          "server_tool_use"]))},
                          optional={"data": field(TEXT), "source": JUNK}))
A_MESSAGE = st.fixed_dictionaries({"role": field(st.sampled_from(["user", "assistant"])),
                                   "content": field(TEXT, st.lists(A_BLOCK, min_size=1, max_size=3))})
A_MESSAGES = weighted((2, st.just([{"role": "user", "content": "hi"}])),
                      (4, st.lists(A_MESSAGE, min_size=0, max_size=3).map(
                          lambda ms: ms + [{"role": "user", "content": "hi"}])),
                      (1, st.lists(A_MESSAGE, max_size=3)))
A_TOOL = st.fixed_dictionaries({"name": field(NAME), "input_schema": field(weighted((3, SIMPLE_SCHEMA), (2, SCHEMA)))},
                               optional={"description": field(TEXT), "type": field(st.sampled_from(
                                   ["custom", "web_search_20250305", "bash_20250124"]))})
A_TOOL_CHOICE = field(st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "none"])},
                                            optional={"disable_parallel_tool_use": field(st.booleans())}),
                      st.fixed_dictionaries({"type": st.just("tool"), "name": field(NAME)}))
A_THINKING = field(st.fixed_dictionaries({"type": st.just("enabled"), "budget_tokens": field(st.integers(-1, 2048))},
                                         optional={"display": field(st.sampled_from(["summarized", "omitted"]))}),
                   st.fixed_dictionaries({"type": st.sampled_from(["disabled", "adaptive"])}))
A_OPTIONAL = {"system": field(TEXT, st.lists(A_TEXT, max_size=2)), "tools": field(st.lists(A_TOOL, min_size=1,
                                                                                        max_size=2)),
              "tool_choice": A_TOOL_CHOICE, "thinking": A_THINKING, "stop_sequences": field(st.lists(TEXT, max_size=3)),
              "temperature": field(st.floats(0, 1)), "top_p": field(st.floats(0, 1)),
              "top_k": field(st.integers(0, 100)), "metadata": field(st.fixed_dictionaries({"user_id": field(TEXT)})),
              "stream": field(st.booleans()), "output_config": field(st.fixed_dictionaries({"format": field(
                  st.fixed_dictionaries({"type": st.just("json_schema"), "schema": field(SCHEMA)}))}))}
A_BASE = {"model": CHAT_MODEL, "messages": field(A_MESSAGES)}
ANTHROPIC_BODIES = st.one_of(
    st.tuples(st.just("/v1/messages"), raw_json(body_of({**A_BASE, "max_tokens": field(st.integers(1, 8))},
                                                        A_OPTIONAL))),
    st.tuples(st.just("/v1/messages/count_tokens"), raw_json(body_of(A_BASE, A_OPTIONAL))))
ANTHROPIC_ERRORS = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                    "request_too_large", "rate_limit_error", "api_error", "overloaded_error"}


def check_anthropic_error(body: Any, mid_stream: bool = False) -> None:
    """Anthropic's error object: {"type": "error", "error": {"type", "message"}}; never api_error (a crash)."""
    assert isinstance(body, dict) and body.get("type") == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] in ANTHROPIC_ERRORS - {"api_error"} and body["error"]["message"], body


@bounded(60)
@given(req=ANTHROPIC_BODIES)
@example(req=("/v1/messages", Raw(b'{"model": "fuzz-tiny", "max_tokens": 4, "messages": [{"role": "user", '
                                  b'"content": "hi"}], "temperature": NaN}')))
@example(req=("/v1/messages", J({"model": "fuzz-hermes", "max_tokens": 4, "messages": [{"role": "user", "content": [
    {"type": "tool_result", "tool_use_id": "x", "content": [{"type": "image", "source": {}}]}]}]})))
@example(req=("/v1/messages", J({"model": "fuzz-tiny", "max_tokens": 4, "stream": True, "messages": [
    {"role": "user", "content": "hi"}], "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any"}})))
def test_fuzz_anthropic_routes(server, req):
    """Never a 5xx; errors in Anthropic's shape, also as a stream's error event; every SSE event named as its
    data's type."""
    path, raw = req
    r = send(server, path, raw.data, raw.content_type)
    assert 200 <= r.status < 500, (path, r.status, r.body[:300])
    event(f"{path} {r.status} {json.loads(r.body)['error']['message'][:40] if r.status >= 400 else ''}")
    if r.status >= 400:
        check_anthropic_error(json.loads(r.body))
    elif r.content_type.startswith("text/event-stream"):
        events = [e.split(b"\n") for e in r.body.strip().split(b"\n\n")]
        for name, data in events:
            assert name.startswith(b"event: ") and data.startswith(b"data: "), (name, data)
            obj = json.loads(data[6:])
            assert obj["type"] == name[7:].decode()
            if obj["type"] == "error":
                check_anthropic_error(obj)
        assert json.loads(events[-1][1][6:])["type"] in ("message_stop", "error")
    else:
        out = json.loads(r.body)
        assert out["type"] == "message" if path == "/v1/messages" else isinstance(out["input_tokens"], int), out
    idle(server)


def test_anthropic_routes_refuse_other_content_types(server):
    body = json.dumps({"model": DEFAULT, "max_tokens": 1, "messages": HI}).encode()
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        for ctype in WRONG_TYPES:
            r = send(server, route, body, ctype)
            assert r.status == 415, (route, ctype, r.status, r.body[:200])
            check_anthropic_error(json.loads(r.body))


R_PART = st.fixed_dictionaries({"type": field(st.sampled_from(["input_text", "output_text", "refusal", "input_image"]))},
                               optional={"text": field(TEXT), "refusal": field(TEXT)})
R_ITEM = st.one_of(
    st.fixed_dictionaries({"role": field(st.sampled_from(["user", "assistant", "system", "developer"])),
                           "content": field(TEXT, st.lists(R_PART, max_size=2))},
                          optional={"type": field(st.just("message")), "id": field(st.text(max_size=6))}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": field(st.text(max_size=6)), "name": field(NAME),
                           "arguments": field(ARGUMENTS)}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": field(st.text(max_size=6)),
                           "output": field(TEXT, st.lists(R_PART, max_size=2))}),
    st.fixed_dictionaries({"type": st.just("reasoning")}, optional={
        "summary": field(st.lists(st.fixed_dictionaries({"type": st.just("summary_text"), "text": TEXT}), max_size=1)),
        "content": field(st.lists(st.fixed_dictionaries({"type": st.just("reasoning_text"), "text": TEXT}),
                                  max_size=1))}),
    st.fixed_dictionaries({"type": field(st.sampled_from(["item_reference", "computer_call", "web_search_call"]))}))
R_TOOL = st.fixed_dictionaries(
    {"type": field(st.sampled_from(["function", "function", "web_search_preview", "file_search", "mcp"])),
     "name": field(NAME)},
    optional={"description": field(TEXT), "parameters": field(weighted((3, SIMPLE_SCHEMA), (2, SCHEMA))),
              "strict": field(st.booleans())})
R_FORMAT = field(st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
                 st.fixed_dictionaries({"type": st.just("json_schema"), "name": field(st.sampled_from(["place", "x"]), TEXT),
                                        "schema": field(SCHEMA)}, optional={"strict": field(st.booleans())}))
R_OPTIONAL = {
    "instructions": field(TEXT), "tools": field(st.lists(R_TOOL, min_size=1, max_size=2)),
    "tool_choice": field(st.sampled_from(["none", "auto", "required"]),
                         st.fixed_dictionaries({"type": field(st.just("function")), "name": field(NAME)})),
    "parallel_tool_calls": field(st.booleans()),
    "text": field(st.fixed_dictionaries({}, optional={"format": R_FORMAT,
                                                      "verbosity": field(st.sampled_from(["low", "high"]))})),
    "reasoning": field(st.fixed_dictionaries({}, optional={
        "effort": field(st.sampled_from(["none", "minimal", "low", "high"])),
        "summary": field(st.sampled_from(["auto", "detailed"]))})),
    "temperature": field(st.floats(0, 2)), "top_p": field(st.floats(0, 1)),
    "truncation": field(st.sampled_from(["auto", "disabled"])), "stream": field(st.booleans()),
    "store": field(st.booleans()), "previous_response_id": field(st.sampled_from(["resp_nope", ""]), TEXT),
    "metadata": field(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)), "user": field(TEXT),
    "seed": SAMPLING["seed"], "top_k": SAMPLING["top_k"], "min_p": SAMPLING["min_p"], "stop": STOP, "include": JUNK}
RESPONSES_BODY = body_of({"model": CHAT_MODEL, "max_output_tokens": field(st.integers(1, 8)), "input": field(
    weighted((3, st.text(min_size=1, max_size=20)), (4, st.lists(R_ITEM, min_size=1, max_size=3)), (1, TEXT)))},
    R_OPTIONAL)


@bounded(60)
@given(raw=raw_json(RESPONSES_BODY))
@_examples(Raw(b'{"input": "hi", "max_output_tokens": 2, "temperature": NaN}'), {"input": [{"type": "zzz"}]},
           {"input": "hi", "max_output_tokens": 2, "tools": [{"type": "web_search_preview"}]},
           {"input": "hi", "max_output_tokens": 2, "stream": True, "model": "fuzz-hermes", "tool_choice": "required",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]},
           {"input": "hi", "previous_response_id": "resp_nope"},
           {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})
def test_fuzz_responses(server, raw):
    """Never a 5xx; errors in the OpenAI shape; a stream's every event named as its data's type and numbered in
    order, ending with response.completed or response.incomplete (response.failed would be an engine failure)."""
    r = fuzz(server, "/v1/responses", raw)
    if r.status == 200 and r.content_type.startswith("text/event-stream"):
        types = []
        for i, (name, data) in enumerate(f.split(b"\n") for f in r.body.strip().split(b"\n\n")):
            obj = json.loads(data.removeprefix(b"data: "))
            assert name == b"event: " + obj["type"].encode() and obj["sequence_number"] == i, (name, obj)
            types.append(obj["type"])
        assert types[-1] in ("response.completed", "response.incomplete"), types
    elif r.status == 200:
        assert json.loads(r.body)["object"] == "response"
    idle(server)


def _wait_bench(srv) -> None:
    deadline = time.monotonic() + 120
    while srv.get("/bench")["state"] == "running":
        assert time.monotonic() < deadline, "the benchmark did not end"
        time.sleep(0.2)


@bounded(12)
@given(raw=raw_json(body_of({}, {"model": field(st.sampled_from(["", DEFAULT, "fuzz-minilm", "nope"]), TEXT)})))
@example(raw=Raw(b'{"model": NaN}'))
@example(raw=Raw(b"[1]"))
def test_fuzz_bench(server, raw):
    r = fuzz(server, "/bench", raw)
    if r.status == 202:
        _wait_bench(server)


# ---- multipart routes -----------------------------------------------------------------------------

def _wav(seconds: float, rate: int = 16000, channels: int = 1, tone: bool = True) -> bytes:
    n = int(seconds * rate)
    frames = b"".join(struct.pack("<h", int(8000 * math.sin(i * 0.05)) if tone else 0) * channels for i in range(n))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames)
    return buf.getvalue()


WAVS = [_wav(0.3), _wav(0.2, 8000, 2), _wav(0.5, tone=False), _wav(0.0), _wav(0.2, 48000)]
LYING_WAV = WAVS[0][:40] + struct.pack("<I", 2**31) + WAVS[0][44:]  # a data chunk claiming 2 GB
FILES = weighted((6, st.sampled_from(WAVS)), (2, st.binary(max_size=300)), (1, st.none()),
                 (1, st.sampled_from([LYING_WAV, WAVS[0][:30], WAVS[0][:100], b"", b"RIFF" + b"\x00" * 40])))
FORM_NAMES = weighted((5, st.sampled_from(["model", "response_format", "language", "stream", "prompt", "temperature",
                                        "timestamp_granularities[]", "response_format[]", "language[]", "file[]",
                                        "prompt[]", "model[]", "stream[]"])), (1, st.text(max_size=6)))
FORM_VALUES = weighted(
    (6, st.sampled_from(["whisper-1", "json", "text", "srt", "vtt", "verbose_json", "xml", "en", "de", "true",
                         "false", "maybe", "0.5", "NaN", ""]).map(str.encode)),
    (2, st.text(max_size=10).map(str.encode)), (1, SURROGATES.map(lambda s: s.encode("utf-8", "surrogatepass"))),
    (1, st.binary(max_size=12)))


@dataclass
class Form:
    fields: list[tuple[str, bytes]]
    file: bytes | None
    broken: int  # 0: well formed; 1: no closing boundary; 2: a boundary the header does not name; 3: no boundary

    def encode(self) -> Raw:
        b = "fuzz-boundary-7f3a"
        out = b""
        for name, value in self.fields:
            out += f'--{b}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode(
                "utf-8", "surrogatepass") + value + b"\r\n"
        if self.file is not None:
            out += (f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                    "Content-Type: application/octet-stream\r\n\r\n").encode() + self.file + b"\r\n"
        ctype = f"multipart/form-data; boundary={b}"
        if self.broken == 1:
            return Raw(out, ctype)
        if self.broken == 2:
            return Raw(out + f"--{b}--\r\n".encode(), "multipart/form-data; boundary=other")
        if self.broken == 3:
            return Raw(out + f"--{b}--\r\n".encode(), "multipart/form-data")
        return Raw(out + f"--{b}--\r\n".encode(), ctype)

    def __repr__(self) -> str:
        return f"Form({self.fields!r}, file={None if self.file is None else self.file[:40]!r}, broken={self.broken})"


FORMS = st.builds(Form, st.lists(st.tuples(FORM_NAMES, FORM_VALUES), max_size=3), FILES,
                  st.sampled_from([0] * 12 + [1, 2, 3]))


@bounded(100)
@given(route=st.sampled_from(["/v1/audio/transcriptions", "/v1/audio/translations", "/vad"]), form=FORMS)
@example(route="/v1/audio/transcriptions", form=Form([("response_format", b"\xff\xfe")], WAVS[0], 0))
@example(route="/v1/audio/transcriptions", form=Form([], b"\x13\x37" * 100, 0))
@example(route="/vad", form=Form([], LYING_WAV, 0))
def test_fuzz_multipart_routes(server, route, form):
    raw = form.encode()
    fuzz(server, route, raw)


# ---- defects this fuzz found, fixed since -------------------------------------------------------

def _form(*fields: tuple[str, str]) -> Raw:
    return Form([(k, v.encode()) for k, v in fields], WAVS[0], 0).encode()


@pytest.mark.parametrize("path, raw", [
    # json.loads raises a plain ValueError for an integer literal over Python's 4300-digit limit (was a 500)
    pytest.param("/v1/chat/completions", Raw(b'{"messages": [{"role": "user", "content": "hi"}], "seed": 1'
                                             + b"0" * 5000 + b"}"), id="integer-over-4300-digits"),
    # a form field 'model[]' or 'stream[]' read as a list (TypeError / AttributeError: 500s)
    pytest.param("/v1/audio/transcriptions", _form(("model[]", "whisper-1")), id="form-model-list"),
    pytest.param("/v1/audio/transcriptions", _form(("stream[]", "true")), id="form-stream-list"),
    pytest.param("/v1/audio/transcriptions", _form(("model", "whisper-1"), ("model", "whisper-1")),
                 id="form-field-twice"),
])
def test_found_defects(server, path, raw):
    """Each was a 500 before its fix."""
    r = send(server, path, raw.data, raw.content_type)
    check(r, path)
    assert 400 <= r.status < 500


# ---- content types, and the server afterwards ---------------------------------------------------

JSON_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/audio/speech", "/v1/models/load",
               "/v1/models/unload", "/v1/models/reload", "/v1/models/activate", "/config", "/catalog/download",
               "/catalog/cancel", "/catalog/serve", "/catalog/import", "/bench", "/tokenize", "/detokenize",
               "/apply-template", "/infill", "/v1/chat/completions/input_tokens"]
WRONG_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None,
               "application/jsonx", "text/json"]


@pytest.mark.parametrize("route", JSON_ROUTES)
def test_json_routes_refuse_other_content_types(server, route):
    """A body sent as anything but application/json is a 415 (a page could send those without a preflight)."""
    body = json.dumps({"messages": HI, "max_tokens": 1, "model": SPARE, "name": "x", "path": "/nonexistent",
                       "prompt": "a", "input": "a"}).encode()
    for ctype in WRONG_TYPES:
        r = check(send(server, route, body, ctype), route)
        assert r.status == 415, (route, ctype, r.status, r.body[:200])
        assert json.loads(r.body)["error"]["code"] == "unsupported_media_type"


def test_server_still_serves_after_the_fuzz(server):
    """Run last: every model is served, nothing is left running, the scheduler never failed, and a plain chat
    is answered."""
    idle(server)
    scheduler = server.get("/v1/stats")["scheduler"]
    assert scheduler == {"alive": True, "restarts": 0, "tick_errors": 0}, scheduler
    assert set(SERVED) <= {m["id"] for m in server.get("/v1/models")["data"]}
    for model in CHAT_MODELS:
        r = server.client().chat.completions.create(model=model, messages=HI, max_tokens=3, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")
    assert server.get("/health")["status"] == "ok"
