"""Bad input gets a clear OpenAI-shaped 4xx naming the problem, and the server keeps serving."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

MSG = [{"role": "user", "content": "hi"}]


def post(server, path: str, data: bytes, headers: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def assert_error(status: int, body: dict, expect_status: int, *words: str, param: str | None = None) -> None:
    assert status == expect_status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    for w in words:
        assert w in err["message"], err
    if param is not None:
        assert err["param"] == param


def still_serving(server) -> None:
    r = server.client().chat.completions.create(messages=MSG, max_tokens=3, temperature=0, model="")
    assert r.choices[0].finish_reason in ("stop", "length")


def test_malformed_json(tiny_server):
    status, body = post(tiny_server, "/v1/chat/completions", b'{"messages": [')
    assert_error(status, body, 400, "not valid JSON")
    status, body = post(tiny_server, "/v1/chat/completions", b'[1, 2]')
    assert_error(status, body, 400, "JSON object")
    still_serving(tiny_server)


@pytest.mark.parametrize("body, param, words", [
    ({}, "messages", ["'messages' is required"]),
    ({"messages": "hello"}, "messages", ["must be an array"]),
    ({"messages": []}, "messages", ["must not be empty"]),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages", ["role"]),
    ({"messages": [{"role": "user", "content": 5}]}, "messages", ["content"]),
    ({"messages": MSG, "max_tokens": -5}, "max_tokens", [">= 1"]),
    ({"messages": MSG, "max_tokens": "ten"}, "max_tokens", ["integer"]),
    ({"messages": MSG, "temperature": "hot"}, "temperature", ["number"]),
    ({"messages": MSG, "temperature": 7}, "temperature", ["between 0 and 2"]),
    ({"messages": MSG, "top_p": 1.5}, "top_p", ["between"]),
    ({"messages": MSG, "stream": "yes"}, "stream", ["boolean"]),
    ({"messages": MSG, "stop": 3}, "stop", ["string"]),
    ({"messages": MSG, "logit_bias": {"x": 1}}, "logit_bias", ["token ids"]),
    ({"messages": MSG, "seed": 1.5}, "seed", ["integer"]),
])
def test_wrong_fields_name_the_problem(tiny_server, body, param, words):
    status, resp = post(tiny_server, "/v1/chat/completions", json.dumps(body).encode())
    assert_error(status, resp, 400, *words, param=param)


def test_openai_client_sees_typed_errors(tiny_server):
    client = tiny_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(messages=MSG, model="", max_tokens=-1)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(messages=MSG, model="no-such-model")
    assert e.value.body["param"] == "model"
    still_serving(tiny_server)


def test_prompt_over_the_context(tiny_server):
    long = "word " * 9000  # the tiny model's byte-level vocab: well over 8192 tokens
    client = tiny_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(messages=[{"role": "user", "content": long}], model="")
    assert e.value.body["code"] == "context_length_exceeded" and "8192" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(messages=MSG, model="", max_tokens=100_000)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(prompt=long, model="")
    still_serving(tiny_server)


def test_truncation_auto_drops_oldest_turns(tiny_server):
    client = tiny_server.client()
    filler = "x" * 3000
    history = [{"role": "system", "content": "be brief"}]
    for i in range(4):
        history += [{"role": "user", "content": f"turn {i} {filler}"}, {"role": "assistant", "content": filler}]
    history.append({"role": "user", "content": "last question"})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(messages=history, model="", max_tokens=8)
    r = client.chat.completions.create(messages=history, model="", max_tokens=8, temperature=0,
                                       extra_body={"truncation": "auto"})
    assert r.usage.prompt_tokens + 8 <= 8192
    assert r.usage.prompt_tokens > 2 * 3000  # kept as many recent turns as fit, not just the last
    # Only the latest turn, and it alone is too long: still a 400.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(messages=[{"role": "user", "content": "y" * 9000}], model="",
                                       extra_body={"truncation": "auto"})
    assert "truncation" in e.value.body["message"]


def test_unknown_route_and_method(tiny_server):
    try:
        urllib.request.urlopen(tiny_server.url + "/v1/nothing-here")
    except urllib.error.HTTPError as e:
        assert_error(e.code, json.loads(e.read()), 404, "/v1/nothing-here")
    else:
        pytest.fail("expected 404")
    try:
        urllib.request.urlopen(tiny_server.url + "/v1/chat/completions")
    except urllib.error.HTTPError as e:
        assert_error(e.code, json.loads(e.read()), 405, "GET")


def test_body_over_the_limit_is_413(tiny_server):
    big = json.dumps({"messages": [{"role": "user", "content": "a" * (2 * 2**20)}]}).encode()
    status, body = post(tiny_server, "/v1/chat/completions", big)
    assert_error(status, body, 413, "1 MB")
    still_serving(tiny_server)


def test_bad_completion_prompts(tiny_server):
    for body, param in [({"prompt": 5}, "prompt"), ({}, "prompt"), ({"prompt": [1, "a"]}, "prompt"),
                        ({"prompt": [10**9]}, "prompt"), ({"prompt": ""}, "prompt")]:
        status, resp = post(tiny_server, "/v1/completions", json.dumps(body).encode())
        assert_error(status, resp, 400, param=param)


def test_ignored_field_is_logged_once(tiny_server, caplog):
    caplog.set_level("WARNING", logger="llamadesk.server")
    for _ in range(2):
        status, _ = post(tiny_server, "/v1/chat/completions",
                         json.dumps({"messages": MSG, "max_tokens": 2, "frobnicate": True}).encode())
        assert status == 200
    hits = [r for r in caplog.records if "frobnicate" in r.getMessage()]
    assert len(hits) == 1 and "ignoring" in hits[0].getMessage()
