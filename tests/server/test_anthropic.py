"""Anthropic's Messages API, driven by the official `anthropic` SDK against the served SmolLM2 (plain, hermes
and thinking templates) and, for the API key, the context window and a stream's failure, a server of this
module's own. This SDK version has no sampling arguments of its own: temperature, top_p and top_k go in
extra_body, as its users send them."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import anthropic
import pytest

from tests.conftest import LiveServer
from tests.http import call

GREEDY = {"temperature": 0}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You are a helpful assistant. Answer briefly."
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"name": "get_time", "description": "Current time in a city",
         "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
OSLO = [{"role": "user", "content": "What is the weather in Oslo?"}]
ERROR_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
               "request_too_large", "rate_limit_error", "api_error", "overloaded_error"}


@pytest.fixture(scope="module")
def client(smol_server):
    c = anthropic.Anthropic(base_url=smol_server.url, api_key="unused", max_retries=0, timeout=120)
    yield c
    c.close()


@pytest.fixture(scope="module")
def forced_call(client):
    """A buffered get_weather call, forced on the hermes template."""
    return client.messages.create(model="smollm2-hermes", max_tokens=80, messages=OSLO, tools=[WEATHER],
                                  tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)


def count(client, **body) -> int:
    return client.messages.count_tokens(**{"model": "smollm2", "messages": QUESTION, **body}).input_tokens


def raw_events(server, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    """A streamed reply as it comes over the wire: (event name, data) pairs."""
    req = urllib.request.Request(server.url + "/v1/messages", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        text = r.read().decode()
    events = []
    for chunk in text.strip().split("\n\n"):
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        events.append((name[7:], json.loads(data[6:])))
    return events


def is_anthropic_error(body) -> bool:
    return isinstance(body, dict) and body.get("type") == "error" and set(body["error"]) == {"type", "message"} \
        and body["error"]["type"] in ERROR_TYPES and isinstance(body["error"]["message"], str)


# ---- replies ----------------------------------------------------------------------------------------

def test_create_buffered(client):
    r = client.messages.create(model="smollm2", max_tokens=24, system=SYSTEM, messages=QUESTION,
                               metadata={"user_id": "user-1"}, extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == "smollm2"
    assert [b.type for b in r.content] == ["text"] and "Paris" in r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert 1 <= r.usage.output_tokens <= 24 and r.usage.cache_creation_input_tokens == 0
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == count(client, system=SYSTEM)


def test_streamed_with_the_sdk_helper_equals_buffered(client):
    body = dict(model="smollm2", max_tokens=24, system=SYSTEM, messages=QUESTION, extra_body=GREEDY)
    buffered = client.messages.create(**body)
    with client.messages.stream(**body) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == final.content[0].text == buffered.content[0].text
    assert final.stop_reason == buffered.stop_reason and final.usage.output_tokens == buffered.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == count(client, system=SYSTEM)


def test_the_wire_carries_anthropics_event_sequence(smol_server):
    events = raw_events(smol_server, {"model": "smollm2", "max_tokens": 6, "messages": QUESTION, **GREEDY})
    names = [n for n, _ in events]
    assert all(d["type"] == n for n, d in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 10
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for n, d in events[3:-3])
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 6


def test_system_as_a_string_and_as_blocks_render_the_same(client):
    as_blocks = [{"type": "text", "text": "You are a helpful assistant."},
                 {"type": "text", "text": "Answer briefly.", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]
    as_string = "You are a helpful assistant.\n\nAnswer briefly."
    assert count(client, system=as_blocks) == count(client, system=as_string) > count(client, system="Hi.") + 5
    r = client.messages.create(model="smollm2", max_tokens=16, system=as_blocks, messages=QUESTION, extra_body=GREEDY)
    assert "Paris" in r.content[0].text


def test_count_tokens_is_the_prompt_the_reply_used(client):
    body = dict(model="smollm2-hermes", messages=OSLO, tools=[WEATHER], system=SYSTEM)
    n = client.messages.count_tokens(**body).input_tokens
    first = client.messages.create(max_tokens=4, extra_body=GREEDY, **body)
    again = client.messages.create(max_tokens=4, extra_body=GREEDY, **body)
    for r in (first, again):
        assert r.usage.input_tokens + r.usage.cache_read_input_tokens == n
    # the same prompt again is read from the prefix cache: input_tokens are the tokens that were not
    assert again.usage.cache_read_input_tokens > n // 2 and again.usage.input_tokens < n // 2
    assert n > client.messages.count_tokens(model="smollm2-hermes", messages=OSLO, system=SYSTEM).input_tokens + 20


def test_sampling_fields_reach_the_sampler(client):
    body = dict(model="smollm2", max_tokens=12, messages=[{"role": "user", "content": "Tell me about cats."}])
    greedy = client.messages.create(**body, extra_body=GREEDY).content[0].text
    assert client.messages.create(**body, extra_body=GREEDY).content[0].text == greedy
    # top_k 1 and a tiny top_p leave only the likeliest token: greedy, at temperature 1
    assert client.messages.create(**body, extra_body={"temperature": 1, "top_k": 1}).content[0].text == greedy
    assert client.messages.create(**body, extra_body={"temperature": 1, "top_p": 0.001}).content[0].text == greedy
    sampled = {client.messages.create(**body, extra_body={"temperature": 1}).content[0].text for _ in range(3)}
    assert sampled - {greedy}


def test_max_tokens_ends_the_reply_with_max_tokens(client):
    r = client.messages.create(model="smollm2", max_tokens=3, messages=[{"role": "user", "content": "Count to 20."}],
                               extra_body=GREEDY)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 3


def test_a_stop_sequence_that_ends_the_reply_is_named(client, smol_server):
    body = dict(model="smollm2", max_tokens=30, messages=QUESTION, extra_body=GREEDY)
    whole = client.messages.create(**body).content[0].text
    word = whole.split()[len(whole.split()) // 2]  # a word from the middle of the greedy reply
    r = client.messages.create(**body, stop_sequences=["never-said", word])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == word
    assert r.content[0].text == whole[:whole.index(word)]
    events = raw_events(smol_server, {"model": "smollm2", "max_tokens": 30, "messages": QUESTION,
                                      "stop_sequences": [word], **GREEDY})
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": word}
    assert client.messages.create(**body, stop_sequences=["never-said"]).stop_sequence is None


def test_output_config_json_schema_constrains_the_text(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    r = client.messages.create(model="smollm2", max_tokens=40, messages=QUESTION, extra_body=GREEDY,
                               output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"})
    assert set(json.loads(r.content[0].text)) == {"city"}


# ---- tools ------------------------------------------------------------------------------------------

def test_a_tool_use_and_tool_result_round_trip(client, forced_call):
    r = forced_call
    tool = {**WEATHER, "type": "custom", "cache_control": {"type": "ephemeral"}}  # the same tool to the template
    assert count(client, model="smollm2-hermes", messages=OSLO, tools=[tool]) == \
        count(client, model="smollm2-hermes", messages=OSLO, tools=[WEATHER])
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["tool_use"]
    use = r.content[0]
    assert use.id.startswith("toolu_") and use.name == "get_weather" and isinstance(use.input["city"], str)

    def turn(result) -> list[dict]:
        return [*OSLO, {"role": "assistant", "content": r.content},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, **result}]}]
    answer = client.messages.create(model="smollm2-hermes", max_tokens=24, tools=[tool], tool_choice={"type": "none"},
                                    messages=turn({"content": "Sunny, 21 C"}), extra_body=GREEDY)
    assert answer.stop_reason in ("end_turn", "max_tokens") and answer.content[0].type == "text"
    assert answer.content[0].text.strip()
    # the result is in the prompt, in each of its forms
    n = {k: client.messages.count_tokens(model="smollm2-hermes", tools=[tool], messages=turn(v)).input_tokens
         for k, v in {"text": {"content": "Sunny, 21 C"},
                      "blocks": {"content": [{"type": "text", "text": "Sunny, 21 C"}]},
                      "long": {"content": "Sunny, 21 C, light wind from the west, no rain expected until Friday"},
                      "error": {"content": "Sunny, 21 C", "is_error": True}}.items()}
    assert n["text"] == n["blocks"] < n["error"] < n["long"]


def test_tool_choice_any_and_disabled_parallel_use(client):
    ask = [{"role": "user", "content": "What is the weather in Oslo, and what time is it in Paris?"}]
    both = client.messages.create(model="smollm2-hermes", max_tokens=120, messages=ask, tools=[WEATHER, CLOCK],
                                  tool_choice={"type": "any"}, extra_body=GREEDY)
    assert both.stop_reason == "tool_use" and [b.name for b in both.content] == ["get_weather", "get_time"]
    one = client.messages.create(model="smollm2-hermes", max_tokens=120, messages=ask, tools=[WEATHER, CLOCK],
                                 tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=GREEDY)
    assert one.stop_reason == "tool_use" and [b.name for b in one.content] == ["get_weather"]
    auto = client.messages.create(model="smollm2-hermes", max_tokens=40, messages=ask, tools=[WEATHER, CLOCK],
                                  tool_choice={"type": "auto", "disable_parallel_tool_use": False}, extra_body=GREEDY)
    uses = [b for b in auto.content if b.type == "tool_use"]
    assert (auto.stop_reason == "tool_use") == bool(uses)


def test_a_streamed_tool_use_equals_the_buffered_one(client, smol_server, forced_call):
    body = dict(model="smollm2-hermes", max_tokens=80, messages=OSLO, tools=[WEATHER],
                tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    buffered = forced_call.content[0]
    with client.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == buffered.input and final.content[0].name == "get_weather"
    events = raw_events(smol_server, {k: v for k, v in body.items() if k != "extra_body"} | GREEDY)
    start = next(d for n, d in events if n == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    parts = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"]
    assert len(parts) > 1 and json.loads("".join(parts)) == buffered.input


def test_the_generic_format_calls_tools_too(client):
    r = client.messages.create(model="smollm2", max_tokens=80, messages=OSLO, tools=[WEATHER],
                               tool_choice={"type": "any"}, extra_body=GREEDY)
    assert r.stop_reason == "tool_use" and r.content[-1].name == "get_weather"
    follow = client.messages.create(model="smollm2", max_tokens=8, tools=[WEATHER], extra_body=GREEDY, messages=[
        *OSLO, {"role": "assistant", "content": r.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": r.content[-1].id, "content": "Sunny"}]}])
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")


# ---- thinking ---------------------------------------------------------------------------------------

def test_thinking_enabled_gives_a_thinking_block_and_disabled_none(client):
    on = client.messages.create(model="smollm2-think", max_tokens=40, messages=QUESTION, extra_body=GREEDY,
                                thinking={"type": "enabled", "budget_tokens": 32})
    assert on.content[0].type == "thinking" and on.content[0].thinking.strip() and on.content[0].signature
    off = client.messages.create(model="smollm2-think", max_tokens=16, messages=QUESTION, extra_body=GREEDY,
                                 thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text.strip()
    adaptive = client.messages.create(model="smollm2-think", max_tokens=8, messages=QUESTION, extra_body=GREEDY,
                                      thinking={"type": "adaptive"})  # the template's default: it thinks
    assert adaptive.content[0].type == "thinking"
    omitted = client.messages.create(model="smollm2-think", max_tokens=8, messages=QUESTION, extra_body=GREEDY,
                                     thinking={"type": "enabled", "budget_tokens": 4, "display": "omitted"})
    assert omitted.content[0].type == "thinking" and omitted.content[0].thinking == "" and omitted.content[0].signature


def test_streamed_thinking_carries_its_signature(client, smol_server):
    body = dict(model="smollm2-think", max_tokens=40, messages=QUESTION,
                thinking={"type": "enabled", "budget_tokens": 32})
    buffered = client.messages.create(**body, extra_body=GREEDY)
    with client.messages.stream(**body, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == buffered.content[0].thinking
    assert final.content[0].signature
    names = [(n, d.get("delta", {}).get("type")) for n, d in raw_events(smol_server, {**body, **GREEDY})]
    assert ("content_block_delta", "thinking_delta") in names
    assert names.index(("content_block_delta", "signature_delta")) == names.index(("content_block_stop", None)) - 1


def test_thinking_blocks_in_the_history_are_accepted_and_not_replayed_as_text(client):
    def history(*blocks) -> list[dict]:
        return [*QUESTION, {"role": "assistant", "content": [*blocks, {"type": "text", "text": "Paris."}]},
                {"role": "user", "content": "And of Italy?"}]
    plain = count(client, model="smollm2-think", messages=history())
    thought = count(client, model="smollm2-think", messages=history(
        {"type": "thinking", "thinking": "The user asks about France. " * 5, "signature": "sig"},
        {"type": "redacted_thinking", "data": "opaque"}))
    assert thought == plain  # this template does not render past reasoning
    r = client.messages.create(model="smollm2-think", max_tokens=8, thinking={"type": "disabled"}, extra_body=GREEDY,
                               messages=history({"type": "thinking", "thinking": "France.", "signature": "sig"}))
    assert r.content[0].type == "text"


# ---- errors -----------------------------------------------------------------------------------------

BASE = {"model": "smollm2", "max_tokens": 4, "messages": QUESTION}


@pytest.mark.parametrize("body, named", [
    ({k: v for k, v in BASE.items() if k != "max_tokens"}, "max_tokens"),
    ({**BASE, "max_tokens": 0}, "max_tokens"),
    ({**BASE, "max_tokens": "4"}, "max_tokens"),
    ({"model": "smollm2", "max_tokens": 4}, "messages"),
    ({**BASE, "messages": []}, "messages"),
    ({**BASE, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({**BASE, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0]"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]}, "x"),
    ({**BASE, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].source"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
    ({**BASE, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "assistant message"),
    ({**BASE, "messages": [*QUESTION, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t"}]}, *QUESTION]}, "user message"),
    ({**BASE, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}]},
     "tool_use_id"),
    ({**BASE, "messages": [*QUESTION, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "AA=="}}]}]}]}, "images are not"),
    ({**BASE, "messages": [*QUESTION, {"role": "assistant", "content": "The answer is"}]}, "last message"),
    ({**BASE, "system": 5}, "system"),
    ({**BASE, "system": [{"type": "image"}]}, "system[0]"),
    ({**BASE, "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]}, "web_search_20250305"),
    ({**BASE, "tools": [{"type": "bash_20250124", "name": "bash"}]}, "bash_20250124"),
    ({**BASE, "tools": [{"name": "bad name", "input_schema": {}}]}, "tools[0].name"),
    ({**BASE, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({**BASE, "tools": [{"name": "f", "input_schema": {}, "parameters": {}}]}, "tools[0].parameters"),
    ({**BASE, "tools": [{"name": "f", "input_schema": {"type": "object", "minLength": 10**9}}],
      "tool_choice": {"type": "any"}}, "JSON schema"),
    ({**BASE, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({**BASE, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({**BASE, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice"),
    ({**BASE, "tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({**BASE, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({**BASE, "thinking": {"type": "on"}}, "thinking"),
    ({**BASE, "temperature": 1.5}, "temperature"),
    ({**BASE, "top_p": -0.1}, "top_p"),
    ({**BASE, "top_k": 1.5}, "top_k"),
    ({**BASE, "stop_sequences": "stop"}, "stop_sequences"),
    ({**BASE, "stop_sequences": [1]}, "stop_sequences[0]"),
    ({**BASE, "stream": "yes"}, "stream"),
    ({**BASE, "metadata": {"user_id": 5}}, "metadata.user_id"),
    ({**BASE, "output_config": {"format": {"type": "json_object"}}}, "output_config.format"),
    ({**BASE, "model": 5}, "model"),
])
def test_malformed_bodies_are_400s_naming_the_field(smol_server, body, named):
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and named.startswith(("max_tokens", "temperature", "top_", "stop_", "stream",
                                                                "metadata")):
            continue  # fields count_tokens does not read (ignored there)
        status, out = call(smol_server, "POST", path, body)
        assert status == 400 and is_anthropic_error(out), (path, status, out)
        assert out["error"]["type"] == "invalid_request_error" and named in out["error"]["message"], out


def test_a_thinking_budget_must_leave_room_under_max_tokens(smol_server, client):
    body = {**BASE, "model": "smollm2-think", "max_tokens": 8}
    for budget in (8, 9):  # Anthropic's rule: budget_tokens < max_tokens
        status, out = call(smol_server, "POST", "/v1/messages",
                           {**body, "thinking": {"type": "enabled", "budget_tokens": budget}})
        assert status == 400 and is_anthropic_error(out) and "thinking.budget_tokens" in out["error"]["message"]
    reply = client.messages.create(**body, thinking={"type": "enabled", "budget_tokens": 7})
    assert reply.content[0].type == "thinking"


@pytest.mark.parametrize("raw", [b'{"model": "smollm2", "max_tokens": 4, "temperature": NaN, "messages": []}',
                                 b'{"model": "smollm2", "max_tokens": Infinity, "messages": []}',
                                 b'{"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": '
                                 b'"\\ud800"}]}', b"[1]", b"{", b""])
def test_non_numbers_surrogates_and_broken_json_are_400s(smol_server, raw):
    req = urllib.request.Request(smol_server.url + "/v1/messages", data=raw,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    with e.value as r:
        assert r.code == 400 and is_anthropic_error(json.loads(r.read()))


def test_the_sdk_raises_its_typed_errors(client):
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="smollm2", max_tokens=4, messages=[{"role": "tool", "content": "x"}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "messages[0].role" in e.value.message
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="smollm2", max_tokens=4, messages=QUESTION, extra_body={"temperature": "hot"})
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=QUESTION)
    assert e.value.body["error"]["type"] == "not_found_error" and "claude-sonnet-4-5" in e.value.message
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="nope", messages=QUESTION)
    with pytest.raises(anthropic.BadRequestError):
        with client.messages.stream(model="smollm2", max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]):
            pass
    with pytest.raises(anthropic.BadRequestError) as e:  # more than the context holds
        client.messages.create(model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "word " * 3000}])
    assert "context" in e.value.message
    assert client.messages.create(model="smollm2", max_tokens=2, messages=QUESTION).content  # still serving


def test_routes_methods_and_media_types_answer_in_anthropics_shape(smol_server):
    status, out = call(smol_server, "GET", "/v1/messages")
    assert status == 405 and is_anthropic_error(out)
    status, out = call(smol_server, "POST", "/v1/messages/batches", BASE)
    assert status == 404 and out["error"]["type"] == "not_found_error"
    req = urllib.request.Request(smol_server.url + "/v1/messages", data=json.dumps(BASE).encode(),
                                 headers={"Content-Type": "text/plain"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    with e.value as r:
        assert r.code == 415 and is_anthropic_error(json.loads(r.read()))
    status, out = call(smol_server, "POST", "/v1/chat/completions", {"messages": [{"role": "user"}], "n": "x"})
    assert status == 400 and "param" in out["error"]  # other routes keep the OpenAI shape


# ---- a server of this module's own: the API key, the context window, a stream's failure ----------------

@pytest.fixture(scope="module")
def keyed(assets, tmp_path_factory):
    toml = (f'[[models]]\nname = "tiny"\npath = "{assets["tiny"]}"\nctx = 128\ndefault = true\n\n'
            f'[[models]]\nname = "smol"\npath = "{assets["smollm2"]}"\nctx = 2048\n')
    srv = LiveServer(["--api-key", "s3cret"], toml, tmp_path_factory.mktemp("anthropic-keyed"))
    yield srv
    srv.stop()


def test_a_server_with_an_api_key_takes_the_sdks_x_api_key(keyed):
    with anthropic.Anthropic(base_url=keyed.url, api_key="s3cret", max_retries=0, timeout=60) as c:
        assert c.messages.create(model="tiny", max_tokens=2, messages=QUESTION).type == "message"
        assert c.messages.count_tokens(model="tiny", messages=QUESTION).input_tokens > 3
    with anthropic.Anthropic(base_url=keyed.url, auth_token="s3cret", max_retries=0, timeout=60) as c:
        assert c.messages.create(model="tiny", max_tokens=2, messages=QUESTION).type == "message"  # Bearer too
    with anthropic.Anthropic(base_url=keyed.url, api_key="wrong", max_retries=0, timeout=60) as c:
        with pytest.raises(anthropic.AuthenticationError) as e:
            c.messages.create(model="tiny", max_tokens=2, messages=QUESTION)
    assert e.value.body["error"]["type"] == "authentication_error" and "x-api-key" in e.value.message


def test_max_tokens_beyond_the_context_generates_until_it_is_full(keyed):
    with anthropic.Anthropic(base_url=keyed.url, api_key="s3cret", max_retries=0, timeout=60) as c:
        ask = [{"role": "user", "content": "hi " * 20}]
        n = c.messages.count_tokens(model="tiny", messages=ask).input_tokens
        r = c.messages.create(model="tiny", max_tokens=4000, messages=ask, extra_body=GREEDY)
        assert r.stop_reason == "model_context_window_exceeded" and r.usage.output_tokens == 128 - n
        # the chat-completions route keeps refusing what does not fit
        req = urllib.request.Request(keyed.url + "/v1/chat/completions", headers={
            "Content-Type": "application/json", "Authorization": "Bearer s3cret"}, data=json.dumps(
            {"model": "tiny", "max_tokens": 4000, "messages": ask}).encode())
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        with e.value as refused:
            assert refused.code == 400


def test_a_client_that_leaves_mid_stream_ends_its_generation(keyed):
    with anthropic.Anthropic(base_url=keyed.url, api_key="s3cret", max_retries=0, timeout=60) as c:
        with c.messages.stream(model="smol", max_tokens=1500, extra_body=GREEDY,
                               messages=[{"role": "user", "content": "Write a long story."}]) as stream:
            for event in stream:
                if event.type == "message_start":
                    request_id = event.message.id.removeprefix("msg_")
                if event.type == "content_block_delta":
                    break  # leaving the block closes the connection
    deadline = time.monotonic() + 30
    while not (mine := [s for s in _get(keyed, "/v1/streams")["streams"] if s["id"] == request_id
                        and s["state"] == "done"]):
        assert time.monotonic() < deadline, "the generation went on after its client left"
        time.sleep(0.1)
    assert mine[0]["finish_reason"] == "cancelled" and mine[0]["gen_tokens"] < 1500


def test_an_engine_failure_mid_stream_is_an_error_event(keyed):
    async def scenario() -> tuple[list[str], BaseException | None]:
        client = anthropic.AsyncAnthropic(base_url=keyed.url, api_key="s3cret", max_retries=0, timeout=60)
        seen, failure, unloading = [], None, None
        try:
            stream = await client.messages.create(model="smol", max_tokens=1500, stream=True, extra_body=GREEDY,
                                                  messages=[{"role": "user", "content": "Write a long story."}])
            async for event in stream:
                seen.append(event.type)
                if len(seen) == 4:  # the model goes while it streams
                    unloading = asyncio.create_task(asyncio.to_thread(_unload, keyed, "smol"))
        except anthropic.APIStatusError as e:  # the SDK raises on an error event
            failure = e
        if unloading is not None:
            await unloading
        await client.close()
        return seen, failure
    seen, failure = asyncio.run(scenario())
    assert failure is not None, seen
    assert failure.body["error"]["type"] == "overloaded_error" and "aborted" in failure.body["error"]["message"]
    assert "message_stop" not in seen and "message_delta" not in seen


def _get(server, path: str) -> dict:
    req = urllib.request.Request(server.url + path, headers={"Authorization": "Bearer s3cret"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _unload(server, model: str) -> None:
    req = urllib.request.Request(server.url + "/v1/models/unload", data=json.dumps({"model": model}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer s3cret"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
