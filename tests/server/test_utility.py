"""llama-server's utilities: /tokenize, /detokenize, /apply-template, on the served models."""
from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from tests.http import call

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


def test_tokenize_and_detokenize_round_trip(smol_server):
    text = "Hello world, déjà vu 🙂"
    status, out = call(smol_server, "POST", "/tokenize", {"content": text})
    assert status == 200 and all(isinstance(t, int) for t in out["tokens"]) and len(out["tokens"]) > 5
    status, back = call(smol_server, "POST", "/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and back["content"] == text
    status, pieces = call(smol_server, "POST", "/tokenize", {"content": text, "with_pieces": True})
    assert [p["id"] for p in pieces["tokens"]] == out["tokens"]
    joined = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"])
                      for p in pieces["tokens"])
    assert joined.decode() == text  # the emoji's bytes come as byte lists where a piece splits it


def test_a_long_tokenize_with_pieces_leaves_the_server_answering(smol_server):
    text = "hello world, déjà vu " * 50_000  # about 1 MB: a few seconds of pieces and JSON on this CPU
    body = json.dumps({"content": text, "with_pieces": True}).encode()
    done = threading.Event()

    def tokenize() -> None:  # the raw reply only: parsing it here would hold the test process's GIL
        req = urllib.request.Request(smol_server.url + "/tokenize", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200 and len(r.read()) > len(body)
        done.set()
    worker = threading.Thread(target=tokenize)
    began = time.monotonic()
    worker.start()
    waits = []
    while not done.is_set():
        start = time.monotonic()
        assert call(smol_server, "GET", "/health")[0] == 200
        waits.append(time.monotonic() - start)
        time.sleep(0.05)
    worker.join()
    took = time.monotonic() - began
    # on the loop, the work is one stall as long as the request; off it, /health waits at most for a slice of it
    # (the JSON encoder holds the GIL of this process, which also runs the server, while it writes)
    assert len(waits) > 5 and max(waits) < took / 3, (took, waits)


def test_special_tokens_parse_or_not(smol_server):
    special = call(smol_server, "POST", "/tokenize", {"content": "<|im_start|>"})[1]["tokens"]
    literal = call(smol_server, "POST", "/tokenize", {"content": "<|im_start|>", "parse_special": False})[1]["tokens"]
    assert len(special) == 1 and len(literal) > 1
    assert call(smol_server, "POST", "/detokenize", {"tokens": special})[1]["content"] == "<|im_start|>"


def test_apply_template_is_the_prompt_chat_completions_prefill(smol_server):
    status, out = call(smol_server, "POST", "/apply-template", {"messages": MESSAGES})
    assert status == 200
    prompt = out["prompt"]
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    toks = call(smol_server, "POST", "/tokenize", {"content": prompt})[1]["tokens"]
    reply = smol_server.client().chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)
    assert reply.usage.prompt_tokens == len(toks)


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                       "required": ["city"]}}}


@pytest.mark.parametrize("extra", [{}, {"tools": [TOOL]}, {"response_format": {"type": "json_object"}}],
                         ids=["plain", "tools", "response_format"])
def test_chat_input_tokens_are_the_prompt_tokens_chat_completions_count(smol_server, extra):
    client = smol_server.client()
    body = {"model": "smollm2-hermes", "messages": MESSAGES, **extra}
    out = client.post("/chat/completions/input_tokens", body=body, cast_to=object)
    reply = client.chat.completions.create(**body, max_tokens=1)
    assert out == {"object": "chat.completion.input_tokens", "input_tokens": reply.usage.prompt_tokens}


def test_chat_input_tokens_validate_the_body_as_chat_completions_do(smol_server):
    status, out = call(smol_server, "POST", "/v1/chat/completions/input_tokens", {"messages": MESSAGES, "n": "x"})
    assert status == 400 and out["error"]["param"] == "n"
    status, out = call(smol_server, "POST", "/v1/chat/completions/input_tokens", {"messages": []})
    assert status == 400 and out["error"]["param"] == "messages"


def test_utility_errors_name_the_field(smol_server):
    status, out = call(smol_server, "POST", "/detokenize", {"tokens": [10**7]})
    assert status == 400 and out["error"]["param"] == "tokens"
    status, out = call(smol_server, "POST", "/detokenize", {"tokens": ["a"]})
    assert status == 400 and out["error"]["param"] == "tokens"
    status, out = call(smol_server, "POST", "/tokenize", {"content": "x", "model": "nope"})
    assert status == 404 and out["error"]["param"] == "model"
    status, out = call(smol_server, "POST", "/apply-template", {"messages": []})
    assert status == 400 and out["error"]["param"] == "messages"


def test_add_special_adds_the_models_own_markers(smol_server):
    plain = call(smol_server, "POST", "/tokenize", {"content": "hello there", "model": "minilm"})[1]["tokens"]
    marked = call(smol_server, "POST", "/tokenize", {"content": "hello there", "model": "minilm",
                                                     "add_special": True})[1]["tokens"]
    assert len(marked) == len(plain) + 2 and marked[1:-1] == plain  # BERT's [CLS] ... [SEP]


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory):
    from tests.assets import tiny_gguf
    from tests.conftest import LiveServer
    tmp = tmp_path_factory.mktemp("fim")
    tiny_gguf.write(tmp / "tiny-fim.gguf", fim=True)
    srv = LiveServer(["--model", str(tmp / "tiny-fim.gguf"), "--streams", "1"], "", tmp)
    yield srv
    srv.stop()


