"""The Ollama API, driven by the official `ollama` client against the served SmolLM2 and MiniLM."""
from __future__ import annotations

import json

import ollama
import pytest

from tests.http import call

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
QUESTION = {"role": "user", "content": "What is the capital of France?"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def client(smol_server):
    c = ollama.Client(host=smol_server.url, timeout=120)
    yield c
    c._client.close()  # the client has no close() of its own; its httpx client does


def test_version_tags_ps_and_show(client):
    assert client._request_raw("GET", "/api/version").json()["version"]
    names = [m.model for m in client.list().models]
    assert "smollm2" in names and "minilm" in names
    m = next(m for m in client.list().models if m.model == "smollm2")
    assert m.size > 50_000_000 and m.details.format == "gguf" and m.details.family == "llama"
    assert "smollm2" in [m.model for m in client.ps().models]
    shown = client.show("smollm2-hermes")
    assert "completion" in shown.capabilities and "tools" in shown.capabilities and "<tool_call>" in shown.template
    assert client.show("minilm").capabilities == ["embedding"]


def test_chat_buffered_and_streamed_agree(client):
    r = client.chat(model="smollm2", messages=[SYSTEM, QUESTION], stream=False, options={"temperature": 0,
                                                                                          "num_predict": 16})
    assert "Paris" in r.message.content and r.done and r.done_reason in ("stop", "length")
    assert r.prompt_eval_count > 10 and r.eval_count >= 1 and r.total_duration > 0
    parts = list(client.chat(model="smollm2", messages=[SYSTEM, QUESTION], stream=True,
                             options={"temperature": 0, "num_predict": 16}))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == r.message.content


def test_every_option_reaches_the_sampler(client):
    base = dict(model="smollm2", messages=[SYSTEM, {"role": "user", "content": "Count from one to twenty."}],
                stream=False)
    cut = client.chat(**base, options={"num_predict": 3, "temperature": 0})
    assert cut.eval_count == 3 and cut.done_reason == "length"
    stopped = client.chat(**base, options={"temperature": 0, "stop": [","], "num_predict": 40})
    assert "," not in stopped.message.content and stopped.done_reason == "stop"
    greedy = client.chat(**base, options={"temperature": 0, "num_predict": 30}).message.content
    penalized = client.chat(**base, options={"temperature": 0, "num_predict": 30, "repeat_penalty": 1.8,
                                             "repeat_last_n": 64, "presence_penalty": 1.5,
                                             "frequency_penalty": 1.5}).message.content
    assert penalized != greedy
    short = client.chat(**base, options={"temperature": 0, "num_predict": 8}).message.content
    hot = {s: client.chat(**base, options={"temperature": 1.5, "seed": s, "num_predict": 8}).message.content
           for s in (1, 2, 3)}
    seed = next(s for s, text in hot.items() if text != short)  # sampled at 1.5, the reply leaves the greedy path
    again = client.chat(**base, options={"temperature": 1.5, "seed": seed, "num_predict": 8}).message.content
    assert again == hot[seed]  # the seed fixes a sampled reply
    # each of these leaves only the likeliest token: with that seed, greedy again even at 1.5
    for narrow in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-9}):
        same = client.chat(**base, options={"temperature": 1.5, "seed": seed, "num_predict": 8, **narrow})
        assert same.message.content == short, narrow


def test_num_ctx_in_options_is_accepted_and_ignored(client):
    # the model's context is its roster ctx (/api/create sets it): a smaller num_ctx does not cut the prompt
    long = "Spell these words backwards: " + ", ".join(["lantern", "orchard", "pebble", "saffron"] * 3)
    r = client.chat(model="smollm2", messages=[{"role": "user", "content": long}], stream=False,
                    options={"num_ctx": 8, "temperature": 0, "num_predict": 2})
    assert r.done and r.prompt_eval_count > 8  # a prompt not in the prefix cache: all of it is prefilled


def test_format_json_and_schema(client):
    r = client.chat(model="smollm2", messages=[SYSTEM, {"role": "user", "content": "The capital of France as JSON."}],
                    format="json", stream=False, options={"temperature": 0, "num_predict": 60})
    assert isinstance(json.loads(r.message.content), dict)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    r = client.chat(model="smollm2", messages=[SYSTEM, QUESTION], format=schema, stream=False,
                    options={"temperature": 0, "num_predict": 60})
    assert set(json.loads(r.message.content)) == {"city"}


def test_tools_come_back_as_calls_with_object_arguments(client):
    r = client.chat(model="smollm2", messages=[SYSTEM, {"role": "user", "content": "Weather in Oslo?"}],
                    tools=[WEATHER], stream=False, options={"temperature": 0, "num_predict": 80})
    calls = r.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather" and isinstance(calls[0].function.arguments, dict)
    # the call and its result replayed, as an Ollama client sends them back
    follow = client.chat(model="smollm2", stream=False, options={"temperature": 0, "num_predict": 30},
                         messages=[SYSTEM, {"role": "user", "content": "Weather in Oslo?"}, r.message,
                                   {"role": "tool", "content": "Sunny, 21 C"}], tools=[WEATHER])
    assert follow.done


def test_think_splits_the_reasoning(client):
    r = client.chat(model="smollm2-think", messages=[QUESTION], think=True, stream=False,
                    options={"temperature": 0, "num_predict": 40})
    assert r.done and r.message.thinking  # the template opens <think>: what follows is reasoning
    off = client.chat(model="smollm2-think", messages=[QUESTION], think=False, stream=False,
                      options={"temperature": 0, "num_predict": 20})
    assert not off.message.thinking and off.message.content


