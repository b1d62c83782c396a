"""OpenAI fidelity for agents on SmolLM2-135M through the official client: structured output, tool calls
(generic format, and hermes via a chat_template override written for the tests), reasoning, logprobs, n.
Every response and stream chunk is validated against the openai SDK's pydantic types."""
from __future__ import annotations

import json
import math
import urllib.request

import jsonschema
import pydantic
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 30}}, "required": ["tz"]}}}


def post(server, path: str, body: dict):
    """Raw HTTP: the parsed JSON body, or the list of SSE event payloads when streaming."""
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    if not body.get("stream"):
        return json.loads(raw)
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def chat(server, **body):
    """A buffered chat completion validated as the SDK's ChatCompletion."""
    raw = post(server, "/v1/chat/completions", {"max_tokens": 120, "temperature": 0, **body})
    return ChatCompletion.model_validate(raw)


def chat_stream(server, **body) -> list[ChatCompletionChunk]:
    raw = post(server, "/v1/chat/completions", {"max_tokens": 120, "temperature": 0, "stream": True, **body})
    return [ChatCompletionChunk.model_validate(c) for c in raw]


def test_json_schema_output_validates(smol_server):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                "country": {"type": "string", "maxLength": 30},
                                                "population_millions": {"type": "integer"}},
              "required": ["city", "country", "population_millions"], "additionalProperties": False}
    r = chat(smol_server, model="smollm2",
             messages=[SYSTEM, {"role": "user", "content": "Describe the capital of France as JSON."}],
             response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema,
                                                                     "strict": True}})
    doc = json.loads(r.choices[0].message.content)
    jsonschema.validate(doc, schema)
    r = chat(smol_server, model="smollm2", response_format={"type": "json_object"}, max_tokens=200, messages=[
        SYSTEM, {"role": "user", "content": "Reply with a JSON object with the keys city and country for the "
                                            "capital of France."}])
    assert r.choices[0].finish_reason == "stop"  # a small model can also loop until max_tokens: then it is cut
    assert json.loads(r.choices[0].message.content) == {"city": "Paris", "country": "FRANCE"}


def test_sdk_parse_with_a_pydantic_model(smol_server):
    class Capital(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=30)
        country: str = pydantic.Field(max_length=30)

    client = smol_server.client()
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model="smollm2", temperature=0, max_tokens=120, response_format=Capital,
              messages=[SYSTEM, {"role": "user", "content": "What is the capital of France?"}])
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Capital) and parsed.city


@pytest.mark.parametrize("model", ["smollm2", "smollm2-hermes", "smollm2-gemma"])
def test_forced_tool_choice_returns_a_valid_call(smol_server, model):
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        r = chat(smol_server, model=model, tools=[WEATHER, TIME], tool_choice=choice,
                 messages=[SYSTEM, {"role": "user", "content": "What's the weather like in Paris?"}])
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        call = c.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        fn = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        if isinstance(choice, dict):
            assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), fn["function"]["parameters"])


@pytest.mark.parametrize("model", ["smollm2", "smollm2-hermes"])
def test_streamed_tool_call(smol_server, model):
    chunks = chat_stream(smol_server, model=model, tools=[WEATHER],
                         tool_choice={"type": "function", "function": {"name": "get_weather"}},
                         messages=[SYSTEM, {"role": "user", "content": "Weather in Oslo?"}])
    deltas = [tc for ch in chunks for c in ch.choices for tc in (c.delta.tool_calls or [])]
    assert deltas and deltas[0].id and deltas[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), WEATHER["function"]["parameters"])
    if model == "smollm2-hermes":  # hermes under a grammar: id and name first, then argument fragments
        assert len(deltas) >= 3 and all(d.id is None and d.index == 0 for d in deltas[1:])
    assert [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason] == ["tool_calls"]


@pytest.mark.parametrize("model", ["smollm2", "smollm2-hermes", "smollm2-gemma"])
def test_agent_loop_call_result_answer(smol_server, model):
    client = smol_server.client()
    messages = [SYSTEM, {"role": "user", "content": "What's the weather in Paris?"}]
    first = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], tool_choice="required",
                                           temperature=0, max_tokens=120)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                     "content": json.dumps({"temperature": 18, "unit": "celsius", "sky": "sunny"})})
    final = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], tool_choice="none",
                                           temperature=0, max_tokens=60)
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
    assert answer.message.content and answer.message.content.strip()
    ChatCompletion.model_validate(final.model_dump())


def test_auto_tool_choice_is_either_a_valid_call_or_text(smol_server):
    r = chat(smol_server, model="smollm2", tools=[WEATHER], tool_choice="auto",
             messages=[SYSTEM, {"role": "user", "content": "Hi! How are you?"}])
    m = r.choices[0].message
    if m.tool_calls:
        jsonschema.validate(json.loads(m.tool_calls[0].function.arguments), WEATHER["function"]["parameters"])
    else:
        assert isinstance(m.content, str) and "response" not in m.content[:12]