def test_infill_prefills_prefix_and_suffix_between_the_fim_tokens(fim_server):
    body = {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n\nprint(add(1, 2))\n",
            "n_predict": 6, "temperature": 0, "ignore_eos": True}
    status, out = call(fim_server, "POST", "/infill", body)
    assert status == 200 and out["stop"] and out["finish_reason"] == "length" and out["tokens_predicted"] == 6
    pieces = [call(fim_server, "POST", "/tokenize", {"content": t})[1]["tokens"]
              for t in ("<fim_prefix>", body["input_prefix"], "<fim_suffix>", body["input_suffix"], "<fim_middle>")]
    assert all(len(p) >= 1 for p in pieces) and len(pieces[0]) == len(pieces[2]) == len(pieces[4]) == 1
    assert out["tokens_evaluated"] == sum(len(p) for p in pieces)  # exactly the FIM layout, nothing more
    # the same as a raw completion of that layout, token for token
    layout = [t for p in pieces for t in p]
    same = call(fim_server, "POST", "/v1/completions", {"prompt": layout, "max_tokens": 6, "temperature": 0,
                                                         "ignore_eos": True})[1]
    assert out["content"] == same["choices"][0]["text"]
    events = []
    import urllib.request
    req = urllib.request.Request(fim_server.url + "/infill", method="POST", data=json.dumps({**body, "stream": True,
                                 "prompt": "a"}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1]["stop"] and not any(e["stop"] for e in events[:-1])
    assert events[-1]["tokens_evaluated"] == out["tokens_evaluated"] + 1  # the prompt after <fim_middle>


def test_infill_needs_a_model_with_fim_tokens(smol_server):
    status, out = call(smol_server, "POST", "/infill", {"input_prefix": "a", "input_suffix": "b"})
    assert status == 400 and "fill-in-the-middle" in out["error"]["message"] and out["error"]["param"] == "model"


PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"


def test_completions_suffix_fills_the_middle_as_infill_does(fim_server):
    infill = call(fim_server, "POST", "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
                                                  "temperature": 0, "ignore_eos": True})[1]
    client = fim_server.client()
    out = client.completions.create(model="tiny-fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == infill["content"] and out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == infill["tokens_evaluated"]  # the FIM layout, not the prompt alone
    plain = client.completions.create(model="tiny-fim", prompt=PREFIX, max_tokens=1)
    assert plain.usage.prompt_tokens < out.usage.prompt_tokens
    streamed = client.completions.create(model="tiny-fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=6,
                                         temperature=0, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == infill["content"]


def test_completions_suffix_needs_fim_tokens_and_a_text_prompt(smol_server, fim_server):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        smol_server.client().completions.create(model="smollm2", prompt="def f(", suffix=")\n", max_tokens=4)
    err = e.value.body
    assert err["param"] == "suffix" and "fill-in-the-middle tokens" in err["message"] and "smollm2" in err["message"]
    status, out = call(fim_server, "POST", "/v1/completions", {"prompt": [5, 6], "suffix": "x", "max_tokens": 2})
    assert status == 400 and out["error"]["param"] == "suffix"
    status, out = call(fim_server, "POST", "/v1/completions", {"prompt": "a", "suffix": 3, "max_tokens": 2})
    assert status == 400 and out["error"]["param"] == "suffix"


def test_infill_puts_input_extra_before_the_prefix(fim_server):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 2, "temperature": 0, "ignore_eos": True}
    base = call(fim_server, "POST", "/infill", body)[1]["tokens_evaluated"]
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}, {"text": "x = 1\n"}]
    out = call(fim_server, "POST", "/infill", {**body, "input_extra": extra})[1]
    # the tiny model has no <fim_sep>: each chunk comes after llama-server's plain-text separator
    count = [len(call(fim_server, "POST", "/tokenize", {"content": t})[1]["tokens"])
             for t in ("\n\n--- snip ---\n\n", extra[0]["text"], extra[1]["text"])]
    assert out["tokens_evaluated"] == base + 2 * count[0] + count[1] + count[2]
    status, err = call(fim_server, "POST", "/infill", {**body, "input_extra": [{"text": 5}]})
    assert status == 400 and err["error"]["param"] == "input_extra"


def test_ollama_generate_suffix_fills_the_middle_as_infill_does(fim_server, smol_server):
    import ollama
    infill = call(fim_server, "POST", "/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6,
                                                  "temperature": 0})[1]
    client, plain = ollama.Client(host=fim_server.url), ollama.Client(host=smol_server.url)
    try:
        out = client.generate(model="tiny-fim", prompt=PREFIX, suffix=SUFFIX, stream=False,
                              options={"num_predict": 6, "temperature": 0})
        assert out.response == infill["content"] and out.done_reason == "length"
        streamed = "".join(p.response for p in client.generate(model="tiny-fim", prompt=PREFIX, suffix=SUFFIX,
                                                               stream=True, options={"num_predict": 6,
                                                                                     "temperature": 0}))
        assert streamed == infill["content"]
        with pytest.raises(ollama.ResponseError) as e:  # no chat template in a FIM prompt
            client.generate(model="tiny-fim", prompt=PREFIX, suffix=SUFFIX, system="be brief", stream=False)
        assert e.value.status_code == 400 and "'system' does not go with 'suffix'" in e.value.error
        with pytest.raises(ollama.ResponseError) as e:  # a model without FIM tokens
            plain.generate(model="smollm2", prompt="a", suffix="b", stream=False)
        assert e.value.status_code == 400 and "fill-in-the-middle tokens" in e.value.error
    finally:
        client._client.close()  # the client has no close() of its own; its httpx client does
        plain._client.close()
