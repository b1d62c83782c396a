"""The OpenAI Responses API (/v1/responses), driven by the official openai SDK against the served SmolLM2: buffered
and streamed (the SDK parsing every event into its own types; its stream helper), function tools with their
outputs, text formats, reasoning, sampling fields, the stored responses (across a restart), and malformed bodies.
Raw replies are also validated against the SDK's pydantic types (model_validate, not its lenient construct)."""
from __future__ import annotations

import asyncio
import http.client
import json
import sqlite3
import time
import urllib.error
import urllib.request

import jsonschema
import openai
import pydantic
import pytest
from openai.types.responses import (Response, ResponseCompletedEvent, ResponseCreatedEvent,
                                    ResponseFunctionCallArgumentsDeltaEvent, ResponseInProgressEvent,
                                    ResponseOutputItemAddedEvent, ResponseStreamEvent, ResponseTextDeltaEvent)

from engine.errors import NotFound
from server.store import ResponseStore
from tests.conftest import LiveServer
from tests.http import call

SYSTEM = "You are a helpful assistant. Answer briefly."
QUESTION = "What is the capital of France?"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}
CLOCK = {"type": "function", "name": "get_time", "description": "Current time in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                        "required": ["city"]}}
BOTH = "What is the weather in Oslo, and what time is it in Paris?"
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def client(smol_server):
    with openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0, timeout=600) as c:
        yield c


def create(client, **body) -> Response:
    """A buffered response at temperature 0, its raw JSON validated as the SDK's Response."""
    body = {"model": "smollm2", "temperature": 0, "max_output_tokens": 60, **body}
    raw = client.responses.with_raw_response.create(**body)
    Response.model_validate(json.loads(raw.text))
    return raw.parse()


