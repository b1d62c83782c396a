"""Defects real client libraries hit (the protocols issue's first list), each once reproduced."""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from engine.requests import OutputReading
from engine.tools import ReplyReader
from tests.conftest import LiveServer
from tests.http import call
from tests.server.test_agents import SYSTEM, WEATHER, chat, chat_stream


def _reader(fmt: str, streaming: bool = True, constrained: bool = False) -> ReplyReader:
    return ReplyReader(OutputReading(tool_format=fmt, tools_active=True, constrained_calls=constrained), streaming)


def test_parallel_calls_of_the_generic_format_carry_their_own_index():
    # one chunk holding two whole calls: each delta needs its index, or the SDK merges them into one
    r = _reader("generic")
    text = json.dumps({"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]})
    events = r.events(text) + r.events(None)
    calls = [e for e in events if e.kind == "tool_call"]
    assert [(e.index, e.call["name"]) for e in calls] == [(0, "a"), (1, "b")]


def test_hermes_streaming_sends_no_blank_content_between_calls():
    r = _reader("hermes")
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>\n')
    events = [e for ch in text for e in r.events(ch)] + r.events(None)  # a character at a time
    assert [e.kind for e in events] == ["tool_call", "tool_call"]
    assert [e.index for e in events] == [0, 1]
    plain = _reader("hermes")  # whitespace inside a text reply is kept
    out = [e for ch in "Hi\n\nthere\n" for e in plain.events(ch)] + plain.events(None)
    assert "".join(e.text for e in out if e.kind == "content") == "Hi\n\nthere\n"


def test_a_hermes_call_cut_by_max_tokens_finishes_by_length(smol_server):
    body = dict(model="smollm2-hermes", tools=[WEATHER], tool_choice="required", max_tokens=6,
                messages=[SYSTEM, {"role": "user", "content": "What's the weather like in Paris?"}])
    r = chat(smol_server, **body)
    c = r.choices[0]
    assert c.finish_reason == "length" and not c.message.tool_calls  # not a call: its arguments are cut
    assert c.message.content and "<tool_call>" in c.message.content  # what was generated comes back as text
    chunks = chat_stream(smol_server, **body)
    assert [x.finish_reason for ch in chunks for x in ch.choices if x.finish_reason] == ["length"]


def test_strict_json_strings_hold_no_raw_control_characters(smol_server):
    m = smol_server.service.roster.loaded["smollm2"]
    newline = m.model.tokenize("\n", add_special=False, parse_special=False)
    assert len(newline) == 1
    schema = {"type": "object", "properties": {"poem": {"type": "string", "maxLength": 200}}, "required": ["poem"]}
    for fmt in ({"type": "json_schema", "json_schema": {"name": "poem", "schema": schema}}, {"type": "json_object"}):
        # the newline pushed hard: the grammar must still only let it in as the escape \n
        r = chat(smol_server, model="smollm2", response_format=fmt, max_tokens=80, logit_bias={str(newline[0]): 8},
                 messages=[SYSTEM, {"role": "user", "content": "Write a short poem about the sea as JSON."}])
        text = r.choices[0].message.content
        assert not any(ord(ch) < 0x20 for ch in text), repr(text)
        if r.choices[0].finish_reason == "stop":
            json.loads(text)


def test_a_stream_aborted_by_unloading_its_model_ends_with_an_error_event(assets, tmp_path):
    toml = f'[[models]]\nname = "a"\npath = "{assets["tiny"]}"\ndefault = true\n\n' \
           f'[[models]]\nname = "b"\npath = "{assets["tiny"]}"\n'
    srv = LiveServer([], toml, tmp_path)
    try:
        async def scenario() -> list[dict]:
            client = srv.async_client(timeout=60)
            events = []
            stream = await client.chat.completions.create(model="b", messages=[{"role": "user", "content": "hi"}],
                                                          max_tokens=3000, stream=True, extra_body={"ignore_eos": True})
            unloaded = None
            try:
                async for chunk in stream:
                    events.append(chunk.model_dump())
                    if len(events) == 3:
                        unloaded = asyncio.create_task(asyncio.to_thread(
                            call, srv, "POST", "/v1/models/unload", {"model": "b"}))
            except Exception as e:  # the SDK raises on an SSE error event
                events.append({"error": str(e)})
            await unloaded
            await client.close()
            return events
        events = asyncio.run(scenario())
        assert "error" in events[-1] and "aborted" in events[-1]["error"]
        assert not any(c["finish_reason"] == "cancelled" for e in events[:-1] for c in e.get("choices", []))
    finally:
        srv.stop()


def test_completions_over_the_context_name_the_prompt(tiny_server):
    status, out = call(tiny_server, "POST", "/v1/completions", {"prompt": "word " * 9000, "max_tokens": 4})
    assert status == 400 and out["error"]["param"] == "prompt" and "truncation" not in out["error"]["message"]
    status, out = call(tiny_server, "POST", "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "word " * 9000}], "max_tokens": 4})
    assert status == 400 and out["error"]["param"] == "messages" and "truncation" in out["error"]["message"]


def test_over_context_advice_offers_truncation_only_where_the_route_accepts_it(tiny_server):
    long = [{"role": "user", "content": "word " * 9000}]
    tiny = tiny_server.client().models.list().data[0].id
    status, out = call(tiny_server, "POST", "/v1/messages", {"model": tiny, "max_tokens": 4, "messages": long})
    assert status == 400 and "truncation" not in out["error"]["message"]
    assert "shorten the conversation" in out["error"]["message"]
    status, out = call(tiny_server, "POST", "/api/chat", {"model": tiny, "stream": False, "messages": long})
    assert status == 400 and "truncation" not in out["error"] and "shorten the conversation" in out["error"]
    status, out = call(tiny_server, "POST", "/v1/responses", {"model": tiny, "max_output_tokens": 4,
                                                              "input": long})
    assert status == 400 and "truncation" in out["error"]["message"]


def test_a_broken_tool_parameter_schema_names_tools(smol_server):
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minLength": 10**9}}}
    status, out = call(smol_server, "POST", "/v1/chat/completions", {
        "model": "smollm2-hermes", "tools": [bad], "tool_choice": "required",
        "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and out["error"]["param"] == "tools", out


def test_metrics_say_their_text_format_version(tiny_server):
    with urllib.request.urlopen(tiny_server.url + "/metrics", timeout=30) as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_temperature_is_a_400(tiny_server, value):
    req = urllib.request.Request(tiny_server.url + "/v1/chat/completions", method="POST",
                                 data=('{"messages": [{"role": "user", "content": "hi"}], "temperature": %s}'
                                       % value).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and json.loads(e.value.read())["error"]["param"] == "temperature"
    e.value.close()


UNPARSABLE = {"type": "string", "pattern": "^(a+)+b{2,3000}$"}  # a grammar llama.cpp refuses to parse
HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path, body, named", [
    ("/v1/chat/completions", {"messages": HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": UNPARSABLE}}}, "response_format"),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x",
                                                          "schema": UNPARSABLE}}}, "text"),
    ("/v1/messages", {"model": "smollm2", "max_tokens": 2, "messages": HI,
                      "output_config": {"format": {"type": "json_schema", "schema": UNPARSABLE}}}, "output_config"),
    ("/api/chat", {"model": "smollm2", "stream": False, "messages": HI, "format": UNPARSABLE}, "format"),
], ids=["chat", "responses", "messages", "ollama"])
def test_a_grammar_llama_cpp_refuses_names_the_field_of_the_schema(smol_server, path, body, named):
    status, out = call(smol_server, "POST", path, body)
    assert status == 400, out
    err = out["error"]
    if isinstance(err, str):  # Ollama's shape
        assert err.startswith(f"{named}: ") and "grammar" in err
    elif "param" in err:  # OpenAI's
        assert err["param"] == named and "grammar" in err["message"]
    else:  # Anthropic's
        assert err["message"].startswith(f"{named}: ") and "grammar" in err["message"]
