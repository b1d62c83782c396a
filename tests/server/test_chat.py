"""The OpenAI text routes on SmolLM2-135M, driven by the official openai client."""
from __future__ import annotations

import asyncio
import concurrent.futures

import openai
import pytest

from tests.http import call

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def ask(question: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": question}]


def test_capital_of_france_buffered_and_streamed_agree(smol_server):
    client = smol_server.client()
    r = client.chat.completions.create(model="smollm2", messages=ask("What is the capital of France?"),
                                       temperature=0)
    text = r.choices[0].message.content
    assert "Paris" in text
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    chunks = list(client.chat.completions.create(model="smollm2", messages=ask("What is the capital of France?"),
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["stop"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == r.usage.completion_tokens
    assert usage.prompt_tokens == r.usage.prompt_tokens


def test_async_client_drives_every_text_route(smol_server):
    async def main():
        client = smol_server.async_client()
        models = await client.models.list()
        ids = {m.id for m in models.data}
        assert {"smollm2", "minilm"} <= ids
        one = await client.models.retrieve("minilm")
        assert one.id == "minilm"
        chat = await client.chat.completions.create(model="smollm2", messages=ask("What is the capital of Germany?"),
                                                    temperature=0, max_tokens=20)
        assert "Berlin" in chat.choices[0].message.content
        stream = await client.chat.completions.create(model="smollm2",
                                                      messages=ask("What is the capital of Germany?"),
                                                      temperature=0, max_tokens=20, stream=True)
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream])
        assert streamed == chat.choices[0].message.content
        comp = await client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8,
                                               temperature=0)
        assert comp.choices[0].text and comp.usage.completion_tokens <= 8
        cstream = await client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=8,
                                                  temperature=0, stream=True)
        assert "".join([c.choices[0].text async for c in cstream]) == comp.choices[0].text
        emb = await client.embeddings.create(model="minilm", input="hello world")
        assert len(emb.data[0].embedding) == 384
        stats = await client.get("/stats", cast_to=object)  # llamadesk's own routes through the same client
        assert stats["gen_tokens"] > 0 and {"smollm2", "minilm"} <= {m["id"] for m in stats["models"]}
        streams = await client.get("/streams", cast_to=object)
        assert all(s["state"] == "done" for s in streams["streams"])
        await client.close()
    asyncio.run(main())


def test_four_concurrent_streams_share_decodes_without_cross_talk(smol_server):
    questions = {"What is the capital of France?": "Paris", "What is the capital of Germany?": "Berlin",
                 "What is the capital of Japan?": "Tokyo", "What color is the sky?": "blue"}
    before = smol_server.get("/v1/stats")
    client = smol_server.client()

    def run(q: str) -> str:
        s = client.chat.completions.create(model="smollm2", messages=ask(q), temperature=0, max_tokens=30,
                                           stream=True)
        return "".join(c.choices[0].delta.content or "" for c in s if c.choices)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = dict(zip(questions, pool.map(run, questions)))
    for q, expected in questions.items():
        assert expected.lower() in answers[q].lower(), (q, answers[q])
        others = [v for k, v in questions.items() if k != q]
        assert not any(o in answers[q] for o in others), (q, answers[q])
    stats = smol_server.get("/v1/stats")
    assert stats["max_streams_per_decode"] >= 4
    assert stats["decode_calls"] > before["decode_calls"]
    slot = next(m for m in stats["models"] if m["id"] == "smollm2")
    assert slot["max_streams_per_decode"] >= 4


def test_repeated_request_hits_the_prefix_cache(smol_server):
    client = smol_server.client()
    msgs = ask("Name three fruits.")
    first = client.chat.completions.create(model="smollm2", messages=msgs, temperature=0, max_tokens=24)
    before = smol_server.get("/v1/stats")
    second = client.chat.completions.create(model="smollm2", messages=msgs, temperature=0, max_tokens=24)
    after = smol_server.get("/v1/stats")
    assert second.choices[0].message.content == first.choices[0].message.content
    assert after["prefix_cache_hits"] == before["prefix_cache_hits"] + 1
    reused = after["prefix_cache_reused_tokens"] - before["prefix_cache_reused_tokens"]
    assert reused == second.usage.prompt_tokens - 1  # all but the last prompt token came from the cache
    assert second.usage.prompt_tokens_details.cached_tokens == reused
    t = second.model_extra["timings"]  # llama-server's timings, for clients that read them
    assert t["cache_n"] == reused and t["prompt_n"] == 1 and t["predicted_n"] == second.usage.completion_tokens
    assert t["prompt_ms"] > 0 and t["predicted_ms"] >= 0