def test_generate_templated_raw_system_and_load(client):
    r = client.generate(model="smollm2", prompt="What is the capital of France?", system="Answer in one word.",
                        stream=False, options={"temperature": 0, "num_predict": 8})
    assert "Paris" in r.response and r.done
    raw = client.generate(model="smollm2", prompt="The capital of France is", raw=True, stream=False,
                          options={"temperature": 0, "num_predict": 4})
    assert raw.response and raw.prompt_eval_count < 10  # no chat template around it
    parts = list(client.generate(model="smollm2", prompt="Hi", stream=True,
                                 options={"num_predict": 3, "temperature": 0}))
    assert parts[-1].done and "".join(p.response for p in parts)
    loaded = client.generate(model="smollm2", prompt="")
    assert loaded.done and loaded.done_reason == "load"
    js = client.generate(model="smollm2", prompt="A JSON object with a key a.", format="json", stream=False,
                         options={"temperature": 0, "num_predict": 200})
    assert js.response.lstrip().startswith("{") and js.eval_count > 0
    if js.done_reason == "stop":  # (a small model may nest objects until num_predict: then it is cut)
        assert isinstance(json.loads(js.response), dict)
    else:
        assert js.done_reason == "length" and js.eval_count == 200


def test_embed_one_and_many(client):
    one = client.embed(model="minilm", input="hello there")
    many = client.embed(model="minilm", input=["hello there", "general kenobi"])
    assert len(one.embeddings) == 1 and len(many.embeddings) == 2 and len(many.embeddings[0]) == 384
    assert one.embeddings[0] == pytest.approx(many.embeddings[0], abs=1e-5) and one.prompt_eval_count > 0
    legacy = client.embeddings(model="minilm", prompt="hello there", keep_alive="10m")  # /api/embeddings
    assert legacy.embedding == pytest.approx(one.embeddings[0], abs=1e-5)


def test_errors_come_in_ollamas_shape(client, smol_server):
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope", messages=[QUESTION], stream=False)
    assert e.value.status_code == 404 and "nope" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="smollm2", messages=[QUESTION], stream=False, options={"temperature": "hot"})
    assert e.value.status_code == 400 and "temperature" in e.value.error
    status, body = call(smol_server, "POST", "/api/chat", {"model": "smollm2", "messages": [QUESTION],
                                                            "stream": False, "format": "yaml"})
    assert status == 400 and "format" in body["error"]  # (the client refuses "yaml" itself)
    status, body = call(smol_server, "POST", "/api/embed", {"model": "minilm", "input": [1, 2]})
    assert status == 400 and "input" in body["error"]
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="smollm2", prompt="x", raw=True, format="json", stream=False)
    assert e.value.status_code == 400


def test_names_with_ollamas_latest_tag_resolve_to_ours(client, smol_server):
    r = client.chat(model="smollm2:latest", messages=[QUESTION], stream=False, options={"num_predict": 2})
    assert r.done and r.model == "smollm2"
    assert client.show("minilm:latest").capabilities == ["embedding"]
    status, body = call(smol_server, "POST", "/api/show", {"name": "smollm2-hermes"})  # the older field
    assert status == 200 and "<tool_call>" in body["template"] and "num_ctx 2048" in body["parameters"]
    status, body = call(smol_server, "POST", "/api/show", {})
    assert status == 400 and "'model' is required" in body["error"]


def test_a_think_level_turns_thinking_on(client):
    r = client.chat(model="smollm2-think", messages=[QUESTION], think="low", stream=False,
                    options={"temperature": 0, "num_predict": 20})
    assert r.done and r.message.thinking


def test_history_fields_ollama_sends_back(client, smol_server):
    """An earlier reply's thinking (not replayed) and a tool result's tool_name (the tool message's name)."""
    history = [QUESTION, {"role": "assistant", "content": "Paris.", "thinking": "It is Paris."},
               {"role": "user", "content": "And the weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "Sunny", "tool_name": "get_weather"}]
    r = client.chat(model="smollm2-hermes", messages=history, tools=[WEATHER], stream=False,
                    options={"temperature": 0, "num_predict": 8})
    assert r.done
    for bad, words in (({"thinking": 5}, "messages[1].thinking"), ({"tool_name": ["x"]}, "messages[1].tool_name"),
                       ({"images": [5]}, "messages[1].images[0]")):
        status, body = call(smol_server, "POST", "/api/chat", {
            "model": "smollm2", "stream": False, "messages": [QUESTION, {"role": "assistant", "content": "x", **bad}]})
        assert status == 400 and words in body["error"], body


def test_generate_refuses_images_to_a_model_without_vision_and_a_num_predict_of_zero(smol_server):
    status, body = call(smol_server, "POST", "/api/generate", {"model": "smollm2", "prompt": "What is this?",
                                                                "images": ["aGk="], "stream": False})
    assert status == 400 and "has no vision" in body["error"], body
    status, body = call(smol_server, "POST", "/api/generate", {"model": "smollm2", "prompt": "x", "stream": False,
                                                                "options": {"num_predict": 0}})
    assert status == 400 and "options.num_predict" in body["error"]
    status, body = call(smol_server, "POST", "/api/embeddings", {"model": "minilm", "prompt": ""})
    assert status == 400 and "'prompt' must not be empty" in body["error"]
