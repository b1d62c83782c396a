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


# ---- request-boundary validation (each case was a 500) --------------------------------------------

@pytest.mark.parametrize("field, literal, words", [
    ("temperature", b"NaN", ["finite", "nan"]), ("top_p", b"Infinity", ["finite", "inf"]),
    ("min_p", b"-Infinity", ["finite"]), ("presence_penalty", b"NaN", ["finite"]),
    ("repeat_penalty", b"1e400", ["finite"]),  # json reads an overflowing float as inf
    ("temperature", b"1" + b"0" * 400, ["out of range"]),  # float() of this integer raises OverflowError
    ("top_k", b"1" + b"0" * 30, ["64 bits"]), ("seed", str(2**64).encode(), ["64 bits"]),
])
def test_non_finite_and_oversized_numbers_are_400(tiny_server, field, literal, words):
    for path, head in (("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '),
                       ("/v1/completions", b'{"prompt": "hi", ')):
        status, body = post(tiny_server, path, head + b'"max_tokens": 2, "' + field.encode() + b'": ' + literal
                                + b"}")
        assert_error(status, body, 400, *words, param=field)
    still_serving(tiny_server)


def test_non_finite_numbers_nested_in_a_field_are_400(tiny_server):
    status, body = post(tiny_server, "/v1/chat/completions",
                            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
                            b'"chat_template_kwargs": {"x": [1, NaN]}}')
    assert_error(status, body, 400, "chat_template_kwargs.x[1]", "finite", param="chat_template_kwargs")


@pytest.mark.parametrize("tools, words", [
    (["x"], ["tools[0]", "an object"]), ([1], ["tools[0]"]), ([{"type": "function"}], ["tools[0].function"]),
    ([{"type": "function", "function": {}}], ["tools[0].function.name"]),
    ([{"type": "function", "function": {"name": ""}}], ["tools[0].function.name"]),
    ([{"type": "function", "function": {"name": 5}}], ["tools[0].function.name"]),
    ([{"type": "function", "function": {"name": 'bad "name"'}}], ["tools[0].function.name"]),
    ([{"type": "retrieval", "function": {"name": "f"}}], ["tools[0].type"]),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], ["tools[0].function.parameters"]),
    ([{"type": "function", "function": {"name": "f", "description": ["x"]}}], ["tools[0].function.description"]),
    ([{"type": "function", "function": {"name": "f"}}, "x"], ["tools[1]"]),
])
def test_malformed_tools_name_the_tool(tiny_server, tools, words):
    for choice in ("auto", "none"):  # checked even when no tool will be called
        body = {"messages": MSG, "max_tokens": 2, "tools": tools, "tool_choice": choice}
        status, resp = post(tiny_server, "/v1/chat/completions", json.dumps(body).encode())
        assert_error(status, resp, 400, *words, param="tools")


def test_a_tool_schema_too_costly_for_a_grammar_is_a_quick_400(tiny_server):
    import time
    for params in ({"type": "object", "properties": {"a": {"type": "string", "minLength": 10**9}}},
                   {"type": "object", "properties": {"a": {"type": "array", "maxItems": 10**7}}},
                   {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}}):
        t0 = time.monotonic()
        body = {"messages": MSG, "max_tokens": 2, "tool_choice": "required",
                "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}]}
        status, resp = post(tiny_server, "/v1/chat/completions", json.dumps(body).encode())
        assert_error(status, resp, 400, "grammar", param="tools")
        assert time.monotonic() - t0 < 5
    status, resp = post(tiny_server, "/v1/chat/completions", json.dumps(
        {"messages": MSG, "max_tokens": 2, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "string", "maxLength": 10**9}}}}).encode())
    assert_error(status, resp, 400, "maxLength", param="response_format")
    still_serving(tiny_server)


@pytest.mark.parametrize("calls, where", [
    ([1], "messages[1].tool_calls[0]"), ("x", "messages[1].tool_calls"),
    ([{"id": "1"}], "messages[1].tool_calls[0].function"),
    ([{"id": "a"}], "messages[1].tool_calls[0].function"), ([None], "messages[1].tool_calls[0]"),
    ([{"function": {}}], "messages[1].tool_calls[0].function.name"),
    ([{"function": "f"}], "messages[1].tool_calls[0].function"), ({"a": 1}, "messages[1].tool_calls"),
    ([{"function": {"name": "f", "arguments": 5}}], "messages[1].tool_calls[0].function.arguments"),
    ([{"id": 7, "function": {"name": "f"}}], "messages[1].tool_calls[0].id"),
    ([{"type": "code", "function": {"name": "f"}}], "messages[1].tool_calls[0].type"),
])
def test_malformed_tool_calls_in_the_history_name_the_call(tiny_server, calls, where):
    """Was KeyError: 'function' in engine/tools.py _replay_as_text (the tiny model speaks the generic format)."""
    history = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": calls},
               {"role": "tool", "tool_call_id": "1", "content": "sunny"}]
    for extra in ({}, {"tools": [{"type": "function", "function": {"name": "f"}}]}):
        body = {"messages": history, "max_tokens": 2, **extra}
        status, resp = post(tiny_server, "/v1/chat/completions", json.dumps(body).encode())
        assert_error(status, resp, 400, where, param="messages")
    still_serving(tiny_server)