def test_stop_string_cuts_buffered_and_streamed(smol_server):
    client = smol_server.client()
    r = client.chat.completions.create(model="smollm2", messages=ask("What is the capital of France?"),
                                       temperature=0, stop=[" Paris"])
    assert r.choices[0].message.content == "The capital of France is"
    assert r.choices[0].finish_reason == "stop"
    s = client.chat.completions.create(model="smollm2", messages=ask("What is the capital of France?"),
                                       temperature=0, stop=[" Paris"], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == "The capital of France is"


def test_max_tokens_gives_length_and_exact_count(smol_server):
    r = smol_server.client().chat.completions.create(model="smollm2", messages=ask("Tell me a long story."),
                                                     temperature=0, max_tokens=5)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_seeded_sampling_is_reproducible(smol_server):
    client = smol_server.client()
    kw = dict(model="smollm2", messages=ask("Write a word."), temperature=0.9, top_p=0.9, seed=1234, extra_body={"top_k": 40, "min_p": 0.05},
              max_tokens=12)
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_unknown_model_is_404_naming_model(smol_server):
    with pytest.raises(openai.NotFoundError) as e:
        smol_server.client().chat.completions.create(model="nope", messages=ask("hi"))
    err = e.value.body
    assert err["param"] == "model" and err["code"] == "model_not_found" and "nope" in err["message"]
    with pytest.raises(openai.NotFoundError):
        smol_server.client().models.retrieve("nope")


def test_chat_on_embedding_model_is_400(smol_server):
    with pytest.raises(openai.BadRequestError) as e:
        smol_server.client().chat.completions.create(model="minilm", messages=ask("hi"))
    assert "embedding" in e.value.body["message"]


def test_max_completion_tokens_is_the_newer_max_tokens(smol_server):
    r = smol_server.client().chat.completions.create(model="smollm2", messages=ask("Tell me a long story."),
                                                     temperature=0, max_completion_tokens=4,
                                                     extra_body={"max_tokens": 30})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                          "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "Current time in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                        "required": ["city"]}}}


def test_parallel_tool_calls_false_keeps_the_first_call(smol_server):
    kw = dict(model="smollm2-hermes", tools=[WEATHER, CLOCK], tool_choice="required", max_tokens=80, temperature=0,
              messages=[{"role": "user", "content": "What is the weather in Oslo, and what time is it in Paris?"}])
    both = smol_server.client().chat.completions.create(**kw)
    one = smol_server.client().chat.completions.create(**kw, parallel_tool_calls=False)
    assert [c.function.name for c in both.choices[0].message.tool_calls] == ["get_weather", "get_time"]
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]


def test_token_id_prompts_and_inputs(smol_server):
    client = smol_server.client()
    text = "The capital of France is"
    ids = call(smol_server, "POST", "/tokenize", {"content": text, "model": "smollm2"})[1]["tokens"]
    kw = dict(model="smollm2", max_tokens=6, temperature=0)
    as_ids = client.completions.create(prompt=ids, **kw)
    assert as_ids.usage.prompt_tokens == len(ids) and as_ids.choices[0].text
    assert client.completions.create(prompt=[ids], **kw).choices[0].text == as_ids.choices[0].text  # one of them
    assert client.completions.create(prompt=[text], **kw).choices[0].text == \
        client.completions.create(prompt=text, **kw).choices[0].text
    one = client.embeddings.create(model="minilm", input=ids)
    two = client.embeddings.create(model="minilm", input=[ids, ids[:2]])
    assert len(one.data) == 1 and len(two.data) == 2 and len(two.data[1].embedding) == 384
    assert one.data[0].embedding == pytest.approx(two.data[0].embedding, abs=1e-5)