def sse(server, body: dict) -> list[dict]:
    """A streamed response over raw HTTP: each event's data, checked against its `event:` line and validated as
    one of the SDK's stream event types."""
    req = urllib.request.Request(server.url + "/v1/responses", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers.get_content_type() == "text/event-stream"
        frames = r.read().decode().split("\n\n")
    events = []
    for frame in filter(None, frames):
        name, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


# ---- buffered and streamed -------------------------------------------------------------------------

def test_a_response_is_the_chat_completion_of_the_same_conversation(client):
    r = create(client, instructions=SYSTEM, input=QUESTION)
    chat = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=60, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    assert r.output_text == chat.choices[0].message.content and "Paris" in r.output_text
    assert r.status == "completed" and chat.choices[0].finish_reason == "stop"
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "smollm2" and r.error is None
    msg, = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed" and msg.id.startswith("msg_")
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    u = r.usage
    assert (u.input_tokens, u.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.output_tokens_details.reasoning_tokens == 0
    assert u.input_tokens_details.cached_tokens >= 0 and r.instructions == SYSTEM


def test_input_items_say_the_same_as_a_string(client):
    plain = create(client, instructions=SYSTEM, input=QUESTION)
    items = create(client, input=[{"role": "developer", "content": SYSTEM},  # developer messages are system ones
                                  {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                                                    "text": QUESTION}]}])
    assert items.output_text == plain.output_text and items.usage.input_tokens == plain.usage.input_tokens
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Paris."},
               {"role": "user", "content": "And the capital of Italy?"}]
    chat = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=60, messages=history)
    turns = create(client, input=[history[0], {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Paris.", "annotations": []}]}, history[2]])
    assert turns.output_text == chat.choices[0].message.content
    assert turns.usage.input_tokens == chat.usage.prompt_tokens


def test_a_streamed_response_is_the_buffered_one_event_by_event(client, smol_server):
    body = dict(model="smollm2", instructions=SYSTEM, input=QUESTION, temperature=0, max_output_tokens=60)
    buffered = create(client, **body)
    events = list(client.responses.create(**body, stream=True))
    assert isinstance(events[0], ResponseCreatedEvent) and isinstance(events[1], ResponseInProgressEvent)
    assert isinstance(events[2], ResponseOutputItemAddedEvent) and isinstance(events[-1], ResponseCompletedEvent)
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert len(deltas) > 1 and "".join(d.delta for d in deltas) == buffered.output_text
    final = events[-1].response
    assert final.id == events[0].response.id and final.output_text == buffered.output_text
    assert final.usage.output_tokens == buffered.usage.output_tokens
    item_id = final.output[0].id
    assert all(d.item_id == item_id and d.output_index == 0 and d.content_index == 0 for d in deltas)
    kinds = [e["type"] for e in sse(smol_server, body)]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]


def test_the_sdk_stream_helper_gives_the_final_response(client):
    body = dict(model="smollm2", instructions=SYSTEM, input=QUESTION, temperature=0, max_output_tokens=60)
    buffered = create(client, **body)
    with client.responses.stream(**body) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.output_text == text == buffered.output_text and final.status == "completed"


def test_max_output_tokens_ends_an_incomplete_response(client, smol_server):
    # greedy: a sampled reply of the tiny model can end (EOS) before its fifth token, and then it is complete
    r = create(client, input="Count from one to fifty.", max_output_tokens=5, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.output[0].status == "incomplete" and r.max_output_tokens == 5
    events = sse(smol_server, {"model": "smollm2", "input": "Count from one to fifty.", "max_output_tokens": 5,
                               "temperature": 0})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# ---- sampling --------------------------------------------------------------------------------------

def test_every_sampling_field_reaches_the_sampler(client):
    base = dict(input="Write a sentence about the sea.", max_output_tokens=8)
    greedy = create(client, **base).output_text
    hot = [create(client, **base, temperature=1.5, extra_body={"seed": s}).output_text for s in (1, 2)]
    assert any(h != greedy for h in hot)  # sampled at 1.5, the reply leaves the greedy path
    assert create(client, **base, temperature=1.5, extra_body={"seed": 1}).output_text == hot[0]  # the seed fixes it
    # each of these narrows the choice to the likeliest token: greedy again, even at 1.5
    for narrow in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 0.0}):
        same = create(client, **base, temperature=1.5, extra_body={"seed": 1, **narrow})
        assert same.output_text == greedy, narrow
    r = create(client, input="Count from one to twenty, with commas.", max_output_tokens=30, extra_body={"stop": [","]})
    assert "," not in r.output_text and r.status == "completed" and r.temperature == 0 and r.top_p == 1.0


# ---- tools -----------------------------------------------------------------------------------------

def test_a_function_tool_round_trip(client):
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = create(client, model="smollm2-hermes", input=ask, tools=[WEATHER], tool_choice="required")
    call_item, = first.output
    assert call_item.type == "function_call" and call_item.name == "get_weather" and call_item.status == "completed"
    assert call_item.call_id.startswith("call_") and call_item.id.startswith("fc_")
    assert json.loads(call_item.arguments)["city"] and first.status == "completed"
    assert first.tools[0].name == "get_weather" and first.tool_choice == "required"
    result = {"type": "function_call_output", "call_id": call_item.call_id, "output": "Sunny, 21 C"}
    # the client sends the conversation back itself, or names the stored one: the same prompt either way
    resent = create(client, model="smollm2-hermes", input=[*ask, *[o.to_dict() for o in first.output], result],
                    tools=[WEATHER], store=False)
    continued = create(client, model="smollm2-hermes", previous_response_id=first.id, input=[result], tools=[WEATHER],
                       max_output_tokens=1)
    assert continued.usage.input_tokens == resent.usage.input_tokens > first.usage.input_tokens + 10
    assert _same_prompt(continued, resent) and continued.previous_response_id == first.id
    parts = create(client, model="smollm2-hermes", previous_response_id=first.id, tools=[WEATHER], max_output_tokens=1,
                   input=[{**result, "output": [{"type": "input_text", "text": "Sunny, 21 C"}]}])
    assert _same_prompt(parts, resent)  # an output given as parts reads the same


def _same_prompt(r: Response, before: Response) -> bool:
    """Whether r's prompt is token for token the one a request just before it had: all of it but the last token
    came from the KV cache (their replies' texts could differ with how much of a prompt was cached: the numbers
    of a batched prefill are not those of one token's decode)."""
    tokens = before.usage.input_tokens
    return r.usage.input_tokens == tokens and r.usage.input_tokens_details.cached_tokens == tokens - 1


def test_tool_choice_by_name_none_and_parallel_calls(client):
    named = create(client, model="smollm2-hermes", input="What is the weather in Oslo?", tools=[WEATHER, CLOCK],
                   tool_choice={"type": "function", "name": "get_time"})
    assert [o.name for o in named.output] == ["get_time"] and named.tool_choice.name == "get_time"
    both = create(client, model="smollm2-hermes", input=BOTH, tools=[WEATHER, CLOCK], tool_choice="required",
                  max_output_tokens=80)
    assert [o.name for o in both.output] == ["get_weather", "get_time"]
    one = create(client, model="smollm2-hermes", input=BOTH, tools=[WEATHER, CLOCK], tool_choice="required",
                 max_output_tokens=80, parallel_tool_calls=False)
    assert [o.name for o in one.output] == ["get_weather"] and one.parallel_tool_calls is False
    none = create(client, model="smollm2-hermes", input=BOTH, tools=[WEATHER, CLOCK], tool_choice="none",
                  max_output_tokens=8)
    assert [o.type for o in none.output] == ["message"]


def test_a_streamed_call_builds_the_buffered_one(client, smol_server):
    body = dict(model="smollm2-hermes", input="What is the weather in Oslo?", tools=[WEATHER], temperature=0,
                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=60)
    buffered = create(client, **body).output[0]
    events = list(client.responses.create(**body, stream=True))
    added = next(e for e in events if isinstance(e, ResponseOutputItemAddedEvent))
    assert added.item.type == "function_call" and added.item.arguments == "" and added.item.status == "in_progress"
    deltas = [e.delta for e in events if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent)]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    final = events[-1].response.output[0]
    assert "".join(deltas) == done.arguments == final.arguments  # the arguments as the model writes them
    assert json.loads(final.arguments) == json.loads(buffered.arguments)
    assert final.name == buffered.name and final.call_id == added.item.call_id
    with client.responses.stream(**body) as stream:
        helper = stream.get_final_response().output[0]
    # another generation: greedy text may differ in whitespace with what the KV cache held (batch rounding)
    assert json.loads(helper.arguments) == json.loads(final.arguments) and helper.type == "function_call"
    cut = sse(smol_server, {**body, "max_output_tokens": 6})  # the call cut by max_output_tokens is no whole call
    assert cut[-1]["type"] == "response.incomplete"
    assert [i["status"] for i in cut[-1]["response"]["output"]] == ["incomplete"]


