"""Remote models through the Responses, Messages and Ollama translations: A (a llamadesk with remote entries)
sends them to B (the SmolLM2 server) as chat completions and reads the reply back into each protocol's shape.
The official clients (openai, anthropic, ollama) talk to A; what B answers through the same protocol's route
of its own is the reference. The stand-in upstreams of test_remote.py play an upstream that speaks only chat
completions, one that breaks off, and one that never answers."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import anthropic
import ollama
import openai
import pytest

from tests.conftest import LiveServer
from tests.http import call
from tests.server import test_remote
from tests.server.test_remote import REFUSAL, STANDIN_TEXT, WORDS, _closed_port, _remote, stream_done, wait_idle

GREEDY = {"max_output_tokens": 12, "temperature": 0}
QUESTION = "Name three colors."
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ANTHROPIC_WEATHER = {"name": WEATHER["name"], "description": WEATHER["description"],
                     "input_schema": WEATHER["parameters"]}
OSLO = "What is the weather in Oslo?"

standin = test_remote.standin  # the stand-in upstreams, a module's own


@pytest.fixture(scope="module")
def front(assets, smol_server, standin, tmp_path_factory):
    b = smol_server.url + "/v1"
    toml = "".join([
        _remote("smol-remote", url=b, remote_model="smollm2"),
        _remote("hermes-remote", url=b, remote_model="smollm2-hermes"),
        _remote("minilm-remote", url=b, remote_model="minilm"),
        _remote("standin", url=standin.url("ok")),
        _remote("refusing", url=standin.url("refuse"), remote_model="upstream-id"),
        _remote("cut", url=standin.url("cut")),
        _remote("hang", url=standin.url("hang"), timeout=1),
        _remote("refused", url=f"http://127.0.0.1:{_closed_port()}/v1"),
    ])
    srv = LiveServer(["--model", str(assets["tiny"]), "--streams", "1"], toml, tmp_path_factory.mktemp("front-p"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def clients(front, smol_server):
    """(through A, B directly) for each protocol."""
    made = {"anthropic": tuple(anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=120)
                               for s in (front, smol_server)),
            "ollama": tuple(ollama.Client(host=s.url, timeout=120) for s in (front, smol_server))}
    yield made
    for a in made["anthropic"]:
        a.close()
    for o in made["ollama"]:
        o._client.close()


# ---- Responses -------------------------------------------------------------------------------------------


def test_responses_through_a_remote_entry_equal_the_upstreams_own(front, smol_server):
    direct = smol_server.client().responses.create(model="smollm2", input=QUESTION, **GREEDY)
    via = front.client().responses.create(model="smol-remote", input=QUESTION, **GREEDY)
    assert direct.output_text and via.output_text == direct.output_text
    assert (via.model, via.status) == ("smol-remote", direct.status)
    assert via.usage.output_tokens == direct.usage.output_tokens
    assert via.usage.input_tokens == direct.usage.input_tokens

    events = list(front.client().responses.create(model="smol-remote", input=QUESTION, stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 3 and "".join(deltas) == direct.output_text
    assert events[-1].response.output_text == direct.output_text
    assert events[-1].response.usage.output_tokens == direct.usage.output_tokens


def test_previous_response_id_and_store_work_for_a_remote_model(front, smol_server):
    first_b = smol_server.client().responses.create(model="smollm2", input=QUESTION, **GREEDY)
    first_a = front.client().responses.create(model="smol-remote", input=QUESTION, **GREEDY)
    more = "And two more?"
    second_b = smol_server.client().responses.create(model="smollm2", input=more, previous_response_id=first_b.id,
                                                     **GREEDY)
    second_a = front.client().responses.create(model="smol-remote", input=more, previous_response_id=first_a.id,
                                               **GREEDY)
    assert second_a.usage.input_tokens == second_b.usage.input_tokens > first_b.usage.input_tokens
    assert second_a.output_text == second_b.output_text
    kept = front.client().responses.retrieve(second_a.id)  # kept on A, which made it
    assert kept.output_text == second_a.output_text and kept.previous_response_id == first_a.id
    unkept = front.client().responses.create(model="smol-remote", input=QUESTION, store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        front.client().responses.retrieve(unkept.id)


def test_a_tool_call_round_trip_through_responses(front, smol_server):
    def turn(srv, model, **kw):
        return srv.client().responses.create(model=model, tools=[WEATHER], temperature=0, max_output_tokens=60, **kw)
    first_b = turn(smol_server, "smollm2-hermes", input=OSLO, tool_choice="required")
    first_a = turn(front, "hermes-remote", input=OSLO, tool_choice="required")
    call_b, = first_b.output
    call_a, = first_a.output
    assert call_a.type == "function_call" and call_a.status == "completed" and call_a.name == call_b.name
    assert json.loads(call_a.arguments) == json.loads(call_b.arguments) and json.loads(call_a.arguments)["city"]
    answer = [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 21 C"} for c in (call_b, call_a)]
    second_b = turn(smol_server, "smollm2-hermes", input=[answer[0]], previous_response_id=first_b.id)
    second_a = turn(front, "hermes-remote", input=[answer[1]], previous_response_id=first_a.id)
    assert second_a.usage.input_tokens == second_b.usage.input_tokens
    assert [o.type for o in second_a.output] == [o.type for o in second_b.output]
    assert second_a.output_text == second_b.output_text


def test_an_upstream_that_speaks_only_chat_completions_serves_responses(front, standin):
    r = front.client().responses.create(model="standin", input="hi", max_output_tokens=5, temperature=0.5)
    assert r.output_text == STANDIN_TEXT
    sent = standin.seen[-1]
    assert sent["route"] == "chat/completions" and "stream" not in sent["body"]
    assert {k: sent["body"][k] for k in ("model", "messages", "max_tokens", "temperature")} == \
        {"model": "standin", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0.5}
    events = list(front.client().responses.create(model="standin", input="hi", stream=True))
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == WORDS
    assert events[-1].type == "response.completed" and standin.seen[-1]["body"]["stream"] is True


def test_upstream_failures_answer_in_the_openai_shape_of_responses(front):
    with pytest.raises(openai.APIStatusError) as e:
        front.client().responses.create(model="hang", input="hi")
    assert e.value.status_code == 504 and e.value.body["code"] == "upstream_timeout"
    events = list(front.client().responses.create(model="cut", input="hi", stream=True))
    assert events[-1].type == "response.failed" and "mid-stream" in events[-1].response.error.message
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == [WORDS[0]]


def test_an_upstream_refusal_keeps_its_param_code_and_type_and_names_the_upstreams_model(front, clients):
    with pytest.raises(openai.APIStatusError) as e:
        front.client().responses.create(model="refusing", input="hi")
    assert {k: e.value.body[k] for k in REFUSAL} == REFUSAL
    assert "upstream model 'upstream-id' is not enabled" in e.value.body["message"]
    assert "The model 'upstream-id'" not in e.value.body["message"]
    via_client, _ = clients["anthropic"]
    with pytest.raises(anthropic.APIStatusError) as e:
        via_client.messages.create(model="refusing", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "authentication_error"
    assert "remote model 'refusing'" in e.value.body["error"]["message"]
    assert "upstream model 'upstream-id' is not enabled" in e.value.body["error"]["message"]


# ---- Messages --------------------------------------------------------------------------------------------


def test_messages_through_a_remote_entry_equal_the_upstreams_own(clients):
    via_client, direct_client = clients["anthropic"]
    ask = {"max_tokens": 12, "messages": [{"role": "user", "content": QUESTION}], "extra_body": {"temperature": 0}}
    direct = direct_client.messages.create(model="smollm2", **ask)
    via = via_client.messages.create(model="smol-remote", **ask)
    assert direct.content[0].text and via.content[0].text == direct.content[0].text
    assert (via.model, via.stop_reason) == ("smol-remote", direct.stop_reason)
    assert via.usage.output_tokens == direct.usage.output_tokens
    with via_client.messages.stream(model="smol-remote", **ask) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 3 and "".join(pieces) == direct.content[0].text
    assert final.stop_reason == direct.stop_reason and final.usage.output_tokens == direct.usage.output_tokens


def test_a_streamed_tool_call_through_messages(clients):
    via_client, direct_client = clients["anthropic"]
    ask = {"max_tokens": 60, "messages": [{"role": "user", "content": OSLO}], "tools": [ANTHROPIC_WEATHER],
           "tool_choice": {"type": "tool", "name": "get_weather"}, "extra_body": {"temperature": 0}}
    direct = direct_client.messages.create(model="smollm2-hermes", **ask)
    with via_client.messages.stream(model="hermes-remote", **ask) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds  # the arguments arrived as they were written
    use, = [b for b in final.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == next(b for b in direct.content if b.type == "tool_use").input
    assert final.stop_reason == "tool_use" == direct.stop_reason


def test_upstream_down_is_a_502_in_anthropics_shape(front, clients):
    via_client, _ = clients["anthropic"]
    for stream in (False, True):
        with pytest.raises(anthropic.APIStatusError) as e:
            via_client.messages.create(model="refused", max_tokens=4, stream=stream,
                                       messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 502
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "api_error"
        assert "remote model 'refused'" in e.value.body["error"]["message"]
        assert "could not be reached" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as e:  # after the stream began: Anthropic's error event
        with via_client.messages.stream(model="cut", max_tokens=4, messages=[{"role": "user", "content": "hi"}]) as s:
            list(s.text_stream)
    assert "mid-stream" in str(e.value)


# ---- Ollama ----------------------------------------------------------------------------------------------


def test_ollama_chat_and_generate_through_a_remote_entry_equal_the_upstreams_own(clients):
    via_client, direct_client = clients["ollama"]
    options = {"temperature": 0, "num_predict": 12}
    messages = [{"role": "user", "content": QUESTION}]
    direct = direct_client.chat(model="smollm2", messages=messages, options=options, stream=False)
    via = via_client.chat(model="smol-remote:latest", messages=messages, options=options, stream=False)
    assert direct.message.content and via.message.content == direct.message.content
    assert (via.model, via.done_reason) == ("smol-remote", direct.done_reason)
    assert via.eval_count == direct.eval_count and via.prompt_eval_count == direct.prompt_eval_count
    lines = list(via_client.chat(model="smol-remote", messages=messages, options=options, stream=True))
    assert len(lines) > 3 and lines[-1].done and "".join(p.message.content for p in lines) == direct.message.content

    direct = direct_client.generate(model="smollm2", prompt=QUESTION, options=options, stream=False)
    via = via_client.generate(model="smol-remote", prompt=QUESTION, options=options, stream=False)
    assert direct.response and via.response == direct.response
    lines = list(via_client.generate(model="smol-remote", prompt=QUESTION, options=options, stream=True))
    assert len(lines) > 3 and "".join(p.response for p in lines) == direct.response
    assert via_client.generate(model="smol-remote", prompt="").done_reason == "load"  # nothing to load here
    with pytest.raises(ollama.ResponseError) as e:
        via_client.generate(model="smol-remote", prompt=QUESTION, raw=True)
    assert e.value.status_code == 400 and "raw" in e.value.error


def test_ollama_tool_call_through_a_remote_entry(clients):
    via_client, direct_client = clients["ollama"]
    tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    ask = {"messages": [{"role": "user", "content": OSLO}], "tools": [tool], "stream": False,
           "options": {"temperature": 0, "num_predict": 60}}
    direct_client.chat(model="smollm2-hermes", **ask)  # B's prefix cache then holds the prompt for both
    via = via_client.chat(model="hermes-remote", **ask)
    direct = direct_client.chat(model="smollm2-hermes", **ask)
    assert [c.function.name for c in via.message.tool_calls or []] == \
        [c.function.name for c in direct.message.tool_calls or []]
    assert [c.function.arguments for c in via.message.tool_calls or []] == \
        [c.function.arguments for c in direct.message.tool_calls or []]
    assert via.message.content == direct.message.content


def test_ollama_lists_and_shows_remote_models(front, smol_server, clients):
    via_client, _ = clients["ollama"]
    tags = {m["name"]: m for m in front.get("/api/tags")["models"]}
    assert tags["smol-remote"]["remote_model"] == "smollm2" and tags["smol-remote"]["details"]["format"] == "remote"
    assert tags["smol-remote"]["remote_host"] == smol_server.url + "/v1"
    assert "smol-remote" in [m.model for m in via_client.list().models]
    running = {m["name"] for m in front.get("/api/ps")["models"]}
    assert {"smol-remote", "hermes-remote"} <= running and "refused" not in running  # refused is not healthy
    status, shown = call(front, "POST", "/api/show", {"model": "smol-remote"})
    assert status == 200 and shown["remote_model"] == "smollm2" and shown["capabilities"] == ["completion"]


def test_ollama_embed_and_embeddings_of_a_remote_model_are_the_upstreams_vectors(front, smol_server, clients):
    via_client, _ = clients["ollama"]
    texts = ["hello world", "remote backends in the roster"]
    direct = smol_server.client().embeddings.create(model="minilm", input=texts)
    vectors = [d.embedding for d in direct.data]
    embedded = via_client.embed(model="minilm-remote", input=texts)
    assert embedded.embeddings == vectors and len(vectors[0]) == 384
    assert embedded.model == "minilm-remote" and embedded.prompt_eval_count == direct.usage.prompt_tokens
    alone = smol_server.client().embeddings.create(model="minilm", input=texts[1]).data[0].embedding  # unbatched
    assert via_client.embed(model="minilm-remote:latest", input=texts[1]).embeddings == [alone]
    assert list(via_client.embeddings(model="minilm-remote", prompt=texts[1]).embedding) == alone
    status, out = call(front, "POST", "/api/embed", {"model": "refused", "input": "hi"})
    assert status == 502 and list(out) == ["error"] and "remote model 'refused'" in out["error"]


def test_upstream_down_is_a_502_in_ollamas_shape(front, clients):
    via_client, _ = clients["ollama"]
    for route, body in (("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
                        ("/api/generate", {"prompt": "hi"})):
        for stream in (False, True):
            status, out = call(front, "POST", route, {"model": "refused", "stream": stream, **body})
            assert status == 502 and list(out) == ["error"], out
            assert "remote model 'refused'" in out["error"] and "could not be reached" in out["error"]
    with pytest.raises(ollama.ResponseError) as e:
        via_client.chat(model="refused", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 502
    assert via_client.chat(model="smol-remote", messages=[{"role": "user", "content": "hi"}],
                           options={"num_predict": 2}, stream=False).message.content is not None  # still serving


# ---- cancellation ----------------------------------------------------------------------------------------


def test_a_client_that_leaves_frees_the_upstream_stream(front, smol_server):
    body = {"model": "smol-remote", "stream": True, "options": {"temperature": 0, "num_predict": 1500},
            "messages": [{"role": "user", "content": "Count from 1 to 2000, one number a line."}]}

    def decoding() -> set[str]:
        return {s["id"] for s in smol_server.get("/v1/streams")["streams"] if s["state"] == "decode"}

    async def main():
        before = await asyncio.to_thread(decoding)
        async with aiohttp.ClientSession() as session:
            resp = await session.post(front.url + "/api/chat", json=body)
            assert resp.status == 200, await resp.text()
            for _ in range(5):  # B is really generating it
                assert json.loads(await resp.content.readline())["done"] is False
            mine, = await asyncio.to_thread(lambda: decoding() - before)
            resp.close()  # the client goes away from A
            stream = await stream_done(smol_server, mine)
            assert stream["finish_reason"] == "cancelled" and stream["gen_tokens"] < 1500
    asyncio.run(main())
    wait_idle(front, "smol-remote")
