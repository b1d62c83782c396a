"""Request fields the other test files do not send, found by auditing every #13 route's request shape; and
NaN and Infinity (which Python's JSON reader takes) refused wherever a number is read, in each protocol's shape."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.http import call
from tests.server.test_utility import fim_server  # noqa: F401 (a fixture: the tiny model with FIM tokens)

HI = [{"role": "user", "content": "hi"}]


def _raw(server, path: str, text: str) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=text.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def _openai_param(out: dict) -> str:
    return out["error"]["param"]


# (path, body with the number spliced in, where the 400 says it) per protocol
NUMBER_ROUTES = [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": %s}',
     lambda out: out["error"]["param"] == "temperature"),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 2, "temperature": %s}',
     lambda out: out["error"]["param"] == "temperature"),
    ("/v1/responses", '{"input": "hi", "max_output_tokens": 2, "temperature": %s}',
     lambda out: out["error"]["param"] == "temperature"),
    ("/v1/messages", '{"model": "smollm2", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], '
                     '"temperature": %s}',
     lambda out: out["type"] == "error" and "'temperature'" in out["error"]["message"]),
    ("/api/chat", '{"model": "smollm2", "stream": false, "messages": [{"role": "user", "content": "hi"}], '
                  '"options": {"num_predict": 2, "temperature": %s}}',
     lambda out: isinstance(out["error"], str) and "temperature" in out["error"]),
    ("/api/generate", '{"model": "smollm2", "stream": false, "prompt": "hi", "options": {"num_predict": 2, "temperature": %s}}',
     lambda out: isinstance(out["error"], str) and "temperature" in out["error"]),
    ("/infill", '{"input_prefix": "a", "input_suffix": "b", "temperature": %s}',
     lambda out: out["error"]["param"] == "temperature"),
]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("path, body, names", NUMBER_ROUTES, ids=[r[0] for r in NUMBER_ROUTES])
def test_nan_and_infinity_are_400s_in_the_routes_shape(smol_server, path, body, names, number):
    status, out = _raw(smol_server, path, body % number)
    assert status == 400 and names(out), out
    status, ok = _raw(smol_server, path, body % "0")  # the same body with a number: served (or, for /infill on a
    assert status == 200 or (path == "/infill" and status == 400 and "fill-in-the-middle" in json.dumps(ok))


# ---- /apply-template: the fields that shape the prompt ---------------------------------------------------------

def _prompt(server, **fields) -> str:
    status, out = call(server, "POST", "/apply-template", {"model": "smollm2-think", "messages": HI, **fields})
    assert status == 200, out
    return out["prompt"]


def test_apply_template_renders_the_thinking_switch_and_the_tools(smol_server):
    on, off = _prompt(smol_server, enable_thinking=True), _prompt(smol_server, enable_thinking=False)
    assert on != off and off == _prompt(smol_server, chat_template_kwargs={"enable_thinking": False})
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    assert "get_weather" in _prompt(smol_server, tools=[tool]) and "get_weather" not in on
    status, out = call(smol_server, "POST", "/apply-template", {"messages": HI, "enable_thinking": "yes"})
    assert status == 400 and out["error"]["param"] == "enable_thinking"


# ---- /infill: the sampling fields ----------------------------------------------------------------------------

FIM = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n", "ignore_eos": True, "n_predict": 12}


def _infill(server, **fields) -> dict:
    status, out = call(server, "POST", "/infill", {**FIM, **fields})
    assert status == 200, out
    return out


def test_infill_reads_its_sampling_fields(fim_server):
    assert _infill(fim_server, max_completion_tokens=3)["tokens_predicted"] == 3
    hot = {"temperature": 1.5, "seed": 1}
    first = _infill(fim_server, **hot)["content"]
    assert _infill(fim_server, **hot)["content"] == first  # the seed fixes a sampled reply
    greedy = _infill(fim_server, temperature=0)["content"]
    for narrow in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 0.0}):  # each leaves only the likeliest token
        assert _infill(fim_server, **hot, **narrow)["content"] == greedy, narrow
    repeating = _infill(fim_server, temperature=0, n_predict=40)["content"]  # the tiny model falls into a loop
    for penalty in ({"repeat_penalty": 3.0}, {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        assert _infill(fim_server, temperature=0, n_predict=40, **penalty)["content"] != repeating, penalty
    token = call(fim_server, "POST", "/tokenize", {"content": greedy[:1]})[1]["tokens"][0]
    assert _infill(fim_server, temperature=0, logit_bias={str(token): -100})["content"][:1] != greedy[:1]


@pytest.mark.parametrize("field, value", [("top_p", 2), ("top_k", -1), ("min_p", 1.5), ("repeat_penalty", 0),
                                          ("presence_penalty", 3), ("frequency_penalty", -3), ("seed", "1"),
                                          ("max_completion_tokens", 0), ("n_predict", 0), ("stop", 5),
                                          ("logit_bias", {"x": 1}), ("ignore_eos", 1), ("stream", "no"),
                                          ("input_extra", 3)])
def test_infill_refuses_a_bad_sampling_value_naming_it(fim_server, field, value):
    status, out = call(fim_server, "POST", "/infill", {**FIM, field: value})
    assert status == 400 and out["error"]["param"] == field, out


# ---- chat completions: ttl -----------------------------------------------------------------------------------

def _ttl(server, model: str):
    return next(m for m in server.get("/v1/models")["data"] if m["id"] == model)["ttl_s"]


def test_chat_ttl_sets_how_long_the_model_stays_loaded(smol_server):
    client = smol_server.client()
    before = _ttl(smol_server, "smollm2-gemma")
    try:
        client.chat.completions.create(model="smollm2-gemma", messages=HI, max_tokens=1, extra_body={"ttl": 3600})
        assert _ttl(smol_server, "smollm2-gemma") == 3600
    finally:
        client.chat.completions.create(model="smollm2-gemma", messages=HI, max_tokens=1, extra_body={"ttl": -1})
    assert _ttl(smol_server, "smollm2-gemma") is None is before


# ---- the control, catalog and speech bodies (pydantic shapes now): a 400 naming the field, nothing done ---------

SHAPED = [("/v1/models/load", {}, "path"), ("/v1/models/load", {"path": "x.gguf", "ctx": "big"}, "ctx"),
          ("/v1/models/load", {"path": "x.gguf", "default": "yes"}, "default"),
          ("/v1/models/load", {"path": "x.gguf", "chat_template": 1}, "chat_template"),
          ("/v1/models/reload", {"model": ""}, "model"), ("/v1/models/reload", {"model": "smollm2", "streams": 1.5},
                                                           "streams"),
          ("/v1/models/reload", {"model": "smollm2", "kv_dtype": 8}, "kv_dtype"),
          ("/v1/models/unload", {"model": 3}, "model"), ("/v1/models/activate", {}, "model"),
          ("/config", {"values": []}, "values"), ("/config", {"save": "yes"}, "save"), ("/bench", {"model": 5}, "model"),
          ("/catalog/download", {"name": "x", "tower": 3}, "tower"), ("/catalog/cancel", {}, "name"),
          ("/catalog/serve", {"name": ""}, "name"), ("/catalog/import", {"path": 1}, "path"),
          ("/v1/audio/speech", {"input": "x", "voice": -1}, "voice"),
          ("/v1/audio/speech", {"input": "x", "voice": {"name": "joe"}}, "voice"),
          ("/v1/audio/speech", {"input": "x", "stream_format": "ws"}, "stream_format"),
          ("/v1/audio/speech", {"input": "x", "speed": "fast"}, "speed"),
          ("/v1/audio/speech", {"input": "x", "instructions": 3}, "instructions"),
          ("/v1/audio/speech", {"input": "x", "response_format": "ogg"}, "response_format"),
          ("/v1/audio/phonemes", {"input": "x", "voice": {"id": ""}}, "voice")]


@pytest.mark.parametrize("path, body, field", SHAPED, ids=[f"{p}:{f}" for p, _, f in SHAPED])
def test_a_malformed_body_is_a_400_naming_the_field(smol_server, path, body, field):
    status, out = call(smol_server, "POST", path, body)
    assert status == 400 and out["error"]["param"] == field and f"'{field}" in out["error"]["message"], out
    assert smol_server.client().models.retrieve("smollm2").model_extra["state"] == "loaded"  # nothing was done


# ---- Anthropic Messages: a text block's citations, an image's url source ----------------------------------------

def test_messages_accept_citations_and_refuse_a_url_image_saying_why(smol_server):
    import anthropic
    with anthropic.Anthropic(base_url=smol_server.url, api_key="unused", max_retries=0, timeout=60) as client:
        said = [{"type": "text", "text": "Paris is the capital of France.", "citations": []}]
        plain = [{"type": "text", "text": "Paris is the capital of France."}]
        kw = {"model": "smollm2", "max_tokens": 3, "extra_body": {"top_k": 1}}  # greedy: the replies compare
        cited = client.messages.create(messages=[{"role": "user", "content": said}], **kw)
        assert cited.content[0].text == client.messages.create(messages=[{"role": "user", "content": plain}],
                                                               **kw).content[0].text
        image = {"type": "image", "source": {"type": "url", "url": "https://example.invalid/cat.png"}}
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(messages=[{"role": "user", "content": [image, *plain]}], **kw)
        assert "never fetched" in e.value.message and e.value.body["type"] == "error"
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(messages=[{"role": "user", "content": [{**plain[0], "citations": "x"}]}], **kw)
        assert "citations" in e.value.message