def test_reasoning_content_and_clean_content(smol_server):
    r = chat(smol_server, model="smollm2-think", max_tokens=40,
             messages=[SYSTEM, {"role": "user", "content": "What is 2+2?"}])
    msg = r.choices[0].message
    reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
    assert reasoning and "<think>" not in reasoning
    assert "<think>" not in (msg.content or "") and "</think>" not in (msg.content or "")
    chunks = chat_stream(smol_server, model="smollm2-think", max_tokens=40,
                         messages=[SYSTEM, {"role": "user", "content": "What is 2+2?"}])
    streamed = "".join((c.delta.model_extra or {}).get("reasoning_content", "") for ch in chunks for c in ch.choices)
    assert streamed == reasoning
    off = chat(smol_server, model="smollm2-think", max_tokens=20, chat_template_kwargs={"enable_thinking": False},
               messages=[SYSTEM, {"role": "user", "content": "What is 2+2?"}])
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {}) and off.choices[0].message.content


def test_logprobs_are_finite_sorted_and_sum_below_one(smol_server):
    r = chat(smol_server, model="smollm2", logprobs=True, top_logprobs=5, max_tokens=12,
             messages=[SYSTEM, {"role": "user", "content": "What is the capital of France?"}])
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    assert "".join(e.token for e in entries).startswith("The capital")
    for e in entries:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 5 and all(math.isfinite(x) and x <= 0 for x in tops + [e.logprob])
        assert tops == sorted(tops, reverse=True)
        assert sum(math.exp(x) for x in tops) <= 1 + 1e-6
        assert e.logprob == pytest.approx(tops[0], abs=1e-5)  # greedy: the chosen token is the most likely
    chunks = chat_stream(smol_server, model="smollm2", logprobs=True, top_logprobs=2, max_tokens=8,
                         stream_options={"include_usage": True},
                         messages=[SYSTEM, {"role": "user", "content": "Hi"}])
    streamed = [e for ch in chunks for c in ch.choices if c.logprobs for e in c.logprobs.content]
    assert len(streamed) == chunks[-1].usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in streamed)
    raw = post(smol_server, "/v1/completions", {"model": "smollm2", "prompt": "The capital of France is",
                                                "max_tokens": 5, "temperature": 0, "logprobs": 3})
    lp = Completion.model_validate(raw).choices[0].logprobs
    chunks = post(smol_server, "/v1/completions", {"model": "smollm2", "prompt": "Hello", "max_tokens": 5, "n": 2,
                                                   "stream": True, "logprobs": 1,
                                                   "stream_options": {"include_usage": True}})
    # The SDK's Completion type declares finish_reason non-null, yet streamed chunks carry null until the last
    # (the SDK builds them without validating); the chunks that end a choice or carry usage validate strictly.
    parsed = [Completion.model_validate(c) if not c["choices"] or c["choices"][0]["finish_reason"]
              else Completion.model_construct(**c) for c in chunks]
    assert parsed[-1].usage.completion_tokens == sum(
        len(c["logprobs"]["tokens"]) for ch in chunks for c in ch["choices"] if c["logprobs"])
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == raw["usage"]["completion_tokens"]
    assert all(len(t) <= 3 for t in lp.top_logprobs)


def test_n_choices_buffered_and_streamed(smol_server):
    r = chat(smol_server, model="smollm2", n=3, temperature=0.9, seed=7, max_tokens=16,
             messages=[SYSTEM, {"role": "user", "content": "Name an animal."}])
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert 3 <= r.usage.completion_tokens <= 3 * 16  # summed over the three choices
    one = chat(smol_server, model="smollm2", temperature=0.9, seed=7, max_tokens=16,
               messages=[SYSTEM, {"role": "user", "content": "Name an animal."}])
    assert one.usage.prompt_tokens == r.usage.prompt_tokens  # the prompt is counted once
    again = chat(smol_server, model="smollm2", n=3, temperature=0.9, seed=7, max_tokens=16,
                 messages=[SYSTEM, {"role": "user", "content": "Name an animal."}])
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    chunks = chat_stream(smol_server, model="smollm2", n=2, max_tokens=8,
                         messages=[SYSTEM, {"role": "user", "content": "Hi"}])
    finished = sorted(c.index for ch in chunks for c in ch.choices if c.finish_reason)
    assert finished == [0, 1]


def test_tool_errors_are_400(smol_server):
    import openai
    client = smol_server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=[SYSTEM], tools=[{"type": "function"}])
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=[SYSTEM], tools=[WEATHER],
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=[SYSTEM],
                                       response_format={"type": "xml"})
    assert e.value.body["param"] == "response_format"