# ---- output formats and reasoning ------------------------------------------------------------------

class Place(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)


def test_text_format_json_schema_json_object_and_text(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                "population_millions": {"type": "integer"}},
              "required": ["city", "population_millions"], "additionalProperties": False}
    ask = dict(instructions=SYSTEM, input="Describe the capital of France as JSON.", max_output_tokens=80)
    r = create(client, **ask, text={"format": {"type": "json_schema", "name": "place", "schema": schema,
                                               "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema" and r.text.format.name == "place"
    assert isinstance(json.loads(create(client, **ask, text={"format": {"type": "json_object"}}).output_text), dict)
    plain = create(client, **ask)
    assert create(client, **ask, text={"format": {"type": "text"}, "verbosity": "low"}).output_text \
        == plain.output_text
    parsed = client.responses.parse(model="smollm2", temperature=0, text_format=Place, **ask)
    assert isinstance(parsed.output_parsed, Place) and parsed.output_parsed.city


def test_reasoning_comes_as_a_reasoning_item(client, smol_server):
    body = dict(model="smollm2-think", input="What is 2 + 2?", max_output_tokens=30)
    r = create(client, **body, reasoning={"effort": "low", "summary": "auto"})
    item = r.output[0]
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.content[0].type == "reasoning_text"
    assert item.content[0].text.strip() and item.summary[0].text == item.content[0].text
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
    assert r.reasoning.effort == "low" and r.reasoning.summary == "auto"
    without_summary = create(client, **body, reasoning={"effort": "high"})
    assert without_summary.output[0].type == "reasoning" and without_summary.output[0].summary == []
    off = create(client, **body, reasoning={"effort": "none"})  # no thinking: the template closes it at once
    assert [o.type for o in off.output] == ["message"] and off.usage.output_tokens_details.reasoning_tokens == 0
    events = sse(smol_server, {**body, "reasoning": {"effort": "medium"}})
    text = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    final = events[-1]["response"]["output"][0]
    assert text.strip() and text == final["content"][0]["text"] and final["type"] == "reasoning"


def test_a_reasoning_item_in_the_input_is_kept_with_it(client):
    r = create(client, model="smollm2-think", max_output_tokens=5, input=[
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Greet back."}]},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}])
    kept = client.responses.input_items.list(r.id, order="asc").data
    assert [i.type for i in kept] == ["message", "reasoning", "message", "message"]
    assert kept[1].content[0].text == "Greet back."


# ---- the store -------------------------------------------------------------------------------------

def test_get_delete_and_input_items(client, smol_server):
    items = [{"role": "user", "content": f"Message {i}."} for i in range(5)]
    r = create(client, input=items, max_output_tokens=2, metadata={"topic": "numbers"}, user="tester")
    got = client.responses.retrieve(r.id)
    assert got.to_dict() == r.to_dict() and got.metadata == {"topic": "numbers"} and got.user == "tester"
    newest_first = client.responses.input_items.list(r.id).data
    assert [i.content[0].text for i in newest_first] == [f"Message {i}." for i in range(4, -1, -1)]
    status, page = call(smol_server, "GET", f"/v1/responses/{r.id}/input_items?limit=2&order=asc")
    assert status == 200 and page["object"] == "list" and page["has_more"] is True
    assert [i["content"][0]["text"] for i in page["data"]] == ["Message 0.", "Message 1."]
    assert (page["first_id"], page["last_id"]) == (page["data"][0]["id"], page["data"][1]["id"])
    status, rest = call(smol_server, "GET", f"/v1/responses/{r.id}/input_items?order=asc&after={page['last_id']}")
    assert [i["content"][0]["text"] for i in rest["data"]] == ["Message 2.", "Message 3.", "Message 4."]
    assert rest["has_more"] is False
    status, body = call(smol_server, "DELETE", f"/v1/responses/{r.id}")
    assert status == 200 and body == {"id": r.id, "object": "response.deleted", "deleted": True}
    for method in ("GET", "DELETE"):
        status, body = call(smol_server, method, f"/v1/responses/{r.id}")
        assert status == 404 and body["error"]["code"] == "not_found" and r.id in body["error"]["message"]


def test_continuing_past_a_deleted_turn_says_it_may_have_been_deleted(client, smol_server):
    first = create(client, input="Hi", max_output_tokens=2)
    second = create(client, input="And?", max_output_tokens=2, previous_response_id=first.id)
    assert call(smol_server, "DELETE", f"/v1/responses/{first.id}")[0] == 200
    with pytest.raises(openai.NotFoundError) as e:
        create(client, input="More?", max_output_tokens=2, previous_response_id=second.id)
    assert e.value.param == "previous_response_id" and first.id in e.value.message and "deleted" in e.value.message


def test_unknown_and_unstored_ids_are_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve("resp_nope")
    assert e.value.code == "not_found" and e.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as e:
        create(client, input="Hi", previous_response_id="resp_nope")
    assert e.value.param == "previous_response_id"
    unstored = create(client, input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(unstored.id)


def test_previous_response_id_continues_after_a_restart(assets, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # this test's own store
    args = ["--model", str(assets["smollm2"]), "--streams", "1", "--ctx", "1024"]
    model = assets["smollm2"].stem
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    srv = LiveServer(args, "", tmp_path / "one")
    try:
        first = create(srv.client(), model=model, instructions=SYSTEM, input=QUESTION, max_output_tokens=30)
    finally:
        srv.stop()
    assert (tmp_path / "data" / "llamadesk" / "responses.sqlite3").is_file()
    srv = LiveServer(args, "", tmp_path / "two")
    try:
        c = srv.client()
        assert c.responses.retrieve(first.id).to_dict() == first.to_dict()
        follow = "And the capital of Italy?"
        again = create(c, model=model, previous_response_id=first.id, input=follow, max_output_tokens=30)
        # the stored turn's input and output come first (its instructions do not carry over, as in OpenAI's API)
        chat = c.chat.completions.create(model=model, temperature=0, max_tokens=30, messages=[
            {"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": follow}])
        assert chat.usage.prompt_tokens == again.usage.input_tokens
        assert chat.usage.prompt_tokens_details.cached_tokens == again.usage.input_tokens - 1  # the same prompt
        third = create(c, model=model, previous_response_id=again.id, input="Thanks!", max_output_tokens=5)
        assert third.usage.input_tokens > again.usage.input_tokens + again.usage.output_tokens  # the whole chain
    finally:
        srv.stop()


def _store(tmp_path, max_bytes: int) -> ResponseStore:
    return ResponseStore(tmp_path / "responses.sqlite3", max_bytes)


def _response(rid: str, previous: str | None = None, text: str = "x" * 400) -> dict:
    return {"id": rid, "previous_response_id": previous, "output": [{"type": "message", "content": text}]}


def test_the_store_evicts_the_oldest_beyond_its_bound(tmp_path):
    async def run() -> None:
        store = _store(tmp_path, 3000)
        await store.open()
        await store.put(_response("r0"), [{"id": "i0"}])
        for i in range(1, 8):
            await store.put(_response(f"r{i}", f"r{i - 1}"), [{"id": f"i{i}"}])
        kept = [r for r in (f"r{i}" for i in range(8)) if await _kept(store, r)]
        assert kept[-1] == "r7" and 3 <= len(kept) < 8 and kept == [f"r{i}" for i in range(8 - len(kept), 8)]
        with pytest.raises(NotFound) as e:  # a conversation whose first turns went is refused, naming them
            await store.conversation("r7")
        assert "earlier turn" in e.value.message
        await store.close()
        total = sqlite3.connect(tmp_path / "responses.sqlite3").execute("SELECT total(size) FROM responses")
        assert total.fetchone()[0] <= 3000
    asyncio.run(run())


async def _kept(store: ResponseStore, rid: str) -> bool:
    try:
        await store.get(rid)
        return True
    except NotFound:
        return False


def test_a_damaged_store_file_is_set_aside(tmp_path, caplog):
    (tmp_path / "responses.sqlite3").write_bytes(b"not a database" * 100)

    async def run() -> None:
        store = _store(tmp_path, 1 << 20)
        await store.open()
        assert store.enabled
        await store.put(_response("r1"), [])
        assert (await store.get("r1")).response["id"] == "r1"
        await store.close()
    asyncio.run(run())
    assert (tmp_path / "responses.sqlite3.corrupt").read_bytes().startswith(b"not a database")
    assert any("set aside" in r.getMessage() for r in caplog.records)


# ---- the tiny model: a store that keeps nothing, failures, clients that leave -----------------------

@pytest.fixture(scope="module")
def tiny(assets, tmp_path_factory):
    """The tiny model twice (one of them to unload under a stream), keeping no responses."""
    toml = "".join(f'[[models]]\nname = "{name}"\npath = "{assets["tiny"]}"\nctx = 4096\nstreams = 2\n{extra}\n'
                   for name, extra in (("tiny", "default = true"), ("tiny-spare", "")))
    srv = LiveServer(["--responses-store-mb", "0"], toml, tmp_path_factory.mktemp("responses-tiny"))
    yield srv
    srv.stop()


def test_a_store_of_zero_keeps_nothing(tiny):
    r = create(tiny.client(), model="tiny", input="hi", max_output_tokens=2)
    assert r.store is False
    with pytest.raises(openai.NotFoundError) as e:
        tiny.client().responses.retrieve(r.id)
    assert "responses_store_mb" in e.value.message


def test_truncation_auto_drops_the_oldest_turns(tiny):
    turns = []
    for i in range(12):  # more than the context of 4096 tokens (the tiny model's are bytes)
        turns += [{"role": "user", "content": f"Story part {i}: " + "the sea is wide and blue " * 16},
                  {"role": "assistant", "content": "Noted."}]
    turns.append({"role": "user", "content": QUESTION})
    with pytest.raises(openai.BadRequestError) as e:
        create(tiny.client(), model="tiny", input=turns, max_output_tokens=2)
    assert e.value.code == "context_length_exceeded" and e.value.param == "input"
    r = create(tiny.client(), model="tiny", input=turns, max_output_tokens=2, truncation="auto")
    assert r.truncation == "auto" and 1000 < r.usage.input_tokens < 4096


def test_a_stream_whose_model_goes_ends_with_response_failed(tiny):
    stream = tiny.client().responses.create(model="tiny-spare", input="Tell me a long story", max_output_tokens=3000,
                                            temperature=0, stream=True)  # greedy: long; a sampled reply can end first
    events = []
    for e in stream:
        events.append(e)
        if e.type == "response.output_text.delta" and len(events) == 5:
            assert call(tiny, "POST", "/v1/models/unload", {"model": "tiny-spare"})[0] == 200
    assert events[-1].type == "response.failed" and events[-1].response.status == "failed"
    assert events[-1].response.error.code == "server_error" and "unloaded" in events[-1].response.error.message


def test_a_client_that_leaves_stops_its_generation(tiny):
    host, port = tiny.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"model": "tiny", "input": "hi", "max_output_tokens": 3500, "stream": True})
    conn.request("POST", "/v1/responses", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    seen = b""
    while b"response.output_text.delta" not in seen:
        seen += r.read1(4096)
    conn.close()
    m = tiny.service.roster.loaded["tiny"]
    deadline = time.monotonic() + 30
    while m.live_requests():
        assert time.monotonic() < deadline, "the generation went on without its client"
        time.sleep(0.02)
    last = [s for s in tiny.service.streams()["streams"] if s["model"] == "tiny" and s["max_tokens"] == 3500][-1]
    assert last["finish_reason"] == "cancelled" and last["gen_tokens"] < 3500


# ---- malformed bodies ------------------------------------------------------------------------------

HI = {"input": "hi", "max_output_tokens": 2}
FN = {"type": "function", "name": "f", "parameters": {"type": "object"}}
BAD = [
    ({}, "input", "required"),
    ({"input": 5}, "input", "string or an array"),
    ({"input": [5]}, "input", "object"),
    ({"input": [{"type": "computer_call"}]}, "input", "computer_call"),
    ({"input": [{"role": "user", "content": 5}]}, "input", "content"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input", "role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input", "never fetched"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input", "not supported"),
    ({"input": [{"role": "user", "content": [{"text": "hi"}]}]}, "input", "type"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input", "call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_text", "text": "a chart"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]},
     "input", "'input[0].output[1]': images are not supported in a function_call_output"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input", "arguments"),
    ({**HI, "tools": [{"type": "web_search_preview"}]}, "tools", "web_search_preview"),
    ({**HI, "tools": [{**FN, "name": "bad name"}]}, "tools", "name"),
    ({**HI, "tools": [{**FN, "parameters": "x"}]}, "tools", "parameters"),
    ({**HI, "tools": [FN], "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
    ({**HI, "tools": [FN], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice", "'g'"),
    ({**HI, "text": {"format": {"type": "json_schema", "name": "x"}}}, "text", "schema"),
    ({**HI, "text": {"format": {"type": "yaml"}}}, "text", "yaml"),
    ({**HI, "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "string", "minLength": 10**9}}}},
     "text", None),
    ({**HI, "text": "json"}, "text", "object"),
    ({**HI, "reasoning": {"effort": "max"}}, "reasoning", "effort"),
    ({**HI, "max_output_tokens": 0}, "max_output_tokens", ">= 1"),
    ({**HI, "max_output_tokens": 10**30}, "max_output_tokens", "64 bits"),
    ({**HI, "max_output_tokens": 2**40}, "max_output_tokens", "context"),
    ({**HI, "max_output_tokens": 1.5}, "max_output_tokens", "integer"),
    ({**HI, "temperature": 3}, "temperature", "<= 2"),
    ({**HI, "temperature": "hot"}, "temperature", "number"),
    ({**HI, "top_p": -1}, "top_p", ">= 0"),
    ({**HI, "stream": "yes"}, "stream", "boolean"),
    ({**HI, "store": 1}, "store", "boolean"),
    ({**HI, "metadata": {"k": 5}}, "metadata", "string"),
    ({**HI, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "16"),
    ({**HI, "metadata": {"k": "v" * 513}}, "metadata", "512"),
    ({**HI, "truncation": "sometimes"}, "truncation", "sometimes"),
    ({**HI, "previous_response_id": 5}, "previous_response_id", "string"),
    ({**HI, "instructions": ["x"]}, "instructions", "string"),
    ({**HI, "seed": "7"}, "seed", "integer"),
    ({**HI, "top_k": -1}, "top_k", ">= 0"),
    ({**HI, "min_p": 2}, "min_p", "<= 1"),
    ({**HI, "stop": [1]}, "stop", None),
    ({**HI, "input": "\ud800"}, "input", "surrogate"),
    ({**HI, "model": "nope"}, "model", "nope"),
]


@pytest.mark.parametrize("body,param,words", BAD, ids=[f"{i}-{p}" for i, (_, p, _) in enumerate(BAD)])
def test_a_malformed_body_is_a_4xx_naming_the_field(smol_server, body, param, words):
    status, out = call(smol_server, "POST", "/v1/responses", body)
    assert 400 <= status < 500, (status, out)
    err = out["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert words is None or words in err["message"], err


def test_nan_and_a_broken_body_are_400s_and_the_server_keeps_serving(smol_server, client):
    for raw, param in ((b'{"input": "hi", "temperature": NaN}', "temperature"),
                       (b'{"input": "hi", "top_p": Infinity}', "top_p"), (b'{"input": "hi"', None)):
        req = urllib.request.Request(smol_server.url + "/v1/responses", data=raw,
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        err = json.loads(e.value.read())["error"]
        assert e.value.code == 400 and err["param"] == param, err
    for query, param in (("limit=0", "limit"), ("limit=x", "limit"), ("order=up", "order"), ("after=nope", "after")):
        r = create(client, input="hi", max_output_tokens=1)
        status, out = call(smol_server, "GET", f"/v1/responses/{r.id}/input_items?{query}")
        assert status == 400 and out["error"]["param"] == param, out
    assert create(client, input=QUESTION, instructions=SYSTEM).status == "completed"