def test_a_well_formed_tool_history_is_replayed(tiny_server):
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                   {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "not json"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
               {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "noon"}]}]
    status, resp = post(tiny_server, "/v1/chat/completions",
                        json.dumps({"messages": history, "max_tokens": 2}).encode())
    assert status == 200, resp


@pytest.mark.parametrize("choice", [{"type": "function", "function": "f"}, {"type": "function"},
                                    {"type": "function", "function": {"name": 5}}, {"function": {}},
                                    {"type": "allowed_tools", "function": {"name": "f"}}, "sometimes", 5, ["auto"]])
def test_malformed_tool_choice_is_400(tiny_server, choice):
    body = {"messages": MSG, "max_tokens": 2, "tool_choice": choice,
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    status, resp = post(tiny_server, "/v1/chat/completions", json.dumps(body).encode())
    assert_error(status, resp, 400, "tool_choice", param="tool_choice")


@pytest.mark.parametrize("kwargs, words", [
    ({"messages": 5}, ["messages"]), ({"tools": []}, ["tools"]),
    ({"add_generation_prompt": False}, ["add_generation_prompt"]),
    ({"bos_token": "x", "eos_token": "y"}, ["bos_token, eos_token"]), ({"raise_exception": 1}, ["raise_exception"]),
    ("enable_thinking", ["an object"]), ([1], ["an object"]),
])
def test_chat_template_kwargs_may_not_replace_the_templates_variables(tiny_server, kwargs, words):
    body = {"messages": MSG, "max_tokens": 2, "chat_template_kwargs": kwargs}
    status, resp = post(tiny_server, "/v1/chat/completions", json.dumps(body).encode())
    assert_error(status, resp, 400, *words, param="chat_template_kwargs")
    ok = {"messages": MSG, "max_tokens": 2, "chat_template_kwargs": {"enable_thinking": False, "documents": []}}
    assert post(tiny_server, "/v1/chat/completions", json.dumps(ok).encode())[0] == 200


@pytest.mark.parametrize("path, body, param, where", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages", "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]},
     "messages", "messages[0].content[0].text"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "ok"}, {"role": "user", "name": "\udc00",
                                                                                "content": "x"}]},
     "messages", "messages[1].name"),
    ("/v1/chat/completions", {"messages": MSG, "stop": ["ok", "\ud800"]}, "stop", "stop[1]"),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function", "function": {
        "name": "f", "description": "\ud800"}}]}, "tools", "tools[0].function.description"),
    ("/v1/chat/completions", {"messages": MSG, "chat_template_kwargs": {"\ud800": 1}}, "chat_template_kwargs",
     "a key in 'chat_template_kwargs'"),
    ("/v1/completions", {"prompt": "\ud800"}, "prompt", "'prompt'"),
    ("/v1/completions", {"prompt": ["\ud800"]}, "prompt", "prompt[0]"),
    ("/v1/completions", {"prompt": "hi", "stop": "\udbff"}, "stop", "'stop'"),
    ("/v1/embeddings", {"input": "\ud800"}, "input", "'input'"),
    ("/v1/embeddings", {"input": ["fine", "\udfff"]}, "input", "input[1]"),
])
def test_lone_surrogates_are_400_naming_the_field(tiny_server, path, body, param, where):
    """A lone surrogate cannot be encoded as UTF-8, so it can never be tokenized (was UnicodeEncodeError, a 500)."""
    status, resp = post(tiny_server, path, json.dumps({"max_tokens": 2, **body}).encode())
    assert_error(status, resp, 400, where, "surrogate", param=param)
    # a surrogate pair written as two escapes is one valid character
    pair = json.dumps({"max_tokens": 2, "messages": [{"role": "user", "content": "\ud83d\ude00"}]})
    assert "\\ud83d\\ude00" in pair and post(tiny_server, "/v1/chat/completions", pair.encode())[0] == 200


def test_content_parts_other_than_text_reach_the_template_and_are_refused_there(tiny_server):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                                      {"type": "image_url", "image_url": {"url": "data:,x"}}]}],
            "max_tokens": 2}
    status, resp = post(tiny_server, "/v1/chat/completions", json.dumps(body).encode())
    assert_error(status, resp, 400, "image_url", param="messages")
    for bad, where in (([{"text": "hi"}], "messages[0].content[0].type"),
                       ([{"type": "text"}], "messages[0].content[0].text")):
        status, resp = post(tiny_server, "/v1/chat/completions",
                            json.dumps({"messages": [{"role": "user", "content": bad}]}).encode())
        assert_error(status, resp, 400, where, param="messages")


def test_several_prompts_and_too_many_inputs_say_so(tiny_server):
    status, resp = post(tiny_server, "/v1/completions", json.dumps({"prompt": ["a", "b"]}).encode())
    assert_error(status, resp, 400, "several prompts", param="prompt")
    status, resp = post(tiny_server, "/v1/embeddings", json.dumps({"input": ["a"] * 2049}).encode())
    assert_error(status, resp, 400, "at most 2048", param="input")
    status, resp = post(tiny_server, "/v1/embeddings", json.dumps({"input": "a", "encoding_format": "hex"}).encode())
    assert_error(status, resp, 400, "'float' or 'base64'", param="encoding_format")
